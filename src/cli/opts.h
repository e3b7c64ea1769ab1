/* opts.h - option value parsers shared by the subcommands. */
#ifndef CONCH_CLI_OPTS_H
#define CONCH_CLI_OPTS_H

#include <stdint.h>

#include "core/error.h"

/* conch_cli_parse_seconds - "1", "0.5", "2.25" → milliseconds in *@ret. */
int conch_cli_parse_seconds(const char *s, const char *what, uint64_t *ret, struct conch_err *err);

/* conch_cli_parse_count - a positive integer → *@ret. */
int conch_cli_parse_count(const char *s, const char *what, uint64_t *ret, struct conch_err *err);

#endif
