/*
 * The distributed rate limiter: rate.acquire.
 *
 * Every decision is one script run (src/lua/rate_acquire.lua) on Redis'
 * clock, so daemons with drifting clocks, or many of them on one key,
 * still grant at most burst + rate * window / per_ms permits in any
 * window. A refused request with a wait_ms is tried again when the
 * script says the permits could be free (a timer, no polling), until its
 * wait runs out; it is then answered with the last retry_after_ms. A
 * waiting request stays pending for its session (limits.max_pending),
 * takes a place under limits.max_waiters with the lock and semaphore
 * waiters, ends when its session closes and may be ended by the cancel
 * op.
 */
#include "ld_rate.h"

#include "ld_assert.h"
#include "ld_cancel.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_features.h"
#include "ld_lease.h"
#include "ld_lockwait.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_redis.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#define RATE_MAX 1000000LL
#define RATE_PER_MS_MAX 86400000LL
/* burst * per_ms / rate, the time a bucket takes to fill, is bounded so
 * that the script's microsecond arithmetic stays exact in Lua's doubles
 * (below 2^53 with today's clock): about 31 years. */
#define RATE_FILL_MS_MAX 1000000000000LL

/* One rate.acquire on its way, or waiting for its next try. */
struct rate_op {
    struct ld_req *req;      /* NULL once answered */
    struct ld_session *sess; /* its session, NULL once that closed */
    char *name;              /* the Redis key */
    size_t name_len;
    long long rate, per_ms, burst, permits, wait_ms;
    long long retry_ms;  /* as last answered by the script */
    bool inflight;       /* a decision is out */
    struct event *timer; /* the next try, while waiting */
    TAILQ_ENTRY(rate_op) link;
};

static struct {
    const struct ld_ctx *ctx;
    TAILQ_HEAD(, rate_op) ops; /* every one not yet answered or in flight */
    bool stopping;
    bool freed;
} rate_mod;

static void try_send(struct rate_op *op);

static void
op_free(struct rate_op *op)
{
    TAILQ_REMOVE(&rate_mod.ops, op, link);
    if (op->timer != NULL) {
        LD_ASSERT(ld_stats.rate_waiting > 0);
        ld_stats.rate_waiting--;
        event_free(op->timer);
    }
    free(op->name);
    free(op);
}

static void
reply_result(struct rate_op *op, bool acquired, long long retry_ms)
{
    if (op->req == NULL) {
        return;
    }
    ld_reply_ok(op->req, json_pack("{s:b,s:I}", "acquired", acquired,
                                   "retry_after_ms", (json_int_t)retry_ms));
    op->req = NULL;
    if (acquired) {
        ld_stats.rate_granted++;
    } else {
        ld_stats.rate_refused++;
    }
}

/* ------------------------------------------------------------ waiting */

static void
on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    try_send(arg);
}

/* A cancel answers a waiting request at once, as if its wait had run
 * out; a decision in flight cannot be taken back (it may have granted),
 * so it is not cancelled then. */
static bool
on_cancel(void *arg)
{
    struct rate_op *op = arg;
    if (op->inflight || op->req == NULL) {
        return false;
    }
    reply_result(op, false, op->retry_ms);
    op_free(op);
    return true;
}

/* Refused with RETRY_MS to wait: try again then if the wait allows it,
 * else answer false. */
static void
on_refused(struct rate_op *op, long long retry_ms)
{
    op->retry_ms = retry_ms;
    long long left = op->wait_ms > 0
                         ? ld_lockwait_left(op->wait_ms, op->req->start_us)
                         : 0;
    if (rate_mod.stopping || left <= 0 || retry_ms > left) {
        reply_result(op, false, retry_ms);
        op_free(op);
        return;
    }
    if (op->timer == NULL) {
        /* A wait starts: it takes a place under limits.max_waiters, as a
         * lock's does, or is refused busy as a lock's is. */
        if (ld_lockwait_full()) {
            ld_reply_error(op->req, LD_E_BUSY,
                           "too many waiters (limits.max_waiters)");
            op->req = NULL;
            op_free(op);
            return;
        }
        op->timer = evtimer_new(rate_mod.ctx->base, on_timer, op);
        ld_stats.rate_waiting++;
        ld_cancel_on(op->req, on_cancel, op);
    }
    /* The script rounds up to whole milliseconds: the permits are free
     * by then on Redis' clock. */
    struct timeval tv = ld_tv_ms(retry_ms < 1 ? 1 : retry_ms);
    evtimer_add(op->timer, &tv);
}

/* ------------------------------------------------------------ acquire */

static void
on_reply(redisReply *r, void *arg)
{
    struct rate_op *op = arg;
    LD_ASSERT(op->inflight);
    op->inflight = false;
    if (rate_mod.freed) {
        free(op->name);
        free(op);
        return;
    }
    if (op->req == NULL) {
        /* Its session closed or the daemon stopped meanwhile. */
        op_free(op);
        return;
    }
    long long v[2] = {0, 0};
    int n = ld_lease_reply_ints(r, v, 2);
    if (n == 2 && v[0] == 1) {
        reply_result(op, true, v[1]);
        op_free(op);
    } else if (n == 2 && v[0] == 0) {
        on_refused(op, v[1]);
    } else if (n >= 1 && v[0] == -1) {
        ld_reply_error(op->req, LD_E_WRONG_TYPE,
                       "the Redis key of this rate limiter holds data "
                       "leased did not write; nothing was changed");
        op->req = NULL;
        op_free(op);
    } else {
        ld_lease_reply_failure(op->req, r, "rate.acquire");
        op->req = NULL;
        op_free(op);
    }
}

static void
try_send(struct rate_op *op)
{
    char rbuf[24], pbuf[24], bbuf[24], nbuf[24];
    snprintf(rbuf, sizeof(rbuf), "%lld", op->rate);
    snprintf(pbuf, sizeof(pbuf), "%lld", op->per_ms);
    snprintf(bbuf, sizeof(bbuf), "%lld", op->burst);
    snprintf(nbuf, sizeof(nbuf), "%lld", op->permits);
    const char *argv[] = {op->name, rbuf, pbuf, bbuf, nbuf};
    size_t lens[] = {op->name_len, strlen(rbuf), strlen(pbuf), strlen(bbuf),
                     strlen(nbuf)};
    op->inflight = true;
    ld_redis_script(LD_SCRIPT_rate_acquire, op->name, op->name_len, 1, 5, argv,
                    lens, on_reply, op);
}

/* The fields of a rate.acquire, checked; false once REQ has been answered
 * with why not. */
static bool
args_read(struct ld_req *req, struct rate_op *a, const char **key,
          size_t *klen)
{
    bool has_burst = false;
    a->permits = 1;
    a->wait_ms = 0;
    if (ld_req_key(req, "key", key, klen) != LD_OK ||
        ld_req_int(req, "rate", true, 1, RATE_MAX, &a->rate, NULL) != LD_OK ||
        ld_req_int(req, "per_ms", true, 1, RATE_PER_MS_MAX, &a->per_ms,
                   NULL) != LD_OK ||
        ld_req_int(req, "burst", false, 1, RATE_MAX, &a->burst, &has_burst) !=
            LD_OK ||
        ld_req_int(req, "permits", false, 1, RATE_MAX, &a->permits, NULL) !=
            LD_OK ||
        ld_req_int(req, "wait_ms", false, 0, LD_WAIT_MS_MAX, &a->wait_ms,
                   NULL) != LD_OK) {
        return false;
    }
    if (!has_burst) {
        a->burst = a->rate;
    }
    if (a->permits > a->burst) {
        /* Never grantable: a wait would be for nothing. */
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'permits' (%lld) is above 'burst' (%lld)",
                       a->permits, a->burst);
        return false;
    }
    /* burst * per_ms <= 8.64e13 and rate * 1e12 <= 1e18: no overflow. */
    if (a->burst * a->per_ms > a->rate * RATE_FILL_MS_MAX) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "burst * per_ms / rate (the time to fill the "
                       "bucket) is above %lld ms",
                       RATE_FILL_MS_MAX);
        return false;
    }
    if (rate_mod.stopping) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        return false;
    }
    if (!ld_req_session_open(req)) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the session has ended");
        return false;
    }
    return true;
}

static void
op_acquire(struct ld_req *req)
{
    struct rate_op a;
    const char *key;
    size_t klen;
    memset(&a, 0, sizeof(a));
    if (!args_read(req, &a, &key, &klen)) {
        return;
    }
    struct rate_op *op = ld_xmalloc(sizeof(*op));
    *op = a;
    op->req = req;
    op->sess = req->sess;
    /* <lock.prefix>{KEY}:rate, beside the lock of the same key and never
     * in its way. */
    const char *names[1];
    size_t lens[1];
    op->name = ld_lease_names(rate_mod.ctx->cfg->lock.prefix, key, klen,
                              ":rate", NULL, 0, names, lens);
    op->name_len = lens[0];
    LD_ASSERT(names[0] == op->name);
    TAILQ_INSERT_TAIL(&rate_mod.ops, op, link);
    try_send(op);
}

/* ------------------------------------------------------------ sessions */

/* Nobody will read the answers: those waiting are answered (which ends
 * their requests) and dropped, those in flight when their reply comes. */
static void
drop_ops(struct ld_session *s, int code, const char *msg)
{
    struct rate_op *op, *next;
    for (op = TAILQ_FIRST(&rate_mod.ops); op != NULL; op = next) {
        next = TAILQ_NEXT(op, link);
        if (s != NULL && op->sess != s) {
            continue;
        }
        op->sess = NULL;
        if (op->req != NULL) {
            if (code < 0) {
                reply_result(op, false, op->retry_ms);
            } else {
                ld_reply_error(op->req, code, "%s", msg);
                op->req = NULL;
            }
        }
        if (!op->inflight) {
            op_free(op);
        }
    }
}

static void
on_session_close(struct ld_session *s)
{
    drop_ops(s, -1, NULL);
}

/* -------------------------------------------------------------- module */

int
ld_rate_init(const struct ld_ctx *ctx)
{
    rate_mod.ctx = ctx;
    rate_mod.stopping = false;
    rate_mod.freed = false;
    TAILQ_INIT(&rate_mod.ops);
    ld_session_on_close(on_session_close);
    static const struct ld_op rate_ops[] = {
        {"rate.acquire", op_acquire, LD_OP_WAITS},
    };
    if (ld_dispatch_register_ops(rate_ops, LD_ARRAY_LEN(rate_ops)) != LD_OK) {
        return LD_ERR;
    }
    ld_features_add("rate");
    return LD_OK;
}

void
ld_rate_shutdown(void)
{
    if (rate_mod.ctx == NULL || rate_mod.stopping) {
        return;
    }
    rate_mod.stopping = true;
    drop_ops(NULL, LD_E_SHUTTING_DOWN, "the daemon is stopping");
}

/* Those in flight are freed by their reply, which sees FREED. */
void
ld_rate_free(void)
{
    if (rate_mod.ctx == NULL) {
        return;
    }
    drop_ops(NULL, -1, NULL);
    struct rate_op *op;
    while ((op = TAILQ_FIRST(&rate_mod.ops)) != NULL) {
        LD_ASSERT(op->inflight && op->req == NULL);
        TAILQ_REMOVE(&rate_mod.ops, op, link);
        if (op->timer != NULL) {
            ld_stats.rate_waiting--;
            event_free(op->timer);
            op->timer = NULL;
        }
    }
    rate_mod.freed = true;
    rate_mod.ctx = NULL;
}
