/* test_relay.c - the proxy's splice relay (net/relay.c) between two real loopback TCP
 * connections: bytes each way whole and counted, a half-close passed on, a side that never
 * reads bounding what the pipes hold (and the budget charged for it), a full budget, a reset. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/relay.h"

/* A connected loopback TCP pair: *@a the connecting end, *@b the accepted one; both
 * non-blocking. */
static void tcp_pair(int *a, int *b)
{
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    cr_assert(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(l, 1) == 0);
    cr_assert(getsockname(l, (struct sockaddr *)&sa, &len) == 0);
    *a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(connect(*a, (struct sockaddr *)&sa, sizeof(sa)) == 0, "%s", strerror(errno));
    *b = accept4(l, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    cr_assert(*b >= 0);
    fcntl(*a, F_SETFL, O_NONBLOCK);
    close(l);
}

struct fixture {
    uv_loop_t loop;
    struct conch_budget budget;
    struct conch_net_relay relay;
    int app, remote; /* the sandbox's end, the remote server's end */
    size_t counted[2];
    bool done;
    char error[160];
    int closed;
};

static void on_bytes(void *ctx, int side, size_t n)
{
    struct fixture *f = ctx;
    f->counted[side] += n;
}

static void on_done(void *ctx, const char *error)
{
    struct fixture *f = ctx;
    f->done = true;
    snprintf(f->error, sizeof(f->error), "%s", error ? error : "");
}

static const struct conch_net_relay_ops ops = {.bytes = on_bytes, .done = on_done};

static void on_closed(uv_handle_t *h)
{
    struct fixture *f = h->data;
    f->closed++;
}

static void setup(struct fixture *f, uint64_t cap)
{
    memset(f, 0, sizeof(*f));
    cr_assert(uv_loop_init(&f->loop) == 0);
    conch_budget_init(&f->budget, "test", cap, NULL);
    int x, y;
    tcp_pair(&f->app, &x);
    tcp_pair(&y, &f->remote);
    struct conch_err err = {0};
    cr_assert(
        conch_net_relay_start(&f->relay, &f->loop, x, y, 256 << 10, &f->budget, &ops, f, &err) == 0,
        "%s", err.msg);
    cr_assert(f->relay.polls == 2);
}

static void teardown(struct fixture *f)
{
    conch_net_relay_close(&f->relay, on_closed);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    cr_assert_eq(f->closed, 2);
    cr_assert_eq(conch_budget_held(&f->budget), 0, "everything held is uncharged");
    cr_assert(uv_loop_close(&f->loop) == 0);
    close(f->app);
    if (f->remote >= 0)
        close(f->remote);
}

static void spin(struct fixture *f, int rounds)
{
    for (int i = 0; i < rounds && !f->done; i++)
        uv_run(&f->loop, UV_RUN_NOWAIT);
}

/* Send @n bytes of @c from @from (then shut it down for writing when @shut) while reading @to
 * (to its EOF when @shut, else to @n bytes); returns what @to read, -1 if it saw no EOF. */
static ssize_t transfer(struct fixture *f, int from, int to, size_t n, char c, bool shut)
{
    static char buf[1 << 16];
    size_t sent = 0, got = 0;
    bool eof = false;
    for (int guard = 0; guard < 1000000 && !eof; guard++) {
        if (sent < n) {
            memset(buf, c, sizeof(buf));
            size_t k = n - sent < sizeof(buf) ? n - sent : sizeof(buf);
            ssize_t w = write(from, buf, k);
            if (w > 0)
                sent += (size_t)w;
            if (sent == n && shut)
                shutdown(from, SHUT_WR);
        }
        uv_run(&f->loop, UV_RUN_NOWAIT);
        ssize_t r = read(to, buf, sizeof(buf));
        if (r > 0) {
            for (ssize_t i = 0; i < r; i++)
                cr_assert_eq(buf[i], c);
            got += (size_t)r;
        } else if (r == 0) {
            eof = true;
        }
        if (!shut && got == n)
            break;
    }
    return shut && !eof ? -1 : (ssize_t)got;
}

Test(relay, bytes_each_way_whole_counted_and_half_closed)
{
    struct fixture f;
    setup(&f, UINT64_MAX);
    /* up: the sandbox sends 3 MiB and half-closes; the remote sees them, then EOF */
    cr_assert_eq(transfer(&f, f.app, f.remote, 3 << 20, 'u', true), 3 << 20, "and an EOF");
    /* down: the remote answers 5 MiB and closes; the sandbox gets them, then EOF */
    cr_assert_eq(transfer(&f, f.remote, f.app, 5 << 20, 'd', true), 5 << 20, "and an EOF");
    spin(&f, 1000);
    cr_assert(f.done, "both sides sent FIN: the relay is over");
    cr_assert_str_eq(f.error, "");
    cr_assert_eq(f.counted[0], 3 << 20);
    cr_assert_eq(f.counted[1], 5 << 20);
    teardown(&f);
}

Test(relay, a_side_that_never_reads_stops_the_other)
{
    struct fixture f;
    setup(&f, UINT64_MAX);
    /* the remote writes as fast as it can; the sandbox reads nothing */
    static char buf[1 << 16];
    memset(buf, 'x', sizeof(buf));
    size_t sent = 0;
    for (int idle = 0; idle < 200;) {
        ssize_t w = write(f.remote, buf, sizeof(buf));
        if (w > 0)
            sent += (size_t)w, idle = 0;
        else
            idle++;
        uv_run(&f.loop, UV_RUN_NOWAIT);
    }
    cr_assert(!f.done);
    cr_assert(conch_budget_held(&f.budget) <= f.relay.pipe_size,
              "the pipe bounds what is held: %llu",
              (unsigned long long)conch_budget_held(&f.budget));
    cr_assert(conch_budget_held(&f.budget) > 0, "a full pipe is charged");
    cr_assert(sent < (64u << 20), "the remote was stopped (%zu bytes taken)", sent);
    /* then the sandbox reads: everything comes through */
    size_t got = 0;
    for (int idle = 0; idle < 200;) {
        ssize_t r = read(f.app, buf, sizeof(buf));
        if (r > 0)
            got += (size_t)r, idle = 0;
        else
            idle++;
        uv_run(&f.loop, UV_RUN_NOWAIT);
    }
    cr_assert_eq(got, sent);
    cr_assert_eq(f.counted[1], sent);
    teardown(&f);
}

Test(relay, a_full_budget_ends_it)
{
    struct fixture f;
    setup(&f, 0);
    cr_assert(write(f.remote, "hello", 5) == 5);
    spin(&f, 1000);
    cr_assert(f.done);
    cr_assert(strstr(f.error, "budget is full"), "%s", f.error);
    teardown(&f);
}

Test(relay, a_reset_ends_it_with_the_error)
{
    struct fixture f;
    setup(&f, UINT64_MAX);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(f.remote, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(f.remote); /* an RST */
    f.remote = -1;
    spin(&f, 1000);
    cr_assert(f.done);
    cr_assert(strstr(f.error, "reset") || strstr(f.error, "Broken pipe"), "%s", f.error);
    teardown(&f);
}

Test(relay, closing_with_bytes_held_uncharges_them)
{
    struct fixture f;
    setup(&f, UINT64_MAX);
    static char buf[1 << 16];
    memset(buf, 'x', sizeof(buf));
    for (int idle = 0; idle < 200;) {
        if (write(f.remote, buf, sizeof(buf)) > 0)
            idle = 0;
        else
            idle++;
        uv_run(&f.loop, UV_RUN_NOWAIT);
    }
    cr_assert(conch_budget_held(&f.budget) > 0);
    teardown(&f); /* asserts nothing stays charged */
}
