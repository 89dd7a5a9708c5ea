/* libleased with the shared near cache, against a real redis-server and a
 * real leased: leased_cache_get maps its session's segment on first use
 * (near.map, the descriptor collected by recvmsg) and answers hits from
 * it; what it answers there is what the socket answers; after a write the
 * daemon acknowledged the old value is never read; a stopped daemon's
 * segment is left within shared_stale_ms and the call goes to the socket;
 * the hits it served reach the daemon's metrics (near.hits). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"
#include "leased/client.h"
#include "near_util.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_MS 5000
#define STALE_MS 50
/* How far past shared_stale_ms the reader may notice a stopped daemon on
 * a loaded machine: its own scheduling, not the daemon's. */
#define STALE_MARGIN_MS 250

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "near_shm_c",
    .redis = {&R},
    .daemons = {&D},
};

#define SHM_YAML                                                              \
    "cache:\n  ttl_jitter: 0\n  double_delete_ms: 0\n"                        \
    "  near: { enabled: true, shared_bytes: 1048576, "                        \
    "shared_stale_ms: 50 }\n"

#define CK_OK(rc, err, what)                                                  \
    ck_assert_msg((rc) == LEASED_OK, "%s: %s: %s", (what),                    \
                  leased_strerror((err).code), (err).message)

static void
start_shm(void)
{
    if (R.pid == 0) {
        ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    }
    ck_assert_int_eq(h_daemon_start(&D, &R, SHM_YAML), 0);
    struct h_conn *c = h_connect_ok(&D);
    h_assert_stat(c, "near_tracking", 1, T_MS);
    h_close(c);
}

static struct leased_conn *
lconn(void)
{
    struct leased_options opt;
    struct leased_error err;
    leased_options_init(&opt);
    opt.hello = true;
    struct leased_conn *c = leased_connect(D.sock, &opt, &err);
    ck_assert_msg(c != NULL, "connect: %s", err.message);
    return c;
}

static uint64_t
seg_hits(struct leased_conn *lc)
{
    struct leased_near_info ni;
    leased_near_info(lc, &ni);
    return ni.hits;
}

static void
set(struct h_conn *c, const char *key, const char *value)
{
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", key, "value", value)));
}

/* leased_cache_get of KEY until it is served from the segment; its value
 * is then VALUE. */
static void
until_from_segment(struct leased_conn *lc, const char *key, const char *value)
{
    long long deadline = h_now_ms() + T_MS;
    for (;;) {
        uint64_t before = seg_hits(lc);
        struct leased_cache_result r;
        struct leased_error err;
        int rc = leased_cache_get(lc, key, 0, false, &r, &err);
        CK_OK(rc, err, "cache.get");
        ck_assert_msg(r.hit && r.value != NULL && strcmp(r.value, value) == 0,
                      "%s: want %s, got %s", key, value,
                      r.value ? r.value : "(none)");
        leased_cache_result_free(&r);
        if (seg_hits(lc) > before) {
            return;
        }
        ck_assert_msg(h_now_ms() < deadline,
                      "%s never served from the segment", key);
        usleep(2000);
    }
}

START_TEST(test_hit_equals_socket)
{
    start_shm();
    struct h_conn *c = h_connect_ok(&D);
    struct leased_conn *lc = lconn();
    const char *values[] = {"plain", "q\"b\\s\n\xc3\xa9", ""};
    const char *keys[] = {"a", "odd", "empty"};
    for (int i = 0; i < 3; i++) {
        set(c, keys[i], values[i]);
        until_from_segment(lc, keys[i], values[i]);
        /* The socket's own answer, and the segment's, byte for byte. */
        json_t *r = near_get(c, keys[i]);
        const char *sv = jstr(r, "value");
        struct leased_cache_result nr;
        ck_assert(leased_near_get(lc, keys[i], &nr));
        ck_assert(nr.hit && !nr.is_null);
        ck_assert_uint_eq(nr.value_len, strlen(sv));
        ck_assert(memcmp(nr.value, sv, nr.value_len) == 0);
        leased_cache_result_free(&nr);
        json_decref(r);
    }
    struct leased_near_info ni;
    leased_near_info(lc, &ni);
    ck_assert(ni.mapped);
    ck_assert_uint_eq(ni.bytes, 1048576);
    /* A key nobody cached: not in the segment, the socket answers. */
    struct leased_cache_result r;
    ck_assert(!leased_near_get(lc, "never", NULL));
    ck_assert_int_eq(leased_cache_get(lc, "never", 0, false, &r, NULL),
                     LEASED_OK);
    ck_assert(!r.hit);
    leased_cache_result_free(&r);
    leased_close(lc);
    h_close(c);
}
END_TEST

START_TEST(test_no_old_value_after_set)
{
    start_shm();
    struct h_conn *c = h_connect_ok(&D);
    struct leased_conn *lc = lconn();
    set(c, "k", "v0");
    until_from_segment(lc, "k", "v0");
    uint64_t from_seg = 0;
    for (int i = 1; i <= 200; i++) {
        char want[16];
        snprintf(want, sizeof want, "v%d", i);
        /* Acknowledged by the daemon: from here on only the new value. */
        set(c, "k", want);
        for (int j = 0; j < 5; j++) {
            uint64_t before = seg_hits(lc);
            struct leased_cache_result r;
            struct leased_error err;
            CK_OK(leased_cache_get(lc, "k", 0, false, &r, &err), err,
                  "cache.get");
            ck_assert_msg(r.hit && r.value && strcmp(r.value, want) == 0,
                          "after set %s read %s (%s)", want,
                          r.value ? r.value : "(none)",
                          seg_hits(lc) > before ? "segment" : "socket");
            from_seg += seg_hits(lc) > before;
            leased_cache_result_free(&r);
        }
    }
    fprintf(stderr,
            "no_old_value_after_set: %llu of 1000 reads from the "
            "segment\n",
            (unsigned long long)from_seg);
    /* The segment was in use, not only the socket. */
    ck_assert_uint_gt(from_seg, 0);
    leased_close(lc);
    h_close(c);
}
END_TEST

START_TEST(test_stopped_daemon_falls_back)
{
    start_shm();
    struct h_conn *c = h_connect_ok(&D);
    struct leased_conn *lc = lconn();
    set(c, "k", "v");
    until_from_segment(lc, "k", "v");
    for (int round = 0; round < 3; round++) {
        long long t0 = h_now_ms();
        h_daemon_signal(&D, SIGSTOP);
        while (leased_near_get(lc, "k", NULL)) {
            ck_assert_msg(h_now_ms() - t0 < T_MS,
                          "hits from a stopped daemon");
        }
        long long ms = h_now_ms() - t0;
        /* leased_cache_get now waits on the socket: a stopped daemon does
         * not answer, so it times out instead of a hit. */
        leased_set_timeout(lc, 200);
        struct leased_cache_result r;
        struct leased_error err;
        int rc = leased_cache_get(lc, "k", 0, false, &r, &err);
        h_daemon_signal(&D, SIGCONT);
        leased_set_timeout(lc, 0);
        fprintf(stderr,
                "stopped daemon: segment left after %lld ms "
                "(stale %d)\n",
                ms, STALE_MS);
        ck_assert_msg(ms <= STALE_MS + STALE_MARGIN_MS,
                      "hits for %lld ms after SIGSTOP", ms);
        ck_assert_msg(rc == LEASED_E_TIMEOUT, "cache.get while stopped: %s",
                      leased_strerror(rc));
        /* Back: hits from the segment again. */
        until_from_segment(lc, "k", "v");
    }
    leased_close(lc);
    h_close(c);
}
END_TEST

START_TEST(test_hits_reported)
{
    start_shm();
    struct h_conn *c = h_connect_ok(&D);
    struct leased_conn *lc = lconn();
    set(c, "k", "v");
    until_from_segment(lc, "k", "v");
    long long hits0 = h_stat(c, "near_shared_hits");
    long long fb0 = h_stat(c, "near_shared_fallbacks");
    for (int i = 0; i < 1000; i++) {
        ck_assert(leased_near_get(lc, "k", NULL));
    }
    ck_assert(!leased_near_get(lc, "absent", NULL));
    /* The report rides ahead of the next request. */
    ck_assert_int_eq(leased_ping(lc, NULL), LEASED_OK);
    ck_assert(h_wait_stat_min(c, "near_shared_hits", hits0 + 1000, T_MS));
    ck_assert(h_wait_stat_min(c, "near_shared_fallbacks", fb0 + 1, T_MS));
    /* And what is left, when the connection closes. */
    long long hits1 = h_stat(c, "near_shared_hits");
    ck_assert(leased_near_get(lc, "k", NULL));
    leased_close(lc);
    ck_assert(h_wait_stat_min(c, "near_shared_hits", hits1 + 1, T_MS));
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(hit_equals_socket, 60),
        H_CASE(no_old_value_after_set, 120),
        H_CASE(stopped_daemon_falls_back, 60),
        H_CASE(hits_reported, 60),
    };
    return H_MAIN(fx, cases);
}
