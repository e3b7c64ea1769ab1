/* test_cgroup.c - unit tests for src/jail/cgroup.c and src/jail/probe.c: real cgroups
 * (memory and pids limits enforced on forked children) and the feature probes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "jail/cgroup.h"
#include "jail/probe.h"

/* The cgroup under test; .fini removes it even when an assertion aborted the test. */
static struct conch_cgroup cg;

static void destroy_cg(void)
{
    (void)conch_cgroup_destroy(&cg, NULL);
}

/* Create a cgroup or skip the test with the reason (not root, no cgroup here). */
static void create_or_skip(struct conch_cgroup *cgp, const char *name,
                           const struct conch_cgroup_limits *lim)
{
    struct conch_err err = {0};
    int r = conch_cgroup_create(cgp, name, lim, &err);
    if (r == -EOPNOTSUPP) {
        cr_log_warn("skipping: %s", err.msg);
        cr_skip_test("no usable cgroup here: %s", err.msg);
    }
    cr_assert_eq(r, 0, "create: %s", err.msg);
    cr_assert(cgp->active);
}

static void unique_name(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "test-%s-%d", what, (int)getpid());
}

/* Fork a child that blocks until the parent writes a byte to the pipe, then runs @fn. */
static pid_t fork_gated(int *ret_gate, int (*fn)(void))
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        char c;
        close(p[1]);
        if (read(p[0], &c, 1) != 1)
            _exit(90);
        _exit(fn());
    }
    close(p[0]);
    *ret_gate = p[1];
    return pid;
}

static void release(int gate)
{
    cr_assert_eq(write(gate, "x", 1), 1);
    close(gate);
}

static const char *expected_cgroup_fragment;

/* Child: exit 0 iff /proc/self/cgroup shows the sandbox cgroup. */
static int child_check_cgroup(void)
{
    char *buf = NULL;
    if (conch_read_file("/proc/self/cgroup", 65536, &buf, NULL, NULL) < 0)
        return 91;
    int ok = strstr(buf, expected_cgroup_fragment) != NULL;
    free(buf);
    return ok ? 0 : 92;
}

/* Child: allocate and touch 200 MB, far beyond the limit. */
static int child_hog_memory(void)
{
    size_t len = 200u << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return 93;
    for (size_t i = 0; i < len; i += 4096)
        p[i] = 1;
    return 0; /* reached only if the limit did not hold */
}

/* Child: fork 64 sleepers; exit with the number of forks that failed. */
static int child_fork_many(void)
{
    int failed = 0;
    pid_t kids[64];
    int n = 0;
    for (int i = 0; i < 64; i++) {
        pid_t k = fork();
        if (k == 0) {
            pause();
            _exit(0);
        }
        if (k < 0)
            failed++;
        else
            kids[n++] = k;
    }
    for (int i = 0; i < n; i++)
        kill(kids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        waitpid(kids[i], NULL, 0);
    return failed > 63 ? 63 : failed;
}

static int wait_status(pid_t pid)
{
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return st;
}

Test(cgroup, memory_limit_oom_kills_child_and_is_reported, .timeout = 60, .fini = destroy_cg)
{
    struct conch_cgroup_limits lim = {.memory_bytes = 32u << 20, .pids_max = 16};
    char name[64];
    unique_name(name, sizeof(name), "mem");
    create_or_skip(&cg, name, &lim);
    struct conch_err err = {0};

    /* The child sees itself in the new cgroup. */
    char frag[128];
    snprintf(frag, sizeof(frag), "%s%s\n", cg.v2 ? "/conch-" : "/conch/", name);
    expected_cgroup_fragment = frag;
    int gate;
    pid_t pid = fork_gated(&gate, child_check_cgroup);
    cr_assert_eq(conch_cgroup_attach(&cg, pid, &err), 0, "attach: %s", err.msg);
    release(gate);
    int st = wait_status(pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child cgroup check: status 0x%x", st);

    struct conch_cgroup_stats stats;
    cr_assert_eq(conch_cgroup_stats(&cg, &stats, &err), 0, "stats: %s", err.msg);
    cr_assert_not(stats.oom_killed, "no OOM before the hog runs");

    pid = fork_gated(&gate, child_hog_memory);
    cr_assert_eq(conch_cgroup_attach(&cg, pid, &err), 0, "attach: %s", err.msg);
    release(gate);
    st = wait_status(pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "hog should be OOM-killed, status 0x%x",
              st);

    cr_assert_eq(conch_cgroup_stats(&cg, &stats, &err), 0, "stats: %s", err.msg);
    cr_assert(stats.oom_killed, "stats must report the OOM kill");
    cr_assert(stats.memory_peak > (16u << 20) && stats.memory_peak <= (33u << 20),
              "peak %llu should be near the 32M limit", (unsigned long long)stats.memory_peak);

    char dir[512];
    snprintf(dir, sizeof(dir), "%s", cg.v2 ? cg.path_v2 : cg.path_mem);
    cr_assert_eq(access(dir, F_OK), 0);
    cr_assert_eq(conch_cgroup_destroy(&cg, &err), 0, "destroy: %s", err.msg);
    cr_assert_neq(access(dir, F_OK), 0, "'%s' must be gone", dir);
    cr_assert_not(cg.active);
}

Test(cgroup, pids_limit_stops_forks_and_is_reported, .timeout = 60, .fini = destroy_cg)
{
    struct conch_cgroup_limits lim = {.pids_max = 16};
    char name[64];
    unique_name(name, sizeof(name), "pids");
    create_or_skip(&cg, name, &lim);
    struct conch_err err = {0};

    int gate;
    pid_t pid = fork_gated(&gate, child_fork_many);
    cr_assert_eq(conch_cgroup_attach(&cg, pid, &err), 0, "attach: %s", err.msg);
    release(gate);
    int st = wait_status(pid);
    cr_assert(WIFEXITED(st), "status 0x%x", st);
    /* 16 tasks: the child itself plus 15 forks; the other 49 fail. */
    cr_assert(WEXITSTATUS(st) >= 40, "only %d of 64 forks failed", WEXITSTATUS(st));

    struct conch_cgroup_stats stats;
    cr_assert_eq(conch_cgroup_stats(&cg, &stats, &err), 0, "stats: %s", err.msg);
    cr_assert(stats.pids_limit_hit);
    cr_assert_not(stats.oom_killed);

    char dir[512];
    snprintf(dir, sizeof(dir), "%s", cg.v2 ? cg.path_v2 : cg.path_pids);
    cr_assert_eq(conch_cgroup_destroy(&cg, &err), 0, "destroy: %s", err.msg);
    cr_assert_neq(access(dir, F_OK), 0, "'%s' must be gone", dir);
}

static int child_sleep(void)
{
    pause();
    return 95; /* only reached if a stray signal woke us; destroy must SIGKILL us */
}

Test(cgroup, destroy_kills_leftover_processes, .timeout = 60, .fini = destroy_cg)
{
    struct conch_cgroup_limits lim = {.pids_max = 8, .cpu_millicpus = 500};
    char name[64];
    unique_name(name, sizeof(name), "kill");
    create_or_skip(&cg, name, &lim);
    struct conch_err err = {0};
    if (!cg.v2) {
        cr_assert(cg.path_cpu[0], "cpu limit asks for a cpu cgroup");
        char *quota = NULL;
        char path[600];
        snprintf(path, sizeof(path), "%s/cpu.cfs_quota_us", cg.path_cpu);
        cr_assert_eq(conch_read_file(path, 64, &quota, NULL, NULL), 0);
        cr_assert_eq(atoi(quota), 50000);
        free(quota);
    }

    int gate;
    pid_t pid = fork_gated(&gate, child_sleep);
    cr_assert_eq(conch_cgroup_attach(&cg, pid, &err), 0, "attach: %s", err.msg);
    release(gate);
    cr_assert_eq(conch_cgroup_destroy(&cg, &err), 0, "destroy: %s", err.msg);
    int st = wait_status(pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status 0x%x", st);
    /* Destroy is idempotent. */
    cr_assert_eq(conch_cgroup_destroy(&cg, &err), 0);
}

Test(cgroup, invalid_names_are_refused)
{
    struct conch_cgroup other = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_cgroup_create(&other, "../escape", NULL, &err), -EINVAL);
    cr_assert_eq(conch_cgroup_create(&other, "", NULL, &err), -EINVAL);
    cr_assert_not(other.active);
    cr_assert_eq(conch_cgroup_attach(&other, getpid(), &err), -EINVAL);
    cr_assert_eq(conch_cgroup_destroy(&other, &err), 0, "destroy of an inactive cgroup is a no-op");
}

Test(probe, runs_every_probe_and_userns_works_here, .timeout = 60)
{
    struct conch_probe_result res[32];
    int n = conch_probe_all(res, 32);
    cr_assert_gt(n, 5);
    bool saw_userns = false;
    for (int i = 0; i < n; i++) {
        cr_assert(res[i].name && res[i].name[0], "entry %d has no name", i);
        cr_assert(res[i].state == CONCH_PROBE_OK || res[i].state == CONCH_PROBE_MISSING ||
                      res[i].state == CONCH_PROBE_PARTIAL,
                  "%s: bad state", res[i].name);
        if (res[i].state != CONCH_PROBE_OK)
            cr_assert(res[i].fix[0], "%s is not OK but has no fix", res[i].name);
        if (!strcmp(res[i].name, "user namespaces")) {
            saw_userns = true;
            cr_assert_eq(res[i].state, CONCH_PROBE_OK, "user namespaces: %s", res[i].detail);
            cr_assert(res[i].required);
        }
    }
    cr_assert(saw_userns);
}

Test(probe, respects_max)
{
    struct conch_probe_result res[2];
    cr_assert_eq(conch_probe_all(res, 2), 2);
    cr_assert_eq(conch_probe_all(res, 0), 0);
}
