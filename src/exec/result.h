/* result.h - the JSON and text forms of a command's result, shared by `conch run --json`
 * and the daemon's exec.run. */
#ifndef CONCH_EXEC_RESULT_H
#define CONCH_EXEC_RESULT_H

#include <jansson.h>

#include "exec/run.h"

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

/* conch_ws_changes_json - @changes as a JSON array of {path, kind, type, size, mode}. */
json_t *conch_ws_changes_json(const struct conch_ws_changes *changes);

/*
 * conch_json_text - @len bytes as a JSON string: invalid UTF-8 becomes U+FFFD, NUL bytes
 * are kept. Returns a new reference, or NULL when out of memory.
 */
json_t *conch_json_text(const char *buf, size_t len);

#endif
