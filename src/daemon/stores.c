/* stores.c - named stores in the daemon (issue 18): a sandbox's store mounts materialised
 * before its warden starts (<state>/sandboxes/<id>/stores/<i>, bound at the target) and
 * written back in a worker after each of its commands; and the host-side methods store.list,
 * store.ls, store.read, store.write and store.delete, also served by workers. The stores
 * themselves (SQLite, one file per store under <state>/stores) are workspace/'s. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "core/utf8.h"
#include "daemon/daemon-internal.h"

static int mkdir_ok(const char *path, struct conch_err *err)
{
    if (mkdir(path, 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", path, strerror(errno));
    return 0;
}

/* Where @tenant's stores are ("": the owner's): <state>/stores, and for a tenant a directory
 * of its own, <state>/tenant-stores/<tenant> (made here), so that a tenant's store "mem" is
 * neither another tenant's nor the owner's "mem" (tenant names are [A-Za-z0-9_.-]). */
static int stores_dir(const struct daemon *d, const char *tenant, char *buf, size_t size,
                      struct conch_err *err)
{
    int n = tenant[0] ? snprintf(buf, size, "%s/tenant-stores", d->state_dir)
                      : snprintf(buf, size, "%s/stores", d->state_dir);
    if (n < 0 || (size_t)n >= size)
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if (!tenant[0])
        return 0;
    int r = mkdir_ok(buf, err);
    if (r < 0)
        return r;
    n = snprintf(buf + n, size - (size_t)n, "/%s", tenant);
    if (n < 0 || (size_t)n >= size)
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    return mkdir_ok(buf, err);
}

/* A tenant's stores count against its disk quota (@quota; 0: none): a new store @name of cap
 * @cap is refused (limit) when the caps of the stores in @dir, its tenant's, and it would
 * pass @quota. An existing store keeps its cap: 0. Reads the stores' databases: call it in
 * a worker or where the store is being made anyway. */
static int stores_room(const char *dir, const char *name, uint64_t cap, uint64_t quota,
                       struct conch_err *err)
{
    char path[PATH_MAX + 80];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s.db", dir, name);
    if (!quota || stat(path, &st) == 0)
        return 0;
    json_t *arr = NULL;
    int r = conch_store_list(dir, &arr, err);
    if (r < 0)
        return r;
    uint64_t sum = 0;
    size_t i;
    json_t *s;
    json_array_foreach(arr, i, s)
    {
        sum += (uint64_t)json_integer_value(json_object_get(s, "max_bytes"));
    }
    json_decref(arr);
    if (sum <= quota && cap <= quota - sum)
        return 0;
    return conch_err_setk(err, CONCH_ERR_LIMIT, EDQUOT,
                          "quota disk=%llu bytes: the caps of this tenant's stores add up to %llu "
                          "bytes, and a new store '%s' of %llu bytes does not fit (use one of "
                          "them, or give the mount a smaller size)",
                          (unsigned long long)quota, (unsigned long long)sum, name,
                          (unsigned long long)cap);
}

bool conch_daemon_stores_any(const struct sandbox *sb)
{
    for (unsigned i = 0; i < sb->n_mounts; i++)
        if (sb->mounts[i].type == CONCH_MOUNT_STORE)
            return true;
    return false;
}

int conch_daemon_stores_prepare(struct sandbox *sb, struct conch_err *err)
{
    if (!conch_daemon_stores_any(sb))
        return 0;
    struct daemon *d = sb->d;
    char db_dir[PATH_MAX], base[900], dir[1000];
    int r = stores_dir(d, sb->tenant, db_dir, sizeof(db_dir), err);
    if (r < 0)
        return r;
    int n = snprintf(base, sizeof(base), "%s/sandboxes/%s", d->state_dir, sb->id);
    if (n < 0 || (size_t)n >= sizeof(base))
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if ((r = mkdir_ok(db_dir, err)) < 0 || (r = mkdir_ok(base, err)) < 0)
        return r;
    /* The sandbox's directory goes with it (lifecycle.c removes it when one of these is set). */
    if (!sb->spill_dir[0] && !sb->upper_dir[0]) {
        snprintf(dir, sizeof(dir), "%s/spill", base);
        if ((r = mkdir_ok(dir, err)) < 0)
            return r;
        snprintf(sb->spill_dir, sizeof(sb->spill_dir), "%s", dir);
    }
    snprintf(dir, sizeof(dir), "%s/stores", base);
    if ((r = mkdir_ok(dir, err)) < 0)
        return r;
    for (unsigned i = 0; i < sb->n_mounts; i++) {
        struct conch_mount *m = &sb->mounts[i];
        if (m->type != CONCH_MOUNT_STORE)
            continue;
        snprintf(dir, sizeof(dir), "%s/stores/%u", base, i);
        if (!sb->store_views[i] && sb->tenant[0] &&
            (r = stores_room(db_dir, m->name, m->bytes ? m->bytes : CONCH_STORE_TOTAL_DEFAULT,
                             conch_daemon_tenant_disk_quota(d, sb->tenant), err)) < 0)
            return conch_err_wrap(err, "mount '%s'", m->target);
        if (!sb->store_views[i] && (r = conch_store_view_new(db_dir, m->name, m->bytes, dir, sb->id,
                                                             &sb->store_views[i], err)) < 0)
            return conch_err_wrap(err, "mount '%s'", m->target);
        snprintf(m->source, sizeof(m->source), "%s", dir);
        if ((r = conch_store_view_materialise(sb->store_views[i], err)) < 0)
            return conch_err_wrap(err, "mount '%s'", m->target);
    }
    return 0;
}

void conch_daemon_stores_free(struct sandbox *sb)
{
    for (unsigned i = 0; i < CONCH_SPEC_MOUNTS_MAX; i++) {
        conch_store_view_free(sb->store_views[i]);
        sb->store_views[i] = NULL;
    }
}

/* ---- others' views ----
 * A change written to a store is brought into the views other sandboxes have of it right
 * after (conch_store_view_pull), in the same worker, so that their next command sees it. At
 * most PEERS_MAX views are brought up to date so; the others see it after their own next
 * write-back. */
#define PEERS_MAX 32

struct peers {
    unsigned n;
    struct sandbox *sb[PEERS_MAX];
    struct conch_store_view *v[PEERS_MAX];
};

/* Collect (and hold) the views of @tenant's store @name but @except's. */
static void peers_collect(struct daemon *d, const char *tenant, const char *name,
                          const struct sandbox *except, struct peers *p)
{
    struct conch_list *pos;
    for (pos = d->sandboxes.next; pos != &d->sandboxes; pos = pos->next) {
        struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
        if (sb == except || sb->state == SB_GONE || sb->state == SB_STOPPING ||
            strcmp(sb->tenant, tenant))
            continue;
        for (unsigned i = 0; i < CONCH_SPEC_MOUNTS_MAX && p->n < PEERS_MAX; i++) {
            if (!sb->store_views[i] || strcmp(conch_store_view_name(sb->store_views[i]), name))
                continue;
            p->sb[p->n] = sb;
            p->v[p->n] = sb->store_views[i];
            conch_daemon_sandbox_hold(sb);
            p->n++;
        }
    }
}

/* In a worker: pull into each. */
static void peers_pull(struct peers *p)
{
    for (unsigned i = 0; i < p->n; i++) {
        struct conch_err err = {0};
        if (conch_store_view_pull(p->v[i], &err) < 0)
            log_warn("store '%s': bringing a change into sandbox %s's view: %s",
                     conch_store_view_name(p->v[i]), p->sb[i]->id, err.msg);
    }
}

static void peers_release(struct peers *p)
{
    for (unsigned i = 0; i < p->n; i++)
        conch_daemon_sandbox_release(p->sb[i]);
    p->n = 0;
}

/* ---- write-back after a command ---- */

struct store_sync {
    uv_work_t req;
    struct sandbox *sb;
    void (*done)(void *arg, json_t *report);
    void *arg;
    unsigned n;
    struct {
        struct conch_store_view *v;
        const char *target; /* the sandbox's mount's, which outlives the hold */
        struct conch_store_report rep;
        struct conch_err err;
        int rc;
    } one[CONCH_SPEC_MOUNTS_MAX];
    struct peers peers;
};

static void sync_work(uv_work_t *req)
{
    struct store_sync *s = req->data;
    for (unsigned i = 0; i < s->n; i++)
        s->one[i].rc = conch_store_view_sync(s->one[i].v, &s->one[i].rep, &s->one[i].err);
    peers_pull(&s->peers);
}

static void sync_done(uv_work_t *req, int status)
{
    struct store_sync *s = req->data;
    json_t *arr = json_array();
    for (unsigned i = 0; i < s->n; i++) {
        const struct conch_store_report *rep = &s->one[i].rep;
        json_t *o =
            json_pack("{s:s,s:s,s:i,s:i,s:i,s:i,s:i}", "name", conch_store_view_name(s->one[i].v),
                      "target", s->one[i].target, "written", rep->written, "deleted", rep->deleted,
                      "pulled", rep->pulled, "skipped", rep->skipped, "refused", rep->refused);
        if (rep->first_skipped[0])
            json_object_set_new(o, "first_skipped", json_string(rep->first_skipped));
        if (s->one[i].rc < 0 || status < 0) {
            json_object_set_new(
                o, "error",
                json_string(s->one[i].rc < 0 ? s->one[i].err.msg : "not run (shutdown)"));
            log_warn("sandbox %s: store '%s' at '%s': write-back failed: %s", s->sb->id,
                     conch_store_view_name(s->one[i].v), s->one[i].target, s->one[i].err.msg);
        }
        json_array_append_new(arr, o);
    }
    struct sandbox *sb = s->sb;
    peers_release(&s->peers);
    s->done(s->arg, arr);
    conch_daemon_sandbox_release(sb);
    free(s);
}

int conch_daemon_stores_sync(struct sandbox *sb, void (*done)(void *arg, json_t *report), void *arg)
{
    if (!conch_daemon_stores_any(sb))
        return 1;
    struct store_sync *s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    for (unsigned i = 0; i < sb->n_mounts; i++)
        if (sb->store_views[i]) {
            s->one[s->n].v = sb->store_views[i];
            s->one[s->n].target = sb->mounts[i].target;
            s->n++;
        }
    if (!s->n) {
        free(s);
        return 1;
    }
    s->sb = sb;
    s->done = done;
    s->arg = arg;
    s->req.data = s;
    for (unsigned i = 0; i < s->n; i++) {
        bool again = false; /* two mounts of one store: its peers once */
        for (unsigned k = 0; k < i; k++)
            again |=
                !strcmp(conch_store_view_name(s->one[k].v), conch_store_view_name(s->one[i].v));
        if (!again)
            peers_collect(sb->d, sb->tenant, conch_store_view_name(s->one[i].v), sb, &s->peers);
    }
    if (uv_queue_work(&sb->d->loop, &s->req, sync_work, sync_done) < 0) {
        peers_release(&s->peers);
        free(s);
        return -ENOMEM;
    }
    conch_daemon_sandbox_hold(sb);
    return 0;
}

/* ---- store.* on the host side ---- */

enum store_op_kind { OP_LIST, OP_LS, OP_READ, OP_WRITE, OP_DELETE };

struct store_op {
    uv_work_t req;
    struct daemon *d; /* counted in d->holds while queued: a daemon stopping waits for it */
    struct conch_rpc_call *call;
    enum store_op_kind kind;
    char dir[PATH_MAX];
    char store[CONCH_STORE_NAME_MAX + 1];
    char path[CONCH_STORE_PATH_MAX + 1];
    unsigned char *content; /* OP_WRITE: decoded, owned */
    size_t len;
    uint32_t mode;
    bool base64;    /* OP_READ: asked for base64 */
    uint64_t quota; /* OP_WRITE: the tenant's disk quota its stores' caps count against */
    json_t *result;
    struct conch_err err;
    int rc;
    struct peers peers; /* OP_WRITE, OP_DELETE: the views to bring the change into */
};

static json_t *read_result(char *buf, size_t len, json_t *meta, bool base64)
{
    bool text = !base64;
    for (size_t i = 0; text && i < len;) {
        if (!buf[i]) {
            text = false;
            break;
        }
        size_t n = conch_utf8_seq((const unsigned char *)buf + i, len - i);
        if (!n)
            text = false;
        i += n ? n : 1;
    }
    if (text) {
        json_object_set_new(meta, "content", json_stringn(buf, len));
        json_object_set_new(meta, "encoding", json_string("utf-8"));
    } else {
        size_t elen = 0;
        char *enc = conch_fs_base64_encode((const unsigned char *)buf, len, &elen);
        json_object_set_new(meta, "content", enc ? json_stringn(enc, elen) : json_null());
        json_object_set_new(meta, "encoding", json_string("base64"));
        free(enc);
    }
    return meta;
}

static void op_work(uv_work_t *req)
{
    struct store_op *o = req->data;
    if (o->kind == OP_LIST) {
        json_t *arr = NULL;
        if ((o->rc = conch_store_list(o->dir, &arr, &o->err)) >= 0)
            o->result = json_pack("{s:o}", "stores", arr);
        return;
    }
    struct conch_store *s = NULL;
    if (o->kind == OP_WRITE &&
        (o->rc = stores_room(o->dir, o->store, CONCH_STORE_TOTAL_DEFAULT, o->quota, &o->err)) < 0)
        return;
    o->rc = conch_store_open(o->dir, o->store, o->kind == OP_WRITE ? CONCH_STORE_TOTAL_DEFAULT : 0,
                             &s, &o->err);
    if (o->rc < 0)
        return;
    json_t *entries = NULL, *meta = NULL;
    _cleanup_free_ char *buf = NULL;
    size_t len = 0;
    switch (o->kind) {
    case OP_LS:
        if ((o->rc = conch_store_ls(s, o->path, &entries, &o->err)) >= 0)
            o->result = json_pack("{s:s,s:o}", "store", o->store, "entries", entries);
        break;
    case OP_READ:
        if ((o->rc = conch_store_read(s, o->path, &buf, &len, &meta, &o->err)) >= 0)
            o->result = read_result(buf, len, meta, o->base64);
        break;
    case OP_WRITE:
        if ((o->rc = conch_store_write(s, o->path, o->content, o->len, o->mode, "host", &o->err)) >=
            0)
            o->result = json_pack("{s:s,s:s,s:I}", "store", o->store, "path", o->path, "size",
                                  (json_int_t)o->len);
        break;
    case OP_DELETE:
        if ((o->rc = conch_store_delete(s, o->path, "host", &o->err)) >= 0)
            o->result = json_pack("{s:s,s:s}", "store", o->store, "path", o->path);
        break;
    case OP_LIST:
        break;
    }
    conch_store_close(s);
    if (o->rc >= 0)
        peers_pull(&o->peers);
}

static void op_done(uv_work_t *req, int status)
{
    struct store_op *o = req->data;
    o->d->holds--;
    if (status < 0 && o->rc >= 0) {
        o->rc = -ECANCELED;
        conch_err_set(&o->err, ECANCELED, "cancelled: the daemon is stopping");
    }
    if (o->rc >= 0) {
        conch_rpc_call_reply(o->call, o->result);
        o->result = NULL;
    } else if (o->err.code == ENOENT) {
        conch_rpc_call_fail_err(o->call, CONCH_RPC_FILE_NOT_FOUND, "file_not_found", &o->err);
    } else if (o->err.code == EISDIR) {
        conch_rpc_call_fail_err(o->call, CONCH_RPC_IS_DIRECTORY, "is_directory", &o->err);
    } else if (o->err.code == ENOTDIR) {
        conch_rpc_call_fail_err(o->call, CONCH_RPC_NOT_A_DIRECTORY, "not_a_directory", &o->err);
    } else {
        conch_rpc_call_fail_err(o->call, 0, NULL, &o->err);
    }
    peers_release(&o->peers);
    json_decref(o->result);
    free(o->content);
    free(o);
}

/* A string param without NUL bytes, or NULL (the call failed). */
static const char *str_param(struct conch_rpc_call *call, json_t *params, const char *key,
                             const char *def)
{
    json_t *v = json_object_get(params, key);
    if (!v)
        return def;
    if (strlen(json_string_value(v)) != json_string_length(v)) {
        conch_rpc_call_fail_param(call, key, "%s: a NUL byte", key);
        return NULL;
    }
    return json_string_value(v);
}

static void store_op_start(struct conch_rpc_call *call, json_t *params, void *ctx,
                           enum store_op_kind kind)
{
    struct client *c = ctx;
    struct store_op *o = calloc(1, sizeof(*o));
    if (!o) {
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "out of memory");
        return;
    }
    o->call = call;
    o->kind = kind;
    struct conch_err err = {0};
    const char *tenant = conch_daemon_tenant_viewer(c->d);
    o->quota = tenant[0] ? conch_daemon_tenant_disk_quota(c->d, tenant) : 0;
    if (stores_dir(c->d, tenant, o->dir, sizeof(o->dir), &err) < 0) {
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        goto gone;
    }
    if (kind != OP_LIST) {
        const char *store = str_param(call, params, "store", NULL);
        const char *path = str_param(call, params, "path", kind == OP_LS ? "" : NULL);
        if (!store || !path)
            goto gone;
        if (conch_store_name_check(store, &err) < 0) {
            conch_rpc_call_fail_param(call, "store", "%s", err.msg);
            goto gone;
        }
        char norm[CONCH_STORE_PATH_MAX];
        if (conch_store_path_normalize(path, norm, sizeof(norm), &err) < 0) {
            conch_rpc_call_fail_err(call, CONCH_RPC_INVALID_PATH, "invalid_path", &err);
            goto gone;
        }
        snprintf(o->store, sizeof(o->store), "%s", store);
        snprintf(o->path, sizeof(o->path), "%s", norm);
    }
    const char *enc = kind == OP_READ || kind == OP_WRITE
                          ? str_param(call, params, "encoding", kind == OP_READ ? "auto" : "utf-8")
                          : "";
    if (!enc)
        goto gone;
    bool b64 = !strcmp(enc, "base64");
    if ((kind == OP_READ || kind == OP_WRITE) && !b64 && strcmp(enc, "utf-8") &&
        strcmp(enc, "utf8") && !(kind == OP_READ && !strcmp(enc, "auto"))) {
        conch_rpc_call_fail_param(call, "encoding", "encoding: utf-8 or base64%s",
                                  kind == OP_READ ? " (default: utf-8 when it is text)" : "");
        goto gone;
    }
    o->base64 = b64;
    if (kind == OP_WRITE) {
        json_t *content = json_object_get(params, "content");
        const char *text = json_string_value(content);
        size_t tlen = json_string_length(content);
        if (b64) {
            int r = conch_fs_base64_decode(text, tlen, &o->content, &o->len);
            if (r < 0) {
                conch_rpc_call_fail_param(call, "content", "content: not valid base64");
                goto gone;
            }
        } else {
            o->content = malloc(tlen + 1);
            if (!o->content) {
                conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                                     "out of memory");
                goto gone;
            }
            memcpy(o->content, text, tlen);
            o->len = tlen;
        }
        o->mode = (uint32_t)conch_rpc_int(params, "mode", 0644);
    }
    o->req.data = o;
    if (kind == OP_WRITE || kind == OP_DELETE)
        peers_collect(c->d, tenant, o->store, NULL, &o->peers);
    if (uv_queue_work(&c->d->loop, &o->req, op_work, op_done) < 0) {
        peers_release(&o->peers);
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "cannot queue the store operation");
        goto gone;
    }
    o->d = c->d;
    c->d->holds++;
    return;
gone:
    free(o->content);
    free(o);
}

void conch_daemon_handle_store_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    store_op_start(call, params, ctx, OP_LIST);
}

void conch_daemon_handle_store_ls(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    store_op_start(call, params, ctx, OP_LS);
}

void conch_daemon_handle_store_read(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    store_op_start(call, params, ctx, OP_READ);
}

void conch_daemon_handle_store_write(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    store_op_start(call, params, ctx, OP_WRITE);
}

void conch_daemon_handle_store_delete(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    store_op_start(call, params, ctx, OP_DELETE);
}
