/* The lease engine locks and semaphores share (ld_lease.h): the watchdog
 * pass, the rechecks, the lost margin and timer, the holder's events,
 * reply reading and the answer to a script that failed. It owns no lease: it must not know what a lock or a
 * semaphore is, nor call into either; they call it. */

#include "ld_lease.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_util.h"

#include <event2/event.h>
#include <stdio.h>
#include <string.h>

static void
pass_continue(struct ld_lease_pass *p)
{
    ld_defer_kick(&p->step);
}

/* One step of the pass. The renewals of a step leave pipelined, in one
 * write per connection. */
static void
pass_step(void *arg)
{
    struct ld_lease_pass *p = arg;
    uint64_t now = ld_now_ms();
    int visited = 0;
    while (p->fns->more() && visited < LD_LEASE_PASS_STEP &&
           p->inflight < LD_LEASE_INFLIGHT_MAX) {
        p->fns->visit(now);
        visited++;
    }
    if (p->fns->step_end != NULL) {
        p->fns->step_end();
    }
    if (!p->fns->more()) {
        if (p->recheck) {
            p->after_failover = false;
        }
        p->passing = false;
        p->recheck = false;
    } else if (p->inflight < LD_LEASE_INFLIGHT_MAX) {
        pass_continue(p);
    }
    /* else: ld_lease_pass_answered continues once replies are back. */
}

long long
ld_lease_pass_period_ms(const struct ld_lease_pass *p)
{
    long long period = p->ctx->cfg->lock.watchdog_ms / 3;
    return period > 0 ? period : 1;
}

static void
pass_arm(struct ld_lease_pass *p)
{
    long long ms = ld_lease_pass_period_ms(p);
    struct timeval tv = ld_tv_ms(ms);
    p->next_ms = ld_now_ms() + (uint64_t)ms;
    evtimer_add(p->ev, &tv);
}

/* The one periodic timer starts a pass over every lease, unless the last
 * one is still going (Redis slow), which then simply goes on. */
static void
pass_run(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct ld_lease_pass *p = arg;
    if (!p->passing) {
        p->passing = true;
        p->fns->begin();
    }
    pass_step(p);
    pass_arm(p);
}

static void
recheck_start(struct ld_lease_pass *p)
{
    if (p->freed || (p->passing && p->recheck)) {
        return;
    }
    p->recheck = true;
    p->passing = true;
    p->fns->begin();
    pass_continue(p);
}

/* Check every lease now, fixed leases too, in one pass bounded like the
 * watchdog's: Redis came back (it may have restarted without its data),
 * the master changed, or a lease was found gone before its end. Leases
 * that did not survive are reported at once instead of a pass later. */
void
ld_lease_pass_recheck(struct ld_lease_pass *p)
{
    p->retry_ms = LD_LEASE_RETRY_MS;
    recheck_start(p);
}

/* The master changed (Sentinel, Cluster): leases the next recheck finds
 * gone were lost to the failover. */
void
ld_lease_pass_failover(struct ld_lease_pass *p)
{
    p->after_failover = true;
}

/* A renewal or check leaves; true when it belongs to a recheck (see
 * ld_lease_pass_retry). */
bool
ld_lease_pass_sent(struct ld_lease_pass *p)
{
    p->inflight++;
    return p->recheck;
}

static void
retry_on_timer(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    recheck_start(arg);
}

/* A check or renewal sent by a recheck got no answer: Redis, just back,
 * may still refuse (loading its data, a connection of the pool not up
 * yet). The leases it may have lost are looked at again soon, not a
 * pass later (a third of a watchdog lease), with the failover still
 * the reason when AFTER_FAILOVER; one retry answers every such reply. */
void
ld_lease_pass_retry(struct ld_lease_pass *p, bool after_failover)
{
    if (p->freed) {
        return;
    }
    if (after_failover) {
        p->after_failover = true;
    }
    if (evtimer_pending(p->retry_ev, NULL)) {
        return;
    }
    struct timeval tv = ld_tv_ms(p->retry_ms);
    evtimer_add(p->retry_ev, &tv);
    long long period = ld_lease_pass_period_ms(p);
    p->retry_ms = p->retry_ms * 2 < period ? p->retry_ms * 2 : period;
}

/* A renewal or check has its answer: a pass held back by the bound on
 * those out goes on once half of them are back. */
void
ld_lease_pass_answered(struct ld_lease_pass *p)
{
    p->inflight--;
    if (p->passing && !p->freed && p->inflight <= LD_LEASE_INFLIGHT_MAX / 2) {
        pass_continue(p);
    }
}

/* A renewal still out half a pass period after it was sent is late (one
 * sent just before a pass, an early renewal, gets until the next). */
bool
ld_lease_renew_late(const struct ld_lease_pass *p, uint64_t sent_ms,
                    uint64_t now)
{
    return now >= sent_ms &&
           now - sent_ms >= (uint64_t)ld_lease_pass_period_ms(p) / 2;
}

void
ld_lease_pass_init(struct ld_lease_pass *p, const struct ld_ctx *ctx,
                   const struct ld_lease_pass_fns *fns)
{
    p->ctx = ctx;
    p->fns = fns;
    p->inflight = 0;
    p->passing = false;
    p->recheck = false;
    p->after_failover = false;
    p->freed = false;
    p->retry_ms = LD_LEASE_RETRY_MS;
    p->ev = evtimer_new(ctx->base, pass_run, p);
    p->retry_ev = evtimer_new(ctx->base, retry_on_timer, p);
    if (p->ev == NULL || p->retry_ev == NULL) {
        ld_oom(0);
    }
    ld_defer_init(&p->step, ctx->base, pass_step, p);
    pass_arm(p);
}

void
ld_lease_pass_free(struct ld_lease_pass *p)
{
    p->freed = true;
    if (p->ev != NULL) {
        event_free(p->ev);
        p->ev = NULL;
        event_free(p->retry_ev);
        p->retry_ev = NULL;
        ld_defer_free(&p->step);
    }
}

/* How long before the end of a confirmed watchdog lease the daemon stops
 * vouching for it: the lease is counted from when the confirming command
 * was sent, which is never later than Redis started it, and the margin
 * covers the clocks of the two hosts drifting apart (1% of a watchdog
 * lease, as for Redlock) and the event's way to the client (2 ms). */
uint64_t
ld_lease_margin_ms(const struct ld_lease_pass *p)
{
    return 2 + (uint64_t)p->ctx->cfg->lock.watchdog_ms / 100;
}

uint64_t
ld_lease_vouch_end(const struct ld_lease_pass *p, uint64_t end)
{
    uint64_t m = ld_lease_margin_ms(p);
    return end > m ? end - m : 0;
}

void
ld_lease_note_late(const char *kind, uint64_t due, const char *session)
{
    uint64_t now = ld_now_ms();
    if (now >= due + LD_LEASE_LATE_MS) {
        log_warn("%s lost late due_ms=%llu now_ms=%llu late_ms=%llu "
                 "session=%s",
                 kind, (unsigned long long)due, (unsigned long long)now,
                 (unsigned long long)(now - due), session);
    }
}

void
ld_lease_timer_arm(const struct ld_lease_pass *p, struct event **ev,
                   void (*cb)(evutil_socket_t, short, void *), void *arg,
                   uint64_t at)
{
    if (*ev == NULL) {
        *ev = evtimer_new(p->ctx->base, cb, arg);
        if (*ev == NULL) {
            ld_oom(0);
        }
    }
    uint64_t now = ld_now_ms();
    struct timeval tv = ld_tv_ms(at > now ? (long long)(at - now) : 0);
    evtimer_add(*ev, &tv);
}

json_t *
ld_lease_event(const char *kind, const char *what, const char *key,
               size_t klen, const char *token)
{
    char name[32];
    snprintf(name, sizeof(name), "%s_%s", kind, what);
    return json_pack("{s:s,s:s%,s:s}", "event", name, "key", key, klen,
                     "token", token);
}

static char *
put(char *p, const char *s, size_t len)
{
    memcpy(p, s, len);
    return p + len;
}

char *
ld_lease_names(const char *pfx, const char *key, size_t klen, const char *tail,
               const char *const *sufs, int nsuf, const char **names,
               size_t *lens)
{
    size_t plen = strlen(pfx), tlen = strlen(tail);
    size_t base = plen + 1 + klen + 1 + tlen;
    size_t cap = base + 1;
    for (int i = 0; i < nsuf; i++) {
        cap += base + strlen(sufs[i]) + 1;
    }
    char *buf = ld_xmalloc(cap);
    char *p = buf;
    names[0] = p;
    lens[0] = base;
    p = put(p, pfx, plen);
    p = put(p, "{", 1);
    p = put(p, key, klen);
    p = put(p, "}", 1);
    p = put(p, tail, tlen);
    *p++ = '\0';
    for (int i = 0; i < nsuf; i++) {
        size_t slen = strlen(sufs[i]);
        names[i + 1] = p;
        lens[i + 1] = base + slen;
        p = put(p, buf, base);
        p = put(p, sufs[i], slen);
        *p++ = '\0';
    }
    return buf;
}

int
ld_lease_reply_ints(const redisReply *r, long long *v, int max)
{
    if (r != NULL && r->type == REDIS_REPLY_INTEGER && max >= 1) {
        v[0] = r->integer;
        for (int i = 1; i < max; i++) {
            v[i] = 0;
        }
        return max;
    }
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

void
ld_lease_reply_failure(struct ld_req *req, const redisReply *r,
                       const char *what)
{
    if (r != NULL && r->type == REDIS_REPLY_ERROR) {
        int code = ld_reply_is_unavailable(r) ? LD_E_REDIS_UNAVAILABLE
                                              : LD_E_INTERNAL;
        ld_reply_error(req, code, "%s: %s", what, r->str);
        return;
    }
    if (r != NULL) {
        ld_reply_error(req, LD_E_INTERNAL, "%s: unexpected reply", what);
        return;
    }
    enum ld_redis_outcome o = ld_redis_outcome();
    if (o == LD_REDIS_UNKNOWN || o == LD_REDIS_LOST) {
        ld_reply_error_extra(req, LD_E_REDIS_UNAVAILABLE,
                             json_pack("{s:s}", "outcome", "unknown"),
                             "%s: %s", what, ld_redis_failure_reason());
        return;
    }
    ld_reply_error(req, LD_E_REDIS_UNAVAILABLE, "%s: %s", what,
                   ld_redis_failure_reason());
}
