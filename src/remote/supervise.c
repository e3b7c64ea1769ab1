/* supervise.c - `conch serve --listen` keeps its gateway running: a thread of the daemon
 * process execs this binary as `conch __gateway` once the daemon listens, watches it through a
 * pidfd (the daemon reaps every child, so waitpid is not ours to count on), restarts it when
 * it dies (with backoff), forwards SIGHUP, and stops it when the daemon stops. */
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/log.h"
#include "remote/remote.h"

extern char **environ;

struct conch_remote_super {
    int exe_fd;
    char **argv; /* a copy; argv[sock_arg] is filled when the daemon listens */
    int sock_arg;
    int cmd[2]; /* a pipe: 'L' listening, 'H' SIGHUP, 'S' stop */
    pthread_t thread;
    bool thread_started;
};

static void argv_free(char **argv)
{
    if (!argv)
        return;
    for (char **a = argv; *a; a++)
        free(*a);
    free(argv);
}

struct conch_remote_super *conch_remote_super_new(int exe_fd, char *const *argv,
                                                  struct conch_err *err)
{
    struct conch_remote_super *s = calloc(1, sizeof(*s));
    size_t n = 0;
    while (argv[n])
        n++;
    if (s)
        s->argv = calloc(n + 3, sizeof(char *));
    if (!s || !s->argv) {
        free(s);
        conch_err_set(err, ENOMEM, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        if (!(s->argv[i] = strdup(argv[i])))
            goto oom;
    /* The socket's path goes last: --socket PATH. */
    if (!(s->argv[n] = strdup("--socket")))
        goto oom;
    s->sock_arg = (int)n + 1;
    s->exe_fd = exe_fd;
    s->cmd[0] = s->cmd[1] = -1;
    if (pipe2(s->cmd, O_CLOEXEC) < 0) {
        conch_err_set(err, errno, "pipe: %s", strerror(errno));
        argv_free(s->argv);
        free(s);
        return NULL;
    }
    return s;
oom:
    argv_free(s->argv);
    free(s);
    conch_err_set(err, ENOMEM, "out of memory");
    return NULL;
}

/* Start the gateway; returns its pidfd, or -errno. Between clone and exec the child only makes
 * system calls (this process has other threads). */
static int spawn(struct conch_remote_super *s)
{
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
        return -errno;
    pid_t parent = getpid();
    int pidfd = -1;
    struct clone_args ca = {
        .flags = CLONE_PIDFD, .pidfd = (uint64_t)(uintptr_t)&pidfd, .exit_signal = SIGCHLD};
    long pid = syscall(SYS_clone3, &ca, sizeof(ca));
    if (pid < 0) {
        int e = errno;
        close(devnull);
        return -e;
    }
    if (pid == 0) {
        /* The gateway dies with the daemon (this thread lives as long as the daemon). */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        dup2(devnull, 0);
        syscall(SYS_execveat, s->exe_fd, "", s->argv, environ, AT_EMPTY_PATH);
        _exit(127);
    }
    close(devnull);
    return pidfd;
}

static void reap(int pidfd, const char *what)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    /* The daemon's SIGCHLD handler may have reaped it first: then the status is gone. */
    if (syscall(SYS_waitid, P_PIDFD, pidfd, &si, WEXITED | WNOHANG, NULL) == 0 && si.si_pid)
        log_warn("gateway %s (%s %d)", what, si.si_code == CLD_EXITED ? "exit status" : "signal",
                 si.si_status);
    else
        log_warn("gateway %s", what);
}

static void stop_gateway(int pidfd)
{
    syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, NULL, 0);
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    if (poll(&p, 1, 5000) <= 0) {
        log_warn("gateway: still running 5 s after SIGTERM: killing it");
        syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
        poll(&p, 1, 5000);
    }
    siginfo_t si;
    syscall(SYS_waitid, P_PIDFD, pidfd, &si, WEXITED | WNOHANG, NULL);
}

static void *super_thread(void *arg)
{
    struct conch_remote_super *s = arg;
    int pidfd = -1;
    bool listening = false;
    uint64_t started = 0, next_start = 0, backoff = 100;
    for (;;) {
        uint64_t now = conch_clock_ms();
        if (listening && pidfd < 0 && now >= next_start) {
            pidfd = spawn(s);
            started = now;
            if (pidfd < 0) {
                log_error("gateway: could not start it: %s", strerror(-pidfd));
                next_start = now + backoff;
                backoff = backoff * 2 > 10000 ? 10000 : backoff * 2;
            }
        }
        struct pollfd p[2] = {{.fd = s->cmd[0], .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
        int timeout = listening && pidfd < 0 ? (int)(next_start > now ? next_start - now : 0) : -1;
        int n = poll(p, pidfd >= 0 ? 2 : 1, timeout);
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (p[0].revents) {
            char c = 0;
            if (read(s->cmd[0], &c, 1) != 1 || c == 'S')
                break;
            if (c == 'L')
                listening = true;
            else if (c == 'H' && pidfd >= 0)
                syscall(SYS_pidfd_send_signal, pidfd, SIGHUP, NULL, 0);
        }
        if (pidfd >= 0 && p[1].revents) {
            uint64_t ran = conch_clock_ms() - started;
            reap(pidfd, "exited: restarting it");
            close(pidfd);
            pidfd = -1;
            if (ran > 10000)
                backoff = 100;
            next_start = conch_clock_ms() + backoff;
            backoff = backoff * 2 > 10000 ? 10000 : backoff * 2;
        }
    }
    if (pidfd >= 0) {
        stop_gateway(pidfd);
        close(pidfd);
    }
    return NULL;
}

static void send_cmd(struct conch_remote_super *s, char c)
{
    ssize_t n;
    do
        n = write(s->cmd[1], &c, 1);
    while (n < 0 && errno == EINTR);
}

void conch_remote_super_listening(struct conch_remote_super *s, const char *socket_path)
{
    if (s->thread_started)
        return;
    s->argv[s->sock_arg] = strdup(socket_path);
    if (!s->argv[s->sock_arg]) {
        log_error("gateway: out of memory: not started");
        return;
    }
    /* Signals stay the daemon's loop's: the thread blocks them all. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int r = pthread_create(&s->thread, NULL, super_thread, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0) {
        log_error("gateway: could not start its supervisor thread: %s", strerror(r));
        return;
    }
    s->thread_started = true;
    send_cmd(s, 'L');
}

void conch_remote_super_sighup(struct conch_remote_super *s)
{
    if (s->thread_started)
        send_cmd(s, 'H');
}

void conch_remote_super_free(struct conch_remote_super *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        send_cmd(s, 'S');
        pthread_join(s->thread, NULL);
    }
    close(s->cmd[0]);
    close(s->cmd[1]);
    close(s->exe_fd);
    argv_free(s->argv);
    free(s);
}
