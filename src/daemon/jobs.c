/* jobs.c - reading and steering the daemon's jobs (job.output, job.kill, job.list): their
 * records and output, found by id; commands.c runs them and answers job.start and job.wait. */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "daemon/daemon-internal.h"
#include "exec/result.h"

struct run *conch_daemon_job_find(struct daemon *d, struct conch_rpc_call *call, json_t *params)
{
    const char *id = conch_rpc_str(params, "job_id", "");
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->jobs)
    {
        struct run *r = conch_list_entry(pos, struct run, dlink);
        if (!strcmp(r->job_id, id) && conch_daemon_tenant_sees(d, r->sb))
            return r;
    }
    conch_rpc_call_failf(call, CONCH_RPC_JOB_NOT_FOUND, "job_not_found", NULL, "no job '%s'", id);
    return NULL;
}

/* Read up to @max bytes of a job's stream from @offset (its spill file holds every byte). */
static json_t *read_stream(const struct conch_output *o, long long *offset, long long max)
{
    if (*offset < 0)
        *offset = 0;
    if (!o->spill_path[0] || (uint64_t)*offset >= o->spilled)
        return json_string("");
    _cleanup_close_ int fd = open(o->spill_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return json_string("");
    uint64_t avail = o->spilled - (uint64_t)*offset;
    size_t n = (size_t)((uint64_t)max < avail ? (uint64_t)max : avail);
    _cleanup_free_ char *buf = malloc(n + 1);
    if (!buf)
        return json_string("");
    ssize_t got = pread(fd, buf, n, *offset);
    if (got < 0)
        got = 0;
    *offset += got;
    json_t *s = conch_json_text(buf, (size_t)got);
    return s ? s : json_string("");
}

void conch_daemon_handle_job_output(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct run *r = conch_daemon_job_find(((struct client *)ctx)->d, call, params);
    if (!r)
        return;
    long long so = conch_rpc_int(params, "stdout_offset", 0);
    long long eo = conch_rpc_int(params, "stderr_offset", 0);
    long long max = conch_rpc_int(params, "max_bytes", 65536);
    if (max <= 0 || max > (16 << 20))
        max = 65536;
    json_t *out = read_stream(conch_command_output(&r->cmd, CONCH_COMMAND_STDOUT), &so, max);
    json_t *err = read_stream(conch_command_output(&r->cmd, CONCH_COMMAND_STDERR), &eo, max);
    json_t *st = conch_daemon_job_status_json(r);
    json_object_set_new(st, "stdout", out);
    json_object_set_new(st, "stderr", err);
    json_object_set_new(st, "stdout_offset", json_integer(so));
    json_object_set_new(st, "stderr_offset", json_integer(eo));
    json_object_del(st, "signal");
    conch_rpc_call_reply(call, st);
}

void conch_daemon_handle_job_kill(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct run *r = conch_daemon_job_find(((struct client *)ctx)->d, call, params);
    if (!r)
        return;
    int sig = SIGTERM;
    json_t *s = json_object_get(params, "signal");
    if (json_is_integer(s))
        sig = (int)json_integer_value(s);
    else if (json_is_string(s)) {
        const char *name = json_string_value(s);
        if (!strncmp(name, "SIG", 3))
            name += 3;
        static const struct {
            const char *n;
            int s;
        } sigs[] = {{"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT},
                    {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1},
                    {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
        sig = 0;
        for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
            if (!strcmp(name, sigs[i].n))
                sig = sigs[i].s;
    } else if (s) {
        sig = 0;
    }
    if (sig <= 0 || sig >= 65) {
        conch_rpc_call_fail_param(call, "signal", "unknown signal");
        return;
    }
    if (!r->finished)
        conch_command_signal(&r->cmd, sig);
    conch_rpc_call_reply(call, json_pack("{s:b}", "killed", !r->finished));
}

void conch_daemon_handle_job_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *c = ctx;
    const char *sb = conch_rpc_str(params, "sandbox", NULL);
    json_t *arr = json_array();
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &c->d->jobs)
    {
        struct run *r = conch_list_entry(pos, struct run, dlink);
        if ((sb && strcmp(sb, r->sb->id)) || !conch_daemon_tenant_sees(c->d, r->sb))
            continue;
        json_t *o = conch_daemon_job_status_json(r);
        json_object_set_new(o, "job_id", json_string(r->job_id));
        json_object_set_new(o, "sandbox", json_string(r->sb->id));
        json_object_set_new(o, "command", conch_json_text(r->command, strlen(r->command)));
        json_object_set_new(o, "started_at", json_real(r->started_at));
        json_array_append_new(arr, o);
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "jobs", arr));
}
