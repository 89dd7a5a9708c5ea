/* Cluster mode against real processes: three masters and three replicas
 * made with redis-cli --cluster create, the real leased on two of them as
 * seeds. Locks and cache entries on keys of every master, cache.mget
 * across all of them, a waiter woken through sharded pub/sub; a slot
 * migrated (IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) in the middle of
 * work, followed with ASK and MOVED and nothing lost, a waiter on it
 * woken where the slot went; a master killed mid-run: every request
 * answered within its bound, a lock it had not replicated reported lost
 * with reason "failover", one it had kept, service resumed on the
 * promoted replica; CLUSTER FAILOVER followed; a master lost for good
 * answered per key by cache.mget and cache.invalidate, its journaled
 * delete replayed when it is back; the Redisson layout with its own
 * channels; every node over TLS. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include "ld_cluster_slot.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_MS 5000
/* redis.timeout_ms of the daemon, and what an answer may take on top of
 * it on a loaded machine. */
#define TIMEOUT_MS 500
#define ANSWER_MS (TIMEOUT_MS + 2500)
#define FAILOVER_MS 30000

static struct h_cluster C;
static struct h_daemon D;

static void
stop_cluster(void)
{
    h_cluster_stop(&C);
}

static const struct h_fixture fx = {
    .suite = "cluster",
    .daemons = {&D},
    .teardown = stop_cluster,
};

/* The cluster (EXTRA_ARGS for its nodes, may be NULL), then leased on it
 * with EXTRA YAML sections (may be ""). */
static void
start_all_ex(const char *extra_args, const char *extra)
{
    char redis[512], yaml[2048];
    ck_assert_int_eq(h_cluster_start_ex(&C, 3, extra_args), 0);
    h_cluster_yaml(&C, "  timeout_ms: 500\n", redis, sizeof(redis));
    snprintf(yaml, sizeof(yaml), "%s%s", redis, extra);
    ck_assert_int_eq(h_daemon_start(&D, &C.node[0], yaml), 0);
}

static void
start_all(const char *extra)
{
    start_all_ex(NULL, extra);
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

/* Another key (PREFIX plus a number) in SLOT. */
static void
key_in_slot(unsigned slot, const char *prefix, char *out, size_t len)
{
    for (int i = 0; i < 10000000; i++) {
        snprintf(out, len, "%s%d", prefix, i);
        if (ld_cluster_slot(out, strlen(out)) == slot) {
            return;
        }
    }
    ck_abort_msg("no key found in slot %u", slot);
}

/* The three masters, by index in C.node. */
static void
masters(int out[3])
{
    out[0] = h_cluster_master_of_slot(&C, 0);
    out[1] = h_cluster_master_of_slot(&C, 8000);
    out[2] = h_cluster_master_of_slot(&C, 16000);
    ck_assert(out[0] >= 0 && out[1] >= 0 && out[2] >= 0);
    ck_assert(out[0] != out[1] && out[1] != out[2] && out[0] != out[2]);
}

/* Lock KEY (must be granted at once); its token in TOK. */
static long long
must_lock(struct h_conn *c, const char *key, char *tok, size_t len)
{
    json_t *r = h_callf(c, ANSWER_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                        key, "ttl_ms", 30000);
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"), "lock %s: %s",
                  key, r != NULL ? jmsg(r) : "no answer");
    if (tok != NULL) {
        snprintf(tok, len, "%s", jstr(r, "token"));
    }
    long long fence = jint(r, "fence");
    json_decref(r);
    return fence;
}

static void
must_unlock(struct h_conn *c, const char *key, const char *tok)
{
    json_t *r = h_callf(c, ANSWER_MS, "{s:s,s:s,s:s}", "op", "unlock", "key",
                        key, "token", tok);
    ck_assert_msg(r != NULL && h_ok(r), "unlock %s: %s", key,
                  r != NULL ? jmsg(r) : "no answer");
    json_decref(r);
}

static void
must_set(struct h_conn *c, const char *key, const char *value)
{
    json_t *r = h_callf(c, ANSWER_MS, "{s:s,s:s,s:s,s:i}", "op", "cache.set",
                        "key", key, "value", value, "ttl_ms", 60000);
    ck_assert_msg(r != NULL && h_ok(r), "cache.set %s: %s", key,
                  r != NULL ? jmsg(r) : "no answer");
    json_decref(r);
}

static void
assert_cached(struct h_conn *c, const char *key, const char *value)
{
    json_t *r = h_callf(c, ANSWER_MS, "{s:s,s:s}", "op", "cache.get", "key",
                        key);
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "hit"),
                  "cache.get %s: no hit", key);
    ck_assert_str_eq(jstr(r, "value"), value);
    json_decref(r);
}

struct shardsub {
    struct h_redis *r;
    const char *channel;
};

static bool
shard_subscribed(void *arg)
{
    struct shardsub *w = arg;
    redisReply *rep = h_redis_cmd(w->r, "PUBSUB SHARDNUMSUB %s", w->channel);
    bool ok = rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
              rep->elements == 2 && rep->element[1]->integer > 0;
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return ok;
}

/* Wait until node M holds a sharded subscriber for KEY's wake-ups. */
static void
wait_waiter_on(int m, const char *key)
{
    char chan[256];
    snprintf(chan, sizeof(chan), "leased:lock:{%s}:unlock", key);
    struct shardsub w = {&C.node[m], chan};
    ck_assert_msg(h_wait_until(shard_subscribed, &w, T_MS),
                  "no sharded subscriber on %s at node %d", chan, m);
}

static void
send_wait(struct h_conn *c, const char *key, int id)
{
    char line[256];
    snprintf(line, sizeof(line),
             "{\"op\":\"lock\",\"key\":\"%s\",\"ttl_ms\":30000,"
             "\"wait_ms\":20000,\"id\":%d}\n",
             key, id);
    ck_assert_int_eq(h_send_raw(c, line, strlen(line)), 0);
}

/* The waiter's answer: granted within MS. */
static void
assert_woken(struct h_conn *c, int id, int ms)
{
    long long t0 = h_now_ms();
    json_t *r = h_recv_id(c, id, ms);
    ck_assert_msg(r != NULL && h_ok(r) && jtrue(r, "acquired"),
                  "waiter %d not granted within %d ms", id, ms);
    ck_assert_int_lt(h_now_ms() - t0, ms);
    json_decref(r);
}

/* Locks and cache entries on every master; mget across all of them; a
 * waiter woken by an unlock on another connection. */
START_TEST(test_keys_on_every_master)
{
    start_all("");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    char keys[3][32], ckeys[3][32], tok[3][64];
    for (int i = 0; i < 3; i++) {
        key_on(m[i], "k", keys[i], sizeof(keys[i]));
        must_lock(a, keys[i], tok[i], sizeof(tok[i]));
        /* On the master of its slot, not elsewhere. */
        ck_assert_int_eq(h_r_int(&C.node[m[i]], "EXISTS leased:lock:{%s}",
                                 keys[i]),
                         1);
        json_t *r = h_callf(b, ANSWER_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                            keys[i], "ttl_ms", 30000);
        ck_assert(r != NULL && h_ok(r) && !jtrue(r, "acquired"));
        json_decref(r);
        key_on(m[i], "c", ckeys[i], sizeof(ckeys[i]));
        must_set(a, ckeys[i], ckeys[i]);
    }

    /* One mget over the three masters, in order, a miss among them. */
    json_t *r = h_callf(a, ANSWER_MS, "{s:s,s:[s,s,s,s]}", "op", "cache.mget",
                        "keys", ckeys[2], "nothing-here", ckeys[0], ckeys[1]);
    ck_assert(r != NULL && h_ok(r));
    json_t *res = json_object_get(r, "results");
    ck_assert_int_eq(json_array_size(res), 4);
    const char *want[4] = {ckeys[2], NULL, ckeys[0], ckeys[1]};
    for (size_t i = 0; i < 4; i++) {
        json_t *e = json_array_get(res, i);
        ck_assert(h_ok(e));
        ck_assert_int_eq(jtrue(e, "hit"), want[i] != NULL);
        if (want[i] != NULL) {
            ck_assert_str_eq(jstr(e, "value"), want[i]);
        }
    }
    json_decref(r);

    /* Waiters on every master, woken by the unlocks. */
    for (int i = 0; i < 3; i++) {
        send_wait(b, keys[i], 100 + i);
        wait_waiter_on(m[i], keys[i]);
        must_unlock(a, keys[i], tok[i]);
        assert_woken(b, 100 + i, 2000);
    }
    ck_assert_int_ge(h_stat(a, "redis_cluster_refreshes"), 1);
    h_close(a);
    h_close(b);
}
END_TEST

/* Every node over TLS: the map names the TLS ports, locks and cache work
 * on every master and waiters are woken through TLS subscribers. */
START_TEST(test_tls_nodes)
{
    char dir[256], yaml[2048];
    ck_assert_int_eq(h_tmpdir(dir, sizeof(dir)), 0);
    ck_assert_int_eq(h_test_certs(dir), 0);
    ck_assert_int_eq(h_cluster_start_tls(&C, 3, dir), 0);
    snprintf(yaml, sizeof(yaml),
             "redis:\n  mode: cluster\n  addresses: [\"127.0.0.1:%d\"]\n"
             "  timeout_ms: 500\n  tls:\n    enabled: true\n"
             "    ca_file: %s/ca.crt\n",
             C.tls_port[1], dir);
    ck_assert_int_eq(h_daemon_start(&D, &C.node[0], yaml), 0);
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    for (int i = 0; i < 3; i++) {
        char key[32], tok[64];
        key_on(m[i], "tk", key, sizeof(key));
        must_lock(a, key, tok, sizeof(tok));
        ck_assert_int_eq(h_r_int(&C.node[m[i]], "EXISTS leased:lock:{%s}",
                                 key),
                         1);
        must_set(a, key, key);
        assert_cached(a, key, key);
        send_wait(b, key, 300 + i);
        wait_waiter_on(m[i], key);
        must_unlock(a, key, tok);
        assert_woken(b, 300 + i, 2000);
    }
    h_close(a);
    h_close(b);
}
END_TEST

/* The Redisson layout on a cluster: each lock is the hash named by its
 * key on the master of that key's slot, and its unlock message (on
 * redisson_lock__channel:{key}, the same slot) wakes waiters. */
START_TEST(test_redisson_layout)
{
    start_all("lock:\n  layout: redisson\n");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    for (int i = 0; i < 3; i++) {
        char key[32], tok[64], chan[64];
        key_on(m[i], "rk", key, sizeof(key));
        must_lock(a, key, tok, sizeof(tok));
        ck_assert_int_eq(h_r_int(&C.node[m[i]], "EXISTS %s", key), 1);
        send_wait(b, key, 200 + i);
        snprintf(chan, sizeof(chan), "redisson_lock__channel:{%s}", key);
        struct shardsub w = {&C.node[m[i]], chan};
        ck_assert_msg(h_wait_until(shard_subscribed, &w, T_MS),
                      "no sharded subscriber on %s", chan);
        must_unlock(a, key, tok);
        assert_woken(b, 200 + i, 2000);
    }
    h_close(a);
    h_close(b);
}
END_TEST

/* A lock asked for while its slot may be between two masters: granted,
 * or refused as redis_unavailable (Redis answers TRYAGAIN to a script on
 * keys not all there yet, which is retried for redis.timeout_ms), within
 * the bound. Whether it was granted. */
static bool
lock_or_unavailable(struct h_conn *c, const char *key, char *tok, size_t len)
{
    long long t0 = h_now_ms();
    json_t *r = h_callf(c, ANSWER_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                        key, "ttl_ms", 30000);
    ck_assert_msg(r != NULL, "lock %s: no answer within %d ms", key,
                  ANSWER_MS);
    ck_assert_int_lt(h_now_ms() - t0, ANSWER_MS);
    bool ok = h_ok(r);
    if (ok) {
        ck_assert(jtrue(r, "acquired"));
        snprintf(tok, len, "%s", jstr(r, "token"));
    } else {
        ck_assert_str_eq(h_errcode(r), "redis_unavailable");
    }
    json_decref(r);
    return ok;
}

/* Locks and cache writes on fresh keys of one slot. Cache writes (one key
 * each) must work whatever the slot's state; locks (two keys) must when
 * LOCKS_TOO, and be answered within the bound anyway. */
static void
burst(struct h_conn *c, unsigned slot, int round, bool locks_too)
{
    for (int i = 0; i < 5; i++) {
        char pfx[16], k[32], tok[64], v[32];
        snprintf(pfx, sizeof(pfx), "b%d.%d.", round, i);
        key_in_slot(slot, pfx, k, sizeof(k));
        if (lock_or_unavailable(c, k, tok, sizeof(tok))) {
            must_unlock(c, k, tok);
        } else {
            ck_assert_msg(!locks_too, "lock %s refused", k);
        }
        snprintf(v, sizeof(v), "r%d-%d", round, i);
        must_set(c, k, v);
        assert_cached(c, k, v);
    }
}

static void
node_do(int i, const char *fmt, const char *a1, const char *a2)
{
    redisReply *r = h_redis_cmd(&C.node[i], fmt, a1, a2);
    ck_assert_msg(r != NULL && r->type != REDIS_REPLY_ERROR, "%s on %d: %s",
                  fmt, i, r != NULL ? r->str : "no answer");
    freeReplyObject(r);
}

/* Whether node I holds KEY while its slot is being imported there. */
static bool
imported_has(int i, const char *key)
{
    redisContext *ctx = h_redis_connect(&C.node[i]);
    ck_assert_ptr_nonnull(ctx);
    redisReply *r = redisCommand(ctx, "ASKING");
    freeReplyObject(r);
    r = redisCommand(ctx, "EXISTS %s", key);
    bool has = r != NULL && r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    if (r != NULL) {
        freeReplyObject(r);
    }
    redisFree(ctx);
    return has;
}

/* Moving SLOT from master SRC to DST by hand, as redis-cli --cluster
 * reshard does. */
struct migration {
    int src, dst;
    unsigned slot;
    char slotstr[16], sid[64], did[64];
};

static void
mig_begin(struct migration *g, unsigned slot, int src, int dst)
{
    g->src = src;
    g->dst = dst;
    g->slot = slot;
    h_cluster_id(&C, src, g->sid, sizeof(g->sid));
    h_cluster_id(&C, dst, g->did, sizeof(g->did));
    snprintf(g->slotstr, sizeof(g->slotstr), "%u", slot);
    node_do(dst, "CLUSTER SETSLOT %s IMPORTING %s", g->slotstr, g->sid);
    node_do(src, "CLUSTER SETSLOT %s MIGRATING %s", g->slotstr, g->did);
}

/* Every key of the slot to the target. */
static void
mig_keys(const struct migration *g)
{
    redisReply *ks = h_redis_cmd(&C.node[g->src],
                                 "CLUSTER GETKEYSINSLOT %u 1000", g->slot);
    ck_assert(ks != NULL && ks->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < ks->elements; i++) {
        redisReply *mr = h_redis_cmd(&C.node[g->src],
                                     "MIGRATE 127.0.0.1 %d %s 0 5000",
                                     C.node[g->dst].port, ks->element[i]->str);
        ck_assert_msg(mr != NULL && mr->type == REDIS_REPLY_STATUS,
                      "MIGRATE %s", ks->element[i]->str);
        freeReplyObject(mr);
    }
    freeReplyObject(ks);
}

/* The slot is the target's: told to it, the source and the third
 * master. */
static void
mig_end(const struct migration *g, int third)
{
    node_do(g->dst, "CLUSTER SETSLOT %s NODE %s", g->slotstr, g->did);
    node_do(g->src, "CLUSTER SETSLOT %s NODE %s", g->slotstr, g->did);
    node_do(third, "CLUSTER SETSLOT %s NODE %s", g->slotstr, g->did);
}

/* A slot moved from one master to another while work goes on. */
START_TEST(test_slot_migration)
{
    start_all("");
    struct h_conn *a = h_connect_ok(&D), *w = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    int src = m[0], dst = m[1];
    char key[32], tok[64];
    key_on(src, "mig", key, sizeof(key));
    unsigned slot = ld_cluster_slot(key, strlen(key));
    must_lock(a, key, tok, sizeof(tok));
    must_set(a, key, "before");
    send_wait(w, key, 7);
    wait_waiter_on(src, key);
    burst(a, slot, 0, true);

    struct migration g;
    mig_begin(&g, slot, src, dst);

    /* A new key of the slot: the source answers ASK, the target takes it
     * after ASKING. */
    char fresh[32], ftok[64];
    key_in_slot(slot, "new", fresh, sizeof(fresh));
    must_set(a, fresh, "fresh");
    char fkey[64];
    snprintf(fkey, sizeof(fkey), "leased:cache:{%s}", fresh);
    ck_assert(imported_has(dst, fkey));
    ck_assert_int_ge(h_stat(a, "redis_ask"), 1);
    burst(a, slot, 1, false);
    mig_keys(&g);
    burst(a, slot, 2, false);
    mig_end(&g, m[2]);
    burst(a, slot, 3, true);

    /* Nothing lost: the lock held across the move is still this
     * client's, the entry still there, the fresh lock still held. */
    assert_cached(a, key, "before");
    assert_cached(a, fresh, "fresh");
    must_lock(a, fresh, ftok, sizeof(ftok));
    must_unlock(a, fresh, ftok);
    must_unlock(a, key, tok);
    /* The waiter, subscribed at the source before, is woken from the
     * target. */
    assert_woken(w, 7, 5000);

    /* A slot nobody listens on, moved under a held lock: the daemon
     * learns it from the MOVED of the unlock. */
    long long moved = h_stat(a, "redis_moved");
    key_on(src, "mov", key, sizeof(key));
    must_lock(a, key, tok, sizeof(tok));
    mig_begin(&g, ld_cluster_slot(key, strlen(key)), src, dst);
    mig_keys(&g);
    mig_end(&g, m[2]);
    must_unlock(a, key, tok);
    ck_assert_int_gt(h_stat(a, "redis_moved"), moved);
    h_close(a);
    h_close(w);
}
END_TEST

static bool
is_replicated(void *arg)
{
    const struct h_redis *r = arg;
    redisReply *rep = h_redis_cmd(r, "INFO replication");
    ck_assert(rep != NULL && rep->type == REDIS_REPLY_STRING);
    const char *mo = strstr(rep->str, "master_repl_offset:");
    const char *so = strstr(rep->str, "offset=");
    bool same = mo != NULL && so != NULL &&
                atoll(mo + strlen("master_repl_offset:")) ==
                    atoll(so + strlen("offset="));
    freeReplyObject(rep);
    return same;
}

/* Wait until the replica of master M has everything M wrote. */
static void
replicated(int m)
{
    ck_assert_msg(h_wait_until(is_replicated, &C.node[m], T_MS),
                  "the replica of node %d lags", m);
}

/* A master killed in the middle of work. */
START_TEST(test_master_killed)
{
    start_all("lock:\n  watchdog_ms: 10000\n");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    int victim = m[0];
    int rep = h_cluster_replica_of(&C, victim);
    ck_assert_int_ge(rep, 0);
    char kept[32], lost[32], other[32], tok[64];
    key_on(victim, "kept", kept, sizeof(kept));
    key_on(victim, "lost", lost, sizeof(lost));
    key_on(m[1], "other", other, sizeof(other));
    must_lock(a, kept, NULL, 0);
    replicated(victim);

    /* The replica stopped and cut off, so that the next grant never
     * reaches it. */
    kill(C.node[rep].pid, SIGSTOP);
    h_r_do(&C.node[victim], "CLIENT KILL TYPE replica");
    long long lost_fence = must_lock(a, lost, NULL, 0);
    h_redis_kill(&C.node[victim]);
    kill(C.node[rep].pid, SIGCONT);

    /* Every request is answered within its bound (the whole cluster
     * refuses with CLUSTERDOWN until a replica took over, as
     * cluster-require-full-coverage wants), and the victim's slots come
     * back on the promoted replica. */
    unsigned vslot = ld_cluster_slot(kept, strlen(kept));
    unsigned oslot = ld_cluster_slot(other, strlen(other));
    long long deadline = h_now_ms() + FAILOVER_MS;
    bool resumed = false;
    for (int n = 0; !resumed && h_now_ms() < deadline; n++) {
        char pfx[24], k[40];
        snprintf(pfx, sizeof(pfx), "load%d.", n);
        key_in_slot(vslot, pfx, k, sizeof(k));
        resumed = lock_or_unavailable(b, k, tok, sizeof(tok));
        snprintf(pfx, sizeof(pfx), "other%d.", n);
        key_in_slot(oslot, pfx, k, sizeof(k));
        lock_or_unavailable(b, k, tok, sizeof(tok));
    }
    ck_assert_msg(resumed, "no lock granted on the promoted replica");

    json_t *ev = h_lock_lost(a, lost, FAILOVER_MS);
    ck_assert_msg(ev != NULL, "no lock_lost for the unreplicated lock");
    ck_assert_str_eq(jstr(ev, "reason"), "failover");
    json_decref(ev);
    /* The replicated one is still held. */
    json_t *r = h_callf(b, ANSWER_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                        kept, "ttl_ms", 5000);
    ck_assert(r != NULL && h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    /* Fences never go backwards as seen by this daemon. */
    ck_assert_int_gt(must_lock(b, lost, NULL, 0), lost_fence);
    ck_assert_int_ge(h_stat(b, "redis_failovers"), 1);
    h_close(a);
    h_close(b);
}
END_TEST

/* CLUSTER FAILOVER: the daemon follows the switch; the replicated lock
 * is kept, and a waiter subscribed at the old master is woken by the
 * unlock on the new one. */
START_TEST(test_forced_failover)
{
    start_all("");
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D),
                  *w = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    int rep = h_cluster_replica_of(&C, m[0]);
    ck_assert_int_ge(rep, 0);
    char key[32], tok[64];
    key_on(m[0], "ff", key, sizeof(key));
    must_lock(a, key, tok, sizeof(tok));
    send_wait(w, key, 5);
    wait_waiter_on(m[0], key);
    replicated(m[0]);

    h_r_do(&C.node[rep], "CLUSTER FAILOVER");
    h_assert_stat(b, "redis_failovers", 1, FAILOVER_MS);
    ck_assert_int_eq(
        h_cluster_master_of_slot(&C, (int)ld_cluster_slot(key, strlen(key))),
        rep);
    /* Kept: another session still finds it taken. */
    json_t *r = h_callf(b, ANSWER_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                        key, "ttl_ms", 5000);
    ck_assert(r != NULL && h_ok(r) && !jtrue(r, "acquired"));
    json_decref(r);
    wait_waiter_on(rep, key);
    must_unlock(a, key, tok);
    assert_woken(w, 5, 5000);
    h_close(a);
    h_close(b);
    h_close(w);
}
END_TEST

/* The eviction check reaches every master: one master with allkeys-lru
 * is found and named; after its replica (noeviction) took over, the
 * check that follows the failover clears the gauge. */
START_TEST(test_eviction_per_master)
{
    char redis[512], needle[64];
    ck_assert_int_eq(h_cluster_start_ex(&C, 3, NULL), 0);
    int m[3];
    masters(m);
    h_r_do(&C.node[m[1]], "CONFIG SET maxmemory-policy allkeys-lru");
    h_cluster_yaml(&C, "  timeout_ms: 500\n", redis, sizeof(redis));
    ck_assert_int_eq(h_daemon_start(&D, &C.node[0], redis), 0);
    struct h_conn *a = h_connect_ok(&D);
    h_assert_stat(a, "redis_eviction_unsafe", 1, T_MS * 3);
    snprintf(needle, sizeof needle, "redis=127.0.0.1:%d maxmemory_policy",
             C.node[m[1]].port);
    ck_assert(h_wait_log(&D, needle, T_MS));

    int rep = h_cluster_replica_of(&C, m[1]);
    ck_assert_int_ge(rep, 0);
    h_r_do(&C.node[rep], "CLUSTER FAILOVER");
    h_assert_stat(a, "redis_failovers", 1, FAILOVER_MS);
    h_assert_stat(a, "redis_eviction_unsafe", 0, FAILOVER_MS);
    h_close(a);
}
END_TEST

/* A master and its replica gone, the cluster told to serve the rest
 * (cluster-require-full-coverage no): a cache.mget across the masters
 * answers per key, an error object for the keys of the lost one; a
 * cache.invalidate with keys names the keys only queued. */
START_TEST(test_master_lost_per_key)
{
    start_all_ex("--cluster-require-full-coverage no", "");
    struct h_conn *a = h_connect_ok(&D);
    h_assert_stat(a, "redis_cluster_nodes", 3, T_MS);
    int m[3];
    masters(m);
    char ck[3][32];
    for (int i = 0; i < 3; i++) {
        key_on(m[i], "pk", ck[i], sizeof(ck[i]));
        must_set(a, ck[i], ck[i]);
    }
    int rep = h_cluster_replica_of(&C, m[0]);
    ck_assert_int_ge(rep, 0);
    h_redis_kill(&C.node[rep]);
    h_redis_kill(&C.node[m[0]]);

    long long t0 = h_now_ms();
    json_t *r = h_callf(a, 2 * ANSWER_MS, "{s:s,s:[s,s,s]}", "op",
                        "cache.mget", "keys", ck[1], ck[0], ck[2]);
    ck_assert_msg(r != NULL && h_ok(r), "mget: %s",
                  r != NULL ? jmsg(r) : "no answer");
    ck_assert_int_lt(h_now_ms() - t0, 2 * ANSWER_MS);
    json_t *res = json_object_get(r, "results");
    ck_assert_int_eq(json_array_size(res), 3);
    json_t *lost = json_array_get(res, 1);
    ck_assert(!h_ok(lost));
    ck_assert_str_eq(h_errcode(lost), "redis_unavailable");
    ck_assert(h_ok(json_array_get(res, 0)) &&
              jtrue(json_array_get(res, 0), "hit"));
    ck_assert_str_eq(jstr(json_array_get(res, 0), "value"), ck[1]);
    ck_assert(h_ok(json_array_get(res, 2)) &&
              jtrue(json_array_get(res, 2), "hit"));
    ck_assert_str_eq(jstr(json_array_get(res, 2), "value"), ck[2]);
    json_decref(r);

    r = h_callf(a, 2 * ANSWER_MS, "{s:s,s:[s,s,s],s:i}", "op",
                "cache.invalidate", "keys", ck[1], ck[0], ck[2], "delay_ms",
                0);
    ck_assert_msg(r != NULL && h_ok(r), "invalidate: %s",
                  r != NULL ? jmsg(r) : "no answer");
    ck_assert(jtrue(r, "queued"));
    ck_assert_int_eq(jint(r, "deleted"), 2);
    json_t *q = json_object_get(r, "queued_keys");
    ck_assert_int_eq(json_array_size(q), 1);
    ck_assert_str_eq(json_string_value(json_array_get(q, 0)), ck[0]);
    json_decref(r);
    /* The others are gone indeed, and locks there still work. */
    r = h_callf(a, ANSWER_MS, "{s:s,s:s}", "op", "cache.get", "key", ck[2]);
    ck_assert(r != NULL && h_ok(r) && !jtrue(r, "hit"));
    json_decref(r);
    char tok[64];
    must_lock(a, ck[2], tok, sizeof(tok));
    must_unlock(a, ck[2], tok);
    ck_assert_int_eq(h_stat(a, "cache_invalidations_pending"), 1);

    /* The master comes back (its cluster config kept, its data not):
     * the journal's delete reaches it. */
    ck_assert_int_eq(h_redis_restart(&C.node[m[0]]), 0);
    h_assert_stat(a, "cache_invalidations_pending", 0, FAILOVER_MS);
    must_set(a, ck[0], "again");
    assert_cached(a, ck[0], "again");
    h_close(a);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(keys_on_every_master, 120),
        H_CASE(slot_migration, 120),
        H_CASE(master_killed, 180),
        H_CASE(master_lost_per_key, 120),
        H_CASE(forced_failover, 120),
        H_CASE(redisson_layout, 120),
        H_CASE(tls_nodes, 120),
        H_CASE(eviction_per_master, 120),
    };
    return H_MAIN(fx, cases);
}
