/* toolschema.c - the bridge's JSON Schema subset: conch_toolschema_check() vets an
 * input_schema at registration, conch_toolschema_validate() checks a call's input against it
 * with a message a model can act on ("input.records[3].id: expected integer, got string"). */
#include "toolschema/toolschema.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/strbuf.h"

static const char *const type_names[] = {"string", "number", "integer", "boolean",
                                         "object", "array",  "null"};

static bool known_type(const char *t)
{
    for (size_t i = 0; i < sizeof(type_names) / sizeof(type_names[0]); i++)
        if (strcmp(t, type_names[i]) == 0)
            return true;
    return false;
}

/* Append ".key" or ["key"] (JSON-quoted when not an identifier) to a path. */
static void path_key(struct conch_sb *p, const char *key)
{
    size_t n = strlen(key);
    bool ident =
        n > 0 && n <= 64 && (isalpha((unsigned char)key[0]) || key[0] == '_' || key[0] == '$');
    for (size_t i = 0; ident && i < n; i++)
        if (!isalnum((unsigned char)key[i]) && key[i] != '_' && key[i] != '-' && key[i] != '$')
            ident = false;
    if (ident) {
        conch_sb_printf(p, ".%s", key);
        return;
    }
    json_t *s = json_stringn(key, n > 64 ? 64 : n);
    char *q = s ? json_dumps(s, JSON_ENCODE_ANY) : NULL;
    conch_sb_printf(p, "[%s%s]", q ? q : "\"?\"", n > 64 ? "..." : "");
    free(q);
    json_decref(s);
}

/* The value @ref ("#", "#/a/b~1c") points to inside @root, or NULL. */
static json_t *resolve_ref(json_t *root, const char *ref)
{
    if (ref[0] != '#')
        return NULL;
    const char *p = ref + 1;
    json_t *cur = root;
    if (*p == '\0')
        return cur;
    if (*p != '/')
        return NULL;
    char tok[256];
    while (*p == '/' && cur) {
        p++;
        size_t n = 0;
        while (*p && *p != '/') {
            char c = *p++;
            if (c == '~' && *p == '1')
                c = '/', p++;
            else if (c == '~' && *p == '0')
                c = '~', p++;
            if (n + 1 >= sizeof(tok))
                return NULL;
            tok[n++] = c;
        }
        tok[n] = '\0';
        if (json_is_object(cur)) {
            cur = json_object_get(cur, tok);
        } else if (json_is_array(cur)) {
            char *end;
            unsigned long i = strtoul(tok, &end, 10);
            cur = (n && *end == '\0') ? json_array_get(cur, i) : NULL;
        } else {
            cur = NULL;
        }
    }
    return cur;
}

/* ---- check ---------------------------------------------------------------------------- */

struct cctx {
    json_t *root;
    struct conch_sb path;
    struct conch_err *err;
};

static int cfail(struct cctx *c, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int cfail(struct cctx *c, const char *key, const char *fmt, ...)
{
    size_t mark = c->path.len;
    if (key)
        path_key(&c->path, key);
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    int r = conch_err_setk(c->err, CONCH_ERR_USAGE, EINVAL, "%s: %s",
                           c->path.buf ? c->path.buf : "input_schema", what);
    conch_sb_trunc(&c->path, mark);
    return r;
}

static int check_schema(struct cctx *c, json_t *s, int depth, bool allow_bool);

static int check_sub(struct cctx *c, const char *key, json_t *s, int depth)
{
    size_t mark = c->path.len;
    path_key(&c->path, key);
    int r = check_schema(c, s, depth, true);
    conch_sb_trunc(&c->path, mark);
    return r;
}

static int check_count(struct cctx *c, json_t *s, const char *key)
{
    json_t *v = json_object_get(s, key);
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0))
        return cfail(c, key, "must be a non-negative integer");
    return 0;
}

static int check_range(struct cctx *c, json_t *s, const char *lo, const char *hi)
{
    json_t *a = json_object_get(s, lo), *b = json_object_get(s, hi);
    if (a && b && json_is_number(a) && json_is_number(b) &&
        json_number_value(a) > json_number_value(b))
        return cfail(c, lo, "is greater than %s", hi);
    return 0;
}

static int check_schema_list(struct cctx *c, json_t *s, const char *key, int depth)
{
    json_t *l = json_object_get(s, key);
    if (!l)
        return 0;
    if (!json_is_array(l) || json_array_size(l) == 0)
        return cfail(c, key, "must be a non-empty array of schemas");
    size_t mark = c->path.len;
    path_key(&c->path, key);
    size_t i;
    json_t *sub;
    int r = 0;
    json_array_foreach(l, i, sub)
    {
        size_t m2 = c->path.len;
        conch_sb_printf(&c->path, "[%zu]", i);
        r = check_schema(c, sub, depth + 1, true);
        conch_sb_trunc(&c->path, m2);
        if (r < 0)
            break;
    }
    conch_sb_trunc(&c->path, mark);
    return r;
}

static int check_schema(struct cctx *c, json_t *s, int depth, bool allow_bool)
{
    if (depth > CONCH_TOOLSCHEMA_MAX_DEPTH)
        return cfail(c, NULL, "schema nested deeper than %d levels", CONCH_TOOLSCHEMA_MAX_DEPTH);
    if (allow_bool && json_is_boolean(s))
        return 0;
    if (!json_is_object(s))
        return cfail(c, NULL, "a schema must be a JSON object%s",
                     allow_bool ? " or a boolean" : "");

    json_t *t = json_object_get(s, "type");
    if (t) {
        if (json_is_string(t)) {
            if (!known_type(json_string_value(t)))
                return cfail(c, "type",
                             "unknown type \"%s\" (one of string, number, integer, "
                             "boolean, object, array, null)",
                             json_string_value(t));
        } else if (json_is_array(t) && json_array_size(t) > 0) {
            size_t i;
            json_t *e;
            json_array_foreach(t, i, e)
            {
                if (!json_is_string(e))
                    return cfail(c, "type", "must be a type name or a list of them");
                if (!known_type(json_string_value(e)))
                    return cfail(c, "type", "unknown type \"%s\"", json_string_value(e));
            }
        } else {
            return cfail(c, "type", "must be a type name or a non-empty list of them");
        }
    }

    json_t *props = json_object_get(s, "properties");
    if (props) {
        if (!json_is_object(props))
            return cfail(c, "properties", "must be an object mapping names to schemas");
        size_t mark = c->path.len;
        path_key(&c->path, "properties");
        const char *k;
        json_t *sub;
        int r = 0;
        json_object_foreach(props, k, sub)
        {
            if ((r = check_sub(c, k, sub, depth + 1)) < 0)
                break;
        }
        conch_sb_trunc(&c->path, mark);
        if (r < 0)
            return r;
    }

    json_t *req = json_object_get(s, "required");
    if (req) {
        if (!json_is_array(req))
            return cfail(c, "required", "must be an array of property names");
        size_t i;
        json_t *e;
        json_array_foreach(req, i, e)
        {
            if (!json_is_string(e))
                return cfail(c, "required", "must be an array of property names (strings)");
        }
    }

    json_t *ap = json_object_get(s, "additionalProperties");
    if (ap) {
        int r = check_sub(c, "additionalProperties", ap, depth + 1);
        if (r < 0)
            return r;
    }

    json_t *en = json_object_get(s, "enum");
    if (en && (!json_is_array(en) || json_array_size(en) == 0))
        return cfail(c, "enum", "must be a non-empty array of values");

    json_t *items = json_object_get(s, "items");
    if (items) {
        if (json_is_array(items))
            return cfail(c, "items", "must be a single schema (the tuple form is not supported)");
        int r = check_sub(c, "items", items, depth + 1);
        if (r < 0)
            return r;
    }

    static const char *const counts[] = {"minItems",  "maxItems",      "minLength",
                                         "maxLength", "minProperties", "maxProperties"};
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
        if (check_count(c, s, counts[i]) < 0)
            return -EINVAL;
    static const char *const nums[] = {"minimum", "maximum", "exclusiveMinimum",
                                       "exclusiveMaximum"};
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        json_t *v = json_object_get(s, nums[i]);
        if (v && !json_is_number(v))
            return cfail(c, nums[i], "must be a number");
    }
    if (check_range(c, s, "minItems", "maxItems") < 0 ||
        check_range(c, s, "minLength", "maxLength") < 0 ||
        check_range(c, s, "minimum", "maximum") < 0)
        return -EINVAL;

    json_t *d = json_object_get(s, "description");
    if (d && !json_is_string(d))
        return cfail(c, "description", "must be a string");

    if (check_schema_list(c, s, "anyOf", depth) < 0 ||
        check_schema_list(c, s, "oneOf", depth) < 0 || check_schema_list(c, s, "allOf", depth) < 0)
        return -EINVAL;

    static const char *const defs[] = {"$defs", "definitions"};
    for (size_t i = 0; i < 2; i++) {
        json_t *dv = json_object_get(s, defs[i]);
        if (!dv)
            continue;
        if (!json_is_object(dv))
            return cfail(c, defs[i], "must be an object mapping names to schemas");
        size_t mark = c->path.len;
        path_key(&c->path, defs[i]);
        const char *k;
        json_t *sub;
        int r = 0;
        json_object_foreach(dv, k, sub)
        {
            if ((r = check_sub(c, k, sub, depth + 1)) < 0)
                break;
        }
        conch_sb_trunc(&c->path, mark);
        if (r < 0)
            return r;
    }

    json_t *ref = json_object_get(s, "$ref");
    if (ref) {
        if (!json_is_string(ref))
            return cfail(c, "$ref", "must be a string");
        const char *rs = json_string_value(ref);
        if (rs[0] != '#')
            return cfail(c, "$ref",
                         "\"%s\": only references inside the schema (\"#/...\") are "
                         "supported",
                         rs);
        json_t *target = resolve_ref(c->root, rs);
        if (!target || !(json_is_object(target) || json_is_boolean(target)))
            return cfail(c, "$ref", "\"%s\" does not point to a schema in this schema", rs);
    }
    return 0;
}

static int check_named(json_t *schema, const char *what, struct conch_err *err)
{
    struct cctx c = {.root = schema, .err = err};
    conch_sb_puts(&c.path, what);
    int r = check_schema(&c, schema, 1, false);
    if (r == 0 && c.path.oom)
        r = conch_err_set(err, ENOMEM, "%s: out of memory", what);
    conch_sb_done(&c.path);
    return r;
}

int conch_toolschema_check(json_t *schema, struct conch_err *err)
{
    return check_named(schema, "input_schema", err);
}

bool conch_toolschema_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 64 || !(isalpha((unsigned char)name[0]) || name[0] == '_'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && name[i] != '_' && name[i] != '-')
            return false;
    return true;
}

/* The name and description every tool and agent type has. */
static int check_entry(json_t *def, const char *what, struct conch_err *err)
{
    if (!json_is_object(def))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: expected an object {name, description, ...}", what);
    json_t *name = json_object_get(def, "name");
    if (!json_is_string(name))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: name: expected a string", what);
    if (!conch_toolschema_name_ok(json_string_value(name)))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: name \"%.80s\": expected a letter or _ then at most 63 letters, "
                              "digits, _ or -",
                              what, json_string_value(name));
    json_t *d = json_object_get(def, "description");
    if (d && !json_is_string(d) && !json_is_null(d))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s \"%s\": description: expected a string", what,
                              json_string_value(name));
    return 0;
}

int conch_toolschema_check_tool(json_t *tool, struct conch_err *err)
{
    int r = check_entry(tool, "tool", err);
    if (r < 0)
        return r;
    const char *name = json_string_value(json_object_get(tool, "name"));
    json_t *in = json_object_get(tool, "input_schema");
    if (!in)
        return conch_err_setk(
            err, CONCH_ERR_USAGE, EINVAL,
            "tool \"%s\": input_schema is missing (use {\"type\": \"object\"} for "
            "any input)",
            name);
    if ((r = check_named(in, "input_schema", err)) < 0)
        return conch_err_wrap(err, "tool \"%s\"", name);
    json_t *out = json_object_get(tool, "output_schema");
    if (out && !json_is_null(out) && (r = check_named(out, "output_schema", err)) < 0)
        return conch_err_wrap(err, "tool \"%s\"", name);
    return 0;
}

int conch_toolschema_check_agent(json_t *agent, struct conch_err *err)
{
    return check_entry(agent, "agent type", err);
}

/* ---- validate ------------------------------------------------------------------------- */

struct vctx {
    json_t *root;
    struct conch_sb path;
    char *msg;            /* the first failure, "path: problem" */
    unsigned long *steps; /* schema visits left, shared with the anyOf/oneOf trials */
};

static const char *kind_of(json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "object";
    case JSON_ARRAY:
        return "array";
    case JSON_STRING:
        return "string";
    case JSON_INTEGER:
        return "integer";
    case JSON_REAL:
        return "number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "boolean";
    case JSON_NULL:
    default:
        return "null";
    }
}

static bool is_type(json_t *v, const char *t)
{
    if (strcmp(t, "integer") == 0) {
        if (json_is_integer(v))
            return true;
        if (!json_is_real(v))
            return false;
        double d = json_real_value(v);
        return isfinite(d) && d == floor(d);
    }
    if (strcmp(t, "number") == 0)
        return json_is_number(v);
    if (strcmp(t, "boolean") == 0)
        return json_is_boolean(v);
    return strcmp(t, kind_of(v)) == 0;
}

/* Does @v match the schema's "type" (absent or malformed: yes)? */
static bool type_ok(json_t *s, json_t *v)
{
    json_t *t = json_is_object(s) ? json_object_get(s, "type") : NULL;
    if (json_is_string(t))
        return is_type(v, json_string_value(t));
    if (json_is_array(t) && json_array_size(t)) {
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e)
        {
            if (json_is_string(e) && is_type(v, json_string_value(e)))
                return true;
        }
        return false;
    }
    return true;
}

/* JSON Schema equality: numbers by value (1 == 1.0), containers recursively. */
static bool jeq(json_t *a, json_t *b, int depth)
{
    if (depth > 64)
        return false;
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b))
        return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b))
            return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!jeq(json_array_get(a, i), json_array_get(b, i), depth + 1))
                return false;
        return true;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b))
            return false;
        const char *k;
        json_t *va;
        json_object_foreach(a, k, va)
        {
            json_t *vb = json_object_get(b, k);
            if (!vb || !jeq(va, vb, depth + 1))
                return false;
        }
        return true;
    }
    return json_equal(a, b);
}

static int vfail(struct vctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int vfail(struct vctx *c, const char *fmt, ...)
{
    if (c->msg)
        return -1;
    struct conch_sb m = {0};
    conch_sb_puts(&m, c->path.buf ? c->path.buf : "input");
    conch_sb_puts(&m, ": ");
    va_list ap;
    va_start(ap, fmt);
    char buf[1024];
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    conch_sb_puts(&m, buf);
    c->msg = conch_sb_take(&m);
    return -1;
}

/* "string or null" from a schema's type; "" when there is none. */
static void type_words(json_t *s, struct conch_sb *out)
{
    json_t *t = json_is_object(s) ? json_object_get(s, "type") : NULL;
    if (json_is_string(t)) {
        conch_sb_puts(out, json_string_value(t));
    } else if (json_is_array(t)) {
        size_t i, n = json_array_size(t);
        json_t *e;
        json_array_foreach(t, i, e)
        {
            if (i)
                conch_sb_puts(out, i + 1 == n ? " or " : ", ");
            conch_sb_puts(out, json_is_string(e) ? json_string_value(e) : "?");
        }
    }
}

/* A value, compact, shortened for messages. */
static void show_value(struct conch_sb *out, json_t *v)
{
    char *d = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!d) {
        conch_sb_puts(out, "?");
        return;
    }
    size_t n = strlen(d);
    if (n > 60) {
        conch_sb_putn(out, d, 57);
        conch_sb_puts(out, "...");
    } else {
        conch_sb_puts(out, d);
    }
    free(d);
}

static size_t utf8_len(const char *s, size_t n)
{
    size_t cps = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            cps++;
    return cps;
}

static int vschema(struct vctx *c, json_t *s, json_t *v, int depth);

static int vsub_key(struct vctx *c, const char *key, json_t *s, json_t *v, int depth)
{
    size_t mark = c->path.len;
    path_key(&c->path, key);
    int r = vschema(c, s, v, depth);
    conch_sb_trunc(&c->path, mark);
    return r;
}

static int vbound(struct vctx *c, json_t *s, json_t *v)
{
    static const struct {
        const char *key, *op;
        int sign; /* the value must be: +1 >= bound, -1 <= bound; 2/-2 strictly */
    } b[] = {
        {"minimum", ">=", 1},
        {"maximum", "<=", -1},
        {"exclusiveMinimum", ">", 2},
        {"exclusiveMaximum", "<", -2},
    };
    for (size_t i = 0; i < sizeof(b) / sizeof(b[0]); i++) {
        json_t *l = json_object_get(s, b[i].key);
        if (!json_is_number(l))
            continue;
        int cmp;
        if (json_is_integer(l) && json_is_integer(v)) {
            json_int_t x = json_integer_value(v), y = json_integer_value(l);
            cmp = x < y ? -1 : x > y;
        } else {
            double x = json_number_value(v), y = json_number_value(l);
            cmp = x < y ? -1 : x > y;
        }
        bool ok = b[i].sign == 1    ? cmp >= 0
                  : b[i].sign == -1 ? cmp <= 0
                  : b[i].sign == 2  ? cmp > 0
                                    : cmp < 0;
        if (!ok) {
            struct conch_sb m = {0};
            show_value(&m, l);
            conch_sb_puts(&m, ", got ");
            show_value(&m, v);
            int r = vfail(c, "must be %s %s", b[i].op, m.buf ? m.buf : "?");
            conch_sb_done(&m);
            return r;
        }
    }
    return 0;
}

/* anyOf / oneOf. A failure names the one alternative whose type fits when there is exactly
 * one (the useful message for tagged objects), else lists what was expected. */
static int valts(struct vctx *c, json_t *s, json_t *v, int depth, const char *key)
{
    json_t *l = json_object_get(s, key);
    if (!json_is_array(l) || !json_array_size(l))
        return 0;
    bool one = strcmp(key, "oneOf") == 0;
    size_t n = json_array_size(l), matched = 0, fits = 0, fit_idx = 0;
    char *fit_msg = NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *alt = json_array_get(l, i);
        struct vctx sub = {.root = c->root, .steps = c->steps};
        conch_sb_puts(&sub.path, c->path.buf ? c->path.buf : "input");
        int r = vschema(&sub, alt, v, depth + 1);
        conch_sb_done(&sub.path);
        if (r == 0) {
            matched++;
        } else if (type_ok(alt, v)) {
            if (fits++ == 0) {
                fit_msg = sub.msg;
                sub.msg = NULL;
                fit_idx = i;
            }
        }
        free(sub.msg);
        if (matched && !one)
            break;
    }
    (void)fit_idx;
    int r = 0;
    if (matched == 0) {
        if (fits == 1 && fit_msg) {
            if (!c->msg)
                c->msg = fit_msg, fit_msg = NULL;
            r = -1;
        } else if (fits == 0) {
            struct conch_sb w = {0};
            for (size_t i = 0; i < n; i++) {
                size_t before = w.len;
                if (i)
                    conch_sb_puts(&w, i + 1 == n ? " or " : ", ");
                size_t mid = w.len;
                type_words(json_array_get(l, i), &w);
                if (w.len == mid)
                    conch_sb_trunc(&w, before);
            }
            r = vfail(c, "expected %s, got %s", w.buf ? w.buf : "one of the alternatives",
                      kind_of(v));
            conch_sb_done(&w);
        } else if (fit_msg && strstr(fit_msg, ": matches none of the ")) {
            /* nested alternatives: the innermost says it, once */
            if (!c->msg)
                c->msg = fit_msg, fit_msg = NULL;
            r = -1;
        } else {
            r = vfail(c, "matches none of the %zu alternatives of %s (%s)", n, key,
                      fit_msg ? fit_msg : "");
        }
    } else if (one && matched > 1) {
        r = vfail(c, "matches %zu of the oneOf alternatives, expected exactly one", matched);
    }
    free(fit_msg);
    return r;
}

static int vschema(struct vctx *c, json_t *s, json_t *v, int depth)
{
    /* $refs can share subschemas, so anyOf over refs over anyOf... is exponential in the
     * schema's size when the value fails: a budget keeps a hostile value cheap. */
    if (*c->steps == 0)
        return vfail(c, "too complex to check");
    --*c->steps;
    if (depth > CONCH_TOOLSCHEMA_MAX_DEPTH)
        return vfail(c, "schema nested deeper than %d levels", CONCH_TOOLSCHEMA_MAX_DEPTH);
    if (json_is_true(s))
        return 0;
    if (json_is_false(s))
        return vfail(c, "no value is allowed here");
    if (!json_is_object(s))
        return 0;

    json_t *ref = json_object_get(s, "$ref");
    if (json_is_string(ref)) {
        json_t *target = resolve_ref(c->root, json_string_value(ref));
        if (target && vschema(c, target, v, depth + 1) < 0)
            return -1;
    }

    if (!type_ok(s, v)) {
        struct conch_sb w = {0};
        type_words(s, &w);
        int r = vfail(c, "expected %s, got %s", w.buf ? w.buf : "?", kind_of(v));
        conch_sb_done(&w);
        return r;
    }

    json_t *cv = json_object_get(s, "const");
    if (cv && !jeq(cv, v, 0)) {
        struct conch_sb m = {0};
        show_value(&m, cv);
        int r = vfail(c, "must be %s", m.buf ? m.buf : "?");
        conch_sb_done(&m);
        return r;
    }

    json_t *en = json_object_get(s, "enum");
    if (json_is_array(en) && json_array_size(en)) {
        size_t i;
        json_t *e;
        bool ok = false;
        json_array_foreach(en, i, e)
        {
            if (jeq(e, v, 0)) {
                ok = true;
                break;
            }
        }
        if (!ok) {
            struct conch_sb m = {0};
            json_array_foreach(en, i, e)
            {
                if (i)
                    conch_sb_puts(&m, ", ");
                if (m.len > 300) {
                    conch_sb_puts(&m, "...");
                    break;
                }
                show_value(&m, e);
            }
            int r = vfail(c, "must be one of %s", m.buf ? m.buf : "?");
            conch_sb_done(&m);
            return r;
        }
    }

    if (json_is_string(v)) {
        size_t n = utf8_len(json_string_value(v), json_string_length(v));
        json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
        if (json_is_integer(mn) && (json_int_t)n < json_integer_value(mn))
            return vfail(c, "expected at least %lld character%s, got %zu",
                         (long long)json_integer_value(mn), json_integer_value(mn) == 1 ? "" : "s",
                         n);
        if (json_is_integer(mx) && (json_int_t)n > json_integer_value(mx))
            return vfail(c, "expected at most %lld character%s, got %zu",
                         (long long)json_integer_value(mx), json_integer_value(mx) == 1 ? "" : "s",
                         n);
    } else if (json_is_number(v)) {
        if (vbound(c, s, v) < 0)
            return -1;
    } else if (json_is_array(v)) {
        size_t n = json_array_size(v);
        json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
        if (json_is_integer(mn) && (json_int_t)n < json_integer_value(mn))
            return vfail(c, "expected at least %lld item%s, got %zu",
                         (long long)json_integer_value(mn), json_integer_value(mn) == 1 ? "" : "s",
                         n);
        if (json_is_integer(mx) && (json_int_t)n > json_integer_value(mx))
            return vfail(c, "expected at most %lld item%s, got %zu",
                         (long long)json_integer_value(mx), json_integer_value(mx) == 1 ? "" : "s",
                         n);
        json_t *items = json_object_get(s, "items");
        if (items) {
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e)
            {
                size_t mark = c->path.len;
                conch_sb_printf(&c->path, "[%zu]", i);
                int r = vschema(c, items, e, depth + 1);
                conch_sb_trunc(&c->path, mark);
                if (r < 0)
                    return r;
            }
        }
    } else if (json_is_object(v)) {
        json_t *props = json_object_get(s, "properties");
        json_t *req = json_object_get(s, "required");
        if (json_is_array(req)) {
            size_t i;
            json_t *e;
            json_array_foreach(req, i, e)
            {
                if (json_is_string(e) && !json_object_get(v, json_string_value(e)))
                    return vfail(c, "missing required property \"%s\"", json_string_value(e));
            }
        }
        json_t *ap = json_object_get(s, "additionalProperties");
        const char *k;
        json_t *pv;
        json_object_foreach(v, k, pv)
        {
            json_t *ps = json_is_object(props) ? json_object_get(props, k) : NULL;
            if (ps) {
                if (vsub_key(c, k, ps, pv, depth + 1) < 0)
                    return -1;
            } else if (json_is_false(ap)) {
                return vfail(c, "unexpected property \"%s\"", k);
            } else if (json_is_object(ap)) {
                if (vsub_key(c, k, ap, pv, depth + 1) < 0)
                    return -1;
            }
        }
        json_t *mn = json_object_get(s, "minProperties"), *mx = json_object_get(s, "maxProperties");
        size_t n = json_object_size(v);
        if (json_is_integer(mn) && (json_int_t)n < json_integer_value(mn))
            return vfail(c, "expected at least %lld propert%s, got %zu",
                         (long long)json_integer_value(mn),
                         json_integer_value(mn) == 1 ? "y" : "ies", n);
        if (json_is_integer(mx) && (json_int_t)n > json_integer_value(mx))
            return vfail(c, "expected at most %lld propert%s, got %zu",
                         (long long)json_integer_value(mx),
                         json_integer_value(mx) == 1 ? "y" : "ies", n);
    }

    json_t *all = json_object_get(s, "allOf");
    if (json_is_array(all)) {
        size_t i;
        json_t *e;
        json_array_foreach(all, i, e)
        {
            if (vschema(c, e, v, depth + 1) < 0)
                return -1;
        }
    }
    if (valts(c, s, v, depth, "anyOf") < 0 || valts(c, s, v, depth, "oneOf") < 0)
        return -1;
    return 0;
}

int conch_toolschema_validate(json_t *schema, json_t *value, char **ret_msg)
{
    unsigned long steps = CONCH_TOOLSCHEMA_MAX_STEPS;
    struct vctx c = {.root = schema, .steps = &steps};
    conch_sb_puts(&c.path, "input");
    int r = vschema(&c, schema, value, 1);
    conch_sb_done(&c.path);
    if (r < 0 && steps == 0) {
        free(c.msg);
        c.msg = NULL;
        if (asprintf(&c.msg,
                     "input: checking it against the schema took over %lu steps (the schema's "
                     "$refs and alternatives multiply); simplify the input or the schema",
                     (unsigned long)CONCH_TOOLSCHEMA_MAX_STEPS) < 0)
            c.msg = NULL;
    }
    if (r < 0) {
        if (ret_msg)
            *ret_msg = c.msg ? c.msg : strdup("input: does not match the schema");
        else
            free(c.msg);
        return -1;
    }
    free(c.msg);
    return 0;
}

int conch_toolschema_languages(json_t *list, unsigned *ret, struct conch_err *err)
{
    unsigned bits = 0;
    if (list && !json_is_null(list)) {
        if (!json_is_array(list))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "languages: expected an array of \"bash\", \"python\", "
                                  "\"node\", \"js\"");
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e)
        {
            const char *n = json_string_value(e);
            if (n && strcmp(n, "bash") == 0)
                bits |= CONCH_TOOLSCHEMA_LANG_BASH;
            else if (n && strcmp(n, "python") == 0)
                bits |= CONCH_TOOLSCHEMA_LANG_PYTHON;
            else if (n && (strcmp(n, "node") == 0 || strcmp(n, "javascript") == 0))
                bits |= CONCH_TOOLSCHEMA_LANG_NODE;
            else if (n && strcmp(n, "js") == 0)
                bits |= CONCH_TOOLSCHEMA_LANG_JS;
            else
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "languages[%zu]: unknown language (one of \"bash\", "
                                      "\"python\", \"node\", \"js\")",
                                      i);
        }
    }
    *ret = bits;
    return 0;
}
