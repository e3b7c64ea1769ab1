/* test_state.c - unit tests for src/daemon/state.c and src/daemon/recover.c: records
 * surviving a reopen, schema version checks, reaping real processes (with the pid-reuse
 * guard) and garbage collection that never follows a planted symlink. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "core/cleanup.h"
#include "daemon/recover.h"
#include "daemon/state.h"

static char tmp[256];
static char dbpath[512];
static struct conch_state *st;
static pid_t child = -1;
static char cg_made[2][512];

static void mkpath(const char *rel, bool dir);

static int rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void setup(void)
{
    snprintf(tmp, sizeof(tmp), "/tmp/conch-test-state-XXXXXX");
    cr_assert_not_null(mkdtemp(tmp));
    snprintf(dbpath, sizeof(dbpath), "%s/deep/er/state.db", tmp);
}

static void teardown(void)
{
    conch_state_close(st);
    st = NULL;
    if (child > 0) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        child = -1;
    }
    for (size_t i = 0; i < ARRAY_SIZE(cg_made); i++)
        if (cg_made[i][0])
            rmdir(cg_made[i]);
    nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(state, .init = setup, .fini = teardown, .timeout = 30);

static struct conch_state *open_ok(void)
{
    struct conch_err err = {0};
    struct conch_state *s = NULL;
    int r = conch_state_open(dbpath, &s, &err);
    cr_assert_eq(r, 0, "open: %s", err.msg);
    cr_assert_not_null(s);
    return s;
}

static void fill_sandbox(struct conch_state_sandbox *sb, const char *id, const char *state,
                         double created)
{
    memset(sb, 0, sizeof(*sb));
    snprintf(sb->id, sizeof(sb->id), "%s", id);
    snprintf(sb->name, sizeof(sb->name), "name of %s", id);
    snprintf(sb->workspace, sizeof(sb->workspace), "/home/u/%s", id);
    snprintf(sb->mode, sizeof(sb->mode), "overlay");
    snprintf(sb->state, sizeof(sb->state), "%s", state);
    snprintf(sb->upper_dir, sizeof(sb->upper_dir), "/var/lib/conch/sandboxes/%s/upper", id);
    sb->warden_pid = 4242;
    sb->warden_starttime = 123456789012ULL;
    sb->created_at = created;
    sb->last_used_at = created + 1;
}

static void put_sandbox(const char *id, const char *state, double created, const char *spec)
{
    struct conch_state_sandbox sb;
    fill_sandbox(&sb, id, state, created);
    sb.spec_json = (char *)spec;
    struct conch_err err = {0};
    cr_assert_eq(conch_state_sandbox_put(st, &sb, &err), 0, "put: %s", err.msg);
}

static void put_job(const char *id, const char *sandbox, bool running, double started)
{
    struct conch_state_job job = {0};
    snprintf(job.id, sizeof(job.id), "%s", id);
    snprintf(job.sandbox_id, sizeof(job.sandbox_id), "%s", sandbox);
    job.command = (char *)"sleep 100; echo 'quoted' \"x\"";
    job.pid = 77;
    job.exit_code = -1;
    job.running = running;
    job.started_at = started;
    snprintf(job.stdout_spill, sizeof(job.stdout_spill), "/s/spill/%s.out", id);
    struct conch_err err = {0};
    cr_assert_eq(conch_state_job_put(st, &job, &err), 0, "job put: %s", err.msg);
}

Test(state, open_creates_private_dirs_and_persists_across_reopen)
{
    st = open_ok();
    put_sandbox("sb-1", "running", 100.5, "{\"memory\": 1024}");
    conch_state_close(st);
    st = NULL;

    struct stat s;
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/deep/er", tmp);
    cr_assert_eq(stat(dir, &s), 0);
    cr_assert_eq(s.st_mode & 0777, 0700, "parent mode %o", s.st_mode & 0777);
    cr_assert_eq(stat(dbpath, &s), 0);
    cr_assert_eq(s.st_mode & 0777, 0600, "db mode %o", s.st_mode & 0777);

    st = open_ok();
    struct conch_state_sandbox sb;
    struct conch_err err = {0};
    cr_assert_eq(conch_state_sandbox_get(st, "sb-1", &sb, &err), 0, "%s", err.msg);
    cr_assert_str_eq(sb.id, "sb-1");
    cr_assert_str_eq(sb.name, "name of sb-1");
    cr_assert_str_eq(sb.workspace, "/home/u/sb-1");
    cr_assert_str_eq(sb.mode, "overlay");
    cr_assert_str_eq(sb.state, "running");
    cr_assert_str_eq(sb.upper_dir, "/var/lib/conch/sandboxes/sb-1/upper");
    cr_assert_str_eq(sb.spec_json, "{\"memory\": 1024}");
    cr_assert_eq(sb.warden_pid, 4242);
    cr_assert_eq(sb.warden_starttime, 123456789012ULL);
    cr_assert_float_eq(sb.created_at, 100.5, 1e-9);
    cr_assert_float_eq(sb.last_used_at, 101.5, 1e-9);
    conch_state_sandbox_done(&sb);
    cr_assert_null(sb.spec_json);
}

Test(state, wal_mode_and_cloexec)
{
    st = open_ok();
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_eq(sqlite3_column_int(s, 0), CONCH_STATE_SCHEMA_VERSION);
    sqlite3_finalize(s);
    sqlite3_close(db);

    /* Every fd open on the database files must be close-on-exec (sandboxes are forked). */
    int found = 0;
    for (int fd = 3; fd < 1024; fd++) {
        char link[64], target[1024];
        snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, target, sizeof(target) - 1);
        if (n < 0)
            continue;
        target[n] = '\0';
        if (!strstr(target, "state.db"))
            continue;
        found++;
        cr_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC, "fd %d (%s) is not CLOEXEC", fd, target);
    }
    cr_assert_gt(found, 0);
}

Test(state, sandbox_put_get_list_update_delete)
{
    st = open_ok();
    struct conch_err err = {0};
    put_sandbox("sb-b", "running", 200, NULL);
    put_sandbox("sb-a", "stopped", 100, "{}");
    put_sandbox("sb-c", "running", 200, NULL);

    struct conch_state_sandbox *list = NULL;
    size_t n = 0;
    cr_assert_eq(conch_state_sandbox_list(st, &list, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(list[0].id, "sb-a"); /* oldest first, then by id */
    cr_assert_str_eq(list[1].id, "sb-b");
    cr_assert_str_eq(list[2].id, "sb-c");
    cr_assert_str_eq(list[0].spec_json, "{}");
    cr_assert_null(list[1].spec_json);
    conch_state_sandbox_free_list(list, n);

    cr_assert_eq(conch_state_sandbox_set_state(st, "sb-b", "stopped", &err), 0, "%s", err.msg);
    cr_assert_eq(conch_state_sandbox_touch(st, "sb-b", 999.25, &err), 0, "%s", err.msg);
    struct conch_state_sandbox sb;
    cr_assert_eq(conch_state_sandbox_get(st, "sb-b", &sb, &err), 0);
    cr_assert_str_eq(sb.state, "stopped");
    cr_assert_float_eq(sb.last_used_at, 999.25, 1e-9);
    cr_assert_float_eq(sb.created_at, 200, 1e-9);
    conch_state_sandbox_done(&sb);

    /* put on an existing id updates in place and keeps its jobs. */
    put_job("job-1", "sb-b", true, 1);
    struct conch_state_sandbox upd;
    fill_sandbox(&upd, "sb-b", "running", 200);
    snprintf(upd.name, sizeof(upd.name), "renamed");
    upd.spec_json = (char *)"{\"x\":1}";
    cr_assert_eq(conch_state_sandbox_put(st, &upd, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_state_sandbox_get(st, "sb-b", &sb, &err), 0);
    cr_assert_str_eq(sb.name, "renamed");
    cr_assert_str_eq(sb.state, "running");
    cr_assert_str_eq(sb.spec_json, "{\"x\":1}");
    conch_state_sandbox_done(&sb);
    struct conch_state_job job;
    cr_assert_eq(conch_state_job_get(st, "job-1", &job, &err), 0, "jobs survive an update");
    conch_state_job_done(&job);

    /* Errors. */
    cr_assert_eq(conch_state_sandbox_set_state(st, "sb-b", "paused", &err), -EINVAL);
    cr_assert_eq(conch_state_sandbox_set_state(st, "nope", "stopped", &err), -ENOENT);
    cr_assert(strstr(err.msg, "nope"), "%s", err.msg);
    cr_assert_eq(conch_state_sandbox_touch(st, "nope", 1, &err), -ENOENT);
    cr_assert_eq(conch_state_sandbox_get(st, "nope", &sb, &err), -ENOENT);
    snprintf(upd.state, sizeof(upd.state), "weird");
    cr_assert_eq(conch_state_sandbox_put(st, &upd, &err), -EINVAL);
    fill_sandbox(&upd, "sb-z", "running", 1);
    memset(upd.mode, 'x', sizeof(upd.mode)); /* not NUL-terminated */
    cr_assert_eq(conch_state_sandbox_put(st, &upd, &err), -EINVAL);
    fill_sandbox(&upd, "", "running", 1);
    cr_assert_eq(conch_state_sandbox_put(st, &upd, &err), -EINVAL);

    cr_assert_eq(conch_state_sandbox_delete(st, "sb-a", &err), 0, "%s", err.msg);
    cr_assert_eq(conch_state_sandbox_get(st, "sb-a", &sb, &err), -ENOENT);
    cr_assert_eq(conch_state_sandbox_delete(st, "sb-a", &err), -ENOENT);
    cr_assert_eq(conch_state_sandbox_list(st, &list, &n, &err), 0);
    cr_assert_eq(n, 2);
    conch_state_sandbox_free_list(list, n);
}

Test(state, empty_list_is_null)
{
    st = open_ok();
    struct conch_err err = {0};
    struct conch_state_sandbox *list = (void *)1;
    size_t n = 5;
    cr_assert_eq(conch_state_sandbox_list(st, &list, &n, &err), 0);
    cr_assert_null(list);
    cr_assert_eq(n, 0);
    struct conch_state_job *jobs = (void *)1;
    cr_assert_eq(conch_state_job_list(st, NULL, &jobs, &n, &err), 0);
    cr_assert_null(jobs);
    cr_assert_eq(n, 0);
}

Test(state, job_put_get_list_set_exit_delete)
{
    st = open_ok();
    struct conch_err err = {0};
    put_sandbox("sb-1", "running", 1, NULL);
    put_sandbox("sb-2", "running", 2, NULL);
    put_job("job-b", "sb-1", true, 20);
    put_job("job-a", "sb-1", true, 10);
    put_job("job-c", "sb-2", true, 5);

    struct conch_state_job job;
    cr_assert_eq(conch_state_job_get(st, "job-a", &job, &err), 0, "%s", err.msg);
    cr_assert_str_eq(job.sandbox_id, "sb-1");
    cr_assert_str_eq(job.command, "sleep 100; echo 'quoted' \"x\"");
    cr_assert_eq(job.pid, 77);
    cr_assert(job.running);
    cr_assert_eq(job.exit_code, -1);
    cr_assert_str_eq(job.stdout_spill, "/s/spill/job-a.out");
    cr_assert_str_eq(job.stderr_spill, "");
    conch_state_job_done(&job);

    struct conch_state_job *list = NULL;
    size_t n = 0;
    cr_assert_eq(conch_state_job_list(st, "sb-1", &list, &n, &err), 0, "%s", err.msg);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(list[0].id, "job-a");
    cr_assert_str_eq(list[1].id, "job-b");
    conch_state_job_free_list(list, n);
    cr_assert_eq(conch_state_job_list(st, NULL, &list, &n, &err), 0);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(list[0].id, "job-c");
    conch_state_job_free_list(list, n);

    cr_assert_eq(conch_state_job_set_exit(st, "job-a", 3, 0, 30.5, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_state_job_get(st, "job-a", &job, &err), 0);
    cr_assert_not(job.running);
    cr_assert_eq(job.exit_code, 3);
    cr_assert_eq(job.signal, 0);
    cr_assert_float_eq(job.ended_at, 30.5, 1e-9);
    conch_state_job_done(&job);
    cr_assert_eq(conch_state_job_set_exit(st, "nope", 0, 0, 1, &err), -ENOENT);

    /* A job must belong to a recorded sandbox. */
    struct conch_state_job orphan = {.command = NULL};
    snprintf(orphan.id, sizeof(orphan.id), "job-x");
    snprintf(orphan.sandbox_id, sizeof(orphan.sandbox_id), "sb-ghost");
    cr_assert_eq(conch_state_job_put(st, &orphan, &err), -ENOENT);
    cr_assert(strstr(err.msg, "sb-ghost"), "%s", err.msg);

    cr_assert_eq(conch_state_job_delete(st, "job-b", &err), 0);
    cr_assert_eq(conch_state_job_get(st, "job-b", &job, &err), -ENOENT);
    cr_assert_eq(conch_state_job_delete(st, "job-b", &err), -ENOENT);
}

Test(state, deleting_a_sandbox_deletes_its_jobs)
{
    st = open_ok();
    struct conch_err err = {0};
    put_sandbox("sb-1", "running", 1, NULL);
    put_sandbox("sb-2", "running", 2, NULL);
    put_job("job-1", "sb-1", true, 1);
    put_job("job-2", "sb-1", false, 2);
    put_job("job-3", "sb-2", true, 3);
    cr_assert_eq(conch_state_sandbox_delete(st, "sb-1", &err), 0, "%s", err.msg);

    struct conch_state_job job;
    cr_assert_eq(conch_state_job_get(st, "job-1", &job, &err), -ENOENT);
    cr_assert_eq(conch_state_job_get(st, "job-2", &job, &err), -ENOENT);
    cr_assert_eq(conch_state_job_get(st, "job-3", &job, &err), 0);
    conch_state_job_done(&job);
}

Test(state, mark_stopped_ends_running_jobs_only)
{
    st = open_ok();
    struct conch_err err = {0};
    put_sandbox("sb-1", "running", 1, NULL);
    put_job("job-run", "sb-1", true, 1);
    put_job("job-done", "sb-1", false, 2);
    cr_assert_eq(conch_state_job_set_exit(st, "job-done", 0, 0, 5, &err), 0);
    cr_assert_eq(conch_state_sandbox_mark_stopped(st, "sb-1", 50, &err), 0, "%s", err.msg);

    struct conch_state_sandbox sb;
    cr_assert_eq(conch_state_sandbox_get(st, "sb-1", &sb, &err), 0);
    cr_assert_str_eq(sb.state, "stopped");
    conch_state_sandbox_done(&sb);
    struct conch_state_job job;
    cr_assert_eq(conch_state_job_get(st, "job-run", &job, &err), 0);
    cr_assert_not(job.running);
    cr_assert_eq(job.exit_code, -1);
    cr_assert_eq(job.signal, 9);
    cr_assert_float_eq(job.ended_at, 50, 1e-9);
    conch_state_job_done(&job);
    cr_assert_eq(conch_state_job_get(st, "job-done", &job, &err), 0);
    cr_assert_eq(job.exit_code, 0);
    cr_assert_eq(job.signal, 0);
    cr_assert_float_eq(job.ended_at, 5, 1e-9);
    conch_state_job_done(&job);
    cr_assert_eq(conch_state_sandbox_mark_stopped(st, "nope", 50, &err), -ENOENT);
}

Test(state, refuses_a_newer_schema_and_leaves_it_untouched)
{
    st = open_ok();
    conch_state_close(st);
    st = NULL;
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 99", NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    struct conch_err err = {0};
    struct conch_state *s = (void *)1;
    int r = conch_state_open(dbpath, &s, &err);
    cr_assert_eq(r, -EPROTONOSUPPORT, "r=%d %s", r, err.msg);
    cr_assert_eq(s, (void *)1, "ret written on failure");
    cr_assert(strstr(err.msg, "99"), "%s", err.msg);
    cr_assert(strstr(err.msg, dbpath), "%s", err.msg);

    cr_assert_eq(sqlite3_open(dbpath, &db), SQLITE_OK);
    sqlite3_stmt *q = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &q, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(q), SQLITE_ROW);
    cr_assert_eq(sqlite3_column_int(q, 0), 99);
    sqlite3_finalize(q);
    sqlite3_close(db);
}

Test(state, refuses_a_file_that_is_not_a_database)
{
    mkpath("deep", true);
    mkpath("deep/er", true);
    FILE *f = fopen(dbpath, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 100; i++)
        fputs("this is not an sqlite database, just text\n", f);
    fclose(f);
    struct conch_err err = {0};
    struct conch_state *s = NULL;
    int r = conch_state_open(dbpath, &s, &err);
    cr_assert_lt(r, 0);
    cr_assert_null(s);
    cr_assert(strstr(err.msg, "state.db"), "%s", err.msg);
}

/* ---- recover ---- */

static pid_t fork_sleeper(void)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        for (;;)
            pause();
    }
    /* Wait until the child is in /proc with a start time (it is, right after fork). */
    for (int i = 0; i < 100 && !conch_recover_starttime(pid); i++)
        usleep(1000);
    return pid;
}

Test(state, starttime_of_live_dead_and_zombie_processes)
{
    cr_assert_gt(conch_recover_starttime(getpid()), 0);
    cr_assert_eq(conch_recover_starttime(getpid()), conch_recover_starttime(getpid()));
    cr_assert_eq(conch_recover_starttime(0), 0);
    cr_assert_eq(conch_recover_starttime(-1), 0);

    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(0);
    /* Until reaped it is a zombie: no longer counts as alive. */
    for (int i = 0; i < 2000 && conch_recover_starttime(pid); i++)
        usleep(1000);
    cr_assert_eq(conch_recover_starttime(pid), 0);
    cr_assert_eq(waitpid(pid, NULL, 0), pid);
    cr_assert_eq(conch_recover_starttime(pid), 0);
}

static void record_warden(const char *id, pid_t pid, unsigned long long start)
{
    struct conch_state_sandbox sb;
    fill_sandbox(&sb, id, "running", 1);
    sb.warden_pid = pid;
    sb.warden_starttime = start;
    struct conch_err err = {0};
    cr_assert_eq(conch_state_sandbox_put(st, &sb, &err), 0, "%s", err.msg);
}

Test(state, reap_kills_a_recorded_warden_and_marks_it_stopped)
{
    st = open_ok();
    child = fork_sleeper();
    unsigned long long start = conch_recover_starttime(child);
    cr_assert_gt(start, 0);
    record_warden("sb-live", child, start);
    put_job("job-1", "sb-live", true, 1);
    put_sandbox("sb-old", "stopped", 2, NULL);

    struct conch_recover_report rep = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_recover_reap(st, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.wardens_killed, 1);
    cr_assert_eq(rep.sandboxes_stopped, 1);
    cr_assert_eq(rep.failures, 0);

    int status = 0;
    cr_assert_eq(waitpid(child, &status, WNOHANG), child, "the warden should be dead by now");
    child = -1;
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "status %#x", status);

    struct conch_state_sandbox sb;
    cr_assert_eq(conch_state_sandbox_get(st, "sb-live", &sb, &err), 0);
    cr_assert_str_eq(sb.state, "stopped");
    conch_state_sandbox_done(&sb);
    struct conch_state_job job;
    cr_assert_eq(conch_state_job_get(st, "job-1", &job, &err), 0);
    cr_assert_not(job.running);
    cr_assert_eq(job.exit_code, -1);
    cr_assert_eq(job.signal, 9);
    conch_state_job_done(&job);

    /* A second reap finds nothing running. */
    struct conch_recover_report again = {0};
    cr_assert_eq(conch_recover_reap(st, &again, &err), 0, "%s", err.msg);
    cr_assert_eq(again.wardens_killed + again.sandboxes_stopped, 0);
}

Test(state, reap_spares_a_pid_whose_start_time_differs)
{
    st = open_ok();
    child = fork_sleeper();
    unsigned long long start = conch_recover_starttime(child);
    cr_assert_gt(start, 0);
    record_warden("sb-reused", child, start + 1);
    record_warden("sb-nostart", child, 0);
    record_warden("sb-self", getpid(), conch_recover_starttime(getpid()));

    struct conch_recover_report rep = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_recover_reap(st, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.wardens_killed, 0);
    cr_assert_eq(rep.sandboxes_stopped, 3);

    usleep(50 * 1000);
    cr_assert_eq(kill(child, 0), 0);
    cr_assert_eq(waitpid(child, NULL, WNOHANG), 0, "the child must still be running");
    struct conch_state_sandbox sb;
    cr_assert_eq(conch_state_sandbox_get(st, "sb-reused", &sb, &err), 0);
    cr_assert_str_eq(sb.state, "stopped");
    conch_state_sandbox_done(&sb);
    /* teardown kills and reaps the child */
}

/* Create a v1 memory cgroup under conch/ (root only); skip the test when impossible. */
static void make_cgroup_or_skip(char *path, size_t len, const char *name)
{
    if (geteuid() != 0)
        cr_skip_test("needs root for /sys/fs/cgroup/memory/conch");
    if (access("/sys/fs/cgroup/memory/cgroup.procs", F_OK) < 0)
        cr_skip_test("no cgroup v1 memory hierarchy here");
    if (mkdir("/sys/fs/cgroup/memory/conch", 0755) < 0 && errno != EEXIST)
        cr_skip_test("cannot create /sys/fs/cgroup/memory/conch: %s", strerror(errno));
    snprintf(path, len, "/sys/fs/cgroup/memory/conch/%s", name);
    cr_assert_eq(mkdir(path, 0755), 0, "mkdir %s: %s", path, strerror(errno));
}

Test(state, reap_empties_and_removes_the_sandboxs_cgroup)
{
    st = open_ok();
    char id[64];
    snprintf(id, sizeof(id), "test-reap-%d", (int)getpid());
    make_cgroup_or_skip(cg_made[0], sizeof(cg_made[0]), id);
    child = fork_sleeper();
    char procs[600], pid[32];
    snprintf(procs, sizeof(procs), "%s/cgroup.procs", cg_made[0]);
    snprintf(pid, sizeof(pid), "%d", (int)child);
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, pid, strlen(pid)), (ssize_t)strlen(pid));
    close(fd);
    /* The warden itself is already gone (pid 0): only the cgroup holds a leftover. */
    record_warden(id, 0, 0);

    struct conch_recover_report rep = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_recover_reap(st, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(rep.wardens_killed, 0);
    cr_assert_eq(rep.cgroups_removed, 1);
    cr_assert_eq(access(cg_made[0], F_OK), -1, "cgroup dir should be gone");
    int status = 0;
    cr_assert_eq(waitpid(child, &status, 0), child);
    child = -1;
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}

static void mkpath(const char *rel, bool dir)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    if (dir) {
        cr_assert_eq(mkdir(p, 0755), 0, "mkdir %s: %s", p, strerror(errno));
    } else {
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        cr_assert_geq(fd, 0, "create %s: %s", p, strerror(errno));
        cr_assert_eq(write(fd, "data", 4), 4);
        close(fd);
    }
}

/* Set the mtime of @rel (not following a symlink) @age seconds into the past. */
static void age(const char *rel, long age_s)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= age_s;
    ts[1] = ts[0];
    cr_assert_eq(utimensat(AT_FDCWD, p, ts, AT_SYMLINK_NOFOLLOW), 0, "utimensat %s", p);
}

static bool present(const char *rel)
{
    char p[1024];
    struct stat s;
    snprintf(p, sizeof(p), "%s/%s", tmp, rel);
    return lstat(p, &s) == 0;
}

Test(state, gc_removes_unreferenced_but_never_follows_symlinks)
{
    st = open_ok();
    put_sandbox("sb-keep", "stopped", 1, NULL);
    put_sandbox("sb-run", "running", 1, NULL);

    mkpath("victim", true);
    mkpath("victim/precious", false);
    mkpath("sd", true);
    mkpath("sd/sandboxes", true);
    mkpath("sd/sandboxes/sb-keep", true);
    mkpath("sd/sandboxes/sb-keep/upper", true);
    mkpath("sd/sandboxes/sb-keep/upper/file", false);
    mkpath("sd/sandboxes/orphan", true);
    mkpath("sd/sandboxes/orphan/upper", true);
    mkpath("sd/sandboxes/orphan/upper/a", true);
    mkpath("sd/sandboxes/orphan/upper/a/f", false);
    mkpath("sd/sandboxes/orphan/upper/locked", true);
    mkpath("sd/sandboxes/orphan/upper/locked/f", false);
    char p[1024], target[1024];
    snprintf(p, sizeof(p), "%s/sd/sandboxes/orphan/upper/locked", tmp);
    cr_assert_eq(chmod(p, 0), 0);
    snprintf(target, sizeof(target), "%s/victim", tmp);
    snprintf(p, sizeof(p), "%s/sd/sandboxes/orphan/upper/escape", tmp);
    cr_assert_eq(symlink(target, p), 0);
    snprintf(p, sizeof(p), "%s/sd/sandboxes/planted", tmp);
    cr_assert_eq(symlink(target, p), 0);
    mkpath("sd/sandboxes/young", true);
    mkpath("sd/sandboxes/stray-file", false);
    age("sd/sandboxes/sb-keep", 3600);
    age("sd/sandboxes/orphan", 3600);
    age("sd/sandboxes/planted", 3600);
    age("sd/sandboxes/stray-file", 3600);

    /* spill: expired and unreferenced goes; referenced or young stays. */
    mkpath("sd/spill", true);
    mkpath("sd/spill/old.out", false);
    mkpath("sd/spill/ref.out", false);
    mkpath("sd/spill/new.out", false);
    age("sd/spill/old.out", 2 * 86400);
    age("sd/spill/ref.out", 2 * 86400);
    struct conch_state_job job = {.command = (char *)"x", .running = true};
    snprintf(job.id, sizeof(job.id), "job-1");
    snprintf(job.sandbox_id, sizeof(job.sandbox_id), "sb-keep");
    snprintf(job.stdout_spill, sizeof(job.stdout_spill), "%s/sd/spill/ref.out", tmp);
    struct conch_err err = {0};
    cr_assert_eq(conch_state_job_put(st, &job, &err), 0, "%s", err.msg);

    char sd[512];
    snprintf(sd, sizeof(sd), "%s/sd", tmp);
    struct conch_recover_report rep = {0};
    cr_assert_eq(conch_recover_gc(st, sd, &rep, &err), 0, "%s", err.msg);

    cr_assert(present("sd/sandboxes/sb-keep/upper/file"));
    cr_assert_not(present("sd/sandboxes/orphan"));
    cr_assert_not(present("sd/sandboxes/planted"));
    cr_assert_not(present("sd/sandboxes/stray-file"));
    cr_assert(present("sd/sandboxes/young"), "within the grace period");
    cr_assert(present("victim/precious"), "gc followed a symlink");
    cr_assert_eq(rep.dirs_removed, 3);
    cr_assert_not(present("sd/spill/old.out"));
    cr_assert(present("sd/spill/ref.out"));
    cr_assert(present("sd/spill/new.out"));
    cr_assert_eq(rep.spills_removed, 1);
    cr_assert_eq(rep.failures, 0);

    /* A state dir without sandboxes/ or spill/ is fine. */
    snprintf(sd, sizeof(sd), "%s/victim", tmp);
    cr_assert_eq(conch_recover_gc(st, sd, NULL, &err), 0, "%s", err.msg);
    cr_assert(present("victim/precious"));
}

Test(state, gc_removes_a_tree_deeper_than_its_fd_budget)
{
    st = open_ok();
    mkpath("sd", true);
    mkpath("sd/sandboxes", true);
    mkpath("sd/sandboxes/deep", true);
    char p[1024];
    snprintf(p, sizeof(p), "%s/sd/sandboxes/deep", tmp);
    int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    for (int i = 0; i < 300; i++) {
        cr_assert_eq(mkdirat(fd, "d", 0755), 0);
        int f = openat(fd, "x", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        cr_assert_geq(f, 0);
        close(f);
        int next = openat(fd, "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        cr_assert_geq(next, 0);
        close(fd);
        fd = next;
    }
    close(fd);
    age("sd/sandboxes/deep", 3600);
    /* With one fd per level the removal would run out long before the bottom. */
    struct rlimit lim;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &lim), 0);
    if (lim.rlim_cur > 128)
        lim.rlim_cur = 128;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &lim), 0, "setrlimit: %s", strerror(errno));

    snprintf(p, sizeof(p), "%s/sd", tmp);
    struct conch_recover_report rep = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_recover_gc(st, p, &rep, &err), 0, "%s", err.msg);
    cr_assert_not(present("sd/sandboxes/deep"));
    cr_assert_eq(rep.dirs_removed, 1);
}

Test(state, gc_removes_empty_cgroups_of_no_running_sandbox)
{
    st = open_ok();
    char stale[64], live[64];
    snprintf(stale, sizeof(stale), "test-gc-stale-%d", (int)getpid());
    snprintf(live, sizeof(live), "test-gc-live-%d", (int)getpid());
    make_cgroup_or_skip(cg_made[0], sizeof(cg_made[0]), stale);
    make_cgroup_or_skip(cg_made[1], sizeof(cg_made[1]), live);
    put_sandbox(live, "running", 1, NULL);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 3600;
    ts[1] = ts[0];
    cr_assert_eq(utimensat(AT_FDCWD, cg_made[0], ts, 0), 0);
    cr_assert_eq(utimensat(AT_FDCWD, cg_made[1], ts, 0), 0);

    char sd[512];
    snprintf(sd, sizeof(sd), "%s/none", tmp);
    struct conch_recover_report rep = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_recover_gc(st, sd, &rep, &err), 0, "%s", err.msg);
    cr_assert_eq(access(cg_made[0], F_OK), -1, "stale cgroup kept");
    cr_assert_eq(access(cg_made[1], F_OK), 0, "running sandbox's cgroup removed");
    cr_assert_geq(rep.cgroups_removed, 1);
}

/* The daemon's loop must never sleep on SQLite's lock: with a busy timeout of 0 a write
 * that meets another process's write lock fails at once with -EBUSY, and works again when
 * the lock is gone. */
Test(state, busy_timeout_zero_fails_fast_instead_of_sleeping)
{
    st = open_ok();
    conch_state_set_busy_timeout(st, 0);
    sqlite3 *db = NULL;
    cr_assert_eq(sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
    struct conch_state_sandbox sb;
    fill_sandbox(&sb, "sb-busy", "running", 1.0);
    struct conch_err err = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(conch_state_sandbox_put(st, &sb, &err), -EBUSY, "%s", err.msg);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    cr_assert_lt(ms, 100, "the write waited %.0f ms for the lock", ms);
    cr_assert_eq(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
    cr_assert_eq(conch_state_sandbox_put(st, &sb, &err), 0, "%s", err.msg);
    sqlite3_close(db);
    /* A second open of a current database (conch gc) takes no write lock: the first's
     * writes never see it busy. */
    struct conch_state *reader = open_ok();
    struct conch_state_sandbox *list = NULL;
    size_t n = 0;
    cr_assert_eq(conch_state_sandbox_list(reader, &list, &n, &err), 0);
    cr_assert_eq(n, 1);
    conch_state_sandbox_free_list(list, n);
    sb.last_used_at = 42;
    cr_assert_eq(conch_state_sandbox_put(st, &sb, &err), 0, "%s", err.msg);
    conch_state_close(reader);
    conch_state_sandbox_done(&sb);
}

Test(state, claim_admits_one_writer)
{
    st = open_ok();
    struct conch_err err = {0};
    cr_assert_eq(conch_state_claim(st, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_state_claim(st, &err), 0, "claiming twice is fine");
    struct conch_state *other = open_ok();
    cr_assert_eq(conch_state_claim(other, &err), -EBUSY);
    cr_assert_not_null(strstr(err.msg, "another conch daemon"), "%s", err.msg);
    conch_state_close(st);
    st = NULL;
    cr_assert_eq(conch_state_claim(other, &err), 0, "%s", err.msg);
    conch_state_close(other);
}
