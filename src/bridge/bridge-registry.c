/* bridge-registry.c - the tool bridge's registry of tools and agent types (by owner), the
 * origins (which command a call comes from, by pid namespace) with what each did, and the
 * trace of calls. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bridge/bridge-internal.h"
#include "toolschema/toolschema.h"

/* ---- Registry ----------------------------------------------------------------------------- */

/* Tools (and agent types) a sandbox may have registered. */
#define REGISTRY_MAX 4096

struct entry *conch_bridge__entry_find(struct conch_list *head, const char *name)
{
    for (struct conch_list *n = head->next; n != head; n = n->next) {
        struct entry *e = conch_list_entry(n, struct entry, link);
        if (!strcmp(e->name, name))
            return e;
    }
    return NULL;
}

void conch_bridge__entries_free(struct conch_list *head)
{
    while (head->next != head) {
        struct entry *e = conch_list_entry(head->next, struct entry, link);
        conch_list_del(&e->link);
        json_decref(e->def);
        free(e);
    }
}

static int check_def(bool agent, json_t *d, size_t i, struct conch_err *err)
{
    const char *what = agent ? "agents" : "tools";
    int r = agent ? conch_toolschema_check_agent(d, err) : conch_toolschema_check_tool(d, err);
    if (r < 0)
        return conch_err_wrap(err, "%s[%zu]", what, i);
    json_t *timeout = agent ? NULL : json_object_get(d, "timeout");
    if (timeout && !json_is_null(timeout) &&
        (!json_is_number(timeout) || json_number_value(timeout) <= 0 ||
         json_number_value(timeout) > 86400))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "tools[%zu] (%s).timeout: expected seconds in (0, 86400]", i,
                              json_string_value(json_object_get(d, "name")));
    return 0;
}

int conch_bridge_check_defs(bool agents, json_t *defs, struct conch_err *err)
{
    if (!json_is_array(defs))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: expected an array",
                              agents ? "agents" : "tools");
    if (json_array_size(defs) > 1024)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: at most 1024 at once",
                              agents ? "agents" : "tools");
    size_t i;
    json_t *d;
    json_array_foreach(defs, i, d)
    {
        int r = check_def(agents, d, i, err);
        if (r < 0)
            return r;
    }
    return 0;
}

int conch_bridge_register(struct conch_bridge *b, bool agents, json_t *defs, void *owner,
                          json_t **ret_names, struct conch_err *err)
{
    int r = conch_bridge_check_defs(agents, defs, err);
    if (r < 0)
        return r;
    size_t i;
    json_t *d;
    /* A bounded registry: at most REGISTRY_MAX entries of each kind (names replaced count
     * once). Counted before anything changes. */
    size_t have = 0;
    struct conch_list *heads = agents ? &b->agents : &b->tools;
    for (struct conch_list *n = heads->next; n != heads; n = n->next)
        have++;
    size_t fresh = 0;
    json_array_foreach(defs, i, d)
    {
        if (!conch_bridge__entry_find(heads, json_string_value(json_object_get(d, "name"))))
            fresh++;
    }
    if (have + fresh > REGISTRY_MAX)
        return conch_err_setk(err, CONCH_ERR_LIMIT, E2BIG,
                              "a sandbox may have at most %d %s (it has %zu; %zu more asked for)",
                              REGISTRY_MAX, agents ? "agent types" : "tools", have, fresh);
    json_t *names = json_array();
    json_array_foreach(defs, i, d)
    {
        struct entry *e = calloc(1, sizeof(*e));
        json_t *copy = json_deep_copy(d);
        if (!e || !copy) {
            free(e);
            json_decref(copy);
            json_decref(names);
            return conch_err_set(err, ENOMEM, "out of memory");
        }
        e->def = copy;
        e->name = json_string_value(json_object_get(copy, "name"));
        e->owner = owner;
        json_t *t = json_object_get(copy, "timeout");
        e->timeout_s = json_is_number(t) ? json_number_value(t) : 0;
        struct conch_list *head = agents ? &b->agents : &b->tools;
        struct entry *old = conch_bridge__entry_find(head, e->name);
        if (old) {
            conch_list_del(&old->link);
            json_decref(old->def);
            free(old);
        }
        conch_list_add(head, &e->link);
        json_array_append_new(names, json_string(e->name));
    }
    *ret_names = names;
    return 0;
}

json_t *conch_bridge_unregister(struct conch_bridge *b, bool agents, json_t *names)
{
    json_t *removed = json_array();
    size_t i;
    json_t *n;
    json_array_foreach(names, i, n)
    {
        const char *name = json_string_value(n);
        struct entry *e =
            name ? conch_bridge__entry_find(agents ? &b->agents : &b->tools, name) : NULL;
        if (!e)
            continue;
        json_array_append_new(removed, json_string(name));
        conch_list_del(&e->link);
        json_decref(e->def);
        free(e);
    }
    return removed;
}

void conch_bridge_drop_owner(struct conch_bridge *b, void *owner)
{
    struct conch_list *heads[] = {&b->tools, &b->agents};
    for (int k = 0; k < 2; k++)
        for (struct conch_list *n = heads[k]->next, *next; n != heads[k]; n = next) {
            next = n->next;
            struct entry *e = conch_list_entry(n, struct entry, link);
            if (e->owner != owner)
                continue;
            conch_list_del(&e->link);
            json_decref(e->def);
            free(e);
        }
    for (struct conch_list *n = b->calls.next; n != &b->calls;) {
        struct conch_bridge_call *c = conch_list_entry(n, struct conch_bridge_call, link);
        if (c->owner != owner || !c->delivered) {
            n = n->next;
            continue;
        }
        char msg[200];
        snprintf(msg, sizeof(msg), "the harness answering %s '%s' went away",
                 c->kind == CONCH_BRIDGE_TOOL ? "tool" : "agent", c->name);
        c->delivered = false; /* nobody to cancel for */
        conch_bridge__call_fail(c, "unavailable", msg, NULL);
        n = b->calls.next; /* the failure may have re-entered: scan again */
    }
}

json_t *conch_bridge__list_json(struct conch_bridge *b, bool full)
{
    json_t *tools = json_array(), *agents = json_array();
    for (struct conch_list *n = b->tools.next; n != &b->tools; n = n->next) {
        struct entry *e = conch_list_entry(n, struct entry, link);
        if (full) {
            json_array_append(tools, e->def);
        } else {
            json_t *d = json_pack("{s:s,s:O?,s:O?}", "name", e->name, "description",
                                  json_object_get(e->def, "description"), "input_schema",
                                  json_object_get(e->def, "input_schema"));
            json_array_append_new(tools, d);
        }
    }
    for (struct conch_list *n = b->agents.next; n != &b->agents; n = n->next)
        json_array_append(agents, conch_list_entry(n, struct entry, link)->def);
    return json_pack("{s:o,s:o}", "tools", tools, "agents", agents);
}

bool conch_bridge_used(const struct conch_bridge *b)
{
    return b && (!conch_list_empty(&b->tools) || !conch_list_empty(&b->agents) ||
                 !conch_list_empty(&b->calls) || !conch_list_empty(&b->deferred) ||
                 !conch_list_empty(&b->conns) || !conch_list_empty(&b->origins) ||
                 json_array_size(b->trace) > 0);
}

json_t *conch_bridge_list(struct conch_bridge *b)
{
    return conch_bridge__list_json(b, true);
}

char *conch_bridge_prompt(struct conch_bridge *b, unsigned languages)
{
    json_t *l = conch_bridge__list_json(b, true);
    char *text = l ? conch_toolschema_prompt(json_object_get(l, "tools"),
                                             json_object_get(l, "agents"), languages)
                   : NULL;
    json_decref(l);
    return text;
}

/* ---- Origins -------------------------------------------------------------------------------- */

struct origin *conch_bridge__origin_find(struct conch_bridge *b, const char *kind, const char *id)
{
    for (struct conch_list *n = b->origins.next; n != &b->origins; n = n->next) {
        struct origin *o = conch_list_entry(n, struct origin, link);
        if (!strcmp(o->kind, kind) && !strcmp(o->id, id))
            return o;
    }
    return NULL;
}

static bool origin_matches(const struct origin *o, const struct conn *c)
{
    if (c->local_answer)
        return !strcmp(o->kind, c->local_kind) && !strcmp(o->id, c->local_id);
    return o->pidns == 0 || (c->have_pidns && o->pidns == c->pidns);
}

struct origin *conch_bridge__origin_of(struct conn *c)
{
    struct conch_bridge *b = c->b;
    for (int pass = 0; pass < 2; pass++) {
        for (struct conch_list *n = b->origins.next; n != &b->origins; n = n->next) {
            struct origin *o = conch_list_entry(n, struct origin, link);
            if (origin_matches(o, c))
                return o;
        }
        /* The command may have started an instant ago: its supervisor's event can still be
         * waiting on the host's loop. */
        if (pass == 0 && b->ops->resolve)
            b->ops->resolve(b->ctx);
        if (b->freeing || c->closing)
            return NULL;
    }
    return NULL;
}

void conch_bridge__origin_free(struct origin *o)
{
    conch_list_del(&o->link);
    json_decref(o->records);
    json_decref(o->detached);
    free(o);
}

int conch_bridge_origin_begin(struct conch_bridge *b, const char *kind, const char *id,
                              uint64_t pidns)
{
    struct origin *o = calloc(1, sizeof(*o));
    if (!o || !(o->records = json_array()) || !(o->detached = json_array())) {
        if (o) {
            json_decref(o->records);
            free(o);
        }
        return -ENOMEM;
    }
    snprintf(o->kind, sizeof(o->kind), "%s", kind);
    snprintf(o->id, sizeof(o->id), "%s", id);
    o->pidns = pidns;
    conch_list_add(&b->origins, &o->link);
    /* Calls its command made before we knew it was running. */
    bool again = true;
    while (again && !b->freeing) {
        again = false;
        for (struct conch_list *n = b->deferred.next; n != &b->deferred; n = n->next) {
            struct deferred *d = conch_list_entry(n, struct deferred, link);
            if (origin_matches(o, d->c)) {
                conch_bridge__deferred_replay(b, d);
                again = true;
                break;
            }
        }
    }
    return 0;
}

static char *summary_of(json_t *records)
{
    size_t n = json_array_size(records);
    if (!n)
        return NULL;
    /* Count by name, in order of first appearance. */
    json_t *counts = json_object();
    json_t *order = json_array();
    size_t ok = 0, i;
    double first = 0, last = 0;
    json_t *r;
    json_array_foreach(records, i, r)
    {
        const char *name = json_string_value(json_object_get(r, "name"));
        json_t *cnt = json_object_get(counts, name ? name : "?");
        if (!cnt) {
            json_object_set_new(counts, name ? name : "?", json_integer(1));
            json_array_append_new(order, json_string(name ? name : "?"));
        } else {
            json_integer_set(cnt, json_integer_value(cnt) + 1);
        }
        if (json_is_true(json_object_get(r, "ok")))
            ok++;
        double s = json_number_value(json_object_get(r, "start"));
        double e = s + json_number_value(json_object_get(r, "duration_ms")) / 1000.0;
        if (i == 0 || s < first)
            first = s;
        if (e > last)
            last = e;
    }
    char by[512] = "";
    size_t len = 0;
    json_t *nm;
    json_array_foreach(order, i, nm)
    {
        const char *name = json_string_value(nm);
        int w = snprintf(by + len, sizeof(by) - len, "%s%s=%lld", i ? ", " : "", name,
                         (long long)json_integer_value(json_object_get(counts, name)));
        if (w < 0 || (size_t)w >= sizeof(by) - len) {
            if (len + 5 < sizeof(by))
                snprintf(by + len, sizeof(by) - len, ", ...");
            break;
        }
        len += (size_t)w;
    }
    json_decref(counts);
    json_decref(order);
    char *s = NULL;
    if (asprintf(&s, "[tools: %zu call%s (%s), %zu ok, %zu failed, %.1f s]", n, n == 1 ? "" : "s",
                 by, ok, n - ok, last - first) < 0)
        return NULL;
    return s;
}

void conch_bridge_origin_end(struct conch_bridge *b, const char *kind, const char *id,
                             struct conch_bridge_report *ret)
{
    memset(ret, 0, sizeof(*ret));
    struct origin *o = conch_bridge__origin_find(b, kind, id);
    if (!o)
        return;
    for (struct conch_list *n = b->calls.next; n != &b->calls;) {
        struct conch_bridge_call *c = conch_list_entry(n, struct conch_bridge_call, link);
        if (strcmp(c->origin_kind, kind) || strcmp(c->origin_id, id)) {
            n = n->next;
            continue;
        }
        conch_bridge__call_fail(c, "cancelled", "the command ended", "the command ended");
        n = b->calls.next; /* the failure may have re-entered: scan again */
    }
    ret->calls = json_incref(o->records);
    ret->detached = json_incref(o->detached);
    ret->summary = summary_of(o->records);
    conch_bridge__origin_free(o);
}

void conch_bridge_origin_take(struct conch_bridge *b, const char *kind, const char *id,
                              struct conch_bridge_report *ret)
{
    memset(ret, 0, sizeof(*ret));
    struct origin *o = conch_bridge__origin_find(b, kind, id);
    json_t *records = json_array(), *detached = json_array();
    if (!o || !records || !detached) {
        json_decref(records);
        json_decref(detached);
        return;
    }
    ret->calls = o->records;
    ret->detached = o->detached;
    ret->summary = summary_of(o->records);
    o->records = records;
    o->detached = detached;
}

void conch_bridge_report_done(struct conch_bridge_report *r)
{
    json_decref(r->calls);
    json_decref(r->detached);
    free(r->summary);
    memset(r, 0, sizeof(*r));
}

json_t *conch_bridge_trace(struct conch_bridge *b, const char *kind, const char *id)
{
    if (!kind || !id)
        return json_deep_copy(b->trace);
    json_t *out = json_array();
    size_t i;
    json_t *r;
    json_array_foreach(b->trace, i, r)
    {
        json_t *o = json_object_get(r, "origin");
        const char *k = json_string_value(json_object_get(o, "kind"));
        const char *v = json_string_value(json_object_get(o, "id"));
        if (k && v && !strcmp(k, kind) && !strcmp(v, id))
            json_array_append(out, r);
    }
    return out;
}
