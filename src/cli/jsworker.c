/* jsworker.c - `conch __js-worker [--fd N]`: the JS worker process (src/js) serving one
 * engine session on the stream socket N (default 0: its standard input) until EOF. Hidden:
 * the daemon will start it inside a sandbox as a process of the supervisor; tests and
 * benchmarks start it on a socketpair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "js/js.h"

int conch_cli_js_worker(int argc, char **argv)
{
    int fd = 0;
    if (argc == 3 && strcmp(argv[1], "--fd") == 0) {
        char *end;
        long v = strtol(argv[2], &end, 10);
        if (*argv[2] == '\0' || *end || v < 0 || v > 1 << 20) {
            fprintf(stderr, "conch __js-worker: --fd needs a descriptor number, not '%s'\n",
                    argv[2]);
            return CONCH_EXIT_USAGE;
        }
        fd = (int)v;
    } else if (argc != 1) {
        fputs("usage: conch __js-worker [--fd N]   (N: a connected stream socket; default 0)\n",
              stderr);
        return CONCH_EXIT_USAGE;
    }
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
        fprintf(stderr,
                "conch __js-worker: descriptor %d is not a socket: the worker speaks "
                "length-prefixed JSON frames on a stream socket\n",
                fd);
        return CONCH_EXIT_USAGE;
    }
    return conch_js_worker_serve(fd, NULL);
}
