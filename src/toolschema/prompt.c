/* prompt.c - tools.prompt: renders the registered tools and agent types as a markdown
 * system-prompt section that teaches a model to call them from bash, Python and Node, each
 * tool's input as a TypeScript-like signature generated from its JSON schema. */
#include "toolschema/toolschema.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/strbuf.h"

struct rctx {
    json_t *root;
    const char *stack[CONCH_TOOLSCHEMA_MAX_DEPTH + 1]; /* $refs being expanded */
    int nstack;
    unsigned expansions; /* $refs expanded so far: shared subschemas are shown by name after
                            MAX_EXPANSIONS, so that a DAG of $refs cannot blow up the text */
};

#define MAX_EXPANSIONS 64

static void render(struct rctx *c, struct conch_sb *o, json_t *s, int indent, int depth);

static void pad(struct conch_sb *o, int n)
{
    for (int i = 0; i < n; i++)
        conch_sb_putn(o, " ", 1);
}

static void literal(struct conch_sb *o, json_t *v)
{
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    conch_sb_puts(o, d ? d : "unknown");
    free(d);
}

/* The value a local "#/..." pointer names (a copy of toolschema.c's, kept private there). */
static json_t *lookup(json_t *root, const char *ref)
{
    if (strcmp(ref, "#") == 0)
        return root;
    if (strncmp(ref, "#/", 2) != 0)
        return NULL;
    json_t *cur = root;
    const char *p = ref + 1;
    char tok[256];
    while (*p == '/' && cur) {
        p++;
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof(tok)) {
            char ch = *p++;
            if (ch == '~' && (*p == '0' || *p == '1'))
                ch = *p++ == '1' ? '/' : '~';
            tok[n++] = ch;
        }
        tok[n] = '\0';
        cur = json_is_object(cur) ? json_object_get(cur, tok) : NULL;
    }
    return cur;
}

/* Collapse runs of whitespace (newlines included) into one space, so text fits a // line. */
static void oneline(struct conch_sb *o, const char *s)
{
    bool space = false, any = false;
    for (; *s; s++) {
        if (isspace((unsigned char)*s)) {
            space = any;
            continue;
        }
        if (space)
            conch_sb_putn(o, " ", 1);
        space = false;
        any = true;
        conch_sb_putn(o, s, 1);
    }
}

static bool ident(const char *k)
{
    if (!(isalpha((unsigned char)k[0]) || k[0] == '_' || k[0] == '$'))
        return false;
    for (const char *p = k; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '_' && *p != '$')
            return false;
    return true;
}

static const char *type_of(json_t *s)
{
    json_t *t = json_object_get(s, "type");
    if (json_is_string(t))
        return json_string_value(t);
    if (json_object_get(s, "properties"))
        return "object";
    if (json_object_get(s, "items"))
        return "array";
    return NULL;
}

/* "description (integer, >= 1, default: 10)": what a property's // comment says. */
static void comment(struct conch_sb *o, json_t *s)
{
    if (!json_is_object(s))
        return;
    json_t *d = json_object_get(s, "description");
    size_t start = o->len;
    if (json_is_string(d))
        oneline(o, json_string_value(d));
    struct conch_sb p = {0};
    const char *t = type_of(s);
    if (t && strcmp(t, "integer") == 0)
        conch_sb_puts(&p, ", integer");
    static const struct {
        const char *key, *fmt;
    } cons[] = {
        {"minimum", ", >= "},           {"exclusiveMinimum", ", > "},
        {"maximum", ", <= "},           {"exclusiveMaximum", ", < "},
        {"minLength", ", min length "}, {"maxLength", ", max length "},
        {"minItems", ", min items "},   {"maxItems", ", max items "},
        {"default", ", default: "},
    };
    for (size_t i = 0; i < sizeof(cons) / sizeof(cons[0]); i++) {
        json_t *v = json_object_get(s, cons[i].key);
        if (!v)
            continue;
        conch_sb_puts(&p, cons[i].fmt);
        literal(&p, v);
    }
    if (p.len) {
        if (o->len > start)
            conch_sb_printf(o, " (%s)", p.buf + 2);
        else
            conch_sb_puts(o, p.buf + 2);
    }
    conch_sb_done(&p);
}

static void render_object(struct rctx *c, struct conch_sb *o, json_t *s, int indent, int depth)
{
    json_t *props = json_object_get(s, "properties");
    json_t *ap = json_object_get(s, "additionalProperties");
    json_t *req = json_object_get(s, "required");
    if (!json_is_object(props) || json_object_size(props) == 0) {
        if (json_is_false(ap)) {
            conch_sb_puts(o, "{}");
        } else {
            conch_sb_puts(o, "{ [key: string]: ");
            if (json_is_object(ap))
                render(c, o, ap, indent, depth + 1);
            else
                conch_sb_puts(o, "any");
            conch_sb_puts(o, " }");
        }
        return;
    }
    conch_sb_puts(o, "{\n");
    const char *k;
    json_t *ps;
    json_object_foreach(props, k, ps)
    {
        bool required = false;
        size_t i;
        json_t *e;
        json_array_foreach(req, i, e)
        {
            if (json_is_string(e) && strcmp(json_string_value(e), k) == 0)
                required = true;
        }
        pad(o, indent + 2);
        if (ident(k)) {
            conch_sb_puts(o, k);
        } else {
            json_t *q = json_string(k);
            literal(o, q);
            json_decref(q);
        }
        conch_sb_puts(o, required ? ": " : "?: ");
        struct conch_sb t = {0}, cm = {0};
        render(c, &t, ps, indent + 2, depth + 1);
        json_t *target = ps;
        json_t *ref = json_is_object(ps) ? json_object_get(ps, "$ref") : NULL;
        comment(&cm, target);
        if (cm.len == 0 && json_is_string(ref))
            comment(&cm, lookup(c->root, json_string_value(ref)));
        const char *nl = t.buf ? strchr(t.buf, '\n') : NULL;
        if (cm.len && nl) {
            conch_sb_putn(o, t.buf, (size_t)(nl - t.buf));
            conch_sb_printf(o, " // %s", cm.buf);
            conch_sb_puts(o, nl);
            conch_sb_puts(o, ";\n");
        } else {
            conch_sb_puts(o, t.buf ? t.buf : "any");
            conch_sb_puts(o, ";");
            if (cm.len)
                conch_sb_printf(o, " // %s", cm.buf);
            conch_sb_puts(o, "\n");
        }
        conch_sb_done(&t);
        conch_sb_done(&cm);
    }
    if (json_is_object(ap)) {
        pad(o, indent + 2);
        conch_sb_puts(o, "[key: string]: ");
        render(c, o, ap, indent + 2, depth + 1);
        conch_sb_puts(o, ";\n");
    }
    pad(o, indent);
    conch_sb_puts(o, "}");
}

static void render_union(struct rctx *c, struct conch_sb *o, json_t *list, const char *sep,
                         int indent, int depth)
{
    size_t i;
    json_t *e;
    json_array_foreach(list, i, e)
    {
        if (i)
            conch_sb_puts(o, sep);
        render(c, o, e, indent, depth + 1);
    }
}

static void render_type(struct rctx *c, struct conch_sb *o, json_t *s, const char *t, int indent,
                        int depth)
{
    if (strcmp(t, "integer") == 0 || strcmp(t, "number") == 0) {
        conch_sb_puts(o, "number");
    } else if (strcmp(t, "object") == 0) {
        render_object(c, o, s, indent, depth);
    } else if (strcmp(t, "array") == 0) {
        json_t *items = json_object_get(s, "items");
        struct conch_sb e = {0};
        if (items)
            render(c, &e, items, indent, depth + 1);
        else
            conch_sb_puts(&e, "any");
        if (e.buf && strchr(e.buf, '\n'))
            conch_sb_printf(o, "Array<%s>", e.buf);
        else if (e.buf && (strchr(e.buf, '|') || strchr(e.buf, '&')))
            conch_sb_printf(o, "(%s)[]", e.buf);
        else
            conch_sb_printf(o, "%s[]", e.buf ? e.buf : "any");
        conch_sb_done(&e);
    } else {
        conch_sb_puts(o, t); /* string, boolean, null */
    }
}

static void render(struct rctx *c, struct conch_sb *o, json_t *s, int indent, int depth)
{
    if (depth > CONCH_TOOLSCHEMA_MAX_DEPTH || json_is_true(s) || !json_is_object(s)) {
        conch_sb_puts(o, json_is_false(s) ? "never" : "any");
        return;
    }
    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        const char *r = json_string_value(ref);
        json_t *target = lookup(c->root, r);
        bool looping = false;
        for (int i = 0; i < c->nstack; i++)
            if (strcmp(c->stack[i], r) == 0)
                looping = true;
        if (!target || looping || c->nstack >= CONCH_TOOLSCHEMA_MAX_DEPTH ||
            c->expansions >= MAX_EXPANSIONS) {
            const char *slash = strrchr(r, '/');
            conch_sb_puts(o, slash && slash[1] ? slash + 1 : "any");
            return;
        }
        c->expansions++;
        c->stack[c->nstack++] = r;
        render(c, o, target, indent, depth + 1);
        c->nstack--;
        return;
    }
    json_t *v;
    if ((v = json_object_get(s, "const"))) {
        literal(o, v);
        return;
    }
    v = json_object_get(s, "enum");
    if (json_is_array(v) && json_array_size(v)) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            if (i)
                conch_sb_puts(o, " | ");
            literal(o, e);
        }
        return;
    }
    if (json_is_array(v = json_object_get(s, "anyOf")) && json_array_size(v)) {
        render_union(c, o, v, " | ", indent, depth);
        return;
    }
    if (json_is_array(v = json_object_get(s, "oneOf")) && json_array_size(v)) {
        render_union(c, o, v, " | ", indent, depth);
        return;
    }
    if (json_is_array(v = json_object_get(s, "allOf")) && json_array_size(v)) {
        render_union(c, o, v, " & ", indent, depth);
        return;
    }
    json_t *t = json_object_get(s, "type");
    if (json_is_array(t) && json_array_size(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e)
        {
            if (i)
                conch_sb_puts(o, " | ");
            render_type(c, o, s, json_is_string(e) ? json_string_value(e) : "any", indent, depth);
        }
        return;
    }
    const char *ts = type_of(s);
    render_type(c, o, s, ts ? ts : "any", indent, depth);
}

static bool has_required(json_t *schema)
{
    json_t *req = json_object_get(schema, "required");
    return json_is_array(req) && json_array_size(req) > 0;
}

char *conch_toolschema_signature(const char *name, json_t *input_schema, json_t *output_schema)
{
    struct conch_sb o = {0};
    struct rctx c = {.root = input_schema};
    bool optional = !has_required(input_schema);
    conch_sb_printf(&o, "%s(input%s: ", name, optional ? "?" : "");
    static const char *const shaped[] = {"type",  "properties", "$ref",  "enum",
                                         "const", "anyOf",      "oneOf", "allOf"};
    bool bare = json_is_object(input_schema);
    for (size_t i = 0; bare && i < sizeof(shaped) / sizeof(shaped[0]); i++)
        if (json_object_get(input_schema, shaped[i]))
            bare = false;
    if (bare) /* {} as a tool's input: an object of anything */
        render_object(&c, &o, input_schema, 0, 1);
    else if (json_is_object(input_schema))
        render(&c, &o, input_schema, 0, 1);
    else
        conch_sb_puts(&o, "{}");
    conch_sb_puts(&o, ")");
    if (json_is_object(output_schema)) {
        struct rctx oc = {.root = output_schema};
        conch_sb_puts(&o, ": ");
        render(&oc, &o, output_schema, 0, 1);
    }
    return conch_sb_take(&o);
}

static const char *str(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

/* camelCase of a snake/kebab name, for the Node proxy: web_search -> webSearch. */
static void camel(struct conch_sb *o, const char *name)
{
    bool up = false;
    for (const char *p = name; *p; p++) {
        if ((*p == '_' || *p == '-') && p != name) {
            up = true;
            continue;
        }
        char ch = up ? (char)toupper((unsigned char)*p) : *p;
        conch_sb_putn(o, &ch, 1);
        up = false;
    }
}

static void tools_section(struct conch_sb *o, json_t *tools)
{
    conch_sb_puts(o, "### Tools\n\n");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        const char *name = str(t, "name");
        conch_sb_printf(o, "#### `%s`\n\n", name);
        const char *d = str(t, "description");
        if (*d) {
            conch_sb_puts(o, d);
            conch_sb_puts(o, d[strlen(d) - 1] == '\n' ? "\n" : "\n\n");
        }
        char *sig = conch_toolschema_signature(name, json_object_get(t, "input_schema"),
                                               json_object_get(t, "output_schema"));
        conch_sb_printf(o, "```ts\n%s\n```\n\n", sig ? sig : name);
        free(sig);
    }
}

static void bash_section(struct conch_sb *o, const char *ex, const char *key, bool agents)
{
    conch_sb_puts(o, "### From bash\n\n```bash\n");
    conch_sb_printf(o,
                    "tool_call %1$s '{\"%2$s\": \"...\"}'   # the result on stdout\n"
                    "echo \"$input_json\" | tool_call %1$s -   # the input from stdin\n"
                    "tool_call --list                       # the tools\n"
                    "tool_call --help %1$s              # a tool's description and schema\n",
                    ex, key);
    conch_sb_puts(o, "```\n\n");
    conch_sb_puts(
        o, "A result that is a JSON string is printed as raw text; any other result as one line "
           "of JSON. Exit codes: 0 = ok; 1 = the tool failed, timed out or is unavailable "
           "(message on stderr); 2 = unknown tool or input that does not match the schema (the "
           "message names the field; fix the input, do not retry as is).\n\n"
           "Calls run in parallel: start them with `&` and `wait`:\n\n```bash\n");
    conch_sb_printf(o,
                    "for q in alpha beta gamma; do\n"
                    "  tool_call %1$s \"{\\\"%2$s\\\": \\\"$q\\\"}\" > \"out_$q.json\" &\n"
                    "done\n"
                    "wait\n",
                    ex, key);
    if (agents)
        conch_sb_puts(o, "spawn_agent \"Summarise report.txt\" > summary.txt   # a sub-agent's "
                         "final answer on stdout\n");
    conch_sb_puts(o, "```\n\n");
}

static void python_section(struct conch_sb *o, const char *ex, const char *key, bool agents)
{
    conch_sb_puts(o, "### From Python\n\n```python\nimport conch_tools\n\n");
    conch_sb_printf(o,
                    "r = conch_tools.call(\"%1$s\", {\"%2$s\": \"...\"})  # the result, decoded\n"
                    "r = conch_tools.tools.%1$s(%2$s=\"...\")           # the same\n"
                    "try:\n"
                    "    conch_tools.call(\"%1$s\", {})\n"
                    "except conch_tools.ToolError as e:  # also UnknownTool, InvalidInput\n"
                    "    print(e.kind, e.message)\n\n"
                    "# in parallel, with threads:\n"
                    "from concurrent.futures import ThreadPoolExecutor\n"
                    "with ThreadPoolExecutor(16) as pool:\n"
                    "    results = list(pool.map(lambda q: conch_tools.call(\"%1$s\", "
                    "{\"%2$s\": q}), queries))\n\n"
                    "# or with asyncio:\n"
                    "import asyncio\n"
                    "async def main():\n"
                    "    return await asyncio.gather(*(conch_tools.acall(\"%1$s\", "
                    "{\"%2$s\": q}) for q in queries))\n"
                    "results = asyncio.run(main())\n",
                    ex, key);
    if (agents)
        conch_sb_puts(o, "answer = conch_tools.spawn_agent(\"Summarise report.txt\")  # "
                         "await conch_tools.aspawn_agent(...) in asyncio\n");
    conch_sb_puts(o, "```\n\n");
}

static void node_section(struct conch_sb *o, const char *ex, const char *key, bool agents)
{
    struct conch_sb cm = {0};
    camel(&cm, ex);
    conch_sb_puts(o, "### From Node\n\n```js\n");
    conch_sb_printf(o,
                    "const { tools, call, spawnAgent } = require('conch-tools');  // or: "
                    "import { tools, call, spawnAgent } from 'conch-tools'\n\n"
                    "const r = await tools.%3$s({ %2$s: '...' });  // = call('%1$s', { %2$s: "
                    "'...' })\n"
                    "// in parallel:\n"
                    "const results = await Promise.all(queries.map((q) => tools.%3$s({ %2$s: q "
                    "})));\n"
                    "// errors reject with a ToolError: err.kind ('tool_error', 'unknown_tool', "
                    "'invalid_input', 'timeout', ...), err.message\n",
                    ex, key, cm.buf ? cm.buf : ex);
    if (agents)
        conch_sb_puts(o, "const answer = await spawnAgent('Summarise report.txt');\n");
    conch_sb_puts(o, "```\n\n");
    conch_sb_done(&cm);
}

/* @text with every line after the first indented by two spaces. */
static void indented(struct conch_sb *o, const char *text)
{
    for (const char *p = text; *p; p++) {
        conch_sb_putn(o, p, 1);
        if (*p == '\n' && p[1])
            conch_sb_puts(o, "  ");
    }
}

/* js.eval's `tools` global as TypeScript declarations, and how to call it. */
static void js_section(struct conch_sb *o, json_t *tools, const char *ex, const char *key)
{
    conch_sb_puts(o, "### From js_eval (JavaScript/TypeScript in this sandbox's JS session)\n\n"
                     "The global `tools` holds each tool as an async function, by its name "
                     "and in camelCase:\n\n```ts\ndeclare const tools: {\n");
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t)
    {
        struct conch_sb name = {0};
        camel(&name, str(t, "name"));
        const char *d = str(t, "description");
        if (*d) {
            conch_sb_puts(o, "  /** ");
            oneline(o, d);
            conch_sb_puts(o, " */\n");
        }
        json_t *in = json_object_get(t, "input_schema"), *out = json_object_get(t, "output_schema");
        char *bare = conch_toolschema_signature(name.buf ? name.buf : "", in, NULL);
        char *typed = json_is_object(out) ? conch_toolschema_signature("", in, out) : NULL;
        char *none = typed ? conch_toolschema_signature("", in, NULL) : NULL;
        const char *result =
            typed && none && strlen(typed) > strlen(none) + 2 ? typed + strlen(none) + 2 : NULL;
        conch_sb_puts(o, "  ");
        indented(o, bare ? bare : "");
        conch_sb_puts(o, ": Promise<");
        if (result)
            indented(o, result);
        else
            conch_sb_puts(o, "unknown");
        conch_sb_puts(o, ">;\n");
        free(bare);
        free(typed);
        free(none);
        conch_sb_done(&name);
    }
    struct conch_sb cm = {0};
    camel(&cm, ex);
    conch_sb_printf(o,
                    "};\n```\n\n```ts\n"
                    "const r = await tools.%1$s({ %2$s: '...' });\n"
                    "// in parallel:\n"
                    "const results = await Promise.all(queries.map((q) => tools.%1$s({ %2$s: q "
                    "})));\n"
                    "// a failed call throws an Error whose message says why (the tool's own "
                    "message, or what is wrong with the input)\n"
                    "```\n\n",
                    cm.buf ? cm.buf : ex, key);
    conch_sb_done(&cm);
    json_array_foreach(tools, i, t) if (!strcmp(str(t, "name"), "task"))
    {
        conch_sb_puts(o, "Sub-agents: `await spawnAgent('TASK', 'TYPE')` (the type defaults to "
                         "'general-purpose') is `tools.task({ description: 'TASK', "
                         "subagent_type: 'TYPE' })` and resolves to the sub-agent's answer; "
                         "`Promise.all` runs several at once.\n\n");
        break;
    }
}

static void agents_section(struct conch_sb *o, json_t *agents, unsigned langs)
{
    conch_sb_puts(o, "### Sub-agents\n\nYou can hand a task to a sub-agent; it works on its "
                     "own and its final answer comes back to you. Agent types:\n\n");
    size_t i;
    json_t *a;
    const char *first = NULL;
    json_array_foreach(agents, i, a)
    {
        const char *name = str(a, "name");
        if (!first)
            first = name;
        const char *d = str(a, "description");
        conch_sb_printf(o, "- `%s`", name);
        if (*d) {
            conch_sb_puts(o, ": ");
            oneline(o, d);
        }
        conch_sb_puts(o, "\n");
    }
    if (!first || !*first)
        first = "analyst";
    conch_sb_puts(o, "\nSpawn many at once; they run in parallel:\n\n");
    if (langs & CONCH_TOOLSCHEMA_LANG_BASH)
        conch_sb_printf(
            o,
            "```bash\n"
            "spawn_agent \"TASK\" %s                  # prints the answer, exit 0\n"
            "for f in data/*.csv; do\n"
            "  spawn_agent \"Analyse $f and report anomalies\" %s > \"$f.report\" &\n"
            "done\n"
            "wait\n"
            "spawn_agent --detach \"TASK\" %s         # prints a request id and returns at once; "
            "the answer goes to the harness with this command's result\n"
            "```\n\n",
            first, first, first);
    if (langs & CONCH_TOOLSCHEMA_LANG_PYTHON)
        conch_sb_printf(o,
                        "```python\n"
                        "answer = conch_tools.spawn_agent(\"TASK\", type=\"%s\")\n"
                        "answers = await asyncio.gather(*(conch_tools.aspawn_agent(t, "
                        "type=\"%s\") for t in tasks))\n"
                        "request_id = conch_tools.spawn_agent(\"TASK\", type=\"%s\", "
                        "detach=True)\n"
                        "```\n\n",
                        first, first, first);
    if (langs & CONCH_TOOLSCHEMA_LANG_NODE)
        conch_sb_printf(o,
                        "```js\n"
                        "const answers = await Promise.all(tasks.map((t) => spawnAgent(t, "
                        "'%s')));\n"
                        "const requestId = await spawnAgent('TASK', '%s', { detach: true });\n"
                        "```\n\n",
                        first, first);
}

char *conch_toolschema_prompt(json_t *tools, json_t *agents, unsigned languages)
{
    unsigned langs = languages & (CONCH_TOOLSCHEMA_LANG_ALL | CONCH_TOOLSCHEMA_LANG_JS);
    if (!langs)
        langs = CONCH_TOOLSCHEMA_LANG_ALL;
    bool js_only = langs == CONCH_TOOLSCHEMA_LANG_JS;
    bool have_tools = json_is_array(tools) && json_array_size(tools) > 0;
    bool have_agents = json_is_array(agents) && json_array_size(agents) > 0;
    struct conch_sb o = {0};
    conch_sb_puts(&o, js_only ? "## Tools you can call from js_eval\n\n"
                              : "## Tools you can call from your commands\n\n");
    if (js_only && !have_tools) {
        conch_sb_puts(&o, "No tools are registered in this sandbox: `tools` is empty.\n");
        return conch_sb_take(&o);
    }
    if (js_only) {
        conch_sb_puts(&o, "The tools below run outside this sandbox. Call them from the code "
                          "you run with js_eval: in loops, in parallel (Promise.all), with "
                          "try/catch; transform their results in code rather than reading them "
                          "all. Inputs are JSON objects that must match the tool's signature; "
                          "results are JSON.\n\n");
    } else if (!have_tools && !have_agents) {
        conch_sb_puts(&o, "No tools or sub-agents are registered in this sandbox.\n");
        return conch_sb_take(&o);
    }
    if (!js_only)
        conch_sb_puts(
            &o,
            "The tools below run outside this sandbox. Call them from the programs you run here "
            "(bash, Python, Node): in loops, in parallel, with error handling. Each call is a "
            "fast local round trip, so prefer one script that makes many calls over many "
            "separate commands. Inputs are JSON objects that must match the tool's signature; "
            "results are JSON.\n\n");
    const char *ex = have_tools ? str(json_array_get(tools, 0), "name") : "TOOL";
    /* The examples fill in the first tool's first required (else first) property. */
    json_t *s0 = have_tools ? json_object_get(json_array_get(tools, 0), "input_schema") : NULL;
    const char *key = json_string_value(json_array_get(json_object_get(s0, "required"), 0));
    if (!key) {
        void *it = json_object_iter(json_object_get(s0, "properties"));
        key = it ? json_object_iter_key(it) : NULL;
    }
    if (!key || !ident(key))
        key = "query";
    if (js_only) {
        js_section(&o, tools, ex, key);
        return conch_sb_take(&o);
    }
    if (have_tools)
        tools_section(&o, tools);
    if (langs & CONCH_TOOLSCHEMA_LANG_BASH)
        bash_section(&o, ex, key, have_agents);
    if (langs & CONCH_TOOLSCHEMA_LANG_PYTHON)
        python_section(&o, ex, key, have_agents);
    if (langs & CONCH_TOOLSCHEMA_LANG_NODE)
        node_section(&o, ex, key, have_agents);
    if ((langs & CONCH_TOOLSCHEMA_LANG_JS) && have_tools)
        js_section(&o, tools, ex, key);
    if (have_agents)
        agents_section(&o, agents, langs);
    return conch_sb_take(&o);
}
