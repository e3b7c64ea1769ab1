/* commit.c - applies a scanned change list to the host directory. Every host path is
 * resolved with openat2 so that nothing planted in the host dir or the sandbox redirects a
 * write; files and symlinks are written under a temporary name and renamed into place,
 * holes kept; nothing that carries privilege (set-id bits, capabilities, devices) lands. */
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
    uint64_t max_bytes; /* 0: no limit */
    uint64_t written;   /* apparent bytes of the files written so far */
    char *buf;          /* COPY_CHUNK, for the read/write fallback */
    const struct conch_ws_rule *rules;
    size_t n_rules;
};

/*
 * The mode a committed entry gets. Set-id bits are never carried from the sandbox onto
 * the host: a sandboxed command could otherwise plant a set-uid binary owned by the
 * workspace's owner (or root), or a set-gid dir handing out the host group. Group and
 * world write are kept only where the host's entry (@host_mode, 0 for none) already had
 * them: a sandbox must not open the host's files to other local users.
 */
static mode_t commit_mode(const struct conch_ws_change *ch, mode_t host_mode)
{
    mode_t m = ch->new_mode & 07777 & ~(mode_t)(S_ISUID | S_ISGID);
    return m & ~(mode_t)(022 & ~host_mode);
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

/* Removes @name from @dfd: a file or symlink itself (never a symlink's target), a
 * directory with all it holds, never crossing a mount point. */
static int remove_entry(int dfd, const char *name)
{
    return conch_rm_at(dfd, name, CONCH_RM_ONE_FS);
}

/* Copies @len bytes at @off from @src to the same offset in @dst. */
static int copy_range(struct commit *c, int src, int dst, off_t off, off_t len)
{
    bool fallback = false;
    off_t in = off, out = off, end = off + len;
    while (in < end) {
        size_t want = (size_t)(end - in < COPY_CHUNK ? end - in : COPY_CHUNK);
        ssize_t n;
        if (!fallback) {
            n = copy_file_range(src, &in, dst, &out, want, 0);
            if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP ||
                          errno == ENOSYS || errno == EBADF)) {
                fallback = true; /* offsets advanced by any earlier success: carry on */
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return -errno;
            if (n == 0)
                return 0; /* shrank since fstat: the final ftruncate sets the size */
            continue;
        }
        n = pread(src, c->buf, want, in);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return 0;
        for (size_t done = 0; done < (size_t)n;) {
            ssize_t w = pwrite(dst, c->buf + done, (size_t)n - done, out);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0)
                return -errno;
            done += (size_t)w;
            out += w;
        }
        in += n;
    }
    return 0;
}

/*
 * Copies the first @size bytes of @src to @dst, holes kept: only the data segments that
 * SEEK_DATA/SEEK_HOLE report are copied, and a final ftruncate sets the length. Filling
 * holes would let `truncate -s 200M` in a sandbox with a 1 MB disk limit write 200 MB of
 * real blocks to the host. Bytes appended since the fstat are not copied.
 */
static int copy_data(struct commit *c, int src, int dst, off_t size)
{
    off_t pos = 0;
    while (pos < size) {
        off_t data = lseek(src, pos, SEEK_DATA);
        if (data < 0 && errno == ENXIO)
            break; /* a hole up to the end */
        off_t hole;
        if (data < 0 && (errno == EINVAL || errno == EOPNOTSUPP)) {
            data = pos; /* no hole information: copy all */
            hole = size;
        } else if (data < 0) {
            return -errno;
        } else {
            if (data >= size)
                break;
            hole = lseek(src, data, SEEK_HOLE);
            if (hole < 0)
                return -errno;
        }
        if (hole > size)
            hole = size;
        int r = copy_range(c, src, dst, data, hole - data);
        if (r < 0)
            return r;
        pos = hole;
    }
    return ftruncate(dst, size) < 0 ? -errno : 0;
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
    mode_t host_mode; /* permission bits of the host's entry before the commit; 0: none */
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
    /* The total was checked before anything was applied; a file that grew since the
     * scan (a running sandbox) is checked again here. */
    if (c->max_bytes && (uint64_t)st.st_size > c->max_bytes - c->written) {
        t->what = "the file grew since the scan past the commit's size limit";
        return -EFBIG;
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

    int r = copy_data(c, src, dst, st.st_size);
    t->what = "copy content";
    if (r >= 0)
        c->written += (uint64_t)st.st_size;
    /* chown first: it clears set-id bits that the fchmod below must not lose. */
    if (r >= 0 && t->chown && fchown(dst, t->uid, t->gid) < 0) {
        r = -errno;
        t->what = "chown";
    }
    if (r >= 0 && fchmod(dst, commit_mode(ch, t->host_mode)) < 0) {
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

/* Creates a symlink to @link_target under a temporary name, owns it and renames it into
 * place. A symlink has no mode of its own on Linux. */
static int put_node(struct target *t, const char *link_target)
{
    char tmp[64];
    int r = -EEXIST;
    t->what = "create temporary entry";
    for (int i = 0; i < 16 && r == -EEXIST; i++) {
        tmp_name(tmp, sizeof(tmp));
        r = symlinkat(link_target, t->hp, tmp) < 0 ? -errno : 0;
    }
    if (r < 0)
        return r;
    if (t->chown && fchownat(t->hp, tmp, t->uid, t->gid, AT_SYMLINK_NOFOLLOW) < 0) {
        r = -errno;
        t->what = "chown";
    }
    if (r >= 0) {
        r = install(t->hp, tmp, t->name);
        t->what = "replace";
    }
    if (r < 0)
        unlinkat(t->hp, tmp, 0);
    return r;
}

static int put_symlink(struct target *t)
{
    _cleanup_free_ char *target = NULL;
    t->what = "read sandbox symlink";
    int r = conch_ws__read_link(t->up, t->name, &target);
    if (r < 0)
        return r == -EINVAL ? -ESTALE : r;
    return put_node(t, target);
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
    return fchmodat(t->hp, t->name, commit_mode(ch, st.st_mode), AT_SYMLINK_NOFOLLOW) < 0 ? -errno
                                                                                          : 0;
}

static int fail(struct conch_err *err, const char *path, const char *what, int r)
{
    const char *why = strerror(-r);
    if (r == -ELOOP)
        why = "a component is a symlink on the host; refusing to follow it";
    else if (r == -EXDEV)
        why = "the path leaves the workspace or crosses a mount point";
    _cleanup_free_ char *q = conch_ws__qname(path);
    return conch_err_set(err, -r, "commit %s: %s: %s", q ? q : "(path)", what, why);
}

/* Opens @t's parent dirs on both sides. Returns 1 when there is nothing to do. */
static int open_parents(struct commit *c, const struct conch_ws_change *ch, struct target *t,
                        bool need_upper, struct conch_err *err)
{
    _cleanup_free_ char *parent = NULL;
    if (split(ch->path, &parent, &t->name) < 0)
        return fail(err, ch->path, "split path", -ENOMEM);
    /* Mount points are refused too: overlayfs never showed the sandbox what is mounted
     * below the host dir, so a change there would land somewhere it never saw. */
    t->hp = conch_open_beneath(c->host_fd, parent, O_PATH | O_DIRECTORY, 0, CONCH_BENEATH_NO_XDEV);
    if (t->hp < 0) {
        if (ch->kind == CONCH_CHANGE_DELETED && (t->hp == -ENOENT || t->hp == -ENOTDIR))
            return 1; /* already gone */
        return fail(err, ch->path, "open parent dir on the host", t->hp);
    }
    if (need_upper) {
        t->up = conch_open_beneath(c->upper_fd, parent, O_PATH | O_DIRECTORY, 0, 0);
        if (t->up < 0)
            return fail(err, ch->path, "open parent dir in the sandbox", t->up);
    }
    return 0;
}

/* Whether @ch writes a file's content (what counts against max_bytes). */
static bool writes_file(const struct conch_ws_change *ch)
{
    return ch->type == 'f' && ch->kind != CONCH_CHANGE_DELETED &&
           (ch->kind != CONCH_CHANGE_MODIFIED || ch->content_changed);
}

static int apply(struct commit *c, const struct conch_ws_change *ch, struct conch_err *err)
{
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
    t.host_mode = have_cur ? cur.st_mode & 07777 : 0;
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
        r = put_symlink(&t);
        break;
    default:
        /* conch_ws_change_skip_reason keeps these out; an entry of unknown type that
         * slipped past it (a hand-built list) is refused all the same. */
        r = -EOPNOTSUPP;
        t.what = "only files, directories and symlinks can be committed";
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

/* Why a path rule keeps a change out (conch_ws_change_skip_reason). */
static const char rule_ro[] = "a read-only path (path rule): never committed";
static const char rule_hidden[] = "a hidden path (path rule): never committed";
static const char rule_holds[] = "it holds a path a path rule protects: never removed or replaced";

static int cmp_change_ptr(const void *a, const void *b)
{
    const struct conch_ws_change *x = *(const struct conch_ws_change *const *)a;
    const struct conch_ws_change *y = *(const struct conch_ws_change *const *)b;
    return strcmp(x->path ? x->path : "", y->path ? y->path : "");
}

const char *conch_ws_change_skip_reason(const struct conch_ws_change *ch)
{
    if (ch->flags & CONCH_WS_F_RULE_HIDDEN)
        return rule_hidden;
    if (ch->flags & CONCH_WS_F_RULE_RO)
        return rule_ro;
    if (ch->flags & CONCH_WS_F_RULE_HOLDS)
        return rule_holds;
    if (ch->flags & CONCH_WS_F_TOO_DEEP)
        return "its entries lie deeper than PATH_MAX and cannot be committed";
    if (ch->flags & CONCH_WS_F_UNREADABLE)
        return "the sandbox made it unreadable, so its entries cannot be committed";
    if (ch->kind == CONCH_CHANGE_DELETED)
        return NULL;
    if (ch->flags & CONCH_WS_F_SOCKET)
        return "a unix socket is not committed (it means nothing outside the sandbox)";
    if (ch->flags & CONCH_WS_F_FIFO)
        return "a FIFO is not committed";
    if (ch->flags & CONCH_WS_F_DEVICE)
        return "a device node is never created on the host";
    return NULL;
}

void conch_ws_commit_report_done(struct conch_ws_commit_report *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        free(r->entries[i].reason);
    free(r->entries);
    memset(r, 0, sizeof(*r));
}

/* Records the outcome of entry @i in @rep (if any); @reason is copied. */
static void note(struct conch_ws_commit_report *rep, size_t i, enum conch_ws_commit_status st,
                 const char *reason)
{
    if (!rep || !rep->entries)
        return;
    struct conch_ws_commit_entry *e = &rep->entries[i];
    if (e->status == CONCH_WS_COMMIT_APPLIED)
        rep->applied--;
    e->status = st;
    free(e->reason);
    e->reason = reason ? strdup(reason) : NULL;
    if (st == CONCH_WS_COMMIT_APPLIED)
        rep->applied++;
    else if (st == CONCH_WS_COMMIT_SKIPPED)
        rep->skipped++;
    else if (st == CONCH_WS_COMMIT_FAILED)
        rep->failed++;
}

/* @path is @dir or lies beneath it. */
static bool at_or_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* The flag of the first of @rules (@n) that protects @ch, or 0. */
static unsigned rule_flag(const struct conch_ws_rule *rules, size_t n,
                          const struct conch_ws_change *ch)
{
    for (size_t i = 0; ch->path && i < n; i++) {
        const struct conch_ws_rule *r = &rules[i];
        if (at_or_under(ch->path, r->path))
            return r->hidden ? CONCH_WS_F_RULE_HIDDEN : CONCH_WS_F_RULE_RO;
        if ((ch->kind == CONCH_CHANGE_DELETED || ch->kind == CONCH_CHANGE_TYPE) &&
            at_or_under(r->path, ch->path))
            return CONCH_WS_F_RULE_HOLDS;
    }
    return 0;
}

void conch_ws_changes_mark_rules(struct conch_ws_changes *c, const struct conch_ws_rule *rules,
                                 size_t n)
{
    for (size_t i = 0; c && rules && i < c->n; i++)
        c->items[i].flags |= rule_flag(rules, n, &c->items[i]);
}

/* Why @ch is left out (a static string): by the commit's path rules, then by its kind. */
static const char *skip_reason(const struct commit *c, const struct conch_ws_change *ch)
{
    struct conch_ws_change marked = *ch;
    marked.flags |= rule_flag(c->rules, c->n_rules, ch);
    return conch_ws_change_skip_reason(&marked);
}

/* Checks what can be checked before anything is applied: paths and the total size. */
static int preflight(const struct commit *c, const struct conch_ws_change *const *order, size_t n,
                     struct conch_err *err)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const struct conch_ws_change *ch = order[i];
        if (!ch->path || !conch_ws__path_ok(ch->path)) {
            _cleanup_free_ char *q = ch->path ? conch_ws__qname(ch->path) : NULL;
            return conch_err_set(err, EINVAL, "commit %s: invalid path; nothing was applied",
                                 q ? q : "(null)");
        }
        if (writes_file(ch) && !skip_reason(c, ch))
            total += ch->size;
    }
    if (c->max_bytes && total > c->max_bytes)
        return conch_err_setk(err, CONCH_ERR_LIMIT, EFBIG,
                              "commit refused: the files to write hold %llu bytes (apparent "
                              "size, holes included), over the limit of %llu bytes (the disk "
                              "limit); nothing was applied",
                              (unsigned long long)total, (unsigned long long)c->max_bytes);
    return 0;
}

int conch_ws_commit(int upper_fd, int host_fd, const struct conch_ws_changes *changes,
                    const struct conch_ws_commit_opts *opts, struct conch_ws_commit_report *report,
                    struct conch_err *err)
{
    if (report)
        memset(report, 0, sizeof(*report));
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
        .max_bytes = opts ? opts->max_bytes : 0,
        .rules = opts ? opts->rules : NULL,
        .n_rules = opts && opts->rules ? opts->n_rules : 0,
    };

    /* Sorted by path, a parent comes before its children, whatever order we were given. */
    _cleanup_free_ const struct conch_ws_change **order = calloc(changes->n, sizeof(*order));
    _cleanup_free_ bool *ok = calloc(changes->n, sizeof(*ok));
    _cleanup_free_ char *buf = malloc(COPY_CHUNK);
    if (!order || !ok || !buf)
        return conch_err_set(err, ENOMEM, "commit: out of memory");
    if (report) {
        report->entries = calloc(changes->n, sizeof(*report->entries));
        if (!report->entries)
            return conch_err_set(err, ENOMEM, "commit: out of memory");
        report->n = changes->n;
    }
    c.buf = buf;
    for (size_t i = 0; i < changes->n; i++)
        order[i] = &changes->items[i];
    qsort(order, changes->n, sizeof(*order), cmp_change_ptr);
    for (size_t i = 0; report && i < changes->n; i++)
        report->entries[i].path = order[i]->path;

    int first = preflight(&c, order, changes->n, err);
    if (first < 0)
        return first;

    for (size_t i = 0; i < changes->n; i++) {
        const char *skip = skip_reason(&c, order[i]);
        if (skip) {
            note(report, i, CONCH_WS_COMMIT_SKIPPED, skip);
            continue;
        }
        struct conch_err e = {0};
        int r = apply(&c, order[i], &e);
        ok[i] = r >= 0;
        note(report, i, r >= 0 ? CONCH_WS_COMMIT_APPLIED : CONCH_WS_COMMIT_FAILED,
             r >= 0 ? NULL : e.msg);
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
        if (r < 0) {
            note(report, i, CONCH_WS_COMMIT_FAILED, e.msg);
            if (first == 0) {
                first = r;
                if (err)
                    *err = e;
            }
        }
    }
    if (report)
        report->bytes = c.written;
    return first;
}
