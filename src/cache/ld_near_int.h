#ifndef LD_NEAR_INT_H
#define LD_NEAR_INT_H

/* What ld_near.c (the store) and ld_near_track.c (client tracking) share;
 * no other module includes this. */

#include "ld_common.h"

struct ld_conn_addr;
struct ld_ctx;

/* ld_near.c */
/* Drop everything kept and every read in flight; WHY for the log. */
void near_flush(const char *why);
/* Redis says REDIS_KEY (an entry's Redis key, or any other key) changed. */
void near_invalidate(const char *redis_key, size_t len);

/* ld_near_seg.c: the shared segments (cache.near.shared_bytes) */
int near_seg_init(const struct ld_ctx *ctx);
void near_seg_free(void);
/* Segments exist: values are put in them. */
bool near_seg_on(void);
/* KEY's value V (as stored in Redis) of VERSION (0: none) is kept until
 * EXPIRE_US (ld_now_us time; 0: no TTL): into every segment KEY belongs
 * to. */
void near_seg_put(const char *key, size_t klen, const char *v, size_t vlen,
                  uint64_t expire_us, uint64_t version);
/* KEY's entry is gone: out of every segment, before this returns. */
void near_seg_del(const char *key, size_t klen);
/* Every segment emptied, its epoch moved. */
void near_seg_flush(void);
/* After a reload: true when the segments were replaced (the caller then
 * flushes the near cache, so that both fill again together). */
bool near_seg_reload(void);

/* ld_near_track.c */
int near_track_init(const struct ld_ctx *ctx);
void near_track_start(void);
void near_track_set_address(const struct ld_conn_addr *addr);
void near_track_free(void);
/* Invalidations are being received: what is read may be kept. */
bool near_track_armed(void);
/* Reads that came on CONN_ID are tracked, and their invalidations reach
 * the tracking connection. */
bool near_track_trusted(uint64_t conn_id);

#endif
