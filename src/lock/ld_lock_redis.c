/* Locks: running the lock scripts (on Redis or on lock.redlock's
 * instances), reading their replies, and the answers for replies that
 * are failures. It must not change a record: what a reply means is its
 * callback's business. */

#include "ld_lock_int.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_lock_codes.h"
#include "ld_log.h"
#include "ld_proto.h"
#include "ld_redlock.h"

#include <errno.h>
#include <event2/event.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- Redis helpers */

/* The opening every acquisition's reply callback shares (lock, lock by
 * token, a group's key): OP (ARG) is no longer in flight; when the module
 * has gone meanwhile it is freed and NULL comes back, else OP, with the
 * reply read into V and its length into *N (lk_reply_acquire). */
struct lk_op *
lk_acq_reply_open(void *arg, const redisReply *r, long long v[4], int *n)
{
    struct lk_op *op = arg;
    op->inflight = false;
    if (lock_mod.freed) {
        lk_op_free(op);
        return NULL;
    }
    memset(v, 0, 4 * sizeof(*v));
    *n = lk_reply_acquire(r, v, op->lease_ms);
    return op;
}

/* The record a reply callback may still settle: OP's, while linked. */
struct lk_rec *
lk_op_live_rec(const struct lk_op *op)
{
    struct lk_rec *rec = op->rec;
    return rec != NULL && rec->linked ? rec : NULL;
}

/* Read lock_acquire's reply into V: like lk_reply_ints, but a grant carries
 * its fence as a decimal string (fences never pass through Lua numbers),
 * read here exactly. A free lock taken answers its fence alone, an
 * integer below 2^53: a grant of one hold for LEASE_MS, the lease sent
 * (0 from a new reader: no writer yet). Returns -1 for anything else,
 * also for a fence that is not a positive 64-bit integer (0 means
 * unknown, on a reentry). */
int
lk_reply_acquire(const redisReply *r, long long v[4], long long lease_ms)
{
    if (r != NULL && r->type == REDIS_REPLY_INTEGER) {
        if (r->integer < 0) {
            return -1;
        }
        return ld_lock_bare_grant(r->integer, lease_ms, v);
    }
    if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_INTEGER) {
        return -1;
    }
    if (r->element[0]->integer != LD_LOCK_GRANTED) {
        return ld_lease_reply_ints(r, v, 4);
    }
    if (r->elements != 4 || r->element[1]->type != REDIS_REPLY_INTEGER ||
        r->element[2]->type != REDIS_REPLY_STRING ||
        r->element[3]->type != REDIS_REPLY_INTEGER) {
        return -1;
    }
    const redisReply *f = r->element[2];
    char buf[24];
    if (f->len == 0 || f->len >= sizeof(buf)) {
        return -1;
    }
    memcpy(buf, f->str, f->len);
    buf[f->len] = '\0';
    char *end;
    errno = 0;
    long long fence = strtoll(buf, &end, 10);
    if (errno != 0 || *end != '\0' || fence < 0 || buf[0] == '-' ||
        buf[0] == '+' || (buf[0] == '0' && f->len > 1)) {
        return -1;
    }
    v[0] = LD_LOCK_GRANTED;
    v[1] = r->element[1]->integer;
    v[2] = fence;
    v[3] = r->element[3]->integer;
    return 4;
}

static const char *
kind_name(enum lk_kind kind)
{
    switch (kind) {
    case LK_UNLOCK:
        return "unlock";
    case LK_EXTEND:
        return "extend";
    case LK_INFO:
        return "lock.info";
    case LK_RENEW:
        return "renew";
    case LK_CHECK:
        return "check";
    case LK_RELEASE:
        return "release";
    default:
        return "lock";
    }
}

/* No reply at all: for a command that changes the lock (WRITE) and was
 * sent, the outcome is unknown; otherwise nothing changed. */
static void
reply_no_answer(struct ld_req *req, const char *opname, int klen,
                const char *key, bool write)
{
    const char *why = lk_failure_reason();
    enum ld_redis_outcome o = lk_outcome();
    bool unknown = write && (o == LD_REDIS_UNKNOWN || o == LD_REDIS_LOST);
    if (unknown) {
        log_warn("redis failure op=%s key=%.*s outcome=unknown "
                 "reason=\"%s\"",
                 opname, klen, key, why);
    } else {
        /* Nothing changed; the connection's own loss is a warning
         * already, so one line per request stays quieter. */
        log_info("redis failure op=%s key=%.*s outcome=unchanged "
                 "reason=\"%s\"",
                 opname, klen, key, why);
    }
    if (req == NULL) {
        return;
    }
    if (unknown) {
        ld_reply_error_extra(req, LD_E_REDIS_UNAVAILABLE,
                             json_pack("{s:s}", "outcome", "unknown"),
                             "redis: %s; the %s was sent and may have "
                             "taken effect",
                             why, opname);
    } else {
        ld_reply_error(req, LD_E_REDIS_UNAVAILABLE, "redis: %s", why);
    }
}

/* Answer REQ for a command that got no usable reply (inside the command's
 * callback, where ld_redis says why). WRITE: the command changes the lock,
 * so a command sent without an answer may have happened, and the client
 * is told "outcome":"unknown" instead of "nothing changed". OP (may be
 * NULL) names the op and key in the log. */
void
lk_reply_redis_failure_op(struct ld_req *req, const redisReply *r,
                          const struct lk_op *op, bool write)
{
    const char *why = lk_failure_reason();
    const char *opname = op != NULL ? kind_name(op->kind) : "lock";
    int klen = op != NULL && op->key != NULL ? (int)op->key_len : 1;
    const char *key = op != NULL && op->key != NULL ? op->key : "-";
    if (op != NULL && op->key == NULL && op->rec != NULL) {
        klen = (int)op->rec->key_len;
        key = op->rec->key;
    }
    if (r == NULL) {
        reply_no_answer(req, opname, klen, key, write);
        return;
    }
    if (r->type == REDIS_REPLY_ERROR) {
        if (ld_reply_is_unavailable(r)) {
            log_warn("redis failure op=%s key=%.*s reason=\"%s\"", opname,
                     klen, key, why);
            if (req != NULL) {
                ld_reply_error(req, LD_E_REDIS_UNAVAILABLE, "redis: %s", why);
            }
            return;
        }
        log_error("internal error op=%s key=%.*s redis=\"%s\"", opname, klen,
                  key, why);
        if (req != NULL) {
            ld_reply_error(req, LD_E_INTERNAL, "redis: %s", why);
        }
        return;
    }
    log_error("internal error op=%s key=%.*s: unexpected reply type %d "
              "from a lock script",
              opname, klen, key, r->type);
    if (req != NULL) {
        ld_reply_error(req, LD_E_INTERNAL,
                       "unexpected reply from a lock script");
    }
}

void
lk_reply_not_held(struct ld_req *req, const char *key, size_t klen, bool other)
{
    ld_reply_error_extra(req, LD_E_NOT_HELD,
                         json_pack("{s:s}", "reason",
                                   other ? "other" : "absent"),
                         other ? "lock '%.*s' is held by someone else"
                               : "lock '%.*s' is not held",
                         (int)klen, key);
}

void
lk_reply_wrong_type(struct ld_req *req, const char *key, size_t klen)
{
    ld_reply_error(req, LD_E_WRONG_TYPE,
                   "the redis key of lock '%.*s' holds data that is not a "
                   "lock",
                   (int)klen, key);
}

/* A read-write lock's script for plain lock script ID: it takes the same
 * keys and arguments, then the side, the prefix of the readers' lease
 * keys and (rw_acquire only) the downgrade field (src/lua/rw_*.lua); a
 * writer's rw_acquire the side alone. Releases name rw_release
 * themselves (lk_release_send): its arguments differ. */
static enum ld_script_id
rw_script(enum ld_script_id id)
{
    switch (id) {
    case LD_SCRIPT_lock_acquire:
        return LD_SCRIPT_rw_acquire;
    case LD_SCRIPT_lock_renew:
        return LD_SCRIPT_rw_renew;
    case LD_SCRIPT_lock_extend:
        return LD_SCRIPT_rw_extend;
    case LD_SCRIPT_lock_info:
        return LD_SCRIPT_rw_info;
    default:
        return id;
    }
}

#define RW_ARGS_MAX 12

/* Lock scripts go on the lock connections while lock.wait_replicas is
 * set, so that the WAIT after a grant blocks none of the shared ones. */
void
lk_script_ex(unsigned flags, uint64_t pin, enum ld_script_id id,
             const struct lk_names *n, int nkeys, int nargs, const char **args,
             size_t *lens, ld_redis_cb *cb, void *arg)
{
    const char *rwargs[RW_ARGS_MAX];
    size_t rwlens[RW_ARGS_MAX];
    if (n->mode != LK_MODE_PLAIN && rw_script(id) != id) {
        /* Read-write locks are refused on lock.redlock at request time. */
        LD_ASSERT(!lock_mod.redlock && nargs + 3 <= RW_ARGS_MAX);
        memcpy(rwargs, args, (size_t)nargs * sizeof(*args));
        memcpy(rwlens, lens, (size_t)nargs * sizeof(*lens));
        rwargs[nargs] = lk_mode_name(n->mode);
        rwlens[nargs] = strlen(rwargs[nargs]);
        rwargs[nargs + 1] = n->rwpfx;
        rwlens[nargs + 1] = n->rwpfx_len;
        rwargs[nargs + 2] = n->dg;
        rwlens[nargs + 2] = strlen(n->dg);
        /* A writer's acquire reads neither the readers' prefix nor a
         * downgrade field, and each argument costs Redis about 1.4k
         * instructions a call. */
        if (id != LD_SCRIPT_lock_acquire) {
            nargs += 2;
        } else {
            nargs += n->mode == LK_MODE_WRITE ? 1 : 3;
        }
        id = rw_script(id);
        args = rwargs;
        lens = rwlens;
    }
    if (lock_mod.redlock) {
        ld_redlock_script(id, n->hash, n->hash_len, n->chan, n->chan_len,
                          nkeys, nargs, args, lens, cb, arg);
        return;
    }
    struct ld_redis_opts o = {.flags = flags,
                              .pool = LD_REDIS_POOL_SHARED,
                              .pin = pin};
    if (lock_mod.ctx->cfg->lock.wait_replicas > 0) {
        o.pool = LD_REDIS_POOL_LOCK;
    }
    ld_redis_script_ex(&o, id, n->hash, n->hash_len, nkeys, nargs, args, lens,
                       cb, arg);
}

/* Whether N's channel is the one lock_release names when none is sent:
 * the hash's name and ":unlock" (leased's layout). */
static bool
chan_is_default(const struct lk_names *n)
{
    static const char sfx[] = ":unlock";
    size_t slen = sizeof(sfx) - 1;
    return n->chan_len == n->hash_len + slen &&
           memcmp(n->chan, n->hash, n->hash_len) == 0 &&
           memcmp(n->chan + n->hash_len, sfx, slen) == 0;
}

/* Give back one hold of FIELD (ALL: every hold) by lock_release or
 * rw_release. Each leaves out what its script takes as the default (one
 * hold, leased's channel, Redisson's unlock message): each argument costs
 * Redis instructions on every call. Redlock sends the message, which it
 * makes its own for each release (ld_redlock.c). */
void
lk_release_send(unsigned flags, uint64_t pin, const struct lk_names *n,
                const char *field, size_t flen, bool all, ld_redis_cb *cb,
                void *arg)
{
    if (n->mode != LK_MODE_PLAIN) {
        const char *side = lk_mode_name(n->mode);
        const char *rw[] = {n->hash,         field,   side,
                            all ? "a" : "1", n->chan, n->rwpfx};
        size_t rwlens[] = {n->hash_len, flen,        strlen(side),
                           1,           n->chan_len, n->rwpfx_len};
        int nargs = 6;
        if (chan_is_default(n) && n->rwpfx_len == n->hash_len &&
            memcmp(n->rwpfx, n->hash, n->hash_len) == 0) {
            nargs = all ? 4 : 3;
        }
        lk_script_ex(flags, pin, LD_SCRIPT_rw_release, n, 1, nargs, rw, rwlens,
                     cb, arg);
        return;
    }
    const char *args[] = {n->hash, field, all ? "a" : "1", n->chan,
                          LK_UNLOCK_MSG};
    size_t lens[] = {n->hash_len, flen, 1, n->chan_len, strlen(LK_UNLOCK_MSG)};
    int nargs = 5;
    if (!lock_mod.redlock) {
        nargs = 4;
        if (chan_is_default(n)) {
            nargs = all ? 3 : 2;
        }
    }
    lk_script_ex(flags, pin, LD_SCRIPT_lock_release, n, 1, nargs, args, lens,
                 cb, arg);
}

void
lk_script(enum ld_script_id id, const struct lk_names *n, int nkeys, int nargs,
          const char **args, size_t *lens, ld_redis_cb *cb, void *arg)
{
    lk_script_ex(0, 0, id, n, nkeys, nargs, args, lens, cb, arg);
}

enum ld_redis_outcome
lk_outcome(void)
{
    return lock_mod.redlock ? ld_redlock_outcome() : ld_redis_outcome();
}

const char *
lk_failure_reason(void)
{
    return lock_mod.redlock ? ld_redlock_failure_reason()
                            : ld_redis_failure_reason();
}

/* Redlock's answers come from N connections: none to pin to. */
uint64_t
lk_conn_id(void)
{
    return lock_mod.redlock ? 0 : ld_redis_conn_id();
}
