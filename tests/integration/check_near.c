/* The near cache against a real redis-server and real leased daemons:
 * near hits cost Redis nothing, writes from anywhere evict within
 * milliseconds, the loss of the tracking connection (killed, or silent
 * and found out by the idle PING) or of Redis flushes,
 * a read whose reply is overtaken by an invalidation is not kept (proven
 * with a delaying proxy between leased and Redis), a second delete drops
 * the entry before Redis answers it, the byte bound holds, and no entry
 * outlives its Redis TTL. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"
#include "near_util.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define T_MS 5000
#define PREFIX "leased:cache:"

static struct h_redis R;
static struct h_daemon D;
static struct h_daemon D2;
static const struct h_fixture fx = {
    .suite = "near",
    .redis = {&R},
    .daemons = {&D, &D2},
};

#define NEAR_YAML                                                             \
    "cache:\n  ttl_jitter: 0\n  double_delete_ms: 0\n"                        \
    "  near: { enabled: true }\n"

/* --- helpers ------------------------------------------------------------ */

static void
start_near(struct h_daemon *d, const char *yaml)
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
set(struct h_conn *c, const char *key, const char *value, long long ttl_ms)
{
    json_t *r;
    if (ttl_ms > 0) {
        r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:I}", "op", "cache.set", "key",
                    key, "value", value, "ttl_ms", (json_int_t)ttl_ms);
    } else {
        r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key", key,
                    "value", value);
    }
    json_decref(h_must(r));
}

/* Commands Redis has run, INFO and PING (the test's and the idle check's)
 * left out, and on a cluster what no read sends: the replicas' REPLCONF
 * ACK each second and the daemon's check of the slot map every 5 s. */
static long long
redis_commands(void)
{
    redisReply *r = h_redis_cmd(&R, "INFO commandstats");
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STRING, "INFO failed");
    long long total = 0;
    char *save = NULL;
    for (char *line = strtok_r(r->str, "\r\n", &save); line != NULL;
         line = strtok_r(NULL, "\r\n", &save)) {
        char name[128];
        long long calls;
        if (sscanf(line, "cmdstat_%127[^:]:calls=%lld", name, &calls) != 2) {
            continue;
        }
        if (strcmp(name, "info") != 0 && strcmp(name, "ping") != 0 &&
            strcmp(name, "replconf") != 0 &&
            strcmp(name, "cluster|slots") != 0) {
            total += calls;
        }
    }
    freeReplyObject(r);
    return total;
}

/* Whether the daemon has had its look at the due set (see ld_cache_due.c),
 * which it takes once after it starts, within a second. */
static bool
due_set_looked_at(void *arg)
{
    (void)arg;
    redisReply *r = h_redis_cmd(&R, "INFO commandstats");
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STRING, "INFO failed");
    bool looked = strstr(r->str, "cmdstat_zcard:") != NULL;
    freeReplyObject(r);
    return looked;
}

/* --- cases -------------------------------------------------------------- */

START_TEST(test_near_hit_costs_redis_nothing)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);

    json_t *hello = h_must(h_callf(c, T_MS, "{s:s}", "op", "hello"));
    json_t *f = json_object_get(hello, "features");
    bool found = false;
    for (size_t i = 0; i < json_array_size(f); i++) {
        found = found ||
                strcmp(json_string_value(json_array_get(f, i)), "near") == 0;
    }
    ck_assert_msg(found, "hello does not offer near: %s", h_dump(hello));
    json_decref(hello);

    set(c, "hot", "value-1", 0);
    near_get_until_near(c, "hot", "value-1");

    ck_assert_msg(h_wait_until(due_set_looked_at, NULL, T_MS),
                  "the due set was not looked at after the start");
    long long before = redis_commands();
    for (int i = 0; i < 200; i++) {
        json_t *r = near_get(c, "hot");
        ck_assert_msg(near_hit_of(r, "value-1") && jtrue(r, "near"),
                      "not a near hit: %s", h_dump(r));
        json_decref(r);
    }
    /* mget answers each near key the same way. */
    json_t *m = h_must(h_callf(c, T_MS, "{s:s,s:[s,s]}", "op", "cache.mget",
                               "keys", "hot", "hot"));
    json_t *res = json_object_get(m, "results");
    ck_assert_msg(near_hit_of(json_array_get(res, 0), "value-1") &&
                      jtrue(json_array_get(res, 0), "near"),
                  "mget: %s", h_dump(m));
    json_decref(m);
    ck_assert_msg(redis_commands() == before,
                  "near hits sent %lld commands to redis",
                  redis_commands() - before);
    ck_assert_int_ge(h_stat(c, "near_hits"), 201);
    ck_assert_int_eq(h_stat(c, "near_entries"), 1);
    ck_assert_int_gt(h_stat(c, "near_bytes"), 0);
    /* Near hits count among the hot keys like any other read. */
    json_t *hot = h_must(h_callf(c, T_MS, "{s:s}", "op", "cache.hot"));
    json_t *first = json_array_get(json_object_get(hot, "keys"), 0);
    ck_assert_msg(first != NULL && strcmp(jstr(first, "key"), "hot") == 0,
                  "cache.hot: %s", h_dump(hot));
    json_decref(hot);
    h_close(c);
}
END_TEST

START_TEST(test_write_in_redis_evicts)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "old", 0);
    near_get_until_near(c, "k", "old");

    h_entry_write(&R, PREFIX "{k}", "new", strlen("new"));
    long long ms = near_get_until(c, "k", "new");
    ck_assert_msg(ms < 1000, "the write took %lld ms to reach the daemon", ms);
    ck_assert_int_ge(h_stat(c, "near_evictions_tracking"), 1);

    /* FLUSHALL: Redis says so with a null message, and all goes. */
    near_get_until_near(c, "k", "new");
    long long flushes = h_stat(c, "near_flushes");
    h_r_do(&R, "FLUSHALL");
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    near_get_until(c, "k", NULL);
    h_close(c);
}
END_TEST

START_TEST(test_other_daemon_and_invalidate_evict)
{
    start_near(&D, NEAR_YAML);
    start_near(&D2, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    struct h_conn *c2 = h_connect_ok(&D2);

    set(c, "shared", "one", 0);
    near_get_until_near(c, "shared", "one");
    near_get_until_near(c2, "shared", "one");

    /* A write through the other daemon. */
    set(c2, "shared", "two", 0);
    ck_assert_msg(near_get_until(c, "shared", "two") < 1000, "too slow");
    near_get_until_near(c, "shared", "two");

    /* An invalidation through the other daemon. */
    json_decref(h_must(h_callf(c2, T_MS, "{s:s,s:s}", "op", "cache.invalidate",
                               "key", "shared")));
    ck_assert_msg(near_get_until(c, "shared", NULL) < 1000, "too slow");

    /* The daemon's own invalidation: the very next read is not near. */
    set(c, "shared", "three", 0);
    near_get_until_near(c, "shared", "three");
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.invalidate",
                               "key", "shared")));
    json_t *r = near_get(c, "shared");
    ck_assert_msg(!jtrue(r, "hit"), "read after invalidate: %s", h_dump(r));
    json_decref(r);

    /* Its own set: the next read has the new value. */
    set(c, "shared", "four", 0);
    near_get_until_near(c, "shared", "four");
    set(c, "shared", "five", 0);
    r = near_get(c, "shared");
    ck_assert_msg(near_hit_of(r, "five"), "read after set: %s", h_dump(r));
    json_decref(r);
    h_close(c);
    h_close(c2);
}
END_TEST

/* The daemon's own cache.mset, like its cache.set: the very next read
 * of each key has the new value, never the near copy it replaced. */
START_TEST(test_own_mset_evicts)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "m1", "old1", 0);
    set(c, "m2", "old2", 0);
    near_get_until_near(c, "m1", "old1");
    near_get_until_near(c, "m2", "old2");
    json_t *r = h_must(h_callf(c, T_MS, "{s:s,s:[{s:s,s:s},{s:s,s:s}]}", "op",
                               "cache.mset", "entries", "key", "m1", "value",
                               "new1", "key", "m2", "value", "new2"));
    ck_assert_int_eq(jint(r, "stored"), 2);
    json_decref(r);
    r = near_get(c, "m1");
    ck_assert_msg(near_hit_of(r, "new1"), "read after mset: %s", h_dump(r));
    json_decref(r);
    r = near_get(c, "m2");
    ck_assert_msg(near_hit_of(r, "new2"), "read after mset: %s", h_dump(r));
    json_decref(r);
    h_close(c);
}
END_TEST

START_TEST(test_tracking_connection_killed_flushes)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "v", 0);
    near_get_until_near(c, "k", "v");
    long long flushes = h_stat(c, "near_flushes");

    long long id = near_client_id(&R, "track");
    ck_assert_msg(id > 0, "no tracking connection in CLIENT LIST");
    h_r_do(&R, "CLIENT KILL ID %lld", id);
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    ck_assert_int_eq(h_stat(c, "near_entries"), 0);
    /* A write made while nobody listens is seen: nothing stale stays. */
    h_entry_write(&R, PREFIX "{k}", "w", strlen("w"));
    near_get_until(c, "k", "w");

    /* It comes back, and so does the near cache. */
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until_near(c, "k", "w");

    /* A command connection lost: its tracked keys would go unheard. */
    flushes = h_stat(c, "near_flushes");
    id = near_client_id(&R, "cmd");
    ck_assert_msg(id > 0, "no command connection in CLIENT LIST");
    h_r_do(&R, "CLIENT KILL TYPE normal SKIPME yes");
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    h_entry_write(&R, PREFIX "{k}", "x", strlen("x"));
    near_get_until(c, "k", "x");
    h_close(c);
}
END_TEST

START_TEST(test_redis_restart_flushes)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "before", 0);
    near_get_until_near(c, "k", "before");
    long long flushes = h_stat(c, "near_flushes");

    h_redis_kill(&R);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    ck_assert_int_eq(h_stat(c, "near_entries"), 0);
    /* The restarted Redis lost the entry (no save on SIGKILL): a miss,
     * never the value kept from before. */
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until(c, "k", NULL);
    h_close(c);
}
END_TEST

/* A cache.get of KEY (LEASE: whether it asks for one) must be a miss
 * without a lease: what an acknowledged invalidation promised while its
 * first delete is owed. */
static void
assert_owed_miss(struct h_conn *c, const char *key, bool lease)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        key, "lease", lease);
    ck_assert_msg(h_ok(r) && !jtrue(r, "hit") &&
                      json_is_null(json_object_get(r, "lease")),
                  "cache.get %s after its invalidation: %s", key, h_dump(r));
    json_decref(r);
}

/* Redis stops with q cached near, cache.invalidate q is acknowledged as
 * queued, and Redis comes back with its data (q still "old" there): no
 * read after the answer sees "old", near or not, and the delete reaches
 * Redis as soon as the daemon has a connection again, not after the
 * backoff its failed attempts grew meanwhile. */
START_TEST(test_invalidate_across_outage)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "q", "old", 0);
    near_get_until_near(c, "q", "old");
    h_r_do(&R, "SET witness here");
    h_r_do(&R, "SAVE");
    h_redis_kill(&R);

    json_t *r = h_must(
        h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.invalidate", "key", "q"));
    ck_assert_msg(jtrue(r, "queued") && jint(r, "deleted") == 0 &&
                      jint(r, "pending") == 1,
                  "invalidate while Redis is down: %s", h_dump(r));
    json_decref(r);
    long long answered = h_now_ms();
    /* The outage lasts (time passing is the point: the delete's retries
     * back off meanwhile); the reads in it are misses without a lease. */
    while (h_now_ms() - answered < 3000) {
        assert_owed_miss(c, "q", true);
        r = h_must(
            h_callf(c, T_MS, "{s:s,s:[s]}", "op", "cache.mget", "keys", "q"));
        json_t *res = json_array_get(json_object_get(r, "results"), 0);
        ck_assert_msg(h_ok(res) && !jtrue(res, "hit") &&
                          json_is_null(json_object_get(res, "lease")),
                      "cache.mget after the invalidation: %s", h_dump(r));
        json_decref(r);
        usleep(20000);
    }

    ck_assert_int_eq(h_redis_restart(&R), 0);
    redisReply *w = h_redis_cmd(&R, "GET witness");
    ck_assert_msg(w != NULL && w->type == REDIS_REPLY_STRING,
                  "Redis came back without its data");
    freeReplyObject(w);
    long long up = 0, gone = 0, deadline = h_now_ms() + 15000;
    while (gone == 0 && h_now_ms() < deadline) {
        assert_owed_miss(c, "q", false);
        if (up == 0 && h_stat(c, "redis_connected") > 0) {
            up = h_now_ms();
        }
        if (up != 0 && h_r_int(&R, "EXISTS " PREFIX "{q}") == 0) {
            gone = h_now_ms();
        }
    }
    ck_assert_msg(gone != 0, "the delete never reached Redis");
    fprintf(stderr, "delete reached Redis %lld ms after it was up\n",
            gone - up);
    ck_assert_msg(gone - up < 1000,
                  "the delete reached Redis %lld ms after it was up",
                  gone - up);
    h_assert_stat(c, "cache_invalidations_pending", 0, T_MS);
    assert_owed_miss(c, "q", false);

    /* Done with, the key is cached near again like any other. */
    set(c, "q", "new", 0);
    near_get_until_near(c, "q", "new");
    h_close(c);
}
END_TEST

START_TEST(test_ttl_respected)
{
    /* Without Redis' active expiry, no invalidation comes when the key
     * ends: only the daemon's own clock can stop the near hits. */
    ck_assert_int_eq(h_redis_start(&R, "--enable-debug-command yes"), 0);
    h_r_do(&R, "DEBUG SET-ACTIVE-EXPIRE 0");
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "short", "v", 1500);
    /* Redis set the TTL before it answered: it ends by then + 1500 ms. */
    long long t0 = h_now_ms();
    near_get_until_near(c, "short", "v");
    /* Until the TTL it is near; from then on never again. */
    while (h_now_ms() < t0 + 1500) {
        usleep(5000);
    }
    json_t *r = near_get(c, "short");
    ck_assert_msg(!jtrue(r, "near"), "near hit after the TTL: %s", h_dump(r));
    json_decref(r);
    near_get_until(c, "short", NULL);
    ck_assert_int_ge(h_stat(c, "near_evictions_ttl"), 1);
    h_close(c);
}
END_TEST

START_TEST(test_lru_bound_and_value_limit)
{
    start_near(&D, "cache:\n  ttl_jitter: 0\n"
                   "  near: { enabled: true, max_bytes: 20000, "
                   "max_value_bytes: 1000 }\n");
    struct h_conn *c = h_connect_ok(&D);
    char value[601];
    memset(value, 'x', 600);
    value[600] = '\0';
    char key[32];
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "lru%d", i);
        set(c, key, value, 0);
        json_decref(near_get(c, key));
        json_decref(near_get(c, key));
        ck_assert_int_le(h_stat(c, "near_bytes"), 20000);
    }
    ck_assert_int_gt(h_stat(c, "near_evictions_lru"), 50);
    ck_assert_int_lt(h_stat(c, "near_entries"), 30);
    ck_assert_int_gt(h_stat(c, "near_entries"), 10);
    /* Least recently used first out: the newest key stays, the oldest
     * went. */
    json_t *r = near_get(c, "lru199");
    ck_assert_msg(jtrue(r, "near"), "newest: %.80s", h_dump(r));
    json_decref(r);
    r = near_get(c, "lru0");
    ck_assert_msg(near_hit_of(r, value) && !jtrue(r, "near"), "oldest: %.80s",
                  h_dump(r));
    json_decref(r);

    /* A value over max_value_bytes is never kept. */
    char big[1501];
    memset(big, 'y', 1500);
    big[1500] = '\0';
    set(c, "big", big, 0);
    for (int i = 0; i < 20; i++) {
        r = near_get(c, "big");
        ck_assert_msg(near_hit_of(r, big) && !jtrue(r, "near"), "big: %.80s",
                      h_dump(r));
        json_decref(r);
    }
    h_close(c);
}
END_TEST

START_TEST(test_min_hits)
{
    start_near(&D, "cache:\n  ttl_jitter: 0\n"
                   "  near: { enabled: true, min_hits: 3 }\n");
    struct h_conn *c = h_connect_ok(&D);
    set(c, "warm", "v", 0);
    /* Two reads: not often enough, and Redis does not track it. */
    for (int i = 0; i < 2; i++) {
        json_t *r = near_get(c, "warm");
        ck_assert_msg(near_hit_of(r, "v") && !jtrue(r, "near"), "%s",
                      h_dump(r));
        json_decref(r);
    }
    ck_assert_int_eq(h_stat(c, "near_entries"), 0);
    near_get_until_near(c, "warm", "v");
    h_close(c);
}
END_TEST

/* A value written in Redis that is not UTF-8 cannot be sent in a reply:
 * its reads answer wrong_type, and it is never kept near (what is kept
 * is the reply's JSON text). */
static json_t *
get_any(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key",
                        key, "lease", 0);
    ck_assert_msg(r != NULL, "no reply");
    return r;
}

static bool
is_wrong_type(const json_t *r)
{
    const char *code = h_errcode(r);
    return code != NULL && strcmp(code, "wrong_type") == 0;
}

START_TEST(test_near_value_not_utf8)
{
    start_near(&D, NEAR_YAML);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "bin", "fine", 0);
    near_get_until_near(c, "bin", "fine");
    h_entry_write(&R, PREFIX "{bin}", "\xff\xfe", 2);
    /* Near hits of the old value until the invalidation is in. */
    long long deadline = h_now_ms() + T_MS;
    for (;;) {
        json_t *r = get_any(c, "bin");
        bool done = is_wrong_type(r);
        ck_assert_msg(done || near_hit_of(r, "fine"), "%s", h_dump(r));
        json_decref(r);
        if (done) {
            break;
        }
        ck_assert_msg(h_now_ms() < deadline, "the write was never seen");
        usleep(1000);
    }
    long long near0 = h_stat(c, "near_hits");
    for (int i = 0; i < 20; i++) {
        json_t *r = get_any(c, "bin");
        ck_assert_msg(is_wrong_type(r), "%s", h_dump(r));
        json_decref(r);
        usleep(1000);
    }
    ck_assert_int_eq(h_stat(c, "near_hits"), near0);
    ck_assert_int_eq(h_stat(c, "near_entries"), 0);
    /* A valid value again is kept again. */
    set(c, "bin", "fine again", 0);
    near_get_until_near(c, "bin", "fine again");
    /* What needs escaping comes back the same from the near cache, in
     * cache.get and in cache.mget. */
    static const char esc[] = "a \"q\" \\ \xc3\xa9\n\t\x01";
    set(c, "esc", esc, 0);
    near_get_until_near(c, "esc", esc);
    json_t *m = h_must(h_callf(c, T_MS, "{s:s,s:[s,s]}", "op", "cache.mget",
                               "keys", "esc", "bin"));
    json_t *res = json_object_get(m, "results");
    ck_assert_msg(near_hit_of(json_array_get(res, 0), esc) &&
                      jtrue(json_array_get(res, 0), "near") &&
                      near_hit_of(json_array_get(res, 1), "fine again") &&
                      jtrue(json_array_get(res, 1), "near"),
                  "mget: %s", h_dump(m));
    json_decref(m);
    h_close(c);
}
END_TEST

/* --- the race: a proxy that holds back Redis' replies ------------------ */

/* Between leased and Redis: every connection is passed through, and while
 * SLOW is set, Redis' replies to the command connections are held back
 * DELAY_MS; the tracking connection (its name ends in ":track") is never
 * delayed, so an invalidation overtakes the reply of an earlier read.
 * While SILENT is set, the tracking connection's bytes are dropped both
 * ways: a peer gone without a word. While HOLD_TRACK (HOLD_CMD) is set,
 * Redis' bytes to the tracking (a command) connection are held back,
 * then passed on in order once it is cleared. */
#define DELAY_MS 400

static struct {
    int listen_fd;
    int port;
    atomic_int slow;
    atomic_int silent;
    atomic_int hold_track;
    atomic_int hold_cmd;
    atomic_int stop;
} P;

struct pipe_pair {
    int client, server;
    atomic_int is_track;
};

static void *
pump_up(void *arg)
{
    struct pipe_pair *pp = arg;
    char buf[16384];
    ssize_t n;
    while ((n = read(pp->client, buf, sizeof buf)) > 0) {
        if (memmem(buf, (size_t)n, ":track", 6) != NULL) {
            atomic_store(&pp->is_track, 1);
        }
        if (atomic_load(&P.silent) && atomic_load(&pp->is_track)) {
            continue;
        }
        if (write(pp->server, buf, (size_t)n) != n) {
            break;
        }
    }
    shutdown(pp->server, SHUT_WR);
    return NULL;
}

static void *
pump_down(void *arg)
{
    struct pipe_pair *pp = arg;
    char buf[16384];
    ssize_t n;
    while ((n = read(pp->server, buf, sizeof buf)) > 0) {
        if (atomic_load(&P.slow) && !atomic_load(&pp->is_track)) {
            usleep(DELAY_MS * 1000);
        }
        while (atomic_load(atomic_load(&pp->is_track) ? &P.hold_track
                                                      : &P.hold_cmd) &&
               !atomic_load(&P.stop)) {
            usleep(1000);
        }
        if (atomic_load(&P.silent) && atomic_load(&pp->is_track)) {
            continue;
        }
        if (write(pp->client, buf, (size_t)n) != n) {
            break;
        }
    }
    shutdown(pp->client, SHUT_WR);
    return NULL;
}

static void *
proxy_accept(void *arg)
{
    (void)arg;
    while (!atomic_load(&P.stop)) {
        struct pollfd pfd = {P.listen_fd, POLLIN, 0};
        if (poll(&pfd, 1, 100) <= 0) {
            continue;
        }
        int cfd = accept(P.listen_fd, NULL, NULL);
        if (cfd < 0) {
            continue;
        }
        int sfd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_port = htons((uint16_t)R.port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (sfd < 0 || connect(sfd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(cfd);
            if (sfd >= 0) {
                close(sfd);
            }
            continue;
        }
        /* Static, as long as the test process (a case is one process):
         * the pumps may still run when the case ends. */
        static struct pipe_pair pairs[64];
        static int n_pairs;
        if (n_pairs == (int)(sizeof pairs / sizeof pairs[0])) {
            close(cfd);
            close(sfd);
            continue;
        }
        struct pipe_pair *pp = &pairs[n_pairs++];
        pp->client = cfd;
        pp->server = sfd;
        pthread_t t1, t2;
        pthread_create(&t1, NULL, pump_up, pp);
        pthread_create(&t2, NULL, pump_down, pp);
        pthread_detach(t1);
        pthread_detach(t2);
    }
    return NULL;
}

static void
proxy_start(void)
{
    P.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(P.listen_fd, 0);
    int on = 1;
    setsockopt(P.listen_fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(P.listen_fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(P.listen_fd, (struct sockaddr *)&a, &len);
    P.port = ntohs(a.sin_port);
    ck_assert_int_eq(listen(P.listen_fd, 64), 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, proxy_accept, NULL), 0);
    pthread_detach(t);
}

static long long
hmget_calls(void)
{
    redisReply *r = h_redis_cmd(&R, "INFO commandstats");
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STRING, "INFO failed");
    long long calls = 0;
    const char *p = strstr(r->str, "cmdstat_" H_CACHE_PROBE ":calls=");
    if (p != NULL) {
        calls = atoll(p + strlen("cmdstat_" H_CACHE_PROBE ":calls="));
    }
    freeReplyObject(r);
    return calls;
}

START_TEST(test_race_invalidation_overtakes_read)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    proxy_start();
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 5000\n"
             "  connections: 1\n" NEAR_YAML,
             P.port);
    start_near(&D, yaml);
    struct h_conn *c = h_connect_ok(&D);
    h_entry_write(&R, PREFIX "{race}", "old", strlen("old"));
    h_r_do(&R, "PEXPIRE " PREFIX "{race} 600000");

    /* The read of "old" leaves; Redis answers it at once, the proxy holds
     * the answer back. */
    long long before = hmget_calls();
    atomic_store(&P.slow, 1);
    ck_assert_int_eq(h_send(c, "{s:s,s:s,s:s,s:b}", "id", "r1", "op",
                            "cache.get", "key", "race", "lease", 0),
                     0);
    long long deadline = h_now_ms() + T_MS;
    while (hmget_calls() == before) {
        ck_assert_msg(h_now_ms() < deadline, "the read never reached redis");
        usleep(1000);
    }
    /* Now the write: its invalidation passes the held-back answer. */
    h_entry_write(&R, PREFIX "{race}", "new", strlen("new"));
    json_t *r = h_recv(c, T_MS);
    ck_assert_msg(r != NULL && near_hit_of(r, "old") && !jtrue(r, "near"),
                  "the slow read: %s", h_dump(r));
    json_decref(r);
    atomic_store(&P.slow, 0);

    /* "old" was not kept: the next read goes to Redis and finds "new". */
    r = near_get(c, "race");
    ck_assert_msg(near_hit_of(r, "new") && !jtrue(r, "near"),
                  "the answer of the overtaken read was kept: %s", h_dump(r));
    json_decref(r);
    near_get_until_near(c, "race", "new");
    atomic_store(&P.stop, 1);
    h_close(c);
}
END_TEST

/* The second delete drops the key's near entry before it is sent, not
 * only when Redis answers it or tracking reports it: a value a stale
 * writer put back after the first delete, read and kept near, is not
 * served once Redis has deleted it. Tracking and the delete's answer are
 * held back by the proxy, so only the daemon's own eviction is left. */
START_TEST(test_second_delete_evicts_first)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    proxy_start();
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 10000\n"
             "cache:\n  ttl_jitter: 0\n  double_delete_ms: 4000\n"
             "  near: { enabled: true }\n",
             P.port);
    start_near(&D, yaml);
    struct h_conn *c = h_connect_ok(&D);
    h_entry_write(&R, PREFIX "{sd}", "old", strlen("old"));
    h_r_do(&R, "PEXPIRE " PREFIX "{sd} 600000");
    near_get_until_near(c, "sd", "old");

    atomic_store(&P.hold_track, 1);
    json_t *r = h_must(
        h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.invalidate", "key", "sd"));
    json_decref(r);
    /* The stale writer, between the two deletes; its invalidation is held
     * back, so the daemon keeps what it reads near. */
    h_entry_write(&R, PREFIX "{sd}", "stale", strlen("stale"));
    h_r_do(&R, "PEXPIRE " PREFIX "{sd} 600000");
    near_get_until_near(c, "sd", "stale");
    atomic_store(&P.hold_cmd, 1);
    ck_assert_msg(h_r_int(&R, "EXISTS " PREFIX "{sd}") == 1,
                  "the second delete ran before the stale value was near");

    long long deadline = h_now_ms() + 15000;
    while (h_r_int(&R, "EXISTS " PREFIX "{sd}") == 1) {
        ck_assert_msg(h_now_ms() < deadline, "the second delete never ran");
        usleep(1000);
    }
    /* Redis deleted it; its answer is held. A read now is served near
     * (an answer comes at once) or goes to Redis (its HMGET runs). */
    long long before = hmget_calls();
    ck_assert_int_eq(h_send(c, "{s:s,s:s,s:s,s:b}", "id", "r1", "op",
                            "cache.get", "key", "sd", "lease", 0),
                     0);
    r = NULL;
    deadline = h_now_ms() + T_MS;
    while (r == NULL && hmget_calls() == before) {
        ck_assert_msg(h_now_ms() < deadline, "the read was not answered");
        r = h_recv(c, 10);
    }
    atomic_store(&P.hold_cmd, 0);
    atomic_store(&P.hold_track, 0);
    if (r == NULL) {
        r = h_recv(c, T_MS);
    }
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "hit"),
                  "a read after the second delete: %s", h_dump(r));
    json_decref(r);
    atomic_store(&P.stop, 1);
    h_close(c);
}
END_TEST

/* The tracking connection is pinged when idle: one that goes silent
 * (no FIN, no RST) is given up within the idle time plus
 * redis.timeout_ms, and the near cache flushed. */
START_TEST(test_silent_tracking_connection_flushes)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    proxy_start();
    snprintf(
        yaml, sizeof yaml,
        "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 500\n" NEAR_YAML,
        P.port);
    start_near(&D, yaml);
    struct h_conn *c = h_connect_ok(&D);
    set(c, "k", "v", 0);
    near_get_until_near(c, "k", "v");
    long long flushes = h_stat(c, "near_flushes");
    atomic_store(&P.silent, 1);
    /* The idle PING after 5 s, its answer owed for 500 ms. */
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, 15000));
    ck_assert_int_eq(h_stat(c, "near_entries"), 0);
    ck_assert(h_wait_log(&D, "near cache tracking connection lost", T_MS));
    atomic_store(&P.silent, 0);
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until_near(c, "k", "v");
    atomic_store(&P.stop, 1);
    h_close(c);
}
END_TEST

START_TEST(test_bad_config_refused)
{
    char out[4096], err[4096], dir[256], path[300], text[600];
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/leased.yml", dir);
    snprintf(text, sizeof text,
             "journal:\n  path: \"%s/j\"\ncache:\n  near: { enabled: true, "
             "max_bytes: 1000, max_value_bytes: 2000 }\n",
             dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    const char *argv[] = {h_leased_bin(), "-t", "-c", path, NULL};
    int st = h_run(argv, out, sizeof out, err, sizeof err, 10000);
    ck_assert_msg(st == 1, "-t exited %d: %s%s", st, out, err);
    ck_assert_msg(strstr(err, ":4:") != NULL &&
                      strstr(err, "cache.near.max_value_bytes: may not "
                                  "exceed cache.near.max_bytes") != NULL,
                  "-t said: %s", err);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(near_hit_costs_redis_nothing, 60),
        H_CASE(write_in_redis_evicts, 60),
        H_CASE(other_daemon_and_invalidate_evict, 60),
        H_CASE(own_mset_evicts, 60),
        H_CASE(tracking_connection_killed_flushes, 60),
        H_CASE(redis_restart_flushes, 60),
        H_CASE(invalidate_across_outage, 90),
        H_CASE(ttl_respected, 60),
        H_CASE(lru_bound_and_value_limit, 90),
        H_CASE(min_hits, 60),
        H_CASE(near_value_not_utf8, 60),
        H_CASE(race_invalidation_overtakes_read, 60),
        H_CASE(second_delete_evicts_first, 60),
        H_CASE(silent_tracking_connection_flushes, 60),
        H_CASE(bad_config_refused, 60),
    };
    return H_MAIN(fx, cases);
}
