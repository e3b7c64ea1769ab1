/* daemonlink.c - the gateway's blocking JSON-RPC calls to the daemon's unix socket: the
 * connection.auth that opens every forwarded connection and the daemon.ping of /healthz. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "remote/remote-internal.h"

#define ANSWER_MAX (64 * 1024)

int conch_remote_daemon_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

static int64_t now_ms(void)
{
    return (int64_t)conch_clock_ms();
}

static int wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

static int send_all(int fd, const char *buf, size_t len, int64_t deadline)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            int r = wait_fd(fd, POLLOUT, deadline);
            if (r < 0)
                return r;
            continue;
        }
        if (n < 0)
            return -errno;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One line into @buf (NUL-terminated, newline dropped), consuming nothing past it. */
static int read_line(int fd, char *buf, size_t size, int64_t deadline)
{
    for (;;) {
        int r = wait_fd(fd, POLLIN, deadline);
        if (r < 0)
            return r;
        ssize_t n = recv(fd, buf, size - 1, MSG_PEEK | MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -ECONNRESET;
        char *nl = memchr(buf, '\n', (size_t)n);
        if (!nl) {
            if ((size_t)n >= size - 1)
                return -EPROTO;
            /* Part of a line: wait for the rest (poll says readable at once, so nap). */
            struct timespec nap = {0, 200000};
            nanosleep(&nap, NULL);
            continue;
        }
        size_t want = (size_t)(nl - buf) + 1;
        n = recv(fd, buf, want, MSG_DONTWAIT);
        if (n != (ssize_t)want)
            return n < 0 ? -errno : -EPROTO;
        buf[want - 1] = '\0';
        return 0;
    }
}

int conch_remote_daemon_call(int fd, const char *method, json_t *params, int timeout_ms,
                             json_t **result, int *code)
{
    static const char id[] = "conch-gateway";
    int64_t deadline = now_ms() + timeout_ms;
    json_t *req = json_pack("{s:s, s:s, s:s, s:o}", "jsonrpc", "2.0", "id", id, "method", method,
                            "params", params ? params : json_object());
    if (!req)
        return -ENOMEM;
    char *body = json_dumps(req, JSON_COMPACT), *line = NULL;
    json_decref(req);
    if (!body || asprintf(&line, "%s\n", body) < 0) {
        free(body);
        return -ENOMEM;
    }
    free(body);
    int r = send_all(fd, line, strlen(line), deadline);
    free(line);
    if (r < 0)
        return r;
    char *buf = malloc(ANSWER_MAX);
    if (!buf)
        return -ENOMEM;
    for (;;) {
        if ((r = read_line(fd, buf, ANSWER_MAX, deadline)) < 0)
            break;
        json_t *msg = json_loads(buf, 0, NULL);
        json_t *mid = msg ? json_object_get(msg, "id") : NULL;
        if (!msg || !json_is_string(mid) || strcmp(json_string_value(mid), id)) {
            /* A notification before the answer: not ours to forward before the auth. */
            json_decref(msg);
            if (!msg) {
                r = -EPROTO;
                break;
            }
            continue;
        }
        json_t *res = json_object_get(msg, "result"), *e = json_object_get(msg, "error");
        if (res) {
            *result = json_incref(res);
            r = 0;
        } else if (json_is_object(e)) {
            *code = (int)json_integer_value(json_object_get(e, "code"));
            r = 1;
        } else
            r = -EPROTO;
        json_decref(msg);
        break;
    }
    free(buf);
    return r;
}
