/* daemon.h - `conch serve`: long-lived sandboxes driven over JSON-RPC 2.0 (docs/PROTOCOL.md)
 * on a unix socket or on stdin/stdout, with one libuv event loop. */
#ifndef CONCH_DAEMON_DAEMON_H
#define CONCH_DAEMON_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

struct conch_daemon_opts {
    const char *socket_path; /* NULL: the default for this user (see conch_daemon_socket) */
    bool stdio;              /* serve one client on stdin/stdout instead of a socket */
    const char *state_dir;   /* NULL: /var/lib/conch (root) or $XDG_STATE_HOME/conch */
    size_t max_message;      /* bytes per JSON-RPC line (default 16 MiB) */
    unsigned pool_size;      /* pre-built default sandboxes for `fresh` (default 4) */
    unsigned max_sandboxes;  /* default 256 */
    double idle_timeout;     /* default idle timeout of a sandbox, seconds (default 3600) */
    /* Budgets of what sandboxes and clients make the daemon hold (docs/ARCHITECTURE.md,
     * "Budgets"): what the daemon holds for a sandbox (its tool bridge, its file answers,
     * its sessions' scrollback and keys), per sandbox and all together, and the output of
     * commands kept in memory, all together. */
    uint64_t max_sandbox_held;  /* default 64 MiB */
    uint64_t max_held;          /* default 256 MiB */
    uint64_t max_output_memory; /* default 64 MiB */
    /* Responses queued for clients that have not read them, all clients together (each one
     * is also held to CLIENT_OUTPUT_HARD): past it, the clients with the most unread are
     * disconnected. Default 128 MiB. */
    uint64_t max_client_output_memory;
    /* A hosts-format file the network proxy resolves names by before DNS (tests point
     * registry names at loopback servers with it); NULL: DNS only. */
    const char *net_hosts;
    /* The tokens file (`TENANT TOKEN [quota=value ...]` lines, mode 0600, ours): tenants that
     * connection.auth restricts a connection to (docs/ARCHITECTURE.md, "Tenants"); reloaded
     * on SIGHUP. NULL: none (connection.auth always fails). */
    const char *tokens_path;
    /* Called on the daemon's loop: once it listens (with its socket's path), and on each
     * SIGHUP (`conch serve --listen` starts its gateway and forwards SIGHUP with them). */
    void (*on_listening)(void *ctx, const char *socket_path);
    void (*on_sighup)(void *ctx);
    void *hook_ctx;
};

/* conch_daemon_opts_init - the defaults above. */
void conch_daemon_opts_init(struct conch_daemon_opts *o);

/* conch_daemon_socket - the default socket path of this user into @buf. */
void conch_daemon_socket(char *buf, size_t size);

/*
 * conch_daemon_socket_check - refuse a socket path that another user could have planted or
 * could swap: its directory must be owned by the caller or root (a symlink to it too) and
 * writable by no one else unless sticky; when @connecting, @path must also be a socket owned
 * by the caller or root. Returns 0, or -errno with @err naming the path and the fix.
 */
int conch_daemon_socket_check(const char *path, bool connecting, struct conch_err *err);

/*
 * conch_daemon_run - serve until SIGTERM/SIGINT (socket) or EOF on stdin (--stdio). On start
 * it reaps what a previous daemon left (processes, cgroups) and lists its sandboxes as
 * stopped. Returns 0 after a clean shutdown (every sandbox process killed), or -errno with
 * @err when it could not start.
 */
int conch_daemon_run(const struct conch_daemon_opts *o, struct conch_err *err);

#endif
