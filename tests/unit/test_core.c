/* test_core.c - unit tests for src/core: errors, size parsing, reading whole files, UTF-8. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/error.h"
#include "core/fdpass.h"
#include "core/fsutil.h"
#include "core/sha256.h"
#include "core/utf8.h"

Test(error, set_returns_negative_code_and_formats)
{
    struct conch_err e = {0};
    int r = conch_err_set(&e, ENOENT, "open '%s'", "x");
    cr_assert_eq(r, -ENOENT);
    cr_assert_eq(e.kind, CONCH_ERR_INFRASTRUCTURE);
    cr_assert_str_eq(e.msg, "open 'x'");
}

Test(error, wrap_prepends_context)
{
    struct conch_err e = {0};
    conch_err_set(&e, EPERM, "mount: EPERM");
    cr_assert_eq(conch_err_wrap(&e, "setup '%s'", "/usr"), -EPERM);
    cr_assert_str_eq(e.msg, "setup '/usr': mount: EPERM");
}

Test(error, zero_code_becomes_eio)
{
    struct conch_err e = {0};
    cr_assert_eq(conch_err_set(&e, 0, "x"), -EIO);
}

Test(fsutil, parse_size)
{
    uint64_t v = 0;
    cr_assert_eq(conch_parse_size("4096", "x", &v, NULL), 0);
    cr_assert_eq(v, 4096);
    cr_assert_eq(conch_parse_size("64k", "x", &v, NULL), 0);
    cr_assert_eq(v, 65536);
    cr_assert_eq(conch_parse_size("2G", "x", &v, NULL), 0);
    cr_assert_eq(v, 2ULL << 30);
    cr_assert_eq(conch_parse_size("10MiB", "x", &v, NULL), 0);
    cr_assert_eq(v, 10ULL << 20);
    struct conch_err e = {0};
    cr_assert_eq(conch_parse_size("ten", "--memory", &v, &e), -EINVAL);
    cr_assert(strstr(e.msg, "--memory"));
    cr_assert_eq(conch_parse_size("5X", "x", &v, NULL), -EINVAL);
    cr_assert_eq(conch_parse_size("99999999999999999999", "x", &v, NULL), -EINVAL);
}

Test(utf8, seq_accepts_well_formed_and_refuses_the_rest)
{
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"a", 1), 1);
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xc3\xa9", 2), 2);         /* é */
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xf0\x9f\x90\x9a", 4), 4); /* 🐚 */
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xc3\xa9", 1), 0);         /* cut */
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xc0\x80", 2), 0);         /* overlong */
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xed\xa0\x80", 3), 0);     /* surrogate */
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xf4\x90\x80\x80", 4), 0); /* > 10FFFF */
    cr_assert_eq(conch_utf8_seq((const unsigned char *)"\xff", 1), 0);
}

Test(utf8, repair_replaces_each_maximal_subpart_once_as_diffs_do)
{
    /* A truncated 3-byte sequence is one U+FFFD (its maximal subpart); an overlong NUL and a
     * surrogate are one per byte (no valid prefix); the same rule as workspace diffs. */
    size_t n = 0;
    char *s = conch_utf8_repair("\xe2\x82 \xc0\x80 \xed\xa0\x80 \xf0\x9f\x90", 13, &n);
    cr_assert_not_null(s);
    cr_assert_str_eq(s, "\xef\xbf\xbd \xef\xbf\xbd\xef\xbf\xbd "
                        "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd \xef\xbf\xbd");
    cr_assert_eq(n, strlen(s));
    cr_assert_eq(conch_utf8_bad((const unsigned char *)"\xe2\x82", 2), 2);
    cr_assert_eq(conch_utf8_bad((const unsigned char *)"\xc3\xa9", 2), 0);
    free(s);
}

Test(utf8, repair_replaces_each_bad_byte_and_keeps_nul)
{
    size_t n = 0;
    char *s = conch_utf8_repair("a\xff\0\xc3\xa9\xc3", 6, &n);
    cr_assert_not_null(s);
    cr_assert_eq(n, 10);
    cr_assert(memcmp(s, "a\xef\xbf\xbd\0\xc3\xa9\xef\xbf\xbd", 10) == 0);
    free(s);
}

/* conch_read_fd sizes its buffer from the file and grows it for files that report no size
 * (pipes, /proc): the whole content comes back, and never more than @max. */
Test(fsutil, read_fd_whole_truncated_and_sizeless)
{
    char path[] = "/tmp/conch-test-read-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    char data[10000];
    for (size_t i = 0; i < sizeof(data); i++)
        data[i] = (char)('a' + i % 26);
    cr_assert_eq(write(fd, data, sizeof(data)), (ssize_t)sizeof(data));
    close(fd);
    char *buf = NULL;
    size_t len = 0;
    struct conch_err err = {0};
    cr_assert_eq(conch_read_file(path, 1 << 20, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(len, sizeof(data));
    cr_assert(!memcmp(buf, data, len) && buf[len] == '\0');
    free(buf);
    cr_assert_eq(conch_read_file(path, 100, &buf, &len, &err), 0);
    cr_assert_eq(len, 100);
    cr_assert(!memcmp(buf, data, 100) && buf[100] == '\0');
    free(buf);
    unlink(path);

    /* a pipe says size 0: the buffer starts at 4 KiB and must grow to take 20,000 bytes */
    int p[2];
    cr_assert_eq(pipe(p), 0);
    char big[20000];
    memset(big, 'z', sizeof(big));
    cr_assert_eq(write(p[1], big, sizeof(big)), (ssize_t)sizeof(big));
    close(p[1]);
    cr_assert_eq(conch_read_fd(p[0], "pipe", 1 << 20, &buf, &len, &err), 0, "%s", err.msg);
    cr_assert_eq(len, sizeof(big));
    cr_assert(!memcmp(buf, big, len));
    free(buf);
    close(p[0]);
}

/* Descriptors travel with the bytes; beyond what the receiver takes they are closed, not
 * leaked; a plain message brings none; EOF is 0; too many to send is refused. */
Test(fdpass, descriptors_travel_and_extras_are_closed)
{
    int sv[2];
    cr_assert(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    int a[2], b[2];
    cr_assert(pipe(a) == 0 && pipe(b) == 0);
    int out[2] = {a[1], b[1]};
    cr_assert_eq(conch_send_fds(sv[0], "hi", 2, out, 2, 0), 2);
    char buf[8];
    int got[1] = {-1}, n = -1;
    cr_assert_eq(conch_recv_fds(sv[1], buf, sizeof(buf), got, 1, &n, 0), 2);
    cr_assert(n == 1 && memcmp(buf, "hi", 2) == 0);
    struct stat x, y;
    cr_assert(fstat(got[0], &x) == 0 && fstat(a[1], &y) == 0 && x.st_ino == y.st_ino,
              "the first descriptor is the one sent");
    cr_assert(fcntl(got[0], F_GETFD) & FD_CLOEXEC, "received close-on-exec");
    /* the second was closed by the receiver: with ours closed too, b's reader sees EOF */
    close(b[1]);
    char c;
    cr_assert_eq(read(b[0], &c, 1), 0, "the extra descriptor leaked");
    cr_assert_eq(conch_send_fds(sv[0], "x", 1, NULL, 0, 0), 1);
    cr_assert_eq(conch_recv_fds(sv[1], buf, sizeof(buf), got, 1, &n, 0), 1);
    cr_assert_eq(n, 0);
    int many[CONCH_FDPASS_MAX + 1] = {0};
    cr_assert_eq(conch_send_fds(sv[0], "x", 1, many, CONCH_FDPASS_MAX + 1, 0), -EINVAL);
    close(sv[0]);
    cr_assert_eq(conch_recv_fds(sv[1], buf, sizeof(buf), got, 1, &n, 0), 0);
    close(sv[1]);
    close(a[0]);
    close(a[1]);
    close(b[0]);
    close(got[0]);
}

Test(rmtree, rm_path_removes_a_tree_and_never_follows_a_link)
{
    char top[] = "/tmp/conch-rmpath-XXXXXX";
    cr_assert_not_null(mkdtemp(top));
    char path[256], keep[256], f[300];
    snprintf(path, sizeof(path), "%s/tree", top);
    snprintf(keep, sizeof(keep), "%s/keep", top);
    cr_assert_eq(mkdir(path, 0700), 0);
    cr_assert_eq(mkdir(keep, 0700), 0);
    snprintf(f, sizeof(f), "%s/kept.txt", keep);
    close(open(f, O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    snprintf(f, sizeof(f), "%s/sub", path);
    cr_assert_eq(mkdir(f, 0), 0); /* no rwx: made removable first */
    snprintf(f, sizeof(f), "%s/link", path);
    cr_assert_eq(symlink(keep, f), 0);
    cr_assert_eq(conch_rm_path(path, CONCH_RM_ONE_FS), 0);
    struct stat st;
    cr_assert_eq(lstat(path, &st), -1);
    snprintf(f, sizeof(f), "%s/kept.txt", keep);
    cr_assert_eq(lstat(f, &st), 0, "the link's target is left alone");
    cr_assert_eq(conch_rm_path(path, 0), 0, "a missing path is not an error");
    cr_assert_eq(conch_rm_path("/", 0), -EINVAL);
    cr_assert_eq(conch_rm_path("..", 0), -EINVAL);
    snprintf(f, sizeof(f), "%s/slash/", top);
    cr_assert_eq(mkdir(f, 0700), 0);
    cr_assert_eq(conch_rm_path(f, 0), 0);
    cr_assert_eq(lstat(f, &st), -1, "a trailing slash names the directory itself");
    cr_assert_eq(conch_rm_path(top, 0), 0);
    cr_assert_eq(lstat(top, &st), -1);
}

/* A budget and its parent: charges are all or nothing, the one that is full is named. */
Test(budget, charges_both_levels_all_or_nothing)
{
    struct conch_budget daemon, a, b;
    conch_budget_init(&daemon, "the daemon", 100, NULL);
    conch_budget_init(&a, "sandbox a", 60, &daemon);
    conch_budget_init(&b, "sandbox b", 60, &daemon);
    cr_assert_eq(conch_budget_charge(&a, 60, NULL), 0);
    struct conch_err err = {0};
    cr_assert_eq(conch_budget_charge(&a, 1, &err), -ENOBUFS);
    cr_assert_not_null(strstr(err.msg, "sandbox a"), "%s", err.msg);
    cr_assert_eq(err.kind, CONCH_ERR_LIMIT);
    cr_assert_eq(conch_budget_room(&b), 40);
    cr_assert_eq(conch_budget_charge(&b, 50, &err), -ENOBUFS);
    cr_assert_not_null(strstr(err.msg, "the daemon"), "%s", err.msg);
    cr_assert_eq(conch_budget_held(&b), 0, "a refused charge left bytes on the sandbox");
    cr_assert_eq(conch_budget_charge_upto(&b, 50), 40);
    cr_assert_eq(conch_budget_held(&daemon), 100);
    conch_budget_uncharge(&a, 60);
    conch_budget_uncharge(&b, 40);
    cr_assert_eq(conch_budget_held(&daemon), 0);
    cr_assert_eq(conch_budget_charge(NULL, 1u << 30, NULL), 0);
    cr_assert_eq(conch_budget_room(NULL), UINT64_MAX);
}

/* A refusal names what raises the full budget; a description lists the capped levels only
 * (a bridge's own budget has no cap: the sandbox's and the daemon's are shown). */
Test(budget, messages_name_the_option_and_the_capped_levels)
{
    struct conch_budget daemon, sb, bridge;
    conch_budget_init(&daemon, "all sandboxes", 2u << 20, NULL);
    conch_budget_set_raise_with(&daemon, "conch serve --max-held");
    conch_budget_init(&sb, "sandbox sb-1", 1u << 20, &daemon);
    conch_budget_set_raise_with(&sb, "conch serve --max-sandbox-held");
    conch_budget_init(&bridge, "sandbox sb-1's tool bridge", UINT64_MAX, &sb);
    struct conch_err err = {0};
    cr_assert_eq(conch_budget_charge(&bridge, 1000, NULL), 0);
    cr_assert_eq(conch_budget_charge(&bridge, 2u << 20, &err), -ENOBUFS);
    cr_assert_not_null(strstr(err.msg, "sandbox sb-1 is at its budget of 1 MiB"), "%s", err.msg);
    cr_assert_not_null(strstr(err.msg, "raise it with conch serve --max-sandbox-held"), "%s",
                       err.msg);
    char buf[512];
    conch_budget_describe(&bridge, buf, sizeof(buf));
    cr_assert_str_eq(buf,
                     "sandbox sb-1: 1000 bytes held of 1 MiB (conch serve --max-sandbox-held); "
                     "all sandboxes: 1000 bytes held of 2 MiB (conch serve --max-held)");
    conch_budget_describe(&bridge, buf, 20); /* truncated, terminated */
    cr_assert_eq(strlen(buf), 19);
    conch_budget_uncharge(&bridge, 1000);
    cr_assert_eq(conch_budget_held(&daemon), 0);
}

static void hex(const uint8_t d[CONCH_SHA256_SIZE], char out[2 * CONCH_SHA256_SIZE + 1])
{
    for (int i = 0; i < CONCH_SHA256_SIZE; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

static void check_sha256(const void *data, size_t len, const char *want)
{
    uint8_t d[CONCH_SHA256_SIZE];
    char got[2 * CONCH_SHA256_SIZE + 1];
    conch_sha256(data, len, d);
    hex(d, got);
    cr_assert_str_eq(got, want, "sha256 of %zu bytes", len);
}

Test(sha256, fips_180_examples)
{
    check_sha256(NULL, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    check_sha256("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_sha256(m448, strlen(m448),
                 "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    const char *m896 = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnop"
                       "jklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
    check_sha256(m896, strlen(m896),
                 "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
    char *million = malloc(1000000);
    cr_assert_not_null(million);
    memset(million, 'a', 1000000);
    check_sha256(million, 1000000,
                 "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(million);
}

/* Around the padding's edges: one block or two for the tail (values from Python's hashlib). */
Test(sha256, block_boundaries)
{
    static const struct {
        size_t len;
        const char *want;
    } cases[] = {
        {55, "16fa57a0a3423a715d594516339f36189d6b5f93754a9714fef202616a9fabfe"},
        {56, "c37b44e5f1b18554b36966f4f8e08bfbf3164c4b6c10374d12d89850892073c5"},
        {63, "bbba992d2c85af960fb2987a1fd05e0aa82a3db3c740dd8982a9e273b75e36a3"},
        {64, "66bd4633ed6f71c4ecfa4763bf7ba1c8ec7612de9aa6c0578a7b675207c71e0b"},
        {65, "9f7dc47107b750a1f3d35db5d9547f24ef40da5b731b9540d4f43710a154f6c9"},
        {119, "a3ed307b730fa77c07531300c6e4a282330011d4d4caf6bb7b63ae05950f4b66"},
        {120, "8e3b15d9fea7472655aa069620b7f8c2e55ee1499f763200a7515fe826e99d20"},
        {127, "44480fb9672845177f5368a08b69ea263275f2a5ec42e06a933370fe0d2968a4"},
        {128, "e462c130fef8c97e34f7dc3ff3ad2f8b3533ab849af21c10531552a2852387a4"},
    };
    uint8_t buf[128];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)(i * 7 + 1);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        check_sha256(buf, cases[i].len, cases[i].want);
}

Test(sha256, secure_equal)
{
    cr_assert(conch_secure_equal("abcd", "abcd", 4));
    cr_assert(!conch_secure_equal("abcd", "abce", 4));
    cr_assert(!conch_secure_equal("xbcd", "abcd", 4));
    cr_assert(conch_secure_equal("a", "b", 0));
}
