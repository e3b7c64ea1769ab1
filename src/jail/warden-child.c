/* warden-child.c - the warden: PID 1 of the sandbox. It finishes the sandbox setup, then
 * serves the control socket: starts each command under a shepherd (PID 1 of a pid namespace
 * of the command's own, so that killing it kills the command's every process at once; see
 * shepherd-child.c), enforces deadlines, forwards signals, reaps, and sends every command
 * exactly one final event whatever happened to its shepherd; it lends channels to borrowers,
 * recycles the sandbox and attaches workspaces. When the warden exits, the kernel kills
 * everything left in its pid namespace. Runs in the child after clone(): no allocation, no
 * stdio. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/mount.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/fdpass.h"
#include "core/proctitle.h"
#include "jail/jail-internal.h"

/* The proxy's listener of the allow mode, at 127.0.0.1:3128 of the sandbox's own network
 * namespace (loopback is up): the daemon accepts on it, so only the sandbox can connect. */
static int proxy_listen(struct conch_err *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons(CONCH_NET_PROXY_PORT),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(fd, 1024) < 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return conch_err_set(err, e, "network proxy: listen on 127.0.0.1:%d in the sandbox: %s",
                             CONCH_NET_PROXY_PORT, strerror(e));
    }
    return fd;
}

static int loopback_up(struct conch_err *err)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return conch_err_set(err, errno, "socket for loopback: %s", strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strcpy(ifr.ifr_name, "lo");
    int r = ioctl(s, SIOCGIFFLAGS, &ifr);
    if (r == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        r = ioctl(s, SIOCSIFFLAGS, &ifr);
    }
    int e = errno;
    close(s);
    if (r < 0)
        return conch_err_set(err, e, "bring up loopback in the network namespace: %s", strerror(e));
    return 0;
}

/* Drop every capability but @keep from the bounding and ambient sets; needs
 * CAP_SETPCAP, so it runs before the identity switch. The kernel's capabilities are numbered
 * 0 to CAP_LAST_CAP without a gap, and PR_CAPBSET_DROP refuses the first number past the
 * last with EINVAL: there the loop ends (41 calls on Linux 6.x rather than 64). */
static int drop_bounding_caps(uint64_t keep)
{
    for (int cap = 0; cap <= 63; cap++) {
        if (keep & (1ULL << cap))
            continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
            if (errno == EINVAL)
                break;
            return -errno;
        }
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    return 0;
}

void conch_jail_reset_signals(void)
{
    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The control socket, moved to fd 3 at start: every other fd inherited from the parent
 * (the daemon's listening socket, its clients' connections, its stdio) is closed, so that
 * no sandbox process keeps them open. */
static int warden_ctl = -1;

/* What is lent is revoked. A borrower (`conch run` through the daemon's pool) never gets the
 * control socket itself, which stays the parent's alone: the parent makes a socketpair per
 * lease and sends us one end (JMSG_LEASE), the borrower the other. On it come only RUN and
 * SIGNAL, and the events of the commands started through it go back on it; the recycle kills
 * every process that inherited our end and closes ours, so a borrower that kept its copy past
 * the loan reads EOF and reaches nothing of the next user's sandbox (its own copy of the
 * control socket did: RUN in the next user's workspace, their events read, a SHUTDOWN).
 * Channels are numbered: 0 is the parent's control socket, each lease takes the next number. */
static int lease_ctl = -1; /* the current lease's channel, or -1 (none, or closed) */
static uint32_t lease_no;  /* the current (or last) lease's number; 0: none yet */

int conch_jail_chan_fd(uint32_t chan)
{
    return chan == 0 ? warden_ctl : chan == lease_no ? lease_ctl : -1;
}

/* The channel a process forked now inherits and reports on, before it is told otherwise. */
uint32_t conch_jail_chan_now(void)
{
    return lease_ctl >= 0 ? lease_no : 0;
}

static void slot_signal(struct jail_proc_slot *s, int sig);

/* End the current lease: close our end of its channel and, with @kill_commands, kill the
 * commands started through it (their borrower does not read, or went away: nobody will see
 * their events, and they must not run on in a sandbox whose slots they hold). */
static void lease_revoke(bool kill_commands)
{
    if (lease_ctl < 0)
        return;
    close(lease_ctl);
    lease_ctl = -1;
    for (int i = 0; kill_commands && i < JAIL_MAX_PROCS; i++) {
        struct jail_proc_slot *s = &conch_jail_warden.slots[i];
        if (s->pid <= 0 || s->is_file)
            continue;
        if (s->ready && s->shep_chan == lease_no) {
            /* Built during the lease, it holds a copy of the channel: the borrower would
             * never read EOF. Reaped silently; the next one is built on channel 0. */
            s->ready = false;
            s->retired = true;
            s->id = -1;
            if (conch_jail_warden.ready_slot == i)
                conch_jail_warden.ready_slot = -1;
            kill(s->pid, SIGKILL);
        } else if (!s->ready && !s->retired && s->chan == lease_no) {
            slot_signal(s, SIGKILL);
        }
    }
}

/* Send event @m on channel @chan. On the parent's control socket as ever (blocking; a failure
 * means the parent is gone). A borrower never blocks us: one that does not read, or went
 * away, loses its lease (the channel closed, its commands killed; the event dropped); a
 * channel revoked drops it. Shepherds send on a borrower's channel without blocking too
 * (shepherd-child.c). */
int conch_jail_chan_send(uint32_t chan, struct jail_msg *m)
{
    if (chan == 0)
        return conch_jail_send(warden_ctl, m, NULL, 0);
    int fd = conch_jail_chan_fd(chan);
    if (fd < 0)
        return 0;
    m->version = JAIL_PROTO_VERSION;
    if (conch_send_fds(fd, m, sizeof(*m), NULL, 0, MSG_DONTWAIT) != (ssize_t)sizeof(*m))
        lease_revoke(true);
    return 0;
}

/* The queued signals a sandbox's processes may hold (see conch_jail_warden_main). */
#define SANDBOX_SIGPENDING 256

struct conch_jail_warden conch_jail_warden = {
    .ready_slot = -1, .last_cmd_slot = -1, .host_view = -1};
static int attached_upper = -1; /* the attached overlay's upper dir, or -1 */

/* Kill every process of the sandbox but us, and reap them all. */
static void kill_all_and_reap(void)
{
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
        ;
}

/* Send @sig to every process of the command in @s (its whole pid namespace). SIGKILL kills
 * the shepherd itself: the kernel then kills the namespace, atomically. */
static void slot_signal(struct jail_proc_slot *s, int sig)
{
    if (s->pid <= 0)
        return;
    if (sig == SIGKILL || s->is_file) {
        s->killed = true;
        kill(s->pid, SIGKILL);
        return;
    }
    if (sig < 1 || sig > 64)
        return;
    __atomic_fetch_or(&conch_jail_warden.reports[s - conch_jail_warden.slots].sig_req,
                      1ULL << (sig - 1), __ATOMIC_RELEASE);
    kill(s->pid, conch_jail_ctl_signal());
}

/* Fire the deadlines that are due; returns the poll timeout until the next one (-1: none). */
static int slots_tick(void)
{
    uint64_t now = conch_clock_ms(), next = 0;
    for (int i = 0; i < JAIL_MAX_PROCS; i++) {
        struct jail_proc_slot *s = &conch_jail_warden.slots[i];
        if (s->pid <= 0)
            continue;
        if (s->deadline_ms && now >= s->deadline_ms) {
            s->deadline_ms = 0;
            s->timed_out = true;
            conch_jail_warden.reports[s - conch_jail_warden.slots].timed_out = 1;
            if (s->grace_ms && !s->is_file) {
                slot_signal(s, SIGTERM);
                s->kill_at_ms = now + s->grace_ms;
            } else {
                slot_signal(s, SIGKILL);
            }
        }
        if (s->kill_at_ms && now >= s->kill_at_ms) {
            s->kill_at_ms = 0;
            slot_signal(s, SIGKILL);
        }
        uint64_t t = s->deadline_ms ? s->deadline_ms : s->kill_at_ms;
        if (t && (!next || t < next))
            next = t;
    }
    if (!next)
        return -1;
    return next > now ? (int)(next - now) : 0;
}

/* A shepherd or file worker was reaped: send the final event of its command or request.
 * Every one gets exactly one, RUN_ERR or EXITED, whatever happened to its shepherd. */
static int slot_finish(int i, int status, const struct rusage *ru)
{
    struct jail_proc_slot *s = &conch_jail_warden.slots[i];
    struct jail_shep_report *rep = &conch_jail_warden.reports[i];
    struct jail_msg m;
    memset(&m, 0, sizeof(m));
    m.id = s->id;
    bool is_file = s->is_file;
    uint32_t chan = s->chan;
    s->pid = 0;
    if (s->sock >= 0)
        close(s->sock);
    s->sock = -1;
    if (s->retired) {
        s->retired = false;
        return 0;
    }
    if (s->ready) {
        /* A shepherd started ahead of need died before it had a command: nothing to report;
         * after a few such deaths, shepherds are only started on demand. */
        s->ready = false;
        if (conch_jail_warden.ready_slot == i) /* another may be ready already */
            conch_jail_warden.ready_slot = -1;
        conch_jail_warden.ready_failures++;
        return 0;
    }
    if (is_file) {
        /* A file worker's answer went through its pipe or socket; its end is reported too,
         * so that the parent learns of a worker killed (deadline, OOM, the host) or dead
         * from the event, not only from EOF. */
        m.type = JMSG_EXITED;
        m.a = status;
        m.usage = *ru;
        if (s->timed_out)
            m.b |= JEXIT_TIMED_OUT;
        return conch_jail_chan_send(chan, &m);
    }
    if (rep->state == SHEP_EXIT_SENT)
        return 0; /* its end is sent */
    if (rep->state == SHEP_START_FAILED) {
        m.type = JMSG_RUN_ERR;
        m.err = rep->err;
    } else if (rep->state == SHEP_NONE && !s->killed) {
        m.type = JMSG_RUN_ERR;
        conch_err_set(&m.err, EIO, "start command: its supervisor died (wait status %d)", status);
    } else {
        m.type = JMSG_EXITED;
        m.usage = *ru;
        if (rep->state == SHEP_EXITED) {
            m.a = rep->status;
        } else {
            /* Killed with its namespace, by us or by the kernel (OOM): every process of the
             * command died by SIGKILL. */
            m.a = SIGKILL;
            if (!s->killed)
                m.b |= JEXIT_LOST;
        }
        if (s->timed_out)
            m.b |= JEXIT_TIMED_OUT;
    }
    return conch_jail_chan_send(chan, &m);
}

static void reap_children(void)
{
    int st;
    struct rusage ru;
    pid_t pid;
    while ((pid = wait4(-1, &st, WNOHANG, &ru)) > 0) {
        for (int i = 0; i < JAIL_MAX_PROCS; i++) {
            if (conch_jail_warden.slots[i].pid == pid) {
                if (slot_finish(i, st, &ru) < 0)
                    _exit(1);
                break;
            }
        }
    }
}

/* The live process of request @id that came on channel @chan (a borrower reaches its own). */
static struct jail_proc_slot *slot_find(int64_t id, uint32_t chan)
{
    for (int i = 0; i < JAIL_MAX_PROCS; i++)
        if (conch_jail_warden.slots[i].pid > 0 && conch_jail_warden.slots[i].id == id &&
            conch_jail_warden.slots[i].chan == chan)
            return &conch_jail_warden.slots[i];
    return NULL;
}

/* An attachable sandbox's empty /workspace becomes a shared mount (see spawn_shepherd). The
 * peer group is new and ours: the root was made private, nothing of the host is in it. */
static void share_workspace(const struct jail_plan *plan)
{
    if (plan->attachable)
        conch_jail_warden.ws_shared = mount(NULL, "/workspace", NULL, MS_SHARED, NULL) == 0;
    /* A workspace mounted at setup is there before any shepherd: its Landlock rule is made
     * ahead, as ever (only an attach comes after the ready shepherd). */
    if (plan->has_workspace)
        conch_jail_warden.ws_attached = true;
}

/* JMSG_RECYCLE: make this sandbox (one without a workspace) as new for its next user. Every
 * process but us dies (commands, shepherds, file workers); the network, IPC and UTS
 * namespaces are replaced by new ones (the old die with their last user: us); every mount a
 * command could write is replaced by a new, empty one (conch_jail_mounts_scrub_child); our records
 * start over. What stays is read-only to commands (the root, /usr, /etc, /dev's nodes) or
 * ours (the user, mount and pid namespaces, the cgroup). */
static int recycle(const struct jail_plan *plan, struct conch_err *err)
{
    if (conch_jail_warden.ws_on_disk) /* a fork's: its changes are kept, it is not reused */
        return conch_err_set(err, EINVAL, "a sandbox with a workspace is not reused");
    kill_all_and_reap();
    lease_revoke(false); /* the last copy of our end: its borrower reads EOF */
    for (int i = 0; i < JAIL_MAX_PROCS; i++)
        if (conch_jail_warden.slots[i].pid && conch_jail_warden.slots[i].sock >= 0)
            close(conch_jail_warden.slots[i].sock);
    memset(conch_jail_warden.slots, 0, sizeof(conch_jail_warden.slots));
    memset(conch_jail_warden.reports, 0, JAIL_MAX_PROCS * sizeof(*conch_jail_warden.reports));
    conch_jail_warden.ready_slot = conch_jail_warden.last_cmd_slot = -1;
    conch_jail_warden.ready_failures = 0;
    if (attached_upper >= 0)
        close(attached_upper); /* the attached workspace goes with the scrub's new /workspace */
    attached_upper = -1;
    conch_jail_warden.ws_attached = false;
    conch_jail_warden.refill_never = false;
    conch_jail_warden.refill_after_us = 0;
    /* Only a sandbox without network gets a new network namespace: the host's stays the
     * host's, and the allow mode's holds the proxy listener the daemon accepts on. */
    int newnet = plan->net == CONCH_NET_NONE ? CLONE_NEWNET : 0;
    if (unshare(newnet | CLONE_NEWIPC | CLONE_NEWUTS) < 0)
        return conch_err_set(err, errno, "renew the network, ipc and uts namespaces: %s",
                             strerror(errno));
    if (sethostname("conch", 5) < 0)
        return conch_err_set(err, errno, "set hostname in the UTS namespace: %s", strerror(errno));
    int r = newnet ? loopback_up(err) : 0;
    if (r < 0)
        return r;
    if ((r = conch_jail_mounts_scrub_child(plan, err)) < 0)
        return r;
    share_workspace(plan);
    return 0;
}

/* The workspace dir the parent sent (@ws, a dir of the parent's mount namespace), cloned from
 * our host view: a detached mount of our own, which an overlay may use as a layer. Checked to
 * be the very dir the parent opened. Returns the clone or -errno with @err. */
static int clone_from_host_view(int ws, struct conch_err *err)
{
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", ws);
    ssize_t n = readlink(link, path, sizeof(path) - 1);
    struct stat want, got;
    if (n <= 0 || fstat(ws, &want) < 0)
        return conch_err_set(err, errno, "attach the workspace: read its path: %s",
                             strerror(errno));
    path[n] = '\0';
    int here = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (here < 0 || root < 0 || setns(conch_jail_warden.host_view, CLONE_NEWNS) < 0) {
        int e = errno;
        if (here >= 0)
            close(here);
        if (root >= 0)
            close(root);
        return conch_err_set(err, e, "attach the workspace: enter the host view: %s", strerror(e));
    }
    int tree = (int)syscall(SYS_open_tree, AT_FDCWD, path,
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_SYMLINK_NOFOLLOW);
    int e = errno;
    /* Back into the sandbox, onto its root: a warden left in the host view would hand it to
     * every shepherd it forks. */
    if (setns(here, CLONE_NEWNS) < 0 || fchdir(root) < 0 || chroot(".") < 0 || chdir("/") < 0)
        _exit(1);
    close(here);
    close(root);
    if (tree < 0)
        return conch_err_set(err, e, "attach the workspace: clone '%s': %s", path, strerror(e));
    if (fstat(tree, &got) < 0 || got.st_dev != want.st_dev || got.st_ino != want.st_ino) {
        close(tree);
        return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                              "workspace '%s' changed while it was being attached: refusing it",
                              path);
    }
    return tree;
}

/* JMSG_ATTACH: mount a workspace at /workspace of this sandbox, which has run nothing yet. The
 * ready shepherd sees it and runs the first command (see spawn_shepherd); where our
 * /workspace could not be made shared, it is retired instead (its mount namespace is a copy
 * from before) and the next one is built on the new mount. The fds we keep are set to -1 in
 * @fds. Returns 0 with *@ret_upper (or -1), or -errno with @err. */
static int attach(const struct jail_plan *plan, const struct jail_msg *m, int *fds, int nfds,
                  int *ret_upper, struct conch_err *err)
{
    *ret_upper = -1;
    if (conch_jail_warden.last_cmd_slot >= 0 || conch_jail_warden.ws_attached)
        return conch_err_set(err, EBUSY, "attach the workspace: this sandbox has been used");
    if (conch_jail_warden.ready_slot >= 0 && !conch_jail_warden.ws_shared) {
        /* It stays, idle, until the recycle's kill_all: ending it now (its pid and mount
         * namespaces' teardown) delayed our answer by a millisecond and more. */
        struct jail_proc_slot *s = &conch_jail_warden.slots[conch_jail_warden.ready_slot];
        s->ready = false;
        s->retired = true;
        s->id = -1;
        conch_jail_warden.ready_slot = -1;
    }
    conch_jail_warden.refill_after_us = 0;
    int mnt = -1, upper = -1, r;
    bool on_disk = m->b & JATTACH_ON_DISK;
    if (on_disk && m->a != CONCH_WS_OVERLAY)
        return conch_err_set(err, EINVAL, "warden: bad attach request");
    if (m->b & JATTACH_PATHS) {
        /* A fork's stack, unprivileged: built here as a snapshot's restack is. */
        if (nfds != 2 || !on_disk)
            return conch_err_set(err, EINVAL, "warden: bad attach request");
        if ((r = conch_jail_restack_build_child(fds[0], fds[1], &mnt, &upper, err)) < 0)
            return r;
    } else if (m->b & JATTACH_MOUNTED) {
        if (nfds < 1 || nfds > 2)
            return conch_err_set(err, EINVAL, "warden: bad attach request");
        mnt = fds[0];
        upper = nfds == 2 ? fds[1] : -1;
        fds[0] = -1;
        if (nfds == 2)
            fds[1] = -1;
    } else {
        if (nfds != 1 || conch_jail_warden.host_view < 0)
            return conch_err_set(err, EINVAL, "warden: this sandbox cannot take a workspace");
        int tree = clone_from_host_view(fds[0], err);
        if (tree < 0)
            return tree;
        if (m->a == CONCH_WS_OVERLAY) {
            struct stat st;
            if (fstat(tree, &st) < 0) {
                close(tree);
                return conch_err_set(err, errno, "stat workspace: %s", strerror(errno));
            }
            uid_t uid = st.st_uid == 65534 ? plan->cmd_uid : st.st_uid;
            gid_t gid = st.st_gid == 65534 ? plan->cmd_gid : st.st_gid;
            r = conch_jail_overlay_make(tree, uid, gid, st.st_mode, m->bytes, &mnt, &upper, err);
            close(tree);
            if (r < 0)
                return r;
        } else {
            struct mount_attr attr = {.attr_set =
                                          MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
            if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) < 0) {
                close(tree);
                return conch_err_set(err, errno, "attach the workspace read-only: %s",
                                     strerror(errno));
            }
            mnt = tree;
        }
    }
    /* Over the empty /workspace, which is not unmounted here: an unmount waits for RCU, on
     * the command's path; the recycle's scrub removes both. */
    r = conch_jail_stage_attach(mnt, "/workspace", err);
    close(mnt);
    if (r < 0) {
        if (upper >= 0)
            close(upper);
        return r;
    }
    /* A fork's upper is kept as a built sandbox's (the caller's upper_fd); a lent one's goes
     * with the recycle. */
    *ret_upper = upper;
    if (!on_disk)
        attached_upper = upper;
    conch_jail_warden.ws_attached = true;
    conch_jail_warden.ws_on_disk = on_disk;
    return 0;
}

/* The shepherds of commands that ended may be tearing their namespaces down: one that had
 * begun when we unmounted /workspace holds the old overlay, out of the unmount's reach, until
 * its exit is through (a few milliseconds of RCU), and the next overlay on the same dirs would
 * find them in use. Wait for them, a bounded while (they are harmless: nothing of theirs can
 * reach the overlay any more). */
static void reap_exiting_shepherds(void)
{
    for (int round = 0; round < 100; round++) {
        bool left = false;
        for (int i = 0; i < JAIL_MAX_PROCS; i++) {
            struct jail_proc_slot *s = &conch_jail_warden.slots[i];
            if (s->pid <= 0 || s->is_file || s->ready || s->retired)
                continue;
            int st;
            struct rusage ru;
            pid_t p = wait4(s->pid, &st, WNOHANG, &ru);
            if (p == s->pid) {
                if (slot_finish(i, st, &ru) < 0)
                    _exit(1);
            } else {
                left = true;
            }
        }
        if (!left)
            return;
        struct timespec ts = {.tv_nsec = 200 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* JMSG_RESTACK, JRESTACK_RELEASE: a snapshot froze nothing yet; it needs /workspace out of
 * the way, with nothing left that could write through it (the parent found no command,
 * session or file request running, and renames the upper dir into a frozen layer once we
 * answer). File workers (idle: they hold /workspace as their cwd) are killed and reaped, the
 * ready shepherd is retired (its command's Landlock rule names the old overlay's root), and
 * /workspace is unmounted without MNT_DETACH: the kernel refuses (EBUSY) while any process,
 * here or in a shepherd's namespace (a slave of ours), has a file or its cwd in it, or while a
 * mount sits below it (path rules, an extra mount): /workspace is then kept, and the parent
 * restarts the sandbox instead. */
static int restack_release(const struct jail_plan *plan, int *upper_fd, struct conch_err *err)
{
    bool built = plan->has_workspace && plan->ws_mode == CONCH_WS_OVERLAY && plan->upper_on_disk;
    if (!(built || conch_jail_warden.ws_on_disk) || conch_jail_warden.ws_released)
        return conch_err_set(err, EINVAL, "warden: this sandbox's workspace cannot be restacked");
    for (int i = 0; i < JAIL_MAX_PROCS; i++) {
        struct jail_proc_slot *s = &conch_jail_warden.slots[i];
        if (s->pid > 0 && !s->is_file && !s->ready && !s->retired &&
            conch_jail_warden.reports[i].state != SHEP_EXIT_SENT &&
            conch_jail_warden.reports[i].state != SHEP_EXITED)
            return conch_err_set(err, EBUSY, "a command still runs in the sandbox");
    }
    for (int i = 0; i < JAIL_MAX_PROCS; i++) {
        struct jail_proc_slot *s = &conch_jail_warden.slots[i];
        if (s->pid <= 0 || !s->is_file)
            continue;
        s->killed = true;
        kill(s->pid, SIGKILL);
        int st;
        struct rusage ru;
        while (wait4(s->pid, &st, 0, &ru) < 0 && errno == EINTR)
            ;
        if (slot_finish(i, st, &ru) < 0)
            _exit(1);
    }
    if (umount2("/workspace", 0) < 0)
        return conch_err_set(err, errno, "unmount /workspace for the snapshot: %s",
                             strerror(errno));
    /* Only now: the unmount took the overlay out of its namespace while it lived. */
    if (conch_jail_warden.ready_slot >= 0) {
        struct jail_proc_slot *s = &conch_jail_warden.slots[conch_jail_warden.ready_slot];
        s->ready = false;
        s->retired = true;
        s->id = -1;
        kill(s->pid, SIGKILL);
        conch_jail_warden.ready_slot = -1;
    }
    reap_exiting_shepherds();
    if (*upper_fd >= 0)
        close(*upper_fd); /* the old upper dir: frozen next */
    *upper_fd = -1;
    conch_jail_warden.ws_released = true;
    return 0;
}

/* JMSG_RESTACK, JRESTACK_MOUNT: the new overlay (the frozen layers under a new upper) at
 * /workspace, on the shared bind below (mounts-child.c): the shepherds to come see it.
 * Takes fds[0] and fds[1]. */
static int restack_mount(const struct jail_msg *m, int *fds, int nfds, int *upper_fd,
                         struct conch_err *err)
{
    if (!conch_jail_warden.ws_released || nfds != 2)
        return conch_err_set(err, EINVAL, "warden: bad restack request");
    int mnt = fds[0], upper = fds[1], r;
    if (m->b & JRESTACK_PATHS) {
        if ((r = conch_jail_restack_build_child(fds[0], fds[1], &mnt, &upper, err)) < 0)
            return r;
    } else {
        fds[0] = fds[1] = -1;
    }
    r = conch_jail_stage_attach(mnt, "/workspace", err);
    close(mnt);
    if (r < 0) {
        close(upper);
        return r;
    }
    conch_jail_warden.ws_released = false;
    *upper_fd = upper;
    return 0;
}

/* One message on the borrower's channel: a command to run, or a signal for one of the commands
 * it started. Everything else (recycle, attach, lease, file requests, shutdown) is the
 * parent's alone and dropped. EOF or an error ends the lease: the channel is closed and the
 * lease's commands are killed (nobody is left to read their events). */
static void lease_serve(const struct jail_plan *plan)
{
    struct jail_msg m;
    int fds[4], nfds = 0;
    int r = conch_jail_recv(lease_ctl, &m, fds, 4, &nfds, MSG_DONTWAIT);
    if (r == -EAGAIN || r == -EPROTO)
        return;
    if (r <= 0) {
        lease_revoke(true);
        return;
    }
    struct jail_msg reply = {.type = JMSG_RUN_ERR, .id = m.id};
    if (m.type == JMSG_RUN) {
        if (conch_jail_start_command(plan, &m, fds, nfds, &reply, lease_no) < 0)
            conch_jail_chan_send(lease_no, &reply);
    } else if (m.type == JMSG_SIGNAL) {
        struct jail_proc_slot *s = slot_find(m.id, lease_no);
        if (s && m.a > 0 && m.a < NSIG)
            slot_signal(s, m.a);
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
}

/* `conch run`'s warden is a copy of it: its command line and environment are still in our
 * memory. Overwrite both, so that /proc/1/cmdline shows no host path and nothing of them
 * lingers (a daemon's warden, exec'd, has only its entry point's arguments and the
 * sanitizers' options there). */
static void scrub_inherited_memory(void)
{
    extern char **environ;
    for (char **e = environ; e && *e; e++)
        memset(*e, 0, strlen(*e));
    conch_proctitle_set_child("conch-warden");
}

/* The capabilities the clone child kept across the exec (exec-child.c) go back to being
 * ours alone: nothing we start inherits them through the ambient or inheritable sets. */
static int clear_inherited_caps(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
        return -errno;
    if (syscall(SYS_capget, &hdr, data) < 0)
        return -errno;
    data[0].inheritable = data[1].inheritable = 0;
    return syscall(SYS_capset, &hdr, data) < 0 ? -errno : 0;
}

/* A daemon's warden runs in a new image exec'd by the jail (warden-exec.c,
 * conch_jail_warden_entry), with every signal blocked since the clone: single-threaded,
 * nothing of the daemon's memory. `conch run`'s is the clone child itself. */
__attribute__((noreturn)) void conch_jail_warden_main(const struct jail_plan *plan)
{
    struct jail_msg m;
    struct conch_err err = {0};
    int upper_fd = -1;
    int ctl = plan->ctl_fd;
    /* Ignored signals stay ignored across an exec (the daemon ignores SIGPIPE): every
     * disposition back to the default, then unblocked. */
    conch_jail_reset_signals();
    if (clear_inherited_caps() < 0)
        _exit(1);
    /* Dumpable again (an exec of an image we may not read, as a daemon's is, is not): an
     * unprivileged parent opens our upper dir through /proc. */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    /* The sandbox's tree is made with the modes we ask for, whatever the caller's umask
     * (077 made its mount points unreachable for the agent); a command of conch run gets the
     * caller's umask back (JBLOB_CALLER), the daemon's get this one. */
    umask(022);
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
        _exit(1);
    if (ctl != 3) {
        if (dup3(ctl, 3, O_CLOEXEC) < 0)
            _exit(1);
        ctl = 3;
    }
    if (syscall(SYS_close_range, 4, ~0U, 0) < 0)
        _exit(1);
    warden_ctl = ctl;
    scrub_inherited_memory();
    conch_jail_warden.cpus_known =
        sched_getaffinity(0, sizeof(conch_jail_warden.cpus), &conch_jail_warden.cpus) == 0;
    conch_jail_warden.reports = mmap(NULL, JAIL_MAX_PROCS * sizeof(*conch_jail_warden.reports),
                                     PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (conch_jail_warden.reports == MAP_FAILED)
        _exit(1);

    /* Wait until the parent wrote our id maps (and put us in the cgroup). As host root, with
     * a workspace, the go-ahead carries its idmapped tree (setup_workspace attaches it). */
    int fds[4];
    int nfds = 0;
    if (conch_jail_recv(ctl, &m, fds, 1, &nfds, 0) < 0)
        _exit(1);
    conch_jail_warden.ws_tree = nfds == 1 ? fds[0] : -1;
    /* Become the namespace's own ids: until now we were unmapped kernel ids. */
    if (setresgid(plan->warden_gid, plan->warden_gid, plan->warden_gid) < 0 ||
        setresuid(plan->warden_uid, plan->warden_uid, plan->warden_uid) < 0) {
        conch_err_set(&err, errno, "become uid %u in the user namespace: %s", plan->warden_uid,
                      strerror(errno));
        goto setup_failed;
    }
    /* We die with our parent, and so does everything in our pid namespace. Only after the
     * ids: a change of effective ids clears the parent-death signal (as host root they are
     * the sandbox's own block), and a warden that outlived its daemon ran on, its host ids
     * free to be given to another sandbox. A parent already gone left our control socket
     * without a peer (nobody else holds it yet). */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    struct pollfd hup = {.fd = ctl, .events = POLLRDHUP};
    if (poll(&hup, 1, 0) > 0 && (hup.revents & (POLLHUP | POLLRDHUP)))
        _exit(1);
    /* Commands cannot read our fds through /proc/1/fd: they lack capabilities we hold, so
     * the kernel's ptrace access check refuses them (and each command has a pid namespace of
     * its own, where we are not even visible). We stay dumpable so that an unprivileged
     * parent (same uid, owner of our user namespace) can open our upper dir. */
    /* Attachable and unprivileged: first a mount namespace that keeps seeing the host (a
     * slave: later host mounts appear in it too), where an attached workspace is cloned
     * from; only a mount of a namespace of ours can be an overlay layer here. As host root the
     * parent makes the mount itself (idmapped) and hands it over: no such view. */
    if ((plan->attachable ||
         (plan->upper_on_disk && plan->has_workspace && plan->ws_mode == CONCH_WS_OVERLAY)) &&
        !plan->root_mode) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0 ||
            (conch_jail_warden.host_view = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC)) < 0) {
            conch_err_set(&err, errno, "keep a view of the host for attached workspaces: %s",
                          strerror(errno));
            goto setup_failed;
        }
    }
    /* The host network mode keeps the host's network namespace (asked for explicitly). */
    int newnet = plan->net == CONCH_NET_HOST ? 0 : CLONE_NEWNET;
    if (unshare(CLONE_NEWNS | newnet | CLONE_NEWIPC | CLONE_NEWUTS) < 0) {
        conch_err_set(&err, errno, "create mount, network, ipc and uts namespaces: %s",
                      strerror(errno));
        goto setup_failed;
    }
    if (plan->unshare_cgroup && unshare(CLONE_NEWCGROUP) < 0) {
        conch_err_set(&err, errno, "unshare cgroup namespace: %s", strerror(errno));
        goto setup_failed;
    }
    if (sethostname("conch", 5) < 0) {
        conch_err_set(&err, errno, "set hostname in the UTS namespace: %s", strerror(errno));
        goto setup_failed;
    }
    if (newnet && loopback_up(&err) < 0)
        goto setup_failed;
    int net_fd = -1;
    if (plan->net == CONCH_NET_ALLOW && (net_fd = proxy_listen(&err)) < 0)
        goto setup_failed;
    int ptc_fd = -1;
    if (conch_jail_mounts_setup_child(plan, &upper_fd, &ptc_fd, &err) < 0)
        goto setup_failed;
    share_workspace(plan);
    /* Nothing we start may ever gain a capability beyond @plan->keep_caps: cut the bounding
     * set here, once, rather than in every command's process (64 calls each). We keep our
     * own effective set: the bounding set only limits what an execve can grant. */
    int r = drop_bounding_caps(plan->keep_caps);
    if (r < 0) {
        conch_err_set(&err, -r, "drop capabilities from the bounding set: %s", strerror(-r));
        goto setup_failed;
    }
    /* Queued signals are charged up the user namespaces to the host user who owns the
     * sandbox: with the host's limit (~96,000), one command that queued real-time signals to
     * itself held that user's whole quota, and nothing of that user could queue one any more.
     * A sandbox's commands share one count (one uid in one namespace), so this bounds what a
     * sandbox can hold; the daemon's 256 sandboxes stay below the host's quota. Set here, once,
     * and inherited by everything we start: we and the shepherds receive only standard
     * signals, which the limit does not refuse. */
    if ((r = conch_jail_lower_rlimit(RLIMIT_SIGPENDING, SANDBOX_SIGPENDING, SANDBOX_SIGPENDING)) <
        0) {
        conch_err_set(&err, -r, "limit queued signals: %s", strerror(-r));
        goto setup_failed;
    }

    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_OK;
    m.a = upper_fd;
    int setup_fds[2], n_setup_fds = 0;
    if (ptc_fd >= 0) {
        setup_fds[n_setup_fds++] = ptc_fd;
        m.b |= JSETUP_PTC;
    }
    if (net_fd >= 0) {
        setup_fds[n_setup_fds++] = net_fd;
        m.b |= JSETUP_NET;
    }
    if (conch_jail_send(ctl, &m, setup_fds, n_setup_fds) < 0)
        _exit(1);
    /* The parent accepts on them; nothing we fork may hold them. */
    for (int i = 0; i < n_setup_fds; i++)
        close(setup_fds[i]);

    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        _exit(1);

    for (;;) {
        conch_jail_ensure_ready(plan);
        struct pollfd pfd[3] = {{.fd = ctl, .events = POLLIN},
                                {.fd = sfd, .events = POLLIN},
                                {.fd = lease_ctl, .events = POLLIN}};
        /* Wake for the next deadline, or for the refill when that comes first. */
        int timeout = slots_tick();
        int64_t wait_us = timeout >= 0 ? (int64_t)timeout * 1000 : -1;
        uint64_t now_us = conch_clock_us();
        if (conch_jail_warden.ready_slot < 0 && conch_jail_warden.refill_after_us > now_us &&
            (wait_us < 0 || (uint64_t)wait_us > conch_jail_warden.refill_after_us - now_us))
            wait_us = (int64_t)(conch_jail_warden.refill_after_us - now_us);
        struct timespec ts = {.tv_sec = wait_us / 1000000, .tv_nsec = wait_us % 1000000 * 1000};
        if (ppoll(pfd, 3, wait_us >= 0 ? &ts : NULL, NULL) < 0) {
            if (errno == EINTR)
                continue;
            _exit(1);
        }
        if (pfd[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) > 0)
                ;
            /* Shepherds, file workers, and orphans of file workers: reap them all. */
            reap_children();
        }
        if (lease_ctl >= 0 && (pfd[2].revents & (POLLIN | POLLHUP | POLLERR)))
            lease_serve(plan);
        if (!(pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        r = conch_jail_recv(ctl, &m, fds, 4, &nfds, MSG_DONTWAIT);
        if (r == -EAGAIN || r == -EPROTO)
            continue; /* a message of another version is dropped, its fds closed */
        if (r <= 0)
            _exit(0); /* parent gone: everything in the namespace dies with us */
        struct jail_msg reply = {.type = JMSG_RUN_ERR, .id = m.id};
        int started = 0;
        switch (m.type) {
        case JMSG_RUN:
        case JMSG_FILE:
        case JMSG_FILE_SERVE:
            if (conch_jail_warden.ws_released) {
                /* Never sent between the two steps of a restack; refused if it were. */
                conch_err_set(&reply.err, EBUSY, "the workspace is being restacked");
                started = -EBUSY;
            } else if (m.type == JMSG_RUN) {
                started = conch_jail_start_command(plan, &m, fds, nfds, &reply, 0);
            } else {
                started = conch_jail_start_file_worker(plan, &m, fds, nfds, &reply);
            }
            break;
        case JMSG_RESTACK: {
            struct jail_msg done = {.type = JMSG_SETUP_OK, .a = -1};
            r = m.a == JRESTACK_RELEASE ? restack_release(plan, &upper_fd, &done.err)
                                        : restack_mount(&m, fds, nfds, &upper_fd, &done.err);
            if (r < 0)
                done.type = JMSG_SETUP_ERR;
            done.a = upper_fd;
            if (conch_jail_send(ctl, &done, NULL, 0) < 0)
                _exit(1);
            break;
        }
        case JMSG_RECYCLE: {
            struct jail_msg done = {.type = JMSG_SETUP_OK, .a = -1};
            if (recycle(plan, &done.err) < 0)
                done.type = JMSG_SETUP_ERR;
            if (conch_jail_send(ctl, &done, NULL, 0) < 0 || done.type == JMSG_SETUP_ERR)
                _exit(1);
            break;
        }
        case JMSG_ATTACH: {
            struct jail_msg done = {.type = JMSG_SETUP_OK, .a = -1};
            int up = -1;
            if (attach(plan, &m, fds, nfds, &up, &done.err) < 0)
                done.type = JMSG_SETUP_ERR;
            else if (conch_jail_warden.ws_on_disk)
                upper_fd = up; /* a fork's: as a built sandbox's, released by a restack */
            done.a = up;
            if (conch_jail_send(ctl, &done, NULL, 0) < 0)
                _exit(1);
            break;
        }
        case JMSG_SIGNAL: {
            struct jail_proc_slot *s = slot_find(m.id, 0);
            if (s && m.a > 0 && m.a < NSIG)
                slot_signal(s, m.a);
            break;
        }
        case JMSG_LEASE:
            lease_revoke(true); /* a lease before (none is left by a recycle) */
            if (++lease_no == 0)
                lease_no = 1;
            if (nfds == 1) {
                lease_ctl = fds[0];
                fds[0] = -1;
            }
            break;
        case JMSG_SHUTDOWN:
        default:
            for (int i = 0; i < nfds; i++)
                close(fds[i]);
            kill_all_and_reap();
            _exit(0);
        }
        for (int i = 0; i < nfds; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        if (started < 0 && conch_jail_send(ctl, &reply, NULL, 0) < 0)
            _exit(1);
    }

setup_failed:
    memset(&m, 0, sizeof(m));
    m.type = JMSG_SETUP_ERR;
    m.err = err;
    conch_jail_send(ctl, &m, NULL, 0);
    _exit(1);
}
