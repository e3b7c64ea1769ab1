/* shepherd-child.c - what the warden starts: the shepherd of each command (PID 1 of a pid
 * namespace of the command's own), one kept ready ahead of need; the command's process, which
 * fences itself before the command is known and execs it; and file workers, fenced like a
 * command. The warden's side of starting them (slots, the ready shepherd, handing a RUN over)
 * is here too. Runs in the warden and its children after clone(): no allocation, no stdio. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fdpass.h"
#include "core/proctitle.h"
#include "jail/jail-internal.h"
#include "jail/landlock.h"
#include "jail/seccomp.h"

#define MAX_ARGS 4096

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
int conch_jail_lower_rlimit(int res, rlim_t cur, rlim_t max)
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
#define N_WRITABLE (sizeof(writable_paths) / sizeof(writable_paths[0]))

/* writable_paths and the caller's writable extra mounts (tmpfs, overlay, rw binds) into @out (room
 * for N_WRITABLE + CONCH_SPEC_MOUNTS_MAX), NULL-terminated; no allocation. */
static const char **writable_list(const struct jail_plan *plan, const char **out)
{
    size_t n = 0;
    for (; writable_paths[n]; n++)
        out[n] = writable_paths[n];
    for (int i = 0; i < plan->n_mounts && i < CONCH_SPEC_MOUNTS_MAX; i++)
        if (plan->mounts[i].type == CONCH_MOUNT_TMPFS ||
            plan->mounts[i].type == CONCH_MOUNT_OVERLAY || plan->mounts[i].rw)
            out[n++] = plan->mounts[i].dst;
    out[n] = NULL;
    return out;
}

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
    if ((r = conch_jail_lower_rlimit(RLIMIT_CORE, 0, 0)) < 0)
        return r;
    if (plan->set_rlimit_nproc &&
        (r = conch_jail_lower_rlimit(RLIMIT_NPROC, plan->rlimit_nproc, plan->rlimit_nproc)) < 0)
        return r;
    /* A daemon raises its own open-files limit; its commands get the usual one back. */
    if (plan->rlimit_nofile.rlim_cur &&
        (r = conch_jail_lower_rlimit(RLIMIT_NOFILE, plan->rlimit_nofile.rlim_cur,
                                     plan->rlimit_nofile.rlim_max)) < 0)
        return r;
    if (plan->rlimit_fsize &&
        (r = conch_jail_lower_rlimit(RLIMIT_FSIZE, plan->rlimit_fsize, plan->rlimit_fsize)) < 0)
        return r;
    if (plan->set_rlimit_as &&
        (r = conch_jail_lower_rlimit(RLIMIT_AS, plan->rlimit_as, plan->rlimit_as)) < 0)
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
    const char *writable[N_WRITABLE + CONCH_SPEC_MOUNTS_MAX];
    writable_list(plan, writable);
    if (ret_ruleset)
        r = conch_landlock_prepare_child(writable + 1, ret_ruleset);
    else
        r = conch_landlock_apply_child(writable);
    if (r < 0)
        return r;
    *step = "install seccomp filter";
    if (seccomp && (r = conch_seccomp_install_child(seccomp)) < 0)
        return r;
    return 0;
}

/* fork() as a bare clone: we are single-threaded and have no handlers (conch_jail_reset_signals),
 * so nothing runs in the child but what it calls; no atfork handler of a library either. */
static pid_t raw_fork(void)
{
    return (pid_t)syscall(SYS_clone, SIGCHLD, NULL, NULL, NULL, 0);
}

/* An OOM kill in the sandbox's memory cgroup (or on the host) must pick a command, not the
 * warden or a shepherd, whose death would stop the sandbox: commands and file workers raise
 * their oom_score_adj to the top (raising needs no privilege; lowering the warden's would
 * need CAP_SYS_RESOURCE, which a container's root may lack). @path: /proc/self/oom_score_adj
 * (a file worker, a shepherd), or a command's, written by its shepherd. Our memory is
 * non-dumpable, which makes /proc/self ours no longer: dumpable for the write, then not
 * again. Best effort. */
static void oom_score_write(const char *path, const char *value)
{
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, value, strlen(value)) < 0) {
            /* best effort */
        }
        close(fd);
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

static void oom_score_raise(void)
{
    oom_score_write("/proc/self/oom_score_adj", "1000");
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
            int r = conch_jail_lower_rlimit(res, (rlim_t)hdr->rlim[res].cur,
                                            (rlim_t)hdr->rlim[res].max);
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
    if (pty && conch_jail_session_pty_setup_child(fds) < 0)
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
     * close-on-exec; a session's shell also keeps fd 62, see conch_jail_session_pty_setup_child).
     */
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
    const char *step;
    int ruleset = -1;
    int r = fence_self(a->plan, a->plan->seccomp, &step, a->late_landlock ? &ruleset : NULL);
    if (r < 0) {
        conch_err_set(&err, -r, "start command: %s: %s", step, strerror(-r));
        command_fail(out, &err);
    }
    int fds[4], nfds = 0;
    r = conch_jail_recv(3, &out->run, fds, 4, &nfds, 0);
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

#define ZYGOTE_STACK (128 * 1024)
#define ZYGOTE_GUARD 4096

/* The refill waits this long after a command took the ready shepherd (see
 * conch_jail_warden.refill_after_us). */
#define REFILL_DELAY_US 300
static bool refill_moved; /* the shepherd being built inherits a narrowed mask */

/* The signal a warden uses to ask a shepherd to signal its whole pid namespace: the signals
 * to send are in the shepherd's report slot (sig_req), the signal only wakes it. Blocked in
 * the shepherd and read from a signalfd: a blocked signal reaches a pid namespace's init even
 * without a handler. A standard signal sent with kill() is always delivered; a queued
 * real-time one (sigqueue, as before) is charged to the receiver's user and fails when that
 * user's RLIMIT_SIGPENDING is used up, which any command could do by queueing signals to
 * itself, so that kills and timeouts were lost in every sandbox of the same host user. A
 * command can also send it to its shepherd (PID 1 in its view): the shepherd then only finds
 * no request. */
int conch_jail_ctl_signal(void)
{
    return SIGUSR1;
}

/* Send every signal the warden asked for (the mask in @rep, see conch_jail_ctl_signal) to every
 * process of our namespace. */
static void signal_requests(struct jail_shep_report *rep)
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
/* Send our command's event @m on @ctl. The parent's control socket (channel 0) blocks as
 * ever; a borrower's channel never does: a borrower that does not read loses its command
 * (the caller kills it) rather than leaving us, and the sandbox's slot, stalled. Returns 0,
 * or -1 when the message did not go. */
static int report_event(int ctl, bool lease, struct jail_msg *m)
{
    if (ctl < 0)
        return -1;
    if (!lease)
        return conch_jail_send(ctl, m, NULL, 0) == 0 ? 0 : -1;
    m->version = JAIL_PROTO_VERSION;
    return conch_send_fds(ctl, m, sizeof(*m), NULL, 0, MSG_DONTWAIT) == (ssize_t)sizeof(*m) ? 0
                                                                                            : -1;
}

/* How many times a shepherd builds its command's process anew when it died before taking
 * a RUN (shepherd). */
#define ZYGOTE_REBUILDS 3

/* Reap the command's process @pid, dead before its command, and take back its SIGCHLD
 * (blocked, read from our signalfd) and whatever it had mapped in our memory. */
static void reap_dead_zygote(pid_t pid, struct zygote_out *out)
{
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    struct timespec now = {0};
    sigtimedwait(&chld, NULL, &now);
    if (out->blob)
        munmap(out->blob, out->blob_len);
    if (out->vec)
        munmap(out->vec, out->vec_len);
}

__attribute__((noreturn)) static void shepherd(const struct jail_plan *plan, int wsock, int ctl,
                                               struct jail_shep_report *rep)
{
    static struct zygote_out zout;
    struct jail_msg m;
    struct conch_err err = {0};
    pid_t cmd = -1;
    int gate[2] = {-1, -1};
    /* The command's process runs on this stack, in our memory, until it execs; a guard page
     * below it turns an overflow into a crash of that process, not a write into ours. */
    char *stack = MAP_FAILED;
    /* A channel other than the parent's (channel 0) is a borrower's. */
    bool lease = ctl >= 0 && ctl != conch_jail_chan_fd(0);
    if (conch_jail_warden.host_view >= 0)
        close(conch_jail_warden.host_view);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    /* Not the warden's score (-1000 where the daemon may lower it): a process the command
     * forks before we raise the command's (below) takes ours, and must stay killable. Set
     * before the command's process shares our memory: a write to oom_score_adj in a memory
     * a CLONE_VM child ever shared walks every process of the machine (the kernel updates
     * all that share it), which it did for every command (3,000 processes with 1,000
     * sandboxes) and made us, the shepherd, an OOM killer's first choice too. */
    oom_score_write("/proc/self/oom_score_adj", "0");
    conch_proctitle_set_child("conch-shepherd");
    if (refill_moved) /* our command may run on any CPU the warden may */
        sched_setaffinity(0, sizeof(conch_jail_warden.cpus), &conch_jail_warden.cpus);
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, conch_jail_ctl_signal());
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    /* Every shared mount of ours (/workspace, and the bind below an overlay mounted over it)
     * becomes a slave here: nothing propagates back. */
    if (conch_jail_warden.ws_shared && mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0) {
        conch_err_set(&err, errno, "start command: make its /workspace a slave mount: %s",
                      strerror(errno));
    } else if (conch_jail_proc_mount_child("/dev/null", 0, true, &err) < 0) {
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
        for (int builds = 1;; builds++) {
            zout = (struct zygote_out){.cpu = &rep->cpu};
            struct zygote_args za = {.plan = plan,
                                     .sock = wsock,
                                     .gate = gate[1],
                                     .late_landlock = conch_jail_warden.ws_shared &&
                                                      !conch_jail_warden.ws_attached,
                                     .out = &zout};
            cmd =
                clone(command_zygote, stack + ZYGOTE_GUARD + ZYGOTE_STACK, CLONE_VM | SIGCHLD, &za);
            if (cmd < 0)
                conch_err_set(&err, errno, "start command: clone: %s", strerror(errno));
            /* Nothing but these two calls until the gate opens: the memory is shared. */
            close(gate[1]);
            char byte;
            while (cmd > 0 && read(gate[0], &byte, 1) < 0)
                ;
            close(gate[0]);
            if (cmd < 0 || zout.got_run || zout.failed || builds > ZYGOTE_REBUILDS)
                break;
            /* It died before it took a RUN: killed from outside while we were ready. The
             * warden, unaware of it, may have given us the command already (it waits on
             * @wsock) or be about to (its RUN crossing our report of the death, on a loaded
             * machine: CI saw the command fail with 126): either way another process takes
             * it, rather than the command failing to start. Bounded: ZYGOTE_REBUILDS. */
            reap_dead_zygote(cmd, &zout);
            if (pipe2(gate, O_CLOEXEC) < 0) {
                conch_err_set(&err, errno, "start command: pipe: %s", strerror(errno));
                cmd = -1;
                break;
            }
        }
    }
    /* The command's process has exec'd or exited. The warden sends one RUN on @wsock, which
     * that process took, and, when the command came on another channel than @ctl (we were
     * built before a lease began), that channel right after it: the command's events are its
     * sender's. Then nothing more. */
    if (zout.got_run && __atomic_load_n(&rep->chan_update, __ATOMIC_ACQUIRE)) {
        struct jail_msg cm;
        int cfd = -1, n = 0;
        int r = conch_jail_recv(wsock, &cm, &cfd, 1, &n, 0);
        ctl = r > 0 && cm.type == JMSG_LEASE && n == 1 ? cfd : -1;
        if (ctl < 0 && n == 1)
            close(cfd);
        lease = true;
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
        if (report_event(ctl, lease, &m) < 0 && lease)
            kill(-1, SIGKILL); /* its borrower does not read: the command goes (loop below) */
    }
    rep->state = SHEP_STARTED;
    /* The command runs its own memory now: its score goes to the top without the walk a
     * write from our shared memory made (see above). What it forked before this write keeps
     * ours, 0. */
    char oom_path[48];
    snprintf(oom_path, sizeof(oom_path), "/proc/%d/oom_score_adj", (int)cmd);
    oom_score_write(oom_path, "1000");

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
        if ((int)si.ssi_signo == conch_jail_ctl_signal()) {
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
    if (report_event(ctl, lease, &m) == 0)
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
 * persistent one (@nfds 1) serves requests from its socket until EOF: @serve (the file
 * server, or the JS worker). */
__attribute__((noreturn)) static void file_worker(const struct jail_plan *plan, int *fds, int nfds,
                                                  conch_jail_file_serve_fn serve)
{
    /* It reads files a command wrote: nothing of the same uid (the next request's worker
     * included) may read or trace its memory. Its oom score is raised first, while /proc/self
     * is still ours to write (it leaves us non-dumpable). */
    oom_score_raise();
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        _exit(121);
    /* The shepherds' reports are shared with us: one written here would be taken as a
     * command's start or exit status. */
    munmap(conch_jail_warden.reports, JAIL_MAX_PROCS * sizeof(*conch_jail_warden.reports));
    conch_jail_warden.reports = NULL;
    if (conch_jail_warden.host_view >= 0)
        close(conch_jail_warden.host_view);
    /* Out of the way first: a received fd may sit at 3, 4 or 5, where another goes. */
    for (int i = 0; i < nfds; i++)
        if ((fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 16)) < 0)
            _exit(120);
    if (dup3(fds[0], 3, O_CLOEXEC) < 0 || (nfds >= 2 && dup3(fds[1], 4, O_CLOEXEC) < 0) ||
        (nfds == 3 && dup3(fds[2], 5, O_CLOEXEC) < 0))
        _exit(120);
    if (syscall(SYS_close_range, nfds == 3 ? 6 : 5, ~0U, 0) < 0)
        _exit(120);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        if (devnull > 2)
            close(devnull);
    }
    conch_jail_reset_signals();
    /* A write past RLIMIT_FSIZE (the sandbox's disk limit) must fail with EFBIG, answered as
     * too_large with its temporary file removed, not kill the worker mid-request. */
    signal(SIGXFSZ, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    conch_proctitle_set_child(nfds >= 2                  ? "conch-file-worker"
                              : serve == plan->js_server ? "conch-js-spare" /* until a request */
                                                         : "conch-file-server");
    const char *step;
    bool js = nfds == 1 && serve == plan->js_server;
    if (js && (!plan->seccomp_js || !plan->seccomp_js->len))
        _exit(121); /* fail closed: a JS worker never runs without its own filter */
    if (fence_self(plan, js ? plan->seccomp_js : plan->seccomp_file, &step, NULL) < 0 ||
        chdir("/workspace") < 0)
        _exit(121);
    /* Still not dumpable: a change of ids may have set it anew (fs.suid_dumpable). */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        _exit(121);
    if (nfds == 1)
        _exit(serve(3) & 0x7f);
    _exit(plan->file_handler(3, 4, nfds == 3 ? 5 : -1) & 0x7f);
}

static int slot_alloc(void)
{
    for (int i = 0; i < JAIL_MAX_PROCS; i++)
        if (conch_jail_warden.slots[i].pid == 0)
            return i;
    return -1;
}

/* Give slot @s (its pid set) the request @m. */
static void slot_arm(struct jail_proc_slot *s, int64_t id, const struct jail_msg *m, bool is_file)
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
    memset(&conch_jail_warden.reports[i], 0, sizeof(conch_jail_warden.reports[i]));
    conch_jail_warden.reports[i].cpu = -1;
    uint32_t chan = conch_jail_chan_now();
    pid_t pid =
        (pid_t)syscall(SYS_clone, CLONE_NEWPID | CLONE_NEWNS | SIGCHLD, NULL, NULL, NULL, 0);
    if (pid == 0) {
        close(sp[0]);
        shepherd(plan, sp[1], conch_jail_chan_fd(chan), &conch_jail_warden.reports[i]);
    }
    int e = errno;
    close(sp[1]);
    if (pid < 0) {
        close(sp[0]);
        return -e;
    }
    memset(&conch_jail_warden.slots[i], 0, sizeof(conch_jail_warden.slots[i]));
    conch_jail_warden.slots[i].pid = pid;
    conch_jail_warden.slots[i].sock = sp[0];
    conch_jail_warden.slots[i].shep_chan = chan;
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
void conch_jail_ensure_ready(const struct jail_plan *plan)
{
    if (conch_jail_warden.ready_slot >= 0 || conch_jail_warden.ready_failures >= 3 ||
        conch_jail_warden.ws_released || conch_jail_warden.refill_never ||
        conch_clock_us() < conch_jail_warden.refill_after_us)
        return;
    int i = slot_alloc();
    if (i < 0)
        return;
    refill_moved = false;
    if (conch_jail_warden.cpus_known && conch_jail_warden.last_cmd_slot >= 0 &&
        CPU_COUNT(&conch_jail_warden.cpus) > 1) {
        int busy = conch_jail_warden.reports[conch_jail_warden.last_cmd_slot].cpu;
        if (busy >= 0 && busy < CPU_SETSIZE && busy == sched_getcpu()) {
            cpu_set_t others = conch_jail_warden.cpus;
            CPU_CLR(busy, &others);
            refill_moved =
                CPU_COUNT(&others) > 0 && sched_setaffinity(0, sizeof(others), &others) == 0;
        }
    }
    int r = spawn_shepherd(plan, i);
    if (refill_moved)
        sched_setaffinity(0, sizeof(conch_jail_warden.cpus), &conch_jail_warden.cpus);
    refill_moved = false;
    if (r < 0)
        return;
    conch_jail_warden.slots[i].ready = true;
    conch_jail_warden.ready_slot = i;
}

/* Whether the ready shepherd in slot @s can still take a command. Its command's process
 * killed from outside (or the shepherd itself) closes their ends of the slot's socket before
 * we reap the shepherd; a command handed to it then would fail to start ("died before it
 * received the command"), where a fresh shepherd runs it. The reap counts it as a ready one
 * that died. (Killed between this look and the RUN, the failure is reported as such.) */
static bool ready_shepherd_alive(const struct jail_proc_slot *s)
{
    struct pollfd p = {.fd = s->sock, .events = POLLOUT};
    return s->sock >= 0 && poll(&p, 1, 0) >= 0 && !(p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/* Start a command that came on channel @chan: hand it to the ready shepherd (or start one
 * now). Returns 0, or -1 with @reply's error filled. */
int conch_jail_start_command(const struct jail_plan *plan, const struct jail_msg *m, int *fds,
                             int nfds, struct jail_msg *reply, uint32_t chan)
{
    if (nfds != 4)
        return conch_err_set(&reply->err, EINVAL, "warden: bad run request"), -1;
    int i = conch_jail_warden.ready_slot;
    if (i >= 0 && !ready_shepherd_alive(&conch_jail_warden.slots[i]))
        i = -1; /* still marked ready: its reap counts it among the failures */
    conch_jail_warden.ready_slot = -1;
    conch_jail_warden.refill_after_us = conch_clock_us() + REFILL_DELAY_US;
    if (i < 0) {
        i = slot_alloc();
        if (i < 0)
            return conch_err_setk(&reply->err, CONCH_ERR_LIMIT, EAGAIN,
                                  "too many commands running in this sandbox (%d)", JAIL_MAX_PROCS),
                   -1;
        int r = spawn_shepherd(plan, i);
        if (r < 0)
            return conch_err_set(&reply->err, -r, "start command: create its pid namespace: %s",
                                 strerror(-r)),
                   -1;
    }
    struct jail_proc_slot *s = &conch_jail_warden.slots[i];
    slot_arm(s, m->id, m, false);
    s->chan = chan;
    bool update = s->shep_chan != chan;
    if (update)
        __atomic_store_n(&conch_jail_warden.reports[i].chan_update, 1, __ATOMIC_RELEASE);
    conch_jail_warden.last_cmd_slot = i;
    if (m->b & JRUN_LAST)
        conch_jail_warden.refill_never = true;
    /* A shepherd that is up (its pid namespace known) has its command's start reported by
     * us, before the RUN, so that it comes before the end: the shepherd then has nothing to
     * say at the exec. The command's process is its first child: pid 2 there. Not for a
     * session: the daemon takes the start as the sign that the pty's master is on its way
     * (the process sends it just before its exec) and reads it then. */
    uint64_t ino = __atomic_load_n(&conch_jail_warden.reports[i].ns_ino, __ATOMIC_ACQUIRE);
    if (ino && !(m->b & JRUN_PTY)) {
        __atomic_store_n(&conch_jail_warden.reports[i].started_sent, 1, __ATOMIC_RELEASE);
        struct jail_msg st = {.type = JMSG_STARTED, .id = m->id, .a = 2, .ns = ino};
        conch_jail_chan_send(chan, &st);
    }
    /* To the command's process itself, which waits on this socket fenced (command_zygote).
     * If its shepherd died meanwhile the send fails; reaping it reports the start failure. */
    struct jail_msg run = {.type = JMSG_RUN, .id = m->id, .b = m->b};
    conch_jail_send(s->sock, &run, fds, 4);
    if (update) {
        /* For the shepherd, read after its command's exec: off the command's path. */
        struct jail_msg cm = {.type = JMSG_LEASE};
        int cfd = conch_jail_chan_fd(chan);
        conch_jail_send(s->sock, &cm, &cfd, cfd >= 0 ? 1 : 0);
    }
    close(s->sock);
    s->sock = -1;
    return 0;
}

int conch_jail_start_file_worker(const struct jail_plan *plan, const struct jail_msg *m, int *fds,
                                 int nfds, struct jail_msg *reply)
{
    int i = slot_alloc();
    bool serve = m->type == JMSG_FILE_SERVE;
    conch_jail_file_serve_fn server = !serve      ? NULL
                                      : m->a == 1 ? plan->js_server
                                                  : plan->file_server;
    if ((serve ? nfds != 1 : nfds != 2 && nfds != 3) || (serve ? !server : !plan->file_handler))
        return conch_err_set(&reply->err, EINVAL, "warden: %s are not enabled",
                             serve && m->a == 1 ? "JS workers" : "file requests"),
               -1;
    if (i < 0)
        return conch_err_setk(&reply->err, CONCH_ERR_LIMIT, EAGAIN,
                              "too many requests running in this sandbox (%d)", JAIL_MAX_PROCS),
               -1;
    pid_t pid = raw_fork();
    if (pid == 0)
        file_worker(plan, fds, nfds, server);
    if (pid < 0)
        return conch_err_set(&reply->err, errno, "fork file worker: %s", strerror(errno)), -1;
    memset(&conch_jail_warden.slots[i], 0, sizeof(conch_jail_warden.slots[i]));
    conch_jail_warden.slots[i].pid = pid;
    conch_jail_warden.slots[i].sock = -1;
    slot_arm(&conch_jail_warden.slots[i], m->id, m, true);
    return 0;
}
