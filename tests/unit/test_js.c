/* test_js.c - the JavaScript/TypeScript engine (src/js): type stripping over a corpus of
 * real-world TypeScript, REPL cells (persistence, top-level await, last value), errors with
 * their lines, deadlines, the memory and stack limits, rendering, console, files, tool calls
 * and the worker's framed protocol. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/strbuf.h"
#include "js/js.h"

#ifndef CORPUS_DIR
#define CORPUS_DIR "tests/unit/ts-corpus"
#endif

static struct conch_js_session *new_session(const struct conch_js_limits *l,
                                            const struct conch_js_host *h)
{
    struct conch_js_session *s = NULL;
    struct conch_err err = {0};
    cr_assert_eq(conch_js_session_new(l, h, &s, &err), 0, "%s", err.msg);
    return s;
}

static json_t *eval_t(struct conch_js_session *s, const char *code, int64_t timeout_ms)
{
    struct conch_js_eval_opts o = {.timeout_ms = timeout_ms, .filename = "cell.ts"};
    json_t *res = NULL;
    struct conch_err err = {0};
    cr_assert_eq(conch_js_eval(s, code, strlen(code), &o, &res, &err), 0, "%s", err.msg);
    return res;
}

static json_t *eval(struct conch_js_session *s, const char *code)
{
    return eval_t(s, code, 5000);
}

/* The eval must have succeeded with a value whose JSON is @want. */
static void expect_value(struct conch_js_session *s, const char *code, const char *want)
{
    json_t *res = eval(s, code);
    char *dump = json_dumps(res, JSON_COMPACT);
    cr_assert(json_is_true(json_object_get(res, "ok")), "eval failed: %s", dump);
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    cr_assert(w, "bad expectation %s", want);
    cr_assert(json_equal(json_object_get(res, "value"), w), "%s: want %s, got %s", code, want,
              dump);
    json_decref(w);
    free(dump);
    json_decref(res);
}

static const char *err_field(json_t *res, const char *f)
{
    return json_string_value(json_object_get(json_object_get(res, "error"), f));
}

static size_t lines(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

/* --- stripping --- */

static char *strip(const char *src, int want)
{
    char *out = NULL;
    size_t len = 0;
    struct conch_err err = {0};
    int r = conch_js_strip_types(src, strlen(src), &out, &len, &err);
    cr_assert_eq(r, want, "strip returned %d for %s (%s)", r, src, err.msg);
    cr_assert_eq(lines(out, len), lines(src, strlen(src)), "lines moved: %s", out);
    return out;
}

Test(js_strip, types_become_spaces_columns_hold)
{
    char *out = strip("let x: number = 1;\nfunction f<T>(a: T): T { return a as T; }\n", 1);
    cr_assert_str_eq(out, "let x         = 1;\nfunction f   (a   )    { return a     ; }\n");
    free(out);
    out = strip("interface I { a: string }\ntype T = I | null;\nconst y = z!;\n", 1);
    cr_assert_str_eq(out, "                         \n                  \nconst y = z ;\n");
    free(out);
}

Test(js_strip, unparsable_is_returned_as_given)
{
    const char *bad = "let x = ;\nfoo(\n";
    char *out = strip(bad, 0);
    cr_assert_str_eq(out, bad);
    free(out);
}

Test(js_strip, plain_javascript_is_unchanged)
{
    const char *js = "const a = [1, 2].map((x) => x * 2);\nif (a[0] < 2 && a[1] > 1) a.b = 3;\n";
    char *out = strip(js, 1);
    cr_assert_str_eq(out, js);
    free(out);
}

/* Each corpus file strips to JavaScript on the same lines, and as a REPL cell it gives the
 * value its first line expects. */
Test(js_strip, corpus_runs_with_expected_values)
{
    DIR *d = opendir(CORPUS_DIR);
    cr_assert(d, "open %s: %s", CORPUS_DIR, strerror(errno));
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d))) {
        if (!strstr(de->d_name, ".ts"))
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", CORPUS_DIR, de->d_name);
        char *src = NULL;
        size_t len = 0;
        struct conch_err err = {0};
        cr_assert_eq(conch_read_file(path, 1 << 20, &src, &len, &err), 0, "%s", err.msg);
        char *out = strip(src, 1);
        free(out);
        const char *expect = strstr(src, "// expect: ");
        cr_assert(expect, "%s has no '// expect: ' line", path);
        char want[1024];
        size_t n = strcspn(expect + 11, "\n");
        snprintf(want, sizeof(want), "%.*s", (int)n, expect + 11);
        struct conch_js_session *s = new_session(NULL, NULL);
        json_t *res = eval(s, src);
        char *dump = json_dumps(res, JSON_COMPACT);
        json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
        cr_assert(json_is_true(json_object_get(res, "ok")), "%s failed: %s", path, dump);
        cr_assert(json_equal(json_object_get(res, "value"), w), "%s: want %s, got %s", path, want,
                  dump);
        free(dump);
        json_decref(w);
        json_decref(res);
        conch_js_session_free(s);
        free(src);
        files++;
    }
    closedir(d);
    cr_assert_geq(files, 7);
}

/* --- REPL cells --- */

Test(js_session, declarations_persist_and_may_be_declared_again)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    expect_value(s,
                 "const x: number = 1;\nlet y;\nvar z = 3;\nfunction f() { return x + 1; }\n"
                 "class C { v = 7 }\nconst { a, b: [bb] } = { a: 4, b: [5] };",
                 "null");
    expect_value(s, "[x, y ?? 'u', z, f(), new C().v, a, bb]", "[1,\"u\",3,2,7,4,5]");
    expect_value(s, "const x = 10; f()", "11");
    expect_value(s, "let counter = 0; function inc() { return ++counter; }", "null");
    expect_value(s, "inc(); inc(); counter", "2");
    conch_js_session_free(s);
}

Test(js_session, top_level_await_and_last_value)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    expect_value(s, "const v = await Promise.resolve(41);\nv + 1", "42");
    expect_value(s, "await new Promise((r) => setTimeout(() => r('later'), 20))", "\"later\"");
    expect_value(s, "1 + 2;\n// a comment after", "3");
    json_t *res = eval(s, "let q = 1");
    cr_assert_str_eq(json_string_value(json_object_get(res, "type")), "undefined");
    cr_assert_str_eq(json_string_value(json_object_get(res, "text")), "→ undefined");
    json_decref(res);
    conch_js_session_free(s);
}

Test(js_session, syntax_error_has_its_line)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "const a = 1;\nconst b = ;\n");
    cr_assert(json_is_false(json_object_get(res, "ok")));
    cr_assert_str_eq(err_field(res, "name"), "SyntaxError");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(res, "error"), "line")), 2,
                 "%s", json_dumps(res, 0));
    json_decref(res);
    conch_js_session_free(s);
}

Test(js_session, thrown_error_has_the_typescript_line)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "interface P { x: number }\n\nfunction f(p: P): number {\n"
                          "    throw new RangeError(`bad ${p.x}`);\n}\nf({ x: 3 } as P)\n");
    cr_assert(json_is_false(json_object_get(res, "ok")));
    cr_assert_str_eq(err_field(res, "name"), "RangeError");
    cr_assert_str_eq(err_field(res, "message"), "bad 3");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(res, "error"), "line")), 4,
                 "%s", json_dumps(res, 0));
    cr_assert(strstr(err_field(res, "stack"), "cell.ts:4"));
    json_decref(res);
    res = eval(s, "throw 'plain'");
    cr_assert_str_eq(err_field(res, "message"), "plain");
    json_decref(res);
    conch_js_session_free(s);
}

Test(js_session, infinite_loop_times_out_and_the_session_lives_on)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    expect_value(s, "const kept = 5", "null");
    json_t *res = eval_t(s, "while (true) {}", 200);
    cr_assert(json_is_false(json_object_get(res, "ok")));
    cr_assert_str_eq(err_field(res, "name"), "TimeoutError");
    json_decref(res);
    res = eval_t(s, "try { for (;;) {} } catch (e) { 'caught' }", 200);
    cr_assert_str_eq(err_field(res, "name"), "TimeoutError", "a script cannot catch its deadline");
    json_decref(res);
    expect_value(s, "kept + 1", "6");
    conch_js_session_free(s);
}

Test(js_session, never_settling_promise_ends)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval_t(s, "await new Promise(() => {})", 0);
    cr_assert_str_eq(err_field(res, "name"), "TimeoutError");
    cr_assert(strstr(err_field(res, "message"), "nothing can settle"));
    json_decref(res);
    /* A timer that keeps it waiting: the wall deadline ends it. */
    res = eval_t(s, "await new Promise((r) => setTimeout(r, 60000))", 150);
    cr_assert_str_eq(err_field(res, "name"), "TimeoutError");
    cr_assert(strstr(err_field(res, "message"), "deadline"));
    json_decref(res);
    expect_value(s, "'alive'", "\"alive\"");
    conch_js_session_free(s);
}

Test(js_session, memory_bomb_hits_the_heap_limit)
{
    struct conch_js_limits l;
    conch_js_limits_default(&l);
    l.memory_bytes = 32u << 20;
    struct conch_js_session *s = new_session(&l, NULL);
    json_t *res = eval(s, "const hog = []; while (true) hog.push(new Array(100000).fill(1.5));");
    cr_assert(json_is_false(json_object_get(res, "ok")), "%s", json_dumps(res, 0));
    cr_assert(strstr(err_field(res, "message"), "out of memory"), "%s", json_dumps(res, 0));
    json_decref(res);
    expect_value(s, "hog.length = 0; [1, 2].length", "2");
    conch_js_session_free(s);
}

Test(js_session, deep_recursion_hits_the_stack_limit)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "function down(n: number): number { return down(n + 1) + 1; }\ndown(0)");
    cr_assert(json_is_false(json_object_get(res, "ok")));
    cr_assert(strstr(err_field(res, "message"), "stack overflow"), "%s", json_dumps(res, 0));
    json_decref(res);
    expect_value(s, "function fact(n) { return n <= 1 ? 1 : n * fact(n - 1); } fact(10)",
                 "3628800");
    conch_js_session_free(s);
}

Test(js_session, values_render_json_safe)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    expect_value(s, "2n ** 70n", "\"1180591620717411303424n\"");
    expect_value(s, "new Map([['a', 1], [2, undefined]])",
                 "{\"$type\":\"Map\",\"entries\":[[\"a\",1],[2,null]]}");
    expect_value(s, "new Set([1, 'x'])", "{\"$type\":\"Set\",\"values\":[1,\"x\"]}");
    expect_value(s, "const o: any = { a: 1, u: undefined }; o.self = o; o",
                 "{\"a\":1,\"self\":\"[Circular]\"}");
    expect_value(s, "[NaN, -Infinity, undefined, null]", "[\"NaN\",\"-Infinity\",null,null]");
    expect_value(s, "new Date(0)", "\"1970-01-01T00:00:00.000Z\"");
    expect_value(s, "function named() {}; named", "\"[Function: named]\"");
    json_t *res = eval(s, "new TypeError('t')");
    json_t *v = json_object_get(res, "value");
    cr_assert_str_eq(json_string_value(json_object_get(v, "name")), "TypeError");
    cr_assert_str_eq(json_string_value(json_object_get(v, "message")), "t");
    cr_assert_str_eq(json_string_value(json_object_get(res, "type")), "error");
    json_decref(res);
    res = eval(s, "'x'.repeat(200000)");
    cr_assert(strstr(json_string_value(json_object_get(res, "value")), "[cut:"));
    json_decref(res);
    conch_js_session_free(s);
}

Test(js_session, console_is_captured_with_a_cap)
{
    struct conch_js_limits l;
    conch_js_limits_default(&l);
    l.console_bytes = 100;
    struct conch_js_session *s = new_session(&l, NULL);
    json_t *res = eval(s, "console.log('hi', 1, { a: [1n] }); console.warn('w');\n"
                          "for (let i = 0; i < 50; i++) console.log('line ' + i); 7");
    json_t *c = json_object_get(res, "console");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(c, 0), "text")),
                     "hi 1 {\"a\":[\"1n\"]}");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(c, 1), "level")), "warn");
    cr_assert_gt(json_integer_value(json_object_get(res, "console_dropped")), 30);
    const char *text = json_string_value(json_object_get(res, "text"));
    cr_assert(strstr(text, "hi 1") && strstr(text, "[warn] w") && strstr(text, "dropped") &&
                  strstr(text, "→ 7"),
              "%s", text);
    json_decref(res);
    conch_js_session_free(s);
}

/* --- host hooks --- */

struct fake_host {
    char written[8][64];
    int n_written;
    uint64_t ids[200];
    char inputs[200][64];
    int n_calls;
    int waits;
    bool reverse; /* answer every call at the first wait, last call first */
    bool never;   /* never answer */
};

static int fake_read(void *data, const char *path, char **ret_buf, size_t *ret_len,
                     struct conch_err *err)
{
    if (strcmp(path, "there.txt") != 0)
        return conch_err_set(err, ENOENT, "readFile '%s': no such file", path);
    *ret_buf = strdup("content");
    *ret_len = 7;
    return 0;
}

static int fake_write(void *data, const char *path, const char *buf, size_t len,
                      struct conch_err *err)
{
    struct fake_host *h = data;
    snprintf(h->written[h->n_written++], 64, "%s=%.*s", path, (int)len, buf);
    return 0;
}

static int fake_tool_start(void *data, struct conch_js_session *s, uint64_t id, const char *name,
                           const char *input, struct conch_err *err)
{
    struct fake_host *h = data;
    if (strcmp(name, "broken") == 0)
        return conch_err_set(err, EIO, "the tool host is down");
    h->ids[h->n_calls] = id;
    snprintf(h->inputs[h->n_calls], 64, "%s", input);
    h->n_calls++;
    return 0;
}

static int fake_wait(void *data, struct conch_js_session *s, int timeout_ms, struct conch_err *err)
{
    struct fake_host *h = data;
    h->waits++;
    if (h->never) {
        usleep(timeout_ms > 0 ? (useconds_t)timeout_ms * 1000 : 1000);
        return 0;
    }
    for (int i = h->n_calls - 1; i >= 0; i--) {
        if (!h->ids[i])
            continue;
        char answer[128];
        bool ok = strstr(h->inputs[i], "fail") == NULL;
        snprintf(answer, sizeof(answer), ok ? "{\"echo\":%s}" : "\"tool said no\"", h->inputs[i]);
        cr_assert_eq(conch_js_tool_answer(s, h->ids[i], ok, answer, strlen(answer)), 0);
        h->ids[i] = 0;
        if (!h->reverse)
            break;
    }
    return 0;
}

static struct conch_js_session *host_session(struct fake_host *h, unsigned max_calls)
{
    struct conch_js_host host = {.data = h,
                                 .read_file = fake_read,
                                 .write_file = fake_write,
                                 .tool_start = fake_tool_start,
                                 .wait = fake_wait};
    struct conch_js_limits l;
    conch_js_limits_default(&l);
    if (max_calls)
        l.max_tool_calls = max_calls;
    struct conch_js_session *s = new_session(&l, &host);
    const char *names[] = {"echo", "broken"};
    struct conch_err err = {0};
    cr_assert_eq(conch_js_session_set_tools(s, names, 2, NULL, 0, &err), 0, "%s", err.msg);
    return s;
}

Test(js_host, tool_calls_resolve_out_of_order)
{
    struct fake_host h = {.reverse = true};
    struct conch_js_session *s = host_session(&h, 0);
    expect_value(s,
                 "const rs = await Promise.all([1, 2, 3].map((n) => tools.echo({ n })));\n"
                 "rs.map((r) => r.echo.n)",
                 "[1,2,3]");
    cr_assert_eq(h.n_calls, 3);
    cr_assert_eq(h.waits, 1, "all three calls were out before the first wait");
    json_t *res = eval(s, "await tools.echo('fail')");
    cr_assert_str_eq(err_field(res, "message"), "tool said no");
    json_t *trace = json_object_get(res, "tool_calls");
    cr_assert_eq(json_array_size(trace), 1);
    cr_assert(json_is_false(json_object_get(json_array_get(trace, 0), "ok")));
    json_decref(res);
    expect_value(s, "await tools.broken(1).catch((e) => e.message)", "\"the tool host is down\"");
    expect_value(s, "typeof tools.nothere", "\"undefined\"");
    conch_js_session_free(s);
}

Test(js_host, hundred_parallel_calls_and_the_cap)
{
    struct fake_host h = {.reverse = true};
    struct conch_js_session *s = host_session(&h, 100);
    expect_value(s,
                 "(await Promise.all(Array.from({ length: 100 }, (_, i) => tools.echo(i))))"
                 ".reduce((a, r) => a + r.echo, 0)",
                 "4950");
    expect_value(s,
                 "const out = await Promise.allSettled(Array.from({ length: 101 }, (_, i) => "
                 "tools.echo(i)));\nout.filter((o) => o.status === 'rejected').map((o) => "
                 "o.reason.message.includes('tool calls'))",
                 "[true]");
    conch_js_session_free(s);
}

Test(js_host, unanswered_call_times_out)
{
    struct fake_host h = {.never = true};
    struct conch_js_session *s = host_session(&h, 0);
    json_t *res = eval_t(s, "await tools.echo(1)", 200);
    cr_assert_str_eq(err_field(res, "name"), "TimeoutError");
    json_decref(res);
    conch_js_session_free(s);
}

Test(js_host, writes_apply_only_when_the_eval_succeeds)
{
    struct fake_host h = {0};
    struct conch_js_session *s = host_session(&h, 0);
    json_t *res = eval(s, "await writeFile('a.txt', 'one'); throw new Error('no')");
    cr_assert(json_is_false(json_object_get(res, "ok")));
    cr_assert_eq(h.n_written, 0);
    json_decref(res);
    expect_value(s,
                 "await writeFile('b.txt', 'two');\nawait writeFile('c.json', { k: 1 });\n"
                 "[await readFile('b.txt'), await readFile('there.txt')]",
                 "[\"two\",\"content\"]");
    cr_assert_eq(h.n_written, 2);
    cr_assert_str_eq(h.written[0], "b.txt=two");
    cr_assert_str_eq(h.written[1], "c.json={\"k\":1}");
    expect_value(s, "await readFile('missing').catch((e) => e.message)",
                 "\"readFile 'missing': no such file\"");
    conch_js_session_free(s);
}

/* --- the worker --- */

static void send_frame(int fd, const char *json)
{
    uint64_t len = strlen(json);
    cr_assert_eq(write(fd, &len, sizeof(len)), (ssize_t)sizeof(len));
    cr_assert_eq(write(fd, json, len), (ssize_t)len);
}

static json_t *recv_frame(int fd)
{
    uint64_t len;
    cr_assert_eq(read(fd, &len, sizeof(len)), (ssize_t)sizeof(len));
    char *buf = malloc(len);
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, buf + got, len - got);
        cr_assert_gt(n, 0);
        got += (size_t)n;
    }
    json_t *j = json_loadb(buf, len, 0, NULL);
    free(buf);
    cr_assert(j);
    return j;
}

Test(js_worker, serves_evals_tool_calls_and_reset)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(conch_js_worker_serve(sv[1], NULL));
    }
    close(sv[1]);
    int fd = sv[0];
    send_frame(fd, "{\"method\":\"eval\",\"params\":{\"code\":\"const n: number = 20; n + 1\"}}");
    json_t *a = recv_frame(fd);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(a, "result"), "value")), 21);
    json_decref(a);
    send_frame(fd, "{\"method\":\"eval\",\"params\":{\"tools\":[\"add\"],\"code\":"
                   "\"const [x, y] = await Promise.all([tools.add({a: n}), tools.add({a: 2})]); "
                   "x + y\"}}");
    json_t *c1 = recv_frame(fd), *c2 = recv_frame(fd);
    json_t *t1 = json_object_get(c1, "tool_call"), *t2 = json_object_get(c2, "tool_call");
    cr_assert_str_eq(json_string_value(json_object_get(t1, "name")), "add");
    /* Answered second first: {a} + 1 each. */
    char buf[256];
    json_t *pairs[2] = {t2, t1};
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof(buf),
                 "{\"method\":\"tool_result\",\"params\":{\"id\":%lld,\"ok\":true,\"value\":%lld}}",
                 (long long)json_integer_value(json_object_get(pairs[i], "id")),
                 (long long)json_integer_value(
                     json_object_get(json_object_get(pairs[i], "input"), "a")) +
                     1);
        send_frame(fd, buf);
    }
    a = recv_frame(fd);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(a, "result"), "value")), 24,
                 "%s", json_dumps(a, 0));
    json_decref(a);
    json_decref(c1);
    json_decref(c2);
    send_frame(fd, "{\"method\":\"reset\"}");
    json_decref(recv_frame(fd));
    send_frame(fd, "{\"method\":\"eval\",\"params\":{\"code\":\"typeof n\"}}");
    a = recv_frame(fd);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(a, "result"), "value")),
                     "undefined");
    json_decref(a);
    send_frame(fd, "{\"method\":\"nope\"}");
    a = recv_frame(fd);
    cr_assert(strstr(json_string_value(json_object_get(json_object_get(a, "error"), "message")),
                     "unknown method"));
    json_decref(a);
    close(fd);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A script that replaces the builtins the console and the renderer use still gets its
 * console lines and its value shown. */
Test(js_session, replaced_builtins_do_not_change_rendering)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "JSON.stringify = () => 'hacked'; Array.prototype.map = null;\n"
                          "Array.prototype.push = null; Array.prototype.join = null;\n"
                          "console.log('x', { a: [1] }); ({ b: [2, 3] })");
    char *d = json_dumps(res, JSON_COMPACT);
    cr_assert(json_is_true(json_object_get(res, "ok")), "%s", d);
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(res, "console"), 0), "text")),
                     "x {\"a\":[1]}", "%s", d);
    json_t *want = json_loads("{\"b\":[2,3]}", 0, NULL);
    cr_assert(json_equal(json_object_get(res, "value"), want), "%s", d);
    json_decref(want);
    free(d);
    json_decref(res);
    conch_js_session_free(s);
}

/* The text for a model prints numbers as JavaScript does (3.14, not 3.1400000000000001). */
Test(js_session, text_prints_numbers_as_javascript_does)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "({ pi: 3.14, sum: 0.1 + 0.2 })");
    cr_assert_str_eq(json_string_value(json_object_get(res, "text")),
                     "→ {\"pi\":3.14,\"sum\":0.30000000000000004}");
    json_decref(res);
    conch_js_session_free(s);
}

/* A cell of 20,000 top-level declarations: every one becomes a global (the rewrite walks a
 * node's children with a cursor, not by index, which was quadratic in their count). */
Test(js_session, many_top_level_declarations)
{
    struct conch_sb b = {0};
    for (int i = 0; i < 20000; i++)
        conch_sb_printf(&b, "const v%d: number = %d;\n", i, i);
    conch_sb_puts(&b, "v0 + v19999");
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval_t(s, b.buf, 60000);
    cr_assert_eq(json_integer_value(json_object_get(res, "value")), 19999, "%s",
                 json_dumps(res, 0));
    json_decref(res);
    expect_value(s, "v12345", "12345");
    conch_sb_done(&b);
    conch_js_session_free(s);
}

Test(js_session, hash_bang_line_and_console_aliases)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "#!/usr/bin/env node\nconsole.table([1]); console.dir({ a: 1 }); 5");
    cr_assert_eq(json_integer_value(json_object_get(res, "value")), 5, "%s", json_dumps(res, 0));
    cr_assert_eq(json_array_size(json_object_get(res, "console")), 2);
    json_decref(res);
    conch_js_session_free(s);
}

/* Numbers and sizes from a client are bounded: a tool input past 4 MiB is refused inside,
 * a CPU limit whose nanoseconds pass 2^64 is a long one (not a wrapped, past deadline). */
Test(js_host, tool_input_cap_and_huge_timeouts)
{
    struct fake_host h = {.reverse = true};
    struct conch_js_session *s = host_session(&h, 0);
    expect_value(s, "await tools.echo('x'.repeat(5 * 1024 * 1024)).catch((e) => e.message)",
                 "\"tools.echo: the input is 5242882 bytes of JSON, more than 4194304\"");
    cr_assert_eq(h.n_calls, 0, "the oversize call never reached the host");
    /* 2^64 / 1e6 rounded up: as nanoseconds it wraps to almost nothing. */
    struct conch_js_eval_opts o = {.timeout_ms = 1000000000000000000LL, .cpu_ms = 18446744073710LL};
    json_t *res = NULL;
    struct conch_err err = {0};
    const char *code = "let k = 0; for (let i = 0; i < 100000; i++) k += i; k";
    cr_assert_eq(conch_js_eval(s, code, strlen(code), &o, &res, &err), 0);
    cr_assert_eq(json_integer_value(json_object_get(res, "value")), 4999950000LL, "%s",
                 json_dumps(res, 0));
    json_decref(res);
    conch_js_session_free(s);
}

/* A lone UTF-16 surrogate (not UTF-8, not JSON jansson reads) is shown as U+FFFD, once. */
Test(js_session, lone_surrogates_render_as_replacement_characters)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res =
        eval(s, "console.log('x\\udc00'); ({ k: 'a\\ud800b', ['\\udfff']: '\\ud83d\\ude00' })");
    json_t *want = json_loads("{\"k\":\"a\xef\xbf\xbd"
                              "b\",\"\xef\xbf\xbd\":\"\xf0\x9f\x98\x80\"}",
                              0, NULL);
    cr_assert(json_equal(json_object_get(res, "value"), want), "%s", json_dumps(res, 0));
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(res, "console"), 0), "text")),
                     "x\xef\xbf\xbd");
    json_decref(want);
    json_decref(res);
    conch_js_session_free(s);
}

/* An error's message is cut like a value: a script cannot make the result as big as it likes. */
Test(js_session, huge_error_message_is_cut)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "throw new Error('x'.repeat(10 * 1024 * 1024))");
    const char *m = err_field(res, "message");
    cr_assert_lt(strlen(m), 70000);
    cr_assert(strstr(m, "[cut: 10485760 bytes in all]"), "%.100s", m);
    cr_assert_lt(strlen(json_string_value(json_object_get(res, "text"))), 140000);
    json_decref(res);
    conch_js_session_free(s);
}

/* An import in a cell fails before anything runs, saying why (not "expecting '('"); a
 * type-only import is just stripped. */
Test(js_session, import_in_a_cell_is_refused_with_the_reason)
{
    struct conch_js_session *s = new_session(NULL, NULL);
    json_t *res = eval(s, "globalThis.ran = 1;\n\nimport fs from 'fs';\nfs");
    cr_assert_str_eq(err_field(res, "name"), "SyntaxError");
    cr_assert(strstr(err_field(res, "message"), "line 3: a cell cannot import modules"), "%s",
              err_field(res, "message"));
    json_decref(res);
    expect_value(s, "import type { X } from './x';\ntypeof ran", "\"undefined\"");
    conch_js_session_free(s);
}

Test(js_host, tool_names_and_their_camel_case_aliases)
{
    struct fake_host h = {0};
    struct conch_js_session *s = host_session(&h, 0);
    const char *names[] = {"web_search", "file-reader", "_private", "x-"};
    struct conch_err err = {0};
    cr_assert_eq(conch_js_session_set_tools(s, names, 4, NULL, 0, &err), 0, "%s", err.msg);
    expect_value(s, "Object.keys(tools).sort().join()",
                 "\"_private,file-reader,fileReader,webSearch,web_search,x,x-\"");
    const char *bad[] = {"web search"};
    cr_assert_lt(conch_js_session_set_tools(s, bad, 1, NULL, 0, &err), 0);
    cr_assert(strstr(err.msg, "'web search'"), "%s", err.msg);
    conch_js_session_free(s);
}

/* A session's tool set: left-out tools are not in `tools` but calling one by name rejects
 * saying why; spawnAgent calls the task tool, or says there is none. */
Test(js_host, hidden_tools_and_spawn_agent)
{
    struct fake_host h = {.reverse = true};
    struct conch_js_session *s = host_session(&h, 0);
    const char *shown[] = {"echo"}, *hidden[] = {"web_search", "task"};
    struct conch_err err = {0};
    cr_assert_eq(conch_js_session_set_tools(s, shown, 1, hidden, 2, &err), 0, "%s", err.msg);
    expect_value(s, "[Object.keys(tools).join(), 'webSearch' in tools, typeof tools.nothere]",
                 "[\"echo\",false,\"undefined\"]");
    json_t *res = eval(s, "await tools.webSearch({})");
    cr_assert(strstr(err_field(res, "message"), "tools.webSearch: not available in this JS "
                                                "session"),
              "%s", err_field(res, "message"));
    json_decref(res);
    res = eval(s, "await spawnAgent('x')");
    cr_assert(strstr(err_field(res, "message"), "the 'task' tool is not available"), "%s",
              err_field(res, "message"));
    json_decref(res);
    cr_assert_eq(h.n_calls, 0);
    cr_assert_eq(conch_js_session_set_tools(s, shown, 1, NULL, 0, &err), 0, "%s", err.msg);
    res = eval(s, "await spawnAgent('x')");
    cr_assert(strstr(err_field(res, "message"), "no 'task' tool is registered"), "%s",
              err_field(res, "message"));
    json_decref(res);
    const char *with_task[] = {"task"};
    cr_assert_eq(conch_js_session_set_tools(s, with_task, 1, NULL, 0, &err), 0, "%s", err.msg);
    expect_value(s, "(await spawnAgent('fix it', 'coder')).echo",
                 "{\"description\":\"fix it\",\"subagent_type\":\"coder\"}");
    expect_value(s, "(await spawnAgent('look')).echo.subagent_type", "\"general-purpose\"");
    conch_js_session_free(s);
}
