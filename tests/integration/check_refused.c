/* A Redis that is up but refuses writes: min-replicas-to-write without a
 * replica (NOREPLICAS, as a master under Sentinel answers while its
 * replica resyncs), a full maxmemory with noeviction (OOM). Every op that writes must answer redis_unavailable, as the
 * contract says for a backend that cannot serve: never wrong_type (the
 * key holds nothing), never "not acquired" (nothing holds it), never
 * internal. The daemon itself keeps serving (ping). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static struct h_redis R;
static struct h_daemon D;

static const struct h_fixture fx = {
    .suite = "refused",
    .redis = {&R},
    .daemons = {&D},
};

#define T_MS 5000

static void
start(const char *redis_args)
{
    ck_assert_int_eq(h_redis_start(&R, redis_args), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NULL), 0);
}

static void
expect_unavailable(struct h_conn *c, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_error_t err;
    json_t *req = json_vpack_ex(&err, 0, fmt, ap);
    va_end(ap);
    ck_assert_msg(req != NULL, "%s: bad request: %s", what, err.text);
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "%s: no answer", what);
    char *s = json_dumps(r, JSON_COMPACT);
    ck_assert_msg(!h_ok(r) && h_errcode(r) != NULL &&
                      strcmp(h_errcode(r), "redis_unavailable") == 0,
                  "%s: %s, not redis_unavailable", what, s);
    free(s);
    json_decref(r);
}

/* Every writing op of the protocol against a Redis that refuses writes;
 * nothing may have been written. */
static void
every_write_refused(const char *why, bool cache_refused)
{
    struct h_conn *c = h_connect_ok(&D);
    char what[128];

#define EXPECT(op, ...)                                                       \
    do {                                                                      \
        snprintf(what, sizeof what, "%s, %s", why, op);                       \
        expect_unavailable(c, what, __VA_ARGS__);                             \
    } while (0)

    EXPECT("lock, fixed lease", "{s:s,s:s,s:i}", "op", "lock", "key", "a",
           "ttl_ms", 5000);
    EXPECT("lock, watchdog", "{s:s,s:s}", "op", "lock", "key", "b");
    EXPECT("lock, waiting", "{s:s,s:s,s:i}", "op", "lock", "key", "b2",
           "wait_ms", 300);
    EXPECT("write lock", "{s:s,s:s,s:s}", "op", "lock", "key", "c", "mode",
           "write");
    EXPECT("read lock", "{s:s,s:s,s:s}", "op", "lock", "key", "d", "mode",
           "read");
    EXPECT("multi-key lock", "{s:s,s:[s,s]}", "op", "lock", "keys", "x", "y");
    EXPECT("sem.acquire", "{s:s,s:s,s:i}", "op", "sem.acquire", "key", "s",
           "limit", 2);
    if (cache_refused) {
        EXPECT("cache.set", "{s:s,s:s,s:s,s:i}", "op", "cache.set", "key", "k",
               "value", "v", "ttl_ms", 10000);
    }

    if (cache_refused) {
        /* The journal keeps the invalidation until Redis takes it. */
        json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.invalidate",
                            "key", "k");
        ck_assert_msg(h_ok(r) && jtrue(r, "queued"),
                      "%s, cache.invalidate: not queued", why);
        json_decref(r);
    }

    /* A read whose script also writes (the fill lease, the hot-key and
     * refresh marks) cannot be answered either. */
    EXPECT("cache.get", "{s:s,s:s}", "op", "cache.get", "key", "m");
#undef EXPECT
    h_assert_ping(c);
    h_close(c);
}

START_TEST(test_no_replicas)
{
    start("--min-replicas-to-write 1");
    every_write_refused("NOREPLICAS", true);
    ck_assert_int_eq(h_r_int(&R, "DBSIZE"), 0);
}
END_TEST

START_TEST(test_out_of_memory)
{
    /* One byte: whatever Redis uses already is over it. cache.set is left
     * out: its script deletes first, and Redis lets a script that has
     * written finish its writes whatever the memory. */
    start("--maxmemory 1 --maxmemory-policy noeviction");
    every_write_refused("OOM", false);
    ck_assert_int_eq(h_r_int(&R, "DBSIZE"), 0);
}
END_TEST

/* A lock held when the master starts to refuse writes: its release is
 * refused too, and then the lock is not reported gone. */
START_TEST(test_held_then_refused)
{
    start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key", "h",
                        "ttl_ms", 30000);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    char token[64];
    snprintf(token, sizeof token, "%s", jstr(r, "token"));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "sem.acquire", "key", "hs",
                "limit", 1);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    char stoken[64];
    snprintf(stoken, sizeof stoken, "%s", jstr(r, "token"));
    json_decref(r);

    h_r_do(&R, "CONFIG SET min-replicas-to-write 1");
    expect_unavailable(c, "unlock", "{s:s,s:s,s:s}", "op", "unlock", "key",
                       "h", "token", token);
    expect_unavailable(c, "extend", "{s:s,s:s,s:s,s:i}", "op", "extend", "key",
                       "h", "token", token, "ttl_ms", 30000);
    expect_unavailable(c, "sem.release", "{s:s,s:s,s:s}", "op", "sem.release",
                       "key", "hs", "token", stoken);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{h}"), 1);

    h_r_do(&R, "CONFIG SET min-replicas-to-write 0");
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "h", "token",
                token);
    ck_assert_msg(h_ok(r), "unlock once Redis takes writes again");
    json_decref(r);
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(no_replicas, 60),
        H_CASE(out_of_memory, 60),
        H_CASE(held_then_refused, 60),
    };

    return H_MAIN(fx, cases);
}
