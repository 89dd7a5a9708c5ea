/*
 * The Redis backend: a fixed set of pipelined command connections.
 *
 * The connections themselves (connecting, handshake, liveness, the
 * bound on a reply owed, reconnecting with backoff) are ld_conn's; this
 * module keeps what is about commands. Every command is wrapped in a
 * struct rcmd queued per connection in send order (Redis answers in that
 * order). When ld_conn reports a reply owed for redis.timeout_ms, the
 * connection is set aside: every command queued on it is answered
 * (outcome unknown) at once, its slot gets a new connection, and the old
 * one stays open a while longer only to hand Redis' late answers to the
 * commands that asked for them and to carry commands pinned to it (a
 * release that must run after the acquire it undoes). Each new
 * connection loads the scripts before it takes traffic.
 * A command issued while no connection is ready but one is on its way
 * waits for it (in issue order, bounded in count and by redis.timeout_ms
 * from the issue); once the latest attempt has failed, Redis counts as
 * down and commands are answered NOT_SENT at once.
 *
 * How a request reaches Redis and how its answer comes back:
 *   1. ld_session reads a line from the client, ld_frame cuts it out and
 *      ld_proto parses it into a struct ld_req;
 *   2. ld_dispatch finds the op's handler (registered by ld_lock,
 *      ld_cache...), which calls ld_redis_command_ex or
 *      ld_redis_script_ex with its callback and the request as argument;
 *   3. here the route (the key) picks the connection, so commands on one
 *      key keep their order; the command is formatted into the
 *      connection's output buffer, its struct rcmd appended to the
 *      connection's FIFO, and every command of the loop turn leaves in
 *      one write (the auto-pipelining);
 *   4. Redis answers in send order: the reply pops the FIFO's head
 *      (asserted), the callback runs with the reply and an outcome
 *      (ld_redis_outcome), and answers the client with ld_reply_ok or
 *      ld_reply_error*, which ld_session writes out;
 *   5. commands that never left (no connection, pin gone) are answered
 *      from the loop through the failure list, never from inside the
 *      call that issued them.
 *
 * See also "HOW A REQUEST REACHES REDIS" in leased(8).
 *
 * The states of a command (struct rcmd; its one link puts it on one list
 * at a time):
 *   ISSUED   route_cmd picks a node and a connection of it.
 *            -> SENT     a connection is ready (or the command is pinned
 *                        to one): formatted, on that connection's FIFO;
 *                        a batchable script is first held in the
 *                        connection's batch (ld_redis_batch.c) until the
 *                        turn ends or the batch is full;
 *            -> WAITING  none is ready but one is on its way;
 *            -> FAILED   Redis counts as down, the wait queue is full,
 *                        the pin is gone.
 *   WAITING  on the node's wait queue (cmd->waiting), in issue order.
 *            -> ISSUED   a connection became ready or an attempt failed
 *                        (redis_waiting_retry);
 *            -> FAILED   redis.timeout_ms from the issue ran out.
 *   SENT     on conn->sent until its reply, which pops the FIFO's head.
 *            -> ANSWERED the reply came: the callback runs (ANSWERED);
 *            -> ISSUED   cluster: MOVED or ASK sends it again; TRYAGAIN
 *                        or CLUSTERDOWN after a backoff (ld_cluster.c);
 *            -> SENT     NOSCRIPT: sent again as EVAL, on the same
 *                        connection;
 *            -> UNKNOWN  its own timeout_ms, or the connection was set
 *                        aside: the callback hears UNKNOWN (answered),
 *                        the record stays on the FIFO (of the drain
 *                        record, when set aside) for the late reply;
 *            -> ANSWERED the connection went down: UNKNOWN, or LOST
 *                        after an UNKNOWN (redis_fail_sent).
 *   UNKNOWN  answered, still owed a reply: with LD_REDIS_F_LATE the
 *            callback runs once more, LATE with the reply or LOST.
 *   FAILED   on redis_mod.failed, answered (NOT_SENT) from the loop.
 *   ANSWERED freed, or kept as a spare record (redis_rcmd_free).
 *
 * It owns the command records, their queues and their outcomes; the
 * connections are ld_redis_slot.c's and the slot map ld_cluster.c's, and no
 * caller above ever sees a connection of it.
 */
#include "ld_redis.h"
#include "ld_redis_int.h"

#include "ld_assert.h"
#include "ld_cluster_slot.h"
#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_defer.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <event2/event.h>

struct ld_redis_mod redis_mod;

_Static_assert(REDIS_N_SCRIPTS == LD_SCRIPT__COUNT,
               "ld_redis_int.h counts the scripts as ld_redis.h does");

const char *const redis_script_bodies[] = {
#define LD_SCRIPT_BODY(name) ld_lua_##name,
    LD_LUA_SCRIPTS(LD_SCRIPT_BODY)
#undef LD_SCRIPT_BODY
        NULL};

const char *const redis_script_names[] = {
#define LD_SCRIPT_NAME(name) #name,
    LD_LUA_SCRIPTS(LD_SCRIPT_NAME)
#undef LD_SCRIPT_NAME
        NULL};

const char *
redis_script_body(const struct rnode *n, int i)
{
    if (i == REDIS_BATCH_SCRIPT) {
        return redis_batch_body();
    }
    /* Independent instances beside a cluster (lock.redlock) are not
     * part of it: they keep classic PUBLISH. */
    if (redis_mod.cluster && n->instance == 0 &&
        redis_mod.cluster_bodies[i] != NULL) {
        return redis_mod.cluster_bodies[i];
    }
    return redis_script_bodies[i];
}

/* What the callback now running is told (ld_redis_outcome & co). */
struct cb_context {
    enum ld_redis_outcome outcome;
    const char *reason;
    uint64_t conn_id;
};

/* ld_redis.c's own state beside redis_mod (which ld_redis_init clears):
 * what the running callback is told, and the spare command records. */
#define CMD_SPARE 128
static struct {
    struct cb_context cur;
    struct rcmd *spare[CMD_SPARE];
    int n_spare;
} cmd_mod = {{LD_REDIS_ANSWERED, "", 0}, {NULL}, 0};

enum ld_redis_outcome
ld_redis_outcome(void)
{
    return cmd_mod.cur.outcome;
}

const char *
ld_redis_failure_reason(void)
{
    return cmd_mod.cur.reason;
}

uint64_t
ld_redis_conn_id(void)
{
    return cmd_mod.cur.conn_id;
}

void
redis_call_cb(struct rcmd *cmd, redisReply *reply,
              enum ld_redis_outcome outcome, const char *reason,
              uint64_t conn_id)
{
    char buf[320];
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR) {
        snprintf(buf, sizeof(buf), "%s%.*s",
                 cmd->noscript ? "after NOSCRIPT and reload: " : "",
                 (int)reply->len, reply->str);
        reason = buf;
    }
    struct cb_context saved = cmd_mod.cur;
    cmd_mod.cur.outcome = outcome;
    cmd_mod.cur.reason = reason != NULL ? reason : "";
    cmd_mod.cur.conn_id = conn_id;
    cmd->cb(reply, cmd->arg);
    cmd_mod.cur = saved;
}

bool
ld_reply_is_error(const redisReply *r, const char *prefix)
{
    if (r == NULL || r->type != REDIS_REPLY_ERROR) {
        return false;
    }
    return prefix == NULL || strncmp(r->str, prefix, strlen(prefix)) == 0;
}

bool
ld_reply_is_unavailable(const redisReply *r)
{
    static const char *const codes[] = {
        "LOADING",     "BUSY",     "READONLY",   "MASTERDOWN",
        "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "OOM",
        "MISCONF",     "NOAUTH",   "MOVED",      "ASK",
    };
    if (r == NULL || r->type != REDIS_REPLY_ERROR) {
        return false;
    }
    for (size_t i = 0; i < LD_ARRAY_LEN(codes); i++) {
        size_t n = strlen(codes[i]);
        if (strncmp(r->str, codes[i], n) == 0 &&
            (r->str[n] == ' ' || r->str[n] == '\0')) {
            return true;
        }
    }
    return false;
}

/* The node of the backend of redis.* (standalone and sentinel modes). */
static struct rnode *
main_node(void)
{
    return redis_mod.n_nodes > 0 ? redis_mod.nodes[0] : NULL;
}

const char *
ld_redis_address(void)
{
    if (redis_mod.cluster) {
        return redis_mod.label;
    }
    return main_node() != NULL ? main_node()->address : "";
}

bool
ld_redis_is_cluster(void)
{
    return redis_mod.cluster;
}

bool
ld_redis_ready(void)
{
    return ld_redis_instance_ready(0);
}

bool
ld_redis_instance_ready(int k)
{
    if (k < 0 || k > redis_mod.n_inst) {
        return false;
    }
    if (k > 0) {
        return redis_mod.inst[k]->n_ready > 0;
    }
    for (int i = 0; i < redis_mod.n_nodes; i++) {
        if (redis_mod.nodes[i]->instance == 0 &&
            redis_mod.nodes[i]->n_ready > 0) {
            return true;
        }
    }
    return false;
}

long long
ld_redis_outstanding(void)
{
    long long n = redis_mod.n_retry + redis_batch_pending();
    if (redis_mod.unmapped != NULL) {
        n += redis_mod.unmapped->n_waiting;
    }
    for (int k = 0; k < redis_mod.n_nodes; k++) {
        const struct rnode *node = redis_mod.nodes[k];
        n += node->n_waiting;
        for (int i = 0; i < node->n_conns + node->n_lock; i++) {
            struct rcmd *c;
            TAILQ_FOREACH(c, &node->conns[i].sent, link)
            {
                n++;
            }
        }
    }
    /* Late answers nobody waits for do not hold up a stop. */
    struct rconn *d;
    LIST_FOREACH(d, &redis_mod.draining, dlink)
    {
        struct rcmd *c;
        TAILQ_FOREACH(c, &d->sent, link)
        {
            if (!c->answered || (c->flags & LD_REDIS_F_LATE)) {
                n++;
            }
        }
    }
    return n;
}

void
ld_redis_on_state(ld_redis_state_fn *fn, void *arg)
{
    if (redis_mod.n_watchers < (int)LD_ARRAY_LEN(redis_mod.watchers)) {
        redis_mod.watchers[redis_mod.n_watchers].fn = fn;
        redis_mod.watchers[redis_mod.n_watchers].arg = arg;
        redis_mod.n_watchers++;
    }
}

void
ld_redis_on_instance_state(ld_redis_instance_state_fn *fn, void *arg)
{
    int i = redis_mod.n_inst_watchers;
    if (i < (int)LD_ARRAY_LEN(redis_mod.inst_watchers)) {
        redis_mod.inst_watchers[i].fn = fn;
        redis_mod.inst_watchers[i].arg = arg;
        redis_mod.n_inst_watchers++;
    }
}

static void
notify_state(int k, bool up)
{
    if (k == 0) {
        for (int i = 0; i < redis_mod.n_watchers; i++) {
            redis_mod.watchers[i].fn(up, redis_mod.watchers[i].arg);
        }
    }
    for (int i = 0; i < redis_mod.n_inst_watchers; i++) {
        redis_mod.inst_watchers[i].fn(k, up, redis_mod.inst_watchers[i].arg);
    }
}

/* C became ready or stopped being ready: count it, and tell the
 * watchers when that changed whether its instance is up. */
static void
ready_changed(struct rconn *c, bool ready)
{
    struct rnode *n = c->node;
    if (c->pool != LD_REDIS_POOL_SHARED) {
        /* The backend's state is the shared pool's. */
        if (ready) {
            n->lock_ever_ready = true;
        }
        return;
    }
    /* An instance is up while any of its nodes is. */
    bool inst_was = ld_redis_instance_ready(n->instance);
    n->n_ready += ready ? 1 : -1;
    LD_ASSERTF(n->n_ready >= 0 && n->n_ready <= n->n_conns,
               "ready connections of %s: %d of %d", n->address, n->n_ready,
               n->n_conns);
    bool inst_is = ld_redis_instance_ready(n->instance);
    if (n->instance == 0) {
        ld_stats.redis_connected += ready ? 1 : -1;
    }
    if (ready && n->n_ready == 1) {
        log_info("redis up address=%s%s", n->address,
                 n->instance > 0 ? " (lock.redlock)" : "");
        redis_cluster_node_up(n);
    } else if (!ready && n->n_ready == 0 && !redis_mod.freeing) {
        log_warn("redis down address=%s%s", n->address,
                 n->instance > 0 ? " (lock.redlock)" : "");
    }
    if (inst_was != inst_is && (inst_is || !redis_mod.freeing)) {
        notify_state(n->instance, inst_is);
    }
}

/* Call before changing c->state: it compares with the old state. */
void
redis_set_ready(struct rconn *c, bool ready)
{
    bool was = c->state == CONN_READY;
    if (was != ready) {
        ready_changed(c, ready);
    }
}

/* C's handshake is done. It takes commands, and Redis no longer counts
 * as down, before the watchers hear that Redis is up: what they send at
 * once (a delete owed, a re-check of the locks) would otherwise find no
 * connection ready, fail at once and wait out a backoff. */
void
redis_conn_up(struct rconn *c)
{
    LD_ASSERT(c->state == CONN_HANDSHAKE);
    c->state = CONN_READY;
    c->node->known_down = false;
    ready_changed(c, true);
}

struct rcmd_x *
redis_cmd_x(struct rcmd *cmd)
{
    if (cmd->x == NULL) {
        cmd->x = ld_xcalloc(1, sizeof(*cmd->x));
    }
    return cmd->x;
}

/* Records of ended commands are kept for the next ones (cmd_mod.spare):
 * a request's command would otherwise cost a calloc and a free. Bounded,
 * so that a burst does not keep its peak. */

struct rcmd *
redis_cmd_new(void)
{
    if (cmd_mod.n_spare > 0) {
        struct rcmd *cmd = cmd_mod.spare[--cmd_mod.n_spare];
        memset(cmd, 0, offsetof(struct rcmd, keep));
        return cmd;
    }
    return ld_xcalloc(1, sizeof(struct rcmd));
}

void
redis_rcmd_free(struct rcmd *cmd)
{
    LD_ASSERT(!cmd->waiting);
    if (redis_batch_owns(cmd)) {
        redis_batch_release(cmd);
    }
    if ((char *)cmd->argv != cmd->keep.bytes) {
        free(cmd->argv); /* one block: argv, argvlen and the bytes */
    }
    free(cmd->fail_reason);
    if (cmd->x != NULL) {
        if (cmd->x->timeout_ev != NULL) {
            event_free(cmd->x->timeout_ev);
        }
        free(cmd->x);
    }
    if (cmd_mod.n_spare < CMD_SPARE) {
        cmd_mod.spare[cmd_mod.n_spare++] = cmd;
    } else {
        free(cmd);
    }
}

/* Answer a command that never reached Redis, from the loop rather than
 * from inside the caller. */
static void
fail_later(struct rcmd *cmd, enum ld_redis_outcome outcome, const char *reason)
{
    /* One link: a command is on one list at a time. */
    LD_ASSERT(!cmd->waiting);
    cmd->fail_outcome = outcome;
    free(cmd->fail_reason);
    cmd->fail_reason = ld_xstrdup(reason);
    TAILQ_INSERT_TAIL(&redis_mod.failed, cmd, link);
    ld_defer_kick(&redis_mod.fail_defer);
}

void
redis_fail_later(struct rcmd *cmd, enum ld_redis_outcome outcome,
                 const char *reason)
{
    fail_later(cmd, (enum ld_redis_outcome)outcome, reason);
}

static void
fail_cb(void *arg)
{
    LD_UNUSED(arg);
    /* Failures queued by these callbacks wait for the next turn. */
    struct rcmd_queue list = TAILQ_HEAD_INITIALIZER(list);
    TAILQ_CONCAT(&list, &redis_mod.failed, link);
    while (!TAILQ_EMPTY(&list)) {
        struct rcmd *cmd = TAILQ_FIRST(&list);
        TAILQ_REMOVE(&list, cmd, link);
        ld_stats.redis_errors++;
        redis_call_cb(cmd, NULL, cmd->fail_outcome, cmd->fail_reason, 0);
        redis_rcmd_free(cmd);
    }
}

int
redis_send_argv(struct rconn *c, struct rcmd *cmd, int argc, const char **argv,
                const size_t *argvlen)
{
    if (c->batch != NULL) {
        /* What was issued before goes before: the held batch first. */
        redis_batch_flush_conn(c);
    }
    if (ld_conn_send(c->conn, argc, argv, argvlen) != LD_OK) {
        return LD_ERR;
    }
    LD_ASSERT(!cmd->waiting);
    cmd->conn = c;
    cmd->sent_us = ld_now_us();
    TAILQ_INSERT_TAIL(&c->sent, cmd, link);
    ld_stats.redis_commands++;
    return LD_OK;
}

static void wait_cb(evutil_socket_t fd, short what, void *arg);
static void resend_as_eval(struct rconn *c, struct rcmd *cmd);
static void reload_scripts(struct rconn *c);

static void
drained_check(struct rconn *c)
{
    if (c->draining && !c->closing && TAILQ_EMPTY(&c->sent)) {
        /* All late answers are in: close it from the loop. */
        event_active(c->timeout_ev, EV_TIMEOUT, 0);
    }
}

/* The round trip of CMD, answered now, in the smoothed RTT and its
 * histogram. */
static void
note_rtt(const struct rcmd *cmd)
{
    double sample = (double)(ld_now_us() - cmd->sent_us);
    double rtt = redis_mod.rtt_us;
    redis_mod.rtt_us = rtt == 0 ? sample : rtt * 0.875 + sample * 0.125;
    ld_stats.redis_rtt_us = (long long)redis_mod.rtt_us;
    ld_stats_observe(LD_HISTO_REDIS_RTT, (uint64_t)sample);
}

/* Whether REPLY says CMD did not run and sends it again: a cluster
 * redirection, or NOSCRIPT. */
static bool
sent_again(struct rconn *c, struct rcmd *cmd, const redisReply *reply)
{
    if (redis_mod.cluster && reply->type == REDIS_REPLY_ERROR &&
        !cmd->answered && cmd->instance == 0 &&
        redis_cluster_redirect(cmd, reply)) {
        /* Sent again elsewhere, or later: nothing ran here. */
        drained_check(c);
        return true;
    }
    if (cmd->script >= 0 && ld_reply_is_error(reply, "NOSCRIPT") &&
        !cmd->answered && !cmd->noscript &&
        (c->state == CONN_READY || (c->draining && !c->closing))) {
        /* The script cache was flushed under us (SCRIPT FLUSH, or a
         * restart we did not notice): EVAL carries the body and reloads
         * it, so the caller never sees the difference. */
        ld_stats.redis_noscript++;
        cmd->noscript = true;
        resend_as_eval(c, cmd);
        reload_scripts(c);
        return true;
    }
    return false;
}

void
redis_reply_cb(struct ld_conn *conn, redisReply *reply, void *owner)
{
    struct rconn *c = owner;
    LD_UNUSED(conn);
    /* Replies arrive in send order, so this is the head of the queue. */
    struct rcmd *cmd = TAILQ_FIRST(&c->sent);
    LD_ASSERTF(cmd != NULL, "reply with nothing sent conn=%d", c->idx);
    if (cmd == NULL) {
        return;
    }
    TAILQ_REMOVE(&c->sent, cmd, link);
    note_rtt(cmd);

    if (cmd->internal) {
        redis_handshake_reply(c, reply, cmd);
        redis_rcmd_free(cmd);
        return;
    }
    if (sent_again(c, cmd, reply)) {
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR &&
        (ld_reply_is_error(reply, "READONLY") ||
         ld_reply_is_error(reply, "LOADING"))) {
        /* A master that became a replica, or one still loading after a
         * restart: ask where the master is now. */
        redis_doubt(c->node, reply->str);
    }
    if (!cmd->answered) {
        redis_call_cb(cmd, reply, LD_REDIS_ANSWERED, "", c->id);
    } else if (cmd->flags & LD_REDIS_F_LATE) {
        redis_call_cb(cmd, reply, LD_REDIS_LATE, "", c->id);
    }
    redis_rcmd_free(cmd);
    drained_check(c);
}

/* No answer will ever come on C's connection: what was sent on it hears
 * so now. */
void
redis_fail_sent(struct rconn *c, const char *why)
{
    while (!TAILQ_EMPTY(&c->sent)) {
        struct rcmd *cmd = TAILQ_FIRST(&c->sent);
        TAILQ_REMOVE(&c->sent, cmd, link);
        bool late = (cmd->flags & LD_REDIS_F_LATE) != 0;
        if (!cmd->internal && (!cmd->answered || late)) {
            ld_stats.redis_errors++;
            redis_call_cb(cmd, NULL, late ? LD_REDIS_LOST : LD_REDIS_UNKNOWN,
                          why, c->id);
        }
        redis_rcmd_free(cmd);
    }
}

/* After a NOSCRIPT, every script is loaded again at once (the answers
 * are ignored), rather than each by the EVAL of its first use: a script
 * and the batch script that carries its body, or two scripts, must not be
 * loaded and not loaded for long, or of two commands on one key sent
 * later the second could run while the first is being sent again. Once
 * per node and 100 ms, as every command in flight may get a NOSCRIPT. */
/* Send SCRIPT LOAD of script I (REDIS_BATCH_SCRIPT: the batch script)
 * on C, as an internal command whose reply is handled as SCRIPT's, ARG
 * saying what for. LD_ERR when it could not be sent. */
int
redis_script_load(struct rconn *c, int i, int script, const char *arg)
{
    const char *body = redis_script_body(c->node, i);
    const char *av[] = {"SCRIPT", "LOAD", body};
    size_t al[] = {6, 4, strlen(body)};
    struct rcmd *cmd = redis_cmd_new();
    cmd->internal = true;
    cmd->script = script;
    cmd->arg = (void *)arg;
    if (redis_send_argv(c, cmd, 3, av, al) != LD_OK) {
        free(cmd);
        return LD_ERR;
    }
    return LD_OK;
}

static void
reload_scripts(struct rconn *c)
{
    uint64_t now = ld_now_us();
    if (c->node->reload_us != 0 && now - c->node->reload_us < 100000) {
        return;
    }
    c->node->reload_us = now;
    for (int i = 0; i <= REDIS_BATCH_SCRIPT; i++) {
        if (redis_script_load(c, i, -1, "reload") != LD_OK) {
            return;
        }
    }
}

static void
resend_as_eval(struct rconn *c, struct rcmd *cmd)
{
    const char *stack_argv[STACK_ARGS + 3];
    size_t stack_len[STACK_ARGS + 3];
    const char **argv = stack_argv;
    size_t *argvlen = stack_len;
    int total = cmd->argc + 3;
    const char *body = redis_script_body(c->node, cmd->script);

    if (cmd->argc > STACK_ARGS) {
        argv = ld_xmalloc(sizeof(*argv) * (size_t)total);
        argvlen = ld_xmalloc(sizeof(*argvlen) * (size_t)total);
    }
    /* The kept arguments start with the key count, then keys and args. */
    argv[0] = "EVAL";
    argvlen[0] = 4;
    argv[1] = body != NULL ? body : "";
    argvlen[1] = strlen(argv[1]);
    argv[2] = cmd->argv[0];
    argvlen[2] = cmd->argvlen[0];
    for (int i = 1; i < cmd->argc; i++) {
        argv[i + 2] = cmd->argv[i];
        argvlen[i + 2] = cmd->argvlen[i];
    }
    if (redis_send_argv(c, cmd, cmd->argc + 2, argv, argvlen) != LD_OK) {
        fail_later(cmd, LD_REDIS_NOT_SENT, "could not resend after NOSCRIPT");
    }
    if (argv != stack_argv) {
        free(argv);
        free(argvlen);
    }
}

static void lock_pool_start(struct rnode *n);

/* The node a command goes to (NULL: none known yet). */
static struct rnode *
pick_node(const struct rcmd *cmd)
{
    if (cmd->x != NULL && cmd->x->target != NULL) {
        return cmd->x->target;
    }
    if (cmd->instance > 0) {
        return cmd->instance <= redis_mod.n_inst
                   ? redis_mod.inst[cmd->instance]
                   : NULL;
    }
    if (redis_mod.cluster) {
        /* No master known for the slot: wait for the map. */
        struct rnode *n = redis_cluster_node(cmd->x != NULL ? cmd->x->slot
                                                            : 0);
        if (n == NULL) {
            redis_cluster_refresh_soon("a slot without a master");
        }
        return n != NULL ? n : redis_mod.unmapped;
    }
    return main_node();
}

/* The connection PIN names (a command that must follow an earlier one
 * on it), if it is still up: connection ids are unique over every node,
 * and a connection set aside still carries what is pinned to it. */
static struct rconn *
pinned_conn(uint64_t pin)
{
    for (int k = 0; k < redis_mod.n_nodes; k++) {
        struct rnode *n = redis_mod.nodes[k];
        for (int i = 0; i < n->n_conns + n->n_lock; i++) {
            struct rconn *c = &n->conns[i];
            if (c->id == pin && c->state == CONN_READY) {
                return c;
            }
        }
    }
    struct rconn *d;
    LIST_FOREACH(d, &redis_mod.draining, dlink)
    {
        if (d->id == pin && d->conn != NULL && !d->closing) {
            return d;
        }
    }
    return NULL;
}

unsigned
ld_redis_route_lane(const char *route, size_t len)
{
    return (unsigned)(ld_hash(route, len) % (uint64_t)redis_mod.n_conns);
}

/* The ready connection of NODE's pool (O's) that HASH picks, or the next
 * ready one after it; NULL when none is, *PENDING telling whether one is
 * on its way. */
static struct rconn *
pool_conn(struct rnode *node, const struct ld_redis_opts *o, uint64_t hash,
          bool *pending)
{
    int base = 0, n = node->n_conns;
    if (o != NULL && o->pool == LD_REDIS_POOL_LOCK) {
        if (node->n_lock == 0) {
            lock_pool_start(node);
        }
        /* Until the pool has come up once (it opens on first use), the
         * shared connections serve. */
        if (node->lock_ever_ready) {
            base = node->n_conns;
            n = node->n_lock;
        }
    }
    int start = (int)(hash % (uint64_t)n);
    *pending = false;
    for (int i = 0; i < n; i++) {
        struct rconn *c = &node->conns[base + (start + i) % n];
        if (c->state == CONN_READY) {
            return c;
        }
        if (c->state == CONN_HANDSHAKE ||
            ld_conn_state(c->conn) != LD_CONN_DOWN) {
            *pending = true;
        }
    }
    return NULL;
}

/* Where a command goes; NULL with *WHY set when nowhere. *MAY_WAIT
 * tells whether it may wait for a connection being established. */
static struct rconn *
pick_conn(struct rnode *node, const struct ld_redis_opts *o, uint64_t hash,
          char *why, size_t whylen, bool *may_wait)
{
    *may_wait = false;
    if (o != NULL && o->pin != 0) {
        struct rconn *c = pinned_conn(o->pin);
        if (c == NULL) {
            snprintf(why, whylen,
                     "the connection of the earlier command is "
                     "gone");
        }
        return c;
    }
    if (node == NULL) {
        snprintf(why, whylen, "no redis instance %d",
                 o != NULL ? o->instance : 0);
        return NULL;
    }
    if (node->n_conns == 0) {
        /* The queue of cluster commands awaiting a slot map. */
        *may_wait = true;
        snprintf(why, whylen, "no master known for the slot");
        return NULL;
    }
    bool pending;
    struct rconn *c = pool_conn(node, o, hash, &pending);
    if (c != NULL) {
        return c;
    }
    /* A connection on its way may be ready in a moment; a Redis whose
     * last attempt failed is down, and saying so at once beats making
     * every caller wait out the timeout. */
    *may_wait = pending && !node->known_down;
    snprintf(why, whylen,
             "no connection to redis %.100s is ready (last error: %s)",
             node->address,
             node->last_error[0] != '\0' ? node->last_error : "none yet");
    return NULL;
}

/* Copy the arguments of a command that must wait for a connection. */
static int
copy_args(struct rcmd *cmd, int argc, const char **argv, const size_t *argvlen)
{
    size_t bytes = 0;
    for (int i = 0; i < argc; i++) {
        bytes += argvlen[i] + 1;
    }
    size_t head = (sizeof(char *) + sizeof(size_t)) * (size_t)argc;
    /* The size is the client's: no memory is an error, not an abort. */
    char *block = malloc(head + bytes);
    if (block == NULL) {
        return LD_ERR;
    }
    cmd->argv = (char **)block;
    cmd->argvlen = (size_t *)(block + sizeof(char *) * (size_t)argc);
    char *p = block + head;
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], argvlen[i]);
        p[argvlen[i]] = '\0';
        cmd->argv[i] = p;
        cmd->argvlen[i] = argvlen[i];
        p += argvlen[i] + 1;
    }
    cmd->argc = argc;
    return LD_OK;
}

/* Send a script's EVALSHA from its kept arguments. */
int
redis_send_script(struct rconn *c, struct rcmd *cmd)
{
    const char *stack_argv[STACK_ARGS + 3];
    size_t stack_len[STACK_ARGS + 3];
    const char **av = stack_argv;
    size_t *al = stack_len;
    int argc = cmd->argc - 1; /* the kept ones start with the key count */
    if (argc > STACK_ARGS) {
        av = ld_xmalloc(sizeof(*av) * (size_t)(argc + 3));
        al = ld_xmalloc(sizeof(*al) * (size_t)(argc + 3));
    }
    av[0] = "EVALSHA";
    al[0] = 7;
    av[1] = c->node->shas[cmd->script];
    al[1] = 40;
    for (int i = 0; i <= argc; i++) {
        av[i + 2] = cmd->argv[i];
        al[i + 2] = cmd->argvlen[i];
    }
    int rc = redis_send_argv(c, cmd, argc + 3, av, al);
    if (av != stack_argv) {
        free(av);
        free(al);
    }
    return rc;
}

static void
wait_arm(struct rnode *n, uint64_t until)
{
    /* Commands with a timeout of their own may end before those queued
     * ahead of them: the timer follows the earliest end. */
    if (n->wait_at_us != 0 && n->wait_at_us <= until) {
        return;
    }
    n->wait_at_us = until;
    ld_timer_at_us(n->wait_ev, until);
}

static unsigned
cmd_timeout_ms(const struct rcmd *cmd)
{
    unsigned t = (unsigned)redis_mod.ctx->cfg->redis.timeout_ms;
    return cmd->timeout_ms != 0 && cmd->timeout_ms < t ? cmd->timeout_ms : t;
}

uint64_t
redis_cmd_timeout_us(const struct rcmd *cmd)
{
    return (uint64_t)cmd_timeout_ms(cmd) * 1000;
}

/* ASK: the target serves the slot being imported only to a command that
 * follows ASKING on the same connection. */
static void
send_asking(struct rconn *c)
{
    static const char *av[] = {"ASKING"};
    static const size_t al[] = {6};
    struct rcmd *a = redis_cmd_new();
    a->internal = true;
    a->script = -1;
    if (redis_send_argv(c, a, 1, av, al) != LD_OK) {
        free(a);
    }
}

/* A command with a timeout of its own, shorter than redis.timeout_ms,
 * got no answer in time: the caller hears UNKNOWN now (LATE or LOST
 * follows with LD_REDIS_F_LATE); the connection stays, it is not the
 * connection's fault. */
static void
cmd_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rcmd *cmd = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    if (cmd->answered || cmd->waiting || cmd->conn == NULL ||
        cmd->fail_reason != NULL) {
        return;
    }
    char why[96];
    snprintf(why, sizeof(why), "timed out after %u ms", cmd->timeout_ms);
    cmd->answered = true;
    ld_stats.redis_errors++;
    redis_call_cb(cmd, NULL, LD_REDIS_UNKNOWN, why, cmd->conn->id);
}

void
redis_timeout_arm(struct rcmd *cmd)
{
    if (cmd->timeout_ms == 0 ||
        cmd->timeout_ms >= (unsigned)redis_mod.ctx->cfg->redis.timeout_ms) {
        return;
    }
    struct rcmd_x *x = redis_cmd_x(cmd);
    if (x->timeout_ev == NULL) {
        x->timeout_ev = evtimer_new(redis_mod.ctx->base, cmd_timeout_cb, cmd);
        if (x->timeout_ev == NULL) {
            ld_oom_in("evtimer_new");
        }
    }
    /* From the issue, like the wait for a connection. */
    ld_timer_at_us(x->timeout_ev, cmd->wait_until_us);
}

/* CMD goes out on C now (or in C's batch of this turn). */
static void
send_on(struct rconn *c, struct rcmd *cmd, const struct ld_redis_opts *opts,
        int argc, const char **argv, const size_t *argvlen)
{
    int rc;
    if (cmd->x != NULL && cmd->x->asking) {
        send_asking(c);
    }
    if (cmd->script >= 0) {
        rc = redis_batch_add(c, cmd, opts != NULL ? opts->pin : 0)
                 ? LD_OK
                 : redis_send_script(c, cmd);
    } else if (argv != NULL) {
        rc = redis_send_argv(c, cmd, argc, argv, argvlen);
    } else {
        rc = redis_send_argv(c, cmd, cmd->argc, (const char **)cmd->argv,
                             cmd->argvlen);
    }
    if (rc != LD_OK) {
        fail_later(cmd, LD_REDIS_NOT_SENT, "could not queue the command");
    } else {
        redis_timeout_arm(cmd);
    }
}

/* CMD waits on NODE's queue for a connection on its way. */
static void
wait_on(struct rnode *node, struct rcmd *cmd, const struct ld_redis_opts *opts)
{
    if (cmd->wait_until_us == 0) {
        /* The clock runs from the issue, not from the latest retry. */
        uint64_t from = cmd->x != NULL && cmd->x->issued_us != 0
                            ? cmd->x->issued_us
                            : ld_now_us();
        cmd->wait_until_us = from + (uint64_t)cmd_timeout_ms(cmd) * 1000;
    }
    cmd->pool = opts != NULL ? opts->pool : LD_REDIS_POOL_SHARED;
    LD_ASSERT(!cmd->waiting);
    cmd->waiting = true;
    TAILQ_INSERT_TAIL(&node->waiting, cmd, link);
    node->n_waiting++;
    wait_arm(node, cmd->wait_until_us);
}

/* Send CMD, let it wait for a connection being established, or answer it
 * NOT_SENT. Its arguments are the kept ones unless ARGV is given. */
static void
route_cmd(struct rcmd *cmd, const struct ld_redis_opts *opts, int argc,
          const char **argv, const size_t *argvlen)
{
    char why[400];
    bool may_wait;
    struct rnode *node = pick_node(cmd);
    struct rconn *c = pick_conn(node, opts, cmd->route_hash, why, sizeof(why),
                                &may_wait);
    if (cmd->timeout_ms != 0 && cmd->wait_until_us == 0) {
        cmd->wait_until_us = ld_now_us() +
                             (uint64_t)cmd_timeout_ms(cmd) * 1000;
    }
    if (c != NULL) {
        send_on(c, cmd, opts, argc, argv, argvlen);
        return;
    }
    if (!may_wait || node->n_waiting >= MAX_WAITING) {
        fail_later(cmd, LD_REDIS_NOT_SENT, why);
        return;
    }
    if (cmd->script < 0 && argv != NULL &&
        copy_args(cmd, argc, argv, argvlen) != LD_OK) {
        fail_later(cmd, LD_REDIS_NOT_SENT, "out of memory");
        return;
    }
    wait_on(node, cmd, opts);
}

/* Send CMD again from its kept arguments (a redirection, a retry). */
void
redis_route(struct rcmd *cmd)
{
    struct ld_redis_opts o = {.flags = cmd->flags,
                              .pool = cmd->pool,
                              .instance = cmd->instance,
                              .timeout_ms = cmd->timeout_ms};
    route_cmd(cmd, &o, 0, NULL, NULL);
}

/* A command of the daemon's own to node N (CLUSTER SLOTS). */
void
redis_send_to(struct rnode *n, int argc, const char **argv,
              const size_t *argvlen, void (*cb)(redisReply *reply, void *arg),
              void *arg)
{
    struct rcmd *cmd = redis_cmd_new();
    cmd->cb = cb;
    cmd->arg = arg;
    cmd->script = -1;
    cmd->instance = n->instance;
    redis_cmd_x(cmd)->target = n;
    cmd->x->issued_us = ld_now_us();
    route_cmd(cmd, NULL, argc, argv, argvlen);
}

/* A connection of N became ready, or an attempt failed: what waits is
 * sent, waits on, or is answered. */
void
redis_waiting_retry(struct rnode *n)
{
    if (TAILQ_EMPTY(&n->waiting)) {
        return;
    }
    struct rcmd_queue list = TAILQ_HEAD_INITIALIZER(list);
    TAILQ_CONCAT(&list, &n->waiting, link);
    n->n_waiting = 0;
    while (!TAILQ_EMPTY(&list)) {
        struct rcmd *cmd = TAILQ_FIRST(&list);
        TAILQ_REMOVE(&list, cmd, link);
        LD_ASSERT(cmd->waiting);
        cmd->waiting = false;
        redis_route(cmd);
    }
}

static void
wait_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rnode *n = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    uint64_t now = ld_now_us();
    uint64_t next = 0;
    struct rcmd *cmd, *tmp;
    n->wait_at_us = 0;
    /* Mostly in issue order, but a command with a timeout of its own may
     * end before those ahead of it: look at all (there are few). */
    for (cmd = TAILQ_FIRST(&n->waiting); cmd != NULL; cmd = tmp) {
        tmp = TAILQ_NEXT(cmd, link);
        if (cmd->wait_until_us > now) {
            if (next == 0 || cmd->wait_until_us < next) {
                next = cmd->wait_until_us;
            }
            continue;
        }
        LD_ASSERT(cmd->waiting && n->n_waiting > 0);
        TAILQ_REMOVE(&n->waiting, cmd, link);
        n->n_waiting--;
        cmd->waiting = false;
        char why[400];
        if (n->instance < 0) {
            snprintf(why, sizeof(why),
                     "no master known for slot %u within %u ms (last "
                     "error: %s)",
                     cmd->x != NULL ? cmd->x->slot : 0, cmd_timeout_ms(cmd),
                     n->last_error);
        } else {
            snprintf(why, sizeof(why),
                     "no connection to redis %.60s was ready "
                     "within %u ms (last error: %s)",
                     n->address, cmd_timeout_ms(cmd),
                     n->last_error[0] != '\0' ? n->last_error : "none yet");
        }
        fail_later(cmd, LD_REDIS_NOT_SENT, why);
    }
    if (next != 0) {
        wait_arm(n, next);
    }
}

static void
cmd_cluster_prepare(struct rcmd *cmd, const char *route, size_t route_len)
{
    struct rcmd_x *x = redis_cmd_x(cmd);
    x->slot = ld_cluster_slot(route, route_len);
    x->issued_us = ld_now_us();
}

/* A caller's command (SCRIPT: its script, or -1), answered to CB with
 * ARG, routed by ROUTE, as OPTS (NULL: the defaults) ask. */
static struct rcmd *
cmd_for(const struct ld_redis_opts *opts, int script, const char *route,
        size_t route_len, ld_redis_cb *cb, void *arg)
{
    struct rcmd *cmd = redis_cmd_new();
    cmd->cb = cb;
    cmd->arg = arg;
    cmd->script = script;
    cmd->flags = opts != NULL ? opts->flags : 0;
    if (opts != NULL) {
        cmd->instance = opts->instance;
        cmd->timeout_ms = opts->timeout_ms;
        cmd->pool = opts->pool;
    }
    cmd->route_hash = ld_hash(route, route_len);
    return cmd;
}

void
ld_redis_command(const char *route, size_t route_len, int argc,
                 const char **argv, const size_t *argvlen, ld_redis_cb *cb,
                 void *arg)
{
    ld_redis_command_ex(NULL, route, route_len, argc, argv, argvlen, cb, arg);
}

void
ld_redis_command_ex(const struct ld_redis_opts *opts, const char *route,
                    size_t route_len, int argc, const char **argv,
                    const size_t *argvlen, ld_redis_cb *cb, void *arg)
{
    struct rcmd *cmd = cmd_for(opts, -1, route, route_len, cb, arg);
    if (redis_mod.cluster && cmd->instance == 0) {
        /* Kept: a redirection sends it again. */
        cmd_cluster_prepare(cmd, route, route_len);
        if (copy_args(cmd, argc, argv, argvlen) != LD_OK) {
            fail_later(cmd, LD_REDIS_NOT_SENT, "out of memory");
            return;
        }
        argv = NULL;
    }
    route_cmd(cmd, opts, argc, argv, argvlen);
}

/* Keep the key count and the script's keys and args in one allocation,
 * for the rare NOSCRIPT resend. */
static int
redis_keep_args(struct rcmd *cmd, int nkeys, int argc, const char **argv,
                const size_t *argvlen)
{
    char nk[24];
    int n = argc + 1;
    size_t bytes = 0;
    ld_ll_to_str(nk, nkeys);
    for (int i = 0; i < argc; i++) {
        bytes += argvlen[i] + 1;
    }
    bytes += strlen(nk) + 1;
    size_t head = sizeof(char *) * (size_t)n + sizeof(size_t) * (size_t)n;
    char *block = head + bytes <= sizeof(cmd->keep.bytes)
                      ? cmd->keep.bytes
                      : malloc(head + bytes);
    if (block == NULL) {
        return LD_ERR;
    }
    cmd->argv = (char **)block;
    cmd->argvlen = (size_t *)(block + sizeof(char *) * (size_t)n);
    char *p = block + head;
    memcpy(p, nk, strlen(nk) + 1);
    cmd->argv[0] = p;
    cmd->argvlen[0] = strlen(nk);
    p += strlen(nk) + 1;
    for (int i = 0; i < argc; i++) {
        memcpy(p, argv[i], argvlen[i]);
        p[argvlen[i]] = '\0';
        cmd->argv[i + 1] = p;
        cmd->argvlen[i + 1] = argvlen[i];
        p += argvlen[i] + 1;
    }
    cmd->argc = n;
    return LD_OK;
}

void
ld_redis_script(enum ld_script_id script, const char *route, size_t route_len,
                int nkeys, int argc, const char **argv, const size_t *argvlen,
                ld_redis_cb *cb, void *arg)
{
    ld_redis_script_ex(NULL, script, route, route_len, nkeys, argc, argv,
                       argvlen, cb, arg);
}

void
ld_redis_script_ex(const struct ld_redis_opts *opts, enum ld_script_id script,
                   const char *route, size_t route_len, int nkeys, int argc,
                   const char **argv, const size_t *argvlen, ld_redis_cb *cb,
                   void *arg)
{
    struct rcmd *cmd = cmd_for(opts, (int)script, route, route_len, cb, arg);
    if (redis_mod.cluster && cmd->instance == 0) {
        cmd_cluster_prepare(cmd, route, route_len);
    }
    if (redis_keep_args(cmd, nkeys, argc, argv, argvlen) != LD_OK) {
        fail_later(cmd, LD_REDIS_NOT_SENT, "out of memory");
        return;
    }
    route_cmd(cmd, opts, 0, NULL, NULL);
}

int
ld_redis_parse_address(const char *addr, char *host, size_t hostlen, int *port,
                       bool *is_unix)
{
    struct ld_conn_addr a;
    if (ld_conn_parse_address(addr, &a) != LD_OK) {
        return LD_ERR;
    }
    snprintf(host, hostlen, "%s", a.host);
    *port = a.port;
    *is_unix = a.is_unix;
    return LD_OK;
}

void
ld_redis_on_doubt(ld_redis_doubt_fn *fn, void *arg)
{
    redis_mod.doubt_fn = fn;
    redis_mod.doubt_arg = arg;
}

void
redis_doubt(const struct rnode *n, const char *why)
{
    if (redis_mod.cluster && n->instance == 0 && n->is_master) {
        redis_cluster_refresh_soon(why);
        return;
    }
    /* The Sentinel follower watches the backend of redis.* only. */
    if (redis_mod.doubt_fn != NULL && !redis_mod.freeing && n->instance == 0) {
        redis_mod.doubt_fn(why, redis_mod.doubt_arg);
    }
}

/* A node at ADDR (NULL: not known yet) with redis.connections shared
 * connections, and room for as many in its lock pool. INSTANCE -1: only
 * a queue, with no connection and not among the nodes. */
struct rnode *
redis_node_new(int instance, const struct ld_conn_addr *addr, const char *text)
{
    struct rnode *n = ld_xcalloc(1, sizeof(*n));
    n->instance = instance;
    if (addr != NULL) {
        n->addr = *addr;
        n->have_addr = true;
        snprintf(n->address, sizeof(n->address), "%s", text);
    } else {
        snprintf(n->last_error, sizeof(n->last_error), "no master known yet");
    }
    TAILQ_INIT(&n->waiting);
    n->wait_ev = evtimer_new(redis_mod.ctx->base, wait_cb, n);
    if (n->wait_ev == NULL) {
        ld_oom_in("evtimer_new");
    }
    if (instance < 0) {
        return n;
    }
    n->n_conns = redis_mod.n_conns;
    n->conns = ld_xcalloc(2 * (size_t)n->n_conns, sizeof(*n->conns));
    for (int i = 0; i < n->n_conns; i++) {
        redis_slot_init(n, &n->conns[i], i, LD_REDIS_POOL_SHARED);
    }
    redis_mod.nodes = ld_xrealloc(redis_mod.nodes,
                                  sizeof(*redis_mod.nodes) *
                                      (size_t)(redis_mod.n_nodes + 1));
    redis_mod.nodes[redis_mod.n_nodes++] = n;
    return n;
}

static void
node_free(struct rnode *n)
{
    for (int i = 0; i < n->n_conns + n->n_lock; i++) {
        struct rconn *c = &n->conns[i];
        redis_batch_drop(c, "the daemon is stopping");
        redis_set_ready(c, false);
        c->state = CONN_DOWN;
        ld_conn_free(c->conn);
        c->conn = NULL;
        redis_fail_sent(c, "connection closed");
    }
    while (!TAILQ_EMPTY(&n->waiting)) {
        struct rcmd *cmd = TAILQ_FIRST(&n->waiting);
        TAILQ_REMOVE(&n->waiting, cmd, link);
        cmd->waiting = false;
        fail_later(cmd, LD_REDIS_NOT_SENT, "the daemon is stopping");
    }
    n->n_waiting = 0;
    event_free(n->wait_ev);
    free(n->conns);
    free(n);
}

void
ld_redis_set_conn_hooks(const struct ld_redis_conn_hooks *hooks)
{
    redis_mod.hooks = hooks;
}

void
redis_hook_lost(uint64_t conn_id)
{
    const struct ld_redis_conn_hooks *h = redis_mod.hooks;
    if (h != NULL && h->lost != NULL && conn_id != 0) {
        h->lost(conn_id, h->arg);
    }
}

int
ld_redis_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    memset(&redis_mod, 0, sizeof(redis_mod));
    redis_mod.ctx = ctx;
    TAILQ_INIT(&redis_mod.failed);
    LIST_INIT(&redis_mod.draining);
    redis_mod.n_conns = cfg->redis.connections;
    if (redis_mod.n_conns < 1) {
        redis_mod.n_conns = 1;
    }
    if (redis_mod.n_conns > MAX_CONNS) {
        redis_mod.n_conns = MAX_CONNS;
    }
    ld_defer_init(&redis_mod.fail_defer, ctx->base, fail_cb, NULL);
    if (redis_batch_init() != LD_OK) {
        return LD_ERR;
    }
    if (cfg->redis.mode == LD_REDIS_CLUSTER) {
        size_t used = (size_t)snprintf(
            redis_mod.label, sizeof(redis_mod.label), "cluster%s%s",
            cfg->redis.addresses.count == 0 ? ":" : "",
            cfg->redis.addresses.count == 0 ? cfg->redis.address : "");
        for (size_t i = 0;
             i < cfg->redis.addresses.count && used < sizeof(redis_mod.label);
             i++) {
            used += (size_t)snprintf(redis_mod.label + used,
                                     sizeof(redis_mod.label) - used, "%s%s",
                                     i == 0 ? ":" : ",",
                                     cfg->redis.addresses.items[i]);
        }
        return redis_cluster_init();
    }
    if (cfg->redis.mode == LD_REDIS_SENTINEL) {
        /* The Sentinels name the master (ld_redis_set_address). */
        redis_node_new(0, NULL, NULL);
    } else {
        struct ld_conn_addr addr;
        if (ld_conn_parse_address(cfg->redis.address, &addr) != LD_OK) {
            log_error("bad redis.address value=%s", cfg->redis.address);
            return LD_ERR;
        }
        redis_node_new(0, &addr, cfg->redis.address);
    }
    return LD_OK;
}

int
ld_redis_add_instance(const char *address)
{
    struct ld_conn_addr addr;
    if (redis_mod.ctx == NULL || redis_mod.started) {
        log_error("redis instance added outside start-up address=%s", address);
        return LD_ERR;
    }
    if (redis_mod.n_inst >= MAX_INSTANCES) {
        log_error("too many redis instances (at most %d) address=%s",
                  MAX_INSTANCES, address);
        return LD_ERR;
    }
    if (ld_conn_parse_address(address, &addr) != LD_OK) {
        log_error("bad redis instance address value=%s", address);
        return LD_ERR;
    }
    int k = ++redis_mod.n_inst;
    redis_mod.inst[k] = redis_node_new(k, &addr, address);
    return k;
}

/* The lock pool opens with the backend when lock.wait_replicas is set,
 * else on its first use (the setting can be reloaded). */
static void
lock_pool_start(struct rnode *n)
{
    if (n->n_lock > 0 || !n->started) {
        return;
    }
    for (int i = n->n_conns; i < 2 * n->n_conns; i++) {
        redis_slot_init(n, &n->conns[i], i, LD_REDIS_POOL_LOCK);
    }
    n->n_lock = n->n_conns;
    for (int i = n->n_conns; i < n->n_conns + n->n_lock; i++) {
        redis_slot_start(&n->conns[i]);
    }
}

void
redis_node_start(struct rnode *n)
{
    if (n->started || !n->have_addr || !redis_mod.started) {
        return;
    }
    n->started = true;
    for (int i = 0; i < n->n_conns; i++) {
        redis_slot_start(&n->conns[i]);
    }
    if (redis_mod.ctx->cfg->lock.wait_replicas > 0) {
        lock_pool_start(n);
    }
}

void
ld_redis_start(void)
{
    redis_mod.started = true;
    for (int i = 0; i < redis_mod.n_nodes; i++) {
        redis_node_start(redis_mod.nodes[i]);
    }
}

void
ld_redis_set_address(const struct ld_conn_addr *addr, const char *text)
{
    struct rnode *n = main_node();
    n->addr = *addr;
    n->have_addr = true;
    snprintf(n->address, sizeof(n->address), "%s", text);
    /* Slots that are set aside stay on the old server for its late
     * answers; every slot in use moves now (one not started yet only
     * learns where to go). */
    n->known_down = false;
    for (int i = 0; i < n->n_conns + n->n_lock; i++) {
        struct rconn *c = &n->conns[i];
        snprintf(c->why, sizeof(c->why), "the master moved to %s", text);
        ld_conn_set_addr(c->conn, addr);
        c->why[0] = '\0';
    }
    redis_node_start(n);
}

void
ld_redis_free(void)
{
    /* Going down at exit is not news. */
    redis_mod.freeing = true;
    while (!LIST_EMPTY(&redis_mod.draining)) {
        redis_drain_close(LIST_FIRST(&redis_mod.draining));
    }
    /* Each node leaves the array before it is freed: freeing one marks
     * its connections down, which looks at the nodes still listed (on a
     * cluster, whether any master is up). */
    while (redis_mod.n_nodes > 0) {
        node_free(redis_mod.nodes[--redis_mod.n_nodes]);
    }
    if (redis_mod.cluster) {
        redis_cluster_free();
        node_free(redis_mod.unmapped);
        redis_mod.unmapped = NULL;
        redis_mod.cluster = false;
    }
    free(redis_mod.nodes);
    redis_mod.nodes = NULL;
    redis_mod.n_nodes = 0;
    redis_mod.n_inst = 0;
    /* Late failures still owe their callers an answer. */
    if (redis_mod.fail_defer.ev != NULL) {
        fail_cb(NULL);
        ld_defer_free(&redis_mod.fail_defer);
    }
    redis_batch_free();
    while (cmd_mod.n_spare > 0) {
        free(cmd_mod.spare[--cmd_mod.n_spare]);
    }
    redis_mod.started = false;
}

void
ld_redis_on_map(ld_redis_map_fn *fn, void *arg)
{
    redis_mod.map_fn = fn;
    redis_mod.map_arg = arg;
}

void
ld_redis_on_failover(ld_redis_failover_fn *fn, void *arg)
{
    redis_mod.failover_fn = fn;
    redis_mod.failover_arg = arg;
}

/* The slot map was refreshed (CHANGED: it differs, or a MOVED moved a
 * slot). After a failover the locks are checked again as when the
 * backend comes back (ld_redis_on_state): the masters that took over may
 * lack what the lost one had granted. */
void
redis_map_changed(bool changed, bool failover)
{
    const struct ld_redis_conn_hooks *h = redis_mod.hooks;
    if (h != NULL && h->map != NULL) {
        h->map(changed, failover, h->arg);
    }
    if (failover) {
        ld_stats.redis_failovers++;
        if (redis_mod.failover_fn != NULL) {
            redis_mod.failover_fn(redis_mod.failover_arg);
        }
    }
    if (redis_mod.map_fn != NULL) {
        redis_mod.map_fn(changed, redis_mod.map_arg);
    }
    if (failover) {
        notify_state(0, true);
    }
}

int
ld_redis_route_address(const char *route, size_t route_len,
                       struct ld_conn_addr *addr, char *text, size_t len)
{
    const struct rnode *n;
    if (redis_mod.cluster) {
        n = redis_cluster_node(ld_cluster_slot(route, route_len));
    } else {
        n = main_node();
    }
    if (n == NULL || !n->have_addr) {
        return LD_ERR;
    }
    *addr = n->addr;
    snprintf(text, len, "%s", n->address);
    return LD_OK;
}

void
ld_redis_cluster_refresh(void)
{
    redis_cluster_refresh_soon("asked");
}
