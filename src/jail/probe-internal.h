/* probe-internal.h - what probe.c (the kernel features) and probe-ct.c (what a container's
 * defaults refuse, and which container this is) share. Internal to jail/. */
#ifndef CONCH_JAIL_PROBE_INTERNAL_H
#define CONCH_JAIL_PROBE_INTERNAL_H

#include <stddef.h>

#include "jail/probe.h"

/* A probe's body, run in a forked child: 0, or -errno with @detail filled. */
typedef int (*conch_probe_child_fn)(char *detail, size_t len);

/* printf into @buf (truncating). */
__attribute__((format(printf, 3, 4))) void conch_probe_text(char *buf, size_t len, const char *fmt,
                                                            ...);

/* Append a line to a fix string; `conch doctor` prints each line as "fix: ...". */
__attribute__((format(printf, 3, 4))) void conch_probe_add_fix(char *buf, size_t len,
                                                               const char *fmt, ...);

/*
 * conch_probe_in_child - run @fn in a forked child (with a timeout) and copy its result
 * and detail back. Returns 0 or -errno from @fn, or -ECHILD with @detail saying how the
 * child died.
 */
int conch_probe_in_child(conch_probe_child_fn fn, char *detail, size_t len);

/*
 * conch_probe_enter_userns - in a probe child: unshare a user namespace (plus @flags,
 * named @flag_name in messages) and map the caller's ids to root in it. Returns 0 or
 * -errno with @detail filled.
 */
int conch_probe_enter_userns(int flags, const char *flag_name, char *detail, size_t len);

/*
 * conch_probe_ns_fixes - the fixes of a probe that needs a user namespace plus something
 * (@specific, may be NULL): when the user namespace part failed (@rc, @detail), the user
 * namespace fixes instead.
 */
void conch_probe_ns_fixes(char *fix, size_t len, int rc, const char *detail, const char *specific);

/* The probes of probe-ct.c: a hostname in an own UTS namespace, setns between mount
 * namespaces, a new /proc in a new pid namespace. */
void conch_probe_uts(struct conch_probe_result *r);
void conch_probe_setns(struct conch_probe_result *r);
void conch_probe_procfs(struct conch_probe_result *r);

#endif
