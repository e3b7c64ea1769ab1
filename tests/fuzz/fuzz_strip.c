/* fuzz_strip.c - libFuzzer target for the code a client sends to the JS engine: TypeScript
 * stripping and the REPL rewrite (src/js/js-strip.c) over any bytes. Stripping must keep the
 * line count; a cell it rewrote must be its wrapper around code; nothing may crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "js/js-internal.h"

static size_t lines(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += s[i] == '\n';
    return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *src = malloc(size + 1);
    if (!src)
        return 0;
    memcpy(src, data, size);
    src[size] = '\0';
    for (int repl = 0; repl < 2; repl++) {
        struct conch_js_code c;
        struct conch_err err = {0};
        if (conch_js_transform(src, size, repl, &c, &err) < 0)
            abort();
        if (!c.text || strlen(c.text) > c.len)
            abort();
        if (!repl && lines(c.text, c.len) != lines(src, size))
            abort(); /* the engine's line numbers would not be the source's */
        if (repl && c.parsed &&
            (strncmp(c.text, "(async () => {", 14) != 0 || c.len < 19 ||
             strcmp(c.text + c.len - 5, "\n})()") != 0 ||
             lines(c.text, c.len) != lines(src, size) + 1))
            abort();
        if (!c.parsed && (c.len != size || memcmp(c.text, src, size) != 0))
            abort(); /* unparsable code runs as given */
        conch_js_code_done(&c);
    }
    free(src);
    return 0;
}
