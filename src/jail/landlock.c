/* landlock.c - the Landlock fence, applied in the child just before execve: read and execute
 * everywhere, write only beneath the writable paths, and (ABI >= 6) signals and abstract unix
 * sockets scoped to the command's own domain. Raw syscalls (glibc 2.36 has no wrappers),
 * no allocation. */
#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jail/landlock.h"

/* Debian 12's linux-libc-dev (6.1) stops at ABI 2; the running kernel may know more. */
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#ifndef LANDLOCK_ACCESS_FS_IOCTL_DEV
#define LANDLOCK_ACCESS_FS_IOCTL_DEV (1ULL << 15)
#endif
#ifndef LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET
#define LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define LANDLOCK_SCOPE_SIGNAL (1ULL << 1)
#endif

/* struct landlock_ruleset_attr as of ABI 6 (the installed header may stop at ABI 1's
 * single field). The kernel takes any prefix it knows, so the size passed picks the ABI. */
struct ruleset_attr {
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

#define FS_ABI1                                                                                    \
    (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |   \
     LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR |                                 \
     LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR | LANDLOCK_ACCESS_FS_MAKE_DIR | \
     LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK | LANDLOCK_ACCESS_FS_MAKE_FIFO |   \
     LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM)

/* Rights that make sense on a file (not a directory) rule; the kernel rejects the rest with
 * EINVAL when the rule's path is not a directory (e.g. a writable "/dev/null"). */
#define FS_FILE_RIGHTS                                                                             \
    (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |   \
     LANDLOCK_ACCESS_FS_TRUNCATE | LANDLOCK_ACCESS_FS_IOCTL_DEV)

#define FS_READ_EXEC                                                                               \
    (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR)

/* Every filesystem right the kernel's ABI knows; handling all of them is what makes the
 * ruleset deny by default (an unhandled right is simply allowed). */
static uint64_t fs_rights(int abi)
{
    uint64_t r = FS_ABI1;
    if (abi >= 2)
        r |= LANDLOCK_ACCESS_FS_REFER;
    if (abi >= 3)
        r |= LANDLOCK_ACCESS_FS_TRUNCATE;
    if (abi >= 5)
        r |= LANDLOCK_ACCESS_FS_IOCTL_DEV;
    return r;
}

int conch_landlock_abi(void)
{
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
    return abi < 0 ? 0 : (int)abi;
}

static int add_path_rule(int ruleset, const char *path, uint64_t allowed)
{
    int fd = open(path, O_PATH | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (!S_ISDIR(st.st_mode))
        allowed &= FS_FILE_RIGHTS;
    struct landlock_path_beneath_attr pb = {.allowed_access = allowed, .parent_fd = fd};
    int r = 0;
    if (syscall(SYS_landlock_add_rule, ruleset, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) < 0)
        r = -errno;
    close(fd);
    return r;
}

/* Writable paths are the caller's list of mounts; a missing one grants nothing, so skipping
 * it cannot widen access. Any other failure fails closed. */
static int add_writable_rule(int ruleset, const char *path, uint64_t handled)
{
    int r = add_path_rule(ruleset, path, handled);
    return r == -ENOENT ? 0 : r;
}

int conch_landlock_prepare_child(const char *const *writable, int *ret_ruleset)
{
    *ret_ruleset = -1;
    int abi = conch_landlock_abi();
    if (abi <= 0)
        return 1;
    uint64_t handled = fs_rights(abi);

    /* From ABI 6 on, the command is also scoped: it may signal, and connect to abstract
     * unix sockets of, only processes in its own Landlock domain or nested ones, so the
     * warden, its shepherd, the file worker and other commands are out of reach. The
     * network stays fenced by the namespace (handled_access_net is 0). Older kernels get
     * the ABI-1 sized struct. */
    struct ruleset_attr attr = {.handled_access_fs = handled};
    size_t attr_size = sizeof(attr.handled_access_fs);
    if (abi >= 6) {
        attr.scoped = LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | LANDLOCK_SCOPE_SIGNAL;
        attr_size = sizeof(attr);
    }
    int ruleset = (int)syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
    if (ruleset < 0)
        return -errno;

    int r = add_path_rule(ruleset, "/", FS_READ_EXEC);
    for (size_t i = 0; r >= 0 && writable && writable[i]; i++)
        r = add_writable_rule(ruleset, writable[i], handled);
    if (r < 0) {
        close(ruleset);
        return r;
    }
    *ret_ruleset = ruleset;
    return 0;
}

int conch_landlock_finish_child(int ruleset, const char *const *writable)
{
    uint64_t handled = fs_rights(conch_landlock_abi());
    int r = 0;
    for (size_t i = 0; r >= 0 && writable && writable[i]; i++)
        r = add_writable_rule(ruleset, writable[i], handled);
    if (r >= 0 && syscall(SYS_landlock_restrict_self, ruleset, 0) < 0)
        r = -errno;
    close(ruleset);
    return r;
}

int conch_landlock_apply_child(const char *const *writable)
{
    int ruleset;
    int r = conch_landlock_prepare_child(writable, &ruleset);
    return r == 0 ? conch_landlock_finish_child(ruleset, NULL) : r;
}
