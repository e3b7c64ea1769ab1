/* statedir.c - the daemon's private state directory, and opening paths beneath it without
 * following links (see statedir.h). */
#include "daemon/statedir.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"

/* Makes the directory @fd (@what in messages) ours and 0700, or refuses it. */
static int make_private(int fd, const char *what, struct conch_err *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return conch_err_set(err, errno, "stat '%s': %s", what, strerror(errno));
    if (st.st_uid != geteuid())
        return conch_err_set(err, EPERM,
                             "state directory '%s' is owned by uid %u, not by this daemon's uid "
                             "%u: refusing to keep sandboxes there (use --state-dir, or give it "
                             "to uid %u)",
                             what, (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid());
    /* 0700: no other user, and no sandbox's host ids, may look inside. The sandboxes reach
     * their own upper dirs only through the bind mounts staged for them. */
    if ((st.st_mode & 07777) != 0700 && fchmod(fd, 0700) < 0)
        return conch_err_set(err, errno, "chmod 0700 '%s': %s", what, strerror(errno));
    return 0;
}

int conch_statedir_prepare(const char *dir, struct conch_err *err)
{
    int r;
    if ((r = conch_mkdir_p(dir, 0700, err)) < 0)
        return conch_err_wrap(err, "state directory");
    _cleanup_close_ int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "open state directory '%s': %s", dir, strerror(errno));
    if ((r = make_private(fd, dir, err)) < 0)
        return r;
    static const char *const subdirs[] = {"sandboxes", "spill"};
    for (size_t i = 0; i < sizeof(subdirs) / sizeof(subdirs[0]); i++) {
        char what[4096];
        snprintf(what, sizeof(what), "%s/%s", dir, subdirs[i]);
        if (mkdirat(fd, subdirs[i], 0700) < 0 && errno != EEXIST)
            return conch_err_set(err, errno, "mkdir '%s': %s", what, strerror(errno));
        _cleanup_close_ int sub =
            openat(fd, subdirs[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0)
            return conch_err_set(err, errno, "open '%s': %s (it must be a directory, not a link)",
                                 what, strerror(errno));
        if ((r = make_private(sub, what, err)) < 0)
            return r;
    }
    return 0;
}

int conch_statedir_open(const char *dir, const char *rel, int flags, struct conch_err *err)
{
    _cleanup_close_ int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return conch_err_set(err, errno, "open state directory '%s': %s", dir, strerror(errno));
    int fd = conch_open_beneath(dfd, rel, flags | O_NOFOLLOW, 0, 0);
    if (fd < 0) {
        int e = -fd;
        struct stat st;
        /* O_DIRECTORY|O_NOFOLLOW on a link says ENOTDIR: name the link for what it is. */
        if (e == ENOTDIR && fstatat(dfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
            e = ELOOP;
        const char *why = e == ELOOP || e == EXDEV
                              ? " (a symbolic link where conch keeps its own files: refusing to "
                                "follow it)"
                              : "";
        return conch_err_set(err, e, "open '%s/%s': %s%s", dir, rel, strerror(e), why);
    }
    return fd;
}
