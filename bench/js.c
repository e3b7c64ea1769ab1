/* js.c - the JavaScript engine's costs in-process (src/js, no worker, no sandbox): a new
 * session's first eval, one eval of a small cell, type stripping of a 30-line TypeScript
 * cell, a tool call settled at once, 100 parallel calls. Prints medians and the ratio to
 * the figures issue 17 measured for @langchain/quickjs (QuickJS in WASM inside Node).
 * Usage: bench_js [ROUNDS] (default 2000). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "js/js.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return v[n / 2];
}

static uint64_t pending[256];
static int n_pending;

static int tool_start(void *data, struct conch_js_session *s, uint64_t id, const char *name,
                      const char *input, struct conch_err *err)
{
    if (n_pending < 256)
        pending[n_pending++] = id;
    return 0;
}

static int wait_answer(void *data, struct conch_js_session *s, int timeout_ms,
                       struct conch_err *err)
{
    while (n_pending > 0) {
        uint64_t id = pending[--n_pending];
        conch_js_tool_answer(s, id, true, "{\"ok\":1}", 8);
    }
    return 0;
}

static void must_eval(struct conch_js_session *s, const char *code)
{
    json_t *res = NULL;
    struct conch_err err = {0};
    struct conch_js_eval_opts o = {.timeout_ms = 10000};
    if (conch_js_eval(s, code, strlen(code), &o, &res, &err) < 0 ||
        !json_is_true(json_object_get(res, "ok"))) {
        char *d = res ? json_dumps(res, 0) : NULL;
        fprintf(stderr, "bench_js: eval of '%s' failed: %s\n", code, d ? d : err.msg);
        exit(1);
    }
    json_decref(res);
}

static const char ts_cell[] =
    "interface User { id: number; name: string; tags?: string[] }\n"
    "type ById = Record<number, User>;\n"
    "enum Role { Admin, Member = 5, Guest }\n"
    "abstract class Repo<T extends { id: number }> {\n"
    "    protected items: Map<number, T> = new Map();\n"
    "    constructor(private readonly label: string) {}\n"
    "    abstract validate(item: T): boolean;\n"
    "    add(item: T): this {\n"
    "        if (!this.validate(item)) throw new Error(`bad ${this.label}`);\n"
    "        this.items.set(item.id, item);\n"
    "        return this;\n"
    "    }\n"
    "    get(id: number): T | undefined { return this.items.get(id)!; }\n"
    "}\n"
    "class Users extends Repo<User> {\n"
    "    validate(u: User): boolean { return u.name.length > 0; }\n"
    "}\n"
    "function index<T extends { id: number }>(xs: readonly T[]): Record<number, T> {\n"
    "    const out = {} as Record<number, T>;\n"
    "    for (const x of xs) out[x.id] = x;\n"
    "    return out;\n"
    "}\n"
    "const users = new Users('users');\n"
    "users.add({ id: 1, name: 'a' } satisfies User).add({ id: 2, name: 'b', tags: ['x'] });\n"
    "const byId: ById = index<User>([...users['items'].values()]);\n"
    "const names = Object.values(byId).map((u: User): string => u.name);\n"
    "let total: number = 0;\n"
    "for (const u of Object.values(byId) as User[]) total += u.id;\n"
    "const role: Role = Role.Guest;\n"
    "({ names, total, role })\n";

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 2000;
    if (rounds < 10)
        rounds = 10;
    double *t = calloc((size_t)rounds, sizeof(*t));
    struct conch_err err = {0};
    struct conch_js_host host = {.tool_start = tool_start, .wait = wait_answer};
    const char *tools[] = {"echo"};

    /* A new session (runtime, context, globals) and its first eval. */
    int sessions = rounds / 10;
    for (int i = 0; i < sessions; i++) {
        double t0 = now_us();
        struct conch_js_session *s = NULL;
        if (conch_js_session_new(NULL, &host, &s, &err) < 0) {
            fprintf(stderr, "bench_js: %s\n", err.msg);
            return 1;
        }
        must_eval(s, "1 + 1");
        t[i] = now_us() - t0;
        conch_js_session_free(s);
    }
    double first = median(t, sessions);

    struct conch_js_session *s = NULL;
    conch_js_session_new(NULL, &host, &s, &err);
    conch_js_session_set_tools(s, tools, 1, NULL, 0, &err);
    must_eval(s, "let n = 0");
    for (int i = 0; i < rounds; i++) {
        double t0 = now_us();
        must_eval(s, "n = n + 1");
        t[i] = now_us() - t0;
    }
    double per_eval = median(t, rounds);

    for (int i = 0; i < rounds; i++) {
        char *out = NULL;
        double t0 = now_us();
        conch_js_strip_types(ts_cell, sizeof(ts_cell) - 1, &out, NULL, &err);
        t[i] = now_us() - t0;
        free(out);
    }
    double strip = median(t, rounds);

    for (int i = 0; i < rounds / 4; i++) {
        double t0 = now_us();
        must_eval(s, ts_cell);
        t[i] = now_us() - t0;
    }
    double ts_eval = median(t, rounds / 4);

    int calls = rounds / 4;
    for (int i = 0; i < calls; i++) {
        double t0 = now_us();
        must_eval(s, "await tools.echo({ i: 1 })");
        t[i] = now_us() - t0;
    }
    double one_call = median(t, calls) - per_eval;

    for (int i = 0; i < calls / 10 + 1; i++) {
        double t0 = now_us();
        must_eval(s, "(await Promise.all(Array.from({ length: 100 }, (_, i) => tools.echo(i))))"
                     ".length");
        t[i] = now_us() - t0;
    }
    double hundred = median(t, calls / 10 + 1);
    conch_js_session_free(s);
    free(t);

    /* Issue 17's figures for @langchain/quickjs 0.6.4 in Node (the middle of each range). */
    printf("%-44s %10s %12s %8s\n", "in-process (src/js)", "conch", "ref (issue)", "ratio");
    printf("%-44s %8.3f ms %9.2f ms %7.2fx\n", "new session + first eval", first / 1e3, 4.5,
           first / 4500);
    printf("%-44s %8.3f ms %9.2f ms %7.2fx\n", "one eval (`n = n + 1`)", per_eval / 1e3, 0.175,
           per_eval / 175);
    printf("%-44s %8.3f ms %12s\n", "strip 30 lines of TypeScript", strip / 1e3, "-");
    printf("%-44s %8.3f ms %12s\n", "eval of the same 30-line TypeScript cell", ts_eval / 1e3, "-");
    printf("%-44s %8.3f ms %9.2f ms %7.2fx\n", "one tool call (settled at once), over an eval",
           one_call / 1e3, 3.0, one_call / 3000);
    printf("%-44s %8.3f ms %9.2f ms %7.2fx\n", "eval of 100 parallel tool calls", hundred / 1e3,
           21.0, hundred / 21000);
    return 0;
}
