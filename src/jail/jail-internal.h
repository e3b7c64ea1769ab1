/* jail-internal.h - what the parent prepares for the warden (the plan), and the messages
 * they exchange over the control socket. Shared by spawn.c, jail-ops.c and the *-child.c
 * files. Also what the warden's own files share (see "The warden's state"). */
#ifndef CONCH_JAIL_INTERNAL_H
#define CONCH_JAIL_INTERNAL_H

#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "core/error.h"
#include "jail/jail.h"

/* A running sandbox (opaque outside jail/: see jail.h). */
struct jail_queued;

struct conch_jail {
    pid_t warden_pid;          /* host pid of the warden (PID 1 inside) */
    int ctl_fd;                /* SOCK_SEQPACKET to the warden; owned */
    int host_ws_fd;            /* O_DIRECTORY fd of the host workspace, -1 if none; owned */
    int upper_fd_nr;           /* fd number of the upper dir in the warden, -1 if none */
    bool root_mode;            /* conch runs as host root: id range + idmapped workspace */
    uint32_t host_id_base;     /* root mode: first host id of the sandbox's block */
    struct conch_jail_ids ids; /* the block's claim, when the jail made it (owned) */
    bool as_root;
    bool has_cgroup;         /* limits are enforced by @cg (else rlimits) */
    int ws_tree_fd;          /* root mode: the idmapped workspace for the warden; owned */
    bool mounted_root_stage; /* a staging dir for --rootfs exists */
    char root_stage_dir[256];
    bool mounted_upper_stage; /* a staging dir for the on-disk upper exists */
    char upper_stage_dir[256];
    int n_layer_stages;  /* staging dirs <stage>/<name>-l<i> of the idmapped layers */
    int n_mount_stages;  /* staging dirs <stage>/<name>-m<i> of bind mounts' sources */
    int n_socket_stages; /* staging files <stage>/<name>-s<i> of passed sockets */
    char name[64];
    uid_t ws_owner_uid; /* host owner of the workspace root */
    gid_t ws_owner_gid;
    struct conch_cgroup cg;
    struct conch_seccomp_prog seccomp;      /* commands */
    struct conch_seccomp_prog seccomp_file; /* file workers (openat2 too) */
    struct conch_seccomp_prog seccomp_js;   /* JS workers (no exec, no sockets) */
    bool sync_destroy; /* conch_jail_destroy waits until the namespaces are gone */
    int ptc_fd;        /* the tool bridge's listening socket until taken, else -1; owned */
    int net_fd;        /* the proxy's listening socket until taken, else -1; owned */
    int pidfd;         /* the warden's pidfd, or -1 (no pidfds: valgrind, old kernels); owned */
    /* root mode, attach: the last workspace idmapping (its owner's ids), kept for the next
     * attach (a recycled pool sandbox serves the same workspaces again); -1: none */
    int idmap_fd;
    uid_t idmap_uid;
    gid_t idmap_gid;
    bool restackable; /* an overlay workspace with its upper on disk (conch_jail_can_restack) */
    bool adopted;     /* lent by the process that made it (conch_jail_adopt): its own to stop
                       * and reap; destroying it only closes our fds */
    /* Messages to the warden waiting for room on ctl_fd, oldest first (ctlq.c); owned. */
    struct jail_queued *outq_head, *outq_tail;
    unsigned outq_len;
    void (*on_queued)(void *data); /* called when the queue stops being empty; may be NULL */
    void *on_queued_data;
};

#define JAIL_MAX_BINDS 48
#define JAIL_MAX_LINKS 8

#define JAIL_BIND_SRC_MAX PATH_MAX /* with its NUL; a longer path is cut, as it always was */
#define JAIL_BIND_DST_MAX 128

/* A read-only bind of a host path (as seen before pivot, under /oldroot) at a path inside.
 * Both paths are in the plan's bind_paths, packed (jail_bind_src/jail_bind_dst): a bind with
 * its own PATH_MAX buffer started a new page of the plan each, a page fault in the parent per
 * bind (40 of a conch run's ~360). */
struct jail_bind {
    uint32_t src; /* offset of the host path in jail_plan.bind_paths */
    uint32_t dst; /* offset of the path inside */
    bool is_dir;
    bool rw;
};

struct jail_link {
    char path[128];
    char target[128];
};

/* Everything the child needs, prepared by the parent so the child never allocates. */
struct jail_plan {
    int ctl_fd; /* child's end of the control socket */
    bool root_mode;
    /* identity */
    uid_t warden_uid; /* inside */
    gid_t warden_gid;
    uid_t cmd_uid;
    gid_t cmd_gid;
    bool can_setgroups;
    uint64_t keep_caps; /* capabilities the command keeps (bitmask) */
    /* root filesystem */
    struct jail_bind binds[JAIL_MAX_BINDS];
    uint32_t bind_paths_len;
    /* Where jail_plan_pack (warden-exec.c) stops before the unused rest of bind_paths: keep
     * bind_paths right before n_binds. */
    char bind_paths[JAIL_MAX_BINDS * (JAIL_BIND_SRC_MAX + JAIL_BIND_DST_MAX)];
    int n_binds;
    struct jail_link links[JAIL_MAX_LINKS];
    int n_links;
    bool curated_etc; /* write passwd/group/hosts/hostname into /etc */
    char passwd[512];
    char group[256];
    /* workspace */
    bool has_workspace;
    enum conch_ws_mode ws_mode;
    char ws_lower[PATH_MAX]; /* path of the lower dir, before pivot_root */
    uint64_t tmp_bytes, home_bytes, disk_bytes;
    bool unshare_cgroup;
    /* command fences */
    const struct conch_seccomp_prog *seccomp;      /* commands */
    const struct conch_seccomp_prog *seccomp_file; /* file workers */
    const struct conch_seccomp_prog *seccomp_js;   /* JS workers */
    bool set_rlimit_nproc;
    rlim_t rlimit_nproc;
    bool set_rlimit_as;
    rlim_t rlimit_as;
    rlim_t rlimit_fsize; /* 0: none */
    long pid_max; /* of the sandbox's pid namespace (Linux >= 6.14 keeps one per namespace) */
    struct rlimit rlimit_nofile; /* rlim_cur 0: inherited */
    /* file requests: run in a fenced worker with the request and response fds */
    conch_jail_file_fn file_handler;
    conch_jail_file_serve_fn file_server; /* persistent file workers */
    conch_jail_file_serve_fn js_server;   /* JS workers (JMSG_FILE_SERVE with a = 1) */
    /* workspace upper on disk (persistent) instead of a tmpfs */
    bool upper_on_disk;
    char upper_dir[PATH_MAX]; /* before pivot: contains upper/ and work/ */
    /* frozen layers above ws_lower, before pivot, top first, each followed by ':' ("": none) */
    char ws_layers[4096];
    /* extra mounts: a bind's source before pivot ("/oldroot..."), its target after */
    struct jail_mount {
        int type; /* enum conch_mount_type */
        bool rw;
        uint64_t bytes;
        char src[PATH_MAX];
        char dst[1024];
    } mounts[CONCH_SPEC_MOUNTS_MAX];
    int n_mounts;
    /* path rules in the workspace (conch_jail_spec.rules), sorted by path: a parent first */
    struct jail_rule {
        int kind; /* enum conch_rule_kind */
        char path[CONCH_SPEC_RULE_PATH_MAX];
    } rules[CONCH_SPEC_RULES_MAX];
    int n_rules;
    /* host sockets: bound from an O_PATH open of @src (before pivot) that must be @dev/@ino,
     * the socket the parent checked */
    struct jail_socket {
        char src[PATH_MAX];
        char dst[CONCH_SOCKET_PATH_MAX];
        dev_t dev;
        ino_t ino;
    } sockets[CONCH_SPEC_SOCKETS_MAX];
    int n_sockets;
    /* the tool bridge */
    bool ptc_socket;        /* listen on /run/conch/ptc.sock, hand the fd to the parent */
    char ptc_lib[PATH_MAX]; /* before pivot: bound at /run/conch/lib; "" for none */
    /* a workspace may be attached later (JMSG_ATTACH): unprivileged, the warden keeps a mount
     * namespace that sees the host (see conch_jail_warden_main) */
    bool attachable;
    /* the network (conch_jail_spec.net); HOST: the host's resolv.conf, read by the parent */
    enum conch_net_mode net;
    char resolv[2048];
};

static inline const char *jail_bind_src(const struct jail_plan *plan, const struct jail_bind *b)
{
    return plan->bind_paths + b->src;
}

static inline const char *jail_bind_dst(const struct jail_plan *plan, const struct jail_bind *b)
{
    return plan->bind_paths + b->dst;
}

/* The warden protocol: typed, versioned, fixed-size messages over the SOCK_SEQPACKET control
 * socket (one message per packet, so a reader never sees half of one). Every message carries
 * JAIL_PROTO_VERSION; conch_jail_recv refuses any other, so a daemon and a warden built from
 * different sources cannot misread each other. */
#define JAIL_PROTO_VERSION 0x636f000du /* "co" + version 13 */

enum jail_msg_type {
    JMSG_SETUP_OK = 1, /* warden → parent: a = fd number of the upper dir or -1;
                        * fds [the tool bridge's listening socket] when asked for. The answer
                        * to the setup, a RECYCLE or an ATTACH: they are answered in the order
                        * they were sent, in order with the events. parent → warden, once:
                        * the go-ahead after the id maps; as host root with a workspace, fds
                        * [its idmapped tree] (setup_workspace attaches it) */
    JMSG_SETUP_ERR,    /* warden → parent: err */
    JMSG_RUN,          /* parent → warden: id, timeout_ms, grace_ms;
                        * fds [stdin, stdout, stderr, blob memfd] */
    JMSG_STARTED, /* warden or shepherd → parent: id, a = pid of the command in its pid namespace,
                   * ns = the inode of that pid namespace */
    JMSG_RUN_ERR, /* warden → parent: id, err (could not start); final for @id */
    JMSG_EXITED,  /* warden → parent: id, a = wait status, b = JEXIT_* flags, usage;
                   * final for @id, sent exactly once whatever happened to the shepherd; for
                   * a file worker (FILE, FILE_SERVE) once the warden has reaped it */
    JMSG_SIGNAL,  /* parent → warden: id, a = signal (to every process of it) */
    JMSG_SHUTDOWN,   /* parent → warden: kill everything and exit */
    JMSG_FILE,       /* parent → warden: id, timeout_ms; fds [request memfd, response pipe] */
    JMSG_FILE_SERVE, /* parent → warden: id; fds [stream socket]: a persistent file worker
                        (a = 1: a JS worker) */
    JMSG_RECYCLE,    /* parent → warden: kill every process, renew the namespaces and the
                      * writable mounts (a sandbox without a workspace, for its next user);
                      * answered by SETUP_OK or SETUP_ERR as a new sandbox's setup is */
    JMSG_ATTACH,     /* parent → warden: mount a workspace at /workspace (a sandbox that has
                      * run nothing yet): a = conch_ws_mode, bytes = the overlay upper's size;
                      * fds [workspace dir] (the warden clones it from its host view), or with
                      * JATTACH_MOUNTED [the mount to attach, the overlay's upper dir or none]
                      * (made by a parent that is host root), or with JATTACH_PATHS as
                      * JRESTACK_PATHS; JATTACH_ON_DISK: a fork's stack, its upper on disk;
                      * answered by SETUP_OK (a = fd number of the upper dir or -1) or
                      * SETUP_ERR */
    JMSG_LEASE,      /* parent → warden: fds [a new channel for a borrower] (see lease_ctl in
                      * warden-child.c): RUN and SIGNAL may come on it, and the events of the
                      * commands started through it go back on it; the recycle closes it.
                      * warden → shepherd, after a RUN: fds [the channel its command came on,
                      * when it is not the one the shepherd was built with] */
    JMSG_ID_MAP_FDS, /* clone child → parent, before the exec of a clean image: fds
                      * [setgroups, uid_map, gid_map] of its /proc/self, opened for writing */
    JMSG_RESTACK,    /* parent → warden, a snapshot without a restart (a daemon's sandbox with
                      * its upper dir on disk, nothing running): a = JRESTACK_RELEASE: kill the
                      * file workers and the ready shepherd, unmount /workspace (refused, and
                      * /workspace kept, while anything holds it); a = JRESTACK_MOUNT: fds [the
                      * new overlay (made by a parent that is host root), its upper dir]
                      * mounted at /workspace, or with JRESTACK_PATHS its layers' paths (the
                      * warden builds it). Answered by SETUP_OK (a = fd number of the
                      * upper dir or -1) or SETUP_ERR */
};

/* JMSG_RESTACK steps (in a) */
#define JRESTACK_RELEASE 0
#define JRESTACK_MOUNT 1
/* JRESTACK_MOUNT from an unprivileged parent (in b): fds [a memfd of the paths, the host
 * workspace dir]: the warden builds the overlay in its view of the host (see restack_build) */
#define JRESTACK_PATHS 1u

/* JMSG_ATTACH flags (in b) */
#define JATTACH_MOUNTED 1u
/* fds [a memfd of the paths, the host workspace dir], as JRESTACK_PATHS: the warden builds
 * the stack in its view of the host (unprivileged, with JATTACH_ON_DISK) */
#define JATTACH_PATHS 2u
/* a fork's stack: the upper dir is on disk, kept as a built sandbox's is (restackable) */
#define JATTACH_ON_DISK 4u

/* JMSG_EXITED flags */
#define JEXIT_TIMED_OUT 1u /* the warden's deadline fired (SIGTERM, then SIGKILL after grace) */
#define JEXIT_LOST 2u      /* the shepherd died before reporting: the status is synthetic */

/* JMSG_RUN flags (in b) */
/* A session: the command gets a new pty of the sandbox's devpts as its controlling terminal
 * and stdio; fds [unix socket, unused, unused, blob] (see conch_jail_cmd.pty). */
#define JRUN_PTY 1u
/* The sandbox's last command: no spare shepherd after it. */
#define JRUN_LAST 2u

struct jail_msg {
    uint32_t version; /* JAIL_PROTO_VERSION; set by conch_jail_send */
    uint32_t type;
    int32_t a;
    uint32_t b;
    int64_t id; /* the command (or file request) this message is about */
    uint64_t timeout_ms, grace_ms;
    uint64_t ns;
    uint64_t bytes;
    struct rusage usage;
    struct conch_err err;
};

/* The command blob in a memfd: header then argv strings, env strings, cwd, NUL-separated. */
/* The resource limits a command may take from its caller (RLIMIT_CPU .. RLIMIT_RTTIME). */
#define JAIL_RLIMITS 16
#define JBLOB_CALLER 1u /* apply the caller's umask, nice value and resource limits */

struct jail_cmd_blob {
    uint32_t argc;
    uint32_t envc;
    uint32_t size;  /* total bytes including this header */
    uint32_t flags; /* JBLOB_* */
    /* JBLOB_CALLER: what the calling process had, applied before the exec: the umask as it
     * is, the nice value and each limit only where they are stricter than the command's own
     * (a process can always lower its limits and raise its nice value, never the reverse). */
    uint32_t umask;
    int32_t nice;
    struct {
        uint64_t cur, max;
    } rlim[JAIL_RLIMITS];
};

/* conch_jail_warden_main - the warden, in the clean image (conch_jail_warden_entry): set up, then
 * serve the control socket (@plan->ctl_fd). Never returns. */
__attribute__((noreturn)) void conch_jail_warden_main(const struct jail_plan *plan);

/* The warden's state: one process, single-threaded, so nothing here needs a lock. Shared by
 * its files: warden-child.c (setup, the main loop, slots, deadlines, the lease channel,
 * recycle, attach) and shepherd-child.c (starting shepherds, the command's process and file
 * workers). */
#define JAIL_MAX_PROCS 1024

/* What a shepherd leaves for the warden: written by the shepherd just before it exits, read
 * by the warden after reaping it (so no lock is needed). A shepherd that dies before writing
 * leaves SHEP_NONE or SHEP_STARTED, and the warden reports a synthetic end. */
enum { SHEP_NONE = 0, SHEP_STARTED, SHEP_START_FAILED, SHEP_EXITED, SHEP_EXIT_SENT };
struct jail_shep_report {
    int32_t state;
    int32_t status;       /* SHEP_EXITED: the command's wait status */
    int32_t timed_out;    /* written by the warden when the deadline fires, before it signals */
    int32_t cpu;          /* the CPU the command's process exec'd on, -1: not yet */
    int32_t started_sent; /* the warden reported STARTED itself (before handing RUN over) */
    uint64_t ns_ino;      /* the shepherd's pid namespace, once its /proc is up; 0: not yet */
    uint64_t sig_req;     /* signals (bit n-1: signal n) the warden asks it to send, see
                           * conch_jail_ctl_signal */
    int32_t chan_update;  /* the warden sends the command's channel after the RUN (JMSG_LEASE):
                           * it is not the one the shepherd was built with */
    struct conch_err err;
};

/* The warden's record of one process it started: a shepherd (command, job) or a file
 * worker. Deadlines are the warden's: they hold whatever the parent or the command does. */
struct jail_proc_slot {
    int64_t id;
    pid_t pid;    /* 0: free */
    int sock;     /* a shepherd waiting for its command: the warden's end of its socket */
    bool ready;   /* a shepherd started ahead of need, no command yet */
    bool retired; /* a ready one left unused (attach): never given a command, reaped silently */
    bool is_file;
    bool timed_out;
    bool killed;          /* the warden sent SIGKILL itself */
    uint64_t deadline_ms; /* monotonic; 0: none */
    uint64_t kill_at_ms;  /* SIGKILL after the grace; 0: not armed */
    uint64_t grace_ms;
    uint32_t chan; /* the channel its request came on: its events go there */
    uint32_t
        shep_chan; /* the channel a shepherd was built with (inherited, see conch_jail_chan_now) */
};

struct conch_jail_warden {
    struct jail_proc_slot slots[JAIL_MAX_PROCS];
    struct jail_shep_report *reports; /* MAP_SHARED, JAIL_MAX_PROCS entries */
    int ready_slot;                   /* the shepherd started ahead of need, or -1 */
    int ready_failures;
    /* When the next ready shepherd may be started (monotonic µs; 0: now). Building one right
     * after a command took the last would hold the CPU that the command's own shepherd was
     * just woken on: the command would wait for it. So the refill waits until the command has
     * had time to reach its exec (REFILL_DELAY_US, shepherd-child.c), then runs beside it. */
    uint64_t refill_after_us;
    /* The CPUs we may run on, and the slot of the last command started: a refill that finds
     * itself on the CPU that command exec'd on moves to another for the build (see
     * conch_jail_ensure_ready). */
    cpu_set_t cpus;
    bool cpus_known;
    bool refill_never; /* the last command was started (JRUN_LAST): no more spares */
    int last_cmd_slot;
    /* Unprivileged and attachable: a mount namespace that sees the host, where a workspace is
     * cloned from when one is attached (attach()). Only we hold it: everything we fork closes
     * it. */
    int host_view;
    /* Attachable: our empty /workspace is a shared mount, and every shepherd's copy of it a
     * slave, so that a workspace attached over it appears in the ready shepherd's namespace
     * too (see spawn_shepherd). With an upper dir on disk (a daemon's sandbox) the overlay is
     * shared the same way, so that unmounting it for a snapshot (JMSG_RESTACK) takes it out of
     * every shepherd's namespace too. False where the kernel refused (the ready one is then
     * rebuilt). */
    bool ws_shared;
    int ws_tree;      /* root mode: the idmapped workspace from the parent until attached, or -1 */
    bool ws_attached; /* a workspace was attached (until the recycle) */
    bool ws_released; /* JRESTACK_RELEASE unmounted /workspace; JRESTACK_MOUNT comes next */
    bool ws_on_disk;  /* a fork's stack was attached (JATTACH_ON_DISK): restackable */
};

/* The warden's state (warden-child.c). */
extern struct conch_jail_warden conch_jail_warden;

/* conch_jail_chan_fd - the fd of the warden's channel @chan (0: the parent's control socket, else
 * a lease's), or -1 when that channel is revoked. conch_jail_chan_now - the channel a process
 * forked now inherits and reports on, before it is told otherwise. (warden-child.c) */
int conch_jail_chan_fd(uint32_t chan);
uint32_t conch_jail_chan_now(void);

/* conch_jail_chan_send - send event @m on channel @chan. On the parent's control socket as ever
 * (blocking; a failure, returned as -errno, means the parent is gone). A borrower never
 * blocks us: one that does not read, or went away, loses its channel (and the event); a
 * channel revoked drops it; both return 0. (warden-child.c) */
int conch_jail_chan_send(uint32_t chan, struct jail_msg *m);

/* conch_jail_reset_signals - every signal's disposition back to the default, none blocked.
 * (warden-child.c) */
void conch_jail_reset_signals(void);

/* conch_jail_lower_rlimit - set resource @res to at most @cur/@max, never above what the process
 * has now. Returns 0 or -errno. (shepherd-child.c) */
int conch_jail_lower_rlimit(int res, rlim_t cur, rlim_t max);

/* conch_jail_ctl_signal - the signal the warden sends a shepherd to make it read its requests
 * (sig_req in its report). (shepherd-child.c) */
int conch_jail_ctl_signal(void);

/* conch_jail_ensure_ready - keep one shepherd ready for the next command, when it is time (see
 * refill_after_us) and starting them has not failed too often. (shepherd-child.c) */
void conch_jail_ensure_ready(const struct jail_plan *plan);

/* conch_jail_start_command - start RUN @m (with its @nfds fds, borrowed) that came on channel
 * @chan: hand it to the ready shepherd, or start one now. Returns 0 (its events follow on
 * @chan), or -1 with @reply's error filled. (shepherd-child.c) */
int conch_jail_start_command(const struct jail_plan *plan, const struct jail_msg *m, int *fds,
                             int nfds, struct jail_msg *reply, uint32_t chan);

/* conch_jail_start_file_worker - start a file worker for FILE or FILE_SERVE @m (with its @nfds fds,
 * borrowed) in a free slot. Returns 0, or -1 with @reply's error filled. (shepherd-child.c) */
int conch_jail_start_file_worker(const struct jail_plan *plan, const struct jail_msg *m, int *fds,
                                 int nfds, struct jail_msg *reply);

/* A daemon's wardens start from a clean image, as crun, bubblewrap and nsjail start theirs:
 * the child of clone() is a copy of the daemon (threadpool workers, one of which may hold the
 * malloc lock; a heap holding every other sandbox's data), so it does nothing but exec a copy
 * of the conch binary (warden-exec.c), which finds the plan in a sealed memfd. */
#define JAIL_WARDEN_ARGV0 "conch-warden"
#define JAIL_WARDEN_PLAN_ARG "--plan-fd"
#define JAIL_WARDEN_CTL_FD 3  /* the control socket, in the new image */
#define JAIL_WARDEN_PLAN_FD 4 /* the plan's memfd, until the warden has mapped it */

/* What the clone child needs for the exec, prepared by the parent (nothing is allocated in
 * the child). */
struct jail_exec {
    int ctl_fd;        /* the child's end of the control socket */
    int plan_fd;       /* the sealed plan (conch_jail_plan_pack) */
    int exe_fd;        /* the wardens' image (conch_jail_clean_image) */
    char *const *argv; /* {JAIL_WARDEN_ARGV0, JAIL_WARDEN_PLAN_ARG, "4", NULL} */
    char *const *envp; /* the sanitizers' options only, when the caller has them */
    /* Send our /proc/self/{setgroups,uid_map,gid_map}, opened for writing, to the parent
     * (JMSG_ID_MAP_FDS) before the exec: an unprivileged parent may not open them once the
     * exec of the unreadable image has made us non-dumpable. */
    bool send_id_map_fds;
    /* Set by conch_jail_warden_clone: the highest fd the child keeps when it leaves the fd
     * table it shares with us (-1: it was copied at the clone). */
    int fd_top;
};

/* conch_jail_warden_clone - clone the warden in new user and pid namespaces, every signal
 * already blocked by the caller. With @x (a daemon, whose wardens are exec'd from its clean
 * image): CLONE_VFORK, and the child runs conch_jail_warden_exec_child and never returns; we
 * go on once it has exec'd or died. Its fds travel in the slots held since
 * conch_jail_clean_image_prepare, the clone shares our fd table (CLONE_FILES) and the child
 * keeps a copy of the slots and what is below them only (close_range's
 * CLOSE_RANGE_UNSHARE): a daemon with 1,000 sandboxes holds 4,000 fds, each of which a copied
 * table references at the clone and closes at the exec. Without @x (conch run): a plain
 * clone, which returns 0 in the child. Returns the child's pid, or -1 with errno. (exec-child.c) */
long conch_jail_warden_clone(struct jail_exec *x);

/* conch_jail_spawn_slots - the three fd numbers held on /dev/null since
 * conch_jail_clean_image_prepare (low: taken first thing), in @slots, and a /dev/null fd to put
 * back in them; false when there are none. (warden-exec.c) */
bool conch_jail_spawn_slots(int slots[3], int *devnull);

/* conch_jail_warden_exec_child - the child after clone(CLONE_VFORK), in its new user and pid
 * namespaces: put the control socket at fd 3 and the plan at fd 4, close every other fd, keep
 * the namespace's capabilities across the exec (ambient: the exec runs before the parent has
 * written the id maps, as an id that is not the namespace's root) and exec the wardens'
 * image. Every signal stays blocked (the parent blocked them around the clone) until the new
 * image has reset their dispositions. On failure sends SETUP_ERR and exits. No allocation.
 * (exec-child.c) */
__attribute__((noreturn)) void conch_jail_warden_exec_child(const struct jail_exec *x);

/* conch_jail_clean_image_prepare - copy the running binary (/proc/self/exe: the file we run, even
 * if its path was replaced since) into a sealed, execute-only memfd that every warden is exec'd
 * from; once per process (a daemon, at start). Returns 0 or -errno with @err.
 * conch_jail_clean_image - that memfd, or -1 when there is none (the caller's wardens are then
 * plain clones: `conch run`, single-threaded, holding only its own data). (warden-exec.c) */
int conch_jail_clean_image_prepare(struct conch_err *err);
int conch_jail_clean_image(void);

/* conch_jail_plan_pack - @plan (with its seccomp programs and file handlers) in a new sealed memfd,
 * flat: the plan's bytes, its programs after it, the handlers as offsets within the conch
 * image (the new image is the same file, so they are the same functions there). Returns the
 * memfd (O_CLOEXEC) or -errno with @err. (warden-exec.c) */
int conch_jail_plan_pack(const struct jail_plan *plan, struct conch_err *err);

/* conch_jail_mounts_setup_child - build the sandbox root per @plan and pivot into it. On success
 * *@ret_upper_fd is the upper dir (or -1), *@ret_ptc_fd the tool bridge's listening socket
 * (or -1). Returns 0 or -errno with @err. No allocation. */
int conch_jail_mounts_setup_child(const struct jail_plan *plan, int *ret_upper_fd, int *ret_ptc_fd,
                                  struct conch_err *err);

/* conch_jail_session_pty_setup_child - in a session's shell, after setsid(): open a new pty of the
 * sandbox's devpts and make it the controlling terminal; send its master over @fds[0] (a unix
 * socket to the daemon), keep that socket as fd 62 (inherited by the shell's exec), and put the
 * pty's slave in @fds[0..2] for the stdio setup. Returns 0 or -1 with errno. No allocation.
 * (session-child.c) */
int conch_jail_session_pty_setup_child(int fds[4]);

/* conch_jail_send / conch_jail_recv - one message over the control socket, with up to @nfds fds.
 * conch_jail_send stamps the protocol version; conch_jail_recv returns -EPROTO for a message of
 * another version or size (its fds are closed), 0 at EOF, 1 with a message. @flags: MSG_DONTWAIT.
 */
int conch_jail_send(int fd, struct jail_msg *m, const int *fds, int nfds);

/* The most fds one message carries (JMSG_RUN: stdin, stdout, stderr, the command blob). */
#define JAIL_MSG_MAX_FDS 4
/* The most messages that wait for room on a warden's control socket: beyond, -ENOBUFS. */
#define JAIL_OUTQ_MAX 1024

/* conch_jail_ctl_send - send @m (with @fds, borrowed) to @j's warden without blocking, in order
 * with the messages already queued: when the socket is full, or others wait, a copy (the fds
 * dup'd) joins the queue that conch_jail_flush() empties. Returns 0 (sent or queued),
 * -ENOBUFS when JAIL_OUTQ_MAX messages already wait, or another -errno (nothing queued). */
int conch_jail_ctl_send(struct conch_jail *j, struct jail_msg *m, const int *fds, int nfds);
/* conch_jail_ctl_queue_clear - drop every queued message, closing its fds. */
void conch_jail_ctl_queue_clear(struct conch_jail *j);
int conch_jail_recv(int fd, struct jail_msg *m, int *fds, int max_fds, int *ret_nfds, int flags);
/* conch_jail_event_from_msg - the event or answer @m of the warden (with @fds, taken: a setup
 * answer keeps those JSETUP_* names, the rest are closed) in *@ret. False for a message that is
 * neither (@fds then stay the caller's). (jail-ops.c) */
bool conch_jail_event_from_msg(const struct jail_msg *m, int *fds, int nfds,
                               struct conch_jail_event *ret);
/* JMSG_SETUP_OK's b: which fds came with it, in this order. */
#define JSETUP_PTC 1u
#define JSETUP_NET 2u

/* conch_jail_rules_apply_child - the plan's path rules over the mounted /workspace: each
 * read-only path bound onto itself read-only, each hidden path covered by an empty read-only
 * mount of mode 000, each dir between /workspace and a rule path bound onto itself (a mount
 * point cannot be renamed or removed). Runs in the warden before the root turns read-only,
 * no allocation. (rules-child.c) */
int conch_jail_rules_apply_child(const struct jail_plan *plan, struct conch_err *err);

/* conch_jail_mounts_scrub_child - make a sandbox without a workspace as new for its next user,
 * once every process but the warden is gone: every mount a command can write (/tmp,
 * /home/agent, /dev/shm, /dev/pts, /workspace) is replaced by a new, empty one. The rest of
 * the tree is read-only to commands. Runs in the warden. */
int conch_jail_mounts_scrub_child(const struct jail_plan *plan, struct conch_err *err);

/* conch_jail_overlay_make - a detached overlay mount over @lower (a detached or private mount of
 * the workspace dir) with its upper in a new detached tmpfs of @bytes; the upper dir gets
 * @uid/@gid/@mode (the workspace root's, as the sandbox sees them). Returns 0 with *@ret_mnt
 * (the overlay) and *@ret_upper (its upper dir), or -errno with @err. No allocation: the
 * warden and a root parent both use it. */
int conch_jail_overlay_make(int lower, uid_t uid, gid_t gid, mode_t mode, uint64_t bytes,
                            int *ret_mnt, int *ret_upper, struct conch_err *err);

/* conch_jail_restack_build_child - in the warden, unprivileged (JRESTACK_PATHS): build a
 * snapshot's new overlay detached, in the warden's view of the host, from the paths in memfd
 * @blob (the frozen layers top first, the workspace, "", the upper dir, the work dir; each
 * NUL-terminated), the workspace checked to be the dir @ws is. Returns 0 with *@ret_mnt and
 * *@ret_upper (its upper dir), or -errno with @err. No allocation. (restack-child.c) */
int conch_jail_restack_build_child(int blob, int ws, int *ret_mnt, int *ret_upper,
                                   struct conch_err *err);

/* conch_jail_proc_mount_child - mount a new procfs on /proc for the caller's pid namespace and,
 * with @mask, mask it (kcore, sysrq-trigger, ... on @devnull; /proc/sys and friends
 * read-only). Used by the warden at setup and by each shepherd in its own mount namespace
 * (always masked). @pid_max > 0: first set the namespace's pid_max (best effort: before Linux
 * 6.14 it is global and the write fails), which bounds its processes whatever their uids. No
 * allocation. */
int conch_jail_proc_mount_child(const char *devnull, long pid_max, bool mask,
                                struct conch_err *err);

/* conch_jail_open_workspace - open @path as @j's host workspace (host_ws_fd, its owner's ids;
 * *@ret_st when not NULL), refusing a directory other than @dev/@ino when @ino is not 0: one
 * that replaced it, or a link swapped in. Returns 0 or -errno with @err (usage). (spawn.c) */
int conch_jail_open_workspace(struct conch_jail *j, const char *path, dev_t dev, ino_t ino,
                              struct stat *ret_st, struct conch_err *err);

/* Parent-side helpers in userns.c. */
/* @host_id_base: root mode's host id block (see conch_jail_spec). @map_fds: NULL, or the
 * child's setgroups, uid_map and gid_map opened for writing (JMSG_ID_MAP_FDS), written
 * instead of /proc/@pid's. */
int conch_jail_write_id_maps(pid_t pid, bool root_mode, uint32_t host_id_base, bool as_root,
                             uid_t outer_uid, gid_t outer_gid, const int *map_fds,
                             struct conch_err *err);
int conch_jail_idmapped_tree(const char *path, uint32_t host_id_base, bool whole_range,
                             uid_t owner_uid, gid_t owner_gid, bool read_only,
                             struct conch_err *err);
/* The two halves of conch_jail_idmapped_tree: the idmapping's user namespace (an fd; it costs a
 * fork), and a clone of @path idmapped through it. */
int conch_jail_idmap_userns(uint32_t base, bool whole_range, uid_t inner_uid, gid_t inner_gid,
                            struct conch_err *err);
/* conch_jail_idmap_userns_shift - a user namespace mapping the host id block at @from onto the
 * one at @to (CONCH_HOST_ID_COUNT ids, uids and gids): a frozen layer written by one sandbox
 * is seen by another with its own ids. Returns an fd. */
int conch_jail_idmap_userns_shift(uint32_t from, uint32_t to, struct conch_err *err);
int conch_jail_idmapped_tree_in(const char *path, int userns, bool whole_range, bool read_only,
                                struct conch_err *err);
/* Where a root parent stages what the sandbox's ids could not reach (in its own private mount
 * namespace, which every sandbox's copies). conch_jail_stage_prepare - make that namespace and
 * the staging tmpfs, once per process. (spawn.c) */
#define CONCH_JAIL_STAGE_ROOT "/run/conch/stage"
int conch_jail_stage_prepare(struct conch_err *err);

/* conch_jail_sockets_plan - open each of @spec's sockets (conch_socket_open), and put into
 * @plan what the warden binds: the host path it opens (as root, a staged, idmapped clone of
 * exactly the file opened: <stage>/<name>-s<i>, counted in j->n_socket_stages) and the
 * identity it must find there. (sockets.c) */
int conch_jail_sockets_plan(struct conch_jail *j, const struct conch_jail_spec *spec,
                            struct jail_plan *plan, struct conch_err *err);
/* conch_jail_sockets_setup_child - bind the plan's sockets, last before the root turns
 * read-only; no allocation. (mounts-child.c) */
int conch_jail_sockets_setup_child(const struct jail_plan *plan, struct conch_err *err);

/* conch_jail_stage_attach - move_mount detached mount @tree_fd onto @dir (over what is there). No
 * allocation: the warden attaches a workspace with it too. */
int conch_jail_stage_attach(int tree_fd, const char *dir, struct conch_err *err);

#endif
