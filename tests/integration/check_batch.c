/* Batched scripts (redis.batch_max): lock, unlock and cache-fill scripts
 * issued in one loop turn for one Redis connection go as one batch script
 * call, and each request still gets its own answer, the one it would get
 * alone. The requests of a case are written to the daemon in one write,
 * so that they are read and dispatched in one turn; with
 * redis.connections 1 they then share a connection. */
#include "harness.h"
#include "lock_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct h_redis R;
static struct h_redis I[3]; /* lock.redlock's instances */
static struct h_daemon D;
static struct h_daemon D2;

static void
stop_instances(void)
{
    for (int i = 0; i < 3; i++) {
        h_redis_stop(&I[i]);
    }
}

static const struct h_fixture fx = {
    .suite = "batch",
    .redis = {&R},
    .daemons = {&D, &D2},
    .teardown = stop_instances,
};

#define NK 10            /* free keys locked in one write */
#define BASE_ID 900000LL /* ids of pipelined requests (h_call's are low) */

static void
start_daemon(struct h_daemon *d, int batch_max, int timeout_ms)
{
    char yaml[256];
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: \"127.0.0.1:%d\"\n  connections: 1\n"
             "  batch_max: %d\n  timeout_ms: %d\n",
             R.port, batch_max, timeout_ms);
    ck_assert_int_eq(h_daemon_start(d, &R, yaml), 0);
}

static json_t *
recv_nth(struct h_conn *c, int i)
{
    json_t *r = h_recv_id(c, BASE_ID + i, 15000);
    ck_assert_msg(r != NULL, "no reply to request %d", i);
    return r;
}

static json_t *
unlock_req(const char *key, const char *token)
{
    return json_pack("{s:s,s:s,s:s}", "op", "unlock", "key", key, "token",
                     token);
}

/* NK free keys, a key that holds a string, and a key another session
 * holds, in one write; then their unlocks in one write, with the first
 * key unlocked twice (the second finds it free) and the held key with a
 * token that is not its holder's. Checks every answer and what Redis
 * holds; returns the batch calls the daemon counted meanwhile. */
static long long
lock_unlock_round(struct h_daemon *d, const char *tag)
{
    struct h_conn *a = h_connect_ok(d);
    struct h_conn *b = h_connect_ok(d);
    char keys[NK][32], held[32], bad[32];
    char tokens[NK][80];
    json_t *reqs[NK + 3];
    long long batches0 = h_stat(a, "redis_batches");

    snprintf(held, sizeof held, "%s-held", tag);
    snprintf(bad, sizeof bad, "%s-bad", tag);
    h_r_do(&R, "SET leased:lock:{%s} plain", bad);
    json_decref(lk_must(b, held, NULL, NO_TTL, 0));

    for (int i = 0; i < NK; i++) {
        snprintf(keys[i], sizeof keys[i], "%s-k%d", tag, i);
        reqs[i] = lk_req(keys[i], NULL, NO_TTL, 0);
    }
    reqs[NK] = lk_req(bad, NULL, NO_TTL, 0);
    reqs[NK + 1] = lk_req(held, NULL, NO_TTL, 0);
    ck_assert_int_eq(h_send_all(a, reqs, NK + 2, BASE_ID), 0);
    for (int i = 0; i < NK; i++) {
        json_t *r = recv_nth(a, i);
        ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "lock %s: %s", keys[i],
                      h_dump(r));
        const char *tok = jstr(r, "token");
        ck_assert(tok != NULL && h_is_token(tok));
        snprintf(tokens[i], sizeof tokens[i], "%s", tok);
        for (int j = 0; j < i; j++) {
            ck_assert_str_ne(tokens[i], tokens[j]);
        }
        /* Each key has its own fence counter: the first grant is 1. */
        ck_assert_int_eq(jint(r, "fence"), 1);
        ck_assert_int_eq(jint(r, "count"), 1);
        ck_assert_int_eq(h_r_int(&R, "HGET leased:lock:{%s} %s", keys[i], tok),
                         1);
        ck_assert_int_eq(h_r_int(&R, "GET leased:lock:{%s}:fence", keys[i]),
                         1);
        json_decref(r);
    }
    h_expect_code(recv_nth(a, NK), "wrong_type", "lock of a string");
    json_t *r = recv_nth(a, NK + 1);
    ck_assert_msg(h_ok(r) && !jtrue(r, "acquired"), "held: %s", h_dump(r));
    json_decref(r);

    for (int i = 0; i < NK; i++) {
        reqs[i] = unlock_req(keys[i], tokens[i]);
    }
    reqs[NK] = unlock_req(keys[0], tokens[0]);
    reqs[NK + 1] = unlock_req(held, tokens[1]);
    reqs[NK + 2] = unlock_req(bad, tokens[2]);
    ck_assert_int_eq(h_send_all(a, reqs, NK + 3, BASE_ID), 0);
    for (int i = 0; i < NK; i++) {
        r = recv_nth(a, i);
        ck_assert_msg(h_ok(r), "unlock %s: %s", keys[i], h_dump(r));
        json_decref(r);
        ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{%s}", keys[i]), 0);
    }
    r = recv_nth(a, NK);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "absent");
    json_decref(r);
    r = recv_nth(a, NK + 1);
    ck_assert_str_eq(h_errcode(r), "not_held");
    ck_assert_str_eq(jreason(r), "other");
    json_decref(r);
    h_expect_code(recv_nth(a, NK + 2), "wrong_type", "unlock of a string");
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{%s}", held), 1);

    long long batches = h_stat(a, "redis_batches") - batches0;
    h_close(a);
    h_close(b);
    return batches;
}

/* Many locks at once are batched, and each gets its own answer. */
START_TEST(test_batched_answers)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 32, 1000);
    struct h_conn *c = h_connect_ok(&D);
    long long items0 = h_stat(c, "redis_batched_items");
    ck_assert_int_ge(lock_unlock_round(&D, "on"), 1);
    ck_assert_int_ge(h_stat(c, "redis_batched_items") - items0, NK);
    h_close(c);
}
END_TEST

/* batch_max 0: one call per script, and the very same answers. */
START_TEST(test_batch_off)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 0, 1000);
    ck_assert_int_eq(lock_unlock_round(&D, "off"), 0);
    struct h_conn *c = h_connect_ok(&D);
    ck_assert_int_eq(h_stat(c, "redis_batched_items"), 0);
    h_close(c);
}
END_TEST

/* Many sessions at once: each lock, from its own session, gets its own
 * token and fence on a shared key's counter. */
START_TEST(test_many_sessions)
{
    enum { NS = 24 };
    struct h_conn *s[NS];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 32, 1000);
    for (int i = 0; i < NS; i++) {
        s[i] = h_connect_ok(&D);
    }
    long long items0 = h_stat(s[0], "redis_batched_items");
    for (int round = 0; round < 5; round++) {
        char key[32];
        for (int i = 0; i < NS; i++) {
            snprintf(key, sizeof key, "ms-%d", i);
            lk_send(s[i], BASE_ID + round, key, NULL, NO_TTL, 0);
        }
        for (int i = 0; i < NS; i++) {
            json_t *r = h_recv_id(s[i], BASE_ID + round, 15000);
            ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                          "session %d: %s", i, h_dump(r));
            ck_assert_int_eq(jint(r, "fence"), round + 1);
            snprintf(key, sizeof key, "ms-%d", i);
            json_t *u = h_callf(s[i], T_MS, "{s:s,s:s,s:s}", "op", "unlock",
                                "key", key, "token", jstr(r, "token"));
            ck_assert_msg(h_ok(u), "unlock %s: %s", key, h_dump(u));
            json_decref(u);
            json_decref(r);
        }
    }
    /* Not every turn finds several: at least some did. */
    ck_assert_int_ge(h_stat(s[0], "redis_batched_items") - items0, 2);
    for (int i = 0; i < NS; i++) {
        h_close(s[i]);
    }
}
END_TEST

static const char *
fill_code(json_t *r)
{
    if (!h_ok(r)) {
        return h_errcode(r);
    }
    return jtrue(r, "stored") ? "stored" : "refused";
}

/* An error raised inside one item (a write refused for memory: Redis
 * raises it in the script, which does not catch it) fails that item only;
 * a fill refused in the same batch (it only reads) is answered as usual,
 * and the failed item's lease is still good afterwards. Without batching
 * the answers are the same. */
START_TEST(test_item_error)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 32, 1000);
    start_daemon(&D2, 0, 1000);
    struct h_daemon *ds[2] = {&D, &D2};
    char codes[2][3][64], lease[2][2][80];
    struct h_conn *c[2];
    for (int k = 0; k < 2; k++) {
        c[k] = h_connect_ok(ds[k]);
        for (int j = 0; j < 2; j++) {
            char key[32];
            snprintf(key, sizeof key, "ie%d-%d", k, j);
            json_t *r = h_must(h_callf(c[k], T_MS, "{s:s,s:s}", "op",
                                       "cache.get", "key", key));
            ck_assert(jstr(r, "lease") != NULL);
            snprintf(lease[k][j], sizeof lease[k][j], "%s", jstr(r, "lease"));
            json_decref(r);
        }
    }
    long long batches0 = h_stat(c[0], "redis_batches");
    h_r_do(&R, "CONFIG SET maxmemory 1");
    for (int k = 0; k < 2; k++) {
        char k0[32], k1[32];
        snprintf(k0, sizeof k0, "ie%d-0", k);
        snprintf(k1, sizeof k1, "ie%d-1", k);
        json_t *reqs[3] = {
            json_pack("{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", k0,
                      "lease", lease[k][0], "value", "v0"),
            json_pack("{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", k1,
                      "lease", lease[k][0], "value", "v1"),
            json_pack("{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", k1,
                      "lease", lease[k][1], "value", "v1"),
        };
        ck_assert_int_eq(h_send_all(c[k], reqs, 3, BASE_ID), 0);
        for (int i = 0; i < 3; i++) {
            json_t *r = recv_nth(c[k], i);
            snprintf(codes[k][i], sizeof codes[k][i], "%s", fill_code(r));
            json_decref(r);
        }
    }
    h_r_do(&R, "CONFIG SET maxmemory 0");
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(codes[0][i], codes[1][i]);
    }
    ck_assert_str_ne(codes[0][0], "stored");
    ck_assert_str_ne(codes[0][0], "refused");
    ck_assert_str_eq(codes[0][1], "refused");
    ck_assert_str_eq(codes[0][2], codes[0][0]);
    ck_assert_int_ge(h_stat(c[0], "redis_batches") - batches0, 1);
    for (int k = 0; k < 2; k++) {
        char k0[32];
        snprintf(k0, sizeof k0, "ie%d-0", k);
        json_t *r = h_must(h_callf(c[k], T_MS, "{s:s,s:s,s:s,s:s}", "op",
                                   "cache.fill", "key", k0, "lease",
                                   lease[k][0], "value", "v0"));
        ck_assert(jtrue(r, "stored"));
        json_decref(r);
        h_close(c[k]);
    }
}
END_TEST

/* Redis dies with a batch in flight: every item is answered
 * redis_unavailable, with the outcome a call of its own would get. */
START_TEST(test_redis_killed_in_flight)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 32, 5000);
    start_daemon(&D2, 0, 5000);
    struct h_daemon *ds[2] = {&D, &D2};
    struct h_conn *c[2], *st[2];
    long long sent0[2];
    for (int k = 0; k < 2; k++) {
        c[k] = h_connect_ok(ds[k]);
        st[k] = h_connect_ok(ds[k]);
        h_assert_ping(c[k]);
        sent0[k] = h_stat(st[k], "redis_commands");
    }
    h_redis_signal(&R, SIGSTOP);
    for (int k = 0; k < 2; k++) {
        json_t *reqs[NK];
        for (int i = 0; i < NK; i++) {
            char key[32];
            snprintf(key, sizeof key, "kf-%d", i);
            reqs[i] = lk_req(key, NULL, NO_TTL, 0);
        }
        ck_assert_int_eq(h_send_all(c[k], reqs, NK, BASE_ID), 0);
    }
    /* Sent (in one batch, or one by one), not answered. */
    ck_assert(h_wait_stat_min(st[0], "redis_batches", 1, 5000));
    ck_assert(h_wait_stat_min(st[1], "redis_commands", sent0[1] + NK, 5000));
    h_redis_kill(&R);
    char out[2][NK][64];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < NK; i++) {
            json_t *r = recv_nth(c[k], i);
            ck_assert_msg(h_errcode(r) != NULL &&
                              strcmp(h_errcode(r), "redis_unavailable") == 0,
                          "daemon %d item %d: %s", k, i, h_dump(r));
            snprintf(out[k][i], sizeof out[k][i], "%s",
                     joutcome(r) != NULL ? joutcome(r) : "-");
            json_decref(r);
        }
    }
    for (int i = 0; i < NK; i++) {
        ck_assert_str_eq(out[0][i], out[1][i]);
    }
    for (int k = 0; k < 2; k++) {
        h_close(c[k]);
        h_close(st[k]);
    }
}
END_TEST

/* SCRIPT FLUSH under the daemon: the batch is sent again as EVAL and
 * every item answered. */
START_TEST(test_noscript)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 32, 1000);
    struct h_conn *c = h_connect_ok(&D);
    ck_assert_int_ge(lock_unlock_round(&D, "ns1"), 1);
    /* Counted from before the flush: the releases of the first round's
     * closing sessions may be the ones that meet the NOSCRIPT. */
    long long ns0 = h_stat(c, "redis_noscript");
    h_r_do(&R, "SCRIPT FLUSH");
    ck_assert_int_ge(lock_unlock_round(&D, "ns2"), 1);
    ck_assert_int_ge(h_stat(c, "redis_noscript") - ns0, 1);
    h_close(c);
}
END_TEST

/* The cache's miss path: misses of many keys at once each get their own
 * fill lease, and the fills of one write each store their own value. */
START_TEST(test_cache_miss_fill)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 32, 1000);
    struct h_conn *c = h_connect_ok(&D);
    long long items0 = h_stat(c, "redis_batched_items");
    json_t *reqs[NK];
    char leases[NK][80], key[32], val[32];
    for (int i = 0; i < NK; i++) {
        snprintf(key, sizeof key, "cm-%d", i);
        reqs[i] = json_pack("{s:s,s:s}", "op", "cache.get", "key", key);
    }
    ck_assert_int_eq(h_send_all(c, reqs, NK, BASE_ID), 0);
    for (int i = 0; i < NK; i++) {
        json_t *r = recv_nth(c, i);
        ck_assert_msg(h_ok(r) && !jtrue(r, "hit") && jstr(r, "lease") != NULL,
                      "get %d: %s", i, h_dump(r));
        snprintf(leases[i], sizeof leases[i], "%s", jstr(r, "lease"));
        for (int j = 0; j < i; j++) {
            ck_assert_str_ne(leases[i], leases[j]);
        }
        json_decref(r);
    }
    for (int i = 0; i < NK; i++) {
        snprintf(key, sizeof key, "cm-%d", i);
        snprintf(val, sizeof val, "value-%d", i);
        /* The last one fills with another key's lease: refused. */
        reqs[i] = json_pack("{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key",
                            key, "lease", leases[i == NK - 1 ? 0 : i], "value",
                            val);
    }
    ck_assert_int_eq(h_send_all(c, reqs, NK, BASE_ID), 0);
    for (int i = 0; i < NK; i++) {
        json_t *r = recv_nth(c, i);
        ck_assert_msg(h_ok(r), "fill %d: %s", i, h_dump(r));
        ck_assert_int_eq(jtrue(r, "stored"), i != NK - 1);
        json_decref(r);
    }
    for (int i = 0; i < NK - 1; i++) {
        snprintf(key, sizeof key, "cm-%d", i);
        snprintf(val, sizeof val, "value-%d", i);
        json_t *r = h_must(
            h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", key));
        ck_assert(jtrue(r, "hit"));
        ck_assert_str_eq(jstr(r, "value"), val);
        json_decref(r);
    }
    ck_assert_int_ge(h_stat(c, "redis_batched_items") - items0, NK);
    h_close(c);
}
END_TEST

/* Redlock: each instance batches its own calls, and each lock gets its
 * own token, held on every instance. */
START_TEST(test_redlock)
{
    char yaml[512];
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(h_redis_start(&I[i], NULL), 0);
    }
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: 127.0.0.1:%d\n  connections: 1\n"
             "  batch_max: 32\n"
             "lock:\n  redlock: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n",
             R.port, I[0].port, I[1].port, I[2].port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    h_wait_redlock(&D, 3);
    struct h_conn *c = h_connect_ok(&D);
    long long b0 = h_stat(c, "redis_batches");
    json_t *reqs[NK];
    char keys[NK][32], tokens[NK][80];
    for (int i = 0; i < NK; i++) {
        snprintf(keys[i], sizeof keys[i], "rl-%d", i);
        reqs[i] = lk_req(keys[i], NULL, NO_TTL, 0);
    }
    ck_assert_int_eq(h_send_all(c, reqs, NK, BASE_ID), 0);
    for (int i = 0; i < NK; i++) {
        json_t *r = recv_nth(c, i);
        ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "lock %s: %s", keys[i],
                      h_dump(r));
        snprintf(tokens[i], sizeof tokens[i], "%s", jstr(r, "token"));
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(h_r_int(&I[k], "HGET leased:lock:{%s} %s",
                                     keys[i], tokens[i]),
                             1);
        }
        json_decref(r);
    }
    ck_assert_int_ge(h_stat(c, "redis_batches") - b0, 3);
    for (int i = 0; i < NK; i++) {
        reqs[i] = unlock_req(keys[i], tokens[i]);
    }
    ck_assert_int_eq(h_send_all(c, reqs, NK, BASE_ID), 0);
    for (int i = 0; i < NK; i++) {
        json_decref(h_must(recv_nth(c, i)));
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(h_r_int(&I[k], "EXISTS leased:lock:{%s}",
                                     keys[i]),
                             0);
        }
    }
    h_close(c);
}
END_TEST

/* redis.batch_max is reloadable: 0 at start, 32 after SIGHUP. */
START_TEST(test_reload)
{
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    start_daemon(&D, 0, 1000);
    ck_assert_int_eq(lock_unlock_round(&D, "r0"), 0);
    FILE *f = fopen(D.conf, "r");
    ck_assert(f != NULL);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, "batch_max: 0");
    ck_assert(at != NULL);
    f = fopen(D.conf, "w");
    ck_assert(f != NULL);
    fprintf(f, "%.*sbatch_max: 32%s", (int)(at - text), text,
            at + strlen("batch_max: 0"));
    fclose(f);
    h_daemon_signal(&D, SIGHUP);
    ck_assert(h_wait_log(&D, "configuration reloaded", 10000));
    ck_assert_int_ge(lock_unlock_round(&D, "r1"), 1);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(batched_answers, 60),
        H_CASE(batch_off, 60),
        H_CASE(many_sessions, 90),
        H_CASE(item_error, 60),
        H_CASE(redis_killed_in_flight, 60),
        H_CASE(noscript, 60),
        H_CASE(cache_miss_fill, 60),
        H_CASE(reload, 60),
        H_CASE(redlock, 60),
    };
    return H_MAIN(fx, cases);
}
