/* toolhost.h - `conch run --tools FILE`: the tool bridge without a harness. The tools (and
 * agent types) of a JSON file are served to the one command of a `conch run`, each call
 * answered by running the host command the file names for it. A thread of its own runs the
 * bridge's loop while conch run's loop pumps the command's output. */
#ifndef CONCH_EXEC_TOOLHOST_H
#define CONCH_EXEC_TOOLHOST_H

#include "bridge/bridge.h"
#include "core/error.h"

struct conch_toolhost;

/*
 * conch_toolhost_load - read the tools file @path:
 *   {"tools": [{"name", "description", "input_schema", "command": ["prog", "arg", ...],
 *               "timeout"?: seconds}],
 *    "agents": [{"name", "description", "command": [...]}]}
 * (a top-level array is a list of tools). Checks everything (names, schemas, commands) so
 * that a bad file fails before any sandbox is built. Returns 0 with *@ret, or -errno with
 * @err (kind usage) naming the problem.
 */
int conch_toolhost_load(const char *path, struct conch_toolhost **ret, struct conch_err *err);

/* conch_toolhost_start - serve @listen_fd (taken over: conch_jail_take_ptc_fd) in a new
 * thread. Every call from the sandbox counts toward origin {"run", "1"}. Returns 0 or
 * -errno with @err. */
int conch_toolhost_start(struct conch_toolhost *h, int listen_fd, struct conch_err *err);

/* conch_toolhost_finish - the command ended: calls still running are cancelled (their host
 * commands killed), the thread stops, and *@ret gets what the command called. */
void conch_toolhost_finish(struct conch_toolhost *h, struct conch_bridge_report *ret);

/* conch_toolhost_free - free @h (finishing it first if needed). NULL is a no-op. */
void conch_toolhost_free(struct conch_toolhost *h);

#endif
