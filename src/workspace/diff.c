/* diff.c - unified diffs of a sandbox's changes (upper dir) against the host dir (lower),
 * for review before a commit: a line diff (Myers' O(ND) algorithm in linear space) in the
 * format of `diff -u` / git, with binary, symlink and mode changes described in git's words. */
#include "workspace/workspace.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/strbuf.h"
#include "core/utf8.h"
#include "workspace/ws-internal.h"

#define CONTEXT 3
/* Far more lines than a few-MB file has; keeps every index comfortably in an int. */
#define MAX_LINES (INT_MAX / 4)

/* ---- growing strings --------------------------------------------------------------- */

/* Appends @s with every ill-formed UTF-8 sequence replaced by U+FFFD: JSON strings must be
 * UTF-8, and source files in Latin-1 or with stray bytes are common. */
static void buf_utf8(struct conch_sb *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t start = 0, i = 0;
    while (i < n) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = conch_utf8_seq(u + i, n - i);
        if (k > 0) {
            i += k;
            continue;
        }
        conch_sb_putn(b, s + start, i - start);
        conch_sb_putn(b, "\xef\xbf\xbd", 3);
        i += conch_utf8_bad(u + i, n - i);
        start = i;
    }
    conch_sb_putn(b, s + start, n - start);
}

/* ---- lines and their identities ---------------------------------------------------- */

struct line {
    const char *p;
    size_t len; /* including the '\n', if any: "x" and "x\n" are different lines */
};

static int split_lines(const char *s, size_t n, struct line **ret, int *ret_n)
{
    size_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += s[i] == '\n';
    if (n && s[n - 1] != '\n')
        count++;
    if (count > MAX_LINES)
        return -EFBIG;
    struct line *v = calloc(count ? count : 1, sizeof(*v));
    if (!v)
        return -ENOMEM;
    size_t k = 0, start = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\n') {
            v[k++] = (struct line){s + start, i + 1 - start};
            start = i + 1;
        }
    }
    if (start < n)
        v[k++] = (struct line){s + start, n - start};
    *ret = v;
    *ret_n = (int)count;
    return 0;
}

static uint64_t hash_line(const struct line *l)
{
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (size_t i = 0; i < l->len; i++) {
        h ^= (unsigned char)l->p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

/* Numbers the lines of both files so that equal lines get equal ids: the diff then
 * compares ints instead of strings. */
static int number_lines(const struct line *a, int na, const struct line *b, int nb, int *ida,
                        int *idb)
{
    size_t cap = 16;
    while (cap < 2 * ((size_t)na + (size_t)nb))
        cap *= 2;
    _cleanup_free_ const struct line **slot = calloc(cap, sizeof(*slot));
    _cleanup_free_ int *slot_id = calloc(cap, sizeof(*slot_id));
    if (!slot || !slot_id)
        return -ENOMEM;
    int next = 0;
    for (int side = 0; side < 2; side++) {
        const struct line *v = side ? b : a;
        int *ids = side ? idb : ida;
        int n = side ? nb : na;
        for (int i = 0; i < n; i++) {
            size_t h = (size_t)hash_line(&v[i]) & (cap - 1);
            while (slot[h] &&
                   (slot[h]->len != v[i].len || memcmp(slot[h]->p, v[i].p, v[i].len) != 0))
                h = (h + 1) & (cap - 1);
            if (!slot[h]) {
                slot[h] = &v[i];
                slot_id[h] = next++;
            }
            ids[i] = slot_id[h];
        }
    }
    return 0;
}

/* ---- Myers' diff, linear-space variant (E. Myers, "An O(ND) Difference Algorithm and
 * Its Variations", 1986, section 4b) --------------------------------------------------- */

/* Steps of the search (diagonals tried plus lines matched) one file's diff may take. */
#define DIFF_WORK_BUDGET (200LL * 1000 * 1000)

struct lcs {
    const int *a, *b;
    unsigned char *ca, *cb; /* out: line changed (deleted from a / inserted in b) */
    int *fd, *bd;           /* furthest reaching x per diagonal k = x - y, offset */
    int too_expensive;      /* give up on minimality past this many edit steps */
    long long work, budget; /* steps taken; past the budget, the rest is marked changed */
};

/* Finds a point (*xmid, *ymid) on an optimal (or, past too_expensive, a good) edit path
 * from (xoff, yoff) to (xlim, ylim) by running the search from both ends until they meet. */
static void middle_snake(struct lcs *s, int xoff, int xlim, int yoff, int ylim, int *xmid,
                         int *ymid)
{
    int *fd = s->fd, *bd = s->bd;
    const int *a = s->a, *b = s->b;
    const int dmin = xoff - ylim, dmax = xlim - yoff;
    const int fmid = xoff - yoff, bmid = xlim - ylim;
    int fmin = fmid, fmax = fmid, bmin = bmid, bmax = bmid;
    const bool odd = (fmid - bmid) & 1;

    fd[fmid] = xoff;
    bd[bmid] = xlim;
    for (int c = 1;; c++) {
        /* Widen the forward band by one diagonal each side (or narrow at the edges to
         * keep the parity), with sentinels so the first step off an edge is well defined. */
        if (fmin > dmin)
            fd[--fmin - 1] = -1;
        else
            ++fmin;
        if (fmax < dmax)
            fd[++fmax + 1] = -1;
        else
            --fmax;
        for (int d = fmax; d >= fmin; d -= 2) {
            int tlo = fd[d - 1], thi = fd[d + 1];
            int x = tlo >= thi ? tlo + 1 : thi;
            int y = x - d;
            int x0 = x;
            while (x < xlim && y < ylim && a[x] == b[y])
                x++, y++;
            s->work += 1 + (x - x0);
            fd[d] = x;
            if (odd && bmin <= d && d <= bmax && bd[d] <= x) {
                *xmid = x;
                *ymid = y;
                return;
            }
        }
        if (bmin > dmin)
            bd[--bmin - 1] = INT_MAX;
        else
            ++bmin;
        if (bmax < dmax)
            bd[++bmax + 1] = INT_MAX;
        else
            --bmax;
        for (int d = bmax; d >= bmin; d -= 2) {
            int tlo = bd[d - 1], thi = bd[d + 1];
            int x = tlo < thi ? tlo : thi - 1;
            int y = x - d;
            int x0 = x;
            while (x > xoff && y > yoff && a[x - 1] == b[y - 1])
                x--, y--;
            s->work += 1 + (x0 - x);
            bd[d] = x;
            if (!odd && fmin <= d && d <= fmax && x <= fd[d]) {
                *xmid = x;
                *ymid = y;
                return;
            }
        }
        if (c < s->too_expensive && s->work <= s->budget)
            continue;
        /* Very different inputs would cost O(N*D): split at whichever search got
         * furthest instead (as GNU diff does), trading minimality for bounded time. */
        int fbest = -1, fxbest = xoff, bbest = INT_MAX, bxbest = xlim;
        for (int d = fmax; d >= fmin; d -= 2) {
            int x = fd[d] < xlim ? fd[d] : xlim;
            int y = x - d;
            if (y > ylim) {
                x = ylim + d;
                y = ylim;
            }
            if (x + y > fbest) {
                fbest = x + y;
                fxbest = x;
            }
        }
        for (int d = bmax; d >= bmin; d -= 2) {
            int x = bd[d] > xoff ? bd[d] : xoff;
            int y = x - d;
            if (y < yoff) {
                x = yoff + d;
                y = yoff;
            }
            if (x + y < bbest) {
                bbest = x + y;
                bxbest = x;
            }
        }
        if ((xlim + ylim) - bbest < fbest - (xoff + yoff)) {
            *xmid = fxbest;
            *ymid = fbest - fxbest;
        } else {
            *xmid = bxbest;
            *ymid = bbest - bxbest;
        }
        return;
    }
}

static void mark_all(struct lcs *s, int xoff, int xlim, int yoff, int ylim)
{
    for (int x = xoff; x < xlim; x++)
        s->ca[x] = 1;
    for (int y = yoff; y < ylim; y++)
        s->cb[y] = 1;
}

/* Marks the lines outside a longest common subsequence of a[xoff,xlim) and b[yoff,ylim).
 * Recurses into the smaller half and loops on the larger, so the stack stays logarithmic
 * even when the heuristic splits unevenly. */
static void compare_seq(struct lcs *s, int xoff, int xlim, int yoff, int ylim)
{
    for (;;) {
        /* Inputs that defeat the heuristic too (a few distinct lines repeated a million
         * times) would still cost minutes of CPU: past the budget, what is left is shown as
         * replaced. The diff stays correct, only not minimal. */
        if (s->work > s->budget) {
            mark_all(s, xoff, xlim, yoff, ylim);
            return;
        }
        while (xoff < xlim && yoff < ylim && s->a[xoff] == s->b[yoff])
            xoff++, yoff++;
        while (xlim > xoff && ylim > yoff && s->a[xlim - 1] == s->b[ylim - 1])
            xlim--, ylim--;
        if (xoff == xlim || yoff == ylim) {
            mark_all(s, xoff, xlim, yoff, ylim);
            return;
        }
        int xmid, ymid;
        middle_snake(s, xoff, xlim, yoff, ylim, &xmid, &ymid);
        if ((xmid == xoff && ymid == yoff) || (xmid == xlim && ymid == ylim) || xmid < xoff ||
            xmid > xlim || ymid < yoff || ymid > ylim) {
            mark_all(s, xoff, xlim, yoff, ylim); /* cannot happen; never loop forever */
            return;
        }
        if ((xmid - xoff) + (ymid - yoff) < (xlim - xmid) + (ylim - ymid)) {
            compare_seq(s, xoff, xmid, yoff, ymid);
            xoff = xmid;
            yoff = ymid;
        } else {
            compare_seq(s, xmid, xlim, ymid, ylim);
            xlim = xmid;
            ylim = ymid;
        }
    }
}

/* ---- unified output ---------------------------------------------------------------- */

/* Lines a[a0,a1) replaced by b[b0,b1). */
struct change {
    int a0, a1, b0, b1;
};

static void put_line(struct conch_sb *out, char prefix, const struct line *l)
{
    conch_sb_putn(out, &prefix, 1);
    buf_utf8(out, l->p, l->len);
    if (l->len == 0 || l->p[l->len - 1] != '\n')
        conch_sb_puts(out, "\n\\ No newline at end of file\n");
}

static void put_range(struct conch_sb *out, char sign, int start, int count)
{
    /* diff -u: an empty range names the line before it; a one-line range omits ",1". */
    if (count == 0)
        conch_sb_printf(out, " %c%d,0", sign, start);
    else if (count == 1)
        conch_sb_printf(out, " %c%d", sign, start + 1);
    else
        conch_sb_printf(out, " %c%d,%d", sign, start + 1, count);
}

static void put_hunks(struct conch_sb *out, const struct line *a, int na, const struct line *b,
                      const struct change *ch, size_t nch)
{
    size_t i = 0;
    while (i < nch) {
        size_t j = i;
        /* Changes whose contexts touch or overlap share a hunk, as in diff -u. */
        while (j + 1 < nch && ch[j + 1].a0 - ch[j].a1 <= 2 * CONTEXT)
            j++;
        int a_start = ch[i].a0 > CONTEXT ? ch[i].a0 - CONTEXT : 0;
        int b_start = ch[i].b0 - (ch[i].a0 - a_start);
        int a_end = ch[j].a1 + CONTEXT < na ? ch[j].a1 + CONTEXT : na;
        int b_end = ch[j].b1 + (a_end - ch[j].a1);
        conch_sb_puts(out, "@@");
        put_range(out, '-', a_start, a_end - a_start);
        put_range(out, '+', b_start, b_end - b_start);
        conch_sb_puts(out, " @@\n");
        int x = a_start;
        for (size_t k = i; k <= j; k++) {
            for (; x < ch[k].a0; x++)
                put_line(out, ' ', &a[x]);
            for (; x < ch[k].a1; x++)
                put_line(out, '-', &a[x]);
            for (int y = ch[k].b0; y < ch[k].b1; y++)
                put_line(out, '+', &b[y]);
        }
        for (; x < a_end; x++)
            put_line(out, ' ', &a[x]);
        i = j + 1;
    }
}

/* Appends the hunks turning text @sa into @sb (nothing if they are equal). */
static int text_diff(struct conch_sb *out, const char *sa, size_t la, const char *sb, size_t lb)
{
    _cleanup_free_ struct line *a = NULL;
    _cleanup_free_ struct line *b = NULL;
    int na = 0, nb = 0;
    int r = split_lines(sa, la, &a, &na);
    if (r >= 0)
        r = split_lines(sb, lb, &b, &nb);
    if (r < 0)
        return r;
    if (na + nb > MAX_LINES)
        return -EFBIG;
    _cleanup_free_ int *ida = calloc((size_t)na + 1, sizeof(int));
    _cleanup_free_ int *idb = calloc((size_t)nb + 1, sizeof(int));
    _cleanup_free_ unsigned char *ca = calloc((size_t)na + 1, 1);
    _cleanup_free_ unsigned char *cb = calloc((size_t)nb + 1, 1);
    if (!ida || !idb || !ca || !cb)
        return -ENOMEM;
    r = number_lines(a, na, b, nb, ida, idb);
    if (r < 0)
        return r;

    /* A line with no equal in the other file is changed in any edit script: leaving it
     * out of the search keeps the result minimal and makes rewritten files cheap. */
    size_t nid = (size_t)na + (size_t)nb + 1;
    _cleanup_free_ unsigned char *seen = calloc(nid, 1); /* bit 0: in a, bit 1: in b */
    _cleanup_free_ int *ra = calloc((size_t)na + 1, sizeof(int));
    _cleanup_free_ int *rb = calloc((size_t)nb + 1, sizeof(int));
    _cleanup_free_ int *ma = calloc((size_t)na + 1, sizeof(int));
    _cleanup_free_ int *mb = calloc((size_t)nb + 1, sizeof(int));
    if (!seen || !ra || !rb || !ma || !mb)
        return -ENOMEM;
    for (int i = 0; i < na; i++)
        seen[ida[i]] |= 1;
    for (int i = 0; i < nb; i++)
        seen[idb[i]] |= 2;
    int rna = 0, rnb = 0;
    for (int i = 0; i < na; i++) {
        if (seen[ida[i]] & 2) {
            ra[rna] = ida[i];
            ma[rna++] = i;
        } else {
            ca[i] = 1;
        }
    }
    for (int i = 0; i < nb; i++) {
        if (seen[idb[i]] & 1) {
            rb[rnb] = idb[i];
            mb[rnb++] = i;
        } else {
            cb[i] = 1;
        }
    }

    size_t diags = (size_t)rna + (size_t)rnb + 3;
    _cleanup_free_ unsigned char *rca = calloc((size_t)rna + 1, 1);
    _cleanup_free_ unsigned char *rcb = calloc((size_t)rnb + 1, 1);
    _cleanup_free_ int *fd = calloc(diags, sizeof(int));
    _cleanup_free_ int *bd = calloc(diags, sizeof(int));
    if (!rca || !rcb || !fd || !bd)
        return -ENOMEM;
    struct lcs s = {
        .a = ra,
        .b = rb,
        .ca = rca,
        .cb = rcb,
        .fd = fd + rnb + 1, /* diagonals run from -rnb-1 to rna+1 */
        .bd = bd + rnb + 1,
        .too_expensive = 1,
    };
    /* About sqrt(diags), at least 4096: minimal diffs for anything a person would read. */
    for (size_t d = diags; d; d >>= 2)
        s.too_expensive <<= 1;
    if (s.too_expensive < 4096)
        s.too_expensive = 4096;
    /* About a second of CPU at most, whatever the inputs (a file is at most 4 MiB). */
    s.budget = DIFF_WORK_BUDGET;
    compare_seq(&s, 0, rna, 0, rnb);
    for (int i = 0; i < rna; i++)
        ca[ma[i]] |= rca[i];
    for (int i = 0; i < rnb; i++)
        cb[mb[i]] |= rcb[i];

    size_t nch = 0, cap = 0;
    _cleanup_free_ struct change *ch = NULL;
    for (int x = 0, y = 0; x < na || y < nb;) {
        if ((x < na && ca[x]) || (y < nb && cb[y])) {
            struct change c = {.a0 = x, .b0 = y};
            while (x < na && ca[x])
                x++;
            while (y < nb && cb[y])
                y++;
            c.a1 = x;
            c.b1 = y;
            if (nch == cap) {
                cap = cap ? cap * 2 : 16;
                struct change *v = realloc(ch, cap * sizeof(*v));
                if (!v)
                    return -ENOMEM;
                ch = v;
            }
            ch[nch++] = c;
        } else {
            x++, y++;
        }
    }
    put_hunks(out, a, na, b, ch, nch);
    return out->oom ? -ENOMEM : 0;
}

/* ---- reading both sides ------------------------------------------------------------ */

/* One side of a changed path. */
struct side {
    bool present;
    char type;   /* 'f', 'd', 'l', 'o' */
    mode_t mode; /* full st_mode */
    char *data;  /* files: content (or its first bytes if too_big); symlinks: the target */
    size_t len;
    bool too_big;
    bool binary;
};

static void side_done(struct side *s)
{
    free(s->data);
    s->data = NULL;
}

static int read_fd(int fd, size_t want, char **ret, size_t *ret_len)
{
    size_t cap = want + 1, len = 0;
    char *p = malloc(cap);
    if (!p)
        return -ENOMEM;
    while (len < want) {
        ssize_t n = read(fd, p + len, want - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int r = -errno;
            free(p);
            return r;
        }
        if (n == 0)
            break; /* shrank since fstat: diff what is there */
        len += (size_t)n;
    }
    p[len] = '\0';
    *ret = p;
    *ret_len = len;
    return 0;
}

/* Reads @path beneath @dirfd without following any symlink. A missing path, or one
 * whose parent is not a directory on this side, is absent (not an error). */
static int load_side(int dirfd, const char *path, size_t max, struct side *ret)
{
    const char *slash = strrchr(path, '/');
    _cleanup_free_ char *parent = slash ? strndup(path, (size_t)(slash - path)) : strdup("");
    const char *name = slash ? slash + 1 : path;
    if (!parent)
        return -ENOMEM;
    *ret = (struct side){0};
    _cleanup_close_ int pfd = conch_open_beneath(dirfd, parent, O_PATH | O_DIRECTORY, 0, 0);
    if (pfd == -ENOENT || pfd == -ENOTDIR || pfd == -ELOOP)
        return 0;
    if (pfd < 0)
        return pfd;
    struct stat st;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    ret->present = true;
    ret->type = conch_ws__type(st.st_mode);
    ret->mode = st.st_mode;
    if (ret->type == 'l') {
        _cleanup_free_ char *target = NULL;
        int r = conch_ws__read_link(pfd, name, &target);
        if (r < 0)
            return r;
        /* git's content of a symlink: its target, with no newline (so the hunk ends with
         * "\ No newline at end of file" and git apply makes the very same link). */
        ret->data = TAKE_PTR(target);
        ret->len = strlen(ret->data);
        return 0;
    }
    if (ret->type != 'f')
        return 0;
    /* O_NONBLOCK: a FIFO swapped in since the fstatat must not hang the daemon. */
    _cleanup_close_ int fd =
        openat(pfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return -ESTALE;
    size_t size = (size_t)st.st_size;
    ret->too_big = max && size > max;
    int r = read_fd(fd, ret->too_big ? CONCH_WS__BINARY_PROBE : size, &ret->data, &ret->len);
    if (r < 0)
        return r;
    size_t probe = ret->len < CONCH_WS__BINARY_PROBE ? ret->len : CONCH_WS__BINARY_PROBE;
    ret->binary = memchr(ret->data, 0, probe) != NULL;
    return 0;
}

/* ---- one file ---------------------------------------------------------------------- */

/* Appends the content diff between @old and @new (either NULL for an added or deleted
 * path; both files or symlinks). @qa, @qb: the quoted "a/path" and "b/path". */
static int content_diff(struct conch_sb *out, const char *qa, const char *qb,
                        const struct side *old, const struct side *new, size_t max)
{
    const char *an = old ? qa : "/dev/null";
    const char *bn = new ? qb : "/dev/null";
    int r = 0;
    if ((old && old->binary) || (new &&new->binary)) {
        conch_sb_puts(out, "Binary files ");
        conch_sb_puts(out, an);
        conch_sb_puts(out, " and ");
        conch_sb_puts(out, bn);
        conch_sb_puts(out, " differ\n");
    } else if ((old && old->too_big) || (new &&new->too_big)) {
        conch_sb_printf(out, "[diff omitted: file larger than %zu bytes]\n", max);
    } else {
        struct conch_sb hunks = {0};
        r = text_diff(&hunks, old ? old->data : "", old ? old->len : 0, new ? new->data : "",
                      new ? new->len : 0);
        /* An added or deleted empty file still gets its header; equal content nothing. */
        if (r >= 0 && (hunks.len || !old || !new)) {
            conch_sb_puts(out, "--- ");
            conch_sb_puts(out, an);
            conch_sb_puts(out, "\n+++ ");
            conch_sb_puts(out, bn);
            conch_sb_puts(out, "\n");
            conch_sb_putn(out, hunks.buf, hunks.len);
        }
        free(hunks.buf);
    }
    return r;
}

static bool has_text(const struct side *s)
{
    return s->present && (s->type == 'f' || s->type == 'l');
}

/* A git section header for the quoted names @qa, @qb, with @ext (extended header lines)
 * after it. */
static void put_section(struct conch_sb *all, const char *qa, const char *qb, const char *ext)
{
    conch_sb_puts(all, "diff --git ");
    conch_sb_puts(all, qa);
    conch_sb_puts(all, " ");
    conch_sb_puts(all, qb);
    conch_sb_puts(all, "\n");
    conch_sb_puts(all, ext);
}

/* Appends the part @from..end of @out to @all as one git section. */
static void add_section(struct conch_sb *all, const char *qa, const char *qb, const char *ext,
                        const struct conch_sb *out, size_t from)
{
    if (out->len == from)
        return;
    put_section(all, qa, qb, ext);
    conch_sb_putn(all, out->buf + from, out->len - from);
}

/*
 * The diff of one change into @out (which may stay empty: directories, special files),
 * and the same as git sections into @all: a type change is two sections there, so that
 * the whole diff is a patch `git apply` understands.
 */
static int file_diff(int upper_fd, int lower_fd, const struct conch_ws_change *ch, size_t max,
                     struct conch_sb *out, struct conch_sb *all, bool *ret_binary)
{
    /* Quoted as git quotes them (core.quotePath): a newline in a name must not start a
     * header line that `patch` would follow, and the result is ASCII. */
    _cleanup_free_ char *qa = conch_ws_quote("a/", ch->path, true);
    _cleanup_free_ char *qb = conch_ws_quote("b/", ch->path, true);
    if (!qa || !qb)
        return -ENOMEM;
    struct side was = {0}, now = {0};
    char ext[64];
    int r = 0;
    if (ch->kind != CONCH_CHANGE_ADDED)
        r = load_side(lower_fd, ch->path, max, &was);
    if (r >= 0 && ch->kind != CONCH_CHANGE_DELETED)
        r = load_side(upper_fd, ch->path, max, &now);
    if (r >= 0) {
        *ret_binary = (was.present && was.binary) || (now.present && now.binary);
        if (was.present && now.present && was.type == now.type) {
            /* A symlink's own mode means nothing on Linux; a dir's is not a diff line. */
            if (was.type != 'l' && was.type != 'd' && was.mode != now.mode)
                conch_sb_printf(out, "old mode %o\nnew mode %o\n", (unsigned)was.mode,
                                (unsigned)now.mode);
            if (has_text(&was))
                r = content_diff(out, qa, qb, &was, &now, max);
            add_section(all, qa, qb, "", out, 0);
        } else {
            /* Added, deleted or of another type: git shows a deletion then an addition. */
            if (has_text(&was)) {
                r = content_diff(out, qa, qb, &was, NULL, max);
                snprintf(ext, sizeof(ext), "deleted file mode %o\n", (unsigned)was.mode);
                add_section(all, qa, qb, ext, out, 0);
            }
            size_t from = out->len;
            if (r >= 0 && has_text(&now)) {
                r = content_diff(out, qa, qb, NULL, &now, max);
                snprintf(ext, sizeof(ext), "new file mode %o\n", (unsigned)now.mode);
                add_section(all, qa, qb, ext, out, from);
            }
        }
    }
    side_done(&was);
    side_done(&now);
    if (r >= 0 && (out->oom || all->oom))
        r = -ENOMEM;
    return r;
}

int conch_ws_diff(int upper_fd, int lower_fd, const struct conch_ws_changes *changes,
                  char *const *paths, size_t max_bytes_per_file, size_t max_total, json_t **ret,
                  struct conch_err *err)
{
    static const struct conch_ws_changes none = {0};
    struct conch_ws_changes sel = {0};
    const struct conch_ws_changes *use = changes ? changes : &none;
    if (paths) {
        int r = conch_ws_changes_select(changes, paths, &sel, err);
        if (r < 0)
            return r;
        use = &sel;
    }
    if (max_total == 0)
        max_total = CONCH_WS_DIFF_MAX_TOTAL;
    /* No single file may be read beyond what the whole answer may hold. */
    size_t max =
        max_bytes_per_file && max_bytes_per_file < max_total ? max_bytes_per_file : max_total;

    int r = 0;
    struct conch_sb all = {0};
    size_t used = 0, omitted = 0; /* bytes of diff text held (whole + per file) */
    json_t *files = json_array();
    if (!files)
        r = conch_err_set(err, ENOMEM, "diff: out of memory");
    for (size_t i = 0; r >= 0 && i < use->n; i++) {
        const struct conch_ws_change *ch = &use->items[i];
        if (!ch->path || !conch_ws__path_ok(ch->path)) {
            _cleanup_free_ char *q = ch->path ? conch_ws__qname(ch->path) : NULL;
            r = conch_err_set(err, EINVAL, "diff %s: invalid path", q ? q : "(null)");
            break;
        }
        struct conch_sb one = {0}, p = {0};
        bool binary = ch->binary;
        buf_utf8(&p, ch->path, strlen(ch->path));
        size_t all_before = all.len;
        if (ch->flags & CONCH_WS_F_RULE_HIDDEN) {
            /* Beneath a hidden path (path rules): neither side is read. Its old side is the
             * host's file that the sandbox may not see (a change there came from a restored
             * or planted layer: the sandbox cannot write there), and the diff reaches the
             * sandbox's agent (conch mcp's diff tool). */
            binary = false;
            conch_sb_printf(&one, "[content not shown: a hidden path (path rule)]\n");
        } else if (!omitted) {
            r = p.oom ? -ENOMEM : file_diff(upper_fd, lower_fd, ch, max, &one, &all, &binary);
            if (r < 0) {
                free(one.buf);
                free(p.buf);
                _cleanup_free_ char *q = conch_ws__qname(ch->path);
                r = conch_err_set(err, -r, "diff %s: %s", q ? q : "",
                                  r == -ELOOP ? "a component is a symlink" : strerror(-r));
                break;
            }
            /* Past the total cap this file and every later one are listed as omitted, so
             * the answer (and the memory behind it) stays within the cap. */
            size_t add = one.len + (all.len - all_before);
            if (used + add > max_total) {
                omitted = 1;
                one.len = 0;
                all.len = all_before;
                if (all.buf)
                    all.buf[all.len] = '\0';
            } else {
                used += add;
            }
        } else {
            omitted++;
        }
        json_t *f = p.oom || one.oom
                        ? NULL
                        : json_pack("{s:s%,s:s,s:b,s:s%}", "path", p.buf, p.len, "kind",
                                    conch_ws_change_kind_name(ch->kind), "binary", binary, "diff",
                                    one.buf ? one.buf : "", one.len);
        if (f && omitted)
            json_object_set_new(f, "omitted", json_true());
        free(p.buf);
        free(one.buf);
        if (!f || json_array_append_new(files, f) < 0 || all.oom)
            r = conch_err_set(err, ENOMEM, "diff: out of memory");
    }
    json_t *obj = NULL;
    if (r >= 0) {
        obj = json_pack("{s:s%,s:o,s:I}", "diff", all.buf ? all.buf : "", all.len, "files", files,
                        "omitted", (json_int_t)omitted);
        files = NULL; /* "o" steals it, even on failure */
        if (!obj)
            r = conch_err_set(err, ENOMEM, "diff: out of memory");
    }
    json_decref(files);
    free(all.buf);
    conch_ws_changes_done(&sel);
    if (r < 0)
        return r;
    *ret = obj;
    return 0;
}
