/* recover.h - what a starting daemon does about its predecessor: kill the sandboxes a
 * killed daemon left running (their records say which), and garbage-collect directories,
 * spill files and cgroups that no record references. */
#ifndef CONCH_DAEMON_RECOVER_H
#define CONCH_DAEMON_RECOVER_H

#include <sys/types.h>

#include "core/error.h"
#include "daemon/state.h"

/* Entries younger than this are left alone by conch_recover_gc: a daemon or `conch run`
 * may have just created them and not yet recorded (or populated) them. */
#define CONCH_RECOVER_GC_GRACE_S 60
/* Spill files no job references are kept this long (exec.run results name them). */
#define CONCH_RECOVER_SPILL_TTL_S (24 * 60 * 60)

/* What reap / gc did. Zero it before the call; counters only grow. */
struct conch_recover_report {
    unsigned wardens_killed;    /* reap: live wardens SIGKILLed */
    unsigned cgroups_removed;   /* reap and gc: cgroup directories removed */
    unsigned sandboxes_stopped; /* reap: records moved from "running" to "stopped" */
    unsigned dirs_removed;      /* gc: unreferenced entries under <state_dir>/sandboxes */
    unsigned spills_removed;    /* gc: unreferenced, expired entries under <state_dir>/spill */
    unsigned failures;          /* things that could not be removed (the first is in @err) */
};

/*
 * conch_recover_starttime - the start time of process @pid (field 22 of /proc/<pid>/stat,
 * clock ticks since boot), or 0 if it does not exist or is a zombie. Record it next to a
 * warden's pid: a pid with a different start time is a different process.
 */
unsigned long long conch_recover_starttime(pid_t pid);

/*
 * conch_recover_reap - for every sandbox recorded "running": if its warden is alive and its
 * start time equals the recorded warden_starttime (a record with starttime 0 never matches),
 * SIGKILL it (the warden is PID 1 of the sandbox's PID namespace, so everything inside dies
 * with it) and wait up to ~2 s for it to be gone (a zombie counts as gone); SIGKILL whatever
 * is in the sandbox's cgroups (/sys/fs/cgroup/{memory,pids,cpu}/conch/<id> and
 * /sys/fs/cgroup/conch/conch-<id>) and remove them; then record the sandbox "stopped" and
 * its running jobs as killed (exit_code -1, signal 9). Upper dirs are kept, so the
 * changes can still be inspected, committed or discarded. Never waits for a child of the
 * caller (no waitpid): a caller that is the warden's parent reaps it itself.
 * Every sandbox is processed even if one fails. Returns 0 when all went well, else the
 * first failure as -errno with @err filled; @ret (may be NULL) counts what was done.
 */
int conch_recover_reap(struct conch_state *st, struct conch_recover_report *ret,
                       struct conch_err *err);

/*
 * conch_recover_gc - remove what nothing references:
 *  - entries of <@state_dir>/sandboxes/ whose name is not a recorded sandbox id (running or
 *    stopped), older than CONCH_RECOVER_GC_GRACE_S; removed recursively with fd-relative
 *    calls that never follow a symlink or cross into another mount (a symlink is unlinked);
 *  - entries of <@state_dir>/spill/ older than CONCH_RECOVER_SPILL_TTL_S that no job's
 *    stdout_spill/stderr_spill names (a job naming a file inside a spilled directory keeps
 *    the directory);
 *  - empty cgroup directories under /sys/fs/cgroup/{memory,pids,cpu}/conch/ and
 *    /sys/fs/cgroup/conch/ older than the grace period that are not the cgroup of a
 *    recorded running sandbox (a cgroup with processes cannot be removed and is kept).
 * Missing directories are fine. Continues past failures; returns 0, or the first failure as
 * -errno with @err filled; @ret (may be NULL) counts what was removed.
 */
int conch_recover_gc(struct conch_state *st, const char *state_dir,
                     struct conch_recover_report *ret, struct conch_err *err);

/*
 * conch_recover_rm_tree - remove @name of @dfd (borrowed) and everything beneath it without
 * following a symlink or leaving its filesystem; mode-000 directories we own (overlayfs's
 * work dir) are opened up first. At most a bounded number of directories are open at once
 * (a deeper subtree is moved up and removed in a further pass), so a sandbox cannot exhaust
 * our fds or stack with a deep tree. @what names the tree in errors. Returns 0 or -errno.
 */
int conch_recover_rm_tree(int dfd, const char *name, const char *what, struct conch_err *err);

#endif
