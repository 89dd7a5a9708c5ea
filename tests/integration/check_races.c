/* The races users report against lock services, each run many times
 * against real daemons and a real Redis:
 *  - an unlock racing a watchdog renewal (renewals constant): no lock key
 *    is left in Redis after the last unlock;
 *  - a waiter's daemon killed (SIGKILL) while its waiter is first in the
 *    queue: the next waiter, on another daemon, is granted within one
 *    lease;
 *  - the near cache while its tracking connection is cut during a write
 *    burst: no read answers a value older than a write already
 *    acknowledged. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"
#include "near_util.h"

#include <signal.h>

static struct h_redis R;
static struct h_daemon D;
static struct h_daemon D2;

static const struct h_fixture fx = {
    .suite = "races",
    .redis = {&R},
    .daemons = {&D, &D2},
};

/* Ids of requests this file numbers itself, clear of h_call's. */
#define OWN_ID 1000000000LL

/* Lock hashes in Redis (leased:lock:{k}, not the fence counters or other
 * keys beside them). */
static long long
lock_hashes(void)
{
    return h_r_int(&R, "EVAL %s 0",
                   "local n = 0 "
                   "for _, k in ipairs(redis.call('keys', "
                   "'leased:lock:{*}')) do "
                   "if redis.call('type', k).ok == 'hash' then n = n + 1 end "
                   "end return n");
}

/* --- 1: unlock racing a renewal ----------------------------------------- */

#define UR_ROUNDS 10000
#define UR_KEYS 200 /* held at once, so that a pass renews many */
#define UR_BATCH 50

static long long ur_not_held;

static void
ur_batch(struct h_conn *c, int first, const char *op)
{
    char key[32];
    for (int i = 0; i < UR_BATCH; i++) {
        snprintf(key, sizeof key, "ur%d", (first + i) % UR_KEYS);
        ck_assert_int_eq(h_send(c, "{s:s,s:s,s:I}", "op", op, "key", key, "id",
                                (json_int_t)(OWN_ID + i)),
                         0);
    }
    for (int i = 0; i < UR_BATCH; i++) {
        json_t *r = h_recv_id(c, OWN_ID + i, T_MS);
        ck_assert_msg(r != NULL, "no reply to %s", op);
        /* A lease as short as this one runs out when a loaded machine
         * keeps the daemon from renewing it: lost (and counted), so not
         * held at the unlock. */
        if (strcmp(op, "unlock") == 0 && h_errcode(r) != NULL &&
            strcmp(h_errcode(r), "not_held") == 0) {
            ur_not_held++;
        } else {
            ck_assert_msg(h_ok(r), "%s: %s", op, h_errcode(r));
        }
        if (strcmp(op, "lock") == 0) {
            ck_assert_msg(jtrue(r, "acquired"), "lock not acquired");
        }
        json_decref(r);
    }
}

/* A short lock.watchdog_ms (300 ms, a pass every 100 ms over 200 held
 * locks, pipelined on one Redis connection): unlocks keep meeting
 * renewals on their way. */
START_TEST(test_unlock_races_renewal)
{
    char yaml[160];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  connections: 1\n"
             "lock:\n  watchdog_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    struct h_conn *c = lk_connect(&D);
    for (int k = 0; k < UR_KEYS; k += UR_BATCH) {
        ur_batch(c, k, "lock");
    }
    ck_assert_int_eq(lock_hashes(), UR_KEYS);
    long long renewed = h_stat(c, "lock_renewals_ok");
    for (int n = 0; n < UR_ROUNDS; n += UR_BATCH) {
        ur_batch(c, n, "unlock");
        ur_batch(c, n, "lock");
    }
    for (int k = 0; k < UR_KEYS; k += UR_BATCH) {
        ur_batch(c, k, "unlock");
    }
    /* Renewals ran all along, and none found a lock gone: a lock not
     * held at its unlock was one the daemon gave up and said so. */
    ck_assert_int_gt(h_stat(c, "lock_renewals_ok"), renewed + UR_KEYS);
    ck_assert_int_le(ur_not_held, h_stat(c, "lock_lost"));
    ck_assert_int_eq(h_stat(c, "lock_renewals_failed"), 0);
    /* A lock and unlock on the same (only) Redis connection come after
     * every renewal the daemon sent before them. */
    json_decref(lk_must(c, "ur-last", NULL, NO_TTL, 0));
    lk_unlock_ok(c, "ur-last", NULL);
    ck_assert_int_eq(lock_hashes(), 0);
    h_close(c);
}
END_TEST

/* --- 2: a waiter's daemon killed while first in the queue ---------------- */

/* Each round restarts the killed daemon (a start-up each) and may wait
 * up to a lease: 100 rounds, not 10,000, keep the case near 20 s. */
#define WD_ROUNDS 100
#define WD_WATCHDOG_MS 1000

/* H on D2 holds "wd"; W1 on D queues first, W2 on D2 second. D dies by
 * SIGKILL as H unlocks (round by round a little earlier or later, so
 * that the grant to W1 is sometimes in flight): W2 is granted within one
 * lease of the unlock, whoever Redis granted first. */
START_TEST(test_first_waiter_daemon_killed)
{
    char yaml[128];
    snprintf(yaml, sizeof yaml, "lock:\n  watchdog_ms: %d\n", WD_WATCHDOG_MS);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    ck_assert_int_eq(h_daemon_start(&D2, &R, yaml), 0);
    for (int round = 0; round < WD_ROUNDS; round++) {
        struct h_conn *h = lk_connect(&D2);
        struct h_conn *w2 = lk_connect(&D2);
        struct h_conn *w1 = lk_connect(&D);
        json_t *g = lk_lock(h, "wd", NULL, NO_TTL, 0);
        ck_assert_msg(jtrue(g, "acquired"),
                      "round %d: wd is still held (%s, pttl %lld)", round,
                      h_dump(g), h_r_int(&R, "PTTL leased:lock:{wd}"));
        json_decref(g);
        lk_send(w1, OWN_ID, "wd", NULL, NO_TTL, 60000);
        h_assert_stat(w1, "lock_waiters", 1, T_MS);
        lk_send(w2, OWN_ID, "wd", NULL, NO_TTL, 60000);
        h_assert_stat(w2, "lock_waiters", 1, T_MS);

        ck_assert_int_eq(h_send(h, "{s:s,s:s,s:I}", "op", "unlock", "key",
                                "wd", "id", (json_int_t)OWN_ID),
                         0);
        if (round % 3 == 1) {
            /* After the unlock is answered: W1's grant may be out. */
            json_t *r = h_recv_id(h, OWN_ID, T_MS);
            ck_assert_msg(r != NULL && h_ok(r), "unlock failed");
            json_decref(r);
        }
        h_daemon_kill(&D);
        /* Any lease D confirmed began before this. */
        long long t0 = h_now_ms();
        h_close(w1);
        if (round % 3 != 1) {
            json_t *r = h_recv_id(h, OWN_ID, T_MS);
            ck_assert_msg(r != NULL && h_ok(r), "unlock failed");
            json_decref(r);
        }
        json_t *r = h_recv_id(w2, OWN_ID, WD_WATCHDOG_MS + T_MS);
        long long dt = h_now_ms() - t0;
        ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                      "round %d: the second waiter was not granted", round);
        json_decref(r);
        /* One lease (the dead daemon's grant, if Redis made it, or
         * renewed it), plus what a loaded machine adds to the retry at
         * its end. */
        ck_assert_msg(dt <= WD_WATCHDOG_MS + 500,
                      "round %d: the second waiter waited %lld ms", round, dt);
        lk_unlock_ok(w2, "wd", NULL);
        h_close(h);
        h_close(w2);
        ck_assert_int_eq(h_daemon_restart(&D), 0);
    }
}
END_TEST

/* --- 3: near cache, tracking connection cut during a write burst -------- */

#define NC_ROUNDS 10000
#define NC_KILL_EVERY 100

#define NC_YAML                                                               \
    "cache:\n  ttl_jitter: 0\n  double_delete_ms: 0\n"                        \
    "  near: { enabled: true }\n"

/* Kill D's tracking connection (CLIENT KILL) once it is back from the
 * last kill (C is a connection to D); whether there was one. */
static bool
kill_tracking(struct h_conn *c)
{
    h_assert_stat(c, "near_tracking", 1, T_MS);
    long long id = near_client_id(&R, "track");
    if (id > 0) {
        h_r_do(&R, "CLIENT KILL ID %lld", id);
    }
    return id > 0;
}

static long long
value_of(const json_t *r)
{
    const char *v = jstr(r, "value");
    return jtrue(r, "hit") && v != NULL ? atoll(v) : -1;
}

/* Writer W and reader Q on D (near cache on). Each round: a read goes
 * out, then the write of round N; once the write is acknowledged, a read
 * must answer N or later, from Redis or from the near cache. Every
 * NC_KILL_EVERY rounds the tracking connection is killed while the read
 * and the write are in flight, so the invalidation of what the read
 * carries may be lost with it. */
START_TEST(test_near_tracking_cut_during_writes)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NC_YAML), 0);
    struct h_conn *w = h_connect_ok(&D);
    struct h_conn *q = h_connect_ok(&D);
    h_assert_stat(w, "near_tracking", 1, T_MS);
    long long kills = 0, near = 0;
    char val[24];
    /* The read of round 1 has a value to find. */
    json_decref(h_must(h_callf(w, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                               "key", "nc", "value", "0")));
    for (long long n = 1; n <= NC_ROUNDS; n++) {
        snprintf(val, sizeof val, "%lld", n);
        ck_assert_int_eq(h_send(q, "{s:s,s:s,s:b,s:I}", "op", "cache.get",
                                "key", "nc", "lease", 0, "id",
                                (json_int_t)OWN_ID),
                         0);
        ck_assert_int_eq(h_send(w, "{s:s,s:s,s:s,s:I}", "op", "cache.set",
                                "key", "nc", "value", val, "id",
                                (json_int_t)OWN_ID),
                         0);
        kills += n % NC_KILL_EVERY == 0 && kill_tracking(q);
        json_t *r = h_recv_id(q, OWN_ID, T_MS);
        ck_assert_msg(r != NULL && h_ok(r), "read: %s", h_dump(r));
        ck_assert_msg(value_of(r) >= n - 1, "round %lld: read %s", n,
                      h_dump(r));
        near += jtrue(r, "near");
        json_decref(r);
        r = h_recv_id(w, OWN_ID, T_MS);
        ck_assert_msg(r != NULL && h_ok(r), "write: %s", h_dump(r));
        json_decref(r);
        /* The write of N is acknowledged. */
        r = near_get(q, "nc");
        ck_assert_msg(value_of(r) >= n,
                      "round %lld: read %s after the write of %lld was "
                      "acknowledged",
                      n, h_dump(r), n);
        near += jtrue(r, "near");
        json_decref(r);
    }
    /* The race was there to lose: the tracking connection was cut, and
     * reads were served from the near cache. */
    ck_assert_int_eq(kills, NC_ROUNDS / NC_KILL_EVERY);
    ck_assert_int_gt(near, 0);
    h_close(w);
    h_close(q);
}
END_TEST

/* Q's reads of "nc" on D: each answers no older a value than the last
 * one it saw (LAST), which moves on. Returns the value. */
static long long
nc_read_on(struct h_conn *q, json_int_t id, long long *last, long long *near)
{
    json_t *r = h_recv_id(q, id, T_MS);
    ck_assert_msg(r != NULL && h_ok(r), "read: %s", h_dump(r));
    long long v = value_of(r);
    ck_assert_msg(v >= *last, "read %s after %lld was read", h_dump(r), *last);
    *last = v;
    *near += jtrue(r, "near");
    json_decref(r);
    return v;
}

/* Until Q on D reads N or later (D has taken in the invalidation of the
 * older values); asserts it comes within NEAR_T_MS. */
static void
nc_read_until(struct h_conn *q, long long n, long long *last, long long *near)
{
    long long deadline = h_now_ms() + NEAR_T_MS;
    while (nc_read_on(q, 0, last, near) < n) {
        ck_assert_msg(h_now_ms() < deadline,
                      "D still answers %lld, %lld was written through D2",
                      *last, n);
        ck_assert_int_eq(h_send(q, "{s:s,s:s,s:b,s:I}", "op", "cache.get",
                                "key", "nc", "lease", 0, "id", (json_int_t)0),
                         0);
    }
}

/* The same through another daemon: W on D2 (no near cache, so the only
 * tracking connection is D's) writes, Q on D reads. D hears
 * of the writes only through its tracking connection, killed every
 * NC_KILL_EVERY rounds with a read and a write in flight. Every read
 * answers a value no older than one read before it, and once D answered
 * a write's value, the older ones are gone for good; D catches up with
 * each acknowledged write within NEAR_T_MS. */
START_TEST(test_near_tracking_cut_other_daemon_writes)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NC_YAML), 0);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct h_conn *w = h_connect_ok(&D2);
    struct h_conn *q = h_connect_ok(&D);
    h_assert_stat(q, "near_tracking", 1, T_MS);
    long long kills = 0, near = 0, last = -1;
    char val[24];
    for (long long n = 1; n <= NC_ROUNDS; n++) {
        snprintf(val, sizeof val, "%lld", n);
        ck_assert_int_eq(h_send(q, "{s:s,s:s,s:b,s:I}", "op", "cache.get",
                                "key", "nc", "lease", 0, "id",
                                (json_int_t)OWN_ID),
                         0);
        /* Cut before the write: its invalidation goes to a dead
         * connection. */
        kills += n % NC_KILL_EVERY == 0 && kill_tracking(q);
        ck_assert_int_eq(h_send(w, "{s:s,s:s,s:s,s:I}", "op", "cache.set",
                                "key", "nc", "value", val, "id",
                                (json_int_t)OWN_ID),
                         0);
        nc_read_on(q, OWN_ID, &last, &near);
        json_t *r = h_recv_id(w, OWN_ID, T_MS);
        ck_assert_msg(r != NULL && h_ok(r), "write: %s", h_dump(r));
        json_decref(r);
        ck_assert_int_eq(h_send(q, "{s:s,s:s,s:b,s:I}", "op", "cache.get",
                                "key", "nc", "lease", 0, "id", (json_int_t)0),
                         0);
        nc_read_until(q, n, &last, &near);
    }
    ck_assert_int_eq(kills, NC_ROUNDS / NC_KILL_EVERY);
    ck_assert_int_gt(near, 0);
    h_close(w);
    h_close(q);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(unlock_races_renewal, 120),
        H_CASE(first_waiter_daemon_killed, 120),
        H_CASE(near_tracking_cut_during_writes, 120),
        H_CASE(near_tracking_cut_other_daemon_writes, 120),
    };

    return H_MAIN(fx, cases);
}
