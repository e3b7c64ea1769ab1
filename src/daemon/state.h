/* state.h - the daemon's SQLite state database: which sandboxes and jobs exist, so that a
 * daemon restarted after SIGKILL can reap what its predecessor left running and still list
 * (and let clients inspect) the sandboxes it had recorded. */
#ifndef CONCH_DAEMON_STATE_H
#define CONCH_DAEMON_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

/* The schema version this code writes (PRAGMA user_version). A database with a newer
 * version is refused; older ones are migrated forward on open. */
#define CONCH_STATE_SCHEMA_VERSION 2

/* An open database. Opaque; every function below is safe to call from several threads
 * (calls are serialised on an internal mutex). */
struct conch_state;

/*
 * conch_state_default_dir - the state directory: /var/lib/conch as root, else
 * $XDG_STATE_HOME/conch or ~/.local/state/conch. Written into @buf (@size bytes); the
 * database is "<dir>/state.db". Does not create anything. Returns 0, or -errno with @err.
 */
int conch_state_default_dir(char *buf, size_t size, struct conch_err *err);

/*
 * conch_state_open - open (creating if needed) the database at @path. Missing parent
 * directories are created with mode 0700 and a new database file with 0600. The connection
 * uses WAL journaling with synchronous=NORMAL (a committed write survives SIGKILL of the
 * process; a power loss may lose the last ones, never the database), a 5 s busy timeout
 * and enforced foreign keys; an older schema is migrated to CONCH_STATE_SCHEMA_VERSION in
 * one transaction (a current one is not written to at all). A database written by a newer conch is
 * refused with -EPROTONOSUPPORT and left untouched. On success *@ret is a new handle the
 * caller closes with conch_state_close. Returns 0, or -errno with @err.
 */
int conch_state_open(const char *path, struct conch_state **ret, struct conch_err *err);

/*
 * conch_state_set_busy_timeout - how long a statement waits for another process's lock
 * before failing with -EBUSY: @ms, 0 for not at all. The daemon sets 0: it runs on an event
 * loop that must never sleep, and as the database's only writer (conch_state_claim) it only
 * meets a lock held by a stray process, which then fails that one write instead of
 * stalling every client.
 */
void conch_state_set_busy_timeout(struct conch_state *st, int ms);

/*
 * conch_state_claim - make this process the database's one writer: an exclusive flock on the
 * database file, held until conch_state_close (readers such as `conch gc` are unaffected).
 * -EBUSY with a message naming the fix when another daemon holds it.
 */
int conch_state_claim(struct conch_state *st, struct conch_err *err);

/* conch_state_close - close @st and free it. NULL is fine. */
void conch_state_close(struct conch_state *st);

/* ---- sandboxes ---- */

/* One recorded sandbox. Fixed-size strings must be NUL-terminated within their arrays;
 * spec_json is owned by the record (conch_state_sandbox_done frees it) and may be NULL. */
struct conch_state_sandbox {
    char id[64];
    char name[128];       /* "" when unnamed */
    char workspace[4096]; /* host directory, "" for none */
    char mode[16];        /* "overlay" | "ro" | "rw" */
    char *spec_json;      /* owned; the create params, for re-display; NULL allowed */
    char state[16];       /* "running" | "stopped" */
    char upper_dir[4096]; /* overlay upper dir on disk, "" for none */
    pid_t warden_pid;     /* 0 when none */
    unsigned long long warden_starttime; /* field 22 of /proc/<pid>/stat (pid reuse guard) */
    double created_at, last_used_at;     /* seconds since the epoch */
    char layer[64]; /* the snapshot (frozen layer) its workspace is stacked on; "" for none */
};

/* conch_state_sandbox_done - free @sb's owned fields (spec_json). NULL is fine. */
void conch_state_sandbox_done(struct conch_state_sandbox *sb);

/* conch_state_sandbox_free_list - _done every record of @list (@n of them), then free it. */
void conch_state_sandbox_free_list(struct conch_state_sandbox *list, size_t n);

/*
 * conch_state_sandbox_put - insert @sb, or update every field of the record with the same
 * id (its jobs are kept). @sb is borrowed. -EINVAL if a string is not terminated within
 * its array, the id is empty or the state is neither "running" nor "stopped".
 */
int conch_state_sandbox_put(struct conch_state *st, const struct conch_state_sandbox *sb,
                            struct conch_err *err);

/*
 * conch_state_sandbox_get - fill *@ret with the record @id (caller _done's it).
 * Returns 0, -ENOENT when there is no such record, or another -errno; @err is filled
 * in every failure case.
 */
int conch_state_sandbox_get(struct conch_state *st, const char *id, struct conch_state_sandbox *ret,
                            struct conch_err *err);

/*
 * conch_state_sandbox_list - every record, oldest first (created_at, then id), as a new
 * array *@ret of *@ret_n records (NULL and 0 when empty); free with
 * conch_state_sandbox_free_list.
 */
int conch_state_sandbox_list(struct conch_state *st, struct conch_state_sandbox **ret,
                             size_t *ret_n, struct conch_err *err);

/* conch_state_sandbox_set_state - set the state of @id ("running" | "stopped").
 * -ENOENT when absent, -EINVAL for another state. */
int conch_state_sandbox_set_state(struct conch_state *st, const char *id, const char *state,
                                  struct conch_err *err);

/* conch_state_sandbox_touch - set last_used_at of @id. -ENOENT when absent. */
int conch_state_sandbox_touch(struct conch_state *st, const char *id, double last_used_at,
                              struct conch_err *err);

/*
 * conch_state_sandbox_mark_stopped - in one transaction: set @id "stopped" and end each of
 * its running jobs as killed (running false, exit_code -1, signal 9, ended_at @now).
 * -ENOENT when absent. Used after the sandbox's processes were killed.
 */
int conch_state_sandbox_mark_stopped(struct conch_state *st, const char *id, double now,
                                     struct conch_err *err);

/* conch_state_sandbox_delete - delete @id and (ON DELETE CASCADE) its jobs.
 * -ENOENT when absent. */
int conch_state_sandbox_delete(struct conch_state *st, const char *id, struct conch_err *err);

/* ---- layers (snapshots) ---- */

/* One frozen layer of the layer store (workspace/layers.c): a snapshot. spec_json is owned
 * (conch_state_layer_done frees it) and may be NULL. */
struct conch_state_layer {
    char id[64];
    char name[128];       /* "" when unnamed */
    char parent[64];      /* the layer it is stacked on; "" for the workspace itself */
    char workspace[4096]; /* the host dir at the bottom of its stack */
    char sandbox[64];     /* the sandbox it was taken of */
    uint32_t id_base;     /* as host root: the host id block its files belong to; 0 otherwise */
    uint64_t size, files; /* allocated bytes and entries (conch_ws_layer_measure) */
    int depth;            /* layers in its stack, itself included */
    double created_at;
    char *spec_json; /* owned: the sandbox's spec, for a fork once that sandbox is gone */
};

/* conch_state_layer_done - free @l's owned fields. NULL is fine. */
void conch_state_layer_done(struct conch_state_layer *l);
/* conch_state_layer_free_list - _done every record of @list (@n), then free it. */
void conch_state_layer_free_list(struct conch_state_layer *list, size_t n);
/* conch_state_layer_put - insert @l or update the record with its id. @l borrowed. */
int conch_state_layer_put(struct conch_state *st, const struct conch_state_layer *l,
                          struct conch_err *err);
/* conch_state_layer_list - every layer, oldest first, as a new array (free with
 * conch_state_layer_free_list). */
int conch_state_layer_list(struct conch_state *st, struct conch_state_layer **ret, size_t *ret_n,
                           struct conch_err *err);
/* conch_state_layer_delete - delete the record @id. -ENOENT when absent. */
int conch_state_layer_delete(struct conch_state *st, const char *id, struct conch_err *err);

/* ---- jobs ---- */

/* One recorded background job. command is owned (conch_state_job_done frees it). */
struct conch_state_job {
    char id[64];
    char sandbox_id[64]; /* must name a recorded sandbox */
    char *command;       /* owned; NULL is stored as "" */
    pid_t pid;
    int exit_code; /* -1 unknown */
    int signal;    /* 0 none */
    bool running;
    double started_at, ended_at;
    char stdout_spill[4096], stderr_spill[4096]; /* spill file paths, "" for none */
};

/* conch_state_job_done - free @job's owned fields (command). NULL is fine. */
void conch_state_job_done(struct conch_state_job *job);

/* conch_state_job_free_list - _done every record of @list (@n of them), then free it. */
void conch_state_job_free_list(struct conch_state_job *list, size_t n);

/*
 * conch_state_job_put - insert @job or update the record with the same id. @job is
 * borrowed. -ENOENT (with @err naming it) when its sandbox is not recorded; -EINVAL for an
 * unterminated string or an empty id.
 */
int conch_state_job_put(struct conch_state *st, const struct conch_state_job *job,
                        struct conch_err *err);

/* conch_state_job_get - fill *@ret with the job @id (caller _done's it); -ENOENT when
 * absent. */
int conch_state_job_get(struct conch_state *st, const char *id, struct conch_state_job *ret,
                        struct conch_err *err);

/*
 * conch_state_job_list - the jobs of @sandbox_id (NULL: of every sandbox), oldest first
 * (started_at, then id), as a new array *@ret of *@ret_n (NULL and 0 when empty); free
 * with conch_state_job_free_list.
 */
int conch_state_job_list(struct conch_state *st, const char *sandbox_id,
                         struct conch_state_job **ret, size_t *ret_n, struct conch_err *err);

/* conch_state_job_set_exit - record that @id ended: running false, @exit_code (-1 unknown),
 * @signal (0 none), @ended_at. -ENOENT when absent. */
int conch_state_job_set_exit(struct conch_state *st, const char *id, int exit_code, int signal,
                             double ended_at, struct conch_err *err);

/* conch_state_job_delete - delete the job @id. -ENOENT when absent. */
int conch_state_job_delete(struct conch_state *st, const char *id, struct conch_err *err);

#endif
