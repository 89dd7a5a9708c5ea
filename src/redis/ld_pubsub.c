/*
 * The subscriber connection. Lock waiters and cache waiters subscribe to
 * per-key channels here; the connection holds a channel while anyone
 * local wants it.
 *
 * Two rules keep the channel states simple: a channel is never
 * re-subscribed while its UNSUBSCRIBE is in flight (we wait for the
 * confirmation, so a late "unsubscribe" cannot be taken for the new
 * subscription's), and the connection always holds one channel of its
 * own, so it stays in subscribed mode for its whole life and the idle
 * PING of ld_conn is always answered the same way (a "pong" push).
 *
 * Connecting, the handshake, liveness and reconnecting are ld_conn's;
 * after every reconnect the channels still wanted are subscribed again.
 *
 * In cluster mode the subscriptions are sharded (SSUBSCRIBE; the scripts
 * publish with SPUBLISH): a channel is held on the master that owns its
 * slot, through one subscriber connection per such master (a shard
 * here). A message then travels only inside its shard instead of over
 * the cluster bus to every node. When the slot map changes a channel
 * whose slot moved is unsubscribed where it was, its subscribers hear
 * LOST, and it is subscribed where the slot lives now (SUBSCRIBED
 * follows); a master that drops the channel itself (its slot migrated
 * away: an "sunsubscribe" it sends unasked) has the same effect.
 *
 * Beside that backend (number 0), independent instances (lock.redlock)
 * are backends 1..N, each with a subscriber connection of its own. A
 * channel lives on one backend; the same name on two backends is two
 * channels. A group subscription (ld_pubsub_subscribe_group) holds one
 * member subscription per backend and folds their events into one.
 *
 * It owns the subscriber connections and the channel table; it must not send
 * on the command connections (ld_redis), nor know what a channel means to
 * those who listen.
 */
#include "ld_pubsub.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_defer.h"
#include "ld_dict.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_redis.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

enum chan_state { CH_IDLE, CH_SUBSCRIBING, CH_SUBSCRIBED, CH_UNSUBSCRIBING };

struct chan;

struct group;

struct ld_pubsub_sub {
    struct chan *chan; /* NULL for a group */
    struct group *grp; /* a group's own state, else NULL */
    ld_pubsub_cb *cb;
    void *arg;
    bool dead;
    bool notify_pending;            /* owes a SUBSCRIBED notification */
    LIST_ENTRY(ld_pubsub_sub) link; /* channel's list */
    STAILQ_ENTRY(ld_pubsub_sub) notify_link; /* notification queue */
    SLIST_ENTRY(ld_pubsub_sub) grave_link;   /* freed after delivery */
};

struct shard;

struct chan {
    char *name; /* the channel's name, as sent to Redis */
    size_t len;
    char *key; /* the table's key: the backend's number, then the name */
    size_t key_len;
    int backend;
    enum chan_state state;
    struct shard *sh; /* where it is (being) subscribed or unsubscribed */
    bool lost;        /* owes its subscribers LOST (lost_all, chans_moved) */
    LIST_HEAD(, ld_pubsub_sub) subs;
    size_t n_subs;
};

enum ps_state { PS_DOWN, PS_READY };

/* One subscriber connection: the only one, one per cluster master, or
 * one per independent instance. */
struct shard {
    struct ld_conn *conn;
    enum ps_state state;
    int backend;  /* 0: redis.*; k: ld_pubsub_add_backend's k */
    bool sharded; /* SSUBSCRIBE (a cluster master) */
    char address[300];
    LIST_ENTRY(shard) link;
};

/* What a group remembers of a recent message: which members delivered
 * it (a bit each). */
struct seen {
    uint64_t hash;
    uint32_t members;
};

#define GROUP_SEEN 16

struct member;

struct group {
    struct ld_pubsub_sub **members; /* one per backend, in given order */
    struct member *margs;           /* their callback arguments */
    int n;
    int quorum;
    int n_up;
    uint32_t up;    /* members subscribed now */
    uint32_t owed;  /* members lost since the last SUBSCRIBED */
    bool announced; /* SUBSCRIBED told, and a quorum up since */
    struct seen seen[GROUP_SEEN];
    int seen_at;
};

/* A member's callback argument: its group and its place there. */
struct member {
    struct ld_pubsub_sub *group;
    int idx;
};

static struct {
    const struct ld_ctx *ctx;
    struct shard main;         /* standalone, sentinel */
    LIST_HEAD(, shard) shards; /* cluster */
    bool cluster;
    bool orphans; /* wanted channels may be idle with no shard */
    struct ld_conn_addr addr;
    bool have_addr; /* false in sentinel mode until a master is known */
    bool started;
    struct ld_defer notify_defer;
    struct ld_dict *chans;
    struct shard *inst[LD_PUBSUB_MAX_BACKENDS]; /* backends 1..n_inst */
    int n_inst;
    STAILQ_HEAD(, ld_pubsub_sub) notify;
    SLIST_HEAD(, ld_pubsub_sub) graveyard;
    int delivering;
    char own_channel[64];
} pubsub_mod;

static void
sub_free(struct ld_pubsub_sub *sub)
{
    if (sub->grp != NULL) {
        /* The members themselves were buried on their own. */
        free(sub->grp->margs);
        free(sub->grp->members);
        free(sub->grp);
    }
    free(sub);
}

static void
sub_bury(struct ld_pubsub_sub *sub)
{
    if (pubsub_mod.delivering > 0 || sub->notify_pending) {
        SLIST_INSERT_HEAD(&pubsub_mod.graveyard, sub, grave_link);
    } else {
        sub_free(sub);
    }
}

static void
free_graveyard(void)
{
    if (pubsub_mod.delivering > 0) {
        return;
    }
    /* Those still owed a notification stay until notify_cb has seen
     * them. */
    struct ld_pubsub_sub *keep = NULL;
    while (!SLIST_EMPTY(&pubsub_mod.graveyard)) {
        struct ld_pubsub_sub *sub = SLIST_FIRST(&pubsub_mod.graveyard);
        SLIST_REMOVE_HEAD(&pubsub_mod.graveyard, grave_link);
        LD_ASSERT(sub->dead);
        if (sub->notify_pending) {
            SLIST_NEXT(sub, grave_link) = keep;
            keep = sub;
        } else {
            sub_free(sub);
        }
    }
    while (keep != NULL) {
        struct ld_pubsub_sub *sub = keep;
        keep = SLIST_NEXT(sub, grave_link);
        SLIST_INSERT_HEAD(&pubsub_mod.graveyard, sub, grave_link);
    }
}

static void
queue_notify(struct ld_pubsub_sub *sub)
{
    if (sub->notify_pending) {
        return;
    }
    sub->notify_pending = true;
    STAILQ_INSERT_TAIL(&pubsub_mod.notify, sub, notify_link);
    ld_defer_kick(&pubsub_mod.notify_defer);
}

static void
notify_cb(void *arg)
{
    LD_UNUSED(arg);
    pubsub_mod.delivering++;
    /* Subscriptions queued by these callbacks are notified next turn. */
    STAILQ_HEAD(, ld_pubsub_sub) list = STAILQ_HEAD_INITIALIZER(list);
    STAILQ_CONCAT(&list, &pubsub_mod.notify);
    while (!STAILQ_EMPTY(&list)) {
        struct ld_pubsub_sub *sub = STAILQ_FIRST(&list);
        STAILQ_REMOVE_HEAD(&list, notify_link);
        LD_ASSERT(sub->notify_pending);
        sub->notify_pending = false;
        if (!sub->dead && sub->chan != NULL &&
            sub->chan->state == CH_SUBSCRIBED) {
            sub->cb(LD_PUBSUB_SUBSCRIBED, NULL, 0, sub->arg);
        }
    }
    pubsub_mod.delivering--;
    free_graveyard();
}

/* Call every live subscriber of CH. Callbacks may subscribe and
 * unsubscribe freely: we walk a snapshot, and unsubscribed entries stay
 * allocated until the outermost delivery ends. */
static void
deliver(struct chan *ch, enum ld_pubsub_event ev, const char *msg, size_t len)
{
    struct ld_pubsub_sub *stack[16];
    struct ld_pubsub_sub **snap = stack;
    size_t n = ch->n_subs;
    if (n == 0) {
        return;
    }
    if (n > LD_ARRAY_LEN(stack)) {
        snap = ld_xmalloc(sizeof(*snap) * n);
    }
    size_t i = 0;
    struct ld_pubsub_sub *s;
    LIST_FOREACH(s, &ch->subs, link)
    {
        LD_ASSERT(i < n);
        snap[i++] = s;
    }
    LD_ASSERTF(i == n, "channel subscriber count %zu, list %zu", n, i);
    pubsub_mod.delivering++;
    for (size_t k = 0; k < i; k++) {
        if (!snap[k]->dead) {
            snap[k]->cb(ev, msg, len, snap[k]->arg);
        }
    }
    pubsub_mod.delivering--;
    if (snap != stack) {
        free(snap);
    }
    free_graveyard();
}

static void
chan_free(struct chan *ch)
{
    ld_dict_del(pubsub_mod.chans, ch->key, ch->key_len);
    ld_stats.pubsub_channels = (long long)ld_dict_size(pubsub_mod.chans);
    free(ch->key);
    free(ch);
}

/* The channel NAME on BACKEND, NULL when nobody holds it. */
static struct chan *
chan_get(int backend, const char *name, size_t len)
{
    char stack[256];
    char *key = len < sizeof(stack) ? stack : ld_xmalloc(len + 1);
    key[0] = (char)backend;
    memcpy(key + 1, name, len);
    struct chan *ch = ld_dict_get(pubsub_mod.chans, key, len + 1);
    if (key != stack) {
        free(key);
    }
    return ch;
}

static void
send_cmd(struct shard *sh, const char *verb, const char *name, size_t len)
{
    char v[16];
    /* SSUBSCRIBE, SUNSUBSCRIBE on a cluster master. */
    snprintf(v, sizeof(v), "%s%s", sh->sharded ? "S" : "", verb);
    const char *argv[] = {v, name};
    size_t argvlen[] = {strlen(v), len};
    /* The confirmation names the channel (see push_cb). */
    ld_conn_send(sh->conn, 2, argv, argvlen);
}

static struct shard *shard_for(const struct chan *ch);

static void
chan_want(struct chan *ch)
{
    if (ch->n_subs > 0 && ch->state == CH_IDLE) {
        struct shard *sh = shard_for(ch);
        if (sh == NULL || sh->state != PS_READY) {
            /* Subscribed once it is ready (ready_cb), or once the map
             * names a master (chans_moved). */
            pubsub_mod.orphans = true;
            return;
        }
        ch->sh = sh;
        ch->state = CH_SUBSCRIBING;
        send_cmd(sh, "SUBSCRIBE", ch->name, ch->len);
    } else if (ch->n_subs == 0 && ch->state == CH_SUBSCRIBED) {
        ch->state = CH_UNSUBSCRIBING;
        send_cmd(ch->sh, "UNSUBSCRIBE", ch->name, ch->len);
    }
}

struct ld_pubsub_sub *
ld_pubsub_subscribe_at(int backend, const char *channel, size_t len,
                       ld_pubsub_cb *cb, void *arg)
{
    LD_ASSERT(backend >= 0 && backend <= pubsub_mod.n_inst);
    struct chan *ch = chan_get(backend, channel, len);
    if (ch == NULL) {
        ch = ld_xcalloc(1, sizeof(*ch));
        ch->key_len = len + 1;
        ch->key = ld_xmalloc(len + 2);
        ch->key[0] = (char)backend;
        memcpy(ch->key + 1, channel, len);
        ch->key[len + 1] = '\0';
        ch->name = ch->key + 1;
        ch->len = len;
        ch->backend = backend;
        LIST_INIT(&ch->subs);
        ch->state = CH_IDLE;
        ld_dict_set(pubsub_mod.chans, ch->key, ch->key_len, ch);
        ld_stats.pubsub_channels = (long long)ld_dict_size(pubsub_mod.chans);
    }
    struct ld_pubsub_sub *sub = ld_xcalloc(1, sizeof(*sub));
    sub->chan = ch;
    sub->cb = cb;
    sub->arg = arg;
    LIST_INSERT_HEAD(&ch->subs, sub, link);
    ch->n_subs++;
    if (ch->state == CH_SUBSCRIBED) {
        queue_notify(sub);
    }
    chan_want(ch);
    return sub;
}

struct ld_pubsub_sub *
ld_pubsub_subscribe(const char *channel, size_t len, ld_pubsub_cb *cb,
                    void *arg)
{
    return ld_pubsub_subscribe_at(0, channel, len, cb, arg);
}

void
ld_pubsub_unsubscribe(struct ld_pubsub_sub *sub)
{
    if (sub == NULL || sub->dead) {
        return;
    }
    if (sub->grp != NULL) {
        sub->dead = true;
        for (int i = 0; i < sub->grp->n; i++) {
            ld_pubsub_unsubscribe(sub->grp->members[i]);
        }
        sub_bury(sub);
        return;
    }
    struct chan *ch = sub->chan;
    sub->dead = true;
    LD_ASSERT(ch != NULL && ch->n_subs > 0);
    LIST_REMOVE(sub, link);
    ch->n_subs--;
    sub->chan = NULL;
    sub_bury(sub);
    if (ch->n_subs == 0 && ch->state == CH_IDLE) {
        chan_free(ch);
        return;
    }
    chan_want(ch);
}

/* ---- groups ---------------------------------------------------------- */

static uint64_t
msg_hash(const char *msg, size_t len)
{
    uint64_t h = 14695981039346656037ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h = (h ^ (unsigned char)msg[i]) * 1099511628211ULL;
    }
    return h;
}

/* Whether member IDX's copy of MSG is news. The publisher sends one
 * message to several backends: its first copy wakes, the copies from the
 * others do not. The same payload again from a member that already gave
 * it is a new message, so a publisher whose payloads repeat (Redisson's
 * "0") still wakes about once per message: exact while each message
 * reaches every member before the next, else an extra wake-up, or a new
 * message taken for a copy from a member that missed the last one (the
 * next member's copy then wakes). Unique payloads are always exact. */
static bool
group_fresh(struct group *g, int idx, const char *msg, size_t len)
{
    uint64_t h = msg_hash(msg, len);
    uint32_t bit = 1u << idx;
    for (int i = 0; i < GROUP_SEEN; i++) {
        struct seen *e = &g->seen[i];
        if (e->members != 0 && e->hash == h) {
            if ((e->members & bit) == 0) {
                e->members |= bit;
                return false;
            }
            e->members = bit;
            return true;
        }
    }
    struct seen *e = &g->seen[g->seen_at];
    g->seen_at = (g->seen_at + 1) % GROUP_SEEN;
    e->hash = h;
    e->members = bit;
    return true;
}

static void
member_cb(enum ld_pubsub_event ev, const char *msg, size_t len, void *arg)
{
    struct member *m = arg;
    struct ld_pubsub_sub *gs = m->group;
    struct group *g = gs->grp;
    uint32_t bit = 1u << m->idx;
    if (gs->dead) {
        return;
    }
    switch (ev) {
    case LD_PUBSUB_MESSAGE:
        if (group_fresh(g, m->idx, msg, len)) {
            gs->cb(LD_PUBSUB_MESSAGE, msg, len, gs->arg);
        }
        break;
    case LD_PUBSUB_SUBSCRIBED:
        if ((g->up & bit) != 0) {
            break;
        }
        g->up |= bit;
        g->n_up++;
        /* A quorum up hears every message published on a quorum; one
         * member back after a loss may carry one published on fewer. */
        if (g->n_up >= g->quorum && (!g->announced || (g->owed & bit))) {
            g->announced = true;
            g->owed = 0;
            gs->cb(LD_PUBSUB_SUBSCRIBED, NULL, 0, gs->arg);
        }
        break;
    case LD_PUBSUB_LOST:
        if ((g->up & bit) == 0) {
            break;
        }
        g->up &= ~bit;
        g->n_up--;
        g->owed |= bit;
        if (g->n_up < g->quorum) {
            g->announced = false;
        }
        gs->cb(LD_PUBSUB_LOST, NULL, 0, gs->arg);
        break;
    }
}

struct ld_pubsub_sub *
ld_pubsub_subscribe_group(const int *backends, int n, int quorum,
                          const char *channel, size_t len, ld_pubsub_cb *cb,
                          void *arg)
{
    LD_ASSERT(n > 0 && n <= LD_PUBSUB_MAX_BACKENDS && quorum > 0 &&
              quorum <= n);
    struct ld_pubsub_sub *gs = ld_xcalloc(1, sizeof(*gs));
    struct group *g = ld_xcalloc(1, sizeof(*g));
    gs->grp = g;
    gs->cb = cb;
    gs->arg = arg;
    g->n = n;
    g->quorum = quorum;
    g->members = ld_xcalloc((size_t)n, sizeof(*g->members));
    g->margs = ld_xcalloc((size_t)n, sizeof(*g->margs));
    for (int i = 0; i < n; i++) {
        g->margs[i].group = gs;
        g->margs[i].idx = i;
        g->members[i] = ld_pubsub_subscribe_at(backends[i], channel, len,
                                               member_cb, &g->margs[i]);
    }
    return gs;
}

static void chans_moved(bool changed, void *arg);

/* An error on a cluster subscriber: an SSUBSCRIBE sent by a stale map
 * (MOVED). The channels it may concern are tried again once the map has
 * been asked again. */
static void
push_error(struct shard *sh, const redisReply *reply)
{
    log_debug("redis subscriber error address=%s error=\"%s\"", sh->address,
              reply->str);
    if (!sh->sharded) {
        return;
    }
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        if (ch->sh == sh && ch->state == CH_SUBSCRIBING) {
            ch->state = CH_IDLE;
            ch->sh = NULL;
            if (ch->n_subs == 0) {
                chan_free(ch); /* deleting the current entry is allowed */
            } else {
                pubsub_mod.orphans = true;
            }
        }
    }
    ld_redis_cluster_refresh();
}

/* SH confirmed its SUBSCRIBE of CH. */
static void
on_subscribed(struct shard *sh, struct chan *ch)
{
    if (ch->state != CH_SUBSCRIBING || ch->sh != sh) {
        return;
    }
    ch->state = CH_SUBSCRIBED;
    if (ch->n_subs == 0) {
        chan_want(ch);
    } else {
        deliver(ch, LD_PUBSUB_SUBSCRIBED, NULL, 0);
    }
}

/* SH no longer holds CH: as asked, or the server dropped it. */
static void
on_unsubscribed(struct shard *sh, struct chan *ch)
{
    if (ch->state == CH_UNSUBSCRIBING && ch->sh == sh) {
        ch->state = CH_IDLE;
        ch->sh = NULL;
        if (ch->n_subs == 0) {
            chan_free(ch);
        } else {
            chan_want(ch);
        }
    } else if (ch->state == CH_SUBSCRIBED && ch->sh == sh) {
        /* Unasked: the master gave the channel's slot away. */
        ch->state = CH_IDLE;
        ch->sh = NULL;
        pubsub_mod.orphans = true;
        log_info("redis subscriber channel dropped by the server "
                 "address=%s; subscribing where its slot is now",
                 sh->address);
        deliver(ch, LD_PUBSUB_LOST, NULL, 0);
        ld_redis_cluster_refresh();
    }
}

static void
push_cb(struct ld_conn *conn, redisReply *reply, void *owner)
{
    struct shard *sh = owner;
    LD_UNUSED(conn);
    if (reply->type == REDIS_REPLY_ERROR) {
        push_error(sh, reply);
        return;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING) {
        return;
    }
    const char *kind = reply->element[0]->str;
    const char *name = reply->element[1]->str;
    size_t len = reply->element[1]->len;
    struct chan *ch = chan_get(sh->backend, name, len);
    if (ch == NULL) {
        return;
    }
    /* Sharded pub/sub names the same pushes with an "s" in front. */
    if (sh->sharded && kind[0] == 's') {
        kind++;
    }
    if (strcmp(kind, "message") == 0) {
        redisReply *m = reply->element[2];
        if (m->type == REDIS_REPLY_STRING) {
            deliver(ch, LD_PUBSUB_MESSAGE, m->str, m->len);
        }
    } else if (strcmp(kind, "subscribe") == 0) {
        on_subscribed(sh, ch);
    } else if (strcmp(kind, "unsubscribe") == 0) {
        on_unsubscribed(sh, ch);
    }
}

/* Tell the subscribers of the channels marked LOST that they may have
 * missed messages. Subscribers may (un)subscribe from their callbacks,
 * which changes the table: walk a copy of the keys and look each one up
 * again. */
static void
deliver_lost(size_t n)
{
    if (n == 0) {
        return;
    }
    struct ld_dict_iter it;
    void *v;
    char **names = ld_xcalloc(n, sizeof(*names));
    size_t *lens = ld_xcalloc(n, sizeof(*lens));
    size_t k = 0;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (k < n && ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        if (!ch->lost) {
            continue;
        }
        ch->lost = false;
        names[k] = ld_xmemdup(ch->key, ch->key_len);
        lens[k] = ch->key_len;
        k++;
    }
    for (size_t i = 0; i < k; i++) {
        struct chan *ch = ld_dict_get(pubsub_mod.chans, names[i], lens[i]);
        if (ch != NULL && ch->n_subs > 0) {
            deliver(ch, LD_PUBSUB_LOST, NULL, 0);
        }
        free(names[i]);
    }
    free(names);
    free(lens);
}

/* Everything subscribed on SH is gone with its connection: tell
 * subscribers they may have missed messages, and forget channels nobody
 * wants. */
static void
lost_all(struct shard *sh)
{
    struct ld_dict_iter it;
    void *v;
    size_t n = 0;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        if (ch->sh != sh) {
            continue; /* idle, or on another shard */
        }
        ch->state = CH_IDLE;
        ch->sh = NULL;
        pubsub_mod.orphans = true;
        if (ch->n_subs == 0) {
            chan_free(ch); /* deleting the current entry is allowed */
        } else {
            ch->lost = true;
            n++;
        }
    }
    deliver_lost(n);
}

static void
count_backends_up(void)
{
    long long up = 0;
    for (int i = 0; i < pubsub_mod.n_inst; i++) {
        up += pubsub_mod.inst[i]->state == PS_READY ? 1 : 0;
    }
    ld_stats.redlock_subscribers_up = up;
}

static void
ready_cb(struct ld_conn *conn, void *owner)
{
    struct shard *sh = owner;
    /* The connection's own channel keeps the subscription count above
     * zero for its whole life (see the top of this file); a classic
     * channel, also on a cluster shard, where nobody publishes it. */
    const char *av[] = {"SUBSCRIBE", pubsub_mod.own_channel};
    size_t al[] = {9, strlen(pubsub_mod.own_channel)};
    ld_conn_send(conn, 2, av, al);
    sh->state = PS_READY;
    count_backends_up();
    log_debug("redis subscriber ready address=%s", sh->address);
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        chan_want(v);
    }
}

static void
down_cb(struct ld_conn *conn, bool was_ready, const char *why, void *owner)
{
    struct shard *sh = owner;
    LD_UNUSED(conn);
    sh->state = PS_DOWN;
    count_backends_up();
    if (!was_ready) {
        log_debug("redis subscriber connect failed address=%s error=\"%s\"",
                  sh->address, why);
        return;
    }
    log_warn("redis subscriber connection lost address=%s reason=\"%s\"",
             sh->address, why);
    lost_all(sh);
    if (sh->sharded) {
        /* Where the map now puts them, if that shard is ready. */
        ld_redis_cluster_refresh();
    }
}

static const struct ld_conn_ops sub_ops = {
    .on_ready = ready_cb,
    .on_down = down_cb,
    .on_reply = NULL,
    .on_push = push_cb,
    .on_stall = NULL,
};

/* ---- cluster shards -------------------------------------------------- */

/* The shard at the master that owns CH's slot, made (and connecting) if
 * new; the one subscriber outside cluster mode. NULL: no master known
 * for the slot yet (the channel waits for the map). */
static struct shard *
shard_for(const struct chan *ch)
{
    if (ch->backend > 0) {
        return pubsub_mod.inst[ch->backend - 1];
    }
    if (!pubsub_mod.cluster) {
        return &pubsub_mod.main;
    }
    struct ld_conn_addr addr;
    char text[300];
    if (ld_redis_route_address(ch->name, ch->len, &addr, text, sizeof(text)) !=
        LD_OK) {
        return NULL;
    }
    struct shard *sh;
    LIST_FOREACH(sh, &pubsub_mod.shards, link)
    {
        if (strcmp(sh->address, text) == 0) {
            return sh;
        }
    }
    sh = ld_xcalloc(1, sizeof(*sh));
    sh->sharded = true;
    snprintf(sh->address, sizeof(sh->address), "%s", text);
    sh->conn = ld_conn_new(pubsub_mod.ctx, &addr, LD_CONN_ROLE_SUB, &sub_ops,
                           sh);
    LIST_INSERT_HEAD(&pubsub_mod.shards, sh, link);
    if (pubsub_mod.started) {
        ld_conn_start(sh->conn);
    }
    return sh;
}

/* The slot map changed: a channel held where its slot no longer is gets
 * unsubscribed there (then subscribed where it is, from push_cb); idle
 * ones wanted are subscribed now that their master may be known. */
static void
chans_moved(bool changed, void *arg)
{
    LD_UNUSED(arg);
    /* An unchanged map matters only to channels left without a shard. */
    if (!changed && !pubsub_mod.orphans) {
        return;
    }
    pubsub_mod.orphans = false;
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    size_t n = 0;
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        if (ch->state == CH_SUBSCRIBED && ch->n_subs > 0 &&
            shard_for(ch) != ch->sh) {
            ch->state = CH_UNSUBSCRIBING;
            send_cmd(ch->sh, "UNSUBSCRIBE", ch->name, ch->len);
            ch->lost = true;
            n++;
        } else {
            chan_want(ch);
        }
    }
    deliver_lost(n);
}

/* ---- start and stop -------------------------------------------------- */

int
ld_pubsub_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    memset(&pubsub_mod, 0, sizeof(pubsub_mod));
    pubsub_mod.ctx = ctx;
    STAILQ_INIT(&pubsub_mod.notify);
    SLIST_INIT(&pubsub_mod.graveyard);
    LIST_INIT(&pubsub_mod.shards);
    pubsub_mod.cluster = cfg->redis.mode == LD_REDIS_CLUSTER;
    pubsub_mod.have_addr = cfg->redis.mode == LD_REDIS_STANDALONE;
    if (pubsub_mod.have_addr &&
        ld_conn_parse_address(cfg->redis.address, &pubsub_mod.addr) != LD_OK) {
        return LD_ERR;
    }
    pubsub_mod.chans = ld_dict_new();
    if (!pubsub_mod.cluster) {
        snprintf(pubsub_mod.main.address, sizeof(pubsub_mod.main.address),
                 "%s",
                 pubsub_mod.have_addr ? cfg->redis.address : "the master");
        pubsub_mod.main.conn = ld_conn_new(ctx, &pubsub_mod.addr,
                                           LD_CONN_ROLE_SUB, &sub_ops,
                                           &pubsub_mod.main);
    } else {
        ld_redis_on_map(chans_moved, NULL);
    }
    ld_defer_init(&pubsub_mod.notify_defer, ctx->base, notify_cb, NULL);
    snprintf(pubsub_mod.own_channel, sizeof(pubsub_mod.own_channel),
             "leased:daemon:%s", ctx->instance);
    return pubsub_mod.chans != NULL ? LD_OK : LD_ERR;
}

int
ld_pubsub_add_backend(const char *address)
{
    struct ld_conn_addr addr;
    if (pubsub_mod.started || pubsub_mod.n_inst >= LD_PUBSUB_MAX_BACKENDS ||
        ld_conn_parse_address(address, &addr) != LD_OK) {
        return LD_ERR;
    }
    struct shard *sh = ld_xcalloc(1, sizeof(*sh));
    sh->backend = ++pubsub_mod.n_inst;
    snprintf(sh->address, sizeof(sh->address), "%s", address);
    sh->conn = ld_conn_new(pubsub_mod.ctx, &addr, LD_CONN_ROLE_SUB, &sub_ops,
                           sh);
    pubsub_mod.inst[sh->backend - 1] = sh;
    return sh->backend;
}

void
ld_pubsub_start(void)
{
    pubsub_mod.started = true;
    if (pubsub_mod.have_addr) {
        ld_conn_start(pubsub_mod.main.conn);
    }
    for (int i = 0; i < pubsub_mod.n_inst; i++) {
        ld_conn_start(pubsub_mod.inst[i]->conn);
    }
    struct shard *sh;
    LIST_FOREACH(sh, &pubsub_mod.shards, link)
    {
        ld_conn_start(sh->conn);
    }
}

void
ld_pubsub_set_address(const struct ld_conn_addr *addr)
{
    pubsub_mod.addr = *addr;
    ld_conn_set_addr(pubsub_mod.main.conn, addr);
    /* The first master known: the connection was held back until now. */
    if (!pubsub_mod.have_addr) {
        pubsub_mod.have_addr = true;
        if (pubsub_mod.started) {
            ld_conn_start(pubsub_mod.main.conn);
        }
    }
}

void
ld_pubsub_free(void)
{
    ld_conn_free(pubsub_mod.main.conn);
    pubsub_mod.main.conn = NULL;
    pubsub_mod.main.state = PS_DOWN;
    while (!LIST_EMPTY(&pubsub_mod.shards)) {
        struct shard *sh = LIST_FIRST(&pubsub_mod.shards);
        LIST_REMOVE(sh, link);
        ld_conn_free(sh->conn);
        free(sh);
    }
    for (int i = 0; i < pubsub_mod.n_inst; i++) {
        ld_conn_free(pubsub_mod.inst[i]->conn);
        free(pubsub_mod.inst[i]);
        pubsub_mod.inst[i] = NULL;
    }
    pubsub_mod.n_inst = 0;
    if (pubsub_mod.chans != NULL) {
        struct ld_dict_iter it;
        void *v;
        ld_dict_iter_init(&it, pubsub_mod.chans);
        while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
            struct chan *ch = v;
            while (!LIST_EMPTY(&ch->subs)) {
                struct ld_pubsub_sub *s = LIST_FIRST(&ch->subs);
                LIST_REMOVE(s, link);
                free(s);
            }
            free(ch->key);
            free(ch);
        }
        ld_dict_free(pubsub_mod.chans);
        pubsub_mod.chans = NULL;
    }
    pubsub_mod.delivering = 0;
    STAILQ_INIT(&pubsub_mod.notify);
    while (!SLIST_EMPTY(&pubsub_mod.graveyard)) {
        struct ld_pubsub_sub *n = SLIST_FIRST(&pubsub_mod.graveyard);
        SLIST_REMOVE_HEAD(&pubsub_mod.graveyard, grave_link);
        sub_free(n);
    }
    if (pubsub_mod.notify_defer.ev != NULL) {
        ld_defer_free(&pubsub_mod.notify_defer);
    }
}
