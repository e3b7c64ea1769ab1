/* probe.h - feature probes: which kernel fences this machine allows, each tested by
 * actually trying it in a short-lived child. Used by `conch doctor`. */
#ifndef CONCH_JAIL_PROBE_H
#define CONCH_JAIL_PROBE_H

#include <stdbool.h>

enum conch_probe_state { CONCH_PROBE_OK, CONCH_PROBE_MISSING, CONCH_PROBE_PARTIAL };

struct conch_probe_result {
    const char *name; /* "user namespaces", "overlay in a user namespace", ... */
    enum conch_probe_state state;
    bool required;    /* conch refuses to run without it */
    char detail[256]; /* what was seen: "ABI 6", "EPERM", ... */
    char fix[512];    /* how to fix it when not OK; empty otherwise */
};

/*
 * conch_probe_all - run every probe, filling up to @max entries of @out.
 * Returns the number of entries written. Never fails: a probe that cannot run reports
 * MISSING with the reason in detail.
 */
int conch_probe_all(struct conch_probe_result *out, int max);

#endif
