/* probe.c - feature probes for `conch doctor`: each kernel fence is tested by trying it
 * for real, in a short-lived forked child when it would change the caller's namespaces,
 * credentials or seccomp state, and each failure comes with a concrete fix. */
#include "jail/probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "jail/cgroup.h"
#include "jail/probe-internal.h"
#include "net/net.h"

/* A probe that hangs (a stuck mount, say) must not hang `conch doctor`. */
#define PROBE_TIMEOUT_S 10

void conch_probe_text(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* Append a line to a fix string; `conch doctor` prints each line as "fix: ...". */
void conch_probe_add_fix(char *buf, size_t len, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used && used + 1 < len)
        buf[used++] = '\n';
    if (used >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, len - used, fmt, ap);
    va_end(ap);
}

/* Read a small integer sysctl; -1 when absent. */
static long read_sysctl(const char *path)
{
    _cleanup_fclose_ FILE *f = fopen(path, "re");
    long v = -1;
    if (!f || fscanf(f, "%ld", &v) != 1)
        return -1;
    return v;
}

/* ---- running a probe in a child ---- */

struct child_report {
    int code; /* 0 or a positive errno */
    char detail[256];
};

/*
 * Run @fn in a forked child and copy its result and detail back. The child sends a
 * fixed-size report over a CLOEXEC pipe (no allocation after fork). Returns 0 or -errno
 * from @fn, or -ECHILD with @detail saying how the child died.
 */
int conch_probe_in_child(conch_probe_child_fn fn, char *detail, size_t len)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        conch_probe_text(detail, len, "pipe: %s", strerror(errno));
        return -errno;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(p[0]);
        close(p[1]);
        conch_probe_text(detail, len, "fork: %s", strerror(e));
        return -e;
    }
    if (pid == 0) {
        struct child_report rep = {0};
        close(p[0]);
        alarm(PROBE_TIMEOUT_S);
        int r = fn(rep.detail, sizeof(rep.detail));
        rep.code = r < 0 ? -r : 0;
        ssize_t n = write(p[1], &rep, sizeof(rep));
        _exit(n == (ssize_t)sizeof(rep) ? 0 : 1);
    }
    close(p[1]);
    struct child_report rep = {0};
    size_t got = 0;
    while (got < sizeof(rep)) {
        ssize_t n = read(p[0], (char *)&rep + got, sizeof(rep) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (got != sizeof(rep)) {
        if (WIFSIGNALED(st))
            conch_probe_text(detail, len, "probe child killed by signal %d%s", WTERMSIG(st),
                             WTERMSIG(st) == SIGALRM ? " (timed out)" : "");
        else
            conch_probe_text(detail, len, "probe child exited with status %d", WEXITSTATUS(st));
        return -ECHILD;
    }
    rep.detail[sizeof(rep.detail) - 1] = '\0';
    conch_probe_text(detail, len, "%s", rep.detail);
    return -rep.code;
}

/* ---- child-side helpers: no allocation, errors go to @detail ---- */

static int write_proc(const char *path, const char *data)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, data, strlen(data));
    int e = errno;
    close(fd);
    return n < 0 ? -e : 0;
}

/* unshare a user namespace (plus @flags) and map ourselves to root in it, the way an
 * unprivileged conch does: setgroups must be denied before an unprivileged gid_map. */
int conch_probe_enter_userns(int flags, const char *flag_name, char *detail, size_t len)
{
    uid_t uid = getuid();
    gid_t gid = getgid();
    if (unshare(CLONE_NEWUSER | flags) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "unshare(CLONE_NEWUSER%s%s): %s", flags ? "|" : "", flag_name,
                         strerror(e));
        return -e;
    }
    char map[64];
    int r = write_proc("/proc/self/setgroups", "deny");
    if (r < 0 && r != -ENOENT) {
        conch_probe_text(detail, len, "write /proc/self/setgroups: %s", strerror(-r));
        return r;
    }
    snprintf(map, sizeof(map), "0 %u 1", (unsigned)uid);
    r = write_proc("/proc/self/uid_map", map);
    if (r < 0) {
        conch_probe_text(detail, len, "write uid_map '%s': %s", map, strerror(-r));
        return r;
    }
    snprintf(map, sizeof(map), "0 %u 1", (unsigned)gid);
    r = write_proc("/proc/self/gid_map", map);
    if (r < 0) {
        conch_probe_text(detail, len, "write gid_map '%s': %s", map, strerror(-r));
        return r;
    }
    return 0;
}

/* A private mount namespace with a fresh tmpfs on /tmp, inside a user namespace. */
static int enter_mountns_tmpfs(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(CLONE_NEWNS, "CLONE_NEWNS", detail, len);
    if (r < 0)
        return r;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "make / private: %s", strerror(e));
        return -e;
    }
    if (mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") < 0) {
        int e = errno;
        conch_probe_text(detail, len, "mount tmpfs on /tmp: %s", strerror(e));
        return -e;
    }
    return 0;
}

static int child_userns(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(0, "", detail, len);
    if (r < 0)
        return r;
    if (getuid() != 0) {
        conch_probe_text(detail, len, "uid map written but uid is %u, not 0", (unsigned)getuid());
        return -EPERM;
    }
    conch_probe_text(detail, len, "unshare and a uid/gid map work");
    return 0;
}

static int child_mountns(char *detail, size_t len)
{
    int r = enter_mountns_tmpfs(detail, len);
    if (r < 0)
        return r;
    int fd = open("/tmp/probe", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        conch_probe_text(detail, len, "create a file on the new tmpfs: %s", strerror(e));
        return -e;
    }
    close(fd);
    conch_probe_text(detail, len, "private mount namespace, tmpfs mounted");
    return 0;
}

static int child_overlay(char *detail, size_t len)
{
    int r = enter_mountns_tmpfs(detail, len);
    if (r < 0)
        return r;
    const char *dirs[] = {"/tmp/l", "/tmp/u", "/tmp/w", "/tmp/m"};
    for (size_t i = 0; i < ARRAY_SIZE(dirs); i++) {
        if (mkdir(dirs[i], 0755) < 0) {
            int e = errno;
            conch_probe_text(detail, len, "mkdir %s: %s", dirs[i], strerror(e));
            return -e;
        }
    }
    /* userxattr (Linux 5.11) keeps overlay metadata in user.* xattrs, which an
     * unprivileged mounter may write; without it the mount is refused in a userns. */
    if (mount("overlay", "/tmp/m", "overlay", 0,
              "lowerdir=/tmp/l,upperdir=/tmp/u,workdir=/tmp/w,userxattr") < 0) {
        int e = errno;
        conch_probe_text(detail, len, "mount overlay (userxattr): %s", strerror(e));
        return -e;
    }
    int fd = open("/tmp/m/probe", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        conch_probe_text(detail, len, "write through the overlay: %s", strerror(e));
        return -e;
    }
    close(fd);
    struct stat st;
    if (stat("/tmp/u/probe", &st) < 0) {
        conch_probe_text(detail, len,
                         "file written through the overlay missing from its upper dir");
        return -EIO;
    }
    conch_probe_text(detail, len, "overlay with userxattr mounted and written");
    return 0;
}

static int child_pidns(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(CLONE_NEWPID, "CLONE_NEWPID", detail, len);
    if (r < 0)
        return r;
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        conch_probe_text(detail, len, "fork into the new pid namespace: %s", strerror(e));
        return -e;
    }
    if (pid == 0)
        _exit(getpid() == 1 ? 0 : 1);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        conch_probe_text(detail, len, "first process in the namespace is not pid 1");
        return -EIO;
    }
    conch_probe_text(detail, len, "first process is pid 1");
    return 0;
}

static int child_netns(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(CLONE_NEWNET, "CLONE_NEWNET", detail, len);
    if (r < 0)
        return r;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        conch_probe_text(detail, len, "socket in the new namespace: %s", strerror(e));
        return -e;
    }
    /* Bringing up lo is what the sandbox does first; it needs CAP_NET_ADMIN there. */
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    int ok = ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags |= IFF_UP;
    ok = ok && ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    int e = errno;
    close(fd);
    if (!ok) {
        conch_probe_text(detail, len, "bring up lo: %s", strerror(e));
        return -e;
    }
    conch_probe_text(detail, len, "empty network namespace, lo up");
    return 0;
}

static int child_seccomp(char *detail, size_t len)
{
    int mode = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);
    if (mode < 0) {
        int e = errno;
        conch_probe_text(detail, len, "prctl(PR_GET_SECCOMP): %s", strerror(e));
        return -e;
    }
    static const struct {
        uint32_t action;
        const char *name;
    } actions[] = {
        {SECCOMP_RET_KILL_PROCESS, "kill_process"},
        {SECCOMP_RET_ERRNO, "errno"},
        {SECCOMP_RET_USER_NOTIF, "user_notif"},
        {SECCOMP_RET_LOG, "log"},
    };
    char avail[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < ARRAY_SIZE(actions); i++) {
        uint32_t a = actions[i].action;
        if (syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &a) == 0 &&
            used + strlen(actions[i].name) + 2 < sizeof(avail)) {
            used += (size_t)snprintf(avail + used, sizeof(avail) - used, "%s%s", used ? " " : "",
                                     actions[i].name);
        }
    }
    /* Actually install a filter (allow everything), as the sandbox will. */
    struct sock_filter insn[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {.len = 1, .filter = insn};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "install a seccomp filter: %s", strerror(e));
        return -e;
    }
    conch_probe_text(detail, len, "filter mode; actions: %s%s", avail[0] ? avail : "unknown",
                     mode == 2 ? "; conch already runs under a filter (container?)" : "");
    if (!strstr(avail, "kill_process") || !strstr(avail, "errno"))
        return -EOPNOTSUPP;
    return 0;
}

/* ---- the probes ---- */

/* Fixes for a user namespace that cannot be created or used; @rc is the probe's -errno. */
static void userns_fixes(char *fix, size_t len, int rc)
{
    long restrict_aa = read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
    long clone = read_sysctl("/proc/sys/kernel/unprivileged_userns_clone");
    long max = read_sysctl("/proc/sys/user/max_user_namespaces");
    bool added = false;
    /* ENOSPC: the per-namespace count is exhausted; nested sandboxes often set it to 0
     * or 1 for their children. */
    if (max == 0) {
        conch_probe_add_fix(fix, len, "sysctl -w user.max_user_namespaces=15000");
        added = true;
    } else if (rc == -ENOSPC) {
        conch_probe_add_fix(
            fix, len,
            "no user namespace can be created from here: an enclosing container or "
            "sandbox forbids nesting them (e.g. bwrap --disable-userns), or "
            "user.max_user_namespaces=%ld is used up; run conch outside it or raise the "
            "limit",
            max);
        added = true;
    }
    if (clone == 0) {
        conch_probe_add_fix(fix, len, "sysctl -w kernel.unprivileged_userns_clone=1");
        added = true;
    }
    if (restrict_aa == 1) {
        conch_probe_add_fix(
            fix, len,
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or install an "
            "AppArmor profile for conch that allows 'userns,'");
        added = true;
    }
    if (!added)
        conch_probe_add_fix(
            fix, len,
            "enable user namespaces (CONFIG_USER_NS); in a container, allow unshare and "
            "mount: a seccomp profile such as deploy/seccomp/conch.json (or "
            "seccomp=unconfined) and apparmor=unconfined (the settings to grant are listed below)");
}

/* Fixes for a probe that needs a user namespace plus @what: when the user namespace part
 * failed, point there instead of at the feature itself. */
void conch_probe_ns_fixes(char *fix, size_t len, int rc, const char *detail, const char *specific)
{
    /* EINVAL from a combined unshare means the other namespace type is missing. */
    bool userns = (!strncmp(detail, "unshare(CLONE_NEWUSER", 21) && rc != -EINVAL) ||
                  strstr(detail, "_map") || strstr(detail, "setgroups");
    bool apparmor =
        read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == 1 && rc == -EPERM;
    if (userns || apparmor)
        userns_fixes(fix, len, rc);
    if (!userns && specific)
        conch_probe_add_fix(fix, len, "%s", specific);
}

static void probe_userns(struct conch_probe_result *r)
{
    r->name = "user namespaces";
    r->required = true;
    int rc = conch_probe_in_child(child_userns, r->detail, sizeof(r->detail));
    if (rc < 0) {
        r->state = CONCH_PROBE_MISSING;
        userns_fixes(r->fix, sizeof(r->fix), rc);
        return;
    }
    r->state = CONCH_PROBE_OK;
    long max = read_sysctl("/proc/sys/user/max_user_namespaces");
    if (max > 0) {
        size_t n = strlen(r->detail);
        conch_probe_text(r->detail + n, sizeof(r->detail) - n, " (max_user_namespaces=%ld)", max);
    }
}

/* The mount, pid and network namespace probes: all run inside a user namespace, as an
 * unprivileged conch does. */
static void probe_ns(struct conch_probe_result *r, const char *name, conch_probe_child_fn fn,
                     const char *specific_fix)
{
    r->name = name;
    r->required = true;
    int rc = conch_probe_in_child(fn, r->detail, sizeof(r->detail));
    if (rc == 0) {
        r->state = CONCH_PROBE_OK;
        return;
    }
    r->state = CONCH_PROBE_MISSING;
    conch_probe_ns_fixes(r->fix, sizeof(r->fix), rc, r->detail, specific_fix);
}

static void probe_mountns(struct conch_probe_result *r)
{
    probe_ns(r, "mount namespace", child_mountns,
             "mount(2) is blocked: in a container, allow it (a seccomp profile such as "
             "deploy/seccomp/conch.json, or seccomp=unconfined, and apparmor=unconfined)");
}

static void probe_pidns(struct conch_probe_result *r)
{
    probe_ns(r, "pid namespace", child_pidns, "enable CONFIG_PID_NS in the kernel");
}

/* ---- the network modes (docs/ARCHITECTURE.md, "Network") ---- */

/* The allow mode: the sandbox's own namespace with lo up, where the warden listens at
 * 127.0.0.1:3128 for the proxy (the only way out); a command there must reach it. */
static int child_net_allow(char *detail, size_t len)
{
    int r = child_netns(detail, len);
    if (r < 0)
        return r;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(CONCH_NET_PROXY_PORT)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const char *step = "socket";
    if (l >= 0 && (step = "bind 127.0.0.1:3128", bind(l, (struct sockaddr *)&a, sizeof(a))) == 0 &&
        (step = "listen", listen(l, 1)) == 0) {
        int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        step = "connect to the proxy's listener";
        int ok = c >= 0 && connect(c, (struct sockaddr *)&a, sizeof(a)) == 0;
        int e = errno;
        if (c >= 0)
            close(c);
        close(l);
        if (!ok) {
            conch_probe_text(detail, len, "%s: %s", step, strerror(e));
            return -e;
        }
        conch_probe_text(detail, len, "own namespace; the proxy's listener at 127.0.0.1:%d reached",
                         CONCH_NET_PROXY_PORT);
        return 0;
    }
    int e = errno;
    if (l >= 0)
        close(l);
    conch_probe_text(detail, len, "%s in the sandbox's namespace: %s", step, strerror(e));
    return -e;
}

/* The host mode: a user namespace that keeps the host's network namespace. */
static int child_net_host(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(0, "", detail, len);
    if (r < 0)
        return r;
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "list the host's interfaces: %s", strerror(e));
        return -e;
    }
    int up = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
        if (i->ifa_addr &&
            (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6) &&
            (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK))
            up++;
    freeifaddrs(ifs);
    if (!up) {
        conch_probe_text(detail, len,
                         "the host's namespace is kept, but no interface but lo is up");
        return -ENETDOWN;
    }
    conch_probe_text(detail, len, "the host's namespace is kept (%d addresses up besides lo)", up);
    return 0;
}

/* Whether the host has a resolver for the proxy (it resolves every name itself). */
static bool host_has_nameserver(void)
{
    FILE *f = fopen("/etc/resolv.conf", "re");
    if (!f)
        return false;
    char line[256];
    bool found = false;
    while (!found && fgets(line, sizeof(line), f))
        found = !strncmp(line, "nameserver", 10);
    fclose(f);
    return found;
}

static void probe_net_none(struct conch_probe_result *r)
{
    probe_ns(r, "network mode none", child_netns,
             "enable CONFIG_NET_NS in the kernel (without it no sandbox can be built: 'none' "
             "is the default)");
    if (r->state == CONCH_PROBE_OK)
        conch_probe_text(r->detail, sizeof(r->detail),
                         "the default: an own network namespace, loopback up and nothing else");
}

static void probe_net_allow(struct conch_probe_result *r)
{
    r->name = "network mode allow";
    r->required = false;
    int rc = conch_probe_in_child(child_net_allow, r->detail, sizeof(r->detail));
    if (rc < 0) {
        r->state = CONCH_PROBE_MISSING;
        conch_probe_ns_fixes(
            r->fix, sizeof(r->fix), rc, r->detail,
            "the allow mode needs a network namespace with loopback where conch listens at "
            "127.0.0.1:3128: enable CONFIG_NET_NS, or use --net host");
        return;
    }
    r->state = CONCH_PROBE_OK;
    if (!host_has_nameserver()) {
        r->state = CONCH_PROBE_PARTIAL;
        size_t n = strlen(r->detail);
        conch_probe_text(r->detail + n, sizeof(r->detail) - n,
                         "; no nameserver in /etc/resolv.conf");
        conch_probe_add_fix(
            r->fix, sizeof(r->fix),
            "the proxy resolves names on the host: add a nameserver to /etc/resolv.conf "
            "(until then only IP-literal rules, or the daemon's --net-hosts, are reached)");
    }
}

static void probe_net_host(struct conch_probe_result *r)
{
    r->name = "network mode host";
    r->required = false;
    int rc = conch_probe_in_child(child_net_host, r->detail, sizeof(r->detail));
    if (rc == 0) {
        r->state = CONCH_PROBE_OK;
        return;
    }
    if (rc == -ENETDOWN) {
        r->state = CONCH_PROBE_PARTIAL;
        conch_probe_add_fix(
            r->fix, sizeof(r->fix),
            "the host itself has no network: bring up an interface (--net host gives the "
            "sandbox only what the host has)");
        return;
    }
    r->state = CONCH_PROBE_MISSING;
    conch_probe_ns_fixes(r->fix, sizeof(r->fix), rc, r->detail, NULL);
}

static void probe_overlay(struct conch_probe_result *r)
{
    r->name = "overlay in a user namespace";
    /* Only the default 'overlay' workspace mode needs it; 'ro' and 'rw' work without. */
    r->required = false;
    int rc = conch_probe_in_child(child_overlay, r->detail, sizeof(r->detail));
    if (rc == 0) {
        r->state = CONCH_PROBE_OK;
    } else {
        r->state = CONCH_PROBE_MISSING;
        struct utsname u;
        char specific[200];
        conch_probe_text(
            specific, sizeof(specific),
            "overlayfs in a user namespace needs Linux 5.11+ with CONFIG_OVERLAY_FS (this "
            "kernel: %s)",
            uname(&u) == 0 ? u.release : "unknown");
        /* Failing before the overlay mount means the namespace part is the problem. */
        bool before = !strstr(r->detail, "overlay");
        conch_probe_ns_fixes(r->fix, sizeof(r->fix), rc, r->detail, before ? NULL : specific);
        if (before && !r->fix[0])
            conch_probe_add_fix(r->fix, sizeof(r->fix), "see 'mount namespace' above");
        conch_probe_add_fix(r->fix, sizeof(r->fix),
                            "or use workspace mode 'ro' or 'rw' instead of 'overlay'");
    }
    size_t n = strlen(r->detail);
    conch_probe_text(r->detail + n, sizeof(r->detail) - n,
                     "; needed for the 'overlay' workspace mode");
}

static void probe_seccomp(struct conch_probe_result *r)
{
    r->name = "seccomp";
    r->required = true;
    int rc = conch_probe_in_child(child_seccomp, r->detail, sizeof(r->detail));
    if (rc == 0) {
        r->state = CONCH_PROBE_OK;
        return;
    }
    r->state = rc == -EOPNOTSUPP ? CONCH_PROBE_PARTIAL : CONCH_PROBE_MISSING;
    conch_probe_add_fix(
        r->fix, sizeof(r->fix),
        "use a kernel built with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y (Linux "
        "4.14+ for the kill_process action)");
}

static void probe_landlock(struct conch_probe_result *r)
{
    r->name = "landlock";
    r->required = false;
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    if (abi > 0) {
        r->state = CONCH_PROBE_OK;
        conch_probe_text(r->detail, sizeof(r->detail), "ABI %ld", abi);
        return;
    }
    int e = errno;
    r->state = CONCH_PROBE_MISSING;
    conch_probe_text(r->detail, sizeof(r->detail), "landlock_create_ruleset: %s", strerror(e));
    if (e == EOPNOTSUPP) {
        _cleanup_fclose_ FILE *f = fopen("/sys/kernel/security/lsm", "re");
        char lsm[200] = "";
        if (f && fgets(lsm, sizeof(lsm), f))
            lsm[strcspn(lsm, "\n")] = '\0';
        conch_probe_add_fix(
            r->fix, sizeof(r->fix),
            "Landlock is built in but not enabled: boot with lsm=landlock%s%s (add it "
            "to GRUB_CMDLINE_LINUX, then update-grub and reboot)",
            lsm[0] ? "," : ",...", lsm);
    } else {
        conch_probe_add_fix(
            r->fix, sizeof(r->fix),
            "use Linux 5.13+ built with CONFIG_SECURITY_LANDLOCK=y and boot with "
            "lsm=...,landlock; without it conch relies on the mount namespace alone");
    }
}

static void probe_cgroups(struct conch_probe_result *r)
{
    r->name = "cgroups";
    r->required = false;
    struct conch_cgroup cg = {0};
    struct conch_err err = {0};
    char name[64];
    snprintf(name, sizeof(name), "probe-%d", (int)getpid());
    struct conch_cgroup_limits lim = {
        .memory_bytes = 1ULL << 30, .pids_max = 1024, .cpu_millicpus = 1000};
    int rc = conch_cgroup_create(&cg, name, &lim, &err);
    bool no_cpu = false;
    if (rc < 0) {
        lim.cpu_millicpus = 0;
        no_cpu = conch_cgroup_create(&cg, name, &lim, NULL) == 0;
    }
    if (rc < 0 && !no_cpu) {
        r->state = CONCH_PROBE_MISSING;
        /* Drop the "create cgroup 'probe-N': " context; the name means nothing here. */
        const char *why = strstr(err.msg, "': ");
        conch_probe_text(r->detail, sizeof(r->detail), "%s", why ? why + 3 : err.msg);
        conch_probe_add_fix(
            r->fix, sizeof(r->fix),
            "run conch as root, or start it in a leaf cgroup of a delegated cgroup v2 "
            "subtree (e.g. a systemd unit with Delegate=yes); meanwhile conch falls back "
            "to per-process rlimits");
        return;
    }
    if (cg.v2)
        conch_probe_text(r->detail, sizeof(r->detail), "v2 at %s: memory, pids%s", cg.path_v2,
                         no_cpu ? "" : ", cpu");
    else
        conch_probe_text(r->detail, sizeof(r->detail), "v1%s:%s%s%s",
                         geteuid() == 0 ? " as root" : "", cg.path_mem[0] ? " memory" : "",
                         cg.path_pids[0] ? " pids" : "", cg.path_cpu[0] ? " cpu" : "");
    (void)conch_cgroup_destroy(&cg, NULL);
    if (no_cpu) {
        r->state = CONCH_PROBE_PARTIAL;
        size_t n = strlen(r->detail);
        conch_probe_text(r->detail + n, sizeof(r->detail) - n, " (no cpu controller: %s)", err.msg);
        conch_probe_add_fix(r->fix, sizeof(r->fix),
                            "enable the cpu controller (v1: mount it; v2: add +cpu to the parent's "
                            "cgroup.subtree_control) to cap cpu");
        return;
    }
    r->state = CONCH_PROBE_OK;
}

static const char *fs_name(unsigned long magic)
{
    switch (magic) {
    case EXT4_SUPER_MAGIC:
        return "ext4";
    case TMPFS_MAGIC:
        return "tmpfs";
    case XFS_SUPER_MAGIC:
        return "xfs";
    case BTRFS_SUPER_MAGIC:
        return "btrfs";
    case OVERLAYFS_SUPER_MAGIC:
        return "overlayfs";
    }
    return "another filesystem";
}

/* Root only: an idmapped clone of /tmp (or /) through a user namespace of a helper that
 * the parent gives a 65536-id map. Nothing is attached: the clone is detached and freed
 * with its fd. */
static int child_idmap(char *detail, size_t len)
{
    int sync[2], hold[2];
    if (pipe2(sync, O_CLOEXEC) < 0 || pipe2(hold, O_CLOEXEC) < 0) {
        conch_probe_text(detail, len, "pipe: %s", strerror(errno));
        return -errno;
    }
    pid_t pid = fork();
    if (pid < 0) {
        conch_probe_text(detail, len, "fork: %s", strerror(errno));
        return -errno;
    }
    if (pid == 0) {
        char c = unshare(CLONE_NEWUSER) == 0 ? 'y' : 'n';
        if (write(sync[1], &c, 1) != 1)
            _exit(1);
        close(hold[1]);
        /* Returns when the parent closes its end: the namespace must live until then. */
        _exit(read(hold[0], &c, 1) < 0 ? 1 : 0);
    }
    close(sync[1]);
    close(hold[0]);
    char c = 'n';
    int rc = 0;
    if (read(sync[0], &c, 1) != 1 || c != 'y') {
        conch_probe_text(detail, len, "helper could not unshare(CLONE_NEWUSER)");
        rc = -EPERM;
    }
    char path[64];
    int nsfd = -1;
    if (rc == 0) {
        snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
        rc = write_proc(path, "0 100000 65536");
        if (rc == 0) {
            snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)pid);
            rc = write_proc(path, "0 100000 65536");
        }
        if (rc < 0)
            conch_probe_text(detail, len, "write %s: %s", path, strerror(-rc));
    }
    if (rc == 0) {
        snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
        nsfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0) {
            rc = -errno;
            conch_probe_text(detail, len, "open %s: %s", path, strerror(errno));
        }
    }
    if (rc == 0) {
        static const char *const targets[] = {"/tmp", "/"};
        rc = -ENOTSUP;
        for (size_t i = 0; i < ARRAY_SIZE(targets) && rc < 0; i++) {
            int tree = open_tree(AT_FDCWD, targets[i], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
            if (tree < 0) {
                rc = -errno;
                conch_probe_text(detail, len, "open_tree %s: %s", targets[i], strerror(errno));
                continue;
            }
            struct mount_attr attr = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)nsfd};
            if (mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof(attr)) == 0) {
                struct statfs sfs;
                rc = 0;
                conch_probe_text(detail, len, "idmapped clone of %s (%s)", targets[i],
                                 fstatfs(tree, &sfs) == 0 ? fs_name((unsigned long)sfs.f_type)
                                                          : "?");
            } else {
                rc = -errno;
                conch_probe_text(detail, len, "mount_setattr(MOUNT_ATTR_IDMAP) on %s: %s",
                                 targets[i], strerror(errno));
            }
            close(tree);
        }
    }
    if (nsfd >= 0)
        close(nsfd);
    close(hold[1]);
    close(sync[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

static void probe_idmap(struct conch_probe_result *r)
{
    r->name = "idmapped mounts";
    r->required = false;
    if (geteuid() != 0) {
        r->state = CONCH_PROBE_OK;
        conch_probe_text(r->detail, sizeof(r->detail),
                         "not needed (unprivileged mode maps your uid directly)");
        return;
    }
    if (conch_probe_in_child(child_idmap, r->detail, sizeof(r->detail)) == 0) {
        r->state = CONCH_PROBE_OK;
        return;
    }
    r->state = CONCH_PROBE_MISSING;
    conch_probe_add_fix(
        r->fix, sizeof(r->fix),
        "use Linux 5.12+ and a filesystem that supports idmapped mounts (ext4, xfs, btrfs; "
        "tmpfs since 6.3)");
}

static void probe_pidfd(struct conch_probe_result *r)
{
    r->name = "pidfd";
    r->required = false;
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (fd >= 0) {
        close(fd);
        r->state = CONCH_PROBE_OK;
        conch_probe_text(r->detail, sizeof(r->detail), "pidfd_open works");
        return;
    }
    r->state = CONCH_PROBE_MISSING;
    conch_probe_text(r->detail, sizeof(r->detail), "pidfd_open: %s", strerror(errno));
    conch_probe_add_fix(
        r->fix, sizeof(r->fix),
        "use Linux 5.3+ (pidfd_open), which lets a parent signal a child without pid-reuse "
        "races");
}

int conch_probe_all(struct conch_probe_result *out, int max)
{
    static void (*const probes[])(struct conch_probe_result *) = {
        probe_userns,      probe_mountns,      probe_overlay,  probe_pidns,     conch_probe_uts,
        conch_probe_setns, conch_probe_procfs, probe_net_none, probe_net_allow, probe_net_host,
        probe_seccomp,     probe_landlock,     probe_cgroups,  probe_idmap,     probe_pidfd,
    };
    int n = 0;
    for (size_t i = 0; i < ARRAY_SIZE(probes) && n < max; i++, n++) {
        memset(&out[n], 0, sizeof(out[n]));
        probes[i](&out[n]);
    }
    return n;
}
