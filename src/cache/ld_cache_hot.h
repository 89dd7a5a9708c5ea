#ifndef LD_CACHE_HOT_H
#define LD_CACHE_HOT_H

#include "ld_common.h"

/*
 * The most read cache keys of this daemon lately: a top-K by the
 * space-saving algorithm (Metwally et al.) over a sliding window. K slots
 * and everything that links them are allocated once; a read costs one
 * hash lookup and O(1) list moves, and allocates only when a key longer
 * than any its slot held before moves in (slot buffers only grow).
 *
 * The window: counts are kept for the current period of LD_HOT_WINDOW_MS
 * and the one before; a rate weighs the previous period by the part of it
 * still inside the window (the usual sliding-window estimate). At each
 * period's end (checked lazily, by the next read or query) the ranking
 * starts over from the period that just ended, so a key that is no longer
 * read leaves the top within two periods.
 */

#define LD_HOT_WINDOW_MS 10000

struct ld_hot_key {
    const char *key; /* valid until the next ld_cache_hot_* call */
    size_t len;
    double reads_per_s;
    double hit_ratio; /* 0..1 */
    uint64_t reads;   /* in the window, weighted */
};

/* Keep K keys (0: off, every call a no-op). Replaces what was kept. */
void ld_cache_hot_init(size_t k);
void ld_cache_hot_free(void);
bool ld_cache_hot_enabled(void);

/* One read of KEY at NOW_MS (monotonic), answered as a hit (a value, a
 * cached null or a stale value) or not. */
void ld_cache_hot_note(const char *key, size_t len, bool hit, uint64_t now_ms);

/* Up to MAX of the kept keys into OUT, most read first; returns how
 * many. */
size_t ld_cache_hot_top(struct ld_hot_key *out, size_t max, uint64_t now_ms);

#endif
