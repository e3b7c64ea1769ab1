/* test_tokens.c - unit tests of the --tokens file (src/daemon/tokens.h): lines, quotas and
 * comments parsed; a file another user could read, a symlink, duplicates and bad values
 * refused with the line named and never the token; tokens matched by digest. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/tokens.h"

#define TOK_A "alice-0123456789abcdef"
#define TOK_B "bob-0123456789abcdef00"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/conch-tokens-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(tokens, .init = setup, .fini = teardown, .timeout = 10);

static const char *write_file(const char *text, mode_t mode)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/tokens", dir);
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    cr_assert_eq(chmod(path, mode), 0);
    return path;
}

static int load(const char *text, mode_t mode, struct conch_tokens **t, struct conch_err *err)
{
    return conch_tokens_load(write_file(text, mode), t, err);
}

Test(tokens, parses_lines_quotas_and_comments)
{
    struct conch_tokens *t = NULL;
    struct conch_err err = {0};
    cr_assert_eq(load("# tenants\n\n  alice " TOK_A " sandboxes=3 memory=1G disk=10M commands=2\r\n"
                      "bob\t" TOK_B "\n",
                      0600, &t, &err),
                 0, "%s", err.msg);
    cr_assert_eq(t->n, 2);
    const struct conch_token_entry *a = conch_tokens_find(t, "alice");
    cr_assert_not_null(a);
    cr_assert_eq(a->quota.sandboxes, 3);
    cr_assert_eq(a->quota.memory_bytes, 1ULL << 30);
    cr_assert_eq(a->quota.disk_bytes, 10ULL << 20);
    cr_assert_eq(a->quota.commands, 2);
    cr_assert_eq(conch_tokens_find(t, "bob")->quota.sandboxes, 0);
    cr_assert_eq(conch_tokens_match(t, TOK_A, strlen(TOK_A)), a);
    cr_assert_eq(conch_tokens_match(t, TOK_B, strlen(TOK_B)), conch_tokens_find(t, "bob"));
    cr_assert_null(conch_tokens_match(t, TOK_A, strlen(TOK_A) - 1));
    cr_assert_null(conch_tokens_match(t, "", 0));
    /* the digest, not the text, is kept */
    cr_assert_null(memmem(t->entries, t->n * sizeof(*t->entries), TOK_A, 8));
    conch_tokens_free(t);
}

Test(tokens, refuses_what_others_could_read)
{
    static const mode_t modes[] = {0640, 0604, 0660, 0606, 0610, 0601};
    for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
        struct conch_tokens *t = NULL;
        struct conch_err err = {0};
        cr_assert_lt(load("alice " TOK_A "\n", modes[i], &t, &err), 0);
        cr_assert_not_null(strstr(err.msg, "chmod 600"), "%s", err.msg);
        cr_assert_null(t);
    }
    /* 0400 is fine */
    struct conch_tokens *t = NULL;
    struct conch_err err = {0};
    cr_assert_eq(load("alice " TOK_A "\n", 0400, &t, &err), 0, "%s", err.msg);
    conch_tokens_free(t);
}

Test(tokens, refuses_a_symlink_and_a_directory)
{
    const char *real = write_file("alice " TOK_A "\n", 0600);
    char link[128];
    snprintf(link, sizeof(link), "%s/link", dir);
    cr_assert_eq(symlink(real, link), 0);
    struct conch_tokens *t = NULL;
    struct conch_err err = {0};
    cr_assert_lt(conch_tokens_load(link, &t, &err), 0);
    cr_assert_not_null(strstr(err.msg, "symlink"), "%s", err.msg);
    cr_assert_lt(conch_tokens_load(dir, &t, &err), 0);
}

Test(tokens, refuses_bad_lines_without_the_token)
{
    static const struct {
        const char *text, *why;
    } bad[] = {
        {"alice\n", "line 1: expected"},
        {"alice short\n", "line 1: tenant 'alice': a token is"},
        {"# c\nalice " TOK_A "\nalice " TOK_B "\n", "line 3: tenant 'alice' is given twice"},
        {"alice " TOK_A "\nbob " TOK_A "\n", "line 2: tenant 'bob' has the token of tenant"},
        {"alice " TOK_A " cpu=2\n", "unknown quota 'cpu'"},
        {"alice " TOK_A " sandboxes=-1\n", "sandboxes=-1"},
        {"alice " TOK_A " memory=1X\n", "memory=1X"},
        {"alice " TOK_A " memory\n", "not key=value"},
        {"../x " TOK_A "\n", "tenant name"},
        {"", "names no tenant"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct conch_tokens *t = NULL;
        struct conch_err err = {0};
        cr_assert_lt(load(bad[i].text, 0600, &t, &err), 0, "%s", bad[i].text);
        cr_assert_not_null(strstr(err.msg, bad[i].why), "%s: %s", bad[i].why, err.msg);
        cr_assert_null(strstr(err.msg, TOK_A), "%s", err.msg);
        cr_assert_null(strstr(err.msg, TOK_B), "%s", err.msg);
    }
}
