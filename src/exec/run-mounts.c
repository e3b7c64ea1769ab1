/* run-mounts.c - conch run's overlay and store mounts (issue 18): an overlay mount's upper
 * lives in the sandbox's detached tmpfs beside the workspace's and its changes are read and
 * committed as the workspace's are; a store mount's view is a private host dir filled from the
 * store before the sandbox starts and written back, in one transaction, after it is gone, by
 * the same code the daemon uses (workspace/store-sync.c). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/clock.h"
#include "core/fsutil.h"
#include "exec/exec-internal.h"

/* The views' dir: <view_dir>/run-XXXXXX, made on the first store mount. */
static int make_run_dir(struct conch_run_mounts *m, const char *view_dir, struct conch_err *err)
{
    if (m->run_dir[0])
        return 0;
    int n = snprintf(m->run_dir, sizeof(m->run_dir), "%s/run-XXXXXX", view_dir);
    if (n < 0 || (size_t)n >= sizeof(m->run_dir)) {
        m->run_dir[0] = '\0';
        return conch_err_set(err, ENAMETOOLONG, "store views: path too long");
    }
    if (!mkdtemp(m->run_dir)) {
        int e = errno;
        m->run_dir[0] = '\0';
        return conch_err_set(err, e, "store views: mkdtemp in '%s': %s", view_dir, strerror(e));
    }
    return 0;
}

static int prepare_store(struct conch_run_mounts *m, unsigned i, const struct conch_run_opts *o,
                         struct conch_err *err)
{
    struct conch_mount *mt = &m->mounts[i];
    if (!o->store_dir || !o->view_dir)
        return conch_err_setk(err, CONCH_ERR_USAGE, EOPNOTSUPP,
                              "mount '%s': no state directory for stores", mt->target);
    int r = make_run_dir(m, o->view_dir, err);
    if (r < 0)
        return r;
    char dir[sizeof(m->run_dir) + 16], writer[64];
    snprintf(dir, sizeof(dir), "%s/s%u", m->run_dir, i);
    snprintf(writer, sizeof(writer), "conch-run-%ld", (long)getpid());
    if ((r = conch_store_view_new(o->store_dir, mt->name, mt->bytes, dir, writer, &m->views[i],
                                  err)) < 0 ||
        (r = conch_store_view_materialise(m->views[i], err)) < 0)
        return conch_err_wrap(err, "mount '%s' (store '%s')", mt->target, mt->name);
    if (strlen(dir) >= sizeof(mt->source))
        return conch_err_set(err, ENAMETOOLONG, "mount '%s': view path too long", mt->target);
    snprintf(mt->source, sizeof(mt->source), "%s", dir);
    return 0;
}

int conch_run_mounts_prepare(struct conch_run_mounts *m, const struct conch_run_opts *o,
                             struct conch_err *err)
{
    memset(m, 0, sizeof(*m));
    for (unsigned i = 0; i < CONCH_SPEC_MOUNTS_MAX; i++)
        m->lower[i] = -1;
    if (o->jail.n_mounts > CONCH_SPEC_MOUNTS_MAX)
        return conch_err_set(err, E2BIG, "at most %d mounts", CONCH_SPEC_MOUNTS_MAX);
    m->n = o->jail.n_mounts;
    m->orig = o->jail.mounts;
    for (unsigned i = 0; i < m->n; i++) {
        struct conch_mount *mt = &m->mounts[i];
        *mt = o->jail.mounts[i];
        int r = 0;
        if (mt->type == CONCH_MOUNT_OVERLAY) {
            /* The dir its changes are compared with and committed to: the one named now (the
             * jail checks that what it mounts is this very dir, as for a bind). */
            m->lower[i] = open(mt->source, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (m->lower[i] < 0)
                r = conch_err_setk(err, CONCH_ERR_USAGE, errno, "mount '%s': source '%s': %s",
                                   mt->target, mt->source, strerror(errno));
        } else if (mt->type == CONCH_MOUNT_STORE) {
            r = prepare_store(m, i, o, err);
        }
        if (r < 0)
            return r;
    }
    return 0;
}

static void mount_changes(struct conch_run_mounts *m, unsigned i, struct conch_jail *jail,
                          bool commit, uint64_t max_bytes, struct conch_run_mount_result *mr)
{
    _cleanup_close_ int upper = conch_jail_mount_upper_open(jail, i, &mr->commit_err);
    if (upper < 0 || conch_ws_changes_scan(upper, m->lower[i], &mr->changes, &mr->commit_err) < 0) {
        conch_err_wrap(&mr->commit_err, "read the changes of mount '%s'", mr->target);
        return;
    }
    mr->has_changes = true;
    if (!commit || mr->changes.n == 0)
        return;
    struct conch_ws_commit_opts copts = {
        .new_uid = (uid_t)-1, .new_gid = (gid_t)-1, .max_bytes = max_bytes};
    mr->commit_tried = true;
    if (conch_ws_commit(upper, m->lower[i], &mr->changes, &copts, &mr->commit, &mr->commit_err) < 0)
        conch_err_wrap(&mr->commit_err, "commit the changes of mount '%s'", mr->target);
    else
        mr->committed = true;
}

void conch_run_mounts_changes(struct conch_run_mounts *m, struct conch_jail *jail, bool commit,
                              uint64_t max_bytes, struct conch_run_result *res)
{
    for (unsigned i = 0; i < m->n; i++) {
        if (m->mounts[i].type != CONCH_MOUNT_OVERLAY || res->n_mounts >= CONCH_SPEC_MOUNTS_MAX)
            continue;
        struct conch_run_mount_result *mr = &res->mounts[res->n_mounts++];
        mr->target = m->orig[i].target;
        mount_changes(m, i, jail, commit, max_bytes, mr);
    }
}

#define MEASURE_EVERY_MS 250
#define INODE_COST 4096

bool conch_run_mounts_views_over(struct conch_run_mounts *m, uint64_t limit)
{
    uint64_t now = conch_clock_ms();
    if (!m->run_dir[0] || now < m->next_measure_ms)
        return false;
    int fd = open(m->run_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    uint64_t bytes = 0, inodes = 0;
    bool whole = fd >= 0 && conch_ws_dir_usage(fd, &bytes, &inodes); /* takes @fd */
    uint64_t took = conch_clock_ms() - now;
    m->next_measure_ms =
        conch_clock_ms() + (took * 2 > MEASURE_EVERY_MS ? took * 2 : MEASURE_EVERY_MS);
    if (fd >= 0 && !whole)
        return true; /* too deep to walk: counted as full, as the daemon does */
    return bytes > limit || inodes > (limit - bytes) / INODE_COST;
}

void conch_run_mounts_sync(struct conch_run_mounts *m, struct conch_run_result *res)
{
    for (unsigned i = 0; i < m->n; i++) {
        if (!m->views[i] || res->n_stores >= CONCH_SPEC_MOUNTS_MAX)
            continue;
        struct conch_run_store_result *sr = &res->stores[res->n_stores++];
        sr->name = m->orig[i].name;
        sr->target = m->orig[i].target;
        if (conch_store_view_sync(m->views[i], &sr->rep, &sr->err) < 0)
            conch_err_wrap(&sr->err, "write back store '%s' (mount '%s')", sr->name, sr->target);
    }
}

void conch_run_mounts_done(struct conch_run_mounts *m)
{
    for (unsigned i = 0; i < m->n && i < CONCH_SPEC_MOUNTS_MAX; i++) {
        if (m->lower[i] >= 0)
            close(m->lower[i]);
        m->lower[i] = -1;
        conch_store_view_free(m->views[i]);
        m->views[i] = NULL;
    }
    if (m->run_dir[0])
        conch_rm_path(m->run_dir, 0);
    m->run_dir[0] = '\0';
    m->n = 0;
}
