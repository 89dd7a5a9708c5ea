#ifndef BENCH_UTIL_H
#define BENCH_UTIL_H

/* Clock and random numbers shared by leased-bench's modes. */

#include <stdint.h>
#include <sys/time.h>
#include <time.h>

static inline uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline struct timeval
tv_of(double s)
{
    struct timeval tv;
    tv.tv_sec = (time_t)s;
    tv.tv_usec = (suseconds_t)((s - (double)tv.tv_sec) * 1e6);
    return tv;
}

/* xorshift64*: cheap, and the same sequence for both targets of a run. */
static inline uint64_t
rng_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ULL;
}

#endif
