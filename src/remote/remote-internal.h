/* remote-internal.h - what the files of the remote module share: the gateway's blocking
 * calls to the daemon (the auth and health checks before a WebSocket upgrade). */
#ifndef CONCH_REMOTE_INTERNAL_H
#define CONCH_REMOTE_INTERNAL_H

#include <jansson.h>

/* How long the gateway waits for the daemon's answer to connection.auth or daemon.ping. */
#define CONCH_REMOTE_DAEMON_TIMEOUT_MS 5000

/* conch_remote_daemon_connect - a blocking connection to the daemon's socket @path (close-on-
 * exec). Returns the fd, or -errno. */
int conch_remote_daemon_connect(const char *path);

/*
 * conch_remote_daemon_call - send one JSON-RPC request (@params stolen) on @fd and wait at
 * most @timeout_ms for its answer, reading exactly up to the end of that answer's line (what
 * follows stays in the socket for the forwarding). Returns 0 with the result in *@result (the
 * caller's), 1 with the JSON-RPC error code in *@code, or -errno (-ETIMEDOUT, -EPROTO when
 * the answer is not JSON-RPC, -ECONNRESET when the daemon closed).
 */
int conch_remote_daemon_call(int fd, const char *method, json_t *params, int timeout_ms,
                             json_t **result, int *code);

#endif
