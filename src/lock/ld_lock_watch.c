/* Locks: the timers that end a hold this daemon can no longer vouch
 * for (lock_lost, max_hold), the watchdog pass that renews leases (and
 * tells a holder when a renewal fails or is late: lock_at_risk, then
 * lock_safe), and the rechecks of every lock when Redis may have lost
 * them. */

#include "ld_lock_int.h"

#include "ld_lock.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_redlock.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

/* How long before the end of a confirmed watchdog lease the daemon stops
 * vouching for it: the lease is counted from when the confirming command
 * was sent, which is never later than Redis started it, and the margin
 * covers the clocks of the two hosts drifting apart (1% of a watchdog
 * lease, as for Redlock) and the event's way to the client (2 ms). */
static uint64_t
lost_margin_ms(void)
{
    return 2 + (uint64_t)lock_mod.ctx->cfg->lock.watchdog_ms / 100;
}

static void renew_send(struct lk_rec *rec, enum lk_kind kind, long long lease);
static long long pass_period_ms(void);

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
        lost_at >= lock_mod.next_pass_ms + (uint64_t)pass_period_ms() ||
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
        uint64_t m = lost_margin_ms();
        at = rec->lease_end_ms > m ? rec->lease_end_ms - m : 0;
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
    if (rec->cap_ev == NULL) {
        rec->cap_ev = evtimer_new(lock_mod.ctx->base, cap_on_timer, rec);
        if (rec->cap_ev == NULL) {
            ld_oom(0);
        }
    }
    uint64_t now = ld_now_ms();
    uint64_t ms = at > now ? at - now : 0;
    struct timeval tv = tv_ms((long long)ms);
    evtimer_add(rec->cap_ev, &tv);
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

static void pass_continue(void);

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
    json_t *ev = json_pack("{s:s,s:s%,s:s,s:I}", "event", "lock_at_risk",
                           "key", rec->key, rec->key_len, "token", rec->token,
                           "lease_left_ms", (json_int_t)(end - m - now));
    ld_session_event(rec->ls->sess, ev);
    log_info("lock at risk lease_left_ms=%llu session=%s",
             (unsigned long long)(end - m - now), rec->ls->sess->name);
}

/* A renewal confirmed a lease of LEASE ms after lock_at_risk. */
static void
rec_safe(struct lk_rec *rec, long long lease)
{
    rec->at_risk = false;
    json_t *ev = json_pack("{s:s,s:s%,s:s,s:I}", "event", "lock_safe", "key",
                           rec->key, rec->key_len, "token", rec->token,
                           "lease_ms", (json_int_t)lease);
    ld_session_event(rec->ls->sess, ev);
    log_info("lock safe again session=%s", rec->ls->sess->name);
}

static void
renew_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    LD_ASSERT(rec->renewing && lock_mod.renew_inflight > 0);
    rec->renewing = false;
    lock_mod.renew_inflight--;
    if (lock_mod.passing && !lock_mod.freed &&
        lock_mod.renew_inflight <= RENEW_INFLIGHT_MAX / 2) {
        pass_continue();
    }
    /* Replies come in command order, so a record that was released or
     * lost meanwhile simply ignores what this renewal found. */
    if (lock_mod.freed || !rec->linked || rec->count == 0 || rec->ls == NULL) {
        lk_op_free(op);
        return;
    }
    bool renew = op->kind == LK_RENEW;
    long long v[3] = {0, 0, 0};
    int n = lk_reply_ints(r, v, 3);
    if (n >= 3 && v[0] == LD_LOCK_HELD) {
        if (renew) {
            ld_stats.lock_renewals_ok++;
        }
        long long pttl = v[1];
        if (pttl < 0) {
            /* Someone removed the expiry; look again in a while. */
            pttl = lock_mod.ctx->cfg->lock.watchdog_ms;
        }
        rec->lease_end_ms = op->sent_ms + (uint64_t)pttl;
        if (v[2] > 0) {
            lk_rec_set_count(rec, v[2]);
        }
        if (renew && rec->at_risk) {
            rec_safe(rec, pttl);
        }
        lk_rec_arm_cap(rec);
    } else if (n >= 1 && v[0] < 0) {
        /* Found gone before the lease it last confirmed could end in
         * Redis: Redis lost data (FLUSHALL, a restart without
         * persistence, an eviction), so look at every lock at once. */
        bool early = ld_now_ms() < rec->lease_end_ms;
        if (v[0] == LD_LOCK_WRONG_TYPE) {
            log_warn("lock '%.*s': its redis key holds data leased did not "
                     "write",
                     (int)rec->key_len, rec->key);
        }
        /* FORCED: an operator took it (lock.force_unlock), not data
         * loss, so no recheck of the others. */
        bool forced = v[0] == LD_LOCK_FORCED;
        const char *why = op->after_failover       ? "failover"
                          : v[0] == LD_LOCK_ABSENT ? "expired"
                                                   : "taken";
        if (renew) {
            ld_stats.lock_renewals_failed++;
            lk_rec_lost(rec, why, false);
        } else if (early || op->after_failover) {
            lk_rec_lost(rec, why, false);
        } else {
            /* A fixed lease ran out: that is what the client asked for. */
            lk_rec_set_count(rec, 0);
        }
        if (early && v[0] != LD_LOCK_WRONG_TYPE && !forced) {
            lk_recheck_start();
        }
    } else if (renew) {
        ld_stats.lock_renewals_failed++;
        /* The lease last confirmed still holds (with Redlock, on a
         * majority, less the drift: a renewal that reached only some
         * instances lengthens theirs, never shortens the others'); the
         * timer ends the lock with it unless a renewal confirms it. */
        if (ld_now_ms() >= rec->lease_end_ms) {
            lk_rec_lost(rec, "redis_unavailable", true);
        } else {
            rec_at_risk(rec);
        }
    }
    lk_op_free(op);
}

static void
renew_send(struct lk_rec *rec, enum lk_kind kind, long long lease)
{
    struct lk_op *op = lk_op_new(kind, NULL, rec);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", lease);
    const char *args[] = {rec->n.hash, rec->n.forced, rec->token, lbuf, "1"};
    size_t lens[] = {rec->n.hash_len, rec->n.forced_len, LD_TOKEN_LEN,
                     strlen(lbuf), 1};
    rec->renewing = true;
    /* The replies of this pass come after it ends: they carry the
     * reason with them. */
    op->after_failover = lock_mod.after_failover;
    op->sent_ms = ld_now_ms();
    rec->renew_sent_ms = op->sent_ms;
    op->inflight = true;
    lock_mod.renew_inflight++;
    lk_script(LD_SCRIPT_lock_renew, &rec->n, 2, 5, args, lens, renew_on_reply,
              op);
}

static long long
pass_period_ms(void)
{
    long long p = lock_mod.ctx->cfg->lock.watchdog_ms / 3;
    return p > 0 ? p : 1;
}

static void
pass_arm(void)
{
    long long ms = pass_period_ms();
    struct timeval tv = tv_ms((long long)ms);
    lock_mod.next_pass_ms = ld_now_ms() + (uint64_t)ms;
    evtimer_add(lock_mod.pass_ev, &tv);
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
            rec->refs++;
            lk_rec_lost(rec, "redis_unavailable", true);
            lk_rec_unref(rec);
        } else if (now >= rec->renew_sent_ms &&
                   now - rec->renew_sent_ms >=
                       (uint64_t)pass_period_ms() / 2) {
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
    renew_send(rec, LK_RENEW, lk_rec_cap_clip(rec, cfg->lock.watchdog_ms));
    lk_rec_arm_cap(rec);
}

/* One step of the pass. The renewals of a step leave pipelined, in one
 * write per connection. The cursor survives records leaving the list
 * (held_unlink moves it on); records added meanwhile are new and wait for
 * the next pass. */
static void
pass_step(void *arg)
{
    LD_UNUSED(arg);
    uint64_t now = ld_now_ms();
    int visited = 0;
    while (lock_mod.cursor != NULL && visited < PASS_STEP &&
           lock_mod.renew_inflight < RENEW_INFLIGHT_MAX) {
        struct lk_rec *rec = lock_mod.cursor;
        LD_ASSERT(rec->in_held);
        lock_mod.cursor = TAILQ_NEXT(rec, held_entry);
        pass_visit(rec, now);
        visited++;
    }
    if (lock_mod.cursor == NULL) {
        if (lock_mod.check_all) {
            lock_mod.after_failover = false;
        }
        lock_mod.passing = false;
        lock_mod.check_all = false;
    } else if (lock_mod.renew_inflight < RENEW_INFLIGHT_MAX) {
        pass_continue();
    }
    /* else: renew_on_reply continues once replies have come back. */
}

static void
pass_continue(void)
{
    ld_defer_kick(&lock_mod.step);
}

/* The one periodic timer starts a pass over every held lock, unless the
 * last one is still going (Redis slow), which then simply goes on. */
static void
pass_run(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    if (!lock_mod.passing) {
        lock_mod.passing = true;
        lock_mod.cursor = TAILQ_FIRST(&lock_mod.held);
    }
    pass_step(NULL);
    pass_arm();
}

/* Check every held lock now, fixed leases too, in one pass bounded like
 * the watchdog's: Redis came back (it may have restarted without its
 * data) or a lock was found gone before its lease. Locks that did not
 * survive are reported at once instead of a pass later, and fixed-lease
 * locks at all. */
void
lk_recheck_start(void)
{
    if (lock_mod.freed || lock_mod.stopping ||
        (lock_mod.passing && lock_mod.check_all)) {
        return;
    }
    lock_mod.check_all = true;
    lock_mod.passing = true;
    lock_mod.cursor = TAILQ_FIRST(&lock_mod.held);
    pass_continue();
}

void
ld_lock_failover(void)
{
    lock_mod.after_failover = true;
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
    lock_mod.pass_ev = evtimer_new(lock_mod.ctx->base, pass_run, NULL);
    if (lock_mod.pass_ev == NULL) {
        ld_oom(0);
    }
    ld_defer_init(&lock_mod.step, lock_mod.ctx->base, pass_step, NULL);
    pass_arm();
    if (lock_mod.redlock) {
        ld_redlock_on_state(on_redis_state, NULL);
    } else {
        ld_redis_on_state(on_redis_state, NULL);
    }
}

void
lk_watch_free(void)
{
    event_free(lock_mod.pass_ev);
    lock_mod.pass_ev = NULL;
    ld_defer_free(&lock_mod.step);
}
