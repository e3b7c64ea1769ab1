/* exec-internal.h - what run.c shares with run-mounts.c: conch run's overlay and store mounts,
 * prepared before its sandbox starts, read after its command ends. Not for other modules. */
#ifndef CONCH_EXEC_INTERNAL_H
#define CONCH_EXEC_INTERNAL_H

#include "exec/run.h"

/* The extra mounts of one conch run: the jail's copy of them (a store's source set to its
 * view), each overlay mount's host dir (opened at the start: the one its changes go to) and
 * each store mount's view. */
struct conch_run_mounts {
    struct conch_mount mounts[CONCH_SPEC_MOUNTS_MAX];
    const struct conch_mount *orig; /* the opts' (borrowed): the results point into them */
    unsigned n;
    int lower[CONCH_SPEC_MOUNTS_MAX];                      /* overlay: its source; else -1 */
    struct conch_store_view *views[CONCH_SPEC_MOUNTS_MAX]; /* store: owned; else NULL */
    char run_dir[4096];       /* the views' dir (made here, removed by _done); "" when none */
    uint64_t next_measure_ms; /* conch_run_mounts_views_over's throttle */
};

/*
 * conch_run_mounts_prepare - before the sandbox: copy @o->jail.mounts into @m, open each
 * overlay mount's source, and make and fill each store mount's view (in a new dir under
 * @o->view_dir). @m is the caller's (conch_run_mounts_done, also after a failure). Returns 0 or
 * -errno with @err.
 */
int conch_run_mounts_prepare(struct conch_run_mounts *m, const struct conch_run_opts *o,
                             struct conch_err *err);
/*
 * conch_run_mounts_changes - after the command, the sandbox still up: each overlay mount's
 * changes into @res->mounts, committed when @commit (the workspace's rule: --commit and the
 * command exited by itself). Failures are the mount's own report (commit_err).
 */
void conch_run_mounts_changes(struct conch_run_mounts *m, struct conch_jail *jail, bool commit,
                              uint64_t max_bytes, struct conch_run_result *res);
/*
 * conch_run_mounts_views_over - while the command runs: whether the store views (on the host's
 * disk, not in a tmpfs) hold more than @limit bytes, each entry charged 4 KiB more (as the
 * daemon charges them). Measured at most every 250 ms, and less often when a walk is slow
 * (a walk's time at most a third of the time); false between measurements and without views.
 */
bool conch_run_mounts_views_over(struct conch_run_mounts *m, uint64_t limit);
/*
 * conch_run_mounts_sync - after the sandbox is gone (nothing writes to the views any more):
 * write each store view back, one transaction each, into @res->stores.
 */
void conch_run_mounts_sync(struct conch_run_mounts *m, struct conch_run_result *res);
/* conch_run_mounts_done - close, free and remove what @m holds; safe on a zeroed one. */
void conch_run_mounts_done(struct conch_run_mounts *m);

#endif
