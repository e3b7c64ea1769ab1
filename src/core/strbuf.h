/* strbuf.h - the growing string buffer (the one string builder). An allocation failure sets
 * ->oom and makes later appends no-ops, so callers check once at the end. Zero-initialise a
 * struct conch_sb to start; the text is always NUL-terminated once anything was added. */
#ifndef CONCH_CORE_STRBUF_H
#define CONCH_CORE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct conch_sb {
    char *buf;
    size_t len, cap;
    bool oom;
};

/* Append @n bytes of @s (NUL bytes included). */
void conch_sb_putn(struct conch_sb *b, const char *s, size_t n);
/* Append the string @s. */
void conch_sb_puts(struct conch_sb *b, const char *s);
/* Append printf-formatted text, of any length. */
void conch_sb_printf(struct conch_sb *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Truncate back to @len (a length seen earlier). */
void conch_sb_trunc(struct conch_sb *b, size_t len);
/* The string (the buffer is taken: @b is reset), or NULL after an allocation failure. */
char *conch_sb_take(struct conch_sb *b);
/* Free the buffer and reset @b. */
void conch_sb_done(struct conch_sb *b);

#endif
