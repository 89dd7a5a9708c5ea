/* Semaphores: the watchdog that renews session-bound grants without a
 * fixed lease while their session lives, on the lock watchdog's period
 * (lock.watchdog_ms / 3) and with its lease (lock.watchdog_ms), and the
 * sem_lost event, sent as lock_lost is for locks: when a renewal finds
 * the grant gone, or at the latest when the lease last confirmed ends
 * (less a margin) without a renewal having confirmed a newer one. */

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

/* Renewals out at once; the rest wait for the next pass, two of which
 * still fit in one lease. */
#define SEM_RENEW_INFLIGHT_MAX 1000

/* As for locks (ld_lock_watch.c): the lease counts from when the
 * confirming command was sent; the margin covers clock drift and the
 * event's way to the client. */
static uint64_t
lost_margin_ms(void)
{
    return 2 + (uint64_t)sem_mod.ctx->cfg->lock.watchdog_ms / 100;
}

void
sem_grant_lost(struct sem_grant *g, const char *reason, bool release)
{
    log_info("semaphore grant lost key=\"%s\" reason=%s", g->key, reason);
    if (g->ss != NULL) {
        ld_session_event(g->ss->sess,
                         json_pack("{s:s,s:s,s:s,s:s}", "event", "sem_lost",
                                   "key", g->key, "token", g->token, "reason",
                                   reason));
    }
    sem_grant_drop(g, release);
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
    if (g->end_ev == NULL) {
        g->end_ev = evtimer_new(sem_mod.ctx->base, end_on_timer, g);
        if (g->end_ev == NULL) {
            ld_oom(0);
        }
    }
    uint64_t now = ld_now_ms();
    uint64_t end = g->lease_end_ms;
    if (g->watchdog) {
        end = end > lost_margin_ms() ? end - lost_margin_ms() : 0;
    }
    long long ms = end > now ? (long long)(end - now) : 0;
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    evtimer_add(g->end_ev, &tv);
}

static void
renew_on_reply(redisReply *r, void *arg)
{
    struct sem_grant *g = arg;
    g->renewing = false;
    sem_mod.renew_inflight--;
    if (g->gone || sem_mod.freed) {
        free(g->n.buf);
        free(g);
        return;
    }
    if (r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
        r->element[0]->type == REDIS_REPLY_INTEGER) {
        if (r->element[0]->integer == 1) {
            g->lease_end_ms = g->renew_sent_ms +
                              (uint64_t)sem_mod.ctx->cfg->lock.watchdog_ms;
            sem_grant_arm(g);
            return;
        }
        log_warn("semaphore grant %.*s found gone on renewal (%s)",
                 (int)g->n.zset_len, g->n.zset,
                 r->element[0]->integer == 0 ? "absent" : "wrong type");
        sem_grant_lost(g, r->element[0]->integer == 0 ? "expired" : "taken",
                       false);
    }
    /* No answer: the next pass tries again while the lease may last. */
}

static void
renew_send(struct sem_grant *g)
{
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", sem_mod.ctx->cfg->lock.watchdog_ms);
    const char *args[] = {g->token, lbuf};
    size_t lens[] = {LD_TOKEN_LEN, strlen(lbuf)};
    g->renewing = true;
    g->renew_sent_ms = ld_now_ms();
    sem_mod.renew_inflight++;
    sem_script(LD_SCRIPT_sem_renew, &g->n, 2, args, lens, renew_on_reply, g);
}

static void
pass_arm(void)
{
    long long ms = sem_mod.ctx->cfg->lock.watchdog_ms / 3;
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    evtimer_add(sem_mod.pass_ev, &tv);
}

static void
pass_run(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    /* Visited grants move to the tail: a pass cut short by the bound
     * starts the next one with those it left. */
    long long left = (long long)ld_stats.sem_holds;
    while (left-- > 0 && sem_mod.renew_inflight < SEM_RENEW_INFLIGHT_MAX) {
        struct sem_grant *g = TAILQ_FIRST(&sem_mod.grants);
        if (g == NULL) {
            break;
        }
        TAILQ_REMOVE(&sem_mod.grants, g, all_link);
        TAILQ_INSERT_TAIL(&sem_mod.grants, g, all_link);
        if (g->watchdog && !g->renewing) {
            renew_send(g);
        }
    }
    pass_arm();
}

void
sem_watch_init(void)
{
    sem_mod.pass_ev = evtimer_new(sem_mod.ctx->base, pass_run, NULL);
    if (sem_mod.pass_ev == NULL) {
        ld_oom(0);
    }
    pass_arm();
}

void
sem_watch_free(void)
{
    if (sem_mod.pass_ev != NULL) {
        event_free(sem_mod.pass_ev);
        sem_mod.pass_ev = NULL;
    }
}
