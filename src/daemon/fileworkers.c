/* fileworkers.c - the daemon side of the persistent file workers: per sandbox, up to
 * FILE_POOL_MAX long-lived fenced workers (forked by the warden like the per-request ones, in
 * its pid namespace, with every fence of a command) that serve fs.* requests one at a time
 * over a stream socket pair (their body, conch_fs_worker_serve, is in src/fs/fs-worker.c). Frames
 * both ways are a native-endian uint64_t length and that many bytes of JSON: the request as the
 * per-request worker reads it from its memfd, the answer as it writes it to its pipe. The daemon
 * side times each request out (CONCH_FILE_TIMEOUT_MS) and kills a worker that dies, hangs or
 * misbehaves; its request fails as a per-request worker's would, and the next request starts a new
 * worker. Each worker is a process object of the supervisor (conch_super_file_server): its
 * final event comes whatever ends it, and a request it held when it died is failed with the
 * reason that event gives. When every worker is busy, files.c forks one for the request. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "fs/fs.h"

#define FILE_POOL_MAX 2
/* Forked workers in flight when every persistent one is busy; past this, requests wait in
 * the pool's queue for a persistent worker (the warden's control socket takes only so many
 * messages at once: a burst of forks overflowed it). */
#define FILE_FORK_MAX 8
/* Requests waiting for a worker; past this, the request is refused (busy). */
#define FILE_QUEUE_MAX 4096
/* Workers in a row that died before their first answer: past this many, the sandbox forks
 * a worker per request again for a while (a pool that cannot start must not fail every
 * request), then tries one more. */
#define FILE_POOL_MAX_FAILURES 3
#define FILE_POOL_RETRY_MS 30000

/* ---- the daemon side ---- */

struct file_pool {
    struct sandbox *sb;
    struct conch_list workers; /* struct fworker */
    unsigned n;
    unsigned failures;
    struct conch_list queue; /* struct queued: requests waiting for a worker, oldest first */
    unsigned queued;
    uint64_t retry_at; /* loop time: after too many failures, no new worker before this */
};

/* Whether @pool may start a worker now. */
static bool pool_may_start(struct file_pool *pool)
{
    if (pool->failures < FILE_POOL_MAX_FAILURES)
        return true;
    uint64_t now = uv_now(&pool->sb->d->loop);
    if (!pool->retry_at) {
        pool->retry_at = now + FILE_POOL_RETRY_MS;
        log_warn("sandbox %s: %u file workers in a row died before answering: a worker is "
                 "forked per request for %d s",
                 pool->sb->id, pool->failures, FILE_POOL_RETRY_MS / 1000);
    }
    if (now < pool->retry_at)
        return false;
    pool->retry_at = 0;
    pool->failures = FILE_POOL_MAX_FAILURES - 1; /* one more try */
    return true;
}

struct queued {
    struct conch_list link;
    struct conch_rpc_call *call;
    char *text;
    uint64_t charged; /* the request's bytes, charged to the sandbox's budget while it waits */
    bool measure, frees;
};

static void pool_next(struct file_pool *pool);

struct fworker {
    struct conch_list link;
    struct file_pool *pool; /* NULL once retired */
    struct conch_proc proc; /* the supervisor's until its final event */
    struct conch_proc_end end;
    uv_pipe_t pipe;
    uv_timer_t timer;
    int handles; /* open libuv handles, and the process until its final event: freed at 0 */
    unsigned served;
    /* the request in flight */
    bool busy;
    struct conch_rpc_call *call;
    bool measure, frees;
    /* its answer */
    unsigned char hdr[8];
    size_t hdr_got;
    char *buf; /* want bytes, charged to the sandbox's budget (sb->held) */
    size_t len, want;
    char scratch[64]; /* where bytes read when no answer is due go */
};

/* A request on its way to a worker: owns the frame, freed when written (or cancelled). */
struct fw_write {
    uv_write_t req;
    uint64_t len; /* the frame's header */
    char *text;
};

static void fw_unref(struct fworker *w)
{
    if (--w->handles == 0) {
        free(w->buf);
        free(w);
    }
}

static void fw_on_closed(uv_handle_t *h)
{
    fw_unref(h->data);
}

static void fw_on_written(uv_write_t *req, int status)
{
    struct fw_write *wr = req->data;
    (void)status; /* a worker that is gone shows as EOF on the read side */
    free(wr->text);
    free(wr);
}

/* Free @w's answer buffer, and its charge: on the loop, while its sandbox is alive. */
static void fw_drop_buf(struct fworker *w, struct sandbox *sb)
{
    if (!w->buf)
        return;
    free(w->buf);
    w->buf = NULL;
    conch_budget_uncharge(&sb->held, w->want);
}

/* Take @w out of its pool, kill it and close its handles. */
static void fw_retire(struct fworker *w, bool kill_it)
{
    struct file_pool *pool = w->pool;
    if (!pool)
        return;
    fw_drop_buf(w, pool->sb);
    conch_list_del(&w->link);
    pool->n--;
    if (!w->served)
        pool->failures++;
    w->pool = NULL;
    if (kill_it)
        conch_super_signal(&w->proc, SIGKILL);
    uv_read_stop((uv_stream_t *)&w->pipe);
    uv_timer_stop(&w->timer);
    uv_close((uv_handle_t *)&w->pipe, fw_on_closed);
    uv_close((uv_handle_t *)&w->timer, fw_on_closed);
}

/* The request in flight ends: its answer (@buf owned, may be NULL: "no answer") goes to be
 * parsed and to its client. */
static void fw_answer(struct fworker *w, char *buf, size_t len)
{
    struct conch_rpc_call *call = w->call;
    w->call = NULL;
    w->busy = false;
    uv_timer_stop(&w->timer);
    conch_daemon_file_answer_queue(w->pool->sb, call, buf, len, buf ? len : 0, w->measure,
                                   w->frees);
    pool_next(w->pool);
}

/* The worker died, hung or misbehaved: fail its request as a per-request worker's would
 * (no answer), and replace it (the next request starts a new one). */
static void fw_fail(struct fworker *w)
{
    struct file_pool *pool = w->pool;
    if (!pool)
        return;
    bool busy = w->busy;
    struct conch_rpc_call *call = w->call;
    w->call = NULL;
    w->busy = false;
    fw_retire(w, true); /* drops the answer's buffer */
    if (busy)
        conch_daemon_file_answer_queue(pool->sb, call, NULL, 0, 0, w->measure, w->frees);
    pool_next(pool);
}

/* The worker died (EOF) with a request in flight: it leaves the pool at once (the next
 * request starts a new one), and its request waits for the final event, which says why. */
static void fw_died(struct fworker *w)
{
    struct file_pool *pool = w->pool;
    w->busy = false;
    free(w->buf);
    w->buf = NULL;
    if (!conch_proc_live(&w->proc)) { /* the event came first */
        conch_daemon_file_fail_ended(w->call, &w->end);
        w->call = NULL;
    }
    fw_retire(w, true);
    pool_next(pool);
}

/* The worker's final event. One still in the pool died unasked (the OOM killer, a SIGKILL
 * from the host, the warden's death): its request fails with the reason, and it is
 * replaced. */
static void fw_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct fworker *w = p->data;
    w->end = *end;
    struct file_pool *pool = w->pool;
    if (pool) {
        w->busy = false;
        free(w->buf);
        w->buf = NULL;
        fw_retire(w, false);
    }
    if (w->call) {
        conch_daemon_file_fail_ended(w->call, end);
        w->call = NULL;
    }
    if (pool && !end->lost)
        pool_next(pool);
    fw_unref(w);
}

static const struct conch_proc_ops fw_ops = {.ended = fw_ended};

static void fw_on_timeout(uv_timer_t *t)
{
    struct fworker *w = t->data;
    log_warn("sandbox %s: a file request ran past %d s: its worker is killed", w->pool->sb->id,
             CONCH_FILE_TIMEOUT_MS / 1000);
    struct file_pool *pool = w->pool;
    struct conch_proc_end end = {.timed_out = true};
    conch_daemon_file_fail_ended(w->call, &end);
    w->call = NULL;
    w->busy = false;
    free(w->buf);
    w->buf = NULL;
    fw_retire(w, true);
    pool_next(pool);
}

static void fw_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct fworker *w = h->data;
    (void)suggested;
    if (!w->busy)
        *buf = uv_buf_init(w->scratch, sizeof(w->scratch));
    else if (w->hdr_got < sizeof(w->hdr))
        *buf = uv_buf_init((char *)w->hdr + w->hdr_got, (unsigned)(sizeof(w->hdr) - w->hdr_got));
    else
        *buf = uv_buf_init(w->buf + w->len, (unsigned)(w->want - w->len));
}

static void fw_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    struct fworker *w = s->data;
    (void)b;
    if (n == 0)
        return;
    if (n < 0 && w->busy) {
        fw_died(w); /* EOF (it died or was killed) or an error */
        return;
    }
    if (n < 0 || !w->busy) {
        /* EOF while idle, or bytes nobody asked for. */
        if (n > 0)
            log_warn("sandbox %s: a file worker wrote out of turn: killed", w->pool->sb->id);
        fw_fail(w);
        return;
    }
    if (w->hdr_got < sizeof(w->hdr)) {
        w->hdr_got += (size_t)n;
        if (w->hdr_got < sizeof(w->hdr))
            return;
        uint64_t want;
        memcpy(&want, w->hdr, sizeof(want));
        if (want > CONCH_FILE_MAX_RESPONSE) {
            struct conch_rpc_call *call = w->call;
            w->call = NULL;
            w->busy = false;
            conch_rpc_call_failf(call, CONCH_RPC_TOO_LARGE, "too_large", NULL,
                                 "the answer is larger than %u bytes", CONCH_FILE_MAX_RESPONSE);
            struct file_pool *pool = w->pool;
            fw_retire(w, true);
            pool_next(pool);
            return;
        }
        /* The answer comes from inside the sandbox: its buffer is charged to the sandbox's
         * budget before it is allocated. One that does not fit fails its request with
         * `limit`; the worker, with a frame half read, is replaced (not counted as a failure
         * to start: it served). */
        struct conch_err err = {0};
        if (conch_budget_charge(&w->pool->sb->held, want, &err) < 0) {
            struct conch_rpc_call *call = w->call;
            w->call = NULL;
            w->busy = false;
            w->served++;
            char size[64];
            snprintf(size, sizeof(size), "of %llu bytes", (unsigned long long)want);
            conch_daemon_file_answer_refuse(call, size, &err);
            struct file_pool *pool = w->pool;
            fw_retire(w, true);
            pool_next(pool);
            return;
        }
        w->want = (size_t)want;
        w->len = 0;
        w->buf = want ? malloc(w->want) : NULL;
        if (want && !w->buf) {
            conch_budget_uncharge(&w->pool->sb->held, want);
            fw_fail(w);
            return;
        }
    } else {
        w->len += (size_t)n;
    }
    if (w->len == w->want) {
        char *buf = w->buf;
        w->buf = NULL;
        w->served++;
        w->pool->failures = 0; /* the pool works: only failures in a row count */
        fw_answer(w, buf, w->len);
    }
}

static struct fworker *fw_start(struct file_pool *pool)
{
    struct sandbox *sb = pool->sb;
    int sp[2];
    struct conch_err err = {0};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
        return NULL;
    struct fworker *w = calloc(1, sizeof(*w));
    if (w) {
        w->proc.ops = &fw_ops;
        w->proc.data = w;
    }
    if (!w || conch_super_file_server(&sb->super, &w->proc, sp[1], &err) < 0) {
        if (w)
            log_warn("sandbox %s: %s", sb->id, err.msg);
        free(w);
        close(sp[0]);
        close(sp[1]);
        pool->failures++;
        return NULL;
    }
    close(sp[1]);
    w->pool = pool;
    uv_pipe_init(&sb->d->loop, &w->pipe, 0);
    uv_timer_init(&sb->d->loop, &w->timer);
    w->pipe.data = w->timer.data = w;
    w->handles = 3; /* the pipe, the timer, the process */
    conch_list_add(&pool->workers, &w->link);
    pool->n++;
    if (uv_pipe_open(&w->pipe, sp[0]) < 0) {
        close(sp[0]);
        fw_retire(w, true);
        return NULL;
    }
    uv_read_start((uv_stream_t *)&w->pipe, fw_alloc, fw_on_read);
    return w;
}

/* A free worker of @pool (starting one if the pool has room), or NULL. */
static struct fworker *pool_free_worker(struct file_pool *pool)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &pool->workers)
    {
        struct fworker *c = conch_list_entry(pos, struct fworker, link);
        if (!c->busy)
            return c;
    }
    if (pool->n >= FILE_POOL_MAX || !pool->sb->jail || !pool_may_start(pool))
        return NULL;
    return fw_start(pool);
}

/* Send @text (owned on success) to @w. */
static int fw_send(struct fworker *w, struct conch_rpc_call *call, char *text, bool measure,
                   bool frees)
{
    struct fw_write *wr = malloc(sizeof(*wr));
    if (!wr) {
        fw_retire(w, true); /* so that a caller's next try does not loop on it */
        return -1;
    }
    wr->req.data = wr;
    wr->len = strlen(text);
    wr->text = text;
    uv_buf_t bufs[2] = {uv_buf_init((char *)&wr->len, sizeof(wr->len)),
                        uv_buf_init(text, (unsigned)wr->len)};
    if (uv_write(&wr->req, (uv_stream_t *)&w->pipe, bufs, 2, fw_on_written) < 0) {
        free(wr);
        fw_retire(w, true);
        return -1;
    }
    w->busy = true;
    w->call = call;
    w->measure = measure;
    w->frees = frees;
    w->hdr_got = 0;
    w->len = w->want = 0;
    uv_timer_start(&w->timer, fw_on_timeout, CONCH_FILE_TIMEOUT_MS, 0);
    return 0;
}

/* Give queued requests to free workers. */
static void pool_next(struct file_pool *pool)
{
    while (!conch_list_empty(&pool->queue)) {
        struct queued *q = conch_list_entry(pool->queue.next, struct queued, link);
        if (conch_rpc_call_cancelled(q->call)) {
            conch_rpc_call_fail(q->call, CONCH_RPC_INTERNAL_ERROR, "internal_error", "cancelled",
                                NULL);
        } else {
            struct fworker *w = pool_free_worker(pool);
            if (!w && pool->n > 0)
                return; /* its turn comes when one is free */
            if (!w || fw_send(w, q->call, q->text, q->measure, q->frees) < 0) {
                if (w && pool->n > 0)
                    continue; /* that one is gone: the next */
                conch_rpc_call_failf(q->call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                                     "no file worker could be started in the sandbox");
            } else {
                q->text = NULL;
            }
        }
        conch_list_del(&q->link);
        pool->queued--;
        conch_budget_uncharge(&pool->sb->held, q->charged);
        free(q->text);
        free(q);
    }
}

static unsigned forked_in_flight(struct sandbox *sb)
{
    unsigned n = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->files) n++;
    return n;
}

bool conch_daemon_file_pool_submit(struct sandbox *sb, struct conch_rpc_call *call, char *text,
                                   bool measure, bool frees)
{
    if (!sb->jail)
        return false;
    struct file_pool *pool = sb->file_pool;
    if (!pool) {
        if (!(pool = calloc(1, sizeof(*pool))))
            return false;
        pool->sb = sb;
        CONCH_LIST_INIT(&pool->workers);
        CONCH_LIST_INIT(&pool->queue);
        sb->file_pool = pool;
    }
    if (strlen(text) > CONCH_FS_MAX_REQUEST)
        return false;
    struct fworker *w = conch_list_empty(&pool->queue) ? pool_free_worker(pool) : NULL;
    if (w && fw_send(w, call, text, measure, frees) == 0)
        return true;
    /* All busy: fork a worker for it, unless many are already forked (then wait in line). */
    if (pool->n == 0 || forked_in_flight(sb) < FILE_FORK_MAX || pool->queued >= FILE_QUEUE_MAX)
        return false;
    /* Requests waiting here (up to FILE_QUEUE_MAX, each up to CONCH_FS_MAX_REQUEST) are held
     * for the sandbox: charged to its budget while they wait, refused past it. */
    uint64_t charge = strlen(text) + sizeof(struct queued);
    struct conch_err err = {0};
    if (conch_budget_charge(&sb->held, charge, &err) < 0) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "a file request of %zu bytes cannot wait for a file worker: %s",
                             strlen(text), err.msg);
        free(text);
        return true;
    }
    struct queued *q = calloc(1, sizeof(*q));
    if (!q) {
        conch_budget_uncharge(&sb->held, charge);
        return false;
    }
    q->charged = charge;
    q->call = call;
    q->text = text;
    q->measure = measure;
    q->frees = frees;
    conch_list_add(&pool->queue, &q->link);
    pool->queued++;
    return true;
}

bool conch_daemon_file_pool_retire_idle(struct sandbox *sb)
{
    struct file_pool *pool = sb->file_pool;
    if (!pool)
        return true;
    if (pool->queued)
        return false;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &pool->workers)
    {
        if (conch_list_entry(pos, struct fworker, link)->busy)
            return false;
    }
    while (!conch_list_empty(&pool->workers)) {
        struct fworker *w = conch_list_entry(pool->workers.next, struct fworker, link);
        w->served++; /* retired, not failed: no count towards the pool's failures */
        fw_retire(w, true);
    }
    return true;
}

void conch_daemon_file_pool_stop(struct sandbox *sb)
{
    struct file_pool *pool = sb->file_pool;
    if (!pool)
        return;
    /* The supervisor was stopped first (conch_super_done): every worker has had its final
     * event, which failed its request and took it out of the pool. What is left had none
     * (a sandbox without a warden). */
    while (!conch_list_empty(&pool->workers)) {
        struct fworker *w = conch_list_entry(pool->workers.next, struct fworker, link);
        if (w->busy && w->call)
            conch_rpc_call_failf(w->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                                 "the file request could not complete: the sandbox stopped");
        w->call = NULL;
        w->busy = false;
        fw_retire(w, false);
    }
    while (!conch_list_empty(&pool->queue)) {
        struct queued *q = conch_list_entry(pool->queue.next, struct queued, link);
        conch_list_del(&q->link);
        conch_rpc_call_failf(q->call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "the file request could not complete: the sandbox stopped");
        conch_budget_uncharge(&sb->held, q->charged);
        free(q->text);
        free(q);
    }
    free(pool);
    sb->file_pool = NULL;
}

/* ---- why a file request failed when its worker ended first ---- */

void conch_daemon_file_fail_ended(struct conch_rpc_call *call, const struct conch_proc_end *end)
{
    if (!call)
        return;
    if (end->start_failed) {
        conch_rpc_call_fail_err(call, 0, NULL, &end->err);
    } else if (end->lost) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "sandbox_stopped", NULL,
                             "the file request could not complete: %s",
                             end->why ? end->why : "the sandbox stopped");
    } else if (end->timed_out) {
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "the file worker in the sandbox gave no answer: the request ran "
                             "past %d s and its worker was killed",
                             CONCH_FILE_TIMEOUT_MS / 1000);
    } else if (WIFSIGNALED(end->status)) {
        int sig = WTERMSIG(end->status);
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "the file worker in the sandbox gave no answer: it was killed by "
                             "signal %d (%s)%s",
                             sig, strsignal(sig),
                             sig == SIGKILL ? ": out of memory, or killed from outside" : "");
    } else {
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "the file worker in the sandbox gave no answer: it exited with "
                             "status %d",
                             WIFEXITED(end->status) ? WEXITSTATUS(end->status) : end->status);
    }
}
