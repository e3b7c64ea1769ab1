/* session-run.c - a session's shell and its commands: starting the shell (the pty's master
 * comes from jail/session-child.c), its start and end (the supervisor's events), the queue of
 * session.run commands typed one at a time, and their results.
 *
 * Command mode (session.run): the shell is bash, started with an init script that defines a
 * reporter and locks it (read-only functions, no `enable`). For each command we write its
 * text, preceded by a fresh random nonce, on the session's control socket (fd 62 in the
 * shell), then type one line on the pty: `\__conch_b&&\builtin eval "$__conch_c"</dev/null
 * 62>&-;\__conch_e "$?"`. __conch_b reads the record and prints a start marker
 * \e]697;S<nonce>\a; the eval runs the command at top level (so cd, exports, functions,
 * aliases, options and `declare` persist); __conch_e sends "E - <R> <status>" on the socket,
 * R drawn after the command, then prints the end marker \e]697;E<R>\a. A command ends when
 * both the status (socket) and the end marker (terminal, so that everything it printed
 * before is read) are in; or when the shell dies (the supervisor's final event, with the
 * real wait status: `exit`, `exec`, `set -e`). Output is what the terminal showed between
 * the two markers (session-io.c reads both). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "core/fdpass.h"
#include "core/log.h"
#include "daemon/session-internal.h"
#include "exec/result.h"
#include "exec/run.h"

/* How long a command waits for a program in the terminal's foreground (typed by a person) to
 * end before it is refused with session_busy. */
#define BUSY_WAIT_MS 2000

/* The init script, run by the shell before its first prompt (PROMPT_COMMAND from the
 * environment: the shell runs with --norc, and a rcfile it would have to open by path, which
 * a pipe or memfd of ours would not allow). It defines the reporter before any code of the
 * user's runs (the rc files come last) and locks it: read-only functions (none can be
 * redefined or unset), no `enable` any more (no builtin can be disabled, no loadable
 * loaded), no `bind` and a read-only INPUTRC (/dev/null: no readline macro can rewrite the
 * line we type). Each reporter function first enters posix mode by an assignment (no name is
 * looked up) to remove a function named `builtin` with the special builtin `unset` (which
 * no function can shadow in posix mode), so that every `builtin X` after it is the real one,
 * and puts back the options posix mode touched. Whatever it cannot do (a read-only
 * POSIXLY_CORRECT, `builtin` or __conch_c) it reports as "B <nonce|-> <why>" through an
 * expansion error (${__conch_q:?...}: bash prints the message itself, no command is looked
 * up) and the line is abandoned. The socket carries, per command, the record
 * "<r|i><nonce>\n<command>\0[stdin\0]" (__conch_b skips anything else: what a sync left).
 * The status line is "E - <R> <status>", R a random number drawn after the command, which
 * the end marker carries too. See "Sessions" in docs/ARCHITECTURE.md. */
static const char init_script[] =
    "unset PROMPT_COMMAND __conch_init\n"
    "if enable -f fdflags fdflags 2>/dev/null; then fdflags -s +cloexec 62; enable -n fdflags; fi\n"
    "declare -r INPUTRC\n"
    "enable -n bind\n"
    "enable -n enable\n"
    "declare -r __conch_q=\n"
    "__conch_u() {\n"
    "  if [[ -o posix ]]; then unset -f builtin\n"
    "  elif [[ ( -v POSIXLY_CORRECT || ! -o nounset ) && ${POSIXLY_CORRECT@a} == *r* ]]; then [[ "
    "-z x ]]\n"
    "  elif [[ -o nounset && ! -v POSIXLY_CORRECT ]] && ! ( POSIXLY_CORRECT=y ) 2>/dev/null; then "
    "[[ -z x ]]\n"
    "  else\n"
    "    POSIXLY_CORRECT=y\n"
    "    if [[ ! -o posix ]]; then [[ -z x ]]; elif unset -f builtin; then\n"
    "      unset POSIXLY_CORRECT; __conch_o \"$1\"\n"
    "    else unset POSIXLY_CORRECT; [[ -z x ]]; fi\n"
    "  fi\n"
    "}\n"
    "__conch_o() {\n"
    "  if [[ :$1: == *:expand_aliases:*:interactive_comments:*:sourcepath:* && :$1: != "
    "*:inherit_errexit:* && :$1: != *:shift_verbose:* ]]; then\n"
    "    builtin shopt -u inherit_errexit\n"
    "  else\n"
    "    builtin local __conch_k __conch_on __conch_off\n"
    "    __conch_on=() __conch_off=()\n"
    "    for __conch_k in inherit_errexit expand_aliases interactive_comments sourcepath "
    "shift_verbose; do\n"
    "      if [[ :$1: == *:$__conch_k:* ]]; then __conch_on+=(\"$__conch_k\"); else "
    "__conch_off+=(\"$__conch_k\"); fi\n"
    "    done\n"
    "    if (( ${#__conch_on[@]} )); then builtin shopt -s \"${__conch_on[@]}\"; fi\n"
    "    if (( ${#__conch_off[@]} )); then builtin shopt -u \"${__conch_off[@]}\"; fi\n"
    "  fi\n"
    "}\n"
    "__conch_b() {\n"
    "  {\n"
    "  if ! __conch_u \"$BASHOPTS\"; then { : \"${__conch_q:?B - locked}\"; } 2>&62; fi\n"
    "  if ! builtin local __conch_h __conch_k; then { : \"${__conch_q:?B - local}\"; } 2>&62; fi\n"
    "  if ! builtin unset -n __conch_c __conch_in; then { : \"${__conch_q:?B - readonly}\"; } "
    "2>&62; fi\n"
    "  __conch_h=\n"
    "  while [[ $__conch_h != [ri]* ]]; do\n"
    "    if ! IFS= builtin read -r -d '' -u 62 __conch_h; then { : \"${__conch_q:?B - read}\"; } "
    "2>&62; fi\n"
    "  done\n"
    "  __conch_k=${__conch_h%%$'\\n'*}\n"
    "  __conch_c=${__conch_h#*$'\\n'}\n"
    "  if [[ $__conch_k == i* ]] && ! IFS= builtin read -r -d '' -u 62 __conch_in; then { : "
    "\"${__conch_q:?B ${__conch_k:1} read}\"; } 2>&62; fi\n"
    "  if ! builtin printf '\\e]697;S%s\\a' \"${__conch_k:1}\" >/dev/tty; then builtin true; fi\n"
    "  } 2>/dev/null\n"
    "}\n"
    "__conch_e() {\n"
    "  {\n"
    "  if ! __conch_u \"$BASHOPTS\"; then { : \"${__conch_q:?B - locked}\"; } 2>&62; fi\n"
    "  if ! builtin unset __conch_c __conch_in; then builtin true; fi\n"
    "  if ! builtin local __conch_k=x$SRANDOM; then { : \"${__conch_q:?B - local}\"; } 2>&62; fi\n"
    "  if ! builtin printf 'E - %s %d\\n' \"$__conch_k\" \"$1\" >&62; then builtin kill -KILL "
    "\"$$\"; fi\n"
    "  if ! builtin printf '\\e]697;E%s\\a' \"$__conch_k\" >/dev/tty; then builtin true; fi\n"
    "  } 2>/dev/null\n"
    "}\n"
    "__conch_s() {\n"
    "  {\n"
    "  if ! __conch_u \"$BASHOPTS\"; then { : \"${__conch_q:?B - locked}\"; } 2>&62; fi\n"
    "  if builtin local __conch_k && IFS= builtin read -r -d '' -u 62 __conch_k; then\n"
    "    if ! builtin printf 'Y %s\\n' \"$__conch_k\" >&62; then builtin true; fi\n"
    "  fi\n"
    "  } 2>/dev/null\n"
    "}\n"
    "readonly -f __conch_u __conch_o __conch_b __conch_e __conch_s\n"
    "[ -r /etc/bash.bashrc ] && . /etc/bash.bashrc\n"
    "[ -r ~/.bashrc ] && . ~/.bashrc\n"
    "HISTCONTROL=ignorespace\n";

/* ---- the shell's life ---- */

static void session_clear_run_state(struct session *s)
{
    s->phase = 0;
    s->carry_len = 0;
    s->pending_cr = false;
    s->got_status = false;
    s->timed_out = s->killed_fg = s->shell_died = s->synced = false;
    s->tstage = T_NONE;
    s->unknown = false;
    s->unknown_why[0] = 0;
    s->hold_len = 0;
    s->mark_e_len = 0;
}

static void srun_free(struct srun *r)
{
    free(r->command);
    free(r->in);
    free(r);
}

/* What a session command's result says beyond conch_run_result_json's fields. */
struct result_extra {
    char session[32];
    bool shell_died, new_shell, timed_out;
    bool unknown; /* the exit status is unknown: @unknown_why */
    char unknown_why[200];
    char end_reason[600];
    uint64_t timeout_ms, grace_ms;
};

/* The result object of a session command: @res (borrowed) and @x. Touches nothing of the
 * daemon's: a worker may build it. */
static json_t *session_result_json(const struct conch_run_result *res, const struct result_extra *x)
{
    json_t *o = conch_run_result_json(res, NULL);
    char *text = conch_run_result_text(res);
    if (o && text && x->unknown) {
        char *t2 = NULL;
        if (asprintf(&t2, "%s\n[the exit status is unknown: %s]", text, x->unknown_why) >= 0) {
            free(text);
            text = t2;
        }
    }
    if (o && text) {
        if (x->shell_died) {
            char *t2 = NULL;
            if (asprintf(&t2, "%s\n[the shell exited: %s; the next command starts a new one]", text,
                         x->end_reason) >= 0) {
                free(text);
                text = t2;
            }
        } else if (x->timed_out) {
            char *t2 = NULL;
            if (asprintf(&t2, "%s\n[interrupted; the session is still usable]", text) >= 0) {
                free(text);
                text = t2;
            }
        }
        json_object_set_new(o, "text", conch_json_text(text, strlen(text)));
    }
    free(text);
    if (o) {
        json_object_del(o, "committed");
        json_object_set_new(o, "session", json_string(x->session));
        json_object_set_new(o, "shell_exited", json_boolean(x->shell_died));
        json_object_set_new(o, "new_shell", json_boolean(x->new_shell));
        json_object_set_new(o, "status_unknown", json_boolean(x->unknown));
        if (x->unknown && !x->timed_out) {
            char msg[300];
            snprintf(msg, sizeof(msg), "the exit status is unknown: %s", x->unknown_why);
            json_t *e = json_pack("{s:s,s:s}", "kind", "infrastructure", "message", msg);
            if (e)
                json_object_set_new(o, "error", e);
        }
        if (x->timed_out) {
            json_object_set_new(o, "session_usable", json_boolean(!x->shell_died));
            char msg[200];
            snprintf(msg, sizeof(msg),
                     "timed out after %.3g s (SIGINT to the terminal's foreground job, SIGKILL "
                     "after %.3g s)",
                     x->timeout_ms / 1000.0, x->grace_ms / 1000.0);
            json_object_set_new(json_object_get(o, "error"), "message", json_string(msg));
        }
    }
    return o;
}

/* The exit code of a command whose status is unknown (status_unknown in its result). */
#define SESSION_EXIT_UNKNOWN 255

/* The most changes a session command's result lists (the rest: workspace.changes). */
#define SESSION_CHANGES_MAX 1000

/* A result that keeps more output than this is built and serialised by a worker, as
 * exec.run's is (see ANSWER_ON_LOOP_MAX in commands.c). */
#define SESSION_ANSWER_ON_LOOP_MAX (64u << 10)

/* A result on its way: waiting for the workspace's changes (the next command waits too: it
 * would otherwise see the next one's), then, for a large one, built by a worker. Either
 * @result is built already (small), or @res and @x are kept to build it. */
struct session_answer {
    uv_work_t req;
    struct daemon *d;
    struct conch_rpc_call *call;
    char session[32];
    json_t *result;              /* built on the loop; NULL: built by the worker */
    struct conch_run_result res; /* owned: the output, the tool calls */
    struct result_extra x;
    struct conch_ws_changes changes; /* owned */
    bool has_changes;
    json_t *stores; /* what the write-back of its store mounts did (owned), or NULL */
    char *text;     /* what the worker serialised */
};

static void session_answer_free(struct session_answer *a)
{
    json_decref(a->result);
    conch_output_done(&a->res.out);
    conch_output_done(&a->res.err);
    conch_run_tool_calls_done(&a->res.tools);
    conch_ws_changes_done(&a->changes);
    json_decref(a->stores);
    free(a->text);
    free(a);
}

/* The answer is out: the session's next command may start. */
static void session_answered(struct session_answer *a)
{
    struct session *s = conch_daemon_session_find(a->session);
    session_answer_free(a);
    if (s) {
        s->scanning = false;
        conch_daemon_session_pump(s);
    }
}

static void answer_work(uv_work_t *req)
{
    struct session_answer *a = req->data;
    json_t *o = session_result_json(&a->res, &a->x);
    if (o && a->has_changes)
        conch_ws_changes_json_set(o, &a->changes, SESSION_CHANGES_MAX);
    if (o && a->stores)
        json_object_set(o, "stores", a->stores);
    a->text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
}

static void answer_done(uv_work_t *req, int status)
{
    struct session_answer *a = req->data;
    (void)status;
    a->d->holds--;
    /* NULL text (out of memory, or cancelled) is answered as an internal error. */
    conch_rpc_call_reply_dumped(a->call, a->text);
    a->text = NULL;
    session_answered(a);
}

/* Send @a's result: built here when small, else by a worker. */
static void session_answer_send(struct session_answer *a)
{
    /* Counted as a hold: a daemon shutting down waits for it. */
    if (!a->result && uv_queue_work(&a->d->loop, &a->req, answer_work, answer_done) == 0) {
        a->d->holds++;
        return;
    }
    json_t *o = a->result ? a->result : session_result_json(&a->res, &a->x);
    a->result = NULL;
    if (o && a->has_changes)
        conch_ws_changes_json_set(o, &a->changes, SESSION_CHANGES_MAX);
    if (o && a->stores)
        json_object_set(o, "stores", a->stores);
    conch_rpc_call_reply(a->call, o);
    session_answered(a);
}

static void changes_done(void *arg, int rc, struct conch_ws_changes *changes,
                         const struct conch_err *err)
{
    struct session_answer *a = arg;
    (void)err;
    if (rc == 0 && changes) {
        /* Taken: the scan's caller frees what is left, nothing now. */
        a->changes = *changes;
        memset(changes, 0, sizeof(*changes));
        a->has_changes = true;
    }
    session_answer_send(a);
}

/* The result lists the workspace's changes, as exec.run's does: a worker scans them. */
static void session_scan(struct session_answer *a, struct sandbox *sb)
{
    if (sb && sb->upper_dir[0] && !sb->super.gone &&
        conch_daemon_sandbox_changes_async(sb, changes_done, a) == 0)
        return;
    session_answer_send(a);
}

static void session_synced(void *arg, json_t *report)
{
    struct session_answer *a = arg;
    a->stores = report;
    struct session *s = conch_daemon_session_find(a->session);
    struct sandbox *sb = s ? sess_sb(s) : NULL;
    session_scan(a, sb && sb->state != SB_GONE ? sb : NULL);
}

/* Build and send the result of the current command, then start the next one. */
void conch_daemon_session_run_finish(struct session *s)
{
    struct srun *r = s->cur;
    if (!r)
        return;
    s->cur = NULL;
    uv_timer_stop(s->timer);
    conch_daemon_session_hold_commit(s);
    struct session_answer *a = calloc(1, sizeof(*a));
    struct conch_run_result res;
    memset(&res, 0, sizeof(res));
    res.out = s->cap;
    res.err = s->nocap;
    res.duration_ms = conch_daemon_now_ms() - s->start_ms;
    int code;
    if (s->shell_died)
        code = s->end_code >= 0 ? s->end_code : 137;
    else if (s->unknown)
        code = SESSION_EXIT_UNKNOWN;
    else if (s->got_status)
        code = s->status_code;
    else
        code = s->killed_fg ? 128 + SIGKILL : 128 + SIGINT;
    struct conch_run_end end = {
        .status = W_EXITCODE(code & 0xff, 0),
        .timed_out = s->timed_out,
        .timeout_ms = r->timeout_ms,
        .grace_ms = r->grace_ms,
    };
    conch_run_result_end(&res, &end);
    /* This command's tool calls (those of a shell that died were collected then). */
    struct sandbox *bsb = sess_sb(s);
    if (!s->tools.calls && bsb && bsb->bridge)
        conch_bridge_origin_take(bsb->bridge, "session", s->id, &s->tools);
    res.tools = (struct conch_run_tool_calls){
        .calls = s->tools.calls, .detached = s->tools.detached, .summary = s->tools.summary};
    res.tools_summary = s->tools.summary;
    memset(&s->tools, 0, sizeof(s->tools));
    struct result_extra x = {.shell_died = s->shell_died,
                             .new_shell = s->new_shell,
                             .timed_out = s->timed_out,
                             .unknown = s->unknown,
                             .timeout_ms = r->timeout_ms,
                             .grace_ms = r->grace_ms};
    snprintf(x.session, sizeof(x.session), "%s", s->id);
    snprintf(x.end_reason, sizeof(x.end_reason), "%s", s->end_reason);
    snprintf(x.unknown_why, sizeof(x.unknown_why), "%s", s->unknown_why);
    size_t kept = res.out.head_len + res.out.tail_len + res.err.head_len + res.err.tail_len;
    if (a) {
        /* The output goes with the answer (a worker may read it after the next command
         * started): the session's buffers start anew. */
        a->res = res;
        a->x = x;
        memset(&s->cap, 0, sizeof(s->cap));
        memset(&s->nocap, 0, sizeof(s->nocap));
        if (kept <= SESSION_ANSWER_ON_LOOP_MAX)
            a->result = session_result_json(&a->res, &a->x);
    } else {
        /* Out of memory for the record: answered here and now. */
        json_t *o = session_result_json(&res, &x);
        conch_run_tool_calls_done(&res.tools);
        conch_output_done(&s->cap);
        conch_output_done(&s->nocap);
        conch_rpc_call_reply(r->call, o);
        r->call = NULL;
    }
    s->new_shell = false;
    s->cap.spill_fd = s->nocap.spill_fd = -1;
    struct conch_rpc_call *call = r->call;
    srun_free(r);
    session_clear_run_state(s);
    s->last_used_at = conch_daemon_now();
    struct sandbox *sb = sess_sb(s);
    if (sb)
        conch_daemon_sandbox_touch(sb);
    if (!a) {
        conch_daemon_session_pump(s);
        return;
    }
    a->d = s->d;
    a->call = call;
    a->req.data = a;
    snprintf(a->session, sizeof(a->session), "%s", s->id);
    /* Until the answer is out the next command waits: it would otherwise see this one's
     * changes as its own, or be answered first. */
    s->scanning = true;
    /* Its store mounts are written back first (stores.c), as after exec.run. */
    if (sb && conch_daemon_stores_sync(sb, session_synced, a) == 0)
        return;
    session_scan(a, sb);
}

void conch_daemon_session_fail_queue(struct session *s, const char *why)
{
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &s->queue)
    {
        struct srun *r = conch_list_entry(pos, struct srun, link);
        conch_list_del(&r->link);
        conch_rpc_call_failf(r->call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s ended: %s", s->id, why);
        srun_free(r);
    }
}

/* Start the next queued command when the shell waits for one. */
void conch_daemon_session_pump(struct session *s)
{
    if (s->cur || s->scanning || conch_list_empty(&s->queue) || s->closing)
        return;
    if (s->d->stopping) {
        conch_daemon_session_fail_queue(s, "the daemon is shutting down");
        return;
    }
    if (s->state == SS_ENDED) {
        struct sandbox *sb = s->recovered ? NULL : sess_sb(s);
        if (!sb || sb->state != SB_READY) {
            conch_daemon_session_fail_queue(s, s->end_reason);
            return;
        }
        struct conch_err err = {0};
        if (conch_daemon_session_shell_start(s, &err) < 0) {
            conch_daemon_session_fail_queue(s, err.msg);
            return;
        }
        s->new_shell = true;
    }
    if (s->state != SS_LIVE)
        return; /* started again when the master arrives */
    if (s->kill_reason[0])
        return; /* we are ending this shell: the next one takes the command */
    struct srun *r = conch_list_entry(s->queue.next, struct srun, link);
    /* A program of a person's (an editor, a pager) has the terminal: typing into it would
     * be wrong. Commands run only when the shell itself is in the foreground. */
    pid_t pg = 0, sid = 0;
    if (ioctl(s->master, TIOCGPGRP, &pg) == 0 && ioctl(s->master, TIOCGSID, &sid) == 0 &&
        pg != sid) {
        if (!s->busy_since)
            s->busy_since = conch_daemon_now_ms();
        if (conch_daemon_now_ms() - s->busy_since < BUSY_WAIT_MS) {
            s->tstage = T_BUSY;
            uv_timer_start(s->timer, conch_daemon_session_on_timer, 20, 0);
            return;
        }
        s->busy_since = 0;
        conch_list_del(&r->link);
        conch_rpc_call_failf(r->call, CONCH_RPC_LIMIT, "session_busy", NULL,
                             "session %s: a program is running in the foreground of its "
                             "terminal; wait for it, or end it with session.signal",
                             s->id);
        srun_free(r);
        conch_daemon_session_pump(s);
        return;
    }
    s->busy_since = 0;
    if (s->tstage == T_BUSY)
        uv_timer_stop(s->timer);
    conch_list_del(&r->link);
    s->cur = r;
    session_clear_run_state(s);
    struct conch_err err = {0};
    s->cap.spill_fd = s->nocap.spill_fd = -1;
    if (conch_output_init(&s->cap, "stdout", r->max_output, 256ULL << 20,
                          sess_sb(s) ? conch_daemon_sandbox_spill_dir(sess_sb(s)) : NULL,
                          &err) < 0 ||
        conch_output_init(&s->nocap, "stderr", 0, 0, NULL, &err) < 0) {
        s->cur = NULL;
        conch_rpc_call_fail_err(r->call, 0, NULL, &err);
        srun_free(r);
        return;
    }
    conch_output_set_budget(&s->cap, &s->d->output_budget);
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd)) {
        for (int i = 0; i < 8; i++)
            rnd[i] = (unsigned char)rand();
    }
    for (int i = 0; i < 8; i++)
        snprintf(s->nonce + 2 * i, 3, "%02x", rnd[i]);
    s->mark_s_len = (size_t)snprintf(s->mark_s, sizeof(s->mark_s), "\x1b]697;S%s\a", s->nonce);
    s->mark_e_len = 0;
    size_t clen = strlen(r->command);
    size_t len = 2 + 16 + 1 + clen + 1 + (r->has_in ? r->in_len + 1 : 0);
    char *rec = malloc(len);
    if (!rec) {
        s->cur = NULL;
        conch_rpc_call_failf(r->call, -32603, "internal_error", NULL, "out of memory");
        srun_free(r);
        return;
    }
    size_t off = (size_t)sprintf(rec, "%c%s\n", r->has_in ? 'i' : 'r', s->nonce);
    memcpy(rec + off, r->command, clen + 1);
    off += clen + 1;
    if (r->has_in) {
        memcpy(rec + off, r->in, r->in_len);
        rec[off + r->in_len] = 0;
        off += r->in_len + 1;
    }
    s->start_ms = conch_daemon_now_ms();
    {
        /* Calls made between commands (raw mode) are not this command's. */
        struct sandbox *bsb = sess_sb(s);
        struct conch_bridge_report before;
        conch_bridge_report_done(&s->tools);
        if (bsb && bsb->bridge) {
            conch_bridge_origin_take(bsb->bridge, "session", s->id, &before);
            conch_bridge_report_done(&before);
        }
    }
    conch_daemon_session_sock_write(s, rec, off);
    free(rec);
    /* Typed whole, not through an alias (shell code may redefine one): every name in it is
     * quoted (no alias applies) and is a read-only function of ours or the builtin `builtin`
     * (__conch_b has removed any function of that name); `eval` runs the command at top level
     * so that its declarations persist, and `$?` goes to the reporter as an argument. */
    static const char run_line[] =
        "\x15 \\__conch_b&&\\builtin eval \"$__conch_c\"</dev/null 62>&-;\\__conch_e \"$?\"\n";
    static const char run_in_line[] = "\x15 \\__conch_b&&\\builtin eval "
                                      "\"$__conch_c\"<<<\"$__conch_in\" 62>&-;\\__conch_e \"$?\"\n";
    if (r->has_in)
        conch_daemon_session_master_write(s, run_in_line, sizeof(run_in_line) - 1, false, NULL);
    else
        conch_daemon_session_master_write(s, run_line, sizeof(run_line) - 1, false, NULL);
    if (r->timeout_ms) {
        s->tstage = T_DEADLINE;
        uv_timer_start(s->timer, conch_daemon_session_on_timer, r->timeout_ms, 0);
    }
}

/* Never waits: the shell's process sends the master before its exec, and its start is
 * reported after the exec, so by then the fd is here or will never come (the loop must not
 * wait on a sandbox process). */
static bool recv_fd(int sock, int *ret)
{
    char byte;
    int nfds = 0;
    if (conch_recv_fds(sock, &byte, 1, ret, 1, &nfds, MSG_DONTWAIT) != 1 || nfds != 1) {
        if (nfds == 1)
            close(*ret);
        return false;
    }
    return true;
}

void conch_daemon_session_set_winsize(struct session *s)
{
    struct winsize ws = {.ws_row = s->rows, .ws_col = s->cols};
    if (s->master >= 0)
        ioctl(s->master, TIOCSWINSZ, &ws);
}

static void shell_started(struct conch_proc *p, pid_t pid)
{
    {
        struct session *s0 = p->data;
        struct sandbox *bsb = sess_sb(s0);
        /* Tool calls from the shell's pid namespace are this session's. */
        if (bsb && bsb->bridge &&
            conch_bridge_origin_begin(bsb->bridge, "session", s0->id, p->pidns_ino) < 0)
            log_warn("session %s: out of memory tracing tool calls", s0->id);
    }
    struct session *s = p->data;
    (void)pid;
    /* The shell sent the master before exec, and it started: the fd is waiting (recv_fd). */
    int master = -1;
    if (!recv_fd(s->sock, &master)) {
        log_warn("session %s: no terminal from the shell", s->id);
        conch_super_signal(&s->proc, SIGKILL);
        return;
    }
    /* The shell is the terminal's session leader: its pid as we see it is the only sender
     * whose lines on the socket count (sock_read). The master came before the credentials
     * are asked for: the shell writes nothing before it runs the init script. */
    pid_t sid = 0;
    int one = 1;
    if (ioctl(master, TIOCGSID, &sid) < 0 || sid <= 0 ||
        setsockopt(s->sock, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) < 0) {
        log_warn("session %s: cannot tell the shell's messages from others': %s", s->id,
                 strerror(errno ? errno : ESRCH));
        close(master);
        conch_super_signal(&s->proc, SIGKILL);
        return;
    }
    s->shell_pid = sid;
    s->foreign = 0;
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    fcntl(s->sock, F_SETFL, fcntl(s->sock, F_GETFL) | O_NONBLOCK);
    s->master_poll = malloc(sizeof(*s->master_poll));
    s->sock_poll = malloc(sizeof(*s->sock_poll));
    if (!s->master_poll || !s->sock_poll || uv_poll_init(&s->d->loop, s->master_poll, master) < 0) {
        free(s->master_poll);
        free(s->sock_poll);
        s->master_poll = s->sock_poll = NULL;
        log_warn("session %s: cannot poll its terminal: out of memory or descriptors", s->id);
        close(master);
        conch_super_signal(&s->proc, SIGKILL);
        return;
    }
    s->master = master;
    if (uv_poll_init(&s->d->loop, s->sock_poll, s->sock) < 0) {
        /* the master's handle is live: the session's close path frees both */
        free(s->sock_poll);
        s->sock_poll = NULL;
        log_warn("session %s: cannot poll its control socket", s->id);
        conch_super_signal(&s->proc, SIGKILL);
        return;
    }
    conch_daemon_session_set_winsize(s);
    s->master_poll->data = s->sock_poll->data = s;
    uv_poll_start(s->master_poll, UV_READABLE, conch_daemon_session_on_master);
    conch_daemon_session_sock_poll_update(s);
    s->state = SS_LIVE;
    if (s->open_call) {
        conch_rpc_call_reply(s->open_call, conch_daemon_session_json(s));
        s->open_call = NULL;
    }
    json_t *params = json_pack("{s:s,s:i}", "session", s->id, "shell", s->shells);
    conch_daemon_session_notify_all(s, "session.started", params);
    conch_daemon_session_pump(s);
}

static void shell_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct session *s = p->data;
    s->proc_live = false;
    struct sandbox *bsb = sess_sb(s);
    if (bsb && bsb->bridge) {
        /* Its calls in flight are cancelled; those of the current command stay for its
         * result. */
        conch_bridge_report_done(&s->tools);
        conch_bridge_origin_end(bsb->bridge, "session", s->id, &s->tools);
    }
    if (s->master >= 0 && !s->closing)
        conch_daemon_session_master_drain(s);
    int sig = 0;
    if (end->start_failed) {
        s->end_code = 127;
        snprintf(s->end_reason, sizeof(s->end_reason), "the shell could not start: %s",
                 end->err.msg);
    } else if (end->lost) {
        s->end_code = conch_exit_code(end->status, &sig);
        snprintf(s->end_reason, sizeof(s->end_reason), "%s", end->why ? end->why : "lost");
    } else {
        s->end_code = conch_exit_code(end->status, &sig);
        if (sig)
            snprintf(s->end_reason, sizeof(s->end_reason), "the shell was killed by signal %d",
                     sig);
        else
            snprintf(s->end_reason, sizeof(s->end_reason), "the shell exited with code %d",
                     s->end_code);
    }
    if (s->kill_reason[0])
        snprintf(s->end_reason, sizeof(s->end_reason), "%s", s->kill_reason);
    s->kill_reason[0] = 0;
    if (s->closing) {
        conch_daemon_session_free(s);
        return;
    }
    if (s->open_call) {
        struct conch_err err = {0};
        conch_err_set(&err, EIO, "session.open: %s", s->end_reason);
        conch_rpc_call_fail_err(s->open_call, 0, NULL, &err);
        s->open_call = NULL;
    }
    conch_daemon_session_end(s, s->end_reason);
}

static const struct conch_proc_ops shell_ops = {.started = shell_started, .ended = shell_ended};

static void shell_end_synced(void *arg, json_t *report)
{
    (void)arg;
    json_decref(report); /* failures are logged by stores.c; nobody waits for this one */
}

/* The shell is gone (exit, sandbox destroyed, idle, close): tell every client why. The
 * current command ends with the shell's status; queued ones start a new shell. */
void conch_daemon_session_end(struct session *s, const char *why)
{
    if (s->state == SS_ENDED)
        return;
    s->state = SS_ENDED;
    if (why != s->end_reason)
        snprintf(s->end_reason, sizeof(s->end_reason), "%s", why);
    conch_daemon_session_close_fds(s);
    if (s->save)
        uv_timer_stop(s->save);
    json_t *params = json_pack("{s:s,s:s,s:i}", "session", s->id, "reason", s->end_reason,
                               "exit_code", s->end_code);
    conch_daemon_session_notify_all(s, "session.ended", params);
    conch_daemon_session_record(s);
    if (s->cur) {
        s->shell_died = true;
        conch_daemon_session_run_finish(s); /* pumps the queue: a new shell if the sandbox lives */
    } else {
        /* What an interactive shell (conch shell, exec -t) left in store mounts is written
         * back when it ends; session.run's commands were each written back already. */
        struct sandbox *sb = sess_sb(s);
        if (sb && (sb->state == SB_READY || sb->state == SB_STOPPED))
            conch_daemon_stores_sync(sb, shell_end_synced, NULL);
        conch_daemon_session_pump(s);
    }
}

int conch_daemon_session_shell_start(struct session *s, struct conch_err *err)
{
    struct sandbox *sb = sess_sb(s);
    if (!sb || sb->state != SB_READY)
        return conch_err_set(err, ESHUTDOWN, "sandbox %s is not running", s->sandbox_id);
    int sp[2] = {-1, -1}, devnull = -1;
    char **env = NULL;
    int r = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
        conch_err_set(err, errno, "socketpair: %s", strerror(errno));
        goto out;
    }
    devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    size_t n = json_object_size(sb->env) + json_object_size(s->env) + 5;
    char **extra = calloc(n + 1, sizeof(char *));
    size_t i = 0;
    if (extra) {
        extra[i++] = strdup("TERM=xterm-256color");
        /* The daemon types the line that runs a command and reports its status: a readline
         * macro would rewrite it (`"$?": "0"` in an ~/.inputrc a program wrote made every
         * status 0). No init file (INPUTRC, read-only), no `bind`: readline's defaults. */
        extra[i++] = strdup("INPUTRC=/dev/null");
        if (asprintf(&extra[i], "__conch_init=%s", init_script) >= 0)
            i++;
        extra[i++] = strdup("PROMPT_COMMAND=eval \"$__conch_init\"");
        json_t *objs[2] = {sb->env, s->env};
        for (int k = 0; k < 2; k++) {
            const char *key;
            json_t *val;
            json_object_foreach(objs[k], key, val)
            {
                if (json_is_string(val) &&
                    asprintf(&extra[i], "%s=%s", key, json_string_value(val)) >= 0)
                    i++;
            }
        }
        env = conch_exec_env_build(extra, sb->as_root, sb->net.mode == CONCH_NET_ALLOW, err);
        for (size_t j = 0; j < i; j++)
            free(extra[j]);
        free(extra);
    }
    if (!env) {
        if (!err->code)
            conch_err_set(err, ENOMEM, "out of memory");
        goto out;
    }
    char *argv[] = {"/bin/bash", "--noprofile", "--norc", "-i", NULL};
    struct conch_jail_cmd cmd = {.argv = argv,
                                 .envp = env,
                                 .cwd = s->cwd,
                                 .stdin_fd = sp[1],
                                 .stdout_fd = devnull,
                                 .stderr_fd = devnull,
                                 .pty = true};
    memset(&s->proc, 0, sizeof(s->proc));
    s->proc.ops = &shell_ops;
    s->proc.data = s;
    if (conch_super_run(&sb->super, &s->proc, &cmd, 0, 0, err) < 0)
        goto out;
    s->proc_live = true;
    s->sock = sp[0];
    sp[0] = -1;
    s->state = SS_STARTING;
    s->shells++;
    s->end_code = -1;
    s->end_reason[0] = 0;
    r = 0;
out:
    if (sp[0] >= 0)
        close(sp[0]);
    if (sp[1] >= 0)
        close(sp[1]);
    if (devnull >= 0)
        close(devnull);
    conch_exec_env_free(env);
    return r;
}
