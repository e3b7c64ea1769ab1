/* test_fs.c - unit tests for src/fs: every fs.* method against a temporary directory as
 * the workspace root, path escapes (lexical and through symlinks, with openat2 and with
 * the user-space walk), encodings, and each error code. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "fs/fs-internal.h"
#include "fs/fs.h"

static char dir[64];
static int root_fd = -1;
static struct conch_fs_error ferr;

static void setup(void)
{
    strcpy(dir, "/tmp/conch-test-fs-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    root_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(root_fd, 0);
    umask(022);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        return rmdir(p);
    return unlink(p);
}

static void teardown(void)
{
    if (root_fd >= 0)
        close(root_fd);
    chmod(dir, 0700);
    nftw(dir, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

TestSuite(fs, .init = setup, .fini = teardown, .timeout = 60);

/* Call @method with @params (stolen); the result or NULL with the global ferr filled. */
static json_t *call(const char *method, json_t *params)
{
    json_t *res = conch_fs_call(root_fd, "/workspace", method, params, &ferr);
    json_decref(params);
    return res;
}

/* Call and expect failure with @code; ferr keeps the details. */
static void call_fail(const char *method, json_t *params, enum conch_fs_errcode code)
{
    json_t *res = call(method, params);
    cr_assert_null(res, "%s unexpectedly succeeded", method);
    cr_assert_eq(ferr.code, code, "%s: got %s (%s), want %s", method,
                 conch_fs_errcode_name(ferr.code), ferr.message, conch_fs_errcode_name(code));
    cr_assert_neq(ferr.message[0], '\0');
}

static json_t *call_ok(const char *method, json_t *params)
{
    json_t *res = call(method, params);
    cr_assert_not_null(res, "%s failed: %s: %s", method, conch_fs_errcode_name(ferr.code),
                       ferr.message);
    cr_assert_eq(ferr.code, CONCH_FS_OK);
    return res;
}

static void put(const char *rel, const char *data, size_t len)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    /* parents */
    for (char *s = strchr(p + strlen(dir) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(p, 0755);
        *s = '/';
    }
    _cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert_geq(fd, 0, "create %s: %s", p, strerror(errno));
    cr_assert_eq(write(fd, data, len), (ssize_t)len);
}

static void puts_(const char *rel, const char *s)
{
    put(rel, s, strlen(s));
}

/* The file's content as a new string (NULL when absent); *@len its length. */
static char *get(const char *rel, size_t *len)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf;
    size_t n;
    cr_assert_eq(conch_fs__read_fd(fd, 1 << 26, &buf, &n), 0);
    if (len)
        *len = n;
    return buf;
}

static void link_(const char *target, const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    cr_assert_eq(symlink(target, p), 0, "symlink %s: %s", p, strerror(errno));
}

static void mkdir_(const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    cr_assert_eq(mkdir(p, 0755), 0);
}

static bool exists(const char *rel)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    return lstat(p, &st) == 0;
}

static const char *str(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_string(v), "'%s' is not a string", key);
    return json_string_value(v);
}

static long long num(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_integer(v), "'%s' is not an integer", key);
    return json_integer_value(v);
}

static bool flag(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    cr_assert(json_is_boolean(v), "'%s' is not a boolean", key);
    return json_is_true(v);
}

/* "a,b,c": the array of strings @arr joined with commas, for one-line comparisons. */
static char *joined(json_t *arr, const char *key)
{
    static char buf[4096];
    buf[0] = '\0';
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        const char *s = key ? str(v, key) : json_string_value(v);
        if (i)
            strcat(buf, ",");
        strcat(buf, s);
    }
    return buf;
}

/* ---- codes and params ---- */

Test(fs, errcode_names)
{
    cr_assert_str_eq(conch_fs_errcode_name(CONCH_FS_FILE_NOT_FOUND), "file_not_found");
    cr_assert_str_eq(conch_fs_errcode_name(CONCH_FS_AMBIGUOUS_MATCH), "ambiguous_match");
    cr_assert_str_eq(conch_fs_errcode_name(CONCH_FS_INVALID_PARAMS), "invalid_params");
    cr_assert_str_eq(conch_fs_errcode_name(CONCH_FS_IO_ERROR), "io_error");
    cr_assert_str_eq(conch_fs_errcode_name((enum conch_fs_errcode)999), "io_error");
}

Test(fs, params_checked)
{
    puts_("a.txt", "x\n");
    call_fail("read", json_pack("{s:s, s:s}", "path", "a.txt", "sandbox", "s1"),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "sandbox");
    call_fail("read", json_pack("{s:i}", "path", 3), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "path");
    call_fail("read", json_object(), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "path");
    call_fail("read", json_pack("{s:s, s:i}", "path", "a.txt", "limit", 0),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "limit");
    call_fail("read", json_pack("{s:s, s:s}", "path", "a.txt", "offset", "1"),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "offset");
    call_fail("read", json_pack("{s:s, s:s}", "path", "a.txt", "encoding", "latin1"),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "encoding");
    call_fail("glob", json_pack("{s:s, s:i}", "pattern", "*", "max_results", 10001),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "max_results");
    call_fail("delete", json_pack("{s:s, s:s}", "path", "a.txt", "recursive", "yes"),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "recursive");
    call_fail("chmod", json_object(), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "method");
    call_fail("read", json_pack("[s]", "a.txt"), CONCH_FS_INVALID_PARAMS);
    /* null counts as absent */
    json_t *r = call_ok("read", json_pack("{s:s, s:n, s:n}", "path", "a.txt", "offset", "limit"));
    cr_assert_str_eq(str(r, "content"), "x\n");
    json_decref(r);
    /* NULL params are an empty object: ls of the root */
    r = call_ok("ls", NULL);
    cr_assert_eq(json_array_size(json_object_get(r, "entries")), 1);
    json_decref(r);
}

/* ---- paths ---- */

static void expect_path_rejected(const char *path)
{
    call_fail("read", json_pack("{s:s}", "path", path), CONCH_FS_INVALID_PATH);
}

Test(fs, path_spellings)
{
    puts_("sub/a.txt", "hello\n");
    const char *ok[] = {"sub/a.txt",
                        "/workspace/sub/a.txt",
                        "./sub/a.txt",
                        "sub//a.txt",
                        "x/../sub/a.txt",
                        "/workspace/./sub/../sub/a.txt",
                        "/../workspace/sub/a.txt"};
    for (size_t i = 0; i < ARRAY_SIZE(ok); i++) {
        json_t *r = call_ok("read", json_pack("{s:s}", "path", ok[i]));
        cr_assert_str_eq(str(r, "content"), "hello\n", "%s", ok[i]);
        json_decref(r);
    }
    expect_path_rejected("../x");
    expect_path_rejected("sub/../../x");
    expect_path_rejected("/etc/passwd");
    expect_path_rejected("/workspace/../etc/passwd");
    expect_path_rejected("/workspaces/sub/a.txt");
    expect_path_rejected("");
    cr_assert(strstr(ferr.message, "empty"));
    call_fail("read", json_pack("{s:s%}", "path", "sub/a.txt\0x", (size_t)11),
              CONCH_FS_INVALID_PATH);
    cr_assert(strstr(ferr.message, "NUL"));
    /* the root where a file is meant */
    call_fail("read", json_pack("{s:s}", "path", "/workspace"), CONCH_FS_IS_DIRECTORY);
    call_fail("write", json_pack("{s:s, s:s}", "path", "/workspace/", "content", "x"),
              CONCH_FS_IS_DIRECTORY);
    call_fail("delete", json_pack("{s:s, s:b}", "path", "/workspace", "recursive", 1),
              CONCH_FS_INVALID_PATH);
    call_fail("write", json_pack("{s:s, s:s}", "path", "../evil", "content", "x"),
              CONCH_FS_INVALID_PATH);
    cr_assert(!exists("../evil"));
}

static void symlink_escapes(void)
{
    puts_("sub/real.txt", "inside\n");
    link_("/etc", "etc");
    link_("../..", "up");
    link_("/etc/passwd", "abs");
    link_("../../../../../../../etc/passwd", "sub/rel");
    link_("real.txt", "sub/ok");
    link_("../sub/real.txt", "sub/ok2");
    link_("sub", "dirlink");
    link_("loop", "loop");
    const char *bad[] = {"etc/passwd", "up/etc/passwd", "abs", "sub/rel", "loop"};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
        call_fail("read", json_pack("{s:s}", "path", bad[i]), CONCH_FS_INVALID_PATH);
        cr_assert(strstr(ferr.message, bad[i]), "message quotes the path: %s", ferr.message);
    }
    call_fail("ls", json_pack("{s:s}", "path", "etc"), CONCH_FS_INVALID_PATH);
    call_fail("write", json_pack("{s:s, s:s}", "path", "etc/conch-test", "content", "x"),
              CONCH_FS_INVALID_PATH);
    call_fail("write", json_pack("{s:s, s:s}", "path", "up/conch-test", "content", "x"),
              CONCH_FS_INVALID_PATH);
    call_fail("grep", json_pack("{s:s, s:s}", "pattern", "root", "path", "abs"),
              CONCH_FS_INVALID_PATH);
    call_fail(
        "edit",
        json_pack("{s:s, s:s, s:s}", "path", "abs", "old_string", "root", "new_string", "toor"),
        CONCH_FS_INVALID_PATH);
    json_t *d = call_ok("download", json_pack("{s:[s]}", "paths", "sub/rel"));
    cr_assert_str_eq(
        str(json_object_get(json_array_get(json_object_get(d, "files"), 0), "error"), "code"),
        "invalid_path");
    json_decref(d);

    /* Writing through a symlink (dangling or not) that leads out creates nothing there. */
    char outside[64];
    strcpy(outside, "/tmp/conch-test-fs-out-XXXXXX");
    cr_assert_not_null(mkdtemp(outside));
    char target[128];
    snprintf(target, sizeof(target), "%s/new.txt", outside);
    link_(target, "dang");
    snprintf(target, sizeof(target), "../%s/new.txt", outside + 5);
    link_(target, "dang2");
    call_fail("write", json_pack("{s:s, s:s}", "path", "dang", "content", "x"),
              CONCH_FS_INVALID_PATH);
    call_fail("write", json_pack("{s:s, s:s}", "path", "dang2", "content", "x"),
              CONCH_FS_INVALID_PATH);
    call_fail("write", json_pack("{s:s, s:s}", "path", "abs", "content", "x"),
              CONCH_FS_INVALID_PATH);
    snprintf(target, sizeof(target), "%s/new.txt", outside);
    struct stat st;
    cr_assert_neq(lstat(target, &st), 0, "nothing was created outside");
    cr_assert_eq(rmdir(outside), 0);

    /* a symlinked directory inside is a fine parent */
    json_t *w =
        call_ok("write", json_pack("{s:s, s:s}", "path", "dirlink/new.txt", "content", "n"));
    cr_assert(flag(w, "created"));
    json_decref(w);
    cr_assert(exists("sub/new.txt"));
    /* deleting a symlink that leads out removes the link only */
    json_t *del = call_ok("delete", json_pack("{s:s}", "path", "abs"));
    json_decref(del);
    cr_assert(!exists("abs"));
    cr_assert_eq(stat("/etc/passwd", &st), 0);

    const char *good[] = {"sub/ok", "sub/ok2", "dirlink/real.txt", "dirlink/ok"};
    for (size_t i = 0; i < ARRAY_SIZE(good); i++) {
        json_t *r = call_ok("read", json_pack("{s:s}", "path", good[i]));
        cr_assert_str_eq(str(r, "content"), "inside\n", "%s", good[i]);
        json_decref(r);
    }
}

Test(fs, symlink_escapes_openat2)
{
    symlink_escapes();
}

Test(fs, symlink_escapes_walk)
{
    conch_fs__force_walk = true;
    symlink_escapes();
    /* the walk's own ".." handling */
    int fd = conch_fs__open(root_fd, "sub/../sub/real.txt", O_RDONLY, 0);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(conch_fs__open(root_fd, "sub/../..", O_RDONLY, 0), -EXDEV);
    cr_assert_eq(conch_fs__open(root_fd, "nope/x", O_RDONLY, 0), -ENOENT);
    cr_assert_eq(conch_fs__open(root_fd, "sub/real.txt/x", O_RDONLY, 0), -ENOTDIR);
    conch_fs__force_walk = false;
}

/* ---- read ---- */

Test(fs, read_text_lines)
{
    puts_("f.txt", "l0\nl1\nl2\nl3\nl4");
    json_t *r = call_ok("read", json_pack("{s:s}", "path", "f.txt"));
    cr_assert_str_eq(str(r, "content"), "l0\nl1\nl2\nl3\nl4");
    cr_assert_eq(num(r, "offset"), 0);
    cr_assert_eq(num(r, "lines"), 5);
    cr_assert_eq(num(r, "total_lines"), 5);
    cr_assert_eq(num(r, "size"), 14);
    cr_assert(!flag(r, "truncated"));
    json_decref(r);

    r = call_ok("read", json_pack("{s:s, s:i, s:i}", "path", "f.txt", "offset", 1, "limit", 2));
    cr_assert_str_eq(str(r, "content"), "l1\nl2\n");
    cr_assert_eq(num(r, "offset"), 1);
    cr_assert_eq(num(r, "lines"), 2);
    cr_assert_eq(num(r, "total_lines"), 5);
    cr_assert(flag(r, "truncated"));
    json_decref(r);

    r = call_ok("read", json_pack("{s:s, s:i, s:i}", "path", "f.txt", "offset", 3, "limit", 9));
    cr_assert_str_eq(str(r, "content"), "l3\nl4");
    cr_assert_eq(num(r, "lines"), 2);
    cr_assert(!flag(r, "truncated"));
    json_decref(r);

    r = call_ok("read", json_pack("{s:s, s:i}", "path", "f.txt", "offset", 50));
    cr_assert_str_eq(str(r, "content"), "");
    cr_assert_eq(num(r, "lines"), 0);
    json_decref(r);

    puts_("g.txt", "a\nb\n");
    r = call_ok("read", json_pack("{s:s, s:i}", "path", "g.txt", "limit", 1));
    cr_assert_str_eq(str(r, "content"), "a\n");
    cr_assert_eq(num(r, "total_lines"), 2);
    cr_assert(flag(r, "truncated"));
    json_decref(r);

    puts_("empty", "");
    r = call_ok("read", json_pack("{s:s}", "path", "empty"));
    cr_assert_str_eq(str(r, "content"), "");
    cr_assert_eq(num(r, "total_lines"), 0);
    cr_assert_eq(num(r, "size"), 0);
    json_decref(r);
}

Test(fs, read_invalid_utf8_replaced)
{
    static const char bad[] = "ok \xff\xfe end \xc3\xa9 \xe2\x82\n";
    put("bad.txt", bad, sizeof(bad) - 1);
    json_t *r = call_ok("read", json_pack("{s:s}", "path", "bad.txt"));
    cr_assert_str_eq(str(r, "content"),
                     /* two bad bytes, then a truncated sequence: one U+FFFD (its maximal
                      * subpart), as in diffs and command output */
                     "ok \xEF\xBF\xBD\xEF\xBF\xBD end \xc3\xa9 \xEF\xBF\xBD\n");
    cr_assert_eq(num(r, "size"), 16);
    json_decref(r);
    /* an overlong '/' and a surrogate are invalid too */
    put("bad2.txt", "\xc0\xaf\xed\xa0\x80", 5);
    r = call_ok("read", json_pack("{s:s}", "path", "bad2.txt"));
    const char *c = str(r, "content");
    cr_assert_eq(strlen(c), 5 * 3);
    json_decref(r);
}

Test(fs, read_base64_binary_roundtrip)
{
    unsigned char bin[300];
    for (size_t i = 0; i < sizeof(bin); i++)
        bin[i] = (unsigned char)(i * 7);
    size_t elen;
    _cleanup_free_ char *enc = conch_fs__base64_encode(bin, sizeof(bin), &elen);
    json_t *r = call_ok("write", json_pack("{s:s, s:s, s:s}", "path", "bin/data.bin", "content",
                                           enc, "encoding", "base64"));
    cr_assert_eq(num(r, "bytes_written"), 300);
    cr_assert(flag(r, "created"));
    json_decref(r);
    size_t len;
    _cleanup_free_ char *raw = get("bin/data.bin", &len);
    cr_assert_eq(len, sizeof(bin));
    cr_assert_eq(memcmp(raw, bin, len), 0);

    r = call_ok("read", json_pack("{s:s, s:s}", "path", "bin/data.bin", "encoding", "base64"));
    cr_assert_str_eq(str(r, "content"), enc);
    cr_assert_eq(num(r, "size"), 300);
    cr_assert_null(json_object_get(r, "total_lines"));
    json_decref(r);
}

Test(fs, read_errors)
{
    puts_("f.txt", "x");
    mkdir_("d");
    call_fail("read", json_pack("{s:s}", "path", "missing.txt"), CONCH_FS_FILE_NOT_FOUND);
    cr_assert(strstr(ferr.message, "missing.txt"));
    call_fail("read", json_pack("{s:s}", "path", "d"), CONCH_FS_IS_DIRECTORY);
    call_fail("read", json_pack("{s:s}", "path", "f.txt/x"), CONCH_FS_NOT_A_DIRECTORY);
    char p[512];
    snprintf(p, sizeof(p), "%s/big", dir);
    _cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    cr_assert_eq(ftruncate(fd, CONCH_FS_MAX_FILE + 1), 0);
    call_fail("read", json_pack("{s:s}", "path", "big"), CONCH_FS_TOO_LARGE);
    json_t *r = call_ok("download", json_pack("{s:[s]}", "paths", "big"));
    json_t *e = json_object_get(json_array_get(json_object_get(r, "files"), 0), "error");
    cr_assert_str_eq(str(e, "code"), "too_large");
    json_decref(r);
}

Test(fs, permission_denied)
{
    puts_("secret", "s");
    mkdir_("locked");
    puts_("ro/f.txt", "r");
    char p[512];
    snprintf(p, sizeof(p), "%s/secret", dir);
    chmod(p, 0600);
    snprintf(p, sizeof(p), "%s/ro", dir);
    chmod(p, 0555);
    snprintf(p, sizeof(p), "%s/ro/f.txt", dir);
    chmod(p, 0444);
    chmod(dir, 0755);
    if (geteuid() == 0) {
        /* root ignores modes: drop to nobody (this test runs in its own process) */
        cr_assert_eq(setgid(65534), 0);
        cr_assert_eq(setuid(65534), 0);
    }
    call_fail("read", json_pack("{s:s}", "path", "secret"), CONCH_FS_PERMISSION_DENIED);
    call_fail("write", json_pack("{s:s, s:s}", "path", "new.txt", "content", "x"),
              CONCH_FS_PERMISSION_DENIED);
    call_fail("write", json_pack("{s:s, s:s}", "path", "ro/f.txt", "content", "x"),
              CONCH_FS_PERMISSION_DENIED);
    call_fail("write", json_pack("{s:s, s:s}", "path", "locked/n/x", "content", "x"),
              CONCH_FS_PERMISSION_DENIED);
    call_fail("delete", json_pack("{s:s}", "path", "ro/f.txt"), CONCH_FS_PERMISSION_DENIED);
    cr_assert(exists("ro/f.txt"));
    call_fail("delete", json_pack("{s:s, s:b}", "path", "ro", "recursive", 1),
              CONCH_FS_PERMISSION_DENIED);
    cr_assert(strstr(ferr.message, "'/workspace/ro/f.txt'"), "names the entry: %s", ferr.message);
    cr_assert(exists("ro/f.txt"));
}

/* ---- write ---- */

Test(fs, write_creates_parents_and_replaces_atomically)
{
    json_t *r = call_ok(
        "write", json_pack("{s:s, s:s}", "path", "/workspace/a/b/c.txt", "content", "first\n"));
    cr_assert(flag(r, "created"));
    cr_assert_eq(num(r, "bytes_written"), 6);
    json_decref(r);
    char p[512];
    struct stat st;
    snprintf(p, sizeof(p), "%s/a/b", dir);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert(S_ISDIR(st.st_mode));
    cr_assert_eq(st.st_mode & 0777, 0755);
    snprintf(p, sizeof(p), "%s/a/b/c.txt", dir);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0644);
    _cleanup_free_ char *c = get("a/b/c.txt", NULL);
    cr_assert_str_eq(c, "first\n");

    /* Replace: a reader holding the old file keeps seeing the old bytes (a new inode
     * was renamed over it), and the mode is kept. */
    cr_assert_eq(chmod(p, 0600), 0);
    ino_t old_ino = st.st_ino;
    _cleanup_close_ int reader = open(p, O_RDONLY | O_CLOEXEC);
    r = call_ok("write", json_pack("{s:s, s:s}", "path", "a/b/c.txt", "content", "second"));
    cr_assert(!flag(r, "created"));
    json_decref(r);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_neq(st.st_ino, old_ino);
    cr_assert_eq(st.st_mode & 07777, 0600);
    char old[16] = {0};
    cr_assert_eq(read(reader, old, sizeof(old) - 1), 6);
    cr_assert_str_eq(old, "first\n");
    _cleanup_free_ char *c2 = get("a/b/c.txt", NULL);
    cr_assert_str_eq(c2, "second");
    /* no temporary file left behind */
    _cleanup_closedir_ DIR *d = opendir(dir);
    snprintf(p, sizeof(p), "%s/a/b", dir);
    _cleanup_closedir_ DIR *d2 = opendir(p);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d2)))
        if (de->d_name[0] != '.' || strncmp(de->d_name, ".conch", 6) == 0)
            n++;
    cr_assert_eq(n, 1);

    /* NUL bytes in a JSON string are written as is */
    r = call_ok("write", json_pack("{s:s, s:s%}", "path", "nul.txt", "content", "a\0b", (size_t)3));
    json_decref(r);
    size_t len;
    _cleanup_free_ char *c3 = get("nul.txt", &len);
    cr_assert_eq(len, 3);
    cr_assert_eq(memcmp(c3, "a\0b", 3), 0);
}

Test(fs, write_errors_and_symlink)
{
    mkdir_("d");
    puts_("f.txt", "x");
    puts_("real.txt", "old");
    link_("real.txt", "lnk");
    call_fail("write", json_pack("{s:s, s:s}", "path", "d", "content", "x"), CONCH_FS_IS_DIRECTORY);
    call_fail("write", json_pack("{s:s, s:s}", "path", "f.txt/y", "content", "x"),
              CONCH_FS_NOT_A_DIRECTORY);
    call_fail("write",
              json_pack("{s:s, s:s, s:s}", "path", "z", "content", "!!!", "encoding", "base64"),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "content");
    cr_assert(!exists("z"));
    call_fail("write", json_pack("{s:s}", "path", "z"), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "content");

    /* a final symlink is written through, and stays a symlink */
    json_t *r = call_ok("write", json_pack("{s:s, s:s}", "path", "lnk", "content", "new"));
    cr_assert(!flag(r, "created"));
    json_decref(r);
    _cleanup_free_ char *c = get("real.txt", NULL);
    cr_assert_str_eq(c, "new");
    char p[512];
    struct stat st;
    snprintf(p, sizeof(p), "%s/lnk", dir);
    cr_assert_eq(lstat(p, &st), 0);
    cr_assert(S_ISLNK(st.st_mode));
}

/* ---- edit ---- */

Test(fs, edit_replaces)
{
    puts_("e.txt", "alpha beta gamma beta\n");
    char p[512];
    snprintf(p, sizeof(p), "%s/e.txt", dir);
    chmod(p, 0640);
    json_t *r = call_ok("edit", json_pack("{s:s, s:s, s:s}", "path", "e.txt", "old_string", "alpha",
                                          "new_string", "ALPHA!"));
    cr_assert_eq(num(r, "occurrences"), 1);
    json_decref(r);
    _cleanup_free_ char *c = get("e.txt", NULL);
    cr_assert_str_eq(c, "ALPHA! beta gamma beta\n");
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0640);

    call_fail(
        "edit",
        json_pack("{s:s, s:s, s:s}", "path", "e.txt", "old_string", "beta", "new_string", "B"),
        CONCH_FS_AMBIGUOUS_MATCH);
    cr_assert_eq(ferr.occurrences, 2);
    _cleanup_free_ char *same = get("e.txt", NULL);
    cr_assert_str_eq(same, "ALPHA! beta gamma beta\n");

    r = call_ok("edit", json_pack("{s:s, s:s, s:s, s:b}", "path", "e.txt", "old_string", "beta",
                                  "new_string", "", "replace_all", 1));
    cr_assert_eq(num(r, "occurrences"), 2);
    json_decref(r);
    _cleanup_free_ char *c2 = get("e.txt", NULL);
    cr_assert_str_eq(c2, "ALPHA!  gamma \n");

    call_fail(
        "edit",
        json_pack("{s:s, s:s, s:s}", "path", "e.txt", "old_string", "delta", "new_string", "D"),
        CONCH_FS_STRING_NOT_FOUND);
    cr_assert_eq(ferr.occurrences, 0);
    call_fail("edit",
              json_pack("{s:s, s:s, s:s}", "path", "e.txt", "old_string", "", "new_string", "D"),
              CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "old_string");
    call_fail(
        "edit",
        json_pack("{s:s, s:s, s:s}", "path", "none.txt", "old_string", "a", "new_string", "b"),
        CONCH_FS_FILE_NOT_FOUND);
    /* overlapping candidates count left to right, without overlap */
    puts_("o.txt", "aaaa");
    r = call_ok("edit", json_pack("{s:s, s:s, s:s, s:b}", "path", "o.txt", "old_string", "aa",
                                  "new_string", "b", "replace_all", 1));
    cr_assert_eq(num(r, "occurrences"), 2);
    json_decref(r);
    _cleanup_free_ char *c3 = get("o.txt", NULL);
    cr_assert_str_eq(c3, "bb");
}

/* ---- ls ---- */

Test(fs, ls_entries)
{
    puts_("b.txt", "12345");
    mkdir_("a");
    link_("b.txt", "c");
    char p[512];
    snprintf(p, sizeof(p), "%s/b.txt", dir);
    chmod(p, 0600);
    json_t *r = call_ok("ls", json_object());
    json_t *e = json_object_get(r, "entries");
    cr_assert_str_eq(joined(e, "name"), "a,b.txt,c");
    cr_assert_str_eq(joined(e, "path"), "/workspace/a,/workspace/b.txt,/workspace/c");
    cr_assert_str_eq(joined(e, "type"), "d,f,l");
    json_t *b = json_array_get(e, 1);
    cr_assert_eq(num(b, "size"), 5);
    cr_assert_str_eq(str(b, "mode"), "0600");
    cr_assert(json_is_real(json_object_get(b, "mtime")));
    struct stat st;
    cr_assert_eq(stat(p, &st), 0);
    double mt = json_real_value(json_object_get(b, "mtime"));
    cr_assert(mt > (double)st.st_mtim.tv_sec - 1 && mt < (double)st.st_mtim.tv_sec + 1);
    json_decref(r);

    puts_("a/x", "");
    r = call_ok("ls", json_pack("{s:s}", "path", "/workspace/a"));
    cr_assert_str_eq(joined(json_object_get(r, "entries"), "path"), "/workspace/a/x");
    json_decref(r);
    r = call_ok("ls", json_pack("{s:s}", "path", ""));
    cr_assert_eq(json_array_size(json_object_get(r, "entries")), 3);
    json_decref(r);

    call_fail("ls", json_pack("{s:s}", "path", "b.txt"), CONCH_FS_NOT_A_DIRECTORY);
    call_fail("ls", json_pack("{s:s}", "path", "nope"), CONCH_FS_FILE_NOT_FOUND);
    call_fail("ls", json_pack("{s:s}", "path", "/tmp"), CONCH_FS_INVALID_PATH);
}

/* ---- glob ---- */

static void glob_tree(void)
{
    puts_("top.c", "");
    puts_("README.md", "");
    puts_("src/a.c", "");
    puts_("src/a.h", "");
    puts_("src/sub/b.c", "");
    puts_("src/sub/deep/c.c", "");
    puts_(".hidden/x.c", "");
    puts_("src/.dot.c", "");
    link_("src", "linkdir");
}

static char *glob_(json_t *params)
{
    json_t *r = call_ok("glob", params);
    char *s = strdup(joined(json_object_get(r, "paths"), NULL));
    json_decref(r);
    return s;
}

Test(fs, glob_patterns)
{
    glob_tree();
    char *s;
    s = glob_(json_pack("{s:s}", "pattern", "**/*.c"));
    cr_assert_str_eq(s, "/workspace/src/a.c,/workspace/src/sub/b.c,/workspace/src/sub/deep/c.c,"
                        "/workspace/top.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "src/*.c"));
    cr_assert_str_eq(s, "/workspace/src/a.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "src/.*.c"));
    cr_assert_str_eq(s, "/workspace/src/.dot.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "src/**"));
    cr_assert_str_eq(s, "/workspace/src/a.c,/workspace/src/a.h,/workspace/src/sub,"
                        "/workspace/src/sub/b.c,/workspace/src/sub/deep,"
                        "/workspace/src/sub/deep/c.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "src/**/deep/*"));
    cr_assert_str_eq(s, "/workspace/src/sub/deep/c.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "**/sub/**/*.c"));
    cr_assert_str_eq(s, "/workspace/src/sub/b.c,/workspace/src/sub/deep/c.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "*.{c,md}"));
    cr_assert_str_eq(s, "/workspace/README.md,/workspace/top.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "?op.[ch]"));
    cr_assert_str_eq(s, "/workspace/top.c");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", ".hidden/*"));
    cr_assert_str_eq(s, "/workspace/.hidden/x.c");
    free(s);
    s = glob_(json_pack("{s:s, s:s}", "pattern", "*.c", "path", "src/sub"));
    cr_assert_str_eq(s, "/workspace/src/sub/b.c");
    free(s);
    s = glob_(json_pack("{s:s, s:s}", "pattern", "/workspace/src/*.h", "path", "src/sub"));
    cr_assert_str_eq(s, "/workspace/src/a.h");
    free(s);
    /* symlinked directories are not walked into, but are matched themselves */
    s = glob_(json_pack("{s:s}", "pattern", "linkdir/*.c"));
    cr_assert_str_eq(s, "");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "link*"));
    cr_assert_str_eq(s, "/workspace/linkdir");
    free(s);
    s = glob_(json_pack("{s:s}", "pattern", "nothing/*"));
    cr_assert_str_eq(s, "");
    free(s);
}

Test(fs, glob_limits_and_errors)
{
    glob_tree();
    json_t *r = call_ok("glob", json_pack("{s:s, s:i}", "pattern", "**/*.c", "max_results", 2));
    cr_assert_str_eq(joined(json_object_get(r, "paths"), NULL),
                     "/workspace/src/a.c,/workspace/src/sub/b.c");
    cr_assert(flag(r, "truncated"));
    json_decref(r);
    r = call_ok("glob", json_pack("{s:s, s:i}", "pattern", "**/*.c", "max_results", 4));
    cr_assert(!flag(r, "truncated"));
    json_decref(r);
    /* two derivations of one path count once */
    puts_("x/a/a/b", "");
    r = call_ok("glob", json_pack("{s:s, s:i}", "pattern", "**/a/**/b", "max_results", 1));
    cr_assert_str_eq(joined(json_object_get(r, "paths"), NULL), "/workspace/x/a/a/b");
    cr_assert(!flag(r, "truncated"));
    json_decref(r);

    call_fail("glob", json_pack("{s:s}", "pattern", "../*"), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "pattern");
    call_fail("glob", json_pack("{s:s}", "pattern", ""), CONCH_FS_INVALID_PARAMS);
    call_fail("glob", json_pack("{s:s}", "pattern", "/etc/*"), CONCH_FS_INVALID_PATH);
    call_fail("glob", json_pack("{s:s, s:s}", "pattern", "*", "path", "top.c"),
              CONCH_FS_NOT_A_DIRECTORY);
    call_fail("glob", json_pack("{s:s, s:s}", "pattern", "*", "path", "nope"),
              CONCH_FS_FILE_NOT_FOUND);
    call_fail("glob", json_pack("{s:s, s:s}", "pattern", "*", "path", "../"),
              CONCH_FS_INVALID_PATH);
}

Test(fs, glob_depth_limited)
{
    char rel[1024] = "";
    for (int i = 0; i < CONCH_FS_MAX_DEPTH + 5; i++)
        strcat(rel, "d/");
    strcat(rel, "f.c");
    puts_(rel, "");
    json_t *r = call_ok("glob", json_pack("{s:s}", "pattern", "**/*.c"));
    cr_assert_eq(json_array_size(json_object_get(r, "paths")), 0);
    json_decref(r);
}

/* ---- grep ---- */

static void grep_tree(void)
{
    puts_("a.txt", "foo\nbar\nfooo baz\n");
    puts_("src/main.py", "import os\nFOO = 1\nprint(foo)\n");
    puts_("src/x/y.c", "int foo;\n");
    puts_("dots.txt", "a.b\naxb\n");
    put("bin.dat", "foo\0foo\n", 8);
    puts_(".git/config", "foo\n");
}

static char *grep_(json_t *params, bool *truncated)
{
    json_t *r = call_ok("grep", params);
    static char buf[4096];
    buf[0] = '\0';
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(r, "matches"), i, m)
    {
        char one[512];
        snprintf(one, sizeof(one), "%s%s:%lld:%s", i ? "|" : "", str(m, "path"), num(m, "line"),
                 str(m, "text"));
        strcat(buf, one);
    }
    if (truncated)
        *truncated = flag(r, "truncated");
    json_decref(r);
    return buf;
}

Test(fs, grep_regex_and_fixed)
{
    grep_tree();
    bool t;
    cr_assert_str_eq(grep_(json_pack("{s:s}", "pattern", "fo+"), &t),
                     "/workspace/a.txt:1:foo|/workspace/a.txt:3:fooo baz|"
                     "/workspace/src/main.py:3:print(foo)|/workspace/src/x/y.c:1:int foo;");
    cr_assert(!t);
    cr_assert_str_eq(grep_(json_pack("{s:s}", "pattern", "^ba"), NULL), "/workspace/a.txt:2:bar");
    /* '^' after a first match: the next search starts mid-buffer, at a line start */
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "^fo", "path", "a.txt"), NULL),
                     "/workspace/a.txt:1:foo|/workspace/a.txt:3:fooo baz");
    cr_assert_str_eq(grep_(json_pack("{s:s}", "pattern", "z$"), NULL),
                     "/workspace/a.txt:3:fooo baz");
    cr_assert_str_eq(grep_(json_pack("{s:s, s:b}", "pattern", "a.b", "fixed_string", 1), NULL),
                     "/workspace/dots.txt:1:a.b");
    cr_assert_str_eq(grep_(json_pack("{s:s}", "pattern", "a.b"), NULL),
                     "/workspace/dots.txt:1:a.b|/workspace/dots.txt:2:axb");
    cr_assert_str_eq(grep_(json_pack("{s:s, s:b, s:b, s:s}", "pattern", "FOO", "ignore_case", 1,
                                     "fixed_string", 1, "path", "src/main.py"),
                           NULL),
                     "/workspace/src/main.py:2:FOO = 1|/workspace/src/main.py:3:print(foo)");
    cr_assert_str_eq(grep_(json_pack("{s:s, s:b, s:s}", "pattern", "^fo{2}$", "ignore_case", 1,
                                     "path", "/workspace/a.txt"),
                           NULL),
                     "/workspace/a.txt:1:foo");
    /* an explicit hidden directory is searched; the walk skips it */
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "foo", "path", ".git"), NULL),
                     "/workspace/.git/config:1:foo");
}

Test(fs, grep_filters_limits_binary)
{
    grep_tree();
    bool t;
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "foo", "glob", "*.py"), NULL),
                     "/workspace/src/main.py:3:print(foo)");
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "foo", "glob", "*.{c,py}"), NULL),
                     "/workspace/src/main.py:3:print(foo)|/workspace/src/x/y.c:1:int foo;");
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "foo", "glob", "src/**/*.c"), NULL),
                     "/workspace/src/x/y.c:1:int foo;");
    cr_assert_str_eq(
        grep_(json_pack("{s:s, s:s, s:s}", "pattern", "foo", "glob", "x/*.c", "path", "src"), NULL),
        "/workspace/src/x/y.c:1:int foo;");
    cr_assert_str_eq(grep_(json_pack("{s:s, s:i}", "pattern", "foo", "max_matches", 2), &t),
                     "/workspace/a.txt:1:foo|/workspace/a.txt:3:fooo baz");
    cr_assert(t);
    grep_(json_pack("{s:s, s:i}", "pattern", "foo", "max_matches", 4), &t);
    cr_assert(!t);
    /* the binary file (NUL in its first bytes) is skipped in a walk and when named */
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "foo", "path", "bin.dat"), NULL), "");
    /* empty matches report each line once */
    cr_assert_str_eq(grep_(json_pack("{s:s, s:s}", "pattern", "x*", "path", "dots.txt"), NULL),
                     "/workspace/dots.txt:1:a.b|/workspace/dots.txt:2:axb");

    call_fail("grep", json_pack("{s:s}", "pattern", "(unclosed"), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "pattern");
    call_fail("grep", json_pack("{s:s, s:s}", "pattern", "x", "path", "nope"),
              CONCH_FS_FILE_NOT_FOUND);
    call_fail("grep", json_pack("{s:s, s:s}", "pattern", "x", "path", "../.."),
              CONCH_FS_INVALID_PATH);
}

Test(fs, grep_text_sanitized_and_cut)
{
    char line[6000];
    memset(line, 'a', sizeof(line));
    memcpy(line, "needle \xff", 8);
    /* a 2-byte character straddling the cut at 4096 */
    memcpy(line + 4095, "\xc3\xa9", 2);
    line[sizeof(line) - 1] = '\n';
    put("long.txt", line, sizeof(line));
    json_t *r = call_ok("grep", json_pack("{s:s}", "pattern", "needle"));
    json_t *m = json_array_get(json_object_get(r, "matches"), 0);
    const char *text = str(m, "text");
    cr_assert_eq(strncmp(text, "needle \xEF\xBF\xBD", 10), 0);
    cr_assert_eq(strlen(text), 4095 + 2); /* cut before the 'é', U+FFFD is 2 bytes longer */
    json_decref(r);
}

/* ---- delete ---- */

Test(fs, delete_files_dirs_links)
{
    puts_("f.txt", "x");
    puts_("tree/a/b/c.txt", "x");
    puts_("tree/d.txt", "x");
    puts_("keep/k.txt", "keep");
    link_("../keep", "tree/a/out");
    link_("keep", "dlink");

    json_t *r = call_ok("delete", json_pack("{s:s}", "path", "f.txt"));
    cr_assert(flag(r, "deleted"));
    json_decref(r);
    cr_assert(!exists("f.txt"));

    r = call_ok("delete", json_pack("{s:s}", "path", "dlink"));
    json_decref(r);
    cr_assert(!exists("dlink"));
    cr_assert(exists("keep/k.txt"));

    call_fail("delete", json_pack("{s:s}", "path", "tree"), CONCH_FS_IS_DIRECTORY);
    cr_assert(exists("tree/d.txt"));
    r = call_ok("delete", json_pack("{s:s, s:b}", "path", "/workspace/tree", "recursive", 1));
    json_decref(r);
    cr_assert(!exists("tree"));
    cr_assert(exists("keep/k.txt"), "the symlinked directory's content survives");

    call_fail("delete", json_pack("{s:s}", "path", "f.txt"), CONCH_FS_FILE_NOT_FOUND);
    call_fail("delete", json_pack("{s:s}", "path", "nodir/f.txt"), CONCH_FS_FILE_NOT_FOUND);
    call_fail("delete", json_pack("{s:s}", "path", "/etc/passwd"), CONCH_FS_INVALID_PATH);
    call_fail("delete", json_pack("{s:s}", "path", ""), CONCH_FS_INVALID_PATH);
}

/* ---- upload / download ---- */

Test(fs, upload_download_batch)
{
    mkdir_("d");
    json_t *r =
        call_ok("upload", json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}, {s:s, s:s}]}", "files",
                                    "path", "up/one.bin", "content", "AAEC/w==", "path",
                                    "../escape", "content", "AA==", "path", "up/two.txt", "content",
                                    "aGk", "path", "d", "content", "AA=="));
    json_t *res = json_object_get(r, "results");
    cr_assert_eq(json_array_size(res), 4);
    cr_assert_str_eq(str(json_array_get(res, 0), "path"), "up/one.bin");
    cr_assert_null(json_object_get(json_array_get(res, 0), "error"));
    json_t *e1 = json_object_get(json_array_get(res, 1), "error");
    cr_assert_str_eq(str(e1, "code"), "invalid_path");
    cr_assert_null(json_object_get(json_array_get(res, 2), "error"));
    cr_assert_str_eq(str(json_object_get(json_array_get(res, 3), "error"), "code"), "is_directory");
    json_decref(r);
    size_t len;
    _cleanup_free_ char *one = get("up/one.bin", &len);
    cr_assert_eq(len, 4);
    cr_assert_eq(memcmp(one, "\x00\x01\x02\xff", 4), 0);
    _cleanup_free_ char *two = get("up/two.txt", NULL);
    cr_assert_str_eq(two, "hi");

    r = call_ok("upload", json_pack("{s:[{s:s, s:s}]}", "files", "path", "bad", "content", "a*b="));
    cr_assert_str_eq(
        str(json_object_get(json_array_get(json_object_get(r, "results"), 0), "error"), "code"),
        "invalid_params");
    json_decref(r);

    r = call_ok("download", json_pack("{s:[s, s, s]}", "paths", "/workspace/up/one.bin", "missing",
                                      "up/two.txt"));
    json_t *files = json_object_get(r, "files");
    cr_assert_eq(json_array_size(files), 3);
    cr_assert_str_eq(str(json_array_get(files, 0), "path"), "/workspace/up/one.bin");
    cr_assert_str_eq(str(json_array_get(files, 0), "content"), "AAEC/w==");
    cr_assert_str_eq(str(json_object_get(json_array_get(files, 1), "error"), "code"),
                     "file_not_found");
    cr_assert_null(json_object_get(json_array_get(files, 1), "content"));
    cr_assert_str_eq(str(json_array_get(files, 2), "content"), "aGk=");
    json_decref(r);

    call_fail("upload", json_pack("{s:[{s:s}]}", "files", "path", "x"), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "files");
    call_fail("upload", json_pack("{s:s}", "files", "x"), CONCH_FS_INVALID_PARAMS);
    call_fail("download", json_pack("{s:[i]}", "paths", 1), CONCH_FS_INVALID_PARAMS);
    cr_assert_str_eq(ferr.param, "paths");
    call_fail("download", json_object(), CONCH_FS_INVALID_PARAMS);
}

/* ---- encodings ---- */

Test(fs, base64_codec)
{
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < ARRAY_SIZE(plain); i++) {
        size_t n;
        _cleanup_free_ char *e =
            conch_fs__base64_encode((const unsigned char *)plain[i], strlen(plain[i]), &n);
        cr_assert_str_eq(e, enc[i]);
        cr_assert_eq(n, strlen(enc[i]));
        _cleanup_free_ unsigned char *d = NULL;
        cr_assert_eq(conch_fs__base64_decode(enc[i], strlen(enc[i]), &d, &n), 0);
        cr_assert_eq(n, strlen(plain[i]));
        cr_assert_eq(memcmp(d, plain[i], n), 0);
    }
    unsigned char *d = NULL;
    size_t n;
    cr_assert_eq(conch_fs__base64_decode("Zm9vYg", 6, &d, &n), 0); /* unpadded */
    cr_assert_eq(n, 4);
    free(d);
    const char *bad[] = {"Z", "Zm9v!", "Zg=a", "Zg===", "Z===", "Zm9\nv", "=Zg="};
    for (size_t i = 0; i < ARRAY_SIZE(bad); i++)
        cr_assert_eq(conch_fs__base64_decode(bad[i], strlen(bad[i]), &d, &n), -EINVAL, "%s",
                     bad[i]);
}

/* ---- conch_fs_call_rooted: the whole sandbox, relative paths under a home dir ---- */

static json_t *rooted(const char *method, json_t *params)
{
    json_t *res = conch_fs_call_rooted(root_fd, "/workspace", method, params, &ferr);
    json_decref(params);
    return res;
}

static void rooted_cases(void)
{
    /* the temp dir plays the sandbox's "/": workspace/ is the home */
    char home[128];
    snprintf(home, sizeof(home), "%s/workspace", dir);
    cr_assert_eq(mkdir(home, 0755), 0);
    put("workspace/w.txt", "in ws\n", 6);
    put("etc/conf", "conf\n", 5);
    char link[128];
    snprintf(link, sizeof(link), "%s/workspace/abs", dir);
    cr_assert_eq(symlink("/etc/conf", link), 0); /* absolute: inside the root, not the host */
    snprintf(link, sizeof(link), "%s/workspace/up", dir);
    cr_assert_eq(symlink("../../../../..", link), 0); /* climbs to the root and stays */
    const char *reads[][2] = {{"w.txt", "in ws\n"},
                              {"/workspace/w.txt", "in ws\n"},
                              {"../etc/conf", "conf\n"},
                              {"/etc/conf", "conf\n"},
                              {"abs", "conf\n"},
                              {"up/etc/conf", "conf\n"},
                              {"/../../etc/conf", "conf\n"},
                              {"up/workspace/w.txt", "in ws\n"}};
    for (size_t i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
        json_t *r = rooted("read", json_pack("{s:s}", "path", reads[i][0]));
        cr_assert_not_null(r, "%s: %s", reads[i][0], ferr.message);
        cr_assert_str_eq(json_string_value(json_object_get(r, "content")), reads[i][1], "%s",
                         reads[i][0]);
        json_decref(r);
    }
    /* the default directory is the home; its entries are shown by their sandbox path */
    json_t *r = rooted("ls", json_object());
    cr_assert_not_null(r, "%s", ferr.message);
    cr_assert_str_eq(json_string_value(
                         json_object_get(json_array_get(json_object_get(r, "entries"), 0), "path")),
                     "/workspace/abs");
    json_decref(r);
    /* neither the root nor the home may be deleted */
    cr_assert_null(rooted("delete", json_pack("{s:s,s:b}", "path", "/", "recursive", 1)));
    cr_assert_eq(ferr.code, CONCH_FS_INVALID_PATH);
    cr_assert_null(rooted("delete", json_pack("{s:s,s:b}", "path", "..", "recursive", 1)));
    cr_assert_eq(ferr.code, CONCH_FS_INVALID_PATH);
    cr_assert_null(rooted("delete", json_pack("{s:s,s:b}", "path", "/workspace", "recursive", 1)));
    cr_assert_eq(ferr.code, CONCH_FS_INVALID_PATH);
    /* a write through the absolute link lands in the root's etc */
    r = rooted("write", json_pack("{s:s,s:s}", "path", "abs", "content", "new\n"));
    cr_assert_not_null(r, "%s", ferr.message);
    json_decref(r);
    r = rooted("read", json_pack("{s:s}", "path", "/etc/conf"));
    cr_assert_str_eq(json_string_value(json_object_get(r, "content")), "new\n");
    json_decref(r);
}

Test(fs, rooted_resolves_in_the_root)
{
    rooted_cases();
}

Test(fs, rooted_resolves_in_the_root_with_the_walk)
{
    conch_fs__force_walk = true;
    rooted_cases();
    conch_fs__force_walk = false;
}

Test(fs, chunked_read_and_append)
{
    json_t *r = call_ok("write",
                        json_pack("{s:s,s:s,s:b}", "path", "a.bin", "content", "abc", "append", 1));
    json_decref(r);
    r = call_ok("write",
                json_pack("{s:s,s:s,s:b}", "path", "a.bin", "content", "def", "append", 1));
    cr_assert(json_is_false(json_object_get(r, "created")));
    json_decref(r);
    r = call_ok("read", json_pack("{s:s,s:s,s:i,s:i}", "path", "a.bin", "encoding", "base64",
                                  "offset", 2, "length", 3));
    cr_assert_str_eq(json_string_value(json_object_get(r, "content")), "Y2Rl"); /* "cde" */
    cr_assert_eq(json_integer_value(json_object_get(r, "size")), 6);
    cr_assert(json_is_false(json_object_get(r, "eof")));
    json_decref(r);
    r = call_ok("read",
                json_pack("{s:s,s:s,s:i}", "path", "a.bin", "encoding", "base64", "offset", 5));
    cr_assert_str_eq(json_string_value(json_object_get(r, "content")), "Zg=="); /* "f" */
    cr_assert(json_is_true(json_object_get(r, "eof")));
    json_decref(r);
    call_fail("read", json_pack("{s:s,s:i}", "path", "a.bin", "length", 2),
              CONCH_FS_INVALID_PARAMS);
}

/* ---- conch_fs_json_object_check: what the daemon may splice as it is ---- */

static bool jcheck(const char *s)
{
    return conch_fs_json_object_check(s, strlen(s));
}

Test(fs_json, accepts_what_the_worker_writes)
{
    cr_assert(jcheck("{}"));
    cr_assert(jcheck(
        "{\"content\":\"a\\nb\\t\\\"q\\\" \\\\ \\/ \\u0000 \\u00e9 \xc3\xa9 \xf0\x9f\x98\x80\","
        "\"size\":12,\"eof\":true,\"x\":null,\"f\":false}"));
    cr_assert(jcheck("{\"entries\":[{\"name\":\"a\",\"size\":0,\"mtime\":1733000000.25},"
                     "{\"name\":\"b\",\"mtime\":-1.5e+20,\"m\":2E-3}],\"t\":[[],{}]}"));
    cr_assert(jcheck(" {\"a\": [1, 2 ,3]}\t"));
    /* The same key in two objects is no duplicate. */
    cr_assert(jcheck("{\"a\":{\"k\":1},\"b\":{\"k\":2}}"));
    /* The whole of the answer of a real fs.read, as the worker would send it. */
    json_t *res = json_pack("{s:s, s:i, s:b}", "content", "line 1\nline 2\r\n\x01 caf\xc3\xa9",
                            "size", 20, "truncated", 0);
    char *text = json_dumps(res, JSON_COMPACT);
    cr_assert(conch_fs_json_object_check(text, strlen(text)));
    free(text);
    json_decref(res);
}

Test(fs_json, refuses_what_could_break_the_line_or_the_stream)
{
    /* Not one object. */
    cr_assert_not(jcheck(""));
    cr_assert_not(jcheck("[]"));
    cr_assert_not(jcheck("\"s\""));
    cr_assert_not(jcheck("{}{}"));
    cr_assert_not(jcheck("{},"));
    cr_assert_not(jcheck("{\"a\":1}, \"id\": 5, \"error\": {}"));
    cr_assert_not(jcheck("{\"a\":1}}"));
    cr_assert_not(jcheck("{\"a\":1"));
    cr_assert_not(jcheck("{\"a\":[1}"));
    cr_assert_not(jcheck("{\"a\":{]}"));
    cr_assert_not(jcheck("{\"a\"}"));
    cr_assert_not(jcheck("{\"a\":}"));
    cr_assert_not(jcheck("{\"a\":1,}"));
    cr_assert_not(jcheck("{,\"a\":1}"));
    cr_assert_not(jcheck("{\"a\":[1,]}"));
    cr_assert_not(jcheck("{1:2}"));
    /* Raw line breaks and control characters, inside strings or between tokens. */
    cr_assert_not(jcheck("{\"a\":\"x\ny\"}"));
    cr_assert_not(jcheck("{\"a\":\"x\ry\"}"));
    cr_assert_not(jcheck("{\"a\":1,\n\"b\":2}"));
    cr_assert_not(jcheck("{\"a\":\"\x01\"}"));
    cr_assert_not(jcheck("{\"a\":\"\x1f\"}"));
    /* Strings: unterminated, bad escapes, bad UTF-8. */
    cr_assert_not(jcheck("{\"a\":\"x}"));
    cr_assert_not(jcheck("{\"a\":\"x\\\"}"));
    cr_assert_not(jcheck("{\"a\":\"\\x\"}"));
    cr_assert_not(jcheck("{\"a\":\"\\u12\"}"));
    cr_assert_not(jcheck("{\"a\":\"\\u12g4\"}"));
    cr_assert_not(jcheck("{\"a\":\"\\ud800\"}"));
    cr_assert_not(jcheck("{\"a\":\"\xff\"}"));
    cr_assert_not(jcheck("{\"a\":\"\xc3\"}"));
    cr_assert_not(jcheck("{\"a\":\"\xc0\xaf\"}"));         /* overlong */
    cr_assert_not(jcheck("{\"a\":\"\xed\xa0\x80\"}"));     /* a surrogate */
    cr_assert_not(jcheck("{\"a\":\"\xf4\x90\x80\x80\"}")); /* past U+10FFFF */
    /* Numbers and literals. */
    cr_assert_not(jcheck("{\"a\":01}"));
    cr_assert_not(jcheck("{\"a\":1.}"));
    cr_assert_not(jcheck("{\"a\":.5}"));
    cr_assert_not(jcheck("{\"a\":1e}"));
    cr_assert_not(jcheck("{\"a\":-}"));
    cr_assert_not(jcheck("{\"a\":NaN}"));
    cr_assert_not(jcheck("{\"a\":Infinity}"));
    cr_assert_not(jcheck("{\"a\":tru}"));
    cr_assert_not(jcheck("{\"a\":nul}"));
    /* Duplicate keys, escaped keys: the slow path's business. */
    cr_assert_not(jcheck("{\"a\":1,\"a\":2}"));
    cr_assert_not(jcheck("{\"a\":{\"k\":1,\"j\":2,\"k\":3}}"));
    cr_assert_not(jcheck("{\"\\u0061\":1}"));
    /* Embedded NUL bytes (raw) are control characters. */
    cr_assert_not(conch_fs_json_object_check("{\"a\":\"\0\"}", 8));
    cr_assert_not(conch_fs_json_object_check("{}\0", 3));
}

Test(fs_json, bounds_depth_and_keys)
{
    char deep[200] = "{\"a\":";
    for (int i = 0; i < 40; i++)
        strcat(deep, "[");
    for (int i = 0; i < 40; i++)
        strcat(deep, "]");
    strcat(deep, "}");
    cr_assert_not(jcheck(deep));
    char ok[200] = "{\"a\":";
    for (int i = 0; i < 30; i++)
        strcat(ok, "[");
    for (int i = 0; i < 30; i++)
        strcat(ok, "]");
    strcat(ok, "}");
    cr_assert(jcheck(ok));
    char many[600] = "{";
    for (int i = 0; i < 33; i++)
        sprintf(many + strlen(many), "%s\"k%d\":%d", i ? "," : "", i, i);
    strcat(many, "}");
    cr_assert_not(jcheck(many));
    many[0] = '\0';
    strcat(many, "{");
    for (int i = 0; i < 32; i++)
        sprintf(many + strlen(many), "%s\"k%d\":%d", i ? "," : "", i, i);
    strcat(many, "}");
    cr_assert(jcheck(many));
}

/* A lying worker cannot reach past its result: whatever the check lets through, spliced
 * into the daemon's response line as the result, is one line holding one object whose only
 * members are the daemon's own (jsonrpc, id, result), the result being what was sent. */
static void splice_is_safe(const char *ans, size_t n)
{
    if (!conch_fs_json_object_check(ans, n))
        return;
    size_t cap = n + 64;
    char *line = malloc(cap);
    cr_assert_not_null(line);
    int h = snprintf(line, cap, "{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":");
    memcpy(line + h, ans, n);
    memcpy(line + h + n, "}", 2);
    size_t len = (size_t)h + n + 1;
    cr_assert_null(memchr(line, '\n', len), "a line break got through: %.*s", (int)n, ans);
    cr_assert_null(memchr(line, '\r', len));
    json_error_t jerr;
    json_t *v = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    cr_assert_not_null(v, "spliced answer does not parse (%s): %.*s", jerr.text, (int)n, ans);
    cr_assert_eq(json_object_size(v), 3);
    cr_assert_eq(json_integer_value(json_object_get(v, "id")), 7);
    cr_assert(json_is_object(json_object_get(v, "result")));
    json_t *alone = json_loadb(ans, n, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &jerr);
    cr_assert(json_equal(alone, json_object_get(v, "result")));
    json_decref(alone);
    json_decref(v);
    free(line);
}

Test(fs_json, a_lying_worker_cannot_inject)
{
    static const char *const lies[] = {
        "{\"content\":\"x\"},\"id\":8,\"error\":{\"code\":1}",
        "{\"content\":\"x\"}\n{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{}}",
        "{\"content\":\"x\"}}\n{\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{",
        "{\"content\":\"x\\\"},\"id\":8,\"x\":\"\"}",
        "{\"content\":\"x\"} ",
        "{\"id\":8,\"id\":9}",
        "{\"content\":\"\xc0\x22},\\\"id\\\":8\"}",
        "{\"content\":\"\xe2\x80\"},\"id\":8}",
        "{\"a\":[1,2}],\"id\":8}",
    };
    for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++)
        splice_is_safe(lies[i], strlen(lies[i]));
    /* Random corruptions of a real answer: flipped, inserted and removed bytes. */
    const char *base =
        "{\"entries\":[{\"name\":\"a\\\"b\",\"path\":\"/workspace/a\",\"type\":\"f\","
        "\"size\":12,\"mode\":\"0644\",\"mtime\":1733000000.5}],\"x\":[true,false,"
        "null,-1.5e3,\"\\u00e9\xc3\xa9\\n\"]}";
    size_t bn = strlen(base);
    cr_assert(conch_fs_json_object_check(base, bn));
    static const char alphabet[] = "{}[]\",:\\\n\r\t 0123456789.eE+-tfnul\x01\x7f\x80\xc3\xa9\xff";
    unsigned seed = 12345;
    char buf[512];
    for (int round = 0; round < 200000; round++) {
        memcpy(buf, base, bn);
        size_t n = bn;
        int edits = 1 + (int)(rand_r(&seed) % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)rand_r(&seed) % n;
            char c = alphabet[(size_t)rand_r(&seed) % (sizeof(alphabet) - 1)];
            switch (rand_r(&seed) % 3) {
            case 0:
                buf[at] = c;
                break;
            case 1:
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
                break;
            default:
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
            }
        }
        splice_is_safe(buf, n);
    }
}

/* The names in dir/@sub starting with ".conch-write-". */
static int leftovers(const char *sub)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, sub);
    DIR *d = opendir(p);
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, ".conch-write-", 13);
    closedir(d);
    return n;
}

/* The number of fds this process has open. */
static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

/* With deferral on, a replaced file's name goes at once and its inode is held open until
 * conch_fs_release_deferred or the next call: no temporary name is left for a scan to see,
 * readers of the old file keep it, the new one is whole at once, modes are kept (those the
 * umask would cut too: the fchmod path). Off, nothing is held. */
Test(fs, replaced_files_go_after_the_answer)
{
    json_decref(call_ok("write", json_pack("{s:s, s:s}", "path", "d/d.txt", "content", "one")));
    char p[512];
    snprintf(p, sizeof(p), "%s/d/d.txt", dir);
    cr_assert_eq(chmod(p, 0666), 0);
    struct stat st0, st;
    cr_assert_eq(stat(p, &st0), 0);
    _cleanup_close_ int reader = open(p, O_RDONLY | O_CLOEXEC);
    conch_fs_defer_replaced(true);
    int fds0 = open_fds();
    json_t *r = call_ok("write", json_pack("{s:s, s:s}", "path", "d/d.txt", "content", "two"));
    cr_assert(!flag(r, "created"));
    json_decref(r);
    cr_assert_eq(leftovers("d"), 0);
    cr_assert_eq(open_fds(), fds0 + 1);
    cr_assert_eq(stat(p, &st), 0);
    cr_assert_neq(st.st_ino, st0.st_ino);
    cr_assert_eq(st.st_mode & 07777, 0666);
    _cleanup_free_ char *c = get("d/d.txt", NULL);
    cr_assert_str_eq(c, "two");
    char old[8] = {0};
    cr_assert_eq(read(reader, old, sizeof(old) - 1), 3);
    cr_assert_str_eq(old, "one");
    cr_assert_eq(fstat(reader, &st), 0);
    cr_assert_eq(st.st_nlink, 0);
    conch_fs_release_deferred();
    cr_assert_eq(open_fds(), fds0);
    /* The next call releases them too; edits defer as writes do; a new file has nothing to
     * leave. */
    json_decref(call_ok("edit", json_pack("{s:s, s:s, s:s}", "path", "d/d.txt", "old_string", "two",
                                          "new_string", "three")));
    cr_assert_eq(leftovers("d"), 0);
    cr_assert_eq(open_fds(), fds0 + 1);
    json_decref(call_ok("write", json_pack("{s:s, s:s}", "path", "d/new.txt", "content", "n")));
    cr_assert_eq(open_fds(), fds0);
    _cleanup_free_ char *c2 = get("d/d.txt", NULL);
    cr_assert_str_eq(c2, "three");
    /* Off: a plain rename over the file. */
    conch_fs_defer_replaced(false);
    json_decref(call_ok("write", json_pack("{s:s, s:s}", "path", "d/d.txt", "content", "four")));
    cr_assert_eq(leftovers("d"), 0);
    cr_assert_eq(open_fds(), fds0);
    _cleanup_free_ char *c3 = get("d/d.txt", NULL);
    cr_assert_str_eq(c3, "four");
}
