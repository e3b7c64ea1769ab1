/* rpc.h - conch's JSON-RPC 2.0 layer: newline framing with a size cap, building responses and
 * errors (the codes of docs/PROTOCOL.md), and dispatching requests and batches through a method
 * table whose handlers may reply at once or later. The only code in conch that speaks JSON-RPC.
 *
 * The server side is single-threaded: call it from the daemon's event loop only. The client side
 * ("A client", at the end) is the one JSON-RPC client in C: conch's client verbs, conch run's
 * lease and conch mcp build their requests and read their answers with it. */
#ifndef CONCH_RPC_RPC_H
#define CONCH_RPC_RPC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/budget.h"
#include "core/error.h"

/* Standard JSON-RPC 2.0 codes. */
#define CONCH_RPC_PARSE_ERROR -32700      /* parse_error */
#define CONCH_RPC_INVALID_REQUEST -32600  /* invalid_request, message_too_large */
#define CONCH_RPC_METHOD_NOT_FOUND -32601 /* method_not_found */
#define CONCH_RPC_INVALID_PARAMS -32602   /* invalid_params */
#define CONCH_RPC_INTERNAL_ERROR -32603   /* internal_error */

/* conch's application codes (docs/PROTOCOL.md "Errors"); the comment is the data.code. */
#define CONCH_RPC_INFRASTRUCTURE -32001     /* infrastructure */
#define CONCH_RPC_SANDBOX_NOT_FOUND -32002  /* sandbox_not_found */
#define CONCH_RPC_JOB_NOT_FOUND -32003      /* job_not_found */
#define CONCH_RPC_LIMIT -32004              /* limit */
#define CONCH_RPC_SANDBOX_STOPPED -32005    /* sandbox_stopped */
#define CONCH_RPC_BUSY -32006               /* busy */
#define CONCH_RPC_SNAPSHOT_NOT_FOUND -32007 /* snapshot_not_found */
#define CONCH_RPC_SNAPSHOT_IN_USE -32008    /* snapshot_in_use */
#define CONCH_RPC_FILE_NOT_FOUND -32010     /* file_not_found */
#define CONCH_RPC_PERMISSION_DENIED -32011  /* permission_denied */
#define CONCH_RPC_IS_DIRECTORY -32012       /* is_directory */
#define CONCH_RPC_INVALID_PATH -32013       /* invalid_path */
#define CONCH_RPC_NOT_A_DIRECTORY -32014    /* not_a_directory */
#define CONCH_RPC_STRING_NOT_FOUND -32015   /* string_not_found */
#define CONCH_RPC_AMBIGUOUS_MATCH -32016    /* ambiguous_match */
#define CONCH_RPC_TOO_LARGE -32017          /* too_large */
#define CONCH_RPC_UNAUTHORIZED -32020       /* unauthorized: connection.auth's token is wrong */
#define CONCH_RPC_RATE_LIMITED -32021       /* rate_limited: too many failed authentications */
#define CONCH_RPC_FORBIDDEN -32022          /* forbidden: not for a tenant's connection */

/* ---- Framing ---------------------------------------------------------------------------- */

/*
 * struct conch_rpc_framer - splits a byte stream into lines. Caller-allocated; the fields are
 * private. Memory stays bounded: at most @max_message + 2 bytes are ever buffered.
 */
/*
 * struct conch_rpc_idscan - finds the "id" member of a request object fed in pieces, in
 * constant memory: it skips every other member's value (however long) and copies only the
 * id's, so the id of an oversize line is found wherever it is, even after `params`.
 * Caller-allocated; zero it (or conch_rpc_idscan_init) before the first feed.
 */
struct conch_rpc_idscan {
    int result;        /* 0 scanning, 1 found (@id set), -1 not recoverable */
    json_t *id;        /* owned: the id once found */
    size_t depth;      /* nesting depth outside strings; 1 = the top object's members */
    bool started;      /* the opening '{' was seen */
    bool in_str, esc;  /* inside a string, after a backslash */
    bool expect_key;   /* at depth 1: the next string is a member name */
    bool in_key;       /* reading a member name at depth 1 */
    bool key_bad;      /* the name being read is not "id" */
    unsigned key_len;  /* bytes of "id" matched so far */
    bool key_is_id;    /* the current member's name is "id" */
    bool in_id;        /* copying the id's value */
    bool id_is_string; /* the id's value is a string */
    size_t id_len;
    char idbuf[256];
};

/* conch_rpc_json_cost - bytes of memory the JSON text @text (@len bytes) takes at most once
 * parsed by jansson, about: a copy of every string and ~40-64 bytes per value (an array of 2
 * million zeros is 4 MiB of text and ~90 MiB parsed). One pass, no allocation: what a budget
 * is charged before the text is parsed. */
uint64_t conch_rpc_json_cost(const char *text, size_t len);

/* conch_rpc_idscan_init - reset @s (freeing a found id). */
void conch_rpc_idscan_init(struct conch_rpc_idscan *s);

/* conch_rpc_idscan_feed - scan @len more bytes of @buf (borrowed). Returns s->result. */
int conch_rpc_idscan_feed(struct conch_rpc_idscan *s, const char *buf, size_t len);

struct conch_rpc_framer {
    char *buf;                   /* the start of a line split across feeds */
    size_t len;                  /* bytes in buf */
    size_t cap;                  /* bytes allocated for buf */
    size_t max;                  /* the longest line accepted, without its "\r\n" */
    bool discarding;             /* skipping the rest of an oversize line up to its newline */
    bool scanning;               /* ... and still looking for its id */
    struct conch_rpc_idscan ids; /* the id of the oversize line being skipped */
    json_t *over_id;             /* during on_oversize only: its id, or NULL */
    struct conch_budget *budget; /* borrowed: charged for buf's allocation, or NULL */
};

/*
 * conch_rpc_framer_init - prepare @f for lines of at most @max_message bytes (not counting a
 * trailing "\r\n" or "\n"). Allocates nothing; pair with conch_rpc_framer_done().
 */
void conch_rpc_framer_init(struct conch_rpc_framer *f, size_t max_message);

/* conch_rpc_framer_done - free @f's buffer (uncharging its budget); a partial line is
 * dropped. @f may be reused after conch_rpc_framer_init(). */
void conch_rpc_framer_done(struct conch_rpc_framer *f);

/*
 * conch_rpc_framer_set_budget - charge the bytes @f allocates for partial lines to @budget
 * (borrowed; it must outlive @f's buffer, i.e. until conch_rpc_framer_done). Call before the
 * first feed. A buffer is charged before it grows and uncharged when freed; a buffer larger
 * than 64 KiB is freed as soon as no partial line needs it, so an idle connection holds
 * nothing.
 */
void conch_rpc_framer_set_budget(struct conch_rpc_framer *f, struct conch_budget *budget);

/*
 * conch_rpc_framer_feed - consume @len bytes of @buf (borrowed; any split of the stream).
 * For each complete line, with one trailing '\r' stripped, calls @on_line(@ctx, line, len);
 * empty lines are skipped. @line is NOT NUL-terminated and is valid only during the call.
 * A line longer than the maximum calls @on_oversize(@ctx) exactly once, as soon as its id is
 * known (conch_rpc_framer_oversize_id; possibly before its newline arrives) or cannot be (the
 * line ended, it is not an object, the id is of a wrong type), and is discarded up to its
 * newline without being buffered: the id is found by a constant-memory scan of the stream. A
 * partial line at the end of @buf is kept for the next feed. The callbacks must not feed or done @f
 * themselves (to stop, set a flag and act after feed returns). Returns 0, or -ENOMEM if a partial
 * line could not be buffered (-ENOBUFS: its budget had no room for it): that line is then
 * discarded like an oversize one (without calling @on_oversize) and the rest of @buf is dropped;
 * the caller should close the connection.
 */
int conch_rpc_framer_feed(struct conch_rpc_framer *f, const char *buf, size_t len,
                          void (*on_line)(void *ctx, const char *line, size_t len),
                          void (*on_oversize)(void *ctx), void *ctx);

/* conch_rpc_framer_pending - bytes of a partial line currently buffered. */
size_t conch_rpc_framer_pending(const struct conch_rpc_framer *f);

/*
 * conch_rpc_framer_oversize_id - valid only inside @on_oversize: the oversize request's id
 * (borrowed; a string, an integer or JSON null), or NULL when it could not be recovered.
 */
json_t *conch_rpc_framer_oversize_id(const struct conch_rpc_framer *f);

/*
 * conch_rpc_peek_id - the "id" member of a request object whose text (@s, @len borrowed) may
 * be cut anywhere: scans the top-level members in order, skipping values, until it finds
 * "id" with a complete string, integer or null value. Returns a new reference, or NULL when
 * the id cannot be recovered (not an object, cut before the id, an id of another type).
 * Never reads past @len; linear in @len.
 */
json_t *conch_rpc_peek_id(const char *s, size_t len);

/* ---- Messages --------------------------------------------------------------------------- */

/*
 * conch_rpc_result - a new response {"jsonrpc":"2.0","id":@id,"result":@result}.
 * @id is borrowed and copied; NULL means JSON null. Takes ownership of @result (NULL means
 * JSON null). Returns a new reference, or NULL if out of memory.
 */
json_t *conch_rpc_result(json_t *id, json_t *result);

/*
 * conch_rpc_error - a new error response
 * {"jsonrpc":"2.0","id":@id,"error":{"code":@code,"message":@message,"data":{...}}}.
 * @id is borrowed and copied; NULL means JSON null. @code 0 means conch_rpc_code_for(@data_code);
 * @data_code NULL means the default string for @code ("invalid_request" for -32600, ...).
 * data is {"code": @data_code, "kind": K} where K is "infrastructure" for -32001, "limit" for
 * -32004, "internal" for -32603 and "usage" otherwise; then the members of @data_extra (a JSON
 * object or NULL; taken over) are merged in, so a caller may add fields ("param", "limit")
 * or override "kind" — never "code". @message must be UTF-8; invalid bytes are replaced by
 * '?', and NULL means "error". Returns a new reference, or NULL if out of memory.
 */
json_t *conch_rpc_error(json_t *id, int code, const char *data_code, const char *message,
                        json_t *data_extra);

/*
 * conch_rpc_code_for - the numeric code of a data.code string ("file_not_found" -> -32010;
 * "message_too_large" -> -32600). Unknown strings and NULL give CONCH_RPC_INTERNAL_ERROR.
 */
int conch_rpc_code_for(const char *data_code);

/*
 * conch_rpc_dumps - serialise @msg (borrowed) as one line: compact JSON, UTF-8 kept as is (not
 * \u-escaped), then '\n'. The line never contains another '\n'. Returns a new string to free(),
 * or NULL if out of memory or @msg is NULL.
 */
char *conch_rpc_dumps(json_t *msg);

/* ---- Sinks: where responses go ---------------------------------------------------------- */

/*
 * struct conch_rpc_sink - one client's response channel: a send function and its context,
 * refcounted. Lifecycle:
 *   - conch_rpc_sink_new() returns it holding one reference, the owner's (the connection).
 *   - conch_rpc_dispatch() gives every call it creates its own reference, so calls completed
 *     later (async) still find the sink.
 *   - When the client goes away the owner calls conch_rpc_sink_close(): @send is never called
 *     again, and the owner's reference is dropped, so the owner may free send_ctx right away.
 *     Calls still outstanding keep the sink alive; their replies are freed silently; the last
 *     one frees the sink. Handlers doing long work can poll conch_rpc_call_cancelled().
 */
struct conch_rpc_sink;

/*
 * conch_rpc_sink_new - a new sink calling @send(@send_ctx, msg) for each outgoing message;
 * @send takes ownership of msg (one response, or an array for a batch). Returns NULL if out of
 * memory.
 */
struct conch_rpc_sink *conch_rpc_sink_new(void (*send)(void *send_ctx, json_t *msg),
                                          void *send_ctx);

/*
 * conch_rpc_sink_set_line_sender - let @sink also send lines serialised elsewhere (see
 * conch_rpc_call_reply_dumped): @send_line(send_ctx, line, len) takes ownership of @line
 * (malloc'd, ending in '\n', NUL-terminated). Without it such lines are parsed back into
 * JSON and go through @send.
 */
void conch_rpc_sink_set_line_sender(struct conch_rpc_sink *sink,
                                    void (*send_line)(void *send_ctx, char *line, size_t len));

/*
 * conch_rpc_sink_set_response_handler - let the peer answer requests the owner sent it
 * (conch_rpc_request): a line holding a response object (an "id", a "result" or an "error",
 * no "method") calls @on_response(send_ctx, id, result, error) with exactly one of @result
 * and @error non-NULL, all borrowed for the call. Responses are never answered; without a
 * handler they are dropped.
 */
void conch_rpc_sink_set_response_handler(struct conch_rpc_sink *sink,
                                         void (*on_response)(void *send_ctx, json_t *id,
                                                             json_t *result, json_t *error));

/* conch_rpc_request - a new request {"jsonrpc":"2.0","id":@id,"method":@method,"params":
 * @params} (@id borrowed, NULL = null; @params taken over, NULL = {}); NULL if out of memory. */
json_t *conch_rpc_request(json_t *id, const char *method, json_t *params);

/* conch_rpc_sink_ctx - the send_ctx given to conch_rpc_sink_new(), or NULL once @sink is
 * closed (or NULL). Lets the owner find its connection from a sink a handler kept. */
void *conch_rpc_sink_ctx(const struct conch_rpc_sink *sink);

/* conch_rpc_sink_close - stop sending and drop the owner's reference (see above). Call it
 * exactly once per sink; NULL is ignored. */
void conch_rpc_sink_close(struct conch_rpc_sink *sink);

/*
 * conch_rpc_sink_send - send @msg (taken over) through @sink now, e.g. the message_too_large
 * error or a notification; freed silently once the sink is closed.
 */
void conch_rpc_sink_send(struct conch_rpc_sink *sink, json_t *msg);

/*
 * conch_rpc_sink_ref / conch_rpc_sink_unref - take / drop a reference for sending later
 * (e.g. notifications after the call that asked for them was answered). Sending through a
 * closed sink drops the message. NULL is passed through / ignored.
 */
struct conch_rpc_sink *conch_rpc_sink_ref(struct conch_rpc_sink *sink);
void conch_rpc_sink_unref(struct conch_rpc_sink *sink);

/* ---- Dispatch --------------------------------------------------------------------------- */

enum conch_rpc_type {
    CONCH_RPC_STRING,
    CONCH_RPC_INT,    /* a JSON integer; 3.0 is refused */
    CONCH_RPC_NUMBER, /* a JSON integer or real */
    CONCH_RPC_BOOL,
    CONCH_RPC_OBJECT,
    CONCH_RPC_ARRAY,
    CONCH_RPC_ANY, /* any value, null included */
};

/*
 * One named parameter. An optional param given as null counts as absent.
 * For CONCH_RPC_INT and CONCH_RPC_NUMBER, @min and @max bound the value (inclusive) when
 * @ranged is set: NaN, infinities and values outside [@min, @max] are refused with -32602
 * naming the param and the range, before any handler turns the number into a size, a time
 * or a count. CONCH_RPC_NUMBER values other than 0 must also be at least @min_nonzero when
 * it is set (0.0000001 s is not a timeout). Use the CONCH_RPC_RANGE* helpers below.
 */
struct conch_rpc_param {
    const char *name;
    enum conch_rpc_type type;
    bool required;
    bool ranged;
    double min, max;
    double min_nonzero; /* 0: none */
};

/* Range initialisers: {"timeout", CONCH_RPC_NUMBER, false, CONCH_RPC_RANGE(0, 86400)}. */
#define CONCH_RPC_RANGE(lo, hi) true, (lo), (hi), 0
#define CONCH_RPC_RANGE_NZ(lo, hi, nz) true, (lo), (hi), (nz)

/* A call in progress: created by conch_rpc_dispatch(), completed once by its handler. */
struct conch_rpc_call;

/*
 * struct conch_rpc_method - one entry of a method table; a table ends with a NULL @name.
 * @params ends with a NULL name; NULL means "takes no params". Keys not listed are refused.
 * @handler receives params (borrowed, valid until it returns: json_incref to keep it; always
 * an object, {} when absent) and the table's ctx, and must complete @call exactly once, before
 * returning or later, with conch_rpc_call_reply() or conch_rpc_call_fail*().
 */
struct conch_rpc_method {
    const char *name;
    const struct conch_rpc_param *params;
    void (*handler)(struct conch_rpc_call *call, json_t *params, void *ctx);
};

/*
 * conch_rpc_dispatch - handle one line (@line, @len borrowed; need not be NUL-terminated).
 * Parsing: not JSON, not UTF-8, or an integer out of range -> -32700 (id null); a duplicate
 * key, or a value that is neither object nor array -> -32600 (id null). A request object needs
 * "jsonrpc":"2.0", a string "method", an "id" that is a string, an integer or null (absent =
 * notification) and "params" absent, null or an object (an array -> -32602 "params must be an
 * object"). Then: unknown method -> -32601; params not matching the table -> -32602 with
 * data.param naming the param; otherwise the handler runs with @ctx.
 * Notifications never get a response, not even an error (but an object that is not a valid
 * request at all does, with id null, as JSON-RPC 2.0 specifies).
 * A batch (array): [] -> one -32600 error; otherwise each element is handled as above and ONE
 * array holding every response is sent once the last outstanding call of the batch completes;
 * nothing is sent if the batch held only notifications.
 * Responses go to @sink (borrowed; each call takes its own reference). Handlers may complete
 * during this call, in which case responses are sent before it returns.
 */
void conch_rpc_dispatch(const struct conch_rpc_method *table, const char *line, size_t len,
                        void *ctx, struct conch_rpc_sink *sink);

/*
 * conch_rpc_call_reply - complete @call with @result (taken over; must not be NULL: use
 * json_null() for a null result; NULL, e.g. from a failed allocation, sends internal_error).
 * The response is dropped for a notification or a closed sink. Frees @call.
 */
void conch_rpc_call_reply(struct conch_rpc_call *call, json_t *result);

/*
 * conch_rpc_call_reply_dumped - complete @call with a result already serialised as compact
 * JSON (@text, taken over: json_dumps(result, JSON_COMPACT | JSON_ENCODE_ANY), e.g. in a
 * worker thread, so that a large result never costs the loop its serialisation). The
 * response line is built around it without parsing it again (except inside a batch, whose
 * array is built as JSON). NULL sends internal_error. Frees @call.
 */
void conch_rpc_call_reply_dumped(struct conch_rpc_call *call, char *text);

/*
 * conch_rpc_call_take_result_line - complete @call with @result (taken over) by handing its
 * response line (compact JSON and '\n', malloc'd) to the caller, who sends it itself (with
 * file descriptors, say) instead of through the sink. Returns NULL, with @call and @result
 * untouched, when the response cannot go that way (a notification, a batch, a closed sink, no
 * memory): complete it as usual then.
 */
char *conch_rpc_call_take_result_line(struct conch_rpc_call *call, json_t *result);

/*
 * conch_rpc_call_fail - complete @call with an error built as conch_rpc_error(id, @code,
 * @data_code, @message, @data_extra) (@data_extra taken over, may be NULL). Frees @call.
 */
void conch_rpc_call_fail(struct conch_rpc_call *call, int code, const char *data_code,
                         const char *message, json_t *data_extra);

/* conch_rpc_call_failf - conch_rpc_call_fail with a printf-formatted message. */
void conch_rpc_call_failf(struct conch_rpc_call *call, int code, const char *data_code,
                          json_t *data_extra, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/*
 * conch_rpc_call_fail_param - complete @call with -32602 invalid_params, data.param = @param
 * (a value out of range, say), and a printf-formatted message. Frees @call.
 */
void conch_rpc_call_fail_param(struct conch_rpc_call *call, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * conch_rpc_call_fail_err - complete @call with @err (borrowed): message @err->msg, data.kind
 * from @err->kind ("infrastructure", "usage", "limit", ...). @code 0 means
 * conch_rpc_code_for(@data_code) if @data_code is given, else from the kind: infrastructure
 * (or unset) -> -32001, usage -> -32602, limit -> -32004, others -> -32603. This is the one
 * mapping of conch's error kinds onto JSON-RPC codes: callers pass (0, NULL) unless the
 * error has a more specific code (file_not_found...). Frees @call.
 */
void conch_rpc_call_fail_err(struct conch_rpc_call *call, int code, const char *data_code,
                             const struct conch_err *err);

/* conch_rpc_call_id - the request's id (borrowed, valid until the call completes; a JSON
 * string, integer or null), or NULL for a notification. */
json_t *conch_rpc_call_id(const struct conch_rpc_call *call);

/* conch_rpc_call_method - the name of the method @call calls (borrowed from the method
 * table: valid as long as the table). */
const char *conch_rpc_call_method(const struct conch_rpc_call *call);

/* conch_rpc_call_cancelled - true once the call's sink was closed: nobody will read the
 * response, so a long operation may stop early (it must still complete the call). */
bool conch_rpc_call_cancelled(const struct conch_rpc_call *call);

/* ---- Reading params (after the table's checks) ----------------------------------------- */

/*
 * conch_rpc_str - the string member @key of @params, or @def if absent, null or not a string.
 * Borrowed from @params. The C string stops at an embedded NUL (JSON allows "\u0000"): where
 * that matters (paths), use conch_rpc_strn and compare lengths.
 */
const char *conch_rpc_str(json_t *params, const char *key, const char *def);

/* conch_rpc_strn - like conch_rpc_str with @def NULL; stores the full length (embedded NULs
 * counted) in *@ret_len when a string is returned. */
const char *conch_rpc_strn(json_t *params, const char *key, size_t *ret_len);

/* conch_rpc_int - the integer member @key, or @def if absent, null or not an integer. */
long long conch_rpc_int(json_t *params, const char *key, long long def);

/* conch_rpc_num - the number member @key (integer or real), or @def. */
double conch_rpc_num(json_t *params, const char *key, double def);

/* conch_rpc_bool - the boolean member @key, or @def. */
bool conch_rpc_bool(json_t *params, const char *key, bool def);

/* ---- A client --------------------------------------------------------------------------- */

/*
 * conch_rpc_request_line - the line of a JSON-RPC 2.0 request to @method with @params
 * (borrowed; NULL: none), id @id (0: a notification, without id), ending in '\n'. Returns a
 * new string and its length in *@ret_len, or NULL when out of memory.
 */
char *conch_rpc_request_line(uint64_t id, const char *method, json_t *params, size_t *ret_len);

/*
 * struct conch_rpc_reader - splits what a server sends into messages, one JSON value a line
 * ("\u0000" allowed: command output may hold NUL bytes). Zero it, set @max (the longest line
 * kept; 0: no cap), and free it with conch_rpc_reader_done.
 */
struct conch_rpc_reader {
    char *buf;
    size_t len, cap;
    size_t max;    /* longest line; a longer one is dropped (conch_rpc_reader_next says so) */
    bool skipping; /* inside a line that was too long: dropped up to its newline */
};

/*
 * conch_rpc_reader_fill - one read of @fd (a recvmsg, so that a descriptor passed with the
 * bytes lands in *@ret_fd when @ret_fd is not NULL and *@ret_fd is -1; others are closed).
 * Returns the bytes read, 0 at EOF, or -errno (-ENOMEM when the buffer cannot grow).
 */
ssize_t conch_rpc_reader_fill(struct conch_rpc_reader *r, int fd, int *ret_fd);

/*
 * conch_rpc_reader_next - the next whole message buffered: 1 with *@ret (a new reference), 0
 * when no line is complete, or -EBADMSG for a line that is not JSON and -EMSGSIZE for one
 * longer than @max (each dropped, @err saying why): call again for the next.
 */
int conch_rpc_reader_next(struct conch_rpc_reader *r, json_t **ret, struct conch_err *err);

/* conch_rpc_reader_done - free @r's buffer and zero it (its @max is kept). */
void conch_rpc_reader_done(struct conch_rpc_reader *r);

#endif
