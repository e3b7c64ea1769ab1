/* clock.h - the two clocks conch reads: monotonic milli- and microseconds for durations and
 * deadlines, wall-clock seconds for timestamps that are stored or shown. */
#ifndef CONCH_CORE_CLOCK_H
#define CONCH_CORE_CLOCK_H

#include <stdint.h>

/* conch_clock_ms - CLOCK_MONOTONIC in milliseconds (durations, deadlines). Async-signal-safe. */
uint64_t conch_clock_ms(void);

/* conch_clock_us - CLOCK_MONOTONIC in microseconds (short delays). Async-signal-safe. */
uint64_t conch_clock_us(void);

/* conch_clock_wall - CLOCK_REALTIME in seconds, with a fraction (created_at, ended_at...). */
double conch_clock_wall(void);

#endif
