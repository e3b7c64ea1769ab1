/* net.h - a sandbox's network: its mode (none, allow, host), the domain policy of the
 * `allow` mode (exact names, `*.suffix`, ports, IP literals; deny wins), the parser of the
 * requests a proxy client sends (absolute-form HTTP/1.x and CONNECT), and the proxy itself:
 * one listener per sandbox on a libuv loop, which resolves names itself, applies the policy,
 * connects out and pipes both ways with bounded buffers, and records every attempt.
 *
 * The policy and the parser are pure (no I/O): tests/unit/test_net.c. */
#ifndef CONCH_NET_NET_H
#define CONCH_NET_NET_H

#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "core/budget.h"
#include "core/error.h"

/* A sandbox's network. */
enum conch_net_mode {
    CONCH_NET_NONE = 0, /* own network namespace, loopback only (the default) */
    CONCH_NET_ALLOW,    /* own namespace; egress only through the proxy, by the policy */
    CONCH_NET_HOST,     /* the host's network namespace (explicit opt-in, flagged) */
};

/* conch_net_mode_parse - "none" | "allow" | "host" → *@ret; -EINVAL (kind usage) otherwise. */
int conch_net_mode_parse(const char *s, enum conch_net_mode *ret, struct conch_err *err);
/* conch_net_mode_name - the name of @mode; a static string. */
const char *conch_net_mode_name(enum conch_net_mode mode);

/* The proxy's address inside a sandbox's namespace. */
#define CONCH_NET_PROXY_PORT 3128
#define CONCH_NET_PROXY_URL "http://127.0.0.1:3128"
/* Rules per list, and the longest rule. */
#define CONCH_NET_RULES_MAX 256
#define CONCH_NET_NAME_MAX 253

/* One rule: "example.com", "*.example.com", "example.com:8443", "10.0.0.5", "[::1]:8080". */
struct conch_net_rule {
    char host[CONCH_NET_NAME_MAX + 1]; /* lower case, no trailing dot; for a suffix the part
                                        * after "*." */
    bool suffix;                       /* "*.host": any name ending in ".host" (not host) */
    bool ip;                           /* an IP literal (v6 without brackets) */
    uint16_t port;                     /* 0: 80 and 443 (allow), any port (deny) */
};

/*
 * conch_net_rule_parse - read the rule @text into *@ret. Names are letters, digits, '-' and
 * '.' (case folded), at most 253 characters; a port is 1..65535. Returns 0, or -EINVAL (kind
 * usage) with @err quoting @text and saying what a rule looks like.
 */
int conch_net_rule_parse(const char *text, struct conch_net_rule *ret, struct conch_err *err);
/* conch_net_rule_format - @r as it is written ("*.example.com:8443") into @buf. */
void conch_net_rule_format(const struct conch_net_rule *r, char *buf, size_t size);

/* A policy: the mode and the two lists. Caller-allocated; conch_net_policy_init, then
 * conch_net_policy_add; conch_net_policy_done frees the lists. */
struct conch_net_policy {
    enum conch_net_mode mode;
    struct conch_net_rule *allow, *deny; /* owned */
    size_t n_allow, n_deny;
};

void conch_net_policy_init(struct conch_net_policy *p, enum conch_net_mode mode);
void conch_net_policy_done(struct conch_net_policy *p);
/* conch_net_policy_add - parse @text and add it to the deny list (@deny) or the allow list.
 * Returns 0, or -EINVAL / -E2BIG (more than CONCH_NET_RULES_MAX) / -ENOMEM with @err. */
int conch_net_policy_add(struct conch_net_policy *p, bool deny, const char *text,
                         struct conch_err *err);

/* conch_net_policy_copy - @dst (initialised or not; its old lists are not freed) becomes a
 * copy of @src. Returns 0 or -ENOMEM with @err. */
int conch_net_policy_copy(struct conch_net_policy *dst, const struct conch_net_policy *src,
                          struct conch_err *err);

/* What the policy says of one destination. */
struct conch_net_verdict {
    bool allowed;
    bool exact;     /* allowed by a rule naming this very name or address (not a suffix) */
    char rule[300]; /* the rule that decided, as written; "" when none matched */
    char why[200];  /* a denial's reason ("denied by rule 'x'", "no rule allows it") */
};

/*
 * conch_net_policy_check - may @host (a name or an IP literal, any case, a trailing dot
 * allowed; v6 without brackets) be reached on @port? Deny rules first (any that matches
 * wins), then allow rules; a name no rule allows is denied, and an IP literal only an IP
 * rule of the same address can allow. Not allowed at all outside the allow mode.
 */
void conch_net_policy_check(const struct conch_net_policy *p, const char *host, uint16_t port,
                            struct conch_net_verdict *ret);

/* conch_net_addr_internal - whether @sa is an address of this host or a private network:
 * unspecified, loopback, RFC 1918, carrier-grade NAT, link-local, unique-local, multicast,
 * broadcast, and v4-mapped forms of them. A name resolving there is refused unless a rule
 * names it exactly (DNS rebinding into the host). */
bool conch_net_addr_internal(const struct sockaddr *sa);

/* conch_net_addr_host - whether @sa is an address of one of this host's interfaces (in the
 * caller's network namespace), public ones included: a host with a public address serves on
 * it what it serves on its loopback, so the proxy treats it as internal too. */
bool conch_net_addr_host(const struct sockaddr *sa);

/* One request head as a proxy client sends it. Offsets point into the parsed buffer. */
struct conch_net_request {
    bool connect;                      /* CONNECT host:port (a tunnel) */
    char host[CONCH_NET_NAME_MAX + 1]; /* lower case, no brackets, no trailing dot */
    uint16_t port;
    char method[16];
    size_t path_off, path_len;       /* origin-form path of an absolute-form request */
    size_t version_off;              /* "HTTP/1.x" */
    size_t headers_off, headers_len; /* header lines, from after the request line to the
                                      * blank line included */
    size_t head_len;                 /* the whole head, blank line included */
};

/* The largest request head the proxy reads. */
#define CONCH_NET_HEAD_MAX (32u << 10)

/*
 * conch_net_request_parse - parse the request head at the start of @buf (@len bytes, no NUL
 * needed). Returns 1 with *@ret filled when a whole head is there, 0 when more bytes are
 * needed (and fewer than CONCH_NET_HEAD_MAX came), or -EINVAL / -E2BIG / -EPROTONOSUPPORT
 * with @err saying what is wrong (for the 400 answer): a malformed line, a head too long, an
 * origin-form or https:// request (HTTPS goes through CONNECT).
 */
int conch_net_request_parse(const char *buf, size_t len, struct conch_net_request *ret,
                            struct conch_err *err);

/* ---- the proxy (proxy.c) ---- */

/* One attempt, as recorded. */
struct conch_net_record {
    double at; /* wall clock, seconds */
    char host[CONCH_NET_NAME_MAX + 1];
    uint16_t port;
    bool connect; /* a CONNECT tunnel, else plain HTTP */
    bool allowed;
    char rule[300];     /* the rule that decided ("" none) */
    char error[320];    /* why it was refused or failed ("" none) */
    char address[64];   /* the address connected to ("" none) */
    uint64_t bytes_out; /* sandbox → remote */
    uint64_t bytes_in;  /* remote → sandbox */
    double duration;    /* seconds */
};

/* conch_net_record_json - @r as results and network.log show it: {"at", "host", "port",
 * "kind" ("connect" | "http"), "allowed", "rule", "error", "address", "bytes_out",
 * "bytes_in", "duration"}. A new object, or NULL when out of memory. */
json_t *conch_net_record_json(const struct conch_net_record *r);

/* Records a proxy keeps, and connections it serves at once. */
#define CONCH_NET_LOG_MAX 256
#define CONCH_NET_CONNS_MAX 256
/* Bytes a connection buffers each way (whole read buffers) before it stops reading the
 * other side, on libuv's path (its first 64 KiB); past them its relay's pipe is the bound
 * (relay.h). */
#define CONCH_NET_PIPE_BUF (256u << 10)

struct conch_net_proxy;

/* What the proxy's owner is told (@ctx its own). */
struct conch_net_proxy_ops {
    /* An attempt ended (or was refused): @rec is borrowed for the call. May be NULL. */
    void (*record)(void *ctx, const struct conch_net_record *rec);
    /* The proxy is gone, every handle closed and every charge to the budget returned, after
     * conch_net_proxy_free (the budget must live until then). May be NULL. */
    void (*closed)(void *ctx);
};

/*
 * conch_net_proxy_new - a proxy on @loop (borrowed, must outlive it) for the policy @policy
 * (copied). @budget (borrowed, may be NULL) is charged what its connections hold (buffers,
 * heads); @hosts_file (may be NULL) replaces the system resolver by a hosts-format file (tests).
 * Returns 0 with *@ret, or -errno with @err.
 */
int conch_net_proxy_new(uv_loop_t *loop, const struct conch_net_policy *policy,
                        struct conch_budget *budget, const char *hosts_file,
                        const struct conch_net_proxy_ops *ops, void *ctx,
                        struct conch_net_proxy **ret, struct conch_err *err);

/* conch_net_proxy_set_public_only - with @on, connect to no internal address
 * (conch_net_addr_internal: loopback, private, link-local, ...), not even one a rule names
 * exactly: a tenant's sandbox (docs/ARCHITECTURE.md, "Tenants") must not reach the daemon
 * host's own networks (its loopback services, a cloud's metadata address). */
void conch_net_proxy_set_public_only(struct conch_net_proxy *px, bool on);

/* conch_net_proxy_listen - accept connections on @fd (a listening TCP socket, taken). */
int conch_net_proxy_listen(struct conch_net_proxy *px, int fd, struct conch_err *err);

/* conch_net_proxy_set_policy - replace the policy (copied) for the requests to come;
 * connections already open stay. Returns 0 or -ENOMEM with @err. */
int conch_net_proxy_set_policy(struct conch_net_proxy *px, const struct conch_net_policy *policy,
                               struct conch_err *err);

/* conch_net_proxy_each_open - @fn(@arg, record so far) for every connection whose request was
 * read and that is still open (bytes and duration until now). */
void conch_net_proxy_each_open(struct conch_net_proxy *px,
                               void (*fn)(void *arg, const struct conch_net_record *rec),
                               void *arg);

/* conch_net_proxy_policy - the policy in force; borrowed. */
const struct conch_net_policy *conch_net_proxy_policy(const struct conch_net_proxy *px);

/* conch_net_proxy_free - close the listener and every connection (their records are made)
 * and free @px once libuv has closed every handle (the ops are not called after this
 * returns). NULL is fine. */
void conch_net_proxy_free(struct conch_net_proxy *px);

/* conch_net_proxy_env - the environment a command needs to use the proxy: a NULL-terminated
 * static list of "NAME=VALUE" (HTTP_PROXY, HTTPS_PROXY, NO_PROXY and their lower-case forms,
 * npm's, pip's and git's). */
const char *const *conch_net_proxy_env(void);

#endif
