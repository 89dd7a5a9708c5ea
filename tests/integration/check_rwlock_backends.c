/* Read-write locks on the other backends: a Redis Cluster (every key of
 * one lock in the slot of its name, in both layouts; wake-ups across the
 * cluster) and lock.redlock, which refuses them at request time and does
 * not announce "rwlock". */

#include "harness.h"

#include "ld_cluster_slot.h"

#include <check.h>
#include <stdio.h>
#include <string.h>

#define T_MS 5000

static struct h_cluster C;
static struct h_redis R;
static struct h_redis I[3];
static struct h_daemon D;

static void
stop_all(void)
{
    h_cluster_stop(&C);
    for (int i = 0; i < 3; i++) {
        if (I[i].pid != 0) {
            h_redis_stop(&I[i]);
        }
    }
}

static const struct h_fixture fx = {
    .suite = "rwlock_backends",
    .redis = {&R},
    .daemons = {&D},
    .teardown = stop_all,
};

static json_t *
rw(struct h_conn *c, const char *op, const char *key, const char *mode,
   long long wait, json_int_t id)
{
    json_t *req = json_pack("{s:s,s:s,s:s}", "op", op, "key", key, "mode",
                            mode);
    if (wait != 0) {
        json_object_set_new(req, "wait_ms", json_integer(wait));
    }
    if (id != 0) {
        json_object_set_new(req, "id", json_integer(id));
        char *line = json_dumps(req, JSON_COMPACT);
        json_decref(req);
        size_t n = strlen(line);
        char buf[512];
        snprintf(buf, sizeof(buf), "%s\n", line);
        free(line);
        ck_assert_int_eq(h_send_raw(c, buf, n + 1), 0);
        return NULL;
    }
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "no reply to %s %s", op, key);
    return r;
}

static bool
got(json_t *r)
{
    bool a = r != NULL && h_ok(r) &&
             json_is_true(json_object_get(r, "acquired"));
    json_decref(r);
    return a;
}

/* A key (PREFIX plus a number) whose slot master M serves now. */
static void
key_on(int m, const char *prefix, char *out, size_t len)
{
    for (int i = 0; i < 100000; i++) {
        snprintf(out, len, "%s%d", prefix, i);
        if (h_cluster_master_of_slot(&C,
                                     (int)ld_cluster_slot(out, strlen(out))) ==
            m) {
            return;
        }
    }
    ck_abort_msg("no key found on master %d", m);
}

static void
cluster_case(const char *layout_yaml, bool redisson)
{
    char redis[512], yaml[1024];
    ck_assert_int_eq(h_cluster_start(&C, 3), 0);
    h_cluster_yaml(&C, "  timeout_ms: 500\n", redis, sizeof(redis));
    snprintf(yaml, sizeof(yaml), "%s%s", redis, layout_yaml);
    ck_assert_int_eq(h_daemon_start(&D, &C.node[0], yaml), 0);
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int seen[3] = {-1, -1, -1}, n = 0;
    for (int s = 0; s < 16384 && n < 3; s += 5461) {
        int m = h_cluster_master_of_slot(&C, s);
        seen[n++] = m;
    }
    for (int i = 0; i < n; i++) {
        char key[32];
        key_on(seen[i], "rw", key, sizeof(key));
        json_t *r = rw(a, "lock", key, "read", 0, 0);
        ck_assert_msg(h_ok(r), "read %s: %s", key, h_errcode(r));
        char tok[80];
        snprintf(tok, sizeof(tok), "%s",
                 json_string_value(json_object_get(r, "token")));
        json_decref(r);
        /* The reader's lease key is on the lock's node. */
        const struct h_redis *node = &C.node[seen[i]];
        if (redisson) {
            ck_assert_int_eq(h_r_int(node, "EXISTS {%s}:%s:rwlock_timeout:1",
                                     key, tok),
                             1);
        } else {
            ck_assert_int_eq(
                h_r_int(node, "EXISTS leased:lock:{%s}:%s:rwlock_timeout:1",
                        key, tok),
                1);
        }
        ck_assert(got(rw(b, "lock", key, "read", 0, 0)));
        json_decref(rw(b, "unlock", key, "read", 0, 0));
        rw(b, "lock", key, "write", 20000, 10 + i);
        h_assert_stat(a, "lock_waiters", 1, T_MS);
        long long t0 = h_now_ms();
        r = rw(a, "unlock", key, "read", 0, 0);
        ck_assert_msg(h_ok(r), "unlock %s: %s", key, h_errcode(r));
        json_decref(r);
        ck_assert_msg(got(h_recv_id(b, 10 + i, T_MS)), "writer not woken");
        ck_assert(h_now_ms() - t0 < 2000);
        json_decref(rw(b, "unlock", key, "write", 0, 0));
    }
    h_close(a);
    h_close(b);
}

START_TEST(test_cluster_leased_layout)
{
    cluster_case("", false);
}
END_TEST

START_TEST(test_cluster_redisson_layout)
{
    cluster_case("lock:\n  layout: redisson\n", true);
}
END_TEST

START_TEST(test_redlock_refuses)
{
    char yaml[1024];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], NULL), 0);
    }
    snprintf(yaml, sizeof yaml,
             "lock:\n  redlock: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n",
             I[0].port, I[1].port, I[2].port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    h_wait_redlock(&D, 3);
    struct h_conn *c = h_connect_ok(&D);
    json_t *r = h_callf(c, T_MS, "{s:s}", "op", "hello");
    ck_assert(h_ok(r));
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(r, "features"), i, v)
    {
        ck_assert_str_ne(json_string_value(v), "rwlock");
    }
    json_decref(r);
    r = rw(c, "lock", "k", "read", 0, 0);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    ck_assert_ptr_nonnull(strstr(jmsg(r), "redlock"));
    json_decref(r);
    /* Plain locks still work there. */
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "k");
    ck_assert(got(r));
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(h_r_int(&I[k], "EXISTS leased:lock:{k}"), 1);
    }
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(cluster_leased_layout, 120),
        H_CASE(cluster_redisson_layout, 120),
        H_CASE(redlock_refuses, 60),
    };
    return H_MAIN(fx, cases);
}
