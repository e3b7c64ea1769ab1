/* client.c - the one JSON-RPC client in C: request lines and a reader of answer lines, shared
 * by conch's client verbs (cli/conn), conch run's lease (cli/lease.c) and conch mcp. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fdpass.h"
#include "rpc/rpc.h"

char *conch_rpc_request_line(uint64_t id, const char *method, json_t *params, size_t *ret_len)
{
    json_t *req = json_pack("{s:s,s:s}", "jsonrpc", "2.0", "method", method);
    if (!req)
        return NULL;
    if ((id && json_object_set_new(req, "id", json_integer((json_int_t)id)) < 0) ||
        (params && json_object_set(req, "params", params) < 0)) {
        json_decref(req);
        return NULL;
    }
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!s)
        return NULL;
    size_t n = strlen(s);
    char *line = realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    *ret_len = n + 1;
    return line;
}

ssize_t conch_rpc_reader_fill(struct conch_rpc_reader *r, int fd, int *ret_fd)
{
    if (r->cap - r->len < 65536) {
        size_t cap = r->cap ? r->cap * 2 : 131072;
        char *nb = realloc(r->buf, cap);
        if (!nb)
            return -ENOMEM;
        r->buf = nb;
        r->cap = cap;
    }
    int fds[1] = {-1}, nfds = 0;
    ssize_t got = conch_recv_fds(fd, r->buf + r->len, r->cap - r->len, fds, 1, &nfds, 0);
    if (got == -ENOTSOCK) { /* a pipe: conch serve --stdio */
        do
            got = read(fd, r->buf + r->len, r->cap - r->len);
        while (got < 0 && errno == EINTR);
        if (got < 0)
            got = -errno;
    }
    if (nfds == 1) {
        if (ret_fd && *ret_fd < 0)
            *ret_fd = fds[0];
        else
            close(fds[0]);
    }
    if (got > 0)
        r->len += (size_t)got;
    return got;
}

int conch_rpc_reader_next(struct conch_rpc_reader *r, json_t **ret, struct conch_err *err)
{
    *ret = NULL;
    char *nl = r->len ? memchr(r->buf, '\n', r->len) : NULL;
    if (!nl) {
        if (r->max && r->len > r->max) { /* keep nothing of a line already too long */
            r->len = 0;
            r->skipping = true;
        }
        return 0;
    }
    size_t ll = (size_t)(nl - r->buf);
    bool skipped = r->skipping || (r->max && ll > r->max);
    json_error_t jerr;
    json_t *msg = skipped ? NULL : json_loadb(r->buf, ll, JSON_ALLOW_NUL, &jerr);
    memmove(r->buf, nl + 1, r->len - ll - 1);
    r->len -= ll + 1;
    r->skipping = false;
    if (skipped)
        return conch_err_set(err, EMSGSIZE, "an answer longer than %zu bytes was dropped", r->max);
    if (!msg)
        return conch_err_set(err, EBADMSG, "the daemon sent a line that is not JSON: %s",
                             jerr.text);
    *ret = msg;
    return 1;
}

void conch_rpc_reader_done(struct conch_rpc_reader *r)
{
    free(r->buf);
    size_t max = r->max;
    memset(r, 0, sizeof(*r));
    r->max = max;
}
