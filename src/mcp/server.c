/* server.c - the stdio transport: one MCP session (session.c) between the JSON-RPC lines of
 * the MCP client on stdin/stdout and a daemon child (`conch serve --stdio`) of its own, in a
 * private state dir; ends on EOF or a signal. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "mcp/mcp-internal.h"
#include "mcp/mcp.h"
#include "rpc/rpc.h"

#define MAX_CLIENT_LINE (32u << 20) /* tool arguments: a write_file of a large file */
#define DAEMON_MAX_MESSAGE "48M"    /* the child's --max-message: above MAX_CLIENT_LINE */

/* The stdio transport's own state; the session's is in struct mcp (session.c). */
struct stdio_srv {
    const struct conch_mcp_opts *o;
    int out_fd;
    bool client_gone;
    int child_in, child_out; /* the daemon's stdin (we write), stdout (we read) */
    pid_t child;
    char state_dir[4096];
    bool private_state;
    struct mcp_linebuf from_client;
};

/* The session's messages for the client: one line each on stdout. */
static void to_client(void *ctx, json_t *msg)
{
    struct stdio_srv *m = ctx;
    if (m->client_gone) {
        json_decref(msg);
        return;
    }
    char *s = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    if (!s)
        return;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return;
    }
    line[n] = '\n';
    if (conch_write_all(m->out_fd, line, n + 1) < 0)
        m->client_gone = true;
    free(line);
}

static int spawn_child(struct stdio_srv *m, const sigset_t *old_mask, struct conch_err *err)
{
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) < 0)
        return conch_err_set(err, errno, "pipe: %s", strerror(errno));
    if (pipe2(out, O_CLOEXEC) < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        return conch_err_set(err, e, "pipe: %s", strerror(e));
    }
    const char *exe = m->o->conch_exe ? m->o->conch_exe : "/proc/self/exe";
    char *const argv[] = {(char *)"conch",
                          (char *)"serve",
                          (char *)"--stdio",
                          (char *)"--state-dir",
                          m->state_dir,
                          (char *)"--pool",
                          (char *)"0",
                          (char *)"--idle-timeout",
                          (char *)"0",
                          (char *)"--max-message",
                          (char *)DAEMON_MAX_MESSAGE,
                          NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        close(out[0]);
        close(out[1]);
        return conch_err_set(err, e, "fork: %s", strerror(e));
    }
    if (pid == 0) {
        /* The daemon's stdin and stdout are our pipes, its stderr is ours (MCP clients log
         * it); it dies with us. */
        if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
            _exit(127);
        signal(SIGPIPE, SIG_DFL);
        sigprocmask(SIG_SETMASK, old_mask, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        execv(exe, argv);
        dprintf(2, "conch mcp: cannot run '%s serve --stdio': %s\n", exe, strerror(errno));
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    m->child = pid;
    m->child_in = in[1];
    m->child_out = out[0];
    return 0;
}

/* Wait up to @ms for the child to exit; returns its status or -1. */
static int wait_child(struct stdio_srv *m, int ms)
{
    for (int waited = 0;; waited += 10) {
        int st;
        pid_t r = waitpid(m->child, &st, WNOHANG);
        if (r == m->child)
            return st;
        if (r < 0 && errno != EINTR)
            return -1;
        if (waited >= ms)
            return -1;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

void conch_mcp_opts_init(struct conch_mcp_opts *o)
{
    memset(o, 0, sizeof(*o));
    conch_spec_defaults(&o->sandbox);
    o->timeout_ms = 120000;
    o->max_output = 64 * 1024;
}

static void remove_stale(const char *parent)
{
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, "mcp-", 4) || strlen(de->d_name) != 10)
            continue;
        char path[4200], db[4300];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", parent, de->d_name);
        if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
            time(NULL) - st.st_mtime < 60)
            continue;
        snprintf(db, sizeof(db), "%s/state.db", path);
        int fd = open(db, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0) {
            close(fd);
            continue;
        }
        conch_rm_path(path, CONCH_RM_ONE_FS);
        if (fd >= 0)
            close(fd);
    }
    closedir(d);
}

static int make_private_state(struct stdio_srv *m, struct conch_err *err)
{
    int r = conch_mkdir_p(m->o->state_parent, 0700, err);
    if (r < 0)
        return conch_err_wrap(err, "state directory");
    remove_stale(m->o->state_parent);
    int n = snprintf(m->state_dir, sizeof(m->state_dir), "%s/mcp-XXXXXX", m->o->state_parent);
    if (n < 0 || (size_t)n >= sizeof(m->state_dir))
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if (!mkdtemp(m->state_dir))
        return conch_err_set(err, errno, "make a state directory in '%s': %s", m->o->state_parent,
                             strerror(errno));
    m->private_state = true;
    return 0;
}

int conch_mcp_serve(const struct conch_mcp_opts *o, int in_fd, int out_fd, struct conch_err *err)
{
    struct stdio_srv m = {.o = o, .out_fd = out_fd, .child_in = -1, .child_out = -1};
    m.from_client.max = MAX_CLIENT_LINE;
    struct mcp *s = NULL;
    int r;
    json_t *tools_list = conch_mcp_tools_list(err);
    if (!tools_list)
        return -err->code;
    if (o->state_dir) {
        snprintf(m.state_dir, sizeof(m.state_dir), "%s", o->state_dir);
    } else if (!o->state_parent) {
        r = conch_err_set(err, EINVAL, "no state directory given");
        goto out;
    } else if ((r = make_private_state(&m, err)) < 0) {
        goto out;
    }

    /* SIGTERM, SIGINT, SIGHUP end the session like EOF (an MCP client that does not close
     * stdin first, or a terminal that goes away). */
    sigset_t mask, old;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    if ((r = spawn_child(&m, &old, err)) < 0)
        goto out_sig;
    const struct mcp_io io = {.to_client = to_client, .ctx = &m};
    s = conch_mcp_session_new(o, tools_list, &io, m.child_in, m.child_out, m.state_dir);
    if (!s) {
        r = conch_err_set(err, ENOMEM, "out of memory");
        goto out_child;
    }

    bool quit = false, in_eof = false, child_gone = false;
    while (!quit && !m.client_gone) {
        struct pollfd p[3] = {{.fd = in_eof ? -1 : in_fd, .events = POLLIN},
                              {.fd = child_gone ? -1 : m.child_out, .events = POLLIN},
                              {.fd = sfd, .events = POLLIN}};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            r = conch_err_set(err, errno, "poll: %s", strerror(errno));
            break;
        }
        if (p[2].revents) {
            struct signalfd_siginfo si;
            if (read(sfd, &si, sizeof(si)) > 0)
                fprintf(stderr, "conch mcp: signal %u: ending the session\n", si.ssi_signo);
            quit = true;
        }
        if (p[1].revents && !conch_mcp_session_daemon_input(s)) {
            child_gone = true;
            fprintf(stderr, "conch mcp: conch's daemon exited; tools now fail\n");
        }
        if (p[0].revents && !quit) {
            int got = conch_mcp_linebuf_fill(&m.from_client, in_fd);
            if (got > 0) {
                conch_mcp_linebuf_lines(&m.from_client, s, conch_mcp_session_line,
                                        conch_mcp_session_too_large);
            } else {
                in_eof = true;
                quit = true;
            }
        }
    }
    r = conch_mcp_session_end(s, err);
out_child:
    close(m.child_in);
    m.child_in = -1;
    if (wait_child(&m, 10000) < 0) {
        kill(m.child, SIGKILL);
        wait_child(&m, 5000);
    }
    if (m.private_state)
        conch_rm_path(m.state_dir, CONCH_RM_ONE_FS);
    conch_mcp_session_free(s);
    if (m.child_out >= 0)
        close(m.child_out);
out_sig:
    if (sfd >= 0)
        close(sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (r < 0 && m.private_state && m.child == 0)
        rmdir(m.state_dir);
out:
    free(m.from_client.buf);
    json_decref(tools_list);
    return r;
}

/* Here, not in http.c: the CLI sets the defaults in both executables, and http.c (TLS) is
 * linked into conch-remote alone. */
void conch_mcp_http_opts_init(struct conch_mcp_http_opts *h)
{
    memset(h, 0, sizeof(*h));
    h->max_body = 32u << 20;
    h->max_sessions = 64;
    h->idle_timeout_s = 1800;
}
