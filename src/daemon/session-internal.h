/* session-internal.h - what the parts of the sessions module share: the session object and
 * the functions each part offers the others. sessions.c keeps the records, the idle timer, the
 * RPC handlers and the module's state (the session list); session-io.c the terminal's and the
 * control socket's I/O, the scrollback, the capture of a command's output and the timers;
 * session-run.c the shell's life (start, end) and the command queue with its results. Everything
 * runs on the daemon's loop. */
#ifndef CONCH_DAEMON_SESSION_INTERNAL_H
#define CONCH_DAEMON_SESSION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/daemon-internal.h"
#include "exec/output.h"

/* The scrollback of a session that prints is saved at most this often (see records). */
#define SAVE_MS 2000

/* Keys wait in a queue while the terminal's input queue is full (4 KiB in canonical mode, a
 * program that does not read): the loop never blocks on it, and a client gets `limit` past
 * MAX_PENDING_KEYS. */
#define MAX_PENDING_KEYS (1u << 20)

enum sess_state { SS_STARTING, SS_LIVE, SS_ENDED };

struct sclient {
    struct conch_list link;
    struct conch_rpc_sink *sink; /* a reference */
    bool writer;
};

struct srun {
    struct conch_list link;
    struct session *s;
    struct conch_rpc_call *call;
    char *command;
    char *in;
    size_t in_len;
    bool has_in;
    uint64_t timeout_ms, grace_ms;
    size_t max_output;
};

enum { T_NONE, T_DEADLINE, T_GRACE, T_SYNC, T_MARKER, T_BUSY };

struct session {
    struct conch_list link;
    struct daemon *d;
    char id[32];
    char sandbox_id[64];
    json_t *env;
    char *cwd;
    enum sess_state state;
    char end_reason[600];
    char kill_reason[600]; /* why we killed the shell (idle, close), reported at its end */
    int end_code;          /* the shell's exit code, -1 unknown */
    struct conch_proc proc;
    bool proc_live;
    struct conch_bridge_report tools; /* the current command's tool calls, once collected */
    struct conch_rpc_call *open_call; /* session.open, answered once the shell has started */
    unsigned shells;                  /* shells started so far */
    bool new_shell;   /* the shell was restarted after dying: say so in the next result */
    int sock, master; /* -1 when closed */
    uv_poll_t *sock_poll, *master_poll;
    char sockbuf[256];
    size_t socklen;
    char *mpend; /* keys not yet written to the terminal */
    size_t mpend_len, mpend_off;
    uint64_t keys_charged; /* bytes of mpend charged to held_sb's budget */
    char *wpend;           /* control-socket bytes not yet written */
    size_t wpend_len, wpend_off;
    /* scrollback ring: allocated as output comes (ring_size bytes, charged to held_sb's
     * budget) up to ring_cap, or less when the budget has no room; it wraps at ring_size */
    char *ring;
    size_t ring_cap, ring_size, ring_len, ring_pos;
    uint64_t ring_charged;
    /* The sandbox whose budget (sandbox->held) the scrollback and the pending keys are
     * charged to: set at open, cleared (all uncharged) when the sandbox goes
     * (conch_daemon_sessions_sandbox_gone); NULL for a session listed from its record. */
    struct sandbox *held_sb;
    uint64_t seq; /* bytes of output so far */
    unsigned short rows, cols;
    struct conch_list clients;
    /* command mode */
    struct conch_list queue;
    struct srun *cur;
    char nonce[17];
    char mark_s[32], mark_e[64];
    size_t mark_s_len, mark_e_len; /* mark_e: known once the status came (it names N) */
    int phase; /* 0: before the start marker, 1: capturing, 2: end marker seen */
    char carry[64];
    size_t carry_len;
    bool pending_cr;
    struct conch_output cap, nocap;
    bool got_status;
    int status_code;
    /* The status is unknown: the reporter could not run (a "B" line: shell code locked it
     * out), a second status line came, or the shell lost its control channel. */
    bool unknown;
    char unknown_why[200];
    pid_t shell_pid;  /* as we see it: the only process whose lines on the socket count */
    unsigned foreign; /* chunks other processes wrote on the socket (dropped) */
    /* The last bytes of the command's output, held back until its end: under `set -x` the
     * trace of the reporter's call comes right before the end marker and is cut off. */
    char hold[512];
    size_t hold_len;
    bool timed_out, killed_fg, shell_died, synced;
    uint64_t start_ms;
    uv_timer_t *timer;
    int tstage;
    uv_timer_t *idle;
    double idle_timeout;
    double created_at, last_used_at;
    bool closing;
    bool recovered;      /* listed from a record of a previous daemon: nothing runs */
    uint64_t saved_seq;  /* output bytes when the scrollback was last saved */
    uint64_t busy_since; /* a program held the foreground when a command was due (ms) */
    bool scanning;       /* the last result waits for the workspace's changes */
    char u8[4];          /* the start of a UTF-8 character not yet sent to clients */
    size_t u8_len;
    uv_timer_t *save;
    uv_timer_t *eof_timer; /* the control socket closed: is the shell gone too? */
    unsigned eof_shell;
};

/* The session's sandbox, NULL once it is destroyed (looked up each time: a sandbox is freed
 * after its destroy, and a session outlives it as an ended record). */
static inline struct sandbox *sess_sb(struct session *s)
{
    return conch_daemon_sandbox_find(s->d, s->sandbox_id);
}

/* ---- sessions.c: the module's state, clients, records, idle ---- */

/* conch_daemon_session_find - the session named @id, or NULL. */
struct session *conch_daemon_session_find(const char *id);

/* conch_daemon_session_notify_all - send notification @method with @params (taken) to every
 * attached client still connected. */
void conch_daemon_session_notify_all(struct session *s, const char *method, json_t *params);

/* conch_daemon_session_json - what session.list shows of @s, as a new object. */
json_t *conch_daemon_session_json(struct session *s);

/* conch_daemon_session_touch - @s (and its sandbox, whose own idle timer knows nothing of sessions)
 * is in use: restart its idle timer. */
void conch_daemon_session_touch(struct session *s);

/* conch_daemon_session_record - save @s's record and scrollback now (see records in sessions.c). */
void conch_daemon_session_record(struct session *s);

/* conch_daemon_session_on_save - the save timer's callback: saves the scrollback if output came
 * since. */
void conch_daemon_session_on_save(uv_timer_t *t);

/* conch_daemon_session_free - free @s, already off the session list, with no shell alive and its
 * fds closed: its clients' references, timers, scrollback. */
void conch_daemon_session_free(struct session *s);

/* ---- session-io.c: the terminal, the control socket, scrollback, capture, timers ---- */

/* conch_daemon_session_timers_open - a session's four timers (command deadline, idle timeout,
 * record save, EOF grace), each a handle of its own; all or none. Returns 0 or -ENOMEM. */
int conch_daemon_session_timers_open(struct session *s);

/* conch_daemon_session_timers_close - close the timers conch_daemon_session_timers_open made (the
 * handles are freed by the loop). */
void conch_daemon_session_timers_close(struct session *s);

/* conch_daemon_session_close_fds - stop polling and close the terminal's master and the control
 * socket; drop the bytes still queued for either. */
void conch_daemon_session_close_fds(struct session *s);

/* conch_daemon_session_ring_copy - the scrollback in order, as a new buffer (*@ret_len bytes); NULL
 * when out of memory. */
char *conch_daemon_session_ring_copy(const struct session *s, size_t *ret_len);

/* conch_daemon_session_hold_commit - pass the held-back end of the command's output (see
 * hold_strip_trace) to its capture. */
void conch_daemon_session_hold_commit(struct session *s);

/* conch_daemon_session_master_drain - read everything the terminal has (the control socket first
 * while a command waits for its status). Returns false at EOF/EIO (the shell's side is closed). */
bool conch_daemon_session_master_drain(struct session *s);

/* conch_daemon_session_on_master - the terminal master's poll callback (@h->data is the session).
 */
void conch_daemon_session_on_master(uv_poll_t *h, int status, int events);

/* conch_daemon_session_sock_poll_update - poll the control socket for reading, and for writing
 * while bytes wait. */
void conch_daemon_session_sock_poll_update(struct session *s);

/* conch_daemon_session_sock_write - queue @len bytes of @buf (copied) for the shell's control
 * socket and send what it takes now. */
void conch_daemon_session_sock_write(struct session *s, const char *buf, size_t len);

/* conch_daemon_session_master_write - queue @len bytes of @buf (copied) as keys for the terminal
 * and write what it takes now. A @client's keys are charged to the sandbox's budget while they
 * wait (the daemon's own short lines are not). Returns 0, or -errno with @err (may be NULL)
 * filled: -EIO (no terminal), -ENOBUFS (more than MAX_PENDING_KEYS would wait, or the
 * sandbox's budget has no room: the message names it), -ENOMEM. */
int conch_daemon_session_master_write(struct session *s, const char *buf, size_t len, bool client,
                                      struct conch_err *err);

/* conch_daemon_session_uncharge - @s holds nothing more for its sandbox: uncharge its scrollback
 * and pending keys from the sandbox's budget and forget the sandbox (it goes, or @s is freed).
 * A scrollback that never wrapped shrinks to what it holds. */
void conch_daemon_session_uncharge(struct session *s);

/* conch_daemon_session_fg_signal - send @sig to the terminal's foreground process group, never to
 * the shell's own group. Returns what ioctl/kill returned (-1 with errno on failure). */
int conch_daemon_session_fg_signal(struct session *s, int sig);

/* conch_daemon_session_on_timer - the command timer's callback: its stage is @s->tstage (T_*). */
void conch_daemon_session_on_timer(uv_timer_t *t);

/* ---- session-run.c: the shell's life, the command queue, results ---- */

/* conch_daemon_session_shell_start - start a new shell for @s in its sandbox (the session is
 * SS_STARTING until the shell has sent its terminal). Returns 0, or -errno with @err filled. */
int conch_daemon_session_shell_start(struct session *s, struct conch_err *err);

/* conch_daemon_session_pump - start the next queued command when the shell waits for one (a new
 * shell if the last one ended and the sandbox runs). */
void conch_daemon_session_pump(struct session *s);

/* conch_daemon_session_run_finish - build and send the result of the current command (none: nothing
 * happens), then start the next one. */
void conch_daemon_session_run_finish(struct session *s);

/* conch_daemon_session_fail_queue - fail every queued command (not the current one) with @why. */
void conch_daemon_session_fail_queue(struct session *s, const char *why);

/* conch_daemon_session_end - the shell is gone (exit, sandbox destroyed, idle, close): tell every
 * client why. The current command ends with the shell's status; queued ones start a new shell. */
void conch_daemon_session_end(struct session *s, const char *why);

/* conch_daemon_session_set_winsize - give the terminal @s->rows and @s->cols. */
void conch_daemon_session_set_winsize(struct session *s);

#endif
