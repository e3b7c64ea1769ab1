/* main.c - the `conch` binary: dispatch to one subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void usage(FILE *f)
{
    fputs("usage: conch <command> [options]\n"
          "\n"
          "commands:\n"
          "  run [options] -- CMD [ARGS...]   run one command in a fresh sandbox\n"
          "  doctor                           show which kernel fences this machine allows\n"
          "\n"
          "'conch run --help' lists the options of run.\n",
          f);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CONCH_EXIT_USAGE;
    }
    const char *verb = argv[1];
    if (!strcmp(verb, "run"))
        return conch_cli_run(argc - 1, argv + 1);
    if (!strcmp(verb, "doctor"))
        return conch_cli_doctor(argc - 1, argv + 1);
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
