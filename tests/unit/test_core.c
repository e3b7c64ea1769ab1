/* test_core.c - unit tests for src/core: errors and size parsing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "core/error.h"
#include "core/fsutil.h"

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
