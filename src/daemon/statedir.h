/* statedir.h - the daemon's state directory: owned by the daemon's uid and private (0700),
 * with every path beneath it opened without following a symbolic link, so that nothing
 * planted there (an `upper` swapped for a link) redirects what the daemon reads or empties. */
#ifndef CONCH_DAEMON_STATEDIR_H
#define CONCH_DAEMON_STATEDIR_H

#include "core/error.h"

/*
 * conch_statedir_prepare - create @dir (and missing parents) and its sandboxes/ and spill/
 * subdirectories, each mode 0700. Existing ones are made 0700 (older versions left 0711);
 * a state dir, sandboxes/ or spill/ that is not a directory owned by the caller (or is a
 * symlink, for the subdirectories) is refused. Returns 0 or -errno with @err.
 */
int conch_statedir_prepare(const char *dir, struct conch_err *err);

/*
 * conch_statedir_open - open @rel (relative, e.g. "sandboxes/<id>/upper") beneath the state
 * dir @dir with @flags (O_CLOEXEC is added), refusing every symlink on the way and any
 * escape from @dir (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS). Returns a new fd, or
 * -errno with @err (ELOOP or EXDEV: something under the state dir was replaced by a link).
 */
int conch_statedir_open(const char *dir, const char *rel, int flags, struct conch_err *err);

#endif
