/* lineedit.c - the command line's small line editor (lineedit.h): raw-mode editing of one
 * line on a terminal (the cursor moves by UTF-8 character; each is taken as one column
 * wide), history in memory, and plain line input when the input is not a terminal. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include "cli/lineedit.h"
#include "core/strbuf.h"

void conch_cli_lineedit_init(struct conch_cli_lineedit *le, int in, int out, FILE *plain)
{
    memset(le, 0, sizeof(*le));
    le->in = in;
    le->out = out;
    le->plain = plain;
    le->tty = isatty(in) == 1;
}

void conch_cli_lineedit_add(struct conch_cli_lineedit *le, const char *line)
{
    if (!*line || (le->n_hist && !strcmp(le->hist[le->n_hist - 1], line)))
        return;
    char *copy = strdup(line);
    if (!copy)
        return;
    if (le->n_hist == CONCH_CLI_LINEEDIT_HISTORY) {
        free(le->hist[0]);
        memmove(le->hist, le->hist + 1, (le->n_hist - 1) * sizeof(*le->hist));
        le->n_hist--;
    } else {
        char **h = realloc(le->hist, (le->n_hist + 1) * sizeof(*h));
        if (!h) {
            free(copy);
            return;
        }
        le->hist = h;
    }
    le->hist[le->n_hist++] = copy;
}

void conch_cli_lineedit_cooked(struct conch_cli_lineedit *le)
{
    if (!le->raw)
        return;
    tcsetattr(le->in, TCSADRAIN, &le->saved);
    le->raw = false;
}

int conch_cli_lineedit_take_keys(struct conch_cli_lineedit *le)
{
    if (!le->tty || !le->raw)
        return 0;
    int intr = 0;
    for (;;) {
        struct pollfd p = {.fd = le->in, .events = POLLIN};
        int n = poll(&p, 1, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0 || !(p.revents & POLLIN))
            return intr;
        unsigned char buf[256];
        ssize_t got = read(le->in, buf, sizeof(buf));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) /* the end (or an error) is seen again by the next line's read */
            return got < 0 && errno != EAGAIN ? -errno : intr;
        for (ssize_t i = 0; i < got; i++) {
            if (buf[i] == 3) { /* Ctrl-C: it and what was typed before it go */
                intr = 1;
                le->n_ahead = 0;
            } else if (le->n_ahead < sizeof(le->ahead)) {
                le->ahead[le->n_ahead++] = buf[i];
            }
        }
    }
}

void conch_cli_lineedit_done(struct conch_cli_lineedit *le)
{
    conch_cli_lineedit_cooked(le);
    for (size_t i = 0; i < le->n_hist; i++)
        free(le->hist[i]);
    free(le->hist);
    le->hist = NULL;
    le->n_hist = 0;
}

/* ---- plain input ---- */

static int read_plain(struct conch_cli_lineedit *le, const char *prompt, char **ret_line)
{
    (void)prompt; /* no prompt for input that is not typed */
    char *line = NULL;
    size_t cap = 0;
    errno = 0;
    ssize_t n = getline(&line, &cap, le->plain);
    if (n < 0) {
        int e = errno;
        free(line);
        return e ? -e : 0;
    }
    if (n > 0 && line[n - 1] == '\n')
        line[n - 1] = '\0';
    *ret_line = line;
    return 1;
}

/* ---- the terminal ---- */

struct edit {
    struct conch_cli_lineedit *le;
    const char *prompt;
    struct conch_sb buf; /* the line, NUL-terminated at buf.len */
    size_t pos;          /* the cursor: a byte offset at a character's start */
    size_t hist_at;      /* the history line shown (n_hist: the line being typed) */
    char *typed;         /* the line being typed, kept while the history is shown */
};

static void out(struct edit *e, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(e->le->out, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static size_t chars(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            c++;
    return c;
}

/* Draw the prompt and the line again, the cursor at e->pos. */
static void refresh(struct edit *e)
{
    struct conch_sb sb = {0};
    conch_sb_printf(&sb, "\r%s", e->prompt);
    conch_sb_putn(&sb, e->buf.buf ? e->buf.buf : "", e->buf.len);
    conch_sb_printf(&sb, "\x1b[K");
    size_t back = chars(e->buf.buf + e->pos, e->buf.len - e->pos);
    if (back)
        conch_sb_printf(&sb, "\x1b[%zuD", back);
    if (!sb.oom)
        out(e, sb.buf, sb.len);
    conch_sb_done(&sb);
}

static void set_line(struct edit *e, const char *s)
{
    e->buf.len = 0;
    conch_sb_putn(&e->buf, s, strlen(s));
    conch_sb_putn(&e->buf, "", 1);
    e->buf.len--;
    e->pos = e->buf.len;
}

static void delete_range(struct edit *e, size_t from, size_t to)
{
    memmove(e->buf.buf + from, e->buf.buf + to, e->buf.len - to + 1);
    e->buf.len -= to - from;
    if (e->pos > to)
        e->pos -= to - from;
    else if (e->pos > from)
        e->pos = from;
}

static size_t prev_char(struct edit *e, size_t at)
{
    while (at > 0 && ((unsigned char)e->buf.buf[--at] & 0xC0) == 0x80)
        ;
    return at;
}

static size_t next_char(struct edit *e, size_t at)
{
    if (at < e->buf.len)
        at++;
    while (at < e->buf.len && ((unsigned char)e->buf.buf[at] & 0xC0) == 0x80)
        at++;
    return at;
}

static void insert(struct edit *e, char c)
{
    size_t at = e->pos, old = e->buf.len;
    conch_sb_putn(&e->buf, "\0", 2); /* room for one more byte and the NUL */
    if (e->buf.oom)
        return;
    e->buf.len = old + 1;
    memmove(e->buf.buf + at + 1, e->buf.buf + at, old - at);
    e->buf.buf[at] = c;
    e->buf.buf[old + 1] = '\0';
    e->pos++;
}

/* Show history line @to (e->le->n_hist: the line being typed). */
static void history_go(struct edit *e, size_t to)
{
    struct conch_cli_lineedit *le = e->le;
    if (to > le->n_hist || to == e->hist_at)
        return;
    if (e->hist_at == le->n_hist) {
        free(e->typed);
        e->typed = strdup(e->buf.buf ? e->buf.buf : "");
    }
    e->hist_at = to;
    set_line(e, to == le->n_hist ? (e->typed ? e->typed : "") : le->hist[to]);
}

static int read_byte(struct conch_cli_lineedit *le, unsigned char *c)
{
    if (le->n_ahead) { /* keys typed while a cell ran, first */
        *c = le->ahead[0];
        memmove(le->ahead, le->ahead + 1, --le->n_ahead);
        return 1;
    }
    int fd = le->in;
    for (;;) {
        ssize_t n = read(fd, c, 1);
        if (n == 1)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

/* An escape sequence's final key after ESC: 'A'..'D', 'H', 'F', or '3' for delete; 0 when
 * not one we know. */
static int read_escape(struct conch_cli_lineedit *le)
{
    unsigned char a, b, c;
    if (read_byte(le, &a) <= 0 || (a != '[' && a != 'O') || read_byte(le, &b) <= 0)
        return 0;
    if (b >= '0' && b <= '9') {
        if (read_byte(le, &c) <= 0 || c != '~')
            return 0;
        return b == '1' || b == '7' ? 'H' : b == '4' || b == '8' ? 'F' : b == '3' ? '3' : 0;
    }
    return b;
}

static int edit_loop(struct edit *e)
{
    struct conch_cli_lineedit *le = e->le;
    refresh(e);
    for (;;) {
        unsigned char c;
        int r = read_byte(le, &c);
        if (r < 0)
            return r;
        if (r == 0)
            return e->buf.len ? 1 : 0;
        switch (c) {
        case '\r':
        case '\n':
            return 1;
        case 3: /* Ctrl-C */
            out(e, "^C", 2);
            return -EINTR;
        case 4: /* Ctrl-D: the end on an empty line, else delete */
            if (!e->buf.len)
                return 0;
            if (e->pos < e->buf.len)
                delete_range(e, e->pos, next_char(e, e->pos));
            break;
        case 127:
        case 8: /* backspace */
            if (e->pos > 0)
                delete_range(e, prev_char(e, e->pos), e->pos);
            break;
        case 1: /* Ctrl-A */
            e->pos = 0;
            break;
        case 5: /* Ctrl-E */
            e->pos = e->buf.len;
            break;
        case 2: /* Ctrl-B */
            e->pos = prev_char(e, e->pos);
            break;
        case 6: /* Ctrl-F */
            e->pos = next_char(e, e->pos);
            break;
        case 11: /* Ctrl-K: to the end */
            delete_range(e, e->pos, e->buf.len);
            break;
        case 21: /* Ctrl-U: to the start */
            delete_range(e, 0, e->pos);
            break;
        case 23: { /* Ctrl-W: the word before the cursor */
            size_t at = e->pos;
            while (at > 0 && e->buf.buf[at - 1] == ' ')
                at--;
            while (at > 0 && e->buf.buf[at - 1] != ' ')
                at--;
            delete_range(e, at, e->pos);
            break;
        }
        case 12: /* Ctrl-L */
            out(e, "\x1b[H\x1b[2J", 7);
            break;
        case 16: /* Ctrl-P */
            if (e->hist_at > 0)
                history_go(e, e->hist_at - 1);
            break;
        case 14: /* Ctrl-N */
            history_go(e, e->hist_at + 1);
            break;
        case 27:
            switch (read_escape(le)) {
            case 'A':
                if (e->hist_at > 0)
                    history_go(e, e->hist_at - 1);
                break;
            case 'B':
                history_go(e, e->hist_at + 1);
                break;
            case 'C':
                e->pos = next_char(e, e->pos);
                break;
            case 'D':
                e->pos = prev_char(e, e->pos);
                break;
            case 'H':
                e->pos = 0;
                break;
            case 'F':
                e->pos = e->buf.len;
                break;
            case '3':
                if (e->pos < e->buf.len)
                    delete_range(e, e->pos, next_char(e, e->pos));
                break;
            default:
                break;
            }
            break;
        case '\t':
            insert(e, ' ');
            insert(e, ' ');
            break;
        default:
            if (c >= 32)
                insert(e, (char)c);
            break;
        }
        if (e->buf.oom)
            return -ENOMEM;
        refresh(e);
    }
}

int conch_cli_lineedit_read(struct conch_cli_lineedit *le, const char *prompt, char **ret_line)
{
    if (!le->tty)
        return read_plain(le, prompt, ret_line);
    if (!le->raw) {
        struct termios raw;
        if (tcgetattr(le->in, &le->saved) < 0)
            return read_plain(le, prompt, ret_line);
        raw = le->saved;
        raw.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
        raw.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG);
        raw.c_cc[VMIN] = 1;
        raw.c_cc[VTIME] = 0;
        if (tcsetattr(le->in, TCSADRAIN, &raw) < 0)
            return read_plain(le, prompt, ret_line);
        le->raw = true;
    }
    struct edit e = {.le = le, .prompt = prompt, .hist_at = le->n_hist};
    set_line(&e, "");
    int r = e.buf.oom ? -ENOMEM : edit_loop(&e);
    out(&e, "\r\n", 2);
    free(e.typed);
    if (r == 1) {
        *ret_line = e.buf.buf;
        return 1;
    }
    conch_sb_done(&e.buf);
    return r;
}
