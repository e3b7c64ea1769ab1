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
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    step = "set resource limits";
    struct rlimit rl = {0, 0};
    if (setrlimit(RLIMIT_CORE, &rl) < 0)
        goto fail_errno;
    if (plan->set_rlimit_nproc) {
        rl.rlim_cur = rl.rlim_max = plan->rlimit_nproc;
        if (setrlimit(RLIMIT_NPROC, &rl) < 0)
            goto fail_errno;
    }
    if (plan->set_rlimit_as) {
        rl.rlim_cur = rl.rlim_max = plan->rlimit_as;
        if (setrlimit(RLIMIT_AS, &rl) < 0)
            goto fail_errno;
    }

    step = "drop capabilities from the bounding set";
    int r = drop_bounding_caps(plan->keep_caps);
    if (r < 0) {
        errno = -r;
        goto fail_errno;
    }
    step = "switch to the command's identity";
    if (plan->can_setgroups && setgroups(0, NULL) < 0)
        goto fail_errno;
    if (setresgid(plan->cmd_gid, plan->cmd_gid, plan->cmd_gid) < 0)
        goto fail_errno;
    if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
        goto fail_errno;
    if (setresuid(plan->cmd_uid, plan->cmd_uid, plan->cmd_uid) < 0)
        goto fail_errno;
    step = "drop capabilities";
    r = drop_caps(plan->keep_caps);
    if (r < 0) {
        errno = -r;
        goto fail_errno;
    }
    step = "set no_new_privs";
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        goto fail_errno;
    step = "chdir";
    if (chdir(cwd) < 0) {
        conch_err_setk(&err, CONCH_ERR_USAGE, errno, "chdir '%s' inside the sandbox: %s", cwd,
                       strerror(errno));
        goto report;
    }
    step = "apply Landlock";
    static const char *const writable[] = {"/workspace", "/tmp", "/home/agent", "/dev",
                                           "/proc",      "/run", NULL};
    r = conch_landlock_apply_child(writable);
    if (r < 0) {
        errno = -r;
        goto fail_errno;
    }
    step = "install seccomp filter";
    if (plan->seccomp) {
        r = conch_seccomp_install_child(plan->seccomp);
        if (r < 0) {
            errno = -r;
            goto fail_errno;
        }
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

/* Start a command; returns its pid or -errno with @err filled. */
static pid_t start_command(const struct jail_plan *plan, int fds[4], struct conch_err *err)
{
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0)
        return conch_err_set(err, errno, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(pipefd[0]);
        close(pipefd[1]);
        return conch_err_set(err, e, "fork command: %s", strerror(e));
    }
    if (pid == 0) {
        close(pipefd[0]);
        close(plan->ctl_fd);
        command_child(plan, fds, pipefd[1]);
    }
    close(pipefd[1]);
    struct jail_msg m;
    ssize_t n;
    do
        n = read(pipefd[0], &m, sizeof(m));
    while (n < 0 && errno == EINTR);
    close(pipefd[0]);
    if (n == (ssize_t)sizeof(m)) {
        *err = m.err;
        waitpid(pid, NULL, 0);
        return -(err->code ? err->code : EIO);
    }
    return pid;
}

/* Kill every process of the sandbox but us, and reap them all. */
static void kill_all_and_reap(void)
{
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
}

__attribute__((noreturn)) void jail_warden_main(const struct jail_plan *plan)
{
    struct jail_msg m;
    struct conch_err err = {0};
    int upper_fd = -1;
    int ctl = plan->ctl_fd;

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

    pid_t cmd = 0;
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
            int status;
            struct rusage ru;
            pid_t pid;
            while ((pid = wait4(-1, &status, WNOHANG, &ru)) > 0) {
                if (pid != cmd)
                    continue;
                /* The command is done: nothing it started may outlive it. */
                kill_all_and_reap();
                memset(&m, 0, sizeof(m));
                m.type = JMSG_EXITED;
                m.a = status;
                m.usage = ru;
                cmd = 0;
                if (jail_send(ctl, &m, NULL, 0) < 0)
                    _exit(1);
            }
        }
        if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        int r = jail_recv(ctl, &m, fds, 4, &nfds);
        if (r <= 0)
            _exit(0); /* parent gone: everything in the namespace dies with us */
        switch (m.type) {
        case JMSG_RUN: {
            struct jail_msg reply = {0};
            if (nfds != 4 || cmd > 0) {
                conch_err_set(&reply.err, EINVAL, "warden: bad run request");
                reply.type = JMSG_RUN_ERR;
            } else {
                pid_t pid = start_command(plan, fds, &reply.err);
                if (pid > 0) {
                    cmd = pid;
                    reply.type = JMSG_STARTED;
                    reply.a = pid;
                } else {
                    reply.type = JMSG_RUN_ERR;
                }
            }
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            if (jail_send(ctl, &reply, NULL, 0) < 0)
                _exit(1);
            break;
        }
        case JMSG_SIGNAL:
            if (m.b)
                kill(-1, m.a);
            else if (cmd > 0)
                kill(cmd, m.a);
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
