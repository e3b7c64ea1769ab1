/* policy.c - the network modes and the domain policy of the allow mode: rules parsed once,
 * matched per request (deny first), and the address ranges a resolved name may not reach. */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

int conch_net_mode_parse(const char *s, enum conch_net_mode *ret, struct conch_err *err)
{
    static const char *const names[] = {"none", "allow", "host"};
    for (size_t i = 0; s && i < sizeof(names) / sizeof(names[0]); i++) {
        if (!strcmp(s, names[i])) {
            *ret = (enum conch_net_mode)i;
            return 0;
        }
    }
    return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                          "invalid network mode '%s' (expected none, allow or host)",
                          s ? s : "(null)");
}

const char *conch_net_mode_name(enum conch_net_mode mode)
{
    switch (mode) {
    case CONCH_NET_NONE:
        return "none";
    case CONCH_NET_ALLOW:
        return "allow";
    case CONCH_NET_HOST:
        return "host";
    }
    return "unknown";
}

/* A DNS name: labels of letters, digits and '-', 1..63 each, not starting or ending in '-'. */
static bool name_ok(const char *s)
{
    size_t n = strlen(s), label = 0;
    if (n == 0 || n > CONCH_NET_NAME_MAX)
        return false;
    for (size_t i = 0; i <= n; i++) {
        char c = s[i];
        if (c == '.' || c == '\0') {
            if (label == 0 || label > 63 || s[i - 1] == '-' || s[i - label] == '-')
                return false;
            label = 0;
        } else if (isalnum((unsigned char)c) || c == '-' || c == '_') {
            label++;
        } else {
            return false;
        }
    }
    return true;
}

static bool is_ip(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

/* Lower-case @s (at most @size-1 bytes) into @out without a trailing dot. */
static bool normalise(const char *s, size_t len, char *out, size_t size)
{
    if (len && s[len - 1] == '.')
        len--;
    if (len == 0 || len >= size)
        return false;
    for (size_t i = 0; i < len; i++)
        out[i] = (char)tolower((unsigned char)s[i]);
    out[len] = '\0';
    return true;
}

static int parse_port(const char *s, uint16_t *ret)
{
    char *end = NULL;
    if (!isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v < 1 || v > 65535)
        return -1;
    *ret = (uint16_t)v;
    return 0;
}

int conch_net_rule_parse(const char *text, struct conch_net_rule *ret, struct conch_err *err)
{
    struct conch_net_rule r;
    memset(&r, 0, sizeof(r));
    const char *host = text, *port = NULL;
    size_t hlen = 0;
    if (!text || !*text || strlen(text) > CONCH_NET_NAME_MAX + 10)
        goto bad;
    if (text[0] == '[') { /* [v6] or [v6]:port */
        const char *close = strchr(text, ']');
        if (!close || (close[1] && close[1] != ':'))
            goto bad;
        host = text + 1;
        hlen = (size_t)(close - host);
        port = close[1] == ':' ? close + 2 : NULL;
    } else if (strchr(text, ':') != strrchr(text, ':')) { /* bare v6, no port */
        hlen = strlen(text);
    } else {
        const char *colon = strchr(text, ':');
        hlen = colon ? (size_t)(colon - text) : strlen(text);
        port = colon ? colon + 1 : NULL;
    }
    if (hlen > 2 && host[0] == '*' && host[1] == '.') {
        r.suffix = true;
        host += 2;
        hlen -= 2;
    }
    if (!normalise(host, hlen, r.host, sizeof(r.host)))
        goto bad;
    r.ip = is_ip(r.host);
    if ((r.ip && r.suffix) || (!r.ip && !name_ok(r.host)))
        goto bad;
    if (port && parse_port(port, &r.port) < 0)
        goto bad;
    *ret = r;
    return 0;
bad:
    return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                          "invalid network rule '%s' (expected a name such as 'pypi.org', "
                          "'*.example.com' for its subdomains, an IP address, each with an "
                          "optional ':PORT')",
                          text ? text : "(null)");
}

void conch_net_rule_format(const struct conch_net_rule *r, char *buf, size_t size)
{
    bool v6 = r->ip && strchr(r->host, ':');
    if (r->port)
        snprintf(buf, size, "%s%s%s%s:%u", r->suffix ? "*." : "", v6 ? "[" : "", r->host,
                 v6 ? "]" : "", r->port);
    else
        snprintf(buf, size, "%s%s", r->suffix ? "*." : "", r->host);
}

void conch_net_policy_init(struct conch_net_policy *p, enum conch_net_mode mode)
{
    memset(p, 0, sizeof(*p));
    p->mode = mode;
}

void conch_net_policy_done(struct conch_net_policy *p)
{
    free(p->allow);
    free(p->deny);
    p->allow = p->deny = NULL;
    p->n_allow = p->n_deny = 0;
}

int conch_net_policy_add(struct conch_net_policy *p, bool deny, const char *text,
                         struct conch_err *err)
{
    struct conch_net_rule r;
    int rc = conch_net_rule_parse(text, &r, err);
    if (rc < 0)
        return rc;
    struct conch_net_rule **list = deny ? &p->deny : &p->allow;
    size_t *n = deny ? &p->n_deny : &p->n_allow;
    if (*n >= CONCH_NET_RULES_MAX)
        return conch_err_setk(err, CONCH_ERR_USAGE, E2BIG, "too many %s rules (at most %d)",
                              deny ? "deny" : "allow", CONCH_NET_RULES_MAX);
    struct conch_net_rule *grown = realloc(*list, (*n + 1) * sizeof(**list));
    if (!grown)
        return conch_err_set(err, ENOMEM, "out of memory");
    grown[(*n)++] = r;
    *list = grown;
    return 0;
}

int conch_net_policy_copy(struct conch_net_policy *dst, const struct conch_net_policy *src,
                          struct conch_err *err)
{
    struct conch_net_policy copy;
    conch_net_policy_init(&copy, src->mode);
    size_t na = src->n_allow * sizeof(*src->allow), nd = src->n_deny * sizeof(*src->deny);
    if ((na && !(copy.allow = malloc(na))) || (nd && !(copy.deny = malloc(nd)))) {
        conch_net_policy_done(&copy);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    if (na)
        memcpy(copy.allow, src->allow, na);
    if (nd)
        memcpy(copy.deny, src->deny, nd);
    copy.n_allow = src->n_allow;
    copy.n_deny = src->n_deny;
    *dst = copy;
    return 0;
}

/* Whether rule @r names @host (normalised); an IP only matches an IP rule of the same
 * address (compared as addresses: "::1" is "0::1"). */
static bool host_matches(const struct conch_net_rule *r, const char *host, bool ip)
{
    if (ip || r->ip) {
        if (!(ip && r->ip))
            return false;
        unsigned char a[16] = {0}, b[16] = {0};
        int fam = strchr(host, ':') ? AF_INET6 : AF_INET;
        if (fam != (strchr(r->host, ':') ? AF_INET6 : AF_INET))
            return false;
        return inet_pton(fam, host, a) == 1 && inet_pton(fam, r->host, b) == 1 &&
               !memcmp(a, b, sizeof(a));
    }
    if (!r->suffix)
        return !strcmp(host, r->host);
    size_t hl = strlen(host), rl = strlen(r->host);
    return hl > rl + 1 && host[hl - rl - 1] == '.' && !strcmp(host + hl - rl, r->host);
}

void conch_net_policy_check(const struct conch_net_policy *p, const char *host, uint16_t port,
                            struct conch_net_verdict *ret)
{
    memset(ret, 0, sizeof(*ret));
    char h[CONCH_NET_NAME_MAX + 1];
    if (p->mode != CONCH_NET_ALLOW) {
        snprintf(ret->why, sizeof(ret->why), "the sandbox's network mode is '%s'",
                 conch_net_mode_name(p->mode));
        return;
    }
    if (!host || !normalise(host, strlen(host), h, sizeof(h))) {
        snprintf(ret->why, sizeof(ret->why), "no host named");
        return;
    }
    bool ip = is_ip(h);
    for (size_t i = 0; i < p->n_deny; i++) {
        const struct conch_net_rule *r = &p->deny[i];
        if (host_matches(r, h, ip) && (!r->port || r->port == port)) {
            conch_net_rule_format(r, ret->rule, sizeof(ret->rule));
            snprintf(ret->why, sizeof(ret->why), "denied by rule '%.120s'", ret->rule);
            return;
        }
    }
    bool name_ok_other_port = false;
    for (size_t i = 0; i < p->n_allow; i++) {
        const struct conch_net_rule *r = &p->allow[i];
        if (!host_matches(r, h, ip))
            continue;
        if (r->port ? r->port == port : (port == 80 || port == 443)) {
            ret->allowed = true;
            ret->exact = !r->suffix;
            conch_net_rule_format(r, ret->rule, sizeof(ret->rule));
            return;
        }
        name_ok_other_port = true;
    }
    if (name_ok_other_port)
        snprintf(ret->why, sizeof(ret->why),
                 "port %u is not allowed for this host (rules without a port allow 80 and 443)",
                 port);
    else if (ip)
        snprintf(ret->why, sizeof(ret->why),
                 "IP addresses are refused unless a rule names the address");
    else
        snprintf(ret->why, sizeof(ret->why), "no rule allows this host");
}

bool conch_net_addr_internal(const struct sockaddr *sa)
{
    uint32_t a;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *v6 = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        const uint8_t *b = v6->s6_addr;
        if (IN6_IS_ADDR_V4MAPPED(v6) || IN6_IS_ADDR_V4COMPAT(v6)) {
            memcpy(&a, b + 12, 4);
            a = ntohl(a);
            goto v4;
        }
        return IN6_IS_ADDR_UNSPECIFIED(v6) || IN6_IS_ADDR_LOOPBACK(v6) ||
               IN6_IS_ADDR_LINKLOCAL(v6) || IN6_IS_ADDR_SITELOCAL(v6) ||
               IN6_IS_ADDR_MULTICAST(v6) || (b[0] & 0xfe) == 0xfc ||           /* fc00::/7 */
               (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b); /* NAT64 */
    }
    if (sa->sa_family != AF_INET)
        return true;
    a = ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr);
v4:
    return (a >> 24) == 0 || (a >> 24) == 127 || (a >> 24) == 10 ||
           (a >> 20) == (172u << 4 | 1) ||         /* 172.16/12 */
           (a >> 16) == (192u << 8 | 168) ||       /* 192.168/16 */
           (a >> 16) == (169u << 8 | 254) ||       /* 169.254/16 */
           (a >> 22) == ((100u << 8 | 64) >> 6) || /* 100.64/10 */
           (a >> 28) >= 14;                        /* multicast, reserved, broadcast */
}

bool conch_net_addr_host(const struct sockaddr *sa)
{
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) < 0)
        return true; /* cannot tell: as if it were (the caller refuses) */
    bool found = false;
    for (struct ifaddrs *i = all; i && !found; i = i->ifa_next) {
        const struct sockaddr *a = i->ifa_addr;
        if (!a || a->sa_family != sa->sa_family)
            continue;
        if (a->sa_family == AF_INET)
            found = ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
                    ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr;
        else if (a->sa_family == AF_INET6)
            found = !memcmp(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
                            &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr,
                            sizeof(struct in6_addr));
    }
    freeifaddrs(all);
    return found;
}
