/* Sentinel mode against real processes: a master, one replica and three
 * Sentinels (redis-server --sentinel), the real leased following them.
 * Discovery past a dead Sentinel and one that does not know the name; a
 * master killed under load and a forced SENTINEL FAILOVER followed with
 * every request answered within its bound; a journaled invalidation
 * reaching the new master; a lock lost to the failover reported with
 * reason "failover" while a replicated one is kept, fences that do not
 * go backwards, and the near cache flushed and tracked again on the new
 * master. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MS 5000
#define NS 3
/* redis.timeout_ms of the daemon, and what an answer may take on top of
 * it on a loaded machine. */
#define TIMEOUT_MS 500
#define ANSWER_MS (TIMEOUT_MS + 2500)
#define FAILOVER_MS 30000

static struct h_redis M, Rp;
static struct h_redis S[NS];
static struct h_redis Lone; /* a Sentinel that monitors nothing */
static struct h_redis Liar; /* one that names the replica as the master */
static struct h_daemon D;

static void
stop_sentinels(void)
{
    for (int i = 0; i < NS; i++) {
        h_redis_stop(&S[i]);
    }
    h_redis_stop(&Lone);
    h_redis_stop(&Liar);
}

static const struct h_fixture fx = {
    .suite = "sentinel",
    .redis = {&M, &Rp},
    .daemons = {&D},
    .teardown = stop_sentinels,
};

/* Master, replica and Sentinels up, then leased on them with EXTRA YAML
 * sections (may be ""); the first two addresses are a closed port and a
 * Sentinel that does not know the name. */
static void
start_all(const char *extra)
{
    char replicaof[64], yaml[2048];
    ck_assert_int_eq(h_redis_start(&M, NULL), 0);
    snprintf(replicaof, sizeof replicaof, "--replicaof 127.0.0.1 %d", M.port);
    ck_assert_int_eq(h_redis_start(&Rp, replicaof), 0);
    ck_assert(h_wait_until(h_replica_linked, &M, 10000));
    for (int i = 0; i < NS; i++) {
        ck_assert_int_eq(h_sentinel_start(&S[i], M.port, "mymaster"), 0);
    }
    ck_assert_int_eq(h_sentinel_start(&Lone, 0, NULL), 0);
    ck_assert_msg(h_sentinels_ready(S, NS, 1, 20000),
                  "the Sentinels did not find each other");
    snprintf(yaml, sizeof yaml,
             "redis:\n  mode: sentinel\n  master_name: mymaster\n"
             "  timeout_ms: %d\n  addresses:\n"
             "    - 127.0.0.1:%d\n    - 127.0.0.1:%d\n"
             "    - 127.0.0.1:%d\n    - 127.0.0.1:%d\n    - 127.0.0.1:%d\n"
             "%s",
             TIMEOUT_MS, h_free_port(), Lone.port, S[0].port, S[1].port,
             S[2].port, extra);
    ck_assert_int_eq(h_daemon_start(&D, &M, yaml), 0);
}

static void
wait_master(struct h_conn *c, int port)
{
    ck_assert_msg(h_wait_master(c, port, FAILOVER_MS),
                  "the daemon did not follow to port %d", port);
}

static json_t *
lock_key(struct h_conn *c, const char *key)
{
    return h_callf(c, ANSWER_MS, "{s:s,s:s}", "op", "lock", "key", key);
}

/* The lock KEY, which must be granted; its fence. */
static long long
must_lock(struct h_conn *c, const char *key)
{
    json_t *r = lock_key(c, key);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "lock %s not granted",
                  key);
    long long fence = jint(r, "fence");
    json_decref(r);
    return fence;
}

/* The lock KEY of C survived the failover: no lock_lost for it within
 * WITHIN_MS, and the new master has it as C's. */
static void
assert_kept(struct h_conn *c, const char *key, int within_ms)
{
    json_t *ev = h_lock_lost(c, key, within_ms);
    ck_assert_msg(ev == NULL, "lock %s lost: %s", key,
                  ev != NULL ? jstr(ev, "reason") : "");
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", key);
    ck_assert(h_ok(r) && jtrue(r, "locked") && jtrue(r, "mine"));
    json_decref(r);
}

/* Everything the master acknowledged has reached the replica. */
static void
replicated(void)
{
    ck_assert_int_eq(h_r_int(&M, "WAIT 1 5000"), 1);
}

/* Several sessions send requests together while the master changes:
 * every one is answered within its bound (redis_unavailable or success),
 * until service is back on the new master. */
#define LOAD_SESSIONS 4
/* Request ids of the load, apart from those h_call numbers. */
#define LOAD_ID 1000000

static void
load_until_moved(int new_port)
{
    struct h_conn *cs[LOAD_SESSIONS];
    for (int i = 0; i < LOAD_SESSIONS; i++) {
        cs[i] = h_connect_ok(&D);
    }
    long long end = h_now_ms() + FAILOVER_MS;
    int n = 0, ok_after = 0;
    while (h_now_ms() < end) {
        char keys[LOAD_SESSIONS][32];
        bool held[LOAD_SESSIONS];
        long long t0 = h_now_ms();
        for (int i = 0; i < LOAD_SESSIONS; i++) {
            snprintf(keys[i], sizeof keys[i], "load:%d:%d", i, n);
            ck_assert_int_eq(h_send(cs[i], "{s:s,s:s,s:i}", "op", "lock",
                                    "key", keys[i], "id", LOAD_ID + 3 * n),
                             0);
            ck_assert_int_eq(h_send(cs[i], "{s:s,s:s,s:b,s:i}", "op",
                                    "cache.get", "key", "load", "lease", 0,
                                    "id", LOAD_ID + 3 * n + 1),
                             0);
        }
        /* All were sent at T0, so each must be in by T0 + the bound. */
        for (int i = 0; i < LOAD_SESSIONS; i++) {
            json_t *r = h_recv_id(cs[i], LOAD_ID + 3 * n, ANSWER_MS);
            ck_assert_msg(r != NULL && h_now_ms() - t0 <= ANSWER_MS,
                          "lock %s not answered within %d ms", keys[i],
                          ANSWER_MS);
            held[i] = h_ok(r);
            if (!held[i]) {
                ck_assert_str_eq(h_errcode(r), "redis_unavailable");
            }
            json_decref(r);
            r = h_recv_id(cs[i], LOAD_ID + 3 * n + 1, ANSWER_MS);
            ck_assert_msg(r != NULL && h_now_ms() - t0 <= ANSWER_MS,
                          "cache.get not answered within %d ms", ANSWER_MS);
            json_decref(r);
        }
        t0 = h_now_ms();
        for (int i = 0; i < LOAD_SESSIONS; i++) {
            if (held[i]) {
                ck_assert_int_eq(h_send(cs[i], "{s:s,s:s,s:i}", "op", "unlock",
                                        "key", keys[i], "id",
                                        LOAD_ID + 3 * n + 2),
                                 0);
            }
        }
        for (int i = 0; i < LOAD_SESSIONS; i++) {
            if (held[i]) {
                json_t *r = h_recv_id(cs[i], LOAD_ID + 3 * n + 2, ANSWER_MS);
                ck_assert_msg(r != NULL && h_now_ms() - t0 <= ANSWER_MS,
                              "unlock %s not answered within %d ms", keys[i],
                              ANSWER_MS);
                json_decref(r);
            }
        }
        n++;
        if (h_wait_master(cs[0], new_port, 0) && ++ok_after >= 5) {
            for (int i = 0; i < LOAD_SESSIONS; i++) {
                h_close(cs[i]);
            }
            return;
        }
    }
    ck_abort_msg("service did not resume on port %d", new_port);
}

START_TEST(test_discovery)
{
    start_all("");
    struct h_conn *c = h_connect_ok(&D);
    wait_master(c, M.port);
    must_lock(c, "k");
    ck_assert_int_eq(h_r_int(&M, "EXISTS %s", "leased:lock:{k}"), 1);
    /* Both useless Sentinels were passed over, with the reason. */
    ck_assert(h_log_has(&D, "sentinel skipped"));
    ck_assert(h_log_has(&D, "does not know redis.master_name"));
    h_close(c);
}
END_TEST

/* A Sentinel that disagrees with the others (it names the replica) is
 * asked first: the connections find with ROLE that the server is no
 * master, and the next Sentinel is asked. */
START_TEST(test_disagreeing_sentinel)
{
    char replicaof[64], yaml[1024];
    ck_assert_int_eq(h_redis_start(&M, NULL), 0);
    snprintf(replicaof, sizeof replicaof, "--replicaof 127.0.0.1 %d", M.port);
    ck_assert_int_eq(h_redis_start(&Rp, replicaof), 0);
    ck_assert(h_wait_until(h_replica_linked, &M, 10000));
    ck_assert_int_eq(h_sentinel_start(&Liar, Rp.port, "mymaster"), 0);
    ck_assert_int_eq(h_sentinel_start(&S[0], M.port, "mymaster"), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  mode: sentinel\n  timeout_ms: %d\n"
             "  addresses: [\"127.0.0.1:%d\", \"127.0.0.1:%d\"]\n",
             TIMEOUT_MS, Liar.port, S[0].port);
    ck_assert_int_eq(h_daemon_start(&D, NULL, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    wait_master(c, M.port);
    long long end = h_now_ms() + FAILOVER_MS;
    bool granted = false;
    while (!granted && h_now_ms() < end) {
        json_t *r = lock_key(c, "k");
        granted = r != NULL && jtrue(r, "acquired");
        json_decref(r);
    }
    ck_assert_msg(granted, "no lock on the real master");
    ck_assert_int_eq(h_r_int(&M, "EXISTS %s", "leased:lock:{k}"), 1);
    ck_assert(h_log_has(&D, "redis is not a master"));
    h_close(c);
}
END_TEST

/* The master is SIGKILLed while sessions work: every request is answered
 * in bounded time, service moves to the promoted replica, a lock that had
 * replicated is kept, and an invalidation journaled meanwhile reaches the
 * new master. */
START_TEST(test_master_killed)
{
    start_all("lock:\n  watchdog_ms: 10000\n");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    wait_master(a, M.port);
    must_lock(a, "kept");
    json_t *r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "cache.set", "key",
                        "x", "value", "old", "ttl_ms", 600000);
    ck_assert(h_ok(r));
    json_decref(r);
    replicated();

    h_redis_kill(&M);
    r = h_callf(b, ANSWER_MS, "{s:s,s:s,s:i}", "op", "cache.invalidate", "key",
                "x", "delay_ms", 0);
    ck_assert_msg(r != NULL && h_ok(r), "invalidate not acknowledged");
    json_decref(r);
    load_until_moved(Rp.port);

    /* The journal's delete reached the new master. */
    long long end = h_now_ms() + 10000;
    while (h_r_int(&Rp, "EXISTS %s", "leased:cache:{x}") != 0 &&
           h_now_ms() < end) {
        h_assert_ping(b);
    }
    ck_assert_int_eq(h_r_int(&Rp, "EXISTS %s", "leased:cache:{x}"), 0);

    /* The replicated lock survived: no lock_lost, still held. */
    assert_kept(a, "kept", 2000);
    ck_assert_int_ge(h_stat(a, "redis_failovers"), 1);
    ck_assert(h_log_has(&D, "moved from"));
    h_close(a);
    h_close(b);
}
END_TEST

/* A grant the replica never saw (it was stopped and cut off while the
 * master granted it) is lost when that replica is promoted: the holder
 * hears lock_lost "failover", a lock that did replicate is kept, and the
 * next grant of the lost key carries a higher fence than the lost one. */
START_TEST(test_lock_lost_to_failover)
{
    start_all("lock:\n  watchdog_ms: 10000\n");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    wait_master(a, M.port);
    must_lock(a, "kept");
    replicated();

    /* Stopped, and cut off by the master, so that not even what the
     * kernel holds for it carries the next grant. */
    kill(Rp.pid, SIGSTOP);
    h_r_do(&M, "CLIENT KILL TYPE replica");
    long long lost_fence = must_lock(a, "lost");
    h_redis_kill(&M);
    kill(Rp.pid, SIGCONT);

    json_t *ev = h_lock_lost(a, "lost", FAILOVER_MS);
    ck_assert_msg(ev != NULL, "no lock_lost for the unreplicated lock");
    ck_assert_str_eq(jstr(ev, "reason"), "failover");
    json_decref(ev);
    wait_master(b, Rp.port);
    assert_kept(a, "kept", 2000);

    long long fence = must_lock(b, "lost");
    ck_assert_int_gt(fence, lost_fence);
    h_close(a);
    h_close(b);
}
END_TEST

/* Take the one permit of semaphore KEY on C (watchdog) and insist. */
static void
must_sem(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "sem.acquire", "key",
                        key, "limit", 1);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "sem %s not granted",
                  key);
    json_decref(r);
}

/* The next sem_lost for KEY on C within TIMEOUT_MS, or NULL. */
static json_t *
sem_lost(struct h_conn *c, const char *key, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - h_now_ms();
        json_t *ev = left > 0 ? h_event(c, (int)left) : NULL;
        if (ev == NULL || (jstr(ev, "event") != NULL &&
                           strcmp(jstr(ev, "event"), "sem_lost") == 0 &&
                           strcmp(jstr(ev, "key"), key) == 0)) {
            return ev;
        }
        json_decref(ev);
    }
}

/* As test_lock_lost_to_failover, for semaphore grants under SEM_LAYOUT
 * (2: one-permit grants are bare zset members): the one the promoted
 * replica never saw is lost with reason failover, the one that
 * replicated is kept. */
static void
sem_lost_to_failover(int sem_layout)
{
    char yaml[64];

    snprintf(yaml, sizeof yaml,
             "lock:\n  watchdog_ms: 10000\n  sem_layout: %d\n", sem_layout);
    start_all(yaml);
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    wait_master(a, M.port);
    must_sem(a, "kept");
    replicated();

    kill(Rp.pid, SIGSTOP);
    h_r_do(&M, "CLIENT KILL TYPE replica");
    must_sem(a, "lost");
    h_redis_kill(&M);
    kill(Rp.pid, SIGCONT);

    json_t *ev = sem_lost(a, "lost", FAILOVER_MS);
    ck_assert_msg(ev != NULL, "no sem_lost for the unreplicated grant");
    ck_assert_str_eq(jstr(ev, "reason"), "failover");
    json_decref(ev);
    wait_master(b, Rp.port);
    ev = sem_lost(a, "kept", 2000);
    ck_assert_msg(ev == NULL, "the replicated grant was lost: %s",
                  ev != NULL ? jstr(ev, "reason") : "");
    h_close(a);
    h_close(b);
}

START_TEST(test_sem_lost_to_failover)
{
    sem_lost_to_failover(1);
}
END_TEST

START_TEST(test_sem_lost_to_failover_layout2)
{
    sem_lost_to_failover(2);
}
END_TEST

/* SENTINEL FAILOVER: the daemon follows the switch it is told of. */
START_TEST(test_forced_failover)
{
    start_all("");
    struct h_conn *c = h_connect_ok(&D);
    wait_master(c, M.port);
    must_lock(c, "before");
    replicated();
    redisReply *r = h_redis_cmd(&S[0], "SENTINEL FAILOVER mymaster");
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_STATUS, "SENTINEL FAILOVER: %s",
                  r->str);
    freeReplyObject(r);
    load_until_moved(Rp.port);
    assert_kept(c, "before", 1000);
    h_close(c);
}
END_TEST

/* The eviction check follows the master: a replica set to allkeys-lru
 * is found unsafe once a failover made it the master. */
START_TEST(test_eviction_after_failover)
{
    start_all("");
    struct h_conn *c = h_connect_ok(&D);
    wait_master(c, M.port);
    freeReplyObject(
        h_redis_cmd(&Rp, "CONFIG SET maxmemory-policy allkeys-lru"));
    h_assert_stat(c, "redis_eviction_unsafe", 0, T_MS);
    redisReply *r = h_redis_cmd(&S[0], "SENTINEL FAILOVER mymaster");
    ck_assert_ptr_nonnull(r);
    ck_assert_msg(r->type == REDIS_REPLY_STATUS, "SENTINEL FAILOVER: %s",
                  r->str);
    freeReplyObject(r);
    wait_master(c, Rp.port);
    h_assert_stat(c, "redis_eviction_unsafe", 1, FAILOVER_MS);
    char needle[64];
    snprintf(needle, sizeof needle, "redis=127.0.0.1:%d maxmemory_policy",
             Rp.port);
    ck_assert(h_wait_log(&D, needle, T_MS));
    h_close(c);
}
END_TEST

/* Read KEY until it answers VALUE, and near when NEAR (redis_unavailable
 * is waited out: the connections may be moving). */
static void
near_read_until(struct h_conn *c, const char *key, const char *value,
                bool near)
{
    long long end = h_now_ms() + FAILOVER_MS;
    for (;;) {
        json_t *r = h_callf(c, ANSWER_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                            "key", key, "lease", 0);
        ck_assert_msg(r != NULL, "cache.get not answered");
        const char *v = jstr(r, "value");
        bool done = h_ok(r) && v != NULL && strcmp(v, value) == 0 &&
                    (!near || jtrue(r, "near"));
        json_decref(r);
        if (done) {
            return;
        }
        ck_assert_msg(h_now_ms() < end, "%s never read %s%s", key, value,
                      near ? " near" : "");
    }
}

/* The near cache follows the master: a failover flushes it, tracking
 * starts again on the new master, and writes there evict; under either
 * cache.layout (2: the entry a string, read by GET). */
static void
near_cache_failover(int layout)
{
    char yaml[96];
    snprintf(yaml, sizeof yaml,
             "cache:\n  layout: %d\n  near: { enabled: true }\n", layout);
    start_all(yaml);
    struct h_conn *c = h_connect_ok(&D);
    wait_master(c, M.port);
    h_assert_stat(c, "near_tracking", 1, T_MS);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key",
                        "n", "value", "v1");
    ck_assert(h_ok(r));
    json_decref(r);
    near_read_until(c, "n", "v1", true);
    replicated();
    long long flushes = h_stat(c, "near_flushes");
    redisReply *fo = h_redis_cmd(&S[0], "SENTINEL FAILOVER mymaster");
    ck_assert_ptr_nonnull(fo);
    freeReplyObject(fo);
    wait_master(c, Rp.port);
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    h_assert_stat(c, "near_tracking", 1, FAILOVER_MS);
    near_read_until(c, "n", "v1", true);
    /* A write behind the daemon's back, in the entry's layout. */
    if (layout == 2) {
        h_r_do(&Rp, "SET leased:cache:{n} %b KEEPTTL", "\xf5Lv1::v2",
               (size_t)8);
    } else {
        h_r_do(&Rp, "HSET leased:cache:{n} v v2");
    }
    near_read_until(c, "n", "v2", false);
    h_close(c);
}

START_TEST(test_near_cache_failover)
{
    near_cache_failover(1);
}
END_TEST

START_TEST(test_near_cache_failover_layout2)
{
    near_cache_failover(2);
}
END_TEST

/* A waiter queued before the master dies is woken by an unlock on the new
 * master: its wake-up subscription moved there too. */
START_TEST(test_waiter_follows)
{
    start_all("");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    wait_master(a, M.port);
    must_lock(a, "w");
    replicated();
    const char *line = "{\"op\":\"lock\",\"key\":\"w\",\"wait_ms\":60000,"
                       "\"id\":9}\n";
    ck_assert_int_eq(h_send_raw(b, line, strlen(line)), 0);
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    /* Its first try, and the one after its subscription was confirmed,
     * are done: it waits idle (a try in flight when the master dies is
     * answered redis_unavailable, as on one Redis). */
    ck_assert(h_wait_stat_min(a, "lock_contended", 2, T_MS));

    h_redis_kill(&M);
    wait_master(a, Rp.port);
    /* The holder's unlock on the new master (retried while the daemon's
     * connections come up there). */
    long long end = h_now_ms() + FAILOVER_MS;
    json_t *r = NULL;
    bool released = false;
    while (!released && h_now_ms() < end) {
        json_decref(r);
        r = h_callf(a, ANSWER_MS, "{s:s,s:s}", "op", "unlock", "key", "w");
        released = r != NULL && h_ok(r) && jtrue(r, "released");
    }
    ck_assert_msg(released, "unlock on the new master: %s",
                  r != NULL ? h_errcode(r) : "no answer");
    json_decref(r);
    /* Woken by the unlock message, long before the lease (30 s) ends. */
    r = h_recv_id(b, 9, T_MS);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "the waiter was not woken on the new master");
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* Sentinels that require a password get redis.sentinel_password (the
 * master has none of its own here); a wrong one is refused at the
 * handshake, said in the log, and no master is known. */
START_TEST(test_sentinel_auth)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&M, NULL), 0);
    ck_assert_int_eq(h_sentinel_start_ex(&S[0], M.port, "mymaster",
                                         "requirepass s3cret\n"),
                     0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  mode: sentinel\n  timeout_ms: %d\n"
             "  addresses: [\"127.0.0.1:%d\"]\n"
             "  sentinel_password: s3cret\n",
             TIMEOUT_MS, S[0].port);
    ck_assert_int_eq(h_daemon_start(&D, &M, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    wait_master(c, M.port);
    must_lock(c, "k");
    h_close(c);
    h_daemon_cleanup(&D);

    snprintf(yaml, sizeof yaml,
             "redis:\n  mode: sentinel\n  timeout_ms: %d\n"
             "  addresses: [\"127.0.0.1:%d\"]\n"
             "  sentinel_password: wrong\n",
             TIMEOUT_MS, S[0].port);
    memset(&D, 0, sizeof D);
    ck_assert_int_eq(h_daemon_start(&D, NULL, yaml), 0);
    c = h_connect_ok(&D);
    json_t *r = lock_key(c, "k2");
    ck_assert_ptr_nonnull(r);
    h_expect_code(r, "redis_unavailable",
                  "lock with a wrong Sentinel password");
    ck_assert(h_wait_log(&D, "step=auth", T_MS));
    ck_assert(h_wait_log(&D, "no Sentinel named a master", T_MS));
    ck_assert(!h_log_has(&D, "s3cret") && !h_log_has(&D, "wrong\""));
    h_close(c);
}
END_TEST

/* With no Sentinel reachable, ops answer redis_unavailable at once, and
 * the daemon keeps asking. */
START_TEST(test_no_sentinel)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&M, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  mode: sentinel\n  timeout_ms: %d\n"
             "  addresses: [\"127.0.0.1:%d\"]\n",
             TIMEOUT_MS, h_free_port());
    ck_assert_int_eq(h_daemon_start(&D, NULL, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    long long t0 = h_now_ms();
    json_t *r = lock_key(c, "k");
    ck_assert_ptr_nonnull(r);
    h_expect_code(r, "redis_unavailable", "lock without a master");
    ck_assert_int_le(h_now_ms() - t0, ANSWER_MS);
    ck_assert(h_wait_log(&D, "no Sentinel named a master", T_MS));
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(discovery, 90),
        H_CASE(disagreeing_sentinel, 90),
        H_CASE(master_killed, 120),
        H_CASE(lock_lost_to_failover, 120),
        H_CASE(sem_lost_to_failover, 120),
        H_CASE(sem_lost_to_failover_layout2, 120),
        H_CASE(forced_failover, 120),
        H_CASE(eviction_after_failover, 120),
        H_CASE(waiter_follows, 120),
        H_CASE(sentinel_auth, 60),
        H_CASE(no_sentinel, 60),
        H_CASE(near_cache_failover, 120),
        H_CASE(near_cache_failover_layout2, 120),
    };
    return H_MAIN(fx, cases);
}
