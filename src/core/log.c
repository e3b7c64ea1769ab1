/* log.c - leveled logging to stderr, one line per message, prefixed "conch: ". */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static int current_level = -1;

void conch_log_set_level(enum conch_log_level level)
{
    current_level = (int)level;
}

void conch_log(enum conch_log_level level, const char *fmt, ...)
{
    if (current_level < 0)
        current_level = getenv("CONCH_DEBUG") ? CONCH_LOG_DEBUG : CONCH_LOG_WARN;
    if ((int)level < current_level)
        return;
    static const char *const names[] = {"debug", "info", "warning", "error"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "conch: %s: %s\n", names[level], line);
}
