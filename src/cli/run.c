/* run.c - `conch run`: placeholder. */
#include "cli/cli.h"

int conch_cli_run(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 0;
}
