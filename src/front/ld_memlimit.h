#ifndef LD_MEMLIMIT_H
#define LD_MEMLIMIT_H

#include "ld_common.h"

struct ld_ctx;
struct ld_req;

/* limits.max_memory_bytes: a daemon-wide bound on what clients make the
 * daemon hold. Past it, ops that would add work get busy; those that
 * free or keep what is already held still run. */
void ld_memlimit_init(const struct ld_ctx *ctx);

/* The daemon's own accounting: the sessions' socket buffers, the bytes
 * each request in flight holds (requests_bytes) and a fixed cost for the
 * state of its op, and the near cache. */
size_t ld_memlimit_used(void);

/* Before REQ's handler runs: true when REQ was answered busy because the
 * accounting is past the limit and REQ would add work, as its op's
 * OP_FLAGS (enum ld_op_flag) tell. */
bool ld_memlimit_refuse(struct ld_req *req, unsigned op_flags);

#endif
