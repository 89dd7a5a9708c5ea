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

#endif
