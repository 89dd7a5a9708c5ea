/*
 * A near hit read from the shared near cache segment by C, one thread,
 * against a direct GET round trip to Redis (hiredis, one connection) of
 * the same key and value size, in the same run (bench/near-shm.sh runs
 * it; figures in bench/results.md).
 *
 * The segment is written by the daemon's own writer (ld_near_shm) in
 * this process, with a thread that beats it every 10 ms as the daemon's
 * loop does, and read through a read-only mapping of its descriptor, as a
 * client maps it; the reader does exactly what libleased does per lookup:
 * a CLOCK_MONOTONIC read and leased_near_lookup. Two reader rows: into a
 * caller's buffer, and as leased_near_get (the value also copied into a
 * malloc'd, NUL-terminated string, freed here).
 *
 * Each row's ops/s comes from an untimed loop of SECS seconds; its p50
 * from timing each of the next 200000 ops (or SECS of GETs) one by one,
 * the cost of the clock reads included. The rows alternate, REPEAT times;
 * the output is the median of each.
 *
 * usage: near-shm-bench --redis-port P [--redis-host H] [--size B]
 *                       [--secs S] [--repeat N] [--keys K]
 */
#include "ld_common.h"

#include "ld_near_shm.h"

#include "leased/near.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KEY "bench:near:hot"
#define TIMED_OPS 200000

static struct ld_near_shm *seg;
static const unsigned char *map;
static size_t map_len;
static volatile int stop_beat;
static volatile unsigned sink;

static uint64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *
beat(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&stop_beat, __ATOMIC_RELAXED)) {
        ld_near_shm_beat(seg, mono_ns());
        usleep(10000);
    }
    return NULL;
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int
cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
median_dbl(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_dbl);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One lookup as libleased does it; COPY: also as leased_near_get hands
 * the value out. */
static void
near_op(char *buf, size_t cap, size_t size, int copy)
{
    struct leased_near_value v;
    enum leased_near_result r = leased_near_lookup(map, map_len, KEY,
                                                   sizeof(KEY) - 1, mono_ns(),
                                                   buf, cap, &v);
    if (r != LEASED_NEAR_HIT || v.vlen != size) {
        fprintf(stderr, "near-shm-bench: lookup gave %d (vlen %llu)\n", r,
                (unsigned long long)v.vlen);
        exit(1);
    }
    if (copy) {
        char *s = malloc(v.vlen + 1);
        if (s == NULL) {
            abort();
        }
        memcpy(s, buf, v.vlen);
        s[v.vlen] = '\0';
        sink += (unsigned char)s[v.vlen / 2];
        free(s);
    } else {
        sink += (unsigned char)buf[v.vlen / 2];
    }
}

static void
near_row(double secs, size_t size, int copy, double *ops_s, double *p50_ns)
{
    char *buf = malloc(size + 64);
    uint64_t *lat = malloc(sizeof(*lat) * TIMED_OPS);
    uint64_t n = 0, t0 = mono_ns(), end = t0 + (uint64_t)(secs * 1e9), t;
    do {
        for (int i = 0; i < 1024; i++) {
            near_op(buf, size + 64, size, copy);
        }
        n += 1024;
    } while ((t = mono_ns()) < end);
    *ops_s = (double)n / ((double)(t - t0) / 1e9);
    for (int i = 0; i < TIMED_OPS; i++) {
        uint64_t a = mono_ns();
        near_op(buf, size + 64, size, copy);
        lat[i] = mono_ns() - a;
    }
    qsort(lat, TIMED_OPS, sizeof(*lat), cmp_u64);
    *p50_ns = (double)lat[TIMED_OPS / 2];
    free(lat);
    free(buf);
}

static void
get_op(redisContext *rc, size_t size)
{
    redisReply *r = redisCommand(rc, "GET %s", KEY);
    if (r == NULL || r->type != REDIS_REPLY_STRING || (size_t)r->len != size) {
        fprintf(stderr, "near-shm-bench: GET failed\n");
        exit(1);
    }
    sink += (unsigned char)r->str[size / 2];
    freeReplyObject(r);
}

static void
get_row(redisContext *rc, double secs, size_t size, double *ops_s,
        double *p50_ns)
{
    uint64_t n = 0, t0 = mono_ns(), end = t0 + (uint64_t)(secs * 1e9), t;
    do {
        get_op(rc, size);
        n++;
    } while ((t = mono_ns()) < end);
    *ops_s = (double)n / ((double)(t - t0) / 1e9);
    size_t cap = (size_t)(*ops_s * secs) + 16, k = 0;
    uint64_t *lat = malloc(sizeof(*lat) * cap);
    end = mono_ns() + (uint64_t)(secs * 1e9);
    while (k < cap && mono_ns() < end) {
        uint64_t a = mono_ns();
        get_op(rc, size);
        lat[k++] = mono_ns() - a;
    }
    qsort(lat, k, sizeof(*lat), cmp_u64);
    *p50_ns = (double)lat[k / 2];
    free(lat);
}

int
main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 0, repeat = 5, keys = 10000;
    size_t size = 100;
    double secs = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--redis-port") == 0) {
            port = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--redis-host") == 0) {
            host = argv[i + 1];
        } else if (strcmp(argv[i], "--size") == 0) {
            size = (size_t)atol(argv[i + 1]);
        } else if (strcmp(argv[i], "--secs") == 0) {
            secs = atof(argv[i + 1]);
        } else if (strcmp(argv[i], "--repeat") == 0) {
            repeat = atoi(argv[i + 1]);
        } else if (strcmp(argv[i], "--keys") == 0) {
            keys = atoi(argv[i + 1]);
        } else {
            fprintf(stderr, "near-shm-bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (port <= 0 || size == 0 || repeat <= 0 || repeat > 100 || keys < 1) {
        fprintf(stderr, "usage: near-shm-bench --redis-port P [--redis-host "
                        "H] [--size B] [--secs S] [--repeat N] [--keys K]\n");
        return 2;
    }

    char *value = malloc(size);
    memset(value, 'v', size);
    redisContext *rc = redisConnect(host, port);
    if (rc == NULL || rc->err) {
        fprintf(stderr, "near-shm-bench: redis %s:%d: %s\n", host, port,
                rc ? rc->errstr : "no memory");
        return 1;
    }
    redisReply *r = redisCommand(rc, "SET %s %b", KEY, value, size);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "near-shm-bench: SET failed\n");
        return 1;
    }
    freeReplyObject(r);

    /* The daemon's default segment, with other keys around the hot one. */
    seg = ld_near_shm_create("near-shm-bench", 16u << 20, 50000000u);
    if (seg == NULL) {
        perror("near-shm-bench: segment");
        return 1;
    }
    char k[64];
    for (int i = 0; i < keys - 1; i++) {
        snprintf(k, sizeof(k), "bench:near:%d", i);
        ld_near_shm_put(seg, k, strlen(k), value, size,
                        mono_ns() + 3600ull * 1000000000u, 0);
    }
    ld_near_shm_put(seg, KEY, sizeof(KEY) - 1, value, size,
                    mono_ns() + 3600ull * 1000000000u, 0);
    int fd = ld_near_shm_ro_fd(seg);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror("near-shm-bench: descriptor");
        return 1;
    }
    map_len = (size_t)st.st_size;
    map = mmap(NULL, map_len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        perror("near-shm-bench: mmap");
        return 1;
    }
    pthread_t bt;
    ld_near_shm_beat(seg, mono_ns());
    pthread_create(&bt, NULL, beat, NULL);

    /* Warm-up of both paths. */
    double a, b;
    near_row(0.2, size, 1, &a, &b);
    get_row(rc, 0.2, size, &a, &b);

    double n_ops[100], n_p50[100], c_ops[100], c_p50[100], g_ops[100],
        g_p50[100];
    for (int i = 0; i < repeat; i++) {
        /* Alternate the order so drift of the machine's load hits both. */
        if (i % 2 == 0) {
            near_row(secs, size, 0, &n_ops[i], &n_p50[i]);
            near_row(secs, size, 1, &c_ops[i], &c_p50[i]);
            get_row(rc, secs, size, &g_ops[i], &g_p50[i]);
        } else {
            get_row(rc, secs, size, &g_ops[i], &g_p50[i]);
            near_row(secs, size, 1, &c_ops[i], &c_p50[i]);
            near_row(secs, size, 0, &n_ops[i], &n_p50[i]);
        }
        printf("mode=near_shm run=%d size=%zu lookup_ops_s=%.0f "
               "lookup_p50_ns=%.0f near_get_ops_s=%.0f near_get_p50_ns=%.0f "
               "redis_ops_s=%.0f redis_p50_ns=%.0f\n",
               i, size, n_ops[i], n_p50[i], c_ops[i], c_p50[i], g_ops[i],
               g_p50[i]);
        fflush(stdout);
    }
    double mn = median_dbl(n_ops, repeat), mnp = median_dbl(n_p50, repeat),
           mc = median_dbl(c_ops, repeat), mcp = median_dbl(c_p50, repeat),
           mg = median_dbl(g_ops, repeat), mgp = median_dbl(g_p50, repeat);
    printf(
        "mode=near_shm summary size=%zu repeat=%d lookup_ops_s=%.0f "
        "lookup_p50_ns=%.0f near_get_ops_s=%.0f near_get_p50_ns=%.0f "
        "redis_ops_s=%.0f redis_p50_ns=%.0f lookup_x=%.1f near_get_x=%.1f\n",
        size, repeat, mn, mnp, mc, mcp, mg, mgp, mn / mg, mc / mg);

    __atomic_store_n(&stop_beat, 1, __ATOMIC_RELAXED);
    pthread_join(bt, NULL);
    munmap((void *)map, map_len);
    ld_near_shm_destroy(seg);
    redisFree(rc);
    free(value);
    return 0;
}
