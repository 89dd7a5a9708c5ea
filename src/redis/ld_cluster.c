/*
 * Redis Cluster under the command queue: the slot map and the nodes of
 * its masters.
 *
 * The map comes from CLUSTER SLOTS, asked of any node with a ready
 * connection (the seeds of redis.addresses at first), and is asked again
 * periodically, after a MOVED, when a connection to a master is lost, and
 * after CLUSTERDOWN. Each master is a node of ld_redis with its own
 * redis.connections connections. A command goes to the master of the
 * hash slot of its route key; a MOVED re-points that slot and resends,
 * an ASK resends to the target after ASKING on the same connection, for
 * that command only, and TRYAGAIN/CLUSTERDOWN resend after a backoff
 * while the command's time lasts. None of these replies means the
 * command ran, so resending can not apply it twice.
 *
 * A full map in which a master that owned slots owns none any more while
 * a node that owned none now owns some is a failover: the locks held are
 * then checked again (see ld_redis_on_failover).
 *
 * It owns the slot map and which node serves a slot; the connections stay
 * ld_redis_slot.c's and the command records ld_redis.c's.
 */
#include "ld_redis_int.h"

#include "ld_redis.h"

#include "ld_cluster_slot.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define REFRESH_EVERY_MS 5000 /* the periodic check of the map */
#define REFRESH_GAP_MS 100    /* at most one refresh per this */
#define MAX_REDIRECTS 5
#define RETRY_FIRST_MS 5
#define RETRY_MAX_MS 100

struct rnode *
redis_cluster_node(unsigned slot)
{
    return redis_mod.slots != NULL ? redis_mod.slots[slot] : NULL;
}

/* The node of master ADDR ("host:port"), made and started if new. */
static struct rnode *
node_at(const char *text)
{
    for (int i = 0; i < redis_mod.n_nodes; i++) {
        struct rnode *n = redis_mod.nodes[i];
        if (n->instance == 0 && strcmp(n->address, text) == 0) {
            return n;
        }
    }
    struct ld_conn_addr addr;
    if (ld_conn_parse_address(text, &addr) != LD_OK) {
        return NULL;
    }
    log_info("redis cluster node address=%s", text);
    struct rnode *n = redis_node_new(0, &addr, text);
    redis_node_start(n);
    return n;
}

/* ---- the slot map ---------------------------------------------------- */

static void refresh_now(void);

static void
refresh_arm(uint64_t in_ms)
{
    struct timeval tv = ld_tv_ms(in_ms);
    event_add(redis_mod.refresh_ev, &tv);
}

static void
refresh_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    refresh_now();
}

void
redis_cluster_refresh_soon(const char *why)
{
    if (!redis_mod.cluster || redis_mod.freeing) {
        return;
    }
    if (redis_mod.refreshing) {
        /* The answer on its way may predate WHY: ask once more after. */
        redis_mod.refresh_again = true;
        return;
    }
    log_debug("redis cluster map refresh wanted reason=\"%s\"", why);
    uint64_t now = ld_now_ms();
    uint64_t next = redis_mod.last_refresh_ms + REFRESH_GAP_MS;
    refresh_arm(next > now ? next - now : 0);
}

/* Parse one "host port ..." entry of CLUSTER SLOTS into TEXT; an empty
 * host is the one of the node that answered. */
static bool
entry_address(const redisReply *m, const struct rnode *from, char *text,
              size_t len)
{
    if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
        m->element[0]->type != REDIS_REPLY_STRING ||
        m->element[1]->type != REDIS_REPLY_INTEGER) {
        return false;
    }
    const char *host = m->element[0]->str;
    if (host[0] == '\0' || strcmp(host, "?") == 0) {
        host = from->addr.host;
    }
    snprintf(text, len, "%s:%lld", host, m->element[1]->integer);
    return true;
}

/* Compare the masters of the new map with those of the last one. */
static bool
masters_changed_by_failover(void)
{
    bool gone = false, come = false;
    for (int i = 0; i < redis_mod.n_nodes; i++) {
        const struct rnode *n = redis_mod.nodes[i];
        if (n->instance != 0) {
            continue;
        }
        gone = gone || (n->was_master && !n->is_master);
        come = come || (!n->was_master && n->is_master);
    }
    return gone && come;
}

/* The slot map REPLY (CLUSTER SLOTS, asked of FROM) describes, with
 * the masters marked; *COVERED gets the number of slots it assigns. */
static struct rnode **
map_of_reply(const redisReply *reply, const struct rnode *from, int *covered)
{
    struct rnode **map = ld_xcalloc(LD_CLUSTER_SLOTS, sizeof(*map));
    for (int i = 0; i < redis_mod.n_nodes; i++) {
        redis_mod.nodes[i]->was_master = redis_mod.nodes[i]->is_master;
        redis_mod.nodes[i]->is_master = false;
    }
    *covered = 0;
    for (size_t i = 0; i < reply->elements; i++) {
        const redisReply *e = reply->element[i];
        char text[300];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            !entry_address(e->element[2], from, text, sizeof(text))) {
            continue;
        }
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        struct rnode *n = node_at(text);
        if (n == NULL || lo < 0 || hi >= LD_CLUSTER_SLOTS || lo > hi) {
            continue;
        }
        n->is_master = true;
        for (long long s = lo; s <= hi; s++) {
            map[s] = n;
        }
        *covered += (int)(hi - lo + 1);
    }
    return map;
}

static int
count_masters(void)
{
    int masters = 0;
    for (int i = 0; i < redis_mod.n_nodes; i++) {
        masters += redis_mod.nodes[i]->is_master ? 1 : 0;
    }
    return masters;
}

static void
slots_cb(redisReply *reply, void *arg)
{
    struct rnode *from = arg;
    redis_mod.refreshing = false;
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements == 0) {
        log_warn("redis cluster map refresh failed node=%s reason=\"%s\"",
                 from->address,
                 reply != NULL && reply->type == REDIS_REPLY_ERROR
                     ? reply->str
                     : ld_redis_failure_reason());
        refresh_arm(REFRESH_GAP_MS * 5);
        return;
    }
    int covered;
    struct rnode **map = map_of_reply(reply, from, &covered);
    bool first = !redis_mod.have_map;
    bool failover = !first && masters_changed_by_failover();
    bool changed = first || memcmp(map, redis_mod.slots,
                                   LD_CLUSTER_SLOTS * sizeof(*map)) != 0;
    free(redis_mod.slots);
    redis_mod.slots = map;
    redis_mod.have_map = true;
    redis_mod.last_refresh_ms = ld_now_ms();
    ld_stats.redis_cluster_refreshes++;
    int masters = count_masters();
    ld_stats.redis_cluster_nodes = masters;
    if (changed || covered < LD_CLUSTER_SLOTS) {
        log_info("redis cluster map masters=%d slots_covered=%d%s", masters,
                 covered, failover ? " (failover)" : "");
    }
    refresh_arm(redis_mod.refresh_again ? REFRESH_GAP_MS : REFRESH_EVERY_MS);
    redis_mod.refresh_again = false;
    redis_waiting_retry(redis_mod.unmapped);
    redis_map_changed(changed, failover);
}

static void
refresh_now(void)
{
    if (redis_mod.refreshing || redis_mod.freeing) {
        return;
    }
    /* A master of the map first, else any node (the seeds at first);
     * turn by turn, so that one node that answers badly is not the only
     * one asked. */
    struct rnode *pick = NULL;
    for (int pass = 0; pass < 2 && pick == NULL; pass++) {
        for (int k = 0; k < redis_mod.n_nodes; k++) {
            int i = (redis_mod.refresh_turn + k) % redis_mod.n_nodes;
            struct rnode *n = redis_mod.nodes[i];
            if (n->instance == 0 && n->n_ready > 0 &&
                (pass == 1 || n->is_master)) {
                pick = n;
                redis_mod.refresh_turn = i + 1;
                break;
            }
        }
    }
    if (pick == NULL) {
        /* Asked as soon as a node is ready (redis_cluster_node_up). */
        redis_mod.refresh_wanted = true;
        return;
    }
    redis_mod.refresh_wanted = false;
    redis_mod.refreshing = true;
    const char *argv[] = {"CLUSTER", "SLOTS"};
    size_t argvlen[] = {7, 5};
    redis_send_to(pick, 2, argv, argvlen, slots_cb, pick);
}

void
redis_cluster_node_up(struct rnode *n)
{
    LD_UNUSED(n);
    if (redis_mod.cluster &&
        (redis_mod.refresh_wanted || !redis_mod.have_map)) {
        redis_cluster_refresh_soon("a node is ready");
    }
}

/* ---- redirections ---------------------------------------------------- */

static void
retry_arm(void)
{
    uint64_t first = 0;
    struct rcmd *cmd;
    TAILQ_FOREACH(cmd, &redis_mod.retry, link)
    {
        if (first == 0 || cmd->x->retry_at_us < first) {
            first = cmd->x->retry_at_us;
        }
    }
    if (first == 0) {
        return;
    }
    ld_timer_at_us(redis_mod.retry_ev, first);
}

static void
retry_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    uint64_t now = ld_now_us();
    struct rcmd_queue due = TAILQ_HEAD_INITIALIZER(due);
    struct rcmd *cmd, *tmp;
    for (cmd = TAILQ_FIRST(&redis_mod.retry); cmd != NULL; cmd = tmp) {
        tmp = TAILQ_NEXT(cmd, link);
        if (cmd->x->retry_at_us <= now) {
            TAILQ_REMOVE(&redis_mod.retry, cmd, link);
            redis_mod.n_retry--;
            TAILQ_INSERT_TAIL(&due, cmd, link);
        }
    }
    while (!TAILQ_EMPTY(&due)) {
        cmd = TAILQ_FIRST(&due);
        TAILQ_REMOVE(&due, cmd, link);
        cmd->x->retrying = false;
        redis_route(cmd);
    }
    retry_arm();
}

/* "MOVED 3999 127.0.0.1:6381": the slot and the address. */
static bool
parse_redirect(const char *s, unsigned *slot, char *addr, size_t len)
{
    const char *sp = strchr(s, ' ');
    if (sp == NULL) {
        return false;
    }
    char *end;
    unsigned long v = strtoul(sp + 1, &end, 10);
    if (end == sp + 1 || *end != ' ' || v >= LD_CLUSTER_SLOTS) {
        return false;
    }
    *slot = (unsigned)v;
    snprintf(addr, len, "%s", end + 1);
    return addr[0] != '\0';
}

/* MOVED or ASK: CMD goes where REPLY says; false when it cannot (too
 * many redirections, an address nobody knows). */
static bool
follow_redirect(struct rcmd *cmd, const redisReply *reply, bool moved)
{
    unsigned slot;
    char addr[300];
    if (cmd->x->redirects >= MAX_REDIRECTS ||
        !parse_redirect(reply->str, &slot, addr, sizeof(addr))) {
        return false;
    }
    struct rnode *to = node_at(addr);
    if (to == NULL) {
        return false;
    }
    if (moved) {
        ld_stats.redis_moved++;
        if (redis_mod.slots != NULL) {
            redis_mod.slots[slot] = to;
        }
        redis_cluster_refresh_soon("MOVED");
        cmd->x->target = NULL;
        cmd->x->asking = false;
    } else {
        ld_stats.redis_ask++;
        cmd->x->target = to;
        cmd->x->asking = true;
    }
    cmd->x->redirects++;
    cmd->conn = NULL;
    cmd->noscript = false;
    redis_route(cmd);
    if (moved) {
        redis_map_changed(true, false);
    }
    return true;
}

/* TRYAGAIN or CLUSTERDOWN (DOWN): CMD is sent again after a backoff,
 * when that is within its time from its issue. */
static bool
retry_later(struct rcmd *cmd, bool down)
{
    uint64_t now = ld_now_us();
    uint64_t delay = (uint64_t)RETRY_FIRST_MS * 1000
                     << (cmd->x->tries < 5 ? cmd->x->tries : 5);
    if (delay > RETRY_MAX_MS * 1000) {
        delay = RETRY_MAX_MS * 1000;
    }
    if (now + delay >= cmd->x->issued_us + redis_cmd_timeout_us(cmd)) {
        return false;
    }
    if (down) {
        redis_cluster_refresh_soon("CLUSTERDOWN");
    }
    cmd->x->tries++;
    cmd->conn = NULL;
    cmd->x->retrying = true;
    cmd->x->retry_at_us = now + delay;
    TAILQ_INSERT_TAIL(&redis_mod.retry, cmd, link);
    redis_mod.n_retry++;
    retry_arm();
    return true;
}

bool
redis_cluster_redirect(struct rcmd *cmd, const redisReply *reply)
{
    bool moved = ld_reply_is_error(reply, "MOVED ");
    bool ask = ld_reply_is_error(reply, "ASK ");
    if (moved || ask) {
        return follow_redirect(cmd, reply, moved);
    }
    bool down = ld_reply_is_error(reply, "CLUSTERDOWN");
    if (!down && !ld_reply_is_error(reply, "TRYAGAIN")) {
        return false;
    }
    return retry_later(cmd, down);
}

/* ---- the node of a connection ---------------------------------------- */

int
ld_redis_conn_address(uint64_t conn_id, struct ld_conn_addr *addr, char *text,
                      size_t len)
{
    for (int k = 0; conn_id != 0 && k < redis_mod.n_nodes; k++) {
        const struct rnode *n = redis_mod.nodes[k];
        for (int i = 0; i < n->n_conns + n->n_lock; i++) {
            if (n->conns[i].id == conn_id) {
                *addr = n->addr;
                snprintf(text, len, "%s", n->address);
                return LD_OK;
            }
        }
    }
    return LD_ERR;
}

/* ---- start and stop -------------------------------------------------- */

/* BODY with its PUBLISH calls made SPUBLISH. */
static char *
sharded_body(const char *body)
{
    static const char *const from[] = {"redis.call('PUBLISH'",
                                       "redis.call('publish'"};
    static const char to[] = "redis.call('SPUBLISH'";
    size_t n = 0;
    for (const char *p = body; *p != '\0'; p++) {
        n += strncmp(p, from[0], strlen(from[0])) == 0 ||
             strncmp(p, from[1], strlen(from[1])) == 0;
    }
    char *out = ld_xmalloc(strlen(body) + n + 1);
    char *o = out;
    for (const char *p = body; *p != '\0';) {
        if (strncmp(p, from[0], strlen(from[0])) == 0 ||
            strncmp(p, from[1], strlen(from[1])) == 0) {
            memcpy(o, to, sizeof(to) - 1);
            o += sizeof(to) - 1;
            p += strlen(from[0]);
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

int
redis_cluster_init(void)
{
    const struct ld_config *cfg = redis_mod.ctx->cfg;
    redis_mod.cluster = true;
    TAILQ_INIT(&redis_mod.retry);
    redis_mod.refresh_ev = evtimer_new(redis_mod.ctx->base, refresh_cb, NULL);
    redis_mod.retry_ev = evtimer_new(redis_mod.ctx->base, retry_cb, NULL);
    if (redis_mod.refresh_ev == NULL || redis_mod.retry_ev == NULL) {
        ld_oom_in("evtimer_new");
    }
    /* Sharded pub/sub: a wake-up stays on the shard of its key. Every
     * script publishes with redis.call('PUBLISH', ...) or 'publish'. */
    for (int i = 0; i < REDIS_N_SCRIPTS; i++) {
        redis_mod.cluster_bodies[i] = sharded_body(redis_script_bodies[i]);
    }
    /* Commands whose slot has no known master wait here for a map. */
    redis_mod.unmapped = redis_node_new(-1, NULL, "the cluster slot map");
    /* The seeds; redis.address when there are none. */
    size_t n_seeds = cfg->redis.addresses.count;
    for (size_t i = 0; i < (n_seeds > 0 ? n_seeds : 1); i++) {
        const char *seed = n_seeds > 0 ? cfg->redis.addresses.items[i]
                                       : cfg->redis.address;
        struct ld_conn_addr addr;
        if (ld_conn_parse_address(seed, &addr) != LD_OK) {
            log_error("bad redis.addresses value=%s", seed);
            return LD_ERR;
        }
        if (node_at(seed) == NULL) {
            return LD_ERR;
        }
    }
    snprintf(redis_mod.unmapped->last_error,
             sizeof(redis_mod.unmapped->last_error),
             "no slot map from the cluster yet");
    return LD_OK;
}

void
redis_cluster_free(void)
{
    while (!TAILQ_EMPTY(&redis_mod.retry)) {
        struct rcmd *cmd = TAILQ_FIRST(&redis_mod.retry);
        TAILQ_REMOVE(&redis_mod.retry, cmd, link);
        cmd->x->retrying = false;
        redis_fail_later(cmd, LD_REDIS_NOT_SENT, "the daemon is stopping");
    }
    redis_mod.n_retry = 0;
    if (redis_mod.refresh_ev != NULL) {
        event_free(redis_mod.refresh_ev);
        redis_mod.refresh_ev = NULL;
    }
    if (redis_mod.retry_ev != NULL) {
        event_free(redis_mod.retry_ev);
        redis_mod.retry_ev = NULL;
    }
    free(redis_mod.slots);
    redis_mod.slots = NULL;
    for (int i = 0; i < REDIS_N_SCRIPTS; i++) {
        free(redis_mod.cluster_bodies[i]);
        redis_mod.cluster_bodies[i] = NULL;
    }
}
