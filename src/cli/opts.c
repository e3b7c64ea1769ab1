/* opts.c - option value parsers shared by the subcommands. */
#include "cli/opts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cleanup.h"

int conch_cli_parse_seconds(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0) || v > 1e9)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL,
                              "%s: '%s' is not a number of seconds (e.g. 30, 0.5)", what, s);
    *ret = (uint64_t)llround(v * 1000.0);
    /* A positive time under half a millisecond is not "none" (0): round it up. */
    if (v > 0 && *ret == 0)
        *ret = 1;
    return 0;
}

int conch_cli_parse_count(const char *s, const char *what, uint64_t *ret, struct conch_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v == 0)
        return conch_err_setk(err, CONCH_ERR_USAGE, EINVAL, "%s: '%s' is not a positive number",
                              what, s);
    *ret = v;
    return 0;
}
