#ifndef LEASED_NEAR_H
#define LEASED_NEAR_H

/* A reader of a shared near cache segment (leased/near_layout.h): one
 * lookup, a pure function of the mapping's bytes and the caller's
 * arguments. It reads nothing outside [MAP, MAP + LEN) whatever those
 * bytes hold, writes nothing but BUF and *OUT, and never blocks. */

#include <stddef.h>
#include <stdint.h>

#include "leased/near_layout.h"

enum leased_near_result {
    /* The value is in BUF (out->vlen bytes; 0 and out->null for a cached
     * null). */
    LEASED_NEAR_HIT = 0,
    /* The segment is good and does not hold the key (or holds it past its
     * deadline): ask the daemon. */
    LEASED_NEAR_MISS = 1,
    /* The segment cannot be trusted now (stale heartbeat, an epoch or a
     * bucket that kept moving, bytes that make no sense): ask the daemon. */
    LEASED_NEAR_FALLBACK = 2,
    /* A hit of out->vlen bytes, more than CAP: nothing was copied; look
     * again with a buffer that large. */
    LEASED_NEAR_TOO_SMALL = 3,
    /* The daemon closed this segment (a reload, a shutdown): ask the
     * daemon, and map the segment again with near.map. */
    LEASED_NEAR_CLOSED_SEG = 4,
};

struct leased_near_value {
    uint64_t vlen;
    uint64_t version; /* 0: none */
    int null;         /* a cached null: the key does not exist */
};

/* How often a lookup that finds its bucket being written looks again
 * before it answers LEASED_NEAR_FALLBACK. */
#define LEASED_NEAR_RETRIES 64

/* Looks KEY (KLEN bytes) up in the segment mapped at MAP (LEN bytes, as
 * mapped; 8-byte aligned) at NOW_NS (CLOCK_MONOTONIC). On a hit copies
 * the value into BUF (CAP bytes) and fills *OUT; on TOO_SMALL fills
 * out->vlen. */
enum leased_near_result leased_near_lookup(const void *map, size_t len,
                                           const void *key, size_t klen,
                                           uint64_t now_ns, void *buf,
                                           size_t cap,
                                           struct leased_near_value *out);

/* leased_near_crc32 of near_layout.h, by table: the same values, faster. */
uint32_t leased_near_hash(const void *data, size_t len);

#endif
