/* js.c - `conch js SANDBOX [-e CODE]`: one JS/TypeScript eval in a daemon sandbox's JS
 * session (js.eval, docs/PROTOCOL.md), printing the result's text (console lines, then
 * `→ value` or the error). Without -e the code is read from standard input. The
 * interactive REPL comes later. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/strbuf.h"

struct js_opts {
    const char *sock, *code, *session;
    bool json;
    bool has_timeout;
    uint64_t timeout_ms;
};

enum { JS_SOCKET = 1, JS_JSON, JS_EVAL, JS_SESSION, JS_TIMEOUT };

static int js_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct js_opts *o = ctx;
    switch (key) {
    case JS_SOCKET:
        o->sock = value;
        break;
    case JS_JSON:
        o->json = true;
        break;
    case JS_EVAL:
        o->code = value;
        break;
    case JS_SESSION:
        o->session = value;
        break;
    default:
        o->has_timeout = true;
        return conch_cli_parse_seconds(value, "--timeout", &o->timeout_ms, err);
    }
    return 0;
}

/* Read standard input whole into @sb. Returns 0 or -1 (printed). */
static int read_stdin(struct conch_sb *sb)
{
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), stdin)) > 0)
        conch_sb_putn(sb, buf, n);
    if (ferror(stdin) || sb->oom) {
        fputs("conch js: could not read the code from standard input\n", stderr);
        return -1;
    }
    return 0;
}

int conch_cli_js(int argc, char **argv)
{
    static const char usage[] =
        "usage: conch js [--socket PATH] [--json] SANDBOX [-e CODE] [--session NAME]\n"
        "                [--timeout SECONDS]\n"
        "Run JavaScript or TypeScript in the sandbox's JS session (default \"default\"):\n"
        "globals persist between runs of a session; readFile/writeFile see the sandbox's\n"
        "files. Prints the console lines and the value (-> value) or the error; exits 1 when\n"
        "the code threw. Without -e the code is read from standard input. --timeout 0: none\n"
        "(default 60 s).\n";
    static const struct conch_cli_opt table[] = {
        {"socket", 0, true, JS_SOCKET},   {"json", 0, false, JS_JSON},
        {"eval", 'e', true, JS_EVAL},     {"session", 0, true, JS_SESSION},
        {"timeout", 0, true, JS_TIMEOUT}, {NULL, 0, false, 0},
    };
    struct js_opts o = {0};
    const struct conch_cli_parser p = {.verb = "js", .table = table, .handler = js_opt, .ctx = &o};
    struct conch_err err = {0};
    int i = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &i, &err);
    int j = 1;
    /* Options may follow the sandbox too. */
    if (r == 0 && i < argc)
        r = conch_cli_opts_parse(&p, argc - i, argv + i, &j, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("js", usage, "%s", err.msg);
    if (i >= argc)
        return conch_cli_usage_error("js", usage, "no sandbox given");
    if (i + j < argc)
        return conch_cli_usage_error("js", usage, "unexpected '%s' (the code goes in -e CODE)",
                                     argv[i + j]);
    struct conch_sb code = {0};
    if (!o.code) {
        if (isatty(STDIN_FILENO))
            return conch_cli_usage_error("js", usage,
                                         "no code: give -e CODE or pipe it on standard input");
        if (read_stdin(&code) < 0) {
            conch_sb_done(&code);
            return CONCH_EXIT_INFRA;
        }
        conch_sb_putn(&code, "", 1);
        o.code = code.buf;
    }
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0) {
        conch_sb_done(&code);
        return CONCH_EXIT_INFRA;
    }
    char sid[128];
    json_t *res = NULL;
    if (conch_cli_resolve(&c, argv[i], sid, sizeof(sid)) == 0) {
        json_t *params = json_pack("{s:s,s:s}", "sandbox", sid, "code", o.code);
        if (params && o.session)
            json_object_set_new(params, "session", json_string(o.session));
        if (params && o.has_timeout)
            json_object_set_new(params, "timeout", json_real((double)o.timeout_ms / 1000.0));
        res = conch_cli_conn_call(&c, "js.eval", params);
    }
    conch_cli_conn_close(&c);
    conch_sb_done(&code);
    if (!res)
        return CONCH_EXIT_INFRA;
    int status = json_is_true(json_object_get(res, "ok")) ? 0 : 1;
    if (o.json) {
        char *text = json_dumps(res, JSON_COMPACT);
        if (text)
            puts(text);
        free(text);
    } else {
        if (json_is_true(json_object_get(res, "restarted")))
            fprintf(stderr, "conch js: %s: a fresh session\n",
                    json_string_value(json_object_get(res, "restart_reason")));
        const char *text = json_string_value(json_object_get(res, "text"));
        if (text && *text)
            printf("%s%s", text, text[strlen(text) - 1] == '\n' ? "" : "\n");
    }
    json_decref(res);
    return status;
}
