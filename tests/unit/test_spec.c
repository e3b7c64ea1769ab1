/* test_spec.c - unit tests of the sandbox spec (src/spec/): the one set of defaults, JSON
 * params (sandbox.create) and command-line options read by one table, and written back. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <valgrind/valgrind.h>

#include "jail/jail.h"
#include "spec/spec.h"

Test(spec, one_set_of_defaults)
{
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    cr_assert_eq(s.mode, CONCH_WS_OVERLAY);
    cr_assert_null(s.workspace);
    cr_assert_null(s.rootfs);
    cr_assert_not(s.as_root);
    cr_assert_eq(s.tmp_bytes, 256ULL << 20);
    cr_assert_eq(s.home_bytes, 64ULL << 20);
    cr_assert_eq(s.disk_bytes, 4ULL << 30);
    cr_assert_eq(s.limits.memory_bytes, 0);
    cr_assert_lt(s.idle_timeout, 0); /* the daemon's */
    /* The jail (conch run's sandbox) starts from the same ones. */
    struct conch_jail_spec j;
    conch_jail_spec_init(&j);
    cr_assert_eq(j.ws_mode, s.mode);
    cr_assert_eq(j.tmp_bytes, s.tmp_bytes);
    cr_assert_eq(j.home_bytes, s.home_bytes);
    cr_assert_eq(j.disk_bytes, s.disk_bytes);
    /* Empty params are the defaults too. */
    struct conch_sandbox_spec e;
    json_t *p = json_object();
    cr_assert_eq(conch_spec_from_json(&e, p, NULL, NULL), 0);
    cr_assert_eq(e.disk_bytes, s.disk_bytes);
    cr_assert_eq(e.tmp_bytes, s.tmp_bytes);
    json_decref(p);
}

Test(spec, json_params)
{
    json_t *p = json_pack("{s:s,s:s,s:b,s:{s:s},s:I,s:i,s:f,s:I,s:I,s:f,s:s,s:f,s:i}", "workspace",
                          "/tmp", "mode", "ro", "as_root", 1, "env", "A", "b", "memory",
                          (json_int_t)(64 << 20), "pids", 50, "cpu", 0.5, "tmp_size",
                          (json_int_t)(8 << 20), "disk", (json_int_t)(1 << 20), "idle_timeout",
                          30.0, "name", "web", "tool_timeout", 2.5, "max_tool_calls", 7);
    struct conch_sandbox_spec s;
    struct conch_err err = {0};
    cr_assert_eq(conch_spec_from_json(&s, p, NULL, &err), 0, "%s", err.msg);
    cr_assert_str_eq(s.workspace, "/tmp");
    cr_assert_eq(s.mode, CONCH_WS_RO);
    cr_assert(s.as_root);
    cr_assert_str_eq(json_string_value(json_object_get(s.env, "A")), "b");
    cr_assert_eq(s.limits.memory_bytes, 64 << 20);
    cr_assert_eq(s.limits.pids_max, 50);
    cr_assert_eq(s.limits.cpu_millicpus, 500);
    cr_assert_eq(s.tmp_bytes, 8 << 20);
    cr_assert_eq(s.disk_bytes, 1 << 20);
    cr_assert_float_eq(s.idle_timeout, 30.0, 1e-9);
    cr_assert_str_eq(s.name, "web");
    cr_assert_float_eq(s.tool_timeout, 2.5, 1e-9);
    cr_assert_eq(s.max_tool_calls, 7);
    /* Written back, then read again: the same spec. */
    json_t *back = conch_spec_to_json(&s);
    struct conch_sandbox_spec t;
    cr_assert_eq(conch_spec_from_json(&t, back, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(t.mode, s.mode);
    cr_assert_eq(t.limits.cpu_millicpus, s.limits.cpu_millicpus);
    cr_assert_eq(t.disk_bytes, s.disk_bytes);
    cr_assert_eq(t.max_tool_calls, s.max_tool_calls);
    cr_assert(json_equal(t.env, s.env));
    conch_spec_done(&t);
    json_decref(back);
    conch_spec_done(&s);
    json_decref(p);
}

/* @params must be refused naming @param, with @msg in the message. */
static void refused(const char *params, const char *param, const char *msg)
{
    json_t *p = json_loads(params, 0, NULL);
    cr_assert_not_null(p, "%s", params);
    struct conch_sandbox_spec s;
    struct conch_err err = {0};
    const char *got = NULL;
    cr_assert_lt(conch_spec_from_json(&s, p, &got, &err), 0, "%s was taken", params);
    cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    cr_assert_str_eq(got, param, "%s", params);
    cr_assert(strstr(err.msg, msg), "'%s' not in '%s'", msg, err.msg);
    json_decref(p);
}

Test(spec, json_refusals_name_the_param)
{
    refused("{\"workspace\": \"rel/dir\"}", "workspace", "workspace must be an absolute host path");
    refused("{\"rootfs\": \"/nonexistent-conch-dir\"}", "rootfs",
            "rootfs '/nonexistent-conch-dir': not a directory");
    refused("{\"mode\": \"bogus\"}", "mode", "invalid workspace mode 'bogus'");
    refused("{\"env\": {\"A\": 1}}", "env", "env must map names to strings");
    refused("{\"env\": {\"A=B\": \"x\"}}", "env", "env must map names to strings");
    refused("{\"memory\": 1000}", "memory", "param 'memory' must be 0 or between 1048576 and");
    refused("{\"pids\": -1}", "pids", "param 'pids' must be 0 or between 2 and 4194304");
    refused("{\"disk\": 3.5}", "disk", "param 'disk' must be an integer");
    refused("{\"cpu\": 2000}", "cpu", "param 'cpu' must be 0 or between 0.01 and 1024");
    refused("{\"max_tool_calls\": 0}", "max_tool_calls",
            "param 'max_tool_calls' must be between 1 and 1000000");
    refused("{\"as_root\": \"yes\"}", "as_root", "param 'as_root' must be a boolean");
}

Test(spec, zero_sizes_are_the_default)
{
    json_t *p = json_pack("{s:i,s:i}", "disk", 0, "tmp_size", 0);
    struct conch_sandbox_spec s;
    cr_assert_eq(conch_spec_from_json(&s, p, NULL, NULL), 0);
    cr_assert_eq(s.disk_bytes, CONCH_SPEC_DISK_DEFAULT);
    cr_assert_eq(s.tmp_bytes, CONCH_SPEC_TMP_DEFAULT);
    json_decref(p);
    conch_spec_defaults(&s);
    cr_assert_eq(conch_spec_set_option(&s, "disk", "0", NULL), 0);
    cr_assert_eq(conch_spec_set_option(&s, "home-size", "0", NULL), 0);
    cr_assert_eq(s.disk_bytes, CONCH_SPEC_DISK_DEFAULT);
    cr_assert_eq(s.home_bytes, CONCH_SPEC_HOME_DEFAULT);
    /* And what differs from nothing is not sent. */
    json_t *j = conch_spec_to_json(&s);
    cr_assert_eq(json_object_size(j), 0);
    json_decref(j);
}

Test(spec, options)
{
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    struct conch_err err = {0};
    cr_assert_eq(conch_spec_set_option(&s, "disk", "1G", &err), 0, "%s", err.msg);
    cr_assert_eq(s.disk_bytes, 1ULL << 30);
    cr_assert_eq(conch_spec_set_option(&s, "cpu", "0.25", &err), 0, "%s", err.msg);
    cr_assert_eq(s.limits.cpu_millicpus, 250);
    cr_assert_eq(conch_spec_set_option(&s, "pids", "64", &err), 0, "%s", err.msg);
    cr_assert_eq(s.limits.pids_max, 64);
    cr_assert_eq(conch_spec_set_option(&s, "mode", "rw", &err), 0, "%s", err.msg);
    cr_assert_eq(s.mode, CONCH_WS_RW);
    cr_assert_eq(conch_spec_set_option(&s, "as-root", NULL, &err), 0, "%s", err.msg);
    cr_assert(s.as_root);
    cr_assert_eq(conch_spec_set_option(&s, "idle-timeout", "90", &err), 0, "%s", err.msg);
    cr_assert_float_eq(s.idle_timeout, 90.0, 1e-9);
    char env[] = "TOKEN=secret";
    cr_assert_eq(conch_spec_set_option(&s, "env", env, &err), 0, "%s", err.msg);
    memset(env, 0, sizeof(env)); /* a copy was kept */
    cr_assert_str_eq(json_string_value(json_object_get(s.env, "TOKEN")), "secret");
    cr_assert_eq(conch_spec_set_option(&s, "workspace", "rel", &err), 0, "%s", err.msg);
    cr_assert_str_eq(s.workspace, "rel"); /* the caller resolves it */
    conch_spec_done(&s);
}

/* --@name @value must be refused with @msg in the message. */
static void bad_option(const char *name, const char *value, const char *msg)
{
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    struct conch_err err = {0};
    cr_assert_lt(conch_spec_set_option(&s, name, value, &err), 0, "--%s %s", name, value);
    cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    cr_assert(strstr(err.msg, msg), "'%s' not in '%s'", msg, err.msg);
    conch_spec_done(&s);
}

Test(spec, bad_options_are_named)
{
    bad_option("memory", "12Q", "--memory: '12Q'");
    bad_option("memory", "512k", "--memory: '512k' is out of range (0, or 1M .. 1T)");
    bad_option("disk", "100T", "--disk: '100T' is out of range (0, or 64k .. 64T)");
    bad_option("pids", "1", "--pids: '1' is out of range");
    bad_option("pids", "many", "--pids: 'many' is not a whole number");
    bad_option("pids", "-3", "--pids: '-3'");
    bad_option("cpu", "fast", "--cpu: 'fast' is not a number of CPUs");
    bad_option("cpu", "nan", "--cpu: 'nan'");
    bad_option("cpu", "0.001", "--cpu: '0.001' is out of range");
    bad_option("idle-timeout", "0.5", "--idle-timeout: '0.5' is out of range");
    bad_option("mode", "bogus", "--mode: invalid workspace mode 'bogus'");
    bad_option("env", "NOEQUALS", "--env: 'NOEQUALS' is not NAME=VALUE");
    bad_option("env", "=x", "--env: '=x' is not NAME=VALUE");
    bad_option("nosuch", "1", "unknown option '--nosuch'");
    bad_option("disk", NULL, "--disk needs a value");
}

Test(spec, options_a_verb_offers)
{
    bool v = false;
    unsigned which = CONCH_SPEC_OPT_DISK | CONCH_SPEC_OPT_AS_ROOT;
    cr_assert_eq(conch_spec_option("disk", which, &v), CONCH_SPEC_OPT_DISK);
    cr_assert(v);
    cr_assert_eq(conch_spec_option("as-root", which, &v), CONCH_SPEC_OPT_AS_ROOT);
    cr_assert_not(v);
    cr_assert_eq(conch_spec_option("memory", which, &v), 0);
    cr_assert_eq(conch_spec_option("tmp_size", ~0u, &v), 0); /* the JSON key is not an option */
}

Test(spec, network_fields)
{
    struct conch_sandbox_spec s;
    struct conch_err err = {0};
    const char *param = NULL;
    /* JSON: allow implies the allow mode; rules are checked; deny wins in the policy */
    json_t *p =
        json_pack("{s:[s,s],s:[s]}", "allow", "PyPI.org", "*.npmjs.org", "deny", "evil.npmjs.org");
    cr_assert_eq(conch_spec_from_json(&s, p, &param, &err), 0, "%s", err.msg);
    struct conch_net_policy pol;
    cr_assert_eq(conch_spec_net_policy(&s, &pol, &err), 0);
    cr_assert_eq(pol.mode, CONCH_NET_ALLOW);
    cr_assert_eq(pol.n_allow, 2);
    cr_assert_eq(pol.n_deny, 1);
    conch_net_policy_done(&pol);
    json_t *back = conch_spec_to_json(&s);
    cr_assert_eq(json_array_size(json_object_get(back, "allow")), 2);
    json_decref(back);
    conch_spec_done(&s);
    json_decref(p);

    static const char *const bad[] = {"{\"net\": \"open\"}",
                                      "{\"allow\": [\"http://x\"]}",
                                      "{\"allow\": \"a.org\"}",
                                      "{\"allow\": [1]}",
                                      "{\"net\": \"host\", \"allow\": [\"a.org\"]}",
                                      "{\"net\": \"none\", \"deny\": [\"a.org\"]}"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = json_loads(bad[i], 0, NULL);
        cr_assert_lt(conch_spec_from_json(&s, p, &param, &err), 0, "accepted %s", bad[i]);
        cr_assert_eq(err.kind, CONCH_ERR_USAGE);
        json_decref(p);
    }

    /* the command line: --allow implies allow, --net host stays host, rules checked */
    conch_spec_defaults(&s);
    cr_assert_eq(conch_spec_option("allow", CONCH_SPEC_OPT_NET, NULL), CONCH_SPEC_OPT_NET);
    cr_assert_eq(conch_spec_option("net", CONCH_SPEC_OPT_MODE, NULL), 0);
    cr_assert_eq(conch_spec_set_option(&s, "allow", "a.org:8443", &err), 0);
    cr_assert_eq(conch_spec_net_policy(&s, &pol, &err), 0);
    cr_assert_eq(pol.mode, CONCH_NET_ALLOW);
    cr_assert_eq(pol.allow[0].port, 8443);
    conch_net_policy_done(&pol);
    cr_assert_eq(conch_spec_set_option(&s, "net", "host", &err), 0);
    cr_assert_lt(conch_spec_net_policy(&s, &pol, &err), 0, "rules with --net host");
    cr_assert(strstr(err.msg, "need the network mode 'allow'"));
    cr_assert_lt(conch_spec_set_option(&s, "deny", "a..b", &err), 0);
    cr_assert(strstr(err.msg, "--deny"), "%s", err.msg);
    conch_spec_done(&s);
}

Test(spec, path_rules)
{
    struct conch_sandbox_spec s;
    struct conch_err err = {0};
    const char *param = NULL;
    char out[CONCH_SPEC_RULE_PATH_MAX];
    /* normalised: "." and "" components, a leading "./" and a trailing '/' go */
    static const char *const good[][2] = {{".git/hooks", ".git/hooks"},
                                          {"./.git//hooks/", ".git/hooks"},
                                          {"a/./b/.", "a/b"},
                                          {".env", ".env"},
                                          {"..x/y..", "..x/y.."}};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        cr_assert_eq(conch_rule_path_normalize(good[i][0], out, sizeof(out), &err), 0, "%s: %s",
                     good[i][0], err.msg);
        cr_assert_str_eq(out, good[i][1]);
    }
    static const char *const bad[] = {"/etc", "..", "a/../b", "a/..", ".", "./", "", "a\tb"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_lt(conch_rule_path_normalize(bad[i], out, sizeof(out), &err), 0, "accepted '%s'",
                     bad[i]);
        cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    }

    /* JSON and the command line fill the same list, and it is written back */
    json_t *p = json_loads("{\"readonly\": [\".git/hooks\", \"./.git/hooks/\"], "
                           "\"hidden\": [\".env\", \"secrets\"]}",
                           0, NULL);
    cr_assert_eq(conch_spec_from_json(&s, p, &param, &err), 0, "%s", err.msg);
    cr_assert_eq(s.n_rules, 3); /* the same path twice is kept once */
    json_t *back = conch_spec_to_json(&s);
    char *text = json_dumps(back, JSON_SORT_KEYS | JSON_COMPACT);
    cr_assert(strstr(text, "\"hidden\":[\".env\",\"secrets\"]"), "%s", text);
    cr_assert(strstr(text, "\"readonly\":[\".git/hooks\"]"), "%s", text);
    free(text);
    json_decref(back);
    json_decref(p);
    conch_spec_done(&s);
    cr_assert_eq(conch_spec_option("hidden", CONCH_SPEC_OPT_RULES, NULL), CONCH_SPEC_OPT_RULES);
    cr_assert_eq(conch_spec_option("readonly", CONCH_SPEC_OPT_MOUNT, NULL), 0);
    conch_spec_defaults(&s);
    cr_assert_eq(conch_spec_set_option(&s, "readonly", "a", &err), 0);
    cr_assert_lt(conch_spec_set_option(&s, "hidden", "a", &err), 0);
    cr_assert(strstr(err.msg, "both read-only and hidden"), "%s", err.msg);
    cr_assert_eq(conch_spec_set_option(&s, "hidden", "b", &err), 0);
    cr_assert_lt(conch_spec_set_option(&s, "readonly", "b/c", &err), 0);
    cr_assert(strstr(err.msg, "beneath the hidden path 'b'"), "%s", err.msg);
    cr_assert_lt(conch_spec_set_option(&s, "hidden", "../x", &err), 0);
    cr_assert(strstr(err.msg, "--hidden"), "%s", err.msg);
    for (int i = 0; s.n_rules < CONCH_SPEC_RULES_MAX; i++) {
        char name[16];
        snprintf(name, sizeof(name), "r%d", i);
        cr_assert_eq(conch_spec_set_option(&s, "readonly", name, &err), 0);
    }
    cr_assert_lt(conch_spec_set_option(&s, "readonly", "one-more", &err), 0);
    conch_spec_done(&s);

    /* bad JSON: the offending key is named */
    static const char *const bad_json[][2] = {{"{\"readonly\": \"x\"}", "readonly"},
                                              {"{\"hidden\": [1]}", "hidden"},
                                              {"{\"hidden\": [\"a\\u0000b\"]}", "hidden"},
                                              {"{\"readonly\": [\"/abs\"]}", "readonly"}};
    for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
        p = json_loads(bad_json[i][0], JSON_ALLOW_NUL, NULL);
        cr_assert_not_null(p, "%s", bad_json[i][0]);
        cr_assert_lt(conch_spec_from_json(&s, p, &param, &err), 0, "accepted %s", bad_json[i][0]);
        cr_assert_str_eq(param, bad_json[i][1]);
        json_decref(p);
    }
}

/* A unix socket bound at @path (short: a socket address). */
static void make_socket(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(path), sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0, "bind %s: %s", path,
                 strerror(errno));
    close(fd);
}

Test(spec, sockets_parse_and_refuse)
{
    /* Run plain and under ASan; valgrind 3.19 answers openat2 (conch_socket_open's
     * RESOLVE_NO_MAGICLINKS walk) with ENOSYS. */
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind 3.19 does not implement openat2, which conch_socket_open needs");
    char dir[] = "/tmp/conch-sock-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    chmod(dir, 0755);
    char sock[128], file[128], link[128], opt[300];
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    snprintf(file, sizeof(file), "%s/plain", dir);
    snprintf(link, sizeof(link), "%s/link.sock", dir);
    make_socket(sock);
    close(open(file, O_WRONLY | O_CREAT, 0644));
    cr_assert_eq(symlink(sock, link), 0);
    struct conch_err err = {0};
    struct conch_sandbox_spec s;
    conch_spec_defaults(&s);
    snprintf(opt, sizeof(opt), "%s:/run/agent.sock", sock);
    cr_assert_eq(conch_spec_set_option(&s, "pass-socket", opt, &err), 0, "%s", err.msg);
    cr_assert_eq(s.n_sockets, 1);
    cr_assert_str_eq(s.sockets[0].host, sock);
    cr_assert_str_eq(s.sockets[0].path, "/run/agent.sock");
    /* Written back as params, read again the same. */
    json_t *p = conch_spec_to_json(&s);
    struct conch_sandbox_spec t;
    cr_assert_eq(conch_spec_from_json(&t, p, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(t.n_sockets, 1);
    cr_assert_str_eq(t.sockets[0].path, "/run/agent.sock");
    conch_spec_done(&t);
    json_decref(p);
    /* The same inside path twice, and a mount over it. */
    cr_assert_lt(conch_spec_set_option(&s, "pass-socket", opt, &err), 0);
    cr_assert(strstr(err.msg, "overlap"), "%s", err.msg);
    cr_assert_lt(conch_spec_set_option(&s, "mount", "type=tmpfs,target=/run", &err), 0);
    conch_spec_done(&s);

    static const struct {
        const char *host; /* "S": the socket, "F": a file, "L": the link */
        const char *inside;
        const char *why;
    } bad[] = {
        {"F", "/run/x.sock", "not a unix socket"},
        {"L", "/run/x.sock", "symbolic link"},
        {"M", "/run/x.sock", "No such file"},
        {"P", "/run/x.sock", "/proc's links"},
        {"S", "/workspace/x.sock", "/workspace"},
        {"S", "/run/conch/x.sock", "/run/conch"},
        {"S", "/proc/x.sock", "/proc"},
        {"S", "/etc/x.sock", "/etc"},
        {"S", "/run", "hide"},
        {"S", "/tmp", "hide"},
        {"S", "/run/../etc/x", "'..'"},
        {"S", "relative", "absolute"},
        {"S",
         "/run/"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaa",
         "at most"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char host[256];
        switch (bad[i].host[0]) {
        case 'S':
            snprintf(host, sizeof(host), "%s", sock);
            break;
        case 'F':
            snprintf(host, sizeof(host), "%s", file);
            break;
        case 'L':
            snprintf(host, sizeof(host), "%s", link);
            break;
        case 'M':
            snprintf(host, sizeof(host), "%s/missing.sock", dir);
            break;
        default:
            snprintf(host, sizeof(host), "/proc/self/root%s", sock);
            break;
        }
        json_t *v = json_pack("{s:s,s:s}", "host", host, "path", bad[i].inside);
        struct conch_socket out;
        memset(&err, 0, sizeof(err));
        cr_assert_lt(conch_socket_from_json(v, &out, &err), 0, "%s -> %s accepted", host,
                     bad[i].inside);
        cr_assert(strstr(err.msg, bad[i].why), "%s: %s", bad[i].why, err.msg);
        json_decref(v);
    }

    /* conch's own control socket, and what lies in its directory. */
    struct conch_socket own;
    memset(&own, 0, sizeof(own));
    snprintf(own.host, sizeof(own.host), "%s", sock);
    snprintf(own.path, sizeof(own.path), "/run/x.sock");
    cr_assert_lt(conch_spec_sockets_clear(&own, 1, sock, NULL, &err), 0);
    cr_assert(strstr(err.msg, "control socket"), "%s", err.msg);
    cr_assert_lt(conch_spec_sockets_clear(&own, 1, file, NULL, &err), 0);
    cr_assert(strstr(err.msg, "directory"), "%s", err.msg);
    cr_assert_lt(conch_spec_sockets_clear(&own, 1, NULL, dir, &err), 0);
    cr_assert(strstr(err.msg, "state directory"), "%s", err.msg);
    cr_assert_eq(conch_spec_sockets_clear(&own, 1, "/nonexistent/conch.sock", "/nonexistent", &err),
                 0, "%s", err.msg);

    /* Another user's socket: refused to anyone but root (here, as uid 65534: the root-owned
     * socket is refused, the same socket given to 65534 is accepted). */
    if (geteuid() == 0) {
        pid_t pid = fork();
        if (pid == 0) {
            if (setresuid(65534, 65534, 65534) < 0)
                _exit(3);
            struct stat st;
            int fd = conch_socket_open(sock, &st, NULL, 0, &err);
            _exit(fd < 0 && strstr(err.msg, "owned by uid 0") ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
        cr_assert_eq(chown(sock, 65534, 65534), 0);
        pid = fork();
        if (pid == 0) {
            if (setresuid(65534, 65534, 65534) < 0)
                _exit(3);
            struct stat st;
            int fd = conch_socket_open(sock, &st, NULL, 0, &err);
            _exit(fd >= 0 ? 0 : 1);
        }
        waitpid(pid, &status, 0);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    }
    unlink(sock);
    unlink(file);
    unlink(link);
    rmdir(dir);
}

Test(spec, overlay_mounts_parse_and_refuse)
{
    struct conch_err err = {0};
    struct conch_mount m;
    cr_assert_eq(conch_mount_parse("type=overlay,source=/tmp,target=/data", &m, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(m.type, CONCH_MOUNT_OVERLAY);
    cr_assert(!m.rw, "the host dir is only read: writes go to the upper");
    json_t *j = conch_mount_to_json(&m);
    cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "overlay");
    cr_assert_str_eq(json_string_value(json_object_get(j, "source")), "/tmp");
    json_decref(j);
    static const char *const bad[][2] = {
        {"type=overlay,target=/data", "needs a source"},
        {"type=overlay,source=/tmp,target=/data,name=x", "only a store"},
        {"type=overlay,source=relative,target=/data", "absolute"},
        {"type=overlay,source=/proc,target=/data", "proc"},
        {"type=overlay,source=/tmp,target=/workspace/x", "/workspace"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err = (struct conch_err){0};
        cr_assert_lt(conch_mount_parse(bad[i][0], &m, &err), 0, "%s", bad[i][0]);
        cr_assert(strstr(err.msg, bad[i][1]), "%s: %s", bad[i][0], err.msg);
    }
}
