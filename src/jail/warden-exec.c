/* warden-exec.c - a daemon's wardens start from a clean image. At start the daemon copies
 * its binary into a sealed, execute-only memfd (conch_jail_clean_image_prepare); for each sandbox
 * it packs the plan into a sealed memfd (conch_jail_plan_pack) and the clone child execs the copy
 * (exec-child.c), whose main() calls conch_jail_warden_entry: it maps the plan and becomes
 * the warden (conch_jail_warden_main), a single-threaded process that holds nothing of the daemon's
 * memory, so that what it forks (shepherds, file workers, which call malloc and parse JSON)
 * starts from it alone. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/proctitle.h"
#include "jail/jail-internal.h"

#define PLAN_MAGIC 0x6e6c7077u /* "wpln" */
#define PLAN_MAX_SIZE (16u << 20)
#ifdef MFD_EXEC
#define MFD_EXEC_FLAG MFD_EXEC
#else
#define MFD_EXEC_FLAG 0x0010U
#endif

/* The memfd: this header, the plan's bytes at plan_off, the programs' instructions. */
struct plan_blob {
    uint32_t magic;
    uint32_t version;   /* JAIL_PROTO_VERSION */
    uint64_t size;      /* of the whole blob */
    uint64_t plan_off;  /* struct jail_plan */
    uint64_t plan_size; /* sizeof(struct jail_plan): the same binary has the same layout */
    uint64_t seccomp_off, seccomp_file_off, seccomp_js_off; /* struct sock_filter[]; 0: none */
    uint32_t seccomp_len, seccomp_file_len, seccomp_js_len;
    /* The file handlers, as offsets from plan_anchor within the image; 0: none. */
    int64_t file_handler, file_server, js_server;
};

#define ALIGN16(n) (((n) + 15) & ~(size_t)15)

static int clean_image = -1;

/* Seal @fd (a memfd only we hold, never mapped) against any change. F_SEAL_WRITE waits for
 * the kernel's transient references to its pages (the LRU's per-CPU batches, page cache
 * lookups) and gives up with EBUSY after ~150 ms, which a loaded machine reaches (CI saw
 * "seal the wardens' image: Device or resource busy"). There are no mappings and no other
 * holder, so F_SEAL_FUTURE_WRITE (no write, no writable mapping from now on) is the same
 * guarantee here: the fallback. */
static int seal_unchangeable(int fd)
{
    const int fixed = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW;
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0 ||
        (errno == EBUSY && fcntl(fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0))
        return fcntl(fd, F_ADD_SEALS, fixed);
    return -1;
}

/* Three fd numbers a warden's fds travel in at its clone, and the /dev/null they hold between
 * two clones (conch_jail_spawn_slots). */
static int spawn_slots[4] = {-1, -1, -1, -1};

int conch_jail_clean_image_prepare(struct conch_err *err)
{
    if (clean_image >= 0)
        return 0;
    _cleanup_close_ int src = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (src < 0 || fstat(src, &st) < 0)
        return conch_err_set(err, errno,
                             "read the conch binary (/proc/self/exe): %s (wardens are started "
                             "from a copy of it: it must be readable by the user conch runs as)",
                             strerror(errno));
    /* MFD_EXEC: where vm.memfd_noexec makes memfds non-executable by default (Linux 6.3+);
     * older kernels do not know the flag. */
    _cleanup_close_ int fd = memfd_create("conch", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC_FLAG);
    if (fd < 0 && errno == EINVAL)
        fd = memfd_create("conch", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return conch_err_set(err, errno, "memfd_create for the wardens' image: %s",
                             strerror(errno));
    off_t off = 0;
    while (off < st.st_size) {
        ssize_t n = sendfile(fd, src, &off, (size_t)(st.st_size - off));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return conch_err_set(err, n < 0 ? errno : EIO,
                                 "copy the conch binary for the wardens: %s",
                                 strerror(n < 0 ? errno : EIO));
    }
    /* Execute-only: an exec of a file the exec'ing process may not read leaves the new image's
     * memory owned by the first user namespace up where the file's owner has an id (the
     * host's), not by the sandbox's, as a copy of ours was. So a non-dumpable process of the
     * sandbox (a shepherd, a file worker) keeps its /proc files owned by host root, out of
     * reach of the sandbox's own root (--as-root). Sealed: no one changes it while it runs. */
    if (fchmod(fd, 0111) < 0 || seal_unchangeable(fd) < 0)
        return conch_err_set(err, errno, "seal the wardens' image: %s", strerror(errno));
    clean_image = TAKE_FD(fd);
    /* The slots (conch_jail_warden_clone): taken now, while the lowest numbers are free. None
     * (an fd limit reached) only costs the copy of the table at each clone. */
    for (int i = 0; i < 4; i++)
        if ((spawn_slots[i] = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
            for (int k = 0; k < i; k++) {
                close(spawn_slots[k]);
                spawn_slots[k] = -1;
            }
            break;
        }
    return 0;
}

bool conch_jail_spawn_slots(int slots[3], int *devnull)
{
    if (spawn_slots[3] < 0)
        return false;
    memcpy(slots, spawn_slots, 3 * sizeof(int));
    *devnull = spawn_slots[3];
    return true;
}

int conch_jail_clean_image(void)
{
    return clean_image;
}

/* What a file handler's offset is taken from: a function of this image. */
static void plan_anchor(void)
{
}

/* @fn as an offset from plan_anchor, in *@ret (0 for NULL). A function of another object (a
 * shared library) has no fixed offset from ours: refused. @slot: where the check of this
 * handler is remembered (it is the same function from one sandbox to the next). */
static int fn_offset(void *fn, int slot, const char *what, int64_t *ret, struct conch_err *err)
{
    static void *checked[3];
    *ret = 0;
    if (!fn)
        return 0;
    if (fn != checked[slot]) {
        Dl_info a, b;
        if (!dladdr(fn, &a) || !dladdr((void *)plan_anchor, &b) || a.dli_fbase != b.dli_fbase)
            return conch_err_set(err, EINVAL,
                                 "the sandbox's %s is not in the program that starts it: the "
                                 "warden (that program, exec'd anew) could not call it",
                                 what);
        checked[slot] = fn;
    }
    *ret = (int64_t)((uintptr_t)fn - (uintptr_t)plan_anchor);
    return 0;
}

static void *fn_at(int64_t off)
{
    return off ? (void *)((uintptr_t)plan_anchor + (uintptr_t)off) : NULL;
}

static int pwrite_all(int fd, const void *buf, size_t len, size_t off)
{
    while (len) {
        ssize_t n = pwrite(fd, buf, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf = (const char *)buf + n;
        len -= (size_t)n;
        off += (size_t)n;
    }
    return 0;
}

int conch_jail_plan_pack(const struct jail_plan *plan, struct conch_err *err)
{
    struct plan_blob hdr = {
        .magic = PLAN_MAGIC, .version = JAIL_PROTO_VERSION, .plan_size = sizeof(*plan)};
    int r;
    if ((r = fn_offset((void *)plan->file_handler, 0, "file handler", &hdr.file_handler, err)) <
            0 ||
        (r = fn_offset((void *)plan->file_server, 1, "file server", &hdr.file_server, err)) < 0 ||
        (r = fn_offset((void *)plan->js_server, 2, "JS worker", &hdr.js_server, err)) < 0)
        return r;
    size_t off = hdr.plan_off = ALIGN16(sizeof(hdr));
    off = ALIGN16(off + sizeof(*plan));
    const struct conch_seccomp_prog *progs[3] = {plan->seccomp, plan->seccomp_file,
                                                 plan->seccomp_js};
    uint64_t *prog_off[3] = {&hdr.seccomp_off, &hdr.seccomp_file_off, &hdr.seccomp_js_off};
    uint32_t *prog_len[3] = {&hdr.seccomp_len, &hdr.seccomp_file_len, &hdr.seccomp_js_len};
    for (int i = 0; i < 3; i++) {
        if (!progs[i] || !progs[i]->insns || !progs[i]->len)
            continue;
        *prog_off[i] = off;
        *prog_len[i] = progs[i]->len;
        off = ALIGN16(off + progs[i]->len * sizeof(*progs[i]->insns));
    }
    hdr.size = off;

    _cleanup_close_ int fd = memfd_create("conch-plan", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return conch_err_set(err, errno, "memfd_create: %s", strerror(errno));
    if (ftruncate(fd, (off_t)hdr.size) < 0)
        return conch_err_set(err, errno, "size the warden's plan: %s", strerror(errno));
    /* The unused bind paths (most of the plan's 200 KiB) are zeros, as is the memfd: skipped. */
    size_t binds_end = offsetof(struct jail_plan, bind_paths) + plan->bind_paths_len;
    _Static_assert(offsetof(struct jail_plan, n_binds) - offsetof(struct jail_plan, bind_paths) -
                           sizeof(plan->bind_paths) <
                       _Alignof(int),
                   "nothing between bind_paths and n_binds: it would not be packed");
    size_t tail = offsetof(struct jail_plan, n_binds);
    if (pwrite_all(fd, &hdr, sizeof(hdr), 0) < 0 ||
        pwrite_all(fd, plan, binds_end, hdr.plan_off) < 0 ||
        pwrite_all(fd, (const char *)plan + tail, sizeof(*plan) - tail, hdr.plan_off + tail) < 0)
        return conch_err_set(err, errno ? errno : EIO, "write the warden's plan: %s",
                             strerror(errno ? errno : EIO));
    for (int i = 0; i < 3; i++)
        if (*prog_off[i] && pwrite_all(fd, progs[i]->insns,
                                       progs[i]->len * sizeof(*progs[i]->insns), *prog_off[i]) < 0)
            return conch_err_set(err, errno ? errno : EIO, "write the warden's plan: %s",
                                 strerror(errno ? errno : EIO));
    if (seal_unchangeable(fd) < 0)
        return conch_err_set(err, errno, "seal the warden's plan: %s", strerror(errno));
    return TAKE_FD(fd);
}

/* Map the plan in @fd (a private copy, which we may write) and point its pointers into it.
 * Returns 0 with *@ret (valid for the process's life) or -errno with @err. */
static int plan_load(int fd, struct jail_plan **ret, struct conch_err *err)
{
    static struct conch_seccomp_prog progs[3];
    struct stat st;
    if (fstat(fd, &st) < 0)
        return conch_err_set(err, errno, "warden: read its plan: %s", strerror(errno));
    if (st.st_size < (off_t)sizeof(struct plan_blob) || st.st_size > PLAN_MAX_SIZE)
        return conch_err_set(err, EPROTO, "warden: its plan has a bad size");
    size_t size = (size_t)st.st_size;
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED)
        return conch_err_set(err, errno, "warden: map its plan: %s", strerror(errno));
    const struct plan_blob *hdr = (const struct plan_blob *)p;
    if (hdr->magic != PLAN_MAGIC || hdr->version != JAIL_PROTO_VERSION || hdr->size != size ||
        hdr->plan_size != sizeof(struct jail_plan) || hdr->plan_off % 16 || hdr->plan_off > size ||
        size - hdr->plan_off < sizeof(struct jail_plan))
        return conch_err_set(err, EPROTO, "warden: its plan is not of this build");
    struct jail_plan *plan = (struct jail_plan *)(p + hdr->plan_off);
    uint64_t offs[3] = {hdr->seccomp_off, hdr->seccomp_file_off, hdr->seccomp_js_off};
    uint32_t lens[3] = {hdr->seccomp_len, hdr->seccomp_file_len, hdr->seccomp_js_len};
    const struct conch_seccomp_prog *set[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        if (!offs[i])
            continue;
        size_t bytes = (size_t)lens[i] * sizeof(*progs[i].insns);
        if (!lens[i] || lens[i] > 0xffff || offs[i] % 16 || offs[i] > size ||
            size - offs[i] < bytes)
            return conch_err_set(err, EPROTO, "warden: its plan's seccomp program is cut");
        progs[i].insns = (struct sock_filter *)(p + offs[i]);
        progs[i].len = (unsigned short)lens[i];
        set[i] = &progs[i];
    }
    plan->seccomp = set[0];
    plan->seccomp_file = set[1];
    plan->seccomp_js = set[2];
    plan->file_handler = (conch_jail_file_fn)fn_at(hdr->file_handler);
    plan->file_server = (conch_jail_file_serve_fn)fn_at(hdr->file_server);
    plan->js_server = (conch_jail_file_serve_fn)fn_at(hdr->js_server);
    plan->ctl_fd = JAIL_WARDEN_CTL_FD;
    *ret = plan;
    return 0;
}

void conch_jail_warden_entry(int argc, char **argv)
{
    if (argc != 3 || !argv[0] || strcmp(argv[0], JAIL_WARDEN_ARGV0) ||
        strcmp(argv[1], JAIL_WARDEN_PLAN_ARG))
        return;
    /* The title of the warden and of what it forks (conch-shepherd, conch-file-server) is
     * written over this argv. */
    conch_proctitle_init(argc, argv);
    /* An exec through an fd names us after the fd's number on older kernels. */
    prctl(PR_SET_NAME, "conch", 0, 0, 0);
    struct conch_err err = {0};
    struct jail_plan *plan = NULL;
    char *end;
    errno = 0;
    long fd = strtol(argv[2], &end, 10);
    int r = errno || *end || fd < 0 || fd > 1000
                ? conch_err_set(&err, EINVAL, "warden: bad plan fd '%s'", argv[2])
                : plan_load((int)fd, &plan, &err);
    if (r < 0) {
        /* To the parent waiting for our setup, if fd 3 is its control socket; else this was
         * run by hand. */
        int type = 0;
        socklen_t len = sizeof(type);
        if (getsockopt(JAIL_WARDEN_CTL_FD, SOL_SOCKET, SO_TYPE, &type, &len) == 0 &&
            type == SOCK_SEQPACKET) {
            struct jail_msg m;
            memset(&m, 0, sizeof(m));
            m.type = JMSG_SETUP_ERR;
            m.err = err;
            conch_jail_send(JAIL_WARDEN_CTL_FD, &m, NULL, 0);
        } else {
            fprintf(stderr, "conch-warden: %s (an entry point of conch's own, not a command)\n",
                    err.msg);
        }
        _exit(1);
    }
    conch_jail_warden_main(plan);
}
