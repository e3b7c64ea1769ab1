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

/* A buffer larger than this is freed once no partial line needs it: a connection that sent
 * one long line does not keep its memory while it idles. */
#define FRAMER_KEEP (64u << 10)

void conch_rpc_framer_set_budget(struct conch_rpc_framer *f, struct conch_budget *budget)
{
    f->budget = budget;
}

static void release(struct conch_rpc_framer *f)
{
    free(f->buf);
    conch_budget_uncharge(f->budget, f->cap);
    f->buf = NULL;
    f->cap = 0;
}

void conch_rpc_framer_done(struct conch_rpc_framer *f)
{
    release(f);
    f->len = f->cap = 0;
    f->discarding = f->scanning = false;
    conch_rpc_idscan_init(&f->ids);
}

void conch_rpc_idscan_init(struct conch_rpc_idscan *s)
{
    json_decref(s->id);
    memset(s, 0, sizeof(*s));
}

/* The id's value is complete in s->idbuf: keep it if it is a valid JSON-RPC id. */
static void idscan_finish(struct conch_rpc_idscan *s)
{
    json_t *v = json_loadb(s->idbuf, s->id_len, JSON_DECODE_ANY, NULL);
    if (v && (json_is_string(v) || json_is_integer(v) || json_is_null(v))) {
        s->id = v;
        s->result = 1;
        return;
    }
    json_decref(v);
    s->result = -1;
}

static void idscan_append(struct conch_rpc_idscan *s, char ch)
{
    if (s->id_len >= sizeof(s->idbuf)) {
        s->result = -1; /* an id this long is not worth keeping the line for */
        return;
    }
    s->idbuf[s->id_len++] = ch;
}

int conch_rpc_idscan_feed(struct conch_rpc_idscan *s, const char *buf, size_t len)
{
    for (size_t i = 0; i < len && s->result == 0; i++) {
        char ch = buf[i];
        bool ws = ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n';
        if (s->in_id) {
            if (s->id_is_string) {
                idscan_append(s, ch);
                if (s->esc)
                    s->esc = false;
                else if (ch == '\\')
                    s->esc = true;
                else if (ch == '"')
                    idscan_finish(s);
            } else if (ws || ch == ',' || ch == '}' || ch == ']') {
                idscan_finish(s);
            } else {
                idscan_append(s, ch);
            }
            continue;
        }
        if (s->in_str) {
            if (s->esc) {
                s->esc = false;
                s->key_bad = true; /* an escaped name is not spelt "id" here */
            } else if (ch == '\\') {
                s->esc = true;
            } else if (ch == '"') {
                s->in_str = false;
                if (s->in_key) {
                    s->in_key = false;
                    s->key_is_id = !s->key_bad && s->key_len == 2;
                }
            } else if (s->in_key) {
                if (s->key_len < 2 && ch == "id"[s->key_len])
                    s->key_len++;
                else
                    s->key_bad = true;
            }
            continue;
        }
        if (ws)
            continue;
        if (!s->started) {
            if (ch != '{') {
                s->result = -1; /* not an object (a batch, garbage): no one id to answer */
                continue;
            }
            s->started = true;
            s->depth = 1;
            s->expect_key = true;
            continue;
        }
        bool id_value = s->depth == 1 && !s->expect_key && s->key_is_id;
        switch (ch) {
        case '"':
            s->in_str = true;
            if (s->depth == 1 && s->expect_key) {
                s->in_key = true;
                s->key_bad = false;
                s->key_len = 0;
            } else if (id_value) {
                s->in_str = false;
                s->in_id = s->id_is_string = true;
                idscan_append(s, ch);
            }
            break;
        case '{':
        case '[':
            if (id_value)
                s->result = -1; /* an object or array is no id */
            s->depth++;
            break;
        case '}':
        case ']':
            if (--s->depth == 0)
                s->result = -1; /* the object ended without an id */
            break;
        case ':':
            if (s->depth == 1)
                s->expect_key = false;
            break;
        case ',':
            if (s->depth == 1) {
                s->expect_key = true;
                s->key_is_id = false;
            }
            break;
        default:
            if (id_value) {
                s->in_id = true;
                s->id_is_string = false;
                idscan_append(s, ch);
            }
            break;
        }
    }
    return s->result;
}

size_t conch_rpc_framer_pending(const struct conch_rpc_framer *f)
{
    return f->len;
}

json_t *conch_rpc_framer_oversize_id(const struct conch_rpc_framer *f)
{
    return f->over_id;
}

/* Tell the caller about the oversize line, with its id when the scan found one. */
static void report_oversize(struct conch_rpc_framer *f, void (*on_oversize)(void *ctx), void *ctx)
{
    f->scanning = false;
    if (on_oversize) {
        f->over_id = f->ids.result == 1 ? f->ids.id : NULL;
        on_oversize(ctx);
        f->over_id = NULL;
    }
    conch_rpc_idscan_init(&f->ids);
}

/* Scan @n more bytes of an oversize line for its id; report once it is decided or, with
 * @line_ended, once the line is over. */
static void scan_oversize(struct conch_rpc_framer *f, const char *p, size_t n, bool line_ended,
                          void (*on_oversize)(void *ctx), void *ctx)
{
    if (!f->scanning)
        return;
    if (conch_rpc_idscan_feed(&f->ids, p, n) != 0 || line_ended)
        report_oversize(f, on_oversize, ctx);
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
        /* Charged before it is held: a line split over many reads is what an attacker sends. */
        if (conch_budget_charge(f->budget, cap - f->cap, NULL) < 0)
            return -ENOBUFS;
        char *nb = realloc(f->buf, cap);
        if (!nb) {
            conch_budget_uncharge(f->budget, cap - f->cap);
            return -ENOMEM;
        }
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
            scan_oversize(f, buf, seg, nl != NULL, on_oversize, ctx);
            if (nl)
                f->discarding = false;
        } else if (f->len + seg > f->max + 1) {
            /* Too long even if its last byte turns out to be a '\r' to strip. Nothing more
             * of it is kept; it is reported as soon as its id is known, which a
             * constant-memory scan finds wherever it is in the line. */
            f->discarding = !nl;
            conch_rpc_idscan_init(&f->ids);
            f->scanning = true;
            scan_oversize(f, f->buf, f->len, false, on_oversize, ctx);
            scan_oversize(f, buf, seg, nl != NULL, on_oversize, ctx);
            f->len = 0;
        } else if (!nl) {
            int r = append(f, buf, seg);
            if (r < 0) {
                f->len = 0;
                f->discarding = true;
                release(f);
                return r;
            }
        } else {
            const char *line = buf;
            size_t n = seg;
            if (f->len > 0) {
                /* The line began in an earlier feed: join it in the buffer. */
                int r = append(f, buf, seg);
                if (r < 0) {
                    f->len = 0;
                    release(f);
                    return r;
                }
                line = f->buf;
                n = f->len;
            }
            if (n > 0 && line[n - 1] == '\r')
                n--;
            if (n > f->max) {
                conch_rpc_idscan_init(&f->ids);
                f->scanning = true;
                scan_oversize(f, line, n, true, on_oversize, ctx);
            } else if (n > 0) {
                on_line(ctx, line, n);
            }
            f->len = 0;
        }
        buf += used;
        len -= used;
    }
    if (f->len == 0 && f->cap > FRAMER_KEEP)
        release(f);
    return 0;
}
