/* Bloom filters against real redis-server and real leased: the checks of
 * bloom.create, bloom.add and bloom.check; create, add, check and the
 * bits in Redis at the positions leased-protocol(7) gives; create again
 * with equal and other parameters; the false positive rate measured;
 * cache.get with "bloom" (a key ruled out is answered a null without a
 * read of its entry or a fill lease, a maybe is the usual cache.get); a
 * filter made again with other parameters under a running daemon; data
 * leased did not write; Redis down. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MS 5000

static struct h_redis R;
static struct h_daemon D1, D2;
static const struct h_fixture fx = {
    .suite = "bloom",
    .redis = {&R},
    .daemons = {&D1, &D2},
};

/* The positions' recipe, scheme "1", as leased-protocol(7) gives it:
 * written again here from the page, not taken from the daemon. */
static void
positions(const char *key, uint64_t m, unsigned k, uint64_t *out)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    for (unsigned i = 0; i < k; i++) {
        out[i] = ((h & 0xffffffffull) + (uint64_t)i * (h >> 32)) % m;
    }
}

/* Are all K bits of KEY set in filter F's bitmap of M bits? */
static bool
bits_set(const char *f, const char *key, uint64_t m, unsigned k)
{
    uint64_t pos[64];
    positions(key, m, k, pos);
    for (unsigned i = 0; i < k; i++) {
        if (h_r_int(&R, "GETBIT leased:cache:{%s}:bloom %llu", f,
                    (unsigned long long)pos[i]) != 1) {
            return false;
        }
    }
    return true;
}

static json_t *
create_q(const char *f, long long cap, double rate)
{
    return json_pack("{s:s,s:s,s:I,s:f}", "op", "bloom.create", "filter", f,
                     "capacity", (json_int_t)cap, "error_rate", rate);
}

static json_t *
create(struct h_conn *c, const char *f, long long cap, double rate)
{
    return h_call(c, create_q(f, cap, rate), T_MS);
}

/* bloom.add or bloom.check (OP) of F with the N keys KEYS. */
static json_t *
bits_q(const char *op, const char *f, const char *const *keys, size_t n)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(arr, json_string(keys[i]));
    }
    return json_pack("{s:s,s:s,s:o}", "op", op, "filter", f, "keys", arr);
}

static json_t *
bits_call(struct h_conn *c, const char *op, const char *f,
          const char *const *keys, size_t n)
{
    return h_call(c, bits_q(op, f, keys, n), T_MS);
}

/* The answer's array FIELD as N booleans into OUT. */
static void
bools(json_t *r, const char *field, size_t n, bool *out, const char *what)
{
    ck_assert_msg(r != NULL && h_ok(r), "%s: %s", what, h_dump(r));
    json_t *a = json_object_get(r, field);
    ck_assert_msg(json_array_size(a) == n, "%s: %s", what, h_dump(r));
    for (size_t i = 0; i < n; i++) {
        ck_assert(json_is_boolean(json_array_get(a, i)));
        out[i] = json_is_true(json_array_get(a, i));
    }
    json_decref(r);
}

static void
bad(struct h_conn *c, json_t *q, const char *needle)
{
    json_t *r = h_call(c, q, T_MS);
    ck_assert_msg(r != NULL && !h_ok(r), "accepted: %s", needle);
    ck_assert_msg(strcmp(h_errcode(r), "bad_request") == 0, "%s: %s", needle,
                  h_dump(r));
    ck_assert_msg(strstr(jmsg(r), needle) != NULL, "message '%s' lacks '%s'",
                  jmsg(r), needle);
    json_decref(r);
}

/* A created (or already there) filter: its bits and hashes. */
static void
created(json_t *r, bool fresh, long long *m, long long *k, const char *what)
{
    ck_assert_msg(r != NULL && h_ok(r), "%s: %s", what, h_dump(r));
    ck_assert_msg(jtrue(r, "created") == fresh, "%s: %s", what, h_dump(r));
    *m = jint(r, "bits");
    *k = jint(r, "hashes");
    ck_assert_int_eq(jint(r, "bytes"), (*m + 7) / 8);
    json_decref(r);
}

START_TEST(test_validation)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    json_t *q;

    json_t *r = h_callf(a, T_MS, "{s:s}", "op", "hello");
    ck_assert(h_ok(r));
    json_t *f = json_object_get(r, "features");
    bool named = false;
    for (size_t i = 0; i < json_array_size(f); i++) {
        const char *n = json_string_value(json_array_get(f, i));
        named = named || (n != NULL && strcmp(n, "bloom") == 0);
    }
    ck_assert_msg(named, "hello's features lack bloom");
    json_decref(r);

    bad(a,
        json_pack("{s:s,s:i,s:f}", "op", "bloom.create", "capacity", 10,
                  "error_rate", 0.01),
        "filter");
    bad(a, create_q("", 10, 0.01), "filter");
    bad(a,
        json_pack("{s:s,s:s,s:f}", "op", "bloom.create", "filter", "v",
                  "error_rate", 0.01),
        "capacity");
    bad(a,
        json_pack("{s:s,s:s,s:i}", "op", "bloom.create", "filter", "v",
                  "capacity", 10),
        "error_rate");
    bad(a, create_q("v", 0, 0.01), "capacity");
    bad(a, create_q("v", 1000000001LL, 0.01), "capacity");
    bad(a, create_q("v", 10, 0.0), "error_rate");
    bad(a, create_q("v", 10, 0.5), "error_rate");
    bad(a, create_q("v", 10, 1e-10), "error_rate");
    bad(a, create_q("v", 10, -0.1), "error_rate");
    q = create_q("v", 10, 0.01);
    json_object_set_new(q, "error_rate", json_string("0.01"));
    bad(a, q, "error_rate");
    /* A billion keys at 1%: 9.6e9 bits, over 2^32. */
    bad(a, create_q("v", 1000000000LL, 0.01), "over the limit of 2^32");

    const char *one[] = {"k"};
    bad(a, json_pack("{s:s,s:[s]}", "op", "bloom.add", "keys", "k"), "filter");
    bad(a, json_pack("{s:s,s:s}", "op", "bloom.add", "filter", "v"), "keys");
    bad(a,
        json_pack("{s:s,s:s,s:[]}", "op", "bloom.check", "filter", "v",
                  "keys"),
        "keys");
    bad(a,
        json_pack("{s:s,s:s,s:[i]}", "op", "bloom.check", "filter", "v",
                  "keys", 5),
        "keys");
    bad(a,
        json_pack("{s:s,s:s,s:[s]}", "op", "bloom.add", "filter", "v", "keys",
                  ""),
        "keys");
    /* At most 1000 keys a request. */
    const char **many = calloc(1001, sizeof(*many));
    char(*names)[16] = calloc(1001, sizeof(*names));
    for (int i = 0; i < 1001; i++) {
        snprintf(names[i], sizeof(names[i]), "m%d", i);
        many[i] = names[i];
    }
    bad(a, bits_q("bloom.add", "v", many, 1001), "more than 1000");
    /* A filter that does not exist is no silent answer. */
    bad(a, bits_q("bloom.check", "nope", one, 1), "does not exist");
    bad(a, bits_q("bloom.add", "nope", one, 1), "does not exist");
    bad(a,
        json_pack("{s:s,s:s,s:s}", "op", "cache.get", "key", "k", "bloom",
                  "nope"),
        "does not exist");
    bad(a,
        json_pack("{s:s,s:s,s:s}", "op", "cache.get", "key", "k", "bloom", ""),
        "bloom");
    bad(a,
        json_pack("{s:s,s:s,s:i}", "op", "cache.get", "key", "k", "bloom", 3),
        "bloom");
    bad(a,
        json_pack("{s:s,s:[s],s:s}", "op", "cache.mget", "keys", "k", "bloom",
                  "v"),
        "cache.mget does not take it");
    /* Nothing of these reached Redis as a write. */
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{v}:bloom:p"), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{nope}:bloom"), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{k}"), 0);

    /* 1000 is allowed. */
    r = create(a, "v", 10000, 0.01);
    ck_assert_msg(h_ok(r), "%s", h_dump(r));
    json_decref(r);
    bool *out = calloc(1000, sizeof(*out));
    bools(bits_call(a, "bloom.add", "v", many, 1000), "added", 1000, out,
          "1000 keys");
    bools(bits_call(a, "bloom.check", "v", many, 1000), "maybe", 1000, out,
          "1000 keys");
    for (int i = 0; i < 1000; i++) {
        ck_assert_msg(out[i], "key %d added but ruled out", i);
    }
    free(out);
    free(many);
    free(names);
    h_close(a);
}
END_TEST

START_TEST(test_create_add_check)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    long long m, k, m2, k2;

    /* 1000 keys at 1%: m = ceil(1000 ln 100 / ln(2)^2), k = 7. */
    created(create(a, "f", 1000, 0.01), true, &m, &k, "create");
    ck_assert_int_eq(m, (long long)ceil(-1000 * log(0.01) / (M_LN2 * M_LN2)));
    ck_assert_int_eq(m, 9586);
    ck_assert_int_eq(k, 7);
    redisReply *p = h_redis_cmd(&R, "HGETALL leased:cache:{f}:bloom:p");
    ck_assert(p != NULL && p->type == REDIS_REPLY_ARRAY && p->elements == 10);
    freeReplyObject(p);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:cache:{f}:bloom:p m"), 9586);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:cache:{f}:bloom:p k"), 7);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:cache:{f}:bloom:p capacity"),
                     1000);
    ck_assert_int_eq(h_r_int(&R, "TTL leased:cache:{f}:bloom:p"), -1);
    /* Created again alike: nothing changes, created false. */
    created(create(a, "f", 1000, 0.01), false, &m2, &k2, "again");
    ck_assert_int_eq(m2, m);
    ck_assert_int_eq(k2, k);
    /* Other parameters: refused, naming those it has. */
    json_t *r = create(a, "f", 2000, 0.01);
    ck_assert_msg(!h_ok(r) && strcmp(h_errcode(r), "bad_request") == 0, "%s",
                  h_dump(r));
    ck_assert_msg(strstr(jmsg(r), "capacity 1000") != NULL &&
                      strstr(jmsg(r), "error_rate 0.01") != NULL &&
                      strstr(jmsg(r), "9586 bits") != NULL,
                  "%s", jmsg(r));
    json_decref(r);
    r = create(a, "f", 1000, 0.02);
    ck_assert_msg(!h_ok(r) && strstr(jmsg(r), "capacity 1000") != NULL, "%s",
                  h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:cache:{f}:bloom:p capacity"),
                     1000);

    const char *keys[] = {"alpha", "beta", "gamma"};
    bool out[4];
    bools(bits_call(a, "bloom.add", "f", keys, 3), "added", 3, out, "add");
    ck_assert(out[0] && out[1] && out[2]);
    /* The bits are where leased-protocol(7) says. */
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(bits_set("f", keys[i], (uint64_t)m, (unsigned)k),
                      "the bits of %s are not at the documented positions",
                      keys[i]);
    }
    ck_assert_msg(!bits_set("f", "delta", (uint64_t)m, (unsigned)k),
                  "delta's bits set");
    /* Added again: nothing new. */
    bools(bits_call(a, "bloom.add", "f", keys, 1), "added", 1, out, "again");
    ck_assert(!out[0]);
    const char *ask[] = {"alpha", "delta", "gamma", "beta"};
    bools(bits_call(a, "bloom.check", "f", ask, 4), "maybe", 4, out, "check");
    ck_assert(out[0] && !out[1] && out[2] && out[3]);
    /* Another daemon, which never saw the filter, reads the same. */
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct h_conn *b = h_connect_ok(&D2);
    bools(bits_call(b, "bloom.check", "f", ask, 4), "maybe", 4, out,
          "check on D2");
    ck_assert(out[0] && !out[1] && out[2] && out[3]);
    h_assert_stat(a, "bloom_added", 4, T_MS);
    h_assert_stat(a, "bloom_checked", 4, T_MS);
    h_assert_stat(a, "bloom_ruled_out", 1, T_MS);
    h_close(b);
    h_close(a);
}
END_TEST

#define FP_CAP 10000
#define FP_OTHERS 20000

/* Capacity 10000 at 1%, filled with 10000 keys: of 20000 keys never
 * added, under 2% may be in it; every added key may. */
START_TEST(test_false_positive_rate)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    long long m, k;
    created(create(a, "fp", FP_CAP, 0.01), true, &m, &k, "create");
    static char names[1000][24];
    const char *keys[1000];
    bool out[1000];
    for (int base = 0; base < FP_CAP; base += 1000) {
        for (int i = 0; i < 1000; i++) {
            snprintf(names[i], sizeof(names[i]), "user:%d", base + i);
            keys[i] = names[i];
        }
        bools(bits_call(a, "bloom.add", "fp", keys, 1000), "added", 1000, out,
              "add");
    }
    for (int base = 0; base < FP_CAP; base += 1000) {
        for (int i = 0; i < 1000; i++) {
            snprintf(names[i], sizeof(names[i]), "user:%d", base + i);
            keys[i] = names[i];
        }
        bools(bits_call(a, "bloom.check", "fp", keys, 1000), "maybe", 1000,
              out, "check added");
        for (int i = 0; i < 1000; i++) {
            ck_assert_msg(out[i], "%s was added and is ruled out", keys[i]);
        }
    }
    int maybe = 0;
    for (int base = 0; base < FP_OTHERS; base += 1000) {
        for (int i = 0; i < 1000; i++) {
            snprintf(names[i], sizeof(names[i]), "absent:%d", base + i);
            keys[i] = names[i];
        }
        bools(bits_call(a, "bloom.check", "fp", keys, 1000), "maybe", 1000,
              out, "check others");
        for (int i = 0; i < 1000; i++) {
            maybe += out[i];
        }
    }
    double rate = (double)maybe / FP_OTHERS;
    fprintf(stderr,
            "bloom false positives: %d of %d (%.4f) at capacity %d, "
            "error_rate 0.01, m %lld, k %lld\n",
            maybe, FP_OTHERS, rate, FP_CAP, m, k);
    ck_assert_msg(rate < 0.02, "false positive rate %.4f", rate);
    /* And it is a filter: it does let some through at full capacity. */
    ck_assert_msg(maybe > 0, "no false positive at all in %d", FP_OTHERS);
    h_close(a);
}
END_TEST

static json_t *
get_bloom(struct h_conn *c, const char *key, const char *f)
{
    return h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.get", "key", key,
                   "bloom", f);
}

/* A key the filter rules out is answered as a cached null, marked
 * "bloom":true: its entry is not read (a value written straight into
 * Redis under it is not returned) and no fill lease is taken. */
START_TEST(test_cache_get_bloom)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    long long m, k;
    created(create(a, "users", 100, 0.01), true, &m, &k, "create");
    const char *real[] = {"u:1"};
    bool out[1];
    bools(bits_call(a, "bloom.add", "users", real, 1), "added", 1, out, "add");

    /* Never added, but an entry is there: the filter's word wins, and
     * the entry is left as it was. */
    h_r_do(&R, "HSET leased:cache:{u:ghost} v secret");
    ck_assert_msg(!bits_set("users", "u:ghost", (uint64_t)m, (unsigned)k),
                  "u:ghost happens to be a false positive");
    json_t *r = get_bloom(a, "u:ghost", "users");
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") && jtrue(r, "bloom") &&
                      json_is_null(json_object_get(r, "value")) &&
                      json_object_get(r, "lease") == NULL,
                  "ruled out: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "HEXISTS leased:cache:{u:ghost} l"), 0);
    /* Absent: no entry is made for a lease. */
    r = get_bloom(a, "u:none", "users");
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") && jtrue(r, "bloom") &&
                      json_is_null(json_object_get(r, "value")),
                  "ruled out: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{u:none}"), 0);
    h_assert_stat(a, "cache_bloom_hits", 2, T_MS);
    h_assert_stat(a, "cache_leases_granted", 0, T_MS);
    h_assert_stat(a, "cache_hits", 0, T_MS);
    /* Without the filter the same get reads the entry. */
    r = h_callf(a, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "u:ghost");
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") &&
                      strcmp(jstr(r, "value"), "secret") == 0,
                  "plain get: %s", h_dump(r));
    json_decref(r);

    /* Maybe: the usual cache.get, a miss with the lease, a fill, a hit. */
    r = get_bloom(a, "u:1", "users");
    ck_assert_msg(h_ok(r) && !jtrue(r, "hit") && jstr(r, "lease") != NULL &&
                      json_object_get(r, "bloom") == NULL,
                  "maybe: %s", h_dump(r));
    char lease[128];
    snprintf(lease, sizeof lease, "%s", jstr(r, "lease"));
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", "u:1",
                "lease", lease, "value", "one");
    ck_assert_msg(h_ok(r), "fill: %s", h_dump(r));
    json_decref(r);
    r = get_bloom(a, "u:1", "users");
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") &&
                      strcmp(jstr(r, "value"), "one") == 0,
                  "hit: %s", h_dump(r));
    json_decref(r);
    /* A key added with a cached null: the null, not the filter's. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:n}", "op", "cache.set", "key", "u:2",
                "value");
    ck_assert_msg(h_ok(r), "set null: %s", h_dump(r));
    json_decref(r);
    real[0] = "u:2";
    bools(bits_call(a, "bloom.add", "users", real, 1), "added", 1, out, "add");
    r = get_bloom(a, "u:2", "users");
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") &&
                      json_is_null(json_object_get(r, "value")) &&
                      json_object_get(r, "bloom") == NULL,
                  "cached null: %s", h_dump(r));
    json_decref(r);
    h_assert_stat(a, "cache_bloom_hits", 2, T_MS);
    h_assert_stat(a, "cache_negative_hits", 1, T_MS);
    h_close(a);
}
END_TEST

/* The filter deleted and made again with other parameters by another
 * daemon, while D1 still holds the old ones: D1's next add and check
 * find out, and set and read the bits where the new parameters put
 * them. */
START_TEST(test_recreated)
{
    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct h_conn *a = h_connect_ok(&D1);
    struct h_conn *b = h_connect_ok(&D2);
    long long m1, k1, m2, k2;
    bool out[2];
    created(create(a, "re", 100, 0.01), true, &m1, &k1, "create");
    const char *x[] = {"x"}, *y[] = {"y"}, *xy[] = {"x", "y"};
    bools(bits_call(a, "bloom.add", "re", x, 1), "added", 1, out, "add x");
    bools(bits_call(a, "bloom.check", "re", x, 1), "maybe", 1, out, "x");
    ck_assert(out[0]);

    h_r_do(&R, "DEL leased:cache:{re}:bloom leased:cache:{re}:bloom:p");
    created(create(b, "re", 5000, 0.001), true, &m2, &k2, "create again");
    ck_assert_int_ne(m2, m1);
    ck_assert_int_ne(k2, k1);

    bools(bits_call(a, "bloom.add", "re", y, 1), "added", 1, out, "add y");
    ck_assert(out[0]);
    ck_assert_msg(bits_set("re", "y", (uint64_t)m2, (unsigned)k2),
                  "y's bits are not where the new parameters put them");
    ck_assert_int_le(h_r_int(&R, "STRLEN leased:cache:{re}:bloom"),
                     (m2 + 7) / 8);
    bools(bits_call(a, "bloom.check", "re", xy, 2), "maybe", 2, out, "x, y");
    ck_assert_msg(!out[0] && out[1], "x %d y %d", out[0], out[1]);

    /* Deleted under D1: its next check says so, then made again by D1
     * with the first parameters and used at once. */
    h_r_do(&R, "DEL leased:cache:{re}:bloom leased:cache:{re}:bloom:p");
    json_t *r = get_bloom(a, "y", "re");
    ck_assert_msg(!h_ok(r) && strcmp(h_errcode(r), "bad_request") == 0 &&
                      strstr(jmsg(r), "does not exist") != NULL,
                  "%s", h_dump(r));
    json_decref(r);
    h_r_do(&R, "HSET leased:cache:{re}:bloom:p m %lld k %lld scheme 1", m1,
           k1);
    r = get_bloom(a, "y", "re");
    ck_assert_msg(h_ok(r) && jtrue(r, "bloom"), "%s", h_dump(r));
    json_decref(r);
    h_close(b);
    h_close(a);
}
END_TEST

/* Data leased did not write under a filter's keys: wrong_type, and the
 * data is left as it was. */
START_TEST(test_wrong_type)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    const char *one[] = {"k"};
    long long m, k;

    h_r_do(&R, "SET leased:cache:{w1}:bloom:p hello");
    h_expect_code(bits_call(a, "bloom.check", "w1", one, 1), "wrong_type",
                  "a string for the parameters");
    h_expect_code(create(a, "w1", 10, 0.01), "wrong_type",
                  "create over a string");
    h_r_do(&R, "HSET leased:cache:{w2}:bloom:p a b");
    h_expect_code(bits_call(a, "bloom.add", "w2", one, 1), "wrong_type",
                  "a hash of other fields");
    h_expect_code(get_bloom(a, "k", "w2"), "wrong_type",
                  "cache.get, a hash of other fields");
    h_r_do(&R, "HSET leased:cache:{w5}:bloom:p m x k 3 scheme 1");
    h_expect_code(bits_call(a, "bloom.check", "w5", one, 1), "wrong_type",
                  "m not a number");

    created(create(a, "w3", 10, 0.01), true, &m, &k, "create w3");
    h_r_do(&R, "LPUSH leased:cache:{w3}:bloom a");
    h_expect_code(bits_call(a, "bloom.add", "w3", one, 1), "wrong_type",
                  "a list for the bitmap");
    h_expect_code(get_bloom(a, "k", "w3"), "wrong_type",
                  "cache.get, a list for the bitmap");
    ck_assert_int_eq(h_r_int(&R, "LLEN leased:cache:{w3}:bloom"), 1);

    /* A bitmap without parameters is not taken over. */
    h_r_do(&R, "SET leased:cache:{w4}:bloom junk");
    h_expect_code(create(a, "w4", 10, 0.01), "wrong_type",
                  "create over a bitmap");
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{w4}:bloom:p"), 0);
    h_close(a);
}
END_TEST

START_TEST(test_redis_down)
{
    char yaml[128];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    struct h_conn *a = h_connect_ok(&D1);
    long long m, k;
    const char *one[] = {"k"};
    created(create(a, "d", 10, 0.01), true, &m, &k, "create");

    h_r_do(&R, "CONFIG SET min-replicas-to-write 1");
    h_expect_code(create(a, "d2", 10, 0.01), "redis_unavailable",
                  "create, writes refused");
    h_expect_code(bits_call(a, "bloom.add", "d", one, 1), "redis_unavailable",
                  "add, writes refused");
    h_r_do(&R, "CONFIG SET min-replicas-to-write 0");

    h_redis_kill(&R);
    h_expect_code(create(a, "d", 10, 0.01), "redis_unavailable", "create");
    h_expect_code(bits_call(a, "bloom.add", "d", one, 1), "redis_unavailable",
                  "add");
    h_expect_code(bits_call(a, "bloom.check", "d", one, 1),
                  "redis_unavailable", "check");
    h_expect_code(get_bloom(a, "k", "d"), "redis_unavailable", "cache.get");
    h_close(a);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(validation, 30),          H_CASE(create_add_check, 30),
        H_CASE(false_positive_rate, 60), H_CASE(cache_get_bloom, 30),
        H_CASE(recreated, 30),           H_CASE(wrong_type, 30),
        H_CASE(redis_down, 30),
    };
    return H_MAIN(fx, cases);
}
