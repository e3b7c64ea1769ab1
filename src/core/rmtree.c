/* rmtree.c - removing a directory tree by file descriptors alone: the one recursive removal
 * of conch (a workspace's upper dir on discard, a committed deletion on the host, a
 * sandbox's state dir, fs.delete inside the sandbox), and reading a directory's names. No path
 * is ever built, so a chain deeper than PATH_MAX goes like any other, and only two fds are
 * open at a time. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"

static int names_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void conch_names_done(struct conch_names *ns)
{
    for (size_t i = 0; i < ns->n; i++)
        free(ns->v[i]);
    free(ns->v);
    ns->v = NULL;
    ns->n = 0;
}

int conch_names_read(int fd, struct conch_names *ret)
{
    _cleanup_closedir_ DIR *d = fdopendir(fd);
    if (!d) {
        int r = -errno;
        close(fd);
        return r;
    }
    struct conch_names ns = {0};
    size_t cap = 0;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (!de) {
            if (errno) {
                int r = -errno;
                conch_names_done(&ns);
                return r;
            }
            break;
        }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (ns.n == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            char **v = realloc(ns.v, ncap * sizeof(*v));
            if (!v) {
                conch_names_done(&ns);
                return -ENOMEM;
            }
            ns.v = v;
            cap = ncap;
        }
        ns.v[ns.n] = strdup(de->d_name);
        if (!ns.v[ns.n]) {
            conch_names_done(&ns);
            return -ENOMEM;
        }
        ns.n++;
    }
    if (ns.n)
        qsort(ns.v, ns.n, sizeof(*ns.v), names_cmp);
    *ret = ns;
    return 0;
}

/* One directory on the way down: the subdirs still to remove, and its identity, checked
 * when we climb back to it through "..". */
struct frame {
    struct conch_names subs;
    size_t next;
    dev_t dev;
    ino_t ino;
};

/* One removal in progress: the stack of dirs on the way down, and its first failure. */
struct rm_run {
    struct frame *v;
    size_t n, cap;
    int first;
    char *failed; /* the first failure's path, relative to the top dir (NULL: not wanted) */
    bool want_failed;
};

/* Keep the first failure @r, on entry @name of the dir at the top of the stack (@depth
 * frames deep: the new level being read is not pushed yet). */
static void note(struct rm_run *x, int r, size_t depth, const char *name)
{
    if (r >= 0 || x->first != 0)
        return;
    x->first = r;
    if (!x->want_failed)
        return;
    size_t len = strlen(name) + 1;
    for (size_t k = 0; k < depth; k++)
        len += strlen(x->v[k].subs.v[x->v[k].next - 1]) + 1;
    char *p = malloc(len);
    if (!p)
        return;
    p[0] = '\0';
    for (size_t k = 0; k < depth; k++) {
        strcat(p, x->v[k].subs.v[x->v[k].next - 1]);
        strcat(p, "/");
    }
    strcat(p, name);
    x->failed = p;
}

/* Unlinks every non-directory in @fd (borrowed; O_PATH will do), which is @depth levels
 * below the top, and lists its subdirs. */
static int clear_level(struct rm_run *x, int fd, size_t depth, struct conch_names *ret_subs)
{
    int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    struct conch_names all = {0};
    int r = conch_names_read(dfd, &all);
    if (r < 0)
        return r;
    struct conch_names subs = {.v = calloc(all.n ? all.n : 1, sizeof(char *))};
    if (!subs.v) {
        conch_names_done(&all);
        return -ENOMEM;
    }
    for (size_t i = 0; i < all.n; i++) {
        struct stat st;
        if (fstatat(fd, all.v[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
            if (errno != ENOENT)
                note(x, -errno, depth, all.v[i]);
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            subs.v[subs.n++] = all.v[i];
            all.v[i] = NULL;
        } else if (unlinkat(fd, all.v[i], 0) < 0 && errno != ENOENT) {
            note(x, -errno, depth, all.v[i]);
        }
    }
    conch_names_done(&all);
    *ret_subs = subs;
    return 0;
}

static int push(struct rm_run *x, int fd)
{
    if (x->n == x->cap) {
        size_t ncap = x->cap ? x->cap * 2 : 16;
        struct frame *nv = realloc(x->v, ncap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        x->v = nv;
        x->cap = ncap;
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    struct frame f = {.dev = st.st_dev, .ino = st.st_ino};
    int r = clear_level(x, fd, x->n, &f.subs);
    if (r < 0)
        return r;
    x->v[x->n++] = f;
    return 0;
}

/* A dir may have been left unreadable or read-only by a sandbox; unless told not to (a
 * removal on a user's behalf, as rm -r does), it goes anyway. AT_SYMLINK_NOFOLLOW: glibc
 * then never follows a symlink swapped in. Best effort: opening or emptying it reports the
 * real failure. */
static void make_removable(int dfd, const char *name, const struct stat *st, unsigned flags)
{
    if (!(flags & CONCH_RM_KEEP_MODES) && (st->st_mode & 0700) != 0700 &&
        fchmodat(dfd, name, (st->st_mode & 07777) | 0700, AT_SYMLINK_NOFOLLOW) < 0) {
        /* see above */
    }
}

static int rm_contents(struct rm_run *x, int fd, unsigned flags)
{
    bool no_xdev = flags & CONCH_RM_ONE_FS;
    int cur = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (cur < 0)
        return -errno;
    int r = push(x, cur);
    dev_t root_dev = x->n ? x->v[0].dev : 0;
    while (r >= 0 && x->n > 0) {
        size_t n = x->n;
        struct frame *top = &x->v[n - 1];
        if (top->next < top->subs.n) {
            const char *name = top->subs.v[top->next++];
            if (unlinkat(cur, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
                continue;
            struct stat st;
            if (fstatat(cur, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (errno != ENOENT)
                    note(x, -errno, n - 1, name);
                continue;
            }
            if (!S_ISDIR(st.st_mode)) {
                if (unlinkat(cur, name, 0) < 0 && errno != ENOENT)
                    note(x, -errno, n - 1, name);
                continue;
            }
            if (no_xdev && st.st_dev != root_dev) {
                note(x, -EXDEV, n - 1, name);
                continue;
            }
            make_removable(cur, name, &st, flags);
            int next = openat(cur, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (next < 0) {
                note(x, errno == ENOTDIR ? -ESTALE : -errno, n - 1, name);
                continue;
            }
            r = push(x, next);
            close(cur);
            cur = next;
            continue;
        }
        if (n == 1) {
            conch_names_done(&top->subs);
            x->n--;
            break;
        }
        /* Climb back by "..", and make sure it is the dir we came from: a tree renamed
         * under us would otherwise have us remove entries elsewhere. */
        int up = openat(cur, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct stat st;
        if (up < 0 || fstat(up, &st) < 0) {
            r = -errno;
        } else if (st.st_dev != x->v[n - 2].dev || st.st_ino != x->v[n - 2].ino) {
            r = -ESTALE;
        }
        close(cur);
        cur = up;
        conch_names_done(&top->subs);
        x->n--;
        if (r < 0)
            break;
        struct frame *parent = &x->v[x->n - 1];
        const char *child = parent->subs.v[parent->next - 1];
        if (unlinkat(cur, child, AT_REMOVEDIR) < 0 && errno != ENOENT) {
            /* named as a dir of @parent's level: undo the "descended into it" index */
            note(x, -errno, x->n - 1, child);
        }
    }
    for (size_t i = 0; i < x->n; i++)
        conch_names_done(&x->v[i].subs);
    free(x->v);
    x->v = NULL;
    x->n = x->cap = 0;
    if (cur >= 0)
        close(cur);
    return r < 0 ? r : x->first;
}

int conch_rm_contents(int fd, unsigned flags)
{
    struct rm_run x = {0};
    return rm_contents(&x, fd, flags);
}

int conch_rm_at_named(int dfd, const char *name, unsigned flags, char **ret_failed)
{
    bool no_xdev = flags & CONCH_RM_ONE_FS;
    if (ret_failed)
        *ret_failed = NULL;
    struct rm_run x = {.want_failed = ret_failed != NULL};
    struct stat st;
    int r = 0;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        r = errno == ENOENT ? 0 : -errno;
    } else if (!S_ISDIR(st.st_mode)) {
        r = unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    } else {
        struct stat parent;
        if (no_xdev && (fstat(dfd, &parent) < 0 || parent.st_dev != st.st_dev)) {
            r = fstat(dfd, &parent) < 0 ? -errno : -EXDEV;
        } else {
            make_removable(dfd, name, &st, flags);
            int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) {
                r = errno == ENOENT ? 0 : -errno;
            } else {
                r = rm_contents(&x, fd, flags);
                close(fd);
                if (r == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                    r = -errno;
            }
        }
    }
    if (r < 0 && ret_failed) {
        /* the entry that failed, below @name, or @name itself */
        if (x.failed && asprintf(ret_failed, "%s/%s", name, x.failed) < 0)
            *ret_failed = NULL;
        else if (!x.failed)
            *ret_failed = strdup(name);
    }
    free(x.failed);
    return r;
}

int conch_rm_at(int dfd, const char *name, unsigned flags)
{
    return conch_rm_at_named(dfd, name, flags, NULL);
}

int conch_rm_path(const char *path, unsigned flags)
{
    _cleanup_free_ char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') /* "dir/" is "dir" */
        p[--n] = '\0';
    char *slash = strrchr(p, '/');
    const char *name = slash ? slash + 1 : p;
    if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
        return -EINVAL; /* "/", "x/.", "..": no entry of a parent to remove */
    const char *parent = ".";
    if (slash) {
        *slash = '\0';
        parent = slash == p ? "/" : p;
    }
    _cleanup_close_ int dfd = open(parent, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? 0 : -errno;
    return conch_rm_at(dfd, name, flags);
}
