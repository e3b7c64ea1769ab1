/* fuzz_store.c - libFuzzer target for what a client names in a store (workspace/store-db.c):
 * store names and paths. A normalised path is accepted again unchanged (idempotent), never
 * holds a '.' or '..' component, an empty one or a control character, and fits its cap. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "workspace/workspace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    struct conch_err err = {0};
    (void)conch_store_name_check(s, &err);
    char out[CONCH_STORE_PATH_MAX], again[CONCH_STORE_PATH_MAX];
    if (conch_store_path_normalize(s, out, sizeof(out), &err) == 0) {
        size_t n = strlen(out);
        if (n >= CONCH_STORE_PATH_MAX || (n && (out[0] == '/' || out[n - 1] == '/')))
            abort();
        for (const char *c = out; n && *c;) {
            const char *e = strchr(c, '/');
            size_t len = e ? (size_t)(e - c) : strlen(c);
            if (!len || (len == 1 && c[0] == '.') || (len == 2 && c[0] == '.' && c[1] == '.'))
                abort();
            for (size_t i = 0; i < len; i++)
                if ((unsigned char)c[i] < 0x20 || c[i] == 0x7f)
                    abort();
            c += len + (e ? 1 : 0);
        }
        if (conch_store_path_normalize(out, again, sizeof(again), &err) != 0 || strcmp(out, again))
            abort();
    }
    free(s);
    return 0;
}
