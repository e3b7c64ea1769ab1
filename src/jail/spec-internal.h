/* spec-internal.h - building the parent-side plan (spec.c). */
#ifndef CONCH_JAIL_SPEC_INTERNAL_H
#define CONCH_JAIL_SPEC_INTERNAL_H

#include "jail/jail-internal.h"

/* jail_plan_rootfs - fill @plan's binds and links for the host system dirs and curated
 * /etc (@rootfs NULL) or for every top-level entry of @rootfs. */
int jail_plan_rootfs(struct jail_plan *plan, const char *rootfs, struct conch_err *err);

#endif
