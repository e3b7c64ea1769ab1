/* gateway.c - `conch __gateway` (hidden): the remote transport's gateway process, exec'd by
 * `conch serve --listen` (src/remote). It makes itself non-dumpable and closes every fd it
 * was given past stderr before it reads anything from the network. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/log.h"
#include "remote/remote.h"

enum { OPT_SOCKET = 1, OPT_LISTEN, OPT_CERT, OPT_KEY, OPT_MAX_CONN };

static const struct conch_cli_opt gateway_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"listen", 0, true, OPT_LISTEN},
    {"tls-cert", 0, true, OPT_CERT},
    {"tls-key", 0, true, OPT_KEY},
    {"max-connections", 0, true, OPT_MAX_CONN},
    {NULL, 0, false, 0},
};

static int gateway_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct conch_remote_opts *o = ctx;
    uint64_t v = 0;
    switch (key) {
    case OPT_SOCKET:
        o->socket_path = value;
        break;
    case OPT_LISTEN:
        o->listen = value;
        break;
    case OPT_CERT:
        o->tls_cert = value;
        break;
    case OPT_KEY:
        o->tls_key = value;
        break;
    case OPT_MAX_CONN:
        if (conch_cli_parse_count(value, "--max-connections", &v, err) < 0)
            return -EINVAL;
        o->max_connections = (unsigned)v;
        break;
    }
    return 0;
}

int conch_cli_gateway(int argc, char **argv)
{
    /* Nothing of it (the TLS key, tokens in flight) to a core dump, and no fd of the
     * daemon's (what it was exec'd with is closed before anything else). It stays dumpable:
     * the daemon admits a peer only once it has read the peer's /proc/PID/ns/user (a sandbox's
     * process is refused), which a non-dumpable process of the same uid refuses to a daemon
     * without CAP_SYS_PTRACE (an ordinary user's, or a container's with no capability: every
     * connection was refused there). Being ptrace-able by its own uid gives nothing: a process
     * of that uid may drive the daemon's socket as its owner anyway. */
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    close_range(3, ~0U, 0);
    static const char usage[] = "usage: conch __gateway --socket PATH --listen HOST:PORT "
                                "--tls-cert FILE --tls-key FILE [--max-connections N]\n"
                                "(started by `conch serve --listen`; see conch-serve(1))\n";
    struct conch_remote_opts o = {.max_connections = CONCH_REMOTE_DEFAULT_CONNECTIONS};
    const struct conch_cli_parser p = {
        .verb = "__gateway", .table = gateway_opts, .handler = gateway_opt, .ctx = &o};
    struct conch_err err = {0};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("__gateway", usage, "%s", err.msg);
    if (optind < argc || !o.socket_path || !o.listen || !o.tls_cert || !o.tls_key)
        return conch_cli_usage_error("__gateway", usage,
                                     "--socket, --listen, --tls-cert and "
                                     "--tls-key are needed");
    conch_log_set_level(getenv("CONCH_DEBUG") ? CONCH_LOG_DEBUG : CONCH_LOG_INFO);
    if (conch_remote_gateway_run(&o, &err) < 0) {
        fprintf(stderr, "conch __gateway: error: %s\n", err.msg);
        return 1;
    }
    return 0;
}
