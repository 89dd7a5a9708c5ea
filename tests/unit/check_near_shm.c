/* The shared near cache segment: the daemon's writer (ld_near_shm) and
 * libleased's reader (leased_near_lookup), through a read-only mapping
 * of the descriptor a client would get, as a client maps it. */
#include "ld_common.h"

#include "ld_near_shm.h"

#include "leased/near.h"
#include "leased/near_layout.h"

#include "unit.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SEC 1000000000ull
#define FAR (3600ull * SEC) /* a deadline or staleness no test reaches */

static struct ld_near_shm *seg;
static const unsigned char *ro;
static size_t ro_len;

static uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* A segment of BYTES and a client's read-only mapping of it. */
static void
open_seg(uint64_t bytes, uint64_t stale_ns)
{
    seg = ld_near_shm_create("leased-near-test", bytes, stale_ns);
    ck_assert_ptr_nonnull(seg);
    int fd = ld_near_shm_ro_fd(seg);
    ck_assert_int_ge(fd, 0);
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    ro_len = (size_t)st.st_size;
    void *m = mmap(NULL, ro_len, PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    close(fd);
    ro = m;
}

static void
close_seg(void)
{
    ld_near_shm_destroy(seg);
    seg = NULL;
    munmap((void *)ro, ro_len);
    ro = NULL;
}

static const struct leased_near_hdr *
hdr(void)
{
    return (const struct leased_near_hdr *)(const void *)ro;
}

static bool
put(const char *k, const char *v, uint64_t version)
{
    return ld_near_shm_put(seg, k, strlen(k), v, v ? strlen(v) : 0,
                           now_ns() + FAR, version);
}

static enum leased_near_result
get(const char *k, char *buf, size_t cap, struct leased_near_value *out)
{
    return leased_near_lookup(ro, ro_len, k, strlen(k), now_ns(), buf, cap,
                              out);
}

/* KEY's value is V (NUL-terminated) in the segment. */
static void
assert_hit(const char *k, const char *v)
{
    char buf[4096];
    struct leased_near_value out;
    ck_assert_int_eq(get(k, buf, sizeof(buf), &out), LEASED_NEAR_HIT);
    ck_assert_int_eq(out.null, 0);
    ck_assert_uint_eq(out.vlen, strlen(v));
    ck_assert(memcmp(buf, v, out.vlen) == 0);
}

static void
assert_miss(const char *k)
{
    char buf[64];
    struct leased_near_value out;
    ck_assert_int_eq(get(k, buf, sizeof(buf), &out), LEASED_NEAR_MISS);
}

START_TEST(crc_table_matches_bitwise)
{
    ck_assert_uint_eq(leased_near_hash("123456789", 9), 0xCBF43926u);
    ck_assert_uint_eq(leased_near_crc32("123456789", 9), 0xCBF43926u);
    unsigned char data[512];
    unsigned int x = 12345;
    for (size_t i = 0; i < sizeof(data); i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (unsigned char)(x >> 16);
    }
    for (size_t len = 0; len <= sizeof(data); len += 7) {
        ck_assert_uint_eq(leased_near_hash(data, len),
                          leased_near_crc32(data, len));
    }
}
END_TEST

START_TEST(header_is_layout_1)
{
    open_seg(100000, 50 * 1000000ull);
    const struct leased_near_hdr *h = hdr();
    ck_assert(memcmp(h->magic, LEASED_NEAR_MAGIC, 8) == 0);
    ck_assert_uint_eq(h->layout, LEASED_NEAR_LAYOUT);
    /* Rounded down to whole pages, and at least 64 KiB. */
    ck_assert_uint_eq(h->total_bytes, 98304);
    ck_assert_uint_eq(ro_len, 98304);
    ck_assert_uint_eq(h->ways, LEASED_NEAR_WAYS);
    ck_assert_uint_ne(h->nbuckets, 0);
    ck_assert_uint_eq(h->nbuckets & (h->nbuckets - 1), 0);
    ck_assert_uint_ge(h->buckets_off, h->header_bytes);
    ck_assert_uint_ge(h->ring_off,
                      h->buckets_off + (uint64_t)h->nbuckets *
                                           sizeof(struct leased_near_bucket));
    ck_assert_uint_eq(h->ring_off + h->ring_bytes, h->total_bytes);
    ck_assert_uint_eq(h->stale_ns, 50 * 1000000ull);
    ck_assert_uint_eq(h->state, LEASED_NEAR_LIVE);
    close_seg();
    open_seg(1000, FAR);
    ck_assert_uint_eq(hdr()->total_bytes, 65536);
    close_seg();
}
END_TEST

START_TEST(put_get_replace_del)
{
    open_seg(1 << 20, FAR);
    assert_miss("user:1");
    ck_assert(put("user:1", "alice", 0));
    ck_assert(put("user:2", "bob", 0));
    assert_hit("user:1", "alice");
    assert_hit("user:2", "bob");
    ck_assert(put("user:1", "alice the second", 0));
    assert_hit("user:1", "alice the second");
    struct ld_near_shm_usage u;
    ld_near_shm_usage(seg, &u);
    ck_assert_uint_eq(u.entries, 2);
    ck_assert_uint_eq(hdr()->entries, 2);
    ck_assert_uint_eq(u.bytes, 1 << 20);
    ld_near_shm_del(seg, "user:1", 6);
    assert_miss("user:1");
    assert_hit("user:2", "bob");
    ld_near_shm_del(seg, "user:1", 6); /* twice: nothing happens */
    ld_near_shm_usage(seg, &u);
    ck_assert_uint_eq(u.entries, 1);
    ck_assert_uint_eq(u.used_bytes, hdr()->used_bytes);
    /* A key that shares a prefix is another key. */
    assert_miss("user:");
    assert_miss("user:22");
    close_seg();
}
END_TEST

START_TEST(null_empty_version_too_small)
{
    open_seg(1 << 20, FAR);
    char buf[16];
    struct leased_near_value out;
    ck_assert(put("gone", NULL, 0));
    ck_assert_int_eq(get("gone", buf, sizeof(buf), &out), LEASED_NEAR_HIT);
    ck_assert_int_eq(out.null, 1);
    ck_assert_uint_eq(out.vlen, 0);
    ck_assert(put("empty", "", 0));
    ck_assert_int_eq(get("empty", buf, sizeof(buf), &out), LEASED_NEAR_HIT);
    ck_assert_int_eq(out.null, 0);
    ck_assert_uint_eq(out.vlen, 0);
    ck_assert(put("v", "x", 42));
    ck_assert_int_eq(get("v", buf, sizeof(buf), &out), LEASED_NEAR_HIT);
    ck_assert_uint_eq(out.version, 42);
    ck_assert(put("v", "y", 0));
    ck_assert_int_eq(get("v", buf, sizeof(buf), &out), LEASED_NEAR_HIT);
    ck_assert_uint_eq(out.version, 0);
    ck_assert(put("big", "0123456789abcdefXYZ", 0));
    ck_assert_int_eq(get("big", buf, sizeof(buf), &out),
                     LEASED_NEAR_TOO_SMALL);
    ck_assert_uint_eq(out.vlen, 19);
    char big[19];
    ck_assert_int_eq(get("big", big, sizeof(big), &out), LEASED_NEAR_HIT);
    ck_assert(memcmp(big, "0123456789abcdefXYZ", 19) == 0);
    /* An empty key cannot be stored (klen 0 is an empty way). */
    ck_assert(!ld_near_shm_put(seg, "", 0, "x", 1, now_ns() + FAR, 0));
    ck_assert_int_eq(get("", buf, sizeof(buf), &out), LEASED_NEAR_MISS);
    close_seg();
}
END_TEST

START_TEST(flush_moves_epoch)
{
    open_seg(1 << 20, FAR);
    ck_assert(put("a", "1", 0));
    ck_assert(put("b", "2", 0));
    uint64_t e = hdr()->epoch;
    ld_near_shm_flush(seg);
    ck_assert_uint_eq(hdr()->epoch, e + 1);
    assert_miss("a");
    assert_miss("b");
    struct ld_near_shm_usage u;
    ld_near_shm_usage(seg, &u);
    ck_assert_uint_eq(u.entries, 0);
    ck_assert_uint_eq(u.used_bytes, 0);
    ck_assert_uint_eq(hdr()->entries, 0);
    ck_assert(put("a", "3", 0));
    assert_hit("a", "3");
    close_seg();
}
END_TEST

START_TEST(deadline_passed)
{
    open_seg(1 << 20, FAR);
    uint64_t now = now_ns();
    ck_assert(ld_near_shm_put(seg, "k", 1, "v", 1, now + 1000, 0));
    char buf[8];
    struct leased_near_value out;
    ck_assert_int_eq(leased_near_lookup(ro, ro_len, "k", 1, now, buf,
                                        sizeof(buf), &out),
                     LEASED_NEAR_HIT);
    ck_assert_int_eq(leased_near_lookup(ro, ro_len, "k", 1, now + 1000, buf,
                                        sizeof(buf), &out),
                     LEASED_NEAR_MISS);
    close_seg();
}
END_TEST

START_TEST(heartbeat_stale)
{
    open_seg(1 << 20, 50 * 1000000ull);
    ck_assert(put("k", "v", 0));
    uint64_t now = now_ns();
    ld_near_shm_beat(seg, now);
    char buf[8];
    struct leased_near_value out;
    ck_assert_int_eq(leased_near_lookup(ro, ro_len, "k", 1, now + 50000000,
                                        buf, sizeof(buf), &out),
                     LEASED_NEAR_HIT);
    ck_assert_int_eq(leased_near_lookup(ro, ro_len, "k", 1, now + 50000001,
                                        buf, sizeof(buf), &out),
                     LEASED_NEAR_FALLBACK);
    ck_assert_int_eq(leased_near_lookup(ro, ro_len, "nope", 4, now + 50000001,
                                        buf, sizeof(buf), &out),
                     LEASED_NEAR_FALLBACK);
    ld_near_shm_beat(seg, now + 50000001);
    ck_assert_uint_eq(hdr()->heartbeat_ns, now + 50000001);
    ck_assert_int_eq(leased_near_lookup(ro, ro_len, "k", 1, now + 50000001,
                                        buf, sizeof(buf), &out),
                     LEASED_NEAR_HIT);
    close_seg();
}
END_TEST

START_TEST(closed_state)
{
    open_seg(1 << 20, FAR);
    ck_assert(put("k", "v", 0));
    assert_hit("k", "v");
    /* The client's mapping outlives the segment and says closed. */
    ld_near_shm_destroy(seg);
    seg = NULL;
    ck_assert_uint_eq(hdr()->state, LEASED_NEAR_CLOSED);
    char buf[8];
    struct leased_near_value out;
    ck_assert_int_eq(get("k", buf, sizeof(buf), &out), LEASED_NEAR_CLOSED_SEG);
    munmap((void *)ro, ro_len);
}
END_TEST

/* Keys that all fall in bucket 0 of the segment. */
static int
same_bucket_keys(char keys[][32], int n)
{
    uint32_t mask = hdr()->nbuckets - 1;
    int found = 0;
    for (int i = 0; found < n && i < 10000000; i++) {
        char k[32];
        snprintf(k, sizeof(k), "collide:%d", i);
        if ((leased_near_crc32(k, strlen(k)) & mask) == 0) {
            memcpy(keys[found++], k, sizeof(k));
        }
    }
    return found;
}

START_TEST(bucket_overflow_drops_oldest)
{
    open_seg(1 << 20, FAR);
    char keys[LEASED_NEAR_WAYS + 2][32];
    ck_assert_int_eq(same_bucket_keys(keys, LEASED_NEAR_WAYS + 2),
                     LEASED_NEAR_WAYS + 2);
    for (int i = 0; i < LEASED_NEAR_WAYS; i++) {
        ck_assert(put(keys[i], keys[i], 0));
    }
    for (int i = 0; i < LEASED_NEAR_WAYS; i++) {
        assert_hit(keys[i], keys[i]);
    }
    /* Key 0 written again is now the newest; key 1 is the oldest. */
    ck_assert(put(keys[0], "again", 0));
    ck_assert(put(keys[LEASED_NEAR_WAYS], "fifth", 0));
    assert_miss(keys[1]);
    assert_hit(keys[0], "again");
    for (int i = 2; i < LEASED_NEAR_WAYS; i++) {
        assert_hit(keys[i], keys[i]);
    }
    assert_hit(keys[LEASED_NEAR_WAYS], "fifth");
    ck_assert(put(keys[LEASED_NEAR_WAYS + 1], "sixth", 0));
    assert_miss(keys[2]);
    struct ld_near_shm_usage u;
    ld_near_shm_usage(seg, &u);
    ck_assert_uint_eq(u.entries, LEASED_NEAR_WAYS);
    close_seg();
}
END_TEST

START_TEST(ring_wrap_and_reuse)
{
    open_seg(64 * 1024, FAR);
    uint64_t ring = hdr()->ring_bytes;
    char v[1000];
    memset(v, 'v', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    /* Far more than the ring holds: every record's bytes are reused
     * several times over. */
    int n = (int)(ring / 500) * 6;
    for (int i = 0; i < n; i++) {
        char k[32];
        snprintf(k, sizeof(k), "ring:%d", i);
        snprintf(v, 16, "%015d", i);
        v[15] = 'v';
        ck_assert(put(k, v, 0));
        assert_hit(k, v);
        struct ld_near_shm_usage u;
        ld_near_shm_usage(seg, &u);
        ck_assert_uint_le(u.used_bytes, ring);
    }
    /* What is still there is right, the newest is there, and the count of
     * entries is what a reader finds. */
    uint64_t hits = 0;
    for (int i = 0; i < n; i++) {
        char k[32], buf[2048];
        snprintf(k, sizeof(k), "ring:%d", i);
        struct leased_near_value out;
        enum leased_near_result r = get(k, buf, sizeof(buf), &out);
        ck_assert(r == LEASED_NEAR_HIT || r == LEASED_NEAR_MISS);
        if (r == LEASED_NEAR_HIT) {
            char want[16];
            snprintf(want, sizeof(want), "%015d", i);
            ck_assert_uint_eq(out.vlen, sizeof(v) - 1);
            ck_assert(memcmp(buf, want, 15) == 0);
            hits++;
        }
    }
    char last[32];
    snprintf(last, sizeof(last), "ring:%d", n - 1);
    struct ld_near_shm_usage u;
    ld_near_shm_usage(seg, &u);
    ck_assert_uint_eq(hits, u.entries);
    ck_assert_uint_eq(hits, hdr()->entries);
    /* The ring held most of what fits in it. */
    ck_assert_uint_ge(hits, ring / 1100 - LEASED_NEAR_WAYS);
    char buf[2048];
    struct leased_near_value out;
    ck_assert_int_eq(get(last, buf, sizeof(buf), &out), LEASED_NEAR_HIT);
    close_seg();
}
END_TEST

START_TEST(oversize_not_stored)
{
    open_seg(64 * 1024, FAR);
    uint64_t ring = hdr()->ring_bytes;
    size_t big = (size_t)(ring / 4);
    char *v = malloc(big + 1);
    memset(v, 'x', big);
    ck_assert(put("k", "small", 0));
    assert_hit("k", "small");
    /* A quarter of the ring with its record header is over a quarter. */
    ck_assert(!ld_near_shm_put(seg, "k", 1, v, big, now_ns() + FAR, 0));
    assert_miss("k");
    /* Just under fits. */
    size_t fits = big - sizeof(struct leased_near_rec) - 8;
    ck_assert(ld_near_shm_put(seg, "k", 1, v, fits, now_ns() + FAR, 0));
    char *buf = malloc(big);
    struct leased_near_value out;
    ck_assert_int_eq(get("k", buf, big, &out), LEASED_NEAR_HIT);
    ck_assert_uint_eq(out.vlen, fits);
    free(buf);
    free(v);
    close_seg();
}
END_TEST

START_TEST(ro_fd_not_writable)
{
    open_seg(64 * 1024, FAR);
    int fd = ld_near_shm_ro_fd(seg);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
    ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    void *m = mmap(NULL, ro_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ck_assert_ptr_eq(m, MAP_FAILED);
    ck_assert_int_eq(errno, EACCES);
    m = mmap(NULL, ro_len, PROT_READ, MAP_SHARED, fd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    ck_assert_int_ne(mprotect(m, ro_len, PROT_READ | PROT_WRITE), 0);
    munmap(m, ro_len);
    ck_assert_int_ne(ftruncate(fd, 0), 0);
    /* Reopened read-write through /proc, it still cannot be written
     * (F_SEAL_FUTURE_WRITE), nor resized (SHRINK, GROW). */
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int rw = open(path, O_RDWR | O_CLOEXEC);
    if (rw >= 0) {
        m = mmap(NULL, ro_len, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        ck_assert_ptr_eq(m, MAP_FAILED);
        ck_assert_int_lt(pwrite(rw, "x", 1, 0), 0);
        ck_assert_int_ne(ftruncate(rw, 0), 0);
        ck_assert_int_ne(ftruncate(rw, (off_t)ro_len * 2), 0);
        close(rw);
    }
    ck_assert_int_eq(fcntl(fd, F_GET_SEALS) & F_SEAL_SEAL, F_SEAL_SEAL);
    close(fd);
    close_seg();
}
END_TEST

START_TEST(garbage_header_falls_back)
{
    open_seg(64 * 1024, FAR);
    ck_assert(put("k", "v", 0));
    size_t len = ro_len;
    unsigned char *copy = aligned_alloc(4096, len);
    char buf[8];
    struct leased_near_value out;
    /* A private copy of the bytes, spoiled one field at a time. */
    struct {
        size_t off;
        uint64_t val;
        int width;
    } spoil[] = {
        {0, 0, 1},           /* magic */
        {8, 2, 4},           /* layout */
        {16, 1ull << 40, 8}, /* total_bytes past the mapping */
        {24, 3, 4},          /* nbuckets not a power of two */
        {24, 1u << 31, 4},   /* buckets past the end */
        {28, 8, 4},          /* ways */
        {32, 4, 8},          /* buckets_off misaligned */
        {32, UINT64_MAX - 7, 8},
        {40, UINT64_MAX - 7, 8}, /* ring_off */
        {48, UINT64_MAX - 7, 8}, /* ring_bytes */
        {80, 7, 4},              /* state */
    };
    for (size_t i = 0; i < sizeof(spoil) / sizeof(spoil[0]); i++) {
        memcpy(copy, ro, len);
        ck_assert_int_eq(leased_near_lookup(copy, len, "k", 1, now_ns(), buf,
                                            sizeof(buf), &out),
                         LEASED_NEAR_HIT);
        memcpy(copy + spoil[i].off, &spoil[i].val, (size_t)spoil[i].width);
        ck_assert_msg(leased_near_lookup(copy, len, "k", 1, now_ns(), buf,
                                         sizeof(buf),
                                         &out) == LEASED_NEAR_FALLBACK,
                      "spoiled field %zu", i);
    }
    /* A mapping shorter than the header, or misaligned. */
    ck_assert_int_eq(leased_near_lookup(copy, 100, "k", 1, now_ns(), buf,
                                        sizeof(buf), &out),
                     LEASED_NEAR_FALLBACK);
    ck_assert_int_eq(leased_near_lookup(copy + 4, len - 4, "k", 1, now_ns(),
                                        buf, sizeof(buf), &out),
                     LEASED_NEAR_FALLBACK);
    free(copy);
    close_seg();
}
END_TEST

/*
 * The torture: one writer puts, replaces and deletes self-checking values
 * while two readers look the same keys up. A value is its key, the
 * writer's count, filler of a length that varies, and a checksum of all
 * that: a reader that kept a value torn by a concurrent write (half old
 * record, half new) or a value of another key would see it.
 */
#define T_KEYS 16
#define T_OPS 1000000
#define T_MAXV 12000

static volatile int t_done;

struct t_reader {
    unsigned long long hits, misses, fallbacks, bad;
    char first_bad[160];
};

/* "k<key>|<op>|<length>|", filler of one letter that the op chooses, and
 * the CRC-32 of the head: a torn copy mixes two records, so some byte is
 * not what the head says (filler, length or CRC). Cheap to make, so the
 * writer spends its time writing the ring. */
static char
t_fill(int key, unsigned long long op)
{
    return (char)('a' + (int)((op * 7u + (unsigned)key) % 26u));
}

static size_t
t_value(char *v, int key, unsigned long long op)
{
    size_t len = 40 + (size_t)((op * 2654435761ull) % (T_MAXV - 40));
    int n = snprintf(v, 48, "k%d|%llu|%zu|", key, op, len);
    uint32_t crc = leased_near_hash(v, (size_t)n);
    memset(v + n, t_fill(key, op), len - (size_t)n - sizeof(crc));
    memcpy(v + len - sizeof(crc), &crc, sizeof(crc));
    return len;
}

static int
t_check(int key, const char *v, size_t len)
{
    int k, n = 0;
    unsigned long long op;
    size_t want;
    char head[48];
    if (len < 40) {
        return 0;
    }
    memcpy(head, v, 40);
    head[40] = '\0';
    if (sscanf(head, "k%d|%llu|%zu|%n", &k, &op, &want, &n) != 3 || n == 0 ||
        k != key || want != len) {
        return 0;
    }
    uint32_t crc;
    memcpy(&crc, v + len - sizeof(crc), sizeof(crc));
    if (crc != leased_near_hash(v, (size_t)n)) {
        return 0;
    }
    /* Every filler byte is the one the op chose: the first is, and each
     * equals the next. */
    size_t fill = len - (size_t)n - sizeof(crc);
    return v[n] == t_fill(key, op) && memcmp(v + n, v + n + 1, fill - 1) == 0;
}

static void *
t_read(void *arg)
{
    struct t_reader *r = arg;
    char buf[T_MAXV + 64];
    unsigned int x = (unsigned int)(uintptr_t)arg;
    while (!__atomic_load_n(&t_done, __ATOMIC_ACQUIRE)) {
        x = x * 1103515245u + 12345u;
        int key = (int)((x >> 16) % T_KEYS);
        char k[16];
        snprintf(k, sizeof(k), "torture:%d", key);
        struct leased_near_value out;
        enum leased_near_result res = leased_near_lookup(ro, ro_len, k,
                                                         strlen(k), now_ns(),
                                                         buf, sizeof(buf),
                                                         &out);
        if (res == LEASED_NEAR_HIT) {
            r->hits++;
            if (!t_check(key, buf, out.vlen)) {
                if (r->bad++ == 0) {
                    snprintf(r->first_bad, sizeof(r->first_bad),
                             "key %d vlen %llu: %.40s", key,
                             (unsigned long long)out.vlen, buf);
                }
            }
        } else if (res == LEASED_NEAR_MISS) {
            r->misses++;
        } else {
            r->fallbacks++;
        }
    }
    return NULL;
}

START_TEST(torture_no_torn_reads)
{
    /* Small: the ring wraps every few hundred writes, so ring bytes under
     * a reader's copy are reused all the time. */
    open_seg(64 * 1024, FAR);
    struct t_reader readers[2];
    pthread_t th[2];
    memset(readers, 0, sizeof(readers));
    t_done = 0;
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(pthread_create(&th[i], NULL, t_read, &readers[i]), 0);
    }
    char v[T_MAXV + 64];
    unsigned int x = 99;
    unsigned long long puts = 0, dels = 0, flushes = 0;
    for (unsigned long long op = 1; op <= T_OPS; op++) {
        x = x * 1103515245u + 12345u;
        int key = (int)((x >> 16) % T_KEYS);
        char k[16];
        snprintf(k, sizeof(k), "torture:%d", key);
        unsigned int what = (x >> 8) % 100;
        if (what < 90) {
            size_t len = t_value(v, key, op);
            ck_assert(ld_near_shm_put(seg, k, strlen(k), v, len,
                                      now_ns() + FAR, op));
            puts++;
        } else if (what < 99) {
            ld_near_shm_del(seg, k, strlen(k));
            dels++;
        } else {
            ld_near_shm_flush(seg);
            flushes++;
        }
    }
    __atomic_store_n(&t_done, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
    }
    for (int i = 0; i < 2; i++) {
        struct t_reader *r = &readers[i];
        fprintf(stderr,
                "torture reader %d: %llu hits, %llu misses, %llu fallbacks, "
                "%llu bad (writer: %llu puts, %llu dels, %llu flushes)\n",
                i, r->hits, r->misses, r->fallbacks, r->bad, puts, dels,
                flushes);
        ck_assert_msg(r->bad == 0, "reader %d kept %llu torn values: %s", i,
                      r->bad, r->first_bad);
        /* The readers ran while the writer did. */
        ck_assert_uint_gt(r->hits, 0);
    }
    close_seg();
}
END_TEST

static Suite *
near_shm_suite(void)
{
    Suite *s = suite_create("near_shm");
    TCase *tc = tcase_create("segment");
    tcase_add_test(tc, crc_table_matches_bitwise);
    tcase_add_test(tc, header_is_layout_1);
    tcase_add_test(tc, put_get_replace_del);
    tcase_add_test(tc, null_empty_version_too_small);
    tcase_add_test(tc, flush_moves_epoch);
    tcase_add_test(tc, deadline_passed);
    tcase_add_test(tc, heartbeat_stale);
    tcase_add_test(tc, closed_state);
    tcase_add_test(tc, bucket_overflow_drops_oldest);
    tcase_add_test(tc, ring_wrap_and_reuse);
    tcase_add_test(tc, oversize_not_stored);
    tcase_add_test(tc, ro_fd_not_writable);
    tcase_add_test(tc, garbage_header_falls_back);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("torture");
    tcase_set_timeout(tt, 120);
    tcase_add_test(tt, torture_no_torn_reads);
    suite_add_tcase(s, tt);
    return s;
}

int
main(void)
{
    return ld_unit_run(near_shm_suite());
}
