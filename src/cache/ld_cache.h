#ifndef LD_CACHE_H
#define LD_CACHE_H

#include "ld_common.h"

struct ld_ctx;

/* Cache-aside: registers the cache.* ops and owns the invalidation journal
 * (opened and replayed here). Returns LD_ERR when the journal cannot be
 * opened. */
int ld_cache_init(const struct ld_ctx *ctx);
/* Graceful stop: flush and fsync the journal. */
void ld_cache_shutdown(void);
/* Graceful stop, before the journal's flush: hand the deletes still due
 * to Redis (the due set), where any daemon sharing cache.prefix carries
 * them out, so that they survive this daemon's directory. */
void ld_cache_hand_over(void);
void ld_cache_free(void);

#endif
