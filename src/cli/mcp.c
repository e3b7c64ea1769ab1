/* mcp.c - `conch mcp`: the options of the MCP server (src/mcp/), one sandbox per session, on
 * stdio or (--listen) over Streamable HTTP. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/fsutil.h"
#include "daemon/state.h"
#include "mcp/mcp.h"

static const char mcp_usage[] =
    "usage: conch mcp [options]\n"
    "       conch mcp --listen HOST:PORT --tls-cert FILE --tls-key FILE [options]\n"
    "\n"
    "Serve the Model Context Protocol (revision 2025-06-18) on stdin/stdout: one sandbox per\n"
    "session, with the tools bash, shell (a persistent bash session: cd, exports and a\n"
    "virtualenv persist between calls), js_eval (JavaScript/TypeScript in a persistent JS\n"
    "session), job_output, job_kill, read_file, write_file, edit_file, ls, glob, grep,\n"
    "changes, diff, commit, snapshot, restore, snapshots and fork (a new sandbox the\n"
    "session goes on in). Meant to be started by an MCP client.\n"
    "\n"
    "  --workspace DIR      host directory at /workspace (default: none, an empty one)\n"
    "  --mode MODE          overlay (default: changes stay in the sandbox until committed),\n"
    "                       ro (read-only) or rw (live)\n"
    "  --commit             commit the workspace's changes when the session ends\n"
    "  --timeout S          default timeout of a bash call (default 120; 0 = none)\n"
    "  --max-output BYTES   largest text of one tool result (default 64k; more is cut in the\n"
    "                       middle with a note)\n"
    "  --memory BYTES, --pids N, --cpu CPUS, --tmp-size BYTES, --disk BYTES\n"
    "                       limits of the sandbox, as for sandbox.create\n"
    "  --rootfs DIR         root filesystem (default: the host's /usr, /bin, /lib*, ...)\n"
    "  --as-root            commands run as root of the sandbox, not as 'agent'\n"
    "  --env K=V            environment variable for every command (repeatable)\n"
    "  --net MODE, --allow RULE, --deny RULE\n"
    "                       the sandbox's network, as for conch create (default none)\n"
    "  --readonly PATH, --hidden PATH\n"
    "                       path rules in the workspace, as for conch run (repeatable)\n"
    "  --pass-socket HOST[:INSIDE]\n"
    "                       a host unix socket of yours at INSIDE (default: HOST) in the\n"
    "                       sandbox, in any network mode (repeatable, at most 8)\n"
    "  --state-dir DIR      the daemon's state dir (default: a private one under the default\n"
    "                       state dir, removed at the end)\n"
    "  -h, --help           show this help\n"
    "\n"
    "Over HTTP (MCP's Streamable HTTP transport at https://HOST:PORT/mcp), for MCP hosts that\n"
    "connect to remote servers: every request carries Authorization: Bearer TOKEN, a token of\n"
    "the tokens file the running daemon was started with; each MCP session is a connection to\n"
    "that daemon as the token's tenant, with its own sandbox (no --workspace, --rootfs,\n"
    "--pass-socket, --commit or --state-dir: a tenant names no host path).\n"
    "  --listen HOST:PORT   address to serve on (port 0: any free one, printed on stderr)\n"
    "  --tls-cert FILE, --tls-key FILE\n"
    "                       PEM certificate chain and key (TLS 1.2 or later only)\n"
    "  --socket PATH        the daemon's socket (default: the default socket)\n"
    "  --max-body BYTES     largest request body (default 32M)\n"
    "  --max-sessions N     MCP sessions at once (default 64)\n"
    "  --session-idle S     a session with no request for S seconds ends (default 1800)\n"
    "  --allow-origin ORIGIN\n"
    "                       a browser Origin to accept (repeatable); without it only local\n"
    "                       origins, and only on a loopback address\n";

enum {
    OPT_COMMIT = 1,
    OPT_TIMEOUT,
    OPT_MAX_OUTPUT,
    OPT_STATE_DIR,
    OPT_LISTEN,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_SOCKET,
    OPT_MAX_BODY,
    OPT_MAX_SESSIONS,
    OPT_SESSION_IDLE,
    OPT_ALLOW_ORIGIN,
};

#define MAX_ORIGINS 16

struct mcp_cli {
    struct conch_mcp_opts o;
    struct conch_mcp_http_opts h;
    const char *origins[MAX_ORIGINS];
};

#define MCP_SPEC_OPTS                                                                              \
    (CONCH_SPEC_OPT_WORKSPACE | CONCH_SPEC_OPT_MODE | CONCH_SPEC_OPT_MEMORY |                      \
     CONCH_SPEC_OPT_PIDS | CONCH_SPEC_OPT_CPU | CONCH_SPEC_OPT_TMP_SIZE | CONCH_SPEC_OPT_DISK |    \
     CONCH_SPEC_OPT_ROOTFS | CONCH_SPEC_OPT_AS_ROOT | CONCH_SPEC_OPT_ENV | CONCH_SPEC_OPT_NET |    \
     CONCH_SPEC_OPT_RULES | CONCH_SPEC_OPT_SOCKET)

static int mcp_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct mcp_cli *cli = ctx;
    struct conch_mcp_opts *o = &cli->o;
    struct conch_mcp_http_opts *h = &cli->h;
    uint64_t v = 0;
    int r = 0;
    switch (key) {
    case OPT_LISTEN:
        h->listen = value;
        break;
    case OPT_TLS_CERT:
        h->tls_cert = value;
        break;
    case OPT_TLS_KEY:
        h->tls_key = value;
        break;
    case OPT_SOCKET:
        h->socket = value;
        break;
    case OPT_MAX_BODY:
        r = conch_parse_size(value, "--max-body", &v, err);
        if (r == 0 && (v < 1024 || v > (64u << 20)))
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--max-body: between 1k and 64M");
        h->max_body = (size_t)v;
        break;
    case OPT_MAX_SESSIONS:
    case OPT_SESSION_IDLE: {
        char *end;
        errno = 0;
        unsigned long n = strtoul(value, &end, 10);
        bool sessions = key == OPT_MAX_SESSIONS;
        if (errno || *end || !*value || n > (sessions ? 100000ul : 604800ul) ||
            (sessions && n == 0))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is not %s",
                                  sessions ? "--max-sessions" : "--session-idle", value,
                                  sessions ? "a number from 1 to 100000"
                                           : "a number of seconds (at most a week; 0: never)");
        if (sessions)
            h->max_sessions = (unsigned)n;
        else
            h->idle_timeout_s = (unsigned)n;
        break;
    }
    case OPT_ALLOW_ORIGIN:
        if (h->n_origins == MAX_ORIGINS)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--allow-origin: at most %d",
                                  MAX_ORIGINS);
        cli->origins[h->n_origins++] = value;
        break;
    case OPT_COMMIT:
        o->commit_on_exit = true;
        break;
    case OPT_TIMEOUT:
        r = conch_cli_parse_seconds(value, "--timeout", &o->timeout_ms, err);
        break;
    case OPT_MAX_OUTPUT:
        r = conch_parse_size(value, "--max-output", &v, err);
        if (r == 0 && (v < 1024 || v > (64u << 20)))
            r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--max-output: between 1k and 64M");
        o->max_output = (size_t)v;
        break;
    case OPT_STATE_DIR:
        o->state_dir = value;
        break;
    }
    return r;
}

/* @what ("--workspace"), a directory, made absolute into a new string in *@ret. */
static int abs_dir(const char *what, const char *path, char **ret, struct conch_err *err)
{
    char *abs = realpath(path, NULL);
    struct stat st;
    if (!abs || stat(abs, &st) < 0 || !S_ISDIR(st.st_mode)) {
        free(abs);
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR, "%s: '%s' is not a directory", what,
                              path);
    }
    *ret = abs;
    return 0;
}

/* Parse into @o; the absolute workspace goes to @ret_paths[0] (freed by the caller).
 * Returns 0, 1 after printing the help, or <0 with @err. */
static int parse(struct mcp_cli *cli, char *ret_paths[2], int argc, char **argv,
                 struct conch_err *err)
{
    struct conch_mcp_opts *o = &cli->o;
    static const struct conch_cli_opt table[] = {
        {"commit", 0, false, OPT_COMMIT},
        {"timeout", 0, true, OPT_TIMEOUT},
        {"max-output", 0, true, OPT_MAX_OUTPUT},
        {"state-dir", 0, true, OPT_STATE_DIR},
        {"listen", 0, true, OPT_LISTEN},
        {"tls-cert", 0, true, OPT_TLS_CERT},
        {"tls-key", 0, true, OPT_TLS_KEY},
        {"socket", 0, true, OPT_SOCKET},
        {"max-body", 0, true, OPT_MAX_BODY},
        {"max-sessions", 0, true, OPT_MAX_SESSIONS},
        {"session-idle", 0, true, OPT_SESSION_IDLE},
        {"allow-origin", 0, true, OPT_ALLOW_ORIGIN},
        {NULL, 0, false, 0},
    };
    const struct conch_cli_parser p = {.verb = "mcp",
                                       .table = table,
                                       .handler = mcp_opt,
                                       .ctx = cli,
                                       .spec_opts = MCP_SPEC_OPTS,
                                       .spec = &o->sandbox};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, err);
    if (r == 1) {
        fputs(mcp_usage, stdout);
        return 1;
    }
    if (r < 0)
        return r;
    if (optind < argc)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unexpected argument '%s'",
                              argv[optind]);
    const struct conch_mcp_http_opts *h = &cli->h;
    if (!h->listen && (h->tls_cert || h->tls_key || h->socket || h->n_origins))
        return conch_err_setk(
            err, CONCH_ERR_USAGE, EINVAL,
            "--tls-cert, --tls-key, --socket and --allow-origin go with --listen");
    if (h->listen) {
        if (!h->tls_cert || !h->tls_key)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "--listen needs --tls-cert and --tls-key: conch mcp serves "
                                  "HTTPS only (bearer tokens never travel in plaintext)");
        const char *host_opt = o->sandbox.workspace   ? "--workspace"
                               : o->sandbox.rootfs    ? "--rootfs"
                               : o->sandbox.n_sockets ? "--pass-socket"
                               : o->commit_on_exit    ? "--commit"
                               : o->state_dir         ? "--state-dir"
                                                      : NULL;
        if (host_opt)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "%s does not go with --listen: the sessions belong to the "
                                  "tokens' tenants, who may not name host paths",
                                  host_opt);
    }
    if (o->sandbox.workspace) {
        if ((r = abs_dir("--workspace", o->sandbox.workspace, &ret_paths[0], err)) < 0)
            return r;
        o->sandbox.workspace = ret_paths[0];
    }
    /* --rootfs goes to the daemon as given: a bad one fails the session's initialize. */
    return 0;
}

int (*conch_cli_mcp_http)(const struct conch_mcp_opts *o, const struct conch_mcp_http_opts *h,
                          struct conch_err *err);

/* `conch mcp --listen ...` in conch: the same words to conch-remote, where the TLS code is. */
static int exec_remote(int argc, char **argv)
{
    struct conch_err err = {0};
    int helper = conch_cli_remote_helper(&err);
    if (helper < 0) {
        fprintf(stderr, "conch mcp: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
        return 1;
    }
    char **args = calloc((size_t)argc + 2, sizeof(*args));
    if (!args) {
        fprintf(stderr, "conch mcp: out of memory\n");
        return 1;
    }
    args[0] = "conch-remote";
    for (int i = 0; i < argc; i++)
        args[i + 1] = argv[i];
    int r = conch_cli_remote_exec(helper, args, NULL);
    fprintf(stderr, "conch mcp: cannot start conch-remote: %s\n", strerror(-r));
    free(args);
    close(helper);
    return 1;
}

int conch_cli_mcp(int argc, char **argv)
{
    struct mcp_cli cli;
    memset(&cli, 0, sizeof(cli));
    struct conch_mcp_opts *o = &cli.o;
    conch_mcp_opts_init(o);
    conch_mcp_http_opts_init(&cli.h);
    cli.h.origins = cli.origins;
    cli.h.connect = conch_cli_connect;
    struct conch_err err = {0};
    char *paths[2] = {NULL, NULL};
    int r = parse(&cli, paths, argc, argv, &err);
    if (r != 0) {
        conch_spec_done(&o->sandbox);
        free(paths[0]);
        free(paths[1]);
        return r == 1 ? 0 : conch_cli_usage_error("mcp", mcp_usage, "%s", err.msg);
    }
    char parent[PATH_MAX];
    if (cli.h.listen && !conch_cli_mcp_http) {
        conch_spec_done(&o->sandbox);
        free(paths[0]);
        free(paths[1]);
        return exec_remote(argc, argv);
    }
    if (cli.h.listen) {
        r = conch_cli_mcp_http(o, &cli.h, &err);
    } else {
        if (!o->state_dir) {
            if (conch_state_default_dir(parent, sizeof(parent), &err) < 0) {
                fprintf(stderr, "conch mcp: %s (pass --state-dir)\n", err.msg);
                conch_spec_done(&o->sandbox);
                free(paths[0]);
                free(paths[1]);
                return CONCH_EXIT_USAGE;
            }
            o->state_parent = parent;
        }
        /* For running conch mcp under valgrind or a debugger, whose /proc/self/exe is not
         * conch. */
        o->conch_exe = getenv("CONCH_EXE");
        r = conch_mcp_serve(o, STDIN_FILENO, STDOUT_FILENO, &err);
    }
    conch_spec_done(&o->sandbox);
    free(paths[0]);
    free(paths[1]);
    if (r < 0) {
        fprintf(stderr, "conch mcp: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
        return err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : 1;
    }
    return 0;
}
