/* Stale-while-revalidate and early refresh against real leased daemons
 * and a real redis-server: cache.invalidate "stale" marks instead of
 * deleting, readers in every daemon get the old value at once and exactly
 * one of them the lease to reload it, older leases stay void, a stale
 * entry ends after cache.stale_ms, the delayed second step marks again,
 * and the journal keeps the promise across kill -9; with
 * cache.early_refresh one reader reloads a hot entry before it expires
 * and nobody sees it miss. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define T_MS 5000
#define PREFIX "leased:cache:"

static struct h_redis R;
static struct h_daemon D;

/* Whether the entry of KEY has FIELD, in either layout. */
static int
has_field(const char *key, char field)
{
    char name[256], buf[64];
    snprintf(name, sizeof name, PREFIX "{%s}", key);
    return h_entry_field(&R, name, field, buf, sizeof buf) ? 1 : 0;
}

/* KEY's entry holds a value or a null alone: a hash, or under
 * cache.layout 2 a string. */
static void
expect_entry_type(const char *key)
{
    char name[256];
    snprintf(name, sizeof name, PREFIX "{%s}", key);
    h_assert_type(&R, name, H_CACHE_ENTRY_TYPE);
}

/* FIELD of the entry of KEY as a number, -1 when it has none. */
static long long
field_int(const char *key, char field)
{
    char name[256], buf[64];
    snprintf(name, sizeof name, PREFIX "{%s}", key);
    return h_entry_field(&R, name, field, buf, sizeof buf) ? atoll(buf) : -1;
}
static struct h_daemon D2;
static const struct h_fixture fx = {
    .suite = "stale",
    .redis = {&R},
    .daemons = {&D, &D2},
};

/* --- helpers ------------------------------------------------------------ */

static void
sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static json_t *
get(struct h_conn *c, const char *key)
{
    return h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", key);
}

static bool
fill(struct h_conn *c, const char *key, const char *lease, const char *value)
{
    json_t *r = h_must(h_callf(c, T_MS, "{s:s,s:s,s:s,s:s}", "op",
                               "cache.fill", "key", key, "lease", lease,
                               "value", value));
    bool stored = jtrue(r, "stored");
    json_decref(r);
    return stored;
}

static void
set_value(struct h_conn *c, const char *key, const char *value)
{
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", key, "value", value)));
}

static json_t *
invalidate_stale(struct h_conn *c, const char *key, long long delay)
{
    return h_callf(c, T_MS, "{s:s,s:s,s:I,s:b}", "op", "cache.invalidate",
                   "key", key, "delay_ms", (json_int_t)delay, "stale", 1);
}

/* A stale hit with VALUE; returns its lease (copied) or NULL. */
static char *
expect_stale(json_t *r, const char *value)
{
    h_must(r);
    ck_assert_msg(jtrue(r, "hit") && jtrue(r, "stale") &&
                      jstr(r, "value") != NULL &&
                      strcmp(jstr(r, "value"), value) == 0,
                  "expected stale \"%s\", got %s", value, h_dump(r));
    const char *l = jstr(r, "lease");
    ck_assert_msg(l == NULL || h_is_token(l), "bad lease in %s", h_dump(r));
    char *lease = l != NULL ? strdup(l) : NULL;
    json_decref(r);
    return lease;
}

static void
expect_fresh(json_t *r, const char *value)
{
    h_must(r);
    ck_assert_msg(jtrue(r, "hit") && json_object_get(r, "stale") == NULL &&
                      json_object_get(r, "lease") == NULL &&
                      jstr(r, "value") != NULL &&
                      strcmp(jstr(r, "value"), value) == 0,
                  "expected a plain hit \"%s\", got %s", value, h_dump(r));
    json_decref(r);
}

static char *
expect_miss_lease(json_t *r)
{
    h_must(r);
    ck_assert_msg(!jtrue(r, "hit") && h_is_token(jstr(r, "lease")),
                  "expected a miss with a lease, got %s", h_dump(r));
    char *lease = strdup(jstr(r, "lease"));
    json_decref(r);
    return lease;
}

static void
expect_marked(json_t *r, long long pending)
{
    h_must(r);
    ck_assert_msg(jint(r, "deleted") == 0 && jint(r, "stale") == 1 &&
                      jint(r, "pending") == pending,
                  "expected deleted 0, stale 1, pending %lld; got %s", pending,
                  h_dump(r));
    json_decref(r);
}

static long long
stats_sum(struct h_conn *a, struct h_conn *b, const char *name)
{
    return h_stat(a, name) + (b != NULL ? h_stat(b, name) : 0);
}

/* --- the hot key after a write ------------------------------------------ */

START_TEST(test_readers_two_daemons)
{
    enum { N = 40 };
    struct h_conn *c[N];
    json_t *got[N] = {0};

    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct h_conn *s1 = h_connect_ok(&D);
    struct h_conn *s2 = h_connect_ok(&D2);
    set_value(s1, "hot", "old");
    expect_marked(invalidate_stale(s1, "hot", 0), 0);

    for (int i = 0; i < N; i++) {
        c[i] = h_connect_ok(i % 2 ? &D2 : &D);
    }
    /* Everybody asks at once, willing to wait long: nobody has to. */
    long long t0 = h_now_ms();
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(h_send(c[i], "{s:I,s:s,s:s,s:I}", "id", (json_int_t)1,
                                "op", "cache.get", "key", "hot", "wait_ms",
                                (json_int_t)30000),
                         0);
    }
    int leases = 0, holder = -1;
    for (int i = 0; i < N; i++) {
        got[i] = h_recv(c[i], T_MS);
        ck_assert_msg(got[i] != NULL, "reader %d got no answer", i);
        char *l = expect_stale(json_incref(got[i]), "old");
        if (l != NULL) {
            leases++;
            holder = i;
            free(l);
        }
    }
    long long took = h_now_ms() - t0;
    ck_assert_int_eq(leases, 1);
    /* Well below any wait: the answers came from Redis at once. */
    ck_assert_msg(took < 4000, "answers took %lld ms", took);
    ck_assert_int_eq(stats_sum(s1, s2, "cache_waits"), 0);
    ck_assert_int_eq(stats_sum(s1, s2, "cache_leases_granted"), 1);
    ck_assert_int_eq(stats_sum(s1, s2, "cache_stale_hits"), N);

    /* More readers while the reload runs: still the old value, no lease,
     * no waiting. */
    for (int i = 0; i < N; i += 7) {
        char *l = expect_stale(get(c[i], "hot"), "old");
        ck_assert_ptr_null(l);
    }
    /* The reload lands; from then on everybody reads the new value. */
    ck_assert(fill(c[holder], "hot", jstr(got[holder], "lease"), "new"));
    /* The reload leaves the entry as any fill does (its lease gone). */
    expect_entry_type("hot");
    for (int i = 0; i < N; i++) {
        expect_fresh(get(c[i], "hot"), "new");
        json_decref(got[i]);
        h_close(c[i]);
    }
    ck_assert_int_eq(has_field("hot", 's'), 0);
    h_close(s1);
    h_close(s2);
}
END_TEST

/* The mark's reply, the config default and the per-request override. */
START_TEST(test_mode_and_reply)
{
    h_start("cache:\n  invalidate_mode: stale\n");
    struct h_conn *a = h_connect_ok(&D);
    set_value(a, "m", "old");
    /* cache.invalidate_mode: stale makes it the default. */
    json_t *r = h_must(
        h_callf(a, T_MS, "{s:s,s:s}", "op", "cache.invalidate", "key", "m"));
    expect_marked(r, 1);
    char *l = expect_stale(get(a, "m"), "old");
    ck_assert_ptr_nonnull(l);
    free(l);
    /* "stale": false deletes as before, with the reply of a delete. */
    r = h_must(h_callf(a, T_MS, "{s:s,s:s,s:b,s:I}", "op", "cache.invalidate",
                       "key", "m", "stale", 0, "delay_ms", (json_int_t)0));
    ck_assert_msg(jint(r, "deleted") == 1 &&
                      json_object_get(r, "stale") == NULL,
                  "delete reply %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS " PREFIX "{m}"), 0);
    /* Nothing cached: nothing to mark; keys counted per outcome. */
    set_value(a, "k1", "v1");
    r = h_must(h_callf(a, T_MS, "{s:s,s:[s,s],s:I}", "op", "cache.invalidate",
                       "keys", "k1", "nothing", "delay_ms", (json_int_t)0));
    ck_assert_msg(jint(r, "deleted") == 0 && jint(r, "stale") == 1 &&
                      jint(r, "pending") == 0,
                  "reply %s", h_dump(r));
    json_decref(r);
    /* A cached "not found" is dropped, not kept stale: there is no old
     * value worth serving. */
    char *nl = expect_miss_lease(get(a, "nf"));
    json_decref(
        h_must(h_callf(a, T_MS, "{s:s,s:s,s:s,s:n}", "op", "cache.fill", "key",
                       "nf", "lease", nl, "value")));
    free(nl);
    r = h_must(invalidate_stale(a, "nf", 0));
    ck_assert_msg(jint(r, "deleted") == 1 && jint(r, "stale") == 0, "reply %s",
                  h_dump(r));
    json_decref(r);
    /* Malformed. */
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "cache.invalidate",
                          "key", "m", "stale", "yes"),
                  "bad_request", "stale as a string");
    /* hello offers the feature. */
    r = h_must(h_callf(a, T_MS, "{s:s}", "op", "hello"));
    json_t *f = json_object_get(r, "features");
    bool found = false;
    for (size_t i = 0; i < json_array_size(f); i++) {
        found = found ||
                strcmp(json_string_value(json_array_get(f, i)), "stale") == 0;
    }
    ck_assert_msg(found, "features %s", h_dump(f));
    json_decref(r);
    h_close(a);
}
END_TEST

/* --- leases -------------------------------------------------------------- */

START_TEST(test_old_leases_rejected)
{
    h_start("cache:\n  fill_lease_ms: 300\n");
    struct h_conn *a = h_connect_ok(&D);
    struct h_conn *b = h_connect_ok(&D);

    /* A lease from a miss, before the write: void after the mark. */
    char *l0 = expect_miss_lease(get(a, "k"));
    json_decref(h_must(invalidate_stale(b, "k", 0)));
    ck_assert(!fill(a, "k", l0, "from before"));
    free(l0);

    /* A lease on the stale entry, then another write: void too. */
    set_value(a, "k", "v1");
    json_decref(h_must(invalidate_stale(b, "k", 0)));
    char *l1 = expect_stale(get(a, "k"), "v1");
    ck_assert_ptr_nonnull(l1);
    expect_marked(invalidate_stale(b, "k", 0), 0);
    ck_assert(!fill(a, "k", l1, "loaded before the second write"));
    free(l1);
    /* The next reader gets a new lease, and its fill counts. */
    char *l2 = expect_stale(get(b, "k"), "v1");
    ck_assert_ptr_nonnull(l2);

    /* Released: the next reader gets a lease at once. */
    json_t *r = h_must(h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "cache.release",
                               "key", "k", "lease", l2));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    free(l2);
    char *l3 = expect_stale(get(a, "k"), "v1");
    ck_assert_ptr_nonnull(l3);
    /* Not filled within fill_lease_ms: given to the next reader. */
    char *none = expect_stale(get(b, "k"), "v1");
    ck_assert_ptr_null(none);
    sleep_ms(350);
    char *l4 = expect_stale(get(b, "k"), "v1");
    ck_assert_ptr_nonnull(l4);
    ck_assert(!fill(a, "k", l3, "too late"));
    ck_assert(fill(b, "k", l4, "v2"));
    expect_fresh(get(a, "k"), "v2");
    free(l3);
    free(l4);

    /* A plain read never takes the lease. */
    json_decref(h_must(invalidate_stale(b, "k", 0)));
    r = h_must(h_callf(a, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key", "k",
                       "lease", 0));
    char *lp = expect_stale(r, "v2");
    ck_assert_ptr_null(lp);
    char *l5 = expect_stale(get(b, "k"), "v2");
    ck_assert_ptr_nonnull(l5);
    free(l5);

    /* cache.set replaces a stale entry outright. */
    set_value(a, "k", "set");
    expect_fresh(get(b, "k"), "set");
    h_close(a);
    h_close(b);
}
END_TEST

/* --- time: stale_ms, the second step ------------------------------------ */

struct miss_arg {
    struct h_conn *c;
};

static bool
plain_miss(void *arg)
{
    struct miss_arg *m = arg;
    json_t *r = h_callf(m->c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        "short", "lease", 0);
    bool miss = h_ok(r) && !jtrue(r, "hit");
    json_decref(r);
    return miss;
}

START_TEST(test_stale_ms_ends_it)
{
    h_start("cache:\n  stale_ms: 400\n");
    struct h_conn *a = h_connect_ok(&D);
    set_value(a, "short", "old");
    long long t0 = h_now_ms();
    json_decref(h_must(invalidate_stale(a, "short", 0)));
    long long pttl = h_r_int(&R, "PTTL " PREFIX "{short}");
    ck_assert_msg(pttl > 0 && pttl <= 400, "pttl %lld", pttl);
    char *l = expect_stale(h_callf(a, T_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                                   "key", "short", "lease", 0),
                           "old");
    ck_assert_ptr_null(l);
    struct miss_arg m = {a};
    ck_assert(h_wait_until(plain_miss, &m, 5000));
    ck_assert_int_ge(h_now_ms() - t0, 350);
    /* Then it is an ordinary miss. */
    char *ml = expect_miss_lease(get(a, "short"));
    free(ml);

    /* A mark never lengthens a shorter TTL. */
    json_decref(
        h_must(h_callf(a, T_MS, "{s:s,s:s,s:s,s:I}", "op", "cache.set", "key",
                       "fleeting", "value", "x", "ttl_ms", (json_int_t)150)));
    json_decref(h_must(invalidate_stale(a, "fleeting", 0)));
    pttl = h_r_int(&R, "PTTL " PREFIX "{fleeting}");
    /* Gone already (-2), or going within its TTL: never kept for good. */
    ck_assert_msg(pttl == -2 || (pttl > 0 && pttl <= 200), "pttl %lld", pttl);
    h_close(a);
}
END_TEST

struct marked_arg {
    const char *key;
};

static bool
is_marked(void *arg)
{
    return has_field(((struct marked_arg *)arg)->key, 's');
}

START_TEST(test_second_step_marks_again)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D);
    set_value(a, "dd", "old");
    expect_marked(invalidate_stale(a, "dd", 600), 1);
    /* A reload that raced the database write lands before the second
     * step... */
    char *l = expect_stale(get(a, "dd"), "old");
    ck_assert_ptr_nonnull(l);
    ck_assert(fill(a, "dd", l, "raced"));
    free(l);
    expect_fresh(get(a, "dd"), "raced");
    /* ...and the second step marks it stale again, so it is reloaded. */
    struct marked_arg m = {"dd"};
    ck_assert(h_wait_until(is_marked, &m, 5000));
    l = expect_stale(get(a, "dd"), "raced");
    ck_assert_ptr_nonnull(l);
    ck_assert(fill(a, "dd", l, "final"));
    free(l);
    expect_fresh(get(a, "dd"), "final");
    h_assert_stat(a, "cache_invalidations_pending", 0, T_MS);
    h_close(a);
}
END_TEST

/* --- durability ---------------------------------------------------------- */

START_TEST(test_journal_kill9)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D);
    set_value(a, "dur", "old");
    expect_marked(invalidate_stale(a, "dur", 3000), 1);
    /* Acknowledged; the daemon dies before the second step. */
    h_daemon_kill(&D);
    h_close(a);
    /* A reload lands meanwhile (written as leased writes an entry). */
    h_r_do(&R, "DEL " PREFIX "{dur}");
    h_r_do(&R, "HSET " PREFIX "{dur} v raced");
    h_r_do(&R, "PEXPIRE " PREFIX "{dur} 600000");

    ck_assert_int_eq(h_daemon_restart(&D), 0);
    /* The replayed second step marks (does not delete) the entry. */
    struct marked_arg m = {"dur"};
    ck_assert(h_wait_until(is_marked, &m, 15000));
    a = h_connect_ok(&D);
    char *l = expect_stale(get(a, "dur"), "raced");
    ck_assert_ptr_nonnull(l);
    free(l);
    h_assert_stat(a, "cache_invalidations_pending", 0, T_MS);
    h_close(a);
}
END_TEST

START_TEST(test_redis_down_queued)
{
    /* A Redis that keeps its data across the outage. */
    ck_assert_int_eq(h_redis_start(&R,
                                   "--appendonly yes --appendfsync always"),
                     0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NULL), 0);
    struct h_conn *a = h_connect_ok(&D);
    set_value(a, "q", "old");
    h_redis_kill(&R);
    json_t *r = h_must(invalidate_stale(a, "q", 0));
    ck_assert_msg(jtrue(r, "queued") && jint(r, "pending") == 1, "reply %s",
                  h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    /* Retried until Redis takes it: the entry is marked, not deleted. */
    struct marked_arg m = {"q"};
    ck_assert(h_wait_until(is_marked, &m, 15000));
    /* Until the daemon has its answer the mark is owed, and reads are
     * misses without a lease. */
    h_assert_stat(a, "cache_invalidations_pending", 0, 15000);
    char *l = expect_stale(get(a, "q"), "old");
    ck_assert_ptr_nonnull(l);
    free(l);
    h_close(a);
}
END_TEST

/* --- cache.mget ----------------------------------------------------------- */

START_TEST(test_mget)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D);
    set_value(a, "m1", "one");
    set_value(a, "m2", "two");
    json_decref(h_must(invalidate_stale(a, "m1", 0)));
    json_t *r2;
    json_t *r = h_must(h_callf(a, T_MS, "{s:s,s:[s,s,s]}", "op", "cache.mget",
                               "keys", "m1", "m2", "m1"));
    json_t *res = json_object_get(r, "results");
    ck_assert_int_eq(json_array_size(res), 3);
    char *l = expect_stale(json_incref(json_array_get(res, 0)), "one");
    ck_assert_ptr_nonnull(l);
    free(l);
    expect_fresh(json_incref(json_array_get(res, 1)), "two");
    /* The repeated key: the same answer, but the lease is the first's. */
    l = expect_stale(json_incref(json_array_get(res, 2)), "one");
    ck_assert_ptr_null(l);
    /* A lease held elsewhere: every place the same stale value. */
    r2 = h_must(h_callf(a, T_MS, "{s:s,s:[s,s]}", "op", "cache.mget", "keys",
                        "m1", "m1"));
    res = json_object_get(r2, "results");
    for (size_t i = 0; i < 2; i++) {
        l = expect_stale(json_incref(json_array_get(res, i)), "one");
        ck_assert_ptr_null(l);
    }
    json_decref(r2);
    json_decref(r);
    h_close(a);
}
END_TEST

/* --- early refresh ------------------------------------------------------ */

#define EARLY_YAML                                                            \
    "cache:\n  early_refresh: true\n  early_refresh_beta: 1\n"                \
    "  ttl_jitter: 0\n  fill_lease_ms: 2000\n"
#define READERS 8
#define HOT_TTL_MS 6000

static bool
has_feature(struct h_conn *c, const char *name)
{
    json_t *r = h_must(h_callf(c, T_MS, "{s:s}", "op", "hello"));
    json_t *f = json_object_get(r, "features");
    bool found = false;
    for (size_t i = 0; i < json_array_size(f); i++) {
        found = found ||
                strcmp(json_string_value(json_array_get(f, i)), name) == 0;
    }
    json_decref(r);
    return found;
}

/* Load KEY under a lease that is held LOAD_MS before the fill. */
static void
load(struct h_conn *c, const char *key, long load_ms, long long ttl_ms)
{
    char *l = expect_miss_lease(get(c, key));
    sleep_ms(load_ms);
    json_t *r = h_must(h_callf(c, T_MS, "{s:s,s:s,s:s,s:s,s:I}", "op",
                               "cache.fill", "key", key, "lease", l, "value",
                               "v1", "ttl_ms", (json_int_t)ttl_ms));
    ck_assert(jtrue(r, "stored"));
    json_decref(r);
    free(l);
}

/* One round: every reader reads KEY once, all in flight together. Counts
 * the refresh leases into *REFRESHES (the first one's lease into LEASE,
 * its reader into *WHO) and fails on anything but a hit. */
static void
round_of_reads(struct h_conn **c, const char *key, int *refreshes, char *lease,
               size_t lease_len, int *who)
{
    for (int i = 0; i < READERS; i++) {
        ck_assert_int_eq(h_send(c[i], "{s:I,s:s,s:s}", "id", (json_int_t)7,
                                "op", "cache.get", "key", key),
                         0);
    }
    for (int i = 0; i < READERS; i++) {
        json_t *r = h_recv(c[i], T_MS);
        h_must(r);
        ck_assert_msg(jtrue(r, "hit") && jstr(r, "value") != NULL,
                      "reader %d of %s saw a miss: %s", i, key, h_dump(r));
        if (jstr(r, "refresh") != NULL) {
            ck_assert(h_is_token(jstr(r, "refresh")));
            if (*refreshes == 0) {
                snprintf(lease, lease_len, "%s", jstr(r, "refresh"));
                *who = i;
            }
            (*refreshes)++;
        }
        json_decref(r);
    }
}

START_TEST(test_early_refresh)
{
    struct h_conn *c[READERS];
    char lease[64] = "";
    int who = -1;

    h_start(EARLY_YAML);
    ck_assert_int_eq(h_daemon_start(&D2, &R, EARLY_YAML), 0);
    for (int i = 0; i < READERS; i++) {
        c[i] = h_connect_ok(i % 2 ? &D2 : &D);
    }
    ck_assert(has_feature(c[0], "early_refresh"));
    ck_assert(has_feature(c[1], "early_refresh"));

    /* A hot key whose load took about 100 ms, a warm one far from its
     * expiry, and one written by cache.set (no load time known). */
    load(c[0], "hot", 100, HOT_TTL_MS);
    load(c[1], "warm", 100, 600000);
    json_decref(h_must(h_callf(c[0], T_MS, "{s:s,s:s,s:s,s:I}", "op",
                               "cache.set", "key", "set", "value", "s",
                               "ttl_ms", (json_int_t)HOT_TTL_MS + 700)));
    long long d = field_int("hot", 'd');
    ck_assert_msg(d >= 90 && d < HOT_TTL_MS / 20, "load time %lld", d);
    expect_entry_type("hot");
    ck_assert_int_eq(has_field("set", 'd'), 0);

    /* Far from expiry nobody refreshes: each read would with probability
     * exp(-ttl_left / d), below 1e-5 while ttl_left > 12 d. */
    int refreshes = 0, dummy = -1;
    char scratch[64];
    for (int k = 0; k < 20; k++) {
        if (h_r_int(&R, "PTTL " PREFIX "{hot}") > 12 * d) {
            round_of_reads(c, "hot", &refreshes, scratch, sizeof scratch,
                           &dummy);
        }
        round_of_reads(c, "warm", &refreshes, scratch, sizeof scratch, &dummy);
        round_of_reads(c, "set", &refreshes, scratch, sizeof scratch, &dummy);
    }
    ck_assert_int_eq(refreshes, 0);

    /* Near expiry: rounds of reads until past the original expiry. One
     * reader gets the refresh lease and takes 200 ms to load; meanwhile
     * everybody reads on (hits, no second lease), then its fill makes the
     * entry far from expiry again. Nobody ever misses. */
    long long pttl = h_r_int(&R, "PTTL " PREFIX "{hot}");
    ck_assert_msg(pttl > 1500, "pttl %lld", pttl);
    sleep_ms(pttl - 1500);
    long long end = h_now_ms() + 1500 + 600;
    long long filled_at = 0, leased_at = 0;
    int set_refreshes = 0;
    while (h_now_ms() < end) {
        round_of_reads(c, "hot", &refreshes, lease, sizeof lease, &who);
        if (refreshes > 0 && leased_at == 0) {
            leased_at = h_now_ms();
        }
        if (leased_at != 0 && filled_at == 0 &&
            h_now_ms() - leased_at >= 200) {
            json_t *r = h_must(h_callf(c[who], T_MS, "{s:s,s:s,s:s,s:s,s:I}",
                                       "op", "cache.fill", "key", "hot",
                                       "lease", lease, "value", "v2", "ttl_ms",
                                       (json_int_t)HOT_TTL_MS));
            ck_assert_msg(jtrue(r, "stored"), "refresh fill %s", h_dump(r));
            json_decref(r);
            filled_at = h_now_ms();
        }
        /* Close to its expiry too, yet never refreshed: no load time. */
        if (h_r_int(&R, "PTTL " PREFIX "{set}") > 50) {
            round_of_reads(c, "set", &set_refreshes, scratch, sizeof scratch,
                           &dummy);
        }
        sleep_ms(2);
    }
    ck_assert_int_eq(refreshes, 1);
    ck_assert_int_eq(set_refreshes, 0);
    ck_assert_msg(filled_at != 0, "the refresh lease came too late to fill");
    ck_assert_int_eq(h_stat(c[0], "cache_refreshes_granted") +
                         h_stat(c[1], "cache_refreshes_granted"),
                     1);
    json_t *r = h_must(get(c[2], "hot"));
    ck_assert_str_eq(jstr(r, "value"), "v2");
    json_decref(r);
    /* The refreshed load was measured too. */
    ck_assert_int_ge(field_int("hot", 'd'), 190);
    expect_entry_type("hot");
    for (int i = 0; i < READERS; i++) {
        h_close(c[i]);
    }
}
END_TEST

/* A read that may get a refresh lease: with beta 1000 and a load of at
 * least 300 ms, each read asks for one with probability above 0.99 while
 * the entry has under 3 s to live; a few tries make it certain. */
static char *
refresh_lease(struct h_conn *a, const char *key)
{
    for (int i = 0; i < 20; i++) {
        json_t *r = h_must(get(a, key));
        if (jstr(r, "refresh") != NULL) {
            char *l = strdup(jstr(r, "refresh"));
            json_decref(r);
            return l;
        }
        json_decref(r);
    }
    ck_abort_msg("no refresh lease in 20 reads of %s", key);
    return NULL;
}

/* A refresh lease is a lease like another: voided by a write, given again
 * when not used in time; a plain read never takes one. Off by default. */
START_TEST(test_early_refresh_leases)
{
    h_start("cache:\n  early_refresh: true\n  early_refresh_beta: 1000\n"
            "  fill_lease_ms: 600\n");
    struct h_conn *a = h_connect_ok(&D);
    load(a, "k2", 20, 600000);
    load(a, "k", 300, 3000);
    for (int i = 0; i < 5; i++) {
        json_t *r = h_must(h_callf(a, T_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                                   "key", "k", "lease", 0));
        ck_assert_msg(jstr(r, "refresh") == NULL, "plain read %s", h_dump(r));
        json_decref(r);
    }
    char *l1 = refresh_lease(a, "k");
    /* Outstanding: nobody else gets one. */
    for (int i = 0; i < 5; i++) {
        json_t *r = h_must(get(a, "k"));
        ck_assert_msg(jstr(r, "refresh") == NULL, "second lease %s",
                      h_dump(r));
        json_decref(r);
    }
    /* Not used in fill_lease_ms: a later reader gets a new one. */
    sleep_ms(650);
    char *l2 = refresh_lease(a, "k");
    ck_assert(!fill(a, "k", l1, "late"));
    /* A write voids it. */
    json_decref(h_must(invalidate_stale(a, "k", 0)));
    ck_assert(!fill(a, "k", l2, "before the write"));
    free(l1);
    free(l2);
    /* cache.set entries are never refreshed early. */
    json_decref(
        h_must(h_callf(a, T_MS, "{s:s,s:s,s:s,s:I}", "op", "cache.set", "key",
                       "s", "value", "x", "ttl_ms", (json_int_t)2000)));
    for (int i = 0; i < 10; i++) {
        json_t *r = h_must(get(a, "s"));
        ck_assert_msg(jstr(r, "refresh") == NULL, "%s", h_dump(r));
        json_decref(r);
    }
    h_close(a);

    /* Off: no load time is kept, no refresh, no feature. */
    h_daemon_stop(&D);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct h_conn *b = h_connect_ok(&D2);
    ck_assert(!has_feature(b, "early_refresh"));
    load(b, "off", 20, 600000);
    ck_assert_int_eq(has_field("off", 'd'), 0);
    ck_assert_int_eq(has_field("off", 'g'), 0);
    expect_fresh(get(b, "off"), "v1");
    /* An entry with a load time from a daemon that had it on is read
     * as a plain hit. */
    ck_assert_int_eq(has_field("k2", 'd'), 1);
    expect_fresh(get(b, "k2"), "v1");
    h_close(b);
}
END_TEST

/* cache.mget under early refresh: entries with a load time, far from
 * their expiry, are plain hits (under cache.layout 2 one MGET reads them,
 * and a reader that may refresh has the script decide for each). */
START_TEST(test_early_refresh_mget)
{
    h_start(EARLY_YAML);
    struct h_conn *c = h_connect_ok(&D);
    load(c, "ma", 20, 600000);
    load(c, "mb", 20, 600000);
    ck_assert_int_ge(field_int("ma", 'd'), 0);
    json_t *r = h_must(h_callf(c, T_MS, "{s:s,s:[s,s,s]}", "op", "cache.mget",
                               "keys", "ma", "mb", "mc"));
    json_t *res = json_object_get(r, "results");
    for (size_t i = 0; i < 2; i++) {
        json_t *e = json_array_get(res, i);
        ck_assert_msg(jtrue(e, "hit") && jstr(e, "value") != NULL &&
                          strcmp(jstr(e, "value"), "v1") == 0 &&
                          json_object_get(e, "lease") == NULL,
                      "slot %zu: %s", i, h_dump(r));
    }
    ck_assert_msg(h_is_token(jstr(json_array_get(res, 2), "lease")),
                  "the absent key's lease: %s", h_dump(r));
    json_decref(r);
    expect_entry_type("ma");
    expect_entry_type("mb");
    h_close(c);
}
END_TEST

/* A refresh lease filled with "not found" leaves the value it was to
 * refresh: a null never replaces a real value. */
START_TEST(test_refresh_null_keeps_value)
{
    h_start("cache:\n  early_refresh: true\n  early_refresh_beta: 1000\n"
            "  fill_lease_ms: 600\n");
    struct h_conn *a = h_connect_ok(&D);
    load(a, "kn", 300, 3000);
    char *l = refresh_lease(a, "kn");
    json_t *r = h_must(h_callf(a, T_MS, "{s:s,s:s,s:s,s:n}", "op",
                               "cache.fill", "key", "kn", "lease", l,
                               "value"));
    ck_assert_msg(json_is_false(json_object_get(r, "stored")),
                  "null fill under a refresh lease: %s", h_dump(r));
    json_decref(r);
    free(l);
    ck_assert_int_eq(has_field("kn", 'n'), 0);
    r = h_must(h_callf(a, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                       "kn", "lease", 0));
    ck_assert_msg(jtrue(r, "hit") && jstr(r, "value") != NULL &&
                      strcmp(jstr(r, "value"), "v1") == 0,
                  "value after the null fill: %s", h_dump(r));
    json_decref(r);
    h_close(a);
}
END_TEST

/* cache.invalidate_mode and cache.early_refresh change on SIGHUP. */
START_TEST(test_reload)
{
    h_start("cache:\n  invalidate_mode: delete\n  early_refresh: false\n");
    struct h_conn *a = h_connect_ok(&D);
    ck_assert(!has_feature(a, "early_refresh"));
    char cmd[800];
    snprintf(cmd, sizeof cmd,
             "sed -i -e 's/invalidate_mode: delete/invalidate_mode: stale/' "
             "-e 's/early_refresh: false/early_refresh: true/' '%s'",
             D.conf);
    ck_assert_int_eq(system(cmd), 0);
    h_daemon_signal(&D, SIGHUP);
    bool on = false;
    for (int i = 0; i < 200 && !on; i++) {
        on = has_feature(a, "early_refresh");
        if (!on) {
            sleep_ms(10);
        }
    }
    ck_assert_msg(on, "reload did not turn early refresh on");
    set_value(a, "r", "old");
    json_t *r = h_must(h_callf(a, T_MS, "{s:s,s:s,s:I}", "op",
                               "cache.invalidate", "key", "r", "delay_ms",
                               (json_int_t)0));
    expect_marked(r, 0);
    h_close(a);
}
END_TEST

/* The keys are validated, with the line of the mistake. */
START_TEST(test_config_errors)
{
    static const struct {
        const char *yaml, *want;
    } bad[] = {
        {"cache:\n  invalidate_mode: bogus\n",
         ":2:20: cache.invalidate_mode: must be one of delete, stale"},
        {"cache:\n  stale_ms: 0\n", ":2:13: cache.stale_ms: must be"},
        {"cache:\n  hot_keys: 10001\n", ":2:13: cache.hot_keys: must be"},
        {"cache:\n  early_refresh: maybe\n", ":2:18: cache.early_refresh:"},
        {"cache:\n  early_refresh_beta: 1001\n",
         ":2:23: cache.early_refresh_beta: must be"},
    };
    char dir[256], path[300], out[4096], err[4096];
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/leased.yml", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fputs(bad[i].yaml, f);
        fclose(f);
        const char *argv[] = {h_leased_bin(), "-t", "-c", path, NULL};
        int rc = h_run(argv, out, sizeof out, err, sizeof err, T_MS);
        ck_assert_msg(rc != 0 && strstr(err, bad[i].want) != NULL,
                      "%s: exit %d, stderr: %s", bad[i].yaml, rc, err);
    }
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("cache:\n  invalidate_mode: stale\n  stale_ms: 1\n"
          "  hot_keys: 0\n",
          f);
    fclose(f);
    const char *argv[] = {h_leased_bin(), "-t", "-c", path, NULL};
    ck_assert_int_eq(h_run(argv, out, sizeof out, err, sizeof err, T_MS), 0);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(readers_two_daemons, 60),
        H_CASE(mode_and_reply, 60),
        H_CASE(old_leases_rejected, 60),
        H_CASE(stale_ms_ends_it, 60),
        H_CASE(second_step_marks_again, 60),
        H_CASE(journal_kill9, 90),
        H_CASE(redis_down_queued, 90),
        H_CASE(mget, 60),
        H_CASE(config_errors, 60),
        H_CASE(early_refresh, 90),
        H_CASE(early_refresh_leases, 60),
        H_CASE(early_refresh_mget, 60),
        H_CASE(reload, 60),
        H_CASE(refresh_null_keeps_value, 60),
    };

    return H_MAIN(fx, cases);
}
