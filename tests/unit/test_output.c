/* test_output.c - unit tests for src/exec/output: head/tail kept in memory, the spill
 * file holding the whole stream, the spill cap, and binary-safe text. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "exec/output.h"

static char dir[64];

static void mkdir_tmp(void)
{
    strcpy(dir, "/tmp/conch-test-output-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_tmp(void)
{
    /* Only flat files are ever created here. */
    _cleanup_closedir_ DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        unlink(p);
    }
    rmdir(dir);
}

TestSuite(output, .init = mkdir_tmp, .fini = rm_tmp, .timeout = 30);

/* A deterministic pattern whose bytes differ at most positions, with NULs in it. */
static char *pattern(size_t len)
{
    char *p = malloc(len ? len : 1);
    cr_assert_not_null(p);
    for (size_t i = 0; i < len; i++)
        p[i] = (char)((i * 7 + i / 251) & 0xff);
    return p;
}

static char *slurp(const char *path, size_t *ret_len)
{
    FILE *f = fopen(path, "rbe");
    cr_assert_not_null(f, "open %s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        if (n == 0)
            break;
        len += n;
    }
    fclose(f);
    *ret_len = len;
    return buf;
}

/* find - strstr for text that may hold NULs. */
static const char *find(const char *text, size_t len, const char *needle)
{
    return memmem(text, len, needle, strlen(needle));
}

static size_t count_files(void)
{
    _cleanup_closedir_ DIR *d = opendir(dir);
    cr_assert_not_null(d);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    return n;
}

/* Checks the text of a truncated output: head, the spill notice, then the tail. */
static void assert_truncated_text(struct conch_output *o, const char *in, size_t len)
{
    size_t h = o->max_bytes / 2, t = o->max_bytes - h;
    _cleanup_free_ char *text = NULL;
    size_t tlen = 0;
    cr_assert_eq(conch_output_text(o, &text, &tlen), 0);

    char notice[1024];
    snprintf(notice, sizeof(notice), "\n[... %zu bytes omitted; full output in %s ...]\n",
             len - h - t, o->spill_path);
    size_t nlen = strlen(notice);
    cr_assert_eq(tlen, h + nlen + t, "text length %zu, expected %zu", tlen, h + nlen + t);
    cr_assert_eq(text[tlen], '\0');
    cr_assert(memcmp(text, in, h) == 0, "head differs");
    cr_assert(memcmp(text + h, notice, nlen) == 0, "notice differs: %.*s", (int)nlen, text + h);
    cr_assert(memcmp(text + h + nlen, in + len - t, t) == 0, "tail differs");
}

static void assert_spill_equals(struct conch_output *o, const char *in, size_t len)
{
    cr_assert_neq(o->spill_path[0], '\0', "no spill file");
    size_t flen = 0;
    _cleanup_free_ char *file = slurp(o->spill_path, &flen);
    cr_assert_eq(flen, len, "spill has %zu bytes, expected %zu", flen, len);
    cr_assert(memcmp(file, in, len) == 0, "spill content differs");
}

Test(output, small_output_kept_exactly)
{
    struct conch_output o;
    struct conch_err err = {0};
    cr_assert_eq(conch_output_init(&o, "stdout", 100, 1000, dir, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_output_append(&o, "hello ", 6, &err), 0);
    cr_assert_eq(conch_output_append(&o, "world\n", 6, &err), 0);
    cr_assert_not(conch_output_truncated(&o));
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    cr_assert_eq(conch_output_text(&o, &text, &len), 0);
    cr_assert_eq(len, 12);
    cr_assert_str_eq(text, "hello world\n");
    cr_assert_eq(o.spill_fd, -1);
    cr_assert_eq(count_files(), 0, "no spill file below the cap");
    conch_output_done(&o);
}

Test(output, exactly_max_kept_exactly)
{
    for (size_t max = 1; max <= 9; max++) {
        struct conch_output o;
        cr_assert_eq(conch_output_init(&o, "stdout", max, 1000, dir, NULL), 0);
        _cleanup_free_ char *in = pattern(max);
        /* Byte by byte, so the ring sees every path, then as one call below. */
        for (size_t i = 0; i < max; i++)
            cr_assert_eq(conch_output_append(&o, in + i, 1, NULL), 0);
        cr_assert_not(conch_output_truncated(&o));
        _cleanup_free_ char *text = NULL;
        size_t len = 0;
        cr_assert_eq(conch_output_text(&o, &text, &len), 0);
        cr_assert_eq(len, max);
        cr_assert(memcmp(text, in, max) == 0, "max %zu: text differs", max);
        conch_output_done(&o);
    }
    cr_assert_eq(count_files(), 0);

    struct conch_output o;
    _cleanup_free_ char *in = pattern(4096);
    cr_assert_eq(conch_output_init(&o, "stdout", 4096, 1 << 20, dir, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in, 4096, NULL), 0);
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    cr_assert_eq(conch_output_text(&o, &text, &len), 0);
    cr_assert_eq(len, 4096);
    cr_assert(memcmp(text, in, 4096) == 0);
    conch_output_done(&o);
    cr_assert_eq(count_files(), 0);
}

Test(output, max_plus_one_truncates_and_spills_everything)
{
    /* Odd and even caps: the head is max/2, the tail the rest. */
    size_t maxes[] = {10, 11, 4096};
    for (size_t k = 0; k < ARRAY_SIZE(maxes); k++) {
        size_t max = maxes[k];
        struct conch_output o;
        struct conch_err err = {0};
        cr_assert_eq(conch_output_init(&o, "stderr", max, 1 << 20, dir, &err), 0);
        _cleanup_free_ char *in = pattern(max + 1);
        cr_assert_eq(conch_output_append(&o, in, max, &err), 0);
        cr_assert_eq(o.spill_fd, -1);
        cr_assert_eq(conch_output_append(&o, in + max, 1, &err), 0, "%s", err.msg);
        cr_assert(conch_output_truncated(&o));
        cr_assert_geq(o.spill_fd, 0);
        cr_assert_not_null(strstr(o.spill_path, "/conch-stderr-"), "%s", o.spill_path);
        cr_assert_eq(strncmp(o.spill_path, dir, strlen(dir)), 0);
        cr_assert_str_eq(o.spill_path + strlen(o.spill_path) - 4, ".log");

        struct stat st;
        cr_assert_eq(stat(o.spill_path, &st), 0);
        cr_assert_eq(st.st_mode & 07777, 0600);
        int fl = fcntl(o.spill_fd, F_GETFD);
        cr_assert(fl >= 0 && (fl & FD_CLOEXEC), "spill fd must be close-on-exec");

        assert_truncated_text(&o, in, max + 1);
        assert_spill_equals(&o, in, max + 1);
        char path[512];
        strcpy(path, o.spill_path);
        conch_output_done(&o);
        /* The spill file outlives the output: the caller hands its path on. */
        cr_assert_eq(access(path, F_OK), 0);
        unlink(path);
    }
}

Test(output, long_stream_text_and_spill)
{
    size_t len = 1000003;
    _cleanup_free_ char *in = pattern(len);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 1000, 10 << 20, dir, NULL), 0);
    /* Uneven chunk sizes around the ring size, to wrap it at every offset. */
    size_t off = 0, step = 1;
    while (off < len) {
        size_t n = step < len - off ? step : len - off;
        cr_assert_eq(conch_output_append(&o, in + off, n, NULL), 0);
        off += n;
        step = step * 3 % 1201 + 1;
    }
    cr_assert_eq(o.total, len);
    assert_truncated_text(&o, in, len);
    assert_spill_equals(&o, in, len);
    conch_output_done(&o);
}

Test(output, many_small_appends_equal_one_big_append)
{
    size_t len = 5000;
    _cleanup_free_ char *in = pattern(len);
    size_t sizes[] = {0, 1, 7, 100, 101, 4999, 5000, 6000};
    for (size_t k = 0; k < ARRAY_SIZE(sizes); k++) {
        struct conch_output a, b;
        cr_assert_eq(conch_output_init(&a, "one", sizes[k], 1 << 20, dir, NULL), 0);
        cr_assert_eq(conch_output_init(&b, "many", sizes[k], 1 << 20, dir, NULL), 0);
        cr_assert_eq(conch_output_append(&a, in, len, NULL), 0);
        for (size_t i = 0; i < len; i += 3)
            cr_assert_eq(conch_output_append(&b, in + i, len - i < 3 ? len - i : 3, NULL), 0);

        _cleanup_free_ char *ta = NULL, *tb = NULL;
        size_t la = 0, lb = 0;
        cr_assert_eq(conch_output_text(&a, &ta, &la), 0);
        cr_assert_eq(conch_output_text(&b, &tb, &lb), 0);
        cr_assert_eq(conch_output_truncated(&a), conch_output_truncated(&b));
        if (conch_output_truncated(&a)) {
            /* The notices name different files; compare around them. */
            assert_truncated_text(&a, in, len);
            assert_truncated_text(&b, in, len);
            assert_spill_equals(&a, in, len);
            assert_spill_equals(&b, in, len);
        } else {
            cr_assert_eq(la, len);
            cr_assert(la == lb && memcmp(ta, tb, la) == 0, "size %zu: texts differ", sizes[k]);
            cr_assert(memcmp(ta, in, len) == 0);
        }
        conch_output_done(&a);
        conch_output_done(&b);
    }
}

Test(output, binary_with_nuls_preserved)
{
    const char bin[] = {'a', '\0', '\0', 'b', '\xff', '\0', '\n', 'c'};
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 64, 1024, dir, NULL), 0);
    cr_assert_eq(conch_output_append(&o, bin, sizeof(bin), NULL), 0);
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    cr_assert_eq(conch_output_text(&o, &text, &len), 0);
    cr_assert_eq(len, sizeof(bin));
    cr_assert(memcmp(text, bin, sizeof(bin)) == 0);
    conch_output_done(&o);

    /* And when truncated: NULs in head, tail and spill. */
    char big[40];
    memset(big, 0, sizeof(big));
    big[3] = 'x';
    big[38] = 'y';
    cr_assert_eq(conch_output_init(&o, "stdout", 8, 1024, dir, NULL), 0);
    cr_assert_eq(conch_output_append(&o, big, sizeof(big), NULL), 0);
    assert_truncated_text(&o, big, sizeof(big));
    assert_spill_equals(&o, big, sizeof(big));
    conch_output_done(&o);
}

Test(output, spill_cap_reached)
{
    size_t len = 10000;
    uint64_t cap = 3000;
    _cleanup_free_ char *in = pattern(len);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 100, cap, dir, NULL), 0);
    size_t off = 0;
    int r = 0;
    while (off < len && r == 0) {
        r = conch_output_append(&o, in + off, 64, NULL);
        off += 64;
    }
    cr_assert_eq(r, 1);
    cr_assert(o.total > cap && o.total - 64 <= cap, "1 returned at the call that crossed");
    cr_assert(o.spill_full);
    /* Later calls keep returning 1 and keep counting. */
    cr_assert_eq(conch_output_append(&o, in + off, len - off, NULL), 1);
    cr_assert_eq(conch_output_append(&o, "", 0, NULL), 1);
    cr_assert_eq(o.total, len);
    cr_assert_eq(o.spilled, cap);
    assert_spill_equals(&o, in, cap);

    /* The tail is still the real end of the stream. */
    _cleanup_free_ char *text = NULL;
    size_t tlen = 0;
    cr_assert_eq(conch_output_text(&o, &text, &tlen), 0);
    const char *notice = "\n[... 9900 bytes omitted; spill limit of 3000 bytes reached, "
                         "the rest was not kept ...]\n";
    size_t nlen = strlen(notice);
    cr_assert_eq(tlen, 100 + nlen);
    cr_assert(memcmp(text, in, 50) == 0);
    cr_assert(memcmp(text + 50, notice, nlen) == 0, "%s", text + 50);
    cr_assert(memcmp(text + 50 + nlen, in + len - 50, 50) == 0);
    conch_output_done(&o);
}

Test(output, spill_cap_below_memory_cap)
{
    /* The first spill already overflows the cap: the file gets exactly spill_max bytes. */
    _cleanup_free_ char *in = pattern(300);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 200, 150, dir, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in, 200, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in + 200, 100, NULL), 1);
    assert_spill_equals(&o, in, 150);
    conch_output_done(&o);
}

Test(output, spill_cap_exactly_reached_is_not_full)
{
    _cleanup_free_ char *in = pattern(20);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 10, 20, dir, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in, 20, NULL), 0);
    cr_assert_not(o.spill_full);
    assert_spill_equals(&o, in, 20);
    cr_assert_eq(conch_output_append(&o, in, 1, NULL), 1);
    assert_spill_equals(&o, in, 20);
    conch_output_done(&o);
}

Test(output, max_zero_keeps_nothing_in_memory)
{
    _cleanup_free_ char *in = pattern(1000);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 0, 1 << 20, dir, NULL), 0);
    cr_assert_null(o.head);
    cr_assert_null(o.tail);
    cr_assert_eq(conch_output_append(&o, in, 1, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in + 1, 999, NULL), 0);
    cr_assert(conch_output_truncated(&o));
    assert_truncated_text(&o, in, 1000);
    assert_spill_equals(&o, in, 1000);
    conch_output_done(&o);
}

Test(output, no_spill_dir_drops_the_excess)
{
    _cleanup_free_ char *in = pattern(100);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 10, 1 << 20, NULL, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in, 10, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in + 10, 90, NULL), 1);
    cr_assert_eq(o.spill_path[0], '\0');
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    cr_assert_eq(conch_output_text(&o, &text, &len), 0);
    cr_assert_not_null(find(text, len, "[... 90 bytes omitted; spill limit of 0 bytes reached"));
    conch_output_done(&o);
    cr_assert_eq(count_files(), 0);
}

Test(output, spill_open_failure_reported_once)
{
    _cleanup_free_ char *in = pattern(100);
    struct conch_output o;
    struct conch_err err = {0};
    cr_assert_eq(conch_output_init(&o, "stdout", 10, 1 << 20, "/nonexistent-conch-dir", &err), 0);
    cr_assert_eq(conch_output_append(&o, in, 50, &err), -ENOENT);
    cr_assert_not_null(strstr(err.msg, "/nonexistent-conch-dir"), "%s", err.msg);
    cr_assert_eq(conch_output_append(&o, in + 50, 50, &err), 0);
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    cr_assert_eq(conch_output_text(&o, &text, &len), 0);
    cr_assert(memcmp(text, in, 5) == 0);
    cr_assert(memcmp(text + len - 5, in + 95, 5) == 0, "tail still kept");
    cr_assert_not_null(find(text, len, "90 bytes omitted; the spill file could not be written"));
    conch_output_done(&o);
}

Test(output, init_rejects_bad_names)
{
    struct conch_output o;
    struct conch_err err = {0};
    cr_assert_eq(conch_output_init(&o, "a/b", 10, 10, dir, &err), -EINVAL);
    conch_output_done(&o);
    cr_assert_eq(conch_output_init(&o, "", 10, 10, dir, &err), -EINVAL);
    conch_output_done(&o);
    char longname[64];
    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    cr_assert_eq(conch_output_init(&o, longname, 10, 10, dir, &err), -ENAMETOOLONG);
    conch_output_done(&o);
    char longdir[300];
    memset(longdir, 'd', sizeof(longdir) - 1);
    longdir[0] = '/';
    longdir[sizeof(longdir) - 1] = '\0';
    cr_assert_eq(conch_output_init(&o, "stdout", 10, 10, longdir, &err), -ENAMETOOLONG);
    conch_output_done(&o);
    conch_output_done(&o);
}

Test(output, done_is_safe_twice_and_on_zeroed_struct)
{
    /* Make sure fd 0 is open, so closing it by mistake would be seen. */
    if (fcntl(0, F_GETFD) < 0)
        cr_assert_eq(open("/dev/null", O_RDONLY), 0);
    struct conch_output z;
    memset(&z, 0, sizeof(z));
    conch_output_done(&z);
    conch_output_done(&z);
    cr_assert_geq(fcntl(0, F_GETFD), 0, "done() on a zeroed struct closed fd 0");

    struct conch_output o;
    _cleanup_free_ char *in = pattern(100);
    cr_assert_eq(conch_output_init(&o, "stdout", 10, 1000, dir, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in, 100, NULL), 0);
    int fd = o.spill_fd;
    cr_assert_geq(fd, 0);
    conch_output_done(&o);
    cr_assert_eq(fcntl(fd, F_GETFD), -1, "spill fd closed");
    cr_assert_eq(o.spill_fd, -1);
    conch_output_done(&o);
    cr_assert_geq(fcntl(0, F_GETFD), 0);
}

/* A budget with room for 8 KiB: the head stops at its buffer, no tail is kept, the stream
 * spills from its first byte, and everything is uncharged at the end. */
Test(output, budget_short_spills_early_and_keeps_the_stream)
{
    struct conch_budget shared, b;
    conch_budget_init(&shared, "shared", 1 << 20, NULL);
    conch_budget_init(&b, "test", 8192, &shared);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 1 << 20, 1 << 30, dir, NULL), 0);
    conch_output_set_budget(&o, &b);
    size_t len = 100000;
    _cleanup_free_ char *in = pattern(len);
    for (size_t off = 0; off < len; off += 1000)
        cr_assert_eq(conch_output_append(&o, in + off, len - off < 1000 ? len - off : 1000, NULL),
                     0);
    cr_assert(conch_output_truncated(&o));
    cr_assert_leq(conch_budget_held(&b), 8192);
    cr_assert_eq(conch_budget_held(&shared), conch_budget_held(&b));
    cr_assert_eq(o.head_len + o.tail_len, conch_budget_held(&b));
    assert_spill_equals(&o, in, len);
    _cleanup_free_ char *text = NULL;
    size_t tlen = 0;
    cr_assert_eq(conch_output_text(&o, &text, &tlen), 0);
    cr_assert(memcmp(text, in, o.head_len) == 0, "head differs");
    cr_assert_not_null(find(text, tlen, "full output in"));
    conch_output_done(&o);
    cr_assert_eq(conch_budget_held(&b), 0);
    cr_assert_eq(conch_budget_held(&shared), 0);
}

/* The budget runs out when the tail is due: a smaller tail, the stream whole in the spill. */
Test(output, budget_grants_a_smaller_tail)
{
    struct conch_budget b;
    conch_budget_init(&b, "test", 3 * 4096 + 8192, NULL);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 4 * 4096, 1 << 30, dir, NULL), 0);
    conch_output_set_budget(&o, &b);
    size_t len = 50000;
    _cleanup_free_ char *in = pattern(len);
    cr_assert_eq(conch_output_append(&o, in, 9000, NULL), 0);
    cr_assert_eq(conch_output_append(&o, in + 9000, len - 9000, NULL), 0);
    cr_assert(conch_output_truncated(&o));
    cr_assert_eq(o.head_len, 8192);
    cr_assert_eq(o.tail_len, 8192);
    cr_assert_eq(conch_budget_held(&b), 2 * 8192);
    assert_spill_equals(&o, in, len);
    _cleanup_free_ char *text = NULL;
    size_t tlen = 0;
    cr_assert_eq(conch_output_text(&o, &text, &tlen), 0);
    cr_assert(memcmp(text + tlen - 8192, in + len - 8192, 8192) == 0, "tail differs");
    conch_output_done(&o);
    cr_assert_eq(conch_budget_held(&b), 0);
}

/* Within the budget nothing changes: small output is kept exactly, not spilled. */
Test(output, budget_with_room_changes_nothing)
{
    struct conch_budget b;
    conch_budget_init(&b, "test", 1 << 20, NULL);
    struct conch_output o;
    cr_assert_eq(conch_output_init(&o, "stdout", 64 * 1024, 1 << 30, dir, NULL), 0);
    conch_output_set_budget(&o, &b);
    _cleanup_free_ char *in = pattern(60000);
    cr_assert_eq(conch_output_append(&o, in, 60000, NULL), 0);
    cr_assert(!conch_output_truncated(&o));
    cr_assert_eq(o.spill_path[0], '\0');
    conch_output_done(&o);
    cr_assert_eq(conch_budget_held(&b), 0);
}
