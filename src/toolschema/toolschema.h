/* toolschema.h - the tool bridge's JSON Schema subset: checking a tool's input_schema when it
 * is registered, validating a call's input against it before anything reaches the harness,
 * and rendering the registered tools as a system-prompt section (tools.prompt). Depends only
 * on jansson and core/. */
#ifndef CONCH_TOOLSCHEMA_TOOLSCHEMA_H
#define CONCH_TOOLSCHEMA_TOOLSCHEMA_H

#include <jansson.h>
#include <stdbool.h>

#include "core/error.h"

/* Schemas (and the values validated against them) nest at most this deep; $ref hops count. */
#define CONCH_TOOLSCHEMA_MAX_DEPTH 32

/* conch_toolschema_validate() gives up (and fails) after this many schema visits. */
#define CONCH_TOOLSCHEMA_MAX_STEPS 200000ul

/* Languages for conch_toolschema_prompt(); 0 means all of them. */
#define CONCH_TOOLSCHEMA_LANG_BASH 0x1u
#define CONCH_TOOLSCHEMA_LANG_PYTHON 0x2u
#define CONCH_TOOLSCHEMA_LANG_NODE 0x4u
#define CONCH_TOOLSCHEMA_LANG_ALL 0x7u
/* The `tools` global of js.eval, as TypeScript declarations: only when asked for ("js"). */
#define CONCH_TOOLSCHEMA_LANG_JS 0x8u

/*
 * conch_toolschema_check - is @schema an acceptable input_schema for tools.register?
 * @schema: borrowed. It must be an object; every keyword of the supported subset (type,
 * properties, required, additionalProperties, enum, const, items, minItems/maxItems,
 * minLength/maxLength, minimum/maximum, exclusiveMinimum/exclusiveMaximum, anyOf/oneOf/allOf,
 * description, $ref to "#/..." with $defs/definitions) must be well-formed, recursively, at
 * most CONCH_TOOLSCHEMA_MAX_DEPTH levels deep. Unknown keywords are ignored. Returns 0, or
 * -EINVAL with @err (kind usage) naming the keyword and where it is, e.g.
 * "input_schema.properties.count.type: unknown type \"int\"".
 */
int conch_toolschema_check(json_t *schema, struct conch_err *err);

/* conch_toolschema_name_ok - is @name a valid tool or agent-type name:
 * [A-Za-z_][A-Za-z0-9_-]{0,63}? */
bool conch_toolschema_name_ok(const char *name);

/*
 * conch_toolschema_check_tool - is @tool (borrowed) an acceptable entry of tools.register's
 * `tools`: an object with a valid name, a string description (optional), an input_schema
 * that passes conch_toolschema_check() and an optional output_schema (same rules, or null)?
 * Returns 0, or -EINVAL with @err naming the tool and the problem, e.g.
 * "tool \"search\": input_schema.properties.q.type: unknown type \"str\"".
 */
int conch_toolschema_check_tool(json_t *tool, struct conch_err *err);

/* conch_toolschema_check_agent - the same for an entry of agents.register's `agents`
 * ({name, description}). */
int conch_toolschema_check_agent(json_t *agent, struct conch_err *err);

/*
 * conch_toolschema_validate - does @value satisfy @schema?
 * @schema: borrowed, should have passed conch_toolschema_check() (a malformed keyword is
 * ignored, never a crash). @value: borrowed. Returns 0 when it does; otherwise -1 and, when
 * @ret_msg is not NULL, a new string (caller frees) naming the path and the problem, e.g.
 * "input.records[3].id: expected integer, got string" or
 * "input: missing required property \"query\"". A number with no fraction counts as an
 * integer; lengths count UTF-8 code points. Recursion is bounded, and so is the work: after
 * CONCH_TOOLSCHEMA_MAX_STEPS schema visits the value is refused as too complex to check.
 */
int conch_toolschema_validate(json_t *schema, json_t *value, char **ret_msg);

/*
 * conch_toolschema_languages - parse tools.prompt's `languages` param (NULL, or an array of
 * "bash", "python", "node", "js") into CONCH_TOOLSCHEMA_LANG_* bits in *@ret (0 for NULL =
 * bash, python and node).
 * Returns 0, or -EINVAL with @err naming the bad entry.
 */
int conch_toolschema_languages(json_t *list, unsigned *ret, struct conch_err *err);

/*
 * conch_toolschema_signature - @name's input as a TypeScript-like signature, e.g.
 * "web_search(input: {\n  query: string; // what to look for\n  max_results?: number;\n})",
 * with ": <result type>" appended when @output_schema (may be NULL) is given. Borrowed
 * arguments; returns a new string (caller frees) or NULL when out of memory.
 */
char *conch_toolschema_signature(const char *name, json_t *input_schema, json_t *output_schema);

/*
 * conch_toolschema_prompt - the text of tools.prompt: a markdown system-prompt section that
 * tells a model how to call the registered tools from bash, Python and Node (only the
 * languages in the @languages bit set; 0 = those three), each tool's description and
 * signature, and with CONCH_TOOLSCHEMA_LANG_JS the `tools` global of js.eval as TypeScript
 * declarations (alone: the whole text is about js.eval), and
 * how to spawn sub-agents (in parallel, or detached) when @agents is a non-empty array.
 * @tools: borrowed array of {name, description, input_schema, output_schema?} (NULL = none);
 * @agents: borrowed array of {name, description} (NULL = none). Returns a new string (caller
 * frees) or NULL when out of memory.
 */
char *conch_toolschema_prompt(json_t *tools, json_t *agents, unsigned languages);

#endif
