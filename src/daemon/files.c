/* files.c - fs.* requests, executed inside the sandbox by a fenced worker the warden forks
 * (daemon_file_handler runs there), and workspace.* on the host side from the overlay's
 * upper dir on disk. */
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

/* How long a file request may take inside the sandbox (fs.grep over a big tree...). */
#define FILE_TIMEOUT_MS (120 * 1000)
#include "exec/result.h"
#include "fs/fs.h"
#include "workspace/workspace.h"

#define MAX_FILE_RESPONSE (64u << 20)

/* ---- inside the sandbox ---- */

int daemon_file_handler(int req_fd, int resp_fd)
{
    struct stat st;
    if (fstat(req_fd, &st) < 0 || st.st_size <= 0 || st.st_size > (256 << 20))
        return 1;
    char *buf = malloc((size_t)st.st_size);
    if (!buf || pread(req_fd, buf, (size_t)st.st_size, 0) != st.st_size)
        return 1;
    json_error_t jerr;
    json_t *req = json_loadb(buf, (size_t)st.st_size, JSON_ALLOW_NUL, &jerr);
    free(buf);
    const char *method = json_string_value(json_object_get(req, "method"));
    json_t *params = json_object_get(req, "params");
    if (!method || !json_is_object(params))
        return 1;
    int root = open("/workspace", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct conch_fs_error ferr;
    memset(&ferr, 0, sizeof(ferr));
    json_t *res = root >= 0 ? conch_fs_call(root, "/workspace", method, params, &ferr) : NULL;
    json_t *resp;
    if (res) {
        resp = json_pack("{s:o}", "result", res);
    } else {
        if (root < 0) {
            ferr.code = CONCH_FS_IO_ERROR;
            snprintf(ferr.message, sizeof(ferr.message), "open /workspace: %s", strerror(errno));
        }
        json_t *e = json_pack("{s:s,s:s}", "code", conch_fs_errcode_name(ferr.code), "message",
                              ferr.message);
        if (ferr.param[0])
            json_object_set_new(e, "param", json_string(ferr.param));
        if (ferr.code == CONCH_FS_AMBIGUOUS_MATCH || ferr.code == CONCH_FS_STRING_NOT_FOUND)
            json_object_set_new(e, "occurrences", json_integer(ferr.occurrences));
        if (ferr.code == CONCH_FS_TOO_LARGE)
            json_object_set_new(e, "limit", json_integer(CONCH_FS_MAX_FILE));
        resp = json_pack("{s:o}", "error", e);
    }
    char *text = json_dumps(resp, JSON_COMPACT | JSON_ALLOW_NUL);
    json_decref(resp);
    json_decref(req);
    int r = text ? conch_write_all(resp_fd, text, strlen(text)) : -ENOMEM;
    free(text);
    return r < 0 ? 1 : 0;
}

/* ---- the daemon side of fs.* ---- */

static void file_req_free(struct file_req *fr)
{
    free(fr->buf);
    free(fr);
}

static void on_file_pipe_closed(uv_handle_t *h)
{
    file_req_free(h->data);
}

static void file_req_close(struct file_req *fr)
{
    dlist_del(&fr->link);
    if (!fr->closed) {
        fr->closed = true;
        uv_read_stop((uv_stream_t *)&fr->pipe);
        uv_close((uv_handle_t *)&fr->pipe, on_file_pipe_closed);
    }
}

void file_req_abort(struct file_req *fr)
{
    if (fr->call)
        conch_rpc_call_failf(fr->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "the file request could not complete: the sandbox stopped");
    fr->call = NULL;
    file_req_close(fr);
}

static void file_req_done(struct file_req *fr)
{
    json_error_t jerr;
    json_t *resp = fr->len ? json_loadb(fr->buf, fr->len, JSON_ALLOW_NUL, &jerr) : NULL;
    json_t *res = json_object_get(resp, "result");
    json_t *e = json_object_get(resp, "error");
    if (res) {
        conch_rpc_call_reply(fr->call, json_incref(res));
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
        conch_rpc_call_fail(fr->call, rc, code ? code : "internal_error", msg ? msg : "failed",
                            extra);
    } else {
        conch_rpc_call_fail(fr->call, CONCH_RPC_INTERNAL_ERROR, "internal_error",
                            "the file worker in the sandbox gave no answer (it crashed or was "
                            "killed)",
                            NULL);
    }
    fr->call = NULL;
    json_decref(resp);
    file_req_close(fr);
}

static void on_file_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct file_req *fr = h->data;
    (void)suggested;
    if (fr->cap - fr->len < 65536) {
        size_t cap = fr->cap ? fr->cap * 2 : 131072;
        char *nb = realloc(fr->buf, cap);
        if (!nb) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        fr->buf = nb;
        fr->cap = cap;
    }
    *buf = uv_buf_init(fr->buf + fr->len, (unsigned)(fr->cap - fr->len));
}

static void on_file_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct file_req *fr = s->data;
    (void)buf;
    if (n > 0) {
        fr->len += (size_t)n;
        if (fr->len > MAX_FILE_RESPONSE) {
            conch_rpc_call_failf(fr->call, CONCH_RPC_TOO_LARGE, "too_large", NULL,
                                 "the answer is larger than %u bytes", MAX_FILE_RESPONSE);
            fr->call = NULL;
            file_req_close(fr);
        }
        return;
    }
    if (n < 0)
        file_req_done(fr);
}

void handle_fs(struct conch_rpc_call *call, json_t *params, void *ctx, const char *method)
{
    struct client *c = ctx;
    struct sandbox *sb = sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return;
    sandbox_touch(sb);
    json_t *p = json_copy(params);
    json_object_del(p, "sandbox");
    json_t *req = json_pack("{s:s,s:o}", "method", method, "params", p);
    char *text = req ? json_dumps(req, JSON_COMPACT | JSON_ALLOW_NUL) : NULL;
    json_decref(req);
    int memfd = -1, pipefd[2] = {-1, -1};
    struct conch_err err = {0};
    struct file_req *fr = NULL;
    if (!text) {
        conch_err_set(&err, ENOMEM, "out of memory");
        goto fail;
    }
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
    fr->id = conch_super_next_id(&sb->super);
    /* The warden kills a worker that runs past this: a request never hangs forever. */
    if (conch_jail_send_file(&sb->jail, fr->id, memfd, pipefd[1], FILE_TIMEOUT_MS, &err) < 0)
        goto fail;
    close(memfd);
    close(pipefd[1]);
    free(text);
    fr->call = call;
    uv_pipe_init(&c->d->loop, &fr->pipe, 0);
    fr->pipe.data = fr;
    uv_pipe_open(&fr->pipe, pipefd[0]);
    dlist_add(&sb->files, &fr->link);
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
    conch_rpc_call_fail_err(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", &err);
}

/* ---- workspace.* on the host side ---- */

static void fail_ws(struct conch_rpc_call *call, const struct conch_err *err);

struct ws_fds {
    int upper, lower;
};

/* Open a sandbox's upper and host dirs; false after failing @call. A sandbox without an
 * overlay workspace has no changes: upper is then -1. */
static struct sandbox *ws_open(struct client *c, struct conch_rpc_call *call, json_t *params,
                               struct ws_fds *fds)
{
    fds->upper = fds->lower = -1;
    const char *id = conch_rpc_str(params, "sandbox", "");
    struct sandbox *sb = sandbox_find(c->d, id);
    if (!sb) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_NOT_FOUND, "sandbox_not_found", NULL,
                             "no sandbox '%s'", id);
        return NULL;
    }
    if (!sb->upper_dir[0])
        return sb;
    /* Beneath the state dir, never through a link: a swapped `upper` must make discard fail,
     * not empty whatever the link points to. */
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s/upper", sb->id);
    struct conch_err oerr = {0};
    fds->upper = conch_statedir_open(c->d->state_dir, rel, O_RDONLY | O_DIRECTORY, &oerr);
    if (fds->upper < 0 && oerr.code == ENOENT)
        return sb; /* nothing was ever written */
    if (fds->upper < 0) {
        conch_rpc_call_failf(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", NULL,
                             "open the workspace of sandbox '%s': %s", sb->id, oerr.msg);
        return NULL;
    }
    fds->lower = open(sb->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds->lower < 0) {
        int e = errno;
        close(fds->upper);
        fds->upper = -1;
        if (e == ENOENT)
            return sb;
        conch_rpc_call_failf(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", NULL,
                             "open the workspace of sandbox '%s': %s", sb->id, strerror(e));
        return NULL;
    }
    return sb;
}

static void ws_close(struct ws_fds *fds)
{
    if (fds->upper >= 0)
        close(fds->upper);
    if (fds->lower >= 0)
        close(fds->lower);
}

/* The "paths" param as a NULL-terminated array (borrowed strings), or NULL for all. */
static char **paths_param(struct conch_rpc_call *call, json_t *params, bool *ok)
{
    json_t *arr = json_object_get(params, "paths");
    *ok = true;
    if (!arr)
        return NULL;
    char **v = calloc(json_array_size(arr) + 1, sizeof(char *));
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

void handle_workspace_changes(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct ws_fds fds;
    struct sandbox *sb = ws_open(ctx, call, params, &fds);
    if (!sb)
        return;
    /* A page of the change list: "offset" (default 0), "limit" (default and most 10,000). */
    json_t *jo = json_object_get(params, "offset"), *jl = json_object_get(params, "limit");
    json_int_t off = jo ? json_integer_value(jo) : 0, lim = jl ? json_integer_value(jl) : 10000;
    if (off < 0 || lim < 1 || lim > 10000) {
        ws_close(&fds);
        conch_rpc_call_fail_param(call, off < 0 ? "offset" : "limit",
                                  off < 0 ? "offset must be 0 or more"
                                          : "limit must be between 1 and 10000");
        return;
    }
    struct conch_ws_changes ch = {0};
    struct conch_err err = {0};
    if (fds.upper >= 0 &&
        conch_ws_changes_scan_page(fds.upper, fds.lower, (size_t)off, (size_t)lim, &ch, &err) < 0) {
        ws_close(&fds);
        conch_rpc_call_fail_err(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", &err);
        return;
    }
    ws_close(&fds);
    json_t *res = json_object();
    conch_ws_changes_json_set(res, &ch, 0);
    if (ch.total > (size_t)off + ch.n)
        json_object_set_new(res, "next_offset", json_integer(off + (json_int_t)ch.n));
    conch_rpc_call_reply(call, res);
    conch_ws_changes_done(&ch);
}

void handle_workspace_diff(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    bool ok;
    _cleanup_free_ char **paths = paths_param(call, params, &ok);
    if (!ok)
        return;
    struct ws_fds fds;
    struct sandbox *sb = ws_open(ctx, call, params, &fds);
    if (!sb)
        return;
    struct conch_ws_changes ch = {0};
    struct conch_err err = {0};
    json_t *res = NULL;
    if (fds.upper < 0) {
        res = json_pack("{s:s,s:[]}", "diff", "", "files");
    } else if (conch_ws_changes_scan(fds.upper, fds.lower, &ch, &err) < 0 ||
               conch_ws_diff(fds.upper, fds.lower, &ch, paths, 4u << 20, 0, &res, &err) < 0) {
        res = NULL;
    }
    ws_close(&fds);
    conch_ws_changes_done(&ch);
    if (!res) {
        fail_ws(call, &err);
        return;
    }
    conch_rpc_call_reply(call, res);
}

static void fail_ws(struct conch_rpc_call *call, const struct conch_err *err)
{
    if (err->code == ENOENT)
        conch_rpc_call_fail_err(call, CONCH_RPC_FILE_NOT_FOUND, "file_not_found", err);
    else if (err->code == EINVAL)
        conch_rpc_call_fail_err(call, CONCH_RPC_INVALID_PATH, "invalid_path", err);
    else
        conch_rpc_call_fail_err(call, CONCH_RPC_INFRASTRUCTURE, "infrastructure", err);
}

static json_t *paths_json(const struct conch_ws_changes *ch)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < ch->n; i++)
        json_array_append_new(arr, conch_json_text(ch->items[i].path, strlen(ch->items[i].path)));
    return arr;
}

/* {"committed": [paths applied], "skipped": [{"path", "reason"}]} of a commit. */
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

/* What workspace.commit and workspace.discard start from. */
struct ws_sel {
    struct ws_fds fds;
    char **paths;                /* the "paths" param (borrowed strings), NULL for all */
    struct conch_ws_changes all; /* every change */
    struct conch_ws_changes sel; /* the changes at @paths */
};

static void ws_sel_done(struct ws_sel *w)
{
    ws_close(&w->fds);
    free(w->paths);
    conch_ws_changes_done(&w->all);
    conch_ws_changes_done(&w->sel);
}

/* Open the sandbox of @params, scan its changes and select those at "paths". Returns the
 * sandbox, or NULL once @call is answered: with an error, or with {@key: []} when the
 * sandbox has no overlay workspace. */
static struct sandbox *ws_select(struct conch_rpc_call *call, json_t *params, void *ctx,
                                 const char *key, struct ws_sel *w)
{
    memset(w, 0, sizeof(*w));
    w->fds.upper = w->fds.lower = -1;
    bool ok;
    w->paths = paths_param(call, params, &ok);
    if (!ok)
        return NULL;
    struct sandbox *sb = ws_open(ctx, call, params, &w->fds);
    if (sb && w->fds.upper < 0) {
        conch_rpc_call_reply(call, json_pack("{s:[]}", key));
        sb = NULL;
    }
    struct conch_err err = {0};
    if (sb && (conch_ws_changes_scan(w->fds.upper, w->fds.lower, &w->all, &err) < 0 ||
               conch_ws_changes_select(&w->all, w->paths, &w->sel, &err) < 0)) {
        fail_ws(call, &err);
        sb = NULL;
    }
    if (!sb)
        ws_sel_done(w);
    return sb;
}

void handle_workspace_commit(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct ws_sel w;
    struct sandbox *sb = ws_select(call, params, ctx, "committed", &w);
    if (!sb)
        return;
    /* What is applied: the selection and the new directories it needs. What is then taken
     * out of a stopped sandbox's upper dir: the selection only (a listed directory goes
     * with its whole tree, uncommitted siblings included). */
    struct conch_ws_changes todo = {0};
    struct conch_ws_commit_report rep = {0};
    struct conch_err err = {0};
    int r = conch_ws_changes_select(&w.sel, NULL, &todo, &err);
    if (r >= 0 && w.paths && (r = add_new_parents(&w.all, &todo)) < 0)
        conch_err_set(&err, -r, "out of memory");
    if (r >= 0) {
        struct conch_ws_commit_opts opts = {
            .new_uid = (uid_t)-1, .new_gid = (gid_t)-1, .max_bytes = sb->disk_bytes};
        r = conch_ws_commit(w.fds.upper, w.fds.lower, &todo, &opts, &rep, &err);
    }
    /* A running sandbox keeps its overlay: the committed entries in the upper dir now equal
     * the host's and no longer show as changes. A stopped one has no overlay mounted, so
     * its upper dir can be cleaned of them. */
    if (r >= 0 && sb->state == SB_STOPPED)
        conch_ws_upper_remove(w.fds.upper, w.fds.lower, &w.sel, NULL);
    if (r < 0)
        fail_ws(call, &err);
    else
        conch_rpc_call_reply(call, commit_json(&rep));
    conch_ws_commit_report_done(&rep);
    conch_ws_changes_done(&todo);
    ws_sel_done(&w);
}

void handle_workspace_discard(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct ws_sel w;
    struct sandbox *sb = ws_select(call, params, ctx, "discarded", &w);
    if (!sb)
        return;
    /* The upper dir may only change while no overlay uses it: the sandbox's processes are
     * stopped (and the warden waited for, so the overlay is gone), the changes dropped, and
     * the sandbox started again. */
    bool was_running = sb->state == SB_RUNNING;
    if (was_running) {
        sb->jail.sync_destroy = true;
        sandbox_stop(sb, "workspace.discard restarts the sandbox");
    }
    struct conch_err err = {0};
    int r = w.paths ? conch_ws_upper_remove(w.fds.upper, w.fds.lower, &w.sel, &err)
                    : conch_ws_upper_clear(w.fds.upper, &err);
    struct conch_err serr = {0};
    if (was_running && sandbox_start(sb, &serr) < 0 && r >= 0) {
        err = serr;
        r = -serr.code;
    }
    if (r < 0)
        fail_ws(call, &err);
    else
        conch_rpc_call_reply(call, json_pack("{s:o}", "discarded", paths_json(&w.sel)));
    ws_sel_done(&w);
}
