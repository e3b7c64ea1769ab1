/* test_cli.c - unit tests of the one option parser every verb uses (src/cli/opts.c): values
 * as --opt=V or --opt V, bundled short flags, where options end, and error messages that name
 * the offending word; the remote daemon's options and URLs (src/cli/remote-conn.c). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/conn.h"
#include "cli/opts.h"

enum { K_SOCKET = 1, K_JSON, K_INTERACTIVE, K_TTY, K_USER };

struct seen {
    const char *socket, *user;
    bool json, interactive, tty;
    int calls;
};

static int handler(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct seen *s = ctx;
    s->calls++;
    switch (key) {
    case K_SOCKET:
        s->socket = value;
        break;
    case K_JSON:
        s->json = true;
        break;
    case K_INTERACTIVE:
        s->interactive = true;
        break;
    case K_TTY:
        s->tty = true;
        break;
    case K_USER:
        s->user = value;
        break;
    }
    return 0;
}

static const struct conch_cli_opt table[] = {
    {"socket", 0, true, K_SOCKET},
    {"json", 'j', false, K_JSON},
    {"interactive", 'i', false, K_INTERACTIVE},
    {"tty", 't', false, K_TTY},
    {"user", 'u', true, K_USER},
    {NULL, 0, false, 0},
};

/* Parse the NULL-terminated words (the verb first) into @s and @spec. */
static int parse(struct seen *s, struct conch_sandbox_spec *spec, unsigned spec_opts, char **argv,
                 int *ret_optind, struct conch_err *err)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    memset(s, 0, sizeof(*s));
    const struct conch_cli_parser p = {.verb = "test",
                                       .table = table,
                                       .handler = handler,
                                       .ctx = s,
                                       .spec_opts = spec_opts,
                                       .spec = spec};
    *ret_optind = -1;
    return conch_cli_opts_parse(&p, argc, argv, ret_optind, err);
}

#define WORDS(...) ((char *[]){__VA_ARGS__, NULL})

Test(opts, a_value_with_an_equals_sign_or_apart)
{
    struct seen s;
    struct conch_err err = {0};
    int i;
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--socket=/a/b", "ID"), &i, &err), 0);
    cr_assert_str_eq(s.socket, "/a/b");
    cr_assert_eq(i, 2);
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--socket", "/a/b", "ID"), &i, &err), 0);
    cr_assert_str_eq(s.socket, "/a/b");
    cr_assert_eq(i, 3);
    /* An empty value, and a value that looks like an option, are values. */
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--socket="), &i, &err), 0);
    cr_assert_str_eq(s.socket, "");
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--socket", "--json"), &i, &err), 0);
    cr_assert_str_eq(s.socket, "--json");
    cr_assert_not(s.json);
    cr_assert_eq(i, 3);
}

Test(opts, short_flags_bundle)
{
    struct seen s;
    struct conch_err err = {0};
    int i;
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "-it", "ID"), &i, &err), 0, "%s", err.msg);
    cr_assert(s.interactive && s.tty);
    cr_assert_eq(i, 2);
    /* A short option with a value takes the rest of the word, or the next one. */
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "-jualice"), &i, &err), 0);
    cr_assert(s.json);
    cr_assert_str_eq(s.user, "alice");
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "-ju", "bob", "X"), &i, &err), 0);
    cr_assert_str_eq(s.user, "bob");
    cr_assert_eq(i, 3);
}

Test(opts, options_end_at_the_first_operand_or_after_dashdash)
{
    struct seen s;
    struct conch_err err = {0};
    int i;
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--json", "CMD", "--socket", "x"), &i, &err), 0);
    cr_assert_eq(i, 2);
    cr_assert_null(s.socket); /* the command's own options */
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--json", "--", "--socket", "x"), &i, &err), 0);
    cr_assert_eq(i, 3);
    cr_assert_null(s.socket);
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "-", "--json"), &i, &err), 0);
    cr_assert_eq(i, 1);
    cr_assert_not(s.json);
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--json"), &i, &err), 0);
    cr_assert_eq(i, 2); /* argc: no operand */
}

/* The words must be refused with @msg as the whole message. */
static void refused(char **argv, const char *msg)
{
    struct seen s;
    struct conch_err err = {0};
    int i;
    cr_assert_lt(parse(&s, NULL, 0, argv, &i, &err), 0, "%s was taken", argv[1]);
    cr_assert_eq(err.kind, CONCH_ERR_USAGE);
    cr_assert_str_eq(err.msg, msg);
}

Test(opts, errors_name_the_offending_word)
{
    refused(WORDS("test", "-xt"), "unknown option '-x' (in '-xt')");
    refused(WORDS("test", "-tx"), "unknown option '-x' (in '-tx')");
    refused(WORDS("test", "-x"), "unknown option '-x'");
    refused(WORDS("test", "--bogus", "ID"), "unknown option '--bogus'");
    /* The value is not quoted back: it may be a secret. */
    refused(WORDS("test", "--bogus=s3cret"), "unknown option '--bogus'");
    refused(WORDS("test", "--socket"), "option '--socket' needs a value");
    refused(WORDS("test", "-u"), "option '-u' needs a value");
    refused(WORDS("test", "--json=yes"), "option '--json' takes no value");
    /* No abbreviations: an option added later must not change what a word means. */
    refused(WORDS("test", "--sock", "x"), "unknown option '--sock'");
    /* A spec option the verb does not take is unknown to it. */
    refused(WORDS("test", "--memory", "1G"), "unknown option '--memory'");
}

Test(opts, help)
{
    struct seen s;
    struct conch_err err = {0};
    int i;
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--help"), &i, &err), 1);
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "--json", "-h", "x"), &i, &err), 1);
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "-jh"), &i, &err), 1);
    /* After the options, --help is an operand (the command's). */
    cr_assert_eq(parse(&s, NULL, 0, WORDS("test", "CMD", "--help"), &i, &err), 0);
    cr_assert_eq(i, 1);
}

Test(opts, spec_options_go_to_the_spec)
{
    struct seen s;
    struct conch_sandbox_spec spec;
    conch_spec_defaults(&spec);
    struct conch_err err = {0};
    int i;
    char env1[] = "--env=TOKEN=s3cret", env2[] = "A=b";
    unsigned which = CONCH_SPEC_OPT_DISK | CONCH_SPEC_OPT_ENV | CONCH_SPEC_OPT_AS_ROOT |
                     CONCH_SPEC_OPT_WORKSPACE;
    cr_assert_eq(parse(&s, &spec, which,
                       WORDS("test", "--disk=1M", "--as-root", env1, "--env", env2, "--workspace",
                             "/w", "--json", "--", "CMD"),
                       &i, &err),
                 0, "%s", err.msg);
    cr_assert_eq(spec.disk_bytes, 1 << 20);
    cr_assert(spec.as_root);
    cr_assert(s.json);
    cr_assert_str_eq(spec.workspace, "/w");
    cr_assert_str_eq(json_string_value(json_object_get(spec.env, "TOKEN")), "s3cret");
    cr_assert_str_eq(json_string_value(json_object_get(spec.env, "A")), "b");
    /* The values are blanked where `ps` shows our argv. */
    cr_assert_str_eq(env1, "--env=TOKEN=******");
    cr_assert_str_eq(env2, "A=*");
    cr_assert_eq(i, 10);
    conch_spec_done(&spec);
    /* --disk 1M and --disk=1M alike; a bad value names the option. */
    conch_spec_defaults(&spec);
    cr_assert_eq(parse(&s, &spec, which, WORDS("test", "--disk", "2M"), &i, &err), 0);
    cr_assert_eq(spec.disk_bytes, 2 << 20);
    cr_assert_lt(parse(&s, &spec, which, WORDS("test", "--disk=lots"), &i, &err), 0);
    cr_assert(strstr(err.msg, "--disk: 'lots'"), "%s", err.msg);
    conch_spec_done(&spec);
}

/* The daemon's messages name protocol methods; a person at the command line gets verbs. */
Test(error_text, methods_become_verbs)
{
    char *t = conch_cli_error_text("no session 'x' (session.list shows them)");
    cr_assert_str_eq(t, "no session 'x' ('conch sessions' shows them)");
    free(t);
    t = conch_cli_error_text("sandbox 'sb-1' is stopped (...): only workspace.* and "
                             "sandbox.destroy work on it");
    cr_assert(strstr(t, "'conch start' brings it back") != NULL, "%s", t);
    cr_assert(strstr(t, "workspace.") == NULL && strstr(t, "sandbox.destroy") == NULL, "%s", t);
    free(t);
    t = conch_cli_error_text("the name 'dev' is taken by sandbox sb-1: choose another, or remove "
                             "that one first (sandbox.destroy)");
    cr_assert(strstr(t, "('conch rm')") != NULL, "%s", t);
    free(t);
    t = conch_cli_error_text("free room with fs.delete, or: fs.deleted is no method");
    cr_assert_str_eq(t, "free room with 'conch exec ID -- rm', or: fs.deleted is no method");
    free(t);
    t = conch_cli_error_text("");
    cr_assert_str_eq(t, "");
    free(t);
}

/* The remote daemon's options (remote-conn.c): taken by the verbs with --socket, not by run. */
Test(remote, verbs_with_a_socket_take_remote_and_token_file)
{
    struct seen s;
    struct conch_err err = {0};
    int ind;
    cr_assert_null(conch_cli_remote_url());
    cr_assert_eq(
        parse(&s, NULL, 0, WORDS("test", "--remote", "wss://h.example:8443", "id"), &ind, &err), 0,
        "%s", err.msg);
    cr_assert_str_eq(conch_cli_remote_url(), "wss://h.example:8443");
    cr_assert(conch_cli_remote_given());
    cr_assert_eq(ind, 3);

    /* `conch run` stays local: --remote is no option of it. */
    const struct conch_cli_parser run = {
        .verb = "run", .table = table, .handler = handler, .ctx = &s};
    char **w = WORDS("run", "--remote", "wss://h:1", "--", "true");
    cr_assert_lt(conch_cli_opts_parse(&run, 5, w, &ind, &err), 0);
    cr_assert(strstr(err.msg, "unknown option '--remote'"), "%s", err.msg);
}

Test(remote, no_token_option_and_the_value_is_not_echoed)
{
    struct seen s;
    struct conch_err err = {0};
    int ind;
    cr_assert_lt(parse(&s, NULL, 0, WORDS("test", "--token", "sekrit-value", "id"), &ind, &err), 0);
    cr_assert(strstr(err.msg, "/proc/PID/cmdline"), "%s", err.msg);
    cr_assert_null(strstr(err.msg, "sekrit"), "%s", err.msg);
    cr_assert_lt(parse(&s, NULL, 0, WORDS("test", "--token=sekrit-value", "id"), &ind, &err), 0);
    cr_assert_null(strstr(err.msg, "sekrit"), "%s", err.msg);
}

Test(remote, urls)
{
    struct conch_err err = {0};
    static const char *const good[] = {"wss://h", "wss://h:1", "wss://h.example:65535/rpc",
                                       "wss://[::1]:8443", "wss://127.0.0.1:9/x/y"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        cr_assert_eq(conch_cli_remote_set_url(good[i], &err), 0, "%s: %s", good[i], err.msg);
    static const char *const bad[] = {"ws://h:1",      "https://h",     "wss://",
                                      "wss://:80",     "wss://h:0",     "wss://h:65536",
                                      "wss://h:x",     "wss://u:p@h:1", "wss://[::1:80",
                                      "wss://h:1?t=1", "h:1",           ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memset(&err, 0, sizeof(err));
        cr_assert_lt(conch_cli_remote_set_url(bad[i], &err), 0, "'%s' was accepted", bad[i]);
        cr_assert(err.msg[0]);
    }
    memset(&err, 0, sizeof(err));
    conch_cli_remote_set_url("wss://u:secret@h:1", &err);
    cr_assert_null(strstr(err.msg, "secret"), "%s", err.msg);
}

Test(remote, token_file_must_be_private)
{
    char path[] = "/tmp/conch-test-token-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "tok\n", 4), 4);
    close(fd);
    struct conch_err err = {0};
    chmod(path, 0644);
    cr_assert_lt(conch_cli_remote_set_token_file(path, &err), 0);
    cr_assert(strstr(err.msg, "chmod 600"), "%s", err.msg);
    chmod(path, 0600);
    memset(&err, 0, sizeof(err));
    cr_assert_eq(conch_cli_remote_set_token_file(path, &err), 0, "%s", err.msg);
    unlink(path);
    cr_assert_lt(conch_cli_remote_set_token_file("/nonexistent/token", &err), 0);
    cr_assert_lt(conch_cli_remote_set_token_file("/tmp", &err), 0);
}
