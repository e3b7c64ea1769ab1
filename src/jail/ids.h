/* ids.h - host id blocks for sandboxes run by host root. Each sandbox maps its ids
 * 0..65535 onto a block of 65536 host ids of its own, so that no local user (through an
 * /etc/subuid range) and no other sandbox shares a host id with it. A block is claimed by
 * holding an flock on a lock file named after it, for as long as the sandbox lives. */
#ifndef CONCH_JAIL_IDS_H
#define CONCH_JAIL_IDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Ids in one block: a sandbox's ids 0..65535. */
#define CONCH_HOST_ID_COUNT 65536u
/* Blocks are drawn from systemd's range for container ids, 0x00080000..0x6FFFFFFF
 * (docs: systemd UIDS-GIDS), never from the range useradd gives users in /etc/subuid. */
#define CONCH_HOST_ID_FIRST 0x00080000u
#define CONCH_HOST_ID_END 0x70000000u /* exclusive */
/* One lock file per block, named by its first id; root-only. */
#define CONCH_HOST_ID_LOCK_DIR "/run/conch/ids"

/* A claimed block: @base is its first host id; @lock_fd holds the claim (flock). */
struct conch_jail_ids {
    uint32_t base;
    int lock_fd;
};

/* conch_jail_ids_init - an unclaimed block (base 0, lock_fd -1). */
void conch_jail_ids_init(struct conch_jail_ids *ids);

/*
 * conch_jail_ids_claim - claim a free block of CONCH_HOST_ID_COUNT host ids for one
 * sandbox: inside [CONCH_HOST_ID_FIRST, CONCH_HOST_ID_END), overlapping no range of
 * /etc/subuid or /etc/subgid ("name:start:count" or "uid:start:count" lines) and no uid or
 * gid of /etc/passwd or /etc/group, and not claimed by another process (an exclusive flock
 * on CONCH_HOST_ID_LOCK_DIR/<base>, taken without blocking, so claims are safe between any
 * number of `conch run`s and daemons). Host root only. On success *@ret holds the block
 * and owns its lock fd (O_CLOEXEC) until conch_jail_ids_release; the block stays claimed
 * while any copy of that fd is open. Returns 0 or -errno with @err.
 */
int conch_jail_ids_claim(struct conch_jail_ids *ret, struct conch_err *err);

/*
 * conch_jail_ids_claim_base - conch_jail_ids_claim of exactly the block at @base (one a
 * sandbox had before a daemon restart: its files are owned by those ids). Returns 0, or
 * -EBUSY (kind limit) when that block is claimed or no longer free, -EINVAL when @base is
 * not a block's base, with @err.
 */
int conch_jail_ids_claim_base(uint32_t base, struct conch_jail_ids *ret, struct conch_err *err);

/*
 * conch_jail_ids_claim_in - conch_jail_ids_claim with another lock dir (created 0700 if
 * missing; it must be a directory owned by the caller that no one else may write to) and
 * another dir holding subuid, subgid, passwd and group (a missing file excludes nothing).
 * For tests.
 */
int conch_jail_ids_claim_in(const char *lock_dir, const char *etc_dir, struct conch_jail_ids *ret,
                            struct conch_err *err);

/* conch_jail_ids_release - drop the claim (closes the lock fd); safe on an unclaimed or
 * zeroed block. */
void conch_jail_ids_release(struct conch_jail_ids *ids);

/*
 * conch_jail_ids_subid_overlaps - whether any "name:start:count" / "uid:start:count" line
 * of @text (the content of /etc/subuid or /etc/subgid) overlaps [@start, @start+@count).
 * Blank, comment and malformed lines count for nothing.
 */
bool conch_jail_ids_subid_overlaps(const char *text, uint64_t start, uint64_t count);

#endif
