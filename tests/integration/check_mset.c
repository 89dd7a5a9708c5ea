/* cache.mset, the bulk warm-up, against a real leased and a real Redis:
 * every entry stored as cache.set stores one (the same hash, TTL and
 * jitter, cached nulls), the count and the per-entry errors, the limits,
 * a Redis that is down, fill leases and invalidations in flight, and
 * namespaces. On a cluster (on_cluster/check_mset.cluster) the entries'
 * keys spread over every master. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MS 10000
#define PREFIX "leased:cache:"

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "mset",
    .redis = {&R},
    .daemons = {&D},
};

/* --- helpers ------------------------------------------------------------ */

static json_t *
entry(const char *key, const char *value, long long ttl_ms)
{
    json_t *e = json_pack("{s:s}", "key", key);
    json_object_set_new(e, "value",
                        value != NULL ? json_string(value) : json_null());
    if (ttl_ms > 0) {
        json_object_set_new(e, "ttl_ms", json_integer(ttl_ms));
    }
    return e;
}

/* cache.mset of ENTRIES (stolen). */
static json_t *
mset(struct h_conn *c, json_t *entries)
{
    json_t *r = h_call(c,
                       json_pack("{s:s,s:o}", "op", "cache.mset", "entries",
                                 entries),
                       T_MS);
    ck_assert_msg(r != NULL, "no answer to cache.mset");
    return r;
}

static json_t *
result(const json_t *r, size_t i)
{
    return json_array_get(json_object_get(r, "results"), i);
}

/* The code of result I (NULL when it is ok). */
static const char *
result_code(const json_t *r, size_t i)
{
    return h_errcode(result(r, i));
}

static long long
entry_pttl(const char *key)
{
    return h_r_int(&R, "PTTL " PREFIX "{%s}", key);
}

/* A plain cache.get of KEY must hit VALUE (NULL: a cached null). */
static void
expect_hit(struct h_conn *c, const char *key, const char *value)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        key, "lease", 0);
    json_t *v = json_object_get(r, "value");
    bool same = value != NULL ? json_is_string(v) &&
                                    strcmp(json_string_value(v), value) == 0
                              : json_is_null(v);
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") && same,
                  "cache.get %s: %s, want %s", key, h_dump(r),
                  value != NULL ? value : "null");
    json_decref(r);
}

/* --- the cases ----------------------------------------------------------- */

/* Values, nulls and "" stored and read back, each with its TTL spread by
 * the jitter as cache.set's. */
START_TEST(test_stored_and_ttls)
{
    h_start("cache:\n  ttl_ms: 600000\n  null_ttl_ms: 60000\n"
            "  ttl_jitter: 0.1\n");
    struct h_conn *c = h_connect_ok(&D);
    enum { N = 300 };
    char key[32], val[32];

    json_t *es = json_array();
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "w:%d", i);
        snprintf(val, sizeof val, "value %d", i);
        json_array_append_new(es, entry(key, val, 100000));
    }
    json_array_append_new(es, entry("nul", NULL, 100000));
    json_array_append_new(es, entry("dflt", "d", 0));
    json_array_append_new(es, entry("empty", "", 100000));
    json_t *r = mset(c, es);
    ck_assert_msg(h_ok(r) && jint(r, "stored") == N + 3, "mset: %s",
                  h_dump(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "results")), N + 3);
    for (size_t i = 0; i < N + 3; i++) {
        ck_assert_msg(h_ok(result(r, i)), "entry %zu: %s", i,
                      h_dump(result(r, i)));
    }
    json_decref(r);

    long long lo = -1, hi = -1;
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "w:%d", i);
        snprintf(val, sizeof val, "value %d", i);
        expect_hit(c, key, val);
        long long pttl = entry_pttl(key);
        ck_assert_msg(pttl >= 90000 - 10000 && pttl <= 110000, "%s pttl %lld",
                      key, pttl);
        lo = lo < 0 || pttl < lo ? pttl : lo;
        hi = pttl > hi ? pttl : hi;
    }
    /* Uniform over 20 s: 300 samples span well over 10 s unless the
     * jitter is missing. */
    ck_assert_msg(hi - lo > 10000, "pttls span only %lld..%lld", lo, hi);
    /* The layout cache.set writes: the value in field v of the hash, or
     * the entry's string under cache.layout 2. */
    char buf[64];
    ck_assert(h_entry_field(&R, PREFIX "{w:7}", 'v', buf, sizeof buf));
    ck_assert_str_eq(buf, "value 7");

    /* A null is cached for null_ttl_ms whatever ttl_ms says. */
    expect_hit(c, "nul", NULL);
    long long pttl = entry_pttl("nul");
    ck_assert_msg(pttl >= 54000 - 10000 && pttl <= 66000, "nul pttl %lld",
                  pttl);
    expect_hit(c, "dflt", "d");
    pttl = entry_pttl("dflt");
    ck_assert_msg(pttl >= 540000 - 10000 && pttl <= 660000, "dflt pttl %lld",
                  pttl);
    expect_hit(c, "empty", "");
    h_close(c);
}
END_TEST

/* A bad entry fails alone, with its own error as cache.mget's results
 * carry them; the good ones are stored. */
START_TEST(test_per_entry_errors)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    char buf[64];

    h_r_do(&R, "SET " PREFIX "{foreign} theirs");
    json_t *es = json_array();
    json_array_append_new(es, entry("good:1", "a", 0));
    json_array_append_new(es, entry("", "v", 0));
    json_array_append_new(es, json_pack("{s:i,s:s}", "key", 5, "value", "v"));
    json_array_append_new(es, json_pack("{s:s}", "key", "novalue"));
    json_array_append_new(es,
                          json_pack("{s:s,s:i}", "key", "numval", "value", 7));
    json_array_append_new(es, json_pack("{s:s,s:s,s:i}", "key", "ttl0",
                                        "value", "v", "ttl_ms", 0));
    json_array_append_new(es, json_pack("{s:s,s:s,s:s}", "key", "ttlstr",
                                        "value", "v", "ttl_ms", "x"));
    json_array_append_new(es, json_integer(42));
    json_array_append_new(es, entry("foreign", "mine", 0));
    json_array_append_new(es, entry("good:2", "b", 0));
    json_t *r = mset(c, es);
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 2, "mset: %s", h_dump(r));
    ck_assert_ptr_null(result_code(r, 0));
    for (size_t i = 1; i <= 7; i++) {
        ck_assert_msg(result_code(r, i) != NULL &&
                          strcmp(result_code(r, i), "bad_request") == 0,
                      "entry %zu: %s", i, h_dump(result(r, i)));
    }
    ck_assert_msg(result_code(r, 8) != NULL &&
                      strcmp(result_code(r, 8), "wrong_type") == 0,
                  "foreign entry: %s", h_dump(result(r, 8)));
    ck_assert_ptr_null(result_code(r, 9));
    json_decref(r);
    expect_hit(c, "good:1", "a");
    expect_hit(c, "good:2", "b");
    ck_assert_int_eq(h_r_int(&R, "EXISTS " PREFIX "{novalue}"), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS " PREFIX "{ttl0}"), 0);
    /* The foreign data is left as it was. */
    redisReply *rep = h_redis_cmd(&R, "GET " PREFIX "{foreign}");
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING);
    snprintf(buf, sizeof buf, "%s", rep->str);
    freeReplyObject(rep);
    ck_assert_str_eq(buf, "theirs");
    ck_assert_int_eq(entry_pttl("foreign"), -1);
    h_close(c);
}
END_TEST

/* At most 1000 entries (cache.mget's limit on keys); the request is
 * refused whole past it, when empty, and when it is no array. */
START_TEST(test_limits)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    char key[32];

    h_expect_code(h_callf(c, T_MS, "{s:s}", "op", "cache.mset"), "bad_request",
                  "cache.mset without entries");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:[]}", "op", "cache.mset",
                          "entries"),
                  "bad_request", "cache.mset of no entries");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.mset", "entries",
                          "x"),
                  "bad_request", "cache.mset of a string");

    json_t *es = json_array();
    for (int i = 0; i < 1001; i++) {
        snprintf(key, sizeof key, "l:%d", i);
        json_array_append_new(es, entry(key, "v", 0));
    }
    h_expect_code(mset(c, json_deep_copy(es)), "bad_request",
                  "cache.mset of 1001 entries");
    ck_assert_int_eq(h_r_int(&R, "DBSIZE"), 0);
    json_array_remove(es, 1000);
    json_t *r = mset(c, es);
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 1000, "1000 entries: %s",
                  h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "DBSIZE"), 1000);
    h_close(c);
}
END_TEST

/* A request over limits.max_request_bytes is too_large, and nothing of it
 * is stored. */
START_TEST(test_request_bytes)
{
    h_start("limits:\n  max_request_bytes: 65536\n");
    struct h_conn *c = h_connect_ok(&D);
    char key[32], big[2048];

    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    json_t *es = json_array();
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof key, "big:%d", i);
        json_array_append_new(es, entry(key, big, 0));
    }
    /* Answered without its id: the request was never read as JSON. */
    json_t *req = json_pack("{s:s,s:o}", "op", "cache.mset", "entries", es);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
    ck_assert_int_eq(h_send_raw(c, "\n", 1), 0);
    free(line);
    h_expect_code(h_recv(c, T_MS), "too_large",
                  "cache.mset over the request limit");
    ck_assert_int_eq(h_r_int(&R, "DBSIZE"), 0);
    h_assert_ping(c);
    h_close(c);
}
END_TEST

/* Redis down: every entry redis_unavailable, none stored; once it is
 * back the same request stores them. */
struct retry {
    struct h_conn *c;
    json_t *entries;
};

static bool
stored_all(void *arg)
{
    struct retry *t = arg;
    json_t *r = mset(t->c, json_deep_copy(t->entries));
    bool all = h_ok(r) &&
               jint(r, "stored") == (long long)json_array_size(t->entries);
    json_decref(r);
    return all;
}

START_TEST(test_redis_down)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);

    h_redis_kill(&R);
    json_t *es = json_pack("[o,o]", entry("d1", "v", 0), entry("d2", NULL, 0));
    json_t *r = mset(c, json_deep_copy(es));
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 0, "mset: %s", h_dump(r));
    for (size_t i = 0; i < 2; i++) {
        ck_assert_msg(result_code(r, i) != NULL &&
                          strcmp(result_code(r, i), "redis_unavailable") == 0,
                      "entry %zu: %s", i, h_dump(r));
    }
    json_decref(r);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    struct retry t = {c, es};
    ck_assert_msg(h_wait_until(stored_all, &t, 20000),
                  "cache.mset never stored after Redis came back");
    json_decref(es);
    expect_hit(c, "d1", "v");
    expect_hit(c, "d2", NULL);
    h_close(c);
}
END_TEST

/* A Redis that stops answering: each entry that left gets
 * redis_unavailable with "outcome":"unknown" (it may have been written),
 * as cache.set does; and a daemon stopped while entries are out exits
 * cleanly, answering them. */
START_TEST(test_redis_stalled)
{
    char yaml[256];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    struct h_conn *st = h_connect_ok(&D);

    h_redis_signal(&R, SIGSTOP);
    json_t *r = mset(c, json_pack("[o,o]", entry("s1", "v", 0),
                                  entry("s2", "w", 0)));
    h_redis_signal(&R, SIGCONT);
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 0, "mset: %s", h_dump(r));
    for (size_t i = 0; i < 2; i++) {
        ck_assert_msg(
            result_code(r, i) != NULL &&
                strcmp(result_code(r, i), "redis_unavailable") == 0 &&
                jstr(json_object_get(result(r, i), "error"), "outcome") !=
                    NULL &&
                strcmp(jstr(json_object_get(result(r, i), "error"), "outcome"),
                       "unknown") == 0,
            "entry %zu: %s", i, h_dump(r));
    }
    json_decref(r);
    ck_assert(h_wait_stat_min(st, "redis_connected", 1, T_MS));

    /* Stopped with a cache.mset out. */
    h_redis_signal(&R, SIGSTOP);
    json_t *req = json_pack("{s:s,s:[o,o,o]}", "op", "cache.mset", "entries",
                            entry("q1", "v", 0), entry("q2", "v", 0),
                            entry("q3", NULL, 0));
    ck_assert_int_eq(h_send_all(c, &req, 1, 77), 0);
    ck_assert(h_wait_stat_min(st, "requests_pending", 2, T_MS));
    int status = h_daemon_stop(&D);
    h_redis_signal(&R, SIGCONT);
    ck_assert_int_eq(status, 0);
    h_close(c);
    h_close(st);
}
END_TEST

/* As with cache.set, an entry voids the fill lease out on its key: the
 * loader's fill is refused and the entry's value stays. */
START_TEST(test_lease_voided)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);

    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "lv");
    ck_assert_msg(h_ok(r) && h_is_token(jstr(r, "lease")), "get: %s",
                  h_dump(r));
    char *lease = strdup(jstr(r, "lease"));
    json_decref(r);

    r = mset(c, json_pack("[o]", entry("lv", "warm", 0)));
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 1, "mset: %s", h_dump(r));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", "lv",
                "lease", lease, "value", "stale");
    ck_assert_msg(h_ok(r) && !jtrue(r, "stored"), "fill: %s", h_dump(r));
    json_decref(r);
    free(lease);
    expect_hit(c, "lv", "warm");
    h_close(c);
}
END_TEST

/* An invalidation in flight (its second delete still to come): the entry
 * is stored as cache.set stores one, and the second delete then removes
 * it, as it removes a cache.set's value. */
static bool
gone(void *arg)
{
    return h_r_int(&R, "EXISTS " PREFIX "{%s}", (const char *)arg) == 0;
}

START_TEST(test_invalidation_in_flight)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);

    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", "iv", "value", "old")));
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "cache.invalidate",
                       "key", "iv", "delay_ms", 1500)));
    json_t *r = mset(c, json_pack("[o]", entry("iv", "new", 0)));
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 1, "mset: %s", h_dump(r));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key", "iv",
                "lease", 0);
    ck_assert_msg(h_ok(r), "get: %s", h_dump(r));
    /* Read at once it is "new", unless a very slow machine let the
     * second delete run first: then it is a miss, never "old". */
    ck_assert_msg(!jtrue(r, "hit") || strcmp(jstr(r, "value"), "new") == 0,
                  "get after mset: %s", h_dump(r));
    json_decref(r);
    ck_assert_msg(h_wait_until(gone, "iv", 15000),
                  "the second delete never removed the entry");
    h_close(c);
}
END_TEST

/* Every entry's key is checked against the namespace: one outside it
 * refuses the whole request, and nothing is stored. */
START_TEST(test_namespace)
{
    h_start("listen:\n  unix: @DIR@/leased.sock\n  tcp: 127.0.0.1:0\n"
            "  namespaces:\n    - {token: \"tok-a\", prefixes: [\"a:\"]}\n");
    struct h_conn *c = h_connect_tcp(&D);
    ck_assert_ptr_nonnull(c);
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "auth", "tok-a")));
    json_t *r = mset(c, json_pack("[o,o]", entry("a:1", "v", 0),
                                  entry("b:1", "v", 0)));
    ck_assert_msg(h_errcode(r) != NULL &&
                      strcmp(h_errcode(r), "unauthorized") == 0 &&
                      jstr(json_object_get(r, "error"), "key") != NULL &&
                      strcmp(jstr(json_object_get(r, "error"), "key"),
                             "b:1") == 0,
                  "mset outside the namespace: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "DBSIZE"), 0);
    r = mset(c,
             json_pack("[o,o]", entry("a:1", "v", 0), entry("a:2", "w", 0)));
    ck_assert_msg(h_ok(r) && jint(r, "stored") == 2, "mset: %s", h_dump(r));
    json_decref(r);
    h_close(c);
}
END_TEST

/* The entries' writes leave together: a write or two per connection
 * (redis.connections, per master on a cluster), not one per entry. */
START_TEST(test_pipelined)
{
    h_start(NULL);
    struct h_conn *st = h_connect_ok(&D);
    struct h_conn *c = h_connect_ok(&D);
    enum { N = 500 };
    char key[32];

    h_assert_ping(c);
    json_t *es = json_array();
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "p:%d", i);
        json_array_append_new(es, entry(key, "v", 0));
    }
    long long w0 = h_stat(st, "redis_writes");
    long long c0 = h_stat(st, "redis_commands");
    json_t *r = mset(c, es);
    ck_assert_msg(h_ok(r) && jint(r, "stored") == N, "mset: %s", h_dump(r));
    json_decref(r);
    long long dw = h_stat(st, "redis_writes") - w0;
    long long dc = h_stat(st, "redis_commands") - c0;
    ck_assert_int_ge(dc, N);
    ck_assert_msg(dw >= 1 && dw <= 50, "writes %lld for %lld commands", dw,
                  dc);
    h_close(c);
    h_close(st);
}
END_TEST

/* hello offers it. */
START_TEST(test_feature)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    json_t *r = h_must(h_callf(c, T_MS, "{s:s}", "op", "hello"));
    json_t *f, *features = json_object_get(r, "features");
    size_t i;
    bool found = false;
    json_array_foreach(features, i, f)
    {
        found = found || strcmp(json_string_value(f), "mset") == 0;
    }
    ck_assert_msg(found, "hello: %s", h_dump(r));
    json_decref(r);
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(stored_and_ttls, 120),
        H_CASE(per_entry_errors, 60),
        H_CASE(limits, 120),
        H_CASE(request_bytes, 60),
        H_CASE(redis_down, 60),
        H_CASE(lease_voided, 60),
        H_CASE(invalidation_in_flight, 60),
        H_CASE(namespace, 60),
        H_CASE(feature, 60),
        H_CASE(pipelined, 60),
        H_CASE(redis_stalled, 60),
    };
    return H_MAIN(fx, cases);
}
