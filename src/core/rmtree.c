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

static void keep_first(int *first, int r)
{
    if (r < 0 && *first == 0)
        *first = r;
}

/* Unlinks every non-directory in @fd (borrowed; O_PATH will do) and lists its subdirs. */
static int clear_level(int fd, struct conch_names *ret_subs, int *first)
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
                keep_first(first, -errno);
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            subs.v[subs.n++] = all.v[i];
            all.v[i] = NULL;
        } else if (unlinkat(fd, all.v[i], 0) < 0 && errno != ENOENT) {
            keep_first(first, -errno);
        }
    }
    conch_names_done(&all);
    *ret_subs = subs;
    return 0;
}

static int push(struct frame **v, size_t *n, size_t *cap, int fd, int *first)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 16;
        struct frame *nv = realloc(*v, ncap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        *v = nv;
        *cap = ncap;
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    struct frame f = {.dev = st.st_dev, .ino = st.st_ino};
    int r = clear_level(fd, &f.subs, first);
    if (r < 0)
        return r;
    (*v)[(*n)++] = f;
    return 0;
}

int conch_rm_contents(int fd, unsigned flags)
{
    bool no_xdev = flags & CONCH_RM_ONE_FS;
    struct frame *v = NULL;
    size_t n = 0, cap = 0;
    int first = 0;
    int cur = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (cur < 0)
        return -errno;
    int r = push(&v, &n, &cap, cur, &first);
    dev_t root_dev = n ? v[0].dev : 0;
    while (r >= 0 && n > 0) {
        struct frame *top = &v[n - 1];
        if (top->next < top->subs.n) {
            const char *name = top->subs.v[top->next++];
            if (unlinkat(cur, name, AT_REMOVEDIR) == 0 || errno == ENOENT)
                continue;
            struct stat st;
            if (fstatat(cur, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (errno != ENOENT)
                    keep_first(&first, -errno);
                continue;
            }
            if (!S_ISDIR(st.st_mode)) {
                if (unlinkat(cur, name, 0) < 0 && errno != ENOENT)
                    keep_first(&first, -errno);
                continue;
            }
            if (no_xdev && st.st_dev != root_dev) {
                keep_first(&first, -EXDEV);
                continue;
            }
            /* The sandbox may have left a dir unreadable or read-only; it goes anyway.
             * AT_SYMLINK_NOFOLLOW: glibc then never follows a symlink swapped in. */
            if ((st.st_mode & 0700) != 0700 &&
                fchmodat(cur, name, (st.st_mode & 07777) | 0700, AT_SYMLINK_NOFOLLOW) < 0) {
                /* best effort: opening or emptying it reports the real failure */
            }
            int next = openat(cur, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (next < 0) {
                keep_first(&first, errno == ENOTDIR ? -ESTALE : -errno);
                continue;
            }
            r = push(&v, &n, &cap, next, &first);
            close(cur);
            cur = next;
            continue;
        }
        if (n == 1) {
            conch_names_done(&top->subs);
            n--;
            break;
        }
        /* Climb back by "..", and make sure it is the dir we came from: a tree renamed
         * under us would otherwise have us remove entries elsewhere. */
        int up = openat(cur, "..", O_PATH | O_DIRECTORY | O_CLOEXEC);
        struct stat st;
        if (up < 0 || fstat(up, &st) < 0) {
            r = -errno;
        } else if (st.st_dev != v[n - 2].dev || st.st_ino != v[n - 2].ino) {
            r = -ESTALE;
        }
        close(cur);
        cur = up;
        conch_names_done(&top->subs);
        n--;
        if (r < 0)
            break;
        const char *child = v[n - 1].subs.v[v[n - 1].next - 1];
        if (unlinkat(cur, child, AT_REMOVEDIR) < 0 && errno != ENOENT)
            keep_first(&first, -errno);
    }
    for (size_t i = 0; i < n; i++)
        conch_names_done(&v[i].subs);
    free(v);
    if (cur >= 0)
        close(cur);
    return r < 0 ? r : first;
}

int conch_rm_at(int dfd, const char *name, unsigned flags)
{
    bool no_xdev = flags & CONCH_RM_ONE_FS;
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    if (no_xdev) {
        struct stat parent;
        if (fstat(dfd, &parent) < 0)
            return -errno;
        if (parent.st_dev != st.st_dev)
            return -EXDEV;
    }
    if ((st.st_mode & 0700) != 0700 &&
        fchmodat(dfd, name, (st.st_mode & 07777) | 0700, AT_SYMLINK_NOFOLLOW) < 0) {
        /* best effort, as above */
    }
    int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    int r = conch_rm_contents(fd, flags);
    close(fd);
    if (r < 0)
        return r;
    return unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -errno : 0;
}
