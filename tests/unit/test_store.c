/* test_store.c - unit tests for named stores (src/workspace/store-db.c, store-sync.c): names
 * and paths checked, the host-side operations, the caps (a write past one is rolled back
 * whole), and two views of one store: a write-back writes only what its view changed (no
 * lost update), the same file changed in both is settled by the later write-back and
 * recorded, a change is brought into the other view unless that view changed it too, and
 * links and fifos planted in a view are skipped, never followed. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "workspace/workspace.h"

static char base[64], dbdir[96];

static void setup(void)
{
    strcpy(base, "/tmp/conch-store-XXXXXX");
    cr_assert_not_null(mkdtemp(base));
    snprintf(dbdir, sizeof(dbdir), "%s/db", base);
}

static void teardown(void)
{
    char cmd[160];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", base);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 30);

static void put_file(const char *dir, const char *rel, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

static char *read_host(const char *dir, const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    static char buf[256];
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static char *read_store(const char *name, const char *path)
{
    struct conch_store *s = NULL;
    struct conch_err err = {0};
    cr_assert_eq(conch_store_open(dbdir, name, 0, &s, &err), 0, "%s", err.msg);
    char *buf = NULL;
    size_t len;
    json_t *meta = NULL;
    int r = conch_store_read(s, path, &buf, &len, &meta, &err);
    json_decref(meta);
    conch_store_close(s);
    return r < 0 ? NULL : buf;
}

Test(store, names_and_paths)
{
    struct conch_err err = {0};
    cr_assert_eq(conch_store_name_check("memories.v2_x-1", &err), 0);
    const char *bad[] = {"", ".x", "-x", "a/b", "a b", "..", "é"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_lt(conch_store_name_check(bad[i], &err), 0, "%s", bad[i]);
    char out[CONCH_STORE_PATH_MAX];
    cr_assert_eq(conch_store_path_normalize("//a//b/", out, sizeof(out), &err), 0);
    cr_assert_str_eq(out, "a/b");
    cr_assert_eq(conch_store_path_normalize("/", out, sizeof(out), &err), 0);
    cr_assert_str_eq(out, "");
    const char *badp[] = {"a/../b", "./a", "..", "a\nb", "a\x7f"};
    for (size_t i = 0; i < sizeof(badp) / sizeof(badp[0]); i++)
        cr_assert_lt(conch_store_path_normalize(badp[i], out, sizeof(out), &err), 0, "%s", badp[i]);
}

Test(store, host_operations_and_caps)
{
    struct conch_store *s = NULL;
    struct conch_err err = {0};
    cr_assert_eq(conch_store_open(dbdir, "m", 0, &s, &err), -ENOENT);
    cr_assert_eq(conch_store_open(dbdir, "m", 100000, &s, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_store_max_bytes(s), 100000);
    cr_assert_eq(conch_store_write(s, "a/b/c.txt", "hi", 2, 0644, "host", &err), 0, "%s", err.msg);
    json_t *ls = NULL;
    cr_assert_eq(conch_store_ls(s, "", &ls, &err), 0, "%s", err.msg);
    cr_assert_eq(json_array_size(ls), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ls, 0), "type")), "dir");
    json_decref(ls);
    cr_assert_eq(conch_store_ls(s, "a/b/c.txt", &ls, &err), -ENOTDIR);
    /* Past the cap: refused, nothing of it written. */
    static char big[60000];
    memset(big, 'x', sizeof(big));
    cr_assert_eq(conch_store_write(s, "one", big, sizeof(big), 0644, "host", &err), 0, "%s",
                 err.msg);
    cr_assert_eq(conch_store_write(s, "two", big, sizeof(big), 0644, "host", &err), -ENOSPC);
    cr_assert_eq(err.kind, CONCH_ERR_LIMIT);
    cr_assert_eq(conch_store_ls(s, "", &ls, &err), 0);
    cr_assert_eq(json_array_size(ls), 2); /* a, one */
    json_decref(ls);
    /* A file where a dir was: the dir and what was beneath it go. */
    cr_assert_eq(conch_store_write(s, "a", "f", 1, 0644, "host", &err), 0, "%s", err.msg);
    char *buf = NULL;
    size_t len;
    json_t *meta = NULL;
    cr_assert_eq(conch_store_read(s, "a/b/c.txt", &buf, &len, &meta, &err), -ENOENT);
    cr_assert_eq(conch_store_delete(s, "a", "host", &err), 0, "%s", err.msg);
    cr_assert_eq(conch_store_delete(s, "a", "host", &err), -ENOENT);
    conch_store_close(s);
    /* Reopened (a restart): the cap it was made with stays. */
    cr_assert_eq(conch_store_open(dbdir, "m", 0, &s, &err), 0);
    cr_assert_eq(conch_store_max_bytes(s), 100000);
    conch_store_close(s);
}

Test(store, two_views_last_writer_wins_and_recorded)
{
    char da[128], db[128];
    snprintf(da, sizeof(da), "%s/va", base);
    snprintf(db, sizeof(db), "%s/vb", base);
    struct conch_store_view *a = NULL, *b = NULL;
    struct conch_err err = {0};
    cr_assert_eq(conch_store_view_new(dbdir, "s", 0, da, "A", &a, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_store_view_new(dbdir, "s", 0, db, "B", &b, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_store_view_materialise(a, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_store_view_materialise(b, &err), 0, "%s", err.msg);
    struct conch_store_report rep;
    /* Different files in each: neither loses the other's. */
    put_file(da, "fa", "a1");
    put_file(db, "fb", "b1");
    cr_assert_eq(conch_store_view_sync(a, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.written, 1);
    cr_assert_eq(conch_store_view_sync(b, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.written, 1);
    cr_assert_eq(rep.pulled, 1); /* fa */
    cr_assert_str_eq(read_host(db, "fa"), "a1");
    cr_assert_eq(conch_store_view_pull(a, &err), 0);
    cr_assert_str_eq(read_host(da, "fb"), "b1");
    /* The same file changed in both: the later write-back wins; a pull does not overwrite
     * a change not written back yet. */
    put_file(da, "fa", "from-a");
    put_file(db, "fa", "from-b!");
    cr_assert_eq(conch_store_view_sync(b, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_store_view_pull(a, &err), 0);
    cr_assert_str_eq(read_host(da, "fa"), "from-a");
    cr_assert_eq(conch_store_view_sync(a, &rep, &err), 0, "%s", err.msg);
    char *v = read_store("s", "fa");
    cr_assert_str_eq(v, "from-a");
    free(v);
    char p[256];
    snprintf(p, sizeof(p), "%s/s.db", dbdir);
    sqlite3 *db3 = NULL;
    cr_assert_eq(sqlite3_open_v2(p, &db3, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db3,
                                    "SELECT writer, replaced FROM history WHERE path = 'fa' "
                                    "ORDER BY seq DESC LIMIT 1",
                                    -1, &st, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), "A");
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 1), "B");
    sqlite3_finalize(st);
    sqlite3_close(db3);
    /* Deleted in a: gone from the store and, after a pull, from b. */
    snprintf(p, sizeof(p), "%s/fb", da);
    cr_assert_eq(unlink(p), 0);
    cr_assert_eq(conch_store_view_sync(a, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.deleted, 1);
    cr_assert_null(read_store("s", "fb"));
    cr_assert_eq(conch_store_view_pull(b, &err), 0);
    cr_assert_null(read_host(db, "fb"));
    conch_store_view_free(a);
    conch_store_view_free(b);
}

Test(store, planted_links_and_fifos_are_skipped)
{
    char d[128], p[256];
    snprintf(d, sizeof(d), "%s/v", base);
    struct conch_store_view *v = NULL;
    struct conch_err err = {0};
    cr_assert_eq(conch_store_view_new(dbdir, "s", 0, d, "A", &v, &err), 0);
    cr_assert_eq(conch_store_view_materialise(v, &err), 0, "%s", err.msg);
    snprintf(p, sizeof(p), "%s/link", d);
    cr_assert_eq(symlink("/etc/passwd", p), 0);
    snprintf(p, sizeof(p), "%s/dirlink", d);
    cr_assert_eq(symlink(base, p), 0);
    snprintf(p, sizeof(p), "%s/fifo", d);
    cr_assert_eq(mkfifo(p, 0600), 0);
    put_file(d, "real", "r");
    struct conch_store_report rep;
    cr_assert_eq(conch_store_view_sync(v, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.written, 1);
    cr_assert_eq(rep.skipped, 3);
    cr_assert_null(read_store("s", "link"));
    /* A host write beneath the planted dir link is not written through it. */
    struct conch_store *s = NULL;
    cr_assert_eq(conch_store_open(dbdir, "s", 0, &s, &err), 0);
    cr_assert_eq(conch_store_write(s, "dirlink/escaped", "x", 1, 0644, "host", &err), 0);
    conch_store_close(s);
    cr_assert_eq(conch_store_view_pull(v, &err), 0, "%s", err.msg);
    snprintf(p, sizeof(p), "%s/escaped", base);
    cr_assert_eq(access(p, F_OK), -1);
    conch_store_view_free(v);
}
