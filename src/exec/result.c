/* result.c - the JSON form of a command's result (what `conch run --json` prints and what
 * the daemon's exec.run returns) and its text form for a model. */
#include "exec/result.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/cleanup.h"
#include "core/utf8.h"

json_t *conch_json_text(const char *buf, size_t len)
{
    size_t n;
    _cleanup_free_ char *clean = conch_utf8_repair(buf, len, &n);
    return clean ? json_stringn(clean, n) : NULL;
}

/* One change as {path, kind, type, size, mode[, binary][, skip][, link_outside][, too_deep]}. */
static json_t *change_json(const struct conch_ws_change *ch)
{
    json_t *e = json_object();
    json_object_set_new(e, "path", conch_json_text(ch->path, strlen(ch->path)));
    json_object_set_new(e, "kind", json_string(conch_ws_change_kind_name(ch->kind)));
    char t[2] = {ch->type, 0};
    json_object_set_new(e, "type", json_string(t));
    json_object_set_new(e, "size", json_integer((json_int_t)ch->size));
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o",
             (unsigned)(ch->kind == CONCH_CHANGE_DELETED ? ch->old_mode : ch->new_mode));
    json_object_set_new(e, "mode", json_string(mode));
    if (ch->type == 'f' && ch->kind != CONCH_CHANGE_DELETED)
        json_object_set_new(e, "binary", json_boolean(ch->binary));
    const char *skip = conch_ws_change_skip_reason(ch);
    if (skip)
        json_object_set_new(e, "skip", json_string(skip));
    if (ch->flags & CONCH_WS_F_LINK_OUTSIDE)
        json_object_set_new(e, "link_outside", json_true());
    if (ch->flags & CONCH_WS_F_TOO_DEEP)
        json_object_set_new(e, "too_deep", json_true());
    if (ch->flags & CONCH_WS_F_UNREADABLE)
        json_object_set_new(e, "unreadable", json_true());
    return e;
}

json_t *conch_ws_changes_json(const struct conch_ws_changes *changes)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < changes->n; i++)
        json_array_append_new(arr, change_json(&changes->items[i]));
    return arr;
}

void conch_ws_changes_json_set(json_t *obj, const struct conch_ws_changes *changes, size_t max)
{
    size_t n = max && changes->n > max ? max : changes->n;
    size_t total = changes->total > changes->n ? changes->total : changes->n;
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, change_json(&changes->items[i]));
    json_object_set_new(obj, "changes", arr);
    json_object_set_new(obj, "changes_total", json_integer((json_int_t)total));
    json_object_set_new(obj, "changes_truncated", json_boolean(n < total));
}

static json_t *output_json(const struct conch_output *o)
{
    _cleanup_free_ char *text = NULL;
    size_t len = 0;
    if (conch_output_text(o, &text, &len) < 0)
        return json_null();
    json_t *j = conch_json_text(text, len);
    return j ? j : json_null();
}

static json_t *err_json(const struct conch_err *e)
{
    json_t *o = json_pack("{s:s}", "kind", conch_err_kind_name(e->kind));
    json_object_set_new(o, "message", conch_json_text(e->msg, strlen(e->msg)));
    return o;
}

/* "mounts": each overlay mount's changes and commit, as the workspace's ("changes",
 * "committed", "commit"); "stores": each store mount's write-back. Only when there are some. */
static void mounts_json(json_t *o, const struct conch_run_result *res)
{
    json_t *arr = res->n_mounts ? json_array() : NULL;
    for (unsigned i = 0; arr && i < res->n_mounts; i++) {
        const struct conch_run_mount_result *m = &res->mounts[i];
        json_t *e = json_pack("{s:s,s:b}", "target", m->target, "committed", m->committed);
        conch_ws_changes_json_set(e, &m->changes, CONCH_WS_CHANGES_MAX);
        if (m->commit_tried)
            json_object_set_new(e, "commit",
                                json_pack("{s:I,s:I,s:I}", "applied", (json_int_t)m->commit.applied,
                                          "skipped", (json_int_t)m->commit.skipped, "failed",
                                          (json_int_t)m->commit.failed));
        if (m->commit_err.code)
            json_object_set_new(e, "error", err_json(&m->commit_err));
        json_array_append_new(arr, e);
    }
    if (arr)
        json_object_set_new(o, "mounts", arr);
    arr = res->n_stores ? json_array() : NULL;
    for (unsigned i = 0; arr && i < res->n_stores; i++) {
        const struct conch_run_store_result *st = &res->stores[i];
        const struct conch_store_report *rep = &st->rep;
        json_t *e =
            json_pack("{s:s,s:s,s:i,s:i,s:i,s:i,s:i}", "name", st->name, "target", st->target,
                      "written", rep->written, "deleted", rep->deleted, "pulled", rep->pulled,
                      "skipped", rep->skipped, "refused", rep->refused);
        if (rep->first_skipped[0])
            json_object_set_new(e, "first_skipped", json_string(rep->first_skipped));
        if (st->err.code)
            json_object_set_new(e, "error", err_json(&st->err));
        json_array_append_new(arr, e);
    }
    if (arr)
        json_object_set_new(o, "stores", arr);
}

json_t *conch_run_result_json(const struct conch_run_result *res, const struct conch_err *infra)
{
    json_t *o = json_object();
    bool ran = !infra;
    /* When the sandbox could not be built, exit_code is conch's own status (2 or 125). */
    json_object_set_new(o, "exit_code",
                        json_integer(ran                              ? res->exit_code
                                     : infra->kind == CONCH_ERR_USAGE ? 2
                                                                      : 125));
    json_object_set_new(o, "signal", res->signal ? json_integer(res->signal) : json_null());
    json_object_set_new(o, "timed_out", json_boolean(res->timed_out));
    json_object_set_new(o, "duration_ms", json_integer((json_int_t)res->duration_ms));
    const struct conch_output *outs[2] = {&res->out, &res->err};
    static const char *const names[2] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        char key[32];
        json_object_set_new(o, names[i], output_json(outs[i]));
        snprintf(key, sizeof(key), "%s_bytes", names[i]);
        json_object_set_new(o, key, json_integer((json_int_t)outs[i]->total));
        snprintf(key, sizeof(key), "%s_truncated", names[i]);
        json_object_set_new(o, key, json_boolean(conch_output_truncated(outs[i])));
        snprintf(key, sizeof(key), "%s_spill", names[i]);
        char shown[sizeof(outs[i]->spill_path) + sizeof(outs[i]->shown_dir)];
        conch_output_spill_shown(outs[i], shown, sizeof(shown));
        json_object_set_new(o, key, shown[0] ? json_string(shown) : json_null());
    }
    conch_ws_changes_json_set(o, &res->changes, CONCH_WS_CHANGES_MAX);
    json_object_set_new(o, "committed", json_boolean(res->committed));
    if (res->commit_tried) {
        json_t *c =
            json_pack("{s:I,s:I,s:I}", "applied", (json_int_t)res->commit.applied, "skipped",
                      (json_int_t)res->commit.skipped, "failed", (json_int_t)res->commit.failed);
        if (c && res->commit_err.code) {
            json_t *e = json_pack("{s:s}", "kind", conch_err_kind_name(res->commit_err.kind));
            json_object_set_new(e, "message",
                                conch_json_text(res->commit_err.msg, strlen(res->commit_err.msg)));
            json_object_set_new(c, "error", e);
        }
        json_object_set_new(o, "commit", c);
    }
    mounts_json(o, res);
    json_t *usage = json_object();
    json_object_set_new(usage, "cpu_ms", json_integer((json_int_t)res->cpu_ms));
    json_object_set_new(usage, "max_rss_kb", json_integer((json_int_t)res->max_rss_kb));
    json_object_set_new(o, "usage", usage);
    /* The [tools: ...] line of the text, for harnesses that show it apart. */
    if (res->tools_summary)
        json_object_set_new(o, "tools_summary", json_string(res->tools_summary));
    if (res->tools.calls) {
        json_object_set_new(o, "tool_calls", json_incref(res->tools.calls));
        json_object_set_new(o, "detached_agents",
                            res->tools.detached ? json_incref(res->tools.detached) : json_array());
    }
    if (infra || res->error_kind != CONCH_ERR_NONE) {
        json_t *e = json_object();
        json_object_set_new(
            e, "kind", json_string(conch_err_kind_name(infra ? infra->kind : res->error_kind)));
        const char *msg = infra ? infra->msg : res->error_msg;
        json_object_set_new(e, "message", conch_json_text(msg, strlen(msg)));
        if (!infra && res->not_started)
            json_object_set_new(e, "not_started", json_true());
        json_object_set_new(o, "error", e);
    } else {
        json_object_set_new(o, "error", json_null());
    }
    return o;
}

/* Copy @len bytes of @src to @dst with every NUL as U+2400; returns the bytes written. */
static size_t copy_visible(char *dst, const char *src, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i]) {
            dst[n++] = src[i];
        } else {
            memcpy(dst + n, "\xe2\x90\x80", 3);
            n += 3;
        }
    }
    return n;
}

char *conch_run_result_text(const struct conch_run_result *res)
{
    _cleanup_free_ char *out = NULL, *err = NULL;
    size_t out_len = 0, err_len = 0;
    if (conch_output_text(&res->out, &out, &out_len) < 0 ||
        conch_output_text(&res->err, &err, &err_len) < 0)
        return NULL;
    char last[160];
    if (res->timed_out)
        snprintf(last, sizeof(last), "[timed out; exit code: %d]", res->exit_code);
    else if (res->signal)
        snprintf(last, sizeof(last), "[killed by signal %d; exit code: %d]", res->signal,
                 res->exit_code);
    else
        snprintf(last, sizeof(last), "[exit code: %d]", res->exit_code);
    const char *why = res->error_kind == CONCH_ERR_LIMIT ? res->error_msg : "";
    /* A NUL byte in the output becomes U+2400 (a visible NUL symbol): the text is a C string
     * for its callers, and a command must not be able to end it early, cutting the real
     * [exit code: N] line off after a fake one. */
    size_t nuls = 0;
    for (size_t i = 0; i < out_len; i++)
        nuls += out[i] == '\0';
    for (size_t i = 0; i < err_len; i++)
        nuls += err[i] == '\0';
    const char *tools = res->tools_summary ? res->tools_summary : "";
    size_t size = out_len + err_len + 2 * nuls + strlen(why) + strlen(tools) + sizeof(last) + 8;
    char *text = malloc(size);
    if (!text)
        return NULL;
    size_t n = copy_visible(text, out, out_len);
    if (err_len) {
        if (n && text[n - 1] != '\n')
            text[n++] = '\n';
        n += copy_visible(text + n, err, err_len);
    }
    if (n && text[n - 1] != '\n')
        text[n++] = '\n';
    if (*tools)
        n += (size_t)snprintf(text + n, size - n, "%s\n", tools);
    if (*why)
        n += (size_t)snprintf(text + n, size - n, "[%s]\n", why);
    n += (size_t)snprintf(text + n, size - n, "%s", last);
    text[n] = '\0';
    return text;
}

int conch_exit_code(int status, int *ret_signal)
{
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (ret_signal)
        *ret_signal = sig;
    return sig ? 128 + sig : WIFEXITED(status) ? WEXITSTATUS(status) : 0;
}

#define SET_ERROR(res, k, ...)                                                                     \
    do {                                                                                           \
        (res)->error_kind = (k);                                                                   \
        snprintf((res)->error_msg, sizeof((res)->error_msg), __VA_ARGS__);                         \
    } while (0)

void conch_run_result_end(struct conch_run_result *res, const struct conch_run_end *end)
{
    res->timed_out = end->timed_out;
    /* The shell itself is missing or not executable: the sandbox's fault, not the
     * command's. A working directory that does not exist, or arguments too long (E2BIG), are
     * the caller's: 127 or 126 below. */
    int code = end->start_err.code;
    if (end->start_failed && end->start_shell && end->start_err.kind == CONCH_ERR_COMMAND &&
        (code == ENOENT || code == EACCES || code == ENOEXEC || code == ELIBBAD)) {
        res->exit_code = CONCH_RUN_EXIT_INFRA;
        SET_ERROR(res, CONCH_ERR_INFRASTRUCTURE,
                  "the sandbox cannot run commands: its root filesystem has no usable %.32s "
                  "(commands run as '%.32s -c COMMAND'): %.200s",
                  end->start_shell, end->start_shell, end->start_err.msg);
        return;
    }
    if (end->start_failed) {
        /* Like a shell: a program that cannot be executed is the command's failure. */
        res->exit_code = end->start_err.code == ENOENT ? 127 : 126;
        res->not_started = true;
        SET_ERROR(res, CONCH_ERR_COMMAND, "%s", end->start_err.msg);
        return;
    }
    res->exit_code = conch_exit_code(end->status, &res->signal);
    /* One number for a timeout everywhere, as timeout(1) has it: `conch run` exits 124, and
     * exit_code (JSON, exec.run, text) says the same; `signal` still says how it ended. */
    if (end->timed_out)
        res->exit_code = CONCH_RUN_EXIT_TIMEOUT;
    const struct rusage *ru = &end->usage;
    res->cpu_ms = (uint64_t)(ru->ru_utime.tv_sec + ru->ru_stime.tv_sec) * 1000 +
                  (uint64_t)(ru->ru_utime.tv_usec + ru->ru_stime.tv_usec) / 1000;
    res->max_rss_kb = (uint64_t)ru->ru_maxrss;
    bool failed = res->exit_code != 0;
    const char *then = end->timed_out ? " (then the deadline passed)" : "";
    if (end->spill_exceeded)
        SET_ERROR(res, CONCH_ERR_LIMIT,
                  "output limit: more than %llu bytes on one stream; the command was killed",
                  (unsigned long long)end->spill_exceeded);
    else if (end->memory_exceeded)
        SET_ERROR(res, CONCH_ERR_LIMIT, "memory limit: killed for using more than %llu bytes%s",
                  (unsigned long long)end->memory_exceeded,
                  end->memory_sampled ? " (resident memory, sampled: no cgroup)" : "");
    else if (end->disk_full)
        SET_ERROR(res, CONCH_ERR_LIMIT, "disk limit: %s is full%s", end->disk_full, then);
    else if (failed && end->pids_hit)
        SET_ERROR(res, CONCH_ERR_LIMIT, "process limit: hit the limit of %llu processes%s",
                  (unsigned long long)end->pids_hit, then);
    else if (end->timed_out)
        SET_ERROR(res, CONCH_ERR_TIMEOUT,
                  "timed out after %.3g s (SIGTERM to every process, SIGKILL after %.3g s)",
                  (double)end->timeout_ms / 1000, (double)end->grace_ms / 1000);
    else if (res->signal)
        SET_ERROR(res, CONCH_ERR_COMMAND, "killed by signal %d (%s)", res->signal,
                  strsignal(res->signal));
    else if (failed)
        SET_ERROR(res, CONCH_ERR_COMMAND, "exited with status %d", res->exit_code);
}
