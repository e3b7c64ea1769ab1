/* ctlq.c - the parent's sends to the warden, queued while its control socket is full. A
 * SOCK_SEQPACKET pair holds what its send buffer takes (~130 messages carrying fds with the
 * default net.core.wmem_default), so a burst of commands would otherwise fail with EAGAIN
 * (or block the caller's loop). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/fdpass.h"
#include "jail/jail-internal.h"

struct jail_queued {
    struct jail_queued *next;
    struct jail_msg m;
    int fds[JAIL_MSG_MAX_FDS];
    int nfds;
};

static int try_send(int fd, struct jail_msg *m, const int *fds, int nfds)
{
    m->version = JAIL_PROTO_VERSION;
    ssize_t n = conch_send_fds(fd, m, sizeof(*m), fds, nfds, MSG_DONTWAIT);
    if (n < 0)
        return (int)n;
    return n == (ssize_t)sizeof(*m) ? 0 : -EPROTO;
}

static void queued_free(struct jail_queued *q)
{
    for (int i = 0; i < q->nfds; i++)
        close(q->fds[i]);
    free(q);
}

int conch_jail_ctl_send(struct conch_jail *j, struct jail_msg *m, const int *fds, int nfds)
{
    if (j->ctl_fd < 0)
        return -EPIPE;
    if (nfds < 0 || nfds > JAIL_MSG_MAX_FDS)
        return -EINVAL;
    if (!j->outq_head) {
        int r = try_send(j->ctl_fd, m, fds, nfds);
        if (r != -EAGAIN)
            return r;
    }
    if (j->outq_len >= JAIL_OUTQ_MAX)
        return -ENOBUFS;
    struct jail_queued *q = calloc(1, sizeof(*q));
    if (!q)
        return -ENOMEM;
    q->m = *m;
    /* The caller closes its fds when we return: the queue holds copies. */
    for (; q->nfds < nfds; q->nfds++) {
        q->fds[q->nfds] = fcntl(fds[q->nfds], F_DUPFD_CLOEXEC, 3);
        if (q->fds[q->nfds] < 0) {
            int e = errno;
            queued_free(q);
            return -e;
        }
    }
    bool was_empty = !j->outq_head;
    if (j->outq_tail)
        j->outq_tail->next = q;
    else
        j->outq_head = q;
    j->outq_tail = q;
    j->outq_len++;
    if (was_empty && j->on_queued)
        j->on_queued(j->on_queued_data);
    return 0;
}

void conch_jail_ctl_queue_clear(struct conch_jail *j)
{
    while (j->outq_head) {
        struct jail_queued *q = j->outq_head;
        j->outq_head = q->next;
        queued_free(q);
    }
    j->outq_tail = NULL;
    j->outq_len = 0;
}

bool conch_jail_wants_write(const struct conch_jail *j)
{
    return j->outq_head != NULL;
}

void conch_jail_on_queued(struct conch_jail *j, void (*fn)(void *data), void *data)
{
    j->on_queued = fn;
    j->on_queued_data = data;
}

int conch_jail_flush(struct conch_jail *j, struct conch_err *err)
{
    while (j->outq_head) {
        struct jail_queued *q = j->outq_head;
        int r = j->ctl_fd < 0 ? -EPIPE : try_send(j->ctl_fd, &q->m, q->fds, q->nfds);
        if (r == -EAGAIN)
            return 1;
        if (r < 0) {
            conch_jail_ctl_queue_clear(j);
            return conch_err_set(err, -r, "send to the warden: %s", strerror(-r));
        }
        j->outq_head = q->next;
        if (!j->outq_head)
            j->outq_tail = NULL;
        j->outq_len--;
        queued_free(q);
    }
    return 0;
}
