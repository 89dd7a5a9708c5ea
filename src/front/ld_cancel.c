/*
 * The cancel op. Requests that wait (lock, sem.acquire, cache.get) are
 * listed on their session while they may be cancelled; the module that
 * parks one says how its wait ends (ld_cancel_on).
 *
 * This module owns the list's entries and the op. How a wait ends, and
 * the waiting request itself, are the parking module's: cancelling calls
 * its function, which answers the request and frees it, and nothing of
 * the request is touched after.
 */
#include "ld_cancel.h"

#include "ld_dispatch.h"
#include "ld_features.h"
#include "ld_json.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <string.h>

void
ld_cancel_on(struct ld_req *req, ld_cancel_fn *fn, void *arg)
{
    if (req->cancel_fn == NULL) {
        LIST_INSERT_HEAD(&req->sess->cancellable, req, cancel_link);
    }
    req->cancel_fn = fn;
    req->cancel_arg = arg;
}

static void
op_cancel(struct ld_req *req)
{
    struct ld_rval target;
    ld_req_get(req, "target", &target);
    if (target.kind != LD_RV_STR && target.kind != LD_RV_INT) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'target' is required: the id (string or "
                       "integer) of a waiting request of this session");
        return;
    }
    /* Ids are kept as their JSON text, which is canonical for strings and
     * integers: the same id is the same text. */
    char *text = ld_xmalloc(target.kind == LD_RV_STR
                                ? ld_json_quote_max(target.len)
                                : LD_JSON_INT_MAX);
    size_t len = target.kind == LD_RV_STR
                     ? ld_json_quote(text, target.s, target.len)
                     : ld_json_format_int(text, target.i);
    bool done = false;
    struct ld_req *r;
    LIST_FOREACH(r, &req->sess->cancellable, cancel_link)
    {
        if (r != req && r->id != NULL && r->id_len == len &&
            memcmp(r->id, text, len) == 0) {
            /* FN answers R, which frees it: nothing of R is used after. */
            done = r->cancel_fn(r->cancel_arg);
            break;
        }
    }
    free(text);
    if (done) {
        ld_stats.cancelled++;
    }
    ld_reply_ok(req, json_pack("{s:b}", "cancelled", done));
}

int
ld_cancel_init(const struct ld_ctx *ctx)
{
    static const struct ld_op cancel_op = {"cancel", op_cancel, 0};
    LD_UNUSED(ctx);
    ld_features_add("cancel");
    return ld_dispatch_register_ops(&cancel_op, 1);
}
