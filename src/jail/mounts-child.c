/* mounts-child.c - the sandbox's root filesystem, built by the warden between clone() and
 * serving commands: a tmpfs root, read-only binds of the host's system dirs, a curated
 * /etc, own /proc with sensitive paths masked, a minimal /dev, size-limited /tmp and home,
 * and /workspace as overlay, ro or rw bind. Runs in the child: no allocation. */
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "jail/jail-internal.h"

#define OLDROOT "/oldroot"
#define UPPER_MNT "/.conch-upper"
#define LOWER_MNT "/.conch-lower"

static int fail(struct conch_err *err, const char *what, const char *path, int e)
{
    const char *hint = "";
    if (e == EPERM || e == EACCES)
        hint = " (the kernel refused it: see 'conch doctor')";
    return conch_err_set(err, e, "%s '%s': %s%s", what, path, strerror(e), hint);
}

static int do_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                    const char *data, struct conch_err *err)
{
    if (mount(src, dst, type, flags, data) < 0) {
        char what[64];
        snprintf(what, sizeof(what), "mount %s on", type ? type : "bind");
        return fail(err, what, dst, errno);
    }
    return 0;
}

/* Inodes a sandbox tmpfs of @bytes may hold. The kernel's default (half the host's RAM pages)
 * lets 200,000 empty files cost the host ~250 MB of slab that no size limit counts: one inode
 * per 8 KiB of size, at least 1024. Every tmpfs the sandbox mounts takes its bound from here. */
static unsigned long long tmpfs_inodes(uint64_t bytes)
{
    unsigned long long n = bytes / 8192;
    return n < 1024 ? 1024 : n;
}

/* A tmpfs of @bytes at @path, its inodes bounded by tmpfs_inodes(); @opts: the other options
 * (mode, owner). */
static int mount_tmpfs(const char *path, unsigned long flags, const char *opts, uint64_t bytes,
                       struct conch_err *err)
{
    char data[192];
    snprintf(data, sizeof(data), "%s,size=%llu,nr_inodes=%llu", opts, (unsigned long long)bytes,
             tmpfs_inodes(bytes));
    return do_mount("tmpfs", path, "tmpfs", flags, data, err);
}

static int make_dir(const char *path, mode_t mode, struct conch_err *err)
{
    if (mkdir(path, mode) < 0 && errno != EEXIST)
        return fail(err, "mkdir", path, errno);
    return 0;
}

/* An empty regular file to bind a file over: mknod makes it in one call, with no file opened
 * and closed (27 of them on every sandbox's setup: /etc's files and /dev's nodes). A regular
 * file already there will do; anything else there is an error, as open() made it. */
static int make_file(const char *path, struct conch_err *err)
{
    if (mknod(path, S_IFREG | 0444, 0) == 0)
        return 0;
    int e = errno;
    struct stat st;
    if (e == EEXIST && lstat(path, &st) == 0 && S_ISREG(st.st_mode))
        return 0;
    return fail(err, "create", path, e);
}

static int write_text(const char *path, const char *text, mode_t mode, struct conch_err *err)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return fail(err, "create", path, errno);
    int r = conch_write_all(fd, text, strlen(text));
    close(fd);
    if (r < 0)
        return fail(err, "write", path, -r);
    return 0;
}

/* The flags of a locked mount (nosuid, nodev, noexec, ...) may not be cleared from inside
 * a user namespace, so a read-only remount must carry over whatever the source has. */
static unsigned long locked_flags(const char *path)
{
    struct statvfs sv;
    unsigned long f = 0;
    if (statvfs(path, &sv) < 0)
        return 0;
    if (sv.f_flag & ST_NOSUID)
        f |= MS_NOSUID;
    if (sv.f_flag & ST_NODEV)
        f |= MS_NODEV;
    if (sv.f_flag & ST_NOEXEC)
        f |= MS_NOEXEC;
    if (sv.f_flag & ST_NOATIME)
        f |= MS_NOATIME;
    if (sv.f_flag & ST_NODIRATIME)
        f |= MS_NODIRATIME;
    if (sv.f_flag & ST_RELATIME)
        f |= MS_RELATIME;
    return f;
}

static int bind_mount(const char *src, const char *dst, bool is_dir, bool rw, unsigned long extra,
                      struct conch_err *err)
{
    int r = is_dir ? make_dir(dst, 0755, err) : make_file(dst, err);
    if (r < 0)
        return r;
    r = do_mount(src, dst, NULL, MS_BIND | MS_REC, NULL, err);
    if (r < 0)
        return conch_err_wrap(err, "bind '%s'", src);
    unsigned long flags = MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NODEV | extra | locked_flags(dst);
    if (!rw)
        flags |= MS_RDONLY;
    if (mount(NULL, dst, NULL, flags, NULL) < 0)
        return fail(err, rw ? "remount nosuid" : "remount read-only", dst, errno);
    return 0;
}

/*
 * inotify instances and watches are counted per user at every user namespace level up to the
 * host (kernel/ucount.c): a sandbox's are charged to the uid that owns its namespace, i.e. the
 * caller (root for a root daemon, whose systemd and udev then get EMFILE from inotify_init).
 * The sandbox namespace's own caps (/proc/sys/user/max_inotify_*, INT_MAX in a new namespace,
 * writable by its root) bound what it can take from the level above: one share in
 * INOTIFY_SHARE of the host's per-user limits, at least 1. A failed write fails the setup.
 */
#define INOTIFY_SHARE 8

static int bound_inotify(struct conch_err *err)
{
    static const char *const names[] = {"max_user_instances", "max_user_watches"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char host[64], ours[64], num[24];
        snprintf(host, sizeof(host), "/proc/sys/fs/inotify/%s", names[i]);
        snprintf(ours, sizeof(ours), "/proc/sys/user/max_inotify_%s", names[i] + 9);
        int fd = open(host, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return errno == ENOENT ? 0 : fail(err, "open", host, errno); /* no inotify */
        ssize_t n = read(fd, num, sizeof(num) - 1);
        int e = errno;
        close(fd);
        if (n <= 0)
            return fail(err, "read", host, n < 0 ? e : EIO);
        num[n] = 0;
        long long v = strtoll(num, NULL, 10) / INOTIFY_SHARE;
        int len = snprintf(num, sizeof(num), "%lld", v < 1 ? 1 : v);
        fd = open(ours, O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return fail(err, "open", ours, errno);
        n = write(fd, num, (size_t)len);
        e = errno;
        close(fd);
        if (n != len)
            return fail(err, "write", ours, n < 0 ? e : EIO);
    }
    return 0;
}

int conch_jail_proc_mount_child(const char *devnull, long pid_max, bool mask, struct conch_err *err)
{
    int r = make_dir("/proc", 0555, err);
    if (r < 0)
        return r;
    r = do_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, err);
    if (r < 0)
        return r;
    /* RLIMIT_NPROC counts per uid, and a namespace root can change uids: the pid
     * namespace's own pid_max bounds all its processes (and those of nested ones). */
    if (pid_max > 0) {
        int fd = open("/proc/sys/kernel/pid_max", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            char num[24];
            int len = snprintf(num, sizeof(num), "%ld", pid_max);
            if (write(fd, num, (size_t)len) < 0) {
                /* best effort: a global pid_max (Linux < 6.14) is not ours to set */
            }
            close(fd);
        }
        if ((r = bound_inotify(err)) < 0)
            return r;
    }
    if (!mask)
        return 0;
    /* Masked as Docker and crun do: kernel memory, the sysrq trigger and timing/keys
     * files leak host state or act on the host. A path this kernel does not have is skipped
     * (ENOENT from the mount itself: a lookup first would cost a second walk of a fresh
     * /proc, once per command). */
    static const char *const masked_files[] = {
        "/proc/kcore",         "/proc/sysrq-trigger", "/proc/timer_list", "/proc/keys",
        "/proc/latency_stats", "/proc/sched_debug",   "/proc/kallsyms",   "/proc/kmsg"};
    for (size_t i = 0; i < sizeof(masked_files) / sizeof(masked_files[0]); i++) {
        if (mount(devnull, masked_files[i], NULL, MS_BIND, NULL) < 0 && errno != ENOENT)
            return fail(err, "mask", masked_files[i], errno);
    }
    static const char *const masked_dirs[] = {"/proc/acpi", "/proc/scsi"};
    for (size_t i = 0; i < sizeof(masked_dirs) / sizeof(masked_dirs[0]); i++) {
        if (mount("tmpfs", masked_dirs[i], "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=0") <
                0 &&
            errno != ENOENT)
            return fail(err, "mount tmpfs on", masked_dirs[i], errno);
    }
    static const char *const ro_dirs[] = {"/proc/sys", "/proc/bus", "/proc/irq", "/proc/fs"};
    for (size_t i = 0; i < sizeof(ro_dirs) / sizeof(ro_dirs[0]); i++) {
        if (mount(ro_dirs[i], ro_dirs[i], NULL, MS_BIND | MS_REC, NULL) < 0) {
            if (errno == ENOENT)
                continue;
            return fail(err, "bind", ro_dirs[i], errno);
        }
        if (mount(NULL, ro_dirs[i], NULL,
                  MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
            return fail(err, "remount read-only", ro_dirs[i], errno);
    }
    return 0;
}

/* The sandbox's own terminals: a devpts instance of its own. */
static int mount_devpts(struct conch_err *err)
{
    return do_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                    "newinstance,ptmxmode=0666,mode=620", err);
}

static int mount_shm(struct conch_err *err)
{
    return mount_tmpfs("/dev/shm", MS_NOSUID | MS_NODEV, "mode=1777", 64ULL << 20, err);
}

static int setup_dev(struct conch_err *err)
{
    int r = make_dir("/dev", 0755, err);
    if (r < 0)
        return r;
    r = mount_tmpfs("/dev", MS_NOSUID | MS_NOEXEC, "mode=0755", 1ULL << 20, err);
    if (r < 0)
        return r;
    static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
        char src[64], dst[64];
        snprintf(src, sizeof(src), OLDROOT "/dev/%s", nodes[i]);
        snprintf(dst, sizeof(dst), "/dev/%s", nodes[i]);
        r = make_file(dst, err);
        if (r < 0)
            return r;
        /* Device nodes cannot be created in a user namespace: bind the host's. */
        r = do_mount(src, dst, NULL, MS_BIND, NULL, err);
        if (r < 0)
            return r;
    }
    /* nosuid and noexec on all six at once, as on /etc (not one remount each); before
     * devpts and /dev/shm, which have flags of their own. */
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC};
    if (syscall(SYS_mount_setattr, AT_FDCWD, "/dev", AT_RECURSIVE, &attr, sizeof(attr)) < 0)
        return fail(err, "make nosuid and noexec", "/dev", errno);
    r = make_dir("/dev/pts", 0755, err);
    if (r < 0 || (r = mount_devpts(err)) < 0)
        return r;
    if (symlink("pts/ptmx", "/dev/ptmx") < 0)
        return fail(err, "symlink", "/dev/ptmx", errno);
    r = make_dir("/dev/shm", 01777, err);
    if (r < 0 || (r = mount_shm(err)) < 0)
        return r;
    static const char *const links[][2] = {{"/proc/self/fd", "/dev/fd"},
                                           {"/proc/self/fd/0", "/dev/stdin"},
                                           {"/proc/self/fd/1", "/dev/stdout"},
                                           {"/proc/self/fd/2", "/dev/stderr"}};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
        if (symlink(links[i][0], links[i][1]) < 0)
            return fail(err, "symlink", links[i][1], errno);
    return 0;
}

/* A tmpfs of @bytes at @path owned by the command's user, with @mode. */
static int mount_agent_tmpfs(const struct jail_plan *plan, const char *path, unsigned mode,
                             uint64_t bytes, struct conch_err *err)
{
    char opts[96];
    snprintf(opts, sizeof(opts), "mode=%04o,uid=%u,gid=%u", mode, plan->cmd_uid, plan->cmd_gid);
    return mount_tmpfs(path, MS_NOSUID | MS_NODEV, opts, bytes, err);
}

/* A sandbox without a workspace gets a tmpfs at /workspace, sized by its disk limit. */
static int mount_workspace_tmpfs(const struct jail_plan *plan, struct conch_err *err)
{
    return mount_agent_tmpfs(plan, "/workspace", 0755, plan->disk_bytes, err);
}

/* /tmp, with the directories agent frameworks expect there (see conch_jail_mounts_setup_child). */
static int mount_tmp(const struct jail_plan *plan, struct conch_err *err)
{
    int r = mount_tmpfs("/tmp", MS_NOSUID | MS_NODEV, "mode=1777", plan->tmp_bytes, err);
    if (r < 0)
        return r;
    static const char *const agent_dirs[] = {"/tmp/large_tool_results",
                                             "/tmp/conversation_history"};
    for (size_t i = 0; i < sizeof(agent_dirs) / sizeof(agent_dirs[0]); i++) {
        if ((r = make_dir(agent_dirs[i], 0755, err)) < 0)
            return r;
        if (chown(agent_dirs[i], plan->cmd_uid, plan->cmd_gid) < 0)
            return fail(err, "chown", agent_dirs[i], errno);
    }
    return 0;
}

static int mount_home(const struct jail_plan *plan, struct conch_err *err)
{
    return mount_agent_tmpfs(plan, "/home/agent", 0700, plan->home_bytes, err);
}

static int build_workspace(const struct jail_plan *plan, const char *lower_dir, int *ret_upper_fd,
                           struct conch_err *err)
{
    int r;
    if (plan->ws_mode != CONCH_WS_OVERLAY)
        return bind_mount(lower_dir, "/workspace", true, plan->ws_mode == CONCH_WS_RW, 0, err);

    struct stat lower;
    if (stat(lower_dir, &lower) < 0)
        return fail(err, "stat workspace", lower_dir, errno);
    /* The upper: a directory kept on the host (the daemon: changes outlive the sandbox), or a
     * size-limited tmpfs that only this sandbox sees. */
    const char *base = plan->upper_on_disk ? plan->upper_dir : UPPER_MNT;
    char upper[PATH_MAX + 16], work[PATH_MAX + 16];
    snprintf(upper, sizeof(upper), "%s/upper", base);
    snprintf(work, sizeof(work), "%s/work", base);
    if (!plan->upper_on_disk) {
        r = make_dir(UPPER_MNT, 0700, err);
        if (r < 0)
            return r;
        r = mount_tmpfs(UPPER_MNT, MS_NOSUID | MS_NODEV, "mode=0755", plan->disk_bytes, err);
        if (r < 0)
            return conch_err_wrap(err, "workspace upper");
    }
    bool fresh_upper = mkdir(upper, 0755) == 0;
    if (!fresh_upper && errno != EEXIST)
        return fail(err, "mkdir", upper, errno);
    if ((r = make_dir(work, 0700, err)) < 0)
        return r;
    if (fresh_upper) {
        /* The overlay's root takes the upper dir's owner and mode: make them the lower's, so
         * the workspace root looks the same inside as on the host (owned by agent). */
        uid_t uid = lower.st_uid == 65534 ? plan->cmd_uid : lower.st_uid;
        gid_t gid = lower.st_gid == 65534 ? plan->cmd_gid : lower.st_gid;
        if (chown(upper, uid, gid) < 0)
            return fail(err, "chown workspace upper", upper, errno);
        if (chmod(upper, lower.st_mode & 07777) < 0)
            return fail(err, "chmod workspace upper", upper, errno);
    }
    /* A daemon's sandbox (its upper on disk) may have its overlay replaced without a restart
     * (a snapshot: JMSG_RESTACK). The overlay goes on a shared bind of the mount point: its
     * unmount then reaches every shepherd's copy (a slave), which an unmount of a mount whose
     * parent is private would not, and the kernel refuses it while any copy is in use. */
    if (plan->upper_on_disk)
        conch_jail_warden.ws_shared = mount("/workspace", "/workspace", NULL, MS_BIND, NULL) == 0 &&
                                      mount(NULL, "/workspace", NULL, MS_SHARED, NULL) == 0;
    /* Frozen layers (snapshots) stack above the workspace, top first. */
    char ovl[3 * PATH_MAX + sizeof(plan->ws_layers) + 128];
    int n = snprintf(ovl, sizeof(ovl), "lowerdir=%s%s,upperdir=%s,workdir=%s,userxattr",
                     plan->ws_layers, lower_dir, upper, work);
    /* mount(2) reads one page of options. */
    if (n < 0 || (size_t)n >= sizeof(ovl) || n >= 4096)
        return conch_err_set(err, ENAMETOOLONG, "workspace path too long: '%s'", lower_dir);
    if (mount("overlay", "/workspace", "overlay", MS_NOSUID | MS_NODEV, ovl) < 0) {
        int e = errno;
        return conch_err_set(err, e,
                             "mount overlay on '/workspace' (lower '%s'): %s (overlayfs in a "
                             "user namespace needs Linux >= 5.11: see 'conch doctor', or use "
                             "--mode ro|rw)",
                             lower_dir, strerror(e));
    }
    int fd = open(upper, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return fail(err, "open", upper, errno);
    /* The tmpfs stays in the tree until the extra mounts have their uppers in it too (an
     * overlay mount of conch run: m<i>/ beside upper/); hide_upper detaches it then. */
    *ret_upper_fd = fd;
    return 0;
}

/* /workspace: the host workspace bound (ro, rw) or under an overlay, else a tmpfs. As host
 * root the parent sent the idmapped tree of the workspace (conch_jail_warden.ws_tree): it is
 * attached at LOWER_MNT only while /workspace is built from it, then detached (binds and the
 * overlay hold their own references), so nothing later can reach or mount over it. */
static int setup_workspace(const struct jail_plan *plan, int *ret_upper_fd, struct conch_err *err)
{
    int tree = conch_jail_warden.ws_tree;
    conch_jail_warden.ws_tree = -1;
    int r = make_dir("/workspace", 0755, err);
    if (r < 0 || !plan->has_workspace) {
        if (tree >= 0)
            close(tree);
        return r < 0 ? r : mount_workspace_tmpfs(plan, err);
    }
    /* Fail closed: as host root the path is the host's, not idmapped. */
    if (tree < 0 && plan->root_mode)
        return conch_err_set(err, EPROTO, "the workspace's idmapped mount did not arrive");
    if (tree < 0)
        return build_workspace(plan, plan->ws_lower, ret_upper_fd, err);
    r = make_dir(LOWER_MNT, 0700, err);
    if (r == 0)
        r = conch_jail_stage_attach(tree, LOWER_MNT, err);
    close(tree);
    if (r < 0)
        return r;
    r = build_workspace(plan, LOWER_MNT, ret_upper_fd, err);
    if (umount2(LOWER_MNT, MNT_DETACH) < 0 || rmdir(LOWER_MNT) < 0) {
        if (r >= 0)
            r = fail(err, "detach the workspace's lower", LOWER_MNT, errno);
    }
    return r;
}

/* Detach the tmpfs upper from the tree: commands cannot reach it; the overlays and the upper's
 * fd keep it alive, and the host reads it through /proc/<warden>/fd (the uppers of overlay
 * mounts through the upper's parent: conch_jail_mount_upper_open). */
static int hide_upper(const struct jail_plan *plan, int upper_fd, struct conch_err *err)
{
    if (upper_fd < 0 || plan->upper_on_disk)
        return 0;
    if (umount2(UPPER_MNT, MNT_DETACH) < 0 || rmdir(UPPER_MNT) < 0)
        return fail(err, "hide workspace upper", UPPER_MNT, errno);
    return 0;
}

static int setup_etc(const struct jail_plan *plan, struct conch_err *err)
{
    int r;
    if ((r = write_text("/etc/passwd", plan->passwd, 0644, err)) < 0 ||
        (r = write_text("/etc/group", plan->group, 0644, err)) < 0 ||
        (r = write_text("/etc/hostname", "conch\n", 0644, err)) < 0 ||
        (r = write_text("/etc/hosts", "127.0.0.1\tlocalhost conch\n::1\tlocalhost\n", 0644, err)) <
            0 ||
        (r = write_text("/etc/resolv.conf",
                        plan->net == CONCH_NET_HOST    ? plan->resolv
                        : plan->net == CONCH_NET_ALLOW ? "# no DNS in this sandbox: HTTP(S) goes "
                                                         "through the proxy (HTTP_PROXY)\n"
                                                       : "# no network in this sandbox\n",
                        0644, err)) < 0)
        return r;
    return 0;
}

/* The tool bridge (docs/TOOLS.md): the host's ptc tree at /run/conch/lib with short links
 * to its parts (/node_modules makes `conch-tools` resolve from anywhere, for require and
 * import alike), and the listening socket commands connect to. The socket is made here, by
 * the warden, inside the sandbox's own root: no host path leads to it, and no other sandbox
 * can reach it. */
static int setup_ptc(const struct jail_plan *plan, int *ret_ptc_fd, struct conch_err *err)
{
    int r;
    if (!plan->ptc_socket && !plan->ptc_lib[0])
        return 0;
    if ((r = make_dir("/run/conch", 0755, err)) < 0)
        return r;
    if (plan->ptc_lib[0]) {
        static const char *const links[][2] = {{"/run/conch/bin", "lib/bin"},
                                               {"/run/conch/python", "lib/python"},
                                               {"/node_modules", "run/conch/lib/node"}};
        if ((r = bind_mount(plan->ptc_lib, "/run/conch/lib", true, false, 0, err)) < 0)
            return conch_err_wrap(err, "tool bridge");
        for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
            if (symlink(links[i][1], links[i][0]) < 0 && errno != EEXIST)
                return fail(err, "symlink", links[i][0], errno);
    }
    if (plan->ptc_socket) {
        static const char path[] = "/run/conch/ptc.sock";
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        memcpy(addr.sun_path, path, sizeof(path));
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return fail(err, "tool bridge: socket for", path, errno);
        if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 || chmod(path, 0666) < 0 ||
            listen(fd, 1024) < 0) {
            int e = errno;
            close(fd);
            return fail(err, "tool bridge: listen on", path, e);
        }
        *ret_ptc_fd = fd;
    }
    return 0;
}

/* mkdir -p @path (absolute, checked by conch_mount_check) in the new root. */
static int make_dirs(const char *path, struct conch_err *err)
{
    char p[1024];
    size_t n = strlen(path);
    if (n >= sizeof(p))
        return conch_err_set(err, ENAMETOOLONG, "mount target too long");
    memcpy(p, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (p[i] != '/' && p[i] != '\0')
            continue;
        char c = p[i];
        p[i] = '\0';
        struct stat st;
        /* Never through a link the root holds (the agent links into /tmp). */
        if (lstat(p, &st) == 0 ? !S_ISDIR(st.st_mode) : mkdir(p, 0755) < 0)
            return fail(err, "mount target: mkdir", p, errno ? errno : ENOTDIR);
        p[i] = c;
    }
    return 0;
}

/* An overlay mount: the host dir (staged read-only as root) under an upper kept beside the
 * workspace's, <upper_dir>/m<i>/{upper,work} (conch run: in the workspace upper's tmpfs, so
 * that --disk bounds both); its root looks like the host dir's. The same fences as the
 * workspace's overlay (nosuid, nodev). */
static int mount_overlay(const struct jail_plan *plan, int i, const struct jail_mount *m,
                         struct conch_err *err)
{
    char base[PATH_MAX + 16], upper[PATH_MAX + 32], work[PATH_MAX + 32];
    snprintf(base, sizeof(base), "%s/m%d", plan->upper_on_disk ? plan->upper_dir : UPPER_MNT, i);
    snprintf(upper, sizeof(upper), "%s/upper", base);
    snprintf(work, sizeof(work), "%s/work", base);
    struct stat lower;
    if (stat(m->src, &lower) < 0)
        return fail(err, "stat overlay source", m->src, errno);
    int r;
    if ((r = make_dir(base, 0700, err)) < 0 || (r = make_dir(work, 0700, err)) < 0)
        return r;
    if (mkdir(upper, 0755) == 0) {
        uid_t uid = lower.st_uid == 65534 ? plan->cmd_uid : lower.st_uid;
        gid_t gid = lower.st_gid == 65534 ? plan->cmd_gid : lower.st_gid;
        if (chown(upper, uid, gid) < 0 || chmod(upper, lower.st_mode & 07777) < 0)
            return fail(err, "chown overlay upper", upper, errno);
    } else if (errno != EEXIST) {
        return fail(err, "mkdir", upper, errno);
    }
    char ovl[3 * PATH_MAX + 128];
    int n = snprintf(ovl, sizeof(ovl), "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", m->src,
                     upper, work);
    if (n < 0 || (size_t)n >= sizeof(ovl) || n >= 4096)
        return conch_err_set(err, ENAMETOOLONG, "overlay source path too long: '%s'", m->src);
    if (mount("overlay", m->dst, "overlay", MS_NOSUID | MS_NODEV, ovl) < 0)
        return fail(err, "mount overlay of", m->src, errno);
    return 0;
}

/* The caller's extra mounts (tmpfs, bind, overlay), last before the root turns read-only. */
static int setup_extra_mounts(const struct jail_plan *plan, struct conch_err *err)
{
    for (int i = 0; i < plan->n_mounts; i++) {
        const struct jail_mount *m = &plan->mounts[i];
        int r;
        errno = 0;
        if ((r = make_dirs(m->dst, err)) < 0)
            return r;
        if (m->type == CONCH_MOUNT_TMPFS)
            r = mount_agent_tmpfs(plan, m->dst, 0755, m->bytes, err);
        else if (m->type == CONCH_MOUNT_OVERLAY)
            r = mount_overlay(plan, i, m, err);
        else
            r = bind_mount(m->src, m->dst, true, m->rw, 0, err);
        if (r < 0)
            return conch_err_wrap(err, "mount '%s'", m->dst);
    }
    return 0;
}

/* mkdir -p of @path's parent dirs on the new root (never through a link, as make_dirs). */
static int make_parent_dirs(const char *path, struct conch_err *err)
{
    char p[CONCH_SOCKET_PATH_MAX];
    size_t n = strlen(path);
    if (n >= sizeof(p))
        return conch_err_set(err, ENAMETOOLONG, "socket path too long");
    memcpy(p, path, n + 1);
    char *slash = strrchr(p, '/');
    if (!slash || slash == p)
        return 0;
    *slash = '\0';
    errno = 0;
    return make_dirs(p, err);
}

int conch_jail_sockets_setup_child(const struct jail_plan *plan, struct conch_err *err)
{
    for (int i = 0; i < plan->n_sockets && i < CONCH_SPEC_SOCKETS_MAX; i++) {
        const struct jail_socket *s = &plan->sockets[i];
        /* The file the parent checked, or nothing: a path swapped meanwhile (a link, another
         * socket) is refused, and the bind is made from this fd, never by the path again. */
        int fd = open(s->src, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            return fail(err, "socket: open", s->src, errno);
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) || st.st_dev != s->dev ||
            st.st_ino != s->ino) {
            close(fd);
            return conch_err_setk(err, CONCH_ERR_USAGE, ESTALE,
                                  "socket for '%s' changed while the sandbox was being built: "
                                  "refused",
                                  s->dst);
        }
        char via[64];
        snprintf(via, sizeof(via), "/proc/self/fd/%d", fd);
        int r = make_parent_dirs(s->dst, err);
        if (r >= 0)
            r = bind_mount(via, s->dst, false, false, MS_NOEXEC, err);
        close(fd);
        if (r < 0)
            return conch_err_wrap(err, "socket '%s'", s->dst);
    }
    return 0;
}

int conch_jail_mounts_setup_child(const struct jail_plan *plan, int *ret_upper_fd, int *ret_ptc_fd,
                                  struct conch_err *err)
{
    int r;
    *ret_upper_fd = -1;
    *ret_ptc_fd = -1;
    /* Nothing we mount may propagate back to the host, nor host mounts in. */
    if ((r = do_mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL, err)) < 0)
        return r;
    /* The new root: a tmpfs mounted on /tmp, then pivot_root into it with the old root
     * kept at /oldroot until every bind is made (the bubblewrap way). */
    if ((r = mount_tmpfs("/tmp", MS_NOSUID | MS_NODEV, "mode=0755", 4ULL << 20, err)) < 0)
        return conch_err_wrap(err, "sandbox root");
    if ((r = make_dir("/tmp" OLDROOT, 0700, err)) < 0)
        return r;
    if (syscall(SYS_pivot_root, "/tmp", "/tmp" OLDROOT) < 0)
        return fail(err, "pivot_root to", "/tmp", errno);
    if (chdir("/") < 0)
        return fail(err, "chdir", "/", errno);

    if (plan->curated_etc) {
        /* /etc is its own tmpfs so that one recursive mount_setattr() makes it and every
         * bind in it read-only, instead of one remount per entry (start-up time). */
        if ((r = make_dir("/etc", 0755, err)) < 0 ||
            (r = mount_tmpfs("/etc", MS_NOSUID | MS_NODEV, "mode=0755", 1ULL << 20, err)) < 0 ||
            (r = setup_etc(plan, err)) < 0)
            return r;
    }
    for (int i = 0; i < plan->n_binds; i++) {
        const struct jail_bind *b = &plan->binds[i];
        const char *src = jail_bind_src(plan, b), *dst = jail_bind_dst(plan, b);
        if (plan->curated_etc && !strncmp(dst, "/etc/", 5)) {
            r = b->is_dir ? make_dir(dst, 0755, err) : make_file(dst, err);
            if (r < 0 || (r = do_mount(src, dst, NULL, MS_BIND | MS_REC, NULL, err)) < 0)
                return r;
            continue;
        }
        if ((r = bind_mount(src, dst, b->is_dir, b->rw, 0, err)) < 0)
            return r;
    }
    if (plan->curated_etc) {
        struct mount_attr attr = {.attr_set =
                                      MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
        if (syscall(SYS_mount_setattr, AT_FDCWD, "/etc", AT_RECURSIVE, &attr, sizeof(attr)) < 0)
            return fail(err, "make read-only", "/etc", errno);
    }
    for (int i = 0; i < plan->n_links; i++)
        if (symlink(plan->links[i].target, plan->links[i].path) < 0 && errno != EEXIST)
            return fail(err, "symlink", plan->links[i].path, errno);
    /* Our /proc is seen only by us, by the file workers and JS workers we fork (which run
     * in our mount and pid namespaces) and by a shepherd until it mounts its own, masked, for
     * its command. Without file or JS workers (conch run) nothing runs under ours that is
     * not us: it is not masked (18 mount calls less on conch run's path). It still has to be
     * mounted: a shepherd may mount a new procfs only where one is fully visible. */
    bool mask_proc = plan->file_handler || plan->js_server;
    if ((r = conch_jail_proc_mount_child(OLDROOT "/dev/null", plan->pid_max, mask_proc, err)) < 0 ||
        (r = setup_dev(err)) < 0)
        return r;

    if ((r = make_dir("/tmp", 01777, err)) < 0 || (r = mount_tmp(plan, err)) < 0)
        return r;
    if ((r = make_dir("/home", 0755, err)) < 0 || (r = make_dir("/home/agent", 0700, err)) < 0 ||
        (r = mount_home(plan, err)) < 0)
        return r;
    if ((r = make_dir("/run", 0755, err)) < 0 || (r = make_dir("/var", 0755, err)) < 0)
        return r;
    if (symlink("/tmp", "/var/tmp") < 0 && errno != EEXIST)
        return fail(err, "symlink", "/var/tmp", errno);
    /* Where agent frameworks write outside the workspace (deepagents offloads big tool
     * results to /large_tool_results and history to /conversation_history): links into
     * /tmp (made there by mount_tmp), so the root stays read-only and they count against
     * the size of /tmp. */
    static const char *const agent_links[][2] = {
        {"/tmp/large_tool_results", "/large_tool_results"},
        {"/tmp/conversation_history", "/conversation_history"},
    };
    for (size_t i = 0; i < sizeof(agent_links) / sizeof(agent_links[0]); i++)
        if (symlink(agent_links[i][0], agent_links[i][1]) < 0 && errno != EEXIST)
            return fail(err, "symlink", agent_links[i][1], errno);
    if ((r = setup_workspace(plan, ret_upper_fd, err)) < 0 ||
        (r = conch_jail_rules_apply_child(plan, err)) < 0 ||
        (r = setup_ptc(plan, ret_ptc_fd, err)) < 0 || (r = setup_extra_mounts(plan, err)) < 0 ||
        (r = hide_upper(plan, *ret_upper_fd, err)) < 0 ||
        (r = conch_jail_sockets_setup_child(plan, err)) < 0)
        return r;

    if (umount2(OLDROOT, MNT_DETACH) < 0)
        return fail(err, "detach old root", OLDROOT, errno);
    if (rmdir(OLDROOT) < 0)
        return fail(err, "rmdir", OLDROOT, errno);
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
        return fail(err, "remount read-only", "/", errno);
    return 0;
}

/* The first step of renewing the mount at @path: take the old one away. */
static int unmount(const char *path, struct conch_err *err)
{
    return umount2(path, MNT_DETACH) < 0 ? fail(err, "unmount", path, errno) : 0;
}

int conch_jail_mounts_scrub_child(const struct jail_plan *plan, struct conch_err *err)
{
    if (plan->has_workspace)
        return conch_err_set(err, EINVAL, "a sandbox with a workspace is not reused");
    int r;
    if ((r = unmount("/tmp", err)) < 0 || (r = mount_tmp(plan, err)) < 0 ||
        (r = unmount("/home/agent", err)) < 0 || (r = mount_home(plan, err)) < 0 ||
        (r = unmount("/dev/shm", err)) < 0 || (r = mount_shm(err)) < 0 ||
        (r = unmount("/dev/pts", err)) < 0 || (r = mount_devpts(err)) < 0)
        return r;
    /* An attached workspace is mounted over the empty one: every layer goes. */
    int layers = 0;
    while (umount2("/workspace", MNT_DETACH) == 0)
        layers++;
    if (errno != EINVAL || layers == 0)
        return fail(err, "unmount", "/workspace", errno);
    return mount_workspace_tmpfs(plan, err);
}

/* ---- a workspace attached to a sandbox built without one (JMSG_ATTACH) ---- */

static int fsconfig_str(int fs, const char *key, const char *value)
{
    return (int)syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, key, value, 0);
}

int conch_jail_overlay_make(int lower, uid_t uid, gid_t gid, mode_t mode, uint64_t bytes,
                            int *ret_mnt, int *ret_upper, struct conch_err *err)
{
    *ret_mnt = *ret_upper = -1;
    char size[32], inodes[32];
    snprintf(size, sizeof(size), "%llu", (unsigned long long)bytes);
    snprintf(inodes, sizeof(inodes), "%llu", tmpfs_inodes(bytes));
    const char *step = "create the upper's tmpfs";
    int fs = -1, tmp = -1, up = -1, work = -1, ovl = -1, mnt = -1;
    fs = (int)syscall(SYS_fsopen, "tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0 || fsconfig_str(fs, "size", size) < 0 || fsconfig_str(fs, "nr_inodes", inodes) < 0 ||
        fsconfig_str(fs, "mode", "0700") < 0 ||
        syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        goto out;
    tmp = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (tmp < 0)
        goto out;
    step = "make the upper and work dirs";
    if (mkdirat(tmp, "upper", 0755) < 0 || mkdirat(tmp, "work", 0700) < 0)
        goto out;
    up = openat(tmp, "upper", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    work = openat(tmp, "work", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    /* The overlay's root takes the upper dir's owner and mode: the workspace root looks
     * inside as it does on the host. */
    if (up < 0 || work < 0 || fchown(up, uid, gid) < 0 || fchmod(up, mode & 07777) < 0)
        goto out;
    step = "create the overlay (Linux >= 6.13 takes its layers as fds)";
    ovl = (int)syscall(SYS_fsopen, "overlay", FSOPEN_CLOEXEC);
    if (ovl < 0 || syscall(SYS_fsconfig, ovl, FSCONFIG_SET_FD, "lowerdir+", NULL, lower) < 0 ||
        syscall(SYS_fsconfig, ovl, FSCONFIG_SET_FD, "upperdir", NULL, up) < 0 ||
        syscall(SYS_fsconfig, ovl, FSCONFIG_SET_FD, "workdir", NULL, work) < 0 ||
        syscall(SYS_fsconfig, ovl, FSCONFIG_SET_FLAG, "userxattr", NULL, 0) < 0 ||
        syscall(SYS_fsconfig, ovl, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        goto out;
    mnt = (int)syscall(SYS_fsmount, ovl, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
out:;
    int e = errno;
    /* The tmpfs stays alive through the overlay; only the overlay and its upper dir are
     * handed out. */
    int tmp_fds[] = {fs, tmp, work, ovl};
    for (size_t i = 0; i < sizeof(tmp_fds) / sizeof(tmp_fds[0]); i++)
        if (tmp_fds[i] >= 0)
            close(tmp_fds[i]);
    if (mnt < 0) {
        if (up >= 0)
            close(up);
        return conch_err_set(err, e, "attach the workspace: %s: %s", step, strerror(e));
    }
    *ret_mnt = mnt;
    *ret_upper = up;
    return 0;
}
