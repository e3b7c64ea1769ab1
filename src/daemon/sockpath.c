/* sockpath.c - whether the daemon's socket and its directory can be trusted: the default
 * /tmp/conch-<uid>/ may have been made by another user, who could then swap the socket and
 * answer clients as if it were the daemon. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"

/* Only the caller and root may own what the caller trusts. */
static bool trusted_owner(uid_t uid)
{
    return uid == geteuid() || uid == 0;
}

static int check_dir(const char *dir, const char *sock, struct conch_err *err)
{
    struct stat lst, st;
    if (lstat(dir, &lst) < 0 || stat(dir, &st) < 0) {
        if (errno == ENOENT)
            return conch_err_set(err, ENOENT,
                                 "cannot reach the daemon at '%s': %s (start it with 'conch "
                                 "serve')",
                                 sock, strerror(errno));
        return conch_err_set(err, errno, "socket directory '%s': %s", dir, strerror(errno));
    }
    /* A link someone else owns may be pointed elsewhere after we checked its target. */
    if (S_ISLNK(lst.st_mode) && !trusted_owner(lst.st_uid))
        return conch_err_set(err, EPERM,
                             "socket directory '%s' is a symbolic link owned by uid %u: another "
                             "user may have made it to intercept conch; remove it (or set "
                             "XDG_RUNTIME_DIR, or pass --socket) and retry",
                             dir, (unsigned)lst.st_uid);
    if (!S_ISDIR(st.st_mode))
        return conch_err_set(err, ENOTDIR, "socket directory '%s' is not a directory", dir);
    if (!trusted_owner(st.st_uid))
        return conch_err_set(err, EPERM,
                             "socket directory '%s' is owned by uid %u, not by you (uid %u): "
                             "another user may have made it to intercept conch; remove it (or "
                             "set XDG_RUNTIME_DIR, or pass --socket) and retry",
                             dir, (unsigned)st.st_uid, (unsigned)geteuid());
    /* A directory others may write to lets them replace the socket, unless it is sticky
     * (like /tmp): then only the socket's owner may, and the socket itself is checked. */
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
        return conch_err_set(err, EPERM,
                             "socket directory '%s' has mode %04o: other users may replace '%s' "
                             "in it; run 'chmod 700 %s' (or remove it) and retry",
                             dir, (unsigned)(st.st_mode & 07777), sock, dir);
    return 0;
}

int conch_daemon_socket_check(const char *path, bool connecting, struct conch_err *err)
{
    char dir[4096];
    if (strlen(path) >= sizeof(dir))
        return conch_err_set(err, ENAMETOOLONG, "socket path too long: '%s'", path);
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    int r = check_dir(dir, path, err);
    if (r < 0 || !connecting)
        return r;
    struct stat st;
    if (lstat(path, &st) < 0)
        return conch_err_set(err, errno,
                             "cannot reach the daemon at '%s': %s (start it with "
                             "'conch serve')",
                             path, strerror(errno));
    if (!S_ISSOCK(st.st_mode) || !trusted_owner(st.st_uid))
        return conch_err_set(err, EPERM,
                             "'%s' is %s owned by uid %u, not a socket of yours (uid %u) or "
                             "root's: another user may have planted it to impersonate the "
                             "daemon; remove it and restart 'conch serve'",
                             path, S_ISSOCK(st.st_mode) ? "a socket" : "not a socket",
                             (unsigned)st.st_uid, (unsigned)geteuid());
    return 0;
}
