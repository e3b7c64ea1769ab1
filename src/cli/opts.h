/* opts.h - the one option parser of every verb (a table per verb), and the option value
 * parsers the verbs share. */
#ifndef CONCH_CLI_OPTS_H
#define CONCH_CLI_OPTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"
#include "spec/spec.h"

/* One option of a verb. A table ends with an entry whose @name is NULL. */
struct conch_cli_opt {
    const char *name; /* long name, without "--" */
    char short_name;  /* -x; 0: none */
    bool takes_value; /* --name=V or --name V (-xV or -x V) */
    int key;          /* what the verb's handler is told */
};

/*
 * What a verb parses: its own @table (may be NULL) with @handler(@ctx, key, value, err)
 * (value NULL for a flag; returns 0, or <0 with @err filled), and the options of the sandbox
 * spec it takes (@spec_opts, a set of enum conch_spec_opt) written to @spec by
 * conch_spec_set_option. -h and --help are help unless the table has them.
 */
struct conch_cli_parser {
    const char *verb;
    const struct conch_cli_opt *table;
    int (*handler)(void *ctx, int key, const char *value, struct conch_err *err);
    void *ctx;
    unsigned spec_opts;
    struct conch_sandbox_spec *spec;
};

/* The options of a verb that only talks to a daemon: --socket PATH and --json. Its parser's
 * table is conch_cli_sock_json_opts, its handler conch_cli_sock_json_opt, its ctx a
 * struct conch_cli_sock_json (zeroed). */
struct conch_cli_sock_json {
    const char *sock; /* --socket, or NULL: the default socket */
    bool json;        /* --json */
};
extern const struct conch_cli_opt conch_cli_sock_json_opts[];
int conch_cli_sock_json_opt(void *ctx, int key, const char *value, struct conch_err *err);

/*
 * conch_cli_opts_parse - parse the options of argv[1..] (argv[0] is the verb) by @p. Long
 * options take their value as --name=V or --name V, short ones as -xV or -x V; flags may be
 * bundled (-qj is -q -j). Parsing stops at the first operand (or "-"), and after "--", which
 * is consumed; *@ret_optind is the index of the first operand (argc: none). The value of
 * --env is blanked in argv once parsed (values are often secrets, and /proc/PID/cmdline is
 * world readable). Returns 0, 1 when help was asked for (nothing else is parsed), or -EINVAL
 * with @err (kind usage) naming the offending word: "unknown option '-i' (in '-it')".
 */
int conch_cli_opts_parse(const struct conch_cli_parser *p, int argc, char **argv, int *ret_optind,
                         struct conch_err *err);

/* conch_cli_usage_error - print "conch VERB: " and the printf-formatted message, then @usage
 * (may be NULL), on stderr; returns the usage exit status. */
int conch_cli_usage_error(const char *verb, const char *usage, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* conch_cli_parse_seconds - "1", "0.5", "2.25" → milliseconds in *@ret. */
int conch_cli_parse_seconds(const char *s, const char *what, uint64_t *ret, struct conch_err *err);

/* conch_cli_parse_count - a positive integer → *@ret. */
int conch_cli_parse_count(const char *s, const char *what, uint64_t *ret, struct conch_err *err);

#endif
