/*
 * The Redis connection core: connecting, the handshake, liveness, the
 * reply owed too long, teardown and reconnecting, for every connection
 * of the daemon. Owners (ld_redis, ld_pubsub) see only struct
 * ld_conn_ops.
 *
 * Replies come in send order. The core numbers what it sends and keeps
 * the numbers of its own commands (handshake steps, PING) in a small
 * ring, so a reply is either its own or the owner's oldest. On a
 * subscriber connection Redis also pushes messages nobody asked for, so
 * there only the handshake (sent before any SUBSCRIBE) is numbered and a
 * "pong" is recognised by its content.
 *
 * The states of a connection (enum ld_conn_state):
 *   DOWN        no transport; the retry timer (backoff) starts the next
 *               attempt, unless the owner said ld_conn_no_retry.
 *               -> CONNECTING
 *   CONNECTING  resolving, connecting, the TLS handshake; bounded by
 *               redis.timeout_ms.
 *               -> HANDSHAKE  connected: AUTH, SELECT, CLIENT SETNAME
 *                             and ROLE are sent (as the role needs);
 *               -> DOWN       refused, failed or timed out.
 *   HANDSHAKE   its own replies are counted down.
 *               -> READY      the last step answered: on_ready;
 *               -> DOWN       a step refused, or no reply in time.
 *   READY       the owner's commands go; PING when idle; a reply owed
 *               too long is the owner's to decide (on_stall), or DOWN.
 *               -> DOWN       an error, EOF, the stall, a close.
 *   Every way to DOWN tells the owner (on_down) that nothing it is owed
 *   will come.
 *
 * It owns the transport, the reader and the timers of one connection; it must
 * not know what the owners' commands are, only how many replies it owes them.
 */
#include "ld_conn.h"

#include "ld_assert.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_reader.h"
#include "ld_stats.h"
#include "ld_tls.h"
#include "ld_util.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/util.h>

/* A fuzzing build reconnects at once: its fake Redis answers in the same
 * process, and each input that makes the daemon drop the connection
 * would otherwise wait for the back-off. */
#ifndef LD_CONN_BACKOFF_MIN_MS
#define LD_CONN_BACKOFF_MIN_MS 50
#endif
#define BACKOFF_MIN_MS LD_CONN_BACKOFF_MIN_MS
#define BACKOFF_MAX_MS 2000
#define PING_IDLE_MS 5000
#define OWN_RING 8 /* handshake steps and one PING */

struct ld_conn {
    const struct ld_ctx *ctx;
    struct ld_conn_addr addr;
    char address[300];
    enum ld_conn_role role;
    const struct ld_conn_ops *ops;
    void *owner;
    enum ld_conn_state state;
    struct bufferevent *bev;
    bool tls;              /* BEV is TLS: it reads, not read_ev */
    struct event *read_ev; /* reads a plain socket (see sock_read_cb) */
    /* A plain socket, once connected, is written here (DIRECT) from
     * FLUSH_EV, an event activated by the first command of a turn
     * (FLUSH_ARMED); its bufferevent writes only what a full socket left
     * (BEV_WRITING). */
    struct event *flush_ev;
    bool flush_armed;
    bool direct;
    bool bev_writing;
    redisReader *reader;
    struct ld_reader_bounds bounds; /* of READER */
    struct ld_backoff backoff;
    struct event *retry_ev;
    struct event *timer_ev;
    uint64_t timer_at_us; /* when timer_ev fires, if pending */
    uint64_t id;
    uint64_t started_us;  /* of the connect attempt */
    uint64_t progress_us; /* last reply, or a reply became owed */
    uint64_t last_io_us;
    uint64_t n_sent, n_recv; /* replies owed: the difference */
    uint64_t own[OWN_RING];  /* numbers of our own commands */
    const char *own_step[OWN_RING];
    unsigned own_head, own_n;
    int handshake_left;
    char handshake_err[160];
    int ping_idle_ms;
    bool ping_out;
    bool started;
    bool no_retry;
    int busy; /* inside a call to the owner */
    bool free_pending;
    char last_error[192];
};

static struct {
    uint64_t next_id; /* of a connection attempt: ld_conn_id */
} conn_mod;

static const char *role_names[] = {"cmd",      "lock",         "sub",
                                   "sentinel", "sentinel-sub", "track"};

int
ld_conn_parse_address(const char *addr, struct ld_conn_addr *out)
{
    if (addr[0] == '/') {
        snprintf(out->host, sizeof(out->host), "%s", addr);
        out->port = 0;
        out->is_unix = true;
        return LD_OK;
    }
    out->is_unix = false;
    return ld_parse_hostport(addr, out->host, sizeof(out->host), &out->port);
}

void
ld_backoff_reset(struct ld_backoff *b)
{
    b->ms = BACKOFF_MIN_MS;
}

int
ld_backoff_next_ms(struct ld_backoff *b)
{
    if (b->ms < BACKOFF_MIN_MS) {
        b->ms = BACKOFF_MIN_MS;
    }
    int ms = b->ms / 2 + (int)(ld_random_unit() * (b->ms / 2 + 1));
    b->ms *= 2;
    if (b->ms > BACKOFF_MAX_MS) {
        b->ms = BACKOFF_MAX_MS;
    }
    return ms;
}

static bool
is_sentinel_role(enum ld_conn_role role)
{
    return role == LD_CONN_ROLE_SENTINEL || role == LD_CONN_ROLE_SENTINEL_SUB;
}

int
ld_conn_auth_argv(const struct ld_config *cfg, enum ld_conn_role role,
                  const char **argv, size_t *argvlen)
{
    bool sentinel = is_sentinel_role(role);
    const char *user = sentinel ? cfg->redis.sentinel_username
                                : cfg->redis.username;
    const char *pass = sentinel ? cfg->redis.sentinel_password
                                : cfg->redis.password;
    if (pass[0] == '\0') {
        return 0;
    }
    int n = 0;
    argv[n] = "AUTH";
    argvlen[n++] = 4;
    if (user[0] != '\0') {
        argv[n] = user;
        argvlen[n] = strlen(argv[n]);
        n++;
    }
    argv[n] = pass;
    argvlen[n] = strlen(argv[n]);
    n++;
    return n;
}

/* ---- small helpers -------------------------------------------------- */

static uint64_t
timeout_us(const struct ld_conn *c)
{
    return (uint64_t)c->ctx->cfg->redis.timeout_ms * 1000;
}

static uint64_t
owed(const struct ld_conn *c)
{
    return c->n_sent - c->n_recv;
}

static void
timer_at(struct ld_conn *c, uint64_t at)
{
    c->timer_at_us = at;
    ld_timer_at_us(c->timer_ev, at);
}

/* The next moment something must be checked: the connect bound, the
 * bound on a reply owed, or the idle time before a PING. */
static void
arm_timer(struct ld_conn *c)
{
    switch (c->state) {
    case LD_CONN_DOWN:
        event_del(c->timer_ev);
        return;
    case LD_CONN_CONNECTING:
        timer_at(c, c->started_us + timeout_us(c));
        return;
    case LD_CONN_HANDSHAKE:
    case LD_CONN_READY:
        if (owed(c) > 0) {
            timer_at(c, c->progress_us + timeout_us(c));
        } else {
            timer_at(c, c->last_io_us + (uint64_t)c->ping_idle_ms * 1000);
        }
        return;
    }
}

static void
maybe_free(struct ld_conn *c)
{
    if (c->busy > 0 || !c->free_pending) {
        return;
    }
    if (c->bev != NULL) {
        bufferevent_free(c->bev);
    }
    if (c->reader != NULL) {
        redisReaderFree(c->reader);
    }
    event_free(c->retry_ev);
    event_free(c->timer_ev);
    event_free(c->read_ev);
    event_free(c->flush_ev);
    free(c);
}

/* ---- the transport -------------------------------------------------- */

/* The one place a transport is made: TLS (redis.tls.enabled) for every
 * TCP address, plain text otherwise. Redis speaks no TLS on a Unix
 * socket, so a socket path stays plain. NULL with WHY when no TLS session
 * could be made. */
static struct bufferevent *
transport_new(struct ld_conn *c, char *why, size_t whylen)
{
    struct bufferevent *bev;
    c->tls = ld_tls_enabled() && !c->addr.is_unix;
    if (c->tls) {
        struct ssl_st *ssl = ld_tls_new_ssl(c->addr.host, why, whylen);
        if (ssl == NULL) {
            return NULL;
        }
        /* The bufferevent owns SSL from here, and frees it. */
        bev = bufferevent_openssl_socket_new(c->ctx->base, -1, ssl,
                                             BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE);
        if (bev == NULL) {
            ld_oom_in("bufferevent_openssl_socket_new");
        }
        /* A Redis that is killed or restarted closes without a TLS
         * close_notify: that is an end of stream, not a protocol error. */
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    } else {
        bev = bufferevent_socket_new(c->ctx->base, -1, BEV_OPT_CLOSE_ON_FREE);
        if (bev == NULL) {
            ld_oom_in("bufferevent_socket_new");
        }
    }
    /* A burst of pipelined commands leaves in one write, not in 16 KB
     * pieces over as many loop turns. */
    bufferevent_set_max_single_write(bev, EV_SSIZE_MAX);
    return bev;
}

static void
schedule_retry(struct ld_conn *c)
{
    if (c->no_retry || c->free_pending) {
        return;
    }
    int ms = ld_backoff_next_ms(&c->backoff);
    struct timeval tv = ld_tv_ms(ms);
    event_add(c->retry_ev, &tv);
}

/* Everything owed is dropped with the transport; the owner hears of it
 * last, so it sees a connection it may already restart. */
static void
conn_down(struct ld_conn *c, const char *why)
{
    bool was_ready = c->state == LD_CONN_READY;
    event_del(c->read_ev);
    event_del(c->flush_ev);
    c->direct = c->bev_writing = c->flush_armed = false;
    if (c->bev != NULL) {
        bufferevent_free(c->bev);
        c->bev = NULL;
    }
    c->state = LD_CONN_DOWN;
    c->n_sent = c->n_recv = 0;
    c->own_n = 0;
    c->ping_out = false;
    event_del(c->timer_ev);
    snprintf(c->last_error, sizeof(c->last_error), "%s", why);
    schedule_retry(c);
    if (c->free_pending) {
        return;
    }
    c->busy++;
    c->ops->on_down(c, was_ready, why, c->owner);
    c->busy--;
}

static void
own_push(struct ld_conn *c, const char *step)
{
    LD_ASSERT(c->own_n < OWN_RING);
    unsigned at = (c->own_head + c->own_n) % OWN_RING;
    c->own[at] = c->n_sent;
    c->own_step[at] = step;
    c->own_n++;
}

/* "<prefix><n>\r\n": snprintf costs more than the rest of a command. */
static char *
put_len(char *p, char prefix, size_t n)
{
    char tmp[24];
    int i = 0;
    *p++ = prefix;
    do {
        tmp[i++] = (char)('0' + n % 10);
        n /= 10;
    } while (n > 0);
    while (i > 0) {
        *p++ = tmp[--i];
    }
    *p++ = '\r';
    *p++ = '\n';
    return p;
}

/* RESP formatted straight into the output buffer: one copy, no
 * allocation per command. */
static int
format_into(struct evbuffer *out, int argc, const char **argv,
            const size_t *argvlen)
{
    size_t total = 1 + 20 + 2;
    for (int i = 0; i < argc; i++) {
        total += 1 + 20 + 2 + argvlen[i] + 2;
    }
    struct evbuffer_iovec v;
    if (evbuffer_reserve_space(out, (ev_ssize_t)total, &v, 1) != 1) {
        return LD_ERR;
    }
    char *p = put_len(v.iov_base, '*', (size_t)argc);
    for (int i = 0; i < argc; i++) {
        p = put_len(p, '$', argvlen[i]);
        memcpy(p, argv[i], argvlen[i]);
        p += argvlen[i];
        *p++ = '\r';
        *p++ = '\n';
    }
    v.iov_len = (size_t)(p - (char *)v.iov_base);
    return evbuffer_commit_space(out, &v, 1) == 0 ? LD_OK : LD_ERR;
}

/* A connection that receives pushes once ready. */
static bool
is_sub(const struct ld_conn *c)
{
    return c->role == LD_CONN_ROLE_SUB ||
           c->role == LD_CONN_ROLE_SENTINEL_SUB ||
           c->role == LD_CONN_ROLE_TRACK;
}

/* Write what the output holds to a plain socket; what a full socket
 * does not take, the bufferevent finishes (write_cb). 1 when a write was
 * made, 0 when there was nothing to write, -1 with errno when the socket
 * failed. */
static int
write_out(struct ld_conn *c)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    if (evbuffer_get_length(out) == 0) {
        return 0;
    }
    /* A socket bufferevent keeps the front of its output frozen, so that
     * only it drains it; it unfreezes it the same way for its writes. */
    evbuffer_unfreeze(out, 1);
    int n = evbuffer_write(out, bufferevent_getfd(c->bev));
    int err = errno;
    evbuffer_freeze(out, 1);
    ld_stats.redis_writes++;
    if (n < 0 && err != EAGAIN && err != EWOULDBLOCK && err != EINTR) {
        errno = err;
        return -1;
    }
    if (evbuffer_get_length(out) > 0) {
        c->bev_writing = true;
        bufferevent_enable(c->bev, EV_WRITE);
    }
    return 1;
}

/* The end of the turn in which commands were queued: they leave in one
 * write (automatic pipelining). Writing some of them earlier, so that
 * Redis would start on them while the daemon still reads its clients,
 * was measured: one write per 8 commands, and one at once when nothing
 * was in flight, took 0.23 more system calls per lock+unlock at 50
 * connections and showed no gain in throughput (bench/results.md,
 * "Redis I/O overlap"). */
static void
flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ld_conn *c = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    c->flush_armed = false;
    if (c->bev == NULL || !c->direct || c->bev_writing) {
        return;
    }
    if (write_out(c) < 0) {
        char why[192];
        snprintf(why, sizeof(why), "%s", strerror(errno));
        ld_conn_close(c, why);
    }
}

/* The bufferevent wrote what a full socket had left: writing is ours
 * again, without write interest (which would cost two epoll_ctl calls
 * per write). */
static void
write_cb(struct bufferevent *bev, void *arg)
{
    struct ld_conn *c = arg;
    if (c->direct && c->bev_writing) {
        c->bev_writing = false;
        bufferevent_disable(bev, EV_WRITE);
    }
}

/* A command was appended to the output of a plain socket: it leaves at
 * the end of the turn. */
static void
queued_one(struct ld_conn *c)
{
    if (c->direct && !c->bev_writing && !c->flush_armed) {
        c->flush_armed = true;
        event_active(c->flush_ev, EV_WRITE, 0);
    }
}

static int
send_raw(struct ld_conn *c, int argc, const char **argv, const size_t *argvlen)
{
    if (c->bev == NULL) {
        return LD_ERR;
    }
    /* The size is the caller's (a cache value): failing is an error. */
    if (format_into(bufferevent_get_output(c->bev), argc, argv, argvlen) !=
        LD_OK) {
        return LD_ERR;
    }
    uint64_t now = ld_now_us();
    bool counted = !is_sub(c) || c->state != LD_CONN_READY;
    queued_one(c);
    c->last_io_us = now;
    if (!counted) {
        return LD_OK;
    }
    if (owed(c) == 0) {
        c->progress_us = now;
        /* Re-arm only when the bound comes before what is pending. */
        if (!event_pending(c->timer_ev, EV_TIMEOUT, NULL) ||
            c->timer_at_us > now + timeout_us(c)) {
            c->n_sent++;
            arm_timer(c);
            return LD_OK;
        }
    }
    c->n_sent++;
    return LD_OK;
}

int
ld_conn_send(struct ld_conn *c, int argc, const char **argv,
             const size_t *argvlen)
{
    if (c->state == LD_CONN_DOWN || c->state == LD_CONN_CONNECTING) {
        return LD_ERR;
    }
    return send_raw(c, argc, argv, argvlen);
}

static bool
own_send(struct ld_conn *c, const char *step, int argc, const char **argv,
         const size_t *argvlen)
{
    own_push(c, step);
    if (send_raw(c, argc, argv, argvlen) != LD_OK) {
        c->own_n--;
        return false;
    }
    return true;
}

static void
send_ping(struct ld_conn *c)
{
    const char *av[] = {"PING"};
    size_t al[] = {4};
    c->ping_out = true;
    if (is_sub(c)) {
        /* Counted by hand: pushes are not numbered. */
        if (send_raw(c, 1, av, al) == LD_OK) {
            c->progress_us = ld_now_us();
            c->n_sent++;
        }
        return;
    }
    if (!own_send(c, "ping", 1, av, al)) {
        c->ping_out = false;
    }
}

static void
handshake(struct ld_conn *c)
{
    const struct ld_config *cfg = c->ctx->cfg;
    c->state = LD_CONN_HANDSHAKE;
    c->handshake_left = 0;
    c->handshake_err[0] = '\0';
    const char *av[3];
    size_t al[3];
    bool sent = true;
    int n = ld_conn_auth_argv(cfg, c->role, av, al);
    if (n > 0) {
        sent = own_send(c, "auth", n, av, al) && sent;
        c->handshake_left++;
    }
    /* Channels are not per database: the subscriber selects none. */
    char db[16];
    if (cfg->redis.db != 0 && !is_sub(c) && !is_sentinel_role(c->role)) {
        snprintf(db, sizeof(db), "%d", cfg->redis.db);
        const char *sv[] = {"SELECT", db};
        size_t sl[] = {6, strlen(db)};
        sent = own_send(c, "select", 2, sv, sl) && sent;
        c->handshake_left++;
    }
    char name[128];
    snprintf(name, sizeof(name), "leased:%s:%s", c->ctx->instance,
             role_names[c->role]);
    const char *nv[] = {"CLIENT", "SETNAME", name};
    size_t nl[] = {6, 7, strlen(name)};
    sent = own_send(c, "setname", 3, nv, nl) && sent;
    c->handshake_left++;
    if (cfg->redis.mode == LD_REDIS_SENTINEL && !is_sentinel_role(c->role)) {
        /* The address came from a Sentinel, which may be behind events:
         * only a master takes commands (a demoted one would answer
         * READONLY, or a subscriber would hear nothing). */
        const char *rv[] = {"ROLE"};
        size_t rl[] = {4};
        sent = own_send(c, "role", 1, rv, rl) && sent;
        c->handshake_left++;
    }
    if (!sent) {
        conn_down(c, "handshake could not be sent");
        return;
    }
    arm_timer(c);
}

/* ROLE's answer names the role first: "master", "slave" or
 * "sentinel". */
static bool
is_master_role(const redisReply *r)
{
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           r->element[0]->type == REDIS_REPLY_STRING &&
           strcmp(r->element[0]->str, "master") == 0;
}

static void
handshake_reply(struct ld_conn *c, const redisReply *r, const char *step)
{
    if (r->type == REDIS_REPLY_ERROR && c->handshake_err[0] == '\0') {
        log_error("redis handshake failed address=%s role=%s step=%s "
                  "error=\"%s\"",
                  c->address, role_names[c->role], step, r->str);
        snprintf(c->handshake_err, sizeof(c->handshake_err),
                 "handshake step %s failed: %s", step, r->str);
    } else if (strcmp(step, "role") == 0 && !is_master_role(r) &&
               c->handshake_err[0] == '\0') {
        const char *what = r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
                                   r->element[0]->type == REDIS_REPLY_STRING
                               ? r->element[0]->str
                               : "unknown";
        log_warn("redis is not a master address=%s role=%s is=%s", c->address,
                 role_names[c->role], what);
        snprintf(c->handshake_err, sizeof(c->handshake_err),
                 "not a master (ROLE says %s)", what);
    }
    if (--c->handshake_left > 0) {
        return;
    }
    if (c->handshake_err[0] != '\0') {
        char why[192];
        snprintf(why, sizeof(why), "%s", c->handshake_err);
        /* Bad credentials or database: retrying fast only floods the
         * log, so this backs off like any other failure. */
        conn_down(c, why);
        return;
    }
    ld_backoff_reset(&c->backoff);
    c->state = LD_CONN_READY;
    c->last_error[0] = '\0';
    arm_timer(c);
    c->ops->on_ready(c, c->owner);
}

static bool
is_pong(const redisReply *r)
{
    if (r->type == REDIS_REPLY_STATUS) {
        return strcasecmp(r->str, "PONG") == 0;
    }
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 1 &&
           r->element[0]->type == REDIS_REPLY_STRING &&
           strcasecmp(r->element[0]->str, "pong") == 0;
}

static void
dispatch(struct ld_conn *c, redisReply *r)
{
    uint64_t now = ld_now_us();
    c->progress_us = now;
    c->last_io_us = now;
    bool sub_ready = is_sub(c) && c->state == LD_CONN_READY;
    if (sub_ready) {
        if (c->ping_out && is_pong(r)) {
            c->ping_out = false;
            c->n_recv++;
            return;
        }
        c->ops->on_push(c, r, c->owner);
        return;
    }
    if (c->n_recv == c->n_sent) {
        /* A reply to no command: the peer is not Redis or has lost
         * count, and no later reply could be trusted to answer the
         * command it seems to answer. */
        log_warn("redis reply refused address=%s role=%s "
                 "error=\"a reply to no command\"",
                 c->address, role_names[c->role]);
        conn_down(c, "protocol error: a reply to no command");
        return;
    }
    uint64_t seq = c->n_recv++;
    if (c->own_n > 0 && c->own[c->own_head] == seq) {
        const char *step = c->own_step[c->own_head];
        c->own_head = (c->own_head + 1) % OWN_RING;
        c->own_n--;
        if (c->state == LD_CONN_HANDSHAKE) {
            handshake_reply(c, r, step);
        } else {
            c->ping_out = false;
        }
        return;
    }
    LD_ASSERTF(c->state == LD_CONN_READY, "owner reply in state %d",
               (int)c->state);
    c->ops->on_reply(c, r, c->owner);
}

/* Parse and hand out what the reader holds. */
static void
process_input(struct ld_conn *c)
{
    struct bufferevent *bev = c->bev;
    uint64_t id = c->id;
    c->busy++;
    while (c->id == id && c->bev == bev && !c->free_pending) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            char why[192];
            snprintf(why, sizeof(why), "protocol error: %s",
                     c->bounds.why[0] != '\0' ? c->bounds.why
                                              : c->reader->errstr);
            log_warn("redis reply refused address=%s role=%s error=\"%s\"",
                     c->address, role_names[c->role], why);
            conn_down(c, why);
            break;
        }
        if (r == NULL) {
            if (!ld_reader_within(c->reader, &c->bounds)) {
                char why[192];
                snprintf(why, sizeof(why), "protocol error: %s",
                         c->bounds.why);
                log_warn("redis reply refused address=%s role=%s "
                         "error=\"%s\"",
                         c->address, role_names[c->role], why);
                conn_down(c, why);
            }
            break;
        }
        dispatch(c, r);
        freeReplyObject(r);
    }
    c->busy--;
    /* Lazily: a timer that fires early re-arms itself, which costs less
     * than moving it on every read. */
    if (c->id == id && c->bev == bev && !c->free_pending &&
        c->state != LD_CONN_DOWN &&
        !event_pending(c->timer_ev, EV_TIMEOUT, NULL)) {
        arm_timer(c);
    }
    maybe_free(c);
}

/* The bufferevent writes, but a plain socket is read here: libevent 2.1
 * reads at most 4 KB per event into an evbuffer, so a 10 KB reply would
 * take three loop turns and a copy more. Straight from the socket into
 * the reader is one copy. (A TLS transport reads through its
 * bufferevent: tls_read_cb.)
 *
 * A read takes READ_CHUNK and its replies are handled before the next:
 * hiredis' reader moves what is left of its buffer to the front after
 * each reply, so a larger buffer would cost a copy of the rest per
 * reply. While the socket keeps filling whole chunks, up to
 * READ_TURN_BYTES are read in one turn: a burst of large replies (50
 * cache hits of 10 KB) otherwise took a loop turn per 16 KB, with a
 * poll of every other descriptor in between. */
#define READ_CHUNK (16 * 1024)
#define READ_TURN_BYTES (256 * 1024)

static void
sock_read_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ld_conn *c = arg;
    char buf[READ_CHUNK];
    struct bufferevent *bev = c->bev;
    uint64_t id = c->id;
    size_t total = 0;
    ssize_t n;
    LD_UNUSED(what);
    c->busy++;
    for (;;) {
        n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) {
            break;
        }
        redisReaderFeed(c->reader, buf, (size_t)n);
        process_input(c);
        total += (size_t)n;
        if ((size_t)n < sizeof(buf) || total >= READ_TURN_BYTES ||
            c->id != id || c->bev != bev || c->free_pending ||
            c->state == LD_CONN_DOWN) {
            break;
        }
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        n = 1; /* nothing more for now */
    }
    if (n <= 0 && c->id == id && c->bev == bev && !c->free_pending &&
        c->state != LD_CONN_DOWN) {
        char why[192];
        snprintf(why, sizeof(why), "%s",
                 n == 0 ? "Server closed the connection" : strerror(errno));
        conn_down(c, why);
    }
    c->busy--;
    maybe_free(c);
}

/* A TLS transport reads through its bufferevent (the SSL layer owns the
 * socket): what it decrypted goes to the reader chunk by chunk. */
static void
tls_read_cb(struct bufferevent *bev, void *arg)
{
    struct ld_conn *c = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    struct evbuffer_iovec v[8];
    size_t len;
    while ((len = evbuffer_get_length(in)) > 0) {
        int n = evbuffer_peek(in, (ev_ssize_t)len, NULL, v, 8);
        if (n > 8) {
            n = 8;
        }
        size_t fed = 0;
        for (int i = 0; i < n; i++) {
            redisReaderFeed(c->reader, v[i].iov_base, v[i].iov_len);
            fed += v[i].iov_len;
        }
        evbuffer_drain(in, fed);
    }
    process_input(c);
}

/* A TLS failure is a setup problem an operator must see (a wrong CA,
 * name or client certificate, a port without TLS); said again only when
 * the reason changes, not at every retry. */
static void
log_tls_failure(const struct ld_conn *c, const char *why)
{
    if (strcmp(why, c->last_error) != 0) {
        log_error("redis tls failed address=%s role=%s error=\"%s\"",
                  c->address, role_names[c->role], why);
    }
}

/* The reason an attempt or a connection failed, as the log and the
 * callers will see it; whether it is a TLS problem (rather than the
 * transport beneath ending). */
static bool
transport_failure(struct ld_conn *c, short what, char *why, size_t len)
{
    char plain[160];
    if (what & BEV_EVENT_EOF) {
        snprintf(plain, sizeof(plain), "Server closed the connection");
    } else {
        snprintf(plain, sizeof(plain), "%s",
                 evutil_socket_error_to_string(EVUTIL_SOCKET_ERROR()));
    }
    if (!c->tls) {
        snprintf(why, len, "%s", plain);
        return false;
    }
    if (c->state == LD_CONN_CONNECTING && (what & BEV_EVENT_EOF)) {
        /* Typical of a port that speaks no TLS: it drops the hello. */
        snprintf(why, len, "TLS: handshake failed: %s", plain);
        return true;
    }
    unsigned long e = 0, next;
    while ((next = bufferevent_get_openssl_error(c->bev)) != 0) {
        if (e == 0) {
            e = next;
        }
    }
    if (c->state != LD_CONN_CONNECTING && ld_tls_peer_closed(e)) {
        snprintf(why, len, "Server closed the connection");
        return false;
    }
    ld_tls_failure(bufferevent_openssl_get_ssl(c->bev), e, plain, why, len);
    return true;
}

static void
event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct ld_conn *c = arg;
    LD_UNUSED(bev);
    if (what & BEV_EVENT_CONNECTED) {
        evutil_socket_t fd = bufferevent_getfd(c->bev);
        if (c->tls) {
            bufferevent_setcb(c->bev, tls_read_cb, NULL, event_cb, c);
            bufferevent_enable(c->bev, EV_READ);
        } else {
            /* Written by write_out from here on. */
            bufferevent_setcb(c->bev, NULL, write_cb, event_cb, c);
            bufferevent_disable(c->bev, EV_READ | EV_WRITE);
            c->direct = true;
            c->bev_writing = c->flush_armed = false;
            event_assign(c->read_ev, c->ctx->base, fd, EV_READ | EV_PERSIST,
                         sock_read_cb, c);
            event_add(c->read_ev, NULL);
        }
        if (!c->addr.is_unix) {
            int on = 1;
            /* Commands are batched per loop turn already; Nagle would
             * only add latency. A subscriber hears nothing for long
             * stretches: keepalive notices a vanished peer too. */
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
            setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
        }
        c->busy++;
        handshake(c);
        c->busy--;
        maybe_free(c);
        return;
    }
    char why[192];
    bool tls_fault = transport_failure(c, what, why, sizeof(why));
    if (tls_fault &&
        ((what & BEV_EVENT_ERROR) || c->state == LD_CONN_CONNECTING)) {
        log_tls_failure(c, why);
    } else if (c->state == LD_CONN_CONNECTING) {
        log_debug("redis connect failed address=%s error=\"%s\"", c->address,
                  why);
    }
    c->busy++;
    conn_down(c, why);
    c->busy--;
    maybe_free(c);
}

/* CONNECTING: the attempt fails when it has taken the whole bound. */
static void
connect_deadline(struct ld_conn *c, uint64_t now)
{
    char why[128];
    if (now - c->started_us < timeout_us(c)) {
        arm_timer(c);
        return;
    }
    if (c->tls) {
        /* A port without TLS waits for a line that never comes. */
        snprintf(why, sizeof(why),
                 "TLS: connect or handshake timed out after %d ms",
                 c->ctx->cfg->redis.timeout_ms);
        log_tls_failure(c, why);
    } else {
        snprintf(why, sizeof(why), "connect timed out after %d ms",
                 c->ctx->cfg->redis.timeout_ms);
    }
    conn_down(c, why);
}

/* Replies are owed: the connection is down when none came for the whole
 * bound, unless its owner takes the stall over. */
static void
reply_deadline(struct ld_conn *c, uint64_t now)
{
    char why[128];
    if (now - c->progress_us < timeout_us(c)) {
        arm_timer(c);
        return;
    }
    snprintf(why, sizeof(why), "timed out after %d ms",
             c->ctx->cfg->redis.timeout_ms);
    if (c->state == LD_CONN_READY && c->ops->on_stall != NULL &&
        !(c->own_n > 0 && owed(c) == c->own_n)) {
        /* The owner decides; the next call comes after another full
         * bound. */
        c->progress_us = now;
        c->ops->on_stall(c, c->owner);
        if (c->state != LD_CONN_DOWN && !c->free_pending) {
            arm_timer(c);
        }
    } else {
        conn_down(c, why);
    }
}

static void
timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ld_conn *c = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    uint64_t now = ld_now_us();
    c->busy++;
    if (c->state == LD_CONN_CONNECTING) {
        connect_deadline(c, now);
    } else if (c->state != LD_CONN_DOWN && owed(c) > 0) {
        reply_deadline(c, now);
    } else if (c->state == LD_CONN_READY) {
        if (now - c->last_io_us >= (uint64_t)c->ping_idle_ms * 1000) {
            send_ping(c);
        }
        arm_timer(c);
    }
    c->busy--;
    maybe_free(c);
}

/* C's address as a socket address in SS (SL bytes long); LD_ERR with
 * the reason in WHY when it has none. */
static int
conn_resolve(const struct ld_conn *c, struct sockaddr_storage *ss,
             socklen_t *sl, char *why, size_t whylen)
{
    memset(ss, 0, sizeof(*ss));
    if (c->addr.is_unix) {
        struct sockaddr_un *sun = (struct sockaddr_un *)ss;
        sun->sun_family = AF_UNIX;
        size_t n = strlen(c->addr.host);
        if (n >= sizeof(sun->sun_path)) {
            snprintf(why, whylen, "socket path too long");
            return LD_ERR;
        }
        memcpy(sun->sun_path, c->addr.host, n + 1);
        *sl = sizeof(*sun);
        return LD_OK;
    }
    struct evutil_addrinfo hints, *res = NULL;
    char port[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", c->addr.port);
    int rc = evutil_getaddrinfo(c->addr.host, port, &hints, &res);
    if (rc != 0 || res == NULL) {
        snprintf(why, whylen, "%s", evutil_gai_strerror(rc));
        return LD_ERR;
    }
    /* Prefer IPv4, where a default Redis listens for sure. */
    struct evutil_addrinfo *pick = res;
    for (struct evutil_addrinfo *a = res; a != NULL; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
    }
    memcpy(ss, pick->ai_addr, pick->ai_addrlen);
    *sl = (socklen_t)pick->ai_addrlen;
    evutil_freeaddrinfo(res);
    return LD_OK;
}

/* A new reader for the new transport. No reply of Redis to the daemon is
 * larger than a value it takes from a client or may hand one: one request
 * line, one client's unsent output. */
static void
conn_reader_reset(struct ld_conn *c)
{
    if (c->reader != NULL) {
        redisReaderFree(c->reader);
    }
    const struct ld_config *cfg = c->ctx->cfg;
    size_t max_value = (size_t)cfg->limits.max_request_bytes;
    if ((size_t)cfg->limits.max_output_bytes > max_value) {
        max_value = (size_t)cfg->limits.max_output_bytes;
    }
    ld_reader_bounds_init(&c->bounds, max_value);
    c->reader = ld_reader_new(&c->bounds);
}

/* Resolve and connect; an error reported at once is a failed attempt
 * like any other. */
static void
conn_connect(struct ld_conn *c)
{
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char why[192];
    if (conn_resolve(c, &ss, &sl, why, sizeof(why)) != LD_OK) {
        conn_down(c, why);
        return;
    }
    c->bev = transport_new(c, why, sizeof(why));
    if (c->bev == NULL) {
        log_tls_failure(c, why);
        conn_down(c, why);
        return;
    }
    bufferevent_setcb(c->bev, NULL, NULL, event_cb, c);
    bufferevent_enable(c->bev, EV_WRITE);
    conn_reader_reset(c);
    c->id = ++conn_mod.next_id;
    c->state = LD_CONN_CONNECTING;
    c->started_us = ld_now_us();
    c->n_sent = c->n_recv = 0;
    c->own_n = 0;
    c->ping_out = false;
    arm_timer(c);
    struct bufferevent *bev = c->bev;
    uint64_t id = c->id;
    if (bufferevent_socket_connect(bev, (struct sockaddr *)&ss, (int)sl) !=
        0) {
        /* libevent may have reported the error through event_cb
         * already. */
        if (c->id == id && c->bev == bev) {
            snprintf(why, sizeof(why), "%s", strerror(errno));
            log_debug("redis connect failed address=%s error=\"%s\"",
                      c->address, why);
            conn_down(c, why);
        }
    }
}

static void
retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ld_conn *c = arg;
    LD_UNUSED(fd);
    LD_UNUSED(what);
    c->busy++;
    conn_connect(c);
    c->busy--;
    maybe_free(c);
}

/* ---- the owner's side ----------------------------------------------- */

static void
set_address(struct ld_conn *c, const struct ld_conn_addr *addr)
{
    c->addr = *addr;
    if (addr->is_unix) {
        snprintf(c->address, sizeof(c->address), "%s", addr->host);
    } else {
        snprintf(c->address, sizeof(c->address), "%s:%d", addr->host,
                 addr->port);
    }
}

struct ld_conn *
ld_conn_new(const struct ld_ctx *ctx, const struct ld_conn_addr *addr,
            enum ld_conn_role role, const struct ld_conn_ops *ops, void *owner)
{
    struct ld_conn *c = ld_xcalloc(1, sizeof(*c));
    c->ctx = ctx;
    c->role = role;
    c->ops = ops;
    c->owner = owner;
    c->state = LD_CONN_DOWN;
    c->ping_idle_ms = PING_IDLE_MS;
    set_address(c, addr);
    ld_backoff_reset(&c->backoff);
    c->retry_ev = evtimer_new(ctx->base, retry_cb, c);
    c->timer_ev = evtimer_new(ctx->base, timer_cb, c);
    c->read_ev = event_new(ctx->base, -1, 0, NULL, NULL);
    c->flush_ev = event_new(ctx->base, -1, 0, flush_cb, c);
    if (c->retry_ev == NULL || c->timer_ev == NULL || c->read_ev == NULL ||
        c->flush_ev == NULL) {
        ld_oom_in("event_new");
    }
    return c;
}

void
ld_conn_free(struct ld_conn *c)
{
    if (c == NULL) {
        return;
    }
    c->free_pending = true;
    event_del(c->retry_ev);
    event_del(c->timer_ev);
    maybe_free(c);
}

void
ld_conn_start(struct ld_conn *c)
{
    c->started = true;
    if (c->state != LD_CONN_DOWN) {
        return;
    }
    event_del(c->retry_ev);
    /* The owner may free C from on_down, called from in here. */
    c->busy++;
    conn_connect(c);
    c->busy--;
    maybe_free(c);
}

void
ld_conn_set_owner(struct ld_conn *c, const struct ld_conn_ops *ops,
                  void *owner)
{
    c->ops = ops;
    c->owner = owner;
}

void
ld_conn_no_retry(struct ld_conn *c)
{
    c->no_retry = true;
    event_del(c->retry_ev);
}

void
ld_conn_set_addr(struct ld_conn *c, const struct ld_conn_addr *addr)
{
    set_address(c, addr);
    c->busy++;
    if (c->state != LD_CONN_DOWN) {
        conn_down(c, "the address changed");
    }
    if (c->started && !c->no_retry && !c->free_pending &&
        c->state == LD_CONN_DOWN) {
        /* Nothing to back off from: the old address is not the new. */
        ld_backoff_reset(&c->backoff);
        event_del(c->retry_ev);
        conn_connect(c);
    }
    c->busy--;
    maybe_free(c);
}

void
ld_conn_close(struct ld_conn *c, const char *why)
{
    if (c->state != LD_CONN_DOWN) {
        c->busy++;
        conn_down(c, why);
        c->busy--;
        maybe_free(c);
    }
}

enum ld_conn_state
ld_conn_state(const struct ld_conn *c)
{
    return c->state;
}

uint64_t
ld_conn_id(const struct ld_conn *c)
{
    return c->id;
}

const char *
ld_conn_last_error(const struct ld_conn *c)
{
    return c->last_error;
}

const char *
ld_conn_address(const struct ld_conn *c)
{
    return c->address;
}

void
ld_conn_set_ping_idle_ms(struct ld_conn *c, int ms)
{
    c->ping_idle_ms = ms;
    if (c->state == LD_CONN_READY) {
        arm_timer(c);
    }
}
