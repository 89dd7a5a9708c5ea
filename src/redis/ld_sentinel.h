#ifndef LD_SENTINEL_H
#define LD_SENTINEL_H

#include "ld_common.h"

struct ld_conn_addr;
struct ld_ctx;

/* Sentinel mode: which server is the master of redis.master_name. The
 * Sentinels of redis.addresses are asked in order (SENTINEL
 * get-master-addr-by-name); one that does not answer, does not know the
 * name or answers an error is skipped with a log line. One subscriber
 * connection to a Sentinel hears +switch-master (moving on to the next
 * Sentinel when it breaks), and the Sentinels are asked again whenever
 * the master is in doubt (ld_sentinel_doubt). Both connections go
 * through ld_conn, so TLS and backoff apply to them as to Redis. */

/* The master is at ADDR (TEXT "host:port"); FAILOVER when it replaces a
 * master known before. */
typedef void ld_sentinel_master_fn(const struct ld_conn_addr *addr,
                                   const char *text, bool failover, void *arg);

int ld_sentinel_init(const struct ld_ctx *ctx, ld_sentinel_master_fn *fn,
                     void *arg);
void ld_sentinel_start(void);
void ld_sentinel_free(void);

/* The master may have changed (a connection to it was lost, it answered
 * READONLY or LOADING, or it turned out a replica): ask again, at most a
 * few times a second. */
void ld_sentinel_doubt(const char *why, void *arg);

/* Whether the daemon can reach a master (ld_redis_on_state), for the
 * time without one in the stats. */
void ld_sentinel_master_state(bool up, void *arg);

#endif
