/* opts.c - the one option parser of every verb, and the option value parsers they share. */
#include "cli/opts.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "core/cleanup.h"

/* What an option word names: one of the verb's own, a spec option, or help. */
struct found {
    const struct conch_cli_opt *own;
    const char *spec_name; /* the spec option's name (NUL-terminated), or NULL */
    bool help;
    bool takes_value;
    int remote; /* REMOTE_URL, REMOTE_TOKEN_FILE: the remote daemon's options */
};

enum { REMOTE_URL = 1, REMOTE_TOKEN_FILE };

/* The verbs that talk to a daemon (their table has --socket) also take --remote URL and
 * --token-file FILE; `conch run` and `conch serve` stay on this machine. */
static bool takes_remote(const struct conch_cli_parser *p)
{
    if (!strcmp(p->verb, "run") || !strcmp(p->verb, "serve"))
        return false;
    for (const struct conch_cli_opt *o = p->table; o && o->name; o++)
        if (!strcmp(o->name, "socket"))
            return true;
    return false;
}

static bool lookup_long(const struct conch_cli_parser *p, const char *name, size_t len, char *buf,
                        size_t size, struct found *f)
{
    memset(f, 0, sizeof(*f));
    for (const struct conch_cli_opt *o = p->table; o && o->name; o++) {
        if (strlen(o->name) == len && !memcmp(o->name, name, len)) {
            f->own = o;
            f->takes_value = o->takes_value;
            return true;
        }
    }
    if (len < size && p->spec) {
        memcpy(buf, name, len);
        buf[len] = '\0';
        if (conch_spec_option(buf, p->spec_opts, &f->takes_value)) {
            f->spec_name = buf;
            return true;
        }
    }
    if (len == 4 && !memcmp(name, "help", 4)) {
        f->help = true;
        return true;
    }
    if (takes_remote(p) && ((len == 6 && !memcmp(name, "remote", 6)) ||
                            (len == 10 && !memcmp(name, "token-file", 10)))) {
        f->remote = len == 6 ? REMOTE_URL : REMOTE_TOKEN_FILE;
        f->takes_value = true;
        return true;
    }
    return false;
}

static bool lookup_short(const struct conch_cli_parser *p, char c, struct found *f)
{
    memset(f, 0, sizeof(*f));
    for (const struct conch_cli_opt *o = p->table; o && o->name; o++) {
        if (o->short_name && o->short_name == c) {
            f->own = o;
            f->takes_value = o->takes_value;
            return true;
        }
    }
    f->help = c == 'h';
    return f->help;
}

/* Hand @value (NULL for a flag) to whoever takes the option @f. */
static int apply(const struct conch_cli_parser *p, const struct found *f, char *value,
                 struct conch_err *err)
{
    if (f->remote == REMOTE_URL)
        return conch_cli_remote_set_url(value, err);
    if (f->remote == REMOTE_TOKEN_FILE)
        return conch_cli_remote_set_token_file(value, err);
    if (f->own)
        return p->handler ? p->handler(p->ctx, f->own->key, value, err)
                          : conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "option without handler");
    int r = conch_spec_set_option(p->spec, f->spec_name, value, err);
    if (r == 0 && value && !strcmp(f->spec_name, "env")) {
        /* The spec keeps a copy: blank the value where `ps` would show it. */
        char *eq = strchr(value, '=');
        if (eq)
            memset(eq + 1, '*', strlen(eq + 1));
    }
    return r;
}

int conch_cli_opts_parse(const struct conch_cli_parser *p, int argc, char **argv, int *ret_optind,
                         struct conch_err *err)
{
    int i = 1, r;
    for (; i < argc; i++) {
        char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0')
            break; /* the first operand */
        struct found f;
        if (a[1] == '-') {
            const char *name = a + 2;
            char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            char buf[64];
            /* Only the name is quoted back: the value may be a secret. */
            if (len == 5 && !memcmp(name, "token", 5) && takes_remote(p))
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "no --token option: it would show in /proc/PID/cmdline; "
                                      "use $CONCH_TOKEN or --token-file FILE");
            if (!lookup_long(p, name, len, buf, sizeof(buf), &f))
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unknown option '--%.*s'",
                                      (int)len, name);
            if (f.help)
                return 1;
            char *value = NULL;
            if (f.takes_value && eq)
                value = eq + 1;
            else if (f.takes_value && i + 1 < argc)
                value = argv[++i];
            else if (f.takes_value)
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "option '--%.*s' needs a value",
                                      (int)len, name);
            else if (eq)
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "option '--%.*s' takes no value", (int)len, name);
            if ((r = apply(p, &f, value, err)) < 0)
                return r;
            continue;
        }
        for (size_t j = 1; a[j]; j++) {
            if (!lookup_short(p, a[j], &f)) {
                if (strlen(a) > 2)
                    return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                          "unknown option '-%c' (in '%s')", a[j], a);
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unknown option '%s'", a);
            }
            if (f.help)
                return 1;
            if (!f.takes_value) {
                if ((r = apply(p, &f, NULL, err)) < 0)
                    return r;
                continue;
            }
            /* The rest of the word is the value (-xV), else the next word. */
            char *value = a[j + 1] ? &a[j + 1] : i + 1 < argc ? argv[++i] : NULL;
            if (!value)
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "option '-%c' needs a value",
                                      a[j]);
            if ((r = apply(p, &f, value, err)) < 0)
                return r;
            break;
        }
    }
    *ret_optind = i;
    return 0;
}

int conch_cli_usage_error(const char *verb, const char *usage, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "conch %s: ", verb);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n%s", usage ? usage : "");
    return CONCH_EXIT_USAGE;
}

int conch_cli_parse_seconds(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: '%s' is not a number of seconds (e.g. 30, 0.5)", what, s);
    *ret = (uint64_t)llround(v * 1000.0);
    /* A positive time under half a millisecond is not "none" (0): round it up. */
    if (v > 0 && *ret == 0)
        *ret = 1;
    return 0;
}

int conch_cli_parse_count(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v == 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is not a positive number",
                              what, s);
    *ret = v;
    return 0;
}

enum { SOCK_JSON_SOCKET = 1, SOCK_JSON_JSON };
const struct conch_cli_opt conch_cli_sock_json_opts[] = {
    {"socket", 0, true, SOCK_JSON_SOCKET},
    {"json", 0, false, SOCK_JSON_JSON},
    {NULL, 0, false, 0},
};

int conch_cli_sock_json_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct conch_cli_sock_json *o = ctx;
    (void)err;
    if (key == SOCK_JSON_SOCKET)
        o->sock = value;
    else
        o->json = true;
    return 0;
}
