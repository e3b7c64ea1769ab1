/* seccomp.h - the seccomp filter that fences agent commands: emitted as classic BPF in the
 * parent (which may allocate; syscalls named through libseccomp), installed in the child with
 * one prctl (which does not). A default-deny allowlist: see conch_seccomp_prog_build. */
#ifndef CONCH_JAIL_SECCOMP_H
#define CONCH_JAIL_SECCOMP_H

#include <linux/filter.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

/* A compiled classic-BPF program, ready for PR_SET_SECCOMP. */
struct conch_seccomp_prog {
    struct sock_filter *insns; /* owned; freed by conch_seccomp_prog_done */
    unsigned short len;
};

struct conch_seccomp_opts {
    /* Namespace root asked for (--as-root): chown/setuid family stay allowed anyway; this
     * only documents intent for future per-mode rules. */
    bool as_root;
    /* The filter for the file worker (the trusted fs code the warden forks): the same as a
     * command's, but openat2 is allowed, since the worker resolves every path with
     * RESOLVE_BENEATH. Its mode cannot be inspected, so commands never get it. */
    bool file_worker;
    /* The JS worker's filter (with file_worker: it reads and writes files the same way):
     * running programs (execve, execveat), sockets (socket, socketpair, connect, bind,
     * listen, accept) and ptrace fail with EPERM. Its one channel is the socket it was
     * given. */
    bool js_worker;
};

/*
 * conch_seccomp_prog_build - compile the agent filter into @ret (caller calls
 * conch_seccomp_prog_done; @ret is written only on success). @opts is borrowed and may be
 * NULL. Default deny: only an allowlist of syscalls (per architecture: x86_64 and aarch64,
 * by libseccomp name) reaches the kernel, and every other call fails with ENOSYS, as if the
 * kernel lacked it, so a newer kernel adds nothing to what a command can reach (listmount,
 * statmount, open_tree_attr, quotactl_fd, lsm_*, ...). clone3 and openat2 (their flags and
 * mode live in memory seccomp cannot read) get ENOSYS too, so libcs fall back to clone and
 * openat; the file worker's filter allows openat2.
 *
 * Known-dangerous calls fail with EPERM instead, the answer unprivileged programs expect:
 * the mount family (mount, umount2, pivot_root, move_mount, open_tree, fsopen, fsconfig,
 * fsmount, fspick, mount_setattr), unshare and setns, clone with any CLONE_NEW* flag, bpf,
 * keyctl, add_key, request_key, perf_event_open, kexec_load, kexec_file_load, init_module,
 * finit_module, delete_module, io_uring_setup/enter/register, userfaultfd,
 * open_by_handle_at, name_to_handle_at, settimeofday, clock_settime, clock_adjtime,
 * adjtimex, swapon/off, reboot, syslog, acct, quotactl, lookup_dcookie, vhangup, nfsservctl,
 * iopl, ioperm, ioctl TIOCSTI and TIOCLINUX, and personality() except 0, PER_LINUX32,
 * ADDR_NO_RANDOMIZE, both, and the 0xffffffff query.
 *
 * Nothing a command writes may carry privilege to the host, so these fail with EPERM too:
 * chmod/fchmod/fchmodat/fchmodat2 with S_ISUID or S_ISGID; open/openat/creat creating a file
 * (O_CREAT or O_TMPFILE) with S_ISUID or S_ISGID; mkdir/mkdirat with either (set-gid
 * directories too: chmod cannot tell them from files); mknod/mknodat of anything but regular files
 * without those bits, FIFOs and sockets (no devices). ptrace stays allowed (gdb and strace
 * work on the sandbox's own processes; the pid namespace and Landlock fence the rest).
 * Non-native architectures (x32, i386 via int 0x80) are killed.
 * Returns 0, or -errno with @err filled.
 */
int conch_seccomp_prog_build(const struct conch_seccomp_opts *opts, struct conch_seccomp_prog *ret,
                             struct conch_err *err);

/* conch_seccomp_prog_done - free @prog's instructions; safe on a zeroed struct. */
void conch_seccomp_prog_done(struct conch_seccomp_prog *prog);

/*
 * conch_seccomp_install_child - install @prog in the calling process (needs no_new_privs or
 * CAP_SYS_ADMIN). Async-signal-safe: no allocation. Returns 0 or -errno.
 */
int conch_seccomp_install_child(const struct conch_seccomp_prog *prog);

/* ---- internal, for tests (tests/unit/test_seccomp.c) ---- */

/* conch_seccomp__prog_build_errnos - conch_seccomp_prog_build, but the filter answers
 * @eperm_errno where it would answer EPERM and @enosys_errno where it would answer ENOSYS
 * (values the kernel never returns let a test tell the filter's answers from the kernel's). */
int conch_seccomp__prog_build_errnos(const struct conch_seccomp_opts *opts, int eperm_errno,
                                     int enosys_errno, struct conch_seccomp_prog *ret,
                                     struct conch_err *err);

enum {
    CONCH_SECCOMP__ENOSYS = 0, /* refused with ENOSYS (not on the list, or clone3/openat2) */
    CONCH_SECCOMP__ALLOW,      /* reaches the kernel */
    CONCH_SECCOMP__EPERM,      /* refused with EPERM */
    CONCH_SECCOMP__ARGS,       /* reaches the kernel or EPERM, depending on its arguments */
};

/* conch_seccomp__verdict - what the native filter built with @opts does with syscall @nr
 * according to its tables (one of the CONCH_SECCOMP__* values). */
int conch_seccomp__verdict(const struct conch_seccomp_opts *opts, long nr);

/* conch_seccomp__check_names - check that every syscall on @arch's list (an SCMP_ARCH_*
 * value, e.g. SCMP_ARCH_AARCH64 on an x86_64 host) exists there. Returns 0 or -EINVAL. */
int conch_seccomp__check_names(uint32_t arch, struct conch_err *err);

#endif
