#ifndef LD_SEM_H
#define LD_SEM_H

#include "ld_common.h"

struct ld_ctx;

/* Semaphores: registers sem.acquire, sem.release and sem.info, the
 * session close hook and the watchdog of session-bound grants. Needs the
 * lock module's wait queues (ld_lock_init first). */
int ld_sem_init(const struct ld_ctx *ctx);
/* Graceful stop: give back every session-bound grant now. */
void ld_sem_shutdown(void);
/* The master changed: the grants are checked again on the new one when
 * the backend comes back, and those gone are lost to the failover. */
void ld_sem_failover(void);
void ld_sem_free(void);

#endif
