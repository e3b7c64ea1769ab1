/* nethost.h - `conch run --net allow`: the network proxy of the allow mode (net/) for the one
 * command of a `conch run`, on a libuv loop in a thread of its own started once the sandbox is
 * built (as the tool bridge's host, toolhost.c), recording every attempt for the result. It
 * lives in cli/, above net and libuv; exec/ drives it through struct conch_run_net. */
#ifndef CONCH_CLI_NETHOST_H
#define CONCH_CLI_NETHOST_H

#include <jansson.h>

#include "core/error.h"
#include "exec/run.h"
#include "net/net.h"

struct conch_nethost;

/* conch_nethost_new - a proxy host for @policy (copied). Returns 0 with *@ret, or -ENOMEM. */
int conch_nethost_new(const struct conch_net_policy *policy, struct conch_nethost **ret,
                      struct conch_err *err);

/* conch_nethost_net - @h as conch run's network server (conch_run_opts.net); borrowed. */
struct conch_run_net *conch_nethost_net(struct conch_nethost *h);

/* conch_nethost_records - the attempts of the command (at most 100, as the daemon's results),
 * after the run's finish: a new reference to an array ("network" of the result), and in
 * *@ret_dropped how many more were made. */
json_t *conch_nethost_records(struct conch_nethost *h, size_t *ret_dropped);

/* conch_nethost_free - free @h (finishing it first if needed). NULL is a no-op. */
void conch_nethost_free(struct conch_nethost *h);

#endif
