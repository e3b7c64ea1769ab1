/* sandbox.c - `conch create`, `conch changes`, `conch diff`, `conch commit`, `conch discard`
 * and `conch cp`: the daemon's sandboxes and workspaces from the command line, each a thin
 * client of one or two JSON-RPC calls (docs/PROTOCOL.md), with --json for scripts. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "workspace/workspace.h"

/* Options every verb here takes. */
enum { OPT_SOCKET = 1, OPT_JSON };
static const struct conch_cli_opt common_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"json", 0, false, OPT_JSON},
    {NULL, 0, false, 0},
};

struct common {
    const char *verb;
    const char *usage;
    const char *sock;
    bool json;
};

static int usage_error(const struct common *o, const char *what, const char *arg)
{
    fprintf(stderr, "conch %s: %s%s%s%s\n%s", o->verb, what, arg ? " '" : "", arg ? arg : "",
            arg ? "'" : "", o->usage);
    return CONCH_EXIT_USAGE;
}

/* Print @res (taken) as one JSON line. */
static void print_json(json_t *res)
{
    char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        puts(s);
    free(s);
    json_decref(res);
}

/* Connect and resolve @ref (an id or a name) into @id. Returns 0, or the exit status after
 * printing why not: 125 (CONCH_EXIT_INFRA) when the daemon cannot be reached, as from every
 * verb, 1 when it knows no such sandbox. */
static int open_sandbox(const struct common *o, struct conch_cli_conn *c, const char *ref, char *id,
                        size_t size)
{
    if (conch_cli_conn_open(c, o->sock) < 0)
        return CONCH_EXIT_INFRA;
    if (conch_cli_resolve(c, ref, id, size) < 0) {
        conch_cli_conn_close(c);
        return 1;
    }
    return 0;
}

static int common_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct common *o = ctx;
    if (key == OPT_SOCKET)
        o->sock = value;
    else
        o->json = true;
    return 0;
}

/* Parse the common options (and @spec_opts into @spec) and leave the first operand's index
 * in *@ret_optind. Returns 0, 1 after printing the help, or -1 after a usage error. */
static int parse(struct common *o, int argc, char **argv, unsigned spec_opts,
                 struct conch_sandbox_spec *spec, int *ret_optind)
{
    const struct conch_cli_parser p = {.verb = o->verb,
                                       .table = common_opts,
                                       .handler = common_opt,
                                       .ctx = o,
                                       .spec_opts = spec_opts,
                                       .spec = spec};
    struct conch_err err = {0};
    int r = conch_cli_opts_parse(&p, argc, argv, ret_optind, &err);
    if (r == 1)
        fputs(o->usage, stdout);
    if (r < 0) {
        conch_cli_usage_error(o->verb, o->usage, "%s", err.msg);
        return -1;
    }
    return r;
}

/* ---- create ---- */

#define CREATE_SPEC_OPTS                                                                           \
    (CONCH_SPEC_OPT_WORKSPACE | CONCH_SPEC_OPT_NAME | CONCH_SPEC_OPT_MODE |                        \
     CONCH_SPEC_OPT_AS_ROOT | CONCH_SPEC_OPT_ENV | CONCH_SPEC_OPT_MEMORY | CONCH_SPEC_OPT_PIDS |   \
     CONCH_SPEC_OPT_CPU | CONCH_SPEC_OPT_TMP_SIZE | CONCH_SPEC_OPT_DISK |                          \
     CONCH_SPEC_OPT_IDLE_TIMEOUT)

int conch_cli_create(int argc, char **argv)
{
    struct common o = {
        .verb = "create",
        .usage = "usage: conch create [--socket PATH] [--json] [--workspace DIR] [--name N]\n"
                 "                    [--mode overlay|ro|rw] [--as-root] [--env K=V]...\n"
                 "                    [--memory B] [--pids N] [--cpu C] [--tmp-size B]\n"
                 "                    [--disk B] [--idle-timeout S]\n"
                 "\n"
                 "Create a sandbox in the running daemon and print its id (--json: the sandbox\n"
                 "object). Without --workspace it gets an empty one.\n"};
    struct conch_sandbox_spec spec;
    conch_spec_defaults(&spec);
    int optind = 1;
    int r = parse(&o, argc, argv, CREATE_SPEC_OPTS, &spec, &optind);
    char path[PATH_MAX];
    if (r == 0 && optind < argc) {
        usage_error(&o, "unexpected argument", argv[optind]);
        r = -1;
    }
    if (r == 0 && spec.workspace) {
        if (!realpath(spec.workspace, path)) {
            fprintf(stderr, "conch create: --workspace '%s': %s\n", spec.workspace,
                    strerror(errno));
            r = -1;
        }
        spec.workspace = path;
    }
    json_t *params = r == 0 ? conch_spec_to_json(&spec) : NULL;
    conch_spec_done(&spec);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (!params)
        return 1;
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0) {
        json_decref(params);
        return CONCH_EXIT_INFRA;
    }
    json_t *res = conch_cli_conn_call(&c, "sandbox.create", params);
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    if (o.json) {
        print_json(res);
    } else {
        puts(json_string_value(json_object_get(res, "id")));
        json_decref(res);
    }
    return 0;
}

/* ---- changes, diff, commit, discard ---- */

static char change_letter(const char *kind)
{
    if (!kind)
        return '?';
    if (!strcmp(kind, "added"))
        return 'A';
    if (!strcmp(kind, "deleted"))
        return 'D';
    if (!strcmp(kind, "type_changed"))
        return 'T';
    return 'M';
}

/* A path for the terminal: quoted as git quotes names that hold control bytes. */
static void print_path_line(const char *prefix, const char *path, const char *note)
{
    _cleanup_free_ char *q = conch_ws_quote("", path ? path : "", false);
    printf("%s%s%s\n", prefix, q ? q : "?", note ? note : "");
}

/* Every change, through workspace.changes' pages, into one result. */
static json_t *all_changes(struct conch_cli_conn *c, const char *id)
{
    json_t *all = json_array();
    json_int_t offset = 0, total = 0;
    for (;;) {
        json_t *page = conch_cli_conn_call(
            c, "workspace.changes",
            json_pack("{s:s,s:I,s:i}", "sandbox", id, "offset", offset, "limit", 10000));
        if (!page) {
            json_decref(all);
            return NULL;
        }
        json_array_extend(all, json_object_get(page, "changes"));
        total = json_integer_value(json_object_get(page, "changes_total"));
        json_t *next = json_object_get(page, "next_offset");
        bool more = json_is_integer(next) && json_integer_value(next) > offset;
        if (more)
            offset = json_integer_value(next);
        json_decref(page);
        if (!more)
            break;
    }
    return json_pack("{s:o,s:I,s:b}", "changes", all, "changes_total", total, "changes_truncated",
                     0);
}

enum ws_verb { WS_CHANGES, WS_DIFF, WS_COMMIT, WS_DISCARD };

static int ws_verb(enum ws_verb v, int argc, char **argv)
{
    static const char *const names[] = {"changes", "diff", "commit", "discard"};
    static const char *const usages[] = {
        "usage: conch changes [--socket PATH] [--json] ID\n"
        "\n"
        "List the changes a sandbox made to its workspace (A added, M modified, D deleted,\n"
        "T type changed), not yet committed.\n",
        "usage: conch diff [--socket PATH] [--json] ID [PATH...]\n"
        "\n"
        "Print the uncommitted changes as a unified diff (git apply / patch -p1 take it).\n",
        "usage: conch commit [--socket PATH] [--json] ID [PATH...]\n"
        "\n"
        "Apply the sandbox's changes (all, or the listed paths and what is beneath them) to\n"
        "its workspace directory on the host.\n",
        "usage: conch discard [--socket PATH] [--json] ID [PATH...]\n"
        "\n"
        "Drop the sandbox's uncommitted changes (all, or the listed paths). A running sandbox\n"
        "is restarted: its processes stop and /tmp and the home start empty.\n"};
    struct common o = {.verb = names[v], .usage = usages[v]};
    int optind = 1;
    int r = parse(&o, argc, argv, 0, NULL, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (optind >= argc)
        return usage_error(&o, "no sandbox given", NULL);
    if (v == WS_CHANGES && optind + 1 < argc)
        return usage_error(&o, "unexpected argument", argv[optind + 1]);
    char id[128];
    struct conch_cli_conn c;
    if ((r = open_sandbox(&o, &c, argv[optind], id, sizeof(id))) != 0)
        return r;
    json_t *paths = NULL;
    if (optind + 1 < argc) {
        paths = json_array();
        for (int i = optind + 1; i < argc; i++)
            json_array_append_new(paths, json_string(argv[i]));
    }
    json_t *res;
    if (v == WS_CHANGES) {
        res = all_changes(&c, id);
    } else {
        static const char *const methods[] = {NULL, "workspace.diff", "workspace.commit",
                                              "workspace.discard"};
        json_t *params = json_pack("{s:s}", "sandbox", id);
        if (paths)
            json_object_set(params, "paths", paths);
        res = conch_cli_conn_call(&c, methods[v], params);
    }
    json_decref(paths);
    conch_cli_conn_close(&c);
    if (!res)
        return 1;
    if (o.json) {
        print_json(res);
        return 0;
    }
    size_t i;
    json_t *e;
    switch (v) {
    case WS_CHANGES:
        json_array_foreach(json_object_get(res, "changes"), i, e)
        {
            char prefix[4] = {change_letter(json_string_value(json_object_get(e, "kind"))), ' ',
                              '\0'};
            const char *skip = json_string_value(json_object_get(e, "skip"));
            char note[128] = "";
            if (skip)
                snprintf(note, sizeof(note), "  [not committed: %s]", skip);
            else if (json_is_true(json_object_get(e, "link_outside")))
                snprintf(note, sizeof(note), "  [symlink pointing outside the workspace]");
            print_path_line(prefix, json_string_value(json_object_get(e, "path")), note);
        }
        break;
    case WS_DIFF: {
        json_t *d = json_object_get(res, "diff");
        fwrite(json_string_value(d), 1, json_string_length(d), stdout);
        json_int_t omitted = json_integer_value(json_object_get(res, "omitted"));
        if (omitted)
            fprintf(stderr, "conch diff: %lld file(s) omitted (the diff is capped at 16 MiB)\n",
                    (long long)omitted);
        break;
    }
    case WS_COMMIT:
        json_array_foreach(json_object_get(res, "committed"), i, e)
            print_path_line("committed ", json_string_value(e), NULL);
        json_array_foreach(json_object_get(res, "skipped"), i, e)
        {
            char note[160];
            snprintf(note, sizeof(note), "  (%s)",
                     json_string_value(json_object_get(e, "reason"))
                         ? json_string_value(json_object_get(e, "reason"))
                         : "skipped");
            print_path_line("skipped ", json_string_value(json_object_get(e, "path")), note);
        }
        break;
    case WS_DISCARD:
        json_array_foreach(json_object_get(res, "discarded"), i, e)
            print_path_line("discarded ", json_string_value(e), NULL);
        break;
    }
    json_decref(res);
    return 0;
}

int conch_cli_changes(int argc, char **argv)
{
    return ws_verb(WS_CHANGES, argc, argv);
}

int conch_cli_diff(int argc, char **argv)
{
    return ws_verb(WS_DIFF, argc, argv);
}

int conch_cli_commit(int argc, char **argv)
{
    return ws_verb(WS_COMMIT, argc, argv);
}

int conch_cli_discard(int argc, char **argv)
{
    return ws_verb(WS_DISCARD, argc, argv);
}

/* ---- cp ---- */

static const char b64chars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const unsigned char *p, size_t n)
{
    char *out = malloc((n + 2) / 3 * 4 + 1), *o = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *o++ = b64chars[v >> 18 & 63];
        *o++ = b64chars[v >> 12 & 63];
        *o++ = i + 1 < n ? b64chars[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? b64chars[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

static int b64_decode(const char *s, size_t n, unsigned char **ret, size_t *ret_len)
{
    unsigned char *out = malloc(n / 4 * 3 + 3);
    if (!out)
        return -ENOMEM;
    size_t len = 0;
    unsigned v = 0, bits = 0;
    for (size_t i = 0; i < n && s[i] != '='; i++) {
        const char *k = strchr(b64chars, s[i]);
        if (!k || !s[i]) {
            free(out);
            return -EINVAL;
        }
        v = v << 6 | (unsigned)(k - b64chars);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(v >> bits);
        }
    }
    *ret = out;
    *ret_len = len;
    return 0;
}

/* "ID:PATH" (a colon before any '/') names a path in a sandbox; anything else is local. */
static bool split_remote(char *arg, char **ret_ref, char **ret_path)
{
    char *colon = strchr(arg, ':');
    char *slash = strchr(arg, '/');
    if (!colon || colon == arg || (slash && slash < colon))
        return false;
    *colon = '\0';
    *ret_ref = arg;
    *ret_path = colon + 1;
    return true;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* Bytes moved per request: well below every cap of the protocol. */
#define CP_CHUNK (4u << 20)

/* Into the sandbox, CP_CHUNK bytes per fs.write (the first replaces, the rest append): any
 * size, constant memory. */
static int cp_in(struct conch_cli_conn *c, const char *id, const char *src, const char *dst,
                 json_int_t *ret_bytes)
{
    _cleanup_close_ int fd = open(src, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        fprintf(stderr, "conch cp: '%s': %s\n", src, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "conch cp: '%s' is not a regular file (only files are copied)\n", src);
        return -1;
    }
    _cleanup_free_ unsigned char *buf = malloc(CP_CHUNK);
    if (!buf)
        return -1;
    json_int_t total = 0;
    for (bool first = true;; first = false) {
        size_t n = 0;
        while (n < CP_CHUNK) {
            ssize_t got = read(fd, buf + n, CP_CHUNK - n);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0) {
                fprintf(stderr, "conch cp: read '%s': %s\n", src, strerror(errno));
                return -1;
            }
            if (got == 0)
                break;
            n += (size_t)got;
        }
        if (n == 0 && !first)
            break;
        _cleanup_free_ char *b64 = b64_encode(buf, n);
        json_t *res = b64 ? conch_cli_conn_call(c, "fs.write",
                                                json_pack("{s:s,s:s,s:s,s:s,s:b}", "sandbox", id,
                                                          "path", dst, "encoding", "base64",
                                                          "content", b64, "append", !first))
                          : NULL;
        if (!res)
            return -1;
        json_decref(res);
        total += (json_int_t)n;
        if (n < CP_CHUNK)
            break;
    }
    *ret_bytes = total;
    return 0;
}

/* Out of the sandbox, by byte ranges of CP_CHUNK (fs.read base64 offset/length). */
static int cp_out(struct conch_cli_conn *c, const char *id, const char *src, const char *dst,
                  json_int_t *ret_bytes)
{
    _cleanup_close_ int fd = -1;
    json_int_t off = 0;
    for (;;) {
        json_t *res = conch_cli_conn_call(c, "fs.read",
                                          json_pack("{s:s,s:s,s:s,s:I,s:i}", "sandbox", id, "path",
                                                    src, "encoding", "base64", "offset", off,
                                                    "length", (int)CP_CHUNK));
        if (!res)
            return -1;
        json_t *content = json_object_get(res, "content");
        unsigned char *data = NULL;
        size_t n = 0;
        int r = json_is_string(content)
                    ? b64_decode(json_string_value(content), json_string_length(content), &data, &n)
                    : -EINVAL;
        bool eof = json_is_true(json_object_get(res, "eof"));
        json_decref(res);
        if (r < 0) {
            fprintf(stderr, "conch cp: the daemon sent invalid base64 for '%s'\n", src);
            return -1;
        }
        if (fd < 0)
            fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || conch_write_all(fd, data, n) < 0) {
            fprintf(stderr, "conch cp: write '%s': %s\n", dst, strerror(errno));
            free(data);
            return -1;
        }
        free(data);
        off += (json_int_t)n;
        if (eof || n == 0)
            break;
    }
    *ret_bytes = off;
    return 0;
}

int conch_cli_cp(int argc, char **argv)
{
    struct common o = {
        .verb = "cp",
        .usage = "usage: conch cp [--socket PATH] [--json] SRC DST\n"
                 "\n"
                 "Copy one file (any size, in 4 MiB pieces) into or out of a sandbox: exactly\n"
                 "one of SRC and DST is ID:PATH\n"
                 "(ID an id or a name; PATH relative to /workspace, or absolute inside the\n"
                 "sandbox). A DST ending in '/' (or a local directory) takes SRC's name. Write\n"
                 "a local path holding ':' as ./a:b.\n"};
    int optind = 1;
    int r = parse(&o, argc, argv, 0, NULL, &optind);
    if (r != 0)
        return r > 0 ? 0 : CONCH_EXIT_USAGE;
    if (argc - optind != 2)
        return usage_error(&o, "expected SRC and DST", NULL);
    char *sref = NULL, *spath = NULL, *dref = NULL, *dpath = NULL;
    bool sremote = split_remote(argv[optind], &sref, &spath);
    bool dremote = split_remote(argv[optind + 1], &dref, &dpath);
    if (sremote == dremote)
        return usage_error(&o,
                           sremote ? "both SRC and DST are in a sandbox: copy through the host"
                                   : "neither SRC nor DST is ID:PATH",
                           NULL);
    const char *src = sremote ? spath : argv[optind];
    const char *dst0 = dremote ? dpath : argv[optind + 1];
    if (!*src || !*dst0)
        return usage_error(&o, "empty path", NULL);
    char dst[PATH_MAX + 256];
    struct stat st;
    size_t dl = strlen(dst0);
    if (dst0[dl - 1] == '/' || (!dremote && stat(dst0, &st) == 0 && S_ISDIR(st.st_mode)))
        snprintf(dst, sizeof(dst), "%s%s%s", dst0, dst0[dl - 1] == '/' ? "" : "/", base_name(src));
    else
        snprintf(dst, sizeof(dst), "%s", dst0);
    char id[128];
    struct conch_cli_conn c;
    if ((r = open_sandbox(&o, &c, sremote ? sref : dref, id, sizeof(id))) != 0)
        return r;
    json_int_t bytes = 0;
    r = sremote ? cp_out(&c, id, src, dst, &bytes) : cp_in(&c, id, src, dst, &bytes);
    conch_cli_conn_close(&c);
    if (r < 0)
        return 1;
    if (o.json)
        print_json(json_pack("{s:s,s:s,s:I}", "src", src, "dst", dst, "bytes", bytes));
    return 0;
}
