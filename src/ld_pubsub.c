/*
 * The subscriber connection. Lock waiters and cache waiters subscribe to
 * per-key channels here; the connection holds a channel while anyone
 * local wants it.
 *
 * hiredis 0.14 keeps one callback per channel and deletes it when an
 * "unsubscribe" reply arrives, even if a new SUBSCRIBE for the same
 * channel was sent in between, and it leaves subscribed mode when the
 * subscription count drops to zero. Two rules keep us clear of both: a
 * channel is never re-subscribed while its UNSUBSCRIBE is in flight (we
 * wait for the confirmation), and the connection always holds one
 * channel of its own, so the count never reaches zero.
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
#include <hiredis/async.h>


enum chan_state { CH_IDLE, CH_SUBSCRIBING, CH_SUBSCRIBED, CH_UNSUBSCRIBING };

struct chan;

struct ld_pubsub_sub {
    struct chan *chan;
    ld_pubsub_cb *cb;
    void *arg;
    bool dead;
    bool notify_pending;      /* owes a SUBSCRIBED notification */
    LIST_ENTRY(ld_pubsub_sub) link;          /* channel's list */
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

enum ps_state { PS_DOWN, PS_CONNECTING, PS_READY };

static struct {
    const struct ld_ctx *ctx;
    redisAsyncContext *ac;
    enum ps_state state;
    struct ld_conn_addr addr;
    struct ld_backoff backoff;
    struct event *retry_ev;
    struct ld_defer notify_defer;
    struct ld_dict *chans;
    STAILQ_HEAD(, ld_pubsub_sub) notify;
    SLIST_HEAD(, ld_pubsub_sub) graveyard;
    int delivering;
    char own_channel[64];
} pubsub_mod;

static void ps_connect(void);
static void reply_cb(redisAsyncContext *ac, void *r, void *privdata);

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
deliver(struct chan *ch, enum ld_pubsub_event ev, const char *msg,
        size_t len)
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
    LIST_FOREACH(s, &ch->subs, link) {
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
    /* Every channel shares one callback; the reply names the channel. */
    redisAsyncCommandArgv(pubsub_mod.ac, reply_cb, NULL, 2, argv, argvlen);
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
reply_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    LD_UNUSED(privdata);
    if (ac != pubsub_mod.ac || reply == NULL ||
        reply->type != REDIS_REPLY_ARRAY ||
        reply->elements < 3 || reply->element[0]->type != REDIS_REPLY_STRING ||
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

static void
own_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    LD_UNUSED(ac);
    LD_UNUSED(r);
    LD_UNUSED(privdata);
}

static void
auth_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply *reply = r;
    LD_UNUSED(privdata);
    if (ac != pubsub_mod.ac) {
        return;
    }
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        log_error("redis subscriber auth failed error=\"%s\"",
                  reply != NULL ? reply->str : "no reply");
        redisAsyncDisconnect(ac);
        return;
    }
}

static void
schedule_retry(void)
{
    int ms = ld_backoff_next_ms(&pubsub_mod.backoff);
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(pubsub_mod.retry_ev, &tv);
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
            chan_free(ch);      /* deleting the current entry is allowed */
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
on_ready(void)
{
    pubsub_mod.state = PS_READY;
    ld_backoff_reset(&pubsub_mod.backoff);
    log_debug("redis subscriber ready");
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, pubsub_mod.chans);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        chan_want(v);
    }
}

static void
connect_cb(const redisAsyncContext *ac, int status)
{
    if (ac != pubsub_mod.ac) {
        return;
    }
    if (status != REDIS_OK) {
        pubsub_mod.ac = NULL;
        pubsub_mod.state = PS_DOWN;
        schedule_retry();
        return;
    }
    redisAsyncContext *mac = pubsub_mod.ac;
    if (!pubsub_mod.addr.is_unix) {
        /* A subscriber hears nothing for long stretches; keepalive is how
         * a dead peer is noticed. (It fails on Unix sockets, whose peer
         * cannot vanish silently, and would poison the context.) */
        redisEnableKeepAlive(&mac->c);
    }
    const struct ld_config *cfg = pubsub_mod.ctx->cfg;
    const char *av[3];
    size_t al[3];
    int n = ld_conn_auth_argv(cfg, av, al);
    if (n > 0) {
        redisAsyncCommandArgv(mac, auth_cb, NULL, n, av, al);
    }
    /* The connection's own channel keeps the subscription count above
     * zero for its whole life (see the top of this file). */
    redisAsyncCommand(mac, own_cb, NULL, "SUBSCRIBE %s",
                      pubsub_mod.own_channel);
    on_ready();
}

static void
disconnect_cb(const redisAsyncContext *ac, int status)
{
    LD_UNUSED(status);
    if (ac != pubsub_mod.ac) {
        return;
    }
    pubsub_mod.ac = NULL;
    bool was = pubsub_mod.state == PS_READY;
    pubsub_mod.state = PS_DOWN;
    if (was) {
        log_warn("redis subscriber connection lost");
    }
    lost_all();
    schedule_retry();
}

static void
ps_connect(void)
{
    char err[160];
    redisAsyncContext *ac = ld_conn_open(&pubsub_mod.addr,
                                         pubsub_mod.ctx->base, err,
                                         sizeof(err));
    if (ac == NULL) {
        log_debug("redis subscriber connect failed error=\"%s\"", err);
        schedule_retry();
        return;
    }
    pubsub_mod.ac = ac;
    pubsub_mod.state = PS_CONNECTING;
    redisAsyncSetConnectCallback(ac, connect_cb);
    redisAsyncSetDisconnectCallback(ac, disconnect_cb);
}

static void
retry_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    ps_connect();
}

int
ld_pubsub_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    memset(&pubsub_mod, 0, sizeof(pubsub_mod));
    pubsub_mod.ctx = ctx;
    STAILQ_INIT(&pubsub_mod.notify);
    SLIST_INIT(&pubsub_mod.graveyard);
    ld_backoff_reset(&pubsub_mod.backoff);
    if (ld_conn_parse_address(cfg->redis.address, &pubsub_mod.addr) !=
        LD_OK) {
        return LD_ERR;
    }
    pubsub_mod.chans = ld_dict_new();
    pubsub_mod.retry_ev = evtimer_new(ctx->base, retry_cb, NULL);
    if (pubsub_mod.retry_ev == NULL) {
        ld_oom(0);
    }
    ld_defer_init(&pubsub_mod.notify_defer, ctx->base, notify_cb, NULL);
    snprintf(pubsub_mod.own_channel, sizeof(pubsub_mod.own_channel),
             "leased:daemon:%s", ctx->instance);
    return pubsub_mod.chans != NULL ? LD_OK : LD_ERR;
}

void
ld_pubsub_start(void)
{
    ps_connect();
}

void
ld_pubsub_free(void)
{
    if (pubsub_mod.ac != NULL) {
        redisAsyncContext *ac = pubsub_mod.ac;
        pubsub_mod.ac = NULL;
        redisAsyncFree(ac);
    }
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
    if (pubsub_mod.retry_ev != NULL) {
        event_free(pubsub_mod.retry_ev);
    }
    if (pubsub_mod.notify_defer.ev != NULL) {
        ld_defer_free(&pubsub_mod.notify_defer);
    }
}
