/* commit.c - applies a scanned change list to the host directory. Every host path is
 * resolved with openat2 so that nothing planted in the host dir or the sandbox redirects a
 * write; files and symlinks are written under a temporary name and renamed into place. */
#include "workspace/workspace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "workspace/ws-internal.h"

#define COPY_CHUNK (128 * 1024)

struct commit {
    int upper_fd, host_fd;
    bool may_chown;
    uid_t new_uid;
    gid_t new_gid;
    char *buf; /* COPY_CHUNK, for the read/write fallback */
};

/* Set-id bits are never carried from the sandbox onto host files: a sandboxed command
 * could otherwise plant a set-uid binary owned by the workspace's owner (or root). */
static mode_t file_mode(const struct conch_ws_change *ch)
{
    mode_t m = ch->new_mode & 07777;
    return ch->type == 'd' ? m : m & ~(mode_t)(S_ISUID | S_ISGID);
}

/* Splits @path into a new parent string ("" for top-level) and a pointer to its name. */
static int split(const char *path, char **ret_parent, const char **ret_name)
{
    const char *slash = strrchr(path, '/');
    char *parent = slash ? strndup(path, (size_t)(slash - path)) : strdup("");
    if (!parent)
        return -ENOMEM;
    *ret_parent = parent;
    *ret_name = slash ? slash + 1 : path;
    return 0;
}

static void tmp_name(char *buf, size_t size)
{
    static unsigned long counter;
    unsigned long long rnd;
    if (getrandom(&rnd, sizeof(rnd), GRND_NONBLOCK) != (ssize_t)sizeof(rnd))
        rnd = ((unsigned long long)getpid() << 32) ^ (unsigned long long)time(NULL) ^ ++counter;
    snprintf(buf, size, ".conch-tmp-%016llx", rnd);
}

/* Removes every entry inside dir @rel beneath @base, never following a symlink (they are
 * unlinked, not their targets) nor crossing a mount point. Holds one dir open at a time
 * and re-resolves by path with openat2, so a deep tree cannot exhaust fds and a symlink
 * swapped in mid-walk is refused rather than followed. */
static int empty_tree(int base, const char *rel)
{
    char **subs = NULL;
    size_t nsubs = 0, cap = 0;
    int first = 0;
    {
        int fd = conch_ws__openat2(base, rel, O_RDONLY | O_DIRECTORY, true);
        if (fd < 0)
            return fd;
        _cleanup_closedir_ DIR *d = fdopendir(fd);
        if (!d) {
            int r = -errno;
            close(fd);
            return r;
        }
        for (;;) {
            errno = 0;
            struct dirent *de = readdir(d);
            if (!de) {
                if (errno && !first)
                    first = -errno;
                break;
            }
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            struct stat st;
            if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
                if (errno != ENOENT && !first)
                    first = -errno;
                continue;
            }
            if (!S_ISDIR(st.st_mode)) {
                if (unlinkat(dirfd(d), de->d_name, 0) < 0 && errno != ENOENT && !first)
                    first = -errno;
                continue;
            }
            if (nsubs == cap) {
                size_t ncap = cap ? cap * 2 : 8;
                char **v = realloc(subs, ncap * sizeof(*v));
                if (!v) {
                    first = -ENOMEM;
                    break;
                }
                subs = v;
                cap = ncap;
            }
            if (!(subs[nsubs] = strdup(de->d_name))) {
                first = -ENOMEM;
                break;
            }
            nsubs++;
        }
    }
    bool emptied_any = false;
    for (size_t i = 0; i < nsubs; i++) {
        char *child = NULL;
        int r = asprintf(&child, "%s/%s", rel, subs[i]) < 0 ? -ENOMEM : 0;
        if (r >= 0)
            r = empty_tree(base, child);
        free(child);
        if (r < 0 && !first)
            first = r;
        if (r < 0) {
            free(subs[i]);
            subs[i] = NULL;
        } else {
            emptied_any = true;
        }
    }
    if (emptied_any) {
        _cleanup_close_ int fd = conch_ws__openat2(base, rel, O_PATH | O_DIRECTORY, true);
        if (fd < 0 && !first)
            first = fd;
        for (size_t i = 0; fd >= 0 && i < nsubs; i++) {
            if (subs[i] && unlinkat(fd, subs[i], AT_REMOVEDIR) < 0 && errno != ENOENT && !first)
                first = -errno;
        }
    }
    for (size_t i = 0; i < nsubs; i++)
        free(subs[i]);
    free(subs);
    return first;
}

/* Removes @name from @dfd: a file or symlink itself, a directory with all it holds. */
static int remove_entry(int dfd, const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
    int r = empty_tree(dfd, name);
    if (r < 0)
        return r;
    return unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT ? -errno : 0;
}

static int copy_data(struct commit *c, int src, int dst)
{
    bool fallback = false;
    for (;;) {
        ssize_t n;
        if (!fallback) {
            n = copy_file_range(src, NULL, dst, NULL, COPY_CHUNK, 0);
            if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP ||
                          errno == ENOSYS || errno == EBADF)) {
                /* Offsets advanced by any earlier success: read/write carries on. */
                fallback = true;
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return -errno;
            if (n == 0)
                return 0;
            continue;
        }
        n = read(src, c->buf, COPY_CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        int r = conch_write_all(dst, c->buf, (size_t)n);
        if (r < 0)
            return r;
    }
}

/* Puts the temporary @tmp in place of @name (both in @dfd), removing an old directory
 * first since rename() cannot replace a directory with a non-directory. */
static int install(int dfd, const char *tmp, const char *name)
{
    struct stat st;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
        int r = remove_entry(dfd, name);
        if (r < 0)
            return r;
    }
    return renameat(dfd, tmp, dfd, name) < 0 ? -errno : 0;
}

struct target {
    const char *path, *name;
    int up;     /* upper parent dir (O_PATH) */
    int hp;     /* host parent dir (O_PATH) */
    bool chown; /* apply uid/gid */
    uid_t uid;
    gid_t gid;
    const char *what; /* on failure: the failing step */
};

static int put_file(struct commit *c, struct target *t, const struct conch_ws_change *ch)
{
    t->what = "open sandbox file";
    _cleanup_close_ int src =
        openat(t->up, t->name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (src < 0)
        return -errno;
    struct stat st;
    if (fstat(src, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode)) {
        t->what = "sandbox file changed type since the scan";
        return -ESTALE;
    }

    char tmp[64];
    _cleanup_close_ int dst = -1;
    t->what = "create temporary file";
    for (int i = 0; i < 16 && dst < 0; i++) {
        tmp_name(tmp, sizeof(tmp));
        dst = openat(t->hp, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (dst < 0 && errno != EEXIST)
            return -errno;
    }
    if (dst < 0)
        return -EEXIST;

    int r = copy_data(c, src, dst);
    t->what = "copy content";
    /* chown first: it clears set-id bits that the fchmod below must not lose. */
    if (r >= 0 && t->chown && fchown(dst, t->uid, t->gid) < 0) {
        r = -errno;
        t->what = "chown";
    }
    if (r >= 0 && fchmod(dst, file_mode(ch)) < 0) {
        r = -errno;
        t->what = "chmod";
    }
    if (r >= 0 && close(TAKE_FD(dst)) < 0) {
        r = -errno;
        t->what = "write";
    }
    if (r >= 0) {
        r = install(t->hp, tmp, t->name);
        t->what = "replace";
    }
    if (r < 0)
        unlinkat(t->hp, tmp, 0);
    return r;
}

/* Creates a symlink to @link_target (or, if NULL, a FIFO) under a temporary name, owns
 * it and renames it into place. */
static int put_node(struct target *t, const struct conch_ws_change *ch, const char *link_target)
{
    char tmp[64];
    int r = -EEXIST;
    t->what = "create temporary entry";
    for (int i = 0; i < 16 && r == -EEXIST; i++) {
        tmp_name(tmp, sizeof(tmp));
        if (link_target)
            r = symlinkat(link_target, t->hp, tmp) < 0 ? -errno : 0;
        else
            r = mkfifoat(t->hp, tmp, 0600) < 0 ? -errno : 0;
    }
    if (r < 0)
        return r;
    if (t->chown && fchownat(t->hp, tmp, t->uid, t->gid, AT_SYMLINK_NOFOLLOW) < 0) {
        r = -errno;
        t->what = "chown";
    }
    /* A symlink has no mode of its own on Linux; a FIFO does. */
    if (r >= 0 && !link_target && fchmodat(t->hp, tmp, file_mode(ch), AT_SYMLINK_NOFOLLOW) < 0) {
        r = -errno;
        t->what = "chmod";
    }
    if (r >= 0) {
        r = install(t->hp, tmp, t->name);
        t->what = "replace";
    }
    if (r < 0)
        unlinkat(t->hp, tmp, 0);
    return r;
}

static int put_symlink(struct target *t, const struct conch_ws_change *ch)
{
    _cleanup_free_ char *target = NULL;
    t->what = "read sandbox symlink";
    int r = conch_ws__read_link(t->up, t->name, &target);
    if (r < 0)
        return r == -EINVAL ? -ESTALE : r;
    return put_node(t, ch, target);
}

static int put_other(struct target *t, const struct conch_ws_change *ch)
{
    struct stat st;
    t->what = "stat sandbox entry";
    if (fstatat(t->up, t->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (!S_ISFIFO(st.st_mode)) {
        /* Device nodes and sockets have no meaning outside the sandbox. */
        t->what = "only files, directories, symlinks and FIFOs can be committed";
        return -EOPNOTSUPP;
    }
    return put_node(t, ch, NULL);
}

/* Creates the dir with owner-only permissions; its real mode is applied by set_mode()
 * after everything beneath it is written, so a read-only dir can still be filled. */
static int put_dir(struct target *t)
{
    struct stat st;
    bool exists = fstatat(t->hp, t->name, &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (exists && !S_ISDIR(st.st_mode)) {
        t->what = "remove old entry";
        if (unlinkat(t->hp, t->name, 0) < 0)
            return -errno;
        exists = false;
    }
    t->what = "mkdir";
    if (!exists && mkdirat(t->hp, t->name, 0700) < 0 && errno != EEXIST)
        return -errno;
    if (!exists && t->chown) {
        t->what = "chown";
        _cleanup_close_ int fd =
            openat(t->hp, t->name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || fchown(fd, t->uid, t->gid) < 0)
            return -errno;
    }
    return 0;
}

static int set_mode(struct target *t, const struct conch_ws_change *ch)
{
    struct stat st;
    t->what = "stat";
    if (fstatat(t->hp, t->name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    if (S_ISLNK(st.st_mode))
        return 0;
    /* glibc implements AT_SYMLINK_NOFOLLOW with an O_PATH fd, so a symlink swapped in
     * since the fstatat gives EOPNOTSUPP rather than chmod'ing its target. */
    t->what = "chmod";
    return fchmodat(t->hp, t->name, file_mode(ch), AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}

static int fail(struct conch_err *err, const char *path, const char *what, int r)
{
    const char *why = strerror(-r);
    if (r == -ELOOP)
        why = "a component is a symlink on the host; refusing to follow it";
    else if (r == -EXDEV)
        why = "the path leaves the workspace or crosses a mount point";
    return conch_err_set(err, -r, "commit '%s': %s: %s", path, what, why);
}

/* Opens @t's parent dirs on both sides. Returns 1 when there is nothing to do. */
static int open_parents(struct commit *c, const struct conch_ws_change *ch, struct target *t,
                        bool need_upper, struct conch_err *err)
{
    _cleanup_free_ char *parent = NULL;
    if (split(ch->path, &parent, &t->name) < 0)
        return conch_err_set(err, ENOMEM, "commit '%s': out of memory", ch->path);
    /* Mount points are refused too: overlayfs never showed the sandbox what is mounted
     * below the host dir, so a change there would land somewhere it never saw. */
    t->hp = conch_ws__openat2(c->host_fd, parent, O_PATH | O_DIRECTORY, true);
    if (t->hp < 0) {
        if (ch->kind == CONCH_CHANGE_DELETED && (t->hp == -ENOENT || t->hp == -ENOTDIR))
            return 1; /* already gone */
        return fail(err, ch->path, "open parent dir on the host", t->hp);
    }
    if (need_upper) {
        t->up = conch_ws__openat2(c->upper_fd, parent, O_PATH | O_DIRECTORY, false);
        if (t->up < 0)
            return fail(err, ch->path, "open parent dir in the sandbox", t->up);
    }
    return 0;
}

static int apply(struct commit *c, const struct conch_ws_change *ch, struct conch_err *err)
{
    if (!ch->path || !conch_ws__path_ok(ch->path))
        return conch_err_set(err, EINVAL, "commit '%s': invalid path",
                             ch->path ? ch->path : "(null)");
    bool content = ch->kind != CONCH_CHANGE_MODIFIED || ch->content_changed;
    bool need_upper = ch->kind != CONCH_CHANGE_DELETED && content && ch->type != 'd';
    struct target t = {.path = ch->path, .up = -1, .hp = -1};
    int r = open_parents(c, ch, &t, need_upper, err);
    if (r != 0)
        goto out;

    if (ch->kind == CONCH_CHANGE_DELETED) {
        r = remove_entry(t.hp, t.name);
        t.what = "remove";
        goto done;
    }
    if (!content) {
        /* Mode-only changes of dirs wait for the final pass, like new dirs. */
        r = ch->type == 'd' || !ch->mode_changed ? 0 : set_mode(&t, ch);
        goto done;
    }

    struct stat cur;
    bool have_cur = fstatat(t.hp, t.name, &cur, AT_SYMLINK_NOFOLLOW) == 0;
    if (!have_cur && errno != ENOENT) {
        r = -errno;
        t.what = "stat";
        goto done;
    }
    if (have_cur && ch->kind == CONCH_CHANGE_ADDED && S_ISDIR(cur.st_mode) != (ch->type == 'd')) {
        r = -EEXIST;
        t.what = "the host gained an entry of another type since the scan";
        goto done;
    }
    t.chown = c->may_chown;
    t.uid = c->new_uid;
    t.gid = c->new_gid;
    if (have_cur && ch->kind != CONCH_CHANGE_ADDED) {
        t.uid = cur.st_uid;
        t.gid = cur.st_gid;
    }
    switch (ch->type) {
    case 'd':
        r = put_dir(&t);
        break;
    case 'f':
        r = put_file(c, &t, ch);
        break;
    case 'l':
        r = put_symlink(&t, ch);
        break;
    default:
        r = put_other(&t, ch);
        break;
    }

done:
    if (r < 0)
        r = fail(err, ch->path, t.what, r);
out:
    if (t.hp >= 0)
        close(t.hp);
    if (t.up >= 0)
        close(t.up);
    return r < 0 ? r : 0;
}

/* Gives a dir its final mode once everything beneath it exists. */
static int finish_dir(struct commit *c, const struct conch_ws_change *ch, struct conch_err *err)
{
    struct target t = {.path = ch->path, .up = -1, .hp = -1};
    int r = open_parents(c, ch, &t, false, err);
    if (r != 0)
        return r < 0 ? r : 0;
    r = set_mode(&t, ch);
    if (r < 0)
        r = fail(err, ch->path, t.what, r);
    close(t.hp);
    return r;
}

static int cmp_change_ptr(const void *a, const void *b)
{
    const struct conch_ws_change *x = *(const struct conch_ws_change *const *)a;
    const struct conch_ws_change *y = *(const struct conch_ws_change *const *)b;
    return strcmp(x->path ? x->path : "", y->path ? y->path : "");
}

int conch_ws_commit(int upper_fd, int host_fd, const struct conch_ws_changes *changes,
                    const struct conch_ws_commit_opts *opts, struct conch_err *err)
{
    if (!changes || changes->n == 0)
        return 0;
    struct stat root;
    if (fstat(host_fd, &root) < 0)
        return conch_err_set(err, errno, "commit: stat host dir: %s", strerror(errno));
    struct commit c = {
        .upper_fd = upper_fd,
        .host_fd = host_fd,
        .may_chown = geteuid() == 0,
        .new_uid = opts && opts->new_uid != (uid_t)-1 ? opts->new_uid : root.st_uid,
        .new_gid = opts && opts->new_gid != (gid_t)-1 ? opts->new_gid : root.st_gid,
    };

    /* Sorted by path, a parent comes before its children, whatever order we were given. */
    _cleanup_free_ const struct conch_ws_change **order = calloc(changes->n, sizeof(*order));
    _cleanup_free_ bool *ok = calloc(changes->n, sizeof(*ok));
    _cleanup_free_ char *buf = malloc(COPY_CHUNK);
    if (!order || !ok || !buf)
        return conch_err_set(err, ENOMEM, "commit: out of memory");
    c.buf = buf;
    for (size_t i = 0; i < changes->n; i++)
        order[i] = &changes->items[i];
    qsort(order, changes->n, sizeof(*order), cmp_change_ptr);

    int first = 0;
    for (size_t i = 0; i < changes->n; i++) {
        struct conch_err e = {0};
        int r = apply(&c, order[i], &e);
        ok[i] = r >= 0;
        if (r < 0 && first == 0) {
            first = r;
            if (err)
                *err = e;
        }
    }
    /* Children before parents, so a dir losing its write or search bit is done last. */
    for (size_t i = changes->n; i-- > 0;) {
        const struct conch_ws_change *ch = order[i];
        if (!ok[i] || ch->type != 'd' || ch->kind == CONCH_CHANGE_DELETED)
            continue;
        if (ch->kind == CONCH_CHANGE_MODIFIED && !ch->mode_changed)
            continue;
        struct conch_err e = {0};
        int r = finish_dir(&c, ch, &e);
        if (r < 0 && first == 0) {
            first = r;
            if (err)
                *err = e;
        }
    }
    return first;
}
