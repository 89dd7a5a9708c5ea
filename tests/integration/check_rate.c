/* The rate limiter against real redis-server and real leased:
 * rate.acquire's checks, its decisions and retry_after_ms, permits and
 * burst, waiting (granted after about retry_after_ms, ended by the
 * session closing and by cancel, bounded by limits.max_waiters), Redis
 * down, foreign data, and
 * processes on two daemons hammering one key that never pass the rate in
 * any window. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "sem_util.h"

#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D1, D2;
static const struct h_fixture fx = {
    .suite = "rate",
    .redis = {&R},
    .daemons = {&D1, &D2},
};

/* rate.acquire of KEY; BURST, PERMITS and WAIT_MS 0 leave the field out. */
static json_t *
rate_req(const char *key, long long rate, long long per_ms, long long burst,
         long long permits, long long wait_ms)
{
    json_t *q = json_pack("{s:s,s:s,s:I,s:I}", "op", "rate.acquire", "key",
                          key, "rate", (json_int_t)rate, "per_ms",
                          (json_int_t)per_ms);
    if (burst > 0) {
        json_object_set_new(q, "burst", json_integer(burst));
    }
    if (permits > 0) {
        json_object_set_new(q, "permits", json_integer(permits));
    }
    if (wait_ms > 0) {
        json_object_set_new(q, "wait_ms", json_integer(wait_ms));
    }
    return q;
}

static json_t *
rate_call(struct h_conn *c, const char *key, long long rate, long long per_ms,
          long long burst, long long permits, long long wait_ms)
{
    return h_call(c, rate_req(key, rate, per_ms, burst, permits, wait_ms),
                  T_MS + (int)wait_ms);
}

/* An answer {"acquired":WANT,"retry_after_ms":R}: returns R. */
static long long
rate_must(json_t *r, bool want, const char *what)
{
    ck_assert_msg(r != NULL && h_ok(r), "%s: %s", what,
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert_msg(json_is_boolean(json_object_get(r, "acquired")), "%s", what);
    ck_assert_msg(jtrue(r, "acquired") == want, "%s: acquired %d", what,
                  (int)jtrue(r, "acquired"));
    ck_assert_msg(json_is_integer(json_object_get(r, "retry_after_ms")), "%s",
                  what);
    long long retry = jint(r, "retry_after_ms");
    json_decref(r);
    return retry;
}

static void
bad(struct h_conn *c, json_t *q, const char *needle)
{
    json_t *r = h_call(c, q, T_MS);
    ck_assert_msg(r != NULL && !h_ok(r), "accepted: %s", needle);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    ck_assert_msg(strstr(jmsg(r), needle) != NULL, "message '%s' lacks '%s'",
                  jmsg(r), needle);
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
        named = named || (n != NULL && strcmp(n, "rate") == 0);
    }
    ck_assert_msg(named, "hello's features lack rate");
    json_decref(r);

    bad(a,
        json_pack("{s:s,s:s,s:i}", "op", "rate.acquire", "key", "v", "per_ms",
                  1000),
        "rate");
    bad(a,
        json_pack("{s:s,s:s,s:i}", "op", "rate.acquire", "key", "v", "rate",
                  10),
        "per_ms");
    bad(a,
        json_pack("{s:s,s:i,s:i}", "op", "rate.acquire", "rate", 10, "per_ms",
                  1000),
        "key");
    bad(a, rate_req("v", 0, 1000, 0, 0, 0), "rate");
    bad(a, rate_req("v", 1000001, 1000, 0, 0, 0), "rate");
    bad(a, rate_req("v", 10, 0, 0, 0, 0), "per_ms");
    bad(a, rate_req("v", 10, 86400001, 0, 0, 0), "per_ms");
    q = rate_req("v", 10, 1000, 0, 0, 0);
    json_object_set_new(q, "burst", json_integer(0));
    bad(a, q, "burst");
    bad(a, rate_req("v", 10, 1000, 1000001, 0, 0), "burst");
    q = rate_req("v", 10, 1000, 0, 0, 0);
    json_object_set_new(q, "permits", json_integer(0));
    bad(a, q, "permits");
    bad(a, rate_req("v", 10, 1000, 5, 6, 0), "'permits' (6) is above");
    /* The default burst is the rate. */
    bad(a, rate_req("v", 10, 1000, 0, 11, 0), "'burst' (10)");
    q = rate_req("v", 10, 1000, 0, 0, 0);
    json_object_set_new(q, "wait_ms", json_integer(-1));
    bad(a, q, "wait_ms");
    q = rate_req("v", 10, 1000, 0, 0, 0);
    json_object_set_new(q, "rate", json_string("10"));
    bad(a, q, "rate");
    bad(a, rate_req("v", 1, 86400000, 1000000, 0, 0), "time to fill");
    /* Nothing of these reached Redis. */
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{v}:rate"), 0);
    h_close(a);
}
END_TEST

START_TEST(test_decisions)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    long long r;

    /* 2 per second, burst 2: two at once, then one every 500 ms. */
    r = rate_must(rate_call(a, "d", 2, 1000, 2, 0, 0), true, "first");
    ck_assert_int_eq(r, 0); /* one more is free now */
    r = rate_must(rate_call(a, "d", 2, 1000, 2, 0, 0), true, "second");
    ck_assert_msg(r > 0 && r <= 500, "after the burst: next in %lld", r);
    r = rate_must(rate_call(a, "d", 2, 1000, 2, 0, 0), false, "third");
    ck_assert_msg(r > 0 && r <= 500, "refused: retry after %lld", r);
    /* The key lives until the bucket is full again: at most 1 s. */
    long long pttl = h_r_int(&R, "PTTL leased:lock:{d}:rate");
    ck_assert_msg(pttl > 0 && pttl <= 1000, "pttl %lld", pttl);

    /* Permits count: 3 of a burst of 4 once, not twice; the refusal says
     * when 3 are free (2 more emission intervals of 250 ms at most). */
    rate_must(rate_call(a, "p", 4, 1000, 4, 3, 0), true, "3 permits");
    r = rate_must(rate_call(a, "p", 4, 1000, 4, 3, 0), false, "3 more");
    ck_assert_msg(r > 250 && r <= 500, "3 more: retry after %lld", r);
    rate_must(rate_call(a, "p", 4, 1000, 4, 1, 0), true, "the fourth");

    /* Default burst = rate: 3 of rate 3, then none. */
    for (int i = 0; i < 3; i++) {
        rate_must(rate_call(a, "b", 3, 60000, 0, 0, 0), true, "burst of 3");
    }
    r = rate_must(rate_call(a, "b", 3, 60000, 0, 0, 0), false, "past 3");
    ck_assert_msg(r > 19000 && r <= 20000, "retry after %lld", r);

    /* A wait shorter than the retry is answered at once. */
    long long t0 = h_now_ms();
    r = rate_must(rate_call(a, "b", 3, 60000, 0, 0, 3000), false, "short");
    ck_assert_msg(r > 19000, "retry after %lld", r);
    ck_assert_int_lt(h_now_ms() - t0, 3000);

    /* Keys of other ops and other keys are not in the way. */
    rate_must(rate_call(a, "other", 3, 60000, 0, 0, 0), true, "another key");
    h_close(a);
}
END_TEST

START_TEST(test_wait_granted)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    /* 1 per 1.5 s: the second waits about 1.5 s, then is granted. */
    rate_must(rate_call(a, "w", 1, 1500, 1, 0, 0), true, "first");
    long long t0 = h_now_ms();
    long long r = rate_must(rate_call(a, "w", 1, 1500, 1, 0, 0), false,
                            "probe");
    ck_assert_msg(r > 1000 && r <= 1500, "probe: retry after %lld", r);
    rate_must(rate_call(a, "w", 1, 1500, 1, 0, 20000), true, "waited");
    long long took = h_now_ms() - t0;
    /* Granted no sooner than the probe said, and not far after it even on
     * a loaded machine (the wait was 20 s). */
    ck_assert_msg(took >= r - 5 && took < r + 5000, "waited %lld for %lld",
                  took, r);
    h_close(a);
}
END_TEST

struct pending_want {
    struct h_conn *c;
    long long n;
};

static bool
pending_is(void *arg)
{
    struct pending_want *w = arg;
    return h_stat(w->c, "requests_pending") == w->n;
}

struct cancel_want {
    struct h_conn *c;
    int id;
};

/* Cancel the request ID of C: true once that ended its wait (a decision
 * in flight is not cancelled, so this is asked until it is not). */
static bool
cancelled_id(void *arg)
{
    struct cancel_want *w = arg;
    json_t *c = h_callf(w->c, T_MS, "{s:s,s:i}", "op", "cancel", "target",
                        w->id);
    ck_assert_msg(c != NULL && h_ok(c), "cancel refused");
    bool done = jtrue(c, "cancelled");
    json_decref(c);
    return done;
}

static bool
cancelled(void *arg)
{
    struct cancel_want w = {arg, 6};
    return cancelled_id(&w);
}

START_TEST(test_wait_ends_with_session_and_cancel)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    struct h_conn *b = h_connect_ok(&D1);
    struct pending_want w = {a, 2};

    rate_must(rate_call(a, "s", 1, 4000, 1, 0, 0), true, "first");
    s_send_id(b, 5, rate_req("s", 1, 4000, 1, 0, 30000));
    ck_assert(h_wait_until(pending_is, &w, T_MS)); /* its and the stats' */
    h_assert_stat(a, "rate_waiting", 1, T_MS);
    long long t0 = h_now_ms();
    h_close(b);
    w.n = 1;
    ck_assert_msg(h_wait_until(pending_is, &w, T_MS), "still waiting");
    ck_assert_msg(h_now_ms() - t0 < 2500, "ended only after %lld ms",
                  h_now_ms() - t0);
    h_assert_stat(a, "rate_waiting", 0, T_MS);
    h_assert_stat(a, "rate_granted", 1, T_MS);
    h_assert_stat(a, "rate_refused", 1, T_MS);

    /* Cancel: answered at once, acquired false, with the retry. */
    b = h_connect_ok(&D1);
    s_send_id(b, 6, rate_req("s", 1, 4000, 1, 0, 30000));
    w.n = 2;
    ck_assert(h_wait_until(pending_is, &w, T_MS));
    /* While its decision is out it cannot be cancelled (cancelled:
     * false, nothing changes): asked again until it waits on its timer. */
    t0 = h_now_ms();
    ck_assert_msg(h_wait_until(cancelled, b, T_MS), "not cancelled");
    json_t *r = h_recv_id(b, 6, T_MS);
    long long retry = rate_must(r, false, "cancelled");
    ck_assert_msg(retry > 0 && retry <= 4000, "retry %lld", retry);
    ck_assert_int_lt(h_now_ms() - t0, 2500);
    h_assert_stat(a, "rate_waiting", 0, T_MS);
    h_assert_stat(a, "cancelled", 1, T_MS);
    h_close(b);
    h_close(a);
}
END_TEST

/* A graceful stop answers the waiting requests at once (shutting_down,
 * or acquired false when the stop ends their session first) and exits
 * cleanly. */
START_TEST(test_stop_while_waiting)
{
    h_start(NULL);
    struct h_conn *a = h_connect_ok(&D1);
    rate_must(rate_call(a, "stop", 1, 5000, 1, 0, 0), true, "first");
    s_send_id(a, 9, rate_req("stop", 1, 5000, 1, 0, 30000));
    struct h_conn *b = h_connect_ok(&D1);
    h_assert_stat(b, "rate_waiting", 1, T_MS);
    h_close(b);
    long long t0 = h_now_ms();
    ck_assert_int_eq(h_daemon_stop(&D1), 0);
    ck_assert_msg(h_now_ms() - t0 < 4000, "stopped only after %lld ms",
                  h_now_ms() - t0);
    json_t *r = h_recv_id(a, 9, 1000);
    if (r != NULL && h_ok(r)) {
        rate_must(r, false, "a wait at the stop");
    } else if (r != NULL) {
        h_expect_code(r, "shutting_down", "a wait at the stop");
    }
    h_close(a);
}
END_TEST

START_TEST(test_max_pending)
{
    h_start("limits:\n  max_pending: 2\n");
    struct h_conn *a = h_connect_ok(&D1);
    struct h_conn *b = h_connect_ok(&D1);
    struct pending_want w = {b, 3};
    rate_must(rate_call(a, "m", 1, 4000, 1, 0, 0), true, "first");
    s_send_id(a, 1, rate_req("m", 1, 4000, 1, 0, 30000));
    s_send_id(a, 2, rate_req("m", 1, 4000, 1, 0, 30000));
    ck_assert(h_wait_until(pending_is, &w, T_MS));
    s_send_id(a, 3, rate_req("m", 1, 4000, 1, 0, 30000));
    json_t *r = h_recv_id(a, 3, T_MS);
    h_expect_code(r, "busy", "a third waiting rate.acquire");
    h_close(a);
    h_close(b);
}
END_TEST

/* A rate wait takes a place under limits.max_waiters, daemon-wide and
 * shared with lock and semaphore waiters: past it a request that would
 * wait is answered busy, as a lock's is. A wait that a cancel or its
 * session's end closes gives its place back. The busy answers come at
 * once: a probe that waits instead has no reply within T_MS. */
START_TEST(test_max_waiters)
{
    h_start("limits:\n  max_waiters: 2\n");
    struct h_conn *a = h_connect_ok(&D1);
    struct h_conn *b = h_connect_ok(&D1);
    struct h_conn *c = h_connect_ok(&D1);

    rate_must(rate_call(a, "mw", 1, 60000, 1, 0, 0), true, "first");
    rate_must(rate_call(a, "mw2", 1, 60000, 1, 0, 0), true, "first of mw2");
    s_send_id(b, 1, rate_req("mw", 1, 60000, 1, 0, 120000));
    s_send_id(b, 2, rate_req("mw", 1, 60000, 1, 0, 120000));
    h_assert_stat(a, "rate_waiting", 2, T_MS);

    h_expect_code(h_call(c, rate_req("mw", 1, 60000, 1, 0, 120000), T_MS),
                  "busy", "a third rate wait");
    /* The count is the daemon's, not the key's. */
    h_expect_code(h_call(c, rate_req("mw2", 1, 60000, 1, 0, 120000), T_MS),
                  "busy", "a rate wait on another key");
    /* Deciding once, or a wait shorter than the retry, does not wait. */
    rate_must(rate_call(c, "mw", 1, 60000, 1, 0, 0), false, "try once");
    rate_must(rate_call(c, "mw", 1, 60000, 1, 0, 1000), false, "short wait");
    /* Shared with the semaphore's (and the lock's) waiters. */
    char tok[65];
    s_must(a, "mws", 1, 0, 0, tok);
    json_t *r = h_call(c, s_req("mws", 1, 0, 120000, 0), T_MS);
    h_expect_code(r, "busy", "a semaphore wait behind two rate waits");

    /* A cancelled wait gives its place back. */
    ck_assert(h_wait_until(cancelled_id, &(struct cancel_want){b, 2}, T_MS));
    rate_must(h_recv_id(b, 2, T_MS), false, "cancelled");
    h_assert_stat(a, "rate_waiting", 1, T_MS);
    s_send_id(c, 3, rate_req("mw2", 1, 60000, 1, 0, 120000));
    h_assert_stat(a, "rate_waiting", 2, T_MS);
    h_expect_code(h_call(a, rate_req("mw", 1, 60000, 1, 0, 120000), T_MS),
                  "busy", "full again");

    /* So does one whose session closed. */
    h_close(b);
    h_assert_stat(a, "rate_waiting", 1, T_MS);
    struct h_conn *d = h_connect_ok(&D1);
    s_send_id(d, 4, rate_req("mw", 1, 60000, 1, 0, 120000));
    h_assert_stat(a, "rate_waiting", 2, T_MS);
    h_expect_code(h_call(a, rate_req("mw", 1, 60000, 1, 0, 120000), T_MS),
                  "busy", "full once more");
    h_close(c);
    h_close(d);
    h_assert_stat(a, "rate_waiting", 0, T_MS);
    ck_assert_int_eq(h_stat(a, "lock_waiters"), 0);
    h_close(a);
}
END_TEST

START_TEST(test_redis_down_and_wrong_type)
{
    char yaml[128];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    struct h_conn *a = h_connect_ok(&D1);

    h_r_do(&R, "HSET leased:lock:{wt}:rate a 1");
    h_expect_code(rate_call(a, "wt", 5, 1000, 0, 0, 0), "wrong_type",
                  "a hash under the key");
    h_r_do(&R, "SET leased:lock:{ws}:rate hello");
    h_expect_code(rate_call(a, "ws", 5, 1000, 0, 0, 0), "wrong_type",
                  "a string of another shape");
    redisReply *v = h_redis_cmd(&R, "GET leased:lock:{ws}:rate");
    ck_assert(v != NULL && v->type == REDIS_REPLY_STRING);
    ck_assert_str_eq(v->str, "hello");
    freeReplyObject(v);
    ck_assert_int_eq(h_r_int(&R, "PTTL leased:lock:{ws}:rate"), -1);

    h_r_do(&R, "CONFIG SET min-replicas-to-write 1");
    h_expect_code(rate_call(a, "ro", 5, 1000, 0, 0, 0), "redis_unavailable",
                  "a Redis that cannot write");
    h_r_do(&R, "CONFIG SET min-replicas-to-write 0");

    h_redis_kill(&R);
    h_expect_code(rate_call(a, "down", 5, 1000, 0, 0, 0), "redis_unavailable",
                  "Redis down");
    h_expect_code(rate_call(a, "down", 5, 1000, 0, 0, 1000),
                  "redis_unavailable", "Redis down, waiting");
    h_close(a);
}
END_TEST

/* A decision that left while Redis stalled may have granted (and the
 * permits count against the limit): the caller is told the outcome is
 * unknown, as for a lock or a semaphore. */
START_TEST(test_redis_stalled_outcome_unknown)
{
    char yaml[160];
    ck_assert_int_eq(h_redis_start(&R, "--enable-debug-command yes"), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n"
             "  connections: 1\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    struct h_conn *a = h_connect_ok(&D1);
    rate_must(rate_call(a, "st", 5, 1000, 0, 0, 0), true, "before the stall");

    redisContext *z = h_redis_sleep_start(&R, 2);
    json_t *r = rate_call(a, "st", 5, 1000, 0, 0, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    const char *o = json_string_value(
        json_object_get(json_object_get(r, "error"), "outcome"));
    ck_assert_msg(o != NULL && strcmp(o, "unknown") == 0,
                  "no \"outcome\":\"unknown\" for a decision that left");
    json_decref(r);
    h_redis_sleep_end(z);
    h_close(a);
}
END_TEST

/* --- exactness across daemons ------------------------------------------ */

#define EX_PROCS 6
#define EX_RUN_MS 3000
#define EX_RATE 20
#define EX_PER_MS 1000
#define EX_BURST 5
#define EX_MAX 4096

/* A grant as a client saw it: decided in Redis somewhere between SENT and
 * GOT (the test's monotonic clock). */
struct grant {
    long long sent, got;
};

struct shared {
    int n[EX_PROCS];
    struct grant g[EX_PROCS][EX_MAX];
    int errors;
};

static void
hammer(struct shared *sh, int k, const struct h_daemon *d, long long start)
{
    struct h_conn *c = h_connect(d);
    if (c == NULL) {
        __atomic_add_fetch(&sh->errors, 1, __ATOMIC_SEQ_CST);
        _exit(1);
    }
    while (h_now_ms() < start) {
        usleep(1000);
    }
    while (h_now_ms() < start + EX_RUN_MS) {
        long long sent = h_now_ms();
        json_t *r = h_call(c,
                           rate_req("ex", EX_RATE, EX_PER_MS, EX_BURST, 0, 0),
                           T_MS);
        long long got = h_now_ms();
        if (r == NULL || !h_ok(r)) {
            __atomic_add_fetch(&sh->errors, 1, __ATOMIC_SEQ_CST);
        } else if (jtrue(r, "acquired") && sh->n[k] < EX_MAX) {
            sh->g[k][sh->n[k]++] = (struct grant){sent, got};
        }
        json_decref(r);
    }
    h_close(c);
    _exit(0);
}

START_TEST(test_exact_across_daemons)
{
    h_start(NULL);
    ck_assert_int_eq(h_daemon_start(&D2, &R, NULL), 0);
    struct shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
                             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    long long start = h_now_ms() + 300;
    pid_t pids[EX_PROCS];
    for (int k = 0; k < EX_PROCS; k++) {
        pids[k] = fork();
        ck_assert(pids[k] >= 0);
        if (pids[k] == 0) {
            hammer(sh, k, k % 2 == 0 ? &D1 : &D2, start);
        }
        h_track_pid(pids[k]);
    }
    for (int k = 0; k < EX_PROCS; k++) {
        int st;
        ck_assert(waitpid(pids[k], &st, 0) == pids[k]);
        h_untrack_pid(pids[k]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d", k);
    }
    ck_assert_int_eq(sh->errors, 0);

    int total = 0;
    long long first = -1, last = 0;
    for (int k = 0; k < EX_PROCS; k++) {
        ck_assert_int_lt(sh->n[k], EX_MAX);
        total += sh->n[k];
        for (int i = 0; i < sh->n[k]; i++) {
            if (first < 0 || sh->g[k][i].sent < first) {
                first = sh->g[k][i].sent;
            }
            if (sh->g[k][i].got > last) {
                last = sh->g[k][i].got;
            }
        }
    }
    /* Every window [t, t + per_ms]: the grants known to be decided in it
     * (sent at or after t, answered by t + per_ms) are at most
     * burst + rate. Each grant's sending starts a window. */
    int worst = 0;
    for (int k = 0; k < EX_PROCS; k++) {
        for (int i = 0; i < sh->n[k]; i++) {
            long long t = sh->g[k][i].sent;
            int in = 0;
            for (int j = 0; j < EX_PROCS; j++) {
                for (int m = 0; m < sh->n[j]; m++) {
                    if (sh->g[j][m].sent >= t &&
                        sh->g[j][m].got <= t + EX_PER_MS) {
                        in++;
                    }
                }
            }
            if (in > worst) {
                worst = in;
            }
        }
    }
    ck_assert_msg(worst <= EX_BURST + EX_RATE,
                  "%d grants in one window of %d ms (at most %d)", worst,
                  EX_PER_MS, EX_BURST + EX_RATE);
    /* The whole run, as one window: at most burst + rate * span. */
    long long span = last - first;
    ck_assert_msg(total <= EX_BURST + EX_RATE * span / EX_PER_MS + 1,
                  "%d grants in %lld ms", total, span);
    /* And the limiter does grant at its rate (not a limiter that refuses
     * everything): within a few of it even when loaded. */
    ck_assert_msg(total >= EX_RATE * (EX_RUN_MS - 500) / EX_PER_MS,
                  "only %d grants in %d ms", total, EX_RUN_MS);
    fprintf(stderr, "rate exactness: %d grants in %lld ms, worst window %d\n",
            total, span, worst);
    munmap(sh, sizeof(*sh));
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(validation, 30),
        H_CASE(decisions, 30),
        H_CASE(wait_granted, 40),
        H_CASE(wait_ends_with_session_and_cancel, 40),
        H_CASE(max_pending, 30),
        H_CASE(max_waiters, 40),
        H_CASE(stop_while_waiting, 40),
        H_CASE(redis_down_and_wrong_type, 40),
        H_CASE(redis_stalled_outcome_unknown, 40),
        H_CASE(exact_across_daemons, 60),
    };
    return H_MAIN(fx, cases);
}
