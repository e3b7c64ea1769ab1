/* super.h - the supervisor: the one driver of the warden protocol, used by `conch run`'s
 * blocking loop and by the daemon's libuv loop alike. Every process the warden starts for a
 * caller is a process object (struct conch_proc) with an operations table; the supervisor
 * routes the warden's events to it and guarantees its final event: `ended` is called exactly
 * once per process, with the real outcome, or a synthetic one when the warden dies or the
 * sandbox is torn down first. The caller polls conch_super_fd() and calls
 * conch_super_dispatch() when it is readable, and conch_super_flush() when it is writable
 * while conch_super_wants_write(): sends to the warden wait in a queue when its socket is
 * full, they never fail with EAGAIN. */
#ifndef CONCH_SUPER_SUPER_H
#define CONCH_SUPER_SUPER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "core/error.h"
#include "jail/jail.h"

/* How a process ended. */
struct conch_proc_end {
    int status;          /* wait status (a synthetic SIGKILL when lost) */
    struct rusage usage; /* of the command and every descendant */
    bool timed_out;      /* its deadline fired */
    bool start_failed;   /* it never ran: see @err */
    struct conch_err err;
    bool lost;       /* no report from its supervisor: @why says what happened instead */
    const char *why; /* lost: a static string ("the sandbox's warden died", ...) */
};

struct conch_proc;

struct conch_proc_ops {
    /* The command runs; @pid is its pid in its own pid namespace. May be NULL. */
    void (*started)(struct conch_proc *p, pid_t pid);
    /* The final event, exactly once. @p is no longer the supervisor's when this is called:
     * the callee may free it. */
    void (*ended)(struct conch_proc *p, const struct conch_proc_end *end);
};

/* A process object, caller-allocated (usually embedded in the caller's own record). */
struct conch_proc {
    const struct conch_proc_ops *ops;
    void *data;         /* the caller's */
    uint64_t pidns_ino; /* once started: its pid namespace's inode (0: unknown) */
    /* private to the supervisor */
    struct conch_super *s;
    int64_t id;
    bool started;
    int pending_signal;
    struct conch_proc *prev, *next;
};

/* One sandbox's supervisor. Caller-allocated; borrows the jail, which must outlive it. */
struct conch_super {
    struct conch_jail *jail;
    int64_t next_id;
    struct conch_proc *live; /* doubly linked, not circular */
    bool gone;               /* the warden is gone: nothing more can start */
    /* Events about ids no process object holds (file requests): may be NULL. */
    void (*other_event)(struct conch_super *s, const struct conch_jail_event *ev);
    /* A send had to wait in the queue: poll for writability too (see conch_super_flush).
     * May be NULL (a driver that asks conch_super_wants_write() before each poll). */
    void (*write_wanted)(struct conch_super *s);
    void *data; /* the caller's */
};

/* conch_super_init - start supervising the (started) jail @j. */
void conch_super_init(struct conch_super *s, struct conch_jail *j);

/* conch_super_fd - the fd to poll for readability (the warden's control socket). */
int conch_super_fd(const struct conch_super *s);

/* conch_super_next_id - a fresh id for a request that is not a process object (file
 * requests: conch_jail_send_file). */
int64_t conch_super_next_id(struct conch_super *s);

/*
 * conch_super_run - start @cmd under @p (whose ops must be set). @timeout_ms (0: none) and
 * @grace_ms are enforced by the warden. Returns 0 (p->ops->ended will be called exactly once)
 * or -errno with @err (it will not).
 */
int conch_super_run(struct conch_super *s, struct conch_proc *p, const struct conch_jail_cmd *cmd,
                    uint64_t timeout_ms, uint64_t grace_ms, struct conch_err *err);

/*
 * conch_super_signal - send @sig to every process of @p. Before the command has started the
 * signal is kept (SIGKILL wins) and sent when it starts. No-op after the end.
 */
void conch_super_signal(struct conch_proc *p, int sig);

/* conch_proc_live - @p was started and has not ended yet. */
bool conch_proc_live(const struct conch_proc *p);

/*
 * conch_super_dispatch - read and route every event waiting on the control socket. Returns 1
 * while the warden lives; 0 when it has just gone, after ending every live process (lost,
 * "the sandbox's warden died"); -1 when supervision had stopped (conch_super_done, maybe
 * from a callback during this call): the caller must not touch the jail.
 */
int conch_super_dispatch(struct conch_super *s);

/* conch_super_wants_write - messages wait for room on the control socket: poll
 * conch_super_fd() for writability and call conch_super_flush() when it is writable. */
bool conch_super_wants_write(const struct conch_super *s);

/*
 * conch_super_flush - send what waits in the queue, as far as the socket takes it. Returns 1
 * while the warden lives (conch_super_wants_write() tells whether more waits); 0 when it has
 * just gone (the send failed), after ending every live process as conch_super_dispatch does;
 * -1 when supervision had stopped.
 */
int conch_super_flush(struct conch_super *s);

/*
 * conch_super_done - end every live process with a synthetic event (lost, @why) and stop
 * supervising. Call before destroying the jail. Idempotent.
 */
void conch_super_done(struct conch_super *s, const char *why);

#endif
