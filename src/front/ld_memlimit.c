/*
 * limits.max_memory_bytes (ld_memlimit.h). The accounting is of what
 * clients can make grow, kept up to date where it changes, so a check
 * costs a few additions per request.
 *
 * This module owns the refusal of new work and how often it is logged.
 * It only reads the accounting (the sessions' buffers, the figures in
 * ld_stats the other modules keep): it must not change it, nor decide
 * which op adds work (the op's row in the op table says so).
 */
#include "ld_memlimit.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_errcode.h"
#include "ld_log.h"
#include "ld_op.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <string.h>

#include <jansson.h>

/* What one request in flight holds besides its own bytes (the record,
 * its text or JSON tree: requests_bytes): the state of its op. */
#define REQUEST_COST 1024

/* The refusal is logged at most this often. */
#define LOG_INTERVAL_MS 10000

static struct {
    const struct ld_ctx *ctx;
    uint64_t logged_ms;
} memlimit_mod;

void
ld_memlimit_init(const struct ld_ctx *ctx)
{
    memlimit_mod.ctx = ctx;
    memlimit_mod.logged_ms = 0;
}

size_t
ld_memlimit_used(void)
{
    long long pending = ld_stats.requests_pending;
    long long held = ld_stats.requests_bytes;
    long long near = ld_stats.near_bytes;
    return ld_session_buffered_bytes() +
           (size_t)(pending > 0 ? pending : 0) * REQUEST_COST +
           (size_t)(held > 0 ? held : 0) + (size_t)(near > 0 ? near : 0);
}

/* Ops that add work say so in their flags (ld_op.h): every cache
 * read or write, and a lock or semaphore acquisition that may wait. The
 * rest (ping, unlock, extend, cache.invalidate, cache.release, ...)
 * frees or keeps what is held. */
static bool
adds_work(const struct ld_req *req, unsigned op_flags)
{
    if ((op_flags & LD_OP_ADDS_WORK) != 0) {
        return true;
    }
    if ((op_flags & LD_OP_WAITS) != 0) {
        /* wait_ms defaults to 0 (try once); a malformed one is left to
         * the op, which answers bad_request. */
        struct ld_rval w;
        ld_req_get(req, "wait_ms", &w);
        return w.kind == LD_RV_INT && w.i != 0;
    }
    return false;
}

bool
ld_memlimit_refuse(struct ld_req *req, unsigned op_flags)
{
    long long limit = memlimit_mod.ctx->cfg->limits.max_memory_bytes;
    if (limit <= 0 || !adds_work(req, op_flags)) {
        return false;
    }
    size_t used = ld_memlimit_used();
    if (used <= (size_t)limit) {
        return false;
    }
    uint64_t now = ld_now_ms();
    if (memlimit_mod.logged_ms == 0 ||
        now - memlimit_mod.logged_ms >= LOG_INTERVAL_MS) {
        memlimit_mod.logged_ms = now;
        log_warn("memory over the limit, new work refused used=%zu "
                 "limit=%lld (limits.max_memory_bytes)",
                 used, limit);
    }
    ld_reply_error(req, LD_E_BUSY,
                   "the daemon is over its memory limit "
                   "(limits.max_memory_bytes)");
    return true;
}
