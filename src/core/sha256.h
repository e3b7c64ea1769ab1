/* sha256.h - SHA-256 (FIPS 180-4) and a constant-time comparison: what the daemon needs to
 * keep tokens as digests (daemon/tokens.c) without linking a TLS library into every process
 * this binary starts. */
#ifndef CONCH_CORE_SHA256_H
#define CONCH_CORE_SHA256_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONCH_SHA256_SIZE 32

/* conch_sha256 - the digest of @len bytes at @data (NULL with @len 0 is the empty input). */
void conch_sha256(const void *data, size_t len, uint8_t out[CONCH_SHA256_SIZE]);

/* conch_secure_equal - whether @a and @b hold the same @len bytes; the time taken does not
 * depend on where they differ. */
bool conch_secure_equal(const void *a, const void *b, size_t len);

/* conch_secure_zero - clear @len bytes at @p; the compiler may not drop it. */
void conch_secure_zero(void *p, size_t len);

#endif
