/* Semaphores: what the watchdog pass does for one grant (renew a
 * session-bound grant without a fixed lease, with the lock watchdog's
 * lease, lock.watchdog_ms; check a fixed lease), what its answer means,
 * and the sem_lost event, sent as lock_lost is for locks: when a renewal
 * or check finds the grant gone before its lease, or at the latest when
 * the lease last confirmed ends (less a margin) without a renewal having
 * confirmed a newer one; before it, sem_at_risk when a renewal fails or
 * is late, and sem_safe when a later one confirms the lease. The pass,
 * its bounds, the rechecks when Redis may have lost grants and the lost
 * margin are the lease engine's (ld_lease.c), the same as for locks;
 * this file must not run a pass of its own nor touch the grants' lists
 * (ld_sem.c owns them). */

#include "ld_sem_int.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The margin before a watchdog lease's end (ld_lease_margin_ms). */
static uint64_t
lost_margin_ms(void)
{
    return ld_lease_margin_ms(&sem_mod.pass);
}

void
sem_grant_lost(struct sem_grant *g, const char *reason, bool release)
{
    log_info("semaphore grant lost key=\"%s\" reason=%s", g->key, reason);
    if (g->ss != NULL) {
        json_t *ev = ld_lease_event("sem", "lost", g->key, strlen(g->key),
                                    g->token);
        json_object_set_new(ev, "reason", json_string(reason));
        ld_session_event(g->ss->sess, ev);
    }
    sem_grant_drop(g, release);
}

/* As lock_at_risk for locks (ld_lock_watch.c): a renewal of watchdog
 * grant G failed, or is late (pass_step), while its lease may still
 * hold; once until a renewal confirms it again, never once the lease
 * (less the margin) has passed. */
static void
grant_at_risk(struct sem_grant *g)
{
    uint64_t now = ld_now_ms();
    uint64_t end = g->lease_end_ms;
    uint64_t m = lost_margin_ms();
    if (!g->watchdog || g->at_risk || g->ss == NULL || end <= now + m) {
        return;
    }
    g->at_risk = true;
    log_info("semaphore grant at risk key=\"%s\" lease_left_ms=%llu", g->key,
             (unsigned long long)(end - m - now));
    json_t *ev = ld_lease_event("sem", "at_risk", g->key, strlen(g->key),
                                g->token);
    json_object_set_new(ev, "lease_left_ms", json_integer(end - m - now));
    ld_session_event(g->ss->sess, ev);
}

/* A renewal confirmed G's lease again after sem_at_risk. */
static void
grant_safe(struct sem_grant *g)
{
    g->at_risk = false;
    if (g->ss == NULL) {
        return;
    }
    log_info("semaphore grant safe again key=\"%s\"", g->key);
    json_t *ev = ld_lease_event("sem", "safe", g->key, strlen(g->key),
                                g->token);
    json_object_set_new(ev, "lease_ms",
                        json_integer(sem_mod.ctx->cfg->lock.watchdog_ms));
    ld_session_event(g->ss->sess, ev);
}

static void
end_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct sem_grant *g = arg;
    if (g->watchdog) {
        /* No renewal confirmed a newer lease in time (Redis slow or
         * away): the holder must stop now, and whatever Redis still
         * keeps goes back. */
        if (g->ss != NULL) {
            ld_lease_note_late("sem",
                               ld_lease_vouch_end(&sem_mod.pass,
                                                  g->lease_end_ms),
                               g->ss->sess->name);
        }
        sem_grant_lost(g, "redis_unavailable", true);
    } else {
        /* A fixed lease ran out, as the client asked: Redis reclaims
         * it; this daemon stops keeping it. */
        sem_grant_drop(g, false);
    }
}

/* (Re)arm the timer of G for the end of its lease as now confirmed. */
void
sem_grant_arm(struct sem_grant *g)
{
    uint64_t end = g->lease_end_ms;
    if (g->watchdog) {
        end = ld_lease_vouch_end(&sem_mod.pass, end);
    }
    ld_lease_timer_arm(&sem_mod.pass, &g->end_ev, end_on_timer, g, end);
}

/* The answer a grant held back in K waited for has come. */
static void
key_check_done(struct sem_key *k)
{
    if (--k->checks > 0) {
        return;
    }
    /* Answered in the order they were granted. Moved aside first: an
     * answer may add a grant to K but never frees it. */
    TAILQ_HEAD(, sem_op) ready = TAILQ_HEAD_INITIALIZER(ready);
    TAILQ_CONCAT(&ready, &k->held, held_link);
    struct sem_op *op;
    while ((op = TAILQ_FIRST(&ready)) != NULL) {
        TAILQ_REMOVE(&ready, op, held_link);
        op->inflight = false;
        sem_acq_finish(op);
    }
    sem_key_maybe_free(k);
}

/* What a renewal (watchdog) or a check (fixed lease) found. */
static void
renew_result(struct sem_grant *g, const redisReply *r)
{
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
        /* No answer: the next pass tries again while the lease may
         * last, or sooner when this was a recheck's. */
        grant_at_risk(g);
        if (g->renew_recheck) {
            ld_lease_pass_retry(&sem_mod.pass, g->renew_failover);
        }
        return;
    }
    long long code = r->element[0]->integer;
    if (code == 1) {
        if (g->watchdog) {
            g->lease_end_ms = g->renew_sent_ms +
                              (uint64_t)sem_mod.ctx->cfg->lock.watchdog_ms;
            sem_grant_arm(g);
            if (g->at_risk) {
                grant_safe(g);
            }
        }
        return;
    }
    bool early = ld_now_ms() < g->lease_end_ms;
    if (!g->watchdog && !early && !g->renew_failover) {
        /* A fixed lease ran out, as the client asked. */
        sem_grant_drop(g, false);
        return;
    }
    log_warn("semaphore grant %.*s found gone on %s (%s)", (int)g->n.zset_len,
             g->n.zset, g->watchdog ? "renewal" : "check",
             code == 0 ? "absent" : "wrong type");
    const char *why = g->renew_failover ? "failover"
                      : code == 0       ? "expired"
                                        : "taken";
    sem_grant_lost(g, why, false);
    if (early && code == 0) {
        /* Gone before its lease could end: Redis lost data (FLUSHALL, a
         * restart without persistence, an eviction), so look at every
         * grant at once. */
        sem_recheck_start();
    }
}

static void
renew_on_reply(redisReply *r, void *arg)
{
    struct sem_grant *g = arg;
    g->renewing = false;
    ld_lease_pass_answered(&sem_mod.pass);
    if (sem_mod.freed) {
        /* Every grant was dropped (gone) with the module. */
        free(g->n.buf);
        free(g);
        return;
    }
    struct sem_key *hold = g->hold_key;
    g->hold_key = NULL;
    if (g->gone) {
        free(g->n.buf);
        free(g);
    } else {
        renew_result(g, r);
    }
    if (hold != NULL) {
        key_check_done(hold);
    }
}

/* A renewal for a watchdog grant, a check (lease 0: nothing written) for
 * a fixed lease. */
static void
renew_send(struct sem_grant *g)
{
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld",
             g->watchdog ? sem_mod.ctx->cfg->lock.watchdog_ms : 0);
    const char *args[] = {g->token, lbuf};
    size_t lens[] = {LD_TOKEN_LEN, strlen(lbuf)};
    g->renewing = true;
    g->renew_failover = sem_mod.pass.after_failover;
    g->renew_sent_ms = ld_now_ms();
    g->renew_recheck = ld_lease_pass_sent(&sem_mod.pass);
    sem_script(LD_SCRIPT_sem_renew, &g->n, sem_bare(g->permits), 2, args, lens,
               renew_on_reply, g);
}

/* Redis granted OP: when the permits Redis counted before it are fewer
 * than this daemon's other grants of the semaphore hold, some of those
 * are gone, and OP's answer waits until each has been checked, so that
 * a holder hears sem_lost before another session is told it got the
 * permits. So it does while a recheck of every grant runs (Redis back, a
 * failover, a loss found), and behind a renewal or check of one of them
 * still out. A check sent after the grant sees what the grant saw (the
 * commands of one semaphore keep their order). Returns true when OP
 * waits. */
bool
sem_hold_grant(struct sem_op *op)
{
    struct sem_key *k = sem_key_find(&op->n);
    if (k == NULL) {
        return false;
    }
    long long before = op->limit - op->available - op->permits;
    long long mine = 0;
    uint64_t now = ld_now_ms();
    struct sem_grant *g;
    LIST_FOREACH(g, &k->grants, key_link)
    {
        if (g->watchdog || g->lease_end_ms > now) {
            mine += g->permits;
        }
    }
    bool suspect = mine > before || sem_mod.pass.recheck;
    LIST_FOREACH(g, &k->grants, key_link)
    {
        if (g->hold_key != NULL || (!suspect && !g->renewing)) {
            continue;
        }
        g->hold_key = k;
        k->checks++;
        if (!g->renewing) {
            renew_send(g);
        }
    }
    if (k->checks == 0) {
        return false;
    }
    /* Also behind checks that an earlier grant started. */
    TAILQ_INSERT_TAIL(&k->held, op, held_link);
    return true;
}

/* The pass visits every grant once: visited grants move to the tail, so
 * that a pass cut short by the bound goes on with those it left. */
static void
pass_begin(void)
{
    sem_mod.pass_left = (long long)ld_stats.sem_holds;
}

static bool
pass_more(void)
{
    return sem_mod.pass_left > 0 && !TAILQ_EMPTY(&sem_mod.grants);
}

/* A watchdog grant is renewed, a fixed lease checked (so that one Redis
 * lost early is reported within a pass); a renewal still out is late
 * after half a pass period. */
static void
pass_next(uint64_t now)
{
    struct sem_grant *g = TAILQ_FIRST(&sem_mod.grants);
    TAILQ_REMOVE(&sem_mod.grants, g, all_link);
    TAILQ_INSERT_TAIL(&sem_mod.grants, g, all_link);
    sem_mod.pass_left--;
    if (!g->renewing) {
        renew_send(g);
    } else if (ld_lease_renew_late(&sem_mod.pass, g->renew_sent_ms, now)) {
        grant_at_risk(g);
    }
}

static const struct ld_lease_pass_fns pass_fns = {pass_begin, pass_more,
                                                  pass_next, NULL};

/* Check every grant now (ld_lease_pass_recheck), as for locks: Redis
 * came back (it may have restarted without its data), the master
 * changed, or a grant was found gone before its lease. */
void
sem_recheck_start(void)
{
    if (sem_mod.freed || sem_mod.stopping) {
        return;
    }
    ld_lease_pass_recheck(&sem_mod.pass);
}

static void
on_redis_state(bool up, void *arg)
{
    LD_UNUSED(arg);
    if (up) {
        sem_recheck_start();
    }
}

void
sem_watch_init(void)
{
    sem_mod.pass_left = 0;
    ld_lease_pass_init(&sem_mod.pass, sem_mod.ctx, &pass_fns);
    ld_redis_on_state(on_redis_state, NULL);
}

void
sem_watch_free(void)
{
    ld_lease_pass_free(&sem_mod.pass);
}
