/* warden-child.c - the warden: PID 1 of the sandbox. It finishes the sandbox setup, then
 * serves the control socket: starts each command under a shepherd (PID 1 of a pid namespace
 * of the command's own, so that killing it kills the command's every process at once),
 * enforces deadlines, forwards signals, reaps, and sends every command exactly one final
 * event whatever happened to its shepherd. When the warden exits, the kernel kills
 * everything left in its pid namespace. Runs in the child after clone(): no allocation, no
 * stdio. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/mount.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <grp.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fdpass.h"
#include "core/proctitle.h"
#include "jail/jail-internal.h"
#include "jail/landlock.h"
#include "jail/seccomp.h"

#define MAX_ARGS 4096

static int loopback_up(struct conch_err *err)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return conch_err_set(err, errno, "socket for loopback: %s", strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strcpy(ifr.ifr_name, "lo");
    int r = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (r == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        r = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(s);
    if (r < 0)
        return conch_err_set(err, e, "bring up loopback in the network namespace: %s", strerror(e));
    return 0;
}

/* Drop every capability but @keep from the bounding and ambient sets; needs
 * CAP_SETPCAP, so it runs before the identity switch. */
static int drop_bounding_caps(uint64_t keep)
{
    for (int cap = 0; cap <= 63; cap++) {
        if (keep & (1ULL << cap))
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return -errno;
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    return 0;
}

/* Leave only @keep in the permitted and effective sets (none inheritable). */
static int drop_caps(uint64_t keep)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    data[0].effective = data[0].permitted = (uint32_t)keep;
    data[1].effective = data[1].permitted = (uint32_t)(keep >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -errno;
    return 0;
}

/* Exec @file, looking it up in @path (colon-separated) when it has no slash, like execvp
 * but with the command's PATH rather than the warden's. */
static void exec_in_path(const char *file, char *const *argv, char *const *envp, const char *path)
{
    if (strchr(file, '/')) {
        execve(file, argv, envp);
        return;
    }
    int saved = ENOENT;
    char buf[4096];
    size_t flen = strlen(file);
    for (const char *p = path; p && *p;) {
        const char *colon = strchr(p, ':');
        size_t dlen = colon ? (size_t)(colon - p) : strlen(p);
        if (dlen + 1 + flen + 1 <= sizeof(buf)) {
            memcpy(buf, p, dlen);
            if (dlen == 0)
                buf[dlen++] = '.';
            buf[dlen] = '/';
            memcpy(buf + dlen + 1, file, flen + 1);
            execve(buf, argv, envp);
            if (errno != ENOENT && errno != ENOTDIR)
                saved = errno;
        }
        if (!colon)
            break;
        p = colon + 1;
    }
    errno = saved;
}

/* Set resource @res to at most @cur/@max, never above what the process has now: a limit can
 * always be lowered, and the caller's own (`ulimit -u 500` before `conch run`) stays the
 * bound, as it would for any program it starts. Returns 0 or -errno. */
static int lower_rlimit(int res, rlim_t cur, rlim_t max)
{
    struct rlimit now;
    if (getrlimit(res, &now) < 0)
        return -errno;
    struct rlimit want = {cur < now.rlim_cur ? cur : now.rlim_cur,
                          max < now.rlim_max ? max : now.rlim_max};
    if (want.rlim_cur > want.rlim_max)
        want.rlim_cur = want.rlim_max;
    if (want.rlim_cur == now.rlim_cur && want.rlim_max == now.rlim_max)
        return 0;
    return setrlimit(res, &want) < 0 ? -errno : 0;
}

/* What a command may write beneath (Landlock); the first entry is the workspace. */
static const char *const writable_paths[] = {"/workspace", "/tmp", "/home/agent", "/dev",
                                             "/proc",      "/run", NULL};
static const char *const workspace_path[] = {"/workspace", NULL};

/* Apply every fence of a command to the calling process: rlimits, identity, capabilities,
 * no_new_privs, Landlock, seccomp. On failure returns -errno with *@step naming what failed.
 * Run after the fds are in place: Landlock checks rights at open time. With @ret_ruleset,
 * Landlock is prepared but not applied: the ruleset, with every rule but the workspace's, is
 * left in *@ret_ruleset (-1 when the kernel has none) for conch_landlock_finish_child to add
 * the workspace's rule and apply, once the workspace is mounted (see spawn_shepherd). */
static int fence_self(const struct jail_plan *plan, const struct conch_seccomp_prog *seccomp,
                      const char **step, int *ret_ruleset)
{
    *step = "set resource limits";
    int r;
    if ((r = lower_rlimit(RLIMIT_CORE, 0, 0)) < 0)
        return r;
    if (plan->set_rlimit_nproc &&
        (r = lower_rlimit(RLIMIT_NPROC, plan->rlimit_nproc, plan->rlimit_nproc)) < 0)
        return r;
    /* A daemon raises its own open-files limit; its commands get the usual one back. */
    if (plan->rlimit_nofile.rlim_cur &&
        (r = lower_rlimit(RLIMIT_NOFILE, plan->rlimit_nofile.rlim_cur,
                          plan->rlimit_nofile.rlim_max)) < 0)
        return r;
    if (plan->rlimit_fsize &&
        (r = lower_rlimit(RLIMIT_FSIZE, plan->rlimit_fsize, plan->rlimit_fsize)) < 0)
        return r;
    if (plan->set_rlimit_as && (r = lower_rlimit(RLIMIT_AS, plan->rlimit_as, plan->rlimit_as)) < 0)
        return r;
    /* The bounding set was cut to @plan->keep_caps by the warden, once for all. */
    *step = "switch to the command's identity";
    if (plan->can_setgroups && setgroups(0, NULL) < 0)
        return -errno;
    if (setresgid(plan->cmd_gid, plan->cmd_gid, plan->cmd_gid) < 0)
        return -errno;
    if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
        return -errno;
    if (setresuid(plan->cmd_uid, plan->cmd_uid, plan->cmd_uid) < 0)
        return -errno;
    *step = "drop capabilities";
    if ((r = drop_caps(plan->keep_caps)) < 0)
        return r;
    *step = "set no_new_privs";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -errno;
    *step = "apply Landlock";
    if (ret_ruleset)
        r = conch_landlock_prepare_child(writable_paths + 1, ret_ruleset);
    else
        r = conch_landlock_apply_child(writable_paths);
    if (r < 0)
        return r;
    *step = "install seccomp filter";
    if (seccomp && (r = conch_seccomp_install_child(seccomp)) < 0)
        return r;
    return 0;
}

/* fork() as a bare clone: we are single-threaded and have no handlers (reset_signals), so
 * nothing runs in the child but what it calls; no atfork handler of a library either. */
static pid_t raw_fork(void)
{
    return (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, 0);
}

static void reset_signals(void)
{
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* An OOM kill in the sandbox's memory cgroup (or on the host) must pick a command, not the
 * warden or a shepherd, whose death would stop the sandbox: commands and file workers raise
 * their own oom_score_adj to the top (raising needs no privilege; lowering the warden's would
 * need CAP_SYS_RESOURCE, which a container's root may lack). The shepherd made its memory
 * non-dumpable, which makes /proc/self ours no longer: dumpable for the write, then not
 * again, since a command's process shares its shepherd's memory until it execs (execve sets
 * it anew from the command's credentials). */
static void oom_score_raise(void)
{
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "1000", 4) < 0) {
            /* best effort */
        }
        close(fd);
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

/* What the command's process leaves for its shepherd. It is a CLONE_VM child: it shares the
 * shepherd's memory, and the shepherd waits (on the gate, see command_zygote) until it has
 * exec'd or exited before it reads this or touches anything else, so no lock is needed. */
struct zygote_out {
    struct jail_msg run; /* the RUN it took (id, flags), once got_run */
    bool got_run;
    bool failed; /* it exits instead of exec'ing: @err says why */
    struct conch_err err;
    int32_t *cpu; /* in the warden's shared reports: the CPU it execs on */
    /* What it mapped in the shared memory (the command's argv/env/cwd and the vectors
     * into it), for the shepherd to unmap: an execve leaves them in the shepherd's. */
    void *blob, *vec;
    size_t blob_len, vec_len;
};

/* The command's process runs on a stack of its shepherd's (command_zygote) until it execs:
 * AddressSanitizer, which knows only the thread's own stack, warns at every noreturn call
 * there and, logging to a file the sandbox cannot see, dies of it (exit 1 instead of a start
 * failure's 127). Its functions are left uninstrumented; what they call is not. */
#define ON_ZYGOTE_STACK __attribute__((no_sanitize_address))

/* Leave @err for the shepherd and exit 127. */
ON_ZYGOTE_STACK __attribute__((noreturn)) static void command_fail(struct zygote_out *out,
                                                                   const struct conch_err *err)
{
    out->err = *err;
    out->failed = true;
    _exit(127);
}

/* The command, once it is known: map its argv/env/cwd blob, take its stdio, exec. Runs in a
 * child that is already fenced (command_zygote). On failure leaves the error in @out and
 * exits 127. */
ON_ZYGOTE_STACK __attribute__((noreturn)) static void command_exec(int fds[4],
                                                                   struct zygote_out *out, bool pty)
{
    struct conch_err err = {0};
    const char *step = "map command";

    struct stat st;
    if (fstat(fds[3], &st) < 0)
        goto fail_errno;
    char *blob = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fds[3], 0);
    if (blob == MAP_FAILED)
        goto fail_errno;
    out->blob = blob;
    out->blob_len = (size_t)st.st_size;
    const struct jail_cmd_blob *hdr = (const struct jail_cmd_blob *)blob;
    if ((size_t)st.st_size < sizeof(*hdr) || hdr->size < sizeof(*hdr) || hdr->argc == 0 ||
        hdr->argc + hdr->envc + 2 > MAX_ARGS || hdr->size > st.st_size) {
        errno = E2BIG;
        goto fail_errno;
    }
    char **vec = mmap(NULL, MAX_ARGS * sizeof(char *), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (vec == MAP_FAILED)
        goto fail_errno;
    out->vec = vec;
    out->vec_len = MAX_ARGS * sizeof(char *);
    char *p = blob + sizeof(*hdr);
    char *end = blob + hdr->size;
    char **argv = vec, **envp = vec + hdr->argc + 1;
    for (uint32_t i = 0; i < hdr->argc; i++) {
        argv[i] = p;
        p += strnlen(p, (size_t)(end - p)) + 1;
    }
    argv[hdr->argc] = NULL;
    const char *path = "/usr/local/bin:/usr/bin:/bin";
    for (uint32_t i = 0; i < hdr->envc; i++) {
        envp[i] = p;
        if (!strncmp(p, "PATH=", 5))
            path = p + 5;
        p += strnlen(p, (size_t)(end - p)) + 1;
    }
    envp[hdr->envc] = NULL;
    const char *cwd = p < end && *p ? p : "/";
    if (p >= end) {
        errno = EINVAL;
        goto fail_errno;
    }

    step = "new session";
    if (setsid() < 0)
        goto fail_errno;
    if (hdr->flags & JBLOB_CALLER) {
        step = "take the caller's resource limits";
        umask((mode_t)hdr->umask & 0777);
        for (int res = 0; res < JAIL_RLIMITS; res++) {
            int r = lower_rlimit(res, (rlim_t)hdr->rlim[res].cur, (rlim_t)hdr->rlim[res].max);
            if (r < 0) {
                errno = -r;
                goto fail_errno;
            }
        }
        step = "take the caller's nice value";
        errno = 0;
        int nice = getpriority(PRIO_PROCESS, 0);
        if (!errno && hdr->nice > nice && hdr->nice < 20 &&
            setpriority(PRIO_PROCESS, 0, hdr->nice) < 0)
            goto fail_errno;
    }
    if (pty && jail_session_pty_setup_child(fds) < 0)
        goto fail_errno;
    step = "set up stdio";
    for (int i = 0; i < 3; i++) {
        if (fds[i] == i) {
            if (fcntl(i, F_SETFD, 0) < 0)
                goto fail_errno;
        } else if (dup2(fds[i], i) < 0) {
            goto fail_errno;
        }
    }
    /* Only fds 0-2 reach the command (fds 3 and 4, its shepherd's socket and gate, are
     * close-on-exec; a session's shell also keeps fd 62, see jail_session_pty_setup_child). */
    if (syscall(SYS_close_range, 5, pty ? 61 : ~0U, 0) < 0 ||
        (pty && syscall(SYS_close_range, 63, ~0U, 0) < 0))
        goto fail_errno;
    if (chdir(cwd) < 0) {
        conch_err_setk(&err, CONCH_ERR_USAGE, errno, "chdir '%s' inside the sandbox: %s", cwd,
                       strerror(errno));
        goto report;
    }
    /* Not sched_getcpu(): it reads the rseq area in our TLS, which is the shepherd's (the
     * kernel does not register rseq for a CLONE_VM child), so it names the shepherd's CPU. */
    unsigned int cpu;
    *out->cpu = syscall(SYS_getcpu, &cpu, NULL, NULL) == 0 ? (int32_t)cpu : -1;
    exec_in_path(argv[0], argv, envp, path);
    conch_err_setk(&err, CONCH_ERR_COMMAND, errno, "execute '%s': %s", argv[0], strerror(errno));
    goto report;

fail_errno:
    conch_err_set(&err, errno, "start command: %s: %s", step, strerror(errno));
report:
    command_fail(out, &err);
}

/* The command's process before the command is known: it applies every fence (rlimits,
 * identity, capabilities, no_new_privs, Landlock, seccomp) ahead of time, then waits on
 * @sock, its shepherd's socket from the warden, for the RUN message (the command's id, flags
 * and fds), and execs it. Fencing first is safe: the fds it receives were opened outside
 * (Landlock checks at open time), and all it does after the fences is map, dup, chdir and
 * exec, which the filter allows. It shares its shepherd's memory (CLONE_VM, on a stack of
 * the shepherd's) and holds the write end of @gate (fd 4, close-on-exec): the kernel closes
 * it after the exec has left that memory, or at exit after the memory is released, and only
 * then does the shepherd, blocked reading the gate, go on. What it learns and any failure go
 * back through @out. No allocation. (Not CLONE_VFORK, which would do the same wait in the
 * kernel: a shepherd asleep in it counts as uninterruptible, so every idle sandbox would add
 * one to the load average.) */
struct zygote_args {
    const struct jail_plan *plan;
    int sock;
    int gate;
    bool late_landlock; /* the workspace's Landlock rule is added at the RUN (spawn_shepherd) */
    struct zygote_out *out;
};

ON_ZYGOTE_STACK static int command_zygote(void *arg)
{
    const struct zygote_args *a = arg;
    struct zygote_out *out = a->out;
    struct conch_err err = {0};
    if ((a->sock != 3 && dup3(a->sock, 3, O_CLOEXEC) < 0) ||
        (a->gate != 4 && dup3(a->gate, 4, O_CLOEXEC) < 0) ||
        syscall(SYS_close_range, 5, ~0U, 0) < 0) {
        conch_err_set(&err, errno, "start command: set up its fds: %s", strerror(errno));
        command_fail(out, &err);
    }
    /* The warden reset every signal's disposition when it started and none is set since;
     * the shepherd's blocked signals must not stay blocked in the command. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    oom_score_raise();
    const char *step;
    int ruleset = -1;
    int r = fence_self(a->plan, a->plan->seccomp, &step, a->late_landlock ? &ruleset : NULL);
    if (r < 0) {
        conch_err_set(&err, -r, "start command: %s: %s", step, strerror(-r));
        command_fail(out, &err);
    }
    int fds[4], nfds = 0;
    r = jail_recv(3, &out->run, fds, 4, &nfds, 0);
    if (r <= 0 || nfds != 4 || out->run.type != JMSG_RUN) {
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        _exit(0); /* the warden went away: no command */
    }
    out->got_run = true;
    /* Whatever was attached meanwhile is mounted now: Landlock is whole before the exec. */
    if (ruleset >= 0 && (r = conch_landlock_finish_child(ruleset, workspace_path)) < 0) {
        conch_err_set(&err, -r, "start command: apply Landlock: %s", strerror(-r));
        command_fail(out, &err);
    }
    command_exec(fds, out, out->run.b & JRUN_PTY);
}

/* The control socket, moved to fd 3 at start: every other fd inherited from the parent
 * (the daemon's listening socket, its clients' connections, its stdio) is closed, so that
 * no sandbox process keeps them open. */
static int warden_ctl = -1;

/* What is lent is revoked. A borrower (`conch run` through the daemon's pool) never gets the
 * control socket itself, which stays the parent's alone: the parent makes a socketpair per
 * lease and sends us one end (JMSG_LEASE), the borrower the other. On it come only RUN and
 * SIGNAL, and the events of the commands started through it go back on it; the recycle kills
 * every process that inherited our end and closes ours, so a borrower that kept its copy past
 * the loan reads EOF and reaches nothing of the next user's sandbox (its own copy of the
 * control socket did: RUN in the next user's workspace, their events read, a SHUTDOWN).
 * Channels are numbered: 0 is the parent's control socket, each lease takes the next number. */
static int lease_ctl = -1; /* the current lease's channel, or -1 (none, or closed) */
static uint32_t lease_no;  /* the current (or last) lease's number; 0: none yet */

static int chan_fd(uint32_t chan)
{
    return chan == 0 ? warden_ctl : chan == lease_no ? lease_ctl : -1;
}

/* The channel a process forked now inherits and reports on, before it is told otherwise. */
static uint32_t chan_now(void)
{
    return lease_ctl >= 0 ? lease_no : 0;
}

static void lease_revoke(void)
{
    if (lease_ctl >= 0)
        close(lease_ctl);
    lease_ctl = -1;
}

/* Send event @m on channel @chan. On the parent's control socket as ever (blocking; a failure
 * means the parent is gone). A borrower never blocks us: one that does not read, or went
 * away, loses its channel (and the event); a channel revoked drops it. */
static int chan_send(uint32_t chan, struct jail_msg *m)
{
    if (chan == 0)
        return jail_send(warden_ctl, m, NULL, 0);
    int fd = chan_fd(chan);
    if (fd < 0)
        return 0;
    m->version = JAIL_PROTO_VERSION;
    if (conch_send_fds(fd, m, sizeof(*m), NULL, 0, MSG_DONTWAIT) != (ssize_t)sizeof(*m))
        lease_revoke();
    return 0;
}

/* The queued signals a sandbox's processes may hold (see jail_warden_main). */
#define SANDBOX_SIGPENDING 256

#define ZYGOTE_STACK (128 * 1024)
#define ZYGOTE_GUARD 4096

#define MAX_PROCS 1024

/* What a shepherd leaves for the warden: written by the shepherd just before it exits, read
 * by the warden after reaping it (so no lock is needed). A shepherd that dies before writing
 * leaves SHEP_NONE or SHEP_STARTED, and the warden reports a synthetic end. */
enum { SHEP_NONE = 0, SHEP_STARTED, SHEP_START_FAILED, SHEP_EXITED, SHEP_EXIT_SENT };
struct shep_report {
    int32_t state;
    int32_t status;       /* SHEP_EXITED: the command's wait status */
    int32_t timed_out;    /* written by the warden when the deadline fires, before it signals */
    int32_t cpu;          /* the CPU the command's process exec'd on, -1: not yet */
    int32_t started_sent; /* the warden reported STARTED itself (before handing RUN over) */
    uint64_t ns_ino;      /* the shepherd's pid namespace, once its /proc is up; 0: not yet */
    uint64_t sig_req;     /* signals (bit n-1: signal n) the warden asks it to send, see
                           * ctl_signal */
    int32_t chan_update;  /* the warden sends the command's channel after the RUN (JMSG_LEASE):
                           * it is not the one the shepherd was built with */
    struct conch_err err;
};

/* The warden's record of one process it started: a shepherd (command, job) or a file
 * worker. Deadlines are the warden's: they hold whatever the parent or the command does. */
struct proc_slot {
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
    uint32_t chan;      /* the channel its request came on: its events go there */
    uint32_t shep_chan; /* the channel a shepherd was built with (inherited, see chan_now) */
};

static struct proc_slot slots[MAX_PROCS];
static struct shep_report *reports; /* MAP_SHARED, MAX_PROCS entries */
static int ready_slot = -1;         /* the shepherd started ahead of need, or -1 */
static int ready_failures;
/* When the next ready shepherd may be started (monotonic µs; 0: now). Building one right
 * after a command took the last would hold the CPU that the command's own shepherd was just
 * woken on: the command would wait for it. So the refill waits until the command has had
 * time to reach its exec (REFILL_DELAY_US), then runs beside it. */
#define REFILL_DELAY_US 300
static uint64_t refill_after_us;
/* The CPUs we may run on, and the slot of the last command started: a refill that finds
 * itself on the CPU that command exec'd on moves to another for the build (see
 * ensure_ready). */
static cpu_set_t warden_cpus;
static bool warden_cpus_known;
static bool refill_moved; /* the shepherd being built inherits a narrowed mask */
static bool refill_never; /* the last command was started (JRUN_LAST): no more spares */
static int last_cmd_slot = -1;
/* Unprivileged and attachable: a mount namespace that sees the host, where a workspace is
 * cloned from when one is attached (attach()). Only we hold it: everything we fork closes it. */
static int host_view = -1;
static int attached_upper = -1; /* the attached overlay's upper dir, or -1 */
/* Attachable: our empty /workspace is a shared mount, and every shepherd's copy of it a
 * slave, so that a workspace attached over it appears in the ready shepherd's namespace too
 * (see spawn_shepherd). False where the kernel refused (the ready one is then rebuilt). */
static bool ws_shared;
static bool ws_attached; /* a workspace was attached (until the recycle) */

/* The signal a warden uses to ask a shepherd to signal its whole pid namespace: the signals
 * to send are in the shepherd's report slot (sig_req), the signal only wakes it. Blocked in
 * the shepherd and read from a signalfd: a blocked signal reaches a pid namespace's init even
 * without a handler. A standard signal sent with kill() is always delivered; a queued
 * real-time one (sigqueue, as before) is charged to the receiver's user and fails when that
 * user's RLIMIT_SIGPENDING is used up, which any command could do by queueing signals to
 * itself, so that kills and timeouts were lost in every sandbox of the same host user. A
 * command can also send it to its shepherd (PID 1 in its view): the shepherd then only finds
 * no request. */
static int ctl_signal(void)
{
    return SIGUSR1;
}

/* Send every signal the warden asked for (the mask in @rep, see ctl_signal) to every process
 * of our namespace. */
static void signal_requests(struct shep_report *rep)
{
    uint64_t req = __atomic_exchange_n(&rep->sig_req, 0, __ATOMIC_ACQ_REL);
    for (int sig = 1; sig <= 64 && req; sig++)
        if (req & (1ULL << (sig - 1))) {
            req &= ~(1ULL << (sig - 1));
            kill(-1, sig);
        }
}

/* The shepherd of one command: PID 1 of a pid namespace of its own, with its own mount
 * namespace and /proc. The command cannot signal, trace or see it (a namespace's init ignores
 * signals from inside it that it has no handler for), and killing the shepherd kills every
 * process of the command in one kernel operation, forks in flight included.
 *
 * The warden starts shepherds ahead of need: this one builds its namespace and /proc and
 * starts the command's process, which fences itself (command_zygote) and waits on @wsock
 * for the RUN message (the command's id and fds) from the warden, one hop from the exec.
 * That process shares our memory (CLONE_VM, on a stack of ours): no copy of our memory to
 * make, and none to tear down at its exec, which is on the command's critical path. We
 * sleep until it has exec'd or exited (the gate), then report that the command started,
 * signal the whole namespace when the warden asks, and when the command exits kill
 * (kill(-1), atomic) and reap everything it left, report the exit and leave it in @rep for
 * the warden too. */
__attribute__((noreturn)) static void shepherd(const struct jail_plan *plan, int wsock, int ctl,
                                               struct shep_report *rep)
{
    static struct zygote_out zout;
    struct jail_msg m;
    struct conch_err err = {0};
    pid_t cmd = -1;
    int gate[2] = {-1, -1};
    /* The command's process runs on this stack, in our memory, until it execs; a guard page
     * below it turns an overflow into a crash of that process, not a write into ours. */
    char *stack = MAP_FAILED;
    if (host_view >= 0)
        close(host_view);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    conch_proctitle_set_child("conch-shepherd");
    if (refill_moved) /* our command may run on any CPU the warden may */
        sched_setaffinity(0, sizeof(warden_cpus), &warden_cpus);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, ctl_signal());
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (ws_shared && mount(NULL, "/workspace", NULL, MS_SLAVE, NULL) < 0) {
        conch_err_set(&err, errno, "start command: make its /workspace a slave mount: %s",
                      strerror(errno));
    } else if (jail_proc_mount_child("/dev/null", 0, &err) < 0) {
        conch_err_wrap(&err, "start command: mount its /proc");
    } else if (sfd < 0 || pipe2(gate, O_CLOEXEC) < 0 ||
               (stack = mmap(NULL, ZYGOTE_STACK + ZYGOTE_GUARD, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)) == MAP_FAILED ||
               mprotect(stack, ZYGOTE_GUARD, PROT_NONE) < 0) {
        conch_err_set(&err, errno, "start command: signalfd/pipe/stack: %s", strerror(errno));
    } else {
        struct stat ns;
        if (stat("/proc/self/ns/pid", &ns) == 0)
            __atomic_store_n(&rep->ns_ino, (uint64_t)ns.st_ino, __ATOMIC_RELEASE);
        zout.cpu = &rep->cpu;
        struct zygote_args za = {.plan = plan,
                                 .sock = wsock,
                                 .gate = gate[1],
                                 .late_landlock = ws_shared && !ws_attached,
                                 .out = &zout};
        cmd = clone(command_zygote, stack + ZYGOTE_GUARD + ZYGOTE_STACK, CLONE_VM | SIGCHLD, &za);
        if (cmd < 0)
            conch_err_set(&err, errno, "start command: clone: %s", strerror(errno));
        /* Nothing but these two calls until the gate opens: the memory is shared. */
        close(gate[1]);
        char byte;
        while (cmd > 0 && read(gate[0], &byte, 1) < 0)
            ;
        close(gate[0]);
    }
    /* The command's process has exec'd or exited. The warden sends one RUN on @wsock, which
     * that process took, and, when the command came on another channel than @ctl (we were
     * built before a lease began), that channel right after it: the command's events are its
     * sender's. Then nothing more. */
    if (zout.got_run && __atomic_load_n(&rep->chan_update, __ATOMIC_ACQUIRE)) {
        struct jail_msg cm;
        int cfd = -1, n = 0;
        int r = jail_recv(wsock, &cm, &cfd, 1, &n, 0);
        ctl = r > 0 && cm.type == JMSG_LEASE && n == 1 ? cfd : -1;
        if (ctl < 0 && n == 1)
            close(cfd);
    }
    /* What the command's process mapped is ours now: its argv and environment must not stay
     * in our memory while it runs. */
    close(wsock);
    if (zout.blob)
        munmap(zout.blob, zout.blob_len);
    if (zout.vec)
        munmap(zout.vec, zout.vec_len);
    if (stack != MAP_FAILED)
        munmap(stack, ZYGOTE_STACK + ZYGOTE_GUARD);
    if (!err.code && zout.failed)
        err = zout.err;
    if (err.code)
        goto fail;
    if (!zout.got_run) {
        /* It exited without its command: killed from outside (the warden shutting down
         * kills us first). Said so, should the warden have sent the RUN meanwhile. */
        conch_err_setk(&err, CONCH_ERR_INFRASTRUCTURE, ESRCH,
                       "start command: its process died before it received the command "
                       "(killed from outside the sandbox?)");
        goto fail;
    }
    int64_t id = zout.run.id;
    /* Unless the warden said so already (it does for a shepherd it found ready): the daemon
     * need not wait for us to be scheduled after the exec, nor be woken mid-command. */
    if (!__atomic_load_n(&rep->started_sent, __ATOMIC_ACQUIRE)) {
        memset(&m, 0, sizeof(m));
        m.type = JMSG_STARTED;
        m.id = id;
        m.a = cmd;
        m.ns = rep->ns_ino; /* who the command's tool-bridge connections come from */
        jail_send(ctl, &m, NULL, 0);
    }
    rep->state = SHEP_STARTED;

    int status = 0;
    /* A request may have come while the command's process was still ours (before the gate
     * opened): its wake-up is pending and read below; looking first costs nothing. */
    signal_requests(rep);
    for (bool done = false; !done;) {
        struct signalfd_siginfo si;
        ssize_t n = read(sfd, &si, sizeof(si));
        if (n < 0 && errno == EINTR)
            continue;
        if (n != (ssize_t)sizeof(si))
            break;
        if ((int)si.ssi_signo == ctl_signal()) {
            signal_requests(rep);
            continue;
        }
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            if (pid == cmd) {
                status = st;
                done = true;
            }
        }
    }
    /* The command is done: nothing it started may outlive it. From a pid namespace's init,
     * kill(-1) reaches every process of the namespace at once; a fork racing it fails. */
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
    rep->status = status;
    rep->state = SHEP_EXITED;
    /* Report the end now rather than after our own exit, whose namespace teardown would
     * delay it: every process of the command is gone already. The warden sends it only if we
     * die before this is marked sent; a duplicate (killed between send and mark) is dropped
     * by the parent, which knows the id has ended. */
    memset(&m, 0, sizeof(m));
    m.type = JMSG_EXITED;
    m.id = id;
    m.a = status;
    m.b = rep->timed_out ? JEXIT_TIMED_OUT : 0;
    getrusage(RUSAGE_CHILDREN, &m.usage);
    if (ctl >= 0 && jail_send(ctl, &m, NULL, 0) == 0)
        rep->state = SHEP_EXIT_SENT;
    /* What is left of us is our exit: the teardown of the command's namespaces and memory,
     * ~150 µs of kernel work that waits on RCU. It must not take the CPU from the parent that
     * our message woke (sent first, so that a busy machine does not delay the report itself).
     * SCHED_IDLE alone does not hand the CPU over: the change of policy does not reschedule,
     * and the kernel (preempt=none) does not preempt its own exit path, so a parent woken
     * onto our CPU waited for the whole teardown. Yielding once idle lets it run first. */
    struct sched_param idle = {0};
    sched_setscheduler(0, SCHED_IDLE, &idle);
    sched_yield();
    _exit(0);

fail:
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
    rep->err = err;
    rep->state = SHEP_START_FAILED;
    _exit(1);
}

/* A file worker: fenced like a command, then the caller's handler does the request. A
 * persistent one (@nfds 1) serves requests from its socket until EOF. */
__attribute__((noreturn)) static void file_worker(const struct jail_plan *plan, int *fds, int nfds)
{
    /* It reads files a command wrote: nothing of the same uid (the next request's worker
     * included) may read or trace its memory. Its oom score is raised first, while /proc/self
     * is still ours to write (it leaves us non-dumpable). */
    oom_score_raise();
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        _exit(121);
    /* The shepherds' reports are shared with us: one written here would be taken as a
     * command's start or exit status. */
    munmap(reports, MAX_PROCS * sizeof(*reports));
    reports = NULL;
    if (host_view >= 0)
        close(host_view);
    if (dup3(fds[0], 3, O_CLOEXEC) < 0 || (nfds == 2 && dup3(fds[1], 4, O_CLOEXEC) < 0))
        _exit(120);
    if (syscall(SYS_close_range, 5, ~0U, 0) < 0)
        _exit(120);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        if (devnull > 2)
            close(devnull);
    }
    reset_signals();
    /* A write past RLIMIT_FSIZE (the sandbox's disk limit) must fail with EFBIG, answered as
     * too_large with its temporary file removed, not kill the worker mid-request. */
    signal(SIGXFSZ, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    conch_proctitle_set_child(nfds == 1 ? "conch-file-server" : "conch-file-worker");
    const char *step;
    if (fence_self(plan, plan->seccomp_file, &step, NULL) < 0 || chdir("/workspace") < 0)
        _exit(121);
    /* Still not dumpable: a change of ids may have set it anew (fs.suid_dumpable). */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        _exit(121);
    if (nfds == 1)
        _exit(plan->file_server(3) & 0x7f);
    _exit(plan->file_handler(3, 4) & 0x7f);
}

/* Kill every process of the sandbox but us, and reap them all. */
static void kill_all_and_reap(void)
{
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
}

static int slot_alloc(void)
{
    for (int i = 0; i < MAX_PROCS; i++)
        if (slots[i].pid == 0)
            return i;
    return -1;
}

/* Give slot @s (its pid set) the request @m. */
static void slot_arm(struct proc_slot *s, int64_t id, const struct jail_msg *m, bool is_file)
{
    s->id = id;
    s->is_file = is_file;
    s->ready = false;
    s->timed_out = s->killed = false;
    s->deadline_ms = s->kill_at_ms = 0;
    s->grace_ms = m->grace_ms;
    if (m->timeout_ms)
        s->deadline_ms = conch_clock_ms() + m->timeout_ms;
}

/* Send @sig to every process of the command in @s (its whole pid namespace). SIGKILL kills
 * the shepherd itself: the kernel then kills the namespace, atomically. */
static void slot_signal(struct proc_slot *s, int sig)
{
    if (s->pid <= 0)
        return;
    if (sig == SIGKILL || s->is_file) {
        s->killed = true;
        kill(s->pid, SIGKILL);
        return;
    }
    if (sig < 1 || sig > 64)
        return;
    __atomic_fetch_or(&reports[s - slots].sig_req, 1ULL << (sig - 1), __ATOMIC_RELEASE);
    kill(s->pid, ctl_signal());
}

/* Fire the deadlines that are due; returns the poll timeout until the next one (-1: none). */
static int slots_tick(void)
{
    uint64_t now = conch_clock_ms(), next = 0;
    for (int i = 0; i < MAX_PROCS; i++) {
        struct proc_slot *s = &slots[i];
        if (s->pid <= 0)
            continue;
        if (s->deadline_ms && now >= s->deadline_ms) {
            s->deadline_ms = 0;
            s->timed_out = true;
            reports[s - slots].timed_out = 1;
            if (s->grace_ms && !s->is_file) {
                slot_signal(s, SIGTERM);
                s->kill_at_ms = now + s->grace_ms;
            } else {
                slot_signal(s, SIGKILL);
            }
        }
        if (s->kill_at_ms && now >= s->kill_at_ms) {
            s->kill_at_ms = 0;
            slot_signal(s, SIGKILL);
        }
        uint64_t t = s->deadline_ms ? s->deadline_ms : s->kill_at_ms;
        if (t && (!next || t < next))
            next = t;
    }
    if (!next)
        return -1;
    return next > now ? (int)(next - now) : 0;
}

/* A shepherd or file worker was reaped: send the final event of its command. Every command
 * gets exactly one, RUN_ERR or EXITED, whatever happened to its shepherd. */
static int slot_finish(int i, int status, const struct rusage *ru)
{
    struct proc_slot *s = &slots[i];
    struct shep_report *rep = &reports[i];
    struct jail_msg m;
    memset(&m, 0, sizeof(m));
    m.id = s->id;
    bool is_file = s->is_file;
    uint32_t chan = s->chan;
    s->pid = 0;
    if (s->sock >= 0)
        close(s->sock);
    s->sock = -1;
    if (s->retired) {
        s->retired = false;
        return 0;
    }
    if (s->ready) {
        /* A shepherd started ahead of need died before it had a command: nothing to report;
         * after a few such deaths, shepherds are only started on demand. */
        s->ready = false;
        ready_slot = -1;
        ready_failures++;
        return 0;
    }
    if (is_file || rep->state == SHEP_EXIT_SENT)
        return 0; /* its answer (or EOF) went through the response pipe / its end is sent */
    if (rep->state == SHEP_START_FAILED) {
        m.type = JMSG_RUN_ERR;
        m.err = rep->err;
    } else if (rep->state == SHEP_NONE && !s->killed) {
        m.type = JMSG_RUN_ERR;
        conch_err_set(&m.err, EIO, "start command: its supervisor died (wait status %d)", status);
    } else {
        m.type = JMSG_EXITED;
        m.usage = *ru;
        if (rep->state == SHEP_EXITED) {
            m.a = rep->status;
        } else {
            /* Killed with its namespace, by us or by the kernel (OOM): every process of the
             * command died by SIGKILL. */
            m.a = SIGKILL;
            if (!s->killed)
                m.b |= JEXIT_LOST;
        }
        if (s->timed_out)
            m.b |= JEXIT_TIMED_OUT;
    }
    return chan_send(chan, &m);
}

static void reap_children(void)
{
    int st;
    struct rusage ru;
    pid_t pid;
    while ((pid = wait4(-1, &st, WNOHANG, &ru)) > 0) {
        for (int i = 0; i < MAX_PROCS; i++) {
            if (slots[i].pid == pid) {
                if (slot_finish(i, st, &ru) < 0)
                    _exit(1);
                break;
            }
        }
    }
}

/* The live process of request @id that came on channel @chan (a borrower reaches its own). */
static struct proc_slot *slot_find(int64_t id, uint32_t chan)
{
    for (int i = 0; i < MAX_PROCS; i++)
        if (slots[i].pid > 0 && slots[i].id == id && slots[i].chan == chan)
            return &slots[i];
    return NULL;
}

/* Start a shepherd (in new pid and mount namespaces) in free slot @i; it prepares itself
 * and waits for its command on the slot's socket. Returns 0 or -errno.
 *
 * In an attachable sandbox (a pool's) a workspace may be attached after the ready shepherd
 * was built; it is then still the one to run the first command, not rebuilt (~0.9 ms on
 * `conch run`'s path through the pool). Two things make that hold: its /workspace is a slave
 * of ours, so the attach's mount propagates into its namespace (and nothing of its own
 * propagates back); and its command's process, built before, applies Landlock only when the
 * RUN comes, the workspace's rule opened then: a rule made before would name the empty
 * /workspace, which the attach covers, and Landlock skips a covered mount point (it would
 * grant nothing). Everything else of that process is fenced ahead as for any other. */
static int spawn_shepherd(const struct jail_plan *plan, int i)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
        return -errno;
    memset(&reports[i], 0, sizeof(reports[i]));
    reports[i].cpu = -1;
    uint32_t chan = chan_now();
    pid_t pid =
        (pid_t)syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, NULL, NULL, NULL, 0);
    if (pid == 0) {
        close(sp[0]);
        shepherd(plan, sp[1], chan_fd(chan), &reports[i]);
    }
    int e = errno;
    close(sp[1]);
    if (pid < 0) {
        close(sp[0]);
        return -e;
    }
    memset(&slots[i], 0, sizeof(slots[i]));
    slots[i].pid = pid;
    slots[i].sock = sp[0];
    slots[i].shep_chan = chan;
    return 0;
}

/* Keep one shepherd ready, so that a command's namespaces, /proc and fences are built before
 * it is asked for: off the critical path of exec.run.
 *
 * The build takes a few hundred microseconds of CPU. Woken by the refill timer on the CPU
 * where the last command's process exec'd (the timer fires where we slept, which is where we
 * woke that process), we would take that CPU from the command for the whole build, while
 * another may be idle: so we move ourselves off it first (the migration costs a few
 * microseconds of the command's time, the build none), and back after the clone. */
static void ensure_ready(const struct jail_plan *plan)
{
    if (ready_slot >= 0 || ready_failures >= 3 || refill_never ||
        conch_clock_us() < refill_after_us)
        return;
    int i = slot_alloc();
    if (i < 0)
        return;
    refill_moved = false;
    if (warden_cpus_known && last_cmd_slot >= 0 && CPU_COUNT(&warden_cpus) > 1) {
        int busy = reports[last_cmd_slot].cpu;
        if (busy >= 0 && busy < CPU_SETSIZE && busy == sched_getcpu()) {
            cpu_set_t others = warden_cpus;
            CPU_CLR(busy, &others);
            refill_moved =
                CPU_COUNT(&others) > 0 && sched_setaffinity(0, sizeof(others), &others) == 0;
        }
    }
    int r = spawn_shepherd(plan, i);
    if (refill_moved)
        sched_setaffinity(0, sizeof(warden_cpus), &warden_cpus);
    refill_moved = false;
    if (r < 0)
        return;
    slots[i].ready = true;
    ready_slot = i;
}

/* Start a command that came on channel @chan: hand it to the ready shepherd (or start one
 * now). Returns 0, or -1 with @reply's error filled. */
static int start_command(const struct jail_plan *plan, const struct jail_msg *m, int *fds, int nfds,
                         struct jail_msg *reply, uint32_t chan)
{
    if (nfds != 4)
        return conch_err_set(&reply->err, EINVAL, "warden: bad run request"), -1;
    int i = ready_slot;
    ready_slot = -1;
    refill_after_us = conch_clock_us() + REFILL_DELAY_US;
    if (i < 0) {
        i = slot_alloc();
        if (i < 0)
            return conch_err_setk(&reply->err, CONCH_ERR_LIMIT, EAGAIN,
                                  "too many commands running in this sandbox (%d)", MAX_PROCS),
                   -1;
        int r = spawn_shepherd(plan, i);
        if (r < 0)
            return conch_err_set(&reply->err, -r, "start command: create its pid namespace: %s",
                                 strerror(-r)),
                   -1;
    }
    struct proc_slot *s = &slots[i];
    slot_arm(s, m->id, m, false);
    s->chan = chan;
    bool update = s->shep_chan != chan;
    if (update)
        __atomic_store_n(&reports[i].chan_update, 1, __ATOMIC_RELEASE);
    last_cmd_slot = i;
    if (m->b & JRUN_LAST)
        refill_never = true;
    /* A shepherd that is up (its pid namespace known) has its command's start reported by
     * us, before the RUN, so that it comes before the end: the shepherd then has nothing to
     * say at the exec. The command's process is its first child: pid 2 there. Not for a
     * session: the daemon takes the start as the sign that the pty's master is on its way
     * (the process sends it just before its exec) and reads it then. */
    uint64_t ino = __atomic_load_n(&reports[i].ns_ino, __ATOMIC_ACQUIRE);
    if (ino && !(m->b & JRUN_PTY)) {
        __atomic_store_n(&reports[i].started_sent, 1, __ATOMIC_RELEASE);
        struct jail_msg st = {.type = JMSG_STARTED, .id = m->id, .a = 2, .ns = ino};
        chan_send(chan, &st);
    }
    /* To the command's process itself, which waits on this socket fenced (command_zygote).
     * If its shepherd died meanwhile the send fails; reaping it reports the start failure. */
    struct jail_msg run = {.type = JMSG_RUN, .id = m->id, .b = m->b};
    jail_send(s->sock, &run, fds, 4);
    if (update) {
        /* For the shepherd, read after its command's exec: off the command's path. */
        struct jail_msg cm = {.type = JMSG_LEASE};
        int cfd = chan_fd(chan);
        jail_send(s->sock, &cm, &cfd, cfd >= 0 ? 1 : 0);
    }
    close(s->sock);
    s->sock = -1;
    return 0;
}

static int start_file_worker(const struct jail_plan *plan, const struct jail_msg *m, int *fds,
                             int nfds, struct jail_msg *reply)
{
    int i = slot_alloc();
    bool serve = m->type == JMSG_FILE_SERVE;
    if (nfds != (serve ? 1 : 2) || (serve ? !plan->file_server : !plan->file_handler))
        return conch_err_set(&reply->err, EINVAL, "warden: file requests are not enabled"), -1;
    if (i < 0)
        return conch_err_setk(&reply->err, CONCH_ERR_LIMIT, EAGAIN,
                              "too many requests running in this sandbox (%d)", MAX_PROCS),
               -1;
    pid_t pid = raw_fork();
    if (pid == 0)
        file_worker(plan, fds, nfds);
    if (pid < 0)
        return conch_err_set(&reply->err, errno, "fork file worker: %s", strerror(errno)), -1;
    memset(&slots[i], 0, sizeof(slots[i]));
    slots[i].pid = pid;
    slots[i].sock = -1;
    slot_arm(&slots[i], m->id, m, true);
    return 0;
}

/* An attachable sandbox's empty /workspace becomes a shared mount (see spawn_shepherd). The
 * peer group is new and ours: the root was made private, nothing of the host is in it. */
static void share_workspace(const struct jail_plan *plan)
{
    ws_shared = plan->attachable && mount(NULL, "/workspace", NULL, MS_SHARED, NULL) == 0;
}

/* JMSG_RECYCLE: make this sandbox (one without a workspace) as new for its next user. Every
 * process but us dies (commands, shepherds, file workers); the network, IPC and UTS
 * namespaces are replaced by new ones (the old die with their last user: us); every mount a
 * command could write is replaced by a new, empty one (jail_mounts_scrub_child); our records
 * start over. What stays is read-only to commands (the root, /usr, /etc, /dev's nodes) or
 * ours (the user, mount and pid namespaces, the cgroup). */
static int recycle(const struct jail_plan *plan, struct conch_err *err)
{
    kill_all_and_reap();
    lease_revoke(); /* the last copy of our end: its borrower reads EOF */
    for (int i = 0; i < MAX_PROCS; i++)
        if (slots[i].pid && slots[i].sock >= 0)
            close(slots[i].sock);
    memset(slots, 0, sizeof(slots));
    memset(reports, 0, MAX_PROCS * sizeof(*reports));
    ready_slot = last_cmd_slot = -1;
    ready_failures = 0;
    if (attached_upper >= 0)
        close(attached_upper); /* the attached workspace goes with the scrub's new /workspace */
    attached_upper = -1;
    ws_attached = false;
    refill_never = false;
    refill_after_us = 0;
    if (unshare(CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) < 0)
        return conch_err_set(err, errno, "renew the network, ipc and uts namespaces: %s",
                             strerror(errno));
    if (sethostname("conch", 5) < 0)
        return conch_err_set(err, errno, "set hostname in the UTS namespace: %s", strerror(errno));
    int r = loopback_up(err);
    if (r < 0)
        return r;
    if ((r = jail_mounts_scrub_child(plan, err)) < 0)
        return r;
    share_workspace(plan);
    return 0;
}

/* The workspace dir the parent sent (@ws, a dir of the parent's mount namespace), cloned from
 * our host view: a detached mount of our own, which an overlay may use as a layer. Checked to
 * be the very dir the parent opened. Returns the clone or -errno with @err. */
static int clone_from_host_view(int ws, struct conch_err *err)
{
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", ws);
    ssize_t n = readlink(link, path, sizeof(path) - 1);
    struct stat want, got;
    if (n <= 0 || fstat(ws, &want) < 0)
        return conch_err_set(err, errno, "attach the workspace: read its path: %s",
                             strerror(errno));
    path[n] = '\0';
    int here = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (here < 0 || root < 0 || setns(host_view, CLONE_NEWNS) < 0) {
        int e = errno;
        if (here >= 0)
            close(here);
        if (root >= 0)
            close(root);
        return conch_err_set(err, e, "attach the workspace: enter the host view: %s", strerror(e));
    }
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, path,
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
    int e = errno;
    /* Back into the sandbox, onto its root: a warden left in the host view would hand it to
     * every shepherd it forks. */
    if (setns(here, CLONE_NEWNS) < 0 || fchdir(root) < 0 || chroot(".") < 0 || chdir("/") < 0)
        _exit(1);
    close(here);
    close(root);
    if (tree < 0)
        return conch_err_set(err, e, "attach the workspace: clone '%s': %s", path, strerror(e));
    if (fstat(tree, &got) < 0 || got.st_dev != want.st_dev || got.st_ino != want.st_ino) {
        close(tree);
        return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                              "workspace '%s' changed while it was being attached: refusing it",
                              path);
    }
    return tree;
}

/* JMSG_ATTACH: mount a workspace at /workspace of this sandbox, which has run nothing yet. The
 * ready shepherd sees it and runs the first command (see spawn_shepherd); where our
 * /workspace could not be made shared, it is retired instead (its mount namespace is a copy
 * from before) and the next one is built on the new mount. The fds we keep are set to -1 in
 * @fds. Returns 0 with *@ret_upper (or -1), or -errno with @err. */
static int attach(const struct jail_plan *plan, const struct jail_msg *m, int *fds, int nfds,
                  int *ret_upper, struct conch_err *err)
{
    *ret_upper = -1;
    if (last_cmd_slot >= 0 || ws_attached)
        return conch_err_set(err, EBUSY, "attach the workspace: this sandbox has been used");
    if (ready_slot >= 0 && !ws_shared) {
        /* It stays, idle, until the recycle's kill_all: ending it now (its pid and mount
         * namespaces' teardown) delayed our answer by a millisecond and more. */
        struct proc_slot *s = &slots[ready_slot];
        s->ready = false;
        s->retired = true;
        s->id = -1;
        ready_slot = -1;
    }
    refill_after_us = 0;
    int mnt = -1, upper = -1, r;
    if (m->b & JATTACH_MOUNTED) {
        if (nfds < 1 || nfds > 2)
            return conch_err_set(err, EINVAL, "warden: bad attach request");
        mnt = fds[0];
        upper = nfds == 2 ? fds[1] : -1;
        fds[0] = -1;
        if (nfds == 2)
            fds[1] = -1;
    } else {
        if (nfds != 1 || host_view < 0)
            return conch_err_set(err, EINVAL, "warden: this sandbox cannot take a workspace");
        int tree = clone_from_host_view(fds[0], err);
        if (tree < 0)
            return tree;
        if (m->a == CONCH_WS_OVERLAY) {
            struct stat st;
            if (fstat(tree, &st) < 0) {
                close(tree);
                return conch_err_set(err, errno, "stat workspace: %s", strerror(errno));
            }
            uid_t uid = st.st_uid == 65534 ? plan->cmd_uid : st.st_uid;
            gid_t gid = st.st_gid == 65534 ? plan->cmd_gid : st.st_gid;
            r = jail_overlay_make(tree, uid, gid, st.st_mode, m->bytes, &mnt, &upper, err);
            close(tree);
            if (r < 0)
                return r;
        } else {
            struct mount_attr attr = {.attr_set =
                                          MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
            if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                close(tree);
                return conch_err_set(err, errno, "attach the workspace read-only: %s",
                                     strerror(errno));
            }
            mnt = tree;
        }
    }
    /* Over the empty /workspace, which is not unmounted here: an unmount waits for RCU, on
     * the command's path; the recycle's scrub removes both. */
    r = jail_stage_attach(mnt, "/workspace", err);
    close(mnt);
    if (r < 0) {
        if (upper >= 0)
            close(upper);
        return r;
    }
    attached_upper = *ret_upper = upper;
    ws_attached = true;
    return 0;
}

/* One message on the borrower's channel: a command to run, or a signal for one of the commands
 * it started. Everything else (recycle, attach, lease, file requests, shutdown) is the
 * parent's alone and dropped. EOF or an error closes the channel: the lease's commands run
 * on, their events dropped, until the parent recycles or destroys the sandbox. */
static void lease_serve(const struct jail_plan *plan)
{
    struct jail_msg m;
    int fds[4], nfds = 0;
    int r = jail_recv(lease_ctl, &m, fds, 4, &nfds, MSG_DONTWAIT);
    if (r == -EAGAIN || r == -EPROTO)
        return;
    if (r <= 0) {
        lease_revoke();
        return;
    }
    struct jail_msg reply = {.type = JMSG_RUN_ERR, .id = m.id};
    if (m.type == JMSG_RUN) {
        if (start_command(plan, &m, fds, nfds, &reply, lease_no) < 0)
            chan_send(lease_no, &reply);
    } else if (m.type == JMSG_SIGNAL) {
        struct proc_slot *s = slot_find(m.id, lease_no);
        if (s && m.a > 0 && m.a < NSIG)
            slot_signal(s, m.a);
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
}

/* `conch run`'s warden is a copy of it: its command line and environment are still in our
 * memory. Overwrite both, so that /proc/1/cmdline shows no host path and nothing of them
 * lingers (a daemon's warden, exec'd, has only its entry point's arguments and the
 * sanitizers' options there). */
static void scrub_inherited_memory(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        memset(*e, 0, strlen(*e));
    conch_proctitle_set_child("conch-warden");
}

/* The capabilities the clone child kept across the exec (exec-child.c) go back to being
 * ours alone: nothing we start inherits them through the ambient or inheritable sets. */
static int clear_inherited_caps(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -errno;
    data[0].inheritable = data[1].inheritable = 0;
    return syscall(SYS_capset, &hdr, data) < 0 ? -errno : 0;
}

/* A daemon's warden runs in a new image exec'd by the jail (warden-exec.c,
 * conch_jail_warden_entry), with every signal blocked since the clone: single-threaded,
 * nothing of the daemon's memory. `conch run`'s is the clone child itself. */
__attribute__((noreturn)) void jail_warden_main(const struct jail_plan *plan)
{
    struct jail_msg m;
    struct conch_err err = {0};
    int upper_fd = -1;
    int ctl = plan->ctl_fd;
    /* Ignored signals stay ignored across an exec (the daemon ignores SIGPIPE): every
     * disposition back to the default, then unblocked. */
    reset_signals();
    if (clear_inherited_caps() < 0)
        _exit(1);
    /* Dumpable again (an exec of an image we may not read, as a daemon's is, is not): an
     * unprivileged parent opens our upper dir through /proc. */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    /* The sandbox's tree is made with the modes we ask for, whatever the caller's umask
     * (077 made its mount points unreachable for the agent); a command of conch run gets the
     * caller's umask back (JBLOB_CALLER), the daemon's get this one. */
    umask(022);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
        _exit(1);
    if (ctl != 3) {
        if (dup3(ctl, 3, O_CLOEXEC) < 0)
            _exit(1);
        ctl = 3;
    }
    if (syscall(SYS_close_range, 4, ~0U, 0) < 0)
        _exit(1);
    warden_ctl = ctl;
    scrub_inherited_memory();
    warden_cpus_known = sched_getaffinity(0, sizeof(warden_cpus), &warden_cpus) == 0;
    reports = mmap(NULL, MAX_PROCS * sizeof(*reports), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (reports == MAP_FAILED)
        _exit(1);

    /* Wait until the parent wrote our id maps (and put us in the cgroup). */
    int fds[4];
    int nfds = 0;
    if (jail_recv(ctl, &m, fds, 0, &nfds, 0) < 0)
        _exit(1);
    /* Become the namespace's own ids: until now we were unmapped kernel ids. */
    if (setresgid(plan->warden_gid, plan->warden_gid, plan->warden_gid) < 0 ||
        setresuid(plan->warden_uid, plan->warden_uid, plan->warden_uid) < 0) {
        conch_err_set(&err, errno, "become uid %u in the user namespace: %s", plan->warden_uid,
                      strerror(errno));
        goto setup_failed;
    }
    /* We die with our parent, and so does everything in our pid namespace. Only after the
     * ids: a change of effective ids clears the parent-death signal (as host root they are
     * the sandbox's own block), and a warden that outlived its daemon ran on, its host ids
     * free to be given to another sandbox. A parent already gone left our control socket
     * without a peer (nobody else holds it yet). */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    struct pollfd hup = {.fd = ctl, .events = POLLRDHUP};
    if (poll(&hup, 1, 0) > 0 && (hup.revents & (POLLHUP | POLLRDHUP)))
        _exit(1);
    /* Commands cannot read our fds through /proc/1/fd: they lack capabilities we hold, so
     * the kernel's ptrace access check refuses them (and each command has a pid namespace of
     * its own, where we are not even visible). We stay dumpable so that an unprivileged
     * parent (same uid, owner of our user namespace) can open our upper dir. */
    /* Attachable and unprivileged: first a mount namespace that keeps seeing the host (a
     * slave: later host mounts appear in it too), where an attached workspace is cloned
     * from; only a mount of a namespace of ours can be an overlay layer here. As host root the
     * parent makes the mount itself (idmapped) and hands it over: no such view. */
    if (plan->attachable && !plan->root_mode) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
            (host_view = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC)) < 0) {
            conch_err_set(&err, errno, "keep a view of the host for attached workspaces: %s",
                          strerror(errno));
            goto setup_failed;
        }
    }
    if (unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) < 0) {
        conch_err_set(&err, errno, "create mount, network, ipc and uts namespaces: %s",
                      strerror(errno));
        goto setup_failed;
    }
    if (plan->unshare_cgroup && unshare(CLONE_NEWCGROUP) < 0) {
        conch_err_set(&err, errno, "unshare cgroup namespace: %s", strerror(errno));
        goto setup_failed;
    }
    if (sethostname("conch", 5) < 0) {
        conch_err_set(&err, errno, "set hostname in the UTS namespace: %s", strerror(errno));
        goto setup_failed;
    }
    if (loopback_up(&err) < 0)
        goto setup_failed;
    int ptc_fd = -1;
    if (jail_mounts_setup_child(plan, &upper_fd, &ptc_fd, &err) < 0)
        goto setup_failed;
    share_workspace(plan);
    /* Nothing we start may ever gain a capability beyond @plan->keep_caps: cut the bounding
     * set here, once, rather than in every command's process (64 calls each). We keep our
     * own effective set: the bounding set only limits what an execve can grant. */
    int r = drop_bounding_caps(plan->keep_caps);
    if (r < 0) {
        conch_err_set(&err, -r, "drop capabilities from the bounding set: %s", strerror(-r));
        goto setup_failed;
    }
    /* Queued signals are charged up the user namespaces to the host user who owns the
     * sandbox: with the host's limit (~96,000), one command that queued real-time signals to
     * itself held that user's whole quota, and nothing of that user could queue one any more.
     * A sandbox's commands share one count (one uid in one namespace), so this bounds what a
     * sandbox can hold; the daemon's 256 sandboxes stay below the host's quota. Set here, once,
     * and inherited by everything we start: we and the shepherds receive only standard
     * signals, which the limit does not refuse. */
    if ((r = lower_rlimit(RLIMIT_SIGPENDING, SANDBOX_SIGPENDING, SANDBOX_SIGPENDING)) < 0) {
        conch_err_set(&err, -r, "limit queued signals: %s", strerror(-r));
        goto setup_failed;
    }

    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_OK;
    m.a = upper_fd;
    if (jail_send(ctl, &m, &ptc_fd, ptc_fd >= 0 ? 1 : 0) < 0)
        _exit(1);
    if (ptc_fd >= 0)
        close(ptc_fd); /* the parent accepts; nothing we fork may hold it */

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        _exit(1);

    for (;;) {
        ensure_ready(plan);
        struct pollfd pfd[3] = {{.fd = ctl, .events = POLLIN},
                                {.fd = sfd, .events = POLLIN},
                                {.fd = lease_ctl, .events = POLLIN}};
        /* Wake for the next deadline, or for the refill when that comes first. */
        int timeout = slots_tick();
        int64_t wait_us = timeout >= 0 ? (int64_t)timeout * 1000 : -1;
        uint64_t now_us = conch_clock_us();
        if (ready_slot < 0 && refill_after_us > now_us &&
            (wait_us < 0 || (uint64_t)wait_us > refill_after_us - now_us))
            wait_us = (int64_t)(refill_after_us - now_us);
        struct timespec ts = {.tv_sec = wait_us / 1000000, .tv_nsec = wait_us % 1000000 * 1000};
        if (ppoll(pfd, 3, wait_us >= 0 ? &ts : NULL, NULL) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) > 0)
                ;
            /* Shepherds, file workers, and orphans of file workers: reap them all. */
            reap_children();
        }
        if (lease_ctl >= 0 && (pfd[2].revents & (POLLIN | POLLHUP | POLLERR)))
            lease_serve(plan);
        if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        r = jail_recv(ctl, &m, fds, 4, &nfds, MSG_DONTWAIT);
        if (r == -EAGAIN || r == -EPROTO)
            continue; /* a message of another version is dropped, its fds closed */
        if (r <= 0)
            _exit(0); /* parent gone: everything in the namespace dies with us */
        struct jail_msg reply = {.type = JMSG_RUN_ERR, .id = m.id};
        int started = 0;
        switch (m.type) {
        case JMSG_RUN:
            started = start_command(plan, &m, fds, nfds, &reply, 0);
            break;
        case JMSG_FILE:
        case JMSG_FILE_SERVE:
            started = start_file_worker(plan, &m, fds, nfds, &reply);
            break;
        case JMSG_RECYCLE: {
            struct jail_msg done = {.type = JMSG_SETUP_OK, .a = -1};
            if (recycle(plan, &done.err) < 0)
                done.type = JMSG_SETUP_ERR;
            if (jail_send(ctl, &done, NULL, 0) < 0 || done.type == JMSG_SETUP_ERR)
                _exit(1);
            break;
        }
        case JMSG_ATTACH: {
            struct jail_msg done = {.type = JMSG_SETUP_OK, .a = -1};
            int up = -1;
            if (attach(plan, &m, fds, nfds, &up, &done.err) < 0)
                done.type = JMSG_SETUP_ERR;
            done.a = up;
            if (jail_send(ctl, &done, NULL, 0) < 0)
                _exit(1);
            break;
        }
        case JMSG_SIGNAL: {
            struct proc_slot *s = slot_find(m.id, 0);
            if (s && m.a > 0 && m.a < NSIG)
                slot_signal(s, m.a);
            break;
        }
        case JMSG_LEASE:
            lease_revoke();
            if (++lease_no == 0)
                lease_no = 1;
            if (nfds == 1) {
                lease_ctl = fds[0];
                fds[0] = -1;
            }
            break;
        case JMSG_SHUTDOWN:
        default:
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            kill_all_and_reap();
            _exit(0);
        }
        for (int i = 0; i < nfds; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        if (started < 0 && jail_send(ctl, &reply, NULL, 0) < 0)
            _exit(1);
    }

setup_failed:
    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_ERR;
    m.err = err;
    jail_send(ctl, &m, NULL, 0);
    _exit(1);
}
