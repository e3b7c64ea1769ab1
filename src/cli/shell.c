/* shell.c - `conch shell`, `conch attach` and `conch sessions`: an interactive terminal on a
 * daemon session (docs/PROTOCOL.md, session.*). The local tty goes raw; keys go to the session
 * (session.write), its output comes back as session.output notifications, SIGWINCH becomes
 * session.resize. Ctrl-\ twice detaches (the session goes on); when the shell exits, we exit
 * with its status. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/fsutil.h"
#include "daemon/daemon.h"
#include "exec/result.h"

#define DETACH_KEY 0x1c /* Ctrl-\ */

/* The options of shell, attach and sessions: --socket PATH, attach's --read-only, shell's
 * --keep. */
struct shell_opts {
    const char *sock;
    bool read_only;
    bool keep;
};

enum { OPT_SOCKET = 1, OPT_READ_ONLY, OPT_KEEP };

static const struct conch_cli_opt attach_table[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"read-only", 0, false, OPT_READ_ONLY},
    {NULL, 0, false, 0},
};
static const struct conch_cli_opt shell_table[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"keep", 0, false, OPT_KEEP},
    {NULL, 0, false, 0},
};
static const struct conch_cli_opt sessions_table[] = {
    {"socket", 0, true, OPT_SOCKET},
    {NULL, 0, false, 0},
};

static int shell_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct shell_opts *o = ctx;
    if (key == OPT_SOCKET)
        o->sock = value;
    else if (key == OPT_KEEP)
        o->keep = true;
    else
        o->read_only = true;
    return 0;
}

/* Parse them by @table; returns the index of the first operand, or -1 after printing the help
 * (*@ret_status 0) or a usage error (*@ret_status 2). */
static int shell_parse(const char *verb, const char *usage, const struct conch_cli_opt *table,
                       int argc, char **argv, struct shell_opts *o, int *ret_status)
{
    const struct conch_cli_parser p = {
        .verb = verb, .table = table, .handler = shell_opt, .ctx = o};
    struct conch_err err = {0};
    int optind = 1;
    memset(o, 0, sizeof(*o));
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(usage, stdout);
        *ret_status = 0;
        return -1;
    }
    if (r < 0) {
        *ret_status = conch_cli_usage_error(verb, usage, "%s", err.msg);
        return -1;
    }
    return optind;
}

/* ---- the terminal ---- */

static struct termios saved_tio;
static bool tio_saved;
static volatile sig_atomic_t winch = 1;

static void on_winch(int sig)
{
    (void)sig;
    winch = 1;
}

static void tty_restore(void)
{
    if (tio_saved)
        tcsetattr(STDIN_FILENO, TCSADRAIN, &saved_tio);
    tio_saved = false;
}

static void tty_raw(void)
{
    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_tio) < 0)
        return;
    tio_saved = true;
    struct termios t = saved_tio;
    cfmakeraw(&t);
    tcsetattr(STDIN_FILENO, TCSADRAIN, &t);
    atexit(tty_restore);
}

static void send_resize(struct conch_cli_conn *c, const char *sid)
{
    struct winsize ws;
    if (ioctl(STDIN_FILENO, TIOCGWINSZ, &ws) < 0 || !ws.ws_row || !ws.ws_col)
        return;
    conch_cli_conn_send(
        c, "session.resize",
        json_pack("{s:s,s:i,s:i}", "session", sid, "rows", ws.ws_row, "cols", ws.ws_col), NULL);
}

static void write_out(const char *s, size_t n)
{
    if (conch_write_all(STDOUT_FILENO, s, n) < 0) {
        /* the terminal is gone */
    }
}

/* What a program run by `conch exec -t` must not show: the prompt and the echo of the line
 * that started it, up to the end of the echoed @marker. Past 64 KiB without it, all shows.
 * The end of such a session is the program's: no note of it. */
struct hide {
    const char *marker; /* NULL: nothing hidden (any more) */
    bool quiet_end;
    char *buf;
    size_t len;
};

static void show(struct hide *h, const char *s, size_t n)
{
    if (!h->marker) {
        write_out(s, n);
        return;
    }
    char *nb = realloc(h->buf, h->len + n + 1);
    if (!nb) {
        h->marker = NULL;
        write_out(s, n);
        return;
    }
    h->buf = nb;
    memcpy(h->buf + h->len, s, n);
    h->len += n;
    h->buf[h->len] = '\0';
    /* The echo that counts is readline's, after the prompt: a line typed before the shell
     * read its first one was echoed by the terminal too, alone on its line. */
    size_t ml = strlen(h->marker);
    const char *nl = NULL;
    for (const char *at = h->buf; (at = memmem(at, h->len - (size_t)(at - h->buf), h->marker, ml));
         at++) {
        if (at == h->buf || at[-1] == '\n')
            continue;
        nl = memchr(at, '\n', h->len - (size_t)(at - h->buf));
        break;
    }
    if (nl || h->len > 65536) {
        size_t from = nl ? (size_t)(nl + 1 - h->buf) : 0;
        write_out(h->buf + from, h->len - from);
        h->marker = NULL;
        free(h->buf);
        h->buf = NULL;
    }
}

static void send_keys(struct conch_cli_conn *c, const char *sid, const char *buf, size_t n)
{
    if (!n)
        return;
    conch_cli_conn_send(c, "session.write",
                        json_pack("{s:s,s:o}", "session", sid, "data", conch_json_text(buf, n)),
                        NULL);
}

/*
 * The interactive loop: keys to the session, its output to the terminal (through @h). Returns
 * the exit status: the shell's when it exited, 0 on detach, 1 when the daemon went away.
 */
static int interact_shown(struct conch_cli_conn *c, const char *sid, bool write, struct hide *h)
{
    json_t *a = conch_cli_conn_call(c, "session.attach",
                                    json_pack("{s:s,s:b}", "session", sid, "write", write));
    if (!a)
        return 1;
    const char *sb = json_string_value(json_object_get(a, "scrollback"));
    if (sb)
        show(h, sb, json_string_length(json_object_get(a, "scrollback")));
    json_int_t next_seq = json_integer_value(json_object_get(a, "next_seq"));
    bool ended = !strcmp(json_string_value(json_object_get(a, "state")) ?: "", "ended");
    json_decref(a);
    if (ended) {
        fprintf(stderr, "\r\nconch: session %s has ended\r\n", sid);
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_winch};
    sigaction(SIGWINCH, &sa, NULL);
    tty_raw();
    int status = 1;
    bool pending_detach = false;
    for (;;) {
        if (winch && write) {
            winch = 0;
            send_resize(c, sid);
        }
        /* messages already buffered first */
        json_t *msg;
        while ((msg = conch_cli_conn_next(c, false))) {
            const char *m = json_string_value(json_object_get(msg, "method"));
            json_t *p = json_object_get(msg, "params");
            if (m && !strcmp(m, "session.output") &&
                !strcmp(json_string_value(json_object_get(p, "session")) ?: "", sid)) {
                json_int_t seq = json_integer_value(json_object_get(p, "seq"));
                json_t *d = json_object_get(p, "data");
                size_t n = json_string_length(d);
                /* the scrollback already held what came before next_seq */
                if (seq + (json_int_t)n > next_seq) {
                    size_t skip = seq < next_seq ? (size_t)(next_seq - seq) : 0;
                    show(h, json_string_value(d) + skip, n - skip);
                    next_seq = seq + (json_int_t)n;
                }
            } else if (m && !strcmp(m, "session.ended") &&
                       !strcmp(json_string_value(json_object_get(p, "session")) ?: "", sid)) {
                json_t *code = json_object_get(p, "exit_code");
                status = json_is_integer(code) ? (int)json_integer_value(code) : 1;
                tty_restore();
                const char *why = json_string_value(json_object_get(p, "reason"));
                if (!h->quiet_end && (status != 0 || (why && !strstr(why, "exited"))))
                    fprintf(stderr, "\nconch: session %s ended: %s\n", sid, why ? why : "?");
                json_decref(msg);
                return status;
            } else if (m && !strcmp(m, "session.writer")) {
                write = false;
                tty_restore();
                fprintf(stderr, "\r\nconch: another client took over the keyboard; watching "
                                "only (Ctrl-\\ Ctrl-\\ to leave)\r\n");
                tty_raw();
            }
            json_decref(msg);
        }
        struct pollfd pfd[2] = {{.fd = STDIN_FILENO, .events = POLLIN},
                                {.fd = c->fd, .events = POLLIN}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            if (!conch_cli_conn_fill(c)) {
                tty_restore();
                fprintf(stderr, "\r\nconch: the daemon closed the connection\n");
                return 1;
            }
        }
        if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            char buf[4096], keys[4097];
            ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                tty_restore();
                return 0; /* our input ended: detach */
            }
            size_t k = 0;
            for (ssize_t i = 0; i < n; i++) {
                if (buf[i] == DETACH_KEY) {
                    if (pending_detach) {
                        send_keys(c, sid, keys, k);
                        tty_restore();
                        fprintf(stderr, "\r\nconch: detached from session %s (conch attach %s)\n",
                                sid, sid);
                        json_decref(conch_cli_conn_call(c, "session.detach",
                                                        json_pack("{s:s}", "session", sid)));
                        return 0;
                    }
                    pending_detach = true;
                    continue;
                }
                if (pending_detach) {
                    keys[k++] = DETACH_KEY;
                    pending_detach = false;
                }
                keys[k++] = buf[i];
            }
            if (write)
                send_keys(c, sid, keys, k);
        }
    }
    tty_restore();
    return status;
}

/* interact_shown with @hidden (may be NULL) hidden as struct hide says. */
static int interact(struct conch_cli_conn *c, const char *sid, bool write, const char *hidden,
                    bool quiet_end)
{
    struct hide h = {.marker = hidden, .quiet_end = quiet_end};
    int st = interact_shown(c, sid, write, &h);
    free(h.buf);
    return st;
}

static const char shell_usage[] =
    "usage: conch shell [--socket PATH] [--keep] [SANDBOX]\n"
    "  An interactive shell in a daemon sandbox. Without SANDBOX, in a new one over the\n"
    "  current directory, removed when the shell ends (as docker run removes one with its\n"
    "  rm flag) unless --keep is given or it holds uncommitted changes (then it is kept,\n"
    "  and said so).\n"
    "  Ctrl-\\ Ctrl-\\ detaches; the session (and its sandbox) goes on (conch attach).\n"
    "  The exit status is the shell's.\n";

static bool session_ended(struct conch_cli_conn *c, const char *sid);

/* The sandbox `conch shell` made, once its shell ended: removed, unless it holds changes not
 * committed (those are the user's work: kept, and said how to see them). */
static void shell_cleanup(struct conch_cli_conn *c, const char *sbid)
{
    json_t *ch = conch_cli_conn_call(c, "workspace.changes",
                                     json_pack("{s:s,s:i}", "sandbox", sbid, "limit", 1));
    json_int_t n = ch ? json_integer_value(json_object_get(ch, "changes_total")) : 0;
    json_decref(ch);
    if (n > 0) {
        fprintf(stderr,
                "conch: kept sandbox %s: it has %lld uncommitted change%s (conch diff %s; "
                "conch commit %s; conch rm %s)\n",
                sbid, (long long)n, n == 1 ? "" : "s", sbid, sbid, sbid);
        return;
    }
    json_t *r = conch_cli_conn_call(c, "sandbox.destroy", json_pack("{s:s}", "id", sbid));
    if (r)
        fprintf(stderr, "conch: removed sandbox %s\n", sbid);
    json_decref(r);
}

int conch_cli_shell(int argc, char **argv)
{
    struct shell_opts o;
    int status;
    int i = shell_parse("shell", shell_usage, shell_table, argc, argv, &o, &status);
    if (i < 0)
        return status;
    if (i + 1 < argc)
        return conch_cli_usage_error("shell", shell_usage, "unexpected argument '%s'", argv[i + 1]);
    const char *sock = o.sock;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, sock) < 0)
        return CONCH_EXIT_INFRA;
    char sbid[128];
    bool made = false;
    /* an id, or a name (as every client verb takes) */
    if (i < argc && conch_cli_resolve(&c, argv[i], sbid, sizeof(sbid)) < 0) {
        conch_cli_conn_close(&c);
        return CONCH_EXIT_INFRA;
    }
    if (i >= argc) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof(cwd))) {
            fprintf(stderr, "conch shell: current directory: %s\n", strerror(errno));
            return CONCH_EXIT_USAGE;
        }
        json_t *sb =
            conch_cli_conn_call(&c, "sandbox.create", json_pack("{s:s}", "workspace", cwd));
        if (!sb)
            return CONCH_EXIT_INFRA;
        snprintf(sbid, sizeof(sbid), "%s", json_string_value(json_object_get(sb, "id")) ?: "");
        json_decref(sb);
        if (o.keep)
            fprintf(stderr, "conch: sandbox %s over %s (conch rm %s removes it)\n", sbid, cwd,
                    sbid);
        else
            fprintf(stderr, "conch: sandbox %s over %s (removed when the shell ends)\n", sbid, cwd);
        made = true;
    }
    struct winsize ws = {.ws_row = 24, .ws_col = 80};
    if (isatty(STDIN_FILENO))
        ioctl(STDIN_FILENO, TIOCGWINSZ, &ws);
    json_t *params = json_pack("{s:s}", "sandbox", sbid);
    if (ws.ws_row && ws.ws_col) {
        json_object_set_new(params, "rows", json_integer(ws.ws_row));
        json_object_set_new(params, "cols", json_integer(ws.ws_col));
    }
    json_t *s = conch_cli_conn_call(&c, "session.open", params);
    if (!s)
        return CONCH_EXIT_INFRA;
    char sid[64];
    snprintf(sid, sizeof(sid), "%s", json_string_value(json_object_get(s, "session")) ?: "");
    json_decref(s);
    int st = interact(&c, sid, true, NULL, false);
    if (made && !o.keep && session_ended(&c, sid))
        shell_cleanup(&c, sbid);
    conch_cli_conn_close(&c);
    return st;
}

int conch_cli_attach(int argc, char **argv)
{
    static const char usage[] =
        "usage: conch attach [--socket PATH] [--read-only] SESSION\n"
        "  Join a running session and take over its keyboard (--read-only: watch).\n"
        "  Ctrl-\\ Ctrl-\\ detaches; the session goes on.\n";
    struct shell_opts o;
    int status;
    int i = shell_parse("attach", usage, attach_table, argc, argv, &o, &status);
    if (i < 0)
        return status;
    if (i >= argc)
        return conch_cli_usage_error("attach", usage, "no session given");
    if (i + 1 < argc)
        return conch_cli_usage_error("attach", usage, "unexpected argument '%s'", argv[i + 1]);
    bool write = !o.read_only;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    int st = interact(&c, argv[i], write, NULL, false);
    conch_cli_conn_close(&c);
    return st;
}

int conch_cli_sessions(int argc, char **argv)
{
    static const char usage[] = "usage: conch sessions [--socket PATH]\n";
    struct shell_opts o;
    int status;
    int i = shell_parse("sessions", usage, sessions_table, argc, argv, &o, &status);
    if (i < 0)
        return status;
    if (i < argc)
        return conch_cli_usage_error("sessions", usage, "unexpected argument '%s'", argv[i]);
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    json_t *res = conch_cli_conn_call(&c, "session.list", json_object());
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    printf("%-18s %-14s %-8s %7s  %s\n", "SESSION", "SANDBOX", "STATE", "CLIENTS", "NOTE");
    size_t k;
    json_t *s;
    json_array_foreach(json_object_get(res, "sessions"), k, s)
    {
        const char *why = json_string_value(json_object_get(s, "reason"));
        printf("%-18s %-14s %-8s %7lld  %s\n", json_string_value(json_object_get(s, "session")),
               json_string_value(json_object_get(s, "sandbox")),
               json_string_value(json_object_get(s, "state")),
               (long long)json_integer_value(json_object_get(s, "clients")), why ? why : "");
    }
    json_decref(res);
    return 0;
}

/* Whether the session @sid has ended (not only been detached from). */
static bool session_ended(struct conch_cli_conn *c, const char *sid)
{
    json_t *res = conch_cli_conn_call(c, "session.list", json_object());
    bool ended = false;
    size_t k;
    json_t *s;
    json_array_foreach(json_object_get(res, "sessions"), k, s)
    {
        if (!strcmp(json_string_value(json_object_get(s, "session")) ?: "", sid))
            ended = !strcmp(json_string_value(json_object_get(s, "state")) ?: "", "ended");
    }
    json_decref(res);
    return ended;
}

int conch_cli_tty_exec(struct conch_cli_conn *c, const char *sbid, const char *cmd, json_t *env,
                       const char *cwd)
{
    struct winsize ws = {.ws_row = 24, .ws_col = 80};
    if (isatty(STDIN_FILENO))
        ioctl(STDIN_FILENO, TIOCGWINSZ, &ws);
    json_t *params = json_pack("{s:s}", "sandbox", sbid);
    if (ws.ws_row && ws.ws_col) {
        json_object_set_new(params, "rows", json_integer(ws.ws_row));
        json_object_set_new(params, "cols", json_integer(ws.ws_col));
    }
    if (env && json_object_size(env))
        json_object_set(params, "env", env);
    if (cwd)
        json_object_set_new(params, "cwd", json_string(cwd));
    json_t *s = conch_cli_conn_call(c, "session.open", params);
    if (!s)
        return CONCH_EXIT_INFRA;
    char sid[64];
    snprintf(sid, sizeof(sid), "%s", json_string_value(json_object_get(s, "session")) ?: "");
    json_decref(s);
    /* The session's shell is bash: any other command is typed into it, followed by `exit` (so
     * that the session ends with its status), before we attach; the prompt and the echo are
     * hidden. Not `exec CMD`: the daemon ends a session whose shell closed its control
     * channel, which an exec'd program does. */
    char *line = NULL;
    if (strcmp(cmd, "'bash' ") != 0) {
        size_t n = strlen(cmd);
        while (n && cmd[n - 1] == ' ')
            n--;
        /* An interactive bash drops the rest of a line whose command Ctrl-C killed: a trap
         * ends the session then too, as the command's status (130). */
        if (asprintf(&line, "trap 'exit 130' INT; %.*s; exit 2>/dev/null", (int)n, cmd) < 0)
            return 1;
        char *typed = NULL;
        if (asprintf(&typed, "%s\r", line) < 0) {
            free(line);
            return 1;
        }
        json_decref(conch_cli_conn_call(
            c, "session.write",
            json_pack("{s:s,s:o}", "session", sid, "data", conch_json_text(typed, strlen(typed)))));
        free(typed);
    }
    int st = interact(c, sid, true, line, true);
    free(line);
    /* As docker exec leaves nothing behind: an ended session is forgotten; a detached one
     * goes on (conch attach). */
    if (session_ended(c, sid))
        json_decref(conch_cli_conn_call(c, "session.close", json_pack("{s:s}", "session", sid)));
    return st;
}
