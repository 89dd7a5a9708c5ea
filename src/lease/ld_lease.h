#ifndef LD_LEASE_H
#define LD_LEASE_H

/* What locks and semaphores share about the leases they hold in Redis:
 * the watchdog pass over them (bounded per turn), the rechecks of every
 * lease when Redis may have lost them (Redis back, a failover, a lease
 * found gone early), the margin before a watchdog lease's end at which
 * this daemon stops vouching for it, the timer that ends it then, the
 * holder's events (X_lost, X_at_risk, X_safe) and reading a script's
 * integer reply. Which leases there are, how one is renewed and what a
 * renewal's answer means stay with their module. */

#include "ld_common.h"
#include "ld_defer.h"
#include "ld_redis.h"

#include <event2/util.h>
#include <jansson.h>

struct event;
struct ld_ctx;
struct ld_session;

/* A pass over 100,000 leases must not monopolise the loop nor put
 * 100,000 scripts in Redis ahead of client commands: it goes in steps of
 * at most LD_LEASE_PASS_STEP leases, with at most LD_LEASE_INFLIGHT_MAX
 * renewals out at a time; replies bring the next step. */
#define LD_LEASE_PASS_STEP 500
#define LD_LEASE_INFLIGHT_MAX 1000

/* The first retry of a recheck whose command got no answer; each next
 * one waits twice as long, up to a pass period. */
#define LD_LEASE_RETRY_MS 100

/* The module's side of a pass: BEGIN puts it at its first lease, MORE
 * says whether one is left, VISIT renews or checks the next one, and
 * STEP_END (may be NULL) sends what the visits of one step held back to
 * send together. */
struct ld_lease_pass_fns {
    void (*begin)(void);
    bool (*more)(void);
    void (*visit)(uint64_t now);
    void (*step_end)(void);
};

/* One module's pass. Every watchdog period / 3 a pass visits every
 * lease; a pass still running then (Redis slow) simply goes on. */
struct ld_lease_pass {
    const struct ld_ctx *ctx;
    const struct ld_lease_pass_fns *fns;
    struct event *ev;
    uint64_t next_ms;       /* when EV fires next */
    struct ld_defer step;   /* continues a pass on a later turn */
    struct event *retry_ev; /* a recheck again (ld_lease_pass_retry) */
    long long retry_ms;     /* how long the next retry waits */
    long long inflight;     /* renewals and checks sent, unanswered */
    bool passing;
    bool recheck;        /* this pass checks everything Redis may have lost */
    bool after_failover; /* the master changed: leases found gone until the
                            next full recheck are lost to the failover */
    bool freed;
};

void ld_lease_pass_init(struct ld_lease_pass *p, const struct ld_ctx *ctx,
                        const struct ld_lease_pass_fns *fns);
void ld_lease_pass_free(struct ld_lease_pass *p);
void ld_lease_pass_recheck(struct ld_lease_pass *p);
void ld_lease_pass_failover(struct ld_lease_pass *p);
bool ld_lease_pass_sent(struct ld_lease_pass *p);
void ld_lease_pass_retry(struct ld_lease_pass *p, bool after_failover);
void ld_lease_pass_answered(struct ld_lease_pass *p);
long long ld_lease_pass_period_ms(const struct ld_lease_pass *p);
bool ld_lease_renew_late(const struct ld_lease_pass *p, uint64_t sent_ms,
                         uint64_t now);

/* The margin before the end of a confirmed watchdog lease, and the
 * moment (END less it) this daemon stops vouching for the lease. */
uint64_t ld_lease_margin_ms(const struct ld_lease_pass *p);
uint64_t ld_lease_vouch_end(const struct ld_lease_pass *p, uint64_t end);

/* A <KIND>_lost goes out now for a lease this daemon stopped vouching
 * for at DUE (ms): when that is LD_LEASE_LATE_MS or more ago, the loop
 * did not run then (a host too loaded to schedule the daemon, or the
 * daemon stopped), and the log says when it was due and when it left,
 * in CLOCK_MONOTONIC ms, so that a late event can be told apart from a
 * wrong lease end ("<KIND> lost late due_ms=... now_ms=... late_ms=...
 * session=SESSION"; make jepsen's checker reads it). */
#define LD_LEASE_LATE_MS 50
void ld_lease_note_late(const char *kind, uint64_t due, const char *session);

/* (Re)arm *EV (created on first use) to call CB(ARG) at AT (ms). */
void ld_lease_timer_arm(const struct ld_lease_pass *p, struct event **ev,
                        void (*cb)(evutil_socket_t, short, void *), void *arg,
                        uint64_t at);

/* {"event":"<KIND>_<WHAT>","key":KEY,"token":TOKEN}, to which the caller
 * adds what the event carries. */
json_t *ld_lease_event(const char *kind, const char *what, const char *key,
                       size_t klen, const char *token);

/* The Redis names of one lease, in one buffer: NAMES[0] is
 * "<PFX>{KEY}<TAIL>" (one hash slot whatever follows), NAMES[i] for i
 * from 1 to NSUF that name followed by SUFS[i - 1]; each NUL-terminated,
 * its length in LENS[i]. Returns the buffer, for the caller to free. */
char *ld_lease_names(const char *pfx, const char *key, size_t klen,
                     const char *tail, const char *const *sufs, int nsuf,
                     const char **names, size_t *lens);

struct ld_req;

/* Answer REQ for a script that failed, WHAT naming the op: an error
 * reply that says Redis cannot serve now (ld_reply_is_unavailable) or no
 * answer at all is redis_unavailable, with "outcome":"unknown" when the
 * script left and may have run (it may have granted); any other error or
 * shape is internal. Inside the script's callback only. */
void ld_lease_reply_failure(struct ld_req *req, const redisReply *r,
                            const char *what);

/* The integers of a script's array reply into V (at most MAX): how many,
 * or -1 when the reply is not an array of integers. A bare integer X
 * stands for {X, 0, ...}: MAX numbers (a script answers its commonest
 * outcome so, which costs Redis less than a table). */
int ld_lease_reply_ints(const redisReply *r, long long *v, int max);

#endif
