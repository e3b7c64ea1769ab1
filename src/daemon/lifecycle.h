/* lifecycle.h - a sandbox's lifecycle as one value: the states, the table of legal edges
 * (pure, so that tests check it without a daemon), and their names. The transition function
 * that owns each edge's side effects is conch_sb_set_state (daemon-internal.h). */
#ifndef CONCH_DAEMON_LIFECYCLE_H
#define CONCH_DAEMON_LIFECYCLE_H

#include <stdbool.h>

/*
 * enum sandbox_state - where a sandbox is in its life (docs/ARCHITECTURE.md, "A sandbox's
 * lifecycle", draws the edges). A warden (sb->jail) exists from BUILDING or READY until the
 * sandbox leaves for RESTARTING, STOPPED or STOPPING.
 */
enum sandbox_state {
    SB_NEW,        /* allocated, no warden yet (create, pool fill, recovery start here) */
    SB_BUILDING,   /* the pool's: its warden sets up in the background, outcome not read */
    SB_POOLED,     /* set up and waiting in the pool to be taken */
    SB_READY,      /* running: a named sandbox, or a `fresh` one running its command */
    SB_LEASING,    /* taken by sandbox.lease: its warden attaches the borrower's workspace */
    SB_LENT,       /* the borrower drives its warden: the daemon does not read the socket */
    SB_RECYCLING,  /* its warden makes it as new for the pool, answer not read yet */
    SB_RESTARTING, /* workspace.discard: the warden is gone, to be started again */
    SB_STOPPED,    /* no warden (it died, or a previous daemon's): workspace.* and destroy */
    SB_STOPPING,   /* being destroyed: what ran in it fails, its warden ends in a worker */
    SB_GONE, /* out of the registry; freed when the last hold (conch_daemon_sandbox_hold) goes */
    SB_N_STATES
};

/* conch_sb_edge_ok - whether a sandbox may go from @from to @to (the table of legal edges).
 * Out-of-range values are never legal. */
bool conch_sb_edge_ok(enum sandbox_state from, enum sandbox_state to);

/* conch_sb_state_name - "building", "pooled", ... for logs; "?" for an out-of-range value. */
const char *conch_sb_state_name(enum sandbox_state s);

#endif
