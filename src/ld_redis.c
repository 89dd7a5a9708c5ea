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

#define MAX_CONNS 64              /* per pool */
#define STACK_ARGS 32
#define MAX_WAITING 4096          /* commands awaiting a connection */

enum conn_state { CONN_DOWN, CONN_CONNECTING, CONN_HANDSHAKE, CONN_READY };

struct rconn;

struct rcmd {
    ld_redis_cb *cb;
    void *arg;
    struct rconn *conn;
    uint64_t sent_us;
    TAILQ_ENTRY(rcmd) link;   /* connection FIFO, waiting or failure list */
    unsigned flags;           /* LD_REDIS_F_* */
    bool answered;            /* the callback has had UNKNOWN already */
    bool noscript;            /* resent as EVAL after NOSCRIPT */
    enum ld_redis_outcome fail_outcome; /* on the failure list */
    char *fail_reason;
    int script;               /* -1 unless an EVALSHA */
    int argc;                 /* script: keys + args, kept for NOSCRIPT */
    char **argv;
    size_t *argvlen;
    bool internal;            /* handshake step: cb gets the rconn */
    bool waiting;             /* on the list of those awaiting a conn */
    enum ld_redis_pool pool;  /* while waiting */
    uint64_t route_hash;
    uint64_t wait_until_us;   /* when waiting for a connection ends */
};

TAILQ_HEAD(rcmd_queue, rcmd);

struct rconn {
    int idx;
    struct ld_conn *conn;     /* NULL once a set-aside one is closed */
    enum conn_state state;
    struct event *timeout_ev; /* set aside: the drain bound */
    struct rcmd_queue sent;   /* sent, awaiting replies, in send order */
    unsigned handshake_left;
    bool handshake_failed;
    uint64_t id;              /* this context's, for pinned commands */
    int pool;                 /* enum ld_redis_pool */
    bool draining;            /* set aside after a timeout */
    bool closing;
    uint64_t drain_end_us;
    LIST_ENTRY(rconn) dlink;  /* list of draining connections */
    char why[192];            /* why it is going down, for callbacks */
};

struct state_watcher {
    ld_redis_state_fn *fn;
    void *arg;
};

static struct {
    const struct ld_ctx *ctx;
    struct rconn conns[2 * MAX_CONNS];
    int n_conns;              /* the shared pool: conns[0, n_conns) */
    int n_lock;               /* the lock pool after it, once started */
    bool lock_ever_ready;
    LIST_HEAD(, rconn) draining;
    uint64_t next_id;
    char last_error[160];     /* of the latest failed connect */
    int n_ready;
    struct ld_conn_addr addr;
    char address[300];
    char shas[LD_SCRIPT__COUNT + 1][41];
    struct rcmd_queue failed; /* answered from the loop by fail_defer */
    struct ld_defer fail_defer;
    /* Commands issued while no connection was ready but one was being
     * established, in issue order; bounded by count and by
     * redis.timeout_ms from the issue. */
    struct rcmd_queue waiting;
    int n_waiting;
    struct event *wait_ev;
    bool known_down;          /* the latest connect attempt failed */
    struct state_watcher watchers[8];
    int n_watchers;
    double rtt_us;
    bool freeing;
} redis_mod;

static const char *script_bodies[] = {
#define LD_SCRIPT_BODY(name) ld_lua_##name,
    LD_LUA_SCRIPTS(LD_SCRIPT_BODY)
#undef LD_SCRIPT_BODY
    NULL
};

static const char *script_names[] = {
#define LD_SCRIPT_NAME(name) #name,
    LD_LUA_SCRIPTS(LD_SCRIPT_NAME)
#undef LD_SCRIPT_NAME
    NULL
};


/* What the callback now running is told (ld_redis_outcome & co). */
struct cb_context {
    enum ld_redis_outcome outcome;
    const char *reason;
    uint64_t conn_id;
};
static struct cb_context CUR = { LD_REDIS_ANSWERED, "", 0 };

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

static void
call_cb(struct rcmd *cmd, redisReply *reply, enum ld_redis_outcome outcome,
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
        TAILQ_FOREACH(c, &redis_mod.conns[i].sent, link) {
            n++;
        }
    }
    /* Late answers nobody waits for do not hold up a stop. */
    struct rconn *d;
    LIST_FOREACH(d, &redis_mod.draining, dlink) {
        struct rcmd *c;
        TAILQ_FOREACH(c, &d->sent, link) {
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
static void
set_ready(struct rconn *c, bool ready)
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

static void
rcmd_free(struct rcmd *cmd)
{
    free(cmd->argv);           /* one block: argv, argvlen and the bytes */
    free(cmd->fail_reason);
    free(cmd);
}

/* Answer a command that never reached Redis, from the loop rather than
 * from inside the caller. */
static void
fail_later(struct rcmd *cmd, enum ld_redis_outcome outcome,
           const char *reason)
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
        call_cb(cmd, NULL, cmd->fail_outcome, cmd->fail_reason, 0);
        rcmd_free(cmd);
    }
}

static int
send_argv(struct rconn *c, struct rcmd *cmd, int argc, const char **argv,
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

static void handshake_reply(struct rconn *c, redisReply *reply,
                            struct rcmd *cmd);
static void waiting_retry(void);
static void wait_cb(evutil_socket_t fd, short what, void *arg);
static void resend_as_eval(struct rconn *c, struct rcmd *cmd);

static void
reply_cb(struct ld_conn *conn, redisReply *reply, void *owner)
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
        handshake_reply(c, reply, cmd);
        rcmd_free(cmd);
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
    if (!cmd->answered) {
        call_cb(cmd, reply, LD_REDIS_ANSWERED, "", c->id);
    } else if (cmd->flags & LD_REDIS_F_LATE) {
        call_cb(cmd, reply, LD_REDIS_LATE, "", c->id);
    }
    rcmd_free(cmd);
    if (c->draining && !c->closing && TAILQ_EMPTY(&c->sent)) {
        /* All late answers are in: close it from the loop. */
        event_active(c->timeout_ev, EV_TIMEOUT, 0);
    }
}

/* No answer will ever come on C's connection: what was sent on it hears
 * so now. */
static void
fail_sent(struct rconn *c, const char *why)
{
    while (!TAILQ_EMPTY(&c->sent)) {
        struct rcmd *cmd = TAILQ_FIRST(&c->sent);
        TAILQ_REMOVE(&c->sent, cmd, link);
        bool late = (cmd->flags & LD_REDIS_F_LATE) != 0;
        if (!cmd->internal && (!cmd->answered || late)) {
            ld_stats.redis_errors++;
            call_cb(cmd, NULL, late ? LD_REDIS_LOST : LD_REDIS_UNKNOWN, why,
                    c->id);
        }
        rcmd_free(cmd);
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
    const char *body = script_bodies[cmd->script];

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
    if (send_argv(c, cmd, cmd->argc + 2, argv, argvlen) != LD_OK) {
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
        LIST_FOREACH(d, &redis_mod.draining, dlink) {
            if (d->id == o->pin && d->conn != NULL && !d->closing) {
                return d;
            }
        }
        snprintf(why, whylen, "the connection of the earlier command is "
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
copy_args(struct rcmd *cmd, int argc, const char **argv,
          const size_t *argvlen)
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
    int argc = cmd->argc - 1;  /* the kept ones start with the key count */
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
    int rc = send_argv(c, cmd, argc + 3, av, al);
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
            rc = send_argv(c, cmd, argc, argv, argvlen);
        } else {
            rc = send_argv(c, cmd, cmd->argc, (const char **)cmd->argv,
                           cmd->argvlen);
        }
        if (rc != LD_OK) {
            fail_later(cmd, LD_REDIS_NOT_SENT,
                       "could not queue the command");
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
        cmd->wait_until_us =
            ld_now_us() +
            (uint64_t)redis_mod.ctx->cfg->redis.timeout_ms * 1000;
    }
    cmd->pool = opts != NULL ? opts->pool : LD_REDIS_POOL_SHARED;
    cmd->waiting = true;
    TAILQ_INSERT_TAIL(&redis_mod.waiting, cmd, link);
    redis_mod.n_waiting++;
    wait_arm();
}

/* A connection became ready, or an attempt failed: what waits is sent,
 * waits on, or is answered. */
static void
waiting_retry(void)
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
        snprintf(why, sizeof(why), "no connection to redis was ready "
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
ld_redis_script(enum ld_script_id script, const char *route,
                size_t route_len, int nkeys, int argc, const char **argv,
                const size_t *argvlen, ld_redis_cb *cb, void *arg)
{
    ld_redis_script_ex(NULL, script, route, route_len, nkeys, argc, argv,
                       argvlen, cb, arg);
}

void
ld_redis_script_ex(const struct ld_redis_opts *opts,
                   enum ld_script_id script, const char *route,
                   size_t route_len, int nkeys, int argc, const char **argv,
                   const size_t *argvlen, ld_redis_cb *cb, void *arg)
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

/* ---- connection lifecycle ------------------------------------------- */

/* A connection attempt failed: Redis counts as down until one succeeds,
 * and what waited for a connection learns it now. */
static void
attempt_failed(void)
{
    redis_mod.known_down = true;
    waiting_retry();
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
    for (int i = 0; i < LD_SCRIPT__COUNT; i++) {
        const char *av[] = {"SCRIPT", "LOAD", script_bodies[i]};
        size_t al[] = {6, 4, strlen(script_bodies[i])};
        struct rcmd *cmd = ld_xcalloc(1, sizeof(*cmd));
        cmd->internal = true;
        cmd->script = i;
        cmd->arg = (void *)script_names[i];
        c->handshake_left++;
        if (send_argv(c, cmd, 3, av, al) != LD_OK) {
            c->handshake_left--;
            c->handshake_failed = true;
            free(cmd);
        }
    }
    /* Replies never arrive before we return to the loop, so the count
     * cannot reach zero while steps are still being queued. */
    if (c->handshake_left == 0) {
        ld_conn_close(conn, "handshake could not be sent");
    }
}

static void
slot_down(struct ld_conn *conn, bool was_ready, const char *why,
          void *owner)
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
    set_ready(c, false);
    c->state = CONN_DOWN;
    if (slot_was_ready) {
        log_warn("redis connection lost conn=%d reason=\"%s\"", c->idx,
                 why);
    } else {
        log_debug("redis connect failed conn=%d reason=\"%s\"", c->idx,
                  why);
        snprintf(redis_mod.last_error, sizeof(redis_mod.last_error), "%s",
                 why);
    }
    fail_sent(c, reason);
    c->why[0] = '\0';
    LD_UNUSED(conn);
    if (!slot_was_ready) {
        attempt_failed();
    } else {
        waiting_retry();
    }
}

/* Close a connection that was set aside, from the loop (never from inside
 * one of its own callbacks). What still waits for an answer gets its last
 * call now. */
static void
drain_close(struct rconn *d)
{
    LD_ASSERT(d->draining && !d->closing);
    LIST_REMOVE(d, dlink);
    d->closing = true;
    if (d->conn != NULL) {
        if (!TAILQ_EMPTY(&d->sent)) {
            log_warn("redis connection given up conn=%d reason=\"%s\"",
                     d->idx, d->why);
        }
        ld_conn_free(d->conn);
        d->conn = NULL;
    }
    fail_sent(d, d->why);
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
        drain_close(d);
        return;
    }
    uint64_t wait = d->drain_end_us - now;
    struct timeval tv = {(time_t)(wait / 1000000),
                         (suseconds_t)(wait % 1000000)};
    event_add(d->timeout_ev, &tv);
}

static void
drain_down(struct ld_conn *conn, bool was_ready, const char *why,
           void *owner)
{
    struct rconn *d = owner;
    LD_UNUSED(was_ready);
    snprintf(d->why, sizeof(d->why), "connection lost: %s", why);
    /* Its commands get their last call now; it is freed from the loop. */
    fail_sent(d, d->why);
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
    .on_reply = reply_cb,
    .on_push = NULL,
    .on_stall = drain_stall,
};

static void slot_stall(struct ld_conn *conn, void *owner);

static const struct ld_conn_ops slot_ops = {
    .on_ready = slot_ready,
    .on_down = slot_down,
    .on_reply = reply_cb,
    .on_push = NULL,
    .on_stall = slot_stall,
};

static void
slot_new_conn(struct rconn *c)
{
    c->conn = ld_conn_new(redis_mod.ctx, &redis_mod.addr,
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
    d->id = c->id;
    d->pool = c->pool;
    d->conn = c->conn;
    d->state = CONN_DOWN;
    d->draining = true;
    TAILQ_INIT(&d->sent);
    TAILQ_CONCAT(&d->sent, &c->sent, link);
    d->timeout_ev = evtimer_new(redis_mod.ctx->base, drain_timeout_cb, d);
    if (d->timeout_ev == NULL) {
        ld_oom(0);
    }
    snprintf(d->why, sizeof(d->why), "%s", why);
    ld_conn_set_owner(d->conn, &drain_ops, d);
    ld_conn_no_retry(d->conn);
    d->drain_end_us = ld_now_us() +
                      (uint64_t)redis_mod.ctx->cfg->redis.timeout_ms * 1000 *
                          LD_REDIS_DRAIN_FACTOR;
    LIST_INSERT_HEAD(&redis_mod.draining, d, dlink);

    set_ready(c, false);
    c->state = CONN_CONNECTING;
    log_warn("redis connection stalled conn=%d reason=\"%s\"; kept for "
             "late answers, reconnecting", c->idx, why);
    drain_timeout_cb(-1, 0, d);

    /* Callbacks may pin new commands to D (appended after LAST). */
    struct rcmd *last = TAILQ_LAST(&d->sent, rcmd_queue);
    struct rcmd *cmd;
    TAILQ_FOREACH(cmd, &d->sent, link) {
        if (!cmd->internal && !cmd->answered) {
            cmd->answered = true;
            ld_stats.redis_errors++;
            call_cb(cmd, NULL, LD_REDIS_UNKNOWN, d->why, d->id);
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

static void
handshake_reply(struct rconn *c, redisReply *reply, struct rcmd *cmd)
{
    if (c->state != CONN_HANDSHAKE) {
        return;
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        if (!c->handshake_failed) {
            c->handshake_failed = true;
            log_error("redis handshake failed conn=%d step=%s error=\"%s\"",
                      c->idx, (const char *)cmd->arg, reply->str);
            snprintf(redis_mod.last_error, sizeof(redis_mod.last_error),
                     "handshake step %s failed: %s", (const char *)cmd->arg,
                     reply->str);
        }
    } else if (cmd->script >= 0 && reply->type == REDIS_REPLY_STRING &&
               reply->len == 40) {
        memcpy(redis_mod.shas[cmd->script], reply->str, 40);
        redis_mod.shas[cmd->script][40] = '\0';
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
    set_ready(c, true);
    c->state = CONN_READY;
    ld_stats.redis_reconnects++;
    log_debug("redis connection ready conn=%d", c->idx);
    redis_mod.known_down = false;
    waiting_retry();
}

static void
conn_start(struct rconn *c)
{
    c->state = CONN_CONNECTING;
    ld_conn_start(c->conn);
}

int
ld_redis_parse_address(const char *addr, char *host, size_t hostlen,
                       int *port, bool *is_unix)
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

static void
conn_init(struct rconn *c, int idx, enum ld_redis_pool pool)
{
    c->idx = idx;
    c->pool = pool;
    TAILQ_INIT(&c->sent);
    slot_new_conn(c);
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
    if (cfg->redis.mode != LD_REDIS_STANDALONE) {
        log_error("redis.mode %s is not available in this version; use "
                  "standalone",
                  cfg->redis.mode == LD_REDIS_SENTINEL ? "sentinel"
                                                       : "cluster");
        return LD_ERR;
    }
    if (ld_conn_parse_address(cfg->redis.address, &redis_mod.addr) !=
        LD_OK) {
        log_error("bad redis.address value=%s", cfg->redis.address);
        return LD_ERR;
    }
    snprintf(redis_mod.address, sizeof(redis_mod.address), "%s",
             cfg->redis.address);
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
        conn_init(&redis_mod.conns[i], i, LD_REDIS_POOL_SHARED);
    }
    return LD_OK;
}

static bool started;

/* The lock pool opens with the backend when lock.wait_replicas is set,
 * else on its first use (the setting can be reloaded). */
static void
lock_pool_start(void)
{
    if (redis_mod.n_lock > 0 || !started) {
        return;
    }
    for (int i = redis_mod.n_conns; i < 2 * redis_mod.n_conns; i++) {
        conn_init(&redis_mod.conns[i], i, LD_REDIS_POOL_LOCK);
    }
    redis_mod.n_lock = redis_mod.n_conns;
    for (int i = redis_mod.n_conns; i < redis_mod.n_conns + redis_mod.n_lock;
         i++) {
        conn_start(&redis_mod.conns[i]);
    }
}

void
ld_redis_start(void)
{
    started = true;
    for (int i = 0; i < redis_mod.n_conns; i++) {
        conn_start(&redis_mod.conns[i]);
    }
    if (redis_mod.ctx->cfg->lock.wait_replicas > 0) {
        lock_pool_start();
    }
}

void
ld_redis_free(void)
{
    /* Going down at exit is not news. */
    redis_mod.freeing = true;
    while (!LIST_EMPTY(&redis_mod.draining)) {
        drain_close(LIST_FIRST(&redis_mod.draining));
    }
    for (int i = 0; i < redis_mod.n_conns + redis_mod.n_lock; i++) {
        struct rconn *c = &redis_mod.conns[i];
        set_ready(c, false);
        c->state = CONN_DOWN;
        ld_conn_free(c->conn);
        c->conn = NULL;
        fail_sent(c, "connection closed");
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
