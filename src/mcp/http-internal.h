/* http-internal.h - what the Streamable HTTP transport's files share: the server (struct
 * srv), one HTTP request (struct req, lws's per-connection data, reset per request) and one
 * MCP session over HTTP (struct hsess). http.c serves; http-check.c reads a request's
 * headers and the --listen address. */
#ifndef CONCH_MCP_HTTP_INTERNAL_H
#define CONCH_MCP_HTTP_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include <libwebsockets.h>

#include "core/error.h"
#include "mcp/mcp.h"

#define CONCH_MCP_SID_BYTES 16 /* random bytes of a session id (hex in the header) */
/* The one answer (404) to an unknown, ended or another tenant's session id. */
#define CONCH_MCP_NO_SESSION "session not found: initialize a new one"

struct hsess;

enum req_method { REQ_NONE, REQ_POST, REQ_DELETE };

struct req {
    struct lws *wsi;
    struct srv *srv;
    enum req_method method;
    char sid[2 * CONCH_MCP_SID_BYTES + 1]; /* Mcp-Session-Id sent; "" none */
    char *token;                           /* the bearer token; owned */
    unsigned char tok_hash[32];            /* its SHA-256 */
    char peer[64];                         /* the client's address */
    bool is_init;                          /* carries initialize */
    bool body_pending;                     /* a body is announced and not all in */
    bool trusted; /* names a live session opened with its token (else: nobody known yet) */
    char *body;   /* owned */
    size_t body_len, body_cap;
    /* Waiting for the session's answer: */
    struct hsess *sess;
    struct req *next; /* in sess->waiting */
    json_t *rpc_id;   /* the JSON-RPC id it awaits; owned; NULL: none */
    /* The response: */
    bool answered;
    unsigned status;
    const char *ctype;
    char *resp; /* owned */
    size_t resp_len, resp_off;
    bool headers_sent;
    bool close_after;
    char resp_sid[2 * CONCH_MCP_SID_BYTES + 1];
};

enum sess_state { SESS_AUTHING, SESS_LIVE, SESS_ENDING };

struct hsess {
    struct hsess *next; /* in srv->sessions (live ones only) */
    struct srv *srv;
    enum sess_state state;
    bool probe;           /* only checks a token (http.c's start_auth) */
    bool counted_authing; /* in srv->n_authing */
    bool closing;         /* the daemon connection is being closed */
    char id[2 * CONCH_MCP_SID_BYTES + 1];
    unsigned char tok_hash[32]; /* SHA-256 of the token that opened it */
    char tenant[64];
    int fd;          /* the daemon connection (owned by @raw once adopted) */
    struct lws *raw; /* its wsi; NULL once closed */
    struct mcp *m;
    struct req *waiting;  /* requests awaiting an answer of the session */
    struct req *current;  /* the request being handed to the session */
    struct req *auth_req; /* the request whose connection.auth is in flight */
    json_t *auth_msg;     /* its message, handled after the auth; owned */
    time_t last_used;
};

struct srv {
    const struct conch_mcp_opts *o;
    const struct conch_mcp_http_opts *h;
    struct lws_context *ctx;
    struct lws_vhost *vhost;
    char iface[64]; /* the numeric address bound */
    int port;
    bool loopback;
    json_t *tools_list;
    struct hsess *sessions;
    unsigned n_sessions;    /* live */
    unsigned n_authing;     /* opening */
    unsigned n_alive;       /* session objects not yet freed (any state) */
    size_t body_bytes;      /* allocated for request bodies, all requests */
    size_t untrusted_bytes; /* of which for requests of no session yet (http.c, UNTRUSTED_*) */
    lws_sorted_usec_list_t sweep;
    SSL_CTX *ssl_ctx; /* the vhost's (SIGHUP reloads its certificate and key) */
};

/*
 * conch_mcp_http_headers - check the headers of a request to @uri: path, method, Origin,
 * Authorization, MCP-Protocol-Version, Mcp-Session-Id, and for a POST Content-Type, Accept
 * and Content-Length. Fills @r (method, token and its hash, peer, sid). Returns 0 with @r
 * answered (an error status) or ready for its body, or -1 to drop the connection.
 */
int conch_mcp_http_headers(struct srv *v, struct req *r, const char *uri);

/* conch_mcp_http_handle - @r's message @msg (taken; NULL for DELETE), its headers checked. */
void conch_mcp_http_handle(struct srv *v, struct req *r, json_t *msg);

/* conch_mcp_http_fail - answer @r with HTTP @status and a JSON-RPC error (id null) @code, @msg. */
void conch_mcp_http_fail(struct req *r, unsigned status, int code, const char *msg);

/*
 * conch_mcp_http_bind_addr - @listen ("HOST:PORT", "[V6]:PORT") resolved to a numeric address
 * in @iface, the port in *@ret_port (0: any), and whether it is a loopback address.
 */
int conch_mcp_http_bind_addr(const char *listen, char *iface, size_t size, int *ret_port,
                             bool *ret_loopback, struct conch_err *err);

#endif
