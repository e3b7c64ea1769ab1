/* test_ctlq.c - unit tests for src/jail/ctlq.c: sends to a warden whose control socket is
 * full wait in order in a bounded queue, and reach it as soon as there is room. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "jail/jail-internal.h"

static int queued_calls;

static void count_queued(void *data)
{
    (void)data;
    queued_calls++;
}

/* Read every message waiting on @fd; check ids follow *@next_id. Returns how many. */
static int drain(int fd, int64_t *next_id)
{
    int n = 0;
    for (;;) {
        struct jail_msg m;
        int fds[JAIL_MSG_MAX_FDS], nfds = 0;
        int r = conch_jail_recv(fd, &m, fds, JAIL_MSG_MAX_FDS, &nfds, MSG_DONTWAIT);
        if (r == -EAGAIN)
            return n;
        cr_assert_eq(r, 1, "recv: %d", r);
        cr_assert_eq(m.id, *next_id, "message %lld came as %lld", (long long)*next_id,
                     (long long)m.id);
        cr_assert_eq(nfds, 1, "message %lld came with %d fds", (long long)m.id, nfds);
        cr_assert_geq(fcntl(fds[0], F_GETFD), 0);
        close(fds[0]);
        (*next_id)++;
        n++;
    }
}

Test(ctlq, a_full_socket_queues_in_order_up_to_the_cap)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct conch_jail *j = calloc(1, sizeof(*j));
    j->ctl_fd = sv[0];
    conch_jail_on_queued(j, count_queued, NULL);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int64_t id = 1;
    /* fill the socket and the queue: the sends never fail until the cap */
    int r = 0;
    for (; id < 5000 && r == 0; id++) {
        struct jail_msg m = {.type = JMSG_SIGNAL, .id = id};
        r = conch_jail_ctl_send(j, &m, &devnull, 1);
    }
    cr_assert_eq(r, -ENOBUFS, "send %lld: %d", (long long)id - 1, r);
    cr_assert_eq(j->outq_len, JAIL_OUTQ_MAX);
    cr_assert(conch_jail_wants_write(j));
    cr_assert_eq(queued_calls, 1);
    int64_t sent = id - 2; /* the last one was refused */
    /* the warden reads; each flush sends what fits, in order */
    struct conch_err err = {0};
    int64_t next = 1;
    int64_t got = 0;
    while (conch_jail_wants_write(j)) {
        got += drain(sv[1], &next);
        r = conch_jail_flush(j, &err);
        cr_assert_geq(r, 0, "%s", err.msg);
    }
    got += drain(sv[1], &next);
    cr_assert_eq(got, sent);
    /* with room again, a send goes straight out */
    struct jail_msg m = {.type = JMSG_SIGNAL, .id = next};
    cr_assert_eq(conch_jail_ctl_send(j, &m, &devnull, 1), 0);
    cr_assert_not(conch_jail_wants_write(j));
    cr_assert_eq(drain(sv[1], &next), 1);
    /* a warden gone: the queue is dropped with an error */
    for (int i = 0; i < 5000 && !conch_jail_wants_write(j); i++) {
        struct jail_msg m2 = {.type = JMSG_SIGNAL, .id = next + i};
        cr_assert_eq(conch_jail_ctl_send(j, &m2, &devnull, 1), 0);
    }
    cr_assert(conch_jail_wants_write(j));
    close(sv[1]);
    cr_assert_lt(conch_jail_flush(j, &err), 0);
    cr_assert_not(conch_jail_wants_write(j));
    conch_jail_ctl_queue_clear(j);
    close(sv[0]);
    close(devnull);
    free(j);
}
