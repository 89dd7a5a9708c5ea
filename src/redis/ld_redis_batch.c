/*
 * Batched scripts: the scripts marked "--@batchable" (src/lua/lua2c.sh) that
 * are issued in one turn of the loop for the same connection leave as one
 * EVALSHA of a batch script, which runs each item in turn and answers an
 * array of one result per item.
 *
 * Redis spends most of a short script's time on what every command costs
 * (reading, parsing, setting up the script call, the reply), not on the
 * script's own work; one call for N items pays that once. Nothing waits
 * for a batch to fill: what is held is sent by an event activated with the
 * first held item, which runs after the events already ready in this turn
 * (the sessions' reads), and at once when redis.batch_max items or
 * BATCH_MAX_BYTES are held. A batch of one item goes as its own EVALSHA,
 * and a script for a connection with nothing in flight and nothing held
 * goes at once: with Redis idle there is nothing to save, and at one
 * request at a time holding would only cost the end-of-turn event.
 * Any other command for a connection sends what it holds first, so the
 * commands of a connection keep their issue order.
 *
 * The batch script is generated at start from the bodies of the batchable
 * scripts: each becomes "F[id] = function(KEYS, ARGV) <body> end", and a
 * loop hands each item its slice of KEYS and ARGV, by the per-item counts
 * of a header, and calls it under pcall, so that an error raised in one item becomes that
 * item's error reply ({err = ...} nested in the array is an error element
 * of the reply; an error text without a code such as WRONGTYPE gets ERR)
 * and the other items run as they would alone. nil results
 * travel as false (a nil would end the array): both are a nil reply.
 *
 * The batch is a script command like any other (loaded in the handshake,
 * NOSCRIPT resent as EVAL, timeouts, set-aside connections); its callback
 * hands each item its own element with the outcome each would have had
 * alone. Never batched: commands pinned to a connection, the lock pool of
 * lock.wait_replicas, and cluster mode (the keys of one EVALSHA must share
 * a slot; items go one by one there). Redlock's instances batch per
 * instance, as each is a node of its own.
 *
 * It owns the held batches; it must not change the order of what one
 * connection sends (what was issued before a batch goes before it).
 */
#include "ld_redis.h"
#include "ld_redis_int.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_defer.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bytes of keys and arguments held for one batch before it goes. */
#define BATCH_MAX_BYTES (64 * 1024)

/* The items held on a connection (kept from turn to turn, so that a turn
 * with one script allocates nothing), or those of a batch sent. */
struct rbatch {
    struct rnode *node;
    struct rcmd **items;
    int n, cap;
    size_t bytes;
    bool held; /* on batch_mod.held this turn */
};

static struct {
    char *body;
    struct ld_defer defer;
    struct rconn **held; /* connections holding a batch this turn */
    int n_held, cap_held;
    long long pending; /* items held, not sent yet */
} batch_mod;

/* KEYS and ARGV of the items are two tables reused from item to item
 * (entries past the item's count cleared): a new pair per item costs
 * Redis more than the call of a script it saves (callgrind). The
 * scripts never keep or extend them. */
static const char BATCH_TAIL[] =
    "local hdr, byte, pcall = ARGV[1], string.byte, pcall\n"
    "local res, k, a = {}, {}, {}\n"
    "local kp, ap = 0, 1\n"
    "for i = 1, #hdr / 3 do\n"
    "    local s, nk, na = byte(hdr, 3 * i - 2, 3 * i)\n"
    "    for j = 1, nk do k[j] = KEYS[kp + j] end\n"
    "    for j = nk + 1, #k do k[j] = nil end\n"
    "    for j = 1, na do a[j] = ARGV[ap + j] end\n"
    "    for j = na + 1, #a do a[j] = nil end\n"
    "    kp, ap = kp + nk, ap + na\n"
    "    local ok, r = pcall(F[s], k, a)\n"
    "    if not ok then\n"
    "        if type(r) == 'table' and r.err ~= nil then\n"
    "            r = {err = r.err}\n"
    "        else\n"
    "            r = tostring(r)\n"
    "            if not string.find(r, '^%u[%u_]* ') then\n"
    "                r = 'ERR ' .. r\n"
    "            end\n"
    "            r = {err = r}\n"
    "        end\n"
    "    elseif r == nil then\n"
    "        r = false\n"
    "    end\n"
    "    res[i] = r\n"
    "end\n"
    "return res\n";

static char *
build_body(void)
{
    size_t len = 32 + sizeof(BATCH_TAIL);
    for (int i = 0; i < REDIS_N_SCRIPTS; i++) {
        if (ld_lua_batchable[i]) {
            len += strlen(redis_script_bodies[i]) + 64;
        }
    }
    char *body = ld_xmalloc(len);
    size_t used = (size_t)snprintf(body, len, "local F = {}\n");
    for (int i = 0; i < REDIS_N_SCRIPTS; i++) {
        if (ld_lua_batchable[i]) {
            used += (size_t)snprintf(body + used, len - used,
                                     "F[%d] = function(KEYS, ARGV)\n%s\nend\n",
                                     i, redis_script_bodies[i]);
        }
    }
    snprintf(body + used, len - used, "%s", BATCH_TAIL);
    return body;
}

const char *
redis_batch_body(void)
{
    return batch_mod.body;
}

static void flush_all(void *arg);

int
redis_batch_init(void)
{
    memset(&batch_mod, 0, sizeof(batch_mod));
    batch_mod.body = build_body();
    ld_defer_init(&batch_mod.defer, redis_mod.ctx->base, flush_all, NULL);
    return LD_OK;
}

void
redis_batch_free(void)
{
    ld_defer_free(&batch_mod.defer);
    free(batch_mod.held);
    free(batch_mod.body);
    memset(&batch_mod, 0, sizeof(batch_mod));
}

long long
redis_batch_pending(void)
{
    return batch_mod.pending;
}

static void batch_cb(redisReply *reply, void *arg);

bool
redis_batch_owns(const struct rcmd *cmd)
{
    return cmd->cb == batch_cb;
}

static void
batch_free(struct rbatch *b)
{
    free(b->items);
    free(b);
}

void
redis_batch_release(struct rcmd *cmd)
{
    struct rbatch *b = cmd->arg;
    for (int i = 0; i < b->n; i++) {
        redis_rcmd_free(b->items[i]);
    }
    batch_free(b);
}

static size_t
item_bytes(const struct rcmd *cmd)
{
    size_t bytes = 0;
    for (int i = 0; i < cmd->argc; i++) {
        bytes += cmd->argvlen[i];
    }
    return bytes;
}

bool
redis_batch_add(struct rconn *c, struct rcmd *cmd, uint64_t pin)
{
    int max = redis_mod.ctx->cfg->redis.batch_max;
    if (max < 2 || pin != 0 || c->pool != LD_REDIS_POOL_SHARED ||
        c->state != CONN_READY || c->draining ||
        !ld_lua_batchable[cmd->script] || cmd->argc > 255 ||
        (redis_mod.cluster && c->node->instance == 0) ||
        (cmd->x != NULL && cmd->x->asking)) {
        return false;
    }
    struct rbatch *b = c->batch;
    if ((b == NULL || b->n == 0) && TAILQ_EMPTY(&c->sent)) {
        /* Nothing in flight: Redis is idle, and holding costs what it
         * saves. Under load a connection is never idle. */
        return false;
    }
    if (b == NULL) {
        b = ld_xcalloc(1, sizeof(*b));
        b->node = c->node;
        c->batch = b;
    }
    if (!b->held) {
        b->held = true;
        if (batch_mod.n_held == batch_mod.cap_held) {
            batch_mod.cap_held = batch_mod.cap_held == 0
                                     ? 16
                                     : 2 * batch_mod.cap_held;
            batch_mod.held = ld_xrealloc(batch_mod.held,
                                         sizeof(*batch_mod.held) *
                                             (size_t)batch_mod.cap_held);
        }
        batch_mod.held[batch_mod.n_held++] = c;
        ld_defer_kick(&batch_mod.defer);
    }
    if (b->n == b->cap) {
        b->cap = b->cap == 0 ? 8 : 2 * b->cap;
        b->items = ld_xrealloc(b->items, sizeof(*b->items) * (size_t)b->cap);
    }
    b->items[b->n++] = cmd;
    b->bytes += item_bytes(cmd);
    batch_mod.pending++;
    cmd->conn = c; /* for a timeout of its own (redis_timeout_arm) */
    if (b->n >= max || b->bytes >= BATCH_MAX_BYTES) {
        redis_batch_flush_conn(c);
    }
    return true;
}

void
redis_batch_drop(struct rconn *c, const char *why)
{
    /* C's memory is going: no entry of the held list may point at it. */
    for (int i = 0; i < batch_mod.n_held; i++) {
        if (batch_mod.held[i] == c) {
            batch_mod.held[i] = NULL;
        }
    }
    struct rbatch *b = c->batch;
    if (b == NULL) {
        return;
    }
    c->batch = NULL;
    batch_mod.pending -= b->n;
    for (int i = 0; i < b->n; i++) {
        b->items[i]->conn = NULL;
        redis_fail_later(b->items[i], LD_REDIS_NOT_SENT, why);
    }
    batch_free(b);
}

/* An item's key count, kept as the first of its arguments. */
static int
item_nkeys(const struct rcmd *it)
{
    int nk = 0;
    for (size_t i = 0; i < it->argvlen[0]; i++) {
        nk = nk * 10 + (it->argv[0][i] - '0');
    }
    return nk;
}

/* The batch's key and argument counts over every item, and the bytes
 * of the items' arguments (with their NULs) beyond the scripts' names. */
static size_t
batch_counts(const struct rbatch *b, int *nk_all, int *na_all)
{
    size_t bytes = 0;
    *nk_all = 0;
    *na_all = 0;
    for (int i = 0; i < b->n; i++) {
        const struct rcmd *it = b->items[i];
        int nk = item_nkeys(it);
        *nk_all += nk;
        *na_all += it->argc - 1 - nk;
        bytes += b->items[i]->argc + item_bytes(it) - it->argvlen[0];
    }
    return bytes;
}

/* Every item's header bytes into HDR, and its keys (from AV[1]) and
 * arguments (from AV[A]) copied from P on. */
static void
batch_fill(const struct rbatch *b, char **av, size_t *al, char *hdr, char *p,
           int a)
{
    int k = 1;
    for (int i = 0; i < b->n; i++) {
        const struct rcmd *it = b->items[i];
        int nk = item_nkeys(it);
        hdr[3 * i] = (char)it->script;
        hdr[3 * i + 1] = (char)nk;
        hdr[3 * i + 2] = (char)(it->argc - 1 - nk);
        for (int j = 1; j < it->argc; j++) {
            int to = j <= nk ? k++ : a++;
            memcpy(p, it->argv[j], it->argvlen[j] + 1);
            av[to] = p;
            al[to] = it->argvlen[j];
            p += it->argvlen[j] + 1;
        }
    }
}

/* The arguments of the batch, kept on its command in the layout of
 * the kept arguments of a script (for a NOSCRIPT): the key count, every
 * item's keys, the header, every item's arguments. The header is one
 * string of three bytes per item (script, key count, argument count),
 * which the script reads with one string.byte per item. */
static struct rcmd *
batch_cmd(struct rbatch *b)
{
    int nk_all, na_all;
    size_t bytes = batch_counts(b, &nk_all, &na_all);
    char nks[LD_LL_STR_MAX];
    size_t nks_len = ld_ll_to_str(nks, nk_all);
    int argc = 1 + nk_all + 1 + na_all;
    size_t hlen = 3 * (size_t)b->n;
    bytes += nks_len + 1 + hlen + 1;
    size_t head = (sizeof(char *) + sizeof(size_t)) * (size_t)argc;
    char *block = malloc(head + bytes);
    if (block == NULL) {
        return NULL;
    }
    char **av = (char **)block;
    size_t *al = (size_t *)(block + sizeof(char *) * (size_t)argc);
    char *p = block + head;
    memcpy(p, nks, nks_len + 1);
    av[0] = p;
    al[0] = nks_len;
    p += nks_len + 1;
    char *hdr = p;
    av[1 + nk_all] = hdr;
    al[1 + nk_all] = hlen;
    p += hlen + 1;
    hdr[hlen] = '\0';
    batch_fill(b, av, al, hdr, p, 1 + nk_all + 1);

    struct rcmd *cmd = redis_cmd_new();
    cmd->cb = batch_cb;
    cmd->arg = b;
    cmd->script = REDIS_BATCH_SCRIPT;
    cmd->instance = b->items[0]->instance;
    for (int i = 0; i < b->n; i++) {
        cmd->flags |= b->items[i]->flags & LD_REDIS_F_LATE;
    }
    cmd->argv = av;
    cmd->argvlen = al;
    cmd->argc = argc;
    return cmd;
}

static void
fail_items(struct rbatch *b, const char *why)
{
    for (int i = 0; i < b->n; i++) {
        redis_fail_later(b->items[i], LD_REDIS_NOT_SENT, why);
    }
    batch_free(b);
}

void
redis_batch_flush_conn(struct rconn *c)
{
    struct rbatch *h = c->batch;
    if (h == NULL || h->n == 0) {
        return;
    }
    int n = h->n;
    batch_mod.pending -= n;
    h->n = 0;
    h->bytes = 0;
    if (c->state != CONN_READY || c->conn == NULL) {
        /* Lost or set aside since: each item finds its way again (never
         * back here: C is not ready). */
        for (int i = 0; i < n; i++) {
            h->items[i]->conn = NULL;
            redis_route(h->items[i]);
        }
        return;
    }
    if (n == 1) {
        if (redis_send_script(c, h->items[0]) != LD_OK) {
            redis_fail_later(h->items[0], LD_REDIS_NOT_SENT,
                             "could not queue the command");
        }
        return;
    }
    /* The items go with the batch command; C holds anew from nothing. */
    struct rbatch *b = ld_xcalloc(1, sizeof(*b));
    b->node = h->node;
    b->items = h->items;
    b->n = n;
    b->cap = h->cap;
    h->items = NULL;
    h->cap = 0;
    struct rcmd *cmd = batch_cmd(b);
    if (cmd == NULL) {
        fail_items(b, "out of memory");
        return;
    }
    ld_stats.redis_batches++;
    ld_stats.redis_batched_items += n;
    if (redis_send_script(c, cmd) != LD_OK) {
        cmd->cb = NULL;
        cmd->arg = NULL;
        redis_rcmd_free(cmd);
        fail_items(b, "could not queue the command");
    }
}

static void
flush_all(void *arg)
{
    (void)arg;
    /* Rerouted items may be held again, appended: the index sees them. */
    for (int i = 0; i < batch_mod.n_held; i++) {
        struct rconn *c = batch_mod.held[i];
        if (c != NULL) {
            c->batch->held = false;
            redis_batch_flush_conn(c);
        }
    }
    batch_mod.n_held = 0;
}

/* No reply for the batch: each item hears what it would have heard alone
 * (see redis_fail_sent and the set-aside connections). */
static void
fan_out_none(struct rbatch *b, enum ld_redis_outcome o, const char *why,
             uint64_t id)
{
    int calls = 0;
    for (int i = 0; i < b->n; i++) {
        struct rcmd *it = b->items[i];
        bool late = (it->flags & LD_REDIS_F_LATE) != 0;
        enum ld_redis_outcome io = o;
        if (o == LD_REDIS_LOST) {
            if (it->answered && !late) {
                continue;
            }
            io = late ? LD_REDIS_LOST : LD_REDIS_UNKNOWN;
        } else if (it->answered) {
            continue;
        }
        it->answered = true;
        calls++;
        redis_call_cb(it, NULL, io, why, id);
    }
    if (calls > 1) {
        ld_stats.redis_errors += calls - 1; /* the batch counted one */
    }
}

static void
batch_cb(redisReply *reply, void *arg)
{
    struct rbatch *b = arg;
    enum ld_redis_outcome o = ld_redis_outcome();
    uint64_t id = ld_redis_conn_id();
    if (reply == NULL) {
        fan_out_none(b, o, ld_redis_failure_reason(), id);
        return;
    }
    redisReply bad = {0};
    char text[96];
    bool each = reply->type == REDIS_REPLY_ARRAY &&
                reply->elements == (size_t)b->n;
    if (reply->type != REDIS_REPLY_ERROR && !each) {
        bad.type = REDIS_REPLY_ERROR;
        bad.len = (size_t)snprintf(text, sizeof(text),
                                   "ERR the batch of %d scripts got an "
                                   "answer of another shape",
                                   b->n);
        bad.str = text;
    }
    bool doubted = false;
    for (int i = 0; i < b->n; i++) {
        struct rcmd *it = b->items[i];
        redisReply *r = each                               ? reply->element[i]
                        : reply->type == REDIS_REPLY_ERROR ? reply
                                                           : &bad;
        if (each && !doubted &&
            (ld_reply_is_error(r, "READONLY") ||
             ld_reply_is_error(r, "LOADING"))) {
            doubted = true;
            redis_doubt(b->node, r->str);
        }
        if (!it->answered) {
            it->answered = true;
            redis_call_cb(it, r, LD_REDIS_ANSWERED, "", id);
        } else if (it->flags & LD_REDIS_F_LATE) {
            redis_call_cb(it, r, LD_REDIS_LATE, "", id);
        }
    }
}
