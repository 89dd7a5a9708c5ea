#ifndef LD_STATS_H
#define LD_STATS_H

#include "ld_common.h"

#include <jansson.h>

/* Every figure is declared once here, with its kind and help text; the
 * table feeds the `stats` op, the Prometheus exposition and the docs.
 * Modules bump fields of the global `ld_stats` directly.
 *
 * Kinds: counter (Prometheus: leased_NAME_total), gauge (leased_NAME),
 * smoothed_us, a gauge holding a smoothed time in microseconds: `stats`
 * shows it as it is, Prometheus in its base unit, seconds, as
 * leased_STEM_smoothed_seconds where NAME is STEM_us (the histogram of the
 * same times owns leased_STEM_seconds); counter_us, a counter of
 * microseconds, in Prometheus leased_STEM_seconds_total; age_ms, a gauge
 * of milliseconds computed when read (see ld_stats_add_refresh), in
 * Prometheus leased_STEM_seconds where NAME is STEM_ms.
 *
 * The near_* figures stay 0 while cache.near.enabled is false. */
#define LD_STATS_FIELDS(X)                                                    \
    X(counter, connections_accepted, "Client connections accepted")           \
    X(counter, connections_rejected,                                          \
      "Client connections refused at max_clients")                            \
    X(gauge, sessions, "Client sessions open")                                \
    X(counter, requests, "Requests received")                                 \
    X(gauge, requests_pending, "Requests awaiting their reply")               \
    X(gauge, requests_bytes,                                                  \
      "Bytes held by the requests awaiting their reply")                      \
    X(gauge, session_buffer_bytes, "Bytes in client sessions' buffers")       \
    X(gauge, redis_connected, "Command connections to Redis that are ready")  \
    X(counter, redis_commands, "Commands sent to Redis")                      \
    X(counter, redis_errors, "Redis commands that failed or timed out")       \
    X(counter, redis_timeouts, "Redis commands that hit redis.timeout_ms")    \
    X(counter, redis_reconnects, "Connections to Redis re-established")       \
    X(counter, redis_noscript, "Scripts re-sent after NOSCRIPT")              \
    X(counter, redis_batches, "Batch script calls sent to Redis")             \
    X(counter, redis_batched_items, "Scripts sent inside batch calls")        \
    X(counter, redis_writes, "Writes to Redis connections")                   \
    X(smoothed_us, redis_rtt_us, "Smoothed Redis round-trip time")            \
    X(counter, redis_failovers, "Changes of master followed (sentinel mode)") \
    X(counter_us, redis_no_master_us, "Time without a usable Redis master")   \
    X(gauge, redlock_instances_up,                                            \
      "Redlock instances with a ready connection")                            \
    X(counter, redlock_undone, "Holds given back after a failed Redlock try") \
    X(gauge, redlock_subscribers_up,                                          \
      "Redlock instances with a ready subscriber connection")                 \
    X(gauge, redis_cluster_nodes, "Masters in the cluster slot map")          \
    X(gauge, redis_eviction_unsafe,                                           \
      "1 when a Redis holding locks has a maxmemory-policy that can evict "   \
      "them")                                                                 \
    X(counter, redis_cluster_refreshes, "Cluster slot map refreshes")         \
    X(counter, redis_moved, "Cluster MOVED redirections followed")            \
    X(counter, redis_ask, "Cluster ASK redirections followed")                \
    X(gauge, pubsub_channels, "Channels the subscriber connection holds")     \
    X(gauge, locks_held, "Locks this daemon holds for its clients")           \
    X(gauge, lock_waiters, "Lock requests waiting")                           \
    X(age_ms, lock_wait_oldest_ms,                                            \
      "How long the longest waiting lock request has waited")                 \
    X(counter, lock_acquired, "Locks acquired (new and reentrant)")           \
    X(counter, lock_contended, "Lock attempts that found the lock taken")     \
    X(counter, lock_released, "Locks released")                               \
    X(counter, lock_renewals_ok, "Watchdog renewals that succeeded")          \
    X(counter, lock_renewals_failed, "Watchdog renewals that failed")         \
    X(counter, lock_lost, "Locks lost (lock_lost events)")                    \
    X(counter, lock_wakeups,                                                  \
      "Waiter wake-ups by unlock message or lease end")                       \
    X(gauge, sem_holds, "Semaphore grants held by this daemon's sessions")    \
    X(counter, sem_acquired, "Semaphore permits granted (acquisitions)")      \
    X(counter, sem_released, "Semaphore acquisitions released")               \
    X(counter, rate_granted, "rate.acquire requests granted")                 \
    X(counter, rate_refused, "rate.acquire requests answered not acquired")   \
    X(gauge, rate_waiting, "rate.acquire requests refused once, waiting")     \
    X(counter, bloom_added, "Keys added to Bloom filters (bloom.add)")        \
    X(counter, bloom_checked,                                                 \
      "Keys checked against Bloom filters (bloom.check, cache.get)")          \
    X(counter, bloom_ruled_out, "Keys checked that a Bloom filter ruled out") \
    X(counter, cancelled, "Waiting requests ended by cancel")                 \
    X(counter, cache_hits, "cache.get hits with a value")                     \
    X(counter, cache_negative_hits, "cache.get hits on a cached null")        \
    X(counter, cache_bloom_hits,                                              \
      "cache.get answered a null at once: its Bloom filter ruled the key "    \
      "out")                                                                  \
    X(counter, cache_misses, "cache.get misses")                              \
    X(counter, cache_stale_hits, "cache.get hits on a stale value")           \
    X(counter, cache_leases_granted, "Fill leases granted")                   \
    X(counter, cache_waits, "cache.get calls that waited for a fill")         \
    X(counter, cache_refreshes_granted,                                       \
      "Leases to reload a value early (cache.early_refresh)")                 \
    X(counter, cache_fills_stored, "cache.fill calls that stored")            \
    X(counter, cache_fills_rejected,                                          \
      "cache.fill calls refused (stale lease)")                               \
    X(counter, cache_invalidations, "Keys invalidated")                       \
    X(gauge, cache_invalidations_pending, "Deletes waiting in the journal")   \
    X(counter, cache_invalidations_retried,                                   \
      "Deletes retried after a failure")                                      \
    X(age_ms, cache_invalidations_overdue_ms,                                 \
      "How far past its due time the oldest pending delete is")               \
    X(gauge, journal_bytes, "Size of the invalidation journal")               \
    X(gauge, near_entries, "Near-cache entries")                              \
    X(gauge, near_bytes, "Near-cache bytes, bookkeeping included")            \
    X(counter, near_hits, "cache.get hits served from the near cache")        \
    X(gauge, near_tracking,                                                   \
      "1 while every command connection is tracked towards the daemon")       \
    X(counter, near_flushes, "Near-cache flushes (tracking or link lost)")    \
    X(counter, near_evictions_lru, "Near entries evicted for max_bytes")      \
    X(counter, near_evictions_ttl, "Near entries dropped at their Redis TTL") \
    X(counter, near_evictions_tracking,                                       \
      "Near entries invalidated by Redis or by this daemon's writes")         \
    X(counter, near_evictions_flush, "Near entries dropped by a flush")       \
    X(gauge, near_shared_bytes,                                               \
      "Shared near cache segments' size, all segments")                       \
    X(gauge, near_shared_used_bytes,                                          \
      "Shared near cache bytes held by live records, all segments")           \
    X(gauge, near_shared_entries, "Shared near cache entries, all segments")  \
    X(counter, near_shared_hits,                                              \
      "Hits clients served from a shared segment (near.hits)")                \
    X(counter, near_shared_fallbacks,                                         \
      "Lookups clients took to the socket instead (near.hits)")               \
    X(counter, near_shared_maps, "Segments handed out by near.map")

struct ld_stats {
#define LD_STATS_DECL(kind, name, help) long long name;
    LD_STATS_FIELDS(LD_STATS_DECL)
#undef LD_STATS_DECL
};

extern struct ld_stats ld_stats;

/* Per-op request counts and per-code error counts are kept by index in the
 * dispatch table and the error code list. */
void ld_stats_count_op(const char *op);
void ld_stats_count_error(int code);

/* The `stats` reply body: {"uptime_s":..,"requests_by_op":{..},..}. */
json_t *ld_stats_json(void);

/* Prometheus text exposition (caller frees). */
char *ld_stats_prometheus(size_t *len);

/* A module's own families, appended to the exposition: FN returns
 * malloc'd text of complete lines, or NULL for none. Registering the same
 * FN again is a no-op. */
typedef char *ld_stats_prom_fn(size_t *len);
void ld_stats_add_prometheus(ld_stats_prom_fn *fn);

/* Histograms of lock wait, lock hold and Redis round trip (microseconds),
 * exposed by the metrics endpoint. */
enum ld_histo {
    LD_HISTO_LOCK_WAIT,
    LD_HISTO_LOCK_HOLD,
    LD_HISTO_REDIS_RTT,
    LD_HISTO__COUNT
};
void ld_stats_observe(enum ld_histo h, uint64_t us);

/* Figures that are cheaper to compute when read than to keep current
 * (the age of the oldest waiter): FN sets its fields of ld_stats and runs
 * before either view is rendered. Registering the same FN again is a
 * no-op. */
typedef void ld_stats_refresh_fn(void);
void ld_stats_add_refresh(ld_stats_refresh_fn *fn);

struct ld_ctx;
/* Zeroes every figure; uptime and instance are read from CTX. */
int ld_stats_init(const struct ld_ctx *ctx);
/* The bound TCP port, reported by `stats` (0: none). */
void ld_stats_set_tcp_port(int port);
/* The address of the Redis (master) in use, "" while none is known. */
void ld_stats_set_redis_master(const char *address);

#endif
