/* rmtree.c - removing a directory tree by file descriptors alone, for the upper dir (discard,
 * after a commit) and the host dir (a committed deletion). No path is ever built, so a chain
 * deeper than PATH_MAX goes like any other, and only two fds are open at a time. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "workspace/ws-internal.h"

/* One directory on the way down: the subdirs still to remove, and its identity, checked
 * when we climb back to it through "..". */
struct frame {
    struct conch_ws__names subs;
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
static int clear_level(int fd, struct conch_ws__names *ret_subs, int *first)
{
    int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    struct conch_ws__names all = {0};
    int r = conch_ws__names_read(dfd, &all);
    if (r < 0)
        return r;
    struct conch_ws__names subs = {.v = calloc(all.n ? all.n : 1, sizeof(char *))};
    if (!subs.v) {
        conch_ws__names_done(&all);
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
    conch_ws__names_done(&all);
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

int conch_ws__empty_fd(int fd, bool no_xdev)
{
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
            conch_ws__names_done(&top->subs);
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
        conch_ws__names_done(&top->subs);
        n--;
        if (r < 0)
            break;
        const char *child = v[n - 1].subs.v[v[n - 1].next - 1];
        if (unlinkat(cur, child, AT_REMOVEDIR) < 0 && errno != ENOENT)
            keep_first(&first, -errno);
    }
    for (size_t i = 0; i < n; i++)
        conch_ws__names_done(&v[i].subs);
    free(v);
    if (cur >= 0)
        close(cur);
    return r < 0 ? r : first;
}

int conch_ws__remove_at(int dfd, const char *name, bool no_xdev)
{
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
    int r = conch_ws__empty_fd(fd, no_xdev);
    close(fd);
    if (r < 0)
        return r;
    return unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -errno : 0;
}
