/* error.c - filling and wrapping struct conch_err. */
#include "core/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int conch_err_setk(struct conch_err *e, enum conch_err_kind kind, int code, const char *fmt, ...)
{
    if (code <= 0)
        code = code < 0 ? -code : EIO;
    if (!e)
        return -code;
    e->code = code;
    e->kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -code;
}

int conch_err_set(struct conch_err *e, int code, const char *fmt, ...)
{
    if (code <= 0)
        code = code < 0 ? -code : EIO;
    if (!e)
        return -code;
    e->code = code;
    e->kind = CONCH_ERR_INFRASTRUCTURE;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -code;
}

int conch_err_wrap(struct conch_err *e, const char *fmt, ...)
{
    if (!e)
        return -EIO;
    if (e->code <= 0)
        e->code = EIO;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    char old[sizeof(e->msg)];
    memcpy(old, e->msg, sizeof(old));
    /* Keep the cause (the end) readable when the whole does not fit: truncate the tail. */
    size_t plen = strnlen(prefix, sizeof(prefix));
    if (plen + 2 >= sizeof(e->msg))
        plen = sizeof(e->msg) - 3;
    memcpy(e->msg, prefix, plen);
    memcpy(e->msg + plen, ": ", 2);
    size_t rest = sizeof(e->msg) - plen - 3;
    size_t olen = strnlen(old, sizeof(old));
    if (olen > rest)
        olen = rest;
    memcpy(e->msg + plen + 2, old, olen);
    e->msg[plen + 2 + olen] = '\0';
    return -e->code;
}

const char *conch_err_kind_name(enum conch_err_kind kind)
{
    switch (kind) {
    case CONCH_ERR_NONE:
        return "none";
    case CONCH_ERR_INFRASTRUCTURE:
        return "infrastructure";
    case CONCH_ERR_TIMEOUT:
        return "timeout";
    case CONCH_ERR_LIMIT:
        return "limit";
    case CONCH_ERR_COMMAND:
        return "command";
    case CONCH_ERR_USAGE:
        return "usage";
    }
    return "unknown";
}

void conch_err_clear(struct conch_err *e)
{
    if (!e)
        return;
    e->code = 0;
    e->kind = CONCH_ERR_NONE;
    e->msg[0] = '\0';
}
