/* ids.c - claiming a host id block per sandbox (host root only): the candidate blocks of
 * systemd's container range, minus every block that a subordinate id range, a user or a
 * group of the host touches, each guarded by an flock on its own lock file. */
#include "jail/ids.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"

#define N_BLOCKS ((CONCH_HOST_ID_END - CONCH_HOST_ID_FIRST) / CONCH_HOST_ID_COUNT)
/* Largest /etc file read (a big passwd is a few MiB). */
#define MAX_ETC_FILE (64u << 20)

void conch_jail_ids_init(struct conch_jail_ids *ids)
{
    ids->base = 0;
    ids->lock_fd = -1;
}

void conch_jail_ids_release(struct conch_jail_ids *ids)
{
    /* A zeroed struct (base 0) holds nothing: its fd 0 is not ours. */
    if (ids->base != 0 && ids->lock_fd >= 0)
        close(ids->lock_fd);
    conch_jail_ids_init(ids);
}

/* A decimal field [@s, @e) as a number; false if it is not one. */
static bool parse_num(const char *s, const char *e, uint64_t *ret)
{
    if (s == e || e - s > 19)
        return false;
    uint64_t v = 0;
    for (const char *p = s; p < e; p++) {
        if (*p < '0' || *p > '9')
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *ret = v;
    return true;
}

/* The colon-separated field @idx of the line [@s, @e), as a number. */
static bool field_num(const char *s, const char *e, int idx, uint64_t *ret)
{
    for (int i = 0; i < idx; i++) {
        const char *c = memchr(s, ':', (size_t)(e - s));
        if (!c)
            return false;
        s = c + 1;
    }
    const char *c = memchr(s, ':', (size_t)(e - s));
    return parse_num(s, c ? c : e, ret);
}

enum etc_kind { SUBID, PASSWD, GROUP };

/* Calls @fn for each id range that a line of @text (of @kind) names. */
static void for_each_range(const char *text, enum etc_kind kind,
                           void (*fn)(uint64_t start, uint64_t count, void *arg), void *arg)
{
    for (const char *s = text; *s;) {
        const char *e = strchr(s, '\n');
        if (!e)
            e = s + strlen(s);
        uint64_t a, b;
        if (*s != '#') {
            switch (kind) {
            case SUBID:
                if (field_num(s, e, 1, &a) && field_num(s, e, 2, &b))
                    fn(a, b, arg);
                break;
            case PASSWD:
                if (field_num(s, e, 2, &a))
                    fn(a, 1, arg);
                if (field_num(s, e, 3, &b))
                    fn(b, 1, arg);
                break;
            case GROUP:
                if (field_num(s, e, 2, &a))
                    fn(a, 1, arg);
                break;
            }
        }
        s = *e ? e + 1 : e;
    }
}

struct overlap {
    uint64_t start, end;
    bool hit;
};

static void check_overlap(uint64_t start, uint64_t count, void *arg)
{
    struct overlap *o = arg;
    if (count > 0 && start < o->end && start + count > o->start)
        o->hit = true;
}

bool conch_jail_ids_subid_overlaps(const char *text, uint64_t start, uint64_t count)
{
    struct overlap o = {.start = start, .end = start + count};
    if (count > 0)
        for_each_range(text, SUBID, check_overlap, &o);
    return o.hit;
}

/* Marks in the bitmap @arg every candidate block that [start, start+count) touches. */
static void mark_blocks(uint64_t start, uint64_t count, void *arg)
{
    uint8_t *taken = arg;
    uint64_t end = start + count;
    if (count == 0 || end <= CONCH_HOST_ID_FIRST || start >= CONCH_HOST_ID_END)
        return;
    if (start < CONCH_HOST_ID_FIRST)
        start = CONCH_HOST_ID_FIRST;
    if (end > CONCH_HOST_ID_END)
        end = CONCH_HOST_ID_END;
    for (uint64_t i = (start - CONCH_HOST_ID_FIRST) / CONCH_HOST_ID_COUNT;
         i <= (end - 1 - CONCH_HOST_ID_FIRST) / CONCH_HOST_ID_COUNT; i++)
        taken[i / 8] |= (uint8_t)(1u << (i % 8));
}

static int exclude_file(const char *etc_dir, const char *name, enum etc_kind kind, uint8_t *taken,
                        struct conch_err *err)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", etc_dir, name);
    _cleanup_free_ char *text = NULL;
    struct conch_err e = {0};
    int r = conch_read_file(path, MAX_ETC_FILE, &text, NULL, &e);
    if (r == -ENOENT)
        return 0;
    /* Fail closed: a range we could not read might be a user's. */
    if (r < 0) {
        *err = e;
        return conch_err_wrap(err, "read the host's id ranges");
    }
    for_each_range(text, kind, mark_blocks, taken);
    return 0;
}

/* Opens (creating it 0700 if missing) the lock dir, which must be ours and not writable by
 * anyone else: whoever could write there could plant or remove lock files. */
static int open_lock_dir(const char *dir, struct conch_err *err)
{
    int r;
    _cleanup_free_ char *parent = strdup(dir);
    if (!parent)
        return conch_err_set(err, ENOMEM, "out of memory");
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if ((r = conch_mkdir_p(parent, 0755, err)) < 0)
            return r;
    }
    if (mkdir(dir, 0700) < 0 && errno != EEXIST)
        return conch_err_set(err, errno, "mkdir '%s': %s", dir, strerror(errno));
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return conch_err_set(err, errno, "open '%s': %s (it must be a directory, not a link)", dir,
                             strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        r = conch_err_set(err, errno, "stat '%s': %s", dir, strerror(errno));
        close(fd);
        return r;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        close(fd);
        return conch_err_set(err, EPERM,
                             "host id lock dir '%s' is owned by uid %u with mode %04o: it must "
                             "be owned by uid %u and writable by no one else (remove it and "
                             "retry)",
                             dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                             (unsigned)geteuid());
    }
    return fd;
}

/* Claim a free block (@want 0: any, looking from block @start on, round the range; else
 * exactly the block at @want). */
static int claim(const char *lock_dir, const char *etc_dir, uint32_t want, uint32_t start,
                 struct conch_jail_ids *ret, struct conch_err *err)
{
    int r;
    uint8_t taken[(N_BLOCKS + 7) / 8];
    memset(taken, 0, sizeof(taken));
    if ((r = exclude_file(etc_dir, "subuid", SUBID, taken, err)) < 0 ||
        (r = exclude_file(etc_dir, "subgid", SUBID, taken, err)) < 0 ||
        (r = exclude_file(etc_dir, "passwd", PASSWD, taken, err)) < 0 ||
        (r = exclude_file(etc_dir, "group", GROUP, taken, err)) < 0)
        return r;
    _cleanup_close_ int dfd = open_lock_dir(lock_dir, err);
    if (dfd < 0)
        return dfd;
    for (uint32_t n = 0; n < N_BLOCKS; n++) {
        uint32_t i = (start + n) % N_BLOCKS;
        if (taken[i / 8] & (1u << (i % 8)))
            continue;
        uint32_t base = CONCH_HOST_ID_FIRST + i * CONCH_HOST_ID_COUNT;
        if (want && base != want)
            continue;
        char name[16];
        snprintf(name, sizeof(name), "%u", base);
        _cleanup_close_ int fd =
            openat(dfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
        if (fd < 0)
            return conch_err_set(err, errno, "open host id lock '%s/%s': %s", lock_dir, name,
                                 strerror(errno));
        struct stat st;
        if (fstat(fd, &st) < 0)
            return conch_err_set(err, errno, "stat host id lock '%s/%s': %s", lock_dir, name,
                                 strerror(errno));
        if (!S_ISREG(st.st_mode))
            continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            ret->base = base;
            ret->lock_fd = TAKE_FD(fd);
            return 0;
        }
        if (errno != EWOULDBLOCK && errno != EINTR)
            return conch_err_set(err, errno, "lock host id block '%s/%s': %s", lock_dir, name,
                                 strerror(errno));
    }
    if (want)
        return conch_err_setk(err, CONCH_ERR_LIMIT, EBUSY,
                              "host id block %u is claimed by another sandbox, or no longer "
                              "free (/etc/subuid, /etc/subgid, a user or a group overlaps it)",
                              want);
    return conch_err_setk(err, CONCH_ERR_LIMIT, ENOSPC,
                          "no free block of %u host ids in %u..%u (every block is claimed by a "
                          "running sandbox or overlaps /etc/subuid, /etc/subgid, a user or a "
                          "group)",
                          CONCH_HOST_ID_COUNT, CONCH_HOST_ID_FIRST, CONCH_HOST_ID_END - 1);
}

int conch_jail_ids_claim_in(const char *lock_dir, const char *etc_dir, struct conch_jail_ids *ret,
                            struct conch_err *err)
{
    return claim(lock_dir, etc_dir, 0, 0, ret, err);
}

/* The search for a free block starts at a random one. From the first, a block given back was
 * the next one claimed, by anyone: a daemon restarting (its stopped sandboxes' blocks free
 * between its predecessor's exit and its recovery) found its sandbox's block taken by another
 * daemon's new sandbox, and that sandbox could not be started again (its files' owners). With
 * ~28,000 blocks, a random start makes that a matter of chance a few in 10^4 per claim made
 * in that window, not of course. */
int conch_jail_ids_claim(struct conch_jail_ids *ret, struct conch_err *err)
{
    uint32_t start;
    if (getrandom(&start, sizeof(start), GRND_NONBLOCK) != (ssize_t)sizeof(start))
        start = (uint32_t)getpid() * 2654435761u ^ (uint32_t)time(NULL);
    return claim(CONCH_HOST_ID_LOCK_DIR, "/etc", 0, start % N_BLOCKS, ret, err);
}

int conch_jail_ids_claim_base(uint32_t base, struct conch_jail_ids *ret, struct conch_err *err)
{
    if (base < CONCH_HOST_ID_FIRST || base >= CONCH_HOST_ID_END ||
        (base - CONCH_HOST_ID_FIRST) % CONCH_HOST_ID_COUNT)
        return conch_err_set(err, EINVAL, "%u is not the base of a host id block", base);
    return claim(CONCH_HOST_ID_LOCK_DIR, "/etc", base, 0, ret, err);
}
