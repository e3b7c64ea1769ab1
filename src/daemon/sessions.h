/* sessions.h - sessions (sessions.c, with session-io.c and session-run.c behind
 * session-internal.h): a long-lived shell on a pty inside a sandbox, driven command by command
 * (session.run) or as a raw terminal shared by attached clients. */
#ifndef CONCH_DAEMON_SESSIONS_H
#define CONCH_DAEMON_SESSIONS_H

#include <stddef.h>
#include <jansson.h>

#include "rpc/rpc.h"

void conch_daemon_handle_session_open(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_run(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_write(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_attach(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_detach(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_resize(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_signal(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_list(struct conch_rpc_call *call, json_t *params, void *ctx);
void conch_daemon_handle_session_close(struct conch_rpc_call *call, json_t *params, void *ctx);

struct daemon;
/* conch_daemon_sessions_recover - list the sessions recorded by a previous daemon
 * (<state>/sessions/) as ended, with their last scrollback. Call once at start. */
void conch_daemon_sessions_recover(struct daemon *d);

struct sandbox;
/* conch_daemon_sessions_sandbox_gone - @sb goes (out of the registry, about to be freed): its
 * sessions, ended with it, hold nothing more for it (their scrollback and keys are uncharged
 * from its budget; the ended sessions' scrollback stays as it is, listed). */
void conch_daemon_sessions_sandbox_gone(struct sandbox *sb);

/* conch_daemon_sessions_live - how many sessions of @sb have a shell (starting or live); their
 * ids, comma-separated, in @buf (@size bytes, cut short when full). */
size_t conch_daemon_sessions_live(const struct sandbox *sb, char *buf, size_t size);

#endif
