/* gateway.c - the gateway process: wss://HOST:PORT/rpc on libwebsockets (OpenSSL, TLS 1.2+),
 * each WebSocket forwarded to the daemon's unix socket as one connection that opened with
 * connection.auth; one JSON-RPC message per text message one way, one line the other way.
 * What a connection may make it hold is bounded (remote.h); /healthz answers probes. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libwebsockets.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include "core/log.h"
#include "core/utf8.h"
#include "remote/remote-internal.h"
#include "remote/remote.h"

#define CHUNK_CAP (64 * 1024)

/* A piece of a message queued one way. To the client it is one WebSocket frame; @start and
 * @fin say where it sits in its message. Its bytes follow LWS_PRE bytes of headroom. */
struct chunk {
    struct chunk *next;
    size_t len, off, cap;
    bool start, fin;
    unsigned char buf[];
};

struct queue {
    struct chunk *head, *tail;
    size_t bytes;
};

/* One remote client: its WebSocket and its daemon connection. Both wsis hold a reference
 * (the daemon's through lws_set_opaque_user_data); it is freed when both let go. */
struct conn {
    struct gateway *g;
    struct lws *wsi; /* the client's wsi from the upgrade on (NULL once destroyed) */
    struct lws *ux;  /* the daemon connection once adopted (NULL once closed) */
    int fd;          /* the daemon connection before it is adopted, else -1 */
    int refs;
    struct queue to_client, to_daemon;
    size_t client_msg; /* bytes of the client's message being received */
    size_t daemon_msg; /* bytes of the daemon's line being forwarded */
    bool in_line;      /* a line from the daemon was begun and not ended */
    bool ux_paused, ws_paused, ux_gone;
};

struct gateway {
    const struct conch_remote_opts *o;
    struct lws_context *ctx;
    SSL_CTX *ssl_ctx;
    unsigned conns;
    bool stop;
};

/* HTTP requests that are not upgrades: the status /healthz answers. */
struct http_pss {
    int status;
};

static void queue_free(struct queue *q)
{
    while (q->head) {
        struct chunk *c = q->head;
        q->head = c->next;
        free(c);
    }
    q->tail = NULL;
    q->bytes = 0;
}

static void conn_unref(struct conn *c)
{
    if (--c->refs > 0)
        return;
    if (c->fd >= 0)
        close(c->fd);
    queue_free(&c->to_client);
    queue_free(&c->to_daemon);
    c->g->conns--;
    free(c);
}

/* Append @len bytes to @q's last chunk while it is open (not @fin) and has room, else to a new
 * one; newlines become spaces when @flatten (a JSON text has them only between tokens). */
static int queue_put(struct queue *q, const unsigned char *p, size_t len, bool flatten,
                     bool *starts)
{
    while (len) {
        struct chunk *t = q->tail;
        if (!t || t->fin || t->len == t->cap) {
            t = malloc(sizeof(*t) + LWS_PRE + CHUNK_CAP);
            if (!t)
                return -ENOMEM;
            memset(t, 0, sizeof(*t));
            t->cap = CHUNK_CAP;
            t->start = *starts;
            *starts = false;
            if (q->tail)
                q->tail->next = t;
            else
                q->head = t;
            q->tail = t;
        }
        size_t n = t->cap - t->len < len ? t->cap - t->len : len;
        unsigned char *d = t->buf + LWS_PRE + t->len;
        memcpy(d, p, n);
        if (flatten)
            for (size_t i = 0; i < n; i++)
                if (d[i] == '\n' || d[i] == '\r')
                    d[i] = ' ';
        t->len += n;
        q->bytes += n;
        p += n;
        len -= n;
    }
    return 0;
}

/* End the message being queued: mark its last chunk final (an empty one if it has none). */
static int queue_end(struct queue *q, bool *starts)
{
    if (!q->tail || q->tail->fin || *starts) {
        struct chunk *t = calloc(1, sizeof(*t) + LWS_PRE);
        if (!t)
            return -ENOMEM;
        t->start = *starts;
        if (q->tail)
            q->tail->next = t;
        else
            q->head = t;
        q->tail = t;
    }
    q->tail->fin = true;
    *starts = true;
    return 0;
}

static void queue_pop(struct queue *q)
{
    struct chunk *c = q->head;
    q->head = c->next;
    if (!q->head)
        q->tail = NULL;
    q->bytes -= c->len;
    free(c);
}

/* ---- the daemon side ---- */

/* Bytes from the daemon: each line is one text message to the client, sent as frames as it
 * comes (a long line is never held whole). Past the client's cap, stop reading the daemon. */
static int from_daemon(struct conn *c, const unsigned char *p, size_t len)
{
    while (len) {
        const unsigned char *nl = memchr(p, '\n', len);
        size_t n = nl ? (size_t)(nl - p) : len;
        c->daemon_msg += n;
        if (c->daemon_msg > CONCH_REMOTE_MAX_MESSAGE) {
            log_warn("gateway: a daemon message over %u bytes: connection closed",
                     CONCH_REMOTE_MAX_MESSAGE);
            return -1;
        }
        bool starts = !c->in_line;
        if (n && queue_put(&c->to_client, p, n, false, &starts) < 0)
            return -1;
        if (n)
            c->in_line = true;
        if (nl) {
            if (c->in_line && queue_end(&c->to_client, &starts) < 0)
                return -1;
            c->in_line = false;
            c->daemon_msg = 0;
            n++;
        }
        p += n;
        len -= n;
    }
    if (c->wsi)
        lws_callback_on_writable(c->wsi);
    if (!c->ux_paused && c->to_client.bytes > CONCH_REMOTE_CLIENT_QUEUE) {
        lws_rx_flow_control(c->ux, 0);
        c->ux_paused = true;
    }
    return 0;
}

/* Send what the client's messages queued; a chunk is freed once sent whole (the tail may
 * still grow after a part of it went). */
static int write_daemon(struct conn *c)
{
    int fd = lws_get_socket_fd(c->ux);
    while (c->to_daemon.head) {
        struct chunk *k = c->to_daemon.head;
        if (k->off < k->len) {
            ssize_t n =
                send(fd, k->buf + LWS_PRE + k->off, k->len - k->off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                lws_callback_on_writable(c->ux);
                break;
            }
            if (n < 0)
                return -1;
            k->off += (size_t)n;
            if (k->off < k->len) {
                lws_callback_on_writable(c->ux);
                break;
            }
        }
        queue_pop(&c->to_daemon);
    }
    if (c->ws_paused && c->to_daemon.bytes < CONCH_REMOTE_CLIENT_QUEUE / 2 && c->wsi) {
        lws_rx_flow_control(c->wsi, 1);
        c->ws_paused = false;
    }
    return 0;
}

static int daemon_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                     size_t len)
{
    struct conn *c = lws_get_opaque_user_data(wsi);
    switch (reason) {
    case LWS_CALLBACK_RAW_RX:
        if (!c || from_daemon(c, in, len) < 0)
            return -1;
        break;
    case LWS_CALLBACK_RAW_WRITEABLE:
        if (!c || write_daemon(c) < 0)
            return -1;
        break;
    case LWS_CALLBACK_RAW_CLOSE:
        if (c) {
            lws_set_opaque_user_data(wsi, NULL);
            c->ux = NULL;
            c->ux_gone = true;
            if (c->wsi)
                lws_callback_on_writable(c->wsi);
            conn_unref(c);
        }
        break;
    default:
        break;
    }
    return 0;
}

/* ---- the client side ---- */

static int from_client(struct conn *c, struct lws *wsi, const unsigned char *p, size_t len)
{
    if (lws_frame_is_binary(wsi)) {
        lws_close_reason(wsi, LWS_CLOSE_STATUS_UNACCEPTABLE_OPCODE,
                         (unsigned char *)"text messages only", 18);
        return -1;
    }
    c->client_msg += len;
    if (c->client_msg > CONCH_REMOTE_MAX_MESSAGE) {
        lws_close_reason(wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE,
                         (unsigned char *)"message over 64 MiB", 19);
        return -1;
    }
    bool starts = false;
    if (len && queue_put(&c->to_daemon, p, len, true, &starts) < 0)
        return -1;
    if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi)) {
        if (c->client_msg &&
            queue_put(&c->to_daemon, (const unsigned char *)"\n", 1, false, &starts) < 0)
            return -1;
        c->client_msg = 0;
    }
    if (c->ux)
        lws_callback_on_writable(c->ux);
    if (!c->ws_paused && c->to_daemon.bytes > CONCH_REMOTE_CLIENT_QUEUE) {
        lws_rx_flow_control(wsi, 0);
        c->ws_paused = true;
    }
    return 0;
}

static int write_client(struct conn *c, struct lws *wsi)
{
    struct chunk *k = c->to_client.head;
    /* The open tail of a line waits for more unless the client is owed it now. */
    if (k && !(k->next || k->fin || k->len == k->cap)) {
        if (!c->ux_gone)
            return 0;
    }
    if (k) {
        int flags = lws_write_ws_flags(LWS_WRITE_TEXT, k->start, k->fin);
        int n = lws_write(wsi, k->buf + LWS_PRE, k->len, (enum lws_write_protocol)flags);
        if (n < (int)k->len)
            return -1;
        queue_pop(&c->to_client);
        if (c->to_client.head)
            lws_callback_on_writable(wsi);
        if (c->ux_paused && c->ux && c->to_client.bytes < CONCH_REMOTE_CLIENT_QUEUE / 2) {
            lws_rx_flow_control(c->ux, 1);
            c->ux_paused = false;
        }
        return 0;
    }
    if (c->ux_gone) {
        lws_close_reason(wsi, LWS_CLOSE_STATUS_GOINGAWAY,
                         (unsigned char *)"the daemon closed the connection", 32);
        return -1;
    }
    return 0;
}

/* Adopt the authenticated daemon connection into the loop, as a child of the WebSocket. */
static int adopt_daemon(struct conn *c, struct lws *wsi)
{
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    lws_adopt_desc_t ad = {.vh = lws_get_vhost(wsi),
                           .type = LWS_ADOPT_SOCKET,
                           .vh_prot_name = "conch-daemon",
                           .parent = wsi,
                           .opaque = c};
    ad.fd.sockfd = c->fd;
    c->fd = -1;
    c->refs++;
    c->ux = lws_adopt_descriptor_vhost_via_info(&ad);
    if (!c->ux) {
        c->refs--;
        log_warn("gateway: could not adopt the daemon connection");
        return -1;
    }
    return 0;
}

/* ---- the upgrade: path, capacity, token ---- */

/* Refuse an upgrade with @status, written whole here: lws has not parsed the request's HTTP
 * version at this point and would answer HTTP/1.0, which WebSocket clients refuse to read. */
static int reject(struct lws *wsi, unsigned status, const char *why)
{
    const char *phrase = status == 401   ? "Unauthorized"
                         : status == 404 ? "Not Found"
                         : status == 429 ? "Too Many Requests"
                                         : "Service Unavailable";
    unsigned char buf[LWS_PRE + 512];
    int n = snprintf((char *)buf + LWS_PRE, sizeof(buf) - LWS_PRE,
                     "HTTP/1.1 %u %s\r\n%scontent-type: text/plain\r\ncontent-length: %zu\r\n"
                     "\r\n%s\n",
                     status, phrase, status == 401 ? "www-authenticate: Bearer\r\n" : "",
                     strlen(why) + 1, why);
    if (n < 0 || (size_t)n >= sizeof(buf) - LWS_PRE)
        return -1;
    if (lws_write(wsi, buf + LWS_PRE, (size_t)n, LWS_WRITE_HTTP_HEADERS) < n)
        return -1;
    return 1;
}

static int confirm_upgrade(struct gateway *g, struct lws *wsi)
{
    char uri[64] = "", auth[4096] = "", peer[128] = "";
    lws_hdr_copy(wsi, uri, sizeof(uri), WSI_TOKEN_GET_URI);
    if (strcmp(uri, "/rpc"))
        return reject(wsi, HTTP_STATUS_NOT_FOUND, "the WebSocket endpoint is /rpc");
    if (g->conns >= g->o->max_connections) {
        log_warn("gateway: %u connections: refusing another (--max-connections)", g->conns);
        return reject(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE, "too many connections");
    }
    lws_get_peer_simple(wsi, peer, sizeof(peer));
    /* An IPv4 client of a dual-stack socket: its address as itself (the daemon's
     * rate limit counts per peer, whichever way it is written). */
    if (!strncmp(peer, "::ffff:", 7) && strchr(peer + 7, '.'))
        memmove(peer, peer + 7, strlen(peer + 7) + 1);
    int alen = lws_hdr_copy(wsi, auth, sizeof(auth), WSI_TOKEN_HTTP_AUTHORIZATION);
    const char *token = NULL;
    if (alen > 7 && !strncasecmp(auth, "Bearer ", 7)) {
        token = auth + 7;
        while (*token == ' ')
            token++;
    }
    if (!token || !*token)
        return reject(wsi, HTTP_STATUS_UNAUTHORIZED, "unauthorized");
    int fd = conch_remote_daemon_connect(g->o->socket_path);
    if (fd < 0) {
        log_warn("gateway: connect to the daemon at '%s': %s", g->o->socket_path, strerror(-fd));
        return reject(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE, "the daemon is not answering");
    }
    json_t *res = NULL;
    int code = 0;
    /* A token that is not UTF-8 cannot go into JSON as it is: repaired (U+FFFD for each bad
     * byte), it matches no token and counts as a failure like any other wrong one. */
    json_t *params = json_pack("{s:s, s:s}", "token", token, "peer", peer);
    if (!params) {
        size_t fixed_len = 0;
        char *fixed = conch_utf8_repair(token, strlen(token), &fixed_len);
        params = fixed ? json_pack("{s:s, s:s}", "token", fixed, "peer", peer) : NULL;
        if (fixed) {
            explicit_bzero(fixed, fixed_len);
            free(fixed);
        }
    }
    int r = params ? conch_remote_daemon_call(fd, "connection.auth", params,
                                              CONCH_REMOTE_DAEMON_TIMEOUT_MS, &res, &code)
                   : -ENOMEM;
    explicit_bzero(auth, sizeof(auth));
    json_decref(res);
    if (r != 0) {
        close(fd);
        if (r == 1 && code == -32020)
            return reject(wsi, HTTP_STATUS_UNAUTHORIZED, "unauthorized");
        if (r == 1 && code == -32021)
            return reject(wsi, 429, "too many failed attempts: try again later");
        log_warn("gateway: connection.auth for %s: %s", peer,
                 r == 1 ? "the daemon refused it" : strerror(-r));
        return reject(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE, "the daemon is not answering");
    }
    struct conn *c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return reject(wsi, HTTP_STATUS_SERVICE_UNAVAILABLE, "out of memory");
    }
    c->g = g;
    c->fd = fd;
    c->refs = 1;
    c->wsi = wsi;
    g->conns++;
    lws_set_opaque_user_data(wsi, c);
    return 0;
}

/* /healthz: 200 "ok" when the daemon answers daemon.ping, else 503. */
static int healthz(struct gateway *g, struct lws *wsi, struct http_pss *pss)
{
    int fd = conch_remote_daemon_connect(g->o->socket_path);
    json_t *res = NULL;
    int code = 0, r = fd < 0
                          ? fd
                          : conch_remote_daemon_call(fd, "daemon.ping", NULL,
                                                     CONCH_REMOTE_DAEMON_TIMEOUT_MS, &res, &code);
    json_decref(res);
    if (fd >= 0)
        close(fd);
    pss->status = r == 0 ? HTTP_STATUS_OK : HTTP_STATUS_SERVICE_UNAVAILABLE;
    unsigned char buf[LWS_PRE + 512], *start = buf + LWS_PRE, *p = start,
                                      *end = buf + sizeof(buf) - 1;
    if (lws_add_http_common_headers(wsi, (unsigned)pss->status, "text/plain",
                                    pss->status == HTTP_STATUS_OK ? 3 : 12, &p, end) ||
        lws_finalize_write_http_header(wsi, start, &p, end))
        return -1;
    lws_callback_on_writable(wsi);
    return 0;
}

static int rpc_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                  size_t len)
{
    struct gateway *g = lws_context_user(lws_get_context(wsi));
    struct http_pss *pss = user;
    struct conn *c = lws_get_opaque_user_data(wsi);
    switch (reason) {
    case LWS_CALLBACK_OPENSSL_LOAD_EXTRA_SERVER_VERIFY_CERTS: {
        /* The vhost's SSL_CTX, here once: TLS 1.2 at least, and the handle SIGHUP reloads. */
        SSL_CTX *ctx = user;
        g->ssl_ctx = ctx;
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
        SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
        break;
    }
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        return confirm_upgrade(g, wsi);
    case LWS_CALLBACK_HTTP:
        if (!strcmp((const char *)in, "/healthz"))
            return healthz(g, wsi, pss);
        if (lws_return_http_status(wsi, HTTP_STATUS_NOT_FOUND,
                                   "wss://HOST:PORT/rpc (WebSocket) and /healthz only"))
            return -1;
        return lws_http_transaction_completed(wsi) ? -1 : 0;
    case LWS_CALLBACK_HTTP_WRITEABLE: {
        if (!pss || !pss->status)
            break;
        const char *body = pss->status == HTTP_STATUS_OK ? "ok\n" : "unavailable\n";
        unsigned char buf[LWS_PRE + 16];
        size_t n = strlen(body);
        memcpy(buf + LWS_PRE, body, n);
        pss->status = 0;
        if (lws_write(wsi, buf + LWS_PRE, n, LWS_WRITE_HTTP_FINAL) < (int)n)
            return -1;
        return lws_http_transaction_completed(wsi) ? -1 : 0;
    }
    case LWS_CALLBACK_ESTABLISHED:
        if (!c || adopt_daemon(c, wsi) < 0)
            return -1;
        break;
    case LWS_CALLBACK_RECEIVE:
        if (!c || from_client(c, wsi, in, len) < 0)
            return -1;
        break;
    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (!c || write_client(c, wsi) < 0)
            return -1;
        break;
    case LWS_CALLBACK_WSI_DESTROY:
        if (c && c->wsi == wsi) {
            lws_set_opaque_user_data(wsi, NULL);
            c->wsi = NULL;
            conn_unref(c);
        }
        break;
    default:
        break;
    }
    return 0;
}

/* ---- signals: SIGTERM/SIGINT stop, SIGHUP reloads the certificate and key ---- */

int conch_remote_check_tls(const char *cert, const char *key, struct conch_err *err)
{
    SSL_CTX *k = SSL_CTX_new(TLS_server_method()), *t = SSL_CTX_new(TLS_server_method());
    int r = 0;
    if (!k || !t)
        r = conch_err_set(err, ENOMEM, "OpenSSL: out of memory");
    else if (SSL_CTX_use_PrivateKey_file(k, key, SSL_FILETYPE_PEM) != 1)
        r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                           "--tls-key '%s': not a readable PEM private key", key);
    else if (SSL_CTX_use_certificate_chain_file(t, cert) != 1)
        r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                           "--tls-cert '%s': not a readable PEM certificate chain", cert);
    else if (SSL_CTX_use_PrivateKey_file(t, key, SSL_FILETYPE_PEM) != 1 ||
             SSL_CTX_check_private_key(t) != 1)
        r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                           "--tls-key '%s' is not the key of the certificate in '%s'", key, cert);
    SSL_CTX_free(k);
    SSL_CTX_free(t);
    return r;
}

static void reload_cert(struct gateway *g)
{
    const char *cert = g->o->tls_cert, *key = g->o->tls_key;
    struct conch_err err = {0};
    if (conch_remote_check_tls(cert, key, &err) < 0) {
        log_warn("gateway: SIGHUP: %s: keeping the certificate in use", err.msg);
        return;
    }
    if (SSL_CTX_use_certificate_chain_file(g->ssl_ctx, cert) != 1 ||
        SSL_CTX_use_PrivateKey_file(g->ssl_ctx, key, SSL_FILETYPE_PEM) != 1)
        log_error("gateway: SIGHUP: the certificate changed while it was loaded: send SIGHUP "
                  "again");
    else
        log_info("gateway: SIGHUP: reloaded '%s' and '%s'", cert, key);
}

static int signal_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                     size_t len)
{
    struct gateway *g = lws_context_user(lws_get_context(wsi));
    if (reason != LWS_CALLBACK_RAW_RX_FILE)
        return 0;
    struct signalfd_siginfo si;
    while (read(lws_get_socket_fd(wsi), &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGHUP)
            reload_cert(g);
        else {
            g->stop = true;
            lws_cancel_service(g->ctx);
        }
    }
    return 0;
}

static const struct lws_protocols protocols[] = {
    {"conch-rpc", rpc_cb, sizeof(struct http_pss), 64 * 1024, 0, NULL, 0},
    {"conch-daemon", daemon_cb, 0, 0, 0, NULL, 0},
    {"conch-signal", signal_cb, 0, 0, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

static const lws_retry_bo_t ping_policy = {
    .secs_since_valid_ping = CONCH_REMOTE_PING_SECONDS,
    .secs_since_valid_hangup = CONCH_REMOTE_PING_SECONDS * 2 + 10,
};

static void lws_to_log(int level, const char *line)
{
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        n--;
    log_warn("gateway: libwebsockets: %.*s", (int)n, line);
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int conch_remote_gateway_run(const struct conch_remote_opts *o, struct conch_err *err)
{
    struct gateway g = {.o = o};
    char host[256];
    int port, r;
    if ((r = conch_remote_parse_listen(o->listen, host, sizeof(host), &port, err)) < 0 ||
        (r = conch_remote_probe_listen(o->listen, err)) < 0)
        return r;
    raise_nofile();
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sfd < 0)
        return conch_err_set(err, errno, "signalfd: %s", strerror(errno));

    lws_set_log_level(LLL_ERR, lws_to_log);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof(info));
    info.port = port;
    info.iface = host;
    info.protocols = protocols;
    info.user = &g;
    info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT |
                   LWS_SERVER_OPTION_FAIL_UPON_UNABLE_TO_BIND | LWS_SERVER_OPTION_VALIDATE_UTF8;
    /* An IPv4 address: libwebsockets 4.1 with IPv6 on binds an IPv6 socket and, finding no
     * IPv6 form of the address, the wildcard: 127.0.0.1 was served on every interface. */
    if (!strchr(host, ':'))
        info.options |= LWS_SERVER_OPTION_DISABLE_IPV6;
    info.ssl_cert_filepath = o->tls_cert;
    info.ssl_private_key_filepath = o->tls_key;
    info.ssl_options_set = SSL_OP_NO_SSLv3 | SSL_OP_NO_TLSv1 | SSL_OP_NO_TLSv1_1;
    info.alpn = "http/1.1";
    info.timeout_secs = CONCH_REMOTE_HANDSHAKE_SECONDS;
    info.retry_and_idle_policy = &ping_policy;
    info.pt_serv_buf_size = 64 * 1024;
    info.max_http_header_data = 8192;
    g.ctx = lws_create_context(&info);
    if (!g.ctx) {
        close(sfd);
        return conch_err_set(err, EINVAL,
                             "could not serve on %s with certificate '%s' and key '%s' (are they "
                             "a readable PEM chain and its key?)",
                             o->listen, o->tls_cert, o->tls_key);
    }
    if (!g.ssl_ctx) {
        lws_context_destroy(g.ctx);
        close(sfd);
        return conch_err_set(err, EPROTO, "libwebsockets did not set up TLS");
    }
    lws_sock_file_fd_type fd = {.filefd = sfd};
    if (!lws_adopt_descriptor_vhost(lws_get_vhost_by_name(g.ctx, "default"),
                                    LWS_ADOPT_RAW_FILE_DESC, fd, "conch-signal", NULL)) {
        lws_context_destroy(g.ctx);
        return conch_err_set(err, EIO, "could not watch the signals");
    }
    log_info("gateway: serving wss://%s/rpc for the daemon at %s", o->listen, o->socket_path);
    while (!g.stop && lws_service(g.ctx, 0) >= 0)
        ;
    log_info("gateway: stopping");
    lws_context_destroy(g.ctx);
    return 0;
}
