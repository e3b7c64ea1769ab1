/* fs-worker.c - the body of the file workers: the fenced processes the warden forks inside
 * the sandbox to serve fs.* requests. A request is JSON {method, params}; the answer is JSON
 * {result} or {error: {code, message, param?, occurrences?, limit?}}. A per-request worker
 * reads its request from a memfd and writes its answer to a pipe; a persistent one serves
 * frames (a native-endian uint64_t length, then that many bytes of JSON) both ways over a
 * stream socket until EOF. */
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "fs/fs.h"

char *conch_fs_worker_answer(const char *buf, size_t len)
{
    return conch_fs_worker_answer_data(buf, len, -1);
}

char *conch_fs_worker_answer_data(const char *buf, size_t len, int data_fd)
{
    json_error_t jerr;
    json_t *req = json_loadb(buf, len, JSON_ALLOW_NUL, &jerr);
    const char *method = json_string_value(json_object_get(req, "method"));
    json_t *params = json_object_get(req, "params");
    if (!method || !json_is_object(params)) {
        json_decref(req);
        return NULL;
    }
    /* The whole sandbox, as its user sees it: relative paths are under /workspace. */
    int root = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct conch_fs_error ferr;
    memset(&ferr, 0, sizeof(ferr));
    json_t *res =
        root >= 0 ? conch_fs_call_rooted_data(root, "/workspace", method, params, data_fd, &ferr)
                  : NULL;
    json_t *resp;
    if (res) {
        resp = json_pack("{s:o}", "result", res);
    } else {
        if (root < 0) {
            ferr.code = CONCH_FS_IO_ERROR;
            snprintf(ferr.message, sizeof(ferr.message), "open /: %s", strerror(errno));
        }
        json_t *e = json_pack("{s:s,s:s}", "code", conch_fs_errcode_name(ferr.code), "message",
                              ferr.message);
        if (ferr.param[0])
            json_object_set_new(e, "param", json_string(ferr.param));
        if (ferr.code == CONCH_FS_AMBIGUOUS_MATCH || ferr.code == CONCH_FS_STRING_NOT_FOUND)
            json_object_set_new(e, "occurrences", json_integer(ferr.occurrences));
        /* A copy's only size cap is the disk limit, not the per-request one. */
        if (ferr.code == CONCH_FS_TOO_LARGE && strncmp(method, "copy_", 5) != 0)
            json_object_set_new(e, "limit", json_integer(CONCH_FS_MAX_FILE));
        resp = json_pack("{s:o}", "error", e);
    }
    if (root >= 0)
        close(root);
    char *text = json_dumps(resp, JSON_COMPACT);
    json_decref(resp);
    json_decref(req);
    return text;
}

int conch_fs_worker_run(int req_fd, int resp_fd, int data_fd)
{
    struct stat st;
    if (fstat(req_fd, &st) < 0 || st.st_size <= 0 || st.st_size > CONCH_FS_MAX_REQUEST)
        return 1;
    char *buf = malloc((size_t)st.st_size);
    if (!buf || pread(req_fd, buf, (size_t)st.st_size, 0) != st.st_size)
        return 1;
    char *text = conch_fs_worker_answer_data(buf, (size_t)st.st_size, data_fd);
    free(buf);
    if (!text)
        return 1;
    int r = conch_write_all(resp_fd, text, strlen(text));
    free(text);
    return r < 0 ? 1 : 0;
}

/* Read exactly @len bytes; 1 done, 0 EOF before any, -1 error or EOF midway. */
static int read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 && got == 0 ? 0 : -1;
        got += (size_t)n;
    }
    return 1;
}

static int write_frame(int fd, const char *text, uint64_t len)
{
    struct iovec iov[2] = {{.iov_base = &len, .iov_len = sizeof(len)},
                           {.iov_base = (void *)text, .iov_len = len}};
    size_t total = sizeof(len) + len, done = 0;
    while (done < total) {
        /* The first write takes both pieces at once; the rest, if any, follows. */
        ssize_t n = done == 0            ? writev(fd, iov, 2)
                    : done < sizeof(len) ? write(fd, (char *)&len + done, sizeof(len) - done)
                                         : write(fd, text + (done - sizeof(len)), total - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        done += (size_t)n;
    }
    return 0;
}

int conch_fs_worker_serve(int sock)
{
    /* A file a write replaces is unlinked after the answer (below), not inside the write. */
    conch_fs_defer_replaced(true);
    for (;;) {
        uint64_t len;
        int r = read_full(sock, &len, sizeof(len));
        if (r == 0)
            return 0; /* the daemon closed its end: done */
        if (r < 0 || len == 0 || len > CONCH_FS_MAX_REQUEST)
            return 1;
        char *buf = malloc(len);
        if (!buf || read_full(sock, buf, len) != 1)
            return 1;
        char *text = conch_fs_worker_answer(buf, len);
        free(buf);
        /* An empty answer: the request was malformed (the daemon answers "no answer"). */
        r = write_frame(sock, text ? text : "", text ? strlen(text) : 0);
        free(text);
        /* What a write replaced goes now, while the daemon forwards the answer. */
        conch_fs_release_deferred();
        if (r < 0)
            return 1;
        /* An upload or a big read leaves its peak in the heap: give it back. */
        if (len > (1u << 20))
            malloc_trim(0);
    }
}
