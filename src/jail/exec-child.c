/* exec-child.c - a daemon's warden's first moments: the child of clone(), in its new user and
 * pid namespaces but still a copy of the daemon (its heap, locks its threads held). It only
 * puts its fds in place and execs the wardens' image, a copy of the conch binary, which builds
 * the sandbox (warden-exec.c). Runs between clone() and execve(): no allocation, no locks, no
 * stdio. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jail/jail-internal.h"

#define EXE_FD 5 /* the binary, until the exec (close-on-exec) */

/* Keep every capability we hold in our user namespace across the exec. We exec before the
 * parent has written our id maps, so as an id that is not the namespace's root: an exec drops
 * them all, but for the ambient set. The new image clears the ambient and inheritable sets
 * first thing (conch_jail_warden_main). */
static int keep_caps_across_exec(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -errno;
    data[0].inheritable = data[0].permitted;
    data[1].inheritable = data[1].permitted;
    if (syscall(SYS_capset, &hdr, data) < 0)
        return -errno;
    for (int cap = 0; cap <= 63; cap++) {
        if (!(cap < 32 ? data[0].permitted & (1u << cap) : data[1].permitted & (1u << (cap - 32))))
            continue;
        /* EINVAL: a capability this kernel does not have. */
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0 && errno != EINVAL)
            return -errno;
    }
    return 0;
}

long conch_jail_warden_clone(struct jail_exec *x)
{
    unsigned long flags = CLONE_NEWUSER | CLONE_NEWPID | SIGCHLD;
    if (!x)
        return syscall(SYS_clone, flags, NULL, NULL, NULL, 0);
    int slots[3], devnull;
    x->fd_top = -1;
    bool have_slots = conch_jail_spawn_slots(slots, &devnull);
    if (have_slots && dup3(x->ctl_fd, slots[0], O_CLOEXEC) >= 0 &&
        dup3(x->plan_fd, slots[1], O_CLOEXEC) >= 0 && dup3(x->exe_fd, slots[2], O_CLOEXEC) >= 0) {
        x->ctl_fd = slots[0];
        x->plan_fd = slots[1];
        x->exe_fd = slots[2];
        x->fd_top = slots[0] > slots[1] ? slots[0] : slots[1];
        x->fd_top = x->fd_top > slots[2] ? x->fd_top : slots[2];
        flags |= CLONE_FILES;
    }
    long pid = syscall(SYS_clone, flags | CLONE_VFORK, NULL, NULL, NULL, 0);
    if (pid == 0)
        conch_jail_warden_exec_child(x);
    int saved = errno;
    /* The slots hold /dev/null again, also after a dup3 that failed half way: a slot left
     * holding the warden's end of its control socket would keep the daemon from ever seeing
     * that socket's EOF. */
    if (have_slots)
        for (int i = 0; i < 3; i++)
            dup3(devnull, slots[i], O_CLOEXEC);
    errno = saved;
    return pid;
}

__attribute__((noreturn)) void conch_jail_warden_exec_child(const struct jail_exec *x)
{
    struct conch_err err = {0};
    const char *step = "set up its fds";
    int ctl = x->ctl_fd;
    int r;
    /* Sharing the caller's fd table (CLONE_FILES), nothing may change in it: first a table of
     * our own, holding only the fds up to the slots (the copy takes none of the thousands
     * above them, and so closes none of them either). A kernel before 5.9 has no
     * CLOSE_RANGE_UNSHARE: a whole copy then, as a clone without CLONE_FILES makes. */
    if (x->fd_top >= 0 && syscall(SYS_close_range, x->fd_top + 1, ~0U, CLOSE_RANGE_UNSHARE) < 0 &&
        unshare(CLONE_FILES) < 0)
        goto fail_errno;
    /* Out of the way first (3..5 may hold any of them), then in place; the control socket
     * and the plan stay open across the exec, the binary does not. */
    int from[3] = {x->ctl_fd, x->plan_fd, x->exe_fd}, tmp[3];
    for (int i = 0; i < 3; i++)
        if ((tmp[i] = fcntl(from[i], F_DUPFD_CLOEXEC, 10)) < 0)
            goto fail_errno;
    if (dup2(tmp[0], JAIL_WARDEN_CTL_FD) < 0)
        goto fail_errno;
    ctl = JAIL_WARDEN_CTL_FD;
    if (dup2(tmp[1], JAIL_WARDEN_PLAN_FD) < 0 || dup3(tmp[2], EXE_FD, O_CLOEXEC) < 0)
        goto fail_errno;
    /* Nothing of the caller's may reach the sandbox: its listening socket, its clients'
     * connections, other sandboxes' control sockets (fds not marked close-on-exec too). */
    if (syscall(SYS_close_range, EXE_FD + 1, ~0U, 0) < 0)
        goto fail_errno;
    int devnull = open("/dev/null", O_RDWR);
    if (devnull < 0)
        goto fail_errno;
    for (int i = 0; i < 3; i++)
        if (devnull != i && dup2(devnull, i) < 0)
            goto fail_errno;
    if (devnull > 2)
        close(devnull);
    if (x->send_id_map_fds) {
        step = "open its id maps for the parent";
        static const char *const names[3] = {"/proc/self/setgroups", "/proc/self/uid_map",
                                             "/proc/self/gid_map"};
        int maps[3];
        for (int i = 0; i < 3; i++)
            if ((maps[i] = open(names[i], O_WRONLY | O_CLOEXEC)) < 0)
                goto fail_errno;
        struct jail_msg m;
        memset(&m, 0, sizeof(m));
        m.type = JMSG_ID_MAP_FDS;
        if ((r = conch_jail_send(ctl, &m, maps, 3)) < 0) {
            errno = -r;
            goto fail_errno;
        }
        for (int i = 0; i < 3; i++)
            close(maps[i]);
    }
    step = "keep its capabilities across the exec";
    if ((r = keep_caps_across_exec()) < 0) {
        errno = -r;
        goto fail_errno;
    }
    step = "execute the wardens' image (a copy of the conch binary)";
    syscall(SYS_execveat, EXE_FD, "", x->argv, x->envp, AT_EMPTY_PATH);

fail_errno:
    conch_err_set(&err, errno, "start the warden: %s: %s", step, strerror(errno));
    struct jail_msg m;
    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_ERR;
    m.err = err;
    conch_jail_send(ctl, &m, NULL, 0);
    _exit(1);
}
