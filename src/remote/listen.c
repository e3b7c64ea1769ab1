/* listen.c - the gateway's --listen address, checked by `conch serve` before it starts (no TLS
 * here: this file is in conch, the gateway in conch-remote). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "remote/remote.h"

int conch_remote_parse_listen(const char *listen, char *host, size_t hostsize, int *port,
                              struct conch_err *err)
{
    const char *colon = strrchr(listen, ':');
    const char *h = listen;
    size_t hl = colon ? (size_t)(colon - listen) : 0;
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    char *end = NULL;
    long p = colon ? strtol(colon + 1, &end, 10) : 0;
    if (!colon || !hl || hl >= hostsize || !end || end == colon + 1 || *end || p < 1 || p > 65535)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--listen: '%s' is not HOST:PORT (e.g. 0.0.0.0:8443, "
                              "[::1]:8443)",
                              listen);
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (int)p;
    unsigned char addr[16];
    if (inet_pton(AF_INET, host, addr) != 1 && inet_pton(AF_INET6, host, addr) != 1)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--listen: '%s' is not an IP address (e.g. 0.0.0.0, 127.0.0.1, "
                              "[::])",
                              host);
    return 0;
}

int conch_remote_probe_listen(const char *listen, struct conch_err *err)
{
    char host[256];
    int port, r;
    if ((r = conch_remote_parse_listen(listen, host, sizeof(host), &port, err)) < 0)
        return r;
    struct sockaddr_storage ss = {0};
    socklen_t len;
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        len = sizeof(*in4);
    } else {
        inet_pton(AF_INET6, host, &in6->sin6_addr);
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        len = sizeof(*in6);
    }
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return conch_err_set(err, errno, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    r = bind(fd, (struct sockaddr *)&ss, len) < 0 ? -errno : 0;
    close(fd);
    if (r < 0)
        return conch_err_set(err, -r, "--listen %s: %s%s", listen, strerror(-r),
                             r == -EADDRINUSE ? " (another server listens there)" : "");
    return 0;
}
