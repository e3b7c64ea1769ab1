/* lease.c - `conch run` through a running daemon: borrow a sandbox the daemon built ahead of
 * need (its pool) with the workspace attached (sandbox.lease), drive it here exactly as a
 * sandbox of our own, and give it back (sandbox.release: the daemon makes it as new for its
 * pool). The connection stays open meanwhile: if we die, the daemon destroys the sandbox.
 * Any failure to borrow is silent: the caller builds its own sandbox. */
#include <jansson.h>
#include <poll.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "core/cleanup.h"
#include "core/clock.h"
#include "core/fdpass.h"
#include "core/fsutil.h"
#include "exec/run.h"
#include "rpc/rpc.h"

/* How long a daemon may take to answer before we build our own sandbox instead. A daemon
 * answers a lease from its loop in milliseconds; on a loaded machine (CI under ASan, three
 * test workers on two CPUs) it took more than 2 s, and a borrower that gave up then built a
 * sandbox of its own on the same loaded machine: the wait is for a daemon that hangs. */
#define LEASE_WAIT_MS 10000
#define LEASE_MAX_LINE 4096

static int daemon_fd = -1; /* the connection of the sandbox we borrowed */

/* The pool's sandboxes are the daemon's defaults: a command whose sandbox would differ in
 * anything but its workspace (mode overlay or ro, any disk size) builds its own; so does one
 * with path rules (a workspace attached to a lent sandbox gets none). */
static bool lease_fits(const struct conch_run_opts *o)
{
    struct conch_jail_spec def;
    conch_jail_spec_init(&def);
    const struct conch_jail_spec *s = &o->jail;
    return s->workspace && s->ws_mode != CONCH_WS_RW && !s->rootfs && !s->as_root && !o->tools &&
           !s->n_mounts && !s->n_rules && !s->n_sockets && s->net == CONCH_NET_NONE &&
           !s->limits.memory_bytes && !s->limits.pids_max && !s->limits.cpu_millicpus &&
           s->tmp_bytes == def.tmp_bytes && s->home_bytes == def.home_bytes;
}

/* Read the answer with the fd that came with it (into *@ret_fd, else -1), within the wait. */
static json_t *read_answer(int fd, int *ret_fd)
{
    struct conch_rpc_reader in = {.max = LEASE_MAX_LINE};
    uint64_t deadline = conch_clock_ms() + LEASE_WAIT_MS;
    json_t *msg = NULL;
    struct conch_err err = {0};
    while (conch_rpc_reader_next(&in, &msg, &err) == 0) {
        uint64_t now = conch_clock_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (now >= deadline || poll(&p, 1, (int)(deadline - now)) <= 0 ||
            conch_rpc_reader_fill(&in, fd, ret_fd) <= 0)
            break;
    }
    conch_rpc_reader_done(&in);
    return msg;
}

int conch_cli_lease(const struct conch_run_opts *o, const char *socket_path,
                    struct conch_jail **ret)
{
    *ret = NULL;
    struct stat st;
    if (!lease_fits(o) || stat(o->jail.workspace, &st) < 0)
        return 0;
    struct conch_err err = {0};
    _cleanup_close_ int fd = conch_cli_connect(socket_path, &err);
    if (fd < 0)
        return 0;
    json_t *params =
        json_pack("{s:s,s:s,s:I,s:I,s:I,s:I}", "workspace", o->jail.workspace, "mode",
                  conch_ws_mode_name(o->jail.ws_mode), "disk", (json_int_t)o->jail.disk_bytes,
                  "ws_dev", (json_int_t)st.st_dev, "ws_ino", (json_int_t)st.st_ino, "proto",
                  (json_int_t)conch_jail_proto_version());
    size_t n = 0;
    _cleanup_free_ char *line =
        params ? conch_rpc_request_line(1, "sandbox.lease", params, &n) : NULL;
    json_decref(params);
    if (!line || conch_send_all(fd, line, n) < 0)
        return 0;
    int ctl = -1;
    json_t *ans = read_answer(fd, &ctl);
    json_t *res = json_object_get(ans, "result");
    struct conch_jail_lease lease = {
        .warden_pid = (pid_t)json_integer_value(json_object_get(res, "warden_pid")),
        .upper_fd_nr = (int)json_integer_value(json_object_get(res, "upper_fd")),
        .root_mode = json_is_true(json_object_get(res, "root_mode")),
        .host_id_base = (uint32_t)json_integer_value(json_object_get(res, "host_id_base")),
    };
    json_decref(ans);
    if (!res || ctl < 0 || lease.warden_pid <= 0 || lease.root_mode != (geteuid() == 0)) {
        if (ctl >= 0)
            close(ctl);
        return 0;
    }
    if (conch_jail_adopt(&lease, ctl, o->jail.workspace, st.st_dev, st.st_ino, ret, &err) < 0)
        return 0;
    daemon_fd = TAKE_FD(fd);
    return 1;
}

void conch_cli_lease_end(bool clean)
{
    if (daemon_fd < 0)
        return;
    size_t n = 0;
    _cleanup_free_ char *release =
        clean ? conch_rpc_request_line(0, "sandbox.release", NULL, &n) : NULL;
    if (release)
        (void)!conch_send_all(daemon_fd, release, n);
    close(daemon_fd);
    daemon_fd = -1;
}
