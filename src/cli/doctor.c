/* doctor.c - `conch doctor`: run every feature probe and report, as text or JSON, which
 * kernel fences this machine allows and how to fix the missing ones. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opts.h"
#include "core/cleanup.h"
#include "jail/probe.h"

#define MAX_PROBES 32

static void usage(FILE *f)
{
    fputs("usage: conch doctor [--json]\n"
          "\n"
          "Try each kernel feature conch's sandbox uses (namespaces, overlayfs, seccomp,\n"
          "Landlock, cgroups, ...) and print what works, with a fix for what does not, and\n"
          "whether each network mode (none, allow, host) can be built here.\n"
          "\n"
          "  --json      print a JSON array of {name, state, required, detail, fix}\n"
          "  -h, --help  show this help\n"
          "\n"
          "Exit status: 0 when every required feature works, 1 otherwise.\n",
          f);
}

static const char *state_name(enum conch_probe_state s)
{
    switch (s) {
    case CONCH_PROBE_OK:
        return "ok";
    case CONCH_PROBE_PARTIAL:
        return "partial";
    case CONCH_PROBE_MISSING:
        break;
    }
    return "missing";
}

static void print_text(const struct conch_probe_result *res, int n)
{
    for (int i = 0; i < n; i++) {
        const struct conch_probe_result *r = &res[i];
        const char *label = r->state == CONCH_PROBE_OK        ? "ok"
                            : r->state == CONCH_PROBE_PARTIAL ? "PARTIAL"
                                                              : "MISSING";
        printf("%-8s%-29s(%s)%s\n", label, r->name, r->detail,
               r->state != CONCH_PROBE_OK && !r->required ? " [optional]" : "");
        /* One "fix:" line per alternative; the probe separates them with newlines. */
        for (const char *p = r->fix; *p;) {
            size_t len = strcspn(p, "\n");
            printf("        fix: %.*s\n", (int)len, p);
            p += len;
            if (*p == '\n')
                p++;
        }
    }
}

static int print_json(const struct conch_probe_result *res, int n)
{
    json_t *arr = json_array();
    if (!arr)
        return -1;
    for (int i = 0; i < n; i++) {
        const struct conch_probe_result *r = &res[i];
        json_t *o =
            json_pack("{s:s, s:s, s:b, s:s, s:s}", "name", r->name, "state", state_name(r->state),
                      "required", r->required, "detail", r->detail, "fix", r->fix);
        if (!o || json_array_append_new(arr, o) < 0) {
            json_decref(arr);
            return -1;
        }
    }
    _cleanup_free_ char *s = json_dumps(arr, JSON_INDENT(2));
    json_decref(arr);
    if (!s)
        return -1;
    puts(s);
    return 0;
}

static int json_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    *(bool *)ctx = true;
    return 0;
}

int conch_cli_doctor(int argc, char **argv)
{
    static const struct conch_cli_opt table[] = {{"json", 0, false, 1}, {NULL, 0, false, 0}};
    bool json = false;
    const struct conch_cli_parser p = {
        .verb = "doctor", .table = table, .handler = json_opt, .ctx = &json};
    struct conch_err err = {0};
    int optind = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &optind, &err);
    if (r == 1) {
        usage(stdout);
        return 0;
    }
    if (r < 0) {
        fprintf(stderr, "conch doctor: %s\n", err.msg);
        usage(stderr);
        return CONCH_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, "conch doctor: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return CONCH_EXIT_USAGE;
    }

    struct conch_probe_result res[MAX_PROBES];
    int n = conch_probe_all(res, MAX_PROBES);
    bool ok = true;
    for (int i = 0; i < n; i++)
        if (res[i].required && res[i].state != CONCH_PROBE_OK)
            ok = false;

    if (json) {
        if (print_json(res, n) < 0) {
            fprintf(stderr, "conch doctor: out of memory formatting JSON\n");
            return 1;
        }
    } else {
        print_text(res, n);
        printf("\n%s\n",
               ok ? "conch can run here."
                  : "conch cannot run here: a required feature is missing (see fix: lines).");
    }
    fflush(stdout);
    return ok ? 0 : 1;
}
