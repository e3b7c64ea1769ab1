/* tool_call.c - `tool_call` and `spawn_agent`, the in-sandbox commands of the tool bridge
 * (one program; argv[0]'s basename picks the behaviour). Each run opens the bridge socket
 * ($CONCH_PTC_SOCK, default /run/conch/ptc.sock), sends one request line, prints the answer
 * and exits with 0, 1 (the call failed) or 2 (unknown tool, invalid input, usage). Linked
 * statically, libc and jansson only, so that it starts about as fast as /bin/true and runs in
 * any sandbox image. See docs/TOOLS.md and the bridge spec (section B and C). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define DEFAULT_SOCK "/run/conch/ptc.sock"
#define MAX_LINE (4u << 20)           /* the bridge's payload cap, each way */
#define MAX_REPLY (MAX_LINE + 65536u) /* an answer line: the result plus the envelope */

enum { EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2 };

static const char *prog = "tool_call";

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

static int usage(FILE *f, int code)
{
    if (strcmp(prog, "spawn_agent") == 0)
        fprintf(f, "usage: spawn_agent [--detach] TASK [TYPE]\n"
                   "  Hands TASK (text; '-' reads it from stdin) to a sub-agent of TYPE (default:\n"
                   "  the harness's default agent) and prints its final answer.\n"
                   "  --detach   print a request id and return at once; the answer goes to the\n"
                   "             harness with the command's result\n"
                   "exit: 0 ok, 1 the agent failed or is unavailable, 2 usage\n");
    else
        fprintf(f, "usage: tool_call NAME [JSON | -]   call tool NAME with the JSON input (default "
                   "{};\n"
                   "                                   '-' reads it from stdin) and print the "
                   "result\n"
                   "       tool_call --list [--json]   list the tools and agent types (--json: "
                   "all of\n"
                   "                                   it, input schemas included, as JSON)\n"
                   "       tool_call --help NAME       show a tool's description and input "
                   "schema\n"
                   "A string result is printed raw, any other as one line of JSON.\n"
                   "exit: 0 ok, 1 the tool failed (timeout, unavailable, ...), 2 unknown tool,\n"
                   "      invalid input or usage\n");
    return code;
}

static const char *sock_path(void)
{
    const char *p = getenv("CONCH_PTC_SOCK");
    return p && *p ? p : DEFAULT_SOCK;
}

static int connect_bridge(void)
{
    const char *path = sock_path();
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        die(EXIT_FAILED, "socket path too long: %s", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        die(EXIT_FAILED, "socket: %s", strerror(errno));
        return -1;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;
        if (e == ENOENT || e == ECONNREFUSED || e == ENOTDIR)
            die(EXIT_FAILED,
                "no tool bridge in this sandbox: %s: %s (tools are available only when the "
                "sandbox runs with a tool bridge; set CONCH_PTC_SOCK if it is elsewhere)",
                path, strerror(e));
        else
            die(EXIT_FAILED, "cannot connect to the tool bridge at %s: %s", path, strerror(e));
        close(fd);
        return -1;
    }
    return fd;
}

static bool write_all(int fd, const char *p, size_t n, bool sock)
{
    while (n) {
        ssize_t w = sock ? send(fd, p, n, MSG_NOSIGNAL) : write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Read @fd into a new buffer (its length in *@ret_len) until EOF or, with @to_newline, until
 * a line end has arrived; more than @max bytes is too much. Returns the buffer, or NULL with
 * *@ret_err: -E2BIG, -ENOMEM, -errno of a read, or 0 for EOF before a line end. */
static char *read_until(int fd, size_t max, bool to_newline, size_t *ret_len, int *ret_err)
{
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            *ret_err = -ENOMEM;
            return NULL;
        }
        if (len == cap) {
            if (cap >= max) {
                free(buf);
                *ret_err = -E2BIG;
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                free(buf);
            buf = nb;
            cap *= 2;
            continue;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || (r == 0 && to_newline)) {
            *ret_err = r < 0 ? -errno : 0;
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        bool nl = to_newline && memchr(buf + len, '\n', (size_t)r);
        len += (size_t)r;
        if (nl)
            break;
    }
    *ret_len = len;
    return buf;
}

/* Read stdin whole (at most MAX_LINE bytes); NULL on error (reported). */
static char *read_stdin(size_t *ret_len)
{
    int e = 0;
    char *buf = read_until(0, MAX_LINE, false, ret_len, &e);
    if (!buf && e == -E2BIG)
        die(EXIT_FAILED, "stdin is larger than the bridge's %u MiB cap", MAX_LINE >> 20);
    else if (!buf)
        die(EXIT_FAILED, "reading stdin: %s", strerror(-e));
    return buf;
}

/* Send @req (a request object without id), read the answer line. Returns the parsed response
 * or NULL (reported; *@ret_code is the exit status). */
static json_t *round_trip(json_t *req, int *ret_code)
{
    *ret_code = EXIT_FAILED;
    json_object_set_new(req, "id", json_integer(1));
    char *line = json_dumps(req, JSON_COMPACT);
    if (!line) {
        die(EXIT_FAILED, "out of memory");
        return NULL;
    }
    size_t n = strlen(line);
    if (n > MAX_LINE) {
        free(line);
        die(EXIT_FAILED, "the request is larger than the bridge's %u MiB cap", MAX_LINE >> 20);
        return NULL;
    }
    line[n] = '\n'; /* json_dumps left room: its NUL */
    int fd = connect_bridge();
    if (fd < 0) {
        free(line);
        return NULL;
    }
    bool ok = write_all(fd, line, n + 1, true);
    free(line);
    if (!ok) {
        close(fd);
        die(EXIT_FAILED, "the tool bridge closed the connection (sending: %s)", strerror(errno));
        return NULL;
    }
    size_t len = 0;
    int e = 0;
    char *buf = read_until(fd, MAX_REPLY, true, &len, &e);
    close(fd);
    if (!buf) {
        if (e == -E2BIG)
            die(EXIT_FAILED, "the answer is larger than the bridge's %u MiB cap", MAX_REPLY >> 20);
        else if (e == -ENOMEM)
            die(EXIT_FAILED, "out of memory");
        else
            die(EXIT_FAILED, "the tool bridge closed the connection before answering%s%s",
                e < 0 ? ": " : "", e < 0 ? strerror(-e) : "");
        return NULL;
    }
    char *nl = memchr(buf, '\n', len);
    json_error_t je;
    json_t *resp = json_loadb(buf, (size_t)(nl - buf), 0, &je);
    free(buf);
    if (!json_is_object(resp)) {
        json_decref(resp);
        die(EXIT_FAILED, "the tool bridge sent a malformed answer: %s", je.text);
        return NULL;
    }
    *ret_code = EXIT_OK;
    return resp;
}

/* An error response: message on stderr, the exit status its kind calls for. */
static int report_error(json_t *resp, const char *what)
{
    json_t *e = json_object_get(resp, "error");
    const char *kind = json_string_value(json_object_get(e, "kind"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    if (!kind)
        kind = "tool_error";
    bool usage_kind = strcmp(kind, "unknown_tool") == 0 || strcmp(kind, "invalid_input") == 0 ||
                      strcmp(kind, "invalid_request") == 0;
    if (what)
        fprintf(stderr, "%s: %s: %s (%s)\n", prog, what, msg ? msg : "failed", kind);
    else
        fprintf(stderr, "%s: %s (%s)\n", prog, msg ? msg : "failed", kind);
    return usage_kind ? EXIT_USAGE : EXIT_FAILED;
}

/* The result on stdout: a string raw (newline added unless it ends in one), else compact JSON. */
static int print_result(json_t *result)
{
    bool ok;
    if (json_is_string(result)) {
        const char *s = json_string_value(result);
        size_t n = json_string_length(result);
        ok = write_all(1, s, n, false);
        if (ok && (n == 0 || s[n - 1] != '\n'))
            ok = write_all(1, "\n", 1, false);
    } else {
        char *d = json_dumps(result ? result : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
        if (!d)
            return die(EXIT_FAILED, "out of memory");
        size_t n = strlen(d);
        d[n] = '\n';
        ok = write_all(1, d, n + 1, false);
        free(d);
    }
    if (!ok)
        return die(EXIT_FAILED, "writing the result: %s", strerror(errno));
    return EXIT_OK;
}

static int answer(json_t *req, const char *what)
{
    int code;
    json_t *resp = round_trip(req, &code);
    json_decref(req);
    if (!resp)
        return code;
    if (json_is_true(json_object_get(resp, "ok")))
        code = print_result(json_object_get(resp, "result"));
    else
        code = report_error(resp, what);
    json_decref(resp);
    return code;
}

static json_t *list_tools(int *ret_code)
{
    json_t *req = json_pack("{s:s}", "op", "list");
    json_t *resp = req ? round_trip(req, ret_code) : NULL;
    json_decref(req);
    if (!resp)
        return NULL;
    if (!json_is_true(json_object_get(resp, "ok"))) {
        *ret_code = report_error(resp, "list");
        json_decref(resp);
        return NULL;
    }
    json_t *r = json_incref(json_object_get(resp, "result"));
    json_decref(resp);
    return r;
}

static void first_line(FILE *f, const char *s)
{
    size_t n = strcspn(s, "\n");
    fprintf(f, "%.*s%s", (int)(n > 100 ? 97 : n), s, n > 100 ? "..." : "");
}

static int cmd_list(bool as_json)
{
    int code;
    json_t *r = list_tools(&code);
    if (!r)
        return code;
    if (as_json) {
        code = print_result(r);
        json_decref(r);
        return code;
    }
    json_t *tools = json_object_get(r, "tools"), *agents = json_object_get(r, "agents");
    size_t i, w = 4;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        size_t n = strlen(json_string_value(json_object_get(t, "name")) ?: "");
        w = n > w ? n : w;
    }
    json_array_foreach(agents, i, t)
    {
        size_t n = strlen(json_string_value(json_object_get(t, "name")) ?: "");
        w = n > w ? n : w;
    }
    if (json_array_size(tools) == 0)
        printf("no tools are registered\n");
    else
        printf("tools:\n");
    json_array_foreach(tools, i, t)
    {
        printf("  %-*s  ", (int)w, json_string_value(json_object_get(t, "name")) ?: "?");
        first_line(stdout, json_string_value(json_object_get(t, "description")) ?: "");
        printf("\n");
    }
    if (json_array_size(agents)) {
        printf("agent types (spawn_agent TASK TYPE):\n");
        json_array_foreach(agents, i, t)
        {
            printf("  %-*s  ", (int)w, json_string_value(json_object_get(t, "name")) ?: "?");
            first_line(stdout, json_string_value(json_object_get(t, "description")) ?: "");
            printf("\n");
        }
    }
    json_decref(r);
    if (fflush(stdout) != 0)
        return die(EXIT_FAILED, "writing: %s", strerror(errno));
    return EXIT_OK;
}

static int cmd_help(const char *name)
{
    int code;
    json_t *r = list_tools(&code);
    if (!r)
        return code;
    size_t i;
    json_t *t, *found = NULL;
    json_array_foreach(json_object_get(r, "tools"), i, t)
    {
        const char *n = json_string_value(json_object_get(t, "name"));
        if (n && strcmp(n, name) == 0)
            found = t;
    }
    if (!found) {
        json_decref(r);
        return die(EXIT_USAGE, "unknown tool \"%s\" (tool_call --list shows the tools)", name);
    }
    printf("%s\n\n", name);
    const char *d = json_string_value(json_object_get(found, "description"));
    if (d && *d)
        printf("%s%s\n", d, d[strlen(d) - 1] == '\n' ? "" : "\n");
    char *s = json_dumps(json_object_get(found, "input_schema") ?: json_object(),
                         JSON_INDENT(2) | JSON_ENCODE_ANY);
    printf("input schema:\n%s\n\nusage: tool_call %s '<JSON input>'\n", s ? s : "{}", name);
    free(s);
    json_decref(r);
    if (fflush(stdout) != 0)
        return die(EXIT_FAILED, "writing: %s", strerror(errno));
    return EXIT_OK;
}

static int cmd_call(int argc, char **argv)
{
    const char *name = argv[0];
    if (argc > 2)
        return usage(stderr, EXIT_USAGE);
    json_t *input;
    json_error_t je;
    if (argc < 2) {
        input = json_object();
    } else if (strcmp(argv[1], "-") == 0) {
        size_t n;
        char *buf = read_stdin(&n);
        if (!buf)
            return EXIT_FAILED;
        input = json_loadb(buf, n, JSON_DECODE_ANY, &je);
        free(buf);
        if (!input)
            return die(EXIT_USAGE, "%s: the input on stdin is not valid JSON: %s (line %d)", name,
                       je.text, je.line);
    } else {
        input = json_loads(argv[1], JSON_DECODE_ANY, &je);
        if (!input)
            return die(EXIT_USAGE,
                       "%s: the input argument is not valid JSON: %s (at character %d); quote it, "
                       "e.g. tool_call %s '{\"key\": \"value\"}'",
                       name, je.text, je.position, name);
    }
    json_t *req = json_pack("{s:s,s:s,s:o}", "op", "call", "name", name, "input", input);
    if (!req)
        return die(EXIT_FAILED, "out of memory");
    return answer(req, name);
}

static int cmd_spawn(int argc, char **argv)
{
    bool detach = false;
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
        if (strcmp(argv[i], "--detach") == 0 || strcmp(argv[i], "-d") == 0)
            detach = true;
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return usage(stdout, EXIT_OK);
        else if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else
            return die(EXIT_USAGE, "unknown option %s (spawn_agent --help)", argv[i]);
    }
    if (argc - i < 1 || argc - i > 2)
        return usage(stderr, EXIT_USAGE);
    json_t *task;
    if (strcmp(argv[i], "-") == 0) {
        size_t n;
        char *buf = read_stdin(&n);
        if (!buf)
            return EXIT_FAILED;
        task = json_stringn(buf, n);
        free(buf);
        if (!task)
            return die(EXIT_USAGE, "the task on stdin is not UTF-8 text");
    } else {
        task = json_string(argv[i]);
        if (!task)
            return die(EXIT_USAGE, "the task is not UTF-8 text");
    }
    json_t *type = argc - i == 2 ? json_string(argv[i + 1]) : json_null();
    if (!type)
        return die(EXIT_USAGE, "the agent type is not UTF-8 text");
    json_t *req =
        json_pack("{s:s,s:o,s:o,s:b}", "op", "spawn", "task", task, "type", type, "detach", detach);
    if (!req)
        return die(EXIT_FAILED, "out of memory");
    if (!detach)
        return answer(req, NULL);
    int code;
    json_t *resp = round_trip(req, &code);
    json_decref(req);
    if (!resp)
        return code;
    if (!json_is_true(json_object_get(resp, "ok"))) {
        code = report_error(resp, NULL);
    } else {
        json_t *res = json_object_get(resp, "result");
        json_t *rid = json_object_get(res, "request_id");
        code = print_result(rid ? rid : res);
    }
    json_decref(resp);
    return code;
}

int main(int argc, char **argv)
{
    const char *base = argc > 0 ? strrchr(argv[0], '/') : NULL;
    base = base ? base + 1 : (argc > 0 ? argv[0] : "tool_call");
    prog = strcmp(base, "spawn_agent") == 0 ? "spawn_agent" : "tool_call";
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(prog, "spawn_agent") == 0)
        return cmd_spawn(argc, argv);

    if (argc < 2)
        return usage(stderr, EXIT_USAGE);
    const char *a = argv[1];
    if (strcmp(a, "--list") == 0 || strcmp(a, "-l") == 0) {
        if (argc == 2)
            return cmd_list(false);
        bool json = argc == 3 && strcmp(argv[2], "--json") == 0;
        return json ? cmd_list(true) : usage(stderr, EXIT_USAGE);
    }
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
        if (argc == 2)
            return usage(stdout, EXIT_OK);
        return argc == 3 ? cmd_help(argv[2]) : usage(stderr, EXIT_USAGE);
    }
    if (a[0] == '-')
        return die(EXIT_USAGE, "unknown option %s (tool_call --help)", a);
    return cmd_call(argc - 1, argv + 1);
}
