/* main.c - the `conch` binary: dispatch to one subcommand. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "core/proctitle.h"
#include "jail/jail.h"

static void usage(FILE *f)
{
    fputs("usage: conch [--remote URL [--token-file FILE]] <command> [options]\n"
          "\n"
          "commands:\n"
          "  run [options] -- CMD [ARGS...]   run one command in a fresh sandbox\n"
          "  doctor                           show which kernel fences this machine allows\n"
          "  serve [--socket P | --stdio]     run the daemon (JSON-RPC, docs/PROTOCOL.md)\n"
          "  ps [--json]                      list the daemon's sandboxes and what runs there\n"
          "  create [--workspace DIR] [--name N] [limits]  create one; prints its id\n"
          "  network SANDBOX [--allow D] [--deny D] [--log]  its network policy and attempts\n"
          "  exec [-it] ID -- CMD [ARGS...]   run a command in a daemon sandbox\n"
          "  changes ID                       list its uncommitted changes\n"
          "  diff ID [PATH...]                print them as a unified diff\n"
          "  commit ID [PATH...]              apply them to the workspace directory\n"
          "  discard ID [PATH...]             drop them\n"
          "  snapshot ID [--name N]           freeze its workspace into a snapshot\n"
          "  restore ID SNAPSHOT              return its workspace to a snapshot\n"
          "  fork ID|SNAPSHOT [--name N]      a new sandbox from a sandbox or a snapshot\n"
          "  snapshots [ID]                   list the snapshots (--delete SNAPSHOT)\n"
          "  store list|ls|cat|put|rm ...     the daemon's named stores (type=store mounts)\n"
          "  cp SRC DST                       copy a file in or out (ID:PATH)\n"
          "  start ID...                      start stopped sandboxes again, changes kept\n"
          "  logs [-f] JOB|SESSION            print a job's or a session's output\n"
          "  rm ID...                         destroy daemon sandboxes\n"
          "  shell [--keep] [SANDBOX]         an interactive shell in a daemon sandbox\n"
          "  attach SESSION                   join a running session (Ctrl-\\ Ctrl-\\ leaves)\n"
          "  sessions                         list the daemon's sessions\n"
          "  js SANDBOX [-e CODE]             run JavaScript/TypeScript in its JS session\n"
          "  gc [--state-dir DIR]             remove what no sandbox references\n"
          "  mcp [options]                    serve MCP, a sandbox per session (stdio, HTTPS)\n"
          "\n"
          "ID is a sandbox id or name; the daemon's client commands take --socket PATH and\n"
          "--json. 'conch run --help' lists the options of run; 'conch VERB --help' the others.\n"
          "\n"
          "A remote daemon ('conch serve --listen'): --remote wss://HOST:PORT (or $CONCH_URL)\n"
          "before or after the client command, the token in $CONCH_TOKEN or --token-file FILE,\n"
          "a private CA in $CONCH_CA. 'conch run' always runs on this machine.\n",
          f);
}

/* The verbs that never talk to a remote daemon. */
static bool is_local(const char *verb)
{
    static const char *const local[] = {"run", "serve", "doctor", "gc", "mcp", "__js-worker"};
    for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++)
        if (!strcmp(verb, local[i]))
            return true;
    return false;
}

/* `conch [--remote URL] [--token-file FILE] VERB ...`: the options before the verb. Returns
 * how many words they took, or -1 after printing why. There is no --token: a token on the
 * command line shows in /proc/PID/cmdline. */
static int global_options(int argc, char **argv)
{
    int i = 1;
    while (i < argc && !strncmp(argv[i], "--", 2) && argv[i][2]) {
        const char *a = argv[i] + 2, *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        bool url = len == 6 && !strncmp(a, "remote", 6);
        bool file = len == 10 && !strncmp(a, "token-file", 10);
        if (len == 5 && !strncmp(a, "token", 5)) {
            fprintf(stderr, "conch: no --token option: it would show in /proc/PID/cmdline; use "
                            "$CONCH_TOKEN or --token-file FILE\n");
            return -1;
        }
        if (!url && !file)
            break;
        const char *value = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
        if (!value) {
            fprintf(stderr, "conch: option '--%.*s' needs a value\n", (int)len, a);
            return -1;
        }
        struct conch_err err = {0};
        int r = url ? conch_cli_remote_set_url(value, &err)
                    : conch_cli_remote_set_token_file(value, &err);
        if (r < 0) {
            fprintf(stderr, "conch: %s\n", err.msg);
            return -1;
        }
        i++;
    }
    return i - 1;
}

int main(int argc, char **argv)
{
    /* A sandbox's warden is this binary exec'd anew: it never comes back from here. */
    conch_jail_warden_entry(argc, argv);
    conch_proctitle_init(argc, argv);
    if (argc < 2) {
        usage(stderr);
        return CONCH_EXIT_USAGE;
    }
    int shift = global_options(argc, argv);
    if (shift < 0)
        return CONCH_EXIT_USAGE;
    argc -= shift;
    argv += shift;
    if (argc < 2) {
        usage(stderr);
        return CONCH_EXIT_USAGE;
    }
    const char *verb = argv[1];
    if (conch_cli_remote_given() && is_local(verb)) {
        fprintf(stderr,
                "conch %s: runs on this machine: --remote and --token-file name a remote "
                "daemon for the client verbs (ps, create, exec, cp, logs, ...)\n",
                verb);
        return CONCH_EXIT_USAGE;
    }
    if (!strcmp(verb, "run"))
        return conch_cli_run(argc - 1, argv + 1);
    if (!strcmp(verb, "doctor"))
        return conch_cli_doctor(argc - 1, argv + 1);
    if (!strcmp(verb, "serve"))
        return conch_cli_serve(argc - 1, argv + 1);
    if (!strcmp(verb, "ps"))
        return conch_cli_ps(argc - 1, argv + 1);
    if (!strcmp(verb, "exec"))
        return conch_cli_exec(argc - 1, argv + 1);
    if (!strcmp(verb, "rm"))
        return conch_cli_rm(argc - 1, argv + 1);
    if (!strcmp(verb, "start"))
        return conch_cli_start(argc - 1, argv + 1);
    if (!strcmp(verb, "js"))
        return conch_cli_js(argc - 1, argv + 1);
    if (!strcmp(verb, "logs"))
        return conch_cli_logs(argc - 1, argv + 1);
    if (!strcmp(verb, "shell"))
        return conch_cli_shell(argc - 1, argv + 1);
    if (!strcmp(verb, "attach"))
        return conch_cli_attach(argc - 1, argv + 1);
    if (!strcmp(verb, "sessions"))
        return conch_cli_sessions(argc - 1, argv + 1);
    static const struct {
        const char *name;
        int (*fn)(int, char **);
    } verbs[] = {{"create", conch_cli_create},     {"changes", conch_cli_changes},
                 {"diff", conch_cli_diff},         {"commit", conch_cli_commit},
                 {"discard", conch_cli_discard},   {"cp", conch_cli_cp},
                 {"snapshot", conch_cli_snapshot}, {"restore", conch_cli_restore},
                 {"fork", conch_cli_fork},         {"snapshots", conch_cli_snapshots},
                 {"network", conch_cli_network},   {"store", conch_cli_store}};
    for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
        if (!strcmp(verb, verbs[i].name))
            return verbs[i].fn(argc - 1, argv + 1);
    if (!strcmp(verb, "gc"))
        return conch_cli_gc(argc - 1, argv + 1);
    if (!strcmp(verb, "mcp"))
        return conch_cli_mcp(argc - 1, argv + 1);
    if (!strcmp(verb, "__js-worker"))
        return conch_cli_js_worker(argc - 1, argv + 1);
    if (!strcmp(verb, "-h") || !strcmp(verb, "--help") || !strcmp(verb, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(verb, "--version")) {
        puts("conch 0.1.0");
        return 0;
    }
    fprintf(stderr, "conch: unknown command '%s'\n", verb);
    usage(stderr);
    return CONCH_EXIT_USAGE;
}
