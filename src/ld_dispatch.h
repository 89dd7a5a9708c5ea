#ifndef LD_DISPATCH_H
#define LD_DISPATCH_H

#include "ld_common.h"

struct ld_req;

typedef void ld_handler(struct ld_req *req);

/* Feature modules register their ops at init. An op of the contract that
 * no module registered answers unknown_op like any other unknown name. */
int ld_dispatch_register(const char *op, ld_handler *fn);

/* Route a parsed request: auth, shutdown and pending checks, then the
 * handler. Consumes REQ. */
void ld_dispatch(struct ld_req *req);

struct ld_ctx;
int ld_dispatch_init(const struct ld_ctx *ctx);
void ld_dispatch_free(void);

#endif
