/* The reader of a shared near cache segment: see leased/near.h and
 * leased/near_layout.h for the contract.
 *
 * Nothing in the mapping is trusted: the daemon may be rewriting it, may
 * have died half-way, or the bytes may be anything at all (the fuzz
 * target feeds random ones). So every field is loaded once into a local
 * and checked there, and every offset is checked against the mapping
 * before it is followed; a check that fails means "ask the daemon",
 * never a crash.
 *
 * The orders are the seqlock's (see src/cache/ld_near_shm.c for the
 * writer's): the bucket's seq with acquire, the way and the record,
 * an acquire fence, the seq again; what was copied is kept only when the
 * two are the same even number, and the epoch did not move. */

#include "leased/near.h"

#include <string.h>

static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u,
    0x706af48fu, 0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u,
    0xe0d5e91eu, 0x97d2d988u, 0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u,
    0x90bf1d91u, 0x1db71064u, 0x6ab020f2u, 0xf3b97148u, 0x84be41deu,
    0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u, 0x136c9856u,
    0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u,
    0xa2677172u, 0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu,
    0x35b5a8fau, 0x42b2986cu, 0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u,
    0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u, 0x26d930acu, 0x51de003au,
    0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u, 0xcfba9599u,
    0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u,
    0x01db7106u, 0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu,
    0x9fbfe4a5u, 0xe8b8d433u, 0x7807c9a2u, 0x0f00f934u, 0x9609a88eu,
    0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du, 0x91646c97u, 0xe6635c01u,
    0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu, 0x6c0695edu,
    0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u,
    0xfbd44c65u, 0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u,
    0x4adfa541u, 0x3dd895d7u, 0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au,
    0x346ed9fcu, 0xad678846u, 0xda60b8d0u, 0x44042d73u, 0x33031de5u,
    0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau, 0xbe0b1010u,
    0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u,
    0x2eb40d81u, 0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u,
    0x03b6e20cu, 0x74b1d29au, 0xead54739u, 0x9dd277afu, 0x04db2615u,
    0x73dc1683u, 0xe3630b12u, 0x94643b84u, 0x0d6d6a3eu, 0x7a6a5aa8u,
    0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u, 0xf00f9344u,
    0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au,
    0x67dd4accu, 0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u,
    0xd6d6a3e8u, 0xa1d1937eu, 0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u,
    0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu, 0xd80d2bdau, 0xaf0a1b4cu,
    0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u, 0x316e8eefu,
    0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu,
    0xb2bd0b28u, 0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u,
    0x2cd99e8bu, 0x5bdeae1du, 0x9b64c2b0u, 0xec63f226u, 0x756aa39cu,
    0x026d930au, 0x9c0906a9u, 0xeb0e363fu, 0x72076785u, 0x05005713u,
    0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u, 0x92d28e9bu,
    0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u,
    0x18b74777u, 0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu,
    0x8f659effu, 0xf862ae69u, 0x616bffd3u, 0x166ccf45u, 0xa00ae278u,
    0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u, 0xa7672661u, 0xd06016f7u,
    0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu, 0x40df0b66u,
    0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u,
    0xcdd70693u, 0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u,
    0x5d681b02u, 0x2a6f2b94u, 0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu,
    0x2d02ef8du,
};

uint32_t
leased_near_hash(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++) {
        c = crc_table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
    }
    return ~c;
}

static uint32_t
ld32(const void *p)
{
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_RELAXED);
}

static uint64_t
ld64(const void *p)
{
    return __atomic_load_n((const uint64_t *)p, __ATOMIC_RELAXED);
}

static void
cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

#define BUCKET_BYTES sizeof(struct leased_near_bucket)
#define WAY_BYTES sizeof(struct leased_near_way)
#define REC_BYTES sizeof(struct leased_near_rec)

/* Where the header puts the buckets and the ring, each field loaded once
 * and checked against the mapping, and the epoch the lookup started in. */
struct seg_view {
    const unsigned char *buckets;
    const unsigned char *ring;
    uint64_t rbytes;
    uint64_t epoch;
    uint32_t nb;
};

/* The fields of one way, loaded once: the writer may change them under us,
 * and the bucket's seq says afterwards whether they belonged together. */
struct way_view {
    uint32_t vlen;
    uint32_t flags;
    uint64_t off;
    uint64_t deadline;
    uint64_t version;
};

/* The header of a segment that is live, sane and fresh fills V; anything
 * else says why the caller must ask the daemon. */
static inline enum leased_near_result
seg_open(const unsigned char *m, size_t len, uint64_t now_ns,
         struct seg_view *v)
{
    /* Aligned loads of the 8-byte fields need an aligned mapping (mmap's
     * always is). */
    if (m == NULL || ((uintptr_t)m & 7u) != 0 ||
        len < sizeof(struct leased_near_hdr)) {
        return LEASED_NEAR_FALLBACK;
    }
    const struct leased_near_hdr *h = (const void *)m;
    if (memcmp(h->magic, LEASED_NEAR_MAGIC, sizeof(h->magic)) != 0 ||
        ld32(&h->layout) != LEASED_NEAR_LAYOUT) {
        return LEASED_NEAR_FALLBACK;
    }
    uint32_t state = __atomic_load_n(&h->state, __ATOMIC_ACQUIRE);
    if (state == LEASED_NEAR_CLOSED) {
        return LEASED_NEAR_CLOSED_SEG;
    }
    if (state != LEASED_NEAR_LIVE) {
        return LEASED_NEAR_FALLBACK;
    }
    uint64_t limit = ld64(&h->total_bytes);
    uint32_t nb = ld32(&h->nbuckets);
    uint64_t boff = ld64(&h->buckets_off);
    uint64_t roff = ld64(&h->ring_off);
    uint64_t rbytes = ld64(&h->ring_bytes);
    if (limit > len || nb == 0 || (nb & (nb - 1)) != 0 ||
        ld32(&h->ways) != LEASED_NEAR_WAYS || (boff & 7u) != 0 ||
        boff > limit || (uint64_t)nb * BUCKET_BYTES > limit - boff ||
        (roff & 7u) != 0 || roff > limit || rbytes > limit - roff) {
        return LEASED_NEAR_FALLBACK;
    }
    uint64_t stale = ld64(&h->stale_ns);
    uint64_t beat = __atomic_load_n(&h->heartbeat_ns, __ATOMIC_ACQUIRE);
    if (now_ns > beat && now_ns - beat > stale) {
        return LEASED_NEAR_FALLBACK;
    }
    v->epoch = __atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE);
    v->buckets = m + boff;
    v->ring = m + roff;
    v->rbytes = rbytes;
    v->nb = nb;
    return LEASED_NEAR_HIT;
}

/* The record a way points at when it is KEY's, or NULL: the offset and
 * lengths are checked against the ring before the record is read. */
static inline const unsigned char *
way_record(const struct seg_view *s, const unsigned char *way, uint32_t hash,
           const void *key, uint32_t klen, struct way_view *w)
{
    if (ld32(way + 0) != hash || ld32(way + 4) != klen) {
        return NULL;
    }
    w->vlen = ld32(way + 8);
    w->flags = ld32(way + 12);
    w->off = ld64(way + 16);
    w->deadline = ld64(way + 24);
    w->version = ld64(way + 32);
    /* klen and vlen are below 2^32: the sum cannot wrap. */
    if ((w->off & 7u) != 0 || w->off > s->rbytes ||
        REC_BYTES + (uint64_t)klen + w->vlen > s->rbytes - w->off) {
        return NULL;
    }
    const unsigned char *rec = s->ring + w->off;
    if (ld32(rec + 0) != klen || ld32(rec + 4) != w->vlen ||
        memcmp(rec + REC_BYTES, key, klen) != 0) {
        return NULL;
    }
    return rec;
}

/* The answer a matching way gives; OUT stays zero for a miss. */
static inline enum leased_near_result
way_answer(const struct way_view *w, const unsigned char *rec, uint32_t klen,
           uint64_t now_ns, void *buf, size_t cap,
           struct leased_near_value *out)
{
    if (now_ns >= w->deadline) {
        return LEASED_NEAR_MISS; /* past its deadline */
    }
    out->version = w->version;
    if ((w->flags & LEASED_NEAR_NULL) != 0) {
        out->null = 1;
        return LEASED_NEAR_HIT;
    }
    out->vlen = w->vlen;
    if (w->vlen > cap) {
        return LEASED_NEAR_TOO_SMALL;
    }
    if (w->vlen > 0) {
        memcpy(buf, rec + REC_BYTES + klen, w->vlen);
    }
    return LEASED_NEAR_HIT;
}

/* One pass over the bucket's ways; whether it stands is the seq's to say. */
static inline enum leased_near_result
bucket_scan(const struct seg_view *s, const unsigned char *bucket,
            uint32_t hash, const void *key, uint32_t klen, uint64_t now_ns,
            void *buf, size_t cap, struct leased_near_value *out)
{
    for (int i = 0; i < LEASED_NEAR_WAYS; i++) {
        const unsigned char *way = bucket + 8 + (size_t)i * WAY_BYTES;
        struct way_view w;
        const unsigned char *rec = way_record(s, way, hash, key, klen, &w);
        if (rec != NULL) {
            return way_answer(&w, rec, klen, now_ns, buf, cap, out);
        }
    }
    return LEASED_NEAR_MISS;
}

enum leased_near_result
leased_near_lookup(const void *map, size_t len, const void *key, size_t klen,
                   uint64_t now_ns, void *buf, size_t cap,
                   struct leased_near_value *out)
{
    struct seg_view s;
    enum leased_near_result open = seg_open(map, len, now_ns, &s);
    if (open != LEASED_NEAR_HIT) {
        return open;
    }
    if (klen == 0 || klen > UINT32_MAX) {
        /* Not a key the daemon can store. */
        return LEASED_NEAR_MISS;
    }
    const struct leased_near_hdr *h = map;
    uint32_t hash = leased_near_hash(key, klen);
    const unsigned char *bucket = s.buckets +
                                  (uint64_t)(hash & (s.nb - 1)) * BUCKET_BYTES;
    const uint32_t *seqp = (const uint32_t *)(const void *)bucket;

    for (int attempt = 0; attempt < LEASED_NEAR_RETRIES; attempt++) {
        if (attempt > 0) {
            cpu_relax();
        }
        uint32_t seq = __atomic_load_n(seqp, __ATOMIC_ACQUIRE);
        if ((seq & 1u) != 0) {
            continue;
        }
        struct leased_near_value v = {0, 0, 0};
        enum leased_near_result res = bucket_scan(&s, bucket, hash, key,
                                                  (uint32_t)klen, now_ns, buf,
                                                  cap, &v);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(seqp, __ATOMIC_RELAXED) != seq) {
            continue;
        }
        if (__atomic_load_n(&h->epoch, __ATOMIC_RELAXED) != s.epoch) {
            return LEASED_NEAR_FALLBACK;
        }
        if (out != NULL) {
            *out = v;
        }
        return res;
    }
    return LEASED_NEAR_FALLBACK;
}
