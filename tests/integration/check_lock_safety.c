/* Lock safety against one real leased and a real redis-server: a token is
 * never reused for a new acquisition, fences never go backwards (also when
 * Redis loses data) and stay exact integers, lock_lost comes before the
 * lease it vouched for can run out, max_hold holds exactly, and foreign
 * data in the lock keys is wrong_type, never a script error. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "lock_safety",
    .redis = {&R},
    .daemons = {&D},
};

/* --- a raw connection, to see the order of events and replies ---------- */

struct raw {
    int fd;
    char buf[65536];
    size_t len;
};

static void
raw_open(struct raw *c, const char *path)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t n = strlen(path);
    ck_assert_uint_lt(n, sizeof sa.sun_path);
    memcpy(sa.sun_path, path, n + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(c->fd, 0);
    ck_assert_int_eq(connect(c->fd, (struct sockaddr *)&sa, sizeof sa), 0);
    c->len = 0;
}

static void
raw_send(struct raw *c, const char *line)
{
    size_t n = strlen(line);
    ck_assert_int_eq(write(c->fd, line, n), (ssize_t)n);
}

/* The next line as JSON, or NULL after TIMEOUT_MS. */
static json_t *
raw_line(struct raw *c, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        if (nl != NULL) {
            size_t n = (size_t)(nl - c->buf);
            json_t *j = json_loadb(c->buf, n, 0, NULL);
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            return j;
        }
        long long left = deadline - h_now_ms();
        if (left <= 0 || c->len == sizeof c->buf) {
            return NULL;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int rc = poll(&p, 1, (int)left);
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        if (rc <= 0) {
            return NULL;
        }
        ssize_t got = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
        if (got <= 0) {
            return NULL;
        }
        c->len += (size_t)got;
    }
}

/* --- tokens ------------------------------------------------------------ */

struct exists_arg {
    const char *key;
    long long want;
};

static bool
redis_exists_is(void *arg)
{
    const struct exists_arg *a = arg;
    return h_r_int(&R, "EXISTS %s", a->key) == a->want;
}

/* A fixed lease runs out; the same owner locks again before anything
 * noticed: that is a new acquisition, so it gets a new token and a new
 * fence, the lost hold is reported first, and the old token no longer
 * unlocks anything. */
START_TEST(test_token_after_silent_loss)
{
    struct raw a;
    struct h_conn *b, *c;
    json_t *r, *ev = NULL, *rep = NULL;
    char tok[80];
    long long fence;

    h_start("lock:\n  watchdog_ms: 60000\n");
    raw_open(&a, D.sock);
    b = lk_connect(&D);
    c = lk_connect(&D);

    raw_send(&a, "{\"id\":1,\"op\":\"lock\",\"key\":\"d\",\"detach\":true,"
                 "\"ttl_ms\":300}\n");
    r = raw_line(&a, T_MS);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "first lock failed");
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    fence = jint(r, "fence");
    json_decref(r);

    struct exists_arg gone = {"leased:lock:{d}", 0};
    ck_assert_msg(h_wait_until(redis_exists_is, &gone, 10000),
                  "the 300 ms lease never ran out");

    raw_send(&a, "{\"id\":2,\"op\":\"lock\",\"key\":\"d\",\"detach\":true,"
                 "\"ttl_ms\":60000}\n");
    /* Read until the reply: the loss must come before it. */
    for (int i = 0; i < 10 && rep == NULL; i++) {
        json_t *j = raw_line(&a, T_MS);
        ck_assert_msg(j != NULL, "no reply to the second lock");
        if (jstr(j, "event") != NULL) {
            ck_assert_msg(rep == NULL, "event after the reply");
            ck_assert_str_eq(jstr(j, "event"), "lock_lost");
            ck_assert_ptr_null(ev);
            ev = j;
        } else {
            rep = j;
        }
    }
    ck_assert_msg(rep != NULL && jtrue(rep, "acquired"),
                  "second lock not acquired");
    ck_assert_msg(ev != NULL, "no lock_lost before the new acquisition");
    ck_assert_str_eq(jstr(ev, "key"), "d");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    ck_assert_int_eq(jint(rep, "count"), 1);
    ck_assert_msg(strcmp(jstr(rep, "token"), tok) != 0,
                  "a new acquisition reused the old token %s", tok);
    ck_assert_int_gt(jint(rep, "fence"), fence);
    json_decref(ev);
    json_decref(rep);

    /* The stale token is no longer a key to the lock. */
    r = h_callf(b, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "d", "token",
                tok);
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    r = lk_lock(c, "d", NULL, 60000, 0);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);

    close(a.fd);
    h_close(b);
    h_close(c);
}
END_TEST

/* --- fences when Redis loses data --------------------------------------- */

/* FLUSHALL while A holds a watchdog lock and a fixed-lease lock: B's
 * fence from this daemon is still above A's, and A hears of both losses
 * soon, the fixed lease long before it would have run out. */
START_TEST(test_fence_after_flushall)
{
    struct h_conn *a, *b;
    json_t *r, *ev;
    long long fence = 0, t0;

    h_start("lock:\n  watchdog_ms: 3000\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    for (int i = 0; i < 6; i++) {
        r = lk_must(a, "w", NULL, NO_TTL, 0);
        ck_assert_int_gt(jint(r, "fence"), fence);
        fence = jint(r, "fence");
        json_decref(r);
        if (i < 5) {
            lk_unlock_ok(a, "w", NULL);
        }
    }
    r = lk_must(a, "f", NULL, 60000, 0);
    json_decref(r);

    redisReply *rep = h_redis_cmd(&R, "FLUSHALL");
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    t0 = h_now_ms();

    r = lk_must(b, "w", NULL, NO_TTL, 0);
    ck_assert_msg(jint(r, "fence") > fence,
                  "fence went back from %lld to %lld", fence,
                  (long long)jint(r, "fence"));
    json_decref(r);

    /* One pass (a third of watchdog_ms) finds w taken; that starts a
     * check of every lock, which finds f gone. */
    ev = h_lock_lost(a, "w", 10000);
    ck_assert_msg(ev != NULL, "no lock_lost for w");
    /* taken, unless a renewal ran between FLUSHALL and B's lock. */
    ck_assert_msg(strcmp(jstr(ev, "reason"), "taken") == 0 ||
                      strcmp(jstr(ev, "reason"), "expired") == 0,
                  "reason %s", jstr(ev, "reason"));
    json_decref(ev);
    ev = h_lock_lost(a, "f", 10000);
    ck_assert_msg(ev != NULL, "no lock_lost for the fixed-lease lock f");
    ck_assert_str_eq(jstr(ev, "reason"), "expired");
    json_decref(ev);
    ck_assert_msg(h_now_ms() - t0 < 10000, "losses reported after %lld ms",
                  h_now_ms() - t0);
    r = lk_unlock(a, "f", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* Redis restarts without its data: when the daemon reconnects it checks
 * every lock at once (the pass would take 20 s here), and the next fence
 * is still above the last one it handed out. */
START_TEST(test_recheck_on_reconnect)
{
    struct h_conn *a, *b;
    json_t *r, *ev;
    long long fence;

    h_start("lock:\n  watchdog_ms: 60000\n");
    a = lk_connect(&D);
    b = lk_connect(&D);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    json_decref(r);
    lk_unlock_ok(a, "w", NULL);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    fence = jint(r, "fence");
    json_decref(r);
    r = lk_must(a, "f", NULL, 60000, 0);
    json_decref(r);

    h_redis_kill(&R);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{w}"), 0);

    /* Both are reported, in whatever order their checks come back (the
     * two keys may travel on different connections). */
    bool seen_f = false, seen_w = false;
    long long deadline = h_now_ms() + 15000;
    while (!(seen_f && seen_w) && h_now_ms() < deadline) {
        ev = h_event(a, (int)(deadline - h_now_ms()));
        if (ev == NULL) {
            break;
        }
        if (jstr(ev, "event") != NULL &&
            strcmp(jstr(ev, "event"), "lock_lost") == 0) {
            ck_assert_str_eq(jstr(ev, "reason"), "expired");
            seen_f = seen_f || strcmp(jstr(ev, "key"), "f") == 0;
            seen_w = seen_w || strcmp(jstr(ev, "key"), "w") == 0;
        }
        json_decref(ev);
    }
    ck_assert_msg(seen_f, "no lock_lost for f after the restart");
    ck_assert_msg(seen_w, "no lock_lost for w after the restart");

    r = lk_must(b, "w", NULL, NO_TTL, 0);
    ck_assert_msg(jint(r, "fence") > fence,
                  "fence went back from %lld to %lld", fence,
                  (long long)jint(r, "fence"));
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- lock_lost before the lease ends ------------------------------------ */

/* Redis stops answering while a watchdog lock is held: the holder hears
 * lock_lost before the lease Redis granted can run out, that is before
 * another client could be granted the lock. */
START_TEST(test_lost_before_lease_end)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long t_before, pttl, t_ev;

    h_start("lock:\n  watchdog_ms: 10000\n");
    a = lk_connect(&D);
    r = lk_must(a, "w", NULL, NO_TTL, 0);
    json_decref(r);

    /* Redis keeps the lock at least until t_before + pttl. */
    t_before = h_now_ms();
    pttl = h_r_int(&R, "PTTL leased:lock:{w}");
    ck_assert_msg(pttl > 5000, "PTTL %lld", pttl);
    ck_assert_int_eq(kill(R.pid, SIGSTOP), 0);

    ev = h_lock_lost(a, "w", 30000);
    t_ev = h_now_ms();
    ck_assert_msg(ev != NULL, "no lock_lost while redis was stopped");
    ck_assert_str_eq(jstr(ev, "reason"), "redis_unavailable");
    json_decref(ev);
    ck_assert_msg(t_ev < t_before + pttl,
                  "lock_lost %lld ms after the lease could end in redis",
                  t_ev - (t_before + pttl));
    ck_assert_int_eq(kill(R.pid, SIGCONT), 0);
    h_close(a);
}
END_TEST

/* --- exact fences -------------------------------------------------------- */

/* Lock KEY with a fixed lease and return the fence, or -1 after asserting
 * wrong_type naming KEY. Unlocks what it got. */
static long long
fence_of(struct h_conn *c, const char *key)
{
    json_t *r = lk_lock(c, key, NULL, 60000, 0);
    long long f;
    if (!h_ok(r)) {
        ck_assert_str_eq(h_errcode(r), "wrong_type");
        ck_assert_msg(jmsg(r) != NULL && strstr(jmsg(r), key) != NULL,
                      "wrong_type does not name %s", key);
        json_decref(r);
        return -1;
    }
    ck_assert_msg(jtrue(r, "acquired"), "%s not acquired", key);
    f = jint(r, "fence");
    json_decref(r);
    lk_unlock_ok(c, key, NULL);
    return f;
}

static void
set_counter(const char *key, const char *value)
{
    redisReply *rep = h_redis_cmd(&R, "SET leased:lock:{%s}:fence %s", key,
                                  value);
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
}

static void
expect_foreign(struct h_conn *c, const char *key, const char *value)
{
    set_counter(key, value);
    ck_assert_int_eq(fence_of(c, key), -1);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{%s}", key), 0);
    redisReply *rep = h_redis_cmd(&R, "GET leased:lock:{%s}:fence", key);
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING &&
                      strcmp(rep->str, value) == 0,
                  "counter of %s changed", key);
    freeReplyObject(rep);
}

START_TEST(test_fences_exact)
{
    struct h_conn *a;

    h_start(NULL);
    a = lk_connect(&D);

    set_counter("f53a", "9007199254740991");
    ck_assert_int_eq(fence_of(a, "f53a"), 9007199254740992LL);
    ck_assert_int_eq(fence_of(a, "f53a"), 9007199254740993LL);
    ck_assert_int_eq(fence_of(a, "f53a"), 9007199254740994LL);

    set_counter("f53b", "9007199254740992");
    ck_assert_int_eq(fence_of(a, "f53b"), 9007199254740993LL);
    ck_assert_int_eq(fence_of(a, "f53b"), 9007199254740994LL);

    /* The last fence there is; after it the counter is foreign data. */
    set_counter("f63", "9223372036854775806");
    ck_assert_int_eq(fence_of(a, "f63"), 9223372036854775807LL);
    ck_assert_int_eq(fence_of(a, "f63"), -1);

    expect_foreign(a, "fmax", "9223372036854775807");
    expect_foreign(a, "fneg", "-5");
    expect_foreign(a, "fabc", "abc");
    expect_foreign(a, "fzero", "0");
    expect_foreign(a, "flead", "007");
    expect_foreign(a, "fbig", "99999999999999999999");
    h_close(a);
}
END_TEST

/* The write side of KEY with a fixed lease: its fence (unlocked again). */
static long long
write_fence_of(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "lock", "key", key,
                        "mode", "write", "ttl_ms", 60000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "write %s: %s", key,
                  h_ok(r) ? "not acquired" : h_errcode(r));
    long long f = jint(r, "fence");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", key, "mode",
                "write");
    ck_assert_msg(h_ok(r), "unlock write %s: %s", key, h_errcode(r));
    json_decref(r);
    return f;
}

/* A fence counter that went back without going away (a restart from an
 * older RDB, a failover to a lagging replica): the next fence from this
 * daemon is still above every fence it handed out, for plain and write
 * locks alike. */
START_TEST(test_fence_counter_lowered)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    long long f = 0, g = 0;
    for (int i = 0; i < 5; i++) {
        f = fence_of(a, "low");
        g = write_fence_of(a, "loww");
    }
    ck_assert_int_eq(f, 5);
    ck_assert_int_eq(g, 5);
    set_counter("low", "1");
    set_counter("loww", "1");
    f = fence_of(a, "low");
    ck_assert_msg(f > 5, "plain lock: fence went back from 5 to %lld", f);
    g = write_fence_of(a, "loww");
    ck_assert_msg(g > 5, "write lock: fence went back from 5 to %lld", g);
    h_close(a);
}
END_TEST

/* --- max_hold ------------------------------------------------------------ */

static long long since;

static bool
past_700(void *arg)
{
    (void)arg;
    return h_now_ms() - since >= 700;
}

static bool
cap_key_gone(void *arg)
{
    (void)arg;
    return h_r_int(&R, "EXISTS leased:lock:{cap}") == 0;
}

/* A reentry and an extend just before max_hold cannot carry the lock past
 * it: every lease is clipped to the time left, and at max_hold the lock is
 * released with lock_lost max_hold. */
START_TEST(test_max_hold_exact)
{
    struct h_conn *a;
    json_t *r, *ev;
    long long dt, pttl;

    h_start("lock:\n  watchdog_ms: 3000\n  max_hold_ms: 1000\n");
    a = lk_connect(&D);
    r = lk_must(a, "cap", NULL, NO_TTL, 0);
    /* The cap runs from when the daemon sent the acquisition, which is
     * before its reply came: counting from the reply never asks for less
     * than the cap allows, also when the daemon is slow (valgrind). */
    since = h_now_ms();
    ck_assert_int_le(jint(r, "lease_ms"), 1000);
    json_decref(r);
    ck_assert_msg(h_wait_until(past_700, NULL, 5000), "clock");

    r = lk_must(a, "cap", NULL, NO_TTL, 0);
    ck_assert_int_eq(jint(r, "count"), 2);
    dt = h_now_ms() - since;
    ck_assert_msg(jint(r, "lease_ms") <= 1000 - 700,
                  "reentry lease %lld ms past max_hold",
                  (long long)jint(r, "lease_ms"));
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "cap",
                "ttl_ms", 60000);
    ck_assert_ptr_nonnull(r);
    if (h_ok(r)) {
        ck_assert_msg(jint(r, "lease_ms") <= 1000 - 700,
                      "extend lease %lld ms past max_hold",
                      (long long)jint(r, "lease_ms"));
    }
    json_decref(r);
    pttl = h_r_int(&R, "PTTL leased:lock:{cap}");
    dt = h_now_ms() - since;
    ck_assert_msg(pttl <= 1000 - dt + 50 || pttl == -2,
                  "redis keeps the lock %lld ms, %lld ms left to max_hold",
                  pttl, 1000 - dt);

    ev = h_lock_lost(a, "cap", 5000);
    dt = h_now_ms() - since;
    ck_assert_msg(ev != NULL, "no lock_lost at max_hold");
    ck_assert_str_eq(jstr(ev, "reason"), "max_hold");
    json_decref(ev);
    ck_assert_msg(dt < 1500, "max_hold lock_lost after %lld ms", dt);
    /* The event goes out first, so that the holder stops before anyone
     * else can start; the release follows it. */
    ck_assert_msg(h_wait_until(cap_key_gone, NULL, 2000),
                  "the lock is still in redis after max_hold");
    h_close(a);
}
END_TEST

/* --- foreign data in lock hashes ---------------------------------------- */

START_TEST(test_foreign_hold_count)
{
    struct h_conn *a;
    json_t *r, *ev;
    char tok[80];
    redisReply *rep;

    h_start("lock:\n  watchdog_ms: 600\n");
    a = lk_connect(&D);

    /* A reentry on a hold count leased did not write. */
    r = lk_must(a, "W", NULL, 60000, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    rep = h_redis_cmd(&R, "HSET leased:lock:{W} %s notanumber", tok);
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    r = lk_lock(a, "W", NULL, 60000, 0);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    ck_assert_msg(strstr(jmsg(r), "'W'") != NULL, "key not named");
    json_decref(r);
    r = h_callf(a, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key", "W", "token",
                tok);
    ck_assert_ptr_nonnull(r);
    ck_assert_str_eq(h_errcode(r), "wrong_type");
    json_decref(r);

    /* No holder has an empty name: such a hash is not a lock at all. */
    rep = h_redis_cmd(&R, "HSET leased:lock:{E} %s 1", "");
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    r = lk_lock(a, "E", NULL, 60000, 0);
    ck_assert_msg(r != NULL && h_errcode(r) != NULL &&
                      strcmp(h_errcode(r), "wrong_type") == 0,
                  "empty field: %s", r ? h_errcode(r) : "no reply");
    json_decref(r);

    /* The watchdog finds a count it did not write: the lock is lost. */
    r = lk_must(a, "V", NULL, NO_TTL, 0);
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    rep = h_redis_cmd(&R, "HSET leased:lock:{V} %s 1.5", tok);
    ck_assert_ptr_nonnull(rep);
    freeReplyObject(rep);
    ev = h_lock_lost(a, "V", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost for a foreign hold count");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    json_decref(ev);
    h_close(a);
}
END_TEST

/* ------------------------------------------------------------------------ */

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(token_after_silent_loss, 60),
        H_CASE(fence_after_flushall, 60),
        H_CASE(recheck_on_reconnect, 90),
        H_CASE(lost_before_lease_end, 90),
        H_CASE(fences_exact, 60),
        H_CASE(fence_counter_lowered, 60),
        H_CASE(max_hold_exact, 60),
        H_CASE(foreign_hold_count, 60),
    };

    return H_MAIN(fx, cases);
}
