/* relay.c - the proxy's zero-copy relay (relay.h): splice(2) socket → pipe → socket for each
 * direction, on level-triggered poll handles of the owner's loop. A side is polled for
 * reading while its pipe has room, for writing while the other direction's pipe holds bytes;
 * each wakeup moves what it can up to a bound, so one busy connection does not hold the loop. */
#include "net/relay.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Bytes one direction reads per wakeup before the loop gets its turn again. */
#define PUMP_MAX (1u << 20)

static void close_pipe(struct conch_net_relay_dir *d)
{
    if (d->pipe_r >= 0)
        close(d->pipe_r);
    if (d->pipe_w >= 0)
        close(d->pipe_w);
    d->pipe_r = d->pipe_w = -1;
}

static void finish(struct conch_net_relay *r, const char *error)
{
    if (r->over)
        return;
    r->over = true;
    uv_poll_stop(&r->poll[0]);
    uv_poll_stop(&r->poll[1]);
    r->ops.done(r->ctx, error);
}

static void finish_errno(struct conch_net_relay *r, const char *what, int e)
{
    char msg[128];
    snprintf(msg, sizeof(msg), "%s: %s", what, strerror(e));
    finish(r, msg);
}

/* Move bytes of direction @i: drain its pipe into the other side, refill it from its side.
 * Returns 0, or -1 when the relay finished (an error). */
static int pump(struct conch_net_relay *r, int i)
{
    struct conch_net_relay_dir *d = &r->dir[i];
    int from = r->fd[i], to = r->fd[1 - i];
    size_t moved = 0;
    for (;;) {
        bool progress = false;
        if (d->held > 0) {
            ssize_t n =
                splice(d->pipe_r, NULL, to, NULL, d->held, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
            if (n > 0) {
                d->held -= (size_t)n;
                conch_budget_uncharge(r->budget, (uint64_t)n);
                d->pipe_full = false;
                progress = true;
            } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                finish_errno(r, "send", errno);
                return -1;
            }
        }
        if (d->eof && d->held == 0 && !d->shut) {
            d->shut = true;
            shutdown(to, SHUT_WR); /* a peer gone already is found by its own side's poll */
        }
        if (!d->eof && !d->pipe_full && d->held < r->pipe_size && moved < PUMP_MAX) {
            size_t room = (size_t)conch_budget_charge_upto(r->budget, r->pipe_size - d->held);
            if (room == 0) {
                if (d->held == 0) {
                    finish(r, "the sandbox's memory budget is full");
                    return -1;
                }
                d->pipe_full = true; /* read again once the other side took some */
                return 0;
            }
            ssize_t n =
                splice(from, NULL, d->pipe_w, NULL, room, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
            int e = errno;
            conch_budget_uncharge(r->budget, n > 0 ? room - (size_t)n : room);
            errno = e;
            if (n > 0) {
                d->held += (size_t)n;
                moved += (size_t)n;
                r->ops.bytes(r->ctx, i, (size_t)n);
                if (r->over)
                    return -1;
                progress = true;
            } else if (n == 0) {
                d->eof = true;
                progress = true;
            } else if (errno == EAGAIN) {
                /* No data, or no free slot in the pipe (its slots hold partial pages, so
                 * held < pipe_size does not mean room): with bytes held, wait for the other
                 * side to take some before reading again, or a readable side would spin. */
                if (d->held > 0)
                    d->pipe_full = true;
            } else if (errno != EINTR) {
                finish_errno(r, "receive", errno);
                return -1;
            }
        }
        if (!progress)
            return 0;
    }
}

static void on_poll(uv_poll_t *h, int status, int events);

/* Poll each side for what its directions wait on; finish when both are done. */
static void rearm(struct conch_net_relay *r)
{
    if (r->over)
        return;
    if (r->dir[0].shut && r->dir[1].shut) {
        finish(r, NULL);
        return;
    }
    for (int i = 0; i < 2; i++) {
        const struct conch_net_relay_dir *in = &r->dir[i], *out = &r->dir[1 - i];
        int events = 0;
        if (!in->eof && !in->pipe_full && in->held < r->pipe_size)
            events |= UV_READABLE;
        if (out->held > 0)
            events |= UV_WRITABLE;
        if (events)
            uv_poll_start(&r->poll[i], events, on_poll);
        else
            uv_poll_stop(&r->poll[i]);
    }
}

static void on_poll(uv_poll_t *h, int status, int events)
{
    struct conch_net_relay *r = h->data;
    int i = h == &r->poll[1];
    if (status < 0) {
        /* libuv says EBADF for POLLERR: the socket's own error says what happened. */
        int e = 0;
        socklen_t len = sizeof(e);
        if (getsockopt(r->fd[i], SOL_SOCKET, SO_ERROR, &e, &len) < 0 || e == 0)
            e = ECONNRESET;
        finish_errno(r, i ? "the remote side" : "the sandbox's side", e);
        return;
    }
    /* Writable: the other direction's pipe drains into this side (and refills from the
     * other side while both go); readable: this side's direction reads. */
    if ((events & UV_WRITABLE) && pump(r, 1 - i) < 0)
        return;
    if ((events & UV_READABLE) && pump(r, i) < 0)
        return;
    rearm(r);
}

int conch_net_relay_start(struct conch_net_relay *r, uv_loop_t *loop, int fd0, int fd1,
                          size_t pipe_size, struct conch_budget *budget,
                          const struct conch_net_relay_ops *ops, void *ctx, struct conch_err *err)
{
    memset(r, 0, sizeof(*r));
    r->budget = budget;
    r->fd[0] = fd0;
    r->fd[1] = fd1;
    r->ops = *ops;
    r->ctx = ctx;
    r->pipe_size = pipe_size;
    for (int i = 0; i < 2; i++)
        r->dir[i].pipe_r = r->dir[i].pipe_w = -1;
    int e = 0;
    for (int i = 0; i < 2 && !e; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC | O_NONBLOCK) < 0) {
            e = errno;
            break;
        }
        r->dir[i].pipe_r = p[0];
        r->dir[i].pipe_w = p[1];
        /* Larger than the default 64 KiB when allowed (an unprivileged owner past
         * fs.pipe-user-pages-soft keeps the default): fewer wakeups per byte. */
        (void)fcntl(p[1], F_SETPIPE_SZ, (int)pipe_size);
        int got = fcntl(p[1], F_GETPIPE_SZ);
        if (got > 0 && (size_t)got < r->pipe_size)
            r->pipe_size = (size_t)got;
    }
    for (int i = 0; i < 2 && !e; i++) {
        int s = uv_poll_init_socket(loop, &r->poll[i], r->fd[i]);
        if (s < 0)
            e = -s;
        else
            r->polls++;
    }
    if (e) {
        r->over = true;
        if (r->polls == 0) { /* else conch_net_relay_close closes them */
            close(fd0);
            close(fd1);
            close_pipe(&r->dir[0]);
            close_pipe(&r->dir[1]);
        }
        return conch_err_set(err, e, "network relay: %s", strerror(e));
    }
    for (int i = 0; i < 2; i++) {
        r->poll[i].data = r;
        uv_poll_start(&r->poll[i], UV_READABLE, on_poll);
    }
    return 0;
}

void conch_net_relay_close(struct conch_net_relay *r, uv_close_cb close_cb)
{
    if (r->closed)
        return;
    r->closed = true;
    r->over = true;
    for (int i = 0; i < 2; i++) {
        if (i < (int)r->polls) {
            r->poll[i].data = r->ctx;
            uv_close((uv_handle_t *)&r->poll[i], close_cb); /* stops polling the fd first */
        }
        close(r->fd[i]);
        r->fd[i] = -1;
        close_pipe(&r->dir[i]);
        conch_budget_uncharge(r->budget, r->dir[i].held);
        r->dir[i].held = 0;
    }
}
