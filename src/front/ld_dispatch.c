/*
 * The op table. Core ops (hello, ping, stats) live here; feature modules
 * add theirs at init, so an op whose module is absent is simply unknown.
 */
#include "ld_dispatch.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_features.h"
#include "ld_log.h"
#include "ld_ns.h"
#include "ld_memlimit.h"
#include "ld_proto.h"
#include "ld_redis.h"
#include "ld_redlock.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <string.h>

#define MAX_OPS 32
#define MAX_READY_CHECKS 4

struct op_entry {
    const char *name;
    size_t len; /* of name: most ops are told apart by it alone */
    ld_handler *fn;
};

static struct {
    const struct ld_ctx *ctx;
    struct op_entry ops[MAX_OPS];
    size_t n_ops;
    ld_ready_fn *ready_checks[MAX_READY_CHECKS];
    size_t n_ready_checks;
} dispatch_mod;

void
ld_dispatch_add_ready_check(ld_ready_fn *fn)
{
    for (size_t i = 0; i < dispatch_mod.n_ready_checks; i++) {
        if (dispatch_mod.ready_checks[i] == fn) {
            return;
        }
    }
    LD_ASSERT(dispatch_mod.n_ready_checks < MAX_READY_CHECKS);
    dispatch_mod.ready_checks[dispatch_mod.n_ready_checks++] = fn;
}

/* With lock.redlock the locks need a quorum of their instances besides
 * the main Redis the cache uses. */
static bool
redis_reachable(void)
{
    if (!ld_redis_ready()) {
        return false;
    }
    return dispatch_mod.ctx->cfg->lock.redlock.count == 0 ||
           ld_redlock_ready_count() >= ld_redlock_quorum();
}

const char *
ld_dispatch_not_ready(void)
{
    if (dispatch_mod.ctx->shutting_down) {
        return "shutting_down";
    }
    if (dispatch_mod.ctx->draining) {
        return "draining";
    }
    if (!redis_reachable()) {
        return "redis_unavailable";
    }
    for (size_t i = 0; i < dispatch_mod.n_ready_checks; i++) {
        const char *why = dispatch_mod.ready_checks[i]();

        if (why != NULL) {
            return why;
        }
    }
    return NULL;
}

int
ld_dispatch_register(const char *op, ld_handler *fn)
{
    for (size_t i = 0; i < dispatch_mod.n_ops; i++) {
        if (strcmp(dispatch_mod.ops[i].name, op) == 0) {
            dispatch_mod.ops[i].fn = fn;
            return LD_OK;
        }
    }
    if (dispatch_mod.n_ops == MAX_OPS) {
        log_error("dispatch table full op=%s", op);
        return LD_ERR;
    }
    dispatch_mod.ops[dispatch_mod.n_ops].name = op;
    dispatch_mod.ops[dispatch_mod.n_ops].len = strlen(op);
    dispatch_mod.ops[dispatch_mod.n_ops].fn = fn;
    dispatch_mod.n_ops++;
    return LD_OK;
}

/* Runs for every request: a length compare turns away most entries
 * before any byte of the name is looked at. */
static const struct op_entry *
find_op(const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; i < dispatch_mod.n_ops; i++) {
        const struct op_entry *e = &dispatch_mod.ops[i];
        if (e->len == len && memcmp(e->name, name, len) == 0) {
            return e;
        }
    }
    return NULL;
}

static void
op_ping(struct ld_req *req)
{
    ld_reply_ok(req, NULL);
}

static void
op_hello(struct ld_req *req)
{
    const char *client = NULL;
    const char *auth = NULL;
    const char *admin = NULL;
    size_t client_len = 0;
    size_t auth_len = 0;
    size_t admin_len = 0;
    bool has_auth = false;
    bool has_admin = false;

    if (ld_req_str(req, "client", false, &client, &client_len, NULL) !=
            LD_OK ||
        ld_req_str(req, "auth", false, &auth, &auth_len, &has_auth) != LD_OK ||
        ld_req_str(req, "admin_token", false, &admin, &admin_len,
                   &has_admin) != LD_OK) {
        return;
    }
    struct ld_session *s = req->sess;
    const char *token = dispatch_mod.ctx->cfg->listen.auth_token;
    size_t token_len = strlen(token);
    const char *atoken = dispatch_mod.ctx->cfg->listen.admin_token;
    size_t atoken_len = strlen(atoken);

    /* The admin token is the operator's identity (protocol.md "Operator
     * ops"), given as admin_token, or as auth like any token. It also
     * authenticates: whoever holds it may do more than an app. */
    bool is_admin = false;
    if (has_admin) {
        if (atoken_len == 0 ||
            !ld_secure_equal(admin, admin_len, atoken, atoken_len)) {
            log_warn("hello refused session=%s reason=bad_admin_token",
                     s->name);
            ld_reply_error(req, LD_E_UNAUTHORIZED,
                           atoken_len == 0 ? "listen.admin_token is not set"
                                           : "bad admin_token");
            return;
        }
        is_admin = true;
    } else if (has_auth && atoken_len > 0 &&
               ld_secure_equal(auth, auth_len, atoken, atoken_len)) {
        is_admin = true;
        has_auth = false;
    }
    if (is_admin && !has_auth) {
        s->authed = true;
    }

    /* A token, when configured, is checked wherever it is offered; it is
     * required only where the listener says so. */
    if (has_auth && ld_ns_takes_auth(s)) {
        /* With namespaces a TCP client's token also names its namespace
         * (ld_ns.c); a token that is none of them is refused. */
        if (!ld_ns_hello_auth(s, auth, auth_len)) {
            log_warn("hello refused session=%s reason=bad_auth", s->name);
            ld_reply_error(req, LD_E_UNAUTHORIZED, "bad auth");
            return;
        }
    } else if (token_len > 0 && (has_auth || !s->authed)) {
        if (!has_auth || !ld_secure_equal(auth, auth_len, token, token_len)) {
            log_warn("hello refused session=%s reason=bad_auth", s->name);
            ld_reply_error(req, LD_E_UNAUTHORIZED, "bad or missing auth");
            return;
        }
    }
    s->authed = true;
    if (has_auth) {
        ld_ns_hello_token(s, auth, auth_len);
    }
    if (is_admin) {
        s->admin = true;
        log_info("operator session=%s", s->name);
    }
    if (client != NULL) {
        snprintf(s->client, sizeof(s->client), "%.*s",
                 (int)(client_len < sizeof(s->client) - 1
                           ? client_len
                           : sizeof(s->client) - 1),
                 client);
    }
    /* The optional parts of the protocol this daemon offers, as the
     * modules added them (ld_features.h); a client checks before it
     * relies on one. */
    ld_reply_ok(req,
                json_pack("{s:s,s:s,s:i,s:s,s:o}", "server", "leased",
                          "version", PACKAGE_VERSION, "protocol", 1, "session",
                          s->name, "features", ld_features_json()));
}

/* The contract fixes ping's reply at {"ok":true} and lets stats carry
 * more figures than it lists: readiness (what leasectl ping reports) is
 * told here. */
static void
op_stats(struct ld_req *req)
{
    json_t *st = ld_stats_json();
    const char *why = ld_dispatch_not_ready();

    json_object_set_new(st, "ready", json_boolean(why == NULL));
    if (why != NULL) {
        json_object_set_new(st, "not_ready", json_string(why));
    }
    ld_reply_ok(req, json_pack("{s:o}", "stats", st));
}

void
ld_dispatch(struct ld_req *req)
{
    struct ld_session *s = req->sess;
    const struct op_entry *e = find_op(req->op);

    if (e != NULL) {
        ld_stats_count_op(e->name);
    }
    if (!s->authed && (e == NULL || e->fn != op_hello)) {
        ld_reply_error(req, LD_E_UNAUTHORIZED,
                       "this listener requires hello with auth first");
        return;
    }
    if (e == NULL) {
        ld_reply_error(req, LD_E_UNKNOWN_OP, "unknown op '%s'", req->op);
        return;
    }
    if (dispatch_mod.ctx->shutting_down) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        return;
    }
    /* pending already counts this request. */
    if (s->pending > dispatch_mod.ctx->cfg->limits.max_pending) {
        ld_reply_error(req, LD_E_BUSY,
                       "too many requests in flight on this connection "
                       "(limits.max_pending %lld)",
                       dispatch_mod.ctx->cfg->limits.max_pending);
        return;
    }
    if (e->fn != op_hello && e->fn != op_ping && e->fn != op_stats &&
        ld_ns_check(req) != LD_OK) {
        return;
    }
    if (ld_memlimit_refuse(req)) {
        return;
    }
    e->fn(req);
}

int
ld_dispatch_init(const struct ld_ctx *ctx)
{
    dispatch_mod.ctx = ctx;
    dispatch_mod.n_ops = 0;
    dispatch_mod.n_ready_checks = 0;
    ld_memlimit_init(ctx);
    ld_dispatch_register("hello", op_hello);
    ld_dispatch_register("ping", op_ping);
    ld_dispatch_register("stats", op_stats);
    return LD_OK;
}

void
ld_dispatch_free(void)
{
    dispatch_mod.n_ops = 0;
    dispatch_mod.n_ready_checks = 0;
    ld_features_clear();
}
