/* server.c - the daemon's event loop: the listening socket (peer credentials checked) or
 * stdio, one JSON-RPC client per connection, signals, start-up recovery and shutdown. The
 * methods the clients call are methods.c's. */
#include <errno.h>
#include <malloc.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/clock.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/recover.h"
#include "daemon/sessions.h"
#include "daemon/statedir.h"

double conch_daemon_now(void)
{
    return conch_clock_wall();
}

uint64_t conch_daemon_now_ms(void)
{
    return conch_clock_ms();
}

/* Whether @id names one of our sandboxes (pooled, lent or being destroyed included) or jobs. */
static bool id_taken(struct daemon *d, const char *id)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        if (!strcmp(conch_list_entry(pos, struct sandbox, link)->id, id))
            return true;
    }
    conch_list_for_each_safe(pos, tmp, &d->jobs)
    {
        if (!strcmp(conch_list_entry(pos, struct run, dlink)->job_id, id))
            return true;
    }
    return false;
}

void conch_daemon_make_id(struct daemon *d, const char *prefix, char *buf, size_t size)
{
    /* Random, so that no client finds another's sandbox (or job) by guessing: an id made of
     * the time, our pid and a counter was found by trying the few hundred it could be.
     * Unique among ours: a new one is drawn while it names a sandbox we have. */
    for (int tries = 0;; tries++) {
        uint32_t x = 0;
        if (getrandom(&x, sizeof(x), 0) != (ssize_t)sizeof(x)) {
            uint64_t y = ((uint64_t)time(NULL) << 20) ^ ((uint64_t)getpid() << 8) ^ ++d->next_id;
            x = (uint32_t)((y * 0x9e3779b97f4a7c15ULL) >> 32);
        }
        snprintf(buf, size, "%s-%08x", prefix, x);
        if (tries > 8 || !id_taken(d, buf))
            return;
    }
}

void conch_daemon_opts_init(struct conch_daemon_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->max_message = 16u << 20;
    o->pool_size = 4;
    o->max_sandboxes = 256;
    o->idle_timeout = 3600;
    o->max_sandbox_held = 64u << 20;
    o->max_held = 256u << 20;
    o->max_output_memory = 64u << 20;
    o->max_client_output_memory = 128u << 20;
}

void conch_daemon_socket(char *buf, size_t size)
{
    const char *rt = getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        snprintf(buf, size, "/run/conch/conch.sock");
    else if (rt && *rt)
        snprintf(buf, size, "%s/conch/conch.sock", rt);
    else
        snprintf(buf, size, "/tmp/conch-%u/conch.sock", (unsigned)getuid());
}

/* ---- clients ---- */

static void client_send(void *ctx, json_t *msg);

static void client_free_if_done(struct client *c)
{
    if (c->refs > 0)
        return;
    conch_rpc_framer_done(&c->framer);
    bool stdio = c->stdio;
    struct daemon *d = c->d;
    free(c);
    if (stdio && !d->stopping) {
        /* --stdio: the one client is gone, so is the daemon's reason to live. */
        d->stopping = true;
        uv_stop(&d->loop);
    }
}

static void on_client_handle_closed(uv_handle_t *h)
{
    struct client *c = h->data;
    c->refs--;
    client_free_if_done(c);
}

/* Wake every drain waiter: the client drained, or is gone. */
static void client_wake_waiters(struct client *c)
{
    c->congested = false;
    while (!conch_list_empty(&c->drain_waiters)) {
        struct sink_waiter *w = conch_list_entry(c->drain_waiters.next, struct sink_waiter, link);
        conch_daemon_client_sink_wait_cancel(w);
        if (w->cb)
            w->cb(w);
    }
}

void conch_daemon_client_close(struct client *c)
{
    if (c->closing)
        return;
    /* Lines gathered for the end of this loop iteration go now (libuv writes what the
     * socket takes at once): an answer sent just before the close, or before the daemon
     * stops (--stdio at EOF), is not lost. */
    conch_daemon_client_flush(c);
    c->closing = true;
    conch_list_del(&c->link);
    /* Its queue goes with its handle: no longer counted. */
    c->d->clients_queued -= c->counted;
    c->counted = 0;
    client_wake_waiters(c);
    conch_daemon_client_tools_gone(c);
    conch_daemon_sandboxes_client_gone(c->d, c->sink);
    /* Calls still running keep the sink; their late replies are dropped. */
    conch_rpc_sink_close(c->sink);
    c->sink = NULL;
    conch_sb_done(&c->pend);
    uv_close((uv_handle_t *)&c->flush, on_client_handle_closed);
    uv_close((uv_handle_t *)&c->in, on_client_handle_closed);
    if (c->stdio)
        uv_close((uv_handle_t *)&c->out, on_client_handle_closed);
}

struct write_req {
    uv_write_t req;
    struct client *c;
    char *data;
};

/* Bytes of responses libuv holds for @c that the kernel has not taken yet, and those gathered
 * for the end of this loop iteration. */
static size_t client_queued(struct client *c)
{
    return uv_stream_get_write_queue_size((uv_stream_t *)(c->stdio ? &c->out : &c->in)) +
           c->pend.len;
}

/* Count @c's queue as it is now in the daemon-wide total. */
static void client_count_queued(struct client *c)
{
    size_t q = c->closing ? 0 : client_queued(c);
    c->d->clients_queued = c->d->clients_queued - c->counted + q;
    c->counted = q;
}

/* All clients' unread responses together past the daemon's budget: disconnect the clients
 * with the most unread until they fit, as redis's maxmemory-clients evicts its largest
 * clients. A client that reads keeps a short queue (the kernel takes its responses), so the
 * ones that go are those that do not read, whoever added the last byte. */
static void clients_fit_budget(struct daemon *d)
{
    uint64_t max = d->opts.max_client_output_memory;
    while (d->clients_queued + d->answers_building > max) {
        struct client *most = NULL;
        struct conch_list *pos;
        for (pos = d->clients.next; pos != &d->clients; pos = pos->next) {
            struct client *c = conch_list_entry(pos, struct client, link);
            if (!c->closing && c->counted && (!most || c->counted > most->counted))
                most = c;
        }
        /* Past the budget only with the answers being built: a client that reads is not cut
         * off for them (they wait), one that does not is. */
        if (!most || (d->clients_queued <= max && !most->congested))
            return;
        log_warn("client disconnected: %zu bytes of responses unread, the most of any client, "
                 "when all clients' unread responses passed %llu bytes (conch serve "
                 "--max-client-output-memory)",
                 most->counted, (unsigned long long)d->opts.max_client_output_memory);
        conch_daemon_client_close(most);
    }
}

bool conch_daemon_answer_reserve(struct daemon *d, size_t bytes)
{
    if (d->answers_building &&
        d->clients_queued + d->answers_building + bytes > d->opts.max_client_output_memory)
        return false;
    d->answers_building += bytes;
    clients_fit_budget(d);
    return true;
}

void conch_daemon_answer_unreserve(struct daemon *d, size_t bytes)
{
    d->answers_building -= bytes < d->answers_building ? bytes : d->answers_building;
}

static void on_written(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    struct client *c = w->c;
    free(w->data);
    free(w);
    (void)status;
    client_count_queued(c);
    if (c->congested && !c->closing && client_queued(c) <= CLIENT_OUTPUT_SOFT / 2)
        client_wake_waiters(c);
}

bool conch_daemon_client_sink_congested(struct conch_rpc_sink *sink)
{
    struct client *c = conch_rpc_sink_ctx(sink);
    return c && c->congested && !c->closing;
}

bool conch_daemon_client_sink_wait_drain(struct conch_rpc_sink *sink, struct sink_waiter *w)
{
    if (!conch_daemon_client_sink_congested(sink))
        return false;
    if (w->armed)
        return true;
    struct client *c = conch_rpc_sink_ctx(sink);
    w->armed = true;
    conch_list_add(&c->drain_waiters, &w->link);
    return true;
}

void conch_daemon_client_sink_wait_cancel(struct sink_waiter *w)
{
    if (!w->armed)
        return;
    w->armed = false;
    conch_list_del(&w->link);
}

/* After @c's queue grew from @before bytes: its output limits enforced. */
static void client_account(struct client *c, size_t before)
{
    /* libuv writes what the socket takes at once; the rest waits in its queue. */
    size_t queued = client_queued(c);
    if (before > 0 && queued > CLIENT_OUTPUT_HARD) {
        log_warn("client disconnected: %zu bytes of responses unread (output buffer hard limit "
                 "%u bytes)",
                 queued, CLIENT_OUTPUT_HARD);
        conch_daemon_client_close(c);
        return;
    }
    if (queued > CLIENT_OUTPUT_SOFT)
        c->congested = true;
    client_count_queued(c);
    clients_fit_budget(c->d);
}

/* Write @data (taken over, @len bytes of whole lines) to @c's stream. */
static void client_write(struct client *c, char *data, size_t len)
{
    struct write_req *w = calloc(1, sizeof(*w));
    if (!w) {
        free(data);
        return;
    }
    w->data = data;
    w->c = c;
    uv_buf_t buf = uv_buf_init(data, (unsigned)len);
    uv_stream_t *s = (uv_stream_t *)(c->stdio ? &c->out : &c->in);
    if (uv_write(&w->req, s, &buf, 1, on_written) < 0) {
        free(data);
        free(w);
    }
}

void conch_daemon_client_flush(struct client *c)
{
    uv_check_stop(&c->flush);
    if (c->closing || !c->pend.len)
        return;
    size_t len = c->pend.len;
    char *data = conch_sb_take(&c->pend);
    if (data)
        client_write(c, data, len);
    client_count_queued(c);
}

static void on_flush(uv_check_t *h)
{
    struct client *c = h->data;
    uv_idle_stop(&c->d->flush_kick); /* every client's check runs in this same phase */
    conch_daemon_client_flush(c);
}

/* Only its being active matters (the poll does not wait); the flushes stop it. Should none
 * run (the client closed meanwhile), it stops itself the second time round, rather than
 * keeping the loop spinning. */
static void on_flush_kick(uv_idle_t *h)
{
    struct daemon *d = h->data;
    if (d->flush_kick_ran)
        uv_idle_stop(h);
    d->flush_kick_ran = true;
}

/* Send @line (taken over, @len bytes ending in '\n') to @c, enforcing its output limits. A
 * small line is gathered with the others of this loop iteration (written at its end); a
 * large one goes at once, after them. */
static void client_send_line(void *ctx, char *line, size_t len)
{
    struct client *c = ctx;
    if (c->closing) {
        free(line);
        return;
    }
    size_t before = client_queued(c);
    if (len < CLIENT_COALESCE_MAX && c->pend.len + len <= CLIENT_COALESCE_MAX) {
        conch_sb_putn(&c->pend, line, len);
        free(line);
        if (c->pend.oom) {
            log_warn("client disconnected: out of memory for its responses");
            conch_daemon_client_close(c);
            return;
        }
        if (!uv_is_active((uv_handle_t *)&c->flush)) {
            uv_check_start(&c->flush, on_flush);
            c->d->flush_kick_ran = false;
            uv_idle_start(&c->d->flush_kick, on_flush_kick);
        }
    } else {
        conch_daemon_client_flush(c);
        client_write(c, line, len);
    }
    client_account(c, before);
}

static void client_send(void *ctx, json_t *msg)
{
    struct client *c = ctx;
    char *line = c->closing ? NULL : conch_rpc_dumps(msg);
    json_decref(msg);
    if (line)
        client_send_line(c, line, strlen(line));
}

void conch_daemon_client_notify(struct conch_rpc_sink *sink, const char *method, json_t *params)
{
    if (!sink) {
        json_decref(params);
        return;
    }
    json_t *msg = json_pack("{s:s,s:s,s:o}", "jsonrpc", "2.0", "method", method, "params", params);
    if (msg)
        conch_rpc_sink_send(sink, msg);
}

/* The client answered a request of ours (the tool bridge's tool.call / agent.spawn). */
static void on_response(void *ctx, json_t *id, json_t *result, json_t *error)
{
    struct client *c = ctx;
    if (!c->closing)
        conch_daemon_client_tools_response(c, id, result, error);
}

static void on_line(void *ctx, const char *line, size_t len)
{
    struct client *c = ctx;
    if (c->closing)
        return;
    conch_daemon_tenant_dispatch(c, line, len);
}

static void on_oversize(void *ctx)
{
    struct client *c = ctx;
    char msg[128];
    snprintf(msg, sizeof(msg), "message larger than %zu bytes (--max-message)",
             c->d->opts.max_message);
    /* Answered by the request's id wherever it was in the line (the framer scans for it). */
    json_t *id = json_incref(conch_rpc_framer_oversize_id(&c->framer));
    json_t *err = conch_rpc_error(id, CONCH_RPC_INVALID_REQUEST, "message_too_large", msg,
                                  json_pack("{sI}", "limit", (json_int_t)c->d->opts.max_message));
    json_decref(id);
    if (err)
        conch_rpc_sink_send(c->sink, err);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)h;
    static char slab[65536];
    (void)suggested;
    *buf = uv_buf_init(slab, sizeof(slab));
}

static void on_stdout_flushed(uv_shutdown_t *req, int status)
{
    (void)status;
    conch_daemon_client_close(req->data);
}

/* --stdio and stdin closed: the client is gone, and so are its sandboxes. Destroying them
 * kills their commands and answers every request still running (sandbox_stopped), on stdout
 * while it is open; the daemon exits once that is written. */
static void stdio_eof(struct client *c)
{
    struct daemon *d = c->d;
    uv_read_stop((uv_stream_t *)&c->in);
    unsigned running = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
    {
        struct conch_list *r, *rt;
        conch_list_for_each_safe(r, rt, &conch_list_entry(pos, struct sandbox, link)->runs)
            running++;
    }
    if (running > 0)
        log_warn("stdin closed: destroying %u sandbox(es), killing the %u command(s) still "
                 "running in them",
                 d->n_sandboxes, running);
    conch_list_for_each_safe(pos, tmp, &d->sandboxes)
        conch_daemon_sandbox_destroy(conch_list_entry(pos, struct sandbox, link));
    conch_daemon_client_flush(c); /* the answers just gathered, before the shutdown */
    d->stdio_shutdown.data = c;
    if (uv_shutdown(&d->stdio_shutdown, (uv_stream_t *)&c->out, on_stdout_flushed) < 0)
        conch_daemon_client_close(c);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    struct client *c = s->data;
    if (n < 0) {
        if (c->stdio && !c->closing && !c->d->stopping)
            stdio_eof(c);
        else
            conch_daemon_client_close(c);
        return;
    }
    if (n > 0 &&
        conch_rpc_framer_feed(&c->framer, buf->base, (size_t)n, on_line, on_oversize, c) < 0)
        conch_daemon_client_close(c); /* out of memory buffering a partial line */
}

static struct client *client_new(struct daemon *d)
{
    struct client *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->d = d;
    CONCH_LIST_INIT(&c->drain_waiters);
    CONCH_LIST_INIT(&c->out_calls);
    conch_rpc_framer_init(&c->framer, d->opts.max_message);
    c->sink = conch_rpc_sink_new(client_send, c);
    conch_rpc_sink_set_line_sender(c->sink, client_send_line);
    conch_rpc_sink_set_response_handler(c->sink, on_response);
    conch_list_add(&d->clients, &c->link);
    uv_check_init(&d->loop, &c->flush);
    c->flush.data = c;
    return c;
}

/* Whether the peer @pid (SO_PEERCRED's, in our pid namespace) runs in our user namespace. A
 * sandbox's processes run in one of their own, with, unprivileged, our uid: a command that saw
 * the socket (a bind or a workspace holding it) would pass the uid check and drive us (the
 * outside attack created a sandbox with the host's network that way). A peer we cannot see
 * (pid 0: in a pid namespace beside ours, so no sandbox of ours) is let through to the uid
 * check alone; one whose namespace cannot be read (gone, or not ours to look at) is not. */
static bool peer_in_our_user_namespace(pid_t pid)
{
    static ino_t ours;
    struct stat st;
    if (!ours && stat("/proc/self/ns/user", &st) == 0)
        ours = st.st_ino;
    if (pid <= 0 || !ours)
        return true;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
    return stat(path, &st) == 0 && st.st_ino == ours;
}

static void on_connection(uv_stream_t *server, int status)
{
    struct daemon *d = server->data;
    if (status < 0)
        return;
    struct client *c = client_new(d);
    if (!c)
        return;
    uv_pipe_init(&d->loop, &c->in, 0);
    c->in.data = c;
    c->refs = 2; /* the socket, the flush check */
    if (uv_accept(server, (uv_stream_t *)&c->in) < 0) {
        conch_daemon_client_close(c);
        return;
    }
    /* Only our own uid, or root, may drive sandboxes that run as us. */
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (uv_fileno((uv_handle_t *)&c->in, &fd) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        log_warn("refused a connection from uid %u", (unsigned)cred.uid);
        conch_daemon_client_close(c);
        return;
    }
    c->peer_uid = cred.uid;
    if (!peer_in_our_user_namespace(cred.pid)) {
        log_warn("refused a connection from pid %d, in another user namespace (a sandbox's?)",
                 (int)cred.pid);
        conch_daemon_client_close(c);
        return;
    }
    uv_read_start((uv_stream_t *)&c->in, on_alloc, on_read);
}

/* ---- signals and lifecycle ---- */

static void on_sigchld(uv_signal_t *h, int sig)
{
    (void)h;
    (void)sig;
    /* Wardens whose destroy did not wait for the kernel's namespace teardown. */
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
}

static void on_stop_signal(uv_signal_t *h, int sig)
{
    struct daemon *d = h->data;
    log_info("signal %d: shutting down", sig);
    d->stopping = true;
    uv_stop(&d->loop);
}

static void on_pool_timer(uv_timer_t *t)
{
    conch_daemon_pool_fill(t->data);
}

/* Socket activation (sd_listen_fds(3)): when LISTEN_PID is this process and LISTEN_FDS is at
 * least 1, fd 3 is a listening socket the service manager bound (conch.socket). Returns 1 when
 * it was taken, 0 when there is none, or -errno. */
static int listen_activated(struct daemon *d, struct conch_err *err)
{
    const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
    if (!pid || !fds || strtol(pid, NULL, 10) != (long)getpid())
        return 0;
    long n = strtol(fds, NULL, 10);
    /* Not for the processes we start. */
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
    if (n < 1)
        return 0;
    int fd = 3, type = 0, listening = 0;
    struct sockaddr_un sa = {0};
    socklen_t tl = sizeof(type), ll = sizeof(listening), sl = sizeof(sa);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
        getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ll) < 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) < 0 || sa.sun_family != AF_UNIX ||
        type != SOCK_STREAM || !listening)
        return conch_err_set(err, EINVAL,
                             "LISTEN_FDS: fd 3 is not a listening unix stream socket (conch.socket "
                             "must have ListenStream=PATH)");
    for (long i = 0; i < n; i++)
        fcntl(fd + (int)i, F_SETFD, FD_CLOEXEC);
    if (n > 1)
        log_warn("socket activation: %ld sockets passed; serving the first only", n);
    uv_pipe_init(&d->loop, &d->listener, 0);
    d->listener.data = d;
    int r = uv_pipe_open(&d->listener, fd);
    if (r == 0)
        r = uv_listen((uv_stream_t *)&d->listener, 128, on_connection);
    if (r < 0) {
        uv_close((uv_handle_t *)&d->listener, NULL);
        return conch_err_set(err, -r, "listen on the socket from LISTEN_FDS: %s", uv_strerror(r));
    }
    if (sl > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0])
        snprintf(d->socket_path, sizeof(d->socket_path), "%.*s",
                 (int)(sl - offsetof(struct sockaddr_un, sun_path)), sa.sun_path);
    d->listening = d->activated = true;
    return 1;
}

static int listen_socket(struct daemon *d, struct conch_err *err)
{
    int ar = listen_activated(d, err);
    if (ar != 0)
        return ar < 0 ? ar : 0;
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", d->socket_path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        int r = conch_mkdir_p(dir, 0700, err);
        if (r < 0)
            return conch_err_wrap(err, "socket directory");
    }
    /* Before anything is unlinked or bound there: whoever else could write to the
     * directory could swap our socket for theirs. */
    if (conch_daemon_socket_check(d->socket_path, false, err) < 0)
        return -err->code;
    /* A socket left by a dead daemon is replaced; a live one is not. */
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(d->socket_path) >= sizeof(sa.sun_path)) {
        close(probe);
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG, "socket path too long: '%s'",
                              d->socket_path);
    }
    strcpy(sa.sun_path, d->socket_path);
    if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        close(probe);
        return conch_err_set(err, EADDRINUSE, "another daemon is serving '%s'", d->socket_path);
    }
    if (probe >= 0)
        close(probe);
    unlink(d->socket_path);
    uv_pipe_init(&d->loop, &d->listener, 0);
    d->listener.data = d;
    mode_t old = umask(0177);
    int r = uv_pipe_bind(&d->listener, d->socket_path);
    umask(old);
    if (r == 0)
        r = chmod(d->socket_path, 0600) < 0 ? -errno : 0;
    if (r == 0)
        r = uv_listen((uv_stream_t *)&d->listener, 128, on_connection);
    if (r < 0) {
        uv_close((uv_handle_t *)&d->listener, NULL);
        return conch_err_set(err, -r, "listen on '%s': %s", d->socket_path, uv_strerror(r));
    }
    d->listening = true;
    return 0;
}

static int serve_stdio(struct daemon *d, struct conch_err *err)
{
    struct client *c = client_new(d);
    if (!c)
        return conch_err_set(err, ENOMEM, "out of memory");
    c->stdio = true;
    c->peer_uid = geteuid();
    uv_pipe_init(&d->loop, &c->in, 0);
    uv_pipe_init(&d->loop, &c->out, 0);
    c->in.data = c->out.data = c;
    c->refs = 3; /* stdin, stdout, the flush check */
    int r = uv_pipe_open(&c->in, 0);
    if (r == 0)
        r = uv_pipe_open(&c->out, 1);
    if (r < 0) {
        conch_daemon_client_close(c);
        return conch_err_set(err, -r, "serve on stdin/stdout: %s (they must be pipes or sockets)",
                             uv_strerror(r));
    }
    uv_read_start((uv_stream_t *)&c->in, on_alloc, on_read);
    return 0;
}

/* Every sandbox, client, pipe and spill file costs fds: take the hard limit (1024 is the
 * usual soft one). Sandboxes get the original soft limit back (sandbox_spawn). */
static void raise_nofile(struct daemon *d)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    struct rlimit raised = {.rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0)
        d->nofile_orig = rl;
    else
        log_warn("raise the open files limit to %llu: %s", (unsigned long long)rl.rlim_max,
                 strerror(errno));
}

/* Large buffers (file answers, results, diffs: megabytes each) are parsed and built in worker
 * threads, each with a malloc arena of its own. glibc raises its mmap threshold after such a
 * buffer is freed, so the next ones land in the arenas and their memory stays with the
 * process: a fixed threshold keeps every large buffer an mmap, returned when freed. */
static void tune_malloc(void)
{
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    mallopt(M_ARENA_MAX, 4);
}

/* `conch serve --stdio` without --state-dir: a state dir of its own, <default>/stdio/XXXXXX,
 * so any number of them run side by side (each holds its own database lock). It is removed
 * when the daemon exits; `conch gc` removes those whose daemon was killed. */
static int private_state_dir(struct daemon *d, struct conch_err *err)
{
    char parent[PATH_MAX];
    int r, n = snprintf(parent, sizeof(parent), "%s/stdio", d->state_dir);
    if (n < 0 || (size_t)n >= sizeof(parent) - 8)
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if ((r = conch_statedir_prepare(d->state_dir, err)) < 0)
        return r;
    if (mkdir(parent, 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", parent, strerror(errno));
    _cleanup_close_ int fd = open(parent, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return conch_err_set(err, errno, "open '%s': %s (it must be a directory, not a link)",
                             parent, strerror(errno));
    if (st.st_uid != geteuid() || (st.st_mode & 077))
        return conch_err_set(err, EPERM,
                             "'%s' must be owned by uid %u and private (mode 0700): refusing to "
                             "keep sandboxes there",
                             parent, (unsigned)geteuid());
    char dir[PATH_MAX];
    n = snprintf(dir, sizeof(dir), "%s/XXXXXX", parent);
    if (n < 0 || (size_t)n >= sizeof(dir))
        return conch_err_set(err, ENAMETOOLONG, "state directory path too long");
    if (!mkdtemp(dir))
        return conch_err_set(err, errno, "mkdtemp '%s': %s", dir, strerror(errno));
    snprintf(d->state_dir, sizeof(d->state_dir), "%s", dir);
    d->private_state = true;
    return 0;
}

static void private_state_remove(struct daemon *d)
{
    char parent[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", d->state_dir);
    char *slash = strrchr(parent, '/');
    if (!slash)
        return;
    *slash = '\0';
    _cleanup_close_ int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct conch_err err = {0};
    if (pfd < 0 || conch_recover_rm_tree(pfd, slash + 1, d->state_dir, &err) < 0)
        log_warn("remove the private state directory '%s': %s", d->state_dir,
                 pfd < 0 ? strerror(errno) : err.msg);
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

int conch_daemon_run(const struct conch_daemon_opts *o, struct conch_err *err)
{
    struct daemon *d = calloc(1, sizeof(*d));
    if (!d)
        return conch_err_set(err, ENOMEM, "out of memory");
    int r;
    d->opts = *o;
    CONCH_LIST_INIT(&d->clients);
    CONCH_LIST_INIT(&d->sandboxes);
    CONCH_LIST_INIT(&d->jobs);
    CONCH_LIST_INIT(&d->answers_waiting);
    /* The tokens file first: a daemon that cannot hold its tenants to it does not start. */
    if ((r = conch_daemon_tenants_start(d, o->tokens_path, err)) < 0)
        goto out_free;
    conch_budget_init(&d->held_budget, "all sandboxes", o->max_held, NULL);
    conch_budget_set_raise_with(&d->held_budget, "conch serve --max-held");
    conch_budget_init(&d->output_budget, "the daemon's command output", o->max_output_memory, NULL);
    conch_budget_set_raise_with(&d->output_budget, "conch serve --max-output-memory");
    if (o->state_dir)
        snprintf(d->state_dir, sizeof(d->state_dir), "%s", o->state_dir);
    else if ((r = conch_state_default_dir(d->state_dir, sizeof(d->state_dir), err)) < 0)
        goto out_free;
    else if (o->stdio && (r = private_state_dir(d, err)) < 0)
        goto out_free;
    if (o->socket_path)
        snprintf(d->socket_path, sizeof(d->socket_path), "%s", o->socket_path);
    else
        conch_daemon_socket(d->socket_path, sizeof(d->socket_path));
    /* Private (0700): sandboxes reach their upper dirs through staged bind mounts only. */
    char path[PATH_MAX + 32];
    if ((r = conch_statedir_prepare(d->state_dir, err)) < 0)
        goto out_free;
    snprintf(d->spill_dir, sizeof(d->spill_dir), "%s/spill", d->state_dir);
    snprintf(path, sizeof(path), "%s/state.db", d->state_dir);
    if ((r = conch_state_open(path, &d->state, err)) < 0)
        goto out_free;
    /* The loop never sleeps on a lock: this daemon is the database's only writer. */
    if ((r = conch_state_claim(d->state, err)) < 0)
        goto out_state;
    conch_state_set_busy_timeout(d->state, 0);
    raise_nofile(d);
    tune_malloc();

    if ((r = conch_jail_host_prepare(err)) < 0)
        goto out_state;
    if ((r = uv_loop_init(&d->loop)) < 0) {
        r = conch_err_set(err, -r, "uv_loop_init: %s", uv_strerror(r));
        goto out_state;
    }
    struct conch_recover_report report;
    memset(&report, 0, sizeof(report));
    struct conch_err rerr = {0};
    if (conch_recover_reap(d->state, &report, &rerr) < 0)
        log_warn("recovery: %s", rerr.msg);
    conch_daemon_sandboxes_recover(d);
    conch_daemon_sessions_recover(d);

    conch_daemon_tenants_listen(d);
    signal(SIGPIPE, SIG_IGN);
    uv_signal_init(&d->loop, &d->sigchld);
    uv_signal_start(&d->sigchld, on_sigchld, SIGCHLD);
    uv_signal_init(&d->loop, &d->sigterm);
    uv_signal_init(&d->loop, &d->sigint);
    d->sigterm.data = d->sigint.data = d;
    uv_signal_start(&d->sigterm, on_stop_signal, SIGTERM);
    uv_signal_start(&d->sigint, on_stop_signal, SIGINT);
    uv_timer_init(&d->loop, &d->pool_timer);
    d->pool_timer.data = d;
    uv_idle_init(&d->loop, &d->flush_kick);
    d->flush_kick.data = d;

    r = o->stdio ? serve_stdio(d, err) : listen_socket(d, err);
    if (r < 0)
        goto out_loop;
    if (!o->stdio)
        log_info("serving on %s", d->socket_path);
    if (!o->stdio && o->on_listening)
        o->on_listening(o->hook_ctx, d->socket_path);
    if (d->opts.pool_size)
        uv_timer_start(&d->pool_timer, on_pool_timer, 0, 0);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    r = 0;

out_loop:
    d->stopping = true;
    {
        struct conch_list *pos, *tmp;
        conch_list_for_each_safe(pos, tmp, &d->clients)
            conch_daemon_client_close(conch_list_entry(pos, struct client, link));
        conch_list_for_each_safe(pos, tmp, &d->sandboxes)
        {
            struct sandbox *sb = conch_list_entry(pos, struct sandbox, link);
            /* Shutting down kills every sandbox process; the records stay (stopped), except
             * for --stdio, whose sandboxes live as long as its one client. */
            if (d->opts.stdio)
                conch_daemon_sandbox_destroy(sb);
            else
                conch_daemon_sandbox_destroy_keep_record(sb);
        }
    }
    if (d->listening && !d->activated)
        unlink(d->socket_path);
    /* Let the workers finish what holds a sandbox (a scan, a teardown): their completions
     * free it, which needs its handles still open. */
    if (d->listening)
        uv_close((uv_handle_t *)&d->listener, NULL);
    while (d->holds > 0 && uv_run(&d->loop, UV_RUN_ONCE))
        ;
    uv_walk(&d->loop, close_walk, NULL);
    uv_run(&d->loop, UV_RUN_DEFAULT);
    uv_loop_close(&d->loop);
out_state:
    conch_state_close(d->state);
out_free:
    conch_daemon_tenants_stop(d);
    if (d->private_state)
        private_state_remove(d);
    free(d);
    return r;
}
