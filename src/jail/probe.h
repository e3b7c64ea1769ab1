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

/* Names of the probes that a container's default settings refuse (and doctor maps to a
 * pod's securityContext). */
#define CONCH_PROBE_USERNS "user namespaces"
#define CONCH_PROBE_UTS "hostname (UTS namespace)"
#define CONCH_PROBE_SETNS "setns (mount namespaces)"
#define CONCH_PROBE_PROCFS "/proc in a pid namespace"

/* Where conch runs: what `conch doctor` needs to turn failed probes into a container's or
 * pod's settings. Every field is what was read; nothing is guessed. */
struct conch_probe_env {
    bool container;        /* some sign of a container was found */
    bool kubernetes;       /* KUBERNETES_SERVICE_HOST is set: a pod */
    char why[96];          /* the sign: "KUBERNETES_SERVICE_HOST is set", "/run/.containerenv" */
    bool own_userns;       /* uid_map is not the identity: the container has its own user
                            * namespace (Kubernetes hostUsers: false, podman --userns) */
    int seccomp;           /* /proc/self/status Seccomp: 0 none, 1 strict, 2 filter; -1 unknown */
    bool no_new_privs;     /* NoNewPrivs: 1 */
    char apparmor[128];    /* the AppArmor profile, "" when AppArmor is not in use */
    int proc_covered;      /* mounts on paths below /proc (masked or read-only paths) */
    char proc_example[64]; /* the first of them, e.g. "/proc/kcore" */
};

/*
 * conch_probe_env - fill @out from /proc/self, /proc/1/cgroup, the environment and the
 * container runtimes' marker files. Never fails: what cannot be read stays empty.
 */
void conch_probe_env(struct conch_probe_env *out);

#endif
