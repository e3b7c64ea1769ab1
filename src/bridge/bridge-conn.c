/* bridge-conn.c - the tool bridge's connections from inside the sandbox: accepting them
 * (with the peer's pid namespace), reading their request lines within the budget, and
 * writing answers back to the callers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "bridge/bridge-internal.h"
#include "rpc/rpc.h"

/* ---- Writing to a caller ----------------------------------------------------------------- */

/* Answers a connection may leave unread before it is closed. */
#define CONN_OUTPUT_MAX (16u << 20)

struct write_req {
    uv_write_t req;
    struct conch_bridge *b; /* alive: a closing pipe cancels its writes before it closes */
    char *line;
    size_t len; /* charged to b->budget */
};

static void on_written(uv_write_t *req, int status)
{
    (void)status;
    struct write_req *w = (struct write_req *)req;
    conch_budget_uncharge(&w->b->budget, w->len);
    free(w->line);
    free(w);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    (void)status;
    conch_bridge__conn_close(req->data);
}

/* A caller that shut its side is closed once its calls are answered (and the answers sent:
 * uv_shutdown waits for the queued writes). */
static void conn_maybe_finish(struct conn *c)
{
    if (c->closing || c->shutting || !c->read_eof || c->calls || conch_bridge__conn_has_deferred(c))
        return;
    c->shutting = true;
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->pipe, on_shutdown) < 0)
        conch_bridge__conn_close(c);
}

/* Send @msg (taken over) to @c as one line. */
void conch_bridge__conn_send(struct conn *c, json_t *msg)
{
    if (!c || c->closing || !msg) {
        json_decref(msg);
        return;
    }
    if (c->local_answer) {
        c->local_answer(c->local_data, msg);
        return;
    }
    /* A caller that does not read its answers is cut off before they pile up here. */
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CONN_OUTPUT_MAX) {
        json_decref(msg);
        conch_bridge__conn_close(c);
        return;
    }
    char *line = conch_rpc_dumps(msg);
    json_decref(msg);
    struct write_req *w = line ? malloc(sizeof(*w)) : NULL;
    if (!w) {
        free(line);
        conch_bridge__conn_close(c);
        return;
    }
    w->b = c->b;
    w->line = line;
    w->len = strlen(line);
    uv_buf_t buf = uv_buf_init(line, (unsigned)w->len);
    /* The line is held until its write completes (a callback on a later turn of the loop),
     * whatever the kernel takes at once: charge it all. When it does not fit, only what the
     * kernel takes now may go: a short answer to a caller that reads still reaches it; a
     * caller that leaves answers unread is cut off. */
    if (conch_budget_charge(&c->b->budget, w->len, NULL) < 0) {
        bool sent = uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) == 0 &&
                    uv_try_write((uv_stream_t *)&c->pipe, &buf, 1) == (int)w->len;
        free(line);
        free(w);
        if (sent)
            conn_maybe_finish(c);
        else
            conch_bridge__conn_close(c);
        return;
    }
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_written) < 0) {
        conch_budget_uncharge(&c->b->budget, w->len);
        free(line);
        free(w);
        conch_bridge__conn_close(c);
        return;
    }
    conn_maybe_finish(c);
}

json_t *conch_bridge__error_msg(json_t *id, const char *kind, const char *message)
{
    return json_pack("{s:O,s:b,s:{s:s,s:s}}", "id", id ? id : json_null(), "ok", 0, "error", "kind",
                     kind, "message", message);
}

/* What the budget holds, for a message: each capped level, the sandbox's and the daemon's
 * ("sandbox sb-1: N bytes held of 64 MiB (conch serve --max-sandbox-held); ..."). */
void conch_bridge__budget_state(const struct conch_bridge *b, char *buf, size_t size)
{
    conch_budget_describe(&b->budget, buf, size);
}

/* Close @c for the budget, telling the caller why (@what: what did not fit) with a line the
 * kernel takes at once or not at all: nothing more may be held for it. */
static void conn_refuse(struct conn *c, const char *what)
{
    char state[256], msg[512];
    conch_bridge__budget_state(c->b, state, sizeof(state));
    snprintf(msg, sizeof(msg), "%s: %s; connection closed", what, state);
    json_t *m = conch_bridge__error_msg(NULL, "limit", msg);
    char *line = m ? conch_rpc_dumps(m) : NULL;
    json_decref(m);
    if (line && uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) == 0) {
        uv_buf_t buf = uv_buf_init(line, (unsigned)strlen(line));
        (void)uv_try_write((uv_stream_t *)&c->pipe, &buf, 1);
    }
    free(line);
    conch_bridge__conn_close(c);
}

/* ---- Request lines -------------------------------------------------------------------------- */

/* Answer a request that cannot be parsed within the budget, by its id (found in constant
 * memory). */
static void refuse_line(struct conn *c, const char *line, size_t len, uint64_t cost)
{
    struct conch_rpc_idscan ids = {0};
    conch_rpc_idscan_feed(&ids, line, len);
    char state[256], msg[512];
    conch_bridge__budget_state(c->b, state, sizeof(state));
    snprintf(msg, sizeof(msg), "a request of %zu bytes (about %llu parsed) does not fit: %s", len,
             (unsigned long long)cost, state);
    conch_bridge__conn_send(c,
                            conch_bridge__error_msg(ids.result == 1 ? ids.id : NULL, "limit", msg));
    conch_rpc_idscan_init(&ids);
}

static void handle_line(struct conn *c, const char *line, size_t len, uint64_t cost,
                        uint64_t *charged);

static void on_request_line(void *ctx, const char *line, size_t len)
{
    struct conn *c = ctx;
    if (c->closing || c->b->freeing)
        return;
    /* Parsing holds the whole request: charged while it lasts, so that no line makes the
     * daemon hold more than the budget, even for a moment. A call that keeps the request takes
     * this charge over (it was charged twice, so that a request using more than half of the
     * budget was refused though it fit); what is left of it is uncharged here. */
    struct conch_bridge *b = c->b;
    uint64_t cost = conch_rpc_json_cost(line, len);
    if (conch_budget_charge(&b->budget, cost, NULL) < 0) {
        refuse_line(c, line, len, cost);
        return;
    }
    uint64_t charged = cost;
    handle_line(c, line, len, cost, &charged);
    conch_budget_uncharge(&b->budget, charged);
}

static void handle_request(struct conn *c, json_t *req, size_t len, uint64_t cost,
                           uint64_t *charged);

static void handle_line(struct conn *c, const char *line, size_t len, uint64_t cost,
                        uint64_t *charged)
{
    json_error_t jerr;
    json_t *req = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(req)) {
        char msg[300];
        snprintf(msg, sizeof(msg), "not a JSON object: %s", req ? "another value" : jerr.text);
        conch_bridge__conn_send(c, conch_bridge__error_msg(NULL, "invalid_request", msg));
        json_decref(req);
        return;
    }
    handle_request(c, req, len, cost, charged);
    json_decref(req);
}

/* A request @req (an object; borrowed) of a line of @len bytes. */
static void handle_request(struct conn *c, json_t *req, size_t len, uint64_t cost,
                           uint64_t *charged)
{
    json_t *id = json_object_get(req, "id");
    const char *op = json_string_value(json_object_get(req, "op"));
    if (!id || !(json_is_string(id) || json_is_integer(id))) {
        conch_bridge__conn_send(
            c, conch_bridge__error_msg(NULL, "invalid_request",
                                       "a request needs an \"id\" (string or integer)"));
    } else if (!op) {
        conch_bridge__conn_send(
            c, conch_bridge__error_msg(id, "invalid_request", "a request needs a string \"op\""));
    } else if (!strcmp(op, "call") || !strcmp(op, "spawn")) {
        if (conch_bridge__origin_of(c) || c->closing || c->b->freeing ||
            !conch_bridge__defer_call(c, req, len, cost, charged))
            conch_bridge__start_call(c, req, id, !strcmp(op, "spawn"), len, cost, charged);
    } else if (!strcmp(op, "list")) {
        conch_bridge__conn_send(c, json_pack("{s:O,s:b,s:o}", "id", id, "ok", 1, "result",
                                             conch_bridge__list_json(c->b, false)));
    } else {
        char msg[160];
        snprintf(msg, sizeof(msg), "unknown op '%.60s' (ops: call, spawn, list)", op);
        conch_bridge__conn_send(c, conch_bridge__error_msg(id, "invalid_request", msg));
    }
}

static void on_request_oversize(void *ctx)
{
    struct conn *c = ctx;
    json_t *id = conch_rpc_framer_oversize_id(&c->framer); /* borrowed */
    char msg[128];
    snprintf(msg, sizeof(msg), "a request is larger than the limit of %zu bytes",
             c->b->lim.max_payload);
    conch_bridge__conn_send(c, conch_bridge__error_msg(id, "too_large", msg));
}

/* ---- Connections ---------------------------------------------------------------------------- */

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct conch_bridge *b = c->b;
    conch_rpc_framer_done(&c->framer);
    if (c->charged)
        conch_budget_uncharge(&b->budget, sizeof(*c));
    free(c);
    b->handles--;
    conch_bridge__maybe_free(b);
}

void conch_bridge__conn_close(struct conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    struct conch_bridge *b = c->b;
    /* Its calls lose their caller: nobody reads the answer now. Each failure may re-enter
     * (a $/cancel that disconnects a client): scan again from the start after each. */
    for (struct conch_list *n = b->calls.next; n != &b->calls;) {
        struct conch_bridge_call *call = conch_list_entry(n, struct conch_bridge_call, link);
        if (call->conn != c) {
            n = n->next;
            continue;
        }
        c->calls--;
        call->conn = NULL;
        conch_bridge__call_fail(call, "cancelled", "the caller went away", "the caller went away");
        n = b->calls.next;
    }
    for (struct conch_list *n = b->deferred.next, *next; n != &b->deferred; n = next) {
        next = n->next;
        struct deferred *d = conch_list_entry(n, struct deferred, link);
        if (d->c == c)
            conch_bridge__deferred_free(b, d);
    }
    conch_list_del(&c->link);
    b->n_conns--;
    uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    static char chunk[64 * 1024];
    (void)suggested;
    *buf = uv_buf_init(chunk, sizeof(chunk));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (n == UV_EOF && !c->closing) {
        /* Half-closed (nc -N, a here-string): its calls still get their answers. */
        c->read_eof = true;
        uv_read_stop(s);
        conn_maybe_finish(c);
        return;
    }
    if (n < 0) {
        conch_bridge__conn_close(c);
        return;
    }
    int r = n > 0 ? conch_rpc_framer_feed(&c->framer, buf->base, (size_t)n, on_request_line,
                                          on_request_oversize, c)
                  : 0;
    if (r == -ENOBUFS)
        conn_refuse(c, "a request line being read does not fit");
    else if (r < 0)
        conch_bridge__conn_close(c);
}

/* The pid namespace of the process at the other end of @fd. */
static bool peer_pidns(int fd, uint64_t *ret)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || cred.pid <= 0)
        return false;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", (int)cred.pid);
    struct stat st;
    if (stat(path, &st) < 0)
        return false;
    *ret = st.st_ino;
    return true;
}

void conch_bridge__on_connection(uv_stream_t *server, int status)
{
    struct conch_bridge *b = server->data;
    if (status < 0 || b->freeing)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->b = b;
    CONCH_LIST_INIT(&c->link);
    uv_pipe_init(b->loop, &c->pipe, 0);
    c->pipe.data = c;
    b->handles++;
    if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
        c->closing = true;
        c->pipe.data = c;
        conch_rpc_framer_init(&c->framer, b->lim.max_payload);
        uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
        return;
    }
    conch_rpc_framer_init(&c->framer, b->lim.max_payload);
    conch_rpc_framer_set_budget(&c->framer, &b->budget);
    conch_list_add(&b->conns, &c->link);
    b->n_conns++;
    if (b->refusing) {
        conch_bridge__conn_close(c);
        return;
    }
    c->charged = conch_budget_charge(&b->budget, sizeof(*c), NULL) == 0;
    if (!c->charged) {
        conn_refuse(c, "a new connection does not fit");
        return;
    }
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0)
        c->have_pidns = peer_pidns(fd, &c->pidns);
    if (b->n_conns > b->lim.max_conns) {
        conch_bridge__conn_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* ---- Callers with no socket ------------------------------------------------------------ */

/* An origin no socket's peer can match: pid namespace inodes are 32-bit. */
#define LOCAL_PIDNS UINT64_MAX

int conch_bridge_local_open(struct conch_bridge *b, const char *kind, const char *id,
                            void (*answer)(void *data, json_t *msg), void *data,
                            struct conch_bridge_local **ret, struct conch_err *err)
{
    struct conch_bridge_local *l = calloc(1, sizeof(*l));
    if (!l)
        return conch_err_set(err, ENOMEM, "out of memory");
    struct conn *c = &l->conn;
    c->b = b;
    c->local_answer = answer;
    c->local_data = data;
    snprintf(c->local_kind, sizeof(c->local_kind), "%s", kind);
    snprintf(c->local_id, sizeof(c->local_id), "%s", id);
    if (conch_bridge__origin_find(b, c->local_kind, c->local_id) ||
        conch_bridge_origin_begin(b, c->local_kind, c->local_id, LOCAL_PIDNS) < 0) {
        free(l);
        return conch_err_set(err, EBUSY, "tool bridge: origin %s %s cannot begin", kind, id);
    }
    conch_list_add(&b->locals, &c->link);
    *ret = l;
    return 0;
}

void conch_bridge_local_line(struct conch_bridge_local *l, const char *line, size_t len)
{
    struct conn *c = &l->conn;
    if (!c->b || c->closing)
        return;
    on_request_line(c, line, len);
}

void conch_bridge_local_request(struct conch_bridge_local *l, json_t *req, const char *text,
                                size_t len)
{
    struct conn *c = &l->conn;
    if (!c->b || c->closing || c->b->freeing)
        return;
    /* Charged as on_request_line charges a line. */
    struct conch_bridge *b = c->b;
    uint64_t cost = conch_rpc_json_cost(text, len);
    if (conch_budget_charge(&b->budget, cost, NULL) < 0) {
        char state[256], msg[512];
        conch_bridge__budget_state(b, state, sizeof(state));
        snprintf(msg, sizeof(msg), "a request of %zu bytes (about %llu parsed) does not fit: %s",
                 len, (unsigned long long)cost, state);
        json_t *id = json_object_get(req, "id");
        conch_bridge__conn_send(
            c, conch_bridge__error_msg(json_is_string(id) || json_is_integer(id) ? id : NULL,
                                       "limit", msg));
        return;
    }
    uint64_t charged = cost;
    if (json_is_object(req))
        handle_request(c, req, len, cost, &charged);
    else
        conch_bridge__conn_send(c, conch_bridge__error_msg(NULL, "invalid_request",
                                                           "not a JSON object: another value"));
    conch_budget_uncharge(&b->budget, charged);
}

void conch_bridge_local_close(struct conch_bridge_local *l, struct conch_bridge_report *ret)
{
    if (ret)
        memset(ret, 0, sizeof(*ret));
    if (!l)
        return;
    struct conn *c = &l->conn;
    struct conch_bridge *b = c->b;
    c->closing = true; /* nothing more reaches its host */
    if (b) {
        struct conch_bridge_report r;
        /* Its calls still in flight fail (cancelled: the owner gets $/cancel). */
        conch_bridge_origin_end(b, c->local_kind, c->local_id, &r);
        conch_list_del(&c->link);
        if (ret)
            *ret = r;
        else
            conch_bridge_report_done(&r);
    }
    free(l);
}
