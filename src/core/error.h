/* error.h - conch's one error convention: a fixed-size, caller-owned error that a
 * forked child can send to its parent unchanged over a pipe. */
#ifndef CONCH_CORE_ERROR_H
#define CONCH_CORE_ERROR_H

#include <stddef.h>

/* What kind of failure a result reports; mirrors the `error.kind` field of results. */
enum conch_err_kind {
    CONCH_ERR_NONE = 0,
    CONCH_ERR_INFRASTRUCTURE, /* the sandbox could not be built or driven */
    CONCH_ERR_TIMEOUT,        /* the command ran past its deadline */
    CONCH_ERR_LIMIT,          /* a memory/pids/output/disk limit stopped the command */
    CONCH_ERR_COMMAND,        /* the command's own non-zero exit */
    CONCH_ERR_USAGE,          /* the caller asked for something invalid */
};

struct conch_err {
    int code;                 /* positive errno-style value; 0 when unset */
    enum conch_err_kind kind; /* defaults to infrastructure when set by conch_err_set */
    char msg[512];            /* "outer: inner: cause" */
};

/*
 * conch_err_set - fill @e with @code and a printf-formatted message.
 * @e may be NULL (the error is then dropped). Returns -@code so callers can write
 * `return conch_err_set(err, EINVAL, "...")`. A @code of 0 is stored as EIO.
 */
int conch_err_set(struct conch_err *e, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* conch_err_setk - like conch_err_set, with an explicit @kind. Returns -@code. */
int conch_err_setk(struct conch_err *e, enum conch_err_kind kind, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/*
 * conch_err_wrap - prepend printf-formatted context and ": " to @e's message.
 * Returns -e->code (or -EIO if @e is NULL or unset).
 */
int conch_err_wrap(struct conch_err *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* conch_err_kind_name - "infrastructure", "timeout", ...; a static string. */
const char *conch_err_kind_name(enum conch_err_kind kind);

/* conch_err_clear - reset @e to "no error". */
void conch_err_clear(struct conch_err *e);

#endif
