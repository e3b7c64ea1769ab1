/* spec.c - the sandbox spec: its one set of defaults, and one table of fields that both the
 * JSON params (sandbox.create) and the command line (conch run, create, mcp) are read by. */
#include "spec/spec.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/cleanup.h"
#include "core/fsutil.h"

int conch_ws_mode_parse(const char *s, enum conch_ws_mode *ret, struct conch_err *err)
{
    static const struct {
        const char *name;
        enum conch_ws_mode mode;
    } table[] = {
        {"overlay", CONCH_WS_OVERLAY},
        {"ro", CONCH_WS_RO},
        {"rw", CONCH_WS_RW},
    };
    for (size_t i = 0; s && i < ARRAY_SIZE(table); i++) {
        if (strcmp(s, table[i].name) == 0) {
            *ret = table[i].mode;
            return 0;
        }
    }
    return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                          "invalid workspace mode '%s' (expected overlay, ro or rw)",
                          s ? s : "(null)");
}

const char *conch_ws_mode_name(enum conch_ws_mode mode)
{
    switch (mode) {
    case CONCH_WS_OVERLAY:
        return "overlay";
    case CONCH_WS_RO:
        return "ro";
    case CONCH_WS_RW:
        return "rw";
    }
    return "unknown";
}

void conch_spec_defaults(struct conch_sandbox_spec *s)
{
    memset(s, 0, sizeof(*s));
    s->mode = CONCH_WS_OVERLAY;
    s->tmp_bytes = CONCH_SPEC_TMP_DEFAULT;
    s->home_bytes = CONCH_SPEC_HOME_DEFAULT;
    s->disk_bytes = CONCH_SPEC_DISK_DEFAULT;
    s->idle_timeout = -1;
}

void conch_spec_done(struct conch_sandbox_spec *s)
{
    json_decref(s->env);
    free(s->mounts);
    s->mounts = NULL;
    s->n_mounts = 0;
    free(s->rules);
    s->rules = NULL;
    s->n_rules = 0;
    free(s->sockets);
    s->sockets = NULL;
    s->n_sockets = 0;
    json_decref(s->allow);
    json_decref(s->deny);
    s->env = s->allow = s->deny = NULL;
}

int conch_spec_net_policy(const struct conch_sandbox_spec *s, struct conch_net_policy *ret,
                          struct conch_err *err)
{
    enum conch_net_mode mode = s->net;
    bool rules = json_array_size(s->allow) || json_array_size(s->deny);
    if (!s->net_given && json_array_size(s->allow))
        mode = CONCH_NET_ALLOW;
    if (rules && mode != CONCH_NET_ALLOW)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "allow and deny rules need the network mode 'allow' (it is '%s')",
                              conch_net_mode_name(mode));
    conch_net_policy_init(ret, mode);
    for (int deny = 0; deny < 2; deny++) {
        size_t i;
        json_t *v;
        json_array_foreach(deny ? s->deny : s->allow, i, v)
        {
            int r = conch_net_policy_add(ret, deny, json_string_value(v), err);
            if (r < 0) {
                conch_net_policy_done(ret);
                return r;
            }
        }
    }
    return 0;
}

/* ---- the fields ---- */

enum kind {
    K_PATH,    /* an absolute host directory */
    K_MODE,    /* overlay | ro | rw */
    K_BOOL,    /* a flag */
    K_ENV,     /* NAME=VALUE, repeatable / {"NAME": "value"} */
    K_STRING,  /* any string */
    K_SIZE,    /* bytes (64k, 512M, 4G on the command line); an integer in JSON */
    K_COUNT,   /* a whole number */
    K_CPUS,    /* a number of CPUs */
    K_SECONDS, /* a number of seconds */
    K_NET,     /* none | allow | host */
    K_RULES,   /* a network rule, repeatable / ["rule", ...] */
};

enum id {
    F_WORKSPACE,
    F_MODE,
    F_ROOTFS,
    F_AS_ROOT,
    F_ENV,
    F_MEMORY,
    F_PIDS,
    F_CPU,
    F_TMP,
    F_HOME,
    F_DISK,
    F_NAME,
    F_IDLE,
    F_TOOL_TIMEOUT,
    F_TOOL_CALLS,
    F_NET,
    F_ALLOW,
    F_DENY,
};

/* One field: its command-line option (NULL: none), its JSON key (NULL: none), and for
 * numbers the range of a value other than 0 (0 means none or the default), or with @zero_bad
 * a range that 0 is outside of. */
struct field {
    enum id id;
    const char *opt;
    unsigned bit;
    const char *key;
    enum kind kind;
    double min, max;
    bool zero_bad;
};

static const struct field fields[] = {
    {F_WORKSPACE, "workspace", CONCH_SPEC_OPT_WORKSPACE, "workspace", K_PATH, 0, 0, false},
    {F_MODE, "mode", CONCH_SPEC_OPT_MODE, "mode", K_MODE, 0, 0, false},
    {F_ROOTFS, "rootfs", CONCH_SPEC_OPT_ROOTFS, "rootfs", K_PATH, 0, 0, false},
    {F_AS_ROOT, "as-root", CONCH_SPEC_OPT_AS_ROOT, "as_root", K_BOOL, 0, 0, false},
    {F_ENV, "env", CONCH_SPEC_OPT_ENV, "env", K_ENV, 0, 0, false},
    {F_MEMORY, "memory", CONCH_SPEC_OPT_MEMORY, "memory", K_SIZE, CONCH_SPEC_MEMORY_MIN,
     CONCH_SPEC_MEMORY_MAX, false},
    {F_PIDS, "pids", CONCH_SPEC_OPT_PIDS, "pids", K_COUNT, CONCH_SPEC_PIDS_MIN, CONCH_SPEC_PIDS_MAX,
     false},
    {F_CPU, "cpu", CONCH_SPEC_OPT_CPU, "cpu", K_CPUS, CONCH_SPEC_CPU_MIN, CONCH_SPEC_CPU_MAX,
     false},
    {F_TMP, "tmp-size", CONCH_SPEC_OPT_TMP_SIZE, "tmp_size", K_SIZE, CONCH_SPEC_SIZE_MIN,
     CONCH_SPEC_TMP_MAX, false},
    {F_HOME, "home-size", CONCH_SPEC_OPT_HOME_SIZE, NULL, K_SIZE, CONCH_SPEC_SIZE_MIN,
     CONCH_SPEC_TMP_MAX, false},
    {F_DISK, "disk", CONCH_SPEC_OPT_DISK, "disk", K_SIZE, CONCH_SPEC_SIZE_MIN, CONCH_SPEC_DISK_MAX,
     false},
    {F_NAME, "name", CONCH_SPEC_OPT_NAME, "name", K_STRING, 0, 0, false},
    {F_IDLE, "idle-timeout", CONCH_SPEC_OPT_IDLE_TIMEOUT, "idle_timeout", K_SECONDS, 1,
     CONCH_SPEC_IDLE_MAX, false},
    {F_TOOL_TIMEOUT, NULL, 0, "tool_timeout", K_SECONDS, CONCH_SPEC_TOOL_TIMEOUT_MIN,
     CONCH_SPEC_TOOL_TIMEOUT_MAX, false},
    {F_TOOL_CALLS, NULL, 0, "max_tool_calls", K_COUNT, 1, CONCH_SPEC_TOOL_CALLS_MAX, true},
    {F_NET, "net", CONCH_SPEC_OPT_NET, "net", K_NET, 0, 0, false},
    {F_ALLOW, "allow", CONCH_SPEC_OPT_NET, "allow", K_RULES, 0, 0, false},
    {F_DENY, "deny", CONCH_SPEC_OPT_NET, "deny", K_RULES, 0, 0, false},
};

/* Add rule @text (checked) to @f's list of @s. */
static int add_rule(struct conch_sandbox_spec *s, const struct field *f, const char *text,
                    struct conch_err *err)
{
    struct conch_net_rule r;
    int rc = conch_net_rule_parse(text, &r, err);
    if (rc < 0)
        return rc;
    json_t **list = f->id == F_DENY ? &s->deny : &s->allow;
    if (!*list && !(*list = json_array()))
        return conch_err_set(err, ENOMEM, "out of memory");
    if (json_array_size(*list) >= CONCH_NET_RULES_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, E2BIG, "too many %s rules (at most %d)", f->key,
                              CONCH_NET_RULES_MAX);
    if (json_array_append_new(*list, json_string(text)) < 0)
        return conch_err_set(err, ENOMEM, "out of memory");
    return 0;
}

/* Store the number @v (in range) in @f's place; 0 means the default for sizes. */
static void store_number(struct conch_sandbox_spec *s, const struct field *f, double v)
{
    uint64_t u = v > 0 ? (uint64_t)v : 0;
    switch (f->id) {
    case F_MEMORY:
        s->limits.memory_bytes = u;
        break;
    case F_PIDS:
        s->limits.pids_max = u;
        break;
    case F_CPU:
        s->limits.cpu_millicpus = (uint64_t)llround(v * 1000.0);
        break;
    case F_TMP:
        s->tmp_bytes = u ? u : CONCH_SPEC_TMP_DEFAULT;
        break;
    case F_HOME:
        s->home_bytes = u ? u : CONCH_SPEC_HOME_DEFAULT;
        break;
    case F_DISK:
        s->disk_bytes = u ? u : CONCH_SPEC_DISK_DEFAULT;
        break;
    case F_IDLE:
        s->idle_timeout = v;
        break;
    case F_TOOL_TIMEOUT:
        s->tool_timeout = v;
        break;
    case F_TOOL_CALLS:
        s->max_tool_calls = (unsigned)u;
        break;
    default:
        break;
    }
}

static void store_string(struct conch_sandbox_spec *s, const struct field *f, const char *v)
{
    switch (f->id) {
    case F_WORKSPACE:
        s->workspace = v;
        break;
    case F_ROOTFS:
        s->rootfs = v;
        break;
    case F_NAME:
        s->name = v;
        break;
    default:
        break;
    }
}

static bool in_range(const struct field *f, double v)
{
    if (v == 0 && !f->zero_bad)
        return true;
    return v >= f->min && v <= f->max; /* false for NaN */
}

/* "%g" prints 1e+12: sizes and counts read better whole (as the RPC dispatcher prints them). */
static void fmt_bound(char *buf, size_t size, double v)
{
    if (v == (double)(long long)v && v > -1e18 && v < 1e18)
        snprintf(buf, size, "%lld", (long long)v);
    else
        snprintf(buf, size, "%g", v);
}

/* A size as the command line writes it: 64k, 1M, 64T. */
static void fmt_size(char *buf, size_t size, double v)
{
    static const char units[] = "kMGT";
    uint64_t u = (uint64_t)v;
    int i = -1;
    while (i < 3 && u >= 1024 && u % 1024 == 0) {
        u /= 1024;
        i++;
    }
    if (i < 0)
        snprintf(buf, size, "%llu", (unsigned long long)u);
    else
        snprintf(buf, size, "%llu%c", (unsigned long long)u, units[i]);
}

/* ---- JSON ---- */

static const char *kind_type_name(enum kind k)
{
    switch (k) {
    case K_PATH:
    case K_MODE:
    case K_STRING:
    case K_NET:
        return "a string";
    case K_RULES:
        return "an array of strings";
    case K_BOOL:
        return "a boolean";
    case K_ENV:
        return "an object";
    case K_SIZE:
    case K_COUNT:
        return "an integer";
    case K_CPUS:
    case K_SECONDS:
        break;
    }
    return "a number";
}

static bool json_type_ok(enum kind k, json_t *v)
{
    switch (k) {
    case K_PATH:
    case K_MODE:
    case K_STRING:
    case K_NET:
        return json_is_string(v);
    case K_RULES:
        return json_is_array(v);
    case K_BOOL:
        return json_is_boolean(v);
    case K_ENV:
        return json_is_object(v);
    case K_SIZE:
    case K_COUNT:
        return json_is_integer(v);
    case K_CPUS:
    case K_SECONDS:
        break;
    }
    return json_is_number(v);
}

static int json_field(struct conch_sandbox_spec *s, const struct field *f, json_t *v,
                      struct conch_err *err)
{
    if (!json_type_ok(f->kind, v))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "param '%s' must be %s", f->key,
                              kind_type_name(f->kind));
    switch (f->kind) {
    case K_PATH: {
        const char *p = json_string_value(v);
        struct stat st;
        /* An embedded NUL would make the path we check another than the one sent. */
        if (p[0] != '/' || strlen(p) >= PATH_MAX || strlen(p) != json_string_length(v))
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s must be an absolute host path",
                                  f->key);
        if (stat(p, &st) < 0 || !S_ISDIR(st.st_mode))
            return conch_err_setk(err, CONCH_ERR_USAGE, ENOTDIR, "%s '%s': not a directory", f->key,
                                  p);
        store_string(s, f, p);
        return 0;
    }
    case K_MODE:
        return conch_ws_mode_parse(json_string_value(v), &s->mode, err);
    case K_NET:
        s->net_given = true;
        return conch_net_mode_parse(json_string_value(v), &s->net, err);
    case K_RULES: {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e)
        {
            if (!json_is_string(e))
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "%s must be an array of strings", f->key);
            int r = add_rule(s, f, json_string_value(e), err);
            if (r < 0)
                return r;
        }
        return 0;
    }
    case K_STRING:
        store_string(s, f, json_string_value(v));
        return 0;
    case K_BOOL:
        s->as_root = json_is_true(v);
        return 0;
    case K_ENV: {
        const char *k;
        json_t *e;
        json_object_foreach(v, k, e)
        {
            if (!json_is_string(e) || !*k || strchr(k, '='))
                return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                      "env must map names to strings");
        }
        json_decref(s->env);
        s->env = json_incref(v);
        return 0;
    }
    case K_SIZE:
    case K_COUNT:
    case K_CPUS:
    case K_SECONDS:
        break;
    }
    /* An integer beyond 2^53 loses precision as a double: compare it as an integer. */
    double x = json_is_integer(v) ? (double)json_integer_value(v) : json_number_value(v);
    if (json_is_integer(v) && json_integer_value(v) < 0)
        x = -1;
    if (!in_range(f, x)) {
        char lo[32], hi[32];
        fmt_bound(lo, sizeof(lo), f->min);
        fmt_bound(hi, sizeof(hi), f->max);
        return conch_err_setk(err, CONCH_ERR_USAGE, ERANGE,
                              f->zero_bad ? "param '%s' must be between %s and %s"
                                          : "param '%s' must be 0 or between %s and %s",
                              f->key, lo, hi);
    }
    store_number(s, f, x);
    return 0;
}

int conch_spec_from_json(struct conch_sandbox_spec *s, json_t *params, const char **ret_param,
                         struct conch_err *err)
{
    conch_spec_defaults(s);
    for (size_t i = 0; i < ARRAY_SIZE(fields); i++) {
        const struct field *f = &fields[i];
        json_t *v = f->key ? json_object_get(params, f->key) : NULL;
        if (!v || json_is_null(v))
            continue;
        int r = json_field(s, f, v, err);
        if (r < 0) {
            conch_spec_done(s);
            if (ret_param)
                *ret_param = f->key;
            return r;
        }
    }
    json_t *mounts = json_object_get(params, "mounts");
    if (mounts && !json_is_null(mounts)) {
        int r = conch_spec_mounts_from_json(s, mounts, err);
        if (r < 0) {
            conch_spec_done(s);
            if (ret_param)
                *ret_param = "mounts";
            return r;
        }
    }
    static const enum conch_rule_kind kinds[] = {CONCH_RULE_READONLY, CONCH_RULE_HIDDEN};
    for (size_t i = 0; i < ARRAY_SIZE(kinds); i++) {
        const char *key = conch_rule_kind_name(kinds[i]);
        json_t *arr = json_object_get(params, key);
        if (!arr || json_is_null(arr))
            continue;
        int r = conch_spec_rules_from_json(s, kinds[i], arr, err);
        if (r < 0) {
            conch_spec_done(s);
            if (ret_param)
                *ret_param = key;
            return r;
        }
    }
    json_t *sockets = json_object_get(params, "sockets");
    if (sockets && !json_is_null(sockets)) {
        int r = conch_spec_sockets_from_json(s, sockets, err);
        if (r < 0) {
            conch_spec_done(s);
            if (ret_param)
                *ret_param = "sockets";
            return r;
        }
    }
    struct conch_net_policy pol;
    int r = conch_spec_net_policy(s, &pol, err);
    if (r < 0) {
        conch_spec_done(s);
        if (ret_param)
            *ret_param = "net";
        return r;
    }
    conch_net_policy_done(&pol);
    return 0;
}

json_t *conch_spec_to_json(const struct conch_sandbox_spec *s)
{
    json_t *p = json_object();
    if (!p)
        return NULL;
    int r = 0;
    if (s->workspace)
        r |= json_object_set_new(p, "workspace", json_string(s->workspace));
    if (s->mode != CONCH_WS_OVERLAY)
        r |= json_object_set_new(p, "mode", json_string(conch_ws_mode_name(s->mode)));
    if (s->rootfs)
        r |= json_object_set_new(p, "rootfs", json_string(s->rootfs));
    if (s->as_root)
        r |= json_object_set_new(p, "as_root", json_true());
    if (s->env)
        r |= json_object_set_new(p, "env", json_deep_copy(s->env));
    if (s->limits.memory_bytes)
        r |= json_object_set_new(p, "memory", json_integer((json_int_t)s->limits.memory_bytes));
    if (s->limits.pids_max)
        r |= json_object_set_new(p, "pids", json_integer((json_int_t)s->limits.pids_max));
    if (s->limits.cpu_millicpus)
        r |= json_object_set_new(p, "cpu", json_real((double)s->limits.cpu_millicpus / 1000));
    if (s->tmp_bytes != CONCH_SPEC_TMP_DEFAULT)
        r |= json_object_set_new(p, "tmp_size", json_integer((json_int_t)s->tmp_bytes));
    if (s->disk_bytes != CONCH_SPEC_DISK_DEFAULT)
        r |= json_object_set_new(p, "disk", json_integer((json_int_t)s->disk_bytes));
    if (s->idle_timeout >= 0)
        r |= json_object_set_new(p, "idle_timeout", json_real(s->idle_timeout));
    if (s->name)
        r |= json_object_set_new(p, "name", json_string(s->name));
    if (s->tool_timeout > 0)
        r |= json_object_set_new(p, "tool_timeout", json_real(s->tool_timeout));
    if (s->max_tool_calls)
        r |= json_object_set_new(p, "max_tool_calls", json_integer(s->max_tool_calls));
    if (s->n_mounts) {
        json_t *arr = json_array();
        for (unsigned i = 0; i < s->n_mounts; i++)
            r |= json_array_append_new(arr, conch_mount_to_json(&s->mounts[i]));
        r |= json_object_set_new(p, "mounts", arr);
    }
    for (int k = CONCH_RULE_READONLY; k <= CONCH_RULE_HIDDEN; k++) {
        json_t *arr = conch_spec_rules_to_json(s->rules, s->n_rules, (enum conch_rule_kind)k);
        if (json_array_size(arr))
            r |= json_object_set_new(p, conch_rule_kind_name((enum conch_rule_kind)k), arr);
        else if (arr)
            json_decref(arr);
        else
            r = -1;
    }
    if (s->n_sockets) {
        json_t *arr = json_array();
        for (unsigned i = 0; i < s->n_sockets; i++)
            r |= json_array_append_new(arr, conch_socket_to_json(&s->sockets[i]));
        r |= json_object_set_new(p, "sockets", arr);
    }
    if (s->net_given || s->net != CONCH_NET_NONE)
        r |= json_object_set_new(p, "net", json_string(conch_net_mode_name(s->net)));
    if (s->allow)
        r |= json_object_set_new(p, "allow", json_deep_copy(s->allow));
    if (s->deny)
        r |= json_object_set_new(p, "deny", json_deep_copy(s->deny));
    if (r) {
        json_decref(p);
        return NULL;
    }
    return p;
}

/* ---- the command line ---- */

static const struct field *find_option(const char *name)
{
    for (size_t i = 0; name && i < ARRAY_SIZE(fields); i++)
        if (fields[i].opt && !strcmp(fields[i].opt, name))
            return &fields[i];
    return NULL;
}

unsigned conch_spec_option(const char *name, unsigned which, bool *ret_takes_value)
{
    if (name && !strcmp(name, "mount") && (which & CONCH_SPEC_OPT_MOUNT)) {
        if (ret_takes_value)
            *ret_takes_value = true;
        return CONCH_SPEC_OPT_MOUNT;
    }
    if (name && (!strcmp(name, "readonly") || !strcmp(name, "hidden")) &&
        (which & CONCH_SPEC_OPT_RULES)) {
        if (ret_takes_value)
            *ret_takes_value = true;
        return CONCH_SPEC_OPT_RULES;
    }
    if (name && !strcmp(name, "pass-socket") && (which & CONCH_SPEC_OPT_SOCKET)) {
        if (ret_takes_value)
            *ret_takes_value = true;
        return CONCH_SPEC_OPT_SOCKET;
    }
    const struct field *f = find_option(name);
    if (!f || !(f->bit & which))
        return 0;
    if (ret_takes_value)
        *ret_takes_value = f->kind != K_BOOL;
    return f->bit;
}

/* A number as the command line writes it (with a size suffix for sizes) into *@ret. */
static int option_number(const struct field *f, const char *value, double *ret,
                         struct conch_err *err)
{
    char what[32];
    snprintf(what, sizeof(what), "--%s", f->opt);
    if (f->kind == K_SIZE) {
        uint64_t v;
        int r = conch_parse_size(value, what, &v, err);
        if (r < 0)
            return r;
        *ret = (double)v;
        return 0;
    }
    char *end = NULL;
    errno = 0;
    double v = f->kind == K_COUNT ? (double)strtoull(value, &end, 10) : strtod(value, &end);
    bool digits = isdigit((unsigned char)value[0]) || value[0] == '.';
    if (errno || !digits || end == value || *end || !isfinite(v)) {
        const char *expected = f->kind == K_COUNT  ? "a whole number"
                               : f->kind == K_CPUS ? "a number of CPUs (e.g. 0.5, 2)"
                                                   : "a number of seconds (e.g. 30, 0.5)";
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is not %s", what, value,
                              expected);
    }
    *ret = v;
    return 0;
}

int conch_spec_set_option(struct conch_sandbox_spec *s, const char *name, const char *value,
                          struct conch_err *err)
{
    if (name && !strcmp(name, "mount")) {
        struct conch_mount m;
        if (!value)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--mount needs a value");
        int r = conch_mount_parse(value, &m, err);
        if (r < 0 || (r = conch_spec_add_mount(s, &m, err)) < 0)
            return conch_err_wrap(err, "--mount");
        return 0;
    }
    if (name && (!strcmp(name, "readonly") || !strcmp(name, "hidden"))) {
        if (!value)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--%s needs a value", name);
        int r = conch_spec_add_rule(s, name[0] == 'h' ? CONCH_RULE_HIDDEN : CONCH_RULE_READONLY,
                                    value, err);
        return r < 0 ? conch_err_wrap(err, "--%s", name) : 0;
    }
    if (name && !strcmp(name, "pass-socket")) {
        struct conch_socket sock;
        if (!value)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--pass-socket needs a value");
        int r = conch_socket_parse(value, &sock, err);
        if (r < 0 || (r = conch_spec_add_socket(s, &sock, err)) < 0)
            return conch_err_wrap(err, "--pass-socket");
        return 0;
    }
    const struct field *f = find_option(name);
    if (!f)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "unknown option '--%s'",
                              name ? name : "");
    if (f->kind != K_BOOL && !value)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--%s needs a value", f->opt);
    switch (f->kind) {
    case K_BOOL:
        s->as_root = true;
        return 0;
    case K_PATH:
    case K_STRING:
        if (!*value)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--%s: empty", f->opt);
        store_string(s, f, value);
        return 0;
    case K_MODE: {
        int r = conch_ws_mode_parse(value, &s->mode, err);
        return r < 0 ? conch_err_wrap(err, "--mode") : 0;
    }
    case K_NET: {
        s->net_given = true;
        int r = conch_net_mode_parse(value, &s->net, err);
        return r < 0 ? conch_err_wrap(err, "--net") : 0;
    }
    case K_RULES: {
        int r = add_rule(s, f, value, err);
        return r < 0 ? conch_err_wrap(err, "--%s", f->opt) : 0;
    }
    case K_ENV: {
        const char *eq = strchr(value, '=');
        if (!eq || eq == value)
            return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--env: '%s' is not NAME=VALUE",
                                  value);
        if (!s->env && !(s->env = json_object()))
            return conch_err_set(err, ENOMEM, "out of memory");
        _cleanup_free_ char *k = strndup(value, (size_t)(eq - value));
        if (!k || json_object_set_new(s->env, k, json_string(eq + 1)) < 0)
            return conch_err_set(err, ENOMEM, "out of memory");
        return 0;
    }
    case K_SIZE:
    case K_COUNT:
    case K_CPUS:
    case K_SECONDS:
        break;
    }
    double v = 0;
    int r = option_number(f, value, &v, err);
    if (r < 0)
        return r;
    if (!in_range(f, v)) {
        char lo[32], hi[32];
        if (f->kind == K_SIZE) {
            fmt_size(lo, sizeof(lo), f->min);
            fmt_size(hi, sizeof(hi), f->max);
        } else {
            fmt_bound(lo, sizeof(lo), f->min);
            fmt_bound(hi, sizeof(hi), f->max);
        }
        return conch_err_setk(err, CONCH_ERR_USAGE, ERANGE,
                              "--%s: '%s' is out of range (0, or %s .. %s)", f->opt, value, lo, hi);
    }
    store_number(s, f, v);
    return 0;
}
