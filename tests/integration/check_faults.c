/* Faults between leased and Redis, made by the fault-injecting proxy of
 * faultproxy.h sitting on the daemon's Redis address: a blackhole while
 * locks are held (every holder hears lock_lost before Redis can give its
 * lock away, and nothing is granted twice after), a reply cut in the
 * middle of a pipeline and a reset with many commands in flight (every
 * request answered, none with another's reply), a stalled Redis (errors
 * in bounded time, memory bounded), a slow or deaf subscriber
 * connection (a waiter still gets the lock, by wake-up or by its
 * lease-expiry retry), and a delete whose published message overtakes
 * its answer (the waiter it wakes still gets a fresh lease). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "faultproxy.h"
#include "lock_util.h"

#include <dirent.h>
#include <time.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;  /* behind the proxy */
static struct h_daemon D2; /* straight to Redis */
static struct fp *P;

static void
teardown(void)
{
    fp_stop(P);
    P = NULL;
}

static const struct h_fixture fx = {
    .suite = "faults",
    .redis = {&R},
    .daemons = {&D, &D2},
    .teardown = teardown,
};

#define WATCHDOG_MS 3000
#define TIMEOUT_MS 500
#define TEST_SLACK_MS 300

/* Redis, the proxy in front of it, and D through the proxy with REDIS
 * (lines of the redis section after its address) and EXTRA sections. */
static void
start(const char *redis, const char *extra)
{
    char yaml[2048];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    P = fp_start(R.port);
    ck_assert_msg(P != NULL, "proxy did not start");
    snprintf(yaml, sizeof yaml, "redis:\n  address: \"127.0.0.1:%d\"\n%s%s",
             fp_port(P), redis, extra != NULL ? extra : "");
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
}

static const char *
lock_yaml(void)
{
    static char y[128];
    snprintf(y, sizeof y, "lock:\n  watchdog_ms: %d\n", WATCHDOG_MS);
    return y;
}

static long long
proc_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    long long v = -1;
    size_t n = strlen(field);
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            v = atoll(line + n + 1);
            break;
        }
    }
    fclose(f);
    return v;
}

/* Under a memory checker the daemon's RSS is the checker's: memory
 * bounds are not measured there (descriptors still are). */
static bool
checked_memory(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return true;
#else
    const char *w = getenv("LEASED_WRAPPER");
    return w != NULL && *w != '\0';
#endif
}

/* Open descriptors of PID, -1 when unreadable. */
static int
fd_count(pid_t pid)
{
    char path[64];
    int n = 0;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    struct dirent *e;
    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        n += e->d_name[0] != '.';
    }
    closedir(d);
    return n;
}

/* --- 1: blackhole while locks are held ---------------------------------- */

#define BH_N 4

START_TEST(test_blackhole_locks_lost)
{
    struct h_conn *a[BH_N], *b;
    char key[BH_N][16];
    json_t *r;
    long long t0, t;

    start("  timeout_ms: 500\n  connections: 1\n", lock_yaml());
    ck_assert_int_eq(h_daemon_start(&D2, &R, lock_yaml()), 0);
    for (int i = 0; i < BH_N; i++) {
        snprintf(key[i], sizeof key[i], "bh%d", i);
        a[i] = lk_connect(&D);
        json_decref(lk_must(a[i], key[i], NULL, NO_TTL, 0));
    }
    /* Let one renewal go through, so the lease is a renewed one. */
    ck_assert(h_wait_stat_min(a[0], "lock_renewals_ok", 1, 2 * WATCHDOG_MS));

    fp_set_mode(P, FP_BLACKHOLE);
    t0 = h_now_ms();
    /* Any lease the daemon confirmed was sent before t0, so it ends by
     * t0 + watchdog_ms: every holder must have heard by then. This test
     * reads the events in turn, on a machine that may be loaded, so it
     * allows its own delay (TEST_SLACK_MS); the exact moment is checked
     * against Redis' clock in the next test. */
    for (int i = 0; i < BH_N; i++) {
        r = h_lock_lost(a[i], key[i], WATCHDOG_MS + 3000);
        t = h_now_ms();
        ck_assert_msg(r != NULL, "no lock_lost for %s", key[i]);
        ck_assert_str_eq(jstr(r, "reason"), "redis_unavailable");
        ck_assert_msg(t <= t0 + WATCHDOG_MS + TEST_SLACK_MS,
                      "lock_lost for %s came %lld ms after the blackhole, "
                      "past the lease of %d ms",
                      key[i], t - t0, WATCHDOG_MS);
        json_decref(r);
    }
    /* A new request meets the blackhole and is answered in bounded time. */
    t = h_now_ms();
    r = lk_lock(a[0], "bh-new", NULL, NO_TTL, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    ck_assert_msg(h_now_ms() - t < TIMEOUT_MS + 2000,
                  "lock in the blackhole took %lld ms", h_now_ms() - t);

    /* Meanwhile another daemon gets each lock once Redis let it go. */
    b = lk_connect(&D2);
    for (int i = 0; i < BH_N; i++) {
        json_decref(lk_must(b, key[i], NULL, NO_TTL, 2 * WATCHDOG_MS));
    }

    /* The network comes back: nothing is granted twice. */
    fp_set_mode(P, FP_PASS);
    ck_assert_msg(h_wait_stat(a[0], "redis_connected", 1, 15000),
                  "leased did not reconnect");
    for (int i = 0; i < BH_N; i++) {
        r = lk_lock(a[i], key[i], NULL, NO_TTL, 0);
        ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"),
                      "%s granted twice after the blackhole (%s)", key[i],
                      h_errcode(r) != NULL ? h_errcode(r) : "acquired");
        json_decref(r);
        ck_assert_int_eq(h_r_int(&R, "HLEN leased:lock:{%s}", key[i]), 1);
        r = h_callf(b, T_MS, "{s:s,s:s}", "op", "lock.info", "key", key[i]);
        ck_assert_msg(r != NULL && jtrue(r, "mine"), "%s: not b's", key[i]);
        json_decref(r);
    }
    /* And the daemon behind the proxy works again. */
    json_decref(lk_must(a[0], "bh-after", NULL, NO_TTL, 0));
    for (int i = 0; i < BH_N; i++) {
        h_close(a[i]);
    }
    h_close(b);
}
END_TEST

/* The time of the daemon's first log line holding NEEDLE, in wall-clock
 * ms (the log stamps lines "2026-11-25T08:53:56.623Z level=..."); -1
 * when there is none. */
static long long
log_time_ms(const struct h_daemon *d, const char *needle)
{
    char line[1024];
    long long t = -1;
    FILE *f = fopen(d->log, "r");
    if (f == NULL) {
        return -1;
    }
    while (t < 0 && fgets(line, sizeof line, f) != NULL) {
        struct tm tm;
        int ms;
        memset(&tm, 0, sizeof tm);
        if (strstr(line, needle) == NULL ||
            sscanf(line, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon,
                   &tm.tm_mday, &tm.tm_hour, &tm.tm_min, &tm.tm_sec,
                   &ms) != 7) {
            continue;
        }
        tm.tm_year -= 1900;
        tm.tm_mon -= 1;
        t = (long long)timegm(&tm) * 1000 + ms;
    }
    fclose(f);
    return t;
}

/* The moment itself: the daemon tells the holder before Redis lets the
 * lock go. Compared on the clocks of the two processes that act (the
 * daemon's log line of the loss, Redis' expiry), not on when this test
 * process, on a loaded machine, gets around to reading the event. */
START_TEST(test_blackhole_lost_before_redis_frees)
{
    struct h_conn *a;
    json_t *r;
    long long expiry, lost_at;

    start("  timeout_ms: 500\n  connections: 1\n", lock_yaml());
    a = lk_connect(&D);
    json_decref(lk_must(a, "bhp", NULL, NO_TTL, 0));
    ck_assert(h_wait_stat_min(a, "lock_renewals_ok", 1, 2 * WATCHDOG_MS));
    fp_set_mode(P, FP_BLACKHOLE);
    /* No renewal reaches Redis from here: the expiry Redis has now (in
     * Unix ms, its own clock) is the one it keeps. */
    expiry = h_r_int(&R, "PEXPIRETIME leased:lock:{bhp}");
    ck_assert_int_gt(expiry, 0);
    r = h_lock_lost(a, "bhp", WATCHDOG_MS + 3000);
    ck_assert_msg(r != NULL, "no lock_lost");
    json_decref(r);
    lost_at = log_time_ms(&D, "msg=\"lock lost\" reason=redis_unavailable");
    ck_assert_int_gt(lost_at, 0);
    ck_assert_msg(lost_at < expiry,
                  "the daemon gave the lock up %lld ms after Redis let it "
                  "go",
                  lost_at - expiry);
    fp_set_mode(P, FP_PASS);
    h_close(a);
}
END_TEST

/* --- 2: pipelines cut or reset in flight --------------------------------- */

#define PL_N 200

static void
value_of(int i, char *buf, size_t len)
{
    /* Long enough that a few replies span many proxy chunks. */
    snprintf(buf, len,
             "value-%d-xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx-%d",
             i, i * 7919);
}

static void
fill_values(struct h_conn *c)
{
    char key[32], val[256];
    for (int i = 0; i < PL_N; i++) {
        snprintf(key, sizeof key, "pl%d", i);
        value_of(i, val, sizeof val);
        json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "cache.set",
                            "key", key, "value", val, "ttl_ms", 600000);
        ck_assert_msg(h_ok(r), "cache.set %s: %s", key, h_errcode(r));
        json_decref(r);
    }
}

/* Send PL_N cache.get in one write, ids BASE + i for key pl<i>. */
static void
send_pipeline(struct h_conn *c, int base)
{
    size_t cap = (size_t)PL_N * 96, len = 0;
    char *buf = malloc(cap);
    ck_assert(buf != NULL);
    for (int i = 0; i < PL_N; i++) {
        len += (size_t)snprintf(buf + len, cap - len,
                                "{\"id\":%d,\"op\":\"cache.get\",\"key\":"
                                "\"pl%d\",\"lease\":false}\n",
                                base + i, i);
    }
    ck_assert_int_eq(h_send_raw(c, buf, len), 0);
    free(buf);
}

/* Every request answered once, each hit with its own key's value, every
 * error redis_unavailable. Returns how many failed. */
static int
check_pipeline(struct h_conn *c, int base)
{
    bool seen[PL_N] = {false};
    int failed = 0;
    char want[256];
    for (int n = 0; n < PL_N; n++) {
        json_t *r = h_recv(c, 20000);
        ck_assert_msg(r != NULL, "only %d of %d requests answered", n, PL_N);
        int i = (int)jint(r, "id") - base;
        ck_assert_msg(i >= 0 && i < PL_N && !seen[i], "unexpected id %lld",
                      jint(r, "id"));
        seen[i] = true;
        if (h_ok(r)) {
            value_of(i, want, sizeof want);
            ck_assert_msg(jtrue(r, "hit"), "pl%d: miss", i);
            ck_assert_msg(jstr(r, "value") != NULL &&
                              strcmp(jstr(r, "value"), want) == 0,
                          "pl%d got the value %s", i, jstr(r, "value"));
        } else {
            ck_assert_str_eq(h_errcode(r), "redis_unavailable");
            failed++;
        }
        json_decref(r);
    }
    return failed;
}

static bool
bytes_up_past(void *arg)
{
    return fp_bytes_up(P) >= *(long *)arg;
}

START_TEST(test_pipeline_cut_and_reset)
{
    struct h_conn *c;
    int failed;
    long up;

    start("  timeout_ms: 3000\n  connections: 1\n", NULL);
    c = h_connect_ok(&D);
    fill_values(c);

    /* A cut some way into the replies: the connection dies in the middle
     * of one of them, with the rest of the pipeline still owed. */
    fp_set_latency(P, 50);
    fp_cut_replies_after(P, 5000);
    send_pipeline(c, 10000);
    failed = check_pipeline(c, 10000);
    ck_assert_int_ge(fp_resets(P), 1);
    ck_assert_msg(failed > 0 && failed < PL_N,
                  "the cut should fail some requests and not others (%d)",
                  failed);

    /* A reset while the requests are on their way to Redis. */
    ck_assert_msg(h_wait_stat(c, "redis_connected", 1, 15000),
                  "no reconnect after the cut");
    fp_set_latency(P, 300);
    up = fp_bytes_up(P) + 2000;
    send_pipeline(c, 20000);
    ck_assert(h_wait_until(bytes_up_past, &up, 5000));
    fp_reset_all(P);
    failed = check_pipeline(c, 20000);
    ck_assert_msg(failed > 0, "the reset failed no request");

    /* And afterwards every reply is right again. */
    fp_set_latency(P, 0);
    ck_assert_msg(h_wait_stat(c, "redis_connected", 1, 15000),
                  "no reconnect after the reset");
    send_pipeline(c, 30000);
    ck_assert_int_eq(check_pipeline(c, 30000), 0);
    h_close(c);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* --- 3: a stalled Redis ---------------------------------------------------- */

#define ST_CLIENTS 4
#define ST_REQS 500

START_TEST(test_stall_bounded)
{
    struct h_conn *c[ST_CLIENTS];
    long long rss[3];
    int fds[3];
    char line[160];

    start("  timeout_ms: 500\n  connections: 1\n", NULL);
    for (int i = 0; i < ST_CLIENTS; i++) {
        c[i] = h_connect_ok(&D);
    }
    fp_set_mode(P, FP_STALL);
    for (int round = 0; round < 3; round++) {
        long long t0 = h_now_ms();
        for (int i = 0; i < ST_CLIENTS; i++) {
            size_t cap = (size_t)ST_REQS * sizeof line, len = 0;
            char *buf = malloc(cap);
            ck_assert(buf != NULL);
            for (int j = 0; j < ST_REQS; j++) {
                /* Half reads, half lock tries. */
                len += (size_t)snprintf(
                    buf + len, cap - len,
                    j % 2
                        ? "{\"id\":%d,\"op\":\"cache.get\",\"key\":\"s%d\"}\n"
                        : "{\"id\":%d,\"op\":\"lock\",\"key\":\"s%d\"}\n",
                    j, j);
            }
            ck_assert_int_eq(h_send_raw(c[i], buf, len), 0);
            free(buf);
        }
        for (int i = 0; i < ST_CLIENTS; i++) {
            for (int j = 0; j < ST_REQS; j++) {
                json_t *r = h_recv(c[i], 20000);
                ck_assert_msg(r != NULL, "round %d: client %d got %d replies",
                              round, i, j);
                ck_assert_msg(!h_ok(r), "an answer from a stalled Redis");
                ck_assert_str_eq(h_errcode(r), "redis_unavailable");
                json_decref(r);
            }
        }
        /* Every request of the round failed within a few timeouts, not
         * one timeout per request in line. */
        ck_assert_msg(h_now_ms() - t0 < 10 * TIMEOUT_MS + 3000,
                      "round %d took %lld ms", round, h_now_ms() - t0);
        rss[round] = proc_kb(D.pid, "VmRSS");
        ck_assert_int_gt(rss[round], 0);
        fds[round] = fd_count(D.pid);
    }
    /* Nothing stays behind from round to round: connections set aside
     * for late answers are given up in bounded time. */
    ck_assert_msg(fds[2] <= fds[0] + 4, "descriptors grew from %d to %d",
                  fds[0], fds[2]);
    ck_assert_msg(checked_memory() || rss[2] - rss[0] < 8 * 1024,
                  "RSS grew from %lld kB to %lld kB over stalled rounds",
                  rss[0], rss[2]);
    fp_set_mode(P, FP_PASS);
    ck_assert_msg(h_wait_stat(c[0], "redis_connected", 1, 15000),
                  "leased did not reconnect after the stall");
    json_decref(lk_must(c[0], "after-stall", NULL, NO_TTL, 0));
    for (int i = 0; i < ST_CLIENTS; i++) {
        h_close(c[i]);
    }
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* --- 4: a slow or deaf subscriber connection ------------------------------ */

/* The waiter sits on D (behind the proxy), the holder on D2, so the
 * wake-up has to come over D's subscriber connection. Returns how long
 * the waiter took to get the lock after the unlock. */
static long long
wait_through(const char *key)
{
    struct h_conn *h = lk_connect(&D2), *w = lk_connect(&D);
    struct h_conn *st = lk_connect(&D);
    json_t *r;
    long long t;

    json_decref(lk_must(h, key, NULL, NO_TTL, 0));
    lk_send(w, 77, key, NULL, NO_TTL, 30000);
    /* The waiter has tried once and waits (whether or not its SUBSCRIBE
     * got through). */
    ck_assert(h_wait_stat(st, "lock_waiters", 1, 10000));
    /* Renewed at least once, so its remaining lease is a full one. */
    ck_assert(h_wait_stat_min(h, "lock_renewals_ok", 1, 2 * WATCHDOG_MS));
    json_decref(lk_unlock(h, key, NULL));
    t = h_now_ms();
    r = h_recv_id(w, 77, 35000);
    t = h_now_ms() - t;
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                  "the waiter did not get %s", key);
    json_decref(r);
    h_close(h);
    h_close(w);
    h_close(st);
    return t;
}

START_TEST(test_slow_subscriber)
{
    static const struct {
        enum fp_mode mode;
        const char *key;
    } deaf[] = {
        {FP_DROP_DOWN, "deaf-down"},
        {FP_DROP_UP, "deaf-up"},
        {FP_STALL, "deaf-stall"},
        {FP_BLACKHOLE, "deaf-blackhole"},
    };
    long long ms;

    start("  timeout_ms: 500\n", lock_yaml());
    ck_assert_int_eq(h_daemon_start(&D2, &R, lock_yaml()), 0);
    fp_only_subscribers(P, true);

    /* Slow: wake-ups arrive late but arrive. */
    fp_set_latency(P, 200);
    fp_set_trickle(P, 16);
    ms = wait_through("slow1");
    /* Sooner than the holder's remaining lease (2/3 of a watchdog lease
     * at least): the wake-up came, not the retry. */
    ck_assert_msg(ms < WATCHDOG_MS / 2, "waited %lld ms for a wake-up", ms);
    fp_set_latency(P, 0);
    fp_set_trickle(P, 0);

    /* Deaf: wake-ups (or the SUBSCRIBE itself) are lost or held; the
     * waiter retries when the lease it saw ends, at most one watchdog
     * lease after its last try. */
    for (size_t i = 0; i < sizeof deaf / sizeof deaf[0]; i++) {
        fp_set_mode(P, deaf[i].mode);
        ms = wait_through(deaf[i].key);
        ck_assert_msg(ms <= WATCHDOG_MS + 1500, "%s: waited %lld ms",
                      deaf[i].key, ms);
        fp_set_mode(P, FP_PASS);
    }
}
END_TEST

/* --- 6: a published delete overtakes its answer ------------------------- */

/* A waiter woken by the delete's message while the delete is still owed
 * (its answer is on its way) reads without a lease; the read is answered
 * after the delete's answer, and the waiter must still get a fresh lease,
 * not a miss without one. */
START_TEST(test_owed_delete_wakes_waiter)
{
    start("", NULL);
    struct h_conn *a = h_connect_ok(&D);
    struct h_conn *b = h_connect_ok(&D);
    struct h_conn *s = h_connect_ok(&D);

    json_t *r = h_must(h_callf(a, TIMEOUT_MS * 10, "{s:s,s:s}", "op",
                               "cache.get", "key", "ow"));
    ck_assert_msg(h_is_token(jstr(r, "lease")), "no lease: %s", h_dump(r));
    char *lease = strdup(jstr(r, "lease"));
    json_decref(r);
    ck_assert_int_eq(h_send(b, "{s:I,s:s,s:s,s:I}", "id", (json_int_t)7, "op",
                            "cache.get", "key", "ow", "wait_ms",
                            (json_int_t)10000),
                     0);
    ck_assert(h_wait_stat(b, "cache_waits", 1, 5000));
    h_wait_subscribed(&R, "leased:cache:{ow}:fill", 5000);

    /* Commands and their answers are late, the message is not. */
    fp_only_commands(P, true);
    fp_set_latency(P, 300);
    r = h_must(h_callf(s, 10000, "{s:s,s:s,s:i}", "op", "cache.invalidate",
                       "key", "ow", "delay_ms", 0));
    ck_assert_int_eq(json_integer_value(json_object_get(r, "deleted")), 1);
    json_decref(r);
    r = h_recv(b, 10000);
    ck_assert_msg(r != NULL && h_is_token(jstr(r, "lease")),
                  "waiter expected a new lease, got %s", h_dump(r));
    ck_assert_str_ne(jstr(r, "lease"), lease);
    json_decref(r);
    free(lease);
    h_close(a);
    h_close(b);
    h_close(s);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(blackhole_locks_lost, 90),
        H_CASE(blackhole_lost_before_redis_frees, 60),
        H_CASE(pipeline_cut_and_reset, 120),
        H_CASE(stall_bounded, 120),
        H_CASE(slow_subscriber, 120),
        H_CASE(owed_delete_wakes_waiter, 60),
    };

    return H_MAIN(fx, cases);
}
