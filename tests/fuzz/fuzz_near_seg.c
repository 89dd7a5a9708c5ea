/*
 * Fuzz target: libleased's reader of a shared near cache segment
 * (leased_near_lookup) over bytes that may be anything, as a segment
 * written by a broken or hostile daemon, or caught half-way, may be. The
 * reader must not crash nor read outside the mapping: the bytes are
 * copied into a heap buffer of exactly their size, so ASan sees any read
 * past them.
 *
 * Input: the segment's bytes, then the key, then one byte giving the
 * key's length. The lookup runs at the segment's own heartbeat (so a
 * well-formed segment is fresh) with buffers of several sizes; when the
 * input's first byte is odd the header's fixed fields are also made
 * right (magic, layout, ways, state, total_bytes), so that mutations
 * spend their time past the header's checks.
 */
#include "leased/near.h"
#include "leased/near_layout.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink;

static void
lookup(const unsigned char *seg, size_t len, const uint8_t *key, size_t klen,
       uint64_t now, size_t cap)
{
    unsigned char *buf = malloc(cap ? cap : 1);
    if (buf == NULL) {
        abort();
    }
    struct leased_near_value out;
    memset(&out, 0, sizeof(out));
    enum leased_near_result r = leased_near_lookup(seg, len, key, klen, now,
                                                   buf, cap, &out);
    switch (r) {
    case LEASED_NEAR_HIT:
        /* A value came out of the mapping: it fits in both. */
        if (out.vlen > cap || out.vlen > len || (out.null && out.vlen != 0)) {
            abort();
        }
        for (uint64_t i = 0; i < out.vlen; i++) {
            sink += buf[i];
        }
        break;
    case LEASED_NEAR_TOO_SMALL:
        if (out.vlen <= cap || out.vlen > len) {
            abort();
        }
        break;
    case LEASED_NEAR_MISS:
    case LEASED_NEAR_FALLBACK:
    case LEASED_NEAR_CLOSED_SEG:
        break;
    default:
        abort();
    }
    free(buf);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) {
        return 0;
    }
    size_t klen = data[size - 1];
    if (klen > size - 1) {
        klen = size - 1;
    }
    const uint8_t *key = data + size - 1 - klen;
    size_t len = size - 1 - klen;
    unsigned char *seg = malloc(len ? len : 1);
    if (seg == NULL) {
        abort();
    }
    memcpy(seg, data, len);
    struct leased_near_hdr h;
    uint64_t now = 0;
    if (len >= sizeof(h)) {
        memcpy(&h, seg, sizeof(h));
        if ((seg[0] & 1u) != 0) {
            memcpy(h.magic, LEASED_NEAR_MAGIC, sizeof(h.magic));
            h.layout = LEASED_NEAR_LAYOUT;
            h.ways = LEASED_NEAR_WAYS;
            h.state = LEASED_NEAR_LIVE;
            h.total_bytes = len;
            memcpy(seg, &h, sizeof(h));
        }
        now = h.heartbeat_ns + 1;
    }
    lookup(seg, len, key, klen, now, 0);
    lookup(seg, len, key, klen, now, 16);
    lookup(seg, len, key, klen, now, len);
    /* And with a clock of another time: stale, or past deadlines. */
    lookup(seg, len, key, klen, now ^ 0x5555555555555555ull, len);
    free(seg);
    return 0;
}
