/* jail-ops.c - the parent side of a running sandbox: what is sent to its warden (a command, a
 * signal, a file request, a recycle, a workspace to attach, a borrower's channel) and what it
 * sends back (the events of the commands); adopting a lent sandbox; its usage. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "jail/jail-internal.h"

/* Pack argv, envp and cwd into a sealed memfd for the warden. */
static int pack_command(const struct conch_jail_cmd *cmd, struct conch_err *err)
{
    struct jail_cmd_blob hdr = {0};
    size_t size = sizeof(hdr);
    for (char *const *a = cmd->argv; *a; a++, hdr.argc++)
        size += strlen(*a) + 1;
    for (char *const *e = cmd->envp; e && *e; e++, hdr.envc++)
        size += strlen(*e) + 1;
    const char *cwd = cmd->cwd ? cmd->cwd : "/";
    size += strlen(cwd) + 1;
    if (hdr.argc == 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "no command given");
    if (size > (64U << 20))
        return conch_err_setk(err, CONCH_ERR_USAGE, E2BIG,
                              "command line and environment too large (%zu bytes)", size);
    hdr.size = (uint32_t)size;
    if (cmd->caller_attrs) {
        hdr.flags |= JBLOB_CALLER;
        mode_t mask = umask(0);
        umask(mask);
        hdr.umask = mask;
        errno = 0;
        int nice = getpriority(PRIO_PROCESS, 0);
        hdr.nice = errno ? 0 : nice;
        for (int res = 0; res < JAIL_RLIMITS; res++) {
            struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
            getrlimit(res, &rl);
            hdr.rlim[res].cur = rl.rlim_cur;
            hdr.rlim[res].max = rl.rlim_max;
        }
        if (cmd->max_file) {
            if (hdr.rlim[RLIMIT_FSIZE].cur > cmd->max_file)
                hdr.rlim[RLIMIT_FSIZE].cur = cmd->max_file;
            if (hdr.rlim[RLIMIT_FSIZE].max > cmd->max_file)
                hdr.rlim[RLIMIT_FSIZE].max = cmd->max_file;
        }
    }
    _cleanup_close_ int fd = memfd_create("conch-cmd", MFD_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "memfd_create: %s", strerror(errno));
    _cleanup_free_ char *buf = malloc(size);
    if (!buf)
        return conch_err_set(err, ENOMEM, "out of memory");
    char *p = buf;
    memcpy(p, &hdr, sizeof(hdr));
    p += sizeof(hdr);
    for (char *const *a = cmd->argv; *a; a++)
        p = stpcpy(p, *a) + 1;
    for (char *const *e = cmd->envp; e && *e; e++)
        p = stpcpy(p, *e) + 1;
    p = stpcpy(p, cwd) + 1;
    if (conch_write_all(fd, buf, size) < 0)
        return conch_err_set(err, errno, "write command: %s", strerror(errno));
    return TAKE_FD(fd);
}

/* A send to the warden failed (conch_jail_ctl_send's -errno @r): say what, and why. */
static int send_failed(struct conch_err *err, int r, const char *what)
{
    if (r == -ENOBUFS)
        return conch_err_setk(err, CONCH_ERR_LIMIT, ENOBUFS,
                              "%s: too many requests at once (%d already wait for the warden)",
                              what, JAIL_OUTQ_MAX);
    return conch_err_set(err, -r, "%s: %s", what, strerror(-r));
}

int conch_jail_send_run(struct conch_jail *j, int64_t id, const struct conch_jail_cmd *cmd,
                        uint64_t timeout_ms, uint64_t grace_ms, struct conch_err *err)
{
    _cleanup_close_ int blob = pack_command(cmd, err);
    if (blob < 0)
        return blob;
    int fds[4] = {cmd->stdin_fd, cmd->stdout_fd, cmd->stderr_fd, blob};
    struct jail_msg m = {
        .type = JMSG_RUN, .id = id, .timeout_ms = timeout_ms, .grace_ms = grace_ms};
    if (cmd->pty)
        m.b |= JRUN_PTY;
    if (cmd->last)
        m.b |= JRUN_LAST;
    int r = conch_jail_ctl_send(j, &m, fds, 4);
    return r < 0 ? send_failed(err, r, "send command to the warden") : 0;
}

bool conch_jail_event_from_msg(const struct jail_msg *m, int *fds, int nfds,
                               struct conch_jail_event *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->id = m->id;
    ret->answer_fd = ret->answer_net_fd = -1;
    int used = 0;
    switch (m->type) {
    case JMSG_STARTED:
        ret->type = CONCH_JAIL_STARTED;
        ret->pid = m->a;
        ret->pidns_ino = m->ns;
        break;
    case JMSG_RUN_ERR:
        ret->type = CONCH_JAIL_START_FAILED;
        ret->err = m->err;
        break;
    case JMSG_EXITED:
        ret->type = CONCH_JAIL_EXITED;
        ret->status = m->a;
        ret->usage = m->usage;
        ret->timed_out = m->b & JEXIT_TIMED_OUT;
        ret->lost = m->b & JEXIT_LOST;
        break;
    case JMSG_SETUP_OK:
    case JMSG_SETUP_ERR:
        ret->type = CONCH_JAIL_ANSWER;
        ret->answer_ok = m->type == JMSG_SETUP_OK;
        ret->answer_nr = ret->answer_ok ? m->a : -1;
        if (!ret->answer_ok)
            ret->err = m->err;
        if (m->type == JMSG_SETUP_OK && (m->b & JSETUP_PTC) && used < nfds)
            ret->answer_fd = fds[used++];
        if (m->type == JMSG_SETUP_OK && (m->b & JSETUP_NET) && used < nfds)
            ret->answer_net_fd = fds[used++];
        if (!(m->b & (JSETUP_PTC | JSETUP_NET)) && used < nfds)
            ret->answer_fd = fds[used++]; /* an answer's one fd */
        break;
    default:
        return false; /* nothing else is addressed to the parent */
    }
    for (int i = used; i < nfds; i++)
        close(fds[i]); /* an event carries none */
    return true;
}

int conch_jail_read_event(struct conch_jail *j, struct conch_jail_event *ret, struct conch_err *err)
{
    struct jail_msg m;
    for (;;) {
        int fds[JAIL_MSG_MAX_FDS], nfds = 0;
        int r = conch_jail_recv(j->ctl_fd, &m, fds, JAIL_MSG_MAX_FDS, &nfds, MSG_DONTWAIT);
        if (r == 0)
            return 0;
        if (r == -EAGAIN)
            return -EAGAIN;
        if (r < 0)
            return conch_err_set(err, -r, "read from the warden: %s", strerror(-r));
        if (conch_jail_event_from_msg(&m, fds, nfds, ret))
            return 1;
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    }
}

int conch_jail_send_signal(struct conch_jail *j, int64_t id, int sig, struct conch_err *err)
{
    struct jail_msg m = {.type = JMSG_SIGNAL, .a = sig, .id = id};
    int r = conch_jail_ctl_send(j, &m, NULL, 0);
    return r < 0 ? send_failed(err, r, "signal the warden") : 0;
}

int conch_jail_send_recycle(struct conch_jail *j, struct conch_err *err)
{
    struct jail_msg m = {.type = JMSG_RECYCLE};
    int r = conch_jail_ctl_send(j, &m, NULL, 0);
    if (r < 0)
        return send_failed(err, r, "ask the warden to recycle");
    /* An attached workspace goes with the recycle. */
    if (j->host_ws_fd >= 0)
        close(j->host_ws_fd);
    j->host_ws_fd = j->upper_fd_nr = -1;
    return 0;
}

int conch_jail_send_file(struct conch_jail *j, int64_t id, int req_fd, int resp_fd,
                         uint64_t timeout_ms, struct conch_err *err)
{
    return conch_jail_send_file_data(j, id, req_fd, resp_fd, -1, timeout_ms, err);
}

int conch_jail_send_file_data(struct conch_jail *j, int64_t id, int req_fd, int resp_fd,
                              int data_fd, uint64_t timeout_ms, struct conch_err *err)
{
    int fds[3] = {req_fd, resp_fd, data_fd};
    struct jail_msg m = {.type = JMSG_FILE, .id = id, .timeout_ms = timeout_ms};
    int r = conch_jail_ctl_send(j, &m, fds, data_fd >= 0 ? 3 : 2);
    return r < 0 ? send_failed(err, r, "send file request to the warden") : 0;
}

int conch_jail_send_file_server(struct conch_jail *j, int64_t id, int sock, struct conch_err *err)
{
    struct jail_msg m = {.type = JMSG_FILE_SERVE, .id = id};
    int r = conch_jail_ctl_send(j, &m, &sock, 1);
    return r < 0 ? send_failed(err, r, "start a file worker in the warden") : 0;
}

int conch_jail_send_js_server(struct conch_jail *j, int64_t id, int sock, struct conch_err *err)
{
    struct jail_msg m = {.type = JMSG_FILE_SERVE, .a = 1, .id = id};
    int r = conch_jail_ctl_send(j, &m, &sock, 1);
    return r < 0 ? send_failed(err, r, "start a JS worker in the warden") : 0;
}

int conch_jail_upper_open(struct conch_jail *j, struct conch_err *err)
{
    if (j->upper_fd_nr < 0)
        return conch_err_set(err, ENOENT, "this sandbox has no overlay workspace");
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", j->warden_pid, j->upper_fd_nr);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "open the workspace upper dir (%s): %s", path,
                             strerror(errno));
    return fd;
}

int conch_jail_mount_upper_open(struct conch_jail *j, unsigned i, struct conch_err *err)
{
    _cleanup_close_ int upper = conch_jail_upper_open(j, err);
    if (upper < 0)
        return upper;
    /* The upper's parent holds m<i>/: in the same filesystem, so ".." stays in it. */
    _cleanup_close_ int base = openat(upper, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char rel[32];
    snprintf(rel, sizeof(rel), "m%u/upper", i);
    int fd = base < 0
                 ? -errno
                 : conch_open_beneath(base, rel, O_RDONLY | O_DIRECTORY, 0, CONCH_BENEATH_NO_XDEV);
    if (fd < 0)
        return conch_err_set(err, -fd, "open the upper dir of mount %u: %s", i, strerror(-fd));
    return fd;
}

/* As host root: the workspace's mount for the warden, made here (the warden, unprivileged in
 * its user namespace, could not idmap it nor use an idmapped mount of ours as an overlay
 * layer; the overlay we make from it, it can attach). */
static int root_attach_mounts(struct conch_jail *j, const char *workspace, const struct stat *ws,
                              enum conch_ws_mode mode, uint64_t disk_bytes, int *ret_mnt,
                              int *ret_upper, struct conch_err *err)
{
    if (j->idmap_fd >= 0 && (j->idmap_uid != ws->st_uid || j->idmap_gid != ws->st_gid)) {
        close(j->idmap_fd);
        j->idmap_fd = -1;
    }
    if (j->idmap_fd < 0) {
        j->idmap_fd = conch_jail_idmap_userns(j->host_id_base, false, ws->st_uid, ws->st_gid, err);
        if (j->idmap_fd < 0)
            return j->idmap_fd;
        j->idmap_uid = ws->st_uid;
        j->idmap_gid = ws->st_gid;
    }
    _cleanup_close_ int tree =
        conch_jail_idmapped_tree_in(workspace, j->idmap_fd, false, mode == CONCH_WS_RO, err);
    if (tree < 0)
        return tree;
    struct stat st;
    if (fstat(tree, &st) < 0 || st.st_dev != ws->st_dev || st.st_ino != ws->st_ino)
        return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                              "workspace '%s' changed while it was being attached: refusing it",
                              workspace);
    if (mode != CONCH_WS_OVERLAY) {
        *ret_mnt = TAKE_FD(tree);
        *ret_upper = -1;
        return 0;
    }
    /* Seen through the idmapping, the owner is the sandbox's agent; anyone else nobody. */
    uid_t agent = j->host_id_base + CONCH_AGENT_UID;
    uid_t uid = st.st_uid == 65534 ? agent : st.st_uid;
    gid_t gid = st.st_gid == 65534 ? j->host_id_base + CONCH_AGENT_GID : st.st_gid;
    return conch_jail_overlay_make(tree, uid, gid, st.st_mode, disk_bytes, ret_mnt, ret_upper, err);
}

int conch_jail_send_attach(struct conch_jail *j, const char *workspace, dev_t ws_dev, ino_t ws_ino,
                           enum conch_ws_mode mode, uint64_t disk_bytes, struct conch_err *err)
{
    if (mode == CONCH_WS_RW)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "a workspace in rw mode is not attached to a built sandbox");
    /* In order with what is queued: its answer is read when the socket is readable, after
     * the queue was flushed (the daemon's on_ctl_readable). */
    if (j->host_ws_fd >= 0 || j->ctl_fd < 0)
        return conch_err_set(err, EBUSY, "this sandbox cannot take a workspace");
    struct stat st;
    int r = conch_jail_open_workspace(j, workspace, ws_dev, ws_ino, &st, err);
    if (r < 0)
        return r;
    struct jail_msg m = {.type = JMSG_ATTACH, .a = (int32_t)mode, .bytes = disk_bytes};
    int fds[2] = {j->host_ws_fd, -1}, nfds = 1;
    if (j->root_mode) {
        r = root_attach_mounts(j, workspace, &st, mode, disk_bytes, &fds[0], &fds[1], err);
        if (r >= 0) {
            m.b = JATTACH_MOUNTED;
            nfds = fds[1] >= 0 ? 2 : 1;
            if ((r = conch_jail_ctl_send(j, &m, fds, nfds)) < 0)
                conch_err_set(err, -r, "send the workspace to the warden: %s", strerror(-r));
            close(fds[0]);
            if (fds[1] >= 0)
                close(fds[1]);
        }
    } else if ((r = conch_jail_ctl_send(j, &m, fds, nfds)) < 0) {
        conch_err_set(err, -r, "send the workspace to the warden: %s", strerror(-r));
    }
    if (r < 0) {
        close(j->host_ws_fd); /* nothing was attached: the sandbox is as it was */
        j->host_ws_fd = -1;
    }
    return r;
}

int conch_jail_hand_over(struct conch_jail *j, struct conch_jail_lease *ret, int *ret_ctl,
                         struct conch_err *err)
{
    if (j->ctl_fd < 0 || j->warden_pid <= 0)
        return conch_err_set(err, EBADF, "this sandbox has no warden");
    /* Never the control socket itself: a borrower that kept a copy of it past the loan could
     * drive the sandbox of whoever is lent it next. A channel of its own, which the recycle
     * closes. */
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0)
        return conch_err_set(err, errno, "make the borrower's channel: %s", strerror(errno));
    /* Sent directly, not queued: a lent sandbox's socket is not watched for room, and nothing
     * waits ahead of it (the attach's answer, routed just before, came after the attach
     * itself had left the queue, and nothing is sent to a sandbox being leased meanwhile). */
    struct jail_msg m = {.type = JMSG_LEASE};
    int r = conch_jail_send(j->ctl_fd, &m, &sp[1], 1);
    close(sp[1]);
    if (r < 0) {
        close(sp[0]);
        return conch_err_set(err, -r, "give the warden the borrower's channel: %s", strerror(-r));
    }
    *ret = (struct conch_jail_lease){.warden_pid = j->warden_pid,
                                     .upper_fd_nr = j->upper_fd_nr,
                                     .root_mode = j->root_mode,
                                     .host_id_base = j->host_id_base};
    *ret_ctl = sp[0];
    return 0;
}

int conch_jail_adopt(const struct conch_jail_lease *lease, int ctl, const char *workspace,
                     dev_t ws_dev, ino_t ws_ino, struct conch_jail **ret, struct conch_err *err)
{
    struct conch_jail *j = calloc(1, sizeof(*j));
    if (!j) {
        close(ctl);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    conch_jail_ids_init(&j->ids);
    j->adopted = true;
    j->warden_pid = lease->warden_pid;
    j->ctl_fd = ctl;
    j->host_ws_fd = j->ptc_fd = j->net_fd = j->pidfd = j->idmap_fd = -1;
    j->upper_fd_nr = lease->upper_fd_nr;
    j->root_mode = lease->root_mode;
    j->host_id_base = lease->host_id_base;
    int r = workspace ? conch_jail_open_workspace(j, workspace, ws_dev, ws_ino, NULL, err) : 0;
    if (r < 0) {
        conch_jail_destroy(j);
        return r;
    }
    *ret = j;
    return 0;
}

int conch_jail_usage(struct conch_jail *j, struct conch_jail_usage *ret)
{
    char path[96];
    snprintf(path, sizeof(path), "/proc/%d/root/proc", j->warden_pid);
    _cleanup_closedir_ DIR *d = opendir(path);
    if (!d)
        return -errno;
    long page = sysconf(_SC_PAGESIZE);
    uint64_t rss = 0, n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9' || !strcmp(de->d_name, "1"))
            continue;
        n++;
        char statm[384];
        snprintf(statm, sizeof(statm), "%s/%s/statm", path, de->d_name);
        _cleanup_fclose_ FILE *f = fopen(statm, "re");
        unsigned long long size, resident;
        if (f && fscanf(f, "%llu %llu", &size, &resident) == 2)
            rss += resident * (uint64_t)page;
    }
    /* Files in the sandbox's tmpfs mounts are memory too (a cgroup would charge them): count
     * what they hold, or `--memory` could be outgrown by writing to /tmp. */
    static const char *const tmpfs_dirs[] = {"tmp", "home/agent", "dev/shm"};
    for (size_t i = 0; i < ARRAY_SIZE(tmpfs_dirs); i++) {
        char p[96];
        struct statvfs sv;
        snprintf(p, sizeof(p), "/proc/%d/root/%s", j->warden_pid, tmpfs_dirs[i]);
        if (statvfs(p, &sv) == 0 && sv.f_blocks >= sv.f_bfree)
            rss += (uint64_t)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
    }
    ret->processes = n;
    ret->rss_bytes = rss;
    return 0;
}
