/* doctor.c - `conch doctor`: run every feature probe and report, as text or JSON, which
 * kernel fences this machine allows and how to fix the missing ones; in a container or a
 * Kubernetes pod, which of its settings (securityContext) to grant, the narrowest first. */
#include <errno.h>
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
/* The container settings doctor can name (see container_advice). */
#define MAX_SETTINGS 5

static void usage(FILE *f)
{
    fputs("usage: conch doctor [--json]\n"
          "\n"
          "Try each kernel feature conch's sandbox uses (namespaces, overlayfs, seccomp,\n"
          "Landlock, cgroups, ...) and print what works, with a fix for what does not, and\n"
          "whether each network mode (none, allow, host) can be built here. In a container\n"
          "or a Kubernetes pod, also which of its settings (the pod's securityContext) to\n"
          "grant for what failed, the narrowest first.\n"
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

/* Whether @r failed because something refused a call (a seccomp filter, an LSM, a masked
 * /proc), rather than because the kernel lacks the feature. */
static bool refused(const struct conch_probe_result *r)
{
    return r->state == CONCH_PROBE_MISSING &&
           (strstr(r->detail, strerror(EPERM)) || strstr(r->detail, strerror(ENOSYS)) ||
            strstr(r->detail, strerror(EACCES)));
}

/* The probes that need what a container's defaults may refuse: namespaces, mounts, a
 * hostname, setns, a new /proc. */
static bool namespace_probe(const char *name)
{
    static const char *const names[] = {
        CONCH_PROBE_USERNS, "mount namespace",  "pid namespace",     CONCH_PROBE_UTS,
        CONCH_PROBE_SETNS,  CONCH_PROBE_PROCFS, "network mode none", "overlay in a user namespace"};
    for (size_t i = 0; i < ARRAY_SIZE(names); i++)
        if (!strcmp(name, names[i]))
            return true;
    return false;
}

/* Append "name" to a list of probe names in @buf. */
static void list_add(char *buf, size_t len, const char *name)
{
    size_t used = strlen(buf);
    snprintf(buf + used, len - used, "%s%s", used ? ", " : "", name);
}

/*
 * Map the failed probes to the container settings that grant them, the narrowest first:
 * an own user namespace (which makes every later grant count only inside it), an unmasked
 * /proc, a seccomp profile, an AppArmor profile; a capability never (conch runs with none).
 * Fills up to MAX_SETTINGS entries of @out (static strings and @out's own buffers).
 */
static int container_advice(const struct conch_probe_result *res, int n,
                            const struct conch_probe_env *env, struct conch_probe_result *out)
{
    char refused_by[256] = "", proc_failed[128] = "", any_failed[256] = "";
    for (int i = 0; i < n; i++) {
        if (res[i].state != CONCH_PROBE_MISSING || !namespace_probe(res[i].name))
            continue;
        list_add(any_failed, sizeof(any_failed), res[i].name);
        /* A new /proc is refused for a masked /proc too: that is procMount's, below. */
        bool masked = !strcmp(res[i].name, CONCH_PROBE_PROCFS) && env->proc_covered > 0;
        if (refused(&res[i]) && !masked)
            list_add(refused_by, sizeof(refused_by), res[i].name);
        if (!strcmp(res[i].name, CONCH_PROBE_PROCFS))
            list_add(proc_failed, sizeof(proc_failed), res[i].detail);
    }
    bool need_proc = proc_failed[0] && env->proc_covered > 0;
    bool need_seccomp = refused_by[0] && env->seccomp == 2;
    bool confined = env->apparmor[0] && strncmp(env->apparmor, "unconfined", 10);
    bool need_apparmor = refused_by[0] && confined;
    int k = 0;
    struct conch_probe_result *r;

    r = memset(&out[k++], 0, sizeof(*out));
    r->name = "hostUsers: false";
    r->required = need_proc;
    r->state = env->own_userns ? CONCH_PROBE_OK
               : any_failed[0] ? CONCH_PROBE_MISSING
                               : CONCH_PROBE_OK;
    snprintf(r->detail, sizeof(r->detail), "%s",
             env->own_userns ? "the container has a user namespace of its own"
                             : "the container shares the host's user namespace");
    if (r->state != CONCH_PROBE_OK)
        snprintf(r->fix, sizeof(r->fix),
                 "Kubernetes 1.30+ with user-namespace support: spec.hostUsers: false (the pod's "
                 "root is nobody on the node; procMount: Unmasked requires it)\n"
                 "podman: --userns=auto; docker: dockerd --userns-remap");

    r = memset(&out[k++], 0, sizeof(*out));
    r->name = "procMount: Unmasked";
    r->required = need_proc;
    r->state = need_proc ? CONCH_PROBE_MISSING : CONCH_PROBE_OK;
    if (env->proc_covered)
        snprintf(r->detail, sizeof(r->detail), "%d paths masked or read-only under /proc (%s...)",
                 env->proc_covered, env->proc_example);
    else
        snprintf(r->detail, sizeof(r->detail), "/proc is fully visible");
    if (need_proc)
        snprintf(r->fix, sizeof(r->fix),
                 "Kubernetes: securityContext.procMount: Unmasked (with hostUsers: false); the "
                 "sandboxes mount their own /proc, which the kernel refuses while this one is "
                 "masked\npodman: --security-opt unmask=/proc/*; docker: --security-opt "
                 "systempaths=unconfined");

    r = memset(&out[k++], 0, sizeof(*out));
    r->name = "seccompProfile";
    r->required = need_seccomp;
    r->state = need_seccomp ? CONCH_PROBE_MISSING : CONCH_PROBE_OK;
    if (need_seccomp)
        snprintf(r->detail, sizeof(r->detail), "a seccomp filter is on; refused: %s", refused_by);
    else
        snprintf(r->detail, sizeof(r->detail), "%s",
                 env->seccomp == 2 ? "a seccomp filter is on and allows what conch needs"
                                   : "no seccomp filter");
    if (need_seccomp)
        snprintf(r->fix, sizeof(r->fix),
                 "Kubernetes: securityContext.seccompProfile: {type: Localhost, "
                 "localhostProfile: conch.json} with deploy/seccomp/conch.json on each node "
                 "(the runtime's default plus sethostname, setdomainname, setns; RuntimeDefault "
                 "also refuses unshare and mount), else {type: Unconfined}\n"
                 "podman: --security-opt seccomp=deploy/seccomp/conch.json");

    r = memset(&out[k++], 0, sizeof(*out));
    r->name = "appArmorProfile";
    r->required = need_apparmor;
    r->state = need_apparmor ? CONCH_PROBE_MISSING : CONCH_PROBE_OK;
    snprintf(r->detail, sizeof(r->detail), "%s%s%s", confined ? "confined by '" : "",
             confined ? env->apparmor : "not confined by AppArmor", confined ? "'" : "");
    if (need_apparmor)
        snprintf(r->fix, sizeof(r->fix),
                 "Kubernetes 1.30+: securityContext.appArmorProfile: {type: Localhost} with a "
                 "profile that allows 'userns,' and 'mount,', else {type: Unconfined}\n"
                 "podman/docker: --security-opt apparmor=unconfined");

    r = memset(&out[k++], 0, sizeof(*out));
    r->name = "capabilities";
    r->required = false;
    r->state = CONCH_PROBE_OK;
    snprintf(r->detail, sizeof(r->detail),
             "none needed: conch serve runs as a non-root user with drop: [ALL]%s",
             any_failed[0] && !need_proc && !need_seccomp && !need_apparmor
                 ? "; what failed is not a container setting (see the fix: lines above)"
                 : "");
    return k;
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

    struct conch_probe_result res[MAX_PROBES + MAX_SETTINGS];
    int n = conch_probe_all(res, MAX_PROBES);
    bool ok = true;
    for (int i = 0; i < n; i++)
        if (res[i].required && res[i].state != CONCH_PROBE_OK)
            ok = false;
    /* In a container, what failed is mapped to the settings that grant it. */
    struct conch_probe_env env;
    conch_probe_env(&env);
    int nset = env.container && !ok ? container_advice(res, n, &env, res + n) : 0;

    if (json) {
        if (print_json(res, n + nset) < 0) {
            fprintf(stderr, "conch doctor: out of memory formatting JSON\n");
            return 1;
        }
    } else {
        print_text(res, n);
        if (nset) {
            printf("\nIn a %s (%s): grant these settings (the pod's securityContext), the "
                   "narrowest first:\n",
                   env.kubernetes ? "Kubernetes pod" : "container", env.why);
            print_text(res + n, nset);
        }
        printf("\n%s\n",
               ok ? "conch can run here."
                  : "conch cannot run here: a required feature is missing (see fix: lines).");
    }
    fflush(stdout);
    return ok ? 0 : 1;
}
