/* ptc.h - where the in-sandbox tool-bridge clients live on the host (the tree the jail
 * bind-mounts read-only at /run/conch: bin/tool_call, bin/spawn_agent, python/conch_tools.py,
 * node/conch-tools/). The clients themselves are tool_call.c and ptc/ at the top level. */
#ifndef CONCH_PTC_PTC_H
#define CONCH_PTC_PTC_H

#include "core/error.h"
#include "ptc/ptc-config.h" /* generated: CONCH_PTC_INSTALL_DIR */

/*
 * conch_ptc_find_dir - the directory holding the client tree. Looks, in order, at
 * $CONCH_PTC_DIR, then at "ptc" next to the running conch binary (the build tree:
 * build/conch and build/ptc), then at CONCH_PTC_INSTALL_DIR (<libexecdir>/conch/ptc); a
 * candidate counts when it holds bin/tool_call. Returns 0 and a new string in *@ret_dir
 * (caller frees), or -ENOENT with @err naming the places it looked.
 */
int conch_ptc_find_dir(char **ret_dir, struct conch_err *err);

#endif
