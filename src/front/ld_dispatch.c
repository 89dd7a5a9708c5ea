/*
 * The op table, and the checks a request passes before its op runs.
 * Feature modules add their rows (struct ld_op) at init, so an op whose
 * module is absent is simply unknown; the core ops (hello, ping, stats)
 * live here. What is checked for an op follows from its row's flags,
 * never from which op it is: a new op is one row.
 *
 * Dispatch owns the table and the readiness checks. It reads no field of
 * a request but its op (the handler's, ld_ns's and ld_memlimit's
 * business) and no module's state.
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
    const struct ld_op *op;
    size_t len; /* of its name: most ops are told apart by it alone */
};

static struct {
    const struct ld_ctx *ctx;
    struct op_entry ops[MAX_OPS];
    size_t n_ops;
    ld_ready_fn *ready_checks[MAX_READY_CHECKS];
    size_t n_ready_checks;
    ld_op_check *admin_check;
} dispatch_mod;

void
ld_dispatch_set_admin_check(ld_op_check *fn)
{
    dispatch_mod.admin_check = fn;
}

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

static int
register_op(const struct ld_op *op)
{
    for (size_t i = 0; i < dispatch_mod.n_ops; i++) {
        if (strcmp(dispatch_mod.ops[i].op->name, op->name) == 0) {
            dispatch_mod.ops[i].op = op;
            return LD_OK;
        }
    }
    if (dispatch_mod.n_ops == MAX_OPS) {
        log_error("dispatch table full op=%s", op->name);
        return LD_ERR;
    }
    dispatch_mod.ops[dispatch_mod.n_ops].op = op;
    dispatch_mod.ops[dispatch_mod.n_ops].len = strlen(op->name);
    dispatch_mod.n_ops++;
    return LD_OK;
}

int
ld_dispatch_register_ops(const struct ld_op *ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (register_op(&ops[i]) != LD_OK) {
            return LD_ERR;
        }
    }
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
        if (e->len == len && memcmp(e->op->name, name, len) == 0) {
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

/* What a hello offers, and what it makes of the session. */
struct hello {
    const char *client;
    size_t client_len;
    const char *auth;
    size_t auth_len;
    bool has_auth;
    const char *admin;
    size_t admin_len;
    bool has_admin;
    bool is_admin;
};

static bool
hello_fields(struct ld_req *req, struct hello *h)
{
    return ld_req_str(req, "client", false, &h->client, &h->client_len,
                      NULL) == LD_OK &&
           ld_req_str(req, "auth", false, &h->auth, &h->auth_len,
                      &h->has_auth) == LD_OK &&
           ld_req_str(req, "admin_token", false, &h->admin, &h->admin_len,
                      &h->has_admin) == LD_OK;
}

/* The admin token is the operator's identity (protocol.md "Operator
 * ops"), given as admin_token, or as auth like any token. It also
 * authenticates: whoever holds it may do more than an app. False when
 * REQ was refused. */
static bool
hello_admin(struct ld_req *req, struct hello *h)
{
    struct ld_session *s = req->sess;
    const char *atoken = dispatch_mod.ctx->cfg->listen.admin_token;
    size_t atoken_len = strlen(atoken);

    if (h->has_admin) {
        if (atoken_len == 0 ||
            !ld_secure_equal(h->admin, h->admin_len, atoken, atoken_len)) {
            log_warn("hello refused session=%s reason=bad_admin_token",
                     s->name);
            ld_reply_error(req, LD_E_UNAUTHORIZED,
                           atoken_len == 0 ? "listen.admin_token is not set"
                                           : "bad admin_token");
            return false;
        }
        h->is_admin = true;
    } else if (h->has_auth && atoken_len > 0 &&
               ld_secure_equal(h->auth, h->auth_len, atoken, atoken_len)) {
        h->is_admin = true;
        h->has_auth = false;
    }
    if (h->is_admin && !h->has_auth) {
        s->authed = true;
    }
    return true;
}

/* A token, when configured, is checked wherever it is offered; it is
 * required only where the listener says so. False when REQ was
 * refused. */
static bool
hello_auth(struct ld_req *req, const struct hello *h)
{
    struct ld_session *s = req->sess;
    const char *token = dispatch_mod.ctx->cfg->listen.auth_token;
    size_t token_len = strlen(token);

    if (h->has_auth && ld_ns_takes_auth(s)) {
        /* With namespaces a TCP client's token also names its namespace
         * (ld_ns.c); a token that is none of them is refused. */
        if (!ld_ns_hello_auth(s, h->auth, h->auth_len)) {
            log_warn("hello refused session=%s reason=bad_auth", s->name);
            ld_reply_error(req, LD_E_UNAUTHORIZED, "bad auth");
            return false;
        }
    } else if (token_len > 0 && (h->has_auth || !s->authed)) {
        if (!h->has_auth ||
            !ld_secure_equal(h->auth, h->auth_len, token, token_len)) {
            log_warn("hello refused session=%s reason=bad_auth", s->name);
            ld_reply_error(req, LD_E_UNAUTHORIZED, "bad or missing auth");
            return false;
        }
    }
    return true;
}

/* The session as the hello that was accepted makes it. */
static void
hello_accept(struct ld_session *s, const struct hello *h)
{
    s->authed = true;
    if (h->has_auth) {
        ld_ns_hello_token(s, h->auth, h->auth_len);
    }
    if (h->is_admin) {
        s->admin = true;
        log_info("operator session=%s", s->name);
    }
    if (h->client != NULL) {
        snprintf(s->client, sizeof(s->client), "%.*s",
                 (int)(h->client_len < sizeof(s->client) - 1
                           ? h->client_len
                           : sizeof(s->client) - 1),
                 h->client);
    }
}

static void
op_hello(struct ld_req *req)
{
    struct hello h = {.client = NULL};

    if (!hello_fields(req, &h) || !hello_admin(req, &h) ||
        !hello_auth(req, &h)) {
        return;
    }
    hello_accept(req->sess, &h);
    /* The optional parts of the protocol this daemon offers, as the
     * modules added them (ld_features.h); a client checks before it
     * relies on one. */
    ld_reply_ok(req,
                json_pack("{s:s,s:s,s:i,s:s,s:o}", "server", "leased",
                          "version", PACKAGE_VERSION, "protocol", 1, "session",
                          req->sess->name, "features", ld_features_json()));
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

/* The checks every op passes, then those its FLAGS call for, in the
 * order of their refusals: true when REQ was refused (and answered). */
static bool
refused(struct ld_req *req, unsigned flags)
{
    if (dispatch_mod.ctx->shutting_down) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
        return true;
    }
    /* pending already counts this request. */
    if (req->sess->pending > dispatch_mod.ctx->cfg->limits.max_pending) {
        ld_reply_error(req, LD_E_BUSY,
                       "too many requests in flight on this connection "
                       "(limits.max_pending %lld)",
                       dispatch_mod.ctx->cfg->limits.max_pending);
        return true;
    }
    if ((flags & LD_OP_NO_NS) == 0 &&
        ld_ns_check(req, (flags & LD_OP_ADMIN) != 0) != LD_OK) {
        return true;
    }
    if (ld_memlimit_refuse(req, flags)) {
        return true;
    }
    if ((flags & LD_OP_ADMIN) != 0) {
        LD_ASSERTF(dispatch_mod.admin_check != NULL,
                   "operator op %s without the admin module", req->op);
        return !dispatch_mod.admin_check(req);
    }
    return false;
}

void
ld_dispatch(struct ld_req *req)
{
    const struct op_entry *e = find_op(req->op);

    if (e != NULL) {
        ld_stats_count_op(e->op->name);
    }
    if (!req->sess->authed &&
        (e == NULL || (e->op->flags & LD_OP_NO_AUTH) == 0)) {
        ld_reply_error(req, LD_E_UNAUTHORIZED,
                       "this listener requires hello with auth first");
        return;
    }
    if (e == NULL) {
        ld_reply_error(req, LD_E_UNKNOWN_OP, "unknown op '%s'", req->op);
        return;
    }
    if (refused(req, e->op->flags)) {
        return;
    }
    e->op->fn(req);
}

/* The core ops. hello is what authenticates a session; none of the
 * three is sent keys. */
static const struct ld_op core_ops[] = {
    {"hello", op_hello, LD_OP_NO_AUTH | LD_OP_NO_NS},
    {"ping", op_ping, LD_OP_NO_NS},
    {"stats", op_stats, LD_OP_NO_NS},
};

int
ld_dispatch_init(const struct ld_ctx *ctx)
{
    dispatch_mod.ctx = ctx;
    dispatch_mod.n_ops = 0;
    dispatch_mod.n_ready_checks = 0;
    dispatch_mod.admin_check = NULL;
    ld_memlimit_init(ctx);
    return ld_dispatch_register_ops(core_ops, LD_ARRAY_LEN(core_ops));
}

void
ld_dispatch_free(void)
{
    dispatch_mod.n_ops = 0;
    dispatch_mod.n_ready_checks = 0;
    ld_features_clear();
}
