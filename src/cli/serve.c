/* serve.c - `conch serve` (the daemon) and `conch gc`. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon.h"
#include "daemon/recover.h"
#include "daemon/state.h"
#include "remote/remote.h"

static const char serve_usage[] =
    "usage: conch serve [--socket PATH | --stdio] [options]\n"
    "\n"
    "Serve JSON-RPC 2.0 (docs/PROTOCOL.md): long-lived sandboxes for agent harnesses.\n"
    "\n"
    "  --socket PATH       unix socket (default: $XDG_RUNTIME_DIR/conch/conch.sock, else\n"
    "                      /tmp/conch-<uid>/conch.sock; /run/conch/conch.sock as root); mode\n"
    "                      0600, same uid or root only; its directory must be yours (or\n"
    "                      root's) and writable by no one else\n"
    "  --stdio             serve one client on stdin/stdout; when stdin closes, destroy its\n"
    "                      sandboxes (commands still running are killed) and exit. Without\n"
    "                      --state-dir it keeps its state in a private directory of its own\n"
    "                      (<default>/stdio/XXXXXX, removed on exit), so any number can run\n"
    "                      side by side; defaults: --pool 0, --idle-timeout 0\n"
    "  --state-dir DIR     database, upper dirs and spill files (default: /var/lib/conch as\n"
    "                      root, else $XDG_STATE_HOME/conch); one daemon per directory: a\n"
    "                      second one is refused\n"
    "  --max-message BYTES largest JSON-RPC line (default 16M)\n"
    "  --pool N            pre-built sandboxes for exec.run {fresh: true} (default 4)\n"
    "  --max-sandboxes N   (default 256)\n"
    "  --idle-timeout S    destroy a sandbox unused this long (default 3600; 0 = never)\n"
    "  --tokens FILE       tenants: lines `TENANT TOKEN [sandboxes=N memory=SIZE disk=SIZE\n"
    "                      commands=N]` (`admin` sees all tenants); the file must be yours,\n"
    "                      mode 0600 or stricter; a connection that calls connection.auth\n"
    "                      with a token is that tenant's; reloaded on SIGHUP\n"
    "\n"
    "Budgets of what sandboxes and clients make the daemon hold (see docs/ARCHITECTURE.md):\n"
    "  --max-output-memory BYTES\n"
    "                      output of all commands kept in memory together (default 64M);\n"
    "                      past it, output goes to the spill files early\n"
    "  --net-hosts FILE    names the network proxy resolves by FILE (hosts format) before\n"
    "                      DNS, as for tests that stand in local servers for registries\n"
    "  --max-sandbox-held BYTES\n"
    "                      what the daemon holds for one sandbox (default 64M): its tool\n"
    "                      bridge's partial lines, unread answers and calls in flight, its\n"
    "                      file answers being read and checked, its sessions' scrollback\n"
    "                      and keys waiting for the terminal; past it, what does not fit\n"
    "                      is refused (`limit`) or kept smaller (scrollback)\n"
    "  --max-held BYTES    the same for all sandboxes together (default 256M)\n"
    "  --max-client-output-memory BYTES\n"
    "                      responses queued for clients that do not read them, all\n"
    "                      clients together (default 128M; each client also at most 64M):\n"
    "                      past it, the clients with the most unread are disconnected\n"
    "  (--max-sandbox-bridge-memory and --max-bridge-memory are older names of the two)\n"
    "\n"
    "The remote transport (conch-serve(1); docs/PROTOCOL.md, \"The wss transport\"):\n"
    "  --listen ADDR:PORT  also serve wss://ADDR:PORT/rpc (and /healthz) from a gateway\n"
    "                      process of its own, restarted if it dies; ADDR is an IP address\n"
    "                      ([::] for IPv6); needs --tls-cert, --tls-key and --tokens (above);\n"
    "                      SIGHUP also reloads the certificate and key\n"
    "  --tls-cert FILE     PEM certificate chain (TLS 1.2 and 1.3 only)\n"
    "  --tls-key FILE      its PEM private key\n"
    "  --max-connections N remote clients at once (default 4096); more are answered 503\n";

enum {
    OPT_SOCKET = 1,
    OPT_STDIO,
    OPT_STATE_DIR,
    OPT_MAX_MESSAGE,
    OPT_POOL,
    OPT_MAX_SANDBOXES,
    OPT_IDLE,
    OPT_MAX_OUTPUT_MEMORY,
    OPT_MAX_CLIENT_OUTPUT_MEMORY,
    OPT_MAX_HELD,
    OPT_MAX_SANDBOX_HELD,
    OPT_NET_HOSTS,
    OPT_LISTEN,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TOKENS,
    OPT_MAX_CONNECTIONS
};

static const struct conch_cli_opt serve_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"stdio", 0, false, OPT_STDIO},
    {"state-dir", 0, true, OPT_STATE_DIR},
    {"max-message", 0, true, OPT_MAX_MESSAGE},
    {"pool", 0, true, OPT_POOL},
    {"max-sandboxes", 0, true, OPT_MAX_SANDBOXES},
    {"idle-timeout", 0, true, OPT_IDLE},
    {"max-output-memory", 0, true, OPT_MAX_OUTPUT_MEMORY},
    {"max-client-output-memory", 0, true, OPT_MAX_CLIENT_OUTPUT_MEMORY},
    {"max-held", 0, true, OPT_MAX_HELD},
    {"max-sandbox-held", 0, true, OPT_MAX_SANDBOX_HELD},
    {"max-bridge-memory", 0, true, OPT_MAX_HELD},
    {"max-sandbox-bridge-memory", 0, true, OPT_MAX_SANDBOX_HELD},
    {"net-hosts", 0, true, OPT_NET_HOSTS},
    {"listen", 0, true, OPT_LISTEN},
    {"tls-cert", 0, true, OPT_TLS_CERT},
    {"tls-key", 0, true, OPT_TLS_KEY},
    {"tokens", 0, true, OPT_TOKENS},
    {"max-connections", 0, true, OPT_MAX_CONNECTIONS},
    {NULL, 0, false, 0},
};

struct serve_cli {
    struct conch_daemon_opts o;
    bool pool_set, idle_set;
    const char *listen, *tls_cert, *tls_key, *tokens, *max_connections;
};

static int serve_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct serve_cli *c = ctx;
    uint64_t v = 0;
    int r = 0;
    switch (key) {
    case OPT_SOCKET:
        c->o.socket_path = value;
        break;
    case OPT_STDIO:
        c->o.stdio = true;
        break;
    case OPT_STATE_DIR:
        c->o.state_dir = value;
        break;
    case OPT_MAX_MESSAGE:
        r = conch_parse_size(value, "--max-message", &v, err);
        c->o.max_message = (size_t)v;
        if (r == 0 && v < 1024)
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--max-message: at least 1024");
        break;
    case OPT_POOL: {
        /* 0 is a pool of none; more than 64 is 64. */
        char *end = NULL;
        errno = 0;
        v = value[0] == '-' ? 0 : strtoull(value, &end, 10);
        if (value[0] == '-' || (errno && errno != ERANGE) || end == value || *end)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "--pool: '%s' is not a number of sandboxes", value);
        c->o.pool_size = (unsigned)(errno == ERANGE || v > 64 ? 64 : v);
        c->pool_set = true;
        break;
    }
    case OPT_MAX_SANDBOXES:
        r = conch_cli_parse_count(value, "--max-sandboxes", &v, err);
        c->o.max_sandboxes = (unsigned)v;
        break;
    case OPT_IDLE:
        r = conch_cli_parse_seconds(value, "--idle-timeout", &v, err);
        c->o.idle_timeout = (double)v / 1000;
        c->idle_set = true;
        break;
    case OPT_MAX_OUTPUT_MEMORY:
        r = conch_parse_size(value, "--max-output-memory", &c->o.max_output_memory, err);
        break;
    case OPT_MAX_CLIENT_OUTPUT_MEMORY:
        r = conch_parse_size(value, "--max-client-output-memory", &c->o.max_client_output_memory,
                             err);
        break;
    case OPT_MAX_HELD:
        r = conch_parse_size(value, "--max-held", &c->o.max_held, err);
        if (r == 0 && c->o.max_held < 64 * 1024)
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--max-held: at least 64K");
        break;
    case OPT_MAX_SANDBOX_HELD:
        r = conch_parse_size(value, "--max-sandbox-held", &c->o.max_sandbox_held, err);
        if (r == 0 && c->o.max_sandbox_held < 64 * 1024)
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                               "--max-sandbox-held: at least 64K (a connection and a short "
                               "call must fit)");
        break;
    case OPT_NET_HOSTS:
        c->o.net_hosts = value;
        break;
    case OPT_LISTEN:
        c->listen = value;
        break;
    case OPT_TLS_CERT:
        c->tls_cert = value;
        break;
    case OPT_TLS_KEY:
        c->tls_key = value;
        break;
    case OPT_TOKENS:
        c->tokens = value;
        c->o.tokens_path = value;
        break;
    case OPT_MAX_CONNECTIONS:
        r = conch_cli_parse_count(value, "--max-connections", &v, err);
        c->max_connections = value;
        break;
    }
    return r;
}

/* The certificate and key load, as conch-remote (where OpenSSL is) sees them: `conch-remote
 * __check-tls CERT KEY` prints why not and exits 2. */
static int check_tls(const char *cert, const char *key, struct conch_err *err)
{
    _cleanup_close_ int helper = conch_cli_remote_helper(err);
    if (helper < 0)
        return helper;
    int out[2];
    if (pipe2(out, O_CLOEXEC) < 0)
        return conch_err_set(err, errno, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        if (dup2(out[1], STDOUT_FILENO) < 0)
            _exit(127);
        char *argv[] = {"conch-remote", "__check-tls", (char *)cert, (char *)key, NULL};
        int r = conch_cli_remote_exec(helper, argv, NULL);
        dprintf(STDOUT_FILENO, "cannot start conch-remote: %s", strerror(-r));
        _exit(127);
    }
    int saved = errno;
    close(out[1]);
    char msg[512];
    size_t got = 0;
    ssize_t n;
    while (pid > 0 && got < sizeof(msg) - 1 &&
           ((n = read(out[0], msg + got, sizeof(msg) - 1 - got)) > 0 || (n < 0 && errno == EINTR)))
        got += n > 0 ? (size_t)n : 0;
    close(out[0]);
    msg[got] = '\0';
    msg[strcspn(msg, "\n")] = '\0';
    if (pid < 0)
        return conch_err_set(err, saved, "fork: %s", strerror(saved));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == CONCH_EXIT_USAGE)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s", msg);
    return conch_err_set(err, EIO, "checking the certificate with conch-remote: %s",
                         msg[0] ? msg : "it failed");
}

/* --listen and what it needs: all four, and not with --stdio; the certificate and key load. */
static int remote_check(const struct serve_cli *c, struct conch_err *err)
{
    if (!c->listen || !c->tls_cert || !c->tls_key || !c->tokens)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--listen, --tls-cert, --tls-key and --tokens go together: a "
                              "remote transport needs TLS and tokens");
    if (c->o.stdio)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--listen serves a socket daemon's clients, not --stdio's");
    int r = check_tls(c->tls_cert, c->tls_key, err);
    return r < 0 ? r : conch_remote_probe_listen(c->listen, err);
}

/* An absolute path, not resolved: a certificate behind a symlink (a Kubernetes secret's) is
 * read anew through the link on SIGHUP. */
static char *absolute(const char *path)
{
    char cwd[PATH_MAX], *out = NULL;
    if (path[0] == '/')
        return strdup(path);
    if (!getcwd(cwd, sizeof(cwd)) || asprintf(&out, "%s/%s", cwd, path) < 0)
        return NULL;
    return out;
}

static void on_listening(void *ctx, const char *socket_path)
{
    conch_remote_super_listening(ctx, socket_path);
}

static void on_sighup(void *ctx)
{
    conch_remote_super_sighup(ctx);
}

/* The gateway's supervisor: conch-remote (the executable the TLS code is linked into),
 * opened now (the file may be replaced while the daemon runs; a missing one fails here, not
 * later), exec'd as `conch-remote __gateway` once the daemon listens. */
static int gateway_prepare(struct serve_cli *c, struct conch_remote_super **ret,
                           struct conch_err *err)
{
    _cleanup_free_ char *cert = absolute(c->tls_cert), *key = absolute(c->tls_key);
    if (!cert || !key)
        return conch_err_set(err, ENOMEM, "out of memory");
    int exe = conch_cli_remote_helper(err);
    if (exe < 0)
        return exe;
    char *argv[] = {"conch-remote",
                    "__gateway",
                    "--listen",
                    (char *)c->listen,
                    "--tls-cert",
                    cert,
                    "--tls-key",
                    key,
                    c->max_connections ? "--max-connections" : NULL,
                    (char *)c->max_connections,
                    NULL};
    *ret = conch_remote_super_new(exe, argv, err);
    if (!*ret) {
        close(exe);
        return -err->code;
    }
    c->o.on_listening = on_listening;
    c->o.on_sighup = on_sighup;
    c->o.hook_ctx = *ret;
    return 0;
}

int conch_cli_serve(int argc, char **argv)
{
    struct serve_cli c = {0};
    conch_daemon_opts_init(&c.o);
    const struct conch_cli_parser p = {
        .verb = "serve", .table = serve_opts, .handler = serve_opt, .ctx = &c};
    struct conch_err err = {0};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(serve_usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("serve", serve_usage, "%s", err.msg);
    if (optind < argc)
        return conch_cli_usage_error("serve", serve_usage, "unexpected argument '%s'",
                                     argv[optind]);
    /* A --stdio client asks for what it uses: no pool it did not ask for, and no timer
     * destroying its uncommitted work while it thinks. */
    if (c.o.stdio && !c.pool_set)
        c.o.pool_size = 0;
    if (c.o.stdio && !c.idle_set)
        c.o.idle_timeout = 0;
    if (!c.o.stdio)
        conch_log_set_level(getenv("CONCH_DEBUG") ? CONCH_LOG_DEBUG : CONCH_LOG_INFO);
    struct conch_remote_super *gw = NULL;
    if (c.listen || c.tls_cert || c.tls_key || c.max_connections) {
        if ((r = remote_check(&c, &err)) == 0)
            r = gateway_prepare(&c, &gw, &err);
        if (r < 0) {
            if (err.kind == CONCH_ERR_USAGE)
                return conch_cli_usage_error("serve", serve_usage, "%s", err.msg);
            fprintf(stderr, "conch serve: error: %s\n", err.msg);
            return 1;
        }
    }
    r = conch_daemon_run(&c.o, &err);
    /* The gateway goes down with the daemon, whose loop has stopped: no client is left. */
    conch_remote_super_free(gw);
    if (r < 0) {
        fprintf(stderr, "conch serve: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
        return err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : 1;
    }
    return 0;
}

static int gc_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    *(const char **)ctx = value;
    return 0;
}

int conch_cli_gc(int argc, char **argv)
{
    static const char usage[] = "usage: conch gc [--state-dir DIR]\n\nRemove upper dirs, spill "
                                "files and cgroups that no recorded sandbox or job references.\n";
    static const struct conch_cli_opt table[] = {{"state-dir", 0, true, 1}, {NULL, 0, false, 0}};
    const char *state_dir = NULL;
    const struct conch_cli_parser p = {
        .verb = "gc", .table = table, .handler = gc_opt, .ctx = &state_dir};
    struct conch_err err = {0};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("gc", NULL, "%s", err.msg);
    if (optind < argc)
        return conch_cli_usage_error("gc", NULL, "unexpected argument '%s'", argv[optind]);
    char dir[PATH_MAX];
    if (state_dir)
        snprintf(dir, sizeof(dir), "%s", state_dir);
    else if (conch_state_default_dir(dir, sizeof(dir), &err) < 0) {
        fprintf(stderr, "conch gc: %s\n", err.msg);
        return 1;
    }
    char db[PATH_MAX + 16];
    snprintf(db, sizeof(db), "%s/state.db", dir);
    struct conch_state *st = NULL;
    if (conch_state_open(db, &st, &err) < 0) {
        fprintf(stderr, "conch gc: %s\n", err.msg);
        return 1;
    }
    struct conch_recover_report rep;
    memset(&rep, 0, sizeof(rep));
    r = conch_recover_gc(st, dir, &rep, &err);
    conch_state_close(st);
    printf("removed %u sandbox dirs, %u spill files, %u cgroups\n", rep.dirs_removed,
           rep.spills_removed, rep.cgroups_removed);
    if (r < 0) {
        fprintf(stderr, "conch gc: %s\n", err.msg);
        return 1;
    }
    return 0;
}
