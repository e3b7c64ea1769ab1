/* test_fences.c - unit tests for the seccomp and Landlock fences: each check runs in a forked
 * child that installs the fence for real, then reports the first broken expectation back
 * through a pipe. Arguments are chosen so that an unfenced call fails differently (or does
 * nothing harmful), so the tests fail if a fence is missing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/bpf.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include <valgrind/valgrind.h>

#include "jail/landlock.h"
#include "jail/seccomp.h"

static int report_fd = -1;

/* In the child: report a broken expectation to the parent and exit. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        (void)!write(report_fd, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
    _exit(1);
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail(__VA_ARGS__);                                                                     \
    } while (0)

/* Expect a call to fail with @want; the message names the call and what happened. */
#define EXPECT_ERRNO(call, want)                                                                   \
    do {                                                                                           \
        errno = 0;                                                                                 \
        long _r = (long)(call);                                                                    \
        if (_r == 0 && getpid() != self)                                                           \
            _exit(0); /* an unfenced clone's child: leave quietly */                               \
        CHECK(_r == -1 && errno == (want), "%s: returned %ld errno %d (%s), want %s", #call, _r,   \
              errno, strerror(errno), strerrorname_np(want));                                      \
    } while (0)

#define EXPECT_OK(call)                                                                            \
    do {                                                                                           \
        errno = 0;                                                                                 \
        long _r = (long)(call);                                                                    \
        CHECK(_r >= 0, "%s: failed: %s", #call, strerror(errno));                                  \
    } while (0)

static pid_t self;

enum fence { FENCE_NONE = 0, FENCE_SECCOMP = 1, FENCE_LANDLOCK = 2 };

struct child_ctx {
    const char *const *writable; /* for FENCE_LANDLOCK */
    pid_t outsider;              /* a process outside the child's Landlock domain */
    const char *abstract_name;   /* an abstract unix socket bound outside it */
    const char *dir;             /* a scratch directory the test may use */
    const char *other_dir;       /* a second one, not writable under Landlock */
};

/*
 * Fork a child that sets no_new_privs, installs the requested fences and runs @fn. Returns
 * the raw wait status; *msg receives whatever the child reported.
 */
static int run_child(int fences, void (*fn)(const struct child_ctx *), const struct child_ctx *c,
                     char *msg, size_t msg_size)
{
    struct conch_seccomp_prog prog = {0};
    struct conch_err err = {0};
    if (fences & FENCE_SECCOMP)
        cr_assert_eq(conch_seccomp_prog_build(&(struct conch_seccomp_opts){0}, &prog, &err), 0,
                     "build: %s", err.msg);

    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        report_fd = p[1];
        self = getpid();
        CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no_new_privs: %s", strerror(errno));
        if (fences & FENCE_LANDLOCK) {
            int r = conch_landlock_apply_child(c->writable);
            CHECK(r == 0, "landlock apply: %d (%s)", r, strerror(-r));
        }
        if (fences & FENCE_SECCOMP) {
            int r = conch_seccomp_install_child(&prog);
            CHECK(r == 0, "seccomp install: %s", strerror(-r));
        }
        fn(c);
        _exit(0);
    }
    close(p[1]);
    conch_seccomp_prog_done(&prog);
    size_t off = 0;
    ssize_t n;
    while (off + 1 < msg_size && (n = read(p[0], msg + off, msg_size - 1 - off)) > 0)
        off += (size_t)n;
    msg[off] = '\0';
    close(p[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return status;
}

static void expect_child_ok(int fences, void (*fn)(const struct child_ctx *),
                            const struct child_ctx *c)
{
    char msg[512];
    int status = run_child(fences, fn, c, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status 0x%x): %s",
              status, msg);
}

/* ---- scratch directories ----
 * Made in the test body after any cr_skip: Criterion does not run .fini for a skipped test. */

static char dir_a[64], dir_b[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void make_dirs(void)
{
    strcpy(dir_a, "/tmp/conch-fences-a.XXXXXX");
    strcpy(dir_b, "/tmp/conch-fences-b.XXXXXX");
    cr_assert_not_null(mkdtemp(dir_a));
    cr_assert_not_null(mkdtemp(dir_b));
}

static void remove_dirs(void)
{
    if (dir_a[0])
        nftw(dir_a, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    if (dir_b[0])
        nftw(dir_b, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* ---- seccomp ---- */

Test(seccomp, prog_build_and_done)
{
    struct conch_seccomp_prog prog = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_seccomp_prog_build(&(struct conch_seccomp_opts){0}, &prog, &err), 0, "%s",
                 err.msg);
    cr_assert_not_null(prog.insns);
    cr_assert_gt(prog.len, 10);
    cr_assert_leq(prog.len, BPF_MAXINSNS);
    conch_seccomp_prog_done(&prog);
    cr_assert_null(prog.insns);
    cr_assert_eq(prog.len, 0);
    conch_seccomp_prog_done(&prog); /* idempotent, and fine on a zeroed struct */
    conch_seccomp_prog_done(NULL);
}

Test(seccomp, install_rejects_empty_prog)
{
    struct conch_seccomp_prog prog = {0};
    cr_assert_eq(conch_seccomp_install_child(&prog), -EINVAL);
    cr_assert_eq(conch_seccomp_install_child(NULL), -EINVAL);
}

static void denied_syscalls(const struct child_ctx *c)
{
    char path[128];
    /* Each call would fail with some other errno (or harmlessly succeed) if it were not
     * fenced: a missing mount point, bad pointers, bad flags. */
    EXPECT_ERRNO(syscall(SYS_mount, "none", "/nonexistent-conch", "tmpfs", 0, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_umount2, "/nonexistent-conch", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_pivot_root, "/nonexistent-conch", "/nonexistent-conch"), EPERM);
    EXPECT_ERRNO(syscall(SYS_move_mount, -1, "", -1, "", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_open_tree, -1, "/nonexistent-conch", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_fsopen, "nonexistent-fs", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_fsconfig, -1, 0, NULL, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_fsmount, -1, 0, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_fspick, -1, "", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_mount_setattr, -1, "", 0, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_unshare, CLONE_NEWUSER), EPERM);
    EXPECT_ERRNO(syscall(SYS_unshare, CLONE_NEWNS), EPERM);
    EXPECT_ERRNO(syscall(SYS_setns, -1, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_clone, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_clone, CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_clone, CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0), EPERM);
    /* glibc's int flags sign-extended: the upper half must not matter */
    EXPECT_ERRNO(syscall(SYS_clone, (long)(int)(CLONE_NEWNET | CLONE_IO | SIGCHLD), 0, 0, 0, 0),
                 EPERM);
    EXPECT_ERRNO(syscall(SYS_clone3, NULL, 0), ENOSYS);
    EXPECT_ERRNO(syscall(SYS_bpf, BPF_PROG_LOAD, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_keyctl, -1, 0, 0, 0, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_add_key, NULL, NULL, NULL, 0, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_request_key, NULL, NULL, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_perf_event_open, NULL, 0, -1, -1, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_kexec_load, 0, 0, NULL, ~0UL), EPERM);
    EXPECT_ERRNO(syscall(SYS_kexec_file_load, -1, -1, 0, NULL, ~0UL), EPERM);
    EXPECT_ERRNO(syscall(SYS_init_module, NULL, 0, ""), EPERM);
    EXPECT_ERRNO(syscall(SYS_finit_module, -1, "", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_delete_module, "nonexistent_conch", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_io_uring_setup, 0, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_io_uring_register, -1, 0, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_userfaultfd, ~0), EPERM);
    EXPECT_ERRNO(syscall(SYS_open_by_handle_at, -1, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_name_to_handle_at, -1, "", NULL, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_clock_settime, -1, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_settimeofday, NULL, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_clock_adjtime, -1, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_adjtimex, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_swapon, "/nonexistent-conch", 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_swapoff, "/nonexistent-conch"), EPERM);
    EXPECT_ERRNO(syscall(SYS_reboot, 0, 0, 0, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_syslog, -1, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_acct, "/nonexistent-conch/x"), EPERM);
    EXPECT_ERRNO(syscall(SYS_quotactl, 0, NULL, 0, NULL), EPERM);
    EXPECT_ERRNO(syscall(SYS_lookup_dcookie, 0, NULL, 0), EPERM);
    EXPECT_ERRNO(syscall(SYS_iopl, 4), EPERM);
    EXPECT_ERRNO(syscall(SYS_ioperm, 0, 0, 0), EPERM);

    /* device nodes are refused; FIFOs and sockets are not */
    snprintf(path, sizeof(path), "%s/null", c->dir);
    EXPECT_ERRNO(mknod(path, S_IFCHR | 0600, makedev(1, 3)), EPERM);
    EXPECT_ERRNO(mknod(path, S_IFBLK | 0600, makedev(7, 0)), EPERM);
    EXPECT_ERRNO(syscall(SYS_mknod, path, S_IFCHR | 0600, makedev(1, 3)), EPERM);
    EXPECT_ERRNO(mknodat(AT_FDCWD, path, S_IFCHR | 0600, makedev(1, 3)), EPERM);
    snprintf(path, sizeof(path), "%s/fifo", c->dir);
    EXPECT_OK(mkfifo(path, 0600));
    snprintf(path, sizeof(path), "%s/fifo2", c->dir);
    EXPECT_OK(syscall(SYS_mknod, path, S_IFIFO | 0600, 0));
    snprintf(path, sizeof(path), "%s/sock", c->dir);
    EXPECT_OK(mknodat(AT_FDCWD, path, S_IFSOCK | 0600, 0));
}

Test(seccomp, denies_the_deny_list, .fini = remove_dirs, .timeout = 30)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind emulates clone and refuses namespace flags itself");
    make_dirs();
    struct child_ctx c = {.dir = dir_a};
    expect_child_ok(FENCE_SECCOMP, denied_syscalls, &c);
}

/* The same expectations must fail without the filter: the arguments are not what fails. */
Test(seccomp, deny_list_test_detects_missing_filter, .fini = remove_dirs, .timeout = 30)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind emulates clone and refuses namespace flags itself");
    make_dirs();
    struct child_ctx c = {.dir = dir_a};
    char msg[512];
    int status = run_child(FENCE_NONE, denied_syscalls, &c, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x", status);
    cr_assert(strstr(msg, "SYS_mount") != NULL, "unexpected report: %s", msg);
}

static void tty_ioctls(const struct child_ctx *c)
{
    (void)c;
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    CHECK(m >= 0, "posix_openpt: %s", strerror(errno));
    CHECK(grantpt(m) == 0 && unlockpt(m) == 0, "unlockpt: %s", strerror(errno));
    char ch = 'x';
    EXPECT_ERRNO(ioctl(m, TIOCSTI, &ch), EPERM);
    /* the kernel reads the request as 32 bits; junk in the upper half must not slip past */
    EXPECT_ERRNO(syscall(SYS_ioctl, m, 0xdead00000000UL | TIOCSTI, &ch), EPERM);
    char sub[64] = {0}; /* subcode 0; sized for what valgrind's wrapper reads */
    EXPECT_ERRNO(ioctl(m, TIOCLINUX, sub), EPERM);
    /* ordinary terminal ioctls work */
    struct winsize ws = {.ws_row = 24, .ws_col = 80};
    EXPECT_OK(ioctl(m, TIOCSWINSZ, &ws));
    EXPECT_OK(ioctl(m, TIOCGWINSZ, &ws));
    CHECK(ws.ws_col == 80, "TIOCGWINSZ cols %d", ws.ws_col);
    close(m);
}

Test(seccomp, denies_tty_injection, .timeout = 30)
{
    struct child_ctx c = {0};
    expect_child_ok(FENCE_SECCOMP, tty_ioctls, &c);
}

static void personalities(const struct child_ctx *c)
{
    (void)c;
    EXPECT_ERRNO(syscall(SYS_personality, READ_IMPLIES_EXEC), EPERM);
    EXPECT_ERRNO(syscall(SYS_personality, MMAP_PAGE_ZERO), EPERM);
    EXPECT_ERRNO(syscall(SYS_personality, 1), EPERM);
    /* the kernel takes an unsigned int: upper bits must not disguise a denied value */
    EXPECT_ERRNO(syscall(SYS_personality, 0x100000000UL | READ_IMPLIES_EXEC), EPERM);
    EXPECT_OK(syscall(SYS_personality, 0));
    long cur = syscall(SYS_personality, 0xffffffffUL);
    CHECK(cur == 0, "personality query returned %ld", cur);
    EXPECT_OK(syscall(SYS_personality, ADDR_NO_RANDOMIZE));
    cur = syscall(SYS_personality, 0xffffffffUL);
    CHECK(cur == ADDR_NO_RANDOMIZE, "personality now %ld", cur);
    EXPECT_OK(syscall(SYS_personality, PER_LINUX32 | ADDR_NO_RANDOMIZE));
    EXPECT_OK(syscall(SYS_personality, PER_LINUX32));
    EXPECT_OK(syscall(SYS_personality, 0));
}

Test(seccomp, personality_allow_list, .timeout = 30)
{
    struct child_ctx c = {0};
    expect_child_ok(FENCE_SECCOMP, personalities, &c);
}

static void *thread_fn(void *arg)
{
    return (char *)arg + 1;
}

static void ordinary_things(const struct child_ctx *c)
{
    char path[128], buf[16] = {0};
    CHECK(getpid() == self, "getpid");
    snprintf(path, sizeof(path), "%s/file", c->dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    CHECK(fd >= 0, "open: %s", strerror(errno));
    CHECK(write(fd, "hello", 5) == 5, "write: %s", strerror(errno));
    CHECK(pread(fd, buf, sizeof(buf) - 1, 0) == 5 && strcmp(buf, "hello") == 0, "read back");
    close(fd);

    /* fork() is clone(SIGCHLD|CLONE_CHILD_*), without namespace flags */
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0)
        _exit(7);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 7, "fork child");

    /* glibc tries clone3, gets ENOSYS and falls back to clone(CLONE_VM|CLONE_THREAD|...) */
    pthread_t t;
    char x = 0;
    void *res = NULL;
    CHECK(pthread_create(&t, NULL, thread_fn, &x) == 0, "pthread_create");
    CHECK(pthread_join(t, &res) == 0 && res == &x + 1, "pthread_join");

    /* ptrace stays allowed: a missing target is ESRCH, not EPERM */
    long word = 0;
    EXPECT_ERRNO(syscall(SYS_ptrace, PTRACE_PEEKDATA, 0x7fffffff, 0, &word), ESRCH);
}

Test(seccomp, ordinary_calls_still_work, .fini = remove_dirs, .timeout = 30)
{
    make_dirs();
    struct child_ctx c = {.dir = dir_a};
    expect_child_ok(FENCE_SECCOMP, ordinary_things, &c);
}

/* x32 calls reuse the x86_64 audit arch with bit 30 set in the number; i386 calls via int 0x80
 * carry AUDIT_ARCH_I386. Either must kill the process, not reach the kernel unfiltered. */
static void x32_call(const struct child_ctx *c)
{
    (void)c;
    syscall(0x40000000L | SYS_getpid);
    fail("x32 getpid returned");
}

static void i386_call(const struct child_ctx *c)
{
    (void)c;
    long ret = 20; /* __NR_getpid on i386 */
    __asm__ volatile("int $0x80" : "+a"(ret) : : "memory");
    fail("i386 getpid returned %ld", ret);
}

Test(seccomp, foreign_arch_is_killed, .timeout = 30)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind does not emulate x32 or int 0x80");
    struct child_ctx c = {0};
    char msg[512];
    int status = run_child(FENCE_SECCOMP, x32_call, &c, msg, sizeof(msg));
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS, "x32: status 0x%x: %s", status,
              msg);
    /* A kernel without IA32 emulation (CONFIG_IA32_EMULATION off, or ia32_emulation=0)
     * refuses int 0x80 itself, with SIGSEGV, filter or not: nothing reaches it to filter. */
    pid_t pid = fork();
    if (pid == 0) {
        long ret = 20; /* __NR_getpid on i386 */
        __asm__ volatile("int $0x80" : "+a"(ret) : : "memory");
        _exit(0);
    }
    /* (under ASan its SEGV handler turns the fault into exit status 1) */
    if (pid > 0 && waitpid(pid, &status, 0) == pid && !(WIFEXITED(status) && !WEXITSTATUS(status)))
        return;
    status = run_child(FENCE_SECCOMP, i386_call, &c, msg, sizeof(msg));
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS, "i386: status 0x%x: %s", status,
              msg);
}

/* ---- Landlock ---- */

static void skip_without_landlock(void)
{
    if (conch_landlock_abi() <= 0)
        cr_skip("Landlock is not available on this kernel (conch_landlock_abi() == 0)");
}

static void write_file(const char *dir, const char *name, int want_errno)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (want_errno) {
        errno = 0;
        int r = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
        CHECK(r == -1 && errno == want_errno, "create '%s': returned %d (%s), want %s", path, r,
              strerror(errno), strerrorname_np(want_errno));
        return;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    CHECK(fd >= 0, "create '%s': %s", path, strerror(errno));
    CHECK(write(fd, "x", 1) == 1, "write '%s': %s", path, strerror(errno));
    close(fd);
}

static void landlock_checks(const struct child_ctx *c)
{
    char from[128], to[128];
    write_file(c->dir, "ok", 0);
    write_file(c->other_dir, "denied", EACCES);

    /* the pre-existing file in the other directory can be read but not written or removed */
    snprintf(from, sizeof(from), "%s/existing", c->other_dir);
    EXPECT_OK(access(from, R_OK) == 0 ? 0 : -1);
    int fd = open(from, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0, "read-open '%s': %s", from, strerror(errno));
    close(fd);
    EXPECT_ERRNO(open(from, O_WRONLY | O_CLOEXEC), EACCES);
    EXPECT_ERRNO(unlink(from), EACCES);
    snprintf(to, sizeof(to), "%s/sub", c->other_dir);
    EXPECT_ERRNO(mkdir(to, 0700), EACCES);

    /* inside the writable tree: directories, renames, removal */
    snprintf(to, sizeof(to), "%s/sub", c->dir);
    EXPECT_OK(mkdir(to, 0700));
    snprintf(from, sizeof(from), "%s/ok", c->dir);
    snprintf(to, sizeof(to), "%s/sub/ok", c->dir);
    EXPECT_OK(rename(from, to));
    EXPECT_OK(unlink(to));

    /* reading and executing elsewhere still works */
    fd = open("/etc/hostname", O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0, "read /etc/hostname: %s", strerror(errno));
    char buf[64];
    CHECK(read(fd, buf, sizeof(buf)) > 0, "read /etc/hostname: %s", strerror(errno));
    close(fd);
    EXPECT_ERRNO(open("/etc/hostname", O_WRONLY | O_CLOEXEC), EACCES);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0,
          "exec /bin/true: status 0x%x", st);

    /* a writable file (not a directory) rule: /dev/null */
    fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    CHECK(fd >= 0, "open /dev/null for writing: %s", strerror(errno));
    close(fd);
}

static void prepare_other_dir(void)
{
    char path[128];
    snprintf(path, sizeof(path), "%s/existing", dir_b);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    close(fd);
}

Test(landlock, abi_is_reported)
{
    int abi = conch_landlock_abi();
    cr_assert_geq(abi, 0);
    if (abi == 0)
        cr_skip("Landlock is not available on this kernel");
    cr_log_info("Landlock ABI %d", abi);
}

Test(landlock, writes_only_beneath_writable, .fini = remove_dirs, .timeout = 30)
{
    skip_without_landlock();
    make_dirs();
    prepare_other_dir();
    /* a missing path is skipped; a non-directory path gets file rights only */
    const char *const writable[] = {"/nonexistent-conch", dir_a, "/dev/null", NULL};
    struct child_ctx c = {.writable = writable, .dir = dir_a, .other_dir = dir_b};
    expect_child_ok(FENCE_LANDLOCK, landlock_checks, &c);
}

/* Without the fence the same checks fail at the first denied write: they do test Landlock. */
Test(landlock, checks_detect_missing_fence, .fini = remove_dirs, .timeout = 30)
{
    make_dirs();
    prepare_other_dir();
    struct child_ctx c = {.dir = dir_a, .other_dir = dir_b};
    char msg[512];
    int status = run_child(FENCE_NONE, landlock_checks, &c, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x", status);
    cr_assert(strstr(msg, "denied") != NULL, "unexpected report: %s", msg);
}

static void nothing_writable(const struct child_ctx *c)
{
    write_file(c->dir, "denied", EACCES);
}

Test(landlock, null_list_makes_everything_read_only, .fini = remove_dirs, .timeout = 30)
{
    skip_without_landlock();
    make_dirs();
    struct child_ctx c = {.writable = NULL, .dir = dir_a};
    expect_child_ok(FENCE_LANDLOCK, nothing_writable, &c);
}

static void both_fences(const struct child_ctx *c)
{
    write_file(c->dir, "ok", 0);
    write_file(c->other_dir, "denied", EACCES);
    EXPECT_ERRNO(syscall(SYS_unshare, CLONE_NEWUSER), EPERM);
}

/* The warden's order: Landlock first (its syscalls are not in the seccomp deny list anyway),
 * then seccomp. */
Test(fences, landlock_then_seccomp, .fini = remove_dirs, .timeout = 30)
{
    skip_without_landlock();
    make_dirs();
    const char *const writable[] = {dir_a, NULL};
    struct child_ctx c = {.writable = writable, .dir = dir_a, .other_dir = dir_b};
    expect_child_ok(FENCE_LANDLOCK | FENCE_SECCOMP, both_fences, &c);
}

/* ---- Landlock scoping (ABI >= 6) ---- */

static int abstract_addr(const char *name, struct sockaddr_un *sa)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(sa->sun_path + 1, name, n); /* sun_path[0] == '\0': abstract */
    return (int)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void scoped_checks(const struct child_ctx *c)
{
    /* outside the domain: the test process's other child, and the test process's socket */
    EXPECT_ERRNO(kill(c->outsider, 0), EPERM);
    EXPECT_ERRNO(kill(c->outsider, SIGTERM), EPERM);
    struct sockaddr_un sa;
    int len = abstract_addr(c->abstract_name, &sa);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(s >= 0, "socket: %s", strerror(errno));
    EXPECT_ERRNO(connect(s, (struct sockaddr *)&sa, (socklen_t)len), EPERM);
    close(s);

    /* inside it: our own children and our own sockets */
    pid_t kid = fork();
    CHECK(kid >= 0, "fork: %s", strerror(errno));
    if (kid == 0) {
        pause();
        _exit(0);
    }
    EXPECT_OK(kill(kid, SIGKILL));
    waitpid(kid, NULL, 0);
    char own[64];
    snprintf(own, sizeof(own), "%s-inner", c->abstract_name);
    len = abstract_addr(own, &sa);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(l >= 0 && bind(l, (struct sockaddr *)&sa, (socklen_t)len) == 0 && listen(l, 1) == 0,
          "bind own socket: %s", strerror(errno));
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_OK(connect(s, (struct sockaddr *)&sa, (socklen_t)len));
    close(s);
    close(l);
}

/* Fork an outsider and bind a listening abstract socket, run the checks with @fences, clean
 * up, and return the child's status. */
static int run_scoped(int fences, char *msg, size_t msg_size)
{
    char name[64];
    snprintf(name, sizeof(name), "conch-fences-scope-%d", (int)getpid());
    struct sockaddr_un sa;
    int len = abstract_addr(name, &sa);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(l, 0);
    cr_assert_eq(bind(l, (struct sockaddr *)&sa, (socklen_t)len), 0, "bind: %s", strerror(errno));
    cr_assert_eq(listen(l, 4), 0);
    pid_t outsider = fork();
    cr_assert_geq(outsider, 0);
    if (outsider == 0) {
        pause();
        _exit(0);
    }
    struct child_ctx c = {.outsider = outsider, .abstract_name = name};
    int status = run_child(fences, scoped_checks, &c, msg, msg_size);
    kill(outsider, SIGKILL);
    waitpid(outsider, NULL, 0);
    close(l);
    return status;
}

Test(landlock, scopes_signals_and_abstract_sockets, .timeout = 30)
{
    if (conch_landlock_abi() < 6)
        cr_skip("Landlock ABI %d < 6: no signal or abstract-socket scoping on this kernel",
                conch_landlock_abi());
    char msg[512];
    int status = run_scoped(FENCE_LANDLOCK, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status 0x%x): %s",
              status, msg);
}

/* Without Landlock the outsider can be signalled: the checks do test the scoping. */
Test(landlock, scope_checks_detect_missing_fence, .timeout = 30)
{
    char msg[512];
    int status = run_scoped(FENCE_NONE, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x", status);
    cr_assert(strstr(msg, "kill(c->outsider, 0)") != NULL, "unexpected report: %s", msg);
}
