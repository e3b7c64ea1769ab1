/* relay.h - internal to net/: the proxy's zero-copy relay between two connected sockets,
 * splice(2) through one pipe per direction, driven by libuv poll handles on the owner's loop.
 * Bytes go socket → pipe → socket inside the kernel (page references, no copy to the daemon);
 * each pipe is the whole buffer of its direction, so a side that does not read stops the
 * other side being read (backpressure) with at most one pipe's worth held, and what a pipe
 * holds is charged to the owner's budget while it holds it. */
#ifndef CONCH_NET_RELAY_H
#define CONCH_NET_RELAY_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#include "core/budget.h"
#include "core/error.h"

/* One direction: bytes read from its side's socket and not yet written to the other. */
struct conch_net_relay_dir {
    int pipe_r, pipe_w;
    size_t held;    /* bytes in the pipe */
    bool eof;       /* its side sent FIN */
    bool shut;      /* the other side was shut down for writing after the eof */
    bool pipe_full; /* a read found no room in the pipe: wait for a write to free some */
};

struct conch_net_relay_ops {
    /* @n bytes were read from side @side (0 or 1) and are on their way to the other. */
    void (*bytes)(void *ctx, int side, size_t n);
    /* The relay is over: both sides sent FIN and everything was delivered (@error NULL), or
     * a side failed (@error says how). Nothing is polled any more; the owner closes it. */
    void (*done)(void *ctx, const char *error);
};

/* Caller-allocated (embed it). The poll handles' data is the owner's @ctx, so that the close
 * callback given to conch_net_relay_close finds the owner. */
struct conch_net_relay {
    uv_poll_t poll[2];
    int fd[2];
    struct conch_net_relay_dir dir[2]; /* dir[i]: from fd[i] to fd[1 - i] */
    size_t pipe_size;                  /* each pipe's capacity */
    struct conch_budget *budget;       /* borrowed; or NULL */
    struct conch_net_relay_ops ops;
    void *ctx;
    unsigned polls; /* poll handles made: the owner's to count, closed by _close */
    bool over, closed;
};

/*
 * conch_net_relay_start - relay between the connected, non-blocking stream sockets @fd0 and
 * @fd1 (both taken, even on failure) on @loop, with pipes of about @pipe_size bytes (the
 * kernel may give less: @r->pipe_size then says how much each direction may hold). What the
 * pipes hold is charged to @budget (borrowed, may be NULL; it must outlive @r): a read takes
 * no more than it has room for, and with none and nothing held the relay ends. Returns
 * 0 with @r polling, or -errno with @err. Either way @r->polls poll handles exist (0 to 2;
 * 2 on success), and when there are any, conch_net_relay_close must close them; with none,
 * everything was closed already.
 */
int conch_net_relay_start(struct conch_net_relay *r, uv_loop_t *loop, int fd0, int fd1,
                          size_t pipe_size, struct conch_budget *budget,
                          const struct conch_net_relay_ops *ops, void *ctx, struct conch_err *err);

/* conch_net_relay_close - stop @r: its poll handles are closed with @close_cb (once for each
 * of the two), its sockets and pipes closed, what they held uncharged. Calls no op.
 * Idempotent. */
void conch_net_relay_close(struct conch_net_relay *r, uv_close_cb close_cb);

#endif
