/* methods.c - the daemon's JSON-RPC method table: each method with the parameters it takes
 * (checked by rpc/ before the handler runs), and the handlers of the daemon's own and the
 * sandbox registry's methods (ping, sandbox.create/list/get/destroy); the others live with
 * what they drive (commands.c, files.c, pool.c, tools.c, sessions.c). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon-internal.h"
#include "daemon/sessions.h"
#include "fs/fs.h"
#include "spec/spec.h"

static void handle_ping(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    (void)params;
    int n = 0, ready = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        n += !sandbox_in_pool(sb) && !sb->fresh;
        /* what conch_daemon_pool_take would lend now (being built or made as new: not yet) */
        ready += sb->state == SB_POOLED;
    }
    conch_rpc_call_reply(call,
                         json_pack("{s:s,s:i,s:i,s:i,s:s,s:{s:I,s:I}}", "version", "0.1.0", "pid",
                                   (int)getpid(), "sandboxes", n, "pool_ready", ready, "state_dir",
                                   c->d->state_dir, "held", "sandboxes",
                                   (json_int_t)conch_budget_held(&c->d->held_budget), "output",
                                   (json_int_t)conch_budget_held(&c->d->output_budget)));
}

/* Fill @spec from sandbox.create (or exec.run fresh) params, by the one spec parser
 * (spec/spec.h); strings point into @params. Returns false after failing @call. */
bool conch_daemon_spec_from_params(struct conch_rpc_call *call, json_t *params,
                                   struct sandbox_spec *spec)
{
    struct conch_sandbox_spec s;
    struct conch_err err = {0};
    const char *param = NULL;
    if (conch_spec_from_json(&s, params, &param, &err) < 0) {
        conch_rpc_call_fail_param(call, param, "%s", err.msg);
        return false;
    }
    *spec = (struct sandbox_spec){
        .workspace = s.workspace,
        .mode = s.mode,
        .rootfs = s.rootfs,
        .as_root = s.as_root,
        .limits = {.memory_bytes = s.limits.memory_bytes,
                   .pids_max = s.limits.pids_max,
                   .cpu_millicpus = s.limits.cpu_millicpus},
        .tmp_bytes = s.tmp_bytes,
        .disk_bytes = s.disk_bytes,
        .env = s.env, /* params hold it too: borrowed from there */
        .idle_timeout = s.idle_timeout,
        .name = s.name,
        .tool_timeout = s.tool_timeout,
        .max_tool_calls = s.max_tool_calls,
        /* checked by conch_spec_from_json; parsed again (into the sandbox) at creation */
        .mounts = json_object_get(params, "mounts"),
        .readonly = json_object_get(params, "readonly"),
        .hidden = json_object_get(params, "hidden"),
        .sockets = json_object_get(params, "sockets"),
    };
    if (conch_spec_net_policy(&s, &spec->net, &err) < 0) {
        conch_spec_done(&s);
        conch_rpc_call_fail_param(call, "net", "%s", err.msg);
        return false;
    }
    conch_spec_done(&s);
    return true;
}

/* A sandbox's name, as container names are: [a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}, and unique
 * among the sandboxes (stopped ones included). @len is the JSON string's length: a NUL byte
 * ("a\u0000b") is refused, not cut at (the sandbox would be named "a"). Returns false after
 * failing @call. */
static bool name_ok(struct daemon *d, struct conch_rpc_call *call, const char *name, size_t len)
{
    size_t n = strlen(name);
    bool ok = n == len && n >= 1 && n <= 64 && isalnum((unsigned char)name[0]);
    for (size_t i = 1; ok && i < n; i++)
        ok = isalnum((unsigned char)name[i]) || strchr("_.-", name[i]);
    if (!ok) {
        conch_rpc_call_fail_param(call, "name",
                                  "a sandbox name is 1 to 64 letters, digits, '_', '.' or '-', "
                                  "beginning with a letter or a digit");
        return false;
    }
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (conch_daemon_sandbox_find(d, sb->id) == sb && !strcmp(sb->name, name)) {
            conch_rpc_call_fail_param(call, "name",
                                      "the name '%s' is taken by sandbox %s: choose another, or "
                                      "remove that one first (sandbox.destroy)",
                                      name, sb->id);
            return false;
        }
    }
    return true;
}

static void handle_sandbox_create(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *name = conch_rpc_str(params, "name", NULL);
    if (name && !name_ok(c->d, call, name, json_string_length(json_object_get(params, "name"))))
        return;
    struct sandbox_spec spec;
    if (!conch_daemon_spec_from_params(call, params, &spec))
        return;
    struct sandbox *sb;
    struct conch_err err = {0};
    int r = conch_daemon_sandbox_create(c->d, &spec, &sb, &err);
    conch_net_policy_done(&spec.net);
    if (r == -EMFILE || r == -EDQUOT) {
        conch_rpc_call_fail(call, CONCH_RPC_LIMIT, "limit", err.msg, NULL);
        return;
    }
    if (r < 0) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    conch_rpc_call_reply(call, conch_daemon_sandbox_json(sb));
}

static struct sandbox *find_or_fail(struct client *c, struct conch_rpc_call *call, json_t *params,
                                    const char *key)
{
    return conch_daemon_sandbox_find_or_fail(c->d, call, params, key);
}

static void handle_sandbox_get(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = find_or_fail(ctx, call, params, "id");
    if (sb)
        conch_rpc_call_reply(call, conch_daemon_sandbox_json(sb));
}

static void handle_sandbox_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    (void)params;
    json_t *arr = json_array();
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->sandboxes)
    {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (!sandbox_in_pool(sb) && !sb->fresh && conch_daemon_tenant_sees(c->d, sb))
            json_array_append_new(arr, conch_daemon_sandbox_json(sb));
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "sandboxes", arr));
}

static void destroyed(void *arg)
{
    conch_rpc_call_reply(arg, json_pack("{s:b}", "destroyed", 1));
}

static void handle_sandbox_start(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = find_or_fail(ctx, call, params, "id");
    struct conch_err err = {0};
    if (sb && conch_daemon_sandbox_resume(sb, &err) < 0)
        conch_rpc_call_fail_err(call, 0, NULL, &err);
    else if (sb)
        conch_rpc_call_reply(call, conch_daemon_sandbox_json(sb));
}

static void handle_sandbox_destroy(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct sandbox *sb = find_or_fail(ctx, call, params, "id");
    if (!sb)
        return;
    /* Answered once the warden is gone and the directory removed, which happens in a
     * worker: the loop serves others meanwhile. */
    conch_daemon_sandbox_destroy_then(sb, destroyed, call);
}

#define FS_HANDLER(fn, m)                                                                          \
    static void fn(struct conch_rpc_call *call, json_t *params, void *ctx)                         \
    {                                                                                              \
        conch_daemon_handle_fs(call, params, ctx, m);                                              \
    }
FS_HANDLER(handle_fs_read, "read")
FS_HANDLER(handle_fs_write, "write")
FS_HANDLER(handle_fs_edit, "edit")
FS_HANDLER(handle_fs_ls, "ls")
FS_HANDLER(handle_fs_glob, "glob")
FS_HANDLER(handle_fs_grep, "grep")
FS_HANDLER(handle_fs_delete, "delete")
FS_HANDLER(handle_fs_upload, "upload")
FS_HANDLER(handle_fs_download, "download")

static void handle_fs_copy_in(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    conch_daemon_handle_fs_copy(call, params, ctx, true);
}

static void handle_fs_copy_out(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    conch_daemon_handle_fs_copy(call, params, ctx, false);
}

/* The param tables. Every number a client sends is range-checked here, by the dispatcher,
 * before a handler turns it into a size, a time or a count (docs/PROTOCOL.md lists the
 * ranges): NaN, infinities, negatives and 1e308 never reach the code below. */
#define S CONCH_RPC_STRING
#define I CONCH_RPC_INT
#define N CONCH_RPC_NUMBER
#define B CONCH_RPC_BOOL
#define O CONCH_RPC_OBJECT
#define A CONCH_RPC_ARRAY
#define P(n, t, req)                                                                               \
    {                                                                                              \
        .name = (n), .type = (t), .required = (req)                                                \
    }
/* A number in [lo, hi]; nz > 0: other than 0, at least nz. */
#define R(n, t, lo, hi, nz)                                                                        \
    {                                                                                              \
        .name = (n), .type = (t), .ranged = true, .min = (lo), .max = (hi), .min_nonzero = (nz)    \
    }
#define END                                                                                        \
    {                                                                                              \
        .name = NULL                                                                               \
    }

#define KiB 1024.0
#define MiB (1024.0 * KiB)
#define TiB (1024.0 * 1024.0 * MiB)
#define DAY 86400.0

/* The ranges are the spec's (spec/spec.h), which conch_spec_from_json checks again. */
#define SANDBOX_SPEC_PARAMS                                                                        \
    P("workspace", S, false), P("mode", S, false), P("rootfs", S, false), P("as_root", B, false),  \
        P("env", O, false), R("memory", I, 0, CONCH_SPEC_MEMORY_MAX, CONCH_SPEC_MEMORY_MIN),       \
        R("pids", I, 0, CONCH_SPEC_PIDS_MAX, CONCH_SPEC_PIDS_MIN),                                 \
        R("cpu", N, 0, CONCH_SPEC_CPU_MAX, CONCH_SPEC_CPU_MIN),                                    \
        R("tmp_size", I, 0, CONCH_SPEC_TMP_MAX, CONCH_SPEC_SIZE_MIN),                              \
        R("disk", I, 0, CONCH_SPEC_DISK_MAX, CONCH_SPEC_SIZE_MIN),                                 \
        R("idle_timeout", N, 0, CONCH_SPEC_IDLE_MAX, 1), P("name", S, false),                      \
        R("tool_timeout", N, 0, CONCH_SPEC_TOOL_TIMEOUT_MAX, CONCH_SPEC_TOOL_TIMEOUT_MIN),         \
        R("max_tool_calls", I, 1, CONCH_SPEC_TOOL_CALLS_MAX, 0), P("mounts", A, false),            \
        P("net", S, false), P("allow", A, false), P("deny", A, false), P("readonly", A, false),    \
        P("hidden", A, false), P("sockets", A, false)

static const struct conch_rpc_param p_none[] = {END};
static const struct conch_rpc_param p_auth[] = {P("token", S, true), P("peer", S, false), END};
static const struct conch_rpc_param p_create[] = {SANDBOX_SPEC_PARAMS, END};
static const struct conch_rpc_param p_id[] = {P("id", S, true), END};
static const struct conch_rpc_param p_lease[] = {
    P("workspace", S, true),
    P("mode", S, false),
    R("disk", I, 0, CONCH_SPEC_DISK_MAX, CONCH_SPEC_SIZE_MIN),
    R("ws_dev", I, 0, 9e15, 0),
    R("ws_ino", I, 0, 9e15, 0),
    R("proto", I, 0, 4294967295.0, 0),
    END};
static const struct conch_rpc_param p_exec[] = {P("sandbox", S, false),
                                                P("fresh", B, false),
                                                P("workspace", S, false),
                                                P("mode", S, false),
                                                P("command", S, true),
                                                P("cwd", S, false),
                                                P("env", O, false),
                                                P("stdin", S, false),
                                                R("timeout", N, 0, 7 * DAY, 0.001),
                                                R("grace", N, 0, 3600, 0.001),
                                                R("max_output", I, 0, CONCH_MAX_OUTPUT, 0),
                                                P("stream", B, false),
                                                P("changes", B, false),
                                                P("shell", S, false),
                                                END};
static const struct conch_rpc_param p_exec_signal[] = {
    P("sandbox", S, true), P("request_id", CONCH_RPC_ANY, true), P("signal", S, false), END};
static const struct conch_rpc_param p_job_start[] = {P("sandbox", S, true),
                                                     P("command", S, true),
                                                     P("cwd", S, false),
                                                     P("env", O, false),
                                                     P("stdin", S, false),
                                                     R("max_output", I, 0, CONCH_MAX_OUTPUT, 0),
                                                     END};
static const struct conch_rpc_param p_job_output[] = {
    P("job_id", S, true), R("stdout_offset", I, 0, 1e15, 0), R("stderr_offset", I, 0, 1e15, 0),
    R("max_bytes", I, 1, 16 * MiB, 0), END};
static const struct conch_rpc_param p_job_wait[] = {P("job_id", S, true),
                                                    R("timeout", N, 0, 1 * DAY, 0.001), END};
static const struct conch_rpc_param p_job_kill[] = {P("job_id", S, true),
                                                    P("signal", CONCH_RPC_ANY, false), END};
static const struct conch_rpc_param p_job_list[] = {P("sandbox", S, false), END};
static const struct conch_rpc_param p_fs_read[] = {P("sandbox", S, true),
                                                   P("path", S, true),
                                                   R("offset", I, 0, 1e15, 0),
                                                   R("limit", I, 1, 1e15, 0),
                                                   P("encoding", S, false),
                                                   R("length", I, 1, CONCH_FS_MAX_FILE, 0),
                                                   END};
static const struct conch_rpc_param p_fs_write[] = {P("sandbox", S, true), P("path", S, true),
                                                    P("content", S, true), P("encoding", S, false),
                                                    P("append", B, false), END};
static const struct conch_rpc_param p_fs_edit[] = {
    P("sandbox", S, true),    P("path", S, true),         P("old_string", S, true),
    P("new_string", S, true), P("replace_all", B, false), END};
static const struct conch_rpc_param p_fs_ls[] = {P("sandbox", S, true), P("path", S, false), END};
static const struct conch_rpc_param p_fs_glob[] = {
    P("sandbox", S, true),  P("pattern", S, true),
    P("path", S, false),    R("max_results", I, 1, 10000, 0),
    P("details", B, false), END};
static const struct conch_rpc_param p_fs_grep[] = {P("sandbox", S, true),
                                                   P("pattern", S, true),
                                                   P("path", S, false),
                                                   P("glob", S, false),
                                                   P("fixed_string", B, false),
                                                   P("ignore_case", B, false),
                                                   R("max_matches", I, 1, 10000, 0),
                                                   END};
static const struct conch_rpc_param p_fs_delete[] = {P("sandbox", S, true), P("path", S, true),
                                                     P("recursive", B, false), END};
static const struct conch_rpc_param p_fs_upload[] = {P("sandbox", S, true), P("files", A, true),
                                                     END};
static const struct conch_rpc_param p_fs_download[] = {P("sandbox", S, true), P("paths", A, true),
                                                       END};
static const struct conch_rpc_param p_fs_copy[] = {
    P("sandbox", S, true), P("path", S, true), P("host_path", S, true), P("host_id", S, true), END};
static const struct conch_rpc_param p_ws[] = {P("sandbox", S, true), P("paths", A, false), END};
/* "mount": an overlay mount's target, whose changes are meant instead of the workspace's. */
static const struct conch_rpc_param p_ws_commit[] = {P("sandbox", S, true), P("paths", A, false),
                                                     P("mount", S, false), END};
static const struct conch_rpc_param p_ws_diff[] = {P("sandbox", S, true), P("paths", A, false),
                                                   P("since", S, false), P("mount", S, false), END};
static const struct conch_rpc_param p_ws_changes[] = {
    P("sandbox", S, true), R("offset", I, 0, 1e15, 0), R("limit", I, 1, 10000, 0),
    P("since", S, false),  P("mount", S, false),       END};

static const struct conch_rpc_param p_sandbox[] = {P("sandbox", S, true), END};
static const struct conch_rpc_param p_snapshot[] = {P("sandbox", S, true), P("name", S, false),
                                                    P("force", B, false), END};
static const struct conch_rpc_param p_restore[] = {P("sandbox", S, true), P("snapshot", S, true),
                                                   P("force", B, false), END};
static const struct conch_rpc_param p_fork[] = {P("sandbox", S, false), P("snapshot", S, false),
                                                P("name", S, false), P("force", B, false), END};
static const struct conch_rpc_param p_snapshots[] = {P("sandbox", S, false), END};
static const struct conch_rpc_param p_snapshot_delete[] = {P("snapshot", S, true), END};
static const struct conch_rpc_param p_network_set[] = {
    P("sandbox", S, true), P("net", S, false), P("allow", A, false), P("deny", A, false), END};
static const struct conch_rpc_param p_tools_register[] = {P("sandbox", S, true),
                                                          P("tools", A, true), END};
static const struct conch_rpc_param p_agents_register[] = {P("sandbox", S, true),
                                                           P("agents", A, true), END};
static const struct conch_rpc_param p_names[] = {P("sandbox", S, true), P("names", A, true), END};
static const struct conch_rpc_param p_tools_trace[] = {P("sandbox", S, true),
                                                       P("origin", CONCH_RPC_OBJECT, false), END};
static const struct conch_rpc_param p_tools_prompt[] = {P("sandbox", S, true),
                                                        P("languages", A, false), END};
/* sessions (sessions.c) */
static const struct conch_rpc_param p_session_open[] = {P("sandbox", S, true),
                                                        P("shell", S, false),
                                                        P("cwd", S, false),
                                                        P("env", O, false),
                                                        R("rows", I, 1, 1000, 0),
                                                        R("cols", I, 1, 1000, 0),
                                                        R("scrollback", I, 0, 64 * MiB, 0),
                                                        R("idle_timeout", N, 0, 365 * DAY, 1),
                                                        P("attach", B, false),
                                                        END};
static const struct conch_rpc_param p_session_run[] = {P("session", S, true),
                                                       P("command", S, true),
                                                       P("stdin", S, false),
                                                       R("timeout", N, 0, 7 * DAY, 0.001),
                                                       R("grace", N, 0, 3600, 0.001),
                                                       R("max_output", I, 0, CONCH_MAX_OUTPUT, 0),
                                                       END};
static const struct conch_rpc_param p_session_write[] = {P("session", S, true), P("data", S, true),
                                                         END};
static const struct conch_rpc_param p_session_attach[] = {P("session", S, true),
                                                          P("write", B, false), END};
static const struct conch_rpc_param p_session_id[] = {P("session", S, true), END};
static const struct conch_rpc_param p_session_resize[] = {
    P("session", S, true), R("rows", I, 1, 1000, 0), R("cols", I, 1, 1000, 0), END};
static const struct conch_rpc_param p_session_signal[] = {P("session", S, true),
                                                          P("signal", S, false), END};
static const struct conch_rpc_param p_session_list[] = {P("sandbox", S, false), END};
/* JS sessions (js.c) */
static const struct conch_rpc_param p_js_eval[] = {P("sandbox", S, true),
                                                   P("session", S, false),
                                                   P("code", S, true),
                                                   R("timeout", N, 0, 7 * DAY, 0.001),
                                                   P("tools", CONCH_RPC_ANY, false),
                                                   END};
static const struct conch_rpc_param p_js_session[] = {P("sandbox", S, true), P("session", S, false),
                                                      END};

/* stores (stores.c) */
static const struct conch_rpc_param p_store_ls[] = {P("store", S, true), P("path", S, false), END};
static const struct conch_rpc_param p_store_path[] = {P("store", S, true), P("path", S, true), END};
static const struct conch_rpc_param p_store_read[] = {P("store", S, true), P("path", S, true),
                                                      P("encoding", S, false), END};
static const struct conch_rpc_param p_store_write[] = {
    P("store", S, true),     P("path", S, true),       P("content", S, true),
    P("encoding", S, false), R("mode", I, 0, 0777, 0), END};

const struct conch_rpc_method conch_daemon_methods[] = {
    {"daemon.ping", p_none, handle_ping},
    {"connection.auth", p_auth, conch_daemon_handle_connection_auth},
    {"sandbox.create", p_create, handle_sandbox_create},
    {"sandbox.list", p_none, handle_sandbox_list},
    {"sandbox.get", p_id, handle_sandbox_get},
    {"sandbox.destroy", p_id, handle_sandbox_destroy},
    {"sandbox.start", p_id, handle_sandbox_start},
    {"exec.run", p_exec, conch_daemon_handle_exec_run},
    {"exec.signal", p_exec_signal, conch_daemon_handle_exec_signal},
    {"sandbox.lease", p_lease, conch_daemon_handle_sandbox_lease},
    {"sandbox.release", p_none, conch_daemon_handle_sandbox_release},
    {"job.start", p_job_start, conch_daemon_handle_job_start},
    {"job.output", p_job_output, conch_daemon_handle_job_output},
    {"job.wait", p_job_wait, conch_daemon_handle_job_wait},
    {"job.kill", p_job_kill, conch_daemon_handle_job_kill},
    {"job.list", p_job_list, conch_daemon_handle_job_list},
    {"fs.read", p_fs_read, handle_fs_read},
    {"fs.write", p_fs_write, handle_fs_write},
    {"fs.edit", p_fs_edit, handle_fs_edit},
    {"fs.ls", p_fs_ls, handle_fs_ls},
    {"fs.glob", p_fs_glob, handle_fs_glob},
    {"fs.grep", p_fs_grep, handle_fs_grep},
    {"fs.delete", p_fs_delete, handle_fs_delete},
    {"fs.upload", p_fs_upload, handle_fs_upload},
    {"fs.download", p_fs_download, handle_fs_download},
    {"fs.copy_in", p_fs_copy, handle_fs_copy_in},
    {"fs.copy_out", p_fs_copy, handle_fs_copy_out},
    {"workspace.changes", p_ws_changes, conch_daemon_handle_workspace_changes},
    {"workspace.diff", p_ws_diff, conch_daemon_handle_workspace_diff},
    {"workspace.commit", p_ws_commit, conch_daemon_handle_workspace_commit},
    {"workspace.discard", p_ws, conch_daemon_handle_workspace_discard},
    {"workspace.snapshot", p_snapshot, conch_daemon_handle_workspace_snapshot},
    {"workspace.restore", p_restore, conch_daemon_handle_workspace_restore},
    {"workspace.snapshots", p_snapshots, conch_daemon_handle_workspace_snapshots},
    {"workspace.snapshot_delete", p_snapshot_delete, conch_daemon_handle_workspace_snapshot_delete},
    {"sandbox.fork", p_fork, conch_daemon_handle_sandbox_fork},
    {"tools.register", p_tools_register, conch_daemon_handle_tools_register},
    {"tools.unregister", p_names, conch_daemon_handle_tools_unregister},
    {"tools.list", p_sandbox, conch_daemon_handle_tools_list},
    {"tools.trace", p_tools_trace, conch_daemon_handle_tools_trace},
    {"tools.prompt", p_tools_prompt, conch_daemon_handle_tools_prompt},
    {"agents.register", p_agents_register, conch_daemon_handle_agents_register},
    {"agents.unregister", p_names, conch_daemon_handle_agents_unregister},
    {"session.open", p_session_open, conch_daemon_handle_session_open},
    {"session.run", p_session_run, conch_daemon_handle_session_run},
    {"session.write", p_session_write, conch_daemon_handle_session_write},
    {"session.attach", p_session_attach, conch_daemon_handle_session_attach},
    {"session.detach", p_session_id, conch_daemon_handle_session_detach},
    {"session.resize", p_session_resize, conch_daemon_handle_session_resize},
    {"session.signal", p_session_signal, conch_daemon_handle_session_signal},
    {"session.list", p_session_list, conch_daemon_handle_session_list},
    {"session.close", p_session_id, conch_daemon_handle_session_close},
    {"js.eval", p_js_eval, conch_daemon_handle_js_eval},
    {"js.reset", p_js_session, conch_daemon_handle_js_reset},
    {"js.close", p_js_session, conch_daemon_handle_js_close},
    {"js.list", p_sandbox, conch_daemon_handle_js_list},
    {"network.log", p_sandbox, conch_daemon_handle_network_log},
    {"network.set", p_network_set, conch_daemon_handle_network_set},
    {"store.list", p_none, conch_daemon_handle_store_list},
    {"store.ls", p_store_ls, conch_daemon_handle_store_ls},
    {"store.read", p_store_read, conch_daemon_handle_store_read},
    {"store.write", p_store_write, conch_daemon_handle_store_write},
    {"store.delete", p_store_path, conch_daemon_handle_store_delete},
    {NULL, NULL, NULL},
};
