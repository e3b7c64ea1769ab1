/* utf8.h - UTF-8 validation and repair: JSON strings must be UTF-8, and command output, file
 * contents and paths need not be. */
#ifndef CONCH_CORE_UTF8_H
#define CONCH_CORE_UTF8_H

#include <stddef.h>

/*
 * conch_utf8_seq - the length of the well-formed UTF-8 sequence at @s (at most @n > 0 bytes),
 * or 0 when there is none. As strict as jansson: no overlong forms, no surrogates, nothing
 * above U+10FFFF.
 */
size_t conch_utf8_seq(const unsigned char *s, size_t n);

/*
 * conch_utf8_bad - when @s (at most @n > 0 bytes) does not start a well-formed sequence, the
 * length of the maximal subpart of one there (at least 1), which a repair replaces by one
 * U+FFFD (Unicode's recommended practice, as Python's errors="replace"); else 0.
 */
size_t conch_utf8_bad(const unsigned char *s, size_t n);

/*
 * conch_utf8_repair - @n bytes of @s with each maximal subpart of an ill-formed sequence
 * (conch_utf8_bad) replaced by U+FFFD; NUL bytes are kept. The one repair policy: command
 * output, file contents, paths and diffs all read the same. Returns a new NUL-terminated string
 * (caller frees) and its length in *@ret_len, or NULL when out of memory.
 */
char *conch_utf8_repair(const char *s, size_t n, size_t *ret_len);

#endif
