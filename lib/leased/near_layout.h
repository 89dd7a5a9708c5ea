#ifndef LEASED_NEAR_LAYOUT_H
#define LEASED_NEAR_LAYOUT_H

/*
 * The shared near cache segment, layout 1: what the daemon writes and
 * what a reader in any language may read (leased-protocol(7), "Shared
 * near cache"). A client gets a read-only descriptor of its namespace's
 * segment with {"op":"near.map"} and maps all of it, PROT_READ,
 * MAP_SHARED. All numbers are little-endian, at the offsets given here.
 *
 * One writer (the daemon's loop), any number of readers, no locks: each
 * bucket carries a sequence number that is odd while the daemon changes
 * the bucket, and a reader keeps what it read only when the number was
 * the same even value before and after (a seqlock). A value's bytes live
 * in the ring, and the daemon takes a bucket's way out (under the bucket's
 * sequence) before it reuses the ring bytes the way points to, so a reader
 * whose copy raced a reuse sees the number move. Nothing in the segment is
 * trusted by a reader: every offset and length is checked against the
 * mapping before it is followed.
 *
 *   header   [0, header_bytes)           struct leased_near_hdr
 *   buckets  [buckets_off, + nbuckets * sizeof(struct leased_near_bucket))
 *   ring     [ring_off, ring_off + ring_bytes)  records, 8-byte aligned
 *
 * A key K lives in bucket leased_near_crc32(K) & (nbuckets - 1), in any of
 * its LEASED_NEAR_WAYS ways; a way is empty when its klen is 0. A way
 * whose hash and klen match names a record at ring_off + off: a struct
 * leased_near_rec, then K's klen bytes, then the value's vlen bytes (the
 * value as cache.get answers it, decoded). A hit is good until the way's
 * deadline_ns, a CLOCK_MONOTONIC time of this host.
 *
 * A reader uses the segment only while state is LEASED_NEAR_LIVE, magic
 * and layout match, and heartbeat_ns (the daemon's CLOCK_MONOTONIC, written
 * every few milliseconds) is no older than stale_ns; and keeps a hit only
 * when epoch read before and after the lookup is the same (the daemon
 * bumps it on every whole flush: tracking lost, failover, FLUSHALL).
 * Otherwise it asks the daemon over the socket, as without the segment.
 */

#include <stdint.h>

#define LEASED_NEAR_MAGIC "LDNEAR01"
#define LEASED_NEAR_LAYOUT 1
#define LEASED_NEAR_WAYS 4
#define LEASED_NEAR_LIVE 1u
#define LEASED_NEAR_CLOSED 0u
/* A way's flag: the entry is a cached null ("not found"), vlen 0. */
#define LEASED_NEAR_NULL 1u

struct leased_near_hdr {
    char magic[8];         /*   0: LEASED_NEAR_MAGIC, no NUL */
    uint32_t layout;       /*   8: LEASED_NEAR_LAYOUT */
    uint32_t header_bytes; /* 12: offset of the first bucket's page */
    uint64_t total_bytes;  /*  16: the whole mapping */
    uint32_t nbuckets;     /*  24: a power of two */
    uint32_t ways;         /*  28: LEASED_NEAR_WAYS */
    uint64_t buckets_off;  /*  32 */
    uint64_t ring_off;     /*  40 */
    uint64_t ring_bytes;   /*  48 */
    uint64_t stale_ns;     /*  56: cache.near.shared_stale_ms */
    uint64_t epoch;        /*  64: bumped by every whole flush */
    uint64_t heartbeat_ns; /* 72: CLOCK_MONOTONIC of the last beat */
    uint32_t state;        /*  80: LEASED_NEAR_LIVE or LEASED_NEAR_CLOSED */
    uint32_t pad0;         /*  84 */
    uint64_t entries;      /*  88: ways in use (for the curious; not needed) */
    uint64_t used_bytes;   /*  96: ring bytes held by live records */
    uint8_t reserved[152]; /* 104 .. 256 */
};

struct leased_near_way {
    uint32_t hash;        /* 0: leased_near_crc32 of the key */
    uint32_t klen;        /* 4: 0 = empty way */
    uint32_t vlen;        /* 8 */
    uint32_t flags;       /* 12: LEASED_NEAR_NULL; other bits: ignore */
    uint64_t off;         /* 16: the record, from ring_off */
    uint64_t deadline_ns; /* 24: CLOCK_MONOTONIC */
    uint64_t
        version; /* 32: the entry's version (versioned writes); 0 = none */
};

struct leased_near_bucket {
    uint32_t seq; /* 0: odd while the daemon writes the bucket */
    uint32_t pad; /* 4 */
    struct leased_near_way way[LEASED_NEAR_WAYS]; /* 8 */
};

struct leased_near_rec {
    uint32_t klen;   /* 0: as in the way that names the record */
    uint32_t vlen;   /* 4 */
    uint32_t bucket; /* 8: the daemon's own bookkeeping */
    uint32_t way;    /* 12 */
    /* then klen bytes of key, vlen bytes of value, zero padding to 8 */
};

/* CRC-32 as zlib, Python's zlib.crc32 and Go's crc32.ChecksumIEEE compute
 * it (reflected polynomial 0xEDB88320, initial and final value ~0). */
static inline uint32_t
leased_near_crc32(const void *data, uint64_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < len; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

#endif
