/* Locks when Redis misbehaves or holds data leased did not write: unlock
 * and extend whose answer comes too late ("outcome":"unknown", settled by
 * the late answer), the cause of a failure in the message, the release
 * after an acquisition that timed out, tokens and hashes that are not
 * locks (both layouts), WAIT on connections of its own, and foreign data
 * reported as wrong_type rather than internal. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"

#include <unistd.h>

static struct h_redis R;
static struct h_redis R2;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "lock_faults",
    .redis = {&R, &R2},
    .daemons = {&D},
};

/* A Redisson holder field: a UUID, a colon, a thread id. */
#define JAVA_HOLDER "4f0c2d1e-7a3b-4c5d-9e8f-0a1b2c3d4e5f:1"
#define TOK32 "0123456789abcdef0123456789abcdef"

/* Redis with DEBUG allowed, and leased with REDIS_YAML (the body of the
 * redis section, after its address) and EXTRA (other sections). */
static void
start(const char *redis_yaml, const char *extra)
{
    char yaml[1024];
    ck_assert_int_eq(h_redis_start(&R, "--enable-debug-command yes"), 0);
    snprintf(yaml, sizeof yaml, "redis:\n  address: \"127.0.0.1:%d\"\n%s%s",
             R.port, redis_yaml != NULL ? redis_yaml : "",
             extra != NULL ? extra : "");
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
}

/* After Redis woke, the daemon reconnects (with backoff). */
static void
wait_connected(struct h_conn *c)
{
    ck_assert_msg(h_wait_stat(c, "redis_connected", 1, 15000),
                  "leased did not reconnect");
}

/* --- 1: unlock and extend with no answer in time ------------------------ */

START_TEST(test_unlock_outcome_unknown)
{
    struct h_conn *a, *b;
    json_t *r;
    redisContext *z;

    start("  timeout_ms: 500\n  connections: 1\n", NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "u1", NULL, 60000, 0);
    json_decref(r);
    r = lk_must(a, "e1", NULL, 60000, 0);
    json_decref(r);
    ck_assert_int_eq(h_stat(a, "locks_held"), 2);

    /* Both go out on the one connection before time runs out. */
    z = h_redis_sleep_start(&R, 3);
    ck_assert_int_eq(h_send(a, "{s:i,s:s,s:s}", "id", 901, "op", "unlock",
                            "key", "u1"),
                     0);
    ck_assert_int_eq(h_send(a, "{s:i,s:s,s:s,s:i}", "id", 902, "op", "extend",
                            "key", "e1", "ttl_ms", 7000),
                     0);
    r = h_recv_id(a, 901, T_MS);
    ck_assert_msg(r != NULL, "no reply to unlock");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(joutcome(r) != NULL && strcmp(joutcome(r), "unknown") == 0,
                  "unlock sent without an answer must say outcome unknown");
    ck_assert_msg(strstr(jmsg(r), "timed out after 500 ms") != NULL,
                  "message does not say why: %s", jmsg(r));
    json_decref(r);
    r = h_recv_id(a, 902, T_MS);
    ck_assert_msg(r != NULL, "no reply to extend");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(joutcome(r) != NULL && strcmp(joutcome(r), "unknown") == 0,
                  "extend sent without an answer must say outcome unknown");
    json_decref(r);
    h_redis_sleep_end(z);
    wait_connected(a);

    /* Redis ran both when it woke; the late answer settles the record of
     * u1 (no longer held here), and B can take it at once. */
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{u1}"), 0);
    ck_assert_int_le(h_r_int(&R, "PTTL leased:lock:{e1}"), 7000);
    ck_assert_msg(h_wait_stat(a, "locks_held", 1, 10000),
                  "the late answer did not settle the record: held %lld",
                  h_stat(a, "locks_held"));
    r = lk_must(b, "u1", NULL, 5000, 0);
    json_decref(r);
    /* The unlock is not counted twice nor does it linger. */
    r = lk_unlock(a, "u1", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    h_close(a);
    h_close(b);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* A stop while late answers are still owed: they are given up, and the
 * daemon exits cleanly (under a memory checker too). */
START_TEST(test_stop_with_late_answers_owed)
{
    struct h_conn *a;
    json_t *r;
    redisContext *z;

    start("  timeout_ms: 300\n  connections: 1\n", NULL);
    a = lk_connect(&D);
    r = lk_must(a, "q1", NULL, 60000, 0);
    json_decref(r);
    z = h_redis_sleep_start(&R, 4);
    r = lk_unlock(a, "q1", NULL);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_str_eq(joutcome(r), "unknown");
    json_decref(r);
    h_close(a);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
    h_redis_sleep_end(z);
}
END_TEST

START_TEST(test_failure_reason)
{
    struct h_conn *a;
    json_t *r;

    /* No Redis at all: nothing was sent, and the message says why. */
    ck_assert_int_eq(h_daemon_start(&D, NULL, NULL), 0);
    a = lk_connect(&D);
    r = lk_lock(a, "x", NULL, 5000, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(strcasestr(jmsg(r), "refused") != NULL,
                  "message does not carry the cause: %s", jmsg(r));
    ck_assert_msg(joutcome(r) == NULL, "nothing was sent: no outcome");
    json_decref(r);
    r = lk_unlock(a, "x", NULL);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(joutcome(r) == NULL, "nothing was sent: no outcome");
    ck_assert_msg(strcasestr(jmsg(r), "refused") != NULL,
                  "message does not carry the cause: %s", jmsg(r));
    json_decref(r);
    h_close(a);
}
END_TEST

/* --- 2: the release after a lock that timed out ------------------------- */

START_TEST(test_lock_timeout_not_stranded)
{
    struct h_conn *a, *b;
    json_t *r;
    redisContext *z;
    long long t0;

    start("  timeout_ms: 500\n  connections: 1\n", NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);
    z = h_redis_sleep_start(&R, 2);
    r = lk_lock(a, "s1", NULL, 60000, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    h_redis_sleep_end(z);
    wait_connected(a);
    /* Redis ran the acquisition when it woke, and the release behind it:
     * B gets the lock now, not after its 60 s lease. */
    t0 = h_now_ms();
    r = lk_lock(b, "s1", NULL, 5000, 15000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"),
                  "lock stranded after a timed-out acquisition (%s)",
                  h_errcode(r));
    ck_assert_int_lt(h_now_ms() - t0, 15000);
    json_decref(r);
    h_close(a);
    h_close(b);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* --- 3: tokens and hashes that are not locks ----------------------------- */

START_TEST(test_not_a_lock_redisson)
{
    struct h_conn *a;
    json_t *r;

    start(NULL, "lock:\n  layout: redisson\n");
    a = lk_connect(&D);
    h_r_do(&R, "HSET user:42 email a@example.org name x");
    h_r_do(&R, "HSET cart:1 qty 3");

    /* Field names that no holder can have never reach Redis. */
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key",
                          "user:42", "token", "email", "ttl_ms", 1),
                  "bad_request", "extend with token email");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key",
                          "cart:1", "token", "qty"),
                  "bad_request", "unlock with token qty");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key",
                          "cart:1", "token", "qty"),
                  "bad_request", "lock with token qty");
    ck_assert_int_eq(h_r_int(&R, "PTTL user:42"), -1);
    ck_assert_int_eq(h_r_int(&R, "HGET cart:1 qty"), 3);

    /* A holder-shaped field in a hash that is not a lock. */
    h_r_do(&R, "HSET cart:2 %s 1 qty 3", JAVA_HOLDER);
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key",
                          "cart:2", "token", JAVA_HOLDER),
                  "wrong_type", "unlock of a hash that is not a lock");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key",
                          "cart:2", "token", JAVA_HOLDER, "ttl_ms", 1),
                  "wrong_type", "extend of a hash that is not a lock");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s}", "op", "lock.info", "key",
                          "cart:2"),
                  "wrong_type", "lock.info of a hash that is not a lock");
    ck_assert_int_eq(h_r_int(&R, "PTTL cart:2"), -1);
    ck_assert_int_eq(h_r_int(&R, "HGET cart:2 %s", JAVA_HOLDER), 1);
    ck_assert_int_eq(h_r_int(&R, "HGET cart:2 qty"), 3);

    /* A real Redisson lock is still extended and released by its holder. */
    h_r_do(&R, "HSET inv:9 %s 1", JAVA_HOLDER);
    ck_assert_int_eq(h_r_int(&R, "PEXPIRE inv:9 30000"), 1);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key", "inv:9",
                "token", JAVA_HOLDER, "ttl_ms", 60000);
    ck_assert_msg(h_ok(r), "extend of a Redisson lock: %s", h_errcode(r));
    json_decref(r);
    ck_assert_int_gt(h_r_int(&R, "PTTL inv:9"), 30000);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "inv:9",
                "token", JAVA_HOLDER);
    ck_assert_msg(h_ok(r) && jtrue(r, "released"),
                  "unlock of a Redisson lock: %s", h_errcode(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS inv:9"), 0);
    h_close(a);
}
END_TEST

START_TEST(test_not_a_lock_leased)
{
    struct h_conn *a;

    start(NULL, NULL);
    a = lk_connect(&D);
    /* A Redisson-shaped token is no token of this layout. */
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "k",
                          "token", JAVA_HOLDER),
                  "bad_request", "unlock with a Redisson token");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key",
                          "k", "token", "email", "ttl_ms", 5),
                  "bad_request", "extend with token email");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "k",
                          "token", "0123456789ABCDEF0123456789ABCDEF"),
                  "bad_request", "unlock with an upper-case token");

    h_r_do(&R, "HSET leased:lock:{h} %s 1 other x", TOK32);
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "h",
                          "token", TOK32),
                  "wrong_type", "unlock of a hash with a foreign field");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key",
                          "h", "token", TOK32, "ttl_ms", 1),
                  "wrong_type", "extend of a hash with a foreign field");
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{h} %s", TOK32), 1);
    ck_assert_int_eq(h_r_int(&R, "PTTL leased:lock:{h}"), -1);
    h_close(a);
}
END_TEST

/* --- 4: WAIT on its own connections -------------------------------------- */

/* Count the CLIENT LIST lines that contain WHAT (at least *ARG). */
static int
clients_with(const char *what)
{
    redisReply *rep = h_redis_cmd(&R, "CLIENT LIST");
    int n = 0;
    if (rep != NULL && rep->type == REDIS_REPLY_STRING) {
        for (const char *p = rep->str; (p = strstr(p, what)) != NULL;
             p += strlen(what)) {
            n++;
        }
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return n;
}

static bool
leased_conns_up(void *arg)
{
    return clients_with(":cmd ") + clients_with(":lock ") >= *(int *)arg;
}

static bool
wait_running(void *arg)
{
    (void)arg;
    return clients_with("cmd=wait") >= 1;
}

START_TEST(test_wait_own_connection)
{
    struct h_conn *a, *b;
    json_t *r;
    long long t0, took;
    char args[64];
    int want = 2;

    start("  timeout_ms: 4000\n  connections: 1\n",
          "lock:\n  wait_replicas: 1\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    /* The shared connection and the lock connection: a lock sent before
     * the latter is up goes on the shared one. (A daemon without lock
     * connections fails below, where it matters.) */
    (void)h_wait_until(leased_conns_up, &want, 15000);

    /* No replica: the grant's WAIT blocks for 2 s (half the timeout). */
    lk_send(a, 7, "w", NULL, NO_TTL, 0);
    ck_assert_msg(h_wait_until(wait_running, NULL, 10000), "WAIT never ran");
    t0 = h_now_ms();
    r = h_callf(b, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "other");
    took = h_now_ms() - t0;
    ck_assert_msg(r != NULL && h_ok(r), "cache.get failed: %s",
                  r != NULL ? h_errcode(r) : "no reply");
    json_decref(r);
    ck_assert_msg(took < 300, "cache.get waited %lld ms behind WAIT", took);
    ck_assert_msg(wait_running(NULL), "WAIT ended before the check");
    r = h_recv_id(a, 7, 15000);
    ck_assert_msg(r != NULL, "no reply to the lock");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{w}"), 0);

    /* With a replica the grant is confirmed. */
    snprintf(args, sizeof args, "--replicaof 127.0.0.1 %d", R.port);
    ck_assert_int_eq(h_redis_start(&R2, args), 0);
    ck_assert_msg(h_wait_until(h_replica_linked, &R, 15000),
                  "replica did not link");
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R2, "EXISTS leased:lock:{w}"), 1);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- 5: foreign data is wrong_type, not internal ------------------------- */

START_TEST(test_foreign_data_wrong_type)
{
    struct h_conn *a;
    json_t *r;

    start(NULL, NULL);
    a = lk_connect(&D);
    h_r_do(&R, "HSET leased:lock:{W} %s notanumber", TOK32);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "W", "token",
                TOK32);
    ck_assert_msg(r != NULL, "no reply");
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    ck_assert_msg(strstr(jmsg(r), "'W'") != NULL, "key not named: %s",
                  jmsg(r));
    json_decref(r);
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock.info", "key",
                          "W", "token", TOK32),
                  "wrong_type", "lock.info of a bad count");
    redisReply *rep = h_redis_cmd(&R, "HGET leased:lock:{W} %s", TOK32);
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING &&
              strcmp(rep->str, "notanumber") == 0);
    freeReplyObject(rep);

    /* An empty field, and an unlock by an owner that holds nothing. */
    h_r_do(&R, "HSET leased:lock:{W3} %b x", "", (size_t)0);
    r = lk_unlock(a, "W3", NULL);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{W3}"), 1);

    /* A hash that is not a lock is not "held by someone else" either:
     * lock answers wrong_type, waiting or not, and leaves it alone. */
    h_r_do(&R, "HSET leased:lock:{W4} email a@b.c");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s}", "op", "lock", "key", "W4"),
                  "wrong_type", "lock of a foreign hash");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key", "W4",
                          "wait_ms", 200),
                  "wrong_type", "waiting lock of a foreign hash");
    ck_assert_int_eq(h_r_int(&R, "HLEN leased:lock:{W4}"), 1);
    ck_assert_int_eq(h_r_int(&R, "PTTL leased:lock:{W4}"), -1);
    h_close(a);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(unlock_outcome_unknown, 90),
        H_CASE(stop_with_late_answers_owed, 90),
        H_CASE(failure_reason, 60),
        H_CASE(lock_timeout_not_stranded, 90),
        H_CASE(not_a_lock_redisson, 60),
        H_CASE(not_a_lock_leased, 60),
        H_CASE(wait_own_connection, 90),
        H_CASE(foreign_data_wrong_type, 60),
    };

    return H_MAIN(fx, cases);
}
