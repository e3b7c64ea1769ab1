/* store-sync.c - a sandbox's view of a store (issue 18): the store's files materialised into
 * a host dir that the sandbox gets as a bind mount, and the dir's changes written back after
 * each command by comparing it with what was materialised (inode, size, mode, mtime, ctime:
 * a write, chmod or rename moves ctime, which no one inside can set back). The dir is the
 * sandbox's to plant anything in: it is walked by fds alone, nothing followed, and only
 * regular files and dirs are stored. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "workspace/store-internal.h"
#include "workspace/workspace.h"

#define DEPTH_MAX 64

struct ent {
    char *path; /* relative, normalised; owned */
    int kind;
    ino_t ino;
    off_t size;
    mode_t mode;
    struct timespec mtime, ctime;
    int64_t version; /* of the store's row it was written from or to */
};

struct ents {
    struct ent *v;
    size_t n, cap;
};

struct conch_store_view {
    pthread_mutex_t lock;
    char db_dir[4096];
    char name[CONCH_STORE_NAME_MAX + 1];
    char dir[4096];
    char writer[64];
    uint64_t max_bytes;
    struct ents base; /* sorted by path */
    int64_t seen;     /* the store's version it was last brought up to */
};

static void ents_done(struct ents *e)
{
    for (size_t i = 0; i < e->n; i++)
        free(e->v[i].path);
    free(e->v);
    memset(e, 0, sizeof(*e));
}

static int ents_add(struct ents *e, const char *path, int kind, const struct stat *st,
                    int64_t version)
{
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        struct ent *n = reallocarray(e->v, cap, sizeof(*n));
        if (!n)
            return -ENOMEM;
        e->v = n;
        e->cap = cap;
    }
    struct ent *x = &e->v[e->n];
    memset(x, 0, sizeof(*x));
    if (!(x->path = strdup(path)))
        return -ENOMEM;
    x->kind = kind;
    if (st) {
        x->ino = st->st_ino;
        x->size = st->st_size;
        x->mode = st->st_mode & 07777;
        x->mtime = st->st_mtim;
        x->ctime = st->st_ctim;
    }
    x->version = version;
    e->n++;
    return 0;
}

static int ent_cmp(const void *a, const void *b)
{
    return strcmp(((const struct ent *)a)->path, ((const struct ent *)b)->path);
}

static struct ent *ents_find(const struct ents *e, const char *path)
{
    struct ent key = {.path = (char *)path};
    return e->n ? bsearch(&key, e->v, e->n, sizeof(*e->v), ent_cmp) : NULL;
}

int conch_store_view_new(const char *db_dir, const char *name, uint64_t max_bytes, const char *dir,
                         const char *writer, struct conch_store_view **ret, struct conch_err *err)
{
    int r = conch_store_name_check(name, err);
    if (r < 0)
        return r;
    struct conch_store_view *v = calloc(1, sizeof(*v));
    if (!v)
        return conch_err_set(err, ENOMEM, "out of memory");
    pthread_mutex_init(&v->lock, NULL);
    snprintf(v->db_dir, sizeof(v->db_dir), "%s", db_dir);
    snprintf(v->name, sizeof(v->name), "%s", name);
    snprintf(v->dir, sizeof(v->dir), "%s", dir);
    snprintf(v->writer, sizeof(v->writer), "%s", writer);
    v->max_bytes = max_bytes ? max_bytes : CONCH_STORE_TOTAL_DEFAULT;
    *ret = v;
    return 0;
}

void conch_store_view_free(struct conch_store_view *v)
{
    if (!v)
        return;
    ents_done(&v->base);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

const char *conch_store_view_name(const struct conch_store_view *v)
{
    return v->name;
}

const char *conch_store_view_dir(const struct conch_store_view *v)
{
    return v->dir;
}

/* A test hook: a pause (ms) after each entry written back, so that a test can kill the
 * daemon in the middle of a write-back's transaction. */
static void test_pause(void)
{
    const char *p = getenv("CONCH_TEST_STORE_PAUSE_MS");
    long ms = p ? strtol(p, NULL, 10) : 0;
    if (ms > 0 && ms < 10000) {
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void note_skip(struct conch_store_report *rep, const char *path)
{
    if (!rep->first_skipped[0])
        snprintf(rep->first_skipped, sizeof(rep->first_skipped), "%s", path);
}

/* ---- the walk: what is in the dir now, written to the store where it changed ---- */

struct walk {
    struct conch_store_view *v;
    struct conch_store *s;
    struct conch_store_report *rep;
    struct ents cur; /* what was found (and stored, or unchanged) */
    int64_t version; /* this write-back's */
    uint64_t entries;
    struct conch_err *err;
};

static bool changed(const struct ent *b, int kind, const struct stat *st)
{
    if (!b || b->kind != kind || b->mode != (st->st_mode & 07777))
        return true;
    if (kind == CONCH_STORE_DIR)
        return false; /* its times move with what is in it */
    return b->ino != st->st_ino || b->size != st->st_size ||
           b->mtime.tv_sec != st->st_mtim.tv_sec || b->mtime.tv_nsec != st->st_mtim.tv_nsec ||
           b->ctime.tv_sec != st->st_ctim.tv_sec || b->ctime.tv_nsec != st->st_ctim.tv_nsec;
}

static double ts_s(struct timespec t)
{
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* @path is not stored this time (over the largest-file cap): what the store has of it stays,
 * neither overwritten nor deleted, and the next write-back looks at it again. */
static int refuse(struct walk *w, const struct ent *b, const char *path)
{
    w->rep->refused++;
    note_skip(w->rep, path);
    if (!b)
        return 0;
    if (ents_add(&w->cur, path, b->kind, NULL, b->version) < 0)
        return conch_err_set(w->err, ENOMEM, "out of memory");
    struct ent *x = &w->cur.v[w->cur.n - 1];
    char *p = x->path;
    *x = *b;
    x->path = p;
    return 0;
}

/* Store the regular file @name in @dfd at @path, if it changed. */
static int walk_file(struct walk *w, int dfd, const char *name, const char *path)
{
    struct ent *b = ents_find(&w->v->base, path);
    _cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ELOOP)
            return 0; /* gone, or swapped for a link, since it was listed */
        return conch_err_set(w->err, errno, "store '%s': open '%s': %s", w->v->name, path,
                             strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) < 0)
        return conch_err_set(w->err, errno, "store '%s': stat '%s': %s", w->v->name, path,
                             strerror(errno));
    if (!S_ISREG(st.st_mode))
        return 0;
    if (!changed(b, CONCH_STORE_FILE, &st))
        return ents_add(&w->cur, path, CONCH_STORE_FILE, &st, b->version) < 0
                   ? conch_err_set(w->err, ENOMEM, "out of memory")
                   : 0;
    uint64_t max = conch_store_file_max(w->s);
    _cleanup_free_ char *buf = NULL;
    size_t len = 0;
    int r = 0;
    /* Read one byte past the cap: a file that grew while it was read is refused whole,
     * never stored cut short. */
    if ((uint64_t)st.st_size > max ||
        ((r = conch_read_fd(fd, path, max + 1, &buf, &len, w->err)) >= 0 && len > max))
        return refuse(w, b, path);
    if (r < 0)
        return r;
    int64_t base_v = b ? b->version : w->v->seen;
    if ((r = conch_store__put(w->s, path, CONCH_STORE_FILE, buf, len, st.st_mode, ts_s(st.st_mtim),
                              base_v, w->v->writer, w->version, w->err)) < 0)
        return r;
    w->rep->written++;
    test_pause();
    return ents_add(&w->cur, path, CONCH_STORE_FILE, &st, w->version) < 0
               ? conch_err_set(w->err, ENOMEM, "out of memory")
               : 0;
}

static int walk_dir(struct walk *w, int dfd, char *path, size_t plen, int depth)
{
    int fd2 = dup(dfd);
    if (fd2 < 0)
        return conch_err_set(w->err, errno, "dup: %s", strerror(errno));
    _cleanup_closedir_ DIR *d = fdopendir(fd2);
    if (!d) {
        close(fd2);
        return conch_err_set(w->err, errno, "fdopendir: %s", strerror(errno));
    }
    struct dirent *e;
    int r = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        size_t n = strlen(e->d_name);
        if (plen + 1 + n >= CONCH_STORE_PATH_MAX) {
            w->rep->refused++;
            note_skip(w->rep, e->d_name);
            continue;
        }
        if (++w->entries > CONCH_STORE_ENTRIES_MAX)
            return conch_err_setk(w->err, CONCH_ERR_LIMIT, ENOSPC,
                                  "store '%s': more than %d files and dirs in its view: nothing "
                                  "was written",
                                  w->v->name, CONCH_STORE_ENTRIES_MAX);
        if (plen)
            path[plen] = '/';
        memcpy(path + plen + (plen ? 1 : 0), e->d_name, n + 1);
        size_t clen = plen + (plen ? 1 : 0) + n;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
            path[plen] = '\0';
            continue; /* gone since it was listed */
        }
        bool ctl = false;
        for (size_t i = 0; i < n; i++)
            ctl |= (unsigned char)e->d_name[i] < 0x20 || e->d_name[i] == 0x7f;
        if (ctl) {
            w->rep->refused++;
            note_skip(w->rep, path);
        } else if (S_ISREG(st.st_mode)) {
            r = walk_file(w, dfd, e->d_name, path);
        } else if (S_ISDIR(st.st_mode) && depth < DEPTH_MAX) {
            struct ent *b = ents_find(&w->v->base, path);
            int64_t ver = b ? b->version : w->version;
            if (changed(b, CONCH_STORE_DIR, &st)) {
                r = conch_store__put(w->s, path, CONCH_STORE_DIR, NULL, 0, st.st_mode,
                                     ts_s(st.st_mtim), b ? b->version : w->v->seen, w->v->writer,
                                     w->version, w->err);
                ver = w->version;
                if (r >= 0)
                    w->rep->written++;
            }
            if (r >= 0 && ents_add(&w->cur, path, CONCH_STORE_DIR, &st, ver) < 0)
                r = conch_err_set(w->err, ENOMEM, "out of memory");
            int sub = r >= 0
                          ? openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                          : -1;
            if (r >= 0 && sub >= 0) {
                r = walk_dir(w, sub, path, clen, depth + 1);
                close(sub);
            }
        } else {
            w->rep->skipped++; /* a link, device, fifo or socket: not stored */
            note_skip(w->rep, path);
        }
        path[plen] = '\0';
        if (r < 0)
            return r;
    }
    return 0;
}

/* ---- bringing the store's changes into the dir ---- */

/* The dir holding @path's last component, made (0755) where missing; *@ret_leaf points into
 * @path. Every component opened O_NOFOLLOW: a link planted inside is never followed. */
static int open_parent(int root, const char *path, const char **ret_leaf)
{
    int fd = fcntl(root, F_DUPFD_CLOEXEC, 3);
    if (fd < 0)
        return -errno;
    const char *c = path;
    for (const char *sl; (sl = strchr(c, '/')); c = sl + 1) {
        char comp[256];
        size_t n = (size_t)(sl - c);
        if (n >= sizeof(comp)) {
            close(fd);
            return -ENAMETOOLONG;
        }
        memcpy(comp, c, n);
        comp[n] = '\0';
        int sub = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0 && errno == ENOENT && mkdirat(fd, comp, 0755) == 0)
            sub = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(fd);
        if (sub < 0)
            return -e;
        fd = sub;
    }
    *ret_leaf = c;
    return fd;
}

/* Write one row of the store into the dir; fills *@ret_st with what it now is there. */
static int put_local(int root, const char *path, int kind, const void *buf, size_t len, mode_t mode,
                     double mtime, struct stat *ret_st)
{
    const char *leaf = path;
    _cleanup_close_ int pfd = open_parent(root, path, &leaf);
    if (pfd < 0)
        return pfd;
    struct timespec ts[2];
    ts[0].tv_sec = ts[1].tv_sec = (time_t)mtime;
    ts[0].tv_nsec = ts[1].tv_nsec = (long)((mtime - (double)(time_t)mtime) * 1e9);
    if (kind == CONCH_STORE_DIR) {
        struct stat st;
        if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISDIR(st.st_mode))
            conch_rm_at(pfd, leaf, CONCH_RM_ONE_FS);
        if (mkdirat(pfd, leaf, 0700) < 0 && errno != EEXIST)
            return -errno;
        _cleanup_close_ int fd = openat(pfd, leaf, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return -errno;
        if (fchmod(fd, (mode & 0777) | 0700) < 0 || fstat(fd, ret_st) < 0)
            return -errno;
        return 0;
    }
    char tmp[64];
    static unsigned counter;
    snprintf(tmp, sizeof(tmp), ".conch-store-%d-%u", (int)getpid(),
             __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED));
    _cleanup_close_ int fd =
        openat(pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int r = conch_write_all(fd, buf, len);
    if (r >= 0 && (fchmod(fd, mode & 0777) < 0 || futimens(fd, ts) < 0))
        r = -errno;
    if (r >= 0 && renameat(pfd, tmp, pfd, leaf) < 0) {
        r = -errno;
        if (r == -EISDIR || r == -ENOTEMPTY || r == -EEXIST) { /* a dir of the sandbox's there */
            conch_rm_at(pfd, leaf, CONCH_RM_ONE_FS);
            r = renameat(pfd, tmp, pfd, leaf) < 0 ? -errno : 0;
        }
    }
    if (r < 0) {
        unlinkat(pfd, tmp, 0);
        return r;
    }
    return fstat(fd, ret_st) < 0 ? -errno : 0;
}

/* Remove @path from the dir: a file, or a dir if it is empty (what is beneath a deleted dir
 * comes first, as rows of its own; a file made inside meanwhile keeps its dir). Returns 0
 * when it is gone. */
static int del_local(int root, const char *path)
{
    const char *slash = strrchr(path, '/');
    int pfd = root;
    if (slash) {
        char parent[CONCH_STORE_PATH_MAX];
        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path);
        pfd = conch_open_beneath(root, parent, O_PATH | O_DIRECTORY, 0, 0);
        if (pfd < 0)
            return 0; /* its dir is gone already */
    }
    const char *leaf = slash ? slash + 1 : path;
    struct stat st;
    int r = 0;
    if (fstatat(pfd, leaf, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        unlinkat(pfd, leaf, S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) < 0)
        r = -errno;
    if (pfd != root)
        close(pfd);
    return r;
}

/* Remove @path and what is beneath it from @e (kept sorted). */
static void ents_remove_tree(struct ents *e, const char *path)
{
    size_t n = strlen(path), o = 0;
    for (size_t i = 0; i < e->n; i++) {
        const char *p = e->v[i].path;
        if (!strncmp(p, path, n) && (p[n] == '\0' || p[n] == '/')) {
            free(e->v[i].path);
            continue;
        }
        e->v[o++] = e->v[i];
    }
    e->n = o;
}

/* Remove @path alone from @e (kept sorted). */
static void ents_remove_one(struct ents *e, const char *path)
{
    struct ent *x = ents_find(e, path);
    if (!x)
        return;
    size_t i = (size_t)(x - e->v);
    free(x->path);
    memmove(&e->v[i], &e->v[i + 1], (e->n - i - 1) * sizeof(*e->v));
    e->n--;
}

/* Whether @path in the dir differs from what the view last wrote or read there (a change
 * inside not written back yet, which a pull must not overwrite: its write-back wins later). */
static bool pending_local(const struct conch_store_view *v, int root, const char *path)
{
    const struct ent *b = ents_find(&v->base, path);
    const char *slash = strrchr(path, '/');
    struct stat st;
    int pfd = root;
    if (slash) {
        char parent[CONCH_STORE_PATH_MAX];
        snprintf(parent, sizeof(parent), "%.*s", (int)(slash - path), path);
        pfd = conch_open_beneath(root, parent, O_PATH | O_DIRECTORY, 0, 0);
        if (pfd < 0)
            return b != NULL; /* its dir went: a local delete pending, if it was there */
    }
    int r = fstatat(pfd, slash ? slash + 1 : path, &st, AT_SYMLINK_NOFOLLOW);
    if (pfd != root)
        close(pfd);
    if (r < 0)
        return b != NULL;
    if (!b)
        return true; /* made inside since */
    int kind = S_ISDIR(st.st_mode) ? CONCH_STORE_DIR : CONCH_STORE_FILE;
    return !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode)) || changed(b, kind, &st);
}

/* Bring every row changed after v->seen into the dir @root, but those at @skip_version (this
 * view's own write-back) and those changed inside since the view last looked. */
static int pull(struct conch_store_view *v, struct conch_store *s, int root, int64_t skip_version,
                bool check, struct conch_store_report *rep, struct conch_err *err)
{
    int r = conch_store__exec(s, "BEGIN", err);
    if (r < 0)
        return r;
    int64_t now = 0;
    sqlite3_stmt *st = NULL;
    if ((r = conch_store__version(s, &now, err)) < 0 ||
        (r = conch_store__prepare(s,
                                  "SELECT path, kind, content, mode, mtime, version, deleted "
                                  "FROM files WHERE version > ?1 ORDER BY deleted, "
                                  "CASE WHEN deleted THEN path END DESC, path",
                                  &st, err)) < 0) {
        conch_store__rollback(s);
        return r;
    }
    sqlite3_bind_int64(st, 1, v->seen);
    int rc;
    struct ents added = {0}; /* kept apart until the end: v->base stays sorted for lookups */
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *path = (const char *)sqlite3_column_text(st, 0);
        int kind = sqlite3_column_int(st, 1);
        int64_t ver = sqlite3_column_int64(st, 5);
        if (ver == skip_version || (check && pending_local(v, root, path)))
            continue;
        if (sqlite3_column_int(st, 6)) {
            if (!ents_find(&v->base, path) || del_local(root, path) < 0)
                continue;
            ents_remove_one(&v->base, path);
            rep->pulled++;
            continue;
        }
        struct stat lst;
        r = put_local(root, path, kind, sqlite3_column_blob(st, 2),
                      (size_t)sqlite3_column_bytes(st, 2), (mode_t)sqlite3_column_int(st, 3),
                      sqlite3_column_double(st, 4), &lst);
        if (r < 0) {
            /* A link or a file planted where a dir of the store's goes (ELOOP, ENOTDIR):
             * never followed, the row is left out of the view, which keeps what is there. */
            rep->refused++;
            note_skip(rep, path);
            r = 0;
            continue;
        }
        if (kind == CONCH_STORE_FILE)
            ents_remove_tree(&v->base, path); /* the file, or a dir it replaced */
        else
            ents_remove_one(&v->base, path);
        if ((r = ents_add(&added, path, kind, &lst, ver)) < 0) {
            conch_err_set(err, ENOMEM, "out of memory");
            break;
        }
        rep->pulled++;
    }
    if (r >= 0 && rc != SQLITE_DONE)
        r = conch_err_set(err, EIO, "store '%s': read: %s", v->name, sqlite3_errmsg(s->db));
    sqlite3_finalize(st);
    conch_store__rollback(s); /* a read: nothing to commit */
    for (size_t i = 0; i < added.n; i++) {
        if (ents_add(&v->base, added.v[i].path, 0, NULL, 0) < 0) {
            r = conch_err_set(err, ENOMEM, "out of memory");
            break;
        }
        char *p = v->base.v[v->base.n - 1].path;
        v->base.v[v->base.n - 1] = added.v[i];
        v->base.v[v->base.n - 1].path = p;
    }
    ents_done(&added);
    if (v->base.n)
        qsort(v->base.v, v->base.n, sizeof(*v->base.v), ent_cmp);
    if (r >= 0)
        v->seen = now;
    return r;
}

static int open_dir(struct conch_store_view *v, bool make, struct conch_err *err)
{
    if (make && mkdir(v->dir, 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "store '%s': mkdir '%s': %s", v->name, v->dir,
                             strerror(errno));
    int fd = open(v->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "store '%s': open '%s': %s", v->name, v->dir,
                             strerror(errno));
    return fd;
}

int conch_store_view_materialise(struct conch_store_view *v, struct conch_err *err)
{
    pthread_mutex_lock(&v->lock);
    struct conch_store *s = NULL;
    int r = conch_store_open(v->db_dir, v->name, v->max_bytes, &s, err);
    int root = r >= 0 ? open_dir(v, true, err) : -1;
    if (r >= 0 && root < 0)
        r = root;
    if (r >= 0 && (r = conch_rm_contents(root, CONCH_RM_ONE_FS)) < 0)
        conch_err_set(err, -r, "store '%s': empty '%s': %s", v->name, v->dir, strerror(-r));
    if (r >= 0) {
        struct conch_store_report rep = {0};
        ents_done(&v->base);
        v->seen = 0;
        r = pull(v, s, root, -1, false, &rep, err);
    }
    if (root >= 0)
        close(root);
    conch_store_close(s);
    pthread_mutex_unlock(&v->lock);
    return r;
}

int conch_store_view_sync(struct conch_store_view *v, struct conch_store_report *rep,
                          struct conch_err *err)
{
    memset(rep, 0, sizeof(*rep));
    pthread_mutex_lock(&v->lock);
    struct walk w = {.v = v, .rep = rep, .err = err};
    int root = -1;
    int r = conch_store_open(v->db_dir, v->name, v->max_bytes, &w.s, err);
    if (r >= 0 && (root = open_dir(v, false, err)) < 0)
        r = root;
    if (r >= 0 && (r = conch_store__begin(w.s, err)) >= 0) {
        char path[CONCH_STORE_PATH_MAX] = "";
        if ((r = conch_store__next_version(w.s, &w.version, err)) >= 0)
            r = walk_dir(&w, root, path, 0, 0);
        if (r >= 0 && w.cur.n)
            qsort(w.cur.v, w.cur.n, sizeof(*w.cur.v), ent_cmp);
        /* What was there and is not now: deleted (a dir first, then what was beneath). */
        for (size_t i = 0; r >= 0 && i < v->base.n; i++) {
            const struct ent *b = &v->base.v[i];
            if (ents_find(&w.cur, b->path))
                continue;
            if ((r = conch_store__del(w.s, b->path, b->version, v->writer, w.version, err)) < 0)
                break;
            rep->deleted++;
            test_pause();
        }
        if (r >= 0)
            r = conch_store__finish(w.s, err); /* rolls back on failure */
        else
            conch_store__rollback(w.s);
        if (r >= 0) {
            ents_done(&v->base);
            v->base = w.cur;
            memset(&w.cur, 0, sizeof(w.cur));
            r = pull(v, w.s, root, w.version, true, rep, err);
        }
    }
    ents_done(&w.cur);
    if (root >= 0)
        close(root);
    conch_store_close(w.s);
    pthread_mutex_unlock(&v->lock);
    return r;
}

int conch_store_view_pull(struct conch_store_view *v, struct conch_err *err)
{
    pthread_mutex_lock(&v->lock);
    struct conch_store *s = NULL;
    int root = -1;
    int r = conch_store_open(v->db_dir, v->name, v->max_bytes, &s, err);
    if (r >= 0 && (root = open_dir(v, false, err)) < 0)
        r = root;
    if (r >= 0) {
        struct conch_store_report rep = {0};
        r = pull(v, s, root, -1, true, &rep, err);
    }
    if (root >= 0)
        close(root);
    conch_store_close(s);
    pthread_mutex_unlock(&v->lock);
    return r;
}
