/* make soak: a mixed workload against two daemons sharing one Redis, one
 * of them behind the fault-injecting proxy, for SOAK_MINUTES (default
 * 10), with a fault every SOAK_FAULT_S seconds (default 60). Reports the
 * RSS of both daemons over time, errors by code, double grants (a holder
 * counted in Redis, straight, while another believed it held the same
 * key) and acknowledged invalidations that did not happen (checked in
 * Redis at the end, after faults stop and pending deletes drain).
 *
 * Workers are processes with their own sessions, coming and going:
 * lockers (short and long holds, waits, on either daemon), cache readers
 * and fillers, and one invalidator. Counters live in shared memory. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "../integration/faultproxy.h"
#include "../integration/harness.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LOCK_KEYS 8
#define CACHE_KEYS 200
#define INVAL_KEYS 100
#define LOCKERS 6
#define READERS 3
#define WATCHDOG_MS 10000
#define RSS_EVERY_S 10
/* A write whose outcome is unknown has landed or died by then. */
#define UNKNOWN_SETTLE_MS 30000

static const char *const codes[] = {
    "bad_request",   "unknown_op",        "too_large", "unauthorized",
    "not_held",      "redis_unavailable", "busy",      "wrong_type",
    "shutting_down", "internal",          "no_reply",  "other",
};
#define NCODES (sizeof codes / sizeof codes[0])

struct shared {
    atomic_bool stop;
    atomic_long ops, errors[NCODES];
    atomic_long locks, double_grants, lock_lost, sessions;
    atomic_long hits, misses, fills;
    atomic_long invalidations_acked, invalidations_queued;
    /* Per invalidation key: 1 when the last thing done to it was an
     * acknowledged invalidate, 0 after a set. */
    atomic_int inval_state[INVAL_KEYS];
    /* When a cache.set of the key last failed with its outcome unknown
     * (sent, unanswered: it may still land), in ms of h_now_ms; and when
     * the last acknowledged invalidation was sent. A key is checked only
     * when the invalidation came well after such a set. */
    atomic_llong unknown_at[INVAL_KEYS];
    atomic_llong inval_at[INVAL_KEYS];
};

static struct shared *S;
static struct h_redis R;
static struct h_daemon D, D2;
static struct fp *P;

static void
count_error(const json_t *r)
{
    const char *c = r == NULL ? "no_reply" : h_errcode(r);
    size_t i;
    if (c == NULL) {
        return;
    }
    for (i = 0; i < NCODES - 1; i++) {
        if (strcmp(codes[i], c) == 0) {
            break;
        }
    }
    atomic_fetch_add(&S->errors[i], 1);
}

static void nap_ms(int ms);

/* One call; counts the op and its error, if any. A client paces itself
 * (about 500 ops per second per worker, the machine is shared) and backs
 * off after an error, as an app would. */
static json_t *
call(struct h_conn *c, json_t *req)
{
    json_t *r = h_call(c, req, 20000);
    atomic_fetch_add(&S->ops, 1);
    count_error(r);
    nap_ms(r == NULL || !h_ok(r) ? 50 : 2);
    return r;
}

static long long
r_incr(redisContext *rc, const char *fmt, const char *key)
{
    redisReply *rep = rc != NULL ? redisCommand(rc, fmt, key) : NULL;
    long long v = -999;
    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER) {
        v = rep->integer;
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return v;
}

static void
nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Drop events queued so far; true if one was lock_lost for KEY. */
static bool
lost_event(struct h_conn *c, const char *key, int wait_ms)
{
    json_t *ev;
    bool lost = false;
    while ((ev = h_event(c, wait_ms)) != NULL) {
        const char *e = jstr(ev, "event"), *k = jstr(ev, "key");
        if (e != NULL && strcmp(e, "lock_lost") == 0 && k != NULL &&
            strcmp(k, key) == 0) {
            lost = true;
        }
        json_decref(ev);
        wait_ms = 0;
    }
    return lost;
}

/* A locker: take a random key (waiting up to 2 s), count itself in Redis
 * (straight, not through the proxy) as its holder, hold briefly or for
 * seconds, uncount, unlock. A count above one is a double grant. A
 * lock_lost ends the hold at once. Every so often the session ends, at
 * times with the lock still held (the daemon releases it). */
static void
locker(int n)
{
    struct h_daemon *d = n % 2 ? &D : &D2;
    redisContext *rc = redisConnect("127.0.0.1", R.port);
    struct h_conn *c = NULL;

    if (rc == NULL || rc->err) {
        fprintf(stderr, "soak: locker cannot reach redis-server\n");
        _exit(1);
    }
    int left = 0;
    unsigned seed = (unsigned)getpid();

    while (!atomic_load(&S->stop)) {
        char key[32], hk[64];
        if (c == NULL || left-- == 0) {
            h_close(c);
            c = h_connect(d);
            left = 20 + rand_r(&seed) % 100;
            atomic_fetch_add(&S->sessions, 1);
            if (c == NULL) {
                nap_ms(100);
                continue;
            }
        }
        snprintf(key, sizeof key, "sk%d", rand_r(&seed) % LOCK_KEYS);
        snprintf(hk, sizeof hk, "soak:holders:%s", key);
        json_t *req = json_pack("{s:s,s:s,s:i}", "op", "lock", "key", key,
                                "wait_ms", 2000);
        json_t *r = call(c, req);
        if (r == NULL) {
            h_close(c);
            c = NULL;
            continue;
        }
        bool got = h_ok(r) && jtrue(r, "acquired");
        json_decref(r);
        if (!got) {
            continue;
        }
        atomic_fetch_add(&S->locks, 1);
        long long holders = r_incr(rc, "INCR %s", hk);
        if (holders > 1) {
            atomic_fetch_add(&S->double_grants, 1);
            fprintf(stderr, "soak: DOUBLE GRANT of %s (%lld holders)\n", key,
                    holders);
        }
        /* Mostly short holds; some over a watchdog lease, so that a long
         * fault finds holders to tell lock_lost. */
        int dice = rand_r(&seed) % 20;
        int hold = dice == 0  ? 5000 + rand_r(&seed) % 10000
                   : dice < 3 ? 500 + rand_r(&seed) % 2000
                              : rand_r(&seed) % 30;
        bool lost = false;
        for (int t = 0; t < hold && !lost; t += 20) {
            lost = lost_event(c, key, 20);
        }
        r_incr(rc, "DECR %s", hk);
        if (lost) {
            atomic_fetch_add(&S->lock_lost, 1);
            continue;
        }
        if (rand_r(&seed) % 20 == 0) {
            /* Vanish while holding: the session's end releases it. */
            h_close(c);
            c = NULL;
            continue;
        }
        json_decref(
            call(c, json_pack("{s:s,s:s}", "op", "unlock", "key", key)));
    }
    h_close(c);
    redisFree(rc);
}

/* A reader: cache.get with a lease on either daemon, fill on a miss (or
 * release the lease now and then, as a failed loader would). */
static void
reader(int n)
{
    struct h_daemon *d = n % 2 ? &D : &D2;
    struct h_conn *c = NULL;
    int left = 0;
    unsigned seed = (unsigned)getpid();

    while (!atomic_load(&S->stop)) {
        char key[32], val[64];
        if (c == NULL || left-- == 0) {
            h_close(c);
            c = h_connect(d);
            left = 50 + rand_r(&seed) % 200;
            atomic_fetch_add(&S->sessions, 1);
            if (c == NULL) {
                nap_ms(100);
                continue;
            }
        }
        snprintf(key, sizeof key, "sc%d", rand_r(&seed) % CACHE_KEYS);
        json_t *r = call(c, json_pack("{s:s,s:s,s:i}", "op", "cache.get",
                                      "key", key, "wait_ms", 500));
        if (r == NULL) {
            h_close(c);
            c = NULL;
            continue;
        }
        if (h_ok(r) && jtrue(r, "hit")) {
            atomic_fetch_add(&S->hits, 1);
        } else if (h_ok(r)) {
            atomic_fetch_add(&S->misses, 1);
            const char *lease = jstr(r, "lease");
            if (lease != NULL) {
                snprintf(val, sizeof val, "v-%s-%d", key, rand_r(&seed));
                json_t *f = rand_r(&seed) % 10 == 0
                                ? json_pack("{s:s,s:s,s:s}", "op",
                                            "cache.release", "key", key,
                                            "lease", lease)
                                : json_pack("{s:s,s:s,s:s,s:s}", "op",
                                            "cache.fill", "key", key, "lease",
                                            lease, "value", val);
                json_t *fr = call(c, f);
                if (fr != NULL && jtrue(fr, "stored")) {
                    atomic_fetch_add(&S->fills, 1);
                }
                json_decref(fr);
            }
        }
        json_decref(r);
        /* Some of the keys read are invalidated by the other readers. */
        if (rand_r(&seed) % 8 == 0) {
            json_decref(
                call(c, json_pack("{s:s,s:s,s:i}", "op", "cache.invalidate",
                                  "key", key, "delay_ms", 200)));
        }
    }
    h_close(c);
}

/* The invalidator: on its own keys, set a value, then invalidate it;
 * remember per key whether the last thing done was an acknowledged
 * invalidation (checked at the end). Half of its sessions are on the
 * daemon behind the proxy. */
static void
invalidator(void)
{
    struct h_conn *c = NULL;
    int left = 0, n = 0;
    unsigned seed = (unsigned)getpid();

    while (!atomic_load(&S->stop)) {
        char key[32];
        int k = rand_r(&seed) % INVAL_KEYS;
        if (c == NULL || left-- == 0) {
            h_close(c);
            c = h_connect(n++ % 2 ? &D : &D2);
            left = 50 + rand_r(&seed) % 100;
            atomic_fetch_add(&S->sessions, 1);
            if (c == NULL) {
                nap_ms(100);
                continue;
            }
        }
        snprintf(key, sizeof key, "iv%d", k);
        /* Whatever follows, the key may hold a value from here on. */
        atomic_store(&S->inval_state[k], 0);
        json_t *r = call(c, json_pack("{s:s,s:s,s:s,s:i}", "op", "cache.set",
                                      "key", key, "value", "stale", "ttl_ms",
                                      3600000));
        if (r == NULL ||
            (joutcome(r) != NULL && strcmp(joutcome(r), "unknown") == 0)) {
            atomic_store(&S->unknown_at[k], h_now_ms());
        }
        json_decref(r);
        long long sent = h_now_ms();
        r = call(c, json_pack("{s:s,s:s,s:i}", "op", "cache.invalidate", "key",
                              key, "delay_ms", 300));
        if (r == NULL) {
            h_close(c);
            c = NULL;
            continue;
        }
        if (h_ok(r)) {
            atomic_fetch_add(&S->invalidations_acked, 1);
            if (jtrue(r, "queued")) {
                atomic_fetch_add(&S->invalidations_queued, 1);
            }
            atomic_store(&S->inval_at[k], sent);
            atomic_store(&S->inval_state[k], 1);
        }
        json_decref(r);
        nap_ms(5);
    }
    h_close(c);
}

/* --- faults ---------------------------------------------------------- */

struct fault {
    const char *name;
    enum fp_mode mode;
    int latency_ms, trickle, seconds;
    bool reset, cut;
};

/* Blackholes longer than a watchdog lease lose locks; the rest do not. */
static const struct fault faults[] = {
    {"blackhole 5 s", FP_BLACKHOLE, 0, 0, 5, false, false},
    {"reset all", FP_PASS, 0, 0, 0, true, false},
    {"stall 5 s", FP_STALL, 0, 0, 5, false, false},
    {"latency 200 ms for 10 s", FP_PASS, 200, 0, 10, false, false},
    {"replies cut mid-stream", FP_PASS, 20, 0, 2, false, true},
    {"requests dropped 3 s", FP_DROP_UP, 0, 0, 3, false, false},
    {"blackhole 12 s", FP_BLACKHOLE, 0, 0, 12, false, false},
    {"replies trickle 10 s", FP_PASS, 0, 64, 10, false, false},
    {"replies dropped 3 s", FP_DROP_DOWN, 0, 0, 3, false, false},
    {"new connections refused 5 s + reset", FP_REFUSE, 0, 0, 5, true, false},
};
#define NFAULTS (sizeof faults / sizeof faults[0])

static void
fault_begin(const struct fault *f)
{
    fp_set_latency(P, f->latency_ms);
    fp_set_trickle(P, f->trickle);
    fp_set_mode(P, f->mode);
    if (f->reset) {
        fp_reset_all(P);
    }
    if (f->cut) {
        fp_cut_replies_after(P, 3000);
    }
}

static void
fault_end(void)
{
    fp_set_latency(P, 0);
    fp_set_trickle(P, 0);
    fp_set_mode(P, FP_PASS);
}

static long long
rss_kb(pid_t pid)
{
    char path[64], line[256];
    long long v = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            v = atoll(line + 6);
        }
    }
    fclose(f);
    return v;
}

static pid_t
spawn(void (*fn)(int), int n)
{
    pid_t pid = fork();
    if (pid == 0) {
        fn(n);
        _exit(0);
    }
    return pid;
}

static void
invalidator_main(int n)
{
    (void)n;
    invalidator();
}

static bool
drained(struct h_daemon *d)
{
    struct h_conn *c = h_connect(d);
    bool ok = c != NULL &&
              h_wait_stat(c, "cache_invalidations_pending", 0, 120000);
    h_close(c);
    return ok;
}

int
main(void)
{
    const char *m = getenv("SOAK_MINUTES"), *fs = getenv("SOAK_FAULT_S");
    double minutes = m != NULL && *m ? atof(m) : 10;
    int fault_s = fs != NULL && *fs ? atoi(fs) : 60;
    long long run_ms = (long long)(minutes * 60000), t0, next_rss, next_fault;
    long long warm_ms = run_ms / 5 > 120000 ? 120000 : run_ms / 5;
    long long rss_warm[2] = {-1, -1}, rss_max[2] = {0, 0}, rss_end[2];
    pid_t kids[LOCKERS + READERS + 1];
    int nk = 0, nf = 0, lost_inval = 0, checked_inval = 0, unknown = 0;
    char yaml[1024];

    setvbuf(stdout, NULL, _IOLBF, 0);
    S = mmap(NULL, sizeof *S, PROT_READ | PROT_WRITE,
             MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (S == MAP_FAILED || h_redis_start(&R, NULL) != 0) {
        fprintf(stderr, "soak: cannot start redis-server\n");
        return 1;
    }
    P = fp_start(R.port);
    if (P == NULL) {
        fprintf(stderr, "soak: cannot start the proxy\n");
        return 1;
    }
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 1000\n"
             "lock:\n  watchdog_ms: %d\n"
             "log:\n  level: info\n",
             fp_port(P), WATCHDOG_MS);
    if (h_daemon_start(&D, &R, yaml) != 0) {
        return 1;
    }
    snprintf(yaml, sizeof yaml,
             "lock:\n  watchdog_ms: %d\nlog:\n  level: info\n", WATCHDOG_MS);
    if (h_daemon_start(&D2, &R, yaml) != 0) {
        return 1;
    }
    printf("soak: %.1f minutes, a fault every %d s, leased pids %d "
           "(behind the proxy) and %d (straight)\n",
           minutes, fault_s, (int)D.pid, (int)D2.pid);

    for (int i = 0; i < LOCKERS; i++) {
        kids[nk++] = spawn(locker, i);
    }
    for (int i = 0; i < READERS; i++) {
        kids[nk++] = spawn(reader, i);
    }
    kids[nk++] = spawn(invalidator_main, 0);
    for (int i = 0; i < nk; i++) {
        h_track_pid(kids[i]);
    }

    t0 = h_now_ms();
    next_rss = t0;
    next_fault = t0 + fault_s * 1000LL;
    printf("%8s %10s %10s %10s %8s %8s %s\n", "t_s", "rss_kB", "rss2_kB",
           "ops", "errors", "dgrant", "fault");
    for (;;) {
        long long now = h_now_ms();
        if (now - t0 >= run_ms) {
            break;
        }
        if (now >= next_fault) {
            const struct fault *f = &faults[nf++ % NFAULTS];
            printf("%8lld %10s %10s %10s %8s %8s %s\n", (now - t0) / 1000, "",
                   "", "", "", "", f->name);
            fault_begin(f);
            nap_ms(f->seconds * 1000);
            fault_end();
            next_fault += fault_s * 1000LL;
            continue;
        }
        if (now >= next_rss) {
            long long e = 0, r[2] = {rss_kb(D.pid), rss_kb(D2.pid)};
            for (size_t i = 0; i < NCODES; i++) {
                e += atomic_load(&S->errors[i]);
            }
            for (int i = 0; i < 2; i++) {
                if (now - t0 >= warm_ms && rss_warm[i] < 0) {
                    rss_warm[i] = r[i];
                }
                if (rss_warm[i] >= 0 && r[i] > rss_max[i]) {
                    rss_max[i] = r[i];
                }
            }
            printf("%8lld %10lld %10lld %10ld %8lld %8ld\n", (now - t0) / 1000,
                   r[0], r[1], atomic_load(&S->ops), e,
                   atomic_load(&S->double_grants));
            if (r[0] < 0 || r[1] < 0) {
                printf("soak: a daemon died\n");
                break;
            }
            next_rss += RSS_EVERY_S * 1000;
        }
        nap_ms(200);
    }
    fault_end();
    atomic_store(&S->stop, true);
    for (int i = 0; i < nk; i++) {
        int st;
        waitpid(kids[i], &st, 0);
        h_untrack_pid(kids[i]);
    }
    rss_end[0] = rss_kb(D.pid);
    rss_end[1] = rss_kb(D2.pid);

    /* Acknowledged invalidations: once both daemons have no delete
     * pending, every key whose last action was an acknowledged
     * invalidation must be gone from Redis. */
    bool dr = drained(&D) && drained(&D2);
    redisContext *rc = redisConnect("127.0.0.1", R.port);
    if (rc == NULL || rc->err) {
        printf("soak: cannot connect to redis-server: %s\n",
               rc != NULL ? rc->errstr : "no memory");
        return 1;
    }
    for (int k = 0; k < INVAL_KEYS; k++) {
        if (atomic_load(&S->inval_state[k]) != 1) {
            continue;
        }
        if (atomic_load(&S->unknown_at[k]) != 0 &&
            atomic_load(&S->inval_at[k]) - atomic_load(&S->unknown_at[k]) <
                UNKNOWN_SETTLE_MS) {
            unknown++;
            continue;
        }
        checked_inval++;
        redisReply *rep = redisCommand(rc, "EXISTS leased:cache:{iv%d}", k);
        bool gone = rep != NULL && rep->type == REDIS_REPLY_INTEGER &&
                    rep->integer == 0;
        if (rep != NULL) {
            freeReplyObject(rep);
        }
        if (!gone) {
            lost_inval++;
            printf("soak: LOST INVALIDATION of iv%d\n", k);
        }
    }

    redisFree(rc);
    printf("\nsoak summary (%.1f minutes, %d faults)\n", minutes, nf);
    printf("ops %ld, sessions %ld, locks %ld, lock_lost %ld, "
           "double grants %ld\n",
           atomic_load(&S->ops), atomic_load(&S->sessions),
           atomic_load(&S->locks), atomic_load(&S->lock_lost),
           atomic_load(&S->double_grants));
    printf("cache hits %ld, misses %ld, fills stored %ld\n",
           atomic_load(&S->hits), atomic_load(&S->misses),
           atomic_load(&S->fills));
    printf("invalidations acknowledged %ld (queued %ld); keys checked %d, "
           "lost %d, not checked (a set of unknown outcome shortly "
           "before) %d%s\n",
           atomic_load(&S->invalidations_acked),
           atomic_load(&S->invalidations_queued), checked_inval, lost_inval,
           unknown, dr ? "" : " (pending deletes did not drain!)");
    printf("errors by code:");
    for (size_t i = 0; i < NCODES; i++) {
        if (atomic_load(&S->errors[i]) > 0) {
            printf(" %s=%ld", codes[i], atomic_load(&S->errors[i]));
        }
    }
    printf("\n");
    for (int i = 0; i < 2; i++) {
        double g = rss_warm[i] > 0
                       ? 100.0 * (double)(rss_end[i] - rss_warm[i]) /
                             (double)rss_warm[i]
                       : 0;
        printf("RSS %s: after warm-up (%lld s) %lld kB, max %lld kB, end "
               "%lld kB, growth %+.1f%%\n",
               i == 0 ? "behind proxy" : "straight", warm_ms / 1000,
               rss_warm[i], rss_max[i], rss_end[i], g);
    }
    int st1 = h_daemon_stop(&D), st2 = h_daemon_stop(&D2);
    printf("daemons exited %d and %d\n", st1, st2);
    fp_stop(P);
    h_redis_stop(&R);
    h_daemon_cleanup(&D);
    h_daemon_cleanup(&D2);
    return S->double_grants == 0 && lost_inval == 0 && dr && st1 == 0 &&
                   st2 == 0
               ? 0
               : 1;
}
