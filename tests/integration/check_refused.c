/* A Redis that is up but refuses writes: min-replicas-to-write without
 * enough replicas (NOREPLICAS, as a master under Sentinel answers while
 * its replica resyncs), a full maxmemory with noeviction (OOM), a failed
 * RDB save with stop-writes-on-bgsave-error (MISCONF), a master turned
 * replica (READONLY). Every op that writes must answer redis_unavailable,
 * as leased-protocol(7) says for a Redis that cannot serve now: never
 * wrong_type (the key holds nothing), never "not acquired" (nothing holds
 * it), never not_held (the holder still holds it), never internal; a
 * cache.invalidate is queued instead. What was refused changed nothing:
 * once Redis takes writes again the same unlock, release and fill do
 * what they would have done, and the daemon serves as before.
 *
 * OOM is the one refusal that lets some writes through: Redis checks
 * memory only for commands that may grow it, and a script that has
 * written once may finish. An unlock or release there may happen, and
 * then it must have happened in Redis too.
 *
 * The refusals are set with CONFIG SET on every master after the daemon
 * started, so on a cluster (on_cluster/check_refused.cluster) every
 * master refuses; MISCONF and READONLY need one server's directory and
 * REPLICAOF, and run on standalone Redis only (harness.c's
 * cluster_skips). Renewals refused for longer than a lease end the holds
 * they renew (renewal_refused). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;

static void reset_cluster(void);

static const struct h_fixture fx = {
    .suite = "refused",
    .redis = {&R},
    .daemons = {&D},
    .setup = reset_cluster,
};

#define T_MS 5000
#define LEASE_MS 60000

/* The fill lease outlives the refusal, so the fill refused can be sent
 * again once Redis takes writes; the near cache serves a read that Redis
 * need not see. */
static const char yaml[] = "cache:\n"
                           "  fill_lease_ms: 60000\n"
                           "  near: { enabled: true }\n";

/* --- the masters and their refusals ---------------------------------- */

#define MAX_MASTERS 6

/* The ports of every master: R's, or each master of the cluster. */
static int
masters(int *ports)
{
    const char *env = getenv("LD_TEST_CLUSTER");
    int n = 0;

    if (!h_on_cluster() || env == NULL) {
        ports[0] = R.port;
        return 1;
    }
    for (const char *p = env; p != NULL && *p && n < MAX_MASTERS;) {
        const char *colon = strchr(p, ':');
        if (colon == NULL) {
            break;
        }
        int port = atoi(colon + 1);
        redisContext *c = redisConnect("127.0.0.1", port);
        redisReply *rep = c != NULL && !c->err ? redisCommand(c, "ROLE")
                                               : NULL;
        if (rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
            rep->elements > 0 && rep->element[0]->type == REDIS_REPLY_STRING &&
            strcmp(rep->element[0]->str, "master") == 0) {
            ports[n++] = port;
        }
        if (rep != NULL) {
            freeReplyObject(rep);
        }
        if (c != NULL) {
            redisFree(c);
        }
        p = strchr(colon, ',');
        p = p != NULL ? p + 1 : NULL;
    }
    return n;
}

/* CMD on every master; with MUST, none may fail. */
static void
on_masters(bool must, const char *fmt, ...)
{
    int ports[MAX_MASTERS];
    int n = masters(ports);

    ck_assert_int_gt(n, 0);
    for (int i = 0; i < n; i++) {
        redisContext *c = redisConnect("127.0.0.1", ports[i]);
        ck_assert_msg(c != NULL && !c->err, "no connection to port %d",
                      ports[i]);
        va_list ap;
        va_start(ap, fmt);
        redisReply *rep = redisvCommand(c, fmt, ap);
        va_end(ap);
        ck_assert_msg(!must || (rep != NULL && rep->type != REDIS_REPLY_ERROR),
                      "%s on port %d: %s", fmt, ports[i],
                      rep != NULL && rep->str != NULL ? rep->str : "no reply");
        if (rep != NULL) {
            freeReplyObject(rep);
        }
        redisFree(c);
    }
}

/* A cluster serves every case of the program: whatever a case that failed
 * left refusing is undone before the next one. */
static void
reset_cluster(void)
{
    if (!h_on_cluster()) {
        return;
    }
    on_masters(false, "CONFIG SET min-replicas-to-write 0");
    on_masters(false, "CONFIG SET maxmemory 0");
}

enum refusal { NOREPLICAS, OOM, MISCONF, READONLY };

static const char *const refusal_name[] = {"NOREPLICAS", "OOM", "MISCONF",
                                           "READONLY"};

static char gone_dir[300];

static bool
bgsave_failed(void *arg)
{
    (void)arg;
    redisReply *rep = h_redis_cmd(&R, "INFO persistence");
    bool failed = rep != NULL && rep->type == REDIS_REPLY_STRING &&
                  strstr(rep->str, "rdb_last_bgsave_status:err") != NULL;
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return failed;
}

static void
refuse(enum refusal how)
{
    switch (how) {
    case NOREPLICAS:
        /* More good replicas than any master has (one, on a cluster). */
        on_masters(true, "CONFIG SET min-replicas-to-write 5");
        break;
    case OOM:
        /* One byte: whatever Redis uses already is over it. */
        on_masters(true, "CONFIG SET maxmemory-policy noeviction");
        on_masters(true, "CONFIG SET maxmemory 1");
        break;
    case MISCONF:
        /* A save that fails: the directory is gone when the child
         * writes its file (root ignores permissions). */
        ck_assert_int_eq(h_tmpdir(gone_dir, sizeof gone_dir), 0);
        h_r_do(&R, "CONFIG SET dir %s", gone_dir);
        ck_assert_int_eq(rmdir(gone_dir), 0);
        h_r_do(&R, "CONFIG SET stop-writes-on-bgsave-error yes");
        h_r_do(&R, "CONFIG SET save %s", "3600 1");
        h_r_do(&R, "BGSAVE");
        ck_assert_msg(h_wait_until(bgsave_failed, NULL, T_MS),
                      "the save did not fail");
        break;
    case READONLY: {
        /* A replica of a master that is not there keeps its data and
         * serves reads, and refuses every write. */
        h_r_do(&R, "REPLICAOF 127.0.0.1 %d", h_free_port());
        break;
    }
    }
}

static void
accept_writes(enum refusal how)
{
    switch (how) {
    case NOREPLICAS:
        on_masters(true, "CONFIG SET min-replicas-to-write 0");
        break;
    case OOM:
        on_masters(true, "CONFIG SET maxmemory 0");
        break;
    case MISCONF:
        /* Without save points a failed save no longer stops writes. */
        h_r_do(&R, "CONFIG SET dir %s", R.dir);
        h_r_do(&R, "CONFIG SET save %s", "");
        break;
    case READONLY:
        h_r_do(&R, "REPLICAOF NO ONE");
        break;
    }
}

/* --- requests -------------------------------------------------------- */

static json_t *
vcall(struct h_conn *c, const char *what, const char *fmt, va_list ap)
{
    json_error_t err;
    json_t *req = json_vpack_ex(&err, 0, fmt, ap);
    ck_assert_msg(req != NULL, "%s: bad request: %s", what, err.text);
    json_t *r = h_call(c, req, T_MS);
    ck_assert_msg(r != NULL, "%s: no answer", what);
    return r;
}

static json_t *
call(struct h_conn *c, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_t *r = vcall(c, what, fmt, ap);
    va_end(ap);
    return r;
}

static bool
is_unavailable(const json_t *r)
{
    return !h_ok(r) && h_errcode(r) != NULL &&
           strcmp(h_errcode(r), "redis_unavailable") == 0;
}

static void
expect_unavailable(struct h_conn *c, const char *what, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_t *r = vcall(c, what, fmt, ap);
    va_end(ap);
    ck_assert_msg(is_unavailable(r), "%s: %s, not redis_unavailable", what,
                  h_dump(r));
    json_decref(r);
}

/* A write on something held, under refusal HOW: refused, or (OOM, a write
 * that cannot grow memory) done. Returns whether it was done. */
static bool
refused_or_done(enum refusal how, json_t *r, const char *what)
{
    if (is_unavailable(r)) {
        json_decref(r);
        return false;
    }
    ck_assert_msg(how == OOM && h_ok(r), "%s under %s: %s", what,
                  refusal_name[how], h_dump(r));
    json_decref(r);
    return true;
}

/* --- what is held when Redis starts to refuse ------------------------- */

struct held {
    char plain[64], rd[64], wr[64], group[64], sem[64];
    char fill[64], rel[64]; /* fill leases */
};

static void
token_of(json_t *r, char *out, const char *what)
{
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "%s: %s", what, h_dump(r));
    snprintf(out, 64, "%s", jstr(r, "token"));
    json_decref(r);
}

static void
lease_of(json_t *r, char *out, const char *what)
{
    ck_assert_msg(h_ok(r) && !jtrue(r, "hit") && jstr(r, "lease") != NULL,
                  "%s: no fill lease: %s", what, h_dump(r));
    snprintf(out, 64, "%s", jstr(r, "lease"));
    json_decref(r);
}

static void
take_all(struct h_conn *c, struct held *h)
{
    token_of(call(c, "lock", "{s:s,s:s,s:i}", "op", "lock", "key", "p",
                  "ttl_ms", LEASE_MS),
             h->plain, "plain lock");
    token_of(call(c, "read lock", "{s:s,s:s,s:s,s:i}", "op", "lock", "key",
                  "r", "mode", "read", "ttl_ms", LEASE_MS),
             h->rd, "read lock");
    token_of(call(c, "write lock", "{s:s,s:s,s:s,s:i}", "op", "lock", "key",
                  "w", "mode", "write", "ttl_ms", LEASE_MS),
             h->wr, "write lock");
    token_of(call(c, "group", "{s:s,s:[s,s],s:i}", "op", "lock", "keys", "g1",
                  "g2", "ttl_ms", LEASE_MS),
             h->group, "multi-key lock");
    token_of(call(c, "sem", "{s:s,s:s,s:i,s:i}", "op", "sem.acquire", "key",
                  "s", "limit", 2, "ttl_ms", LEASE_MS),
             h->sem, "sem.acquire");
    lease_of(call(c, "get f", "{s:s,s:s}", "op", "cache.get", "key", "f"),
             h->fill, "cache.get f");
    lease_of(call(c, "get rel", "{s:s,s:s}", "op", "cache.get", "key", "rel"),
             h->rel, "cache.get rel");
}

/* The unlocks and releases of everything take_all took; DONE[i] says the
 * refusal let the i-th through already. */
#define N_GIVE 7

static json_t *
give(struct h_conn *c, const struct held *h, int i)
{
    switch (i) {
    case 0:
        return call(c, "unlock", "{s:s,s:s,s:s}", "op", "unlock", "key", "p",
                    "token", h->plain);
    case 1:
        return call(c, "read unlock", "{s:s,s:s,s:s,s:s}", "op", "unlock",
                    "key", "r", "mode", "read", "token", h->rd);
    case 2:
        return call(c, "write unlock", "{s:s,s:s,s:s,s:s}", "op", "unlock",
                    "key", "w", "mode", "write", "token", h->wr);
    case 3:
        return call(c, "multi-key unlock", "{s:s,s:[s,s],s:s}", "op", "unlock",
                    "keys", "g1", "g2", "token", h->group);
    case 4:
        return call(c, "sem.release", "{s:s,s:s,s:s}", "op", "sem.release",
                    "key", "s", "token", h->sem);
    case 5:
        /* Over version 0, the miss it loaded for. */
        return call(c, "cache.fill", "{s:s,s:s,s:s,s:s,s:i}", "op",
                    "cache.fill", "key", "f", "lease", h->fill, "value",
                    "loaded", "if_version", 0);
    default:
        return call(c, "cache.release", "{s:s,s:s,s:s}", "op", "cache.release",
                    "key", "rel", "lease", h->rel);
    }
}

static const char *const give_name[N_GIVE] = {
    "unlock",      "read unlock", "write unlock", "multi-key unlock",
    "sem.release", "cache.fill",  "cache.release"};

/* The answer of a give that Redis took: what it would have been at
 * once. */
static void
expect_given(int i, json_t *r)
{
    ck_assert_msg(h_ok(r), "%s once Redis takes writes: %s", give_name[i],
                  h_dump(r));
    if (i <= 3) {
        ck_assert_msg(jtrue(r, "released"), "%s: %s", give_name[i], h_dump(r));
    } else if (i == 4) {
        ck_assert_msg(jint(r, "released") == 1, "%s: %s", give_name[i],
                      h_dump(r));
    } else if (i == 5) {
        ck_assert_msg(jtrue(r, "stored"), "%s: %s", give_name[i], h_dump(r));
    } else {
        ck_assert_msg(jtrue(r, "released"), "%s: %s", give_name[i], h_dump(r));
    }
    json_decref(r);
}

/* The answer of a give sent again after Redis took it under OOM: the
 * first one happened, so there is nothing left to give. */
static void
expect_gone(int i, json_t *r)
{
    if (i <= 4) {
        ck_assert_msg(h_errcode(r) != NULL &&
                          strcmp(h_errcode(r), "not_held") == 0,
                      "%s again: %s", give_name[i], h_dump(r));
    } else {
        ck_assert_msg(h_ok(r) && !jtrue(r, i == 5 ? "stored" : "released"),
                      "%s again: %s", give_name[i], h_dump(r));
    }
    json_decref(r);
}

/* --- the scenario ------------------------------------------------------ */

/* Every writing op on keys nothing holds: refused, nothing written. */
static void
fresh_writes_refused(struct h_conn *c, enum refusal how)
{
    const char *why = refusal_name[how];
    char what[128];

#define EXPECT(op, ...)                                                       \
    do {                                                                      \
        snprintf(what, sizeof what, "%s, %s", why, op);                       \
        expect_unavailable(c, what, __VA_ARGS__);                             \
    } while (0)

    EXPECT("lock, fixed lease", "{s:s,s:s,s:i}", "op", "lock", "key", "a",
           "ttl_ms", 5000);
    EXPECT("lock, watchdog", "{s:s,s:s}", "op", "lock", "key", "b");
    EXPECT("lock, waiting", "{s:s,s:s,s:i}", "op", "lock", "key", "b2",
           "wait_ms", 300);
    EXPECT("write lock", "{s:s,s:s,s:s}", "op", "lock", "key", "c", "mode",
           "write");
    EXPECT("read lock", "{s:s,s:s,s:s}", "op", "lock", "key", "d", "mode",
           "read");
    EXPECT("read lock, waiting", "{s:s,s:s,s:s,s:i}", "op", "lock", "key",
           "d2", "mode", "read", "wait_ms", 300);
    EXPECT("multi-key lock", "{s:s,s:[s,s]}", "op", "lock", "keys", "x", "y");
    EXPECT("multi-key lock, waiting", "{s:s,s:[s,s],s:i}", "op", "lock",
           "keys", "x2", "y2", "wait_ms", 300);
    EXPECT("sem.acquire", "{s:s,s:s,s:i}", "op", "sem.acquire", "key", "s2",
           "limit", 2);
    EXPECT("sem.acquire, waiting", "{s:s,s:s,s:i,s:i}", "op", "sem.acquire",
           "key", "s3", "limit", 2, "wait_ms", 300);
    /* A read whose script also writes (the fill lease, the hot-key and
     * refresh marks) cannot be answered either. */
    EXPECT("cache.get", "{s:s,s:s}", "op", "cache.get", "key", "m");
    /* A new filter, and bits set in the filter scenario() made. */
    EXPECT("bloom.create", "{s:s,s:s,s:i,s:f}", "op", "bloom.create", "filter",
           "bf2", "capacity", 100, "error_rate", 0.01);
    EXPECT("bloom.add", "{s:s,s:s,s:[s]}", "op", "bloom.add", "filter", "bf",
           "keys", "bk");
    if (how != OOM) {
        /* Under OOM cache.set's script deletes first, and Redis lets a
         * script that has written finish its writes whatever the
         * memory. */
        EXPECT("cache.set", "{s:s,s:s,s:s,s:i}", "op", "cache.set", "key", "k",
               "value", "v", "ttl_ms", 10000);
        /* A versioned write whose version holds (0: nothing there) must
         * write, and so is refused. */
        EXPECT("cache.set if_version", "{s:s,s:s,s:s,s:i}", "op", "cache.set",
               "key", "k", "value", "v", "if_version", 0);
        json_t *mv = call(c, "cache.mset", "{s:s,s:[{s:s,s:s,s:i}]}", "op",
                          "cache.mset", "entries", "key", "k3", "value", "v",
                          "if_version", 0);
        json_t *mres = json_object_get(mv, "results");
        ck_assert_msg(h_ok(mv) && jint(mv, "stored") == 0 &&
                          is_unavailable(json_array_get(mres, 0)),
                      "%s, cache.mset if_version: %s", why, h_dump(mv));
        json_decref(mv);
        /* cache.mset answers ok, with each entry's refusal as its
         * result and none stored. */
        json_t *m = call(c, "cache.mset", "{s:s,s:[{s:s,s:s},{s:s,s:n}]}",
                         "op", "cache.mset", "entries", "key", "k1", "value",
                         "v", "key", "k2", "value");
        json_t *res = json_object_get(m, "results");
        ck_assert_msg(h_ok(m) && jint(m, "stored") == 0 &&
                          json_array_size(res) == 2 &&
                          is_unavailable(json_array_get(res, 0)) &&
                          is_unavailable(json_array_get(res, 1)),
                      "%s, cache.mset: %s", why, h_dump(m));
        json_decref(m);
    }
#undef EXPECT

    /* Requests that arrive together leave as one batch script on one
     * server: each item's refusal is that request's answer. */
    json_t *reqs[4];
    for (int i = 0; i < 4; i++) {
        char key[16];
        snprintf(key, sizeof key, "batch%d", i);
        reqs[i] = json_pack("{s:s,s:s,s:i}", "op", "lock", "key", key,
                            "ttl_ms", 5000);
    }
    ck_assert_int_eq(h_send_all(c, reqs, 4, 9001), 0);
    for (int i = 0; i < 4; i++) {
        json_t *r = h_recv_id(c, 9001 + i, T_MS);
        ck_assert_msg(r != NULL && is_unavailable(r),
                      "%s, batched lock %d: %s", why, i, h_dump(r));
        json_decref(r);
    }
}

/* KEY must read as VALUE from the near cache (within a few reads: the
 * first ones come from Redis and fill it). */
static void
read_until_near(struct h_conn *c, const char *key, const char *value)
{
    long long end = h_now_ms() + T_MS;
    json_t *r = NULL;
    do {
        json_decref(r);
        r = call(c, "cache.get", "{s:s,s:s,s:b}", "op", "cache.get", "key",
                 key, "lease", 0);
        ck_assert_msg(h_ok(r) && jtrue(r, "hit") && jstr(r, "value") &&
                          strcmp(jstr(r, "value"), value) == 0,
                      "cache.get %s: %s", key, h_dump(r));
    } while (!jtrue(r, "near") && h_now_ms() < end);
    ck_assert_msg(jtrue(r, "near"), "%s never served from the near cache: %s",
                  key, h_dump(r));
    json_decref(r);
}

static void
scenario(enum refusal how)
{
    const char *why = refusal_name[how];
    struct held h;
    bool done[N_GIVE];

    /* CONFIG SET dir is refused unless protected configs are enabled. */
    ck_assert_int_eq(h_redis_start(&R, how == MISCONF
                                           ? "--enable-protected-configs yes"
                                           : NULL),
                     0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);

    take_all(c, &h);
    json_decref(h_must(call(c, "bloom.create", "{s:s,s:s,s:i,s:f}", "op",
                            "bloom.create", "filter", "bf", "capacity", 100,
                            "error_rate", 0.01)));
    json_decref(
        h_must(call(c, "cache.set", "{s:s,s:s,s:s,s:i}", "op", "cache.set",
                    "key", "v", "value", "old", "ttl_ms", LEASE_MS)));
    read_until_near(c, "v", "old");
    json_decref(
        h_must(call(c, "cache.set", "{s:s,s:s,s:s,s:i}", "op", "cache.set",
                    "key", "hit", "value", "there", "ttl_ms", LEASE_MS)));
    long long keys = h_r_int(&R, "DBSIZE");

    refuse(how);
    fresh_writes_refused(c, how);
    ck_assert_msg(h_r_int(&R, "DBSIZE") == keys,
                  "%s: refused ops changed Redis (%lld keys, were %lld)", why,
                  h_r_int(&R, "DBSIZE"), keys);

    /* Extending what is held: refused, or (OOM) a PEXPIRE that cannot
     * grow memory. Either way the holder still holds it. */
    refused_or_done(how,
                    call(c, "extend", "{s:s,s:s,s:s,s:i}", "op", "extend",
                         "key", "p", "token", h.plain, "ttl_ms", LEASE_MS),
                    "extend");
    refused_or_done(how,
                    call(c, "read extend", "{s:s,s:s,s:s,s:s,s:i}", "op",
                         "extend", "key", "r", "mode", "read", "token", h.rd,
                         "ttl_ms", LEASE_MS),
                    "read extend");
    refused_or_done(how,
                    call(c, "write extend", "{s:s,s:s,s:s,s:s,s:i}", "op",
                         "extend", "key", "w", "mode", "write", "token", h.wr,
                         "ttl_ms", LEASE_MS),
                    "write extend");
    refused_or_done(how,
                    call(c, "multi-key extend", "{s:s,s:[s,s],s:s,s:i}", "op",
                         "extend", "keys", "g1", "g2", "token", h.group,
                         "ttl_ms", LEASE_MS),
                    "multi-key extend");

    /* Reads of what is held write nothing and are served. */
    json_t *q = call(c, "lock.info", "{s:s,s:s,s:s}", "op", "lock.info", "key",
                     "p", "token", h.plain);
    ck_assert_msg(h_ok(q) && jtrue(q, "locked") && jtrue(q, "mine"),
                  "%s, lock.info: %s", why, h_dump(q));
    json_decref(q);
    q = call(c, "lock.info", "{s:s,s:s}", "op", "lock.info", "key", "w");
    ck_assert_msg(h_ok(q) && jtrue(q, "locked") && jstr(q, "mode") &&
                      strcmp(jstr(q, "mode"), "write") == 0,
                  "%s, lock.info of the write lock: %s", why, h_dump(q));
    json_decref(q);
    q = call(c, "sem.info", "{s:s,s:s,s:i}", "op", "sem.info", "key", "s",
             "limit", 2);
    ck_assert_msg(h_ok(q) && jint(q, "held") == 1, "%s, sem.info: %s", why,
                  h_dump(q));
    json_decref(q);

    /* cache.mget answers per key: the hit, and for the miss whose lease
     * Redis refused, that key's own error. */
    q = call(c, "cache.mget", "{s:s,s:[s,s]}", "op", "cache.mget", "keys",
             "hit", "m2");
    json_t *res = json_object_get(q, "results");
    ck_assert_msg(h_ok(q) && json_array_size(res) == 2, "%s, cache.mget: %s",
                  why, h_dump(q));
    json_t *r0 = json_array_get(res, 0);
    ck_assert_msg(h_ok(r0) && jtrue(r0, "hit") && jstr(r0, "value") &&
                      strcmp(jstr(r0, "value"), "there") == 0,
                  "%s, cache.mget of a hit: %s", why, h_dump(q));
    ck_assert_msg(is_unavailable(json_array_get(res, 1)),
                  "%s, cache.mget of a miss: %s", why, h_dump(q));
    json_decref(q);
    /* Invalidations of several keys are queued whole, or (OOM: deletes
     * free memory) done. */
    q = call(c, "cache.invalidate", "{s:s,s:[s,s]}", "op", "cache.invalidate",
             "keys", "i1", "i2");
    ck_assert_msg(h_ok(q) && jint(q, "pending") == 2 &&
                      (how == OOM ||
                       (jtrue(q, "queued") &&
                        json_array_size(json_object_get(q, "queued_keys")) ==
                            2)),
                  "%s, cache.invalidate of two keys: %s", why, h_dump(q));
    json_decref(q);

    /* Giving back what is held: refused, and then nothing changed. */
    for (int i = 0; i < N_GIVE; i++) {
        char what[64];
        snprintf(what, sizeof what, "%s", give_name[i]);
        done[i] = refused_or_done(how, give(c, &h, i), what);
    }
    ck_assert_msg(h_r_int(&R, "EXISTS leased:lock:{p}") == !done[0],
                  "%s: unlock answered %s, the lock is %s", why,
                  done[0] ? "ok" : "refused", done[0] ? "there" : "gone");

    /* A hit in Redis: a plain read ("lease":false) writes nothing and is
     * served; one that may take a lease is served or, when its script
     * would also write, refused, never another error. */
    for (int lease = 0; lease < 2; lease++) {
        json_t *g = call(c, "cache.get hit", "{s:s,s:s,s:b}", "op",
                         "cache.get", "key", "hit", "lease", lease);
        ck_assert_msg((lease && is_unavailable(g)) ||
                          (h_ok(g) && jtrue(g, "hit") && jstr(g, "value") &&
                           strcmp(jstr(g, "value"), "there") == 0),
                      "%s: cache.get of a hit, lease %d: %s", why, lease,
                      h_dump(g));
        json_decref(g);
    }

    /* A near hit needs no Redis, but a key this daemon invalidated is
     * never served from it again, queued or not. */
    read_until_near(c, "v", "old");
    json_t *r = call(c, "cache.invalidate", "{s:s,s:s}", "op",
                     "cache.invalidate", "key", "v");
    ck_assert_msg(h_ok(r) && (how == OOM || jtrue(r, "queued")),
                  "%s, cache.invalidate: %s", why, h_dump(r));
    json_decref(r);
    r = call(c, "cache.get", "{s:s,s:s,s:b}", "op", "cache.get", "key", "v",
             "lease", 0);
    ck_assert_msg(is_unavailable(r) || (h_ok(r) && !jtrue(r, "hit")),
                  "%s: cache.get after invalidate: %s", why, h_dump(r));
    json_decref(r);
    h_assert_ping(c);

    /* Redis takes writes again: what was refused now happens as it would
     * have at once, the queued delete is carried out, and every op
     * serves. */
    accept_writes(how);
    for (int i = 0; i < N_GIVE; i++) {
        if (done[i]) {
            expect_gone(i, give(c, &h, i));
        } else {
            expect_given(i, give(c, &h, i));
        }
    }
    h_assert_stat(c, "cache_invalidations_pending", 0, 15000);
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:cache:{v}"), 0);
    r = call(c, "cache.get v", "{s:s,s:s}", "op", "cache.get", "key", "v");
    ck_assert_msg(h_ok(r) && !jtrue(r, "hit") && jstr(r, "lease") != NULL,
                  "%s: cache.get v once Redis takes writes: %s", why,
                  h_dump(r));
    json_decref(r);
    r = call(c, "cache.get f", "{s:s,s:s}", "op", "cache.get", "key", "f");
    ck_assert_msg(h_ok(r) && jtrue(r, "hit") && jstr(r, "value") &&
                      strcmp(jstr(r, "value"), "loaded") == 0,
                  "%s: the fill, sent again, is not there: %s", why,
                  h_dump(r));
    json_decref(r);

    json_decref(h_must(call(c, "cache.invalidate f", "{s:s,s:s,s:i}", "op",
                            "cache.invalidate", "key", "f", "delay_ms", 0)));
    take_all(c, &h);
    for (int i = 0; i < N_GIVE; i++) {
        expect_given(i, give(c, &h, i));
    }
    json_decref(
        h_must(call(c, "cache.set", "{s:s,s:s,s:s,s:i}", "op", "cache.set",
                    "key", "k", "value", "v", "ttl_ms", 10000)));
    h_close(c);
}

/* Session-bound holds renewed by the watchdog while Redis refuses the
 * renewals: each holder hears it is at risk, then, when the lease last
 * confirmed runs out, that it lost the hold (reason redis_unavailable,
 * the daemon could not renew it; not expired or taken). Redis lets the
 * lease run out too, so once it takes writes again another session gets
 * the lock and the permit. */
#define WATCHDOG_MS 1500

struct hold_events {
    const char *key, *risk, *lost;
    bool at_risk, gone;
};

START_TEST(test_renewal_refused)
{
    char yaml_wd[64];
    snprintf(yaml_wd, sizeof yaml_wd, "lock:\n  watchdog_ms: %d\n",
             WATCHDOG_MS);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml_wd), 0);
    struct h_conn *c = h_connect_ok(&D);
    char lt[64], st[64];
    token_of(call(c, "lock", "{s:s,s:s}", "op", "lock", "key", "wd"), lt,
             "watchdog lock");
    token_of(call(c, "sem", "{s:s,s:s,s:i}", "op", "sem.acquire", "key", "ws",
                  "limit", 1),
             st, "watchdog grant");
    refuse(NOREPLICAS);

    /* The two holds' events come in either order. */
    struct hold_events hold[2] = {
        {"wd", "lock_at_risk", "lock_lost", false, false},
        {"ws", "sem_at_risk", "sem_lost", false, false},
    };
    long long end = h_now_ms() + 10 * WATCHDOG_MS;
    while (!(hold[0].gone && hold[1].gone) && h_now_ms() < end) {
        json_t *ev = h_event(c, (int)(end - h_now_ms()));
        if (ev == NULL) {
            break;
        }
        const char *name = jstr(ev, "event"), *key = jstr(ev, "key");
        for (int i = 0; i < 2 && name != NULL && key != NULL; i++) {
            struct hold_events *e = &hold[i];
            if (strcmp(key, e->key) != 0) {
                continue;
            }
            ck_assert_msg(!e->gone, "an event after %s: %s", e->lost,
                          h_dump(ev));
            if (strcmp(name, e->risk) == 0) {
                e->at_risk = true;
            } else if (strcmp(name, e->lost) == 0) {
                ck_assert_msg(e->at_risk, "%s without %s first", e->lost,
                              e->risk);
                ck_assert_msg(jstr(ev, "reason") != NULL &&
                                  strcmp(jstr(ev, "reason"),
                                         "redis_unavailable") == 0,
                              "%s: %s", e->lost, h_dump(ev));
                e->gone = true;
            }
        }
        json_decref(ev);
    }
    ck_assert_msg(hold[0].gone, "no lock_lost while renewals were refused");
    ck_assert_msg(hold[1].gone, "no sem_lost while renewals were refused");
    h_assert_ping(c);

    accept_writes(NOREPLICAS);
    struct h_conn *o = h_connect_ok(&D);
    json_t *r = call(o, "lock", "{s:s,s:s,s:i}", "op", "lock", "key", "wd",
                     "wait_ms", 5000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"),
                  "the lock lost is not free: %s", h_dump(r));
    json_decref(r);
    r = call(o, "sem", "{s:s,s:s,s:i,s:i}", "op", "sem.acquire", "key", "ws",
             "limit", 1, "wait_ms", 5000);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"),
                  "the permit lost is not free: %s", h_dump(r));
    json_decref(r);
    r = call(c, "unlock", "{s:s,s:s,s:s}", "op", "unlock", "key", "wd",
             "token", lt);
    ck_assert_msg(h_errcode(r) != NULL &&
                      strcmp(h_errcode(r), "not_held") == 0,
                  "unlock of the lock lost: %s", h_dump(r));
    json_decref(r);
    h_close(o);
    h_close(c);
}
END_TEST

START_TEST(test_no_replicas)
{
    scenario(NOREPLICAS);
}
END_TEST

START_TEST(test_out_of_memory)
{
    scenario(OOM);
}
END_TEST

START_TEST(test_misconf)
{
    scenario(MISCONF);
}
END_TEST

START_TEST(test_readonly)
{
    scenario(READONLY);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(no_replicas, 90),     H_CASE(out_of_memory, 90),
        H_CASE(misconf, 90),         H_CASE(readonly, 90),
        H_CASE(renewal_refused, 60),
    };

    return H_MAIN(fx, cases);
}
