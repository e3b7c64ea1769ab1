/* ws-open.c - the directories a workspace request reads and writes, opened safely on the
 * loop before a worker gets them: the overlay's upper dir beneath the state dir (never through
 * a link) and the host dir, which must still be the one the sandbox was made on; the
 * workspace's, or an overlay mount's (<state>/sandboxes/<id>/m<i>/upper over its source). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon-internal.h"
#include "daemon/statedir.h"

int conch_daemon_overlay_mount_find(const struct sandbox *sb, const char *target)
{
    for (unsigned i = 0; i < sb->n_mounts && i < CONCH_SPEC_MOUNTS_MAX; i++)
        if (sb->mounts[i].type == CONCH_MOUNT_OVERLAY && !strcmp(sb->mounts[i].target, target))
            return (int)i;
    return -1;
}

void conch_daemon_ws_close(struct ws_fds *fds)
{
    if (fds->upper >= 0)
        close(fds->upper);
    if (fds->lower >= 0)
        close(fds->lower);
    fds->upper = fds->lower = -1;
}

/* Open a sandbox's upper and host dirs. A sandbox without an overlay workspace, or whose
 * upper dir was never created, has no changes: upper is then -1. Returns 0 or -errno. */
int conch_daemon_ws_open(struct sandbox *sb, struct ws_fds *fds, struct conch_err *err)
{
    fds->upper = fds->lower = -1;
    if (!sb->upper_dir[0])
        return 0;
    /* Beneath the state dir, never through a link: a swapped `upper` must make discard fail,
     * not empty whatever the link points to. */
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s/upper", sb->id);
    struct conch_err oerr = {0};
    fds->upper = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, &oerr);
    if (fds->upper < 0 && oerr.code == ENOENT && !sb->layer[0])
        return 0; /* nothing was ever written */
    if (fds->upper < 0 && oerr.code != ENOENT) {
        *err = oerr;
        return conch_err_wrap(err, "open the workspace of sandbox '%s'", sb->id);
    }
    fds->lower = open(sb->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds->lower < 0) {
        int e = errno;
        conch_daemon_ws_close(fds);
        if (e == ENOENT)
            return 0;
        return conch_err_set(err, e, "open the workspace of sandbox '%s': %s", sb->id, strerror(e));
    }
    /* The path is only a name: the directory must be the one the sandbox was made on. A
     * workspace renamed away and replaced by a symlink to /etc must not receive a commit
     * (the daemon may be root), nor be emptied by a discard. */
    struct stat st;
    if (sb->ws_ino &&
        (fstat(fds->lower, &st) < 0 || st.st_dev != sb->ws_dev || st.st_ino != sb->ws_ino)) {
        conch_daemon_ws_close(fds);
        return conch_err_set(err, ESTALE,
                             "workspace '%s' of sandbox '%s' is no longer the directory it was "
                             "made on (it was replaced, or swapped for a link): refusing it",
                             sb->workspace, sb->id);
    }
    return 0;
}

/* Open an overlay mount's upper dir (<state>/sandboxes/<id>/m<i>/upper, never through a link)
 * and its host dir, which must still be the one it was made on (a dir swapped for a link to
 * /etc must not receive a commit). No upper yet: no changes (upper -1). Returns 0 or -errno. */
int conch_daemon_mount_open(struct sandbox *sb, int i, struct ws_fds *fds, struct conch_err *err)
{
    const struct conch_mount *m = &sb->mounts[i];
    fds->upper = fds->lower = -1;
    char rel[128];
    snprintf(rel, sizeof(rel), "sandboxes/%s/m%d/upper", sb->id, i);
    struct conch_err oerr = {0};
    fds->upper = conch_statedir_open(sb->d->state_dir, rel, O_RDONLY | O_DIRECTORY, &oerr);
    if (fds->upper < 0 && oerr.code == ENOENT)
        return 0;
    if (fds->upper < 0) {
        *err = oerr;
        return conch_err_wrap(err, "open the upper of mount '%s' of sandbox '%s'", m->target,
                              sb->id);
    }
    fds->lower = open(m->source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat st;
    if (fds->lower < 0 || fstat(fds->lower, &st) < 0 || !sb->mount_ino[i] ||
        st.st_dev != sb->mount_dev[i] || st.st_ino != sb->mount_ino[i]) {
        int e = fds->lower < 0 ? errno : ESTALE;
        conch_daemon_ws_close(fds);
        return conch_err_set(err, e,
                             "mount '%s' of sandbox '%s': its source '%s' is no longer the "
                             "directory it was made on (%s): refusing it",
                             m->target, sb->id, m->source, strerror(e));
    }
    return 0;
}
