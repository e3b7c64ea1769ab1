/* test_seccomp.c - the seccomp allowlist, proven by calling every syscall number under the
 * real filter: a forked child installs a filter built with errno values the kernel never
 * returns, calls each number with invalid arguments, and reports which calls the filter
 * answered and which reached the kernel; the answers must match the filter's tables. Also the
 * rules that keep set-uid/set-gid files and devices from being created, openat2 for the file
 * worker only, calls newer than libseccomp, and foreign ABIs (x32, i386) being killed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/openat2.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include <valgrind/valgrind.h>

#include "jail/seccomp.h"

/* What the test filter answers instead of EPERM and ENOSYS: above anything the kernel
 * returns (its errno values stop well below 4095), so any other result came from the kernel. */
#define FILTER_EPERM 4001
#define FILTER_ENOSYS 4002

/* Numbers walked: every syscall of x86_64 and aarch64 today (both stop below 470), with
 * room for new ones. */
#define WALK_MAX 1024

static int report_fd = -1;

__attribute__((format(printf, 1, 2))) static void report(const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        (void)!write(report_fd, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/*
 * Fork a child that isolates itself as far as it can (a new user namespace, so a call that
 * slipped through the filter could touch nothing of the host's; new IPC, network and UTS
 * namespaces, so calls that create objects create them there), sets no_new_privs, installs
 * @prog and runs @fn. Returns the wait status; *msg gets what the child reported.
 */
static int run_isolated(const struct conch_seccomp_prog *prog, void (*fn)(void *), void *arg,
                        char *msg, size_t msg_size)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        report_fd = p[1];
        if (unshare(CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS) < 0) {
            report("unshare: %s (the walk needs user namespaces)", strerror(errno));
            _exit(2);
        }
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            (prog && conch_seccomp_install_child(prog) < 0)) {
            report("install filter: %s", strerror(errno));
            _exit(2);
        }
        fn(arg);
        _exit(0);
    }
    close(p[1]);
    size_t off = 0;
    ssize_t n;
    while (off + 1 < msg_size && (n = read(p[0], msg + off, msg_size - 1 - off)) > 0)
        off += (size_t)n;
    msg[off] = '\0';
    /* drain the rest so the child never blocks on a full pipe */
    char sink[4096];
    while (read(p[0], sink, sizeof(sink)) > 0)
        ;
    close(p[0]);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return status;
}

static void build(const struct conch_seccomp_opts *opts, struct conch_seccomp_prog *prog)
{
    struct conch_err err = {0};
    cr_assert_eq(conch_seccomp__prog_build_errnos(opts, FILTER_EPERM, FILTER_ENOSYS, prog, &err), 0,
                 "build: %s", err.msg);
}

/* ---- the walk ---- */

/* Calls that must not be made even with invalid arguments: they end, stop or fork the
 * caller whatever they are given. Each is checked against the tables instead. */
static bool unsafe_to_call(long nr)
{
    static const char *const names[] = {"exit", "exit_group", "rt_sigreturn", "pause",
                                        "fork", "vfork",      "vhangup",      NULL};
    for (size_t i = 0; names[i]; i++)
        if (nr == seccomp_syscall_resolve_name(names[i]))
            return true;
#if defined(__x86_64__)
    /* uretprobe (335) and uprobe (336): the kernel (6.14+, 6.16+) runs them without
     * consulting seccomp, since only its own uprobe trampolines may call them; anyone else
     * gets SIGILL (uretprobe) or ENXIO (uprobe). No filter can refuse them. */
    if (nr == 335 || nr == 336)
        return true;
#endif
    return false;
}

enum outcome { GOT_KERNEL, GOT_EPERM, GOT_ENOSYS };

static const char *outcome_name(int o)
{
    return o == GOT_KERNEL  ? "reached the kernel"
           : o == GOT_EPERM ? "filter EPERM"
                            : "filter ENOSYS";
}

struct walk_args {
    const struct conch_seccomp_opts *opts;
    unsigned reached; /* out, via the report: how many numbers reached the kernel */
};

static void walk(void *arg)
{
    const struct walk_args *wa = arg;
    unsigned reached = 0, bad = 0;
    for (long nr = 0; nr < WALK_MAX + 3; nr++) {
        /* past WALK_MAX: numbers far beyond any table, but still native (x32 is bit 30) */
        long call = nr < WALK_MAX        ? nr
                    : nr == WALK_MAX     ? 0x3ffffffeL
                    : nr == WALK_MAX + 1 ? 0x3fffffffL
                                         : 0x20000000L;
        if (unsafe_to_call(call))
            continue;
        int verdict = conch_seccomp__verdict(wa->opts, call);
        errno = 0;
        /* -1 everywhere: a bad fd, an unmapped pointer, an impossible size or flag set */
        if (getenv("WALK_DEBUG"))
            dprintf(2, "nr %ld\n", call);
        long r = syscall(call, -1L, -1L, -1L, -1L, -1L, -1L);
        int e = errno;
        int got = r == -1 && e == FILTER_EPERM    ? GOT_EPERM
                  : r == -1 && e == FILTER_ENOSYS ? GOT_ENOSYS
                                                  : GOT_KERNEL;
        bool ok;
        switch (verdict) {
        case CONCH_SECCOMP__ALLOW:
            ok = got == GOT_KERNEL;
            break;
        case CONCH_SECCOMP__EPERM:
            ok = got == GOT_EPERM;
            break;
        case CONCH_SECCOMP__ARGS:
            ok = got == GOT_KERNEL || got == GOT_EPERM;
            break;
        default:
            ok = got == GOT_ENOSYS;
            break;
        }
        if (got == GOT_KERNEL)
            reached++;
        if (!ok && bad++ < 20) {
            char *name = seccomp_syscall_resolve_num_arch(SCMP_ARCH_NATIVE, (int)call);
            report("syscall %ld (%s): %s (returned %ld, errno %d), tables say %d\n", call,
                   name ? name : "?", outcome_name(got), r, e, verdict);
            free(name);
        }
    }
    report("reached=%u bad=%u\n", reached, bad);
    _exit(bad ? 1 : 0);
}

static void walk_and_check(const struct conch_seccomp_opts *opts, unsigned *ret_reached)
{
    struct conch_seccomp_prog prog = {0};
    build(opts, &prog);
    struct walk_args wa = {.opts = opts};
    char msg[8192];
    int status = run_isolated(&prog, walk, &wa, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "walk failed (status 0x%x):\n%s",
              status, msg);
    const char *s = strstr(msg, "reached=");
    cr_assert_not_null(s, "%s", msg);
    *ret_reached = (unsigned)strtoul(s + 8, NULL, 10);
}

Test(seccomp_walk, every_number_matches_the_allowlist, .timeout = 60)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind does not emulate seccomp");
    unsigned reached = 0;
    walk_and_check(&(struct conch_seccomp_opts){0}, &reached);
    /* Sanity: the list is real (x86_64 allows ~250 calls), and nowhere near everything. */
    cr_assert_gt(reached, 150, "only %u syscalls reached the kernel", reached);
    cr_assert_lt(reached, 320, "%u syscalls reached the kernel", reached);
    cr_log_info("%u syscall numbers reach the kernel", reached);
}

Test(seccomp_walk, file_worker_matches_its_allowlist, .timeout = 60)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind does not emulate seccomp");
    unsigned reached = 0;
    walk_and_check(&(struct conch_seccomp_opts){.file_worker = true}, &reached);
    cr_assert_eq(
        conch_seccomp__verdict(&(struct conch_seccomp_opts){.file_worker = true}, SYS_openat2),
        CONCH_SECCOMP__ALLOW);
}

/* The walk is only as good as the tables it compares against: these must never be let
 * through, whatever the list says. */
Test(seccomp_walk, dangerous_calls_are_not_on_the_list)
{
    static const char *const names[] = {"mount",
                                        "umount2",
                                        "pivot_root",
                                        "move_mount",
                                        "open_tree",
                                        "fsopen",
                                        "fsconfig",
                                        "fsmount",
                                        "fspick",
                                        "mount_setattr",
                                        "unshare",
                                        "setns",
                                        "clone3",
                                        "bpf",
                                        "keyctl",
                                        "add_key",
                                        "request_key",
                                        "perf_event_open",
                                        "kexec_load",
                                        "kexec_file_load",
                                        "init_module",
                                        "finit_module",
                                        "delete_module",
                                        "io_uring_setup",
                                        "io_uring_enter",
                                        "io_uring_register",
                                        "io_setup",
                                        "io_submit",
                                        "userfaultfd",
                                        "open_by_handle_at",
                                        "name_to_handle_at",
                                        "settimeofday",
                                        "clock_settime",
                                        "clock_adjtime",
                                        "adjtimex",
                                        "swapon",
                                        "swapoff",
                                        "reboot",
                                        "syslog",
                                        "acct",
                                        "quotactl",
                                        "quotactl_fd",
                                        "lookup_dcookie",
                                        "vhangup",
                                        "iopl",
                                        "ioperm",
                                        "openat2",
                                        "modify_ldt",
                                        "uselib",
                                        "fanotify_init",
                                        "memfd_secret",
                                        "_sysctl",
                                        "ustat",
                                        "sysfs",
                                        "vm86",
                                        "vm86old",
                                        NULL};
    const struct conch_seccomp_opts cmd = {0};
    for (size_t i = 0; names[i]; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr < 0)
            continue; /* not on this architecture */
        int v = conch_seccomp__verdict(&cmd, nr);
        cr_expect(v == CONCH_SECCOMP__EPERM || v == CONCH_SECCOMP__ENOSYS, "%s: verdict %d",
                  names[i], v);
    }
    /* newer than Debian's libseccomp: numbers shared by x86_64 and aarch64 */
    const long newer[] = {
        457 /* statmount */,         458 /* listmount */,        459 /* lsm_get_self_attr */,
        460 /* lsm_set_self_attr */, 461 /* lsm_list_modules */, 463 /* setxattrat */,
        467 /* open_tree_attr */,    468 /* file_getattr */,     469 /* file_setattr */};
    for (size_t i = 0; i < sizeof(newer) / sizeof(newer[0]); i++)
        cr_expect_eq(conch_seccomp__verdict(&cmd, newer[i]), CONCH_SECCOMP__ENOSYS, "nr %ld",
                     newer[i]);
}

/* The list is kept by libseccomp name for both architectures the sandbox supports; check
 * that aarch64 knows every name even when the build runs on x86_64. */
Test(seccomp_walk, names_resolve_on_x86_64_and_aarch64)
{
    struct conch_err err = {0};
    cr_assert_eq(conch_seccomp__check_names(SCMP_ARCH_X86_64, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_seccomp__check_names(SCMP_ARCH_AARCH64, &err), 0, "%s", err.msg);
}

#if defined(__x86_64__)
/* Foreign ABIs: every x32 number (bit 30) and every i386 number (int 0x80) kills the caller
 * before the kernel sees it. One grandchild per number, since each call is fatal. */
static void foreign_walk(void *arg)
{
    bool with_i386 = *(const bool *)arg;
    unsigned bad = 0;
    for (long nr = 0; nr < (with_i386 ? 2 : 1) * WALK_MAX; nr++) {
        bool i386 = nr >= WALK_MAX;
        long n = i386 ? nr - WALK_MAX : nr;
        pid_t pid = fork();
        if (pid < 0) {
            report("fork: %s\n", strerror(errno));
            _exit(1);
        }
        if (pid == 0) {
            if (i386) {
                long ret = n;
                __asm__ volatile("int $0x80" : "+a"(ret) : "b"(-1L), "c"(-1L), "d"(-1L) : "memory");
            } else {
                syscall(0x40000000L | n, -1L, -1L, -1L, -1L, -1L, -1L);
            }
            _exit(0);
        }
        int st = 0;
        if (waitpid(pid, &st, 0) != pid || !WIFSIGNALED(st) || WTERMSIG(st) != SIGSYS) {
            if (bad++ < 20)
                report("%s syscall %ld: status 0x%x, want SIGSYS\n", i386 ? "i386" : "x32", n, st);
        }
    }
    _exit(bad ? 1 : 0);
}

/* Whether the kernel runs i386 calls at all: without IA32 emulation (CONFIG_IA32_EMULATION
 * off, or ia32_emulation=0) int 0x80 is refused with SIGSEGV, filter or not, and nothing
 * reaches the kernel to filter. */
static bool kernel_runs_i386(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        long ret = 20; /* __NR_getpid on i386 */
        __asm__ volatile("int $0x80" : "+a"(ret) : : "memory");
        _exit(0);
    }
    int st = 0;
    /* (under ASan its SEGV handler turns the fault into exit status 1) */
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

Test(seccomp_walk, foreign_abis_are_killed, .timeout = 90)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind does not emulate x32 or int 0x80");
    bool with_i386 = kernel_runs_i386();
    struct conch_seccomp_prog prog = {0};
    build(NULL, &prog);
    char msg[4096];
    int status = run_isolated(&prog, foreign_walk, &with_i386, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x:\n%s", status, msg);
}
#endif

/* ---- set-uid, set-gid and devices ---- */

static char dir[64];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void make_dir(void)
{
    strcpy(dir, "/tmp/conch-seccomp.XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(chmod(dir, 0777), 0); /* writable from the child's user namespace */
}

static void remove_dir(void)
{
    if (dir[0])
        nftw(dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

static bool failed;

/* Expect @r/@e (a call's result and errno) to be @want (0 = success). */
static void expect(const char *what, long r, int e, int want)
{
    bool ok = want ? (r == -1 && e == want) : r >= 0;
    if (!ok) {
        report("%s: returned %ld errno %d (%s), want %s\n", what, r, r < 0 ? e : 0, strerror(e),
               want ? strerrorname_np(want) : "success");
        failed = true;
    }
}

#define EXPECT(call, want)                                                                         \
    do {                                                                                           \
        errno = 0;                                                                                 \
        long _r = (long)(call);                                                                    \
        expect(#call, _r, errno, want);                                                            \
        if (_r >= 0 && want == 0 && strstr(#call, "open") && _r > 2)                               \
            close((int)_r);                                                                        \
    } while (0)

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452
#endif

static char *at(const char *name)
{
    static char buf[8][128];
    static int i;
    char *p = buf[i++ % 8];
    snprintf(p, 128, "%s/%s", dir, name);
    return p;
}

/* Every way to create or set a set-uid/set-gid file or a device fails with EPERM; the same
 * calls without those bits work. Runs unfiltered too, where it must fail. */
static void set_id_bits(void *arg)
{
    (void)arg;
    failed = false;
    int fd = open(at("f"), O_WRONLY | O_CREAT | O_CLOEXEC, 0755);
    if (fd < 0) {
        report("create f: %s\n", strerror(errno));
        _exit(1);
    }
    /* chmod family */
    EXPECT(chmod(at("f"), 04755), EPERM);
    EXPECT(chmod(at("f"), 02755), EPERM);
    EXPECT(syscall(SYS_chmod, at("f"), 0x10000 | 06755), EPERM);
    EXPECT(fchmod(fd, 04711), EPERM);
    EXPECT(fchmod(fd, 02711), EPERM);
    EXPECT(fchmodat(AT_FDCWD, at("f"), 04755, 0), EPERM);
    EXPECT(syscall(SYS_fchmodat, AT_FDCWD, at("f"), 02755), EPERM);
    /* valgrind 3.19 does not know fchmodat2 and answers ENOSYS itself */
    bool vg = RUNNING_ON_VALGRIND;
    if (!vg) {
        EXPECT(syscall(SYS_fchmodat2, AT_FDCWD, at("f"), 04755, 0), EPERM);
        EXPECT(syscall(SYS_fchmodat2, AT_FDCWD, at("f"), 02755, 0), EPERM);
    }
    EXPECT(chmod(at("f"), 0750), 0);
    EXPECT(fchmod(fd, 01777), 0); /* sticky is not privilege */
    EXPECT(fchmodat(AT_FDCWD, at("f"), 0755, 0), 0);
    if (!vg)
        EXPECT(syscall(SYS_fchmodat2, AT_FDCWD, at("f"), 0644, 0), 0);
    close(fd);

    /* creating with the bits: open, openat, creat, O_TMPFILE */
    EXPECT(open(at("o1"), O_WRONLY | O_CREAT | O_CLOEXEC, 04755), EPERM);
    EXPECT(open(at("o2"), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 02755), EPERM);
    EXPECT(syscall(SYS_open, at("o3"), O_WRONLY | O_CREAT | O_CLOEXEC, 06755), EPERM);
    EXPECT(openat(AT_FDCWD, at("o4"), O_WRONLY | O_CREAT | O_CLOEXEC, 04700), EPERM);
    EXPECT(creat(at("o5"), 04755), EPERM);
    EXPECT(syscall(SYS_creat, at("o6"), 02755), EPERM);
    EXPECT(open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 04755), EPERM);
    EXPECT(openat(AT_FDCWD, dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 02700), EPERM);
    /* and without them, or without creating (the mode is then ignored) */
    EXPECT(open(at("ok1"), O_WRONLY | O_CREAT | O_CLOEXEC, 0755), 0);
    EXPECT(openat(AT_FDCWD, at("ok2"), O_WRONLY | O_CREAT | O_CLOEXEC, 0600), 0);
    EXPECT(creat(at("ok3"), 0644), 0);
    EXPECT(open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600), 0);
    EXPECT(open(at("ok1"), O_RDONLY | O_CLOEXEC, 04755), 0);
    EXPECT(syscall(SYS_openat, AT_FDCWD, at("ok1"), O_RDONLY | O_CLOEXEC, 06777), 0);

    /* directories */
    EXPECT(mkdir(at("d1"), 04755), EPERM);
    EXPECT(mkdir(at("d2"), 02775), EPERM);
    EXPECT(mkdirat(AT_FDCWD, at("d3"), 02700), EPERM);
    EXPECT(mkdir(at("dok"), 01777), 0);
    EXPECT(mkdirat(AT_FDCWD, at("dok2"), 0755), 0);

    /* mknod: regular files without the bits, FIFOs and sockets only */
    EXPECT(mknod(at("n1"), S_IFCHR | 0666, makedev(1, 3)), EPERM);
    EXPECT(mknod(at("n2"), S_IFBLK | 0666, makedev(7, 0)), EPERM);
    EXPECT(mknodat(AT_FDCWD, at("n3"), S_IFCHR | 0666, makedev(1, 7)), EPERM);
    EXPECT(mknod(at("n4"), S_IFREG | 04755, 0), EPERM);
    EXPECT(mknod(at("n5"), 02755, 0), EPERM); /* type 0 is a regular file */
    EXPECT(mknodat(AT_FDCWD, at("n6"), S_IFIFO | 04644, 0), EPERM);
    EXPECT(mknod(at("n7"), S_IFDIR | 0755, 0), EPERM);
    EXPECT(mknod(at("nok1"), S_IFREG | 0644, 0), 0);
    EXPECT(mknod(at("nok2"), 0644, 0), 0);
    EXPECT(mknod(at("nok3"), S_IFIFO | 0600, 0), 0);
    EXPECT(mknodat(AT_FDCWD, at("nok4"), S_IFSOCK | 0600, 0), 0);
    if (failed)
        _exit(1);
}

/* Run as the caller (no user namespace), so files land owned by the caller. */
static int run_plain(const struct conch_seccomp_prog *prog, void (*fn)(void *), char *msg,
                     size_t msg_size)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        report_fd = p[1];
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            (prog && conch_seccomp_install_child(prog) < 0))
            _exit(2);
        fn(NULL);
        _exit(0);
    }
    close(p[1]);
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

static int no_set_id(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)flag, (void)ftw;
    cr_expect_eq(st->st_mode & (S_ISUID | S_ISGID), 0, "%s has mode %o", path, st->st_mode);
    cr_expect(!S_ISCHR(st->st_mode) && !S_ISBLK(st->st_mode), "%s is a device", path);
    return 0;
}

Test(seccomp_setid, refused_with_eperm, .fini = remove_dir, .timeout = 30)
{
    make_dir();
    struct conch_seccomp_prog prog = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_seccomp_prog_build(NULL, &prog, &err), 0, "%s", err.msg);
    char msg[4096];
    int status = run_plain(&prog, set_id_bits, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status 0x%x:\n%s", status, msg);
    nftw(dir, no_set_id, 8, FTW_PHYS);
}

/* Without the filter the same expectations fail: chmod 04755 of one's own file works. */
Test(seccomp_setid, checks_detect_missing_filter, .fini = remove_dir, .timeout = 30)
{
    make_dir();
    char msg[4096];
    int status = run_plain(NULL, set_id_bits, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status 0x%x", status);
    cr_assert(strstr(msg, "chmod(at(\"f\"), 04755)") != NULL, "unexpected report: %s", msg);
}

/* ---- openat2 and the calls libseccomp does not know ---- */

static void openat2_call(void *arg)
{
    int want = *(int *)arg;
    struct open_how how = {.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC, .resolve = RESOLVE_BENEATH};
    errno = 0;
    long r = syscall(SYS_openat2, AT_FDCWD, ".", &how, sizeof(how));
    if (want ? !(r == -1 && errno == want) : r < 0) {
        report("openat2: returned %ld errno %d, want %d", r, errno, want);
        _exit(1);
    }
}

Test(seccomp_setid, openat2_only_for_the_file_worker, .timeout = 30)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind 3.19 does not know openat2");
    char msg[512];
    struct conch_seccomp_prog prog = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_seccomp_prog_build(NULL, &prog, &err), 0, "%s", err.msg);
    int want = ENOSYS;
    int status = run_isolated(&prog, openat2_call, &want, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "command: %s", msg);

    cr_assert_eq(
        conch_seccomp_prog_build(&(struct conch_seccomp_opts){.file_worker = true}, &prog, &err), 0,
        "%s", err.msg);
    want = 0;
    status = run_isolated(&prog, openat2_call, &want, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "file worker: %s", msg);
}

static void newer_calls(void *arg)
{
    (void)arg;
    /* statmount, listmount, open_tree_attr, quotactl_fd, lsm_list_modules: ENOSYS from the
     * filter (with a valid-looking first argument the kernel would say EFAULT/EINVAL/EBADF) */
    const long nrs[] = {457, 458, 467, 443, 461};
    for (size_t i = 0; i < sizeof(nrs) / sizeof(nrs[0]); i++) {
        errno = 0;
        long r = syscall(nrs[i], 0L, 0L, 0L, 0L, 0L, 0L);
        if (!(r == -1 && errno == ENOSYS)) {
            report("syscall %ld: returned %ld errno %d, want ENOSYS", nrs[i], r, errno);
            _exit(1);
        }
    }
}

Test(seccomp_setid, newer_mount_calls_get_enosys, .timeout = 30)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind answers ENOSYS itself for calls it does not know");
    char msg[512];
    struct conch_seccomp_prog prog = {0};
    struct conch_err err = {0};
    cr_assert_eq(conch_seccomp_prog_build(NULL, &prog, &err), 0, "%s", err.msg);
    int status = run_isolated(&prog, newer_calls, NULL, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s", msg);
    /* and they are not ENOSYS by nature on this kernel: unfiltered, statmount answers */
    status = run_isolated(NULL, newer_calls, NULL, msg, sizeof(msg));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "unfiltered: %s", msg);
}

/* What the JS worker tries, each expected to fail with *@arg (EPERM under its filter), or
 * to work (0) under the file workers'. */
static void js_escapes(void *arg)
{
    int want = *(int *)arg;
    int sv[2];
    errno = 0;
    long r = socket(AF_UNIX, SOCK_STREAM, 0);
    if (want ? !(r == -1 && errno == want) : r < 0) {
        report("socket: returned %ld errno %d, want %d", r, errno, want);
        _exit(1);
    }
    errno = 0;
    r = socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    if (want ? !(r == -1 && errno == want) : r < 0) {
        report("socketpair: returned %ld errno %d, want %d", r, errno, want);
        _exit(1);
    }
    if (!want)
        return; /* the file workers' filter: exec would replace the test's child */
    char *argv[] = {"/bin/true", NULL}, *envp[] = {NULL};
    errno = 0;
    r = execve("/bin/true", argv, envp);
    if (!(r == -1 && errno == want)) {
        report("execve: returned %ld errno %d, want %d", r, errno, want);
        _exit(1);
    }
    errno = 0;
    r = syscall(SYS_execveat, AT_FDCWD, "/bin/true", argv, envp, 0);
    if (!(r == -1 && errno == want)) {
        report("execveat: returned %ld errno %d, want %d", r, errno, want);
        _exit(1);
    }
}

Test(seccomp_js, worker_cannot_exec_or_open_a_socket, .timeout = 30)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind does not emulate seccomp");
    char msg[512];
    struct conch_seccomp_prog prog = {0};
    struct conch_err err = {0};
    cr_assert_eq(
        conch_seccomp_prog_build(
            &(struct conch_seccomp_opts){.file_worker = true, .js_worker = true}, &prog, &err),
        0, "%s", err.msg);
    int want = EPERM;
    int status = run_isolated(&prog, js_escapes, &want, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "JS worker: %s", msg);
    /* The file workers' filter lets the same sockets through: the denial is the JS filter's. */
    cr_assert_eq(
        conch_seccomp_prog_build(&(struct conch_seccomp_opts){.file_worker = true}, &prog, &err), 0,
        "%s", err.msg);
    want = 0;
    status = run_isolated(&prog, js_escapes, &want, msg, sizeof(msg));
    conch_seccomp_prog_done(&prog);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "file worker: %s", msg);
}

Test(seccomp_js, worker_matches_its_allowlist, .timeout = 60)
{
    if (RUNNING_ON_VALGRIND)
        cr_skip("valgrind does not emulate seccomp");
    unsigned reached = 0;
    walk_and_check(&(struct conch_seccomp_opts){.file_worker = true, .js_worker = true}, &reached);
    cr_assert_eq(
        conch_seccomp__verdict(&(struct conch_seccomp_opts){.file_worker = true, .js_worker = true},
                               SYS_execve),
        CONCH_SECCOMP__EPERM);
}
