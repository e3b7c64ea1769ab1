/* tools.c - the MCP tools of `conch mcp`: for each, its input schema and description, how its
 * arguments become a daemon request (docs/PROTOCOL.md), and how the answer becomes text a
 * model can read. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/strbuf.h"
#include "mcp/mcp-internal.h"

/* ---- arguments ---- */

/* Each getter answers @c with a tool error and returns false when the argument is wrong. */
/* A string argument. Unless @nul_ok (file contents, which are passed on as JSON values), one
 * holding U+0000 is refused: it becomes a C string (a command, a path, a pattern) that would
 * silently end at the NUL. */
static bool arg_string(struct mcp *m, struct mcp_call *c, const char *key, bool required,
                       bool nul_ok, const char **ret)
{
    json_t *v = json_object_get(c->args, key);
    *ret = NULL;
    if (!v || json_is_null(v)) {
        if (!required)
            return true;
        conch_mcp_call_donef(m, c, true, "Error: argument '%s' is required (a string)", key);
        return false;
    }
    if (!json_is_string(v)) {
        conch_mcp_call_donef(m, c, true, "Error: argument '%s' must be a string", key);
        return false;
    }
    if (!nul_ok && strlen(json_string_value(v)) != json_string_length(v)) {
        conch_mcp_call_donef(m, c, true, "Error: argument '%s' holds a NUL character (U+0000)",
                             key);
        return false;
    }
    *ret = json_string_value(v);
    return true;
}

static bool arg_str(struct mcp *m, struct mcp_call *c, const char *key, bool required,
                    const char **ret)
{
    return arg_string(m, c, key, required, false, ret);
}

/* A string argument that may hold any character, U+0000 included (file contents). */
static bool arg_text(struct mcp *m, struct mcp_call *c, const char *key, const char **ret)
{
    return arg_string(m, c, key, true, true, ret);
}

static bool arg_bool(struct mcp *m, struct mcp_call *c, const char *key, bool *ret)
{
    json_t *v = json_object_get(c->args, key);
    *ret = false;
    if (!v || json_is_null(v))
        return true;
    if (!json_is_boolean(v)) {
        conch_mcp_call_donef(m, c, true, "Error: argument '%s' must be true or false", key);
        return false;
    }
    *ret = json_is_true(v);
    return true;
}

/* A number >= 0; @ret untouched when absent. */
static bool arg_num(struct mcp *m, struct mcp_call *c, const char *key, double *ret)
{
    json_t *v = json_object_get(c->args, key);
    if (!v || json_is_null(v))
        return true;
    if (!json_is_number(v) || json_number_value(v) < 0) {
        conch_mcp_call_donef(m, c, true, "Error: argument '%s' must be a number >= 0", key);
        return false;
    }
    *ret = json_number_value(v);
    return true;
}

/* A list of strings; NULL when absent. */
static bool arg_paths(struct mcp *m, struct mcp_call *c, const char *key, json_t **ret)
{
    json_t *v = json_object_get(c->args, key);
    *ret = NULL;
    if (!v || json_is_null(v))
        return true;
    size_t i;
    json_t *e;
    bool ok = json_is_array(v);
    json_array_foreach(v, i, e) ok = ok && json_is_string(e);
    if (!ok) {
        conch_mcp_call_donef(m, c, true, "Error: argument '%s' must be a list of paths (strings)",
                             key);
        return false;
    }
    *ret = v;
    return true;
}

bool conch_mcp_arg_str(struct mcp *m, struct mcp_call *c, const char *key, bool required,
                       const char **ret)
{
    return arg_str(m, c, key, required, ret);
}

bool conch_mcp_arg_bool(struct mcp *m, struct mcp_call *c, const char *key, bool *ret)
{
    return arg_bool(m, c, key, ret);
}

/* ---- a growing text ---- */

static void text_done(struct mcp *m, struct mcp_call *c, struct conch_sb *t, bool is_error)
{
    if (t->oom)
        conch_mcp_call_done(m, c, true, "out of memory", 13);
    else
        conch_mcp_call_done(m, c, is_error, t->buf ? t->buf : "", t->len);
    conch_sb_done(t);
}

static const char *jstr(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

#define REPLY_ERRORS(m, c, error)                                                                  \
    do {                                                                                           \
        if (error) {                                                                               \
            conch_mcp_call_fail_daemon(m, c, error);                                               \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* Add the text of an exec.run / session.run result @res to @out; returns true when the
 * command was stopped (a timeout, a limit): an error, while a command's own failure is a
 * result (its exit code ends the text). */
static bool run_text(struct mcp *m, json_t *res, struct conch_sb *out)
{
    json_t *t = json_object_get(res, "text");
    const char *kind = json_string_value(json_object_get(json_object_get(res, "error"), "kind"));
    bool stopped = kind && strcmp(kind, "command");
    const char *s = json_string_value(t) ? json_string_value(t) : "";
    size_t len = json_string_length(t);
    /* The notice of cut output names the spill file; one in the daemon's state dir is a host
     * path that no tool can read: say what to do instead. Over HTTP the daemon's state dir
     * is not known: every path but the sandbox's /run/conch/output/ is a host one. */
    char needle[4200];
    snprintf(needle, sizeof(needle), "; full output in %s/", conch_mcp_state_dir(m));
    bool any_host = !conch_mcp_state_dir(m)[0];
    for (const char *p = s; p < s + len;) {
        const char *hit = memmem(p, (size_t)(s + len - p), needle, strlen(needle));
        while (hit && any_host &&
               !strncmp(hit + strlen(needle), "run/conch/output/", 17)) /* the sandbox's */
            hit = memmem(hit + 1, (size_t)(s + len - hit - 1), needle, strlen(needle));
        const char *close = hit ? memmem(hit, (size_t)(s + len - hit), " ...]", 5) : NULL;
        if (!close) {
            conch_sb_putn(out, p, (size_t)(s + len - p));
            break;
        }
        conch_sb_putn(out, p, (size_t)(hit - p));
        conch_sb_printf(out, "; to see all of it, redirect it to a file and read parts of it");
        p = close;
    }
    return stopped;
}

/* ---- bash ---- */

static void bash_start(struct mcp *m, struct mcp_call *c)
{
    const char *cmd, *cwd;
    bool background;
    double timeout = (double)conch_mcp_default_timeout_ms(m) / 1000.0;
    if (!arg_str(m, c, "command", true, &cmd) || !arg_str(m, c, "cwd", false, &cwd) ||
        !arg_bool(m, c, "background", &background) || !arg_num(m, c, "timeout", &timeout))
        return;
    json_t *p = json_pack("{s:s}", "command", cmd);
    if (cwd)
        json_object_set_new(p, "cwd", json_string(cwd));
    /* Both streams of the result fit in one tool result. */
    size_t per_stream =
        conch_mcp_max_output(m) / 2 > 1024 ? conch_mcp_max_output(m) / 2 - 512 : 512;
    json_object_set_new(p, "max_output", json_integer((json_int_t)per_stream));
    if (background) {
        c->stage = 1;
        conch_mcp_daemon_call(m, c, "job.start", p);
        return;
    }
    json_object_set_new(p, "timeout", json_real(timeout));
    conch_mcp_daemon_call(m, c, "exec.run", p);
}

static void bash_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    if (c->stage == 1) {
        const char *job = jstr(res, "job_id");
        conch_mcp_call_donef(
            m, c, false,
            "Started background job %s. Read its output with job_output "
            "{\"job_id\": \"%s\"} (each call returns what is new; \"wait\": S waits "
            "up to S seconds for it to end first); stop it with job_kill.",
            job, job);
        return;
    }
    struct conch_sb out = {0};
    text_done(m, c, &out, run_text(m, res, &out));
}

/* ---- shell: one persistent session (session.*) per MCP session ---- */

enum { SHELL_OPEN = 1, SHELL_RUN = 2, SHELL_RETRIED = 4 };
/* The session a run went to, kept in the call's arguments (no tool argument has this name). */
#define RUN_SESSION "\x01session"

static void shell_run(struct mcp *m, struct mcp_call *c)
{
    double timeout = (double)conch_mcp_default_timeout_ms(m) / 1000.0;
    arg_num(m, c, "timeout", &timeout); /* checked by shell_start */
    size_t max = conch_mcp_max_output(m) > 2048 ? conch_mcp_max_output(m) - 1024 : 1024;
    c->stage = SHELL_RUN | (c->stage & SHELL_RETRIED);
    json_object_set_new(c->args, RUN_SESSION, json_string(conch_mcp_shell_session(m)));
    conch_mcp_daemon_call(m, c, "session.run",
                          json_pack("{s:s,s:O,s:f,s:I}", "session", conch_mcp_shell_session(m),
                                    "command", json_object_get(c->args, "command"), "timeout",
                                    timeout, "max_output", (json_int_t)max));
}

static void shell_start(struct mcp *m, struct mcp_call *c)
{
    const char *cmd;
    double timeout = 0;
    if (!arg_str(m, c, "command", true, &cmd) || !arg_num(m, c, "timeout", &timeout))
        return;
    if (conch_mcp_shell_session(m)[0]) {
        shell_run(m, c);
    } else if (*conch_mcp_shell_opening(m)) { /* a call that came while the session opens */
        conch_mcp_call_park(m, c);
    } else {
        *conch_mcp_shell_opening(m) = true;
        c->stage = SHELL_OPEN | (c->stage & SHELL_RETRIED);
        conch_mcp_daemon_call(m, c, "session.open", json_object());
    }
}

static void shell_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    const struct mcp_tool *self = c->tool;
    if (c->stage & SHELL_OPEN) {
        *conch_mcp_shell_opening(m) = false;
        const char *id = json_string_value(json_object_get(res, "session"));
        if (error || !id) {
            json_t *e = error ? error : json_pack("{s:s}", "message", "no session id");
            struct mcp_call *w;
            while ((w = conch_mcp_call_unpark(m, self)))
                conch_mcp_call_fail_daemon(m, w, e);
            conch_mcp_call_fail_daemon(m, c, e);
            if (!error)
                json_decref(e);
            return;
        }
        conch_mcp_shell_set_session(m, id);
        shell_run(m, c);
        struct mcp_call *w;
        while ((w = conch_mcp_call_unpark(m, self)))
            shell_run(m, w);
        return;
    }
    if (error) {
        const char *code =
            json_string_value(json_object_get(json_object_get(error, "data"), "code"));
        /* The session was forgotten (closed, or dropped by the daemon's limit): open a new
         * one, once. */
        if (code && !strcmp(code, "session_not_found") && !(c->stage & SHELL_RETRIED)) {
            const char *used = json_string_value(json_object_get(c->args, RUN_SESSION));
            if (used && !strcmp(used, conch_mcp_shell_session(m))) /* not reopened meanwhile */
                conch_mcp_shell_set_session(m, NULL);
            c->stage = SHELL_RETRIED;
            shell_start(m, c);
            return;
        }
        conch_mcp_call_fail_daemon(m, c, error);
        return;
    }
    struct conch_sb out = {0};
    if (json_is_true(json_object_get(res, "new_shell")))
        conch_sb_printf(&out,
                        "[a new shell: the previous one had exited, so the working directory, "
                        "variables and functions were reset]\n");
    text_done(m, c, &out, run_text(m, res, &out));
}

/* ---- job_output, job_kill ---- */

static void job_output_start(struct mcp *m, struct mcp_call *c)
{
    const char *job;
    double wait = 0;
    if (!arg_str(m, c, "job_id", true, &job) || !arg_num(m, c, "wait", &wait))
        return;
    if (wait > 0) {
        c->stage = 1;
        conch_mcp_daemon_call(
            m, c, "job.wait",
            json_pack("{s:s,s:f}", "job_id", job, "timeout", wait > 600 ? 600 : wait));
        return;
    }
    c->stage = 2;
    json_t *off = json_object_get(conch_mcp_job_offsets(m), job);
    conch_mcp_daemon_call(m, c, "job.output",
                          json_pack("{s:s,s:I,s:I,s:I}", "job_id", job, "stdout_offset",
                                    json_integer_value(json_array_get(off, 0)), "stderr_offset",
                                    json_integer_value(json_array_get(off, 1)), "max_bytes",
                                    (json_int_t)(conch_mcp_max_output(m) / 2)));
}

static void job_output_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    const char *job = json_string_value(json_object_get(c->args, "job_id"));
    if (c->stage == 1) {
        json_object_set_new(c->args, "wait", json_integer(0));
        job_output_start(m, c);
        return;
    }
    json_t *so = json_object_get(res, "stdout_offset"), *eo = json_object_get(res, "stderr_offset");
    json_t *off = json_object_get(conch_mcp_job_offsets(m), job);
    json_int_t old_so = json_integer_value(json_array_get(off, 0));
    json_int_t old_eo = json_integer_value(json_array_get(off, 1));
    json_object_set_new(conch_mcp_job_offsets(m), job, json_pack("[O,O]", so, eo));
    json_t *out = json_object_get(res, "stdout"), *err = json_object_get(res, "stderr");
    struct conch_sb t = {0};
    if (json_string_length(out))
        conch_sb_putn(&t, json_string_value(out), json_string_length(out));
    if (json_string_length(err)) {
        if (t.len && t.buf[t.len - 1] != '\n')
            conch_sb_putn(&t, "\n", 1);
        conch_sb_putn(&t, json_string_value(err), json_string_length(err));
    }
    if (t.len && t.buf[t.len - 1] != '\n')
        conch_sb_putn(&t, "\n", 1);
    bool more =
        (size_t)(json_integer_value(so) - old_so) + (size_t)(json_integer_value(eo) - old_eo) >=
        conch_mcp_max_output(m) / 2;
    if (!t.len)
        conch_sb_printf(&t, "(no new output)\n");
    if (json_is_true(json_object_get(res, "running")))
        conch_sb_printf(&t, "[job %s is still running%s]", job,
                        more ? "; more output is waiting: call job_output again" : "");
    else
        conch_sb_printf(&t, "[job %s exited; exit code: %lld%s]", job,
                        (long long)json_integer_value(json_object_get(res, "exit_code")),
                        more ? "; more output is waiting: call job_output again" : "");
    text_done(m, c, &t, false);
}

static void job_kill_start(struct mcp *m, struct mcp_call *c)
{
    const char *job, *sig;
    if (!arg_str(m, c, "job_id", true, &job) || !arg_str(m, c, "signal", false, &sig))
        return;
    conch_mcp_daemon_call(m, c, "job.kill",
                          json_pack("{s:s,s:s}", "job_id", job, "signal", sig ? sig : "TERM"));
}

static void job_kill_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    conch_mcp_call_donef(m, c, false, "Sent %s to every process of job %s.",
                         json_string_value(json_object_get(c->args, "signal"))
                             ? json_string_value(json_object_get(c->args, "signal"))
                             : "TERM",
                         json_string_value(json_object_get(c->args, "job_id")));
}

/* ---- files ---- */

static void read_start(struct mcp *m, struct mcp_call *c)
{
    const char *path;
    double offset = 0, limit = 2000;
    if (!arg_str(m, c, "path", true, &path) || !arg_num(m, c, "offset", &offset) ||
        !arg_num(m, c, "limit", &limit))
        return;
    if (limit < 1)
        limit = 1;
    conch_mcp_daemon_call(m, c, "fs.read",
                          json_pack("{s:s,s:I,s:I}", "path", path, "offset", (json_int_t)offset,
                                    "limit", (json_int_t)limit));
}

static void read_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    json_t *content = json_object_get(res, "content");
    const char *s = json_string_value(content);
    size_t len = json_string_length(content);
    json_int_t first = json_integer_value(json_object_get(res, "offset"));
    json_int_t lines = json_integer_value(json_object_get(res, "lines"));
    json_int_t total = json_integer_value(json_object_get(res, "total_lines"));
    struct conch_sb t = {0};
    /* Whole lines only, as many as fit: a cut in the middle would hide which lines came. */
    size_t budget =
        conch_mcp_max_output(m) > 512 ? conch_mcp_max_output(m) - 256 : conch_mcp_max_output(m);
    json_int_t shown = 0;
    bool cut = false;
    for (size_t i = 0; s && i < len;) {
        const char *nl = memchr(s + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - s) : len;
        if (t.len + (end - i) + 8 > budget && shown > 0) {
            cut = true;
            break;
        }
        conch_sb_printf(&t, "%6lld\t", (long long)(first + shown + 1));
        conch_sb_putn(&t, s + i, end - i);
        conch_sb_putn(&t, "\n", 1);
        shown++;
        i = end + 1;
    }
    if (!len)
        conch_sb_printf(&t,
                        total ? "(no lines from line %lld on: the file has %lld)\n"
                              : "(the file is empty)\n",
                        (long long)first + 1, (long long)total);
    else if (cut || json_is_true(json_object_get(res, "truncated")))
        conch_sb_printf(&t, "[lines %lld-%lld of %lld%s; pass offset=%lld to read on]\n",
                        (long long)first + 1, (long long)(first + shown), (long long)total,
                        cut ? " (the rest did not fit in one result)" : "",
                        (long long)(first + shown));
    (void)lines;
    text_done(m, c, &t, false);
}

/* The daemon takes at most 10 MiB of content per fs.write: larger content goes in chunks
 * (the first replaces the file, the others append), cut between UTF-8 sequences. c->stage is
 * the offset of the next chunk; whether the first write created the file is kept in the
 * call's arguments. */
#define WRITE_CHUNK ((size_t)8 << 20)
#define WRITE_CREATED "\x01created"

static void write_next(struct mcp *m, struct mcp_call *c)
{
    json_t *content = json_object_get(c->args, "content");
    const char *s = json_string_value(content);
    size_t len = json_string_length(content), off = (size_t)c->stage, n = len - off;
    if (n > WRITE_CHUNK) {
        n = WRITE_CHUNK;
        while (n > 1 && ((unsigned char)s[off + n] & 0xC0) == 0x80)
            n--;
    }
    json_t *p =
        json_pack("{s:O,s:s%}", "path", json_object_get(c->args, "path"), "content", s + off, n);
    if (p && off)
        json_object_set_new(p, "append", json_true());
    c->stage = (int)(off + n);
    conch_mcp_daemon_call(m, c, "fs.write", p);
}

static void write_start(struct mcp *m, struct mcp_call *c)
{
    const char *path, *content;
    if (!arg_str(m, c, "path", true, &path) || !arg_text(m, c, "content", &content))
        return;
    c->stage = 0;
    write_next(m, c);
}

static void write_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    size_t len = json_string_length(json_object_get(c->args, "content"));
    if (!json_object_get(c->args, WRITE_CREATED))
        json_object_set_new(c->args, WRITE_CREATED,
                            json_boolean(json_is_true(json_object_get(res, "created"))));
    if ((size_t)c->stage < len) {
        write_next(m, c);
        return;
    }
    conch_mcp_call_donef(m, c, false, "%s %s (%zu bytes).",
                         json_is_true(json_object_get(c->args, WRITE_CREATED)) ? "Created"
                                                                               : "Overwrote",
                         json_string_value(json_object_get(c->args, "path")), len);
}

static void edit_start(struct mcp *m, struct mcp_call *c)
{
    const char *path, *o, *n;
    bool all;
    if (!arg_str(m, c, "path", true, &path) || !arg_text(m, c, "old_string", &o) ||
        !arg_text(m, c, "new_string", &n) || !arg_bool(m, c, "replace_all", &all))
        return;
    conch_mcp_daemon_call(m, c, "fs.edit",
                          json_pack("{s:s,s:O,s:O,s:b}", "path", path, "old_string",
                                    json_object_get(c->args, "old_string"), "new_string",
                                    json_object_get(c->args, "new_string"), "replace_all", all));
}

static void edit_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    json_int_t n = json_integer_value(json_object_get(res, "occurrences"));
    conch_mcp_call_donef(m, c, false, "Replaced %lld occurrence%s in %s.", (long long)n,
                         n == 1 ? "" : "s", json_string_value(json_object_get(c->args, "path")));
}

static void ls_start(struct mcp *m, struct mcp_call *c)
{
    const char *path;
    if (!arg_str(m, c, "path", false, &path))
        return;
    conch_mcp_daemon_call(m, c, "fs.ls", path ? json_pack("{s:s}", "path", path) : json_object());
}

static void ls_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    struct conch_sb t = {0};
    size_t i;
    json_t *e;
    json_t *entries = json_object_get(res, "entries");
    json_array_foreach(entries, i, e)
    {
        const char *type = jstr(e, "type");
        const char *suffix = !strcmp(type, "d") ? "/" : !strcmp(type, "l") ? "@" : "";
        if (!strcmp(type, "d"))
            conch_sb_printf(&t, "%s %10s  %s%s\n", jstr(e, "mode"), "-", jstr(e, "name"), suffix);
        else
            conch_sb_printf(&t, "%s %10lld  %s%s\n", jstr(e, "mode"),
                            (long long)json_integer_value(json_object_get(e, "size")),
                            jstr(e, "name"), suffix);
    }
    if (!json_array_size(entries))
        conch_sb_printf(&t, "(empty directory)\n");
    text_done(m, c, &t, false);
}

static void glob_start(struct mcp *m, struct mcp_call *c)
{
    const char *pattern, *path;
    if (!arg_str(m, c, "pattern", true, &pattern) || !arg_str(m, c, "path", false, &path))
        return;
    json_t *p = json_pack("{s:s}", "pattern", pattern);
    if (path)
        json_object_set_new(p, "path", json_string(path));
    conch_mcp_daemon_call(m, c, "fs.glob", p);
}

static void glob_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    struct conch_sb t = {0};
    size_t i;
    json_t *e;
    json_t *paths = json_object_get(res, "paths");
    json_array_foreach(paths, i, e) conch_sb_printf(&t, "%s\n", json_string_value(e));
    if (!json_array_size(paths))
        conch_sb_printf(&t, "(no matches)\n");
    if (json_is_true(json_object_get(res, "truncated")))
        conch_sb_printf(&t, "[more matches left out: narrow the pattern]\n");
    text_done(m, c, &t, false);
}

static void grep_start(struct mcp *m, struct mcp_call *c)
{
    const char *pattern, *path, *glob;
    bool icase, fixed;
    if (!arg_str(m, c, "pattern", true, &pattern) || !arg_str(m, c, "path", false, &path) ||
        !arg_str(m, c, "glob", false, &glob) || !arg_bool(m, c, "ignore_case", &icase) ||
        !arg_bool(m, c, "fixed_string", &fixed))
        return;
    json_t *p =
        json_pack("{s:s,s:b,s:b}", "pattern", pattern, "ignore_case", icase, "fixed_string", fixed);
    if (path)
        json_object_set_new(p, "path", json_string(path));
    if (glob)
        json_object_set_new(p, "glob", json_string(glob));
    conch_mcp_daemon_call(m, c, "fs.grep", p);
}

static void grep_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    struct conch_sb t = {0};
    size_t i;
    json_t *e;
    json_t *matches = json_object_get(res, "matches");
    json_array_foreach(matches, i, e)
        conch_sb_printf(&t, "%s:%lld:%s\n", jstr(e, "path"),
                        (long long)json_integer_value(json_object_get(e, "line")), jstr(e, "text"));
    if (!json_array_size(matches))
        conch_sb_printf(&t, "(no matches)\n");
    if (json_is_true(json_object_get(res, "truncated")))
        conch_sb_printf(&t, "[more matches left out: narrow the pattern, path or glob]\n");
    text_done(m, c, &t, false);
}

/* ---- workspace ---- */

static void changes_start(struct mcp *m, struct mcp_call *c)
{
    const char *since;
    if (!arg_str(m, c, "since", false, &since))
        return;
    conch_mcp_daemon_call(m, c, "workspace.changes",
                          since ? json_pack("{s:s}", "since", since) : json_object());
}

static void changes_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    struct conch_sb t = {0};
    size_t i;
    json_t *e;
    json_t *list = json_object_get(res, "changes");
    json_array_foreach(list, i, e)
    {
        const char *kind = jstr(e, "kind");
        char k = !strcmp(kind, "added")      ? 'A'
                 : !strcmp(kind, "deleted")  ? 'D'
                 : !strcmp(kind, "modified") ? 'M'
                                             : 'T';
        const char *skip = json_string_value(json_object_get(e, "skip"));
        conch_sb_printf(&t, "%c %s%s%s%s%s\n", k, jstr(e, "path"),
                        !strcmp(jstr(e, "type"), "d") ? "/" : "",
                        skip ? "  [not committable: " : "", skip ? skip : "", skip ? "]" : "");
    }
    if (!json_array_size(list))
        conch_sb_printf(&t, "No changes.\n");
    else
        conch_sb_printf(&t, "[%lld change%s (A added, M modified, D deleted, T type changed)%s]\n",
                        (long long)json_integer_value(json_object_get(res, "changes_total")),
                        json_integer_value(json_object_get(res, "changes_total")) == 1 ? "" : "s",
                        json_is_true(json_object_get(res, "changes_truncated"))
                            ? "; only the first ones are listed"
                            : "");
    text_done(m, c, &t, false);
}

static void diff_start(struct mcp *m, struct mcp_call *c)
{
    json_t *paths;
    const char *since;
    if (!arg_paths(m, c, "paths", &paths) || !arg_str(m, c, "since", false, &since))
        return;
    json_t *p = paths ? json_pack("{s:O}", "paths", paths) : json_object();
    if (p && since)
        json_object_set_new(p, "since", json_string(since));
    conch_mcp_daemon_call(m, c, "workspace.diff", p);
}

static void diff_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    json_t *d = json_object_get(res, "diff");
    if (!json_string_length(d)) {
        conch_mcp_call_donef(m, c, false, "No changes.");
        return;
    }
    struct conch_sb t = {0};
    conch_sb_putn(&t, json_string_value(d), json_string_length(d));
    json_int_t omitted = json_integer_value(json_object_get(res, "omitted"));
    if (omitted)
        conch_sb_printf(&t, "\n[%lld file%s left out of this diff: ask for them with paths]\n",
                        (long long)omitted, omitted == 1 ? "" : "s");
    text_done(m, c, &t, false);
}

static void commit_start(struct mcp *m, struct mcp_call *c)
{
    json_t *paths;
    if (!arg_paths(m, c, "paths", &paths))
        return;
    conch_mcp_daemon_call(m, c, "workspace.commit",
                          paths ? json_pack("{s:O}", "paths", paths) : json_object());
}

static void commit_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    struct conch_sb t = {0};
    size_t i;
    json_t *e;
    json_t *done = json_object_get(res, "committed"), *skipped = json_object_get(res, "skipped");
    if (!json_array_size(done) && !json_array_size(skipped)) {
        conch_mcp_call_donef(m, c, false, "Nothing to commit: no changes.");
        return;
    }
    conch_sb_printf(&t, "Committed %zu path%s to the host directory:\n", json_array_size(done),
                    json_array_size(done) == 1 ? "" : "s");
    json_array_foreach(done, i, e) conch_sb_printf(&t, "  %s\n", json_string_value(e));
    json_array_foreach(skipped, i, e)
        conch_sb_printf(&t, "  skipped %s: %s\n", jstr(e, "path"), jstr(e, "reason"));
    text_done(m, c, &t, false);
}

static void js_start(struct mcp *m, struct mcp_call *c)
{
    const char *code, *session;
    double timeout = -1;
    if (!arg_text(m, c, "code", &code) || !arg_str(m, c, "session", false, &session) ||
        !arg_num(m, c, "timeout", &timeout))
        return;
    json_t *p = json_pack("{s:s}", "code", code);
    if (p && session)
        json_object_set_new(p, "session", json_string(session));
    if (p && timeout >= 0)
        json_object_set_new(p, "timeout", json_real(timeout));
    conch_mcp_daemon_call(m, c, "js.eval", p);
}

/* The eval's text (console lines, `→ value` or the error, the tool calls' summary), after a
 * note when its session had to start afresh; a script that threw is a tool error. */
static void js_reply(struct mcp *m, struct mcp_call *c, json_t *res, json_t *error)
{
    REPLY_ERRORS(m, c, error);
    struct conch_sb t = {0};
    if (json_is_true(json_object_get(res, "restarted")))
        conch_sb_printf(&t, "[%s: this is a fresh session; earlier globals are gone]\n",
                        jstr(res, "restart_reason"));
    conch_sb_puts(&t, jstr(res, "text"));
    text_done(m, c, &t, !json_is_true(json_object_get(res, "ok")));
}

/* ---- the table ---- */

#define SINCE_PROP                                                                                 \
    "\"since\": {\"type\": \"string\", \"description\": \"A snapshot (id or name) of this "        \
    "sandbox: only what changed after it\"}"
#define PATH_DESC "\"description\": \"A path in the sandbox: relative to /workspace, or absolute\""

const struct mcp_tool conch_mcp_tools[] = {
    {
        .name = "bash",
        .title = "Run a shell command",
        .description =
            "Run a command with bash (`bash -c COMMAND`) inside the sandbox, in /workspace unless "
            "cwd says otherwise, and return its stdout, then its stderr, and a last line with the "
            "exit code ([exit code: N], or [timed out; ...]). A command that is still running at "
            "its timeout is killed with everything it started; so is anything left running when "
            "it exits (use background for servers and long jobs). No network. Very long output "
            "is cut in the middle with a note naming a file that holds all of it (read parts "
            "of it with read_file, or search it with grep).",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"command\": {\"type\": \"string\", \"description\": \"The command line, run "
                  "by bash\"},"
                  "\"timeout\": {\"type\": \"number\", \"minimum\": 0, \"description\": "
                  "\"Seconds before the command is stopped (default: the server's, 120 unless "
                  "configured; 0 = none)\"},"
                  "\"background\": {\"type\": \"boolean\", \"description\": \"Start it as a "
                  "background job and return its job id at once; read its output with "
                  "job_output, stop it with job_kill\"},"
                  "\"cwd\": {\"type\": \"string\", \"description\": \"Working directory (default "
                  "/workspace)\"}},"
                  "\"required\": [\"command\"]}",
        .start = bash_start,
        .reply = bash_reply,
    },
    {
        .name = "shell",
        .title = "Run a command in a persistent shell",
        .description =
            "Run a command in a persistent bash session of this sandbox: cwd, exported "
            "variables, functions, aliases and an activated virtualenv persist between calls "
            "(unlike bash, where every call starts afresh in /workspace). Returns the output "
            "(stdout and stderr together, as a terminal shows them) and a last line with the "
            "exit code ([exit code: N]). A command still running at its timeout is interrupted "
            "(Ctrl-C, then killed) and the shell stays usable with its state. If the command "
            "ends the shell (exit, exec, set -e), the next call starts a new shell and says so. "
            "Commands must not wait for keyboard input. No network.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"command\": {\"type\": \"string\", \"description\": \"The command "
                  "line, run by the session's bash as if typed\"},"
                  "\"timeout\": {\"type\": \"number\", \"minimum\": 0, \"description\": "
                  "\"Seconds before the command is interrupted (default: the server's, 120 "
                  "unless configured; 0 = none)\"}},"
                  "\"required\": [\"command\"]}",
        .start = shell_start,
        .reply = shell_reply,
    },
    {
        .name = "js_eval",
        .title = "Run JavaScript or TypeScript",
        .description =
            "Run JavaScript or TypeScript (types are stripped) in a persistent JS session inside "
            "the sandbox (QuickJS, ES2020): top-level const/let/function/class persist between "
            "calls, top-level await works, and the last expression's value is returned (-> "
            "value) after the console.log lines; a thrown error is returned with its line. Use "
            "it for arithmetic, data wrangling and loops. Globals: readFile(path) and "
            "writeFile(path, data) (promises; paths relative to /workspace; writes are kept only "
            "if the code succeeds), console, setTimeout, and tools: the tools registered on "
            "this sandbox as async functions, `await tools.name(input)` (also in camelCase), "
            "which run concurrently with Promise.all (Object.keys(tools) lists them; empty when "
            "none are registered). No network, no require/import, no Node APIs.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"code\": {\"type\": \"string\", \"description\": \"JavaScript or "
                  "TypeScript; the last expression statement is the result\"},"
                  "\"session\": {\"type\": \"string\", \"description\": \"Session name "
                  "(default \\\"default\\\"): each has its own globals\"},"
                  "\"timeout\": {\"type\": \"number\", \"minimum\": 0, \"description\": "
                  "\"Seconds the code may run, pending promises included (default 60; 0 = "
                  "none)\"}},"
                  "\"required\": [\"code\"]}",
        .start = js_start,
        .reply = js_reply,
    },
    {
        .name = "job_output",
        .title = "Read a background job's output",
        .description =
            "Return the output a background job (started by bash with background: true) wrote "
            "since the last job_output call for it, and whether it is still running or its exit "
            "code. With wait: S, first wait up to S seconds (at most 600) for the job to end.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"job_id\": {\"type\": \"string\", \"description\": \"The id bash returned\"},"
                  "\"wait\": {\"type\": \"number\", \"minimum\": 0, \"maximum\": 600, "
                  "\"description\": \"Seconds to wait for the job to end before reading "
                  "(default 0)\"}},"
                  "\"required\": [\"job_id\"]}",
        .read_only = true,
        .start = job_output_start,
        .reply = job_output_reply,
    },
    {
        .name = "job_kill",
        .title = "Stop a background job",
        .description = "Send a signal (default TERM) to every process of a background job.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"job_id\": {\"type\": \"string\", \"description\": \"The id bash returned\"},"
                  "\"signal\": {\"type\": \"string\", \"description\": \"TERM (default), KILL, "
                  "INT, HUP, ...\"}},"
                  "\"required\": [\"job_id\"]}",
        .destructive = true,
        .start = job_kill_start,
        .reply = job_kill_reply,
    },
    {
        .name = "read_file",
        .title = "Read a text file",
        .description =
            "Read a text file in the sandbox. Lines come numbered like `cat -n` (the number, a "
            "tab, the line); the numbers are not part of the file. At most `limit` lines "
            "(default 2000) from line `offset` + 1; a note at the end says how to read on.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"path\": {\"type\": \"string\", " PATH_DESC "},"
                  "\"offset\": {\"type\": \"integer\", \"minimum\": 0, \"description\": \"Lines "
                  "to skip (default 0)\"},"
                  "\"limit\": {\"type\": \"integer\", \"minimum\": 1, \"description\": \"Lines "
                  "to return (default 2000)\"}},"
                  "\"required\": [\"path\"]}",
        .read_only = true,
        .start = read_start,
        .reply = read_reply,
    },
    {
        .name = "write_file",
        .title = "Write a file",
        .description = "Create or overwrite a file in the sandbox with the given text; missing "
                       "parent directories are created.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"path\": {\"type\": \"string\", " PATH_DESC "},"
                  "\"content\": {\"type\": \"string\", \"description\": \"The whole new "
                  "content\"}},"
                  "\"required\": [\"path\", \"content\"]}",
        .destructive = true,
        .start = write_start,
        .reply = write_reply,
    },
    {
        .name = "edit_file",
        .title = "Edit a file",
        .description =
            "Replace old_string with new_string in a file. old_string must occur exactly once "
            "(include enough surrounding lines to make it unique) unless replace_all is true. "
            "Copy it exactly from the file, without read_file's line numbers.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"path\": {\"type\": \"string\", " PATH_DESC "},"
                  "\"old_string\": {\"type\": \"string\", \"description\": \"The exact text to "
                  "replace\"},"
                  "\"new_string\": {\"type\": \"string\", \"description\": \"The text to put "
                  "instead\"},"
                  "\"replace_all\": {\"type\": \"boolean\", \"description\": \"Replace every "
                  "occurrence (default false)\"}},"
                  "\"required\": [\"path\", \"old_string\", \"new_string\"]}",
        .destructive = true,
        .start = edit_start,
        .reply = edit_reply,
    },
    {
        .name = "ls",
        .title = "List a directory",
        .description = "List a directory in the sandbox (default /workspace): mode, size and "
                       "name of each entry, directories marked with /, symlinks with @.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"path\": {\"type\": \"string\", \"description\": \"The directory: relative "
                  "to /workspace, or absolute (default /workspace)\"}}}",
        .read_only = true,
        .start = ls_start,
        .reply = ls_reply,
    },
    {
        .name = "glob",
        .title = "Find files by name",
        .description = "List the paths that match a glob pattern: * ? [...] within a name, ** "
                       "across directories, {a,b} alternatives (e.g. **/*.py). Hidden names are "
                       "skipped unless named.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"pattern\": {\"type\": \"string\", \"description\": \"The glob pattern\"},"
                  "\"path\": {\"type\": \"string\", \"description\": \"Directory to search "
                  "(default /workspace)\"}},"
                  "\"required\": [\"pattern\"]}",
        .read_only = true,
        .start = glob_start,
        .reply = glob_reply,
    },
    {
        .name = "grep",
        .title = "Search file contents",
        .description = "Search files for a POSIX extended regular expression (or a fixed "
                       "string) and list matching lines as path:line:text. Binary files and "
                       "hidden names are skipped.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"pattern\": {\"type\": \"string\", \"description\": \"The regex (POSIX "
                  "extended) or, with fixed_string, the text\"},"
                  "\"path\": {\"type\": \"string\", \"description\": \"File or directory to "
                  "search (default /workspace)\"},"
                  "\"glob\": {\"type\": \"string\", \"description\": \"Only files whose name "
                  "matches this glob, e.g. *.c\"},"
                  "\"ignore_case\": {\"type\": \"boolean\"},"
                  "\"fixed_string\": {\"type\": \"boolean\"}},"
                  "\"required\": [\"pattern\"]}",
        .read_only = true,
        .start = grep_start,
        .reply = grep_reply,
    },
    {
        .name = "changes",
        .title = "List the workspace's changes",
        .description = "List what was added, modified or deleted in /workspace compared with "
                       "the host directory (overlay mode): what commit would apply. With since: "
                       "what changed after that snapshot.",
        .schema = "{\"type\": \"object\", \"properties\": {" SINCE_PROP "}}",
        .read_only = true,
        .start = changes_start,
        .reply = changes_reply,
    },
    {
        .name = "diff",
        .title = "Show the workspace's changes as a diff",
        .description = "A unified diff (git style) of the changes in /workspace against the "
                       "host directory, for every changed file or the given paths. With since: "
                       "against /workspace as it was at that snapshot.",
        .schema =
            "{\"type\": \"object\", \"properties\": {"
            "\"paths\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, "
            "\"description\": \"Only these paths (relative to /workspace)\"}," SINCE_PROP "}}",
        .read_only = true,
        .start = diff_start,
        .reply = diff_reply,
    },
    {
        .name = "commit",
        .title = "Apply the changes to the host",
        .description = "Apply the changes made in /workspace to the host directory (all of "
                       "them, or the given paths): they leave the sandbox for the real "
                       "project. Only in overlay mode.",
        .schema = "{\"type\": \"object\", \"properties\": {"
                  "\"paths\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, "
                  "\"description\": \"Only these paths (relative to /workspace; a directory "
                  "includes what is beneath it)\"}}}",
        .destructive = true,
        .start = commit_start,
        .reply = commit_reply,
    },
    {.name = NULL},
};
