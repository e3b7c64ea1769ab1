/* tokens.h - the --tokens file of `conch serve`: one tenant a line with its bearer token and
 * quotas, loaded into a table that holds SHA-256 digests of the tokens, never the tokens. The
 * daemon (tenants.c) is its only reader: the gateway passes tokens through, it never parses
 * this file. */
#ifndef CONCH_DAEMON_TOKENS_H
#define CONCH_DAEMON_TOKENS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* The tenant name of the admin, who sees every tenant's sandboxes. */
#define CONCH_TOKENS_ADMIN "admin"
/* Tenant names: [a-zA-Z0-9][a-zA-Z0-9_.-]{0,63}. */
#define CONCH_TOKENS_NAME_MAX 64
/* The shortest token accepted: 16 characters (a guessable token is no token). */
#define CONCH_TOKENS_TOKEN_MIN 16
#define CONCH_TOKENS_TOKEN_MAX 4096

/* A tenant's quotas; 0: none (unlimited). */
struct conch_tenant_quota {
    unsigned sandboxes;    /* sandboxes it may hold at once (stopped ones included) */
    uint64_t memory_bytes; /* memory limits of its sandboxes, summed */
    uint64_t disk_bytes;   /* disk limits of its sandboxes, summed */
    unsigned commands;     /* commands (exec.run, jobs, session.run) running at once */
};

struct conch_token_entry {
    char tenant[CONCH_TOKENS_NAME_MAX + 1];
    unsigned char digest[32]; /* SHA-256 of the token */
    struct conch_tenant_quota quota;
};

struct conch_tokens {
    struct conch_token_entry *entries; /* owned, n of them */
    size_t n;
};

/*
 * conch_tokens_load - read @path into a new table (*@ret, free with conch_tokens_free). The
 * file must be a regular file (not a symlink) owned by the calling user and not readable,
 * writable or executable by group or other; lines are `TENANT TOKEN [key=value ...]` (keys
 * sandboxes=N memory=SIZE disk=SIZE commands=N), blank lines and `#` comments skipped. A
 * tenant or a token given twice, a bad key or value, or no tenant at all are refused. Errors
 * name the file and the line, never the token. Returns 0, or -errno with @err filled.
 */
int conch_tokens_load(const char *path, struct conch_tokens **ret, struct conch_err *err);

/* conch_tokens_free - free @t (NULL is ignored). */
void conch_tokens_free(struct conch_tokens *t);

/*
 * conch_tokens_match - the entry whose token is @token (@len bytes), or NULL. Every entry is
 * compared, each in constant time (SHA-256 digests, core/sha256.h), so the time taken says
 * nothing about which entry, or how much of one, matched. Borrowed from @t.
 */
const struct conch_token_entry *conch_tokens_match(const struct conch_tokens *t, const char *token,
                                                   size_t len);

/* conch_tokens_find - the entry of tenant @tenant, or NULL. Borrowed from @t. */
const struct conch_token_entry *conch_tokens_find(const struct conch_tokens *t, const char *tenant);

#endif
