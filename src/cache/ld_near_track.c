/*
 * Redis client tracking for the near cache, in RESP2 redirect mode.
 *
 * One connection of its own (role "track", through ld_conn, which pings
 * it when idle) asks CLIENT ID and subscribes to __redis__:invalidate.
 * Every shared command connection turns tracking on with REDIRECT to that
 * id, as the last step of its handshake (ld_redis_conn_hooks), or, for
 * connections already up when the tracking connection (re)starts, by a
 * command pinned to each. Redis then sends the tracking connection the
 * keys that change after they were read; a null message means FLUSHALL
 * or FLUSHDB.
 *
 * Tracking is per key (Redis' default mode, not BCAST) with OPTIN: only
 * the reads the near cache means to keep (CLIENT CACHING yes before the
 * probe) enter Redis' tracking table, so lock keys and keys not admitted
 * by cache.near.min_hits cost Redis nothing, and each daemon hears only of
 * the keys it keeps. BCAST would send every daemon every write under the
 * prefix.
 *
 * A command connection is trusted once Redis has confirmed tracking on it
 * towards the current tracking id. Losing the tracking connection, or a
 * trusted command connection (its tracked keys die with it, and their
 * invalidations with them), flushes the store.
 *
 * Redis Cluster: a REDIRECT names a client of the same server, so each
 * node that command connections go to gets its own tracking connection
 * (made when the first of them starts its handshake), and a connection is
 * trusted only towards its own node's. Any change of the slot map (a
 * failover, a slot moved, a node gone) flushes the store: the keys read
 * from a master that lost its slots would go unheard once another serves
 * them.
 *
 * It owns the tracking connection and the trust in each command connection's
 * tracking; the entries are ld_near.c's, which it tells of the keys that
 * changed.
 */
#include "ld_near_int.h"

#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_redis.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define CHANNEL "__redis__:invalidate"
/* A connection still loading its scripts is ready within a few ms. */
#define REISSUE_RETRY_MS 5

/* A server the command connections go to, and its tracking connection. */
struct tnode {
    struct ld_conn *conn;
    char address[300];  /* cluster mode: which node */
    uint64_t client_id; /* of the tracking connection, 0: not known */
    bool subscribed;
};

struct tconn {
    uint64_t id;       /* 0: free slot */
    uint64_t redirect; /* the tracking id Redis confirmed, 0: none */
    uint64_t asked;    /* the tracking id of a request in flight */
    struct tnode *node;
};

/* A pinned CLIENT TRACKING in flight. */
struct reissue {
    uint64_t conn_id;
    uint64_t client_id;
};

static struct {
    const struct ld_ctx *ctx;
    bool cluster;
    /* Standalone and sentinel: nodes[0] alone, wherever redis.* points.
     * Cluster mode: every node ever connected to, as ld_redis keeps
     * them. */
    struct tnode **nodes;
    int n_nodes;
    bool have_addr;
    bool started;
    bool refused_logged;
    /* The shared command connections and those set aside; id 0: free. */
    struct tconn *conns;
    size_t n_conns;
    struct event *retry_ev;
    char id_text[24];
    struct ld_redis_conn_hooks hooks;
} track_mod;

static bool
node_armed(const struct tnode *n)
{
    return n != NULL && n->client_id != 0 && n->subscribed;
}

bool
near_track_armed(void)
{
    for (int i = 0; i < track_mod.n_nodes; i++) {
        if (node_armed(track_mod.nodes[i])) {
            return true;
        }
    }
    return false;
}

static struct tconn *
tconn_find(uint64_t id)
{
    for (size_t i = 0; i < track_mod.n_conns; i++) {
        if (track_mod.conns[i].id == id) {
            return &track_mod.conns[i];
        }
    }
    return NULL;
}

static bool
tconn_trusted(const struct tconn *t)
{
    return node_armed(t->node) && t->redirect == t->node->client_id;
}

bool
near_track_trusted(uint64_t conn_id)
{
    if (conn_id == 0) {
        return false;
    }
    const struct tconn *t = tconn_find(conn_id);
    return t != NULL && tconn_trusted(t);
}

/* near_tracking: invalidations arrive and every command connection is
 * tracked towards them, so every read from now on may be kept. */
static void
set_armed_stat(void)
{
    bool all = near_track_armed();
    for (size_t i = 0; all && i < track_mod.n_conns; i++) {
        const struct tconn *t = &track_mod.conns[i];
        all = t->id == 0 || tconn_trusted(t);
    }
    ld_stats.near_tracking = all ? 1 : 0;
}

/* CLIENT TRACKING on REDIRECT <id> OPTIN into ARGV (room for 6). */
static int
tracking_argv(uint64_t client_id, const char **argv, size_t *argvlen)
{
    snprintf(track_mod.id_text, sizeof(track_mod.id_text), "%" PRIu64,
             client_id);
    static const char *const words[] = {"CLIENT",   "TRACKING", "on",
                                        "REDIRECT", NULL,       "OPTIN"};
    for (int i = 0; i < 6; i++) {
        argv[i] = words[i] != NULL ? words[i] : track_mod.id_text;
        argvlen[i] = strlen(argv[i]);
    }
    return 6;
}

static bool
is_ok(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_STATUS &&
           strcmp(r->str, "OK") == 0;
}

static void
log_refused(uint64_t conn_id, const redisReply *r)
{
    if (track_mod.refused_logged) {
        return;
    }
    track_mod.refused_logged = true;
    log_error("near cache: redis refused client tracking conn_id=%" PRIu64
              " error=\"%s\" (Redis 6 or later, and the ACL permissions "
              "CLIENT and SUBSCRIBE, are needed; nothing is kept near)",
              conn_id,
              r != NULL && r->type == REDIS_REPLY_ERROR ? r->str
                                                        : "no answer");
}

/* ---- the command connections (ld_redis_conn_hooks) ------------------- */

static void reissue_all(void);

static void
reissue_cb(redisReply *reply, void *arg)
{
    struct reissue *ri = arg;
    struct tconn *t = tconn_find(ri->conn_id);
    if (t != NULL && t->asked == ri->client_id) {
        t->asked = 0;
        if (is_ok(reply)) {
            t->redirect = ri->client_id;
            set_armed_stat();
        } else if (ld_redis_outcome() == LD_REDIS_NOT_SENT) {
            /* Still in its handshake (or just gone): ask again soon. */
            struct timeval tv = ld_tv_ms(REISSUE_RETRY_MS);
            event_add(track_mod.retry_ev, &tv);
        } else {
            log_refused(ri->conn_id, reply);
        }
    }
    free(ri);
}

/* Point every known command connection at its node's tracking id. */
static void
reissue_all(void)
{
    for (size_t i = 0; i < track_mod.n_conns; i++) {
        struct tconn *t = &track_mod.conns[i];
        if (t->id == 0 || !node_armed(t->node) ||
            t->redirect == t->node->client_id ||
            t->asked == t->node->client_id) {
            continue;
        }
        uint64_t client_id = t->node->client_id;
        const char *argv[6];
        size_t argvlen[6];
        int n = tracking_argv(client_id, argv, argvlen);
        struct reissue *ri = ld_xcalloc(1, sizeof(*ri));
        ri->conn_id = t->id;
        ri->client_id = client_id;
        t->asked = client_id;
        struct ld_redis_opts o = {.pool = LD_REDIS_POOL_SHARED, .pin = t->id};
        ld_redis_command_ex(&o, "", 0, n, argv, argvlen, reissue_cb, ri);
    }
}

static void
retry_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    reissue_all();
}

static struct tnode *node_of(uint64_t conn_id);

/* A free entry for a command connection (the table grows; entries move). */
static struct tconn *
tconn_new(void)
{
    struct tconn *t = tconn_find(0);
    if (t == NULL) {
        size_t n = track_mod.n_conns;
        size_t grown = n == 0 ? 16 : 2 * n;
        track_mod.conns = ld_xrealloc(track_mod.conns,
                                      grown * sizeof(*track_mod.conns));
        memset(&track_mod.conns[n], 0, (grown - n) * sizeof(*t));
        track_mod.n_conns = grown;
        t = &track_mod.conns[n];
    }
    return t;
}

static int
hook_handshake(uint64_t conn_id, const char **argv, size_t *argvlen, int max,
               void *arg)
{
    LD_UNUSED(arg);
    struct tconn *t = tconn_find(conn_id);
    if (t == NULL) {
        struct tnode *node = node_of(conn_id);
        if (node == NULL) {
            return 0; /* never trusted: its reads are not kept */
        }
        t = tconn_new();
        t->id = conn_id;
        t->redirect = 0;
        t->asked = 0;
        t->node = node;
        set_armed_stat();
    }
    /* Without a tracking id yet, reissue_all turns it on later. */
    if (!node_armed(t->node) || max < 6) {
        return 0;
    }
    t->asked = t->node->client_id;
    return tracking_argv(t->node->client_id, argv, argvlen);
}

static void
hook_reply(uint64_t conn_id, const redisReply *reply, void *arg)
{
    LD_UNUSED(arg);
    struct tconn *t = tconn_find(conn_id);
    if (t == NULL) {
        return;
    }
    uint64_t asked = t->asked;
    t->asked = 0;
    if (!is_ok(reply)) {
        log_refused(conn_id, reply);
        return;
    }
    t->redirect = asked;
    set_armed_stat();
    if (asked != t->node->client_id) {
        /* The tracking connection changed meanwhile. */
        struct timeval tv = ld_tv_ms(REISSUE_RETRY_MS);
        event_add(track_mod.retry_ev, &tv);
    }
}

static void
hook_lost(uint64_t conn_id, void *arg)
{
    LD_UNUSED(arg);
    struct tconn *t = tconn_find(conn_id);
    if (t == NULL) {
        return;
    }
    bool trusted = near_track_trusted(conn_id);
    memset(t, 0, sizeof(*t));
    set_armed_stat();
    if (trusted) {
        near_flush("a tracked command connection was lost");
    }
}

static void
hook_map(bool changed, bool failover, void *arg)
{
    LD_UNUSED(arg);
    if (failover) {
        near_flush("a cluster failover");
    } else if (changed) {
        near_flush("the cluster slot map changed");
    }
}

/* ---- the tracking connections ----------------------------------------- */

static void
on_message(const redisReply *m)
{
    if (m->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < m->elements; i++) {
            const redisReply *k = m->element[i];
            if (k->type == REDIS_REPLY_STRING) {
                near_invalidate(k->str, k->len);
            }
        }
    } else if (m->type == REDIS_REPLY_NIL) {
        near_flush("FLUSHALL or FLUSHDB in redis");
    }
}

static void
push_cb(struct ld_conn *conn, redisReply *r, void *owner)
{
    LD_UNUSED(conn);
    struct tnode *node = owner;
    if (r->type == REDIS_REPLY_INTEGER) {
        node->client_id = (uint64_t)r->integer; /* CLIENT ID */
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        log_error("near cache: tracking connection error=\"%s\"", r->str);
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING ||
        strcmp(r->element[1]->str, CHANNEL) != 0) {
        return;
    }
    const char *kind = r->element[0]->str;
    if (strcmp(kind, "message") == 0) {
        on_message(r->element[2]);
    } else if (strcmp(kind, "subscribe") == 0 && node->client_id != 0) {
        /* Reads sent before the command connections point here may have
         * been tracked towards a connection that is gone. */
        near_flush("tracking (re)started");
        node->subscribed = true;
        set_armed_stat();
        log_info("near cache tracking ready client_id=%" PRIu64 "%s%s",
                 node->client_id, track_mod.cluster ? " node=" : "",
                 track_mod.cluster ? node->address : "");
        reissue_all();
    }
}

static void
ready_cb(struct ld_conn *conn, void *owner)
{
    struct tnode *node = owner;
    node->client_id = 0;
    node->subscribed = false;
    /* Answered in this order: the id, then the subscription. */
    const char *iv[] = {"CLIENT", "ID"};
    size_t il[] = {6, 2};
    const char *sv[] = {"SUBSCRIBE", CHANNEL};
    size_t sl[] = {9, sizeof(CHANNEL) - 1};
    if (ld_conn_send(conn, 2, iv, il) != LD_OK ||
        ld_conn_send(conn, 2, sv, sl) != LD_OK) {
        ld_conn_close(conn, "could not subscribe");
    }
}

static void
down_cb(struct ld_conn *conn, bool was_ready, const char *why, void *owner)
{
    LD_UNUSED(conn);
    struct tnode *node = owner;
    bool armed = node_armed(node);
    node->client_id = 0;
    node->subscribed = false;
    set_armed_stat();
    if (!was_ready) {
        log_debug("near cache tracking connect failed error=\"%s\"", why);
        return;
    }
    log_warn("near cache tracking connection lost reason=\"%s\"%s%s", why,
             track_mod.cluster ? " node=" : "",
             track_mod.cluster ? node->address : "");
    if (armed) {
        char reason[256];
        snprintf(reason, sizeof(reason), "tracking connection lost: %s", why);
        near_flush(reason);
    }
}

static const struct ld_conn_ops track_ops = {
    .on_ready = ready_cb,
    .on_down = down_cb,
    .on_reply = NULL,
    .on_push = push_cb,
    .on_stall = NULL,
};

static struct tnode *
node_new(const struct ld_conn_addr *addr, const char *text)
{
    struct tnode *node = ld_xcalloc(1, sizeof(*node));
    snprintf(node->address, sizeof(node->address), "%s", text);
    node->conn = ld_conn_new(track_mod.ctx, addr, LD_CONN_ROLE_TRACK,
                             &track_ops, node);
    track_mod.nodes = ld_xrealloc(track_mod.nodes,
                                  (size_t)(track_mod.n_nodes + 1) *
                                      sizeof(*track_mod.nodes));
    track_mod.nodes[track_mod.n_nodes++] = node;
    return node;
}

/* The node command connection CONN_ID goes to; cluster mode: its
 * tracking connection is made (and started) on the first call. NULL: none
 * can be had, its reads are never kept. */
static struct tnode *
node_of(uint64_t conn_id)
{
    if (!track_mod.cluster) {
        return track_mod.nodes[0];
    }
    struct ld_conn_addr addr;
    char text[300];
    if (ld_redis_conn_address(conn_id, &addr, text, sizeof(text)) != LD_OK) {
        return NULL;
    }
    for (int i = 0; i < track_mod.n_nodes; i++) {
        if (strcmp(track_mod.nodes[i]->address, text) == 0) {
            return track_mod.nodes[i];
        }
    }
    struct tnode *node = node_new(&addr, text);
    if (track_mod.started) {
        ld_conn_start(node->conn);
    }
    return node;
}

int
near_track_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    memset(&track_mod, 0, sizeof(track_mod));
    track_mod.ctx = ctx;
    track_mod.cluster = cfg->redis.mode == LD_REDIS_CLUSTER;
    if (!track_mod.cluster) {
        struct ld_conn_addr addr;
        memset(&addr, 0, sizeof(addr));
        track_mod.have_addr = cfg->redis.mode != LD_REDIS_SENTINEL;
        if (track_mod.have_addr &&
            ld_conn_parse_address(cfg->redis.address, &addr) != LD_OK) {
            return LD_ERR;
        }
        node_new(&addr, cfg->redis.address);
    }
    track_mod.retry_ev = evtimer_new(ctx->base, retry_cb, NULL);
    if (track_mod.retry_ev == NULL) {
        ld_oom_in("evtimer_new");
    }
    track_mod.hooks.handshake = hook_handshake;
    track_mod.hooks.reply = hook_reply;
    track_mod.hooks.lost = hook_lost;
    track_mod.hooks.map = hook_map;
    ld_redis_set_conn_hooks(&track_mod.hooks);
    set_armed_stat();
    return LD_OK;
}

void
near_track_start(void)
{
    track_mod.started = true;
    for (int i = 0; i < track_mod.n_nodes; i++) {
        if (track_mod.cluster || track_mod.have_addr) {
            ld_conn_start(track_mod.nodes[i]->conn);
        }
    }
}

/* Sentinel mode only. */
void
near_track_set_address(const struct ld_conn_addr *addr)
{
    struct tnode *node = track_mod.nodes[0];
    ld_conn_set_addr(node->conn, addr);
    if (!track_mod.have_addr) {
        track_mod.have_addr = true;
        if (track_mod.started) {
            ld_conn_start(node->conn);
        }
    }
}

void
near_track_free(void)
{
    ld_redis_set_conn_hooks(NULL);
    for (int i = 0; i < track_mod.n_nodes; i++) {
        ld_conn_free(track_mod.nodes[i]->conn);
        free(track_mod.nodes[i]);
    }
    free(track_mod.nodes);
    free(track_mod.conns);
    if (track_mod.retry_ev != NULL) {
        event_free(track_mod.retry_ev);
    }
    memset(&track_mod, 0, sizeof(track_mod));
    ld_stats.near_tracking = 0;
}
