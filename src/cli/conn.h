/* conn.h - the JSON-RPC connection the daemon's client verbs (ps, exec, rm, create, changes,
 * diff, commit, discard, cp, shell, attach, sessions) share, and resolving a sandbox by id or
 * name. */
#ifndef CONCH_CLI_CONN_H
#define CONCH_CLI_CONN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "core/error.h"
#include "rpc/rpc.h"

struct conch_cli_conn {
    int fd;
    struct conch_rpc_reader in; /* what was read and not yet taken as messages */
    int next_id;                /* of the last request */
    bool remote;                /* over the remote transport (remote-conn.c) */
};

/* conch_cli_connect - a connected socket to the daemon at @path (NULL: the default socket),
 * after checking who owns it. Returns the fd, or -errno with @err (nothing printed). */
int conch_cli_connect(const char *path, struct conch_err *err);

/* conch_cli_conn_open - connect to the remote daemon when one is named (--remote, $CONCH_URL:
 * see conch_cli_remote_url), else to the daemon at @path (NULL: the default socket), after
 * checking who owns it. Returns 0, or -1 after printing why. */
int conch_cli_conn_open(struct conch_cli_conn *c, const char *path);

/* conch_cli_conn_call - send one request (takes @params) and return its result (a new
 * reference), or NULL after printing the error on stderr. Notifications and answers to
 * other requests that arrive meanwhile are dropped. */
json_t *conch_cli_conn_call(struct conch_cli_conn *c, const char *method, json_t *params);

/* conch_cli_conn_send - send one request (takes @params) without waiting; its id in *@ret_id
 * (may be NULL). Returns 0 or -1 (errno set: EILSEQ for NULL @params, what a json_pack of
 * arguments that are not UTF-8 gives). */
int conch_cli_conn_send(struct conch_cli_conn *c, const char *method, json_t *params, int *ret_id);

/* conch_cli_conn_fill - read from the socket once (poll said readable, or to block for more).
 * Returns false at EOF or on an error. */
bool conch_cli_conn_fill(struct conch_cli_conn *c);

/* conch_cli_conn_next - the next whole message (a new reference): from what is buffered, and
 * when @block, reading until one is complete. NULL: none buffered (!@block), or EOF. */
json_t *conch_cli_conn_next(struct conch_cli_conn *c, bool block);

/* conch_cli_error_text - the daemon's error message @msg for a person at the command line: the
 * protocol methods it names become the verbs that do the same. Returns a new string (NULL:
 * out of memory). */
char *conch_cli_error_text(const char *msg);

/* conch_cli_now - the wall clock in seconds (the daemon's timestamps are). */
double conch_cli_now(void);

/* conch_cli_format_age - @s seconds as "42s", "5m", "3h", "2d" into @buf. */
void conch_cli_format_age(double s, char *buf, size_t size);

/* conch_cli_conn_close - close @c and free its buffer. */
void conch_cli_conn_close(struct conch_cli_conn *c);

/*
 * conch_cli_resolve - the id of the sandbox @ref names: a sandbox id, or the name given at
 * creation when exactly one sandbox has it. Writes it to @ret (@size bytes) and returns 0, or
 * prints why not (no such sandbox, a name several have) and returns -1.
 */
int conch_cli_resolve(struct conch_cli_conn *c, const char *ref, char *ret, size_t size);

/* conch_cli_tty_exec - `conch exec -t`: run @cmd (bash-quoted words) on a new session of the
 * sandbox @sbid (env @env and @cwd may be NULL), this terminal its keyboard and screen, then
 * forget the session once it ended (shell.c). Returns the exit status. */
int conch_cli_tty_exec(struct conch_cli_conn *c, const char *sbid, const char *cmd, json_t *env,
                       const char *cwd);

/* The remote daemon (remote-conn.c): a WebSocket on TLS to `conch serve --listen`. */

/* conch_cli_remote_set_url - `--remote URL` (wss://HOST[:PORT][/PATH]); @url is borrowed for
 * the process's life. Returns 0, or -EINVAL with @err (kind usage). */
int conch_cli_remote_set_url(const char *url, struct conch_err *err);

/* conch_cli_remote_set_token_file - `--token-file FILE`: the token is its first line. The
 * file must be a regular file of ours that no one else can read. Returns 0 or -errno. */
int conch_cli_remote_set_token_file(const char *file, struct conch_err *err);

/* conch_cli_remote_url - the remote daemon's URL: --remote, else $CONCH_URL, else NULL (the
 * unix socket). */
const char *conch_cli_remote_url(void);

/* conch_cli_remote_given - whether --remote or --token-file was given on the command line. */
bool conch_cli_remote_given(void);

/*
 * conch_cli_remote_connect - connect to conch_cli_remote_url() with the token of --token-file
 * or $CONCH_TOKEN (sent once, in the upgrade request's Authorization header) and the CA of
 * $CONCH_CA added to the system's; the server's certificate and hostname are verified. Returns
 * an fd carrying the daemon's line-framed JSON-RPC (`conch-remote __connect`, a process of
 * its own, pumps it to and from the WebSocket; closing it closes the connection), or -errno
 * with @err. Once per process.
 */
int conch_cli_remote_connect(struct conch_err *err);

/* conch_cli_remote_parse_url - wss://HOST[:PORT][/PATH] into @host, @port (443 by default) and
 * @path (/rpc by default). Returns 0, or -EINVAL with @err (kind usage). */
int conch_cli_remote_parse_url(const char *url, char *host, size_t hsize, int *port, char *path,
                               size_t psize, struct conch_err *err);

/*
 * conch_cli_remote_helper - open conch-remote, the executable the TLS code lives in (the
 * gateway, this client's WebSocket, `conch mcp --listen`): beside this binary (a build
 * tree, or both in one bin/), else at ../libexec/conch/ from it (meson install). Returns an
 * O_CLOEXEC fd to exec, or -ENOENT with @err saying where it looked.
 */
int conch_cli_remote_helper(struct conch_err *err);

/* conch_cli_remote_exec - exec the helper @helper (conch_cli_remote_helper) with @argv and
 * @envp (NULL: this environment). Returns -errno only if the exec failed. */
int conch_cli_remote_exec(int helper, char **argv, char **envp);

/* conch_cli_remote_bridge - `conch-remote __connect URL` (remote-bridge.c, in conch-remote
 * only): the WebSocket for conch_cli_remote_connect, on fds 3 and 4. */
int conch_cli_remote_bridge(int argc, char **argv);

#endif
