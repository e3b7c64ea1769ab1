/* serve.c - `conch serve` (the daemon) and `conch gc`. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "daemon/daemon.h"
#include "daemon/recover.h"
#include "daemon/state.h"

static const char serve_usage[] =
    "usage: conch serve [--socket PATH | --stdio] [options]\n"
    "\n"
    "Serve JSON-RPC 2.0 (docs/PROTOCOL.md): long-lived sandboxes for agent harnesses.\n"
    "\n"
    "  --socket PATH       unix socket (default: $XDG_RUNTIME_DIR/conch/conch.sock, else\n"
    "                      /tmp/conch-<uid>/conch.sock; /run/conch/conch.sock as root); mode\n"
    "                      0600, same uid or root only; its directory must be yours (or\n"
    "                      root's) and writable by no one else\n"
    "  --stdio             serve one client on stdin/stdout; when stdin closes, destroy its\n"
    "                      sandboxes (commands still running are killed) and exit. Without\n"
    "                      --state-dir it keeps its state in a private directory of its own\n"
    "                      (<default>/stdio/XXXXXX, removed on exit), so any number can run\n"
    "                      side by side; defaults: --pool 0, --idle-timeout 0\n"
    "  --state-dir DIR     database, upper dirs and spill files (default: /var/lib/conch as\n"
    "                      root, else $XDG_STATE_HOME/conch); one daemon per directory: a\n"
    "                      second one is refused\n"
    "  --max-message BYTES largest JSON-RPC line (default 16M)\n"
    "  --pool N            pre-built sandboxes for exec.run {fresh: true} (default 4)\n"
    "  --max-sandboxes N   (default 256)\n"
    "  --idle-timeout S    destroy a sandbox unused this long (default 3600; 0 = never)\n"
    "\n"
    "Budgets of what sandboxes and clients make the daemon hold (see docs/ARCHITECTURE.md):\n"
    "  --max-output-memory BYTES\n"
    "                      output of all commands kept in memory together (default 64M);\n"
    "                      past it, output goes to the spill files early\n"
    "  --max-bridge-memory BYTES\n"
    "                      what all tool bridges hold together: partial request lines,\n"
    "                      unread answers, calls in flight (default 256M)\n"
    "  --max-sandbox-bridge-memory BYTES\n"
    "                      the same for one sandbox (default 64M); past either, the\n"
    "                      connection or call that does not fit is refused\n";

int conch_cli_serve(int argc, char **argv)
{
    struct conch_daemon_opts o;
    conch_daemon_opts_init(&o);
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"stdio", no_argument, NULL, 'i'},
        {"state-dir", required_argument, NULL, 'd'},
        {"max-message", required_argument, NULL, 'm'},
        {"pool", required_argument, NULL, 'p'},
        {"max-sandboxes", required_argument, NULL, 'n'},
        {"idle-timeout", required_argument, NULL, 't'},
        {"max-output-memory", required_argument, NULL, 'O'},
        {"max-bridge-memory", required_argument, NULL, 'B'},
        {"max-sandbox-bridge-memory", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    struct conch_err err = {0};
    int opt, r = 0;
    uint64_t v;
    bool pool_set = false, idle_set = false;
    optind = 1;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (opt) {
        case 's':
            o.socket_path = optarg;
            break;
        case 'i':
            o.stdio = true;
            break;
        case 'd':
            o.state_dir = optarg;
            break;
        case 'm':
            r = conch_parse_size(optarg, "--max-message", &v, &err);
            o.max_message = (size_t)v;
            if (r == 0 && v < 1024)
                r = conch_err_setk(&err, CONCH_ERR_USAGE, EINVAL, "--max-message: at least 1024");
            break;
        case 'p':
            v = strtoull(optarg, NULL, 10);
            o.pool_size = (unsigned)(v > 64 ? 64 : v);
            pool_set = true;
            break;
        case 'n':
            r = conch_cli_parse_count(optarg, "--max-sandboxes", &v, &err);
            o.max_sandboxes = (unsigned)v;
            break;
        case 't': {
            uint64_t ms;
            r = conch_cli_parse_seconds(optarg, "--idle-timeout", &ms, &err);
            o.idle_timeout = (double)ms / 1000;
            idle_set = true;
            break;
        }
        case 'O':
            r = conch_parse_size(optarg, "--max-output-memory", &o.max_output_memory, &err);
            break;
        case 'B':
            r = conch_parse_size(optarg, "--max-bridge-memory", &o.max_bridge_memory, &err);
            if (r == 0 && o.max_bridge_memory < 64 * 1024)
                r = conch_err_setk(&err, CONCH_ERR_USAGE, EINVAL,
                                   "--max-bridge-memory: at least 64K");
            break;
        case 'b':
            r = conch_parse_size(optarg, "--max-sandbox-bridge-memory",
                                 &o.max_sandbox_bridge_memory, &err);
            if (r == 0 && o.max_sandbox_bridge_memory < 64 * 1024)
                r = conch_err_setk(&err, CONCH_ERR_USAGE, EINVAL,
                                   "--max-sandbox-bridge-memory: at least 64K (a connection "
                                   "and a short call must fit)");
            break;
        case 'h':
            fputs(serve_usage, stdout);
            return 0;
        default:
            fprintf(stderr, "conch serve: unknown or incomplete option '%s'\n%s", argv[optind - 1],
                    serve_usage);
            return CONCH_EXIT_USAGE;
        }
        if (r < 0) {
            fprintf(stderr, "conch serve: %s\n", err.msg);
            return CONCH_EXIT_USAGE;
        }
    }
    /* A --stdio client asks for what it uses: no pool it did not ask for, and no timer
     * destroying its uncommitted work while it thinks. */
    if (o.stdio && !pool_set)
        o.pool_size = 0;
    if (o.stdio && !idle_set)
        o.idle_timeout = 0;
    if (!o.stdio)
        conch_log_set_level(getenv("CONCH_DEBUG") ? CONCH_LOG_DEBUG : CONCH_LOG_INFO);
    if (conch_daemon_run(&o, &err) < 0) {
        fprintf(stderr, "conch serve: error (%s): %s\n", conch_err_kind_name(err.kind), err.msg);
        return err.kind == CONCH_ERR_USAGE ? CONCH_EXIT_USAGE : 1;
    }
    return 0;
}

int conch_cli_gc(int argc, char **argv)
{
    const char *state_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--state-dir") && i + 1 < argc) {
            state_dir = argv[++i];
        } else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            puts("usage: conch gc [--state-dir DIR]\n\nRemove upper dirs, spill files and "
                 "cgroups that no recorded sandbox or job references.");
            return 0;
        } else {
            fprintf(stderr, "conch gc: unknown option '%s'\n", argv[i]);
            return CONCH_EXIT_USAGE;
        }
    }
    struct conch_err err = {0};
    char dir[PATH_MAX];
    if (state_dir)
        snprintf(dir, sizeof(dir), "%s", state_dir);
    else if (conch_state_default_dir(dir, sizeof(dir), &err) < 0) {
        fprintf(stderr, "conch gc: %s\n", err.msg);
        return 1;
    }
    char db[PATH_MAX + 16];
    snprintf(db, sizeof(db), "%s/state.db", dir);
    struct conch_state *st = NULL;
    if (conch_state_open(db, &st, &err) < 0) {
        fprintf(stderr, "conch gc: %s\n", err.msg);
        return 1;
    }
    struct conch_recover_report rep;
    memset(&rep, 0, sizeof(rep));
    int r = conch_recover_gc(st, dir, &rep, &err);
    conch_state_close(st);
    printf("removed %u sandbox dirs, %u spill files, %u cgroups\n", rep.dirs_removed,
           rep.spills_removed, rep.cgroups_removed);
    if (r < 0) {
        fprintf(stderr, "conch gc: %s\n", err.msg);
        return 1;
    }
    return 0;
}
