#ifndef LD_DISPATCH_H
#define LD_DISPATCH_H

#include "ld_common.h"
#include "ld_op.h"

struct ld_req;

/* Feature modules register their rows at init, N of them from OPS (a
 * static array: the table keeps pointers to the rows). A name registered
 * again takes the new row. An op of the contract that no module
 * registered answers unknown_op like any other unknown name. */
int ld_dispatch_register_ops(const struct ld_op *ops, size_t n);

/* The check of the operator ops (LD_OP_ADMIN), which the admin module
 * sets at init: false when REQ may not run one, REQ then answered. */
typedef bool ld_op_check(struct ld_req *req);
void ld_dispatch_set_admin_check(ld_op_check *fn);

/* A module whose state can make the daemon unfit for work (the journal,
 * say) registers a check at init: it returns NULL when all is well, else
 * the reason as one word ("journal_failed"). */
typedef const char *ld_ready_fn(void);
void ld_dispatch_add_ready_check(ld_ready_fn *fn);

/* NULL when the daemon is ready to serve (Redis reachable, no check
 * failing, not stopping), else the reason as one word. */
const char *ld_dispatch_not_ready(void);

/* Route a parsed request: the auth, shutdown and pending checks, those
 * its op's flags call for, then the handler. Consumes REQ. */
void ld_dispatch(struct ld_req *req);

struct ld_ctx;
int ld_dispatch_init(const struct ld_ctx *ctx);
void ld_dispatch_free(void);

#endif
