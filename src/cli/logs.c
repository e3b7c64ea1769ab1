/* logs.c - `conch logs`: the output of a daemon job (job.output, read by offset) or session
 * (its scrollback, then session.output notifications), with -f to follow it to its end, as
 * `docker logs -f` follows a container. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/conn.h"
#include "cli/opts.h"
#include "core/fsutil.h"

static const char usage[] =
    "usage: conch logs [--socket PATH] [-f] JOB|SESSION\n"
    "\n"
    "Print what a daemon job (job-..., see 'conch ps' and exec.run's jobs) or a session\n"
    "(ses-..., see 'conch sessions') has printed: a job's stdout and stderr on ours, a\n"
    "session's terminal output (its scrollback). -f, --follow: go on printing until it ends.\n";

enum { OPT_SOCKET = 1, OPT_FOLLOW };

static const struct conch_cli_opt logs_opts[] = {
    {"socket", 0, true, OPT_SOCKET},
    {"follow", 'f', false, OPT_FOLLOW},
    {NULL, 0, false, 0},
};

struct logs_cli {
    const char *sock;
    bool follow;
};

static int logs_opt(void *ctx, int key, const char *value, struct conch_err *err)
{
    struct logs_cli *o = ctx;
    (void)err;
    if (key == OPT_SOCKET)
        o->sock = value;
    else
        o->follow = true;
    return 0;
}

static void out(int fd, json_t *s)
{
    if (json_string_length(s) &&
        conch_write_all(fd, json_string_value(s), json_string_length(s)) < 0) {
        /* our reader went away: nothing more to do with this piece */
    }
}

/* A job's streams from offset 0, then (following) as they grow, until it ended. */
static int job_logs(struct conch_cli_conn *c, const char *job, bool follow)
{
    json_int_t so = 0, eo = 0;
    for (;;) {
        json_t *r =
            conch_cli_conn_call(c, "job.output",
                                json_pack("{s:s,s:I,s:I,s:i}", "job_id", job, "stdout_offset", so,
                                          "stderr_offset", eo, "max_bytes", 1 << 20));
        if (!r)
            return 1;
        out(STDOUT_FILENO, json_object_get(r, "stdout"));
        out(STDERR_FILENO, json_object_get(r, "stderr"));
        json_int_t nso = json_integer_value(json_object_get(r, "stdout_offset"));
        json_int_t neo = json_integer_value(json_object_get(r, "stderr_offset"));
        bool running = json_is_true(json_object_get(r, "running"));
        json_decref(r);
        bool more = nso > so || neo > eo;
        so = nso;
        eo = neo;
        if (more)
            continue; /* read what is there before waiting */
        if (!follow || !running)
            return 0;
        /* It ends, or a moment passes: then read what it printed meanwhile. */
        json_decref(conch_cli_conn_call(c, "job.wait",
                                        json_pack("{s:s,s:f}", "job_id", job, "timeout", 0.2)));
    }
}

/* A session's scrollback, then (following) its output until it ends. */
static int session_logs(struct conch_cli_conn *c, const char *sid, bool follow)
{
    json_t *a = conch_cli_conn_call(c, "session.attach",
                                    json_pack("{s:s,s:b}", "session", sid, "write", 0));
    if (!a)
        return 1;
    out(STDOUT_FILENO, json_object_get(a, "scrollback"));
    json_int_t next_seq = json_integer_value(json_object_get(a, "next_seq"));
    bool ended = !strcmp(json_string_value(json_object_get(a, "state")) ?: "", "ended");
    json_decref(a);
    if (!follow || ended) {
        json_decref(conch_cli_conn_call(c, "session.detach", json_pack("{s:s}", "session", sid)));
        return 0;
    }
    for (;;) {
        json_t *msg = conch_cli_conn_next(c, true);
        if (!msg)
            return 1; /* the daemon went away */
        const char *m = json_string_value(json_object_get(msg, "method"));
        json_t *p = json_object_get(msg, "params");
        bool ours = !strcmp(json_string_value(json_object_get(p, "session")) ?: "", sid);
        if (ours && m && !strcmp(m, "session.output")) {
            json_int_t seq = json_integer_value(json_object_get(p, "seq"));
            json_t *d = json_object_get(p, "data");
            size_t n = json_string_length(d);
            /* the scrollback already held what came before next_seq */
            if (seq + (json_int_t)n > next_seq) {
                size_t skip = seq < next_seq ? (size_t)(next_seq - seq) : 0;
                if (conch_write_all(STDOUT_FILENO, json_string_value(d) + skip, n - skip) < 0) {
                    json_decref(msg);
                    return 0;
                }
                next_seq = seq + (json_int_t)n;
            }
        } else if (ours && m && !strcmp(m, "session.ended")) {
            json_decref(msg);
            return 0;
        }
        json_decref(msg);
    }
}

int conch_cli_logs(int argc, char **argv)
{
    struct logs_cli o = {0};
    const struct conch_cli_parser p = {
        .verb = "logs", .table = logs_opts, .handler = logs_opt, .ctx = &o};
    struct conch_err err = {0};
    int i = 1;
    int r = conch_cli_opts_parse(&p, argc, argv, &i, &err);
    if (r == 1) {
        fputs(usage, stdout);
        return 0;
    }
    if (r < 0)
        return conch_cli_usage_error("logs", usage, "%s", err.msg);
    if (i >= argc)
        return conch_cli_usage_error("logs", usage, "no job or session given");
    if (i + 1 < argc)
        return conch_cli_usage_error("logs", usage, "unexpected argument '%s'", argv[i + 1]);
    const char *id = argv[i];
    bool job = !strncmp(id, "job-", 4), session = !strncmp(id, "ses-", 4);
    if (!job && !session)
        return conch_cli_usage_error("logs", usage,
                                     "'%s' is neither a job (job-...) nor a session (ses-...)", id);
    struct conch_cli_conn c;
    if (conch_cli_conn_open(&c, o.sock) < 0)
        return CONCH_EXIT_INFRA;
    int status = job ? job_logs(&c, id, o.follow) : session_logs(&c, id, o.follow);
    conch_cli_conn_close(&c);
    return status;
}
