/* fs-read.c - the reading methods: fs.read (text by lines, or base64), fs.ls and
 * fs.download. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "fs/fs-internal.h"

/* Entries fs.ls returns at most; a bigger directory is too_large. */
#define MAX_LS_ENTRIES 100000
/* Raw bytes one fs.download returns in all. */
#define MAX_DOWNLOAD_TOTAL (64LL * 1024 * 1024)

static json_t *oom(struct conch_fs_error *ferr)
{
    conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    return NULL;
}

static json_t *b64_string(const char *buf, size_t len)
{
    size_t elen;
    _cleanup_free_ char *enc = conch_fs__base64_encode((const unsigned char *)buf, len, &elen);
    return enc ? json_stringn(enc, elen) : NULL;
}

/* Bytes [@offset, @offset + @length) of a file of any size, base64: a chunk of a file too
 * large for one request (length 0: the rest, at most the cap). */
static json_t *read_chunk(const struct conch_fs__ctx *ctx, const char *rel, const char *given,
                          long long offset, long long length, struct conch_fs_error *ferr)
{
    _cleanup_close_ int fd = conch_fs__open(ctx->root_fd, rel, O_RDONLY | O_NOCTTY | O_NONBLOCK, 0);
    struct stat st;
    if (fd < 0)
        return conch_fs__fail_errno(ferr, -fd, "open", given), NULL;
    if (fstat(fd, &st) < 0)
        return conch_fs__fail_errno(ferr, errno, "stat", given), NULL;
    if (S_ISDIR(st.st_mode))
        return conch_fs__fail(ferr, CONCH_FS_IS_DIRECTORY, "'%s' is a directory", given), NULL;
    if (!S_ISREG(st.st_mode))
        return conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "'%s' is not a regular file", given), NULL;
    long long size = st.st_size;
    long long want = offset >= size ? 0 : size - offset;
    if (length > 0 && want > length)
        want = length;
    if (want > CONCH_FS_MAX_FILE)
        want = CONCH_FS_MAX_FILE;
    _cleanup_free_ char *buf = malloc((size_t)want + 1);
    if (!buf)
        return oom(ferr);
    size_t got = 0;
    while ((long long)got < want) {
        ssize_t n = pread(fd, buf + got, (size_t)want - got, (off_t)offset + (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return conch_fs__fail_errno(ferr, errno, "read", given), NULL;
        if (n == 0)
            break; /* it shrank meanwhile */
        got += (size_t)n;
    }
    json_t *content = b64_string(buf, got);
    json_t *res = content ? json_pack("{s:o, s:I, s:I, s:I, s:b}", "content", content, "size",
                                      (json_int_t)size, "offset", (json_int_t)offset, "length",
                                      (json_int_t)got, "eof", offset + (long long)got >= size)
                          : NULL;
    return res ? res : oom(ferr);
}

json_t *conch_fs__read(const struct conch_fs__ctx *ctx, json_t *params, struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"path", "offset", "limit", "length", "encoding", NULL};
    const char *path;
    size_t plen;
    long long offset, limit, length;
    bool base64;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "path", true, &path, &plen, ferr) < 0 ||
        conch_fs__param_int(params, "offset", 0, 0, LLONG_MAX / 2, &offset, ferr) < 0 ||
        conch_fs__param_int(params, "limit", 2000, 1, LLONG_MAX / 2, &limit, ferr) < 0 ||
        conch_fs__param_int(params, "length", 0, 1, CONCH_FS_MAX_FILE, &length, ferr) < 0 ||
        conch_fs__param_encoding(params, &base64, ferr) < 0)
        return NULL;
    bool chunked =
        json_object_get(params, "length") && !json_is_null(json_object_get(params, "length"));
    bool byte_offset = offset > 0 && base64;
    if (chunked && !base64) {
        conch_fs__fail_param(ferr, "length",
                             "param 'length' (bytes) needs \"encoding\": \"base64\"; text reads "
                             "take offset and limit in lines");
        return NULL;
    }
    _cleanup_free_ char *rel = NULL;
    if (conch_fs__path_parse(ctx, path, plen, false, &rel, ferr) < 0)
        return NULL;
    if (chunked || byte_offset)
        return read_chunk(ctx, rel, path, offset, length, ferr);
    _cleanup_free_ char *buf = NULL;
    size_t len;
    if (conch_fs__read_file(ctx, rel, path, &buf, &len, ferr) < 0)
        return NULL;

    if (base64) {
        json_t *content = b64_string(buf, len);
        json_t *res =
            content ? json_pack("{s:o, s:I}", "content", content, "size", (json_int_t)len) : NULL;
        return res ? res : oom(ferr);
    }

    /* Lines end at '\n' (kept in the content); a last line without one still counts. */
    long long total = 0;
    size_t start = offset == 0 ? 0 : len, end = len;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != '\n')
            continue;
        total++;
        if (total == offset)
            start = i + 1;
        if (total == offset + limit)
            end = i + 1;
    }
    if (len > 0 && buf[len - 1] != '\n')
        total++;
    if (start > end)
        start = end;
    long long lines = total > offset ? total - offset : 0;
    if (lines > limit)
        lines = limit;
    json_t *content = conch_fs__json_text(buf + start, end - start);
    json_t *res = content ? json_pack("{s:o, s:I, s:I, s:I, s:b, s:I}", "content", content,
                                      "offset", (json_int_t)offset, "lines", (json_int_t)lines,
                                      "total_lines", (json_int_t)total, "truncated",
                                      offset + lines < total, "size", (json_int_t)len)
                          : NULL;
    return res ? res : oom(ferr);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

json_t *conch_fs__ls(const struct conch_fs__ctx *ctx, json_t *params, struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"path", NULL};
    const char *path;
    size_t plen;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "path", false, &path, &plen, ferr) < 0)
        return NULL;
    if (!path) {
        path = "";
        plen = 0;
    }
    _cleanup_free_ char *rel = NULL;
    if (conch_fs__path_parse(ctx, path, plen, true, &rel, ferr) < 0)
        return NULL;
    const char *shown = *path ? path : conch_fs__default_shown(ctx);
    int fd = conch_fs__open(ctx->root_fd, rel, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0) {
        conch_fs__fail_errno(ferr, -fd, "list", shown);
        return NULL;
    }
    _cleanup_closedir_ DIR *d = fdopendir(fd);
    if (!d) {
        conch_fs__fail_errno(ferr, errno, "list", shown);
        close(fd);
        return NULL;
    }

    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    errno = 0;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (n == MAX_LS_ENTRIES) {
            free_names(names, n);
            conch_fs__fail(ferr, CONCH_FS_TOO_LARGE, "'%s' has more than %d entries", shown,
                           MAX_LS_ENTRIES);
            return NULL;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 64;
            char **nn = realloc(names, ncap * sizeof(*nn));
            if (!nn) {
                free_names(names, n);
                return oom(ferr);
            }
            names = nn;
            cap = ncap;
        }
        if (!(names[n] = strdup(de->d_name))) {
            free_names(names, n);
            return oom(ferr);
        }
        n++;
    }
    if (errno) {
        int e = errno;
        free_names(names, n);
        conch_fs__fail_errno(ferr, e, "list", shown);
        return NULL;
    }
    if (n)
        qsort(names, n, sizeof(*names), cmp_str);

    json_t *entries = json_array();
    for (size_t i = 0; entries && i < n; i++) {
        struct stat st;
        /* Gone since readdir: a concurrent delete, not an error. */
        if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        _cleanup_free_ char *crel = conch_fs__path_join(rel, names[i]);
        _cleanup_free_ char *cpath = crel ? conch_fs__path_display(ctx, crel) : NULL;
        char type[2] = {conch_fs__type_letter(st.st_mode), '\0'};
        char mode[8];
        snprintf(mode, sizeof(mode), "%04o", (unsigned)(st.st_mode & 07777));
        json_t *name = conch_fs__json_text(names[i], strlen(names[i]));
        json_t *jpath = cpath ? conch_fs__json_text(cpath, strlen(cpath)) : NULL;
        json_t *e = NULL;
        /* json_pack steals "o" values, so only hand it both or neither. */
        if (name && jpath)
            e = json_pack("{s:o, s:o, s:s, s:I, s:s, s:f}", "name", name, "path", jpath, "type",
                          type, "size", (json_int_t)st.st_size, "mode", mode, "mtime",
                          (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9);
        else {
            json_decref(name);
            json_decref(jpath);
        }
        if (!e || json_array_append_new(entries, e) < 0) {
            json_decref(entries);
            entries = NULL;
        }
    }
    free_names(names, n);
    json_t *res = entries ? json_pack("{s:o}", "entries", entries) : NULL;
    return res ? res : oom(ferr);
}

static json_t *error_obj(const struct conch_fs_error *e)
{
    return json_pack("{s:s, s:s}", "code", conch_fs_errcode_name(e->code), "message", e->message);
}

json_t *conch_fs__download(const struct conch_fs__ctx *ctx, json_t *params,
                           struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"paths", NULL};
    if (conch_fs__params_check(params, keys, ferr) < 0)
        return NULL;
    json_t *paths = json_object_get(params, "paths");
    if (!json_is_array(paths)) {
        conch_fs__fail_param(ferr, "paths", "param 'paths' must be an array of strings");
        return NULL;
    }
    if (json_array_size(paths) > CONCH_FS__MAX_BATCH) {
        conch_fs__fail_param(ferr, "paths", "param 'paths' has more than %d entries",
                             CONCH_FS__MAX_BATCH);
        return NULL;
    }
    size_t i;
    json_t *p;
    json_array_foreach(paths, i, p)
    {
        if (!json_is_string(p)) {
            conch_fs__fail_param(ferr, "paths", "param 'paths' must be an array of strings");
            return NULL;
        }
    }

    json_t *files = json_array();
    long long total = 0;
    json_array_foreach(paths, i, p)
    {
        if (!files)
            break;
        const char *path = json_string_value(p);
        struct conch_fs_error e = {0};
        _cleanup_free_ char *rel = NULL;
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        json_t *content = NULL;
        if (conch_fs__path_parse(ctx, path, json_string_length(p), false, &rel, &e) == 0 &&
            conch_fs__read_file(ctx, rel, path, &buf, &len, &e) == 0) {
            if (total + (long long)len > MAX_DOWNLOAD_TOTAL)
                conch_fs__fail(&e, CONCH_FS_TOO_LARGE,
                               "'%s': the download is above its total limit of %lld bytes", path,
                               MAX_DOWNLOAD_TOTAL);
            else if (!(content = b64_string(buf, len)))
                conch_fs__fail(&e, CONCH_FS_IO_ERROR, "out of memory");
            else
                total += (long long)len;
        }
        json_t *entry = json_pack("{s:O}", "path", p);
        if (entry)
            json_object_set_new(entry, content ? "content" : "error",
                                content ? content : error_obj(&e));
        else
            json_decref(content);
        if (!entry || json_array_append_new(files, entry) < 0) {
            json_decref(files);
            files = NULL;
        }
    }
    json_t *res = files ? json_pack("{s:o}", "files", files) : NULL;
    return res ? res : oom(ferr);
}
