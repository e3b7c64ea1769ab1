/* framer.c - newline framing of a client's byte stream, with a hard cap on the bytes a client
 * can make the daemon buffer. */
#include "rpc/rpc.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void conch_rpc_framer_init(struct conch_rpc_framer *f, size_t max_message)
{
    /* The buffer holds max + 1 bytes (a line plus its '\r'); keep that from overflowing. */
    if (max_message > SIZE_MAX / 2)
        max_message = SIZE_MAX / 2;
    *f = (struct conch_rpc_framer){.max = max_message};
}

void conch_rpc_framer_done(struct conch_rpc_framer *f)
{
    free(f->buf);
    f->buf = NULL;
    f->len = f->cap = 0;
    f->discarding = false;
}

size_t conch_rpc_framer_pending(const struct conch_rpc_framer *f)
{
    return f->len;
}

const char *conch_rpc_framer_oversize_head(const struct conch_rpc_framer *f, size_t *ret_len)
{
    *ret_len = f->over_head ? f->over_head_len : 0;
    return f->over_head;
}

static void report_oversize(struct conch_rpc_framer *f, const char *head, size_t len,
                            void (*on_oversize)(void *ctx), void *ctx)
{
    if (!on_oversize)
        return;
    f->over_head = head;
    f->over_head_len = len;
    on_oversize(ctx);
    f->over_head = NULL;
    f->over_head_len = 0;
}

/* Append to the partial line; the caller has checked that the total stays within max + 1. */
static int append(struct conch_rpc_framer *f, const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (f->len + n > f->cap) {
        /* Grow geometrically, but never past max + 1: an idle client costs nothing and a
         * hostile one at most the cap. */
        size_t cap = f->cap ? f->cap : 256;
        while (cap < f->len + n)
            cap = cap > SIZE_MAX / 2 ? SIZE_MAX : cap * 2;
        if (cap > f->max + 1)
            cap = f->max + 1;
        char *nb = realloc(f->buf, cap);
        if (!nb)
            return -ENOMEM;
        f->buf = nb;
        f->cap = cap;
    }
    memcpy(f->buf + f->len, p, n);
    f->len += n;
    return 0;
}

int conch_rpc_framer_feed(struct conch_rpc_framer *f, const char *buf, size_t len,
                          void (*on_line)(void *ctx, const char *line, size_t len),
                          void (*on_oversize)(void *ctx), void *ctx)
{
    while (len > 0) {
        const char *nl = memchr(buf, '\n', len);
        size_t seg = nl ? (size_t)(nl - buf) : len;
        size_t used = nl ? seg + 1 : len;

        if (f->discarding) {
            if (nl)
                f->discarding = false;
        } else if (f->len + seg > f->max + 1) {
            /* Too long even if its last byte turns out to be a '\r' to strip. Report it now,
             * before the newline arrives, so a client streaming an endless line is told and
             * nothing more of it is kept. */
            f->discarding = !nl;
            /* Its beginning (where the id usually is) is in the buffer or in this feed. */
            if (f->len > 0)
                report_oversize(f, f->buf, f->len, on_oversize, ctx);
            else
                report_oversize(f, buf, seg, on_oversize, ctx);
            f->len = 0;
        } else if (!nl) {
            if (append(f, buf, seg) < 0) {
                f->len = 0;
                f->discarding = true;
                return -ENOMEM;
            }
        } else {
            const char *line = buf;
            size_t n = seg;
            if (f->len > 0) {
                /* The line began in an earlier feed: join it in the buffer. */
                if (append(f, buf, seg) < 0) {
                    f->len = 0;
                    return -ENOMEM;
                }
                line = f->buf;
                n = f->len;
            }
            if (n > 0 && line[n - 1] == '\r')
                n--;
            if (n > f->max) {
                report_oversize(f, line, n, on_oversize, ctx);
            } else if (n > 0) {
                on_line(ctx, line, n);
            }
            f->len = 0;
        }
        buf += used;
        len -= used;
    }
    return 0;
}
