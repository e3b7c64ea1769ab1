/* remote-conn.c - the CLI's connection to a remote daemon (`--remote URL`, $CONCH_URL), the
 * options that name it, and where the TLS code lives. The WebSocket on TLS to `conch serve
 * --listen` (docs/PROTOCOL.md, "Remote transport") is made by `conch-remote __connect`
 * (remote-bridge.c), a second executable beside this one: libwebsockets and OpenSSL are linked
 * into it alone, so that every other process this binary starts (a warden per sandbox above
 * all) stays small and quick to start. The verb reads and writes its end of a socketpair as
 * the usual line-framed fd; the bridge process holds the other end. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/conn.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/sha256.h"

#define TOKEN_MAX 4096

/* What --remote and --token-file said (main.c or a verb's option parser). */
static const char *opt_url;
static char file_token[TOKEN_MAX];
static bool file_token_set;

int conch_cli_remote_parse_url(const char *url, char *host, size_t hsize, int *port, char *path,
                               size_t psize, struct conch_err *err)
{
    if (strncmp(url, "wss://", 6) != 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "remote URL '%s': the scheme must be wss:// (TLS; a token is "
                              "never sent in the clear)",
                              url);
    const char *h = url + 6, *end = h + strcspn(h, "/?#");
    if (memchr(h, '@', (size_t)(end - h)))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "remote URL: put the token in CONCH_TOKEN or --token-file, not "
                              "in the URL");
    const char *hs = h, *he, *colon;
    if (*h == '[') {
        hs = h + 1;
        he = memchr(hs, ']', (size_t)(end - hs));
        if (!he)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "remote URL '%s': bad host", url);
        colon = he[1] == ':' ? he + 1 : NULL;
    } else {
        colon = memchr(h, ':', (size_t)(end - h));
        he = colon ? colon : end;
    }
    if (he == hs || (size_t)(he - hs) >= hsize)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "remote URL '%s': bad host", url);
    memcpy(host, hs, (size_t)(he - hs));
    host[he - hs] = '\0';
    *port = 443;
    if (colon) {
        char *e = NULL;
        long p = strtol(colon + 1, &e, 10);
        if (e != end || p < 1 || p > 65535)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "remote URL '%s': bad port", url);
        *port = (int)p;
    }
    const char *p = *end == '/' ? end : "/rpc";
    if (*end && *end != '/')
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "remote URL '%s': bad path", url);
    if (strlen(p) >= psize)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "remote URL '%s': too long", url);
    strcpy(path, p);
    return 0;
}

int conch_cli_remote_set_url(const char *url, struct conch_err *err)
{
    char host[256], path[1024];
    int port;
    int r = conch_cli_remote_parse_url(url, host, sizeof(host), &port, path, sizeof(path), err);
    if (r < 0)
        return r;
    opt_url = url;
    return 0;
}

int conch_cli_remote_set_token_file(const char *file, struct conch_err *err)
{
    _cleanup_close_ int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--token-file '%s': %s", file,
                              strerror(errno));
    if (!S_ISREG(st.st_mode))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--token-file '%s': not a regular file",
                              file);
    if (st.st_uid != geteuid() || (st.st_mode & 077))
        return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                              "--token-file '%s': must be owned by you and readable by no one "
                              "else (chmod 600 '%s')",
                              file, file);
    ssize_t n = read(fd, file_token, sizeof(file_token) - 1);
    if (n < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--token-file '%s': %s", file,
                              strerror(errno));
    file_token[n] = '\0';
    file_token[strcspn(file_token, "\r\n")] = '\0';
    if (!file_token[0])
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--token-file '%s': empty", file);
    file_token_set = true;
    return 0;
}

const char *conch_cli_remote_url(void)
{
    if (opt_url)
        return opt_url;
    const char *e = getenv("CONCH_URL");
    return e && *e ? e : NULL;
}

bool conch_cli_remote_given(void)
{
    return opt_url != NULL || file_token_set;
}

int conch_cli_remote_helper(struct conch_err *err)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0)
        return conch_err_set(err, errno, "readlink /proc/self/exe: %s", strerror(errno));
    self[n] = '\0';
    char *dir = dirname(self);
    char beside[PATH_MAX + 32], installed[PATH_MAX + 64];
    snprintf(beside, sizeof(beside), "%s/conch-remote", dir);
    snprintf(installed, sizeof(installed), "%s/../libexec/conch/conch-remote", dir);
    const char *paths[] = {beside, installed};
    for (size_t i = 0; i < 2; i++) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            return fd;
    }
    return conch_err_set(err, ENOENT,
                         "the remote transports (TLS) run in conch-remote, found neither at "
                         "'%s' nor at '%s': install it beside conch (ninja -C build builds both)",
                         beside, installed);
}

int conch_cli_remote_exec(int helper, char **argv, char **envp)
{
    extern char **environ;
    execveat(helper, "", argv, envp ? envp : environ, AT_EMPTY_PATH);
    return -errno;
}

static int connected_fd = -1;

int conch_cli_remote_connect(struct conch_err *err)
{
    const char *url = conch_cli_remote_url();
    if (connected_fd >= 0)
        return conch_err_set(err, EBUSY, "one remote connection per process (a bug of conch)");
    char host[256], path[1024];
    int port;
    int r = conch_cli_remote_parse_url(url, host, sizeof(host), &port, path, sizeof(path), err);
    if (r < 0)
        return r;
    const char *tok = file_token_set ? file_token : getenv("CONCH_TOKEN");
    if (tok && strlen(tok) >= TOKEN_MAX)
        return conch_err_set(err, EINVAL, "the token is over %d bytes", TOKEN_MAX - 1);
    if (tok && strpbrk(tok, "\r\n"))
        return conch_err_set(err, EINVAL, "the token holds a line break");
    _cleanup_close_ int helper = conch_cli_remote_helper(err);
    if (helper < 0)
        return helper;
    int sv[2], status[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return conch_err_set(err, errno, "socketpair: %s", strerror(errno));
    if (pipe2(status, O_CLOEXEC) < 0) {
        r = conch_err_set(err, errno, "pipe: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return r;
    }
    /* The token travels in the bridge's environment (readable by this uid alone, as
     * $CONCH_TOKEN is already), never on its command line. */
    extern char **environ;
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    _cleanup_free_ char **envp = calloc(nenv + 2, sizeof(*envp));
    if (!envp) {
        close(sv[0]);
        close(sv[1]);
        close(status[0]);
        close(status[1]);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    char tokenvar[TOKEN_MAX + 16];
    snprintf(tokenvar, sizeof(tokenvar), "CONCH_TOKEN=%s", tok ? tok : "");
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "CONCH_TOKEN=", 12) != 0)
            envp[k++] = environ[i];
    envp[k] = tokenvar;
    pid_t pid = fork();
    if (pid == 0) {
        /* The helper's fd above 4 first: it may be 3 or 4 now. */
        int h = fcntl(helper, F_DUPFD_CLOEXEC, 5);
        if (h < 0 || dup2(sv[1], 3) < 0 || dup2(status[1], 4) < 0)
            _exit(127);
        close_range(5, (unsigned)h - 1, 0);
        close_range((unsigned)h + 1, ~0U, 0);
        helper = h;
        signal(SIGPIPE, SIG_DFL);
        /* Ctrl-C and Ctrl-\ reach the terminal's whole process group: they are the verb's
         * to handle (exec sends them on as exec.signal), over this connection. */
        signal(SIGINT, SIG_IGN);
        signal(SIGQUIT, SIG_IGN);
        char *argv[] = {"conch-remote", "__connect", (char *)url, NULL};
        int e = -conch_cli_remote_exec(helper, argv, envp);
        char msg[128];
        int m = snprintf(msg, sizeof(msg), "-cannot start conch-remote: %s", strerror(e));
        (void)!write(4, msg, (size_t)m);
        _exit(127);
    }
    int saved = errno;
    conch_secure_zero(tokenvar, sizeof(tokenvar));
    conch_secure_zero(file_token, sizeof(file_token));
    close(sv[1]);
    close(status[1]);
    if (pid < 0) {
        close(sv[0]);
        close(status[0]);
        return conch_err_set(err, saved, "fork: %s", strerror(saved));
    }
    /* The bridge says "+" once connected, or "-" and why not, then closes the pipe. */
    char buf[1024];
    size_t got = 0;
    for (;;) {
        ssize_t n = read(status[0], buf + got, sizeof(buf) - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
        if (got == sizeof(buf) - 1 || buf[0] == '+')
            break;
    }
    close(status[0]);
    buf[got] = '\0';
    if (got && buf[0] == '+') {
        connected_fd = sv[0];
        return sv[0];
    }
    close(sv[0]);
    waitpid(pid, NULL, 0);
    return conch_err_set(err, ECONNREFUSED, "cannot reach the remote daemon at %s: %s", url,
                         got > 1 ? buf + 1 : "conch-remote ended before it connected");
}
