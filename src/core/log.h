/* log.h - leveled logging to stderr. Modules return errors; only cli/ and daemon/ log
 * at info and above, so each failure is reported once. */
#ifndef CONCH_CORE_LOG_H
#define CONCH_CORE_LOG_H

enum conch_log_level { CONCH_LOG_DEBUG, CONCH_LOG_INFO, CONCH_LOG_WARN, CONCH_LOG_ERROR };

/* conch_log_set_level - messages below @level are dropped (default: warn, or debug when
 * CONCH_DEBUG is set in the environment at the first call). */
void conch_log_set_level(enum conch_log_level level);

void conch_log(enum conch_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_debug(...) conch_log(CONCH_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) conch_log(CONCH_LOG_INFO, __VA_ARGS__)
#define log_warn(...) conch_log(CONCH_LOG_WARN, __VA_ARGS__)
#define log_error(...) conch_log(CONCH_LOG_ERROR, __VA_ARGS__)

#endif
