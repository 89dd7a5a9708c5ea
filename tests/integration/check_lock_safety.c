/* Lock safety against one real leased and a real redis-server: a token is
 * never reused for a new acquisition, fences never go backwards (also when
 * Redis loses data) and stay exact integers, lock_lost comes before the
 * lease it vouched for can run out, max_hold holds exactly, and foreign
 * data in the lock keys is wrong_type, never a script error. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"
#include "order_util.h"

#include <signal.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "lock_safety",
    .redis = {&R},
    .daemons = {&D},
};

/* --- tokens ------------------------------------------------------------ */

struct exists_arg {
    const char *key;
    long long want;
};

static bool
redis_exists_is(void *arg)
{
    const struct exists_arg *a = arg;
    return h_r_int(&R, "EXISTS %s", a->key) == a->want;
}

/* A fixed lease runs out; the same owner locks again before anything
 * noticed: that is a new acquisition, so it gets a new token and a new
 * fence, the lost hold is reported first, and the old token no longer
 * unlocks anything. */
START_TEST(test_token_after_silent_loss)
{
    struct raw a;
    struct h_conn *b, *c;
    json_t *r, *ev = NULL, *rep = NULL;
    char tok[80];
    long long fence;

    h_start("lock:\n  watchdog_ms: 60000\n");
    raw_open(&a, D.sock);
    b = lk_connect(&D);
    c = lk_connect(&D);

    raw_send(&a, "{\"id\":1,\"op\":\"lock\",\"key\":\"d\",\"detach\":true,"
                 "\"ttl_ms\":300}\n");
    r = raw_line(&a, T_MS);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "first lock failed");
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    fence = jint(r, "fence");
    json_decref(r);

    struct exists_arg gone = {"leased:lock:{d}", 0};
    ck_assert_msg(h_wait_until(redis_exists_is, &gone, 10000),
                  "the 300 ms lease never ran out");

    raw_send(&a, "{\"id\":2,\"op\":\"lock\",\"key\":\"d\",\"detach\":true,"
                 "\"ttl_ms\":60000}\n");
    /* Read until the reply: the loss must come before it. */
    for (int i = 0; i < 10 && rep == NULL; i++) {
        json_t *j = raw_line(&a, T_MS);
        ck_assert_msg(j != NULL, "no reply to the second lock");
        if (jstr(j, "event") != NULL) {
            ck_assert_msg(rep == NULL, "event after the reply");
            ck_assert_str_eq(jstr(j, "event"), "lock_lost");
            ck_assert_ptr_null(ev);
            ev = j;
        } else {
            rep = j;
        }
    }
    ck_assert_msg(rep != NULL && jtrue(rep, "acquired"),
                  "second lock not acquired");
    ck_assert_msg(ev != NULL, "no lock_lost before the new acquisition");
    ck_assert_str_eq(jstr(ev, "key"), "d");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    ck_assert_int_eq(jint(rep, "count"), 1);
    ck_assert_msg(strcmp(jstr(rep, "token"), tok) != 0,
                  "a new acquisition reused the old token %s", tok);
    ck_assert_int_gt(jint(rep, "fence"), fence);
    json_decref(ev);
    json_decref(rep);

    /* The stale token is no longer a key to the lock. */
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "d", "token",
                tok);
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    r = lk_lock(c, "d", NULL, 60000, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);

    close(a.fd);
    h_close(b);
    h_close(c);
}
END_TEST

/* --- fences when Redis loses data --------------------------------------- */

/* FLUSHALL while A holds a watchdog lock and a fixed-lease lock: B's
 * fence from this daemon is still above A's, and A hears of both losses
 * soon, the fixed lease long before it would have run out. */
START_TEST(test_fence_after_flushall)
{
    struct h_conn *a, *b;
    json_t *r, *ev;
    long long fence = 0, t0;

    h_start("lock:\n  watchdog_ms: 3000\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    for (int i = 0; i < 6; i++) {
        r = lk_must(a, "w", NULL, NO_TTL, 0);
        ck_assert_int_gt(jint(r, "fence"), fence);
        fence = jint(r, "fence");
        json_decref(r);
        if (i < 5) {
            lk_unlock_ok(a, "w", NULL);
        }
    }
    r = lk_must(a, "f", NULL, 60000, 0);
    json_decref(r);

    redisReply *rep = h_redis_cmd(&R, "FLUSHALL");
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    t0 = h_now_ms();

    r = lk_must(b, "w", NULL, NO_TTL, 0);
    ck_assert_msg(jint(r, "fence") > fence,
                  "fence went back from %lld to %lld", fence,
                  (long long)jint(r, "fence"));
    json_decref(r);

    /* One pass (a third of watchdog_ms) finds w taken; that starts a
     * check of every lock, which finds f gone. */
    ev = h_lock_lost(a, "w", 10000);
    ck_assert_msg(ev != NULL, "no lock_lost for w");
    /* taken, unless a renewal ran between FLUSHALL and B's lock. */
    ck_assert_msg(strcmp(jstr(ev, "reason"), "taken") == 0 ||
                      strcmp(jstr(ev, "reason"), "expired") == 0,
                  "reason %s", jstr(ev, "reason"));
    json_decref(ev);
    ev = h_lock_lost(a, "f", 10000);
    ck_assert_msg(ev != NULL, "no lock_lost for the fixed-lease lock f");
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    json_decref(ev);
    ck_assert_msg(h_now_ms() - t0 < 10000, "losses reported after %lld ms",
                  h_now_ms() - t0);
    r = lk_unlock(a, "f", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* Redis restarts without its data: when the daemon reconnects it checks
 * every lock at once (the pass would take 20 s here), and the next fence
 * is still above the last one it handed out. */
START_TEST(test_recheck_on_reconnect)
{
    struct h_conn *a, *b;
    json_t *r, *ev;
    long long fence;

    h_start("lock:\n  watchdog_ms: 60000\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    json_decref(r);
    lk_unlock_ok(a, "w", NULL);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    fence = jint(r, "fence");
    json_decref(r);
    r = lk_must(a, "f", NULL, 60000, 0);
    json_decref(r);

    h_redis_kill(&R);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{w}"), 0);

    /* Both are reported, in whatever order their checks come back (the
     * two keys may travel on different connections). */
    bool seen_f = false, seen_w = false;
    long long deadline = h_now_ms() + 15000;
    while (!(seen_f && seen_w) && h_now_ms() < deadline) {
        ev = h_event(a, (int)(deadline - h_now_ms()));
        if (ev == NULL) {
            break;
        }
        if (jstr(ev, "event") != NULL &&
            strcmp(jstr(ev, "event"), "lock_lost") == 0) {
            ck_assert_str_eq(jstr(ev, "reason"), "expired");
            seen_f = seen_f || strcmp(jstr(ev, "key"), "f") == 0;
            seen_w = seen_w || strcmp(jstr(ev, "key"), "w") == 0;
        }
        json_decref(ev);
    }
    ck_assert_msg(seen_f, "no lock_lost for f after the restart");
    ck_assert_msg(seen_w, "no lock_lost for w after the restart");

    r = lk_must(b, "w", NULL, NO_TTL, 0);
    ck_assert_msg(jint(r, "fence") > fence,
                  "fence went back from %lld to %lld", fence,
                  (long long)jint(r, "fence"));
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* A check or renewal of a recheck that Redis refuses while the connection
 * stays up (just back, Redis may still be loading its data, or a
 * connection of the pool is not up yet) is tried again within a second
 * (ld_lease_pass_retry), not at the next pass, 40 s after the daemon
 * started here. Redis lost the locks (FLUSHALL), the daemon's
 * connections are dropped so that it rechecks when they are back, and
 * scripts are refused (ACL) until the recheck's renewal of w was:
 * w's lock_at_risk says it was. */
START_TEST(test_recheck_retried)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long t_start = h_now_ms();

    h_start("lock:\n  watchdog_ms: 120000\n");
    a = lk_connect(&D);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    json_decref(r);
    r = lk_must(a, "f", NULL, 600000, 0);
    json_decref(r);
    recheck_refused(&R, a, "lock_at_risk", "lock_lost", "w");

    /* Both, in either order (their keys may use different connections). */
    bool seen_f = false, seen_w = false;
    long long t0 = h_now_ms();
    long long deadline = t0 + 5000;
    while (!(seen_f && seen_w) && h_now_ms() < deadline) {
        ev = h_event(a, (int)(deadline - h_now_ms()));
        if (ev == NULL) {
            break;
        }
        if (raw_is_event(ev, "lock_lost", "f") ||
            raw_is_event(ev, "lock_lost", "w")) {
            ck_assert_str_eq(jstr(ev, "reason"), "expired");
            seen_f = seen_f || strcmp(jstr(ev, "key"), "f") == 0;
            seen_w = seen_w || strcmp(jstr(ev, "key"), "w") == 0;
        }
        json_decref(ev);
    }
    ck_assert_msg(seen_w, "no lock_lost for w within 5 s of scripts allowed");
    ck_assert_msg(seen_f, "no lock_lost for f within 5 s of scripts allowed");
    fprintf(stderr,
            "recheck_retried: lock_lost %lld ms after scripts allowed\n",
            h_now_ms() - t0);
    /* The pass (40 s after the start) could not have found them. */
    ck_assert_msg(h_now_ms() - t_start < 40000,
                  "too slow to tell the retry from the pass: %lld ms",
                  h_now_ms() - t_start);
    h_assert_stat(a, "locks_held", 0, T_MS);
    h_close(a);
}
END_TEST

/* --- a grant through the daemon that still counts another hold ---------- */

/* Lock KEY on raw connection C (ttl_ms 0: watchdog) and insist on it. */
static void
raw_must_lock(struct raw *c, const char *key, long long ttl_ms)
{
    char line[256];
    if (ttl_ms > 0) {
        snprintf(line, sizeof line,
                 "{\"id\":1,\"op\":\"lock\",\"key\":\"%s\",\"ttl_ms\":%lld}\n",
                 key, ttl_ms);
    } else {
        snprintf(line, sizeof line,
                 "{\"id\":1,\"op\":\"lock\",\"key\":\"%s\"}\n", key);
    }
    raw_must(c, line);
}

/* A holds a watchdog lock and a fixed lease; Redis loses both (FLUSHALL)
 * and B locks each through the same daemon: the daemon has just granted
 * a lock its own record says A holds, so A hears lock_lost (taken) before
 * B's grant reaches B. No pass runs meanwhile (watchdog_ms 60 s). */
START_TEST(test_lost_before_local_grant)
{
    struct raw a, b;
    struct race rc;

    h_start("lock:\n  watchdog_ms: 60000\n");
    raw_open(&a, D.sock);
    raw_open(&b, D.sock);
    raw_must_lock(&a, "w", 0);
    raw_must_lock(&a, "f", 60000);
    h_r_do(&R, "FLUSHALL");

    raw_race(&a, &b, "{\"id\":2,\"op\":\"lock\",\"key\":\"w\"}\n", "lock_lost",
             "w", 3000, &rc);
    raw_race_assert(&rc, "watchdog lock w");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "taken");
    raw_race_free(&rc);

    raw_race(&a, &b,
             "{\"id\":3,\"op\":\"lock\",\"key\":\"f\",\"ttl_ms\":60000}\n",
             "lock_lost", "f", 3000, &rc);
    raw_race_assert(&rc, "fixed-lease lock f");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "taken");
    raw_race_free(&rc);
    close(a.fd);
    close(b.fd);
}
END_TEST

/* A fixed lease that Redis loses early is found on the next pass (a third
 * of watchdog_ms), without anyone else touching the lock. */
START_TEST(test_fixed_lease_checked)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long t0, dt;

    h_start("lock:\n  watchdog_ms: 1500\n");
    a = lk_connect(&D);
    r = lk_must(a, "f", NULL, 60000, 0);
    json_decref(r);
    h_r_do(&R, "FLUSHALL");
    t0 = h_now_ms();
    ev = h_lock_lost(a, "f", 5000);
    dt = h_now_ms() - t0;
    ck_assert_msg(ev != NULL, "no lock_lost for a fixed lease Redis lost");
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    json_decref(ev);
    /* One pass period (500 ms) and its reply, with room for a slow
     * machine. */
    ck_assert_msg(dt < 2000, "lock_lost %lld ms after the loss", dt);
    h_close(a);
}
END_TEST

/* --- lock_lost before the lease ends ------------------------------------ */

/* Redis stops answering while a watchdog lock is held: the holder hears
 * lock_lost before the lease Redis granted can run out, that is before
 * another client could be granted the lock. */
START_TEST(test_lost_before_lease_end)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long t_before, pttl, t_ev;

    h_start("lock:\n  watchdog_ms: 10000\n");
    a = lk_connect(&D);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    json_decref(r);

    /* Redis keeps the lock at least until t_before + pttl. */
    t_before = h_now_ms();
    pttl = h_r_int(&R, "PTTL leased:lock:{w}");
    ck_assert_msg(pttl > 5000, "PTTL %lld", pttl);
    h_redis_signal(&R, SIGSTOP);

    ev = h_lock_lost(a, "w", 30000);
    t_ev = h_now_ms();
    ck_assert_msg(ev != NULL, "no lock_lost while redis was stopped");
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    ck_assert_msg(t_ev < t_before + pttl,
                  "lock_lost %lld ms after the lease could end in redis",
                  t_ev - (t_before + pttl));
    h_redis_signal(&R, SIGCONT);
    h_close(a);
}
END_TEST

/* --- exact fences -------------------------------------------------------- */

/* Lock KEY with a fixed lease and return the fence, or -1 after asserting
 * wrong_type naming KEY. Unlocks what it got. */
static long long
fence_of(struct h_conn *c, const char *key)
{
    json_t *r = lk_lock(c, key, NULL, 60000, 0);
    long long f;
    if (!h_ok(r)) {
        ck_assert_str_eq(h_errcode(r), "wrong_type");
        ck_assert_msg(jmsg(r) != NULL && strstr(jmsg(r), key) != NULL,
                      "wrong_type does not name %s", key);
        json_decref(r);
        return -1;
    }
    ck_assert_msg(jtrue(r, "acquired"), "%s not acquired", key);
    f = jint(r, "fence");
    json_decref(r);
    lk_unlock_ok(c, key, NULL);
    return f;
}

static void
set_counter(const char *key, const char *value)
{
    redisReply *rep = h_redis_cmd(&R, "SET leased:lock:{%s}:fence %s", key,
                                  value);
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
}

static void
expect_foreign(struct h_conn *c, const char *key, const char *value)
{
    set_counter(key, value);
    ck_assert_int_eq(fence_of(c, key), -1);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{%s}", key), 0);
    redisReply *rep = h_redis_cmd(&R, "GET leased:lock:{%s}:fence", key);
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING &&
                      strcmp(rep->str, value) == 0,
                  "counter of %s changed", key);
    freeReplyObject(rep);
}

START_TEST(test_fences_exact)
{
    struct h_conn *a;

    h_start(NULL);
    a = lk_connect(&D);

    set_counter("f53a", "9007199254740991");
    ck_assert_int_eq(fence_of(a, "f53a"), 9007199254740992LL);
    ck_assert_int_eq(fence_of(a, "f53a"), 9007199254740993LL);
    ck_assert_int_eq(fence_of(a, "f53a"), 9007199254740994LL);

    set_counter("f53b", "9007199254740992");
    ck_assert_int_eq(fence_of(a, "f53b"), 9007199254740993LL);
    ck_assert_int_eq(fence_of(a, "f53b"), 9007199254740994LL);

    /* The last fence there is; after it the counter is foreign data. */
    set_counter("f63", "9223372036854775806");
    ck_assert_int_eq(fence_of(a, "f63"), 9223372036854775807LL);
    ck_assert_int_eq(fence_of(a, "f63"), -1);

    expect_foreign(a, "fmax", "9223372036854775807");
    expect_foreign(a, "fneg", "-5");
    expect_foreign(a, "fabc", "abc");
    expect_foreign(a, "fzero", "0");
    expect_foreign(a, "flead", "007");
    expect_foreign(a, "fbig", "99999999999999999999");

    /* Past 2^53 the fence is held against the floor exactly: the
     * counter, moved on by another daemon to 2^53+4, is not one that went
     * back from this daemon's 2^53+3. */
    set_counter("f53c", "9007199254740994");
    ck_assert_int_eq(fence_of(a, "f53c"), 9007199254740995LL);
    set_counter("f53c", "9007199254740996");
    ck_assert_int_eq(fence_of(a, "f53c"), 9007199254740997LL);
    h_close(a);
}
END_TEST

/* SIDE ("read" or "write") of KEY with a fixed lease: its fence (unlocked
 * again). */
static long long
side_fence_of(struct h_conn *c, const char *key, const char *side)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "lock", "key", key,
                        "mode", side, "ttl_ms", 60000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "%s %s: %s", side, key,
                  h_ok(r) ? "not acquired" : h_errcode(r));
    long long f = jint(r, "fence");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", key, "mode",
                side);
    ck_assert_msg(h_ok(r), "unlock %s %s: %s", side, key, h_errcode(r));
    json_decref(r);
    return f;
}

static long long
write_fence_of(struct h_conn *c, const char *key)
{
    return side_fence_of(c, key, "write");
}

static long long
read_fence_of(struct h_conn *c, const char *key)
{
    return side_fence_of(c, key, "read");
}

/* Both sides of a read-write lock give fences above 2^53 exactly, where a
 * Lua number would round them: a reader the counter as it is, a writer
 * its next value. */
START_TEST(test_rw_fences_exact)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    set_counter("r53", "9007199254740993");
    ck_assert_int_eq(read_fence_of(a, "r53"), 9007199254740993LL);
    ck_assert_int_eq(write_fence_of(a, "r53"), 9007199254740994LL);
    set_counter("r53", "9007199254740995");
    ck_assert_int_eq(write_fence_of(a, "r53"), 9007199254740996LL);
    ck_assert_int_eq(read_fence_of(a, "r53"), 9007199254740996LL);
    /* A writer's floor goes with it, and INCR's answer is held against it
     * in the script as a double: the floor 2^53+3 and the answer 2^53+5
     * round alike, and the counter, moved on by another daemon to 2^53+4,
     * is still not one that went back. */
    set_counter("r96", "9007199254740994");
    ck_assert_int_eq(write_fence_of(a, "r96"), 9007199254740995LL);
    set_counter("r96", "9007199254740996");
    ck_assert_int_eq(write_fence_of(a, "r96"), 9007199254740997LL);
    h_close(a);
}
END_TEST

/* A fence counter that went back without going away (a restart from an
 * older RDB, a failover to a lagging replica): the next fence from this
 * daemon is still above every fence it handed out, for plain and write
 * locks alike. */
START_TEST(test_fence_counter_lowered)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    long long f = 0, g = 0;
    for (int i = 0; i < 5; i++) {
        f = fence_of(a, "low");
        g = write_fence_of(a, "loww");
    }
    ck_assert_int_eq(f, 5);
    ck_assert_int_eq(g, 5);
    set_counter("low", "1");
    set_counter("loww", "1");
    f = fence_of(a, "low");
    ck_assert_msg(f > 5, "plain lock: fence went back from 5 to %lld", f);
    g = write_fence_of(a, "loww");
    ck_assert_msg(g > 5, "write lock: fence went back from 5 to %lld", g);

    /* Gone, or reset to "0": the same, from the highest fence handed
     * out here. */
    ck_assert_int_eq(h_r_int(&R, "DEL leased:lock:{low}:fence"), 1);
    ck_assert_int_eq(fence_of(a, "low"), f + 1);
    set_counter("low", "0");
    ck_assert_int_eq(fence_of(a, "low"), f + 2);
    set_counter("loww", "0");
    ck_assert_int_eq(write_fence_of(a, "loww"), g + 1);
    /* Below zero is foreign data, also under a floor: refused, and the
     * counter left as it was. */
    expect_foreign(a, "low", "-5");
    expect_foreign(a, "low", "-1");
    h_close(a);
}
END_TEST

static bool
refence_hold_gone(void *arg)
{
    (void)arg;
    return h_r_int(&R, "EXISTS leased:lock:{rf}") == 0;
}

/* The fence of a plain lock comes back at or below the one this daemon
 * handed out last (the counter went back) and raising the counter fails
 * (here SET is refused by ACL): the lock was taken all the same, so the
 * hold is given back at once, not left for its lease, and the request
 * fails. Once SET is allowed again the fence is above every earlier
 * one. */
START_TEST(test_refence_refused)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    long long f = 0;
    for (int i = 0; i < 3; i++) {
        f = fence_of(a, "rf");
    }
    ck_assert_int_eq(f, 3);
    set_counter("rf", "1");
    h_r_do(&R, "ACL SETUSER default -set");
    json_t *r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key", "rf",
                        "ttl_ms", 60000);
    h_r_do(&R, "ACL SETUSER default +set");
    ck_assert_msg(r != NULL && !h_ok(r), "granted without a fence above 3: %s",
                  h_dump(r));
    json_decref(r);
    ck_assert_msg(h_wait_until(refence_hold_gone, NULL, 10000),
                  "the hold taken stays in redis");
    f = fence_of(a, "rf");
    ck_assert_msg(f > 3, "fence went back from 3 to %lld", f);
    h_close(a);
}
END_TEST

/* --- max_hold ------------------------------------------------------------ */

static long long since;

static bool
past_700(void *arg)
{
    (void)arg;
    return h_now_ms() - since >= 700;
}

static bool
cap_key_gone(void *arg)
{
    (void)arg;
    return h_r_int(&R, "EXISTS leased:lock:{cap}") == 0;
}

/* A reentry and an extend just before max_hold cannot carry the lock past
 * it: every lease is clipped to the time left, and at max_hold the lock is
 * released with lock_lost max_hold. */
START_TEST(test_max_hold_exact)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long dt, pttl;

    h_start("lock:\n  watchdog_ms: 3000\n  max_hold_ms: 1000\n");
    a = lk_connect(&D);
    r = lk_must(a, "cap", NULL, NO_TTL, 0);
    /* The cap runs from when the daemon sent the acquisition, which is
     * before its reply came: counting from the reply never asks for less
     * than the cap allows, also when the daemon is slow (valgrind). */
    since = h_now_ms();
    ck_assert_int_le(jint(r, "lease_ms"), 1000);
    json_decref(r);
    ck_assert_msg(h_wait_until(past_700, NULL, 5000), "clock");

    r = lk_must(a, "cap", NULL, NO_TTL, 0);
    ck_assert_int_eq(jint(r, "count"), 2);
    dt = h_now_ms() - since;
    ck_assert_msg(jint(r, "lease_ms") <= 1000 - 700,
                  "reentry lease %lld ms past max_hold",
                  (long long)jint(r, "lease_ms"));
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "cap",
                "ttl_ms", 60000);
    ck_assert_ptr_nonnull(r);
    if (h_ok(r)) {
        ck_assert_msg(jint(r, "lease_ms") <= 1000 - 700,
                      "extend lease %lld ms past max_hold",
                      (long long)jint(r, "lease_ms"));
    }
    json_decref(r);
    pttl = h_r_int(&R, "PTTL leased:lock:{cap}");
    dt = h_now_ms() - since;
    ck_assert_msg(pttl <= 1000 - dt + 50 || pttl == -2,
                  "redis keeps the lock %lld ms, %lld ms left to max_hold",
                  pttl, 1000 - dt);

    ev = h_lock_lost(a, "cap", 5000);
    dt = h_now_ms() - since;
    ck_assert_msg(ev != NULL, "no lock_lost at max_hold");
    ck_assert_str_eq(jstr(ev, "reason"), "max_hold");
    json_decref(ev);
    ck_assert_msg(dt < 1500, "max_hold lock_lost after %lld ms", dt);
    /* The event goes out first, so that the holder stops before anyone
     * else can start; the release follows it. */
    ck_assert_msg(h_wait_until(cap_key_gone, NULL, 2000),
                  "the lock is still in redis after max_hold");
    h_close(a);
}
END_TEST

/* --- foreign data in lock hashes ---------------------------------------- */

START_TEST(test_foreign_hold_count)
{
    struct h_conn *a;
    json_t *r, *ev;
    char tok[80];
    redisReply *rep;

    h_start("lock:\n  watchdog_ms: 600\n");
    a = lk_connect(&D);

    /* A reentry on a hold count leased did not write. */
    r = lk_must(a, "W", NULL, 60000, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    rep = h_redis_cmd(&R, "HSET leased:lock:{W} %s notanumber", tok);
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    r = lk_lock(a, "W", NULL, 60000, 0);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    ck_assert_msg(strstr(jmsg(r), "'W'") != NULL, "key not named");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "W", "token",
                tok);
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);

    /* No holder has an empty name: such a hash is not a lock at all. */
    rep = h_redis_cmd(&R, "HSET leased:lock:{E} %s 1", "");
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    r = lk_lock(a, "E", NULL, 60000, 0);
    ck_assert_msg(r != NULL && h_errcode(r) != NULL &&
                      strcmp(h_errcode(r), "wrong_type") == 0,
                  "empty field: %s", r ? h_errcode(r) : "no reply");
    json_decref(r);

    /* The watchdog finds a count it did not write: the lock is lost. */
    r = lk_must(a, "V", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    rep = h_redis_cmd(&R, "HSET leased:lock:{V} %s 1.5", tok);
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    ev = h_lock_lost(a, "V", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost for a foreign hold count");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    json_decref(ev);
    h_close(a);
}
END_TEST

/* --- released by token from another session ----------------------------- */

/* The lock_lost A was sent for KEY under TOKEN. B's answer that released
 * it was sent in the same turn as the event, so A's ping is answered
 * after it: the event must be there already, no waiting. */
static void
expect_lost_now(struct h_conn *a, const char *key, const char *token,
                const char *reason)
{
    h_assert_ping(a);
    json_t *ev = h_lock_lost(a, key, 0);
    ck_assert_msg(ev != NULL, "no lock_lost for %s", key);
    ck_assert_str_eq(jstr(ev, "token"), token);
    ck_assert_str_eq(jstr(ev, "reason"), reason);
    json_decref(ev);
}

static void
expect_no_event(struct h_conn *a)
{
    h_assert_ping(a);
    json_t *ev = h_event(a, 0);
    ck_assert_msg(ev == NULL, "unexpected event %s",
                  ev != NULL ? jstr(ev, "event") : "");
}

/* Unlock KEY by TOKEN from C (one JSON fragment for "keys" or "key"),
 * which must answer ok with RELEASED. */
static void
unlock_by_token(struct h_conn *c, json_t *req, bool released)
{
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL && h_ok(r), "unlock by token: %s",
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert_int_eq(jtrue(r, "released"), released);
    json_decref(r);
}

/* A session-bound lock of A released by token from B, through the same
 * daemon: A hears lock_lost at once (before C can be granted the key),
 * for a plain, a read-write and a group lock; a hold count that stays
 * above zero is no loss. An extend by token from B that finds A's hold
 * gone tells A as well. */
START_TEST(test_released_by_token_elsewhere)
{
    struct h_conn *a, *b, *c;
    json_t *r;
    char tok[80];

    h_start("lock:\n  watchdog_ms: 30000\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    c = lk_connect(&D);

    /* Plain, reentered once: the first release by token keeps a hold. */
    r = lk_must(a, "tok", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    json_decref(lk_must(a, "tok", NULL, NO_TTL, 0));
    unlock_by_token(b,
                    json_pack("{s:s,s:s,s:s}", "op", "unlock", "key", "tok",
                              "token", tok),
                    false);
    expect_no_event(a);
    unlock_by_token(b,
                    json_pack("{s:s,s:s,s:s}", "op", "unlock", "key", "tok",
                              "token", tok),
                    true);
    expect_lost_now(a, "tok", tok, "expired");
    r = lk_must(c, "tok", NULL, NO_TTL, 0);
    ck_assert_int_eq(jint(r, "fence"), 2);
    json_decref(r);
    h_expect_code(lk_unlock(a, "tok", NULL), "not_held", "A's unlock");

    /* Read side of a read-write lock. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "rwt", "mode",
                "read");
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "read lock");
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    unlock_by_token(b,
                    json_pack("{s:s,s:s,s:s,s:s}", "op", "unlock", "key",
                              "rwt", "mode", "read", "token", tok),
                    true);
    expect_lost_now(a, "rwt", tok, "expired");

    /* A group: each key is lost on its own. */
    r = h_callf(a, T_MS, "{s:s,s:[s,s]}", "op", "lock", "keys", "g1", "g2");
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "group lock");
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    unlock_by_token(b,
                    json_pack("{s:s,s:[s,s],s:s}", "op", "unlock", "keys",
                              "g1", "g2", "token", tok),
                    true);
    h_assert_ping(a);
    bool seen[2] = {false, false};
    for (int i = 0; i < 2; i++) {
        json_t *ev = h_event(a, 0);
        ck_assert_msg(ev != NULL, "%d of the group's 2 keys lost", i);
        ck_assert_str_eq(jstr(ev, "event"), "lock_lost");
        ck_assert_str_eq(jstr(ev, "token"), tok);
        ck_assert_str_eq(jstr(ev, "reason"), "expired");
        int k = strcmp(jstr(ev, "key"), "g1") == 0 ? 0 : 1;
        ck_assert_msg(!seen[k], "%s lost twice", jstr(ev, "key"));
        seen[k] = true;
        json_decref(ev);
    }

    /* An extend by token that finds the hold gone behind the daemon's
     * back: A hears it now, not at the next renewal. */
    r = lk_must(a, "ext", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    h_delete_lock_key(&R, "ext");
    h_expect_code(h_callf(b, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key",
                          "ext", "token", tok, "ttl_ms", 60000),
                  "not_held", "B's extend");
    expect_lost_now(a, "ext", tok, "expired");

    /* So does a reentry by token. */
    r = lk_must(a, "tre", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    h_delete_lock_key(&R, "tre");
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "tre", "token",
                tok);
    ck_assert_msg(r != NULL && !jtrue(r, "acquired"),
                  "B's reentry by token took a lock that is gone");
    json_decref(r);
    expect_lost_now(a, "tre", tok, "expired");

    /* A's own release by token is an answer, not a loss. */
    r = lk_must(a, "own", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    unlock_by_token(a,
                    json_pack("{s:s,s:s,s:s}", "op", "unlock", "key", "own",
                              "token", tok),
                    true);
    expect_no_event(a);
    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

/* --- a short lease on a watchdog lock ------------------------------------ */

#define SHORT_WATCHDOG_MS 30000 /* one pass every 10 s */
#define SHORT_TTL_MS 1000       /* far shorter than a pass period */

static void
start_short(void)
{
    char yaml[64];
    snprintf(yaml, sizeof yaml, "lock:\n  watchdog_ms: %d\n",
             SHORT_WATCHDOG_MS);
    h_start(yaml);
}

/* {"op":"lock.info"} for KEY by TOKEN (MODE NULL: a plain lock). */
static json_t *
info_req(const char *key, const char *mode, const char *token)
{
    json_t *req = json_pack("{s:s,s:s,s:s}", "op", "lock.info", "key", key,
                            "token", token);
    if (mode != NULL) {
        json_object_set_new(req, "mode", json_string(mode));
    }
    return req;
}

struct renewed_want {
    struct h_conn *c;
    const char *key, *mode, *token;
};

/* TOKEN still holds KEY with more than SHORT_TTL_MS left: renewed. */
static bool
renewed(void *arg)
{
    const struct renewed_want *w = arg;
    json_t *r = h_call(w->c, info_req(w->key, w->mode, w->token), T_MS);
    bool ok = r != NULL && jtrue(r, "mine") &&
              jint(r, "ttl_ms") > SHORT_TTL_MS;
    json_decref(r);
    return ok;
}

/* After an op that left TOKEN's watchdog hold of KEY SHORT_TTL_MS: the
 * daemon renews it before that lease ends (the next pass is ~10 s away),
 * C cannot take it, and its holder A heard of no loss. */
static void
expect_renewed(struct h_conn *a, struct h_conn *c, const char *key,
               const char *mode, const char *token)
{
    struct renewed_want w = {c, key, mode, token};
    ck_assert_msg(h_wait_until(renewed, &w, SHORT_TTL_MS),
                  "%s was not renewed within its %d ms lease", key,
                  SHORT_TTL_MS);
    json_t *req = lk_req(key, NULL, NO_TTL, 0);
    if (mode != NULL) {
        json_object_set_new(req, "mode", json_string("write"));
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "acquired"),
                  "another session got %s", key);
    json_decref(r);
    expect_no_event(a);
}

static char *
must_token(json_t *r, const char *what)
{
    ck_assert_msg(r != NULL && h_ok(r), "%s: %s", what,
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert_msg(jtrue(r, "acquired"), "%s failed", what);
    char *t = strdup(jstr(r, "token"));
    json_decref(r);
    return t;
}

/* A watchdog lock whose lease an op made shorter than the time to the
 * next pass: extend, reentry, reentry by token, the read side of a
 * read-write lock, a group's extend. Each is renewed in time, as the
 * watchdog renews any lock of a live session, instead of expiring in
 * Redis until the next pass finds it gone (lock_lost ~10 s late, after
 * another client got it) or the lost timer ends it (redis_unavailable
 * while Redis is fine). */
START_TEST(test_short_lease_on_watchdog_lock)
{
    struct h_conn *a, *c;
    json_t *r;
    char *tok;

    start_short();
    a = lk_connect(&D);
    c = lk_connect(&D);

    /* extend */
    tok = must_token(lk_lock(a, "sx", NULL, NO_TTL, 0), "lock sx");
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "sx",
                "ttl_ms", SHORT_TTL_MS);
    ck_assert_msg(r != NULL && jint(r, "lease_ms") == SHORT_TTL_MS,
                  "extend sx");
    json_decref(r);
    expect_renewed(a, c, "sx", NULL, tok);
    free(tok);

    /* reentry by owner */
    tok = must_token(lk_lock(a, "sr", NULL, NO_TTL, 0), "lock sr");
    json_decref(lk_must(a, "sr", NULL, SHORT_TTL_MS, 0));
    expect_renewed(a, c, "sr", NULL, tok);
    free(tok);

    /* reentry by token, from another session */
    tok = must_token(lk_lock(a, "st", NULL, NO_TTL, 0), "lock st");
    r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "lock", "key", "st",
                "token", tok, "ttl_ms", SHORT_TTL_MS);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "reentry by token");
    json_decref(r);
    expect_renewed(a, c, "st", NULL, tok);
    free(tok);

    /* the read side of a read-write lock */
    tok = must_token(h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key",
                             "sw", "mode", "read"),
                     "read lock sw");
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key", "sw",
                "mode", "read", "ttl_ms", SHORT_TTL_MS);
    ck_assert_msg(r != NULL && h_ok(r), "extend read sw");
    json_decref(r);
    expect_renewed(a, c, "sw", "read", tok);
    free(tok);

    /* a group's extend */
    tok = must_token(h_callf(a, T_MS, "{s:s,s:[s,s]}", "op", "lock", "keys",
                             "sg1", "sg2"),
                     "lock sg1, sg2");
    r = h_callf(a, T_MS, "{s:s,s:[s,s],s:i}", "op", "extend", "keys", "sg1",
                "sg2", "ttl_ms", SHORT_TTL_MS);
    ck_assert_msg(r != NULL && h_ok(r), "extend sg1, sg2");
    json_decref(r);
    expect_renewed(a, c, "sg1", NULL, tok);
    expect_renewed(a, c, "sg2", NULL, tok);
    free(tok);
    h_close(a);
    h_close(c);
}
END_TEST

/* A lock found gone before its lease could end means Redis lost data:
 * every other lock is looked at then, not at the next pass (30 s here).
 * The shortened lease's early renewal, a third into it, is what finds
 * it gone; the flush must come before that renewal. */
#define EARLY_TTL_MS 9000

START_TEST(test_early_loss_rechecks_all)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long t0, extended;

    h_start("lock:\n  watchdog_ms: 90000\n");
    a = lk_connect(&D);
    json_decref(lk_must(a, "fx", NULL, 600000, 0));
    json_decref(lk_must(a, "se", NULL, NO_TTL, 0));
    extended = h_now_ms();
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "se",
                "ttl_ms", EARLY_TTL_MS);
    ck_assert_msg(r != NULL && jint(r, "lease_ms") == EARLY_TTL_MS,
                  "extend se: %s", h_dump(r));
    json_decref(r);
    h_r_do(&R, "FLUSHALL");
    t0 = h_now_ms();
    ck_assert_msg(t0 - extended < EARLY_TTL_MS / 3 - 500,
                  "too slow to flush before the early renewal: %lld ms",
                  t0 - extended);
    ev = h_lock_lost(a, "fx", EARLY_TTL_MS);
    ck_assert_msg(ev != NULL,
                  "no lock_lost for fx within %d ms of the loss found on se",
                  EARLY_TTL_MS);
    fprintf(stderr, "fx lost %lld ms after the flush\n", h_now_ms() - t0);
    json_decref(ev);
    h_close(a);
}
END_TEST

/* The same shortened lease while Redis does not answer: lock_lost comes
 * before that lease could end in Redis, not at the next pass. */
START_TEST(test_short_lease_lost_in_time)
{
    struct h_conn *a;
    json_t *r, *ev;

    start_short();
    a = lk_connect(&D);
    json_decref(lk_must(a, "sl", NULL, NO_TTL, 0));
    long long t_sent = h_now_ms();
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "sl",
                "ttl_ms", SHORT_TTL_MS);
    ck_assert_msg(r != NULL && h_ok(r), "extend sl");
    json_decref(r);
    h_redis_signal(&R, SIGSTOP);
    ev = h_lock_lost(a, "sl", SHORT_WATCHDOG_MS);
    long long t_ev = h_now_ms();
    h_redis_signal(&R, SIGCONT);
    ck_assert_msg(ev != NULL, "no lock_lost while redis was stopped");
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    ck_assert_msg(t_ev < t_sent + SHORT_TTL_MS,
                  "lock_lost %lld ms after the extend's lease could end",
                  t_ev - (t_sent + SHORT_TTL_MS));
    h_close(a);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(token_after_silent_loss, 60),
        H_CASE(fence_after_flushall, 60),
        H_CASE(recheck_on_reconnect, 90),
        H_CASE(recheck_retried, 60),
        H_CASE(lost_before_local_grant, 60),
        H_CASE(fixed_lease_checked, 60),
        H_CASE(lost_before_lease_end, 90),
        H_CASE(fences_exact, 60),
        H_CASE(fence_counter_lowered, 60),
        H_CASE(refence_refused, 60),
        H_CASE(rw_fences_exact, 60),
        H_CASE(max_hold_exact, 60),
        H_CASE(foreign_hold_count, 60),
        H_CASE(released_by_token_elsewhere, 60),
        H_CASE(short_lease_on_watchdog_lock, 60),
        H_CASE(short_lease_lost_in_time, 60),
        H_CASE(early_loss_rechecks_all, 60),
    };

    return H_MAIN(fx, cases);
}
