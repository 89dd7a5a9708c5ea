#ifndef LD_EVICT_H
#define LD_EVICT_H

/* The eviction check: each Redis that holds locks is asked for its
 * maxmemory-policy at start and whenever the backend comes back (a
 * reconnect, a Sentinel or cluster failover; each Redlock instance when
 * it comes back). An allkeys-* policy lets Redis evict lock hashes and
 * fence counters under memory pressure: a lock vanishes while its holder
 * still writes, a fence starts again lower. That is logged (a warning,
 * once per change of the answer) and exported as the gauge
 * redis_eviction_unsafe; with lock.require_noeviction the lock-class ops
 * are refused instead (ld_evict_refuse). */

#include "ld_common.h"

struct ld_ctx;
struct ld_req;

/* Idempotent. INSTANCES: the Redlock instances (1..N) to check besides
 * the backend of redis.*. */
int ld_evict_init(const struct ld_ctx *ctx, int instances);
void ld_evict_free(void);

/* With lock.require_noeviction, while a Redis in use is not known to keep
 * every key (an allkeys-* policy, CONFIG refused, or no answer yet): REQ
 * is answered redis_unavailable, naming the policy, and true returned. */
bool ld_evict_refuse(struct ld_req *req);

#endif
