/* tokens.c - parsing and checking the --tokens file (tokens.h): its mode and owner, its lines,
 * and the constant-time match of a presented token against the digests it holds. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "core/sha256.h"
#include "daemon/tokens.h"

/* The largest tokens file read (a few thousand tenants). */
#define TOKENS_FILE_MAX (1u << 20)

void conch_tokens_free(struct conch_tokens *t)
{
    if (!t)
        return;
    if (t->entries)
        conch_secure_zero(t->entries, t->n * sizeof(*t->entries));
    free(t->entries);
    free(t);
}

static bool name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > CONCH_TOKENS_NAME_MAX || !isalnum((unsigned char)s[0]))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i]))
            return false;
    return true;
}

static int count_value(const char *v, unsigned *ret)
{
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (!isdigit((unsigned char)v[0]) || errno || end == v || *end || n > 1000000)
        return -1;
    *ret = (unsigned)n;
    return 0;
}

/* One `key=value` quota of line @lineno. */
static int quota_set(const char *path, unsigned lineno, char *kv, struct conch_tenant_quota *q,
                     struct conch_err *err)
{
    char *eq = strchr(kv, '=');
    if (!eq)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s line %u: '%s' is not key=value (keys: sandboxes, memory, disk, "
                              "commands)",
                              path, lineno, kv);
    *eq = '\0';
    const char *v = eq + 1;
    struct conch_err e = {0};
    int r = 0;
    if (!strcmp(kv, "sandboxes"))
        r = count_value(v, &q->sandboxes);
    else if (!strcmp(kv, "commands"))
        r = count_value(v, &q->commands);
    else if (!strcmp(kv, "memory"))
        r = conch_parse_size(v, "memory", &q->memory_bytes, &e);
    else if (!strcmp(kv, "disk"))
        r = conch_parse_size(v, "disk", &q->disk_bytes, &e);
    else
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s line %u: unknown quota '%s' (keys: sandboxes, memory, disk, "
                              "commands)",
                              path, lineno, kv);
    if (r < 0)
        return conch_err_setk(
            err, CONCH_ERR_USAGE, EINVAL, "%s line %u: %s=%s: not a %s", path, lineno, kv, v,
            strcmp(kv, "memory") && strcmp(kv, "disk") ? "count (0 to 1000000)"
                                                       : "size (512, 64k, 10M, 2G)");
    return 0;
}

/* Parse one non-comment line into @e. The token is hashed, then wiped from @line. */
static int parse_line(const char *path, unsigned lineno, char *line, struct conch_token_entry *e,
                      struct conch_err *err)
{
    char *save = NULL;
    char *tenant = strtok_r(line, " \t", &save);
    char *token = strtok_r(NULL, " \t", &save);
    if (!tenant || !token)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s line %u: expected 'TENANT TOKEN [key=value ...]'", path, lineno);
    if (!name_ok(tenant))
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s line %u: a tenant name is 1 to 64 letters, digits, '_', '.' or "
                              "'-', beginning with a letter or a digit",
                              path, lineno);
    size_t tlen = strlen(token);
    if (tlen < CONCH_TOKENS_TOKEN_MIN || tlen > CONCH_TOKENS_TOKEN_MAX) {
        conch_secure_zero(token, tlen);
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s line %u: tenant '%s': a token is %d to %d characters (e.g. "
                              "`openssl rand -hex 32`)",
                              path, lineno, tenant, CONCH_TOKENS_TOKEN_MIN, CONCH_TOKENS_TOKEN_MAX);
    }
    memset(e, 0, sizeof(*e));
    snprintf(e->tenant, sizeof(e->tenant), "%s", tenant);
    conch_sha256(token, tlen, e->digest);
    conch_secure_zero(token, tlen);
    char *kv;
    while ((kv = strtok_r(NULL, " \t", &save)))
        if (quota_set(path, lineno, kv, &e->quota, err) < 0)
            return -EINVAL;
    return 0;
}

/* Open @path as the file the daemon's own user alone may read. */
static int open_checked(const char *path, struct conch_err *err)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, errno, "tokens file '%s': %s%s", path,
                              strerror(errno),
                              errno == ELOOP ? " (a symlink: give the file itself)" : "");
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "tokens file '%s': not a regular file",
                              path);
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                              "tokens file '%s' is owned by uid %u, not by the daemon's user "
                              "(uid %u): chown it",
                              path, (unsigned)st.st_uid, (unsigned)geteuid());
    }
    if (st.st_mode & 077) {
        close(fd);
        return conch_err_setk(err, CONCH_ERR_USAGE, EPERM,
                              "tokens file '%s' has mode %04o: group and others must have no "
                              "access to it (chmod 600 '%s')",
                              path, (unsigned)(st.st_mode & 07777), path);
    }
    if (st.st_size > TOKENS_FILE_MAX) {
        close(fd);
        return conch_err_setk(err, CONCH_ERR_USAGE, EFBIG,
                              "tokens file '%s' is larger than %u bytes", path, TOKENS_FILE_MAX);
    }
    return fd;
}

int conch_tokens_load(const char *path, struct conch_tokens **ret, struct conch_err *err)
{
    _cleanup_close_ int fd = open_checked(path, err);
    if (fd < 0)
        return fd;
    char *buf = malloc(TOKENS_FILE_MAX + 1);
    if (!buf)
        return conch_err_set(err, ENOMEM, "out of memory");
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, TOKENS_FILE_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            return conch_err_set(err, e, "tokens file '%s': read: %s", path, strerror(e));
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > TOKENS_FILE_MAX) {
            conch_secure_zero(buf, len);
            free(buf);
            return conch_err_setk(err, CONCH_ERR_USAGE, EFBIG,
                                  "tokens file '%s' is larger than %u bytes", path,
                                  TOKENS_FILE_MAX);
        }
    }
    buf[len] = '\0';
    struct conch_tokens *t = calloc(1, sizeof(*t));
    int r = t ? 0 : conch_err_set(err, ENOMEM, "out of memory");
    size_t cap = 0;
    unsigned lineno = 0;
    char *save = NULL;
    for (char *line = buf; r == 0 && line; line = save) {
        char *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl)
            *nl = '\0';
        lineno++;
        char *cr = strchr(line, '\r');
        if (cr)
            *cr = '\0';
        char *p = line + strspn(line, " \t");
        if (!*p || *p == '#')
            continue;
        if (t->n == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            void *ne = realloc(t->entries, ncap * sizeof(*t->entries));
            if (!ne) {
                r = conch_err_set(err, ENOMEM, "out of memory");
                break;
            }
            t->entries = ne;
            cap = ncap;
        }
        struct conch_token_entry *e = &t->entries[t->n];
        if ((r = parse_line(path, lineno, p, e, err)) < 0)
            break;
        for (size_t i = 0; i < t->n && r == 0; i++) {
            if (!strcmp(t->entries[i].tenant, e->tenant))
                r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                   "%s line %u: tenant '%s' is given twice", path, lineno,
                                   e->tenant);
            else if (conch_secure_equal(t->entries[i].digest, e->digest, sizeof(e->digest)))
                r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                                   "%s line %u: tenant '%s' has the token of tenant '%s': each "
                                   "tenant needs its own",
                                   path, lineno, e->tenant, t->entries[i].tenant);
        }
        if (r == 0)
            t->n++;
    }
    conch_secure_zero(buf, len);
    free(buf);
    if (r == 0 && t->n == 0)
        r = conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                           "tokens file '%s' names no tenant (lines: TENANT TOKEN [key=value "
                           "...])",
                           path);
    if (r < 0) {
        conch_tokens_free(t);
        return r;
    }
    *ret = t;
    return 0;
}

const struct conch_token_entry *conch_tokens_match(const struct conch_tokens *t, const char *token,
                                                   size_t len)
{
    if (!t)
        return NULL;
    unsigned char digest[32];
    conch_sha256(token, len, digest);
    const struct conch_token_entry *found = NULL;
    /* No early exit: every digest is compared whether or not one matched before. */
    for (size_t i = 0; i < t->n; i++) {
        bool eq = conch_secure_equal(t->entries[i].digest, digest, sizeof(digest));
        if (eq && !found)
            found = &t->entries[i];
    }
    conch_secure_zero(digest, sizeof(digest));
    return found;
}

const struct conch_token_entry *conch_tokens_find(const struct conch_tokens *t, const char *tenant)
{
    for (size_t i = 0; t && i < t->n; i++)
        if (!strcmp(t->entries[i].tenant, tenant))
            return &t->entries[i];
    return NULL;
}
