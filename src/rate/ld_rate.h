#ifndef LD_RATE_H
#define LD_RATE_H

#include "ld_common.h"

struct ld_ctx;

/* The rate limiter: registers rate.acquire and the session close hook
 * that ends the waits of a closing session. */
int ld_rate_init(const struct ld_ctx *ctx);
/* Graceful stop: answer every waiting request now. */
void ld_rate_shutdown(void);
void ld_rate_free(void);

#endif
