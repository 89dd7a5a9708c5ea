/* Locks: the lock op. Acquisition, reentry by owner or by token,
 * waiting (the queue itself is ld_lockwait.c), WAIT for replicas, and
 * giving a hold back when its outcome is unknown. It must not handle
 * "keys" (ld_lock_multi.c) nor renew a lease (ld_lock_watch.c). */

#include "ld_lock_int.h"

#include "ld_cancel.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_evict.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_redlock.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- acquire */

static void acq_send(struct lk_op *op);
static bool acq_cancel(void *arg);

static void
acq_reply_granted(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    if (op->wait_ms != 0) {
        ld_stats_observe(LD_HISTO_LOCK_WAIT, ld_now_us() - op->req->start_us);
    }
    const struct ld_field f[] = {LD_BOOL("acquired", true),
                                 LD_STR("token", rec->token),
                                 LD_INT("count", op->grant_count),
                                 LD_INT("fence", op->grant_fence),
                                 LD_INT("lease_ms", op->lease_ms)};
    ld_reply_ok_fields(op->req, f, LD_ARRAY_LEN(f));
    op->req = NULL;
}

void
lk_acq_reply_false(struct lk_op *op, long long ttl)
{
    if (op->req == NULL) {
        return;
    }
    const struct ld_field f[] = {LD_BOOL("acquired", false),
                                 LD_INT("ttl_ms", ttl)};
    ld_reply_ok_fields(op->req, f, LD_ARRAY_LEN(f));
    op->req = NULL;
}

static void
undo_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    long long v[2] = {0, 0};
    int n = ld_lease_reply_ints(r, v, 2);
    op->inflight = false;
    if (!lock_mod.freed && op->req != NULL) {
        int need = lock_mod.ctx->cfg->lock.wait_replicas;
        if (n < 1) {
            /* The give-back got no answer: the grant may still stand. */
            ld_reply_error_extra(op->req, LD_E_REDIS_UNAVAILABLE,
                                 json_pack("{s:s}", "outcome", "unknown"),
                                 "too few replicas confirmed the lock and "
                                 "giving it back failed: %s",
                                 lk_failure_reason());
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
    if (!lock_mod.freed && rec->linked && n >= 1) {
        if (v[0] == LD_LOCK_RELEASED) {
            ld_stats.lock_released++;
            lk_rec_set_count(rec, 0);
        } else if (v[0] == LD_LOCK_KEPT && n == 2) {
            lk_rec_set_count(rec, v[1]);
        } else {
            lk_rec_set_count(rec, 0);
        }
    }
    lk_op_free(op);
}

static void acq_undo_hold(struct lk_rec *rec);

/* A release by token after the acquisition's connection was lost. */
static void
undo_later_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    /* Only while no acquisition under this token holds or is on its way:
     * nothing else can hold the token, so all its holds are the lost
     * one's. */
    if (!lock_mod.freed && !lock_mod.stopping && rec->count == 0 &&
        rec->pending == 0) {
        lk_rec_release_all(rec);
    }
    lk_op_free(op);
}

/* The acquisition's connection is gone: it broke after the script was
 * sent, so Redis may have run it. A release on another connection now
 * could come first; give Redis redis.timeout_ms to have seen the
 * acquisition, then release by token. */
static void
undo_later(struct lk_op *op)
{
    lk_op_undo_later(op, undo_later_on_timer);
}

/* Give back one hold of OP's record under its token, on the connection
 * of the reply being handled (inside its callback): behind the command
 * it undoes. CB gets the answer. */
static void
release_one_pinned(struct lk_op *op, ld_redis_cb *cb)
{
    struct lk_rec *rec = op->rec;
    op->inflight = true;
    lk_release_send(0, lk_conn_id(), &rec->n, rec->token, LD_TOKEN_LEN, false,
                    cb, op);
}

static void
undo_pinned_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    op->inflight = false;
    long long v[2] = {0, 0};
    if (!lock_mod.freed && ld_lease_reply_ints(r, v, 2) >= 1 &&
        v[0] == LD_LOCK_RELEASED) {
        ld_stats.lock_released++;
    }
    /* The record's count is the acquisitions' business: a reentry under
     * the same token may have answered meanwhile on another connection. */
    if (lk_outcome() != LD_REDIS_NOT_SENT || lock_mod.freed ||
        lock_mod.stopping) {
        lk_op_free(op);
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
void
lk_acq_undo_unanswered(struct lk_rec *rec)
{
    if (lk_outcome() == LD_REDIS_NOT_SENT) {
        return; /* it never left the daemon */
    }
    acq_undo_hold(rec);
}

/* Give back one hold of REC's token (inside a reply's callback), on that
 * reply's connection, else by token later. */
static void
acq_undo_hold(struct lk_rec *rec)
{
    struct lk_op *op = lk_op_new(LK_RELEASE, NULL, rec);
    if (lk_conn_id() == 0) {
        undo_later(op); /* its connection is not known, nor there */
        return;
    }
    release_one_pinned(op, undo_pinned_on_reply);
}

static void acq_give_back(struct lk_op *op);

static void
acq_on_wait(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    op->inflight = false;
    if (lock_mod.freed) {
        lk_op_free(op);
        return;
    }
    int need = lock_mod.ctx->cfg->lock.wait_replicas;
    long long got = (r != NULL && r->type == REDIS_REPLY_INTEGER) ? r->integer
                                                                  : -1;
    if (got >= need) {
        acq_reply_granted(op);
        lk_op_free(op);
        return;
    }
    /* Not enough replicas have the lock: a failover now could hand it to
     * someone else, so give this hold back, then say so (the answer then
     * means what redis_unavailable means: nothing changed). */
    op->replicas_got = got;
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        op->wait_why = ld_xstrdup(lk_failure_reason());
    }
    acq_give_back(op);
}

/* Give back the one hold OP's grant took (inside the callback of the
 * grant or of its WAIT); undo_on_reply answers OP's request, if any. */
static void
acq_give_back(struct lk_op *op)
{
    /* On the connection of the grant and its WAIT, so that the give-back
     * runs after the grant even when WAIT timed out. */
    release_one_pinned(op, undo_on_reply);
}

/* REC now holds N times, with FENCE, for PTTL ms (-1: the lease OP
 * asked for) from when OP was sent. A first hold (N 1) rules out the
 * holds this daemon still counts that Redis no longer has: their holders
 * hear of it first. */
static void
grant_record(struct lk_op *op, long long n, long long fence, long long pttl)
{
    struct lk_rec *rec = op->rec;
    if (n == 1 && rec->count > 0) {
        /* A fresh acquisition although we believed it held: the old hold
         * had ended (expired, or released by token elsewhere) between two
         * acquisitions sent together. */
        lk_rec_lost(rec, "expired", false);
    }
    if (n == 1) {
        lk_rec_lost_to(rec);
    }
    bool fresh = rec->count == 0;
    lk_rec_set_count(rec, n);
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
    rec->lease_end_ms = op->sent_ms +
                        (uint64_t)(pttl >= 0 ? pttl : op->lease_ms);
    if (lock_mod.redlock && pttl >= 0) {
        op->lease_ms = pttl; /* the validity left (ld_redlock.h) */
    }
    lk_rec_cap_update(rec);
    lk_rec_arm_cap(rec);
}

/* Its session ended (or the daemon is stopping) while the request was on
 * its way: a session-bound lock must not outlive it. A client that only
 * half-closed still reads this answer, which says what happened:
 * granted, then released with its session, like every other lock the
 * session held. */
static void
grant_orphaned(struct lk_op *op)
{
    lk_rec_release_all(op->rec);
    lk_rec_set_count(op->rec, 0);
    if (op->req == NULL) {
        return;
    }
    if (lock_mod.stopping) {
        ld_reply_error(op->req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        op->req = NULL;
    } else {
        acq_reply_granted(op);
    }
}

/* WAIT for REPLICAS replicas to have the grant before OP is answered. */
static void
grant_wait_replicas(struct lk_op *op, int replicas)
{
    struct lk_rec *rec = op->rec;
    char nbuf[16], tbuf[24];
    /* Half the command timeout, so the answer arrives before the daemon's
     * own timeout gives up on the connection. */
    long long t = lock_mod.ctx->cfg->redis.timeout_ms / 2;
    snprintf(nbuf, sizeof(nbuf), "%d", replicas);
    snprintf(tbuf, sizeof(tbuf), "%lld", t > 0 ? t : 1);
    const char *argv[] = {"WAIT", nbuf, tbuf};
    size_t lens[] = {4, strlen(nbuf), strlen(tbuf)};
    /* WAIT counts the writes of its own connection: the grant's. */
    struct ld_redis_opts o = {.pool = LD_REDIS_POOL_LOCK, .pin = lk_conn_id()};
    op->inflight = true;
    ld_redis_command_ex(&o, rec->n.hash, rec->n.hash_len, 3, argv, lens,
                        acq_on_wait, op);
}

/* The acquisition was granted with hold count N. Returns true when OP was
 * kept for the WAIT step (the caller must not free it). */
static bool
acq_granted(struct lk_op *op, long long n, long long fence, long long pttl)
{
    struct lk_rec *rec = op->rec;
    grant_record(op, n, fence, pttl);
    ld_stats.lock_acquired++;
    op->grant_count = n;
    op->grant_fence = rec->fence;
    if (!rec->detached && (rec->ls == NULL || lock_mod.stopping)) {
        /* A detached lock does not depend on its session and is answered
         * as usual. */
        grant_orphaned(op);
        return false;
    }
    if (op->req == NULL) {
        /* Cancelled while this grant was on its way: nobody heard of it. */
        op->replicas_got = 0;
        acq_give_back(op);
        return true;
    }
    /* Redlock's instances have no replicas (a reload that drops
     * lock.redlock from the file cannot set this beside it either). */
    int replicas = lock_mod.redlock ? 0
                                    : lock_mod.ctx->cfg->lock.wait_replicas;
    if (replicas > 0) {
        grant_wait_replicas(op, replicas);
        return true;
    }
    acq_reply_granted(op);
    return false;
}

/* A reentry found the hold this daemon believed its owner had gone (a
 * fixed lease ran out, Redis lost it, an unlock by token): the holder
 * hears it before anything else, then the request is a new acquisition,
 * under a new token. Returns true when OP has been dealt with. */
static bool
acq_reenter_gone(struct lk_op *op, long long *v)
{
    struct lk_rec *rec = op->rec;
    if (rec->count > 0) {
        bool early = ld_now_ms() < rec->lease_end_ms;
        lk_rec_lost(rec, v[0] == LD_LOCK_ABSENT ? "expired" : "taken", false);
        if (early) {
            /* Gone before its lease: Redis may have lost data. */
            lk_recheck_start();
        }
    }
    if (op->req == NULL) {
        lk_op_free(op);
        return true;
    }
    if (v[0] == LD_LOCK_ABSENT) {
        acq_send(op);
        return true;
    }
    v[0] = LD_LOCK_TAKEN;
    return false;
}

/* Redis says someone else holds the lock for PTTL ms more: answer OP
 * false, or let it wait (a first try, or a reentry that found its hold
 * gone, waits like any other). */
static void
acq_on_taken(struct lk_op *op, long long pttl, bool queued)
{
    struct lk_rec *rec = op->rec;
    ld_stats.lock_contended++;
    if (op->req == NULL) {
        /* Answered already (its session closed, or it timed out). */
        lk_op_free(op);
        return;
    }
    if (queued) {
        /* May answer and free OP through acq_expire. */
        ld_lockwait_done(&op->w, LD_LOCKWAIT_TAKEN, pttl);
        return;
    }
    long long left = op->wait_ms == 0
                         ? 0
                         : ld_lockwait_left(op->wait_ms, op->req->start_us);
    if (left == 0 || rec->ls == NULL || lock_mod.stopping) {
        lk_acq_reply_false(op, pttl);
        lk_op_free(op);
        return;
    }
    if (lk_acq_refused_full(op)) {
        return;
    }
    lk_op_wait_add(op, rec->ls);
    ld_cancel_on(op->req, acq_cancel, op);
    ld_lockwait_join(&op->w, rec->n.hash, rec->n.hash_len, rec->n.chan,
                     rec->n.chan_len, left, true, pttl);
}

/* The end of an acquisition that failed (a single lock's or a group's):
 * its client hears why, its queue moves on, and OP is freed. */
void
lk_acq_failed(struct lk_op *op, const redisReply *r, int n, const long long *v,
              bool queued)
{
    if (op->req != NULL) {
        /* An answered request's failure is nobody's to hear of. */
        lk_op_fail(op, r, n, v, false);
    }
    lk_op_wait_end(op, queued, LD_LOCKWAIT_FAILED);
    lk_op_free(op);
}

/* When no more waiters may queue (limits.max_waiters), OP's request
 * hears so, OP is freed and true is returned. */
bool
lk_acq_refused_full(struct lk_op *op)
{
    if (!ld_lockwait_full()) {
        return false;
    }
    ld_reply_error(op->req, LD_E_BUSY,
                   "too many lock waiters (limits.max_waiters)");
    op->req = NULL;
    lk_op_free(op);
    return true;
}

/* Wrong type, Redis unreachable or an error reply. */
static void
acq_on_failure(struct lk_op *op, const redisReply *r, int n,
               const long long *v, bool queued)
{
    struct lk_rec *rec = op->rec;
    if (r == NULL && rec->count == 0 && rec->pending == 1 &&
        !lock_mod.stopping) {
        lk_acq_undo_unanswered(rec);
    }
    if (n >= 1 && v[0] == LD_LOCK_WRONG_TYPE) {
        log_warn("lock '%.*s': its redis keys hold data leased did not "
                 "write; nothing changed",
                 (int)rec->key_len, rec->key);
    }
    lk_acq_failed(op, r, n, v, queued);
}

static bool acq_refence(struct lk_op *op, const long long *v);
static void acq_refence_failed(struct lk_op *op, const redisReply *r, int n,
                               const long long *v, bool queued);

static void
acq_on_reply(redisReply *r, void *arg)
{
    long long v[4];
    int n;
    struct lk_op *op = lk_acq_reply_open(arg, r, v, &n);
    if (op == NULL) {
        return;
    }
    bool queued = op->w.q != NULL;
    if (op->refencing) {
        op->refencing = false;
        if (n < 4 || v[0] != LD_LOCK_GRANTED) {
            acq_refence_failed(op, r, n, v, queued);
            return;
        }
    }
    if (op->reenter && n >= 1 &&
        (v[0] == LD_LOCK_ABSENT || v[0] == LD_LOCK_OTHER) &&
        acq_reenter_gone(op, v)) {
        return;
    }
    if (n >= 4 && v[0] == LD_LOCK_GRANTED) {
        if (acq_refence(op, v)) {
            return;
        }
        bool kept = acq_granted(op, v[1], v[2], v[3]);
        lk_op_wait_end(op, queued, LD_LOCKWAIT_GRANTED);
        if (!kept) {
            lk_op_free(op);
        }
        return;
    }
    if (n >= 2 && v[0] == LD_LOCK_TAKEN) {
        acq_on_taken(op, v[1], queued);
        return;
    }
    acq_on_failure(op, r, n, v, queued);
}

/* For the read side of a read-write lock: whether the same owner holds
 * the write side, whose token then goes with the acquisition (rec->n.dg)
 * so that the read may join the write. */
static bool
rw_downgrade(struct lk_rec *rec)
{
    rec->n.dg[0] = '\0';
    if (rec->n.mode != LK_MODE_READ || rec->ls == NULL) {
        return false;
    }
    /* The write side's record differs only in the mode bits. */
    char *d = ld_xmalloc(rec->dkey_len);
    memcpy(d, rec->dkey, rec->dkey_len);
    uint32_t ol;
    memcpy(&ol, d, sizeof(ol));
    ol = (ol & ~((uint32_t)3 << 30)) | ((uint32_t)LK_MODE_WRITE << 30);
    memcpy(d, &ol, sizeof(ol));
    struct lk_rec *w = ld_dict_get(rec->ls->recs, d, rec->dkey_len);
    free(d);
    if (w == NULL || w->count == 0) {
        return false;
    }
    memcpy(rec->n.dg, w->token, sizeof(rec->n.dg));
    return true;
}

static void
acq_send(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    rw_downgrade(rec);
    /* While this daemon believes the owner holds the lock, the request is
     * a reentry and nothing else: should the hold be gone, the reply says
     * so, and only then is a new acquisition sent. */
    op->reenter = rec->count > 0;
    if (!op->reenter && rec->token_used && lk_rec_retoken(rec) != LD_OK) {
        log_error("no random bytes for a lock token");
    }
    long long max = lock_mod.ctx->cfg->lock.max_hold_ms;
    op->lease_ms = op->lease_asked;
    if (op->reenter) {
        op->lease_ms = lk_rec_cap_clip(rec, op->lease_ms);
    } else if (op->watchdog && max > 0 && op->lease_ms > max) {
        op->lease_ms = max;
    }
    char lbuf[24], fbuf[24];
    ld_ll_to_str(lbuf, op->lease_ms);
    ld_ll_to_str(fbuf, rec->fm->fence);
    /* ARGV[3]: "r" asks for a reentry only, else it is the fence floor.
     * A plain lock on one Redis leaves a floor above 0 out, and the fence
     * that comes back is held against it here (acq_refence): the argument
     * costs every acquisition, a counter that went back is rare. A
     * read-write lock's arguments go on after it; Redlock's fence is the
     * highest of its instances'. */
    op->floor_out = !op->reenter && rec->n.mode == LK_MODE_PLAIN &&
                    !lock_mod.redlock && rec->fm->fence > 0;
    const char *args[] = {rec->n.hash, rec->n.fence, lbuf, rec->token,
                          op->reenter ? "r" : fbuf};
    size_t lens[] = {rec->n.hash_len, rec->n.fence_len, strlen(lbuf),
                     LD_TOKEN_LEN, op->reenter ? 1 : strlen(fbuf)};
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    lk_script(LD_SCRIPT_lock_acquire, &rec->n, 2, op->floor_out ? 4 : 5, args,
              lens, acq_on_reply, op);
}

/* OP, sent without its floor, took a free lock with a fence at or below
 * the highest this daemon handed out for it: the counter went back. The
 * lock is held; lock_refence raises the counter past that fence and takes
 * the next, and its answer comes to acq_on_reply as the grant. Returns
 * true when it was sent. */
static bool
acq_refence(struct lk_op *op, const long long *v)
{
    struct lk_rec *rec = op->rec;
    if (!op->floor_out || v[1] != 1 || v[2] > rec->fm->fence) {
        return false;
    }
    op->floor_out = false;
    op->refencing = true;
    log_warn("lock '%.*s': fence %lld came back at or below %lld, handed "
             "out here before: the counter went back (Redis lost data?); "
             "raising it",
             (int)rec->key_len, rec->key, v[2], rec->fm->fence);
    char fbuf[24];
    ld_ll_to_str(fbuf, rec->fm->fence);
    const char *args[] = {rec->n.fence, fbuf};
    size_t lens[] = {rec->n.fence_len, strlen(fbuf)};
    op->inflight = true;
    lk_script(LD_SCRIPT_lock_refence, &rec->n, 1, 2, args, lens, acq_on_reply,
              op);
    return true;
}

/* lock_refence failed (no answer, an error, a counter leased did not
 * write): the hold the acquisition took stands with no fence to hand out.
 * It is given back as an unanswered acquisition's is, and OP fails. */
static void
acq_refence_failed(struct lk_op *op, const redisReply *r, int n,
                   const long long *v, bool queued)
{
    acq_undo_hold(op->rec);
    if (n >= 1 && v[0] == LD_LOCK_WRONG_TYPE) {
        log_warn("lock '%.*s': its fence counter holds data leased did not "
                 "write; the hold taken was given back",
                 (int)op->rec->key_len, op->rec->key);
    }
    lk_acq_failed(op, r, n, v, queued);
}

/* ld_lockwait calls these for queued requests. */
static void
acq_try(struct ld_lockwait *w)
{
    /* While stopping, every waiter is being answered and dropped; an
     * attempt now would only take a lock to give back. */
    struct lk_op *op = ld_container_of(w, struct lk_op, w);
    if (lock_mod.stopping || lock_mod.freed ||
        (op->ls != NULL && op->ls->closing)) {
        return;
    }
    if (op->grp != NULL) {
        lk_multi_try(op);
        return;
    }
    acq_send(op);
}

static bool
acq_cancel(void *arg)
{
    struct lk_op *op = arg;
    return ld_lockwait_cancel(&op->w);
}

static void
acq_expire(struct ld_lockwait *w, long long ttl_ms)
{
    struct lk_op *op = ld_container_of(w, struct lk_op, w);
    lk_acq_reply_false(op, ttl_ms);
    if (!op->inflight) {
        lk_op_free(op);
    } else {
        lk_op_wait_unlink(op);
    }
}

/* Queued requests make their attempts through these. */
void
lk_acq_init(void)
{
    ld_lockwait_set_handlers(acq_try, acq_expire);
}

/* lock with "token": reenter a lock held under that token, from any
 * session. Never waits and never takes a free lock. */
static void
acq_token_on_reply(redisReply *r, void *arg)
{
    long long v[4];
    int n;
    struct lk_op *op = lk_acq_reply_open(arg, r, v, &n);
    if (op == NULL) {
        return;
    }
    if (n >= 4 && v[0] == LD_LOCK_GRANTED) {
        struct lk_rec *rec = op->rec;
        long long fence = v[2];
        if (rec != NULL && rec->linked) {
            lk_rec_set_count(rec, v[1]);
            if (v[3] >= 0) {
                rec->lease_end_ms = op->sent_ms + (uint64_t)v[3];
            }
            lk_rec_cap_update(rec);
            lk_rec_arm_cap(rec);
            if (rec->fence > 0) {
                fence = rec->fence;
            }
        }
        ld_stats.lock_acquired++;
        json_t *body = json_pack(
            "{s:b,s:s%,s:I,s:I,s:I}", "acquired", 1, "token", op->field,
            op->field_len, "count", (json_int_t)v[1], "fence",
            (json_int_t)fence, "lease_ms",
            (json_int_t)(op->lease_ms > 0 && !lock_mod.redlock ? op->lease_ms
                                                               : v[3]));
        ld_reply_ok(op->req, body);
        op->req = NULL;
    } else {
        if (op->foreign && n >= 1 &&
            (v[0] == LD_LOCK_ABSENT || v[0] == LD_LOCK_OTHER)) {
            /* Found gone for another session: as an extend would. */
            lk_rec_forget_stale(op, op->rec, v[0]);
        }
        lk_op_fail(op, r, n, v, false);
    }
    lk_op_free(op);
}

/* The fields of a lock request with "key". */
struct lock_args {
    const char *key, *token;
    size_t klen, tlen;
    bool has_token;
    enum lk_mode mode;
    struct lk_lock_opts o;
};

/* The fields of a lock request besides what it locks, read into O (the
 * defaults when absent); false once REQ has been answered with why not. */
bool
lk_lock_opts_read(struct ld_req *req, struct lk_lock_opts *o)
{
    bool has_owner = false, has_wait = false;
    o->owner = "";
    o->olen = 0;
    o->ttl = o->wait = 0;
    o->has_ttl = o->detach = false;
    return ld_req_str(req, "owner", false, &o->owner, &o->olen, &has_owner) ==
               LD_OK &&
           ld_req_int(req, "ttl_ms", false, 1, LD_TTL_MS_MAX, &o->ttl,
                      &o->has_ttl) == LD_OK &&
           ld_req_int(req, "wait_ms", false, -1, LD_WAIT_MS_MAX, &o->wait,
                      &has_wait) == LD_OK &&
           ld_req_bool(req, "detach", &o->detach) == LD_OK;
}

/* OP acquires as O asks: the lease asked for (none: the watchdog's,
 * renewed) and how long it may wait. */
void
lk_op_asked(struct lk_op *op, const struct lk_lock_opts *o)
{
    op->watchdog = !o->has_ttl;
    op->lease_ms = o->has_ttl ? o->ttl : lock_mod.ctx->cfg->lock.watchdog_ms;
    op->lease_asked = op->lease_ms;
    op->wait_ms = o->wait;
}

/* The daemon can grant a lock now: not stopping, a Redlock majority
 * there, and a DETACHed lock has a lease of its own (HAS_TTL); false once
 * REQ has been answered with why not. */
bool
lk_lock_may_grant(struct ld_req *req, bool detach, bool has_ttl)
{
    if (lock_mod.stopping) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        return false;
    }
    if (lock_mod.redlock && ld_redlock_ready_count() < ld_redlock_quorum()) {
        /* No majority to grant it: no point waiting for one. */
        ld_reply_error(req, LD_E_REDIS_UNAVAILABLE,
                       "redlock: %d of %d instances reachable, a lock "
                       "needs %d",
                       ld_redlock_ready_count(), ld_redlock_count(),
                       ld_redlock_quorum());
        return false;
    }
    if (detach && !has_ttl) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'ttl_ms' is required with detach (a "
                       "detached lock is never renewed)");
        return false;
    }
    return true;
}

/* Read and check A's fields, and whether a lock may be granted now;
 * false once REQ has been answered with why not. */
static bool
lock_args_read(struct ld_req *req, struct lock_args *a)
{
    a->token = "";
    a->tlen = 0;
    a->has_token = false;
    if (ld_req_key(req, "key", &a->key, &a->klen) != LD_OK ||
        !lk_lock_opts_read(req, &a->o) ||
        ld_req_str(req, "token", false, &a->token, &a->tlen, &a->has_token) !=
            LD_OK) {
        return false;
    }
    if (a->has_token && !lk_token_check(req, a->token, a->tlen)) {
        return false;
    }
    return lk_lock_may_grant(req, a->o.detach, a->o.has_ttl);
}

/* lock with "token": a reentry of that hold only, never a wait. */
static void
lock_by_token(struct ld_req *req, const struct lock_args *a)
{
    struct lk_target t = {a->key,   a->klen, a->o.owner, a->o.olen,
                          a->token, a->tlen, true,       a->mode};
    struct lk_op *op = lk_target_op(LK_ACQ_TOKEN, req, &t);
    op->lease_ms = a->o.has_ttl ? lk_rec_cap_clip(op->rec, a->o.ttl) : 0;
    const struct lk_names *n = lk_op_names(op);
    char lbuf[24];
    ld_ll_to_str(lbuf, op->lease_ms);
    const char *args[] = {n->hash, n->fence, lbuf, op->field, "r"};
    size_t lens[] = {n->hash_len, n->fence_len, strlen(lbuf), op->field_len,
                     1};
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    lk_script(LD_SCRIPT_lock_acquire, n, 2, 5, args, lens, acq_token_on_reply,
              op);
}

/* The record of (session, owner, key) for A, made when there is none;
 * NULL once REQ has been answered with why it cannot be used. */
static struct lk_rec *
lock_rec_get(struct ld_req *req, struct lk_sess *ls, const struct lock_args *a)
{
    size_t dlen;
    char *d = lk_dkey_build_mode(a->o.owner, a->o.olen, a->key, a->klen,
                                 a->mode, &dlen);
    struct lk_rec *rec = ld_dict_get(ls->recs, d, dlen);
    if (rec == NULL) {
        rec = lk_rec_new(ls, d, dlen, a->key, a->klen, a->o.detach, a->mode);
        if (rec == NULL) {
            free(d);
            ld_reply_error(req, LD_E_INTERNAL, "no random bytes for a token");
        }
        return rec;
    }
    free(d);
    if (rec->group) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "this owner holds lock '%.*s' in a group "
                       "(\"keys\"), which is not reentrant",
                       (int)a->klen, a->key);
        return NULL;
    }
    if (rec->detached != a->o.detach) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'detach' does not match: this owner "
                       "holds lock '%.*s' %s",
                       (int)a->klen, a->key,
                       rec->detached ? "detached" : "session-bound");
        return NULL;
    }
    return rec;
}

/* Queue OP behind the others waiting for its lock here. */
static void
lock_wait(struct lk_op *op, struct lk_sess *ls)
{
    struct lk_rec *rec = op->rec;
    if (lk_acq_refused_full(op)) {
        return;
    }
    long long left = ld_lockwait_left(op->wait_ms, op->req->start_us);
    lk_op_wait_add(op, ls);
    ld_cancel_on(op->req, acq_cancel, op);
    ld_lockwait_join(&op->w, rec->n.hash, rec->n.hash_len, rec->n.chan,
                     rec->n.chan_len, left, false, 0);
}

void
lk_op_lock(struct ld_req *req)
{
    struct lock_args a;
    if (lk_req_mode(req, &a.mode) != LD_OK || ld_evict_refuse(req)) {
        return;
    }
    if (lk_multi_asked(req)) {
        lk_multi_lock(req);
        return;
    }
    if (!lock_args_read(req, &a)) {
        return;
    }
    if (a.has_token) {
        lock_by_token(req, &a);
        return;
    }
    struct lk_sess *ls = lk_sess_get(req->sess, true);
    struct lk_rec *rec = lock_rec_get(req, ls, &a);
    if (rec == NULL) {
        return;
    }
    struct lk_op *op = lk_op_new(LK_ACQ, req, rec);
    rec->pending++;
    lk_op_asked(op, &a.o);

    /* A reentry never waits, nor does a writer's read of its own lock
     * (downgrade: waiting behind writers that wait for it would never
     * end), and a try-once goes straight to Redis even when others wait
     * here, except a reader's: once a writer waits, readers queue behind
     * it, and a try-once reader does not get ahead of it. */
    bool down = rw_downgrade(rec);
    if (a.mode == LK_MODE_READ && a.o.wait == 0 && rec->count == 0 && !down &&
        ld_lockwait_queued(rec->n.hash, rec->n.hash_len)) {
        ld_stats.lock_contended++;
        lk_acq_reply_false(op, -1);
        lk_op_free(op);
        return;
    }
    if (rec->count > 0 || a.o.wait == 0 || down) {
        acq_send(op);
        return;
    }
    lock_wait(op, ls);
}
