/* Read-write locks ("mode":"read"|"write" in lock, unlock, extend and
 * lock.info) against real leased daemons and a real redis-server: readers
 * share, a writer excludes, wake-ups, writer preference within a daemon,
 * downgrade, reentrancy, wrong_type both ways, fences, session close,
 * lock_lost, Redisson's layout (raw Redis state), lock.list and
 * lock.force_unlock, two daemons, Redis down, and many processes against
 * two daemons with an external count of who is inside. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"
#include "order_util.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D, D2;

static const struct h_fixture fx = {
    .suite = "rwlock",
    .redis = {&R},
    .daemons = {&D, &D2},
};

#define WD_YAML "lock:\n  watchdog_ms: 900\n"

/* {"op":OP,"key":KEY,"mode":MODE} plus owner (NULL: absent), ttl_ms and
 * wait_ms (0: absent). */
static json_t *
rw_req(const char *op, const char *key, const char *mode, const char *owner,
       long long ttl_ms, long long wait_ms)
{
    json_t *req = json_pack("{s:s,s:s,s:s}", "op", op, "key", key, "mode",
                            mode);
    if (owner != NULL) {
        json_object_set_new(req, "owner", json_string(owner));
    }
    if (ttl_ms != 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    if (wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    return req;
}

static json_t *
rw_lock(struct h_conn *c, const char *key, const char *mode, const char *owner,
        long long ttl, long long wait)
{
    int t = wait < 0 || wait > 25000 ? 60000 : (int)wait + T_MS;
    json_t *r = h_call(c, rw_req("lock", key, mode, owner, ttl, wait), t);
    ck_assert_msg(r != NULL, "no reply to lock %s %s", mode, key);
    return r;
}

static bool
acquired(json_t *r)
{
    bool a = h_ok(r) && jtrue(r, "acquired");
    json_decref(r);
    return a;
}

/* Lock and insist on getting it; returns the fence. */
static long long
rw_must(struct h_conn *c, const char *key, const char *mode, const char *owner,
        long long ttl, long long wait)
{
    json_t *r = rw_lock(c, key, mode, owner, ttl, wait);
    ck_assert_msg(h_ok(r), "lock %s %s: %s %s", mode, key, h_errcode(r),
                  jmsg(r) ? jmsg(r) : "");
    ck_assert_msg(jtrue(r, "acquired"), "lock %s %s not acquired", mode, key);
    long long f = jint(r, "fence");
    json_decref(r);
    return f;
}

static void
rw_not(struct h_conn *c, const char *key, const char *mode, long long wait)
{
    json_t *r = rw_lock(c, key, mode, NULL, 0, wait);
    ck_assert_msg(h_ok(r), "lock %s %s: %s", mode, key, h_errcode(r));
    ck_assert_msg(!jtrue(r, "acquired"), "lock %s %s acquired", mode, key);
    json_decref(r);
}

static json_t *
rw_unlock(struct h_conn *c, const char *key, const char *mode,
          const char *owner)
{
    json_t *r = h_call(c, rw_req("unlock", key, mode, owner, 0, 0), T_MS);
    ck_assert_msg(r != NULL, "no reply to unlock %s %s", mode, key);
    return r;
}

static void
rw_unlock_ok(struct h_conn *c, const char *key, const char *mode,
             const char *owner)
{
    json_t *r = rw_unlock(c, key, mode, owner);
    ck_assert_msg(h_ok(r), "unlock %s %s: %s", mode, key, h_errcode(r));
    json_decref(r);
}

static void
rw_send(struct h_conn *c, json_int_t id, const char *key, const char *mode,
        long long wait)
{
    json_t *req = rw_req("lock", key, mode, NULL, 0, wait);
    json_object_set_new(req, "id", json_integer(id));
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    size_t n = strlen(line);
    line = realloc(line, n + 2);
    line[n] = '\n';
    line[n + 1] = '\0';
    ck_assert_int_eq(h_send_raw(c, line, n + 1), 0);
    free(line);
}

static char *
r_str(const char *fmt, const char *a, const char *b)
{
    redisReply *rep = h_redis_cmd(&R, fmt, a, b);
    char *s = NULL;
    if (rep != NULL && rep->type == REDIS_REPLY_STRING) {
        s = strdup(rep->str);
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return s;
}

static void
assert_mode(const char *hash, const char *want)
{
    char *m = r_str("HGET %s %s", hash, "mode");
    if (want == NULL) {
        ck_assert_msg(m == NULL, "%s has mode %s", hash, m);
        return;
    }
    ck_assert_msg(m != NULL && strcmp(m, want) == 0, "%s: mode %s, want %s",
                  hash, m ? m : "(none)", want);
    free(m);
}

/* ------------------------------------------------------------ sharing */

START_TEST(test_readers_share_writer_waits)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D), *b = lk_connect(&D);
    struct h_conn *w = lk_connect(&D);
    rw_must(a, "doc", "read", NULL, 0, 0);
    rw_must(b, "doc", "read", NULL, 0, 0);
    assert_mode("leased:lock:{doc}", "read");
    rw_not(w, "doc", "write", 0);
    rw_not(w, "doc", "write", 200);
    /* A waiting writer is woken when the last reader leaves. */
    rw_send(w, 77, "doc", "write", 10000);
    h_assert_stat(a, "lock_waiters", 1, 5000);
    rw_unlock_ok(a, "doc", "read", NULL);
    json_t *r = h_recv_id(w, 77, 300);
    ck_assert_msg(r == NULL, "writer got it while a reader holds");
    long long t0 = h_now_ms();
    json_t *u = rw_unlock(b, "doc", "read", NULL);
    ck_assert(h_ok(u) && jtrue(u, "released"));
    json_decref(u);
    r = h_recv_id(w, 77, 5000);
    ck_assert_msg(r != NULL && acquired(r), "writer not woken");
    ck_assert_msg(h_now_ms() - t0 < 2000, "woken late");
    assert_mode("leased:lock:{doc}", "write");
    /* The writer excludes readers and writers. */
    rw_not(a, "doc", "read", 0);
    rw_not(b, "doc", "write", 0);
    /* Readers waiting behind the writer all get in when it leaves. */
    rw_send(a, 1, "doc", "read", 10000);
    rw_send(b, 2, "doc", "read", 10000);
    h_assert_stat(a, "lock_waiters", 2, 5000);
    rw_unlock_ok(w, "doc", "write", NULL);
    ck_assert(acquired(h_recv_id(a, 1, 5000)));
    ck_assert(acquired(h_recv_id(b, 2, 5000)));
    h_close(a);
    h_close(b);
    h_close(w);
}
END_TEST

START_TEST(test_writer_preference)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D), *w = lk_connect(&D);
    struct h_conn *late = lk_connect(&D);
    rw_must(a, "pref", "read", NULL, 0, 0);
    rw_send(w, 5, "pref", "write", 20000);
    h_assert_stat(a, "lock_waiters", 1, 5000);
    /* Readers arriving now queue behind the writer, although the lock is
     * only read-held: a try-once reader does not get it either. */
    rw_not(late, "pref", "read", 0);
    rw_not(late, "pref", "read", 300);
    rw_send(late, 6, "pref", "read", 20000);
    h_assert_stat(a, "lock_waiters", 2, 5000);
    rw_unlock_ok(a, "pref", "read", NULL);
    ck_assert(acquired(h_recv_id(w, 5, 5000)));
    json_t *r = h_recv_id(late, 6, 300);
    ck_assert_msg(r == NULL, "reader overtook the writer");
    rw_unlock_ok(w, "pref", "write", NULL);
    ck_assert(acquired(h_recv_id(late, 6, 5000)));
    h_close(a);
    h_close(w);
    h_close(late);
}
END_TEST

/* ----------------------------------------------- downgrade, reentrancy */

START_TEST(test_downgrade)
{
    h_start(NULL);
    struct h_conn *c = lk_connect(&D), *o = lk_connect(&D);
    long long f = rw_must(c, "dg", "write", "t1", 0, 0);
    /* Its own read: granted although the write is held, without waiting
     * even when a writer waits here. */
    rw_send(o, 9, "dg", "write", 20000);
    h_assert_stat(c, "lock_waiters", 1, 5000);
    json_t *r = rw_lock(c, "dg", "read", "t1", 0, 5000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "downgrade refused");
    ck_assert_int_eq(jint(r, "fence"), f);
    json_decref(r);
    /* Another owner of the same session is someone else. */
    rw_not(c, "dg", "read", 0);
    json_t *u = rw_unlock(c, "dg", "write", "t1");
    ck_assert(h_ok(u) && jtrue(u, "released"));
    json_decref(u);
    assert_mode("leased:lock:{dg}", "read");
    /* The read stays: the waiting writer still waits. */
    ck_assert(h_recv_id(o, 9, 300) == NULL);
    r = h_call(c, rw_req("lock.info", "dg", "read", "t1", 0, 0), T_MS);
    ck_assert(jtrue(r, "locked") && jtrue(r, "mine"));
    ck_assert_str_eq(jstr(r, "mode"), "read");
    json_decref(r);
    rw_unlock_ok(c, "dg", "read", "t1");
    ck_assert(acquired(h_recv_id(o, 9, 5000)));
    h_close(c);
    h_close(o);
}
END_TEST

START_TEST(test_reentrancy)
{
    h_start(NULL);
    struct h_conn *c = lk_connect(&D);
    json_t *r = rw_lock(c, "re", "read", NULL, 0, 0);
    ck_assert_int_eq(jint(r, "count"), 1);
    const char *tok = jstr(r, "token");
    ck_assert(h_is_token(tok));
    char tok1[80];
    snprintf(tok1, sizeof(tok1), "%s", tok);
    json_decref(r);
    r = rw_lock(c, "re", "read", NULL, 0, 0);
    ck_assert_int_eq(jint(r, "count"), 2);
    ck_assert_str_eq(jstr(r, "token"), tok1);
    json_decref(r);
    ck_assert_int_eq(
        h_r_int(&R, "PEXPIRETIME leased:lock:{re}:%s:rwlock_timeout:2", tok1) >
            0,
        1);
    r = rw_unlock(c, "re", "read", NULL);
    ck_assert(h_ok(r) && !jtrue(r, "released"));
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{re}:%s:rwlock_timeout:2",
                             tok1),
                     0);
    rw_unlock_ok(c, "re", "read", NULL);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{re}"), 0);
    /* Write, twice, by token from another session. */
    r = rw_lock(c, "re", "write", NULL, 0, 0);
    snprintf(tok1, sizeof(tok1), "%s", jstr(r, "token"));
    json_decref(r);
    struct h_conn *o = lk_connect(&D);
    r = h_callf(o, T_MS, "{s:s,s:s,s:s,s:s}", "op", "lock", "key", "re",
                "mode", "write", "token", tok1);
    ck_assert_msg(h_ok(r) && jint(r, "count") == 2, "reentry by token");
    json_decref(r);
    r = rw_unlock(c, "re", "write", NULL);
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    /* The token of the write side is not the read side's. */
    r = h_callf(o, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key", "re",
                "mode", "read", "token", tok1);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    rw_unlock_ok(c, "re", "write", NULL);
    h_close(o);
    h_close(c);
}
END_TEST

/* ------------------------------------------------------- wrong things */

START_TEST(test_wrong_type_and_bad_requests)
{
    h_start(NULL);
    struct h_conn *c = lk_connect(&D);
    json_decref(lk_must(c, "plain", NULL, NO_TTL, 0));
    h_expect_code(rw_lock(c, "plain", "read", NULL, 0, 0), "wrong_type",
                  "read on a plain lock");
    h_expect_code(rw_lock(c, "plain", "write", NULL, 0, 0), "wrong_type",
                  "write on a plain lock");
    rw_must(c, "rw", "read", NULL, 0, 0);
    h_expect_code(lk_lock(c, "rw", NULL, NO_TTL, 0), "wrong_type",
                  "plain lock on a read-write lock");
    /* lock.info without a side describes either kind. */
    json_t *r = lk_info(c, "rw");
    ck_assert(jtrue(r, "locked") && !jtrue(r, "mine"));
    ck_assert_str_eq(jstr(r, "mode"), "read");
    json_decref(r);
    r = lk_info(c, "plain");
    ck_assert(jtrue(r, "locked") && json_object_get(r, "mode") == NULL);
    json_decref(r);
    h_expect_code(rw_lock(c, "x", "shared", NULL, 0, 0), "bad_request",
                  "bad mode");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key", "x",
                          "mode", 1),
                  "bad_request", "mode not a string");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:[s,s],s:s}", "op", "lock", "keys",
                          "a", "b", "mode", "read"),
                  "bad_request", "mode with keys");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:[s],s:s}", "op", "unlock", "keys",
                          "a", "mode", "write"),
                  "bad_request", "unlock mode with keys");
    /* Without a mode, unlock and extend address a plain lock. */
    h_expect_code(lk_unlock(c, "rw", NULL), "wrong_type",
                  "plain unlock of a read-write lock");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key",
                          "rw", "ttl_ms", 5000),
                  "wrong_type", "plain extend of a read-write lock");
    /* Not held: a write unlock of a read hold, an unlock of nothing. */
    h_expect_code(rw_unlock(c, "rw", "write", NULL), "not_held",
                  "write unlock of a read");
    h_expect_code(rw_unlock(c, "none", "read", NULL), "not_held",
                  "unlock of nothing");
    rw_unlock_ok(c, "rw", "read", NULL);
    h_close(c);
}
END_TEST

/* ------------------------------------------------------------- fences */

START_TEST(test_fence_on_writes_only)
{
    h_start(NULL);
    struct h_conn *c = lk_connect(&D), *o = lk_connect(&D);
    long long f1 = rw_must(c, "fe", "write", NULL, 0, 0);
    ck_assert(f1 > 0);
    rw_unlock_ok(c, "fe", "write", NULL);
    long long r1 = rw_must(c, "fe", "read", NULL, 0, 0);
    long long r2 = rw_must(o, "fe", "read", NULL, 0, 0);
    ck_assert_int_eq(r1, f1);
    ck_assert_int_eq(r2, f1);
    rw_unlock_ok(c, "fe", "read", NULL);
    rw_unlock_ok(o, "fe", "read", NULL);
    long long f2 = rw_must(c, "fe", "write", NULL, 0, 0);
    ck_assert_int_eq(f2, f1 + 1);
    rw_unlock_ok(c, "fe", "write", NULL);
    /* Redis loses the counter: fences still never go back. */
    h_r_do(&R, "FLUSHALL");
    long long r3 = rw_must(c, "fe", "read", NULL, 0, 0);
    ck_assert_int_ge(r3, f2);
    rw_unlock_ok(c, "fe", "read", NULL);
    long long f3 = rw_must(c, "fe", "write", NULL, 0, 0);
    ck_assert_int_gt(f3, f2);
    h_close(c);
    h_close(o);
}
END_TEST

/* ------------------------------------------------- session, loss, info */

START_TEST(test_session_close_releases)
{
    h_start(NULL);
    struct h_conn *r1 = lk_connect(&D), *w1 = lk_connect(&D);
    struct h_conn *w = lk_connect(&D);
    rw_must(r1, "sc", "read", NULL, 0, 0);
    rw_must(r1, "sc", "read", NULL, 0, 0);
    rw_send(w, 3, "sc", "write", 20000);
    h_assert_stat(w, "lock_waiters", 1, 5000);
    long long t0 = h_now_ms();
    h_close(r1); /* the client vanished */
    ck_assert(acquired(h_recv_id(w, 3, 5000)));
    ck_assert_msg(h_now_ms() - t0 < 2000, "woken late");
    rw_send(w1, 4, "sc", "read", 20000);
    h_assert_stat(w, "lock_waiters", 1, 5000);
    h_close(w);
    ck_assert(acquired(h_recv_id(w1, 4, 5000)));
    h_close(w1);
}
END_TEST

START_TEST(test_lock_lost_when_deleted)
{
    h_start(WD_YAML);
    struct h_conn *c = lk_connect(&D), *o = lk_connect(&D);
    rw_must(c, "lost", "read", NULL, 0, 0);
    rw_must(o, "lost2", "write", NULL, 0, 0);
    h_r_do(&R, "DEL leased:lock:{lost} leased:lock:{lost2}");
    json_t *ev = h_lock_lost(c, "lost", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost for the reader");
    json_decref(ev);
    ev = h_lock_lost(o, "lost2", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost for the writer");
    json_decref(ev);
    h_close(c);
    h_close(o);
}
END_TEST

START_TEST(test_watchdog_extend_info)
{
    h_start(WD_YAML);
    struct h_conn *c = lk_connect(&D), *o = lk_connect(&D);
    json_t *r = rw_lock(c, "ex", "read", NULL, 0, 0);
    char tok[80];
    snprintf(tok, sizeof(tok), "%s", jstr(r, "token"));
    json_decref(r);
    rw_must(o, "ex", "read", NULL, 1500, 0);
    /* The watchdog keeps the reader's own lease alive past 3 periods. */
    struct renewals_want rw = {c, 3, h_now_ms(), 0};
    ck_assert(h_wait_until(renewals_done, &rw, 10000));
    ck_assert(h_r_int(&R, "PTTL leased:lock:{ex}:%s:rwlock_timeout:1", tok) >
              0);
    r = h_call(c, rw_req("lock.info", "ex", "read", NULL, 0, 0), T_MS);
    ck_assert(h_ok(r) && jtrue(r, "locked") && jtrue(r, "mine"));
    ck_assert_str_eq(jstr(r, "mode"), "read");
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    r = h_call(c, rw_req("extend", "ex", "read", NULL, 20000, 0), T_MS);
    ck_assert_msg(h_ok(r), "extend: %s", h_errcode(r));
    ck_assert_int_eq(jint(r, "lease_ms"), 20000);
    json_decref(r);
    ck_assert(h_r_int(&R, "PTTL leased:lock:{ex}:%s:rwlock_timeout:1", tok) >
              15000);
    ck_assert(h_r_int(&R, "PTTL leased:lock:{ex}") > 15000);
    /* The other reader's fixed lease ran out: the writer waits for the
     * watched one only. */
    h_close(c);
    rw_must(o, "ex", "write", NULL, 0, 10000);
    r = h_call(o, rw_req("lock.info", "ex", "write", NULL, 0, 0), T_MS);
    ck_assert_str_eq(jstr(r, "mode"), "write");
    json_decref(r);
    h_expect_code(h_call(o, rw_req("extend", "ex", "read", NULL, 5000, 0),
                         T_MS),
                  "not_held", "extend of a read not held");
    h_close(o);
}
END_TEST

/* Each reader's lease runs out on its own, although the readers share one
 * hash that lives as long as the longest lease in it. */
START_TEST(test_reader_lease_runs_out)
{
    h_start(WD_YAML);
    struct h_conn *a = lk_connect(&D), *b = lk_connect(&D);
    struct h_conn *w = lk_connect(&D);
    rw_must(a, "lr", "read", NULL, 700, 0);
    rw_must(b, "lr", "read", NULL, 0, 0);
    long long t0 = h_now_ms();
    while (h_now_ms() - t0 < 1500) {
        usleep(100 * 1000); /* A's fixed lease runs out meanwhile */
    }
    rw_not(w, "lr", "write", 0); /* B is watched and renewed */
    h_expect_code(rw_unlock(a, "lr", "read", NULL), "not_held",
                  "unlock after the reader's lease ran out");
    /* A's field stays in the hash (as with Redisson) but counts for
     * nothing: B's unlock frees the lock. */
    rw_send(w, 2, "lr", "write", 20000);
    h_assert_stat(w, "lock_waiters", 1, 5000);
    rw_unlock_ok(b, "lr", "read", NULL);
    ck_assert(acquired(h_recv_id(w, 2, 5000)));
    h_close(a);
    h_close(b);
    h_close(w);
}
END_TEST

/* A lone reader whose lease key is gone (it ran out while the hash lived
 * on, as after a downgrade; here deleted as its expiry would) holds
 * nothing: its unlock answers not_held and clears the hash. */
START_TEST(test_lone_reader_lease_key_gone)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    json_t *r = rw_lock(a, "lkg", "read", NULL, 60000, 0);
    ck_assert_int_eq(jint(r, "count"), 1);
    ck_assert_int_eq(h_r_int(&R, "DEL leased:lock:{lkg}:%s:rwlock_timeout:1",
                             jstr(r, "token")),
                     1);
    json_decref(r);
    h_expect_code(rw_unlock(a, "lkg", "read", NULL), "not_held",
                  "unlock of a reader whose lease key is gone");
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{lkg}"), 0);
    h_close(a);
}
END_TEST

/* lock.max_hold_ms ends a watched reader's hold, and only its own: the
 * other reader keeps the lock. */
START_TEST(test_max_hold)
{
    h_start("lock:\n  watchdog_ms: 300\n  max_hold_ms: 1000\n");
    struct h_conn *a = lk_connect(&D), *b = lk_connect(&D);
    rw_must(a, "cap", "read", NULL, 0, 0);
    rw_must(b, "cap", "read", NULL, 5000, 0);
    json_t *ev = h_lock_lost(a, "cap", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost at max_hold");
    ck_assert_str_eq(jstr(ev, "reason"), "max_hold");
    json_decref(ev);
    json_t *r = h_call(b, rw_req("lock.info", "cap", "read", NULL, 0, 0),
                       T_MS);
    ck_assert(jtrue(r, "locked") && jtrue(r, "mine"));
    json_decref(r);
    rw_not(a, "cap", "write", 0);
    rw_unlock_ok(b, "cap", "read", NULL);
    rw_must(a, "cap", "write", NULL, 0, 0);
    h_close(a);
    h_close(b);
}
END_TEST

/* A detached write lock outlives its session and is unlocked by token; a
 * waiting reader is cancelled. */
START_TEST(test_detach_and_cancel)
{
    h_start(NULL);
    struct h_conn *c = lk_connect(&D), *o = lk_connect(&D);
    json_t *req = rw_req("lock", "dt", "write", NULL, 20000, 0);
    json_object_set_new(req, "detach", json_true());
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "detached write");
    char tok[80];
    snprintf(tok, sizeof(tok), "%s", jstr(r, "token"));
    json_decref(r);
    h_close(c);
    rw_not(o, "dt", "read", 0);
    rw_send(o, 41, "dt", "read", 20000);
    h_assert_stat(o, "lock_waiters", 1, 5000);
    r = h_callf(o, T_MS, "{s:s,s:i}", "op", "cancel", "target", 41);
    ck_assert_msg(h_ok(r) && jtrue(r, "cancelled"), "cancel");
    json_decref(r);
    r = h_recv_id(o, 41, T_MS);
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "acquired"),
                  "cancelled reader answered");
    json_decref(r);
    r = h_callf(o, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key", "dt",
                "mode", "write", "token", tok);
    ck_assert_msg(h_ok(r) && jtrue(r, "released"), "unlock by token: %s",
                  h_errcode(r));
    json_decref(r);
    rw_must(o, "dt", "read", NULL, 0, 0);
    h_close(o);
}
END_TEST

/* ---------------------------------------------------- Redisson layout */

START_TEST(test_redisson_layout)
{
    h_start("lock:\n  layout: redisson\n");
    struct h_conn *c = lk_connect(&D), *o = lk_connect(&D);
    json_t *r = rw_lock(c, "rs", "read", NULL, 30000, 0);
    ck_assert(h_ok(r));
    char tok[80];
    snprintf(tok, sizeof(tok), "%s", jstr(r, "token"));
    json_decref(r);
    /* Exactly what RedissonReadLock writes. */
    assert_mode("rs", "read");
    ck_assert_int_eq(h_r_int(&R, "HGET rs %s", tok), 1);
    ck_assert_int_eq(h_r_int(&R, "HLEN rs"), 2);
    ck_assert(h_r_int(&R, "PTTL {rs}:%s:rwlock_timeout:1", tok) > 25000);
    ck_assert(h_r_int(&R, "PTTL rs") > 25000);
    /* A Java reader joins as RedissonReadLock would. */
    const char *jr = "0b6ad0bc-26a5-4b1f-9d25-41b8a2f7c3aa:77";
    h_r_do(&R, "HINCRBY rs %s 1", jr);
    h_r_do(&R, "SET {rs}:%s:rwlock_timeout:1 1 PX 30000", jr);
    rw_not(o, "rs", "write", 0);
    rw_send(o, 8, "rs", "write", 20000);
    h_wait_subscribed(&R, "redisson_rwlock:{rs}", 5000);
    rw_unlock_ok(c, "rs", "read", NULL);
    ck_assert_int_eq(h_r_int(&R, "EXISTS {rs}:%s:rwlock_timeout:1", tok), 0);
    ck_assert(h_recv_id(o, 8, 300) == NULL);
    /* The Java reader leaves as RedissonReadLock's unlock does. */
    h_r_do(&R, "DEL rs {rs}:%s:rwlock_timeout:1", jr);
    h_r_do(&R, "PUBLISH redisson_rwlock:{rs} 0");
    ck_assert(acquired(h_recv_id(o, 8, 5000)));
    assert_mode("rs", "write");
    r = h_call(o, rw_req("lock.info", "rs", "write", NULL, 0, 0), T_MS);
    ck_assert(jtrue(r, "mine"));
    json_decref(r);
    /* Its unlock publishes Redisson's READ_UNLOCK_MESSAGE. */
    redisContext *sub = h_redis_connect(&R);
    ck_assert(sub != NULL);
    redisReply *s = redisCommand(sub, "SUBSCRIBE redisson_rwlock:{rs}");
    freeReplyObject(s);
    rw_unlock_ok(o, "rs", "write", NULL);
    ck_assert_int_eq(redisGetReply(sub, (void **)&s), REDIS_OK);
    ck_assert_str_eq(s->element[2]->str, "1");
    freeReplyObject(s);
    redisFree(sub);
    ck_assert_int_eq(h_r_int(&R, "EXISTS rs"), 0);
    /* A Java writer (<uuid>:<thread>:write) excludes leased readers. */
    h_r_do(&R, "HSET rs mode write %s:write 1", jr);
    h_r_do(&R, "PEXPIRE rs 30000");
    rw_not(c, "rs", "read", 0);
    h_expect_code(lk_lock(c, "rs", NULL, NO_TTL, 0), "wrong_type",
                  "plain lock on Redisson's read-write lock");
    /* And the other way: a side of a read-write lock on a plain lock
     * (here one a Java RLock holds). */
    h_r_do(&R, "HSET rp %s 1", jr);
    h_r_do(&R, "PEXPIRE rp 30000");
    h_expect_code(rw_lock(c, "rp", "read", NULL, 0, 0), "wrong_type",
                  "read on Redisson's plain lock");
    h_expect_code(rw_lock(c, "rp", "write", NULL, 0, 0), "wrong_type",
                  "write on Redisson's plain lock");
    /* A name with a hash tag: the readers' prefix is the name itself,
     * the channel still Redisson's, where a waiter hears the unlock. */
    r = rw_lock(c, "{rt}k", "write", NULL, 30000, 0);
    ck_assert(h_ok(r));
    json_decref(r);
    rw_send(o, 9, "{rt}k", "write", 20000);
    h_wait_subscribed(&R, "redisson_rwlock:{rt}k", 5000);
    rw_unlock_ok(c, "{rt}k", "write", NULL);
    ck_assert_msg(acquired(h_recv_id(o, 9, 5000)),
                  "the waiter did not hear the unlock of {rt}k");
    h_close(c);
    h_close(o);
}
END_TEST

/* --------------------------------------------------------- operators */

START_TEST(test_list_and_force_unlock)
{
    h_start(WD_YAML);
    struct h_conn *c = lk_connect(&D), *w = lk_connect(&D);
    struct h_conn *op = lk_connect(&D);
    rw_must(c, "fu", "read", NULL, 0, 0);
    rw_must(w, "fw", "write", NULL, 0, 0);
    json_t *r = h_callf(op, T_MS, "{s:s,s:s}", "op", "lock.list", "prefix",
                        "f");
    ck_assert(h_ok(r));
    json_t *locks = json_object_get(r, "locks");
    ck_assert_int_eq(json_array_size(locks), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *l = json_array_get(locks, i);
        const char *k = jstr(l, "key");
        ck_assert_str_eq(jstr(l, "mode"),
                         strcmp(k, "fu") == 0 ? "read" : "write");
    }
    json_decref(r);
    rw_send(w, 12, "fu", "write", 20000);
    h_assert_stat(op, "lock_waiters", 1, 5000);
    r = h_callf(op, T_MS, "{s:s,s:s}", "op", "lock.force_unlock", "key", "fu");
    ck_assert_msg(h_ok(r), "force_unlock: %s", h_errcode(r));
    json_decref(r);
    json_t *ev = h_lock_lost(c, "fu", 5000);
    ck_assert(ev != NULL);
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    json_decref(ev);
    ck_assert(acquired(h_recv_id(w, 12, 5000)));
    h_close(c);
    h_close(w);
    h_close(op);
}
END_TEST

/* Any number of readers share a key: past 64 holders (where a whole
 * check of the hash stops) readers are still granted, and every path that
 * reads, releases or forces the lock still takes it as a lock. */
#define MANY 100

static void
many_readers(struct h_conn **c, const char *key)
{
    for (int i = 0; i < MANY; i++) {
        json_t *r = rw_lock(c[i], key, "read", NULL, 0, 0);
        ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "reader %d of %s: %s",
                      i + 1, key, h_ok(r) ? "not acquired" : h_errcode(r));
        json_decref(r);
    }
}

START_TEST(test_many_readers)
{
    h_start(NULL);
    struct h_conn *c[MANY];
    for (int i = 0; i < MANY; i++) {
        c[i] = lk_connect(&D);
    }
    struct h_conn *w = lk_connect(&D), *op = lk_connect(&D);
    many_readers(c, "mr");
    many_readers(c, "mf");
    /* Forced while MANY readers hold it: each of them is told. */
    json_t *r = h_callf(op, T_MS, "{s:s,s:s}", "op", "lock.force_unlock",
                        "key", "mf");
    ck_assert_msg(h_ok(r), "force_unlock: %s", h_errcode(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{mf}"), 0);
    json_t *ev = h_lock_lost(c[MANY - 1], "mf", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost for a forced reader");
    json_decref(ev);
    r = h_call(c[0], rw_req("lock.info", "mr", "read", NULL, 0, 0), T_MS);
    ck_assert_msg(h_ok(r), "lock.info: %s", h_errcode(r));
    ck_assert(jtrue(r, "locked") && jtrue(r, "mine"));
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    r = h_callf(op, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "mr");
    ck_assert_msg(h_ok(r) && jtrue(r, "locked"), "lock.info without mode: %s",
                  h_errcode(r));
    json_decref(r);
    r = h_call(c[0], rw_req("extend", "mr", "read", NULL, 20000, 0), T_MS);
    ck_assert_msg(h_ok(r), "extend: %s", h_errcode(r));
    json_decref(r);
    rw_send(w, 7, "mr", "write", 30000);
    h_assert_stat(op, "lock_waiters", 1, 5000);
    /* Half unlock, the other half close their sessions. */
    for (int i = 0; i < MANY; i++) {
        if (i % 2 == 0) {
            rw_unlock_ok(c[i], "mr", "read", NULL);
        } else {
            h_close(c[i]);
        }
    }
    ck_assert(acquired(h_recv_id(w, 7, 10000)));
    assert_mode("leased:lock:{mr}", "write");
    ck_assert_int_eq(h_r_int(&R, "HLEN leased:lock:{mr}"), 2);
    rw_unlock_ok(w, "mr", "write", NULL);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{mr}"), 0);
    for (int i = 0; i < MANY; i += 2) {
        h_close(c[i]);
    }
    h_close(w);
    h_close(op);
}
END_TEST

/* -------------------------------------------------------- two daemons */

START_TEST(test_two_daemons)
{
    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct h_conn *a = lk_connect(&D), *b = lk_connect(&D2);
    rw_must(a, "two", "read", NULL, 0, 0);
    rw_must(b, "two", "read", NULL, 0, 0);
    rw_unlock_ok(b, "two", "read", NULL);
    rw_send(b, 4, "two", "write", 20000);
    h_assert_stat(b, "lock_waiters", 1, 5000);
    long long t0 = h_now_ms();
    rw_unlock_ok(a, "two", "read", NULL);
    ck_assert(acquired(h_recv_id(b, 4, 5000)));
    ck_assert_msg(h_now_ms() - t0 < 2000, "woken late");
    rw_send(a, 5, "two", "read", 20000);
    h_assert_stat(a, "lock_waiters", 1, 5000);
    rw_unlock_ok(b, "two", "write", NULL);
    ck_assert(acquired(h_recv_id(a, 5, 5000)));
    h_close(a);
    h_close(b);
}
END_TEST

/* ------------------------------------------------------- Redis faults */

START_TEST(test_redis_down)
{
    h_start(WD_YAML);
    struct h_conn *c = lk_connect(&D), *w = lk_connect(&D);
    rw_must(c, "down", "read", NULL, 0, 0);
    rw_send(w, 6, "down", "write", 20000);
    h_assert_stat(c, "lock_waiters", 1, 5000);
    h_redis_kill(&R);
    /* The holder learns its lease ran out unrenewed. */
    json_t *ev = h_lock_lost(c, "down", 10000);
    ck_assert_msg(ev != NULL, "no lock_lost");
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    h_expect_code(rw_lock(c, "down2", "read", NULL, 0, 0), "redis_unavailable",
                  "read with Redis down");
    ck_assert_int_eq(h_redis_restart(&R), 0);
    /* The waiting writer is served once Redis is back (or answered). */
    json_t *r = h_recv_id(w, 6, 25000);
    ck_assert_msg(r != NULL, "the waiting writer got no answer");
    const char *code = h_errcode(r);
    ck_assert_msg((h_ok(r) && jtrue(r, "acquired")) ||
                      (code != NULL && strcmp(code, "redis_unavailable") == 0),
                  "the waiting writer: %s", code ? code : "not acquired");
    json_decref(r);
    h_close(c);
    h_close(w);
}
END_TEST

/* --------------------------------------------------------- contention */

#define PROCS 4
#define ROUNDS 60
#define KEYS 3

/* One client process: ROUNDS read or write locks on KEYS keys through
 * daemon D_IDX, counting who is inside in Redis; returns violations. */
static int
contend(int idx)
{
    struct h_daemon *d = idx % 2 == 0 ? &D : &D2;
    struct h_conn *c = h_connect(d);
    /* The counters share a hash tag: one connection reaches them all on
     * a cluster too. */
    redisContext *rc = h_redis_connect_for(&R, "{rwc}");
    if (c == NULL || rc == NULL) {
        return 100;
    }
    int bad = 0;
    unsigned seed = (unsigned)idx * 7919u + 13u;
    for (int i = 0; i < ROUNDS; i++) {
        char key[16];
        snprintf(key, sizeof(key), "ct%d", rand_r(&seed) % KEYS);
        bool wr = rand_r(&seed) % 3 == 0;
        json_t *r = h_call(
            c, rw_req("lock", key, wr ? "write" : "read", NULL, 0, -1), 60000);
        if (r == NULL || !h_ok(r) || !jtrue(r, "acquired")) {
            json_decref(r);
            return 100;
        }
        json_decref(r);
        redisReply *x;
        if (wr) {
            x = redisCommand(rc, "INCR {rwc}:%s:w", key);
            long long me = x->integer;
            freeReplyObject(x);
            x = redisCommand(rc, "GET {rwc}:%s:r", key);
            long long rd = x->type == REDIS_REPLY_STRING ? atoll(x->str) : 0;
            freeReplyObject(x);
            bad += me != 1 || rd != 0;
            usleep(1000);
            freeReplyObject(redisCommand(rc, "DECR {rwc}:%s:w", key));
        } else {
            freeReplyObject(redisCommand(rc, "INCR {rwc}:%s:r", key));
            x = redisCommand(rc, "GET {rwc}:%s:w", key);
            long long wn = x->type == REDIS_REPLY_STRING ? atoll(x->str) : 0;
            freeReplyObject(x);
            bad += wn != 0;
            usleep(1000);
            freeReplyObject(redisCommand(rc, "DECR {rwc}:%s:r", key));
        }
        r = h_call(c, rw_req("unlock", key, wr ? "write" : "read", NULL, 0, 0),
                   10000);
        if (r == NULL || !h_ok(r)) {
            json_decref(r);
            return 100;
        }
        json_decref(r);
    }
    redisFree(rc);
    h_close(c);
    return bad;
}

START_TEST(test_contention_two_daemons)
{
    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    pid_t pids[PROCS];
    for (int i = 0; i < PROCS; i++) {
        pids[i] = fork();
        ck_assert(pids[i] >= 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(contend(i));
        }
        h_track_pid(pids[i]);
    }
    int total = 0;
    for (int i = 0; i < PROCS; i++) {
        int st = 0;
        ck_assert(waitpid(pids[i], &st, 0) == pids[i]);
        h_untrack_pid(pids[i]);
        ck_assert_msg(WIFEXITED(st), "client %d died", i);
        ck_assert_msg(WEXITSTATUS(st) != 100, "client %d failed", i);
        total += WEXITSTATUS(st);
    }
    ck_assert_int_eq(total, 0);
}
END_TEST

/* --- holds a new grant through the same daemon rules out --------------- */

/* Redis loses the lock (FLUSHALL) while A writes; B's read through the
 * same daemon is granted, so A hears lock_lost before B hears its grant.
 * Then B's read is lost the same way to C's write. */
START_TEST(test_lost_before_local_grant)
{
    struct raw a, b, c;
    struct race rc;

    h_start("lock:\n  watchdog_ms: 60000\n");
    raw_open(&a, D.sock);
    raw_open(&b, D.sock);
    raw_open(&c, D.sock);
    raw_must(&a,
             "{\"id\":1,\"op\":\"lock\",\"key\":\"rw\",\"mode\":\"write\"}\n");
    h_r_do(&R, "FLUSHALL");
    raw_race(&a, &b,
             "{\"id\":2,\"op\":\"lock\",\"key\":\"rw\",\"mode\":\"read\"}\n",
             "lock_lost", "rw", 3000, &rc);
    raw_race_assert(&rc, "writer A, reader B");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "taken");
    raw_race_free(&rc);

    h_r_do(&R, "FLUSHALL");
    raw_race(&b, &c,
             "{\"id\":3,\"op\":\"lock\",\"key\":\"rw\",\"mode\":\"write\"}\n",
             "lock_lost", "rw", 3000, &rc);
    raw_race_assert(&rc, "reader B, writer C");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "taken");
    raw_race_free(&rc);
    close(a.fd);
    close(b.fd);
    close(c.fd);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(readers_share_writer_waits, 60),
        H_CASE(writer_preference, 60),
        H_CASE(downgrade, 60),
        H_CASE(reentrancy, 60),
        H_CASE(wrong_type_and_bad_requests, 60),
        H_CASE(fence_on_writes_only, 60),
        H_CASE(session_close_releases, 60),
        H_CASE(lock_lost_when_deleted, 60),
        H_CASE(watchdog_extend_info, 60),
        H_CASE(lone_reader_lease_key_gone, 30),
        H_CASE(reader_lease_runs_out, 60),
        H_CASE(detach_and_cancel, 60),
        H_CASE(max_hold, 60),
        H_CASE(redisson_layout, 60),
        H_CASE(list_and_force_unlock, 60),
        H_CASE(many_readers, 90),
        H_CASE(two_daemons, 60),
        H_CASE(redis_down, 90),
        H_CASE(lost_before_local_grant, 60),
        H_CASE(contention_two_daemons, 240),
    };
    return H_MAIN(fx, cases);
}
