/*
 * Writes the seeds of fuzz_near_seg with the daemon's own writer: real
 * segments (a few keys, a cached null, a version, a deleted key, keys
 * that share a bucket, a ring that wrapped), each cut after the last
 * record in use (header fields made to agree) so the seeds stay small,
 * followed by the key to look up and its length. Built on demand:
 *   make tests/fuzz/mknearseg && tests/fuzz/mknearseg DIR
 */
#include "ld_common.h"

#include "ld_near_shm.h"

#include "leased/near_layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *dir;

static uint64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void
put(struct ld_near_shm *s, const char *k, const char *v, uint64_t version)
{
    ld_near_shm_put(s, k, strlen(k), v, v ? strlen(v) : 0,
                    mono_ns() + 3600ull * 1000000000u, version);
}

/* Writes segment S, cut after its last record, and KEY to DIR/NAME. */
static void
dump(struct ld_near_shm *s, const char *name, const char *key)
{
    int fd = ld_near_shm_ro_fd(s);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror("segment");
        exit(1);
    }
    size_t len = (size_t)st.st_size;
    unsigned char *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    unsigned char *c = malloc(len);
    memcpy(c, m, len);
    munmap(m, len);
    struct leased_near_hdr h;
    memcpy(&h, c, sizeof(h));
    uint64_t end = 0;
    for (uint32_t b = 0; b < h.nbuckets; b++) {
        struct leased_near_bucket bk;
        memcpy(&bk, c + h.buckets_off + (uint64_t)b * sizeof(bk), sizeof(bk));
        for (int w = 0; w < LEASED_NEAR_WAYS; w++) {
            if (bk.way[w].klen == 0) {
                continue;
            }
            uint64_t e = bk.way[w].off + sizeof(struct leased_near_rec) +
                         bk.way[w].klen + bk.way[w].vlen;
            if (e > end) {
                end = e;
            }
        }
    }
    end = (end + 7u) & ~(uint64_t)7u;
    h.ring_bytes = end;
    h.total_bytes = h.ring_off + end;
    memcpy(c, &h, sizeof(h));
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    unsigned char kl = (unsigned char)strlen(key);
    if (f == NULL || fwrite(c, 1, h.total_bytes, f) != h.total_bytes ||
        fwrite(key, 1, kl, f) != kl || fwrite(&kl, 1, 1, f) != 1 ||
        fclose(f) != 0) {
        perror(path);
        exit(1);
    }
    free(c);
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    dir = argv[1];
    struct ld_near_shm *s = ld_near_shm_create("seed", 65536, 50000000u);
    if (s == NULL) {
        perror("ld_near_shm_create");
        return 1;
    }
    ld_near_shm_beat(s, mono_ns());
    put(s, "user:1", "alice", 0);
    put(s, "user:2", "{\"name\":\"bob\"}", 7);
    put(s, "gone", NULL, 0);
    put(s, "empty", "", 0);
    dump(s, "hit", "user:1");
    dump(s, "hit-version", "user:2");
    dump(s, "null", "gone");
    dump(s, "miss", "user:3");
    ld_near_shm_del(s, "user:1", 6);
    dump(s, "deleted", "user:1");
    /* Keys enough to fill buckets and wrap the ring. */
    char k[32], v[600];
    memset(v, 'v', sizeof(v) - 1);
    v[sizeof(v) - 1] = '\0';
    for (int i = 0; i < 400; i++) {
        snprintf(k, sizeof(k), "k%d", i);
        put(s, k, v + (i % 500), (uint64_t)i);
    }
    dump(s, "wrapped", "k399");
    ld_near_shm_flush(s);
    put(s, "after", "flush", 0);
    dump(s, "flushed", "after");
    ld_near_shm_destroy(s);
    return 0;
}
