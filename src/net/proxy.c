/* proxy.c - the HTTP proxy of a sandbox in the allow mode, on the owner's libuv loop: it
 * accepts on a listener the warden made inside the sandbox's network namespace (so only the
 * sandbox reaches it), reads one request head, applies the policy, resolves the name itself
 * (the sandbox has no DNS), refuses internal addresses a name resolves to unless a rule names
 * it exactly, connects out and pipes both ways. Every buffer is charged to the sandbox's
 * budget; a side whose peer's write queue is full is not read (backpressure). */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/list.h"
#include "net/net.h"
#include "net/relay.h"

#define HEAD_TIMEOUT_MS 30000
#define CONNECT_TIMEOUT_MS 30000
#define READ_CHUNK (16u << 10) /* a request head's reads */
#define PIPE_CHUNK (64u << 10) /* a pipe's reads: each is its own buffer, written as it is */
#define HOSTS_MAX 4096
#define SPARE_MAX 8
/* Bytes a connection pipes through libuv's reads and writes before it moves to the splice
 * relay (relay.c): small requests stay on the path that costs no setup, a bulk transfer
 * leaves the daemon's memory (two copies per byte fewer). */
#define SPLICE_AFTER (64u << 10)
/* The relay's pipe each way: larger moves a bulk transfer in fewer splices (fewer wakeups
 * and ACKs: 0.29 s of daemon CPU per GB with 1 MiB, 0.33 with 256 KiB, 0.45 with 64 KiB);
 * what it holds is charged to the sandbox while it holds it. */
#define RELAY_PIPE (512u << 10)

struct host_entry {
    char name[CONCH_NET_NAME_MAX + 1];
    struct sockaddr_storage addr;
};

struct conch_net_proxy {
    uv_loop_t *loop;
    uv_tcp_t *listener; /* owned; freed by its close callback */
    struct conch_net_policy policy;
    struct conch_budget *budget;
    struct host_entry *hosts; /* the --net-hosts file, or NULL */
    size_t n_hosts;
    struct conch_net_proxy_ops ops;
    void *ctx;
    struct conch_list conns;
    unsigned n_conns;
    unsigned handles; /* listener + connections not freed yet */
    bool freeing;
    bool public_only; /* no internal address, whatever the rules (a tenant's sandbox) */
    /* Pipe buffers kept for the next read (still charged): a 64 KiB malloc and free per read
     * made glibc trim and grow its heap each time, page faults included. */
    struct wreq *spare[SPARE_MAX];
    unsigned n_spare;
};

/* C_ANSWER: an answer of the proxy's own is being written; the connection ends after it. */
enum conn_state { C_HEAD, C_RESOLVING, C_CONNECTING, C_PIPE, C_ANSWER, C_CLOSING };

/* One direction of a pipe: what was read from @from and is queued on the other side. */
struct side {
    uv_tcp_t tcp;
    bool open, eof, shut;
    size_t queued; /* bytes written to this side and not yet done */
};

struct conn {
    struct conch_list link;
    struct conch_net_proxy *px;
    enum conn_state state;
    struct side client, remote;
    uv_timer_t timer;
    uv_getaddrinfo_t gai;
    uv_connect_t creq;
    uv_shutdown_t shut_client, shut_remote;
    bool resolving, timer_open, recorded;
    bool spliced;    /* the relay carries the bytes; the tcp handles are closed */
    bool splice_off; /* the relay could not start: libuv's reads and writes carry on */
    struct conch_net_relay relay;
    unsigned open_handles;
    char *head; /* the request head (and what came after it) while reading it */
    size_t head_len, head_cap;
    struct conch_net_request req;
    struct conch_net_verdict verdict;
    struct conch_net_record rec;
    uint64_t started_ms;
    uint64_t charged; /* head buffer bytes charged to the budget */
};

/* A write of bytes read from the other side (or made here): the buffer is the request's own,
 * charged to the budget whole (@charged), and counted whole in the side's @queued, so that
 * backpressure bounds what is held, not only what was read. */
struct wreq {
    uv_write_t req;
    struct conn *c;
    struct side *to;
    uint64_t charged;
    char data[];
};

static void conn_close(struct conn *c, const char *error);
static void wreq_free(struct conn *c, struct wreq *w);

/* ---- the hosts file (tests) ---- */

static int load_hosts(struct conch_net_proxy *px, const char *path, struct conch_err *err)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return conch_err_set(err, errno, "network hosts file '%s': %s", path, strerror(errno));
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        char *save = NULL, *addr = strtok_r(line, " \t\r\n", &save);
        if (!addr || addr[0] == '#')
            continue;
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        if (uv_ip4_addr(addr, 0, (struct sockaddr_in *)&ss) != 0 &&
            uv_ip6_addr(addr, 0, (struct sockaddr_in6 *)&ss) != 0)
            continue;
        for (char *n; (n = strtok_r(NULL, " \t\r\n", &save)) && n[0] != '#';) {
            if (px->n_hosts >= HOSTS_MAX || strlen(n) > CONCH_NET_NAME_MAX)
                break;
            struct host_entry *g = realloc(px->hosts, (px->n_hosts + 1) * sizeof(*g));
            if (!g) {
                fclose(f);
                return conch_err_set(err, ENOMEM, "out of memory");
            }
            px->hosts = g;
            struct host_entry *e = &g[px->n_hosts++];
            for (size_t i = 0; i <= strlen(n); i++)
                e->name[i] = (char)tolower((unsigned char)n[i]);
            e->addr = ss;
        }
    }
    fclose(f);
    return 0;
}

/* ---- lifetime ---- */

static void proxy_unref(struct conch_net_proxy *px)
{
    if (--px->handles == 0 && px->freeing) {
        while (px->n_spare) {
            struct wreq *w = px->spare[--px->n_spare];
            conch_budget_uncharge(px->budget, w->charged);
            free(w);
        }
        if (px->ops.closed)
            px->ops.closed(px->ctx);
        conch_net_policy_done(&px->policy);
        free(px->hosts);
        free(px);
    }
}

static void record(struct conn *c)
{
    if (c->recorded || !c->rec.host[0])
        return;
    c->recorded = true;
    c->rec.duration = (double)(conch_clock_ms() - c->started_ms) / 1000.0;
    if (c->px->ops.record && !c->px->freeing)
        c->px->ops.record(c->px->ctx, &c->rec);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    if (--c->open_handles > 0 || c->resolving)
        return;
    struct conch_net_proxy *px = c->px;
    conch_list_del(&c->link);
    px->n_conns--;
    free(c->head);
    conch_budget_uncharge(px->budget, c->charged);
    free(c);
    proxy_unref(px);
}

static void close_handle(struct conn *c, uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, on_handle_closed);
}

/* End @c: its record is made (with @error when it has none), every handle closed. */
static void conn_close(struct conn *c, const char *error)
{
    if (c->state == C_CLOSING)
        return;
    if (error && !c->rec.error[0])
        snprintf(c->rec.error, sizeof(c->rec.error), "%s", error);
    c->state = C_CLOSING;
    record(c);
    if (c->resolving)
        uv_cancel((uv_req_t *)&c->gai);
    if (c->spliced)
        conch_net_relay_close(&c->relay, on_handle_closed);
    close_handle(c, (uv_handle_t *)&c->client.tcp);
    if (c->remote.open)
        close_handle(c, (uv_handle_t *)&c->remote.tcp);
    if (c->timer_open)
        close_handle(c, (uv_handle_t *)&c->timer);
}

/* ---- writing ---- */

static void pipe_resume(struct conn *c);

static void on_written(uv_write_t *req, int status)
{
    struct wreq *w = (struct wreq *)req;
    struct conn *c = w->c;
    w->to->queued -= w->charged;
    wreq_free(c, w);
    if (c->state == C_CLOSING)
        return;
    if (status < 0) {
        conn_close(c, uv_strerror(status));
        return;
    }
    pipe_resume(c);
}

/* A new write request with room for @len bytes, charged; NULL when the budget is full or
 * memory is out. */
static struct wreq *wreq_new(struct conn *c, size_t len)
{
    uint64_t charge = sizeof(struct wreq) + len;
    if (len == PIPE_CHUNK && c->px->n_spare)
        return c->px->spare[--c->px->n_spare];
    if (conch_budget_charge(c->px->budget, charge, NULL) < 0)
        return NULL;
    struct wreq *w = malloc(charge);
    if (!w) {
        conch_budget_uncharge(c->px->budget, charge);
        return NULL;
    }
    w->charged = charge;
    return w;
}

static void wreq_free(struct conn *c, struct wreq *w)
{
    struct conch_net_proxy *px = c->px;
    if (w->charged == sizeof(struct wreq) + PIPE_CHUNK && px->n_spare < SPARE_MAX && !px->freeing) {
        px->spare[px->n_spare++] = w;
        return;
    }
    conch_budget_uncharge(px->budget, w->charged);
    free(w);
}

/* Write @len bytes of @w (taken) to @to. Returns 0 or -1 (closed). */
static int send_wreq(struct conn *c, struct side *to, struct wreq *w, size_t len)
{
    w->c = c;
    w->to = to;
    uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
    int r = uv_write(&w->req, (uv_stream_t *)&to->tcp, &b, 1, on_written);
    if (r < 0) {
        wreq_free(c, w);
        conn_close(c, uv_strerror(r));
        return -1;
    }
    to->queued += w->charged;
    return 0;
}

/* Queue @len bytes of @data on @to; a copy is made and charged. Returns 0 or -1 (closed). */
static int send_bytes(struct conn *c, struct side *to, const char *data, size_t len)
{
    if (len == 0)
        return 0;
    struct wreq *w = wreq_new(c, len);
    if (!w) {
        conn_close(c, "the sandbox's memory budget is full");
        return -1;
    }
    memcpy(w->data, data, len);
    return send_wreq(c, to, w, len);
}

/* Answer the client with @status and a text body, then close. */
static void answer(struct conn *c, int status, const char *reason, const char *body)
{
    char buf[2048];
    int n = snprintf(buf, sizeof(buf),
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                     status, reason, strlen(body), body);
    if (n < 0 || (size_t)n >= sizeof(buf))
        n = snprintf(buf, sizeof(buf), "HTTP/1.1 %d %s\r\nConnection: close\r\n\r\n", status,
                     reason);
    uv_read_stop((uv_stream_t *)&c->client.tcp);
    if (c->state == C_CLOSING || send_bytes(c, &c->client, buf, (size_t)n) < 0)
        return;
    if (c->remote.open)
        uv_read_stop((uv_stream_t *)&c->remote.tcp);
    c->state = C_ANSWER; /* closed once the answer is written: pipe_resume */
}

static void deny(struct conn *c, const char *why)
{
    char body[1400], target[300];
    c->rec.allowed = false;
    snprintf(c->rec.error, sizeof(c->rec.error), "%s", why);
    bool v6 = strchr(c->req.host, ':') != NULL;
    snprintf(target, sizeof(target), "%s%s%s", v6 ? "[" : "", c->req.host, v6 ? "]" : "");
    char rule[320];
    if (c->req.port == 80 || c->req.port == 443)
        snprintf(rule, sizeof(rule), "%s", target);
    else
        snprintf(rule, sizeof(rule), "%s:%u", target, c->req.port);
    snprintf(body, sizeof(body),
             "conch: network access to %s:%u denied: %s.\n"
             "To allow it: --allow %s (conch run, conch create), or for a running sandbox: "
             "conch network SANDBOX --allow %s\n",
             target, c->req.port, why, rule, rule);
    answer(c, 403, "Forbidden", body);
}

/* ---- piping ---- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    (void)suggested;
    static char chunk[READ_CHUNK]; /* one loop, one read at a time: copied out at once */
    *buf = uv_buf_init(chunk, sizeof(chunk));
}

static void on_pipe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

/* A pipe's read goes into a write request of its own: no copy on the way through. */
static void on_pipe_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    struct wreq *w = wreq_new(h->data, PIPE_CHUNK);
    *buf = w ? uv_buf_init(w->data, PIPE_CHUNK) : uv_buf_init(NULL, 0);
}

static void on_relay_bytes(void *ctx, int side, size_t n)
{
    struct conn *c = ctx;
    if (side == 0)
        c->rec.bytes_out += n;
    else
        c->rec.bytes_in += n;
}

static void on_relay_done(void *ctx, const char *error)
{
    conn_close(ctx, error);
}

static const struct conch_net_relay_ops relay_ops = {.bytes = on_relay_bytes,
                                                     .done = on_relay_done};

/* Hand both sockets to the splice relay, when nothing is queued or half-closed (what libuv
 * holds is then nothing): the tcp handles close and the relay polls duplicates of their
 * fds. Returns 0 when it did (or closed @c), -1 when libuv's path carries on. */
static int start_splice(struct conn *c)
{
    uv_os_fd_t a = -1, b = -1;
    int fa = -1, fb = -1;
    if (uv_fileno((uv_handle_t *)&c->client.tcp, &a) < 0 ||
        uv_fileno((uv_handle_t *)&c->remote.tcp, &b) < 0 ||
        (fa = fcntl(a, F_DUPFD_CLOEXEC, 3)) < 0 || (fb = fcntl(b, F_DUPFD_CLOEXEC, 3)) < 0) {
        if (fa >= 0)
            close(fa);
        c->splice_off = true;
        return -1;
    }
    struct conch_err err = {0};
    int r = conch_net_relay_start(&c->relay, c->px->loop, fa, fb, RELAY_PIPE, c->px->budget,
                                  &relay_ops, c, &err);
    c->open_handles += c->relay.polls;
    if (r < 0 && c->relay.polls == 0) {
        c->splice_off = true;
        return -1;
    }
    c->spliced = true;
    uv_read_stop((uv_stream_t *)&c->client.tcp);
    uv_read_stop((uv_stream_t *)&c->remote.tcp);
    close_handle(c, (uv_handle_t *)&c->client.tcp);
    close_handle(c, (uv_handle_t *)&c->remote.tcp);
    if (r < 0)
        conn_close(c, err.msg);
    return 0;
}

/* Read a side while the other's queue has room; stop when it is full. */
static void pipe_resume(struct conn *c)
{
    if (c->state == C_ANSWER && !c->client.queued)
        conn_close(c, NULL);
    if (c->state != C_PIPE || c->spliced)
        return;
    if (!c->splice_off && !c->client.queued && !c->remote.queued && !c->client.eof &&
        !c->remote.eof && !c->client.shut && !c->remote.shut &&
        c->rec.bytes_in + c->rec.bytes_out >= SPLICE_AFTER && start_splice(c) == 0)
        return;
    struct side *sides[2] = {&c->client, &c->remote};
    for (int i = 0; i < 2; i++) {
        struct side *from = sides[i], *to = sides[1 - i];
        if (from->eof)
            continue;
        if (to->queued < CONCH_NET_PIPE_BUF)
            uv_read_start((uv_stream_t *)&from->tcp, on_pipe_alloc, on_pipe_read);
        else
            uv_read_stop((uv_stream_t *)&from->tcp);
    }
    if (c->client.eof && c->remote.eof && !c->client.queued && !c->remote.queued)
        conn_close(c, NULL);
}

static void on_pipe_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    struct wreq *w =
        buf->base ? (struct wreq *)(void *)(buf->base - offsetof(struct wreq, data)) : NULL;
    if (c->state != C_PIPE || n <= 0) {
        if (w)
            wreq_free(c, w);
        if (c->state != C_PIPE || n == 0)
            return;
    }
    bool from_client = s == (uv_stream_t *)&c->client.tcp;
    struct side *from = from_client ? &c->client : &c->remote;
    struct side *to = from_client ? &c->remote : &c->client;
    if (n < 0) {
        if (n == UV_ENOBUFS) {
            conn_close(c, "the sandbox's memory budget is full");
            return;
        }
        if (n != UV_EOF) {
            conn_close(c, uv_strerror((int)n));
            return;
        }
        from->eof = true;
        uv_read_stop(s);
        if (!to->shut) {
            to->shut = true;
            uv_shutdown(from_client ? &c->shut_remote : &c->shut_client, (uv_stream_t *)&to->tcp,
                        NULL);
        }
        pipe_resume(c);
        return;
    }
    if (from_client)
        c->rec.bytes_out += (uint64_t)n;
    else
        c->rec.bytes_in += (uint64_t)n;
    if (send_wreq(c, to, w, (size_t)n) < 0)
        return;
    pipe_resume(c);
}

/* ---- connecting ---- */

/* Whether header line @l (@len bytes, no line end) is one a proxy drops: hop-by-hop ones. */
static bool hop_header(const char *l, size_t len)
{
    /* Host too: the request goes where its target says, and so does its Host (RFC 9112
     * 3.2.2), or a sandbox could reach another site of an allowed server by its Host. */
    static const char *const names[] = {"proxy-connection", "proxy-authorization", "connection",
                                        "keep-alive", "host"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i]);
        if (len > n && l[n] == ':' && !strncasecmp(l, names[i], n))
            return true;
    }
    return false;
}

static void on_connected(uv_connect_t *req, int status)
{
    struct conn *c = req->data;
    if (c->state != C_CONNECTING)
        return; /* closed, or answered (timed out) meanwhile */
    if (status < 0) {
        char why[300];
        snprintf(why, sizeof(why), "connect to %s: %s", c->rec.address, uv_strerror(status));
        snprintf(c->rec.error, sizeof(c->rec.error), "%s", why);
        answer(c, 502, "Bad Gateway", why);
        return;
    }
    uv_timer_stop(&c->timer);
    c->state = C_PIPE;
    const char *rest = c->head + c->req.head_len;
    size_t rest_len = c->head_len - c->req.head_len;
    if (c->req.connect) {
        static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
        if (send_bytes(c, &c->client, ok, sizeof(ok) - 1) < 0)
            return;
    } else {
        /* origin-form request line, the client's headers but the hop-by-hop ones, and
         * Connection: close (one request per upstream connection). */
        size_t cap = c->req.head_len + 64 + sizeof(c->req.host) + 16;
        char *out = malloc(cap);
        if (!out) {
            conn_close(c, "out of memory");
            return;
        }
        size_t n = 0;
        n += (size_t)snprintf(out, cap, "%s ", c->req.method);
        if (c->req.path_len) {
            memcpy(out + n, c->head + c->req.path_off, c->req.path_len);
            n += c->req.path_len;
        } else {
            out[n++] = '/';
        }
        out[n++] = ' ';
        memcpy(out + n, c->head + c->req.version_off, 8);
        n += 8;
        out[n++] = '\r';
        out[n++] = '\n';
        const char *h = c->head + c->req.headers_off, *end = c->head + c->req.head_len;
        while (h < end) {
            const char *nl = memchr(h, '\n', (size_t)(end - h));
            size_t l = (size_t)(nl - h);
            size_t content = l && h[l - 1] == '\r' ? l - 1 : l;
            if (content == 0)
                break;
            if (!hop_header(h, content)) {
                memcpy(out + n, h, content);
                n += content;
                out[n++] = '\r';
                out[n++] = '\n';
            }
            h = nl + 1;
        }
        bool v6 = strchr(c->req.host, ':') != NULL;
        n += (size_t)snprintf(out + n, cap - n, "Host: %s%s%s", v6 ? "[" : "", c->req.host,
                              v6 ? "]" : "");
        if (c->req.port != 80)
            n += (size_t)snprintf(out + n, cap - n, ":%u", c->req.port);
        n += (size_t)snprintf(out + n, cap - n, "\r\nConnection: close\r\n\r\n");
        c->rec.bytes_out += n;
        int r = send_bytes(c, &c->remote, out, n);
        free(out);
        if (r < 0)
            return;
    }
    c->rec.bytes_out += rest_len;
    if (send_bytes(c, &c->remote, rest, rest_len) < 0)
        return;
    free(c->head);
    conch_budget_uncharge(c->px->budget, c->charged);
    c->charged = 0;
    c->head = NULL;
    c->head_len = c->head_cap = 0;
    pipe_resume(c);
}

static void connect_to(struct conn *c, const struct sockaddr *sa)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    uint16_t port = c->req.port;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (sa->sa_family == AF_INET6) {
        memcpy(&ss, sa, sizeof(struct sockaddr_in6));
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(ip));
        snprintf(c->rec.address, sizeof(c->rec.address), "[%s]:%u", ip, port);
    } else {
        memcpy(&ss, sa, sizeof(struct sockaddr_in));
        ((struct sockaddr_in *)&ss)->sin_port = htons(port);
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(ip));
        snprintf(c->rec.address, sizeof(c->rec.address), "%s:%u", ip, port);
    }
    /* The host's own addresses, public ones too, are as internal as its loopback. */
    bool internal = conch_net_addr_internal((struct sockaddr *)&ss) ||
                    conch_net_addr_host((struct sockaddr *)&ss);
    if (internal && c->px->public_only) {
        char why[300];
        snprintf(why, sizeof(why),
                 "%.100s resolves to an internal address (%s): a tenant's sandbox reaches no "
                 "address of the daemon host's own networks (loopback, private, link-local), "
                 "whatever its rules",
                 c->req.host, ip);
        deny(c, why);
        return;
    }
    if (internal && !c->verdict.exact) {
        char why[300];
        snprintf(why, sizeof(why),
                 "%.100s resolves to an internal address (%s), which only a rule naming it exactly "
                 "may reach",
                 c->req.host, ip);
        deny(c, why);
        return;
    }
    if (uv_tcp_init(c->px->loop, &c->remote.tcp) < 0) {
        conn_close(c, "tcp init failed");
        return;
    }
    c->remote.tcp.data = c;
    c->remote.open = true;
    uv_tcp_nodelay(&c->remote.tcp, 1); /* see on_connection */
    c->open_handles++;
    c->state = C_CONNECTING;
    c->creq.data = c;
    int r = uv_tcp_connect(&c->creq, &c->remote.tcp, (struct sockaddr *)&ss, on_connected);
    if (r < 0) {
        snprintf(c->rec.error, sizeof(c->rec.error), "connect: %s", uv_strerror(r));
        answer(c, 502, "Bad Gateway", c->rec.error);
    }
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct conn *c = req->data;
    c->resolving = false;
    if (c->state == C_CLOSING) {
        uv_freeaddrinfo(res);
        if (c->open_handles == 0) { /* every handle closed while we resolved */
            c->open_handles = 1;
            on_handle_closed((uv_handle_t *)&c->client.tcp);
        }
        return;
    }
    if (c->state != C_RESOLVING) { /* answered (timed out) meanwhile */
        uv_freeaddrinfo(res);
        return;
    }
    if (status < 0 || !res) {
        char why[300];
        snprintf(why, sizeof(why), "cannot resolve %.100s: %s", c->req.host, uv_strerror(status));
        snprintf(c->rec.error, sizeof(c->rec.error), "%s", why);
        uv_freeaddrinfo(res);
        answer(c, 502, "Bad Gateway", why);
        return;
    }
    /* The first address: every one is checked when it is tried, so try one. */
    struct addrinfo *ai = res;
    while (ai && ai->ai_family != AF_INET && ai->ai_family != AF_INET6)
        ai = ai->ai_next;
    if (ai)
        connect_to(c, ai->ai_addr);
    else
        answer(c, 502, "Bad Gateway", "no address");
    uv_freeaddrinfo(res);
}

static void on_timeout(uv_timer_t *t)
{
    struct conn *c = t->data;
    if (c->state == C_HEAD)
        conn_close(c, "the request head did not come in time");
    else if (c->state == C_CONNECTING || c->state == C_RESOLVING)
        answer(c, 504, "Gateway Timeout", "the remote host did not answer in time");
}

/* The head is here: decide, then resolve. */
static void head_done(struct conn *c)
{
    struct conch_net_proxy *px = c->px;
    uv_read_stop((uv_stream_t *)&c->client.tcp);
    snprintf(c->rec.host, sizeof(c->rec.host), "%s", c->req.host);
    c->rec.port = c->req.port;
    c->rec.connect = c->req.connect;
    conch_net_policy_check(&px->policy, c->req.host, c->req.port, &c->verdict);
    snprintf(c->rec.rule, sizeof(c->rec.rule), "%s", c->verdict.rule);
    if (!c->verdict.allowed) {
        deny(c, c->verdict.why);
        return;
    }
    c->rec.allowed = true;
    uv_timer_start(&c->timer, on_timeout, CONNECT_TIMEOUT_MS, 0);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (uv_ip4_addr(c->req.host, 0, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(c->req.host, 0, (struct sockaddr_in6 *)&ss) == 0) {
        connect_to(c, (struct sockaddr *)&ss);
        return;
    }
    for (size_t i = 0; i < px->n_hosts; i++) {
        if (!strcmp(px->hosts[i].name, c->req.host)) {
            connect_to(c, (struct sockaddr *)&px->hosts[i].addr);
            return;
        }
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    c->gai.data = c;
    c->state = C_RESOLVING;
    int r = uv_getaddrinfo(px->loop, &c->gai, on_resolved, c->req.host, NULL, &hints);
    if (r < 0) {
        snprintf(c->rec.error, sizeof(c->rec.error), "resolve: %s", uv_strerror(r));
        answer(c, 502, "Bad Gateway", c->rec.error);
        return;
    }
    c->resolving = true;
}

static void on_head_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct conn *c = s->data;
    if (c->state != C_HEAD || n == 0)
        return;
    if (n < 0) {
        conn_close(c, NULL); /* gone before a whole head: nothing to record */
        return;
    }
    size_t need = c->head_len + (size_t)n;
    if (need > CONCH_NET_HEAD_MAX + READ_CHUNK) {
        answer(c, 431, "Request Header Fields Too Large", "request head too long\n");
        return;
    }
    if (need > c->head_cap) {
        size_t cap = c->head_cap ? c->head_cap * 2 : 4096;
        while (cap < need)
            cap *= 2;
        if (conch_budget_charge(c->px->budget, cap - c->head_cap, NULL) < 0) {
            conn_close(c, "the sandbox's memory budget is full");
            return;
        }
        char *g = realloc(c->head, cap);
        if (!g) {
            conch_budget_uncharge(c->px->budget, cap - c->head_cap);
            conn_close(c, "out of memory");
            return;
        }
        c->charged += cap - c->head_cap;
        c->head = g;
        c->head_cap = cap;
    }
    memcpy(c->head + c->head_len, buf->base, (size_t)n);
    c->head_len = need;
    struct conch_err err = {0};
    int r = conch_net_request_parse(c->head, c->head_len, &c->req, &err);
    if (r == 0)
        return;
    if (r < 0) {
        char body[600];
        snprintf(body, sizeof(body), "conch proxy: %s\n", err.msg);
        if (r == -E2BIG)
            answer(c, 431, "Request Header Fields Too Large", body);
        else
            answer(c, 400, "Bad Request", body);
        return;
    }
    head_done(c);
}

static void on_connection(uv_stream_t *server, int status)
{
    struct conch_net_proxy *px = server->data;
    if (status < 0 || px->freeing)
        return;
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->px = px;
    c->started_ms = conch_clock_ms();
    c->rec.at = conch_clock_wall();
    uv_tcp_init(px->loop, &c->client.tcp);
    c->client.tcp.data = c;
    c->client.open = true;
    c->open_handles = 1;
    conch_list_add(&px->conns, &c->link);
    px->n_conns++;
    px->handles++;
    if (uv_accept(server, (uv_stream_t *)&c->client.tcp) < 0) {
        conn_close(c, NULL);
        return;
    }
    /* A relay sends what it got when it got it: the sender applied its own Nagle, and ours
     * on top would hold a small write behind an unacknowledged one (a delayed ACK: 40 ms). */
    uv_tcp_nodelay(&c->client.tcp, 1);
    if (px->n_conns > CONCH_NET_CONNS_MAX) {
        /* A sandbox that opens more connections than the cap gets a refusal, not a queue. */
        c->state = C_CLOSING;
        close_handle(c, (uv_handle_t *)&c->client.tcp);
        return;
    }
    uv_timer_init(px->loop, &c->timer);
    c->timer.data = c;
    c->timer_open = true;
    c->open_handles++;
    uv_timer_start(&c->timer, on_timeout, HEAD_TIMEOUT_MS, 0);
    uv_read_start((uv_stream_t *)&c->client.tcp, on_alloc, on_head_read);
}

/* ---- the API ---- */

int conch_net_proxy_new(uv_loop_t *loop, const struct conch_net_policy *policy,
                        struct conch_budget *budget, const char *hosts_file,
                        const struct conch_net_proxy_ops *ops, void *ctx,
                        struct conch_net_proxy **ret, struct conch_err *err)
{
    struct conch_net_proxy *px = calloc(1, sizeof(*px));
    if (!px)
        return conch_err_set(err, ENOMEM, "out of memory");
    px->loop = loop;
    px->budget = budget;
    px->ctx = ctx;
    if (ops)
        px->ops = *ops;
    CONCH_LIST_INIT(&px->conns);
    px->handles = 1; /* ours, dropped by conch_net_proxy_free */
    int r;
    if ((hosts_file && (r = load_hosts(px, hosts_file, err)) < 0) ||
        (r = conch_net_proxy_set_policy(px, policy, err)) < 0) {
        free(px->hosts);
        free(px);
        return r;
    }
    *ret = px;
    return 0;
}

void conch_net_proxy_set_public_only(struct conch_net_proxy *px, bool on)
{
    px->public_only = on;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct conch_net_proxy *px = h->data;
    free(h);
    proxy_unref(px);
}

int conch_net_proxy_listen(struct conch_net_proxy *px, int fd, struct conch_err *err)
{
    if (px->listener) {
        close(fd);
        return conch_err_set(err, EBUSY, "the network proxy already listens");
    }
    uv_tcp_t *l = malloc(sizeof(*l));
    if (!l) {
        close(fd);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    uv_tcp_init(px->loop, l);
    l->data = px;
    px->listener = l;
    px->handles++;
    int r = uv_tcp_open(l, fd);
    if (r == 0)
        r = uv_listen((uv_stream_t *)l, 128, on_connection);
    if (r < 0) {
        if (uv_fileno((uv_handle_t *)l, &(uv_os_fd_t){0}) != 0)
            close(fd);
        px->listener = NULL;
        uv_close((uv_handle_t *)l, on_listener_closed);
        return conch_err_set(err, -r, "network proxy: listen: %s", uv_strerror(r));
    }
    return 0;
}

int conch_net_proxy_set_policy(struct conch_net_proxy *px, const struct conch_net_policy *policy,
                               struct conch_err *err)
{
    struct conch_net_policy copy;
    int r = conch_net_policy_copy(&copy, policy, err);
    if (r < 0)
        return r;
    conch_net_policy_done(&px->policy);
    px->policy = copy;
    /* What the new policy refuses ends now, not at its next request: a tunnel opened before
     * (CONNECT) carries whatever its client sends for as long as it likes, so a switch to
     * none, or a rule taken back, must close it (the outside attack kept using one). */
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &px->conns)
    {
        struct conn *c = conch_list_entry(pos, struct conn, link);
        if (c->state == C_HEAD || c->state == C_ANSWER || c->state == C_CLOSING)
            continue;
        struct conch_net_verdict v;
        conch_net_policy_check(&px->policy, c->req.host, c->req.port, &v);
        if (!v.allowed) {
            char why[sizeof(c->rec.error)];
            snprintf(why, sizeof(why), "closed: the sandbox's network policy changed (%s)", v.why);
            conn_close(c, why);
        }
    }
    return 0;
}

void conch_net_proxy_each_open(struct conch_net_proxy *px,
                               void (*fn)(void *arg, const struct conch_net_record *rec), void *arg)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &px->conns)
    {
        struct conn *c = conch_list_entry(pos, struct conn, link);
        if (c->recorded || !c->rec.host[0] || c->state == C_CLOSING)
            continue;
        struct conch_net_record rec = c->rec;
        rec.duration = (double)(conch_clock_ms() - c->started_ms) / 1000.0;
        fn(arg, &rec);
    }
}

const struct conch_net_policy *conch_net_proxy_policy(const struct conch_net_proxy *px)
{
    return &px->policy;
}

void conch_net_proxy_free(struct conch_net_proxy *px)
{
    if (!px)
        return;
    px->freeing = true;
    if (px->listener)
        uv_close((uv_handle_t *)px->listener, on_listener_closed);
    px->listener = NULL;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &px->conns)
    {
        conn_close(conch_list_entry(pos, struct conn, link), "the sandbox went away");
    }
    proxy_unref(px);
}

const char *const *conch_net_proxy_env(void)
{
    static const char *const env[] = {
        "HTTP_PROXY=" CONCH_NET_PROXY_URL,
        "HTTPS_PROXY=" CONCH_NET_PROXY_URL,
        "http_proxy=" CONCH_NET_PROXY_URL,
        "https_proxy=" CONCH_NET_PROXY_URL,
        "NO_PROXY=localhost,127.0.0.1,::1",
        "no_proxy=localhost,127.0.0.1,::1",
        "npm_config_proxy=" CONCH_NET_PROXY_URL,
        "npm_config_https_proxy=" CONCH_NET_PROXY_URL,
        "PIP_PROXY=" CONCH_NET_PROXY_URL,
        "GIT_CONFIG_COUNT=1",
        "GIT_CONFIG_KEY_0=http.proxy",
        "GIT_CONFIG_VALUE_0=" CONCH_NET_PROXY_URL,
        NULL,
    };
    return env;
}

json_t *conch_net_record_json(const struct conch_net_record *r)
{
    return json_pack("{s:f,s:s,s:i,s:s,s:b,s:s?,s:s?,s:s?,s:I,s:I,s:f}", "at", r->at, "host",
                     r->host, "port", (int)r->port, "kind", r->connect ? "connect" : "http",
                     "allowed", r->allowed, "rule", r->rule[0] ? r->rule : NULL, "error",
                     r->error[0] ? r->error : NULL, "address", r->address[0] ? r->address : NULL,
                     "bytes_out", (json_int_t)r->bytes_out, "bytes_in", (json_int_t)r->bytes_in,
                     "duration", r->duration);
}
