/* Redlock over the instances of lock.redlock: one lock script fanned out
 * to every instance, the answers folded into one (see ld_redlock.h).
 *
 * Wake-ups travel on the instances too. The release scripts publish on
 * the instance where they released, so an unlock is heard on every
 * instance it reached; waiters subscribe on all of them (a group of
 * ld_pubsub) and wake on the first copy. Each release carries a payload
 * of its own (this daemon's id and a counter), by which the group tells
 * the copies of one message from the next message; except in the
 * Redisson layout, whose waiters understand Redisson's "0" only (the
 * group then tells copies by the instances that already gave one).
 *
 * Every instance gets the same script with the same token, in parallel,
 * with a per-command timeout of min(redis.timeout_ms, lease / 10): an
 * instance that is down or slow costs a short wait, never the lease. The
 * decision waits for the first answer (or its absence) of every instance,
 * so it is taken at most one such timeout after the send.
 *
 * It owns the fan-out and the decision; the instances' connections are
 * ld_redis's (instances k >= 1), and it must not touch the main backend's. */

#include "ld_redlock.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_pubsub.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RL_WHY_LEN 96
#define RL_MAX_ARGS 16
#define RL_REDISSON_UNLOCK "0" /* Redisson's LockPubSub.UNLOCK_MESSAGE */

/* One instance's part of a call. */
struct rl_slot {
    struct rl_call *c;
    int k;        /* index in rl_mod.inst */
    bool first;   /* its first callback came */
    bool late;    /* a second callback (LATE or LOST) is still to come */
    bool may_run; /* sent and not answered: it may have run */
    int n;        /* integers of its reply; < 1: no usable reply */
    long long v[4];
    char why[RL_WHY_LEN];
};

struct rl_call {
    enum ld_script_id id;
    ld_redis_cb *cb;
    void *arg;
    char *hash, *field, *chan;
    size_t hash_len, field_len, chan_len;
    long long lease; /* ms, 0: none (release, info, a check) */
    bool reenter;    /* lock_acquire: reentry only */
    uint64_t sent_us;
    int left;    /* first callbacks still to come */
    int refs;    /* callbacks still to come, give-backs in flight */
    bool failed; /* an acquisition that was not granted */
    struct rl_slot slot[];
};

static struct {
    const struct ld_ctx *ctx;
    int *inst; /* ld_redis instance numbers */
    int *sub;  /* their ld_pubsub backends */
    int n;
    unsigned long long msg_seq; /* the last unlock message's number */
    bool freed; /* answers still arriving only free their calls */
    bool had_quorum;
    ld_redis_state_fn *state_fn;
    void *state_arg;
    /* What the callback now running is told. */
    enum ld_redis_outcome outcome;
    char why[512];
} rl_mod;

static int
quorum(void)
{
    return rl_mod.n / 2 + 1;
}

int
ld_redlock_quorum(void)
{
    return quorum();
}

int
ld_redlock_count(void)
{
    return rl_mod.n;
}

int
ld_redlock_ready_count(void)
{
    int up = 0;
    for (int i = 0; i < rl_mod.n && !rl_mod.freed; i++) {
        up += ld_redis_instance_ready(rl_mod.inst[i]) ? 1 : 0;
    }
    return up;
}

static void
on_instance_state(int k, bool up, void *arg)
{
    LD_UNUSED(arg);
    int idx = -1;
    for (int i = 0; i < rl_mod.n; i++) {
        if (rl_mod.inst[i] == k) {
            idx = i;
        }
    }
    if (idx < 0 || rl_mod.freed) {
        return; /* not one of ours (the main backend) */
    }
    int ready = ld_redlock_ready_count();
    bool q = ready >= quorum();
    ld_stats.redlock_instances_up = ready;
    log_info("redlock instance=%s %s ready=%d of %d",
             rl_mod.ctx->cfg->lock.redlock.items[idx], up ? "up" : "down",
             ready, rl_mod.n);
    if (q != rl_mod.had_quorum) {
        rl_mod.had_quorum = q;
        if (q) {
            log_info("redlock: a majority of instances is reachable");
        } else {
            log_warn("redlock: only %d of %d instances reachable, locks "
                     "need %d",
                     ready, rl_mod.n, quorum());
        }
        if (rl_mod.state_fn != NULL) {
            rl_mod.state_fn(q, rl_mod.state_arg);
        }
    }
}

void
ld_redlock_on_state(ld_redis_state_fn *fn, void *arg)
{
    rl_mod.state_fn = fn;
    rl_mod.state_arg = arg;
}

int
ld_redlock_init(const struct ld_ctx *ctx)
{
    const struct ld_strlist *l = &ctx->cfg->lock.redlock;
    rl_mod.ctx = ctx;
    if (l->count == 0) {
        return LD_OK;
    }
    rl_mod.inst = ld_xcalloc(l->count, sizeof(*rl_mod.inst));
    rl_mod.sub = ld_xcalloc(l->count, sizeof(*rl_mod.sub));
    for (size_t i = 0; i < l->count; i++) {
        int k = ld_redis_add_instance(l->items[i]);
        int b = k != LD_ERR ? ld_pubsub_add_backend(l->items[i]) : LD_ERR;
        if (b == LD_ERR) {
            log_error("lock.redlock: cannot use instance %s", l->items[i]);
            return LD_ERR;
        }
        rl_mod.inst[rl_mod.n] = k;
        rl_mod.sub[rl_mod.n++] = b;
    }
    ld_redis_on_instance_state(on_instance_state, NULL);
    log_info("redlock: %d instances, a lock needs %d", rl_mod.n, quorum());
    return LD_OK;
}

void
ld_redlock_free(void)
{
    /* The count stays: calls still out size their slots by it. */
    rl_mod.freed = true;
    free(rl_mod.inst);
    rl_mod.inst = NULL;
    free(rl_mod.sub);
    rl_mod.sub = NULL;
}

struct ld_pubsub_sub *
ld_redlock_subscribe(const char *chan, size_t len, ld_pubsub_cb *cb, void *arg)
{
    if (rl_mod.freed || rl_mod.n == 0) {
        return NULL;
    }
    return ld_pubsub_subscribe_group(rl_mod.sub, rl_mod.n, quorum(), chan, len,
                                     cb, arg);
}

/* The unlock message for a release whose caller gave GIVEN: one no other
 * release has (this daemon's id, a number), or GIVEN itself in the
 * Redisson layout. */
static const char *
unlock_msg(char *buf, size_t size, const char *given)
{
    if (rl_mod.ctx->cfg->lock.layout == LD_LAYOUT_REDISSON) {
        return given;
    }
    snprintf(buf, size, "%s:%llu", rl_mod.ctx->instance, ++rl_mod.msg_seq);
    return buf;
}

enum ld_redis_outcome
ld_redlock_outcome(void)
{
    return rl_mod.outcome;
}

const char *
ld_redlock_failure_reason(void)
{
    return rl_mod.why;
}

/* ------------------------------------------------------------- calls */

static void
call_unref(struct rl_call *c)
{
    LD_ASSERTF(c->refs > 0, "redlock call freed twice refs=%d", c->refs);
    if (--c->refs > 0) {
        return;
    }
    free(c->hash);
    free(c->field);
    free(c->chan);
    free(c);
}

static void
undo_on_reply(redisReply *r, void *arg)
{
    LD_UNUSED(r);
    call_unref(arg);
}

/* Give back the one hold a failed acquisition took on instance IDX. Where
 * it releases, the script publishes: others may have failed on this
 * hold. */
static void
undo_one(struct rl_call *c, int idx)
{
    /* Only an acquisition that was not granted gives holds back. */
    LD_ASSERT(c->failed && c->id == LD_SCRIPT_lock_acquire);
    if (rl_mod.freed) {
        return;
    }
    char buf[64];
    const char *msg = unlock_msg(buf, sizeof(buf), RL_REDISSON_UNLOCK);
    const char *argv[] = {c->hash, c->field, "1", c->chan, msg};
    size_t lens[] = {c->hash_len, c->field_len, 1, c->chan_len, strlen(msg)};
    struct ld_redis_opts o = {0};
    o.instance = rl_mod.inst[idx];
    c->refs++;
    ld_stats.redlock_undone++;
    ld_redis_script_ex(&o, LD_SCRIPT_lock_release, c->hash, c->hash_len, 1, 5,
                       argv, lens, undo_on_reply, c);
}

/* A script reply to C as integers (a decimal string counts: the fence).
 * A bare integer stands for {X, 0, ...}, and from lock_acquire for a
 * grant of one hold with fence X for the lease sent (lk_reply_acquire). */
static int
read_reply(const struct rl_call *c, const redisReply *r, long long *v, int max)
{
    if (r != NULL && r->type == REDIS_REPLY_INTEGER && max >= 4) {
        if (c->id != LD_SCRIPT_lock_acquire) {
            v[0] = r->integer;
            v[1] = v[2] = v[3] = 0;
            return 4;
        }
        return r->integer < 1 ? -1
                              : ld_lock_bare_grant(r->integer, c->lease, v);
    }
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        return -1;
    }
    int n = 0;
    for (size_t i = 0; i < r->elements && n < max; i++) {
        const redisReply *e = r->element[i];
        if (e->type == REDIS_REPLY_INTEGER) {
            v[n++] = e->integer;
        } else if (e->type == REDIS_REPLY_STRING && e->len > 0 &&
                   e->len < 24) {
            char buf[24], *end;
            memcpy(buf, e->str, e->len);
            buf[e->len] = '\0';
            errno = 0;
            long long x = strtoll(buf, &end, 10);
            if (errno != 0 || *end != '\0' || x < 0) {
                return -1;
            }
            v[n++] = x;
        } else {
            return -1;
        }
    }
    return n;
}

/* The folded answer, shaped as the script's own. */
struct rl_answer {
    redisReply top;
    redisReply el[4];
    redisReply *ptr[4];
    char fence[24];
};

static redisReply *
answer_ints(struct rl_answer *a, int n, const long long *v)
{
    memset(a, 0, sizeof(*a));
    a->top.type = REDIS_REPLY_ARRAY;
    a->top.elements = (size_t)n;
    a->top.element = a->ptr;
    for (int i = 0; i < n; i++) {
        a->el[i].type = REDIS_REPLY_INTEGER;
        a->el[i].integer = v[i];
        a->ptr[i] = &a->el[i];
    }
    return &a->top;
}

static redisReply *
answer_grant(struct rl_answer *a, long long count, long long fence,
             long long pttl)
{
    long long v[4] = {LD_LOCK_GRANTED, count, 0, pttl};
    answer_ints(a, 4, v);
    snprintf(a->fence, sizeof(a->fence), "%lld", fence);
    a->el[2].type = REDIS_REPLY_STRING;
    a->el[2].str = a->fence;
    a->el[2].len = strlen(a->fence);
    return &a->top;
}

static int
count_code(const struct rl_call *c, long long code, int minlen)
{
    int x = 0;
    for (int i = 0; i < rl_mod.n; i++) {
        const struct rl_slot *s = &c->slot[i];
        x += (s->n >= minlen && s->v[0] == code) ? 1 : 0;
    }
    return x;
}

static int
count_answered(const struct rl_call *c)
{
    int x = 0;
    for (int i = 0; i < rl_mod.n; i++) {
        x += c->slot[i].n >= 1 ? 1 : 0;
    }
    return x;
}

static bool
any_may_run(const struct rl_call *c)
{
    for (int i = 0; i < rl_mod.n; i++) {
        if (c->slot[i].may_run) {
            return true;
        }
    }
    return false;
}

/* The smallest value at V[IDX] of the slots answering CODE (-1: none
 * positive). */
static long long
min_of(const struct rl_call *c, long long code, int idx)
{
    long long m = -1;
    for (int i = 0; i < rl_mod.n; i++) {
        const struct rl_slot *s = &c->slot[i];
        if (s->n > idx && s->v[0] == code && s->v[idx] >= 0 &&
            (m < 0 || s->v[idx] < m)) {
            m = s->v[idx];
        }
    }
    return m;
}

static long long
max_of(const struct rl_call *c, long long code, int idx)
{
    long long m = -1;
    for (int i = 0; i < rl_mod.n; i++) {
        const struct rl_slot *s = &c->slot[i];
        if (s->n > idx && s->v[0] == code && s->v[idx] > m) {
            m = s->v[idx];
        }
    }
    return m;
}

static long long
elapsed_ms(const struct rl_call *c)
{
    return (long long)((ld_now_us() - c->sent_us) / 1000);
}

/* Redlock's clock drift allowance for a lease. */
static long long
drift_ms(long long lease)
{
    return lease / 100 + 2;
}

/* Why no majority: what each instance that did not answer said. */
static void
set_why(const struct rl_call *c, const char *what)
{
    int at = snprintf(rl_mod.why, sizeof(rl_mod.why),
                      "redlock: %s (%d of %d instances answered, a majority "
                      "is %d)",
                      what, count_answered(c), rl_mod.n, quorum());
    for (int i = 0; i < rl_mod.n && at > 0 &&
                    (size_t)at < sizeof(rl_mod.why) && !rl_mod.freed;
         i++) {
        const struct rl_slot *s = &c->slot[i];
        if (s->n >= 1) {
            continue;
        }
        at += snprintf(rl_mod.why + at, sizeof(rl_mod.why) - (size_t)at,
                       "; %s: %s", rl_mod.ctx->cfg->lock.redlock.items[i],
                       s->why);
    }
}

static void
deliver(struct rl_call *c, redisReply *r, enum ld_redis_outcome o)
{
    rl_mod.outcome = o;
    if (r != NULL) {
        rl_mod.why[0] = '\0';
    }
    c->cb(r, c->arg);
    rl_mod.outcome = LD_REDIS_ANSWERED;
    rl_mod.why[0] = '\0';
}

static void
fail(struct rl_call *c, const char *what, bool write)
{
    set_why(c, what);
    deliver(c, NULL,
            write && any_may_run(c) ? LD_REDIS_LOST : LD_REDIS_NOT_SENT);
}

/* A majority granted C: it is the caller's when time is left of the
 * shortest lease, after the time the acquisition took and the clock
 * drift. */
static bool
grant_if_valid(struct rl_call *c)
{
    struct rl_answer a;
    long long pttl = min_of(c, LD_LOCK_GRANTED, 3);
    long long lease = c->lease > 0 ? c->lease : pttl;
    long long validity = pttl - elapsed_ms(c) - drift_ms(lease);
    if (validity <= 0) {
        return false;
    }
    deliver(c,
            answer_grant(&a, max_of(c, LD_LOCK_GRANTED, 1),
                         max_of(c, LD_LOCK_GRANTED, 2), validity),
            LD_REDIS_ANSWERED);
    return true;
}

/* Not granted: give back every hold C took, now or when a late answer
 * says it took one. */
static void
undo_holds(struct rl_call *c)
{
    c->failed = true;
    for (int i = 0; i < rl_mod.n; i++) {
        const struct rl_slot *s = &c->slot[i];
        if (s->n >= 4 && s->v[0] == LD_LOCK_GRANTED) {
            undo_one(c, i);
        }
    }
}

static void
decide_acquire(struct rl_call *c)
{
    struct rl_answer a;
    int m = quorum();
    int granted = count_code(c, LD_LOCK_GRANTED, 4);
    if (granted >= m && grant_if_valid(c)) {
        return;
    }
    undo_holds(c);
    if (granted >= m) {
        fail(c, "the acquisition took longer than the lease", true);
        return;
    }
    int taken = count_code(c, LD_LOCK_TAKEN, 2) +
                count_code(c, LD_LOCK_OTHER, 2);
    int wrong = count_code(c, LD_LOCK_WRONG_TYPE, 1);
    if (count_answered(c) < m) {
        fail(c, "no majority answered", true);
        return;
    }
    if (wrong > 0) {
        long long v[1] = {LD_LOCK_WRONG_TYPE};
        deliver(c, answer_ints(&a, 1, v), LD_REDIS_ANSWERED);
        return;
    }
    long long pttl = min_of(c, LD_LOCK_TAKEN, 1);
    long long po = min_of(c, LD_LOCK_OTHER, 1);
    if (pttl < 0 || (po >= 0 && po < pttl)) {
        pttl = po;
    }
    if (c->reenter) {
        long long v[2] = {taken > 0 ? LD_LOCK_OTHER : LD_LOCK_ABSENT, pttl};
        deliver(c, answer_ints(&a, taken > 0 ? 2 : 1, v), LD_REDIS_ANSWERED);
        return;
    }
    if (taken == 0) {
        fail(c, "no majority granted the lock", true);
        return;
    }
    /* Held elsewhere, or votes split between contenders: the caller
     * waits for a wake-up or for the shortest lease seen (-1: a hold
     * without expiry, looked at again now and then). */
    long long v[2] = {LD_LOCK_TAKEN, pttl};
    deliver(c, answer_ints(&a, 2, v), LD_REDIS_ANSWERED);
}

/* Gone, held by another, or not a lock, as a majority of answers says. */
static void
deliver_gone(struct rl_call *c)
{
    struct rl_answer a;
    long long v[3] = {LD_LOCK_ABSENT, 0, 0};
    if (count_code(c, LD_LOCK_WRONG_TYPE, 1) > 0) {
        v[0] = LD_LOCK_WRONG_TYPE;
    } else if (count_code(c, LD_LOCK_OTHER, 1) > 0) {
        v[0] = LD_LOCK_OTHER;
    } else if (count_code(c, LD_LOCK_FORCED, 1) > 0) {
        v[0] = LD_LOCK_FORCED; /* lock.force_unlock took it */
    }
    deliver(c, answer_ints(&a, 1, v), LD_REDIS_ANSWERED);
}

static void
decide_renew(struct rl_call *c)
{
    struct rl_answer a;
    int m = quorum();
    bool write = c->lease > 0;
    if (count_code(c, LD_LOCK_HELD, 3) >= m) {
        /* -1: no instance has an expiry on it (someone removed it). */
        long long pttl = min_of(c, LD_LOCK_HELD, 1);
        bool ok = pttl < 0;
        if (pttl >= 0) {
            long long lease = c->lease > 0 ? c->lease : pttl;
            pttl -= elapsed_ms(c) + drift_ms(lease);
            ok = pttl > 0;
        }
        if (ok) {
            long long v[3] = {LD_LOCK_HELD, pttl, max_of(c, LD_LOCK_HELD, 2)};
            deliver(c, answer_ints(&a, 3, v), LD_REDIS_ANSWERED);
            return;
        }
        fail(c, "the renewal took longer than the lease", write);
        return;
    }
    if (count_answered(c) < m) {
        fail(c, "no majority answered", write);
        return;
    }
    deliver_gone(c);
}

static void
decide_release(struct rl_call *c)
{
    struct rl_answer a;
    int m = quorum();
    int rel = count_code(c, LD_LOCK_RELEASED, 2);
    int kept = count_code(c, LD_LOCK_KEPT, 2);
    if (rel >= m) {
        long long v[2] = {LD_LOCK_RELEASED, 0};
        deliver(c, answer_ints(&a, 2, v), LD_REDIS_ANSWERED);
        return;
    }
    if (rel + kept >= m) {
        long long v[2] = {LD_LOCK_KEPT, max_of(c, LD_LOCK_KEPT, 1)};
        if (kept == 0) {
            v[0] = LD_LOCK_RELEASED;
            v[1] = 0;
        }
        deliver(c, answer_ints(&a, 2, v), LD_REDIS_ANSWERED);
        return;
    }
    if (count_answered(c) < m) {
        fail(c, "no majority answered", true);
        return;
    }
    deliver_gone(c);
}

/* lock.force_unlock: the lock is gone wherever an instance deleted it,
 * so one deletion is enough to say released; waiters hear it from the
 * instances that deleted it, as for an unlock. */
static void
decide_force(struct rl_call *c)
{
    struct rl_answer a;
    int rel = count_code(c, LD_LOCK_RELEASED, 2);
    if (rel > 0) {
        long long v[2] = {LD_LOCK_RELEASED, max_of(c, LD_LOCK_RELEASED, 1)};
        deliver(c, answer_ints(&a, 2, v), LD_REDIS_ANSWERED);
        return;
    }
    if (count_answered(c) < quorum()) {
        fail(c, "no majority answered", true);
        return;
    }
    deliver_gone(c);
}

static void
decide_info(struct rl_call *c)
{
    struct rl_answer a;
    int m = quorum();
    if (count_answered(c) < m) {
        fail(c, "no majority answered", false);
        return;
    }
    int held = count_code(c, LD_LOCK_HELD, 3);
    if (held == 0) {
        if (count_code(c, LD_LOCK_WRONG_TYPE, 1) > 0) {
            deliver_gone(c);
            return;
        }
        long long v[3] = {LD_LOCK_FREE, -2, 0};
        deliver(c, answer_ints(&a, 3, v), LD_REDIS_ANSWERED);
        return;
    }
    /* The caller's holds count only where a majority has them. */
    int mine = 0;
    long long count = 0;
    for (int i = 0; i < rl_mod.n; i++) {
        const struct rl_slot *s = &c->slot[i];
        if (s->n >= 3 && s->v[0] == LD_LOCK_HELD && s->v[2] > 0) {
            mine++;
            count = s->v[2] > count ? s->v[2] : count;
        }
    }
    long long v[3] = {LD_LOCK_HELD, max_of(c, LD_LOCK_HELD, 1),
                      mine >= m ? count : 0};
    deliver(c, answer_ints(&a, 3, v), LD_REDIS_ANSWERED);
}

static void
decide(struct rl_call *c)
{
    LD_ASSERT(c->left == 0);
    switch (c->id) {
    case LD_SCRIPT_lock_acquire:
        decide_acquire(c);
        break;
    case LD_SCRIPT_lock_release:
        decide_release(c);
        break;
    case LD_SCRIPT_lock_info:
        decide_info(c);
        break;
    case LD_SCRIPT_lock_force:
        decide_force(c);
        break;
    default: /* lock_renew, lock_extend */
        decide_renew(c);
        break;
    }
}

static void
slot_on_reply(redisReply *r, void *arg)
{
    struct rl_slot *s = arg;
    struct rl_call *c = s->c;
    enum ld_redis_outcome o = ld_redis_outcome();
    if (s->first) {
        /* The second call after UNKNOWN: a late grant of a failed
         * acquisition is given back now. Only an acquisition asks for
         * it (LD_REDIS_F_LATE). */
        LD_ASSERTF(s->late, "second answer of instance %d unasked", s->k);
        long long v[4];
        if (o == LD_REDIS_LATE && c->failed && read_reply(c, r, v, 4) >= 4 &&
            v[0] == LD_LOCK_GRANTED) {
            undo_one(c, s->k);
        }
        s->late = false;
        call_unref(c);
        return;
    }
    LD_ASSERT(c->left > 0);
    s->first = true;
    s->n = read_reply(c, r, s->v, 4);
    if (s->n < 1) {
        snprintf(s->why, sizeof(s->why), "%s",
                 r == NULL                      ? ld_redis_failure_reason()
                 : r->type == REDIS_REPLY_ERROR ? r->str
                                                : "unexpected reply");
    }
    s->may_run = r == NULL && o != LD_REDIS_NOT_SENT;
    s->late = o == LD_REDIS_UNKNOWN && c->id == LD_SCRIPT_lock_acquire;
    if (--c->left == 0) {
        decide(c);
    }
    if (!s->late) {
        call_unref(c);
    }
}

static char *
dup_arg(const char *s, size_t len, size_t *out)
{
    *out = len;
    return ld_xstrndup(s, len);
}

/* A call of SCRIPT, with what the decision needs of its arguments:
 * the hash, the holder field and the lease, where the script has them. */
static struct rl_call *
call_new(enum ld_script_id script, const char *chan, size_t chan_len,
         int nkeys, int argc, const char **argv, const size_t *argvlen)
{
    struct rl_call *c = ld_xcalloc(1, sizeof(*c) + (size_t)rl_mod.n *
                                                       sizeof(c->slot[0]));
    c->id = script;
    c->hash = dup_arg(argv[0], argvlen[0], &c->hash_len);
    c->chan = dup_arg(chan, chan_len, &c->chan_len);
    int fi = nkeys, li = -1;
    switch (script) {
    case LD_SCRIPT_lock_acquire:
        fi = nkeys + 1;
        li = nkeys;
        c->reenter = argc > nkeys + 2 && argvlen[nkeys + 2] == 1 &&
                     argv[nkeys + 2][0] == 'r';
        break;
    case LD_SCRIPT_lock_renew:
    case LD_SCRIPT_lock_extend:
        li = nkeys + 1;
        break;
    default:
        break;
    }
    c->field = dup_arg(fi < argc ? argv[fi] : "", fi < argc ? argvlen[fi] : 0,
                       &c->field_len);
    if (li >= 0 && li < argc) {
        char buf[24];
        size_t l = argvlen[li] < sizeof(buf) ? argvlen[li] : 0;
        memcpy(buf, argv[li], l);
        buf[l] = '\0';
        c->lease = strtoll(buf, NULL, 10);
    }
    return c;
}

/* The per-command timeout: min(redis.timeout_ms, lease / 10), so that an
 * instance that is down or slow never costs the lease. */
static unsigned
call_timeout_ms(const struct rl_call *c)
{
    long long t = rl_mod.ctx->cfg->redis.timeout_ms;
    if (c->lease > 0 && c->lease / 10 < t) {
        t = c->lease / 10 > 0 ? c->lease / 10 : 1;
    }
    return (unsigned)t;
}

void
ld_redlock_script(enum ld_script_id script, const char *route,
                  size_t route_len, const char *chan, size_t chan_len,
                  int nkeys, int argc, const char **argv,
                  const size_t *argvlen, ld_redis_cb *cb, void *arg)
{
    struct rl_call *c = call_new(script, chan, chan_len, nkeys, argc, argv,
                                 argvlen);
    c->cb = cb;
    c->arg = arg;
    struct ld_redis_opts o = {0};
    o.timeout_ms = call_timeout_ms(c);
    if (script == LD_SCRIPT_lock_acquire) {
        o.flags = LD_REDIS_F_LATE;
    }
    /* The release scripts' last argument is the unlock message: one of
     * its own for this release, the same on every instance. */
    const char *args[RL_MAX_ARGS];
    size_t lens[RL_MAX_ARGS];
    char buf[64];
    if ((script == LD_SCRIPT_lock_release || script == LD_SCRIPT_lock_force) &&
        argc <= RL_MAX_ARGS) {
        const char *msg = unlock_msg(buf, sizeof(buf), argv[argc - 1]);
        if (msg == buf) {
            memcpy(args, argv, sizeof(*argv) * (size_t)argc);
            memcpy(lens, argvlen, sizeof(*argvlen) * (size_t)argc);
            args[argc - 1] = msg;
            lens[argc - 1] = strlen(msg);
            argv = args;
            argvlen = lens;
        }
    }
    c->left = rl_mod.n;
    c->refs = rl_mod.n;
    c->sent_us = ld_now_us();
    for (int i = 0; i < rl_mod.n; i++) {
        c->slot[i].c = c;
        c->slot[i].k = i;
        o.instance = rl_mod.inst[i];
        ld_redis_script_ex(&o, script, route, route_len, nkeys, argc, argv,
                           argvlen, slot_on_reply, &c->slot[i]);
    }
}
