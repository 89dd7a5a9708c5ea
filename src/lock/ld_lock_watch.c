/* Locks: the timers that end a hold this daemon can no longer vouch
 * for (lock_lost, max_hold), what the watchdog pass does for one lock
 * (renew it, or check a fixed lease, and tell a holder when a renewal
 * fails or is late: lock_at_risk, then lock_safe) and what a renewal's
 * answer means. The pass itself, its bounds and the rechecks are the
 * lease engine's (ld_lease.c); this file must not run a pass of its own
 * nor touch a record's Redis keys other than through lock_renew and
 * lock_renew_many. */

#include "ld_lock_int.h"

#include "ld_lock.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_redis.h"
#include "ld_redlock.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The margin before a watchdog lease's end (ld_lease_margin_ms). */
static uint64_t
lost_margin_ms(void)
{
    return ld_lease_margin_ms(&lock_mod.pass);
}

static void renew_send(struct lk_rec *rec, enum lk_kind kind, long long lease);

/* The most watchdog renewals in one lock_renew_many call: enough that
 * Redis' fixed cost per command is a small part of each, few enough that
 * one call keeps Redis from its other clients for well under a
 * millisecond. */
#define RENEW_MANY_MAX 32

/* REC's lease (or max_hold) can no longer be proven and lock_lost goes
 * out now (ld_lease_note_late). */
static void
lost_late_note(const struct lk_rec *rec)
{
    uint64_t due = ld_lease_vouch_end(&lock_mod.pass, rec->lease_end_ms);
    if (rec->cap_end_ms != 0 && rec->cap_end_ms < due) {
        due = rec->cap_end_ms;
    }
    if (rec->ls != NULL) {
        ld_lease_note_late("lock", due, rec->ls->sess->name);
    }
}

static void
cap_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct lk_rec *rec = arg;
    if (rec->count == 0) {
        return;
    }
    if (rec->renew_early) {
        rec->renew_early = false;
        if (!rec->renewing && rec->ls != NULL) {
            renew_send(rec, LK_RENEW,
                       lk_rec_cap_clip(rec,
                                       lock_mod.ctx->cfg->lock.watchdog_ms));
        }
        lk_rec_arm_cap(rec);
        return;
    }
    /* The timer fires at the cap, or a margin before the lease ends. A
     * lease that was clipped at max_hold ends there (Redis reports it a
     * few ms short of the clip, the time the script took): the cap is
     * the reason, not Redis. */
    bool cap = rec->cap_end_ms != 0 &&
               rec->lease_end_ms + lost_margin_ms() >= rec->cap_end_ms;
    lost_late_note(rec);
    rec->refs++;
    lk_rec_lost(rec, cap ? "max_hold" : "redis_unavailable", true);
    lk_rec_unref(rec);
}

/* When a watchdog lease that ends at LOST_AT (less the margin) must be
 * renewed on its own (UINT64_MAX: the passes will do). An extend or a
 * reentry with a short ttl_ms leaves it less than the passes count on
 * (a period after the next pass, to renew and hear back), so it is
 * renewed a third into what is left, as a pass renews a full lease. A
 * lease clipped at max_hold ends there whatever renews it. */
static uint64_t
early_renew_at(const struct lk_rec *rec, uint64_t lost_at)
{
    if (rec->renewing ||
        lost_at >= lock_mod.pass.next_ms +
                       (uint64_t)ld_lease_pass_period_ms(&lock_mod.pass) ||
        (rec->cap_end_ms != 0 &&
         rec->lease_end_ms + lost_margin_ms() >= rec->cap_end_ms)) {
        return UINT64_MAX;
    }
    uint64_t now = ld_now_ms();
    return lost_at > now ? now + (lost_at - now) / 3 : UINT64_MAX;
}

/* Arm the one timer of a held record for the earliest of: an early
 * renewal (early_renew_at), the moment the daemon can no longer prove a
 * watchdog lease (lease end minus the margin), and max_hold. Called
 * whenever one of them changes. */
void
lk_rec_arm_cap(struct lk_rec *rec)
{
    rec->renew_early = false;
    if (rec->count == 0) {
        return;
    }
    uint64_t at = UINT64_MAX;
    if (rec->watchdog && rec->ls != NULL) {
        at = ld_lease_vouch_end(&lock_mod.pass, rec->lease_end_ms);
        uint64_t early = early_renew_at(rec, at);
        if (early < at) {
            at = early;
            rec->renew_early = true;
        }
    }
    if (rec->cap_end_ms != 0 && rec->cap_end_ms < at) {
        at = rec->cap_end_ms;
        rec->renew_early = false;
    }
    if (at == UINT64_MAX) {
        if (rec->cap_ev != NULL) {
            evtimer_del(rec->cap_ev);
        }
        return;
    }
    ld_lease_timer_arm(&lock_mod.pass, &rec->cap_ev, cap_on_timer, rec, at);
}

/* Follow lock.max_hold_ms (reloads apply) for a watchdog-renewed lock. */
void
lk_rec_cap_update(struct lk_rec *rec)
{
    long long max = lock_mod.ctx->cfg->lock.max_hold_ms;
    if (!rec->watchdog || max <= 0 || rec->count == 0) {
        rec->cap_end_ms = 0;
    } else {
        rec->cap_end_ms = rec->acquired_ms + (uint64_t)max;
    }
}

/* Milliseconds left under max_hold (LLONG_MAX when no cap applies; 0 or
 * less once reached). */
static long long
rec_cap_left(const struct lk_rec *rec)
{
    if (rec == NULL || rec->cap_end_ms == 0) {
        return LLONG_MAX;
    }
    return (long long)rec->cap_end_ms - (long long)ld_now_ms();
}

/* A lease to set on REC (grant, reentry, renewal, extend), clipped so that
 * it never runs past max_hold. */
long long
lk_rec_cap_clip(const struct lk_rec *rec, long long lease)
{
    long long left = rec_cap_left(rec);
    if (lease > left) {
        lease = left > 1 ? left : 1;
    }
    return lease;
}

/* ------------------------------------------------------------ watchdog */

/* A renewal of REC failed, or is late (see pass_visit), while the lease
 * it last confirmed may still hold: the holder hears it at once, once
 * until a renewal confirms the lease again, so that it can finish or
 * pause its writes before lock_lost. Nothing is sent once the lease
 * (less the margin) has passed: lock_lost is due then. */
static void
rec_at_risk(struct lk_rec *rec)
{
    uint64_t now = ld_now_ms();
    uint64_t end = rec->lease_end_ms;
    uint64_t m = lost_margin_ms();
    if (rec->at_risk || rec->ls == NULL || end <= now + m) {
        return;
    }
    rec->at_risk = true;
    json_t *ev = ld_lease_event("lock", "at_risk", rec->key, rec->key_len,
                                rec->token);
    json_object_set_new(ev, "lease_left_ms", json_integer(end - m - now));
    ld_session_event(rec->ls->sess, ev);
    log_info("lock at risk lease_left_ms=%llu session=%s",
             (unsigned long long)(end - m - now), rec->ls->sess->name);
}

/* A renewal confirmed a lease of LEASE ms after lock_at_risk. */
static void
rec_safe(struct lk_rec *rec, long long lease)
{
    rec->at_risk = false;
    json_t *ev = ld_lease_event("lock", "safe", rec->key, rec->key_len,
                                rec->token);
    json_object_set_new(ev, "lease_ms", json_integer(lease));
    ld_session_event(rec->ls->sess, ev);
    log_info("lock safe again session=%s", rec->ls->sess->name);
}

/* A renewal or check found REC held, for PTTL ms more, COUNT times. */
static void
renew_held(struct lk_rec *rec, const struct lk_op *op, long long pttl,
           long long count)
{
    bool renew = op->kind == LK_RENEW;
    if (renew) {
        ld_stats.lock_renewals_ok++;
    }
    if (pttl < 0) {
        /* Someone removed the expiry; look again in a while. */
        pttl = lock_mod.ctx->cfg->lock.watchdog_ms;
    }
    rec->lease_end_ms = op->sent_ms + (uint64_t)pttl;
    if (count > 0) {
        lk_rec_set_count(rec, count);
    }
    if (renew && rec->at_risk) {
        rec_safe(rec, pttl);
    }
    lk_rec_arm_cap(rec);
}

/* A renewal or check found REC gone (CODE < 0). Found gone before the
 * lease it last confirmed could end in Redis: Redis lost data (FLUSHALL,
 * a restart without persistence, an eviction), so look at every lock at
 * once. */
static void
renew_gone(struct lk_rec *rec, const struct lk_op *op, long long code)
{
    bool early = ld_now_ms() < rec->lease_end_ms;
    if (code == LD_LOCK_WRONG_TYPE) {
        log_warn("lock '%.*s': its redis key holds data leased did not "
                 "write",
                 (int)rec->key_len, rec->key);
    }
    /* FORCED: an operator took it (lock.force_unlock), not data loss, so
     * no recheck of the others. */
    bool forced = code == LD_LOCK_FORCED;
    const char *why = op->after_failover       ? "failover"
                      : code == LD_LOCK_ABSENT ? "expired"
                                               : "taken";
    if (op->kind == LK_RENEW) {
        ld_stats.lock_renewals_failed++;
        lk_rec_lost(rec, why, false);
    } else if (early || op->after_failover) {
        lk_rec_lost(rec, why, false);
    } else {
        /* A fixed lease ran out: that is what the client asked for. */
        lk_rec_set_count(rec, 0);
    }
    if (early && code != LD_LOCK_WRONG_TYPE && !forced) {
        lk_recheck_start();
    }
}

/* A renewal got no answer. The lease last confirmed still holds (with
 * Redlock, on a majority, less the drift: a renewal that reached only
 * some instances lengthens theirs, never shortens the others'); the
 * timer ends the lock with it unless a renewal confirms it. */
static void
renew_unanswered(struct lk_rec *rec)
{
    ld_stats.lock_renewals_failed++;
    if (ld_now_ms() >= rec->lease_end_ms) {
        lost_late_note(rec);
        lk_rec_lost(rec, "redis_unavailable", true);
    } else {
        rec_at_risk(rec);
    }
}

/* What a renewal or check OP found: N numbers V (fewer than one: no
 * answer, or not one the script gives). */
static void
renew_found(struct lk_op *op, const long long *v, int n)
{
    struct lk_rec *rec = op->rec;
    LD_ASSERT(rec->renewing && lock_mod.pass.inflight > 0);
    rec->renewing = false;
    ld_lease_pass_answered(&lock_mod.pass);
    /* Replies come in command order, so a record that was released or
     * lost meanwhile simply ignores what this renewal found. */
    if (lock_mod.freed || !rec->linked || rec->count == 0 || rec->ls == NULL) {
        lk_op_free(op);
        return;
    }
    if (n >= 3 && v[0] == LD_LOCK_HELD) {
        renew_held(rec, op, v[1], v[2]);
    } else if (n >= 1 && v[0] < 0) {
        renew_gone(rec, op, v[0]);
    } else {
        if (op->kind == LK_RENEW) {
            renew_unanswered(rec);
        }
        if (op->recheck) {
            /* Redis, just back, may still refuse: look again soon, not
             * a pass later (ld_lease_pass_retry). */
            ld_lease_pass_retry(&lock_mod.pass, op->after_failover);
        }
    }
    lk_op_free(op);
}

static void
renew_on_reply(redisReply *r, void *arg)
{
    long long v[3] = {0, 0, 0};
    int n = ld_lease_reply_ints(r, v, 3);
    renew_found(arg, v, n);
}

/* A renewal or check of REC about to leave. */
static struct lk_op *
renew_op(struct lk_rec *rec, enum lk_kind kind, long long lease)
{
    struct lk_op *op = lk_op_new(kind, NULL, rec);
    op->lease_ms = lease;
    rec->renewing = true;
    /* The replies of this pass come after it ends: they carry the
     * reason with them. */
    op->after_failover = lock_mod.pass.after_failover;
    op->sent_ms = ld_now_ms();
    rec->renew_sent_ms = op->sent_ms;
    op->inflight = true;
    op->recheck = ld_lease_pass_sent(&lock_mod.pass);
    return op;
}

static void
renew_op_send(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", op->lease_ms);
    const char *args[] = {rec->n.hash, rec->n.forced, rec->token, lbuf, "1"};
    size_t lens[] = {rec->n.hash_len, rec->n.forced_len, LD_TOKEN_LEN,
                     strlen(lbuf), 1};
    lk_script(LD_SCRIPT_lock_renew, &rec->n, 2, 5, args, lens, renew_on_reply,
              op);
}

static void
renew_send(struct lk_rec *rec, enum lk_kind kind, long long lease)
{
    renew_op_send(renew_op(rec, kind, lease));
}

/* The renewals a pass step holds for one lock_renew_many call. */
struct renew_many {
    int n;
    struct lk_op *op[RENEW_MANY_MAX];
};

/* Held renewals by connection: a lock's commands all take the connection
 * its hash name picks (ld_redis_route_lane), so that their replies come in the
 * order they were sent (renew_found relies on it), and so do the
 * renewals sent together, by the first one's name. */
static struct renew_many *held_many[LD_REDIS_CONNS_MAX];

static unsigned
renew_lane(const struct lk_rec *rec)
{
    return ld_redis_route_lane(rec->n.hash, rec->n.hash_len);
}

/* Whether a watchdog renewal of REC may go in a lock_renew_many call:
 * its keys share a connection with the others (not cluster mode, where
 * they share no slot, nor Redlock, nor the lock pool of
 * lock.wait_replicas, whose connections are picked among others) and it
 * is a plain lock (read-write locks renew with rw_renew). */
static bool
renew_many_fits(const struct lk_rec *rec)
{
    const struct ld_config *cfg = lock_mod.ctx->cfg;
    return !lock_mod.redlock && rec->n.mode == LK_MODE_PLAIN &&
           cfg->redis.mode != LD_REDIS_CLUSTER && cfg->lock.wait_replicas == 0;
}

static void
renew_many_on_reply(redisReply *r, void *arg)
{
    struct renew_many *m = arg;
    bool whole = r != NULL && r->type == REDIS_REPLY_ARRAY &&
                 r->elements == (size_t)m->n * 3;
    for (int i = 0; i < m->n; i++) {
        long long v[3] = {0, 0, 0};
        int n = -1;
        for (int k = 0; whole && k < 3; k++) {
            const redisReply *e = r->element[i * 3 + k];
            if (e->type != REDIS_REPLY_INTEGER) {
                n = -1;
                break;
            }
            v[k] = e->integer;
            n = k + 1;
        }
        renew_found(m->op[i], v, n);
    }
    free(m);
}

static void
renew_many_send_lane(unsigned lane)
{
    struct renew_many *m = held_many[lane];
    held_many[lane] = NULL;
    if (m == NULL) {
        return;
    }
    if (m->n == 1) {
        renew_op_send(m->op[0]);
        free(m);
        return;
    }
    const char *args[RENEW_MANY_MAX * 4];
    size_t lens[RENEW_MANY_MAX * 4];
    char lbuf[RENEW_MANY_MAX][24];
    int nk = m->n * 2;
    for (int i = 0; i < m->n; i++) {
        struct lk_rec *rec = m->op[i]->rec;
        snprintf(lbuf[i], sizeof(lbuf[i]), "%lld", m->op[i]->lease_ms);
        args[2 * i] = rec->n.hash;
        lens[2 * i] = rec->n.hash_len;
        args[2 * i + 1] = rec->n.forced;
        lens[2 * i + 1] = rec->n.forced_len;
        args[nk + 2 * i] = rec->token;
        lens[nk + 2 * i] = LD_TOKEN_LEN;
        args[nk + 2 * i + 1] = lbuf[i];
        lens[nk + 2 * i + 1] = strlen(lbuf[i]);
    }
    lk_script(LD_SCRIPT_lock_renew_many, &m->op[0]->rec->n, nk, nk * 2, args,
              lens, renew_many_on_reply, m);
}

/* The end of a pass step: every renewal held leaves. */
static void
renew_many_send(void)
{
    for (unsigned i = 0; i < LD_REDIS_CONNS_MAX; i++) {
        renew_many_send_lane(i);
    }
}

/* A watchdog renewal of REC for LEASE ms: held for one call with the
 * others of this step that take its connection where it fits, else sent
 * alone. */
static void
renew_watchdog(struct lk_rec *rec, long long lease)
{
    if (!renew_many_fits(rec)) {
        renew_send(rec, LK_RENEW, lease);
        return;
    }
    unsigned lane = renew_lane(rec);
    if (held_many[lane] == NULL) {
        held_many[lane] = ld_xcalloc(1, sizeof(*held_many[lane]));
    }
    struct renew_many *m = held_many[lane];
    m->op[m->n++] = renew_op(rec, LK_RENEW, lease);
    if (m->n == RENEW_MANY_MAX) {
        renew_many_send_lane(lane);
    }
}

/* What the pass does for one record: renew a watchdog lock, stop renewing
 * at max_hold, check that a fixed lease is still there. A fixed lease is
 * looked at on every pass too (a check writes nothing), so that one
 * Redis lost early (FLUSHALL, a restart without persistence, an
 * eviction) is reported within a pass, not never. */
static void
pass_visit(struct lk_rec *rec, uint64_t now)
{
    const struct ld_config *cfg = lock_mod.ctx->cfg;
    if (rec->ls == NULL) {
        return;
    }
    if (!rec->watchdog) {
        if (!rec->renewing) {
            renew_send(rec, LK_CHECK, 0);
        }
        return;
    }
    if (rec->renewing) {
        /* The last renewal is still out; when the lease has passed
         * meanwhile, Redis was unreachable for longer than it. Out for
         * half a period or more, it is late: the lease is at risk. One
         * sent just before this pass (an early renewal) gets until the
         * next. */
        if (now >= rec->lease_end_ms) {
            lost_late_note(rec);
            rec->refs++;
            lk_rec_lost(rec, "redis_unavailable", true);
            lk_rec_unref(rec);
        } else if (ld_lease_renew_late(&lock_mod.pass, rec->renew_sent_ms,
                                       now)) {
            rec_at_risk(rec);
        }
        return;
    }
    lk_rec_cap_update(rec);
    long long left = rec_cap_left(rec);
    if (left <= 0) {
        /* max_hold is reached: the timer ends the lock now. */
        lk_rec_arm_cap(rec);
        return;
    }
    /* The renewals near max_hold end the lease exactly there. */
    renew_watchdog(rec, lk_rec_cap_clip(rec, cfg->lock.watchdog_ms));
    lk_rec_arm_cap(rec);
}

/* The pass starts at the first held record. The cursor survives records
 * leaving the list (held_unlink moves it on); records added meanwhile
 * are new and wait for the next pass. */
static void
pass_begin(void)
{
    lock_mod.cursor = TAILQ_FIRST(&lock_mod.held);
}

static bool
pass_more(void)
{
    return lock_mod.cursor != NULL;
}

static void
pass_next(uint64_t now)
{
    struct lk_rec *rec = lock_mod.cursor;
    LD_ASSERT(rec->in_held);
    lock_mod.cursor = TAILQ_NEXT(rec, held_entry);
    pass_visit(rec, now);
}

static const struct ld_lease_pass_fns pass_fns = {pass_begin, pass_more,
                                                  pass_next, renew_many_send};

/* Check every held lock now (ld_lease_pass_recheck), unless the module
 * is stopping. */
void
lk_recheck_start(void)
{
    if (lock_mod.freed || lock_mod.stopping) {
        return;
    }
    ld_lease_pass_recheck(&lock_mod.pass);
}

void
ld_lock_failover(void)
{
    ld_lease_pass_failover(&lock_mod.pass);
}

static void
on_redis_state(bool up, void *arg)
{
    LD_UNUSED(arg);
    if (up) {
        lk_recheck_start();
    }
}

/* The watchdog's one periodic timer, and rechecks when Redis is back. */
void
lk_watch_init(void)
{
    ld_lease_pass_init(&lock_mod.pass, lock_mod.ctx, &pass_fns);
    if (lock_mod.redlock) {
        ld_redlock_on_state(on_redis_state, NULL);
    } else {
        ld_redis_on_state(on_redis_state, NULL);
    }
}

void
lk_watch_free(void)
{
    ld_lease_pass_free(&lock_mod.pass);
}
