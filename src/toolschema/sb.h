/* sb.h - a growing string buffer shared by the toolschema files (internal). An allocation
 * failure sets ->oom and makes later appends no-ops, so callers check once at the end. */
#ifndef CONCH_TOOLSCHEMA_SB_H
#define CONCH_TOOLSCHEMA_SB_H

#include <stdbool.h>
#include <stddef.h>

struct conch__sb {
    char *buf;
    size_t len, cap;
    bool oom;
};

void conch__sb_putn(struct conch__sb *b, const char *s, size_t n);
void conch__sb_puts(struct conch__sb *b, const char *s);
void conch__sb_printf(struct conch__sb *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Truncate back to @len (a length seen earlier). */
void conch__sb_trunc(struct conch__sb *b, size_t len);
/* The string (the buffer is taken: @b is reset), or NULL after an allocation failure. */
char *conch__sb_take(struct conch__sb *b);
void conch__sb_done(struct conch__sb *b);

#endif
