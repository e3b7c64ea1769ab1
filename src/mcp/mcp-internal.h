/* mcp-internal.h - what the MCP session (session.c), its transports (server.c: stdio; http.c:
 * Streamable HTTP) and the tool table (tools.c) share: the session object, a tool call in
 * flight and the calls a tool makes to the daemon. */
#ifndef CONCH_MCP_INTERNAL_H
#define CONCH_MCP_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

struct mcp;
struct mcp_call;
struct mcp_linebuf;
struct conch_mcp_opts;

struct mcp_tool {
    const char *name;
    const char *title;
    const char *description;
    const char *schema; /* the input schema, JSON text */
    bool read_only;     /* annotations.readOnlyHint */
    bool destructive;   /* annotations.destructiveHint */
    /* Check the arguments and call the daemon (conch_mcp_daemon_call) or finish
     * (conch_mcp_call_done). NULL for internal calls that answer no MCP request (the
     * transport's own: http.c's connection.auth, the end of a session). */
    void (*start)(struct mcp *m, struct mcp_call *c);
    /* The daemon answered the call's request: @res, or @error (its error object). Both
     * borrowed. Calls the daemon again or finishes. */
    void (*reply)(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error);
};

/* One tools/call (or the session's sandbox.create) in flight. */
struct mcp_call {
    struct mcp_call *next; /* in the session's list of calls awaiting the daemon */
    const struct mcp_tool *tool;
    json_t *id;         /* the MCP request's id; owned */
    json_t *args;       /* the tool's arguments (an object); owned */
    uint64_t daemon_id; /* the daemon request it awaits; 0 = none */
    int stage;          /* for tools that make more than one request */
    bool parked;        /* waits for another call of its tool (conch_mcp_call_park) */
};

/* ---- the session object ---- */

/* How a session reaches its MCP client. */
struct mcp_io {
    /* One JSON-RPC message (taken) for the client: an answer, carrying its request's id (or
     * null for a message that could not be read). */
    void (*to_client)(void *ctx, json_t *msg);
    void *ctx;
};

/* conch_mcp_session_new - a session over the daemon connection @daemon_in (requests are
 * written to it) / @daemon_out (read from it; may be the same fd), both borrowed, with the
 * tools/list result @tools_list (borrowed, outlives the session) and @state_dir (the daemon's:
 * host paths under it mean nothing in the sandbox; NULL: unknown). NULL when out of memory. */
struct mcp *conch_mcp_session_new(const struct conch_mcp_opts *o, const json_t *tools_list,
                                  const struct mcp_io *io, int daemon_in, int daemon_out,
                                  const char *state_dir);
/* conch_mcp_session_sandbox_opts - the sandbox's name (borrowed; NULL: none; default "mcp")
 * and idle_timeout (seconds; default 0: never) for the sandbox.create of initialize. */
void conch_mcp_session_sandbox_opts(struct mcp *m, const char *name, double idle_timeout);
/* conch_mcp_session_free - free @m and its calls in flight (nothing is sent; fds not closed). */
void conch_mcp_session_free(struct mcp *m);
void *conch_mcp_session_ctx(const struct mcp *m); /* the io's ctx */

/* conch_mcp_session_message - one message of the MCP client (@msg borrowed; any JSON value:
 * what is not a JSON-RPC 2.0 request or notification is answered with an error). */
void conch_mcp_session_message(struct mcp *m, json_t *msg);
/* conch_mcp_session_line - the same for one line of JSON text (a parse error answered). */
void conch_mcp_session_line(void *m, const char *line, size_t len);
/* conch_mcp_session_too_large - answer the oversize line @b dropped (its id sniffed). */
void conch_mcp_session_too_large(void *m, struct mcp_linebuf *b);
/* conch_mcp_session_send_error - a JSON-RPC error @code, @msg for request @id (NULL: null). */
void conch_mcp_session_send_error(struct mcp *m, json_t *id, int code, const char *msg);
/* conch_mcp_tools_list - the tools/list result (a new object), or NULL with @err. */
json_t *conch_mcp_tools_list(struct conch_err *err);

/* conch_mcp_session_daemon_input - read the daemon connection once (poll said readable) and
 * handle its whole messages. Returns 1, or 0 when it is gone (calls in flight then failed). */
int conch_mcp_session_daemon_input(struct mcp *m);
/* conch_mcp_session_daemon_lost - the daemon is gone: fail every call in flight. */
void conch_mcp_session_daemon_lost(struct mcp *m);

/* conch_mcp_session_end - the end of a session, blocking: close the shell, commit if asked,
 * destroy the sandbox, each waited for (2 minutes at most). Returns 0 or -errno with @err
 * when a commit failed. */
int conch_mcp_session_end(struct mcp *m, struct conch_err *err);
/* conch_mcp_session_end_async - the same without waiting and without the commit: the
 * requests are sent; the session is over when conch_mcp_session_done says so (answers to
 * MCP requests still in flight keep going to the io, which drops them). */
void conch_mcp_session_end_async(struct mcp *m);
/* conch_mcp_session_done - true when no request of the session's end (nor a sandbox.create,
 * whose sandbox is destroyed as soon as made) awaits the daemon, or the daemon is gone. */
bool conch_mcp_session_done(const struct mcp *m);

/* ---- tools ---- */

extern const struct mcp_tool conch_mcp_tools[]; /* ends with a NULL name */
/* The snapshot tools (tools-snapshot.c); ends with a NULL name. */
extern const struct mcp_tool conch_mcp_snapshot_tools[];

/* conch_mcp_arg_str, conch_mcp_arg_bool - the argument @key of @c (a string without NUL; a
 * boolean, false when absent) into *@ret; false after answering @c with a tool error when it
 * is wrong (or missing and @required). */
bool conch_mcp_arg_str(struct mcp *m, struct mcp_call *c, const char *key, bool required,
                       const char **ret);
bool conch_mcp_arg_bool(struct mcp *m, struct mcp_call *c, const char *key, bool *ret);

/* conch_mcp_daemon_call - send @method with @params (stolen; "sandbox" is added when @c's tool
 * works on the session's sandbox) and have @c's tool's reply() called with the answer. */
void conch_mcp_daemon_call(struct mcp *m, struct mcp_call *c, const char *method, json_t *params);

/* conch_mcp_call_done - answer @c with one text item of @len bytes of @text (borrowed), as a tool
 * error when @is_error; the text is capped at the session's output size. Frees @c. */
void conch_mcp_call_done(struct mcp *m, struct mcp_call *c, bool is_error, const char *text,
                         size_t len);

/* conch_mcp_call_donef - conch_mcp_call_done with a printf-formatted text. */
void conch_mcp_call_donef(struct mcp *m, struct mcp_call *c, bool is_error, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* conch_mcp_call_free - forget @c (an internal call, done) without answering anything. */
void conch_mcp_call_free(struct mcp *m, struct mcp_call *c);

/* conch_mcp_call_fail_daemon - answer @c with the daemon's error object @error as a tool error. */
void conch_mcp_call_fail_daemon(struct mcp *m, struct mcp_call *c, json_t *error);

const char *conch_mcp_sandbox_id(const struct mcp *m);
/* conch_mcp_set_sandbox - the session's tools work on sandbox @id from now on (a fork). */
void conch_mcp_set_sandbox(struct mcp *m, const char *id);
size_t conch_mcp_max_output(const struct mcp *m);
/* The child daemon's state dir: host paths under it mean nothing inside the sandbox. */
const char *conch_mcp_state_dir(const struct mcp *m);
uint64_t conch_mcp_default_timeout_ms(const struct mcp *m);
/* conch_mcp_call_park - keep @c until conch_mcp_call_unpark returns it (it waits for another call
 * of its tool, e.g. the opening of the shell session); parked calls fail if the daemon exits. */
void conch_mcp_call_park(struct mcp *m, struct mcp_call *c);
/* conch_mcp_call_unpark - the oldest parked call of @tool, no longer parked, or NULL. */
struct mcp_call *conch_mcp_call_unpark(struct mcp *m, const struct mcp_tool *tool);

/* The session of the `shell` tool: its id ("" until opened), set with NULL or "" to forget
 * it, and whether its session.open is in flight. Closed at the end of the MCP session. */
const char *conch_mcp_shell_session(const struct mcp *m);
void conch_mcp_shell_set_session(struct mcp *m, const char *id);
bool *conch_mcp_shell_opening(struct mcp *m);

/* The read offsets of each background job the model has read (job id -> [stdout, stderr]). */
json_t *conch_mcp_job_offsets(struct mcp *m);

/* A buffer of newline-delimited input with a cap on the line length. */
#define MCP_SNIFF 4096 /* bytes kept of each end of an oversize line */
struct mcp_linebuf {
    char *buf; /* owned; free it when done */
    size_t len, cap;
    size_t max;                            /* longest line kept; set before use */
    bool skipping;                         /* dropping the rest of an oversize line */
    char head[MCP_SNIFF], tail[MCP_SNIFF]; /* the first and last bytes of an oversize line */
    size_t head_len, tail_len;
};

/* conch_mcp_linebuf_fill - one read(2) of @fd into @b. Returns 1 (read or retry), 0 at EOF, -errno.
 */
int conch_mcp_linebuf_fill(struct mcp_linebuf *b, int fd);

/*
 * conch_mcp_linebuf_lines - hand every complete line in @b to @fn (leading blanks and a trailing \r
 * stripped, empty lines skipped). A line longer than b->max is not kept: @too_large is called
 * once its end arrives, with its first and last MCP_SNIFF bytes in b->head and b->tail.
 */
void conch_mcp_linebuf_lines(struct mcp_linebuf *b, void *ctx,
                             void (*fn)(void *ctx, const char *line, size_t len),
                             void (*too_large)(void *ctx, struct mcp_linebuf *b));

/*
 * conch_mcp_sniff_id - the JSON-RPC id of the oversize line that @b just dropped: the top-level
 * "id" member when it comes in the line's first bytes, or when it ends the object (as the
 * MCP SDK serialises requests). Returns a new integer or string, or NULL.
 */
json_t *conch_mcp_sniff_id(const struct mcp_linebuf *b);

/*
 * conch_mcp_cap_text - @len bytes of @s, or when longer than @max its head and tail around a note
 * saying how much was left out. Cuts only between UTF-8 sequences. Returns a new string
 * (caller frees) and its length in *@ret_len, or NULL when out of memory.
 */
char *conch_mcp_cap_text(const char *s, size_t len, size_t max, size_t *ret_len);

#endif
