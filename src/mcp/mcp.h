/* mcp.h - `conch mcp`: a Model Context Protocol server (revision 2025-06-18) that gives an MCP
 * client one sandbox per session and tools over it. It translates MCP to the daemon's
 * JSON-RPC. On stdio it runs its own `conch serve --stdio` child and is that child's only
 * client; over Streamable HTTP (`--listen`) each session is a connection to a running daemon,
 * authenticated with the client's bearer token (docs/ARCHITECTURE.md says why). */
#ifndef CONCH_MCP_MCP_H
#define CONCH_MCP_MCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "spec/spec.h"

struct conch_mcp_opts {
    const char *conch_exe;    /* binary run as `serve --stdio`; NULL: /proc/self/exe */
    const char *state_dir;    /* the child daemon's state dir, kept; NULL: a private one */
    const char *state_parent; /* where the private state dir is made (created 0700 if
                               * missing) and removed at the end; required without state_dir */
    /* The session's sandbox, sent as sandbox.create params (conch_spec_to_json), its name
     * "mcp" and no idle timeout; workspace and rootfs are absolute host dirs (NULL: an empty
     * workspace, the host's root). Borrowed, env included. */
    struct conch_sandbox_spec sandbox;
    uint64_t timeout_ms; /* default timeout of a `bash` call (default 120 s); 0 = none */
    size_t max_output;   /* bytes of text in one tool result (default 64 KiB) */
    bool commit_on_exit; /* commit the workspace's changes when the session ends */
};

/* conch_mcp_opts_init - the defaults above (the sandbox's: conch_spec_defaults). */
void conch_mcp_opts_init(struct conch_mcp_opts *o);

/*
 * conch_mcp_serve - serve one MCP session on @in_fd/@out_fd (newline-delimited JSON-RPC),
 * both borrowed. Starts the daemon child first; the sandbox is created when the client sends
 * `initialize` (a failure is answered as that request's error). Returns when @in_fd reaches
 * EOF or on SIGTERM/SIGINT/SIGHUP, after committing (if asked) and destroying the sandbox,
 * ending the child and removing a private state dir. Returns 0, or -errno with @err filled
 * when the session could not start or its end failed (a commit that failed, say).
 */
int conch_mcp_serve(const struct conch_mcp_opts *o, int in_fd, int out_fd, struct conch_err *err);

/* The Streamable HTTP transport (conch_mcp_serve_http). */
struct conch_mcp_http_opts {
    const char *listen;   /* "HOST:PORT" ("[::1]:PORT"); port 0: any free one */
    const char *tls_cert; /* PEM certificate chain and key; required */
    const char *tls_key;
    const char *socket; /* the daemon's unix socket; NULL: the default one */
    /* Connect to the daemon at @path (NULL: the default socket), checking who owns it;
     * returns the fd or -errno with @err. */
    int (*connect)(const char *path, struct conch_err *err);
    size_t max_body;            /* largest POST body (default 32 MiB) */
    unsigned max_sessions;      /* sessions at once (default 64) */
    unsigned idle_timeout_s;    /* a session with no request for this long ends (1800) */
    const char *const *origins; /* Origin values allowed besides local ones on loopback */
    size_t n_origins;
};

/* conch_mcp_http_opts_init - the defaults above. */
void conch_mcp_http_opts_init(struct conch_mcp_http_opts *h);

/*
 * conch_mcp_serve_http - serve MCP's Streamable HTTP transport at https://@h->listen/mcp
 * until SIGTERM, SIGINT or SIGHUP; each session gets the sandbox of @o (without host paths: a
 * tenant may not name them) on its own daemon connection, as its bearer token's tenant.
 * Returns 0, or -errno with @err when it could not start.
 */
int conch_mcp_serve_http(const struct conch_mcp_opts *o, const struct conch_mcp_http_opts *h,
                         struct conch_err *err);

#endif
