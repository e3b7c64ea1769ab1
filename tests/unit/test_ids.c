/* test_ids.c - unit tests for src/jail/ids.c: parsing /etc/subuid-style ranges and claiming
 * host id blocks (in a temporary lock dir, against a temporary /etc). */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail/ids.h"

static char tmp[64];
static char locks[96];
static char etc[96];

static void setup(void)
{
    snprintf(tmp, sizeof(tmp), "/tmp/conch-ids-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp));
    snprintf(locks, sizeof(locks), "%s/locks", tmp);
    snprintf(etc, sizeof(etc), "%s/etc", tmp);
    cr_assert_eq(mkdir(etc, 0755), 0);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0)
        cr_log_warn("could not remove %s", tmp);
}

static void put(const char *name, const char *text)
{
    char path[160];
    snprintf(path, sizeof(path), "%s/%s", etc, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(ids, subid_overlap_forms)
{
    const char *text = "# comment\n"
                       "alice:100000:65536\n"
                       "1001:200000:10\n"
                       "bad line\n"
                       "bob:x:y\n"
                       "\n"
                       "carol:300000:0";
    cr_assert(conch_jail_ids_subid_overlaps(text, 100000, 1));
    cr_assert(conch_jail_ids_subid_overlaps(text, 165535, 1));
    cr_assert_not(conch_jail_ids_subid_overlaps(text, 165536, 1));
    cr_assert(conch_jail_ids_subid_overlaps(text, 150000, 65536));
    cr_assert(conch_jail_ids_subid_overlaps(text, 200009, 5));
    cr_assert_not(conch_jail_ids_subid_overlaps(text, 200010, 5));
    cr_assert_not(conch_jail_ids_subid_overlaps(text, 300000, 65536)); /* count 0: nothing */
    cr_assert_not(conch_jail_ids_subid_overlaps(text, 0, 99999));
}

Test(ids, claim_distinct_and_skips_ranges, .init = setup, .fini = teardown)
{
    /* The first block of the container range is a user's subuid range, the second holds a
     * subgid range in uid form, the third a user: the first free one is the fourth. */
    put("subuid", "alice:524288:65536\n");
    put("subgid", "1001:600000:1\n");
    put("passwd", "root:x:0:0::/root:/bin/sh\nsvc:x:655400:655400::/:/bin/false\n");
    struct conch_err err = {0};
    struct conch_jail_ids a, b, c;
    cr_assert_eq(conch_jail_ids_claim_in(locks, etc, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(a.base, CONCH_HOST_ID_FIRST + 3 * CONCH_HOST_ID_COUNT);
    cr_assert_eq(conch_jail_ids_claim_in(locks, etc, &b, &err), 0, "%s", err.msg);
    cr_assert_eq(b.base, a.base + CONCH_HOST_ID_COUNT);
    struct stat st;
    cr_assert_eq(stat(locks, &st), 0);
    cr_assert_eq(st.st_mode & 07777, 0700);

    /* Another process sees both claimed, and claims the next block. */
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        struct conch_jail_ids x;
        struct conch_err e = {0};
        uint32_t got = conch_jail_ids_claim_in(locks, etc, &x, &e) == 0 ? x.base : 0;
        _exit(write(pfd[1], &got, sizeof(got)) == sizeof(got) ? 0 : 1);
    }
    uint32_t got = 0;
    cr_assert_eq(read(pfd[0], &got, sizeof(got)), (ssize_t)sizeof(got));
    waitpid(pid, NULL, 0);
    cr_assert_eq(got, b.base + CONCH_HOST_ID_COUNT);

    /* A released block is free again. */
    conch_jail_ids_release(&a);
    cr_assert_eq(a.lock_fd, -1);
    cr_assert_eq(conch_jail_ids_claim_in(locks, etc, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.base, CONCH_HOST_ID_FIRST + 3 * CONCH_HOST_ID_COUNT);
    conch_jail_ids_release(&b);
    conch_jail_ids_release(&c);
    /* A zeroed struct holds nothing: releasing it must not close fd 0. */
    struct conch_jail_ids zero = {0};
    conch_jail_ids_release(&zero);
    cr_assert_neq(fcntl(0, F_GETFD), -1);
}

Test(ids, lock_dir_writable_by_others_refused, .init = setup, .fini = teardown)
{
    cr_assert_eq(mkdir(locks, 0700), 0);
    cr_assert_eq(chmod(locks, 0777), 0);
    struct conch_jail_ids a;
    struct conch_err err = {0};
    cr_assert_lt(conch_jail_ids_claim_in(locks, etc, &a, &err), 0);
    cr_assert(strstr(err.msg, locks), "%s", err.msg);
}

Test(ids, whole_range_taken_fails, .init = setup, .fini = teardown)
{
    put("subuid", "everyone:0:4294967295\n");
    struct conch_jail_ids a;
    struct conch_err err = {0};
    cr_assert_eq(conch_jail_ids_claim_in(locks, etc, &a, &err), -ENOSPC);
    cr_assert(strstr(err.msg, "no free block"), "%s", err.msg);
}
