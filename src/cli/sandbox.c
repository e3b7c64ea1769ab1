/* sandbox.c - `conch create`, `conch changes`, `conch diff`, `conch commit` and `conch discard`
 * (cp.c: `conch cp`): the daemon's sandboxes and workspaces from the command line, each a thin
 * client of one or two JSON-RPC calls (docs/PROTOCOL.md), with --json for scripts. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "workspace/workspace.h"

/* Options every verb here takes (and conch network's --log). */
enum { OPT_SOCKET = 1, OPT_JSON, OPT_LOG, OPT_SINCE, OPT_MOUNT };
static const struct conch_cli_opt common_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"json", 0, false, OPT_JSON},
    {NULL, 0, false, 0},
};
static const struct conch_cli_opt since_opts[] = {
    {"socket", 0, true, OPT_SOCKET}, {"json", 0, false, OPT_JSON}, {"since", 0, true, OPT_SINCE},
    {"mount", 0, true, OPT_MOUNT},   {NULL, 0, false, 0},
};
static const struct conch_cli_opt commit_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"json", 0, false, OPT_JSON},
    {"mount", 0, true, OPT_MOUNT},
    {NULL, 0, false, 0},
};
static const struct conch_cli_opt network_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"json", 0, false, OPT_JSON},
    {"log", 0, false, OPT_LOG},
    {NULL, 0, false, 0},
};

struct common {
    const char *verb;
    const char *usage;
    const char *sock;
    bool json;
    bool log;
    const char *since;                 /* changes, diff: --since SNAPSHOT */
    const char *mount;                 /* changes, diff, commit: --mount TARGET (overlay) */
    const struct conch_cli_opt *table; /* NULL: common_opts */
};

static int usage_error(const struct common *o, const char *what, const char *arg)
{
    fprintf(stderr, "conch %s: %s%s%s%s\n%s", o->verb, what, arg ? " '" : "", arg ? arg : "",
            arg ? "'" : "", o->usage);
    return CONCH_EXIT_USAGE;
}

/* Print @res (taken) as one JSON line. */
static void print_json(json_t *res)
{
    char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        puts(s);
    free(s);
    json_decref(res);
}

/* Connect and resolve @ref (an id or a name) into @id. Returns 0, or the exit status after
 * printing why not: 125 (CONCH_EXIT_INFRA) when the daemon cannot be reached, as from every
 * verb, 1 when it knows no such sandbox. */
static int open_sandbox(const struct common *o, struct conch_cli_conn *c, const char *ref, char *id,
                        size_t size)
{
    if (conch_cli_conn_open(c, o->sock) < 0)
        return CONCH_EXIT_INFRA;
    if (conch_cli_resolve(c, ref, id, size) < 0) {
        conch_cli_conn_close(c);
        return 1;
    }
    return 0;
}

static int common_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct common *o = ctx;
    if (key == OPT_SOCKET)
        o->sock = value;
    else if (key == OPT_LOG)
        o->log = true;
    else if (key == OPT_SINCE)
        o->since = value;
    else if (key == OPT_MOUNT)
        o->mount = value;
    else
        o->json = true;
    return 0;
}

/* Parse the common options (and @spec_opts into @spec) and leave the first operand's index
 * in *@ret_optind. Returns 0, 1 after printing the help, or -1 after a usage error. */
static int parse(struct common *o, int argc, char **argv, unsigned spec_opts,
                 struct conch_sandbox_spec *spec, int *ret_optind)
{
    const struct conch_cli_parser p = {.verb = o->verb,
                                       .table = o->table ? o->table : common_opts,
                                       .handler = common_opt,
                                       .ctx = o,
                                       .spec_opts = spec_opts,
                                       .spec = spec};
    struct conch_err err = {0};
    int r = conch_cli_opts_parse(&p, argc, argv, ret_optind, &err);
    if (r == 1)
        fputs(o->usage, stdout);
    if (r < 0) {
        conch_cli_usage_error(o->verb, o->usage, "%s", err.msg);
        return -1;
    }
    return r;
}

/* ---- create ---- */

#define CREATE_SPEC_OPTS                                                                           \
    (CONCH_SPEC_OPT_WORKSPACE | CONCH_SPEC_OPT_NAME | CONCH_SPEC_OPT_MODE |                        \
     CONCH_SPEC_OPT_AS_ROOT | CONCH_SPEC_OPT_ENV | CONCH_SPEC_OPT_MEMORY | CONCH_SPEC_OPT_PIDS |   \
     CONCH_SPEC_OPT_CPU | CONCH_SPEC_OPT_TMP_SIZE | CONCH_SPEC_OPT_DISK |                          \
     CONCH_SPEC_OPT_IDLE_TIMEOUT | CONCH_SPEC_OPT_MOUNT | CONCH_SPEC_OPT_NET |                     \
     CONCH_SPEC_OPT_RULES | CONCH_SPEC_OPT_SOCKET)

int conch_cli_create(int argc, char **argv)
{
    struct common o = {
        .verb = "create",
        .usage =
            "usage: conch create [--socket PATH] [--json] [--workspace DIR] [--name N]\n"
            "                    [--mode overlay|ro|rw] [--as-root] [--env K=V]...\n"
            "                    [--memory B] [--pids N] [--cpu C] [--tmp-size B]\n"
            "                    [--disk B] [--idle-timeout S]\n"
            "                    [--mount "
            "type=tmpfs|bind|overlay|store,target=P[,source=DIR][,name=N][,size=B][,rw]]...\n"
            "                    [--net none|allow|host] [--allow RULE]... [--deny RULE]...\n"
            "                    [--readonly PATH]... [--hidden PATH]...\n"
            "                    [--pass-socket HOST[:INSIDE]]...\n"
            "\n"
            "Create a sandbox in the running daemon and print its id (--json: the sandbox\n"
            "object). Without --workspace it gets an empty one. Network: none (default;\n"
            "loopback only), allow (HTTP and HTTPS through the daemon's proxy to what the\n"
            "--allow rules name, minus the --deny ones: 'pypi.org', '*.npmjs.org',\n"
            "'host:8443'; --allow implies it), host (the host's network, not isolated).\n"
            "--pass-socket passes a host unix socket of yours in, at INSIDE (default: HOST).\n"};
    struct conch_sandbox_spec spec;
    conch_spec_defaults(&spec);
    int optind = 1;
    int r = parse(&o, argc, argv, CREATE_SPEC_OPTS, &spec, &optind);
    char path[PATH_MAX];
    if (r == 0 && optind < argc) {
        usage_error(&o, "unexpected argument", argv[optind]);
        r = -1;
    }
    if (r == 0 && spec.workspace) {
        if (!realpath(spec.workspace, path)) {
            fprintf(stderr, "conch create: --workspace '%s': %s\n", spec.workspace,
                    strerror(errno));
            r = -1;
        }
        spec.workspace = path;
    }
    json_t *params = r == 0 ? conch_spec_to_json(&spec) : NULL;
    conch_spec_done(&spec);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (!params)
        return 1;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0) {
        json_decref(params);
        return CONCH_EXIT_INFRA;
    }
    json_t *res = conch_cli_conn_call(&c, "sandbox.create", params);
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    if (o.json) {
        print_json(res);
    } else {
        puts(json_string_value(json_object_get(res, "id")));
        json_decref(res);
    }
    return 0;
}

/* ---- changes, diff, commit, discard ---- */

static char change_letter(const char *kind)
{
    if (!kind)
        return '?';
    if (!strcmp(kind, "added"))
        return 'A';
    if (!strcmp(kind, "deleted"))
        return 'D';
    if (!strcmp(kind, "type_changed"))
        return 'T';
    return 'M';
}

/* A path for the terminal: quoted as git quotes names that hold control bytes. */
static void print_path_line(const char *prefix, const char *path, const char *note)
{
    _cleanup_free_ char *q = conch_ws_quote("", path ? path : "", false);
    printf("%s%s%s\n", prefix, q ? q : "?", note ? note : "");
}

/* Every change, through workspace.changes' pages, into one result. */
static json_t *all_changes(struct conch_cli_conn *c, const char *id, const char *since,
                           const char *mount)
{
    json_t *all = json_array();
    json_int_t offset = 0, total = 0;
    for (;;) {
        json_t *page =
            conch_cli_conn_call(c, "workspace.changes",
                                json_pack("{s:s,s:I,s:i,s:s*,s:s*}", "sandbox", id, "offset",
                                          offset, "limit", 10000, "since", since, "mount", mount));
        if (!page) {
            json_decref(all);
            return NULL;
        }
        json_array_extend(all, json_object_get(page, "changes"));
        total = json_integer_value(json_object_get(page, "changes_total"));
        json_t *next = json_object_get(page, "next_offset");
        bool more = json_is_integer(next) && json_integer_value(next) > offset;
        if (more)
            offset = json_integer_value(next);
        json_decref(page);
        if (!more)
            break;
    }
    return json_pack("{s:o,s:I,s:b}", "changes", all, "changes_total", total, "changes_truncated",
                     0);
}

enum ws_verb { WS_CHANGES, WS_DIFF, WS_COMMIT, WS_DISCARD };

static int ws_verb(enum ws_verb v, int argc, char **argv)
{
    static const char *const names[] = {"changes", "diff", "commit", "discard"};
    static const char *const usages[] = {
        "usage: conch changes [--socket PATH] [--json] [--since SNAPSHOT] [--mount TARGET] ID\n"
        "\n"
        "List the changes a sandbox made to its workspace (A added, M modified, D deleted,\n"
        "T type changed), not yet committed. --since: those made after SNAPSHOT (an id or\n"
        "name of the snapshots the sandbox stands on), against the workspace as it was then.\n"
        "--mount: those of its overlay mount at TARGET instead.\n",
        "usage: conch diff [--socket PATH] [--json] [--since SNAPSHOT] [--mount TARGET] ID "
        "[PATH...]\n"
        "\n"
        "Print the uncommitted changes as a unified diff (git apply / patch -p1 take it).\n"
        "--since: the changes made after SNAPSHOT, against the workspace as it was then.\n"
        "--mount: those of its overlay mount at TARGET instead.\n",
        "usage: conch commit [--socket PATH] [--json] [--mount TARGET] ID [PATH...]\n"
        "\n"
        "Apply the sandbox's changes (all, or the listed paths and what is beneath them) to\n"
        "its workspace directory on the host. --mount: those of its overlay mount at TARGET,\n"
        "to that mount's source directory.\n",
        "usage: conch discard [--socket PATH] [--json] ID [PATH...]\n"
        "\n"
        "Drop the sandbox's uncommitted changes (all, or the listed paths). A running sandbox\n"
        "is restarted: its processes stop and /tmp and the home start empty.\n"};
    struct common o = {.verb = names[v],
                       .usage = usages[v],
                       .table = v <= WS_DIFF     ? since_opts
                                : v == WS_COMMIT ? commit_opts
                                                 : NULL};
    int optind = 1;
    int r = parse(&o, argc, argv, 0, NULL, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (optind >= argc)
        return usage_error(&o, "no sandbox given", NULL);
    if (v == WS_CHANGES && optind + 1 < argc)
        return usage_error(&o, "unexpected argument", argv[optind + 1]);
    char id[128];
    struct conch_cli_conn c;
    if ((r = open_sandbox(&o, &c, argv[optind], id, sizeof(id))) != 0)
        return r;
    json_t *paths = NULL;
    if (optind + 1 < argc) {
        paths = json_array();
        for (int i = optind + 1; i < argc; i++)
            json_array_append_new(paths, json_string(argv[i]));
    }
    json_t *res;
    if (v == WS_CHANGES) {
        res = all_changes(&c, id, o.since, o.mount);
    } else {
        static const char *const methods[] = {NULL, "workspace.diff", "workspace.commit",
                                              "workspace.discard"};
        json_t *params = json_pack("{s:s}", "sandbox", id);
        if (o.since)
            json_object_set_new(params, "since", json_string(o.since));
        if (o.mount)
            json_object_set_new(params, "mount", json_string(o.mount));
        if (paths)
            json_object_set(params, "paths", paths);
        res = conch_cli_conn_call(&c, methods[v], params);
    }
    json_decref(paths);
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    if (o.json) {
        print_json(res);
        return 0;
    }
    size_t i;
    json_t *e;
    switch (v) {
    case WS_CHANGES:
        json_array_foreach(json_object_get(res, "changes"), i, e)
        {
            char prefix[4] = {change_letter(json_string_value(json_object_get(e, "kind"))), ' ',
                              '\0'};
            const char *skip = json_string_value(json_object_get(e, "skip"));
            char note[128] = "";
            if (skip)
                snprintf(note, sizeof(note), "  [not committed: %s]", skip);
            else if (json_is_true(json_object_get(e, "link_outside")))
                snprintf(note, sizeof(note), "  [symlink pointing outside the workspace]");
            print_path_line(prefix, json_string_value(json_object_get(e, "path")), note);
        }
        break;
    case WS_DIFF: {
        json_t *d = json_object_get(res, "diff");
        fwrite(json_string_value(d), 1, json_string_length(d), stdout);
        json_int_t omitted = json_integer_value(json_object_get(res, "omitted"));
        if (omitted)
            fprintf(stderr, "conch diff: %lld file(s) omitted (the diff is capped at 16 MiB)\n",
                    (long long)omitted);
        break;
    }
    case WS_COMMIT:
        json_array_foreach(json_object_get(res, "committed"), i, e)
            print_path_line("committed ", json_string_value(e), NULL);
        json_array_foreach(json_object_get(res, "skipped"), i, e)
        {
            char note[160];
            snprintf(note, sizeof(note), "  (%s)",
                     json_string_value(json_object_get(e, "reason"))
                         ? json_string_value(json_object_get(e, "reason"))
                         : "skipped");
            print_path_line("skipped ", json_string_value(json_object_get(e, "path")), note);
        }
        break;
    case WS_DISCARD:
        json_array_foreach(json_object_get(res, "discarded"), i, e)
            print_path_line("discarded ", json_string_value(e), NULL);
        break;
    }
    json_decref(res);
    return 0;
}

int conch_cli_changes(int argc, char **argv)
{
    return ws_verb(WS_CHANGES, argc, argv);
}

int conch_cli_diff(int argc, char **argv)
{
    return ws_verb(WS_DIFF, argc, argv);
}

int conch_cli_commit(int argc, char **argv)
{
    return ws_verb(WS_COMMIT, argc, argv);
}

int conch_cli_discard(int argc, char **argv)
{
    return ws_verb(WS_DISCARD, argc, argv);
}

/* ---- network ---- */

static void print_rules(const char *what, json_t *arr)
{
    printf("%s:", what);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v) printf(" %s", json_string_value(v));
    printf("%s\n", json_array_size(arr) ? "" : " (none)");
}

int conch_cli_network(int argc, char **argv)
{
    struct common o = {
        .verb = "network",
        .usage = "usage: conch network [--socket PATH] [--json] SANDBOX [--allow RULE]...\n"
                 "                     [--deny RULE]... [--net none|allow] [--log]\n"
                 "\n"
                 "Show a sandbox's network policy, change it (--allow and --deny replace that\n"
                 "list; --net none makes an allow sandbox's proxy refuse everything), or with\n"
                 "--log list its last network attempts (host, port, allowed or denied and by\n"
                 "which rule, bytes each way).\n",
        .table = network_opts};
    struct conch_sandbox_spec spec;
    conch_spec_defaults(&spec);
    int optind = 1;
    int r = parse(&o, argc, argv, CONCH_SPEC_OPT_NET, &spec, &optind);
    const char *ref = NULL;
    /* SANDBOX, then options again. */
    while (r == 0 && optind < argc) {
        if (ref) {
            usage_error(&o, "unexpected argument", argv[optind]);
            r = -1;
            break;
        }
        ref = argv[optind];
        int more = 1;
        r = parse(&o, argc - optind, argv + optind, CONCH_SPEC_OPT_NET, &spec, &more);
        optind += more;
    }
    if (r == 0 && !ref) {
        usage_error(&o, "no sandbox given", NULL);
        r = -1;
    }
    if (r != 0) {
        conch_spec_done(&spec);
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    }
    json_t *set = NULL;
    if (spec.net_given || spec.allow || spec.deny) {
        set = json_object();
        if (spec.net_given)
            json_object_set_new(set, "net", json_string(conch_net_mode_name(spec.net)));
        if (spec.allow)
            json_object_set_new(set, "allow", json_incref(spec.allow));
        if (spec.deny)
            json_object_set_new(set, "deny", json_incref(spec.deny));
    }
    conch_spec_done(&spec);
    struct conch_cli_conn c;
    char id[128];
    if ((r = open_sandbox(&o, &c, ref, id, sizeof(id))) != 0) {
        json_decref(set);
        return r;
    }
    if (set) {
        json_object_set_new(set, "sandbox", json_string(id));
        json_t *res = conch_cli_conn_call(&c, "network.set", set);
        if (!res) {
            conch_cli_conn_close(&c);
            return 1;
        }
        json_decref(res);
    }
    json_t *res = conch_cli_conn_call(&c, "network.log", json_pack("{s:s}", "sandbox", id));
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    bool log = o.log;
    if (o.json) {
        if (!log)
            json_object_del(res, "records");
        print_json(res);
        return 0;
    }
    printf("network: %s\n", json_string_value(json_object_get(res, "net")));
    if (json_object_get(res, "allow")) {
        print_rules("allow", json_object_get(res, "allow"));
        print_rules("deny", json_object_get(res, "deny"));
    }
    size_t i;
    json_t *rec;
    json_array_foreach(log ? json_object_get(res, "records") : NULL, i, rec)
    {
        const char *rule = json_string_value(json_object_get(rec, "rule"));
        const char *error = json_string_value(json_object_get(rec, "error"));
        bool ok = json_is_true(json_object_get(rec, "allowed"));
        printf("%s %s:%lld %s%s%s in=%lld out=%lld%s%s\n", ok ? "ALLOW" : "DENY ",
               json_string_value(json_object_get(rec, "host")),
               (long long)json_integer_value(json_object_get(rec, "port")),
               json_string_value(json_object_get(rec, "kind")), rule ? " rule=" : "",
               rule ? rule : "", (long long)json_integer_value(json_object_get(rec, "bytes_in")),
               (long long)json_integer_value(json_object_get(rec, "bytes_out")),
               error ? " error: " : "", error ? error : "");
    }
    json_decref(res);
    return 0;
}
