/* run.h - running one command in a fresh sandbox from start to report: the jail, the
 * command (through the command driver, exec/command.h: stdio capture with caps and spill,
 * timeout with grace, limits classification), and the workspace changes (and their commit).
 * What `conch run` is built on. */
#ifndef CONCH_EXEC_RUN_H
#define CONCH_EXEC_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "core/error.h"
#include "exec/output.h"
#include "jail/jail.h"
#include "workspace/workspace.h"

/* What the command called through the tool bridge (conch run --tools). */
struct conch_run_tool_calls {
    json_t *calls;    /* owned: array of call records, in order of start; NULL: none */
    json_t *detached; /* owned: array of {call_id, task, type} (spawn_agent --detach) */
    char *summary;    /* owned: "[tools: 3 calls (a=2, b=1), 3 ok, 0 failed, 0.1 s]", or NULL */
};

/* conch_run_tool_calls_done - free what @t owns and zero it. */
void conch_run_tool_calls_done(struct conch_run_tool_calls *t);

/*
 * struct conch_run_tools - a server of the sandbox's tool bridge for the one command (conch
 * run --tools, cli/toolhost.c). exec knows it by these two operations alone, so it pulls in
 * neither the bridge nor an event loop.
 * @start: serve @listen_fd (taken over) while the command runs; 0 or -errno with @err.
 * @finish: the command ended, or the run failed: stop serving (calls in flight are
 *          cancelled) and fill *@ret with what the command called (zeroed when nothing).
 */
struct conch_run_tools {
    int (*start)(struct conch_run_tools *t, int listen_fd, struct conch_err *err);
    void (*finish)(struct conch_run_tools *t, struct conch_run_tool_calls *ret);
};

/*
 * struct conch_run_net - the proxy of a sandbox of the allow mode for the one command (conch
 * run --net allow, cli/nethost.c), known to exec by two operations, as the tools server.
 * @start: serve @listen_fd (the warden's listener inside the sandbox; taken over) while the
 *         command runs; 0 or -errno with @err.
 * @finish: the command ended, or the run failed: stop serving.
 */
struct conch_run_net {
    int (*start)(struct conch_run_net *n, int listen_fd, struct conch_err *err);
    void (*finish)(struct conch_run_net *n);
};

/* An overlay mount's outcome (conch run --mount type=overlay): its changes, read and
 * committed as the workspace's are (with --commit, when the command exited by itself). */
struct conch_run_mount_result {
    const char *target;                   /* borrowed from the opts' mounts */
    struct conch_ws_changes changes;      /* owned */
    bool has_changes;                     /* they were read */
    bool committed;                       /* its commit ran to its end */
    bool commit_tried;                    /* --commit, and the command exited normally */
    struct conch_ws_commit_report commit; /* owned */
    struct conch_err commit_err;          /* code != 0: its commit, or its scan, failed */
};

/* A store mount's write-back (conch run --mount type=store), when the command has ended. */
struct conch_run_store_result {
    const char *name, *target; /* borrowed from the opts' mounts */
    struct conch_store_report rep;
    struct conch_err err; /* code != 0: it failed (the store is as before it) */
};

struct conch_run_opts {
    struct conch_jail_spec jail;   /* the sandbox */
    char *const *argv;             /* the command; borrowed */
    char *const *env_extra;        /* "K=V" strings added to the clean environment; borrowed */
    const char *cwd;               /* inside the sandbox; NULL: /workspace */
    uint64_t timeout_ms;           /* 0: none */
    uint64_t grace_ms;             /* between SIGTERM and SIGKILL on timeout */
    size_t max_output;             /* bytes of each stream kept in memory */
    uint64_t max_spill;            /* bytes of each stream kept in its spill file */
    const char *spill_dir;         /* where spill files go */
    bool commit;                   /* apply workspace changes when the command exited */
    bool stream;                   /* copy output live to our stdout/stderr (head only) */
    int stdin_fd;                  /* passed to the command; borrowed */
    struct conch_run_tools *tools; /* --tools: serves the bridge; borrowed, or NULL */
    struct conch_run_net *net;     /* jail.net ALLOW: serves the proxy; borrowed; required */
    /* A running sandbox to use instead of building one (a daemon's, conch_cli_lease), made
     * from @jail but for its workspace: conch_exec_run takes it over and destroys it. */
    struct conch_jail *leased;
    /* Store mounts (in jail.mounts): the stores' databases (a daemon's <state>/stores, shared
     * with it) and a private dir where conch_exec_run makes their views (a dir of its own in
     * it, removed at the end); NULL: store mounts are refused. */
    const char *store_dir;
    const char *view_dir;
};

/* conch_run_opts_init - defaults: 1 MiB kept per stream, 64 MiB spill, 2 s grace. */
void conch_run_opts_init(struct conch_run_opts *o);

struct conch_run_result {
    int exit_code; /* shell style: N, or 128+signal */
    int signal;    /* 0 when it exited */
    bool timed_out;
    uint64_t duration_ms;
    struct conch_output out, err;         /* owned */
    struct conch_ws_changes changes;      /* owned */
    bool has_changes;                     /* overlay mode: changes were read */
    bool committed;                       /* the commit ran to its end */
    bool commit_tried;                    /* --commit, and the command exited normally */
    struct conch_ws_commit_report commit; /* owned: what the commit applied or skipped */
    struct conch_err commit_err;          /* the commit failed (code != 0): why */
    uint64_t cpu_ms;
    uint64_t max_rss_kb;
    enum conch_err_kind error_kind; /* CONCH_ERR_NONE when the command succeeded */
    char error_msg[512];
    bool not_started;          /* the program could not be executed (error_msg says why) */
    const char *tools_summary; /* borrowed: "[tools: ...]", a line of the text; NULL: none */
    struct conch_run_tool_calls tools; /* owned: the command's tool calls (--tools) */
    struct conch_run_mount_result mounts[CONCH_SPEC_MOUNTS_MAX]; /* overlay mounts, in order */
    unsigned n_mounts;
    struct conch_run_store_result stores[CONCH_SPEC_MOUNTS_MAX]; /* store mounts, in order */
    unsigned n_stores;
};

/*
 * conch_exec_run - run @o->argv in a new sandbox and fill *@res (caller calls
 * conch_run_result_done, also after a failure). Returns 0 when the command ran (whatever
 * its exit status: see res->error_kind), or -errno with @err when the sandbox could not be
 * built or driven (kind infrastructure) or the request was invalid (kind usage).
 */
int conch_exec_run(const struct conch_run_opts *o, struct conch_run_result *res,
                   struct conch_err *err);

/* conch_run_result_done - free what @res owns; safe on a zeroed result. */
void conch_run_result_done(struct conch_run_result *res);

/*
 * conch_exec_env_build - the clean environment of a command: PATH (with the tool bridge's
 * /run/conch/bin), PYTHONPATH (its module), HOME, USER, LOGNAME,
 * SHELL, LANG=C.UTF-8, TERM=dumb, NO_COLOR=1, PAGER=cat, GIT_PAGER=cat, with @net_proxy the
 * proxy's variables (conch_net_proxy_env), then @extra ("K=V",
 * later entries override earlier ones). Returns a new NULL-terminated array of new strings
 * (free with conch_exec_env_free), or NULL on a malformed entry / out of memory (@err).
 */
char **conch_exec_env_build(char *const *extra, bool as_root, bool net_proxy,
                            struct conch_err *err);
void conch_exec_env_free(char **env);

#endif
