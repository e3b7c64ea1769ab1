/* js-strip.c - TypeScript to JavaScript with the tree-sitter TypeScript grammar, and the
 * REPL rewrite of a cell (top-level declarations to globals, the last expression returned,
 * the whole in an async function for top-level await). Both are edits of the source that
 * keep every line where it was: type syntax becomes spaces, so columns hold too; what must
 * be added (an enum's object, `return (`) is put on the line it stands for. Why tree-sitter:
 * a real TypeScript grammar from a registry package, loaded by Debian's library, in C, tens
 * of microseconds for a one-line cell (~0.4 ms for 30 lines: bench/js.c); a regex stripper breaks
 * on generics against comparisons, and the TypeScript compiler itself would need a second
 * JavaScript engine. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <tree_sitter/api.h>

#include "js/js-internal.h"

const TSLanguage *tree_sitter_typescript(void);

enum action {
    A_NONE = 0,
    A_BLANK,      /* pure type syntax: spaces */
    A_AS,         /* `e as T`, `e satisfies T`: blank from the keyword on */
    A_NONNULL,    /* `e!`: blank the `!` */
    A_ENUM,       /* an object in its place */
    A_IMPORT,     /* type-only imports and specifiers */
    A_EXPORT,     /* type-only exports */
    A_PARAM,      /* `this` params, readonly, `?` */
    A_FIELD,      /* declare/abstract fields, readonly, `?`, `!` */
    A_DECLARATOR, /* `let x!: T` */
    A_ABSTRACT,   /* abstract class */
    A_METHOD,     /* optional methods, constructor parameter properties */
    A_NAMESPACE,  /* an object filled by a function, as TypeScript emits it */
};

static const struct {
    const char *name;
    enum action action;
} action_names[] = {
    {"interface_declaration", A_BLANK},
    {"type_alias_declaration", A_BLANK},
    {"type_annotation", A_BLANK},
    {"omitting_type_annotation", A_BLANK},
    {"opting_type_annotation", A_BLANK},
    {"adding_type_annotation", A_BLANK},
    {"asserts_annotation", A_BLANK},
    {"type_predicate_annotation", A_BLANK},
    {"type_parameters", A_BLANK},
    {"type_arguments", A_BLANK},
    {"implements_clause", A_BLANK},
    {"ambient_declaration", A_BLANK},
    {"function_signature", A_BLANK},
    {"abstract_method_signature", A_BLANK},
    {"method_signature", A_BLANK},
    {"index_signature", A_BLANK},
    {"accessibility_modifier", A_BLANK},
    {"override_modifier", A_BLANK},
    {"hash_bang_line", A_BLANK}, /* `#!...` is only valid first in a file, not in a wrapper */
    {"as_expression", A_AS},
    {"satisfies_expression", A_AS},
    {"non_null_expression", A_NONNULL},
    {"enum_declaration", A_ENUM},
    {"import_statement", A_IMPORT},
    {"export_statement", A_EXPORT},
    {"required_parameter", A_PARAM},
    {"optional_parameter", A_PARAM},
    {"public_field_definition", A_FIELD},
    {"variable_declarator", A_DECLARATOR},
    {"abstract_class_declaration", A_ABSTRACT},
    {"method_definition", A_METHOD},
    {"internal_module", A_NAMESPACE},
    {"module", A_NAMESPACE},
};

static const TSLanguage *lang;
static unsigned char *actions; /* by symbol */
static uint32_t n_symbols;
static pthread_once_t actions_once = PTHREAD_ONCE_INIT;

static void actions_init(void)
{
    lang = tree_sitter_typescript();
    n_symbols = ts_language_symbol_count(lang);
    actions = calloc(n_symbols, 1);
    if (!actions)
        return;
    for (uint32_t sym = 0; sym < n_symbols; sym++) {
        if (ts_language_symbol_type(lang, (TSSymbol)sym) != TSSymbolTypeRegular)
            continue;
        const char *name = ts_language_symbol_name(lang, (TSSymbol)sym);
        for (size_t i = 0; i < sizeof(action_names) / sizeof(action_names[0]); i++)
            if (strcmp(name, action_names[i].name) == 0)
                actions[sym] = (unsigned char)action_names[i].action;
    }
}

static enum action action_of(TSNode n)
{
    TSSymbol sym = ts_node_symbol(n);
    return sym < n_symbols ? (enum action)actions[sym] : A_NONE;
}

/* One edit: bytes [start, end) become @text (NULL: spaces, newlines kept). A replacement
 * also keeps the range's newlines its text lacks, so the lines after it hold. */
struct edit {
    uint32_t start, end;
    char *text;
};

struct tx {
    const char *src;
    size_t len;
    bool repl;
    struct edit *edits;
    size_t n, cap;
    char **globals;
    size_t n_globals, cap_globals;
    struct conch_sb prefix; /* REPL: run first inside the wrapper (functions to globals) */
    uint32_t import_line;   /* REPL: the first line with an import statement, or 0 */
    bool oom;
};

static void add_edit(struct tx *t, uint32_t start, uint32_t end, const char *text)
{
    if (t->oom)
        return;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 32;
        struct edit *e = realloc(t->edits, cap * sizeof(*e));
        if (!e) {
            t->oom = true;
            return;
        }
        t->edits = e;
        t->cap = cap;
    }
    char *copy = NULL;
    if (text && !(copy = strdup(text))) {
        t->oom = true;
        return;
    }
    t->edits[t->n++] = (struct edit){.start = start, .end = end, .text = copy};
}

static void blank(struct tx *t, TSNode n)
{
    add_edit(t, ts_node_start_byte(n), ts_node_end_byte(n), NULL);
}

static void add_global(struct tx *t, const char *s, size_t len)
{
    if (t->oom)
        return;
    for (size_t i = 0; i < t->n_globals; i++)
        if (strlen(t->globals[i]) == len && memcmp(t->globals[i], s, len) == 0)
            return;
    if (t->n_globals == t->cap_globals) {
        size_t cap = t->cap_globals ? t->cap_globals * 2 : 8;
        char **g = realloc(t->globals, cap * sizeof(*g));
        if (!g) {
            t->oom = true;
            return;
        }
        t->globals = g;
        t->cap_globals = cap;
    }
    if (!(t->globals[t->n_globals] = strndup(s, len))) {
        t->oom = true;
        return;
    }
    t->n_globals++;
}

static bool is_token(TSNode n, const char *tok)
{
    return !ts_node_is_named(n) && strcmp(ts_node_type(n), tok) == 0;
}

static bool is_type(TSNode n, const char *type)
{
    return !ts_node_is_null(n) && strcmp(ts_node_type(n), type) == 0;
}

/* @n's children (only the named ones if @named) in a new array (caller frees), by a cursor:
 * ts_node_child(n, i) walks i siblings each time, so a loop over it is quadratic in the child
 * count (a cell of 100,000 statements). NULL with *@ret_n 0 if none, or out of memory. */
static TSNode *kids(struct tx *t, TSNode n, bool named, uint32_t *ret_n)
{
    uint32_t cap = named ? ts_node_named_child_count(n) : ts_node_child_count(n), k = 0;
    *ret_n = 0;
    if (!cap)
        return NULL;
    TSNode *v = malloc(cap * sizeof(*v));
    if (!v) {
        t->oom = true;
        return NULL;
    }
    TSTreeCursor c = ts_tree_cursor_new(n);
    if (ts_tree_cursor_goto_first_child(&c)) {
        do {
            TSNode x = ts_tree_cursor_current_node(&c);
            if ((!named || ts_node_is_named(x)) && k < cap)
                v[k++] = x;
        } while (ts_tree_cursor_goto_next_sibling(&c));
    }
    ts_tree_cursor_delete(&c);
    *ret_n = k;
    return v;
}

/* Blank @n's direct anonymous children spelled like one of @toks (NULL-terminated). */
static bool blank_tokens(struct tx *t, TSNode n, const char *const *toks)
{
    bool any = false;
    uint32_t count = ts_node_child_count(n);
    for (uint32_t i = 0; i < count; i++) {
        TSNode c = ts_node_child(n, i);
        for (const char *const *k = toks; *k; k++)
            if (is_token(c, *k)) {
                blank(t, c);
                any = true;
            }
    }
    return any;
}

static bool has_token(TSNode n, const char *tok)
{
    uint32_t count = ts_node_child_count(n);
    for (uint32_t i = 0; i < count; i++)
        if (is_token(ts_node_child(n, i), tok))
            return true;
    return false;
}

static const char *text_of(struct tx *t, TSNode n, size_t *ret_len)
{
    *ret_len = ts_node_end_byte(n) - ts_node_start_byte(n);
    return t->src + ts_node_start_byte(n);
}

/* `enum E { A, B = 5, C }` → `var E = (function (E) {let __conch_v = -1; ...; return E;
 * })({});` laid over the enum's own lines: a member's code on its line. Members are also
 * consts inside, so an initializer may name an earlier member, as TypeScript allows. */
static void do_enum(struct tx *t, TSNode n, bool top)
{
    TSNode name = ts_node_child_by_field_name(n, "name", 4);
    TSNode body = ts_node_child_by_field_name(n, "body", 4);
    if (ts_node_is_null(name) || ts_node_is_null(body))
        return;
    size_t nlen;
    const char *nm = text_of(t, name, &nlen);
    struct conch_sb b = {0};
    conch_sb_printf(&b, "%s%.*s = (function (%.*s) {let __conch_v = -1;",
                    top && t->repl ? ";" : "var ", (int)nlen, nm, (int)nlen, nm);
    add_edit(t, ts_node_start_byte(n), ts_node_start_byte(body) + 1, b.buf);
    conch_sb_done(&b);
    if (top && t->repl)
        add_global(t, nm, nlen);
    uint32_t count;
    TSNode *members = kids(t, body, false, &count);
    for (uint32_t i = 0; i < count; i++) {
        TSNode m = members[i];
        if (is_token(m, ",")) {
            blank(t, m);
            continue;
        }
        if (!ts_node_is_named(m) || is_type(m, "comment"))
            continue;
        TSNode key = m, value = {0};
        if (is_type(m, "enum_assignment")) {
            key = ts_node_child_by_field_name(m, "name", 4);
            value = ts_node_child_by_field_name(m, "value", 5);
        }
        size_t klen, vlen = 0;
        const char *k = text_of(t, key, &klen), *v = NULL;
        if (!ts_node_is_null(value))
            v = text_of(t, value, &vlen);
        bool ident = is_type(key, "property_identifier");
        if (v)
            conch_sb_printf(&b, "__conch_v = (%.*s);", (int)vlen, v);
        else
            conch_sb_puts(&b, "__conch_v += 1;");
        if (ident)
            conch_sb_printf(&b,
                            "const %.*s = __conch_v;%.*s[\"%.*s\"] = __conch_v;if (typeof "
                            "__conch_v !== \"string\") %.*s[__conch_v] = \"%.*s\";",
                            (int)klen, k, (int)nlen, nm, (int)klen, k, (int)nlen, nm, (int)klen, k);
        else if (is_type(key, "string"))
            conch_sb_printf(&b,
                            "%.*s[%.*s] = __conch_v;if (typeof __conch_v !== \"string\") "
                            "%.*s[__conch_v] = %.*s;",
                            (int)nlen, nm, (int)klen, k, (int)nlen, nm, (int)klen, k);
        if (b.oom)
            t->oom = true;
        add_edit(t, ts_node_start_byte(m), ts_node_end_byte(m), b.buf ? b.buf : "");
        conch_sb_done(&b);
    }
    free(members);
    conch_sb_printf(&b, "return %.*s;})({});", (int)nlen, nm);
    add_edit(t, ts_node_end_byte(body) - 1, ts_node_end_byte(n), b.buf);
    conch_sb_done(&b);
}

/* `constructor(private x: number)` → `this.x = x;` first in the body (after a leading
 * super(...) call, which must come first). */
static void do_constructor(struct tx *t, TSNode method)
{
    TSNode name = ts_node_child_by_field_name(method, "name", 4);
    size_t len = 0;
    const char *s = ts_node_is_null(name) ? "" : text_of(t, name, &len);
    if (ts_node_is_null(name) || len != 11 || memcmp(s, "constructor", 11) != 0)
        return;
    TSNode params = ts_node_child_by_field_name(method, "parameters", 10);
    TSNode body = ts_node_child_by_field_name(method, "body", 4);
    if (ts_node_is_null(params) || ts_node_is_null(body))
        return;
    struct conch_sb b = {0};
    uint32_t count;
    TSNode *ps = kids(t, params, true, &count);
    for (uint32_t i = 0; i < count; i++) {
        TSNode p = ps[i];
        bool prop = has_token(p, "readonly");
        for (uint32_t j = 0; j < ts_node_named_child_count(p); j++)
            if (is_type(ts_node_named_child(p, j), "accessibility_modifier"))
                prop = true;
        TSNode pat = ts_node_child_by_field_name(p, "pattern", 7);
        if (prop && is_type(pat, "identifier")) {
            const char *id = text_of(t, pat, &len);
            conch_sb_printf(&b, "this.%.*s = %.*s;", (int)len, id, (int)len, id);
        }
    }
    free(ps);
    if (!b.len)
        return;
    uint32_t at = ts_node_start_byte(body) + 1;
    TSNode first = ts_node_named_child(body, 0);
    if (is_type(first, "expression_statement")) {
        TSNode call = ts_node_named_child(first, 0);
        if (is_type(call, "call_expression") &&
            is_type(ts_node_child_by_field_name(call, "function", 8), "super"))
            at = ts_node_end_byte(first);
    }
    if (b.oom)
        t->oom = true;
    add_edit(t, at, at, b.buf);
    conch_sb_done(&b);
}

static bool at_top(struct tx *t, TSNode n);
static void do_namespace(struct tx *t, TSNode n, bool top);

/* Decide what to do with @n; returns whether to walk into its children. */
static bool visit(struct tx *t, TSNode n)
{
    static const char *const readonly_q[] = {"readonly", "?", NULL};
    static const char *const field_marks[] = {"readonly", "?", "!", NULL};
    static const char *const bang[] = {"!", NULL};
    static const char *const question[] = {"?", NULL};
    static const char *const abstract[] = {"abstract", NULL};
    switch (action_of(n)) {
    case A_NONE:
        return true;
    case A_BLANK:
        blank(t, n);
        return false;
    case A_AS: {
        uint32_t count = ts_node_child_count(n);
        for (uint32_t i = 1; i < count; i++) {
            TSNode c = ts_node_child(n, i);
            if (is_token(c, "as") || is_token(c, "satisfies")) {
                add_edit(t, ts_node_start_byte(c), ts_node_end_byte(n), NULL);
                break;
            }
        }
        return true;
    }
    case A_NONNULL: {
        uint32_t count = ts_node_child_count(n);
        TSNode last = ts_node_child(n, count - 1);
        if (count > 1 && is_token(last, "!"))
            blank(t, last);
        return true;
    }
    case A_ENUM:
        /* A REPL cell's top-level enum is a global: repl_statement makes it. */
        if (!at_top(t, n))
            do_enum(t, n, false);
        return false;
    case A_IMPORT:
        if (has_token(n, "type")) {
            blank(t, n);
            return false;
        }
        return true;
    case A_EXPORT: {
        TSNode decl = ts_node_child_by_field_name(n, "declaration", 11);
        if (has_token(n, "type") || (!ts_node_is_null(decl) && action_of(decl) == A_BLANK)) {
            blank(t, n);
            return false;
        }
        return true;
    }
    case A_PARAM: {
        TSNode pat = ts_node_child_by_field_name(n, "pattern", 7);
        if (is_type(pat, "this")) {
            blank(t, n);
            TSNode comma = ts_node_next_sibling(n);
            if (!ts_node_is_null(comma) && is_token(comma, ","))
                blank(t, comma);
            return false;
        }
        blank_tokens(t, n, readonly_q);
        return true;
    }
    case A_FIELD:
        if (has_token(n, "declare") || has_token(n, "abstract")) {
            blank(t, n);
            return false;
        }
        blank_tokens(t, n, field_marks);
        return true;
    case A_DECLARATOR:
        blank_tokens(t, n, bang);
        return true;
    case A_ABSTRACT:
        blank_tokens(t, n, abstract);
        return true;
    case A_METHOD:
        blank_tokens(t, n, question);
        do_constructor(t, n);
        return true;
    case A_NAMESPACE:
        if (!at_top(t, n))
            do_namespace(t, n, false);
        return true;
    }
    return true;
}

/* The names a binding pattern declares (not its defaults, not its keys), down to a depth no
 * real pattern reaches (deeper names are not predeclared: assigning them still works in
 * sloppy code). */
static void collect_names_at(struct tx *t, TSNode n, int depth)
{
    if (depth > 200)
        return;
    const char *type = ts_node_type(n);
    size_t len;
    if (strcmp(type, "identifier") == 0 ||
        strcmp(type, "shorthand_property_identifier_pattern") == 0) {
        const char *s = text_of(t, n, &len);
        add_global(t, s, len);
    } else if (strcmp(type, "pair_pattern") == 0) {
        collect_names_at(t, ts_node_child_by_field_name(n, "value", 5), depth + 1);
    } else if (strcmp(type, "assignment_pattern") == 0 ||
               strcmp(type, "object_assignment_pattern") == 0) {
        collect_names_at(t, ts_node_child_by_field_name(n, "left", 4), depth + 1);
    } else if (strcmp(type, "object_pattern") == 0 || strcmp(type, "array_pattern") == 0 ||
               strcmp(type, "rest_pattern") == 0) {
        uint32_t count;
        TSNode *v = kids(t, n, true, &count);
        for (uint32_t i = 0; i < count; i++)
            collect_names_at(t, v[i], depth + 1);
        free(v);
    }
}

static void collect_names(struct tx *t, TSNode n)
{
    collect_names_at(t, n, 0);
}

/* Whether @n stands at a REPL cell's top level (itself, or in an expression statement or an
 * export there): repl_statement handles those. */
static bool at_top(struct tx *t, TSNode n)
{
    if (!t->repl)
        return false;
    TSNode p = ts_node_parent(n);
    if (is_type(p, "expression_statement") || is_type(p, "export_statement"))
        p = ts_node_parent(p);
    return is_type(p, "program");
}

/* `namespace N { export const a = 1; }` → `var N = N || {};(function (N) { const a = 1;N.a = a;
 * })(N);` on the same lines: exports are copied onto the object after their declaration.
 * Dotted and quoted names are left alone (the engine then reports them). */
static void do_namespace(struct tx *t, TSNode n, bool top)
{
    TSNode name = ts_node_child_by_field_name(n, "name", 4);
    TSNode body = ts_node_child_by_field_name(n, "body", 4);
    if (!is_type(name, "identifier") || ts_node_is_null(body))
        return;
    size_t nlen;
    const char *nm = text_of(t, name, &nlen);
    struct conch_sb b = {0};
    conch_sb_printf(&b, "%s%.*s = %.*s || {};(function (%.*s) {", top ? ";" : "var ", (int)nlen, nm,
                    (int)nlen, nm, (int)nlen, nm);
    add_edit(t, ts_node_start_byte(n), ts_node_start_byte(body) + 1, b.buf);
    conch_sb_done(&b);
    if (top)
        add_global(t, nm, nlen);
    uint32_t count;
    TSNode *sts = kids(t, body, true, &count);
    for (uint32_t i = 0; i < count; i++) {
        TSNode st = sts[i];
        TSNode decl = ts_node_child_by_field_name(st, "declaration", 11);
        if (!is_type(st, "export_statement") || ts_node_is_null(decl) ||
            action_of(decl) == A_BLANK || has_token(st, "type"))
            continue;
        add_edit(t, ts_node_start_byte(st), ts_node_start_byte(decl), NULL);
        /* The names it declares, collected aside from the cell's globals. */
        char **saved = t->globals;
        size_t saved_n = t->n_globals, saved_cap = t->cap_globals;
        t->globals = NULL;
        t->n_globals = t->cap_globals = 0;
        if (is_type(decl, "lexical_declaration") || is_type(decl, "variable_declaration")) {
            uint32_t nd;
            TSNode *ds = kids(t, decl, true, &nd);
            for (uint32_t j = 0; j < nd; j++)
                if (is_type(ds[j], "variable_declarator"))
                    collect_names(t, ts_node_child_by_field_name(ds[j], "name", 4));
            free(ds);
        } else {
            TSNode dn = ts_node_child_by_field_name(decl, "name", 4);
            if (is_type(dn, "identifier") || is_type(dn, "type_identifier")) {
                size_t l;
                const char *x = text_of(t, dn, &l);
                add_global(t, x, l);
            }
        }
        for (size_t k = 0; k < t->n_globals; k++) {
            conch_sb_printf(&b, ";%.*s.%s = %s;", (int)nlen, nm, t->globals[k], t->globals[k]);
            free(t->globals[k]);
        }
        free(t->globals);
        t->globals = saved;
        t->n_globals = saved_n;
        t->cap_globals = saved_cap;
        if (b.oom)
            t->oom = true;
        if (b.len)
            add_edit(t, ts_node_end_byte(decl), ts_node_end_byte(decl), b.buf);
        conch_sb_done(&b);
    }
    free(sts);
    conch_sb_printf(&b, "})(%.*s);", (int)nlen, nm);
    add_edit(t, ts_node_end_byte(body) - 1, ts_node_end_byte(n), b.buf);
    conch_sb_done(&b);
}

/* A top-level statement of a REPL cell: declarations become globals. */
static void repl_statement(struct tx *t, TSNode st)
{
    const char *type = ts_node_type(st);
    size_t len;
    if (strcmp(type, "import_statement") == 0 && !has_token(st, "type")) {
        /* A cell is a script: the engine would only say "expecting '('". Fail before
         * anything runs, saying why. */
        if (!t->import_line)
            t->import_line = ts_node_start_point(st).row + 1;
        blank(t, st);
        return;
    }
    if (strcmp(type, "export_statement") == 0) {
        TSNode decl = ts_node_child_by_field_name(st, "declaration", 11);
        if (ts_node_is_null(decl) || action_of(decl) == A_BLANK || has_token(st, "type"))
            return;
        add_edit(t, ts_node_start_byte(st), ts_node_start_byte(decl), NULL);
        repl_statement(t, decl);
        return;
    }
    if (strcmp(type, "lexical_declaration") == 0 || strcmp(type, "variable_declaration") == 0) {
        /* `const a = 1, {b} = o;` → `;(    a = 1, {b} = o);`: the leading `;` keeps a
         * previous line without one from calling the parenthesis. */
        TSNode kw = ts_node_child(st, 0);
        uint32_t kwlen = ts_node_end_byte(kw) - ts_node_start_byte(kw);
        char head[16] = ";(";
        for (uint32_t i = 2; i < kwlen && i < sizeof(head) - 1; i++)
            head[i] = ' ';
        head[kwlen < 2 ? 2 : (kwlen < sizeof(head) ? kwlen : sizeof(head) - 1)] = '\0';
        add_edit(t, ts_node_start_byte(kw), ts_node_end_byte(kw), head);
        uint32_t count, last_end = 0;
        TSNode *ds = kids(t, st, true, &count);
        for (uint32_t i = 0; i < count; i++) {
            TSNode d = ds[i];
            if (!is_type(d, "variable_declarator"))
                continue;
            collect_names(t, ts_node_child_by_field_name(d, "name", 4));
            if (ts_node_is_null(ts_node_child_by_field_name(d, "value", 5)))
                add_edit(t, ts_node_end_byte(d), ts_node_end_byte(d), " = undefined");
            last_end = ts_node_end_byte(d);
        }
        free(ds);
        if (last_end)
            add_edit(t, last_end, last_end, ")");
        return;
    }
    if (strcmp(type, "function_declaration") == 0 ||
        strcmp(type, "generator_function_declaration") == 0) {
        TSNode name = ts_node_child_by_field_name(st, "name", 4);
        if (!ts_node_is_null(name)) {
            const char *s = text_of(t, name, &len);
            conch_sb_printf(&t->prefix, "globalThis.%.*s = %.*s;", (int)len, s, (int)len, s);
        }
        return;
    }
    if (strcmp(type, "class_declaration") == 0 || strcmp(type, "abstract_class_declaration") == 0) {
        TSNode name = ts_node_child_by_field_name(st, "name", 4);
        if (!ts_node_is_null(name)) {
            struct conch_sb b = {0};
            const char *s = text_of(t, name, &len);
            conch_sb_printf(&b, ";globalThis.%.*s = %.*s;", (int)len, s, (int)len, s);
            if (b.oom)
                t->oom = true;
            add_edit(t, ts_node_end_byte(st), ts_node_end_byte(st), b.buf);
            conch_sb_done(&b);
        }
        return;
    }
    if (strcmp(type, "enum_declaration") == 0)
        do_enum(t, st, true);
    if (strcmp(type, "internal_module") == 0 || strcmp(type, "module") == 0)
        do_namespace(t, st, true);
    if (strcmp(type, "expression_statement") == 0) {
        TSNode e = ts_node_named_child(st, 0);
        if (is_type(e, "internal_module") || is_type(e, "module"))
            do_namespace(t, e, true);
    }
}

static int cmp_edit(const void *a, const void *b)
{
    const struct edit *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    bool xe = x->start == x->end, ye = y->start == y->end;
    if (xe != ye)
        return xe ? -1 : 1; /* insertions before a range that starts there */
    if (x->end != y->end)
        return x->end > y->end ? -1 : 1; /* the outer range first: it covers the inner */
    return 0;
}

static size_t count_nl(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

static void apply_edits(struct tx *t, struct conch_sb *out)
{
    if (t->n)
        qsort(t->edits, t->n, sizeof(*t->edits), cmp_edit);
    size_t at = 0;
    for (size_t i = 0; i < t->n; i++) {
        struct edit *e = &t->edits[i];
        if (e->start < at)
            continue; /* inside a range already replaced */
        conch_sb_putn(out, t->src + at, e->start - at);
        if (e->text) {
            conch_sb_puts(out, e->text);
            size_t want = count_nl(t->src + e->start, e->end - e->start),
                   have = count_nl(e->text, strlen(e->text));
            for (; have < want; have++)
                conch_sb_putn(out, "\n", 1);
        } else {
            for (uint32_t k = e->start; k < e->end; k++)
                conch_sb_putn(out, t->src[k] == '\n' ? "\n" : " ", 1);
        }
        at = e->end;
    }
    conch_sb_putn(out, t->src + at, t->len - at);
}

void conch_js_code_done(struct conch_js_code *c)
{
    free(c->text);
    for (size_t i = 0; i < c->n_globals; i++)
        free(c->globals[i]);
    free(c->globals);
    memset(c, 0, sizeof(*c));
}

static void tx_done(struct tx *t)
{
    for (size_t i = 0; i < t->n; i++)
        free(t->edits[i].text);
    free(t->edits);
    for (size_t i = 0; i < t->n_globals; i++)
        free(t->globals[i]);
    free(t->globals);
    conch_sb_done(&t->prefix);
}

static int as_given(const char *src, size_t len, struct conch_js_code *ret, struct conch_err *err)
{
    memset(ret, 0, sizeof(*ret));
    if (!(ret->text = malloc(len + 1)))
        return conch_err_set(err, ENOMEM, "copy the script: out of memory");
    memcpy(ret->text, src, len);
    ret->text[len] = '\0';
    ret->len = len;
    return 0;
}

int conch_js_transform(const char *src, size_t len, bool repl, struct conch_js_code *ret,
                       struct conch_err *err)
{
    pthread_once(&actions_once, actions_init);
    if (!actions)
        return conch_err_set(err, ENOMEM, "load the TypeScript grammar: out of memory");
    /* The parse is not interruptible and its tree takes ~50 bytes a token: a cell past
     * CONCH_JS_MAX_STRIP is not stripped (it runs as plain JavaScript). */
    if (len > CONCH_JS_MAX_STRIP)
        return as_given(src, len, ret, err);
    TSParser *parser = ts_parser_new();
    if (!parser || !ts_parser_set_language(parser, lang)) {
        ts_parser_delete(parser);
        return conch_err_set(err, ENOMEM,
                             "start the TypeScript parser: out of memory or a "
                             "grammar ABI libtree-sitter does not support");
    }
    TSTree *tree = ts_parser_parse_string(parser, NULL, src, (uint32_t)len);
    ts_parser_delete(parser);
    if (!tree)
        return as_given(src, len, ret, err);
    TSNode root = ts_tree_root_node(tree);
    if (ts_node_has_error(root)) {
        ts_tree_delete(tree);
        return as_given(src, len, ret, err);
    }
    struct tx t = {.src = src, .len = len, .repl = repl};
    TSTreeCursor cur = ts_tree_cursor_new(root);
    for (;;) {
        TSNode n = ts_tree_cursor_current_node(&cur);
        if (visit(&t, n) && ts_tree_cursor_goto_first_child(&cur))
            continue;
        bool more = true;
        while (!ts_tree_cursor_goto_next_sibling(&cur))
            if (!ts_tree_cursor_goto_parent(&cur)) {
                more = false;
                break;
            }
        if (!more)
            break;
    }
    ts_tree_cursor_delete(&cur);
    if (repl) {
        uint32_t count;
        TSNode last = {0};
        TSNode *sts = kids(&t, root, true, &count);
        for (uint32_t i = 0; i < count; i++) {
            TSNode st = sts[i];
            if (is_type(st, "comment") || is_type(st, "hash_bang_line"))
                continue;
            repl_statement(&t, st);
            last = st;
        }
        free(sts);
        TSNode e = ts_node_is_null(last) ? last : ts_node_named_child(last, 0);
        if (is_type(last, "expression_statement") && !is_type(e, "internal_module") &&
            !is_type(e, "module")) {
            add_edit(&t, ts_node_start_byte(e), ts_node_start_byte(e), "return (");
            add_edit(&t, ts_node_end_byte(e), ts_node_end_byte(e), ")");
        }
    }
    ts_tree_delete(tree);
    struct conch_sb out = {0};
    if (repl) {
        conch_sb_puts(&out, "(async () => {");
        if (t.import_line)
            conch_sb_printf(&out,
                            "throw new SyntaxError('line %u: a cell cannot import modules (it is "
                            "a script with no module loader): use readFile, writeFile and "
                            "tools.<name>');",
                            t.import_line);
        if (t.prefix.len)
            conch_sb_putn(&out, t.prefix.buf, t.prefix.len);
    }
    if (!t.oom)
        apply_edits(&t, &out);
    if (repl)
        conch_sb_puts(&out, "\n})()");
    if (t.oom || t.prefix.oom || out.oom) {
        conch_sb_done(&out);
        tx_done(&t);
        return conch_err_set(err, ENOMEM, "strip the script's types: out of memory");
    }
    memset(ret, 0, sizeof(*ret));
    ret->len = out.len;
    ret->text = conch_sb_take(&out);
    if (!ret->text && (ret->text = strdup("")) == NULL) {
        tx_done(&t);
        return conch_err_set(err, ENOMEM, "strip the script's types: out of memory");
    }
    ret->parsed = true;
    ret->globals = t.globals;
    ret->n_globals = t.n_globals;
    t.globals = NULL;
    t.n_globals = 0;
    tx_done(&t);
    return 0;
}

int conch_js_strip_types(const char *src, size_t len, char **ret_out, size_t *ret_len,
                         struct conch_err *err)
{
    struct conch_js_code c;
    int r = conch_js_transform(src, len, false, &c, err);
    if (r < 0)
        return r;
    *ret_out = c.text;
    if (ret_len)
        *ret_len = c.len;
    c.text = NULL;
    bool parsed = c.parsed;
    conch_js_code_done(&c);
    return parsed ? 1 : 0;
}
