/* output.c - one output stream of a command: the first max/2 bytes and the last
 * max - max/2 bytes kept in memory, the whole stream spilled to a file once it outgrows
 * memory, up to a cap. The buffers grow with the output: most commands print little, and a
 * megabyte allocated (mmap) and freed (munmap) per command was a tenth of the daemon's time. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "exec/output.h"

static size_t head_cap(const struct conch_output *o)
{
    return o->head_max;
}

static size_t tail_cap(const struct conch_output *o)
{
    return o->tail_max;
}

/* What memory may hold of the stream: until total passes it, memory holds all of it. */
static uint64_t mem_cap(const struct conch_output *o)
{
    return (uint64_t)o->head_max + o->tail_max;
}

int conch_output_init(struct conch_output *o, const char *name, size_t max_bytes,
                      uint64_t spill_max, const char *spill_dir, struct conch_err *err)
{
    memset(o, 0, sizeof(*o));
    o->spill_fd = -1; /* first, so done() is safe whatever fails below */

    if (!name || !*name || strchr(name, '/'))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "output name '%s' is invalid",
                              name ? name : "(null)");
    if (strlen(name) >= sizeof(o->name))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG, "output name '%s' is too long",
                              name);
    if (!spill_dir)
        spill_dir = "";
    if (strlen(spill_dir) >= sizeof(o->spill_dir))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "spill directory '%s' is too long", spill_dir);
    /* The file name must fit in spill_path too; check now rather than at the first spill. */
    if (*spill_dir &&
        strlen(spill_dir) + strlen("/conch--XXXXXX.log") + strlen(name) >= sizeof(o->spill_path))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "spill file name in '%s' is too long", spill_dir);

    strcpy(o->name, name);
    strcpy(o->spill_dir, spill_dir);
    o->max_bytes = max_bytes;
    o->head_max = max_bytes / 2;
    o->tail_max = max_bytes - max_bytes / 2;
    /* No directory means no spill file: the same as a spill cap of zero, so the notice
     * in the text says plainly that the rest was not kept. */
    o->spill_max = *spill_dir ? spill_max : 0;

    return 0;
}

void conch_output_set_budget(struct conch_output *o, struct conch_budget *budget)
{
    o->budget = budget;
}

/* The budget has no room for more: keep what is allocated (the head stops where its buffer
 * ends; the tail is what was granted, or none). */
static void squeeze(struct conch_output *o)
{
    if (o->head_max > o->head_alloc)
        o->head_max = o->head_alloc;
    if (!o->tail)
        o->tail_max = 0;
}

/* Room for @need bytes of head: doubling from 4 KiB up to the head's cap, each step charged
 * to the budget first. Returns 0 (the head may then be smaller than asked: squeezed), or
 * -ENOMEM. */
static int head_reserve(struct conch_output *o, size_t need)
{
    if (need <= o->head_alloc)
        return 0;
    size_t n = o->head_alloc ? o->head_alloc : 4096;
    while (n < need)
        n *= 2;
    if (n > head_cap(o))
        n = head_cap(o);
    if (n <= o->head_alloc)
        return 0;
    if (conch_budget_charge(o->budget, n - o->head_alloc, NULL) < 0) {
        squeeze(o);
        return 0;
    }
    char *h = realloc(o->head, n);
    if (!h) {
        conch_budget_uncharge(o->budget, n - o->head_alloc);
        return -ENOMEM;
    }
    o->charged += n - o->head_alloc;
    o->head = h;
    o->head_alloc = n;
    return 0;
}

/* The tail ring, allocated whole when the head is full: as much of tail_cap as the budget
 * grants (tail_max shrinks to it). Returns 0 or -ENOMEM. */
static int tail_alloc(struct conch_output *o)
{
    if (o->tail || o->tail_max == 0)
        return 0;
    uint64_t grant = conch_budget_charge_upto(o->budget, o->tail_max);
    if (grant < o->tail_max) {
        /* A sliver of a tail is not worth keeping: give it back to the others. */
        if (grant < 4096) {
            conch_budget_uncharge(o->budget, grant);
            grant = 0;
        }
        o->tail_max = (size_t)grant;
        if (grant == 0)
            return 0;
    }
    if (!(o->tail = malloc(o->tail_max))) {
        conch_budget_uncharge(o->budget, grant);
        return -ENOMEM;
    }
    o->charged += grant;
    return 0;
}

/* Before the stream first outgrows memory: make room for its first @total bytes, so that
 * a budget with no room shows now (mem_cap shrinks) and the caller spills before a byte is
 * dropped from memory. */
static int prepare(struct conch_output *o, uint64_t total)
{
    size_t h = total < head_cap(o) ? (size_t)total : head_cap(o);
    int r = head_reserve(o, h);
    if (r < 0 || total <= head_cap(o) || o->head_alloc < head_cap(o))
        return r;
    return tail_alloc(o);
}

/* keep - record @len bytes in the head, then the rest in the tail ring (allocated whole
 * when the head is full). Returns 0 or -ENOMEM (the bytes are then counted, not kept). */
static int keep(struct conch_output *o, const char *p, size_t len)
{
    if (o->head_len < head_cap(o)) {
        size_t n = head_cap(o) - o->head_len < len ? head_cap(o) - o->head_len : len;
        if (head_reserve(o, o->head_len + n) < 0)
            return -ENOMEM;
        /* The budget may have stopped the head where its buffer ends. */
        if (n > head_cap(o) - o->head_len)
            n = head_cap(o) - o->head_len;
        memcpy(o->head + o->head_len, p, n);
        o->head_len += n;
        p += n;
        len -= n;
    }
    size_t tcap = tail_cap(o);
    if (len == 0 || tcap == 0)
        return 0;
    if (!o->tail) {
        if (tail_alloc(o) < 0)
            return -ENOMEM;
        if (!o->tail) /* no room in the budget: the spill file has these bytes */
            return 0;
        tcap = tail_cap(o);
    }
    if (len >= tcap) {
        /* Only the last tcap bytes survive: copy them straight, ring restarts at 0. */
        memcpy(o->tail, p + len - tcap, tcap);
        o->tail_len = tcap;
        o->tail_pos = 0;
        return 0;
    }
    size_t first = tcap - o->tail_pos < len ? tcap - o->tail_pos : len;
    memcpy(o->tail + o->tail_pos, p, first);
    memcpy(o->tail, p + first, len - first);
    o->tail_pos = (o->tail_pos + len) % tcap;
    o->tail_len = o->tail_len + len > tcap ? tcap : o->tail_len + len;
    return 0;
}

/* tail_parts - the tail in stream order as at most two slices of the ring. */
static void tail_parts(const struct conch_output *o, const char **a, size_t *alen, const char **b,
                       size_t *blen)
{
    if (o->tail_len < tail_cap(o)) {
        /* Not wrapped yet: writes started at index 0 and never went round. */
        *a = o->tail;
        *alen = o->tail_len;
        *b = NULL;
        *blen = 0;
        return;
    }
    *a = o->tail + o->tail_pos;
    *alen = o->tail_len - o->tail_pos;
    *b = o->tail;
    *blen = o->tail_pos;
}

static int spill_fail(struct conch_output *o, int code, const char *what, struct conch_err *err)
{
    o->spill_err = code;
    return conch_err_set(err, code, "output '%s': %s spill file '%s': %s", o->name, what,
                         o->spill_path[0] ? o->spill_path : o->spill_dir, strerror(code));
}

/* spill_write - write up to the spill cap; marks spill_full when bytes had to be dropped. */
static int spill_write(struct conch_output *o, const void *p, size_t len, struct conch_err *err)
{
    if (len == 0 || o->spill_full)
        return 0;
    uint64_t room = o->spill_max - o->spilled;
    size_t n = len;
    if ((uint64_t)n > room) {
        n = (size_t)room;
        o->spill_full = true;
    }
    if (n == 0)
        return 0;
    int r = conch_write_all(o->spill_fd, p, n);
    if (r < 0)
        return spill_fail(o, -r, "writing", err);
    o->spilled += n;
    return 0;
}

/* spill_open - create the spill file and write what memory holds: the whole stream so far,
 * since memory holds everything until total first exceeds what it may hold (mem_cap). */
static int spill_open(struct conch_output *o, struct conch_err *err)
{
    char path[sizeof(o->spill_path)];
    int n = snprintf(path, sizeof(path), "%s/conch-%s-XXXXXX.log", o->spill_dir, o->name);
    if (n < 0 || (size_t)n >= sizeof(path))
        return spill_fail(o, ENAMETOOLONG, "creating", err);
    /* mkostemps creates with O_EXCL and mode 0600: no clobbering, no other readers. */
    int fd = mkostemps(path, strlen(".log"), O_CLOEXEC);
    if (fd < 0)
        return spill_fail(o, errno, "creating", err);
    o->spill_fd = fd;
    memcpy(o->spill_path, path, sizeof(path));

    const char *a, *b;
    size_t alen, blen;
    tail_parts(o, &a, &alen, &b, &blen);
    int r = spill_write(o, o->head, o->head_len, err);
    if (r >= 0)
        r = spill_write(o, a, alen, err);
    if (r >= 0)
        r = spill_write(o, b, blen, err);
    return r;
}

int conch_output_append(struct conch_output *o, const void *buf, size_t len, struct conch_err *err)
{
    int r = 0;

    if (len == 0)
        return o->spill_full ? 1 : 0;
    /* While memory holds the whole stream, room for these bytes is made first: a budget
     * with none shrinks what memory may hold, and the spill below starts before a byte is
     * lost. (Out of memory shows again in keep().) */
    if (o->total + len <= mem_cap(o))
        (void)prepare(o, o->total + len);
    if (!o->spill_full && !o->spill_err && o->total + len > mem_cap(o)) {
        if (o->spill_max == 0)
            o->spill_full = true; /* nowhere to spill: the excess is dropped */
        else if (!o->spill_path[0])
            r = spill_open(o, err);
        if (r >= 0 && !o->spill_err)
            r = spill_write(o, buf, len, err);
    }
    int k = keep(o, buf, len);
    o->total += len;
    if (r < 0)
        return r;
    if (k < 0)
        return conch_err_set(err, -k, "output '%s': out of memory keeping %zu bytes", o->name, len);
    return o->spill_full ? 1 : 0;
}

void conch_output_show_spill_in(struct conch_output *o, const char *dir)
{
    snprintf(o->shown_dir, sizeof(o->shown_dir), "%s", dir ? dir : "");
}

void conch_output_spill_shown(const struct conch_output *o, char *buf, size_t size)
{
    const char *base = strrchr(o->spill_path, '/');
    if (!o->spill_path[0])
        snprintf(buf, size, "%s", "");
    else if (o->shown_dir[0] && base)
        snprintf(buf, size, "%s%s", o->shown_dir, base);
    else
        snprintf(buf, size, "%s", o->spill_path);
}

bool conch_output_truncated(const struct conch_output *o)
{
    return o->total > mem_cap(o);
}

int conch_output_text(const struct conch_output *o, char **ret, size_t *ret_len)
{
    char notice[sizeof(o->spill_path) + sizeof(o->shown_dir) + 160] = "";
    size_t nlen = 0;

    if (conch_output_truncated(o)) {
        uint64_t omitted = o->total - o->head_len - o->tail_len;
        int n;
        if (o->spill_err)
            n = snprintf(notice, sizeof(notice),
                         "\n[... %" PRIu64 " bytes omitted; the spill file could not be "
                         "written (%s) ...]\n",
                         omitted, strerror(o->spill_err));
        else if (o->spill_full)
            n = snprintf(notice, sizeof(notice),
                         "\n[... %" PRIu64 " bytes omitted; spill limit of %" PRIu64
                         " bytes reached, the rest was not kept ...]\n",
                         omitted, o->spill_max);
        else {
            char shown[sizeof(o->spill_path) + sizeof(o->shown_dir)];
            conch_output_spill_shown(o, shown, sizeof(shown));
            n = snprintf(notice, sizeof(notice),
                         "\n[... %" PRIu64 " bytes omitted; full output in %s ...]\n", omitted,
                         shown);
        }
        nlen = n < 0 ? 0 : (size_t)n >= sizeof(notice) ? sizeof(notice) - 1 : (size_t)n;
    }

    const char *a, *b;
    size_t alen, blen;
    tail_parts(o, &a, &alen, &b, &blen);
    size_t len = o->head_len + nlen + alen + blen;
    char *s = malloc(len + 1);
    if (!s)
        return -ENOMEM;
    char *p = s;
    /* memcpy with a NULL source is undefined even for 0 bytes: max_bytes may be 0. */
    if (o->head_len)
        p = mempcpy(p, o->head, o->head_len);
    p = mempcpy(p, notice, nlen);
    if (alen)
        p = mempcpy(p, a, alen);
    if (blen)
        p = mempcpy(p, b, blen);
    *p = '\0';
    *ret = s;
    if (ret_len)
        *ret_len = len;
    return 0;
}

void conch_output_close_spill(struct conch_output *o)
{
    /* spill_path guards the close: a zeroed struct has spill_fd 0, which is not ours. */
    if (o->spill_fd >= 0 && o->spill_path[0])
        close(o->spill_fd);
    o->spill_fd = -1;
}

void conch_output_done(struct conch_output *o)
{
    conch_output_close_spill(o);
    free(o->head);
    o->head = NULL;
    free(o->tail);
    o->tail = NULL;
    conch_budget_uncharge(o->budget, o->charged);
    o->charged = 0;
    o->head_len = o->head_alloc = o->tail_len = o->tail_pos = 0;
}
