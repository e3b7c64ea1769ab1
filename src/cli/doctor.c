/* doctor.c - `conch doctor`: placeholder until probes land. */
#include "cli/cli.h"

int conch_cli_doctor(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 0;
}
