/* fdpass.c - see fdpass.h. */
#include "core/fdpass.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

union fd_cmsg {
    char buf[CMSG_SPACE(sizeof(int) * CONCH_FDPASS_MAX)];
    struct cmsghdr align;
};

ssize_t conch_send_fds(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags)
{
    if (nfds < 0 || nfds > CONCH_FDPASS_MAX)
        return -EINVAL;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union fd_cmsg u;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds > 0) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;
    do
        n = sendmsg(sock, &mh, MSG_NOSIGNAL | flags);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

ssize_t conch_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *ret_nfds,
                       int flags)
{
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union fd_cmsg u;
    struct msghdr mh = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n;
    do
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
    while (n < 0 && errno == EINTR);
    *ret_nfds = 0;
    if (n < 0)
        return -errno;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int cnt = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < cnt; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + sizeof(int) * (size_t)i, sizeof(fd));
            if (*ret_nfds < max_fds)
                fds[(*ret_nfds)++] = fd;
            else
                close(fd);
        }
    }
    return n;
}
