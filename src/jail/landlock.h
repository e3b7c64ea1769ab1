/* landlock.h - Landlock as a second fence behind the mount namespace: inside the finished
 * sandbox root, writes are allowed only beneath the writable mounts, and (ABI >= 6) signals
 * and abstract unix sockets stay inside the command's own domain. */
#ifndef CONCH_JAIL_LANDLOCK_H
#define CONCH_JAIL_LANDLOCK_H

#include "core/error.h"

/* conch_landlock_abi - the kernel's Landlock ABI version, or 0 when unavailable. */
int conch_landlock_abi(void);

/*
 * conch_landlock_apply_child - restrict the calling process (and its future children):
 * read/execute everywhere under "/", write/create/remove only beneath each path in the
 * NULL-terminated @writable (e.g. "/workspace", "/tmp", "/home/agent", "/dev"). Paths that
 * do not exist are skipped; a path that is a file (e.g. "/dev/null") gets file rights only;
 * any other failure to open a path fails closed with -errno. Every filesystem right the
 * kernel's ABI knows is handled (REFER, TRUNCATE, IOCTL_DEV included), and rights are
 * checked when a file is opened, so fds inherited across the call keep working. Where the
 * kernel's ABI is >= 6, the process is also scoped (LANDLOCK_SCOPE_SIGNAL and
 * LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET): it can signal, and connect to abstract unix sockets
 * bound by, only processes in its own Landlock domain or domains nested in it; older ABIs
 * skip this silently. Network rights are left to the namespace. Requires no_new_privs.
 * Async-signal-safe: no allocation. Returns 0 when applied, 1 when the kernel has no Landlock
 * (nothing done), or -errno.
 */
int conch_landlock_apply_child(const char *const *writable);

/*
 * conch_landlock_prepare_child / conch_landlock_finish_child - conch_landlock_apply_child in
 * two steps, for a process fenced before everything it may write is mounted: prepare builds
 * the ruleset (rules for "/" and @writable, as above) into *@ret_ruleset (a new
 * close-on-exec fd) without restricting anything; finish adds rules for its own @writable
 * (NULL: none), opened now, restricts the calling process and closes @ruleset (taken over,
 * whatever the outcome). prepare returns 0, 1 when the kernel has no Landlock
 * (*@ret_ruleset stays -1 and there is nothing to finish), or -errno; finish returns 0 or
 * -errno. Both async-signal-safe.
 */
int conch_landlock_prepare_child(const char *const *writable, int *ret_ruleset);
int conch_landlock_finish_child(int ruleset, const char *const *writable);

#endif
