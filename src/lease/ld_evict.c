/* The eviction check (ld_evict.h).
 *
 * Which policies are unsafe: every one but noeviction. allkeys-* may
 * evict any key, the fence counters (which have no TTL) included;
 * volatile-* evicts keys that carry a TTL, and every lock hash carries
 * its lease as one (volatile-ttl even picks the shortest leases first).
 * Only noeviction, which refuses writes instead, never deletes a lock.
 *
 * What is asked: CONFIG GET maxmemory-policy, on the backend of redis.*
 * (in cluster mode on every master, reached by routing a key of one of
 * its slots) and on each Redlock instance. Managed Redis often renames
 * or refuses CONFIG: the policy is then unknown, logged once at info
 * level, not counted as unsafe in the gauge, and with
 * lock.require_noeviction refused like an unsafe one, since the
 * operator asked for proof and there is none. A check that got no
 * answer is tried again a second later while Redis is up. */

#include "ld_evict.h"

#include "ld_cluster_slot.h"
#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_redis.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define EV_SRC_MAX 64 /* masters of a cluster plus Redlock instances */
#define EV_RETRY_MS 1000

enum ev_state { EV_UNCHECKED, EV_SAFE, EV_UNSAFE, EV_UNKNOWN };

/* One Redis whose policy counts: INSTANCE (0: the backend of redis.*),
 * and in cluster mode the master ADDR, reached by ROUTE. */
struct ev_src {
    bool used;
    int instance;
    char addr[128];
    char route[16];
    enum ev_state state;
    char policy[64]; /* as Redis answered, or why it is unknown */
    enum ev_state logged_state;
    char logged_policy[64];
    unsigned gen; /* its last check's: a reply of an older one is ignored */
    bool inflight;
};

static struct {
    const struct ld_ctx *ctx;
    bool inited;
    struct ev_src src[EV_SRC_MAX];
    /* Cluster mode: a key of each slot (its decimal text). */
    uint32_t *slot_key;
    struct event *retry_ev;
    bool slots_unknown; /* cluster: the map did not cover every slot */
    unsigned gen;       /* of the last check sent, over all sources */
} evict_mod;

struct ev_check {
    int idx;
    unsigned gen;
};

static const char *
src_name(const struct ev_src *s, char *buf, size_t len)
{
    if (s->instance > 0) {
        snprintf(buf, len, "lock.redlock instance %d", s->instance);
    } else if (s->addr[0] != '\0') {
        snprintf(buf, len, "%s", s->addr);
    } else {
        snprintf(buf, len, "%s", ld_redis_address());
    }
    return buf;
}

static void
gauge_update(void)
{
    long long unsafe = 0;
    for (int i = 0; i < EV_SRC_MAX; i++) {
        if (evict_mod.src[i].used && evict_mod.src[i].state == EV_UNSAFE) {
            unsafe = 1;
        }
    }
    ld_stats.redis_eviction_unsafe = unsafe;
}

/* Once per change of the answer of one Redis. */
static void
src_log(struct ev_src *s)
{
    if (s->state == s->logged_state &&
        strcmp(s->policy, s->logged_policy) == 0) {
        return;
    }
    char name[160];
    src_name(s, name, sizeof name);
    const char *require = evict_mod.ctx->cfg->lock.require_noeviction
                              ? "true"
                              : "false";
    if (s->state == EV_UNSAFE) {
        log_warn("redis may evict locks under memory pressure, set "
                 "maxmemory-policy noeviction redis=%s maxmemory_policy=%s "
                 "evicts=%s require_noeviction=%s",
                 name, s->policy,
                 strncmp(s->policy, "allkeys-", 8) == 0 ? "locks,fences"
                                                        : "locks",
                 require);
    } else if (s->state == EV_UNKNOWN) {
        log_info("redis maxmemory-policy unknown, whether locks can be "
                 "evicted is not known redis=%s reason=\"%s\" "
                 "require_noeviction=%s",
                 name, s->policy, require);
    } else if (s->state == EV_SAFE) {
        log_info("redis keeps locks under memory pressure redis=%s "
                 "maxmemory_policy=%s",
                 name, s->policy);
    }
    s->logged_state = s->state;
    /* memcpy, not snprintf: GCC under the sanitizers takes the two
     * arrays of one struct for overlapping (-Werror=restrict). */
    size_t n = strnlen(s->policy, sizeof s->logged_policy - 1);
    memcpy(s->logged_policy, s->policy, n);
    s->logged_policy[n] = '\0';
}

static void retry_arm(void);

static void
retry_arm(void)
{
    if (evict_mod.retry_ev != NULL &&
        !evtimer_pending(evict_mod.retry_ev, NULL)) {
        struct timeval tv = {EV_RETRY_MS / 1000, (EV_RETRY_MS % 1000) * 1000};
        evtimer_add(evict_mod.retry_ev, &tv);
    }
}

static void
on_reply(redisReply *r, void *arg)
{
    struct ev_check *c = arg;
    int idx = c->idx;
    unsigned gen = c->gen;
    free(c);
    if (!evict_mod.inited) {
        return;
    }
    struct ev_src *s = &evict_mod.src[idx];
    if (!s->used || s->gen != gen) {
        return;
    }
    s->inflight = false;
    if (r == NULL) {
        retry_arm(); /* no answer says nothing about the policy */
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (ld_reply_is_unavailable(r)) {
            retry_arm();
            return;
        }
        s->state = EV_UNKNOWN;
        /* Quoted in the log: no quote of Redis' own in it. */
        snprintf(s->policy, sizeof s->policy, "CONFIG GET refused: %.40s",
                 r->str);
        for (char *p = s->policy; *p != '\0'; p++) {
            if (*p == '"' || *p == '\\' || *p == '\n') {
                *p = '\'';
            }
        }
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
               r->element[1]->type == REDIS_REPLY_STRING) {
        snprintf(s->policy, sizeof s->policy, "%s", r->element[1]->str);
        s->state = strcasecmp(s->policy, "noeviction") == 0 ? EV_SAFE
                                                            : EV_UNSAFE;
    } else {
        s->state = EV_UNKNOWN;
        snprintf(s->policy, sizeof s->policy, "CONFIG GET answered no policy");
    }
    src_log(s);
    gauge_update();
}

static void
check_send(int idx)
{
    struct ev_src *s = &evict_mod.src[idx];
    static const char *argv[] = {"CONFIG", "GET", "maxmemory-policy"};
    static const size_t lens[] = {6, 3, 16};
    struct ev_check *c = ld_xcalloc(1, sizeof(*c));
    /* Daemon-wide, so that a source dropped and made again in the same
     * slot never takes an old reply as its own. */
    s->gen = ++evict_mod.gen;
    s->inflight = true;
    c->idx = idx;
    c->gen = s->gen;
    struct ld_redis_opts o = {0};
    o.instance = s->instance;
    ld_redis_command_ex(&o, s->route, strlen(s->route), 3, argv, lens,
                        on_reply, c);
}

static int
src_find(int instance, const char *addr, bool create)
{
    int free_i = -1;
    for (int i = 0; i < EV_SRC_MAX; i++) {
        struct ev_src *s = &evict_mod.src[i];
        if (s->used && s->instance == instance && strcmp(s->addr, addr) == 0) {
            return i;
        }
        if (!s->used && free_i < 0) {
            free_i = i;
        }
    }
    if (!create || free_i < 0) {
        return -1;
    }
    struct ev_src *s = &evict_mod.src[free_i];
    memset(s, 0, sizeof(*s));
    s->used = true;
    s->instance = instance;
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    return free_i;
}

/* Cluster mode: one source per master of the slot map, each reached by a
 * key of one of its slots; masters gone from the map no longer count. */
static void
cluster_sources(void)
{
    if (evict_mod.slot_key == NULL) {
        evict_mod.slot_key = ld_xcalloc(LD_CLUSTER_SLOTS, sizeof(uint32_t));
        bool *seen = ld_xcalloc(LD_CLUSTER_SLOTS, sizeof(bool));
        unsigned left = LD_CLUSTER_SLOTS;
        char k[16];
        for (uint32_t n = 0; left > 0; n++) {
            int len = snprintf(k, sizeof k, "%u", n);
            unsigned slot = ld_cluster_slot(k, (size_t)len);
            if (!seen[slot]) {
                seen[slot] = true;
                evict_mod.slot_key[slot] = n;
                left--;
            }
        }
        free(seen);
    }
    bool present[EV_SRC_MAX] = {false};
    evict_mod.slots_unknown = false;
    char k[16], text[128];
    struct ld_conn_addr addr;
    for (unsigned slot = 0; slot < LD_CLUSTER_SLOTS; slot++) {
        int len = snprintf(k, sizeof k, "%u", evict_mod.slot_key[slot]);
        if (ld_redis_route_address(k, (size_t)len, &addr, text, sizeof text) !=
            LD_OK) {
            evict_mod.slots_unknown = true;
            continue;
        }
        int i = src_find(0, text, true);
        if (i < 0) {
            continue;
        }
        if (evict_mod.src[i].route[0] == '\0') {
            snprintf(evict_mod.src[i].route, sizeof evict_mod.src[i].route,
                     "%s", k);
        }
        present[i] = true;
    }
    for (int i = 0; i < EV_SRC_MAX; i++) {
        if (evict_mod.src[i].used && evict_mod.src[i].instance == 0 &&
            !present[i]) {
            evict_mod.src[i].used = false;
        }
    }
    if (evict_mod.slots_unknown) {
        /* The backend is up before its slot map is loaded: look again. */
        retry_arm();
    }
}

/* ALL: ask every Redis of INSTANCE again (it came back); else only
 * those never answered. */
static void
check_instance(int instance, bool all)
{
    if (instance == 0 && ld_redis_is_cluster()) {
        cluster_sources();
    } else {
        src_find(instance, "", true);
    }
    for (int i = 0; i < EV_SRC_MAX; i++) {
        struct ev_src *s = &evict_mod.src[i];
        if (s->used && s->instance == instance &&
            (all || (s->state == EV_UNCHECKED && !s->inflight))) {
            check_send(i);
        }
    }
    gauge_update();
}

static void
on_state(bool up, void *arg)
{
    LD_UNUSED(arg);
    if (up) {
        check_instance(0, true);
    }
}

static void
on_instance_state(int k, bool up, void *arg)
{
    LD_UNUSED(arg);
    if (up && k > 0) {
        check_instance(k, true);
    }
}

static void
on_retry(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    /* A refused CONFIG is not asked again: that changes nothing. A Redis
     * that is down is asked by its state watcher when it is back. */
    for (int i = 0; i < EV_SRC_MAX; i++) {
        struct ev_src *s = &evict_mod.src[i];
        if (s->used && !s->inflight && s->state == EV_UNCHECKED &&
            ld_redis_instance_ready(s->instance) &&
            !(s->instance == 0 && ld_redis_is_cluster())) {
            check_send(i);
        }
    }
    if (ld_redis_is_cluster() && ld_redis_instance_ready(0)) {
        check_instance(0, false);
    }
}

int
ld_evict_init(const struct ld_ctx *ctx, int instances)
{
    if (evict_mod.inited) {
        return LD_OK;
    }
    evict_mod.ctx = ctx;
    evict_mod.inited = true;
    evict_mod.retry_ev = evtimer_new(ctx->base, on_retry, NULL);
    ld_redis_on_state(on_state, NULL);
    if (instances > 0) {
        ld_redis_on_instance_state(on_instance_state, NULL);
    }
    return LD_OK;
}

void
ld_evict_free(void)
{
    if (!evict_mod.inited) {
        return;
    }
    evict_mod.inited = false;
    if (evict_mod.retry_ev != NULL) {
        event_free(evict_mod.retry_ev);
        evict_mod.retry_ev = NULL;
    }
    free(evict_mod.slot_key);
    evict_mod.slot_key = NULL;
    memset(evict_mod.src, 0, sizeof evict_mod.src);
}

bool
ld_evict_refuse(struct ld_req *req)
{
    if (!evict_mod.inited || !evict_mod.ctx->cfg->lock.require_noeviction) {
        return false;
    }
    for (int i = 0; i < EV_SRC_MAX; i++) {
        struct ev_src *s = &evict_mod.src[i];
        if (!s->used || s->state == EV_SAFE) {
            continue;
        }
        char name[160];
        src_name(s, name, sizeof name);
        if (s->state == EV_UNSAFE) {
            ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                           "redis %s has maxmemory-policy %s, which can "
                           "evict locks, and lock.require_noeviction is set",
                           name, s->policy);
        } else if (s->state == EV_UNKNOWN) {
            ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                           "the maxmemory-policy of redis %s is unknown "
                           "(%s) and lock.require_noeviction is set",
                           name, s->policy);
        } else {
            ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                           "the maxmemory-policy of redis %s is not checked "
                           "yet and lock.require_noeviction is set",
                           name);
        }
        return true;
    }
    return false;
}
