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
 */
#include "ld_redis.h"
#include "ld_redis_int.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_defer.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

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

/* What the callback now running is told (ld_redis_outcome & co). */
struct cb_context {
    enum ld_redis_outcome outcome;
    const char *reason;
    uint64_t conn_id;
};
static struct cb_context CUR = {LD_REDIS_ANSWERED, "", 0};

enum ld_redis_outcome
ld_redis_outcome(void)
{
    return CUR.outcome;
}

const char *
ld_redis_failure_reason(void)
{
    return CUR.reason;
}

uint64_t
ld_redis_conn_id(void)
{
    return CUR.conn_id;
}

void
redis_call_cb(struct rcmd *cmd, redisReply *reply, int outcome,
              const char *reason, uint64_t conn_id)
{
    char buf[320];
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR) {
        snprintf(buf, sizeof(buf), "%s%.*s",
                 cmd->noscript ? "after NOSCRIPT and reload: " : "",
                 (int)reply->len, reply->str);
        reason = buf;
    }
    struct cb_context saved = CUR;
    CUR.outcome = outcome;
    CUR.reason = reason != NULL ? reason : "";
    CUR.conn_id = conn_id;
    cmd->cb(reply, cmd->arg);
    CUR = saved;
}

bool
ld_reply_is_error(const redisReply *r, const char *prefix)
{
    if (r == NULL || r->type != REDIS_REPLY_ERROR) {
        return false;
    }
    return prefix == NULL || strncmp(r->str, prefix, strlen(prefix)) == 0;
}

const char *
ld_redis_address(void)
{
    return redis_mod.address;
}

bool
ld_redis_ready(void)
{
    return redis_mod.n_ready > 0;
}

long long
ld_redis_outstanding(void)
{
    long long n = redis_mod.n_waiting;
    for (int i = 0; i < redis_mod.n_conns + redis_mod.n_lock; i++) {
        struct rcmd *c;
        TAILQ_FOREACH(c, &redis_mod.conns[i].sent, link)
        {
            n++;
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

static void
notify_state(bool up)
{
    for (int i = 0; i < redis_mod.n_watchers; i++) {
        redis_mod.watchers[i].fn(up, redis_mod.watchers[i].arg);
    }
}

/* Call before changing c->state: it compares with the old state. */
void
redis_set_ready(struct rconn *c, bool ready)
{
    bool was = c->state == CONN_READY;
    if (was == ready) {
        return;
    }
    if (c->pool != LD_REDIS_POOL_SHARED) {
        /* The backend's state is the shared pool's. */
        if (ready) {
            redis_mod.lock_ever_ready = true;
        }
        return;
    }
    redis_mod.n_ready += ready ? 1 : -1;
    ld_stats.redis_connected = redis_mod.n_ready;
    if (ready && redis_mod.n_ready == 1) {
        log_info("redis up address=%s", redis_mod.address);
        notify_state(true);
    } else if (!ready && redis_mod.n_ready == 0 && !redis_mod.freeing) {
        log_warn("redis down address=%s", redis_mod.address);
        notify_state(false);
    }
}

void
redis_rcmd_free(struct rcmd *cmd)
{
    free(cmd->argv); /* one block: argv, argvlen and the bytes */
    free(cmd->fail_reason);
    free(cmd);
}

/* Answer a command that never reached Redis, from the loop rather than
 * from inside the caller. */
static void
fail_later(struct rcmd *cmd, enum ld_redis_outcome outcome, const char *reason)
{
    cmd->fail_outcome = outcome;
    free(cmd->fail_reason);
    cmd->fail_reason = ld_xstrdup(reason);
    TAILQ_INSERT_TAIL(&redis_mod.failed, cmd, link);
    ld_defer_kick(&redis_mod.fail_defer);
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
    if (ld_conn_send(c->conn, argc, argv, argvlen) != LD_OK) {
        return LD_ERR;
    }
    cmd->conn = c;
    cmd->sent_us = ld_now_us();
    TAILQ_INSERT_TAIL(&c->sent, cmd, link);
    ld_stats.redis_commands++;
    return LD_OK;
}

static void wait_cb(evutil_socket_t fd, short what, void *arg);
static void resend_as_eval(struct rconn *c, struct rcmd *cmd);

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
    double sample = (double)(ld_now_us() - cmd->sent_us);
    double rtt = redis_mod.rtt_us;
    redis_mod.rtt_us = rtt == 0 ? sample : rtt * 0.875 + sample * 0.125;
    ld_stats.redis_rtt_us = (long long)redis_mod.rtt_us;
    ld_stats_observe(LD_HISTO_REDIS_RTT, (uint64_t)sample);

    if (cmd->internal) {
        redis_handshake_reply(c, reply, cmd);
        redis_rcmd_free(cmd);
        return;
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
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR &&
        (ld_reply_is_error(reply, "READONLY") ||
         ld_reply_is_error(reply, "LOADING"))) {
        /* A master that became a replica, or one still loading after a
         * restart: ask where the master is now. */
        redis_doubt(reply->str);
    }
    if (!cmd->answered) {
        redis_call_cb(cmd, reply, LD_REDIS_ANSWERED, "", c->id);
    } else if (cmd->flags & LD_REDIS_F_LATE) {
        redis_call_cb(cmd, reply, LD_REDIS_LATE, "", c->id);
    }
    redis_rcmd_free(cmd);
    if (c->draining && !c->closing && TAILQ_EMPTY(&c->sent)) {
        /* All late answers are in: close it from the loop. */
        event_active(c->timeout_ev, EV_TIMEOUT, 0);
    }
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

static void
resend_as_eval(struct rconn *c, struct rcmd *cmd)
{
    const char *stack_argv[STACK_ARGS + 3];
    size_t stack_len[STACK_ARGS + 3];
    const char **argv = stack_argv;
    size_t *argvlen = stack_len;
    int total = cmd->argc + 3;
    const char *body = redis_script_bodies[cmd->script];

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

static void lock_pool_start(void);

/* Where a command goes; NULL with *WHY set when nowhere. *MAY_WAIT
 * tells whether it may wait for a connection being established. */
static struct rconn *
pick_conn(const struct ld_redis_opts *o, uint64_t hash, char *why,
          size_t whylen, bool *may_wait)
{
    *may_wait = false;
    if (o != NULL && o->pin != 0) {
        for (int i = 0; i < redis_mod.n_conns + redis_mod.n_lock; i++) {
            const struct rconn *c = &redis_mod.conns[i];
            if (c->id == o->pin && c->state == CONN_READY) {
                return &redis_mod.conns[i];
            }
        }
        struct rconn *d;
        LIST_FOREACH(d, &redis_mod.draining, dlink)
        {
            if (d->id == o->pin && d->conn != NULL && !d->closing) {
                return d;
            }
        }
        snprintf(why, whylen,
                 "the connection of the earlier command is "
                 "gone");
        return NULL;
    }
    int base = 0, n = redis_mod.n_conns;
    if (o != NULL && o->pool == LD_REDIS_POOL_LOCK) {
        if (redis_mod.n_lock == 0) {
            lock_pool_start();
        }
        /* Until the pool has come up once (it opens on first use), the
         * shared connections serve. */
        if (redis_mod.lock_ever_ready) {
            base = redis_mod.n_conns;
            n = redis_mod.n_lock;
        }
    }
    int start = (int)(hash % (uint64_t)n);
    bool pending = false;
    for (int i = 0; i < n; i++) {
        struct rconn *c = &redis_mod.conns[base + (start + i) % n];
        if (c->state == CONN_READY) {
            return c;
        }
        if (c->state == CONN_HANDSHAKE ||
            ld_conn_state(c->conn) != LD_CONN_DOWN) {
            pending = true;
        }
    }
    /* A connection on its way may be ready in a moment; a Redis whose
     * last attempt failed is down, and saying so at once beats making
     * every caller wait out the timeout. */
    *may_wait = pending && !redis_mod.known_down;
    snprintf(why, whylen, "no connection to redis is ready (last error: %s)",
             redis_mod.last_error[0] != '\0' ? redis_mod.last_error
                                             : "none yet");
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
static int
send_script(struct rconn *c, struct rcmd *cmd)
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
    av[1] = redis_mod.shas[cmd->script];
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
wait_arm(void)
{
    if (TAILQ_EMPTY(&redis_mod.waiting) ||
        event_pending(redis_mod.wait_ev, EV_TIMEOUT, NULL)) {
        return;
    }
    /* Commands wait in issue order, so the first one expires first. */
    uint64_t now = ld_now_us();
    uint64_t until = TAILQ_FIRST(&redis_mod.waiting)->wait_until_us;
    uint64_t wait = until > now ? until - now : 0;
    struct timeval tv = {(time_t)(wait / 1000000),
                         (suseconds_t)(wait % 1000000)};
    event_add(redis_mod.wait_ev, &tv);
}

/* Send CMD, let it wait for a connection being established, or answer it
 * NOT_SENT. Its arguments are the kept ones unless ARGV is given. */
static void
route_cmd(struct rcmd *cmd, const struct ld_redis_opts *opts, int argc,
          const char **argv, const size_t *argvlen)
{
    char why[256];
    bool may_wait;
    struct rconn *c = pick_conn(opts, cmd->route_hash, why, sizeof(why),
                                &may_wait);
    if (c != NULL) {
        int rc;
        if (cmd->script >= 0) {
            rc = send_script(c, cmd);
        } else if (argv != NULL) {
            rc = redis_send_argv(c, cmd, argc, argv, argvlen);
        } else {
            rc = redis_send_argv(c, cmd, cmd->argc, (const char **)cmd->argv,
                                 cmd->argvlen);
        }
        if (rc != LD_OK) {
            fail_later(cmd, LD_REDIS_NOT_SENT, "could not queue the command");
        }
        return;
    }
    if (!may_wait || redis_mod.n_waiting >= MAX_WAITING) {
        fail_later(cmd, LD_REDIS_NOT_SENT, why);
        return;
    }
    if (cmd->script < 0 && argv != NULL &&
        copy_args(cmd, argc, argv, argvlen) != LD_OK) {
        fail_later(cmd, LD_REDIS_NOT_SENT, "out of memory");
        return;
    }
    if (cmd->wait_until_us == 0) {
        /* The clock runs from the issue, not from the latest retry. */
        cmd->wait_until_us = ld_now_us() +
                             (uint64_t)redis_mod.ctx->cfg->redis.timeout_ms *
                                 1000;
    }
    cmd->pool = opts != NULL ? opts->pool : LD_REDIS_POOL_SHARED;
    cmd->waiting = true;
    TAILQ_INSERT_TAIL(&redis_mod.waiting, cmd, link);
    redis_mod.n_waiting++;
    wait_arm();
}

/* A connection became ready, or an attempt failed: what waits is sent,
 * waits on, or is answered. */
void
redis_waiting_retry(void)
{
    if (TAILQ_EMPTY(&redis_mod.waiting)) {
        return;
    }
    struct rcmd_queue list = TAILQ_HEAD_INITIALIZER(list);
    TAILQ_CONCAT(&list, &redis_mod.waiting, link);
    redis_mod.n_waiting = 0;
    while (!TAILQ_EMPTY(&list)) {
        struct rcmd *cmd = TAILQ_FIRST(&list);
        TAILQ_REMOVE(&list, cmd, link);
        LD_ASSERT(cmd->waiting);
        cmd->waiting = false;
        struct ld_redis_opts o = {cmd->flags, cmd->pool, 0};
        route_cmd(cmd, &o, 0, NULL, NULL);
    }
}

static void
wait_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    uint64_t now = ld_now_us();
    while (!TAILQ_EMPTY(&redis_mod.waiting) &&
           TAILQ_FIRST(&redis_mod.waiting)->wait_until_us <= now) {
        struct rcmd *cmd = TAILQ_FIRST(&redis_mod.waiting);
        TAILQ_REMOVE(&redis_mod.waiting, cmd, link);
        redis_mod.n_waiting--;
        cmd->waiting = false;
        char why[256];
        snprintf(why, sizeof(why),
                 "no connection to redis was ready "
                 "within %d ms (last error: %s)",
                 redis_mod.ctx->cfg->redis.timeout_ms,
                 redis_mod.last_error[0] != '\0' ? redis_mod.last_error
                                                 : "none yet");
        fail_later(cmd, LD_REDIS_NOT_SENT, why);
    }
    wait_arm();
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
    struct rcmd *cmd = ld_xcalloc(1, sizeof(*cmd));
    cmd->cb = cb;
    cmd->arg = arg;
    cmd->script = -1;
    cmd->flags = opts != NULL ? opts->flags : 0;
    cmd->route_hash = ld_hash(route, route_len);
    route_cmd(cmd, opts, argc, argv, argvlen);
}

/* Keep the key count and the script's keys and args in one allocation,
 * for the rare NOSCRIPT resend. */
static int
keep_args(struct rcmd *cmd, int nkeys, int argc, const char **argv,
          const size_t *argvlen)
{
    char nk[24];
    int n = argc + 1;
    size_t bytes = 0;
    snprintf(nk, sizeof(nk), "%d", nkeys);
    for (int i = 0; i < argc; i++) {
        bytes += argvlen[i] + 1;
    }
    bytes += strlen(nk) + 1;
    size_t head = sizeof(char *) * (size_t)n + sizeof(size_t) * (size_t)n;
    char *block = malloc(head + bytes);
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
    struct rcmd *cmd = ld_xcalloc(1, sizeof(*cmd));
    cmd->cb = cb;
    cmd->arg = arg;
    cmd->script = (int)script;
    cmd->flags = opts != NULL ? opts->flags : 0;
    cmd->route_hash = ld_hash(route, route_len);
    if (keep_args(cmd, nkeys, argc, argv, argvlen) != LD_OK) {
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
redis_doubt(const char *why)
{
    if (redis_mod.doubt_fn != NULL && !redis_mod.freeing) {
        redis_mod.doubt_fn(why, redis_mod.doubt_arg);
    }
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
    TAILQ_INIT(&redis_mod.waiting);
    LIST_INIT(&redis_mod.draining);
    if (cfg->redis.mode == LD_REDIS_CLUSTER) {
        log_error("redis.mode cluster is not available in this version; use "
                  "standalone or sentinel");
        return LD_ERR;
    }
    if (cfg->redis.mode == LD_REDIS_SENTINEL) {
        /* The Sentinels name the master (ld_redis_set_address). */
        snprintf(redis_mod.last_error, sizeof(redis_mod.last_error),
                 "no master known yet");
    } else {
        if (ld_conn_parse_address(cfg->redis.address, &redis_mod.addr) !=
            LD_OK) {
            log_error("bad redis.address value=%s", cfg->redis.address);
            return LD_ERR;
        }
        snprintf(redis_mod.address, sizeof(redis_mod.address), "%s",
                 cfg->redis.address);
        redis_mod.have_addr = true;
    }
    redis_mod.n_conns = cfg->redis.connections;
    if (redis_mod.n_conns < 1) {
        redis_mod.n_conns = 1;
    }
    if (redis_mod.n_conns > MAX_CONNS) {
        redis_mod.n_conns = MAX_CONNS;
    }
    ld_defer_init(&redis_mod.fail_defer, ctx->base, fail_cb, NULL);
    redis_mod.wait_ev = evtimer_new(ctx->base, wait_cb, NULL);
    if (redis_mod.wait_ev == NULL) {
        ld_oom(0);
    }
    for (int i = 0; i < redis_mod.n_conns; i++) {
        redis_slot_init(&redis_mod.conns[i], i, LD_REDIS_POOL_SHARED);
    }
    return LD_OK;
}

static bool started;

/* The lock pool opens with the backend when lock.wait_replicas is set,
 * else on its first use (the setting can be reloaded). */
static void
lock_pool_start(void)
{
    if (redis_mod.n_lock > 0 || !started || !redis_mod.have_addr) {
        return;
    }
    for (int i = redis_mod.n_conns; i < 2 * redis_mod.n_conns; i++) {
        redis_slot_init(&redis_mod.conns[i], i, LD_REDIS_POOL_LOCK);
    }
    redis_mod.n_lock = redis_mod.n_conns;
    for (int i = redis_mod.n_conns; i < redis_mod.n_conns + redis_mod.n_lock;
         i++) {
        redis_slot_start(&redis_mod.conns[i]);
    }
}

void
ld_redis_start(void)
{
    started = true;
    if (!redis_mod.have_addr) {
        return;
    }
    for (int i = 0; i < redis_mod.n_conns; i++) {
        redis_slot_start(&redis_mod.conns[i]);
    }
    if (redis_mod.ctx->cfg->lock.wait_replicas > 0) {
        lock_pool_start();
    }
}

void
ld_redis_set_address(const struct ld_conn_addr *addr, const char *text)
{
    bool first = !redis_mod.have_addr;
    redis_mod.addr = *addr;
    redis_mod.have_addr = true;
    snprintf(redis_mod.address, sizeof(redis_mod.address), "%s", text);
    /* Slots that are set aside stay on the old server for its late
     * answers; every slot in use moves now (one not started yet only
     * learns where to go). */
    redis_mod.known_down = false;
    for (int i = 0; i < redis_mod.n_conns + redis_mod.n_lock; i++) {
        struct rconn *c = &redis_mod.conns[i];
        snprintf(c->why, sizeof(c->why), "the master moved to %s", text);
        ld_conn_set_addr(c->conn, addr);
        c->why[0] = '\0';
    }
    if (first && started) {
        ld_redis_start();
    }
}

void
ld_redis_free(void)
{
    /* Going down at exit is not news. */
    redis_mod.freeing = true;
    while (!LIST_EMPTY(&redis_mod.draining)) {
        redis_drain_close(LIST_FIRST(&redis_mod.draining));
    }
    for (int i = 0; i < redis_mod.n_conns + redis_mod.n_lock; i++) {
        struct rconn *c = &redis_mod.conns[i];
        redis_set_ready(c, false);
        c->state = CONN_DOWN;
        ld_conn_free(c->conn);
        c->conn = NULL;
        redis_fail_sent(c, "connection closed");
    }
    while (!TAILQ_EMPTY(&redis_mod.waiting)) {
        struct rcmd *cmd = TAILQ_FIRST(&redis_mod.waiting);
        TAILQ_REMOVE(&redis_mod.waiting, cmd, link);
        cmd->waiting = false;
        fail_later(cmd, LD_REDIS_NOT_SENT, "the daemon is stopping");
    }
    redis_mod.n_waiting = 0;
    if (redis_mod.wait_ev != NULL) {
        event_free(redis_mod.wait_ev);
        redis_mod.wait_ev = NULL;
    }
    /* Late failures still owe their callers an answer. */
    if (redis_mod.fail_defer.ev != NULL) {
        fail_cb(NULL);
        ld_defer_free(&redis_mod.fail_defer);
    }
    redis_mod.n_conns = 0;
    redis_mod.n_lock = 0;
    started = false;
}
