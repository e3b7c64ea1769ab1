/* seccomp.h - the seccomp filter that fences agent commands: built with libseccomp in the
 * parent (which may allocate), installed in the child with one prctl (which does not). */
#ifndef CONCH_JAIL_SECCOMP_H
#define CONCH_JAIL_SECCOMP_H

#include <linux/filter.h>
#include <stdbool.h>

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
};

/*
 * conch_seccomp_prog_build - compile the agent filter into @ret (caller calls
 * conch_seccomp_prog_done; @ret is written only on success). @opts is borrowed and may be
 * NULL. A default-allow deny list; denied calls fail with EPERM so programs degrade
 * gracefully: the mount family (mount, umount2, pivot_root, move_mount, open_tree, fsopen,
 * fsconfig, fsmount, fspick, mount_setattr), unshare and setns (any flags), clone with any
 * CLONE_NEW* flag, bpf, keyctl, add_key, request_key, perf_event_open, kexec_load,
 * kexec_file_load, init_module, finit_module, delete_module, io_uring_setup/enter/register,
 * userfaultfd, open_by_handle_at, name_to_handle_at, settimeofday, clock_settime,
 * clock_adjtime, adjtimex, swapon/off, reboot, syslog, acct, quotactl, lookup_dcookie,
 * vhangup, nfsservctl, iopl, ioperm, mknod/mknodat of character and block devices (FIFOs and
 * sockets are fine), ioctl TIOCSTI and TIOCLINUX, and personality() except 0, PER_LINUX32,
 * ADDR_NO_RANDOMIZE, both, and the 0xffffffff query. clone3 fails with ENOSYS instead, so
 * libcs fall back to clone(), whose flags the filter can see. ptrace stays allowed (gdb and
 * strace work on the sandbox's own processes; the pid namespace and dropped capabilities
 * fence the rest). Non-native architectures (x32, i386 via int 0x80) are killed.
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

#endif
