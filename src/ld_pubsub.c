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
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

enum chan_state { CH_IDLE, CH_SUBSCRIBING, CH_SUBSCRIBED, CH_UNSUBSCRIBING };

struct chan;

struct ld_pubsub_sub {
    struct chan *chan;
    ld_pubsub_cb *cb;
    void *arg;
    bool dead;
    bool notify_pending;            /* owes a SUBSCRIBED notification */
    LIST_ENTRY(ld_pubsub_sub) link; /* channel's list */
    STAILQ_ENTRY(ld_pubsub_sub) notify_link; /* notification queue */
    SLIST_ENTRY(ld_pubsub_sub) grave_link;   /* freed after delivery */
};

struct chan {
    char *name;
    size_t len;
    enum chan_state state;
    LIST_HEAD(, ld_pubsub_sub) subs;
    size_t n_subs;
};

enum ps_state { PS_DOWN, PS_READY };

static struct {
    const struct ld_ctx *ctx;
    struct ld_conn *conn;
    enum ps_state state;
    struct ld_conn_addr addr;
    bool have_addr; /* false in sentinel mode until a master is known */
    bool started;
    struct ld_defer notify_defer;
    struct ld_dict *chans;
    STAILQ_HEAD(, ld_pubsub_sub) notify;
    SLIST_HEAD(, ld_pubsub_sub) graveyard;
    int delivering;
    char own_channel[64];
} pubsub_mod;

static void
sub_bury(struct ld_pubsub_sub *sub)
{
    if (pubsub_mod.delivering > 0 || sub->notify_pending) {
        SLIST_INSERT_HEAD(&pubsub_mod.graveyard, sub, grave_link);
    } else {
        free(sub);
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
            free(sub);
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
    ld_dict_del(pubsub_mod.chans, ch->name, ch->len);
    ld_stats.pubsub_channels = (long long)ld_dict_size(pubsub_mod.chans);
    free(ch->name);
    free(ch);
}

static void
send_cmd(const char *verb, const char *name, size_t len)
{
    const char *argv[] = {verb, name};
    size_t argvlen[] = {strlen(verb), len};
    /* The confirmation names the channel (see push_cb). */
    ld_conn_send(pubsub_mod.conn, 2, argv, argvlen);
}

static void
chan_want(struct chan *ch)
{
    if (pubsub_mod.state != PS_READY) {
        return;
    }
    if (ch->n_subs > 0 && ch->state == CH_IDLE) {
        ch->state = CH_SUBSCRIBING;
        send_cmd("SUBSCRIBE", ch->name, ch->len);
    } else if (ch->n_subs == 0 && ch->state == CH_SUBSCRIBED) {
        ch->state = CH_UNSUBSCRIBING;
        send_cmd("UNSUBSCRIBE", ch->name, ch->len);
    }
}

struct ld_pubsub_sub *
ld_pubsub_subscribe(const char *channel, size_t len, ld_pubsub_cb *cb,
                    void *arg)
{
    struct chan *ch = ld_dict_get(pubsub_mod.chans, channel, len);
    if (ch == NULL) {
        ch = ld_xcalloc(1, sizeof(*ch));
        ch->name = ld_xstrndup(channel, len);
        ch->len = len;
        LIST_INIT(&ch->subs);
        ch->state = CH_IDLE;
        ld_dict_set(pubsub_mod.chans, ch->name, len, ch);
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

void
ld_pubsub_unsubscribe(struct ld_pubsub_sub *sub)
{
    if (sub == NULL || sub->dead) {
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

static void
push_cb(struct ld_conn *conn, redisReply *reply, void *owner)
{
    LD_UNUSED(conn);
    LD_UNUSED(owner);
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 3 ||
        reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING) {
        return;
    }
    const char *kind = reply->element[0]->str;
    const char *name = reply->element[1]->str;
    size_t len = reply->element[1]->len;
    struct chan *ch = ld_dict_get(pubsub_mod.chans, name, len);
    if (ch == NULL) {
        return;
    }
    if (strcmp(kind, "message") == 0) {
        redisReply *m = reply->element[2];
        if (m->type == REDIS_REPLY_STRING) {
            deliver(ch, LD_PUBSUB_MESSAGE, m->str, m->len);
        }
    } else if (strcmp(kind, "subscribe") == 0) {
        if (ch->state == CH_SUBSCRIBING) {
            ch->state = CH_SUBSCRIBED;
            if (ch->n_subs == 0) {
                chan_want(ch);
            } else {
                deliver(ch, LD_PUBSUB_SUBSCRIBED, NULL, 0);
            }
        }
    } else if (strcmp(kind, "unsubscribe") == 0) {
        if (ch->state == CH_UNSUBSCRIBING) {
            ch->state = CH_IDLE;
            if (ch->n_subs == 0) {
                chan_free(ch);
            } else {
                chan_want(ch);
            }
        }
    }
}

/* Everything subscribed is gone with the connection: tell subscribers
 * they may have missed messages, and forget channels nobody wants. */
static void
lost_all(void)
{
    struct ld_dict_iter it;
    void *v;
    size_t n = 0;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        ch->state = CH_IDLE;
        if (ch->n_subs == 0) {
            chan_free(ch); /* deleting the current entry is allowed */
        } else {
            n++;
        }
    }
    if (n == 0) {
        return;
    }
    /* Subscribers may (un)subscribe from their callbacks, which changes
     * the table: walk a copy of the names and look each one up again. */
    char **names = ld_xcalloc(n, sizeof(*names));
    size_t *lens = ld_xcalloc(n, sizeof(*lens));
    size_t k = 0;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (k < n && ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        names[k] = ld_xmemdup(ch->name, ch->len);
        lens[k] = ch->len;
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

static void
ready_cb(struct ld_conn *conn, void *owner)
{
    LD_UNUSED(owner);
    /* The connection's own channel keeps the subscription count above
     * zero for its whole life (see the top of this file). */
    const char *av[] = {"SUBSCRIBE", pubsub_mod.own_channel};
    size_t al[] = {9, strlen(pubsub_mod.own_channel)};
    ld_conn_send(conn, 2, av, al);
    pubsub_mod.state = PS_READY;
    log_debug("redis subscriber ready");
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
    LD_UNUSED(conn);
    LD_UNUSED(owner);
    pubsub_mod.state = PS_DOWN;
    if (!was_ready) {
        log_debug("redis subscriber connect failed error=\"%s\"", why);
        return;
    }
    log_warn("redis subscriber connection lost reason=\"%s\"", why);
    lost_all();
}

static const struct ld_conn_ops sub_ops = {
    .on_ready = ready_cb,
    .on_down = down_cb,
    .on_reply = NULL,
    .on_push = push_cb,
    .on_stall = NULL,
};

int
ld_pubsub_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    memset(&pubsub_mod, 0, sizeof(pubsub_mod));
    pubsub_mod.ctx = ctx;
    STAILQ_INIT(&pubsub_mod.notify);
    SLIST_INIT(&pubsub_mod.graveyard);
    pubsub_mod.have_addr = cfg->redis.mode != LD_REDIS_SENTINEL;
    if (pubsub_mod.have_addr &&
        ld_conn_parse_address(cfg->redis.address, &pubsub_mod.addr) != LD_OK) {
        return LD_ERR;
    }
    pubsub_mod.chans = ld_dict_new();
    pubsub_mod.conn = ld_conn_new(ctx, &pubsub_mod.addr, LD_CONN_ROLE_SUB,
                                  &sub_ops, NULL);
    ld_defer_init(&pubsub_mod.notify_defer, ctx->base, notify_cb, NULL);
    snprintf(pubsub_mod.own_channel, sizeof(pubsub_mod.own_channel),
             "leased:daemon:%s", ctx->instance);
    return pubsub_mod.chans != NULL ? LD_OK : LD_ERR;
}

void
ld_pubsub_start(void)
{
    pubsub_mod.started = true;
    if (pubsub_mod.have_addr) {
        ld_conn_start(pubsub_mod.conn);
    }
}

void
ld_pubsub_set_address(const struct ld_conn_addr *addr)
{
    pubsub_mod.addr = *addr;
    ld_conn_set_addr(pubsub_mod.conn, addr);
    /* The first master known: the connection was held back until now. */
    if (!pubsub_mod.have_addr) {
        pubsub_mod.have_addr = true;
        if (pubsub_mod.started) {
            ld_conn_start(pubsub_mod.conn);
        }
    }
}

void
ld_pubsub_free(void)
{
    ld_conn_free(pubsub_mod.conn);
    pubsub_mod.conn = NULL;
    pubsub_mod.state = PS_DOWN;
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
            free(ch->name);
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
        free(n);
    }
    if (pubsub_mod.notify_defer.ev != NULL) {
        ld_defer_free(&pubsub_mod.notify_defer);
    }
}
