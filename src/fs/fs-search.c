/* fs-search.c - the searching methods: fs.glob (shell patterns with "**" across directory
 * levels) and fs.grep (POSIX extended regex or fixed strings). Both walk directories one
 * level at a time with fds opened O_NOFOLLOW, so a symlink is never followed mid-walk. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "fs/fs-internal.h"

/* Patterns one brace expansion may produce ("{a,b}{c,d}" is 4). */
#define MAX_BRACE_PATTERNS 64
/* Bytes of a matching line that fs.grep returns as its text. */
#define MAX_MATCH_TEXT 4096

static json_t *oom(struct conch_fs_error *ferr)
{
    conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "out of memory");
    return NULL;
}

static void free_strv(char **v, size_t n)
{
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
    free(v);
}

static int strv_push(char ***v, size_t *n, size_t *cap, char *s)
{
    if (!s)
        return -ENOMEM;
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 16;
        char **nv = realloc(*v, ncap * sizeof(*nv));
        if (!nv) {
            free(s);
            return -ENOMEM;
        }
        *v = nv;
        *cap = ncap;
    }
    (*v)[(*n)++] = s;
    return 0;
}

/*
 * Expand "{a,b}" groups (nestable, as in bash and ripgrep's globs) into separate patterns,
 * since fnmatch has no braces. A brace without a matching '}' or a top-level ',' is
 * literal. -E2BIG past MAX_BRACE_PATTERNS.
 */
static int expand_braces(const char *pat, char ***v, size_t *n, size_t *cap)
{
    for (const char *open = strchr(pat, '{'); open; open = strchr(open + 1, '{')) {
        int level = 0;
        const char *close = NULL;
        bool comma = false;
        for (const char *p = open; *p && !close; p++) {
            if (*p == '{')
                level++;
            else if (*p == '}' && --level == 0)
                close = p;
            else if (*p == ',' && level == 1)
                comma = true;
        }
        if (!close || !comma)
            continue;
        const char *alt = open + 1;
        level = 0;
        for (const char *p = open + 1; p <= close; p++) {
            if (*p == '{') {
                level++;
                continue;
            }
            if (*p == '}' && level > 0) {
                level--;
                continue;
            }
            if (!(level == 0 && (*p == ',' || p == close)))
                continue;
            char *one = NULL;
            if (asprintf(&one, "%.*s%.*s%s", (int)(open - pat), pat, (int)(p - alt), alt,
                         close + 1) < 0)
                return -ENOMEM;
            int r = expand_braces(one, v, n, cap);
            free(one);
            if (r < 0)
                return r;
            alt = p + 1;
        }
        return 0;
    }
    if (*n >= MAX_BRACE_PATTERNS)
        return -E2BIG;
    return strv_push(v, n, cap, strdup(pat));
}

/* Split a pattern into components, dropping "" and "." and collapsing "**" runs. */
static int split_pattern(const char *pat, char ***ret, size_t *ret_n)
{
    char **v = NULL;
    size_t n = 0, cap = 0;
    for (const char *p = pat; *p;) {
        while (*p == '/')
            p++;
        const char *e = strchrnul(p, '/');
        size_t len = (size_t)(e - p);
        bool star2 = len == 2 && p[0] == '*' && p[1] == '*';
        if (len == 0 || (len == 1 && p[0] == '.') || (star2 && n && strcmp(v[n - 1], "**") == 0)) {
            p = e;
            continue;
        }
        if (len == 2 && p[0] == '.' && p[1] == '.') {
            free_strv(v, n);
            return -EINVAL;
        }
        if (strv_push(&v, &n, &cap, strndup(p, len)) < 0) {
            free_strv(v, n);
            return -ENOMEM;
        }
        p = e;
    }
    *ret = v;
    *ret_n = n;
    return 0;
}

struct dent {
    char *name;
    bool dir; /* a real directory, not a symlink to one */
    bool reg;
};

static int cmp_dent(const void *a, const void *b)
{
    return strcmp(((const struct dent *)a)->name, ((const struct dent *)b)->name);
}

static void free_dents(struct dent *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].name);
    free(v);
}

/* The entries of @dfd sorted by name, so results come out in a stable order. */
static int list_dir(int dfd, struct dent **ret, size_t *ret_n)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    _cleanup_closedir_ DIR *d = fdopendir(fd);
    if (!d) {
        int r = -errno;
        close(fd);
        return r;
    }
    struct dent *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        unsigned char t = de->d_type;
        if (t == DT_UNKNOWN) {
            struct stat st;
            if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                continue;
            t = S_ISDIR(st.st_mode) ? DT_DIR : S_ISREG(st.st_mode) ? DT_REG : DT_LNK;
        }
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 32;
            struct dent *nv = realloc(v, ncap * sizeof(*nv));
            if (!nv) {
                free_dents(v, n);
                return -ENOMEM;
            }
            v = nv;
            cap = ncap;
        }
        v[n].name = strdup(de->d_name);
        if (!v[n].name) {
            free_dents(v, n);
            return -ENOMEM;
        }
        v[n].dir = t == DT_DIR;
        v[n].reg = t == DT_REG;
        n++;
    }
    if (n)
        qsort(v, n, sizeof(*v), cmp_dent);
    *ret = v;
    *ret_n = n;
    return 0;
}

static int open_subdir(int dfd, const char *name)
{
    return openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static bool has_magic(const char *s)
{
    return strpbrk(s, "*?[\\") != NULL;
}

struct globber {
    char **comps;
    size_t ncomps;
    char **found; /* paths relative to the glob's start directory */
    size_t n, cap;
    size_t max;
    bool truncated;
    int err; /* -ENOMEM */
};

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void sort_unique(char **v, size_t *n)
{
    if (*n == 0)
        return;
    qsort(v, *n, sizeof(*v), cmp_str);
    size_t o = 1;
    for (size_t i = 1; i < *n; i++) {
        if (strcmp(v[i], v[o - 1]) == 0)
            free(v[i]);
        else
            v[o++] = v[i];
    }
    *n = o;
}

static bool glob_stop(const struct globber *g)
{
    return g->truncated || g->err;
}

static void glob_add(struct globber *g, const char *prefix, const char *name)
{
    if (glob_stop(g))
        return;
    if (strv_push(&g->found, &g->n, &g->cap, conch_fs__path_join(prefix, name)) < 0) {
        g->err = -ENOMEM;
        return;
    }
    /* Patterns with two "**" can reach one path twice: only distinct paths count. */
    if (g->n > g->max) {
        sort_unique(g->found, &g->n);
        if (g->n > g->max)
            g->truncated = true;
    }
}

static void glob_dir(struct globber *g, int dfd, const char *prefix, size_t ci, int depth);

static void glob_descend(struct globber *g, int dfd, const char *prefix, const char *name,
                         size_t ci, int depth)
{
    if (depth >= CONCH_FS_MAX_DEPTH || glob_stop(g))
        return;
    _cleanup_close_ int sub = open_subdir(dfd, name);
    if (sub < 0)
        return; /* unreadable, or raced away: skipped, like find(1) without -L */
    _cleanup_free_ char *sp = conch_fs__path_join(prefix, name);
    if (!sp) {
        g->err = -ENOMEM;
        return;
    }
    glob_dir(g, sub, sp, ci, depth + 1);
}

static void glob_dir(struct globber *g, int dfd, const char *prefix, size_t ci, int depth)
{
    const char *comp = g->comps[ci];
    bool last = ci + 1 == g->ncomps;
    if (strcmp(comp, "**") == 0 && !last)
        glob_dir(g, dfd, prefix, ci + 1, depth); /* "**" as zero components */
    if (glob_stop(g))
        return;
    if (strcmp(comp, "**") != 0 && !has_magic(comp)) {
        struct stat st;
        if (fstatat(dfd, comp, &st, AT_SYMLINK_NOFOLLOW) < 0)
            return;
        if (last)
            glob_add(g, prefix, comp);
        else if (S_ISDIR(st.st_mode))
            glob_descend(g, dfd, prefix, comp, ci + 1, depth);
        return;
    }
    struct dent *ents = NULL;
    size_t n = 0;
    if (list_dir(dfd, &ents, &n) < 0)
        return;
    for (size_t i = 0; i < n && !glob_stop(g); i++) {
        const char *name = ents[i].name;
        if (strcmp(comp, "**") == 0) {
            /* bash globstar: "**" does not enter hidden names */
            if (name[0] == '.')
                continue;
            if (last)
                glob_add(g, prefix, name); /* a trailing "**" is everything beneath */
            if (ents[i].dir)
                glob_descend(g, dfd, prefix, name, ci, depth);
        } else if (fnmatch(comp, name, FNM_PERIOD) == 0) {
            if (last)
                glob_add(g, prefix, name);
            else if (ents[i].dir)
                glob_descend(g, dfd, prefix, name, ci + 1, depth);
        }
    }
    free_dents(ents, n);
}

/* Strip @ctx's root from an absolute pattern; NULL when it is not under the root. */
static const char *strip_root(const struct conch_fs__ctx *ctx, const char *pat)
{
    const char *p = pat;
    const char *root = ctx->root_name;
    while (*root) {
        while (*p == '/')
            p++;
        while (*root == '/')
            root++;
        if (!*root)
            break;
        size_t rl = strcspn(root, "/"), pl = strcspn(p, "/");
        if (rl != pl || strncmp(root, p, rl) != 0)
            return NULL;
        root += rl;
        p += pl;
    }
    return p;
}

json_t *conch_fs__glob(const struct conch_fs__ctx *ctx, json_t *params, struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"pattern", "path", "max_results", "details", NULL};
    const char *pattern, *path;
    size_t patlen, plen;
    long long max;
    bool details;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "pattern", true, &pattern, &patlen, ferr) < 0 ||
        conch_fs__param_str(params, "path", false, &path, &plen, ferr) < 0 ||
        conch_fs__param_int(params, "max_results", 1000, 1, CONCH_FS_MAX_RESULTS, &max, ferr) < 0 ||
        conch_fs__param_bool(params, "details", false, &details, ferr) < 0)
        return NULL;
    if (patlen == 0 || strlen(pattern) != patlen) {
        conch_fs__fail_param(ferr, "pattern", "param 'pattern' must be non-empty, without NUL");
        return NULL;
    }
    if (!path) {
        path = "";
        plen = 0;
    }
    _cleanup_free_ char *base = NULL;
    if (pattern[0] == '/') {
        /* An absolute pattern names its own start: the root. */
        pattern = strip_root(ctx, pattern);
        if (!pattern) {
            conch_fs__fail(ferr, CONCH_FS_INVALID_PATH, "pattern '%s' is outside the workspace",
                           json_string_value(json_object_get(params, "pattern")));
            return NULL;
        }
        base = strdup("");
        if (!base)
            return oom(ferr);
    } else if (conch_fs__path_parse(ctx, path, plen, true, &base, ferr) < 0) {
        return NULL;
    }
    const char *shown = *path ? path : conch_fs__default_shown(ctx);
    _cleanup_close_ int dfd = conch_fs__open(ctx->root_fd, base, O_RDONLY | O_DIRECTORY, 0);
    if (dfd < 0) {
        conch_fs__fail_errno(ferr, -dfd, "glob in", shown);
        return NULL;
    }

    char **pats = NULL;
    size_t npats = 0, pcap = 0;
    int r = expand_braces(pattern, &pats, &npats, &pcap);
    struct globber g = {.max = (size_t)max};
    for (size_t i = 0; r == 0 && i < npats && !glob_stop(&g); i++) {
        r = split_pattern(pats[i], &g.comps, &g.ncomps);
        if (r == 0 && g.ncomps > 0)
            glob_dir(&g, dfd, "", 0, 0);
        free_strv(g.comps, g.ncomps);
        g.comps = NULL;
        g.ncomps = 0;
    }
    free_strv(pats, npats);
    if (r < 0 || g.err < 0) {
        free_strv(g.found, g.n);
        if (r == -EINVAL || r == -E2BIG) {
            conch_fs__fail_param(ferr, "pattern",
                                 r == -EINVAL ? "param 'pattern' may not contain '..'"
                                              : "param 'pattern' expands to too many patterns");
            return NULL;
        }
        return oom(ferr);
    }
    sort_unique(g.found, &g.n);
    json_t *paths = json_array(), *entries = details ? json_array() : NULL;
    for (size_t i = 0; paths && i < g.n && i < g.max; i++) {
        _cleanup_free_ char *rel = conch_fs__path_join(base, g.found[i]);
        _cleanup_free_ char *shownp = rel ? conch_fs__path_display(ctx, rel) : NULL;
        json_t *s = shownp ? conch_fs__json_text(shownp, strlen(shownp)) : NULL;
        if (!s || json_array_append_new(paths, s) < 0) {
            json_decref(paths);
            paths = NULL;
            break;
        }
        /* details: what fs.ls says of each, so that a caller needs no fs.ls per directory
         * (gone since the walk: listed in paths, not in entries) */
        struct stat st;
        if (!entries || fstatat(dfd, g.found[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        char type[2] = {conch_fs__type_letter(st.st_mode), '\0'};
        json_t *e = json_pack("{s:O, s:s, s:I, s:f}", "path", s, "type", type, "size",
                              (json_int_t)st.st_size, "mtime",
                              (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9);
        if (!e || json_array_append_new(entries, e) < 0) {
            json_decref(paths);
            paths = NULL;
        }
    }
    bool truncated = g.truncated || g.n > g.max;
    free_strv(g.found, g.n);
    json_t *res = paths ? json_pack("{s:o, s:b}", "paths", paths, "truncated", truncated) : NULL;
    if (res && entries && json_object_set_new(res, "entries", entries) < 0) {
        json_decref(res);
        res = NULL;
    } else if (!res) {
        json_decref(entries);
    }
    return res ? res : oom(ferr);
}

/* Whether @path's components match the pattern components @pc ("**" = any number). */
static bool match_comps(char *const *pc, size_t np, const char *path)
{
    if (np == 0)
        return *path == '\0';
    if (strcmp(pc[0], "**") == 0) {
        if (match_comps(pc + 1, np - 1, path))
            return true;
        if (!*path)
            return false;
        const char *slash = strchr(path, '/');
        return match_comps(pc, np, slash ? slash + 1 : "");
    }
    if (!*path)
        return false;
    size_t len = strcspn(path, "/");
    char comp[NAME_MAX + 1];
    if (len > NAME_MAX)
        return false;
    memcpy(comp, path, len);
    comp[len] = '\0';
    if (fnmatch(pc[0], comp, 0) != 0)
        return false;
    return match_comps(pc + 1, np - 1, path[len] ? path + len + 1 : "");
}

struct filter {
    char **comps; /* NULL: match the base name with @pat */
    size_t ncomps;
    char *pat;
};

struct grepper {
    const struct conch_fs__ctx *ctx;
    const char *base; /* the start directory, relative to the root */
    bool fixed;       /* memmem; otherwise @re */
    const char *needle;
    size_t needle_len;
    regex_t re;
    struct filter *filters;
    size_t nfilters;
    json_t *matches;
    size_t max;
    bool truncated;
    int err;
};

static bool grep_stop(const struct grepper *g)
{
    return g->truncated || g->err;
}

static bool filter_ok(const struct grepper *g, const char *rel, const char *name)
{
    if (g->nfilters == 0)
        return true;
    for (size_t i = 0; i < g->nfilters; i++) {
        const struct filter *f = &g->filters[i];
        if (f->comps ? match_comps(f->comps, f->ncomps, rel) : fnmatch(f->pat, name, 0) == 0)
            return true;
    }
    return false;
}

static void grep_add(struct grepper *g, const char *rel, long long line, const char *text,
                     size_t len)
{
    if (json_array_size(g->matches) == g->max) {
        g->truncated = true;
        return;
    }
    if (len > MAX_MATCH_TEXT) {
        /* Cut on a character boundary, not inside a UTF-8 sequence. */
        len = MAX_MATCH_TEXT;
        while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80)
            len--;
    }
    _cleanup_free_ char *full = conch_fs__path_join(g->base, rel);
    _cleanup_free_ char *shown = full ? conch_fs__path_display(g->ctx, full) : NULL;
    json_t *jp = shown ? conch_fs__json_text(shown, strlen(shown)) : NULL;
    json_t *jt = conch_fs__json_text(text, len);
    json_t *m = NULL;
    if (jp && jt)
        m = json_pack("{s:o, s:I, s:o}", "path", jp, "line", (json_int_t)line, "text", jt);
    else {
        json_decref(jp);
        json_decref(jt);
    }
    if (!m || json_array_append_new(g->matches, m) < 0)
        g->err = -ENOMEM;
}

/* Search one file's bytes; @rel names it (relative to the grep's start) in results. */
static void grep_buf(struct grepper *g, const char *rel, const char *buf, size_t len)
{
    if (memchr(buf, '\0', len < CONCH_FS__BINARY_PROBE ? len : CONCH_FS__BINARY_PROBE))
        return;
    size_t pos = 0, lstart = 0; /* @pos is always the start of a line */
    long long line = 1;
    while (pos < len && !grep_stop(g)) {
        size_t at;
        if (g->fixed) {
            const char *hit = memmem(buf + pos, len - pos, g->needle, g->needle_len);
            if (!hit)
                break;
            at = (size_t)(hit - buf);
        } else {
            /* REG_STARTEND: the length bounds the search (NULs past the probe are
             * ordinary bytes), and a start after a '\n' still matches '^'. */
            regmatch_t m = {.rm_so = (regoff_t)pos, .rm_eo = (regoff_t)len};
            if (regexec(&g->re, buf, 1, &m, REG_STARTEND) != 0)
                break;
            at = (size_t)m.rm_so;
        }
        for (const char *nl; (nl = memchr(buf + lstart, '\n', at - lstart));) {
            lstart = (size_t)(nl - buf) + 1;
            line++;
        }
        const char *nl = memchr(buf + lstart, '\n', len - lstart);
        size_t lend = nl ? (size_t)(nl - buf) : len;
        grep_add(g, rel, line, buf + lstart, lend - lstart);
        if (!nl)
            break;
        pos = lstart = lend + 1;
        line++;
    }
}

static void grep_file(struct grepper *g, int dfd, const char *name, const char *rel)
{
    _cleanup_close_ int fd =
        openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > CONCH_FS_MAX_FILE)
        return;
    _cleanup_free_ char *buf = NULL;
    size_t len;
    if (conch_fs__read_fd(fd, CONCH_FS_MAX_FILE, &buf, &len) < 0)
        return;
    grep_buf(g, rel, buf, len);
}

static void grep_dir(struct grepper *g, int dfd, const char *prefix, int depth)
{
    struct dent *ents = NULL;
    size_t n = 0;
    if (list_dir(dfd, &ents, &n) < 0)
        return;
    for (size_t i = 0; i < n && !grep_stop(g); i++) {
        /* ripgrep's default: hidden files and directories (.git) are not searched. */
        if (ents[i].name[0] == '.' || !(ents[i].dir || ents[i].reg))
            continue;
        _cleanup_free_ char *rel = conch_fs__path_join(prefix, ents[i].name);
        if (!rel) {
            g->err = -ENOMEM;
            break;
        }
        if (ents[i].dir) {
            if (depth >= CONCH_FS_MAX_DEPTH)
                continue;
            _cleanup_close_ int sub = open_subdir(dfd, ents[i].name);
            if (sub >= 0)
                grep_dir(g, sub, rel, depth + 1);
        } else if (filter_ok(g, rel, ents[i].name)) {
            grep_file(g, dfd, ents[i].name, rel);
        }
    }
    free_dents(ents, n);
}

/* An ERE matching @s literally, for case-insensitive fixed strings (REG_ICASE does the
 * case folding; there is no case-insensitive memmem). */
static char *ere_escape(const char *s)
{
    char *out = malloc(strlen(s) * 2 + 1), *o = out;
    if (!out)
        return NULL;
    for (; *s; s++) {
        if (strchr(".[]()*+?{}|^$\\", *s))
            *o++ = '\\';
        *o++ = *s;
    }
    *o = '\0';
    return out;
}

static void free_filters(struct filter *f, size_t n)
{
    for (size_t i = 0; f && i < n; i++) {
        free_strv(f[i].comps, f[i].ncomps);
        free(f[i].pat);
    }
    free(f);
}

static int make_filters(const char *glob, struct filter **ret, size_t *ret_n)
{
    char **pats = NULL;
    size_t npats = 0, cap = 0;
    int r = expand_braces(glob, &pats, &npats, &cap);
    struct filter *f = r == 0 ? calloc(npats ? npats : 1, sizeof(*f)) : NULL;
    if (r == 0 && !f)
        r = -ENOMEM;
    for (size_t i = 0; r == 0 && i < npats; i++) {
        if (strchr(pats[i], '/'))
            r = split_pattern(pats[i], &f[i].comps, &f[i].ncomps);
        f[i].pat = TAKE_PTR(pats[i]);
    }
    free_strv(pats, npats);
    if (r < 0) {
        free_filters(f, npats);
        return r;
    }
    *ret = f;
    *ret_n = npats;
    return 0;
}

json_t *conch_fs__grep(const struct conch_fs__ctx *ctx, json_t *params, struct conch_fs_error *ferr)
{
    static const char *const keys[] = {"pattern",     "path",        "glob", "fixed_string",
                                       "ignore_case", "max_matches", NULL};
    const char *pattern, *path, *glob;
    size_t patlen, plen, globlen;
    bool fixed, icase;
    long long max;
    if (conch_fs__params_check(params, keys, ferr) < 0 ||
        conch_fs__param_str(params, "pattern", true, &pattern, &patlen, ferr) < 0 ||
        conch_fs__param_str(params, "path", false, &path, &plen, ferr) < 0 ||
        conch_fs__param_str(params, "glob", false, &glob, &globlen, ferr) < 0 ||
        conch_fs__param_bool(params, "fixed_string", false, &fixed, ferr) < 0 ||
        conch_fs__param_bool(params, "ignore_case", false, &icase, ferr) < 0 ||
        conch_fs__param_int(params, "max_matches", 1000, 1, CONCH_FS_MAX_RESULTS, &max, ferr) < 0)
        return NULL;
    if (strlen(pattern) != patlen) {
        conch_fs__fail_param(ferr, "pattern", "param 'pattern' contains a NUL byte");
        return NULL;
    }
    if (glob && (globlen == 0 || strlen(glob) != globlen)) {
        conch_fs__fail_param(ferr, "glob", "param 'glob' must be non-empty, without NUL");
        return NULL;
    }
    if (!path) {
        path = "";
        plen = 0;
    }
    _cleanup_free_ char *base = NULL;
    if (conch_fs__path_parse(ctx, path, plen, true, &base, ferr) < 0)
        return NULL;
    const char *shown = *path ? path : conch_fs__default_shown(ctx);

    struct grepper g = {.ctx = ctx, .base = base, .max = (size_t)max};
    if (fixed && !icase) {
        g.fixed = true;
        g.needle = pattern;
        g.needle_len = patlen;
    } else {
        _cleanup_free_ char *escaped = fixed ? ere_escape(pattern) : NULL;
        if (fixed && !escaped)
            return oom(ferr);
        int flags = REG_EXTENDED | REG_NEWLINE | (icase ? REG_ICASE : 0);
        int rc = regcomp(&g.re, fixed ? escaped : pattern, flags);
        if (rc != 0) {
            char msg[256];
            regerror(rc, &g.re, msg, sizeof(msg));
            conch_fs__fail_param(ferr, "pattern", "param 'pattern' is not a valid regex: %s", msg);
            return NULL;
        }
    }
    json_t *res = NULL;
    int fd = -1;
    if (glob && make_filters(glob, &g.filters, &g.nfilters) < 0) {
        conch_fs__fail_param(ferr, "glob", "param 'glob' is not a usable pattern");
        goto out;
    }
    g.matches = json_array();
    if (!g.matches) {
        oom(ferr);
        goto out;
    }
    fd = conch_fs__open(ctx->root_fd, base, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        conch_fs__fail_errno(ferr, fd < 0 ? -fd : errno, "grep", shown);
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        /* @base is the start: results are "base/rel". */
        grep_dir(&g, fd, "", 0);
    } else if (S_ISREG(st.st_mode)) {
        /* An explicit file is searched whatever its name; results are "base". */
        const char *slash = strrchr(base, '/');
        _cleanup_free_ char *dir = slash ? strndup(base, (size_t)(slash - base)) : strdup("");
        _cleanup_free_ char *buf = NULL;
        size_t len;
        if (!dir) {
            oom(ferr);
            goto out;
        }
        if (conch_fs__read_file(ctx, base, shown, &buf, &len, ferr) < 0)
            goto out;
        g.base = dir;
        grep_buf(&g, slash ? slash + 1 : base, buf, len);
        g.base = base;
    } else {
        conch_fs__fail(ferr, CONCH_FS_IO_ERROR, "'%s' is not a regular file", shown);
        goto out;
    }
    if (g.err) {
        oom(ferr);
        goto out;
    }
    res = json_pack("{s:O, s:b}", "matches", g.matches, "truncated", g.truncated);
    if (!res)
        oom(ferr);
out:
    if (fd >= 0)
        close(fd);
    json_decref(g.matches);
    free_filters(g.filters, g.nfilters);
    if (!g.fixed)
        regfree(&g.re);
    return res;
}
