/* store-internal.h - what store-db.c lends store-sync.c: the open database and its
 * transaction steps. Not for other modules (workspace.h has the stores' API). */
#ifndef CONCH_WORKSPACE_STORE_INTERNAL_H
#define CONCH_WORKSPACE_STORE_INTERNAL_H

#include <sqlite3.h>
#include <stdint.h>

#include "core/error.h"
#include "workspace/workspace.h"

struct conch_store {
    sqlite3 *db;
    char name[CONCH_STORE_NAME_MAX + 1];
    uint64_t max_bytes;
};

int conch_store__exec(struct conch_store *s, const char *sql, struct conch_err *err);
int conch_store__prepare(struct conch_store *s, const char *sql, sqlite3_stmt **ret,
                         struct conch_err *err);
int conch_store__begin(struct conch_store *s, struct conch_err *err);
int conch_store__commit(struct conch_store *s, struct conch_err *err);
void conch_store__rollback(struct conch_store *s);
/* The store's version now, and the next one (taken inside a transaction). */
int conch_store__version(struct conch_store *s, int64_t *ret, struct conch_err *err);
int conch_store__next_version(struct conch_store *s, int64_t *ret, struct conch_err *err);
/* Write (or delete) @path at @version by @writer; @base: the version the writer last saw of it
 * (-1: unknown), so that a concurrent update it replaces is recorded in the history. */
int conch_store__put(struct conch_store *s, const char *path, int kind, const void *buf, size_t len,
                     uint32_t mode, double mtime, int64_t base, const char *writer, int64_t version,
                     struct conch_err *err);
int conch_store__del(struct conch_store *s, const char *path, int64_t base, const char *writer,
                     int64_t version, struct conch_err *err);
int conch_store__total(struct conch_store *s, uint64_t *ret_bytes, uint64_t *ret_entries,
                       struct conch_err *err);
/* Check the caps, trim the history and commit; on failure roll back. */
int conch_store__finish(struct conch_store *s, struct conch_err *err);

#endif
