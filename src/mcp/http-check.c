/* http-check.c - what the Streamable HTTP transport checks before it reads a request's body:
 * path, method, Origin (DNS rebinding), the bearer token, MCP-Protocol-Version, the session
 * id, and a POST's Content-Type, Accept and Content-Length; and the --listen address. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/evp.h>

#include "mcp/http-internal.h"

#define MAX_TOKEN 4096

static const char *const versions[] = {"2025-06-18", "2025-03-26", "2024-11-05"};

/* A copy of header @h (NULL when absent or longer than @size - 1). */
static const char *hdr(struct lws *wsi, enum lws_token_indexes h, char *buf, size_t size)
{
    int n = lws_hdr_total_length(wsi, h);
    if (n <= 0 || (size_t)n >= size || lws_hdr_copy(wsi, buf, (int)size, h) < 0)
        return NULL;
    return buf;
}

static const char *custom_hdr(struct lws *wsi, const char *name, char *buf, size_t size,
                              bool *too_long)
{
    int n = lws_hdr_custom_length(wsi, name, (int)strlen(name));
    *too_long = n > 0 && (size_t)n >= size;
    if (n <= 0 || *too_long ||
        lws_hdr_custom_copy(wsi, buf, (int)size, name, (int)strlen(name)) < 0)
        return NULL;
    return buf;
}

/* Whether @origin ("scheme://host[:port]") names this machine: localhost, 127.0.0.0/8, ::1. */
static bool local_origin(const char *origin)
{
    const char *p = strstr(origin, "://");
    if (!p)
        return false;
    p += 3;
    char host[256];
    size_t n;
    if (*p == '[') {
        const char *e = strchr(p, ']');
        if (!e)
            return false;
        n = (size_t)(e - p - 1);
        if (n >= sizeof(host))
            return false;
        memcpy(host, p + 1, n);
    } else {
        n = strcspn(p, ":/");
        if (n >= sizeof(host))
            return false;
        memcpy(host, p, n);
    }
    host[n] = '\0';
    if (!strcasecmp(host, "localhost"))
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

static bool origin_ok(struct srv *v, const char *origin)
{
    for (size_t i = 0; i < v->h->n_origins; i++)
        if (!strcmp(origin, v->h->origins[i]))
            return true;
    return v->loopback && local_origin(origin);
}

/* The token of "Authorization: Bearer TOKEN" into r->token; false when absent or malformed. */
static bool bearer(struct lws *wsi, struct req *r)
{
    char *buf = malloc(MAX_TOKEN + 16);
    if (!buf)
        return false;
    const char *a = hdr(wsi, WSI_TOKEN_HTTP_AUTHORIZATION, buf, MAX_TOKEN + 16);
    if (!a || strncasecmp(a, "Bearer ", 7)) {
        free(buf);
        return false;
    }
    a += 7;
    while (*a == ' ')
        a++;
    size_t n = strlen(a);
    while (n && a[n - 1] == ' ')
        n--;
    bool ok = n > 0 && n <= MAX_TOKEN;
    for (size_t i = 0; ok && i < n; i++)
        ok = a[i] > 0x20 && a[i] < 0x7f;
    unsigned int hl = 0;
    if (ok)
        ok = EVP_Digest(a, n, r->tok_hash, &hl, EVP_sha256(), NULL) == 1 && hl == 32;
    if (ok)
        r->token = strndup(a, n);
    free(buf);
    return ok && r->token;
}

/* Whether the comma-separated media types of @accept include application/json (or a
 * wildcard of it); parameters (";q=...") are ignored. */
static bool accepts_json(const char *accept)
{
    static const char *const ok[] = {"application/json", "application/*", "*/*"};
    for (const char *p = accept; *p;) {
        p += strspn(p, " \t,");
        size_t n = strcspn(p, ",;");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        for (size_t i = 0; i < sizeof(ok) / sizeof(*ok); i++)
            if (n == strlen(ok[i]) && !strncasecmp(p, ok[i], n))
                return true;
        p += strcspn(p, ",");
    }
    return false;
}

int conch_mcp_http_headers(struct srv *v, struct req *r, const char *uri)
{
    struct lws *wsi = r->wsi;
    char buf[1024];
    lws_get_peer_simple(wsi, r->peer, sizeof(r->peer));
    if (strcmp(uri, "/mcp") && strcmp(uri, "/mcp/")) {
        conch_mcp_http_fail(r, 404, -32600, "not found: MCP is served at /mcp");
        return 0;
    }
    if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0) {
        r->method = REQ_POST;
    } else if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI) > 0) {
        r->method = REQ_DELETE;
    } else {
        conch_mcp_http_fail(r, 405, -32600,
                            "method not allowed: POST a message, DELETE a session (no GET "
                            "stream: the server sends nothing unasked)");
        return 0;
    }
    const char *origin = hdr(wsi, WSI_TOKEN_ORIGIN, buf, sizeof(buf));
    if (lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) > 0 && (!origin || !origin_ok(v, origin))) {
        conch_mcp_http_fail(r, 403, -32600,
                            "forbidden origin (conch mcp --listen accepts local origins on a "
                            "loopback address and those given with --allow-origin)");
        return 0;
    }
    if (!bearer(wsi, r)) {
        conch_mcp_http_fail(r, 401, -32020, "unauthorized: send Authorization: Bearer TOKEN");
        return 0;
    }
    bool too_long = false;
    const char *ver = custom_hdr(wsi, "mcp-protocol-version:", buf, sizeof(buf), &too_long);
    if (ver || too_long) {
        bool known = false;
        for (size_t i = 0; ver && i < sizeof(versions) / sizeof(*versions); i++)
            known |= !strcmp(ver, versions[i]);
        if (!known) {
            conch_mcp_http_fail(r, 400, -32600,
                                "unsupported MCP-Protocol-Version (supported: 2025-06-18, "
                                "2025-03-26, 2024-11-05)");
            return 0;
        }
    }
    const char *sid = custom_hdr(wsi, "mcp-session-id:", r->sid, sizeof(r->sid), &too_long);
    if (!sid)
        r->sid[0] = '\0';
    if (too_long || (sid && !sid[0])) {
        conch_mcp_http_fail(r, 404, -32001, CONCH_MCP_NO_SESSION);
        return 0;
    }
    if (r->method == REQ_DELETE) {
        if (!r->sid[0])
            conch_mcp_http_fail(r, 400, -32600, "DELETE needs the Mcp-Session-Id to end");
        return 0;
    }
    const char *ct = hdr(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, buf, sizeof(buf));
    if (!ct || strncasecmp(ct, "application/json", 16) ||
        (ct[16] && ct[16] != ';' && ct[16] != ' ')) {
        conch_mcp_http_fail(r, 415, -32600, "Content-Type must be application/json");
        return 0;
    }
    const char *acc = hdr(wsi, WSI_TOKEN_HTTP_ACCEPT, buf, sizeof(buf));
    if (acc && !accepts_json(acc)) {
        conch_mcp_http_fail(r, 406, -32600,
                            "Accept must include application/json (answers are JSON)");
        return 0;
    }
    const char *cl = hdr(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, buf, sizeof(buf));
    if (!cl) { /* a chunked body: not read here (libwebsockets 4.1 reads none) */
        r->close_after = true;
        conch_mcp_http_fail(r, 411, -32600, "Content-Length required");
        return 0;
    }
    {
        char *end;
        errno = 0;
        unsigned long long n = strtoull(cl, &end, 10);
        if (errno || *end || n > v->h->max_body) {
            r->close_after = true; /* its body is not read */
            conch_mcp_http_fail(r, 413, -32600, "request body too large");
            return 0;
        }
    }
    return 0;
}

int conch_mcp_http_bind_addr(const char *listen, char *iface, size_t size, int *ret_port,
                             bool *ret_loopback, struct conch_err *err)
{
    const char *colon = strrchr(listen, ':');
    if (!colon || colon == listen)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--listen: '%s' is not HOST:PORT (e.g. 127.0.0.1:8443)", listen);
    char host[256];
    size_t hl = (size_t)(colon - listen);
    if (listen[0] == '[' && hl >= 2 && listen[hl - 1] == ']') {
        listen++;
        hl -= 2;
    }
    if (hl >= sizeof(host))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--listen: host too long");
    memcpy(host, listen, hl);
    host[hl] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (!colon[1] || *end || port < 0 || port > 65535)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "--listen: '%s' is not a port (0 to 65535)", colon + 1);
    struct addrinfo hints = {.ai_flags = AI_ADDRCONFIG, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(host, NULL, &hints, &ai);
    if (g)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--listen: cannot resolve '%s': %s",
                              host, gai_strerror(g));
    bool lo = false;
    const char *ok = NULL;
    if (ai->ai_family == AF_INET) {
        struct in_addr a = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
        lo = (ntohl(a.s_addr) >> 24) == 127;
        ok = inet_ntop(AF_INET, &a, iface, (socklen_t)size);
    } else if (ai->ai_family == AF_INET6) {
        struct in6_addr a = ((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        lo = IN6_IS_ADDR_LOOPBACK(&a);
        ok = inet_ntop(AF_INET6, &a, iface, (socklen_t)size);
    }
    freeaddrinfo(ai);
    if (!ok)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "--listen: '%s' has no IP address",
                              host);
    *ret_port = (int)port;
    *ret_loopback = lo;
    return 0;
}
