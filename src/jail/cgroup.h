/* cgroup.h - resource limits through cgroups: v2 when a delegated subtree is writable,
 * v1 (memory, pids, cpu controllers) when running as root; the parent side only. */
#ifndef CONCH_JAIL_CGROUP_H
#define CONCH_JAIL_CGROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/error.h"

struct conch_cgroup_limits {
    uint64_t memory_bytes;  /* 0 = unlimited; swap is limited to the same total */
    uint64_t pids_max;      /* 0 = unlimited */
    uint64_t cpu_millicpus; /* 1000 = one CPU; 0 = unlimited */
};

/* One sandbox's cgroup(s). Embedded by the caller; zero-initialise, then _create. */
struct conch_cgroup {
    bool active;        /* created and in use */
    bool v2;            /* unified hierarchy in use */
    char path_v2[512];  /* e.g. /sys/fs/cgroup/<delegated>/conch-<name> */
    char path_mem[512]; /* v1 paths; empty when that controller is not used */
    char path_pids[512];
    char path_cpu[512];
};

/*
 * conch_cgroup_create - create a cgroup named @name (unique per sandbox; no '/') with
 * @limits (NULL = no limits). Zeroes @cg first. Where it goes:
 *  - /sys/fs/cgroup is cgroup2: as root /sys/fs/cgroup/conch/conch-<name>; otherwise a
 *    child of our own cgroup, or a sibling of it, whichever is delegated (writable) and
 *    can enable the controllers ("no internal processes" forbids the child while we
 *    live in our own cgroup).
 *  - else, as root, v1: /sys/fs/cgroup/{memory,pids}/conch/<name> whenever those
 *    hierarchies exist (so stats and destroy work even unlimited), and
 *    /sys/fs/cgroup/cpu/conch/<name> only when a cpu limit is set.
 * A leftover directory of the same name is emptied and recreated. Returns 0 when
 * created; -EOPNOTSUPP (with @err explaining why: not root and no delegated v2 subtree,
 * or a limited controller is not available) when the limits cannot be had here, so the
 * caller can fall back to rlimits; or another -errno.
 */
int conch_cgroup_create(struct conch_cgroup *cg, const char *name,
                        const struct conch_cgroup_limits *limits, struct conch_err *err);

/* conch_cgroup_attach - move process @pid into @cg (every v1 hierarchy in use). Attach
 * before the process forks: only @pid itself moves, and v1 memory charges taken before
 * the move stay with the old cgroup. */
int conch_cgroup_attach(struct conch_cgroup *cg, pid_t pid, struct conch_err *err);

/* Counters read after the command, to classify a kill. */
struct conch_cgroup_stats {
    bool oom_killed;      /* the memory limit was hit and the OOM killer ran */
    bool pids_limit_hit;  /* fork failed because of pids_max at least once */
    uint64_t memory_peak; /* bytes, 0 if unknown */
    uint64_t oom_kills;   /* OOM kills so far (a counter: compare two readings) */
    uint64_t pids_events; /* forks refused by pids_max so far (a counter) */
};

/* conch_cgroup_stats - read @cg's counters into @ret. Counters a kernel lacks read as 0. */
int conch_cgroup_stats(struct conch_cgroup *cg, struct conch_cgroup_stats *ret,
                       struct conch_err *err);

/*
 * conch_cgroup_destroy - kill anything left in @cg and remove its directories. Safe on an
 * inactive cgroup and idempotent. Kills with cgroup.kill (v2, Linux 5.14+) or by SIGKILLing
 * cgroup.procs until empty; the caller still reaps its own children. Returns 0 or -errno
 * (the directories may then remain; `conch gc`).
 */
int conch_cgroup_destroy(struct conch_cgroup *cg, struct conch_err *err);

#endif
