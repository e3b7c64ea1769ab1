/* probe-ct.c - the probes that a container's default settings refuse (a hostname in an own
 * UTS namespace, setns between mount namespaces, a new /proc in a new pid namespace) and
 * what kind of container conch runs in, for `conch doctor` to name the settings to grant. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "jail/probe-internal.h"
#include "jail/probe.h"

/* The one seccomp fix: container runtimes' default profiles allow sethostname and setns
 * only with CAP_SYS_ADMIN (and Kubernetes' RuntimeDefault also unshare and mount). */
#define SECCOMP_FIX                                                                                \
    "a seccomp filter refuses it (container defaults allow it only with CAP_SYS_ADMIN): run "      \
    "conch under a profile that allows it, e.g. deploy/seccomp/conch.json (podman --security-opt " \
    "seccomp=FILE; Kubernetes seccompProfile type Localhost), or seccomp Unconfined"

static int child_uts(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(CLONE_NEWUTS, "CLONE_NEWUTS", detail, len);
    if (r < 0)
        return r;
    if (sethostname("conch", 5) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "sethostname in an own UTS namespace: %s", strerror(e));
        return -e;
    }
    conch_probe_text(detail, len, "own UTS namespace, hostname set");
    return 0;
}

/* The warden switches between its sandbox's mount namespace and a host view it made. */
static int child_setns(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(CLONE_NEWNS, "CLONE_NEWNS", detail, len);
    if (r < 0)
        return r;
    _cleanup_close_ int first = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    if (first < 0) {
        int e = errno;
        conch_probe_text(detail, len, "open /proc/self/ns/mnt: %s", strerror(e));
        return -e;
    }
    if (unshare(CLONE_NEWNS) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "unshare a second mount namespace: %s", strerror(e));
        return -e;
    }
    if (setns(first, CLONE_NEWNS) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "setns back to the first mount namespace: %s", strerror(e));
        return -e;
    }
    conch_probe_text(detail, len, "setns between two mount namespaces of its own");
    return 0;
}

/* What the sandbox does: a new proc for its own pid namespace. The kernel refuses it
 * (mnt_too_revealing) unless the proc already mounted is fully visible: no masked or
 * read-only paths mounted over files or non-empty directories under it. */
static int child_procfs(char *detail, size_t len)
{
    int r = conch_probe_enter_userns(CLONE_NEWNS | CLONE_NEWPID, "CLONE_NEWNS|CLONE_NEWPID", detail,
                                     len);
    if (r < 0)
        return r;
    const char *step = "make / private";
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
        (step = "mount tmpfs on /tmp",
         mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")) < 0 ||
        (step = "mkdir /tmp/proc", mkdir("/tmp/proc", 0555)) < 0) {
        int e = errno;
        conch_probe_text(detail, len, "%s: %s", step, strerror(e));
        return -e;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        conch_probe_text(detail, len, "fork into the new pid namespace: %s", strerror(e));
        return -e;
    }
    if (pid == 0)
        _exit(mount("proc", "/tmp/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0
                  ? 0
                  : (errno > 0 && errno < 256 ? errno : EIO));
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    int e = WIFEXITED(st) ? WEXITSTATUS(st) : EIO;
    if (e) {
        conch_probe_text(detail, len, "mount proc in a new pid namespace: %s", strerror(e));
        return -e;
    }
    conch_probe_text(detail, len, "a new proc mounted for a new pid namespace");
    return 0;
}

/* Run @fn as a required probe; on EPERM, @perm_fix (a seccomp filter, a masked /proc),
 * else the user-namespace fixes when that part failed. */
static void run_probe(struct conch_probe_result *r, const char *name, conch_probe_child_fn fn,
                      const char *perm_fix)
{
    r->name = name;
    r->required = true;
    int rc = conch_probe_in_child(fn, r->detail, sizeof(r->detail));
    if (rc == 0) {
        r->state = CONCH_PROBE_OK;
        return;
    }
    r->state = CONCH_PROBE_MISSING;
    conch_probe_ns_fixes(r->fix, sizeof(r->fix), rc, r->detail,
                         rc == -EPERM || rc == -ENOSYS ? perm_fix : NULL);
    if (!r->fix[0])
        conch_probe_add_fix(r->fix, sizeof(r->fix), "see 'user namespaces' above");
}

void conch_probe_uts(struct conch_probe_result *r)
{
    run_probe(r, CONCH_PROBE_UTS, child_uts, "sethostname: " SECCOMP_FIX);
}

void conch_probe_setns(struct conch_probe_result *r)
{
    run_probe(r, CONCH_PROBE_SETNS, child_setns, "setns: " SECCOMP_FIX);
}

void conch_probe_procfs(struct conch_probe_result *r)
{
    struct conch_probe_env env;
    conch_probe_env(&env);
    char fix[300];
    if (env.proc_covered > 0)
        conch_probe_text(fix, sizeof(fix),
                         "this /proc has %d paths masked or read-only over it (%s...), and the "
                         "kernel mounts a new proc only where the old one is fully visible: "
                         "unmask it (podman --security-opt unmask=/proc/*; docker "
                         "--security-opt systempaths=unconfined; Kubernetes procMount: Unmasked)",
                         env.proc_covered, env.proc_example);
    else
        conch_probe_text(fix, sizeof(fix),
                         "mount(\"proc\") is refused: allow mount in the seccomp and AppArmor "
                         "profiles (deploy/seccomp/conch.json; apparmor=unconfined)");
    run_probe(r, CONCH_PROBE_PROCFS, child_procfs, fix);
}

/* ---- where conch runs ---- */

static void status_field(const char *name, int *ret)
{
    _cleanup_fclose_ FILE *f = fopen("/proc/self/status", "re");
    char line[256];
    size_t n = strlen(name);
    while (f && fgets(line, sizeof(line), f))
        if (!strncmp(line, name, n) && line[n] == ':') {
            *ret = atoi(line + n + 1);
            return;
        }
}

static bool read_line(const char *path, char *buf, size_t len)
{
    _cleanup_fclose_ FILE *f = fopen(path, "re");
    if (!f || !fgets(buf, (int)len, f))
        return false;
    buf[strcspn(buf, "\n")] = '\0';
    return true;
}

static void find_container(struct conch_probe_env *env)
{
    static const char *const words[] = {"kubepods",   "libpod", "docker",
                                        "containerd", "crio",   "lxc"};
    const char *k8s = getenv("KUBERNETES_SERVICE_HOST");
    const char *ct = getenv("container"); /* systemd's convention, set by podman and lxc */
    struct stat st;
    env->kubernetes = k8s && *k8s;
    env->container = true;
    if (env->kubernetes) {
        conch_probe_text(env->why, sizeof(env->why), "KUBERNETES_SERVICE_HOST is set");
        return;
    }
    if (stat("/run/.containerenv", &st) == 0) {
        conch_probe_text(env->why, sizeof(env->why), "/run/.containerenv (podman)");
        return;
    }
    if (stat("/.dockerenv", &st) == 0) {
        conch_probe_text(env->why, sizeof(env->why), "/.dockerenv (docker)");
        return;
    }
    if (ct && *ct) {
        conch_probe_text(env->why, sizeof(env->why), "container=%.60s", ct);
        return;
    }
    _cleanup_fclose_ FILE *f = fopen("/proc/1/cgroup", "re");
    char line[512];
    while (f && fgets(line, sizeof(line), f))
        for (size_t i = 0; i < ARRAY_SIZE(words); i++)
            if (strstr(line, words[i])) {
                conch_probe_text(env->why, sizeof(env->why), "/proc/1/cgroup names %s", words[i]);
                return;
            }
    env->container = false;
}

void conch_probe_env(struct conch_probe_env *env)
{
    memset(env, 0, sizeof(*env));
    find_container(env);

    char line[256];
    unsigned long inner = 0, outer = 0, count = 0;
    if (read_line("/proc/self/uid_map", line, sizeof(line)) &&
        sscanf(line, "%lu %lu %lu", &inner, &outer, &count) == 3)
        env->own_userns = !(inner == 0 && outer == 0 && count == 4294967295UL);

    env->seccomp = -1;
    status_field("Seccomp", &env->seccomp);
    int nnp = 0;
    status_field("NoNewPrivs", &nnp);
    env->no_new_privs = nnp == 1;

    /* The LSM-specific file first (Linux 5.8+), then the shared one, which another LSM may
     * own; without AppArmor in /sys/kernel/security/lsm neither means AppArmor. */
    char lsm[256] = "";
    bool have_lsm = read_line("/sys/kernel/security/lsm", lsm, sizeof(lsm));
    if ((have_lsm && strstr(lsm, "apparmor")) ||
        (!have_lsm && access("/sys/module/apparmor", F_OK) == 0)) {
        if (read_line("/proc/self/attr/apparmor/current", line, sizeof(line)) ||
            read_line("/proc/self/attr/current", line, sizeof(line)))
            conch_probe_text(env->apparmor, sizeof(env->apparmor), "%s", line);
    }

    _cleanup_fclose_ FILE *f = fopen("/proc/self/mountinfo", "re");
    char mi[1024];
    while (f && fgets(mi, sizeof(mi), f)) {
        char point[512];
        /* id parent major:minor root mountpoint ... */
        if (sscanf(mi, "%*s %*s %*s %*s %511s", point) != 1 || strncmp(point, "/proc/", 6))
            continue;
        if (!env->proc_covered++)
            conch_probe_text(env->proc_example, sizeof(env->proc_example), "%s", point);
    }
}
