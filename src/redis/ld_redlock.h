#ifndef LD_REDLOCK_H
#define LD_REDLOCK_H

#include "ld_common.h"
#include "ld_pubsub.h"
#include "ld_redis.h"

struct ld_ctx;

/* Redlock (lock.redlock): the lock scripts run on N >= 3 independent
 * Redis instances at once, and their N answers are folded into the one
 * answer the script gives on a single Redis, so the lock module keeps one
 * logic for both backends. A result stands only when a majority
 * (N/2+1) of the instances gives it:
 *   lock_acquire  granted by a majority within the lease; the lease left
 *                 (its pttl) is the lease minus the time the acquisition
 *                 took minus the clock drift (1% of the lease + 2 ms);
 *                 the fence is the highest counter the granting instances
 *                 returned. A failed attempt is given back on every
 *                 instance that granted it, also when the grant is only
 *                 learnt from a late answer.
 *   lock_renew,   held on a majority (pttl: the shortest, less the time
 *   lock_extend   taken and the drift).
 *   lock_release  released (or kept) on a majority; every instance that
 *                 released publishes the wake-up, with a payload of this
 *                 release's own, and every daemon's waiters listen on
 *                 every instance (ld_redlock_subscribe).
 *   lock_info     answered by a majority.
 * Anything else (fewer than a majority answering) is a NULL reply, with
 * ld_redlock_outcome() saying whether a write may have happened
 * (LD_REDIS_LOST) or nothing changed (LD_REDIS_NOT_SENT). The callback is
 * called exactly once, never LD_REDIS_UNKNOWN then LD_REDIS_LATE. */

/* Adds the instances of lock.redlock (before ld_redis_start). LD_OK and
 * nothing done when the list is empty. */
int ld_redlock_init(const struct ld_ctx *ctx);
void ld_redlock_free(void);

/* Instances with a ready connection, and the majority needed. */
int ld_redlock_ready_count(void);
int ld_redlock_quorum(void);
int ld_redlock_count(void);

/* Run SCRIPT (a lock_* script) on every instance. ARGV as for
 * ld_redis_script; CHAN is the lock's unlock channel (wake-ups and the
 * give-back of a failed acquisition publish there). */
void ld_redlock_script(enum ld_script_id script, const char *route,
                       size_t route_len, const char *chan, size_t chan_len,
                       int nkeys, int argc, const char **argv,
                       const size_t *argvlen, ld_redis_cb *cb, void *arg);

/* Inside a callback of ld_redlock_script: what happened, and why a NULL
 * reply is NULL. */
enum ld_redis_outcome ld_redlock_outcome(void);
const char *ld_redlock_failure_reason(void);

/* Subscribe to a lock's unlock channel CHAN on every instance, as one
 * subscription (ld_pubsub_subscribe_group with a majority as quorum):
 * the lock waiters' way of hearing unlocks (ld_lockwait_sub_fn). */
struct ld_pubsub_sub *ld_redlock_subscribe(const char *chan, size_t len,
                                           ld_pubsub_cb *cb, void *arg);

/* Called when a majority becomes reachable (UP) or stops being. */
void ld_redlock_on_state(ld_redis_state_fn *fn, void *arg);

#endif
