/* The lock part of the wire contract against one real leased and a real
 * redis-server: lock, unlock, extend, lock.info, lock_lost, waiting,
 * fencing, limits, Redis loss, the Redisson layout and WAIT. Tests that
 * need several daemons or client processes are in check_lock_multi.c. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"

#include "ld_lua.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_redis R;
static struct h_redis R2;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "locks",
    .redis = {&R, &R2},
    .daemons = {&D},
};

static void
expect_bad(struct h_conn *c, const char *line, const char *field)
{
    json_t *r;
    ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
    r = h_recv(c, T_MS);
    ck_assert_msg(r != NULL, "no reply to %s", line);
    ck_assert_msg(!h_ok(r), "expected bad_request for %s", line);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    const char *msg = json_string_value(
        json_object_get(json_object_get(r, "error"), "message"));
    ck_assert_msg(msg != NULL && strstr(msg, field) != NULL,
                  "message for %s does not name %s: %s", line, field, msg);
    json_decref(r);
}

/* --- acquire, reentry, release, fencing, Redis layout ------------------ */

struct key_gone_want {
    const struct h_redis *r;
    const char *key;
};

static bool
key_gone(void *arg)
{
    const struct key_gone_want *w = arg;
    return h_r_int(w->r, "EXISTS %s", w->key) == 0;
}

/* Wait until Redis no longer has KEY (its lease ran out), and assert it. */
static void
wait_key_gone(const struct h_redis *r, const char *key)
{
    struct key_gone_want w = {r, key};
    ck_assert_msg(h_wait_until(key_gone, &w, 10000), "%s still in Redis", key);
}

START_TEST(test_lock_reentry_fence)
{
    struct h_conn *a, *b;
    json_t *r;
    char tok[80];
    long long fence;

    h_start("lock:\n  watchdog_ms: 3000\n");
    a = lk_connect(&D);
    b = lk_connect(&D);

    r = lk_must(a, "order:42", NULL, NO_TTL, 0);
    ck_assert_msg(h_is_token(jstr(r, "token")), "token %s", jstr(r, "token"));
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    ck_assert_int_eq(jint(r, "count"), 1);
    ck_assert_int_eq(jint(r, "lease_ms"), 3000);
    fence = jint(r, "fence");
    ck_assert_int_ge(fence, 1);
    json_decref(r);

    /* Redisson's layout: a hash, our token as field, the count as value;
     * the fence counter beside it without TTL, in the same slot. */
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{order:42} %s", tok), 1);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{order:42}"), 0);
    ck_assert_int_eq(h_r_int(&R, "GET leased:lock:{order:42}:fence"), fence);
    ck_assert_int_eq(h_r_int(&R, "PTTL leased:lock:{order:42}:fence"), -1);

    /* Reentry: same token, same fence, count 2. */
    r = lk_must(a, "order:42", NULL, NO_TTL, 0);
    ck_assert_str_eq(jstr(r, "token"), tok);
    ck_assert_int_eq(jint(r, "count"), 2);
    ck_assert_int_eq(jint(r, "fence"), fence);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{order:42} %s", tok), 2);
    ck_assert_int_eq(h_stat(a, "locks_held"), 1);

    /* Another owner of the same session, and another session: no. */
    r = lk_lock(a, "order:42", "worker-2", NO_TTL, 0);
    ck_assert(h_ok(r));
    ck_assert(!jtrue(r, "acquired"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    ck_assert_int_le(jint(r, "ttl_ms"), 3000);
    ck_assert_ptr_null(json_object_get(r, "token"));
    json_decref(r);
    r = lk_lock(b, "order:42", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);

    /* lock.info: mine with the count for the holder, not for others. */
    r = lk_info(a, "order:42");
    ck_assert(jtrue(r, "locked"));
    ck_assert(jtrue(r, "mine"));
    ck_assert_int_eq(jint(r, "count"), 2);
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    json_decref(r);
    r = lk_info(b, "order:42");
    ck_assert(jtrue(r, "locked"));
    ck_assert(!jtrue(r, "mine"));
    ck_assert_ptr_null(json_object_get(r, "count"));
    json_decref(r);
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "lock.info", "key", "order:42",
                "token", tok);
    ck_assert(h_ok(r) && jtrue(r, "mine"));
    ck_assert_int_eq(jint(r, "count"), 2);
    json_decref(r);

    /* Unlock twice: a hold remains, then the lock is free. */
    r = lk_unlock(a, "order:42", NULL);
    ck_assert(h_ok(r));
    ck_assert(!jtrue(r, "released"));
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    r = lk_unlock(a, "order:42", NULL);
    ck_assert(h_ok(r));
    ck_assert(jtrue(r, "released"));
    ck_assert_int_eq(jint(r, "count"), 0);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{order:42}"), 0);
    ck_assert_int_eq(h_stat(a, "locks_held"), 0);
    r = lk_info(a, "order:42");
    ck_assert(!jtrue(r, "locked"));
    ck_assert(!jtrue(r, "mine"));
    json_decref(r);

    /* A new acquisition: new token, next fence. */
    r = lk_must(b, "order:42", NULL, NO_TTL, 0);
    ck_assert_str_ne(jstr(r, "token"), tok);
    ck_assert_int_eq(jint(r, "fence"), fence + 1);
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    lk_unlock_ok(b, "order:42", NULL);

    /* The fence survives expiry: a lease that runs out still moves it. */
    r = lk_must(a, "order:42", NULL, 100, 0);
    ck_assert_int_eq(jint(r, "fence"), fence + 2);
    ck_assert_int_eq(jint(r, "lease_ms"), 100);
    json_decref(r);
    r = lk_must(b, "order:42", NULL, NO_TTL, 2000); /* after expiry */
    ck_assert_int_eq(jint(r, "fence"), fence + 3);
    json_decref(r);

    ck_assert_int_ge(h_stat(a, "lock_acquired"), 5);
    ck_assert_int_ge(h_stat(a, "lock_released"), 2);
    ck_assert_int_ge(h_stat(a, "lock_contended"), 2);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- field validation -------------------------------------------------- */

START_TEST(test_validation)
{
    struct h_conn *c;
    json_t *r;

    h_start("limits:\n  max_key_bytes: 16\n");
    c = lk_connect(&D);

    expect_bad(c, "{\"op\":\"lock\"}\n", "key");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"\"}\n", "key");
    expect_bad(c, "{\"op\":\"lock\",\"key\":7}\n", "key");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k23456789012345678\"}\n", "key");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"ttl_ms\":0}\n", "ttl_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"ttl_ms\":-5}\n", "ttl_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"ttl_ms\":1099511627777}\n",
               "ttl_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"ttl_ms\":\"1000\"}\n",
               "ttl_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"wait_ms\":-2}\n",
               "wait_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"wait_ms\":2147483649}\n",
               "wait_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"wait_ms\":1.5}\n",
               "wait_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"owner\":3}\n", "owner");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"detach\":\"yes\"}\n",
               "detach");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"detach\":true}\n",
               "ttl_ms");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"token\":\"\"}\n", "token");
    expect_bad(c, "{\"op\":\"lock\",\"key\":\"k\",\"token\":5}\n", "token");
    expect_bad(c, "{\"op\":\"unlock\"}\n", "key");
    expect_bad(c, "{\"op\":\"unlock\",\"key\":\"k\",\"token\":\"\"}\n",
               "token");
    expect_bad(c, "{\"op\":\"extend\",\"key\":\"k\"}\n", "ttl_ms");
    expect_bad(c, "{\"op\":\"extend\",\"key\":\"k\",\"ttl_ms\":0}\n",
               "ttl_ms");
    expect_bad(c, "{\"op\":\"lock.info\",\"key\":\"\"}\n", "key");
    expect_bad(c, "{\"op\":\"lock.info\",\"key\":\"k\",\"owner\":[]}\n",
               "owner");
    /* Nothing above took a lock. */
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{k}"), 0);

    /* The bounds themselves are accepted. */
    r = lk_must(c, "k", NULL, 2147483648LL, 0);
    ck_assert_int_eq(jint(r, "lease_ms"), 2147483648LL);
    json_decref(r);
    lk_unlock_ok(c, "k", NULL);
    r = lk_must(c, "k", NULL, 1000, 2147483648LL);
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "k", "owner",
                "");
    ck_assert_msg(h_ok(r), "unlock with owner \"\": %s", h_errcode(r));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    /* The id comes back on errors too, and the connection stays usable. */
    ck_assert_int_eq(h_send_raw(c, "{\"op\":\"lock\",\"id\":\"x1\"}\n", 24),
                     0);
    r = h_recv(c, T_MS);
    ck_assert_str_eq(jstr(r, "id"), "x1");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "ping");
    ck_assert(h_ok(r));
    json_decref(r);
    h_close(c);
}
END_TEST

/* --- not_held and the holder's lock untouched --------------------------- */

START_TEST(test_not_held)
{
    struct h_conn *a, *b;
    json_t *r;
    char tok[80];

    h_start(NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);

    /* Never held: absent. */
    r = lk_unlock(a, "nothing", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "nothing",
                "ttl_ms", 1000);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{nothing}"), 0);

    r = lk_must(a, "k", NULL, 20000, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    r = lk_must(a, "k", NULL, 20000, 0);
    json_decref(r);

    /* Someone else: other, and nothing changes. */
    r = lk_unlock(b, "k", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    r = lk_unlock(a, "k", "another-owner");
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "k", "token",
                "0123456789abcdef0123456789abcdef");
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    r = h_callf(b, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "k", "ttl_ms",
                99999999);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{k} %s", tok), 2);
    ck_assert_int_le(h_r_int(&R, "PTTL leased:lock:{k}"), 20000);
    r = lk_info(a, "k");
    ck_assert(jtrue(r, "mine"));
    ck_assert_int_eq(jint(r, "count"), 2);
    json_decref(r);

    /* A lock whose lease ran out is absent for its former holder. */
    r = lk_must(a, "short", NULL, 150, 0);
    json_decref(r);
    wait_key_gone(&R, "leased:lock:{short}");
    r = lk_unlock(a, "short", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- tokens across sessions, detached locks ---------------------------- */

START_TEST(test_tokens_and_detach)
{
    struct h_conn *a, *b, *c;
    json_t *r;
    char tok[80], dtok[80];
    long long fence;

    h_start(NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);

    r = lk_must(a, "t", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    fence = jint(r, "fence");
    json_decref(r);

    /* Reenter by token from another session: same token and fence. */
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "t", "token",
                tok);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "token reentry: %s",
                  h_errcode(r));
    ck_assert_str_eq(jstr(r, "token"), tok);
    ck_assert_int_eq(jint(r, "count"), 2);
    ck_assert_int_eq(jint(r, "fence"), fence);
    json_decref(r);
    /* A token that holds nothing reenters nothing, and never takes a
     * free lock. */
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "t", "token",
                "ffffffffffffffffffffffffffffffff");
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "free", "token",
                tok);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{free}"), 0);

    /* Extend and unlock by token from the other session. */
    r = h_callf(b, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key", "t",
                "token", tok, "ttl_ms", 50000);
    ck_assert_msg(h_ok(r), "extend by token: %s", h_errcode(r));
    ck_assert_int_eq(jint(r, "lease_ms"), 50000);
    json_decref(r);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{t}"), 45000);
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "t", "token",
                tok);
    ck_assert(h_ok(r) && !jtrue(r, "released"));
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "t", "token",
                tok);
    ck_assert(h_ok(r) && jtrue(r, "released"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{t}"), 0);
    /* The holder's daemon learnt it: a's lock is gone, not lost. */
    r = lk_info(a, "t");
    ck_assert(!jtrue(r, "locked"));
    json_decref(r);
    ck_assert_int_eq(h_stat(a, "locks_held"), 0);

    /* Detached: survives the session, unlocked by token elsewhere. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:i,s:b}", "op", "lock", "key", "d",
                "ttl_ms", 30000, "detach", 1);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "detached lock: %s",
                  h_errcode(r));
    snprintf(dtok, sizeof dtok, "%s", jstr(r, "token"));
    json_decref(r);
    /* The same owner asking for a session-bound hold of it is refused. */
    r = lk_lock(a, "d", NULL, 30000, 0);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    json_decref(r);
    h_close(a);
    c = lk_connect(&D);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{d}"), 1);
    r = lk_lock(c, "d", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "extend", "key", "d",
                "token", dtok, "ttl_ms", 60000);
    ck_assert(h_ok(r));
    json_decref(r);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{d}"), 55000);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "d", "token",
                dtok);
    ck_assert(h_ok(r) && jtrue(r, "released"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{d}"), 0);
    h_close(b);
    h_close(c);
}
END_TEST

/* --- leases: fixed, extend, watchdog ------------------------------------ */

START_TEST(test_leases)
{
    struct h_conn *a;
    json_t *r;

    h_start("lock:\n  watchdog_ms: 300\n");
    a = lk_connect(&D);

    /* Watchdog: held well past three leases while the session lives. */
    r = lk_must(a, "wd", NULL, NO_TTL, 0);
    ck_assert_int_eq(jint(r, "lease_ms"), 300);
    json_decref(r);
    /* A fixed lease is never renewed. */
    r = lk_must(a, "fixed", NULL, 300, 0);
    json_decref(r);
    /* Time passing is the thing under test: four leases, with the fixed
     * one gone from Redis and the watchdog one renewed at least five
     * times, however slowly the machine gets there. */
    long long t0 = h_now_ms();
    wait_key_gone(&R, "leased:lock:{fixed}");
    struct renewals_want rw = {a, 5, t0, 4 * 300};
    ck_assert_msg(h_wait_until(renewals_done, &rw, 30000), "renewals: %lld",
                  h_stat(a, "lock_renewals_ok"));
    r = lk_info(a, "wd");
    ck_assert_msg(jtrue(r, "locked") && jtrue(r, "mine"),
                  "watchdog lock lost after 4 leases");
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    ck_assert_int_le(jint(r, "ttl_ms"), 300);
    json_decref(r);
    r = lk_info(a, "fixed");
    ck_assert_msg(!jtrue(r, "locked"), "fixed lease was renewed");
    ck_assert_int_eq(jint(r, "ttl_ms"), -2);
    json_decref(r);
    ck_assert_int_ge(h_stat(a, "lock_renewals_ok"), 5);
    ck_assert_int_eq(h_stat(a, "lock_lost"), 0);
    ck_assert_ptr_null(h_event(a, 0));

    /* extend sets the remaining lease; renewal never shortens it. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "wd",
                "ttl_ms", 5000);
    ck_assert(h_ok(r));
    ck_assert_int_eq(jint(r, "lease_ms"), 5000);
    json_decref(r);
    /* Two renewals later (a 300 ms watchdog renews every 100 ms) the
     * lease is still about the extended one, not cut back to 300 ms. */
    rw = (struct renewals_want){a, h_stat(a, "lock_renewals_ok") + 2,
                                h_now_ms(), 0};
    ck_assert_msg(h_wait_until(renewals_done, &rw, 30000),
                  "no renewals after extend");
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{wd}"), 1000);

    /* extend of a fixed lease: only that. */
    r = lk_must(a, "fixed2", NULL, 200, 0);
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "fixed2",
                "ttl_ms", 60000);
    ck_assert(h_ok(r));
    json_decref(r);
    /* Past the first lease, the extended one holds: the Redis lease is
     * longer than 200 ms could ever be, and it is not renewed. */
    long long pttl = h_r_int(&R, "PTTL leased:lock:{fixed2}");
    ck_assert_msg(pttl > 50000, "PTTL after extend %lld", pttl);
    r = lk_info(a, "fixed2");
    ck_assert_msg(jtrue(r, "locked"), "extended lease did not hold");
    json_decref(r);
    h_close(a);
}
END_TEST

/* --- lock_lost ----------------------------------------------------------- */

START_TEST(test_lock_lost)
{
    struct h_conn *a;
    json_t *r, *ev;
    char tok[80];
    long long t0;

    h_start("lock:\n  watchdog_ms: 300\n");
    a = lk_connect(&D);

    r = lk_must(a, "gone", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    t0 = h_now_ms();
    ck_assert_int_eq(h_r_int(&R, "DEL leased:lock:{gone}"), 1);
    ev = h_event(a, 3000);
    ck_assert_msg(ev != NULL, "no lock_lost after the key was deleted");
    ck_assert_msg(h_now_ms() - t0 < 600, "lock_lost took %lld ms",
                  h_now_ms() - t0);
    ck_assert_str_eq(jstr(ev, "event"), "lock_lost");
    ck_assert_str_eq(jstr(ev, "key"), "gone");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    ck_assert_ptr_null(json_object_get(ev, "id"));
    json_decref(ev);
    ck_assert_int_eq(h_stat(a, "lock_lost"), 1);
    ck_assert_int_eq(h_stat(a, "locks_held"), 0);

    /* Held by someone else behind our back: taken. */
    r = lk_must(a, "stolen", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    redisReply *rep =
        h_redis_cmd(&R, "EVAL %s 1 %s",
                    "redis.call('del', KEYS[1]); redis.call('hset', KEYS[1], "
                    "'0000000000000000000000000000000f', 1); "
                    "redis.call('pexpire', KEYS[1], 60000)",
                    "leased:lock:{stolen}");
    ck_assert(rep != NULL);
    freeReplyObject(rep);
    ev = h_event(a, 3000);
    ck_assert_msg(ev != NULL, "no lock_lost after the lock was taken");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    json_decref(ev);
    /* The other holder's lock is left alone. */
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{stolen} %s",
                             "0000000000000000000000000000000f"),
                     1);
    r = lk_unlock(a, "stolen", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    h_close(a);
}
END_TEST

static bool
capped_gone(void *arg)
{
    (void)arg;
    return h_r_int(&R, "EXISTS leased:lock:{capped}") == 0;
}

START_TEST(test_max_hold)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long t0, dt;

    h_start("lock:\n  watchdog_ms: 300\n  max_hold_ms: 1000\n");
    a = lk_connect(&D);
    t0 = h_now_ms();
    r = lk_must(a, "capped", NULL, NO_TTL, 0);
    json_decref(r);
    ev = h_event(a, 5000);
    dt = h_now_ms() - t0;
    ck_assert_msg(ev != NULL, "no lock_lost at max_hold");
    ck_assert_str_eq(jstr(ev, "reason"), "max_hold");
    ck_assert_str_eq(jstr(ev, "key"), "capped");
    json_decref(ev);
    ck_assert_msg(dt >= 900 && dt < 1600, "max_hold lock_lost after %lld ms",
                  dt);
    /* Renewal had kept it until then; now it is free (the event comes
     * first, so that the holder stops before anyone else can start). */
    ck_assert_msg(h_wait_until(capped_gone, NULL, 2000),
                  "the lock is still in redis after max_hold");
    r = lk_info(a, "capped");
    ck_assert(!jtrue(r, "locked"));
    json_decref(r);
    h_close(a);
}
END_TEST

/* --- waiting ----------------------------------------------------------- */

START_TEST(test_wait)
{
    struct h_conn *a, *w[3];
    json_t *r;
    long long t0, dt;

    h_start(NULL);
    a = lk_connect(&D);
    for (int i = 0; i < 3; i++) {
        w[i] = lk_connect(&D);
    }
    r = lk_must(a, "q", NULL, NO_TTL, 0);
    json_decref(r);

    /* wait_ms honoured to within a few ms. */
    t0 = h_now_ms();
    r = lk_lock(w[0], "q", NULL, NO_TTL, 300);
    dt = h_now_ms() - t0;
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    json_decref(r);
    ck_assert_msg(dt >= 295 && dt < 400, "wait_ms 300 took %lld ms", dt);
    /* Try once does not wait. */
    t0 = h_now_ms();
    r = lk_lock(w[0], "q", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    ck_assert_int_lt(h_now_ms() - t0, 100);

    /* First come, first served. */
    for (int i = 0; i < 3; i++) {
        lk_send(w[i], 100 + i, "q", NULL, NO_TTL, -1);
        h_assert_stat(a, "lock_waiters", i + 1, 10000);
    }
    /* An unlock published before the queue's SUBSCRIBE is confirmed
     * reaches no one; the head then goes on from the confirmation, which
     * is not a wake-up. Each unlock below must be one. */
    h_wait_subscribed(&R, "leased:lock:{q}:unlock", 10000);
    /* Waiting does not hold up other requests of the same session. */
    r = h_callf(w[0], T_MS, "{s:s}", "op", "ping");
    ck_assert(h_ok(r));
    json_decref(r);

    struct h_conn *holder = a;
    for (int i = 0; i < 3; i++) {
        t0 = h_now_ms();
        lk_unlock_ok(holder, "q", NULL);
        r = h_recv_id(w[i], 100 + i, 3000);
        ck_assert_msg(r != NULL, "waiter %d not woken", i);
        ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "waiter %d: %s", i,
                      h_errcode(r));
        ck_assert_msg(h_now_ms() - t0 < 200, "wake-up took %lld ms",
                      h_now_ms() - t0);
        json_decref(r);
        for (int k = i + 1; k < 3; k++) {
            ck_assert_ptr_null(h_recv(w[k], 0));
        }
        holder = w[i];
    }
    lk_unlock_ok(holder, "q", NULL);
    ck_assert_int_eq(h_stat(a, "lock_waiters"), 0);
    ck_assert_int_ge(h_stat(a, "lock_wakeups"), 3);

    /* A reentrant request never waits behind others. */
    r = lk_must(a, "q", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(w[0], 200, "q", NULL, NO_TTL, -1);
    h_assert_stat(a, "lock_waiters", 1, 10000);
    t0 = h_now_ms();
    r = lk_lock(a, "q", NULL, NO_TTL, 5000);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    ck_assert_int_eq(jint(r, "count"), 2);
    json_decref(r);
    ck_assert_int_lt(h_now_ms() - t0, 100);

    /* Lease end wakes a waiter without any unlock. */
    lk_unlock_ok(a, "q", NULL);
    lk_unlock_ok(a, "q", NULL);
    r = h_recv_id(w[0], 200, 3000);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    json_decref(r);
    lk_unlock_ok(w[0], "q", NULL);
    r = lk_must(a, "lease", NULL, 500, 0);
    json_decref(r);
    t0 = h_now_ms();
    r = lk_lock(w[1], "lease", NULL, NO_TTL, 5000);
    dt = h_now_ms() - t0;
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "not woken by lease end");
    json_decref(r);
    ck_assert_msg(dt >= 350 && dt < 800, "lease end wake-up after %lld ms",
                  dt);

    /* A waiter whose session closes leaves the queue. */
    r = lk_must(a, "c", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(w[2], 300, "c", NULL, NO_TTL, -1);
    h_assert_stat(a, "lock_waiters", 1, 10000);
    h_close(w[2]);
    h_assert_stat(a, "lock_waiters", 0, 10000);
    lk_unlock_ok(a, "c", NULL);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{c}"), 0);

    h_close(a);
    h_close(w[0]);
    h_close(w[1]);
}
END_TEST

/* --- session end releases --------------------------------------------- */

START_TEST(test_session_close)
{
    struct h_conn *a, *b;
    json_t *r;
    long long t0;

    h_start(NULL); /* watchdog 30 s: only the release can free it soon */
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "s1", NULL, NO_TTL, 0);
    json_decref(r);
    r = lk_must(a, "s1", NULL, NO_TTL, 0); /* count 2 */
    json_decref(r);
    r = lk_must(a, "s2", "other", 60000, 0);
    json_decref(r);
    lk_send(b, 7, "s1", NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 1, 10000);
    t0 = h_now_ms();
    h_close(a);
    r = h_recv_id(b, 7, 5000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "waiter not granted after the holder's session closed");
    ck_assert_msg(h_now_ms() - t0 < 1000, "release took %lld ms",
                  h_now_ms() - t0);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{s2}"), 0);
    ck_assert_int_eq(h_stat(b, "locks_held"), 1);

    /* The same when the closing client still has a request waiting:
     * the connection is gone, so its locks go at once too. */
    struct h_conn *c = lk_connect(&D);
    struct h_conn *d = lk_connect(&D);
    r = lk_must(c, "s3", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(c, 8, "s1", NULL, NO_TTL, -1); /* b holds s1 */
    lk_send(d, 9, "s3", NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 2, 10000);
    t0 = h_now_ms();
    h_close(c);
    r = h_recv_id(d, 9, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "waiter not granted after the holder's session closed");
    ck_assert_msg(h_now_ms() - t0 < 1000,
                  "release took %lld ms with a request of the closed "
                  "session still waiting",
                  h_now_ms() - t0);
    json_decref(r);
    ck_assert_int_eq(h_stat(b, "lock_waiters"), 0);
    h_close(d);
    h_close(b);
}
END_TEST

/* --- wrong_type ---------------------------------------------------------- */

START_TEST(test_wrong_type)
{
    struct h_conn *a;
    json_t *r;
    redisReply *rep;

    h_start(NULL);
    a = lk_connect(&D);
    rep = h_redis_cmd(&R, "SET leased:lock:{s} plain");
    freeReplyObject(rep);

    r = lk_lock(a, "s", NULL, NO_TTL, 0);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    r = lk_lock(a, "s", NULL, NO_TTL, 1000);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    r = lk_unlock(a, "s", NULL);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "s", "ttl_ms",
                1000);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "s");
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    rep = h_redis_cmd(&R, "GET leased:lock:{s}");
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING);
    ck_assert_str_eq(rep->str, "plain");
    freeReplyObject(rep);
    ck_assert_int_eq(h_r_int(&R, "PTTL leased:lock:{s}"), -1);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{s}:fence"), 0);

    /* A fence counter that is not a number: nothing is written either. */
    rep = h_redis_cmd(&R, "SET leased:lock:{f}:fence abc");
    freeReplyObject(rep);
    r = lk_lock(a, "f", NULL, NO_TTL, 0);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{f}"), 0);
    ck_assert_int_eq(h_stat(a, "locks_held"), 0);
    h_close(a);
}
END_TEST

/* --- limits -------------------------------------------------------------- */

START_TEST(test_max_waiters)
{
    struct h_conn *a, *b;
    json_t *r;

    h_start("limits:\n  max_waiters: 2\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "mw", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b, 1, "mw", "o1", NO_TTL, -1);
    lk_send(b, 2, "mw", "o2", NO_TTL, 10000);
    h_assert_stat(a, "lock_waiters", 2, 10000);
    r = lk_lock(b, "mw", "o3", NO_TTL, 10000);
    ck_assert_str_eq(h_errcode(r), "busy");
    json_decref(r);
    r = lk_lock(a, "other", "o3", NO_TTL, 10000); /* global count */
    ck_assert_str_eq(h_errcode(r), "busy");
    json_decref(r);
    /* Try-once and reentry do not wait, so they are not limited. */
    r = lk_lock(b, "mw", "o3", NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    r = lk_must(a, "mw", NULL, NO_TTL, 10000);
    ck_assert_int_eq(jint(r, "count"), 2);
    json_decref(r);
    h_close(a);
    r = h_recv_id(b, 1, 5000);
    ck_assert(r != NULL && jtrue(r, "acquired"));
    json_decref(r);
    h_close(b);
}
END_TEST

START_TEST(test_max_pending)
{
    struct h_conn *a, *b;
    json_t *r;

    h_start("limits:\n  max_pending: 2\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "mp", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b, 1, "mp", "o1", NO_TTL, -1);
    lk_send(b, 2, "mp", "o2", NO_TTL, -1);
    h_assert_stat(a, "lock_waiters", 2, 10000);
    r = h_callf(b, T_MS, "{s:s}", "op", "ping");
    ck_assert_msg(r != NULL, "no answer");
    ck_assert_str_eq(h_errcode(r), "busy");
    json_decref(r);
    lk_unlock_ok(a, "mp", NULL);
    r = h_recv_id(b, 1, 5000);
    ck_assert(r != NULL && jtrue(r, "acquired"));
    json_decref(r);
    r = h_callf(b, T_MS, "{s:s}", "op", "ping");
    ck_assert(h_ok(r));
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- Redis goes away and comes back -------------------------------------- */

static struct h_conn *probe;

static bool
lock_works(void *arg)
{
    json_t *r = h_call(probe, lk_req((const char *)arg, NULL, 5000, 0), 3000);
    bool ok = r != NULL && h_ok(r) && jtrue(r, "acquired");
    json_decref(r);
    return ok;
}

START_TEST(test_redis_killed)
{
    struct h_conn *a, *b, *c;
    json_t *r, *ev;
    char yaml[256];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "lock:\n  watchdog_ms: 600\n"
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    a = lk_connect(&D);
    b = lk_connect(&D);
    c = lk_connect(&D);
    r = lk_must(a, "rk", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b, 1, "rk", NULL, NO_TTL, -1);
    lk_send(c, 2, "rk", NULL, NO_TTL, 20000);
    h_assert_stat(a, "lock_waiters", 2, 10000);
    h_redis_kill(&R);

    /* The holder learns within about a lease that it lost the lock
     * (after lock_at_risk when a renewal failed while the lease ran). */
    ev = h_lock_lost(a, "rk", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost with Redis gone");
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    /* Waiters get an error, not a hang. */
    r = h_recv_id(b, 1, 5000);
    ck_assert_msg(r != NULL, "waiter left hanging");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    r = h_recv_id(c, 2, 5000);
    ck_assert_msg(r != NULL, "waiter left hanging");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    r = lk_lock(a, "x", NULL, NO_TTL, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    r = lk_unlock(a, "x", NULL);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s}", "op", "ping");
    ck_assert(h_ok(r));
    json_decref(r);
    ck_assert_int_ge(h_stat(a, "lock_renewals_failed"), 1);
    ck_assert_int_eq(h_stat(a, "locks_held"), 0);

    /* Back again: locks work. */
    ck_assert_int_eq(h_redis_restart(&R), 0);
    probe = a;
    ck_assert_msg(h_wait_until(lock_works, (void *)"rk", 15000),
                  "locks do not work after Redis came back");
    r = lk_lock(b, "rk", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

/* --- Redisson compatibility ---------------------------------------------- */

/* Redisson's RLock scripts, as the Java side would run them. */
/* Redisson's holder field: a UUID, a colon, a thread id. */
#define JAVA_HOLDER "4f0c2d1e-7a3b-4c5d-9e8f-0a1b2c3d4e5f:1"

static const char *java_lock =
    "if (redis.call('exists', KEYS[1]) == 0) then "
    "redis.call('hset', KEYS[1], ARGV[2], 1); "
    "redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then "
    "redis.call('hincrby', KEYS[1], ARGV[2], 1); "
    "redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; "
    "return redis.call('pttl', KEYS[1]);";
static const char *java_unlock =
    "if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil; end; "
    "local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); "
    "if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); "
    "return 0; else redis.call('del', KEYS[1]); "
    "redis.call('publish', KEYS[2], ARGV[1]); return 1; end; return nil;";

START_TEST(test_redisson_layout)
{
    struct h_conn *a, *b;
    json_t *r;
    redisReply *rep;
    long long t0;
    char tok[80];

    h_start("lock:\n  layout: redisson\n");
    a = lk_connect(&D);
    b = lk_connect(&D);

    /* The Java side holds it. */
    rep = h_redis_cmd(&R, "EVAL %s 1 %s %s %s", java_lock, "inventory:7",
                      "30000", JAVA_HOLDER);
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_NIL);
    freeReplyObject(rep);
    r = lk_lock(a, "inventory:7", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 25000);
    json_decref(r);
    r = lk_unlock(a, "inventory:7", NULL);
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "HGET inventory:7 %s", JAVA_HOLDER), 1);

    /* Java's unlock publishes "0" on Redisson's channel: our waiter
     * proceeds at once. */
    lk_send(b, 5, "inventory:7", NULL, NO_TTL, 20000);
    h_assert_stat(a, "lock_waiters", 1, 10000);
    h_wait_subscribed(&R, "redisson_lock__channel:{inventory:7}", 10000);
    t0 = h_now_ms();
    rep = h_redis_cmd(&R, "EVAL %s 2 %s %s %s %s %s", java_unlock,
                      "inventory:7", "redisson_lock__channel:{inventory:7}",
                      "0", "30000", JAVA_HOLDER);
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_INTEGER &&
              rep->integer == 1);
    freeReplyObject(rep);
    r = h_recv_id(b, 5, 5000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "not granted after the Java unlock");
    ck_assert_msg(h_now_ms() - t0 < 300, "wake-up took %lld ms",
                  h_now_ms() - t0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    ck_assert_int_ge(jint(r, "fence"), 1);
    /* Redisson's names: the lock is the key itself, our token the
     * field; the fence counter is redisson_lock_token:{KEY}. */
    ck_assert_int_eq(h_r_int(&R, "HGET inventory:7 %s", tok), 1);
    ck_assert_int_eq(h_r_int(&R, "GET redisson_lock_token:{inventory:7}"),
                     jint(r, "fence"));
    json_decref(r);

    /* And the Java side sees us: its lock script returns our lease. */
    rep = h_redis_cmd(&R, "EVAL %s 1 %s %s %s", java_lock, "inventory:7",
                      "30000", JAVA_HOLDER);
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_INTEGER);
    ck_assert_int_gt(rep->integer, 0);
    freeReplyObject(rep);

    /* Our unlock publishes "0" where Redisson listens. */
    redisContext *sub = h_redis_connect(&R);
    ck_assert(sub != NULL);
    rep = redisCommand(sub, "SUBSCRIBE redisson_lock__channel:{inventory:7}");
    freeReplyObject(rep);
    lk_unlock_ok(b, "inventory:7", NULL);
    ck_assert_int_eq(redisGetReply(sub, (void **)&rep), REDIS_OK);
    ck_assert(rep->type == REDIS_REPLY_ARRAY && rep->elements == 3);
    ck_assert_str_eq(rep->element[0]->str, "message");
    ck_assert_str_eq(rep->element[2]->str, "0");
    freeReplyObject(rep);
    redisFree(sub);

    /* A name with its own hash tag keeps it, like Redisson's
     * prefixName. */
    r = lk_must(a, "{user:1}:cart", NULL, NO_TTL, 0);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS redisson_lock_token:{user:1}:cart"),
                     1);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- WAIT for replicas --------------------------------------------------- */

START_TEST(test_wait_replicas)
{
    struct h_conn *a;
    json_t *r;
    char args[64];

    char yaml[256];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "lock:\n  wait_replicas: 1\n"
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 2000\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    a = lk_connect(&D);
    /* No replica: the grant is given back and reported. */
    r = lk_lock(a, "rep", NULL, NO_TTL, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(strstr(json_string_value(json_object_get(
                             json_object_get(r, "error"), "message")),
                         "replica"),
                  "not refused for want of replicas");
    json_decref(r);
    ck_assert_int_ge(h_stat(a, "lock_released"), 1);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{rep}"), 0);
    ck_assert_int_eq(h_stat(a, "locks_held"), 0);

    snprintf(args, sizeof args, "--replicaof 127.0.0.1 %d", R.port);
    ck_assert_int_eq(h_redis_start(&R2, args), 0);
    ck_assert_msg(h_wait_until(h_replica_linked, &R, 15000),
                  "replica did not link");
    r = lk_must(a, "rep", NULL, NO_TTL, 0);
    long long fence = jint(r, "fence");
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R2, "EXISTS leased:lock:{rep}"), 1);
    /* A counter that went back is raised by a second script after the
     * grant: the WAIT covers that write too, so the replica has the fence
     * handed out. */
    lk_unlock_ok(a, "rep", NULL);
    ck_assert_int_eq(h_r_int(&R, "DEL leased:lock:{rep}:fence"), 1);
    r = lk_must(a, "rep", NULL, NO_TTL, 0);
    long long raised = jint(r, "fence");
    json_decref(r);
    ck_assert_msg(raised > fence, "fence went back from %lld to %lld", fence,
                  raised);
    ck_assert_int_eq(h_r_int(&R2, "GET leased:lock:{rep}:fence"), raised);
    h_close(a);
}
END_TEST

/* --- graceful stop releases ---------------------------------------------- */

START_TEST(test_shutdown_releases)
{
    struct h_conn *a;
    json_t *r;

    h_start(NULL);
    a = lk_connect(&D);
    r = lk_must(a, "sd", NULL, NO_TTL, 0);
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i,s:b}", "op", "lock", "key", "sd2",
                "ttl_ms", 60000, "detach", 1);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    json_decref(r);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{sd}"), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{sd2}"), 1);
    h_close(a);
}
END_TEST

/* Calls of Redis command CMD (lower case) since the last CONFIG RESETSTAT,
 * scripts' inner calls included. */
static long long
cmd_calls(const char *cmd)
{
    char pat[64];
    redisReply *r = h_redis_cmd(&R, "INFO commandstats");
    ck_assert(r != NULL && r->type == REDIS_REPLY_STRING);
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    const char *p = strstr(r->str, pat);
    long long n = p != NULL ? atoll(p + strlen(pat)) : 0;
    freeReplyObject(r);
    return n;
}

/* An unlock reads the holder's own field, not the whole hash: a lock
 * whose one field is its holder needs no HGETALL (issue 30). */
START_TEST(test_unlock_cost)
{
    struct h_conn *a;

    h_start(NULL);
    a = lk_connect(&D);
    json_decref(lk_must(a, "cost", NULL, NO_TTL, 0));
    lk_unlock_ok(a, "cost", NULL);
    freeReplyObject(h_redis_cmd(&R, "CONFIG RESETSTAT"));
    for (int i = 0; i < 10; i++) {
        json_decref(lk_must(a, "cost", NULL, NO_TTL, 0));
        lk_unlock_ok(a, "cost", NULL);
    }
    ck_assert_int_eq(cmd_calls("hgetall"), 0);
    ck_assert_int_eq(cmd_calls("del"), 10);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{cost}"), 0);
    h_close(a);
}
END_TEST

/* A watchdog renewal that lengthens the lease is HGET and PEXPIRE GT: no
 * PTTL first (issue 30). */
START_TEST(test_renew_cost)
{
    struct h_conn *a;

    h_start("lock:\n  watchdog_ms: 600\n");
    a = lk_connect(&D);
    json_decref(lk_must(a, "cost", NULL, NO_TTL, 0));
    freeReplyObject(h_redis_cmd(&R, "CONFIG RESETSTAT"));
    long long ok0 = h_stat(a, "lock_renewals_ok");
    ck_assert(h_wait_stat_min(a, "lock_renewals_ok", ok0 + 3, 10000));
    ck_assert_int_ge(cmd_calls("pexpire"), 3);
    ck_assert_int_eq(cmd_calls("pttl"), 0);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{cost}"), 0);
    lk_unlock_ok(a, "cost", NULL);
    h_close(a);
}
END_TEST

/* The watchdog's passes renew many locks per Redis call
 * (lock_renew_many.lua), and each lock still gets its own answer: of 40
 * held, the one whose key is deleted is lost, the one taken by someone
 * else is lost as taken, and the others stay held (issue 30). */
START_TEST(test_renew_many)
{
    struct h_conn *a;
    char key[32];
    enum { N = 40 };

    h_start("lock:\n  watchdog_ms: 600\n");
    a = lk_connect(&D);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "many%d", i);
        json_decref(lk_must(a, key, NULL, NO_TTL, 0));
    }
    freeReplyObject(h_redis_cmd(&R, "CONFIG RESETSTAT"));
    long long ok0 = h_stat(a, "lock_renewals_ok");
    ck_assert(h_wait_stat_min(a, "lock_renewals_ok", ok0 + 3 * N, 10000));
    long long renewed = h_stat(a, "lock_renewals_ok") - ok0;
    long long calls = cmd_calls("evalsha") + cmd_calls("eval");
    if (!h_on_cluster()) {
        /* 40 locks on redis.connections 2 are at least two calls a pass;
         * one call per lock would be 40. In cluster mode the keys of one
         * call would lie in different slots: one lock per call (and
         * cmd_calls counts one node's). */
        ck_assert_msg(calls * 5 <= renewed,
                      "%lld script calls for %lld renewals", calls, renewed);
    }

    ck_assert_int_eq(h_r_int(&R, "DEL leased:lock:{many7}"), 1);
    redisReply *rep =
        h_redis_cmd(&R, "EVAL %s 1 %s",
                    "redis.call('del', KEYS[1]); redis.call('hset', KEYS[1], "
                    "'0000000000000000000000000000000f', 1); "
                    "redis.call('pexpire', KEYS[1], 60000)",
                    "leased:lock:{many23}");
    ck_assert(rep != NULL);
    freeReplyObject(rep);
    bool lost7 = false, lost23 = false;
    while (!lost7 || !lost23) {
        json_t *ev = h_event(a, 3000);
        ck_assert_msg(ev != NULL, "no lock_lost for many7 (%d) or many23 (%d)",
                      lost7, lost23);
        ck_assert_str_eq(jstr(ev, "event"), "lock_lost");
        const char *k = jstr(ev, "key");
        if (strcmp(k, "many7") == 0) {
            ck_assert_str_eq(jstr(ev, "reason"), "expired");
            lost7 = true;
        } else {
            ck_assert_msg(strcmp(k, "many23") == 0, "lock_lost for %s", k);
            ck_assert_str_eq(jstr(ev, "reason"), "taken");
            lost23 = true;
        }
        json_decref(ev);
    }
    /* Two more passes: the 38 others renewed, none lost. */
    ok0 = h_stat(a, "lock_renewals_ok");
    ck_assert(
        h_wait_stat_min(a, "lock_renewals_ok", ok0 + 2 * (N - 2), 10000));
    ck_assert_int_eq(h_stat(a, "locks_held"), N - 2);
    ck_assert_int_eq(h_stat(a, "lock_lost"), 2);
    for (int i = 0; i < N; i++) {
        if (i == 7 || i == 23) {
            continue;
        }
        ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{many%d}", i), 0);
    }
    h_close(a);
}
END_TEST

/* lock_renew_many.lua on Redis alone: each lock gets its own lease, also
 * when the one before it had another (the script reads a lease once while
 * the next is the same), and its own count. */
START_TEST(test_renew_many_leases)
{
    static const char tok[] = "0123456789abcdef0123456789abcdef";
    h_start(NULL);
    if (h_on_cluster()) {
        /* The keys of one call lie in different slots there: the
         * daemon never sends this script in cluster mode. */
        return;
    }
    const char *cnt[] = {"1", "3", "1", "2"};
    const char *lease[] = {"60000", "5000", "5000", "60000"};
    for (int i = 0; i < 4; i++) {
        freeReplyObject(
            h_redis_cmd(&R, "HSET leased:lock:{rml%d} %s %s", i, tok, cnt[i]));
        freeReplyObject(
            h_redis_cmd(&R, "PEXPIRE leased:lock:{rml%d} 1000", i));
    }
    redisReply *r = h_redis_cmd(
        &R,
        "EVAL %s 8 leased:lock:{rml0} f0 leased:lock:{rml1} f1 "
        "leased:lock:{rml2} f2 leased:lock:{rml3} f3 %s %s %s %s %s %s %s %s",
        ld_lua_lock_renew_many, tok, lease[0], tok, lease[1], tok, lease[2],
        tok, lease[3]);
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_ARRAY &&
                      r->elements == 12,
                  "reply type %d", r != NULL ? r->type : -1);
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(r->element[3 * i]->integer, 1);
        ck_assert_int_eq(r->element[3 * i + 1]->integer, atoll(lease[i]));
        ck_assert_int_eq(r->element[3 * i + 2]->integer, atoll(cnt[i]));
        long long pttl = h_r_int(&R, "PTTL leased:lock:{rml%d}", i);
        ck_assert_msg(pttl > atoll(lease[i]) - 2000 && pttl <= atoll(lease[i]),
                      "lock %d: pttl %lld for a lease of %s", i, pttl,
                      lease[i]);
    }
    freeReplyObject(r);
}
END_TEST

/* --- request_id: a retried unlock is answered, not run again ---------- */

/* Unlock KEY (MODE NULL: plain) by TOKEN with request id RID on C. */
static json_t *
unlock_rid(struct h_conn *c, const char *key, const char *mode,
           const char *token, const char *rid)
{
    json_t *req = json_pack("{s:s,s:s,s:s,s:s}", "op", "unlock", "key", key,
                            "token", token, "request_id", rid);
    if (mode != NULL) {
        json_object_set_new(req, "mode", json_string(mode));
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "no reply to unlock %s", key);
    ck_assert_msg(h_ok(r), "unlock %s rid %s: %s", key, rid, h_errcode(r));
    return r;
}

static void
expect_unlock(json_t *r, bool released, long long count)
{
    ck_assert_int_eq(jtrue(r, "released"), released);
    ck_assert_int_eq(jint(r, "count"), count);
    json_decref(r);
}

/* The reentrancy case of issue 34: held twice, an unlock whose reply was
 * lost and that is sent again must not take the second hold. */
START_TEST(test_unlock_request_id)
{
    struct h_conn *a, *b;
    json_t *r;
    char tok[80], field[120];

    h_start(NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "idem", NULL, 60000, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    json_decref(lk_must(a, "idem", NULL, 60000, 0));
    snprintf(field, sizeof field, "HGET leased:lock:{idem} %s", tok);

    /* By owner the first time, by token from another session the next:
     * the memory is the token's, as a retry after a lost connection is. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "idem",
                "request_id", "r1");
    ck_assert_msg(h_ok(r), "unlock r1: %s", h_errcode(r));
    expect_unlock(r, false, 1);
    long long evals = r_eval_calls(&R);
    expect_unlock(unlock_rid(a, "idem", NULL, tok, "r1"), false, 1);
    expect_unlock(unlock_rid(b, "idem", NULL, tok, "r1"), false, 1);
    ck_assert_int_eq(r_eval_calls(&R), evals);
    ck_assert_int_eq(h_r_int(&R, field), 1);

    /* The last hold: its retry still says released, not not_held. */
    expect_unlock(unlock_rid(a, "idem", NULL, tok, "r2"), true, 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{idem}"), 0);
    evals = r_eval_calls(&R);
    expect_unlock(unlock_rid(b, "idem", NULL, tok, "r2"), true, 0);
    ck_assert_int_eq(r_eval_calls(&R), evals);
    /* Another request id runs: nothing is held any more. */
    r = h_callf(b, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key", "idem",
                "token", tok, "request_id", "r3");
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    /* A failure is not remembered: the same id runs again once held. */
    r = lk_must(a, "idem2", NULL, 60000, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key",
                "not-idem2", "token", tok, "request_id", "r4");
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    expect_unlock(unlock_rid(a, "idem2", NULL, tok, "r4"), true, 0);

    /* A read lock held twice. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "lock", "key", "rwi",
                "mode", "read", "ttl_ms", 60000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "read lock: %s",
                  h_errcode(r));
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:i}", "op", "lock", "key", "rwi",
                "mode", "read", "ttl_ms", 60000);
    ck_assert_int_eq(jint(r, "count"), 2);
    json_decref(r);
    expect_unlock(unlock_rid(a, "rwi", "read", tok, "w1"), false, 1);
    evals = r_eval_calls(&R);
    expect_unlock(unlock_rid(b, "rwi", "read", tok, "w1"), false, 1);
    ck_assert_int_eq(r_eval_calls(&R), evals);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock.info", "key", "rwi",
                "mode", "read");
    ck_assert_int_eq(jint(r, "count"), 1);
    json_decref(r);

    /* A group, by owner and then by token. */
    r = h_callf(a, T_MS, "{s:s,s:[s,s],s:i}", "op", "lock", "keys", "g1", "g2",
                "ttl_ms", 60000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "group lock: %s",
                  h_errcode(r));
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:[s,s],s:s}", "op", "unlock", "keys", "g1",
                "g2", "request_id", "m1");
    ck_assert_msg(h_ok(r), "group unlock: %s", h_errcode(r));
    expect_unlock(r, true, 0);
    evals = r_eval_calls(&R);
    r = h_callf(b, T_MS, "{s:s,s:[s,s],s:s,s:s}", "op", "unlock", "keys", "g1",
                "g2", "token", tok, "request_id", "m1");
    ck_assert_msg(h_ok(r), "group unlock retried: %s", h_errcode(r));
    expect_unlock(r, true, 0);
    ck_assert_int_eq(r_eval_calls(&R), evals);

    /* Bad request ids. */
    expect_bad(a, "{\"op\":\"unlock\",\"key\":\"k\",\"request_id\":\"\"}\n",
               "request_id");
    expect_bad(a, "{\"op\":\"unlock\",\"key\":\"k\",\"request_id\":7}\n",
               "request_id");
    expect_bad(a,
               "{\"op\":\"unlock\",\"key\":\"k\",\"request_id\":\"a\\tb\"}\n",
               "request_id");
    expect_bad(
        a,
        "{\"op\":\"unlock\",\"keys\":[\"k\"],\"request_id\":\"\\u00e9\"}"
        "\n",
        "request_id");
    char line[200];
    snprintf(line, sizeof line,
             "{\"op\":\"unlock\",\"key\":\"k\",\"request_id\":\"%065d\"}\n",
             0);
    expect_bad(a, line, "request_id");
    snprintf(line, sizeof line,
             "{\"op\":\"unlock\",\"key\":\"k\",\"request_id\":\"%064d\"}\n",
             0);
    r = NULL;
    ck_assert_int_eq(h_send_raw(a, line, strlen(line)), 0);
    r = h_recv(a, T_MS);
    ck_assert_str_eq(h_errcode(r), "not_held"); /* 64 is allowed */
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

struct retry_want {
    struct h_conn *c;
    const char *tok;
};

/* The retry of "x1" answered from memory (not "still waiting"). */
static bool
retry_answered(void *arg)
{
    const struct retry_want *w = arg;
    json_t *r = h_callf(w->c, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key",
                        "ru", "token", w->tok, "request_id", "x1");
    bool ok = r != NULL && h_ok(r);
    if (ok) {
        ck_assert(!jtrue(r, "released"));
        ck_assert_int_eq(jint(r, "count"), 1);
    } else {
        ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    }
    json_decref(r);
    return ok;
}

/* The case request_id is for: Redis answers the unlock too late, the
 * client hears "outcome":"unknown" and sends it again. While the first is
 * still out the repeat runs nothing; once the late answer came it gets
 * that answer, and the hold count went down once. */
START_TEST(test_unlock_request_id_unknown)
{
    struct h_conn *a;
    json_t *r;
    char tok[80], yaml[256], field[120];

    ck_assert_int_eq(h_redis_start(&R, "--enable-debug-command yes"), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 500\n"
             "  connections: 1\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    a = lk_connect(&D);
    r = lk_must(a, "ru", NULL, 60000, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    json_decref(lk_must(a, "ru", NULL, 60000, 0));
    snprintf(field, sizeof field, "HGET leased:lock:{ru} %s", tok);

    redisContext *z = h_redis_sleep_start(&R, 2);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key", "ru",
                "token", tok, "request_id", "x1");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_str_eq(json_string_value(
                         json_object_get(json_object_get(r, "error"),
                                         "outcome")),
                     "unknown");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:s}", "op", "unlock", "key", "ru",
                "token", tok, "request_id", "x1");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(strstr(jmsg(r), "still waiting") != NULL, "message: %s",
                  jmsg(r));
    json_decref(r);
    h_redis_sleep_end(z);

    struct retry_want w = {a, tok};
    ck_assert_msg(h_wait_until(retry_answered, &w, 15000),
                  "the retry was never answered from memory");
    ck_assert_int_eq(h_r_int(&R, field), 1);
    h_close(a);
}
END_TEST

/* --- maxmemory-policy: the eviction check ---------------------------- */

/* How many lines of D's log hold NEEDLE. */
static int
log_count(const char *needle)
{
    FILE *f = fopen(D.log, "r");
    char line[4096];
    int n = 0;
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        if (strstr(line, needle) != NULL) {
            n++;
        }
    }
    fclose(f);
    return n;
}

struct stat_want {
    struct h_conn *c;
    const char *name;
    long long v;
};

static bool
stat_is(void *arg)
{
    const struct stat_want *w = arg;
    return h_stat(w->c, w->name) == w->v;
}

static bool
config_calls_above(void *arg)
{
    return cmd_calls("config|get") > *(long long *)arg;
}

/* Kill the daemon's command connections (not its subscriber) and wait
 * until it has asked Redis for the policy again. */
static void
reconnect_and_recheck(void)
{
    long long before = cmd_calls("config|get");
    freeReplyObject(h_redis_cmd(&R, "CLIENT KILL TYPE normal"));
    ck_assert_msg(h_wait_until(config_calls_above, &before, 15000),
                  "no CONFIG GET after the reconnect");
}

/* An allkeys-* policy: a warning (once, not at every reconnect) and the
 * gauge at 1; noeviction after a reconnect: 0. */
START_TEST(test_evict_warning)
{
    struct h_conn *a;

    ck_assert_int_eq(h_redis_start(&R, "--maxmemory-policy allkeys-lru"), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NULL), 0);
    a = lk_connect(&D);
    struct stat_want w = {a, "redis_eviction_unsafe", 1};
    ck_assert_msg(h_wait_until(stat_is, &w, 15000), "gauge not 1");
    ck_assert(h_wait_log(&D, "maxmemory_policy=allkeys-lru", 5000));
    ck_assert_int_eq(log_count("maxmemory_policy=allkeys-lru"), 1);
    /* A warning, not an error: locks are served. */
    json_decref(lk_must(a, "ev", NULL, NO_TTL, 0));
    lk_unlock_ok(a, "ev", NULL);

    reconnect_and_recheck();
    ck_assert_int_eq(h_stat(a, "redis_eviction_unsafe"), 1);
    ck_assert_int_eq(log_count("maxmemory_policy=allkeys-lru"), 1);

    freeReplyObject(h_redis_cmd(&R, "CONFIG SET maxmemory-policy noeviction"));
    reconnect_and_recheck();
    w.v = 0;
    ck_assert_msg(h_wait_until(stat_is, &w, 15000), "gauge not back to 0");
    ck_assert(h_wait_log(&D, "maxmemory_policy=noeviction", 5000));
    h_close(a);
}
END_TEST

struct lock_msg_want {
    struct h_conn *c;
    const char *op;     /* "lock" or "sem.acquire" */
    const char *needle; /* in the error message; NULL: acquired */
};

static bool
lock_answer_is(void *arg)
{
    const struct lock_msg_want *w = arg;
    json_t *r = strcmp(w->op, "lock") == 0
                    ? h_callf(w->c, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                              "evr", "ttl_ms", 60000)
                    : h_callf(w->c, T_MS, "{s:s,s:s,s:i,s:i}", "op",
                              "sem.acquire", "key", "evs", "limit", 5,
                              "ttl_ms", 60000);
    bool ok;
    if (w->needle == NULL) {
        ok = r != NULL && h_ok(r) && jtrue(r, "acquired");
    } else {
        const char *msg = r == NULL || h_ok(r)
                              ? NULL
                              : json_string_value(json_object_get(
                                    json_object_get(r, "error"), "message"));
        ok = msg != NULL && strcmp(h_errcode(r), "redis_unavailable") == 0 &&
             strstr(msg, w->needle) != NULL;
    }
    json_decref(r);
    return ok;
}

/* lock.require_noeviction: lock and sem.acquire refused, naming the
 * policy, until a reconnect finds noeviction. */
START_TEST(test_evict_require)
{
    struct h_conn *a;

    ck_assert_int_eq(h_redis_start(&R, "--maxmemory-policy volatile-ttl"), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R,
                                    "lock:\n  require_noeviction: true\n"),
                     0);
    a = lk_connect(&D);
    struct lock_msg_want w = {a, "lock", "volatile-ttl"};
    ck_assert_msg(h_wait_until(lock_answer_is, &w, 15000),
                  "lock not refused naming the policy");
    w.op = "sem.acquire";
    ck_assert(lock_answer_is(&w));
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{evr}"), 0);
    /* Unlock and the cache are not refused. */
    json_t *r = lk_unlock(a, "evr", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);

    freeReplyObject(h_redis_cmd(&R, "CONFIG SET maxmemory-policy noeviction"));
    reconnect_and_recheck();
    w.op = "lock";
    w.needle = NULL;
    ck_assert_msg(h_wait_until(lock_answer_is, &w, 15000),
                  "lock still refused after noeviction");
    w.op = "sem.acquire";
    ck_assert(lock_answer_is(&w));
    h_close(a);
}
END_TEST

/* A Redis without CONFIG: the policy is unknown, said once at info
 * level; the daemon serves, unless lock.require_noeviction asks for
 * proof. */
START_TEST(test_evict_config_refused)
{
    struct h_conn *a;

    ck_assert_int_eq(h_redis_start(&R,
                                   "--rename-command CONFIG ld-hidden-config"),
                     0);
    ck_assert_int_eq(h_daemon_start(&D, &R, NULL), 0);
    ck_assert(h_wait_log(&D, "maxmemory-policy unknown", 15000));
    a = lk_connect(&D);
    json_decref(lk_must(a, "evu", NULL, NO_TTL, 0));
    lk_unlock_ok(a, "evu", NULL);
    ck_assert_int_eq(h_stat(a, "redis_eviction_unsafe"), 0);
    h_close(a);
    ck_assert_int_eq(h_daemon_stop(&D), 0);

    ck_assert_int_eq(h_daemon_start(&D, &R,
                                    "lock:\n  require_noeviction: true\n"),
                     0);
    a = lk_connect(&D);
    struct lock_msg_want w = {a, "lock", "unknown"};
    ck_assert_msg(h_wait_until(lock_answer_is, &w, 15000),
                  "lock not refused on an unknown policy");
    h_close(a);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(lock_reentry_fence, 60),
        H_CASE(validation, 60),
        H_CASE(not_held, 60),
        H_CASE(tokens_and_detach, 60),
        H_CASE(leases, 60),
        H_CASE(lock_lost, 60),
        H_CASE(max_hold, 60),
        H_CASE(wait, 60),
        H_CASE(session_close, 60),
        H_CASE(wrong_type, 60),
        H_CASE(max_waiters, 60),
        H_CASE(max_pending, 60),
        H_CASE(redis_killed, 90),
        H_CASE(redisson_layout, 60),
        H_CASE(wait_replicas, 60),
        H_CASE(shutdown_releases, 60),
        H_CASE(unlock_cost, 60),
        H_CASE(renew_cost, 60),
        H_CASE(renew_many, 90),
        H_CASE(renew_many_leases, 30),
        H_CASE(unlock_request_id, 60),
        H_CASE(unlock_request_id_unknown, 60),
        H_CASE(evict_warning, 90),
        H_CASE(evict_require, 90),
        H_CASE(evict_config_refused, 90),
    };

    return H_MAIN(fx, cases);
}
