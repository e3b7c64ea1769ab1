/* test_toolschema.c - unit tests for src/toolschema: which input_schemas registration accepts
 * (and the message for each it refuses), validation of call inputs against the supported
 * subset with the exact messages a caller sees, bounded nesting, and tools.prompt rendering
 * (signatures for nested, enum, optional and array fields; the language sections); and where
 * the daemon finds the in-sandbox client tree (src/ptc/ptcdir.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ptc/ptc.h"
#include "toolschema/toolschema.h"

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    cr_assert_not_null(j, "bad test JSON %s: %s", text, e.text);
    return j;
}

/* ---- check ---------------------------------------------------------------------------- */

static void check_ok(const char *schema)
{
    json_t *s = J(schema);
    struct conch_err err = {0};
    int r = conch_toolschema_check(s, &err);
    cr_expect_eq(r, 0, "schema %s refused: %s", schema, err.msg);
    json_decref(s);
}

static void check_bad(const char *schema, const char *msg)
{
    json_t *s = J(schema);
    struct conch_err err = {0};
    int r = conch_toolschema_check(s, &err);
    cr_expect_eq(r, -EINVAL, "schema %s accepted", schema);
    cr_expect_str_eq(err.msg, msg, "schema %s", schema);
    cr_expect_eq(err.kind, CONCH_ERR_USAGE);
    json_decref(s);
}

Test(check, accepts_the_supported_subset)
{
    check_ok("{}");
    check_ok("{\"type\":\"object\"}");
    check_ok("{\"type\":[\"string\",\"null\"]}");
    check_ok(
        "{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"minLength\":1,"
        "\"maxLength\":10,\"description\":\"x\"},\"n\":{\"type\":\"integer\",\"minimum\":0,"
        "\"maximum\":5.5,\"default\":1}},\"required\":[\"q\"],\"additionalProperties\":false}");
    check_ok("{\"properties\":{\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",1,null]},"
             "\"minItems\":0,\"maxItems\":3}},\"additionalProperties\":{\"type\":\"number\"}}");
    check_ok("{\"anyOf\":[{\"type\":\"string\"},true],\"oneOf\":[{\"const\":1},{\"const\":2}]}");
    check_ok("{\"properties\":{\"a\":{\"$ref\":\"#/$defs/A\"}},\"$defs\":{\"A\":{\"type\":"
             "\"string\"}}}");
    check_ok("{\"type\":\"object\",\"format\":\"whatever\",\"pattern\":\"^x\",\"x-vendor\":{}}");
}

Test(check, refuses_malformed_keywords_naming_them)
{
    check_bad("[]", "input_schema: a schema must be a JSON object");
    check_bad("true", "input_schema: a schema must be a JSON object");
    check_bad("{\"type\":\"int\"}",
              "input_schema.type: unknown type \"int\" (one of string, number, integer, boolean, "
              "object, array, null)");
    check_bad("{\"type\":[]}",
              "input_schema.type: must be a type name or a non-empty list of them");
    check_bad("{\"type\":[\"string\",\"str\"]}", "input_schema.type: unknown type \"str\"");
    check_bad("{\"type\":3}", "input_schema.type: must be a type name or a non-empty list of them");
    check_bad("{\"properties\":[]}",
              "input_schema.properties: must be an object mapping names to schemas");
    check_bad("{\"properties\":{\"count\":{\"type\":\"int\"}}}",
              "input_schema.properties.count.type: unknown type \"int\" (one of string, number, "
              "integer, boolean, object, array, null)");
    check_bad("{\"properties\":{\"a b\":3}}",
              "input_schema.properties[\"a b\"]: a schema must be a JSON object or a boolean");
    check_bad("{\"required\":\"q\"}", "input_schema.required: must be an array of property names");
    check_bad("{\"required\":[1]}",
              "input_schema.required: must be an array of property names (strings)");
    check_bad("{\"additionalProperties\":\"no\"}",
              "input_schema.additionalProperties: a schema must be a JSON object or a boolean");
    check_bad("{\"enum\":[]}", "input_schema.enum: must be a non-empty array of values");
    check_bad("{\"items\":[{}]}",
              "input_schema.items: must be a single schema (the tuple form is not supported)");
    check_bad("{\"items\":{\"items\":{\"type\":\"nope\"}}}",
              "input_schema.items.items.type: unknown type \"nope\" (one of string, number, "
              "integer, boolean, object, array, null)");
    check_bad("{\"minLength\":-1}", "input_schema.minLength: must be a non-negative integer");
    check_bad("{\"maxItems\":1.5}", "input_schema.maxItems: must be a non-negative integer");
    check_bad("{\"minimum\":\"0\"}", "input_schema.minimum: must be a number");
    check_bad("{\"minimum\":5,\"maximum\":1}", "input_schema.minimum: is greater than maximum");
    check_bad("{\"minItems\":5,\"maxItems\":1}", "input_schema.minItems: is greater than maxItems");
    check_bad("{\"description\":1}", "input_schema.description: must be a string");
    check_bad("{\"anyOf\":[]}", "input_schema.anyOf: must be a non-empty array of schemas");
    check_bad("{\"oneOf\":[{},{\"type\":\"x\"}]}",
              "input_schema.oneOf[1].type: unknown type \"x\" (one of string, number, integer, "
              "boolean, object, array, null)");
    check_bad("{\"$ref\":\"http://example.com/s.json\"}",
              "input_schema.$ref: \"http://example.com/s.json\": only references inside the schema "
              "(\"#/...\") are supported");
    check_bad("{\"$ref\":\"#/$defs/Missing\"}",
              "input_schema.$ref: \"#/$defs/Missing\" does not point to a schema in this schema");
}

/* {"items": {"items": ... {}}} nested @n levels. */
static char *nested_items(int n)
{
    size_t cap = (size_t)n * 12 + 8;
    char *s = malloc(cap), *p = s;
    for (int i = 0; i < n; i++)
        p += sprintf(p, "{\"items\":");
    p += sprintf(p, "{}");
    for (int i = 0; i < n; i++)
        *p++ = '}';
    *p = '\0';
    return s;
}

Test(check, nesting_is_bounded)
{
    char *ok = nested_items(CONCH_TOOLSCHEMA_MAX_DEPTH - 1); /* 32 schemas */
    check_ok(ok);
    free(ok);
    char *deep = nested_items(CONCH_TOOLSCHEMA_MAX_DEPTH);
    json_t *s = J(deep);
    struct conch_err err = {0};
    cr_assert_eq(conch_toolschema_check(s, &err), -EINVAL);
    cr_expect(strstr(err.msg, "schema nested deeper than 32 levels"), "%s", err.msg);
    cr_expect(strncmp(err.msg, "input_schema.items.items.", 25) == 0, "%s", err.msg);
    json_decref(s);
    free(deep);
    /* Very deep (jansson parses up to 2048 levels): refused, no stack trouble. */
    char *huge = nested_items(1000);
    s = J(huge);
    cr_expect_eq(conch_toolschema_check(s, &err), -EINVAL);
    json_decref(s);
    free(huge);
}

/* ---- validate ------------------------------------------------------------------------- */

static void valid(const char *schema, const char *value)
{
    json_t *s = J(schema), *v = J(value);
    char *msg = NULL;
    int r = conch_toolschema_validate(s, v, &msg);
    cr_expect_eq(r, 0, "%s against %s: %s", value, schema, msg ? msg : "");
    free(msg);
    json_decref(s);
    json_decref(v);
}

static void invalid(const char *schema, const char *value, const char *want)
{
    json_t *s = J(schema), *v = J(value);
    char *msg = NULL;
    int r = conch_toolschema_validate(s, v, &msg);
    cr_expect_eq(r, -1, "%s against %s: accepted", value, schema);
    cr_expect_str_eq(msg ? msg : "(null)", want, "%s against %s", value, schema);
    free(msg);
    json_decref(s);
    json_decref(v);
}

#define SEARCH                                                                                     \
    "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"minLength\":1},"        \
    "\"max_results\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":50},"                         \
    "\"mode\":{\"enum\":[\"fast\",\"slow\"]}},\"required\":[\"query\"],"                           \
    "\"additionalProperties\":false}"

Test(validate, objects_required_and_additional)
{
    valid(SEARCH, "{\"query\":\"x\"}");
    valid(SEARCH, "{\"query\":\"x\",\"max_results\":50,\"mode\":\"slow\"}");
    invalid(SEARCH, "{}", "input: missing required property \"query\"");
    invalid(SEARCH, "{\"query\":\"x\",\"foo\":1}", "input: unexpected property \"foo\"");
    invalid(SEARCH, "[]", "input: expected object, got array");
    invalid(SEARCH, "{\"query\":3}", "input.query: expected string, got integer");
    invalid(SEARCH, "{\"query\":\"\"}", "input.query: expected at least 1 character, got 0");
    invalid(SEARCH, "{\"query\":\"x\",\"mode\":\"medium\"}",
            "input.mode: must be one of \"fast\", \"slow\"");
    invalid(SEARCH, "{\"query\":\"x\",\"max_results\":0}",
            "input.max_results: must be >= 1, got 0");
    invalid(SEARCH, "{\"query\":\"x\",\"max_results\":51}",
            "input.max_results: must be <= 50, got 51");
    invalid(SEARCH, "{\"query\":\"x\",\"max_results\":2.5}",
            "input.max_results: expected integer, got number");
    invalid(SEARCH, "{\"query\":\"x\",\"max_results\":\"3\"}",
            "input.max_results: expected integer, got string");
    /* additionalProperties as a schema; absent = anything goes */
    valid("{\"additionalProperties\":{\"type\":\"number\"}}", "{\"a\":1,\"b\":2.5}");
    invalid("{\"additionalProperties\":{\"type\":\"number\"}}", "{\"a\":1,\"b\":\"x\"}",
            "input.b: expected number, got string");
    valid("{\"properties\":{\"a\":{}}}", "{\"zzz\":[1,2]}");
    invalid("{\"properties\":{\"odd key\":{\"type\":\"string\"}}}", "{\"odd key\":null}",
            "input[\"odd key\"]: expected string, got null");
}

Test(validate, types_numbers_and_lists)
{
    valid("{\"type\":\"integer\"}", "3");
    valid("{\"type\":\"integer\"}", "3.0");
    valid("{\"type\":\"number\"}", "3");
    valid("{\"type\":\"number\"}", "-0.5");
    valid("{\"type\":\"boolean\"}", "false");
    valid("{\"type\":\"null\"}", "null");
    valid("{\"type\":[\"string\",\"null\"]}", "null");
    invalid("{\"type\":[\"string\",\"null\"]}", "1", "input: expected string or null, got integer");
    invalid("{\"type\":[\"string\",\"integer\",\"null\"]}", "true",
            "input: expected string, integer or null, got boolean");
    invalid("{\"type\":\"boolean\"}", "0", "input: expected boolean, got integer");
    invalid("{\"type\":\"null\"}", "{}", "input: expected null, got object");
    valid("{\"minimum\":1.5}", "2");
    invalid("{\"minimum\":1.5}", "1", "input: must be >= 1.5, got 1");
    invalid("{\"exclusiveMaximum\":10}", "10", "input: must be < 10, got 10");
    valid("{\"exclusiveMinimum\":0}", "0.001");
    valid("{\"minimum\":1}", "\"a string is not bounded by minimum\"");
}

Test(validate, arrays_items_and_paths)
{
    const char *recs = "{\"type\":\"object\",\"properties\":{\"records\":{\"type\":\"array\","
                       "\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":"
                       "\"integer\"}},\"required\":[\"id\"]},\"maxItems\":5}}}";
    valid(recs, "{\"records\":[{\"id\":1},{\"id\":2}]}");
    invalid(recs, "{\"records\":[{\"id\":1},{\"id\":2},{\"id\":3},{\"id\":\"4\"}]}",
            "input.records[3].id: expected integer, got string");
    invalid(recs, "{\"records\":[{\"id\":1},{}]}",
            "input.records[1]: missing required property \"id\"");
    invalid(recs,
            "{\"records\":[{\"id\":1},{\"id\":1},{\"id\":1},{\"id\":1},{\"id\":1},{\"id\":1}]}",
            "input.records: expected at most 5 items, got 6");
    invalid("{\"minItems\":2}", "[1]", "input: expected at least 2 items, got 1");
    valid("{\"minItems\":2}", "\"not an array\"");
    invalid("{\"items\":{\"items\":{\"type\":\"string\"}}}", "[[\"a\"],[\"b\",7]]",
            "input[1][1]: expected string, got integer");
}

Test(validate, strings_count_code_points)
{
    /* "héllo" is 5 code points, 6 bytes; "日本" 2 code points, 6 bytes; an emoji is 1. */
    valid("{\"maxLength\":5}", "\"h\\u00e9llo\"");
    valid("{\"maxLength\":2,\"minLength\":2}", "\"\\u65e5\\u672c\"");
    valid("{\"maxLength\":1}", "\"\\ud83d\\ude00\"");
    invalid("{\"maxLength\":4}", "\"h\\u00e9llo\"", "input: expected at most 4 characters, got 5");
    invalid("{\"minLength\":3}", "\"\\u65e5\\u672c\"",
            "input: expected at least 3 characters, got 2");
}

Test(validate, enum_and_const)
{
    valid("{\"enum\":[1,\"a\",null,[1,2],{\"k\":true}]}", "{\"k\":true}");
    valid("{\"enum\":[1,2]}", "2.0");
    valid("{\"const\":{\"a\":[1,{\"b\":2}]}}", "{\"a\":[1,{\"b\":2.0}]}");
    invalid("{\"const\":\"x\"}", "\"y\"", "input: must be \"x\"");
    invalid("{\"enum\":[1,\"a\",null]}", "2", "input: must be one of 1, \"a\", null");
    invalid("{\"enum\":[[1,2]]}", "[2,1]", "input: must be one of [1,2]");
}

Test(validate, any_of_and_one_of)
{
    const char *either = "{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}";
    valid(either, "\"x\"");
    valid(either, "4");
    invalid(either, "true", "input: expected string or integer, got boolean");
    /* Exactly one alternative fits by type: its own message is the useful one. */
    const char *tagged = "{\"properties\":{\"op\":{\"anyOf\":[{\"type\":\"string\"},{\"type\":"
                         "\"object\",\"properties\":{\"n\":{\"type\":\"integer\"}},\"required\":["
                         "\"n\"]}]}}}";
    valid(tagged, "{\"op\":{\"n\":1}}");
    invalid(tagged, "{\"op\":{\"n\":\"1\"}}", "input.op.n: expected integer, got string");
    /* Several fit by type: all their messages, first of them shown. */
    const char *two = "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":10},{\"type\":\"integer\","
                      "\"maximum\":0}]}";
    valid(two, "11");
    valid(two, "-1");
    invalid(two, "5",
            "input: matches none of the 2 alternatives of anyOf (input: must be >= 10, "
            "got 5)");
    const char *one = "{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}";
    valid(one, "1.5");
    invalid(one, "1", "input: matches 2 of the oneOf alternatives, expected exactly one");
    valid("{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":1}]}", "1");
    invalid("{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":1}]}", "0",
            "input: must be >= 1, got 0");
}

Test(validate, boolean_schemas_and_refs)
{
    valid("{\"properties\":{\"a\":true}}", "{\"a\":[1]}");
    invalid("{\"properties\":{\"a\":false}}", "{\"a\":1}", "input.a: no value is allowed here");
    const char *refs = "{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/Point\"}},"
                       "\"$defs\":{\"Point\":{\"type\":\"object\",\"properties\":{\"x\":{\"type\":"
                       "\"number\"}},\"required\":[\"x\"]}}}";
    valid(refs, "{\"p\":{\"x\":1}}");
    invalid(refs, "{\"p\":{\"y\":1}}", "input.p: missing required property \"x\"");
    /* A recursive type: a tree of nodes, validated as deep as the depth bound allows. */
    const char *tree = "{\"$ref\":\"#/definitions/N\",\"definitions\":{\"N\":{\"type\":\"object\","
                       "\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
                       "\"#/definitions/N\"}}}}}}";
    valid(tree, "{\"kids\":[{\"kids\":[]},{}]}");
    invalid(tree, "{\"kids\":[{\"kids\":[3]}]}",
            "input.kids[0].kids[0]: expected object, got integer");
    /* A ref cycle with no value nesting ends at the depth bound with a message. */
    json_t *s = J("{\"$ref\":\"#\"}"), *v = J("1");
    char *msg = NULL;
    cr_expect_eq(conch_toolschema_validate(s, v, &msg), -1);
    cr_expect_str_eq(msg, "input: schema nested deeper than 32 levels");
    free(msg);
    json_decref(s);
    json_decref(v);
}

Test(validate, deep_values_are_bounded)
{
    /* A self-referential array schema and a value nested 200 deep: refused at the bound. */
    const char *schema = "{\"$ref\":\"#/$defs/A\",\"$defs\":{\"A\":{\"type\":\"array\","
                         "\"items\":{\"$ref\":\"#/$defs/A\"}}}}";
    char *value = malloc(512);
    memset(value, '[', 200);
    memset(value + 200, ']', 200);
    value[400] = '\0';
    json_t *s = J(schema), *v = J(value);
    char *msg = NULL;
    cr_expect_eq(conch_toolschema_validate(s, v, &msg), -1);
    cr_expect(msg && strstr(msg, "schema nested deeper than 32 levels"), "%s", msg);
    cr_expect(msg && strncmp(msg, "input[0][0]", 11) == 0, "%s", msg);
    free(msg);
    /* No message wanted: still -1, nothing leaked (run under ASan in CI). */
    cr_expect_eq(conch_toolschema_validate(s, v, NULL), -1);
    json_decref(s);
    json_decref(v);
    free(value);
}

Test(validate, languages_param)
{
    unsigned bits = 99;
    struct conch_err err = {0};
    cr_expect_eq(conch_toolschema_languages(NULL, &bits, &err), 0);
    cr_expect_eq(bits, 0u);
    json_t *l = J("[\"python\",\"node\"]");
    cr_expect_eq(conch_toolschema_languages(l, &bits, &err), 0);
    cr_expect_eq(bits, CONCH_TOOLSCHEMA_LANG_PYTHON | CONCH_TOOLSCHEMA_LANG_NODE);
    json_decref(l);
    l = J("[\"bash\",\"ruby\"]");
    cr_expect_eq(conch_toolschema_languages(l, &bits, &err), -EINVAL);
    cr_expect_str_eq(err.msg,
                     "languages[1]: unknown language (one of \"bash\", \"python\", \"node\", "
                     "\"js\")");
    json_decref(l);
}

/* ---- prompt --------------------------------------------------------------------------- */

static char *sig(const char *name, const char *in, const char *out)
{
    json_t *i = in ? J(in) : NULL, *o = out ? J(out) : NULL;
    char *s = conch_toolschema_signature(name, i, o);
    cr_assert_not_null(s);
    json_decref(i);
    json_decref(o);
    return s;
}

Test(prompt, signature_required_optional_and_comments)
{
    char *s = sig("web_search",
                  "{\"type\":\"object\",\"properties\":{\"query\":{\"type\":\"string\","
                  "\"description\":\"what to look for\"},\"max_results\":{\"type\":\"integer\","
                  "\"minimum\":1,\"default\":10}},\"required\":[\"query\"]}",
                  NULL);
    cr_expect_str_eq(s, "web_search(input: {\n"
                        "  query: string; // what to look for\n"
                        "  max_results?: number; // integer, >= 1, default: 10\n"
                        "})");
    free(s);
}

Test(prompt, signature_nested_enum_array_union)
{
    char *s =
        sig("classify",
            "{\"type\":\"object\",\"properties\":{"
            "\"records\":{\"type\":\"array\",\"description\":\"the rows\",\"items\":{"
            "\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"text\":{"
            "\"type\":\"string\",\"description\":\"multi\\n  line\"}},\"required\":[\"id\"]}},"
            "\"mode\":{\"enum\":[\"fast\",\"slow\"],\"description\":\"speed\"},"
            "\"tags\":{\"type\":\"array\",\"items\":{\"type\":[\"string\",\"number\"]}},"
            "\"opts\":{\"type\":\"object\",\"properties\":{\"deep\":{\"type\":\"boolean\"}}},"
            "\"meta\":{\"type\":\"object\",\"additionalProperties\":{\"type\":\"string\"}},"
            "\"flag\":{\"const\":true},"
            "\"when\":{\"type\":[\"string\",\"null\"]},"
            "\"odd-name\":{}"
            "},\"required\":[\"records\",\"mode\"],\"additionalProperties\":false}",
            "{\"type\":\"array\",\"items\":{\"type\":\"string\"}}");
    cr_expect_str_eq(s, "classify(input: {\n"
                        "  records: Array<{ // the rows\n"
                        "    id: number; // integer\n"
                        "    text?: string; // multi line\n"
                        "  }>;\n"
                        "  mode: \"fast\" | \"slow\"; // speed\n"
                        "  tags?: (string | number)[];\n"
                        "  opts?: {\n"
                        "    deep?: boolean;\n"
                        "  };\n"
                        "  meta?: { [key: string]: string };\n"
                        "  flag?: true;\n"
                        "  when?: string | null;\n"
                        "  \"odd-name\"?: any;\n"
                        "}): string[]");
    free(s);
}

Test(prompt, signature_empty_and_refs)
{
    char *s = sig("ping", "{\"type\":\"object\",\"additionalProperties\":false}", NULL);
    cr_expect_str_eq(s, "ping(input?: {})");
    free(s);
    s = sig("tree",
            "{\"type\":\"object\",\"properties\":{\"root\":{\"$ref\":\"#/$defs/Node\"}},"
            "\"required\":[\"root\"],\"$defs\":{\"Node\":{\"type\":\"object\",\"description\":"
            "\"a node\",\"properties\":{\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
            "\"#/$defs/Node\"}}}}}}",
            NULL);
    cr_expect_str_eq(s, "tree(input: {\n"
                        "  root: { // a node\n"
                        "    kids?: Node[];\n"
                        "  };\n"
                        "})");
    free(s);
}

static const char *TOOLS =
    "[{\"name\":\"web_search\",\"description\":\"Search the web.\",\"input_schema\":{\"type\":"
    "\"object\",\"properties\":{\"query\":{\"type\":\"string\",\"description\":\"what to look "
    "for\"},\"max_results\":{\"type\":\"integer\"}},\"required\":[\"query\"]}},"
    "{\"name\":\"get_time\",\"description\":\"Now.\",\"input_schema\":{}}]";

Test(prompt, all_languages_by_default)
{
    json_t *tools = J(TOOLS), *agents = J("[{\"name\":\"analyst\",\"description\":\"Digs "
                                          "into data.\"}]");
    char *p = conch_toolschema_prompt(tools, agents, 0);
    cr_assert_not_null(p);
    const char *want[] = {
        "## Tools you can call from your commands",
        "#### `web_search`\n\nSearch the web.\n\n```ts\nweb_search(input: {\n  query: string; // "
        "what to look for\n  max_results?: number; // integer\n})\n```",
        "#### `get_time`\n\nNow.\n\n```ts\nget_time(input?: { [key: string]: any })\n```",
        "### From bash",
        "tool_call web_search '{\"query\": \"...\"}'",
        "tool_call web_search -",
        "tool_call --list",
        "### From Python",
        "import conch_tools",
        "conch_tools.call(\"web_search\", {\"query\": \"...\"})",
        "conch_tools.tools.web_search(query=\"...\")",
        "asyncio.gather(*(conch_tools.acall(\"web_search\"",
        "ToolError",
        "### From Node",
        "const { tools, call, spawnAgent } = require('conch-tools')",
        "import { tools, call, spawnAgent } from 'conch-tools'",
        "await tools.webSearch({ query: '...' })",
        "Promise.all(",
        "### Sub-agents",
        "- `analyst`: Digs into data.",
        "spawn_agent \"TASK\" analyst",
        "spawn_agent \"Analyse $f and report anomalies\" analyst > \"$f.report\" &\ndone\nwait",
        "spawn_agent --detach \"TASK\" analyst",
        "conch_tools.aspawn_agent(t, type=\"analyst\")",
        "spawnAgent(t, 'analyst')",
        "{ detach: true }",
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cr_expect(strstr(p, want[i]), "prompt lacks: %s\n---\n%s", want[i], p);
    }
    cr_expect(strstr(p, "Exit codes: 0 = ok; 1 = "), "%s", p);
    free(p);
    json_decref(tools);
    json_decref(agents);
}

Test(prompt, language_selection_and_no_agents)
{
    json_t *tools = J(TOOLS);
    char *p = conch_toolschema_prompt(tools, NULL, CONCH_TOOLSCHEMA_LANG_PYTHON);
    cr_assert_not_null(p);
    cr_expect(strstr(p, "### From Python"));
    cr_expect_null(strstr(p, "### From bash"));
    cr_expect_null(strstr(p, "### From Node"));
    cr_expect_null(strstr(p, "Sub-agents"));
    cr_expect_null(strstr(p, "spawn_agent"));
    free(p);
    p = conch_toolschema_prompt(tools, NULL,
                                CONCH_TOOLSCHEMA_LANG_BASH | CONCH_TOOLSCHEMA_LANG_NODE);
    cr_expect(strstr(p, "### From bash") && strstr(p, "### From Node"));
    cr_expect_null(strstr(p, "### From Python"));
    free(p);
    json_decref(tools);
    p = conch_toolschema_prompt(NULL, NULL, 0);
    cr_expect_str_eq(p, "## Tools you can call from your commands\n\nNo tools or sub-agents are "
                        "registered in this sandbox.\n");
    free(p);
}

Test(prompt, js_eval_declarations)
{
    json_t *tools = J("[{\"name\":\"web_search\",\"description\":\"Search the web.\","
                      "\"input_schema\":{\"type\":\"object\",\"properties\":{\"query\":"
                      "{\"type\":\"string\"}},\"required\":[\"query\"]},"
                      "\"output_schema\":{\"type\":\"array\",\"items\":{\"type\":"
                      "\"string\"}}},{\"name\":\"ping\",\"input_schema\":{}}]");
    json_t *l = J("[\"js\"]");
    unsigned bits = 0;
    struct conch_err err = {0};
    cr_assert_eq(conch_toolschema_languages(l, &bits, &err), 0, "%s", err.msg);
    cr_expect_eq(bits, CONCH_TOOLSCHEMA_LANG_JS);
    json_decref(l);
    char *p = conch_toolschema_prompt(tools, NULL, bits);
    cr_assert_not_null(p);
    cr_expect(strstr(p, "## Tools you can call from js_eval\n"), "%s", p);
    cr_expect(strstr(p, "declare const tools: {\n  /** Search the web. */\n"
                        "  webSearch(input: {\n    query: string;\n  }): Promise<string[]>;\n"
                        "  ping(input?: { [key: string]: any }): Promise<unknown>;\n};"),
              "%s", p);
    cr_expect(strstr(p, "await tools.webSearch({ query: '...' })"), "%s", p);
    cr_expect_null(strstr(p, "### From bash"));
    free(p);
    /* Beside the others, and never by default. */
    p = conch_toolschema_prompt(tools, NULL, CONCH_TOOLSCHEMA_LANG_BASH | CONCH_TOOLSCHEMA_LANG_JS);
    cr_expect(strstr(p, "### From bash") && strstr(p, "### From js_eval"));
    free(p);
    p = conch_toolschema_prompt(tools, NULL, 0);
    cr_expect_null(strstr(p, "js_eval"));
    free(p);
    p = conch_toolschema_prompt(NULL, NULL, CONCH_TOOLSCHEMA_LANG_JS);
    cr_expect_str_eq(p, "## Tools you can call from js_eval\n\nNo tools are registered in this "
                        "sandbox: `tools` is empty.\n");
    free(p);
    json_decref(tools);
}

/* ---- whole tool and agent definitions -------------------------------------------------- */

static void tool_bad(const char *def, const char *msg)
{
    json_t *t = J(def);
    struct conch_err err = {0};
    cr_expect_eq(conch_toolschema_check_tool(t, &err), -EINVAL, "%s accepted", def);
    cr_expect_str_eq(err.msg, msg, "%s", def);
    json_decref(t);
}

Test(check, tool_and_agent_definitions)
{
    json_t *t = J("{\"name\":\"web_search\",\"description\":\"d\",\"input_schema\":{\"type\":"
                  "\"object\"},\"output_schema\":{\"type\":\"array\"}}");
    struct conch_err err = {0};
    cr_expect_eq(conch_toolschema_check_tool(t, &err), 0, "%s", err.msg);
    json_decref(t);
    t = J("{\"name\":\"_a-b_9\",\"input_schema\":{}}");
    cr_expect_eq(conch_toolschema_check_tool(t, &err), 0, "%s", err.msg);
    json_decref(t);
    tool_bad("[]", "tool: expected an object {name, description, ...}");
    tool_bad("{\"input_schema\":{}}", "tool: name: expected a string");
    tool_bad(
        "{\"name\":\"9lives\",\"input_schema\":{}}",
        "tool: name \"9lives\": expected a letter or _ then at most 63 letters, digits, _ or -");
    tool_bad("{\"name\":\"a b\",\"input_schema\":{}}",
             "tool: name \"a b\": expected a letter or _ then at most 63 letters, digits, _ or -");
    tool_bad("{\"name\":\"x\",\"description\":3,\"input_schema\":{}}",
             "tool \"x\": description: expected a string");
    tool_bad("{\"name\":\"x\"}",
             "tool \"x\": input_schema is missing (use {\"type\": \"object\"} for any input)");
    tool_bad(
        "{\"name\":\"search\",\"input_schema\":{\"properties\":{\"q\":{\"type\":\"str\"}}}}",
        "tool \"search\": input_schema.properties.q.type: unknown type \"str\" (one of string, "
        "number, integer, boolean, object, array, null)");
    tool_bad("{\"name\":\"x\",\"input_schema\":{},\"output_schema\":{\"type\":1}}",
             "tool \"x\": output_schema.type: must be a type name or a non-empty list of them");
    cr_expect(conch_toolschema_name_ok("a"));
    cr_expect(
        conch_toolschema_name_ok("abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijabcdefghij"
                                 "abcd")); /* 64 */
    cr_expect_not(conch_toolschema_name_ok("abcdefghijabcdefghijabcdefghijabcdefghijabcdefghijab"
                                           "cdefghijabcde")); /* 65 */
    cr_expect_not(conch_toolschema_name_ok(""));
    cr_expect_not(conch_toolschema_name_ok("-x"));
    cr_expect_not(conch_toolschema_name_ok("x.y"));
    json_t *a = J("{\"name\":\"analyst\",\"description\":\"Digs.\"}");
    cr_expect_eq(conch_toolschema_check_agent(a, &err), 0);
    json_decref(a);
    a = J("{\"name\":\"bad name\"}");
    cr_expect_eq(conch_toolschema_check_agent(a, &err), -EINVAL);
    cr_expect_str_eq(err.msg, "agent type: name \"bad name\": expected a letter or _ then at most "
                              "63 letters, digits, _ or -");
    json_decref(a);
}

/* ---- where the client tree is (src/ptc/ptcdir.c) ---------------------------------------- */

Test(ptcdir, env_override_and_clear_errors)
{
    char dir[] = "/tmp/ptcdir-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/bin", dir);
    cr_assert_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/bin/tool_call", dir);
    struct conch_err err = {0};
    char *got = NULL;

    /* Set but without bin/tool_call: refused, naming the variable. */
    setenv("CONCH_PTC_DIR", dir, 1);
    cr_expect_eq(conch_ptc_find_dir(&got, &err), -ENOENT);
    cr_expect(strstr(err.msg, "CONCH_PTC_DIR=") && strstr(err.msg, "does not hold bin/tool_call"),
              "%s", err.msg);
    cr_expect_null(got);

    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0755);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_expect_eq(conch_ptc_find_dir(&got, &err), 0, "%s", err.msg);
    cr_expect_str_eq(got, dir);
    free(got);
    got = NULL;

    /* Unset: next to the test binary there is no ptc/, so the install dir or a clear error. */
    unsetenv("CONCH_PTC_DIR");
    int r = conch_ptc_find_dir(&got, &err);
    if (r == 0) {
        cr_expect_str_eq(got, CONCH_PTC_INSTALL_DIR);
        free(got);
    } else {
        cr_expect_eq(r, -ENOENT);
        cr_expect(strstr(err.msg, CONCH_PTC_INSTALL_DIR), "%s", err.msg);
        cr_expect(strstr(err.msg, "set CONCH_PTC_DIR"), "%s", err.msg);
    }
    unlink(path);
    snprintf(path, sizeof(path), "%s/bin", dir);
    rmdir(path);
    rmdir(dir);
}

/* A chain of $defs, each an anyOf of ten refs to the next: 10^n paths for a failing value. */
static json_t *exponential_schema(int n)
{
    json_t *defs = json_object();
    for (int i = 0; i < n; i++) {
        char name[16], ref[32];
        snprintf(name, sizeof(name), "D%d", i);
        snprintf(ref, sizeof(ref), "#/$defs/D%d", i + 1);
        json_t *alts = json_array();
        for (int k = 0; k < 10; k++)
            json_array_append_new(alts, json_pack("{s:s}", "$ref", ref));
        json_object_set_new(defs, name, json_pack("{s:o}", "anyOf", alts));
    }
    char last[16];
    snprintf(last, sizeof(last), "D%d", n);
    json_object_set_new(defs, last, json_pack("{s:s}", "type", "string"));
    return json_pack("{s:s,s:o}", "$ref", "#/$defs/D0", "$defs", defs);
}

Test(validate, exponential_schemas_are_bounded, .timeout = 20)
{
    json_t *s = exponential_schema(10);
    struct conch_err err = {0};
    cr_expect_eq(conch_toolschema_check(s, &err), 0, "%s", err.msg);
    json_t *ok = json_string("fine"), *bad = json_integer(1);
    char *msg = NULL;
    cr_expect_eq(conch_toolschema_validate(s, ok, &msg), 0, "%s", msg);
    cr_expect_eq(conch_toolschema_validate(s, bad, &msg), -1);
    cr_expect(msg && strstr(msg, "input: checking it against the schema took over 200000 steps"),
              "%s", msg);
    free(msg);
    char *sg = conch_toolschema_signature("x", s, NULL);
    cr_assert_not_null(sg);
    cr_expect_lt(strlen(sg), 100000, "%zu bytes", strlen(sg));
    free(sg);
    json_decref(ok);
    json_decref(bad);
    json_decref(s);
}
