/* file-answers.c - what comes back from fs.* requests: a file worker's answer (from inside the
 * sandbox, up to 64 MiB of JSON, charged to the sandbox's budget while the daemon holds it)
 * checked and spliced into its response, off the loop when large; and fs.* on the sandbox's
 * spill files (/run/conch/output), served on the host from its spill dir. files.c sends the
 * requests and reads the answers. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/statedir.h"
#include "fs/fs.h"

/* ---- a file worker's answer ---- */

/* A file worker's answer (up to 64 MiB of JSON) comes from inside the sandbox: checking it
 * is what makes sure that only one well-formed result reaches the client. A big one is
 * checked in a worker thread, not on the loop; one up to this size, on the loop (the fast
 * check takes about a microsecond per KiB, less than a trip through the threadpool). */
#define FILE_ANSWER_INLINE_MAX (64u << 10)

struct file_answer {
    uv_work_t req;
    struct conch_rpc_call *call;
    struct sandbox *sb; /* held while @charged > 0 (its budget is charged) */
    uint64_t charged;   /* bytes of sb->held: the raw answer, then the result made of it */
    char *buf;          /* owned, the raw answer */
    size_t len;
    char *text;    /* the result, serialised */
    json_t *error; /* or the error object */
};

/* The common answer, {"result":{...}} as the worker's json_dumps wrote it, is checked in one
 * pass by conch_fs_json_object_check (one object, valid UTF-8, no raw CR/LF or other control
 * character, no duplicate key, nothing after it) and its result sent as it is, without
 * parsing it into a tree or serialising it again. An answer the check does not take (an
 * error, or anything unusual) takes the full path, which parses it and writes it anew. */
static bool answer_verbatim(struct file_answer *a)
{
    static const char prefix[] = "{\"result\":{";
    size_t np = sizeof(prefix) - 2; /* up to the result's '{' */
    if (a->len < np + 3 || memcmp(a->buf, prefix, np + 1) || a->buf[a->len - 1] != '}')
        return false;
    char *r = a->buf + np;
    size_t rlen = a->len - np - 1;
    if (!conch_fs_json_object_check(r, rlen))
        return false;
    memmove(a->buf, r, rlen);
    a->buf[rlen] = '\0';
    a->text = a->buf;
    a->buf = NULL;
    return true;
}

void conch_daemon_file_answer_refuse(struct conch_rpc_call *call, const char *size,
                                     const struct conch_err *err)
{
    conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                         "the file worker's answer %s does not fit in the daemon's memory for "
                         "the sandbox: %s",
                         size, err->msg);
}

static void answer_work(uv_work_t *req)
{
    struct file_answer *a = req->data;
    if (answer_verbatim(a))
        return;
    /* Parsed, the answer takes more than its text (jansson: ~64 bytes per value): charged
     * before it is parsed, as the bridge charges a request line (atomic: from a worker). */
    uint64_t cost = a->len ? conch_rpc_json_cost(a->buf, a->len) : 0;
    struct conch_err err = {0};
    if (a->sb && conch_budget_charge(&a->sb->held, cost, &err) < 0) {
        free(a->buf);
        a->buf = NULL;
        char msg[700];
        snprintf(msg, sizeof(msg),
                 "the file worker's answer of %zu bytes (about %llu parsed) does not fit in "
                 "the daemon's memory for the sandbox: %s",
                 a->len, (unsigned long long)cost, err.msg);
        a->error = json_pack("{s:s,s:s}", "code", "limit", "message", msg);
        return;
    }
    json_error_t jerr;
    json_t *resp = a->len ? json_loadb(a->buf, a->len, JSON_ALLOW_NUL, &jerr) : NULL;
    free(a->buf);
    a->buf = NULL;
    json_t *res = json_object_get(resp, "result");
    json_t *e = json_object_get(resp, "error");
    if (res)
        a->text = json_dumps(res, JSON_COMPACT | JSON_ENCODE_ANY);
    else if (json_is_object(e))
        a->error = json_incref(e);
    json_decref(resp);
    if (a->sb)
        conch_budget_uncharge(&a->sb->held, cost);
}

/* @a no longer holds memory for its sandbox. */
static void answer_uncharge(struct file_answer *a)
{
    if (!a->sb)
        return;
    conch_budget_uncharge(&a->sb->held, a->charged);
    a->charged = 0;
    conch_daemon_sandbox_release(a->sb);
    a->sb = NULL;
}

static void answer_done(uv_work_t *req, int status)
{
    struct file_answer *a = req->data;
    json_t *e = a->error;
    (void)status;
    if (a->text) {
        conch_rpc_call_reply_dumped(a->call, a->text);
        a->text = NULL;
    } else if (e) {
        const char *code = json_string_value(json_object_get(e, "code"));
        const char *msg = json_string_value(json_object_get(e, "message"));
        int rc = code ? conch_rpc_code_for(code) : 0;
        json_t *extra = json_object();
        json_t *v;
        if ((v = json_object_get(e, "param")))
            json_object_set(extra, "param", v);
        if ((v = json_object_get(e, "occurrences")))
            json_object_set(extra, "occurrences", v);
        if ((v = json_object_get(e, "limit")))
            json_object_set(extra, "limit", v);
        if (code && !strcmp(code, "invalid_params"))
            rc = CONCH_RPC_INVALID_PARAMS;
        if (!rc)
            rc = CONCH_RPC_INTERNAL_ERROR;
        conch_rpc_call_fail(a->call, rc, code ? code : "internal_error", msg ? msg : "failed",
                            extra);
    } else {
        conch_rpc_call_fail(a->call, CONCH_RPC_INTERNAL_ERROR, "internal_error",
                            "the file worker in the sandbox gave no answer (it crashed or was "
                            "killed)",
                            NULL);
    }
    json_decref(e);
    free(a->buf);
    free(a->text);
    answer_uncharge(a);
    free(a);
}

void conch_daemon_file_answer_queue(struct sandbox *sb, struct conch_rpc_call *call, char *buf,
                                    size_t len, uint64_t charged, bool measure, bool frees)
{
    /* Nobody will read the answer (its client went away, or was cut off past its output
     * buffer limit): do not parse it. */
    struct file_answer *a = NULL;
    if (call && conch_rpc_call_cancelled(call)) {
        conch_rpc_call_fail(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", "cancelled", NULL);
        free(buf);
        conch_budget_uncharge(&sb->held, charged);
        return;
    }
    if (!(a = calloc(1, sizeof(*a)))) {
        conch_rpc_call_fail(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", "out of memory",
                            NULL);
        free(buf);
        conch_budget_uncharge(&sb->held, charged);
        return;
    }
    /* The answer leaves the request: a stop meanwhile changes nothing. It holds the sandbox
     * (whose budget it is charged to) until it has gone to its client. */
    a->req.data = a;
    a->call = call;
    a->buf = buf;
    a->len = len;
    a->sb = sb;
    a->charged = charged;
    conch_daemon_sandbox_hold(sb);
    if (len <= FILE_ANSWER_INLINE_MAX && answer_verbatim(a)) {
        answer_done(&a->req, 0);
    } else if (uv_queue_work(&sb->d->loop, &a->req, answer_work, answer_done) < 0) {
        answer_work(&a->req);
        answer_done(&a->req, 0);
    }
    /* What a write added, or a delete freed, counts at once: measure, once the answer is on
     * its way (the measuring thread's wake-up would delay it). A delete opens the way again
     * until the measurement says otherwise. */
    if (measure) {
        if (frees)
            sb->disk_over = false;
        sb->disk_charged = 0;
        conch_daemon_sandbox_measure(sb);
    }
}

/* ---- the sandbox's spill files, read-only at /run/conch/output ---- */

/* True when @path is /run/conch/output or beneath it (lexically; the fs module then
 * resolves it beneath the spill dir and refuses any way out). */
static bool in_output_dir(const char *path)
{
    size_t n = strlen(CONCH_SPILL_SHOWN_DIR);
    return path && !strncmp(path, CONCH_SPILL_SHOWN_DIR, n) && (!path[n] || path[n] == '/');
}

/* Whether fs.@method with @params names the output dir: 1 all of its paths do, 0 none,
 * -1 some do and some do not (download). */
int conch_daemon_fs_output_request(const char *method, json_t *params)
{
    if (!strcmp(method, "download")) {
        size_t i, in = 0, n = json_array_size(json_object_get(params, "paths"));
        json_t *p;
        json_array_foreach(json_object_get(params, "paths"), i, p) in +=
            in_output_dir(json_string_value(p));
        return in == 0 ? 0 : in == n ? 1 : -1;
    }
    if (!strcmp(method, "upload")) {
        size_t i;
        json_t *f;
        json_array_foreach(
            json_object_get(params, "files"), i,
            f) if (in_output_dir(json_string_value(json_object_get(f, "path")))) return 1;
        return 0;
    }
    const char *path = json_string_value(json_object_get(params, "path"));
    const char *pattern = json_string_value(json_object_get(params, "pattern"));
    if (!strcmp(method, "glob") && !path && pattern && pattern[0] == '/')
        path = pattern;
    return in_output_dir(path);
}

struct output_op {
    struct file_answer a; /* first: answer_done frees it as a file_answer */
    struct sandbox *sb;   /* held */
    int dirfd;
    char method[16];
    json_t *params;
};

static void output_work(uv_work_t *req)
{
    struct output_op *op = req->data;
    struct conch_fs_error ferr;
    memset(&ferr, 0, sizeof(ferr));
    json_t *res = NULL;
    if (op->dirfd >= 0) {
        res = conch_fs_call(op->dirfd, CONCH_SPILL_SHOWN_DIR, op->method, op->params, &ferr);
    } else {
        ferr.code = CONCH_FS_FILE_NOT_FOUND;
        snprintf(ferr.message, sizeof(ferr.message),
                 "no output was spilled in this sandbox yet (" CONCH_SPILL_SHOWN_DIR
                 " holds the output of commands past max_output)");
    }
    if (res) {
        op->a.text = json_dumps(res, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(res);
    } else {
        op->a.error = json_pack("{s:s,s:s}", "code", conch_fs_errcode_name(ferr.code), "message",
                                ferr.message);
        if (ferr.param[0])
            json_object_set_new(op->a.error, "param", json_string(ferr.param));
        if (ferr.code == CONCH_FS_TOO_LARGE)
            json_object_set_new(op->a.error, "limit", json_integer(CONCH_FS_MAX_FILE));
    }
}

static void output_done(uv_work_t *req, int status)
{
    struct output_op *op = req->data;
    if (op->dirfd >= 0)
        close(op->dirfd);
    json_decref(op->params);
    conch_daemon_sandbox_release(op->sb);
    answer_done(&op->a.req, status); /* frees op */
}

/* fs.* on /run/conch/output: served on the host from the sandbox's spill dir (files the
 * daemon wrote, which the sandbox cannot change), by the same fs code, off the loop. */
void conch_daemon_fs_output_handle(struct sandbox *sb, struct conch_rpc_call *call, json_t *params,
                                   const char *method)
{
    static const char *const readers[] = {"read", "ls", "glob", "grep", "download"};
    bool reads = false;
    for (size_t i = 0; i < sizeof(readers) / sizeof(readers[0]); i++)
        reads |= !strcmp(method, readers[i]);
    if (!reads) {
        conch_rpc_call_failf(call, CONCH_RPC_PERMISSION_DENIED, "permission_denied", NULL,
                             CONCH_SPILL_SHOWN_DIR " is read-only (the daemon keeps commands' "
                                                   "spilled output there)");
        return;
    }
    struct output_op *op = calloc(1, sizeof(*op));
    if (!op) {
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "out of memory");
        return;
    }
    op->a.req.data = op;
    op->a.call = call;
    op->sb = sb;
    snprintf(op->method, sizeof(op->method), "%s", method);
    op->params = json_copy(params);
    json_object_del(op->params, "sandbox");
    op->dirfd = -1;
    if (sb->spill_dir[0]) {
        char rel[128];
        snprintf(rel, sizeof(rel), "sandboxes/%s/spill", sb->id);
        struct conch_err err = {0};
        op->dirfd = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, &err);
        if (op->dirfd < 0 && err.code != ENOENT) {
            json_decref(op->params);
            free(op);
            conch_rpc_call_fail_err(call, 0, NULL, &err);
            return;
        }
    }
    conch_daemon_sandbox_hold(sb);
    if (uv_queue_work(&sb->d->loop, &op->a.req, output_work, output_done) < 0) {
        output_work(&op->a.req);
        output_done(&op->a.req, 0);
    }
}
