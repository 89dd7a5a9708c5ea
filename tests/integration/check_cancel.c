/* The cancel op against real redis-server and real leased: a waiting
 * lock, sem.acquire and cache.get answer at once as if their wait ran
 * out, and nothing stays acquired afterwards, also when the grant was
 * already on its way to Redis (held up there by CLIENT PAUSE). */

#include "lock_util.h"
#include "sem_util.h"

#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "cancel",
    .redis = {&R},
    .daemons = {&D},
};

/* Cancel TARGET on C; returns the "cancelled" answer. */
static bool
cancel(struct h_conn *c, json_int_t target)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:I}", "op", "cancel", "target",
                        target);
    ck_assert_msg(r != NULL && h_ok(r), "cancel: %s",
                  r != NULL ? h_errcode(r) : "no reply");
    ck_assert(json_is_boolean(json_object_get(r, "cancelled")));
    bool done = jtrue(r, "cancelled");
    json_decref(r);
    return done;
}

struct key_gone_want {
    const char *key;
};

static bool
key_gone(void *arg)
{
    const struct key_gone_want *w = arg;
    return h_r_int(&R, "EXISTS %s", w->key) == 0;
}

static void
wait_key_gone(const char *key, int timeout_ms)
{
    struct key_gone_want w = {key};
    ck_assert_msg(h_wait_until(key_gone, &w, timeout_ms), "%s still there",
                  key);
}

START_TEST(test_cancel_lock_wait)
{
    struct h_conn *a, *b;
    json_t *r;
    long long t0;

    h_start(NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);
    json_decref(lk_must(a, "cl", NULL, NO_TTL, 0));
    lk_send(b, 7, "cl", NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 1, T_MS);

    t0 = h_now_ms();
    ck_assert(cancel(b, 7));
    r = h_recv_id(b, 7, T_MS);
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "acquired"),
                  "the cancelled lock did not answer acquired:false");
    ck_assert(json_is_integer(json_object_get(r, "ttl_ms")));
    ck_assert_int_lt(h_now_ms() - t0, 1000);
    json_decref(r);
    h_assert_stat(b, "lock_waiters", 0, T_MS);
    h_assert_stat(b, "cancelled", 1, T_MS);

    /* Released now, B must not get it: it no longer waits. */
    lk_unlock_ok(a, "cl", NULL);
    r = lk_info(b, "cl");
    ck_assert(!jtrue(r, "locked"));
    json_decref(r);

    /* Nothing left to cancel: answered already, unknown, or not ours. */
    ck_assert(!cancel(b, 7));
    ck_assert(!cancel(b, 12345));
    lk_send(b, 8, "cl2", NULL, NO_TTL, 20000); /* granted at once */
    r = h_recv_id(b, 8, T_MS);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    ck_assert(!cancel(b, 8));
    lk_send(a, 9, "cl2", NULL, NO_TTL, 20000);
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    ck_assert(!cancel(b, 9)); /* another session's request */
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    h_close(b);
    r = h_recv_id(a, 9, T_MS);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);

    h_expect_code(h_callf(a, T_MS, "{s:s}", "op", "cancel"), "bad_request",
                  "cancel without target");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:{}}", "op", "cancel", "target"),
                  "bad_request", "cancel with an object as target");
    h_close(a);
}
END_TEST

START_TEST(test_cancel_string_id_and_sem_wait)
{
    struct h_conn *a, *b;
    json_t *r;
    char t[65];

    h_start(NULL);
    a = h_connect_ok(&D);
    b = h_connect_ok(&D);
    s_must(a, "cs", 1, 0, 0, t);
    json_t *req = s_req("cs", 1, 0, -1, 0);
    json_object_set_new(req, "id", json_string("job-1"));
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ck_assert_int_eq(h_send_raw(b, line, strlen(line)), 0);
    ck_assert_int_eq(h_send_raw(b, "\n", 1), 0);
    free(line);
    h_assert_stat(b, "lock_waiters", 1, T_MS);

    r = h_callf(b, T_MS, "{s:s,s:s}", "op", "cancel", "target", "job-1");
    ck_assert_msg(r != NULL && jtrue(r, "cancelled"), "not cancelled");
    json_decref(r);
    /* Its answer came before the cancel's. */
    r = h_recv(b, T_MS);
    ck_assert_msg(r != NULL && !jtrue(r, "acquired"), "no acquired:false");
    ck_assert_str_eq(jstr(r, "id"), "job-1");
    ck_assert_int_eq(jint(r, "available"), 0);
    json_decref(r);

    r = s_release(a, "cs", t);
    json_decref(r);
    ck_assert_int_eq(s_held(a, "cs", 1), 0);
    h_close(a);
    h_close(b);
}
END_TEST

/* A group lock ("keys") that waits behind a holder of one key is
 * cancelled like a single lock: answered at once, out of the queue, and
 * the release it waited for grants it nothing. */
START_TEST(test_cancel_multilock_wait)
{
    struct h_conn *a, *b, *c;
    json_t *r;

    h_start(NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);
    c = lk_connect(&D);
    json_decref(lk_must(a, "gm2", NULL, NO_TTL, 0));
    static const char waiting[] =
        "{\"op\":\"lock\",\"keys\":[\"gm1\",\"gm2\"],\"wait_ms\":-1,"
        "\"id\":\"grp\"}\n";
    ck_assert_int_eq(h_send_raw(b, waiting, sizeof(waiting) - 1), 0);
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    /* The attempt that found gm2 held gave gm1 back before it waited. */
    wait_key_gone("leased:lock:{gm1}", T_MS);

    long long t0 = h_now_ms();
    r = h_callf(b, T_MS, "{s:s,s:s}", "op", "cancel", "target", "grp");
    ck_assert_msg(r != NULL && jtrue(r, "cancelled"),
                  "the waiting group was not cancelled");
    json_decref(r);
    r = h_recv(b, T_MS);
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "acquired"),
                  "the cancelled group did not answer acquired:false");
    ck_assert_str_eq(jstr(r, "id"), "grp");
    ck_assert_int_lt(h_now_ms() - t0, 1000);
    json_decref(r);
    h_assert_stat(b, "lock_waiters", 0, T_MS);
    r = h_callf(b, T_MS, "{s:s,s:s}", "op", "cancel", "target", "grp");
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "cancelled"),
                  "the group was cancelled twice");
    json_decref(r);

    /* The release it waited for wakes nobody: C takes both keys at once,
     * and B's group never holds either. */
    long long acquired = h_stat(a, "lock_acquired");
    lk_unlock_ok(a, "gm2", NULL);
    r = h_callf(c, T_MS, "{s:s,s:[s,s]}", "op", "lock", "keys", "gm1", "gm2");
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "the keys of the cancelled group are not free");
    json_decref(r);
    /* C's two keys are the only grants since the cancel. */
    ck_assert_int_eq(h_stat(a, "lock_acquired"), acquired + 2);
    ck_assert_int_eq(h_stat(a, "locks_held"), 2);
    h_assert_ping(b);
    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

/* A waiting request's id matches the cancel's target as a JSON value,
 * whatever way either was written: escapes or none, and a string is
 * never the integer with the same digits. */
START_TEST(test_cancel_target_as_json_value)
{
    struct h_conn *a, *b;
    json_t *r;

    h_start(NULL);
    a = lk_connect(&D);
    b = lk_connect(&D);
    json_decref(lk_must(a, "cv", NULL, NO_TTL, 0));
    /* "job-\u00e9" with escapes: the daemon reads it through jansson. */
    static const char waiting[] =
        "{\"op\":\"lock\",\"key\":\"cv\",\"wait_ms\":20000,"
        "\"id\":\"j\\u006fb-\\u00e9\"}\n";
    ck_assert_int_eq(h_send_raw(b, waiting, sizeof(waiting) - 1), 0);
    lk_send(b, 7, "cv2", NULL, NO_TTL, 0);
    r = h_recv_id(b, 7, T_MS);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    json_decref(lk_must(a, "cv3", NULL, NO_TTL, 0));
    lk_send(b, 8, "cv3", NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 2, T_MS);

    /* The string "8" is not the integer 8. */
    r = h_callf(b, T_MS, "{s:s,s:s}", "op", "cancel", "target", "8");
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "cancelled"),
                  "the string \"8\" cancelled the request with id 8");
    json_decref(r);
    h_assert_stat(b, "lock_waiters", 2, T_MS);

    /* Plain UTF-8 (a flat request) finds the escaped id. */
    r = h_callf(b, T_MS, "{s:s,s:s}", "op", "cancel", "target",
                "job-\xc3\xa9");
    ck_assert_msg(r != NULL && jtrue(r, "cancelled"), "not cancelled");
    json_decref(r);
    r = h_recv(b, T_MS);
    ck_assert_msg(r != NULL && !jtrue(r, "acquired"), "no acquired:false");
    ck_assert_str_eq(jstr(r, "id"), "job-\xc3\xa9");
    json_decref(r);
    ck_assert(cancel(b, 8));
    h_assert_stat(b, "lock_waiters", 0, T_MS);
    h_close(a);
    h_close(b);
}
END_TEST

START_TEST(test_cancel_cache_wait)
{
    struct h_conn *a, *b;
    json_t *r;

    h_start(NULL);
    a = h_connect_ok(&D);
    b = h_connect_ok(&D);
    r = h_callf(a, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "cg");
    ck_assert_msg(jstr(r, "lease") != NULL, "the first get got no lease");
    char lease[128];
    snprintf(lease, sizeof lease, "%s", jstr(r, "lease"));
    json_decref(r);

    s_send_id(b, 5,
              json_pack("{s:s,s:s,s:i}", "op", "cache.get", "key", "cg",
                        "wait_ms", 20000));
    h_assert_stat(b, "cache_waits", 1, T_MS);
    ck_assert(cancel(b, 5));
    r = h_recv_id(b, 5, T_MS);
    ck_assert_msg(r != NULL && h_ok(r) && !jtrue(r, "hit"), "not a miss");
    ck_assert_msg(json_is_null(json_object_get(r, "lease")),
                  "a cancelled get must not carry a lease");
    json_decref(r);

    r = h_callf(a, T_MS, "{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", "cg",
                "lease", lease, "value", "v1");
    ck_assert(jtrue(r, "stored"));
    json_decref(r);
    h_assert_ping(b);
    h_close(a);
    h_close(b);
}
END_TEST

/* A cancel that arrives while the waiter's attempt is held up in Redis:
 * the answer is immediate, and what the attempt grants is given back
 * (under SEM_LAYOUT 2 the one-permit grant is a bare zset member). */
static void
cancel_grant_in_flight(int sem_layout)
{
    struct h_conn *a, *b;
    json_t *r;
    long long t0;

    char yaml[192];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 5000\n"
             "cache:\n  fill_lease_ms: 30000\nlock:\n  sem_layout: %d\n",
             R.port, sem_layout);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    a = h_connect_ok(&D);
    b = h_connect_ok(&D);

    /* lock */
    h_r_do(&R, "CLIENT PAUSE 700 WRITE");
    lk_send(b, 21, "fl", NULL, NO_TTL, 20000);
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    t0 = h_now_ms();
    ck_assert(cancel(b, 21));
    r = h_recv_id(b, 21, T_MS);
    ck_assert_msg(r != NULL && !jtrue(r, "acquired"), "lock: not false");
    ck_assert_int_lt(h_now_ms() - t0, 400);
    json_decref(r);
    h_assert_stat(b, "lock_acquired", 1, T_MS); /* the grant came back */
    wait_key_gone("leased:lock:{fl}", T_MS);
    h_assert_stat(b, "locks_held", 0, T_MS);
    json_decref(lk_must(a, "fl", NULL, NO_TTL, 0));

    /* sem.acquire */
    h_r_do(&R, "CLIENT PAUSE 700 WRITE");
    s_send_id(b, 22, s_req("fs", 1, 0, 20000, 0));
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    t0 = h_now_ms();
    ck_assert(cancel(b, 22));
    r = h_recv_id(b, 22, T_MS);
    ck_assert_msg(r != NULL && !jtrue(r, "acquired"), "sem: not false");
    ck_assert_int_lt(h_now_ms() - t0, 400);
    json_decref(r);
    h_assert_stat(b, "sem_acquired", 1, T_MS);
    wait_key_gone("leased:lock:{fs}:sem", T_MS);
    h_assert_stat(b, "sem_holds", 0, T_MS);
    ck_assert_int_eq(s_held(a, "fs", 1), 0);

    /* cache.get: its fetch would grant the fill lease. */
    h_r_do(&R, "CLIENT PAUSE 700 WRITE");
    s_send_id(b, 23,
              json_pack("{s:s,s:s,s:i}", "op", "cache.get", "key", "fc",
                        "wait_ms", 20000));
    /* No wait needed: the session's lines are taken in order, so the
     * fetch is on its way (held by the pause) before the cancel is read. */
    t0 = h_now_ms();
    ck_assert(cancel(b, 23));
    r = h_recv_id(b, 23, T_MS);
    ck_assert_msg(r != NULL && !jtrue(r, "hit") &&
                      json_is_null(json_object_get(r, "lease")),
                  "cache: not a miss without lease");
    ck_assert_int_lt(h_now_ms() - t0, 400);
    json_decref(r);
    /* The lease that fetch took goes back: another caller gets one long
     * before fill_lease_ms. */
    bool leased = false;
    long long deadline = h_now_ms() + 5000;
    while (!leased && h_now_ms() < deadline) {
        r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "cache.get", "key", "fc",
                    "wait_ms", 0);
        leased = r != NULL && jstr(r, "lease") != NULL;
        json_decref(r);
        if (!leased) {
            usleep(50 * 1000);
        }
    }
    ck_assert_msg(leased, "the cancelled get's fill lease was kept");
    h_close(a);
    h_close(b);
}

START_TEST(test_cancel_grant_in_flight)
{
    cancel_grant_in_flight(1);
}
END_TEST

START_TEST(test_cancel_grant_in_flight_layout2)
{
    cancel_grant_in_flight(2);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(cancel_lock_wait, 60),
        H_CASE(cancel_string_id_and_sem_wait, 60),
        H_CASE(cancel_target_as_json_value, 60),
        H_CASE(cancel_cache_wait, 60),
        H_CASE(cancel_multilock_wait, 60),
        H_CASE(cancel_grant_in_flight, 60),
        H_CASE(cancel_grant_in_flight_layout2, 60),
    };
    return H_MAIN(fx, cases);
}
