/* daemon-internal.h - the daemon's objects: clients, sandboxes, running commands and jobs.
 * Shared by the daemon's files (server.c, methods.c, lifecycle.c, sandboxes.c, pool.c,
 * commands.c, files.c...). Loop-owned: these objects are touched only on the libuv loop's
 * thread; work sent to the threadpool (scans, diffs, measurements, teardowns, large results)
 * gets copies or a hold (conch_daemon_sandbox_hold). Nothing is forked from the daemon: a
 * warden is a new image (jail/, "A daemon's wardens start from a clean image"). */
#ifndef CONCH_DAEMON_INTERNAL_H
#define CONCH_DAEMON_INTERNAL_H

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <uv.h>

#include "daemon/daemon.h"
#include "daemon/lifecycle.h"
#include "daemon/state.h"
#include "daemon/statedir.h"
#include "exec/command.h"
#include "exec/output.h"
#include "fs/fs.h"
#include "jail/jail.h"
#include "rpc/rpc.h"
#include "bridge/bridge.h"
#include "core/list.h"
#include "core/strbuf.h"
#include "super/super.h"
#include "workspace/workspace.h"

struct daemon;

/* The most a client may ask exec.run / job.start to keep in memory per stream (max_output). */
#define CONCH_MAX_OUTPUT (64.0 * 1024 * 1024)

struct client {
    struct conch_list link;
    struct daemon *d;
    uv_pipe_t in;  /* the socket, or stdin */
    uv_pipe_t out; /* stdout (--stdio only) */
    bool stdio;
    bool closing;
    uid_t peer_uid; /* SO_PEERCRED's uid; --stdio: ours (whoever started us runs as us) */
    /* connection.auth (tenants.c): once @authed, the connection is @tenant's for the rest of
     * its life, restricted to what a tenant may reach (an @admin sees every tenant's). */
    bool authed, admin;
    char tenant[65];
    unsigned char token_digest[32]; /* the token it authenticated with (SHA-256) */
    struct conch_rpc_framer framer;
    struct conch_rpc_sink *sink;
    int refs; /* handles still open */
    /* Output buffer limits (redis's client-output-buffer-limit), on the bytes of responses
     * libuv holds because the kernel has not taken them (uv_stream_get_write_queue_size). */
    bool congested;                  /* queued went past the soft limit and has not drained yet */
    size_t counted;                  /* its queued bytes, as counted in daemon.clients_queued */
    struct conch_list drain_waiters; /* struct sink_waiter, called when no longer congested */
    /* The tool bridge: calls delivered to this client (tool.call, agent.spawn) awaiting its
     * response (struct out_call, tools.c), and the id of the last one sent. */
    struct conch_list out_calls;
    json_int_t next_out_id;
    /* Lines sent during this loop iteration, gathered (each smaller than
     * CLIENT_COALESCE_MAX) and written at its end by @flush, in one write: 100 tool.call
     * requests of a Promise.all reach the client in one read. Counted as queued. */
    struct conch_sb pend;
    uv_check_t flush;
};

/* Lines of at least this many bytes are written at once, not copied into client.pend (what
 * was gathered before goes first). */
#define CLIENT_COALESCE_MAX (64u << 10)

/* conch_daemon_client_flush - write @c's gathered lines now (before a send that bypasses
 * libuv, which must come after them). */
void conch_daemon_client_flush(struct client *c);

/* Past the soft limit a client is congested: whoever produces output for it (a command's
 * pipes) should stop reading until it drains. Past the hard limit it is disconnected: its
 * pending responses are dropped; its commands go on as for any client that went away. One
 * response larger than the hard limit is still sent when nothing else is queued. */
#define CLIENT_OUTPUT_SOFT (8u << 20)
#define CLIENT_OUTPUT_HARD (64u << 20)

/*
 * struct sink_waiter - a callback for when a congested client drains (or goes away).
 * Caller-allocated (embed it); zero it before first use.
 */
struct sink_waiter {
    struct conch_list link;
    bool armed;
    void (*cb)(struct sink_waiter *w); /* runs once; @w is disarmed before the call */
};

struct sandbox {
    struct conch_list link;
    struct daemon *d;
    char id[64];
    char name[128];
    /* The tenant that created it (connection.auth; recorded in its spec); "": the socket's
     * owner. A tenant's connection sees only its own (tenants.c). */
    char tenant[65];
    /* Where it is in its life: changed only by conch_sb_set_state, which checks the edge
     * and does what entering and leaving a state means (lifecycle.c). */
    enum sandbox_state state;
    /* Its kind, which no transition changes but recycling (made as new, it is the pool's
     * again): `fresh`, it goes when its one command (or lease) ends; `from_pool`, a fresh
     * one taken from the pool, which is recycled into it when the pool has room. */
    bool fresh, from_pool;
    /* A fork made of a pool sandbox (forkpool.c): a fact shown by sandbox.get ("from_pool"). */
    bool pool_fork;
    /* sandbox.lease: the asking client's call while LEASING; its sink (a reference) while
     * LEASING and LENT. The borrower drives the warden through a channel of its own
     * (conch_jail_hand_over), revoked when the sandbox is made as new. */
    struct conch_rpc_call *lease_call;
    struct conch_rpc_sink *lease_sink;
    /* In the state database (pool sandboxes are not): a fact about the database, which
     * the transitions read to keep it true, not a state. */
    bool recorded;
    /* A teardown parameter set before STOPPING at shutdown: the record and the directory
     * stay (the next daemon lists the sandbox as stopped). */
    bool keep_dir;
    struct conch_jail *jail;  /* the warden, owned; non-NULL while one is up */
    struct conch_super super; /* drives jail's warden while it is up */
    /* The request whose answer the warden owes (the setup while BUILDING, the recycle while
     * RECYCLING, the attach while LEASING): routed by the supervisor to conch_sb_answered. */
    struct conch_super_req answer;
    /* As root: the sandbox's host id block, held from its first start until it is freed, so
     * that a restart (discard) finds its upper dir's files owned by its own ids. */
    struct conch_jail_ids ids;
    uv_poll_t *ctl_poll; /* owned; freed when its close completes */
    uv_timer_t *sample;  /* owned: disk, and memory/pids when no cgroup enforces them */
    unsigned samples;
    uv_timer_t
        idle; /* armed by conch_daemon_sandbox_touch when idle_timeout > 0; stopped at STOPPING */
    double idle_timeout;
    /* the spec, kept to rebuild the sandbox (discard) */
    char workspace[PATH_MAX]; /* "" for none */
    dev_t ws_dev;             /* the workspace dir's identity at creation: a dir swapped in */
    ino_t ws_ino;             /* its place later is refused, not followed */
    enum conch_ws_mode mode;
    char rootfs[PATH_MAX];
    bool as_root;
    struct conch_cgroup_limits limits;
    uint64_t tmp_bytes;
    uint64_t disk_bytes;        /* what the workspace's upper dir may hold */
    json_t *env;                /* object of extra environment; owned */
    char upper_dir[PATH_MAX];   /* holds upper/, work/ and m<i>/; "": no overlay */
    char layer[64];             /* the snapshot its workspace is stacked on (snapshots.c); "" */
    struct conch_mount *mounts; /* its extra mounts (owned), n_mounts of them */
    unsigned n_mounts;
    /* Its overlay mounts' source dirs' identities at creation (recorded; by mount index): a
     * dir swapped in their place later is refused a commit, not followed. 0 for others. */
    dev_t mount_dev[CONCH_SPEC_MOUNTS_MAX];
    ino_t mount_ino[CONCH_SPEC_MOUNTS_MAX];
    /* The views of its store mounts (stores.c; owned), by mount index; NULL for others. */
    struct conch_store_view *store_views[CONCH_SPEC_MOUNTS_MAX];
    struct conch_path_rule *rules; /* its path rules (owned), n_rules of them */
    unsigned n_rules;
    bool rules_unreadable; /* its record's rules did not parse: it is not started without them */
    struct conch_socket *sockets; /* host sockets passed in (owned), n_sockets of them */
    unsigned n_sockets;
    char spill_dir[PATH_MAX]; /* <state>/sandboxes/<id>/spill once created; "" before */
    /* Work off the loop (workspace.*, disk measurement, teardown) holds the sandbox: its
     * memory and its directory stay until the last hold is released. */
    unsigned holds;
    void (*gone)(void *arg); /* conch_daemon_sandbox_destroy_then's callback */
    void *gone_arg;
    bool measuring;           /* a disk measurement is running in a worker */
    bool disk_over;           /* the last measurement found more than disk_bytes */
    uint64_t disk_charged;    /* what the last measurement charged (0 after a discard) */
    uint64_t copied_total;    /* the room of every copy_in ended, a running total */
    bool measure_wanted;      /* a command or write ended: measure when the throttle allows */
    uint64_t next_measure_ms; /* the next measurement not before this (monotonic ms) */
    struct conch_list ws_ops; /* struct ws_op waiting for their turn: one runs at a time */
    bool ws_running;
    double created_at, last_used_at;
    unsigned commands;
    struct conch_list runs;      /* struct run: exec.run and jobs not finished yet */
    struct conch_list done_jobs; /* struct run: finished jobs, output still readable */
    struct conch_list files;     /* struct file_req in flight */
    struct file_pool *file_pool; /* persistent file workers (fileworkers.c); NULL: none yet */
    struct js_sessions *js;      /* its JS sessions (js.c); NULL: none yet */
    struct conch_bridge *bridge; /* the tool bridge (owned; keeps its tools across restarts) */
    /* What the daemon holds for this sandbox (draws on d->held_budget): its tool bridge's
     * bytes (the bridge's budget draws on this one), its file answers being read and checked,
     * its sessions' scrollback and pending keys. Whatever holds a charge holds the sandbox
     * too (conch_daemon_sandbox_hold), so that this outlives every charge. */
    struct conch_budget held;
    double tool_timeout; /* its limits (0: the bridge's defaults) */
    unsigned max_tool_calls;
    /* Its network (network.c): the policy (owned), the allow mode's proxy while its warden is
     * up (owned), and the log of attempts, a ring of CONCH_NET_LOG_MAX (owned, charged to
     * @held once made). */
    struct conch_net_policy net;
    struct conch_net_proxy *proxy;
    struct conch_net_record *net_log;
    size_t net_log_next;  /* where the next record goes */
    uint64_t net_records; /* made since the sandbox was created */
};

struct run {
    struct conch_list link;  /* in sandbox->runs, then sandbox->done_jobs (jobs) */
    struct conch_list dlink; /* in daemon->jobs (jobs only) */
    struct sandbox *sb;
    /* The command driver (exec/command.h): its pipes, output captures, final event and
     * classification; commands.c is its libuv adapter. */
    struct conch_command cmd;
    bool is_job;
    char job_id[32];
    char *command;
    const char *shell; /* static: the shell the command runs with ("/bin/bash", "/bin/sh") */
    struct conch_rpc_call *call;   /* exec.run: answered when done */
    struct conch_rpc_sink *notify; /* where exec.output / job.exited go (a reference) */
    json_t *request_id;            /* of the exec.run, for exec.output notifications */
    bool stream;
    uv_poll_t polls[2];        /* the command's output pipes, as its driver asks (ops->watch) */
    unsigned polls_open;       /* a bit per stream: polls[stream] is initialised, not closed */
    bool finished;             /* the driver finished it (or it was dropped before it started) */
    bool forgetting;           /* conch_daemon_run_forget runs: its callbacks must not free it */
    int handles;               /* libuv handles still open */
    bool scanning;             /* a worker lists the workspace's changes for the result */
    bool answering;            /* a worker builds the result (large output) */
    bool no_changes;           /* exec.run "changes": false: the result lists none (no scan) */
    bool syncing;              /* its store mounts are being written back (stores.c) */
    bool orphaned;             /* its sandbox went while they were: no result but a failure */
    json_t *stores;            /* what the write-back did (owned), or NULL */
    struct sink_waiter drain;  /* armed while the client is congested: pipes not read */
    struct conch_list waiters; /* struct job_wait */
    double started_at;
    char origin_id[32];               /* who its tool calls come from: "exec-…" or the job id */
    struct conch_bridge_report tools; /* its tool calls, once ended (owned) */
};

struct job_wait {
    struct conch_list link;
    struct run *job;
    struct conch_rpc_call *call;
    uv_timer_t timer;
};

/* An fs.* request served by a worker forked for it. Freed once its pipe is closed and its
 * worker's final event has come. */
struct file_req {
    struct conch_list link; /* in sandbox->files while its pipe is open */
    struct sandbox *sb;
    struct conch_rpc_call *call;
    uv_pipe_t pipe;
    char *buf;
    size_t len, cap;  /* bytes read, allocated */
    uint64_t charged; /* charged to sb->held: what was read and the room given to the next read */
    bool over_budget; /* the answer outgrew the sandbox's budget: failed with `limit` */
    char over_why[512];
    bool closed;               /* the pipe is closing: out of sandbox->files */
    bool pipe_closed;          /* its close completed */
    bool measure;              /* a write or delete: measure the sandbox's disk use after it */
    bool frees;                /* a delete */
    bool copy;                 /* fs.copy_in / fs.copy_out: a host file lent to the worker */
    uint64_t reserve;          /* fs.copy_in: the disk room held for it while it runs */
    struct conch_proc proc;    /* the worker: the supervisor's until its final event */
    struct conch_proc_end end; /* that event, once it came */
};

struct daemon {
    uv_loop_t loop;
    struct conch_daemon_opts opts;
    char state_dir[PATH_MAX];
    char socket_path[PATH_MAX];
    char spill_dir[PATH_MAX + 16];
    struct conch_state *state;
    uv_pipe_t listener;
    bool listening;
    bool activated; /* the listener came from systemd (LISTEN_FDS): not ours to unlink */
    uv_signal_t sigchld, sigterm, sigint;
    uv_timer_t pool_timer;
    /* Active while a client's gathered lines wait for their flush (client.flush, a check
     * handle, run after the loop's poll): an active idle handle makes that poll return at
     * once. Without it, a line sent from a timer's callback (session_busy after its wait, a
     * job.wait's timeout) waited for the next event, which a sandbox's sampling timer used to
     * provide every 50 ms. */
    uv_idle_t flush_kick;
    bool flush_kick_ran; /* its callback ran once since started: a second time, it stops */
    struct conch_list clients;
    struct conch_list sandboxes;
    struct conch_list jobs;
    unsigned n_sandboxes;
    unsigned n_pooled; /* sandboxes BUILDING, POOLED or RECYCLING (kept by conch_sb_set_state) */
    uint64_t next_id;
    bool stopping;
    struct rlimit nofile_orig;    /* RLIMIT_NOFILE before the daemon raised it; 0s if not */
    unsigned holds;               /* sandbox holds of work in flight, all sandboxes together */
    bool ptc_warned;              /* said once that the tool-bridge clients are missing */
    bool private_state;           /* --stdio without --state-dir: state_dir is ours alone */
    uv_shutdown_t stdio_shutdown; /* --stdio: flushing stdout after stdin closed */
    /* What sandboxes and clients make the daemon hold, all together: each sandbox's budget
     * (sandbox->held) draws on held_budget; every command's output kept in memory (exec.run's
     * head and tail, session.run's) is charged to output_budget. */
    struct conch_budget held_budget, output_budget;
    /* Bytes of responses queued for clients, all together (struct client.counted summed):
     * held to opts.max_client_output_memory by disconnecting the clients with the most. */
    uint64_t clients_queued;
    /* What the answers being built off the loop hold (commands.c), counted with
     * clients_queued: an answer is built into a response, so the two are one budget. Answers
     * that do not fit wait in answers_waiting, first come first built. */
    uint64_t answers_building;
    struct conch_list answers_waiting;
    /* Tenants (tenants.c): the --tokens table (owned; NULL: no tenants), SIGHUP reloading it,
     * the failed authentications by peer, and the client whose request is being dispatched
     * (NULL outside a dispatch): the lookups see what it may see. */
    struct conch_tokens *tokens;
    uv_signal_t sighup;
    struct conch_list auth_fails;
    unsigned n_auth_fails;
    struct client *viewer;
};

/* server.c */
/*
 * conch_daemon_answer_reserve - charge @bytes (what an answer being built off the loop holds
 * at its peak) to the clients' output budget (--max-client-output-memory), which the response
 * it becomes will be charged to. Refused (false: the caller waits for a build to end) when
 * other answers are being built and all of it together would pass the budget; never refused
 * while none is, so that every answer is built in the end. A client that does not read and
 * holds what the budget needs is disconnected, as for its responses.
 */
bool conch_daemon_answer_reserve(struct daemon *d, size_t bytes);
/* conch_daemon_answer_unreserve - give back what conch_daemon_answer_reserve charged. */
void conch_daemon_answer_unreserve(struct daemon *d, size_t bytes);
double conch_daemon_now(void);
uint64_t conch_daemon_now_ms(void);
void conch_daemon_make_id(struct daemon *d, const char *prefix, char *buf, size_t size);
void conch_daemon_client_notify(struct conch_rpc_sink *sink, const char *method, json_t *params);
/* conch_daemon_client_sink_congested - true while the client behind @sink has more than
 * CLIENT_OUTPUT_SOFT bytes of responses unread. A closed sink (client gone) is never
 * congested: its output is dropped, so reading may go on. */
bool conch_daemon_client_sink_congested(struct conch_rpc_sink *sink);
/*
 * conch_daemon_client_sink_wait_drain - call @w->cb (set by the caller) once the client behind
 * @sink is no longer congested, or is disconnected. Returns false without arming @w when it is not
 * congested now (the caller goes on at once). @w must stay valid until it fires or is
 * cancelled; arming an armed waiter is a no-op. @w->cb may run from inside a send to that
 * client (any reply, when the client is disconnected for its hard limit) or from a write
 * completion: it should only resume work (uv_read_start), not free what the caller holds.
 */
bool conch_daemon_client_sink_wait_drain(struct conch_rpc_sink *sink, struct sink_waiter *w);
/* conch_daemon_client_sink_wait_cancel - disarm @w (no-op when not armed). */
void conch_daemon_client_sink_wait_cancel(struct sink_waiter *w);

/* Where fs.* shows a sandbox's spill files (read-only, served from its spill dir). */
#define CONCH_SPILL_SHOWN_DIR "/run/conch/output"

/* lifecycle.c: the sandbox's state machine (lifecycle.h) and its warden's control socket */
/*
 * conch_sb_set_state - move @sb to @to and do what leaving its state and entering @to mean:
 * the control socket's poll on or off, the bridge listening or refusing, the pool's count,
 * the idle timer, the state database, a lease's call and sink, and for RESTARTING, STOPPED
 * and STOPPING ending what runs in it (@why: the reason its commands and requests get;
 * NULL for other edges). The state changes first, so that callbacks run by the side effects
 * see the new one. An edge not in the table (conch_sb_edge_ok) is a bug: logged as an error,
 * and in debug and sanitizer builds the daemon aborts.
 */
void conch_sb_set_state(struct sandbox *sb, enum sandbox_state to, const char *why);
/* sandbox_in_pool - @sb is the pool's: BUILDING, POOLED or RECYCLING. */
static inline bool sandbox_in_pool(const struct sandbox *sb)
{
    return sb->state == SB_BUILDING || sb->state == SB_POOLED || sb->state == SB_RECYCLING;
}
/* sandbox_destroyed - @sb is being destroyed or gone (STOPPING or GONE). */
static inline bool sandbox_destroyed(const struct sandbox *sb)
{
    return sb->state == SB_STOPPING || sb->state == SB_GONE;
}
/* conch_sb_spawn - start @sb's warden (NEW or RESTARTING): @async (the pool's), in the
 * background (-> BUILDING; the setup's outcome arrives on the control socket); otherwise
 * set up before it returns (-> READY). Returns 0, or -errno with @err and the state as it
 * was. */
int conch_sb_spawn(struct sandbox *sb, bool async, struct conch_err *err);
/* conch_daemon_sandbox_resume - sandbox.start: a STOPPED sandbox (its warden died, or a previous
 * daemon's) started again over its recorded spec, limits, host ids and changes (STOPPED ->
 * READY); a READY one is left as it is. Returns 0, or -errno with @err (it stays STOPPED). */
int conch_daemon_sandbox_resume(struct sandbox *sb, struct conch_err *err);
/* conch_daemon_sandbox_start - conch_sb_spawn, not async; a RESTARTING one that fails is STOPPED.
 */
int conch_daemon_sandbox_start(struct sandbox *sb, struct conch_err *err);
/* conch_daemon_sandbox_stop - READY -> RESTARTING (workspace.discard): what runs in it ends (@why)
 * and its warden is gone when it returns; conch_daemon_sandbox_start brings it back. */
void conch_daemon_sandbox_stop(struct sandbox *sb, const char *why);
/* conch_daemon_sandbox_warden_gone - @sb's warden died: a named sandbox is STOPPED; a `fresh` or
 * the pool's is destroyed. */
void conch_daemon_sandbox_warden_gone(struct sandbox *sb);
/* conch_daemon_sandbox_hold / conch_daemon_sandbox_release - keep @sb's memory and directory while
 * work on it runs in a worker thread; a GONE sandbox is freed (and its directory removed) by the
 * last release. Loop thread only. */
void conch_daemon_sandbox_hold(struct sandbox *sb);
void conch_daemon_sandbox_release(struct sandbox *sb);

/* sandboxes.c */
struct sandbox_spec {
    const char *workspace;
    enum conch_ws_mode mode;
    const char *rootfs;
    bool as_root;
    struct conch_cgroup_limits limits;
    uint64_t tmp_bytes;
    uint64_t disk_bytes;
    json_t *env; /* borrowed */
    double idle_timeout;
    const char *name;
    double tool_timeout;         /* seconds a tool call may take; 0: the bridge's default */
    unsigned max_tool_calls;     /* per command; 0: the bridge's default */
    const char *layer;           /* the snapshot to stack the workspace on (a fork); NULL: none */
    json_t *mounts;              /* sandbox.create's "mounts" (borrowed), or NULL */
    json_t *readonly, *hidden;   /* sandbox.create's path rules (borrowed), or NULL */
    json_t *sockets;             /* sandbox.create's "sockets" (borrowed), or NULL */
    struct conch_net_policy net; /* owned by the caller (conch_net_policy_done) */
    const char *tenant;          /* its tenant (a fork's: its source's); NULL: the viewer's */
};
/* ---- network.c: the network policy, proxy and log of a sandbox ---- */
/* conch_daemon_net_listen - a sandbox of the allow mode whose warden just set up: its proxy
 * accepts on the listener the warden made. Logged when it fails (commands then reach nothing). */
void conch_daemon_net_listen(struct sandbox *sb);
/* conch_daemon_net_stop - the warden went: the proxy and its connections go (records made). */
void conch_daemon_net_stop(struct sandbox *sb);
/* conch_daemon_net_from_record - the network policy a sandbox's record (@spec: "net",
 * "allow", "deny" as conch_daemon_net_json writes them) names, into *@ret (initialised here;
 * the caller's, conch_net_policy_done). A record it cannot read gives no network (none),
 * never more; @id names the sandbox in the log. */
void conch_daemon_net_from_record(const char *id, json_t *spec, struct conch_net_policy *ret);
/* conch_daemon_net_free - drop the policy and the log (the sandbox is freed). */
void conch_daemon_net_free(struct sandbox *sb);
/* conch_daemon_net_json - {"net": mode, "allow": [...], "deny": [...]} of @sb into @o. */
void conch_daemon_net_json(const struct sandbox *sb, json_t *o);
/* conch_daemon_net_result - the network part of a command's result into @o: "network":
 * "host" for the host mode; for the allow mode an array of the attempts made since
 * @since (wall clock, seconds): finished ones and those still open, at most
 * CONCH_NET_RESULT_MAX (then "network_dropped": N). Nothing for the none mode. */
void conch_daemon_net_result(struct sandbox *sb, double since, json_t *o);
#define CONCH_NET_RESULT_MAX 100
void conch_daemon_handle_network_log(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_network_set(struct conch_rpc_call *call, json_t *params, void *ctx);

/* ---- jobs (commands.c runs them; jobs.c reads them) ---- */
/* conch_daemon_job_find - the job @params' "job_id" names, or NULL with @call failed
 * (job_not_found). */
struct run *conch_daemon_job_find(struct daemon *d, struct conch_rpc_call *call, json_t *params);
/* conch_daemon_job_status_json - a new object: running, exit_code, signal, lost?, tools... */
json_t *conch_daemon_job_status_json(struct run *r);

/* ---- stores (stores.c) ---- */
/* conch_daemon_stores_any - @sb has a store mount. */
bool conch_daemon_stores_any(const struct sandbox *sb);
/* conch_daemon_stores_prepare - before @sb's warden starts: each store mount's view made (on
 * the first start) and filled from its store, its source set to the view's dir. On the loop:
 * a store's size is capped (CONCH_STORE_TOTAL_MAX). Returns 0 or -errno with @err. */
int conch_daemon_stores_prepare(struct sandbox *sb, struct conch_err *err);
/* conch_daemon_stores_free - free @sb's views (at its end). */
void conch_daemon_stores_free(struct sandbox *sb);
/* conch_daemon_stores_sync - write @sb's store views back in a worker (holding @sb), then
 * @done(@arg, report) on the loop with a new array, one object per store mount ({name,
 * target, written, deleted, pulled, skipped, refused, first_skipped?, error?}), which @done
 * takes. Returns 0 (queued), 1 (no store mount: @done is not called) or -errno. */
int conch_daemon_stores_sync(struct sandbox *sb, void (*done)(void *arg, json_t *report),
                             void *arg);
void conch_daemon_handle_store_list(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_store_ls(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_store_read(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_store_write(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_store_delete(struct conch_rpc_call *call, json_t *params, void *ctx);

/* conch_sb_new - a NEW sandbox with a new id, in the registry (d->sandboxes); NULL when out
 * of memory. */
struct sandbox *conch_sb_new(struct daemon *d);
/* conch_daemon_sandbox_budget_label - name @sb's budget (sb->held) after its id, which a
 * recycle changes; a budget that holds nothing is (re)initialised. */
void conch_daemon_sandbox_budget_label(struct sandbox *sb);
int conch_daemon_sandbox_create(struct daemon *d, const struct sandbox_spec *spec,
                                struct sandbox **ret, struct conch_err *err);
/* conch_daemon_sandbox_record - write @sb's record (its state, spec and snapshot) now. */
int conch_daemon_sandbox_record(struct sandbox *sb, struct conch_err *err);
/* conch_daemon_sandbox_spec_json - what sandbox.start needs to bring @sb back (its limits, its
 * host id block...), as recorded: a new object. */
json_t *conch_daemon_sandbox_spec_json(const struct sandbox *sb);

/* ---- snapshots (snapshots.c): frozen layers of a workspace, in <state>/layers ---- */
/* conch_daemon_layer_stack - the frozen layers @top and those it is stacked on, top first, as
 * a jail wants them: *@ret_layers (a new array, its paths inside the same allocation; free()
 * it) of *@ret_n. Refuses a broken chain or one deeper than CONCH_JAIL_MAX_LAYERS. */
int conch_daemon_layer_stack(struct daemon *d, const char *top,
                             struct conch_jail_layer **ret_layers, int *ret_n,
                             struct conch_err *err);
/* conch_daemon_snapshot_chain_at - where the snapshot @key (id or name) is in the chain of
 * layers from @top down (0: @top itself), the chain of sandbox @sb_id, of tenant @tenant.
 * -EINVAL (kind usage, a message naming the snapshot) when there is no such snapshot or it is
 * not in the chain; another tenant's snapshot is answered as one that does not exist. */
int conch_daemon_snapshot_chain_at(struct daemon *d, const char *sb_id, const char *tenant,
                                   const char *top, const char *key, struct conch_err *err);
/* The workspace requests that restart the sandbox, run on the loop by files.c in @sb's queue of
 * workspace requests (one at a time). Each returns its result (a new object) or NULL with
 * @err (EBUSY: commands, jobs or sessions run and @params has no force). */
json_t *conch_daemon_snapshot_take(struct sandbox *sb, json_t *params, struct conch_err *err);
json_t *conch_daemon_snapshot_restore(struct sandbox *sb, json_t *params, struct conch_err *err);
json_t *conch_daemon_snapshot_fork(struct sandbox *sb, json_t *params, struct conch_err *err);
/* conch_daemon_snapshot_fail - answer @call with @err as the snapshot methods do (busy,
 * snapshot_not_found, snapshot_in_use...). */
void conch_daemon_snapshot_fail(struct conch_rpc_call *call, const struct conch_err *err);
void conch_daemon_handle_workspace_snapshot(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_workspace_restore(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_workspace_snapshots(struct conch_rpc_call *call, json_t *params,
                                             void *ctx);
void conch_daemon_handle_workspace_snapshot_delete(struct conch_rpc_call *call, json_t *params,
                                                   void *ctx);
void conch_daemon_handle_sandbox_fork(struct conch_rpc_call *call, json_t *params, void *ctx);
/* conch_daemon_workspace_queue - queue a snapshot, restore or fork of the sandbox named by
 * @params' "sandbox" among its workspace requests (files.c); answered when its turn is done. */
enum ws_queued { WS_Q_SNAPSHOT, WS_Q_RESTORE, WS_Q_FORK };
void conch_daemon_workspace_queue(struct conch_rpc_call *call, json_t *params, void *ctx,
                                  enum ws_queued kind);
/* conch_daemon_sandbox_destroy - at once: fail its commands and requests, forget it (not found from
 * now on), delete its record. In a worker: end the warden, then remove its directory. */
void conch_daemon_sandbox_destroy(struct sandbox *sb);
/* conch_daemon_sandbox_destroy_then - conch_daemon_sandbox_destroy, then @gone(@arg) on the loop
 * once the warden is gone and the directory removed (at once if @sb is already being destroyed). */
void conch_daemon_sandbox_destroy_then(struct sandbox *sb, void (*gone)(void *arg), void *arg);
/* conch_sb_destroy_why - conch_daemon_sandbox_destroy, its commands and requests failing with @why.
 */
void conch_sb_destroy_why(struct sandbox *sb, const char *why);
void conch_daemon_sandbox_destroy_keep_record(struct sandbox *sb);
/* conch_sb_sample_start - sample @sb's disk use, and its memory and process count where no
 * cgroup enforces its limits, every 50 ms while its warden is up and a command runs or a
 * measurement waits (the timer is closed with the warden's handles). */
void conch_sb_sample_start(struct sandbox *sb);
/* conch_sb_sample_wake - restart @sb's sampling, asleep while nothing ran and no measurement
 * waited: a command started, or a measurement was asked for and could not start at once. */
void conch_sb_sample_wake(struct sandbox *sb);
bool conch_daemon_spec_from_params(struct conch_rpc_call *call, json_t *params,
                                   struct sandbox_spec *spec);
struct sandbox *conch_daemon_sandbox_find(struct daemon *d, const char *id);
/* conch_daemon_sandbox_find_running - the running sandbox @id, or NULL after failing @call with
 * sandbox_not_found or sandbox_stopped. */
/* conch_daemon_sandbox_find_or_fail - the sandbox whose id or name is @params' @key, or NULL
 * after failing @call with sandbox_not_found. */
struct sandbox *conch_daemon_sandbox_find_or_fail(struct daemon *d, struct conch_rpc_call *call,
                                                  json_t *params, const char *key);
struct sandbox *conch_daemon_sandbox_find_running(struct daemon *d, struct conch_rpc_call *call,
                                                  const char *id);
void conch_daemon_sandbox_touch(struct sandbox *sb);
json_t *conch_daemon_sandbox_json(const struct sandbox *sb);
void conch_daemon_sandboxes_recover(struct daemon *d);
/* conch_daemon_sandbox_spill_dir - where @sb's commands spill their output: its own directory
 * (<state>/sandboxes/<id>/spill, counted against its disk budget and removed with it), or
 * for a `fresh` sandbox the daemon's shared spill directory (its result names the file after
 * the sandbox is gone; `conch gc` removes it after CONCH_RECOVER_SPILL_TTL_S). Creates the
 * directory on first use; falls back to the shared one if it cannot. */
const char *conch_daemon_sandbox_spill_dir(struct sandbox *sb);

/* pool.c: the pool of pre-built sandboxes and the lease */
void conch_daemon_handle_sandbox_lease(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_sandbox_release(struct conch_rpc_call *call, json_t *params, void *ctx);
/* conch_daemon_sandboxes_client_gone - the client of @sink went away: the sandboxes lent to it go.
 */
void conch_daemon_sandboxes_client_gone(struct daemon *d, struct conch_rpc_sink *sink);
void conch_daemon_pool_fill(struct daemon *d);
/* conch_daemon_pool_take - a POOLED sandbox, now READY for a `fresh` command; NULL when none is. */
struct sandbox *conch_daemon_pool_take(struct daemon *d);
/* conch_daemon_pool_fill_soon - conch_daemon_pool_fill on the next turn of the loop (after
 * the answers being written). */
void conch_daemon_pool_fill_soon(struct daemon *d);
/* conch_daemon_fork_pooled - forkpool.c: the fork @s (a snapshot's stack, see fork_from in
 * snapshots.c) made of a pool sandbox when its spec is the pool's and one is ready: 1 with
 * *@ret (listed, recorded, READY), else 0 (nothing changed but a pool sandbox possibly gone:
 * the caller builds it, which reports any error). */
int conch_daemon_fork_pooled(struct daemon *d, const struct sandbox_spec *s, struct sandbox **ret);
/* conch_daemon_workspace_clear - 0, or -EPERM with @err when @path is, holds or lies beneath
 * the daemon's state directory or holds its socket's (sandbox.create refuses it). */
int conch_daemon_workspace_clear(const struct daemon *d, const char *path, struct conch_err *err);
/* conch_daemon_sandbox_retire - a `fresh` sandbox's one command was answered (READY), or its
 * borrower released it (LENT): back into the pool, made as new by its warden (RECYCLING), when it
 * came from there and nothing else uses it; destroyed otherwise. */
void conch_daemon_sandbox_retire(struct sandbox *sb);
/* conch_sb_lease_answer - the warden of LEASING @sb answered the attach (@r < 0: failed,
 * @err says why): answer the lease with the borrower's channel (-> LENT), or fail it and
 * destroy the sandbox. */
void conch_sb_lease_answer(struct sandbox *sb, int r, const struct conch_err *err);

/* commands.c */
/* conch_daemon_run_forget - the sandbox of @r goes: stop reading its output, answer its exec.run if
 * that is still due, and free it (a job's record too). Its command has ended or been ended. */
void conch_daemon_run_forget(struct run *r);
/* conch_daemon_run_limit_hit - sampling saw the sandbox at @limits (CONCH_LIMIT_* bits of
 * exec/command.h): memory kills @r, the process limit is only noted (forks fail by themselves).
 * Nothing once @r has finished. */
void conch_daemon_run_limit_hit(struct run *r, unsigned limits);
/* conch_daemon_run_disk_full - the sandbox's disk use passed its limit: kill @r, whose report
 * names the limit. Nothing once @r has finished. */
void conch_daemon_run_disk_full(struct run *r);
void conch_daemon_handle_exec_run(struct conch_rpc_call *call, json_t *params, void *ctx);
/* conch_daemon_handle_exec_signal - exec.signal (execsignal.c). */
void conch_daemon_handle_exec_signal(struct conch_rpc_call *call, json_t *params, void *ctx);
/* conch_daemon_client_close - disconnect @c (its pending responses are dropped). */
void conch_daemon_client_close(struct client *c);
void conch_daemon_handle_job_start(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_job_output(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_job_wait(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_job_kill(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_job_list(struct conch_rpc_call *call, json_t *params, void *ctx);

/* files.c */
/*
 * conch_daemon_sandbox_changes_async - list @sb's workspace changes in a worker thread (a scan of
 * 300,000 files takes seconds: never on the loop), after the workspace requests queued before it,
 * then call @done(@arg, r, changes, err) on the loop: r = 0 and *@changes filled (empty
 * when the sandbox has no overlay; take the items over by moving them out, else they are
 * freed after the call), or r < 0 with @err (-ESHUTDOWN when the sandbox was destroyed
 * first). Returns 0, or -ENOMEM (then @done is never called). For exec.run's results.
 */
typedef void (*sandbox_changes_fn)(void *arg, int r, struct conch_ws_changes *changes,
                                   const struct conch_err *err);
int conch_daemon_sandbox_changes_async(struct sandbox *sb, sandbox_changes_fn done, void *arg);
/* conch_daemon_sandbox_changes_none - true when @sb's workspace has no changes and that is known at
 * the cost of one directory read (no workspace request queued or running, the upper dir empty): a
 * command that changed nothing is then answered without a worker's round trip. */
bool conch_daemon_sandbox_changes_none(struct sandbox *sb);
/* conch_daemon_sandbox_measure - measure @sb's disk use soon, in a worker (after a command or a
 * file write: short commands end between two samples). A measurement over the limit kills the
 * running commands and sets sb->disk_over until one finds room again. */
void conch_daemon_sandbox_measure(struct sandbox *sb);
/* conch_daemon_sandbox_disk_refuse - while @sb is over its disk limit, fail @call (limit, naming
 * how to free room) and return true: nothing more may be written until room is made. */
bool conch_daemon_sandbox_disk_refuse(struct sandbox *sb, struct conch_rpc_call *call);
/* conch_daemon_ws_ops_cancel - fail the workspace requests of @sb still waiting for their turn. */
void conch_daemon_ws_ops_cancel(struct sandbox *sb, const char *why);
/* How long a file request may take inside the sandbox (fs.grep over a big tree...). */
#define CONCH_FILE_TIMEOUT_MS (120 * 1000)
/* The largest answer of a file worker. */
#define CONCH_FILE_MAX_RESPONSE (64u << 20)
/* conch_daemon_file_answer_queue - parse the worker's answer @buf (owned) off the loop and complete
 * @call with it; measure @sb's disk use first when @measure (a write or delete, @frees). @charged:
 * bytes of sb->held charged for @buf, taken over (uncharged once the answer has gone to its
 * client); parsing it whole charges its estimated parsed size too, or fails with `limit`. */
void conch_daemon_file_answer_queue(struct sandbox *sb, struct conch_rpc_call *call, char *buf,
                                    size_t len, uint64_t charged, bool measure, bool frees);
/* conch_daemon_file_answer_refuse - fail @call with `limit`: a file worker's answer (@size:
 * "of 12345 bytes", "of more than 12345 bytes") does not fit the sandbox's budget (@err->msg,
 * from conch_budget_charge, names the budget and the option that raises it). */
void conch_daemon_file_answer_refuse(struct conch_rpc_call *call, const char *size,
                                     const struct conch_err *err);
/* conch_daemon_file_fork - fork a worker for the request @text (owned) of @call, lending it
 * @data_fd (borrowed; -1: none; @copy says it is a transfer's host file), and read its answer
 * (conch_daemon_file_answer_queue); @reserve: the disk room a copy_in holds while it runs
 * (filecopy.c). @call fails when the worker cannot start. */
void conch_daemon_file_fork(struct client *c, struct sandbox *sb, struct conch_rpc_call *call,
                            char *text, bool measure, bool frees, int data_fd, uint64_t reserve);
/* conch_daemon_handle_fs_copy - fs.copy_in / fs.copy_out (@in): the host file the client names
 * is opened here and lent to a forked file worker, which copies it (filecopy.c). */
void conch_daemon_handle_fs_copy(struct conch_rpc_call *call, json_t *params, void *ctx, bool in);
/* conch_daemon_file_pool_submit - give the request @text (owned when it returns true) to a free
 * persistent file worker of @sb (starting one if fewer run than the pool holds), or queue it
 * when all are busy and many forked workers are in flight (charged to the sandbox's budget
 * while it waits; past the budget @call is failed with `limit`), and return true; false: the
 * caller forks a worker for it. */
bool conch_daemon_file_pool_submit(struct sandbox *sb, struct conch_rpc_call *call, char *text,
                                   bool measure, bool frees);
/* conch_daemon_file_pool_retire_idle - when no persistent worker of @sb holds a request and none
 * waits: end them all (they are killed; the next request starts a new one) and return true;
 * else false, and nothing changes. */
bool conch_daemon_file_pool_retire_idle(struct sandbox *sb);
/* conch_daemon_file_pool_stop - fail the requests of @sb's persistent workers and end them. */
void conch_daemon_file_pool_stop(struct sandbox *sb);

/* JS sessions (js.c). The longest session name. */
#define CONCH_JS_SESSION_NAME_MAX 64
void conch_daemon_handle_js_eval(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_js_reset(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_js_close(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_js_list(struct conch_rpc_call *call, json_t *params, void *ctx);
/* conch_daemon_js_count - how many JS sessions @sb has open. */
unsigned conch_daemon_js_count(const struct sandbox *sb);
/* conch_daemon_js_busy - how many of them have an eval (or reset) in flight. */
unsigned conch_daemon_js_busy(const struct sandbox *sb);
/* conch_daemon_js_drop_spare - end @sb's spare JS worker (it holds /workspace: a snapshot
 * restacks it), without counting it as a failed one. */
void conch_daemon_js_drop_spare(struct sandbox *sb);
/* conch_daemon_js_stop - close @sb's JS sessions (after conch_super_done: every worker has
 * had its final event), failing their requests. */
void conch_daemon_js_stop(struct sandbox *sb);
/* conch_daemon_js_worker_main - the JS worker's body inside the sandbox (the jail spec's
 * js_server): conch_js_worker_serve on @sock with the default limits. */
int conch_daemon_js_worker_main(int sock);
void conch_daemon_file_req_abort(struct file_req *fr);
/* conch_daemon_file_fail_ended - fail @call, a file request whose worker ended (@end) before
 * its answer was whole, saying why: it could not start, the sandbox stopped (lost), its
 * deadline fired, or what killed it. */
void conch_daemon_file_fail_ended(struct conch_rpc_call *call, const struct conch_proc_end *end);
/* file-answers.c: fs.* on /run/conch/output, served on the host from @sb's spill dir. */
/* conch_daemon_fs_output_request - whether fs.@method with @params names the output dir: 1 all
 * of its paths do, 0 none, -1 some do and some do not (download). */
int conch_daemon_fs_output_request(const char *method, json_t *params);
/* conch_daemon_fs_output_handle - serve fs.@method on the output dir, off the loop. */
void conch_daemon_fs_output_handle(struct sandbox *sb, struct conch_rpc_call *call, json_t *params,
                                   const char *method);
/* conch_daemon_handle_fs - fs.<@method>: the request runs in a fenced worker inside the sandbox. */
void conch_daemon_handle_fs(struct conch_rpc_call *call, json_t *params, void *ctx,
                            const char *method);
void conch_daemon_handle_workspace_changes(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_workspace_diff(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_workspace_commit(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_workspace_discard(struct conch_rpc_call *call, json_t *params, void *ctx);

/* tools.c */
/* conch_daemon_sandbox_bridge_new - @sb's tool bridge (sb->bridge), not listening yet. */
int conch_daemon_sandbox_bridge_new(struct sandbox *sb, struct conch_err *err);
/* conch_daemon_sandbox_bridge_listen - once @sb's jail is set up: serve its /run/conch/ptc.sock. */
void conch_daemon_sandbox_bridge_listen(struct sandbox *sb);
/* conch_daemon_client_tools_response - @c answered a tool.call or agent.spawn the daemon sent it.
 */
void conch_daemon_client_tools_response(struct client *c, json_t *id, json_t *result,
                                        json_t *error);
/* conch_daemon_client_tools_gone - @c went away: its tools go, the calls it was answering fail. */
void conch_daemon_client_tools_gone(struct client *c);
void conch_daemon_handle_tools_register(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_tools_unregister(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_tools_list(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_tools_trace(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_tools_prompt(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_agents_register(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_agents_unregister(struct conch_rpc_call *call, json_t *params, void *ctx);

/* methods.c: every method a client may call (conch_rpc_dispatch's table). */
extern const struct conch_rpc_method conch_daemon_methods[];

/* A workspace request's dirs (ws-open.c): the overlay's upper dir and the host dir, both owned
 * by the holder (conch_daemon_ws_close closes them); -1: none. */
struct ws_fds {
    int upper, lower;
};
/* conch_daemon_ws_close - close @fds' dirs and set them to -1. */
void conch_daemon_ws_close(struct ws_fds *fds);
/* conch_daemon_ws_open - open @sb's workspace upper and host dir into @fds. A sandbox without
 * an overlay workspace, or whose upper was never created, has no changes: upper is then -1. A
 * host dir that is no longer the one it was made on is refused (ESTALE). 0 or -errno. */
int conch_daemon_ws_open(struct sandbox *sb, struct ws_fds *fds, struct conch_err *err);
/* conch_daemon_mount_open - the same for @sb's overlay mount number @i (its upper in
 * <state>/sandboxes/<id>/m<i>, its source dir, checked against its recorded identity). */
int conch_daemon_mount_open(struct sandbox *sb, int i, struct ws_fds *fds, struct conch_err *err);
/* conch_daemon_overlay_mount_find - the index of @sb's overlay mount at @target, or -1. */
int conch_daemon_overlay_mount_find(const struct sandbox *sb, const char *target);

/* tenants.c: connection.auth, tenants' visibility, refusals and quotas (docs/ARCHITECTURE.md,
 * "Tenants"). */
/* conch_daemon_tenants_start - load @path (the --tokens file; NULL: none). Returns 0, or
 * -errno with @err naming what is wrong with the file. */
int conch_daemon_tenants_start(struct daemon *d, const char *path, struct conch_err *err);
/* conch_daemon_tenants_listen - reload the tokens file on SIGHUP (once the loop runs). */
void conch_daemon_tenants_listen(struct daemon *d);
/* conch_daemon_tenants_stop - free the table and the failure records. */
void conch_daemon_tenants_stop(struct daemon *d);
/* conch_daemon_handle_connection_auth - connection.auth {token, peer?} -> {tenant, admin}. */
void conch_daemon_handle_connection_auth(struct conch_rpc_call *call, json_t *params, void *ctx);
/* conch_daemon_tenant_dispatch - dispatch the request line of @c: through the method table a
 * tenant is held to when @c has authenticated, else the whole table; with @c as the viewer. */
void conch_daemon_tenant_dispatch(struct client *c, const char *line, size_t len);
/* conch_daemon_tenant_sees - whether the viewer (the client whose request is being handled;
 * none: the daemon itself) may see and reach @sb: the owner's connections and an admin's see
 * every sandbox, a tenant's only its own. */
bool conch_daemon_tenant_sees(const struct daemon *d, const struct sandbox *sb);
/* conch_daemon_tenant_sees_tenant - the same for something recorded as @tenant's ("": the
 * owner's), a snapshot say. */
bool conch_daemon_tenant_sees_tenant(const struct daemon *d, const char *tenant);
/* conch_daemon_tenant_viewer - the viewer's tenant name, "" for the owner. */
const char *conch_daemon_tenant_viewer(const struct daemon *d);
/* conch_daemon_tenant_workspace - the directory a tenant's sandboxes have as their workspace's
 * lower layer (overlay: what they write goes to their own upper dir): an empty directory of
 * its own, <state>/tenant-workspaces/<tenant>, made if needed, into @buf. 0 or -errno. */
int conch_daemon_tenant_workspace(struct daemon *d, const char *tenant, char *buf, size_t size,
                                  struct conch_err *err);
/* conch_daemon_tenant_admit - before @tenant's new sandbox is made: check its quotas
 * (sandboxes, memory, disk) against the sandboxes it holds, filling *@memory and *@disk when
 * 0 (not given) with the tenant's share. Returns 0, or -EDQUOT with @err (kind limit) naming
 * the quota and its value. */
int conch_daemon_tenant_admit(struct daemon *d, const char *tenant, uint64_t *memory,
                              uint64_t *disk, struct conch_err *err);
/* conch_daemon_tenant_disk_quota - @tenant's disk quota in bytes; 0: none. */
uint64_t conch_daemon_tenant_disk_quota(struct daemon *d, const char *tenant);
/* conch_daemon_tenant_command_admit - before a command of the viewer's starts in @sb: false
 * after failing @call with `limit` when the tenant's commands quota is reached. */
bool conch_daemon_tenant_command_admit(struct daemon *d, struct conch_rpc_call *call);

#endif
