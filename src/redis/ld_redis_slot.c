/*
 * The connections under the command queue: each slot of a pool owns an
 * ld_conn, loads the scripts once ld_conn reports it ready, and is set
 * aside (kept for late answers, for a bounded time) when ld_conn reports
 * a reply owed for redis.timeout_ms, while the slot gets a new
 * connection.
 *
 * It owns the pools' connections and the drains of those set aside; the
 * commands on them are ld_redis.c's.
 */
#include "ld_redis_int.h"

#include "ld_redis.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

/* ---- connection lifecycle ------------------------------------------- */

/* A connection attempt failed: Redis counts as down until one succeeds,
 * and what waited for a connection learns it now. */
static void
attempt_failed(struct rnode *n)
{
    n->known_down = true;
    redis_waiting_retry(n);
}

/* The watcher's step (ld_redis_conn_hooks), last, on shared
 * connections only: the cache reads there. */
static void
slot_hook_step(struct rconn *c)
{
    const struct ld_redis_conn_hooks *h = redis_mod.hooks;
    const char *av[8];
    size_t al[8];
    /* Not on Redlock's instances: the cache reads only on redis.*. */
    if (h == NULL || h->handshake == NULL || c->pool != LD_REDIS_POOL_SHARED ||
        c->node->instance != 0) {
        return;
    }
    int n = h->handshake(c->id, av, al, (int)LD_ARRAY_LEN(av), h->arg);
    if (n <= 0) {
        return;
    }
    struct rcmd *cmd = redis_cmd_new();
    cmd->internal = true;
    cmd->hook = true;
    cmd->script = -1;
    cmd->arg = (void *)"hook";
    c->handshake_left++;
    if (redis_send_argv(c, cmd, n, av, al) != LD_OK) {
        c->handshake_left--;
        c->handshake_failed = true;
        free(cmd);
    }
}

static void
slot_ready(struct ld_conn *conn, void *owner)
{
    struct rconn *c = owner;
    c->id = ld_conn_id(conn);
    c->why[0] = '\0';
    c->state = CONN_HANDSHAKE;
    c->handshake_left = 0;
    c->handshake_failed = false;
    /* The scripts, then the batch script made of them. */
    for (int i = 0; i <= REDIS_BATCH_SCRIPT; i++) {
        c->handshake_left++;
        if (redis_script_load(c, i, i,
                              i < REDIS_BATCH_SCRIPT ? redis_script_names[i]
                                                     : "batch") != LD_OK) {
            c->handshake_left--;
            c->handshake_failed = true;
        }
    }
    slot_hook_step(c);
    /* Replies never arrive before we return to the loop, so the count
     * cannot reach zero while steps are still being queued. */
    if (c->handshake_left == 0) {
        ld_conn_close(conn, "handshake could not be sent");
    }
}

static void
slot_down(struct ld_conn *conn, bool was_ready, const char *why, void *owner)
{
    struct rconn *c = owner;
    LD_UNUSED(was_ready);
    bool slot_was_ready = c->state == CONN_READY;
    char reason[256];
    if (c->why[0] != '\0') {
        snprintf(reason, sizeof(reason), "%s", c->why);
    } else {
        snprintf(reason, sizeof(reason), "connection lost: %s", why);
    }
    redis_set_ready(c, false);
    c->state = CONN_DOWN;
    if (slot_was_ready) {
        log_warn("redis connection lost conn=%d reason=\"%s\"", c->idx, why);
    } else {
        log_debug("redis connect failed conn=%d reason=\"%s\"", c->idx, why);
        snprintf(c->node->last_error, sizeof(c->node->last_error), "%s", why);
    }
    redis_fail_sent(c, reason);
    c->why[0] = '\0';
    LD_UNUSED(conn);
    redis_hook_lost(c->id);
    if (!slot_was_ready) {
        attempt_failed(c->node);
    } else {
        redis_waiting_retry(c->node);
    }
    redis_doubt(c->node, why);
}

/* Close a connection that was set aside, from the loop (never from inside
 * one of its own callbacks). What still waits for an answer gets its last
 * call now. */
void
redis_drain_close(struct rconn *d)
{
    LD_ASSERT(d->draining && !d->closing);
    LIST_REMOVE(d, dlink);
    d->closing = true;
    if (d->conn != NULL) {
        if (!TAILQ_EMPTY(&d->sent)) {
            log_warn("redis connection given up conn=%d reason=\"%s\"", d->idx,
                     d->why);
        }
        ld_conn_free(d->conn);
        d->conn = NULL;
    }
    redis_fail_sent(d, d->why);
    event_free(d->timeout_ev);
    free(d);
}

static void
drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rconn *d = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    uint64_t now = ld_now_us();
    if (d->conn == NULL || TAILQ_EMPTY(&d->sent) || now >= d->drain_end_us) {
        if (d->conn != NULL && !TAILQ_EMPTY(&d->sent)) {
            snprintf(d->why, sizeof(d->why),
                     "no answer within %d ms, connection given up",
                     redis_mod.ctx->cfg->redis.timeout_ms *
                         LD_REDIS_DRAIN_FACTOR);
        }
        redis_drain_close(d);
        return;
    }
    ld_timer_at_us(d->timeout_ev, d->drain_end_us);
}

static void
drain_down(struct ld_conn *conn, bool was_ready, const char *why, void *owner)
{
    struct rconn *d = owner;
    LD_UNUSED(was_ready);
    snprintf(d->why, sizeof(d->why), "connection lost: %s", why);
    /* Its commands get their last call now; it is freed from the loop. */
    redis_fail_sent(d, d->why);
    ld_conn_free(conn);
    d->conn = NULL;
    event_active(d->timeout_ev, EV_TIMEOUT, 0);
}

static void
drain_stall(struct ld_conn *conn, void *owner)
{
    /* The drain bound of drain_timeout_cb governs a set-aside one. */
    LD_UNUSED(conn);
    LD_UNUSED(owner);
}

static const struct ld_conn_ops drain_ops = {
    .on_ready = NULL,
    .on_down = drain_down,
    .on_reply = redis_reply_cb,
    .on_push = NULL,
    .on_stall = drain_stall,
};

static void slot_stall(struct ld_conn *conn, void *owner);

static const struct ld_conn_ops slot_ops = {
    .on_ready = slot_ready,
    .on_down = slot_down,
    .on_reply = redis_reply_cb,
    .on_push = NULL,
    .on_stall = slot_stall,
};

static void
slot_new_conn(struct rconn *c)
{
    c->conn = ld_conn_new(redis_mod.ctx, &c->node->addr,
                          c->pool == LD_REDIS_POOL_LOCK ? LD_CONN_ROLE_LOCK
                                                        : LD_CONN_ROLE_CMD,
                          &slot_ops, c);
}

/* A command went unanswered for redis.timeout_ms: answer everything queued
 * on C now (it may have run: outcome unknown), give the slot a new
 * connection, and keep the old one open for Redis' late answers, which
 * settle what the callers could not know, for a bounded time. */
static void
conn_drain(struct rconn *c, const char *why)
{
    struct rconn *d = ld_xcalloc(1, sizeof(*d));
    d->idx = c->idx;
    d->node = c->node;
    d->id = c->id;
    d->pool = c->pool;
    d->conn = c->conn;
    d->state = CONN_DOWN;
    d->draining = true;
    TAILQ_INIT(&d->sent);
    TAILQ_CONCAT(&d->sent, &c->sent, link);
    d->timeout_ev = evtimer_new(redis_mod.ctx->base, drain_timeout_cb, d);
    if (d->timeout_ev == NULL) {
        ld_oom_in("evtimer_new");
    }
    snprintf(d->why, sizeof(d->why), "%s", why);
    ld_conn_set_owner(d->conn, &drain_ops, d);
    ld_conn_no_retry(d->conn);
    d->drain_end_us = ld_now_us() +
                      (uint64_t)redis_mod.ctx->cfg->redis.timeout_ms * 1000 *
                          LD_REDIS_DRAIN_FACTOR;
    LIST_INSERT_HEAD(&redis_mod.draining, d, dlink);

    redis_set_ready(c, false);
    c->state = CONN_CONNECTING;
    redis_hook_lost(c->id);
    log_warn("redis connection stalled conn=%d reason=\"%s\"; kept for "
             "late answers, reconnecting",
             c->idx, why);
    drain_timeout_cb(-1, 0, d);

    /* Callbacks may pin new commands to D (appended after LAST). */
    struct rcmd *last = TAILQ_LAST(&d->sent, rcmd_queue);
    struct rcmd *cmd;
    TAILQ_FOREACH(cmd, &d->sent, link)
    {
        if (!cmd->internal && !cmd->answered) {
            cmd->answered = true;
            ld_stats.redis_errors++;
            redis_call_cb(cmd, NULL, LD_REDIS_UNKNOWN, d->why, d->id);
        }
        if (cmd == last) {
            break;
        }
    }
    slot_new_conn(c);
    ld_conn_start(c->conn);
}

static void
slot_stall(struct ld_conn *conn, void *owner)
{
    struct rconn *c = owner;
    char why[96];
    ld_stats.redis_timeouts++;
    snprintf(why, sizeof(why), "timed out after %d ms",
             redis_mod.ctx->cfg->redis.timeout_ms);
    if (c->state == CONN_READY) {
        conn_drain(c, why);
    } else {
        snprintf(c->why, sizeof(c->why), "%s", why);
        ld_conn_close(conn, why);
    }
}

void
redis_handshake_reply(struct rconn *c, redisReply *reply, struct rcmd *cmd)
{
    if (c->state != CONN_HANDSHAKE) {
        return;
    }
    if (cmd->hook) {
        const struct ld_redis_conn_hooks *h = redis_mod.hooks;
        if (h != NULL && h->reply != NULL) {
            h->reply(c->id, reply, h->arg);
        }
    } else if (reply->type == REDIS_REPLY_ERROR) {
        if (!c->handshake_failed) {
            c->handshake_failed = true;
            log_error("redis handshake failed conn=%d step=%s error=\"%s\"",
                      c->idx, (const char *)cmd->arg, reply->str);
            snprintf(c->node->last_error, sizeof(c->node->last_error),
                     "handshake step %s failed: %s", (const char *)cmd->arg,
                     reply->str);
        }
    } else if (cmd->script >= 0 && reply->type == REDIS_REPLY_STRING &&
               reply->len == 40) {
        memcpy(c->node->shas[cmd->script], reply->str, 40);
        c->node->shas[cmd->script][40] = '\0';
    }
    if (--c->handshake_left > 0) {
        return;
    }
    if (c->handshake_failed) {
        /* A script Redis refuses: retrying fast only floods the log, so
         * this backs off like any other failure. */
        snprintf(c->why, sizeof(c->why), "handshake failed");
        ld_conn_close(c->conn, "handshake failed");
        return;
    }
    ld_stats.redis_reconnects++;
    log_debug("redis connection ready conn=%d", c->idx);
    redis_conn_up(c);
    redis_waiting_retry(c->node);
}

void
redis_slot_start(struct rconn *c)
{
    c->state = CONN_CONNECTING;
    ld_conn_start(c->conn);
}

void
redis_slot_init(struct rnode *n, struct rconn *c, int idx,
                enum ld_redis_pool pool)
{
    c->node = n;
    c->idx = idx;
    c->pool = pool;
    TAILQ_INIT(&c->sent);
    slot_new_conn(c);
}
