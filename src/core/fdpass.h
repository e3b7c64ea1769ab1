/* fdpass.h - one message with file descriptors over a unix socket (SCM_RIGHTS), the one
 * implementation every module uses: the warden protocol, a session's pty master, the
 * daemon's lease answer. No allocation: children between fork and exec use it too. */
#ifndef CONCH_CORE_FDPASS_H
#define CONCH_CORE_FDPASS_H

#include <stddef.h>
#include <sys/types.h>

/* At most this many descriptors travel with one message. */
#define CONCH_FDPASS_MAX 4

/*
 * conch_send_fds - send @len bytes of @buf with @nfds (0..CONCH_FDPASS_MAX) descriptors of
 * @fds (borrowed) in one sendmsg (MSG_NOSIGNAL | @flags), retried on EINTR. Returns the bytes
 * sent (the descriptors came with the first of them) or -errno.
 */
ssize_t conch_send_fds(int sock, const void *buf, size_t len, const int *fds, int nfds, int flags);

/*
 * conch_recv_fds - one recvmsg (MSG_CMSG_CLOEXEC | @flags, retried on EINTR) into @buf: the
 * descriptors that came with it go to @fds, up to @max_fds (any more are closed), their count
 * to *@ret_nfds. Returns the bytes received (0: EOF) or -errno (no descriptor kept).
 */
ssize_t conch_recv_fds(int sock, void *buf, size_t len, int *fds, int max_fds, int *ret_nfds,
                       int flags);

#endif
