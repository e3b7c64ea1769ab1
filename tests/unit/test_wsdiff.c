/* test_wsdiff.c - unit tests for the workspace's diffs (checked against GNU diff and patch),
 * change selection by path, and removing changes from the overlay upper dir (discard, and
 * after a commit), on lower/upper trees built by hand. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "workspace/workspace.h"

/* ---- building trees ---------------------------------------------------------------- */

static char base[64];
static char lower[128], upper[128], scratch[128];

static void setup_dirs(void)
{
    umask(022);
    strcpy(base, "/tmp/conch-wsdiff-XXXXXX");
    cr_assert_not_null(mkdtemp(base));
    snprintf(lower, sizeof(lower), "%s/lower", base);
    snprintf(upper, sizeof(upper), "%s/upper", base);
    snprintf(scratch, sizeof(scratch), "%s/scratch", base);
    cr_assert_eq(mkdir(lower, 0755), 0);
    cr_assert_eq(mkdir(upper, 0755), 0);
    cr_assert_eq(mkdir(scratch, 0755), 0);
}

static void teardown_dirs(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    if (base[0] && system(cmd) != 0)
        fprintf(stderr, "cleanup of %s failed\n", base);
}

TestSuite(wsdiff, .init = setup_dirs, .fini = teardown_dirs, .timeout = 60);

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

static void put(const char *root, const char *rel, const char *text)
{
    put_n(root, rel, text, strlen(text), 0644);
}

static void mkd(const char *root, const char *rel)
{
    cr_assert_eq(mkdir(at(root, rel), 0755), 0, "mkdir %s/%s: %s", root, rel, strerror(errno));
}

static void lnk(const char *root, const char *rel, const char *target)
{
    cr_assert_eq(symlink(target, at(root, rel)), 0, "symlink %s: %s", rel, strerror(errno));
}

static void whiteout(const char *root, const char *rel)
{
    cr_assert_eq(mknod(at(root, rel), S_IFCHR | 0, makedev(0, 0)), 0, "mknod %s: %s", rel,
                 strerror(errno));
}

static void opaque(const char *root, const char *rel)
{
    cr_assert_eq(setxattr(at(root, rel), "user.overlay.opaque", "y", 1, 0), 0, "setxattr %s: %s",
                 rel, strerror(errno));
}

static int open_dir(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s: %s", path, strerror(errno));
    return fd;
}

/* Reads a whole file (or a command's output, if @cmd) into a new string. */
static char *slurp_stream(FILE *f)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    cr_assert_not_null(m);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        fwrite(chunk, 1, n, m);
    fclose(m);
    return buf;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return NULL;
    char *s = slurp_stream(f);
    fclose(f);
    return s;
}

static char *run(const char *cmd)
{
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    char *s = slurp_stream(p);
    pclose(p);
    return s;
}

/* ---- scanning and diffing ---------------------------------------------------------- */

static void scan(struct conch_ws_changes *out)
{
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_changes_scan(u, l, out, &err), 0, "scan: %s", err.msg);
}

static void dump(const struct conch_ws_changes *c)
{
    for (size_t i = 0; i < c->n; i++)
        fprintf(stderr, "  %-12s %c %s\n", conch_ws_change_kind_name(c->items[i].kind),
                c->items[i].type, c->items[i].path);
}

/* Diffs the whole tree (or @paths) and returns the JSON result (caller decrefs). */
static json_t *diff_paths(char *const *paths, size_t max)
{
    struct conch_ws_changes c = {0};
    scan(&c);
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    struct conch_err err = {0};
    json_t *res = NULL;
    int r = conch_ws_diff(u, l, &c, paths, max, 0, &res, &err);
    conch_ws_changes_done(&c);
    cr_assert_eq(r, 0, "diff: %s", err.msg);
    cr_assert_not_null(res);
    /* Whatever went in, the result must serialise as JSON (valid UTF-8). */
    char *s = json_dumps(res, 0);
    cr_assert_not_null(s, "result does not serialise");
    free(s);
    return res;
}

static json_t *file_entry(json_t *res, const char *path)
{
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(res, "files"), i, f)
    {
        if (strcmp(json_string_value(json_object_get(f, "path")), path) == 0)
            return f;
    }
    char *s = json_dumps(res, JSON_INDENT(1));
    cr_log_error("%s", s);
    free(s);
    cr_assert_fail("'%s' not in the diff", path);
    return NULL;
}

static const char *file_diff(json_t *res, const char *path)
{
    return json_string_value(json_object_get(file_entry(res, path), "diff"));
}

static const char *after_headers(const char *d)
{
    for (int i = 0; i < 2 && d; i++) {
        d = strchr(d, '\n');
        d = d ? d + 1 : NULL;
    }
    return d ? d : "";
}

/* Asserts our diff of @rel matches `diff -u` of the lower and upper files, apart from the
 * header lines (diff -u puts timestamps there), and has git-style headers. */
static void expect_like_diff_u(json_t *res, const char *rel)
{
    const char *mine = file_diff(res, rel);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "diff -u '%s' '%s'", at(lower, rel), at(upper, rel));
    _cleanup_free_ char *ref = run(cmd);
    cr_assert_neq(ref[0], '\0', "diff -u found no difference in %s", rel);
    char head[600];
    snprintf(head, sizeof(head), "--- a/%s\n+++ b/%s\n@@", rel, rel);
    cr_assert_eq(strncmp(mine, head, strlen(head) - 2), 0, "headers:\n%s", mine);
    cr_assert_str_eq(after_headers(mine), after_headers(ref), "ours:\n%s\ndiff -u:\n%s", mine, ref);
}

/* ---- diff -------------------------------------------------------------------------- */

Test(wsdiff, modified_in_several_places_matches_diff_u)
{
    char *a = NULL, *b = NULL;
    size_t la, lb;
    FILE *fa = open_memstream(&a, &la), *fb = open_memstream(&b, &lb);
    for (int i = 1; i <= 120; i++) {
        fprintf(fa, "line %d of the original text\n", i);
        if (i == 2)
            fprintf(fb, "line 2 CHANGED\n");
        else if (i == 20)
            fprintf(fb, "inserted before 20\nline 20 of the original text\n");
        else if (i >= 50 && i <= 53)
            continue; /* deleted */
        else if (i == 58)
            fprintf(fb, "line 58 changed\nand grew\n");
        else if (i == 65) /* 6 lines from the change at 58: one hunk, as in diff -u */
            fprintf(fb, "line 65 changed\n");
        else if (i == 120)
            fprintf(fb, "the last line\n");
        else
            fprintf(fb, "line %d of the original text\n", i);
    }
    fclose(fa);
    fclose(fb);
    put(lower, "text.txt", a);
    put(upper, "text.txt", b);
    free(a);
    free(b);

    json_t *res = diff_paths(NULL, 0);
    expect_like_diff_u(res, "text.txt");
    json_t *f = file_entry(res, "text.txt");
    cr_assert_str_eq(json_string_value(json_object_get(f, "kind")), "modified");
    cr_assert(json_is_false(json_object_get(f, "binary")));
    /* Four hunks: 2, 20, 50-65 merged, 120. */
    int hunks = 0;
    for (const char *p = file_diff(res, "text.txt"); (p = strstr(p, "\n@@ ")); p++)
        hunks++;
    cr_assert_eq(hunks, 4, "hunks: %d", hunks);
    json_decref(res);
}

Test(wsdiff, added_and_deleted)
{
    put(upper, "new.txt", "one\ntwo\n");
    put(lower, "old.txt", "bye\n");
    whiteout(upper, "old.txt");
    put(upper, "empty", "");
    json_t *res = diff_paths(NULL, 0);
    cr_assert_str_eq(file_diff(res, "new.txt"),
                     "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n");
    cr_assert_str_eq(file_diff(res, "old.txt"),
                     "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n");
    cr_assert_str_eq(file_diff(res, "empty"), "--- /dev/null\n+++ b/empty\n");
    cr_assert_str_eq(json_string_value(json_object_get(file_entry(res, "old.txt"), "kind")),
                     "deleted");
    cr_assert_str_eq(json_string_value(json_object_get(file_entry(res, "new.txt"), "kind")),
                     "added");
    /* The whole diff: each file's diff after a git section header, in path order. */
    cr_assert_str_eq(json_string_value(json_object_get(res, "diff")),
                     "diff --git a/empty b/empty\nnew file mode 100644\n"
                     "--- /dev/null\n+++ b/empty\n"
                     "diff --git a/new.txt b/new.txt\nnew file mode 100644\n"
                     "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+one\n+two\n"
                     "diff --git a/old.txt b/old.txt\ndeleted file mode 100644\n"
                     "--- a/old.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n");
    json_decref(res);
}

Test(wsdiff, no_trailing_newline)
{
    put(lower, "a", "x\ny\nz");
    put(upper, "a", "x\ny\nz\n");
    put(lower, "b", "1\n2\n3\n");
    put(upper, "b", "1\n2\nthree");
    put(lower, "c", "same\nold end");
    put(upper, "c", "same\nnew end");
    json_t *res = diff_paths(NULL, 0);
    expect_like_diff_u(res, "a");
    expect_like_diff_u(res, "b");
    expect_like_diff_u(res, "c");
    cr_assert_not_null(strstr(file_diff(res, "a"), "-z\n\\ No newline at end of file\n+z\n"));
    json_decref(res);
}

Test(wsdiff, binary)
{
    put_n(lower, "bin", "a\0b\n", 4, 0644);
    put_n(upper, "bin", "a\0c\n", 4, 0644);
    put_n(upper, "newbin",
          "\x7f"
          "ELF\0\0",
          6, 0755);
    put(lower, "was_text", "text\n");
    put_n(upper, "was_text", "now\0binary", 10, 0644);
    json_t *res = diff_paths(NULL, 0);
    cr_assert_str_eq(file_diff(res, "bin"), "Binary files a/bin and b/bin differ\n");
    cr_assert_str_eq(file_diff(res, "newbin"), "Binary files /dev/null and b/newbin differ\n");
    cr_assert_str_eq(file_diff(res, "was_text"), "Binary files a/was_text and b/was_text differ\n");
    cr_assert(json_is_true(json_object_get(file_entry(res, "bin"), "binary")));
    cr_assert(json_is_true(json_object_get(file_entry(res, "was_text"), "binary")));
    json_decref(res);
}

Test(wsdiff, symlink_retarget_and_type_change)
{
    lnk(lower, "l", "old/target");
    lnk(upper, "l", "new/target");
    put(lower, "f2l", "was a file\n");
    lnk(upper, "f2l", "f2l-target");
    lnk(upper, "newlink", "/etc/passwd"); /* diffed as text, never followed */
    json_t *res = diff_paths(NULL, 0);
    /* git's form: a link's content is its target, without a newline */
    cr_assert_str_eq(file_diff(res, "l"), "--- a/l\n+++ b/l\n@@ -1 +1 @@\n-old/target\n"
                                          "\\ No newline at end of file\n+new/target\n"
                                          "\\ No newline at end of file\n");
    cr_assert_str_eq(file_diff(res, "f2l"), "--- a/f2l\n+++ /dev/null\n@@ -1 +0,0 @@\n"
                                            "-was a file\n"
                                            "--- /dev/null\n+++ b/f2l\n@@ -0,0 +1 @@\n"
                                            "+f2l-target\n\\ No newline at end of file\n");
    cr_assert_str_eq(json_string_value(json_object_get(file_entry(res, "f2l"), "kind")),
                     "type_changed");
    cr_assert_str_eq(file_diff(res, "newlink"),
                     "--- /dev/null\n+++ b/newlink\n@@ -0,0 +1 @@\n+/etc/passwd\n"
                     "\\ No newline at end of file\n");
    json_decref(res);
}

Test(wsdiff, mode_change_and_dirs)
{
    put(lower, "run.sh", "echo hi\n");
    put_n(upper, "run.sh", "echo hi\n", 8, 0755);
    put(lower, "both.sh", "a\n");
    put_n(upper, "both.sh", "b\n", 2, 0700);
    mkd(upper, "newdir");
    put(upper, "newdir/f", "f\n");
    json_t *res = diff_paths(NULL, 0);
    cr_assert_str_eq(file_diff(res, "run.sh"), "old mode 100644\nnew mode 100755\n");
    cr_assert_str_eq(file_diff(res, "both.sh"),
                     "old mode 100644\nnew mode 100700\n--- a/both.sh\n+++ b/both.sh\n"
                     "@@ -1 +1 @@\n-a\n+b\n");
    cr_assert_str_eq(file_diff(res, "newdir"), "");
    cr_assert_str_eq(file_diff(res, "newdir/f"), "--- /dev/null\n+++ b/newdir/f\n"
                                                 "@@ -0,0 +1 @@\n+f\n");
    /* A mode-only change is attributed to its file in the whole diff. */
    cr_assert_not_null(strstr(json_string_value(json_object_get(res, "diff")),
                              "diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"));
    json_decref(res);
}

Test(wsdiff, invalid_utf8_replaced)
{
    put(lower, "latin1.txt", "caf\xe9\nok\n");
    /* A lone continuation byte, a truncated 3-byte sequence, an overlong NUL, a
     * surrogate, and valid multi-byte text that must survive. */
    put(upper, "latin1.txt",
        "caf\xc3\xa9 \x80 \xe2\x82 \xc0\x80 \xed\xa0\x80 \xf0\x9f\x90\x9a\nok\n");
    put(upper, "name-\xff.txt", "x\n");
    json_t *res = diff_paths(NULL, 0);
    cr_assert_str_eq(file_diff(res, "latin1.txt"),
                     "--- a/latin1.txt\n+++ b/latin1.txt\n@@ -1,2 +1,2 @@\n"
                     "-caf\xef\xbf\xbd\n"
                     "+caf\xc3\xa9 \xef\xbf\xbd \xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
                     "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xf0\x9f\x90\x9a\n"
                     " ok\n");
    cr_assert_str_eq(file_diff(res, "name-\xef\xbf\xbd.txt"),
                     "--- /dev/null\n+++ \"b/name-\\377.txt\"\n@@ -0,0 +1 @@\n+x\n");
    json_decref(res);
}

Test(wsdiff, too_large_and_paths)
{
    char big[5000];
    memset(big, 'x', sizeof(big));
    big[sizeof(big) - 1] = '\n';
    put_n(lower, "big", big, sizeof(big), 0644);
    big[0] = 'y';
    put_n(upper, "big", big, sizeof(big), 0644);
    mkd(lower, "src");
    put(lower, "src/a.c", "int a;\n");
    put(upper, "src-b.c", "b\n");
    mkd(upper, "src");
    put(upper, "src/a.c", "int a = 1;\n");
    put(upper, "src/new.c", "new\n");
    json_t *res = diff_paths(NULL, 1000);
    cr_assert_str_eq(file_diff(res, "big"), "[diff omitted: file larger than 1000 bytes]\n");
    json_decref(res);

    char *paths[] = {"/workspace/src", NULL};
    res = diff_paths(paths, 0);
    json_t *files = json_object_get(res, "files");
    cr_assert_eq(json_array_size(files), 2, "src selects src/a.c and src/new.c, not src-b.c");
    cr_assert_str_eq(file_diff(res, "src/a.c"),
                     "--- a/src/a.c\n+++ b/src/a.c\n@@ -1 +1 @@\n-int a;\n+int a = 1;\n");
    file_entry(res, "src/new.c");
    json_decref(res);

    struct conch_ws_changes c = {0};
    scan(&c);
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    struct conch_err err = {0};
    char *missing[] = {"nope", NULL};
    res = NULL;
    cr_assert_eq(conch_ws_diff(u, l, &c, missing, 0, 0, &res, &err), -ENOENT);
    cr_assert_null(res);
    cr_assert_not_null(strstr(err.msg, "'nope'"), "%s", err.msg);
    conch_ws_changes_done(&c);
}

/* Random edits, checked two ways: GNU patch applied to our diff reproduces the new file,
 * and the number of changed lines equals diff --minimal's (Myers' result is minimal). */
Test(wsdiff, random_edits_roundtrip_through_patch)
{
    static const char *words[] = {"alpha", "beta", "gamma", "delta", "{", "}", ""};
    srand(12345);
    for (int round = 0; round < 60; round++) {
        char *a = NULL, *b = NULL;
        size_t la, lb;
        FILE *fa = open_memstream(&a, &la), *fb = open_memstream(&b, &lb);
        int n = rand() % 60;
        for (int i = 0; i < n; i++) {
            const char *w = words[rand() % 7];
            fprintf(fa, "%s\n", w);
            int op = rand() % 10;
            if (op == 0)
                continue;
            if (op == 1)
                fprintf(fb, "%s\n", words[rand() % 7]);
            else if (op == 2)
                fprintf(fb, "%s\n%s\n", w, words[rand() % 7]);
            else
                fprintf(fb, "%s\n", w);
        }
        if (rand() % 4 == 0)
            fprintf(fa, "tail");
        if (rand() % 4 == 0)
            fprintf(fb, "tail2");
        fclose(fa);
        fclose(fb);
        bool same = la == lb && memcmp(a, b, la) == 0;
        put_n(lower, "r.txt", a, la, 0644);
        put_n(upper, "r.txt", b, lb, 0644);
        free(a);
        free(b);
        if (same)
            continue;

        json_t *res = diff_paths(NULL, 0);
        const char *mine = file_diff(res, "r.txt");
        FILE *pf = fopen(at(scratch, "r.patch"), "we");
        fputs(mine, pf);
        fclose(pf);
        char cmd[1024];
        snprintf(cmd, sizeof(cmd), "patch -s -o '%s' '%s' '%s' 2>&1 && cmp '%s' '%s' 2>&1",
                 at(scratch, "out"), at(lower, "r.txt"), at(scratch, "r.patch"), at(scratch, "out"),
                 at(upper, "r.txt"));
        _cleanup_free_ char *out = run(cmd);
        cr_assert_str_eq(out, "", "round %d: %s\npatch:\n%s", round, out, mine);

        snprintf(cmd, sizeof(cmd), "diff --minimal -u '%s' '%s' | tail -n +3 | grep -c '^[-+]'",
                 at(lower, "r.txt"), at(upper, "r.txt"));
        _cleanup_free_ char *ref = run(cmd);
        int mine_n = 0;
        for (const char *p = after_headers(mine); *p; p = strchr(p, '\n') + 1)
            mine_n += *p == '-' || *p == '+';
        cr_assert_eq(mine_n, atoi(ref), "round %d: %d changed lines, diff --minimal %d\n%s", round,
                     mine_n, atoi(ref), mine);
        json_decref(res);
        cr_assert_eq(unlink(at(scratch, "out")), 0);
    }
}

/* The whole diff is a patch git applies: the host copy then equals the sandbox's view. */
Test(wsdiff, whole_diff_applies_with_git)
{
    put(lower, "keep", "k\n");
    put(lower, "mod", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n");
    put(upper, "mod", "1\n2\nthree\n4\n5\n6\n7\n8\n9\nten");
    put(lower, "del", "d\n");
    whiteout(upper, "del");
    mkd(upper, "nd");
    put(upper, "nd/new", "n\n");
    put(lower, "x.sh", "x\n");
    put_n(upper, "x.sh", "x\n", 2, 0755);
    put(upper, "empty", "");
    put(lower, "t", "a file that becomes a dir\n");
    mkd(upper, "t");
    put(upper, "t/in", "inside\n");
    json_t *res = diff_paths(NULL, 0);
    FILE *pf = fopen(at(scratch, "all.patch"), "we");
    fputs(json_string_value(json_object_get(res, "diff")), pf);
    fclose(pf);
    json_decref(res);
    char cmd[1024];
    /* The upper dir holds only what changed ("keep" is not there) and a whiteout for
     * "del", which diff -r would see as a special file. */
    snprintf(
        cmd, sizeof(cmd),
        "cp -a '%s' '%s/host' && cd '%s/host' && git apply '%s' 2>&1 && "
        "diff -r --exclude=del --exclude=keep '%s/host' '%s' 2>&1; test -x '%s/host/x.sh' || echo "
        "x.sh not executable",
        lower, scratch, scratch, at(scratch, "all.patch"), scratch, upper, scratch);
    _cleanup_free_ char *out = run(cmd);
    cr_assert_str_eq(out, "", "%s", out);
    _cleanup_free_ char *del = slurp(at(scratch, "host/del"));
    cr_assert_null(del, "del not deleted by git apply");
}

/* ---- select ------------------------------------------------------------------------ */

static struct conch_ws_changes make_changes(const char *const *paths)
{
    struct conch_ws_changes c = {0};
    while (paths[c.n])
        c.n++;
    c.items = calloc(c.n, sizeof(*c.items));
    for (size_t i = 0; i < c.n; i++) {
        c.items[i].path = strdup(paths[i]);
        c.items[i].kind = CONCH_CHANGE_ADDED;
        c.items[i].type = 'f';
        c.items[i].size = i;
    }
    return c;
}

static void expect_paths(const struct conch_ws_changes *c, const char *const *want)
{
    size_t n = 0;
    while (want[n])
        n++;
    if (c->n != n)
        dump(c);
    cr_assert_eq(c->n, n, "got %zu changes, want %zu", c->n, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_str_eq(c->items[i].path, want[i]);
}

Test(wsdiff, select_by_dir_and_file)
{
    /* Not sorted on purpose: select must not rely on the order. */
    const char *all_paths[] = {"src/z.c", "src",  "src-old/x", "src/lib/a.c",
                               "README",  "srcs", NULL};
    struct conch_ws_changes all = make_changes(all_paths);
    struct conch_ws_changes sel = {0};
    struct conch_err err = {0};

    char *p1[] = {"src", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, p1, &sel, &err), 0, "%s", err.msg);
    expect_paths(&sel, (const char *[]){"src/z.c", "src", "src/lib/a.c", NULL});
    cr_assert_eq(sel.items[0].size, 0, "fields are copied");
    cr_assert_neq(sel.items[0].path, all.items[0].path, "paths are deep copies");
    conch_ws_changes_done(&sel);

    char *p2[] = {"/workspace/README", "./src/lib/", "src/lib/a.c", "src/x/../z.c", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, p2, &sel, &err), 0, "%s", err.msg);
    expect_paths(&sel, (const char *[]){"src/z.c", "src/lib/a.c", "README", NULL});
    conch_ws_changes_done(&sel);

    char *p3[] = {"/workspace", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, p3, &sel, &err), 0, "%s", err.msg);
    cr_assert_eq(sel.n, all.n);
    conch_ws_changes_done(&sel);

    cr_assert_eq(conch_ws_changes_select(&all, NULL, &sel, &err), 0, "%s", err.msg);
    cr_assert_eq(sel.n, all.n);
    conch_ws_changes_done(&sel);

    char *bad1[] = {"README", "sr", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, bad1, &sel, &err), -ENOENT);
    cr_assert_not_null(strstr(err.msg, "'sr'"), "%s", err.msg);
    cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    char *bad2[] = {"/etc/passwd", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, bad2, &sel, &err), -EINVAL);
    char *bad3[] = {"src/../../x", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, bad3, &sel, &err), -EINVAL);
    char *bad4[] = {"", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, bad4, &sel, &err), -EINVAL);
    char *bad5[] = {"/workspacex/a", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, bad5, &sel, &err), -EINVAL);
    cr_assert_eq(sel.n, 0);
    conch_ws_changes_done(&all);
}

/* ---- removing from the upper dir ---------------------------------------------------- */

/* A lower/upper pair with every kind of change, including an opaque dir. */
static void build_mixed(void)
{
    put(lower, "keep.txt", "keep\n");
    put(lower, "mod.txt", "old\n");
    put(upper, "mod.txt", "new\n");
    put(lower, "gone.txt", "gone\n");
    whiteout(upper, "gone.txt");
    mkd(upper, "new");
    put(upper, "new/n1", "1\n");
    put(upper, "new/n2", "2\n");
    mkd(lower, "odir");
    put(lower, "odir/x", "lower x\n");
    put(lower, "odir/y", "lower y\n");
    mkd(lower, "odir/sub");
    put(lower, "odir/sub/deep", "deep\n");
    mkd(upper, "odir");
    cr_assert_eq(chmod(at(upper, "odir"), 0700), 0); /* so that "odir" is a change itself */
    opaque(upper, "odir");
    put(upper, "odir/x", "upper x\n");
    put(upper, "odir/z", "upper z\n");
    mkd(lower, "sub");
    put(lower, "sub/f", "f\n");
    mkd(upper, "sub");
    put(upper, "sub/g", "g\n");
    put(lower, "link", "file\n");
    lnk(upper, "link", "somewhere");
}

static void remove_paths(char *const *paths)
{
    struct conch_ws_changes all = {0}, sel = {0};
    scan(&all);
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_changes_select(&all, paths, &sel, &err), 0, "%s", err.msg);
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    cr_assert_eq(conch_ws_upper_remove(u, l, &sel, &err), 0, "%s", err.msg);
    conch_ws_changes_done(&sel);
    conch_ws_changes_done(&all);
}

static void expect_scan(const char *const *want)
{
    struct conch_ws_changes c = {0};
    scan(&c);
    expect_paths(&c, want);
    conch_ws_changes_done(&c);
}

Test(wsdiff, upper_remove_discards)
{
    build_mixed();
    expect_scan((const char *[]){"gone.txt", "link", "mod.txt", "new", "new/n1", "new/n2", "odir",
                                 "odir/sub", "odir/x", "odir/y", "odir/z", "sub/g", NULL});

    /* Files, an added tree, and deletions hidden by an opaque dir (restored from the host,
     * tree included), modifications inside it. */
    remove_paths((char *[]){"mod.txt", "/workspace/new", "odir/y", "odir/x", "odir/sub", NULL});
    expect_scan((const char *[]){"gone.txt", "link", "odir", "odir/z", "sub/g", NULL});
    struct stat st;
    cr_assert_eq(lstat(at(upper, "new"), &st), -1, "the added dir's tree is gone");
    cr_assert_eq(lstat(at(upper, "mod.txt"), &st), -1);
    _cleanup_free_ char *x = slurp(at(upper, "odir/x"));
    cr_assert_str_eq(x, "lower x\n", "the host's file is back in the opaque dir");
    _cleanup_free_ char *deep = slurp(at(upper, "odir/sub/deep"));
    cr_assert_str_eq(deep, "deep\n");

    /* A whiteout, a type change, part of a dir. */
    remove_paths((char *[]){"gone.txt", "link", "sub/g", NULL});
    expect_scan((const char *[]){"odir", "odir/z", NULL});
    cr_assert_eq(lstat(at(upper, "sub"), &st), 0, "dirs are left in place");

    /* The whole opaque dir goes, and the host's shows again. */
    remove_paths((char *[]){"odir", NULL});
    expect_scan((const char *[]){NULL});
    cr_assert_eq(lstat(at(upper, "odir"), &st), -1);
}

Test(wsdiff, upper_remove_after_partial_commit)
{
    build_mixed();
    struct conch_ws_changes all = {0}, sel = {0};
    scan(&all);
    struct conch_err err = {0};
    /* What the daemon does: commit the selection plus the added dir it lives in (the
     * host here is the lower itself), then take only the selection out of the upper. */
    char *paths[] = {"new/n1", "odir/x", "mod.txt", NULL};
    cr_assert_eq(conch_ws_changes_select(&all, paths, &sel, &err), 0, "%s", err.msg);
    /* Selecting "new" would take its whole tree: commit only the dir entry and n1. */
    struct conch_ws_change items[4];
    size_t n = 0;
    for (size_t i = 0; i < all.n; i++)
        if (!strcmp(all.items[i].path, "new") || !strcmp(all.items[i].path, "new/n1") ||
            !strcmp(all.items[i].path, "odir/x") || !strcmp(all.items[i].path, "mod.txt"))
            items[n++] = all.items[i];
    cr_assert_eq(n, 4);
    struct conch_ws_changes to_commit = {.items = items, .n = n};
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    cr_assert_eq(conch_ws_commit(u, l, &to_commit, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_ws_upper_remove(u, l, &sel, &err), 0, "%s", err.msg);
    conch_ws_changes_done(&sel);
    conch_ws_changes_done(&all);

    expect_scan((const char *[]){"gone.txt", "link", "new/n2", "odir", "odir/sub", "odir/y",
                                 "odir/z", "sub/g", NULL});
    _cleanup_free_ char *x = slurp(at(lower, "odir/x"));
    cr_assert_str_eq(x, "upper x\n", "committed");
    _cleanup_free_ char *ux = slurp(at(upper, "odir/x"));
    cr_assert_str_eq(ux, "upper x\n", "still visible in the sandbox");
}

Test(wsdiff, upper_clear)
{
    build_mixed();
    _cleanup_close_ int u = open_dir(upper);
    cr_assert_eq(chmod(at(upper, "new"), 0500), 0); /* read-only dirs go too */
    cr_assert_eq(setxattr(upper, "user.overlay.opaque", "y", 1, 0), 0);
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_upper_clear(u, &err), 0, "%s", err.msg);
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "ls -A '%s'", upper);
    _cleanup_free_ char *left = run(cmd);
    cr_assert_str_eq(left, "", "left in upper: %s", left);
    expect_scan((const char *[]){NULL});
    _cleanup_free_ char *k = slurp(at(lower, "keep.txt"));
    cr_assert_str_eq(k, "keep\n", "the host is untouched");
}

/* A change list naming a path through a symlink (planted in the upper dir) must neither
 * read nor delete what the symlink points at. */
Test(wsdiff, symlinks_in_paths_are_not_followed)
{
    put(scratch, "secret", "root:x:0:0\n");
    lnk(upper, "evil", scratch);
    const char *paths[] = {"evil/secret", NULL};
    struct conch_ws_changes c = make_changes(paths);
    _cleanup_close_ int u = open_dir(upper);
    _cleanup_close_ int l = open_dir(lower);
    struct conch_err err = {0};
    json_t *res = NULL;
    cr_assert_eq(conch_ws_diff(u, l, &c, NULL, 0, 0, &res, &err), 0, "%s", err.msg);
    char *s = json_dumps(res, 0);
    cr_assert_null(strstr(s, "root:"), "read through a symlink: %s", s);
    free(s);
    json_decref(res);
    cr_assert_lt(conch_ws_upper_remove(u, l, &c, &err), 0);
    cr_assert_not_null(strstr(err.msg, "evil/secret"), "%s", err.msg);
    _cleanup_free_ char *still = slurp(at(scratch, "secret"));
    cr_assert_str_eq(still, "root:x:0:0\n", "deleted through a symlink");
    conch_ws_changes_done(&c);
}

/* ---- issue 6: names in headers, the total cap -------------------------------------- */

/* Names holding a newline (one of them a forged "+++ b/evil" header) are quoted as git
 * quotes them: `git apply` and `patch -p1` both create exactly those files, nothing else. */
Test(wsdiff, names_with_newlines_are_quoted_in_headers)
{
    put(lower, "plain.txt", "one\n");
    put(upper, "plain.txt", "two\n");
    put(upper, "na\nme", "first\n");
    /* Unquoted, "+++ b/x\n+++ b/evil" would have patch write "evil" at the top. */
    mkd(upper, "x\n+++ b");
    put(upper, "x\n+++ b/evil", "second\n");
    put(upper, "tab\there \"q\" \\ caf\xc3\xa9", "third\n");
    json_t *res = diff_paths(NULL, 0);
    const char *d = json_string_value(json_object_get(res, "diff"));
    cr_assert_not_null(strstr(d, "diff --git \"a/na\\nme\" \"b/na\\nme\"\n"), "%s", d);
    cr_assert_not_null(strstr(d, "+++ \"b/x\\n+++ b/evil\"\n"), "%s", d);
    cr_assert_not_null(strstr(d, "+++ \"b/tab\\there \\\"q\\\" \\\\ caf\\303\\251\"\n"), "%s", d);
    cr_assert_null(strstr(d, "\n+++ b/evil"), "%s", d);
    FILE *pf = fopen(at(scratch, "all.patch"), "we");
    fputs(d, pf);
    fclose(pf);
    json_decref(res);
    char cmd[2048];
    static const char *const tools[] = {"git apply", "patch -p1 -s <"};
    for (size_t t = 0; t < ARRAY_SIZE(tools); t++) {
        snprintf(cmd, sizeof(cmd),
                 "rm -rf '%s/h' && cp -a '%s' '%s/h' && cd '%s/h' && %s '%s' 2>&1", scratch, lower,
                 scratch, scratch, tools[t], at(scratch, "all.patch"));
        _cleanup_free_ char *out = run(cmd);
        snprintf(cmd, sizeof(cmd), "%s/h/evil", scratch);
        cr_assert(access(cmd, F_OK) < 0, "%s created a top-level 'evil':\n%s", tools[t], out);
        snprintf(cmd, sizeof(cmd), "%s/h/b", scratch);
        cr_assert(access(cmd, F_OK) < 0, "%s created 'b':\n%s", tools[t], out);
        char p[600];
        snprintf(p, sizeof(p), "%s/h/na\nme", scratch);
        _cleanup_free_ char *a = slurp(p);
        cr_assert_not_null(a, "%s did not create 'na\\nme':\n%s", tools[t], out);
        cr_assert_str_eq(a, "first\n");
        snprintf(p, sizeof(p), "%s/h/x\n+++ b/evil", scratch);
        _cleanup_free_ char *b = slurp(p);
        cr_assert_not_null(b, "%s did not create the forged name:\n%s", tools[t], out);
        cr_assert_str_eq(b, "second\n");
        snprintf(p, sizeof(p), "%s/h/tab\there \"q\" \\ caf\xc3\xa9", scratch);
        _cleanup_free_ char *c = slurp(p);
        cr_assert_not_null(c, "%s: third file missing:\n%s", tools[t], out);
        snprintf(p, sizeof(p), "%s/h/plain.txt", scratch);
        _cleanup_free_ char *e = slurp(p);
        cr_assert_str_eq(e, "two\n");
        /* Exactly these: the host's file, three new ones and the new dir. */
        snprintf(cmd, sizeof(cmd), "find '%s/h' -mindepth 1 -print0 | tr -cd '\\0' | wc -c",
                 scratch);
        _cleanup_free_ char *n = run(cmd);
        cr_assert_eq(atoi(n), 5, "%s: %s entries", tools[t], n);
    }
}

Test(wsdiff, total_cap_lists_the_rest_as_omitted)
{
    char *big = malloc(300000);
    for (size_t i = 0; i < 300000; i++)
        big[i] = i % 60 == 59 ? '\n' : 'a' + (char)(i % 26);
    for (int i = 0; i < 10; i++) {
        char name[16];
        snprintf(name, sizeof(name), "f%d", i);
        put_n(upper, name, big, 300000, 0644);
    }
    free(big);
    json_t *res = NULL;
    {
        struct conch_ws_changes c = {0};
        scan(&c);
        _cleanup_close_ int u = open_dir(upper);
        _cleanup_close_ int l = open_dir(lower);
        struct conch_err err = {0};
        cr_assert_eq(conch_ws_diff(u, l, &c, NULL, 0, 1 << 20, &res, &err), 0, "%s", err.msg);
        conch_ws_changes_done(&c);
    }
    json_int_t omitted = json_integer_value(json_object_get(res, "omitted"));
    size_t whole = strlen(json_string_value(json_object_get(res, "diff")));
    size_t sum = whole, listed = 0, marked = 0;
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(res, "files"), i, f)
    {
        listed++;
        sum += strlen(json_string_value(json_object_get(f, "diff")));
        if (json_is_true(json_object_get(f, "omitted"))) {
            marked++;
            cr_assert_str_eq(json_string_value(json_object_get(f, "diff")), "");
        } else {
            cr_assert_eq(marked, 0, "an omitted file before a diffed one");
        }
    }
    cr_assert_eq(listed, 10);
    cr_assert_leq(sum, 1 << 20);
    /* Each file's diff is ~305 KB, held twice (whole and per file): one fits. */
    cr_assert_eq(omitted, 9, "omitted %lld", (long long)omitted);
    cr_assert_eq(marked, 9);
    json_decref(res);
}
