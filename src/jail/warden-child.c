/* warden-child.c - the warden: PID 1 of the sandbox. It finishes the sandbox setup, then
 * serves the control socket: starts commands (fencing each between fork and execve),
 * forwards signals, reaps every process, and when a command ends kills whatever it left
 * behind. When the warden exits, the kernel kills everything left in its pid namespace.
 * Runs in the child after clone(): no allocation, no stdio. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <grp.h>
#include <unistd.h>

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

/* Apply every fence of a command to the calling process: rlimits, identity, capabilities,
 * no_new_privs, Landlock, seccomp. On failure returns -errno with *@step naming what failed.
 * Run after the fds are in place: Landlock checks rights at open time. */
static int fence_self(const struct jail_plan *plan, const char **step)
{
    *step = "set resource limits";
    struct rlimit rl = {0, 0};
    if (setrlimit(RLIMIT_CORE, &rl) < 0)
        return -errno;
    if (plan->set_rlimit_nproc) {
        rl.rlim_cur = rl.rlim_max = plan->rlimit_nproc;
        if (setrlimit(RLIMIT_NPROC, &rl) < 0)
            return -errno;
    }
    if (plan->rlimit_fsize) {
        rl.rlim_cur = rl.rlim_max = plan->rlimit_fsize;
        if (setrlimit(RLIMIT_FSIZE, &rl) < 0)
            return -errno;
    }
    if (plan->set_rlimit_as) {
        rl.rlim_cur = rl.rlim_max = plan->rlimit_as;
        if (setrlimit(RLIMIT_AS, &rl) < 0)
            return -errno;
    }
    *step = "drop capabilities from the bounding set";
    int r = drop_bounding_caps(plan->keep_caps);
    if (r < 0)
        return r;
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
    static const char *const writable[] = {"/workspace", "/tmp", "/home/agent", "/dev",
                                           "/proc",      "/run", NULL};
    if ((r = conch_landlock_apply_child(writable)) < 0)
        return r;
    *step = "install seccomp filter";
    if (plan->seccomp && (r = conch_seccomp_install_child(plan->seccomp)) < 0)
        return r;
    return 0;
}

/* fork() without the parent's pthread_atfork handlers: the daemon's libuv registers one that
 * closes and reopens its own pipe fds by number, and in the warden those numbers belong to
 * other fds. */
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

/* The command child: everything between fork() and execve(). On failure, reports through
 * @report_fd (CLOEXEC, so a successful exec closes it) and exits 127. */
__attribute__((noreturn)) static void command_child(const struct jail_plan *plan, int fds[4],
                                                    int report_fd)
{
    struct conch_err err = {0};
    struct jail_msg m = {.type = JMSG_RUN_ERR};
    const char *step = "map command";

    struct stat st;
    if (fstat(fds[3], &st) < 0)
        goto fail_errno;
    char *blob = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fds[3], 0);
    if (blob == MAP_FAILED)
        goto fail_errno;
    const struct jail_cmd_blob *hdr = (const struct jail_cmd_blob *)blob;
    if (hdr->argc == 0 || hdr->argc + hdr->envc + 2 > MAX_ARGS || hdr->size > st.st_size) {
        errno = E2BIG;
        goto fail_errno;
    }
    char **vec = mmap(NULL, MAX_ARGS * sizeof(char *), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (vec == MAP_FAILED)
        goto fail_errno;
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
    step = "set up stdio";
    for (int i = 0; i < 3; i++) {
        if (fds[i] == i) {
            if (fcntl(i, F_SETFD, 0) < 0)
                goto fail_errno;
        } else if (dup2(fds[i], i) < 0) {
            goto fail_errno;
        }
    }
    /* Only fds 0-2 reach the command (and the report fd, which is CLOEXEC). */
    if (report_fd != 3) {
        if (dup3(report_fd, 3, O_CLOEXEC) < 0)
            goto fail_errno;
        report_fd = 3;
    }
    if (syscall(SYS_close_range, 4, ~0U, 0) < 0)
        goto fail_errno;
    reset_signals();
    int r = fence_self(plan, &step);
    if (r < 0) {
        errno = -r;
        goto fail_errno;
    }
    if (chdir(cwd) < 0) {
        conch_err_setk(&err, CONCH_ERR_USAGE, errno, "chdir '%s' inside the sandbox: %s", cwd,
                       strerror(errno));
        goto report;
    }
    exec_in_path(argv[0], argv, envp, path);
    conch_err_setk(&err, CONCH_ERR_COMMAND, errno, "execute '%s': %s", argv[0], strerror(errno));
    goto report;

fail_errno:
    conch_err_set(&err, errno, "start command: %s: %s", step, strerror(errno));
report:
    m.err = err;
    m.a = err.code;
    if (write(report_fd, &m, sizeof(m)) < 0) {
        /* nothing more to do: the parent sees exit status 127 */
    }
    _exit(127);
}

/* The control socket, moved to fd 3 at start: every other fd inherited from the parent
 * (the daemon's listening socket, its clients' connections, its stdio) is closed, so that
 * no sandbox process keeps them open. */
static int warden_ctl = -1;

#define MAX_TREE 8192

/* Send @sig to every descendant of @root (not @root itself), found through
 * /proc/<pid>/task/<tid>/children. Returns how many were signalled. No allocation. */
static int signal_descendants(pid_t root, int sig)
{
    static pid_t stack[MAX_TREE];
    int top = 0, count = 0;
    stack[top++] = root;
    while (top > 0) {
        pid_t pid = stack[--top];
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/task", pid);
        int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
            continue;
        char dents[4096];
        long n;
        while ((n = syscall(SYS_getdents64, dfd, dents, sizeof(dents))) > 0) {
            for (long off = 0; off < n;) {
                struct {
                    uint64_t ino;
                    int64_t off;
                    unsigned short reclen;
                    unsigned char type;
                    char name[];
                } *de = (void *)(dents + off);
                off += de->reclen;
                if (de->name[0] < '0' || de->name[0] > '9')
                    continue;
                char cpath[96];
                snprintf(cpath, sizeof(cpath), "/proc/%d/task/%s/children", pid, de->name);
                int cfd = open(cpath, O_RDONLY | O_CLOEXEC);
                if (cfd < 0)
                    continue;
                char buf[4096];
                ssize_t len = read(cfd, buf, sizeof(buf) - 1);
                close(cfd);
                if (len <= 0)
                    continue;
                buf[len] = '\0';
                for (char *q = buf; *q;) {
                    char *endp;
                    long child = strtol(q, &endp, 10);
                    if (endp == q)
                        break;
                    q = endp;
                    while (*q == ' ')
                        q++;
                    if (child <= 0)
                        continue;
                    kill((pid_t)child, sig);
                    count++;
                    if (top < MAX_TREE)
                        stack[top++] = (pid_t)child;
                }
            }
        }
        close(dfd);
    }
    return count;
}

/* The shepherd of one command: a subreaper, so everything the command forks — double-forked
 * daemons included — stays its descendant. It starts the command, reports it started, waits
 * for it, kills and reaps whatever it left, then reports the exit. */
__attribute__((noreturn)) static void shepherd(const struct jail_plan *plan, int64_t id, int fds[4])
{
    int ctl = warden_ctl;
    struct jail_msg m;
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        _exit(1);
    pid_t cmd = raw_fork();
    if (cmd == 0) {
        close(pipefd[0]);
        command_child(plan, fds, pipefd[1]);
    }
    close(pipefd[1]);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    memset(&m, 0, sizeof(m));
    m.id = id;
    if (cmd < 0) {
        m.type = JMSG_RUN_ERR;
        conch_err_set(&m.err, errno, "fork command: %s", strerror(errno));
        jail_send(ctl, &m, NULL, 0);
        _exit(1);
    }
    ssize_t n;
    do
        n = read(pipefd[0], &m, sizeof(m));
    while (n < 0 && errno == EINTR);
    close(pipefd[0]);
    m.id = id;
    if (n == (ssize_t)sizeof(m)) {
        m.type = JMSG_RUN_ERR;
        waitpid(cmd, NULL, 0);
        jail_send(ctl, &m, NULL, 0);
        _exit(1);
    }
    memset(&m, 0, sizeof(m));
    m.type = JMSG_STARTED;
    m.id = id;
    m.a = cmd;
    jail_send(ctl, &m, NULL, 0);

    int status = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof(ru));
    for (;;) {
        int st;
        struct rusage r1;
        pid_t pid = wait4(-1, &st, 0, &r1);
        if (pid < 0 && errno == EINTR)
            continue;
        if (pid < 0)
            break;
        if (pid == cmd) {
            status = st;
            ru = r1;
            /* The command is done: nothing it started may outlive it. */
            while (signal_descendants(getpid(), SIGKILL) > 0) {
                while (waitpid(-1, NULL, WNOHANG) > 0)
                    ;
            }
        }
    }
    memset(&m, 0, sizeof(m));
    m.type = JMSG_EXITED;
    m.id = id;
    m.a = status;
    m.usage = ru;
    jail_send(ctl, &m, NULL, 0);
    _exit(0);
}

/* A file worker: fenced like a command, then the caller's handler does the request. */
__attribute__((noreturn)) static void file_worker(const struct jail_plan *plan, int fds[2])
{
    if (dup3(fds[0], 3, O_CLOEXEC) < 0 || dup3(fds[1], 4, O_CLOEXEC) < 0)
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
    const char *step;
    if (fence_self(plan, &step) < 0 || chdir("/workspace") < 0)
        _exit(121);
    _exit(plan->file_handler(3, 4) & 0x7f);
}

#define MAX_COMMANDS 1024

struct slot {
    int64_t id;
    pid_t shepherd;
};

/* Kill every process of the sandbox but us, and reap them all. */
static void kill_all_and_reap(void)
{
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
}

__attribute__((noreturn)) void jail_warden_main(const struct jail_plan *plan)
{
    static struct slot slots[MAX_COMMANDS];
    struct jail_msg m;
    struct conch_err err = {0};
    int upper_fd = -1;
    int ctl = plan->ctl_fd;
    /* Handlers inherited from the parent (libuv's write to its own pipes) must never run
     * here: their fds are closed below and the numbers reused. */
    reset_signals();
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

    /* Wait until the parent wrote our id maps (and put us in the cgroup). */
    int fds[4];
    int nfds = 0;
    if (jail_recv(ctl, &m, fds, 0, &nfds) < 0)
        _exit(1);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    /* Become the namespace's own ids: until now we were unmapped kernel ids. */
    if (setresgid(plan->warden_gid, plan->warden_gid, plan->warden_gid) < 0 ||
        setresuid(plan->warden_uid, plan->warden_uid, plan->warden_uid) < 0) {
        conch_err_set(&err, errno, "become uid %u in the user namespace: %s", plan->warden_uid,
                      strerror(errno));
        goto setup_failed;
    }
    /* Commands cannot read our fds through /proc/1/fd: they lack capabilities we hold, so
     * the kernel's ptrace access check refuses them. We stay dumpable so that an
     * unprivileged parent (same uid, owner of our user namespace) can open our upper dir. */
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
    if (jail_mounts_setup_child(plan, &upper_fd, &err) < 0)
        goto setup_failed;

    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_OK;
    m.a = upper_fd;
    if (jail_send(ctl, &m, NULL, 0) < 0)
        _exit(1);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        _exit(1);

    for (;;) {
        struct pollfd pfd[2] = {{.fd = ctl, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) > 0)
                ;
            pid_t pid;
            /* Shepherds, file workers, and orphans of shepherds that died: reap them all. */
            while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
                for (int i = 0; i < MAX_COMMANDS; i++)
                    if (slots[i].shepherd == pid)
                        slots[i].shepherd = 0;
            }
        }
        if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        int r = jail_recv(ctl, &m, fds, 4, &nfds);
        if (r <= 0)
            _exit(0); /* parent gone: everything in the namespace dies with us */
        struct jail_msg reply = {.type = JMSG_RUN_ERR, .id = m.id};
        switch (m.type) {
        case JMSG_RUN: {
            int free_slot = -1;
            for (int i = 0; i < MAX_COMMANDS && free_slot < 0; i++)
                if (slots[i].shepherd == 0)
                    free_slot = i;
            pid_t pid = -1;
            if (nfds != 4)
                conch_err_set(&reply.err, EINVAL, "warden: bad run request");
            else if (free_slot < 0)
                conch_err_setk(&reply.err, CONCH_ERR_LIMIT, EAGAIN,
                               "too many commands running in this sandbox (%d)", MAX_COMMANDS);
            else if ((pid = raw_fork()) == 0)
                shepherd(plan, m.id, fds);
            else if (pid < 0)
                conch_err_set(&reply.err, errno, "fork shepherd: %s", strerror(errno));
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            if (pid > 0) {
                slots[free_slot].id = m.id;
                slots[free_slot].shepherd = pid;
            } else if (jail_send(ctl, &reply, NULL, 0) < 0) {
                _exit(1);
            }
            break;
        }
        case JMSG_FILE: {
            pid_t pid = -1;
            if (nfds != 2 || !plan->file_handler)
                conch_err_set(&reply.err, EINVAL, "warden: file requests are not enabled");
            else if ((pid = raw_fork()) == 0)
                file_worker(plan, fds);
            else if (pid < 0)
                conch_err_set(&reply.err, errno, "fork file worker: %s", strerror(errno));
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            /* On success the answer (or EOF) comes through the response pipe. */
            if (pid <= 0 && jail_send(ctl, &reply, NULL, 0) < 0)
                _exit(1);
            break;
        }
        case JMSG_SIGNAL:
            for (int i = 0; i < MAX_COMMANDS; i++)
                if (slots[i].shepherd > 0 && slots[i].id == m.id)
                    signal_descendants(slots[i].shepherd, m.a);
            break;
        case JMSG_SHUTDOWN:
        default:
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            kill_all_and_reap();
            _exit(0);
        }
    }

setup_failed:
    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_ERR;
    m.err = err;
    jail_send(ctl, &m, NULL, 0);
    _exit(1);
}
