#ifndef LD_LOCK_H
#define LD_LOCK_H

#include "ld_common.h"

struct ld_ctx;

/* Locks: registers lock, unlock, extend and lock.info, the session close
 * hook and the watchdog pass. Keeps CTX and reads ctx->cfg live, so
 * reloads apply. */
int ld_lock_init(const struct ld_ctx *ctx);
/* Graceful stop: release every session-bound lock now. */
void ld_lock_shutdown(void);
void ld_lock_free(void);

/* The master changed (a failover was followed): the check of every held
 * lock that runs once the new master answers reports the locks it finds
 * gone as lost with reason "failover". */
void ld_lock_failover(void);

#endif
