/* The shared near cache against a real redis-server and real leased
 * daemons, read the way a client reads it: near.map over the Unix socket
 * (recvmsg collects the descriptor), the segment mapped read-only, keys
 * looked up with libleased's reader. The segment holds what the near cache
 * holds and loses it before the write that changed it is answered; a whole
 * flush moves its epoch; a stopped daemon's segment goes stale within
 * cache.near.shared_stale_ms; a namespace's segment holds only its keys;
 * a reload that changes the segments closes the old ones. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"
#include "near_util.h"

#include "leased/near.h"

#include <check.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define T_MS 5000
#define PREFIX "leased:cache:"
#define SEG_BYTES 1048576
#define STALE_MS 50
/* How far past shared_stale_ms a reader may notice a stopped daemon on a
 * loaded machine: its own polling and scheduling, not the daemon's. */
#define STALE_MARGIN_MS 450

static struct h_redis R;
static struct h_daemon D;
static struct h_daemon D2;
static const struct h_fixture fx = {
    .suite = "shared_near",
    .redis = {&R},
    .daemons = {&D, &D2},
};

#define SHM_YAML                                                              \
    "cache:\n  ttl_jitter: 0\n  double_delete_ms: 0\n"                        \
    "  near: { enabled: true, shared_bytes: 1048576, "                        \
    "shared_stale_ms: 50 }\n"

/* --- a client of the segment ------------------------------------------ */

struct seg {
    int fd;     /* the Unix session that mapped it */
    void *map;  /* PROT_READ, MAP_SHARED */
    size_t len; /* "bytes" of the answer */
    long long stale_ms;
};

static int
unix_connect(const struct h_daemon *d)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    ck_assert(strlen(d->sock) < sizeof sa.sun_path);
    memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0,
                  "connect %s: %s", d->sock, strerror(errno));
    struct timeval tv = {T_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Send LINE (newline included) and read one reply line with recvmsg, as a
 * client must: *GOT_FD is the descriptor that came with it (-1: none).
 * *FD_AT is where the bytes that came with it start in the line (-1 if
 * before it, so it rode on an earlier reply). */
static json_t *
raw_call_at(int fd, const char *line, int *got_fd, long *fd_at)
{
    ck_assert_int_eq(send(fd, line, strlen(line), MSG_NOSIGNAL),
                     (ssize_t)strlen(line));
    char buf[65536];
    size_t have = 0;
    *got_fd = -1;
    if (fd_at != NULL) {
        *fd_at = -2;
    }
    while (memchr(buf, '\n', have) == NULL) {
        union {
            struct cmsghdr h;
            char room[CMSG_SPACE(4 * sizeof(int))];
        } ctl;
        /* One byte at a time: the reply is the only one owed, and the
         * descriptor's position is then exact. */
        struct iovec iov = {buf + have, 1};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = ctl.room,
                             .msg_controllen = sizeof ctl.room};
        ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        ck_assert_msg(n > 0, "recvmsg: %zd %s", n, strerror(errno));
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL;
             c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                ck_assert_msg(*got_fd < 0, "two descriptors for one reply");
                memcpy(got_fd, CMSG_DATA(c), sizeof(int));
                if (fd_at != NULL) {
                    *fd_at = (long)have;
                }
            }
        }
        have += (size_t)n;
        ck_assert_msg(have < sizeof buf, "reply too long");
    }
    json_error_t e;
    json_t *r = json_loadb(buf, have, 0, &e);
    ck_assert_msg(r != NULL, "bad reply %.*s", (int)have, buf);
    return r;
}

static json_t *
raw_call(int fd, const char *line, int *got_fd)
{
    return raw_call_at(fd, line, got_fd, NULL);
}

/* hello, then near.map: the raw reply, the descriptor in *MFD. */
static json_t *
map_raw(int fd, int *mfd)
{
    int none;
    json_t *r = raw_call(fd, "{\"op\":\"hello\"}\n", &none);
    ck_assert_msg(h_ok(r) && none < 0, "hello: %s", h_dump(r));
    json_decref(r);
    return raw_call(fd, "{\"op\":\"near.map\"}\n", mfd);
}

static void
seg_open(struct seg *g, const struct h_daemon *d)
{
    g->fd = unix_connect(d);
    int mfd;
    json_t *r = map_raw(g->fd, &mfd);
    ck_assert_msg(h_ok(r), "near.map: %s", h_dump(r));
    ck_assert_msg(mfd >= 0, "near.map answered without a descriptor");
    ck_assert_int_eq(jint(r, "layout"), LEASED_NEAR_LAYOUT);
    g->len = (size_t)jint(r, "bytes");
    g->stale_ms = jint(r, "stale_ms");
    json_decref(r);
    g->map = mmap(NULL, g->len, PROT_READ, MAP_SHARED, mfd, 0);
    ck_assert_msg(g->map != MAP_FAILED, "mmap: %s", strerror(errno));
    close(mfd);
}

static void
seg_close(struct seg *g)
{
    munmap(g->map, g->len);
    close(g->fd);
}

static uint64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* A lookup of KEY; its value (NUL-terminated) in BUF on a hit. */
static enum leased_near_result
seg_get(const struct seg *g, const char *key, char *buf, size_t cap)
{
    struct leased_near_value v;
    enum leased_near_result res = leased_near_lookup(g->map, g->len, key,
                                                     strlen(key), mono_ns(),
                                                     buf, cap - 1, &v);
    if (res == LEASED_NEAR_HIT) {
        buf[v.vlen] = '\0';
    }
    return res;
}

static bool
seg_has(const struct seg *g, const char *key, const char *value)
{
    char buf[4096];
    return seg_get(g, key, buf, sizeof buf) == LEASED_NEAR_HIT &&
           strcmp(buf, value) == 0;
}

static uint64_t
seg_epoch(const struct seg *g)
{
    const struct leased_near_hdr *h = g->map;
    return __atomic_load_n(&h->epoch, __ATOMIC_ACQUIRE);
}

static uint32_t
seg_state(const struct seg *g)
{
    const struct leased_near_hdr *h = g->map;
    return __atomic_load_n(&h->state, __ATOMIC_ACQUIRE);
}

struct seg_want {
    const struct seg *g;
    const char *key;
    const char *value; /* NULL: not a hit */
};

static bool
seg_shows(void *arg)
{
    const struct seg_want *w = arg;
    char buf[4096];
    enum leased_near_result res = seg_get(w->g, w->key, buf, sizeof buf);
    if (w->value == NULL) {
        return res != LEASED_NEAR_HIT;
    }
    return res == LEASED_NEAR_HIT && strcmp(buf, w->value) == 0;
}

/* Read KEY through the daemon until the segment has VALUE. */
static void
warm(struct h_conn *c, const struct seg *g, const char *key, const char *value)
{
    near_get_until_near(c, key, value);
    struct seg_want w = {g, key, value};
    ck_assert_msg(h_wait_until(seg_shows, &w, T_MS),
                  "%s=%s never showed in the segment", key, value);
}

static void
start_shm(struct h_daemon *d, const char *yaml)
{
    if (R.pid == 0) {
        ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    }
    ck_assert_int_eq(h_daemon_start(d, &R, yaml), 0);
    struct h_conn *c = h_connect_ok(d);
    h_assert_stat(c, "near_tracking", 1, T_MS);
    h_close(c);
}

static void
set(struct h_conn *c, const char *key, const char *value)
{
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", key, "value", value)));
}

static bool
has_feature(struct h_conn *c, const char *name)
{
    json_t *hello = h_must(h_callf(c, T_MS, "{s:s}", "op", "hello"));
    json_t *f = json_object_get(hello, "features");
    bool found = false;
    for (size_t i = 0; i < json_array_size(f); i++) {
        found = found ||
                strcmp(json_string_value(json_array_get(f, i)), name) == 0;
    }
    json_decref(hello);
    return found;
}

/* --- cases -------------------------------------------------------------- */

START_TEST(test_map_answer_and_fd)
{
    start_shm(&D, SHM_YAML);
    struct h_conn *c = h_connect_ok(&D);
    ck_assert_msg(has_feature(c, "shared_near"), "no shared_near in hello");
    h_close(c);

    int fd = unix_connect(&D);
    int mfd;
    json_t *r = map_raw(fd, &mfd);
    ck_assert_msg(h_ok(r), "near.map: %s", h_dump(r));
    ck_assert_int_eq(jint(r, "bytes"), SEG_BYTES);
    ck_assert_int_eq(jint(r, "layout"), 1);
    ck_assert_int_eq(jint(r, "stale_ms"), STALE_MS);
    json_decref(r);
    ck_assert_msg(mfd >= 0, "no descriptor came with the reply");

    /* Read-only: neither a writable mapping nor a write. */
    void *w = mmap(NULL, SEG_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, mfd,
                   0);
    ck_assert_msg(w == MAP_FAILED, "a writable mapping of the segment");
    ck_assert_int_lt(write(mfd, "x", 1), 0);
    ck_assert_int_lt(pwrite(mfd, "x", 1, 0), 0);
    struct stat st;
    ck_assert_int_eq(fstat(mfd, &st), 0);
    ck_assert_int_eq(st.st_size, SEG_BYTES);
    const struct leased_near_hdr *h = mmap(NULL, SEG_BYTES, PROT_READ,
                                           MAP_SHARED, mfd, 0);
    ck_assert(h != MAP_FAILED);
    ck_assert(memcmp(h->magic, LEASED_NEAR_MAGIC, 8) == 0);
    ck_assert_int_eq(h->layout, LEASED_NEAR_LAYOUT);
    ck_assert_int_eq(h->state, LEASED_NEAR_LIVE);
    ck_assert_int_eq(h->stale_ns, (uint64_t)STALE_MS * 1000000u);
    /* The heartbeat moves. */
    uint64_t b0 = __atomic_load_n(&h->heartbeat_ns, __ATOMIC_ACQUIRE);
    ck_assert(b0 > 0);
    long long t0 = h_now_ms();
    while (__atomic_load_n(&h->heartbeat_ns, __ATOMIC_ACQUIRE) == b0) {
        ck_assert_msg(h_now_ms() - t0 < T_MS, "the heartbeat never moved");
        usleep(1000);
    }
    munmap((void *)h, SEG_BYTES);
    close(mfd);

    /* In order with the replies before and after it, the descriptor
     * on the first byte of its own line. */
    char line[] =
        "{\"id\":1,\"op\":\"ping\"}\n{\"id\":2,\"op\":\"near.map\"}\n"
        "{\"id\":3,\"op\":\"ping\"}\n";
    ck_assert_int_eq(send(fd, line, strlen(line), MSG_NOSIGNAL),
                     (ssize_t)strlen(line));
    char buf[4096];
    size_t have = 0;
    long fd_at = -1;
    int got = -1;
    int lines = 0;
    while (lines < 3) {
        union {
            struct cmsghdr h;
            char room[CMSG_SPACE(sizeof(int))];
        } ctl;
        struct iovec iov = {buf + have, 1};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = ctl.room,
                             .msg_controllen = sizeof ctl.room};
        ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        ck_assert_int_eq(n, 1);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        if (cm != NULL && cm->cmsg_type == SCM_RIGHTS) {
            memcpy(&got, CMSG_DATA(cm), sizeof(int));
            fd_at = (long)have;
        }
        lines += buf[have] == '\n';
        have++;
    }
    buf[have] = '\0';
    const char *second = strchr(buf, '\n') + 1;
    ck_assert_msg(strncmp(buf, "{\"id\":1,", 8) == 0 &&
                      strncmp(second, "{\"id\":2,", 8) == 0,
                  "replies out of order: %s", buf);
    ck_assert_msg(got >= 0 && fd_at == second - buf,
                  "descriptor at byte %ld, the reply at %ld: %s", fd_at,
                  (long)(second - buf), buf);
    close(got);
    close(fd);
}
END_TEST

START_TEST(test_values_in_segment)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);

    set(c, "plain", "value-1");
    warm(c, &g, "plain", "value-1");
    /* With the version a hit carries (versioned writes). */
    json_t *hit = near_get(c, "plain");
    char vb[64];
    struct leased_near_value val;
    ck_assert_int_eq(leased_near_lookup(g.map, g.len, "plain", 5, mono_ns(),
                                        vb, sizeof vb, &val),
                     LEASED_NEAR_HIT);
    ck_assert_msg(json_integer_value(json_object_get(hit, "version")) ==
                      (json_int_t)val.version,
                  "segment version %llu, hit %s",
                  (unsigned long long)val.version, h_dump(hit));
    ck_assert_msg(val.version > 0, "no version: %s", h_dump(hit));
    json_decref(hit);
    /* Decoded, as cache.get's "value": no quotes, no escapes. */
    const char *odd = "q\"b\\s\n\xc3\xa9";
    set(c, "odd", odd);
    warm(c, &g, "odd", odd);
    set(c, "empty", "");
    warm(c, &g, "empty", "");
    /* The usage figures count what is there. */
    ck_assert_int_ge(h_stat(c, "near_shared_entries"), 3);
    ck_assert_int_eq(h_stat(c, "near_shared_bytes"), SEG_BYTES);
    ck_assert_int_gt(h_stat(c, "near_shared_used_bytes"), 0);
    ck_assert_int_ge(h_stat(c, "near_shared_maps"), 1);

    /* A key the near cache never read is a miss, not a fallback. */
    char buf[64];
    ck_assert_int_eq(seg_get(&g, "never", buf, sizeof buf), LEASED_NEAR_MISS);
    /* Foreign data of the wrong type is never in it. */
    h_r_do(&R, "SET " PREFIX "{wt} x");
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        "wt", "lease", 0);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    ck_assert_int_eq(seg_get(&g, "wt", buf, sizeof buf), LEASED_NEAR_MISS);

    /* A TTL: gone from the segment by its deadline, as from Redis. */
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "cache.set", "key",
                       "ttl", "value", "short", "ttl_ms", 300)));
    warm(c, &g, "ttl", "short");
    struct seg_want w = {&g, "ttl", NULL};
    ck_assert(h_wait_until(seg_shows, &w, T_MS));
    h_close(c);
    seg_close(&g);
}
END_TEST

/* Under cache.layout 2 the entry's string carries a header before the
 * value: the segment holds the value alone, with the hit's version. */
START_TEST(test_values_in_segment_layout2)
{
    start_shm(&D, SHM_YAML "  layout: 2\n");
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "plain", "value-1");
    h_assert_type(&R, PREFIX "{plain}", "string");
    warm(c, &g, "plain", "value-1");
    json_t *hit = near_get(c, "plain");
    char vb[64];
    struct leased_near_value val;
    ck_assert_int_eq(leased_near_lookup(g.map, g.len, "plain", 5, mono_ns(),
                                        vb, sizeof vb, &val),
                     LEASED_NEAR_HIT);
    ck_assert_msg(json_integer_value(json_object_get(hit, "version")) ==
                      (json_int_t)val.version,
                  "segment version %llu, hit %s",
                  (unsigned long long)val.version, h_dump(hit));
    json_decref(hit);
    const char *odd = "q\"b\\s\n\xc3\xa9";
    set(c, "odd", odd);
    warm(c, &g, "odd", odd);
    set(c, "empty", "");
    warm(c, &g, "empty", "");
    h_close(c);
    seg_close(&g);
}
END_TEST

/* A value over a quarter of the segment stays near, never shared. */
START_TEST(test_large_value_not_shared)
{
    start_shm(&D, "cache:\n  ttl_jitter: 0\n  double_delete_ms: 0\n"
                  "  near: { enabled: true, shared_bytes: 1048576, "
                  "max_value_bytes: 1048576 }\n");
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    size_t n = SEG_BYTES / 3;
    char *big = malloc(n + 1);
    memset(big, 'b', n);
    big[n] = '\0';
    set(c, "big", big);
    near_get_until_near(c, "big", big);
    set(c, "small", "s");
    warm(c, &g, "small", "s");
    char buf[64];
    ck_assert_int_ne(seg_get(&g, "big", buf, sizeof buf), LEASED_NEAR_HIT);
    free(big);
    h_close(c);
    seg_close(&g);
}
END_TEST

/* Once this daemon answers a write or an invalidation, the segment no
 * longer has the old value. */
START_TEST(test_own_writes_before_answer)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);

    for (int i = 0; i < 20; i++) {
        char v[32];
        snprintf(v, sizeof v, "v%d", i);
        set(c, "k", v);
        warm(c, &g, "k", v);
        char v2[32];
        snprintf(v2, sizeof v2, "w%d", i);
        set(c, "k", v2);
        ck_assert_msg(!seg_has(&g, "k", v), "%s after cache.set answered", v);
        warm(c, &g, "k", v2);
        json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s}", "op",
                                   "cache.invalidate", "key", "k")));
        char buf[64];
        ck_assert_msg(seg_get(&g, "k", buf, sizeof buf) != LEASED_NEAR_HIT,
                      "a hit after cache.invalidate answered: %s", buf);
    }
    /* cache.mset too. */
    set(c, "m", "old");
    warm(c, &g, "m", "old");
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:[{s:s,s:s}]}", "op", "cache.mset",
                       "entries", "key", "m", "value", "new")));
    ck_assert(!seg_has(&g, "m", "old"));
    h_close(c);
    seg_close(&g);
}
END_TEST

/* A write in Redis or through another daemon: gone once tracking tells. */
START_TEST(test_outside_writes_drop)
{
    start_shm(&D, SHM_YAML);
    start_shm(&D2, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    struct h_conn *c2 = h_connect_ok(&D2);

    set(c, "x", "one");
    warm(c, &g, "x", "one");
    h_r_do(&R, "HSET " PREFIX "{x} v two");
    struct seg_want w = {&g, "x", NULL};
    long long t0 = h_now_ms();
    ck_assert(h_wait_until(seg_shows, &w, T_MS));
    long long ms = h_now_ms() - t0;
    ck_assert_msg(ms < 1000, "the write in Redis took %lld ms", ms);
    warm(c, &g, "x", "two");

    set(c2, "x", "three");
    ck_assert(h_wait_until(seg_shows, &w, T_MS));
    warm(c, &g, "x", "three");

    /* FLUSHALL: everything, and the epoch moves. */
    uint64_t e0 = seg_epoch(&g);
    h_r_do(&R, "FLUSHALL");
    ck_assert(h_wait_until(seg_shows, &w, T_MS));
    ck_assert_msg(seg_epoch(&g) != e0, "FLUSHALL left the epoch");
    h_close(c);
    h_close(c2);
    seg_close(&g);
}
END_TEST

/* check_near's rule, read through the segment: after a write is
 * answered, no read sees the value it replaced, however the reads and
 * writes interleave. */
START_TEST(test_no_read_older_than_answer)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    long long hits = 0, stale = 0;
    for (int i = 0; i < 300; i++) {
        char v[32];
        snprintf(v, sizeof v, "%d", i);
        set(c, "race", v);
        /* Bring it near on some rounds, not on others. */
        if (i % 3 != 0) {
            json_decref(near_get(c, "race"));
            json_decref(near_get(c, "race"));
        }
        for (int k = 0; k < 5; k++) {
            char buf[64];
            if (seg_get(&g, "race", buf, sizeof buf) == LEASED_NEAR_HIT) {
                hits++;
                stale += atoi(buf) != i;
            }
        }
    }
    ck_assert_msg(stale == 0, "%lld reads older than an answered write",
                  stale);
    ck_assert_msg(hits > 0, "the segment never had the key");
    h_close(c);
    seg_close(&g);
}
END_TEST

START_TEST(test_tracking_killed_flushes)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "v");
    warm(c, &g, "k", "v");
    uint64_t e0 = seg_epoch(&g);
    long long flushes = h_stat(c, "near_flushes");

    long long id = near_client_id(&R, "track");
    ck_assert_msg(id > 0, "no tracking connection in CLIENT LIST");
    long long t0 = h_now_ms();
    h_r_do(&R, "CLIENT KILL ID %lld", id);
    while (seg_epoch(&g) == e0) {
        ck_assert_msg(h_now_ms() - t0 < T_MS, "the epoch never moved");
        usleep(500);
    }
    long long ms = h_now_ms() - t0;
    /* Not after the near cache's own flush: with it. */
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    ck_assert(!seg_has(&g, "k", "v"));
    ck_assert_msg(ms < 1000, "the segment was flushed after %lld ms", ms);
    fprintf(stderr, "tracking killed: epoch moved after %lld ms\n", ms);

    /* A write made while nobody listens is never served from it. */
    h_r_do(&R, "HSET " PREFIX "{k} v w");
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until(c, "k", "w");
    warm(c, &g, "k", "w");
    h_close(c);
    seg_close(&g);
}
END_TEST

START_TEST(test_stopped_daemon_goes_stale)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "v");
    warm(c, &g, "k", "v");

    for (int round = 0; round < 3; round++) {
        char buf[64];
        long long t0 = h_now_ms();
        h_daemon_signal(&D, SIGSTOP);
        enum leased_near_result res;
        while ((res = seg_get(&g, "k", buf, sizeof buf)) == LEASED_NEAR_HIT) {
            ck_assert_msg(h_now_ms() - t0 < T_MS,
                          "hits from a stopped daemon");
        }
        long long ms = h_now_ms() - t0;
        h_daemon_signal(&D, SIGCONT);
        ck_assert_int_eq(res, LEASED_NEAR_FALLBACK);
        fprintf(stderr, "stopped daemon: fallback after %lld ms (stale %d)\n",
                ms, STALE_MS);
        ck_assert_msg(ms <= STALE_MS + STALE_MARGIN_MS,
                      "hits for %lld ms after SIGSTOP", ms);
        /* Back: hits again. */
        struct seg_want w = {&g, "k", "v"};
        ck_assert(h_wait_until(seg_shows, &w, T_MS));
    }
    h_close(c);
    seg_close(&g);
}
END_TEST

/* near.map behind replies the client has not read: each waits for the
 * bytes before it, at most MAP_PENDING_MAX (4) of them, and every reply
 * keeps its place, the descriptors on the first bytes of their lines. */
START_TEST(test_pending_maps_bounded)
{
    start_shm(&D, SHM_YAML);
    struct h_conn *c = h_connect_ok(&D);
    size_t vn = 512 * 1024;
    char *big = malloc(vn + 1);
    memset(big, 'v', vn);
    big[vn] = '\0';
    set(c, "big", big);
    h_close(c);

    int fd = unix_connect(&D);
    int none;
    json_t *r = raw_call(fd, "{\"op\":\"hello\"}\n", &none);
    json_decref(r);
    /* 8 MB of replies the client does not read yet, then six near.map. */
    enum { GETS = 16, MAPS = 6 };
    char req[128];
    for (int i = 0; i < GETS; i++) {
        snprintf(req, sizeof req,
                 "{\"id\":%d,\"op\":\"cache.get\",\"key\":\"big\","
                 "\"lease\":false}\n",
                 i);
        ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL),
                         (ssize_t)strlen(req));
    }
    /* The gets answered into the daemon's output, which the socket
     * cannot take. */
    struct h_conn *st = h_connect_ok(&D);
    long long t0 = h_now_ms();
    while (h_stat(st, "session_buffer_bytes") < (long long)(4 * vn)) {
        ck_assert_msg(h_now_ms() - t0 < T_MS, "the replies never queued");
        usleep(5000);
    }
    h_close(st);
    for (int i = 0; i < MAPS; i++) {
        snprintf(req, sizeof req, "{\"id\":%d,\"op\":\"near.map\"}\n",
                 100 + i);
        ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL),
                         (ssize_t)strlen(req));
    }
    size_t cap = (size_t)(GETS + 2) * (vn + 256);
    char *buf = malloc(cap);
    size_t have = 0, line_start = 0;
    int lines = 0, oks = 0, busy = 0, fds = 0, gets = 0;
    int last_id = -1;
    while (lines < GETS + MAPS) {
        union {
            struct cmsghdr h;
            char room[CMSG_SPACE(4 * sizeof(int))];
        } ctl;
        struct iovec iov = {buf + have, cap - have};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = ctl.room,
                             .msg_controllen = sizeof ctl.room};
        ssize_t n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        ck_assert_msg(n > 0, "recvmsg: %s", strerror(errno));
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL;
             cm = CMSG_NXTHDR(&msg, cm)) {
            if (cm->cmsg_type == SCM_RIGHTS) {
                int got;
                memcpy(&got, CMSG_DATA(cm), sizeof(int));
                close(got);
                fds++;
                /* The descriptor's bytes are the whole near.map line,
                 * which ends the read (the kernel glues earlier bytes
                 * in front of it, never later ones behind). */
                size_t end = have + (size_t)n;
                ck_assert_msg(buf[end - 1] == '\n', "a descriptor with a "
                                                    "partial line");
                size_t ls = end - 1;
                while (ls > 0 && buf[ls - 1] != '\n') {
                    ls--;
                }
                ck_assert_msg(strncmp(buf + ls, "{\"id\":10", 8) == 0,
                              "a descriptor with %.30s", buf + ls);
            }
        }
        have += (size_t)n;
        char *nl;
        while ((nl = memchr(buf + line_start, '\n', have - line_start)) !=
               NULL) {
            json_error_t e;
            json_t *j = json_loadb(buf + line_start,
                                   (size_t)(nl - buf) - line_start, 0, &e);
            ck_assert(j != NULL);
            int id = (int)jint(j, "id");
            if (id < 100) {
                gets++;
                ck_assert_msg(near_hit_of(j, big) || !h_ok(j), "get %d", id);
            } else if (h_ok(j)) {
                oks++;
            } else {
                ck_assert_str_eq(h_errcode(j), "busy");
                busy++;
            }
            ck_assert_msg(id > last_id || id < 100 || last_id < 100,
                          "near.map %d after %d", id, last_id);
            if (id >= 100) {
                last_id = id;
            }
            json_decref(j);
            lines++;
            line_start = (size_t)(nl - buf) + 1;
        }
    }
    ck_assert_int_eq(gets, GETS);
    ck_assert_int_eq(oks, fds);
    ck_assert_msg(oks == 4 && busy == MAPS - 4, "%d ok, %d busy", oks, busy);
    fprintf(stderr, "pending maps: %d ok with a descriptor, %d busy\n", oks,
            busy);
    free(buf);
    free(big);
    close(fd);
}
END_TEST

/* Redis gone: the segment is flushed with the near cache (nothing read
 * while nobody listens is trusted), and near.map, which needs no Redis,
 * still answers. */
START_TEST(test_redis_down)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "before");
    warm(c, &g, "k", "before");
    uint64_t e0 = seg_epoch(&g);

    h_redis_kill(&R);
    struct seg_want w = {&g, "k", NULL};
    ck_assert(h_wait_until(seg_shows, &w, T_MS));
    ck_assert_msg(seg_epoch(&g) != e0, "the epoch stayed with Redis gone");
    struct seg g2;
    seg_open(&g2, &D);
    char buf[64];
    ck_assert_int_ne(seg_get(&g2, "k", buf, sizeof buf), LEASED_NEAR_HIT);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        "k", "lease", 0);
    h_expect_code(r, "redis_unavailable", "cache.get with Redis down");

    /* Back, without its data (no save): a miss, never the old value. */
    ck_assert_int_eq(h_redis_restart(&R), 0);
    h_assert_stat(c, "near_tracking", 1, T_MS);
    long long t0 = h_now_ms();
    for (;;) {
        r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key", "k",
                    "lease", 0);
        bool miss = h_ok(r) && !jtrue(r, "hit");
        ck_assert_msg(h_ok(r) ||
                          strcmp(h_errcode(r), "redis_unavailable") == 0,
                      "cache.get after the restart: %s", h_dump(r));
        json_decref(r);
        if (miss) {
            break;
        }
        ck_assert_msg(h_now_ms() - t0 < T_MS, "no miss after the restart");
        usleep(2000);
    }
    ck_assert(!seg_has(&g, "k", "before"));
    set(c, "k", "after");
    warm(c, &g, "k", "after");
    h_close(c);
    seg_close(&g);
    seg_close(&g2);
}
END_TEST

START_TEST(test_tcp_refused)
{
    start_shm(&D, SHM_YAML);
    struct h_conn *t = h_connect_tcp(&D);
    ck_assert(t != NULL);
    json_decref(h_must(h_callf(t, T_MS, "{s:s}", "op", "hello")));
    json_t *r = h_callf(t, T_MS, "{s:s}", "op", "near.map");
    h_expect_code(r, "bad_request", "near.map over TCP");
    h_close(t);
}
END_TEST

START_TEST(test_disabled)
{
    /* shared_bytes 0 */
    start_shm(&D, "cache:\n  near: { enabled: true, shared_bytes: 0 }\n");
    struct h_conn *c = h_connect_ok(&D);
    ck_assert(!has_feature(c, "shared_near"));
    ck_assert(has_feature(c, "near"));
    h_close(c);
    int fd = unix_connect(&D);
    int mfd;
    json_t *r = map_raw(fd, &mfd);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    ck_assert_msg(strstr(jmsg(r), "not enabled") != NULL, "%s", h_dump(r));
    ck_assert_int_lt(mfd, 0);
    json_decref(r);
    close(fd);
    ck_assert_int_eq(h_daemon_stop(&D), 0);

    /* the near cache off */
    ck_assert_int_eq(h_daemon_start(&D, &R,
                                    "cache:\n  near: { enabled: "
                                    "false }\n"),
                     0);
    c = h_connect_ok(&D);
    ck_assert(!has_feature(c, "shared_near"));
    h_close(c);
    fd = unix_connect(&D);
    r = map_raw(fd, &mfd);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    ck_assert_int_lt(mfd, 0);
    json_decref(r);
    close(fd);
}
END_TEST

START_TEST(test_hits_reported)
{
    start_shm(&D, SHM_YAML);
    struct h_conn *c = h_connect_ok(&D);
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:i,s:i}", "op", "near.hits",
                               "hits", 1000, "fallbacks", 7)));
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:i}", "op", "near.hits", "hits", 5)));
    ck_assert_int_eq(h_stat(c, "near_shared_hits"), 1005);
    ck_assert_int_eq(h_stat(c, "near_shared_fallbacks"), 7);
    json_t *r = h_callf(c, T_MS, "{s:s,s:i}", "op", "near.hits", "hits", -1);
    h_expect_code(r, "bad_request", "negative hits");
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "near.hits", "fallbacks", "x");
    h_expect_code(r, "bad_request", "fallbacks not a number");
    ck_assert_int_eq(h_stat(c, "near_shared_hits"), 1005);
    h_close(c);
}
END_TEST

/* Rewrite the daemon's configuration, FROM replaced by TO, and reload. */
static void
reload_with(struct h_daemon *d, const char *from, const char *to)
{
    FILE *f = fopen(d->conf, "r");
    ck_assert(f != NULL);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, from);
    ck_assert_msg(at != NULL, "%s not in the configuration", from);
    f = fopen(d->conf, "w");
    ck_assert(f != NULL);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    fclose(f);
    h_daemon_signal(d, SIGHUP);
}

static bool
seg_closed(void *arg)
{
    return seg_state(arg) == LEASED_NEAR_CLOSED;
}

START_TEST(test_reload_replaces)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "v");
    warm(c, &g, "k", "v");

    reload_with(&D, "shared_bytes: 1048576", "shared_bytes: 2097152");
    ck_assert(h_wait_until(seg_closed, &g, T_MS));
    char buf[64];
    ck_assert_int_eq(seg_get(&g, "k", buf, sizeof buf),
                     LEASED_NEAR_CLOSED_SEG);
    struct seg g2;
    seg_open(&g2, &D);
    ck_assert_int_eq(g2.len, 2 * SEG_BYTES);
    warm(c, &g2, "k", "v");
    ck_assert_int_eq(seg_state(&g), LEASED_NEAR_CLOSED);

    /* A reload that changes nothing of it keeps it. */
    reload_with(&D, "shared_stale_ms: 50", "shared_stale_ms: 50 ");
    ck_assert(h_wait_log(&D, "configuration reloaded", T_MS));
    struct h_conn *c2 = h_connect_ok(&D);
    h_assert_ping(c2);
    h_close(c2);
    ck_assert_int_eq(seg_state(&g2), LEASED_NEAR_LIVE);
    ck_assert(seg_has(&g2, "k", "v"));

    /* Off by reload: closed, and near.map says so. */
    reload_with(&D, "shared_bytes: 2097152", "shared_bytes: 0");
    ck_assert(h_wait_until(seg_closed, &g2, T_MS));
    int fd = unix_connect(&D);
    int mfd;
    json_t *r = map_raw(fd, &mfd);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    json_decref(r);
    close(fd);
    ck_assert(!has_feature(c, "shared_near"));
    h_close(c);
    seg_close(&g);
    seg_close(&g2);
}
END_TEST

/* A daemon that stops closes its segments: a reader that kept the
 * mapping sees it closed, not merely stale. */
START_TEST(test_exit_closes)
{
    start_shm(&D, SHM_YAML);
    struct seg g;
    seg_open(&g, &D);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "v");
    warm(c, &g, "k", "v");
    h_close(c);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
    ck_assert_int_eq(seg_state(&g), LEASED_NEAR_CLOSED);
    char buf[64];
    ck_assert_int_eq(seg_get(&g, "k", buf, sizeof buf),
                     LEASED_NEAR_CLOSED_SEG);
    seg_close(&g);
}
END_TEST

/* --- namespaces: a child of another uid maps its own segment ----------- */

#define NS_UID 23461
#define NS_GID 23462

static int
as_ns_user(void)
{
    struct seg g;
    int fd = unix_connect(&D);
    int mfd;
    json_t *r = map_raw(fd, &mfd);
    if (!h_ok(r) || mfd < 0) {
        fprintf(stderr, "as uid %d: near.map %s\n", (int)getuid(), h_dump(r));
        return 1;
    }
    g.fd = fd;
    g.len = (size_t)jint(r, "bytes");
    json_decref(r);
    g.map = mmap(NULL, g.len, PROT_READ, MAP_SHARED, mfd, 0);
    if (g.map == MAP_FAILED) {
        return 2;
    }
    /* Its own key, read by root into the near cache, is there; the
     * other namespace's never is. */
    long long t0 = h_now_ms();
    while (!seg_has(&g, "a:1", "va")) {
        if (h_now_ms() - t0 > T_MS) {
            fprintf(stderr, "a:1 never in namespace a's segment\n");
            return 3;
        }
        usleep(2000);
    }
    char buf[64];
    if (seg_get(&g, "b:1", buf, sizeof buf) == LEASED_NEAR_HIT ||
        seg_get(&g, "free", buf, sizeof buf) == LEASED_NEAR_HIT) {
        fprintf(stderr, "a key outside namespace a in its segment\n");
        return 4;
    }
    return 0;
}

static int
as_stray_user(void)
{
    int fd = unix_connect(&D);
    int mfd;
    json_t *r = map_raw(fd, &mfd);
    const char *code = h_errcode(r);
    int bad = code == NULL || strcmp(code, "unauthorized") != 0 || mfd >= 0;
    if (bad) {
        fprintf(stderr, "stray: near.map %s\n", h_dump(r));
    }
    return bad;
}

static int
run_as(uid_t uid, gid_t gid, int (*fn)(void))
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
            _exit(9);
        }
        _exit(fn());
    }
    h_track_pid(pid);
    int st = 0;
    long long end = h_now_ms() + 30000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (h_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(5000);
    }
    h_untrack_pid(pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void
open_up(const char *dir)
{
    char p[300];
    struct stat st;
    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        if (stat(p, &st) == 0) {
            chmod(p, (st.st_mode & 07777) | 0011);
        }
        char *slash = strrchr(p, '/');
        if (slash == NULL || slash == p) {
            break;
        }
        *slash = '\0';
    }
}

START_TEST(test_namespaces)
{
    if (getuid() != 0) {
        fprintf(stderr, "namespaces: skipped, needs root (setuid)\n");
        return;
    }
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "listen:\n  unix: @DIR@/leased.sock\n  unix_mode: \"0666\"\n"
             "  namespaces:\n"
             "    - {uid: %d, prefixes: [\"a:\"]}\n"
             "    - {uid: %d, prefixes: [\"b:\"]}\n"
             "    - {token: \"t-secret-0123456789\", prefixes: [\"c:\"]}\n"
             "%s",
             NS_UID, NS_UID + 1, SHM_YAML);
    start_shm(&D, yaml);
    open_up(D.dir);
    struct h_conn *c = h_connect_ok(&D);
    struct seg all;
    seg_open(&all, &D); /* root: the segment of every key */
    set(c, "a:1", "va");
    set(c, "b:1", "vb");
    set(c, "free", "vf");
    warm(c, &all, "a:1", "va");
    warm(c, &all, "b:1", "vb");
    warm(c, &all, "free", "vf");
    ck_assert_int_eq(run_as(NS_UID, NS_GID, as_ns_user), 0);
    ck_assert_int_eq(run_as(NS_UID + 5, NS_GID + 5, as_stray_user), 0);
    h_close(c);
    seg_close(&all);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(map_answer_and_fd, 60),
        H_CASE(values_in_segment, 60),
        H_CASE(values_in_segment_layout2, 60),
        H_CASE(large_value_not_shared, 60),
        H_CASE(own_writes_before_answer, 90),
        H_CASE(outside_writes_drop, 60),
        H_CASE(no_read_older_than_answer, 90),
        H_CASE(tracking_killed_flushes, 60),
        H_CASE(stopped_daemon_goes_stale, 60),
        H_CASE(pending_maps_bounded, 60),
        H_CASE(redis_down, 60),
        H_CASE(tcp_refused, 60),
        H_CASE(disabled, 60),
        H_CASE(hits_reported, 60),
        H_CASE(reload_replaces, 60),
        H_CASE(exit_closes, 60),
        H_CASE(namespaces, 60),
    };
    return H_MAIN(fx, cases);
}
