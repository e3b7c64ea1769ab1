/* store-db.c - named stores (issue 18): files kept in one SQLite database per store
 * (<dir>/<name>.db: path, kind, content, mode, mtime, a version and the writer), read and
 * written on the host side (store.ls/read/write/delete/list) and by the write-back of a
 * sandbox's view (store-sync.c). Every change is one transaction; a concurrent change to the
 * same path is settled by last writer wins, recorded in the history table. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "workspace/store-internal.h"
#include "workspace/workspace.h"

#define BUSY_TIMEOUT_MS 30000
#define HISTORY_KEEP 10000

int conch_store_name_check(const char *name, struct conch_err *err)
{
    size_t n = strlen(name);
    if (n == 0 || n > CONCH_STORE_NAME_MAX || name[0] == '.' || name[0] == '-')
        goto bad;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            goto bad;
    }
    return 0;
bad:
    return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                          "store name '%.80s': 1 to %d of [A-Za-z0-9._-], not starting with '.' "
                          "or '-'",
                          name, CONCH_STORE_NAME_MAX);
}

int conch_store_path_normalize(const char *in, char *out, size_t size, struct conch_err *err)
{
    size_t o = 0;
    const char *c = in;
    while (*c == '/')
        c++;
    while (*c) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 0) {
            c++;
            continue;
        }
        if ((len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "store path '%.200s': '.' and '..' components are refused", in);
        if (len > 255)
            return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                                  "store path '%.200s': a component longer than 255 bytes", in);
        for (size_t i = 0; i < len; i++)
            if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f)
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "store path '%.200s': control characters are refused", in);
        if (o + (o ? 1 : 0) + len >= size || o + len >= CONCH_STORE_PATH_MAX)
            return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                                  "store path '%.200s': longer than %d bytes", in,
                                  CONCH_STORE_PATH_MAX - 1);
        if (o)
            out[o++] = '/';
        memcpy(out + o, c, len);
        o += len;
        c += len;
    }
    out[o] = '\0';
    return 0;
}

static int db_fail(struct conch_store *s, const char *what, struct conch_err *err)
{
    int rc = sqlite3_errcode(s->db);
    int code = rc == SQLITE_FULL ? ENOSPC : rc == SQLITE_BUSY ? EBUSY : EIO;
    return conch_err_set(err, code, "store '%s': %s: %s", s->name, what, sqlite3_errmsg(s->db));
}

int conch_store__exec(struct conch_store *s, const char *sql, struct conch_err *err)
{
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        int r = conch_err_set(err, EIO, "store '%s': %s: %s", s->name, sql, msg ? msg : "?");
        sqlite3_free(msg);
        return r;
    }
    return 0;
}

int conch_store__prepare(struct conch_store *s, const char *sql, sqlite3_stmt **ret,
                         struct conch_err *err)
{
    if (sqlite3_prepare_v2(s->db, sql, -1, ret, NULL) != SQLITE_OK)
        return db_fail(s, "prepare", err);
    return 0;
}

static const char schema[] =
    "CREATE TABLE IF NOT EXISTS files(path TEXT PRIMARY KEY, kind INTEGER NOT NULL, "
    "content BLOB, size INTEGER NOT NULL DEFAULT 0, mode INTEGER NOT NULL, mtime REAL NOT NULL, "
    "version INTEGER NOT NULL, writer TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX IF NOT EXISTS files_version ON files(version);"
    "CREATE TABLE IF NOT EXISTS history(seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, "
    "path TEXT NOT NULL, op TEXT NOT NULL, writer TEXT NOT NULL, replaced TEXT);"
    "CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v INTEGER NOT NULL);"
    "INSERT OR IGNORE INTO meta VALUES('version', 0);";

static int meta_get(struct conch_store *s, const char *k, int64_t *ret, struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(s, "SELECT v FROM meta WHERE k = ?1", &st, err);
    if (r < 0)
        return r;
    sqlite3_bind_text(st, 1, k, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *ret = sqlite3_column_int64(st, 0);
    else if (rc != SQLITE_DONE)
        r = db_fail(s, "read meta", err);
    else
        r = 1; /* none */
    sqlite3_finalize(st);
    return r;
}

static int meta_set(struct conch_store *s, const char *k, int64_t v, struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(s, "INSERT OR REPLACE INTO meta VALUES(?1, ?2)", &st, err);
    if (r < 0)
        return r;
    sqlite3_bind_text(st, 1, k, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, v);
    if (sqlite3_step(st) != SQLITE_DONE)
        r = db_fail(s, "write meta", err);
    sqlite3_finalize(st);
    return r;
}

int conch_store_open(const char *dir, const char *name, uint64_t max_bytes,
                     struct conch_store **ret, struct conch_err *err)
{
    int r = conch_store_name_check(name, err);
    if (r < 0)
        return r;
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/%s.db", dir, name);
    if (n < 0 || (size_t)n >= sizeof(path))
        return conch_err_set(err, ENAMETOOLONG, "store '%s': path too long", name);
    struct stat st;
    if (!max_bytes && stat(path, &st) < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOENT,
                              "no store '%s' (a sandbox's store mount creates it)", name);
    if (max_bytes && mkdir(dir, 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", dir, strerror(errno));
    struct conch_store *s = calloc(1, sizeof(*s));
    if (!s)
        return conch_err_set(err, ENOMEM, "out of memory");
    snprintf(s->name, sizeof(s->name), "%s", name);
    int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW |
                (max_bytes ? SQLITE_OPEN_CREATE : 0);
    mode_t old = umask(077);
    int rc = sqlite3_open_v2(path, &s->db, flags, NULL);
    umask(old);
    if (rc != SQLITE_OK) {
        r = conch_err_set(err, EIO, "store '%s': open '%s': %s", name, path,
                          s->db ? sqlite3_errmsg(s->db) : "out of memory");
        conch_store_close(s);
        return r;
    }
    sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);
    int64_t cap = 0;
    if ((r = conch_store__exec(s, "PRAGMA journal_mode = WAL", err)) < 0 ||
        (r = conch_store__exec(s, "PRAGMA synchronous = FULL", err)) < 0 ||
        (r = conch_store__exec(s, schema, err)) < 0 ||
        (r = meta_get(s, "max_bytes", &cap, err)) < 0) {
        conch_store_close(s);
        return r;
    }
    if (r == 1) { /* a new store: its cap is the one it was made with */
        cap = (int64_t)(max_bytes ? max_bytes : CONCH_STORE_TOTAL_DEFAULT);
        if ((r = meta_set(s, "max_bytes", cap, err)) < 0) {
            conch_store_close(s);
            return r;
        }
    }
    s->max_bytes = (uint64_t)cap;
    *ret = s;
    return 0;
}

void conch_store_close(struct conch_store *s)
{
    if (!s)
        return;
    sqlite3_close(s->db);
    free(s);
}

uint64_t conch_store_max_bytes(const struct conch_store *s)
{
    return s->max_bytes;
}

uint64_t conch_store_file_max(const struct conch_store *s)
{
    return s->max_bytes < CONCH_STORE_FILE_MAX ? s->max_bytes : CONCH_STORE_FILE_MAX;
}

int conch_store__begin(struct conch_store *s, struct conch_err *err)
{
    return conch_store__exec(s, "BEGIN IMMEDIATE", err);
}

int conch_store__commit(struct conch_store *s, struct conch_err *err)
{
    return conch_store__exec(s, "COMMIT", err);
}

void conch_store__rollback(struct conch_store *s)
{
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int conch_store__next_version(struct conch_store *s, int64_t *ret, struct conch_err *err)
{
    int64_t v = 0;
    int r = meta_get(s, "version", &v, err);
    if (r < 0)
        return r;
    if ((r = meta_set(s, "version", v + 1, err)) < 0)
        return r;
    *ret = v + 1;
    return 0;
}

int conch_store__version(struct conch_store *s, int64_t *ret, struct conch_err *err)
{
    int64_t v = 0;
    int r = meta_get(s, "version", &v, err);
    if (r < 0)
        return r;
    *ret = v;
    return 0;
}

/* The row at @path: 0 and its fields, 1 when there is none (a tombstone counts as a row). */
static int row_get(struct conch_store *s, const char *path, int *ret_kind, bool *ret_deleted,
                   int64_t *ret_version, char *ret_writer, size_t wsize, struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(
        s, "SELECT kind, deleted, version, writer FROM files WHERE path = ?1", &st, err);
    if (r < 0)
        return r;
    sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *ret_kind = sqlite3_column_int(st, 0);
        *ret_deleted = sqlite3_column_int(st, 1) != 0;
        *ret_version = sqlite3_column_int64(st, 2);
        const unsigned char *w = sqlite3_column_text(st, 3);
        snprintf(ret_writer, wsize, "%s", w ? (const char *)w : "");
        r = 0;
    } else if (rc == SQLITE_DONE) {
        r = 1;
    } else {
        r = db_fail(s, "read", err);
    }
    sqlite3_finalize(st);
    return r;
}

static int history_add(struct conch_store *s, const char *path, const char *op, const char *writer,
                       const char *replaced, struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(
        s, "INSERT INTO history(at, path, op, writer, replaced) VALUES(?1, ?2, ?3, ?4, ?5)", &st,
        err);
    if (r < 0)
        return r;
    sqlite3_bind_double(st, 1, now_s());
    sqlite3_bind_text(st, 2, path, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, op, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 4, writer, -1, SQLITE_STATIC);
    if (replaced)
        sqlite3_bind_text(st, 5, replaced, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 5);
    if (sqlite3_step(st) != SQLITE_DONE)
        r = db_fail(s, "record history", err);
    sqlite3_finalize(st);
    return r;
}

/* Mark everything beneath @path deleted (a dir replaced or removed). */
static int tombstone_beneath(struct conch_store *s, const char *path, int64_t version,
                             const char *writer, struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(
        s,
        "UPDATE files SET deleted = 1, content = NULL, size = 0, version = ?2, writer = ?3 "
        "WHERE deleted = 0 AND substr(path, 1, length(?1) + 1) = ?1 || '/'",
        &st, err);
    if (r < 0)
        return r;
    sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, version);
    sqlite3_bind_text(st, 3, writer, -1, SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE)
        r = db_fail(s, "delete beneath", err);
    sqlite3_finalize(st);
    return r;
}

static int upsert(struct conch_store *s, const char *path, int kind, const void *buf, size_t len,
                  uint32_t mode, double mtime, int64_t version, const char *writer, bool deleted,
                  struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(s,
                                 "INSERT OR REPLACE INTO files(path, kind, content, size, mode, "
                                 "mtime, version, writer, deleted) "
                                 "VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                                 &st, err);
    if (r < 0)
        return r;
    sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 2, kind);
    if (kind == CONCH_STORE_FILE && !deleted)
        sqlite3_bind_blob64(st, 3, len ? buf : "", len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 3);
    sqlite3_bind_int64(st, 4, deleted ? 0 : (sqlite3_int64)len);
    sqlite3_bind_int(st, 5, (int)(mode & 0777));
    sqlite3_bind_double(st, 6, mtime);
    sqlite3_bind_int64(st, 7, version);
    sqlite3_bind_text(st, 8, writer, -1, SQLITE_STATIC);
    sqlite3_bind_int(st, 9, deleted);
    if (sqlite3_step(st) != SQLITE_DONE)
        r = db_fail(s, "write", err);
    sqlite3_finalize(st);
    return r;
}

/* The writer that @path's row came from, when it changed after @base (a concurrent update this
 * write replaces), else NULL in @buf[0]. */
static int replaced_by(struct conch_store *s, const char *path, int64_t base, const char *writer,
                       char *buf, size_t size, struct conch_err *err)
{
    int kind;
    bool deleted;
    int64_t version;
    buf[0] = '\0';
    int r = row_get(s, path, &kind, &deleted, &version, buf, size, err);
    if (r < 0)
        return r;
    if (r == 1 || base < 0 || version <= base || !strcmp(buf, writer))
        buf[0] = '\0';
    return 0;
}

/* Make each parent dir of @path a live dir (replacing a file there: last writer wins). */
static int parents(struct conch_store *s, const char *path, int64_t version, const char *writer,
                   double mtime, struct conch_err *err)
{
    char p[CONCH_STORE_PATH_MAX];
    snprintf(p, sizeof(p), "%s", path);
    for (char *sl = strchr(p, '/'); sl; sl = strchr(sl + 1, '/')) {
        *sl = '\0';
        int kind;
        bool deleted;
        int64_t v;
        char w[128];
        int r = row_get(s, p, &kind, &deleted, &v, w, sizeof(w), err);
        if (r < 0)
            return r;
        if (r == 1 || deleted || kind != CONCH_STORE_DIR) {
            if ((r = upsert(s, p, CONCH_STORE_DIR, NULL, 0, 0755, mtime, version, writer, false,
                            err)) < 0)
                return r;
            if ((r = history_add(s, p, "mkdir", writer, NULL, err)) < 0)
                return r;
        }
        *sl = '/';
    }
    return 0;
}

int conch_store__put(struct conch_store *s, const char *path, int kind, const void *buf, size_t len,
                     uint32_t mode, double mtime, int64_t base, const char *writer, int64_t version,
                     struct conch_err *err)
{
    char rep[128];
    int r = replaced_by(s, path, base, writer, rep, sizeof(rep), err);
    if (r < 0)
        return r;
    if (len > conch_store_file_max(s))
        return conch_err_setk(err, CONCH_ERR_LIMIT, EFBIG,
                              "store '%s': '%.200s' is %zu bytes, over the largest file a store "
                              "keeps (%llu bytes)",
                              s->name, path, len, (unsigned long long)conch_store_file_max(s));
    if ((r = parents(s, path, version, writer, mtime, err)) < 0 ||
        (kind == CONCH_STORE_FILE && (r = tombstone_beneath(s, path, version, writer, err)) < 0) ||
        (r = upsert(s, path, kind, buf, len, mode, mtime, version, writer, false, err)) < 0)
        return r;
    return history_add(s, path, kind == CONCH_STORE_DIR ? "mkdir" : "write", writer,
                       rep[0] ? rep : NULL, err);
}

int conch_store__del(struct conch_store *s, const char *path, int64_t base, const char *writer,
                     int64_t version, struct conch_err *err)
{
    int kind;
    bool deleted;
    int64_t v;
    char w[128];
    int r = row_get(s, path, &kind, &deleted, &v, w, sizeof(w), err);
    if (r < 0)
        return r;
    if (r == 1 || deleted)
        return 0; /* gone already: nothing to record */
    const char *rep = base >= 0 && v > base && strcmp(w, writer) ? w : NULL;
    if ((r = tombstone_beneath(s, path, version, writer, err)) < 0 ||
        (r = upsert(s, path, kind, NULL, 0, 0, now_s(), version, writer, true, err)) < 0)
        return r;
    return history_add(s, path, "delete", writer, rep, err);
}

int conch_store__total(struct conch_store *s, uint64_t *ret_bytes, uint64_t *ret_entries,
                       struct conch_err *err)
{
    sqlite3_stmt *st = NULL;
    int r = conch_store__prepare(
        s, "SELECT coalesce(sum(size), 0), count(*) FROM files WHERE deleted = 0", &st, err);
    if (r < 0)
        return r;
    if (sqlite3_step(st) == SQLITE_ROW) {
        *ret_bytes = (uint64_t)sqlite3_column_int64(st, 0);
        *ret_entries = (uint64_t)sqlite3_column_int64(st, 1);
    } else {
        r = db_fail(s, "measure", err);
    }
    sqlite3_finalize(st);
    return r;
}

/* Within the caps, and the history trimmed; then commit. On failure the transaction is
 * rolled back: nothing of it happened. */
int conch_store__finish(struct conch_store *s, struct conch_err *err)
{
    uint64_t bytes = 0, entries = 0;
    int r = conch_store__total(s, &bytes, &entries, err);
    if (r >= 0 && bytes > s->max_bytes)
        r = conch_err_setk(err, CONCH_ERR_LIMIT, ENOSPC,
                           "store '%s' would hold %llu bytes, over its cap of %llu: nothing was "
                           "written (delete files to make room)",
                           s->name, (unsigned long long)bytes, (unsigned long long)s->max_bytes);
    if (r >= 0 && entries > CONCH_STORE_ENTRIES_MAX)
        r = conch_err_setk(err, CONCH_ERR_LIMIT, ENOSPC,
                           "store '%s' would hold %llu files and dirs, over its cap of %d: "
                           "nothing was written",
                           s->name, (unsigned long long)entries, CONCH_STORE_ENTRIES_MAX);
    if (r >= 0)
        r = conch_store__exec(s,
                              "DELETE FROM history WHERE seq <= (SELECT max(seq) FROM history) - "
                              "10000",
                              err);
    if (r >= 0)
        r = conch_store__commit(s, err);
    if (r < 0)
        conch_store__rollback(s);
    return r;
}

/* ---- host-side operations ---- */

static json_t *row_json(sqlite3_stmt *st)
{
    const char *path = (const char *)sqlite3_column_text(st, 0);
    const char *slash = strrchr(path, '/');
    int kind = sqlite3_column_int(st, 1);
    return json_pack("{s:s,s:s,s:s,s:I,s:i,s:f,s:s}", "name", slash ? slash + 1 : path, "path",
                     path, "type", kind == CONCH_STORE_DIR ? "dir" : "file", "size",
                     (json_int_t)sqlite3_column_int64(st, 2), "mode", sqlite3_column_int(st, 3),
                     "mtime", sqlite3_column_double(st, 4), "writer",
                     (const char *)sqlite3_column_text(st, 5));
}

int conch_store_ls(struct conch_store *s, const char *path, json_t **ret, struct conch_err *err)
{
    char p[CONCH_STORE_PATH_MAX];
    int r = conch_store_path_normalize(path, p, sizeof(p), err);
    if (r < 0)
        return r;
    if (p[0]) {
        int kind;
        bool deleted;
        int64_t v;
        char w[128];
        if ((r = row_get(s, p, &kind, &deleted, &v, w, sizeof(w), err)) < 0)
            return r;
        if (r == 1 || deleted)
            return conch_err_setk(err, CONCH_ERR_USAGE, ENOENT, "store '%s': no '%s'", s->name, p);
        if (kind != CONCH_STORE_DIR)
            return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR, "store '%s': '%s' is a file",
                                  s->name, p);
    }
    sqlite3_stmt *st = NULL;
    if ((r = conch_store__prepare(
             s,
             "SELECT path, kind, size, mode, mtime, writer FROM files WHERE deleted = 0 AND "
             "(?1 = '' OR substr(path, 1, length(?1) + 1) = ?1 || '/') AND "
             "instr(substr(path, length(?1) + (CASE WHEN ?1 = '' THEN 1 ELSE 2 END)), '/') = 0 "
             "ORDER BY path",
             &st, err)) < 0)
        return r;
    sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
    json_t *arr = json_array();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW)
        json_array_append_new(arr, row_json(st));
    if (rc != SQLITE_DONE) {
        r = db_fail(s, "list", err);
        json_decref(arr);
    } else {
        *ret = arr;
    }
    sqlite3_finalize(st);
    return r;
}

int conch_store_read(struct conch_store *s, const char *path, char **ret_buf, size_t *ret_len,
                     json_t **ret_meta, struct conch_err *err)
{
    char p[CONCH_STORE_PATH_MAX];
    int r = conch_store_path_normalize(path, p, sizeof(p), err);
    if (r < 0)
        return r;
    if (!p[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EISDIR, "store '%s': the root is a dir",
                              s->name);
    sqlite3_stmt *st = NULL;
    if ((r = conch_store__prepare(s,
                                  "SELECT path, kind, size, mode, mtime, writer, content FROM "
                                  "files WHERE deleted = 0 AND path = ?1",
                                  &st, err)) < 0)
        return r;
    sqlite3_bind_text(st, 1, p, -1, SQLITE_STATIC);
    int rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        r = conch_err_setk(err, CONCH_ERR_USAGE, ENOENT, "store '%s': no '%s'", s->name, p);
    } else if (rc != SQLITE_ROW) {
        r = db_fail(s, "read", err);
    } else if (sqlite3_column_int(st, 1) == CONCH_STORE_DIR) {
        r = conch_err_setk(err, CONCH_ERR_USAGE, EISDIR, "store '%s': '%s' is a dir", s->name, p);
    } else {
        size_t len = (size_t)sqlite3_column_bytes(st, 6);
        char *buf = malloc(len + 1);
        if (!buf) {
            r = conch_err_set(err, ENOMEM, "out of memory");
        } else {
            if (len)
                memcpy(buf, sqlite3_column_blob(st, 6), len);
            buf[len] = '\0';
            *ret_buf = buf;
            *ret_len = len;
            *ret_meta = row_json(st);
        }
    }
    sqlite3_finalize(st);
    return r;
}

int conch_store_write(struct conch_store *s, const char *path, const void *buf, size_t len,
                      uint32_t mode, const char *writer, struct conch_err *err)
{
    char p[CONCH_STORE_PATH_MAX];
    int r = conch_store_path_normalize(path, p, sizeof(p), err);
    if (r < 0)
        return r;
    if (!p[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EISDIR, "store '%s': the root is a dir",
                              s->name);
    int64_t version;
    if ((r = conch_store__begin(s, err)) < 0)
        return r;
    if ((r = conch_store__next_version(s, &version, err)) < 0 ||
        (r = conch_store__put(s, p, CONCH_STORE_FILE, buf, len, mode, now_s(), -1, writer, version,
                              err)) < 0) {
        conch_store__rollback(s);
        return r;
    }
    return conch_store__finish(s, err);
}

int conch_store_delete(struct conch_store *s, const char *path, const char *writer,
                       struct conch_err *err)
{
    char p[CONCH_STORE_PATH_MAX];
    int r = conch_store_path_normalize(path, p, sizeof(p), err);
    if (r < 0)
        return r;
    if (!p[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "store '%s': the root is not deleted (delete what is in it)",
                              s->name);
    int kind;
    bool deleted;
    int64_t v;
    char w[128];
    if ((r = conch_store__begin(s, err)) < 0)
        return r;
    r = row_get(s, p, &kind, &deleted, &v, w, sizeof(w), err);
    if (r == 1 || (r == 0 && deleted))
        r = conch_err_setk(err, CONCH_ERR_USAGE, ENOENT, "store '%s': no '%s'", s->name, p);
    if (r >= 0 && (r = conch_store__next_version(s, &v, err)) >= 0)
        r = conch_store__del(s, p, -1, writer, v, err);
    if (r < 0) {
        conch_store__rollback(s);
        return r;
    }
    return conch_store__finish(s, err);
}

int conch_store_list(const char *dir, json_t **ret, struct conch_err *err)
{
    json_t *arr = json_array();
    _cleanup_closedir_ DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) {
            *ret = arr;
            return 0;
        }
        json_decref(arr);
        return conch_err_set(err, errno, "opendir '%s': %s", dir, strerror(errno));
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 3, ".db"))
            continue;
        char name[CONCH_STORE_NAME_MAX + 1];
        if (n - 3 > CONCH_STORE_NAME_MAX)
            continue;
        snprintf(name, sizeof(name), "%.*s", (int)(n - 3), e->d_name);
        struct conch_store *s = NULL;
        struct conch_err e2 = {0};
        if (conch_store_open(dir, name, 0, &s, &e2) < 0)
            continue;
        uint64_t bytes = 0, entries = 0;
        int64_t version = 0;
        if (conch_store__total(s, &bytes, &entries, &e2) >= 0 &&
            conch_store__version(s, &version, &e2) >= 0)
            json_array_append_new(arr, json_pack("{s:s,s:I,s:I,s:I,s:I}", "name", name, "bytes",
                                                 (json_int_t)bytes, "entries", (json_int_t)entries,
                                                 "max_bytes", (json_int_t)s->max_bytes, "version",
                                                 (json_int_t)version));
        conch_store_close(s);
    }
    *ret = arr;
    return 0;
}
