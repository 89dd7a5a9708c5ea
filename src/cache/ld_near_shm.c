/*
 * The writer of a shared near cache segment (lib/leased/near_layout.h).
 *
 * The segment is a sealed memfd mapped once, writable, here; readers get a
 * read-only descriptor and trust nothing in it. The only writer is the
 * daemon's loop, so the writer's own bookkeeping (the ring's head, the
 * records' bucket and way) needs no synchronisation; what readers see is
 * published through each bucket's seqlock:
 *
 *   writer: seq+1 (relaxed), release fence, the way's fields, seq+1
 *           (release)
 *   reader: seq (acquire), the way and its record, acquire fence, seq
 *           (relaxed); kept only when both are the same even number
 *
 * A record's bytes are written before the seq+1 (release) that publishes
 * the way naming them, so a reader that sees the way sees the bytes. Ring
 * bytes are reused only after every way naming them is taken out under
 * its bucket's seq, so a reader whose copy raced the reuse sees its
 * bucket's seq move and does not keep what it copied.
 *
 * The shared fields are accessed with the compiler's __atomic builtins:
 * the C11 memory orders, on the plain integers the layout defines (a
 * reader in another language sees plain little-endian integers).
 */
#include "ld_common.h"

#include "ld_assert.h"
#include "ld_mem.h"
#include "ld_near_shm.h"

#include "leased/near_layout.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SHM_MIN_BYTES (64u * 1024u)
#define SHM_PAGE 4096u

struct ld_near_shm {
    int fd;
    unsigned char *map;
    uint64_t bytes;
    struct leased_near_hdr *hdr;
    struct leased_near_bucket *buckets;
    uint32_t mask; /* nbuckets - 1 */
    unsigned char *ring;
    uint64_t ring_bytes;
    /*
     * The ring is a log written at head. Records of the previous lap lie
     * in [old, lap_end): they are taken out, oldest first, as head comes
     * to them. Bytes in [lap_end, ring_bytes) after a wrap hold nothing.
     */
    uint64_t head;
    uint64_t old;
    uint64_t lap_end;
    uint64_t used_bytes;
    uint64_t entries;
};

static uint64_t
rec_bytes(uint64_t klen, uint64_t vlen)
{
    return (sizeof(struct leased_near_rec) + klen + vlen + 7u) & ~(uint64_t)7u;
}

static struct leased_near_rec *
rec_at(struct ld_near_shm *s, uint64_t off)
{
    return (struct leased_near_rec *)(void *)(s->ring + off);
}

static void
bucket_open(struct leased_near_bucket *b)
{
    uint32_t seq = __atomic_load_n(&b->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&b->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void
bucket_close(struct leased_near_bucket *b)
{
    uint32_t seq = __atomic_load_n(&b->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&b->seq, seq + 1, __ATOMIC_RELEASE);
}

/* The way's fields are stored one by one with relaxed atomics so that a
 * reader's racing load never sees half of one of them. */
static void
way_store(struct leased_near_way *w, uint32_t hash, uint32_t klen,
          uint32_t vlen, uint32_t flags, uint64_t off, uint64_t deadline_ns,
          uint64_t version)
{
    __atomic_store_n(&w->hash, hash, __ATOMIC_RELAXED);
    __atomic_store_n(&w->klen, klen, __ATOMIC_RELAXED);
    __atomic_store_n(&w->vlen, vlen, __ATOMIC_RELAXED);
    __atomic_store_n(&w->flags, flags, __ATOMIC_RELAXED);
    __atomic_store_n(&w->off, off, __ATOMIC_RELAXED);
    __atomic_store_n(&w->deadline_ns, deadline_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&w->version, version, __ATOMIC_RELAXED);
}

static void
publish_usage(struct ld_near_shm *s)
{
    __atomic_store_n(&s->hdr->entries, s->entries, __ATOMIC_RELAXED);
    __atomic_store_n(&s->hdr->used_bytes, s->used_bytes, __ATOMIC_RELAXED);
}

/* Takes way W of bucket B out, under the bucket's seq. */
static void
way_clear(struct ld_near_shm *s, uint32_t b, uint32_t w)
{
    struct leased_near_bucket *bk = &s->buckets[b];
    struct leased_near_way *way = &bk->way[w];
    LD_ASSERT(way->klen != 0);
    uint64_t size = rec_bytes(way->klen, way->vlen);
    bucket_open(bk);
    way_store(way, 0, 0, 0, 0, 0, 0, 0);
    bucket_close(bk);
    LD_ASSERT(s->used_bytes >= size && s->entries > 0);
    s->used_bytes -= size;
    s->entries--;
}

/* The record at OFF leaves the ring: the way naming it, if one still
 * does (a replaced or deleted key's record is named by nothing). */
static uint64_t
rec_evict(struct ld_near_shm *s, uint64_t off)
{
    struct leased_near_rec *r = rec_at(s, off);
    LD_ASSERT(r->bucket <= s->mask && r->way < LEASED_NEAR_WAYS);
    struct leased_near_way *way = &s->buckets[r->bucket].way[r->way];
    if (way->klen != 0 && way->off == off) {
        way_clear(s, r->bucket, r->way);
    }
    return rec_bytes(r->klen, r->vlen);
}

/* Makes [head, head + N) free, wrapping to the ring's start when the
 * record would not fit before its end. */
static void
make_room(struct ld_near_shm *s, uint64_t n)
{
    if (s->head + n > s->ring_bytes) {
        while (s->old < s->lap_end) {
            s->old += rec_evict(s, s->old);
        }
        s->lap_end = s->head;
        s->head = 0;
        s->old = 0;
    }
    while (s->old < s->lap_end && s->old < s->head + n) {
        s->old += rec_evict(s, s->old);
    }
}

/* The way of bucket B that holds KEY, or -1. */
static int
way_find(struct ld_near_shm *s, uint32_t b, uint32_t hash, const char *key,
         size_t klen)
{
    struct leased_near_bucket *bk = &s->buckets[b];
    for (int w = 0; w < LEASED_NEAR_WAYS; w++) {
        struct leased_near_way *way = &bk->way[w];
        if (way->klen == klen && way->hash == hash &&
            memcmp(s->ring + way->off + sizeof(struct leased_near_rec), key,
                   klen) == 0) {
            return w;
        }
    }
    return -1;
}

/* Where a new key goes in bucket B: an empty way, else the one whose
 * record is oldest (the next the ring would take out). */
static int
way_victim(struct ld_near_shm *s, uint32_t b)
{
    struct leased_near_bucket *bk = &s->buckets[b];
    int best = -1;
    uint64_t best_age = 0;
    for (int w = 0; w < LEASED_NEAR_WAYS; w++) {
        struct leased_near_way *way = &bk->way[w];
        if (way->klen == 0) {
            return w;
        }
        /* Distance from head in ring order: records at or past head are
         * of the previous lap, so older than those before it. */
        uint64_t age = way->off >= s->head
                           ? way->off - s->head
                           : way->off + s->ring_bytes - s->head;
        if (best < 0 || age < best_age) {
            best = w;
            best_age = age;
        }
    }
    return best;
}

/* A sealed memfd of BYTES mapped read-write at *MAP, or -1 (errno set). */
static int
shm_memfd(const char *name, uint64_t bytes, void **map)
{
    int fd = memfd_create(name, MFD_ALLOW_SEALING | MFD_CLOEXEC);
    if (fd < 0) {
        return -1;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        goto fail_fd;
    }
    *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (*map == MAP_FAILED) {
        goto fail_fd;
    }
    /*
     * The size is fixed (readers map all of it, and a shrink would make
     * their mapping fault). FUTURE_WRITE keeps this mapping writable but
     * refuses every later write and writable mapping: without it a reader
     * could reopen its read-only descriptor read-write through
     * /proc/self/fd and write the segment every other reader trusts.
     * Kernels before 5.1 lack it; the read-only descriptor then is the
     * only protection.
     */
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
#ifdef F_SEAL_FUTURE_WRITE
    if (fcntl(fd, F_ADD_SEALS, seals | F_SEAL_FUTURE_WRITE) != 0) {
        if (errno != EINVAL || fcntl(fd, F_ADD_SEALS, seals) != 0) {
            goto fail_map;
        }
    }
#else
    if (fcntl(fd, F_ADD_SEALS, seals) != 0) {
        goto fail_map;
    }
#endif
    return fd;

fail_map:;
    int e = errno;
    munmap(*map, bytes);
    errno = e;
fail_fd:
    e = errno;
    close(fd);
    errno = e;
    return -1;
}

/* Cuts the segment into buckets and ring: about a quarter for the
 * buckets (a way per 168 bytes of ring on average), the rest for the
 * ring, which starts on a page. Returns the number of buckets. */
static uint64_t
shm_cut(struct ld_near_shm *s)
{
    uint64_t nb = 1;
    while (nb * 2 * sizeof(struct leased_near_bucket) <= s->bytes / 4 &&
           nb * 2 <= (1ull << 31)) {
        nb *= 2;
    }
    uint64_t ring_off = SHM_PAGE + nb * sizeof(struct leased_near_bucket);
    ring_off = (ring_off + SHM_PAGE - 1) & ~(uint64_t)(SHM_PAGE - 1);
    LD_ASSERT(ring_off < s->bytes);
    s->buckets = (struct leased_near_bucket *)(void *)(s->map + SHM_PAGE);
    s->mask = (uint32_t)(nb - 1);
    s->ring = s->map + ring_off;
    s->ring_bytes = s->bytes - ring_off;
    return nb;
}

/* Writes the header and then, with release, the LIVE state: a fresh memfd
 * reads as zeros (every way empty, every seq even, the state CLOSED)
 * until the header is whole. */
static void
shm_publish(struct ld_near_shm *s, uint64_t nb, uint64_t stale_ns)
{
    struct leased_near_hdr *h = s->hdr;
    memcpy(h->magic, LEASED_NEAR_MAGIC, sizeof(h->magic));
    h->layout = LEASED_NEAR_LAYOUT;
    h->header_bytes = SHM_PAGE;
    h->total_bytes = s->bytes;
    h->nbuckets = (uint32_t)nb;
    h->ways = LEASED_NEAR_WAYS;
    h->buckets_off = SHM_PAGE;
    h->ring_off = (uint64_t)(s->ring - s->map);
    h->ring_bytes = s->ring_bytes;
    h->stale_ns = stale_ns;
    h->epoch = 1;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    __atomic_store_n(&h->heartbeat_ns,
                     (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec,
                     __ATOMIC_RELAXED);
    __atomic_store_n(&h->state, LEASED_NEAR_LIVE, __ATOMIC_RELEASE);
}

struct ld_near_shm *
ld_near_shm_create(const char *name, uint64_t bytes, uint64_t stale_ns)
{
    bytes &= ~(uint64_t)(SHM_PAGE - 1);
    if (bytes < SHM_MIN_BYTES) {
        bytes = SHM_MIN_BYTES;
    }
    void *map;
    int fd = shm_memfd(name, bytes, &map);
    if (fd < 0) {
        return NULL;
    }
    struct ld_near_shm *s = ld_xcalloc(1, sizeof(*s));
    s->fd = fd;
    s->map = map;
    s->bytes = bytes;
    s->hdr = map;
    shm_publish(s, shm_cut(s), stale_ns);
    return s;
}

void
ld_near_shm_destroy(struct ld_near_shm *s)
{
    if (s == NULL) {
        return;
    }
    __atomic_store_n(&s->hdr->state, LEASED_NEAR_CLOSED, __ATOMIC_RELEASE);
    munmap(s->map, s->bytes);
    close(s->fd);
    free(s);
}

int
ld_near_shm_ro_fd(const struct ld_near_shm *s)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", s->fd);
    return open(path, O_RDONLY | O_CLOEXEC);
}

/* Writes a record of N bytes for KEY at OFF in the ring, zero-padded. */
static struct leased_near_rec *
rec_write(struct ld_near_shm *s, uint64_t off, uint64_t n, uint32_t b,
          const char *key, size_t klen, const char *v, size_t vlen)
{
    struct leased_near_rec *r = rec_at(s, off);
    r->klen = (uint32_t)klen;
    r->vlen = (uint32_t)vlen;
    r->bucket = b;
    memcpy(s->ring + off + sizeof(*r), key, klen);
    if (vlen > 0) {
        memcpy(s->ring + off + sizeof(*r) + klen, v, vlen);
    }
    size_t tail = sizeof(*r) + klen + vlen;
    memset(s->ring + off + tail, 0, n - tail);
    return r;
}

/* The way of bucket B that KEY's new record takes, emptied: the one that
 * held KEY, else an empty one or the oldest. */
static int
way_take(struct ld_near_shm *s, uint32_t b, uint32_t hash, const char *key,
         size_t klen)
{
    int w = way_find(s, b, hash, key, klen);
    if (w >= 0) {
        way_clear(s, b, (uint32_t)w);
    } else {
        w = way_victim(s, b);
        if (s->buckets[b].way[w].klen != 0) {
            way_clear(s, b, (uint32_t)w);
        }
    }
    return w;
}

bool
ld_near_shm_put(struct ld_near_shm *s, const char *key, size_t klen,
                const char *v, size_t vlen, uint64_t deadline_ns,
                uint64_t version)
{
    if (klen == 0) {
        /* klen 0 marks an empty way: such a key cannot be stored. */
        return false;
    }
    /* The layout's lengths are 32 bits: a segment over 16 GiB could
     * otherwise take a value whose length does not fit. */
    if (klen > UINT32_MAX || vlen > UINT32_MAX || klen > s->ring_bytes ||
        vlen > s->ring_bytes || rec_bytes(klen, vlen) > s->ring_bytes / 4) {
        ld_near_shm_del(s, key, klen);
        return false;
    }
    uint64_t n = rec_bytes(klen, vlen);
    uint32_t hash = leased_near_crc32(key, klen);
    uint32_t b = hash & s->mask;

    make_room(s, n);
    uint64_t off = s->head;
    struct leased_near_rec *r = rec_write(s, off, n, b, key, klen, v, vlen);
    int w = way_take(s, b, hash, key, klen);
    r->way = (uint32_t)w;
    struct leased_near_bucket *bk = &s->buckets[b];
    bucket_open(bk);
    way_store(&bk->way[w], hash, (uint32_t)klen, (uint32_t)vlen,
              v == NULL ? LEASED_NEAR_NULL : 0, off, deadline_ns, version);
    bucket_close(bk);
    s->head += n;
    s->used_bytes += n;
    s->entries++;
    publish_usage(s);
    return true;
}

void
ld_near_shm_del(struct ld_near_shm *s, const char *key, size_t klen)
{
    if (klen == 0) {
        return;
    }
    uint32_t hash = leased_near_crc32(key, klen);
    uint32_t b = hash & s->mask;
    int w = way_find(s, b, hash, key, klen);
    if (w >= 0) {
        way_clear(s, b, (uint32_t)w);
        publish_usage(s);
    }
}

void
ld_near_shm_flush(struct ld_near_shm *s)
{
    /* The epoch moves first: a reader whose lookup straddles the flush
     * reads two epochs and drops what it found. */
    uint64_t epoch = __atomic_load_n(&s->hdr->epoch, __ATOMIC_RELAXED);
    __atomic_store_n(&s->hdr->epoch, epoch + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (uint64_t b = 0; b <= s->mask; b++) {
        struct leased_near_bucket *bk = &s->buckets[b];
        for (int w = 0; w < LEASED_NEAR_WAYS; w++) {
            if (bk->way[w].klen != 0) {
                way_clear(s, (uint32_t)b, (uint32_t)w);
            }
        }
    }
    LD_ASSERT(s->entries == 0 && s->used_bytes == 0);
    s->head = 0;
    s->old = 0;
    s->lap_end = 0;
    publish_usage(s);
}

void
ld_near_shm_beat(struct ld_near_shm *s, uint64_t now_ns)
{
    __atomic_store_n(&s->hdr->heartbeat_ns, now_ns, __ATOMIC_RELEASE);
}

void
ld_near_shm_usage(const struct ld_near_shm *s, struct ld_near_shm_usage *out)
{
    out->bytes = s->bytes;
    out->used_bytes = s->used_bytes;
    out->entries = s->entries;
}
