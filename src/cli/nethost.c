/* nethost.c - `conch run --net allow`: the allow mode's proxy in conch run's own process, on a
 * libuv loop in a thread started after the sandbox is built (nothing is cloned from conch run
 * while it runs), stopped when the command ends; what it recorded goes into the result. */
#include "cli/nethost.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RECORDS_MAX 100
/* What the proxy may hold for the command's connections (conch run has no daemon budget). */
#define HELD_MAX (64ULL << 20)

struct conch_nethost {
    struct conch_run_net net; /* first: exec's view of us */
    struct conch_net_policy policy;
    struct conch_budget held;
    uv_loop_t loop;
    uv_async_t wake;
    struct conch_net_proxy *px;
    pthread_t thread;
    bool loop_ok, started, finished;
    json_t *records; /* written by the thread until it is joined */
    size_t dropped;
};

static void on_record(void *ctx, const struct conch_net_record *rec)
{
    struct conch_nethost *h = ctx;
    if (json_array_size(h->records) >= RECORDS_MAX)
        h->dropped++;
    else
        json_array_append_new(h->records, conch_net_record_json(rec));
}

static const struct conch_net_proxy_ops proxy_ops = {.record = on_record};

static void noop_close(uv_handle_t *h)
{
    (void)h;
}

/* The command ended: connections still open are recorded as they are, then everything
 * closes and the loop ends. */
static void on_wake(uv_async_t *a)
{
    struct conch_nethost *h = a->data;
    conch_net_proxy_each_open(h->px, on_record, h);
    conch_net_proxy_free(h->px);
    h->px = NULL;
    uv_close((uv_handle_t *)a, noop_close);
}

static void *nethost_main(void *arg)
{
    struct conch_nethost *h = arg;
    /* conch run's loop takes the signals (the command's to receive). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    return NULL;
}

static int nethost_start(struct conch_run_net *t, int listen_fd, struct conch_err *err)
{
    struct conch_nethost *h = (struct conch_nethost *)t;
    int r;
    if (listen_fd < 0)
        return conch_err_setk(err, CONCH_ERR_INFRASTRUCTURE, EIO,
                              "the sandbox has no network proxy listener");
    if ((r = conch_net_proxy_new(&h->loop, &h->policy, &h->held, NULL, &proxy_ops, h, &h->px,
                                 err)) < 0) {
        close(listen_fd);
        return r;
    }
    if ((r = conch_net_proxy_listen(h->px, listen_fd, err)) < 0) {
        conch_net_proxy_free(h->px);
        h->px = NULL;
        uv_run(&h->loop, UV_RUN_DEFAULT);
        return r;
    }
    uv_async_init(&h->loop, &h->wake, on_wake);
    h->wake.data = h;
    if ((r = pthread_create(&h->thread, NULL, nethost_main, h)) != 0) {
        uv_close((uv_handle_t *)&h->wake, noop_close);
        conch_net_proxy_free(h->px);
        h->px = NULL;
        uv_run(&h->loop, UV_RUN_DEFAULT);
        return conch_err_set(err, r, "start the network proxy's thread: %s", strerror(r));
    }
    h->started = true;
    return 0;
}

static void nethost_finish(struct conch_run_net *t)
{
    struct conch_nethost *h = (struct conch_nethost *)t;
    if (!h->started || h->finished)
        return;
    h->finished = true;
    uv_async_send(&h->wake);
    pthread_join(h->thread, NULL);
}

int conch_nethost_new(const struct conch_net_policy *policy, struct conch_nethost **ret,
                      struct conch_err *err)
{
    struct conch_nethost *h = calloc(1, sizeof(*h));
    if (!h || !(h->records = json_array()) || conch_net_policy_copy(&h->policy, policy, err) < 0) {
        if (h)
            json_decref(h->records);
        free(h);
        return conch_err_set(err, ENOMEM, "out of memory");
    }
    int r = uv_loop_init(&h->loop);
    if (r < 0) {
        conch_net_policy_done(&h->policy);
        json_decref(h->records);
        free(h);
        return conch_err_set(err, -r, "network proxy: event loop: %s", uv_strerror(r));
    }
    h->loop_ok = true;
    conch_budget_init(&h->held, "conch run's network proxy", HELD_MAX, NULL);
    h->net.start = nethost_start;
    h->net.finish = nethost_finish;
    *ret = h;
    return 0;
}

struct conch_run_net *conch_nethost_net(struct conch_nethost *h)
{
    return &h->net;
}

json_t *conch_nethost_records(struct conch_nethost *h, size_t *ret_dropped)
{
    *ret_dropped = h->dropped;
    return json_incref(h->records);
}

void conch_nethost_free(struct conch_nethost *h)
{
    if (!h)
        return;
    nethost_finish(&h->net);
    if (h->loop_ok) {
        uv_run(&h->loop, UV_RUN_DEFAULT);
        uv_loop_close(&h->loop);
    }
    conch_net_policy_done(&h->policy);
    json_decref(h->records);
    free(h);
}
