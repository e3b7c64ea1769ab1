/* spec-internal.h - building the parent-side plan (spec.c). */
#ifndef CONCH_JAIL_SPEC_INTERNAL_H
#define CONCH_JAIL_SPEC_INTERNAL_H

#include "jail/jail-internal.h"

/* conch_jail_plan_rootfs - fill @plan's binds and links for the host system dirs and curated
 * /etc (@rootfs NULL) or for every top-level entry of @rootfs. @rootfs_src is where the
 * child finds @rootfs (a staged copy when conch runs as root), or NULL for @rootfs itself. */
int conch_jail_plan_rootfs(struct jail_plan *plan, const char *rootfs, const char *rootfs_src,
                           struct conch_err *err);

#endif
