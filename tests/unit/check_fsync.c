/* The fdatasync worker: the loop goes on while the sync runs, the answer
 * comes back in the loop with the function's result and errno, and
 * freeing waits for a sync in progress. */
#include "ld_fsync.h"

#include "unit.h"

#include <check.h>
#include <errno.h>
#include <stdatomic.h>
#include <unistd.h>

#include <event2/event.h>

static atomic_int release_sync; /* the fake sync returns once set */
static atomic_int sync_calls;

static int
slow_sync(int fd)
{
    atomic_fetch_add(&sync_calls, 1);
    while (!atomic_load(&release_sync)) {
        usleep(1000);
    }
    errno = fd == 42 ? EIO : 0;
    return fd == 42 ? -1 : 0;
}

struct outcome {
    int calls, rc, err;
    struct event_base *base;
};

static void
on_done(int rc, int err, void *arg)
{
    struct outcome *o = arg;
    o->calls++;
    o->rc = rc;
    o->err = err;
    event_base_loopbreak(o->base);
}

static int ticks;

/* A timer of the loop: it keeps firing while the sync is held up, and
 * lets the sync finish after a few turns. */
static void
tick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    if (++ticks == 5) {
        atomic_store(&release_sync, 1);
    }
}

static void
run_one(int fd, struct outcome *o)
{
    struct event_base *base = event_base_new();
    struct ld_fsync *s = ld_fsync_new(base);
    ck_assert_ptr_nonnull(s);
    struct event *tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 2000};
    event_add(tick, &tv);
    *o = (struct outcome){0, 0, 0, base};
    ticks = 0;
    atomic_store(&release_sync, 0);
    ld_fsync_run(s, fd, slow_sync, on_done, o);
    ck_assert(ld_fsync_busy(s));
    event_base_dispatch(base);
    ck_assert(!ld_fsync_busy(s));
    ck_assert_int_ge(ticks, 5); /* the loop ran while the disk "worked" */
    event_free(tick);
    ld_fsync_free(s);
    event_base_free(base);
}

START_TEST(loop_serves_during_sync)
{
    struct outcome o;
    run_one(7, &o);
    ck_assert_int_eq(o.calls, 1);
    ck_assert_int_eq(o.rc, 0);
}
END_TEST

START_TEST(failure_and_errno_come_back)
{
    struct outcome o;
    run_one(42, &o);
    ck_assert_int_eq(o.calls, 1);
    ck_assert_int_eq(o.rc, -1);
    ck_assert_int_eq(o.err, EIO);
}
END_TEST

/* Freed while the sync runs: the free waits for it, and the callback is
 * not called afterwards. */
START_TEST(free_waits_for_running_sync)
{
    struct event_base *base = event_base_new();
    struct ld_fsync *s = ld_fsync_new(base);
    struct outcome o = {0, 0, 0, base};
    atomic_store(&release_sync, 0);
    atomic_store(&sync_calls, 0);
    ld_fsync_run(s, 7, slow_sync, on_done, &o);
    while (atomic_load(&sync_calls) == 0) {
        usleep(1000);
    }
    atomic_store(&release_sync, 1);
    ld_fsync_free(s);
    event_base_loop(base, EVLOOP_NONBLOCK);
    ck_assert_int_eq(o.calls, 0);
    event_base_free(base);
}
END_TEST

static Suite *
fsync_suite(void)
{
    Suite *s = suite_create("fsync");
    TCase *tc = tcase_create("fsync");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, loop_serves_during_sync);
    tcase_add_test(tc, failure_and_errno_come_back);
    tcase_add_test(tc, free_waits_for_running_sync);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(fsync_suite());
}
