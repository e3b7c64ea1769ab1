/* session-io.c - a session's I/O on the loop: the pty master (keys in, output to the
 * scrollback ring, to attached clients and to the current command's capture between its
 * markers), the shell's control socket (records out, status lines in), the command's timers
 * (deadline, grace, sync, end marker) and the session's libuv handles.
 *
 * Whose word counts: the socket passes its sender's credentials (SO_PASSCRED) and only lines
 * the shell's own process wrote count, so a program the shell runs cannot report, whatever it
 * reads from the shell's memory or copies with pidfd_getfd. Shell code cannot redefine the
 * reporter (read-only), reach it through an alias (every name typed is quoted), shadow the
 * builtins it uses (it removes a function named `builtin` with posix mode's unshadowable
 * `unset`) or disable them (`enable` is gone). Shell code that locks the reporter out anyway
 * makes it report "B": the result says the status is unknown and the shell is replaced. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/log.h"
#include "daemon/session-internal.h"
#include "exec/result.h"

/* After the status arrived, how long to wait for the end marker on the terminal (it only
 * lags by a workqueue hop of the pty) before finishing without it. */
#define MARKER_WAIT_MS 500

/* ---- handles ---- */

static void free_handle(uv_handle_t *h)
{
    free(h);
}

/* A session's four timers (command deadline, idle timeout, record save, EOF grace), each a
 * handle of its own; all or none. Returns 0 or -ENOMEM. */
int conch_daemon_session_timers_open(struct session *s)
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

void conch_daemon_session_timers_close(struct session *s)
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

/* ---- scrollback ---- */

/* Make room in the ring for @len more bytes while it has not wrapped yet: it grows (doubling,
 * at least 64 KiB) up to ring_cap, as far as the sandbox's budget grants (leaving half of it
 * to the rest). Past that it wraps at the size it has: a flood keeps the daemon within the
 * budget, the scrollback just holds less. */
static void ring_grow(struct session *s, size_t len)
{
    if (s->ring_size >= s->ring_cap || s->ring_pos != s->ring_len ||
        s->ring_len + len <= s->ring_size || !s->held_sb)
        return;
    size_t want = s->ring_size * 2;
    if (want < s->ring_len + len)
        want = s->ring_len + len;
    if (want < (64u << 10))
        want = 64u << 10;
    if (want > s->ring_cap)
        want = s->ring_cap;
    /* Scrollback may take half of the sandbox's budget at most: a session printing without
     * end must not leave its tool bridge and file answers no room. */
    struct conch_budget *b = &s->held_sb->held;
    uint64_t room = conch_budget_room(b), reserve = b->cap / 2;
    uint64_t ask = want - s->ring_size;
    if (room <= reserve)
        return;
    if (ask > room - reserve)
        ask = room - reserve;
    uint64_t grant = conch_budget_charge_upto(b, ask);
    if (!grant)
        return;
    char *nb = realloc(s->ring, s->ring_size + grant);
    if (!nb) {
        conch_budget_uncharge(&s->held_sb->held, grant);
        return;
    }
    s->ring = nb;
    s->ring_size += grant;
    s->ring_charged += grant;
}

static void ring_append(struct session *s, const char *buf, size_t len)
{
    ring_grow(s, len);
    size_t size = s->ring_size;
    if (!size)
        return;
    if (len >= size) {
        memcpy(s->ring, buf + len - size, size);
        s->ring_pos = 0;
        s->ring_len = size;
        return;
    }
    size_t first = size - s->ring_pos;
    if (first > len)
        first = len;
    memcpy(s->ring + s->ring_pos, buf, first);
    memcpy(s->ring, buf + first, len - first);
    s->ring_pos = (s->ring_pos + len) % size;
    s->ring_len = s->ring_len + len > size ? size : s->ring_len + len;
}

void conch_daemon_session_uncharge(struct session *s)
{
    if (!s->held_sb)
        return;
    conch_budget_uncharge(&s->held_sb->held, s->ring_charged + s->keys_charged);
    s->ring_charged = s->keys_charged = 0;
    s->held_sb = NULL;
    /* Nothing is added to it from now on (the shell is gone with the sandbox). */
    if (s->ring_len < s->ring_size && s->ring_pos == s->ring_len) {
        char *nb = s->ring_len ? realloc(s->ring, s->ring_len) : NULL;
        if (nb || !s->ring_len) {
            if (!s->ring_len)
                free(s->ring);
            s->ring = nb;
            s->ring_size = s->ring_len;
            s->ring_pos = 0;
        }
    }
}

/* The scrollback in order, as a new buffer (*@ret_len bytes). */
char *conch_daemon_session_ring_copy(const struct session *s, size_t *ret_len)
{
    char *b = malloc(s->ring_len + 1);
    if (!b)
        return NULL;
    size_t size = s->ring_size ? s->ring_size : 1;
    size_t start = (s->ring_pos + size - s->ring_len) % size;
    size_t first = size - start;
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

/* The command's output passes through @s->hold, which keeps its last bytes until the end
 * (see hold_strip_trace). */
void conch_daemon_session_hold_commit(struct session *s)
{
    cap_append(s, s->hold, s->hold_len);
    s->hold_len = 0;
}

static void hold_append(struct session *s, const char *buf, size_t len)
{
    const size_t max = sizeof(s->hold);
    if (len >= max) {
        conch_daemon_session_hold_commit(s);
        cap_append(s, buf, len - max);
        memcpy(s->hold, buf + len - max, max);
        s->hold_len = max;
        return;
    }
    if (s->hold_len + len > max) {
        size_t out = s->hold_len + len - max;
        cap_append(s, s->hold, out);
        memmove(s->hold, s->hold + out, s->hold_len - out);
        s->hold_len -= out;
    }
    memcpy(s->hold + s->hold_len, buf, len);
    s->hold_len += len;
}

/* Under `set -x` bash traces the reporter's call ("+ __conch_e 0") right before it prints
 * the end marker: that line is ours, not the command's. Only that exact last line, and the
 * run of '+' before it (the default PS4), are cut. */
static void hold_strip_trace(struct session *s)
{
    static const char tail[] = "\r\n";
    static const char call[] = "__conch_e ";
    size_t tl = sizeof(tail) - 1;
    if (s->hold_len < tl + sizeof(call))
        return;
    size_t end = s->hold_len - tl;
    if (memcmp(s->hold + end, tail, tl))
        return;
    size_t d = end;
    while (d > 0 && s->hold[d - 1] >= '0' && s->hold[d - 1] <= '9')
        d--;
    if (d == end || d < sizeof(call) - 1 ||
        memcmp(s->hold + d - (sizeof(call) - 1), call, sizeof(call) - 1))
        return;
    size_t start = d - (sizeof(call) - 1);
    if (start > 0 && s->hold[start - 1] == ' ')
        start--;
    while (start > 0 && s->hold[start - 1] == '+')
        start--;
    s->hold_len = start;
}

/* Feed the terminal's output to the current command: what lies between its markers. The end
 * marker names N, a number the shell draws after the command and sends with its status, so
 * until the status is in, everything after the start marker is output (the marker is printed
 * after the status is sent, and conch_daemon_session_master_drain reads the socket before it feeds
 * what it read: a marker seen here always comes after its status). */
static void feed(struct session *s, const char *buf, size_t len)
{
    while (len && s->phase < 2) {
        if (s->phase == 1 && !s->got_status) {
            hold_append(s, s->carry, s->carry_len);
            s->carry_len = 0;
            hold_append(s, buf, len);
            return;
        }
        const char *mark = s->phase == 0 ? s->mark_s : s->mark_e;
        size_t mlen = s->phase == 0 ? s->mark_s_len : s->mark_e_len;
        /* carry + buf: look for the marker across the boundary */
        char joined[sizeof(s->carry) + 4096];
        size_t jl = 0;
        size_t take = len < 4096 ? len : 4096;
        memcpy(joined, s->carry, s->carry_len);
        jl = s->carry_len;
        memcpy(joined + jl, buf, take);
        jl += take;
        s->carry_len = 0;
        char *hit = memmem(joined, jl, mark, mlen);
        if (hit) {
            size_t before = (size_t)(hit - joined);
            if (s->phase == 1)
                hold_append(s, joined, before);
            s->phase++;
            size_t used = before + mlen; /* of joined */
            size_t from_buf = used > jl - take ? used - (jl - take) : 0;
            /* bytes of joined after the marker that came from carry (cannot happen: the
             * carry is shorter than a marker) */
            buf += from_buf;
            len -= from_buf;
            if (s->phase == 2) {
                hold_strip_trace(s);
                conch_daemon_session_hold_commit(s);
                if (s->got_status)
                    conch_daemon_session_run_finish(s);
            }
            continue;
        }
        /* Keep the longest suffix that may begin a marker. */
        size_t keep = 0;
        for (size_t k = mlen - 1; k > 0; k--) {
            if (k <= jl && !memcmp(joined + jl - k, mark, k)) {
                keep = k;
                break;
            }
        }
        if (s->phase == 1)
            hold_append(s, joined, jl - keep);
        memcpy(s->carry, joined + jl - keep, keep);
        s->carry_len = keep;
        buf += take;
        len -= take;
    }
}

static void master_output(struct session *s, const char *buf, size_t n)
{
    ring_append(s, buf, n);
    if (!conch_list_empty(&s->clients)) {
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
        conch_daemon_session_notify_all(s, "session.output", p);
    }
    s->seq += n;
    /* A shell that prints is not idle (a build a person started, say). */
    if (conch_daemon_now() - s->last_used_at > 1)
        conch_daemon_session_touch(s);
    if (s->save && !uv_is_active((uv_handle_t *)s->save))
        uv_timer_start(s->save, conch_daemon_session_on_save, SAVE_MS, 0);
    if (s->cur)
        feed(s, buf, n);
}

static void sock_read(struct session *s);

/* Read everything the terminal has. Returns false at EOF/EIO (the shell's side is closed).
 * While a command waits for its status, the socket is read after each read of the terminal
 * and before what was read is fed: the shell sends its status before it prints the end
 * marker, so a marker read here finds its status already taken. */
bool conch_daemon_session_master_drain(struct session *s)
{
    char buf[65536];
    for (int rounds = 0; s->master >= 0 && rounds < 64; rounds++) {
        ssize_t n = read(s->master, buf, sizeof(buf));
        if (n > 0) {
            if (s->cur && !s->got_status)
                sock_read(s);
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

void conch_daemon_session_on_master(uv_poll_t *h, int status, int events)
{
    struct session *s = h->data;
    if (status >= 0 && (events & UV_WRITABLE))
        master_flush(s);
    if (status < 0 || !conch_daemon_session_master_drain(s)) {
        /* The slave side is gone: the shell's end comes from the supervisor. */
        close_poll(&s->master_poll);
    }
}

/* ---- the control socket ---- */

static void sock_flush(struct session *s);
static void on_eof_timer(uv_timer_t *t);

/* One line from the shell (its sender checked). "E - <R> <status>": the reporter's status,
 * then its end marker names R. "<bash>: __conch_q: B <nonce|-> <why>": the reporter could not
 * run (bash's own message for an expansion error, see init_script): the status is unknown.
 * "Y <nonce>": the shell reads commands again (a sync after an interrupt). E and B carry no
 * nonce ("-"): they come from the reporter of the line typed for the current command, the
 * only one whose reporter can still run (a line interrupted and synced with Y is over, and a
 * shell that does not sync is killed), and no other process can write them. */
static void sock_line(struct session *s, const char *line)
{
    char kind = 0, nonce[40] = "", n[24] = "";
    int code = 0, got = 0;
    const char *b = strstr(line, "__conch_q: B ");
    if (b) {
        kind = 'B';
        got = sscanf(b + 13, "%39s", nonce);
    } else if (line[0] == 'E') {
        kind = 'E';
        got = sscanf(line, "E %39s %23s %d", nonce, n, &code);
    } else if (line[0] == 'Y') {
        kind = 'Y';
        got = sscanf(line, "Y %39s", nonce);
    }
    if (!s->cur || got < 1 || (strcmp(nonce, s->nonce) && (kind == 'Y' || strcmp(nonce, "-"))))
        return; /* stale: not the current command's */
    if (kind == 'E' && got == 3 && s->tstage != T_SYNC) {
        if (s->got_status) {
            /* Only shell code writing on the shell's own channel makes a second one. */
            s->unknown = true;
            snprintf(s->unknown_why, sizeof(s->unknown_why),
                     "a second status line came from the shell (shell code wrote on its "
                     "control channel)");
            return;
        }
        s->got_status = true;
        s->status_code = code;
        s->mark_e_len = (size_t)snprintf(s->mark_e, sizeof(s->mark_e), "\x1b]697;E%s\a", n);
        s->tstage = T_MARKER;
        uv_timer_start(s->timer, conch_daemon_session_on_timer, MARKER_WAIT_MS, 0);
    } else if (kind == 'B' && s->tstage != T_SYNC) {
        const char *why = b + 13 + strlen(nonce);
        while (*why == ' ')
            why++;
        s->unknown = true;
        snprintf(s->unknown_why, sizeof(s->unknown_why),
                 "the shell's status reporter could not run (%.40s): shell code changed what "
                 "it needs (a read-only POSIXLY_CORRECT, __conch_c or function named builtin?)",
                 why);
        /* A shell that cannot report is of no use to the next command: it starts anew. Killed
         * before this command is finished, since finishing it may pump the queue at once:
         * the kill reason keeps the next command from being typed into this shell. */
        if (s->proc_live && !s->closing) {
            snprintf(s->kill_reason, sizeof(s->kill_reason),
                     "its status reporter was locked out by shell code");
            conch_super_signal(&s->proc, SIGKILL);
        }
        conch_daemon_session_run_finish(s);
    } else if (kind == 'Y' && s->tstage == T_SYNC) {
        s->synced = true;
        conch_daemon_session_run_finish(s);
    }
}

/* Read what the shell wrote on the control socket. Every chunk comes with its sender's
 * credentials (SO_PASSCRED): only the shell's own lines count. A program the shell runs may
 * get a copy of the socket (pidfd_getfd, a copy the shell code handed on) and write a
 * perfect status line: the kernel names it as the sender, and its bytes are dropped. */
static void sock_read(struct session *s)
{
    while (s->sock >= 0 && s->sock_poll) {
        union {
            struct cmsghdr align;
            char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int) * 8)];
        } u;
        struct iovec iov = {.iov_base = s->sockbuf + s->socklen,
                            .iov_len = sizeof(s->sockbuf) - 1 - s->socklen};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = u.buf,
                            .msg_controllen = sizeof(u.buf)};
        ssize_t n = recvmsg(s->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
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
        pid_t from = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET)
                continue;
            if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(struct ucred))) {
                struct ucred uc;
                memcpy(&uc, CMSG_DATA(c), sizeof(uc));
                from = uc.pid;
            } else if (c->cmsg_type == SCM_RIGHTS) {
                /* Nothing is sent to us: whatever came is closed. */
                size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < nfd; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
                    close(fd);
                }
            }
        }
        if (from <= 0 || from != s->shell_pid) {
            if (!s->foreign++)
                log_debug("session %s: dropped bytes another process (pid %d) wrote on the "
                          "control socket",
                          s->id, (int)from);
            continue;
        }
        s->socklen += (size_t)n;
        s->sockbuf[s->socklen] = 0;
        char *nl;
        while ((nl = memchr(s->sockbuf, '\n', s->socklen))) {
            *nl = 0;
            char line[sizeof(s->sockbuf)];
            size_t used = (size_t)(nl + 1 - s->sockbuf);
            memcpy(line, s->sockbuf, used);
            memmove(s->sockbuf, nl + 1, s->socklen - used);
            s->socklen -= used;
            sock_line(s, line);
        }
        if (s->socklen >= sizeof(s->sockbuf) - 1)
            s->socklen = 0; /* a line that long is not ours */
    }
}

static void on_sock(uv_poll_t *h, int status, int events)
{
    struct session *s = h->data;
    if (status < 0) {
        close_poll(&s->sock_poll);
        return;
    }
    if (events & UV_WRITABLE)
        sock_flush(s);
    if (events & UV_READABLE)
        sock_read(s);
}

static void on_eof_timer(uv_timer_t *t)
{
    struct session *s = t->data;
    if (s->proc_live && s->shells == s->eof_shell && !s->closing) {
        snprintf(s->kill_reason, sizeof(s->kill_reason),
                 "the shell closed its control channel (fd 62)");
        if (s->cur && !s->got_status) {
            s->unknown = true;
            snprintf(s->unknown_why, sizeof(s->unknown_why),
                     "shell code closed the shell's control channel (fd 62) before the "
                     "command's status was sent");
        }
        conch_super_signal(&s->proc, SIGKILL);
    }
}

void conch_daemon_session_sock_poll_update(struct session *s)
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
    conch_daemon_session_sock_poll_update(s);
}

void conch_daemon_session_sock_write(struct session *s, const char *buf, size_t len)
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

static void master_poll_update(struct session *s)
{
    if (s->master_poll)
        uv_poll_start(s->master_poll, UV_READABLE | (s->mpend ? UV_WRITABLE : 0),
                      conch_daemon_session_on_master);
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
        if (s->held_sb)
            conch_budget_uncharge(&s->held_sb->held, s->keys_charged);
        s->keys_charged = 0;
    }
    master_poll_update(s);
}

int conch_daemon_session_master_write(struct session *s, const char *buf, size_t len, bool client,
                                      struct conch_err *err)
{
    if (s->master < 0)
        return conch_err_set(err, EIO, "session %s: it has no terminal", s->id);
    size_t left = s->mpend ? s->mpend_len - s->mpend_off : 0;
    if (left + len > MAX_PENDING_KEYS)
        return conch_err_setk(err, CONCH_ERR_LIMIT, ENOBUFS,
                              "session %s: %u bytes of keys wait already: the program in its "
                              "terminal does not read them",
                              s->id, MAX_PENDING_KEYS);
    /* Keys wait here while the terminal's queue is full: a client's are charged to the
     * sandbox's budget (the new buffer before it is allocated; the old one's charge goes
     * with it below). */
    uint64_t charge = client && s->held_sb ? left + len : 0;
    int r = charge ? conch_budget_charge(&s->held_sb->held, charge, err) : 0;
    if (r < 0) {
        conch_err_wrap(err, "session %s: keys waiting for the terminal", s->id);
        return r;
    }
    char *nb = malloc(left + len);
    if (!nb) {
        if (charge)
            conch_budget_uncharge(&s->held_sb->held, charge);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    if (left)
        memcpy(nb, s->mpend + s->mpend_off, left);
    memcpy(nb + left, buf, len);
    free(s->mpend);
    if (client && s->held_sb) {
        conch_budget_uncharge(&s->held_sb->held, s->keys_charged);
        s->keys_charged = charge;
    } else if (s->keys_charged > left) { /* a client's keys still waiting stay charged */
        conch_budget_uncharge(&s->held_sb->held, s->keys_charged - left);
        s->keys_charged = left;
    }
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
int conch_daemon_session_fg_signal(struct session *s, int sig)
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

void conch_daemon_session_on_timer(uv_timer_t *t)
{
    struct session *s = t->data;
    if (!s->cur) {
        if (s->tstage == T_BUSY) {
            s->tstage = T_NONE;
            conch_daemon_session_pump(s);
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
        uv_timer_start(s->timer, conch_daemon_session_on_timer,
                       s->cur->grace_ms ? s->cur->grace_ms : 1, 0);
        break;
    case T_GRACE: {
        /* Still not back: kill the foreground job unless it is the shell itself, then ask
         * the shell to show it is reading commands again. */
        pid_t pg = 0, sid = 0;
        if (s->master >= 0 && ioctl(s->master, TIOCGPGRP, &pg) == 0 &&
            ioctl(s->master, TIOCGSID, &sid) == 0 && pg != sid) {
            conch_daemon_session_fg_signal(s, SIGKILL);
            s->killed_fg = true;
        }
        s->tstage = T_SYNC;
        char rec[40];
        int n = snprintf(rec, sizeof(rec), "%s", s->nonce);
        conch_daemon_session_sock_write(s, rec, (size_t)n + 1);
        static const char sync_line[] = "\x15 \\__conch_s\n";
        conch_daemon_session_master_write(s, sync_line, sizeof(sync_line) - 1, false, NULL);
        uv_timer_start(s->timer, conch_daemon_session_on_timer, 2000 + s->cur->grace_ms, 0);
        break;
    }
    case T_SYNC:
        /* The shell itself does not come back (it ignores SIGINT in a loop of builtins):
         * kill it; the next command starts a new one. */
        conch_super_signal(&s->proc, SIGKILL);
        s->tstage = T_NONE;
        break;
    case T_MARKER:
        conch_daemon_session_run_finish(s);
        break;
    }
}

void conch_daemon_session_close_fds(struct session *s)
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
    if (s->held_sb)
        conch_budget_uncharge(&s->held_sb->held, s->keys_charged);
    s->keys_charged = 0;
    s->socklen = 0;
}
