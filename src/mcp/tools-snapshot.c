/* tools-snapshot.c - the MCP tools of `conch mcp` for snapshots (issue 18): snapshot, restore,
 * snapshots and fork of the session's sandbox, as workspace.snapshot / restore / snapshots
 * and sandbox.fork (docs/PROTOCOL.md); a fork becomes the session's sandbox. */
#include <stdio.h>
#include <string.h>

#include "core/strbuf.h"
#include "mcp/mcp-internal.h"

static const char *jstr(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static void text_done(struct mcp *m, struct mcp_call *c, struct conch_sb *t)
{
    if (t->oom)
        conch_mcp_call_done(m, c, true, "out of memory", 13);
    else
        conch_mcp_call_done(m, c, false, t->buf ? t->buf : "", t->len);
    conch_sb_done(t);
}

/* A snapshot: "snap-1a2b3c4d ("name")". */
static void put_snap(struct conch_sb *t, json_t *s)
{
    const char *name = json_string_value(json_object_get(s, "name"));
    conch_sb_printf(t, "%s", jstr(s, "id"));
    if (name)
        conch_sb_printf(t, " (\"%s\")", name);
}

/* What restarting the sandbox ends, said once for the tools that restart it. */
#define FORCE_DESC                                                                                 \
    "\"force\": {\"type\": \"boolean\", \"description\": \"End the persistent shell, JS "          \
    "sessions and background jobs that the restart would end (without it, the call is "            \
    "refused while they run)\"}"

/* The shell session does not survive a restart: the next shell call opens a new one. */
static void forget_sessions(struct mcp *m)
{
    conch_mcp_shell_set_session(m, NULL);
}

static void snapshot_start(struct mcp *m, struct mcp_call *c)
{
    const char *name;
    bool force;
    if (!conch_mcp_arg_str(m, c, "name", false, &name) ||
        !conch_mcp_arg_bool(m, c, "force", &force))
        return;
    json_t *p = json_pack("{s:b}", "force", force);
    if (p && name)
        json_object_set_new(p, "name", json_string(name));
    conch_mcp_daemon_call(m, c, "workspace.snapshot", p);
}

static void snapshot_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    if (error) {
        conch_mcp_call_fail_daemon(m, c, error);
        return;
    }
    forget_sessions(m);
    struct conch_sb t = {0};
    conch_sb_printf(&t, "Snapshot ");
    put_snap(&t, res);
    conch_sb_printf(&t,
                    " taken: /workspace as it is now (%lld bytes of changes frozen). Go back to "
                    "it with restore, list snapshots with snapshots.\n",
                    (long long)json_integer_value(json_object_get(res, "size")));
    text_done(m, c, &t);
}

/* Restore: first the session's sandbox's snapshots (stage 0), then the restore (stage 1) of
 * one of them only. The daemon restores any snapshot of the same workspace; the agent may
 * not reach one of another session's (a shared --state-dir keeps them), made maybe without
 * this session's rules. */
static void restore_start(struct mcp *m, struct mcp_call *c)
{
    const char *snap;
    bool force;
    if (!conch_mcp_arg_str(m, c, "snapshot", true, &snap) ||
        !conch_mcp_arg_bool(m, c, "force", &force))
        return;
    c->stage = 0;
    conch_mcp_daemon_call(m, c, "workspace.snapshots", json_object());
}

/* Whether @key names (by id or name) a snapshot of @list. */
static bool listed(json_t *list, const char *key)
{
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (!strcmp(jstr(e, "id"), key) || (name && !strcmp(name, key)))
            return true;
    }
    return false;
}

static void restore_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    if (error) {
        conch_mcp_call_fail_daemon(m, c, error);
        return;
    }
    if (c->stage == 0) {
        const char *snap = json_string_value(json_object_get(c->args, "snapshot"));
        if (!listed(json_object_get(res, "snapshots"), snap)) {
            conch_mcp_call_donef(m, c, true,
                                 "Error: no snapshot '%s' of this sandbox (snapshots lists "
                                 "them).",
                                 snap);
            return;
        }
        c->stage = 1;
        conch_mcp_daemon_call(m, c, "workspace.restore",
                              json_pack("{s:s,s:b}", "snapshot", snap, "force",
                                        json_is_true(json_object_get(c->args, "force"))));
        return;
    }
    forget_sessions(m);
    conch_mcp_call_donef(m, c, false,
                         "Restored snapshot %s: /workspace is as it was then; the changes made "
                         "since are gone. /tmp and the home directory start empty.",
                         jstr(res, "snapshot"));
}

static void snapshots_start(struct mcp *m, struct mcp_call *c)
{
    conch_mcp_daemon_call(m, c, "workspace.snapshots", json_object());
}

static void snapshots_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    if (error) {
        conch_mcp_call_fail_daemon(m, c, error);
        return;
    }
    json_t *list = json_object_get(res, "snapshots");
    if (!json_array_size(list)) {
        conch_mcp_call_donef(m, c, false, "No snapshots yet (take one with snapshot).");
        return;
    }
    struct conch_sb t = {0};
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        put_snap(&t, e);
        const char *parent = json_string_value(json_object_get(e, "parent"));
        conch_sb_printf(&t, ": %lld bytes, %lld entries, on %s\n",
                        (long long)json_integer_value(json_object_get(e, "size")),
                        (long long)json_integer_value(json_object_get(e, "files")),
                        parent ? parent : "the host directory");
    }
    conch_sb_printf(&t, "[%zu snapshot%s, oldest first]\n", json_array_size(list),
                    json_array_size(list) == 1 ? "" : "s");
    text_done(m, c, &t);
}

static void fork_start(struct mcp *m, struct mcp_call *c)
{
    const char *snap, *name;
    bool force;
    if (!conch_mcp_arg_str(m, c, "snapshot", false, &snap) ||
        !conch_mcp_arg_str(m, c, "name", false, &name) ||
        !conch_mcp_arg_bool(m, c, "force", &force))
        return;
    json_t *p = json_pack("{s:b}", "force", force);
    if (p && snap)
        json_object_set_new(p, "snapshot", json_string(snap));
    if (p && name)
        json_object_set_new(p, "name", json_string(name));
    conch_mcp_daemon_call(m, c, "sandbox.fork", p);
}

static void fork_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    if (error) {
        conch_mcp_call_fail_daemon(m, c, error);
        return;
    }
    char left[128];
    snprintf(left, sizeof(left), "%s", conch_mcp_sandbox_id(m));
    conch_mcp_set_sandbox(m, jstr(res, "id"));
    forget_sessions(m);
    conch_mcp_call_donef(m, c, false,
                         "Forked: this session now works in sandbox %s, started from snapshot %s. "
                         "Sandbox %s is left as it was (restore %s here to get that state back).",
                         jstr(res, "id"), jstr(res, "snapshot"), left, jstr(res, "snapshot"));
}

const struct mcp_tool conch_mcp_snapshot_tools[] = {
    {
        .name = "snapshot",
        .title = "Snapshot the workspace",
        .description =
            "Save /workspace as it is now as a snapshot: a checkpoint to go back to with "
            "restore, or to branch from with fork. Takes milliseconds whatever the "
            "workspace's size. The sandbox restarts (files stay; processes, /tmp and the home "
            "directory do not).",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"name\": {\"type\": \"string\", \"description\": \"A name to refer to it by "
                  "(letters, digits, . _ -; unique)\"}," FORCE_DESC "}}",
        .start = snapshot_start,
        .reply = snapshot_reply,
    },
    {
        .name = "restore",
        .title = "Restore a snapshot",
        .description = "Return /workspace to a snapshot (its id or name): every change made "
                       "since is dropped. The sandbox restarts.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"snapshot\": {\"type\": \"string\", \"description\": \"The snapshot's id "
                  "or name\"}," FORCE_DESC "},"
                  "\"required\": [\"snapshot\"]}",
        .destructive = true,
        .start = restore_start,
        .reply = restore_reply,
    },
    {
        .name = "snapshots",
        .title = "List the snapshots",
        .description = "List the snapshots of this sandbox and those it stands on, oldest first: "
                       "id, name, size, and the snapshot each is stacked on.",
        .schema = "{\"type\": \"object\", \"properties\": {}}",
        .read_only = true,
        .start = snapshots_start,
        .reply = snapshots_reply,
    },
    {
        .name = "fork",
        .title = "Fork the sandbox",
        .description =
            "Branch: make a new sandbox from the current state (snapshotted first) or from a "
            "snapshot, and continue this session in it. The sandbox left behind keeps its "
            "state; the two are independent from then on. changes, diff and commit then "
            "concern the fork.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"snapshot\": {\"type\": \"string\", \"description\": \"Start from this "
                  "snapshot (id or name, one that snapshots lists) instead of the current state\"},"
                  "\"name\": {\"type\": \"string\", \"description\": \"A name for the new "
                  "sandbox\"}," FORCE_DESC "}}",
        .start = fork_start,
        .reply = fork_reply,
    },
    {.name = NULL},
};
