/* Semaphores against real redis-server and real leased: sem.acquire,
 * sem.release, sem.info, waiting and its order, session-bound grants
 * (close, crash, watchdog), leases that run out, Redis down, foreign
 * data, and holders counted from outside across processes and two
 * daemons. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "order_util.h"
#include "sem_util.h"

#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* The lock.sem_layout of every daemon a case does not set it for
 * (check_sem_layout2 is built with 2). */
#ifdef H_SEM_LAYOUT
#define SEM_LAYOUT H_SEM_LAYOUT
#else
#define SEM_LAYOUT 1
#endif

static struct h_redis R;
static struct h_daemon D1, D2;
static const struct h_fixture fx = {
    .suite = "sem",
    .redis = {&R},
    .daemons = {&D1, &D2},
};

static void
start_two(const char *yaml_extra)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml_extra), 0);
    ck_assert_int_eq(h_daemon_start(&D2, &R, yaml_extra), 0);
}

/* --- the ops and their replies ------------------------------------------ */

START_TEST(test_acquire_release_info)
{
    struct h_conn *a, *b;
    json_t *r;
    char t1[65], t2[65];

    h_start("lock:\n  watchdog_ms: 3000\n");
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D1);

    r = s_acquire(a, "pool", 3, 0, 0, 0);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "first: %s", h_errcode(r));
    ck_assert_msg(h_is_token(jstr(r, "token")), "token %s", jstr(r, "token"));
    ck_assert_int_eq(jint(r, "permits"), 1);
    ck_assert_int_eq(jint(r, "available"), 2);
    ck_assert_int_eq(jint(r, "lease_ms"), 3000);
    snprintf(t1, sizeof t1, "%s", jstr(r, "token"));
    json_decref(r);

    r = s_acquire(b, "pool", 3, 2, 0, 0);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "second: %s", h_errcode(r));
    ck_assert_int_eq(jint(r, "permits"), 2);
    ck_assert_int_eq(jint(r, "available"), 0);
    ck_assert_str_ne(jstr(r, "token"), t1);
    snprintf(t2, sizeof t2, "%s", jstr(r, "token"));
    json_decref(r);

    /* Full: a try-once fails without an error. */
    r = s_acquire(a, "pool", 3, 0, 0, 0);
    ck_assert_msg(h_ok(r), "full: %s", h_errcode(r));
    ck_assert(!jtrue(r, "acquired"));
    ck_assert_int_eq(jint(r, "available"), 0);
    ck_assert_ptr_null(json_object_get(r, "token"));
    json_decref(r);
    ck_assert_int_eq(s_held(a, "pool", 3), 3);
    /* A caller claiming a bigger limit is honoured as given. */
    ck_assert_int_eq(s_held(a, "pool", 5), 3);

    /* The layout: one sorted set of grants, one hash of their permits;
     * under layout 2 a grant of one permit has no field there. */
    ck_assert_int_eq(h_r_int(&R, "ZCARD leased:lock:{pool}:sem"), 2);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{pool}:sem:permits %s", t2),
                     2);
    ck_assert_int_eq(h_r_int(&R, "HEXISTS leased:lock:{pool}:sem:permits %s",
                             t1),
                     SEM_LAYOUT == 1);

    /* Any session may release by token; all the token's permits go. */
    r = s_release(a, "pool", t2);
    ck_assert_msg(h_ok(r), "release: %s", h_errcode(r));
    ck_assert_int_eq(jint(r, "released"), 2);
    json_decref(r);
    ck_assert_int_eq(s_held(a, "pool", 3), 1);
    r = s_release(b, "pool", t2);
    h_expect_code(json_incref(r), "not_held", "second release");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    r = s_release(b, "pool", "00000000000000000000000000000000");
    h_expect_code(json_incref(r), "not_held", "unknown token");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    r = s_release(b, "pool", t1);
    ck_assert_int_eq(jint(r, "released"), 1);
    json_decref(r);
    /* A's grant was released by another session: A hears it. */
    r = h_event(a, T_MS);
    ck_assert_msg(r != NULL, "no sem_lost after a release by token");
    ck_assert_str_eq(jstr(r, "event"), "sem_lost");
    ck_assert_str_eq(jstr(r, "token"), t1);
    json_decref(r);
    ck_assert_int_eq(s_held(a, "pool", 3), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{pool}:sem"), 0);
    h_assert_stat(a, "sem_holds", 0, T_MS);

    h_close(a);
    h_close(b);
}
END_TEST

START_TEST(test_validation)
{
    struct h_conn *a;
    h_start(NULL);
    a = h_connect_ok(&D1);

    h_expect_code(s_acquire(a, "v", 2, 3, 0, 0), "bad_request",
                  "permits above limit");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s}", "op", "sem.acquire", "key",
                          "v"),
                  "bad_request", "no limit");
    h_expect_code(s_acquire(a, "v", 0, 0, 0, 0), "bad_request", "limit 0");
    h_expect_code(s_acquire(a, "v", 1000001, 0, 0, 0), "bad_request",
                  "limit too big");
    h_expect_code(s_acquire(a, "v", 2, -1, 0, 0), "bad_request", "permits -1");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:i,s:b}", "op", "sem.acquire",
                          "key", "v", "limit", 2, "detach", 1),
                  "bad_request", "detach without ttl_ms");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s}", "op", "sem.release", "key",
                          "v"),
                  "bad_request", "release without token");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s}", "op", "sem.info", "key", "v"),
                  "bad_request", "info without limit");
    h_assert_ping(a);
    h_close(a);
}
END_TEST

START_TEST(test_hello_features)
{
    struct h_conn *a;
    json_t *r, *f;
    bool sem = false, cancel = false;

    h_start(NULL);
    a = h_connect_ok(&D1);
    r = h_callf(a, T_MS, "{s:s}", "op", "hello");
    ck_assert(h_ok(r));
    f = json_object_get(r, "features");
    for (size_t i = 0; i < json_array_size(f); i++) {
        const char *n = json_string_value(json_array_get(f, i));
        sem = sem || (n != NULL && strcmp(n, "semaphore") == 0);
        cancel = cancel || (n != NULL && strcmp(n, "cancel") == 0);
    }
    ck_assert_msg(sem && cancel, "features lack semaphore or cancel");
    json_decref(r);
    h_close(a);
}
END_TEST

/* --- waiting -------------------------------------------------------------- */

START_TEST(test_wait_wake_fifo)
{
    struct h_conn *a, *b, *c;
    json_t *r;
    char t[65];
    long long t0;

    start_two(NULL);
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D2);
    c = h_connect_ok(&D2);

    s_must(a, "w", 1, 0, 0, t);
    /* B then C wait in the same daemon: B is served first. */
    s_send_id(b, 1, s_req("w", 1, 0, 20000, 0));
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    s_send_id(c, 2, s_req("w", 1, 0, 20000, 0));
    h_assert_stat(b, "lock_waiters", 2, T_MS);

    t0 = h_now_ms();
    r = s_release(a, "w", t);
    ck_assert_int_eq(jint(r, "released"), 1);
    json_decref(r);
    r = h_recv_id(b, 1, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "B not granted first");
    ck_assert_msg(h_now_ms() - t0 < 1000, "took %lld ms", h_now_ms() - t0);
    snprintf(t, sizeof t, "%s", jstr(r, "token"));
    json_decref(r);
    ck_assert_ptr_null(h_recv_id(c, 2, 300));

    r = s_release(b, "w", t);
    json_decref(r);
    r = h_recv_id(c, 2, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "C not granted");
    json_decref(r);

    /* A wait that runs out answers like a failed try. */
    t0 = h_now_ms();
    r = s_acquire(a, "w", 1, 0, 300, 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "timed wait");
    ck_assert_int_eq(jint(r, "available"), 0);
    ck_assert_int_ge(h_now_ms() - t0, 280);
    json_decref(r);
    h_assert_stat(a, "lock_waiters", 0, T_MS);

    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

/* A request for several permits counts all of them against the limit:
 * with 2 of 3 held, 2 more do not fit, try-once or waiting, until the
 * holder lets go; and the grant holds both. */
START_TEST(test_multi_permit_limit)
{
    struct h_conn *a, *b;
    json_t *r;
    char t[65];

    h_start(NULL);
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D1);

    s_must(a, "mp", 3, 2, 0, t);
    r = s_acquire(b, "mp", 3, 2, 0, 0);
    ck_assert_msg(h_ok(r), "try 2 of 3: %s", h_errcode(r));
    ck_assert_msg(!jtrue(r, "acquired"), "2 permits granted with 2 of 3 held");
    ck_assert_int_eq(jint(r, "available"), 1);
    json_decref(r);
    ck_assert_int_eq(s_held(b, "mp", 3), 2);

    s_send_id(b, 5, s_req("mp", 3, 2, 20000, 0));
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    ck_assert_int_eq(s_held(b, "mp", 3), 2);
    r = s_release(a, "mp", t);
    ck_assert_int_eq(jint(r, "released"), 2);
    json_decref(r);
    r = h_recv_id(b, 5, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "2 permits not granted");
    ck_assert_int_eq(jint(r, "permits"), 2);
    ck_assert_int_eq(jint(r, "available"), 1);
    json_decref(r);
    ck_assert_int_eq(s_held(a, "mp", 3), 2);
    /* The one left fits one permit, not two. */
    r = s_acquire(a, "mp", 3, 2, 0, 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "2 of 1 left granted");
    json_decref(r);
    s_must(a, "mp", 3, 1, 0, t);
    ck_assert_int_eq(s_held(a, "mp", 3), 3);

    h_close(a);
    h_close(b);
}
END_TEST

/* --- leases: session end, crash, watchdog, expiry ------------------------ */

/* Acquire one permit of "crash", tell the parent through FD, hang. */
static void
holder_child(const struct h_daemon *d, int fd)
{
    struct h_conn *c = h_connect(d);
    char ok = 'n';
    if (c != NULL) {
        json_t *r = h_call(c, s_req("crash", 1, 0, 0, 0), 10000);
        ok = (r != NULL && jtrue(r, "acquired")) ? 'y' : 'n';
        json_decref(r);
    }
    if (write(fd, &ok, 1) != 1) {
        _exit(21);
    }
    for (;;) {
        pause();
    }
}

START_TEST(test_session_end_and_crash)
{
    struct h_conn *a, *b;
    json_t *r;
    char t[65];
    long long t0;
    int fds[2];
    char ok = 0;

    start_two(NULL); /* leases of 30 s: only a release frees early */
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D2);

    s_must(a, "sc", 1, 0, 0, t);
    s_send_id(b, 1, s_req("sc", 1, 0, 20000, 0));
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    t0 = h_now_ms();
    h_close(a);
    r = h_recv_id(b, 1, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "not granted after the holder's session closed");
    ck_assert_msg(h_now_ms() - t0 < 1000, "took %lld ms", h_now_ms() - t0);
    snprintf(t, sizeof t, "%s", jstr(r, "token"));
    json_decref(r);
    json_decref(s_release(b, "sc", t));

    /* A client process killed while holding a permit. */
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        holder_child(&D1, fds[1]);
    }
    h_track_pid(pid);
    ck_assert_int_eq(read(fds[0], &ok, 1), 1);
    ck_assert_msg(ok == 'y', "the child got no permit");
    s_send_id(b, 2, s_req("crash", 1, 0, 20000, 0));
    h_assert_stat(b, "lock_waiters", 1, T_MS);
    t0 = h_now_ms();
    kill(pid, SIGKILL);
    r = h_recv_id(b, 2, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "not granted after the holder was killed");
    ck_assert_msg(h_now_ms() - t0 < 2000, "took %lld ms", h_now_ms() - t0);
    json_decref(r);
    waitpid(pid, NULL, 0);
    h_untrack_pid(pid);
    close(fds[0]);
    close(fds[1]);
    h_close(b);
}
END_TEST

START_TEST(test_watchdog_and_expiry)
{
    struct h_conn *a, *b;
    json_t *r;
    char t[65];
    long long t0;

    h_start("lock:\n  watchdog_ms: 600\n");
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D1);

    /* Session-bound without ttl_ms: renewed well past its lease. */
    s_must(a, "wd", 1, 0, 0, t);
    usleep(2000 * 1000);
    ck_assert_int_eq(s_held(b, "wd", 1), 1);
    r = s_acquire(b, "wd", 1, 0, 0, 0);
    ck_assert(!jtrue(r, "acquired"));
    json_decref(r);
    r = s_release(a, "wd", t);
    ck_assert_int_eq(jint(r, "released"), 1);
    json_decref(r);

    /* A fixed lease is not renewed: its permit comes back when it ends,
     * and a waiter is woken then without any release. */
    r = s_acquire(a, "ex", 1, 0, 0, 400);
    ck_assert(jtrue(r, "acquired"));
    ck_assert_int_eq(jint(r, "lease_ms"), 400);
    json_decref(r);
    t0 = h_now_ms();
    r = s_acquire(b, "ex", 1, 0, 5000, 0);
    ck_assert_msg(jtrue(r, "acquired"), "not granted at lease end");
    ck_assert_int_ge(h_now_ms() - t0, 300);
    ck_assert_int_lt(h_now_ms() - t0, 2000);
    json_decref(r);

    /* A detached grant outlives its session until its lease ends; the
     * acquire script reclaims it. */
    json_decref(h_callf(b, T_MS, "{s:s}", "op", "ping"));
    r = h_callf(a, T_MS, "{s:s,s:s,s:i,s:i,s:b}", "op", "sem.acquire", "key",
                "dt", "limit", 1, "ttl_ms", 500, "detach", 1);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    h_close(a);
    /* Once the daemon has seen the close, the detached permit stays. */
    ck_assert_msg(h_wait_stat(b, "sessions", 1, T_MS), "close not seen");
    ck_assert_int_eq(s_held(b, "dt", 1), 1);
    s_wait_held(b, "dt", 1, 0, 3000);
    r = s_acquire(b, "dt", 1, 0, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    h_close(b);
}
END_TEST

/* sem.info counts only grants whose lease has not ended: a fixed lease
 * that ran out beside a longer one holds nothing, although the keys live
 * on for the longer one and no acquire has reclaimed it yet. */
START_TEST(test_expired_not_held)
{
    struct h_conn *a;
    json_t *r;

    h_start(NULL);
    a = h_connect_ok(&D1);
    r = s_acquire(a, "ei", 3, 0, 0, 300);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "short: %s", h_errcode(r));
    json_decref(r);
    r = s_acquire(a, "ei", 3, 0, 0, 60000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "long: %s", h_errcode(r));
    json_decref(r);
    s_wait_held(a, "ei", 3, 1, 5000);
    ck_assert_int_eq(h_r_int(&R, "ZCARD leased:lock:{ei}:sem"), 2);
    r = s_acquire(a, "ei", 3, 2, 0, 0);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "2 of 2 free not granted");
    json_decref(r);
    h_close(a);
}
END_TEST

/* A waiter that needs more permits than one lease gives back is tried
 * again when the earliest lease ends, not the longest, and gets them then
 * without any release; the grant reclaims the dead one, and the keys live
 * as long as the longest lease, not the new one. */
START_TEST(test_waiter_at_first_lease_end)
{
    struct h_conn *a, *b, *c;
    char t[65];

    h_start(NULL);
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D1);
    c = h_connect_ok(&D1);
    s_must(c, "fl", 4, 1, 60000, t);
    s_must(a, "fl", 4, 2, 400, t);
    long long t0 = h_now_ms();
    json_t *r = s_acquire(b, "fl", 4, 2, 5000, 0);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"),
                  "not granted at the first lease end: %s", h_dump(r));
    ck_assert_int_ge(h_now_ms() - t0, 300);
    ck_assert_int_lt(h_now_ms() - t0, 2500);
    ck_assert_int_eq(jint(r, "available"), 1);
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "ZCARD leased:lock:{fl}:sem"), 2);
    ck_assert_int_eq(h_r_int(&R, "HLEN leased:lock:{fl}:sem:permits"),
                     SEM_LAYOUT == 1 ? 2 : 1);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{fl}:sem"), 50000);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{fl}:sem:permits"), 50000);
    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

START_TEST(test_grant_lost_and_shutdown)
{
    struct h_conn *a;
    char t[65];

    h_start("lock:\n  watchdog_ms: 600\n");
    a = h_connect_ok(&D1);
    /* Redis loses the grant: the next renewal finds it gone and drops
     * it; a release then says absent. */
    s_must(a, "lost", 2, 0, 0, t);
    h_assert_stat(a, "sem_holds", 1, T_MS);
    h_r_do(&R, "DEL leased:lock:{lost}:sem leased:lock:{lost}:sem:permits");
    json_t *ev = h_event(a, T_MS);
    ck_assert_msg(ev != NULL, "no sem_lost event");
    ck_assert_str_eq(jstr(ev, "event"), "sem_lost");
    ck_assert_str_eq(jstr(ev, "key"), "lost");
    ck_assert_str_eq(jstr(ev, "token"), t);
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    json_decref(ev);
    h_assert_stat(a, "sem_holds", 0, T_MS);
    ck_assert(h_wait_log(&D1, "found gone on renewal", T_MS));
    json_t *r = s_release(a, "lost", t);
    h_expect_code(r, "not_held", "release of a lost grant");

    /* A graceful stop gives session-bound grants back at once, long
     * before a lease would end; a detached one stays. */
    s_must(a, "stop", 3, 0, 0, t);
    s_must(a, "stop", 3, 0, 60000, t);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i,s:i,s:b}", "op", "sem.acquire", "key",
                "stop", "limit", 3, "ttl_ms", 60000, "detach", 1);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "ZCARD leased:lock:{stop}:sem"), 3);
    ck_assert_int_eq(h_daemon_stop(&D1), 0);
    ck_assert_int_eq(h_r_int(&R, "ZCARD leased:lock:{stop}:sem"), 1);
    h_close(a);
}
END_TEST

/* --- failures ------------------------------------------------------------ */

/* Redis away for longer than a watchdog lease: the holder hears it
 * before the lease could end in Redis (a margin before it). */
START_TEST(test_lost_when_redis_down)
{
    struct h_conn *a;
    json_t *r;
    char yaml[160], t[65];
    long long t0;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n"
             "lock:\n  watchdog_ms: 900\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    a = h_connect_ok(&D1);
    s_must(a, "rd", 2, 0, 0, t);
    /* A fixed lease is simply forgotten when it ends: no event. */
    r = s_acquire(a, "rdf", 2, 0, 0, 300);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    h_assert_stat(a, "sem_holds", 2, T_MS);
    h_assert_stat(a, "sem_holds", 1, T_MS);

    t0 = h_now_ms();
    h_redis_kill(&R);
    r = h_event(a, 5000);
    /* A renewal that failed while the lease ran said so first. */
    if (r != NULL && strcmp(jstr(r, "event"), "sem_at_risk") == 0) {
        ck_assert_str_eq(jstr(r, "token"), t);
        json_decref(r);
        r = h_event(a, 5000);
    }
    ck_assert_msg(r != NULL, "no sem_lost event with Redis down");
    ck_assert_str_eq(jstr(r, "event"), "sem_lost");
    ck_assert_str_eq(jstr(r, "token"), t);
    ck_assert_str_eq(jstr(r, "reason"), "redis_unavailable");
    ck_assert_int_lt(h_now_ms() - t0, 900);
    json_decref(r);
    h_assert_stat(a, "sem_holds", 0, T_MS);
    h_close(a);
}
END_TEST

START_TEST(test_redis_down_and_wrong_type)
{
    struct h_conn *a;
    json_t *r;

    char yaml[128];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 300\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    a = h_connect_ok(&D1);

    h_r_do(&R, "SET leased:lock:{wt}:sem x");
    r = s_acquire(a, "wt", 2, 0, 0, 0);
    h_expect_code(r, "wrong_type", "string under the sem key");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "sem.info", "key",
                          "wt", "limit", 2),
                  "wrong_type", "info on a string");
    ck_assert_int_eq(h_r_int(&R, "STRLEN leased:lock:{wt}:sem"), 1);

    h_redis_kill(&R);
    h_expect_code(s_acquire(a, "down", 2, 0, 0, 0), "redis_unavailable",
                  "acquire with Redis down");
    h_expect_code(s_acquire(a, "down", 2, 0, 1000, 0), "redis_unavailable",
                  "waiting acquire with Redis down");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "sem.info", "key",
                          "down", "limit", 2),
                  "redis_unavailable", "info with Redis down");
    ck_assert_int_eq(h_redis_restart(&R), 0);
    h_assert_ping(a);
    /* Back: the daemon serves semaphores again. */
    long long deadline = h_now_ms() + 10000;
    bool got = false;
    while (!got && h_now_ms() < deadline) {
        r = s_acquire(a, "down", 2, 0, 0, 0);
        got = h_ok(r) && jtrue(r, "acquired");
        json_decref(r);
        if (!got) {
            usleep(50 * 1000);
        }
    }
    ck_assert_msg(got, "no permit after Redis came back");
    h_close(a);
}
END_TEST

/* --- holders counted from outside ---------------------------------------- */

#define C_LIMIT 3
#define C_PROCS 8
#define C_ITERS 40

/* Acquire (waiting without limit), count this holder in Redis, hold a
 * moment, uncount, release; a count above the limit is a violation. */
static int
contender(const struct h_daemon *d)
{
    struct h_conn *c = h_connect(d);
    /* The counters share a hash tag: one connection serves them on a
     * cluster too. */
    redisContext *rc = h_redis_connect_for(&R, "{c}holders");
    if (c == NULL || rc == NULL || rc->err) {
        return 10;
    }
    for (int i = 0; i < C_ITERS; i++) {
        json_t *r = h_call(c, s_req("crowd", C_LIMIT, 1, -1, 0), 60000);
        if (r == NULL || !jtrue(r, "acquired")) {
            return 11;
        }
        char tok[65];
        snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
        json_decref(r);
        redisReply *in = redisCommand(rc, "INCR {c}holders");
        if (in == NULL || in->type != REDIS_REPLY_INTEGER) {
            return 12;
        }
        if (in->integer > C_LIMIT) {
            freeReplyObject(redisCommand(rc, "INCR {c}violations"));
        }
        if (in->integer > 1) {
            freeReplyObject(redisCommand(rc, "INCR {c}overlaps"));
        }
        freeReplyObject(in);
        usleep(1000);
        freeReplyObject(redisCommand(rc, "DECR {c}holders"));
        r = h_call(c,
                   json_pack("{s:s,s:s,s:s}", "op", "sem.release", "key",
                             "crowd", "token", tok),
                   10000);
        if (r == NULL || jint(r, "released") != 1) {
            return 13;
        }
        json_decref(r);
    }
    redisFree(rc);
    h_close(c);
    return 0;
}

START_TEST(test_contention_two_daemons)
{
    pid_t pids[C_PROCS];
    struct h_conn *a;

    start_two(NULL);
    for (int i = 0; i < C_PROCS; i++) {
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(contender(i % 2 ? &D2 : &D1));
        }
        h_track_pid(pids[i]);
    }
    for (int i = 0; i < C_PROCS; i++) {
        int st = -1;
        long long deadline = h_now_ms() + 150000;
        while (h_now_ms() < deadline) {
            if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                break;
            }
            usleep(20000);
        }
        h_untrack_pid(pids[i]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "contender %d ended with %d", i, st);
    }
    ck_assert_int_eq(h_r_int(&R, "GET {c}violations"), -999); /* never set */
    ck_assert_msg(h_r_int(&R, "GET {c}overlaps") > 0,
                  "no two holders ever overlapped: the test proved nothing");
    ck_assert_int_eq(h_r_int(&R, "GET {c}holders"), 0);
    a = h_connect_ok(&D1);
    ck_assert_int_eq(s_held(a, "crowd", C_LIMIT), 0);
    h_close(a);
}
END_TEST

/* --- grants Redis lost ------------------------------------------------- */

/* The next sem_lost for KEY on C within TIMEOUT_MS (other events are
 * dropped), or NULL. */
static json_t *
sem_lost(struct h_conn *c, const char *key, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    for (;;) {
        long long left = deadline - h_now_ms();
        json_t *ev = left > 0 ? h_event(c, (int)left) : NULL;
        if (ev == NULL || raw_is_event(ev, "sem_lost", key)) {
            return ev;
        }
        json_decref(ev);
    }
}

/* A holds the only permit of S (watchdog) and of T (fixed lease); Redis
 * loses them (FLUSHALL) and B acquires each through the same daemon:
 * A hears sem_lost before B's grant reaches B. No pass runs meanwhile
 * (watchdog_ms 60 s). */
START_TEST(test_lost_before_local_grant)
{
    struct raw a, b;
    struct race rc;

    h_start("lock:\n  watchdog_ms: 60000\n");
    raw_open(&a, D1.sock);
    raw_open(&b, D1.sock);
    raw_must(&a, "{\"id\":1,\"op\":\"sem.acquire\",\"key\":\"S\","
                 "\"limit\":1}\n");
    h_r_do(&R, "FLUSHALL");

    raw_race(&a, &b,
             "{\"id\":3,\"op\":\"sem.acquire\",\"key\":\"S\",\"limit\":1}\n",
             "sem_lost", "S", 3000, &rc);
    raw_race_assert(&rc, "watchdog grant of S");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "expired");
    raw_race_free(&rc);

    /* (The loss of S started a check of every grant: T comes after.) */
    raw_must(&a, "{\"id\":2,\"op\":\"sem.acquire\",\"key\":\"T\","
                 "\"limit\":1,\"ttl_ms\":60000}\n");
    h_r_do(&R, "FLUSHALL");
    raw_race(&a, &b,
             "{\"id\":4,\"op\":\"sem.acquire\",\"key\":\"T\",\"limit\":1,"
             "\"ttl_ms\":60000}\n",
             "sem_lost", "T", 3000, &rc);
    raw_race_assert(&rc, "fixed-lease grant of T");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "expired");
    raw_race_free(&rc);
    close(a.fd);
    close(b.fd);
}
END_TEST

/* Wait up to WITHIN_MS for sem_lost of both S (token TS) and T (token TT)
 * on A, reason "expired": one recheck finds both gone, and their checks
 * may travel on different connections, so they come in either order.
 * Other events (sem_at_risk) are passed over. */
static void
expect_both_lost(struct h_conn *a, const char *ts, const char *tt,
                 int within_ms, const char *after)
{
    bool seen_s = false, seen_t = false;
    long long deadline = h_now_ms() + within_ms;
    while (!(seen_s && seen_t) && h_now_ms() < deadline) {
        json_t *ev = h_event(a, (int)(deadline - h_now_ms()));
        if (ev == NULL) {
            break;
        }
        bool is_s = raw_is_event(ev, "sem_lost", "S");
        if (is_s || raw_is_event(ev, "sem_lost", "T")) {
            ck_assert_str_eq(jstr(ev, "token"), is_s ? ts : tt);
            ck_assert_str_eq(jstr(ev, "reason"), "expired");
            seen_s = seen_s || is_s;
            seen_t = seen_t || !is_s;
        }
        json_decref(ev);
    }
    ck_assert_msg(seen_s, "no sem_lost for S within %d ms of %s", within_ms,
                  after);
    ck_assert_msg(seen_t, "no sem_lost for T within %d ms of %s", within_ms,
                  after);
}

/* Redis restarts without its data: when the daemon reconnects it checks
 * every grant at once (the pass would take 20 s here, and a fixed lease
 * was never checked before it ended). */
START_TEST(test_recheck_on_restart)
{
    struct h_conn *a;
    char s[65], t[65];
    long long t0;

    /* A check that Redis, just restarted, did not answer is tried again
     * soon, or at the latest at the next pass (a third of watchdog_ms):
     * the bound below allows one. */
    h_start("lock:\n  watchdog_ms: 15000\n");
    a = h_connect_ok(&D1);
    s_must(a, "S", 1, 0, 0, s);
    s_must(a, "T", 1, 0, 60000, t);
    h_redis_kill(&R);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    t0 = h_now_ms();
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{S}:sem"), 0);

    /* The reconnection (backoff included) and one round trip, or a pass. */
    expect_both_lost(a, s, t, 5000 + 8000, "the restart");
    ck_assert_msg(h_now_ms() - t0 < 5000 + 8000,
                  "sem_lost %lld ms after Redis "
                  "was back",
                  h_now_ms() - t0);
    h_assert_stat(a, "sem_holds", 0, T_MS);
    h_close(a);
}
END_TEST

/* As test_recheck_on_restart with the pass far off (20 s): both grants
 * are reported within the budget a lock gets (check_lock_safety's
 * recheck_on_reconnect). */
START_TEST(test_recheck_prompt)
{
    struct h_conn *a;
    char s[65], t[65];

    h_start("lock:\n  watchdog_ms: 60000\n");
    a = h_connect_ok(&D1);
    s_must(a, "S", 1, 0, 0, s);
    s_must(a, "T", 1, 0, 600000, t);
    h_redis_kill(&R);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{S}:sem"), 0);
    expect_both_lost(a, s, t, 15000, "the restart");
    h_close(a);
}
END_TEST

/* A check of a recheck that Redis refuses while the connection stays up
 * (just back, Redis may still be loading its data, or a connection of
 * the pool is not up yet) is tried again within a second
 * (ld_lease_pass_retry), not at the next pass, 40 s after the daemon
 * started here. Redis lost the grants (FLUSHALL), the daemon's
 * connections are dropped so that it rechecks when they are back, and
 * scripts are refused (ACL) until the recheck's check of S was: S's
 * sem_at_risk says it was. */
START_TEST(test_recheck_retried)
{
    struct h_conn *a;
    char s[65], t[65];
    long long t_start = h_now_ms();

    h_start("lock:\n  watchdog_ms: 120000\n");
    a = h_connect_ok(&D1);
    s_must(a, "S", 1, 0, 0, s);
    s_must(a, "T", 1, 0, 600000, t);
    recheck_refused(&R, a, "sem_at_risk", "sem_lost", "S");
    long long t0 = h_now_ms();
    expect_both_lost(a, s, t, 5000, "scripts allowed again");
    fprintf(stderr,
            "recheck_retried: sem_lost %lld ms after scripts allowed\n",
            h_now_ms() - t0);
    /* The pass (40 s after the start) could not have found them. */
    ck_assert_msg(h_now_ms() - t_start < 40000,
                  "too slow to tell the retry from the pass: %lld ms",
                  h_now_ms() - t_start);
    h_assert_stat(a, "sem_holds", 0, T_MS);
    h_close(a);
}
END_TEST

/* A fixed lease Redis loses early is found on the next pass (a third of
 * watchdog_ms) without anyone else touching the semaphore. */
START_TEST(test_fixed_lease_checked)
{
    struct h_conn *a;
    json_t *ev;
    char t[65];
    long long t0, dt;

    h_start("lock:\n  watchdog_ms: 1500\n");
    a = h_connect_ok(&D1);
    s_must(a, "T", 1, 0, 60000, t);
    h_r_do(&R, "FLUSHALL");
    t0 = h_now_ms();
    ev = sem_lost(a, "T", 5000);
    dt = h_now_ms() - t0;
    ck_assert_msg(ev != NULL, "no sem_lost for a fixed lease Redis lost");
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    json_decref(ev);
    ck_assert_msg(dt < 2000, "sem_lost %lld ms after the loss", dt);
    h_close(a);
}
END_TEST

/* Redis stops answering while a watchdog grant is held: the holder hears
 * sem_lost before the lease Redis granted can run out, that is before
 * another client could be granted its permits (as lock_lost for a lock,
 * check_lock_safety's lost_before_lease_end). */
START_TEST(test_lost_before_lease_end)
{
    struct h_conn *a;
    json_t *ev;
    char t[65];
    long long t_before, pttl, t_ev;

    h_start("lock:\n  watchdog_ms: 10000\n");
    a = h_connect_ok(&D1);
    s_must(a, "w", 1, 0, 0, t);

    /* Redis keeps the grant at least until t_before + pttl (the keys
     * live as long as the last lease in them, here the only one). */
    t_before = h_now_ms();
    pttl = h_r_int(&R, "PTTL leased:lock:{w}:sem");
    ck_assert_msg(pttl > 5000, "PTTL %lld", pttl);
    h_redis_signal(&R, SIGSTOP);

    ev = sem_lost(a, "w", 30000);
    t_ev = h_now_ms();
    h_redis_signal(&R, SIGCONT);
    ck_assert_msg(ev != NULL, "no sem_lost while redis was stopped");
    ck_assert_str_eq(jstr(ev, "token"), t);
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    ck_assert_msg(t_ev < t_before + pttl,
                  "sem_lost %lld ms after the lease could end in redis",
                  t_ev - (t_before + pttl));
    h_assert_stat(a, "sem_holds", 0, T_MS);
    h_close(a);
}
END_TEST

/* A grant found gone before its lease could end means Redis lost data:
 * every other grant is checked at once, not at the next pass (30 s
 * here), as for locks (check_lock_safety's early_loss_rechecks_all). The
 * loss of S is found by the check a new grant of S through the same
 * daemon starts; F, a fixed lease of another semaphore, must follow. */
START_TEST(test_early_loss_rechecks_all)
{
    struct h_conn *a, *b;
    json_t *ev, *r;
    char s[65], f[65];
    long long t0;

    h_start("lock:\n  watchdog_ms: 90000\n");
    a = h_connect_ok(&D1);
    b = h_connect_ok(&D1);
    s_must(a, "F", 1, 0, 600000, f);
    s_must(a, "S", 1, 0, 0, s);
    h_r_do(&R, "FLUSHALL");
    t0 = h_now_ms();
    r = s_acquire(b, "S", 1, 0, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    ev = sem_lost(a, "F", 10000);
    ck_assert_msg(ev != NULL, "no sem_lost for F after the loss found on S");
    ck_assert_str_eq(jstr(ev, "token"), f);
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    json_decref(ev);
    ck_assert_msg(h_now_ms() - t0 < 5000,
                  "sem_lost for F %lld ms after the loss", h_now_ms() - t0);
    h_assert_stat(a, "sem_holds", 1, T_MS);
    h_close(a);
    h_close(b);
}
END_TEST

/* Calls of Redis command CMD (lower case) since the last CONFIG RESETSTAT,
 * scripts' inner calls included. */
/* --- both layouts on one semaphore ------------------------------------- */

/* The sole grant of KEY has left the zset (its lease ended and an
 * acquire took it back). */
static bool
zset_empty(void *arg)
{
    return h_r_int(&R, "ZCARD leased:lock:{%s}:sem", (const char *)arg) == 0;
}

/* A fleet between its two restarts (lock.sem_layout): D1 writes a field
 * for every grant, D2 none for a grant of one permit. Each counts the
 * other's grants, releases them by token and takes them back when their
 * lease ends; a grant without a field holds one permit, never none (the
 * counting an older daemon does, and why layout 2 waits for the fleet). */
START_TEST(test_layouts_mixed)
{
    char t1[65], t2[65], t3[65], t4[65];

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D1, &R, "lock:\n  sem_layout: 1\n"), 0);
    ck_assert_int_eq(h_daemon_start(&D2, &R, "lock:\n  sem_layout: 2\n"), 0);
    struct h_conn *a = h_connect_ok(&D1);
    struct h_conn *b = h_connect_ok(&D2);

    s_must(b, "mix", 4, 1, 0, t1);
    s_must(a, "mix", 4, 1, 0, t2);
    s_must(b, "mix", 4, 2, 0, t3);
    ck_assert_int_eq(h_r_int(&R, "HEXISTS leased:lock:{mix}:sem:permits %s",
                             t1),
                     0);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{mix}:sem:permits %s", t2),
                     1);
    ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{mix}:sem:permits %s", t3),
                     2);
    ck_assert_int_eq(s_held(a, "mix", 4), 4);
    ck_assert_int_eq(s_held(b, "mix", 4), 4);
    json_t *r = s_acquire(a, "mix", 4, 1, 0, 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "over the limit: %s",
                  h_dump(r));
    json_decref(r);

    /* D1 releases D2's grant without a field, D2 D1's with one. */
    r = s_release(a, "mix", t1);
    ck_assert_msg(h_ok(r) && jint(r, "released") == 1, "t1: %s", h_dump(r));
    json_decref(r);
    r = s_release(a, "mix", t1);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    r = s_release(b, "mix", t2);
    ck_assert_msg(h_ok(r) && jint(r, "released") == 1, "t2: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(s_held(a, "mix", 4), 2);
    r = s_release(b, "mix", t3);
    ck_assert_msg(h_ok(r) && jint(r, "released") == 2, "t3: %s", h_dump(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{mix}:sem:permits"), 0);

    /* A grant without a field whose lease ended counts nothing: D1 takes
     * the whole semaphore once D2's grant of one permit is taken back. */
    s_must(b, "gone", 2, 1, 300, t4);
    r = s_acquire(a, "gone", 2, 2, 5000, 0);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "after the lease: %s",
                  h_dump(r));
    json_decref(r);
    r = s_release(b, "gone", t4);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);

    /* A grant of one permit of D2 excludes D1, and goes back when its
     * session ends (released with the zset alone). */
    s_must(b, "kept", 1, 1, 0, t4);
    ck_assert_int_eq(h_r_int(&R, "HLEN leased:lock:{kept}:sem:permits"), 0);
    r = s_acquire(a, "kept", 1, 1, 0, 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "kept: %s", h_dump(r));
    json_decref(r);
    h_close(b); /* its session ends: the grant goes back at once */
    ck_assert(h_wait_until(zset_empty, (void *)"kept", T_MS));
    h_close(a);
}
END_TEST

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

static bool
due_set_looked_at(void *arg)
{
    (void)arg;
    return cmd_calls("evalsha") >= 1;
}

/* Redis' command counts reset, then ten pairs of a grant of one permit of
 * "cost" (of LIMIT) on A and its release. */
static void
ten_pairs(struct h_conn *a, long long limit)
{
    char tok[65];
    freeReplyObject(h_redis_cmd(&R, "CONFIG RESETSTAT"));
    for (int i = 0; i < 10; i++) {
        s_must(a, "cost", limit, 1, 0, tok);
        json_t *r = s_release(a, "cost", tok);
        ck_assert_msg(h_ok(r) && jint(r, "released") == 1, "release: %s",
                      h_errcode(r));
        json_decref(r);
    }
}

/* An acquire of an empty semaphore counts its grants once (one ZCARD)
 * and neither script asks for types: ZCARD, ZSCORE and HGET refuse
 * another type themselves. */
START_TEST(test_pair_cost)
{
    struct h_conn *a;
    char tok[65];

    h_start(NULL);
    /* After the daemon's own look at the due set (ld_cache_due.c), whose
     * script's ZRANGEBYSCORE would count: on a cluster it can come after
     * the reset. */
    ck_assert(h_wait_until(due_set_looked_at, NULL, T_MS));
    a = h_connect_ok(&D1);
    ten_pairs(a, 3);
    ck_assert_int_eq(cmd_calls("zcard"), 10);
    ck_assert_int_eq(cmd_calls("zrange") + cmd_calls("zrangebyscore"), 0);
    ck_assert_int_le(cmd_calls("type"), 10);
    /* Under layout 2 a grant of one permit leaves the hash alone. */
    ck_assert_int_eq(cmd_calls("hset"), SEM_LAYOUT == 1 ? 10 : 0);
    ck_assert_int_eq(cmd_calls("hget") + cmd_calls("hdel"),
                     SEM_LAYOUT == 1 ? 20 : 0);
    /* The wake-up: PUBLISH, or SPUBLISH on a cluster (sharded). */
    ck_assert_int_eq(cmd_calls("publish") + cmd_calls("spublish"), 10);

    /* Beside grants of one permit held by others: under layout 2 the
     * hash is absent, so an acquire neither reads the grants' names nor
     * matches them with fields (its work does not grow with them). */
    struct h_conn *b = h_connect_ok(&D1);
    for (int i = 0; i < 3; i++) {
        s_must(b, "cost", 10, 1, 0, tok);
    }
    ten_pairs(a, 10);
    ck_assert_int_eq(cmd_calls("hmget"), SEM_LAYOUT == 1 ? 10 : 0);
    ck_assert_int_eq(cmd_calls("zrangebyscore"), SEM_LAYOUT == 1 ? 10 : 0);
    ck_assert_int_eq(cmd_calls("zremrangebyscore"), SEM_LAYOUT == 1 ? 0 : 10);
    h_close(b);
    h_close(a);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(acquire_release_info, 60),
        H_CASE(validation, 60),
        H_CASE(hello_features, 60),
        H_CASE(wait_wake_fifo, 60),
        H_CASE(multi_permit_limit, 60),
        H_CASE(session_end_and_crash, 60),
        H_CASE(watchdog_and_expiry, 60),
        H_CASE(grant_lost_and_shutdown, 60),
        H_CASE(expired_not_held, 60),
        H_CASE(waiter_at_first_lease_end, 60),
        H_CASE(redis_down_and_wrong_type, 60),
        H_CASE(lost_when_redis_down, 60),
        H_CASE(lost_before_local_grant, 60),
        H_CASE(recheck_on_restart, 90),
        H_CASE(recheck_prompt, 90),
        H_CASE(recheck_retried, 60),
        H_CASE(fixed_lease_checked, 60),
        H_CASE(lost_before_lease_end, 90),
        H_CASE(early_loss_rechecks_all, 60),
        H_CASE(contention_two_daemons, 200),
        H_CASE(layouts_mixed, 60),
        H_CASE(pair_cost, 60),
    };
    return H_MAIN(fx, cases);
}
