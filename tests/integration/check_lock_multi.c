/* Locks across daemons and processes: two leased on one Redis, client
 * processes that crash or race, and the cost of many waiters. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"

#include <errno.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D1, D2;
static const struct h_fixture fx = {
    .suite = "lock_multi",
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

static void
wait_waiters(struct h_conn *c, long long n)
{
    h_assert_stat(c, "lock_waiters", n, 5000);
}

/* --- client processes -------------------------------------------------- */

typedef int child_fn(const struct h_daemon *d, int arg);

/* Fork a client process that runs FN and exits with its result. It dies
 * with the test process. */
static pid_t
spawn_child(child_fn *fn, const struct h_daemon *d, int arg)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(fn(d, arg));
    }
    h_track_pid(pid);
    return pid;
}

/* Wait (bounded) for PID; its exit status, or -1. */
static int
reap_child(pid_t pid, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    int status;
    while (h_now_ms() < deadline) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) {
            h_untrack_pid(pid);
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        usleep(10000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    h_untrack_pid(pid);
    return -1;
}

static json_t *
child_call(struct h_conn *c, json_t *req)
{
    return h_call(c, req, 60000);
}

static bool
child_lock(struct h_conn *c, const char *key)
{
    json_t *r = child_call(c, lk_req(key, NULL, 0, -1));
    bool ok = r != NULL && h_ok(r) && jtrue(r, "acquired");
    json_decref(r);
    return ok;
}

static bool
child_unlock(struct h_conn *c, const char *key)
{
    json_t *r = child_call(c,
                           json_pack("{s:s,s:s}", "op", "unlock", "key", key));
    bool ok = r != NULL && h_ok(r) && jtrue(r, "released");
    json_decref(r);
    return ok;
}

static long long
child_get(redisContext *rc, const char *key)
{
    redisReply *g = redisCommand(rc, "GET %s", key);
    long long v = -1000000;
    if (g != NULL && g->type == REDIS_REPLY_STRING) {
        v = atoll(g->str);
    }
    if (g != NULL) {
        freeReplyObject(g);
    }
    return v;
}

static bool
child_set(redisContext *rc, const char *key, long long v)
{
    redisReply *s = redisCommand(rc, "SET %s %lld", key, v);
    bool ok = s != NULL && s->type == REDIS_REPLY_STATUS;
    if (s != NULL) {
        freeReplyObject(s);
    }
    return ok;
}

/* lock / GET / SET+1 / unlock, ITERS times: a lost update shows in the
 * total. */
static int
counter_child(const struct h_daemon *d, int iters)
{
    struct h_conn *c = h_connect(d);
    /* Where "counter" lives, on a cluster too. */
    redisContext *rc = h_redis_connect_for(&R, "counter");
    if (c == NULL || rc == NULL || rc->err) {
        return 10;
    }
    for (int i = 0; i < iters; i++) {
        if (!child_lock(c, "counter")) {
            return 11;
        }
        long long v = child_get(rc, "counter");
        if (v < 0 || !child_set(rc, "counter", v + 1)) {
            return 12;
        }
        if (!child_unlock(c, "counter")) {
            return 13;
        }
    }
    return 0;
}

/* Buy tickets one at a time until sold out; exit status = tickets
 * bought, 200 + n on errors. */
static int
buyer_child(const struct h_daemon *d, int unused)
{
    (void)unused;
    struct h_conn *c = h_connect(d);
    redisContext *rc = h_redis_connect_for(&R, "stock");
    int bought = 0;
    if (c == NULL || rc == NULL || rc->err) {
        return 210;
    }
    for (;;) {
        if (!child_lock(c, "tickets")) {
            return 211;
        }
        long long stock = child_get(rc, "stock");
        if (stock < 0) {
            return 212; /* oversold, or Redis failed */
        }
        if (stock == 0) {
            child_unlock(c, "tickets");
            return bought;
        }
        usleep(200); /* the sale takes a moment */
        if (!child_set(rc, "stock", stock - 1)) {
            return 213;
        }
        bought++;
        if (!child_unlock(c, "tickets")) {
            return 214;
        }
    }
}

/* Lock KEY, tell the parent through fd ARG, then hang until killed. */
static int
holder_child(const struct h_daemon *d, int fd)
{
    struct h_conn *c = h_connect(d);
    if (c == NULL) {
        return 20;
    }
    json_t *r = child_call(c, lk_req("crash", NULL, 0, 0));
    char ok = (r != NULL && jtrue(r, "acquired")) ? 'y' : 'n';
    json_decref(r);
    if (write(fd, &ok, 1) != 1) {
        return 21;
    }
    for (;;) {
        pause();
    }
}

/* --- two daemons --------------------------------------------------------- */

START_TEST(test_two_daemons)
{
    struct h_conn *a, *b;
    json_t *r;
    long long f1, f2, f3, t0, dt;

    start_two(NULL);
    a = lk_connect(&D1);
    b = lk_connect(&D2);

    r = lk_must(a, "m", NULL, NO_TTL, 0);
    f1 = jint(r, "fence");
    json_decref(r);
    /* Mutual exclusion across daemons. */
    r = lk_lock(b, "m", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    json_decref(r);
    r = lk_info(b, "m");
    ck_assert(jtrue(r, "locked") && !jtrue(r, "mine"));
    json_decref(r);

    /* The unlock in one daemon wakes the waiter in the other at once. */
    lk_send(b, 1, "m", NULL, NO_TTL, 10000);
    wait_waiters(b, 1);
    h_wait_subscribed(&R, "leased:lock:{m}:unlock", 10000);
    t0 = h_now_ms();
    lk_unlock_ok(a, "m", NULL);
    r = h_recv_id(b, 1, 5000);
    dt = h_now_ms() - t0;
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "waiter not granted");
    ck_assert_msg(dt < 100, "cross-daemon wake-up took %lld ms", dt);
    f2 = jint(r, "fence");
    json_decref(r);
    ck_assert_int_gt(f2, f1);
    r = lk_lock(a, "m", NULL, NO_TTL, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);

    /* Fences keep rising across a restart of one daemon. */
    h_close(a);
    ck_assert_int_eq(h_daemon_restart(&D1), 0);
    a = lk_connect(&D1);
    /* It answers before its Redis connections are up; a lock request in
     * between would get redis_unavailable instead of waiting. */
    ck_assert(h_wait_stat_min(a, "redis_connected", 2, 5000));
    lk_send(a, 2, "m", NULL, NO_TTL, 10000);
    wait_waiters(a, 1);
    lk_unlock_ok(b, "m", NULL);
    r = h_recv_id(a, 2, 5000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "not granted");
    f3 = jint(r, "fence");
    json_decref(r);
    ck_assert_int_gt(f3, f2);
    ck_assert_int_eq(h_r_int(&R, "GET leased:lock:{m}:fence"), f3);
    h_close(a);
    h_close(b);
}
END_TEST

START_TEST(test_release_on_close_and_crash)
{
    struct h_conn *a, *b;
    json_t *r;
    long long t0;
    int fds[2];
    char ok = 0;

    start_two(NULL); /* leases of 30 s: only a release frees early */
    a = lk_connect(&D1);
    b = lk_connect(&D2);

    r = lk_must(a, "sc", NULL, NO_TTL, 0);
    json_decref(r);
    lk_send(b, 1, "sc", NULL, NO_TTL, 20000);
    wait_waiters(b, 1);
    t0 = h_now_ms();
    h_close(a);
    r = h_recv_id(b, 1, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "not granted after the holder's session closed");
    ck_assert_msg(h_now_ms() - t0 < 1000, "took %lld ms", h_now_ms() - t0);
    json_decref(r);

    /* A client process killed with SIGKILL while holding a lock. */
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = spawn_child(holder_child, &D1, fds[1]);
    ck_assert_int_eq(read(fds[0], &ok, 1), 1);
    ck_assert_msg(ok == 'y', "the child did not get the lock");
    lk_send(b, 2, "crash", NULL, NO_TTL, 20000);
    wait_waiters(b, 1);
    t0 = h_now_ms();
    kill(pid, SIGKILL);
    r = h_recv_id(b, 2, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"),
                  "not granted after the holder was killed");
    ck_assert_msg(h_now_ms() - t0 < 2000, "took %lld ms", h_now_ms() - t0);
    json_decref(r);
    reap_child(pid, 5000);
    close(fds[0]);
    close(fds[1]);
    h_close(b);
}
END_TEST

/* --- racing processes ---------------------------------------------------- */

START_TEST(test_counter)
{
    pid_t pids[8];
    redisReply *rep;

    start_two(NULL);
    rep = h_redis_cmd(&R, "SET counter 0");
    freeReplyObject(rep);
    for (int i = 0; i < 8; i++) {
        pids[i] = spawn_child(counter_child, i % 2 ? &D2 : &D1, 200);
    }
    for (int i = 0; i < 8; i++) {
        int st = reap_child(pids[i], 100000);
        ck_assert_msg(st == 0, "client %d ended with %d", i, st);
    }
    ck_assert_int_eq(h_r_int(&R, "GET counter"), 1600);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{counter}"), 0);
}
END_TEST

START_TEST(test_ticket_seller)
{
    pid_t pids[8];
    int sold = 0;
    redisReply *rep;

    start_two(NULL);
    rep = h_redis_cmd(&R, "SET stock 100");
    freeReplyObject(rep);
    for (int i = 0; i < 8; i++) {
        pids[i] = spawn_child(buyer_child, i % 2 ? &D2 : &D1, 0);
    }
    for (int i = 0; i < 8; i++) {
        int st = reap_child(pids[i], 100000);
        ck_assert_msg(st >= 0 && st <= 100, "buyer %d ended with %d", i, st);
        sold += st;
    }
    ck_assert_int_eq(sold, 100);
    ck_assert_int_eq(h_r_int(&R, "GET stock"), 0);
}
END_TEST

/* --- many waiters, few Redis calls --------------------------------------- */

static bool
hot_free(void *arg)
{
    (void)arg;
    return h_r_int(&R, "EXISTS leased:lock:{hot}") == 0;
}

#define NCONN 4
#define PER_CONN 250
#define RELEASES 50

START_TEST(test_thousand_waiters)
{
    struct h_conn *h, *w[NCONN];
    json_t *r;
    char owner[32];
    long long before, after, chans;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D1, &R, NULL), 0);
    h = lk_connect(&D1);
    /* The daemon's own channels (the cache's due set) besides the lock's. */
    chans = h_stat(h, "pubsub_channels");
    r = lk_must(h, "hot", NULL, NO_TTL, 0);
    json_decref(r);
    /* Queue them connection by connection so the order is known. */
    for (int i = 0; i < NCONN; i++) {
        w[i] = lk_connect(&D1);
        for (int j = 0; j < PER_CONN; j++) {
            snprintf(owner, sizeof owner, "o%d", j);
            lk_send(w[i], j, "hot", owner, NO_TTL, -1);
        }
        wait_waiters(h, (long long)(i + 1) * PER_CONN);
    }
    ck_assert_int_eq(h_stat(h, "pubsub_channels"), chans + 1);

    before = r_eval_calls(&R);
    lk_unlock_ok(h, "hot", NULL);
    for (int n = 0; n < RELEASES; n++) {
        /* Grants come first come, first served. */
        r = h_recv_id(w[0], n, 5000);
        ck_assert_msg(r != NULL && jtrue(r, "acquired"), "grant %d missing",
                      n);
        json_decref(r);
        snprintf(owner, sizeof owner, "o%d", n);
        if (n < RELEASES - 1) {
            lk_unlock_ok(w[0], "hot", owner);
        }
    }
    after = r_eval_calls(&R);
    ck_assert_msg(after - before <= 4 * RELEASES,
                  "%lld script calls for %d releases", after - before,
                  RELEASES);
    ck_assert_int_eq(h_stat(h, "lock_waiters"), NCONN * PER_CONN - RELEASES);

    /* Closing a connection drops its waiters. */
    h_close(w[3]);
    wait_waiters(h, 3 * PER_CONN - RELEASES);
    for (int i = 0; i < 3; i++) {
        h_close(w[i]);
    }
    wait_waiters(h, 0);
    /* The channel goes once Redis confirms the UNSUBSCRIBE. */
    h_assert_stat(h, "pubsub_channels", chans, 5000);
    ck_assert_msg(h_wait_until(hot_free, NULL, 5000),
                  "lock still held after every session closed");
    h_close(h);
}
END_TEST

/* --- many locks ---------------------------------------------------------- */

/* The watchdog pass goes in steps (a bounded number of renewals out at a
 * time): with several thousand locks it must still renew every one of
 * them, pass after pass, and lose none. The lease (WD_MS) leaves a pass
 * room for a host that does not schedule the daemon for a second: with
 * 900 ms a loaded 2-core machine lost leases for real, which is right for
 * the daemon and says nothing about the steps. */
START_TEST(test_many_watchdog_locks)
{
    enum { N = 3000, WD_MS = 2000 };
    struct h_conn *c, *q;
    char key[32];
    json_t *r;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    /* All N requests are pipelined: room for them in flight. */
    char conf[96];
    snprintf(conf, sizeof conf,
             "lock:\n  watchdog_ms: %d\nlimits:\n  max_pending: 10000\n",
             WD_MS);
    ck_assert_int_eq(h_daemon_start(&D1, &R, conf), 0);
    c = lk_connect(&D1);
    q = lk_connect(&D1);
    for (int i = 0; i < N; i++) {
        snprintf(key, sizeof key, "many:%d", i);
        lk_send(c, i + 1, key, NULL, NO_TTL, 0);
    }
    for (int i = 0; i < N; i++) {
        r = h_recv(c, 10000);
        ck_assert_msg(r != NULL && jtrue(r, "acquired"), "lock %d", i);
        json_decref(r);
    }
    ck_assert_int_eq(h_stat(q, "locks_held"), N);

    /* Three watchdog periods, and at least three renewals of every lock:
     * every lease would have run out twice over without renewal. Waited
     * for, however slowly the machine renews. */
    struct renewals_want rw = {q, h_stat(q, "lock_renewals_ok") + 3 * N,
                               h_now_ms(), 3 * WD_MS};
    ck_assert_msg(h_wait_until(renewals_done, &rw, 60000),
                  "renewals: %lld of %lld", h_stat(q, "lock_renewals_ok"),
                  rw.renewals);
    ck_assert_int_eq(h_stat(q, "locks_held"), N);
    ck_assert_int_eq(h_stat(q, "lock_lost"), 0);
    for (int i = 0; i < N; i += 499) {
        snprintf(key, sizeof key, "many:%d", i);
        ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{%s}", key), 0);
    }
    ck_assert(h_event(c, 0) == NULL);
    h_close(q);
    h_close(c);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(two_daemons, 60),      H_CASE(release_on_close_and_crash, 60),
        H_CASE(counter, 150),         H_CASE(ticket_seller, 150),
        H_CASE(thousand_waiters, 90), H_CASE(many_watchdog_locks, 120),
    };

    return H_MAIN(fx, cases);
}
