/* execsignal.c - exec.signal: a signal to a streamed exec.run that is still running, from the
 * connection that sent it (how `conch exec` forwards Ctrl-C; the run's answer then comes as
 * for any command a signal ended, with what it printed until then). */
#include <signal.h>
#include <string.h>

#include "core/cleanup.h"
#include "daemon/daemon-internal.h"

void conch_daemon_handle_exec_signal(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    static const struct {
        const char *name;
        int sig;
    } sigs[] = {
        {"INT", SIGINT}, {"TERM", SIGTERM}, {"KILL", SIGKILL}, {"HUP", SIGHUP}, {"QUIT", SIGQUIT}};
    const char *name = conch_rpc_str(params, "signal", "INT");
    if (!strncmp(name, "SIG", 3))
        name += 3;
    int sig = 0;
    for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
        if (!strcmp(name, sigs[i].name))
            sig = sigs[i].sig;
    if (!sig) {
        conch_rpc_call_fail_param(call, "signal", "unknown signal (INT, TERM, KILL, HUP, QUIT)");
        return;
    }
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return;
    json_t *id = json_object_get(params, "request_id");
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->runs)
    {
        struct run *r = conch_list_entry(pos, struct run, link);
        /* Request ids are a connection's own: only its streamed runs match. */
        if (r->is_job || r->finished || !r->call || !c->sink || r->notify != c->sink ||
            !json_equal(r->request_id, id))
            continue;
        conch_command_signal(&r->cmd, sig);
        conch_rpc_call_reply(call, json_pack("{s:b}", "signalled", 1));
        return;
    }
    conch_rpc_call_reply(call, json_pack("{s:b}", "signalled", 0));
}
