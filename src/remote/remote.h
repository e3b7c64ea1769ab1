/* remote.h - the remote transport (docs/ARCHITECTURE.md, "The remote transport"): a gateway
 * process that terminates TLS and WebSocket and forwards each remote client to the daemon's
 * unix socket as one ordinary connection whose first request is `connection.auth`, and the
 * supervisor `conch serve` keeps it running with. */
#ifndef CONCH_REMOTE_REMOTE_H
#define CONCH_REMOTE_REMOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* What a client may make the gateway hold (docs/ARCHITECTURE.md, "The remote transport"). */
#define CONCH_REMOTE_MAX_MESSAGE (64u << 20)   /* one JSON-RPC message, either direction */
#define CONCH_REMOTE_CLIENT_QUEUE (1u << 20)   /* unsent data to one WebSocket client */
#define CONCH_REMOTE_HANDSHAKE_SECONDS 10      /* TCP accept to WebSocket upgrade */
#define CONCH_REMOTE_PING_SECONDS 30           /* WebSocket pings of an idle connection */
#define CONCH_REMOTE_DEFAULT_CONNECTIONS 4096u /* WebSocket clients at once; more get 503 */

struct conch_remote_opts {
    const char *socket_path; /* the daemon's unix socket */
    const char *listen;      /* HOST:PORT ([V6]:PORT) */
    const char *tls_cert;    /* PEM certificate chain */
    const char *tls_key;     /* PEM private key */
    unsigned max_connections;
};

/* conch_remote_parse_listen - split "HOST:PORT" (or "[V6ADDR]:PORT") into @host and *@port;
 * HOST must be an IP address. Returns 0, or -EINVAL with @err saying what is wrong. */
int conch_remote_parse_listen(const char *listen, char *host, size_t hostsize, int *port,
                              struct conch_err *err);

/* conch_remote_probe_listen - @listen parses and its address can be bound now (a probe
 * socket, closed). Returns 0, or -errno with @err naming the address and the problem. */
int conch_remote_probe_listen(const char *listen, struct conch_err *err);

/* conch_remote_check_tls - @cert and @key load (a PEM chain and its private key, matching).
 * Returns 0, or -EINVAL with @err naming the file and the problem. */
int conch_remote_check_tls(const char *cert, const char *key, struct conch_err *err);

/*
 * conch_remote_gateway_run - the gateway process (`conch __gateway`): serve wss://LISTEN/rpc
 * and https://LISTEN/healthz until SIGTERM/SIGINT, reloading the certificate and key on
 * SIGHUP. Returns 0 after a clean stop, or -errno with @err when it could not start.
 */
int conch_remote_gateway_run(const struct conch_remote_opts *o, struct conch_err *err);

/* The supervisor: `conch serve --listen` runs the gateway as a child process (an exec of this
 * binary, so that it holds nothing of the daemon's memory), starts it once the daemon
 * listens, restarts it when it dies, forwards SIGHUP and stops it when the daemon stops. */
struct conch_remote_super;

/* conch_remote_super_new - a supervisor that will exec @exe_fd (an fd of this binary opened
 * at start) with @argv (NULL-terminated; copied) followed by `--socket PATH`. Returns NULL
 * with @err on failure. */
struct conch_remote_super *conch_remote_super_new(int exe_fd, char *const *argv,
                                                  struct conch_err *err);
/* conch_remote_super_listening - the daemon listens on @socket_path: start the gateway. */
void conch_remote_super_listening(struct conch_remote_super *s, const char *socket_path);
/* conch_remote_super_sighup - forward SIGHUP to the gateway. */
void conch_remote_super_sighup(struct conch_remote_super *s);
/* conch_remote_super_free - stop the gateway (SIGTERM, then SIGKILL after 5 s) and free. */
void conch_remote_super_free(struct conch_remote_super *s);

#endif
