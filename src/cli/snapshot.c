/* snapshot.c - `conch snapshot`, `conch restore`, `conch fork` and `conch snapshots`: the
 * workspace's snapshots from the command line (docs/PROTOCOL.md, workspace.snapshot and
 * friends), each a thin client of one JSON-RPC call, with --json for scripts. */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"

enum { OPT_SOCKET = 1, OPT_JSON, OPT_NAME, OPT_FORCE, OPT_DELETE };
static const struct conch_cli_opt snap_opts[] = {
    {"socket", 0, true, OPT_SOCKET}, {"json", 0, false, OPT_JSON},
    {"name", 'n', true, OPT_NAME},   {"force", 'f', false, OPT_FORCE},
    {"delete", 0, true, OPT_DELETE}, {NULL, 0, false, 0},
};

struct snap_opts {
    const char *verb, *usage;
    const char *sock, *name, *del;
    bool json, force;
    unsigned allowed; /* bit per OPT_* key this verb takes */
};

static int snap_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct snap_opts *o = ctx;
    if (!(o->allowed & (1u << key)))
        return conch_err_set(err, EINVAL, "this option is not one of conch %s's", o->verb);
    switch (key) {
    case OPT_SOCKET:
        o->sock = value;
        break;
    case OPT_JSON:
        o->json = true;
        break;
    case OPT_NAME:
        o->name = value;
        break;
    case OPT_FORCE:
        o->force = true;
        break;
    default:
        o->del = value;
        break;
    }
    return 0;
}

/* Parse; the first operand's index in *@ret_optind. 0, 1 after the help, -1 after an error. */
static int parse(struct snap_opts *o, int argc, char **argv, int *ret_optind)
{
    const struct conch_cli_parser p = {
        .verb = o->verb, .table = snap_opts, .handler = snap_opt, .ctx = o};
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

static int operands(const struct snap_opts *o, int argc, int optind, int min, int max)
{
    int n = argc - optind;
    if (n < min || n > max) {
        conch_cli_usage_error(o->verb, o->usage, "%s",
                              n < min ? "missing argument" : "unexpected argument");
        return -1;
    }
    return 0;
}

static void print_json(json_t *res)
{
    char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        puts(s);
    free(s);
}

static void print_size(json_int_t bytes, char *buf, size_t size)
{
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

/* Call @method with @params (taken) and print its result: the --json object, or the field
 * @field of it. Returns the exit status. */
static int call_print(const struct snap_opts *o, struct conch_cli_conn *c, const char *method,
                      json_t *params, const char *field)
{
    json_t *res = conch_cli_conn_call(c, method, params);
    conch_cli_conn_close(c);
    if (!res)
        return 1;
    if (o->json)
        print_json(res);
    else
        puts(json_string_value(json_object_get(res, field)) ?: "");
    json_decref(res);
    return 0;
}

int conch_cli_snapshot(int argc, char **argv)
{
    struct snap_opts o = {
        .verb = "snapshot",
        .allowed = 1u << OPT_SOCKET | 1u << OPT_JSON | 1u << OPT_NAME | 1u << OPT_FORCE,
        .usage = "usage: conch snapshot [--socket PATH] [--json] [--name N] [--force] SANDBOX\n"
                 "\n"
                 "Freeze the sandbox's workspace changes into a snapshot and print its id. The\n"
                 "sandbox goes on from it: with nothing running, its /workspace is replaced in\n"
                 "place; else it is restarted (its /tmp and home start empty). With commands,\n"
                 "jobs or sessions running it refuses unless --force (which ends them).\n"};
    int optind = 1, r = parse(&o, argc, argv, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (operands(&o, argc, optind, 1, 1) < 0)
        return CONCH_EXIT_USAGE;
    struct conch_cli_conn c;
    char id[128];
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    if (conch_cli_resolve(&c, argv[optind], id, sizeof(id)) < 0) {
        conch_cli_conn_close(&c);
        return 1;
    }
    json_t *params = json_pack("{s:s,s:b}", "sandbox", id, "force", o.force);
    if (o.name)
        json_object_set_new(params, "name", json_string(o.name));
    return call_print(&o, &c, "workspace.snapshot", params, "id");
}

int conch_cli_restore(int argc, char **argv)
{
    struct snap_opts o = {
        .verb = "restore",
        .allowed = 1u << OPT_SOCKET | 1u << OPT_JSON | 1u << OPT_FORCE,
        .usage = "usage: conch restore [--socket PATH] [--json] [--force] SANDBOX SNAPSHOT\n"
                 "\n"
                 "Return the sandbox's workspace to a snapshot (by id or name): its changes\n"
                 "since are dropped, in place or by a restart as for 'conch snapshot' (--force:\n"
                 "even with commands, jobs or sessions running, which end).\n"};
    int optind = 1, r = parse(&o, argc, argv, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (operands(&o, argc, optind, 2, 2) < 0)
        return CONCH_EXIT_USAGE;
    struct conch_cli_conn c;
    char id[128];
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    if (conch_cli_resolve(&c, argv[optind], id, sizeof(id)) < 0) {
        conch_cli_conn_close(&c);
        return 1;
    }
    return call_print(
        &o, &c, "workspace.restore",
        json_pack("{s:s,s:s,s:b}", "sandbox", id, "snapshot", argv[optind + 1], "force", o.force),
        "snapshot");
}

/* Whether @ref names a snapshot (its id or name) the daemon has. */
static bool is_snapshot(struct conch_cli_conn *c, const char *ref)
{
    json_t *res = conch_cli_conn_call(c, "workspace.snapshots", json_object());
    bool found = false;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "snapshots"), i, e)
    {
        const char *sid = json_string_value(json_object_get(e, "id"));
        const char *name = json_string_value(json_object_get(e, "name"));
        found = found || (sid && !strcmp(sid, ref)) || (name && !strcmp(name, ref));
    }
    json_decref(res);
    return found;
}

int conch_cli_fork(int argc, char **argv)
{
    struct snap_opts o = {
        .verb = "fork",
        .allowed = 1u << OPT_SOCKET | 1u << OPT_JSON | 1u << OPT_NAME | 1u << OPT_FORCE,
        .usage = "usage: conch fork [--socket PATH] [--json] [--name N] [--force] "
                 "SANDBOX|SNAPSHOT\n"
                 "\n"
                 "Make a new sandbox starting from a snapshot, or from a sandbox's workspace as\n"
                 "it is now (the sandbox is snapshotted first: see 'conch snapshot'), and\n"
                 "print its id. The two are independent from then on.\n"};
    int optind = 1, r = parse(&o, argc, argv, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (operands(&o, argc, optind, 1, 1) < 0)
        return CONCH_EXIT_USAGE;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    const char *ref = argv[optind];
    json_t *params;
    if (is_snapshot(&c, ref)) {
        params = json_pack("{s:s}", "snapshot", ref);
    } else {
        char id[128];
        if (conch_cli_resolve(&c, ref, id, sizeof(id)) < 0) {
            conch_cli_conn_close(&c);
            return 1;
        }
        params = json_pack("{s:s,s:b}", "sandbox", id, "force", o.force);
    }
    if (o.name)
        json_object_set_new(params, "name", json_string(o.name));
    return call_print(&o, &c, "sandbox.fork", params, "id");
}

int conch_cli_snapshots(int argc, char **argv)
{
    struct snap_opts o = {
        .verb = "snapshots",
        .allowed = 1u << OPT_SOCKET | 1u << OPT_JSON | 1u << OPT_DELETE,
        .usage = "usage: conch snapshots [--socket PATH] [--json] [SANDBOX]\n"
                 "       conch snapshots [--socket PATH] --delete SNAPSHOT\n"
                 "\n"
                 "List the snapshots (of one sandbox: those taken of it and those it stands\n"
                 "on), with their parents and sizes; or delete one that nothing builds on.\n"};
    int optind = 1, r = parse(&o, argc, argv, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (operands(&o, argc, optind, 0, o.del ? 0 : 1) < 0)
        return CONCH_EXIT_USAGE;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    if (o.del)
        return call_print(&o, &c, "workspace.snapshot_delete",
                          json_pack("{s:s}", "snapshot", o.del), "snapshot");
    json_t *params = json_object();
    if (optind < argc) {
        char id[128];
        if (conch_cli_resolve(&c, argv[optind], id, sizeof(id)) < 0) {
            conch_cli_conn_close(&c);
            json_decref(params);
            return 1;
        }
        json_object_set_new(params, "sandbox", json_string(id));
    }
    json_t *res = conch_cli_conn_call(&c, "workspace.snapshots", params);
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    if (o.json) {
        print_json(res);
        json_decref(res);
        return 0;
    }
    printf("%-14s %-20s %-14s %-12s %10s %6s\n", "ID", "NAME", "PARENT", "SANDBOX", "SIZE",
           "LAYERS");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(res, "snapshots"), i, e)
    {
        char size[32];
        print_size(json_integer_value(json_object_get(e, "size")), size, sizeof(size));
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *parent = json_string_value(json_object_get(e, "parent"));
        printf("%-14s %-20s %-14s %-12s %10s %6d\n", json_string_value(json_object_get(e, "id")),
               name ? name : "-", parent ? parent : "-",
               json_string_value(json_object_get(e, "sandbox")), size,
               (int)json_integer_value(json_object_get(e, "depth")));
    }
    json_decref(res);
    return 0;
}
