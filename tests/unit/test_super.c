/* test_super.c - unit tests for src/super: the supervisor over a fake warden (the test plays
 * it on the other end of a socketpair). Every process object (command, file worker, file
 * server) gets exactly one final event, whatever happens; the warden's answers go to the
 * requests in order; nothing waits for the warden and no send fails because it is busy. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "jail/jail-internal.h"
#include "super/super.h"

struct rec {
    struct conch_proc proc;
    int ended;
    struct conch_proc_end end;
    int started;
};

static void on_started(struct conch_proc *p, pid_t pid)
{
    (void)pid;
    ((struct rec *)p->data)->started++;
}

static void on_ended(struct conch_proc *p, const struct conch_proc_end *end)
{
    struct rec *r = p->data;
    r->ended++;
    r->end = *end;
}

static const struct conch_proc_ops rec_ops = {.started = on_started, .ended = on_ended};

static void rec_init(struct rec *r)
{
    memset(r, 0, sizeof(*r));
    r->proc.ops = &rec_ops;
    r->proc.data = r;
}

struct ans {
    struct conch_super_req req;
    int done;
    int r;
    struct conch_err err;
    int order; /* when it was answered, among all */
};

static int answers_seen;

static void on_done(struct conch_super_req *q, int r, const struct conch_err *err)
{
    struct ans *a = q->data;
    a->done++;
    a->r = r;
    a->err = *err;
    a->order = ++answers_seen;
}

static void ans_init(struct ans *a)
{
    memset(a, 0, sizeof(*a));
    a->req.done = on_done;
    a->req.data = a;
}

/* A jail whose warden is the test, at *@ret_warden. */
static struct conch_jail *fake_jail(int *ret_warden)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct conch_jail *j = calloc(1, sizeof(*j));
    j->ctl_fd = sv[0];
    j->host_ws_fd = j->ptc_fd = j->pidfd = j->idmap_fd = j->upper_fd_nr = -1;
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    *ret_warden = sv[1];
    return j;
}

/* The warden reads one message: its type, id and how many fds came (closed). */
static struct jail_msg warden_read(int w, int *ret_nfds)
{
    struct jail_msg m;
    int fds[JAIL_MSG_MAX_FDS], nfds = 0;
    int r = conch_jail_recv(w, &m, fds, JAIL_MSG_MAX_FDS, &nfds, MSG_DONTWAIT);
    cr_assert_eq(r, 1, "the warden read nothing: %d", r);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    if (ret_nfds)
        *ret_nfds = nfds;
    return m;
}

static void warden_say(int w, struct jail_msg m, int fd)
{
    cr_assert_eq(conch_jail_send(w, &m, &fd, fd >= 0 ? 1 : 0), 0);
}

static int devnull(void)
{
    return open("/dev/null", O_RDWR | O_CLOEXEC);
}

Test(super, a_command_ends_once_and_a_duplicate_end_is_dropped)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    struct rec r;
    rec_init(&r);
    int dn = devnull();
    char *argv[] = {"true", NULL};
    struct conch_jail_cmd cmd = {.argv = argv, .stdin_fd = dn, .stdout_fd = dn, .stderr_fd = dn};
    struct conch_err err = {0};
    cr_assert_eq(conch_super_run(&s, &r.proc, &cmd, 0, 0, &err), 0, "%s", err.msg);
    int nfds;
    struct jail_msg m = warden_read(w, &nfds);
    cr_assert_eq(m.type, JMSG_RUN);
    cr_assert_eq(nfds, 4);
    /* a signal before the start is kept, then sent */
    conch_super_signal(&r.proc, SIGTERM);
    warden_say(w, (struct jail_msg){.type = JMSG_STARTED, .id = m.id, .a = 2}, -1);
    cr_assert_eq(conch_super_dispatch(&s), 1);
    cr_assert_eq(r.started, 1);
    struct jail_msg sig = warden_read(w, NULL);
    cr_assert_eq(sig.type, JMSG_SIGNAL);
    cr_assert_eq(sig.a, SIGTERM);
    warden_say(w, (struct jail_msg){.type = JMSG_EXITED, .id = m.id, .a = 3 << 8}, -1);
    warden_say(w, (struct jail_msg){.type = JMSG_EXITED, .id = m.id, .a = 9}, -1);
    cr_assert_eq(conch_super_dispatch(&s), 1);
    cr_assert_eq(r.ended, 1);
    cr_assert_eq(r.end.status, 3 << 8);
    cr_assert_not(r.end.lost);
    cr_assert_not(conch_proc_live(&r.proc));
    conch_super_done(&s, "test over");
    cr_assert_eq(r.ended, 1);
    close(dn);
    close(w);
    conch_jail_destroy(j);
}

Test(super, file_workers_and_servers_get_their_final_event)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    struct rec file, server, refused;
    rec_init(&file);
    rec_init(&server);
    rec_init(&refused);
    int dn = devnull();
    struct conch_err err = {0};
    cr_assert_eq(conch_super_file(&s, &file.proc, dn, dn, 1000, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_super_file_server(&s, &server.proc, dn, &err), 0, "%s", err.msg);
    cr_assert_eq(conch_super_file_server(&s, &refused.proc, dn, &err), 0, "%s", err.msg);
    int nfds;
    struct jail_msg mf = warden_read(w, &nfds);
    cr_assert_eq(mf.type, JMSG_FILE);
    cr_assert_eq(nfds, 2);
    cr_assert_eq(mf.timeout_ms, 1000);
    struct jail_msg ms = warden_read(w, &nfds);
    cr_assert_eq(ms.type, JMSG_FILE_SERVE);
    cr_assert_eq(nfds, 1);
    struct jail_msg mr = warden_read(w, &nfds);
    cr_assert_neq(mf.id, ms.id);
    cr_assert_neq(ms.id, mr.id);
    /* a file server is signalled at once: the warden forked it when it read its request */
    conch_super_signal(&server.proc, SIGKILL);
    struct jail_msg sig = warden_read(w, NULL);
    cr_assert_eq(sig.type, JMSG_SIGNAL);
    cr_assert_eq(sig.id, ms.id);
    cr_assert_eq(sig.a, SIGKILL);
    /* killed by its deadline; killed from outside; refused */
    warden_say(
        w, (struct jail_msg){.type = JMSG_EXITED, .id = mf.id, .a = SIGKILL, .b = JEXIT_TIMED_OUT},
        -1);
    warden_say(w, (struct jail_msg){.type = JMSG_EXITED, .id = ms.id, .a = SIGKILL}, -1);
    struct jail_msg no = {.type = JMSG_RUN_ERR, .id = mr.id};
    conch_err_set(&no.err, EAGAIN, "too many requests");
    warden_say(w, no, -1);
    cr_assert_eq(conch_super_dispatch(&s), 1);
    cr_assert_eq(file.ended, 1);
    cr_assert(file.end.timed_out);
    cr_assert_eq(file.end.status, SIGKILL);
    cr_assert_eq(server.ended, 1);
    cr_assert_not(server.end.lost);
    cr_assert_eq(server.end.status, SIGKILL);
    cr_assert_eq(refused.ended, 1);
    cr_assert(refused.end.start_failed);
    cr_assert_str_eq(refused.end.err.msg, "too many requests");
    cr_assert_null(s.live);
    close(dn);
    close(w);
    conch_jail_destroy(j);
}

Test(super, the_warden_gone_ends_every_process_and_fails_every_request)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    struct rec file, server, cmd_rec;
    rec_init(&file);
    rec_init(&server);
    rec_init(&cmd_rec);
    int dn = devnull();
    struct conch_err err = {0};
    char *argv[] = {"sleep", "9", NULL};
    struct conch_jail_cmd cmd = {.argv = argv, .stdin_fd = dn, .stdout_fd = dn, .stderr_fd = dn};
    cr_assert_eq(conch_super_run(&s, &cmd_rec.proc, &cmd, 0, 0, &err), 0);
    cr_assert_eq(conch_super_file(&s, &file.proc, dn, dn, 0, &err), 0);
    cr_assert_eq(conch_super_file_server(&s, &server.proc, dn, &err), 0);
    struct ans recycle;
    ans_init(&recycle);
    cr_assert_eq(conch_super_recycle(&s, &recycle.req, &err), 0);
    cr_assert(conch_super_req_pending(&recycle.req));
    close(w); /* the warden dies */
    cr_assert_eq(conch_super_dispatch(&s), 0);
    struct rec *all[] = {&file, &server, &cmd_rec};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(all[i]->ended, 1, "process %d ended %d times", i, all[i]->ended);
        cr_assert(all[i]->end.lost);
        cr_assert_str_eq(all[i]->end.why, "the sandbox's warden died");
    }
    cr_assert_eq(recycle.done, 1);
    cr_assert_lt(recycle.r, 0);
    cr_assert(strstr(recycle.err.msg, "warden died"), "%s", recycle.err.msg);
    cr_assert_not(conch_super_req_pending(&recycle.req));
    /* and nothing more starts, nothing is called twice */
    struct rec late;
    rec_init(&late);
    cr_assert_lt(conch_super_file_server(&s, &late.proc, dn, &err), 0);
    conch_super_done(&s, "stopped");
    cr_assert_eq(file.ended + server.ended + cmd_rec.ended + recycle.done, 4);
    close(dn);
    conch_jail_destroy(j);
}

Test(super, done_ends_every_process_and_fails_every_request_once)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    struct rec server;
    rec_init(&server);
    int dn = devnull();
    struct conch_err err = {0};
    cr_assert_eq(conch_super_file_server(&s, &server.proc, dn, &err), 0);
    struct ans setup;
    ans_init(&setup);
    conch_super_await_setup(&s, &setup.req);
    conch_super_done(&s, "the sandbox was destroyed");
    conch_super_done(&s, "again");
    cr_assert_eq(server.ended, 1);
    cr_assert(server.end.lost);
    cr_assert_str_eq(server.end.why, "the sandbox was destroyed");
    cr_assert_eq(setup.done, 1);
    cr_assert_lt(setup.r, 0);
    cr_assert_str_eq(setup.err.msg, "the sandbox was destroyed");
    cr_assert_eq(conch_super_dispatch(&s), -1);
    close(dn);
    close(w);
    conch_jail_destroy(j);
}

Test(super, answers_go_to_the_requests_in_order_between_events)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    answers_seen = 0;
    struct ans setup, recycle, attach;
    ans_init(&setup);
    ans_init(&recycle);
    ans_init(&attach);
    conch_super_await_setup(&s, &setup.req);
    struct conch_err err = {0};
    cr_assert_eq(conch_super_recycle(&s, &recycle.req, &err), 0);
    char dir[] = "/tmp/test_super.XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(conch_super_attach(&s, &attach.req, dir, 0, 0, CONCH_WS_RO, 0, &err), 0, "%s",
                 err.msg);
    struct rec r;
    rec_init(&r);
    int dn = devnull();
    cr_assert_eq(conch_super_file(&s, &r.proc, dn, dn, 0, &err), 0);
    cr_assert_eq(warden_read(w, NULL).type, JMSG_RECYCLE);
    cr_assert_eq(warden_read(w, NULL).type, JMSG_ATTACH);
    struct jail_msg mf = warden_read(w, NULL);
    /* the setup's answer carries the tool bridge's socket */
    int ptc = devnull();
    warden_say(w, (struct jail_msg){.type = JMSG_SETUP_OK, .a = 7}, ptc);
    close(ptc);
    warden_say(w, (struct jail_msg){.type = JMSG_EXITED, .id = mf.id}, -1);
    warden_say(w, (struct jail_msg){.type = JMSG_SETUP_OK, .a = -1}, -1);
    struct jail_msg no = {.type = JMSG_SETUP_ERR};
    conch_err_set(&no.err, ESTALE, "workspace changed");
    warden_say(w, no, -1);
    cr_assert_eq(conch_super_dispatch(&s), 1);
    cr_assert_eq(setup.done, 1);
    cr_assert_eq(setup.r, 0);
    cr_assert_eq(setup.order, 1);
    cr_assert_eq(r.ended, 1);
    cr_assert_eq(recycle.done, 1);
    cr_assert_eq(recycle.r, 0);
    cr_assert_eq(recycle.order, 2);
    cr_assert_eq(attach.done, 1);
    cr_assert_eq(attach.r, -ESTALE);
    cr_assert_eq(attach.order, 3);
    cr_assert_str_eq(attach.err.msg, "workspace changed");
    /* the setup's socket is the jail's now */
    int got = conch_jail_take_ptc_fd(j);
    cr_assert_geq(got, 0);
    close(got);
    /* an answer nobody asked for is dropped */
    warden_say(w, (struct jail_msg){.type = JMSG_SETUP_OK, .a = -1}, -1);
    cr_assert_eq(conch_super_dispatch(&s), 1);
    conch_super_done(&s, "over");
    rmdir(dir);
    close(dn);
    close(w);
    conch_jail_destroy(j);
}

static struct conch_super *stop_me;

static void stop_on_end(struct conch_proc *p, const struct conch_proc_end *end)
{
    on_ended(p, end);
    conch_super_done(stop_me, "stopped by a callback");
}

Test(super, a_callback_that_stops_supervision_ends_the_dispatch)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    stop_me = &s;
    static const struct conch_proc_ops stopping = {.ended = stop_on_end};
    struct rec a, b;
    rec_init(&a);
    rec_init(&b);
    a.proc.ops = &stopping;
    int dn = devnull();
    struct conch_err err = {0};
    cr_assert_eq(conch_super_file(&s, &a.proc, dn, dn, 0, &err), 0);
    cr_assert_eq(conch_super_file(&s, &b.proc, dn, dn, 0, &err), 0);
    struct jail_msg ma = warden_read(w, NULL);
    warden_read(w, NULL);
    warden_say(w, (struct jail_msg){.type = JMSG_EXITED, .id = ma.id}, -1);
    close(w); /* and the warden's EOF after it: not read once supervision stopped */
    cr_assert_eq(conch_super_dispatch(&s), -1);
    cr_assert_eq(a.ended, 1);
    cr_assert_eq(b.ended, 1);
    cr_assert_str_eq(b.end.why, "stopped by a callback");
    close(dn);
    conch_jail_destroy(j);
}

Test(super, a_full_socket_queues_file_requests_and_each_gets_its_end)
{
    int w;
    struct conch_jail *j = fake_jail(&w);
    struct conch_super s;
    conch_super_init(&s, j);
    enum { N = 600 };
    struct rec *recs = calloc(N, sizeof(*recs));
    int dn = devnull();
    struct conch_err err = {0};
    for (int i = 0; i < N; i++) {
        rec_init(&recs[i]);
        int r = i % 2 ? conch_super_file(&s, &recs[i].proc, dn, dn, 0, &err)
                      : conch_super_file_server(&s, &recs[i].proc, dn, &err);
        cr_assert_eq(r, 0, "request %d: %s", i, err.msg);
    }
    /* the socket took only so many: the rest wait, none was refused */
    cr_assert(conch_super_wants_write(&s));
    int seen = 0;
    int64_t last = 0;
    while (seen < N) {
        struct jail_msg m;
        int fds[JAIL_MSG_MAX_FDS], nfds = 0;
        int r = conch_jail_recv(w, &m, fds, JAIL_MSG_MAX_FDS, &nfds, MSG_DONTWAIT);
        if (r == -EAGAIN) {
            cr_assert_eq(conch_super_flush(&s), 1);
            continue;
        }
        cr_assert_eq(r, 1);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        cr_assert_gt(m.id, last, "out of order");
        last = m.id;
        seen++;
        warden_say(w, (struct jail_msg){.type = JMSG_EXITED, .id = m.id}, -1);
        if (seen % 50 == 0)
            cr_assert_eq(conch_super_dispatch(&s), 1);
    }
    cr_assert_eq(conch_super_dispatch(&s), 1);
    cr_assert_not(conch_super_wants_write(&s));
    for (int i = 0; i < N; i++)
        cr_assert_eq(recs[i].ended, 1, "request %d ended %d times", i, recs[i].ended);
    cr_assert_null(s.live);
    free(recs);
    close(dn);
    close(w);
    conch_jail_destroy(j);
}
