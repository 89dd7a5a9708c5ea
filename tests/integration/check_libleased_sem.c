/* libleased's semaphore, rate limiter and Bloom filter calls and
 * leased_cancel against real redis-server and real leased. */

#include "harness.h"
#include "leased/client.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "libleased_sem",
    .redis = {&R},
    .daemons = {&D},
    .start_yaml = "lock:\n  watchdog_ms: 600\n",
};

static struct leased_conn *
conn(void)
{
    struct leased_error err;
    struct leased_conn *c = leased_connect(D.sock, NULL, &err);
    ck_assert_msg(c != NULL, "connect: %s", err.message);
    return c;
}

START_TEST(test_sem_calls)
{
    struct leased_conn *a = conn(), *b = conn();
    struct leased_error err;
    struct leased_sem_result r1, r2;
    struct leased_sem_args two = {.permits = 2};
    struct leased_sem_info info;
    long long n = -1;

    ck_assert_int_eq(leased_sem_acquire(a, "lsem", 3, &two, &r1, &err),
                     LEASED_OK);
    ck_assert(r1.acquired);
    ck_assert_int_eq(r1.permits, 2);
    ck_assert_int_eq(r1.available, 1);
    ck_assert_int_gt(r1.lease_ms, 0);
    ck_assert_int_eq(leased_sem_acquire(b, "lsem", 3, &two, &r2, &err),
                     LEASED_OK);
    ck_assert(!r2.acquired);
    ck_assert_int_eq(r2.available, 1);
    ck_assert_int_eq(leased_sem_info(b, "lsem", 3, &info, &err), LEASED_OK);
    ck_assert_int_eq(info.held, 2);
    ck_assert_int_eq(info.available, 1);

    two.permits = 4;
    ck_assert_int_eq(leased_sem_acquire(b, "lsem", 3, &two, &r2, &err),
                     LEASED_E_BAD_REQUEST);

    ck_assert_int_eq(leased_sem_release(b, "lsem", r1.token, &n, &err),
                     LEASED_OK);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(leased_sem_release(b, "lsem", r1.token, &n, &err),
                     LEASED_E_NOT_HELD);
    ck_assert_str_eq(err.reason, "absent");
    leased_close(a);
    leased_close(b);
}
END_TEST

START_TEST(test_rate_calls)
{
    struct leased_conn *a = conn();
    struct leased_error err;
    struct leased_rate_result r;
    struct leased_rate_args two = {.burst = 2};

    ck_assert_int_eq(leased_rate_acquire(a, "lrate", 2, 60000, &two, &r, &err),
                     LEASED_OK);
    ck_assert(r.acquired);
    ck_assert_int_eq(r.retry_after_ms, 0);
    ck_assert_int_eq(leased_rate_acquire(a, "lrate", 2, 60000, &two, &r, &err),
                     LEASED_OK);
    ck_assert(r.acquired);
    ck_assert_int_eq(leased_rate_acquire(a, "lrate", 2, 60000, &two, &r, &err),
                     LEASED_OK);
    ck_assert(!r.acquired);
    ck_assert_msg(r.retry_after_ms > 0 && r.retry_after_ms <= 30000,
                  "retry after %lld", r.retry_after_ms);
    struct leased_rate_args three = {.burst = 2, .permits = 3};
    ck_assert_int_eq(leased_rate_acquire(a, "lrate", 2, 60000, &three, &r,
                                         &err),
                     LEASED_E_BAD_REQUEST);
    /* Default burst (the rate) and a wait the daemon does for us. */
    ck_assert_int_eq(leased_rate_acquire(a, "lw", 1, 300, NULL, &r, &err),
                     LEASED_OK);
    ck_assert(r.acquired);
    struct leased_rate_args wait = {.wait_ms = 10000};
    ck_assert_int_eq(leased_rate_acquire(a, "lw", 1, 300, &wait, &r, &err),
                     LEASED_OK);
    ck_assert(r.acquired);
    leased_close(a);
}
END_TEST

START_TEST(test_bloom_calls)
{
    struct leased_conn *a = conn();
    struct leased_error err;
    struct leased_cache_result r;
    bool created = false, ruled = true, out[3];
    const char *keys[] = {"lb:1", "lb:2", "lb:3"};

    ck_assert_int_eq(leased_bloom_create(a, "lbf", 100, 0.01, &created, &err),
                     LEASED_OK);
    ck_assert(created);
    ck_assert_int_eq(leased_bloom_create(a, "lbf", 100, 0.01, &created, &err),
                     LEASED_OK);
    ck_assert(!created);
    ck_assert_int_eq(leased_bloom_create(a, "lbf", 200, 0.01, &created, &err),
                     LEASED_E_BAD_REQUEST);
    ck_assert_int_eq(leased_bloom_add(a, "lbf", keys, 2, out, &err),
                     LEASED_OK);
    ck_assert(out[0] && out[1]);
    ck_assert_int_eq(leased_bloom_check(a, "lbf", keys, 3, out, &err),
                     LEASED_OK);
    ck_assert(out[0] && out[1] && !out[2]);
    ck_assert_int_eq(leased_bloom_check(a, "none", keys, 1, out, &err),
                     LEASED_E_BAD_REQUEST);
    /* Ruled out: a null, marked. */
    ck_assert_int_eq(leased_cache_get_bloom(a, "lb:3", "lbf", LEASED_UNSET,
                                            true, &r, &ruled, &err),
                     LEASED_OK);
    ck_assert(r.hit && r.is_null && r.lease == NULL && ruled);
    leased_cache_result_free(&r);
    /* Maybe: the usual miss with its lease. */
    ck_assert_int_eq(leased_cache_get_bloom(a, "lb:1", "lbf", LEASED_UNSET,
                                            true, &r, &ruled, &err),
                     LEASED_OK);
    ck_assert(!r.hit && r.lease != NULL && !ruled);
    leased_cache_result_free(&r);
    leased_close(a);
}
END_TEST

START_TEST(test_cancel)
{
    struct leased_conn *a = conn(), *b = conn();
    struct leased_error err;
    struct leased_sem_result r1;
    json_t *req, *reply = NULL;
    uint64_t id;
    bool cancelled = false;

    ck_assert_int_eq(leased_sem_acquire(a, "lcan", 1, NULL, &r1, &err),
                     LEASED_OK);
    ck_assert(r1.acquired);
    req = json_pack("{s:s,s:s,s:i,s:i}", "op", "sem.acquire", "key", "lcan",
                    "limit", 1, "wait_ms", -1);
    ck_assert_int_eq(leased_send(b, req, &id, &err), LEASED_OK);
    json_decref(req);
    struct h_conn *hc = h_connect_ok(&D);
    h_assert_stat(hc, "lock_waiters", 1, 5000);
    ck_assert_int_eq(leased_cancel(b, id, &cancelled, &err), LEASED_OK);
    ck_assert(cancelled);
    ck_assert_int_eq(leased_wait_reply(b, id, 5000, &reply, &err), LEASED_OK);
    ck_assert(json_is_false(json_object_get(reply, "acquired")));
    json_decref(reply);
    ck_assert_int_eq(leased_cancel(b, id, &cancelled, &err), LEASED_OK);
    ck_assert(!cancelled);
    h_close(hc);
    leased_close(a);
    leased_close(b);
}
END_TEST

START_TEST(test_sem_lost_event)
{
    struct leased_conn *a = conn();
    struct leased_error err;
    struct leased_sem_result r1;
    struct leased_event ev;

    ck_assert_int_eq(leased_sem_acquire(a, "llost", 1, NULL, &r1, &err),
                     LEASED_OK);
    ck_assert(r1.acquired);
    h_r_do(&R, "DEL leased:lock:{llost}:sem leased:lock:{llost}:sem:permits");
    ck_assert_int_eq(leased_next_event(a, 5000, &ev, &err), LEASED_OK);
    ck_assert_int_eq(ev.type, LEASED_EV_SEM_LOST);
    ck_assert_str_eq(ev.key, "llost");
    ck_assert_str_eq(ev.token, r1.token);
    ck_assert_str_eq(ev.reason, "expired");
    leased_event_clear(&ev);
    leased_close(a);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(sem_calls, 60),      H_CASE(rate_calls, 60),
        H_CASE(bloom_calls, 60),    H_CASE(cancel, 60),
        H_CASE(sem_lost_event, 60),
    };
    return H_MAIN(fx, cases);
}
