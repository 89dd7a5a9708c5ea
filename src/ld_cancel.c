/*
 * The cancel op. Requests that wait (lock, sem.acquire, cache.get) are
 * listed on their session while they may be cancelled; the module that
 * parks one says how its wait ends (ld_cancel_on).
 */
#include "ld_cancel.h"

#include "ld_dispatch.h"
#include "ld_features.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"

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
    json_t *target = json_object_get(req->body, "target");
    if (target == NULL ||
        !(json_is_string(target) || json_is_integer(target))) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'target' is required: the id (string or "
                       "integer) of a waiting request of this session");
        return;
    }
    bool done = false;
    struct ld_req *r;
    LIST_FOREACH(r, &req->sess->cancellable, cancel_link)
    {
        if (r != req && r->id != NULL && json_equal(r->id, target)) {
            /* FN answers R, which frees it: nothing of R is used after. */
            done = r->cancel_fn(r->cancel_arg);
            break;
        }
    }
    if (done) {
        ld_stats.cancelled++;
    }
    ld_reply_ok(req, json_pack("{s:b}", "cancelled", done));
}

int
ld_cancel_init(const struct ld_ctx *ctx)
{
    LD_UNUSED(ctx);
    ld_features_add("cancel");
    return ld_dispatch_register("cancel", op_cancel);
}
