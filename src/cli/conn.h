/* conn.h - the blocking JSON-RPC connection the daemon's client verbs (ps, exec, rm, create,
 * changes, diff, commit, discard, cp) share, and resolving a sandbox by id or name. */
#ifndef CONCH_CLI_CONN_H
#define CONCH_CLI_CONN_H

#include <jansson.h>
#include <stddef.h>

struct conch_cli_conn {
    int fd;
    char *buf;
    size_t len, cap;
};

/* conch_cli_conn_open - connect to the daemon at @path (NULL: the default socket), after
 * checking who owns it. Returns 0, or -1 after printing why. */
int conch_cli_conn_open(struct conch_cli_conn *c, const char *path);

/* conch_cli_conn_call - send one request (takes @params) and return its result (a new
 * reference), or NULL after printing the error on stderr. */
json_t *conch_cli_conn_call(struct conch_cli_conn *c, const char *method, json_t *params);

/* conch_cli_conn_close - close @c and free its buffer. */
void conch_cli_conn_close(struct conch_cli_conn *c);

/*
 * conch_cli_resolve - the id of the sandbox @ref names: a sandbox id, or the name given at
 * creation when exactly one sandbox has it. Writes it to @ret (@size bytes) and returns 0, or
 * prints why not (no such sandbox, a name several have) and returns -1.
 */
int conch_cli_resolve(struct conch_cli_conn *c, const char *ref, char *ret, size_t size);

#endif
