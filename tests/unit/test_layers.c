/* test_layers.c - unit tests for the layer store (src/workspace/layers.c): freezing an upper
 * dir is a rename that never overwrites a layer, measuring, removing, ids checked, and
 * squashing a stack into one layer that shows over the base what the stack showed
 * (whiteouts kept, an opaque dir replacing the dirs below it, a dir over a whiteout made
 * opaque). */
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

static char base[64];
static int store = -1;

static void setup_store(void)
{
    strcpy(base, "/tmp/conch-layers-XXXXXX");
    cr_assert_not_null(mkdtemp(base));
    char p[128];
    snprintf(p, sizeof(p), "%s/store", base);
    cr_assert_eq(mkdir(p, 0700), 0);
    store = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(store, 0);
}

static void teardown_store(void)
{
    close(store);
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(layers, .init = setup_store, .fini = teardown_store);

static void put(const char *rel, const char *text)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s: %s", p, strerror(errno));
    fputs(text, f);
    fclose(f);
}

static void dir(const char *rel)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    cr_assert_eq(mkdir(p, 0755), 0, "%s: %s", p, strerror(errno));
}

static void whiteout(const char *rel)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    cr_assert_eq(mknod(p, S_IFCHR | 0600, makedev(0, 0)), 0, "%s: %s", p, strerror(errno));
}

static void opaque(const char *rel)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    cr_assert_eq(setxattr(p, "user.overlay.opaque", "y", 1, 0), 0, "%s: %s", p, strerror(errno));
}

static char kind(const char *rel)
{
    char p[256];
    struct stat st;
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    if (lstat(p, &st) < 0)
        return '-';
    if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0))
        return 'w';
    return S_ISDIR(st.st_mode) ? 'd' : S_ISREG(st.st_mode) ? 'f' : '?';
}

static bool is_opaque(const char *rel)
{
    char p[256], v[4];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    return getxattr(p, "user.overlay.opaque", v, sizeof(v)) == 1 && v[0] == 'y';
}

static char *text(const char *rel)
{
    static char buf[128];
    char p[256];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(layers, freeze_is_a_rename_that_never_overwrites)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/sb", base);
    cr_assert_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/sb/upper", base);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/sb/upper/f", base);
    FILE *f = fopen(p, "w");
    fputs("data", f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/sb", base);
    _cleanup_close_ int from = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat before, after;
    snprintf(p, sizeof(p), "%s/sb/upper", base);
    cr_assert_eq(stat(p, &before), 0);
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_layer_freeze(from, "upper", store, "snap-1", &err), 0, "%s", err.msg);
    snprintf(p, sizeof(p), "%s/store/snap-1", base);
    cr_assert_eq(stat(p, &after), 0);
    cr_assert_eq(before.st_ino, after.st_ino, "moved, not copied");
    cr_assert_str_eq(text("snap-1/f"), "data");
    /* Nothing was written since: an empty layer. */
    cr_assert_eq(conch_ws_layer_freeze(from, "upper", store, "snap-2", &err), 0, "%s", err.msg);
    cr_assert_eq(kind("snap-2"), 'd');
    /* An id in the store is never overwritten; bad ids are refused. */
    snprintf(p, sizeof(p), "%s/sb/upper", base);
    cr_assert_eq(mkdir(p, 0755), 0);
    cr_assert_lt(conch_ws_layer_freeze(from, "upper", store, "snap-1", &err), 0);
    cr_assert_str_eq(text("snap-1/f"), "data");
    cr_assert_lt(conch_ws_layer_freeze(from, "upper", store, "../x", &err), 0);
    cr_assert_lt(conch_ws_layer_freeze(from, "upper", store, ".hidden", &err), 0);
    cr_assert_lt(conch_ws_layer_remove(store, "..", &err), 0);
    uint64_t bytes = 0, files = 0;
    cr_assert_eq(conch_ws_layer_measure(store, "snap-1", &bytes, &files, &err), 0, "%s", err.msg);
    cr_assert_eq(files, 1);
    cr_assert_eq(conch_ws_layer_remove(store, "snap-1", &err), 0, "%s", err.msg);
    cr_assert_eq(kind("snap-1"), '-');
}

Test(layers, squash_shows_what_the_stack_showed)
{
    /* l1 (bottom): a, dir/x, dir/keep, a whiteout hiding the base's "gone". */
    dir("l1");
    put("l1/a", "a1");
    dir("l1/dir");
    put("l1/dir/x", "x1");
    put("l1/dir/keep", "k1");
    whiteout("l1/gone");
    dir("l1/sub");
    put("l1/sub/s", "s1");
    /* l2: deletes a, replaces dir by an opaque one holding only y, adds b, edits sub/s. */
    dir("l2");
    whiteout("l2/a");
    dir("l2/dir");
    opaque("l2/dir");
    put("l2/dir/y", "y2");
    put("l2/b", "b2");
    dir("l2/sub");
    put("l2/sub/s", "s2");
    /* l3 (top): a dir where l2 left a whiteout, "gone" back as a file, a new file in sub. */
    dir("l3");
    dir("l3/a");
    put("l3/a/in", "in3");
    put("l3/gone", "back");
    dir("l3/sub");
    put("l3/sub/t", "t3");
    const char *ids[] = {"l3", "l2", "l1"};
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_layer_squash(store, ids, 3, "sq", &err), 0, "%s", err.msg);
    cr_assert_eq(kind("sq/a"), 'd');
    cr_assert(is_opaque("sq/a"), "a dir over a whiteout hides the base's a");
    cr_assert_str_eq(text("sq/a/in"), "in3");
    cr_assert_eq(kind("sq/dir"), 'd');
    cr_assert(is_opaque("sq/dir"));
    cr_assert_eq(kind("sq/dir/x"), '-');
    cr_assert_eq(kind("sq/dir/keep"), '-');
    cr_assert_str_eq(text("sq/dir/y"), "y2");
    cr_assert_str_eq(text("sq/b"), "b2");
    cr_assert_str_eq(text("sq/gone"), "back");
    cr_assert(!is_opaque("sq/sub"), "sub merges with the base's");
    cr_assert_str_eq(text("sq/sub/s"), "s2");
    cr_assert_str_eq(text("sq/sub/t"), "t3");
    /* The layers are untouched, and no temporary is left. */
    cr_assert_eq(kind("l2/a"), 'w');
    cr_assert_str_eq(text("l1/a"), "a1");
    cr_assert_eq(kind(".squash-sq"), '-');
    /* A second squash under the same id is refused, the first kept. */
    cr_assert_lt(conch_ws_layer_squash(store, ids, 3, "sq", &err), 0);
    cr_assert_str_eq(text("sq/b"), "b2");
}

static int open_rel(const char *rel)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/store/%s", base, rel);
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "%s: %s", p, strerror(errno));
    return fd;
}

Test(layers, since_compares_the_layers_above_with_the_view_at_the_snapshot)
{
    /* The host dir, the snapshot s1 on it, the layer l2 above s1, and the live upper. */
    dir("host");
    put("host/h", "h");
    put("host/gone", "g");
    put("host/same", "same");
    dir("host/hd");
    put("host/hd/h1", "1");
    put("host/hd/h2", "2");
    dir("s1");
    put("s1/s", "s1");
    whiteout("s1/gone");
    dir("s1/sd");
    put("s1/sd/x", "x1");
    dir("l2");
    whiteout("l2/s");
    put("l2/n2", "n2");
    dir("l2/hd");
    opaque("l2/hd");
    put("l2/hd/new", "new");
    dir("up");
    put("up/h", "h-live");
    whiteout("up/n2");
    dir("up/sd");
    put("up/sd/x", "x-live");
    put("up/gone", "again");
    put("up/same", "same");
    dir("work");
    int layers[2] = {open_rel("l2"), open_rel("s1")};
    int host = open_rel("host"), up = open_rel("up"), work = open_rel("work");
    struct conch_ws_since s;
    struct conch_err err = {0};
    cr_assert_eq(conch_ws_since_prepare(up, layers, 2, 1, host, work, &s, &err), 0, "%s", err.msg);
    struct conch_ws_changes ch = {0};
    cr_assert_eq(conch_ws_changes_scan(s.upper, s.lower, &ch, &err), 0, "%s", err.msg);
    static const char *const want[][2] = {
        {"gone", "added"},   {"h", "modified"}, {"hd/h1", "deleted"}, {"hd/h2", "deleted"},
        {"hd/new", "added"}, {"s", "deleted"},  {"sd/x", "modified"},
    };
    cr_assert_eq(ch.n, sizeof(want) / sizeof(want[0]), "%zu changes", ch.n);
    for (size_t i = 0; i < ch.n; i++) {
        cr_assert_str_eq(ch.items[i].path, want[i][0]);
        cr_assert_str_eq(conch_ws_change_kind_name(ch.items[i].kind), want[i][1], "%s", want[i][0]);
    }
    conch_ws_changes_done(&ch);
    /* Since the top layer: the live upper only, against l2 over s1 over the host (the same
     * fds again: each reader starts from their first entry). */
    conch_ws_since_done(&s);
    cr_assert_eq(kind("work/since-view"), '-');
    cr_assert_eq(kind("work/since-upper"), '-');
    cr_assert_eq(conch_ws_since_prepare(up, layers, 2, 0, host, work, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_ws_changes_scan(s.upper, s.lower, &ch, &err), 0, "%s", err.msg);
    cr_assert_eq(ch.n, 4, "%zu changes", ch.n);
    cr_assert_str_eq(ch.items[0].path, "gone");
    cr_assert_str_eq(ch.items[1].path, "h");
    cr_assert_str_eq(ch.items[2].path, "n2");
    cr_assert_eq(ch.items[2].kind, CONCH_CHANGE_DELETED);
    cr_assert_str_eq(ch.items[3].path, "sd/x");
    conch_ws_changes_done(&ch);
    conch_ws_since_done(&s);
    /* Nothing above: no changes, nothing built. */
    cr_assert_eq(conch_ws_since_prepare(-1, layers, 2, 0, host, work, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(s.upper, -1);
    conch_ws_since_done(&s);
    cr_assert_lt(conch_ws_since_prepare(up, layers, 2, 2, host, work, &s, &err), 0);
    close(layers[0]);
    close(layers[1]);
    close(host);
    close(up);
    close(work);
}
