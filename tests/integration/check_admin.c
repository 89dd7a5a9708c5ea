/* Operator ops against real redis-server and real leased: lock.list,
 * lock.force_unlock (held here, held through another daemon, absent,
 * foreign data, Redis down), who may run them (the Unix socket; TCP only
 * with listen.admin_token), and hello's features. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "lock_util.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ADMIN "op-s3cret-token"
#define WATCHDOG_MS 600
/* A watchdog step is a third of the lease; twice that and some slack for
 * a loaded machine. */
#define STEP_MS (WATCHDOG_MS / 3)

static struct h_redis R;
static struct h_daemon D1, D2;
static const struct h_fixture fx = {
    .suite = "admin",
    .redis = {&R},
    .daemons = {&D1, &D2},
};

static const char yaml_admin[] = "listen:\n"
                                 "  unix: @DIR@/leased.sock\n"
                                 "  tcp: 127.0.0.1:0\n"
                                 "  admin_token: " ADMIN "\n"
                                 "lock:\n"
                                 "  watchdog_ms: 600\n";

static void
start_both(const char *yaml)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    ck_assert_int_eq(h_daemon_start(&D2, &R, yaml), 0);
}

/* hello on C with the admin token (or none); returns the reply. */
static json_t *
hello_admin(struct h_conn *c, const char *token)
{
    json_t *req = json_pack("{s:s,s:s}", "op", "hello", "client", "ops-1");
    if (token != NULL) {
        json_object_set_new(req, "admin_token", json_string(token));
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "no reply to hello");
    return r;
}

static json_t *
list_locks(struct h_conn *c, const char *prefix, long long limit)
{
    json_t *req = json_pack("{s:s}", "op", "lock.list");
    if (prefix != NULL) {
        json_object_set_new(req, "prefix", json_string(prefix));
    }
    if (limit > 0) {
        json_object_set_new(req, "limit", json_integer(limit));
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "no reply to lock.list");
    return r;
}

static json_t *
force(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.force_unlock", "key",
                        key);
    ck_assert_msg(r != NULL, "no reply to lock.force_unlock %s", key);
    return r;
}

/* The entry of KEY in a lock.list reply, or NULL. */
static json_t *
entry_of(json_t *r, const char *key)
{
    json_t *locks = json_object_get(r, "locks");
    ck_assert(json_is_array(locks));
    for (size_t i = 0; i < json_array_size(locks); i++) {
        json_t *e = json_array_get(locks, i);
        if (strcmp(jstr(e, "key"), key) == 0) {
            return e;
        }
    }
    return NULL;
}

START_TEST(test_features)
{
    h_start(NULL);
    struct h_conn *c = lk_connect(&D1);
    json_t *r = h_callf(c, T_MS, "{s:s}", "op", "hello");
    ck_assert(h_ok(r));
    json_t *f = json_object_get(r, "features");
    ck_assert(json_is_array(f));
    bool admin = false;
    for (size_t i = 0; i < json_array_size(f); i++) {
        const char *name = json_string_value(json_array_get(f, i));
        ck_assert_ptr_nonnull(name);
        admin |= strcmp(name, "admin") == 0;
    }
    ck_assert_msg(admin, "features lacks \"admin\"");
    json_decref(r);
    h_close(c);
}
END_TEST

START_TEST(test_list)
{
    h_start(yaml_admin);
    struct h_conn *a = lk_connect(&D1);
    struct h_conn *b = lk_connect(&D1);
    struct h_conn *op = lk_connect(&D1);
    json_t *r = h_callf(a, T_MS, "{s:s,s:s}", "op", "hello", "client",
                        "billing-7");
    ck_assert(h_ok(r));
    char sess_a[128];
    snprintf(sess_a, sizeof sess_a, "%s", jstr(r, "session"));
    json_decref(r);

    json_decref(lk_must(a, "order:1", NULL, NO_TTL, 0));
    json_decref(lk_must(a, "order:1", NULL, NO_TTL, 0)); /* count 2 */
    json_decref(lk_must(a, "order:2", NULL, 60000, 0));
    json_decref(lk_must(b, "job:9", NULL, NO_TTL, 0));
    /* A request of this daemon waits for order:1. */
    struct h_conn *w = lk_connect(&D1);
    ck_assert_int_eq(h_send(w, "{s:i,s:s,s:s,s:i}", "id", 5, "op", "lock",
                            "key", "order:1", "wait_ms", 60000),
                     0);
    h_assert_stat(op, "lock_waiters", 1, T_MS);

    r = list_locks(op, NULL, 0);
    ck_assert_msg(h_ok(r), "lock.list: %s", h_errcode(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 3);
    ck_assert(!jtrue(r, "truncated"));
    json_t *e = entry_of(r, "order:1");
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(jstr(e, "mode"), "plain");
    ck_assert_str_eq(jstr(e, "session"), sess_a);
    ck_assert_str_eq(jstr(e, "client"), "billing-7");
    ck_assert_int_eq(jint(e, "count"), 2);
    ck_assert_int_gt(jint(e, "ttl_ms"), 0);
    ck_assert_int_le(jint(e, "ttl_ms"), WATCHDOG_MS);
    ck_assert_int_ge(jint(e, "held_ms"), 0);
    ck_assert_int_eq(jint(e, "waiters"), 1);
    e = entry_of(r, "order:2");
    ck_assert_ptr_nonnull(e);
    ck_assert_int_gt(jint(e, "ttl_ms"), WATCHDOG_MS);
    ck_assert_int_le(jint(e, "ttl_ms"), 60000);
    e = entry_of(r, "job:9");
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(jstr(e, "client"), "");
    ck_assert_int_eq(jint(e, "waiters"), 0);
    json_decref(r);
    h_close(w);

    /* A prefix of the app's key, not of the Redis key. */
    r = list_locks(op, "order:", 0);
    ck_assert(h_ok(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 2);
    ck_assert_ptr_null(entry_of(r, "job:9"));
    json_decref(r);
    r = list_locks(op, "leased:lock:", 0);
    ck_assert(h_ok(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 0);
    json_decref(r);

    r = list_locks(op, NULL, 2);
    ck_assert(h_ok(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 2);
    ck_assert(jtrue(r, "truncated"));
    json_decref(r);

    h_expect_code(h_callf(op, T_MS, "{s:s,s:i}", "op", "lock.list", "limit",
                          0),
                  "bad_request", "limit 0");
    h_expect_code(h_callf(op, T_MS, "{s:s,s:i}", "op", "lock.list", "prefix",
                          5),
                  "bad_request", "prefix not a string");

    /* A session that ends takes its locks out of the list. */
    h_close(a);
    h_assert_stat(op, "locks_held", 1, T_MS);
    r = list_locks(op, NULL, 0);
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 1);
    ck_assert_ptr_nonnull(entry_of(r, "job:9"));
    json_decref(r);

    /* Locks held through another daemon are not listed here. */
    ck_assert_int_eq(h_daemon_start(&D2, &R, yaml_admin), 0);
    struct h_conn *op2 = lk_connect(&D2);
    r = list_locks(op2, NULL, 0);
    ck_assert(h_ok(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 0);
    json_decref(r);
    h_close(op2);
    h_close(b);
    h_close(op);
}
END_TEST

/* {"op":"lock","key":KEY,"mode":MODE} with wait_ms (0: absent), sent
 * under ID without waiting for the reply (ID 0: h_call, reply returned). */
static json_t *
rw_lock(struct h_conn *c, json_int_t id, const char *key, const char *mode,
        long long wait_ms)
{
    json_t *req = json_pack("{s:s,s:s,s:s}", "op", "lock", "key", key, "mode",
                            mode);
    if (wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait_ms));
    }
    if (id == 0) {
        json_t *r = h_call(c, req, T_MS);
        ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                      "%s lock %s: %s", mode, key, h_dump(r));
        return r;
    }
    json_decref(req);
    ck_assert_int_eq(h_send(c, "{s:I,s:s,s:s,s:s,s:I}", "id", id, "op", "lock",
                            "key", key, "mode", mode, "wait_ms",
                            (json_int_t)wait_ms),
                     0);
    return NULL;
}

/* The row of KEY must be there with MODE, COUNT and WAITERS. */
static void
expect_row(json_t *r, const char *key, const char *mode, long long count,
           long long waiters)
{
    json_t *e = entry_of(r, key);
    ck_assert_msg(e != NULL, "lock.list has no row for %s: %s", key,
                  h_dump(r));
    ck_assert_msg(jstr(e, "mode") != NULL &&
                      strcmp(jstr(e, "mode"), mode) == 0,
                  "%s: mode %s, not %s", key, jstr(e, "mode"), mode);
    ck_assert_msg(jint(e, "count") == count, "%s: count %lld, not %lld", key,
                  jint(e, "count"), count);
    ck_assert_msg(json_is_integer(json_object_get(e, "waiters")) &&
                      jint(e, "waiters") == waiters,
                  "%s: waiters %lld, not %lld: %s", key, jint(e, "waiters"),
                  waiters, h_dump(e));
}

/* Read-write locks are listed with their side, and each row counts the
 * requests of this daemon that wait for that key: a reader behind a
 * writer, a writer behind readers (a reader that arrives after a waiting
 * writer queues too, and counts). */
START_TEST(test_list_rwlock_waiters)
{
    h_start(yaml_admin);
    struct h_conn *a = lk_connect(&D1);
    struct h_conn *b = lk_connect(&D1);
    struct h_conn *w1 = lk_connect(&D1);
    struct h_conn *w2 = lk_connect(&D1);
    struct h_conn *w3 = lk_connect(&D1);
    struct h_conn *op = lk_connect(&D1);

    json_decref(rw_lock(a, 0, "rw:w", "write", 0));
    json_decref(rw_lock(a, 0, "rw:r", "read", 0));
    json_decref(rw_lock(b, 0, "rw:r", "read", 0));
    json_t *r = list_locks(op, "rw:", 0);
    ck_assert_msg(h_ok(r), "lock.list: %s", h_dump(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 3);
    expect_row(r, "rw:w", "write", 1, 0);
    expect_row(r, "rw:r", "read", 1, 0);
    json_decref(r);

    rw_lock(w1, 11, "rw:w", "read", 60000);
    h_assert_stat(op, "lock_waiters", 1, T_MS);
    rw_lock(w2, 12, "rw:r", "write", 60000);
    h_assert_stat(op, "lock_waiters", 2, T_MS);
    rw_lock(w3, 13, "rw:r", "read", 60000);
    h_assert_stat(op, "lock_waiters", 3, T_MS);

    r = list_locks(op, "rw:", 0);
    ck_assert_msg(h_ok(r), "lock.list: %s", h_dump(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 3);
    expect_row(r, "rw:w", "write", 1, 1);
    /* Both readers' rows name the key's two waiters. */
    json_t *locks = json_object_get(r, "locks");
    int readers = 0;
    for (size_t i = 0; i < json_array_size(locks); i++) {
        json_t *e = json_array_get(locks, i);
        if (strcmp(jstr(e, "key"), "rw:r") == 0) {
            readers++;
            ck_assert_str_eq(jstr(e, "mode"), "read");
            ck_assert_msg(jint(e, "waiters") == 2, "rw:r waiters: %s",
                          h_dump(e));
        }
    }
    ck_assert_int_eq(readers, 2);
    json_decref(r);

    /* Waiters that give up leave the count. */
    h_close(w1);
    h_close(w2);
    h_close(w3);
    h_assert_stat(op, "lock_waiters", 0, T_MS);
    r = list_locks(op, "rw:", 0);
    expect_row(r, "rw:w", "write", 1, 0);
    expect_row(r, "rw:r", "read", 1, 0);
    json_decref(r);
    h_close(a);
    h_close(b);
    h_close(op);
}
END_TEST

/* Semaphore grants are listed as mode "sem" (the protocol's lock.list),
 * with the requests of this daemon that wait for a permit: a grant of
 * PERMITS of as many, under SEM_LAYOUT (2, one permit: a bare grant, its
 * count from the zset alone). */
static void
list_sem_waiters(int sem_layout, int permits)
{
    char yaml[sizeof yaml_admin + 32];

    snprintf(yaml, sizeof yaml, "%s  sem_layout: %d\n", yaml_admin,
             sem_layout);
    h_start(yaml);
    struct h_conn *a = lk_connect(&D1);
    struct h_conn *w1 = lk_connect(&D1);
    struct h_conn *w2 = lk_connect(&D1);
    struct h_conn *op = lk_connect(&D1);

    json_t *r = h_callf(a, T_MS, "{s:s,s:s,s:i,s:i}", "op", "sem.acquire",
                        "key", "sem:1", "limit", permits, "permits", permits);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "sem.acquire: %s",
                  h_dump(r));
    json_decref(r);
    r = list_locks(op, "sem:", 0);
    ck_assert_msg(h_ok(r), "lock.list: %s", h_dump(r));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 1);
    expect_row(r, "sem:1", "sem", permits, 0);
    json_decref(r);

    ck_assert_int_eq(h_send(w1, "{s:i,s:s,s:s,s:i,s:i}", "id", 21, "op",
                            "sem.acquire", "key", "sem:1", "limit", permits,
                            "wait_ms", 60000),
                     0);
    ck_assert_int_eq(h_send(w2, "{s:i,s:s,s:s,s:i,s:i}", "id", 22, "op",
                            "sem.acquire", "key", "sem:1", "limit", permits,
                            "wait_ms", 60000),
                     0);
    h_assert_stat(op, "lock_waiters", 2, T_MS);
    r = list_locks(op, "sem:", 0);
    expect_row(r, "sem:1", "sem", permits, 2);
    json_decref(r);

    h_close(w1);
    h_close(w2);
    h_assert_stat(op, "lock_waiters", 0, T_MS);
    r = list_locks(op, "sem:", 0);
    expect_row(r, "sem:1", "sem", permits, 0);
    json_decref(r);

    /* A session that ends gives its permits back and leaves the list. */
    h_close(a);
    h_assert_stat(op, "sem_holds", 0, T_MS);
    r = list_locks(op, "sem:", 0);
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 0);
    json_decref(r);
    h_close(op);
}

START_TEST(test_list_sem_waiters)
{
    list_sem_waiters(1, 2);
}
END_TEST

START_TEST(test_list_sem_waiters_layout2)
{
    list_sem_waiters(2, 1);
}
END_TEST

START_TEST(test_tcp_needs_admin_token)
{
    h_start(yaml_admin);
    struct h_conn *app = lk_connect(&D1);
    json_decref(lk_must(app, "k", NULL, NO_TTL, 0));

    struct h_conn *t = h_connect_tcp(&D1);
    ck_assert_ptr_nonnull(t);
    h_expect_code(list_locks(t, NULL, 0), "unauthorized", "lock.list on tcp");
    h_expect_code(force(t, "k"), "unauthorized", "force_unlock on tcp");
    h_expect_code(h_callf(t, T_MS, "{s:s}", "op", "cache.hot"), "unauthorized",
                  "cache.hot on tcp");
    h_expect_code(hello_admin(t, "wrong"), "unauthorized",
                  "hello with a wrong admin_token");
    h_expect_code(list_locks(t, NULL, 0), "unauthorized",
                  "lock.list after a refused hello");
    /* Ordinary ops still work: the session was not closed. */
    json_t *r = h_callf(t, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "k");
    ck_assert(h_ok(r) && jtrue(r, "locked"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{k}"), 1);

    r = hello_admin(t, ADMIN);
    ck_assert_msg(h_ok(r), "hello admin: %s", h_errcode(r));
    json_decref(r);
    r = list_locks(t, NULL, 0);
    ck_assert_msg(h_ok(r), "lock.list as admin: %s", h_errcode(r));
    ck_assert_ptr_nonnull(entry_of(r, "k"));
    json_decref(r);
    /* cache.hot is an operator op too. */
    r = h_callf(t, T_MS, "{s:s}", "op", "cache.hot");
    ck_assert_msg(h_ok(r), "cache.hot as admin: %s", h_errcode(r));
    json_decref(r);
    r = force(t, "k");
    ck_assert_msg(h_ok(r), "force as admin: %s", h_errcode(r));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    ck_assert(h_wait_log(&D1, "msg=\"lock force-unlocked\" key=k", T_MS));
    ck_assert(h_log_has(&D1, "client=ops-1"));
    h_close(t);

    /* The token given as auth is the admin identity too. */
    t = h_connect_tcp(&D1);
    r = h_callf(t, T_MS, "{s:s,s:s}", "op", "hello", "auth", ADMIN);
    ck_assert(h_ok(r));
    json_decref(r);
    r = list_locks(t, NULL, 0);
    ck_assert_msg(h_ok(r), "lock.list after auth=admin: %s", h_errcode(r));
    json_decref(r);
    h_close(t);
    h_close(app);
}
END_TEST

START_TEST(test_tcp_without_admin_token_configured)
{
    h_start(NULL);
    struct h_conn *t = h_connect_tcp(&D1);
    ck_assert_ptr_nonnull(t);
    json_t *r = list_locks(t, NULL, 0);
    ck_assert_str_eq(h_errcode(r), "unauthorized");
    ck_assert_ptr_nonnull(strstr(jmsg(r), "Unix socket"));
    json_decref(r);
    h_expect_code(hello_admin(t, "anything"), "unauthorized",
                  "admin_token while none is configured");
    h_close(t);
    /* The Unix socket is always the operator's. */
    struct h_conn *u = lk_connect(&D1);
    r = list_locks(u, NULL, 0);
    ck_assert(h_ok(r));
    json_decref(r);
    h_close(u);
}
END_TEST

START_TEST(test_force_local)
{
    h_start(yaml_admin);
    struct h_conn *a = lk_connect(&D1);
    struct h_conn *w = lk_connect(&D1);
    struct h_conn *op = lk_connect(&D1);
    json_t *r = lk_must(a, "res", NULL, NO_TTL, 0);
    char tok[128];
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    long long fence = jint(r, "fence");
    json_decref(r);
    /* A waiter that must be woken by the force's publish. */
    lk_send(w, 77, "res", NULL, NO_TTL, 20000);
    h_assert_stat(op, "lock_waiters", 1, T_MS);

    long long t0 = h_now_ms();
    r = force(op, "res");
    ck_assert_msg(h_ok(r), "force: %s", h_errcode(r));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    json_t *ev = h_lock_lost(a, "res", T_MS);
    ck_assert_msg(ev != NULL, "no lock_lost for the holder here");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    json_decref(ev);
    json_t *got = h_recv_id(w, 77, T_MS);
    ck_assert_msg(got != NULL && jtrue(got, "acquired"),
                  "the waiter was not given the lock");
    ck_assert_int_gt(jint(got, "fence"), fence);
    ck_assert_msg(h_now_ms() - t0 < 3000, "waiter took %lld ms",
                  h_now_ms() - t0);
    json_decref(got);

    /* The old holder no longer holds it; the new one does. */
    r = lk_unlock(a, "res", NULL);
    ck_assert_str_eq(h_errcode(r), "not_held");
    json_decref(r);
    r = list_locks(op, NULL, 0);
    ck_assert_ptr_nonnull(entry_of(r, "res"));
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 1);
    json_decref(r);
    lk_unlock_ok(w, "res", NULL);

    /* Nothing to force: released false. */
    r = force(op, "nothing-here");
    ck_assert(h_ok(r));
    ck_assert(!jtrue(r, "released"));
    json_decref(r);
    /* Foreign data is never deleted. */
    h_r_do(&R, "SET leased:lock:{str} hello");
    h_expect_code(force(op, "str"), "wrong_type", "force of a string");
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{str}"), 1);
    h_expect_code(h_callf(op, T_MS, "{s:s}", "op", "lock.force_unlock"),
                  "bad_request", "force without key");
    h_expect_code(h_callf(op, T_MS, "{s:s,s:s}", "op", "lock.force_unlock",
                          "key", ""),
                  "bad_request", "force of an empty key");

    /* A detached lock (no watchdog) learns it at its next unlock. */
    r = h_callf(a, T_MS, "{s:s,s:s,s:b,s:i}", "op", "lock", "key", "det",
                "detach", 1, "ttl_ms", 60000);
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);
    r = force(op, "det");
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    r = h_callf(op, T_MS, "{s:s,s:s,s:s}", "op", "unlock", "key", "det",
                "token", tok);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    h_close(a);
    h_close(w);
    h_close(op);
}
END_TEST

/* Held through D1, forced from D2 over TCP with the admin token: D1's
 * session hears lock_lost "taken" within a watchdog step. */
START_TEST(test_force_remote)
{
    start_both(yaml_admin);
    struct h_conn *a = lk_connect(&D1);
    json_t *r = lk_must(a, "shared", NULL, NO_TTL, 0);
    char tok[128];
    snprintf(tok, sizeof tok, "%s", jstr(r, "token"));
    json_decref(r);

    struct h_conn *t = h_connect_tcp(&D2);
    ck_assert_ptr_nonnull(t);
    h_expect_code(force(t, "shared"), "unauthorized", "force before hello");
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{shared}"), 1);
    r = hello_admin(t, ADMIN);
    ck_assert(h_ok(r));
    json_decref(r);
    /* D2 lists only its own locks. */
    r = list_locks(t, NULL, 0);
    ck_assert_int_eq(json_array_size(json_object_get(r, "locks")), 0);
    json_decref(r);

    long long t0 = h_now_ms();
    r = force(t, "shared");
    ck_assert_msg(h_ok(r), "force from D2: %s", h_errcode(r));
    ck_assert(jtrue(r, "released"));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{shared}"), 0);
    json_t *ev = h_lock_lost(a, "shared", 4 * WATCHDOG_MS + T_MS);
    long long took = h_now_ms() - t0;
    ck_assert_msg(ev != NULL, "D1's holder never heard of the force");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    ck_assert_str_eq(jstr(ev, "token"), tok);
    json_decref(ev);
    /* One watchdog step, plus a loaded machine's slack. */
    ck_assert_msg(took < STEP_MS + 1500, "lock_lost took %lld ms", took);
    struct h_conn *u1 = lk_connect(&D1);
    h_assert_stat(u1, "locks_held", 0, T_MS);
    h_close(u1);

    /* The lock is free for anyone at once. */
    struct h_conn *b = lk_connect(&D2);
    json_decref(lk_must(b, "shared", NULL, NO_TTL, 0));
    h_close(b);
    h_close(t);
    h_close(a);
}
END_TEST

/* The same with Redisson's layout: the lock hash is the key itself and
 * the marker sits beside Redisson's fence counter. */
START_TEST(test_force_remote_redisson)
{
    start_both("listen:\n"
               "  unix: @DIR@/leased.sock\n"
               "  tcp: 127.0.0.1:0\n"
               "  admin_token: " ADMIN "\n"
               "lock:\n"
               "  watchdog_ms: 600\n"
               "  layout: redisson\n");
    struct h_conn *a = lk_connect(&D1);
    json_decref(lk_must(a, "rk", NULL, NO_TTL, 0));
    ck_assert_int_eq(h_r_int(&R, "EXISTS rk"), 1);
    struct h_conn *op = lk_connect(&D2);
    json_t *r = force(op, "rk");
    ck_assert_msg(h_ok(r) && jtrue(r, "released"), "force: %s", h_errcode(r));
    json_decref(r);
    ck_assert_int_eq(h_r_int(&R, "EXISTS rk"), 0);
    ck_assert_int_eq(h_r_int(&R, "EXISTS redisson_lock_token:{rk}:forced"), 1);
    json_t *ev = h_lock_lost(a, "rk", 4 * WATCHDOG_MS + T_MS);
    ck_assert_msg(ev != NULL, "D1's holder never heard of the force");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    json_decref(ev);
    h_close(op);
    h_close(a);
}
END_TEST

/* Under lock.redlock the lock lives on every instance: force_unlock
 * deletes it on each, and the holder's renewal through the other daemon
 * finds the marker on a majority. */
static struct h_redis I[3];

START_TEST(test_force_remote_redlock)
{
    char yaml[1024];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], NULL), 0);
    }
    snprintf(yaml, sizeof yaml,
             "lock:\n  watchdog_ms: 600\n"
             "  redlock: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n",
             I[0].port, I[1].port, I[2].port);
    ck_assert_int_eq(h_daemon_start(&D1, &R, yaml), 0);
    ck_assert_int_eq(h_daemon_start(&D2, &R, yaml), 0);
    h_wait_redlock(&D1, 3);
    h_wait_redlock(&D2, 3);
    struct h_conn *a = lk_connect(&D1);
    struct h_conn *w = lk_connect(&D2);
    json_decref(lk_must(a, "rl", NULL, NO_TTL, 0));
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(h_r_int(&I[i], "EXISTS leased:lock:{rl}"), 1);
    }
    /* A waiter through D2, woken by the force, not by a lease's end. */
    lk_send(w, 5, "rl", NULL, 60000, 20000);
    h_assert_stat(w, "lock_waiters", 1, T_MS);

    struct h_conn *op = lk_connect(&D2);
    json_t *r = force(op, "rl");
    ck_assert_msg(h_ok(r) && jtrue(r, "released"), "force: %s", h_errcode(r));
    json_decref(r);
    json_t *got = h_recv_id(w, 5, T_MS);
    ck_assert_msg(got != NULL && jtrue(got, "acquired"),
                  "the waiter through D2 did not get the lock");
    json_decref(got);
    json_t *ev = h_lock_lost(a, "rl", 4 * WATCHDOG_MS + T_MS);
    ck_assert_msg(ev != NULL, "D1's holder never heard of the force");
    ck_assert_str_eq(jstr(ev, "reason"), "taken");
    json_decref(ev);
    r = force(op, "nothing");
    ck_assert(h_ok(r) && !jtrue(r, "released"));
    json_decref(r);
    h_close(op);
    h_close(w);
    h_close(a);
    for (int i = 0; i < 3; i++) {
        h_redis_stop(&I[i]);
    }
}
END_TEST

START_TEST(test_force_redis_down)
{
    h_start(yaml_admin);
    struct h_conn *op = lk_connect(&D1);
    h_redis_kill(&R);
    json_t *r = force(op, "k");
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    json_decref(r);
    /* lock.list needs no Redis. */
    r = list_locks(op, NULL, 0);
    ck_assert(h_ok(r));
    json_decref(r);
    h_close(op);
}
END_TEST

/* listen.admin_token is read at each hello: a reload changes it for the
 * next one, and operator sessions already made stay operators. */
START_TEST(test_admin_token_reload)
{
    h_start(yaml_admin);
    struct h_conn *t1 = h_connect_tcp(&D1);
    json_t *r = hello_admin(t1, ADMIN);
    ck_assert(h_ok(r));
    json_decref(r);

    FILE *f = fopen(D1.conf, "r");
    ck_assert_ptr_nonnull(f);
    static char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, ADMIN);
    ck_assert_ptr_nonnull(at);
    memcpy(at, "op-n3w-token-xx", strlen(ADMIN));
    f = fopen(D1.conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    h_daemon_signal(&D1, SIGHUP);
    ck_assert(h_wait_log(&D1, "configuration reloaded", T_MS));

    struct h_conn *t2 = h_connect_tcp(&D1);
    h_expect_code(hello_admin(t2, ADMIN), "unauthorized", "the old token");
    r = hello_admin(t2, "op-n3w-token-xx");
    ck_assert_msg(h_ok(r), "the new token: %s", h_errcode(r));
    json_decref(r);
    r = list_locks(t2, NULL, 0);
    ck_assert(h_ok(r));
    json_decref(r);
    r = list_locks(t1, NULL, 0);
    ck_assert(h_ok(r));
    json_decref(r);
    h_close(t1);
    h_close(t2);
}
END_TEST

START_TEST(test_config_tokens_differ)
{
    char dir[256], path[300], out[2048], err[2048];
    ck_assert_int_eq(h_tmpdir(dir, sizeof dir), 0);
    snprintf(path, sizeof path, "%s/leased.yml", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("listen:\n  auth_token: same\n  admin_token: same\n", f);
    fclose(f);
    const char *argv[] = {h_leased_bin(), "-t", "-c", path, NULL};
    int st = h_run(argv, out, sizeof out, err, sizeof err, 20000);
    ck_assert_int_eq(st, 1);
    ck_assert_msg(strstr(err, ":3:16: listen.admin_token: must differ from "
                              "listen.auth_token") != NULL,
                  "stderr: %s", err);
    f = fopen(path, "w");
    fputs("listen:\n  auth_token: one\n  admin_token: two\n", f);
    fclose(f);
    st = h_run(argv, out, sizeof out, err, sizeof err, 20000);
    ck_assert_msg(st == 0, "leased -t: %d %s", st, err);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(features, 60),
        H_CASE(list, 90),
        H_CASE(list_rwlock_waiters, 90),
        H_CASE(list_sem_waiters, 90),
        H_CASE(list_sem_waiters_layout2, 90),
        H_CASE(tcp_needs_admin_token, 60),
        H_CASE(tcp_without_admin_token_configured, 60),
        H_CASE(force_local, 90),
        H_CASE(force_remote, 90),
        H_CASE(force_remote_redisson, 90),
        H_CASE(force_remote_redlock, 90),
        H_CASE(force_redis_down, 60),
        H_CASE(admin_token_reload, 60),
        H_CASE(config_tokens_differ, 60),
    };
    return H_MAIN(fx, cases);
}
