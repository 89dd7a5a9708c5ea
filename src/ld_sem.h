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
void ld_sem_free(void);

#endif
