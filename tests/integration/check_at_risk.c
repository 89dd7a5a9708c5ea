/* lock_at_risk / lock_safe and sem_at_risk / sem_safe: Redis's replies
 * are stalled by the fault proxy (faultproxy.h) between the daemon and
 * Redis, so that a renewal of a held lock or semaphore grant goes
 * unanswered. The holder hears it at risk while its lease still runs,
 * before any loss; safe again when a later renewal gets through before
 * the lease ends (and no loss then); lost when the stall outlasts it. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "faultproxy.h"
#include "lock_util.h"
#include "sem_util.h"

#include <signal.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;
static struct fp *P;

/* Redlock's instances, each behind a proxy of its own. */
#define NI 3
static struct h_redis I[NI];
static struct fp *IP[NI];

static void
teardown(void)
{
    fp_stop(P);
    P = NULL;
    for (int i = 0; i < NI; i++) {
        if (IP[i] != NULL) {
            fp_stop(IP[i]);
            IP[i] = NULL;
        }
        h_redis_stop(&I[i]);
    }
}

static const struct h_fixture fx = {
    .suite = "at_risk",
    .redis = {&R},
    .daemons = {&D},
    .teardown = teardown,
};

#define WATCHDOG_MS 3000

/* Redis, the proxy, and D through it. TIMEOUT_MS is redis.timeout_ms:
 * short, a stalled renewal fails (an error reply); long, it is late. */
static void
start_layout(int timeout_ms, int sem_layout)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    P = fp_start(R.port);
    ck_assert_msg(P != NULL, "proxy did not start");
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: %d\n"
             "  connections: 1\nlock:\n  watchdog_ms: %d\n"
             "  sem_layout: %d\n",
             fp_port(P), timeout_ms, WATCHDOG_MS, sem_layout);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
}

static void
start(int timeout_ms)
{
    start_layout(timeout_ms, 1);
}

/* The next event on C, which must be NAME for KEY; returned. */
static json_t *
expect_event(struct h_conn *c, const char *name, const char *key,
             int timeout_ms)
{
    json_t *ev = h_event(c, timeout_ms);
    ck_assert_msg(ev != NULL, "no %s for %s within %d ms", name, key,
                  timeout_ms);
    ck_assert_msg(strcmp(jstr(ev, "event"), name) == 0,
                  "%s: got %s (reason %s) where %s was due", key,
                  jstr(ev, "event"),
                  jstr(ev, "reason") != NULL ? jstr(ev, "reason") : "-", name);
    ck_assert_str_eq(jstr(ev, "key"), key);
    return ev;
}

/* At risk (first event, with time left on the lease) once the proxy
 * stalls; returns the lease_left_ms it said. */
static long long
stall_until_at_risk(struct h_conn *c, const char *event, const char *key,
                    const char *token)
{
    fp_set_mode(P, FP_STALL);
    long long t0 = h_now_ms();
    json_t *ev = expect_event(c, event, key, 2 * WATCHDOG_MS);
    long long left = jint(ev, "lease_left_ms");
    ck_assert_str_eq(jstr(ev, "token"), token);
    ck_assert_msg(left > 0 && left < WATCHDOG_MS, "lease_left_ms %lld", left);
    /* The stall began at most a lease after the last confirmation: the
     * event came before that lease could end. */
    ck_assert_msg(h_now_ms() - t0 < WATCHDOG_MS, "%s %lld ms into the stall",
                  event, h_now_ms() - t0);
    json_decref(ev);
    return left;
}

struct renewed_since {
    struct h_conn *c;
    long long want;
};

static bool
renewed(void *arg)
{
    struct renewed_since *w = arg;
    return h_stat(w->c, "lock_renewals_ok") >= w->want;
}

static void
lock_at_risk_then(int timeout_ms, bool lasts)
{
    struct h_conn *a, *s;
    char token[65];

    start(timeout_ms);
    a = lk_connect(&D);
    s = lk_connect(&D);
    json_t *r = lk_must(a, "risk", NULL, NO_TTL, 0);
    snprintf(token, sizeof token, "%s", jstr(r, "token"));
    json_decref(r);
    ck_assert(h_wait_stat_min(s, "lock_renewals_ok", 1, 2 * WATCHDOG_MS));

    stall_until_at_risk(a, "lock_at_risk", "risk", token);
    if (lasts) {
        r = expect_event(a, "lock_lost", "risk", 2 * WATCHDOG_MS);
        ck_assert_str_eq(jstr(r, "reason"), "redis_unavailable");
        ck_assert_str_eq(jstr(r, "token"), token);
        json_decref(r);
        fp_set_mode(P, FP_PASS);
    } else {
        fp_set_mode(P, FP_PASS);
        r = expect_event(a, "lock_safe", "risk", 2 * WATCHDOG_MS);
        ck_assert_str_eq(jstr(r, "token"), token);
        ck_assert_int_gt(jint(r, "lease_ms"), 0);
        json_decref(r);
        /* Two renewals later, past the lease the stall put at risk, the
         * lock is still this session's and nothing else was said. */
        struct renewed_since w = {s, h_stat(s, "lock_renewals_ok") + 2};
        ck_assert(h_wait_until(renewed, &w, 3 * WATCHDOG_MS));
        r = lk_info(a, "risk");
        ck_assert_msg(jtrue(r, "mine"), "the lock is no longer held");
        json_decref(r);
        r = h_event(a, 0);
        ck_assert_msg(r == NULL, "unexpected event %s",
                      r != NULL ? jstr(r, "event") : "");
        lk_unlock_ok(a, "risk", NULL);
    }
    h_close(a);
    h_close(s);
}

/* A renewal left unanswered (the command timeout is longer than the
 * lease) is late at the next pass: at risk, then safe once Redis
 * answers again. */
START_TEST(test_lock_late_then_safe)
{
    lock_at_risk_then(60000, false);
}
END_TEST

/* A renewal that fails (the command timeout ends it) while the stall
 * outlasts the lease: at risk first, then lost. */
START_TEST(test_lock_failed_then_lost)
{
    lock_at_risk_then(500, true);
}
END_TEST

/* The line of D's log holding NEEDLE into BUF; false when none. */
static bool
log_line(const char *needle, char *buf, size_t len)
{
    FILE *f = fopen(D.log, "r");
    bool found = false;
    if (f == NULL) {
        return false;
    }
    while (!found && fgets(buf, (int)len, f) != NULL) {
        found = strstr(buf, needle) != NULL;
    }
    fclose(f);
    return found;
}

/* The daemon is stopped (as a loaded host may leave it unscheduled)
 * from before the end of a lease a stall put at risk until well past
 * it: lock_lost goes out as it resumes, and its log says when it was
 * due and how late it left, in CLOCK_MONOTONIC ms like this clock, so
 * that a late event can be told apart from a wrong lease end
 * (tests/jepsen/checker.py reads it). Due within a lease of the stall's
 * start: no confirmation got through after it. */

/* Each key of a group hears it. */
START_TEST(test_group_keys_at_risk)
{
    start(60000);
    struct h_conn *a = lk_connect(&D);
    json_t *r = h_callf(a, T_MS, "{s:s,s:[s,s]}", "op", "lock", "keys", "g1",
                        "g2");
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "group: %s", h_errcode(r));
    char token[65];
    snprintf(token, sizeof token, "%s", jstr(r, "token"));
    json_decref(r);
    ck_assert(h_wait_stat_min(a, "lock_renewals_ok", 2, 2 * WATCHDOG_MS));
    fp_set_mode(P, FP_STALL);
    bool seen[2] = {false, false};
    for (int i = 0; i < 2; i++) {
        r = h_event(a, 2 * WATCHDOG_MS);
        ck_assert_msg(r != NULL, "no lock_at_risk for every key");
        ck_assert_str_eq(jstr(r, "event"), "lock_at_risk");
        ck_assert_str_eq(jstr(r, "token"), token);
        ck_assert_int_gt(jint(r, "lease_left_ms"), 0);
        seen[strcmp(jstr(r, "key"), "g2") == 0] = true;
        json_decref(r);
    }
    ck_assert(seen[0] && seen[1]);
    fp_set_mode(P, FP_PASS);
    for (int i = 0; i < 2; i++) {
        r = h_event(a, 2 * WATCHDOG_MS);
        ck_assert_msg(r != NULL, "no lock_safe for every key");
        ck_assert_str_eq(jstr(r, "event"), "lock_safe");
        json_decref(r);
    }
    h_close(a);
}
END_TEST

/* Both sides of a read-write lock (a reader of one lock, a writer of
 * another, on two sessions) hear it. */
START_TEST(test_rwlock_sides_at_risk)
{
    start(60000);
    struct h_conn *c[2] = {lk_connect(&D), lk_connect(&D)};
    const char *key[2] = {"rwr", "rww"}, *mode[2] = {"read", "write"};
    for (int i = 0; i < 2; i++) {
        json_t *r = h_callf(c[i], T_MS, "{s:s,s:s,s:s}", "op", "lock", "key",
                            key[i], "mode", mode[i]);
        ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "%s lock: %s", mode[i],
                      h_errcode(r));
        json_decref(r);
    }
    ck_assert(h_wait_stat_min(c[0], "lock_renewals_ok", 2, 2 * WATCHDOG_MS));
    fp_set_mode(P, FP_STALL);
    for (int i = 0; i < 2; i++) {
        json_t *ev = expect_event(c[i], "lock_at_risk", key[i],
                                  2 * WATCHDOG_MS);
        ck_assert_int_gt(jint(ev, "lease_left_ms"), 0);
        json_decref(ev);
    }
    fp_set_mode(P, FP_PASS);
    for (int i = 0; i < 2; i++) {
        json_decref(expect_event(c[i], "lock_safe", key[i], 2 * WATCHDOG_MS));
        h_close(c[i]);
    }
}
END_TEST

/* Redlock: two of the three instances stall, so a renewal has no
 * majority (it times out on them at a tenth of the lease): at risk, not
 * lost, while the lease a majority confirmed holds; they answer again:
 * safe. */
START_TEST(test_redlock_late_then_safe)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    for (int i = 0; i < NI; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], NULL), 0);
        IP[i] = fp_start(I[i].port);
        ck_assert_msg(IP[i] != NULL, "proxy did not start");
    }
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: 127.0.0.1:%d\n  timeout_ms: 60000\n"
             "lock:\n  watchdog_ms: %d\n  redlock: [\"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\", \"127.0.0.1:%d\"]\n",
             R.port, WATCHDOG_MS, fp_port(IP[0]), fp_port(IP[1]),
             fp_port(IP[2]));
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    h_wait_redlock(&D, NI);
    struct h_conn *a = lk_connect(&D);
    json_t *r = lk_must(a, "rl", NULL, NO_TTL, 0);
    json_decref(r);
    ck_assert(h_wait_stat_min(a, "lock_renewals_ok", 1, 2 * WATCHDOG_MS));
    fp_set_mode(IP[0], FP_STALL);
    fp_set_mode(IP[1], FP_STALL);
    r = expect_event(a, "lock_at_risk", "rl", 2 * WATCHDOG_MS);
    ck_assert_int_gt(jint(r, "lease_left_ms"), 0);
    json_decref(r);
    fp_set_mode(IP[0], FP_PASS);
    fp_set_mode(IP[1], FP_PASS);
    json_decref(expect_event(a, "lock_safe", "rl", 2 * WATCHDOG_MS));
    r = lk_info(a, "rl");
    ck_assert_msg(jtrue(r, "mine"), "the lock is no longer held");
    json_decref(r);
    h_close(a);
}
END_TEST

struct zscore_above {
    const char *token;
    long long above;
};

static bool
zscore_grew(void *arg)
{
    struct zscore_above *w = arg;
    return h_r_int(&R, "ZSCORE leased:lock:{pool}:sem %s", w->token) >
           w->above;
}

/* Under SEM_LAYOUT, a one-permit grant is a bare zset member (2) or has
 * its hash field (1): its renewals, late or failed, take either path. */
static void
sem_at_risk_then(int timeout_ms, bool lasts, int sem_layout)
{
    struct h_conn *a;
    char token[65];

    start_layout(timeout_ms, sem_layout);
    a = lk_connect(&D);
    s_must(a, "pool", 2, 1, 0, token);
    ck_assert_int_eq(h_r_int(&R, "HEXISTS leased:lock:{pool}:sem:permits %s",
                             token),
                     sem_layout == 1);
    /* A renewal has moved the grant's lease on. */
    struct zscore_above w = {token,
                             h_r_int(&R, "ZSCORE leased:lock:{pool}:sem %s",
                                     token)};
    ck_assert(h_wait_until(zscore_grew, &w, 2 * WATCHDOG_MS));

    stall_until_at_risk(a, "sem_at_risk", "pool", token);
    if (lasts) {
        json_t *r = expect_event(a, "sem_lost", "pool", 2 * WATCHDOG_MS);
        ck_assert_str_eq(jstr(r, "reason"), "redis_unavailable");
        json_decref(r);
        fp_set_mode(P, FP_PASS);
    } else {
        fp_set_mode(P, FP_PASS);
        json_t *r = expect_event(a, "sem_safe", "pool", 2 * WATCHDOG_MS);
        ck_assert_str_eq(jstr(r, "token"), token);
        ck_assert_int_eq(jint(r, "lease_ms"), WATCHDOG_MS);
        json_decref(r);
        /* Renewed twice more, and past the lease put at risk: held. */
        for (int i = 0; i < 2; i++) {
            w.above = h_r_int(&R, "ZSCORE leased:lock:{pool}:sem %s", token);
            ck_assert(h_wait_until(zscore_grew, &w, 2 * WATCHDOG_MS));
        }
        ck_assert_int_eq(s_held(a, "pool", 2), 1);
        r = h_event(a, 0);
        ck_assert_msg(r == NULL, "unexpected event %s",
                      r != NULL ? jstr(r, "event") : "");
    }
    h_close(a);
}

/* KIND ("lock" or "sem") lost late: hold KEY, stall Redis until the
 * hold is at risk, stop the daemon past the lease, resume it. */
static void
lost_late_logged(const char *kind)
{
    char token[65], line[1024], ev[32], needle[32];
    bool sem = strcmp(kind, "sem") == 0;
    const char *key = sem ? "pool" : "late";

    snprintf(ev, sizeof ev, "%s_lost", kind);
    snprintf(needle, sizeof needle, "%s lost late", kind);
    start(500);
    struct h_conn *a = lk_connect(&D);
    if (sem) {
        s_must(a, key, 2, 1, 0, token);
        struct zscore_above w = {
            token, h_r_int(&R, "ZSCORE leased:lock:{pool}:sem %s", token)};
        ck_assert(h_wait_until(zscore_grew, &w, 2 * WATCHDOG_MS));
    } else {
        json_t *r = lk_must(a, key, NULL, NO_TTL, 0);
        snprintf(token, sizeof token, "%s", jstr(r, "token"));
        json_decref(r);
        ck_assert(h_wait_stat_min(a, "lock_renewals_ok", 1, 2 * WATCHDOG_MS));
    }
    long long t0 = h_now_ms();
    stall_until_at_risk(a, sem ? "sem_at_risk" : "lock_at_risk", key, token);
    h_daemon_signal(&D, SIGSTOP);
    /* Not an assertion: the daemon must stay stopped past the lease. */
    while (h_now_ms() < t0 + WATCHDOG_MS + 500) {
        usleep(50 * 1000);
    }
    long long t1 = h_now_ms();
    h_daemon_signal(&D, SIGCONT);
    json_t *r = expect_event(a, ev, key, 2 * WATCHDOG_MS);
    ck_assert_str_eq(jstr(r, "token"), token);
    json_decref(r);
    ck_assert_msg(h_wait_log(&D, needle, 5000), "no \"%s\" line in the log",
                  needle);
    ck_assert(log_line(needle, line, sizeof line));
    const char *p = strstr(line, "due_ms=");
    unsigned long long due, now, late;
    ck_assert_msg(p != NULL &&
                      sscanf(p, "due_ms=%llu now_ms=%llu late_ms=%llu", &due,
                             &now, &late) == 3,
                  "log line: %s", line);
    ck_assert_msg((long long)due <= t0 + WATCHDOG_MS && (long long)due < t1,
                  "due %llu, stall at %lld, resumed at %lld", due, t0, t1);
    ck_assert_msg((long long)now >= t1 && late == now - due,
                  "sent %llu late %llu, resumed at %lld", now, late, t1);
    fp_set_mode(P, FP_PASS);
    h_close(a);
}

START_TEST(test_lock_lost_late_logged)
{
    lost_late_logged("lock");
}
END_TEST

START_TEST(test_sem_lost_late_logged)
{
    lost_late_logged("sem");
}
END_TEST

START_TEST(test_sem_late_then_safe)
{
    sem_at_risk_then(60000, false, 1);
}
END_TEST

START_TEST(test_sem_failed_then_lost)
{
    sem_at_risk_then(500, true, 1);
}
END_TEST

START_TEST(test_sem_late_then_safe_layout2)
{
    sem_at_risk_then(60000, false, 2);
}
END_TEST

START_TEST(test_sem_failed_then_lost_layout2)
{
    sem_at_risk_then(500, true, 2);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(lock_late_then_safe, 60),
        H_CASE(lock_failed_then_lost, 60),
        H_CASE(group_keys_at_risk, 60),
        H_CASE(rwlock_sides_at_risk, 60),
        H_CASE(redlock_late_then_safe, 60),
        H_CASE(sem_late_then_safe, 60),
        H_CASE(sem_failed_then_lost, 60),
        H_CASE(lock_lost_late_logged, 60),
        H_CASE(sem_lost_late_logged, 60),
        H_CASE(sem_late_then_safe_layout2, 60),
        H_CASE(sem_failed_then_lost_layout2, 60),
    };

    return H_MAIN(fx, cases);
}
