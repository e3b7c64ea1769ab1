/* sessions.c - sessions: a long-lived shell per session, on a pty of the sandbox's own devpts
 * (the master is passed to us at start: jail/session-child.c), driven in two ways.
 *
 * Command mode (session.run): the shell is bash, started with an init script that defines
 * two aliases. For each command we write its text, preceded by a fresh random nonce, on the
 * session's control socket (fd 62 in the shell, close-on-exec: no program the shell runs can
 * read or write it), then type " __conch_r" on the pty. The alias reads the record, prints a
 * start marker \e]697;S<nonce>\a to the terminal, evals the command at top level (so cd,
 * exports, functions, aliases, options and `declare` persist), prints the end marker
 * \e]697;E<nonce>\a and writes "E <nonce> <status>" on the control socket. A command ends
 * when both the status (socket) and the end marker (terminal, so that everything it printed
 * before is read) are in; or when the shell dies (the supervisor's final event, with the real
 * wait status: `exit`, `exec`, `set -e`). Output is what the terminal showed between the two
 * markers. Nothing a program prints can end a command: it does not know the nonce, and the
 * status comes only from the socket it cannot reach.
 *
 * Raw mode: session.write, session.output notifications (seq = offset of the first byte in
 * the session's output stream), resize, signal, attach with one writer, a scrollback ring
 * replayed on attach. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fdpass.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon-internal.h"
#include "daemon/sessions.h"
#include "exec/result.h"
#include "exec/run.h"

#define SCROLLBACK_DEFAULT (1u << 20)
#define MAX_SESSIONS_PER_DAEMON 4096
#define MAX_QUEUE 256
/* After the status arrived, how long to wait for the end marker on the terminal (it only
 * lags by a workqueue hop of the pty) before finishing without it. */
#define MARKER_WAIT_MS 500
/* The scrollback of a session that prints is saved at most this often (see records). */
#define SAVE_MS 2000

/* The init script, run by the shell before its first prompt (PROMPT_COMMAND from the
 * environment: the shell runs with --norc, and a rcfile it would have to open by path, which
 * a pipe or memfd of ours would not allow). Leading spaces keep the typed lines out of
 * history. */
static const char init_script[] =
    "unset PROMPT_COMMAND __conch_init\n"
    "[ -r /etc/bash.bashrc ] && . /etc/bash.bashrc\n"
    "[ -r ~/.bashrc ] && . ~/.bashrc\n"
    "HISTCONTROL=ignorespace\n"
    "if enable -f fdflags fdflags 2>/dev/null; then fdflags -s +cloexec 62; enable -n fdflags; "
    "fi\n"
    "__conch_b() {\n"
    "  local __h\n"
    "  IFS= builtin read -r -d '' -u 62 __h || return 0\n"
    "  __conch_n=${__h%%$'\\n'*}\n"
    "  __conch_c=${__h#*$'\\n'}\n"
    "  if [[ $__conch_n == i* ]]; then IFS= builtin read -r -d '' -u 62 __conch_in; fi\n"
    "  __conch_n=${__conch_n:1}\n"
    "  builtin printf '\\e]697;S%s\\a' \"$__conch_n\" >/dev/tty\n"
    "}\n"
    "__conch_e() {\n"
    "  builtin printf '\\e]697;E%s\\a' \"$__conch_n\" >/dev/tty\n"
    "  builtin printf 'E %s %d\\n' \"$__conch_n\" \"$1\" >&62\n"
    "  builtin unset __conch_n __conch_c __conch_in\n"
    "}\n"
    "__conch_s() {\n"
    "  local __n\n"
    "  IFS= builtin read -r -d '' -u 62 __n || return 0\n"
    "  builtin printf 'Y %s\\n' \"$__n\" >&62\n"
    "}\n"
    /* The wrappers run with stderr to /dev/null: under `set -x` their trace stays out of the
     * output (and the nonce with it). Quoted words are not alias-expanded. */
    "alias __conch_r='{ \\__conch_b; } 2>/dev/null; \\builtin eval \"$__conch_c\" </dev/null "
    "62>&-; { \\__conch_e $?; } 2>/dev/null'\n"
    "alias __conch_ri='{ \\__conch_b; } 2>/dev/null; \\builtin eval \"$__conch_c\" "
    "<<<\"$__conch_in\" 62>&-; { \\__conch_e $?; } 2>/dev/null'\n"
    "alias __conch_y='{ \\__conch_s; } 2>/dev/null'\n";

enum sess_state { SS_STARTING, SS_LIVE, SS_ENDED };

struct sclient {
    struct dlist link;
    struct conch_rpc_sink *sink; /* a reference */
    bool writer;
};

struct srun {
    struct dlist link;
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

/* How long a command waits for a program in the terminal's foreground (typed by a person) to
 * end before it is refused with session_busy. */
#define BUSY_WAIT_MS 2000

struct session {
    struct dlist link;
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
    char *wpend; /* control-socket bytes not yet written */
    size_t wpend_len, wpend_off;
    /* scrollback ring */
    char *ring;
    size_t ring_cap, ring_len, ring_pos;
    uint64_t seq; /* bytes of output so far */
    unsigned short rows, cols;
    struct dlist clients;
    /* command mode */
    struct dlist queue;
    struct srun *cur;
    char nonce[17];
    char mark_s[32], mark_e[32];
    size_t mark_len;
    int phase; /* 0: before the start marker, 1: capturing, 2: end marker seen */
    char carry[32];
    size_t carry_len;
    bool pending_cr;
    struct conch_output cap, nocap;
    bool got_status;
    int status_code;
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

static struct dlist sessions = {&sessions, &sessions};

/* The session's sandbox, NULL once it is destroyed (looked up each time: a sandbox is freed
 * after its destroy, and a session outlives it as an ended record). */
static struct sandbox *sess_sb(struct session *s)
{
    return sandbox_find(s->d, s->sandbox_id);
}
static unsigned n_sessions;
static uint64_t next_session;

static void session_pump(struct session *s);
static void run_finish(struct session *s);
static int shell_start(struct session *s, struct conch_err *err);
static void session_end(struct session *s, const char *why);
static void session_record(struct session *s);
static void session_free(struct session *s);
static void touch(struct session *s);
static void on_save(uv_timer_t *t);
static void session_unrecord(struct session *s);
static void sessions_trim(struct daemon *d);
static json_t *session_json(struct session *s);

static void free_handle(uv_handle_t *h)
{
    free(h);
}

/* A session's four timers (command deadline, idle timeout, record save, EOF grace), each a
 * handle of its own; all or none. Returns 0 or -ENOMEM. */
static int session_timers_open(struct session *s)
{
    uv_timer_t **t[] = {&s->timer, &s->idle, &s->save, &s->eof_timer};
    for (size_t i = 0; i < ARRAY_SIZE(t); i++)
        *t[i] = malloc(sizeof(**t[i]));
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        if (*t[i])
            continue;
        for (size_t k = 0; k < ARRAY_SIZE(t); k++) {
            free(*t[k]);
            *t[k] = NULL;
        }
        return -ENOMEM;
    }
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        uv_timer_init(&s->d->loop, *t[i]);
        (*t[i])->data = s;
    }
    return 0;
}

static void session_timers_close(struct session *s)
{
    uv_timer_t **t[] = {&s->timer, &s->idle, &s->save, &s->eof_timer};
    for (size_t i = 0; i < ARRAY_SIZE(t); i++) {
        if (*t[i])
            uv_close((uv_handle_t *)*t[i], free_handle);
        *t[i] = NULL;
    }
}

static void close_poll(uv_poll_t **p)
{
    if (*p) {
        uv_poll_stop(*p);
        uv_close((uv_handle_t *)*p, free_handle);
        *p = NULL;
    }
}

static struct session *session_find(const char *id)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &sessions)
    {
        struct session *s = dlist_entry(pos, struct session, link);
        if (!strcmp(s->id, id))
            return s;
    }
    return NULL;
}

/* Forget attached clients that went away (their sink is closed): a writer that left frees
 * the keyboard. */
static void prune_clients(struct session *s)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = dlist_entry(pos, struct sclient, link);
        if (!conch_rpc_sink_ctx(c->sink)) {
            dlist_del(&c->link);
            conch_rpc_sink_unref(c->sink);
            free(c);
        }
    }
}

static void notify_all(struct session *s, const char *method, json_t *params)
{
    prune_clients(s);
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = dlist_entry(pos, struct sclient, link);
        client_notify(c->sink, method, json_incref(params));
    }
    json_decref(params);
}

/* ---- scrollback ---- */

static void ring_append(struct session *s, const char *buf, size_t len)
{
    if (!s->ring_cap)
        return;
    if (len >= s->ring_cap) {
        memcpy(s->ring, buf + len - s->ring_cap, s->ring_cap);
        s->ring_pos = 0;
        s->ring_len = s->ring_cap;
        return;
    }
    size_t first = s->ring_cap - s->ring_pos;
    if (first > len)
        first = len;
    memcpy(s->ring + s->ring_pos, buf, first);
    memcpy(s->ring, buf + first, len - first);
    s->ring_pos = (s->ring_pos + len) % s->ring_cap;
    s->ring_len = s->ring_len + len > s->ring_cap ? s->ring_cap : s->ring_len + len;
}

/* The scrollback in order, as a new buffer (*@ret_len bytes). */
static char *ring_copy(const struct session *s, size_t *ret_len)
{
    char *b = malloc(s->ring_len + 1);
    if (!b)
        return NULL;
    size_t start = (s->ring_pos + s->ring_cap - s->ring_len) % (s->ring_cap ? s->ring_cap : 1);
    size_t first = s->ring_cap - start;
    if (first > s->ring_len)
        first = s->ring_len;
    if (s->ring_len) {
        memcpy(b, s->ring + start, first);
        memcpy(b + first, s->ring, s->ring_len - first);
    }
    *ret_len = s->ring_len;
    return b;
}

/* ---- capture of the current command's output ---- */

static void cap_append(struct session *s, const char *buf, size_t len)
{
    /* The terminal turns \n into \r\n (onlcr): a command's output is plain \n again. */
    char tmp[4096];
    size_t t = 0;
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (s->pending_cr) {
            s->pending_cr = false;
            if (c != '\n')
                tmp[t++] = '\r';
        }
        if (c == '\r') {
            s->pending_cr = true;
            continue;
        }
        tmp[t++] = c;
        if (t >= sizeof(tmp) - 2) {
            struct conch_err err = {0};
            conch_output_append(&s->cap, tmp, t, &err);
            t = 0;
        }
    }
    if (t) {
        struct conch_err err = {0};
        conch_output_append(&s->cap, tmp, t, &err);
    }
}

/* Feed the terminal's output to the current command: what lies between its markers. */
static void feed(struct session *s, const char *buf, size_t len)
{
    while (len && s->phase < 2) {
        const char *mark = s->phase == 0 ? s->mark_s : s->mark_e;
        /* carry + buf: look for the marker across the boundary */
        char joined[64 + 4096];
        size_t jl = 0;
        size_t take = len < 4096 ? len : 4096;
        memcpy(joined, s->carry, s->carry_len);
        jl = s->carry_len;
        memcpy(joined + jl, buf, take);
        jl += take;
        s->carry_len = 0;
        char *hit = memmem(joined, jl, mark, s->mark_len);
        if (hit) {
            size_t before = (size_t)(hit - joined);
            if (s->phase == 1)
                cap_append(s, joined, before);
            s->phase++;
            size_t used = before + s->mark_len; /* of joined */
            size_t from_buf = used > jl - take ? used - (jl - take) : 0;
            /* bytes of joined after the marker that came from carry (cannot happen: the
             * carry is shorter than a marker) */
            buf += from_buf;
            len -= from_buf;
            if (s->phase == 2 && s->got_status)
                run_finish(s);
            continue;
        }
        /* Keep the longest suffix that may begin a marker. */
        size_t keep = 0;
        for (size_t k = s->mark_len - 1; k > 0; k--) {
            if (k <= jl && !memcmp(joined + jl - k, mark, k)) {
                keep = k;
                break;
            }
        }
        if (s->phase == 1)
            cap_append(s, joined, jl - keep);
        memcpy(s->carry, joined + jl - keep, keep);
        s->carry_len = keep;
        buf += take;
        len -= take;
    }
}

static void on_master(uv_poll_t *h, int status, int events);

static void master_output(struct session *s, const char *buf, size_t n)
{
    ring_append(s, buf, n);
    if (!dlist_empty(&s->clients)) {
        /* A character split between two reads would become two U+FFFD: the last bytes of an
         * incomplete UTF-8 sequence wait for the next read (seq is the offset of the first
         * byte sent). Reads are at most 64 KiB. */
        char joined[sizeof(s->u8) + 65536];
        size_t jl = s->u8_len;
        size_t take = n < 65536 ? n : 65536;
        memcpy(joined, s->u8, jl);
        memcpy(joined + jl, buf, take);
        jl += take;
        size_t keep = 0;
        for (size_t k = 1; k <= 3 && k <= jl; k++) {
            unsigned char c = (unsigned char)joined[jl - k];
            if ((c & 0xc0) == 0x80)
                continue; /* a continuation byte: look further back */
            size_t need = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
            if (need > k)
                keep = k;
            break;
        }
        json_t *p =
            json_pack("{s:s,s:I,s:o}", "session", s->id, "seq", (json_int_t)(s->seq - s->u8_len),
                      "data", conch_json_text(joined, jl - keep));
        memcpy(s->u8, joined + jl - keep, keep);
        s->u8_len = keep;
        notify_all(s, "session.output", p);
    }
    s->seq += n;
    /* A shell that prints is not idle (a build a person started, say). */
    if (daemon_now() - s->last_used_at > 1)
        touch(s);
    if (s->save && !uv_is_active((uv_handle_t *)s->save))
        uv_timer_start(s->save, on_save, SAVE_MS, 0);
    if (s->cur)
        feed(s, buf, n);
}

/* Read everything the terminal has. Returns false at EOF/EIO (the shell's side is closed). */
static bool master_drain(struct session *s)
{
    char buf[65536];
    for (int rounds = 0; s->master >= 0 && rounds < 64; rounds++) {
        ssize_t n = read(s->master, buf, sizeof(buf));
        if (n > 0) {
            master_output(s, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        return false;
    }
    return true;
}

static void master_flush(struct session *s);

static void on_master(uv_poll_t *h, int status, int events)
{
    struct session *s = h->data;
    if (status >= 0 && (events & UV_WRITABLE))
        master_flush(s);
    if (status < 0 || !master_drain(s)) {
        /* The slave side is gone: the shell's end comes from the supervisor. */
        close_poll(&s->master_poll);
    }
}

/* ---- the control socket ---- */

static void sock_flush(struct session *s);
static void on_timer(uv_timer_t *t);
static void on_eof_timer(uv_timer_t *t);

static void on_sock(uv_poll_t *h, int status, int events)
{
    struct session *s = h->data;
    if (status < 0) {
        close_poll(&s->sock_poll);
        return;
    }
    if (events & UV_WRITABLE)
        sock_flush(s);
    if (!(events & UV_READABLE))
        return;
    for (;;) {
        ssize_t n = read(s->sock, s->sockbuf + s->socklen, sizeof(s->sockbuf) - 1 - s->socklen);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0 || errno != EAGAIN) {
                close_poll(&s->sock_poll);
                /* The socket closes when the shell exits, and when shell code closes the
                 * shell's copy: then commands can no longer be told apart. If the shell is
                 * still there shortly after, end it; the next run starts a new one. */
                if (s->proc_live && s->state == SS_LIVE) {
                    s->eof_shell = s->shells;
                    uv_timer_start(s->eof_timer, on_eof_timer, 300, 0);
                }
            }
            break;
        }
        s->socklen += (size_t)n;
        s->sockbuf[s->socklen] = 0;
        char *nl;
        while ((nl = memchr(s->sockbuf, '\n', s->socklen))) {
            *nl = 0;
            char kind = 0, nonce[40] = "";
            int code = 0;
            int got = sscanf(s->sockbuf, "%c %39s %d", &kind, nonce, &code);
            size_t used = (size_t)(nl + 1 - s->sockbuf);
            memmove(s->sockbuf, nl + 1, s->socklen - used);
            s->socklen -= used;
            if (!s->cur || strcmp(nonce, s->nonce))
                continue; /* stale or forged: not the current command's */
            if (kind == 'E' && got == 3 && !s->got_status && s->tstage != T_SYNC) {
                s->got_status = true;
                s->status_code = code;
                if (s->phase == 2) {
                    run_finish(s);
                } else {
                    s->tstage = T_MARKER;
                    uv_timer_start(s->timer, on_timer, MARKER_WAIT_MS, 0);
                }
            } else if (kind == 'Y' && s->tstage == T_SYNC) {
                s->synced = true;
                run_finish(s);
            }
        }
        if (s->socklen >= sizeof(s->sockbuf) - 1)
            s->socklen = 0; /* a line that long is not ours */
    }
}

static void on_eof_timer(uv_timer_t *t)
{
    struct session *s = t->data;
    if (s->proc_live && s->shells == s->eof_shell && !s->closing) {
        snprintf(s->kill_reason, sizeof(s->kill_reason),
                 "the shell closed its control channel (fd 62)");
        conch_super_signal(&s->proc, SIGKILL);
    }
}

static void sock_poll_update(struct session *s)
{
    if (!s->sock_poll)
        return;
    int ev = UV_READABLE | (s->wpend ? UV_WRITABLE : 0);
    uv_poll_start(s->sock_poll, ev, on_sock);
}

static void sock_flush(struct session *s)
{
    while (s->wpend && s->wpend_off < s->wpend_len) {
        ssize_t n = send(s->sock, s->wpend + s->wpend_off, s->wpend_len - s->wpend_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        s->wpend_off += (size_t)n;
    }
    if (s->wpend && s->wpend_off >= s->wpend_len) {
        free(s->wpend);
        s->wpend = NULL;
    }
    sock_poll_update(s);
}

static void sock_write(struct session *s, const char *buf, size_t len)
{
    char *nb = realloc(s->wpend, s->wpend_len - s->wpend_off + len);
    if (!nb)
        return;
    if (s->wpend) {
        memmove(nb, nb + s->wpend_off, s->wpend_len - s->wpend_off);
        s->wpend_len -= s->wpend_off;
    } else {
        s->wpend_len = 0;
    }
    s->wpend_off = 0;
    memcpy(nb + s->wpend_len, buf, len);
    s->wpend_len += len;
    s->wpend = nb;
    sock_flush(s);
}

/* Keys wait in a queue while the terminal's input queue is full (4 KiB in canonical mode, a
 * program that does not read): the loop never blocks on it, and a client gets `limit` past
 * MAX_PENDING_KEYS. */
#define MAX_PENDING_KEYS (1u << 20)

static void master_poll_update(struct session *s)
{
    if (s->master_poll)
        uv_poll_start(s->master_poll, UV_READABLE | (s->mpend ? UV_WRITABLE : 0), on_master);
}

static void master_flush(struct session *s)
{
    while (s->mpend && s->mpend_off < s->mpend_len && s->master >= 0) {
        ssize_t n = write(s->master, s->mpend + s->mpend_off, s->mpend_len - s->mpend_off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        s->mpend_off += (size_t)n;
    }
    if (s->mpend && (s->mpend_off >= s->mpend_len || s->master < 0)) {
        free(s->mpend);
        s->mpend = NULL;
        s->mpend_len = s->mpend_off = 0;
    }
    master_poll_update(s);
}

static int master_write(struct session *s, const char *buf, size_t len)
{
    if (s->master < 0) {
        errno = EIO;
        return -1;
    }
    size_t left = s->mpend ? s->mpend_len - s->mpend_off : 0;
    if (left + len > MAX_PENDING_KEYS) {
        errno = ENOBUFS;
        return -1;
    }
    char *nb = malloc(left + len);
    if (!nb) {
        errno = ENOMEM;
        return -1;
    }
    if (left)
        memcpy(nb, s->mpend + s->mpend_off, left);
    memcpy(nb + left, buf, len);
    free(s->mpend);
    s->mpend = nb;
    s->mpend_len = left + len;
    s->mpend_off = 0;
    master_flush(s);
    return 0;
}

/* ---- timers ---- */

/* Send @sig to the terminal's foreground process group. TIOCSIG (which works whatever the
 * program did to its termios) only takes SIGINT, SIGQUIT and SIGTSTP; other signals go by
 * kill() to the group the terminal names (a host pid: the sandbox's pid namespaces are
 * below ours), never to the shell's own group. */
static int fg_signal(struct session *s, int sig)
{
    if (s->master < 0)
        return -1;
    if (sig == SIGINT || sig == SIGQUIT || sig == SIGTSTP)
        return ioctl(s->master, TIOCSIG, sig);
    pid_t pg = 0;
    if (ioctl(s->master, TIOCGPGRP, &pg) < 0 || pg <= 1)
        return -1;
    return kill(-pg, sig);
}

static void on_timer(uv_timer_t *t)
{
    struct session *s = t->data;
    if (!s->cur) {
        if (s->tstage == T_BUSY) {
            s->tstage = T_NONE;
            session_pump(s);
        }
        return;
    }
    switch (s->tstage) {
    case T_DEADLINE:
        /* Interrupt: SIGINT to the terminal's foreground process group (whatever the
         * command did to its termios), then SIGKILL after the grace. */
        s->timed_out = true;
        if (s->master >= 0)
            ioctl(s->master, TIOCSIG, SIGINT);
        s->tstage = T_GRACE;
        uv_timer_start(s->timer, on_timer, s->cur->grace_ms ? s->cur->grace_ms : 1, 0);
        break;
    case T_GRACE: {
        /* Still not back: kill the foreground job unless it is the shell itself, then ask
         * the shell to show it is reading commands again. */
        pid_t pg = 0, sid = 0;
        if (s->master >= 0 && ioctl(s->master, TIOCGPGRP, &pg) == 0 &&
            ioctl(s->master, TIOCGSID, &sid) == 0 && pg != sid) {
            fg_signal(s, SIGKILL);
            s->killed_fg = true;
        }
        s->tstage = T_SYNC;
        char rec[40];
        int n = snprintf(rec, sizeof(rec), "%s", s->nonce);
        sock_write(s, rec, (size_t)n + 1);
        master_write(s, "\x15 __conch_y\n", 12);
        uv_timer_start(s->timer, on_timer, 2000 + s->cur->grace_ms, 0);
        break;
    }
    case T_SYNC:
        /* The shell itself does not come back (it ignores SIGINT in a loop of builtins):
         * kill it; the next command starts a new one. */
        conch_super_signal(&s->proc, SIGKILL);
        s->tstage = T_NONE;
        break;
    case T_MARKER:
        run_finish(s);
        break;
    }
}

/* ---- the shell's life ---- */

static void session_clear_run_state(struct session *s)
{
    s->phase = 0;
    s->carry_len = 0;
    s->pending_cr = false;
    s->got_status = false;
    s->timed_out = s->killed_fg = s->shell_died = s->synced = false;
    s->tstage = T_NONE;
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
    char end_reason[600];
    uint64_t timeout_ms, grace_ms;
};

/* The result object of a session command: @res (borrowed) and @x. Touches nothing of the
 * daemon's: a worker may build it. */
static json_t *session_result_json(const struct conch_run_result *res, const struct result_extra *x)
{
    json_t *o = conch_run_result_json(res, NULL);
    char *text = conch_run_result_text(res);
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
    char *text; /* what the worker serialised */
};

static void session_answer_free(struct session_answer *a)
{
    json_decref(a->result);
    conch_output_done(&a->res.out);
    conch_output_done(&a->res.err);
    conch_run_tool_calls_done(&a->res.tools);
    conch_ws_changes_done(&a->changes);
    free(a->text);
    free(a);
}

/* The answer is out: the session's next command may start. */
static void session_answered(struct session_answer *a)
{
    struct session *s = session_find(a->session);
    session_answer_free(a);
    if (s) {
        s->scanning = false;
        session_pump(s);
    }
}

static void answer_work(uv_work_t *req)
{
    struct session_answer *a = req->data;
    json_t *o = session_result_json(&a->res, &a->x);
    if (o && a->has_changes)
        conch_ws_changes_json_set(o, &a->changes, SESSION_CHANGES_MAX);
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

/* Build and send the result of the current command, then start the next one. */
static void run_finish(struct session *s)
{
    struct srun *r = s->cur;
    if (!r)
        return;
    s->cur = NULL;
    uv_timer_stop(s->timer);
    struct session_answer *a = calloc(1, sizeof(*a));
    struct conch_run_result res;
    memset(&res, 0, sizeof(res));
    res.out = s->cap;
    res.err = s->nocap;
    res.duration_ms = daemon_now_ms() - s->start_ms;
    int code;
    if (s->shell_died)
        code = s->end_code >= 0 ? s->end_code : 137;
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
                             .timeout_ms = r->timeout_ms,
                             .grace_ms = r->grace_ms};
    snprintf(x.session, sizeof(x.session), "%s", s->id);
    snprintf(x.end_reason, sizeof(x.end_reason), "%s", s->end_reason);
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
    s->last_used_at = daemon_now();
    struct sandbox *sb = sess_sb(s);
    if (sb)
        sandbox_touch(sb);
    if (!a) {
        session_pump(s);
        return;
    }
    a->d = s->d;
    a->call = call;
    a->req.data = a;
    snprintf(a->session, sizeof(a->session), "%s", s->id);
    /* Until the answer is out the next command waits: it would otherwise see this one's
     * changes as its own, or be answered first. */
    s->scanning = true;
    /* The result lists the workspace's changes, as exec.run's does: a worker scans them. */
    if (sb && sb->upper_dir[0] && !sb->super.gone &&
        sandbox_changes_async(sb, changes_done, a) == 0)
        return;
    session_answer_send(a);
}

static void fail_queue(struct session *s, const char *why)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->queue)
    {
        struct srun *r = dlist_entry(pos, struct srun, link);
        dlist_del(&r->link);
        conch_rpc_call_failf(r->call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s ended: %s", s->id, why);
        srun_free(r);
    }
}

/* Start the next queued command when the shell waits for one. */
static void session_pump(struct session *s)
{
    if (s->cur || s->scanning || dlist_empty(&s->queue) || s->closing)
        return;
    if (s->d->stopping) {
        fail_queue(s, "the daemon is shutting down");
        return;
    }
    if (s->state == SS_ENDED) {
        struct sandbox *sb = s->recovered ? NULL : sess_sb(s);
        if (!sb || sb->state != SB_READY) {
            fail_queue(s, s->end_reason);
            return;
        }
        struct conch_err err = {0};
        if (shell_start(s, &err) < 0) {
            fail_queue(s, err.msg);
            return;
        }
        s->new_shell = true;
    }
    if (s->state != SS_LIVE)
        return; /* started again when the master arrives */
    struct srun *r = dlist_entry(s->queue.next, struct srun, link);
    /* A program of a person's (an editor, a pager) has the terminal: typing into it would
     * be wrong. Commands run only when the shell itself is in the foreground. */
    pid_t pg = 0, sid = 0;
    if (ioctl(s->master, TIOCGPGRP, &pg) == 0 && ioctl(s->master, TIOCGSID, &sid) == 0 &&
        pg != sid) {
        if (!s->busy_since)
            s->busy_since = daemon_now_ms();
        if (daemon_now_ms() - s->busy_since < BUSY_WAIT_MS) {
            s->tstage = T_BUSY;
            uv_timer_start(s->timer, on_timer, 20, 0);
            return;
        }
        s->busy_since = 0;
        dlist_del(&r->link);
        conch_rpc_call_failf(r->call, CONCH_RPC_LIMIT, "session_busy", NULL,
                             "session %s: a program is running in the foreground of its "
                             "terminal; wait for it, or end it with session.signal",
                             s->id);
        srun_free(r);
        session_pump(s);
        return;
    }
    s->busy_since = 0;
    if (s->tstage == T_BUSY)
        uv_timer_stop(s->timer);
    dlist_del(&r->link);
    s->cur = r;
    session_clear_run_state(s);
    struct conch_err err = {0};
    s->cap.spill_fd = s->nocap.spill_fd = -1;
    if (conch_output_init(&s->cap, "stdout", r->max_output, 256ULL << 20,
                          sess_sb(s) ? sandbox_spill_dir(sess_sb(s)) : NULL, &err) < 0 ||
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
    s->mark_len = (size_t)snprintf(s->mark_s, sizeof(s->mark_s), "\x1b]697;S%s\a", s->nonce);
    snprintf(s->mark_e, sizeof(s->mark_e), "\x1b]697;E%s\a", s->nonce);
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
    s->start_ms = daemon_now_ms();
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
    sock_write(s, rec, off);
    free(rec);
    if (r->has_in)
        master_write(s, "\x15 __conch_ri\n", 13);
    else
        master_write(s, "\x15 __conch_r\n", 12);
    if (r->timeout_ms) {
        s->tstage = T_DEADLINE;
        uv_timer_start(s->timer, on_timer, r->timeout_ms, 0);
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

static void set_winsize(struct session *s)
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
    fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
    fcntl(s->sock, F_SETFL, fcntl(s->sock, F_GETFL) | O_NONBLOCK);
    s->master = master;
    set_winsize(s);
    s->master_poll = malloc(sizeof(*s->master_poll));
    s->sock_poll = malloc(sizeof(*s->sock_poll));
    uv_poll_init(&s->d->loop, s->master_poll, master);
    uv_poll_init(&s->d->loop, s->sock_poll, s->sock);
    s->master_poll->data = s->sock_poll->data = s;
    uv_poll_start(s->master_poll, UV_READABLE, on_master);
    sock_poll_update(s);
    s->state = SS_LIVE;
    if (s->open_call) {
        conch_rpc_call_reply(s->open_call, session_json(s));
        s->open_call = NULL;
    }
    json_t *params = json_pack("{s:s,s:i}", "session", s->id, "shell", s->shells);
    notify_all(s, "session.started", params);
    session_pump(s);
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
        master_drain(s);
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
        session_free(s);
        return;
    }
    if (s->open_call) {
        struct conch_err err = {0};
        conch_err_set(&err, EIO, "session.open: %s", s->end_reason);
        conch_rpc_call_fail_err(s->open_call, 0, NULL, &err);
        s->open_call = NULL;
    }
    session_end(s, s->end_reason);
}

static const struct conch_proc_ops shell_ops = {.started = shell_started, .ended = shell_ended};

static void session_close_fds(struct session *s)
{
    close_poll(&s->master_poll);
    close_poll(&s->sock_poll);
    if (s->master >= 0)
        close(s->master);
    if (s->sock >= 0)
        close(s->sock);
    s->master = s->sock = -1;
    free(s->wpend);
    s->wpend = NULL;
    free(s->mpend);
    s->mpend = NULL;
    s->mpend_len = s->mpend_off = 0;
    s->socklen = 0;
}

/* The shell is gone (exit, sandbox destroyed, idle, close): tell every client why. The
 * current command ends with the shell's status; queued ones start a new shell. */
static void session_end(struct session *s, const char *why)
{
    if (s->state == SS_ENDED)
        return;
    s->state = SS_ENDED;
    if (why != s->end_reason)
        snprintf(s->end_reason, sizeof(s->end_reason), "%s", why);
    session_close_fds(s);
    if (s->save)
        uv_timer_stop(s->save);
    json_t *params = json_pack("{s:s,s:s,s:i}", "session", s->id, "reason", s->end_reason,
                               "exit_code", s->end_code);
    notify_all(s, "session.ended", params);
    session_record(s);
    if (s->cur) {
        s->shell_died = true;
        run_finish(s); /* pumps the queue: a new shell if the sandbox lives */
    } else {
        session_pump(s);
    }
}

static int shell_start(struct session *s, struct conch_err *err)
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
    size_t n = json_object_size(sb->env) + json_object_size(s->env) + 4;
    char **extra = calloc(n + 1, sizeof(char *));
    size_t i = 0;
    if (extra) {
        extra[i++] = strdup("TERM=xterm-256color");
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
        env = conch_exec_env_build(extra, sb->as_root, err);
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

/* ---- records: sessions listed after a restart ---- */

/* Each session has a record in <state>/sessions/: <id>.json (what session.list shows) and
 * <id>.out (the scrollback), written on open, at its end, and at most every SAVE_MS while it
 * prints (so that a daemon killed by SIGKILL still leaves a recent scrollback). A restarted
 * daemon lists them as ended. Files, not the SQLite database: a scrollback is a blob written
 * often, and the schema stays the sandboxes'. At most MAX_RECORDS are kept (oldest ended
 * ones go first). */
#define MAX_RECORDS 256

static int records_dir(struct daemon *d, char *buf, size_t size)
{
    int n = snprintf(buf, size, "%s/sessions", d->state_dir);
    if (n < 0 || (size_t)n >= size)
        return -1;
    if (mkdir(buf, 0700) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

static void write_file(const char *dir, const char *name, const char *data, size_t len)
{
    char tmp[PATH_MAX + 64], dst[PATH_MAX + 64];
    snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", dir, name);
    snprintf(dst, sizeof(dst), "%s/%s", dir, name);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    int r = conch_write_all(fd, data, len);
    close(fd);
    if (r < 0 || rename(tmp, dst) < 0) {
        log_warn("session record %s: %s", dst, strerror(r < 0 ? -r : errno));
        unlink(tmp);
    }
}

static void session_save(struct session *s, bool with_scrollback)
{
    char dir[PATH_MAX];
    if (s->recovered || records_dir(s->d, dir, sizeof(dir)) < 0)
        return;
    json_t *o = session_json(s);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    char name[64];
    if (text) {
        snprintf(name, sizeof(name), "%s.json", s->id);
        write_file(dir, name, text, strlen(text));
        free(text);
    }
    if (with_scrollback) {
        size_t len = 0;
        char *sbk = ring_copy(s, &len);
        if (sbk) {
            snprintf(name, sizeof(name), "%s.out", s->id);
            write_file(dir, name, sbk, len);
            free(sbk);
        }
        s->saved_seq = s->seq;
    }
}

static void on_save(uv_timer_t *t)
{
    struct session *s = t->data;
    if (s->saved_seq != s->seq)
        session_save(s, true);
}

static void session_record(struct session *s)
{
    session_save(s, true);
}

static void session_unrecord(struct session *s)
{
    char dir[PATH_MAX], path[PATH_MAX + 64];
    if (records_dir(s->d, dir, sizeof(dir)) < 0)
        return;
    snprintf(path, sizeof(path), "%s/%s.json", dir, s->id);
    unlink(path);
    snprintf(path, sizeof(path), "%s/%s.out", dir, s->id);
    unlink(path);
}

/* A record of ours: never through a link planted in its place. NULL when unreadable. */
static char *read_record(const char *path, size_t max, size_t *ret_len)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    char *buf = NULL;
    *ret_len = 0;
    if (fd < 0 || conch_read_fd(fd, path, max, &buf, ret_len, NULL) < 0)
        return NULL;
    return buf;
}

/* ---- idle ---- */

static void on_idle(uv_timer_t *t)
{
    struct session *s = t->data;
    if (s->cur || !dlist_empty(&s->queue)) {
        uv_timer_start(s->idle, on_idle, (uint64_t)(s->idle_timeout * 1000), 0);
        return;
    }
    if (s->state != SS_ENDED && s->proc_live) {
        snprintf(s->kill_reason, sizeof(s->kill_reason), "idle for %.0f s", s->idle_timeout);
        conch_super_signal(&s->proc, SIGKILL);
    }
}

/* The session (and its sandbox, whose own idle timer knows nothing of sessions) is in use. */
static void touch(struct session *s)
{
    s->last_used_at = daemon_now();
    if (s->idle_timeout > 0 && s->idle)
        uv_timer_start(s->idle, on_idle, (uint64_t)(s->idle_timeout * 1000), 0);
    struct sandbox *sb = s->recovered ? NULL : sess_sb(s);
    if (sb)
        sandbox_touch(sb);
}

/* ---- JSON ---- */

static int queued_count(struct session *s)
{
    int n = s->cur ? 1 : 0;
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->queue) n++;
    return n;
}

static json_t *session_json(struct session *s)
{
    prune_clients(s);
    struct dlist *pos, *tmp;
    int clients = 0, writers = 0;
    dlist_for_each_safe(pos, tmp, &s->clients)
    {
        clients++;
        if (dlist_entry(pos, struct sclient, link)->writer)
            writers++;
    }
    json_t *o = json_pack("{s:s,s:s,s:s,s:i,s:i,s:i,s:f,s:f,s:I,s:i,s:i}", "session", s->id,
                          "sandbox", s->sandbox_id, "state",
                          s->state == SS_ENDED  ? "ended"
                          : s->state == SS_LIVE ? "running"
                                                : "starting",
                          "clients", clients, "rows", s->rows, "cols", s->cols, "created_at",
                          s->created_at, "last_used_at", s->last_used_at, "output_bytes",
                          (json_int_t)s->seq, "shells", (int)s->shells, "queued", queued_count(s));
    if (s->state == SS_ENDED) {
        json_object_set_new(o, "reason", json_string(s->end_reason));
        json_object_set_new(o, "exit_code",
                            s->end_code >= 0 ? json_integer(s->end_code) : json_null());
    }
    json_object_set_new(o, "writer", json_boolean(writers > 0));
    return o;
}

static struct session *find_or_fail(struct conch_rpc_call *call, json_t *params)
{
    const char *id = conch_rpc_str(params, "session", "");
    struct session *s = session_find(id);
    if (!s)
        conch_rpc_call_failf(call, CONCH_RPC_JOB_NOT_FOUND, "session_not_found", NULL,
                             "no session '%s' (session.list shows them)", id);
    return s;
}

static struct sclient *client_of(struct session *s, struct conch_rpc_sink *sink)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = dlist_entry(pos, struct sclient, link);
        if (c->sink == sink)
            return c;
    }
    return NULL;
}

/* The ctx of a handler is the client the request came from. */
static struct conch_rpc_sink *ctx_sink(void *ctx)
{
    struct client *c = ctx;
    return c ? c->sink : NULL;
}

/* ---- handlers ---- */

void handle_session_open(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct client *cl = ctx;
    struct daemon *d = cl->d;
    const char *shell = conch_rpc_str(params, "shell", "bash");
    if (strcmp(shell, "bash") && strcmp(shell, "/bin/bash")) {
        conch_rpc_call_fail_param(call, "shell", "only bash is supported for now");
        return;
    }
    if (n_sessions >= MAX_SESSIONS_PER_DAEMON) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL, "too many sessions (%d)",
                             MAX_SESSIONS_PER_DAEMON);
        return;
    }
    struct sandbox *sb = sandbox_find_running(d, call, conch_rpc_str(params, "sandbox", ""));
    if (!sb)
        return;
    struct session *s = calloc(1, sizeof(*s));
    if (!s) {
        conch_rpc_call_failf(call, -32603, "internal_error", NULL, "out of memory");
        return;
    }
    s->d = d;
    s->sock = s->master = -1;
    /* Random beside the counter: a restarted daemon counts from 1 again, and rand() unseeded
     * named every daemon's first session ses-1-4567, so that `conch attach` joined a dead one. */
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        rnd = ((uint32_t)getpid() * 0x9e3779b9u) ^ (uint32_t)(uintptr_t)&rnd;
    snprintf(s->id, sizeof(s->id), "ses-%llu-%08x", (unsigned long long)++next_session, rnd);
    snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb->id);
    DLIST_INIT(&s->clients);
    DLIST_INIT(&s->queue);
    s->rows = (unsigned short)conch_rpc_int(params, "rows", 24);
    s->cols = (unsigned short)conch_rpc_int(params, "cols", 80);
    s->ring_cap = (size_t)conch_rpc_int(params, "scrollback", SCROLLBACK_DEFAULT);
    s->ring = s->ring_cap ? malloc(s->ring_cap) : NULL;
    s->env = json_incref(json_object_get(params, "env"));
    const char *cwd = conch_rpc_str(params, "cwd", NULL);
    if (cwd && cwd[0] == '/')
        s->cwd = strdup(cwd);
    else if (cwd && *cwd && asprintf(&s->cwd, "/workspace/%s", cwd) < 0)
        s->cwd = NULL;
    if (!s->cwd)
        s->cwd = strdup("/workspace");
    s->idle_timeout = conch_rpc_num(params, "idle_timeout", 3600);
    s->created_at = s->last_used_at = daemon_now();
    s->cap.spill_fd = s->nocap.spill_fd = -1;
    struct conch_err err = {0};
    if ((s->ring_cap && !s->ring) || session_timers_open(s) < 0 || shell_start(s, &err) < 0) {
        if (!err.code)
            conch_err_set(&err, ENOMEM, "out of memory");
        session_timers_close(s);
        free(s->ring);
        free(s->cwd);
        json_decref(s->env);
        free(s);
        conch_rpc_call_fail_err(call, 0, NULL, &err);
        return;
    }
    dlist_add(&sessions, &s->link);
    n_sessions++;
    sessions_trim(d);
    session_save(s, false);
    touch(s);
    sandbox_touch(sb);
    /* The client that opened it is attached (read-only unless it asks to write). */
    struct conch_rpc_sink *sink = ctx_sink(ctx);
    if (sink && conch_rpc_bool(params, "attach", false)) {
        struct sclient *c = calloc(1, sizeof(*c));
        if (c) {
            c->sink = conch_rpc_sink_ref(sink);
            c->writer = true;
            dlist_add(&s->clients, &c->link);
        }
    }
    s->open_call = call; /* answered when the shell has started (or failed to) */
}

void handle_session_run(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    size_t clen = 0, in_len = 0;
    const char *command = conch_rpc_strn(params, "command", &clen);
    if (!command || strlen(command) != clen) {
        conch_rpc_call_fail_param(call, "command", "command must be a string without NUL bytes");
        return;
    }
    const char *in = conch_rpc_strn(params, "stdin", &in_len);
    if (in && strlen(in) != in_len) {
        conch_rpc_call_fail_param(call, "stdin", "stdin must be text without NUL bytes");
        return;
    }
    unsigned queued = 0;
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->queue) queued++;
    if (queued >= MAX_QUEUE) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                             "too many commands queued on session %s (%d)", s->id, MAX_QUEUE);
        return;
    }
    struct srun *r = calloc(1, sizeof(*r));
    if (!r) {
        conch_rpc_call_failf(call, -32603, "internal_error", NULL, "out of memory");
        return;
    }
    r->s = s;
    r->call = call;
    r->command = strdup(command);
    if (in) {
        r->has_in = true;
        /* A here-string adds the final newline back. */
        if (in_len && in[in_len - 1] == '\n')
            in_len--;
        r->in = strndup(in, in_len);
        r->in_len = in_len;
    }
    double timeout = conch_rpc_num(params, "timeout", 120);
    double grace = conch_rpc_num(params, "grace", 2);
    r->timeout_ms = timeout > 0 ? (uint64_t)(timeout * 1000) : 0;
    r->grace_ms = (uint64_t)(grace * 1000);
    long long mo = conch_rpc_int(params, "max_output", 1 << 20);
    r->max_output = mo > 0 ? (size_t)mo : 1 << 20;
    dlist_add(&s->queue, &r->link);
    touch(s);
    session_pump(s);
}

void handle_session_write(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    struct conch_rpc_sink *sink = ctx_sink(ctx);
    prune_clients(s);
    struct sclient *me = client_of(s, sink);
    struct dlist *pos, *tmp;
    bool other_writer = false;
    dlist_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = dlist_entry(pos, struct sclient, link);
        if (c != me && c->writer)
            other_writer = true;
    }
    if (other_writer && !(me && me->writer)) {
        conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "not_writer", NULL,
                             "another client writes to session %s; take over with "
                             "session.attach {write: true}",
                             s->id);
        return;
    }
    if (s->state != SS_LIVE) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s is not running (%s)", s->id,
                             s->state == SS_ENDED ? s->end_reason : "starting");
        return;
    }
    size_t len = 0;
    const char *data = conch_rpc_strn(params, "data", &len);
    if (master_write(s, data, len) < 0) {
        if (errno == ENOBUFS)
            conch_rpc_call_failf(call, CONCH_RPC_LIMIT, "limit", NULL,
                                 "session %s: %u bytes of keys wait already: the program in its "
                                 "terminal does not read them",
                                 s->id, MAX_PENDING_KEYS);
        else
            conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                                 "session %s: write to its terminal: %s", s->id, strerror(errno));
        return;
    }
    touch(s);
    conch_rpc_call_reply(call, json_pack("{s:I}", "written", (json_int_t)len));
}

void handle_session_attach(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    struct conch_rpc_sink *sink = ctx_sink(ctx);
    if (!sink) {
        conch_rpc_call_failf(call, -32602, "invalid_params", NULL, "no connection to attach");
        return;
    }
    bool write = conch_rpc_bool(params, "write", false);
    struct sclient *me = client_of(s, sink);
    if (!me) {
        me = calloc(1, sizeof(*me));
        if (!me) {
            conch_rpc_call_failf(call, -32603, "internal_error", NULL, "out of memory");
            return;
        }
        me->sink = conch_rpc_sink_ref(sink);
        dlist_add(&s->clients, &me->link);
    }
    if (write) {
        struct dlist *pos, *tmp;
        dlist_for_each_safe(pos, tmp, &s->clients)
        {
            struct sclient *c = dlist_entry(pos, struct sclient, link);
            if (c != me && c->writer) {
                c->writer = false;
                client_notify(c->sink, "session.writer",
                              json_pack("{s:s,s:b,s:s}", "session", s->id, "writer", 0, "reason",
                                        "another client took over"));
            }
        }
        me->writer = true;
    }
    size_t len = 0;
    char *sbk = ring_copy(s, &len);
    json_t *o = session_json(s);
    json_object_set_new(o, "scrollback", conch_json_text(sbk ? sbk : "", sbk ? len : 0));
    json_object_set_new(o, "seq", json_integer((json_int_t)(s->seq - len)));
    json_object_set_new(o, "next_seq", json_integer((json_int_t)s->seq));
    json_object_set_new(o, "you_write", json_boolean(me->writer));
    free(sbk);
    touch(s);
    conch_rpc_call_reply(call, o);
}

void handle_session_detach(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    struct sclient *me = client_of(s, ctx_sink(ctx));
    if (me) {
        dlist_del(&me->link);
        conch_rpc_sink_unref(me->sink);
        free(me);
    }
    conch_rpc_call_reply(call, json_pack("{s:b}", "detached", me != NULL));
}

void handle_session_resize(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    s->rows = (unsigned short)conch_rpc_int(params, "rows", s->rows);
    s->cols = (unsigned short)conch_rpc_int(params, "cols", s->cols);
    set_winsize(s);
    conch_rpc_call_reply(call, json_pack("{s:i,s:i}", "rows", s->rows, "cols", s->cols));
}

void handle_session_signal(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    const char *name = conch_rpc_str(params, "signal", "INT");
    static const struct {
        const char *name;
        int sig;
    } sigs[] = {{"INT", SIGINT},   {"TERM", SIGTERM}, {"KILL", SIGKILL},
                {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"TSTP", SIGTSTP},
                {"CONT", SIGCONT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}};
    int sig = 0;
    if (!strncmp(name, "SIG", 3))
        name += 3;
    for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
        if (!strcmp(name, sigs[i].name))
            sig = sigs[i].sig;
    if (!sig) {
        conch_rpc_call_fail_param(call, "signal", "unknown signal '%s'", name);
        return;
    }
    if (s->state != SS_LIVE || s->master < 0 || fg_signal(s, sig) < 0) {
        conch_rpc_call_failf(call, CONCH_RPC_SANDBOX_STOPPED, "session_ended", NULL,
                             "session %s is not running", s->id);
        return;
    }
    conch_rpc_call_reply(call, json_pack("{s:i}", "signal", sig));
}

void handle_session_list(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    const char *sb = conch_rpc_str(params, "sandbox", NULL);
    json_t *a = json_array();
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &sessions)
    {
        struct session *s = dlist_entry(pos, struct session, link);
        if (!sb || !strcmp(sb, s->sandbox_id))
            json_array_append_new(a, session_json(s));
    }
    conch_rpc_call_reply(call, json_pack("{s:o}", "sessions", a));
}

static void session_free(struct session *s)
{
    struct dlist *pos, *tmp;
    dlist_for_each_safe(pos, tmp, &s->clients)
    {
        struct sclient *c = dlist_entry(pos, struct sclient, link);
        dlist_del(&c->link);
        conch_rpc_sink_unref(c->sink);
        free(c);
    }
    session_timers_close(s);
    free(s->ring);
    free(s->cwd);
    json_decref(s->env);
    conch_bridge_report_done(&s->tools);
    free(s);
}

/* Forget @s: kill its shell (its end comes at once, synchronously or not), tell clients. */
static void session_destroy(struct session *s, const char *why)
{
    s->closing = true;
    fail_queue(s, why);
    if (s->state != SS_ENDED)
        session_end(s, why);
    session_unrecord(s);
    dlist_del(&s->link);
    n_sessions--;
    /* The proc stays the supervisor's until its final event: shell_ended frees @s then. */
    if (s->proc_live)
        conch_super_signal(&s->proc, SIGKILL);
    else
        session_free(s);
}

void handle_session_close(struct conch_rpc_call *call, json_t *params, void *ctx)
{
    (void)ctx;
    struct session *s = find_or_fail(call, params);
    if (!s)
        return;
    session_destroy(s, "closed by a client");
    conch_rpc_call_reply(call, json_pack("{s:b}", "closed", 1));
}

/* Forget the oldest ended sessions past MAX_RECORDS (and their records). */
static void sessions_trim(struct daemon *d)
{
    (void)d;
    while (n_sessions > MAX_RECORDS) {
        struct session *old = NULL;
        struct dlist *pos, *tmp;
        dlist_for_each_safe(pos, tmp, &sessions)
        {
            struct session *s = dlist_entry(pos, struct session, link);
            if (s->state == SS_ENDED && !s->cur && dlist_empty(&s->queue) && !s->proc_live &&
                (!old || s->created_at < old->created_at))
                old = s;
        }
        if (!old)
            return;
        session_unrecord(old);
        dlist_del(&old->link);
        n_sessions--;
        session_free(old);
    }
}

void sessions_recover(struct daemon *d)
{
    char dir[PATH_MAX];
    if (records_dir(d, dir, sizeof(dir)) < 0)
        return;
    DIR *dh = opendir(dir);
    if (!dh)
        return;
    struct dirent *e;
    while ((e = readdir(dh))) {
        size_t nl = strlen(e->d_name);
        if (e->d_name[0] == '.' || nl < 6 || nl > 40 || strcmp(e->d_name + nl - 5, ".json"))
            continue;
        char path[PATH_MAX + 64];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t len = 0;
        char *text = read_record(path, 1 << 16, &len);
        json_t *o = text ? json_loadb(text, len, 0, NULL) : NULL;
        free(text);
        const char *id = json_string_value(json_object_get(o, "session"));
        const char *sb = json_string_value(json_object_get(o, "sandbox"));
        struct session *s = id && sb && !session_find(id) ? calloc(1, sizeof(*s)) : NULL;
        if (!s) {
            json_decref(o);
            continue;
        }
        s->d = d;
        s->recovered = true;
        s->state = SS_ENDED;
        s->sock = s->master = -1;
        snprintf(s->id, sizeof(s->id), "%s", id);
        snprintf(s->sandbox_id, sizeof(s->sandbox_id), "%s", sb);
        const char *why = json_string_value(json_object_get(o, "reason"));
        if (!strcmp(json_string_value(json_object_get(o, "state")) ?: "", "ended") && why)
            snprintf(s->end_reason, sizeof(s->end_reason), "%s", why);
        else
            snprintf(s->end_reason, sizeof(s->end_reason),
                     "the daemon stopped while it ran (listed from its record)");
        json_t *code = json_object_get(o, "exit_code");
        s->end_code = json_is_integer(code) ? (int)json_integer_value(code) : -1;
        s->rows = (unsigned short)json_integer_value(json_object_get(o, "rows"));
        s->cols = (unsigned short)json_integer_value(json_object_get(o, "cols"));
        s->created_at = json_real_value(json_object_get(o, "created_at"));
        s->last_used_at = json_real_value(json_object_get(o, "last_used_at"));
        json_decref(o);
        DLIST_INIT(&s->clients);
        DLIST_INIT(&s->queue);
        snprintf(path, sizeof(path), "%s/%s.out", dir, s->id);
        s->ring = read_record(path, 64u << 20, &len);
        s->ring_cap = s->ring_len = s->ring ? len : 0;
        s->ring_pos = 0;
        s->seq = s->ring_len;
        s->cap.spill_fd = s->nocap.spill_fd = -1;
        if (session_timers_open(s) < 0) {
            free(s->ring);
            free(s);
            continue;
        }
        dlist_add(&sessions, &s->link);
        n_sessions++;
    }
    closedir(dh);
    sessions_trim(d);
}
