/* Redlock (lock.redlock) against real processes: three independent
 * redis-server instances for the locks, the harness's own Redis for the
 * cache and the wake-ups, and the real leased. A grant with one instance
 * down and redis_unavailable with two; lease_ms below the ttl by at least
 * the drift; the keys on a majority, gone from all after unlock; a failed
 * attempt given back where it was granted, also from a late answer;
 * lock_lost when the majority goes while held; waiters woken by an unlock
 * in another daemon and by a lease running out; the wake-ups come from
 * the instances, so they reach a waiter at once with the cache's Redis
 * down, with an instance down or restarted, and between daemons whose
 * cache Redis differ, each copy of one wake-up waking once, in the
 * Redisson layout with Redisson's "0" both ways, and a waiter tries
 * again when its subscribers come back after a loss; the ticket seller
 * on Redlock without oversell. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define NI 3
#define TIMEOUT_MS 500 /* redis.timeout_ms of the daemons */
#define HOLDER "0123456789abcdef0123456789abcdef"

#define WAKE_MS 2000 /* an unlock wakes a waiter within this */

static struct h_redis R;  /* redis.*: the cache, the tests' data */
static struct h_redis R2; /* D2's own redis.* (start_split) */
static struct h_redis I[NI];
static struct h_daemon D1, D2;

static void
stop_instances(void)
{
    for (int i = 0; i < NI; i++) {
        h_redis_stop(&I[i]);
    }
}

static bool redisson; /* the case runs lock.layout: redisson */

static void
leased_layout(void)
{
    redisson = false;
}

static const struct h_fixture fx = {
    .suite = "redlock",
    .redis = {&R, &R2},
    .daemons = {&D1, &D2},
    .setup = leased_layout,
    .teardown = stop_instances,
};

static bool
gone_from_all(void *key)
{
    for (int i = 0; i < NI; i++) {
        if (I[i].pid != 0 && h_r_int(&I[i], "EXISTS leased:lock:{%s}",
                                     (const char *)key) != 0) {
            return false;
        }
    }
    return true;
}

static void
daemon_yaml(char *yaml, size_t size, const struct h_redis *r,
            const char *extra)
{
    snprintf(yaml, size,
             "redis:\n  address: 127.0.0.1:%d\n  timeout_ms: %d\n"
             "lock:\n  redlock: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n%s",
             r->port, TIMEOUT_MS, I[0].port, I[1].port, I[2].port,
             extra != NULL ? extra : "");
}

/* The instances, the harness's Redis and NDAEMONS daemons on them, with
 * EXTRA lines added to the lock section. SPLIT: D2's redis.* is a Redis
 * of its own (R2), as for two applications with a cache each that share
 * the lock instances. */
static void
start_all_ex(int ndaemons, const char *extra, bool split)
{
    char yaml[1024];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    if (split) {
        ck_assert_int_eq(h_redis_start(&R2, NULL), 0);
    }
    for (int i = 0; i < NI; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], "--enable-debug-command yes"),
                         0);
    }
    daemon_yaml(yaml, sizeof yaml, &R, extra);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    if (ndaemons > 1) {
        const struct h_redis *r2 = split ? &R2 : &R;
        daemon_yaml(yaml, sizeof yaml, r2, extra);
        ck_assert_int_eq(h_daemon_start(&D2, r2, yaml), 0);
    }
    /* The harness waits for redis.*; a lock needs a majority of the
     * instances too, which connect on their own. */
    h_wait_redlock(&D1, NI);
    if (ndaemons > 1) {
        h_wait_redlock(&D2, NI);
    }
}

static void
start_all(int ndaemons, const char *extra)
{
    start_all_ex(ndaemons, extra, false);
}

static bool
gone_from_first(void *key)
{
    return h_r_int(&I[0], "EXISTS leased:lock:{%s}", (const char *)key) == 0;
}

static int
instances_with(const char *key)
{
    int n = 0;
    for (int i = 0; i < NI; i++) {
        if (I[i].pid != 0 &&
            h_r_int(&I[i], "EXISTS leased:lock:{%s}", key) == 1) {
            n++;
        }
    }
    return n;
}

/* A lock request until it gets a grant (the daemon may not have seen an
 * instance come or go yet); the last reply. */
static json_t *
lock_until(struct h_conn *c, const char *key, long long ttl, bool granted,
           int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    for (;;) {
        json_t *r = lk_lock(c, key, NULL, ttl, 0);
        bool got = h_ok(r) && jtrue(r, "acquired");
        if (got == granted || h_now_ms() > deadline) {
            return r;
        }
        if (got) {
            lk_unlock_ok(c, key, NULL);
        }
        json_decref(r);
        usleep(20000);
    }
}

START_TEST(test_grant_keys_and_unlock)
{
    struct h_conn *c;
    json_t *r;

    start_all(1, NULL);
    c = lk_connect(&D1);

    /* All up: the lock is on every instance, never on redis.*. */
    r = lk_must(c, "a", NULL, 10000, 0);
    ck_assert_int_gt(jint(r, "fence"), 0);
    /* The validity left: the ttl less the time taken and the drift
     * (1% of the lease + 2 ms). */
    ck_assert_int_gt(jint(r, "lease_ms"), 0);
    ck_assert_int_le(jint(r, "lease_ms"), 10000 - (10000 / 100 + 2));
    json_decref(r);
    ck_assert_int_eq(instances_with("a"), NI);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{a}"), 0);
    for (int i = 0; i < NI; i++) {
        long long pttl = h_r_int(&I[i], "PTTL leased:lock:{a}");
        ck_assert_msg(pttl > 9000 && pttl <= 10000, "pttl %lld on %d", pttl,
                      i);
    }
    r = lk_info(c, "a");
    ck_assert(jtrue(r, "locked") && jtrue(r, "mine"));
    json_decref(r);

    /* Reentry counts on every instance; unlock removes it from all. */
    r = lk_must(c, "a", NULL, 10000, 0);
    ck_assert_int_eq(jint(r, "count"), 2);
    json_decref(r);
    for (int i = 0; i < NI; i++) {
        ck_assert_int_eq(h_r_int(&I[i], "HLEN leased:lock:{a}"), 1);
    }
    lk_unlock_ok(c, "a", NULL);
    ck_assert_int_eq(instances_with("a"), NI);
    lk_unlock_ok(c, "a", NULL);
    ck_assert_int_eq(instances_with("a"), 0);

    /* One instance down: still granted, on the majority left. */
    h_redis_kill(&I[2]);
    r = lock_until(c, "b", 10000, true, 10000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not granted: %s",
                  h_errcode(r));
    ck_assert_int_le(jint(r, "lease_ms"), 10000 - 102);
    json_decref(r);
    ck_assert_int_eq(instances_with("b"), 2);
    r = lk_info(c, "b");
    ck_assert(jtrue(r, "locked") && jtrue(r, "mine"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    json_decref(r);
    /* Another session sees it taken. */
    struct h_conn *o = lk_connect(&D1);
    r = lk_lock(o, "b", NULL, 5000, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    lk_unlock_ok(c, "b", NULL);
    ck_assert_int_eq(instances_with("b"), 0);

    /* The instance comes back (empty): locks go on all three again. */
    ck_assert_int_eq(h_redis_restart(&I[2]), 0);
    long long deadline = h_now_ms() + 10000;
    do {
        r = lk_must(o, "c", NULL, 10000, 0);
        json_decref(r);
        int n = instances_with("c");
        lk_unlock_ok(o, "c", NULL);
        if (n == NI) {
            break;
        }
        usleep(50000);
    } while (h_now_ms() < deadline);
    ck_assert_msg(h_now_ms() < deadline, "instance 3 never used again");
    h_close(o);
    h_close(c);
}
END_TEST

/* extend sets the lease on every instance; a closing session releases
 * its locks on every instance, a detached lock stays. */
/* unlock's request_id under Redlock: the retry of an answered unlock is
 * answered from memory and takes no second hold off any instance. */
START_TEST(test_unlock_request_id)
{
    start_all(1, NULL);
    struct h_conn *c = lk_connect(&D1);
    json_t *r = lk_must(c, "ri", NULL, 10000, 0);
    char tok[80];
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    json_decref(lk_must(c, "ri", NULL, 10000, 0));
    for (int round = 0; round < 2; round++) {
        r = h_must(h_callf(c, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key",
                           "ri", "token", tok, "request_id", "r1"));
        ck_assert_msg(!jtrue(r, "released") && jint(r, "count") == 1,
                      "unlock %d: %s", round, h_dump(r));
        json_decref(r);
    }
    char field[120];
    snprintf(field, sizeof field, "HGET leased:lock:{ri} %s", tok);
    for (int i = 0; i < NI; i++) {
        ck_assert_int_eq(h_r_int(&I[i], field), 1);
    }
    h_close(c);
}
END_TEST

START_TEST(test_extend_and_session_end)
{
    struct h_conn *c;
    json_t *r;

    start_all(1, NULL);
    c = lk_connect(&D1);
    r = lk_must(c, "e", NULL, 5000, 0);
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "e", "ttl_ms",
                60000);
    ck_assert_msg(h_ok(r), "extend: %s", h_errcode(r));
    json_decref(r);
    for (int i = 0; i < NI; i++) {
        ck_assert_int_gt(h_r_int(&I[i], "PTTL leased:lock:{e}"), 50000);
    }
    r = h_callf(c, T_MS, "{s:s,s:s,s:i,s:b}", "op", "lock", "key", "d",
                "ttl_ms", 60000, "detach", 1);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    json_decref(r);
    /* Reentry by token from another session: counted everywhere, and
     * its lease_ms is the validity left as well. */
    char token[128];
    r = lk_must(c, "t", NULL, 10000, 0);
    snprintf(token, sizeof token, "%s", jstr(r, "token"));
    json_decref(r);
    struct h_conn *o = lk_connect(&D1);
    r = h_callf(o, T_MS, "{s:s,s:s,s:s,s:i}", "op", "lock", "key", "t",
                "token", token, "ttl_ms", 20000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "token reentry: %s",
                  h_errcode(r));
    ck_assert_int_eq(jint(r, "count"), 2);
    ck_assert_int_gt(jint(r, "lease_ms"), 15000);
    ck_assert_int_le(jint(r, "lease_ms"), 20000 - (20000 / 100 + 2));
    json_decref(r);
    for (int i = 0; i < NI; i++) {
        ck_assert_int_eq(h_r_int(&I[i], "HGET leased:lock:{t} %s", token), 2);
    }
    h_close(o);

    h_close(c);
    ck_assert_msg(h_wait_until(gone_from_all, "e", 5000),
                  "session-bound lock left on an instance");
    ck_assert_msg(h_wait_until(gone_from_all, "t", 5000),
                  "session-bound lock left on an instance");
    ck_assert_int_eq(instances_with("d"), NI);

    /* A graceful stop releases session-bound locks on every instance
     * before it exits. */
    c = lk_connect(&D1);
    r = lk_must(c, "g", NULL, NO_TTL, 0);
    json_decref(r);
    ck_assert_int_eq(instances_with("g"), NI);
    ck_assert_int_eq(h_daemon_stop(&D1), 0);
    ck_assert_int_eq(instances_with("g"), 0);
    ck_assert_int_eq(instances_with("d"), NI);
    h_close(c);
}
END_TEST

/* An instance given as a Unix socket path. */
START_TEST(test_unix_socket_instance)
{
    char dir[200], args[300], yaml[1024];
    struct h_conn *c;
    json_t *r;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--unixsocket %s/i.sock", dir);
    for (int i = 0; i < NI; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], i == 0 ? args : NULL), 0);
    }
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: 127.0.0.1:%d\n"
             "lock:\n  redlock: [\"%s/i.sock\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n",
             R.port, dir, I[1].port, I[2].port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    c = lk_connect(&D1);
    r = lock_until(c, "s", 10000, true, 10000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not granted: %s",
                  h_errcode(r));
    json_decref(r);
    h_assert_stat(c, "redlock_instances_up", NI, 5000);
    ck_assert_int_eq(instances_with("s"), NI);
    lk_unlock_ok(c, "s", NULL);
    ck_assert_int_eq(instances_with("s"), 0);
    h_close(c);
}
END_TEST

START_TEST(test_two_down_unavailable)
{
    struct h_conn *c;
    json_t *r;
    long long t0;

    start_all(1, NULL);
    c = lk_connect(&D1);
    h_redis_kill(&I[1]);
    h_redis_kill(&I[2]);
    r = lock_until(c, "u", 5000, false, 10000);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    h_assert_stat(c, "redlock_instances_up", 1, 5000);
    /* Once the daemon knows, at once, waiting or not. */
    t0 = h_now_ms();
    r = lk_lock(c, "u", NULL, 5000, 8000);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(strstr(jmsg(r), "1 of 3") != NULL, "message: %s", jmsg(r));
    json_decref(r);
    ck_assert_msg(h_now_ms() - t0 < 1000, "took %lld ms", h_now_ms() - t0);
    ck_assert_int_eq(instances_with("u"), 0);

    /* One back: a majority again. */
    ck_assert_int_eq(h_redis_restart(&I[1]), 0);
    r = lock_until(c, "u", 5000, true, 10000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not granted: %s",
                  h_errcode(r));
    json_decref(r);
    ck_assert_int_eq(instances_with("u"), 2);
    h_close(c);
}
END_TEST

/* The eviction check asks every instance, each time it comes back:
 * one that turns to allkeys-lru is named, and with
 * lock.require_noeviction refuses locks until it is back on noeviction. */
START_TEST(test_eviction_instance)
{
    struct h_conn *c;
    json_t *r;

    start_all(1, "  require_noeviction: true\n");
    c = lk_connect(&D1);
    r = lock_until(c, "ev", 5000, true, 10000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not granted: %s",
                  h_errcode(r));
    json_decref(r);
    lk_unlock_ok(c, "ev", NULL);
    ck_assert_int_eq(h_stat(c, "redis_eviction_unsafe"), 0);

    freeReplyObject(
        h_redis_cmd(&I[1], "CONFIG SET maxmemory-policy allkeys-lru"));
    freeReplyObject(h_redis_cmd(&I[1], "CLIENT KILL TYPE normal"));
    h_assert_stat(c, "redis_eviction_unsafe", 1, 10000);
    ck_assert(h_wait_log(&D1, "redis=lock.redlock instance 2", 5000));
    r = lk_lock(c, "ev", NULL, 5000, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(strstr(jmsg(r), "allkeys-lru") != NULL, "message: %s",
                  jmsg(r));
    json_decref(r);
    ck_assert_int_eq(instances_with("ev"), 0);

    freeReplyObject(
        h_redis_cmd(&I[1], "CONFIG SET maxmemory-policy noeviction"));
    freeReplyObject(h_redis_cmd(&I[1], "CLIENT KILL TYPE normal"));
    h_assert_stat(c, "redis_eviction_unsafe", 0, 10000);
    r = lock_until(c, "ev", 5000, true, 10000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not granted again: %s",
                  h_errcode(r));
    json_decref(r);
    h_close(c);
}
END_TEST

/* Another holder on two instances: the attempt gets only one, which it
 * must give back. With the third instance asleep past the per-instance
 * timeout, the grant it makes when it wakes is given back too. */
START_TEST(test_failed_attempt_undone)
{
    struct h_conn *c;
    json_t *r;

    start_all(1, NULL);
    c = lk_connect(&D1);
    for (int i = 1; i < NI; i++) {
        h_r_do(&I[i], "HSET leased:lock:{f} " HOLDER " 1");
        h_r_do(&I[i], "PEXPIRE leased:lock:{f} 60000");
    }
    r = lk_lock(c, "f", NULL, 5000, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 50000);
    json_decref(r);
    /* The give-back is sent before the answer, on its own way. */
    ck_assert_msg(h_wait_until(gone_from_first, "f", 5000),
                  "the hold on instance 1 was not given back");

    /* Instance 2 free, instance 3 held and asleep: one grant in time,
     * one late one, no majority. Each instance has min(redis.timeout_ms,
     * a tenth of the lease) = 500 ms; the late grant must be given back
     * long before its 10 s lease would end it. */
    h_r_do(&I[1], "DEL leased:lock:{f}");
    h_r_do(&I[2], "DEL leased:lock:{f}");
    h_r_do(&I[0], "HSET leased:lock:{f} " HOLDER " 1");
    h_r_do(&I[0], "PEXPIRE leased:lock:{f} 60000");
    redisContext *z = h_redis_sleep_start(&I[2], 1.5);
    long long t0 = h_now_ms();
    r = lk_lock(c, "f", NULL, 10000, 0);
    ck_assert_msg(h_now_ms() - t0 < 1200,
                  "the slow instance was waited for (%lld ms)",
                  h_now_ms() - t0);
    ck_assert_msg(!h_ok(r) || !jtrue(r, "acquired"), "granted on one of 3");
    json_decref(r);
    h_redis_sleep_end(z);
    /* Once it has woken, its late grant is given back. */
    long long deadline = h_now_ms() + 3000;
    while ((h_r_int(&I[1], "EXISTS leased:lock:{f}") != 0 ||
            h_r_int(&I[2], "EXISTS leased:lock:{f}") != 0) &&
           h_now_ms() < deadline) {
        usleep(20000);
    }
    ck_assert_int_eq(h_r_int(&I[1], "EXISTS leased:lock:{f}"), 0);
    ck_assert_int_eq(h_r_int(&I[2], "EXISTS leased:lock:{f}"), 0);
    ck_assert_int_eq(h_r_int(&I[0], "EXISTS leased:lock:{f}"), 1);
    /* One give-back in the first attempt, two in the second. */
    ck_assert_int_eq(h_stat(c, "redlock_undone"), 3);
    h_close(c);
}
END_TEST

/* A holder without expiry on every instance (written by someone else):
 * a waiter looks again now and then, it does not spin. */
START_TEST(test_waiter_no_expiry_holder)
{
    struct h_conn *c;
    json_t *r;

    start_all(1, NULL);
    c = lk_connect(&D1);
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "HSET leased:lock:{n} " HOLDER " 1");
    }
    long long before = r_eval_calls(&I[0]);
    r = lk_lock(c, "n", NULL, 5000, 1500);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    ck_assert_int_eq(jint(r, "ttl_ms"), -1);
    json_decref(r);
    long long calls = r_eval_calls(&I[0]) - before;
    ck_assert_msg(calls <= 5, "%lld attempts in 1.5 s", calls);
    h_close(c);
}
END_TEST

START_TEST(test_lock_lost_with_majority)
{
    struct h_conn *c;
    json_t *r, *ev;

    /* Renewals every 500 ms. */
    start_all(1, "  watchdog_ms: 1500\n");
    c = lk_connect(&D1);
    r = lk_must(c, "l", NULL, NO_TTL, 0);
    json_decref(r);
    r = lk_must(c, "kept", NULL, NO_TTL, 0);
    json_decref(r);
    /* One instance lost: renewals still reach a majority. */
    h_redis_kill(&I[0]);
    struct renewals_want w = {c, h_stat(c, "lock_renewals_ok") + 4, h_now_ms(),
                              1600};
    ck_assert(h_wait_until(renewals_done, &w, 10000));
    ck_assert(h_event(c, 0) == NULL);
    ck_assert_int_eq(instances_with("l"), 2);
    lk_unlock_ok(c, "kept", NULL);

    /* A second one: the next renewal raises lock_lost. */
    h_redis_kill(&I[1]);
    ev = h_lock_lost(c, "l", 3000);
    ck_assert_msg(ev != NULL, "no lock_lost");
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    /* lock.info needs a majority of answers too. */
    h_expect_code(h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "l"),
                  "redis_unavailable", "lock.info");
    h_close(c);
}
END_TEST

/* Waiters of one daemon woken by an unlock in another, and by the
 * holder's lease ending. */
START_TEST(test_waiter_woken)
{
    struct h_conn *a, *b;
    json_t *r;
    long long t0;

    start_all(2, NULL);
    a = lk_connect(&D1);
    b = lk_connect(&D2);
    r = lk_must(a, "w", NULL, NO_TTL, 0); /* a 30 s watchdog lease */
    json_decref(r);
    lk_send(b, 7, "w", NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 1, 5000);
    for (int i = 0; i < NI; i++) {
        h_wait_subscribed(&I[i], "leased:lock:{w}:unlock", 5000);
    }
    t0 = h_now_ms();
    lk_unlock_ok(a, "w", NULL);
    r = h_recv_id(b, 7, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "waiter not granted");
    ck_assert_msg(h_now_ms() - t0 < 3000, "woken after %lld ms",
                  h_now_ms() - t0);
    json_decref(r);
    lk_unlock_ok(b, "w", NULL);

    /* A fixed lease nobody releases: the waiter retries at its end. */
    r = lk_must(a, "x", NULL, 1500, 0);
    json_decref(r);
    t0 = h_now_ms();
    lk_send(b, 8, "x", NULL, 5000, 10000);
    r = h_recv_id(b, 8, 12000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "waiter not granted");
    ck_assert_msg(h_now_ms() - t0 >= 1000, "granted early");
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* The locks do not need redis.*: with it down they are granted and
 * released, and a waiter, without wake-ups, gets the lock when the
 * holder's lease ends. */
START_TEST(test_main_redis_down)
{
    struct h_conn *a, *b;
    json_t *r;

    start_all(1, NULL);
    a = lk_connect(&D1);
    b = lk_connect(&D1);
    h_redis_kill(&R);
    r = lock_until(a, "m", 10000, true, 10000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not granted: %s",
                  h_errcode(r));
    json_decref(r);
    lk_unlock_ok(a, "m", NULL);
    ck_assert_int_eq(instances_with("m"), 0);
    r = lk_must(a, "m", NULL, 1000, 0);
    json_decref(r);
    long long t0 = h_now_ms();
    r = lk_lock(b, "m", NULL, 5000, 8000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "waiter not granted: %s",
                  h_errcode(r));
    ck_assert_int_ge(h_now_ms() - t0, 500);
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- wake-ups from the instances ------------------------------------- */

struct chan_want {
    const char *chan;
    int n; /* live instances with a subscriber on it, at least */
};

static bool
subscribed_on(void *arg)
{
    const struct chan_want *w = arg;
    int n = 0;
    for (int i = 0; i < NI; i++) {
        if (I[i].pid == 0) {
            continue;
        }
        redisReply *r = h_redis_cmd(&I[i], "PUBSUB NUMSUB %s", w->chan);
        n += r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                     r->element[1]->type == REDIS_REPLY_INTEGER &&
                     r->element[1]->integer >= 1
                 ? 1
                 : 0;
        if (r != NULL) {
            freeReplyObject(r);
        }
    }
    return n >= w->n;
}

/* A lock's unlock channel: leased's layout, or Redisson's. */

static void
unlock_chan(char *chan, size_t size, const char *key)
{
    snprintf(chan, size,
             redisson ? "redisson_lock__channel:{%s}"
                      : "leased:lock:{%s}:unlock",
             key);
}

/* Every live instance has the waiter's subscription. Not asserted: where
 * the waiter does not subscribe on the instances, the wake-up bound
 * below is what fails. */
static void
settle_subscribed(const char *key)
{
    char chan[200];
    int live = 0;
    for (int i = 0; i < NI; i++) {
        live += I[i].pid != 0 ? 1 : 0;
    }
    unlock_chan(chan, sizeof chan, key);
    struct chan_want w = {chan, live};
    h_wait_until(subscribed_on, &w, 3000);
}

/* KEY held in D1 under a 30 s watchdog lease, a request waiting for it
 * (wait_ms 20 s) in D2; BEFORE (may be NULL) runs while it waits. D1
 * unlocks: D2's waiter must have the lock within WAKE_MS, far below the
 * lease and wait_ms, so only a wake-up can have done it. */
static void
wake_across(const char *key, void (*before)(void))
{
    struct h_conn *a = lk_connect(&D1), *b = lk_connect(&D2);
    struct h_conn *s = lk_connect(&D2);
    json_t *r = lk_must(a, key, NULL, NO_TTL, 0);
    json_decref(r);
    long long c0 = h_stat(s, "lock_contended");
    lk_send(b, 7, key, NULL, NO_TTL, 20000);
    h_assert_stat(s, "lock_waiters", 1, 5000);
    if (before != NULL) {
        before();
    }
    settle_subscribed(key);
    /* And its try once subscribed has come back (found the lock taken):
     * one still out when the unlock lands could win a minority, and its
     * give-back would publish a wake-up of its own. Not asserted either. */
    long long deadline = h_now_ms() + 3000;
    while (h_stat(s, "lock_contended") < c0 + 2 && h_now_ms() < deadline) {
        usleep(5000);
    }
    h_close(s);
    long long t0 = h_now_ms();
    lk_unlock_ok(a, key, NULL);
    r = h_recv_id(b, 7, 25000);
    long long took = h_now_ms() - t0;
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                  "waiter not granted: %s",
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert_msg(took < WAKE_MS, "waiter woken after %lld ms", took);
    json_decref(r);
    lk_unlock_ok(b, key, NULL);
    h_close(a);
    h_close(b);
}

static void
kill_main_redis(void)
{
    h_redis_kill(&R);
}

/* redis.* (the cache's Redis, shared by both daemons) dies while the
 * waiter waits: the wake-up does not need it. */
START_TEST(test_wake_main_redis_down)
{
    start_all(2, NULL);
    wake_across("wm", kill_main_redis);
}
END_TEST

/* One instance down before the wait begins: the waiter subscribes on the
 * two left and is woken from them. Each daemon has a redis.* of its own,
 * so nothing but the instances joins them. */
START_TEST(test_wake_one_instance_down)
{
    start_all_ex(2, NULL, true);
    h_redis_kill(&I[0]);
    h_wait_redlock(&D1, NI - 1);
    h_wait_redlock(&D2, NI - 1);
    wake_across("wi", NULL);
    ck_assert_int_eq(instances_with("wi"), 0);
}
END_TEST

/* Each daemon's redis.* is a Redis of its own, neither of them an
 * instance: a PUBLISH on either could not reach the other daemon. Each
 * copy of a wake-up (one per instance) wakes once. */
START_TEST(test_wake_separate_main_redis)
{
    struct h_conn *c;

    start_all_ex(2, NULL, true);
    c = lk_connect(&D2);
    wake_across("ws", NULL);
    h_assert_stat(c, "redlock_subscribers_up", NI, 5000);

    /* The copies of one message wake once. Published by hand, two
     * messages three times each, with the lock held (a real unlock may
     * also be followed by the give-back of a try that reached an
     * instance before the unlock did, a wake-up of its own) and two
     * requests queued, so that a late copy would make the next head try
     * again. */
    struct h_conn *a = lk_connect(&D1), *b1 = lk_connect(&D2),
                  *b2 = lk_connect(&D2);
    json_t *r = lk_must(a, "wd", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b1, 1, "wd", NULL, NO_TTL, 20000);
    lk_send(b2, 2, "wd", NULL, NO_TTL, 20000);
    h_assert_stat(c, "lock_waiters", 2, 5000);
    struct chan_want w = {"leased:lock:{wd}:unlock", NI};
    ck_assert(h_wait_until(subscribed_on, &w, 5000));
    long long w0 = h_stat(c, "lock_wakeups");
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "PUBLISH leased:lock:{wd}:unlock x:1");
    }
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "PUBLISH leased:lock:{wd}:unlock x:2");
    }
    long long deadline = h_now_ms() + 3000;
    while (h_stat(c, "lock_wakeups") - w0 < 2 && h_now_ms() < deadline) {
        usleep(10000);
    }
    ck_assert_int_eq(h_stat(c, "lock_wakeups") - w0, 2);
    /* No third, fourth... from the copies. */
    deadline = h_now_ms() + 300;
    while (h_now_ms() < deadline) {
        ck_assert_int_eq(h_stat(c, "lock_wakeups") - w0, 2);
        usleep(20000);
    }
    /* The real unlock still wakes the head, then the next. */
    lk_unlock_ok(a, "wd", NULL);
    r = h_recv_id(b1, 1, 5000);
    ck_assert(r != NULL && jtrue(r, "acquired"));
    json_decref(r);
    lk_unlock_ok(b1, "wd", NULL);
    r = h_recv_id(b2, 2, 5000);
    ck_assert(r != NULL && jtrue(r, "acquired"));
    json_decref(r);
    lk_unlock_ok(b2, "wd", NULL);
    h_close(a);
    h_close(b1);
    h_close(b2);
    h_close(c);
}
END_TEST

static void
restart_instance(void)
{
    h_redis_kill(&I[1]);
    h_wait_redlock(&D2, NI - 1);
    ck_assert_int_eq(h_redis_restart(&I[1]), 0);
    h_wait_redlock(&D2, NI);
}

/* An instance restarted (empty) while the waiter waits: its subscriber
 * comes back, and the unlock still wakes the waiter at once. */
START_TEST(test_wake_instance_restarted)
{
    start_all_ex(2, NULL, true);
    wake_across("wr", restart_instance);
    ck_assert_int_eq(instances_with("wr"), 0);
    struct h_conn *c = lk_connect(&D2);
    h_assert_stat(c, "redlock_subscribers_up", NI, 5000);
    h_close(c);
}
END_TEST

/* The Redisson layout (as RedissonRedLock's RLocks on the instances):
 * the unlock publishes Redisson's "0" on the instances, where Redisson's
 * waiters listen, and a "0" published there by Redisson's unlock wakes
 * our waiter; the copies of one "0" still wake it once. */
START_TEST(test_wake_redisson_layout)
{
    char chan[200];
    redisson = true;
    start_all_ex(2, "  layout: redisson\n", true);
    unlock_chan(chan, sizeof chan, "rk");
    redisContext *sub = h_redis_connect(&I[1]);
    ck_assert(sub != NULL);
    redisReply *rep = redisCommand(sub, "SUBSCRIBE %s", chan);
    ck_assert(rep != NULL);
    freeReplyObject(rep);
    struct h_conn *c = lk_connect(&D2);
    wake_across("rk", NULL);
    ck_assert_int_eq(redisGetReply(sub, (void **)&rep), REDIS_OK);
    ck_assert(rep->type == REDIS_REPLY_ARRAY && rep->elements == 3);
    ck_assert_str_eq(rep->element[0]->str, "message");
    ck_assert_str_eq(rep->element[2]->str, "0");
    freeReplyObject(rep);
    redisFree(sub);

    /* "0" on each instance, as Redisson's unlock of each instance's RLock
     * publishes it: one wake-up (the lock still held here), and once
     * more for the next "0" on each. */
    struct h_conn *a = lk_connect(&D1), *b = lk_connect(&D2);
    json_t *r = lk_must(a, "rj", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b, 3, "rj", NULL, NO_TTL, 20000);
    h_assert_stat(c, "lock_waiters", 1, 5000);
    unlock_chan(chan, sizeof chan, "rj");
    struct chan_want w = {chan, NI};
    ck_assert(h_wait_until(subscribed_on, &w, 5000));
    long long w0 = h_stat(c, "lock_wakeups");
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "PUBLISH %s 0", chan);
    }
    long long deadline = h_now_ms() + 3000;
    while (h_stat(c, "lock_wakeups") - w0 < 1 && h_now_ms() < deadline) {
        usleep(10000);
    }
    deadline = h_now_ms() + 300;
    do {
        ck_assert_int_eq(h_stat(c, "lock_wakeups") - w0, 1);
        usleep(20000);
    } while (h_now_ms() < deadline);
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "DEL rj");
    }
    long long t0 = h_now_ms();
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "PUBLISH %s 0", chan);
    }
    r = h_recv_id(b, 3, 25000);
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                  "waiter not granted: %s",
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert_msg(h_now_ms() - t0 < WAKE_MS, "woken after %lld ms",
                  h_now_ms() - t0);
    json_decref(r);
    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

/* No message at all: the lock is deleted by hand on every instance, then
 * the waiter's subscriber connections to NKILL instances are killed.
 * When they are back (SUBSCRIBED after LOST) the waiter tries again, as
 * a message may have been missed meanwhile, and gets the lock far
 * sooner than the holder's 30 s lease would have let it. */
static void
missed_message(const char *key, int nkill)
{
    struct h_conn *a = lk_connect(&D1), *b = lk_connect(&D2);
    json_t *r = lk_must(a, key, NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b, 9, key, NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 1, 5000);
    char chan[200];
    snprintf(chan, sizeof chan, "leased:lock:{%s}:unlock", key);
    struct chan_want w = {chan, NI};
    ck_assert(h_wait_until(subscribed_on, &w, 5000));
    for (int i = 0; i < NI; i++) {
        h_r_do(&I[i], "DEL leased:lock:{%s}", key);
    }
    long long t0 = h_now_ms();
    for (int i = 0; i < nkill; i++) {
        h_r_do(&I[i], "CLIENT KILL TYPE pubsub");
    }
    r = h_recv_id(b, 9, 25000);
    long long took = h_now_ms() - t0;
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                  "waiter not granted: %s",
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert_msg(took < WAKE_MS, "waiter tried again after %lld ms", took);
    json_decref(r);
    lk_unlock_ok(b, key, NULL);
    h_close(a);
    h_close(b);
}

/* One instance's subscriber lost and back while a majority listened;
 * then two (the majority lost, and back). */
START_TEST(test_wake_after_subscriber_loss)
{
    start_all_ex(2, NULL, true);
    missed_message("wl1", 1);
    missed_message("wl2", 2);
}
END_TEST

/* --- the ticket seller ----------------------------------------------- */

static pid_t
spawn_buyer(const struct h_daemon *d)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid != 0) {
        h_track_pid(pid);
        return pid;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* Buy until sold out; exit status = tickets bought, 200 + n on
     * errors. The stock lives on redis.*, outside the lock's instances. */
    struct h_conn *c = h_connect(d);
    redisContext *rc = redisConnect("127.0.0.1", R.port);
    int bought = 0;
    if (c == NULL || rc == NULL || rc->err) {
        _exit(210);
    }
    for (;;) {
        json_t *r = h_call(c, lk_req("tickets", NULL, 0, -1), 60000);
        bool ok = r != NULL && h_ok(r) && jtrue(r, "acquired");
        json_decref(r);
        if (!ok) {
            _exit(211);
        }
        redisReply *g = redisCommand(rc, "GET stock");
        long long stock = g != NULL && g->type == REDIS_REPLY_STRING
                              ? atoll(g->str)
                              : -1;
        freeReplyObject(g);
        if (stock < 0) {
            _exit(212);
        }
        if (stock > 0) {
            usleep(200); /* the sale takes a moment */
            redisReply *s = redisCommand(rc, "SET stock %lld", stock - 1);
            freeReplyObject(s);
            bought++;
        }
        r = h_call(c, json_pack("{s:s,s:s}", "op", "unlock", "key", "tickets"),
                   60000);
        ok = r != NULL && h_ok(r) && jtrue(r, "released");
        json_decref(r);
        if (!ok) {
            _exit(214);
        }
        if (stock == 0) {
            _exit(bought);
        }
    }
}

START_TEST(test_ticket_seller)
{
    pid_t pids[8];
    int sold = 0;

    start_all(2, NULL);
    h_r_do(&R, "SET stock 100");
    for (int i = 0; i < 8; i++) {
        pids[i] = spawn_buyer(i % 2 ? &D2 : &D1);
    }
    for (int i = 0; i < 8; i++) {
        int st = -1;
        long long deadline = h_now_ms() + 120000;
        while (h_now_ms() < deadline) {
            int status;
            if (waitpid(pids[i], &status, WNOHANG) == pids[i]) {
                st = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
                break;
            }
            usleep(10000);
        }
        h_untrack_pid(pids[i]);
        ck_assert_msg(st >= 0 && st <= 100, "buyer %d ended with %d", i, st);
        sold += st;
    }
    ck_assert_int_eq(sold, 100);
    ck_assert_int_eq(h_r_int(&R, "GET stock"), 0);
    ck_assert_int_eq(instances_with("tickets"), 0);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(grant_keys_and_unlock, 90),
        H_CASE(unlock_request_id, 60),
        H_CASE(extend_and_session_end, 60),
        H_CASE(unix_socket_instance, 60),
        H_CASE(eviction_instance, 90),
        H_CASE(two_down_unavailable, 60),
        H_CASE(failed_attempt_undone, 60),
        H_CASE(waiter_no_expiry_holder, 60),
        H_CASE(lock_lost_with_majority, 60),
        H_CASE(waiter_woken, 60),
        H_CASE(main_redis_down, 60),
        H_CASE(wake_main_redis_down, 60),
        H_CASE(wake_one_instance_down, 60),
        H_CASE(wake_separate_main_redis, 60),
        H_CASE(wake_instance_restarted, 60),
        H_CASE(wake_after_subscriber_loss, 60),
        H_CASE(wake_redisson_layout, 60),
        H_CASE(ticket_seller, 200),
    };

    return H_MAIN(fx, cases);
}
