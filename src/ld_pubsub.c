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

#include "ld_conf.h"
#include "ld_dict.h"
#include "ld_log.h"
#include "ld_redis.h"
#include "ld_server.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

enum chan_state { CH_IDLE, CH_SUBSCRIBING, CH_SUBSCRIBED, CH_UNSUBSCRIBING };

struct chan;

struct ld_pubsub_sub {
    struct chan *chan;
    ld_pubsub_cb *cb;
    void *arg;
    bool dead;
    bool notify_pending;      /* owes a SUBSCRIBED notification */
    struct ld_pubsub_sub *prev, *next;       /* channel's list */
    struct ld_pubsub_sub *notify_next;       /* notification queue */
};

struct chan {
    char *name;
    size_t len;
    enum chan_state state;
    struct ld_pubsub_sub *subs;
    size_t n_subs;
};

enum ps_state { PS_DOWN, PS_CONNECTING, PS_READY };

static struct {
    struct event_base *base;
    const struct ld_config *cfg;
    redisAsyncContext *ac;
    enum ps_state state;
    char host[256];
    int port;
    bool is_unix;
    int backoff_ms;
    struct event *retry_ev;
    struct event *notify_ev;
    struct ld_dict *chans;
    struct ld_pubsub_sub *notify_head, *notify_tail;
    struct ld_pubsub_sub *graveyard;
    int delivering;
    char own_channel[64];
} P;

static void ps_connect(void);
static void reply_cb(redisAsyncContext *ac, void *r, void *privdata);

static void
sub_bury(struct ld_pubsub_sub *sub)
{
    if (P.delivering > 0 || sub->notify_pending) {
        sub->next = P.graveyard;
        P.graveyard = sub;
    } else {
        free(sub);
    }
}

static void
free_graveyard(void)
{
    if (P.delivering > 0) {
        return;
    }
    struct ld_pubsub_sub **pp = &P.graveyard;
    while (*pp != NULL) {
        struct ld_pubsub_sub *sub = *pp;
        if (sub->notify_pending) {
            pp = &sub->next;
            continue;
        }
        *pp = sub->next;
        free(sub);
    }
}

static void
queue_notify(struct ld_pubsub_sub *sub)
{
    if (sub->notify_pending) {
        return;
    }
    sub->notify_pending = true;
    sub->notify_next = NULL;
    if (P.notify_tail != NULL) {
        P.notify_tail->notify_next = sub;
    } else {
        P.notify_head = sub;
    }
    P.notify_tail = sub;
    event_active(P.notify_ev, EV_TIMEOUT, 0);
}

static void
notify_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    struct ld_pubsub_sub *list = P.notify_head;
    P.notify_head = P.notify_tail = NULL;
    P.delivering++;
    while (list != NULL) {
        struct ld_pubsub_sub *sub = list;
        list = sub->notify_next;
        sub->notify_pending = false;
        if (!sub->dead && sub->chan != NULL &&
            sub->chan->state == CH_SUBSCRIBED) {
            sub->cb(LD_PUBSUB_SUBSCRIBED, NULL, 0, sub->arg);
        }
    }
    P.delivering--;
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
        snap = malloc(sizeof(*snap) * n);
        if (snap == NULL) {
            return;
        }
    }
    size_t i = 0;
    for (struct ld_pubsub_sub *s = ch->subs; s != NULL && i < n;
         s = s->next) {
        snap[i++] = s;
    }
    P.delivering++;
    for (size_t k = 0; k < i; k++) {
        if (!snap[k]->dead) {
            snap[k]->cb(ev, msg, len, snap[k]->arg);
        }
    }
    P.delivering--;
    if (snap != stack) {
        free(snap);
    }
    free_graveyard();
}

static void
chan_free(struct chan *ch)
{
    ld_dict_del(P.chans, ch->name, ch->len);
    ld_stats.pubsub_channels = (long long)ld_dict_size(P.chans);
    free(ch->name);
    free(ch);
}

static void
send_cmd(const char *verb, const char *name, size_t len)
{
    const char *argv[] = {verb, name};
    size_t argvlen[] = {strlen(verb), len};
    /* Every channel shares one callback; the reply names the channel. */
    redisAsyncCommandArgv(P.ac, reply_cb, NULL, 2, argv, argvlen);
}

static void
chan_want(struct chan *ch)
{
    if (P.state != PS_READY) {
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
    struct chan *ch = ld_dict_get(P.chans, channel, len);
    if (ch == NULL) {
        ch = calloc(1, sizeof(*ch));
        if (ch == NULL) {
            return NULL;
        }
        ch->name = malloc(len + 1);
        if (ch->name == NULL) {
            free(ch);
            return NULL;
        }
        memcpy(ch->name, channel, len);
        ch->name[len] = '\0';
        ch->len = len;
        ch->state = CH_IDLE;
        ld_dict_set(P.chans, ch->name, len, ch);
        ld_stats.pubsub_channels = (long long)ld_dict_size(P.chans);
    }
    struct ld_pubsub_sub *sub = calloc(1, sizeof(*sub));
    if (sub == NULL) {
        if (ch->n_subs == 0 && ch->state == CH_IDLE) {
            chan_free(ch);
        }
        return NULL;
    }
    sub->chan = ch;
    sub->cb = cb;
    sub->arg = arg;
    sub->next = ch->subs;
    if (ch->subs != NULL) {
        ch->subs->prev = sub;
    }
    ch->subs = sub;
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
    if (sub->prev != NULL) {
        sub->prev->next = sub->next;
    } else {
        ch->subs = sub->next;
    }
    if (sub->next != NULL) {
        sub->next->prev = sub->prev;
    }
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
    if (ac != P.ac || reply == NULL || reply->type != REDIS_REPLY_ARRAY ||
        reply->elements < 3 || reply->element[0]->type != REDIS_REPLY_STRING ||
        reply->element[1]->type != REDIS_REPLY_STRING) {
        return;
    }
    const char *kind = reply->element[0]->str;
    const char *name = reply->element[1]->str;
    size_t len = reply->element[1]->len;
    struct chan *ch = ld_dict_get(P.chans, name, len);
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
    if (ac != P.ac) {
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
    int ms = P.backoff_ms / 2 + (int)(ld_random_unit() * (P.backoff_ms / 2 + 1));
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    event_add(P.retry_ev, &tv);
    P.backoff_ms *= 2;
    if (P.backoff_ms > BACKOFF_MAX_MS) {
        P.backoff_ms = BACKOFF_MAX_MS;
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
    ld_dict_iter_init(&it, P.chans);
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
    char **names = calloc(n, sizeof(*names));
    size_t *lens = calloc(n, sizeof(*lens));
    size_t k = 0;
    if (names == NULL || lens == NULL) {
        free(names);
        free(lens);
        return;
    }
    ld_dict_iter_init(&it, P.chans);
    while (k < n && ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct chan *ch = v;
        names[k] = malloc(ch->len + 1);
        if (names[k] == NULL) {
            break;
        }
        memcpy(names[k], ch->name, ch->len);
        lens[k] = ch->len;
        k++;
    }
    for (size_t i = 0; i < k; i++) {
        struct chan *ch = ld_dict_get(P.chans, names[i], lens[i]);
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
    P.state = PS_READY;
    P.backoff_ms = BACKOFF_MIN_MS;
    log_debug("redis subscriber ready");
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, P.chans);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        chan_want(v);
    }
}

static void
connect_cb(const redisAsyncContext *ac, int status)
{
    if (ac != P.ac) {
        return;
    }
    if (status != REDIS_OK) {
        P.ac = NULL;
        P.state = PS_DOWN;
        schedule_retry();
        return;
    }
    redisAsyncContext *mac = P.ac;
    if (!P.is_unix) {
        /* A subscriber hears nothing for long stretches; keepalive is how
         * a dead peer is noticed. (It fails on Unix sockets, whose peer
         * cannot vanish silently, and would poison the context.) */
        redisEnableKeepAlive(&mac->c);
    }
    const struct ld_config *cfg = P.cfg;
    if (cfg->redis.password[0] != '\0') {
        if (cfg->redis.username[0] != '\0') {
            redisAsyncCommand(mac, auth_cb, NULL, "AUTH %s %s",
                              cfg->redis.username, cfg->redis.password);
        } else {
            redisAsyncCommand(mac, auth_cb, NULL, "AUTH %s",
                              cfg->redis.password);
        }
    }
    /* The connection's own channel keeps the subscription count above
     * zero for its whole life (see the top of this file). */
    redisAsyncCommand(mac, own_cb, NULL, "SUBSCRIBE %s", P.own_channel);
    on_ready();
}

static void
disconnect_cb(const redisAsyncContext *ac, int status)
{
    LD_UNUSED(status);
    if (ac != P.ac) {
        return;
    }
    P.ac = NULL;
    bool was = P.state == PS_READY;
    P.state = PS_DOWN;
    if (was) {
        log_warn("redis subscriber connection lost");
    }
    lost_all();
    schedule_retry();
}

static void
ps_connect(void)
{
    redisAsyncContext *ac = P.is_unix ? redisAsyncConnectUnix(P.host)
                                      : redisAsyncConnect(P.host, P.port);
    if (ac == NULL) {
        schedule_retry();
        return;
    }
    if (ac->err) {
        redisAsyncFree(ac);
        schedule_retry();
        return;
    }
    P.ac = ac;
    P.state = PS_CONNECTING;
    redisLibeventAttach(ac, P.base);
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
ld_pubsub_init(struct event_base *base, const struct ld_config *cfg)
{
    memset(&P, 0, sizeof(P));
    P.base = base;
    P.cfg = cfg;
    P.backoff_ms = BACKOFF_MIN_MS;
    if (ld_redis_parse_address(cfg->redis.address, P.host, sizeof(P.host),
                               &P.port, &P.is_unix) != LD_OK) {
        return LD_ERR;
    }
    P.chans = ld_dict_new();
    P.retry_ev = evtimer_new(base, retry_cb, NULL);
    P.notify_ev = event_new(base, -1, 0, notify_cb, NULL);
    snprintf(P.own_channel, sizeof(P.own_channel), "leased:daemon:%s",
             ld_srv.instance);
    return P.chans != NULL ? LD_OK : LD_ERR;
}

void
ld_pubsub_start(void)
{
    ps_connect();
}

void
ld_pubsub_free(void)
{
    if (P.ac != NULL) {
        redisAsyncContext *ac = P.ac;
        P.ac = NULL;
        redisAsyncFree(ac);
    }
    if (P.chans != NULL) {
        struct ld_dict_iter it;
        void *v;
        ld_dict_iter_init(&it, P.chans);
        while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
            struct chan *ch = v;
            struct ld_pubsub_sub *s = ch->subs;
            while (s != NULL) {
                struct ld_pubsub_sub *n = s->next;
                free(s);
                s = n;
            }
            free(ch->name);
            free(ch);
        }
        ld_dict_free(P.chans);
        P.chans = NULL;
    }
    P.delivering = 0;
    P.notify_head = P.notify_tail = NULL;
    while (P.graveyard != NULL) {
        struct ld_pubsub_sub *n = P.graveyard->next;
        free(P.graveyard);
        P.graveyard = n;
    }
    if (P.retry_ev != NULL) {
        event_free(P.retry_ev);
    }
    if (P.notify_ev != NULL) {
        event_free(P.notify_ev);
    }
}
