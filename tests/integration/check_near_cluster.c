/* The near cache on Redis Cluster against real processes: three masters
 * and three replicas, the real leased with cache.near on. Keys of every
 * master are kept near (a near hit costs the owning master nothing) and a
 * write made on that master evicts them; a CLUSTER FAILOVER flushes and
 * the new master is tracked; the loss of one master's tracking
 * connection, or of a tracked command connection, flushes; a slot moved
 * to another master leaves nothing stale and is tracked there. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"
#include "near_util.h"

#include "ld_cluster_slot.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define T_MS 5000
#define FAILOVER_MS 30000
#define EVICT_MS 1000
#define PREFIX "leased:cache:"
#define NEAR_YAML                                                             \
    "cache:\n  ttl_jitter: 0\n  double_delete_ms: 0\n"                        \
    "  near: { enabled: true }\n"

static struct h_cluster C;
static struct h_daemon D;

static void
stop_cluster(void)
{
    h_cluster_stop(&C);
}

static const struct h_fixture fx = {
    .suite = "near_cluster",
    .daemons = {&D},
    .teardown = stop_cluster,
};

/* --- helpers ------------------------------------------------------------ */

/* For h_wait_until: node *ARG has the daemon's tracking connection. */
static bool
has_tracking(void *arg)
{
    return near_client_id(&C.node[*(const int *)arg], "track") > 0;
}

/* The cluster, leased on it with the near cache, every master tracked;
 * the masters by index in C.node in M. */
static struct h_conn *
start_all(int m[3])
{
    char redis[512], yaml[2048];
    ck_assert_int_eq(h_cluster_start(&C, 3), 0);
    h_cluster_yaml(&C, "  timeout_ms: 500\n", redis, sizeof(redis));
    snprintf(yaml, sizeof(yaml), "%s%s", redis, NEAR_YAML);
    ck_assert_int_eq(h_daemon_start(&D, &C.node[0], yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    h_assert_stat(c, "redis_cluster_nodes", 3, T_MS);
    m[0] = h_cluster_master_of_slot(&C, 0);
    m[1] = h_cluster_master_of_slot(&C, 8000);
    m[2] = h_cluster_master_of_slot(&C, 16000);
    ck_assert(m[0] >= 0 && m[1] >= 0 && m[2] >= 0);
    ck_assert(m[0] != m[1] && m[1] != m[2] && m[0] != m[2]);
    /* Each master's tracking connection comes with the first command
     * connection to it, and its start flushes: wait for all three, then
     * for every command connection to be tracked. */
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(h_wait_until(has_tracking, &m[i], T_MS),
                      "no tracking connection on master %d", i);
    }
    h_assert_stat(c, "near_tracking", 1, T_MS);
    return c;
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
set(struct h_conn *c, const char *key, const char *value)
{
    json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s,s:i}", "op", "cache.set",
                               "key", key, "value", value, "ttl_ms", 60000)));
}

static void
assert_not_near(struct h_conn *c, const char *key, const char *why)
{
    json_t *r = near_get(c, key);
    ck_assert_msg(!jtrue(r, "near"), "%s: %s was still near: %s", why, key,
                  h_dump(r));
    json_decref(r);
}

/* Write VALUE into KEY's entry directly on node I, as another writer. */
static void
write_on(int i, const char *key, const char *value)
{
    h_r_do(&C.node[i], "HSET " PREFIX "{%s} v %s", key, value);
}

/* Commands node I has run, leaving out INFO and PING (the test's and the
 * idle checks'), CLUSTER (the daemon's map refreshes) and REPLCONF (its
 * replica's acknowledgements). */
static long long
node_commands(int i)
{
    redisReply *r = h_redis_cmd(&C.node[i], "INFO commandstats");
    ck_assert_msg(r != NULL && r->type == REDIS_REPLY_STRING, "INFO failed");
    long long total = 0;
    char *save = NULL;
    for (char *line = strtok_r(r->str, "\r\n", &save); line != NULL;
         line = strtok_r(NULL, "\r\n", &save)) {
        char name[128];
        long long calls;
        if (sscanf(line, "cmdstat_%127[^:]:calls=%lld", name, &calls) != 2) {
            continue;
        }
        if (strcmp(name, "info") != 0 && strcmp(name, "ping") != 0 &&
            strncmp(name, "cluster", 7) != 0 &&
            strcmp(name, "replconf") != 0) {
            total += calls;
        }
    }
    freeReplyObject(r);
    return total;
}

/* Slot SLOT moved from master SRC to DST by hand, keys and all, as
 * redis-cli --cluster reshard does; THIRD is told too. Midway, with the
 * keys at DST and the slot still SRC's, KEY is read through C: evicted
 * by SRC's invalidation within a bound, then answered VALUE after ASK and
 * never kept (the read was not tracked where it ran). */
static void
migrate_slot(unsigned slot, int src, int dst, int third, struct h_conn *c,
             const char *key, const char *value)
{
    char sid[64], did[64];
    h_cluster_id(&C, src, sid, sizeof(sid));
    h_cluster_id(&C, dst, did, sizeof(did));
    h_r_do(&C.node[dst], "CLUSTER SETSLOT %u IMPORTING %s", slot, sid);
    h_r_do(&C.node[src], "CLUSTER SETSLOT %u MIGRATING %s", slot, did);
    redisReply *ks = h_redis_cmd(&C.node[src], "CLUSTER GETKEYSINSLOT %u 1000",
                                 slot);
    ck_assert(ks != NULL && ks->type == REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < ks->elements; i++) {
        h_r_do(&C.node[src], "MIGRATE 127.0.0.1 %d %s 0 5000",
               C.node[dst].port, ks->element[i]->str);
    }
    freeReplyObject(ks);
    /* The source's invalidation of the keys that left is on its way. */
    long long t0 = h_now_ms();
    for (;;) {
        json_t *r = near_get(c, key);
        bool near = jtrue(r, "near");
        ck_assert_msg(near_hit_of(r, value), "%s", h_dump(r));
        json_decref(r);
        if (!near) {
            break;
        }
        ck_assert_msg(h_now_ms() - t0 < EVICT_MS,
                      "the migrated key stayed near");
        usleep(1000);
    }
    long long asked = h_stat(c, "redis_ask");
    for (int n = 0; n < 10; n++) {
        json_t *r = near_get(c, key);
        ck_assert_msg(near_hit_of(r, value) && !jtrue(r, "near"),
                      "read %d while the slot moves: %s", n, h_dump(r));
        json_decref(r);
    }
    ck_assert_int_gt(h_stat(c, "redis_ask"), asked);
    h_r_do(&C.node[dst], "CLUSTER SETSLOT %u NODE %s", slot, did);
    h_r_do(&C.node[src], "CLUSTER SETSLOT %u NODE %s", slot, did);
    h_r_do(&C.node[third], "CLUSTER SETSLOT %u NODE %s", slot, did);
}

/* --- cases -------------------------------------------------------------- */

START_TEST(test_keys_on_every_master)
{
    int m[3];
    struct h_conn *c = start_all(m);
    char k[3][32];
    for (int i = 0; i < 3; i++) {
        key_on(m[i], "every", k[i], sizeof(k[i]));
        set(c, k[i], k[i]);
        near_get_until_near(c, k[i], k[i]);
    }
    for (int i = 0; i < 3; i++) {
        long long before = node_commands(m[i]);
        for (int n = 0; n < 50; n++) {
            json_t *r = near_get(c, k[i]);
            ck_assert_msg(near_hit_of(r, k[i]) && jtrue(r, "near"),
                          "master %d: not a near hit: %s", i, h_dump(r));
            json_decref(r);
        }
        ck_assert_msg(node_commands(m[i]) == before,
                      "near hits sent %lld commands to master %d",
                      node_commands(m[i]) - before, i);
    }
    /* mget across the masters: every key near. */
    json_t *mr = h_must(h_callf(c, T_MS, "{s:s,s:[s,s,s]}", "op", "cache.mget",
                                "keys", k[0], k[1], k[2]));
    json_t *res = json_object_get(mr, "results");
    for (int i = 0; i < 3; i++) {
        ck_assert_msg(near_hit_of(json_array_get(res, (size_t)i), k[i]) &&
                          jtrue(json_array_get(res, (size_t)i), "near"),
                      "mget: %s", h_dump(mr));
    }
    json_decref(mr);

    /* A write on each owning master evicts, within a bound. */
    for (int i = 0; i < 3; i++) {
        long long evicted = h_stat(c, "near_evictions_tracking");
        write_on(m[i], k[i], "new");
        long long ms = near_get_until(c, k[i], "new");
        ck_assert_msg(ms < EVICT_MS, "master %d: the write took %lld ms", i,
                      ms);
        ck_assert_int_gt(h_stat(c, "near_evictions_tracking"), evicted);
        near_get_until_near(c, k[i], "new");
    }
    h_close(c);
}
END_TEST

/* CLUSTER FAILOVER: the old master stays up as a replica, its tracking
 * connection too; the daemon flushes when the map shows the switch, and
 * tracks the new master. */
START_TEST(test_failover_flushes)
{
    int m[3];
    struct h_conn *c = start_all(m);
    char k0[32], k1[32];
    key_on(m[0], "fo", k0, sizeof(k0));
    key_on(m[1], "fo", k1, sizeof(k1));
    set(c, k0, "before");
    set(c, k1, "other");
    near_get_until_near(c, k0, "before");
    near_get_until_near(c, k1, "other");
    int rep = h_cluster_replica_of(&C, m[0]);
    ck_assert_int_ge(rep, 0);
    /* A manual failover waits for the replica to catch up: it must be
     * linked (past its first sync) and have every write. */
    ck_assert_msg(h_wait_until(h_replica_linked, &C.node[m[0]], FAILOVER_MS),
                  "the replica of master 0 never came online");
    ck_assert_int_ge(h_r_int(&C.node[m[0]], "WAIT 1 %d", T_MS), 1);
    long long flushes = h_stat(c, "near_flushes");

    h_r_do(&C.node[rep], "CLUSTER FAILOVER");
    h_assert_stat(c, "redis_failovers", 1, FAILOVER_MS);
    ck_assert_int_gt(h_stat(c, "near_flushes"), flushes);
    assert_not_near(c, k0, "after the failover");

    /* A value written on the new master is seen, then kept near from
     * there and evicted by the next write there. */
    ck_assert_int_eq(
        h_cluster_master_of_slot(&C, (int)ld_cluster_slot(k0, strlen(k0))),
        rep);
    write_on(rep, k0, "after");
    near_get_until(c, k0, "after");
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until_near(c, k0, "after");
    write_on(rep, k0, "again");
    ck_assert_msg(near_get_until(c, k0, "again") < EVICT_MS,
                  "the new master's write was slow to evict");
    h_close(c);
}
END_TEST

/* One master's tracking connection, then one of its command connections,
 * killed: everything is flushed before the next near hit, a write made
 * meanwhile is seen, and the near cache comes back. */
START_TEST(test_lost_connections_flush)
{
    int m[3];
    struct h_conn *c = start_all(m);
    char k1[32], k2[32];
    key_on(m[1], "tk", k1, sizeof(k1));
    key_on(m[2], "tk", k2, sizeof(k2));
    set(c, k1, "one");
    set(c, k2, "two");
    near_get_until_near(c, k1, "one");
    near_get_until_near(c, k2, "two");
    long long flushes = h_stat(c, "near_flushes");

    long long id = near_client_id(&C.node[m[1]], "track");
    ck_assert_msg(id > 0, "no tracking connection on master 1");
    ck_assert_msg(near_client_id(&C.node[m[2]], "track") > 0,
                  "no tracking connection on master 2");
    h_r_do(&C.node[m[1]], "CLIENT KILL ID %lld", id);
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    ck_assert_int_eq(h_stat(c, "near_entries"), 0);
    assert_not_near(c, k2, "after master 1's tracking was lost");
    write_on(m[1], k1, "one-b");
    near_get_until(c, k1, "one-b");
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until_near(c, k1, "one-b");
    write_on(m[1], k1, "one-c");
    ck_assert_msg(near_get_until(c, k1, "one-c") < EVICT_MS,
                  "not tracked again after the reconnect");

    /* A command connection of master 2: its tracked keys go unheard. */
    near_get_until_near(c, k2, "two");
    flushes = h_stat(c, "near_flushes");
    h_r_do(&C.node[m[2]], "CLIENT KILL TYPE normal SKIPME yes");
    ck_assert(h_wait_stat_min(c, "near_flushes", flushes + 1, T_MS));
    write_on(m[2], k2, "two-b");
    near_get_until(c, k2, "two-b");
    h_close(c);
}
END_TEST

/* A slot moved to another master with its keys: the entry kept from the
 * source goes, reads redirected meanwhile are not kept, a write on the
 * new owner is seen, and the key is tracked there. */
START_TEST(test_slot_migration)
{
    int m[3];
    struct h_conn *c = start_all(m);
    char k[32];
    key_on(m[0], "mig", k, sizeof(k));
    set(c, k, "src");
    near_get_until_near(c, k, "src");

    migrate_slot(ld_cluster_slot(k, strlen(k)), m[0], m[1], m[2], c, k, "src");
    write_on(m[1], k, "dst");
    near_get_until(c, k, "dst");
    h_assert_stat(c, "near_tracking", 1, T_MS);
    near_get_until_near(c, k, "dst");
    long long before = node_commands(m[1]);
    for (int n = 0; n < 20; n++) {
        json_t *r = near_get(c, k);
        ck_assert_msg(near_hit_of(r, "dst") && jtrue(r, "near"), "%s",
                      h_dump(r));
        json_decref(r);
    }
    ck_assert_msg(node_commands(m[1]) == before,
                  "near hits sent %lld commands to the new owner",
                  node_commands(m[1]) - before);
    write_on(m[1], k, "dst-2");
    ck_assert_msg(near_get_until(c, k, "dst-2") < EVICT_MS,
                  "a write on the new owner was slow to evict");
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(keys_on_every_master, 120),
        H_CASE(failover_flushes, 120),
        H_CASE(lost_connections_flush, 120),
        H_CASE(slot_migration, 120),
    };
    return H_MAIN(fx, cases);
}
