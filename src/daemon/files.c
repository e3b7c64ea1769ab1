/* files.c - fs.* requests, routed to a fenced worker the warden forks inside the sandbox
 * (conch_fs_worker_run of src/fs/fs-worker.c runs there) and its answer read (within the
 * sandbox's budget) for file-answers.c to check and send back, and workspace.* on the host
 * side from the overlay's upper dir on disk. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/statedir.h"
#include "exec/result.h"
#include "fs/fs.h"
#include "workspace/workspace.h"

/* ---- the daemon side of fs.* ---- */

static void file_req_free(struct file_req *fr)
{
    free(fr->buf);
    free(fr);
}

static void on_file_pipe_closed(uv_handle_t *h)
{
    struct file_req *fr = h->data;
    fr->pipe_closed = true;
    if (!conch_proc_live(&fr->proc))
        file_req_free(fr);
}

static void file_req_close(struct file_req *fr)
{
    /* The buffer goes now (reading stops below), and its charge with it: the sandbox may be
     * freed before the pipe's close completes. */
    free(fr->buf);
    fr->buf = NULL;
    conch_budget_uncharge(&fr->sb->held, fr->charged);
    fr->len = fr->cap = 0;
    fr->charged = 0;
    /* A copy_in's room counts as used until the measurement that follows it says what it
     * took: a copy asked for right after it finds the sandbox no emptier than it is. */
    fr->sb->disk_charged += fr->reserve;
    fr->sb->copied_total += fr->reserve;
    fr->reserve = 0;
    if (!fr->closed) {
        conch_list_del(&fr->link);
        fr->closed = true;
        uv_read_stop((uv_stream_t *)&fr->pipe);
        uv_close((uv_handle_t *)&fr->pipe, on_file_pipe_closed);
    }
}

void conch_daemon_file_req_abort(struct file_req *fr)
{
    if (fr->call)
        conch_rpc_call_failf(fr->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "the file request could not complete: the sandbox stopped");
    fr->call = NULL;
    file_req_close(fr);
}

/* The pipe's EOF: the answer is whole. An empty one means the worker died without
 * answering: its final event (which follows as soon as the warden reaps it) says why. */
static void file_req_done(struct file_req *fr)
{
    if (fr->len == 0) {
        file_req_close(fr); /* the call stays, for file_ended */
        if (!conch_proc_live(&fr->proc)) {
            conch_daemon_file_fail_ended(fr->call, &fr->end);
            fr->call = NULL;
        }
        return;
    }
    struct conch_rpc_call *call = fr->call;
    char *buf = fr->buf;
    size_t len = fr->len;
    uint64_t charged = fr->charged; /* goes with the buffer */
    fr->call = NULL;
    fr->buf = NULL;
    fr->len = fr->cap = 0;
    fr->charged = 0;
    file_req_close(fr);
    conch_daemon_file_answer_queue(fr->sb, call, buf, len, charged, fr->measure, fr->frees);
}

/* The worker's final event. Before the answer was whole (it could not start, it was killed,
 * the sandbox stopped), the request fails with the reason; else its answer went already. */
static void file_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct file_req *fr = p->data;
    fr->end = *end;
    if (fr->call && (fr->closed || end->start_failed || end->lost)) {
        conch_daemon_file_fail_ended(fr->call, end);
        fr->call = NULL;
    }
    /* Not closed: it exited and its pipe's EOF is on its way (file_req_done answers). A
     * start failure or a loss ends the request now. */
    if (!fr->closed && !fr->call)
        file_req_close(fr);
    else if (fr->pipe_closed)
        file_req_free(fr);
}

static const struct conch_proc_ops file_ops = {.ended = file_ended};

/* Room the next read of an answer is given, charged ahead of it. */
#define FILE_READ_WINDOW (256u << 10)

static void on_file_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct file_req *fr = h->data;
    (void)suggested;
    if (fr->cap - fr->len < 65536) {
        /* Doubling, up to what the largest answer needs (one byte more shows it is larger). */
        size_t cap = fr->cap ? fr->cap * 2 : 131072;
        if (cap > CONCH_FILE_MAX_RESPONSE + 65536)
            cap = CONCH_FILE_MAX_RESPONSE + 65536;
        char *nb = cap > fr->cap ? realloc(fr->buf, cap) : NULL;
        if (!nb) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        fr->buf = nb;
        fr->cap = cap;
    }
    /* The answer comes from inside the sandbox: what is read of it is charged to the
     * sandbox's budget before it is read (the bytes so far and the room for the next read;
     * the buffer's doubling is address space until written). Past it, the request fails
     * (on_file_read). */
    uint64_t need = fr->len + FILE_READ_WINDOW < fr->cap ? fr->len + FILE_READ_WINDOW : fr->cap;
    struct conch_err err = {0};
    if (fr->charged < need) {
        if (conch_budget_charge(&fr->sb->held, need - fr->charged, &err) < 0) {
            if (!fr->over_budget)
                snprintf(fr->over_why, sizeof(fr->over_why), "%s", err.msg);
            fr->over_budget = true;
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        fr->charged = need;
    }
    *buf = uv_buf_init(fr->buf + fr->len, (unsigned)(fr->charged - fr->len));
}

static void on_file_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct file_req *fr = s->data;
    (void)buf;
    if (n < 0 && fr->over_budget) {
        /* Closing the pipe ends the worker (EPIPE, or the warden's deadline). */
        struct conch_err err = {0};
        char size[64];
        snprintf(err.msg, sizeof(err.msg), "%s", fr->over_why);
        snprintf(size, sizeof(size), "of more than %zu bytes", fr->len);
        conch_daemon_file_answer_refuse(fr->call, size, &err);
        fr->call = NULL;
        file_req_close(fr);
        return;
    }
    if (n > 0) {
        fr->len += (size_t)n;
        if (fr->len > CONCH_FILE_MAX_RESPONSE) {
            conch_rpc_call_failf(fr->call, CONCH_RPC_TOO_LARGE, "too_large", NULL,
                                 "the answer is larger than %u bytes", CONCH_FILE_MAX_RESPONSE);
            fr->call = NULL;
            file_req_close(fr);
        }
        return;
    }
    if (n < 0)
        file_req_done(fr);
}

void conch_daemon_file_fork(struct client *c, struct sandbox *sb, struct conch_rpc_call *call,
                            char *text, bool measure, bool frees, int data_fd, uint64_t reserve)
{
    int memfd = -1, pipefd[2] = {-1, -1};
    struct conch_err err = {0};
    struct file_req *fr = NULL;
    memfd = memfd_create("conch-file-req", MFD_CLOEXEC);
    if (memfd < 0 || conch_write_all(memfd, text, strlen(text)) < 0 ||
        pipe2(pipefd, O_CLOEXEC) < 0) {
        conch_err_set(&err, errno, "file request: %s", strerror(errno));
        goto fail;
    }
    fr = calloc(1, sizeof(*fr));
    if (!fr) {
        conch_err_set(&err, ENOMEM, "out of memory");
        goto fail;
    }
    fr->sb = sb;
    fr->measure = measure;
    fr->frees = frees;
    fr->copy = data_fd >= 0;
    fr->reserve = reserve;
    fr->proc.ops = &file_ops;
    fr->proc.data = fr;
    /* The warden kills a worker that runs past this: a request never hangs forever. */
    if (conch_super_file_data(&sb->super, &fr->proc, memfd, pipefd[1], data_fd,
                              CONCH_FILE_TIMEOUT_MS, &err) < 0)
        goto fail;
    close(memfd);
    close(pipefd[1]);
    free(text);
    fr->call = call;
    uv_pipe_init(&c->d->loop, &fr->pipe, 0);
    fr->pipe.data = fr;
    uv_pipe_open(&fr->pipe, pipefd[0]);
    conch_list_add(&sb->files, &fr->link);
    uv_read_start((uv_stream_t *)&fr->pipe, on_file_alloc, on_file_read);
    return;
fail:
    free(text);
    free(fr);
    if (memfd >= 0)
        close(memfd);
    for (int i = 0; i < 2; i++)
        if (pipefd[i] >= 0)
            close(pipefd[i]);
    conch_rpc_call_fail_err(call, 0, NULL, &err);
}

void conch_daemon_handle_fs(struct conch_rpc_call *call, json_t *params, void *ctx,
                            const char *method)
{
    struct client *c = ctx;
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return;
    conch_daemon_sandbox_touch(sb);
    int out = conch_daemon_fs_output_request(method, params);
    if (out != 0) {
        if (out > 0)
            conch_daemon_fs_output_handle(sb, call, params, method);
        else
            conch_rpc_call_failf(call, CONCH_RPC_INVALID_PATH, "invalid_path", NULL,
                                 "download " CONCH_SPILL_SHOWN_DIR " files on their own, not "
                                 "with other paths");
        return;
    }
    bool writes = !strcmp(method, "write") || !strcmp(method, "edit") || !strcmp(method, "upload");
    if (writes && conch_daemon_sandbox_disk_refuse(sb, call))
        return;
    bool frees = !strcmp(method, "delete");
    json_t *p = json_copy(params);
    json_object_del(p, "sandbox");
    json_t *req = json_pack("{s:s,s:o}", "method", method, "params", p);
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!text) {
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "out of memory");
        return;
    }
    /* A persistent worker when one is free (fileworkers.c); else one forked for it. */
    if (conch_daemon_file_pool_submit(sb, call, text, writes || frees, frees))
        return;
    conch_daemon_file_fork(c, sb, call, text, writes || frees, frees, -1, 0);
}

/* ---- workspace.* on the host side, in worker threads ---- */

/*
 * Scans, diffs and commits read every entry of the upper dir: seconds with hundreds of
 * thousands of files. They run in libuv's threadpool (uv_queue_work) and reply on the loop.
 * That is safe here: the work is fd-relative file I/O and new JSON objects (jansson's
 * refcounts are atomic), nothing forks from a worker, and wardens are cloned from the loop
 * thread by a child that never allocates. A sandbox's workspace requests run one at a time,
 * in order (a commit never races a discard), and hold the sandbox so that a destroy in the
 * meantime removes its directory only after them.
 */

enum ws_kind {
    WS_CHANGES,
    WS_DIFF,
    WS_COMMIT,
    WS_DISCARD,
    WS_SCAN,
    WS_SNAPSHOT,
    WS_RESTORE,
    WS_FORK
};

struct ws_op {
    uv_work_t req;
    struct conch_list link;      /* in sb->ws_ops until its turn */
    struct sandbox *sb;          /* held */
    struct conch_rpc_call *call; /* NULL for WS_SCAN */
    sandbox_changes_fn done;     /* WS_SCAN: called instead of answering a call */
    void *done_arg;
    struct conch_ws_changes changes; /* WS_SCAN's result */
    enum ws_kind kind;
    json_t *params; /* a reference: @paths borrow its strings */
    char **paths;   /* NULL for all */
    struct ws_fds fds;
    bool stopped;         /* commit: no overlay is mounted on the upper dir */
    size_t offset, limit; /* changes: the page */
    uint64_t max_bytes;   /* commit: the sandbox's disk limit (the size check) */
    /* Its path rules (their paths borrowed from the held sandbox, which never changes them):
     * changes beneath them are flagged, and commit skips them. */
    struct conch_ws_rule rules[CONCH_SPEC_RULES_MAX];
    size_t n_rules;
    /* A sandbox on snapshots: its frozen layers (top first) and its directory, where the
     * worker merges them with the upper into one temporary layer to compare with the host. */
    int layer_fds[CONCH_JAIL_MAX_LAYERS];
    int n_layer_fds;
    int sbdir;
    int live_upper;    /* the upper dir's fd while fds.upper is the merged layer's; -1 */
    const char *since; /* changes, diff: the snapshot (id or name; borrowed from @params) */
    int since_at;      /* its place in layer_fds */
    bool since_bad;    /* @err says why @since is not one of the sandbox's: invalid_params */
    int mount;         /* changes, diff, commit: the overlay mount's index ("mount"); -1: the
                        * workspace */
    /* results, written by the worker */
    json_t *res; /* loop-side results (discard) */
    char *text;  /* worker results, serialised there */
    struct conch_err err;
    int r;
};

/* @w takes @sb's path rules (on the loop). */
static void op_rules(struct ws_op *w, const struct sandbox *sb)
{
    w->n_rules = 0;
    for (unsigned i = 0; i < sb->n_rules && i < CONCH_SPEC_RULES_MAX; i++)
        w->rules[w->n_rules++] =
            (struct conch_ws_rule){sb->rules[i].path, sb->rules[i].kind == CONCH_RULE_HIDDEN};
}

/* The "paths" param as a NULL-terminated array (borrowed strings), or NULL for all. */
static char **paths_param(struct conch_rpc_call *call, json_t *params, bool *ok)
{
    json_t *arr = json_object_get(params, "paths");
    *ok = true;
    if (!arr)
        return NULL;
    char **v = calloc(json_array_size(arr) + 1, sizeof(char *));
    if (!v) {
        conch_rpc_call_fail(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", "out of memory",
                            NULL);
        *ok = false;
        return NULL;
    }
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e)
    {
        if (!json_is_string(e) || strlen(json_string_value(e)) != json_string_length(e)) {
            conch_rpc_call_fail_param(call, "paths", "paths must be strings without NUL bytes");
            free(v);
            *ok = false;
            return NULL;
        }
        v[i] = (char *)json_string_value(e);
    }
    return v;
}

static void fail_ws(struct conch_rpc_call *call, const struct conch_err *err)
{
    if (err->code == ENOENT)
        conch_rpc_call_fail_err(call, CONCH_RPC_FILE_NOT_FOUND, "file_not_found", err);
    else if (err->code == EINVAL)
        conch_rpc_call_fail_err(call, CONCH_RPC_INVALID_PATH, "invalid_path", err);
    else
        conch_rpc_call_fail_err(call, 0, NULL, err);
}

static json_t *paths_json(const struct conch_ws_changes *ch)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < ch->n; i++)
        json_array_append_new(arr, conch_json_text(ch->items[i].path, strlen(ch->items[i].path)));
    return arr;
}

/* What a commit applied and what its policy left out (sockets, FIFOs, devices...). */
static json_t *commit_json(const struct conch_ws_commit_report *rep)
{
    json_t *done = json_array(), *skipped = json_array();
    for (size_t i = 0; i < rep->n; i++) {
        const struct conch_ws_commit_entry *e = &rep->entries[i];
        json_t *p = conch_json_text(e->path, strlen(e->path));
        if (e->status == CONCH_WS_COMMIT_APPLIED)
            json_array_append_new(done, p);
        else if (e->status == CONCH_WS_COMMIT_SKIPPED)
            json_array_append_new(skipped, json_pack("{s:o,s:s}", "path", p, "reason", e->reason));
        else
            json_decref(p);
    }
    return json_pack("{s:o,s:o}", "committed", done, "skipped", skipped);
}

static int cmp_change(const void *a, const void *b)
{
    return strcmp(((const struct conch_ws_change *)a)->path,
                  ((const struct conch_ws_change *)b)->path);
}

static bool has_path(const struct conch_ws_changes *ch, const char *path, size_t len)
{
    for (size_t i = 0; i < ch->n; i++)
        if (strlen(ch->items[i].path) == len && !strncmp(ch->items[i].path, path, len))
            return true;
    return false;
}

/* A commit of "new/f" needs the added directory "new" on the host first: add to @sel every
 * added (or turned-into-a-directory) ancestor of its entries, from @all. */
static int add_new_parents(const struct conch_ws_changes *all, struct conch_ws_changes *sel)
{
    size_t n0 = sel->n;
    for (size_t i = 0; i < n0; i++) {
        const char *path = sel->items[i].path;
        for (const char *slash = strchr(path, '/'); slash; slash = strchr(slash + 1, '/')) {
            size_t len = (size_t)(slash - path);
            if (has_path(sel, path, len))
                continue;
            for (size_t k = 0; k < all->n; k++) {
                const struct conch_ws_change *a = &all->items[k];
                if (strlen(a->path) != len || strncmp(a->path, path, len) || a->type != 'd' ||
                    (a->kind != CONCH_CHANGE_ADDED && a->kind != CONCH_CHANGE_TYPE))
                    continue;
                struct conch_ws_change *items =
                    realloc(sel->items, (sel->n + 1) * sizeof(*sel->items));
                if (!items)
                    return -ENOMEM;
                sel->items = items;
                sel->items[sel->n] = *a;
                sel->items[sel->n].path = strndup(path, len);
                if (!sel->items[sel->n].path)
                    return -ENOMEM;
                sel->n++;
                break;
            }
        }
    }
    qsort(sel->items, sel->n, sizeof(*sel->items), cmp_change);
    return 0;
}

/* ---- the work itself (worker thread: no loop, no daemon state) ---- */

/* A page of the change list: [offset, offset + limit), with the total and next_offset. */
static void work_changes(struct ws_op *w)
{
    struct conch_ws_changes ch = {0};
    if (w->fds.upper < 0 ||
        (w->r = conch_ws_changes_scan_page(w->fds.upper, w->fds.lower, w->offset, w->limit, &ch,
                                           &w->err)) >= 0) {
        conch_ws_changes_mark_rules(&ch, w->rules, w->n_rules);
        w->res = json_object();
        conch_ws_changes_json_set(w->res, &ch, 0);
        if (ch.total > w->offset + ch.n)
            json_object_set_new(w->res, "next_offset",
                                json_integer((json_int_t)(w->offset + ch.n)));
    }
    conch_ws_changes_done(&ch);
}

static void work_diff(struct ws_op *w)
{
    struct conch_ws_changes ch = {0};
    if (w->fds.upper < 0) {
        w->res = json_pack("{s:s,s:[]}", "diff", "", "files");
    } else if ((w->r = conch_ws_changes_scan(w->fds.upper, w->fds.lower, &ch, &w->err)) >= 0) {
        conch_ws_changes_mark_rules(&ch, w->rules, w->n_rules);
        w->r =
            conch_ws_diff(w->fds.upper, w->fds.lower, &ch, w->paths, 4u << 20, 0, &w->res, &w->err);
        if (w->r < 0)
            w->res = NULL;
    }
    conch_ws_changes_done(&ch);
}

static void work_commit(struct ws_op *w)
{
    if (w->fds.upper < 0) {
        w->res = json_pack("{s:[]}", "committed");
        return;
    }
    struct conch_ws_changes all = {0}, sel = {0}, todo = {0};
    /* What is applied: the selection and the new directories it needs. What is then taken
     * out of a stopped sandbox's upper dir: the selection only (a listed directory goes
     * with its whole tree, uncommitted siblings included). */
    int r = conch_ws_changes_scan(w->fds.upper, w->fds.lower, &all, &w->err);
    if (r >= 0)
        r = conch_ws_changes_select(&all, w->paths, &sel, &w->err);
    if (r >= 0)
        r = conch_ws_changes_select(&sel, NULL, &todo, &w->err);
    if (r >= 0 && w->paths && (r = add_new_parents(&all, &todo)) < 0)
        conch_err_set(&w->err, -r, "out of memory");
    struct conch_ws_commit_report rep = {0};
    if (r >= 0) {
        struct conch_ws_commit_opts opts = {.new_uid = (uid_t)-1,
                                            .new_gid = (gid_t)-1,
                                            .max_bytes = w->max_bytes,
                                            .rules = w->rules,
                                            .n_rules = w->n_rules};
        r = conch_ws_commit(w->fds.upper, w->fds.lower, &todo, &opts, &rep, &w->err);
    }
    /* A running sandbox keeps its overlay: the committed entries in the upper dir now equal
     * the host's and no longer show as changes. A stopped one has no overlay mounted, so
     * its upper dir can be cleaned of them. */
    if (r >= 0 && w->stopped)
        conch_ws_upper_remove(w->fds.upper, w->fds.lower, &sel, NULL);
    if (r >= 0)
        w->res = commit_json(&rep);
    w->r = r;
    conch_ws_commit_report_done(&rep);
    conch_ws_changes_done(&todo);
    conch_ws_changes_done(&sel);
    conch_ws_changes_done(&all);
}

static void ws_work_kind(struct ws_op *w);

/* On snapshots, the sandbox's changes against the host are those of its frozen layers and its
 * upper together: merged into one temporary layer (hard links for the frozen files, copies
 * of the live upper's), read in place of the upper, removed after. */
static int merge_stack(struct ws_op *w)
{
    int dirs[CONCH_JAIL_MAX_LAYERS + 1];
    bool live[CONCH_JAIL_MAX_LAYERS + 1] = {false};
    int n = 0;
    if (w->fds.upper >= 0) {
        live[n] = true;
        dirs[n++] = w->fds.upper;
    }
    for (int i = 0; i < w->n_layer_fds; i++)
        dirs[n++] = w->layer_fds[i];
    int r = conch_ws_layers_merge(dirs, live, n, w->sbdir, "merged", &w->err);
    if (r < 0)
        return conch_err_wrap(&w->err, "sandbox '%s': its snapshots and changes", w->sb->id);
    int fd = openat(w->sbdir, "merged", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(&w->err, errno, "open the merged layer: %s", strerror(errno));
    w->live_upper = w->fds.upper;
    w->fds.upper = fd;
    return 0;
}

/* The changes since a snapshot: the scan and the diff read the layers above it (and the live
 * upper) merged, against the workspace as it was at the snapshot (workspace/since.c). */
static void since_work(struct ws_op *w)
{
    struct conch_ws_since since;
    w->r = conch_ws_since_prepare(w->fds.upper, w->layer_fds, w->n_layer_fds, w->since_at,
                                  w->fds.lower, w->sbdir, &since, &w->err);
    if (w->r < 0) {
        conch_err_wrap(&w->err, "sandbox '%s': changes since '%s'", w->sb->id, w->since);
        return;
    }
    struct ws_fds saved = w->fds;
    w->fds.upper = since.upper;
    w->fds.lower = since.lower;
    ws_work_kind(w);
    w->fds = saved;
    conch_ws_since_done(&since);
}

static void ws_work(uv_work_t *req)
{
    struct ws_op *w = req->data;
    if (w->since) {
        since_work(w);
    } else {
        if (w->n_layer_fds > 0 && (w->r = merge_stack(w)) < 0)
            return;
        ws_work_kind(w);
    }
    if (w->live_upper >= 0) {
        close(w->fds.upper);
        w->fds.upper = w->live_upper;
        w->live_upper = -1;
        conch_rm_at(w->sbdir, "merged", CONCH_RM_ONE_FS);
    }
    /* Serialising (and freeing) a result of 300,000 changes takes a second: here too. */
    if (w->res) {
        w->text = json_dumps(w->res, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(w->res);
        w->res = NULL;
        if (!w->text && w->r >= 0)
            w->r = conch_err_set(&w->err, ENOMEM, "out of memory serialising the result");
    }
}

static void ws_work_kind(struct ws_op *w)
{
    switch (w->kind) {
    case WS_CHANGES:
        work_changes(w);
        break;
    case WS_DIFF:
        work_diff(w);
        break;
    case WS_COMMIT:
        work_commit(w);
        break;
    case WS_SCAN:
        if (w->fds.upper >= 0)
            w->r = conch_ws_changes_scan_page(w->fds.upper, w->fds.lower, 0, CONCH_WS_CHANGES_MAX,
                                              &w->changes, &w->err);
        conch_ws_changes_mark_rules(&w->changes, w->rules, w->n_rules);
        break;
    case WS_DISCARD:
    case WS_SNAPSHOT:
    case WS_RESTORE:
    case WS_FORK:
        break;
    }
}

/* ---- the loop side ---- */

static void ws_next(struct sandbox *sb);

static void ws_op_free(struct ws_op *w)
{
    conch_daemon_ws_close(&w->fds);
    for (int i = 0; i < w->n_layer_fds; i++)
        close(w->layer_fds[i]);
    if (w->sbdir >= 0)
        close(w->sbdir);
    if (w->live_upper >= 0)
        close(w->live_upper);
    free(w->paths);
    json_decref(w->params);
    json_decref(w->res);
    free(w->text);
    conch_ws_changes_done(&w->changes);
    free(w);
}

/* Answer @w's call, free it, and start the sandbox's next request. */
static void ws_finish(struct ws_op *w)
{
    struct sandbox *sb = w->sb;
    if (w->done) {
        w->done(w->done_arg, w->r, &w->changes, &w->err);
    } else if (w->r < 0 && w->since_bad) {
        conch_rpc_call_fail_param(w->call, "since", "%s", w->err.msg);
    } else if (w->r < 0 && w->kind >= WS_SNAPSHOT) {
        conch_daemon_snapshot_fail(w->call, &w->err);
    } else if (w->r < 0) {
        fail_ws(w->call, &w->err);
    } else if (w->text) {
        conch_rpc_call_reply_dumped(w->call, w->text);
        w->text = NULL;
    } else if (!w->res) {
        conch_rpc_call_fail(w->call, CONCH_RPC_INTERNAL_ERROR, "internal_error",
                            "out of memory building the result", NULL);
    } else {
        conch_rpc_call_reply(w->call, json_incref(w->res));
    }
    ws_op_free(w);
    sb->ws_running = false;
    ws_next(sb);
    conch_daemon_sandbox_release(sb);
}

static void ws_after(uv_work_t *req, int status)
{
    struct ws_op *w = req->data;
    if (status < 0 && w->r >= 0)
        w->r =
            conch_err_set(&w->err, -status, "workspace request cancelled: %s", uv_strerror(status));
    ws_finish(w);
}

/* workspace.discard: the upper dir may only change while no overlay uses it: the sandbox's
 * processes are stopped (and the warden waited for, so the overlay is gone), the changes
 * dropped, and the sandbox started again. On the loop: it restarts the sandbox. */
static void run_discard(struct ws_op *w)
{
    struct sandbox *sb = w->sb;
    struct conch_ws_changes all = {0}, sel = {0};
    int r = w->fds.upper < 0 ? 0 : conch_ws_changes_scan(w->fds.upper, w->fds.lower, &all, &w->err);
    if (r >= 0 && w->fds.upper >= 0)
        r = conch_ws_changes_select(&all, w->paths, &sel, &w->err);
    if (r >= 0 && w->fds.upper >= 0) {
        bool was_running = sb->state == SB_READY;
        if (was_running) {
            conch_jail_set_sync_destroy(sb->jail, true);
            conch_daemon_sandbox_stop(sb, "workspace.discard restarts the sandbox");
        }
        r = w->paths ? conch_ws_upper_remove(w->fds.upper, w->fds.lower, &sel, &w->err)
                     : conch_ws_upper_clear(w->fds.upper, &w->err);
        struct conch_err serr = {0};
        if (was_running && conch_daemon_sandbox_start(sb, &serr) < 0 && r >= 0) {
            w->err = serr;
            r = -serr.code;
        }
    }
    w->r = r;
    if (r >= 0) {
        w->res = json_pack("{s:o}", "discarded", paths_json(&sel));
        sb->disk_over = false; /* room was made: measured again */
        sb->disk_charged = 0;
        conch_daemon_sandbox_measure(sb);
    }
    conch_ws_changes_done(&sel);
    conch_ws_changes_done(&all);
    ws_finish(w);
}

/* workspace.snapshot, workspace.restore, sandbox.fork {sandbox}: on the loop, like discard
 * (they stop and start the sandbox; the snapshot itself is a rename). */
static void run_snapshot(struct ws_op *w)
{
    conch_daemon_ws_close(&w->fds);
    if (w->kind == WS_SNAPSHOT)
        w->res = conch_daemon_snapshot_take(w->sb, w->params, &w->err);
    else if (w->kind == WS_RESTORE)
        w->res = conch_daemon_snapshot_restore(w->sb, w->params, &w->err);
    else
        w->res = conch_daemon_snapshot_fork(w->sb, w->params, &w->err);
    w->r = w->res ? 0 : -(w->err.code ? w->err.code : EIO);
    ws_finish(w);
}

/* The frozen layers @sb stands on, and its directory, for merge_stack. */
static int open_stack(struct sandbox *sb, struct ws_op *w, struct conch_err *err)
{
    _cleanup_free_ struct conch_jail_layer *layers = NULL;
    int n = 0;
    int r = conch_daemon_layer_stack(sb->d, sb->layer, &layers, &n, err);
    if (r < 0)
        return conch_err_wrap(err, "sandbox '%s'", sb->id);
    for (int i = 0; i < n; i++) {
        const char *slash = strrchr(layers[i].dir, '/');
        char rel[96];
        snprintf(rel, sizeof(rel), "layers/%s", slash ? slash + 1 : layers[i].dir);
        int fd = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, err);
        if (fd < 0)
            return fd;
        w->layer_fds[w->n_layer_fds++] = fd;
    }
    char rel[96];
    snprintf(rel, sizeof(rel), "sandboxes/%s", sb->id);
    w->sbdir = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, err);
    return w->sbdir < 0 ? w->sbdir : 0;
}

/* Hand @w (its fds open) to a worker thread. */
static void ws_queue(struct ws_op *w)
{
    w->req.data = w;
    int r = uv_queue_work(&w->sb->d->loop, &w->req, ws_work, ws_after);
    if (r < 0) {
        w->r = conch_err_set(&w->err, -r, "queue the workspace request: %s", uv_strerror(r));
        ws_finish(w);
    }
}

static void ws_next(struct sandbox *sb)
{
    if (sb->ws_running || conch_list_empty(&sb->ws_ops))
        return;
    struct ws_op *w = conch_list_entry(sb->ws_ops.next, struct ws_op, link);
    conch_list_del(&w->link);
    sb->ws_running = true;
    w->stopped = sb->state != SB_READY;
    if (w->mount >= 0) {
        /* An overlay mount: no snapshots, no path rules; its own upper against its host dir. */
        if ((w->r = conch_daemon_mount_open(sb, w->mount, &w->fds, &w->err)) < 0)
            ws_finish(w);
        else
            ws_queue(w);
        return;
    }
    w->r = conch_daemon_ws_open(sb, &w->fds, &w->err);
    if (w->r < 0) {
        ws_finish(w);
        return;
    }
    if (w->since) {
        /* Resolved now, not when queued: a restore queued before it changes the chain. */
        w->since_at =
            conch_daemon_snapshot_chain_at(sb->d, sb->id, sb->tenant, sb->layer, w->since, &w->err);
        w->since_bad = w->since_at < 0;
        if (w->since_at < 0) {
            w->r = w->since_at;
            ws_finish(w);
            return;
        }
    }
    if (sb->layer[0] && (w->kind == WS_CHANGES || w->kind == WS_DIFF || w->kind == WS_COMMIT) &&
        (w->r = open_stack(sb, w, &w->err)) < 0) {
        ws_finish(w);
        return;
    }
    if (w->since && w->since_at >= w->n_layer_fds) {
        w->r = conch_err_set(&w->err, ESTALE, "sandbox '%s': its chain changed", sb->id);
        ws_finish(w);
        return;
    }
    if (w->kind == WS_DISCARD) {
        run_discard(w);
        return;
    }
    if (w->kind >= WS_SNAPSHOT) {
        run_snapshot(w);
        return;
    }
    ws_queue(w);
}

void conch_daemon_ws_ops_cancel(struct sandbox *sb, const char *why)
{
    while (!conch_list_empty(&sb->ws_ops)) {
        struct ws_op *w = conch_list_entry(sb->ws_ops.next, struct ws_op, link);
        conch_list_del(&w->link);
        if (w->done) {
            conch_err_set(&w->err, ESHUTDOWN, "sandbox '%s': %s", sb->id, why);
            w->done(w->done_arg, -ESHUTDOWN, &w->changes, &w->err);
        } else {
            conch_rpc_call_failf(w->call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                                 "sandbox '%s': %s", sb->id, why);
        }
        ws_op_free(w);
        conch_daemon_sandbox_release(sb);
    }
}

/* Queue a workspace request of @kind for the sandbox named in @params. */
static void ws_submit(struct conch_rpc_call *call, json_t *params, void *ctx, enum ws_kind kind)
{
    struct client *c = ctx;
    bool ok = true;
    char **paths = kind == WS_CHANGES ? NULL : paths_param(call, params, &ok);
    if (!ok)
        return;
    /* workspace.changes pages: "offset" (default 0), "limit" (default and most 10,000). */
    json_t *jo = json_object_get(params, "offset"), *jl = json_object_get(params, "limit");
    json_int_t offset = jo ? json_integer_value(jo) : 0,
               limit = jl ? json_integer_value(jl) : 10000;
    if (kind == WS_CHANGES && (offset < 0 || limit < 1 || limit > 10000)) {
        conch_rpc_call_fail_param(call, offset < 0 ? "offset" : "limit",
                                  offset < 0 ? "offset must be 0 or more"
                                             : "limit must be between 1 and 10000");
        return;
    }
    /* changes, diff: "since" a snapshot of the sandbox's chain (resolved in its turn). */
    json_t *js = json_object_get(params, "since");
    const char *since = NULL;
    if (js && !json_is_null(js) && (kind == WS_CHANGES || kind == WS_DIFF)) {
        since = json_string_value(js);
        if (!since || !since[0] || strlen(since) > 127 || strlen(since) != json_string_length(js)) {
            free(paths);
            conch_rpc_call_fail_param(call, "since",
                                      "since must be a snapshot's id or name (a non-empty "
                                      "string of at most 127 bytes)");
            return;
        }
    }
    const char *id = conch_rpc_str(params, "sandbox", "");
    struct sandbox *sb = conch_daemon_sandbox_find(c->d, id);
    if (!sb) {
        free(paths);
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                             "no sandbox '%s'", id);
        return;
    }
    /* Its upper dir holds only the changes since its snapshot: taking some paths out of it
     * would show the snapshot's version there, not the host's. */
    if (kind == WS_DISCARD && paths && sb->layer[0]) {
        free(paths);
        conch_rpc_call_failf(call, CONCH_RPC_INVALID_PARAMS, "invalid_params", NULL,
                             "sandbox '%s' stands on snapshot '%s': some paths cannot be "
                             "discarded yet (a whole discard, or workspace.restore, returns it "
                             "to a snapshot)",
                             sb->id, sb->layer);
        return;
    }
    int mount = -1;
    json_t *jm = json_object_get(params, "mount");
    const char *mt = json_string_value(jm);
    if (mt && kind != WS_DISCARD) {
        /* A NUL inside would name another mount's target by its prefix. */
        mount = strlen(mt) == json_string_length(jm) ? conch_daemon_overlay_mount_find(sb, mt) : -1;
        if (mount < 0) {
            free(paths);
            conch_rpc_call_fail_param(call, "mount", "sandbox '%s' has no overlay mount at '%s'",
                                      sb->id, mt);
            return;
        }
        if (since) {
            free(paths);
            conch_rpc_call_fail_param(call, "since",
                                      "sandbox '%s': an overlay mount ('%s') has no snapshots: "
                                      "since does not apply",
                                      sb->id, mt);
            return;
        }
    }
    struct ws_op *w = calloc(1, sizeof(*w));
    if (!w) {
        free(paths);
        conch_rpc_call_fail(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", "out of memory",
                            NULL);
        return;
    }
    w->mount = mount;
    w->sb = sb;
    w->call = call;
    w->kind = kind;
    w->max_bytes = sb->disk_bytes;
    w->offset = (size_t)offset;
    w->limit = (size_t)limit;
    w->params = json_incref(params);
    w->paths = paths;
    w->since = since;
    w->fds.upper = w->fds.lower = -1;
    w->sbdir = w->live_upper = -1;
    if (mount < 0)
        op_rules(w, sb); /* the workspace's rules; an overlay mount has none */
    conch_daemon_sandbox_hold(sb);
    conch_list_add(&sb->ws_ops, &w->link);
    ws_next(sb);
}

int conch_daemon_sandbox_changes_async(struct sandbox *sb, sandbox_changes_fn done, void *arg)
{
    struct ws_op *w = calloc(1, sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->sb = sb;
    w->kind = WS_SCAN;
    w->done = done;
    w->done_arg = arg;
    w->mount = -1;
    w->fds.upper = w->fds.lower = -1;
    w->sbdir = w->live_upper = -1;
    op_rules(w, sb);
    conch_daemon_sandbox_hold(sb);
    conch_list_add(&sb->ws_ops, &w->link);
    ws_next(sb);
    return 0;
}

void conch_daemon_handle_workspace_changes(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ws_submit(call, params, ctx, WS_CHANGES);
}

void conch_daemon_handle_workspace_diff(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ws_submit(call, params, ctx, WS_DIFF);
}

void conch_daemon_handle_workspace_commit(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ws_submit(call, params, ctx, WS_COMMIT);
}

void conch_daemon_handle_workspace_discard(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    ws_submit(call, params, ctx, WS_DISCARD);
}

void conch_daemon_workspace_queue(struct conch_rpc_call *call, json_t *params, void *ctx,
                                  enum ws_queued kind)
{
    ws_submit(call, params, ctx,
              kind == WS_Q_SNAPSHOT  ? WS_SNAPSHOT
              : kind == WS_Q_RESTORE ? WS_RESTORE
                                     : WS_FORK);
}
