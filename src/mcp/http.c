/* http.c - the Streamable HTTP transport (MCP 2025-06-18) of `conch mcp --listen`, on
 * libwebsockets over TLS: POST /mcp carries one JSON-RPC message and gets its answer as
 * application/json; DELETE ends a session; GET is 405 (no server stream). Each MCP session
 * (session.c) has its own connection to the daemon, authenticated with `connection.auth` as
 * the tenant of the bearer token that opened it; the requests (struct req) and the sessions
 * (struct hsess) are here, the checks of a request's headers in http-check.c. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libwebsockets.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include "mcp/http-internal.h"
#include "mcp/mcp-internal.h"
#include "mcp/mcp.h"

#define SWEEP_US (1 * LWS_US_PER_SEC) /* how often idle sessions are looked for */
#define END_GRACE_S 30                /* the wait for sessions to end at shutdown */
#define CHUNK 16384                   /* bytes of a response written at a time */
/* Request bodies buffered at once, all connections together: 4 of the largest, 64 MiB at
 * least. */
#define MAX_BODIES(v) ((v)->h->max_body * 4 > (64u << 20) ? (v)->h->max_body * 4 : (64u << 20))
#define SANDBOX_GRACE_S 600 /* a session's sandbox idles this much longer than the session */
/* A request of no live session of its token (an initialize, or anyone's guess) is not known
 * to come from a tenant until the daemon says so, after its body: its body may be at most
 * UNTRUSTED_BODY_MAX, and all of them together a quarter of MAX_BODIES, so that clients
 * without a token cannot hold the bodies' budget (every request answered 503). */
#define UNTRUSTED_BODY_MAX (64u << 10)
#define UNTRUSTED_BODIES(v) (MAX_BODIES(v) / 4)

static volatile sig_atomic_t stop_signal, reload_signal;

static void on_stop_signal(int sig)
{
    stop_signal = sig;
}

static void on_reload_signal(int sig)
{
    (void)sig;
    reload_signal = 1;
}

/* SIGHUP: the certificate and key read again (a renewed pair), into the vhost's SSL_CTX, only
 * if both load and match (tried on a scratch SSL_CTX first); else the pair in use stays.
 * Connections already made go on with the one they began with. */
static void reload_cert(struct srv *v)
{
    const char *cert = v->h->tls_cert, *key = v->h->tls_key;
    SSL_CTX *t = SSL_CTX_new(TLS_server_method());
    bool ok = t && SSL_CTX_use_certificate_chain_file(t, cert) == 1 &&
              SSL_CTX_use_PrivateKey_file(t, key, SSL_FILETYPE_PEM) == 1 &&
              SSL_CTX_check_private_key(t) == 1;
    SSL_CTX_free(t);
    if (!ok || !v->ssl_ctx) {
        fprintf(stderr,
                "conch mcp: SIGHUP: '%s' and '%s' do not load as a certificate chain and its "
                "key: keeping the pair in use\n",
                cert, key);
        return;
    }
    if (SSL_CTX_use_certificate_chain_file(v->ssl_ctx, cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(v->ssl_ctx, key, SSL_FILETYPE_PEM) != 1)
        fprintf(stderr, "conch mcp: SIGHUP: the certificate changed while it was loaded: send "
                        "SIGHUP again\n");
    else
        fprintf(stderr, "conch mcp: SIGHUP: reloaded '%s' and '%s'\n", cert, key);
}

/* ---- responses ---- */

/* Answer @r with @status and @body (taken; NULL: empty) of type @ctype. */
static void respond(struct req *r, unsigned status, const char *ctype, char *body)
{
    if (r->answered) {
        free(body);
        return;
    }
    r->answered = true;
    r->status = status;
    r->ctype = ctype;
    r->resp = body;
    r->resp_len = body ? strlen(body) : 0;
    r->resp_off = 0;
    /* An answer given before the body (a refusal of its headers) waits for the body, read and
     * dropped, unless the connection closes after it: a client still sending would else
     * see the connection reset instead of the answer. */
    if (!r->body_pending || r->close_after)
        lws_callback_on_writable(r->wsi);
}

void conch_mcp_http_fail(struct req *r, unsigned status, int code, const char *msg)
{
    json_t *e = json_pack("{s:s,s:n,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", "error", "code", code,
                          "message", msg);
    respond(r, status, "application/json", e ? json_dumps(e, JSON_COMPACT) : NULL);
    json_decref(e);
}

/* ---- sessions ---- */

static void req_detach(struct req *r)
{
    struct hsess *s = r->sess;
    if (!s)
        return;
    for (struct req **p = &s->waiting; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    r->next = NULL;
    r->sess = NULL;
    json_decref(r->rpc_id);
    r->rpc_id = NULL;
    if (s->current == r)
        s->current = NULL;
    if (s->auth_req == r)
        s->auth_req = NULL;
}

static void req_attach(struct hsess *s, struct req *r)
{
    r->sess = s;
    r->next = s->waiting;
    s->waiting = r;
}

static void leave_authing(struct hsess *s)
{
    if (s->counted_authing) {
        s->counted_authing = false;
        s->srv->n_authing--;
    }
}

static void sess_unlist(struct hsess *s)
{
    struct srv *v = s->srv;
    for (struct hsess **p = &v->sessions; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            v->n_sessions--;
            break;
        }
    s->next = NULL;
}

/* Close the daemon connection: its wsi's close callback frees @s. */
static void sess_close_daemon(struct hsess *s)
{
    if (s->raw && !s->closing) {
        s->closing = true;
        lws_set_timeout(s->raw, PENDING_TIMEOUT_USER_OK, LWS_TO_KILL_ASYNC);
    }
}

/* End @s: it leaves the table (its id answers 404 from now on), the requests awaiting its
 * answers get 404, and its sandbox is destroyed before the daemon connection closes. */
static void sess_end(struct hsess *s, const char *why)
{
    if (s->state == SESS_ENDING)
        return;
    if (s->state == SESS_LIVE) {
        sess_unlist(s);
        fprintf(stderr, "conch mcp: session %.8s... (tenant %s) ended: %s\n", s->id, s->tenant,
                why);
    }
    s->state = SESS_ENDING;
    leave_authing(s);
    while (s->waiting) {
        struct req *r = s->waiting;
        req_detach(r);
        conch_mcp_http_fail(r, 404, -32001, CONCH_MCP_NO_SESSION);
    }
    conch_mcp_session_end_async(s->m);
    if (conch_mcp_session_done(s->m))
        sess_close_daemon(s);
}

static struct hsess *find_session(struct srv *v, const char *id)
{
    for (struct hsess *s = v->sessions; s; s = s->next)
        if (strlen(s->id) == strlen(id) && !CRYPTO_memcmp(s->id, id, strlen(id)))
            return s;
    return NULL;
}

/* The session's messages for the client: each goes to the request that awaits its id (or,
 * for an error with a null id, to the request being handled). */
static void to_client(void *ctx, json_t *msg)
{
    struct hsess *s = ctx;
    json_t *id = json_object_get(msg, "id");
    struct req *r = NULL;
    if (s->state == SESS_AUTHING) { /* the daemon is gone before connection.auth's answer */
        r = s->auth_req;
        json_decref(msg);
        if (r) {
            req_detach(r);
            conch_mcp_http_fail(r, 503, -32603, "conch's daemon is gone");
        }
        sess_end(s, "the daemon is gone");
        return;
    }
    if (!id || json_is_null(id)) {
        r = s->current;
    } else {
        for (struct req *w = s->waiting; w; w = w->next)
            if (w->rpc_id && json_equal(w->rpc_id, id)) {
                r = w;
                break;
            }
    }
    if (!r) { /* its HTTP request is gone (the client hung up, or the session ended) */
        json_decref(msg);
        return;
    }
    bool failed_init = r->is_init && json_object_get(msg, "error");
    bool bad = (!id || json_is_null(id)) && json_object_get(msg, "error");
    char *body = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    req_detach(r);
    if (!failed_init)
        snprintf(r->resp_sid, sizeof(r->resp_sid), "%s", s->id);
    if (!body)
        conch_mcp_http_fail(r, 500, -32603, "out of memory");
    else
        respond(r, bad ? 400 : 200, "application/json", body);
    if (failed_init) /* no session without a sandbox: the client starts again */
        sess_end(s, "initialize failed");
}

/* Hand @msg (borrowed) to @s for request @r: answered now, or when the daemon answers. */
static void dispatch(struct hsess *s, struct req *r, json_t *msg)
{
    s->last_used = time(NULL);
    json_t *id = json_object_get(msg, "id");
    bool request = json_is_object(msg) && json_object_get(msg, "method") &&
                   (json_is_string(id) || json_is_integer(id));
    if (request) {
        for (struct req *w = s->waiting; w; w = w->next)
            if (w->rpc_id && json_equal(w->rpc_id, id)) {
                conch_mcp_http_fail(r, 400, -32600,
                                    "a request with this id is already in flight in the session");
                return;
            }
        r->rpc_id = json_incref(id);
    }
    req_attach(s, r);
    s->current = r;
    conch_mcp_session_message(s->m, msg);
    if (s->current == r) {
        s->current = NULL;
        if (!request) { /* a notification or a response: accepted, nothing to say */
            req_detach(r);
            snprintf(r->resp_sid, sizeof(r->resp_sid), "%s", s->id);
            respond(r, 202, NULL, NULL);
        } else {
            lws_set_timeout(r->wsi, NO_PENDING_TIMEOUT, 0); /* a command may run long */
        }
    }
}

/* ---- connection.auth ---- */

static void auth_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error);
static const struct mcp_tool auth_tool = {.name = "(connection.auth)", .reply = auth_reply};

static void auth_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    struct hsess *s = conch_mcp_session_ctx(m);
    struct srv *v = s->srv;
    conch_mcp_call_free(m, c);
    struct req *r = s->auth_req;
    json_t *msg = s->auth_msg;
    s->auth_msg = NULL;
    if (r)
        req_detach(r);
    if (error) {
        json_int_t code = json_integer_value(json_object_get(error, "code"));
        const char *dm = json_string_value(json_object_get(error, "message"));
        if (r && code == -32021)
            conch_mcp_http_fail(r, 429, -32021, "rate limited: too many failed authentications");
        else if (r && code == -32601)
            conch_mcp_http_fail(r, 500, -32603,
                                "conch's daemon does not know connection.auth: run a daemon "
                                "that serves tokens (conch serve --tokens FILE)");
        else if (r && code == -32020)
            conch_mcp_http_fail(r, 401, -32020, "unauthorized");
        else if (r)
            conch_mcp_http_fail(r, 503, -32603, dm ? dm : "conch's daemon refused");
        json_decref(msg);
        sess_end(s, "unauthorized");
        return;
    }
    if (s->probe || !r || stop_signal) {
        /* A good token of another tenant than the session's: that session is not its. */
        if (r)
            conch_mcp_http_fail(r, 404, -32001, CONCH_MCP_NO_SESSION);
        json_decref(msg);
        sess_end(s, "probe done");
        return;
    }
    const char *tenant = json_string_value(json_object_get(res, "tenant"));
    snprintf(s->tenant, sizeof(s->tenant), "%s", tenant ? tenant : "?");
    unsigned char rnd[CONCH_MCP_SID_BYTES];
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        conch_mcp_http_fail(r, 500, -32603, "no random bytes for a session id");
        json_decref(msg);
        sess_end(s, "no session id");
        return;
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(s->id + 2 * i, 3, "%02x", rnd[i]);
    s->state = SESS_LIVE;
    leave_authing(s);
    s->next = v->sessions;
    v->sessions = s;
    v->n_sessions++;
    fprintf(stderr, "conch mcp: session %.8s... opened for tenant %s from %s\n", s->id, s->tenant,
            r->peer);
    dispatch(s, r, msg);
    json_decref(msg);
}

/* Open a daemon connection for @r and authenticate its token there. For a new session
 * (!@probe) @msg (taken: the initialize request) is then handled in it; a probe only tells a
 * wrong token (401) from another tenant's (404). */
static void start_auth(struct srv *v, struct req *r, json_t *msg, bool probe)
{
    struct conch_err err = {0};
    if (!probe && v->n_sessions + v->n_authing >= v->h->max_sessions) {
        json_decref(msg);
        conch_mcp_http_fail(r, 503, -32603,
                            "too many MCP sessions: end one (DELETE) or wait for one to expire");
        return;
    }
    int fd = v->h->connect(v->h->socket, &err);
    if (fd < 0) {
        json_decref(msg);
        fprintf(stderr, "conch mcp: %s\n", err.msg);
        conch_mcp_http_fail(r, 503, -32603, "cannot reach conch's daemon");
        return;
    }
    struct hsess *s = calloc(1, sizeof(*s));
    const struct mcp_io io = {.to_client = to_client, .ctx = s};
    if (s)
        s->m = conch_mcp_session_new(v->o, v->tools_list, &io, fd, fd, NULL);
    if (s && s->m) /* no name: a tenant's sessions are many; a sandbox left behind by a
                    * session that could not destroy it (its daemon restarted) expires */
        conch_mcp_session_sandbox_opts(
            s->m, NULL, v->h->idle_timeout_s ? (double)v->h->idle_timeout_s + SANDBOX_GRACE_S : 0);
    if (!s || !s->m) {
        free(s);
        close(fd);
        json_decref(msg);
        conch_mcp_http_fail(r, 500, -32603, "out of memory");
        return;
    }
    s->srv = v;
    s->fd = fd;
    s->state = SESS_AUTHING;
    s->probe = probe;
    memcpy(s->tok_hash, r->tok_hash, sizeof(s->tok_hash));
    lws_adopt_desc_t ad = {.vh = v->vhost,
                           .type = LWS_ADOPT_RAW_FILE_DESC,
                           .fd = {.filefd = fd},
                           .vh_prot_name = "conch-daemon",
                           .opaque = s};
    s->raw = lws_adopt_descriptor_vhost_via_info(&ad);
    if (!s->raw) { /* lws closed the fd */
        conch_mcp_session_free(s->m);
        free(s);
        json_decref(msg);
        conch_mcp_http_fail(r, 500, -32603, "cannot watch the daemon connection");
        return;
    }
    v->n_authing++;
    v->n_alive++;
    s->counted_authing = true;
    s->auth_req = r;
    s->auth_msg = msg;
    req_attach(s, r);
    struct mcp_call *c = calloc(1, sizeof(*c));
    if (!c) {
        sess_end(s, "out of memory");
        return;
    }
    c->tool = &auth_tool;
    conch_mcp_daemon_call(s->m, c, "connection.auth",
                          json_pack("{s:s,s:s}", "token", r->token, "peer", r->peer));
}

/* ---- a request once its headers (and body) are in ---- */

void conch_mcp_http_handle(struct srv *v, struct req *r, json_t *msg)
{
    if (!r->sid[0]) {
        bool init = json_is_object(msg) && json_is_string(json_object_get(msg, "method")) &&
                    !strcmp(json_string_value(json_object_get(msg, "method")), "initialize");
        if (r->method != REQ_POST || !init) {
            json_decref(msg);
            conch_mcp_http_fail(r, 400, -32600,
                                "no Mcp-Session-Id: send initialize first, then its session id "
                                "with every request");
            return;
        }
        r->is_init = true;
        start_auth(v, r, msg, false);
        return;
    }
    struct hsess *s = find_session(v, r->sid);
    if (!s) {
        json_decref(msg);
        conch_mcp_http_fail(r, 404, -32001, CONCH_MCP_NO_SESSION);
        return;
    }
    if (CRYPTO_memcmp(s->tok_hash, r->tok_hash, sizeof(s->tok_hash))) {
        json_decref(msg);
        start_auth(v, r, NULL, true);
        return;
    }
    if (r->method == REQ_DELETE) {
        json_decref(msg);
        respond(r, 204, NULL, NULL);
        sess_end(s, "DELETE");
        return;
    }
    dispatch(s, r, msg);
    json_decref(msg);
}

/* ---- the daemon connections (raw file descriptors in lws's loop) ---- */

static int daemon_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                     size_t len)
{
    (void)user;
    (void)in;
    (void)len;
    struct hsess *s = lws_get_opaque_user_data(wsi);
    switch (reason) {
    case LWS_CALLBACK_RAW_RX_FILE:
        if (!s || s->closing)
            return 0;
        if (!conch_mcp_session_daemon_input(s->m)) {
            s->raw = NULL; /* lws closes it on -1; the close callback frees @s */
            return -1;
        }
        if (s->state == SESS_ENDING && conch_mcp_session_done(s->m))
            return -1;
        return 0;
    case LWS_CALLBACK_RAW_CLOSE_FILE:
        if (!s)
            return 0;
        lws_set_opaque_user_data(wsi, NULL);
        s->raw = NULL;
        if (s->state != SESS_ENDING) {
            conch_mcp_session_daemon_lost(s->m);
            sess_end(s, "the daemon connection closed");
        }
        while (s->waiting) {
            struct req *r = s->waiting;
            req_detach(r);
            conch_mcp_http_fail(r, 503, -32603, "conch's daemon is gone");
        }
        leave_authing(s);
        s->srv->n_alive--;
        json_decref(s->auth_msg);
        conch_mcp_session_free(s->m);
        free(s);
        /* lws closes the descriptor it adopted */
        return 0;
    default:
        return 0;
    }
}

/* ---- HTTP ---- */

/* Free @r's body and take it off the server's count of buffered bodies. */
static void drop_body(struct srv *v, struct req *r)
{
    free(r->body);
    r->body = NULL;
    if (v)
        v->body_bytes -= r->body_cap;
    if (v && !r->trusted)
        v->untrusted_bytes -= r->body_cap;
    r->body_len = r->body_cap = 0;
}

static void req_reset(struct req *r)
{
    req_detach(r);
    drop_body(r->srv, r);
    free(r->resp);
    free(r->token);
    struct lws *wsi = r->wsi;
    struct srv *v = r->srv;
    memset(r, 0, sizeof(*r));
    r->wsi = wsi;
    r->srv = v;
}

static int write_response(struct lws *wsi, struct req *r)
{
    unsigned char buf[LWS_PRE + CHUNK];
    unsigned char *start = buf + LWS_PRE, *p = start, *end = buf + sizeof(buf) - 1;
    if (!r->headers_sent) {
        if (lws_add_http_common_headers(wsi, r->status, r->ctype, r->resp_len, &p, end))
            return -1;
        if (r->resp_sid[0] &&
            lws_add_http_header_by_name(
                wsi, (const unsigned char *)"mcp-session-id:", (const unsigned char *)r->resp_sid,
                (int)strlen(r->resp_sid), &p, end))
            return -1;
        if (r->status == 401 &&
            lws_add_http_header_by_name(wsi, (const unsigned char *)"www-authenticate:",
                                        (const unsigned char *)"Bearer", 6, &p, end))
            return -1;
        if (r->status == 405 &&
            lws_add_http_header_by_name(wsi, (const unsigned char *)"allow:",
                                        (const unsigned char *)"POST, DELETE", 12, &p, end))
            return -1;
        if (r->close_after &&
            lws_add_http_header_by_name(wsi, (const unsigned char *)"connection:",
                                        (const unsigned char *)"close", 5, &p, end))
            return -1;
        if (lws_finalize_write_http_header(wsi, start, &p, end))
            return -1;
        r->headers_sent = true;
        if (r->resp_len) {
            lws_callback_on_writable(wsi);
            return 0;
        }
    } else {
        size_t n = r->resp_len - r->resp_off;
        if (n > CHUNK)
            n = CHUNK;
        memcpy(start, r->resp + r->resp_off, n);
        r->resp_off += n;
        bool last = r->resp_off == r->resp_len;
        if (lws_write(wsi, start, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) != (int)n)
            return -1;
        if (!last) {
            lws_callback_on_writable(wsi);
            return 0;
        }
    }
    bool close_after = r->close_after;
    req_reset(r);
    if (close_after)
        return -1;
    return lws_http_transaction_completed(wsi) ? -1 : 0;
}

/* @r's whole body is in: parse it and handle the message. */
static void body_done(struct srv *v, struct req *r)
{
    json_error_t je;
    json_t *msg = json_loadb(r->body ? r->body : "", r->body_len,
                             JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    drop_body(v, r);
    if (!msg) {
        char m[300];
        snprintf(m, sizeof(m), "parse error: %s (at position %d)", je.text, je.position);
        conch_mcp_http_fail(r, 400, -32700, m);
        return;
    }
    conch_mcp_http_handle(v, r, msg);
}

static int http_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len)
{
    struct req *r = user;
    struct srv *v = lws_context_user(lws_get_context(wsi));
    if (reason == LWS_CALLBACK_OPENSSL_LOAD_EXTRA_SERVER_VERIFY_CERTS) {
        v->ssl_ctx = user; /* the vhost's, which SIGHUP reloads */
        return 0;
    }
    if (!r) /* a connection closed before it had its per-request data (a failed handshake) */
        return lws_callback_http_dummy(wsi, reason, user, in, len);
    switch (reason) {
    case LWS_CALLBACK_HTTP: {
        req_reset(r);
        r->wsi = wsi;
        r->srv = v;
        char cl[32];
        r->body_pending = lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0 &&
                          lws_hdr_copy(wsi, cl, sizeof(cl), WSI_TOKEN_HTTP_CONTENT_LENGTH) > 0 &&
                          strcmp(cl, "0");
        lws_set_timeout(wsi, PENDING_TIMEOUT_HTTP_CONTENT, 60);
        if (conch_mcp_http_headers(v, r, (const char *)in) || r->answered)
            return 0;
        struct hsess *s = r->sid[0] ? find_session(v, r->sid) : NULL;
        r->trusted = s && !CRYPTO_memcmp(s->tok_hash, r->tok_hash, sizeof(s->tok_hash));
        if (r->method == REQ_DELETE) /* no body */
            conch_mcp_http_handle(v, r, NULL);
        else if (!r->body_pending) /* an empty body */
            body_done(v, r);
        return 0;
    }
    case LWS_CALLBACK_HTTP_BODY:
        if (r->answered || r->method != REQ_POST)
            return 0;
        size_t cap_max =
            r->trusted || v->h->max_body < UNTRUSTED_BODY_MAX ? v->h->max_body : UNTRUSTED_BODY_MAX;
        if (r->body_len + len > cap_max) {
            r->close_after = true;
            drop_body(v, r);
            conch_mcp_http_fail(r, 413, -32600,
                                r->trusted ? "request body too large"
                                           : "request body too large for a request of no "
                                             "session (an initialize): at most 64 KiB");
            return 0;
        }
        if (r->body_len + len + 1 > r->body_cap) {
            size_t cap = r->body_cap ? r->body_cap : 4096;
            while (cap < r->body_len + len + 1)
                cap *= 2;
            if (v->body_bytes - r->body_cap + cap > MAX_BODIES(v) ||
                (!r->trusted && v->untrusted_bytes - r->body_cap + cap > UNTRUSTED_BODIES(v))) {
                r->close_after = true;
                drop_body(v, r);
                conch_mcp_http_fail(r, 503, -32603,
                                    "busy: too many request bodies arriving at once; retry");
                return 0;
            }
            char *b = realloc(r->body, cap);
            if (!b) {
                r->close_after = true;
                conch_mcp_http_fail(r, 500, -32603, "out of memory");
                return 0;
            }
            r->body = b;
            v->body_bytes += cap - r->body_cap;
            if (!r->trusted)
                v->untrusted_bytes += cap - r->body_cap;
            r->body_cap = cap;
        }
        memcpy(r->body + r->body_len, in, len);
        r->body_len += len;
        return 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (!r->body_pending)
            return 0;
        r->body_pending = false;
        if (r->answered) /* refused before its body: the answer goes now */
            lws_callback_on_writable(wsi);
        else if (r->method == REQ_POST)
            body_done(v, r);
        return 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        if (!r->answered)
            return 0;
        return write_response(wsi, r);
    case LWS_CALLBACK_CLOSED_HTTP:
        req_reset(r);
        return 0;
    default:
        return lws_callback_http_dummy(wsi, reason, user, in, len);
    }
}

/* ---- the server ---- */

static void sweep(lws_sorted_usec_list_t *sul)
{
    struct srv *v = lws_container_of(sul, struct srv, sweep);
    time_t now = time(NULL);
    struct hsess *next;
    for (struct hsess *s = v->sessions; s; s = next) {
        next = s->next;
        if (s->waiting)
            s->last_used = now; /* a call in flight is not idleness */
        else if (v->h->idle_timeout_s && now - s->last_used >= (time_t)v->h->idle_timeout_s)
            sess_end(s, "idle");
    }
    lws_sul_schedule(v->ctx, 0, &v->sweep, sweep, SWEEP_US);
}

static const struct lws_protocols protocols[] = {
    {"http", http_cb, sizeof(struct req), 0, 0, NULL, 0},
    {"conch-daemon", daemon_cb, 0, 0, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

int conch_mcp_serve_http(const struct conch_mcp_opts *o, const struct conch_mcp_http_opts *h,
                         struct conch_err *err)
{
    struct srv v = {.o = o, .h = h};
    int r =
        conch_mcp_http_bind_addr(h->listen, v.iface, sizeof(v.iface), &v.port, &v.loopback, err);
    if (r < 0)
        return r;
    const char *files[2][2] = {{"--tls-cert", h->tls_cert}, {"--tls-key", h->tls_key}};
    for (int i = 0; i < 2; i++) {
        FILE *f = fopen(files[i][1], "re");
        if (!f)
            return conch_err_setk(err, CONCH_ERR_USAGE, errno, "%s: cannot read '%s': %s",
                                  files[i][0], files[i][1], strerror(errno));
        fclose(f);
    }
    v.tools_list = conch_mcp_tools_list(err);
    if (!v.tools_list)
        return -err->code;
    lws_set_log_level(LLL_ERR, NULL);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof(info));
    info.port = v.port;
    info.iface = v.iface;
    info.protocols = protocols;
    info.user = &v;
    info.vhost_name = "conch-mcp";
    info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT | LWS_SERVER_OPTION_VALIDATE_UTF8;
    if (!strchr(v.iface, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    info.ssl_cert_filepath = h->tls_cert;
    info.ssl_private_key_filepath = h->tls_key;
    info.ssl_options_set = SSL_OP_NO_SSLv2 | SSL_OP_NO_SSLv3 | SSL_OP_NO_TLSv1 | SSL_OP_NO_TLSv1_1;
    info.alpn = "http/1.1";
    info.timeout_secs = 10; /* the TLS and HTTP handshake */
    info.keepalive_timeout = 60;
    info.max_http_header_data = 8192;
    struct sigaction sa = {.sa_handler = on_stop_signal}, old_term, old_int, old_hup, old_pipe;
    struct sigaction ign = {.sa_handler = SIG_IGN}, hup = {.sa_handler = on_reload_signal};
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGHUP, &hup, &old_hup);
    sigaction(SIGPIPE, &ign, &old_pipe);
    v.ctx = lws_create_context(&info);
    if (!v.ctx) {
        r = conch_err_set(err, EINVAL,
                          "cannot serve https on %s: check --tls-cert and --tls-key (PEM "
                          "files, the key matching the certificate) and that the address is "
                          "free",
                          h->listen);
        goto out;
    }
    v.vhost = lws_get_vhost_by_name(v.ctx, "conch-mcp");
    int port = v.vhost ? lws_get_vhost_listen_port(v.vhost) : v.port;
    fprintf(stderr, "conch mcp: serving MCP on https://%s%s%s:%d/mcp\n",
            strchr(v.iface, ':') ? "[" : "", v.iface, strchr(v.iface, ':') ? "]" : "", port);
    lws_sul_schedule(v.ctx, 0, &v.sweep, sweep, SWEEP_US);
    while (!stop_signal) {
        if (reload_signal) {
            reload_signal = 0;
            reload_cert(&v);
        }
        if (lws_service(v.ctx, 0) < 0)
            break;
    }
    fprintf(stderr, "conch mcp: signal %d: ending %u session%s\n", (int)stop_signal, v.n_sessions,
            v.n_sessions == 1 ? "" : "s");
    while (v.sessions)
        sess_end(v.sessions, "shutdown");
    time_t until = time(NULL) + END_GRACE_S;
    while (v.n_alive > 0 && time(NULL) < until)
        if (lws_service(v.ctx, 0) < 0)
            break;
    lws_sul_cancel(&v.sweep);
    lws_context_destroy(v.ctx);
out:
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    json_decref(v.tools_list);
    return r;
}
