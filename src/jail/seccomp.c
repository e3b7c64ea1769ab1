/* seccomp.c - the agent seccomp filter: a default-deny allowlist (ENOSYS for everything not
 * on it) compiled with libseccomp in the parent for the native architecture, exported as
 * classic BPF behind a short hand-written prefix, and installed in the child with one prctl. */
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "jail/seccomp.h"

#ifndef __O_TMPFILE
#define __O_TMPFILE 020000000
#endif

/* How the filter treats one syscall. */
enum kind {
    K_ALLOW,  /* reaches the kernel whatever its arguments */
    K_EPERM,  /* known dangerous: fails with EPERM */
    K_ENOSYS, /* refused as if the kernel lacked it (the default for unlisted calls) */
    K_CLONE,  /* allowed unless a CLONE_NEW* flag is set (EPERM) */
    K_MODE,   /* chmod and mkdir families: EPERM when the mode in .arg has S_ISUID or S_ISGID */
    K_OPEN,   /* flags in .arg, mode in .arg + 1: EPERM when creating with S_ISUID/S_ISGID */
    K_CREAT,  /* creat(): always creates; mode in .arg */
    K_MKNOD,  /* mode in .arg: regular files (without S_ISUID/S_ISGID), FIFOs, sockets */
    K_PREFIX, /* allowed here; the hand-written prefix decides on one argument (see below) */
};

struct entry {
    const char *name;
    unsigned char kind;
    unsigned char arg;
};

/*
 * The allowlist, by libseccomp name: what programs (shells, coreutils, python, node, gcc,
 * git, make, threads, epoll, sockets, ptrace of the sandbox's own processes) use, after
 * Docker's default profile and minus what the namespaces make useless. Every name here must
 * exist on both x86_64 and aarch64 (a unit test resolves them for both).
 */
static const struct entry common_entries[] = {
    /* processes, threads, signals */
    {"execve", K_ALLOW, 0},
    {"execveat", K_ALLOW, 0},
    {"exit", K_ALLOW, 0},
    {"exit_group", K_ALLOW, 0},
    {"wait4", K_ALLOW, 0},
    {"waitid", K_ALLOW, 0},
    {"clone", K_CLONE, 0},
    {"set_tid_address", K_ALLOW, 0},
    {"set_robust_list", K_ALLOW, 0},
    {"get_robust_list", K_ALLOW, 0},
    {"rseq", K_ALLOW, 0},
    {"futex", K_ALLOW, 0},
    {"futex_waitv", K_ALLOW, 0},
    {"futex_wake", K_ALLOW, 0},
    {"futex_wait", K_ALLOW, 0},
    {"futex_requeue", K_ALLOW, 0},
    {"gettid", K_ALLOW, 0},
    {"getpid", K_ALLOW, 0},
    {"getppid", K_ALLOW, 0},
    {"getpgid", K_ALLOW, 0},
    {"setpgid", K_ALLOW, 0},
    {"getsid", K_ALLOW, 0},
    {"setsid", K_ALLOW, 0},
    {"kill", K_ALLOW, 0},
    {"tkill", K_ALLOW, 0},
    {"tgkill", K_ALLOW, 0},
    {"rt_sigaction", K_ALLOW, 0},
    {"rt_sigprocmask", K_ALLOW, 0},
    {"rt_sigreturn", K_ALLOW, 0},
    {"rt_sigpending", K_ALLOW, 0},
    {"rt_sigsuspend", K_ALLOW, 0},
    {"rt_sigtimedwait", K_ALLOW, 0},
    {"rt_sigqueueinfo", K_ALLOW, 0},
    {"rt_tgsigqueueinfo", K_ALLOW, 0},
    {"sigaltstack", K_ALLOW, 0},
    {"signalfd4", K_ALLOW, 0},
    {"pidfd_open", K_ALLOW, 0},
    {"pidfd_send_signal", K_ALLOW, 0},
    {"pidfd_getfd", K_ALLOW, 0},
    {"restart_syscall", K_ALLOW, 0},
    {"prctl", K_ALLOW, 0},
    {"personality", K_PREFIX, 0},
    {"seccomp", K_ALLOW, 0},
    {"landlock_create_ruleset", K_ALLOW, 0},
    {"landlock_add_rule", K_ALLOW, 0},
    {"landlock_restrict_self", K_ALLOW, 0},
    /* ptrace: gdb and strace on the sandbox's own processes; the pid namespace, Landlock
     * and the dropped capabilities fence the rest */
    {"ptrace", K_ALLOW, 0},
    {"process_vm_readv", K_ALLOW, 0},
    {"process_vm_writev", K_ALLOW, 0},
    {"kcmp", K_ALLOW, 0},
    /* identity, capabilities, limits, scheduling */
    {"getuid", K_ALLOW, 0},
    {"geteuid", K_ALLOW, 0},
    {"getgid", K_ALLOW, 0},
    {"getegid", K_ALLOW, 0},
    {"getresuid", K_ALLOW, 0},
    {"getresgid", K_ALLOW, 0},
    {"getgroups", K_ALLOW, 0},
    {"setuid", K_ALLOW, 0},
    {"setgid", K_ALLOW, 0},
    {"setreuid", K_ALLOW, 0},
    {"setregid", K_ALLOW, 0},
    {"setresuid", K_ALLOW, 0},
    {"setresgid", K_ALLOW, 0},
    {"setfsuid", K_ALLOW, 0},
    {"setfsgid", K_ALLOW, 0},
    {"setgroups", K_ALLOW, 0},
    {"capget", K_ALLOW, 0},
    {"capset", K_ALLOW, 0},
    {"getrlimit", K_ALLOW, 0},
    {"setrlimit", K_ALLOW, 0},
    {"prlimit64", K_ALLOW, 0},
    {"getrusage", K_ALLOW, 0},
    {"getpriority", K_ALLOW, 0},
    {"setpriority", K_ALLOW, 0},
    {"sched_yield", K_ALLOW, 0},
    {"sched_getaffinity", K_ALLOW, 0},
    {"sched_setaffinity", K_ALLOW, 0},
    {"sched_getparam", K_ALLOW, 0},
    {"sched_setparam", K_ALLOW, 0},
    {"sched_getscheduler", K_ALLOW, 0},
    {"sched_setscheduler", K_ALLOW, 0},
    {"sched_getattr", K_ALLOW, 0},
    {"sched_setattr", K_ALLOW, 0},
    {"sched_get_priority_max", K_ALLOW, 0},
    {"sched_get_priority_min", K_ALLOW, 0},
    {"sched_rr_get_interval", K_ALLOW, 0},
    {"ioprio_get", K_ALLOW, 0},
    {"ioprio_set", K_ALLOW, 0},
    {"umask", K_ALLOW, 0},
    {"uname", K_ALLOW, 0},
    {"sysinfo", K_ALLOW, 0},
    {"times", K_ALLOW, 0},
    {"getcpu", K_ALLOW, 0},
    {"getrandom", K_ALLOW, 0},
    {"sethostname", K_ALLOW, 0},
    {"setdomainname", K_ALLOW, 0},
    {"chroot", K_ALLOW, 0},
    /* memory */
    {"brk", K_ALLOW, 0},
    {"mmap", K_ALLOW, 0},
    {"munmap", K_ALLOW, 0},
    {"mremap", K_ALLOW, 0},
    {"mprotect", K_ALLOW, 0},
    {"madvise", K_ALLOW, 0},
    {"mincore", K_ALLOW, 0},
    {"msync", K_ALLOW, 0},
    {"mlock", K_ALLOW, 0},
    {"mlock2", K_ALLOW, 0},
    {"munlock", K_ALLOW, 0},
    {"mlockall", K_ALLOW, 0},
    {"munlockall", K_ALLOW, 0},
    {"membarrier", K_ALLOW, 0},
    {"memfd_create", K_ALLOW, 0},
    {"pkey_alloc", K_ALLOW, 0},
    {"pkey_free", K_ALLOW, 0},
    {"pkey_mprotect", K_ALLOW, 0},
    {"map_shadow_stack", K_ALLOW, 0},
    {"mseal", K_ALLOW, 0},
    {"remap_file_pages", K_ALLOW, 0},
    {"process_madvise", K_ALLOW, 0},
    {"process_mrelease", K_ALLOW, 0},
    {"get_mempolicy", K_ALLOW, 0},
    {"set_mempolicy", K_ALLOW, 0},
    {"mbind", K_ALLOW, 0},
    /* time (reading and sleeping; setting clocks is denied below) */
    {"clock_gettime", K_ALLOW, 0},
    {"clock_getres", K_ALLOW, 0},
    {"clock_nanosleep", K_ALLOW, 0},
    {"gettimeofday", K_ALLOW, 0},
    {"nanosleep", K_ALLOW, 0},
    {"getitimer", K_ALLOW, 0},
    {"setitimer", K_ALLOW, 0},
    {"timer_create", K_ALLOW, 0},
    {"timer_delete", K_ALLOW, 0},
    {"timer_gettime", K_ALLOW, 0},
    {"timer_settime", K_ALLOW, 0},
    {"timer_getoverrun", K_ALLOW, 0},
    {"timerfd_create", K_ALLOW, 0},
    {"timerfd_gettime", K_ALLOW, 0},
    {"timerfd_settime", K_ALLOW, 0},
    /* files and directories */
    {"openat", K_OPEN, 2},
    {"close", K_ALLOW, 0},
    {"close_range", K_ALLOW, 0},
    {"read", K_ALLOW, 0},
    {"write", K_ALLOW, 0},
    {"readv", K_ALLOW, 0},
    {"writev", K_ALLOW, 0},
    {"pread64", K_ALLOW, 0},
    {"pwrite64", K_ALLOW, 0},
    {"preadv", K_ALLOW, 0},
    {"pwritev", K_ALLOW, 0},
    {"preadv2", K_ALLOW, 0},
    {"pwritev2", K_ALLOW, 0},
    {"lseek", K_ALLOW, 0},
    {"dup", K_ALLOW, 0},
    {"dup3", K_ALLOW, 0},
    {"fcntl", K_ALLOW, 0},
    {"ioctl", K_PREFIX, 1},
    {"flock", K_ALLOW, 0},
    {"fsync", K_ALLOW, 0},
    {"fdatasync", K_ALLOW, 0},
    {"sync", K_ALLOW, 0},
    {"syncfs", K_ALLOW, 0},
    {"sync_file_range", K_ALLOW, 0},
    {"ftruncate", K_ALLOW, 0},
    {"truncate", K_ALLOW, 0},
    {"fallocate", K_ALLOW, 0},
    {"fadvise64", K_ALLOW, 0},
    {"readahead", K_ALLOW, 0},
    {"copy_file_range", K_ALLOW, 0},
    {"sendfile", K_ALLOW, 0},
    {"splice", K_ALLOW, 0},
    {"tee", K_ALLOW, 0},
    {"vmsplice", K_ALLOW, 0},
    {"fstat", K_ALLOW, 0},
    {"newfstatat", K_ALLOW, 0},
    {"statx", K_ALLOW, 0},
    {"statfs", K_ALLOW, 0},
    {"fstatfs", K_ALLOW, 0},
    {"faccessat", K_ALLOW, 0},
    {"faccessat2", K_ALLOW, 0},
    {"getcwd", K_ALLOW, 0},
    {"chdir", K_ALLOW, 0},
    {"fchdir", K_ALLOW, 0},
    {"getdents64", K_ALLOW, 0},
    {"mkdirat", K_MODE, 2},
    {"mknodat", K_MKNOD, 2},
    {"unlinkat", K_ALLOW, 0},
    {"renameat", K_ALLOW, 0},
    {"renameat2", K_ALLOW, 0},
    {"linkat", K_ALLOW, 0},
    {"symlinkat", K_ALLOW, 0},
    {"readlinkat", K_ALLOW, 0},
    {"fchmod", K_MODE, 1},
    {"fchmodat", K_MODE, 2},
    {"fchmodat2", K_MODE, 2},
    {"fchown", K_ALLOW, 0},
    {"fchownat", K_ALLOW, 0},
    {"utimensat", K_ALLOW, 0},
    {"getxattr", K_ALLOW, 0},
    {"lgetxattr", K_ALLOW, 0},
    {"fgetxattr", K_ALLOW, 0},
    {"setxattr", K_ALLOW, 0},
    {"lsetxattr", K_ALLOW, 0},
    {"fsetxattr", K_ALLOW, 0},
    {"listxattr", K_ALLOW, 0},
    {"llistxattr", K_ALLOW, 0},
    {"flistxattr", K_ALLOW, 0},
    {"removexattr", K_ALLOW, 0},
    {"lremovexattr", K_ALLOW, 0},
    {"fremovexattr", K_ALLOW, 0},
    {"inotify_init1", K_ALLOW, 0},
    {"inotify_add_watch", K_ALLOW, 0},
    {"inotify_rm_watch", K_ALLOW, 0},
    {"cachestat", K_ALLOW, 0},
    /* polling, pipes, events, async I/O (not io_uring) */
    {"pipe2", K_ALLOW, 0},
    {"ppoll", K_ALLOW, 0},
    {"pselect6", K_ALLOW, 0},
    {"epoll_create1", K_ALLOW, 0},
    {"epoll_ctl", K_ALLOW, 0},
    {"epoll_pwait", K_ALLOW, 0},
    {"epoll_pwait2", K_ALLOW, 0},
    {"eventfd2", K_ALLOW, 0},
    {"io_setup", K_ALLOW, 0},
    {"io_destroy", K_ALLOW, 0},
    {"io_submit", K_ALLOW, 0},
    {"io_cancel", K_ALLOW, 0},
    {"io_getevents", K_ALLOW, 0},
    {"io_pgetevents", K_ALLOW, 0},
    /* sockets (the sandbox has its own network namespace) */
    {"socket", K_ALLOW, 0},
    {"socketpair", K_ALLOW, 0},
    {"bind", K_ALLOW, 0},
    {"listen", K_ALLOW, 0},
    {"accept", K_ALLOW, 0},
    {"accept4", K_ALLOW, 0},
    {"connect", K_ALLOW, 0},
    {"getsockname", K_ALLOW, 0},
    {"getpeername", K_ALLOW, 0},
    {"sendto", K_ALLOW, 0},
    {"recvfrom", K_ALLOW, 0},
    {"sendmsg", K_ALLOW, 0},
    {"recvmsg", K_ALLOW, 0},
    {"sendmmsg", K_ALLOW, 0},
    {"recvmmsg", K_ALLOW, 0},
    {"shutdown", K_ALLOW, 0},
    {"setsockopt", K_ALLOW, 0},
    {"getsockopt", K_ALLOW, 0},
    /* System V and POSIX IPC (the sandbox has its own IPC namespace) */
    {"shmget", K_ALLOW, 0},
    {"shmat", K_ALLOW, 0},
    {"shmdt", K_ALLOW, 0},
    {"shmctl", K_ALLOW, 0},
    {"semget", K_ALLOW, 0},
    {"semop", K_ALLOW, 0},
    {"semtimedop", K_ALLOW, 0},
    {"semctl", K_ALLOW, 0},
    {"msgget", K_ALLOW, 0},
    {"msgsnd", K_ALLOW, 0},
    {"msgrcv", K_ALLOW, 0},
    {"msgctl", K_ALLOW, 0},
    {"mq_open", K_ALLOW, 0},
    {"mq_unlink", K_ALLOW, 0},
    {"mq_timedsend", K_ALLOW, 0},
    {"mq_timedreceive", K_ALLOW, 0},
    {"mq_notify", K_ALLOW, 0},
    {"mq_getsetattr", K_ALLOW, 0},

    /* Known dangerous, refused with EPERM, the answer an unprivileged process gets from the
     * kernel for most of them (so unshare(1), mount(8) and friends fail the usual way). */
    /* the mount family: the sandbox's mount tree is final once the command runs */
    {"mount", K_EPERM, 0},
    {"umount2", K_EPERM, 0},
    {"pivot_root", K_EPERM, 0},
    {"move_mount", K_EPERM, 0},
    {"open_tree", K_EPERM, 0},
    {"fsopen", K_EPERM, 0},
    {"fsconfig", K_EPERM, 0},
    {"fsmount", K_EPERM, 0},
    {"fspick", K_EPERM, 0},
    {"mount_setattr", K_EPERM, 0},
    /* new namespaces are where most user-namespace kernel bugs are reached */
    {"unshare", K_EPERM, 0},
    {"setns", K_EPERM, 0},
    /* large kernel attack surface that agent commands have no use for */
    {"bpf", K_EPERM, 0},
    {"keyctl", K_EPERM, 0},
    {"add_key", K_EPERM, 0},
    {"request_key", K_EPERM, 0},
    {"perf_event_open", K_EPERM, 0},
    {"kexec_load", K_EPERM, 0},
    {"kexec_file_load", K_EPERM, 0},
    {"init_module", K_EPERM, 0},
    {"finit_module", K_EPERM, 0},
    {"delete_module", K_EPERM, 0},
    {"io_uring_setup", K_EPERM, 0},
    {"io_uring_enter", K_EPERM, 0},
    {"io_uring_register", K_EPERM, 0},
    {"userfaultfd", K_EPERM, 0},
    {"open_by_handle_at", K_EPERM, 0},
    {"name_to_handle_at", K_EPERM, 0},
    {"settimeofday", K_EPERM, 0},
    {"clock_settime", K_EPERM, 0},
    {"clock_adjtime", K_EPERM, 0},
    {"adjtimex", K_EPERM, 0},
    {"swapon", K_EPERM, 0},
    {"swapoff", K_EPERM, 0},
    {"reboot", K_EPERM, 0},
    {"syslog", K_EPERM, 0},
    {"acct", K_EPERM, 0},
    {"quotactl", K_EPERM, 0},
    {"lookup_dcookie", K_EPERM, 0},
    {"vhangup", K_EPERM, 0},
    {"nfsservctl", K_EPERM, 0},

    /* clone3 passes its flags in memory, which seccomp cannot read. ENOSYS makes glibc (and
     * Go, Rust) fall back to clone(), whose flags the rules see; Docker does the same.
     * openat2 likewise carries its mode in a struct: ENOSYS, and libcs and programs fall back
     * to openat (the file worker, which needs RESOLVE_BENEATH, is the exception). */
    {"clone3", K_ENOSYS, 0},
    {"openat2", K_ENOSYS, 0},
};

/* The legacy calls that only x86_64 has (aarch64 has only their *at forms). */
static const struct entry x86_64_entries[] = {
    {"open", K_OPEN, 1},
    {"creat", K_CREAT, 1},
    {"chmod", K_MODE, 1},
    {"mkdir", K_MODE, 1},
    {"mknod", K_MKNOD, 1},
    {"access", K_ALLOW, 0},
    {"stat", K_ALLOW, 0},
    {"lstat", K_ALLOW, 0},
    {"readlink", K_ALLOW, 0},
    {"rename", K_ALLOW, 0},
    {"rmdir", K_ALLOW, 0},
    {"link", K_ALLOW, 0},
    {"unlink", K_ALLOW, 0},
    {"symlink", K_ALLOW, 0},
    {"chown", K_ALLOW, 0},
    {"lchown", K_ALLOW, 0},
    {"utime", K_ALLOW, 0},
    {"utimes", K_ALLOW, 0},
    {"futimesat", K_ALLOW, 0},
    {"getdents", K_ALLOW, 0},
    {"pipe", K_ALLOW, 0},
    {"dup2", K_ALLOW, 0},
    {"poll", K_ALLOW, 0},
    {"select", K_ALLOW, 0},
    {"epoll_create", K_ALLOW, 0},
    {"epoll_wait", K_ALLOW, 0},
    {"eventfd", K_ALLOW, 0},
    {"signalfd", K_ALLOW, 0},
    {"inotify_init", K_ALLOW, 0},
    {"fork", K_ALLOW, 0},
    {"vfork", K_ALLOW, 0},
    {"pause", K_ALLOW, 0},
    {"alarm", K_ALLOW, 0},
    {"time", K_ALLOW, 0},
    {"getpgrp", K_ALLOW, 0},
    {"arch_prctl", K_ALLOW, 0},
    {"get_thread_area", K_ALLOW, 0},
    {"set_thread_area", K_ALLOW, 0},
    {"iopl", K_EPERM, 0},
    {"ioperm", K_EPERM, 0},
};

/* Numbers for calls newer than some libseccomp releases know (Debian 12 ships 2.5.4). From
 * 424 on, every architecture but alpha uses the same numbers. */
static const struct {
    const char *name;
    int nr;
} unified_numbers[] = {
    {"pidfd_send_signal", 424},
    {"pidfd_open", 434},
    {"clone3", 435},
    {"close_range", 436},
    {"openat2", 437},
    {"pidfd_getfd", 438},
    {"faccessat2", 439},
    {"process_madvise", 440},
    {"epoll_pwait2", 441},
    {"mount_setattr", 442},
    {"landlock_create_ruleset", 444},
    {"landlock_add_rule", 445},
    {"landlock_restrict_self", 446},
    {"process_mrelease", 448},
    {"futex_waitv", 449},
    {"cachestat", 451},
    {"fchmodat2", 452},
    {"map_shadow_stack", 453},
    {"futex_wake", 454},
    {"futex_wait", 455},
    {"futex_requeue", 456},
    {"mseal", 462},
};

/* clone() namespace flags. CLONE_NEWTIME is absent: its bit is part of clone()'s exit-signal
 * byte, so only clone3 (refused) and unshare (denied) can ask for it. */
static const unsigned long clone_ns_flags[] = {CLONE_NEWNS,  CLONE_NEWCGROUP, CLONE_NEWUTS,
                                               CLONE_NEWIPC, CLONE_NEWUSER,   CLONE_NEWPID,
                                               CLONE_NEWNET};

/* personality() values left alone: the default, PER_LINUX32 (uname reports i686),
 * ADDR_NO_RANDOMIZE (gdb and `setarch -R` turn off ASLR for the program they start), both,
 * and the 0xffffffff query. Others (READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...) weaken exploit
 * mitigations. */
static const uint32_t personality_ok[] = {0, PER_LINUX32, ADDR_NO_RANDOMIZE,
                                          PER_LINUX32 | ADDR_NO_RANDOMIZE, 0xffffffffu};

/* TIOCSTI/TIOCLINUX push input into a terminal, the classic escape through a shared tty
 * (CVE-2017-5226 in bubblewrap). */
static const uint32_t tty_ioctls[] = {TIOCSTI, TIOCLINUX};

static uint32_t native_arch(void)
{
    return seccomp_arch_native();
}

static const struct entry *arch_entries(uint32_t arch, size_t *ret_n)
{
    if (arch == SCMP_ARCH_X86_64) {
        *ret_n = ARRAY_SIZE(x86_64_entries);
        return x86_64_entries;
    }
    *ret_n = 0; /* aarch64 needs nothing beyond the common list */
    return NULL;
}

/* The syscall number of @name on @arch, or -1 when the architecture has no such call. */
static int resolve(uint32_t arch, const char *name)
{
    int nr = seccomp_syscall_resolve_name_arch(arch, name);
    if (nr >= 0)
        return nr;
    for (size_t i = 0; i < ARRAY_SIZE(unified_numbers); i++)
        if (!strcmp(unified_numbers[i].name, name))
            return unified_numbers[i].nr;
    return -1;
}

/* The entry for @e, with the file worker's exception applied. */
static unsigned entry_kind(const struct entry *e, const struct conch_seccomp_opts *opts)
{
    if (opts && opts->file_worker && !strcmp(e->name, "openat2"))
        return K_ALLOW;
    return e->kind;
}

static void ctx_releasep(scmp_filter_ctx *ctx)
{
    if (*ctx)
        seccomp_release(*ctx);
}

static int add(scmp_filter_ctx ctx, const char *name, int nr, uint32_t action, unsigned n,
               const struct scmp_arg_cmp *cmp, struct conch_err *err)
{
    int r = seccomp_rule_add_array(ctx, action, nr, n, cmp);
    if (r < 0)
        return conch_err_set(err, -r, "seccomp: add rule for '%s': %s", name, strerror(-r));
    return 0;
}

#define SUGID (S_ISUID | S_ISGID)

/*
 * Rules that depend on arguments. libseccomp drops conditional rules when the same call also
 * has an unconditional one, so each call gets conditional ALLOW rules and conditional EPERM
 * rules that together cover every argument value and never overlap. Modes are compared only
 * in their low bits (the kernel reads a umode_t), so junk in the upper half changes nothing.
 */
static int add_arg_rules(scmp_filter_ctx ctx, const struct entry *e, unsigned kind, int nr,
                         uint32_t eperm, struct conch_err *err)
{
    const uint32_t allow = SCMP_ACT_ALLOW;
    const unsigned a = e->arg;
    int r = 0;
    switch (kind) {
    case K_CLONE: {
        unsigned long all = 0;
        for (size_t i = 0; i < ARRAY_SIZE(clone_ns_flags); i++)
            all |= clone_ns_flags[i];
        /* Only the flags' own bits are compared, so the sign extension of glibc's int flags
         * does not matter. */
        struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_MASKED_EQ, all, 0);
        r = add(ctx, e->name, nr, allow, 1, &c, err);
        for (size_t i = 0; r >= 0 && i < ARRAY_SIZE(clone_ns_flags); i++) {
            c = SCMP_A0(SCMP_CMP_MASKED_EQ, clone_ns_flags[i], clone_ns_flags[i]);
            r = add(ctx, e->name, nr, eperm, 1, &c, err);
        }
        return r;
    }
    case K_MODE:
    case K_CREAT: {
        /* Set-gid directories are refused too: chmod cannot tell a directory from a file,
         * and `mkdir -m 2775` is mkdir then chmod anyway. (A directory made inside a set-gid
         * directory still inherits the bit from the kernel; it grants nothing.) */
        struct scmp_arg_cmp c = SCMP_CMP(a, SCMP_CMP_MASKED_EQ, SUGID, 0);
        r = add(ctx, e->name, nr, allow, 1, &c, err);
        const unsigned long each[] = {S_ISUID, S_ISGID};
        for (size_t i = 0; r >= 0 && i < ARRAY_SIZE(each); i++) {
            c = SCMP_CMP(a, SCMP_CMP_MASKED_EQ, each[i], each[i]);
            r = add(ctx, e->name, nr, eperm, 1, &c, err);
        }
        return r;
    }
    case K_OPEN: {
        /* The mode only matters when the call creates a file: O_CREAT, or O_TMPFILE (whose
         * file can be linked into the tree later with its mode). */
        struct scmp_arg_cmp c[2] = {SCMP_CMP(a, SCMP_CMP_MASKED_EQ, O_CREAT | __O_TMPFILE, 0)};
        r = add(ctx, e->name, nr, allow, 1, c, err);
        c[0] = SCMP_CMP(a + 1, SCMP_CMP_MASKED_EQ, SUGID, 0);
        if (r >= 0)
            r = add(ctx, e->name, nr, allow, 1, c, err);
        const unsigned long creating[] = {O_CREAT, __O_TMPFILE}, bits[] = {S_ISUID, S_ISGID};
        for (size_t i = 0; r >= 0 && i < ARRAY_SIZE(creating); i++)
            for (size_t k = 0; r >= 0 && k < ARRAY_SIZE(bits); k++) {
                c[0] = SCMP_CMP(a, SCMP_CMP_MASKED_EQ, creating[i], creating[i]);
                c[1] = SCMP_CMP(a + 1, SCMP_CMP_MASKED_EQ, bits[k], bits[k]);
                r = add(ctx, e->name, nr, eperm, 2, c, err);
            }
        return r;
    }
    case K_MKNOD: {
        /* Regular files (type 0 means regular too) without S_ISUID/S_ISGID, FIFOs and
         * sockets; never devices. */
        const unsigned long ok[] = {0, S_IFREG, S_IFIFO, S_IFSOCK};
        for (size_t i = 0; r >= 0 && i < ARRAY_SIZE(ok); i++) {
            struct scmp_arg_cmp c = SCMP_CMP(a, SCMP_CMP_MASKED_EQ, S_IFMT | SUGID, ok[i]);
            r = add(ctx, e->name, nr, allow, 1, &c, err);
        }
        for (unsigned long t = 0; r >= 0 && t <= S_IFMT; t += 010000) {
            if (t == 0 || t == S_IFREG || t == S_IFIFO || t == S_IFSOCK)
                continue;
            struct scmp_arg_cmp c = SCMP_CMP(a, SCMP_CMP_MASKED_EQ, S_IFMT, t);
            r = add(ctx, e->name, nr, eperm, 1, &c, err);
        }
        const unsigned long each[] = {S_ISUID, S_ISGID};
        for (size_t i = 0; r >= 0 && i < ARRAY_SIZE(each); i++) {
            struct scmp_arg_cmp c = SCMP_CMP(a, SCMP_CMP_MASKED_EQ, each[i], each[i]);
            r = add(ctx, e->name, nr, eperm, 1, &c, err);
        }
        return r;
    }
    default:
        return conch_err_set(err, EINVAL, "seccomp: no rules for kind %u of '%s'", kind, e->name);
    }
}

static int add_entry(scmp_filter_ctx ctx, uint32_t arch, const struct entry *e,
                     const struct conch_seccomp_opts *opts, uint32_t eperm, struct conch_err *err)
{
    int nr = resolve(arch, e->name);
    if (nr < 0)
        return conch_err_set(err, EINVAL, "seccomp: libseccomp does not know syscall '%s'",
                             e->name);
    unsigned kind = entry_kind(e, opts);
    switch (kind) {
    case K_ALLOW:
    case K_PREFIX:
        return add(ctx, e->name, nr, SCMP_ACT_ALLOW, 0, NULL, err);
    case K_EPERM:
        return add(ctx, e->name, nr, eperm, 0, NULL, err);
    case K_ENOSYS:
        return 0; /* the default action; libseccomp refuses a rule that repeats it */
    default:
        return add_arg_rules(ctx, e, kind, nr, eperm, err);
    }
}

/*
 * libseccomp cannot AND two comparisons on the same argument, nor compare only the low half
 * of a 64-bit argument with EQ/NE, so two rules are written by hand as a short prefix run
 * before libseccomp's program: personality() with a value outside personality_ok, and
 * ioctl() with a request in tty_ioctls, both compared as the 32-bit value the kernel reads,
 * return EPERM. Every other call, and every allowed one, falls through to the start of
 * libseccomp's program, which checks the architecture itself (foreign ones are killed there).
 */
struct prefix {
    struct sock_filter insns[48];
    unsigned len;
    unsigned to_out[16], n_out;    /* conditional jumps whose jf goes to "out" */
    unsigned to_out_t[16], n_tout; /* conditional jumps whose jt goes to "out" */
    unsigned to_deny[16], n_deny;  /* conditional jumps whose jt goes to "deny" */
};

static unsigned emit(struct prefix *p, struct sock_filter f)
{
    p->insns[p->len] = f;
    return p->len++;
}

static int build_prefix(struct prefix *p, uint32_t arch, uint32_t eperm, struct conch_err *err)
{
    int personality_nr = resolve(arch, "personality"), ioctl_nr = resolve(arch, "ioctl");
    if (personality_nr < 0 || ioctl_nr < 0)
        return conch_err_set(err, EINVAL, "seccomp: no personality/ioctl on this architecture");
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    const unsigned lo = 0;
#else
    const unsigned lo = 4;
#endif
    memset(p, 0, sizeof(*p));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         offsetof(struct seccomp_data, arch)));
    p->to_out[p->n_out++] =
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, arch, 0, 0));
    /* personality: EPERM unless the value is one of personality_ok */
    emit(p,
         (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)));
    unsigned skip_personality = emit(
        p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)personality_nr, 0, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         offsetof(struct seccomp_data, args[0]) + lo));
    for (size_t k = 0; k < ARRAY_SIZE(personality_ok); k++)
        p->to_out_t[p->n_tout++] = emit(
            p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, personality_ok[k], 0, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, eperm));
    /* ioctl: EPERM for the terminal-injection requests */
    unsigned ioctl_at = emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                                             offsetof(struct seccomp_data, nr)));
    p->insns[skip_personality].jf = (unsigned char)(ioctl_at - skip_personality - 1);
    p->to_out[p->n_out++] =
        emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)ioctl_nr, 0, 0));
    emit(p, (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         offsetof(struct seccomp_data, args[1]) + lo));
    for (size_t k = 0; k < ARRAY_SIZE(tty_ioctls); k++) {
        unsigned at =
            emit(p, (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, tty_ioctls[k], 0, 0));
        p->to_deny[p->n_deny++] = at;
    }
    unsigned ja = emit(p, (struct sock_filter)BPF_STMT(BPF_JMP | BPF_JA, 0));
    unsigned deny = emit(p, (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, eperm));
    unsigned out = p->len; /* the first instruction of libseccomp's program */
    p->insns[ja].k = out - ja - 1;
    for (unsigned i = 0; i < p->n_out; i++)
        p->insns[p->to_out[i]].jf = (unsigned char)(out - p->to_out[i] - 1);
    for (unsigned i = 0; i < p->n_tout; i++)
        p->insns[p->to_out_t[i]].jt = (unsigned char)(out - p->to_out_t[i] - 1);
    for (unsigned i = 0; i < p->n_deny; i++)
        p->insns[p->to_deny[i]].jt = (unsigned char)(deny - p->to_deny[i] - 1);
    return 0;
}

/* libseccomp 2.5.4 can only export to an fd: export into a memfd and read it back. */
static int export_bpf(scmp_filter_ctx ctx, struct sock_filter **ret_insns, size_t *ret_len,
                      struct conch_err *err)
{
    _cleanup_close_ int fd = memfd_create("conch-seccomp", MFD_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "seccomp: memfd_create: %m");
    int r = seccomp_export_bpf(ctx, fd);
    if (r < 0)
        return conch_err_set(err, -r, "seccomp: export filter: %s", strerror(-r));
    struct stat st;
    if (fstat(fd, &st) < 0)
        return conch_err_set(err, errno, "seccomp: fstat exported filter: %m");
    size_t size = (size_t)st.st_size;
    if (size == 0 || size % sizeof(struct sock_filter) != 0)
        return conch_err_set(err, EINVAL, "seccomp: exported filter has odd size %zu", size);

    _cleanup_free_ struct sock_filter *insns = malloc(size);
    if (!insns)
        return conch_err_set(err, ENOMEM, "seccomp: allocate filter");
    size_t off = 0;
    while (off < size) {
        ssize_t n = pread(fd, (char *)insns + off, size - off, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return conch_err_set(err, errno, "seccomp: read exported filter: %m");
        if (n == 0)
            return conch_err_set(err, EIO, "seccomp: exported filter shrank while reading");
        off += (size_t)n;
    }
    *ret_insns = TAKE_PTR(insns);
    *ret_len = size / sizeof(struct sock_filter);
    return 0;
}

int conch_seccomp__prog_build_errnos(const struct conch_seccomp_opts *opts, int eperm_errno,
                                     int enosys_errno, struct conch_seccomp_prog *ret,
                                     struct conch_err *err)
{
    const uint32_t arch = native_arch();
    const uint32_t eperm = SCMP_ACT_ERRNO((uint32_t)eperm_errno);
    const uint32_t enosys = SCMP_ACT_ERRNO((uint32_t)enosys_errno);

    _cleanup_(ctx_releasep) scmp_filter_ctx ctx = seccomp_init(enosys);
    if (!ctx)
        return conch_err_set(err, ENOMEM, "seccomp: seccomp_init failed");
    /* A filter only reasons about the native syscall table; i386 (int 0x80) and x32 calls
     * would reach the same kernel code under different numbers, so they die. */
    int r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
    /* libseccomp refuses KILL_PROCESS when it cannot confirm kernel support (kernels before
     * 4.14, or valgrind, which does not emulate seccomp()); killing the thread still stops
     * the call. */
    if (r == -EINVAL)
        r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_THREAD);
    if (r < 0)
        return conch_err_set(err, -r, "seccomp: set bad-arch action: %s", strerror(-r));
    /* A binary search over the syscall number instead of a linear chain of ~300 tests. */
    if ((r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2)) < 0)
        return conch_err_set(err, -r, "seccomp: enable binary-tree filter: %s", strerror(-r));

    for (size_t i = 0; i < ARRAY_SIZE(common_entries); i++)
        if ((r = add_entry(ctx, arch, &common_entries[i], opts, eperm, err)) < 0)
            return r;
    size_t n_arch = 0;
    const struct entry *extra = arch_entries(arch, &n_arch);
    for (size_t i = 0; i < n_arch; i++)
        if ((r = add_entry(ctx, arch, &extra[i], opts, eperm, err)) < 0)
            return r;

    struct prefix pre;
    if ((r = build_prefix(&pre, arch, eperm, err)) < 0)
        return r;

    _cleanup_free_ struct sock_filter *body = NULL;
    size_t body_len = 0;
    if ((r = export_bpf(ctx, &body, &body_len, err)) < 0)
        return r;

    size_t len = pre.len + body_len;
    if (len > BPF_MAXINSNS)
        return conch_err_set(err, E2BIG, "seccomp: filter has %zu instructions (max %d)", len,
                             BPF_MAXINSNS);
    struct sock_filter *insns = calloc(len, sizeof(*insns));
    if (!insns)
        return conch_err_set(err, ENOMEM, "seccomp: allocate filter");
    memcpy(insns, pre.insns, pre.len * sizeof(*insns));
    memcpy(insns + pre.len, body, body_len * sizeof(*insns));

    ret->insns = insns;
    ret->len = (unsigned short)len;
    return 0;
}

int conch_seccomp_prog_build(const struct conch_seccomp_opts *opts, struct conch_seccomp_prog *ret,
                             struct conch_err *err)
{
    return conch_seccomp__prog_build_errnos(opts, EPERM, ENOSYS, ret, err);
}

int conch_seccomp__verdict(const struct conch_seccomp_opts *opts, long nr)
{
    const uint32_t arch = native_arch();
    size_t n_arch = 0;
    const struct entry *extra = arch_entries(arch, &n_arch);
    const struct {
        const struct entry *e;
        size_t n;
    } lists[] = {{common_entries, ARRAY_SIZE(common_entries)}, {extra, n_arch}};
    for (size_t l = 0; l < ARRAY_SIZE(lists); l++)
        for (size_t i = 0; i < lists[l].n; i++) {
            const struct entry *e = &lists[l].e[i];
            if (resolve(arch, e->name) != nr)
                continue;
            switch (entry_kind(e, opts)) {
            case K_ALLOW:
                return CONCH_SECCOMP__ALLOW;
            case K_EPERM:
                return CONCH_SECCOMP__EPERM;
            case K_ENOSYS:
                return CONCH_SECCOMP__ENOSYS;
            default:
                return CONCH_SECCOMP__ARGS;
            }
        }
    return CONCH_SECCOMP__ENOSYS;
}

int conch_seccomp__check_names(uint32_t arch, struct conch_err *err)
{
    size_t n_arch = 0;
    const struct entry *extra = arch_entries(arch, &n_arch);
    for (size_t i = 0; i < ARRAY_SIZE(common_entries); i++)
        if (resolve(arch, common_entries[i].name) < 0)
            return conch_err_set(err, EINVAL, "seccomp: no syscall '%s' on arch 0x%x",
                                 common_entries[i].name, arch);
    for (size_t i = 0; i < n_arch; i++)
        if (resolve(arch, extra[i].name) < 0)
            return conch_err_set(err, EINVAL, "seccomp: no syscall '%s' on arch 0x%x",
                                 extra[i].name, arch);
    return 0;
}

void conch_seccomp_prog_done(struct conch_seccomp_prog *prog)
{
    if (!prog)
        return;
    free(prog->insns);
    prog->insns = NULL;
    prog->len = 0;
}

int conch_seccomp_install_child(const struct conch_seccomp_prog *prog)
{
    if (!prog || !prog->insns || prog->len == 0)
        return -EINVAL;
    struct sock_fprog fprog = {.len = prog->len, .filter = prog->insns};
    if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog, 0, 0) < 0)
        return -errno;
    return 0;
}
