/* super.c - the supervisor's state machine: process objects (commands, file workers, file
 * servers), requests awaiting the warden's answer, event routing, pending signals and the
 * guaranteed final event (see super.h). */
#include "super/super.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"

static void on_queued(void *data)
{
    struct conch_super *s = data;
    if (s->write_wanted)
        s->write_wanted(s);
}

void conch_super_init(struct conch_super *s, struct conch_jail *j)
{
    memset(s, 0, sizeof(*s));
    s->jail = j;
    conch_jail_on_queued(j, on_queued, s);
}

bool conch_super_wants_write(const struct conch_super *s)
{
    return !s->gone && conch_jail_wants_write(s->jail);
}

int conch_super_fd(const struct conch_super *s)
{
    return conch_jail_ctl_fd(s->jail);
}

static int64_t next_id(struct conch_super *s)
{
    return ++s->next_id;
}

static void link_proc(struct conch_super *s, struct conch_proc *p)
{
    p->s = s;
    p->prev = NULL;
    p->next = s->live;
    if (s->live)
        s->live->prev = p;
    s->live = p;
}

static void unlink_proc(struct conch_proc *p)
{
    struct conch_super *s = p->s;
    if (p->prev)
        p->prev->next = p->next;
    else
        s->live = p->next;
    if (p->next)
        p->next->prev = p->prev;
    p->prev = p->next = NULL;
    p->s = NULL;
}

bool conch_proc_live(const struct conch_proc *p)
{
    return p->s != NULL;
}

/* The process object @p starts as request @id: it is ours until its final event. */
static void proc_begin(struct conch_super *s, struct conch_proc *p, enum conch_proc_kind kind,
                       int64_t id)
{
    p->kind = kind;
    p->id = id;
    /* A file worker is forked as the warden reads its request: a signal sent after it
     * reaches it (the warden reads in order), so there is nothing to wait for. */
    p->started = kind != CONCH_PROC_COMMAND;
    p->pending_signal = 0;
    link_proc(s, p);
}

int conch_super_run(struct conch_super *s, struct conch_proc *p, const struct conch_jail_cmd *cmd,
                    uint64_t timeout_ms, uint64_t grace_ms, struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int64_t id = next_id(s);
    int r = conch_jail_send_run(s->jail, id, cmd, timeout_ms, grace_ms, err);
    if (r < 0)
        return r;
    proc_begin(s, p, CONCH_PROC_COMMAND, id);
    return 0;
}

int conch_super_file(struct conch_super *s, struct conch_proc *p, int req_fd, int resp_fd,
                     uint64_t timeout_ms, struct conch_err *err)
{
    return conch_super_file_data(s, p, req_fd, resp_fd, -1, timeout_ms, err);
}

int conch_super_file_data(struct conch_super *s, struct conch_proc *p, int req_fd, int resp_fd,
                          int data_fd, uint64_t timeout_ms, struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int64_t id = next_id(s);
    int r = conch_jail_send_file_data(s->jail, id, req_fd, resp_fd, data_fd, timeout_ms, err);
    if (r < 0)
        return r;
    proc_begin(s, p, CONCH_PROC_FILE, id);
    return 0;
}

int conch_super_file_server(struct conch_super *s, struct conch_proc *p, int sock,
                            struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int64_t id = next_id(s);
    int r = conch_jail_send_file_server(s->jail, id, sock, err);
    if (r < 0)
        return r;
    proc_begin(s, p, CONCH_PROC_FILE_SERVER, id);
    return 0;
}

int conch_super_js_server(struct conch_super *s, struct conch_proc *p, int sock,
                          struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int64_t id = next_id(s);
    int r = conch_jail_send_js_server(s->jail, id, sock, err);
    if (r < 0)
        return r;
    proc_begin(s, p, CONCH_PROC_JS_SERVER, id);
    return 0;
}

/* ---- requests the warden answers ---- */

static void req_begin(struct conch_super *s, struct conch_super_req *q,
                      enum conch_jail_answer_kind kind)
{
    q->kind = kind;
    q->s = s;
    q->next = NULL;
    if (s->reqs_tail)
        s->reqs_tail->next = q;
    else
        s->reqs = q;
    s->reqs_tail = q;
}

/* The oldest pending request, taken out of the list (NULL: none). */
static struct conch_super_req *req_pop(struct conch_super *s)
{
    struct conch_super_req *q = s->reqs;
    if (!q)
        return NULL;
    s->reqs = q->next;
    if (!s->reqs)
        s->reqs_tail = NULL;
    q->next = NULL;
    q->s = NULL;
    return q;
}

bool conch_super_req_pending(const struct conch_super_req *q)
{
    return q->s != NULL;
}

void conch_super_await_setup(struct conch_super *s, struct conch_super_req *q)
{
    req_begin(s, q, CONCH_JAIL_ANSWER_SETUP);
}

int conch_super_recycle(struct conch_super *s, struct conch_super_req *q, struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int r = conch_jail_send_recycle(s->jail, err);
    if (r < 0)
        return r;
    req_begin(s, q, CONCH_JAIL_ANSWER_RECYCLE);
    return 0;
}

int conch_super_attach(struct conch_super *s, struct conch_super_req *q, const char *workspace,
                       dev_t ws_dev, ino_t ws_ino, enum conch_ws_mode mode, uint64_t disk_bytes,
                       struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int r = conch_jail_send_attach(s->jail, workspace, ws_dev, ws_ino, mode, disk_bytes, err);
    if (r < 0)
        return r;
    req_begin(s, q, CONCH_JAIL_ANSWER_ATTACH);
    return 0;
}

int conch_super_attach_stack(struct conch_super *s, struct conch_super_req *q,
                             const struct conch_jail_restack *rs, dev_t ws_dev, ino_t ws_ino,
                             struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int r = conch_jail_send_attach_stack(s->jail, rs, ws_dev, ws_ino, err);
    if (r < 0)
        return r;
    req_begin(s, q, CONCH_JAIL_ANSWER_ATTACH);
    return 0;
}

int conch_super_release(struct conch_super *s, struct conch_super_req *q, struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int r = conch_jail_send_release(s->jail, err);
    if (r < 0)
        return r;
    req_begin(s, q, CONCH_JAIL_ANSWER_RESTACK);
    return 0;
}

int conch_super_restack(struct conch_super *s, struct conch_super_req *q,
                        const struct conch_jail_restack *rs, struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    int r = conch_jail_send_restack(s->jail, rs, err);
    if (r < 0)
        return r;
    req_begin(s, q, CONCH_JAIL_ANSWER_RESTACK);
    return 0;
}

bool conch_super_await(struct conch_super *s, struct conch_super_req *q, int timeout_ms)
{
    uint64_t until = conch_clock_ms() + (uint64_t)timeout_ms;
    while (conch_super_req_pending(q) && !s->gone) {
        uint64_t now = conch_clock_ms();
        if (now >= until)
            return false;
        struct pollfd p = {.fd = conch_super_fd(s),
                           .events = POLLIN | (conch_super_wants_write(s) ? POLLOUT : 0)};
        int n = poll(&p, 1, (int)(until - now));
        if (n < 0 && errno != EINTR)
            return false;
        if (n <= 0)
            continue;
        if ((p.revents & POLLOUT) && conch_super_flush(s) <= 0)
            break;
        if ((p.revents & (POLLIN | POLLHUP | POLLERR)) && conch_super_dispatch(s) <= 0)
            break;
    }
    return !conch_super_req_pending(q);
}

/* Fail every pending request with @why (popped one at a time: a callback may stop us). */
static void fail_reqs(struct conch_super *s, const char *why)
{
    struct conch_super_req *q;
    while ((q = req_pop(s))) {
        struct conch_err err = {0};
        int r = conch_err_set(&err, EPIPE, "%s", why);
        q->done(q, r, &err);
    }
}

/* The warden's answer @ev goes to the oldest pending request. */
static void route_answer(struct conch_super *s, struct conch_jail_event *ev)
{
    struct conch_super_req *q = req_pop(s);
    if (!q) {
        if (ev->answer_fd >= 0)
            close(ev->answer_fd); /* nobody asked: dropped */
        if (ev->answer_net_fd >= 0)
            close(ev->answer_net_fd);
        return;
    }
    struct conch_err err = {0};
    int r = conch_jail_take_answer(s->jail, q->kind, ev, &err);
    q->done(q, r, &err);
}

void conch_super_signal(struct conch_proc *p, int sig)
{
    if (!p->s || p->s->gone)
        return;
    if (!p->started) {
        if (p->pending_signal != SIGKILL)
            p->pending_signal = sig;
        return;
    }
    conch_jail_send_signal(p->s->jail, p->id, sig, NULL);
}

static void end_proc(struct conch_proc *p, const struct conch_proc_end *end)
{
    unlink_proc(p);
    p->ops->ended(p, end);
}

static struct conch_proc *find(struct conch_super *s, int64_t id)
{
    for (struct conch_proc *p = s->live; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

static void route(struct conch_super *s, struct conch_jail_event *ev)
{
    if (ev->type == CONCH_JAIL_ANSWER) {
        route_answer(s, ev);
        return;
    }
    /* An id no process holds: a duplicate end (a shepherd and the warden both reported). */
    struct conch_proc *p = find(s, ev->id);
    if (!p)
        return;
    struct conch_proc_end end;
    memset(&end, 0, sizeof(end));
    switch (ev->type) {
    case CONCH_JAIL_STARTED:
        p->started = true;
        p->pidns_ino = ev->pidns_ino;
        if (p->ops->started)
            p->ops->started(p, ev->pid);
        if (p->pending_signal) {
            conch_jail_send_signal(s->jail, p->id, p->pending_signal, NULL);
            p->pending_signal = 0;
        }
        return;
    case CONCH_JAIL_ANSWER:
        return; /* routed above */
    case CONCH_JAIL_START_FAILED:
        end.start_failed = true;
        end.err = ev->err;
        break;
    case CONCH_JAIL_EXITED:
        end.status = ev->status;
        end.usage = ev->usage;
        end.timed_out = ev->timed_out;
        if (ev->lost) {
            end.lost = true;
            end.why = "the command's supervisor was killed (out of memory?)";
        }
        /* A file worker's status is its own: killed is killed, by whatever. */
        break;
    }
    end_proc(p, &end);
}

static void end_all(struct conch_super *s, const char *why)
{
    struct conch_proc_end end;
    memset(&end, 0, sizeof(end));
    end.status = SIGKILL;
    end.lost = true;
    end.why = why;
    while (s->live)
        end_proc(s->live, &end);
}

/* The warden is gone: every live process ends, every pending request fails. Returns what
 * conch_super_dispatch and conch_super_flush return then. */
static int warden_gone(struct conch_super *s)
{
    static const char why[] = "the sandbox's warden died";
    s->gone = true;
    end_all(s, why);
    fail_reqs(s, why);
    return s->stopped ? -1 : 0;
}

int conch_super_dispatch(struct conch_super *s)
{
    if (s->gone)
        return -1;
    for (;;) {
        struct conch_jail_event ev;
        if (s->gone)
            return -1; /* conch_super_done was called from a callback */
        struct conch_err err = {0};
        int r = conch_jail_read_event(s->jail, &ev, &err);
        if (r == -EAGAIN)
            return 1;
        if (r <= 0)
            return warden_gone(s);
        route(s, &ev);
    }
}

int conch_super_flush(struct conch_super *s)
{
    if (s->gone)
        return -1;
    struct conch_err err = {0};
    if (conch_jail_flush(s->jail, &err) < 0)
        return warden_gone(s);
    return 1;
}

void conch_super_done(struct conch_super *s, const char *why)
{
    s->gone = s->stopped = true;
    end_all(s, why);
    fail_reqs(s, why);
    /* The jail may outlive us (a sandbox being stopped): nothing may call back into @s. */
    conch_jail_on_queued(s->jail, NULL, NULL);
}
