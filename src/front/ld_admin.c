/*
 * Operator ops: lock.list and lock.force_unlock.
 *
 * Who may run them is decided when the session is made (the Unix socket:
 * whoever can open it already can do anything a client can, as with
 * pgbouncer's admin console over its socket) or by hello (TCP: the admin
 * token); this module only reads the session's flag. What is listed and
 * how a lock is forced belong to the lock modules, which plug in here.
 *
 * This module owns the operator ops' fields and the lister and forcer
 * slots. It must not reach into the lock modules' state (they list and
 * force through their plug-ins), and dispatch, not the op, asks
 * ld_admin_check before an op flagged LD_OP_ADMIN runs.
 */
#include "ld_admin.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_errcode.h"
#include "ld_features.h"
#include "ld_log.h"
#include "ld_ns.h"
#include "ld_proto.h"
#include "ld_session.h"

#include <jansson.h>
#include <string.h>

#define MAX_LISTERS 8
#define LIST_LIMIT_DEFAULT 100
#define LIST_LIMIT_MAX 100000

struct ld_admin_list {
    const char *prefix;
    size_t prefix_len;
    long long limit;
    json_t *locks;
    bool truncated;
};

static struct {
    const struct ld_ctx *ctx;
    ld_admin_lister *listers[MAX_LISTERS];
    size_t n_listers;
    ld_admin_forcer *forcer;
} admin_mod;

bool
ld_admin_check(struct ld_req *req)
{
    if (req->sess->admin && !ld_ns_may_operate(req->sess)) {
        ld_reply_error(req, LD_E_UNAUTHORIZED,
                       "op '%s' is for operators: this client's entry in "
                       "listen.namespaces has no admin: true",
                       req->op);
        return false;
    }
    if (req->sess->admin) {
        return true;
    }
    if (admin_mod.ctx->cfg->listen.admin_token[0] == '\0') {
        ld_reply_error(req, LD_E_UNAUTHORIZED,
                       "op '%s' is for operators: on the Unix socket only "
                       "(listen.admin_token is not set)",
                       req->op);
    } else {
        ld_reply_error(req, LD_E_UNAUTHORIZED,
                       "op '%s' is for operators: send hello with "
                       "admin_token first",
                       req->op);
    }
    return false;
}

void
ld_admin_add_lister(ld_admin_lister *fn)
{
    for (size_t i = 0; i < admin_mod.n_listers; i++) {
        if (admin_mod.listers[i] == fn) {
            return;
        }
    }
    if (admin_mod.n_listers == MAX_LISTERS) {
        log_error("admin lister table full");
        return;
    }
    admin_mod.listers[admin_mod.n_listers++] = fn;
}

void
ld_admin_set_forcer(ld_admin_forcer *fn)
{
    admin_mod.forcer = fn;
}

bool
ld_admin_list_wants(const struct ld_admin_list *l, const char *key, size_t len)
{
    return len >= l->prefix_len && memcmp(key, l->prefix, l->prefix_len) == 0;
}

bool
ld_admin_list_add(struct ld_admin_list *l, const struct ld_admin_lock *e)
{
    if ((long long)json_array_size(l->locks) >= l->limit) {
        l->truncated = true;
        return false;
    }
    const struct ld_session *s = e->sess;
    json_t *o = json_pack("{s:s%,s:s,s:o,s:s,s:I,s:I,s:I,s:I}", "key", e->key,
                          e->key_len, "mode", e->mode, "session",
                          s != NULL ? json_string(s->name) : json_null(),
                          "client", s != NULL ? s->client : "", "count",
                          (json_int_t)e->count, "ttl_ms",
                          (json_int_t)e->ttl_ms, "held_ms",
                          (json_int_t)e->held_ms, "waiters",
                          (json_int_t)e->waiters);
    if (o != NULL) {
        json_array_append_new(l->locks, o);
    }
    return true;
}

static void
op_lock_list(struct ld_req *req)
{
    struct ld_admin_list l = {.prefix = "", .limit = LIST_LIMIT_DEFAULT};
    if (ld_req_str(req, "prefix", false, &l.prefix, &l.prefix_len, NULL) !=
            LD_OK ||
        ld_req_int(req, "limit", false, 1, LIST_LIMIT_MAX, &l.limit, NULL) !=
            LD_OK) {
        return;
    }
    l.locks = json_array();
    for (size_t i = 0; i < admin_mod.n_listers && !l.truncated; i++) {
        admin_mod.listers[i](&l);
    }
    ld_reply_ok(req, json_pack("{s:o,s:b}", "locks", l.locks, "truncated",
                               l.truncated));
}

static void
op_force_unlock(struct ld_req *req)
{
    const char *key;
    size_t len;
    if (ld_req_key(req, "key", &key, &len) != LD_OK) {
        return;
    }
    if (admin_mod.forcer == NULL) {
        ld_reply_error(req, LD_E_INTERNAL, "no lock module to force");
        return;
    }
    log_info("lock.force_unlock asked key=%.*s session=%s client=%s", (int)len,
             key, req->sess->name,
             req->sess->client[0] != '\0' ? req->sess->client : "-");
    admin_mod.forcer(req, key, len);
}

int
ld_admin_init(const struct ld_ctx *ctx)
{
    static const struct ld_op admin_ops[] = {
        {"lock.list", op_lock_list, LD_OP_ADMIN},
        {"lock.force_unlock", op_force_unlock, LD_OP_ADMIN},
    };
    admin_mod.ctx = ctx;
    ld_dispatch_set_admin_check(ld_admin_check);
    if (ld_dispatch_register_ops(admin_ops, LD_ARRAY_LEN(admin_ops)) !=
        LD_OK) {
        return LD_ERR;
    }
    ld_features_add("admin");
    return LD_OK;
}

void
ld_admin_free(void)
{
    admin_mod.n_listers = 0;
    admin_mod.forcer = NULL;
}
