/* client.c - `conch ps`, `conch exec` and `conch rm`: small blocking JSON-RPC clients of a
 * running `conch serve`. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "daemon/daemon.h"

struct conn {
    int fd;
    char *buf;
    size_t len, cap;
};

static int conn_open(struct conn *c, const char *path)
{
    char def[PATH_MAX];
    if (!path) {
        conch_daemon_socket(def, sizeof(def));
        path = def;
    }
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    struct conch_err err = {0};
    if (conch_daemon_socket_check(path, true, &err) < 0) {
        fprintf(stderr, "conch: %s\n", err.msg);
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path)) {
        fprintf(stderr, "conch: socket path too long: '%s'\n", path);
        return -1;
    }
    strcpy(sa.sun_path, path);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        fprintf(stderr,
                "conch: cannot reach the daemon at '%s': %s (start it with 'conch serve')\n", path,
                strerror(errno));
        if (c->fd >= 0)
            close(c->fd);
        return -1;
    }
    return 0;
}

/* Send one request and return its result (new reference), or NULL after printing the
 * error. */
static json_t *conn_call(struct conn *c, const char *method, json_t *params)
{
    json_t *req = json_pack("{s:s,s:i,s:s,s:o}", "jsonrpc", "2.0", "id", 1, "method", method,
                            "params", params);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!line)
        return NULL;
    size_t n = strlen(line);
    line = realloc(line, n + 2);
    line[n] = '\n';
    int r = conch_write_all(c->fd, line, n + 1);
    free(line);
    if (r < 0) {
        fprintf(stderr, "conch: write to the daemon: %s\n", strerror(-r));
        return NULL;
    }
    for (;;) {
        char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
        if (nl) {
            size_t ll = (size_t)(nl - c->buf);
            json_t *msg = json_loadb(c->buf, ll, 0, NULL);
            memmove(c->buf, nl + 1, c->len - ll - 1);
            c->len -= ll + 1;
            if (!msg || !json_object_get(msg, "id")) {
                json_decref(msg); /* a notification */
                continue;
            }
            json_t *res = json_object_get(msg, "result");
            if (res) {
                json_incref(res);
                json_decref(msg);
                return res;
            }
            json_t *e = json_object_get(msg, "error");
            fprintf(stderr, "conch: error: %s\n",
                    json_string_value(json_object_get(e, "message"))
                        ? json_string_value(json_object_get(e, "message"))
                        : "unknown");
            json_decref(msg);
            return NULL;
        }
        if (c->cap - c->len < 65536) {
            c->cap = c->cap ? c->cap * 2 : 131072;
            c->buf = realloc(c->buf, c->cap);
        }
        ssize_t got = read(c->fd, c->buf + c->len, c->cap - c->len);
        if (got <= 0) {
            fprintf(stderr, "conch: the daemon closed the connection\n");
            return NULL;
        }
        c->len += (size_t)got;
    }
}

static void conn_close(struct conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->buf);
}

/* Leading "--socket PATH"; returns the index of the first other argument. */
static int socket_arg(int argc, char **argv, const char **ret)
{
    int i = 1;
    *ret = NULL;
    while (i < argc && !strcmp(argv[i], "--socket") && i + 1 < argc) {
        *ret = argv[i + 1];
        i += 2;
    }
    return i;
}

int conch_cli_ps(int argc, char **argv)
{
    const char *sock;
    socket_arg(argc, argv, &sock);
    struct conn c;
    if (conn_open(&c, sock) < 0)
        return 1;
    json_t *res = conn_call(&c, "sandbox.list", json_object());
    conn_close(&c);
    if (!res)
        return 1;
    printf("%-14s %-8s %-8s %8s  %s\n", "ID", "STATE", "MODE", "COMMANDS", "WORKSPACE");
    size_t i;
    json_t *sb;
    json_array_foreach(json_object_get(res, "sandboxes"), i, sb)
    {
        const char *ws = json_string_value(json_object_get(sb, "workspace"));
        printf("%-14s %-8s %-8s %8lld  %s\n", json_string_value(json_object_get(sb, "id")),
               json_string_value(json_object_get(sb, "state")),
               json_string_value(json_object_get(sb, "mode")),
               (long long)json_integer_value(json_object_get(sb, "commands")), ws ? ws : "-");
    }
    json_decref(res);
    return 0;
}

/* Quote @s for bash: 'it'\''s'. */
static void append_quoted(char **buf, size_t *len, const char *s)
{
    size_t need = *len + strlen(s) * 4 + 4;
    *buf = realloc(*buf, need);
    char *p = *buf + *len;
    *p++ = '\'';
    for (; *s; s++) {
        if (*s == '\'') {
            memcpy(p, "'\\''", 4);
            p += 4;
        } else {
            *p++ = *s;
        }
    }
    *p++ = '\'';
    *p++ = ' ';
    *p = '\0';
    *len = (size_t)(p - *buf);
}

int conch_cli_exec(int argc, char **argv)
{
    const char *sock;
    int i = socket_arg(argc, argv, &sock);
    if (i >= argc || !strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
        fputs("usage: conch exec [--socket PATH] ID -- CMD [ARGS...]\n",
              i >= argc ? stderr : stdout);
        return i >= argc ? CONCH_EXIT_USAGE : 0;
    }
    const char *id = argv[i++];
    if (i < argc && !strcmp(argv[i], "--"))
        i++;
    if (i >= argc) {
        fputs("conch exec: no command given\n", stderr);
        return CONCH_EXIT_USAGE;
    }
    char *cmd = NULL;
    size_t len = 0;
    for (; i < argc; i++)
        append_quoted(&cmd, &len, argv[i]);
    struct conn c;
    if (conn_open(&c, sock) < 0) {
        free(cmd);
        return CONCH_EXIT_INFRA;
    }
    json_t *res = conn_call(&c, "exec.run", json_pack("{s:s,s:s}", "sandbox", id, "command", cmd));
    free(cmd);
    conn_close(&c);
    if (!res)
        return CONCH_EXIT_INFRA;
    const char *out = json_string_value(json_object_get(res, "stdout"));
    const char *err = json_string_value(json_object_get(res, "stderr"));
    if (out)
        fputs(out, stdout);
    if (err)
        fputs(err, stderr);
    int code = (int)json_integer_value(json_object_get(res, "exit_code"));
    if (json_is_true(json_object_get(res, "timed_out")))
        code = CONCH_EXIT_TIMEOUT;
    json_decref(res);
    return code;
}

int conch_cli_rm(int argc, char **argv)
{
    const char *sock;
    int i = socket_arg(argc, argv, &sock);
    if (i >= argc) {
        fputs("usage: conch rm [--socket PATH] ID...\n", stderr);
        return CONCH_EXIT_USAGE;
    }
    struct conn c;
    if (conn_open(&c, sock) < 0)
        return 1;
    int status = 0;
    for (; i < argc; i++) {
        json_t *res = conn_call(&c, "sandbox.destroy", json_pack("{s:s}", "id", argv[i]));
        if (!res)
            status = 1;
        json_decref(res);
    }
    conn_close(&c);
    return status;
}
