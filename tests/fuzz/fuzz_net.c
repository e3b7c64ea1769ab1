/* fuzz_net.c - libFuzzer target for what a sandbox sends the network proxy: request heads
 * (net/http.c) and, from the same bytes, rules and a policy check (net/policy.c). Every
 * offset the parser returns must lie inside the input. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct conch_net_request r;
    struct conch_err err = {0};
    int rc = conch_net_request_parse((const char *)data, size, &r, &err);
    if (rc == 1) {
        if (r.head_len > size || r.headers_off + r.headers_len > size ||
            r.path_off + r.path_len > size || r.version_off + 8 > size || !r.host[0])
            abort();
        struct conch_net_policy p;
        conch_net_policy_init(&p, CONCH_NET_ALLOW);
        conch_net_policy_add(&p, false, "*.example.com", &err);
        conch_net_policy_add(&p, true, "evil.example.com:443", &err);
        struct conch_net_verdict v;
        conch_net_policy_check(&p, r.host, r.port, &v);
        conch_net_policy_done(&p);
    }
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    struct conch_net_rule rule;
    if (conch_net_rule_parse(s, &rule, &err) == 0) {
        char buf[300];
        conch_net_rule_format(&rule, buf, sizeof(buf));
        struct conch_net_rule again;
        if (conch_net_rule_parse(buf, &again, &err) != 0 || memcmp(&rule, &again, sizeof(rule)))
            abort(); /* what is written back reads back the same */
    }
    free(s);
    return 0;
}
