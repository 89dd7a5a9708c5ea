#ifndef LD_CANCEL_H
#define LD_CANCEL_H

#include "ld_common.h"

struct ld_ctx;
struct ld_req;

/* The cancel op: {"op":"cancel","target":ID} ends the wait of the
 * session's request whose id is ID. A module whose request starts to wait
 * marks it cancellable with FN: FN(ARG) answers the request at once as if
 * its wait had run out and returns true, or returns false when it cannot
 * (the request is no longer waiting). Whatever the request acquires after
 * that answer is the module's to give back. Answering the request takes
 * it off the list; marking it again replaces FN. */
typedef bool ld_cancel_fn(void *arg);
void ld_cancel_on(struct ld_req *req, ld_cancel_fn *fn, void *arg);

/* Registers the op. */
int ld_cancel_init(const struct ld_ctx *ctx);

#endif
