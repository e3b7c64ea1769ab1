/* store.c - `conch store list|ls|cat|put|rm`: the daemon's named stores from the command line
 * (docs/PROTOCOL.md, store.*), each a thin client of one JSON-RPC call, with --json for
 * scripts. File contents travel as base64, so that any bytes go through. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "core/fsutil.h"
#include "fs/fs.h"
#include "workspace/workspace.h"

static const char usage[] =
    "usage: conch store [--socket PATH] [--json] list\n"
    "       conch store [--socket PATH] [--json] ls STORE [PATH]\n"
    "       conch store [--socket PATH] cat STORE PATH\n"
    "       conch store [--socket PATH] [--json] put STORE PATH [FILE]   (FILE '-' or none: "
    "stdin)\n"
    "       conch store [--socket PATH] [--json] rm STORE PATH\n"
    "\n"
    "The daemon's named stores: files kept in SQLite that sandboxes mount as directories\n"
    "(type=store,name=STORE,target=/DIR among their mounts). Changes made inside are\n"
    "written back after each command; these verbs read and change a store from the host.\n";

static void print_json(json_t *res)
{
    char *s = json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s)
        puts(s);
    free(s);
}

/* A name as a terminal may show it: control bytes escaped (names are data). */
static void print_name(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static int do_list(struct conch_cli_conn *c, const struct conch_cli_sock_json *o)
{
    json_t *res = conch_cli_conn_call(c, "store.list", json_object());
    if (!res)
        return 1;
    if (o->json) {
        print_json(res);
    } else {
        size_t i;
        json_t *e;
        printf("%-24s %8s %12s %12s\n", "STORE", "ENTRIES", "BYTES", "CAP");
        json_array_foreach(json_object_get(res, "stores"), i, e)
        {
            printf("%-24s %8lld %12lld %12lld\n", json_string_value(json_object_get(e, "name")),
                   (long long)json_integer_value(json_object_get(e, "entries")),
                   (long long)json_integer_value(json_object_get(e, "bytes")),
                   (long long)json_integer_value(json_object_get(e, "max_bytes")));
        }
    }
    json_decref(res);
    return 0;
}

static int do_ls(struct conch_cli_conn *c, const struct conch_cli_sock_json *o, const char *store,
                 const char *path)
{
    json_t *res =
        conch_cli_conn_call(c, "store.ls", json_pack("{s:s,s:s}", "store", store, "path", path));
    if (!res)
        return 1;
    if (o->json) {
        print_json(res);
    } else {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(res, "entries"), i, e)
        {
            bool dir = !strcmp(json_string_value(json_object_get(e, "type")) ?: "", "dir");
            printf("%04llo %10lld  ",
                   (unsigned long long)json_integer_value(json_object_get(e, "mode")),
                   (long long)json_integer_value(json_object_get(e, "size")));
            print_name(json_string_value(json_object_get(e, "name")) ?: "");
            puts(dir ? "/" : "");
        }
    }
    json_decref(res);
    return 0;
}

static int do_cat(struct conch_cli_conn *c, const char *store, const char *path)
{
    json_t *res = conch_cli_conn_call(
        c, "store.read",
        json_pack("{s:s,s:s,s:s}", "store", store, "path", path, "encoding", "base64"));
    if (!res)
        return 1;
    json_t *content = json_object_get(res, "content");
    unsigned char *buf = NULL;
    size_t len = 0;
    int r = conch_fs_base64_decode(json_string_value(content) ?: "", json_string_length(content),
                                   &buf, &len);
    json_decref(res);
    if (r < 0) {
        fprintf(stderr, "conch store cat: the daemon's answer was not base64\n");
        return CONCH_EXIT_INFRA;
    }
    r = conch_write_all(STDOUT_FILENO, buf, len);
    free(buf);
    if (r < 0) {
        fprintf(stderr, "conch store cat: write: %s\n", strerror(-r));
        return 1;
    }
    return 0;
}

static int do_put(struct conch_cli_conn *c, const struct conch_cli_sock_json *o, const char *store,
                  const char *path, const char *file)
{
    _cleanup_close_ int fd = -1;
    if (file && strcmp(file, "-")) {
        fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "conch store put: '%s': %s\n", file, strerror(errno));
            return 1;
        }
    }
    _cleanup_free_ char *buf = NULL;
    size_t len = 0;
    struct conch_err err = {0};
    if (conch_read_fd(fd >= 0 ? fd : STDIN_FILENO, file ? file : "stdin", CONCH_STORE_FILE_MAX,
                      &buf, &len, &err) < 0) {
        fprintf(stderr, "conch store put: %s\n", err.msg);
        return 1;
    }
    size_t elen = 0;
    _cleanup_free_ char *enc = conch_fs_base64_encode((const unsigned char *)buf, len, &elen);
    if (!enc) {
        fprintf(stderr, "conch store put: out of memory\n");
        return CONCH_EXIT_INFRA;
    }
    json_t *res = conch_cli_conn_call(c, "store.write",
                                      json_pack("{s:s,s:s,s:s%,s:s}", "store", store, "path", path,
                                                "content", enc, elen, "encoding", "base64"));
    if (!res)
        return 1;
    if (o->json)
        print_json(res);
    json_decref(res);
    return 0;
}

static int do_rm(struct conch_cli_conn *c, const struct conch_cli_sock_json *o, const char *store,
                 const char *path)
{
    json_t *res = conch_cli_conn_call(c, "store.delete",
                                      json_pack("{s:s,s:s}", "store", store, "path", path));
    if (!res)
        return 1;
    if (o->json)
        print_json(res);
    json_decref(res);
    return 0;
}

int conch_cli_store(int argc, char **argv)
{
    struct conch_cli_sock_json o = {0};
    const struct conch_cli_parser p = {.verb = "store",
                                       .table = conch_cli_sock_json_opts,
                                       .handler = conch_cli_sock_json_opt,
                                       .ctx = &o};
    struct conch_err err = {0};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("store", usage, "%s", err.msg);
    int n = argc - optind;
    const char *sub = n > 0 ? argv[optind] : NULL;
    char **a = argv + optind + 1;
    n--;
    int want_min, want_max;
    if (!sub)
        return conch_cli_usage_error("store", usage, "which: list, ls, cat, put or rm?");
    if (!strcmp(sub, "list"))
        want_min = 0, want_max = 0;
    else if (!strcmp(sub, "ls"))
        want_min = 1, want_max = 2;
    else if (!strcmp(sub, "cat") || !strcmp(sub, "rm"))
        want_min = 2, want_max = 2;
    else if (!strcmp(sub, "put"))
        want_min = 2, want_max = 3;
    else
        return conch_cli_usage_error("store", usage, "unknown '%s' (list, ls, cat, put, rm)", sub);
    if (n < want_min || n > want_max)
        return conch_cli_usage_error("store", usage, "%s: %s", sub,
                                     n < want_min ? "missing argument" : "unexpected argument");
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    if (!strcmp(sub, "list"))
        r = do_list(&c, &o);
    else if (!strcmp(sub, "ls"))
        r = do_ls(&c, &o, a[0], n > 1 ? a[1] : "");
    else if (!strcmp(sub, "cat"))
        r = do_cat(&c, a[0], a[1]);
    else if (!strcmp(sub, "put"))
        r = do_put(&c, &o, a[0], a[1], n > 2 ? a[2] : NULL);
    else
        r = do_rm(&c, &o, a[0], a[1]);
    conch_cli_conn_close(&c);
    return r;
}
