/* budget.h - a budget of bytes held for others: what a sandbox or a client makes the daemon
 * hold (half-read lines, queued answers, calls in flight, buffered output) is charged to a
 * budget before it is held and uncharged when it goes. A budget may draw on a parent too (a
 * sandbox's on the daemon-wide one), so that one holder is bounded by its own cap and all of
 * them together by the shared one. Budgets count what is held, not what is finished.
 *
 * The counters are atomic: a holder may uncharge from a worker thread. */
#ifndef CONCH_CORE_BUDGET_H
#define CONCH_CORE_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Caller-allocated (embed it); conch_budget_init before use. Read @cap and @label freely;
 * @held only through conch_budget_held. */
struct conch_budget {
    uint64_t cap;                /* bytes that may be held at once; UINT64_MAX: no cap */
    _Atomic uint64_t held;       /* bytes charged and not uncharged yet */
    struct conch_budget *parent; /* borrowed: charged too, must outlive this one; or NULL */
    char label[96];              /* who holds: "sandbox sb-1", for messages */
    const char *raise_with;      /* borrowed, static: what raises the cap ("conch serve
                                  * --max-sandbox-held"), named in messages; or NULL */
};

/*
 * conch_budget_init - @b holds nothing, may hold @cap bytes (UINT64_MAX: unbounded by itself)
 * and draws on @parent too (borrowed, NULL for none). @label is copied (truncated to fit).
 */
void conch_budget_init(struct conch_budget *b, const char *label, uint64_t cap,
                       struct conch_budget *parent);

/* conch_budget_set_raise_with - name @how (a static string: "conch serve --max-held") in the
 * messages about @b's cap. */
void conch_budget_set_raise_with(struct conch_budget *b, const char *how);

/*
 * conch_budget_charge - count @n more bytes as held by @b and by every parent, all or
 * nothing. A NULL @b is unbounded (always 0). Returns 0, or -ENOBUFS with @err (may be NULL,
 * kind CONCH_ERR_LIMIT) naming the budget that is full, its cap, what it holds, what was asked
 * and what raises the cap; nothing is charged then.
 */
int conch_budget_charge(struct conch_budget *b, uint64_t n, struct conch_err *err);

/*
 * conch_budget_charge_upto - charge as much of @n as @b and its parents have room for (all
 * or nothing per call, never more than @n). Returns the bytes charged (0 .. @n); a NULL @b
 * charges all of @n.
 */
uint64_t conch_budget_charge_upto(struct conch_budget *b, uint64_t n);

/* conch_budget_uncharge - @n bytes charged earlier to @b are no longer held (by it and its
 * parents). A NULL @b is a no-op. */
void conch_budget_uncharge(struct conch_budget *b, uint64_t n);

/* conch_budget_room - bytes that could be charged to @b now (the least room along its
 * parents); UINT64_MAX for a NULL or unbounded @b. */
uint64_t conch_budget_room(const struct conch_budget *b);

/* conch_budget_held - bytes @b holds now (0 for NULL). */
uint64_t conch_budget_held(const struct conch_budget *b);

/* conch_budget_describe - what @b and its parents hold, for a message, into @buf (@size
 * bytes, always terminated): "sandbox sb-1: N bytes held of 64 MiB (conch serve
 * --max-sandbox-held); all sandboxes: N bytes held of 256 MiB (...)". Levels without a cap
 * are left out. */
void conch_budget_describe(const struct conch_budget *b, char *buf, size_t size);

#endif
