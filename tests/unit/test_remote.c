/* test_remote.c - unit tests for src/remote: --listen's HOST:PORT forms, and the gateway's
 * blocking call to the daemon (its answer found among notifications, exactly its line read so
 * that what follows stays for the forwarding, errors and a daemon that closes). */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "remote/remote-internal.h"
#include "remote/remote.h"

Test(remote, parse_listen)
{
    char host[64];
    int port = 0;
    struct conch_err err = {0};
    cr_assert_eq(conch_remote_parse_listen("0.0.0.0:8443", host, sizeof(host), &port, &err), 0);
    cr_assert_str_eq(host, "0.0.0.0");
    cr_assert_eq(port, 8443);
    cr_assert_eq(conch_remote_parse_listen("[::1]:1", host, sizeof(host), &port, &err), 0);
    cr_assert_str_eq(host, "::1");
    cr_assert_eq(port, 1);
    const char *bad[] = {"8443", ":8443", "host:", "host:0", "host:65536", "host:12x", "[]:80", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(conch_remote_parse_listen(bad[i], host, sizeof(host), &port, &err), -EINVAL,
                     "%s", bad[i]);
        cr_assert(strstr(err.msg, "is not HOST:PORT"), "%s: %s", bad[i], err.msg);
    }
}

/* The daemon's side, in a child process (no assertion there: a failure is its exit status):
 * read the request's line, then write @answer (several lines may follow). */
static void daemon_answers(int fd, const char *answer)
{
    char buf[4096];
    size_t got = 0;
    while (got == 0 || buf[got - 1] != '\n') {
        ssize_t n = read(fd, buf + got, sizeof(buf) - 1 - got);
        if (n <= 0)
            _exit(2);
        got += (size_t)n;
    }
    buf[got] = '\0';
    if (!strstr(buf, "\"method\":\"connection.auth\""))
        _exit(3);
    if (write(fd, answer, strlen(answer)) != (ssize_t)strlen(answer))
        _exit(4);
    _exit(0);
}

static void reap_ok(pid_t pid)
{
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the daemon side failed: %d", st);
}

Test(remote, daemon_call_reads_exactly_its_answer)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    /* A notification, the answer, then the next message, all in one write. */
    const char *ans =
        "{\"jsonrpc\":\"2.0\",\"method\":\"x.note\",\"params\":{}}\n"
        "{\"jsonrpc\":\"2.0\",\"id\":\"conch-gateway\",\"result\":{\"tenant\":\"a\"}}\n"
        "{\"next\":1}\n";
    json_t *res = NULL;
    int code = 0;
    /* The request goes first; the daemon side answers from a child. */
    pid_t pid = fork();
    if (pid == 0)
        daemon_answers(sv[1], ans);
    int r = conch_remote_daemon_call(sv[0], "connection.auth", json_pack("{s:s}", "token", "t"),
                                     5000, &res, &code);
    cr_assert_eq(r, 0);
    cr_assert_str_eq(json_string_value(json_object_get(res, "tenant")), "a");
    json_decref(res);
    char rest[64] = "";
    cr_assert_eq(read(sv[0], rest, sizeof(rest) - 1), 11);
    cr_assert_str_eq(rest, "{\"next\":1}\n");
    reap_ok(pid);
    close(sv[0]);
    close(sv[1]);
}

Test(remote, daemon_call_error_and_close)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid_t pid = fork();
    if (pid == 0)
        daemon_answers(sv[1], "{\"jsonrpc\":\"2.0\",\"id\":\"conch-gateway\",\"error\":"
                              "{\"code\":-32020,\"message\":\"unauthorized\"}}\n");
    json_t *res = NULL;
    int code = 0;
    cr_assert_eq(conch_remote_daemon_call(sv[0], "connection.auth", NULL, 5000, &res, &code), 1);
    cr_assert_eq(code, -32020);
    cr_assert_null(res);
    reap_ok(pid);
    close(sv[1]);
    /* The daemon side is gone: the call fails, it does not wait. */
    int r = conch_remote_daemon_call(sv[0], "connection.auth", NULL, 5000, &res, &code);
    cr_assert(r == -EPIPE || r == -ECONNRESET, "%d", r);
    close(sv[0]);
}

Test(remote, daemon_call_times_out)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    json_t *res = NULL;
    int code = 0;
    cr_assert_eq(conch_remote_daemon_call(sv[0], "daemon.ping", NULL, 100, &res, &code),
                 -ETIMEDOUT);
    close(sv[0]);
    close(sv[1]);
}
