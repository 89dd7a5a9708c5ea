/* Locks: lock, unlock, extend, lock.info and the lock_lost event.
 *
 * Redis holds the truth: one hash per lock with the holder's token as field
 * and the hold count as value (Redisson's layout), a lease by PEXPIRE, and
 * beside it a fence counter without TTL in the same hash slot. Every change
 * is one Lua script, so a lock is never half taken or half released.
 *
 * The daemon remembers, per session, which (owner, key) holds which token
 * (struct lk_rec), so that reentry reuses the token, the watchdog knows
 * what to renew, and a closing session can release what it held. Every
 * command of a lock is routed by the lock's Redis key, so they reach Redis
 * in the order they were issued and their replies come back in that order:
 * a record's hold count is simply the count in the last reply.
 *
 * Waiting is in ld_lockwait.c. */

#include "ld_lock.h"

#include "ld_conf.h"
#include "ld_dict.h"
#include "ld_dispatch.h"
#include "ld_lockwait.h"
#include "ld_log.h"
#include "ld_proto.h"
#include "ld_redis.h"
#include "ld_server.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LK_UNLOCK_MSG "0"       /* Redisson's LockPubSub.UNLOCK_MESSAGE */

#define container_of(ptr, type, member)                                       \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

/* The Redis names of one lock. */
struct lk_names {
    char *buf;
    const char *hash, *fence, *chan;
    size_t hash_len, fence_len, chan_len;
};

struct lk_op;

/* A session's lock state (ld_session.lock_state). */
struct lk_sess {
    struct ld_session *sess;
    struct ld_dict *recs;          /* (owner, key) -> struct lk_rec */
    struct lk_op *waiting;         /* its queued lock requests */
    bool closing;
};

/* What this daemon knows of one (session, owner, key): the token, and the
 * hold count as of the last reply. A record is linked (findable by owner
 * and by token) while it holds the lock or an acquisition for it is on its
 * way, and freed once unlinked and no command refers to it any more. */
struct lk_rec {
    struct lk_sess *ls;            /* NULL once its session has closed */
    char *dkey;
    size_t dkey_len;
    char *key;                     /* the client's key, for events */
    size_t key_len;
    struct lk_names n;
    char token[LD_TOKEN_LEN + 1];
    long long count;               /* 0: not held */
    long long fence;
    bool linked;
    bool watchdog;                 /* renewed while the session lives */
    bool detached;
    bool capped;                   /* lock.max_hold_ms reached */
    bool renewing;                 /* a renewal or check is in flight */
    unsigned refs;                 /* commands in flight that name it */
    unsigned pending;              /* acquisitions in flight or queued */
    uint64_t acquired_us;
    uint64_t acquired_ms;
    uint64_t lease_end_ms;         /* Redis keeps the lock at least until */
    struct event *cap_ev;          /* lease end once capped */
    struct lk_rec *hprev, *hnext;  /* list of held records */
    bool in_held;
};

enum lk_kind {
    LK_ACQ,          /* lock by owner (may wait) */
    LK_ACQ_TOKEN,    /* lock by token: reentry only */
    LK_UNLOCK,
    LK_EXTEND,
    LK_INFO,
    LK_RENEW,        /* watchdog renewal */
    LK_CHECK,        /* is a fixed lease still there? */
    LK_RELEASE       /* release all holds: session end, loss, shutdown */
};

/* One request or internal command in flight. */
struct lk_op {
    enum lk_kind kind;
    struct ld_req *req;            /* NULL once answered or internal */
    struct lk_rec *rec;            /* referenced; NULL for foreign tokens */
    struct lk_names n;             /* own names when REC is NULL */
    char *field;                   /* holder field when REC is NULL */
    size_t field_len;
    char *key;                     /* the client's key, for messages */
    size_t key_len;
    long long lease_ms;            /* lease to set (0: keep) */
    long long wait_ms;
    bool watchdog;                 /* this acquisition asked for one */
    bool inflight;
    bool answered_early;           /* answered while its try was out */
    uint64_t sent_ms;
    long long grant_count, grant_fence; /* kept across the WAIT step */
    long long replicas_got;        /* WAIT's answer, -1 when none */
    struct ld_lockwait w;
    struct lk_sess *ls;            /* set while in ls->waiting */
    struct lk_op *wprev, *wnext;
    struct lk_op *prev, *next;     /* every op */
};

static struct {
    struct ld_dict *by_token;      /* token -> linked struct lk_rec */
    struct lk_rec *held;
    struct lk_op *ops;
    struct event *pass_ev;
    struct event *step_ev;         /* continues a pass on a later turn */
    struct lk_rec *cursor;         /* next record of the pass running */
    bool passing;
    long long renew_inflight;      /* renewals and checks sent, unanswered */
    bool stopping;
    bool freed;
} lk;

/* A pass over 100,000 locks must not monopolise the loop nor put 100,000
 * scripts in Redis ahead of client commands: it goes in steps of at most
 * PASS_STEP records, with at most RENEW_INFLIGHT_MAX renewals out at a
 * time; replies bring the next step. */
#define PASS_STEP 500
#define RENEW_INFLIGHT_MAX 1000

static void rec_release_all(struct lk_rec *rec);

static struct timeval tv_ms(long long ms)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    return tv;
}

/* ---------------------------------------------------------------- names */

static char *put(char *p, const void *s, size_t len)
{
    memcpy(p, s, len);
    return p + len;
}

/* Redisson's prefixName: a name that carries a hash tag keeps it. */
static size_t redisson_name(char *out, const char *prefix, const char *key,
                            size_t len)
{
    char *p = out;
    p = put(p, prefix, strlen(prefix));
    if (memchr(key, '{', len) != NULL) {
        p = put(p, ":", 1);
        p = put(p, key, len);
    } else {
        p = put(p, ":{", 2);
        p = put(p, key, len);
        p = put(p, "}", 1);
    }
    *p = '\0';
    return (size_t)(p - out);
}

static void names_build(struct lk_names *n, const char *key, size_t len)
{
    const struct ld_config *cfg = ld_srv.cfg;
    if (cfg->lock.layout == LD_LAYOUT_REDISSON) {
        static const char chan_pfx[] = "redisson_lock__channel";
        static const char fence_pfx[] = "redisson_lock_token";
        size_t cap = (len + 1) + (sizeof(chan_pfx) + len + 4)
                     + (sizeof(fence_pfx) + len + 4);
        char *p = n->buf = malloc(cap);
        n->hash = p;
        n->hash_len = len;
        p = put(p, key, len);
        *p++ = '\0';
        n->chan = p;
        n->chan_len = redisson_name(p, chan_pfx, key, len);
        p += n->chan_len + 1;
        n->fence = p;
        n->fence_len = redisson_name(p, fence_pfx, key, len);
        return;
    }
    const char *pfx = cfg->lock.prefix;
    size_t plen = strlen(pfx);
    size_t hlen = plen + len + 2;
    size_t cap = (hlen + 1) + (hlen + 7) + (hlen + 8);
    char *p = n->buf = malloc(cap);
    n->hash = p;
    n->hash_len = hlen;
    p = put(p, pfx, plen);
    p = put(p, "{", 1);
    p = put(p, key, len);
    p = put(p, "}", 1);
    *p++ = '\0';
    n->fence = p;
    n->fence_len = hlen + 6;
    p = put(p, n->hash, hlen);
    p = put(p, ":fence", 6);
    *p++ = '\0';
    n->chan = p;
    n->chan_len = hlen + 7;
    p = put(p, n->hash, hlen);
    p = put(p, ":unlock", 7);
    *p = '\0';
}

static bool names_same(const struct lk_names *a, const struct lk_names *b)
{
    return a->hash_len == b->hash_len
           && memcmp(a->hash, b->hash, a->hash_len) == 0;
}

/* ------------------------------------------------------- Redis helpers */

/* Read a script's integer array into V; returns the count, or -1 when the
 * reply is anything else. */
static int reply_ints(const redisReply *r, long long *v, int max)
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1) {
        return -1;
    }
    int n = 0;
    for (size_t i = 0; i < r->elements && n < max; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER) {
            return -1;
        }
        v[n++] = r->element[i]->integer;
    }
    return n;
}

/* Answer REQ for a command that got no usable reply. */
static void reply_redis_failure(struct ld_req *req, const redisReply *r)
{
    static const char *const unavailable[] = {
        "LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN",
        "TRYAGAIN", "NOREPLICAS", "OOM", "NOAUTH", "MOVED", "ASK",
    };
    if (r == NULL) {
        ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                       "redis did not answer within redis.timeout_ms");
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        for (size_t i = 0; i < LD_ARRAY_LEN(unavailable); i++) {
            if (ld_reply_is_error(r, unavailable[i])) {
                ld_reply_error(req, LD_E_REDIS_UNAVAILABLE, "redis: %.*s",
                               (int)r->len, r->str);
                return;
            }
        }
        ld_reply_error(req, LD_E_INTERNAL, "redis: %.*s", (int)r->len,
                       r->str);
        return;
    }
    ld_reply_error(req, LD_E_INTERNAL, "unexpected reply from a lock script");
}

static void reply_not_held(struct ld_req *req, const char *key, size_t klen,
                           bool other)
{
    ld_reply_error_extra(req, LD_E_NOT_HELD,
                         json_pack("{s:s}", "reason",
                                   other ? "other" : "absent"),
                         other ? "lock '%.*s' is held by someone else"
                               : "lock '%.*s' is not held",
                         (int)klen, key);
}

static void reply_wrong_type(struct ld_req *req, const char *key,
                             size_t klen)
{
    ld_reply_error(req, LD_E_WRONG_TYPE,
                   "the redis key of lock '%.*s' holds data that is not a "
                   "lock", (int)klen, key);
}

static void script(enum ld_script_id id, const struct lk_names *n, int nkeys,
                   int nargs, const char **args, size_t *lens,
                   ld_redis_cb *cb, void *arg)
{
    ld_redis_script(id, n->hash, n->hash_len, nkeys, nargs, args, lens, cb,
                    arg);
}

/* ------------------------------------------------------------- records */

static void held_link(struct lk_rec *rec)
{
    if (rec->in_held) {
        return;
    }
    rec->hprev = NULL;
    rec->hnext = lk.held;
    if (lk.held != NULL) {
        lk.held->hprev = rec;
    }
    lk.held = rec;
    rec->in_held = true;
}

static void held_unlink(struct lk_rec *rec)
{
    if (!rec->in_held) {
        return;
    }
    if (lk.cursor == rec) {
        lk.cursor = rec->hnext;
    }
    if (rec->hprev != NULL) {
        rec->hprev->hnext = rec->hnext;
    } else {
        lk.held = rec->hnext;
    }
    if (rec->hnext != NULL) {
        rec->hnext->hprev = rec->hprev;
    }
    rec->hprev = rec->hnext = NULL;
    rec->in_held = false;
}

static char *dkey_build(const char *owner, size_t olen, const char *key,
                        size_t klen, size_t *out_len)
{
    /* Owner length first, so that no (owner, key) pair can collide with
     * another whatever bytes they contain. */
    uint32_t ol = (uint32_t)olen;
    size_t len = sizeof(ol) + olen + klen;
    char *d = malloc(len);
    char *p = put(d, &ol, sizeof(ol));
    p = put(p, owner, olen);
    put(p, key, klen);
    *out_len = len;
    return d;
}

static void rec_free(struct lk_rec *rec)
{
    held_unlink(rec);
    if (rec->cap_ev != NULL) {
        event_free(rec->cap_ev);
    }
    free(rec->n.buf);
    free(rec->dkey);
    free(rec->key);
    free(rec);
}

static void rec_unlink(struct lk_rec *rec)
{
    if (!rec->linked) {
        return;
    }
    if (rec->ls != NULL) {
        ld_dict_del(rec->ls->recs, rec->dkey, rec->dkey_len);
    }
    ld_dict_del(lk.by_token, rec->token, LD_TOKEN_LEN);
    rec->linked = false;
}

static void rec_settle(struct lk_rec *rec)
{
    if (rec->linked && rec->count == 0 && rec->pending == 0) {
        rec_unlink(rec);
    }
    if (!rec->linked && rec->refs == 0) {
        rec_free(rec);
    }
}

static void rec_unref(struct lk_rec *rec)
{
    rec->refs--;
    rec_settle(rec);
}

/* Move the hold count to N and keep the gauges, the list of held records
 * and the hold-time histogram in step. */
static void rec_set_count(struct lk_rec *rec, long long n)
{
    long long was = rec->count;
    rec->count = n;
    if (was == 0 && n > 0) {
        ld_stats.locks_held++;
        rec->acquired_us = ld_now_us();
        rec->acquired_ms = ld_now_ms();
        rec->capped = false;
        held_link(rec);
    } else if (was > 0 && n == 0) {
        ld_stats.locks_held--;
        ld_stats_observe(LD_HISTO_LOCK_HOLD, ld_now_us() - rec->acquired_us);
        held_unlink(rec);
        if (rec->cap_ev != NULL) {
            evtimer_del(rec->cap_ev);
        }
        rec->capped = false;
    }
}

static struct lk_rec *rec_new(struct lk_sess *ls, char *dkey, size_t dlen,
                              const char *key, size_t klen, bool detached)
{
    struct lk_rec *rec = calloc(1, sizeof(*rec));
    if (ld_token_new(rec->token) != LD_OK) {
        free(rec);
        return NULL;
    }
    rec->ls = ls;
    rec->dkey = dkey;
    rec->dkey_len = dlen;
    rec->key = malloc(klen + 1);
    memcpy(rec->key, key, klen);
    rec->key[klen] = '\0';
    rec->key_len = klen;
    rec->detached = detached;
    names_build(&rec->n, key, klen);
    rec->linked = true;
    ld_dict_set(ls->recs, dkey, dlen, rec);
    ld_dict_set(lk.by_token, rec->token, LD_TOKEN_LEN, rec);
    return rec;
}

/* The record that holds TOKEN for KEY's lock in this daemon, if any. */
static struct lk_rec *rec_by_token(const char *tok, size_t len,
                                   const struct lk_names *n)
{
    if (len != LD_TOKEN_LEN) {
        return NULL;
    }
    struct lk_rec *rec = ld_dict_get(lk.by_token, tok, len);
    if (rec == NULL || !names_same(&rec->n, n)) {
        return NULL;
    }
    return rec;
}

/* The lock is no longer this session's: tell it, and forget the hold.
 * RELEASE also deletes it in Redis (when the daemon itself gives it up,
 * so that waiters everywhere proceed at once). */
static void rec_lost(struct lk_rec *rec, const char *reason, bool release)
{
    if (rec->ls != NULL) {
        json_t *ev = json_pack("{s:s,s:s%,s:s,s:s}", "event", "lock_lost",
                               "key", rec->key, rec->key_len, "token",
                               rec->token, "reason", reason);
        ld_session_event(rec->ls->sess, ev);
    }
    ld_stats.lock_lost++;
    log_info("lock lost reason=%s session=%s", reason,
             rec->ls != NULL ? rec->ls->sess->name : "-");
    if (release) {
        rec_release_all(rec);
    }
    rec_set_count(rec, 0);
}

static void cap_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct lk_rec *rec = arg;
    if (rec->count == 0) {
        return;
    }
    rec->refs++;
    rec_lost(rec, "max_hold", true);
    rec_unref(rec);
}

/* Renewal has stopped for good: report the loss when the lease runs out. */
static void rec_arm_cap(struct lk_rec *rec)
{
    if (rec->cap_ev == NULL) {
        rec->cap_ev = evtimer_new(ld_srv.base, cap_on_timer, rec);
    }
    uint64_t now = ld_now_ms();
    uint64_t ms = rec->lease_end_ms > now ? rec->lease_end_ms - now : 0;
    struct timeval tv = tv_ms((long long)ms);
    evtimer_add(rec->cap_ev, &tv);
}

/* ----------------------------------------------------------------- ops */

static struct lk_op *op_new(enum lk_kind kind, struct ld_req *req,
                            struct lk_rec *rec)
{
    struct lk_op *op = calloc(1, sizeof(*op));
    op->kind = kind;
    op->req = req;
    op->rec = rec;
    if (rec != NULL) {
        rec->refs++;
    }
    op->next = lk.ops;
    if (lk.ops != NULL) {
        lk.ops->prev = op;
    }
    lk.ops = op;
    return op;
}

static void op_wait_unlink(struct lk_op *op)
{
    struct lk_sess *ls = op->ls;
    if (ls == NULL) {
        return;
    }
    if (op->wprev != NULL) {
        op->wprev->wnext = op->wnext;
    } else {
        ls->waiting = op->wnext;
    }
    if (op->wnext != NULL) {
        op->wnext->wprev = op->wprev;
    }
    op->wprev = op->wnext = NULL;
    op->ls = NULL;
}

static void op_free(struct lk_op *op)
{
    op_wait_unlink(op);
    if (op->prev != NULL) {
        op->prev->next = op->next;
    } else {
        lk.ops = op->next;
    }
    if (op->next != NULL) {
        op->next->prev = op->prev;
    }
    if (op->rec != NULL) {
        if (op->kind == LK_ACQ) {
            op->rec->pending--;
        }
        rec_unref(op->rec);
    }
    free(op->n.buf);
    free(op->field);
    free(op->key);
    free(op);
}

static const struct lk_names *op_names(const struct lk_op *op)
{
    return op->rec != NULL ? &op->rec->n : &op->n;
}

static const char *op_field(const struct lk_op *op, size_t *len)
{
    if (op->field != NULL) {
        *len = op->field_len;
        return op->field;
    }
    if (op->rec != NULL) {
        *len = LD_TOKEN_LEN;
        return op->rec->token;
    }
    *len = 0;
    return "";
}

static const char *op_key(const struct lk_op *op, size_t *len)
{
    if (op->key != NULL) {
        *len = op->key_len;
        return op->key;
    }
    *len = op->rec->key_len;
    return op->rec->key;
}

static void op_wait_add(struct lk_op *op, struct lk_sess *ls)
{
    op->ls = ls;
    op->wprev = NULL;
    op->wnext = ls->waiting;
    if (op->wnext != NULL) {
        op->wnext->wprev = op;
    }
    ls->waiting = op;
}

/* --------------------------------------------------------- release all */

static void release_all_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    long long v[2] = { 0, 0 };
    if (!lk.freed && reply_ints(r, v, 2) >= 1 && v[0] == 1) {
        ld_stats.lock_released++;
    }
    op_free(op);
}

/* Delete the lock if REC's token holds it, whatever its count, and publish
 * the wake-up. The caller updates REC's count. */
static void rec_release_all(struct lk_rec *rec)
{
    if (lk.freed) {
        return;
    }
    struct lk_op *op = op_new(LK_RELEASE, NULL, rec);
    const char *args[] = { rec->n.hash, rec->token, "a", rec->n.chan,
                           LK_UNLOCK_MSG };
    size_t lens[] = { rec->n.hash_len, LD_TOKEN_LEN, 1, rec->n.chan_len,
                      strlen(LK_UNLOCK_MSG) };
    op->inflight = true;
    script(LD_SCRIPT_lock_release, &rec->n, 1, 5, args, lens,
           release_all_on_reply, op);
}

/* ------------------------------------------------------------- acquire */

static void acq_send(struct lk_op *op);

static void acq_reply_granted(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    if (op->wait_ms != 0) {
        ld_stats_observe(LD_HISTO_LOCK_WAIT,
                         ld_now_us() - op->req->start_us);
    }
    json_t *body = json_pack("{s:b,s:s,s:I,s:I,s:I}", "acquired", 1,
                             "token", rec->token, "count",
                             (json_int_t)op->grant_count, "fence",
                             (json_int_t)op->grant_fence, "lease_ms",
                             (json_int_t)op->lease_ms);
    ld_reply_ok(op->req, body);
    op->req = NULL;
}

static void acq_reply_false(struct lk_op *op, long long ttl)
{
    if (op->req == NULL) {
        return;
    }
    ld_reply_ok(op->req, json_pack("{s:b,s:I}", "acquired", 0, "ttl_ms",
                                   (json_int_t)ttl));
    op->req = NULL;
}

static void undo_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    long long v[2] = { 0, 0 };
    int n = reply_ints(r, v, 2);
    op->inflight = false;
    if (!lk.freed && op->req != NULL) {
        int need = ld_srv.cfg->lock.wait_replicas;
        if (op->replicas_got < 0) {
            ld_reply_error(op->req, LD_E_REDIS_UNAVAILABLE,
                           "WAIT for %d replicas got no answer", need);
        } else {
            ld_reply_error(op->req, LD_E_REDIS_UNAVAILABLE,
                           "only %lld of %d replicas confirmed the lock",
                           op->replicas_got, need);
        }
        op->req = NULL;
    }
    if (!lk.freed && rec->linked && n >= 1) {
        if (v[0] == 1) {
            ld_stats.lock_released++;
            rec_set_count(rec, 0);
        } else if (v[0] == 0 && n == 2) {
            rec_set_count(rec, v[1]);
        } else {
            rec_set_count(rec, 0);
        }
    }
    op_free(op);
}

static void acq_on_wait(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    op->inflight = false;
    if (lk.freed) {
        op_free(op);
        return;
    }
    int need = ld_srv.cfg->lock.wait_replicas;
    long long got = (r != NULL && r->type == REDIS_REPLY_INTEGER)
                        ? r->integer : -1;
    if (got >= need) {
        acq_reply_granted(op);
        op_free(op);
        return;
    }
    /* Not enough replicas have the lock: a failover now could hand it to
     * someone else, so give this hold back, then say so (the answer then
     * means what redis_unavailable means: nothing changed). */
    struct lk_rec *rec = op->rec;
    op->replicas_got = got;
    const char *args[] = { rec->n.hash, rec->token, "1", rec->n.chan,
                           LK_UNLOCK_MSG };
    size_t lens[] = { rec->n.hash_len, LD_TOKEN_LEN, 1, rec->n.chan_len,
                      strlen(LK_UNLOCK_MSG) };
    op->inflight = true;
    script(LD_SCRIPT_lock_release, &rec->n, 1, 5, args, lens, undo_on_reply,
           op);
}

/* The acquisition was granted with hold count N. Returns true when OP was
 * kept for the WAIT step (the caller must not free it). */
static bool acq_granted(struct lk_op *op, long long n, long long fence,
                        long long pttl)
{
    struct lk_rec *rec = op->rec;
    if (n == 1 && rec->count > 0) {
        /* A fresh acquisition although we believed it held: the old hold
         * had ended (expired, or released by token elsewhere). */
        rec_set_count(rec, 0);
    }
    bool fresh = rec->count == 0;
    rec_set_count(rec, n);
    if (fresh || rec->fence <= 0) {
        rec->fence = fence;
    }
    rec->watchdog = fresh ? op->watchdog : (rec->watchdog || op->watchdog);
    rec->lease_end_ms = op->sent_ms
                        + (uint64_t)(pttl >= 0 ? pttl : op->lease_ms);
    if (rec->capped) {
        rec_arm_cap(rec);
    }
    ld_stats.lock_acquired++;
    op->grant_count = n;
    op->grant_fence = rec->fence;
    if (!rec->detached && (rec->ls == NULL || lk.stopping)) {
        /* Its session ended (or the daemon is stopping) while the request
         * was on its way: a session-bound lock must not outlive it. A
         * client that only half-closed still reads this answer, which
         * says what happened: granted, then released with its session,
         * like every other lock the session held. A detached lock does
         * not depend on its session and is answered as usual. */
        rec_release_all(rec);
        rec_set_count(rec, 0);
        if (op->req != NULL) {
            if (lk.stopping) {
                ld_reply_error(op->req, LD_E_SHUTTING_DOWN,
                               "the daemon is stopping");
                op->req = NULL;
            } else {
                acq_reply_granted(op);
            }
        }
        return false;
    }
    if (op->req == NULL) {
        return false;
    }
    int replicas = ld_srv.cfg->lock.wait_replicas;
    if (replicas > 0) {
        char nbuf[16], tbuf[24];
        /* Half the command timeout, so the answer arrives before the
         * daemon's own timeout gives up on the connection. */
        long long t = ld_srv.cfg->redis.timeout_ms / 2;
        snprintf(nbuf, sizeof(nbuf), "%d", replicas);
        snprintf(tbuf, sizeof(tbuf), "%lld", t > 0 ? t : 1);
        const char *argv[] = { "WAIT", nbuf, tbuf };
        size_t lens[] = { 4, strlen(nbuf), strlen(tbuf) };
        op->inflight = true;
        ld_redis_command(rec->n.hash, rec->n.hash_len, 3, argv, lens,
                         acq_on_wait, op);
        return true;
    }
    acq_reply_granted(op);
    return false;
}

static void acq_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    op->inflight = false;
    if (lk.freed) {
        op_free(op);
        return;
    }
    struct lk_rec *rec = op->rec;
    long long v[4] = { 0, 0, 0, 0 };
    int n = reply_ints(r, v, 4);
    bool queued = op->w.q != NULL;

    if (n >= 4 && v[0] == 1) {
        bool kept = acq_granted(op, v[1], v[2], v[3]);
        op_wait_unlink(op);
        if (queued) {
            ld_lockwait_done(&op->w, LD_LOCKWAIT_GRANTED, 0);
        }
        if (!kept) {
            op_free(op);
        }
        return;
    }
    if (n >= 2 && v[0] == 0) {
        long long pttl = v[1];
        ld_stats.lock_contended++;
        if (op->req == NULL) {
            /* Answered already (its session closed, or it timed out). */
            op_free(op);
            return;
        }
        if (queued) {
            /* May answer and free OP through acq_expire. */
            ld_lockwait_done(&op->w, LD_LOCKWAIT_TAKEN, pttl);
            return;
        }
        long long left = -1;
        if (op->wait_ms > 0) {
            long long waited = (long long)((ld_now_us() - op->req->start_us)
                                           / 1000);
            left = op->wait_ms - waited;
        }
        if (op->wait_ms == 0 || (op->wait_ms > 0 && left <= 0)
            || rec->ls == NULL || lk.stopping) {
            acq_reply_false(op, pttl);
            op_free(op);
            return;
        }
        /* A reentry that found its hold gone: it waits like any other. */
        if (ld_stats.lock_waiters >= ld_srv.cfg->limits.max_waiters) {
            ld_reply_error(op->req, LD_E_BUSY,
                           "too many lock waiters (limits.max_waiters)");
            op->req = NULL;
            op_free(op);
            return;
        }
        op_wait_add(op, rec->ls);
        ld_lockwait_join(&op->w, rec->n.hash, rec->n.hash_len, rec->n.chan,
                         rec->n.chan_len, left, true, pttl);
        return;
    }

    /* Wrong type, Redis unreachable or an error reply. */
    if (r == NULL && rec->count == 0 && rec->pending == 1 && !lk.stopping) {
        /* The script may have run although its answer was lost: then the
         * lock is held under a token nobody will ever use, for a whole
         * lease. Nothing else can hold this token, so giving it back is
         * safe, and it makes redis_unavailable mean "nothing changed"
         * whenever Redis answers the release. */
        rec_release_all(rec);
    }
    if (op->req != NULL) {
        if (n >= 1 && v[0] == -1) {
            reply_wrong_type(op->req, rec->key, rec->key_len);
        } else {
            reply_redis_failure(op->req, r);
        }
        op->req = NULL;
    }
    op_wait_unlink(op);
    if (queued) {
        ld_lockwait_done(&op->w, LD_LOCKWAIT_FAILED, 0);
    }
    op_free(op);
}

static void acq_send(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", op->lease_ms);
    const char *args[] = { rec->n.hash, rec->n.fence, lbuf, rec->token, "0" };
    size_t lens[] = { rec->n.hash_len, rec->n.fence_len, strlen(lbuf),
                      LD_TOKEN_LEN, 1 };
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    script(LD_SCRIPT_lock_acquire, &rec->n, 2, 5, args, lens, acq_on_reply,
           op);
}

/* ld_lockwait calls these for queued requests. */
static void acq_try(struct ld_lockwait *w)
{
    /* While stopping, every waiter is being answered and dropped; an
     * attempt now would only take a lock to give back. */
    struct lk_op *op = container_of(w, struct lk_op, w);
    if (lk.stopping || lk.freed || (op->ls != NULL && op->ls->closing)) {
        return;
    }
    acq_send(op);
}

static void acq_expire(struct ld_lockwait *w, long long ttl_ms)
{
    struct lk_op *op = container_of(w, struct lk_op, w);
    acq_reply_false(op, ttl_ms);
    if (!op->inflight) {
        op_free(op);
    } else {
        op_wait_unlink(op);
    }
}

/* lock with "token": reenter a lock held under that token, from any
 * session. Never waits and never takes a free lock. */
static void acq_token_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    if (lk.freed) {
        op_free(op);
        return;
    }
    long long v[4] = { 0, 0, 0, 0 };
    int n = reply_ints(r, v, 4);
    size_t klen;
    const char *key = op_key(op, &klen);
    if (n >= 4 && v[0] == 1) {
        struct lk_rec *rec = op->rec;
        long long fence = v[2];
        if (rec != NULL && rec->linked) {
            rec_set_count(rec, v[1]);
            if (v[3] >= 0) {
                rec->lease_end_ms = op->sent_ms + (uint64_t)v[3];
            }
            if (rec->capped) {
                rec_arm_cap(rec);
            }
            if (rec->fence > 0) {
                fence = rec->fence;
            }
        }
        ld_stats.lock_acquired++;
        json_t *body = json_pack("{s:b,s:s%,s:I,s:I,s:I}", "acquired", 1,
                                 "token", op->field, op->field_len, "count",
                                 (json_int_t)v[1], "fence",
                                 (json_int_t)fence, "lease_ms",
                                 (json_int_t)(op->lease_ms > 0 ? op->lease_ms
                                                               : v[3]));
        ld_reply_ok(op->req, body);
    } else if (n >= 1 && (v[0] == -2 || v[0] == -3)) {
        reply_not_held(op->req, key, klen, v[0] == -3);
    } else if (n >= 1 && v[0] == -1) {
        reply_wrong_type(op->req, key, klen);
    } else {
        reply_redis_failure(op->req, r);
    }
    op->req = NULL;
    op_free(op);
}

/* Fields shared by unlock, extend and lock.info: the lock, and whose. */
struct lk_target {
    const char *key;
    size_t key_len;
    const char *owner;
    size_t owner_len;
    const char *token;
    size_t token_len;
    bool has_token;
};

static int parse_target(struct ld_req *req, struct lk_target *t)
{
    memset(t, 0, sizeof(*t));
    t->owner = "";
    t->token = "";
    bool has_owner = false;
    if (ld_req_key(req, "key", &t->key, &t->key_len) != LD_OK
        || ld_req_str(req, "owner", false, &t->owner, &t->owner_len,
                      &has_owner) != LD_OK
        || ld_req_str(req, "token", false, &t->token, &t->token_len,
                      &t->has_token) != LD_OK) {
        return LD_ERR;
    }
    if (t->has_token && t->token_len == 0) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'token' must not be empty");
        return LD_ERR;
    }
    return LD_OK;
}

static struct lk_sess *sess_get(struct ld_session *s, bool create)
{
    struct lk_sess *ls = s->lock_state;
    if (ls == NULL && create) {
        ls = calloc(1, sizeof(*ls));
        ls->sess = s;
        ls->recs = ld_dict_new();
        s->lock_state = ls;
    }
    return ls;
}

/* The op for a request that names a lock by owner or token: REC is the
 * record it concerns in this daemon (if any), FIELD the holder field. */
static struct lk_op *target_op(enum lk_kind kind, struct ld_req *req,
                               const struct lk_target *t)
{
    struct lk_names n;
    names_build(&n, t->key, t->key_len);
    struct lk_rec *rec = NULL;
    if (t->has_token) {
        rec = rec_by_token(t->token, t->token_len, &n);
    } else {
        struct lk_sess *ls = sess_get(req->sess, false);
        if (ls != NULL) {
            size_t dlen;
            char *d = dkey_build(t->owner, t->owner_len, t->key, t->key_len,
                                 &dlen);
            rec = ld_dict_get(ls->recs, d, dlen);
            free(d);
        }
    }
    struct lk_op *op = op_new(kind, req, rec);
    if (rec != NULL) {
        free(n.buf);
    } else {
        op->n = n;
    }
    op->key = malloc(t->key_len + 1);
    memcpy(op->key, t->key, t->key_len);
    op->key[t->key_len] = '\0';
    op->key_len = t->key_len;
    if (t->has_token) {
        op->field = malloc(t->token_len + 1);
        memcpy(op->field, t->token, t->token_len);
        op->field[t->token_len] = '\0';
        op->field_len = t->token_len;
    }
    return op;
}

static void op_lock(struct ld_req *req)
{
    const char *key, *owner = "", *token = "";
    size_t klen, olen = 0, tlen = 0;
    long long ttl = 0, wait = 0;
    bool has_owner = false, has_ttl = false, has_wait = false;
    bool has_token = false, detach = false;
    if (ld_req_key(req, "key", &key, &klen) != LD_OK
        || ld_req_str(req, "owner", false, &owner, &olen, &has_owner) != LD_OK
        || ld_req_int(req, "ttl_ms", false, 1, LD_TTL_MS_MAX, &ttl,
                      &has_ttl)
               != LD_OK
        || ld_req_int(req, "wait_ms", false, -1, LD_WAIT_MS_MAX, &wait,
                      &has_wait)
               != LD_OK
        || ld_req_bool(req, "detach", &detach) != LD_OK
        || ld_req_str(req, "token", false, &token, &tlen, &has_token)
               != LD_OK) {
        return;
    }
    if (has_token && tlen == 0) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'token' must not be empty");
        return;
    }
    if (lk.stopping) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        return;
    }
    if (detach && !has_ttl) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'ttl_ms' is required with detach (a "
                       "detached lock is never renewed)");
        return;
    }

    if (has_token) {
        struct lk_target t = { key, klen, owner, olen, token, tlen, true };
        struct lk_op *op = target_op(LK_ACQ_TOKEN, req, &t);
        op->lease_ms = has_ttl ? ttl : 0;
        const struct lk_names *n = op_names(op);
        char lbuf[24];
        snprintf(lbuf, sizeof(lbuf), "%lld", op->lease_ms);
        const char *args[] = { n->hash, n->fence, lbuf, op->field, "1" };
        size_t lens[] = { n->hash_len, n->fence_len, strlen(lbuf),
                          op->field_len, 1 };
        op->sent_ms = ld_now_ms();
        op->inflight = true;
        script(LD_SCRIPT_lock_acquire, n, 2, 5, args, lens,
               acq_token_on_reply, op);
        return;
    }

    struct lk_sess *ls = sess_get(req->sess, true);
    size_t dlen;
    char *d = dkey_build(owner, olen, key, klen, &dlen);
    struct lk_rec *rec = ld_dict_get(ls->recs, d, dlen);
    if (rec != NULL) {
        free(d);
        if (rec->detached != detach) {
            ld_reply_error(req, LD_E_BAD_REQUEST,
                           "field 'detach' does not match: this owner "
                           "holds lock '%.*s' %s",
                           (int)klen, key,
                           rec->detached ? "detached" : "session-bound");
            return;
        }
    } else {
        rec = rec_new(ls, d, dlen, key, klen, detach);
        if (rec == NULL) {
            free(d);
            ld_reply_error(req, LD_E_INTERNAL, "no random bytes for a token");
            return;
        }
    }
    struct lk_op *op = op_new(LK_ACQ, req, rec);
    rec->pending++;
    op->watchdog = !has_ttl;
    op->lease_ms = has_ttl ? ttl : ld_srv.cfg->lock.watchdog_ms;
    op->wait_ms = wait;

    /* A reentry never waits, and a try-once goes straight to Redis even
     * when others wait here. */
    if (rec->count > 0 || wait == 0) {
        acq_send(op);
        return;
    }
    if (ld_stats.lock_waiters >= ld_srv.cfg->limits.max_waiters) {
        ld_reply_error(req, LD_E_BUSY,
                       "too many lock waiters (limits.max_waiters)");
        op->req = NULL;
        op_free(op);
        return;
    }
    long long left = -1;
    if (wait > 0) {
        left = wait - (long long)((ld_now_us() - req->start_us) / 1000);
        if (left < 0) {
            left = 0;
        }
    }
    op_wait_add(op, ls);
    ld_lockwait_join(&op->w, rec->n.hash, rec->n.hash_len, rec->n.chan,
                     rec->n.chan_len, left, false, 0);
}

/* -------------------------------------------------------------- unlock */

/* A not_held or stale answer about a record we thought held: Redis is
 * right, the hold is gone. */
static void rec_forget_stale(struct lk_rec *rec)
{
    if (rec != NULL && rec->linked && rec->count > 0) {
        rec_set_count(rec, 0);
    }
}

static void unlock_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    if (lk.freed) {
        op_free(op);
        return;
    }
    struct lk_rec *rec = op->rec;
    if (rec != NULL && !rec->linked) {
        rec = NULL;
    }
    long long v[2] = { 0, 0 };
    int n = reply_ints(r, v, 2);
    size_t klen;
    const char *key = op_key(op, &klen);
    if (n >= 2 && (v[0] == 1 || v[0] == 0)) {
        if (v[0] == 1) {
            ld_stats.lock_released++;
        }
        if (rec != NULL) {
            rec_set_count(rec, v[1]);
        }
        ld_reply_ok(op->req, json_pack("{s:b,s:I}", "released", v[0] == 1,
                                       "count", (json_int_t)v[1]));
    } else if (n >= 1 && (v[0] == -2 || v[0] == -3)) {
        rec_forget_stale(rec);
        reply_not_held(op->req, key, klen, v[0] == -3);
    } else if (n >= 1 && v[0] == -1) {
        rec_forget_stale(rec);
        reply_wrong_type(op->req, key, klen);
    } else {
        reply_redis_failure(op->req, r);
    }
    op->req = NULL;
    op_free(op);
}

static void op_unlock(struct ld_req *req)
{
    struct lk_target t;
    if (parse_target(req, &t) != LD_OK) {
        return;
    }
    struct lk_op *op = target_op(LK_UNLOCK, req, &t);
    const struct lk_names *n = op_names(op);
    size_t flen;
    const char *field = op_field(op, &flen);
    const char *args[] = { n->hash, field, "1", n->chan, LK_UNLOCK_MSG };
    size_t lens[] = { n->hash_len, flen, 1, n->chan_len,
                      strlen(LK_UNLOCK_MSG) };
    op->inflight = true;
    script(LD_SCRIPT_lock_release, n, 1, 5, args, lens, unlock_on_reply, op);
}

/* -------------------------------------------------------------- extend */

static void extend_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    if (lk.freed) {
        op_free(op);
        return;
    }
    struct lk_rec *rec = op->rec;
    if (rec != NULL && !rec->linked) {
        rec = NULL;
    }
    long long v[3] = { 0, 0, 0 };
    int n = reply_ints(r, v, 3);
    size_t klen;
    const char *key = op_key(op, &klen);
    if (n >= 3 && v[0] == 1) {
        if (rec != NULL) {
            rec_set_count(rec, v[2]);
            if (v[1] >= 0) {
                rec->lease_end_ms = op->sent_ms + (uint64_t)v[1];
            }
            if (rec->capped) {
                rec_arm_cap(rec);
            }
        }
        ld_reply_ok(op->req, json_pack("{s:I}", "lease_ms",
                                       (json_int_t)op->lease_ms));
    } else if (n >= 1 && (v[0] == -2 || v[0] == -3)) {
        rec_forget_stale(rec);
        reply_not_held(op->req, key, klen, v[0] == -3);
    } else if (n >= 1 && v[0] == -1) {
        rec_forget_stale(rec);
        reply_wrong_type(op->req, key, klen);
    } else {
        reply_redis_failure(op->req, r);
    }
    op->req = NULL;
    op_free(op);
}

static void op_extend(struct ld_req *req)
{
    struct lk_target t;
    long long ttl = 0;
    bool has_ttl = false;
    if (parse_target(req, &t) != LD_OK
        || ld_req_int(req, "ttl_ms", true, 1, LD_TTL_MS_MAX, &ttl,
                      &has_ttl)
               != LD_OK) {
        return;
    }
    struct lk_op *op = target_op(LK_EXTEND, req, &t);
    op->lease_ms = ttl;
    const struct lk_names *n = op_names(op);
    size_t flen;
    const char *field = op_field(op, &flen);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", ttl);
    const char *args[] = { n->hash, field, lbuf, "0" };
    size_t lens[] = { n->hash_len, flen, strlen(lbuf), 1 };
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    script(LD_SCRIPT_lock_renew, n, 1, 4, args, lens, extend_on_reply, op);
}

/* ----------------------------------------------------------- lock.info */

static void info_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    if (lk.freed) {
        op_free(op);
        return;
    }
    long long v[3] = { 0, 0, 0 };
    int n = reply_ints(r, v, 3);
    size_t klen;
    const char *key = op_key(op, &klen);
    if (n >= 3 && (v[0] == 0 || v[0] == 1)) {
        json_t *body = json_pack("{s:b,s:I,s:b}", "locked", v[0] == 1,
                                 "ttl_ms", (json_int_t)v[1], "mine",
                                 v[2] > 0);
        if (v[2] > 0) {
            json_object_set_new(body, "count", json_integer(v[2]));
        }
        ld_reply_ok(op->req, body);
    } else if (n >= 1 && v[0] == -1) {
        reply_wrong_type(op->req, key, klen);
    } else {
        reply_redis_failure(op->req, r);
    }
    op->req = NULL;
    op_free(op);
}

static void op_info(struct ld_req *req)
{
    struct lk_target t;
    if (parse_target(req, &t) != LD_OK) {
        return;
    }
    struct lk_op *op = target_op(LK_INFO, req, &t);
    const struct lk_names *n = op_names(op);
    size_t flen;
    const char *field = op_field(op, &flen);
    const char *args[] = { n->hash, field };
    size_t lens[] = { n->hash_len, flen };
    op->inflight = true;
    script(LD_SCRIPT_lock_info, n, 1, 2, args, lens, info_on_reply, op);
}

/* ------------------------------------------------------------ watchdog */

static void pass_continue(void);

static void renew_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    rec->renewing = false;
    lk.renew_inflight--;
    if (lk.passing && !lk.freed &&
        lk.renew_inflight <= RENEW_INFLIGHT_MAX / 2) {
        pass_continue();
    }
    /* Replies come in command order, so a record that was released or
     * lost meanwhile simply ignores what this renewal found. */
    if (lk.freed || !rec->linked || rec->count == 0 || rec->ls == NULL) {
        op_free(op);
        return;
    }
    bool renew = op->kind == LK_RENEW;
    long long v[3] = { 0, 0, 0 };
    int n = reply_ints(r, v, 3);
    if (n >= 3 && v[0] == 1) {
        if (renew) {
            ld_stats.lock_renewals_ok++;
        }
        long long pttl = v[1];
        if (pttl < 0) {
            /* Someone removed the expiry; look again in a while. */
            pttl = ld_srv.cfg->lock.watchdog_ms;
        }
        rec->lease_end_ms = op->sent_ms + (uint64_t)pttl;
        if (v[2] > 0) {
            rec_set_count(rec, v[2]);
        }
        if (rec->capped) {
            rec_arm_cap(rec);
        }
    } else if (n >= 1 && v[0] < 0) {
        if (renew) {
            ld_stats.lock_renewals_failed++;
            rec_lost(rec, v[0] == -2 ? "expired" : "taken", false);
        } else {
            /* A fixed lease ran out: that is what the client asked for. */
            rec_set_count(rec, 0);
        }
    } else if (renew) {
        ld_stats.lock_renewals_failed++;
        if (ld_now_ms() >= rec->lease_end_ms) {
            rec_lost(rec, "redis_unavailable", true);
        }
    }
    op_free(op);
}

static void renew_send(struct lk_rec *rec, enum lk_kind kind, long long lease)
{
    struct lk_op *op = op_new(kind, NULL, rec);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", lease);
    const char *args[] = { rec->n.hash, rec->token, lbuf, "1" };
    size_t lens[] = { rec->n.hash_len, LD_TOKEN_LEN, strlen(lbuf), 1 };
    rec->renewing = true;
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    lk.renew_inflight++;
    script(LD_SCRIPT_lock_renew, &rec->n, 1, 4, args, lens, renew_on_reply,
           op);
}

static long long pass_period_ms(void)
{
    long long p = ld_srv.cfg->lock.watchdog_ms / 3;
    return p > 0 ? p : 1;
}

static void pass_arm(void)
{
    long long ms = pass_period_ms();
    struct timeval tv = tv_ms((long long)ms);
    evtimer_add(lk.pass_ev, &tv);
}

/* What the pass does for one record: renew a watchdog lock, stop renewing
 * at max_hold, look after a fixed lease that should have run out. */
static void pass_visit(struct lk_rec *rec, uint64_t now)
{
    const struct ld_config *cfg = ld_srv.cfg;
    if (rec->ls == NULL) {
        return;
    }
    if (!rec->watchdog) {
        if (!rec->renewing && now >= rec->lease_end_ms) {
            renew_send(rec, LK_CHECK, 0);
        }
        return;
    }
    if (rec->capped) {
        return;
    }
    if (rec->renewing) {
        /* The last renewal is still out; when the lease has passed
         * meanwhile, Redis was unreachable for longer than it. */
        if (now >= rec->lease_end_ms) {
            rec->refs++;
            rec_lost(rec, "redis_unavailable", true);
            rec_unref(rec);
        }
        return;
    }
    long long lease = cfg->lock.watchdog_ms;
    if (cfg->lock.max_hold_ms > 0) {
        long long left = cfg->lock.max_hold_ms
                         - (long long)(now - rec->acquired_ms);
        if (left <= lease) {
            /* The last renewal: it ends the lease at max_hold. */
            rec->capped = true;
            if (left <= 0) {
                rec_arm_cap(rec);
                return;
            }
            lease = left;
        }
    }
    renew_send(rec, LK_RENEW, lease);
    if (rec->capped) {
        rec->lease_end_ms = now + (uint64_t)lease;
        rec_arm_cap(rec);
    }
}

/* One step of the pass. The renewals of a step leave pipelined, in one
 * write per connection. The cursor survives records leaving the list
 * (held_unlink moves it on); records added meanwhile are new and wait for
 * the next pass. */
static void pass_step(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    uint64_t now = ld_now_ms();
    int visited = 0;
    while (lk.cursor != NULL && visited < PASS_STEP &&
           lk.renew_inflight < RENEW_INFLIGHT_MAX) {
        struct lk_rec *rec = lk.cursor;
        lk.cursor = rec->hnext;
        pass_visit(rec, now);
        visited++;
    }
    if (lk.cursor == NULL) {
        lk.passing = false;
    } else if (lk.renew_inflight < RENEW_INFLIGHT_MAX) {
        pass_continue();
    }
    /* else: renew_on_reply continues once replies have come back. */
}

static void pass_continue(void)
{
    event_active(lk.step_ev, EV_TIMEOUT, 0);
}

/* The one periodic timer starts a pass over every held lock, unless the
 * last one is still going (Redis slow), which then simply goes on. */
static void pass_run(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    if (!lk.passing) {
        lk.passing = true;
        lk.cursor = lk.held;
    }
    pass_step(-1, 0, NULL);
    pass_arm();
}

/* ------------------------------------------------------ session close */

static void sess_drop_waiters(struct lk_sess *ls, int code, const char *msg)
{
    while (ls->waiting != NULL) {
        struct lk_op *op = ls->waiting;
        op_wait_unlink(op);
        ld_lockwait_leave(&op->w);
        if (op->req != NULL) {
            if (code < 0) {
                acq_reply_false(op, -1);
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

static void on_session_close(struct ld_session *s)
{
    struct lk_sess *ls = s->lock_state;
    if (ls == NULL) {
        return;
    }
    s->lock_state = NULL;
    ls->closing = true;
    /* Requests of a closed session are dropped, whatever they answer. */
    sess_drop_waiters(ls, -1, NULL);
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, ls->recs);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct lk_rec *rec = v;
        rec->refs++;
        rec_unlink(rec);
        rec->ls = NULL;
        if (rec->count > 0) {
            if (!rec->detached) {
                rec_release_all(rec);
            }
            rec_set_count(rec, 0);
        }
        rec_unref(rec);
    }
    ld_dict_free(ls->recs);
    free(ls);
}

/* -------------------------------------------------------------- module */

int ld_lock_init(void)
{
    lk.by_token = ld_dict_new();
    ld_lockwait_init(acq_try, acq_expire);
    lk.pass_ev = evtimer_new(ld_srv.base, pass_run, NULL);
    lk.step_ev = event_new(ld_srv.base, -1, 0, pass_step, NULL);
    if (lk.by_token == NULL || lk.pass_ev == NULL || lk.step_ev == NULL) {
        return LD_ERR;
    }
    pass_arm();
    ld_session_on_close(on_session_close);
    if (ld_dispatch_register("lock", op_lock) != LD_OK
        || ld_dispatch_register("unlock", op_unlock) != LD_OK
        || ld_dispatch_register("extend", op_extend) != LD_OK
        || ld_dispatch_register("lock.info", op_info) != LD_OK) {
        return LD_ERR;
    }
    return LD_OK;
}

void ld_lock_shutdown(void)
{
    lk.stopping = true;
    for (struct ld_session *s = ld_session_first(); s != NULL; s = s->next) {
        struct lk_sess *ls = s->lock_state;
        if (ls != NULL) {
            sess_drop_waiters(ls, LD_E_SHUTTING_DOWN,
                              "the daemon is stopping");
        }
    }
    struct lk_rec *next;
    for (struct lk_rec *rec = lk.held; rec != NULL; rec = next) {
        next = rec->hnext;
        if (rec->detached) {
            continue;
        }
        rec->refs++;
        rec_release_all(rec);
        rec_set_count(rec, 0);
        rec_unref(rec);
    }
}

void ld_lock_free(void)
{
    if (lk.by_token == NULL) {
        return;
    }
    for (struct ld_session *s = ld_session_first(); s != NULL; s = s->next) {
        struct lk_sess *ls = s->lock_state;
        if (ls != NULL) {
            sess_drop_waiters(ls, LD_E_SHUTTING_DOWN,
                              "the daemon is stopping");
        }
    }
    lk.freed = true;
    /* Requests still out get their answer now; their commands' replies,
     * if they still come, only free what is left. */
    for (struct lk_op *op = lk.ops; op != NULL; op = op->next) {
        if (op->req != NULL) {
            ld_reply_error(op->req, LD_E_SHUTTING_DOWN,
                           "the daemon is stopping");
            op->req = NULL;
        }
    }
    for (struct ld_session *s = ld_session_first(); s != NULL; s = s->next) {
        struct lk_sess *ls = s->lock_state;
        if (ls == NULL) {
            continue;
        }
        s->lock_state = NULL;
        struct ld_dict_iter it;
        void *v;
        ld_dict_iter_init(&it, ls->recs);
        while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
            struct lk_rec *rec = v;
            rec->refs++;
            rec_unlink(rec);
            rec->ls = NULL;
            rec_set_count(rec, 0);
            rec_unref(rec);
        }
        ld_dict_free(ls->recs);
        free(ls);
    }
    ld_lockwait_free();
    event_free(lk.pass_ev);
    lk.pass_ev = NULL;
    if (lk.step_ev != NULL) {
        event_free(lk.step_ev);
        lk.step_ev = NULL;
    }
    ld_dict_free(lk.by_token);
    lk.by_token = NULL;
}
