/* changes.c - what a command changed in its workspace: walks the overlay's upper dir and
 * compares each entry with the host (lower) dir, decoding whiteouts and opaque dirs. Also
 * the module's small name tables. */
#include "workspace/workspace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "workspace/ws-internal.h"

#define CMP_CHUNK (64 * 1024)
/* The longest change path: what openat2 and every path-based step after the scan take. */
#define MAX_PATH_LEN (PATH_MAX - 1)

const char *conch_ws_change_kind_name(enum conch_change_kind kind)
{
    switch (kind) {
    case CONCH_CHANGE_ADDED:
        return "added";
    case CONCH_CHANGE_MODIFIED:
        return "modified";
    case CONCH_CHANGE_DELETED:
        return "deleted";
    case CONCH_CHANGE_TYPE:
        return "type_changed";
    }
    return "unknown";
}

void conch_ws_changes_done(struct conch_ws_changes *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++)
        free(c->items[i].path);
    free(c->items);
    c->items = NULL;
    c->n = 0;
    c->total = 0;
}

struct scan {
    int upper_fd, lower_fd;
    struct conch_ws_changes out;
    size_t cap;
    size_t keep;         /* keep at most this many (the smallest paths); 0: all */
    char *buf_a, *buf_b; /* CMP_CHUNK each, for content comparison */
    struct conch_err *err;
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool names_has(const struct conch_names *ns, const char *name)
{
    return ns->n && bsearch(&name, ns->v, ns->n, sizeof(*ns->v), cmp_str);
}

/* Reads the names in @dfd (borrowed) into @ret, sorted so that opaque dirs can look names
 * up. */
static int read_names(int dfd, struct conch_names *ret)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    return conch_names_read(fd, ret);
}

static char *join(const char *dir, const char *name)
{
    char *p = NULL;
    if (asprintf(&p, "%s%s%s", dir, *dir ? "/" : "", name) < 0)
        return NULL;
    return p;
}

static int path_cmp(const struct conch_ws_change *a, const struct conch_ws_change *b)
{
    return strcmp(a->path, b->path);
}

/* With s->keep, out.items is a max-heap by path of the s->keep smallest paths so far. */
static void heap_up(struct conch_ws_change *v, size_t i)
{
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (path_cmp(&v[up], &v[i]) >= 0)
            break;
        struct conch_ws_change t = v[up];
        v[up] = v[i];
        v[i] = t;
        i = up;
    }
}

static void heap_down(struct conch_ws_change *v, size_t n, size_t i)
{
    for (;;) {
        size_t big = i, l = 2 * i + 1, r = l + 1;
        if (l < n && path_cmp(&v[l], &v[big]) > 0)
            big = l;
        if (r < n && path_cmp(&v[r], &v[big]) > 0)
            big = r;
        if (big == i)
            return;
        struct conch_ws_change t = v[big];
        v[big] = v[i];
        v[i] = t;
        i = big;
    }
}

/* Appends @c to the result, or counts it only when a page is full and its path sorts after
 * every kept one; takes ownership of c->path even on failure. */
static int emit(struct scan *s, struct conch_ws_change c)
{
    s->out.total++;
    if (s->keep && s->out.n == s->keep) {
        if (path_cmp(&c, &s->out.items[0]) >= 0) {
            free(c.path);
            return 0;
        }
        free(s->out.items[0].path);
        s->out.items[0] = c;
        heap_down(s->out.items, s->out.n, 0);
        return 0;
    }
    if (s->out.n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 32;
        if (s->keep && ncap > s->keep)
            ncap = s->keep;
        struct conch_ws_change *v = realloc(s->out.items, ncap * sizeof(*v));
        if (!v) {
            free(c.path);
            return conch_err_set(s->err, ENOMEM, "scan workspace: out of memory");
        }
        s->out.items = v;
        s->cap = ncap;
    }
    s->out.items[s->out.n++] = c;
    if (s->keep)
        heap_up(s->out.items, s->out.n - 1);
    return 0;
}

static int fail(struct scan *s, int rc, const char *path, const char *what)
{
    _cleanup_free_ char *q = conch_ws__qname(*path ? path : ".");
    return conch_err_set(s->err, -rc, "scan workspace: %s %s: %s", what, q ? q : "(path)",
                         strerror(-rc));
}

/* Whether symlink @target, placed at change path @path, leaves the workspace: absolute, or
 * climbing above the root with "..". Lexical: a component that is itself a symlink is not
 * looked at (the commit never follows one either). */
static bool link_outside(const char *path, const char *target)
{
    if (target[0] == '/')
        return true;
    long depth = 0;
    for (const char *p = path; (p = strchr(p, '/')); p++)
        depth++;
    for (const char *p = target; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            if (--depth < 0)
                return true;
        } else if (n > 0 && !(n == 1 && p[0] == '.')) {
            depth++;
        }
        p += n;
        while (*p == '/')
            p++;
    }
    return false;
}

/* The flags a new entry of mode @mode brings. */
static unsigned type_flags(mode_t mode)
{
    if (S_ISFIFO(mode))
        return CONCH_WS_F_FIFO;
    if (S_ISSOCK(mode))
        return CONCH_WS_F_SOCKET;
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return CONCH_WS_F_DEVICE;
    return 0;
}

static ssize_t read_full(int fd, char *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        got += (size_t)n;
    }
    return (ssize_t)got;
}

/* Opens a regular file for reading without following a symlink or blocking on a FIFO
 * that replaced it since we looked. */
static int open_reg(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int r = fstat(fd, &st) < 0 ? -errno : 0;
    if (r == 0 && !S_ISREG(st.st_mode))
        r = -EAGAIN; /* replaced under us: let the caller report it, not hang */
    if (r < 0) {
        close(fd);
        return r;
    }
    return fd;
}

/* 1 if @name in @dfd holds a NUL in its first CONCH_WS__BINARY_PROBE bytes. */
static int looks_binary(struct scan *s, int dfd, const char *name)
{
    _cleanup_close_ int fd = open_reg(dfd, name);
    if (fd < 0)
        return fd;
    ssize_t n = read_full(fd, s->buf_a, CONCH_WS__BINARY_PROBE);
    if (n < 0)
        return (int)n;
    return memchr(s->buf_a, 0, (size_t)n) != NULL;
}

/* 1 if the two regular files differ in content, 0 if identical. */
static int contents_differ(struct scan *s, int ufd, int lfd, const char *name)
{
    _cleanup_close_ int a = open_reg(ufd, name);
    if (a < 0)
        return a;
    _cleanup_close_ int b = open_reg(lfd, name);
    if (b < 0)
        return b;
    for (;;) {
        ssize_t na = read_full(a, s->buf_a, CMP_CHUNK);
        if (na < 0)
            return (int)na;
        ssize_t nb = read_full(b, s->buf_b, CMP_CHUNK);
        if (nb < 0)
            return (int)nb;
        if (na != nb || memcmp(s->buf_a, s->buf_b, (size_t)na) != 0)
            return 1;
        if (na < CMP_CHUNK)
            return 0;
    }
}

static bool fd_xattr_is_y(int fd, const char *key)
{
    char v[4];
    ssize_t n = fgetxattr(fd, key, v, sizeof(v));
    return n == 1 && v[0] == 'y';
}

/* With `userxattr` overlayfs uses the user.overlay.* namespace, otherwise trusted.*.
 * Only "y" means opaque: since Linux 6.7 "x" marks a dir holding xattr whiteouts. */
static bool dir_is_opaque(int dfd)
{
    return fd_xattr_is_y(dfd, "user.overlay.opaque") ||
           fd_xattr_is_y(dfd, "trusted.overlay.opaque");
}

/* Whiteouts are 0/0 character devices, or (on layers that can't hold devices) empty
 * regular files carrying an overlay.whiteout xattr of any value. */
static int is_whiteout(int dfd, const char *name, const struct stat *st)
{
    if (S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0))
        return 1;
    if (!S_ISREG(st->st_mode) || st->st_size != 0)
        return 0;
    /* An O_PATH fd needs no read permission; its /proc link reaches the inode itself. */
    _cleanup_close_ int fd = openat(dfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    return getxattr(proc, "user.overlay.whiteout", NULL, 0) >= 0 ||
           getxattr(proc, "trusted.overlay.whiteout", NULL, 0) >= 0;
}

/* Fills the "new" side of @c from the upper entry @name / @st; @path is its change path. */
static int describe_new(struct scan *s, int ufd, const char *path, const char *name,
                        const struct stat *st, struct conch_ws_change *c)
{
    c->type = conch_ws__type(st->st_mode);
    c->new_mode = st->st_mode & 07777;
    c->flags |= type_flags(st->st_mode);
    if (c->type == 'l') {
        _cleanup_free_ char *target = NULL;
        int r = conch_ws__read_link(ufd, name, &target);
        if (r < 0)
            return r;
        if (link_outside(path, target))
            c->flags |= CONCH_WS_F_LINK_OUTSIDE;
    }
    if (c->type == 'f') {
        c->size = (uint64_t)st->st_size;
        int r = looks_binary(s, ufd, name);
        if (r < 0)
            return r;
        c->binary = r;
    }
    return 0;
}

/* A subdir to descend into once the current dir's fds are closed. */
struct sub {
    char *name;
    bool lower_dir;    /* the lower has a dir at this path too */
    bool opaque_above; /* this dir or an ancestor is opaque */
};

/* Compares upper entry @name (@ust) with the lower (@lst, or none if !@have_l) and emits
 * the change, if any. Sets *@descend when the upper entry is a dir to walk. @stop: the flag
 * of a dir whose entries cannot be listed (TOO_DEEP, UNREADABLE; reported even when
 * unchanged itself), or 0. */
static int compare_entry(struct scan *s, int ufd, int lfd, const char *path, const char *name,
                         const struct stat *ust, bool have_l, const struct stat *lst, unsigned stop,
                         struct sub *descend)
{
    bool too_deep = stop != 0;
    struct conch_ws_change c = {.flags = stop};
    int r = 0;
    _cleanup_free_ char *full = join(path, name);
    if (!full)
        return conch_err_set(s->err, ENOMEM, "scan workspace: out of memory");

    if (S_ISDIR(ust->st_mode))
        descend->lower_dir = have_l && S_ISDIR(lst->st_mode);

    if (!have_l || (ust->st_mode & S_IFMT) != (lst->st_mode & S_IFMT)) {
        c.kind = have_l ? CONCH_CHANGE_TYPE : CONCH_CHANGE_ADDED;
        c.old_mode = have_l ? lst->st_mode & 07777 : 0;
        r = describe_new(s, ufd, full, name, ust, &c);
        if (r < 0)
            return fail(s, r, full, "read");
        c.content_changed = have_l;
        c.mode_changed = have_l && c.old_mode != c.new_mode;
    } else {
        c.kind = CONCH_CHANGE_MODIFIED;
        c.type = conch_ws__type(ust->st_mode);
        c.old_mode = lst->st_mode & 07777;
        c.new_mode = ust->st_mode & 07777;
        switch (c.type) {
        case 'f':
            c.size = (uint64_t)ust->st_size;
            if (ust->st_size != lst->st_size) {
                c.content_changed = true;
            } else {
                r = contents_differ(s, ufd, lfd, name);
                if (r < 0)
                    return fail(s, r, full, "compare");
                c.content_changed = r;
            }
            c.mode_changed = c.old_mode != c.new_mode;
            if (c.content_changed || c.mode_changed) {
                r = looks_binary(s, ufd, name);
                if (r < 0)
                    return fail(s, r, full, "read");
                c.binary = r;
            }
            break;
        case 'l': {
            /* A symlink's own mode is meaningless on Linux; only the target counts. */
            _cleanup_free_ char *ut = NULL;
            _cleanup_free_ char *lt = NULL;
            r = conch_ws__read_link(ufd, name, &ut);
            if (r >= 0)
                r = conch_ws__read_link(lfd, name, &lt);
            if (r < 0)
                return fail(s, r, full, "readlink");
            c.content_changed = strcmp(ut, lt) != 0;
            if (link_outside(full, ut))
                c.flags |= CONCH_WS_F_LINK_OUTSIDE;
            break;
        }
        case 'd':
            c.mode_changed = c.old_mode != c.new_mode;
            break;
        default:
            c.content_changed =
                (S_ISCHR(ust->st_mode) || S_ISBLK(ust->st_mode)) && ust->st_rdev != lst->st_rdev;
            c.mode_changed = c.old_mode != c.new_mode;
            c.flags |= type_flags(ust->st_mode);
            break;
        }
        if (!c.content_changed && !c.mode_changed && !too_deep)
            return 0;
    }
    c.path = TAKE_PTR(full);
    return emit(s, c);
}

/* Whether the entries of dir @name in @ufd (at change path length @len) would have paths
 * longer than MAX_PATH_LEN: then the scan reports the dir and stops there. Only dirs near
 * the limit are opened to look at their names. */
static int entries_too_deep(int ufd, const char *name, size_t len, bool *ret)
{
    *ret = false;
    if (len + 1 + NAME_MAX <= MAX_PATH_LEN)
        return 0;
    if (len + 2 > MAX_PATH_LEN) {
        *ret = true;
        return 0;
    }
    int fd = openat(ufd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct conch_names ns = {0};
    int r = conch_names_read(fd, &ns);
    if (r < 0)
        return r;
    for (size_t i = 0; i < ns.n && !*ret; i++)
        *ret = len + 1 + strlen(ns.v[i]) > MAX_PATH_LEN;
    conch_names_done(&ns);
    return 0;
}

static int emit_deleted(struct scan *s, const char *path, const char *name, const struct stat *lst)
{
    struct conch_ws_change c = {
        .kind = CONCH_CHANGE_DELETED,
        .type = conch_ws__type(lst->st_mode),
        .old_mode = lst->st_mode & 07777,
    };
    c.path = join(path, name);
    if (!c.path)
        return conch_err_set(s->err, ENOMEM, "scan workspace: out of memory");
    return emit(s, c);
}

static void subs_done(struct sub *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

/*
 * Scans the upper dir at @path. @lower_dir: the lower has a dir at @path whose entries
 * the upper's are compared with. @opaque_above: an ancestor is opaque, so overlayfs never
 * merged the lower below it and this dir is effectively opaque too. Fds are closed before
 * descending, so the walk holds a bounded number of fds whatever the depth (the depth
 * itself is bounded by PATH_MAX through openat2).
 */
static int scan_dir(struct scan *s, const char *path, bool lower_dir, bool opaque_above)
{
    struct sub *subs = NULL;
    size_t nsubs = 0;
    int r = 0;

    {
        _cleanup_close_ int ufd =
            conch_open_beneath(s->upper_fd, path, O_RDONLY | O_DIRECTORY, 0, 0);
        if (ufd < 0)
            return fail(s, ufd, path, "open upper dir");
        bool opaque = opaque_above || dir_is_opaque(ufd);
        _cleanup_close_ int lfd = -1;
        if (lower_dir) {
            lfd = conch_open_beneath(s->lower_fd, path, O_RDONLY | O_DIRECTORY, 0, 0);
            if (lfd < 0)
                return fail(s, lfd, path, "open host dir");
        }
        struct conch_names un = {0};
        r = read_names(ufd, &un);
        if (r < 0)
            return fail(s, r, path, "read upper dir");
        subs = calloc(un.n ? un.n : 1, sizeof(*subs));
        if (!subs) {
            conch_names_done(&un);
            return conch_err_set(s->err, ENOMEM, "scan workspace: out of memory");
        }

        for (size_t i = 0; i < un.n && r >= 0; i++) {
            const char *name = un.v[i];
            struct stat ust, lst;
            if (fstatat(ufd, name, &ust, AT_SYMLINK_NOFOLLOW) < 0) {
                r = fail(s, -errno, path, "stat upper entry in");
                break;
            }
            bool have_l = false;
            if (lfd >= 0) {
                if (fstatat(lfd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0) {
                    have_l = true;
                } else if (errno != ENOENT) {
                    r = fail(s, -errno, path, "stat host entry in");
                    break;
                }
            }
            r = is_whiteout(ufd, name, &ust);
            if (r < 0) {
                r = fail(s, r, path, "read upper entry in");
                break;
            }
            if (r == 1) {
                /* A whiteout over nothing (the lower changed, or an opaque dir's leftover)
                 * deletes nothing. A deleted dir is reported once, not per entry. */
                r = have_l ? emit_deleted(s, path, name, &lst) : 0;
                continue;
            }
            struct sub d = {0};
            unsigned stop = 0; /* why the walk does not descend into this dir */
            if (S_ISDIR(ust.st_mode)) {
                /* A command may chmod 000 its dirs; an unprivileged caller cannot then read
                 * them, which must not make the whole scan (and the result) fail. */
                if (faccessat(ufd, name, R_OK | X_OK, AT_EACCESS | AT_SYMLINK_NOFOLLOW) < 0) {
                    stop = CONCH_WS_F_UNREADABLE;
                } else {
                    bool deep = false;
                    size_t len = strlen(path) + (*path ? 1 : 0) + strlen(name);
                    r = entries_too_deep(ufd, name, len, &deep);
                    if (r < 0) {
                        r = fail(s, r, path, "read upper dir beneath");
                        break;
                    }
                    stop = deep ? CONCH_WS_F_TOO_DEEP : 0;
                }
            }
            r = compare_entry(s, ufd, lfd, path, name, &ust, have_l, &lst, stop, &d);
            if (r >= 0 && S_ISDIR(ust.st_mode) && !stop) {
                d.opaque_above = opaque;
                d.name = strdup(name);
                if (!d.name)
                    r = conch_err_set(s->err, ENOMEM, "scan workspace: out of memory");
                else
                    subs[nsubs++] = d;
            }
        }

        /* What an opaque dir hides is deleted; report each hidden top entry once. */
        if (r >= 0 && opaque && lfd >= 0) {
            struct conch_names ln = {0};
            r = read_names(lfd, &ln);
            if (r < 0)
                r = fail(s, r, path, "read host dir");
            for (size_t i = 0; r >= 0 && i < ln.n; i++) {
                /* A name the host holds past PATH_MAX cannot be a change path: the host
                 * had it before, and no path-based step could act on it. */
                if (names_has(&un, ln.v[i]) || strlen(path) + 1 + strlen(ln.v[i]) > MAX_PATH_LEN)
                    continue;
                struct stat lst;
                if (fstatat(lfd, ln.v[i], &lst, AT_SYMLINK_NOFOLLOW) < 0) {
                    if (errno == ENOENT)
                        continue;
                    r = fail(s, -errno, path, "stat host entry in");
                    break;
                }
                r = emit_deleted(s, path, ln.v[i], &lst);
            }
            conch_names_done(&ln);
        }
        conch_names_done(&un);
    }

    for (size_t i = 0; r >= 0 && i < nsubs; i++) {
        _cleanup_free_ char *child = join(path, subs[i].name);
        if (!child) {
            r = conch_err_set(s->err, ENOMEM, "scan workspace: out of memory");
            break;
        }
        r = scan_dir(s, child, subs[i].lower_dir, subs[i].opaque_above);
    }
    subs_done(subs, nsubs);
    return r;
}

static int cmp_change(const void *a, const void *b)
{
    return strcmp(((const struct conch_ws_change *)a)->path,
                  ((const struct conch_ws_change *)b)->path);
}

int conch_ws_changes_scan_page(int upper_fd, int lower_fd, size_t offset, size_t limit,
                               struct conch_ws_changes *ret, struct conch_err *err)
{
    struct scan s = {
        .upper_fd = upper_fd,
        .lower_fd = lower_fd,
        .err = err,
    };
    if (limit) {
        s.keep = offset + limit;
        if (s.keep < offset)
            s.keep = 0; /* overflow: no bound */
    }
    s.buf_a = malloc(CMP_CHUNK);
    s.buf_b = malloc(CMP_CHUNK);
    int r = 0;
    if (!s.buf_a || !s.buf_b)
        r = conch_err_set(err, ENOMEM, "scan workspace: out of memory");
    if (r >= 0)
        r = scan_dir(&s, "", true, false);
    free(s.buf_a);
    free(s.buf_b);
    if (r < 0) {
        conch_ws_changes_done(&s.out);
        return r;
    }
    if (s.out.n)
        qsort(s.out.items, s.out.n, sizeof(*s.out.items), cmp_change);
    if (offset) {
        size_t drop = offset < s.out.n ? offset : s.out.n;
        for (size_t i = 0; i < drop; i++)
            free(s.out.items[i].path);
        memmove(s.out.items, s.out.items + drop, (s.out.n - drop) * sizeof(*s.out.items));
        s.out.n -= drop;
    }
    *ret = s.out;
    return 0;
}

int conch_ws_changes_scan(int upper_fd, int lower_fd, struct conch_ws_changes *ret,
                          struct conch_err *err)
{
    return conch_ws_changes_scan_page(upper_fd, lower_fd, 0, 0, ret, err);
}
