/* result.h - the JSON and text forms of a command's result, shared by `conch run --json`
 * and the daemon's exec.run. */
#ifndef CONCH_EXEC_RESULT_H
#define CONCH_EXEC_RESULT_H

#include <jansson.h>

#include "exec/run.h"

/* How a command ended, as its runner saw it (`conch run` or the daemon). */
struct conch_run_end {
    int status; /* wait status (unused when start_failed) */
    struct rusage usage;
    bool start_failed; /* the program could not be executed: start_err says why */
    struct conch_err start_err;
    /* The program that could not start is the shell conch runs commands with (exec.run,
     * jobs): the sandbox cannot run commands, an infrastructure error (125), not the
     * command's own "not found" (127). */
    const char *start_shell;
    bool timed_out;
    uint64_t timeout_ms, grace_ms;
    uint64_t spill_exceeded;  /* the spill cap the output went past; 0: it did not */
    uint64_t memory_exceeded; /* the memory limit that stopped it; 0: none did */
    bool memory_sampled;      /* that limit was enforced by sampling, not a cgroup */
    uint64_t pids_hit;        /* the process limit it hit; 0: none */
    const char *disk_full;    /* what filled up ("/tmp (256 MiB, --tmp-size)"); NULL: nothing */
};

/* The exit code of a command that ran past its deadline, whatever signal ended it (as
 * timeout(1)): `conch run`'s exit status, and exit_code in every result. */
#define CONCH_RUN_EXIT_TIMEOUT 124
/* The exit code when the sandbox, not the command, failed (as `conch run`'s exit status). */
#define CONCH_RUN_EXIT_INFRA 125

/*
 * conch_exit_code - a wait status the way a shell reports it: N, or 128+signal (the signal
 * in *@ret_signal, 0 when it exited; may be NULL).
 */
int conch_exit_code(int status, int *ret_signal);

/*
 * conch_run_result_end - fill @res's exit_code, signal, timed_out, cpu_ms, max_rss_kb,
 * error_kind and error_msg from @end. A limit is reported before the timeout it often
 * causes (a fork bomb retries until the deadline); a non-zero exit that nothing else
 * explains is the command's own failure.
 */
void conch_run_result_end(struct conch_run_result *res, const struct conch_run_end *end);

/*
 * conch_run_result_json - @res as the JSON object documented in README.md (`--json`).
 * With @infra (the sandbox could not be built) exit_code is 125 (2 for a usage error) and
 * error carries @infra. Returns a new reference, or NULL when out of memory.
 */
json_t *conch_run_result_json(const struct conch_run_result *res, const struct conch_err *infra);

/*
 * conch_run_result_text - what a model reads: stdout, stderr, the truncation notices, a
 * limit's explanation, and a last line "[exit code: N]". Returns a new string.
 */
char *conch_run_result_text(const struct conch_run_result *res);

/*
 * conch_ws_changes_json - @changes as a JSON array of {path, kind, type, size, mode}, plus
 * "binary" for files, "skip": reason for what commit leaves out, "link_outside": true and
 * "too_deep" / "unreadable": true for flagged entries (docs/PROTOCOL.md). Every item of
 * @changes.
 */
json_t *conch_ws_changes_json(const struct conch_ws_changes *changes);

/*
 * conch_ws_changes_json_set - set "changes" (at most @max items of @changes, 0: all),
 * "changes_total" (every change, also those not listed) and "changes_truncated" (fewer
 * listed than changes_total) in @obj.
 */
void conch_ws_changes_json_set(json_t *obj, const struct conch_ws_changes *changes, size_t max);

/*
 * conch_json_text - @len bytes as a JSON string: invalid UTF-8 becomes U+FFFD, NUL bytes
 * are kept. Returns a new reference, or NULL when out of memory.
 */
json_t *conch_json_text(const char *buf, size_t len);

#endif
