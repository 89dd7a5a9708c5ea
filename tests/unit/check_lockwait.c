/* ld_lockwait: the lock wait queues, without Redis. The attempts, the
 * expiries and the unlock channel are fakes that record what the queue
 * asks for; timers run on a real event loop. */
#include "ld_common.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_lockwait.h"
#include "ld_stats.h"
#include "ld_util.h"

#include "unit.h"

#include <check.h>
#include <event2/event.h>
#include <string.h>

#define MAX_REC 64

static struct event_base *base;
static struct ld_config cfg;
static struct ld_ctx ctx;

static struct ld_lockwait *tries[MAX_REC];
static int ntries;
static struct ld_lockwait *expired[MAX_REC];
static long long expired_ttl[MAX_REC];
static int nexpired;
static int nsubs, nunsubs;
static ld_pubsub_cb *sub_cb;
static void *sub_arg;
static char sub_token;

static void
fake_try(struct ld_lockwait *w)
{
    ck_assert(w->trying);
    ck_assert_int_lt(ntries, MAX_REC);
    tries[ntries++] = w;
}

static void
fake_expire(struct ld_lockwait *w, long long ttl_ms)
{
    ck_assert_ptr_null(w->q);
    ck_assert_int_lt(nexpired, MAX_REC);
    expired[nexpired] = w;
    expired_ttl[nexpired++] = ttl_ms;
}

static struct ld_pubsub_sub *
fake_sub(const char *chan, size_t len, ld_pubsub_cb *cb, void *arg)
{
    ck_assert_uint_eq(len, strlen(chan));
    nsubs++;
    sub_cb = cb;
    sub_arg = arg;
    return (struct ld_pubsub_sub *)(void *)&sub_token;
}

static void
fake_unsub(struct ld_pubsub_sub *sub)
{
    ck_assert_ptr_eq(sub, (void *)&sub_token);
    nunsubs++;
}

static void
publish(enum ld_pubsub_event ev)
{
    ck_assert_ptr_nonnull(sub_cb);
    sub_cb(ev, "0", 1, sub_arg);
}

static void
setup(void)
{
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
    ld_conf_defaults(&cfg);
    ctx.base = base;
    ctx.cfg = &cfg;
    ctx.instance = "test";
    ctx.start_ms = ld_now_ms();
    ntries = nexpired = nsubs = nunsubs = 0;
    sub_cb = NULL;
    sub_arg = NULL;
    memset(&ld_stats, 0, sizeof(ld_stats));
    ck_assert_int_eq(ld_lockwait_init(&ctx), LD_OK);
    ld_lockwait_set_handlers(fake_try, fake_expire);
    ld_lockwait_set_channel(fake_sub, fake_unsub);
}

static void
teardown(void)
{
    ld_lockwait_free();
    ld_conf_free(&cfg);
    event_base_free(base);
}

/* Run the loop until *COUNTER reaches TARGET or MS pass. */
static bool
wait_for(const int *counter, int target, long long ms)
{
    uint64_t end = ld_now_ms() + (uint64_t)ms;
    while (*counter < target && ld_now_ms() < end) {
        struct timeval tv = {0, 5000};
        event_base_loopexit(base, &tv);
        event_base_loop(base, 0);
    }
    return *counter >= target;
}

static void
join(struct ld_lockwait *w, const char *route, long long wait_ms, bool tried,
     long long pttl)
{
    char chan[64];
    snprintf(chan, sizeof(chan), "%s:unlock", route);
    ld_lockwait_join(w, route, strlen(route), chan, strlen(chan), wait_ms,
                     tried, pttl);
}

START_TEST(fifo_per_key)
{
    struct ld_lockwait w[3], other;
    memset(w, 0, sizeof(w));
    memset(&other, 0, sizeof(other));
    for (int i = 0; i < 3; i++) {
        join(&w[i], "a", -1, false, 0);
    }
    /* Only the first of a queue tries at once. */
    ck_assert_int_eq(ntries, 1);
    ck_assert_ptr_eq(tries[0], &w[0]);
    ck_assert_int_eq(ld_stats.lock_waiters, 3);
    /* Another lock has its own queue. */
    join(&other, "b", -1, false, 0);
    ck_assert_int_eq(ntries, 2);
    ck_assert_ptr_eq(tries[1], &other);

    /* Whatever the head's outcome, the next one in order tries once. */
    ld_lockwait_done(&w[0], LD_LOCKWAIT_GRANTED, 0);
    ck_assert_ptr_null(w[0].q);
    ck_assert_int_eq(ntries, 3);
    ck_assert_ptr_eq(tries[2], &w[1]);
    ld_lockwait_done(&w[1], LD_LOCKWAIT_FAILED, 0);
    ck_assert_int_eq(ntries, 4);
    ck_assert_ptr_eq(tries[3], &w[2]);
    ld_lockwait_done(&w[2], LD_LOCKWAIT_GRANTED, 0);
    ld_lockwait_done(&other, LD_LOCKWAIT_GRANTED, 0);
    ck_assert_int_eq(ntries, 4);
    ck_assert_int_eq(nexpired, 0);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
    /* Nobody saw a holder, so nobody subscribed. */
    ck_assert_int_eq(nsubs, 0);
}
END_TEST

START_TEST(only_head_retries_on_message)
{
    struct ld_lockwait w[3];
    memset(w, 0, sizeof(w));
    join(&w[0], "a", -1, false, 0);
    ck_assert_int_eq(ntries, 1);
    ld_lockwait_done(&w[0], LD_LOCKWAIT_TAKEN, 60000);
    ck_assert_ptr_nonnull(w[0].q);
    ck_assert_int_eq(nsubs, 1);
    /* Later requests that tried already just queue. */
    join(&w[1], "a", -1, true, 60000);
    join(&w[2], "a", -1, true, 60000);
    ck_assert_int_eq(ntries, 1);
    ck_assert_int_eq(nsubs, 1);

    publish(LD_PUBSUB_MESSAGE);
    ck_assert_int_eq(ntries, 2);
    ck_assert_ptr_eq(tries[1], &w[0]);
    ck_assert_int_eq(ld_stats.lock_wakeups, 1);
    /* A wake-up while the head is trying is kept for when it is done. */
    publish(LD_PUBSUB_MESSAGE);
    ck_assert_int_eq(ntries, 2);
    ld_lockwait_done(&w[0], LD_LOCKWAIT_TAKEN, 60000);
    ck_assert_int_eq(ntries, 3);
    ck_assert_ptr_eq(tries[2], &w[0]);
    ld_lockwait_done(&w[0], LD_LOCKWAIT_TAKEN, 60000);
    ck_assert_int_eq(ntries, 3);
    /* A confirmed (re)subscription closes the race with a missed unlock. */
    publish(LD_PUBSUB_SUBSCRIBED);
    ck_assert_int_eq(ntries, 4);
    ck_assert_ptr_eq(tries[3], &w[0]);
    ld_lockwait_done(&w[0], LD_LOCKWAIT_TAKEN, 60000);
    /* A lost subscription alone makes no attempt. */
    publish(LD_PUBSUB_LOST);
    ck_assert_int_eq(ntries, 4);

    ld_lockwait_leave(&w[2]);
    ld_lockwait_leave(&w[1]);
    ld_lockwait_leave(&w[0]);
    ck_assert_int_eq(ntries, 4);
    ck_assert_int_eq(nunsubs, 1);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
}
END_TEST

START_TEST(lease_expiry_retry)
{
    struct ld_lockwait w, w2;
    memset(&w, 0, sizeof(w));
    memset(&w2, 0, sizeof(w2));
    join(&w, "a", -1, false, 0);
    join(&w2, "a", -1, true, 50);
    uint64_t t0 = ld_now_ms();
    ld_lockwait_done(&w, LD_LOCKWAIT_TAKEN, 50);
    ck_assert_int_eq(ntries, 1);
    /* No message ever comes: the holder's lease end is the wake-up. */
    ck_assert(wait_for(&ntries, 2, 10000));
    ck_assert_uint_ge(ld_now_ms() - t0, 50);
    ck_assert_ptr_eq(tries[1], &w);
    ck_assert_int_eq(ld_stats.lock_wakeups, 1);
    ld_lockwait_done(&w, LD_LOCKWAIT_GRANTED, 0);
    ck_assert_int_eq(ntries, 3);
    ck_assert_ptr_eq(tries[2], &w2);
    ld_lockwait_done(&w2, LD_LOCKWAIT_GRANTED, 0);
    ck_assert_int_eq(nexpired, 0);
}
END_TEST

START_TEST(leave_transitions)
{
    struct ld_lockwait w[3];
    memset(w, 0, sizeof(w));
    join(&w[0], "a", -1, false, 0);
    join(&w[1], "a", -1, false, 0);
    ck_assert_int_eq(ntries, 1);
    /* A waiter behind the head leaves without anyone trying. */
    ld_lockwait_leave(&w[1]);
    ck_assert_ptr_null(w[1].q);
    ck_assert_int_eq(ntries, 1);
    join(&w[2], "a", -1, false, 0);
    ck_assert_int_eq(ntries, 1);
    /* The head leaves during its attempt: its outcome will not reach the
     * queue, so the next one tries now. */
    ld_lockwait_leave(&w[0]);
    ck_assert_int_eq(ntries, 2);
    ck_assert_ptr_eq(tries[1], &w[2]);
    /* The late outcome of the one that left changes nothing. */
    ld_lockwait_done(&w[0], LD_LOCKWAIT_GRANTED, 0);
    ck_assert(!w[0].trying);
    ck_assert_int_eq(ntries, 2);
    ck_assert_int_eq(ld_stats.lock_waiters, 1);
    ld_lockwait_done(&w[2], LD_LOCKWAIT_GRANTED, 0);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
    ck_assert_int_eq(nexpired, 0);
    /* Leaving twice is harmless. */
    ld_lockwait_leave(&w[2]);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
}
END_TEST

START_TEST(deadline_behind_head)
{
    struct ld_lockwait w[2];
    memset(w, 0, sizeof(w));
    join(&w[0], "a", -1, false, 0);
    ld_lockwait_done(&w[0], LD_LOCKWAIT_TAKEN, 60000);
    join(&w[1], "a", 30, true, 60000);
    ck_assert(wait_for(&nexpired, 1, 10000));
    ck_assert_ptr_eq(expired[0], &w[1]);
    /* The holder's lease as last seen, counted down. */
    ck_assert_int_gt(expired_ttl[0], 0);
    ck_assert_int_le(expired_ttl[0], 60000);
    ck_assert_ptr_null(w[1].q);
    ck_assert_ptr_null(w[1].deadline_ev);
    /* Its going made nobody try. */
    ck_assert_int_eq(ntries, 1);
    ck_assert_ptr_nonnull(w[0].q);
    ck_assert_int_eq(ld_stats.lock_waiters, 1);
    ld_lockwait_leave(&w[0]);
    ck_assert_int_eq(nunsubs, 1);
}
END_TEST

START_TEST(deadline_head_last_try)
{
    struct ld_lockwait w, w2;
    memset(&w, 0, sizeof(w));
    memset(&w2, 0, sizeof(w2));
    join(&w, "a", 30, false, 0);
    ld_lockwait_done(&w, LD_LOCKWAIT_TAKEN, 60000);
    join(&w2, "a", -1, true, 60000);
    ck_assert_int_eq(ntries, 1);
    /* At its deadline the head makes one last attempt... */
    ck_assert(wait_for(&ntries, 2, 10000));
    ck_assert_ptr_eq(tries[1], &w);
    ck_assert(w.timed_out);
    ck_assert_int_eq(nexpired, 0);
    /* ...whose failure answers it; the next head does not try at once
     * (the holder is still there) but inherits the lease end. */
    ld_lockwait_done(&w, LD_LOCKWAIT_TAKEN, 500);
    ck_assert_int_eq(nexpired, 1);
    ck_assert_ptr_eq(expired[0], &w);
    ck_assert_int_eq(expired_ttl[0], 500);
    ck_assert_ptr_null(w.q);
    ck_assert_int_eq(ntries, 2);
    ck_assert(wait_for(&ntries, 3, 10000));
    ck_assert_ptr_eq(tries[2], &w2);
    ld_lockwait_done(&w2, LD_LOCKWAIT_GRANTED, 0);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
    ck_assert_int_eq(nunsubs, 1);
}
END_TEST

START_TEST(granted_head_at_deadline)
{
    struct ld_lockwait w;
    memset(&w, 0, sizeof(w));
    join(&w, "a", 30, false, 0);
    ld_lockwait_done(&w, LD_LOCKWAIT_TAKEN, 60000);
    ck_assert(wait_for(&ntries, 2, 10000));
    /* The last attempt won: no expiry. */
    ld_lockwait_done(&w, LD_LOCKWAIT_GRANTED, 0);
    ck_assert_int_eq(nexpired, 0);
    ck_assert_ptr_null(w.q);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
}
END_TEST

START_TEST(max_waiters)
{
    struct ld_lockwait w[3];
    memset(w, 0, sizeof(w));
    cfg.limits.max_waiters = 2;
    ck_assert(!ld_lockwait_full());
    join(&w[0], "a", -1, false, 0);
    ck_assert(!ld_lockwait_full());
    /* The limit counts waiters of every lock. */
    join(&w[1], "b", -1, false, 0);
    ck_assert(ld_lockwait_full());
    ld_lockwait_done(&w[0], LD_LOCKWAIT_GRANTED, 0);
    ck_assert(!ld_lockwait_full());
    join(&w[2], "b", -1, false, 0);
    ck_assert(ld_lockwait_full());
    /* A reload applies to the next request. */
    cfg.limits.max_waiters = 3;
    ck_assert(!ld_lockwait_full());
    ld_lockwait_leave(&w[1]);
    ld_lockwait_leave(&w[2]);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
}
END_TEST

START_TEST(free_drops_waiters)
{
    struct ld_lockwait w[2];
    memset(w, 0, sizeof(w));
    join(&w[0], "a", 60000, false, 0);
    join(&w[1], "a", 60000, false, 0);
    ld_lockwait_done(&w[0], LD_LOCKWAIT_TAKEN, 60000);
    ld_lockwait_free();
    ck_assert_ptr_null(w[0].q);
    ck_assert_ptr_null(w[1].q);
    ck_assert_ptr_null(w[1].deadline_ev);
    ck_assert_int_eq(ld_stats.lock_waiters, 0);
    ck_assert_int_eq(nunsubs, 1);
    ck_assert_int_eq(nexpired, 0);
    /* teardown frees again: that must be harmless. */
}
END_TEST

static Suite *
lockwait_suite(void)
{
    Suite *s = suite_create("lockwait");
    TCase *tc = tcase_create("queue");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fifo_per_key);
    tcase_add_test(tc, only_head_retries_on_message);
    tcase_add_test(tc, lease_expiry_retry);
    tcase_add_test(tc, leave_transitions);
    tcase_add_test(tc, deadline_behind_head);
    tcase_add_test(tc, deadline_head_last_try);
    tcase_add_test(tc, granted_head_at_deadline);
    tcase_add_test(tc, max_waiters);
    tcase_add_test(tc, free_drops_waiters);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(lockwait_suite());
}
