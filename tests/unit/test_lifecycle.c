/* test_lifecycle.c - unit tests of the sandbox's lifecycle table (src/daemon/lifecycle.h): the
 * legal edges are exactly those docs/ARCHITECTURE.md draws, and the graph has the shape a
 * lifecycle needs (every state reachable from NEW, every state can end in GONE, none after). */
#include <criterion/criterion.h>
#include <string.h>

#include "daemon/lifecycle.h"

/* The edges as docs/ARCHITECTURE.md ("A sandbox's lifecycle") lists them. */
static const struct {
    enum sandbox_state from, to;
} documented[] = {
    {SB_NEW, SB_BUILDING},       {SB_NEW, SB_READY},          {SB_NEW, SB_STOPPED},
    {SB_NEW, SB_STOPPING},       {SB_NEW, SB_GONE},           {SB_BUILDING, SB_POOLED},
    {SB_BUILDING, SB_STOPPING},  {SB_POOLED, SB_READY},       {SB_POOLED, SB_LEASING},
    {SB_POOLED, SB_STOPPING},    {SB_READY, SB_RECYCLING},    {SB_READY, SB_RESTARTING},
    {SB_READY, SB_STOPPED},      {SB_READY, SB_STOPPING},     {SB_LEASING, SB_LENT},
    {SB_LEASING, SB_STOPPING},   {SB_LENT, SB_RECYCLING},     {SB_LENT, SB_STOPPING},
    {SB_RECYCLING, SB_POOLED},   {SB_RECYCLING, SB_STOPPING}, {SB_RESTARTING, SB_READY},
    {SB_RESTARTING, SB_STOPPED}, {SB_STOPPED, SB_STOPPING},   {SB_STOPPING, SB_GONE},
    {SB_STOPPED, SB_READY},
};

static bool is_documented(enum sandbox_state from, enum sandbox_state to)
{
    for (size_t i = 0; i < sizeof(documented) / sizeof(documented[0]); i++)
        if (documented[i].from == from && documented[i].to == to)
            return true;
    return false;
}

Test(lifecycle, the_table_is_the_documented_one)
{
    for (int f = 0; f < SB_N_STATES; f++)
        for (int t = 0; t < SB_N_STATES; t++)
            cr_expect_eq(conch_sb_edge_ok(f, t), is_documented(f, t), "%s -> %s",
                         conch_sb_state_name(f), conch_sb_state_name(t));
}

Test(lifecycle, no_state_goes_to_itself_and_nothing_leaves_gone)
{
    for (int s = 0; s < SB_N_STATES; s++) {
        cr_expect_not(conch_sb_edge_ok(s, s), "%s -> itself", conch_sb_state_name(s));
        cr_expect_not(conch_sb_edge_ok(SB_GONE, s), "gone -> %s", conch_sb_state_name(s));
        cr_expect_not(conch_sb_edge_ok(s, SB_NEW), "%s -> new", conch_sb_state_name(s));
    }
}

Test(lifecycle, out_of_range_is_never_legal)
{
    cr_expect_not(conch_sb_edge_ok(SB_N_STATES, SB_GONE));
    cr_expect_not(conch_sb_edge_ok(SB_STOPPING, SB_N_STATES));
    cr_expect_not(conch_sb_edge_ok((enum sandbox_state) - 1, SB_GONE));
    cr_expect_not(conch_sb_edge_ok(SB_NEW, (enum sandbox_state)1000));
    cr_expect_str_eq(conch_sb_state_name(SB_N_STATES), "?");
    cr_expect_str_eq(conch_sb_state_name((enum sandbox_state) - 1), "?");
}

Test(lifecycle, every_state_has_its_own_name)
{
    for (int a = 0; a < SB_N_STATES; a++) {
        const char *n = conch_sb_state_name(a);
        cr_assert_not_null(n);
        cr_expect_neq(strcmp(n, "?"), 0, "state %d has no name", a);
        for (int b = 0; b < a; b++)
            cr_expect_neq(strcmp(n, conch_sb_state_name(b)), 0, "states %d and %d share '%s'", a, b,
                          n);
    }
}

/* Which states @from reaches through legal edges (itself included). */
static unsigned reach(enum sandbox_state from)
{
    unsigned seen = 1u << from, prev = 0;
    while (seen != prev) {
        prev = seen;
        for (int f = 0; f < SB_N_STATES; f++)
            if (seen & (1u << f))
                for (int t = 0; t < SB_N_STATES; t++)
                    if (conch_sb_edge_ok(f, t))
                        seen |= 1u << t;
    }
    return seen;
}

Test(lifecycle, every_state_is_reachable_and_every_one_can_end)
{
    unsigned from_new = reach(SB_NEW);
    for (int s = 0; s < SB_N_STATES; s++) {
        cr_expect(from_new & (1u << s), "%s is unreachable from new", conch_sb_state_name(s));
        /* Whatever state a sandbox is in, it can be destroyed: no state is a trap. */
        cr_expect(reach(s) & (1u << SB_GONE), "%s never ends", conch_sb_state_name(s));
    }
}

Test(lifecycle, the_pool_cycle_and_the_lease_cycle_close)
{
    /* pooled -> ready (fresh command) -> recycling -> pooled */
    cr_expect(conch_sb_edge_ok(SB_POOLED, SB_READY));
    cr_expect(conch_sb_edge_ok(SB_READY, SB_RECYCLING));
    cr_expect(conch_sb_edge_ok(SB_RECYCLING, SB_POOLED));
    /* pooled -> leasing -> lent -> recycling -> pooled */
    cr_expect(conch_sb_edge_ok(SB_POOLED, SB_LEASING));
    cr_expect(conch_sb_edge_ok(SB_LEASING, SB_LENT));
    cr_expect(conch_sb_edge_ok(SB_LENT, SB_RECYCLING));
    /* a lent sandbox is never handed to another client without being made as new */
    cr_expect_not(conch_sb_edge_ok(SB_LENT, SB_POOLED));
    cr_expect_not(conch_sb_edge_ok(SB_LENT, SB_READY));
    cr_expect_not(conch_sb_edge_ok(SB_LENT, SB_LEASING));
    /* a stopped one comes back only as it was (sandbox.start), never through the pool */
    cr_expect(conch_sb_edge_ok(SB_STOPPED, SB_READY));
    cr_expect_not(conch_sb_edge_ok(SB_STOPPED, SB_POOLED));
    cr_expect_not(conch_sb_edge_ok(SB_STOPPED, SB_LEASING));
}
