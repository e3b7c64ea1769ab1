/* super.h - the supervisor: the one driver of the warden protocol, used by `conch run`'s
 * blocking loop and by the daemon's libuv loop alike. Every process the warden starts for a
 * caller is a process object (struct conch_proc) with an operations table: a command, a
 * per-request file worker, a persistent file server or a JS worker. The supervisor routes the
 * warden's events to it and guarantees its final event: `ended` is called exactly once per process,
 * with the real outcome, or a synthetic one when the warden dies or the sandbox is torn down
 * first. The warden's answers to requests (a spawned sandbox's setup, a recycle, an attach)
 * are routed the same way, to a request object (struct conch_super_req) whose `done` is
 * called exactly once. The caller polls conch_super_fd() and calls conch_super_dispatch()
 * when it is readable, and conch_super_flush() when it is writable while
 * conch_super_wants_write(): sends to the warden wait in a queue when its socket is full
 * (up to a cap), they never fail with EAGAIN and nothing waits for an answer. */
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

/* What a process object stands for. */
enum conch_proc_kind {
    CONCH_PROC_COMMAND = 0, /* conch_super_run: a command under its shepherd */
    CONCH_PROC_FILE,        /* conch_super_file: a worker for one file request */
    CONCH_PROC_FILE_SERVER, /* conch_super_file_server: a persistent file worker */
    CONCH_PROC_JS_SERVER,   /* conch_super_js_server: a JS worker (one JS session) */
};

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
    enum conch_proc_kind kind;
    struct conch_super *s;
    int64_t id;
    bool started;
    int pending_signal;
    struct conch_proc *prev, *next;
};

struct conch_super_req;

/* A request the warden answers (not a process): a spawned sandbox's setup, a recycle, an
 * attach. Caller-allocated; the caller owns it, the supervisor holds it from the send until
 * @done. */
struct conch_super_req {
    /* The answer, exactly once: @r 0, or -errno with @err (the warden's error; a synthetic
     * one when the warden dies or supervision stops first). @q is no longer the
     * supervisor's when this is called. */
    void (*done)(struct conch_super_req *q, int r, const struct conch_err *err);
    void *data; /* the caller's */
    /* private to the supervisor */
    enum conch_jail_answer_kind kind;
    struct conch_super *s;
    struct conch_super_req *next;
};

/* One sandbox's supervisor. Caller-allocated; borrows the jail, which must outlive it. */
struct conch_super {
    struct conch_jail *jail;
    int64_t next_id;
    struct conch_proc *live; /* doubly linked, not circular */
    /* requests awaiting the warden's answer, oldest first (it answers in order) */
    struct conch_super_req *reqs, *reqs_tail;
    bool gone;    /* the warden is gone, or supervision stopped: nothing more can start */
    bool stopped; /* conch_super_done was called */
    /* A send had to wait in the queue: poll for writability too (see conch_super_flush).
     * May be NULL (a driver that asks conch_super_wants_write() before each poll). */
    void (*write_wanted)(struct conch_super *s);
    void *data; /* the caller's */
};

/* conch_super_init - start supervising the (started) jail @j. */
void conch_super_init(struct conch_super *s, struct conch_jail *j);

/* conch_super_fd - the fd to poll for readability (the warden's control socket). */
int conch_super_fd(const struct conch_super *s);

/*
 * conch_super_run - start @cmd under @p (whose ops must be set). @timeout_ms (0: none) and
 * @grace_ms are enforced by the warden. Returns 0 (p->ops->ended will be called exactly once)
 * or -errno with @err (it will not).
 */
int conch_super_run(struct conch_super *s, struct conch_proc *p, const struct conch_jail_cmd *cmd,
                    uint64_t timeout_ms, uint64_t grace_ms, struct conch_err *err);

/*
 * conch_super_file - start a worker for one file request under @p (whose ops must be set):
 * conch_jail_send_file with @req_fd, @resp_fd (borrowed) and the warden's deadline
 * @timeout_ms. The answer comes through @resp_fd's peer; p->ops->ended comes once the
 * warden has reaped the worker (end->status its wait status, end->timed_out when the
 * deadline killed it), or with start_failed, or lost (the warden died, conch_super_done).
 * Returns 0 (ended will be called exactly once) or -errno with @err (it will not).
 *
 * conch_super_file_server - start a persistent file worker under @p on @sock (borrowed):
 * conch_jail_send_file_server. Its final event comes whatever ends it: EOF on @sock, a
 * conch_super_signal, the OOM killer, a SIGKILL from the host, the warden's death. Same
 * return convention.
 *
 * Both are started at once as far as signals go (conch_super_signal sends at once).
 */
int conch_super_file(struct conch_super *s, struct conch_proc *p, int req_fd, int resp_fd,
                     uint64_t timeout_ms, struct conch_err *err);
/* conch_super_file_data - conch_super_file lending the worker @data_fd too (borrowed; -1:
 * none): conch_jail_send_file_data. */
int conch_super_file_data(struct conch_super *s, struct conch_proc *p, int req_fd, int resp_fd,
                          int data_fd, uint64_t timeout_ms, struct conch_err *err);
int conch_super_file_server(struct conch_super *s, struct conch_proc *p, int sock,
                            struct conch_err *err);

/*
 * conch_super_js_server - start a JS worker (one JS session: conch_js_worker_serve) under
 * @p on @sock (borrowed): conch_jail_send_js_server. Fenced, started and ended as a file
 * server; same return convention.
 */
int conch_super_js_server(struct conch_super *s, struct conch_proc *p, int sock,
                          struct conch_err *err);

/*
 * conch_super_await_setup - @s's jail was spawned (conch_jail_spawn): route the warden's
 * setup answer to @q (applied with conch_jail_take_answer first). Call before any other
 * request.
 *
 * conch_super_recycle - conch_jail_send_recycle, its answer routed to @q.
 *
 * conch_super_attach - conch_jail_send_attach (arguments as there), its answer routed to @q
 * (the jail knows the attached upper dir by then). The attach is queued in order with the
 * sends before it: nothing is refused because others wait.
 *
 * Each returns 0 (@q->done will be called exactly once) or -errno with @err (it will not).
 */
void conch_super_await_setup(struct conch_super *s, struct conch_super_req *q);
int conch_super_recycle(struct conch_super *s, struct conch_super_req *q, struct conch_err *err);
int conch_super_attach(struct conch_super *s, struct conch_super_req *q, const char *workspace,
                       dev_t ws_dev, ino_t ws_ino, enum conch_ws_mode mode, uint64_t disk_bytes,
                       struct conch_err *err);
/* conch_super_attach_stack - conch_jail_send_attach_stack (a fork served by a pool sandbox),
 * its answer routed to @q; same return convention. */
int conch_super_attach_stack(struct conch_super *s, struct conch_super_req *q,
                             const struct conch_jail_restack *rs, dev_t ws_dev, ino_t ws_ino,
                             struct conch_err *err);

/*
 * conch_super_release, conch_super_restack - conch_jail_send_release and conch_jail_send_restack
 * (a snapshot without a restart), their answers routed to @q; same return convention.
 *
 * conch_super_await - read and route the warden's events (blocking, at most @timeout_ms) until
 * @q is answered: for a caller that sends nothing else meanwhile (the restack's two steps,
 * each a few hundred microseconds of the warden's). Every other event is routed as
 * conch_super_dispatch does. Returns whether @q was answered (else it is still pending, or
 * the warden is gone and @q was failed).
 */
int conch_super_release(struct conch_super *s, struct conch_super_req *q, struct conch_err *err);
int conch_super_restack(struct conch_super *s, struct conch_super_req *q,
                        const struct conch_jail_restack *rs, struct conch_err *err);
bool conch_super_await(struct conch_super *s, struct conch_super_req *q, int timeout_ms);

/* conch_super_req_pending - @q was sent and has not been answered yet. */
bool conch_super_req_pending(const struct conch_super_req *q);

/*
 * conch_super_signal - send @sig to every process of @p. Before the command has started the
 * signal is kept (SIGKILL wins) and sent when it starts. No-op after the end.
 */
void conch_super_signal(struct conch_proc *p, int sig);

/* conch_proc_live - @p was started and has not ended yet. */
bool conch_proc_live(const struct conch_proc *p);

/*
 * conch_super_dispatch - read and route every event and answer waiting on the control socket.
 * Returns 1 while the warden lives; 0 when it has just gone, after ending every live process
 * (lost, "the sandbox's warden died") and failing every pending request; -1 when supervision
 * had stopped (conch_super_done, maybe from a callback during this call): the caller must
 * not touch the jail.
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
 * conch_super_done - end every live process with a synthetic event (lost, @why), fail every
 * pending request (EPIPE, @why) and stop supervising. Call before destroying the jail.
 * Idempotent.
 */
void conch_super_done(struct conch_super *s, const char *why);

#endif
