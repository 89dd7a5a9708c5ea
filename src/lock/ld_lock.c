/* Locks: lock, unlock, extend, lock.info and the lock_lost event.
 *
 * Redis holds the truth: one hash per lock with the holder's token as field
 * and the hold count as value (Redisson's layout), a lease by PEXPIRE, and
 * beside it a fence counter without TTL in the same hash slot. Every change
 * is one Lua script, so a lock is never half taken or half released.
 *
 * The daemon remembers, per session, which (owner, key) holds which token
 * (struct lk_rec), so that reentry reuses the token, the watchdog knows
 * what to renew, and a closing session can release what it held. Every
 * command of a lock is routed by the lock's Redis key, so they reach Redis
 * in the order they were issued and their replies come back in that order:
 * a record's hold count is simply the count in the last reply.
 *
 * The op handlers for unlock, extend and lock.info, the ops in flight,
 * session close and the module are here; ld_lock_int.h lists the other
 * files. Waiting is in ld_lockwait.c, the watchdog pass and the rechecks
 * in the lease engine (ld_lease.c): this file must not time a lease
 * itself nor change a record's count other than from a reply
 * (lk_rec_set_count). */

#include "ld_lock.h"
#include "ld_lock_int.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_dispatch.h"
#include "ld_evict.h"
#include "ld_features.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_redlock.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct lk_mod lock_mod;

/* ----------------------------------------------------------------- ops */

struct lk_op *
lk_op_new(enum lk_kind kind, struct ld_req *req, struct lk_rec *rec)
{
    struct lk_op *op = ld_xcalloc(1, sizeof(*op));
    op->kind = kind;
    op->req = req;
    op->rec = rec;
    if (rec != NULL) {
        rec->refs++;
    }
    LIST_INSERT_HEAD(&lock_mod.ops, op, link);
    return op;
}

void
lk_op_wait_unlink(struct lk_op *op)
{
    if (op->ls == NULL) {
        return;
    }
    LIST_REMOVE(op, wait_link);
    op->ls = NULL;
}

/* OP's attempt has its outcome RES: off its session's waiting list and,
 * when QUEUED, out of the lock's queue (or on to its next wait). */
void
lk_op_wait_end(struct lk_op *op, bool queued, enum ld_lockwait_result res)
{
    lk_op_wait_unlink(op);
    if (queued) {
        ld_lockwait_done(&op->w, res, 0);
    }
}

void
lk_op_free(struct lk_op *op)
{
    lk_op_wait_unlink(op);
    LIST_REMOVE(op, link);
    if (op->rec != NULL) {
        if (op->kind == LK_ACQ) {
            LD_ASSERT(op->rec->pending > 0);
            op->rec->pending--;
        }
        lk_rec_unref(op->rec);
    }
    if (op->undo_ev != NULL) {
        event_free(op->undo_ev);
    }
    lk_multi_op_free(op);
    lk_idem_op_free(op);
    free(op->wait_why);
    free(op->n.buf);
    free(op->field);
    free(op->key);
    free(op);
}

/* OP is dropped without an outcome for its queue, which carries on
 * without it (answered already, or nobody left to answer). */
void
lk_op_drop(struct lk_op *op)
{
    lk_op_wait_unlink(op);
    ld_lockwait_leave(&op->w);
    lk_op_free(op);
}

/* OP's release goes out redis.timeout_ms from now, through CB: Redis has
 * then seen what went before it. Until then OP has no command out, and a
 * stopping daemon frees it unsent. */
void
lk_op_undo_later(struct lk_op *op, event_callback_fn cb)
{
    op->undo_ev = evtimer_new(lock_mod.ctx->base, cb, op);
    if (op->undo_ev == NULL) {
        ld_oom(0);
    }
    struct timeval tv = ld_tv_ms(lock_mod.ctx->cfg->redis.timeout_ms);
    evtimer_add(op->undo_ev, &tv);
}

const struct lk_names *
lk_op_names(const struct lk_op *op)
{
    return op->rec != NULL ? &op->rec->n : &op->n;
}

/* The hash field OP names: the token it was given, else its record's. */
const char *
lk_op_field(const struct lk_op *op, size_t *len)
{
    if (op->field != NULL) {
        *len = op->field_len;
        return op->field;
    }
    if (op->rec != NULL) {
        *len = LD_TOKEN_LEN;
        return op->rec->token;
    }
    *len = 0;
    return "";
}

static const char *
op_key(const struct lk_op *op, size_t *len)
{
    if (op->key != NULL) {
        *len = op->key_len;
        return op->key;
    }
    *len = op->rec->key_len;
    return op->rec->key;
}

void
lk_op_wait_add(struct lk_op *op, struct lk_sess *ls)
{
    LD_ASSERT(op->ls == NULL && op->kind == LK_ACQ);
    op->ls = ls;
    LIST_INSERT_HEAD(&ls->waiting, op, wait_link);
}

/* A not_held answer (CODE) to OP about a record we thought held: Redis
 * is right, the hold is gone. Its session did not ask, so when the hold
 * is session-bound it hears it as a renewal would have told it. */
void
lk_rec_forget_stale(const struct lk_op *op, struct lk_rec *rec, long long code)
{
    if (rec == NULL || !rec->linked || rec->count == 0) {
        return;
    }
    if (op->foreign && !rec->detached) {
        lk_rec_lost(rec, code == LD_LOCK_ABSENT ? "expired" : "taken", false);
        return;
    }
    lk_rec_set_count(rec, 0);
}

/* A late answer to OP's unlock or extend settled what its client heard
 * as "outcome":"unknown": the log is the only trace of how it ended. */
void
lk_op_log_late(const struct lk_op *op, int n, const long long *v)
{
    size_t klen;
    const char *key = op_key(op, &klen);
    log_info("late answer settled op=%s key=%.*s result=%lld",
             op->kind == LK_UNLOCK ? "unlock" : "extend", (int)klen, key,
             n >= 1 ? v[0] : -100);
}

/* OP's command got no usable answer from Redis (none, or an error): its
 * request, when still owed, hears so; WRITE as for lk_op_fail. */
static void
op_fail_redis(struct lk_op *op, const redisReply *r, bool write)
{
    lk_reply_redis_failure_op(op->req, r, op, write);
    op->req = NULL;
}

/* The one failure path of the lock handlers, for a script reply that is
 * not a success: V holds its N integers (N < 1 when it was no usable
 * reply). Answers OP's request when still owed. WRITE: the command
 * changes the lock, so a code that says the hold is gone settles OP's
 * record, and a command that got no answer may have happened ("outcome":
 * "unknown"). */
void
lk_op_fail(struct lk_op *op, const redisReply *r, int n, const long long *v,
           bool write)
{
    size_t klen;
    const char *key = op_key(op, &klen);
    struct lk_rec *rec = lk_op_live_rec(op);
    bool wrong = n >= 1 && v[0] == LD_LOCK_WRONG_TYPE;
    bool gone = n >= 1 && (v[0] == LD_LOCK_ABSENT || v[0] == LD_LOCK_OTHER);
    if (!wrong && !gone) {
        /* No answer, an error, or one no script gives. */
        op_fail_redis(op, r, write);
        return;
    }
    if (write) {
        lk_rec_forget_stale(op, rec, v[0]);
    }
    if (op->req != NULL && wrong) {
        lk_reply_wrong_type(op->req, key, klen);
    } else if (op->req != NULL) {
        lk_reply_not_held(op->req, key, klen, v[0] == LD_LOCK_OTHER);
    }
    op->req = NULL;
}

/* The end of every unlock, extend and lock.info reply (V, N of them): OK
 * when it was the script's success, which the caller has answered; any
 * other reply goes the failure path. OP is done either way. */
static void
op_finish(struct lk_op *op, const redisReply *r, int n, const long long *v,
          bool ok, bool write)
{
    if (ok) {
        op->req = NULL;
    } else {
        lk_op_fail(op, r, n, v, write);
    }
    lk_op_free(op);
}

/* --------------------------------------------------------- release all */

static void
release_all_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    long long v[2] = {0, 0};
    if (!lock_mod.freed && ld_lease_reply_ints(r, v, 2) >= 1 &&
        v[0] == LD_LOCK_RELEASED) {
        ld_stats.lock_released++;
    }
    lk_op_free(op);
}

/* Delete the lock if REC's token holds it, whatever its count, and publish
 * the wake-up. The caller updates REC's count. */
void
lk_rec_release_all(struct lk_rec *rec)
{
    if (lock_mod.freed) {
        return;
    }
    struct lk_op *op = lk_op_new(LK_RELEASE, NULL, rec);
    op->inflight = true;
    lk_release_send(0, 0, &rec->n, rec->token, LD_TOKEN_LEN, true,
                    release_all_on_reply, op);
}

static bool
all_of(const char *s, size_t len, const char *set)
{
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '\0' || strchr(set, s[i]) == NULL) {
            return false;
        }
    }
    return true;
}

/* A token names a hash field in Redis, so only holder-shaped names pass:
 * the daemon's own tokens (LD_TOKEN_LEN lowercase hex digits) and, with
 * lock.layout redisson, Redisson's holders (<uuid>:<thread id>). Anything
 * else could address a field of someone's hash that is not a lock. */
static bool
token_ok(const char *t, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    static const char hex_any[] = "0123456789abcdefABCDEF";
    if (len == LD_TOKEN_LEN && all_of(t, len, hex)) {
        return true;
    }
    if (lock_mod.ctx->cfg->lock.layout != LD_LAYOUT_REDISSON || len < 38 ||
        len > 36 + 1 + 20) {
        return false;
    }
    static const size_t group[] = {8, 4, 4, 4, 12};
    size_t at = 0;
    for (size_t g = 0; g < LD_ARRAY_LEN(group); g++) {
        if (!all_of(t + at, group[g], hex_any)) {
            return false;
        }
        at += group[g];
        if (t[at] != (g + 1 < LD_ARRAY_LEN(group) ? '-' : ':')) {
            return false;
        }
        at++;
    }
    return at < len && all_of(t + at, len - at, "0123456789");
}

/* Answers REQ and returns false when TOKEN, given in the request, cannot
 * be a holder. */
bool
lk_token_check(struct ld_req *req, const char *t, size_t len)
{
    if (len == 0) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'token' must not be empty");
        return false;
    }
    if (token_ok(t, len)) {
        return true;
    }
    ld_reply_error(req, LD_E_BAD_REQUEST,
                   "field 'token' is not a lock token (%d lowercase hex "
                   "digits%s)",
                   LD_TOKEN_LEN,
                   lock_mod.ctx->cfg->lock.layout == LD_LAYOUT_REDISSON
                       ? ", or a Redisson holder <uuid>:<thread id>"
                       : "");
    return false;
}

/* The "mode" field: absent for a plain lock, "read" or "write" for the
 * sides of a read-write lock. Answers REQ and returns LD_ERR when it
 * cannot be served. */
int
lk_req_mode(struct ld_req *req, enum lk_mode *mode)
{
    const char *m = NULL;
    size_t len = 0;
    bool has = false;
    *mode = LK_MODE_PLAIN;
    if (ld_req_str(req, "mode", false, &m, &len, &has) != LD_OK) {
        return LD_ERR;
    }
    if (!has) {
        return LD_OK;
    }
    if (len == 4 && memcmp(m, "read", 4) == 0) {
        *mode = LK_MODE_READ;
    } else if (len == 5 && memcmp(m, "write", 5) == 0) {
        *mode = LK_MODE_WRITE;
    } else {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'mode' must be \"read\" or \"write\"");
        return LD_ERR;
    }
    if (lk_multi_asked(req)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'mode' does not go with 'keys': a group is "
                       "made of plain locks");
        return LD_ERR;
    }
    if (lock_mod.redlock) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "read-write locks are not built for lock.redlock");
        return LD_ERR;
    }
    return LD_OK;
}

static int
parse_target(struct ld_req *req, struct lk_target *t)
{
    memset(t, 0, sizeof(*t));
    t->owner = "";
    t->token = "";
    bool has_owner = false;
    if (ld_req_key(req, "key", &t->key, &t->key_len) != LD_OK ||
        ld_req_str(req, "owner", false, &t->owner, &t->owner_len,
                   &has_owner) != LD_OK ||
        ld_req_str(req, "token", false, &t->token, &t->token_len,
                   &t->has_token) != LD_OK ||
        lk_req_mode(req, &t->mode) != LD_OK) {
        return LD_ERR;
    }
    if (t->has_token && !lk_token_check(req, t->token, t->token_len)) {
        return LD_ERR;
    }
    return LD_OK;
}

struct lk_sess *
lk_sess_get(struct ld_session *s, bool create)
{
    struct lk_sess *ls = s->lock_state;
    if (ls == NULL && create) {
        ls = ld_xcalloc(1, sizeof(*ls));
        LIST_INIT(&ls->waiting);
        ls->sess = s;
        ls->recs = ld_dict_new();
        s->lock_state = ls;
    }
    return ls;
}

/* The op for a request that names a lock by owner or token: REC is the
 * record it concerns in this daemon (if any), FIELD the holder field. */
struct lk_op *
lk_target_op(enum lk_kind kind, struct ld_req *req, const struct lk_target *t)
{
    struct lk_names n;
    lk_names_build_mode(&n, t->key, t->key_len, t->mode);
    struct lk_rec *rec = NULL;
    if (t->has_token) {
        rec = lk_rec_by_token(t->token, t->token_len, &n);
        if (rec != NULL && rec->n.mode != t->mode) {
            rec = NULL; /* the script tells the other side it is not its */
        }
    } else {
        struct lk_sess *ls = lk_sess_get(req->sess, false);
        if (ls != NULL) {
            size_t dlen;
            char *d = lk_dkey_build_mode(t->owner, t->owner_len, t->key,
                                         t->key_len, t->mode, &dlen);
            rec = ld_dict_get(ls->recs, d, dlen);
            free(d);
        }
    }
    struct lk_op *op = lk_op_new(kind, req, rec);
    op->foreign = rec != NULL && rec->ls != NULL && rec->ls->sess != req->sess;
    if (rec != NULL) {
        free(n.buf);
    } else {
        op->n = n;
    }
    op->key = ld_xstrndup(t->key, t->key_len);
    op->key_len = t->key_len;
    if (t->has_token) {
        op->field = ld_xstrndup(t->token, t->token_len);
        op->field_len = t->token_len;
    }
    return op;
}

/* -------------------------------------------------------------- unlock */

/* OP's unlock left REC's token COUNT holds. A session-bound hold that
 * another session released by token is lost to its own session, which
 * hears it now rather than never (the release took it off the renewal
 * list): "expired", as a renewal would have found it. */
void
lk_unlock_settle(const struct lk_op *op, struct lk_rec *rec, long long count)
{
    if (count == 0 && op->foreign && rec->count > 0 && !rec->detached) {
        lk_rec_lost(rec, "expired", false);
        return;
    }
    lk_rec_set_count(rec, count);
}

static void
unlock_recheck_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    struct lk_rec *rec = op->rec;
    long long v[3] = {0, 0, 0};
    if (!lock_mod.freed && rec != NULL && rec->linked &&
        ld_lease_reply_ints(r, v, 3) >= 3 &&
        (v[0] == LD_LOCK_FREE || v[0] == LD_LOCK_HELD)) {
        lk_unlock_settle(op, rec, v[2]);
    }
    lk_op_free(op);
}

/* An unlock with no answer will never get one (its connection was given
 * up): what Redis holds under the token now settles the record. */
void
lk_unlock_recheck(struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    if (lock_mod.freed || rec == NULL || !rec->linked) {
        lk_op_free(op);
        return;
    }
    const char *args[] = {rec->n.hash, rec->token};
    size_t lens[] = {rec->n.hash_len, LD_TOKEN_LEN};
    lk_script(LD_SCRIPT_lock_info, &rec->n, 1, 2, args, lens,
              unlock_recheck_on_reply, op);
}

/* Called once with the answer, or, when it did not come in time, once with
 * UNKNOWN (the client hears "outcome":"unknown" and the record stays as it
 * was) and once more with Redis' late answer, which settles the record, or
 * LOST, when a re-check does. */
static void
unlock_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    enum ld_redis_outcome o = lk_outcome();
    if (o == LD_REDIS_UNKNOWN) {
        op_fail_redis(op, r, true);
        return; /* the late answer or LOST follows */
    }
    if (lock_mod.freed) {
        lk_op_free(op);
        return;
    }
    if (o == LD_REDIS_LOST) {
        op_fail_redis(op, r, true);
        lk_unlock_recheck(op);
        return;
    }
    struct lk_rec *rec = lk_op_live_rec(op);
    long long v[2] = {0, 0};
    int n = ld_lease_reply_ints(r, v, 2);
    if (o == LD_REDIS_LATE) {
        lk_op_log_late(op, n, v);
    }
    bool ok = n >= 2 && (v[0] == LD_LOCK_RELEASED || v[0] == LD_LOCK_KEPT);
    if (ok) {
        if (v[0] == LD_LOCK_RELEASED) {
            ld_stats.lock_released++;
        }
        lk_idem_done(op, v[0] == LD_LOCK_RELEASED, v[1],
                     rec != NULL ? rec->lease_end_ms : 0);
        if (rec != NULL) {
            lk_unlock_settle(op, rec, v[1]);
        }
        if (op->req != NULL) {
            const struct ld_field f[] = {LD_BOOL("released",
                                                 v[0] == LD_LOCK_RELEASED),
                                         LD_INT("count", v[1])};
            ld_reply_ok_fields(op->req, f, LD_ARRAY_LEN(f));
        }
    }
    op_finish(op, r, n, v, ok, true);
}

static void
op_unlock(struct ld_req *req)
{
    enum lk_mode mode;
    if (lk_req_mode(req, &mode) != LD_OK) {
        return;
    }
    if (lk_multi_asked(req)) {
        lk_multi_unlock(req);
        return;
    }
    struct lk_target t;
    struct lk_rid rid;
    if (parse_target(req, &t) != LD_OK || lk_idem_parse(req, &rid) != LD_OK) {
        return;
    }
    struct lk_op *op = lk_target_op(LK_UNLOCK, req, &t);
    const struct lk_names *n = lk_op_names(op);
    size_t flen;
    const char *field = lk_op_field(op, &flen);
    if (lk_idem_start(op, field, flen, &rid)) {
        lk_op_free(op);
        return;
    }
    op->inflight = true;
    lk_release_send(LD_REDIS_F_LATE, 0, n, field, flen, false, unlock_on_reply,
                    op);
}

/* -------------------------------------------------------------- extend */

/* Called like unlock_on_reply. A late answer settles the record's lease;
 * when none comes the watchdog or the lease check finds out. */
static void
extend_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    enum ld_redis_outcome o = lk_outcome();
    if (o == LD_REDIS_UNKNOWN) {
        op_fail_redis(op, r, true);
        return; /* the late answer or LOST follows */
    }
    if (lock_mod.freed || o == LD_REDIS_LOST) {
        op_fail_redis(op, r, true);
        lk_op_free(op);
        return;
    }
    struct lk_rec *rec = lk_op_live_rec(op);
    long long v[3] = {0, 0, 0};
    int n = ld_lease_reply_ints(r, v, 3);
    if (o == LD_REDIS_LATE) {
        lk_op_log_late(op, n, v);
    }
    bool ok = n >= 3 && v[0] == LD_LOCK_HELD;
    if (ok) {
        if (rec != NULL) {
            lk_rec_set_count(rec, v[2]);
            if (v[1] >= 0) {
                rec->lease_end_ms = op->sent_ms + (uint64_t)v[1];
            }
            /* A shorter lease moves the lost timer or an early renewal
             * forward, capped or not. */
            lk_rec_arm_cap(rec);
        }
        if (op->req != NULL) {
            ld_reply_ok(op->req, json_pack("{s:I}", "lease_ms",
                                           (json_int_t)op->lease_ms));
        }
    }
    op_finish(op, r, n, v, ok, true);
}

static void
op_extend(struct ld_req *req)
{
    struct lk_target t;
    long long ttl = 0;
    bool has_ttl = false;
    enum lk_mode mode;
    if (lk_req_mode(req, &mode) != LD_OK) {
        return;
    }
    if (lk_multi_asked(req)) {
        if (ld_req_int(req, "ttl_ms", true, 1, LD_TTL_MS_MAX, &ttl,
                       &has_ttl) == LD_OK) {
            lk_multi_extend(req, ttl);
        }
        return;
    }
    if (parse_target(req, &t) != LD_OK ||
        ld_req_int(req, "ttl_ms", true, 1, LD_TTL_MS_MAX, &ttl, &has_ttl) !=
            LD_OK) {
        return;
    }
    struct lk_op *op = lk_target_op(LK_EXTEND, req, &t);
    ttl = lk_rec_cap_clip(op->rec, ttl);
    op->lease_ms = ttl;
    const struct lk_names *n = lk_op_names(op);
    size_t flen;
    const char *field = lk_op_field(op, &flen);
    char lbuf[24];
    snprintf(lbuf, sizeof(lbuf), "%lld", ttl);
    const char *args[] = {n->hash, field, lbuf};
    size_t lens[] = {n->hash_len, flen, strlen(lbuf)};
    op->sent_ms = ld_now_ms();
    op->inflight = true;
    lk_script_ex(LD_REDIS_F_LATE, 0, LD_SCRIPT_lock_extend, n, 1, 3, args,
                 lens, extend_on_reply, op);
}

/* ----------------------------------------------------------- lock.info */

static void
info_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    if (lock_mod.freed) {
        lk_op_free(op);
        return;
    }
    long long v[4] = {0, 0, 0, 0};
    int n = ld_lease_reply_ints(r, v, 4);
    bool ok = n >= 3 && (v[0] == LD_LOCK_FREE || v[0] == LD_LOCK_HELD);
    if (ok) {
        json_t *body = json_pack("{s:b,s:I,s:b}", "locked",
                                 v[0] == LD_LOCK_HELD, "ttl_ms",
                                 (json_int_t)v[1], "mine", v[2] > 0);
        if (v[2] > 0) {
            json_object_set_new(body, "count", json_integer(v[2]));
        }
        if (n >= 4 && v[0] == LD_LOCK_HELD) {
            /* A read-write lock: which side holds it now. */
            json_object_set_new(body, "mode",
                                json_string(v[3] == 2 ? "write" : "read"));
        }
        ld_reply_ok(op->req, body);
    }
    op_finish(op, r, n, v, ok, false);
}

static void
op_info(struct ld_req *req)
{
    struct lk_target t;
    if (parse_target(req, &t) != LD_OK) {
        return;
    }
    struct lk_op *op = lk_target_op(LK_INFO, req, &t);
    const struct lk_names *n = lk_op_names(op);
    size_t flen;
    const char *field = lk_op_field(op, &flen);
    const char *args[] = {n->hash, field};
    size_t lens[] = {n->hash_len, flen};
    op->inflight = true;
    lk_script(LD_SCRIPT_lock_info, n, 1, 2, args, lens, info_on_reply, op);
}

/* ------------------------------------------------------ session close */

static void
sess_drop_waiters(struct lk_sess *ls, int code, const char *msg)
{
    struct lk_op *op;
    while ((op = LIST_FIRST(&ls->waiting)) != NULL) {
        lk_op_wait_unlink(op);
        ld_lockwait_leave(&op->w);
        if (op->req != NULL) {
            if (code < 0) {
                lk_acq_reply_false(op, -1);
            } else {
                ld_reply_error(op->req, code, "%s", msg);
                op->req = NULL;
            }
        }
        if (!op->inflight) {
            lk_op_free(op);
        }
    }
}

/* LS and its records part: none is held here any more. RELEASE: a
 * session-bound hold is given back in Redis (a session closed); without
 * it nothing is sent (the module is being freed). */
static void
sess_free(struct lk_sess *ls, bool release)
{
    struct ld_dict_iter it;
    void *v;
    ld_dict_iter_init(&it, ls->recs);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        struct lk_rec *rec = v;
        rec->refs++;
        lk_rec_unlink(rec);
        rec->ls = NULL;
        if (release && rec->count > 0 && !rec->detached) {
            lk_rec_release_all(rec);
        }
        lk_rec_set_count(rec, 0);
        lk_rec_unref(rec);
    }
    ld_dict_free(ls->recs);
    free(ls);
}

static void
on_session_close(struct ld_session *s)
{
    struct lk_sess *ls = s->lock_state;
    if (ls == NULL) {
        return;
    }
    s->lock_state = NULL;
    ls->closing = true;
    /* Requests of a closed session are dropped, whatever they answer. */
    sess_drop_waiters(ls, -1, NULL);
    sess_free(ls, true);
}

/* -------------------------------------------------------------- module */

int
ld_lock_init(const struct ld_ctx *ctx)
{
    lock_mod.ctx = ctx;
    TAILQ_INIT(&lock_mod.held);
    LIST_INIT(&lock_mod.ops);
    TAILQ_INIT(&lock_mod.idle);
    lock_mod.by_token = ld_dict_new();
    lock_mod.fences = ld_dict_new();
    /* The one place the backend of the lock scripts is chosen. */
    lock_mod.redlock = ctx->cfg->lock.redlock.count > 0;
    if (lock_mod.redlock && ld_redlock_init(ctx) != LD_OK) {
        return LD_ERR;
    }
    if (ld_lockwait_init(ctx) != LD_OK) {
        return LD_ERR;
    }
    if (lock_mod.redlock) {
        ld_lockwait_set_lock_channel(ld_redlock_subscribe);
    }
    if (ld_evict_init(ctx, ctx->cfg->lock.redlock.count) != LD_OK) {
        return LD_ERR;
    }
    lk_acq_init();
    lk_watch_init();
    lk_admin_init();
    ld_session_on_close(on_session_close);
    static const struct ld_op lock_ops[] = {
        {"lock", lk_op_lock, LD_OP_WAITS},
        {"unlock", op_unlock, 0},
        {"extend", op_extend, 0},
        {"lock.info", op_info, 0},
    };
    if (ld_dispatch_register_ops(lock_ops, LD_ARRAY_LEN(lock_ops)) != LD_OK) {
        return LD_ERR;
    }
    ld_features_add("multilock"); /* lock and unlock with "keys" */
    if (!lock_mod.redlock) {
        ld_features_add("rwlock"); /* lock with "mode" */
    }
    return LD_OK;
}

/* Every session's waiting requests hear that the daemon is stopping. */
static void
waiters_drop_stopping(void)
{
    for (struct ld_session *s = ld_session_first(); s != NULL;
         s = ld_session_next(s)) {
        struct lk_sess *ls = s->lock_state;
        if (ls != NULL) {
            sess_drop_waiters(ls, LD_E_SHUTTING_DOWN,
                              "the daemon is stopping");
        }
    }
}

void
ld_lock_shutdown(void)
{
    lock_mod.stopping = true;
    waiters_drop_stopping();
    struct lk_rec *next;
    for (struct lk_rec *rec = TAILQ_FIRST(&lock_mod.held); rec != NULL;
         rec = next) {
        next = TAILQ_NEXT(rec, held_entry);
        if (rec->detached) {
            continue;
        }
        rec->refs++;
        lk_rec_release_all(rec);
        lk_rec_set_count(rec, 0);
        lk_rec_unref(rec);
    }
}

/* Requests still out get their answer now; their commands' replies, if
 * they still come, only free what is left. */
static void
ops_answer_stopping(void)
{
    for (struct lk_op *op = LIST_FIRST(&lock_mod.ops), *next; op != NULL;
         op = next) {
        next = LIST_NEXT(op, link);
        if (op->req != NULL) {
            ld_reply_error(op->req, LD_E_SHUTTING_DOWN,
                           "the daemon is stopping");
            op->req = NULL;
        }
        if (op->undo_ev != NULL) {
            lk_op_free(op); /* a release planned for later: no command */
        }
    }
}

/* Every session forgets its records: none is held any more here. */
static void
sessions_forget(void)
{
    for (struct ld_session *s = ld_session_first(); s != NULL;
         s = ld_session_next(s)) {
        struct lk_sess *ls = s->lock_state;
        if (ls == NULL) {
            continue;
        }
        s->lock_state = NULL;
        sess_free(ls, false);
    }
}

void
ld_lock_free(void)
{
    if (lock_mod.by_token == NULL) {
        return;
    }
    waiters_drop_stopping();
    lock_mod.freed = true;
    ops_answer_stopping();
    sessions_forget();
    ld_lockwait_free();
    lk_watch_free();
    ld_dict_free(lock_mod.by_token);
    lock_mod.by_token = NULL;
    /* Entries still pinned by a record go with their last record. */
    struct lk_fmemo *fm;
    while ((fm = TAILQ_FIRST(&lock_mod.idle)) != NULL) {
        lk_fmemo_idle_unlink(fm);
        lk_fmemo_free(fm);
    }
    ld_dict_free(lock_mod.fences);
    lock_mod.fences = NULL;
    lk_idem_free_all();
    ld_evict_free();
    ld_redlock_free();
}
