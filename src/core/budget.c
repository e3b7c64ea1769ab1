/* budget.c - byte budgets with a per-holder and a shared cap (see budget.h). Charging is a
 * compare-and-swap per level, rolled back when a parent is full: never over a cap, even
 * for a moment, whatever threads uncharge meanwhile. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>

#include "core/budget.h"

void conch_budget_init(struct conch_budget *b, const char *label, uint64_t cap,
                       struct conch_budget *parent)
{
    b->cap = cap;
    atomic_init(&b->held, 0);
    b->parent = parent;
    snprintf(b->label, sizeof(b->label), "%s", label ? label : "a budget");
    b->raise_with = NULL;
}

void conch_budget_set_raise_with(struct conch_budget *b, const char *how)
{
    b->raise_with = how;
}

/* Add @n to @b alone if it stays within the cap. */
static bool take(struct conch_budget *b, uint64_t n)
{
    uint64_t cur = atomic_load_explicit(&b->held, memory_order_relaxed);
    do {
        if (n > b->cap || cur > b->cap - n)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&b->held, &cur, cur + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return true;
}

static void give(struct conch_budget *b, uint64_t n)
{
    atomic_fetch_sub_explicit(&b->held, n, memory_order_relaxed);
}

/* Charge every level or none; returns the level that refused, or NULL. */
static struct conch_budget *charge(struct conch_budget *b, uint64_t n)
{
    for (struct conch_budget *x = b; x; x = x->parent) {
        if (take(x, n))
            continue;
        for (struct conch_budget *y = b; y != x; y = y->parent)
            give(y, n);
        return x;
    }
    return NULL;
}

int conch_budget_charge(struct conch_budget *b, uint64_t n, struct conch_err *err)
{
    if (!b || n == 0)
        return 0;
    struct conch_budget *full = charge(b, n);
    if (!full)
        return 0;
    return conch_err_setk(err, CONCH_ERR_LIMIT, ENOBUFS,
                          "%s is at its budget of %" PRIu64 " MiB (%" PRIu64 " bytes held, %" PRIu64
                          " more asked)%s%s",
                          full->label, full->cap >> 20, conch_budget_held(full), n,
                          full->raise_with ? "; raise it with " : "",
                          full->raise_with ? full->raise_with : "");
}

uint64_t conch_budget_charge_upto(struct conch_budget *b, uint64_t n)
{
    if (!b)
        return n;
    /* The room can shrink between the look and the charge (another thread): retry smaller. */
    for (int tries = 0; tries < 8; tries++) {
        uint64_t room = conch_budget_room(b);
        uint64_t want = room < n ? room : n;
        if (want == 0 || !charge(b, want))
            return want;
    }
    return 0;
}

void conch_budget_uncharge(struct conch_budget *b, uint64_t n)
{
    for (struct conch_budget *x = b; x && n; x = x->parent)
        give(x, n);
}

uint64_t conch_budget_room(const struct conch_budget *b)
{
    uint64_t room = UINT64_MAX;
    for (const struct conch_budget *x = b; x; x = x->parent) {
        uint64_t held = atomic_load_explicit(&x->held, memory_order_relaxed);
        uint64_t r = held >= x->cap ? 0 : x->cap - held;
        if (r < room)
            room = r;
    }
    return room;
}

uint64_t conch_budget_held(const struct conch_budget *b)
{
    return b ? atomic_load_explicit(&b->held, memory_order_relaxed) : 0;
}

void conch_budget_describe(const struct conch_budget *b, char *buf, size_t size)
{
    size_t len = 0;
    if (size)
        buf[0] = '\0';
    for (const struct conch_budget *x = b; x && len < size; x = x->parent) {
        if (x->cap == UINT64_MAX)
            continue;
        int w = snprintf(buf + len, size - len,
                         "%s%s: %" PRIu64 " bytes held of %" PRIu64 " MiB%s%s%s", len ? "; " : "",
                         x->label, conch_budget_held(x), x->cap >> 20, x->raise_with ? " (" : "",
                         x->raise_with ? x->raise_with : "", x->raise_with ? ")" : "");
        if (w < 0)
            break;
        len += (size_t)w;
    }
}
