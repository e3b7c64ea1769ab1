/* mcp.c - `conch mcp`: the options of the MCP server (src/mcp/), one sandbox per session. */
#include <errno.h>
#include <getopt.h>
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
    "session, with the tools bash, job_output, job_kill, read_file, write_file, edit_file,\n"
    "ls, glob, grep, changes, diff and commit. Meant to be started by an MCP client.\n"
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
    "  --state-dir DIR      the daemon's state dir (default: a private one under the default\n"
    "                       state dir, removed at the end)\n"
    "  -h, --help           show this help\n";

enum {
    OPT_WORKSPACE = 1000,
    OPT_MODE,
    OPT_COMMIT,
    OPT_TIMEOUT,
    OPT_MAX_OUTPUT,
    OPT_MEMORY,
    OPT_PIDS,
    OPT_CPU,
    OPT_TMP_SIZE,
    OPT_DISK,
    OPT_ROOTFS,
    OPT_AS_ROOT,
    OPT_ENV,
    OPT_STATE_DIR,
};

static int parse(struct conch_mcp_opts *o, char ***env, int argc, char **argv,
                 struct conch_err *err)
{
    static const struct option opts[] = {{"workspace", required_argument, NULL, OPT_WORKSPACE},
                                         {"mode", required_argument, NULL, OPT_MODE},
                                         {"commit", no_argument, NULL, OPT_COMMIT},
                                         {"timeout", required_argument, NULL, OPT_TIMEOUT},
                                         {"max-output", required_argument, NULL, OPT_MAX_OUTPUT},
                                         {"memory", required_argument, NULL, OPT_MEMORY},
                                         {"pids", required_argument, NULL, OPT_PIDS},
                                         {"cpu", required_argument, NULL, OPT_CPU},
                                         {"tmp-size", required_argument, NULL, OPT_TMP_SIZE},
                                         {"disk", required_argument, NULL, OPT_DISK},
                                         {"rootfs", required_argument, NULL, OPT_ROOTFS},
                                         {"as-root", no_argument, NULL, OPT_AS_ROOT},
                                         {"env", required_argument, NULL, OPT_ENV},
                                         {"state-dir", required_argument, NULL, OPT_STATE_DIR},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    size_t n_env = 0;
    int opt, r = 0;
    uint64_t v;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (opt) {
        case OPT_WORKSPACE: {
            char *abs = realpath(optarg, NULL);
            struct stat st;
            if (!abs || stat(abs, &st) < 0 || !S_ISDIR(st.st_mode)) {
                free(abs);
                return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR,
                                      "--workspace: '%s' is not a directory", optarg);
            }
            free((char *)o->workspace);
            o->workspace = abs; /* freed by conch_cli_mcp */
            break;
        }
        case OPT_MODE:
            if (strcmp(optarg, "overlay") && strcmp(optarg, "ro") && strcmp(optarg, "rw"))
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "--mode: '%s' is not overlay, ro or rw", optarg);
            o->mode = optarg;
            break;
        case OPT_COMMIT:
            o->commit_on_exit = true;
            break;
        case OPT_TIMEOUT:
            r = conch_cli_parse_seconds(optarg, "--timeout", &o->timeout_ms, err);
            break;
        case OPT_MAX_OUTPUT:
            r = conch_parse_size(optarg, "--max-output", &v, err);
            if (r == 0 && (v < 1024 || v > (64u << 20)))
                r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                   "--max-output: between 1k and 64M");
            o->max_output = (size_t)v;
            break;
        case OPT_MEMORY:
            r = conch_parse_size(optarg, "--memory", &o->memory, err);
            break;
        case OPT_PIDS:
            r = conch_cli_parse_count(optarg, "--pids", &o->pids, err);
            break;
        case OPT_CPU: {
            char *end = NULL;
            errno = 0;
            o->cpu = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(o->cpu > 0) || o->cpu > 1024)
                r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                   "--cpu: '%s' is not a number of CPUs (e.g. 0.5, 2)", optarg);
            break;
        }
        case OPT_TMP_SIZE:
            r = conch_parse_size(optarg, "--tmp-size", &o->tmp_size, err);
            break;
        case OPT_DISK:
            r = conch_parse_size(optarg, "--disk", &o->disk, err);
            break;
        case OPT_ROOTFS:
            o->rootfs = optarg;
            break;
        case OPT_AS_ROOT:
            o->as_root = true;
            break;
        case OPT_ENV: {
            if (!strchr(optarg, '=') || optarg[0] == '=')
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--env: '%s' is not KEY=VALUE",
                                      optarg);
            char **ne = realloc(*env, (n_env + 2) * sizeof(*ne));
            if (!ne)
                return conch_err_set(err, ENOMEM, "out of memory");
            *env = ne;
            ne[n_env++] = optarg;
            ne[n_env] = NULL;
            o->env = (const char *const *)ne;
            break;
        }
        case OPT_STATE_DIR:
            o->state_dir = optarg;
            break;
        case 'h':
            fputs(mcp_usage, stdout);
            return 1;
        default:
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unknown or incomplete option '%s'",
                                  argv[optind - 1]);
        }
        if (r < 0)
            return r;
    }
    if (optind < argc)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unexpected argument '%s'",
                              argv[optind]);
    return 0;
}

int conch_cli_mcp(int argc, char **argv)
{
    struct conch_mcp_opts o;
    conch_mcp_opts_init(&o);
    struct conch_err err = {0};
    char **env = NULL;
    int r = parse(&o, &env, argc, argv, &err);
    if (r == 1) {
        free(env);
        free((char *)o.workspace);
        return 0;
    }
    if (r < 0) {
        fprintf(stderr, "conch mcp: %s\n%s", err.msg, mcp_usage);
        free(env);
        free((char *)o.workspace);
        return CONCH_EXIT_USAGE;
    }
    char parent[PATH_MAX];
    if (!o.state_dir) {
        if (conch_state_default_dir(parent, sizeof(parent), &err) < 0) {
            fprintf(stderr, "conch mcp: %s (pass --state-dir)\n", err.msg);
            free(env);
            free((char *)o.workspace);
            return CONCH_EXIT_USAGE;
        }
        o.state_parent = parent;
    }
    /* For running conch mcp under valgrind or a debugger, whose /proc/self/exe is not conch. */
    o.conch_exe = getenv("CONCH_EXE");
    r = conch_mcp_serve(&o, STDIN_FILENO, STDOUT_FILENO, &err);
    free(env);
    free((char *)o.workspace);
    if (r < 0) {
        fprintf(stderr, "conch mcp: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
        return err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : 1;
    }
    return 0;
}
