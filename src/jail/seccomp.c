/* seccomp.c - the agent seccomp filter: a default-deny allowlist (ENOSYS for everything not
 * on it), emitted as classic BPF in the parent for the native architecture (libseccomp names
 * the syscalls), and installed in the child with one prctl. */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
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
    K_PERSONALITY, /* only the values in personality_ok */
    K_IOCTL,       /* not the requests in tty_ioctls */
    K_SOCKET,      /* address family in .arg: only those in socket_families */
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
    {"personality", K_PERSONALITY, 0},
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
    {"ioctl", K_IOCTL, 1},
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
    /* polling, pipes, events */
    {"pipe2", K_ALLOW, 0},
    {"ppoll", K_ALLOW, 0},
    {"pselect6", K_ALLOW, 0},
    {"epoll_create1", K_ALLOW, 0},
    {"epoll_ctl", K_ALLOW, 0},
    {"epoll_pwait", K_ALLOW, 0},
    {"epoll_pwait2", K_ALLOW, 0},
    {"eventfd2", K_ALLOW, 0},
    /* sockets (the sandbox has its own network namespace) */
    {"socket", K_SOCKET, 0},
    {"socketpair", K_SOCKET, 0},
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
    /* Linux AIO: every context comes out of fs.aio-max-nr, one count for the whole host, so
     * one sandbox could take them all and the host's own io_setup would fail with EAGAIN.
     * ENOSYS as if the kernel lacked it: libaio users fall back to plain I/O, and glibc's
     * POSIX AIO (aio_read...) uses threads, not these calls. io_uring is denied above. */
    {"io_setup", K_ENOSYS, 0},
    {"io_destroy", K_ENOSYS, 0},
    {"io_submit", K_ENOSYS, 0},
    {"io_cancel", K_ENOSYS, 0},
    {"io_getevents", K_ENOSYS, 0},
    {"io_pgetevents", K_ENOSYS, 0},
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
/* The address families a sandbox may open: those its own network namespace confines (unix,
 * IPv4, IPv6, netlink for ip(8), packet sockets, which need CAP_NET_RAW in it anyway).
 * AF_VSOCK above all is not namespaced: it reaches the hypervisor and the host's vsock
 * ports; the rest (bluetooth, can, rds, tipc, alg...) is kernel surface nobody needs. */
static const uint32_t socket_families[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_PACKET};

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

/* What the JS worker may not do (conch_seccomp_opts.js_worker): EPERM. */
static const char *const js_denied[] = {
    "execve", "execveat", "socket", "socketpair", "connect",
    "bind",   "listen",   "accept", "accept4",    "ptrace",
};

/* The entry for @e, with the file worker's exception and the JS worker's denials applied. */
static unsigned entry_kind(const struct entry *e, const struct conch_seccomp_opts *opts)
{
    if (opts && opts->js_worker)
        for (size_t i = 0; i < ARRAY_SIZE(js_denied); i++)
            if (!strcmp(e->name, js_denied[i]))
                return K_EPERM;
    if (opts && opts->file_worker && !strcmp(e->name, "openat2"))
        return K_ALLOW;
    return e->kind;
}

#define SUGID (S_ISUID | S_ISGID)

/*
 * The filter is emitted here as classic BPF rather than through libseccomp's rule database:
 * compiling ~330 rules with libseccomp costs 2-3 ms per process (paid by every `conch run`),
 * emitting them directly a few microseconds. libseccomp still names the syscalls.
 *
 * Layout: check the architecture (foreign: kill), on x86_64 refuse x32 numbers (bit 30:
 * kill), then a binary search over runs of consecutive numbers treated alike (runs_build)
 * whose leaves return ALLOW, EPERM or ENOSYS (everything unlisted) or jump to a block that
 * inspects arguments.
 * Every conditional jump goes to the next instruction or skips one (jt/jf are 8-bit), and
 * longer jumps are BPF_JA with a 32-bit offset, fixed up once the target is placed.
 * Arguments are compared in their low 32 bits only: every value checked (modes, open flags,
 * clone namespace flags, personality, ioctl requests) is a 32-bit quantity to the kernel, so
 * junk in the upper half changes nothing the kernel would do.
 */
struct emitter {
    struct sock_filter *insns;
    unsigned len, cap;
    unsigned *labels; /* label -> instruction index, or UINT_MAX while unplaced */
    unsigned n_labels;
    struct {
        unsigned at, label;
    } * fixups;
    unsigned n_fixups, cap_fixups;
    bool oom;
};

static unsigned emit(struct emitter *m, uint16_t code, uint8_t jt, uint8_t jf, uint32_t k)
{
    if (m->len == m->cap) {
        unsigned ncap = m->cap ? m->cap * 2 : 1024;
        struct sock_filter *n = realloc(m->insns, ncap * sizeof(*n));
        if (!n) {
            m->oom = true;
            return m->len;
        }
        m->insns = n;
        m->cap = ncap;
    }
    m->insns[m->len] = (struct sock_filter){.code = code, .jt = jt, .jf = jf, .k = k};
    return m->len++;
}

static void emit_ja(struct emitter *m, unsigned label)
{
    unsigned at = emit(m, BPF_JMP | BPF_JA, 0, 0, 0);
    if (m->oom)
        return;
    if (m->n_fixups == m->cap_fixups) {
        unsigned ncap = m->cap_fixups ? m->cap_fixups * 2 : 256;
        void *n = realloc(m->fixups, ncap * sizeof(*m->fixups));
        if (!n) {
            m->oom = true;
            return;
        }
        m->fixups = n;
        m->cap_fixups = ncap;
    }
    m->fixups[m->n_fixups].at = at;
    m->fixups[m->n_fixups].label = label;
    m->n_fixups++;
}

static void place(struct emitter *m, unsigned label)
{
    m->labels[label] = m->len;
}

static void emit_ret(struct emitter *m, uint32_t action)
{
    emit(m, BPF_RET | BPF_K, 0, 0, action);
}

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define ARG_LO(i) (offsetof(struct seccomp_data, args[i]))
#else
#define ARG_LO(i) (offsetof(struct seccomp_data, args[i]) + 4)
#endif

static void load_arg(struct emitter *m, unsigned i)
{
    emit(m, BPF_LD | BPF_W | BPF_ABS, 0, 0, (uint32_t)ARG_LO(i));
}

/* One allowlisted syscall as the emitter sees it. */
struct rule {
    int nr;
    unsigned kind;
    unsigned arg;
    unsigned label; /* the argument block, for argument kinds */
};

static int rule_cmp(const void *a, const void *b)
{
    const struct rule *x = a, *y = b;
    return (x->nr > y->nr) - (x->nr < y->nr);
}

struct actions {
    uint32_t allow, eperm, enosys;
};

/* One run of consecutive syscall numbers that the filter treats alike: [lo, next run's lo).
 * Runs of ALLOW, EPERM or ENOSYS merge; a call whose arguments are inspected is a run of
 * its own, pointing at its argument block. */
struct run {
    uint32_t lo;
    unsigned kind;
    unsigned label;
};

/* Cover every number from 0 up with runs, from the sorted @rules. Returns the count; @runs
 * has room for 2 * @n + 1. */
static size_t runs_build(const struct rule *rules, size_t n, struct run *runs)
{
    size_t k = 0;
    uint32_t next = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || (uint32_t)rules[i].nr > next) {
            if (k && runs[k - 1].kind == K_ENOSYS)
                ; /* the gap extends the previous ENOSYS run */
            else
                runs[k++] = (struct run){.lo = next, .kind = K_ENOSYS};
        }
        if (i == n)
            break;
        const struct rule *r = &rules[i];
        bool plain = r->kind == K_ALLOW || r->kind == K_EPERM;
        if (!(plain && k && runs[k - 1].kind == r->kind))
            runs[k++] = (struct run){.lo = (uint32_t)r->nr, .kind = r->kind, .label = r->label};
        next = (uint32_t)r->nr + 1;
    }
    return k;
}

/* The leaf for one run: a single instruction. */
static void emit_leaf(struct emitter *m, const struct run *r, const struct actions *a)
{
    switch (r->kind) {
    case K_ALLOW:
        emit_ret(m, a->allow);
        break;
    case K_EPERM:
        emit_ret(m, a->eperm);
        break;
    case K_ENOSYS:
        emit_ret(m, a->enosys);
        break;
    default:
        emit_ja(m, r->label);
        break;
    }
}

/* Binary search over @runs[lo, hi), the syscall number in the accumulator: each node tests
 * the first number of its right half, each leaf is the action of one run (its bounds are
 * implied by the path to it). About three instructions per run: the kernel converts and
 * JIT-compiles every instruction of a filter at each install, once per command. */
static void emit_range(struct emitter *m, const struct run *runs, size_t lo, size_t hi,
                       unsigned *next_label, const struct actions *a)
{
    if (hi - lo == 1) {
        emit_leaf(m, &runs[lo], a);
        return;
    }
    size_t mid = lo + (hi - lo) / 2;
    unsigned right = (*next_label)++;
    emit(m, BPF_JMP | BPF_JGE | BPF_K, 0, 1, runs[mid].lo);
    emit_ja(m, right);
    emit_range(m, runs, lo, mid, next_label, a);
    place(m, right);
    emit_range(m, runs, mid, hi, next_label, a);
}

/* The argument block of @r: decides ALLOW or EPERM and returns. */
static void emit_arg_block(struct emitter *m, const struct rule *r, const struct actions *a)
{
    place(m, r->label);
    switch (r->kind) {
    case K_CLONE: {
        uint32_t ns = 0;
        for (size_t i = 0; i < ARRAY_SIZE(clone_ns_flags); i++)
            ns |= (uint32_t)clone_ns_flags[i];
        load_arg(m, 0);
        emit(m, BPF_JMP | BPF_JSET | BPF_K, 0, 1, ns);
        emit_ret(m, a->eperm);
        emit_ret(m, a->allow);
        break;
    }
    case K_MODE:
    case K_CREAT:
        /* Set-gid directories are refused too: chmod cannot tell a directory from a file,
         * and `mkdir -m 2775` is mkdir then chmod anyway. (A directory made inside a set-gid
         * directory still inherits the bit from the kernel; it grants nothing.) */
        load_arg(m, r->arg);
        emit(m, BPF_JMP | BPF_JSET | BPF_K, 0, 1, SUGID);
        emit_ret(m, a->eperm);
        emit_ret(m, a->allow);
        break;
    case K_OPEN:
        /* The mode only matters when the call creates a file: O_CREAT, or O_TMPFILE (whose
         * file can be linked into the tree later with its mode). */
        load_arg(m, r->arg);
        emit(m, BPF_JMP | BPF_JSET | BPF_K, 0, 3, O_CREAT | __O_TMPFILE);
        load_arg(m, r->arg + 1);
        emit(m, BPF_JMP | BPF_JSET | BPF_K, 0, 1, SUGID);
        emit_ret(m, a->eperm);
        emit_ret(m, a->allow);
        break;
    case K_MKNOD:
        /* Regular files (type 0 means regular too) without S_ISUID/S_ISGID, FIFOs and
         * sockets; never devices. */
        load_arg(m, r->arg);
        emit(m, BPF_JMP | BPF_JSET | BPF_K, 6, 0, SUGID);
        emit(m, BPF_ALU | BPF_AND | BPF_K, 0, 0, S_IFMT);
        emit(m, BPF_JMP | BPF_JEQ | BPF_K, 3, 0, 0);
        emit(m, BPF_JMP | BPF_JEQ | BPF_K, 2, 0, S_IFREG);
        emit(m, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, S_IFIFO);
        emit(m, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, S_IFSOCK);
        emit_ret(m, a->allow);
        emit_ret(m, a->eperm);
        break;
    case K_PERSONALITY:
        load_arg(m, r->arg);
        for (size_t i = 0; i < ARRAY_SIZE(personality_ok); i++)
            emit(m, BPF_JMP | BPF_JEQ | BPF_K, (uint8_t)(ARRAY_SIZE(personality_ok) - i), 0,
                 personality_ok[i]);
        emit_ret(m, a->eperm);
        emit_ret(m, a->allow);
        break;
    case K_SOCKET:
        load_arg(m, r->arg);
        for (size_t i = 0; i < ARRAY_SIZE(socket_families); i++)
            emit(m, BPF_JMP | BPF_JEQ | BPF_K, (uint8_t)(ARRAY_SIZE(socket_families) - i), 0,
                 socket_families[i]);
        emit_ret(m, a->eperm);
        emit_ret(m, a->allow);
        break;
    case K_IOCTL:
        load_arg(m, r->arg);
        for (size_t i = 0; i < ARRAY_SIZE(tty_ioctls); i++)
            emit(m, BPF_JMP | BPF_JEQ | BPF_K, (uint8_t)(ARRAY_SIZE(tty_ioctls) - i), 0,
                 tty_ioctls[i]);
        emit_ret(m, a->allow);
        emit_ret(m, a->eperm);
        break;
    }
}

static void emitter_done(struct emitter *m)
{
    free(m->insns);
    free(m->labels);
    free(m->fixups);
}

int conch_seccomp__prog_build_errnos(const struct conch_seccomp_opts *opts, int eperm_errno,
                                     int enosys_errno, struct conch_seccomp_prog *ret,
                                     struct conch_err *err)
{
    const uint32_t arch = native_arch();
    if (arch != SCMP_ARCH_X86_64 && arch != SCMP_ARCH_AARCH64)
        return conch_err_set(err, ENOTSUP,
                             "seccomp: no syscall allowlist for this architecture (0x%x)", arch);
    const struct actions act = {
        .allow = SECCOMP_RET_ALLOW,
        .eperm = SECCOMP_RET_ERRNO | ((uint32_t)eperm_errno & SECCOMP_RET_DATA),
        .enosys = SECCOMP_RET_ERRNO | ((uint32_t)enosys_errno & SECCOMP_RET_DATA),
    };

    size_t n_arch = 0;
    const struct entry *extra = arch_entries(arch, &n_arch);
    const size_t n_all = ARRAY_SIZE(common_entries) + n_arch;
    _cleanup_free_ struct rule *rules = calloc(n_all, sizeof(*rules));
    if (!rules)
        return conch_err_set(err, ENOMEM, "seccomp: allocate rules");
    size_t n = 0;
    unsigned next_label = 0;
    for (size_t i = 0; i < n_all; i++) {
        const struct entry *e = i < ARRAY_SIZE(common_entries)
                                    ? &common_entries[i]
                                    : &extra[i - ARRAY_SIZE(common_entries)];
        int nr = resolve(arch, e->name);
        if (nr < 0)
            return conch_err_set(err, EINVAL, "seccomp: libseccomp does not know syscall '%s'",
                                 e->name);
        unsigned kind = entry_kind(e, opts);
        if (kind == K_ENOSYS)
            continue; /* the default */
        rules[n] = (struct rule){.nr = nr, .kind = kind, .arg = e->arg};
        if (kind != K_ALLOW && kind != K_EPERM)
            rules[n].label = next_label++;
        n++;
    }
    qsort(rules, n, sizeof(*rules), rule_cmp);
    for (size_t i = 1; i < n; i++)
        if (rules[i].nr == rules[i - 1].nr)
            return conch_err_set(err, EINVAL, "seccomp: syscall %d listed twice", rules[i].nr);

    _cleanup_free_ struct run *runs = calloc(2 * n + 1, sizeof(*runs));
    if (!runs)
        return conch_err_set(err, ENOMEM, "seccomp: allocate rules");
    size_t n_runs = runs_build(rules, n, runs);

    struct emitter m = {0};
    m.n_labels = next_label + (unsigned)n_runs + 2; /* argument blocks, then search nodes */
    m.labels = malloc(m.n_labels * sizeof(*m.labels));
    if (!m.labels)
        return conch_err_set(err, ENOMEM, "seccomp: allocate filter");
    memset(m.labels, 0xff, m.n_labels * sizeof(*m.labels));

    /* A filter only reasons about the native syscall table; i386 (int 0x80) and x32 calls
     * would reach the same kernel code under different numbers, so they die. */
    emit(&m, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, arch));
    emit(&m, BPF_JMP | BPF_JEQ | BPF_K, 1, 0, arch);
    emit_ret(&m, SECCOMP_RET_KILL_PROCESS);
    emit(&m, BPF_LD | BPF_W | BPF_ABS, 0, 0, offsetof(struct seccomp_data, nr));
    if (arch == SCMP_ARCH_X86_64) {
        /* x32 (bit 30), except -1, which only a tracer's "skip this call" produces */
        emit(&m, BPF_JMP | BPF_JGE | BPF_K, 0, 3, 0x40000000u);
        emit(&m, BPF_JMP | BPF_JEQ | BPF_K, 0, 1, 0xffffffffu);
        emit_ret(&m, act.enosys);
        emit_ret(&m, SECCOMP_RET_KILL_PROCESS);
    }
    unsigned search_label = next_label;
    emit_range(&m, runs, 0, n_runs, &search_label, &act);
    for (size_t i = 0; i < n; i++)
        if (rules[i].kind != K_ALLOW && rules[i].kind != K_EPERM)
            emit_arg_block(&m, &rules[i], &act);

    int r = 0;
    if (m.oom)
        r = conch_err_set(err, ENOMEM, "seccomp: allocate filter");
    else if (m.len > BPF_MAXINSNS)
        r = conch_err_set(err, E2BIG, "seccomp: filter has %u instructions (max %d)", m.len,
                          BPF_MAXINSNS);
    for (unsigned i = 0; r == 0 && i < m.n_fixups; i++) {
        unsigned at = m.fixups[i].at, to = m.labels[m.fixups[i].label];
        if (to == UINT_MAX || to <= at)
            r = conch_err_set(err, EINVAL, "seccomp: internal error: bad jump at %u", at);
        else
            m.insns[at].k = to - at - 1;
    }
    if (r < 0) {
        emitter_done(&m);
        return r;
    }
    ret->insns = m.insns;
    ret->len = (unsigned short)m.len;
    m.insns = NULL;
    emitter_done(&m);
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
