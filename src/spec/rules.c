/* rules.c - path rules of a sandbox's workspace (issue 18): read-only subpaths and hidden
 * paths, written as paths relative to the workspace (conch run --readonly/--hidden,
 * sandbox.create "readonly"/"hidden"), normalised and checked here once for every way in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spec/spec.h"

const char *conch_rule_kind_name(enum conch_rule_kind kind)
{
    return kind == CONCH_RULE_HIDDEN ? "hidden" : "readonly";
}

int conch_rule_path_normalize(const char *in, char *out, size_t size, struct conch_err *err)
{
    size_t n = strlen(in), o = 0;
    if (n >= CONCH_SPEC_RULE_PATH_MAX || size < CONCH_SPEC_RULE_PATH_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG,
                              "path rule '%.64s...': at most %d bytes", in,
                              CONCH_SPEC_RULE_PATH_MAX - 1);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)in[i] < 0x20 || in[i] == 0x7f)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "path rule: a control character in the path is refused");
    if (in[0] == '/')
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "path rule '%s': a path relative to the workspace is needed (e.g. "
                              "'.git/hooks'), not an absolute one",
                              in);
    for (const char *c = in; *c;) {
        const char *e = strchr(c, '/');
        size_t len = e ? (size_t)(e - c) : strlen(c);
        if (len == 2 && c[0] == '.' && c[1] == '.')
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "path rule '%s': '..' components are refused", in);
        if (len > 0 && !(len == 1 && c[0] == '.')) {
            if (o)
                out[o++] = '/';
            memcpy(out + o, c, len);
            o += len;
        }
        if (!e)
            break;
        c = e + 1;
    }
    out[o] = '\0';
    if (o == 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "path rule '%s' names the whole workspace (use the mode ro for a "
                              "read-only workspace)",
                              in);
    return 0;
}

/* @path is @dir or lies beneath it. */
static bool at_or_under(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

int conch_spec_add_rule(struct conch_sandbox_spec *s, enum conch_rule_kind kind, const char *path,
                        struct conch_err *err)
{
    struct conch_path_rule r = {.kind = kind};
    int e = conch_rule_path_normalize(path, r.path, sizeof(r.path), err);
    if (e < 0)
        return e;
    for (unsigned i = 0; i < s->n_rules; i++) {
        const struct conch_path_rule *o = &s->rules[i];
        if (!strcmp(o->path, r.path) && o->kind == kind)
            return 0;
        if (!strcmp(o->path, r.path))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "path rule '%s' is both read-only and hidden", r.path);
        if ((o->kind == CONCH_RULE_HIDDEN && at_or_under(r.path, o->path)) ||
            (kind == CONCH_RULE_HIDDEN && at_or_under(o->path, r.path)))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "path rule '%s' lies beneath the hidden path '%s', which the "
                                  "sandbox cannot see",
                                  kind == CONCH_RULE_HIDDEN ? o->path : r.path,
                                  kind == CONCH_RULE_HIDDEN ? r.path : o->path);
    }
    if (s->n_rules >= CONCH_SPEC_RULES_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, E2BIG, "at most %d path rules",
                              CONCH_SPEC_RULES_MAX);
    struct conch_path_rule *n = reallocarray(s->rules, s->n_rules + 1, sizeof(*n));
    if (!n)
        return conch_err_set(err, ENOMEM, "out of memory");
    s->rules = n;
    s->rules[s->n_rules++] = r;
    return 0;
}

int conch_spec_rules_from_json(struct conch_sandbox_spec *s, enum conch_rule_kind kind, json_t *arr,
                               struct conch_err *err)
{
    const char *key = conch_rule_kind_name(kind);
    if (!json_is_array(arr))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s must be an array of paths relative to the workspace", key);
    size_t i;
    json_t *v;
    json_array_foreach(arr, i, v)
    {
        /* An embedded NUL would make the path we check another than the one sent. */
        if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                  "%s must be an array of paths relative to the workspace", key);
        int r = conch_spec_add_rule(s, kind, json_string_value(v), err);
        if (r < 0)
            return r;
    }
    return 0;
}

json_t *conch_spec_rules_to_json(const struct conch_path_rule *rules, unsigned n,
                                 enum conch_rule_kind kind)
{
    json_t *arr = json_array();
    for (unsigned i = 0; arr && i < n; i++)
        if (rules[i].kind == kind && json_array_append_new(arr, json_string(rules[i].path)) < 0) {
            json_decref(arr);
            return NULL;
        }
    return arr;
}
