/* toolhost.h - `conch run --tools FILE`: the tool bridge without a harness. The tools (and
 * agent types) of a JSON file are served to the one command of a `conch run`, each call
 * answered by running the host command the file names for it. A thread of its own runs the
 * bridge's loop while conch run's loop pumps the command's output. It lives in cli/, above
 * the bridge, rpc and libuv; exec/ drives it through struct conch_run_tools. */
#ifndef CONCH_CLI_TOOLHOST_H
#define CONCH_CLI_TOOLHOST_H

#include "core/error.h"
#include "exec/run.h"

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

/* conch_toolhost_tools - @h as conch run's tool server (conch_run_opts.tools): its start
 * serves the listening socket in a new thread (every call from the sandbox counts toward
 * origin {"run", "1"}); its finish cancels the calls still running (their host commands
 * killed), stops the thread and reports what the command called. Borrowed from @h. */
struct conch_run_tools *conch_toolhost_tools(struct conch_toolhost *h);

/* conch_toolhost_free - free @h (finishing it first if needed). NULL is a no-op. */
void conch_toolhost_free(struct conch_toolhost *h);

#endif
