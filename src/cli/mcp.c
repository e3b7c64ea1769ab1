/* mcp.c - `conch mcp`: the options of the MCP server (src/mcp/), one sandbox per session. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fsutil.h"
#include "daemon/state.h"
#include "mcp/mcp.h"

static const char mcp_usage[] =
    "usage: conch mcp [options]\n"
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
    "  -h, --help           show this help\n";

enum { OPT_COMMIT = 1, OPT_TIMEOUT, OPT_MAX_OUTPUT, OPT_STATE_DIR };

#define MCP_SPEC_OPTS                                                                              \
    (CONCH_SPEC_OPT_WORKSPACE | CONCH_SPEC_OPT_MODE | CONCH_SPEC_OPT_MEMORY |                      \
     CONCH_SPEC_OPT_PIDS | CONCH_SPEC_OPT_CPU | CONCH_SPEC_OPT_TMP_SIZE | CONCH_SPEC_OPT_DISK |    \
     CONCH_SPEC_OPT_ROOTFS | CONCH_SPEC_OPT_AS_ROOT | CONCH_SPEC_OPT_ENV | CONCH_SPEC_OPT_NET |    \
     CONCH_SPEC_OPT_RULES | CONCH_SPEC_OPT_SOCKET)

static int mcp_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct conch_mcp_opts *o = ctx;
    uint64_t v = 0;
    int r = 0;
    switch (key) {
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
static int parse(struct conch_mcp_opts *o, char *ret_paths[2], int argc, char **argv,
                 struct conch_err *err)
{
    static const struct conch_cli_opt table[] = {
        {"commit", 0, false, OPT_COMMIT},
        {"timeout", 0, true, OPT_TIMEOUT},
        {"max-output", 0, true, OPT_MAX_OUTPUT},
        {"state-dir", 0, true, OPT_STATE_DIR},
        {NULL, 0, false, 0},
    };
    const struct conch_cli_parser p = {.verb = "mcp",
                                       .table = table,
                                       .handler = mcp_opt,
                                       .ctx = o,
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
    if (o->sandbox.workspace) {
        if ((r = abs_dir("--workspace", o->sandbox.workspace, &ret_paths[0], err)) < 0)
            return r;
        o->sandbox.workspace = ret_paths[0];
    }
    /* --rootfs goes to the daemon as given: a bad one fails the session's initialize. */
    return 0;
}

int conch_cli_mcp(int argc, char **argv)
{
    struct conch_mcp_opts o;
    conch_mcp_opts_init(&o);
    struct conch_err err = {0};
    char *paths[2] = {NULL, NULL};
    int r = parse(&o, paths, argc, argv, &err);
    if (r != 0) {
        conch_spec_done(&o.sandbox);
        free(paths[0]);
        free(paths[1]);
        return r == 1 ? 0 : conch_cli_usage_error("mcp", mcp_usage, "%s", err.msg);
    }
    char parent[PATH_MAX];
    if (!o.state_dir) {
        if (conch_state_default_dir(parent, sizeof(parent), &err) < 0) {
            fprintf(stderr, "conch mcp: %s (pass --state-dir)\n", err.msg);
            conch_spec_done(&o.sandbox);
            free(paths[0]);
            free(paths[1]);
            return CONCH_EXIT_USAGE;
        }
        o.state_parent = parent;
    }
    /* For running conch mcp under valgrind or a debugger, whose /proc/self/exe is not conch. */
    o.conch_exe = getenv("CONCH_EXE");
    r = conch_mcp_serve(&o, STDIN_FILENO, STDOUT_FILENO, &err);
    conch_spec_done(&o.sandbox);
    free(paths[0]);
    free(paths[1]);
    if (r < 0) {
        fprintf(stderr, "conch mcp: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
        return err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : 1;
    }
    return 0;
}
