/* Idempotent unlock: an unlock that carries "request_id" is remembered
 * under (token, request id) with its answer, and a repeat within the lease
 * is answered from that memory instead of running the release again.
 *
 * Why a retry needs this: Redisson-style reentrant locks decrement a hold
 * count, so an unlock whose reply was lost and that the client sends again
 * would take one hold too many (count 2 -> 1 -> 0), freeing a lock its
 * holder still believes it holds.
 *
 * Why the memory is the daemon's and not a session's or a record's: a
 * reply is lost mostly because the connection was, so the retry comes
 * from a new session (by token, for a detached lock); and the answer that
 * matters most, the last unlock's, ends the record it would hang on. So
 * entries live in one table keyed by token and request id, each until
 * the lease the lock had when it was answered would have run out and at
 * least lock.watchdog_ms (all a group's unlock or a token this daemon
 * holds no record of gets), and at most IDEM_MAX of them: beyond that the
 * oldest is forgotten first. */

#include "ld_lock_int.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_mem.h"
#include "ld_proto.h"

#include <stdlib.h>
#include <string.h>

struct lk_idem {
    char *key; /* token, NUL, request id */
    size_t key_len;
    struct lk_op *op; /* the unlock still out, NULL once answered */
    bool released;
    long long count;
    uint64_t until_ms;
    TAILQ_ENTRY(lk_idem) link; /* oldest first */
};

static struct {
    struct ld_dict *by_key;
    TAILQ_HEAD(, lk_idem) fifo; /* oldest first */
    size_t n;
} idem_mod = {.fifo = TAILQ_HEAD_INITIALIZER(idem_mod.fifo)};

static bool
rid_ok(const char *s, size_t len)
{
    if (len < 1 || len > LK_REQUEST_ID_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c > 0x7e) {
            return false;
        }
    }
    return true;
}

int
lk_idem_parse(struct ld_req *req, struct lk_rid *rid)
{
    memset(rid, 0, sizeof(*rid));
    if (ld_req_str(req, "request_id", false, &rid->s, &rid->len, &rid->has) !=
        LD_OK) {
        return LD_ERR;
    }
    if (rid->has && !rid_ok(rid->s, rid->len)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'request_id' must be 1..%d printable ASCII "
                       "characters",
                       LK_REQUEST_ID_MAX);
        return LD_ERR;
    }
    return LD_OK;
}

static void
idem_free(struct lk_idem *e)
{
    TAILQ_REMOVE(&idem_mod.fifo, e, link);
    ld_dict_del(idem_mod.by_key, e->key, e->key_len);
    idem_mod.n--;
    if (e->op != NULL) {
        e->op->idem = NULL;
    }
    free(e->key);
    free(e);
}

/* Entries are appended in time order but end at different times: the
 * head is dropped when it has ended or the table is full, and a lookup
 * ignores an ended entry further in. */
static void
idem_trim(uint64_t now)
{
    struct lk_idem *e;
    while ((e = TAILQ_FIRST(&idem_mod.fifo)) != NULL &&
           (idem_mod.n >= IDEM_MAX || (e->op == NULL && e->until_ms <= now))) {
        idem_free(e);
    }
}

static char *
idem_key(const char *tok, size_t tlen, const struct lk_rid *rid, size_t *len)
{
    *len = tlen + 1 + rid->len;
    char *k = ld_xmalloc(*len);
    memcpy(k, tok, tlen);
    k[tlen] = '\0';
    memcpy(k + tlen + 1, rid->s, rid->len);
    return k;
}

bool
lk_idem_start(struct lk_op *op, const char *tok, size_t tlen,
              const struct lk_rid *rid)
{
    if (!rid->has || tlen == 0) {
        return false;
    }
    if (idem_mod.by_key == NULL) {
        idem_mod.by_key = ld_dict_new();
    }
    uint64_t now = ld_now_ms();
    idem_trim(now);
    size_t klen;
    char *k = idem_key(tok, tlen, rid, &klen);
    struct lk_idem *e = ld_dict_get(idem_mod.by_key, k, klen);
    if (e != NULL && e->op == NULL && e->until_ms <= now) {
        idem_free(e);
        e = NULL;
    }
    if (e != NULL) {
        free(k);
        if (e->op != NULL) {
            /* Running it again could release twice; answering from a
             * guess could lie. The first one's answer settles it. */
            ld_reply_error_extra(op->req, LD_E_REDIS_UNAVAILABLE,
                                 json_pack("{s:s}", "outcome", "unknown"),
                                 "an unlock with this request_id is still "
                                 "waiting for redis; retry it later");
        } else {
            const struct ld_field f[] = {LD_BOOL("released", e->released),
                                         LD_INT("count", e->count)};
            ld_reply_ok_fields(op->req, f, LD_ARRAY_LEN(f));
        }
        op->req = NULL;
        return true;
    }
    e = ld_xcalloc(1, sizeof(*e));
    e->key = k;
    e->key_len = klen;
    e->op = op;
    op->idem = e;
    ld_dict_set(idem_mod.by_key, k, klen, e);
    TAILQ_INSERT_TAIL(&idem_mod.fifo, e, link);
    idem_mod.n++;
    return false;
}

void
lk_idem_done(struct lk_op *op, bool released, long long count,
             uint64_t lease_end_ms)
{
    struct lk_idem *e = op->idem;
    if (e == NULL) {
        return;
    }
    op->idem = NULL;
    e->op = NULL;
    e->released = released;
    e->count = count;
    uint64_t least = ld_now_ms() +
                     (uint64_t)lock_mod.ctx->cfg->lock.watchdog_ms;
    e->until_ms = lease_end_ms > least ? lease_end_ms : least;
}

void
lk_idem_op_free(struct lk_op *op)
{
    /* An unlock that ended without a success changed nothing (or its
     * outcome stays unknown): a retry must run. */
    if (op->idem != NULL) {
        idem_free(op->idem);
    }
}

void
lk_idem_free_all(void)
{
    struct lk_idem *e;
    while ((e = TAILQ_FIRST(&idem_mod.fifo)) != NULL) {
        idem_free(e);
    }
    if (idem_mod.by_key != NULL) {
        ld_dict_free(idem_mod.by_key);
        idem_mod.by_key = NULL;
    }
}
