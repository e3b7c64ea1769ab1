/* super.c - the supervisor's state machine: process objects, event routing, pending signals
 * and the guaranteed final event (see super.h). */
#include "super/super.h"

#include <errno.h>
#include <signal.h>
#include <string.h>

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

int64_t conch_super_next_id(struct conch_super *s)
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

int conch_super_run(struct conch_super *s, struct conch_proc *p, const struct conch_jail_cmd *cmd,
                    uint64_t timeout_ms, uint64_t grace_ms, struct conch_err *err)
{
    if (s->gone)
        return conch_err_set(err, EPIPE, "the sandbox's warden is gone");
    p->id = conch_super_next_id(s);
    p->started = false;
    p->pending_signal = 0;
    int r = conch_jail_send_run(s->jail, p->id, cmd, timeout_ms, grace_ms, err);
    if (r < 0)
        return r;
    link_proc(s, p);
    return 0;
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

static void route(struct conch_super *s, const struct conch_jail_event *ev)
{
    struct conch_proc *p = find(s, ev->id);
    if (!p) {
        if (s->other_event)
            s->other_event(s, ev);
        return;
    }
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
        if (r <= 0) {
            s->gone = true;
            end_all(s, "the sandbox's warden died");
            return 0;
        }
        route(s, &ev);
    }
}

int conch_super_flush(struct conch_super *s)
{
    if (s->gone)
        return -1;
    struct conch_err err = {0};
    if (conch_jail_flush(s->jail, &err) < 0) {
        s->gone = true;
        end_all(s, "the sandbox's warden died");
        return 0;
    }
    return 1;
}

void conch_super_done(struct conch_super *s, const char *why)
{
    s->gone = true;
    end_all(s, why);
    /* The jail may outlive us (a sandbox being stopped): nothing may call back into @s. */
    conch_jail_on_queued(s->jail, NULL, NULL);
}
