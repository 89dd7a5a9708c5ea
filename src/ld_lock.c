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

#include <errno.h>
#include <event2/event.h>
#include <limits.h>
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

/* The highest fence this daemon handed out for one lock, so that a fence
 * never goes backwards here when Redis loses the counter (FLUSHALL, a
 * restart without persistence, an eviction). An entry is kept while a
 * record of the lock exists, then among the FENCE_IDLE_MAX most recently
 * released ones: memory is bounded by the records plus that many. */
struct lk_fmemo {
    char *name;                    /* the lock hash's Redis name */
    size_t len;
    long long fence;
    unsigned refs;                 /* records of this lock */
    bool idle;
    struct lk_fmemo *prev, *next;  /* idle list, oldest first */
};

#define FENCE_IDLE_MAX 65536

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
    bool capped;                   /* lock.max_hold_ms applies */
    bool renewing;                 /* a renewal or check is in flight */
    bool token_used;               /* granted once under this token */
    unsigned refs;                 /* commands in flight that name it */
    unsigned pending;              /* acquisitions in flight or queued */
    uint64_t acquired_us;
    uint64_t acquired_ms;
    uint64_t lease_end_ms;         /* Redis keeps the lock at least until */
    uint64_t cap_end_ms;           /* max_hold ends the lock (0: never) */
    struct event *cap_ev;          /* lock_lost when it can't be proven */
    struct lk_fmemo *fm;
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
    long long lease_asked;         /* before clipping at max_hold */
    long long wait_ms;
    bool watchdog;                 /* this acquisition asked for one */
    bool inflight;
    bool answered_early;           /* answered while its try was out */
    bool reenter;                  /* sent as reentry only */
    uint64_t sent_ms;
    long long grant_count, grant_fence; /* kept across the WAIT step */
    long long replicas_got;        /* WAIT's answer, -1 when none */
    char *wait_why;                /* why WAIT got no answer */
    struct ld_lockwait w;
    struct lk_sess *ls;            /* set while in ls->waiting */
    struct lk_op *wprev, *wnext;
    struct lk_op *prev, *next;     /* every op */
    struct event *undo_ev;         /* a release by token, later */
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
    bool check_all;                /* this pass checks fixed leases too */
    struct ld_dict *fences;        /* lock hash name -> struct lk_fmemo */
    struct lk_fmemo *idle_head, *idle_tail;
    size_t idle_n;
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
static void recheck_start(void);

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

/* Read lock_acquire's reply into V: like reply_ints, but a grant carries
 * its fence as a decimal string (fences never pass through Lua numbers),
 * read here exactly. Returns -1 for anything else, also for a fence that
 * is not a positive 64-bit integer (0 means unknown, on a reentry). */
static int reply_acquire(const redisReply *r, long long v[4])
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1
        || r->element[0]->type != REDIS_REPLY_INTEGER) {
        return -1;
    }
    if (r->element[0]->integer != 1) {
        return reply_ints(r, v, 4);
    }
    if (r->elements != 4 || r->element[1]->type != REDIS_REPLY_INTEGER
        || r->element[2]->type != REDIS_REPLY_STRING
        || r->element[3]->type != REDIS_REPLY_INTEGER) {
        return -1;
    }
    const redisReply *f = r->element[2];
    char buf[24];
    if (f->len == 0 || f->len >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, f->str, f->len);
    buf[f->len] = '\0';
    char *end;
    errno = 0;
    long long fence = strtoll(buf, &end, 10);
    if (errno != 0 || *end != '\0' || fence < 0 || buf[0] == '-'
        || buf[0] == '+' || (buf[0] == '0' && f->len > 1)) {
        return -1;
    }
    v[0] = 1;
    v[1] = r->element[1]->integer;
    v[2] = fence;
    v[3] = r->element[3]->integer;
    return 4;
}

static const char *kind_name(enum lk_kind kind)
{
    switch (kind) {
    case LK_UNLOCK:
        return "unlock";
    case LK_EXTEND:
        return "extend";
    case LK_INFO:
        return "lock.info";
    case LK_RENEW:
        return "renew";
    case LK_CHECK:
        return "check";
    case LK_RELEASE:
        return "release";
    default:
        return "lock";
    }
}

/* Answer REQ for a command that got no usable reply (inside the command's
 * callback, where ld_redis says why). WRITE: the command changes the lock,
 * so a command sent without an answer may have happened, and the client
 * is told "outcome":"unknown" instead of "nothing changed". OP (may be
 * NULL) names the op and key in the log. */
static void reply_redis_failure_op(struct ld_req *req, const redisReply *r,
                                   const struct lk_op *op, bool write)
{
    static const char *const unavailable[] = {
        "LOADING", "BUSY", "READONLY", "MASTERDOWN", "CLUSTERDOWN",
        "TRYAGAIN", "NOREPLICAS", "OOM", "NOAUTH", "MOVED", "ASK",
    };
    const char *why = ld_redis_failure_reason();
    const char *opname = op != NULL ? kind_name(op->kind) : "lock";
    int klen = op != NULL && op->key != NULL ? (int)op->key_len : 1;
    const char *key = op != NULL && op->key != NULL ? op->key : "-";
    if (op != NULL && op->key == NULL && op->rec != NULL) {
        klen = (int)op->rec->key_len;
        key = op->rec->key;
    }
    if (r == NULL) {
        enum ld_redis_outcome o = ld_redis_outcome();
        bool unknown = write && (o == LD_REDIS_UNKNOWN || o == LD_REDIS_LOST);
        if (unknown) {
            log_warn("redis failure op=%s key=%.*s outcome=unknown "
                     "reason=\"%s\"", opname, klen, key, why);
        } else {
            /* Nothing changed; the connection's own loss is a warning
             * already, so one line per request stays quieter. */
            log_info("redis failure op=%s key=%.*s outcome=unchanged "
                     "reason=\"%s\"", opname, klen, key, why);
        }
        if (req == NULL) {
            return;
        }
        if (unknown) {
            ld_reply_error_extra(req, LD_E_REDIS_UNAVAILABLE,
                                 json_pack("{s:s}", "outcome", "unknown"),
                                 "redis: %s; the %s was sent and may have "
                                 "taken effect", why, opname);
        } else {
            ld_reply_error(req, LD_E_REDIS_UNAVAILABLE, "redis: %s", why);
        }
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        for (size_t i = 0; i < LD_ARRAY_LEN(unavailable); i++) {
            if (ld_reply_is_error(r, unavailable[i])) {
                log_warn("redis failure op=%s key=%.*s reason=\"%s\"",
                         opname, klen, key, why);
                if (req != NULL) {
                    ld_reply_error(req, LD_E_REDIS_UNAVAILABLE, "redis: %s",
                                   why);
                }
                return;
            }
        }
        log_error("internal error op=%s key=%.*s redis=\"%s\"", opname,
                  klen, key, why);
        if (req != NULL) {
            ld_reply_error(req, LD_E_INTERNAL, "redis: %s", why);
        }
        return;
    }
    log_error("internal error op=%s key=%.*s: unexpected reply type %d "
              "from a lock script", opname, klen, key, r->type);
    if (req != NULL) {
        ld_reply_error(req, LD_E_INTERNAL,
                       "unexpected reply from a lock script");
    }
}

static void reply_redis_failure(struct ld_req *req, const redisReply *r)
{
    reply_redis_failure_op(req, r, NULL, false);
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

/* Lock scripts go on the lock connections while lock.wait_replicas is
 * set, so that the WAIT after a grant blocks none of the shared ones. */
static void script_ex(unsigned flags, uint64_t pin, enum ld_script_id id,
                      const struct lk_names *n, int nkeys, int nargs,
                      const char **args, size_t *lens, ld_redis_cb *cb,
                      void *arg)
{
    struct ld_redis_opts o = { flags, LD_REDIS_POOL_SHARED, pin };
    if (ld_srv.cfg->lock.wait_replicas > 0) {
        o.pool = LD_REDIS_POOL_LOCK;
    }
    ld_redis_script_ex(&o, id, n->hash, n->hash_len, nkeys, nargs, args,
                       lens, cb, arg);
}

static void script(enum ld_script_id id, const struct lk_names *n, int nkeys,
                   int nargs, const char **args, size_t *lens,
                   ld_redis_cb *cb, void *arg)
{
    script_ex(0, 0, id, n, nkeys, nargs, args, lens, cb, arg);
}

/* ---------------------------------------------------------- fence memo */

static void fmemo_idle_unlink(struct lk_fmemo *fm)
{
    if (fm->prev != NULL) {
        fm->prev->next = fm->next;
    } else {
        lk.idle_head = fm->next;
    }
    if (fm->next != NULL) {
        fm->next->prev = fm->prev;
    } else {
        lk.idle_tail = fm->prev;
    }
    fm->prev = fm->next = NULL;
    fm->idle = false;
    lk.idle_n--;
}

static void fmemo_free(struct lk_fmemo *fm)
{
    free(fm->name);
    free(fm);
}

static struct lk_fmemo *fmemo_get(const struct lk_names *n)
{
    struct lk_fmemo *fm = ld_dict_get(lk.fences, n->hash, n->hash_len);
    if (fm == NULL) {
        fm = calloc(1, sizeof(*fm));
        fm->name = malloc(n->hash_len);
        memcpy(fm->name, n->hash, n->hash_len);
        fm->len = n->hash_len;
        ld_dict_set(lk.fences, fm->name, fm->len, fm);
    } else if (fm->idle) {
        fmemo_idle_unlink(fm);
    }
    fm->refs++;
    return fm;
}

static void fmemo_put(struct lk_fmemo *fm)
{
    if (--fm->refs > 0) {
        return;
    }
    if (lk.fences == NULL) {
        /* The module was freed while this record waited for a reply. */
        fmemo_free(fm);
        return;
    }
    fm->idle = true;
    fm->next = NULL;
    fm->prev = lk.idle_tail;
    if (lk.idle_tail != NULL) {
        lk.idle_tail->next = fm;
    } else {
        lk.idle_head = fm;
    }
    lk.idle_tail = fm;
    lk.idle_n++;
    while (lk.idle_n > FENCE_IDLE_MAX) {
        struct lk_fmemo *old = lk.idle_head;
        fmemo_idle_unlink(old);
        ld_dict_del(lk.fences, old->name, old->len);
        fmemo_free(old);
    }
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
    fmemo_put(rec->fm);
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
        rec->cap_end_ms = 0;
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
    rec->fm = fmemo_get(&rec->n);
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

/* How long before the end of a confirmed watchdog lease the daemon stops
 * vouching for it: the lease is counted from when the confirming command
 * was sent, which is never later than Redis started it, and the margin
 * covers the clocks of the two hosts drifting apart (1% of a watchdog
 * lease, as for Redlock) and the event's way to the client (2 ms). */
static uint64_t lost_margin_ms(void)
{
    return 2 + (uint64_t)ld_srv.cfg->lock.watchdog_ms / 100;
}

static void cap_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct lk_rec *rec = arg;
    if (rec->count == 0) {
        return;
    }
    /* A lease clipped at max_hold ends there: the cap is the reason. */
    bool cap = rec->cap_end_ms != 0
               && ld_now_ms() + lost_margin_ms() >= rec->cap_end_ms;
    rec->refs++;
    rec_lost(rec, cap ? "max_hold" : "redis_unavailable", true);
    rec_unref(rec);
}

/* Arm the one timer of a held record for the earlier of: the moment the
 * daemon can no longer prove a watchdog lease (lease end minus the
 * margin), and max_hold. Called whenever either changes. */
static void rec_arm_cap(struct lk_rec *rec)
{
    if (rec->count == 0) {
        return;
    }
    uint64_t at = UINT64_MAX;
    if (rec->watchdog && rec->ls != NULL) {
        uint64_t m = lost_margin_ms();
        at = rec->lease_end_ms > m ? rec->lease_end_ms - m : 0;
    }
    if (rec->cap_end_ms != 0 && rec->cap_end_ms < at) {
        at = rec->cap_end_ms;
    }
    if (at == UINT64_MAX) {
        if (rec->cap_ev != NULL) {
            evtimer_del(rec->cap_ev);
        }
        return;
    }
    if (rec->cap_ev == NULL) {
        rec->cap_ev = evtimer_new(ld_srv.base, cap_on_timer, rec);
    }
    uint64_t now = ld_now_ms();
    uint64_t ms = at > now ? at - now : 0;
    struct timeval tv = tv_ms((long long)ms);
    evtimer_add(rec->cap_ev, &tv);
}

/* Follow lock.max_hold_ms (reloads apply) for a watchdog-renewed lock. */
static void rec_cap_update(struct lk_rec *rec)
{
    long long max = ld_srv.cfg->lock.max_hold_ms;
    if (!rec->watchdog || max <= 0 || rec->count == 0) {
        rec->cap_end_ms = 0;
    } else {
        rec->cap_end_ms = rec->acquired_ms + (uint64_t)max;
    }
    rec->capped = rec->cap_end_ms != 0;
}

/* Milliseconds left under max_hold (LLONG_MAX when no cap applies; 0 or
 * less once reached). */
static long long rec_cap_left(const struct lk_rec *rec)
{
    if (rec == NULL || rec->cap_end_ms == 0) {
        return LLONG_MAX;
    }
    return (long long)rec->cap_end_ms - (long long)ld_now_ms();
}

/* A lease to set on REC (grant, reentry, renewal, extend), clipped so that
 * it never runs past max_hold. */
static long long rec_cap_clip(const struct lk_rec *rec, long long lease)
{
    long long left = rec_cap_left(rec);
    if (lease > left) {
        lease = left > 1 ? left : 1;
    }
    return lease;
}

/* A new acquisition after a hold ended gets a new token: the old one may
 * still be in the hands of someone who must not be able to use it on
 * the new hold (an unlock by token, a reentry by token). */
static int rec_retoken(struct lk_rec *rec)
{
    char tok[LD_TOKEN_LEN + 1];
    if (ld_token_new(tok) != LD_OK) {
        return LD_ERR;
    }
    if (rec->linked) {
        ld_dict_del(lk.by_token, rec->token, LD_TOKEN_LEN);
        ld_dict_set(lk.by_token, tok, LD_TOKEN_LEN, rec);
    }
    memcpy(rec->token, tok, sizeof(tok));
    rec->token_used = false;
    return LD_OK;
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
    if (op->undo_ev != NULL) {
        event_free(op->undo_ev);
    }
    free(op->wait_why);
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
        if (n < 1) {
            /* The give-back got no answer: the grant may still stand. */
            ld_reply_error_extra(op->req, LD_E_REDIS_UNAVAILABLE,
                                 json_pack("{s:s}", "outcome", "unknown"),
                                 "too few replicas confirmed the lock and "
                                 "giving it back failed: %s",
                                 ld_redis_failure_reason());
        } else if (op->replicas_got < 0) {
            ld_reply_error(op->req, LD_E_REDIS_UNAVAILABLE,
                           "WAIT for %d replicas got no answer (%s)", need,
                           op->wait_why != NULL ? op->wait_why : "");
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

/* A release by token after the acquisition's connection was lost. */
static void undo_later_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    /* Only while no acquisition under this token holds or is on its way:
     * nothing else can hold the token, so all its holds are the lost
     * one's. */
    if (!lk.freed && !lk.stopping && rec->count == 0 && rec->pending == 0) {
        rec_release_all(rec);
    }
    op_free(op);
}

/* The acquisition's connection is gone: it broke after the script was
 * sent, so Redis may have run it. A release on another connection now
 * could come first; give Redis redis.timeout_ms to have seen the
 * acquisition, then release by token. */
static void undo_later(struct lk_op *op)
{
    op->undo_ev = evtimer_new(ld_srv.base, undo_later_on_timer, op);
    struct timeval tv = tv_ms(ld_srv.cfg->redis.timeout_ms);
    evtimer_add(op->undo_ev, &tv);
}

static void undo_pinned_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    op->inflight = false;
    long long v[2] = { 0, 0 };
    if (!lk.freed && reply_ints(r, v, 2) >= 1 && v[0] == 1) {
        ld_stats.lock_released++;
    }
    /* The record's count is the acquisitions' business: a reentry under
     * the same token may have answered meanwhile on another connection. */
    if (ld_redis_outcome() != LD_REDIS_NOT_SENT || lk.freed || lk.stopping) {
        op_free(op);
        return;
    }
    undo_later(op);
}

/* An acquisition got no answer (inside its callback). The script may have
 * run and then the lock is held under a token nobody will use, for a whole
 * lease; undo it so that redis_unavailable means "nothing changed" once
 * Redis answers the release. The release gives back one hold, on the
 * acquisition's own connection, behind the acquisition: it undoes exactly
 * what the acquisition did, also when a later reentry under the same token
 * reached Redis first on another connection. */
static void acq_undo_unanswered(struct lk_rec *rec)
{
    if (ld_redis_outcome() == LD_REDIS_NOT_SENT) {
        return;            /* it never left the daemon */
    }
    struct lk_op *op = op_new(LK_RELEASE, NULL, rec);
    if (ld_redis_conn_id() == 0) {
        undo_later(op);    /* its connection is not known, nor there */
        return;
    }
    const char *args[] = { rec->n.hash, rec->token, "1", rec->n.chan,
                           LK_UNLOCK_MSG };
    size_t lens[] = { rec->n.hash_len, LD_TOKEN_LEN, 1, rec->n.chan_len,
                      strlen(LK_UNLOCK_MSG) };
    op->inflight = true;
    script_ex(0, ld_redis_conn_id(), LD_SCRIPT_lock_release, &rec->n, 1, 5,
              args, lens, undo_pinned_on_reply, op);
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
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        op->wait_why = strdup(ld_redis_failure_reason());
    }
    const char *args[] = { rec->n.hash, rec->token, "1", rec->n.chan,
                           LK_UNLOCK_MSG };
    size_t lens[] = { rec->n.hash_len, LD_TOKEN_LEN, 1, rec->n.chan_len,
                      strlen(LK_UNLOCK_MSG) };
    op->inflight = true;
    /* On the connection of the grant and its WAIT, so that the give-back
     * runs after the grant even when WAIT timed out. */
    script_ex(0, ld_redis_conn_id(), LD_SCRIPT_lock_release, &rec->n, 1, 5,
              args, lens, undo_on_reply, op);
}

/* The acquisition was granted with hold count N. Returns true when OP was
 * kept for the WAIT step (the caller must not free it). */
static bool acq_granted(struct lk_op *op, long long n, long long fence,
                        long long pttl)
{
    struct lk_rec *rec = op->rec;
    if (n == 1 && rec->count > 0) {
        /* A fresh acquisition although we believed it held: the old hold
         * had ended (expired, or released by token elsewhere) between two
         * acquisitions sent together. Its holder hears of it first. */
        rec_lost(rec, "expired", false);
    }
    bool fresh = rec->count == 0;
    rec_set_count(rec, n);
    rec->token_used = true;
    if (fresh || rec->fence <= 0) {
        rec->fence = fence;
    }
    if (fresh && fence > rec->fm->fence) {
        rec->fm->fence = fence;
    }
    if (fresh) {
        /* max_hold counts from when the acquisition was sent. */
        rec->acquired_ms = op->sent_ms;
    }
    rec->watchdog = fresh ? op->watchdog : (rec->watchdog || op->watchdog);
    rec->lease_end_ms = op->sent_ms
                        + (uint64_t)(pttl >= 0 ? pttl : op->lease_ms);
    rec_cap_update(rec);
    rec_arm_cap(rec);
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
        /* WAIT counts the writes of its own connection: the grant's. */
        struct ld_redis_opts o = { 0, LD_REDIS_POOL_LOCK,
                                   ld_redis_conn_id() };
        op->inflight = true;
        ld_redis_command_ex(&o, rec->n.hash, rec->n.hash_len, 3, argv, lens,
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
    int n = reply_acquire(r, v);
    bool queued = op->w.q != NULL;

    if (op->reenter && n >= 1 && (v[0] == -2 || v[0] == -3)) {
        /* We believed this owner held the lock, but its hold is gone (a
         * fixed lease ran out, Redis lost it, an unlock by token): tell
         * the holder before anything else, then this request is a new
         * acquisition, under a new token. */
        if (rec->count > 0) {
            bool early = ld_now_ms() < rec->lease_end_ms;
            rec_lost(rec, v[0] == -2 ? "expired" : "taken", false);
            if (early) {
                /* Gone before its lease: Redis may have lost data. */
                recheck_start();
            }
        }
        if (op->req == NULL) {
            op_free(op);
            return;
        }
        if (v[0] == -2) {
            acq_send(op);
            return;
        }
        v[0] = 0;
    }

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
        acq_undo_unanswered(rec);
    }
    if (n >= 1 && v[0] == -1) {
        log_warn("lock '%.*s': its redis keys hold data leased did not "
                 "write; nothing changed", (int)rec->key_len, rec->key);
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
    /* While this daemon believes the owner holds the lock, the request is
     * a reentry and nothing else: should the hold be gone, the reply says
     * so, and only then is a new acquisition sent. */
    op->reenter = rec->count > 0;
    if (!op->reenter && rec->token_used && rec_retoken(rec) != LD_OK) {
        log_error("no random bytes for a lock token");
    }
    long long max = ld_srv.cfg->lock.max_hold_ms;
    op->lease_ms = op->lease_asked;
    if (op->reenter) {
        op->lease_ms = rec_cap_clip(rec, op->lease_ms);
    } else if (op->watchdog && max > 0 && op->lease_ms > max) {
        op->lease_ms = max;
    }
    char lbuf[24], fbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", op->lease_ms);
    snprintf(fbuf, sizeof(fbuf), "%lld", rec->fm->fence);
    const char *args[] = { rec->n.hash, rec->n.fence, lbuf, rec->token,
                           op->reenter ? "1" : "0", fbuf };
    size_t lens[] = { rec->n.hash_len, rec->n.fence_len, strlen(lbuf),
                      LD_TOKEN_LEN, 1, strlen(fbuf) };
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    script(LD_SCRIPT_lock_acquire, &rec->n, 2, 6, args, lens, acq_on_reply,
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
    int n = reply_acquire(r, v);
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
            rec_cap_update(rec);
            rec_arm_cap(rec);
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

static bool all_of(const char *s, size_t len, const char *set)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0' || strchr(set, s[i]) == NULL) {
            return false;
        }
    }
    return true;
}

/* A token names a hash field in Redis, so only holder-shaped names pass:
 * the daemon's own tokens (LD_TOKEN_LEN lowercase hex digits) and, with
 * lock.layout redisson, Redisson's holders (<uuid>:<thread id>). Anything
 * else could address a field of someone's hash that is not a lock. */
static bool token_ok(const char *t, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    static const char hex_any[] = "0123456789abcdefABCDEF";
    if (len == LD_TOKEN_LEN && all_of(t, len, hex)) {
        return true;
    }
    if (ld_srv.cfg->lock.layout != LD_LAYOUT_REDISSON || len < 38
        || len > 36 + 1 + 20) {
        return false;
    }
    static const size_t group[] = { 8, 4, 4, 4, 12 };
    size_t at = 0;
    for (size_t g = 0; g < LD_ARRAY_LEN(group); g++) {
        if (!all_of(t + at, group[g], hex_any)) {
            return false;
        }
        at += group[g];
        if (t[at] != (g + 1 < LD_ARRAY_LEN(group) ? '-' : ':')) {
            return false;
        }
        at++;
    }
    return at < len && all_of(t + at, len - at, "0123456789");
}

/* Answers REQ and returns false when TOKEN cannot be a holder. */
static bool token_check(struct ld_req *req, const char *t, size_t len)
{
    if (token_ok(t, len)) {
        return true;
    }
    ld_reply_error(req, LD_E_BAD_REQUEST,
                   "field 'token' is not a lock token (%d lowercase hex "
                   "digits%s)", LD_TOKEN_LEN,
                   ld_srv.cfg->lock.layout == LD_LAYOUT_REDISSON
                       ? ", or a Redisson holder <uuid>:<thread id>" : "");
    return false;
}

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
    if (t->has_token && !token_check(req, t->token, t->token_len)) {
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
    if (has_token && !token_check(req, token, tlen)) {
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
        op->lease_ms = has_ttl ? rec_cap_clip(op->rec, ttl) : 0;
        const struct lk_names *n = op_names(op);
        char lbuf[24];
        snprintf(lbuf, sizeof(lbuf), "%lld", op->lease_ms);
        const char *args[] = { n->hash, n->fence, lbuf, op->field, "1",
                               "0" };
        size_t lens[] = { n->hash_len, n->fence_len, strlen(lbuf),
                          op->field_len, 1, 1 };
        op->sent_ms = ld_now_ms();
        op->inflight = true;
        script(LD_SCRIPT_lock_acquire, n, 2, 6, args, lens,
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
    op->lease_asked = op->lease_ms;
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

static void unlock_recheck_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    long long v[3] = { 0, 0, 0 };
    if (!lk.freed && rec != NULL && rec->linked
        && reply_ints(r, v, 3) >= 3 && v[0] >= 0) {
        rec_set_count(rec, v[2]);
    }
    op_free(op);
}

/* An unlock with no answer will never get one (its connection was given
 * up): what Redis holds under the token now settles the record. */
static void unlock_recheck(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    if (lk.freed || rec == NULL || !rec->linked) {
        op_free(op);
        return;
    }
    const char *args[] = { rec->n.hash, rec->token };
    size_t lens[] = { rec->n.hash_len, LD_TOKEN_LEN };
    script(LD_SCRIPT_lock_info, &rec->n, 1, 2, args, lens,
           unlock_recheck_on_reply, op);
}

/* Called once with the answer, or, when it did not come in time, once with
 * UNKNOWN (the client hears "outcome":"unknown" and the record stays as it
 * was) and once more with Redis' late answer, which settles the record, or
 * LOST, when a re-check does. */
static void unlock_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    enum ld_redis_outcome o = ld_redis_outcome();
    if (o == LD_REDIS_UNKNOWN) {
        reply_redis_failure_op(op->req, r, op, true);
        op->req = NULL;
        return;            /* the late answer or LOST follows */
    }
    if (lk.freed) {
        op_free(op);
        return;
    }
    if (o == LD_REDIS_LOST) {
        reply_redis_failure_op(op->req, r, op, true);
        op->req = NULL;
        unlock_recheck(op);
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
    if (o == LD_REDIS_LATE) {
        log_info("late answer settled op=unlock key=%.*s result=%lld",
                 (int)klen, key, n >= 1 ? v[0] : -100);
    }
    if (n >= 2 && (v[0] == 1 || v[0] == 0)) {
        if (v[0] == 1) {
            ld_stats.lock_released++;
        }
        if (rec != NULL) {
            rec_set_count(rec, v[1]);
        }
        if (op->req != NULL) {
            ld_reply_ok(op->req, json_pack("{s:b,s:I}", "released",
                                           v[0] == 1, "count",
                                           (json_int_t)v[1]));
        }
    } else if (n >= 1 && (v[0] == -2 || v[0] == -3)) {
        rec_forget_stale(rec);
        if (op->req != NULL) {
            reply_not_held(op->req, key, klen, v[0] == -3);
        }
    } else if (n >= 1 && v[0] == -1) {
        rec_forget_stale(rec);
        if (op->req != NULL) {
            reply_wrong_type(op->req, key, klen);
        }
    } else {
        reply_redis_failure_op(op->req, r, op, true);
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
    script_ex(LD_REDIS_F_LATE, 0, LD_SCRIPT_lock_release, n, 1, 5, args,
              lens, unlock_on_reply, op);
}

/* -------------------------------------------------------------- extend */

/* Called like unlock_on_reply. A late answer settles the record's lease;
 * when none comes the watchdog or the lease check finds out. */
static void extend_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    enum ld_redis_outcome o = ld_redis_outcome();
    if (o == LD_REDIS_UNKNOWN) {
        reply_redis_failure_op(op->req, r, op, true);
        op->req = NULL;
        return;            /* the late answer or LOST follows */
    }
    if (lk.freed || o == LD_REDIS_LOST) {
        reply_redis_failure_op(op->req, r, op, true);
        op->req = NULL;
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
    if (o == LD_REDIS_LATE) {
        log_info("late answer settled op=extend key=%.*s result=%lld",
                 (int)klen, key, n >= 1 ? v[0] : -100);
    }
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
        if (op->req != NULL) {
            ld_reply_ok(op->req, json_pack("{s:I}", "lease_ms",
                                           (json_int_t)op->lease_ms));
        }
    } else if (n >= 1 && (v[0] == -2 || v[0] == -3)) {
        rec_forget_stale(rec);
        if (op->req != NULL) {
            reply_not_held(op->req, key, klen, v[0] == -3);
        }
    } else if (n >= 1 && v[0] == -1) {
        rec_forget_stale(rec);
        if (op->req != NULL) {
            reply_wrong_type(op->req, key, klen);
        }
    } else {
        reply_redis_failure_op(op->req, r, op, true);
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
    ttl = rec_cap_clip(op->rec, ttl);
    op->lease_ms = ttl;
    const struct lk_names *n = op_names(op);
    size_t flen;
    const char *field = op_field(op, &flen);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", ttl);
    const char *args[] = { n->hash, field, lbuf };
    size_t lens[] = { n->hash_len, flen, strlen(lbuf) };
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    script_ex(LD_REDIS_F_LATE, 0, LD_SCRIPT_lock_extend, n, 1, 3, args, lens,
              extend_on_reply, op);
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
        reply_redis_failure_op(op->req, r, op, false);
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
        rec_arm_cap(rec);
    } else if (n >= 1 && v[0] < 0) {
        /* Found gone before the lease it last confirmed could end in
         * Redis: Redis lost data (FLUSHALL, a restart without
         * persistence, an eviction), so look at every lock at once. */
        bool early = ld_now_ms() < rec->lease_end_ms;
        if (v[0] == -1) {
            log_warn("lock '%.*s': its redis key holds data leased did not "
                     "write", (int)rec->key_len, rec->key);
        }
        if (renew) {
            ld_stats.lock_renewals_failed++;
            rec_lost(rec, v[0] == -2 ? "expired" : "taken", false);
        } else if (early) {
            rec_lost(rec, v[0] == -2 ? "expired" : "taken", false);
        } else {
            /* A fixed lease ran out: that is what the client asked for. */
            rec_set_count(rec, 0);
        }
        if (early && v[0] != -1) {
            recheck_start();
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
        if (!rec->renewing && (lk.check_all || now >= rec->lease_end_ms)) {
            renew_send(rec, LK_CHECK, 0);
        }
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
    rec_cap_update(rec);
    long long left = rec_cap_left(rec);
    if (left <= 0) {
        /* max_hold is reached: the timer ends the lock now. */
        rec_arm_cap(rec);
        return;
    }
    /* The renewals near max_hold end the lease exactly there. */
    renew_send(rec, LK_RENEW, rec_cap_clip(rec, cfg->lock.watchdog_ms));
    rec_arm_cap(rec);
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
        lk.check_all = false;
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

/* Check every held lock now, fixed leases too, in one pass bounded like
 * the watchdog's: Redis came back (it may have restarted without its
 * data) or a lock was found gone before its lease. Locks that did not
 * survive are reported at once instead of a pass later, and fixed-lease
 * locks at all. */
static void recheck_start(void)
{
    if (lk.freed || lk.stopping || (lk.passing && lk.check_all)) {
        return;
    }
    lk.check_all = true;
    lk.passing = true;
    lk.cursor = lk.held;
    pass_continue();
}

static void on_redis_state(bool up, void *arg)
{
    LD_UNUSED(arg);
    if (up) {
        recheck_start();
    }
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
    lk.fences = ld_dict_new();
    ld_lockwait_init(acq_try, acq_expire);
    lk.pass_ev = evtimer_new(ld_srv.base, pass_run, NULL);
    lk.step_ev = event_new(ld_srv.base, -1, 0, pass_step, NULL);
    if (lk.by_token == NULL || lk.pass_ev == NULL || lk.step_ev == NULL) {
        return LD_ERR;
    }
    pass_arm();
    ld_session_on_close(on_session_close);
    ld_redis_on_state(on_redis_state, NULL);
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
    for (struct ld_session *s = ld_session_first(); s != NULL;
         s = ld_session_next(s)) {
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
    for (struct ld_session *s = ld_session_first(); s != NULL;
         s = ld_session_next(s)) {
        struct lk_sess *ls = s->lock_state;
        if (ls != NULL) {
            sess_drop_waiters(ls, LD_E_SHUTTING_DOWN,
                              "the daemon is stopping");
        }
    }
    lk.freed = true;
    /* Requests still out get their answer now; their commands' replies,
     * if they still come, only free what is left. */
    for (struct lk_op *op = lk.ops, *next; op != NULL; op = next) {
        next = op->next;
        if (op->req != NULL) {
            ld_reply_error(op->req, LD_E_SHUTTING_DOWN,
                           "the daemon is stopping");
            op->req = NULL;
        }
        if (op->undo_ev != NULL) {
            op_free(op);   /* a release planned for later: no command */
        }
    }
    for (struct ld_session *s = ld_session_first(); s != NULL;
         s = ld_session_next(s)) {
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
    /* Entries still pinned by a record go with their last record. */
    while (lk.idle_head != NULL) {
        struct lk_fmemo *fm = lk.idle_head;
        fmemo_idle_unlink(fm);
        fmemo_free(fm);
    }
    ld_dict_free(lk.fences);
    lk.fences = NULL;
}
