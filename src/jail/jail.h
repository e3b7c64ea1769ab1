/* jail.h - the sandbox as a library: build a set of namespaces and a root filesystem held
 * by a warden process (PID 1 inside), run commands in it, tear it down.
 *
 * Lifecycle: conch_jail_start() → conch_jail_send_run() and events (driven by the
 * supervisor, super/) [→ changes/commit through conch_jail_upper_open()] →
 * conch_jail_destroy(). The warden fences each command (identity, capabilities,
 * no_new_privs, Landlock, seccomp, rlimits) before execve. */
#ifndef CONCH_JAIL_JAIL_H
#define CONCH_JAIL_JAIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "core/error.h"
#include "jail/cgroup.h"
#include "jail/ids.h"
#include "jail/seccomp.h"
#include "spec/spec.h"

/* Processes a sandbox may have when the caller sets no limit. */
#define CONCH_DEFAULT_PIDS 1024

#define CONCH_AGENT_UID 1000
#define CONCH_AGENT_GID 1000

/*
 * A file request handler, run inside the sandbox by a worker forked from the warden after
 * every fence of a command is applied (identity, capabilities, no_new_privs, Landlock,
 * seccomp). It reads the request from @req_fd and writes its answer to @resp_fd; @data_fd is
 * the host file the caller lent with the request (conch_jail_send_file_data), or -1. The
 * worker exits with its return value. See conch_jail_file().
 */
typedef int (*conch_jail_file_fn)(int req_fd, int resp_fd, int data_fd);

/*
 * A persistent file worker's loop, run inside the sandbox under the same fences as
 * conch_jail_file_fn: it serves framed requests from @sock (a stream socket whose other end
 * the caller holds) one at a time until EOF; the worker exits with its return value. See
 * conch_jail_send_file_server().
 */
typedef int (*conch_jail_file_serve_fn)(int sock);

/* At most this many frozen layers under a sandbox's upper (overlayfs itself takes 500; the
 * daemon squashes or refuses before, see docs/ARCHITECTURE.md "Snapshots"). */
#define CONCH_JAIL_MAX_LAYERS 32

/* A frozen, read-only layer of the workspace (a snapshot): a host dir in overlayfs's upper
 * format (whiteouts, user.overlay.* xattrs). As host root its files belong to the host id
 * block it was written with (@id_base): it is idmapped onto the sandbox's own block. */
struct conch_jail_layer {
    const char *dir;  /* absolute host path; borrowed */
    uint32_t id_base; /* as host root: the block its files belong to; 0: not shifted */
};

/* What a sandbox is made of. Strings are borrowed for the duration of conch_jail_start. */
struct conch_jail_spec {
    const char *rootfs;    /* NULL: the host's /usr (+/bin,/lib..) and a curated /etc */
    const char *workspace; /* absolute host dir mounted at /workspace; NULL: none */
    enum conch_ws_mode ws_mode;
    /* The workspace dir's identity (st_dev, st_ino) when the caller knows it (0: not
     * checked): a workspace replaced meanwhile (renamed away, swapped for a symlink to
     * another dir, its parent swapped) is refused instead of followed. */
    dev_t ws_dev;
    ino_t ws_ino;
    bool as_root;                      /* commands run as uid 0 of the namespace */
    uint64_t tmp_bytes;                /* size of /tmp */
    uint64_t home_bytes;               /* size of /home/agent */
    uint64_t disk_bytes;               /* size of the overlay upper (what may be written) */
    uint64_t file_bytes;               /* RLIMIT_FSIZE of commands (the largest file); 0: none */
    struct rlimit nofile;              /* RLIMIT_NOFILE of commands; rlim_cur 0: the caller's own */
    struct conch_cgroup_limits limits; /* enforced by a cgroup when one can be had */
    const char *name; /* unique name (cgroup, staging); NULL: derived from the pid */
    /* Host dir holding the overlay's upper/ and work/, kept after the sandbox (for changes
     * and commit); NULL: a tmpfs of disk_bytes that lives as long as the warden. */
    const char *upper_dir;
    /* Frozen layers between the workspace (the bottom) and the upper, top first (overlay
     * mode only); @n_layers at most CONCH_JAIL_MAX_LAYERS. Borrowed. */
    const struct conch_jail_layer *layers;
    int n_layers;
    /* Extra mounts (spec/spec.h: tmpfs, bind), checked by conch_mount_check; at most
     * CONCH_SPEC_MOUNTS_MAX. A bind's source is opened with the caller's rights (as host
     * root: idmapped like the workspace, its owner shown as the command's user). Borrowed. */
    const struct conch_mount *mounts;
    unsigned n_mounts;
    /* Path rules in the workspace (spec/spec.h: read-only and hidden paths, normalised by
     * conch_spec_add_rule), at most CONCH_SPEC_RULES_MAX; enforced by mounts inside (see
     * docs/ARCHITECTURE.md "Path rules"). Not with @attachable. Borrowed. */
    const struct conch_path_rule *rules;
    unsigned n_rules;
    /* Host unix sockets bound into the sandbox (spec/spec.h), at most CONCH_SPEC_SOCKETS_MAX:
     * each host path is opened again here (conch_socket_open: a socket of the caller's, no
     * link) and exactly that file is bound at its path, whose parent dirs are made on the
     * sandbox's root. As host root it is idmapped (its owner shown as the command's user).
     * Borrowed. */
    const struct conch_socket *sockets;
    unsigned n_sockets;
    conch_jail_file_fn file_handler;      /* NULL: conch_jail_file() is refused */
    conch_jail_file_serve_fn file_server; /* NULL: conch_jail_send_file_server() is refused */
    /* The JS worker's loop (a persistent worker fenced as the file server); NULL:
     * conch_jail_send_js_server() is refused. */
    conch_jail_file_serve_fn js_server;
    /* Host root: the sandbox's ids 0..65535 map onto host ids host_id_base.. (+65535), a
     * block the caller claimed with conch_jail_ids_claim and holds while the sandbox lives;
     * 0: conch_jail_spawn claims one and releases it in conch_jail_destroy. */
    uint32_t host_id_base;
    /* A workspace may be attached later (conch_jail_send_attach): the daemon's pool. */
    bool attachable;
    /* The tool bridge (docs/TOOLS.md): a listening unix socket at /run/conch/ptc.sock inside,
     * handed to the caller (conch_jail_take_ptc_fd), and @ptc_dir (a host dir holding bin/,
     * python/ and node/: conch_ptc_dir()) bound read-only at /run/conch/lib with bin/ on
     * commands' PATH. Either may be off (false / NULL). */
    bool ptc_socket;
    const char *ptc_dir;
    /* The network (net/net.h): NONE, a namespace of its own with loopback only; ALLOW, the
     * same with a listening TCP socket at 127.0.0.1:3128 inside handed to the caller
     * (conch_jail_take_net_fd), whose proxy is the only way out; HOST, the host's network
     * namespace (and its resolv.conf). */
    enum conch_net_mode net;
};

/*
 * conch_jail_warden_entry - the hidden entry point of a sandbox's warden. A caller that called
 * conch_jail_host_prepare (a daemon) has every warden started by an exec of a copy of its own
 * binary (a clean, single-threaded image: nothing of the caller's heap, no lock held by one of
 * its threads) with argv[0] "conch-warden"; such a program calls this first thing in main().
 * With a warden's argv it becomes the warden and never returns; with any other it returns.
 */
void conch_jail_warden_entry(int argc, char **argv);

/* conch_jail_spec_init - fill @spec with the defaults of conch_spec_defaults (spec/spec.h):
 * overlay, 256M /tmp, 64M home, 4G disk. */
void conch_jail_spec_init(struct conch_jail_spec *spec);

/* A running sandbox: opaque, made by conch_jail_start/spawn, freed by conch_jail_destroy. */
struct conch_jail;

/* conch_jail_check_stack - 0, or -ENOMEM with @err when the calling process's stack size limit
 * is too small to build a sandbox (its warden is a fork with the same limit) or drive one
 * (256 KiB): said, rather than a crash. conch_jail_spawn checks it too. */
int conch_jail_check_stack(struct conch_err *err);

/* conch_jail_proto_version - the warden protocol this build speaks: a warden lent by a daemon
 * (conch_jail_adopt) must speak the same, or every message is refused. */
uint32_t conch_jail_proto_version(void);

/* Accessors of a running jail (@j borrowed). */
pid_t conch_jail_warden_pid(const struct conch_jail *j); /* host pid of the warden (PID 1) */
int conch_jail_ctl_fd(const struct conch_jail *j);       /* the control socket; owned by @j */
int conch_jail_host_ws_fd(const struct conch_jail *j);   /* host workspace dir fd, or -1 */
bool conch_jail_has_cgroup(const struct conch_jail *j);  /* limits held by a cgroup */
/* conch_jail_cgroup_stats - the cgroup's counters (zeros without a cgroup). */
void conch_jail_cgroup_stats(struct conch_jail *j, struct conch_cgroup_stats *ret);
/* conch_jail_take_ptc_fd - the listening tool-bridge socket (O_NONBLOCK, O_CLOEXEC) the
 * warden made at /run/conch/ptc.sock when spec.ptc_socket was set; the caller owns it and
 * accepts on it. -1 when there is none or it was taken. */
int conch_jail_take_ptc_fd(struct conch_jail *j);
/* conch_jail_take_net_fd - the listening proxy socket (127.0.0.1:3128 in the sandbox's
 * network namespace; O_NONBLOCK, O_CLOEXEC) of a sandbox of spec.net ALLOW; the caller owns
 * it and accepts on it. -1 when there is none or it was taken. */
int conch_jail_take_net_fd(struct conch_jail *j);
/* conch_jail_set_sync_destroy - make conch_jail_destroy wait until the namespaces are gone
 * (the overlay unmounted), as a restart over the same upper dir needs. */
void conch_jail_set_sync_destroy(struct conch_jail *j, bool on);

/*
 * conch_jail_start - build a sandbox per @spec and leave its warden waiting for commands.
 * Fails closed: if the kernel refuses any step (user namespace, a mount, the cgroup when
 * limits were asked and none can be had...), returns -errno with @err of kind
 * infrastructure naming the step, the errno and the fix; nothing runs unsandboxed.
 * On success *@ret is a new jail that owns the warden; release it with conch_jail_destroy.
 */
int conch_jail_start(const struct conch_jail_spec *spec, struct conch_jail **ret,
                     struct conch_err *err);

/*
 * conch_jail_spawn - conch_jail_start without waiting for the setup, for an event loop:
 * clones the warden and lets it build the sandbox; its outcome arrives as the first
 * CONCH_JAIL_ANSWER event on the control socket (conch_jail_read_event; the supervisor
 * routes it: conch_super_await_setup), which conch_jail_take_answer(SETUP) applies. On
 * failure the caller destroys @j.
 */
int conch_jail_spawn(const struct conch_jail_spec *spec, struct conch_jail **ret,
                     struct conch_err *err);

/*
 * conch_jail_host_prepare - as host root, move the calling process into a private mount
 * namespace with a staging tmpfs (where workspaces are attached as idmapped mounts for the
 * sandboxes). conch_jail_start does it on first need; a long-lived caller (the daemon)
 * calls it once at start so that its mount table does not change later. It also copies the
 * running binary into a sealed memfd, from which every warden of the caller is exec'd from
 * then on (a multi-threaded caller's clone must not run on: see conch_jail_warden_entry);
 * without it a warden is a plain clone of the caller. Single-threaded callers only. Returns 0
 * or -errno with @err.
 */
int conch_jail_host_prepare(struct conch_err *err);

/* One command to run in a jail. Strings and fds are borrowed. Without a workspace,
 * /workspace is an empty tmpfs. */
struct conch_jail_cmd {
    char *const *argv; /* argv[0] is looked up in PATH of @envp when it has no '/' */
    char *const *envp; /* the whole environment; nothing else is inherited */
    const char *cwd;   /* inside the sandbox; NULL: /workspace or / */
    int stdin_fd, stdout_fd, stderr_fd;
    /* A session's shell (sessions.c): the command gets a new pty of the sandbox's own devpts
     * as controlling terminal and fds 0-2; it sends the pty's master back over @stdin_fd (a
     * unix socket, SCM_RIGHTS) before exec, then keeps it as fd 62; @stdout_fd and @stderr_fd
     * are not used. */
    bool pty;
    /* The sandbox's last command (a fresh sandbox's one): the warden builds no spare
     * shepherd after it, which nothing would use. */
    bool last;
    /* The command takes the calling process's umask, and its nice value and resource limits
     * where they are stricter than the sandbox's own (`conch run`: as a program it started
     * would, whether the sandbox is its own or borrowed from a daemon). */
    bool caller_attrs;
    /* With @caller_attrs: the largest file the command may write (RLIMIT_FSIZE), when it is
     * stricter than the caller's and the sandbox's; 0: no further bound. */
    uint64_t max_file;
};

/*
 * conch_jail_send_run - send @cmd as command @id (the caller's unique id). Its start (or
 * start failure) and its end arrive as events on @j->ctl_fd (conch_jail_read_event); exactly
 * one final event (START_FAILED or EXITED) comes for every command sent, whatever happens to
 * it, as long as the warden lives. The warden runs the command under a shepherd that is PID 1
 * of the command's own pid namespace (with its own /proc): when the command exits, or is
 * killed, every process it started dies with it in one kernel operation. @timeout_ms (0:
 * none) is enforced by the warden: SIGTERM to every process of the command, SIGKILL after
 * @grace_ms (0: at once). Most callers use the supervisor (super/) instead.
 */
int conch_jail_send_run(struct conch_jail *j, int64_t id, const struct conch_jail_cmd *cmd,
                        uint64_t timeout_ms, uint64_t grace_ms, struct conch_err *err);

/* conch_jail_send_signal - send @sig to every process of command @id (SIGKILL: the whole
 * pid namespace at once), or kill file request @id. Unknown ids are ignored. */
int conch_jail_send_signal(struct conch_jail *j, int64_t id, int sig, struct conch_err *err);

/* conch_jail_send_recycle - ask the warden of a sandbox without a workspace, once every
 * command and file worker of it has ended, to make the sandbox as new (every process killed
 * without a final event, new network, IPC and UTS namespaces, new empty writable mounts, a
 * lent channel closed: see conch_jail_hand_over). Its answer is a CONCH_JAIL_ANSWER event
 * (conch_jail_take_answer(RECYCLE)); the supervisor routes it: conch_super_recycle. */
int conch_jail_send_recycle(struct conch_jail *j, struct conch_err *err);

enum conch_jail_event_type {
    CONCH_JAIL_STARTED = 1,
    CONCH_JAIL_START_FAILED,
    CONCH_JAIL_EXITED,
    /* The warden's answer to the oldest request of those that get one (the setup of a
     * spawned jail, a recycle, an attach): they are answered in the order they were sent.
     * Apply it with conch_jail_take_answer. */
    CONCH_JAIL_ANSWER,
};

/* What the warden or a shepherd reports about a command or a file worker, or the answer to a
 * request. */
struct conch_jail_event {
    enum conch_jail_event_type type;
    int64_t id;
    pid_t pid;            /* STARTED: pid in the command's pid namespace */
    uint64_t pidns_ino;   /* STARTED: inode of that pid namespace (nsfs; 0 if unknown) */
    int status;           /* EXITED: wait status */
    bool timed_out;       /* EXITED: the deadline fired */
    bool lost;            /* EXITED: the shepherd died unasked; status is a synthetic SIGKILL */
    struct rusage usage;  /* EXITED: of the command and its descendants */
    struct conch_err err; /* START_FAILED; ANSWER when it failed */
    bool answer_ok;       /* ANSWER: the request succeeded */
    int answer_nr;        /* ANSWER: the upper dir's fd number in the warden, or -1 */
    int answer_fd;        /* ANSWER: an fd that came with it (the setup's tool-bridge socket)
                           * or -1; conch_jail_take_answer takes it, else the reader closes it */
    int answer_net_fd;    /* ANSWER: the setup's proxy listener or -1; as @answer_fd */
};

/* The requests the warden answers with a CONCH_JAIL_ANSWER event. */
enum conch_jail_answer_kind {
    CONCH_JAIL_ANSWER_SETUP = 1, /* conch_jail_spawn */
    CONCH_JAIL_ANSWER_RECYCLE,   /* conch_jail_send_recycle */
    CONCH_JAIL_ANSWER_ATTACH,    /* conch_jail_send_attach */
    CONCH_JAIL_ANSWER_RESTACK,   /* conch_jail_send_release, conch_jail_send_restack */
};

/*
 * conch_jail_take_answer - apply the warden's answer @ev (CONCH_JAIL_ANSWER) to the request of
 * @kind it answers: a setup's tool-bridge socket and upper dir (the staging mounts go), an
 * attach's upper dir. Takes @ev->answer_fd. Returns 0, or -errno with @err (the warden's
 * error, wrapped: a setup's is of kind infrastructure). @j stays the caller's either way.
 */
int conch_jail_take_answer(struct conch_jail *j, enum conch_jail_answer_kind kind,
                           struct conch_jail_event *ev, struct conch_err *err);

/*
 * Sends to the warden never block and never fail because its control socket is full: the
 * message waits in @j's queue (at most 1024 messages; beyond, the send fails with ENOBUFS
 * and a "too many" message), in order with later ones. A caller driving @j from an event
 * loop polls conch_jail_ctl_fd() for writability while conch_jail_wants_write() and then
 * calls conch_jail_flush(), which returns 0 (the queue is empty), 1 (more waits) or -errno
 * with @err (the warden is gone: the queue is dropped). conch_jail_on_queued() registers
 * @fn, called with @data each time a message is queued on an empty queue (NULL: none).
 */
bool conch_jail_wants_write(const struct conch_jail *j);
int conch_jail_flush(struct conch_jail *j, struct conch_err *err);
void conch_jail_on_queued(struct conch_jail *j, void (*fn)(void *data), void *data);

/*
 * conch_jail_read_event - read one event from @j->ctl_fd without blocking. Returns 1 with
 * *@ret filled, -EAGAIN when none is waiting, 0 when the warden is gone, or -errno.
 */
int conch_jail_read_event(struct conch_jail *j, struct conch_jail_event *ret,
                          struct conch_err *err);

/*
 * conch_jail_send_file - send file request @id: the warden forks a worker that applies every
 * fence of a command, then calls the spec's file_handler with @req_fd (the request) and
 * @resp_fd (where the answer goes). Both fds are borrowed: the caller closes its copies and
 * reads the answer from the other end of @resp_fd until EOF. The warden kills a worker that
 * runs past @timeout_ms (0: none): the answer then ends early. Exactly one final event with
 * @id follows, as for a command: EXITED once the warden has reaped the worker (its wait
 * status, timed_out when the deadline killed it), or START_FAILED when it could not start it.
 * Most callers use the supervisor (conch_super_file).
 */
int conch_jail_send_file(struct conch_jail *j, int64_t id, int req_fd, int resp_fd,
                         uint64_t timeout_ms, struct conch_err *err);

/*
 * conch_jail_send_file_data - conch_jail_send_file with a third descriptor, @data_fd
 * (borrowed; -1: none), handed to the worker's handler as its data_fd: the host file a
 * transfer copies from or to. It lives only as long as that one worker.
 */
int conch_jail_send_file_data(struct conch_jail *j, int64_t id, int req_fd, int resp_fd,
                              int data_fd, uint64_t timeout_ms, struct conch_err *err);

/*
 * conch_jail_send_file_server - start persistent file worker @id: the warden forks a worker
 * fenced like the one of conch_jail_send_file (and in the same place: the warden's pid
 * namespace, where no command can see it), which runs the spec's file_server on @sock
 * (borrowed: the caller closes its copy and keeps the other end). It has no deadline of the
 * warden's: the caller ends it by closing its end, or with conch_jail_send_signal(@id,
 * SIGKILL). Exactly one final event with @id follows: EXITED when the warden has reaped it
 * (whatever killed it), or START_FAILED (and @sock's peer sees EOF). Most callers use the
 * supervisor (conch_super_file_server).
 */
int conch_jail_send_file_server(struct conch_jail *j, int64_t id, int sock, struct conch_err *err);

/*
 * conch_jail_send_js_server - start JS worker @id: as conch_jail_send_file_server, but the
 * worker runs the spec's js_server on @sock (titled conch-js-worker). Same fences, same
 * final event.
 */
int conch_jail_send_js_server(struct conch_jail *j, int64_t id, int sock, struct conch_err *err);

/*
 * conch_jail_upper_open - open the overlay upper dir of @j (host side, through the
 * warden's fd). Returns a new O_RDONLY|O_DIRECTORY fd (caller closes) or -errno.
 */
int conch_jail_upper_open(struct conch_jail *j, struct conch_err *err);
/*
 * conch_jail_mount_upper_open - open the upper dir of @j's extra mount @i (an overlay mount),
 * m<i>/upper beside the workspace's upper (for conch run, in the same detached tmpfs), never
 * through a link. Returns a new O_RDONLY|O_DIRECTORY fd (caller closes) or -errno with @err.
 */
int conch_jail_mount_upper_open(struct conch_jail *j, unsigned i, struct conch_err *err);

/* What the sandbox's processes use right now (the warden excluded). */
struct conch_jail_usage {
    uint64_t processes;
    uint64_t rss_bytes; /* resident sets (shared pages once per process) + tmpfs contents */
};

/*
 * conch_jail_usage - sample @j's processes through the sandbox's own /proc. Used to
 * enforce memory and detect the process limit when no cgroup can be had. Cost grows with
 * the number of processes. Returns 0 or -errno.
 */
int conch_jail_usage(struct conch_jail *j, struct conch_jail_usage *ret);

/*
 * Late attach of a workspace: a caller keeps sandboxes built ahead of need (the daemon's pool,
 * with spec.attachable) and mounts a workspace in one when it is asked for, instead of
 * building a sandbox for it. The sandbox must not have run anything yet.
 *
 * conch_jail_send_attach - mount host dir @workspace (checked to be @ws_dev/@ws_ino when
 * @ws_ino is not 0) at /workspace in @j, as @mode (CONCH_WS_RW is refused: its writes would
 * be bounded by no tmpfs); an overlay's upper is a tmpfs of @disk_bytes. As host root the
 * mount is made here (idmapped, as conch_jail_start does) and handed to the warden; otherwise
 * the warden clones the directory from the host view it kept. Queued in order with what
 * waits to be sent; the warden's answer is a CONCH_JAIL_ANSWER event
 * (conch_jail_take_answer(ATTACH)); the supervisor routes it: conch_super_attach. Returns 0,
 * or -errno with @err (usage: the workspace is not a directory or was replaced) and nothing
 * attached: @j is as it was.
 */
int conch_jail_send_attach(struct conch_jail *j, const char *workspace, dev_t ws_dev, ino_t ws_ino,
                           enum conch_ws_mode mode, uint64_t disk_bytes, struct conch_err *err);

/*
 * A snapshot without a restart (a daemon's sandbox: its upper dir on disk; see
 * docs/ARCHITECTURE.md "Snapshots"). Two steps, each answered by a CONCH_JAIL_ANSWER event
 * (conch_jail_take_answer(RESTACK)); the caller sends nothing else to @j between them.
 *
 * conch_jail_can_restack - whether @j can take them (an overlay workspace, its upper on disk).
 *
 * conch_jail_send_release - once no command, session or file request of @j runs: the warden
 * kills its file workers and its ready shepherd and unmounts /workspace; it refuses (EBUSY,
 * /workspace kept) while any process still has a file or its cwd there, or a mount sits below
 * it (path rules, extra mounts): the caller then restarts the sandbox instead.
 *
 * conch_jail_send_restack - after the release: the overlay of @rs (the host workspace, idmapped
 * as at the start, under @rs->layers and the upper/ and work/ dirs of @rs->upper_dir_fd) is
 * built here, detached, and the warden mounts it at /workspace; unprivileged, the warden
 * builds it itself, from the paths, in its view of the host. Returns 0, or -errno with
 * @err (nothing was sent: /workspace stays unmounted until the caller restarts the sandbox).
 */
struct conch_jail_restack {
    const char *workspace;                 /* the host workspace; must be the one @j has */
    const struct conch_jail_layer *layers; /* frozen layers, top first; borrowed */
    int n_layers;
    int upper_dir_fd;      /* the dir holding upper/ (new, empty) and work/; borrowed */
    const char *upper_dir; /* its path (unprivileged: the warden opens it in its host view) */
};
bool conch_jail_can_restack(const struct conch_jail *j);
int conch_jail_send_release(struct conch_jail *j, struct conch_err *err);
int conch_jail_send_restack(struct conch_jail *j, const struct conch_jail_restack *rs,
                            struct conch_err *err);

/*
 * conch_jail_send_attach_stack - a fork served by a pool sandbox (built attachable, nothing
 * run in it since it was built or made as new): the stack of @rs (as conch_jail_send_restack
 * builds it; @rs->workspace checked to be @ws_dev/@ws_ino when @ws_ino is not 0) attached at
 * its /workspace in one message (JMSG_ATTACH, JATTACH_ON_DISK). @j is then as one built with
 * that workspace and upper dir: restackable, its host workspace open. The answer is a
 * CONCH_JAIL_ANSWER event (conch_jail_take_answer(ATTACH)): conch_super_attach_stack.
 * Returns 0, or -errno with @err and nothing attached.
 */
int conch_jail_send_attach_stack(struct conch_jail *j, const struct conch_jail_restack *rs,
                                 dev_t ws_dev, ino_t ws_ino, struct conch_err *err);

/* What a process that lends a running jail to another (conch_jail_hand_over) tells it,
 * besides the control socket. */
struct conch_jail_lease {
    pid_t warden_pid;
    int upper_fd_nr; /* the upper dir's fd number in the warden, or -1 */
    bool root_mode;
    uint32_t host_id_base;
};

/*
 * conch_jail_hand_over - lend @j to another process: *@ret_ctl is a new channel to the
 * warden (a SOCK_SEQPACKET socket, never @j's control socket), for the borrower (the caller
 * sends it on and closes it). The borrower may run commands and signal them through it, and
 * their events come back on it, not on @j's control socket. When it is done, the caller takes
 * @j back: conch_jail_send_recycle revokes the channel (whoever kept a copy reads EOF, and
 * nothing sent on it reaches the sandbox any more), or destroy @j. One lease at a time: a
 * second hand-over revokes the first.
 */
int conch_jail_hand_over(struct conch_jail *j, struct conch_jail_lease *ret, int *ret_ctl,
                         struct conch_err *err);

/*
 * conch_jail_adopt - a jail lent by another process: @ctl is taken over, @workspace (NULL:
 * none) is opened for the changes and the commit and checked to be @ws_dev/@ws_ino.
 * Destroying it only closes our descriptors: the lender stops the warden. Returns 0 with
 * *@ret, or -errno with @err (@ctl is closed).
 */
int conch_jail_adopt(const struct conch_jail_lease *lease, int ctl, const char *workspace,
                     dev_t ws_dev, ino_t ws_ino, struct conch_jail **ret, struct conch_err *err);

/* conch_jail_destroy - stop the warden (everything inside dies), remove the cgroup and
 * staging, close fds, free @j. NULL is a no-op. Without a cgroup it does not wait for
 * the kernel to finish tearing the namespaces down: the warden may remain a zombie child
 * of the caller until the caller reaps it (waitpid(-1) on SIGCHLD) or exits. */
void conch_jail_destroy(struct conch_jail *j);

#endif
