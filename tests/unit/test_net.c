/* test_net.c - the network policy (rules, matching, deny precedence, ports, IP literals,
 * internal addresses) and the proxy request parser. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <ifaddrs.h>
#include <string.h>

#include "net/net.h"

static struct conch_net_policy pol(const char *const *allow, const char *const *deny)
{
    struct conch_net_policy p;
    struct conch_err err = {0};
    conch_net_policy_init(&p, CONCH_NET_ALLOW);
    for (size_t i = 0; allow && allow[i]; i++)
        cr_assert_eq(conch_net_policy_add(&p, false, allow[i], &err), 0, "%s", err.msg);
    for (size_t i = 0; deny && deny[i]; i++)
        cr_assert_eq(conch_net_policy_add(&p, true, deny[i], &err), 0, "%s", err.msg);
    return p;
}

static bool allowed(const struct conch_net_policy *p, const char *host, uint16_t port)
{
    struct conch_net_verdict v;
    conch_net_policy_check(p, host, port, &v);
    return v.allowed;
}

Test(net, rules_parse_and_format)
{
    static const char *const good[][2] = {
        {"PyPI.org", "pypi.org"},
        {"*.Example.com", "*.example.com"},
        {"example.com.", "example.com"},
        {"example.com:8443", "example.com:8443"},
        {"10.0.0.5", "10.0.0.5"},
        {"[::1]:8080", "[::1]:8080"},
        {"::1", "::1"},
        {"a-b.c_d.org", "a-b.c_d.org"},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        struct conch_net_rule r;
        struct conch_err err = {0};
        cr_assert_eq(conch_net_rule_parse(good[i][0], &r, &err), 0, "%s: %s", good[i][0], err.msg);
        char buf[300];
        conch_net_rule_format(&r, buf, sizeof(buf));
        cr_assert_str_eq(buf, good[i][1]);
    }
    static const char *const bad[] = {
        "",           "*",           "*.",     "a..b",     "-a.com",    "a-.com", "a b",
        "x.com:0",    "x.com:65536", "x.com:", "x.com:8a", "*.1.2.3.4", "[::1",   "http://x.com",
        "x.com/path", "*x.com"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct conch_net_rule r;
        struct conch_err err = {0};
        cr_assert_lt(conch_net_rule_parse(bad[i], &r, &err), 0, "'%s' was accepted", bad[i]);
        cr_assert(strstr(err.msg, "invalid network rule"));
    }
    cr_assert_eq(conch_net_rule_parse(NULL, &(struct conch_net_rule){0}, &(struct conch_err){0}),
                 -EINVAL);
}

Test(net, exact_suffix_ports_deny)
{
    static const char *const allow[] = {"pypi.org", "*.npmjs.org", "git.example.com:8443",
                                        "10.1.2.3", NULL};
    static const char *const deny[] = {"evil.npmjs.org", NULL};
    struct conch_net_policy p = pol(allow, deny);
    cr_assert(allowed(&p, "pypi.org", 443));
    cr_assert(allowed(&p, "PYPI.ORG.", 80));
    cr_assert(!allowed(&p, "pypi.org", 8080), "a rule without a port allows 80 and 443 only");
    cr_assert(!allowed(&p, "files.pypi.org", 443), "an exact rule is not a suffix rule");
    cr_assert(allowed(&p, "registry.npmjs.org", 443));
    cr_assert(allowed(&p, "a.b.npmjs.org", 443));
    cr_assert(!allowed(&p, "npmjs.org", 443), "*.x does not match x itself");
    cr_assert(!allowed(&p, "xnpmjs.org", 443));
    cr_assert(!allowed(&p, "evil.npmjs.org", 443), "deny wins over a suffix allow");
    cr_assert(allowed(&p, "git.example.com", 8443));
    cr_assert(!allowed(&p, "git.example.com", 443));
    cr_assert(allowed(&p, "10.1.2.3", 443));
    cr_assert(!allowed(&p, "10.1.2.4", 443), "IP literals only by an IP rule");
    cr_assert(!allowed(&p, "127.0.0.1", 80));
    cr_assert(!allowed(&p, "::1", 80));
    cr_assert(!allowed(&p, "", 80));
    struct conch_net_verdict v;
    conch_net_policy_check(&p, "evil.npmjs.org", 443, &v);
    cr_assert_str_eq(v.rule, "evil.npmjs.org");
    cr_assert(strstr(v.why, "denied by rule 'evil.npmjs.org'"));
    conch_net_policy_check(&p, "registry.npmjs.org", 443, &v);
    cr_assert(!v.exact);
    cr_assert_str_eq(v.rule, "*.npmjs.org");
    conch_net_policy_check(&p, "pypi.org", 443, &v);
    cr_assert(v.exact);
    conch_net_policy_check(&p, "pypi.org", 22, &v);
    cr_assert(strstr(v.why, "port 22"));
    conch_net_policy_check(&p, "1.1.1.1", 443, &v);
    cr_assert(strstr(v.why, "IP addresses"));
    conch_net_policy_done(&p);

    /* a deny rule with a port denies that port only; without one, every port */
    static const char *const allow2[] = {"a.org", "a.org:8080", "b.org", NULL};
    static const char *const deny2[] = {"a.org:443", "b.org", NULL};
    p = pol(allow2, deny2);
    cr_assert(!allowed(&p, "a.org", 443));
    cr_assert(allowed(&p, "a.org", 80));
    cr_assert(allowed(&p, "a.org", 8080));
    cr_assert(!allowed(&p, "b.org", 80));
    conch_net_policy_done(&p);

    /* outside the allow mode nothing is allowed */
    conch_net_policy_init(&p, CONCH_NET_NONE);
    cr_assert(!allowed(&p, "a.org", 443));
    conch_net_policy_done(&p);
}

Test(net, rule_cap)
{
    struct conch_net_policy p;
    conch_net_policy_init(&p, CONCH_NET_ALLOW);
    struct conch_err err = {0};
    for (int i = 0; i < CONCH_NET_RULES_MAX; i++)
        cr_assert_eq(conch_net_policy_add(&p, false, "a.org", &err), 0);
    cr_assert_eq(conch_net_policy_add(&p, false, "a.org", &err), -E2BIG);
    conch_net_policy_done(&p);
}

static bool internal(const char *ip)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (strchr(ip, ':')) {
        ss.ss_family = AF_INET6;
        cr_assert_eq(inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&ss)->sin6_addr), 1);
    } else {
        ss.ss_family = AF_INET;
        cr_assert_eq(inet_pton(AF_INET, ip, &((struct sockaddr_in *)&ss)->sin_addr), 1);
    }
    return conch_net_addr_internal((struct sockaddr *)&ss);
}

Test(net, internal_addresses)
{
    static const char *const in[] = {"127.0.0.1",   "127.1.2.3",        "0.0.0.0",
                                     "10.0.0.1",    "172.16.0.1",       "172.31.255.255",
                                     "192.168.1.1", "169.254.169.254",  "100.64.0.1",
                                     "224.0.0.1",   "255.255.255.255",  "::1",
                                     "::",          "fe80::1",          "fc00::1",
                                     "fd12::1",     "::ffff:127.0.0.1", "::ffff:10.0.0.1",
                                     "ff02::1",     "64:ff9b::7f00:1"};
    static const char *const out[] = {"1.1.1.1",         "172.32.0.1",    "172.15.255.255",
                                      "100.128.0.1",     "8.8.8.8",       "192.169.0.1",
                                      "2606:4700::1111", "::ffff:8.8.8.8"};
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++)
        cr_assert(internal(in[i]), "%s should be internal", in[i]);
    for (size_t i = 0; i < sizeof(out) / sizeof(out[0]); i++)
        cr_assert(!internal(out[i]), "%s should be public", out[i]);
}

static bool host_addr(const char *ip)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (strchr(ip, ':')) {
        ss.ss_family = AF_INET6;
        cr_assert_eq(inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&ss)->sin6_addr), 1);
    } else {
        ss.ss_family = AF_INET;
        cr_assert_eq(inet_pton(AF_INET, ip, &((struct sockaddr_in *)&ss)->sin_addr), 1);
    }
    return conch_net_addr_host((struct sockaddr *)&ss);
}

/* Every address of this host's interfaces is the host's; an address of no interface is not. */
Test(net, host_addresses)
{
    cr_assert(host_addr("127.0.0.1"));
    cr_assert(!host_addr("203.0.113.77"), "TEST-NET-3 is no interface's address");
    struct ifaddrs *all = NULL;
    cr_assert_eq(getifaddrs(&all), 0);
    unsigned seen = 0;
    for (struct ifaddrs *i = all; i; i = i->ifa_next) {
        if (!i->ifa_addr ||
            (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        cr_assert(conch_net_addr_host(i->ifa_addr), "%s's address", i->ifa_name);
        seen++;
    }
    freeifaddrs(all);
    cr_assert_gt(seen, 0);
}

static int parse(const char *s, struct conch_net_request *r, struct conch_err *err)
{
    return conch_net_request_parse(s, strlen(s), r, err);
}

Test(net, request_parse)
{
    struct conch_net_request r;
    struct conch_err err = {0};
    const char *get = "GET http://Example.COM:8080/a/b?c=1 HTTP/1.1\r\nHost: example.com\r\n"
                      "Proxy-Connection: keep-alive\r\n\r\nBODY";
    cr_assert_eq(parse(get, &r, &err), 1, "%s", err.msg);
    cr_assert(!r.connect);
    cr_assert_str_eq(r.host, "example.com");
    cr_assert_eq(r.port, 8080);
    cr_assert_str_eq(r.method, "GET");
    cr_assert_eq(r.path_len, strlen("/a/b?c=1"));
    cr_assert(!strncmp(get + r.path_off, "/a/b?c=1", r.path_len));
    cr_assert(!strncmp(get + r.version_off, "HTTP/1.1", 8));
    cr_assert_eq(r.head_len, strlen(get) - 4);

    cr_assert_eq(parse("GET http://a.org HTTP/1.0\r\n\r\n", &r, &err), 1);
    cr_assert_eq(r.port, 80);
    cr_assert_eq(r.path_len, 0);
    cr_assert_eq(parse("GET http://a.org?x HTTP/1.0\n\n", &r, &err), 1, "bare LF");
    cr_assert_eq(r.path_len, 2);

    cr_assert_eq(parse("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n", &r, &err), 1);
    cr_assert(r.connect);
    cr_assert_str_eq(r.host, "pypi.org");
    cr_assert_eq(r.port, 443);
    cr_assert_eq(parse("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n", &r, &err), 1);
    cr_assert_str_eq(r.host, "::1");
    cr_assert_eq(r.port, 8443);

    /* incomplete */
    cr_assert_eq(parse("GET http://a.org/ HTTP/1.1\r\nHost: a", &r, &err), 0);
    cr_assert_eq(parse("", &r, &err), 0);

    static const char *const bad[] = {
        "CONNECT pypi.org HTTP/1.1\r\n\r\n",
        "CONNECT pypi.org:0 HTTP/1.1\r\n\r\n",
        "CONNECT pypi.org:99999 HTTP/1.1\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: a.org\r\n\r\n",
        "GET https://a.org/ HTTP/1.1\r\n\r\n",
        "GET http://user:pw@a.org/ HTTP/1.1\r\n\r\n",
        "GET http://a.org/ HTTP/2.0\r\n\r\n",
        "GET http://a.org/ HTTP/1.1 x\r\n\r\n",
        "GET  http://a.org/ HTTP/1.1\r\n\r\n",
        "get http://a.org/ HTTP/1.1\r\n\r\n",
        "GET http://a.org/ HTTP/1.1\r\nno colon\r\n\r\n",
        "GET http://a.org/ HTTP/1.1\r\n folded: x\r\n\r\n",
        "GET http://a.org/ HTTP/1.1\r\nConnection : keep-alive\r\n\r\n",
        "GET http://a.org/ HTTP/1.1\r\nX\ty: 1\r\n\r\n",
        "GET http://a.org/ HTTP/1.1\r\nX(y): 1\r\n\r\n",
        "GET http://a b.org/ HTTP/1.1\r\n\r\n",
        "GET http://a.org:/ HTTP/1.1\r\n\r\n",
        "GET http:///x HTTP/1.1\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_lt(parse(bad[i], &r, &err), 0, "accepted: %s", bad[i]);
    cr_assert_eq(parse("GET https://a.org/ HTTP/1.1\r\n\r\n", &r, &err), -EPROTONOSUPPORT);
    cr_assert(strstr(err.msg, "CONNECT"));
}

Test(net, request_too_long)
{
    size_t n = CONCH_NET_HEAD_MAX + 100;
    char *buf = malloc(n);
    memcpy(buf, "GET http://a.org/", 17);
    memset(buf + 17, 'a', n - 17);
    struct conch_net_request r;
    struct conch_err err = {0};
    cr_assert_eq(conch_net_request_parse(buf, n, &r, &err), -E2BIG);
    cr_assert_eq(conch_net_request_parse(buf, 1000, &r, &err), 0);
    free(buf);
}

Test(net, modes)
{
    enum conch_net_mode m;
    struct conch_err err = {0};
    cr_assert_eq(conch_net_mode_parse("host", &m, &err), 0);
    cr_assert_eq(m, CONCH_NET_HOST);
    cr_assert_str_eq(conch_net_mode_name(CONCH_NET_ALLOW), "allow");
    cr_assert_lt(conch_net_mode_parse("open", &m, &err), 0);
    cr_assert(strstr(err.msg, "none, allow or host"));
}
