/* remote-main.c - the `conch-remote` binary: the remote transports, the one place libwebsockets
 * and OpenSSL are linked (docs/ARCHITECTURE.md, "Two executables"). conch starts it for what
 * needs TLS and nothing else: `conch serve --listen` runs `__check-tls` and execs `__gateway`, a
 * client verb with
 * --remote runs `__connect` as its pipe to the remote daemon, and `conch mcp --listen` execs
 * itself as `conch-remote mcp ...`. Keeping them out of conch keeps every process conch starts
 * (a warden per sandbox above all) from relocating and carrying ~400 KB of TLS code. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "core/proctitle.h"
#include "core/error.h"
#include "mcp/mcp.h"
#include "remote/remote.h"

int main(int argc, char **argv)
{
    conch_proctitle_init(argc, argv);
    const char *verb = argc > 1 ? argv[1] : "";
    if (!strcmp(verb, "__gateway"))
        return conch_cli_gateway(argc - 1, argv + 1);
    if (!strcmp(verb, "__check-tls") && argc == 4) {
        /* For conch serve --listen, before it starts: why a certificate or key will not do. */
        struct conch_err err = {0};
        if (conch_remote_check_tls(argv[2], argv[3], &err) < 0) {
            puts(err.msg);
            return err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : 1;
        }
        return 0;
    }
    if (!strcmp(verb, "__connect"))
        return conch_cli_remote_bridge(argc - 1, argv + 1);
    if (!strcmp(verb, "mcp")) {
        conch_cli_mcp_http = conch_mcp_serve_http;
        return conch_cli_mcp(argc - 1, argv + 1);
    }
    if (!strcmp(verb, "--version")) {
        puts("conch-remote 0.1.0");
        return 0;
    }
    fprintf(stderr, "conch-remote: the remote transports of conch, started by conch itself "
                    "(conch serve --listen, conch --remote URL VERB, conch mcp --listen); "
                    "not a command to run by hand\n");
    return CONCH_EXIT_USAGE;
}
