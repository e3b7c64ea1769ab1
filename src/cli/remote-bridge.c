/* remote-bridge.c - `conch-remote __connect URL`: the CLI's WebSocket on TLS to a remote
 * daemon (`conch serve --listen`; docs/PROTOCOL.md, "Remote transport"), in a process of its own
 * so that libwebsockets and OpenSSL stay out of the main binary (remote-conn.c starts it). It
 * pumps between the WebSocket and fd 3, the verb's socketpair, as line-framed JSON-RPC: the
 * main thread serves libwebsockets, a second thread reads the verb's lines and queues them,
 * and lws_cancel_service() wakes the first to send them (lws is not thread-safe otherwise).
 * Fd 4 says "+" once the connection is open, or "-" and why not. The token comes in
 * $CONCH_TOKEN (cleared once read); the server's certificate and hostname are always verified;
 * $CONCH_CA adds a CA to the system's. */
#include <errno.h>
#include <fcntl.h>
#include <libwebsockets.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "core/fsutil.h"

/* Messages up to this size, either way (the gateway's limit too). */
#define MAX_MESSAGE (64u << 20)
/* Outgoing messages go in frames of this size, one per writable callback. */
#define FRAG (64u << 10)
/* Lines queued from the verb and not yet sent, in bytes: the reader waits past it. */
#define QUEUE_MAX (2 * MAX_MESSAGE)
#define TOKEN_MAX 4096

struct msg {
    struct msg *next;
    size_t len;
    char data[];
};

/* The one remote connection of this process. */
static struct remote {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* under lock: */
    struct msg *head, *tail; /* lines from the verb, to send */
    size_t queued;
    bool verb_eof;   /* the verb closed its end */
    int state;       /* 0 connecting, 1 open, -1 failed or closed */
    char error[512]; /* why it failed */
    bool ws_gone;    /* the WebSocket closed: the reader stops */
    /* lws thread only: */
    struct lws_context *ctx;
    struct lws *wsi;
    size_t sent; /* of head->data */
    char *rx;    /* the message being received */
    size_t rx_len, rx_cap;
    int fd; /* our end of the socketpair */
    char token[TOKEN_MAX];
    bool had_token;
    char verify_error[256]; /* OpenSSL's reason for refusing the server's certificate */
    char host[256];
    char ca[4096];
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .fd = -1};

static void set_state(int state, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_state(int state, const char *fmt, ...)
{
    pthread_mutex_lock(&R.lock);
    if (fmt && !R.error[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(R.error, sizeof(R.error), fmt, ap);
        va_end(ap);
    }
    if (R.state != -1)
        R.state = state;
    if (state == -1)
        R.ws_gone = true;
    pthread_cond_broadcast(&R.cond);
    pthread_mutex_unlock(&R.lock);
}

/* A whole message from the server: one line to the verb. */
static int deliver(void)
{
    /* A raw line break in JSON is whitespace between tokens: a space keeps one line. */
    for (char *c = R.rx; (c = memchr(c, '\n', (size_t)(R.rx + R.rx_len - c)));)
        *c = ' ';
    R.rx[R.rx_len++] = '\n';
    int r = conch_send_all(R.fd, R.rx, R.rx_len);
    R.rx_len = 0;
    return r < 0 ? -1 : 0;
}

static int on_receive(struct lws *wsi, const void *in, size_t len)
{
    if (R.rx_len + len + 1 > MAX_MESSAGE + 1) {
        set_state(-1, "the server sent a message over %u MiB", MAX_MESSAGE >> 20);
        return -1;
    }
    if (R.rx_len + len + 1 > R.rx_cap) {
        size_t cap = R.rx_cap ? R.rx_cap : 1 << 16;
        while (cap < R.rx_len + len + 1)
            cap *= 2;
        char *n = realloc(R.rx, cap);
        if (!n) {
            set_state(-1, "out of memory");
            return -1;
        }
        R.rx = n;
        R.rx_cap = cap;
    }
    memcpy(R.rx + R.rx_len, in, len);
    R.rx_len += len;
    if (lws_is_final_fragment(wsi) && !lws_remaining_packet_payload(wsi))
        return deliver();
    return 0;
}

/* Send the next frame of the head message; ask for another writable callback if more. */
static int on_writable(struct lws *wsi)
{
    static unsigned char buf[LWS_PRE + FRAG];
    pthread_mutex_lock(&R.lock);
    struct msg *m = R.head;
    pthread_mutex_unlock(&R.lock);
    if (!m)
        return 0;
    size_t n = m->len - R.sent < FRAG ? m->len - R.sent : FRAG;
    bool first = R.sent == 0, last = R.sent + n == m->len;
    memcpy(buf + LWS_PRE, m->data + R.sent, n);
    int flags = lws_write_ws_flags(LWS_WRITE_TEXT, first, last);
    if (lws_write(wsi, buf + LWS_PRE, n, (enum lws_write_protocol)flags) < (int)n) {
        set_state(-1, "cannot send to the server");
        return -1;
    }
    R.sent += n;
    pthread_mutex_lock(&R.lock);
    bool more = true;
    if (last) {
        R.head = m->next;
        if (!R.head)
            R.tail = NULL;
        R.queued -= m->len;
        R.sent = 0;
        more = R.head != NULL;
        pthread_cond_broadcast(&R.cond);
    }
    bool closing = !more && R.verb_eof;
    pthread_mutex_unlock(&R.lock);
    free(last ? m : NULL);
    if (closing) { /* the verb is done and all it said is sent */
        lws_close_reason(wsi, LWS_CLOSE_STATUS_NORMAL, NULL, 0);
        return -1;
    }
    if (more)
        lws_callback_on_writable(wsi);
    return 0;
}

static int callback(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                    size_t len)
{
    switch (reason) {
    case LWS_CALLBACK_OPENSSL_LOAD_EXTRA_CLIENT_VERIFY_CERTS: {
        SSL_CTX *ctx = user;
        SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
        SSL_CTX_set_default_verify_paths(ctx);
        if (R.ca[0] && SSL_CTX_load_verify_locations(ctx, R.ca, NULL) != 1)
            set_state(-1, "cannot load the CA bundle '%s' (CONCH_CA)", R.ca);
        return 0;
    }
    case LWS_CALLBACK_OPENSSL_PERFORM_SERVER_CERT_VERIFICATION: {
        /* Only to say why: OpenSSL's own verdict (chain and hostname) stands. */
        X509_STORE_CTX *x = user;
        if (!len && x && !R.verify_error[0])
            snprintf(R.verify_error, sizeof(R.verify_error), "%s",
                     X509_verify_cert_error_string(X509_STORE_CTX_get_error(x)));
        return 0;
    }
    case LWS_CALLBACK_CLIENT_APPEND_HANDSHAKE_HEADER: {
        if (!R.token[0])
            return 0;
        unsigned char **p = in, *end = *p + len;
        char hdr[TOKEN_MAX + 16];
        int n = snprintf(hdr, sizeof(hdr), "Bearer %s", R.token);
        int r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_AUTHORIZATION,
                                             (unsigned char *)hdr, n, p, end);
        explicit_bzero(hdr, sizeof(hdr));
        explicit_bzero(R.token, sizeof(R.token));
        return r ? -1 : 0;
    }
    case LWS_CALLBACK_CLIENT_CONNECTION_ERROR: {
        int status = wsi ? (int)lws_http_client_http_response(wsi) : 0;
        const char *why = in && len ? (const char *)in : "connection failed";
        if ((status == 401 || strstr(why, "unauthorized")) && !R.had_token)
            set_state(-1, "unauthorized (HTTP 401): no token given (set CONCH_TOKEN or use "
                          "--token-file FILE)");
        else if (status == 401 || strstr(why, "unauthorized"))
            set_state(-1, "unauthorized (HTTP 401): the server refused the token "
                          "(CONCH_TOKEN or --token-file)");
        else if (R.verify_error[0])
            set_state(-1,
                      "the server's certificate was refused: %s (a private CA: set "
                      "CONCH_CA to its PEM file)",
                      R.verify_error);
        else if (status == 429)
            set_state(-1, "rate limited (HTTP 429): too many failed authentications from "
                          "this address; wait a minute");
        else if (strstr(why, "verify") || strstr(why, "certificate") || strstr(why, "SSL"))
            set_state(-1,
                      "the server's certificate was refused: %.300s (a private CA: set "
                      "CONCH_CA to its PEM file)",
                      why);
        else if (status)
            set_state(-1, "HTTP %d: %.300s", status, why);
        else
            set_state(-1, "%.300s (is 'conch serve --listen' running there?)", why);
        R.wsi = NULL;
        return 0;
    }
    case LWS_CALLBACK_CLIENT_ESTABLISHED:
        set_state(1, NULL);
        return 0;
    case LWS_CALLBACK_CLIENT_RECEIVE:
        return on_receive(wsi, in, len);
    case LWS_CALLBACK_CLIENT_WRITEABLE:
        return on_writable(wsi);
    case LWS_CALLBACK_EVENT_WAIT_CANCELLED: {
        /* The reader queued a line or saw the verb's end. */
        if (!R.wsi)
            return 0;
        pthread_mutex_lock(&R.lock);
        bool pending = R.head != NULL, eof = R.verb_eof;
        pthread_mutex_unlock(&R.lock);
        if (pending)
            lws_callback_on_writable(R.wsi);
        else if (eof) {
            lws_close_reason(R.wsi, LWS_CLOSE_STATUS_NORMAL, NULL, 0);
            lws_set_timeout(R.wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_SYNC);
        }
        return 0;
    }
    case LWS_CALLBACK_CLIENT_CLOSED:
    case LWS_CALLBACK_WSI_DESTROY:
        if (wsi == R.wsi) {
            R.wsi = NULL;
            set_state(-1, "the server closed the connection");
        }
        return 0;
    default:
        return 0;
    }
}

static const struct lws_protocols protocols[] = {
    {"conch", callback, 0, 1 << 16, 0, NULL, 0},
    {NULL, NULL, 0, 0, 0, NULL, 0},
};

/* Reads the verb's lines from our end and queues each for the lws thread. */
static void *reader_thread(void *arg)
{
    (void)arg;
    char *line = NULL;
    size_t len = 0, cap = 0;
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(R.fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] != '\n') {
                if (len + 1 > cap) {
                    size_t nc = cap ? cap * 2 : 1 << 12;
                    char *nl = len < MAX_MESSAGE ? realloc(line, nc) : NULL;
                    if (!nl)
                        goto out;
                    line = nl;
                    cap = nc;
                }
                line[len++] = buf[i];
                continue;
            }
            struct msg *m = malloc(sizeof(*m) + len);
            if (!m)
                goto out;
            m->next = NULL;
            m->len = len;
            memcpy(m->data, line, len);
            len = 0;
            pthread_mutex_lock(&R.lock);
            while (R.queued > QUEUE_MAX && !R.ws_gone)
                pthread_cond_wait(&R.cond, &R.lock);
            if (R.ws_gone) {
                pthread_mutex_unlock(&R.lock);
                free(m);
                goto out;
            }
            if (R.tail)
                R.tail->next = m;
            else
                R.head = m;
            R.tail = m;
            R.queued += m->len;
            pthread_mutex_unlock(&R.lock);
            lws_cancel_service(R.ctx);
        }
    }
out:
    free(line);
    pthread_mutex_lock(&R.lock);
    R.verb_eof = true;
    pthread_mutex_unlock(&R.lock);
    lws_cancel_service(R.ctx);
    return NULL;
}

/* Fd 4: the verdict, once. */
static void report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void report(const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(msg) - 1)
        n = (int)sizeof(msg) - 1;
    (void)!write(4, msg, (size_t)n);
    close(4);
}

int conch_cli_remote_bridge(int argc, char **argv)
{
    if (argc != 2 || fcntl(3, F_GETFD) < 0 || fcntl(4, F_GETFD) < 0) {
        fprintf(stderr, "conch-remote __connect: started by conch's client verbs only (URL, and "
                        "fds 3 and 4)\n");
        return CONCH_EXIT_USAGE;
    }
    signal(SIGPIPE, SIG_IGN);
    /* A terminal's Ctrl-C and Ctrl-\ are the verb's, not ours (it sends them on). */
    signal(SIGINT, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    const char *url = argv[1];
    struct conch_err err = {0};
    char path[1024];
    int port;
    if (conch_cli_remote_parse_url(url, R.host, sizeof(R.host), &port, path, sizeof(path), &err) <
        0) {
        report("-%s", err.msg);
        return 1;
    }
    char *tok = getenv("CONCH_TOKEN");
    snprintf(R.token, sizeof(R.token), "%s", tok ? tok : "");
    R.had_token = R.token[0] != '\0';
    if (tok)
        explicit_bzero(tok, strlen(tok));
    unsetenv("CONCH_TOKEN");
    const char *ca = getenv("CONCH_CA");
    if (ca && *ca) {
        if (strlen(ca) >= sizeof(R.ca)) {
            report("-CONCH_CA: path too long");
            return 1;
        }
        X509_STORE *st = X509_STORE_new();
        int ok = st && X509_STORE_load_locations(st, ca, NULL) == 1;
        X509_STORE_free(st);
        if (!ok) {
            report("-cannot load the CA bundle '%s' (CONCH_CA): not a readable PEM file of "
                   "certificates",
                   ca);
            return 1;
        }
        strcpy(R.ca, ca);
    }
    R.fd = 3;

    lws_set_log_level(0, NULL);
    struct lws_context_creation_info info;
    memset(&info, 0, sizeof(info));
    info.port = CONTEXT_PORT_NO_LISTEN;
    info.protocols = protocols;
    info.options = LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT;
    info.gid = (gid_t)-1;
    info.uid = (uid_t)-1;
    info.connect_timeout_secs = 10;
    R.ctx = lws_create_context(&info);
    if (!R.ctx) {
        report("-cannot set up TLS (libwebsockets)");
        return 1;
    }
    char hosthdr[300];
    if (strchr(R.host, ':'))
        snprintf(hosthdr, sizeof(hosthdr), "[%s]:%d", R.host, port);
    else
        snprintf(hosthdr, sizeof(hosthdr), "%s:%d", R.host, port);
    struct lws_client_connect_info cc;
    memset(&cc, 0, sizeof(cc));
    cc.context = R.ctx;
    cc.address = R.host;
    cc.port = port;
    cc.path = path;
    cc.host = hosthdr;
    cc.origin = hosthdr;
    cc.ssl_connection = LCCSCF_USE_SSL;
    cc.protocol = NULL;
    cc.local_protocol_name = "conch";
    cc.pwsi = &R.wsi;
    if (!lws_client_connect_via_info(&cc) && R.state == 0)
        set_state(-1, "cannot connect");
    while (R.state == 0)
        if (lws_service(R.ctx, 0) < 0)
            set_state(-1, "connection failed");
    explicit_bzero(R.token, sizeof(R.token));
    if (R.state != 1) {
        report("-%s", R.error);
        lws_context_destroy(R.ctx);
        return 1;
    }
    pthread_t reader_tid;
    if (pthread_create(&reader_tid, NULL, reader_thread, NULL) != 0) {
        report("-cannot start the remote connection's thread");
        lws_context_destroy(R.ctx);
        return 1;
    }
    report("+");
    /* Until the WebSocket is gone: the verb's end (a close frame once all it said is sent),
     * the server's close, or a failure. */
    for (;;) {
        pthread_mutex_lock(&R.lock);
        bool gone = R.ws_gone;
        pthread_mutex_unlock(&R.lock);
        if ((gone && !R.wsi) || lws_service(R.ctx, 0) < 0)
            break;
    }
    set_state(-1, NULL);
    /* The verb sees the end of its stream; the reader sees it too and ends. */
    shutdown(R.fd, SHUT_RDWR);
    pthread_join(reader_tid, NULL);
    lws_context_destroy(R.ctx);
    free(R.rx);
    return 0;
}
