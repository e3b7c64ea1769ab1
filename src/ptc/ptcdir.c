/* ptcdir.c - finding the host directory of the in-sandbox tool-bridge clients. */
#include "ptc/ptc.h"

#include <errno.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *usable(const char *dir)
{
    char probe[PATH_MAX];
    if ((size_t)snprintf(probe, sizeof(probe), "%s/bin/tool_call", dir) >= sizeof(probe))
        return NULL;
    return access(probe, X_OK) == 0 ? strdup(dir) : NULL;
}

int conch_ptc_find_dir(char **ret_dir, struct conch_err *err)
{
    char *d = NULL;
    const char *env = getenv("CONCH_PTC_DIR");
    if (env && *env) {
        if ((d = usable(env))) {
            *ret_dir = d;
            return 0;
        }
        return conch_err_set(err, ENOENT,
                             "CONCH_PTC_DIR='%s' does not hold bin/tool_call (build conch, or "
                             "unset it)",
                             env);
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 8);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            strcpy(slash + 1, "ptc");
            if ((d = usable(exe))) {
                *ret_dir = d;
                return 0;
            }
        }
    }
    if ((d = usable(CONCH_PTC_INSTALL_DIR))) {
        *ret_dir = d;
        return 0;
    }
    return conch_err_set(err, ENOENT,
                         "the tool-bridge clients (bin/tool_call) are in neither '%s' (next to "
                         "conch) nor '%s': run 'ninja' or 'meson install', or set CONCH_PTC_DIR",
                         n > 0 ? exe : "ptc", CONCH_PTC_INSTALL_DIR);
}
