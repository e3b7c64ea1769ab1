/* run.c - `conch run`: one command in a fresh sandbox over a copy-on-write view of a
 * directory, then a report of what it changed. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/toolhost.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon.h"
#include "exec/result.h"
#include "exec/run.h"

static const char usage_text[] =
    "usage: conch run [options] -- CMD [ARGS...]\n"
    "\n"
    "Run CMD in a fresh sandbox with the workspace at /workspace, then report what changed.\n"
    "\n"
    "  --workspace DIR     host directory mounted at /workspace (default: current directory)\n"
    "  --mode MODE         overlay (default; host untouched unless --commit) | ro | rw\n"
    "  --commit            apply the workspace changes to DIR when the command exited\n"
    "  --rootfs DIR        use DIR as the (read-only) root filesystem\n"
    "  --as-root           run as root of the namespace instead of uid 1000 'agent'\n"
    "  --env K=V           add an environment variable (repeatable)\n"
    "  --cwd DIR           working directory (a host path under the workspace, or /workspace/...)\n"
    "  --timeout S         stop the command after S seconds (SIGTERM, then SIGKILL)\n"
    "  --grace S           seconds between SIGTERM and SIGKILL (default 2)\n"
    "  --max-output BYTES  bytes of each stream kept and printed (default 1M)\n"
    "  --max-spill BYTES   bytes of each stream kept in its spill file (default 64M)\n"
    "  --memory BYTES      memory limit        --pids N   process limit\n"
    "  --cpu CPUS          CPU limit (e.g. 0.5; needs a cgroup)\n"
    "  --tmp-size BYTES    size of /tmp (default 256M)\n"
    "  --home-size BYTES   size of /home/agent (default 64M)\n"
    "  --disk BYTES        what the command may write to the workspace (default 1G)\n"
    "  --tools FILE        serve the tools of FILE (JSON) to the command through the tool\n"
    "                      bridge, each call answered by a host command (docs/TOOLS.md)\n"
    "  --no-daemon         build the sandbox here even when a daemon ('conch serve') of this\n"
    "                      user runs (by default one is borrowed from its pool when it fits)\n"
    "  --socket PATH       the daemon to borrow from (default: this user's, see conch serve)\n"
    "  --json              print one JSON object instead of live output and a summary\n"
    "  -q, --quiet         no change summary\n"
    "\n"
    "Exit status: the command's own; 124 timeout; 125 sandbox error; 2 usage error;\n"
    "128+N when the command was killed by signal N.\n";

enum {
    OPT_WORKSPACE = 256,
    OPT_MODE,
    OPT_COMMIT,
    OPT_ROOTFS,
    OPT_AS_ROOT,
    OPT_ENV,
    OPT_CWD,
    OPT_TIMEOUT,
    OPT_GRACE,
    OPT_MAX_OUTPUT,
    OPT_MAX_SPILL,
    OPT_MEMORY,
    OPT_PIDS,
    OPT_CPU,
    OPT_TMP_SIZE,
    OPT_HOME_SIZE,
    OPT_DISK,
    OPT_JSON,
    OPT_TOOLS,
    OPT_NO_DAEMON,
    OPT_SOCKET,
};

static const struct option long_opts[] = {
    {"workspace", required_argument, NULL, OPT_WORKSPACE},
    {"mode", required_argument, NULL, OPT_MODE},
    {"commit", no_argument, NULL, OPT_COMMIT},
    {"rootfs", required_argument, NULL, OPT_ROOTFS},
    {"as-root", no_argument, NULL, OPT_AS_ROOT},
    {"env", required_argument, NULL, OPT_ENV},
    {"cwd", required_argument, NULL, OPT_CWD},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"grace", required_argument, NULL, OPT_GRACE},
    {"max-output", required_argument, NULL, OPT_MAX_OUTPUT},
    {"max-spill", required_argument, NULL, OPT_MAX_SPILL},
    {"memory", required_argument, NULL, OPT_MEMORY},
    {"pids", required_argument, NULL, OPT_PIDS},
    {"cpu", required_argument, NULL, OPT_CPU},
    {"tmp-size", required_argument, NULL, OPT_TMP_SIZE},
    {"home-size", required_argument, NULL, OPT_HOME_SIZE},
    {"disk", required_argument, NULL, OPT_DISK},
    {"json", no_argument, NULL, OPT_JSON},
    {"tools", required_argument, NULL, OPT_TOOLS},
    {"no-daemon", no_argument, NULL, OPT_NO_DAEMON},
    {"socket", required_argument, NULL, OPT_SOCKET},
    {"quiet", no_argument, NULL, 'q'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

struct run_cli {
    struct conch_run_opts run;
    const char *workspace_arg;
    const char *cwd_arg;
    const char *rootfs_arg;
    char workspace[PATH_MAX];
    char rootfs[PATH_MAX];
    char cwd_inside[PATH_MAX + 16];
    char spill_dir[PATH_MAX];
    char **env;
    size_t n_env;
    bool json;
    bool quiet;
    bool no_daemon;
    const char *socket_path;
    struct conch_toolhost *toolhost; /* --tools (owned) */
};

/* Map a host directory to the sandbox: under the workspace → /workspace/<rel>. */
static const char *map_cwd(struct run_cli *c, const char *host_or_inside, bool explicit_arg)
{
    if (!strncmp(host_or_inside, "/workspace", 10) &&
        (host_or_inside[10] == '\0' || host_or_inside[10] == '/') && explicit_arg)
        return host_or_inside;
    char real[PATH_MAX];
    if (realpath(host_or_inside, real)) {
        size_t wl = strlen(c->workspace);
        if (!strncmp(real, c->workspace, wl) && (real[wl] == '\0' || real[wl] == '/')) {
            snprintf(c->cwd_inside, sizeof(c->cwd_inside), "/workspace%s", real + wl);
            return c->cwd_inside;
        }
    }
    fprintf(stderr, "conch: warning: '%s' is not under the workspace '%s'; using /workspace\n",
            host_or_inside, c->workspace);
    return "/workspace";
}

static void default_spill_dir(char *buf, size_t size)
{
    const char *state = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    if (geteuid() == 0)
        snprintf(buf, size, "/var/lib/conch/spill");
    else if (state && *state)
        snprintf(buf, size, "%s/conch/spill", state);
    else if (home && *home)
        snprintf(buf, size, "%s/.local/state/conch/spill", home);
    else
        snprintf(buf, size, "/tmp/conch-%u/spill", (unsigned)getuid());
}

static int parse(struct run_cli *c, int argc, char **argv, struct conch_err *err)
{
    int r = 0, opt;
    uint64_t v;
    c->env = calloc((size_t)argc + 1, sizeof(char *));
    if (!c->env)
        return conch_err_set(err, ENOMEM, "out of memory");
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+qh", long_opts, NULL)) != -1) {
        switch (opt) {
        case OPT_WORKSPACE:
            c->workspace_arg = optarg;
            break;
        case OPT_MODE:
            r = conch_ws_mode_parse(optarg, &c->run.jail.ws_mode, err);
            if (r < 0)
                conch_err_wrap(err, "--mode");
            break;
        case OPT_COMMIT:
            c->run.commit = true;
            break;
        case OPT_ROOTFS:
            c->rootfs_arg = optarg;
            break;
        case OPT_AS_ROOT:
            c->run.jail.as_root = true;
            break;
        case OPT_ENV: {
            /* Values are often secrets (API tokens), and /proc/<pid>/cmdline is world
             * readable: keep a copy, and blank the value in our argv at once. */
            char *copy = strdup(optarg);
            if (!copy)
                return conch_err_set(err, ENOMEM, "out of memory");
            c->env[c->n_env++] = copy;
            char *eq = strchr(optarg, '=');
            if (eq)
                memset(eq + 1, '*', strlen(eq + 1));
            break;
        }
        case OPT_CWD:
            c->cwd_arg = optarg;
            break;
        case OPT_TOOLS:
            if (c->toolhost)
                r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--tools: given twice");
            else
                r = conch_toolhost_load(optarg, &c->toolhost, err);
            if (r >= 0)
                c->run.tools = conch_toolhost_tools(c->toolhost);
            break;
        case OPT_TIMEOUT:
            r = conch_cli_parse_seconds(optarg, "--timeout", &c->run.timeout_ms, err);
            break;
        case OPT_GRACE:
            r = conch_cli_parse_seconds(optarg, "--grace", &c->run.grace_ms, err);
            break;
        case OPT_MAX_OUTPUT:
            r = conch_parse_size(optarg, "--max-output", &v, err);
            c->run.max_output = (size_t)v;
            break;
        case OPT_MAX_SPILL:
            r = conch_parse_size(optarg, "--max-spill", &c->run.max_spill, err);
            break;
        case OPT_MEMORY:
            r = conch_parse_size(optarg, "--memory", &c->run.jail.limits.memory_bytes, err);
            break;
        case OPT_PIDS:
            r = conch_cli_parse_count(optarg, "--pids", &c->run.jail.limits.pids_max, err);
            break;
        case OPT_CPU: {
            uint64_t ms;
            r = conch_cli_parse_seconds(optarg, "--cpu", &ms, err);
            if (r == 0 && ms == 0)
                r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--cpu: must be above 0");
            c->run.jail.limits.cpu_millicpus = ms;
            break;
        }
        case OPT_TMP_SIZE:
            r = conch_parse_size(optarg, "--tmp-size", &c->run.jail.tmp_bytes, err);
            break;
        case OPT_HOME_SIZE:
            r = conch_parse_size(optarg, "--home-size", &c->run.jail.home_bytes, err);
            break;
        case OPT_DISK:
            r = conch_parse_size(optarg, "--disk", &c->run.jail.disk_bytes, err);
            break;
        case OPT_JSON:
            c->json = true;
            break;
        case OPT_NO_DAEMON:
            c->no_daemon = true;
            break;
        case OPT_SOCKET:
            c->socket_path = optarg;
            break;
        case 'q':
            c->quiet = true;
            break;
        case 'h':
            fputs(usage_text, stdout);
            exit(0);
        default:
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unknown or incomplete option '%s'",
                                  argv[optind - 1]);
        }
        if (r < 0)
            return r;
    }
    if (optind >= argc)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "no command given (usage: conch run [options] -- CMD [ARGS...])");
    c->run.argv = argv + optind;
    c->run.env_extra = c->env;

    const char *ws = c->workspace_arg ? c->workspace_arg : ".";
    if (!realpath(ws, c->workspace))
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--workspace '%s': %s", ws,
                              strerror(errno));
    struct stat st;
    if (stat(c->workspace, &st) < 0 || !S_ISDIR(st.st_mode))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR, "--workspace '%s': not a directory",
                              ws);
    c->run.jail.workspace = c->workspace;
    /* No file a command writes may outgrow the disk limit, in any mode (a sparse file
     * costs the overlay nothing but lands on the host at its full size). */
    c->run.jail.file_bytes = c->run.jail.disk_bytes;
    if (c->rootfs_arg) {
        if (!realpath(c->rootfs_arg, c->rootfs))
            return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--rootfs '%s': %s", c->rootfs_arg,
                                  strerror(errno));
        c->run.jail.rootfs = c->rootfs;
    }
    if (c->run.commit && c->run.jail.ws_mode != CONCH_WS_OVERLAY)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--commit needs --mode overlay (ro changes nothing, rw writes "
                              "through at once)");
    if (c->cwd_arg) {
        c->run.cwd = map_cwd(c, c->cwd_arg, true);
    } else {
        char here[PATH_MAX];
        if (getcwd(here, sizeof(here)))
            c->run.cwd = map_cwd(c, here, false);
    }
    default_spill_dir(c->spill_dir, sizeof(c->spill_dir));
    if ((r = conch_mkdir_p(c->spill_dir, 0700, err)) < 0)
        return conch_err_wrap(err, "spill directory");
    /* Spill files hold the command's output: another user must not have made (and so be able
     * to swap) their directory or its parent, as in a shared /tmp. */
    char probe[PATH_MAX + 8];
    snprintf(probe, sizeof(probe), "%s/x", c->spill_dir);
    if ((r = conch_daemon_socket_check(probe, false, err)) < 0 ||
        (r = conch_daemon_socket_check(c->spill_dir, false, err)) < 0)
        return conch_err_wrap(err, "spill directory");
    c->run.spill_dir = c->spill_dir;
    c->run.stream = !c->json;
    return 0;
}

static char change_letter(enum conch_change_kind k)
{
    switch (k) {
    case CONCH_CHANGE_ADDED:
        return 'A';
    case CONCH_CHANGE_MODIFIED:
        return 'M';
    case CONCH_CHANGE_DELETED:
        return 'D';
    case CONCH_CHANGE_TYPE:
        return 'T';
    }
    return '?';
}

static void print_json(const struct conch_run_result *res, const struct conch_err *infra)
{
    json_t *o = conch_run_result_json(res, infra);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (text)
        puts(text);
    free(text);
    json_decref(o);
}

/* One summary line: @ch's path, quoted like `ls` and git do when it holds control bytes,
 * quotes, backslashes or ill-formed UTF-8 (so a name cannot forge a line nor send escape
 * sequences to the terminal), with a note for what commit leaves out or flags. */
static void print_change(const struct conch_ws_change *ch, size_t inside)
{
    _cleanup_free_ char *q = conch_ws_quote("", ch->path, false);
    char count[64] = "";
    if (inside)
        snprintf(count, sizeof(count), " (%zu entr%s)", inside, inside == 1 ? "y" : "ies");
    const char *skip = conch_ws_change_skip_reason(ch);
    fprintf(stderr, "  %c %s%s%s%s%s%s\n", change_letter(ch->kind), q ? q : "(out of memory)",
            ch->type == 'd' ? "/" : "", count, skip ? " [not committed: " : "", skip ? skip : "",
            skip                                  ? "]"
            : ch->flags & CONCH_WS_F_LINK_OUTSIDE ? " [symlink pointing outside the workspace]"
                                                  : "");
}

static void print_summary(const struct run_cli *c, const struct conch_run_result *res)
{
    if (res->error_kind != CONCH_ERR_NONE && res->error_kind != CONCH_ERR_COMMAND)
        fprintf(stderr, "conch: error (%s): %s\n", conch_err_kind_name(res->error_kind),
                res->error_msg);
    if (res->tools.summary && !c->quiet)
        fprintf(stderr, "conch: %s\n", res->tools.summary);
    if (c->quiet || !res->has_changes)
        return;
    const struct conch_ws_changes *chs = &res->changes;
    size_t total = chs->total > chs->n ? chs->total : chs->n;
    if (total == 0) {
        fprintf(stderr, "conch: no changes in /workspace\n");
        return;
    }
    fprintf(stderr, "conch: %zu change%s in /workspace:\n", total, total == 1 ? "" : "s");
    size_t lines = 0, skipped = 0;
    for (size_t i = 0; i < chs->n; i++)
        skipped += conch_ws_change_skip_reason(&chs->items[i]) != NULL;
    size_t i = 0;
    for (; i < chs->n && lines < CONCH_WS_CHANGES_MAX; i++, lines++) {
        const struct conch_ws_change *ch = &chs->items[i];
        /* An added tree is one line: the agent cares that .git/ appeared, not about each
         * object in it (--json lists every entry). */
        size_t inside = 0;
        if (ch->kind == CONCH_CHANGE_ADDED && ch->type == 'd') {
            size_t len = strlen(ch->path);
            while (i + inside + 1 < chs->n) {
                const char *p = chs->items[i + inside + 1].path;
                if (strncmp(p, ch->path, len) || p[len] != '/')
                    break;
                inside++;
            }
        }
        print_change(ch, inside);
        i += inside;
    }
    if (i < total)
        fprintf(stderr, "  ... and %zu more\n", total - i);
    if (res->committed && skipped)
        fprintf(stderr,
                "conch: changes committed to %s, except %zu entr%s marked [not committed]\n",
                c->workspace, skipped, skipped == 1 ? "y" : "ies");
    else if (res->committed)
        fprintf(stderr, "conch: changes committed to %s\n", c->workspace);
    else if (res->commit_tried)
        fprintf(stderr, "conch: changes NOT committed (%zu of them applied before it failed): %s\n",
                res->commit.applied, res->commit_err.msg);
    else if (c->run.commit)
        fprintf(stderr, "conch: changes NOT committed: the command did not exit normally\n");
    else
        fprintf(stderr, "conch: changes discarded (run with --commit to apply them)\n");
}

int conch_cli_run(int argc, char **argv)
{
    struct run_cli c;
    memset(&c, 0, sizeof(c));
    conch_run_opts_init(&c.run);
    struct conch_err err = {0};
    struct conch_run_result res;
    memset(&res, 0, sizeof(res));
    res.out.spill_fd = res.err.spill_fd = -1;
    int status;

    int r = parse(&c, argc, argv, &err);
    if (r >= 0)
        r = conch_jail_check_stack(&err); /* before anything deep, borrowed or not */
    /* A daemon of ours may have a sandbox ready: its pool's (see conch_cli_lease). */
    if (r >= 0 && !c.no_daemon && !getenv("CONCH_NO_DAEMON"))
        conch_cli_lease(&c.run, c.socket_path, &c.run.leased);
    if (r >= 0)
        r = conch_exec_run(&c.run, &res, &err);
    conch_cli_lease_end(r >= 0);
    if (r < 0) {
        status = err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : CONCH_EXIT_INFRA;
        if (c.json)
            print_json(&res, &err);
        /* Also on stderr in JSON mode: a person running the command should see why. */
        fprintf(stderr, "conch: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
    } else {
        status = res.timed_out ? CONCH_EXIT_TIMEOUT : res.exit_code;
        if (c.json)
            print_json(&res, NULL);
        else
            print_summary(&c, &res);
    }
    conch_run_result_done(&res);
    conch_toolhost_free(c.toolhost);
    for (size_t i = 0; i < c.n_env; i++)
        free(c.env[i]);
    free(c.env);
    return status;
}
