/* proctitle.c - overwrite a forked child's command line (see proctitle.h). */
#include "core/proctitle.h"

#include <string.h>

static char *area_start;
static size_t area_len;

void conch_proctitle_init(int argc, char **argv)
{
    if (argc < 1 || !argv || !argv[0])
        return;
    /* The kernel lays argv strings out back to back: the area runs from the first to the
     * end of the last one that is contiguous with it. */
    char *end = argv[0] + strlen(argv[0]) + 1;
    for (int i = 1; i < argc && argv[i] == end; i++)
        end = argv[i] + strlen(argv[i]) + 1;
    area_start = argv[0];
    area_len = (size_t)(end - argv[0]);
}

void conch_proctitle_set_child(const char *title)
{
    if (!area_start || area_len == 0)
        return;
    size_t n = strlen(title);
    if (n >= area_len)
        n = area_len - 1;
    memset(area_start, 0, area_len);
    memcpy(area_start, title, n);
}
