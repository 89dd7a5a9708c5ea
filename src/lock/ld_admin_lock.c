/*
 * The plain locks' part of the operator ops: what lock.list shows of them
 * and how lock.force_unlock frees one (src/lua/lock_force.lua). Part of
 * the lock module (ld_lock_int.h); ld_admin.c holds the ops. It only
 * reads the records, but for telling the holders of a lock it freed
 * (lk_rec_lost), and must not touch read-write locks or groups.
 */
#include "ld_admin.h"
#include "ld_lock_int.h"

#include "ld_lock_codes.h"
#include "ld_lockwait.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <stdlib.h>
#include <string.h>

static void
list_plain(struct ld_admin_list *l)
{
    uint64_t now = ld_now_ms();
    struct lk_rec *rec;
    TAILQ_FOREACH(rec, &lock_mod.held, held_entry)
    {
        if (rec->ls == NULL || rec->count == 0 ||
            !ld_admin_list_wants(l, rec->key, rec->key_len)) {
            continue;
        }
        struct ld_admin_lock e = {
            .key = rec->key,
            .key_len = rec->key_len,
            .mode = lk_mode_name(rec->n.mode),
            .sess = rec->ls->sess,
            .count = rec->count,
            .ttl_ms = rec->lease_end_ms > now
                          ? (long long)(rec->lease_end_ms - now)
                          : 0,
            .held_ms = now > rec->acquired_ms
                           ? (long long)(now - rec->acquired_ms)
                           : 0,
            .waiters = ld_lockwait_waiting(rec->n.hash, rec->n.hash_len),
        };
        if (!ld_admin_list_add(l, &e)) {
            return;
        }
    }
}

/* The holders of this lock in this daemon hear it at once; those of other
 * daemons from their next renewal, which finds the force marker. */
static long long
tell_holders(const struct lk_names *n)
{
    long long told = 0;
    struct lk_rec *rec = TAILQ_FIRST(&lock_mod.held);
    while (rec != NULL) {
        struct lk_rec *next = TAILQ_NEXT(rec, held_entry);
        if (rec->count > 0 && rec->n.hash_len == n->hash_len &&
            memcmp(rec->n.hash, n->hash, n->hash_len) == 0) {
            rec->refs++;
            lk_rec_lost(rec, "taken", false);
            lk_rec_unref(rec);
            told++;
        }
        rec = next;
    }
    return told;
}

static void
force_on_reply(redisReply *r, void *arg)
{
    struct lk_op *op = arg;
    if (lock_mod.freed) {
        lk_op_free(op);
        return;
    }
    long long v[2] = {0, 0};
    int n = ld_lease_reply_ints(r, v, 2);
    struct ld_req *req = op->req;
    const char *who = req->sess->client[0] != '\0' ? req->sess->client : "-";
    if (n >= 2 && v[0] == LD_LOCK_RELEASED) {
        ld_stats.lock_released++;
        long long told = tell_holders(&op->n);
        log_warn("lock force-unlocked key=%.*s holders=%lld told_here=%lld "
                 "session=%s client=%s",
                 (int)op->key_len, op->key, v[1], told, req->sess->name, who);
        ld_reply_ok(req, json_pack("{s:b}", "released", true));
    } else if (n >= 1 && v[0] == LD_LOCK_ABSENT) {
        log_info("lock force-unlock found no lock key=%.*s session=%s "
                 "client=%s",
                 (int)op->key_len, op->key, req->sess->name, who);
        ld_reply_ok(req, json_pack("{s:b}", "released", false));
    } else {
        lk_op_fail(op, r, n, v, true);
    }
    op->req = NULL;
    lk_op_free(op);
}

static void
force_unlock(struct ld_req *req, const char *key, size_t len)
{
    struct lk_op *op = lk_op_new(LK_RELEASE, req, NULL);
    lk_names_build(&op->n, key, len);
    op->key = ld_xstrndup(key, len);
    op->key_len = len;
    const struct lk_names *n = &op->n;
    const char *args[] = {n->hash, n->forced, n->chan, LK_UNLOCK_MSG,
                          n->rwchan};
    size_t lens[] = {n->hash_len, n->forced_len, n->chan_len,
                     strlen(LK_UNLOCK_MSG), n->rwchan_len};
    op->inflight = true;
    lk_script(LD_SCRIPT_lock_force, n, 2, 5, args, lens, force_on_reply, op);
}

void
lk_admin_init(void)
{
    ld_admin_add_lister(list_plain);
    ld_admin_set_forcer(force_unlock);
}
