/* seccomp.c - the agent seccomp filter: a default-allow deny list compiled with libseccomp in
 * the parent, exported as classic BPF, and installed in the child with a single prctl. */
#include <errno.h>
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

/* Denied outright with EPERM, whatever their arguments. */
static const char *const denied[] = {
    /* the mount family: the sandbox's mount tree is final once the command runs */
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
    "fspick", "mount_setattr",
    /* new namespaces are where most user-namespace kernel bugs are reached */
    "unshare", "setns",
    /* large kernel attack surface that agent commands have no use for */
    "bpf", "keyctl", "add_key", "request_key", "perf_event_open", "kexec_load", "kexec_file_load",
    "init_module", "finit_module", "delete_module", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "userfaultfd", "open_by_handle_at", "name_to_handle_at", "settimeofday",
    "clock_settime", "clock_adjtime", "adjtimex", "swapon", "swapoff", "reboot", "syslog", "acct",
    "quotactl", "lookup_dcookie", "vhangup", "nfsservctl", "iopl", "ioperm"};

/* clone() namespace flags. CLONE_NEWTIME is absent: its bit is part of clone()'s exit-signal
 * byte, so only clone3 (refused below) and unshare (denied) can ask for it. */
static const unsigned long clone_ns_flags[] = {CLONE_NEWNS,  CLONE_NEWCGROUP, CLONE_NEWUTS,
                                               CLONE_NEWIPC, CLONE_NEWUSER,   CLONE_NEWPID,
                                               CLONE_NEWNET};

/* personality() values left alone: the default, PER_LINUX32 (uname reports i686),
 * ADDR_NO_RANDOMIZE (gdb and `setarch -R` turn off ASLR for the program they start), both,
 * and the 0xffffffff query. Others (READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...) weaken exploit
 * mitigations. */
static const uint32_t personality_ok[] = {0, PER_LINUX32, ADDR_NO_RANDOMIZE,
                                          PER_LINUX32 | ADDR_NO_RANDOMIZE, 0xffffffffu};

static void ctx_releasep(scmp_filter_ctx *ctx)
{
    if (*ctx)
        seccomp_release(*ctx);
}

static int deny(scmp_filter_ctx ctx, const char *name, uint32_t action, unsigned n,
                const struct scmp_arg_cmp *cmp, struct conch_err *err)
{
    int nr = seccomp_syscall_resolve_name(name);
    if (nr == __NR_SCMP_ERROR)
        return conch_err_set(err, EINVAL, "seccomp: libseccomp does not know syscall '%s'", name);
    int r = seccomp_rule_add_array(ctx, action, nr, n, cmp);
    if (r < 0)
        return conch_err_set(err, -r, "seccomp: add rule for '%s': %s", name, strerror(-r));
    return 0;
}

/*
 * libseccomp 2.5 cannot AND two comparisons on the same argument, and a default-allow filter
 * cannot carry ALLOW rules, so "personality(x) unless x is one of N values" is not expressible
 * as rules. It is written by hand as a short prefix run before libseccomp's program: for a
 * native personality() call it returns EPERM unless the (32-bit, as the kernel reads it)
 * argument is allowed; every other call, and every allowed one, falls through to the start of
 * libseccomp's program, which does its own architecture check.
 */
#define PERSONALITY_PREFIX_LEN (5 + ARRAY_SIZE(personality_ok) + 1)

static void personality_prefix(struct sock_filter *p)
{
    const unsigned n_ok = ARRAY_SIZE(personality_ok);
    unsigned i = 0;
    /* Jump targets are relative to the next instruction; "out" is the first instruction after
     * the prefix, at index PERSONALITY_PREFIX_LEN. */
#define TO_OUT(at) ((unsigned char)(PERSONALITY_PREFIX_LEN - (at)-1))
    p[i] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    i++;
    p[i] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, TO_OUT(i));
    i++;
    p[i] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    i++;
    p[i] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_personality, 0, TO_OUT(i));
    i++;
    /* x86_64 is little-endian: the low half of args[0] comes first. */
    p[i] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                        offsetof(struct seccomp_data, args[0]));
    i++;
    for (unsigned k = 0; k < n_ok; k++, i++)
        p[i] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, personality_ok[k], TO_OUT(i),
                                            0);
    p[i] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K,
                                        SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA));
#undef TO_OUT
}

static int build_rules(scmp_filter_ctx ctx, struct conch_err *err)
{
    const uint32_t eperm = SCMP_ACT_ERRNO(EPERM);
    int r;

    for (size_t i = 0; i < ARRAY_SIZE(denied); i++)
        if ((r = deny(ctx, denied[i], eperm, 0, NULL, err)) < 0)
            return r;

    /* clone's flags are in a register, so they can be inspected: one rule per namespace flag
     * (the rules of one syscall are ORed). The comparisons look only at the flag's own bit, so
     * sign extension of the int flags by the caller does not matter. */
    for (size_t i = 0; i < ARRAY_SIZE(clone_ns_flags); i++) {
        struct scmp_arg_cmp c = SCMP_A0(SCMP_CMP_MASKED_EQ, clone_ns_flags[i], clone_ns_flags[i]);
        if ((r = deny(ctx, "clone", eperm, 1, &c, err)) < 0)
            return r;
    }
    /* clone3 passes its flags in memory, which seccomp cannot read. ENOSYS makes glibc (and
     * Go, Rust) fall back to clone(), whose flags the rules above see; Docker does the same. */
    if ((r = deny(ctx, "clone3", SCMP_ACT_ERRNO(ENOSYS), 0, NULL, err)) < 0)
        return r;

    /* TIOCSTI/TIOCLINUX push input into a terminal, the classic escape through a shared tty
     * (CVE-2017-5226 in bubblewrap). The kernel reads the request as 32 bits. */
    const unsigned long tty_ioctls[] = {TIOCSTI, TIOCLINUX};
    for (size_t i = 0; i < ARRAY_SIZE(tty_ioctls); i++) {
        struct scmp_arg_cmp c = SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, tty_ioctls[i]);
        if ((r = deny(ctx, "ioctl", eperm, 1, &c, err)) < 0)
            return r;
    }

    /* Device nodes, not FIFOs or sockets (build tools and tests create those). */
    const unsigned long dev_types[] = {S_IFCHR, S_IFBLK};
    for (size_t i = 0; i < ARRAY_SIZE(dev_types); i++) {
        struct scmp_arg_cmp c1 = SCMP_A1(SCMP_CMP_MASKED_EQ, S_IFMT, dev_types[i]);
        struct scmp_arg_cmp c2 = SCMP_A2(SCMP_CMP_MASKED_EQ, S_IFMT, dev_types[i]);
        if ((r = deny(ctx, "mknod", eperm, 1, &c1, err)) < 0 ||
            (r = deny(ctx, "mknodat", eperm, 1, &c2, err)) < 0)
            return r;
    }
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

int conch_seccomp_prog_build(const struct conch_seccomp_opts *opts, struct conch_seccomp_prog *ret,
                             struct conch_err *err)
{
    (void)opts; /* no per-mode rules yet: see the header */

    _cleanup_(ctx_releasep) scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
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
    r = build_rules(ctx, err);
    if (r < 0)
        return r;

    _cleanup_free_ struct sock_filter *body = NULL;
    size_t body_len = 0;
    r = export_bpf(ctx, &body, &body_len, err);
    if (r < 0)
        return r;

    size_t len = PERSONALITY_PREFIX_LEN + body_len;
    if (len > BPF_MAXINSNS)
        return conch_err_set(err, E2BIG, "seccomp: filter has %zu instructions (max %d)", len,
                             BPF_MAXINSNS);
    struct sock_filter *insns = calloc(len, sizeof(*insns));
    if (!insns)
        return conch_err_set(err, ENOMEM, "seccomp: allocate filter");
    personality_prefix(insns);
    memcpy(insns + PERSONALITY_PREFIX_LEN, body, body_len * sizeof(*insns));

    ret->insns = insns;
    ret->len = (unsigned short)len;
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
