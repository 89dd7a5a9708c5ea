/* Locks on several keys at once ("keys" in lock, unlock and extend)
 * against one real leased and a real redis-server: all or none, a fence
 * per key, unlock by keys and by token, extend, session close, waiting,
 * lost keys, limits, and overlapping groups from client processes. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"
#include "order_util.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;
static struct h_redis I[3]; /* Redlock's instances */

static void
stop_instances(void)
{
    for (int i = 0; i < 3; i++) {
        if (I[i].pid != 0) {
            h_redis_stop(&I[i]);
        }
    }
}

static const struct h_fixture fx = {
    .suite = "multilock",
    .redis = {&R},
    .daemons = {&D},
    .teardown = stop_instances,
};

/* {"op":OP,"keys":[...]} plus owner (NULL: absent), ttl_ms and wait_ms
 * (0: absent). */
static json_t *
ml_req(const char *op, const char *const *keys, size_t n, const char *owner,
       long long ttl_ms, long long wait_ms)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++) {
        json_array_append_new(arr, json_string(keys[i]));
    }
    json_t *req = json_pack("{s:s,s:o}", "op", op, "keys", arr);
    if (owner != NULL) {
        json_object_set_new(req, "owner", json_string(owner));
    }
    if (ttl_ms != 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    if (wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    return req;
}

static json_t *
ml_call(struct h_conn *c, json_t *req)
{
    json_t *r = h_call(c, req, 30000);
    ck_assert_msg(r != NULL, "no reply");
    return r;
}

static json_t *
ml_lock(struct h_conn *c, const char *const *keys, size_t n, long long ttl,
        long long wait)
{
    return ml_call(c, ml_req("lock", keys, n, NULL, ttl, wait));
}

static bool
held(const char *key)
{
    return h_r_int(&R, "EXISTS leased:lock:{%s}", key) == 1;
}

static bool
held_by(const char *key, const char *token)
{
    return h_r_int(&R, "HGET leased:lock:{%s} %s", key, token) == 1;
}

struct gone_want {
    const char *const *keys;
    size_t n;
};

static bool
all_gone(void *arg)
{
    const struct gone_want *w = arg;
    for (size_t i = 0; i < w->n; i++) {
        if (held(w->keys[i])) {
            return false;
        }
    }
    return true;
}

static void
assert_all_gone(const char *const *keys, size_t n)
{
    struct gone_want w = {keys, n};
    ck_assert_msg(h_wait_until(all_gone, &w, 10000), "a key is still held");
}

START_TEST(test_all_or_none)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    json_decref(lk_must(b, "m:b", NULL, 20000, 0));

    /* m:a sorts first and is taken, then m:b is found held. */
    static const char *const keys[] = {"m:c", "m:b", "m:a"};
    json_t *r = ml_lock(a, keys, 3, 0, 0);
    ck_assert_msg(h_ok(r), "lock: %s", h_errcode(r));
    ck_assert(!jtrue(r, "acquired"));
    ck_assert_int_gt(jint(r, "ttl_ms"), 0);
    json_decref(r);
    /* Given back before the answer. */
    ck_assert(!held("m:a"));
    ck_assert(!held("m:c"));
    /* Nothing of the failed attempt stays with the owner either. */
    r = ml_lock(a, keys, 3, 0, 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "retry: %s", h_errcode(r));
    json_decref(r);
    ck_assert(held("m:b"));
    h_assert_stat(a, "locks_held", 1, T_MS);

    /* Once it is free the whole group is taken. */
    json_decref(lk_unlock(b, "m:b", NULL));
    r = ml_lock(a, keys, 3, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    const char *tok = jstr(r, "token");
    ck_assert(h_is_token(tok));
    for (size_t i = 0; i < 3; i++) {
        ck_assert_msg(held_by(keys[i], tok), "%s not held", keys[i]);
    }
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

START_TEST(test_fences_unlock)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    static const char *const keys[] = {"f:x", "f:y", "f:z"};
    json_t *r = ml_lock(a, keys, 3, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    ck_assert_int_eq(jint(r, "lease_ms") > 25000, 1);
    json_t *fences = json_object_get(r, "fences");
    ck_assert_int_eq(json_object_size(fences), 3);
    long long f1[3];
    for (size_t i = 0; i < 3; i++) {
        f1[i] = json_integer_value(json_object_get(fences, keys[i]));
        ck_assert_int_ge(f1[i], 1);
        ck_assert(held_by(keys[i], jstr(r, "token")));
    }
    json_decref(r);

    /* Another session cannot take one of its keys. */
    r = lk_lock(b, "f:y", NULL, 0, 0);
    ck_assert(!jtrue(r, "acquired"));
    json_decref(r);
    /* A plain lock of the same owner on a key of the group: refused. */
    h_expect_code(lk_lock(a, "f:y", NULL, 0, 0), "bad_request", "reentry");

    r = ml_call(a, ml_req("unlock", keys, 3, NULL, 0, 0));
    ck_assert_msg(h_ok(r), "unlock: %s", h_errcode(r));
    ck_assert(jtrue(r, "released"));
    ck_assert_int_eq(jint(r, "count"), 0);
    json_decref(r);
    assert_all_gone(keys, 3);
    h_assert_stat(a, "locks_held", 0, T_MS);

    /* Fences only go up; unlock by token from another session. */
    r = ml_lock(a, keys, 3, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    fences = json_object_get(r, "fences");
    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_gt(json_integer_value(json_object_get(fences, keys[i])),
                         f1[i]);
    }
    json_t *u = json_pack("{s:s,s:[s,s,s],s:s}", "op", "unlock", "keys", "f:z",
                          "f:x", "f:y", "token", jstr(r, "token"));
    json_t *ur = ml_call(b, u);
    ck_assert_msg(h_ok(ur), "unlock by token: %s", h_errcode(ur));
    ck_assert(jtrue(ur, "released"));
    json_decref(ur);
    assert_all_gone(keys, 3);
    h_assert_stat(a, "locks_held", 0, T_MS);

    /* Again: nothing held, and the error names the keys. */
    u = json_pack("{s:s,s:[s,s],s:s}", "op", "unlock", "keys", "f:x", "f:y",
                  "token", jstr(r, "token"));
    ur = ml_call(b, u);
    ck_assert_str_eq(h_errcode(ur), "not_held");
    ck_assert_str_eq(jreason(ur), "absent");
    ck_assert_int_eq(
        json_array_size(json_object_get(json_object_get(ur, "error"), "keys")),
        2);
    json_decref(ur);
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* A fence counter that went back (lowered or gone) under a group: the
 * group's next fences are still above every fence this daemon handed out
 * for its keys, as for a single lock. */
START_TEST(test_fence_counter_lowered)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    static const char *const keys[] = {"g:a", "g:b"};
    for (int n = 1; n <= 3; n++) {
        json_t *r = ml_lock(a, keys, 2, 60000, 0);
        ck_assert_msg(jtrue(r, "acquired"), "group %d not acquired", n);
        json_t *fences = json_object_get(r, "fences");
        for (size_t i = 0; i < 2; i++) {
            ck_assert_int_eq(json_integer_value(
                                 json_object_get(fences, keys[i])),
                             n);
        }
        json_decref(r);
        r = ml_call(a, ml_req("unlock", keys, 2, NULL, 0, 0));
        ck_assert_msg(h_ok(r), "unlock: %s", h_errcode(r));
        json_decref(r);
    }
    h_r_do(&R, "SET leased:lock:{g:a}:fence 1");
    h_r_do(&R, "DEL leased:lock:{g:b}:fence");
    json_t *r = ml_lock(a, keys, 2, 60000, 0);
    ck_assert(jtrue(r, "acquired"));
    json_t *fences = json_object_get(r, "fences");
    for (size_t i = 0; i < 2; i++) {
        long long f = json_integer_value(json_object_get(fences, keys[i]));
        ck_assert_msg(f > 3, "%s: fence went back from 3 to %lld", keys[i], f);
    }
    json_decref(r);
    h_close(a);
}
END_TEST

START_TEST(test_extend)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    static const char *const keys[] = {"e:1", "e:2"};
    json_t *r = ml_lock(a, keys, 2, 3000, 0);
    ck_assert(jtrue(r, "acquired"));
    ck_assert_int_le(jint(r, "lease_ms"), 3000);
    json_t *x = json_pack("{s:s,s:[s,s],s:s,s:i}", "op", "extend", "keys",
                          "e:1", "e:2", "token", jstr(r, "token"), "ttl_ms",
                          60000);
    json_t *xr = ml_call(a, x);
    ck_assert_msg(h_ok(xr), "extend: %s", h_errcode(xr));
    ck_assert_int_eq(jint(xr, "lease_ms"), 60000);
    json_decref(xr);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{e:1}"), 30000);
    ck_assert_int_gt(h_r_int(&R, "PTTL leased:lock:{e:2}"), 30000);
    json_decref(r);

    /* By owner, with a key the owner does not hold. */
    x = json_pack("{s:s,s:[s,s],s:i}", "op", "extend", "keys", "e:1", "e:9",
                  "ttl_ms", 60000);
    xr = ml_call(a, x);
    ck_assert_str_eq(h_errcode(xr), "not_held");
    json_decref(xr);
    h_close(a);
}
END_TEST

START_TEST(test_session_close)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    static const char *const keys[] = {"s:1", "s:2", "s:3"};
    json_t *r = ml_lock(a, keys, 3, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    ck_assert(held("s:1") && held("s:2") && held("s:3"));
    h_close(a);
    assert_all_gone(keys, 3);
}
END_TEST

/* A waiting group holds none of its keys, and gets them all once the
 * key that stopped it is released. */
START_TEST(test_waiter)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    struct h_conn *c = lk_connect(&D);
    json_decref(lk_must(a, "w:b", NULL, 0, 0));
    json_decref(lk_must(c, "w:c", NULL, 0, 0));

    json_t *req = json_pack("{s:s,s:[s,s,s],s:i,s:i}", "op", "lock", "keys",
                            "w:a", "w:b", "w:c", "wait_ms", 20000, "id", 7);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ck_assert_int_eq(h_send_raw(b, line, strlen(line)), 0);
    ck_assert_int_eq(h_send_raw(b, "\n", 1), 0);
    free(line);
    static const char *const given_back[] = {"w:a"};
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    assert_all_gone(given_back, 1);

    /* Woken by w:b, the retry stops at w:c: it waits there, still
     * holding nothing. */
    json_decref(lk_unlock(a, "w:b", NULL));
    h_wait_subscribed(&R, "leased:lock:{w:c}:unlock", T_MS);
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    static const char *const given_back2[] = {"w:a", "w:b"};
    assert_all_gone(given_back2, 2);

    json_decref(lk_unlock(c, "w:c", NULL));
    json_t *r = h_recv_id(b, 7, 10000);
    ck_assert_msg(r != NULL, "no grant");
    ck_assert_msg(jtrue(r, "acquired"), "not acquired");
    ck_assert(held_by("w:a", jstr(r, "token")));
    ck_assert(held_by("w:b", jstr(r, "token")));
    ck_assert(held_by("w:c", jstr(r, "token")));
    json_decref(r);
    h_assert_stat(a, "lock_waiters", 0, T_MS);

    /* Running out of time: acquired false, nothing held. */
    static const char *const keys2[] = {"w:d", "w:c"};
    r = ml_lock(a, keys2, 2, 0, 300);
    ck_assert(h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    assert_all_gone(keys2, 1);
    h_close(a);
    h_close(b);
    h_close(c);
}
END_TEST

START_TEST(test_bad_requests)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    json_t *r = h_callf(a, T_MS, "{s:s}", "op", "hello");
    bool found = false;
    json_t *f;
    size_t i;
    json_array_foreach(json_object_get(r, "features"), i, f)
    {
        found = found || strcmp(json_string_value(f), "multilock") == 0;
    }
    ck_assert_msg(found, "hello does not announce multilock");
    json_decref(r);

    char *names[65];
    for (i = 0; i < 65; i++) {
        if (asprintf(&names[i], "b:%zu", i) < 0) {
            ck_abort();
        }
    }
    h_expect_code(ml_lock(a, (const char *const *)names, 65, 0, 0),
                  "bad_request", "65 keys");
    r = ml_lock(a, (const char *const *)names, 64, 0, 0);
    ck_assert_msg(jtrue(r, "acquired"), "64 keys: %s", h_errcode(r));
    ck_assert_int_eq(json_object_size(json_object_get(r, "fences")), 64);
    json_decref(r);
    h_assert_stat(a, "locks_held", 64, T_MS);
    /* The same owner again on an overlapping group: not reentrant. */
    h_expect_code(ml_lock(a, (const char *const *)names + 63, 2, 0, 0),
                  "bad_request", "overlap");
    r = ml_call(a,
                ml_req("unlock", (const char *const *)names, 64, NULL, 0, 0));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    for (i = 0; i < 65; i++) {
        free(names[i]);
    }

    static const char *const dup[] = {"d:1", "d:2", "d:1"};
    h_expect_code(ml_lock(a, dup, 3, 0, 0), "bad_request", "duplicate");
    ck_assert(!held("d:1") && !held("d:2"));
    h_expect_code(ml_lock(a, dup, 0, 0, 0), "bad_request", "empty");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:s,s:[s]}", "op", "lock", "key",
                          "d:1", "keys", "d:2"),
                  "bad_request", "key and keys");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:[s],s:s}", "op", "lock", "keys",
                          "d:2", "token", "0123456789abcdef0123456789abcdef"),
                  "bad_request", "token");
    h_expect_code(h_callf(a, T_MS, "{s:s,s:[s,i]}", "op", "lock", "keys",
                          "d:2", 5),
                  "bad_request", "not a string");
    h_assert_ping(a);
    h_close(a);
}
END_TEST

/* A key of a group found lost is reported alone; the others stay. */
START_TEST(test_lost_key)
{
    h_start("lock:\n  watchdog_ms: 600\n");
    struct h_conn *a = lk_connect(&D);
    static const char *const keys[] = {"l:1", "l:2"};
    json_t *r = ml_lock(a, keys, 2, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    char tok[80];
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    h_delete_lock_key(&R, "l:1");
    json_t *ev = h_lock_lost(a, "l:1", 5000);
    ck_assert_msg(ev != NULL, "no lock_lost for l:1");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    json_decref(ev);
    /* l:2 is still renewed: held after several watchdog periods. */
    h_assert_stat(a, "locks_held", 1, T_MS);
    ck_assert(h_lock_lost(a, "l:2", 1500) == NULL);
    ck_assert(held_by("l:2", tok));

    r = ml_call(a, ml_req("unlock", keys, 2, NULL, 0, 0));
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    ck_assert(!held("l:2"));
    h_close(a);
}
END_TEST

/* Redis gone: the group fails whole and leaves nothing behind. */
START_TEST(test_redis_down)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    static const char *const keys[] = {"r:1", "r:2"};
    h_redis_kill(&R);
    json_t *r = ml_lock(a, keys, 2, 0, 0);
    ck_assert_msg(!h_ok(r), "granted without redis");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert(!held("r:1") && !held("r:2"));
    /* Once Redis is back the group is taken. */
    long long deadline = h_now_ms() + 10000;
    bool got = false;
    while (!got && h_now_ms() < deadline) {
        r = ml_lock(a, keys, 2, 0, 0);
        got = h_ok(r) && jtrue(r, "acquired");
        json_decref(r);
        if (!got) {
            usleep(50000);
        }
    }
    ck_assert(got);
    h_close(a);
}
END_TEST

/* A waiting group whose client goes away leaves nothing behind. */
START_TEST(test_waiter_vanishes)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    json_decref(lk_must(a, "v:2", NULL, 0, 0));
    json_t *req = json_pack("{s:s,s:[s,s],s:i,s:i}", "op", "lock", "keys",
                            "v:1", "v:2", "wait_ms", -1, "id", 3);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ck_assert_int_eq(h_send_raw(b, line, strlen(line)), 0);
    ck_assert_int_eq(h_send_raw(b, "\n", 1), 0);
    free(line);
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    h_close(b);
    h_assert_stat(a, "lock_waiters", 0, T_MS);
    json_decref(lk_unlock(a, "v:2", NULL));
    static const char *const keys[] = {"v:1", "v:2"};
    assert_all_gone(keys, 2);
    /* And the keys are free for anyone. */
    json_t *r = ml_lock(a, keys, 2, 0, 0);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    h_assert_stat(a, "locks_held", 2, T_MS);
    h_close(a);
}
END_TEST

/* A detached group outlives its session and is unlocked by token. */
START_TEST(test_detached)
{
    h_start(NULL);
    struct h_conn *a = lk_connect(&D);
    json_t *req = json_pack("{s:s,s:[s,s],s:b,s:i}", "op", "lock", "keys",
                            "t:1", "t:2", "detach", 1, "ttl_ms", 60000);
    json_t *r = ml_call(a, req);
    ck_assert(jtrue(r, "acquired"));
    char tok[80];
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    h_close(a);
    struct h_conn *b = lk_connect(&D);
    h_assert_stat(b, "locks_held", 0, T_MS);
    ck_assert(held_by("t:1", tok) && held_by("t:2", tok));
    r = ml_call(b, json_pack("{s:s,s:[s,s],s:s}", "op", "unlock", "keys",
                             "t:2", "t:1", "token", tok));
    ck_assert_msg(jtrue(r, "released"), "unlock: %s", h_errcode(r));
    json_decref(r);
    ck_assert(!held("t:1") && !held("t:2"));
    /* Detached without a lease: refused like a single lock. */
    h_expect_code(h_callf(b, T_MS, "{s:s,s:[s],s:b}", "op", "lock", "keys",
                          "t:3", "detach", 1),
                  "bad_request", "detach without ttl_ms");
    h_close(b);
}
END_TEST

/* limits.max_waiters counts a waiting group once. */
START_TEST(test_max_waiters)
{
    h_start("limits:\n  max_waiters: 1\n");
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    json_decref(lk_must(a, "q:2", NULL, 0, 0));
    lk_send(b, 5, "q:2", NULL, 0, 20000);
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    static const char *const keys[] = {"q:1", "q:2"};
    struct h_conn *c = lk_connect(&D);
    h_expect_code(ml_lock(c, keys, 2, 0, 20000), "busy", "a second waiter");
    assert_all_gone(keys, 1);
    h_close(c);
    h_close(a);
    json_t *r = h_recv_id(b, 5, 10000);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "b not granted");
    json_decref(r);
    h_close(b);
}
END_TEST

static int
instances_with(const char *key)
{
    int n = 0;
    for (int i = 0; i < 3; i++) {
        n += h_r_int(&I[i], "EXISTS leased:lock:{%s}", key) == 1;
    }
    return n;
}

static bool
none_with(void *key)
{
    return instances_with(key) == 0;
}

/* With lock.redlock every key of a group is a Redlock lock of its own. */
START_TEST(test_redlock_group)
{
    char yaml[512];
    memset(I, 0, sizeof(I));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], NULL), 0);
    }
    snprintf(yaml, sizeof yaml,
             "lock:\n  redlock: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n",
             I[0].port, I[1].port, I[2].port);
    h_start(yaml);
    h_wait_redlock(&D, 3);
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    json_decref(lk_must(b, "rl:2", NULL, 0, 0));
    static const char *const keys[] = {"rl:1", "rl:2"};
    json_t *r = ml_lock(a, keys, 2, 0, 0);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "group over a held key");
    json_decref(r);
    ck_assert_msg(h_wait_until(none_with, "rl:1", 10000),
                  "rl:1 not given back");
    json_decref(lk_unlock(b, "rl:2", NULL));

    r = ml_lock(a, keys, 2, 0, 0);
    ck_assert_msg(jtrue(r, "acquired"), "redlock group: %s", h_errcode(r));
    ck_assert_int_eq(json_object_size(json_object_get(r, "fences")), 2);
    ck_assert_int_gt(jint(r, "lease_ms"), 0);
    json_decref(r);
    ck_assert_int_eq(instances_with("rl:1"), 3);
    ck_assert_int_eq(instances_with("rl:2"), 3);
    r = ml_call(a, ml_req("unlock", keys, 2, NULL, 0, 0));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    ck_assert_int_eq(instances_with("rl:1"), 0);
    ck_assert_int_eq(instances_with("rl:2"), 0);
    h_close(a);
    h_close(b);
}
END_TEST

/* --- Redis that does not answer in time -------------------------------- */

/* Redis with DEBUG allowed, and leased with a short command timeout on
 * one connection. */
static void
start_slow(void)
{
    char yaml[256];
    ck_assert_int_eq(h_redis_start(&R, "--enable-debug-command yes"), 0);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  timeout_ms: 500\n"
             "  connections: 1\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
}

/* After the sleep, the daemon is connected again. */
static void
sleep_end(redisContext *c, struct h_conn *conn)
{
    h_redis_sleep_end(c);
    ck_assert_msg(h_wait_stat(conn, "redis_connected", 1, 15000),
                  "leased did not reconnect");
}

/* A group whose acquisition got no answer leaves nothing held once Redis
 * wakes: the key sent is given back, the others were never sent. */
START_TEST(test_lock_timeout_not_stranded)
{
    start_slow();
    struct h_conn *a = lk_connect(&D);
    struct h_conn *b = lk_connect(&D);
    static const char *const keys[] = {"n:1", "n:2", "n:3"};
    redisContext *z = h_redis_sleep_start(&R, 2);
    json_t *r = ml_lock(a, keys, 3, 60000, 0);
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    sleep_end(z, a);
    assert_all_gone(keys, 3);
    h_assert_stat(a, "locks_held", 0, T_MS);
    long long t0 = h_now_ms();
    r = ml_lock(b, keys, 3, 5000, 15000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "stranded: %s",
                  h_errcode(r));
    ck_assert_int_lt(h_now_ms() - t0, 15000);
    json_decref(r);
    h_close(a);
    h_close(b);
}
END_TEST

/* An unlock of a group with no answer in time says "outcome":"unknown";
 * the late answers settle every key. */
START_TEST(test_unlock_outcome_unknown)
{
    start_slow();
    struct h_conn *a = lk_connect(&D);
    static const char *const keys[] = {"k:1", "k:2"};
    json_t *r = ml_lock(a, keys, 2, 60000, 0);
    ck_assert(jtrue(r, "acquired"));
    json_decref(r);
    h_assert_stat(a, "locks_held", 2, T_MS);
    redisContext *z = h_redis_sleep_start(&R, 3);
    r = ml_call(a, ml_req("unlock", keys, 2, NULL, 0, 0));
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    ck_assert_msg(joutcome(r) != NULL && strcmp(joutcome(r), "unknown") == 0,
                  "outcome not unknown");
    json_decref(r);
    sleep_end(z, a);
    assert_all_gone(keys, 2);
    ck_assert_msg(h_wait_stat(a, "locks_held", 0, 10000),
                  "the late answers did not settle the records");
    h_close(a);
}
END_TEST

/* --- overlapping groups from client processes ------------------------ */

#define OV_KEYS 4
#define OV_CHILDREN 4
#define OV_ITERS 25

static const char *const ov_keys[OV_KEYS] = {"o:a", "o:b", "o:c", "o:d"};

/* Child ARG locks three of the four keys, listed in its own order, and
 * counts itself in each key's holder counter while it holds them. */
static int
overlap_child(const struct h_daemon *d, int arg)
{
    struct h_conn *c = h_connect(d);
    /* The counters share a hash tag: one connection serves them on a
     * cluster too. */
    redisContext *rc = h_redis_connect_for(&R, "holders:{o}");
    if (c == NULL || rc == NULL) {
        return 2;
    }
    const char *mine[3];
    for (int i = 0; i < 3; i++) {
        int k = (arg % 2 == 0) ? (arg + i) % OV_KEYS
                               : (arg + OV_KEYS - i) % OV_KEYS;
        mine[i] = ov_keys[k];
    }
    for (int it = 0; it < OV_ITERS; it++) {
        json_t *r = h_call(c, ml_req("lock", mine, 3, NULL, 0, -1), 60000);
        bool ok = r != NULL && h_ok(r) && jtrue(r, "acquired");
        json_decref(r);
        if (!ok) {
            return 3;
        }
        for (int i = 0; i < 3; i++) {
            redisReply *x = redisCommand(rc, "INCR holders:{o}%s", mine[i]);
            bool alone = x != NULL && x->type == REDIS_REPLY_INTEGER &&
                         x->integer == 1;
            freeReplyObject(x);
            if (!alone) {
                return 4;
            }
        }
        for (int i = 0; i < 3; i++) {
            freeReplyObject(redisCommand(rc, "DECR holders:{o}%s", mine[i]));
        }
        r = h_call(c, ml_req("unlock", mine, 3, NULL, 0, 0), 60000);
        ok = r != NULL && h_ok(r) && jtrue(r, "released");
        json_decref(r);
        if (!ok) {
            return 5;
        }
    }
    redisFree(rc);
    h_close(c);
    return 0;
}

START_TEST(test_overlap_no_deadlock)
{
    h_start(NULL);
    pid_t pids[OV_CHILDREN];
    for (int i = 0; i < OV_CHILDREN; i++) {
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            _exit(overlap_child(&D, i));
        }
        h_track_pid(pids[i]);
    }
    for (int i = 0; i < OV_CHILDREN; i++) {
        long long deadline = h_now_ms() + 90000;
        int status = 0;
        pid_t w = 0;
        while (w != pids[i] && h_now_ms() < deadline) {
            w = waitpid(pids[i], &status, WNOHANG);
            if (w != pids[i]) {
                usleep(20000);
            }
        }
        ck_assert_msg(w == pids[i], "child %d stuck (deadlock?)", i);
        h_untrack_pid(pids[i]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "child %d failed: %d", i, WEXITSTATUS(status));
    }
    assert_all_gone(ov_keys, OV_KEYS);
}
END_TEST

/* --- holds a new grant through the same daemon rules out --------------- */

/* Redis loses a group's keys (FLUSHALL) and another session locks one of
 * them alone: the group's session hears lock_lost for that key before
 * the grant reaches the other; and the other way round, a group granted
 * over a key the daemon counts as held by a single lock. */
START_TEST(test_lost_before_local_grant)
{
    struct raw a, b;
    struct race rc;

    h_start("lock:\n  watchdog_ms: 60000\n");
    raw_open(&a, D.sock);
    raw_open(&b, D.sock);
    raw_must(&a, "{\"id\":1,\"op\":\"lock\",\"keys\":[\"m1\",\"m2\"]}\n");
    h_r_do(&R, "FLUSHALL");
    raw_race(&a, &b, "{\"id\":2,\"op\":\"lock\",\"key\":\"m2\"}\n",
             "lock_lost", "m2", 3000, &rc);
    raw_race_assert(&rc, "key m2 of a group");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "taken");
    raw_race_free(&rc);

    raw_must(&a, "{\"id\":3,\"op\":\"lock\",\"key\":\"s\"}\n");
    h_r_do(&R, "FLUSHALL");
    raw_race(&a, &b, "{\"id\":4,\"op\":\"lock\",\"keys\":[\"s\",\"t\"]}\n",
             "lock_lost", "s", 3000, &rc);
    raw_race_assert(&rc, "single lock s under a new group");
    ck_assert_str_eq(jstr(rc.ev, "reason"), "taken");
    raw_race_free(&rc);
    close(a.fd);
    close(b.fd);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(all_or_none, 60),
        H_CASE(fences_unlock, 60),
        H_CASE(fence_counter_lowered, 60),
        H_CASE(extend, 60),
        H_CASE(session_close, 60),
        H_CASE(waiter, 60),
        H_CASE(bad_requests, 60),
        H_CASE(lost_key, 60),
        H_CASE(redis_down, 60),
        H_CASE(waiter_vanishes, 60),
        H_CASE(detached, 60),
        H_CASE(max_waiters, 60),
        H_CASE(redlock_group, 60),
        H_CASE(lock_timeout_not_stranded, 60),
        H_CASE(unlock_outcome_unknown, 60),
        H_CASE(overlap_no_deadlock, 150),
        H_CASE(lost_before_local_grant, 60),
    };
    return H_MAIN(fx, cases);
}
