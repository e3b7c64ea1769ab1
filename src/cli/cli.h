/* cli.h - the subcommands of the `conch` binary, one function per verb. Each returns the
 * process exit status. Only cli/ turns a conch_err into an exit status. */
#ifndef CONCH_CLI_CLI_H
#define CONCH_CLI_CLI_H

#include <stdbool.h>

/* Exit statuses of `conch run` besides the command's own (documented in README.md). */
#define CONCH_EXIT_TIMEOUT 124
#define CONCH_EXIT_INFRA 125
#define CONCH_EXIT_USAGE 2

int conch_cli_run(int argc, char **argv);

struct conch_run_opts;
struct conch_jail;
/* conch_cli_lease - when a daemon of this user runs (at @socket_path, NULL: the default) and
 * @o fits its pool's sandboxes, borrow one with @o's workspace attached (lease.c). Returns 1
 * with *@ret, or 0 (build one instead). */
int conch_cli_lease(const struct conch_run_opts *o, const char *socket_path,
                    struct conch_jail **ret);
/* conch_cli_lease_end - give the borrowed sandbox back: @clean, every event of its command was
 * read (the daemon makes it as new for its pool); otherwise the daemon destroys it. */
void conch_cli_lease_end(bool clean);
int conch_cli_doctor(int argc, char **argv);
int conch_cli_serve(int argc, char **argv);
int conch_cli_gc(int argc, char **argv);
int conch_cli_ps(int argc, char **argv);
int conch_cli_exec(int argc, char **argv);
int conch_cli_rm(int argc, char **argv);
int conch_cli_start(int argc, char **argv);
int conch_cli_logs(int argc, char **argv);
int conch_cli_mcp(int argc, char **argv);
struct conch_mcp_opts;
struct conch_mcp_http_opts;
struct conch_err;
/* `conch mcp --listen`'s server (conch_mcp_serve_http): set by conch-remote's main, where the
 * TLS code is linked; NULL in conch, whose `mcp --listen` execs conch-remote instead. */
extern int (*conch_cli_mcp_http)(const struct conch_mcp_opts *o,
                                 const struct conch_mcp_http_opts *h, struct conch_err *err);
/* `conch-remote __gateway ...`: the remote transport's gateway process (hidden; src/remote),
 * in conch-remote only. */
int conch_cli_gateway(int argc, char **argv);
/* `conch __js-worker [--fd N]`: the JS worker (hidden; src/js's conch_js_worker_serve). */
int conch_cli_js_worker(int argc, char **argv);
int conch_cli_js(int argc, char **argv);
int conch_cli_shell(int argc, char **argv);
int conch_cli_attach(int argc, char **argv);
int conch_cli_sessions(int argc, char **argv);
int conch_cli_create(int argc, char **argv);
/* conch network: a sandbox's network policy and log (sandbox.c). */
int conch_cli_network(int argc, char **argv);
int conch_cli_changes(int argc, char **argv);
int conch_cli_diff(int argc, char **argv);
int conch_cli_commit(int argc, char **argv);
int conch_cli_discard(int argc, char **argv);
/* snapshot.c: conch snapshot, restore, fork, snapshots */
int conch_cli_snapshot(int argc, char **argv);
int conch_cli_restore(int argc, char **argv);
int conch_cli_fork(int argc, char **argv);
int conch_cli_snapshots(int argc, char **argv);
/* store.c: conch store list|ls|cat|put|rm */
int conch_cli_store(int argc, char **argv);
int conch_cli_cp(int argc, char **argv);

#endif
