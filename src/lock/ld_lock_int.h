#ifndef LD_LOCK_INT_H
#define LD_LOCK_INT_H

/* Inside the lock module, shared by its files and by nothing else:
 *   ld_lock.c        ops, unlock, extend, lock.info, session close, the
 *                    module's init and stop
 *   ld_lock_acq.c    lock: acquisition, reentry, waiting, giving back
 *   ld_lock_rec.c    Redis names, records and their tokens, fence memo
 *   ld_lock_redis.c  running the scripts, reading and failing replies
 *   ld_lock_watch.c  max_hold and lock_lost timers, the watchdog pass,
 *                    rechecks
 *   ld_lock_multi.c  lock, unlock and extend with "keys": a group of
 *                    records under one token
 *   ld_lock_idem.c   unlock's request_id: answers remembered for retries
 * With lock.redlock the scripts run on N instances through ld_redlock.c,
 * which answers them as one Redis would (lk_script_ex decides). */

#include "ld_common.h"
#include "ld_lease.h"
#include "ld_lockwait.h"
#include "ld_redis.h"
#include "ld_util.h"

#include <event2/event.h>
#include <sys/queue.h>
#include <sys/time.h>

struct event;
struct ld_ctx;
struct ld_dict;
struct ld_req;
struct ld_session;

#define LK_UNLOCK_MSG "0" /* Redisson's LockPubSub.UNLOCK_MESSAGE */

/* Which kind of lock, and for a read-write lock which side. */
enum lk_mode { LK_MODE_PLAIN, LK_MODE_READ, LK_MODE_WRITE };

/* The Redis names of one lock. FORCED marks a lock that
 * lock.force_unlock deleted (src/lua/lock_force.lua). A read-write lock
 * (MODE not plain) publishes on RWCHAN (then also CHAN) and keeps its
 * readers' leases in keys under RWPFX (src/lua/rw_acquire.lua); DG is the
 * same owner's write token on that lock when it holds one, so that its
 * read may join its write (downgrade). */
struct lk_names {
    char *buf;
    const char *hash, *fence, *chan, *forced, *rwchan, *rwpfx;
    size_t hash_len, fence_len, chan_len, forced_len, rwchan_len, rwpfx_len;
    enum lk_mode mode;
    char dg[LD_TOKEN_LEN + 1];
};

struct lk_op;
struct lk_grp;
struct lk_rec;

/* The highest fence this daemon handed out for one lock, so that a fence
 * never goes backwards here when Redis loses the counter (FLUSHALL, a
 * restart without persistence, an eviction). An entry is kept while a
 * record of the lock exists, then among the FENCE_IDLE_MAX most recently
 * released ones: memory is bounded by the records plus that many. */
struct lk_fmemo {
    char *name; /* the lock hash's Redis name */
    size_t len;
    long long fence;
    unsigned refs;            /* records of this lock */
    LIST_HEAD(, lk_rec) recs; /* those records */
    unsigned excl;            /* those of a plain lock or a write side */
    bool idle;
    TAILQ_ENTRY(lk_fmemo) idle_link; /* idle list, oldest first */
};

#define FENCE_IDLE_MAX 65536

/* A session's lock state (ld_session.lock_state). */
struct lk_sess {
    struct ld_session *sess;
    struct ld_dict *recs;       /* (owner, key) -> struct lk_rec */
    LIST_HEAD(, lk_op) waiting; /* its queued lock requests */
    bool closing;
};

/* What this daemon knows of one (session, owner, key): the token, and the
 * hold count as of the last reply. A record is linked (findable by owner
 * and by token) while it holds the lock or an acquisition for it is on its
 * way, and freed once unlinked and no command refers to it any more.
 *
 * Its states, and what moves it between them:
 *   PENDING   linked, count 0, pending > 0: an acquisition for it is out
 *             or queued (lk_rec_new from lk_op_lock, or a new
 *             acquisition of a record whose hold ended: a new token,
 *             lk_rec_retoken).
 *   HELD      linked, count > 0, in lock_mod.held and so in the pass: a
 *             grant's reply set the count (lk_rec_set_count). Reentries,
 *             partial unlocks and renewals change only the count and the
 *             lease.
 *   ENDED     count back to 0 (the last unlock, a fixed lease run out, a
 *             hold lost: lk_rec_lost sends lock_lost): back to PENDING
 *             when an acquisition is pending, else unlinked at once
 *             (rec_settle).
 *   UNLINKED  not findable (lk_rec_unlink; its session's close unlinks
 *             it too, ls NULL): freed once no command refers to it (refs
 *             0, lk_rec_unref). */
struct lk_rec {
    struct lk_sess *ls; /* NULL once its session has closed */
    char *dkey;
    size_t dkey_len;
    char *key; /* the client's key, for events */
    size_t key_len;
    struct lk_names n;
    char token[LD_TOKEN_LEN + 1];
    long long count; /* 0: not held */
    long long fence;
    bool linked;
    bool watchdog; /* renewed while the session lives */
    bool detached;
    bool renewing;    /* a renewal or check is in flight */
    bool renew_early; /* CAP_EV renews the lease instead of ending it */
    bool at_risk;     /* lock_at_risk sent, no renewal confirmed since */
    bool token_used;  /* granted once under this token */
    bool group;       /* a key of a group lock (ld_lock_multi.c) */
    unsigned refs;    /* commands in flight that name it */
    unsigned pending; /* acquisitions in flight or queued */
    uint64_t acquired_us;
    uint64_t acquired_ms;
    uint64_t lease_end_ms;  /* Redis keeps the lock at least until */
    uint64_t renew_sent_ms; /* when the renewal in flight was sent */
    uint64_t cap_end_ms;    /* max_hold ends the lock (0: never) */
    struct event *cap_ev;   /* lock_lost when it can't be proven */
    struct lk_fmemo *fm;
    LIST_ENTRY(lk_rec) fm_link;     /* the other records of this lock */
    TAILQ_ENTRY(lk_rec) held_entry; /* list of held records */
    bool in_held;
};

enum lk_kind {
    LK_ACQ,       /* lock by owner (may wait) */
    LK_ACQ_TOKEN, /* lock by token: reentry only */
    LK_UNLOCK,
    LK_EXTEND,
    LK_INFO,
    LK_RENEW,  /* watchdog renewal */
    LK_CHECK,  /* is a fixed lease still there? */
    LK_RELEASE /* release all holds: session end, loss, shutdown */
};

/* One request or internal command in flight. */
struct lk_op {
    enum lk_kind kind;
    struct ld_req *req; /* NULL once answered or internal */
    struct lk_rec *rec; /* referenced; NULL for foreign tokens */
    struct lk_names n;  /* own names when REC is NULL */
    char *field;        /* holder field when REC is NULL */
    size_t field_len;
    char *key; /* the client's key, for messages */
    size_t key_len;
    long long lease_ms;    /* lease to set (0: keep) */
    long long lease_asked; /* before clipping at max_hold */
    long long wait_ms;
    bool watchdog; /* this acquisition asked for one */
    bool inflight;
    bool answered_early; /* answered while its try was out */
    bool reenter;        /* sent as reentry only */
    bool after_failover; /* a check sent after the master changed */
    bool recheck;        /* a renewal or check sent by a recheck */
    bool foreign;        /* by token from a session other than REC's */
    bool floor_out;      /* sent without its fence floor: checked here */
    bool refencing;      /* lock_refence is out for its grant */
    uint64_t sent_ms;
    long long grant_count, grant_fence; /* kept across the WAIT step */
    long long replicas_got;             /* WAIT's answer, -1 when none */
    char *wait_why;                     /* why WAIT got no answer */
    struct ld_lockwait w;
    struct lk_sess *ls; /* set while in ls->waiting */
    LIST_ENTRY(lk_op) wait_link;
    LIST_ENTRY(lk_op) link; /* every op */
    struct event *undo_ev;  /* a release by token, later */
    struct lk_grp *grp;     /* a group request or one of its parts */
    struct lk_idem *idem;   /* its request_id's memory, while out */
};

/* The module's state, one for the daemon (defined in ld_lock.c). */
struct lk_mod {
    const struct ld_ctx *ctx;
    struct ld_dict *by_token; /* token -> linked struct lk_rec */
    TAILQ_HEAD(, lk_rec) held;
    LIST_HEAD(, lk_op) ops;
    struct ld_lease_pass pass; /* the watchdog pass and rechecks */
    struct lk_rec *cursor;     /* next record of the pass running */
    struct ld_dict *fences;    /* lock hash name -> struct lk_fmemo */
    TAILQ_HEAD(, lk_fmemo) idle;
    size_t idle_n;
    bool stopping;
    bool freed;
    bool redlock; /* the scripts run on lock.redlock (ld_redlock.c) */
};

extern struct lk_mod lock_mod;

/* Fields shared by unlock, extend and lock.info: the lock, and whose. */
/* What a lock request asks besides what it locks (a single lock's and a
 * group's alike): the owner, the lease (HAS_TTL: a fixed one, else the
 * watchdog renews), how long it may wait (0: not at all, -1: without
 * end) and whether it outlives its session. */
struct lk_lock_opts {
    const char *owner;
    size_t olen;
    long long ttl, wait;
    bool has_ttl, detach;
};

struct lk_target {
    const char *key;
    size_t key_len;
    const char *owner;
    size_t owner_len;
    const char *token;
    size_t token_len;
    bool has_token;
    enum lk_mode mode;
};

/* An unlock's optional "request_id" (ld_lock_idem.c). */
struct lk_rid {
    const char *s;
    size_t len;
    bool has;
};

#define LK_REQUEST_ID_MAX 64
#define IDEM_MAX 16384 /* remembered unlock answers, daemon-wide */

/* ld_lock_idem.c. lk_idem_parse validates the field (bad_request, LD_ERR).
 * lk_idem_start: true when OP's request was answered from memory (or told
 * that its first try is still out); else OP's success must be passed to
 * lk_idem_done, and anything else forgets the request id (lk_op_free). */
int lk_idem_parse(struct ld_req *req, struct lk_rid *rid);
bool lk_idem_start(struct lk_op *op, const char *tok, size_t tlen,
                   const struct lk_rid *rid);
void lk_idem_done(struct lk_op *op, bool released, long long count,
                  uint64_t lease_end_ms);
void lk_idem_op_free(struct lk_op *op);
void lk_idem_free_all(void);

/* ld_admin_lock.c: lock.list and lock.force_unlock of plain locks */
void lk_admin_init(void);

/* ld_lock_rec.c */
char *lk_dkey_build(const char *owner, size_t olen, const char *key,
                    size_t klen, size_t *out_len);
char *lk_dkey_build_mode(const char *owner, size_t olen, const char *key,
                         size_t klen, enum lk_mode mode, size_t *out_len);
void lk_fmemo_free(struct lk_fmemo *fm);
void lk_fmemo_idle_unlink(struct lk_fmemo *fm);
const char *lk_mode_name(enum lk_mode mode);
void lk_names_build(struct lk_names *n, const char *key, size_t len);
void lk_names_build_mode(struct lk_names *n, const char *key, size_t len,
                         enum lk_mode mode);
struct lk_rec *lk_rec_by_token(const char *tok, size_t len,
                               const struct lk_names *n);
void lk_rec_lost(struct lk_rec *rec, const char *reason, bool release);
void lk_rec_lost_to(struct lk_rec *rec);
struct lk_rec *lk_rec_new(struct lk_sess *ls, char *dkey, size_t dlen,
                          const char *key, size_t klen, bool detached,
                          enum lk_mode mode);
int lk_rec_retoken(struct lk_rec *rec);
void lk_rec_set_count(struct lk_rec *rec, long long n);
void lk_rec_set_token(struct lk_rec *rec, const char *tok);
void lk_rec_unlink(struct lk_rec *rec);
void lk_rec_unref(struct lk_rec *rec);

/* ld_lock_redis.c. Inside a script's callback, whichever backend runs
 * the scripts: the outcome, the reason of a failure, the connection. */
enum ld_redis_outcome lk_outcome(void);
const char *lk_failure_reason(void);
uint64_t lk_conn_id(void);
struct lk_op *lk_acq_reply_open(void *arg, const redisReply *r, long long v[4],
                                int *n);
struct lk_rec *lk_op_live_rec(const struct lk_op *op);
int lk_reply_acquire(const redisReply *r, long long v[4], long long lease_ms);
void lk_reply_not_held(struct ld_req *req, const char *key, size_t klen,
                       bool other);
void lk_reply_redis_failure_op(struct ld_req *req, const redisReply *r,
                               const struct lk_op *op, bool write);
void lk_reply_wrong_type(struct ld_req *req, const char *key, size_t klen);
void lk_script(enum ld_script_id id, const struct lk_names *n, int nkeys,
               int nargs, const char **args, size_t *lens, ld_redis_cb *cb,
               void *arg);
void lk_script_ex(unsigned flags, uint64_t pin, enum ld_script_id id,
                  const struct lk_names *n, int nkeys, int nargs,
                  const char **args, size_t *lens, ld_redis_cb *cb, void *arg);
void lk_release_send(unsigned flags, uint64_t pin, const struct lk_names *n,
                     const char *field, size_t flen, bool all, ld_redis_cb *cb,
                     void *arg);

/* ld_lock.c */
void lk_op_fail(struct lk_op *op, const redisReply *r, int n,
                const long long *v, bool write);
const char *lk_op_field(const struct lk_op *op, size_t *len);
void lk_op_free(struct lk_op *op);
void lk_op_log_late(const struct lk_op *op, int n, const long long *v);
const struct lk_names *lk_op_names(const struct lk_op *op);
struct lk_op *lk_op_new(enum lk_kind kind, struct ld_req *req,
                        struct lk_rec *rec);
void lk_op_drop(struct lk_op *op);
void lk_op_undo_later(struct lk_op *op, event_callback_fn cb);
void lk_op_wait_add(struct lk_op *op, struct lk_sess *ls);
void lk_op_wait_end(struct lk_op *op, bool queued,
                    enum ld_lockwait_result res);
void lk_op_wait_unlink(struct lk_op *op);
void lk_rec_forget_stale(const struct lk_op *op, struct lk_rec *rec,
                         long long code);
void lk_rec_release_all(struct lk_rec *rec);
struct lk_sess *lk_sess_get(struct ld_session *s, bool create);
struct lk_op *lk_target_op(enum lk_kind kind, struct ld_req *req,
                           const struct lk_target *t);
int lk_req_mode(struct ld_req *req, enum lk_mode *mode);
bool lk_token_check(struct ld_req *req, const char *t, size_t len);
void lk_unlock_recheck(struct lk_op *op);
void lk_unlock_settle(const struct lk_op *op, struct lk_rec *rec,
                      long long count);

/* ld_lock_acq.c */
void lk_acq_failed(struct lk_op *op, const redisReply *r, int n,
                   const long long *v, bool queued);
void lk_acq_init(void);
bool lk_acq_refused_full(struct lk_op *op);
void lk_acq_reply_false(struct lk_op *op, long long ttl);
void lk_acq_undo_unanswered(struct lk_rec *rec);
bool lk_lock_may_grant(struct ld_req *req, bool detach, bool has_ttl);
bool lk_lock_opts_read(struct ld_req *req, struct lk_lock_opts *o);
void lk_op_asked(struct lk_op *op, const struct lk_lock_opts *o);
void lk_op_lock(struct ld_req *req);

/* ld_lock_multi.c: the ops with "keys" instead of "key" */
bool lk_multi_asked(const struct ld_req *req);
void lk_multi_lock(struct ld_req *req);
void lk_multi_unlock(struct ld_req *req);
void lk_multi_extend(struct ld_req *req, long long ttl);
void lk_multi_try(struct lk_op *op);
void lk_multi_op_free(struct lk_op *op);

/* ld_lock_watch.c */
void lk_rec_arm_cap(struct lk_rec *rec);
long long lk_rec_cap_clip(const struct lk_rec *rec, long long lease);
void lk_rec_cap_update(struct lk_rec *rec);
void lk_recheck_start(void);
void lk_watch_free(void);
void lk_watch_init(void);

#endif
