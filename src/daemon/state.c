/* state.c - the daemon's state database on SQLite: schema migrations keyed on
 * PRAGMA user_version, and the sandbox and job records. Every statement is prepared with
 * bound parameters; every write is a single transaction. */
#include "daemon/state.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "core/cleanup.h"
#include "core/fsutil.h"

#define BUSY_TIMEOUT_MS 5000

struct conch_state {
    sqlite3 *db;
    pthread_mutex_t lock;
    int claim_fd; /* flock'd by conch_state_claim; -1 */
    char path[4096];
};

/* migrations[i] takes the schema from version i to i + 1 and stamps the new version. Only
 * ever append: a released step never changes. */
static const char *const migrations[] = {
    /* 0 -> 1 */
    "CREATE TABLE sandboxes ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  name TEXT NOT NULL DEFAULT '',"
    "  workspace TEXT NOT NULL DEFAULT '',"
    "  mode TEXT NOT NULL DEFAULT '',"
    "  spec_json TEXT,"
    "  state TEXT NOT NULL CHECK (state IN ('running', 'stopped')),"
    "  upper_dir TEXT NOT NULL DEFAULT '',"
    "  warden_pid INTEGER NOT NULL DEFAULT 0,"
    "  warden_starttime INTEGER NOT NULL DEFAULT 0,"
    "  created_at REAL NOT NULL DEFAULT 0,"
    "  last_used_at REAL NOT NULL DEFAULT 0"
    ");"
    "CREATE TABLE jobs ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,"
    "  command TEXT NOT NULL DEFAULT '',"
    "  pid INTEGER NOT NULL DEFAULT 0,"
    "  exit_code INTEGER NOT NULL DEFAULT -1,"
    "  signal INTEGER NOT NULL DEFAULT 0,"
    "  running INTEGER NOT NULL DEFAULT 0,"
    "  started_at REAL NOT NULL DEFAULT 0,"
    "  ended_at REAL NOT NULL DEFAULT 0,"
    "  stdout_spill TEXT NOT NULL DEFAULT '',"
    "  stderr_spill TEXT NOT NULL DEFAULT ''"
    ");"
    "CREATE INDEX jobs_by_sandbox ON jobs(sandbox_id);"
    "PRAGMA user_version = 1;",
    /* 1 -> 2: snapshots (frozen layers) and the one each sandbox is stacked on */
    "ALTER TABLE sandboxes ADD COLUMN layer TEXT NOT NULL DEFAULT '';"
    "CREATE TABLE layers ("
    "  id TEXT PRIMARY KEY NOT NULL,"
    "  name TEXT NOT NULL DEFAULT '',"
    "  parent TEXT NOT NULL DEFAULT '',"
    "  workspace TEXT NOT NULL DEFAULT '',"
    "  sandbox TEXT NOT NULL DEFAULT '',"
    "  id_base INTEGER NOT NULL DEFAULT 0,"
    "  size INTEGER NOT NULL DEFAULT 0,"
    "  files INTEGER NOT NULL DEFAULT 0,"
    "  depth INTEGER NOT NULL DEFAULT 1,"
    "  created_at REAL NOT NULL DEFAULT 0,"
    "  spec_json TEXT"
    ");"
    "PRAGMA user_version = 2;",
};

_Static_assert(ARRAY_SIZE(migrations) == CONCH_STATE_SCHEMA_VERSION,
               "one migration per schema version");

static void finalizep(sqlite3_stmt **s)
{
    if (*s)
        sqlite3_finalize(*s);
}
#define _cleanup_stmt_ _cleanup_(finalizep)

static void unlockp(pthread_mutex_t **m)
{
    if (*m)
        pthread_mutex_unlock(*m);
}
/* Holds @st's mutex until the end of the enclosing scope. */
#define LOCK_SCOPE(st)                                                                             \
    _cleanup_(unlockp) pthread_mutex_t *_scope_lock = &(st)->lock;                                 \
    pthread_mutex_lock(_scope_lock)

/* SQLite result code -> errno, keeping the OS errno when SQLite has one. */
static int errno_of(sqlite3 *db, int rc)
{
    switch (rc & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return EBUSY;
    case SQLITE_NOMEM:
        return ENOMEM;
    case SQLITE_READONLY:
        return EROFS;
    case SQLITE_FULL:
        return ENOSPC;
    case SQLITE_PERM:
    case SQLITE_AUTH:
        return EACCES;
    case SQLITE_CONSTRAINT:
        return (rc == SQLITE_CONSTRAINT_FOREIGNKEY) ? ENOENT : EINVAL;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
        return EBADMSG;
    case SQLITE_CANTOPEN:
    case SQLITE_IOERR: {
        int e = db ? sqlite3_system_errno(db) : 0;
        return e > 0 ? e : EIO;
    }
    default:
        return EIO;
    }
}

static int sql_fail(struct conch_state *st, int rc, struct conch_err *err, const char *what)
{
    return conch_err_set(err, errno_of(st->db, rc), "state database '%s': %s: %s", st->path, what,
                         st->db ? sqlite3_errmsg(st->db) : sqlite3_errstr(rc));
}

static int prepare(struct conch_state *st, const char *sql, sqlite3_stmt **ret,
                   struct conch_err *err)
{
    int rc = sqlite3_prepare_v2(st->db, sql, -1, ret, NULL);
    if (rc != SQLITE_OK)
        return sql_fail(st, rc, err, "prepare statement");
    return 0;
}

/* Run a constant statement (or several) that takes no parameters. */
static int exec_const(struct conch_state *st, const char *sql, const char *what,
                      struct conch_err *err)
{
    int rc = sqlite3_exec(st->db, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return sql_fail(st, rc, err, what);
    return 0;
}

/* Step a write statement to completion; *@ret_changes (may be NULL) gets the rows it hit. */
static int step_done(struct conch_state *st, sqlite3_stmt *s, const char *what, int *ret_changes,
                     struct conch_err *err)
{
    int rc = sqlite3_step(s);
    if (rc != SQLITE_DONE)
        return sql_fail(st, rc, err, what);
    if (ret_changes)
        *ret_changes = sqlite3_changes(st->db);
    return 0;
}

static int read_user_version(struct conch_state *st, int *ret, struct conch_err *err)
{
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "PRAGMA user_version", &s, err);
    if (r < 0)
        return r;
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW)
        return sql_fail(st, rc, err, "read schema version");
    *ret = sqlite3_column_int(s, 0);
    return 0;
}

static int refuse_newer(struct conch_state *st, int version, struct conch_err *err)
{
    return conch_err_set(err, EPROTONOSUPPORT,
                         "state database '%s' has schema version %d, newer than this conch "
                         "knows (%d): run a newer conch, or move the file away to start afresh",
                         st->path, version, CONCH_STATE_SCHEMA_VERSION);
}

static int migrate(struct conch_state *st, struct conch_err *err)
{
    /* IMMEDIATE takes the write lock up front, so two daemons starting at once cannot
     * both read version 0 and both try to create the tables. */
    int r = exec_const(st, "BEGIN IMMEDIATE", "begin migration", err);
    if (r < 0)
        return r;
    int version = 0;
    r = read_user_version(st, &version, err);
    if (r >= 0 && version > CONCH_STATE_SCHEMA_VERSION)
        r = refuse_newer(st, version, err);
    for (int v = version < 0 ? 0 : version; r >= 0 && v < CONCH_STATE_SCHEMA_VERSION; v++) {
        char what[64];
        snprintf(what, sizeof(what), "migrate schema from version %d", v);
        r = exec_const(st, migrations[v], what, err);
    }
    if (r >= 0)
        r = exec_const(st, "COMMIT", "commit migration", err);
    if (r < 0)
        (void)sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return r;
}

static int set_journal_wal(struct conch_state *st, struct conch_err *err)
{
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "PRAGMA journal_mode = WAL", &s, err);
    if (r < 0)
        return r;
    int rc = sqlite3_step(s);
    if (rc != SQLITE_ROW)
        return sql_fail(st, rc, err, "set WAL journal mode");
    const char *mode = (const char *)sqlite3_column_text(s, 0);
    if (!mode || strcmp(mode, "wal"))
        return conch_err_set(err, EOPNOTSUPP,
                             "state database '%s': the filesystem does not support WAL "
                             "journaling (journal mode is '%s'); put the state directory on a "
                             "local filesystem",
                             st->path, mode ? mode : "?");
    return 0;
}

int conch_state_default_dir(char *buf, size_t size, struct conch_err *err)
{
    int n;
    if (geteuid() == 0) {
        n = snprintf(buf, size, "/var/lib/conch");
    } else {
        const char *xdg = getenv("XDG_STATE_HOME");
        const char *home = getenv("HOME");
        /* The XDG spec: a relative $XDG_STATE_HOME is invalid and must be ignored. */
        if (xdg && xdg[0] == '/')
            n = snprintf(buf, size, "%s/conch", xdg);
        else if (home && home[0] == '/')
            n = snprintf(buf, size, "%s/.local/state/conch", home);
        else
            return conch_err_set(err, ENOENT,
                                 "no state directory: neither $XDG_STATE_HOME nor $HOME is an "
                                 "absolute path");
    }
    if (n < 0 || (size_t)n >= size)
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    return 0;
}

static int make_parent(const char *path, struct conch_err *err)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        return 0; /* relative name in the current directory */
    if (slash == dir)
        return 0; /* a file in / */
    *slash = '\0';
    return conch_mkdir_p(dir, 0700, err);
}

int conch_state_open(const char *path, struct conch_state **ret, struct conch_err *err)
{
    if (!path || !*path)
        return conch_err_set(err, EINVAL, "state database: empty path");
    if (strlen(path) >= sizeof(((struct conch_state *)0)->path))
        return conch_err_set(err, ENAMETOOLONG, "state database '%s': path too long", path);

    int r = make_parent(path, err);
    if (r < 0)
        return conch_err_wrap(err, "state database '%s'", path);
    /* Create the file ourselves so it is 0600 whatever the umask: it names host paths and
     * commands. SQLite gives the -wal and -shm files the database file's mode. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return conch_err_set(err, errno, "state database '%s': open: %s", path, strerror(errno));
    close(fd);

    struct conch_state *st = calloc(1, sizeof(*st));
    if (!st)
        return conch_err_set(err, ENOMEM, "state database: out of memory");
    snprintf(st->path, sizeof(st->path), "%s", path);
    st->claim_fd = -1;
    pthread_mutex_init(&st->lock, NULL);

    int rc = sqlite3_open_v2(
        path, &st->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL);
    if (rc != SQLITE_OK) {
        r = sql_fail(st, rc, err, "open");
        goto fail;
    }
    sqlite3_extended_result_codes(st->db, 1);
    sqlite3_busy_timeout(st->db, BUSY_TIMEOUT_MS);

    /* Check the version before anything writes: a newer conch's database stays untouched
     * (switching to WAL rewrites the header). */
    int version = 0;
    if ((r = read_user_version(st, &version, err)) < 0)
        goto fail;
    if (version > CONCH_STATE_SCHEMA_VERSION) {
        r = refuse_newer(st, version, err);
        goto fail;
    }
    if ((r = set_journal_wal(st, err)) < 0)
        goto fail;
    /* NORMAL in WAL mode: a commit is durable against a crash of the daemon (SIGKILL) and
     * the database never corrupts; only a power loss may lose the last commits. Commits then
     * do no fsync (only checkpoints do), which keeps the daemon's loop from waiting on the
     * disk for every record. */
    if ((r = exec_const(st, "PRAGMA synchronous = NORMAL", "set synchronous", err)) < 0)
        goto fail;
    /* Per connection and off by default; must be set outside a transaction. */
    if ((r = exec_const(st, "PRAGMA foreign_keys = ON", "enable foreign keys", err)) < 0)
        goto fail;
    /* Only a database behind the current schema takes the write lock: `conch gc`, which only
     * reads, then never makes a running daemon's writes busy. */
    if (version < CONCH_STATE_SCHEMA_VERSION && (r = migrate(st, err)) < 0)
        goto fail;

    *ret = st;
    return 0;
fail:
    conch_state_close(st);
    return r;
}

void conch_state_set_busy_timeout(struct conch_state *st, int ms)
{
    LOCK_SCOPE(st);
    sqlite3_busy_timeout(st->db, ms > 0 ? ms : 0);
}

int conch_state_claim(struct conch_state *st, struct conch_err *err)
{
    if (st->claim_fd >= 0)
        return 0;
    int fd = open(st->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return conch_err_set(err, errno, "state database '%s': open: %s", st->path,
                             strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK)
            return conch_err_set(err, EBUSY,
                                 "state database '%s' is in use by another conch daemon: stop it, "
                                 "or give this one another --state-dir",
                                 st->path);
        return conch_err_set(err, e, "state database '%s': flock: %s", st->path, strerror(e));
    }
    st->claim_fd = fd;
    return 0;
}

void conch_state_close(struct conch_state *st)
{
    if (!st)
        return;
    if (st->claim_fd >= 0)
        close(st->claim_fd);
    if (st->db)
        sqlite3_close_v2(st->db);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

/* ---- helpers for records ---- */

#define TERMINATED(field) (memchr((field), '\0', sizeof(field)) != NULL)

static void col_copy(sqlite3_stmt *s, int i, char *buf, size_t size)
{
    const char *t = (const char *)sqlite3_column_text(s, i);
    snprintf(buf, size, "%s", t ? t : "");
}

static int col_dup(sqlite3_stmt *s, int i, char **ret)
{
    *ret = NULL;
    if (sqlite3_column_type(s, i) == SQLITE_NULL)
        return 0;
    const char *t = (const char *)sqlite3_column_text(s, i);
    if (!t)
        return -ENOMEM; /* text conversion failed: only on out of memory */
    *ret = strdup(t);
    return *ret ? 0 : -ENOMEM;
}

static int bind_text(sqlite3_stmt *s, int i, const char *v)
{
    return sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
}

static bool state_ok(const char *state)
{
    return !strcmp(state, "running") || !strcmp(state, "stopped");
}

static int not_found(struct conch_err *err, const char *what, const char *id)
{
    return conch_err_set(err, ENOENT, "%s '%s' is not recorded", what, id);
}

/* Grow *@list (of *@cap elements of @elem bytes) to hold one more than @n. */
static int grow(void **list, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t ncap = *cap ? *cap * 2 : 8;
    void *p = reallocarray(*list, ncap, elem);
    if (!p)
        return -ENOMEM;
    memset((char *)p + *cap * elem, 0, (ncap - *cap) * elem);
    *list = p;
    *cap = ncap;
    return 0;
}

/* ---- sandboxes ---- */

#define SANDBOX_COLS                                                                               \
    "id, name, workspace, mode, spec_json, state, upper_dir, warden_pid, warden_starttime, "       \
    "created_at, last_used_at, layer"

void conch_state_sandbox_done(struct conch_state_sandbox *sb)
{
    if (!sb)
        return;
    free(sb->spec_json);
    sb->spec_json = NULL;
}

void conch_state_sandbox_free_list(struct conch_state_sandbox *list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        conch_state_sandbox_done(&list[i]);
    free(list);
}

static int sandbox_from_row(sqlite3_stmt *s, struct conch_state_sandbox *sb)
{
    memset(sb, 0, sizeof(*sb));
    col_copy(s, 0, sb->id, sizeof(sb->id));
    col_copy(s, 1, sb->name, sizeof(sb->name));
    col_copy(s, 2, sb->workspace, sizeof(sb->workspace));
    col_copy(s, 3, sb->mode, sizeof(sb->mode));
    if (col_dup(s, 4, &sb->spec_json) < 0)
        return -ENOMEM;
    col_copy(s, 5, sb->state, sizeof(sb->state));
    col_copy(s, 6, sb->upper_dir, sizeof(sb->upper_dir));
    sb->warden_pid = (pid_t)sqlite3_column_int64(s, 7);
    sb->warden_starttime = (unsigned long long)sqlite3_column_int64(s, 8);
    sb->created_at = sqlite3_column_double(s, 9);
    sb->last_used_at = sqlite3_column_double(s, 10);
    col_copy(s, 11, sb->layer, sizeof(sb->layer));
    return 0;
}

int conch_state_sandbox_put(struct conch_state *st, const struct conch_state_sandbox *sb,
                            struct conch_err *err)
{
    if (!TERMINATED(sb->id) || !TERMINATED(sb->name) || !TERMINATED(sb->workspace) ||
        !TERMINATED(sb->mode) || !TERMINATED(sb->state) || !TERMINATED(sb->upper_dir) ||
        !TERMINATED(sb->layer))
        return conch_err_set(err, EINVAL, "record sandbox: a field is not NUL-terminated");
    if (!sb->id[0])
        return conch_err_set(err, EINVAL, "record sandbox: empty id");
    if (!state_ok(sb->state))
        return conch_err_set(err, EINVAL, "record sandbox '%s': invalid state '%s'", sb->id,
                             sb->state);

    LOCK_SCOPE(st);
    /* An upsert, not INSERT OR REPLACE: REPLACE deletes the old row first, and the
     * cascade would take the sandbox's jobs with it. */
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st,
                    "INSERT INTO sandboxes (" SANDBOX_COLS ") "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) "
                    "ON CONFLICT(id) DO UPDATE SET name = excluded.name, "
                    "workspace = excluded.workspace, mode = excluded.mode, "
                    "spec_json = excluded.spec_json, state = excluded.state, "
                    "upper_dir = excluded.upper_dir, warden_pid = excluded.warden_pid, "
                    "warden_starttime = excluded.warden_starttime, "
                    "created_at = excluded.created_at, last_used_at = excluded.last_used_at, "
                    "layer = excluded.layer",
                    &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, sb->id);
    bind_text(s, 2, sb->name);
    bind_text(s, 3, sb->workspace);
    bind_text(s, 4, sb->mode);
    if (sb->spec_json)
        bind_text(s, 5, sb->spec_json);
    else
        sqlite3_bind_null(s, 5);
    bind_text(s, 6, sb->state);
    bind_text(s, 7, sb->upper_dir);
    sqlite3_bind_int64(s, 8, sb->warden_pid);
    sqlite3_bind_int64(s, 9, (sqlite3_int64)sb->warden_starttime);
    sqlite3_bind_double(s, 10, sb->created_at);
    sqlite3_bind_double(s, 11, sb->last_used_at);
    bind_text(s, 12, sb->layer);
    r = step_done(st, s, "record sandbox", NULL, err);
    if (r < 0)
        return conch_err_wrap(err, "sandbox '%s'", sb->id);
    return 0;
}

int conch_state_sandbox_get(struct conch_state *st, const char *id, struct conch_state_sandbox *ret,
                            struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "SELECT " SANDBOX_COLS " FROM sandboxes WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        return not_found(err, "sandbox", id);
    if (rc != SQLITE_ROW)
        return sql_fail(st, rc, err, "read sandbox");
    struct conch_state_sandbox sb;
    if (sandbox_from_row(s, &sb) < 0)
        return conch_err_set(err, ENOMEM, "read sandbox '%s': out of memory", id);
    *ret = sb;
    return 0;
}

int conch_state_sandbox_list(struct conch_state *st, struct conch_state_sandbox **ret,
                             size_t *ret_n, struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "SELECT " SANDBOX_COLS " FROM sandboxes ORDER BY created_at, id", &s, err);
    if (r < 0)
        return r;
    struct conch_state_sandbox *list = NULL;
    size_t n = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (grow((void **)&list, &cap, n, sizeof(*list)) < 0 || sandbox_from_row(s, &list[n]) < 0) {
            conch_state_sandbox_free_list(list, cap);
            return conch_err_set(err, ENOMEM, "list sandboxes: out of memory");
        }
        n++;
    }
    if (rc != SQLITE_DONE) {
        conch_state_sandbox_free_list(list, cap);
        return sql_fail(st, rc, err, "list sandboxes");
    }
    *ret = list;
    *ret_n = n;
    return 0;
}

int conch_state_sandbox_set_state(struct conch_state *st, const char *id, const char *state,
                                  struct conch_err *err)
{
    if (!state || !state_ok(state))
        return conch_err_set(err, EINVAL, "sandbox '%s': invalid state '%s'", id,
                             state ? state : "(null)");
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "UPDATE sandboxes SET state = ?2 WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    bind_text(s, 2, state);
    int changes = 0;
    if ((r = step_done(st, s, "set sandbox state", &changes, err)) < 0)
        return r;
    return changes ? 0 : not_found(err, "sandbox", id);
}

int conch_state_sandbox_touch(struct conch_state *st, const char *id, double last_used_at,
                              struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "UPDATE sandboxes SET last_used_at = ?2 WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    sqlite3_bind_double(s, 2, last_used_at);
    int changes = 0;
    if ((r = step_done(st, s, "touch sandbox", &changes, err)) < 0)
        return r;
    return changes ? 0 : not_found(err, "sandbox", id);
}

static int mark_stopped_locked(struct conch_state *st, const char *id, double now,
                               struct conch_err *err)
{
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "UPDATE sandboxes SET state = 'stopped' WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    int changes = 0;
    if ((r = step_done(st, s, "stop sandbox", &changes, err)) < 0)
        return r;
    if (!changes)
        return not_found(err, "sandbox", id);

    _cleanup_stmt_ sqlite3_stmt *j = NULL;
    r = prepare(st,
                "UPDATE jobs SET running = 0, exit_code = -1, signal = 9, ended_at = ?2 "
                "WHERE sandbox_id = ?1 AND running != 0",
                &j, err);
    if (r < 0)
        return r;
    bind_text(j, 1, id);
    sqlite3_bind_double(j, 2, now);
    return step_done(st, j, "end the sandbox's jobs", NULL, err);
}

int conch_state_sandbox_mark_stopped(struct conch_state *st, const char *id, double now,
                                     struct conch_err *err)
{
    LOCK_SCOPE(st);
    int r = exec_const(st, "BEGIN IMMEDIATE", "begin transaction", err);
    if (r < 0)
        return r;
    r = mark_stopped_locked(st, id, now, err);
    if (r >= 0)
        r = exec_const(st, "COMMIT", "commit", err);
    if (r < 0)
        (void)sqlite3_exec(st->db, "ROLLBACK", NULL, NULL, NULL);
    return r;
}

int conch_state_sandbox_delete(struct conch_state *st, const char *id, struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "DELETE FROM sandboxes WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    int changes = 0;
    if ((r = step_done(st, s, "delete sandbox", &changes, err)) < 0)
        return r;
    return changes ? 0 : not_found(err, "sandbox", id);
}

/* ---- layers (snapshots) ---- */

#define LAYER_COLS                                                                                 \
    "id, name, parent, workspace, sandbox, id_base, size, files, depth, created_at, spec_json"

void conch_state_layer_done(struct conch_state_layer *l)
{
    if (!l)
        return;
    free(l->spec_json);
    l->spec_json = NULL;
}

void conch_state_layer_free_list(struct conch_state_layer *list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        conch_state_layer_done(&list[i]);
    free(list);
}

static int layer_from_row(sqlite3_stmt *s, struct conch_state_layer *l)
{
    memset(l, 0, sizeof(*l));
    col_copy(s, 0, l->id, sizeof(l->id));
    col_copy(s, 1, l->name, sizeof(l->name));
    col_copy(s, 2, l->parent, sizeof(l->parent));
    col_copy(s, 3, l->workspace, sizeof(l->workspace));
    col_copy(s, 4, l->sandbox, sizeof(l->sandbox));
    l->id_base = (uint32_t)sqlite3_column_int64(s, 5);
    l->size = (uint64_t)sqlite3_column_int64(s, 6);
    l->files = (uint64_t)sqlite3_column_int64(s, 7);
    l->depth = (int)sqlite3_column_int64(s, 8);
    l->created_at = sqlite3_column_double(s, 9);
    return col_dup(s, 10, &l->spec_json) < 0 ? -ENOMEM : 0;
}

int conch_state_layer_put(struct conch_state *st, const struct conch_state_layer *l,
                          struct conch_err *err)
{
    if (!TERMINATED(l->id) || !TERMINATED(l->name) || !TERMINATED(l->parent) ||
        !TERMINATED(l->workspace) || !TERMINATED(l->sandbox) || !l->id[0])
        return conch_err_set(err, EINVAL, "record layer: an empty id or an unterminated field");
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st,
                    "INSERT INTO layers (" LAYER_COLS ") "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) "
                    "ON CONFLICT(id) DO UPDATE SET name = excluded.name, "
                    "parent = excluded.parent, workspace = excluded.workspace, "
                    "sandbox = excluded.sandbox, id_base = excluded.id_base, "
                    "size = excluded.size, files = excluded.files, depth = excluded.depth, "
                    "created_at = excluded.created_at, spec_json = excluded.spec_json",
                    &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, l->id);
    bind_text(s, 2, l->name);
    bind_text(s, 3, l->parent);
    bind_text(s, 4, l->workspace);
    bind_text(s, 5, l->sandbox);
    sqlite3_bind_int64(s, 6, l->id_base);
    sqlite3_bind_int64(s, 7, (sqlite3_int64)l->size);
    sqlite3_bind_int64(s, 8, (sqlite3_int64)l->files);
    sqlite3_bind_int64(s, 9, l->depth);
    sqlite3_bind_double(s, 10, l->created_at);
    if (l->spec_json)
        bind_text(s, 11, l->spec_json);
    else
        sqlite3_bind_null(s, 11);
    if ((r = step_done(st, s, "record layer", NULL, err)) < 0)
        return conch_err_wrap(err, "layer '%s'", l->id);
    return 0;
}

int conch_state_layer_list(struct conch_state *st, struct conch_state_layer **ret, size_t *ret_n,
                           struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "SELECT " LAYER_COLS " FROM layers ORDER BY created_at, id", &s, err);
    if (r < 0)
        return r;
    struct conch_state_layer *list = NULL;
    size_t n = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (grow((void **)&list, &cap, n, sizeof(*list)) < 0 || layer_from_row(s, &list[n]) < 0) {
            conch_state_layer_free_list(list, cap);
            return conch_err_set(err, ENOMEM, "list layers: out of memory");
        }
        n++;
    }
    if (rc != SQLITE_DONE) {
        conch_state_layer_free_list(list, cap);
        return sql_fail(st, rc, err, "list layers");
    }
    *ret = list;
    *ret_n = n;
    return 0;
}

int conch_state_layer_delete(struct conch_state *st, const char *id, struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "DELETE FROM layers WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    int changes = 0;
    if ((r = step_done(st, s, "delete layer", &changes, err)) < 0)
        return r;
    return changes ? 0 : not_found(err, "layer", id);
}

/* ---- jobs ---- */

#define JOB_COLS                                                                                   \
    "id, sandbox_id, command, pid, exit_code, signal, running, started_at, ended_at, "             \
    "stdout_spill, stderr_spill"

void conch_state_job_done(struct conch_state_job *job)
{
    if (!job)
        return;
    free(job->command);
    job->command = NULL;
}

void conch_state_job_free_list(struct conch_state_job *list, size_t n)
{
    for (size_t i = 0; list && i < n; i++)
        conch_state_job_done(&list[i]);
    free(list);
}

static int job_from_row(sqlite3_stmt *s, struct conch_state_job *job)
{
    memset(job, 0, sizeof(*job));
    col_copy(s, 0, job->id, sizeof(job->id));
    col_copy(s, 1, job->sandbox_id, sizeof(job->sandbox_id));
    if (col_dup(s, 2, &job->command) < 0)
        return -ENOMEM;
    job->pid = (pid_t)sqlite3_column_int64(s, 3);
    job->exit_code = sqlite3_column_int(s, 4);
    job->signal = sqlite3_column_int(s, 5);
    job->running = sqlite3_column_int(s, 6) != 0;
    job->started_at = sqlite3_column_double(s, 7);
    job->ended_at = sqlite3_column_double(s, 8);
    col_copy(s, 9, job->stdout_spill, sizeof(job->stdout_spill));
    col_copy(s, 10, job->stderr_spill, sizeof(job->stderr_spill));
    return 0;
}

int conch_state_job_put(struct conch_state *st, const struct conch_state_job *job,
                        struct conch_err *err)
{
    if (!TERMINATED(job->id) || !TERMINATED(job->sandbox_id) || !TERMINATED(job->stdout_spill) ||
        !TERMINATED(job->stderr_spill))
        return conch_err_set(err, EINVAL, "record job: a field is not NUL-terminated");
    if (!job->id[0])
        return conch_err_set(err, EINVAL, "record job: empty id");

    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st,
                    "INSERT INTO jobs (" JOB_COLS ") "
                    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) "
                    "ON CONFLICT(id) DO UPDATE SET sandbox_id = excluded.sandbox_id, "
                    "command = excluded.command, pid = excluded.pid, "
                    "exit_code = excluded.exit_code, signal = excluded.signal, "
                    "running = excluded.running, started_at = excluded.started_at, "
                    "ended_at = excluded.ended_at, stdout_spill = excluded.stdout_spill, "
                    "stderr_spill = excluded.stderr_spill",
                    &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, job->id);
    bind_text(s, 2, job->sandbox_id);
    bind_text(s, 3, job->command ? job->command : "");
    sqlite3_bind_int64(s, 4, job->pid);
    sqlite3_bind_int(s, 5, job->exit_code);
    sqlite3_bind_int(s, 6, job->signal);
    sqlite3_bind_int(s, 7, job->running ? 1 : 0);
    sqlite3_bind_double(s, 8, job->started_at);
    sqlite3_bind_double(s, 9, job->ended_at);
    bind_text(s, 10, job->stdout_spill);
    bind_text(s, 11, job->stderr_spill);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_CONSTRAINT_FOREIGNKEY)
        return conch_err_set(err, ENOENT, "record job '%s': sandbox '%s' is not recorded", job->id,
                             job->sandbox_id);
    if (rc != SQLITE_DONE) {
        sql_fail(st, rc, err, "record job");
        return conch_err_wrap(err, "job '%s'", job->id);
    }
    return 0;
}

int conch_state_job_get(struct conch_state *st, const char *id, struct conch_state_job *ret,
                        struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "SELECT " JOB_COLS " FROM jobs WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    int rc = sqlite3_step(s);
    if (rc == SQLITE_DONE)
        return not_found(err, "job", id);
    if (rc != SQLITE_ROW)
        return sql_fail(st, rc, err, "read job");
    struct conch_state_job job;
    if (job_from_row(s, &job) < 0)
        return conch_err_set(err, ENOMEM, "read job '%s': out of memory", id);
    *ret = job;
    return 0;
}

int conch_state_job_list(struct conch_state *st, const char *sandbox_id,
                         struct conch_state_job **ret, size_t *ret_n, struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    /* One statement for both cases: a NULL ?1 matches every sandbox. */
    int r = prepare(st,
                    "SELECT " JOB_COLS " FROM jobs WHERE ?1 IS NULL OR sandbox_id = ?1 "
                    "ORDER BY started_at, id",
                    &s, err);
    if (r < 0)
        return r;
    if (sandbox_id)
        bind_text(s, 1, sandbox_id);
    struct conch_state_job *list = NULL;
    size_t n = 0, cap = 0;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (grow((void **)&list, &cap, n, sizeof(*list)) < 0 || job_from_row(s, &list[n]) < 0) {
            conch_state_job_free_list(list, cap);
            return conch_err_set(err, ENOMEM, "list jobs: out of memory");
        }
        n++;
    }
    if (rc != SQLITE_DONE) {
        conch_state_job_free_list(list, cap);
        return sql_fail(st, rc, err, "list jobs");
    }
    *ret = list;
    *ret_n = n;
    return 0;
}

int conch_state_job_set_exit(struct conch_state *st, const char *id, int exit_code, int signal,
                             double ended_at, struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st,
                    "UPDATE jobs SET running = 0, exit_code = ?2, signal = ?3, ended_at = ?4 "
                    "WHERE id = ?1",
                    &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    sqlite3_bind_int(s, 2, exit_code);
    sqlite3_bind_int(s, 3, signal);
    sqlite3_bind_double(s, 4, ended_at);
    int changes = 0;
    if ((r = step_done(st, s, "record job exit", &changes, err)) < 0)
        return r;
    return changes ? 0 : not_found(err, "job", id);
}

int conch_state_job_delete(struct conch_state *st, const char *id, struct conch_err *err)
{
    LOCK_SCOPE(st);
    _cleanup_stmt_ sqlite3_stmt *s = NULL;
    int r = prepare(st, "DELETE FROM jobs WHERE id = ?1", &s, err);
    if (r < 0)
        return r;
    bind_text(s, 1, id);
    int changes = 0;
    if ((r = step_done(st, s, "delete job", &changes, err)) < 0)
        return r;
    return changes ? 0 : not_found(err, "job", id);
}
