/* mcp.h - `conch mcp`: a Model Context Protocol server (revision 2025-06-18, stdio transport)
 * that gives an MCP client one sandbox per session and tools over it. It translates MCP to
 * the daemon's JSON-RPC: it runs its own `conch serve --stdio` child and is that child's
 * only client (docs/ARCHITECTURE.md says why). */
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

#endif
