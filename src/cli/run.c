/* run.c - `conch run`: one command in a fresh sandbox over a copy-on-write view of a
 * directory, then a report of what it changed. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "cli/nethost.h"
#include "cli/toolhost.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon.h"
#include "daemon/state.h"
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
    "  --disk BYTES        what the command may write to the workspace (default 4G)\n"
    "  --mount SPEC        an extra mount, docker's --mount form (repeatable, at most 8):\n"
    "                      type=tmpfs,target=/scratch[,size=64m] or\n"
    "                      type=bind,source=/host/dir,target=/opt/x[,rw] (read-only unless rw)\n"
    "                      type=overlay,source=/host/dir,target=/data: the command writes\n"
    "                      over the host dir; its changes are reported and committed with\n"
    "                      the workspace's (--commit; needs --mode overlay) or\n"
    "                      type=store,name=N,target=/memories: a named store's files (the\n"
    "                      daemon's, see conch store), written back when the command ends\n"
    "  --state-dir DIR     where the stores are (default: conch serve's, /var/lib/conch as\n"
    "                      root, else $XDG_STATE_HOME/conch); give the daemon's if it has\n"
    "                      another\n"
    "  --readonly PATH     a workspace path the command cannot change (e.g. .git/hooks;\n"
    "                      repeatable, at most 32 rules): enforced by the kernel, never committed\n"
    "  --hidden PATH       a workspace path the command cannot see (e.g. .env): an empty\n"
    "                      file or dir of mode 000 in its place (missing: an empty dir)\n"
    "  --net MODE          none (default): loopback only; allow: HTTP and HTTPS through\n"
    "                      a proxy to what --allow names; host: the host's network (not\n"
    "                      isolated; flagged in the result)\n"
    "  --allow RULE        allow a name ('pypi.org'), its subdomains ('*.npmjs.org'), an\n"
    "                      address, each with an optional :PORT (default 80 and 443);\n"
    "                      repeatable; implies --net allow\n"
    "  --deny RULE         deny it, whatever --allow says (repeatable)\n"
    "  --pass-socket HOST[:INSIDE]\n"
    "                      pass the host unix socket HOST (yours; not a link) into the\n"
    "                      sandbox at INSIDE (default: HOST), in any --net mode: an ssh\n"
    "                      agent, a database (repeatable, at most 8; set SSH_AUTH_SOCK with\n"
    "                      --env yourself)\n"
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
    OPT_COMMIT,
    OPT_CWD,
    OPT_TIMEOUT,
    OPT_GRACE,
    OPT_MAX_OUTPUT,
    OPT_MAX_SPILL,
    OPT_JSON,
    OPT_TOOLS,
    OPT_NO_DAEMON,
    OPT_SOCKET,
    OPT_QUIET,
    OPT_STATE_DIR,
};

static const struct conch_cli_opt run_opts[] = {
    {"commit", 0, false, OPT_COMMIT},
    {"cwd", 0, true, OPT_CWD},
    {"timeout", 0, true, OPT_TIMEOUT},
    {"grace", 0, true, OPT_GRACE},
    {"max-output", 0, true, OPT_MAX_OUTPUT},
    {"max-spill", 0, true, OPT_MAX_SPILL},
    {"json", 0, false, OPT_JSON},
    {"tools", 0, true, OPT_TOOLS},
    {"no-daemon", 0, false, OPT_NO_DAEMON},
    {"socket", 0, true, OPT_SOCKET},
    {"quiet", 'q', false, OPT_QUIET},
    {"state-dir", 0, true, OPT_STATE_DIR},
    {NULL, 0, false, 0},
};

/* The sandbox options conch run takes (the spec's; conch create and conch mcp take theirs). */
#define RUN_SPEC_OPTS                                                                              \
    (CONCH_SPEC_OPT_WORKSPACE | CONCH_SPEC_OPT_MODE | CONCH_SPEC_OPT_ROOTFS |                      \
     CONCH_SPEC_OPT_AS_ROOT | CONCH_SPEC_OPT_ENV | CONCH_SPEC_OPT_MEMORY | CONCH_SPEC_OPT_PIDS |   \
     CONCH_SPEC_OPT_CPU | CONCH_SPEC_OPT_TMP_SIZE | CONCH_SPEC_OPT_HOME_SIZE |                     \
     CONCH_SPEC_OPT_DISK | CONCH_SPEC_OPT_MOUNT | CONCH_SPEC_OPT_NET | CONCH_SPEC_OPT_RULES |      \
     CONCH_SPEC_OPT_SOCKET)

struct run_cli {
    struct conch_run_opts run;
    struct conch_sandbox_spec spec; /* the sandbox options, made into run.jail */
    const char *cwd_arg;
    char workspace[PATH_MAX];
    char rootfs[PATH_MAX];
    char cwd_inside[PATH_MAX + 16];
    char spill_dir[PATH_MAX];
    const char *state_dir_arg; /* --state-dir */
    char state_dir[PATH_MAX];
    char store_dir[PATH_MAX + 16];
    char view_dir[PATH_MAX + 16];
    char **env;
    size_t n_env;
    bool json;
    bool quiet;
    bool no_daemon;
    const char *socket_path;
    struct conch_toolhost *toolhost; /* --tools (owned) */
    struct conch_nethost *nethost;   /* --net allow (owned) */
};

/* Whether @real (a realpath) is the user's home: $HOME's or the passwd entry's (either may be
 * unset or wrong; a home made the workspace exposes every dotfile in it). */
static bool is_home(const char *real)
{
    const struct passwd *pw = getpwuid(getuid());
    const char *homes[] = {getenv("HOME"), pw ? pw->pw_dir : NULL};
    for (size_t i = 0; i < sizeof(homes) / sizeof(homes[0]); i++) {
        char h[PATH_MAX];
        if (homes[i] && homes[i][0] && realpath(homes[i], h) && !strcmp(h, real))
            return true;
    }
    return false;
}

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

static int run_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct run_cli *c = ctx;
    uint64_t v;
    int r = 0;
    switch (key) {
    case OPT_COMMIT:
        c->run.commit = true;
        break;
    case OPT_CWD:
        c->cwd_arg = value;
        break;
    case OPT_TOOLS:
        if (c->toolhost)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--tools: given twice");
        r = conch_toolhost_load(value, &c->toolhost, err);
        if (r >= 0)
            c->run.tools = conch_toolhost_tools(c->toolhost);
        return r;
    case OPT_TIMEOUT:
        return conch_cli_parse_seconds(value, "--timeout", &c->run.timeout_ms, err);
    case OPT_GRACE:
        return conch_cli_parse_seconds(value, "--grace", &c->run.grace_ms, err);
    case OPT_MAX_OUTPUT:
        if ((r = conch_parse_size(value, "--max-output", &v, err)) == 0)
            c->run.max_output = (size_t)v;
        break;
    case OPT_MAX_SPILL:
        return conch_parse_size(value, "--max-spill", &c->run.max_spill, err);
    case OPT_JSON:
        c->json = true;
        break;
    case OPT_NO_DAEMON:
        c->no_daemon = true;
        break;
    case OPT_SOCKET:
        c->socket_path = value;
        break;
    case OPT_QUIET:
        c->quiet = true;
        break;
    case OPT_STATE_DIR:
        c->state_dir_arg = value;
        break;
    }
    return r;
}

/* The "K=V" list of the spec's env, into c->env (owned copies). */
static int env_list(struct run_cli *c, struct conch_err *err)
{
    c->env = calloc(json_object_size(c->spec.env) + 1, sizeof(char *));
    if (!c->env)
        return conch_err_set(err, ENOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(c->spec.env, k, v)
    {
        if (asprintf(&c->env[c->n_env], "%s=%s", k, json_string_value(v)) < 0) {
            c->env[c->n_env] = NULL;
            return conch_err_set(err, ENOMEM, "out of memory");
        }
        c->n_env++;
    }
    return 0;
}

/* Overlay mounts follow the workspace (their changes are reported and committed with its), so
 * they need its overlay mode; store mounts need the stores' dir, the daemon's (<state>/stores,
 * shared with it: a daemon running or not) and a dir for their views (<state>/runs). */
static int mounts_check(struct run_cli *c, struct conch_err *err)
{
    bool stores = false;
    for (unsigned i = 0; i < c->spec.n_mounts; i++) {
        const struct conch_mount *m = &c->spec.mounts[i];
        stores |= m->type == CONCH_MOUNT_STORE;
        if (m->type == CONCH_MOUNT_OVERLAY && c->spec.mode != CONCH_WS_OVERLAY)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "mount '%s': an overlay mount's changes follow the workspace's: "
                                  "it needs --mode overlay (the default)",
                                  m->target);
    }
    if (!stores)
        return 0;
    int r;
    if (c->state_dir_arg)
        snprintf(c->state_dir, sizeof(c->state_dir), "%s", c->state_dir_arg);
    else if ((r = conch_state_default_dir(c->state_dir, sizeof(c->state_dir), err)) < 0)
        return r;
    snprintf(c->store_dir, sizeof(c->store_dir), "%s/stores", c->state_dir);
    snprintf(c->view_dir, sizeof(c->view_dir), "%s/runs", c->state_dir);
    char probe[sizeof(c->view_dir) + 8];
    snprintf(probe, sizeof(probe), "%s/x", c->view_dir);
    /* Both private and ours (a shared /tmp's parent swapped by another user would get them). */
    if ((r = conch_mkdir_p(c->store_dir, 0700, err)) < 0 ||
        (r = conch_mkdir_p(c->view_dir, 0700, err)) < 0 ||
        (r = conch_daemon_socket_check(probe, false, err)) < 0 ||
        (r = conch_daemon_socket_check(c->view_dir, false, err)) < 0)
        return conch_err_wrap(err, "state directory '%s' (stores)", c->state_dir);
    c->run.store_dir = c->store_dir;
    c->run.view_dir = c->view_dir;
    return 0;
}

/* Parse the options into @c; 1: --help was printed. */
static int parse(struct run_cli *c, int argc, char **argv, struct conch_err *err)
{
    const struct conch_cli_parser p = {.verb = "run",
                                       .table = run_opts,
                                       .handler = run_opt,
                                       .ctx = c,
                                       .spec_opts = RUN_SPEC_OPTS,
                                       .spec = &c->spec};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, err);
    if (r == 1) {
        fputs(usage_text, stdout);
        return 1;
    }
    if (r < 0)
        return r;
    if (optind >= argc)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "no command given (usage: conch run [options] -- CMD [ARGS...])");
    c->run.argv = argv + optind;
    if ((r = env_list(c, err)) < 0)
        return r;
    c->run.env_extra = c->env;
    struct conch_jail_spec *j = &c->run.jail;
    j->ws_mode = c->spec.mode;
    j->as_root = c->spec.as_root;
    j->limits.memory_bytes = c->spec.limits.memory_bytes;
    j->limits.pids_max = c->spec.limits.pids_max;
    j->limits.cpu_millicpus = c->spec.limits.cpu_millicpus;
    j->tmp_bytes = c->spec.tmp_bytes;
    j->home_bytes = c->spec.home_bytes;
    j->disk_bytes = c->spec.disk_bytes;
    if ((r = mounts_check(c, err)) < 0)
        return r;
    j->mounts = c->spec.mounts;
    j->n_mounts = c->spec.n_mounts;
    j->rules = c->spec.rules;
    j->n_rules = c->spec.n_rules;
    j->sockets = c->spec.sockets;
    j->n_sockets = c->spec.n_sockets;
    if (j->n_sockets) {
        char def[PATH_MAX];
        conch_daemon_socket(def, sizeof(def));
        if ((r = conch_spec_sockets_clear(j->sockets, j->n_sockets,
                                          c->socket_path ? c->socket_path : def, NULL, err)) < 0)
            return r;
    }
    struct conch_net_policy net;
    if ((r = conch_spec_net_policy(&c->spec, &net, err)) < 0)
        return r;
    j->net = net.mode;
    /* The allow mode's proxy runs here, in a thread of ours, for the one command. */
    if (j->net == CONCH_NET_ALLOW && (r = conch_nethost_new(&net, &c->nethost, err)) == 0)
        c->run.net = conch_nethost_net(c->nethost);
    conch_net_policy_done(&net);
    if (r < 0)
        return r;

    const char *ws = c->spec.workspace ? c->spec.workspace : ".";
    if (!realpath(ws, c->workspace))
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--workspace '%s': %s", ws,
                              strerror(errno));
    struct stat st;
    if (stat(c->workspace, &st) < 0 || !S_ISDIR(st.st_mode))
        return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR, "--workspace '%s': not a directory",
                              ws);
    c->run.jail.workspace = c->workspace;
    if (is_home(c->workspace))
        fprintf(stderr,
                "conch: warning: the workspace is your home directory '%s': the command sees "
                "every dotfile in it (~/.ssh, ~/.aws, shell history...); --workspace DIR narrows "
                "it\n",
                c->workspace);
    /* No file a command writes may outgrow the disk limit, in any mode (a sparse file
     * costs the overlay nothing but lands on the host at its full size). */
    c->run.jail.file_bytes = c->run.jail.disk_bytes;
    if (c->spec.rootfs) {
        if (!realpath(c->spec.rootfs, c->rootfs))
            return conch_err_setk(err, CONCH_ERR_USAGE, errno, "--rootfs '%s': %s", c->spec.rootfs,
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

static void print_json(const struct run_cli *c, const struct conch_run_result *res,
                       const struct conch_err *infra)
{
    json_t *o = conch_run_result_json(res, infra);
    if (o && c->run.jail.net == CONCH_NET_HOST)
        json_object_set_new(o, "network", json_string("host"));
    if (o && c->nethost) {
        size_t dropped = 0;
        json_object_set_new(o, "network", conch_nethost_records(c->nethost, &dropped));
        if (dropped)
            json_object_set_new(o, "network_dropped", json_integer((json_int_t)dropped));
    }
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

/* The allow mode's refusals, for the person reading: which, and why (the 403 said it too). */
static void print_denials(struct conch_nethost *h)
{
    size_t dropped = 0, i, shown = 0, denied = 0;
    json_t *recs = conch_nethost_records(h, &dropped), *rec;
    json_array_foreach(recs, i, rec)
    {
        if (json_is_true(json_object_get(rec, "allowed")))
            continue;
        if (denied++ < 5) {
            const char *why = json_string_value(json_object_get(rec, "error"));
            fprintf(stderr, "conch: network: %s:%lld denied: %s\n",
                    json_string_value(json_object_get(rec, "host")),
                    (long long)json_integer_value(json_object_get(rec, "port")),
                    why ? why : "refused");
            shown++;
        }
    }
    if (denied > shown)
        fprintf(stderr, "conch: network: %zu more denied (--json lists them)\n", denied - shown);
    json_decref(recs);
}

/* The changes of the workspace or of an overlay mount, and what their commit did. */
struct change_block {
    const struct conch_ws_changes *chs;
    bool committed, commit_tried;
    size_t applied;
    const struct conch_err *commit_err;
};

static void print_changes(const struct run_cli *c, const char *where, const char *host,
                          const struct change_block *b)
{
    const struct conch_ws_changes *chs = b->chs;
    size_t total = chs->total > chs->n ? chs->total : chs->n;
    if (total == 0) {
        fprintf(stderr, "conch: no changes in %s\n", where);
        return;
    }
    fprintf(stderr, "conch: %zu change%s in %s:\n", total, total == 1 ? "" : "s", where);
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
    if (b->committed && skipped)
        fprintf(stderr,
                "conch: changes committed to %s, except %zu entr%s marked [not committed]\n", host,
                skipped, skipped == 1 ? "y" : "ies");
    else if (b->committed)
        fprintf(stderr, "conch: changes committed to %s\n", host);
    else if (b->commit_tried)
        fprintf(stderr, "conch: changes NOT committed (%zu of them applied before it failed): %s\n",
                b->applied, b->commit_err->msg);
    else if (c->run.commit)
        fprintf(stderr, "conch: changes NOT committed: the command did not exit normally\n");
    else
        fprintf(stderr, "conch: changes discarded (run with --commit to apply them)\n");
}

static void print_summary(const struct run_cli *c, const struct conch_run_result *res)
{
    /* The command's own failure is on its stderr; one that never ran has only ours. */
    if (res->not_started)
        fprintf(stderr, "conch run: cannot run the command: %s\n", res->error_msg);
    else if (res->error_kind != CONCH_ERR_NONE && res->error_kind != CONCH_ERR_COMMAND)
        fprintf(stderr, "conch: error (%s): %s\n", conch_err_kind_name(res->error_kind),
                res->error_msg);
    if (c->run.jail.net == CONCH_NET_HOST && !c->quiet)
        fprintf(stderr, "conch: network: host (the command shared the host's network)\n");
    if (c->nethost && !c->quiet)
        print_denials(c->nethost);
    if (res->tools.summary && !c->quiet)
        fprintf(stderr, "conch: %s\n", res->tools.summary);
    for (unsigned i = 0; i < res->n_stores; i++) {
        const struct conch_run_store_result *st = &res->stores[i];
        if (st->err.code)
            fprintf(stderr, "conch: store '%s' (%s) NOT written back: %s\n", st->name, st->target,
                    st->err.msg);
        else if (!c->quiet)
            fprintf(stderr, "conch: store '%s' (%s): %u written, %u deleted%s\n", st->name,
                    st->target, st->rep.written, st->rep.deleted,
                    st->rep.skipped || st->rep.refused ? " (some entries skipped: --json)" : "");
    }
    if (c->quiet)
        return;
    if (res->has_changes)
        print_changes(c, "/workspace", c->workspace,
                      &(struct change_block){&res->changes, res->committed, res->commit_tried,
                                             res->commit.applied, &res->commit_err});
    for (unsigned i = 0; i < res->n_mounts; i++) {
        const struct conch_run_mount_result *m = &res->mounts[i];
        if (!m->has_changes) {
            fprintf(stderr, "conch: mount %s: %s\n", m->target, m->commit_err.msg);
            continue;
        }
        const char *host = "";
        for (unsigned k = 0; k < c->spec.n_mounts; k++)
            if (!strcmp(c->spec.mounts[k].target, m->target))
                host = c->spec.mounts[k].source;
        print_changes(c, m->target, host,
                      &(struct change_block){&m->changes, m->committed, m->commit_tried,
                                             m->commit.applied, &m->commit_err});
    }
}

int conch_cli_run(int argc, char **argv)
{
    /* On the heap: the two are ~45 KiB, and a caller's small stack limit must get our error
     * (conch_jail_check_stack below), not a crash in the option parser; calloc's fresh memory
     * is not zeroed again (no page faults on the stack's ~12 pages either). */
    struct run_cli *c = calloc(1, sizeof(*c));
    struct conch_run_result *res = calloc(1, sizeof(*res));
    if (!c || !res) {
        free(c);
        free(res);
        fprintf(stderr, "conch: error (infrastructure): out of memory\n");
        return CONCH_EXIT_INFRA;
    }
    conch_run_opts_init(&c->run);
    conch_spec_defaults(&c->spec);
    struct conch_err err = {0};
    res->out.spill_fd = res->err.spill_fd = -1;
    int status;

    int r = parse(c, argc, argv, &err);
    if (r == 1) {
        conch_spec_done(&c->spec);
        free(c);
        free(res);
        return 0;
    }
    if (r >= 0)
        r = conch_jail_check_stack(&err); /* before anything deep, borrowed or not */
    /* A daemon of ours may have a sandbox ready: its pool's (see conch_cli_lease). */
    if (r >= 0 && !c->no_daemon && !getenv("CONCH_NO_DAEMON"))
        conch_cli_lease(&c->run, c->socket_path, &c->run.leased);
    if (r >= 0)
        r = conch_exec_run(&c->run, res, &err);
    conch_cli_lease_end(r >= 0);
    if (r < 0) {
        status = err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : CONCH_EXIT_INFRA;
        if (c->json)
            print_json(c, res, &err);
        /* Also on stderr in JSON mode: a person running the command should see why. */
        if (err.kind == CONCH_ERR_USAGE)
            fprintf(stderr, "conch run: %s\n", err.msg);
        else
            fprintf(stderr, "conch: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
    } else {
        status = res->timed_out ? CONCH_EXIT_TIMEOUT : res->exit_code;
        if (c->json)
            print_json(c, res, NULL);
        else
            print_summary(c, res);
    }
    conch_run_result_done(res);
    conch_toolhost_free(c->toolhost);
    conch_nethost_free(c->nethost);
    for (size_t i = 0; i < c->n_env; i++)
        free(c->env[i]);
    free(c->env);
    conch_spec_done(&c->spec);
    free(c);
    free(res);
    return status;
}
