/* Versioned writes against a real leased and a real Redis: every stored
 * value and null gets a version above the one before (and above any it
 * had before a delete), hits carry it (from Redis, the near cache, a
 * stale entry, cache.mget), and cache.set, cache.fill and cache.mset with
 * if_version store only over that version, answering the current one
 * otherwise. Writers on two daemons racing with compare-and-set loops
 * lose no update. On a cluster (on_cluster/check_versioned.cluster) the
 * same, with keys on every master. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define T_MS 10000
#define PREFIX "leased:cache:"

static struct h_redis R;
static struct h_daemon D, D2;
static const struct h_fixture fx = {
    .suite = "versioned",
    .redis = {&R},
    .daemons = {&D, &D2},
};

/* --- helpers ------------------------------------------------------------ */

/* cache.set of KEY to VALUE (NULL: a cached null), over IF_VERSION when
 * it is not negative. */
static json_t *
set_if(struct h_conn *c, const char *key, const char *value,
       long long if_version)
{
    json_t *req = json_pack("{s:s,s:s}", "op", "cache.set", "key", key);
    json_object_set_new(req, "value",
                        value != NULL ? json_string(value) : json_null());
    if (if_version >= 0) {
        json_object_set_new(req, "if_version", json_integer(if_version));
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "no answer to cache.set %s", key);
    return r;
}

/* A cache.set that must store: the version it got. */
static long long
set_ok(struct h_conn *c, const char *key, const char *value,
       long long if_version)
{
    json_t *r = set_if(c, key, value, if_version);
    ck_assert_msg(h_ok(r) && jtrue(r, "stored") && jint(r, "version") > 0,
                  "cache.set %s: %s", key, h_dump(r));
    long long v = jint(r, "version");
    json_decref(r);
    return v;
}

/* A cache.set over IF_VERSION that must be refused, the entry's version
 * being WANT. */
static void
set_moved(struct h_conn *c, const char *key, const char *value,
          long long if_version, long long want)
{
    json_t *r = set_if(c, key, value, if_version);
    ck_assert_msg(h_ok(r) && json_is_false(json_object_get(r, "stored")) &&
                      json_is_integer(json_object_get(r, "version")) &&
                      jint(r, "version") == want,
                  "cache.set %s if_version %lld: %s, want stored:false "
                  "version %lld",
                  key, if_version, h_dump(r), want);
    json_decref(r);
}

static json_t *
get(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        key, "lease", 0);
    ck_assert_msg(r != NULL && h_ok(r), "cache.get %s: %s", key, h_dump(r));
    return r;
}

/* KEY must hit VALUE (NULL: a cached null): its version. */
static long long
hit_version(struct h_conn *c, const char *key, const char *value)
{
    json_t *r = get(c, key);
    json_t *v = json_object_get(r, "value");
    bool same = value != NULL ? json_is_string(v) &&
                                    strcmp(json_string_value(v), value) == 0
                              : json_is_null(v);
    ck_assert_msg(jtrue(r, "hit") && same &&
                      json_is_integer(json_object_get(r, "version")),
                  "cache.get %s: %s, want a hit on %s with a version", key,
                  h_dump(r), value != NULL ? value : "null");
    long long ver = jint(r, "version");
    json_decref(r);
    return ver;
}

/* The version field of KEY's entry, as Redis holds it in either layout
 * (-1: none). */
static long long
redis_version(const char *key)
{
    char name[256], buf[32];
    snprintf(name, sizeof name, PREFIX "{%s}", key);
    return h_entry_field(&R, name, 'r', buf, sizeof buf) ? atoll(buf) : -1;
}

static long long
now_us(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (long long)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* A cache.get that must grant the fill lease: it (malloc'd). */
static char *
lease_of(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", key);
    ck_assert_msg(h_ok(r) && !jtrue(r, "hit") && jstr(r, "lease") != NULL,
                  "cache.get %s: %s, want a lease", key, h_dump(r));
    char *lease = strdup(jstr(r, "lease"));
    json_decref(r);
    return lease;
}

static json_t *
fill_if(struct h_conn *c, const char *key, const char *lease,
        const char *value, long long if_version)
{
    json_t *req = json_pack("{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key",
                            key, "lease", lease, "value", value);
    if (if_version >= 0) {
        json_object_set_new(req, "if_version", json_integer(if_version));
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "no answer to cache.fill %s", key);
    return r;
}

/* --- the cases ----------------------------------------------------------- */

/* Every write that stores gives a new, higher version, close to Redis'
 * clock in microseconds; a hit carries the version of what it returns,
 * as does every way of writing (set, fill, mset, a null). */
START_TEST(test_versions_increase)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);

    long long before = now_us();
    long long v1 = set_ok(c, "k", "one", -1);
    /* Redis' clock is this machine's: the version is its microseconds. */
    ck_assert_msg(v1 >= before - 60000000LL && v1 <= now_us() + 60000000LL,
                  "version %lld is not near the clock's %lld us", v1, before);
    ck_assert_int_eq(hit_version(c, "k", "one"), v1);
    ck_assert_int_eq(redis_version("k"), v1);
    long long prev = v1;
    for (int i = 0; i < 50; i++) {
        long long v = set_ok(c, "k", i % 2 ? "odd" : "even", -1);
        ck_assert_msg(v > prev, "version %lld after %lld", v, prev);
        ck_assert_int_eq(hit_version(c, "k", i % 2 ? "odd" : "even"), v);
        prev = v;
    }
    /* A null has one too, and a value after it a higher one. */
    long long vn = set_ok(c, "k", NULL, -1);
    ck_assert_int_gt(vn, prev);
    ck_assert_int_eq(hit_version(c, "k", NULL), vn);

    /* A fill under a lease. */
    char *lease = lease_of(c, "f");
    json_t *r = fill_if(c, "f", lease, "loaded", -1);
    ck_assert_msg(h_ok(r) && jtrue(r, "stored") && jint(r, "version") > 0,
                  "fill: %s", h_dump(r));
    long long vf = jint(r, "version");
    json_decref(r);
    free(lease);
    ck_assert_int_eq(hit_version(c, "f", "loaded"), vf);

    /* cache.mset's entries, and cache.mget's results. */
    r = h_must(h_callf(c, T_MS, "{s:s,s:[{s:s,s:s},{s:s,s:n}]}", "op",
                       "cache.mset", "entries", "key", "m1", "value", "a",
                       "key", "m2", "value"));
    json_t *res = json_object_get(r, "results");
    long long vm1 = jint(json_array_get(res, 0), "version");
    long long vm2 = jint(json_array_get(res, 1), "version");
    ck_assert_msg(jint(r, "stored") == 2 && vm1 > 0 && vm2 > 0 &&
                      jtrue(json_array_get(res, 0), "stored"),
                  "mset: %s", h_dump(r));
    json_decref(r);
    r = h_must(h_callf(c, T_MS, "{s:s,s:[s,s,s,s],s:b}", "op", "cache.mget",
                       "keys", "m1", "m2", "f", "none", "lease", 0));
    res = json_object_get(r, "results");
    ck_assert_msg(jint(json_array_get(res, 0), "version") == vm1 &&
                      jint(json_array_get(res, 1), "version") == vm2 &&
                      jint(json_array_get(res, 2), "version") == vf &&
                      !jtrue(json_array_get(res, 3), "hit") &&
                      json_object_get(json_array_get(res, 3), "version") ==
                          NULL,
                  "mget: %s", h_dump(r));
    json_decref(r);
    h_close(c);
}
END_TEST

/* if_version: a match stores (and gets a new version), a mismatch answers
 * stored:false with the current version and changes nothing; 0 means
 * "only if there is no entry". */
START_TEST(test_if_version)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);

    /* 0 on a key with nothing: stored; again: refused, the entry is
     * there. */
    long long v1 = set_ok(c, "c", "first", 0);
    set_moved(c, "c", "second", 0, v1);
    long long v2 = set_ok(c, "c", "second", v1);
    ck_assert_int_gt(v2, v1);
    /* The old version again: refused, nothing changed (value, version,
     * TTL). */
    long long pttl = h_r_int(&R, "PTTL " PREFIX "{c}");
    set_moved(c, "c", "stale writer", v1, v2);
    set_moved(c, "c", "stale writer", v2 + 1, v2);
    set_moved(c, "c", NULL, v1, v2);
    ck_assert_int_eq(hit_version(c, "c", "second"), v2);
    ck_assert_int_eq(redis_version("c"), v2);
    ck_assert_int_le(h_r_int(&R, "PTTL " PREFIX "{c}"), pttl);
    /* Nothing there: the current version is 0. */
    set_moved(c, "none", "x", 12345, 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS " PREFIX "{none}"), 0);
    /* A cached null is a value a writer may race with. */
    long long vn = set_ok(c, "c", NULL, v2);
    set_moved(c, "c", "x", 0, vn);
    set_moved(c, "c", "x", v2, vn);
    long long v3 = set_ok(c, "c", "after null", vn);
    ck_assert_int_eq(hit_version(c, "c", "after null"), v3);

    /* cache.mset: per entry, as cache.set. */
    json_t *r = h_must(
        h_callf(c, T_MS, "{s:s,s:[{s:s,s:s,s:I},{s:s,s:s,s:I},{s:s,s:s,s:i}]}",
                "op", "cache.mset", "entries", "key", "c", "value", "m",
                "if_version", (json_int_t)v1, "key", "c2", "value", "m",
                "if_version", (json_int_t)0, "key", "c3", "value", "m",
                "if_version", 7));
    json_t *res = json_object_get(r, "results");
    ck_assert_msg(jint(r, "stored") == 1 && h_ok(json_array_get(res, 0)) &&
                      !jtrue(json_array_get(res, 0), "stored") &&
                      jint(json_array_get(res, 0), "version") == v3 &&
                      jtrue(json_array_get(res, 1), "stored") &&
                      !jtrue(json_array_get(res, 2), "stored") &&
                      jint(json_array_get(res, 2), "version") == 0,
                  "mset: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(hit_version(c, "c", "after null"), v3);

    /* Bad if_version values. */
    const char *bad[] = {
        "{\"op\":\"cache.set\",\"key\":\"c\",\"value\":\"v\","
        "\"if_version\":-1}",
        "{\"op\":\"cache.set\",\"key\":\"c\",\"value\":\"v\","
        "\"if_version\":\"5\"}",
        "{\"op\":\"cache.set\",\"key\":\"c\",\"value\":\"v\","
        "\"if_version\":1.5}",
        "{\"op\":\"cache.set\",\"key\":\"c\",\"value\":\"v\","
        "\"if_version\":9007199254740993}",
        "{\"op\":\"cache.fill\",\"key\":\"c\",\"lease\":\"x\","
        "\"value\":\"v\",\"if_version\":true}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char line[256];
        int n = snprintf(line, sizeof line, "%s\n", bad[i]);
        ck_assert_int_eq(h_send_raw(c, line, (size_t)n), 0);
        r = h_recv(c, T_MS);
        h_expect_code(r, "bad_request", bad[i]);
    }
    r = h_must(h_callf(c, T_MS, "{s:s,s:[{s:s,s:s,s:i}]}", "op", "cache.mset",
                       "entries", "key", "c", "value", "m", "if_version", -3));
    ck_assert_msg(
        jint(r, "stored") == 0 &&
            strcmp(h_errcode(json_array_get(json_object_get(r, "results"), 0)),
                   "bad_request") == 0,
        "mset with a bad if_version: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(hit_version(c, "c", "after null"), v3);
    h_close(c);
}
END_TEST

/* Deleted, then written again: the new version is above every version
 * the key had, so a writer holding one from before the delete is
 * refused. */
START_TEST(test_delete_then_write)
{
    h_start("cache:\n  double_delete_ms: 0\n");
    struct h_conn *c = h_connect_ok(&D);
    long long v1 = set_ok(c, "d", "old", -1);
    long long prev = v1;
    for (int i = 0; i < 20; i++) {
        json_decref(
            h_must(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "cache.invalidate",
                           "key", "d", "delay_ms", 0)));
        ck_assert_int_eq(h_r_int(&R, "EXISTS " PREFIX "{d}"), 0);
        set_moved(c, "d", "stale", prev, 0);
        long long v = set_ok(c, "d", "new", -1);
        ck_assert_msg(v > prev, "version %lld after a delete, was %lld", v,
                      prev);
        set_moved(c, "d", "stale", v1, v);
        prev = v;
    }
    h_close(c);
}
END_TEST

/* The counter of compare-and-set loops: each writer reads the value and
 * its version and writes value + 1 over that version, again until it
 * stores. Writers on two daemons, interleaved so that they read the same
 * version and race to write over it, every round. */
enum { WRITERS = 4, INCREMENTS = 40 };

struct writer {
    struct h_conn *c;
    int done;
    long long ver;
    long long val;
};

START_TEST(test_race_two_daemons)
{
    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct writer w[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        w[i].c = h_connect_ok(i % 2 ? &D2 : &D);
        w[i].done = 0;
    }
    int rounds = 0, conflicts = 0;
    for (;;) {
        int active = 0;
        for (int i = 0; i < WRITERS; i++) {
            if (w[i].done < INCREMENTS) {
                active++;
                ck_assert_int_eq(h_send(w[i].c, "{s:s,s:s,s:b}", "op",
                                        "cache.get", "key", "ctr", "lease", 0),
                                 0);
            }
        }
        if (active == 0) {
            break;
        }
        rounds++;
        ck_assert_msg(rounds < WRITERS * INCREMENTS * 4, "no progress");
        for (int i = 0; i < WRITERS; i++) {
            if (w[i].done >= INCREMENTS) {
                continue;
            }
            json_t *r = h_recv(w[i].c, T_MS);
            ck_assert_msg(r != NULL && h_ok(r), "get: %s", h_dump(r));
            if (jtrue(r, "hit")) {
                w[i].ver = jint(r, "version");
                w[i].val = atoll(jstr(r, "value"));
            } else {
                w[i].ver = 0;
                w[i].val = 0;
            }
            json_decref(r);
        }
        /* Every writer's write leaves before any answer is read. */
        for (int i = 0; i < WRITERS; i++) {
            if (w[i].done < INCREMENTS) {
                char v[32];
                snprintf(v, sizeof v, "%lld", w[i].val + 1);
                ck_assert_int_eq(h_send(w[i].c, "{s:s,s:s,s:s,s:i,s:I}", "op",
                                        "cache.set", "key", "ctr", "value", v,
                                        "ttl_ms", 600000, "if_version",
                                        (json_int_t)w[i].ver),
                                 0);
            }
        }
        for (int i = 0; i < WRITERS; i++) {
            if (w[i].done >= INCREMENTS) {
                continue;
            }
            json_t *r = h_recv(w[i].c, T_MS);
            ck_assert_msg(r != NULL && h_ok(r), "set: %s", h_dump(r));
            if (jtrue(r, "stored")) {
                w[i].done++;
            } else {
                conflicts++;
                ck_assert_msg(jint(r, "version") != w[i].ver,
                              "refused over the version it read: %s",
                              h_dump(r));
            }
            json_decref(r);
        }
    }
    char want[32];
    snprintf(want, sizeof want, "%d", WRITERS * INCREMENTS);
    hit_version(w[0].c, "ctr", want);
    /* They did race: most rounds, one writer won and the others were
     * refused. */
    ck_assert_msg(conflicts > 0, "no write was ever refused");
    fprintf(stderr, "# race: %d rounds, %d refused writes\n", rounds,
            conflicts);
    for (int i = 0; i < WRITERS; i++) {
        h_close(w[i].c);
    }
}
END_TEST

/* The near cache keeps the version with the value: a near hit carries
 * the version Redis holds, and a write (here or on the other daemon)
 * takes the old one away. */
static bool
near_hit_of(struct h_conn *c, const char *key, long long ver, long long old)
{
    long long end = h_now_ms() + T_MS;
    while (h_now_ms() < end) {
        json_t *r = get(c, key);
        bool near = jtrue(r, "near");
        long long got = jint(r, "version");
        /* OLD (0: none) until this daemon hears of the write that made
         * VER: a write through another daemon reaches this one's near
         * cache by Redis' invalidation, a moment later. */
        ck_assert_msg(jtrue(r, "hit") && (got == ver || (old && got == old)),
                      "cache.get %s: %s, want version %lld", key, h_dump(r),
                      ver);
        json_decref(r);
        if (near && got == ver) {
            return true;
        }
    }
    return false;
}

START_TEST(test_near)
{
    const char *yaml = "cache:\n  near: { enabled: true }\n";
    h_start(yaml);
    ck_assert_int_eq(h_daemon_start(&D2, &R, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    struct h_conn *c2 = h_connect_ok(&D2);
    h_assert_stat(c, "near_tracking", 1, T_MS);
    h_assert_stat(c2, "near_tracking", 1, T_MS);

    long long v1 = set_ok(c, "n", "one", -1);
    ck_assert_msg(near_hit_of(c, "n", v1, 0), "never a near hit");
    /* cache.mget's near hits too. */
    json_t *r = h_must(h_callf(c, T_MS, "{s:s,s:[s],s:b}", "op", "cache.mget",
                               "keys", "n", "lease", 0));
    json_t *x = json_array_get(json_object_get(r, "results"), 0);
    ck_assert_msg(jtrue(x, "near") && jint(x, "version") == v1, "mget: %s",
                  h_dump(r));
    json_decref(r);
    /* The other daemon writes over v1: this one's near hit goes, and the
     * next one carries the new version. */
    long long v2 = set_ok(c2, "n", "two", v1);
    ck_assert_msg(near_hit_of(c, "n", v2, v1), "never a near hit of v2");
    set_moved(c, "n", "three", v1, v2);
    h_close(c);
    h_close(c2);
}
END_TEST

/* cache.fill with if_version: the version its cache.get saw (0 for a
 * miss, the stale value's for a stale one); anything else is refused,
 * the lease kept. */
START_TEST(test_fill)
{
    h_start("cache:\n  double_delete_ms: 0\n");
    struct h_conn *c = h_connect_ok(&D);

    char *lease = lease_of(c, "f");
    json_t *r = fill_if(c, "f", lease, "wrong", 99);
    ck_assert_msg(h_ok(r) && !jtrue(r, "stored") && jint(r, "version") == 0,
                  "fill over 99: %s", h_dump(r));
    json_decref(r);
    r = fill_if(c, "f", lease, "loaded", 0);
    ck_assert_msg(h_ok(r) && jtrue(r, "stored") && jint(r, "version") > 0,
                  "fill over 0: %s", h_dump(r));
    long long v1 = jint(r, "version");
    json_decref(r);
    free(lease);
    ck_assert_int_eq(hit_version(c, "f", "loaded"), v1);

    /* A stale entry: the stale hit carries its version, and the reload
     * fills over it. */
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:s,s:b,s:i}", "op", "cache.invalidate",
                       "key", "f", "stale", 1, "delay_ms", 0)));
    r = h_must(h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "f"));
    ck_assert_msg(jtrue(r, "stale") && jint(r, "version") == v1 &&
                      jstr(r, "lease") != NULL,
                  "stale get: %s", h_dump(r));
    lease = strdup(jstr(r, "lease"));
    json_decref(r);
    r = fill_if(c, "f", lease, "reloaded", v1 + 1);
    ck_assert_msg(h_ok(r) && !jtrue(r, "stored") && jint(r, "version") == v1,
                  "fill over v1 + 1: %s", h_dump(r));
    json_decref(r);
    r = fill_if(c, "f", lease, "reloaded", v1);
    ck_assert_msg(h_ok(r) && jtrue(r, "stored") && jint(r, "version") > v1,
                  "fill over v1: %s", h_dump(r));
    long long v2 = jint(r, "version");
    json_decref(r);
    free(lease);
    ck_assert_int_eq(hit_version(c, "f", "reloaded"), v2);

    /* A slow load: a cache.set landed meanwhile, and the fill is refused
     * with its version. */
    json_decref(
        h_must(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "cache.invalidate",
                       "key", "f", "delay_ms", 0)));
    lease = lease_of(c, "f");
    long long v3 = set_ok(c, "f", "written", -1);
    r = fill_if(c, "f", lease, "slow load", 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "stored") && jint(r, "version") == v3,
                  "fill after a set: %s", h_dump(r));
    json_decref(r);
    free(lease);
    ck_assert_int_eq(hit_version(c, "f", "written"), v3);
    h_close(c);
}
END_TEST

/* Entries written before versions (no r field) read as version 1, and a
 * write over 1 replaces them; data leased did not write is wrong_type. */
START_TEST(test_old_entries_and_wrong_type)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);

    h_r_do(&R, "HSET " PREFIX "{old} v before");
    h_r_do(&R, "PEXPIRE " PREFIX "{old} 600000");
    h_r_do(&R, "HSET " PREFIX "{oldnull} n 1");
    h_r_do(&R, "PEXPIRE " PREFIX "{oldnull} 600000");
    ck_assert_int_eq(hit_version(c, "old", "before"), 1);
    ck_assert_int_eq(hit_version(c, "oldnull", NULL), 1);
    set_moved(c, "old", "x", 0, 1);
    long long v = set_ok(c, "old", "after", 1);
    ck_assert_int_gt(v, 1);
    ck_assert_int_eq(hit_version(c, "old", "after"), v);
    set_ok(c, "oldnull", "after", 1);

    /* Another type, and a version field that is not ours. */
    h_r_do(&R, "SET " PREFIX "{str} x");
    h_r_do(&R, "HSET " PREFIX "{badver} v x r notdigits");
    const char *keys[] = {"str", "badver"};
    for (int i = 0; i < 2; i++) {
        json_t *r = set_if(c, keys[i], "v", 0);
        h_expect_code(r, "wrong_type", "cache.set if_version");
        r = set_if(c, keys[i], "v", -1);
        h_expect_code(r, "wrong_type", "cache.set");
        r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                    keys[i], "lease", 0);
        h_expect_code(r, "wrong_type", "cache.get");
        r = fill_if(c, keys[i], "lease", "v", 0);
        h_expect_code(r, "wrong_type", "cache.fill if_version");
    }
    redisReply *rep = h_redis_cmd(&R, "HGET " PREFIX "{badver} r");
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING &&
                      strcmp(rep->str, "notdigits") == 0,
                  "the foreign hash was changed");
    freeReplyObject(rep);
    h_close(c);
}
END_TEST

/* Redis down: a write with if_version is redis_unavailable, as any. */
START_TEST(test_redis_down)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    long long v = set_ok(c, "rd", "v", -1);
    h_redis_kill(&R);
    json_t *r = set_if(c, "rd", "w", v);
    h_expect_code(r, "redis_unavailable", "cache.set if_version");
    r = fill_if(c, "rd", "lease", "w", v);
    h_expect_code(r, "redis_unavailable", "cache.fill if_version");
    r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key", "rd",
                "lease", 0);
    h_expect_code(r, "redis_unavailable", "cache.get");
    h_close(c);
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
        found = found || strcmp(json_string_value(f), "versioned") == 0;
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
        H_CASE(versions_increase, 60),
        H_CASE(if_version, 60),
        H_CASE(delete_then_write, 60),
        H_CASE(race_two_daemons, 120),
        H_CASE(near, 60),
        H_CASE(fill, 60),
        H_CASE(old_entries_and_wrong_type, 60),
        H_CASE(redis_down, 60),
        H_CASE(feature, 60),
    };
    return H_MAIN(fx, cases);
}
