/* test_workspace.c - unit tests for the workspace module: scanning an overlay upper dir
 * (built by hand, and produced by a real overlayfs mount) and committing it to a host
 * dir, including symlink-escape attempts. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "jail/jail.h"
#include "workspace/workspace.h"
#include "workspace/ws-internal.h"

/* ---- building trees ---------------------------------------------------------------- */

static char base[64];
static char lower[128], upper[128], outside[128];

static void setup_dirs(void)
{
    umask(022);
    strcpy(base, "/tmp/conch-ws-XXXXXX");
    cr_assert_not_null(mkdtemp(base));
    snprintf(lower, sizeof(lower), "%s/lower", base);
    snprintf(upper, sizeof(upper), "%s/upper", base);
    snprintf(outside, sizeof(outside), "%s/outside", base);
    cr_assert_eq(mkdir(lower, 0755), 0);
    cr_assert_eq(mkdir(upper, 0755), 0);
    cr_assert_eq(mkdir(outside, 0755), 0);
}

static void teardown_dirs(void)
{
    char cmd[256];
    /* The overlay test mounts a tmpfs below base in its private mount namespace. */
    snprintf(cmd, sizeof(cmd), "%s/tmpfs", base);
    umount2(cmd, MNT_DETACH);
    snprintf(cmd, sizeof(cmd), "%s/lower/mnt", base);
    umount2(cmd, MNT_DETACH);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    if (base[0] && system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", base);
}

TestSuite(workspace, .init = setup_dirs, .fini = teardown_dirs, .timeout = 60);

static char *at(const char *root, const char *rel)
{
    static char bufs[8][512];
    static int i;
    char *b = bufs[i++ % 8];
    snprintf(b, sizeof(bufs[0]), "%s/%s", root, rel);
    return b;
}

static void put_n(const char *root, const char *rel, const void *data, size_t len, mode_t mode)
{
    int fd = open(at(root, rel), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "create %s/%s: %s", root, rel, strerror(errno));
    cr_assert_eq(write(fd, data, len), (ssize_t)len);
    cr_assert_eq(fchmod(fd, mode), 0);
    close(fd);
}

static void put(const char *root, const char *rel, const char *text, mode_t mode)
{
    put_n(root, rel, text, strlen(text), mode);
}

static void mkd(const char *root, const char *rel, mode_t mode)
{
    cr_assert_eq(mkdir(at(root, rel), mode), 0, "mkdir %s/%s: %s", root, rel, strerror(errno));
    cr_assert_eq(chmod(at(root, rel), mode), 0);
}

static void lnk(const char *root, const char *rel, const char *target)
{
    cr_assert_eq(symlink(target, at(root, rel)), 0, "symlink %s/%s: %s", root, rel,
                 strerror(errno));
}

static void whiteout(const char *root, const char *rel)
{
    cr_assert_eq(mknod(at(root, rel), S_IFCHR | 0, makedev(0, 0)), 0, "mknod %s: %s", rel,
                 strerror(errno));
}

static void opaque(const char *root, const char *rel)
{
    cr_assert_eq(setxattr(at(root, rel), "user.overlay.opaque", "y", 1, 0), 0, "setxattr on %s: %s",
                 rel, strerror(errno));
}

static int open_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    return fd;
}

static char *slurp(const char *path)
{
    static char buf[4096];
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n < 0)
        return NULL;
    buf[n] = '\0';
    return buf;
}

static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static mode_t perms(const char *path)
{
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0, "lstat %s: %s", path, strerror(errno));
    return st.st_mode & 07777;
}

/* ---- checking results -------------------------------------------------------------- */

static void scan(struct conch_ws_changes *out)
{
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    struct conch_err err = {0};
    int r = conch_ws_changes_scan(u, l, out, &err);
    cr_assert_eq(r, 0, "scan: %s", err.msg);
}

static const struct conch_ws_change *find(const struct conch_ws_changes *c, const char *path)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->items[i].path, path) == 0)
            return &c->items[i];
    return NULL;
}

static void dump(const struct conch_ws_changes *c)
{
    for (size_t i = 0; i < c->n; i++)
        fprintf(stderr, "  %-12s %c %s%s%s %04o->%04o\n",
                conch_ws_change_kind_name(c->items[i].kind), c->items[i].type, c->items[i].path,
                c->items[i].content_changed ? " [content]" : "",
                c->items[i].mode_changed ? " [mode]" : "", (unsigned)c->items[i].old_mode,
                (unsigned)c->items[i].new_mode);
}

/* Asserts @path is in @c with @kind and @type and returns it. */
static const struct conch_ws_change *expect(const struct conch_ws_changes *c, const char *path,
                                            enum conch_change_kind kind, char type)
{
    const struct conch_ws_change *ch = find(c, path);
    if (!ch)
        dump(c);
    cr_assert_not_null(ch, "'%s' not reported", path);
    cr_assert_eq(ch->kind, kind, "'%s': kind %s, expected %s", path,
                 conch_ws_change_kind_name(ch->kind), conch_ws_change_kind_name(kind));
    cr_assert_eq(ch->type, type, "'%s': type %c, expected %c", path, ch->type, type);
    return ch;
}

static void expect_sorted(const struct conch_ws_changes *c)
{
    for (size_t i = 1; i < c->n; i++)
        cr_assert_lt(strcmp(c->items[i - 1].path, c->items[i].path), 0, "not sorted at '%s'",
                     c->items[i].path);
}

/* Recursively compares two trees: names, types, permission bits, content, link targets. */
static bool trees_equal(const char *a, const char *b)
{
    struct stat sa, sb;
    if (lstat(a, &sa) < 0 || lstat(b, &sb) < 0) {
        fprintf(stderr, "tree diff: %s or %s missing\n", a, b);
        return false;
    }
    if ((sa.st_mode & S_IFMT) != (sb.st_mode & S_IFMT) ||
        (!S_ISLNK(sa.st_mode) && (sa.st_mode & 07777) != (sb.st_mode & 07777))) {
        fprintf(stderr, "tree diff: %s %o vs %s %o\n", a, sa.st_mode, b, sb.st_mode);
        return false;
    }
    if (S_ISLNK(sa.st_mode)) {
        char ta[512] = {0}, tb[512] = {0};
        if (readlink(a, ta, sizeof(ta) - 1) < 0 || readlink(b, tb, sizeof(tb) - 1) < 0 ||
            strcmp(ta, tb) != 0) {
            fprintf(stderr, "tree diff: link %s\n", a);
            return false;
        }
        return true;
    }
    if (S_ISREG(sa.st_mode)) {
        if (sa.st_size != sb.st_size) {
            fprintf(stderr, "tree diff: size %s\n", a);
            return false;
        }
        FILE *fa = fopen(a, "rbe"), *fb = fopen(b, "rbe");
        bool same = fa && fb;
        while (same) {
            int ca = fgetc(fa), cb = fgetc(fb);
            same = ca == cb;
            if (ca == EOF)
                break;
        }
        if (fa)
            fclose(fa);
        if (fb)
            fclose(fb);
        if (!same)
            fprintf(stderr, "tree diff: content %s\n", a);
        return same;
    }
    if (!S_ISDIR(sa.st_mode))
        return true;
    /* Same entry count, and every entry of a matches in b. */
    for (int pass = 0; pass < 2; pass++) {
        const char *x = pass ? b : a, *y = pass ? a : b;
        DIR *d = opendir(x);
        cr_assert_not_null(d);
        struct dirent *de;
        bool ok = true;
        while (ok && (de = readdir(d))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            char px[1024], py[1024];
            snprintf(px, sizeof(px), "%s/%s", x, de->d_name);
            snprintf(py, sizeof(py), "%s/%s", y, de->d_name);
            ok = pass ? exists(py) : trees_equal(px, py);
            if (!ok && pass)
                fprintf(stderr, "tree diff: extra %s\n", px);
        }
        closedir(d);
        if (!ok)
            return false;
    }
    return true;
}

/* Walks @root for leftover temporary files of a commit. */
static bool has_tmp_leftovers(const char *root)
{
    DIR *d = opendir(root);
    if (!d)
        return false;
    bool found = false;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (!strncmp(de->d_name, ".conch-tmp-", 11))
            found = true;
        else if (de->d_type == DT_DIR)
            found = has_tmp_leftovers(at(root, de->d_name));
    }
    closedir(d);
    return found;
}

static int commit(const struct conch_ws_changes *c, const struct conch_ws_commit_opts *opts,
                  struct conch_err *err)
{
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    return conch_ws_commit(u, h, c, opts, NULL, err);
}

static const struct conch_ws_commit_opts default_owner = {.new_uid = (uid_t)-1,
                                                          .new_gid = (gid_t)-1};

/* ---- names ------------------------------------------------------------------------- */

Test(workspace, mode_names_round_trip)
{
    const char *names[] = {"overlay", "ro", "rw"};
    for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
        enum conch_ws_mode m = CONCH_WS_RW;
        struct conch_err err = {0};
        cr_assert_eq(conch_ws_mode_parse(names[i], &m, &err), 0);
        cr_assert_str_eq(conch_ws_mode_name(m), names[i]);
    }
    enum conch_ws_mode m = CONCH_WS_RO;
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_mode_parse("overlayfs", &m, &err), -EINVAL);
    cr_assert_eq(m, CONCH_WS_RO, "output written on failure");
    cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    cr_assert_not_null(strstr(err.msg, "'overlayfs'"), "%s", err.msg);
    cr_assert_str_eq(conch_ws_change_kind_name(CONCH_CHANGE_ADDED), "added");
    cr_assert_str_eq(conch_ws_change_kind_name(CONCH_CHANGE_MODIFIED), "modified");
    cr_assert_str_eq(conch_ws_change_kind_name(CONCH_CHANGE_DELETED), "deleted");
    cr_assert_str_eq(conch_ws_change_kind_name(CONCH_CHANGE_TYPE), "type_changed");
    struct conch_ws_changes zero = {0};
    conch_ws_changes_done(&zero);
}

Test(workspace, scan_errors_leave_output_alone)
{
    struct conch_ws_changes c = {.items = (void *)&c, .n = 42};
    struct conch_err err = {0};
    _cleanup_close_ int l = open_dir(lower);
    cr_assert_eq(conch_ws_changes_scan(-1, l, &c, &err), -EBADF);
    cr_assert_eq(err.code, EBADF);
    cr_assert_neq(err.msg[0], '\0');
    cr_assert_eq(c.n, 42, "output written on failure");
    /* An empty change list is a no-op. */
    cr_assert_eq(commit(&(struct conch_ws_changes){0}, NULL, &err), 0);
}

/* ---- scan, hand-built layers ------------------------------------------------------- */

/* A lower tree and an upper that changes it in every basic way. */
static void build_basic(void)
{
    put(lower, "a.txt", "hello\n", 0644);
    put(lower, "b.txt", "bye\n", 0644);
    put(lower, "same.txt", "same\n", 0644);
    put(lower, "samesize.txt", "abcd\n", 0644);
    put(lower, "mode.sh", "#!/bin/sh\n", 0644);
    lnk(lower, "link", "a.txt");
    lnk(lower, "samelink", "a.txt");
    mkd(lower, "dir", 0755);
    mkd(lower, "dir/sub", 0755);
    put(lower, "dir/sub/x", "x\n", 0644);
    mkd(lower, "chmoddir", 0755);
    mkd(lower, "gone", 0755);
    put(lower, "gone/one", "1\n", 0644);
    mkd(lower, "gone/deeper", 0755);
    put(lower, "gone/deeper/two", "2\n", 0644);

    put(upper, "a.txt", "hello world\n", 0644); /* content */
    put(upper, "same.txt", "same\n", 0644);     /* copy-up, unchanged */
    put(upper, "samesize.txt", "abce\n", 0644); /* same size, other bytes */
    put(upper, "mode.sh", "#!/bin/sh\n", 0755); /* mode only */
    lnk(upper, "link", "b.txt");                /* retargeted */
    lnk(upper, "samelink", "a.txt");            /* copy-up, unchanged */
    whiteout(upper, "b.txt");                   /* deleted file */
    whiteout(upper, "gone");                    /* deleted tree */
    whiteout(upper, "never-existed");           /* whiteout over nothing */
    mkd(upper, "dir", 0755);                    /* copied-up parent */
    mkd(upper, "dir/sub", 0755);
    put(upper, "dir/sub/y", "y\n", 0600); /* added deep */
    mkd(upper, "chmoddir", 0700);         /* dir mode only */
    put(upper, "new.txt", "new\n", 0640);
    mkd(upper, "newdir", 0755);
    mkd(upper, "newdir/inner", 0750);
    put(upper, "newdir/inner/f", "f\n", 0644);
    lnk(upper, "newdir/l", "../a.txt");
    char bin[100] = "ELF";
    bin[50] = 'x';
    put_n(upper, "bin.dat", bin, sizeof(bin), 0755);
}

Test(workspace, scan_reports_every_basic_change)
{
    build_basic();
    struct conch_ws_changes c = {0};
    scan(&c);
    expect_sorted(&c);

    const struct conch_ws_change *ch = expect(&c, "a.txt", CONCH_CHANGE_MODIFIED, 'f');
    cr_assert(ch->content_changed && !ch->mode_changed);
    cr_assert_eq(ch->size, 12);
    cr_assert(!ch->binary);
    ch = expect(&c, "samesize.txt", CONCH_CHANGE_MODIFIED, 'f');
    cr_assert(ch->content_changed && !ch->mode_changed);
    ch = expect(&c, "mode.sh", CONCH_CHANGE_MODIFIED, 'f');
    cr_assert(!ch->content_changed && ch->mode_changed);
    cr_assert_eq(ch->old_mode, 0644);
    cr_assert_eq(ch->new_mode, 0755);
    ch = expect(&c, "link", CONCH_CHANGE_MODIFIED, 'l');
    cr_assert(ch->content_changed);
    ch = expect(&c, "b.txt", CONCH_CHANGE_DELETED, 'f');
    cr_assert_eq(ch->old_mode, 0644);
    cr_assert_eq(ch->new_mode, 0);
    expect(&c, "gone", CONCH_CHANGE_DELETED, 'd');
    expect(&c, "dir/sub/y", CONCH_CHANGE_ADDED, 'f');
    ch = expect(&c, "chmoddir", CONCH_CHANGE_MODIFIED, 'd');
    cr_assert(ch->mode_changed && !ch->content_changed);
    cr_assert_eq(ch->new_mode, 0700);
    ch = expect(&c, "new.txt", CONCH_CHANGE_ADDED, 'f');
    cr_assert_eq(ch->new_mode, 0640);
    cr_assert_eq(ch->old_mode, 0);
    cr_assert_eq(ch->size, 4);
    expect(&c, "newdir", CONCH_CHANGE_ADDED, 'd');
    ch = expect(&c, "newdir/inner", CONCH_CHANGE_ADDED, 'd');
    cr_assert_eq(ch->new_mode, 0750);
    expect(&c, "newdir/inner/f", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "newdir/l", CONCH_CHANGE_ADDED, 'l');
    ch = expect(&c, "bin.dat", CONCH_CHANGE_ADDED, 'f');
    cr_assert(ch->binary);
    cr_assert_eq(ch->size, 100);

    /* Nothing else: no unchanged copy-ups, no parents present on both sides, nothing
     * beneath a deleted dir, nothing for a whiteout over nothing. */
    cr_assert_null(find(&c, "same.txt"));
    cr_assert_null(find(&c, "samelink"));
    cr_assert_null(find(&c, "dir"));
    cr_assert_null(find(&c, "dir/sub"));
    cr_assert_null(find(&c, "gone/one"));
    cr_assert_null(find(&c, "never-existed"));
    if (c.n != 14)
        dump(&c);
    cr_assert_eq(c.n, 14);
    conch_ws_changes_done(&c);
    cr_assert_null(c.items);
    cr_assert_eq(c.n, 0);
}

Test(workspace, scan_type_changes)
{
    put(lower, "f2d", "file\n", 0644);
    mkd(lower, "d2f", 0755);
    put(lower, "d2f/child", "c\n", 0644);
    lnk(lower, "l2f", "f2d");
    put(lower, "f2l", "file\n", 0644);

    mkd(upper, "f2d", 0755);
    opaque(upper, "f2d");
    put(upper, "f2d/inner", "in\n", 0644);
    put(upper, "d2f", "now a file\n", 0600);
    put(upper, "l2f", "now a file\n", 0644);
    lnk(upper, "f2l", "elsewhere");

    struct conch_ws_changes c = {0};
    scan(&c);
    const struct conch_ws_change *ch = expect(&c, "f2d", CONCH_CHANGE_TYPE, 'd');
    cr_assert_eq(ch->old_mode, 0644);
    cr_assert_eq(ch->new_mode, 0755);
    expect(&c, "f2d/inner", CONCH_CHANGE_ADDED, 'f');
    ch = expect(&c, "d2f", CONCH_CHANGE_TYPE, 'f');
    cr_assert_eq(ch->size, 11);
    expect(&c, "l2f", CONCH_CHANGE_TYPE, 'f');
    expect(&c, "f2l", CONCH_CHANGE_TYPE, 'l');
    cr_assert_null(find(&c, "d2f/child"));
    cr_assert_eq(c.n, 5);
    conch_ws_changes_done(&c);
}

Test(workspace, scan_opaque_dir_deletes_what_it_hides)
{
    mkd(lower, "d", 0755);
    put(lower, "d/kept", "k\n", 0644);
    put(lower, "d/dropped", "x\n", 0644);
    mkd(lower, "d/subtree", 0755);
    put(lower, "d/subtree/deep", "x\n", 0644);
    mkd(lower, "d/again", 0755);
    put(lower, "d/again/old", "o\n", 0644);
    put(lower, "d/again/same", "s\n", 0644);

    /* rm -rf d; mkdir d; recreate d/kept identically, d/again with one old file. */
    mkd(upper, "d", 0755);
    opaque(upper, "d");
    put(upper, "d/kept", "k\n", 0644);
    put(upper, "d/new", "n\n", 0644);
    mkd(upper, "d/again", 0755); /* not itself opaque: overlay never merged below d */
    put(upper, "d/again/same", "s\n", 0644);

    struct conch_ws_changes c = {0};
    scan(&c);
    expect(&c, "d/dropped", CONCH_CHANGE_DELETED, 'f');
    expect(&c, "d/subtree", CONCH_CHANGE_DELETED, 'd');
    expect(&c, "d/new", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "d/again/old", CONCH_CHANGE_DELETED, 'f');
    cr_assert_null(find(&c, "d"));
    cr_assert_null(find(&c, "d/kept"));
    cr_assert_null(find(&c, "d/subtree/deep"), "only the top of a hidden subtree");
    cr_assert_null(find(&c, "d/again"));
    cr_assert_null(find(&c, "d/again/same"));
    if (c.n != 4)
        dump(&c);
    cr_assert_eq(c.n, 4);
    expect_sorted(&c);
    conch_ws_changes_done(&c);
}

Test(workspace, scan_accepts_xattr_whiteouts_and_ignores_opaque_x)
{
    put(lower, "f", "f\n", 0644);
    mkd(lower, "d", 0755);
    put(lower, "d/keep", "k\n", 0644);
    put(upper, "f", "", 0644);
    cr_assert_eq(setxattr(at(upper, "f"), "user.overlay.whiteout", "", 0, 0), 0);
    /* "x" = "holds xattr whiteouts", not opaque (Linux 6.7+). */
    mkd(upper, "d", 0755);
    cr_assert_eq(setxattr(at(upper, "d"), "user.overlay.opaque", "x", 1, 0), 0);
    /* An empty file without the xattr is just an empty file. */
    put(upper, "empty", "", 0644);

    struct conch_ws_changes c = {0};
    scan(&c);
    expect(&c, "f", CONCH_CHANGE_DELETED, 'f');
    expect(&c, "empty", CONCH_CHANGE_ADDED, 'f');
    cr_assert_null(find(&c, "d/keep"));
    cr_assert_eq(c.n, 2);
    conch_ws_changes_done(&c);
}

Test(workspace, scan_never_follows_symlinks)
{
    /* The upper holds a symlink to a dir full of files: it is one added symlink, and the
     * lower's symlink to outside is compared as a link, not walked. */
    put(outside, "secret", "s\n", 0644);
    lnk(upper, "esc", outside);
    lnk(lower, "old", outside);
    lnk(upper, "old", outside);
    struct conch_ws_changes c = {0};
    scan(&c);
    expect(&c, "esc", CONCH_CHANGE_ADDED, 'l');
    cr_assert_eq(c.n, 1);
    conch_ws_changes_done(&c);
}

/* ---- commit ------------------------------------------------------------------------ */

Test(workspace, commit_applies_exactly_the_changes)
{
    build_basic();
    cr_assert_eq(chown(lower, 1234, 1235), 0);
    cr_assert_eq(chown(at(lower, "a.txt"), 4321, 4322), 0);

    struct conch_ws_changes c = {0};
    scan(&c);
    struct conch_err err = {0};
    int r = commit(&c, &default_owner, &err);
    cr_assert_eq(r, 0, "commit: %s", err.msg);
    conch_ws_changes_done(&c);

    /* The host now matches the merged view: scanning again finds nothing. */
    scan(&c);
    if (c.n)
        dump(&c);
    cr_assert_eq(c.n, 0);
    conch_ws_changes_done(&c);

    cr_assert_str_eq(slurp(at(lower, "a.txt")), "hello world\n");
    cr_assert_str_eq(slurp(at(lower, "same.txt")), "same\n");
    cr_assert_eq(perms(at(lower, "mode.sh")), 0755);
    cr_assert_eq(perms(at(lower, "chmoddir")), 0700);
    cr_assert(!exists(at(lower, "b.txt")));
    cr_assert(!exists(at(lower, "gone")));
    cr_assert_str_eq(slurp(at(lower, "newdir/inner/f")), "f\n");
    cr_assert_eq(perms(at(lower, "newdir/inner")), 0750);
    char t[64] = {0};
    cr_assert_gt(readlink(at(lower, "link"), t, sizeof(t) - 1), 0);
    cr_assert_str_eq(t, "b.txt");
    cr_assert(!has_tmp_leftovers(lower));

    struct stat st;
    cr_assert_eq(lstat(at(lower, "a.txt"), &st), 0);
    cr_assert_eq(st.st_uid, 4321, "modified file keeps its owner");
    cr_assert_eq(st.st_gid, 4322);
    cr_assert_eq(lstat(at(lower, "new.txt"), &st), 0);
    cr_assert_eq(st.st_uid, 1234, "added file owned by the host root's owner");
    cr_assert_eq(st.st_gid, 1235);
    cr_assert_eq(lstat(at(lower, "newdir/l"), &st), 0);
    cr_assert_eq(st.st_uid, 1234);
    cr_assert_eq(lstat(at(lower, "newdir/inner"), &st), 0);
    cr_assert_eq(st.st_uid, 1234);
}

Test(workspace, commit_type_changes_and_explicit_owner)
{
    put(lower, "f2d", "file\n", 0644);
    mkd(lower, "d2f", 0755);
    mkd(lower, "d2f/sub", 0755);
    put(lower, "d2f/sub/child", "c\n", 0644);
    lnk(lower, "d2f/sub/esc", outside);
    put(outside, "precious", "p\n", 0644);
    lnk(lower, "l2f", "f2d");
    put(lower, "f2l", "file\n", 0644);
    mkd(upper, "f2d", 0555); /* read-only dir that still gets a child */
    opaque(upper, "f2d");
    put(upper, "f2d/inner", "in\n", 0644);
    put(upper, "d2f", "now a file\n", 0600);
    put(upper, "l2f", "now a file\n", 0644);
    lnk(upper, "f2l", "elsewhere");
    cr_assert_eq(mkfifo(at(upper, "fifo"), 0620), 0);

    struct conch_ws_changes c = {0};
    scan(&c);
    struct conch_ws_commit_opts opts = {.new_uid = 777, .new_gid = 778};
    struct conch_err err = {0};
    cr_assert_eq(commit(&c, &opts, &err), 0, "commit: %s", err.msg);
    conch_ws_changes_done(&c);
    scan(&c);
    if (c.n != 1)
        dump(&c);
    /* A FIFO is never committed: it stays a pending change. */
    cr_assert_eq(c.n, 1);
    cr_assert_str_eq(c.items[0].path, "fifo");
    conch_ws_changes_done(&c);

    cr_assert_eq(perms(at(lower, "f2d")), 0555);
    cr_assert_str_eq(slurp(at(lower, "f2d/inner")), "in\n");
    cr_assert_str_eq(slurp(at(lower, "d2f")), "now a file\n");
    cr_assert_str_eq(slurp(at(outside, "precious")), "p\n");
    struct stat st;
    cr_assert(!exists(at(lower, "fifo")));
    cr_assert_eq(lstat(at(lower, "f2d/inner"), &st), 0);
    cr_assert_eq(st.st_uid, 777);
    cr_assert_eq(st.st_gid, 778);
    cr_assert_eq(lstat(at(lower, "d2f"), &st), 0);
    cr_assert_eq(st.st_uid, 0, "a type change keeps the old entry's owner");
}

Test(workspace, commit_drops_set_id_bits)
{
    put(lower, "was", "x\n", 0755);
    put(upper, "was", "x\n", 06755);
    put(upper, "new", "x\n", 04711);
    mkd(upper, "dir", 02775);
    struct conch_ws_changes c = {0};
    scan(&c);
    cr_assert(expect(&c, "was", CONCH_CHANGE_MODIFIED, 'f')->mode_changed);
    cr_assert_eq(c.n, 3);
    struct conch_err err = {0};
    cr_assert_eq(commit(&c, &default_owner, &err), 0, "%s", err.msg);
    conch_ws_changes_done(&c);
    cr_assert_eq(perms(at(lower, "was")), 0755);
    cr_assert_eq(perms(at(lower, "new")), 0711);
    cr_assert_eq(perms(at(lower, "dir")), 0755,
                 "no set-gid dir reaches the host, nor group write the host did not give");
}

Test(workspace, commit_refuses_symlink_in_host_path)
{
    /* The host dir has `link -> outside`; a change list naming link/passwd must not
     * write through it. */
    lnk(lower, "link", outside);
    mkd(upper, "link", 0755);
    put(upper, "link/passwd", "root::0:0::/:/bin/sh\n", 0644);
    put(upper, "ok.txt", "fine\n", 0644);
    struct conch_ws_change items[] = {
        {.path = "link/passwd", .kind = CONCH_CHANGE_ADDED, .type = 'f', .new_mode = 0644},
        {.path = "ok.txt", .kind = CONCH_CHANGE_ADDED, .type = 'f', .new_mode = 0644},
    };
    struct conch_ws_changes c = {.items = items, .n = 2};
    struct conch_err err = {0};
    int r = commit(&c, &default_owner, &err);
    cr_assert_eq(r, -ELOOP, "commit returned %d: %s", r, err.msg);
    cr_assert_not_null(strstr(err.msg, "'link/passwd'"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "symlink"), "%s", err.msg);
    cr_assert(!exists(at(outside, "passwd")), "wrote outside the host dir");
    cr_assert(!has_tmp_leftovers(outside));
    /* The rest was still applied. */
    cr_assert_str_eq(slurp(at(lower, "ok.txt")), "fine\n");
}

Test(workspace, commit_refuses_symlink_planted_after_scan)
{
    mkd(lower, "sub", 0755);
    mkd(upper, "sub", 0755);
    put(upper, "sub/new", "n\n", 0644);
    mkd(upper, "sub/newdir", 0755);
    struct conch_ws_changes c = {0};
    scan(&c);
    cr_assert_eq(c.n, 2);
    /* Between scan and commit, the host's sub becomes a symlink out. */
    cr_assert_eq(rmdir(at(lower, "sub")), 0);
    lnk(lower, "sub", outside);
    struct conch_err err = {0};
    int r = commit(&c, &default_owner, &err);
    conch_ws_changes_done(&c);
    cr_assert_eq(r, -ELOOP, "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "'sub/new'"), "%s", err.msg);
    cr_assert(!exists(at(outside, "new")));
    cr_assert(!exists(at(outside, "newdir")));
}

Test(workspace, commit_rejects_bad_paths)
{
    put(upper, "x", "x\n", 0644);
    const char *bad[] = {"../x", "/x", "a/../../x", "", "a//x", "./x", "x/"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        struct conch_ws_change item = {
            .path = (char *)bad[i], .kind = CONCH_CHANGE_ADDED, .type = 'f', .new_mode = 0644};
        struct conch_ws_changes c = {.items = &item, .n = 1};
        struct conch_err err = {0};
        cr_assert_eq(commit(&c, &default_owner, &err), -EINVAL, "'%s' accepted", bad[i]);
    }
    cr_assert(!exists(at(base, "x")));
}

Test(workspace, commit_delete_tree_keeps_symlink_targets)
{
    put(outside, "target", "keep me\n", 0644);
    mkd(outside, "tdir", 0755);
    put(outside, "tdir/inner", "keep me too\n", 0644);
    mkd(lower, "d", 0755);
    put(lower, "d/file", "f\n", 0644);
    mkd(lower, "d/sub", 0700);
    lnk(lower, "d/sub/to-dir", outside);
    lnk(lower, "d/sub/to-file", at(outside, "target"));
    lnk(lower, "d/to-tdir", "../../outside/tdir");
    lnk(lower, "top-link", at(outside, "tdir"));
    whiteout(upper, "d");
    whiteout(upper, "top-link");

    struct conch_ws_changes c = {0};
    scan(&c);
    expect(&c, "d", CONCH_CHANGE_DELETED, 'd');
    expect(&c, "top-link", CONCH_CHANGE_DELETED, 'l');
    cr_assert_eq(c.n, 2);
    struct conch_err err = {0};
    cr_assert_eq(commit(&c, NULL, &err), 0, "%s", err.msg);
    conch_ws_changes_done(&c);
    cr_assert(!exists(at(lower, "d")));
    cr_assert(!exists(at(lower, "top-link")));
    cr_assert_str_eq(slurp(at(outside, "target")), "keep me\n");
    cr_assert_str_eq(slurp(at(outside, "tdir/inner")), "keep me too\n");
}

/* ---- path resolution ---------------------------------------------------------------- */

/* openat2 and the component walk used when openat2 is missing must agree. */
Test(workspace, resolution_fallback_matches_openat2)
{
    mkd(lower, "d", 0755);
    mkd(lower, "d/sub", 0755);
    put(lower, "d/file", "f\n", 0644);
    lnk(lower, "link", outside);
    lnk(lower, "d/uplink", "..");
    mkd(lower, "mnt", 0755);
    mkd(lower, "mnt/under", 0755);
    _cleanup_close_ int root = open_dir(lower);
    static const struct {
        const char *path;
        int flags;
        int want; /* 0: success */
    } cases[] = {
        {"", O_PATH | O_DIRECTORY, 0},
        {"d", O_PATH | O_DIRECTORY, 0},
        {"d/sub", O_RDONLY | O_DIRECTORY, 0},
        {"d/file", O_RDONLY, 0},
        {"link", O_PATH | O_DIRECTORY, -ELOOP},
        {"link", O_RDONLY | O_DIRECTORY, -ELOOP},
        {"link/x", O_PATH | O_DIRECTORY, -ELOOP},
        {"d/uplink/d", O_PATH | O_DIRECTORY, -ELOOP},
        {"d/file/x", O_PATH, -ENOTDIR},
        {"d/missing/x", O_PATH, -ENOENT},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        for (int walk = 0; walk < 2; walk++) {
            int fd = walk ? conch_open_beneath_walk(root, cases[i].path, cases[i].flags, 0, false)
                          : conch_open_beneath(root, cases[i].path, cases[i].flags, 0, 0);
            if (cases[i].want == 0) {
                cr_assert_geq(fd, 0, "%s '%s': %s", walk ? "walk" : "openat2", cases[i].path,
                              strerror(-fd));
                struct stat a, b;
                cr_assert_eq(fstat(fd, &a), 0);
                cr_assert_eq(lstat(at(lower, cases[i].path), &b), 0);
                cr_assert(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
                cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
                close(fd);
            } else {
                cr_assert_eq(fd, cases[i].want, "%s '%s': got %d", walk ? "walk" : "openat2",
                             cases[i].path, fd);
            }
        }
    }
    cr_assert_eq(conch_open_beneath_walk(root, "d/../..", O_PATH, 0, false), -EINVAL);
    cr_assert_eq(conch_open_beneath_walk(root, "..", O_PATH, 0, false), -EINVAL);
    /* EXDEV from openat2; EINVAL from the walk when openat2 is missing (valgrind). */
    int esc = conch_open_beneath(root, "d/../..", O_PATH, 0, 0);
    cr_assert(esc == -EXDEV || esc == -EINVAL, "escape gave %d", esc);

    /* A mount below the root is refused with no_xdev, on both paths. */
    if (unshare(CLONE_NEWNS) < 0)
        cr_skip_test("unshare(CLONE_NEWNS): %s", strerror(errno));
    cr_assert_eq(mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL), 0);
    cr_assert_eq(mount("tmpfs", at(lower, "mnt"), "tmpfs", 0, "mode=0755"), 0);
    mkd(lower, "mnt/inside", 0755);
    /* An fd opened before unshare() still sees the old namespace's mounts. */
    close(root);
    root = open_dir(lower);
    int fd = conch_open_beneath(root, "mnt/inside", O_PATH | O_DIRECTORY, 0, CONCH_BENEATH_NO_XDEV);
    cr_assert_eq(fd, -EXDEV, "openat2 crossed a mount: %d", fd);
    fd = conch_open_beneath_walk(root, "mnt/inside", O_PATH | O_DIRECTORY, 0, true);
    cr_assert_eq(fd, -EXDEV, "walk crossed a mount: %d", fd);
    fd = conch_open_beneath_walk(root, "mnt", O_PATH | O_DIRECTORY, 0, true);
    cr_assert_eq(fd, -EXDEV, "walk opened a mount point: %d", fd);
    umount2(at(lower, "mnt"), MNT_DETACH);
}

/* ---- a real overlay ---------------------------------------------------------------- */

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int r = system(cmd);
    cr_assert_eq(r, 0, "'%s' failed (%d)", cmd, r);
}

Test(workspace, real_overlay_round_trip)
{
    char layer[80], work[128], merged[128], snap[128];
    /* Criterion runs each test in its own process: the new mount namespace and everything
     * mounted in it go away with the test. */
    if (unshare(CLONE_NEWNS) < 0)
        cr_skip_test("unshare(CLONE_NEWNS): %s", strerror(errno));
    cr_assert_eq(mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL), 0);
    snprintf(layer, sizeof(layer), "%s/tmpfs", base);
    snprintf(work, sizeof(work), "%s/work", layer);
    snprintf(merged, sizeof(merged), "%s/merged", base);
    snprintf(snap, sizeof(snap), "%s/snap", base);
    cr_assert_eq(mkdir(layer, 0755), 0);
    cr_assert_eq(mkdir(merged, 0755), 0);
    cr_assert_eq(mount("tmpfs", layer, "tmpfs", 0, "mode=0755"), 0, "%s", strerror(errno));
    /* The upper lives on the tmpfs, as in conch. */
    snprintf(upper, sizeof(upper), "%s/upper", layer);
    cr_assert_eq(mkdir(upper, 0755), 0);
    cr_assert_eq(mkdir(work, 0755), 0);

    put(lower, "a.txt", "hello\n", 0644);
    put(lower, "b.txt", "bye\n", 0644);
    put(lower, "c.txt", "renamed\n", 0644);
    put(lower, "keep.txt", "keep\n", 0644);
    put(lower, "mode.sh", "#!/bin/sh\n", 0644);
    put(lower, "f", "file becomes dir\n", 0644);
    mkd(lower, "d", 0755);
    put(lower, "d/same", "same\n", 0644);
    put(lower, "d/old", "old\n", 0644);
    mkd(lower, "d/sub", 0755);
    put(lower, "d/sub/x", "x\n", 0644);
    mkd(lower, "gone", 0755);
    put(lower, "gone/one", "1\n", 0644);
    mkd(lower, "olddir", 0755);
    put(lower, "olddir/x", "x\n", 0644);
    mkd(lower, "untouched", 0755);
    put(lower, "untouched/u", "u\n", 0644);

    char opts[768];
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", lower, upper,
             work);
    if (mount("overlay", merged, "overlay", 0, opts) < 0)
        cr_skip_test("mount overlay: %s", strerror(errno));

    put(merged, "new.txt", "new\n", 0644);
    put(merged, "a.txt", "hello world\n", 0644);
    cr_assert_eq(unlink(at(merged, "b.txt")), 0);
    cr_assert_eq(rename(at(merged, "c.txt"), at(merged, "c2.txt")), 0);
    sh("mv '%s/olddir' '%s/newdir'", merged, merged); /* EXDEV without redirect_dir */
    cr_assert_eq(chmod(at(merged, "mode.sh"), 0755), 0);
    lnk(merged, "newlink", "a.txt");
    mkd(merged, "emptydir", 0755);
    char bin[64] = {0x7f, 'E', 'L', 'F', 0, 1, 2};
    put_n(merged, "bin.dat", bin, sizeof(bin), 0755);
    cr_assert_eq(unlink(at(merged, "f")), 0);
    mkd(merged, "f", 0755);
    put(merged, "f/inner", "inner\n", 0644);
    sh("rm -rf '%s/d' && mkdir '%s/d'", merged, merged);
    put(merged, "d/same", "same\n", 0644);
    put(merged, "d/new", "new\n", 0644);
    sh("rm -rf '%s/gone'", merged);
    int fd = open(at(merged, "keep.txt"), O_WRONLY | O_CLOEXEC); /* copy-up, no change */
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert(exists(at(upper, "keep.txt")), "expected a copy-up");

    sh("cp -a '%s' '%s'", merged, snap);
    cr_assert_eq(umount(merged), 0);

    struct conch_ws_changes c = {0};
    scan(&c);
    expect_sorted(&c);
    expect(&c, "a.txt", CONCH_CHANGE_MODIFIED, 'f');
    expect(&c, "b.txt", CONCH_CHANGE_DELETED, 'f');
    cr_assert(expect(&c, "bin.dat", CONCH_CHANGE_ADDED, 'f')->binary);
    expect(&c, "c.txt", CONCH_CHANGE_DELETED, 'f');
    expect(&c, "c2.txt", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "d/new", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "d/old", CONCH_CHANGE_DELETED, 'f');
    expect(&c, "d/sub", CONCH_CHANGE_DELETED, 'd');
    expect(&c, "emptydir", CONCH_CHANGE_ADDED, 'd');
    expect(&c, "f", CONCH_CHANGE_TYPE, 'd');
    expect(&c, "f/inner", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "gone", CONCH_CHANGE_DELETED, 'd');
    const struct conch_ws_change *ch = expect(&c, "mode.sh", CONCH_CHANGE_MODIFIED, 'f');
    cr_assert(ch->mode_changed && !ch->content_changed);
    expect(&c, "new.txt", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "newdir", CONCH_CHANGE_ADDED, 'd');
    expect(&c, "newdir/x", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "newlink", CONCH_CHANGE_ADDED, 'l');
    expect(&c, "olddir", CONCH_CHANGE_DELETED, 'd');
    cr_assert_null(find(&c, "keep.txt"));
    cr_assert_null(find(&c, "d/same"));
    if (c.n != 18)
        dump(&c);
    cr_assert_eq(c.n, 18);

    struct conch_err err = {0};
    cr_assert_eq(commit(&c, &default_owner, &err), 0, "commit: %s", err.msg);
    conch_ws_changes_done(&c);
    cr_assert(trees_equal(lower, snap), "host differs from the sandbox's view");
    cr_assert(!has_tmp_leftovers(lower));
    umount(layer);
}

/* ---- issue 6: quoting, paging, depth, holes, limits and commit policy -------------- */

Test(workspace, quote_like_git)
{
    static const struct {
        const char *in;
        bool ascii;
        const char *want;
    } cases[] = {
        {"plain/name.txt", true, "a/plain/name.txt"},
        {"with space", true, "a/with space"},
        {"na\nme", true, "\"a/na\\nme\""},
        {"x\n+++ b/evil", true, "\"a/x\\n+++ b/evil\""},
        {"tab\there\"q\\", true, "\"a/tab\\there\\\"q\\\\\""},
        {"esc\033[31m", true, "\"a/esc\\033[31m\""},
        {"caf\xc3\xa9", true, "\"a/caf\\303\\251\""},
        {"caf\xc3\xa9", false, "a/caf\xc3\xa9"},
        {"bad\xff", false, "\"a/bad\\377\""},
        {"c1\xc2\x9b"
         "1m",
         false, "\"a/c1\\302\\2331m\""},
        {"del\x7f", false, "\"a/del\\177\""},
    };
    for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
        _cleanup_free_ char *q = conch_ws_quote("a/", cases[i].in, cases[i].ascii);
        cr_assert_str_eq(q, cases[i].want, "case %zu", i);
    }
}

/* A page of the scan is exactly the same window of the full, sorted list. */
Test(workspace, scan_page_is_a_window_of_the_full_scan)
{
    mkd(upper, "d", 0755);
    mkd(upper, "d-x", 0755);
    for (int i = 0; i < 40; i++) {
        char name[32];
        snprintf(name, sizeof(name), "%s/f%02d", i % 2 ? "d" : "d-x", 39 - i);
        put(upper, name, "x\n", 0644);
    }
    put(upper, "d.txt", "y\n", 0644);
    struct conch_ws_changes all = {0};
    scan(&all);
    cr_assert_eq(all.n, 43);
    cr_assert_eq(all.total, 43);
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    static const size_t windows[][2] = {{0, 1},  {0, 10}, {5, 7}, {40, 10},
                                        {43, 5}, {60, 5}, {3, 0}};
    for (size_t w = 0; w < ARRAY_SIZE(windows); w++) {
        size_t off = windows[w][0], lim = windows[w][1];
        struct conch_ws_changes page = {0};
        struct conch_err err = {0};
        cr_assert_eq(conch_ws_changes_scan_page(u, l, off, lim, &page, &err), 0, "%s", err.msg);
        cr_assert_eq(page.total, 43);
        size_t want = off >= 43 ? 0 : (lim && 43 - off > lim ? lim : 43 - off);
        cr_assert_eq(page.n, want, "window %zu: %zu items", w, page.n);
        for (size_t i = 0; i < page.n; i++)
            cr_assert_str_eq(page.items[i].path, all.items[off + i].path);
        conch_ws_changes_done(&page);
    }
    conch_ws_changes_done(&all);
}

/* Makes a chain of @levels dirs named @name below @root/@rel, by fds (the path gets longer
 * than PATH_MAX), with a file at the bottom. */
static void deep_chain(const char *root, const char *rel, const char *name, int levels)
{
    int fd = open(at(root, rel), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    for (int i = 0; i < levels; i++) {
        cr_assert_eq(mkdirat(fd, name, 0755), 0, "level %d: %s", i, strerror(errno));
        int next = openat(fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        cr_assert_geq(next, 0);
        close(fd);
        fd = next;
    }
    int f = openat(fd, "bottom.txt", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(f, 0);
    close(f);
    close(fd);
}

Test(workspace, scan_survives_a_chain_deeper_than_path_max)
{
    mkd(upper, "deep", 0755);
    deep_chain(upper, "deep", "dddddddddd", 420); /* 4,620 bytes of path */
    put(upper, "other.txt", "still listed\n", 0644);
    mkd(lower, "old", 0755);
    mkd(upper, "old", 0755);
    deep_chain(upper, "old", "oooooo", 620); /* 4,340 bytes */
    struct conch_ws_changes c = {0};
    scan(&c);
    expect(&c, "other.txt", CONCH_CHANGE_ADDED, 'f');
    expect(&c, "deep", CONCH_CHANGE_ADDED, 'd');
    size_t deep = 0;
    for (size_t i = 0; i < c.n; i++) {
        cr_assert_lt(strlen(c.items[i].path), 4096);
        if (c.items[i].flags & CONCH_WS_F_TOO_DEEP) {
            deep++;
            cr_assert_gt(strlen(c.items[i].path), 4096 - 256);
            cr_assert_not_null(conch_ws_change_skip_reason(&c.items[i]));
        }
    }
    cr_assert_eq(deep, 2, "one flagged dir per chain");
    expect_sorted(&c);

    /* A commit applies the rest and reports the deep dirs as skipped. */
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    cr_assert_eq(conch_ws_commit(u, h, &c, NULL, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.skipped, 2);
    cr_assert_eq(rep.failed, 0);
    cr_assert_eq(rep.applied, c.n - 2);
    cr_assert_str_eq(slurp(at(lower, "other.txt")), "still listed\n");
    conch_ws_commit_report_done(&rep);

    /* Discarding takes the deep trees out of the upper dir, however deep. */
    cr_assert_eq(conch_ws_upper_remove(u, h, &c, &err), 0, "%s", err.msg);
    conch_ws_changes_done(&c);
    cr_assert(!exists(at(upper, "deep")));
    put(upper, "x", "x\n", 0644);
    deep_chain(upper, "", "zzzzzzzzzz", 420);
    cr_assert_eq(conch_ws_upper_clear(u, &err), 0, "%s", err.msg);
    DIR *d = opendir(upper);
    int entries = 0;
    for (struct dirent *de; (de = readdir(d));)
        entries += de->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(entries, 0);
}

Test(workspace, scan_flags_symlinks_pointing_outside)
{
    mkd(upper, "sub", 0755);
    lnk(upper, "abs", "/etc/passwd");
    lnk(upper, "sub/up", "../../x");
    lnk(upper, "sub/ok", "../keep/./a");
    lnk(upper, "sub/dots", "a/../../b"); /* sub/a/.. = sub, then .. = root: inside */
    lnk(upper, "sub/dots2", "a/../../../b");
    struct conch_ws_changes c = {0};
    scan(&c);
    cr_assert(expect(&c, "abs", CONCH_CHANGE_ADDED, 'l')->flags & CONCH_WS_F_LINK_OUTSIDE);
    cr_assert(expect(&c, "sub/up", CONCH_CHANGE_ADDED, 'l')->flags & CONCH_WS_F_LINK_OUTSIDE);
    cr_assert(!(expect(&c, "sub/ok", CONCH_CHANGE_ADDED, 'l')->flags & CONCH_WS_F_LINK_OUTSIDE));
    cr_assert(!(expect(&c, "sub/dots", CONCH_CHANGE_ADDED, 'l')->flags & CONCH_WS_F_LINK_OUTSIDE));
    cr_assert(expect(&c, "sub/dots2", CONCH_CHANGE_ADDED, 'l')->flags & CONCH_WS_F_LINK_OUTSIDE);
    /* Flagged, but committed as it is. */
    struct conch_err err = {0};
    cr_assert_eq(commit(&c, &default_owner, &err), 0, "%s", err.msg);
    conch_ws_changes_done(&c);
    char target[64] = "";
    cr_assert_gt(readlink(at(lower, "abs"), target, sizeof(target) - 1), 0);
    cr_assert_str_eq(target, "/etc/passwd");
}

Test(workspace, commit_keeps_holes)
{
    int fd = open(at(upper, "big.bin"), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, "head", 4, 0), 4);
    cr_assert_eq(pwrite(fd, "middle", 6, 100 << 20), 6);
    cr_assert_eq(ftruncate(fd, 200 << 20), 0);
    close(fd);
    struct conch_ws_changes c = {0};
    scan(&c);
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    struct conch_ws_commit_opts opts = {
        .new_uid = (uid_t)-1, .new_gid = (gid_t)-1, .max_bytes = 300 << 20};
    cr_assert_eq(conch_ws_commit(u, h, &c, &opts, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.bytes, 200 << 20);
    conch_ws_commit_report_done(&rep);
    conch_ws_changes_done(&c);
    struct stat st;
    cr_assert_eq(stat(at(lower, "big.bin"), &st), 0);
    cr_assert_eq(st.st_size, 200 << 20);
    cr_assert_lt(st.st_blocks * 512, 4 << 20, "%lld bytes allocated: holes filled",
                 (long long)st.st_blocks * 512);
    char buf[8] = "";
    fd = open(at(lower, "big.bin"), O_RDONLY | O_CLOEXEC);
    cr_assert_eq(pread(fd, buf, 6, 100 << 20), 6);
    cr_assert_eq(memcmp(buf, "middle", 6), 0);
    cr_assert_eq(pread(fd, buf, 4, 0), 4);
    cr_assert_eq(memcmp(buf, "head", 4), 0);
    cr_assert_eq(pread(fd, buf, 4, 150 << 20), 4);
    cr_assert_eq(memcmp(buf, "\0\0\0\0", 4), 0);
    close(fd);
}

Test(workspace, commit_checks_total_apparent_size_before_applying)
{
    put(upper, "a.txt", "small\n", 0644);
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof(name), "s%d", i);
        int fd = open(at(upper, name), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        cr_assert_eq(ftruncate(fd, 900 << 10), 0);
        close(fd);
    }
    put(lower, "gone.txt", "x\n", 0644);
    whiteout(upper, "gone.txt");
    struct conch_ws_changes c = {0};
    scan(&c);
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    struct conch_ws_commit_opts opts = {
        .new_uid = (uid_t)-1, .new_gid = (gid_t)-1, .max_bytes = 1 << 20};
    cr_assert_eq(conch_ws_commit(u, h, &c, &opts, &rep, &err), -EFBIG);
    cr_assert_eq(err.kind, CONCH_ERR_LIMIT);
    cr_assert_not_null(strstr(err.msg, "nothing was applied"), "%s", err.msg);
    cr_assert_eq(rep.applied + rep.skipped + rep.failed, 0);
    conch_ws_commit_report_done(&rep);
    conch_ws_changes_done(&c);
    cr_assert(!exists(at(lower, "a.txt")));
    cr_assert(!exists(at(lower, "s0")));
    cr_assert(exists(at(lower, "gone.txt")), "a deletion was applied before the refusal");
}

Test(workspace, commit_policy_and_report)
{
    put(upper, "world.txt", "w\n", 0666);
    put(upper, "suid", "s\n", 06777);
    mkd(upper, "tmpdir", 01777);
    mkd(upper, "sgid", 02775);
    put(lower, "shared.txt", "old\n", 0664);
    put(upper, "shared.txt", "new\n", 0666);
    cr_assert_eq(mkfifo(at(upper, "fifo"), 0644), 0);
    bool can_mknod = mknod(at(upper, "null"), S_IFCHR | 0666, makedev(1, 3)) == 0;
    struct conch_ws_changes c = {0};
    scan(&c);
    cr_assert(expect(&c, "fifo", CONCH_CHANGE_ADDED, 'o')->flags & CONCH_WS_F_FIFO);
    if (can_mknod)
        cr_assert(expect(&c, "null", CONCH_CHANGE_ADDED, 'o')->flags & CONCH_WS_F_DEVICE);
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    cr_assert_eq(conch_ws_commit(u, h, &c, NULL, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.n, c.n);
    cr_assert_eq(rep.skipped, can_mknod ? 2 : 1);
    cr_assert_eq(rep.applied, c.n - rep.skipped);
    for (size_t i = 0; i < rep.n; i++) {
        bool special = !strcmp(rep.entries[i].path, "fifo") || !strcmp(rep.entries[i].path, "null");
        cr_assert_eq(rep.entries[i].status,
                     special ? CONCH_WS_COMMIT_SKIPPED : CONCH_WS_COMMIT_APPLIED, "%s",
                     rep.entries[i].path);
        cr_assert_eq(rep.entries[i].reason != NULL, special);
    }
    conch_ws_commit_report_done(&rep);
    conch_ws_changes_done(&c);
    cr_assert_eq(perms(at(lower, "world.txt")), 0644);
    cr_assert_eq(perms(at(lower, "suid")), 0755);
    cr_assert_eq(perms(at(lower, "tmpdir")), 01755);
    cr_assert_eq(perms(at(lower, "sgid")), 0755);
    cr_assert_eq(perms(at(lower, "shared.txt")), 0664, "group write the host gave is kept");
    cr_assert(!exists(at(lower, "fifo")));
    cr_assert(!exists(at(lower, "null")));
}

Test(workspace, commit_reports_failures_exactly)
{
    lnk(lower, "link", outside);
    mkd(upper, "link", 0755);
    put(upper, "link/x", "x\n", 0644);
    put(upper, "ok.txt", "fine\n", 0644);
    struct conch_ws_change items[] = {
        {.path = "link/x", .kind = CONCH_CHANGE_ADDED, .type = 'f', .new_mode = 0644},
        {.path = "ok.txt", .kind = CONCH_CHANGE_ADDED, .type = 'f', .new_mode = 0644},
    };
    struct conch_ws_changes c = {.items = items, .n = 2};
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    cr_assert_eq(conch_ws_commit(u, h, &c, NULL, &rep, &err), -ELOOP);
    cr_assert_eq(rep.applied, 1);
    cr_assert_eq(rep.failed, 1);
    cr_assert_str_eq(rep.entries[0].path, "link/x");
    cr_assert_eq(rep.entries[0].status, CONCH_WS_COMMIT_FAILED);
    cr_assert_not_null(strstr(rep.entries[0].reason, "symlink"));
    cr_assert_eq(rep.entries[1].status, CONCH_WS_COMMIT_APPLIED);
    conch_ws_commit_report_done(&rep);
}

/* Path rules: whatever the upper dir holds beneath a read-only or hidden path, or a deletion
 * of a dir holding one, commit skips it and the host keeps what it had. */
Test(workspace, commit_skips_what_path_rules_protect)
{
    mkd(lower, ".git", 0755);
    mkd(lower, ".git/hooks", 0755);
    put(lower, ".git/hooks/pre-commit", "hook\n", 0755);
    put(lower, ".env", "secret\n", 0600);
    mkd(lower, "cfg", 0755);
    put(lower, "cfg/token", "t\n", 0600);
    mkd(upper, ".git", 0755);
    mkd(upper, ".git/hooks", 0755);
    put(upper, ".git/hooks/pre-commit", "evil\n", 0755);
    put(upper, ".git/hooks/post-checkout", "evil\n", 0755);
    put(upper, ".env", "replaced\n", 0644);
    whiteout(upper, "cfg");
    put(upper, "ok.txt", "fine\n", 0644);
    struct conch_ws_changes c = {0};
    scan(&c);
    struct conch_ws_rule rules[] = {{".git/hooks", false}, {".env", true}, {"cfg/token", true}};
    struct conch_ws_commit_opts opts = {.new_uid = (uid_t)-1,
                                        .new_gid = (gid_t)-1,
                                        .rules = rules,
                                        .n_rules = sizeof(rules) / sizeof(rules[0])};
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int h = open_dir(lower);
    cr_assert_eq(conch_ws_commit(u, h, &c, &opts, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.applied, 1, "applied %zu", rep.applied);
    cr_assert_eq(rep.skipped, 4, "skipped %zu", rep.skipped);
    for (size_t i = 0; i < rep.n; i++) {
        const struct conch_ws_commit_entry *e = &rep.entries[i];
        if (!strcmp(e->path, "ok.txt"))
            continue;
        cr_assert_eq(e->status, CONCH_WS_COMMIT_SKIPPED, "%s", e->path);
        const char *want = !strcmp(e->path, "cfg")    ? "holds a path"
                           : !strcmp(e->path, ".env") ? "hidden path"
                                                      : "read-only path";
        cr_assert(strstr(e->reason, want), "%s: %s", e->path, e->reason);
    }
    conch_ws_commit_report_done(&rep);
    conch_ws_changes_done(&c);
    char buf[32] = "";
    int fd = open(at(lower, ".git/hooks/pre-commit"), O_RDONLY | O_CLOEXEC);
    cr_assert_eq(read(fd, buf, sizeof(buf)), 5);
    close(fd);
    cr_assert_str_eq(buf, "hook\n");
    struct stat st;
    cr_assert_lt(stat(at(lower, ".git/hooks/post-checkout"), &st), 0);
    cr_assert_eq(stat(at(lower, ".env"), &st), 0);
    cr_assert_eq(st.st_size, 7);
    cr_assert_eq(stat(at(lower, "cfg/token"), &st), 0);
    cr_assert_eq(stat(at(lower, "ok.txt"), &st), 0);
}
