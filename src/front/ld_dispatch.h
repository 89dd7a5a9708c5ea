#ifndef LD_DISPATCH_H
#define LD_DISPATCH_H

#include "ld_common.h"

struct ld_req;

typedef void ld_handler(struct ld_req *req);

/* Feature modules register their ops at init. An op of the contract that
 * no module registered answers unknown_op like any other unknown name. */
int ld_dispatch_register(const char *op, ld_handler *fn);

/* A module whose state can make the daemon unfit for work (the journal,
 * say) registers a check at init: it returns NULL when all is well, else
 * the reason as one word ("journal_failed"). */
typedef const char *ld_ready_fn(void);
void ld_dispatch_add_ready_check(ld_ready_fn *fn);

/* NULL when the daemon is ready to serve (Redis reachable, no check
 * failing, not stopping), else the reason as one word. */
const char *ld_dispatch_not_ready(void);

/* Route a parsed request: auth, shutdown and pending checks, then the
 * handler. Consumes REQ. */
void ld_dispatch(struct ld_req *req);

struct ld_ctx;
int ld_dispatch_init(const struct ld_ctx *ctx);
void ld_dispatch_free(void);

#endif
