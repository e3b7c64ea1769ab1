/* sockets.c - host unix sockets passed into a sandbox (parent side): each is opened again as it
 * will be bound (a socket of the caller's, no link: conch_socket_open) and the warden is told
 * which file to bind and which identity to find there; as host root, a clone of exactly that
 * file is idmapped and staged, since the sandbox's ids could not reach it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "jail/jail-internal.h"

static bool beneath(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '\0' || path[n] == '/');
}

/* Host root: clone the mount of the file @fd is (its owner shown as the command's user, as a
 * bind's source is) and attach it on a file of the staging dir; *@ret_src: its path. */
static int stage_socket(struct conch_jail *j, unsigned i, int fd, const struct stat *st,
                        char *ret_src, size_t src_size, struct conch_err *err)
{
    char via[64], file[320];
    snprintf(via, sizeof(via), "/proc/self/fd/%d", fd);
    /* open_tree follows the fd's link to the very file opened (no path walk again). */
    _cleanup_close_ int tree =
        conch_jail_idmapped_tree(via, j->host_id_base, false, st->st_uid, st->st_gid, true, err);
    if (tree < 0)
        return tree;
    snprintf(file, sizeof(file), CONCH_JAIL_STAGE_ROOT "/%s-s%u", j->name, i);
    _cleanup_close_ int f = open(file, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (f < 0)
        return conch_err_set(err, errno, "create '%s': %s", file, strerror(errno));
    int r = conch_jail_stage_attach(tree, file, err);
    if (r < 0) {
        unlink(file);
        return r;
    }
    j->n_socket_stages = (int)i + 1;
    snprintf(ret_src, src_size, "/oldroot%s", file);
    return 0;
}

int conch_jail_sockets_plan(struct conch_jail *j, const struct conch_jail_spec *spec,
                            struct jail_plan *plan, struct conch_err *err)
{
    if (spec->n_sockets > CONCH_SPEC_SOCKETS_MAX)
        return conch_err_set(err, E2BIG, "at most %d sockets", CONCH_SPEC_SOCKETS_MAX);
    int r;
    if (spec->n_sockets > 0 && j->root_mode && (r = conch_jail_stage_prepare(err)) < 0)
        return r;
    for (unsigned i = 0; i < spec->n_sockets; i++) {
        const struct conch_socket *s = &spec->sockets[i];
        struct jail_socket *ps = &plan->sockets[i];
        if ((r = conch_socket_check(s, err)) < 0)
            return r;
        char real[PATH_MAX];
        struct stat st;
        _cleanup_close_ int fd = conch_socket_open(s->host, &st, real, sizeof(real), err);
        if (fd < 0)
            return fd;
        /* What we stage is ours: another sandbox's staged socket is not the caller's to name. */
        if (beneath(real, CONCH_JAIL_STAGE_ROOT))
            return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                                  "socket '%s' is in conch's staging dir: refused", s->host);
        ps->dev = st.st_dev;
        ps->ino = st.st_ino;
        snprintf(ps->dst, sizeof(ps->dst), "%s", s->path);
        if (j->root_mode)
            r = stage_socket(j, i, fd, &st, ps->src, sizeof(ps->src), err);
        else if (strlen(real) + 9 >= sizeof(ps->src))
            r = conch_err_setk(err, CONCH_ERR_USAGE, ENAMETOOLONG, "socket '%s': path too long",
                               s->host);
        else
            snprintf(ps->src, sizeof(ps->src), "/oldroot%s", real);
        if (r < 0)
            return conch_err_wrap(err, "socket '%s'", s->host);
    }
    plan->n_sockets = (int)spec->n_sockets;
    return 0;
}
