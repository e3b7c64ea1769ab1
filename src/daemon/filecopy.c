/* filecopy.c - fs.copy_in and fs.copy_out: whole files between the host and a sandbox at the
 * disk's speed. The daemon opens the host file the client names (as the client's own uid: it
 * serves only peers of its uid, or root) and lends that fd to a file worker forked for the one
 * request, fenced as every file worker is, which copies it in the kernel beneath the
 * workspace (src/fs/fs-copy.c). No byte of content passes through JSON or the daemon's loop. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "daemon/daemon-internal.h"

/* Transfers in flight per sandbox; past this a new one is refused (busy). Each holds a forked
 * worker and a host fd. */
#define COPIES_MAX 4

static unsigned copies_running(struct sandbox *sb)
{
    unsigned n = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->files)
    {
        if (conch_list_entry(pos, struct file_req, link)->copy)
            n++;
    }
    return n;
}

/* The disk room the running copy_ins of @sb hold (their host files' sizes). */
static uint64_t copies_reserved(struct sandbox *sb)
{
    uint64_t n = 0;
    struct conch_list *pos, *tmp;
    conch_list_for_each_safe(pos, tmp, &sb->files)
    {
        n += conch_list_entry(pos, struct file_req, link)->reserve;
    }
    return n;
}

/* A copy_in of @size bytes must fit the room the sandbox has left: what its last measurement
 * charged and the copies running now hold, not only the disk limit (the worker's
 * RLIMIT_FSIZE): else each of 4 copies at once, or one into a nearly full sandbox, could
 * write up to the whole limit. Returns the room to hold (the file and its inode's charge), or
 * 0 with @call failed (too_large); *@ret_max: the most the copy may write (the room left: the
 * file may grow meanwhile). */
static uint64_t copy_in_room(struct sandbox *sb, struct conch_rpc_call *call, const char *path,
                             int fd, uint64_t *ret_max)
{
    struct stat st;
    if (fstat(fd, &st) < 0) {
        conch_rpc_call_fail_param(call, "host_path", "host file '%s': %s", path, strerror(errno));
        return 0;
    }
    uint64_t need = (uint64_t)st.st_size + 4096; /* the inode, as the measurement charges it */
    uint64_t used = sb->disk_charged + copies_reserved(sb);
    if (used <= sb->disk_bytes && need <= sb->disk_bytes - used) {
        *ret_max = sb->disk_bytes - used - 4096;
        return need;
    }
    conch_rpc_call_failf(call, CONCH_RPC_TOO_LARGE, "too_large", NULL,
                         "host file '%s' (%lld bytes) does not fit the room sandbox '%s' has "
                         "left of its disk limit (%llu bytes, of which %llu are used or held by "
                         "copies running now): free room with fs.delete or workspace.discard, "
                         "or create the sandbox with a larger disk",
                         path, (long long)st.st_size, sb->id, (unsigned long long)sb->disk_bytes,
                         (unsigned long long)used);
    return 0;
}

/* Open the client's host file: a regular file, the very one it named (host_id "dev:ino" as
 * its own stat saw it: a daemon on another machine, reached through `conch serve --stdio`
 * over ssh, sees other files under the same names). Returns the fd, or -1 with @call failed. */
static int open_host(struct client *c, struct conch_rpc_call *call, const char *path,
                     const char *id, bool in)
{
    /* The daemon opens what the peer names: only for a peer that could open it itself. A
     * root daemon serves root only; an unprivileged one its own uid (and root, who may
     * anything). The accept check says the same; this keeps it true if that ever widens. */
    if (c->peer_uid != geteuid() && c->peer_uid != 0) {
        conch_rpc_call_fail_param(call, "host_path",
                                  "host files are opened only for a client of the daemon's uid "
                                  "(%u); yours is %u: use fs.write and fs.read",
                                  (unsigned)geteuid(), (unsigned)c->peer_uid);
        return -1;
    }
    if (path[0] != '/') {
        conch_rpc_call_fail_param(call, "host_path", "param 'host_path' must be absolute");
        return -1;
    }
    /* Looked at before it is opened: O_PATH opens nothing (a device's open can act: arm a
     * watchdog, wake a FIFO's writer), and the path may be a link a sandbox planted in a rw
     * workspace. Only the regular file the client named is then opened, through that very
     * inode (its /proc/self/fd link: no second lookup of the path). No O_CREAT: the client
     * made the file, and its host_id says so. */
    _cleanup_close_ int pfd = open(path, O_PATH | O_CLOEXEC);
    struct stat st;
    char seen[64];
    if (pfd < 0 || fstat(pfd, &st) < 0) {
        conch_rpc_call_fail_param(call, "host_path", "open host file '%s' for %s: %s", path,
                                  in ? "reading" : "writing", strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        conch_rpc_call_fail_param(call, "host_path", "host file '%s' is not a regular file", path);
        return -1;
    }
    snprintf(seen, sizeof(seen), "%ju:%ju", (uintmax_t)st.st_dev, (uintmax_t)st.st_ino);
    if (strcmp(seen, id) != 0) {
        conch_rpc_call_fail_param(call, "host_id",
                                  "host file '%s' is not the one the client named (id %s, "
                                  "here %s): the daemon sees another filesystem; use fs.write "
                                  "and fs.read",
                                  path, id, seen);
        return -1;
    }
    char self[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", pfd);
    int fd = open(self, (in ? O_RDONLY : O_WRONLY) | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        conch_rpc_call_fail_param(call, "host_path", "open host file '%s' for %s: %s", path,
                                  in ? "reading" : "writing", strerror(errno));
        return -1;
    }
    return fd;
}

void conch_daemon_handle_fs_copy(struct conch_rpc_call *call, json_t *params, void *ctx, bool in)
{
    struct client *c = ctx;
    struct sandbox *sb =
        conch_daemon_sandbox_find_running(c->d, call, conch_rpc_str(params, "sandbox", NULL));
    if (!sb)
        return;
    conch_daemon_sandbox_touch(sb);
    if (in && conch_daemon_sandbox_disk_refuse(sb, call))
        return;
    if (copies_running(sb) >= COPIES_MAX) {
        conch_rpc_call_failf(call, CONCH_RPC_BUSY, "busy", NULL,
                             "%d file transfers are running in this sandbox: retry when one ends",
                             COPIES_MAX);
        return;
    }
    size_t plen;
    const char *host = conch_rpc_strn(params, "host_path", &plen);
    if (!host || plen != strlen(host) || plen == 0) {
        conch_rpc_call_fail_param(call, "host_path", "param 'host_path' must be a path");
        return;
    }
    _cleanup_close_ int fd = open_host(c, call, host, conch_rpc_str(params, "host_id", ""), in);
    if (fd < 0)
        return;
    uint64_t max = 0, reserve = in ? copy_in_room(sb, call, host, fd, &max) : 0;
    if (in && reserve == 0)
        return;
    /* The path as sent (NULs and all): the worker's path rules judge it. */
    json_t *req = json_pack("{s:s,s:{s:O}}", "method", in ? "copy_in" : "copy_out", "params",
                            "path", json_object_get(params, "path"));
    /* The host file may grow while it is copied: the worker writes no more than the room. */
    if (req && in &&
        json_object_set_new(json_object_get(req, "params"), "max",
                            json_integer(max > (uint64_t)LLONG_MAX ? LLONG_MAX : (json_int_t)max)) <
            0) {
        json_decref(req);
        req = NULL;
    }
    char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    if (!text) {
        conch_rpc_call_failf(call, CONCH_RPC_INTERNAL_ERROR, "internal_error", NULL,
                             "out of memory");
        return;
    }
    /* Forked, never a persistent worker: the fd is lent for this one request and goes with
     * the process that held it. */
    conch_daemon_file_fork(c, sb, call, text, in, false, fd, reserve);
}
