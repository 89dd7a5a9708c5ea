/* The wait queues locks and semaphores share (ld_lockwait.h): one FIFO
 * per Redis key in this daemon, its timers and its subscription to the
 * key's release channel. It decides when the head tries again; it must
 * not answer a request nor look inside what waits (its owner's try and
 * expire callbacks do both). */

#include "ld_lockwait.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_pubsub.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

/* Slack added to the holder's lease before retrying: Redis treats a key as
 * expired only once its expiry time is strictly in the past, and libevent
 * counts timers on CLOCK_MONOTONIC_COARSE, which ticks once a jiffy (4 ms at
 * HZ=250), so a timer can fire that much before the lease's end. */
#define LW_EXPIRY_SLACK_MS 6

struct ld_lockwait_q {
    char *route;
    size_t route_len;
    char *chan;
    size_t chan_len;
    TAILQ_HEAD(, ld_lockwait) waiters; /* FIFO; only the head tries */
    struct ld_pubsub_sub *sub;
    struct event *retry_ev; /* at the holder's lease end */
    bool wake_pending;      /* a wake-up came while the head was trying */
    long long pttl;         /* holder's lease as last seen, -1 unknown */
    uint64_t pttl_at_ms;
};

static struct {
    const struct ld_ctx *ctx;
    struct ld_dict *queues; /* route -> struct ld_lockwait_q */
    ld_lockwait_try_fn *try_fn;
    ld_lockwait_expire_fn *expire_fn;
    ld_lockwait_sub_fn *sub_fn;
    ld_lockwait_unsub_fn *unsub_fn;
    ld_lockwait_sub_fn *lock_sub_fn; /* NULL: sub_fn */
} lockwait_mod;

static void q_head_try(struct ld_lockwait_q *q);

static void
w_try(struct ld_lockwait *w)
{
    (w->fns != NULL ? w->fns->try_fn : lockwait_mod.try_fn)(w);
}

static void
w_expire(struct ld_lockwait *w, long long ttl_ms)
{
    (w->fns != NULL ? w->fns->expire_fn : lockwait_mod.expire_fn)(w, ttl_ms);
}

/* Each queue is FIFO, so its head is its oldest waiter; the oldest of
 * all is among the heads. */
static void
refresh_oldest(void)
{
    struct ld_dict_iter it;
    void *v;
    uint64_t now = ld_now_ms(), oldest = now;

    if (lockwait_mod.queues == NULL) {
        ld_stats.lock_wait_oldest_ms = 0;
        return;
    }
    ld_dict_iter_init(&it, lockwait_mod.queues);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct ld_lockwait *w = TAILQ_FIRST(
            &((struct ld_lockwait_q *)v)->waiters);
        if (w != NULL && w->since_ms < oldest) {
            oldest = w->since_ms;
        }
    }
    ld_stats.lock_wait_oldest_ms = (long long)(now - oldest);
}

int
ld_lockwait_init(const struct ld_ctx *ctx)
{
    lockwait_mod.ctx = ctx;
    lockwait_mod.queues = ld_dict_new();
    lockwait_mod.sub_fn = ld_pubsub_subscribe;
    lockwait_mod.unsub_fn = ld_pubsub_unsubscribe;
    lockwait_mod.lock_sub_fn = NULL;
    ld_stats_add_refresh(refresh_oldest);
    return LD_OK;
}

void
ld_lockwait_set_handlers(ld_lockwait_try_fn *try_fn,
                         ld_lockwait_expire_fn *expire_fn)
{
    lockwait_mod.try_fn = try_fn;
    lockwait_mod.expire_fn = expire_fn;
}

void
ld_lockwait_set_lock_channel(ld_lockwait_sub_fn *sub_fn)
{
    lockwait_mod.lock_sub_fn = sub_fn;
}

void
ld_lockwait_set_channel(ld_lockwait_sub_fn *sub_fn,
                        ld_lockwait_unsub_fn *unsub_fn)
{
    lockwait_mod.sub_fn = sub_fn;
    lockwait_mod.unsub_fn = unsub_fn;
}

static void
q_destroy(struct ld_lockwait_q *q)
{
    LD_ASSERT(TAILQ_EMPTY(&q->waiters));
    ld_dict_del(lockwait_mod.queues, q->route, q->route_len);
    if (q->sub != NULL) {
        lockwait_mod.unsub_fn(q->sub);
    }
    event_free(q->retry_ev);
    free(q->route);
    free(q->chan);
    free(q);
}

static long long
q_ttl_estimate(const struct ld_lockwait_q *q)
{
    if (q->pttl <= 0) {
        return -1;
    }
    long long left = q->pttl - (long long)(ld_now_ms() - q->pttl_at_ms);
    return left > 0 ? left : -1;
}

/* Take W out of its queue Q, with its deadline and its count: the one
 * way a waiter leaves, whether the queue lives on or goes. */
static void
w_detach(struct ld_lockwait_q *q, struct ld_lockwait *w)
{
    LD_ASSERT(ld_stats.lock_waiters > 0);
    TAILQ_REMOVE(&q->waiters, w, link);
    w->q = NULL;
    if (w->deadline_ev != NULL) {
        event_free(w->deadline_ev);
        w->deadline_ev = NULL;
    }
    ld_stats.lock_waiters--;
}

/* Unlink W; destroys the queue when it empties. Returns the queue, or
 * NULL when it was destroyed. */
static struct ld_lockwait_q *
w_unlink(struct ld_lockwait *w)
{
    struct ld_lockwait_q *q = w->q;
    LD_ASSERT(q != NULL);
    w_detach(q, w);
    if (TAILQ_EMPTY(&q->waiters)) {
        q_destroy(q);
        return NULL;
    }
    return q;
}

static void
q_arm_retry(struct ld_lockwait_q *q, long long pttl)
{
    long long ms;
    if (pttl > 0) {
        ms = pttl + LW_EXPIRY_SLACK_MS;
    } else if (pttl == -1) {
        /* A lock without expiry (written by someone else): no lease end to
         * wait for, so look again now and then. */
        ms = lockwait_mod.ctx->cfg->lock.watchdog_ms / 3;
        if (ms < 10) {
            ms = 10;
        }
    } else {
        ms = 1;
    }
    struct timeval tv = ld_tv_ms((long long)ms);
    evtimer_add(q->retry_ev, &tv);
}

static void
q_on_retry_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct ld_lockwait_q *q = arg;
    ld_stats.lock_wakeups++;
    q_head_try(q);
}

static void
q_on_pubsub(enum ld_pubsub_event ev, const char *msg, size_t len, void *arg)
{
    LD_UNUSED(msg);
    LD_UNUSED(len);
    struct ld_lockwait_q *q = arg;
    switch (ev) {
    case LD_PUBSUB_SUBSCRIBED:
        /* The holder may have unlocked between the head's failed try and
         * this confirmation; that message was never ours to receive. */
        q_head_try(q);
        break;
    case LD_PUBSUB_MESSAGE:
        ld_stats.lock_wakeups++;
        q_head_try(q);
        break;
    case LD_PUBSUB_LOST:
        /* Messages may be missed until SUBSCRIBED comes again, which
         * retries; the lease timer keeps running meanwhile. */
        break;
    }
}

static void
q_head_try(struct ld_lockwait_q *q)
{
    struct ld_lockwait *h = TAILQ_FIRST(&q->waiters);
    if (h == NULL) {
        return;
    }
    LD_ASSERT(h->q == q);
    if (h->trying) {
        q->wake_pending = true;
        return;
    }
    q->wake_pending = false;
    evtimer_del(q->retry_ev);
    h->trying = true;
    w_try(h);
}

static void
q_subscribe(struct ld_lockwait_q *q)
{
    if (q->sub != NULL) {
        return;
    }
    ld_lockwait_sub_fn *fn = lockwait_mod.sub_fn;
    if (lockwait_mod.lock_sub_fn != NULL &&
        TAILQ_FIRST(&q->waiters)->fns == NULL) {
        fn = lockwait_mod.lock_sub_fn;
    }
    q->sub = fn(q->chan, q->chan_len, q_on_pubsub, q);
    if (q->sub == NULL) {
        log_warn("lock wait queue could not subscribe; waking on lease end "
                 "only");
    }
}

/* The head's attempt saw another holder with lease PTTL. */
static void
q_taken(struct ld_lockwait_q *q, long long pttl)
{
    q->pttl = pttl;
    q->pttl_at_ms = ld_now_ms();
    q_subscribe(q);
    if (q->wake_pending) {
        q_head_try(q);
    } else {
        q_arm_retry(q, pttl);
    }
}

static void
w_on_deadline(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct ld_lockwait *w = arg;
    struct ld_lockwait_q *q = w->q;
    LD_ASSERT(q != NULL);
    w->timed_out = true;
    if (w == TAILQ_FIRST(&q->waiters)) {
        /* One last attempt: the lock may be free even though no wake-up
         * reached us (a lost message, a holder without lease). Its
         * outcome answers the request. */
        if (!w->trying) {
            q->wake_pending = false;
            w->trying = true;
            w_try(w);
        }
        return;
    }
    long long ttl = q_ttl_estimate(q);
    w_unlink(w);
    w_expire(w, ttl);
}

long long
ld_lockwait_left(long long wait_ms, uint64_t start_us)
{
    if (wait_ms < 0) {
        return -1;
    }
    long long left = wait_ms - (long long)((ld_now_us() - start_us) / 1000);
    return left > 0 ? left : 0;
}

bool
ld_lockwait_full(void)
{
    /* rate.acquire's waits are no queue of this module but are waits of
     * the same kind, a request parked on a timer until a key frees up:
     * they share the one bound. */
    return ld_stats.lock_waiters + ld_stats.rate_waiting >=
           lockwait_mod.ctx->cfg->limits.max_waiters;
}

bool
ld_lockwait_queued(const char *route, size_t route_len)
{
    return ld_dict_get(lockwait_mod.queues, route, route_len) != NULL;
}

long long
ld_lockwait_waiting(const char *route, size_t route_len)
{
    const struct ld_lockwait_q *q = ld_dict_get(lockwait_mod.queues, route,
                                                route_len);
    long long n = 0;
    const struct ld_lockwait *w;
    if (q != NULL) {
        TAILQ_FOREACH(w, &q->waiters, link)
        {
            n++;
        }
    }
    return n;
}

/* The queue of ROUTE, made (with release channel CHAN) when there is
 * none. */
static struct ld_lockwait_q *
q_get(const char *route, size_t route_len, const char *chan, size_t chan_len)
{
    struct ld_lockwait_q *q = ld_dict_get(lockwait_mod.queues, route,
                                          route_len);
    if (q != NULL) {
        return q;
    }
    q = ld_xcalloc(1, sizeof(*q));
    TAILQ_INIT(&q->waiters);
    q->route = ld_xstrndup(route, route_len);
    q->route_len = route_len;
    q->chan = ld_xstrndup(chan, chan_len);
    q->chan_len = chan_len;
    q->pttl = -1;
    q->retry_ev = evtimer_new(lockwait_mod.ctx->base, q_on_retry_timer, q);
    if (q->retry_ev == NULL) {
        ld_oom(0);
    }
    ld_dict_set(lockwait_mod.queues, q->route, route_len, q);
    return q;
}

void
ld_lockwait_join(struct ld_lockwait *w, const char *route, size_t route_len,
                 const char *chan, size_t chan_len, long long wait_ms,
                 bool tried, long long pttl)
{
    LD_ASSERT(w->q == NULL);
    LD_ASSERT(w->fns != NULL ||
              (lockwait_mod.try_fn != NULL && lockwait_mod.expire_fn != NULL));
    struct ld_lockwait_q *q = q_get(route, route_len, chan, chan_len);
    w->q = q;
    TAILQ_INSERT_TAIL(&q->waiters, w, link);
    w->trying = false;
    w->timed_out = false;
    w->since_ms = ld_now_ms();
    ld_stats.lock_waiters++;
    if (wait_ms >= 0) {
        struct timeval tv = ld_tv_ms(wait_ms);
        w->deadline_ev = evtimer_new(lockwait_mod.ctx->base, w_on_deadline, w);
        if (w->deadline_ev == NULL) {
            ld_oom(0);
        }
        evtimer_add(w->deadline_ev, &tv);
    }
    if (TAILQ_FIRST(&q->waiters) != w) {
        if (tried) {
            q->pttl = pttl;
            q->pttl_at_ms = ld_now_ms();
        }
        return;
    }
    if (tried) {
        q_taken(q, pttl);
    } else {
        w->trying = true;
        w_try(w);
    }
}

void
ld_lockwait_done(struct ld_lockwait *w, enum ld_lockwait_result res,
                 long long pttl)
{
    struct ld_lockwait_q *q = w->q;
    w->trying = false;
    if (q == NULL) {
        return;
    }
    /* Only the head of a queue ever makes an attempt. */
    LD_ASSERT(TAILQ_FIRST(&q->waiters) == w);
    if (res == LD_LOCKWAIT_TAKEN) {
        if (!w->timed_out) {
            q_taken(q, pttl);
            return;
        }
        q->pttl = pttl;
        q->pttl_at_ms = ld_now_ms();
        q_arm_retry(q, pttl);
        q_subscribe(q);
        q = w_unlink(w);
        if (q != NULL && q->wake_pending) {
            q_head_try(q);
        }
        w_expire(w, pttl);
        return;
    }
    /* Granted or answered with an error: the next head tries once right
     * away. After a grant it fails fast and learns the new holder's lease;
     * after an error (Redis down) it gets its own answer. */
    q->wake_pending = false;
    q = w_unlink(w);
    if (q != NULL) {
        q_head_try(q);
    }
}

void
ld_lockwait_leave(struct ld_lockwait *w)
{
    struct ld_lockwait_q *q = w->q;
    if (q == NULL) {
        return;
    }
    bool was_trying_head = TAILQ_FIRST(&q->waiters) == w && w->trying;
    q = w_unlink(w);
    if (q != NULL && was_trying_head) {
        /* The outcome of that attempt no longer reaches the queue. */
        q_head_try(q);
    }
}

bool
ld_lockwait_cancel(struct ld_lockwait *w)
{
    if (w->q == NULL) {
        return false;
    }
    long long ttl = q_ttl_estimate(w->q);
    ld_lockwait_leave(w);
    w_expire(w, ttl);
    return true;
}

void
ld_lockwait_free(void)
{
    if (lockwait_mod.queues == NULL) {
        return;
    }
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, lockwait_mod.queues);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct ld_lockwait_q *q = v;
        struct ld_lockwait *w;
        while ((w = TAILQ_FIRST(&q->waiters)) != NULL) {
            w_detach(q, w);
        }
        q_destroy(q);
    }
    ld_dict_free(lockwait_mod.queues);
    lockwait_mod.queues = NULL;
}
