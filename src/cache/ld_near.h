#ifndef LD_NEAR_H
#define LD_NEAR_H

#include "ld_common.h"

struct ld_conn_addr;
struct ld_ctx;

/* The near cache (cache.near.*): values that cache.get and cache.mget read
 * from Redis, kept in the daemon and served without a Redis round trip,
 * kept right by Redis client tracking (ld_near_track.c). The cache module
 * calls in here; nothing here knows about requests.
 *
 * A read that may be kept goes to Redis as three pipelined commands on one
 * connection: CLIENT CACHING yes (ld_near_read_begin), the cache's own
 * probe, PTTL (ld_near_read_sent); the probe's answer comes back through
 * ld_near_read_done. All of it is a no-op while cache.near.enabled is
 * false. */

int ld_near_init(const struct ld_ctx *ctx);
/* Connects the tracking connection (sentinel mode: once a master is
 * known; cluster mode: one per master, as the daemon connects to it). */
void ld_near_start(void);
/* Sentinel mode: the master is at ADDR from now on. Everything kept is
 * flushed and the tracking connection moves there. */
void ld_near_set_address(const struct ld_conn_addr *addr);
void ld_near_free(void);
/* The configuration was reloaded: the shared segments follow it. */
void ld_near_reloaded(void);

bool ld_near_enabled(void);

/* The value kept for KEY, if any and still valid at NOW_US (the caller's
 * reading of ld_now_us: a near hit is answered from one reading of the
 * clock), as the JSON string literal a reply carries (quotes included; a
 * value that is not valid UTF-8 is never kept): *JSON (LEN bytes) stays
 * valid until the caller returns to the loop. A miss is counted towards
 * cache.near.min_hits. */
bool ld_near_get(const char *key, size_t len, uint64_t now_us,
                 const char **json, size_t *jlen);
/* The same, with the version of the value kept (versioned writes). */
bool ld_near_get_version(const char *key, size_t len, uint64_t now_us,
                         const char **json, size_t *jlen, uint64_t *version);

struct ld_near_read;
/* A read of KEY's entry ENTRY (also the route of its commands) is about to
 * be sent: NULL when its value would not be kept (disabled, tracking not
 * ready, KEY not read often enough), else a handle for the two calls
 * below. */
struct ld_near_read *ld_near_read_begin(const char *key, size_t len,
                                        const char *entry, size_t entry_len);
/* The read has been sent (NR may be NULL). */
void ld_near_read_sent(struct ld_near_read *nr);
/* The version of the value the read found, before ld_near_read_done (NR
 * may be NULL): kept with it. */
void ld_near_read_version(struct ld_near_read *nr, uint64_t version);
/* Its answer: the value V (NULL: none, or no answer), which came on
 * connection CONN_ID (ld_redis_conn_id). NR may be NULL; it is not used
 * again by the caller. */
void ld_near_read_done(struct ld_near_read *nr, uint64_t conn_id,
                       const char *v, size_t vlen);

/* This daemon writes or deletes KEY: what is kept goes at once, and no
 * read already in flight is kept. */
void ld_near_evict(const char *key, size_t len);

#endif
