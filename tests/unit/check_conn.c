/* The connection core (ld_conn) and its users, ld_redis' command queue
 * and ld_pubsub, against a fake Redis that this test runs in its own
 * event loop: listening sockets whose connections are parsed with
 * hiredis' reader and answered as the test decides (held, dropped,
 * NOSCRIPT), so the handshake, timeouts, backoff, liveness, address
 * changes, reply order, late answers, the NOSCRIPT resend, pinning, the
 * wait for a connection and resubscribing are observable without a real
 * Redis. */

#include "ld_common.h"

#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_pubsub.h"
#include "ld_redis.h"
#include "ld_util.h"

#include <arpa/inet.h>
#include "unit.h"

#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/listener.h>
#include <hiredis/hiredis.h>

#define WAIT_MS 10000 /* generous: slow, loaded machines */
#define MAX_PEERS 8
#define FAKE_SHA "0123456789abcdef0123456789abcdef01234567"

/* ---- the fake Redis ------------------------------------------------- */

struct peer {
    struct bufferevent *bev;
    redisReader *reader;
    int n_commands;   /* commands received, handshake included */
    int n_handshake;  /* of which handshake steps */
    int lis;          /* which listener accepted it */
    char seen[8][96]; /* the first commands, as "VERB arg..." */
};

static struct {
    struct event_base *base;
    struct evconnlistener *lis;
    int port;
    struct evconnlistener *lis2; /* a second address */
    int port2;
    int n_ping;
    int n_subscribe;
    struct peer peers[MAX_PEERS];
    int n_peers;
    bool hold;          /* answer nothing while set */
    bool noscript_once; /* the next EVALSHA gets NOSCRIPT */
    int n_eval;         /* EVAL commands seen */
    int n_evalsha;
    char last_peer_cmd[64]; /* ECHO argument and the peer: "arg@N" */
} fake;

static bool
arg_is(const redisReply *cmd, size_t i, const char *s)
{
    return cmd->elements > i && strcasecmp(cmd->element[i]->str, s) == 0;
}

static void
answer(struct peer *p, const redisReply *cmd)
{
    struct evbuffer *out = bufferevent_get_output(p->bev);
    if (p->n_commands <= (int)LD_ARRAY_LEN(p->seen)) {
        char *line = p->seen[p->n_commands - 1];
        size_t used = 0;
        for (size_t i = 0; i < cmd->elements && i < 3; i++) {
            used += (size_t)snprintf(line + used, sizeof(p->seen[0]) - used,
                                     "%s%.40s", i > 0 ? " " : "",
                                     cmd->element[i]->str);
            if (used >= sizeof(p->seen[0])) {
                break;
            }
        }
    }
    if (arg_is(cmd, 0, "PING")) {
        fake.n_ping++;
        evbuffer_add_printf(out, "+PONG\r\n");
    } else if (arg_is(cmd, 0, "SUBSCRIBE") && cmd->elements == 2) {
        fake.n_subscribe++;
        evbuffer_add_printf(out,
                            "*3\r\n$9\r\nsubscribe\r\n$%zu\r\n%s\r\n"
                            ":1\r\n",
                            cmd->element[1]->len, cmd->element[1]->str);
    } else if (arg_is(cmd, 0, "SCRIPT")) {
        p->n_handshake++;
        evbuffer_add_printf(out, "$40\r\n%s\r\n", FAKE_SHA);
    } else if (arg_is(cmd, 0, "AUTH") || arg_is(cmd, 0, "SELECT") ||
               arg_is(cmd, 0, "CLIENT")) {
        p->n_handshake++;
        evbuffer_add_printf(out, "+OK\r\n");
    } else if (arg_is(cmd, 0, "EVALSHA")) {
        fake.n_evalsha++;
        if (fake.noscript_once) {
            fake.noscript_once = false;
            evbuffer_add_printf(out, "-NOSCRIPT No matching script.\r\n");
        } else {
            evbuffer_add_printf(out, "+SHA\r\n");
        }
    } else if (arg_is(cmd, 0, "EVAL")) {
        fake.n_eval++;
        evbuffer_add_printf(out, "+EVAL\r\n");
    } else if (arg_is(cmd, 0, "ECHO") && cmd->elements == 2) {
        snprintf(fake.last_peer_cmd, sizeof(fake.last_peer_cmd), "%s@%d",
                 cmd->element[1]->str, (int)(p - fake.peers));
        evbuffer_add_printf(out, "$%zu\r\n%s\r\n", cmd->element[1]->len,
                            cmd->element[1]->str);
    } else {
        evbuffer_add_printf(out, "-ERR unknown command\r\n");
    }
}

/* Parse and answer what has arrived, unless the test holds answers. */
static void
peer_pump(struct peer *p)
{
    struct evbuffer *in = bufferevent_get_input(p->bev);
    size_t len = evbuffer_get_length(in);
    if (len > 0) {
        redisReaderFeed(p->reader, (const char *)evbuffer_pullup(in, -1), len);
        evbuffer_drain(in, len);
    }
    if (fake.hold) {
        return;
    }
    void *r;
    while (redisReaderGetReply(p->reader, &r) == REDIS_OK && r != NULL) {
        p->n_commands++;
        answer(p, r);
        freeReplyObject(r);
    }
}

static void
peer_read_cb(struct bufferevent *bev, void *arg)
{
    LD_UNUSED(bev);
    peer_pump(arg);
}

static void
peer_event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct peer *p = arg;
    LD_UNUSED(bev);
    if (what & (BEV_EVENT_EOF | BEV_EVENT_ERROR)) {
        bufferevent_free(p->bev);
        p->bev = NULL;
    }
}

static void
accept_cb(struct evconnlistener *lis, evutil_socket_t fd, struct sockaddr *sa,
          int salen, void *arg)
{
    LD_UNUSED(lis);
    LD_UNUSED(sa);
    LD_UNUSED(salen);
    ck_assert_int_lt(fake.n_peers, MAX_PEERS);
    struct peer *p = &fake.peers[fake.n_peers++];
    p->lis = arg != NULL ? 2 : 1;
    p->bev = bufferevent_socket_new(fake.base, fd, BEV_OPT_CLOSE_ON_FREE);
    p->reader = redisReaderCreate();
    bufferevent_setcb(p->bev, peer_read_cb, NULL, peer_event_cb, p);
    bufferevent_enable(p->bev, EV_READ | EV_WRITE);
}

/* A listener on a free loopback port; ARG tells the second one. */
static struct evconnlistener *
fake_listen(struct event_base *base, void *arg, int *port)
{
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct evconnlistener *lis = evconnlistener_new_bind(
        base, accept_cb, arg, LEV_OPT_CLOSE_ON_FREE | LEV_OPT_REUSEABLE, 16,
        (struct sockaddr *)&sin, sizeof(sin));
    ck_assert_ptr_nonnull(lis);
    socklen_t sl = sizeof(sin);
    getsockname(evconnlistener_get_fd(lis), (struct sockaddr *)&sin, &sl);
    *port = ntohs(sin.sin_port);
    return lis;
}

static void
fake_start(struct event_base *base)
{
    memset(&fake, 0, sizeof(fake));
    fake.base = base;
    fake.lis = fake_listen(base, NULL, &fake.port);
    fake.lis2 = fake_listen(base, &fake, &fake.port2);
}

/* Close the fake's side of peer I, as a Redis restart would. */
static void
fake_drop(int i)
{
    ck_assert_ptr_nonnull(fake.peers[i].bev);
    bufferevent_free(fake.peers[i].bev);
    fake.peers[i].bev = NULL;
}

static void
fake_release(void)
{
    fake.hold = false;
    for (int i = 0; i < fake.n_peers; i++) {
        if (fake.peers[i].bev != NULL) {
            peer_pump(&fake.peers[i]);
        }
    }
}

static void
fake_stop(void)
{
    for (int i = 0; i < fake.n_peers; i++) {
        if (fake.peers[i].bev != NULL) {
            bufferevent_free(fake.peers[i].bev);
        }
        redisReaderFree(fake.peers[i].reader);
    }
    evconnlistener_free(fake.lis);
    evconnlistener_free(fake.lis2);
}

/* ---- the daemon side ------------------------------------------------ */

static struct event_base *base;
static struct ld_config cfg;
static struct ld_ctx ctx;
static struct event *tick;

struct result {
    int calls;
    enum ld_redis_outcome outcome[2];
    char text[2][64];
    uint64_t conn_id;
    uint64_t at_ms;
};

static void
record_cb(redisReply *reply, void *arg)
{
    struct result *r = arg;
    ck_assert_int_lt(r->calls, 2);
    r->outcome[r->calls] = ld_redis_outcome();
    snprintf(r->text[r->calls], sizeof(r->text[0]), "%s",
             reply != NULL && reply->str != NULL ? reply->str : "");
    r->conn_id = ld_redis_conn_id();
    r->at_ms = ld_now_ms();
    r->calls++;
}

static void
tick_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
}

/* Run the loop until *FLAG is at least N, within WAIT_MS. */
static bool
run_until(const int *flag, int n)
{
    uint64_t end = ld_now_ms() + WAIT_MS;
    while (*flag < n && ld_now_ms() < end) {
        event_base_loop(base, EVLOOP_ONCE);
    }
    return *flag >= n;
}

/* Run the loop for MS milliseconds. */
static void
run_for(int ms)
{
    uint64_t end = ld_now_ms() + (uint64_t)ms;
    while (ld_now_ms() < end) {
        event_base_loop(base, EVLOOP_ONCE);
    }
}

static void
setup_config(int port, int timeout_ms, const char *extra)
{
    char yaml[512], err[256];
    ld_log_set_level(LD_LOG_ERROR);
    ld_conf_defaults(&cfg);
    int n = snprintf(yaml, sizeof(yaml),
                     "redis:\n  address: \"127.0.0.1:%d\"\n"
                     "  connections: 1\n  timeout_ms: %d\n%s",
                     port, timeout_ms, extra);
    ck_assert_int_eq(ld_conf_load_string(&cfg, yaml, (size_t)n, "test", err,
                                         sizeof(err)),
                     LD_OK);
    ctx.base = base;
    ctx.cfg = &cfg;
    ctx.instance = "0123456789abcdef";
    ctx.start_ms = ld_now_ms();
    /* Wakes the loop now and then so that run_until sees the clock. */
    tick = event_new(base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 5000};
    event_add(tick, &tv);
}

static void
setup_daemon(int port, int timeout_ms)
{
    setup_config(port, timeout_ms, "");
    ck_assert_int_eq(ld_redis_init(&ctx), LD_OK);
}

static void
teardown_daemon(void)
{
    ld_redis_free();
    event_free(tick);
    ld_conf_free(&cfg);
}

static void
echo(const struct ld_redis_opts *o, const char *word, struct result *r)
{
    const char *argv[] = {"ECHO", word};
    size_t argvlen[] = {4, strlen(word)};
    ld_redis_command_ex(o, word, strlen(word), 2, argv, argvlen, record_cb, r);
}

/* ---- the tests ------------------------------------------------------ */

/* The daemon's side and the fake share one loop. */
static struct event_base *
both(int timeout_ms)
{
    base = event_base_new();
    fake_start(base);
    setup_daemon(fake.port, timeout_ms);
    return base;
}

static void
both_ready(void)
{
    ld_redis_start();
    uint64_t end = ld_now_ms() + WAIT_MS;
    while (!ld_redis_ready() && ld_now_ms() < end) {
        event_base_loop(base, EVLOOP_ONCE);
    }
    ck_assert(ld_redis_ready());
}

static void
both_free(struct event_base *b)
{
    teardown_daemon();
    fake_stop();
    event_base_free(b);
}

START_TEST(test_wait_for_connecting)
{
    /* The handshake is held: the connection is on its way, not ready. */
    struct event_base *b = both(5000);
    fake.hold = true;
    ld_redis_start();
    ck_assert(run_until(&fake.n_peers, 1));

    struct result r;
    memset(&r, 0, sizeof(r));
    ck_assert(!ld_redis_ready());
    long long before = ld_redis_outstanding(); /* handshake steps */
    echo(NULL, "early", &r);
    /* It must wait, not fail with "no connection is ready". */
    run_for(300);
    ck_assert_int_eq(r.calls, 0);
    ck_assert_int_eq(ld_redis_outstanding(), before + 1);
    fake_release();
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_ANSWERED);
    ck_assert_str_eq(r.text[0], "early");
    both_free(b);
}
END_TEST

START_TEST(test_reply_order)
{
    struct event_base *b = both(5000);
    both_ready();
    enum { N = 200 };
    static struct result res[N];
    static char words[N][16];
    for (int i = 0; i < N; i++) {
        snprintf(words[i], sizeof(words[i]), "w%d", i);
        echo(NULL, words[i], &res[i]);
    }
    ck_assert(run_until(&res[N - 1].calls, 1));
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(res[i].calls, 1);
        ck_assert_int_eq(res[i].outcome[0], LD_REDIS_ANSWERED);
        /* Each caller gets its own answer, not a neighbour's. */
        ck_assert_str_eq(res[i].text[0], words[i]);
        if (i > 0) {
            ck_assert_uint_le(res[i - 1].at_ms, res[i].at_ms);
        }
    }
    ck_assert_int_eq(ld_redis_outstanding(), 0);
    both_free(b);
}
END_TEST

START_TEST(test_wait_bounded_by_timeout)
{
    struct event_base *b = both(300);
    fake.hold = true;
    ld_redis_start();
    ck_assert(run_until(&fake.n_peers, 1));
    struct result r;
    memset(&r, 0, sizeof(r));
    uint64_t t0 = ld_now_ms();
    echo(NULL, "never", &r);
    ck_assert(run_until(&r.calls, 1));
    /* Not at once, and not sent: nothing reached Redis. */
    ck_assert_uint_ge(ld_now_ms() - t0, 250);
    ck_assert_int_eq(r.outcome[0], LD_REDIS_NOT_SENT);
    both_free(b);
}
END_TEST

START_TEST(test_fail_fast_when_down)
{
    /* A port nobody listens on: bind one, note it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    socklen_t sl = sizeof(sin);
    getsockname(fd, (struct sockaddr *)&sin, &sl);
    close(fd);

    base = event_base_new();
    setup_daemon(ntohs(sin.sin_port), 5000);
    ld_redis_start();
    /* Let the first attempt fail. */
    struct result first;
    memset(&first, 0, sizeof(first));
    echo(NULL, "first", &first);
    ck_assert(run_until(&first.calls, 1));
    ck_assert_int_eq(first.outcome[0], LD_REDIS_NOT_SENT);

    struct result r;
    memset(&r, 0, sizeof(r));
    uint64_t t0 = ld_now_ms();
    echo(NULL, "down", &r);
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_NOT_SENT);
    /* Far sooner than redis.timeout_ms (5000). */
    ck_assert_uint_lt(ld_now_ms() - t0, 2000);
    teardown_daemon();
    event_base_free(base);
}
END_TEST

START_TEST(test_timeout_unknown_then_late)
{
    struct event_base *b = both(200);
    both_ready();
    struct result r;
    memset(&r, 0, sizeof(r));
    struct ld_redis_opts o = {.flags = LD_REDIS_F_LATE};
    fake.hold = true;
    echo(&o, "slow", &r);
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_UNKNOWN);
    /* The connection was set aside, not closed: the answer still comes. */
    fake_release();
    ck_assert(run_until(&r.calls, 2));
    ck_assert_int_eq(r.outcome[1], LD_REDIS_LATE);
    ck_assert_str_eq(r.text[1], "slow");
    both_free(b);
}
END_TEST

START_TEST(test_timeout_unknown_then_lost)
{
    struct event_base *b = both(100);
    both_ready();
    struct result r;
    memset(&r, 0, sizeof(r));
    struct ld_redis_opts o = {.flags = LD_REDIS_F_LATE};
    fake.hold = true;
    echo(&o, "gone", &r);
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_UNKNOWN);
    /* No answer within LD_REDIS_DRAIN_FACTOR timeouts: given up. */
    ck_assert(run_until(&r.calls, 2));
    ck_assert_int_eq(r.outcome[1], LD_REDIS_LOST);
    both_free(b);
}
END_TEST

START_TEST(test_noscript_resend)
{
    struct event_base *b = both(2000);
    both_ready();
    struct result r;
    memset(&r, 0, sizeof(r));
    fake.noscript_once = true;
    const char *argv[] = {"k", "v"};
    size_t argvlen[] = {1, 1};
    ld_redis_script((enum ld_script_id)0, "k", 1, 1, 2, argv, argvlen,
                    record_cb, &r);
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_ANSWERED);
    ck_assert_str_eq(r.text[0], "EVAL");
    ck_assert_int_eq(fake.n_evalsha, 1);
    ck_assert_int_eq(fake.n_eval, 1);
    both_free(b);
}
END_TEST

START_TEST(test_pinned)
{
    struct event_base *b = both(2000);
    both_ready();
    struct result r1, r2, r3;
    memset(&r1, 0, sizeof(r1));
    memset(&r2, 0, sizeof(r2));
    memset(&r3, 0, sizeof(r3));
    echo(NULL, "one", &r1);
    ck_assert(run_until(&r1.calls, 1));
    ck_assert_uint_ne(r1.conn_id, 0);
    struct ld_redis_opts o = {.pin = r1.conn_id};
    echo(&o, "two", &r2);
    ck_assert(run_until(&r2.calls, 1));
    ck_assert_int_eq(r2.outcome[0], LD_REDIS_ANSWERED);
    ck_assert_uint_eq(r2.conn_id, r1.conn_id);
    /* A connection that does not exist: never sent. */
    o.pin = r1.conn_id + 1000;
    echo(&o, "three", &r3);
    ck_assert(run_until(&r3.calls, 1));
    ck_assert_int_eq(r3.outcome[0], LD_REDIS_NOT_SENT);
    both_free(b);
}
END_TEST

/* ---- the connection core on its own --------------------------------- */

struct watch {
    int ready, down, replies, pushes;
    bool was_ready;
    char why[192];
};

static void
w_ready(struct ld_conn *c, void *owner)
{
    LD_UNUSED(c);
    ((struct watch *)owner)->ready++;
}

static void
w_down(struct ld_conn *c, bool was_ready, const char *why, void *owner)
{
    struct watch *w = owner;
    LD_UNUSED(c);
    w->down++;
    w->was_ready = was_ready;
    snprintf(w->why, sizeof(w->why), "%s", why);
}

static void
w_reply(struct ld_conn *c, redisReply *reply, void *owner)
{
    LD_UNUSED(c);
    LD_UNUSED(reply);
    ((struct watch *)owner)->replies++;
}

static void
w_push(struct ld_conn *c, redisReply *reply, void *owner)
{
    LD_UNUSED(c);
    LD_UNUSED(reply);
    ((struct watch *)owner)->pushes++;
}

static const struct ld_conn_ops watch_ops = {
    .on_ready = w_ready,
    .on_down = w_down,
    .on_reply = w_reply,
    .on_push = w_push,
    .on_stall = NULL,
};

static struct ld_conn_addr
loopback(int port)
{
    struct ld_conn_addr a;
    memset(&a, 0, sizeof(a));
    snprintf(a.host, sizeof(a.host), "127.0.0.1");
    a.port = port;
    return a;
}

static struct ld_conn *
conn_to(int port, enum ld_conn_role role, struct watch *w)
{
    struct ld_conn_addr a = loopback(port);
    memset(w, 0, sizeof(*w));
    struct ld_conn *c = ld_conn_new(&ctx, &a, role, &watch_ops, w);
    ld_conn_start(c);
    return c;
}

static struct event_base *
core_setup(int timeout_ms, const char *extra)
{
    base = event_base_new();
    fake_start(base);
    setup_config(fake.port, timeout_ms, extra);
    return base;
}

static void
core_free(struct event_base *b, struct ld_conn *c)
{
    ld_conn_free(c);
    event_free(tick);
    ld_conf_free(&cfg);
    fake_stop();
    event_base_free(b);
}

#define AUTH_DB "  username: \"u\"\n  password: \"pw\"\n  db: 3\n"

static void
handshake_as(enum ld_conn_role role, const char *name)
{
    struct event_base *b = core_setup(5000, AUTH_DB);
    struct watch w;
    struct ld_conn *c = conn_to(fake.port, role, &w);
    ck_assert(run_until(&w.ready, 1));
    ck_assert_int_eq(ld_conn_state(c), LD_CONN_READY);
    ck_assert_int_eq(fake.n_peers, 1);
    struct peer *p = &fake.peers[0];
    char setname[96];
    snprintf(setname, sizeof(setname), "CLIENT SETNAME leased:%s:%s",
             ctx.instance, name);
    ck_assert_str_eq(p->seen[0], "AUTH u pw");
    if (role == LD_CONN_ROLE_SUB) {
        /* Channels are not per database. */
        ck_assert_str_eq(p->seen[1], setname);
        ck_assert_int_eq(p->n_commands, 2);
    } else {
        ck_assert_str_eq(p->seen[1], "SELECT 3");
        ck_assert_str_eq(p->seen[2], setname);
        ck_assert_int_eq(p->n_commands, 3);
    }
    ck_assert_int_eq(w.down, 0);
    core_free(b, c);
}

START_TEST(test_handshake_order)
{
    handshake_as(LD_CONN_ROLE_CMD, "cmd");
    handshake_as(LD_CONN_ROLE_LOCK, "lock");
}
END_TEST

START_TEST(test_handshake_subscriber)
{
    handshake_as(LD_CONN_ROLE_SUB, "sub");
}
END_TEST

START_TEST(test_connect_timeout)
{
    /* A listening socket nobody serves: the kernel completes the TCP
     * handshake, Redis' never comes. */
    struct event_base *b = core_setup(300, "");
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sin;
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    ck_assert_int_eq(listen(fd, 4), 0);
    socklen_t sl = sizeof(sin);
    getsockname(fd, (struct sockaddr *)&sin, &sl);

    struct watch w;
    uint64_t t0 = ld_now_ms();
    struct ld_conn *c = conn_to(ntohs(sin.sin_port), LD_CONN_ROLE_SUB, &w);
    ck_assert(run_until(&w.down, 1));
    ck_assert_uint_ge(ld_now_ms() - t0, 290);
    ck_assert_int_eq(w.ready, 0);
    ck_assert(!w.was_ready);
    ck_assert_msg(strstr(w.why, "timed out after 300 ms") != NULL, "%s",
                  w.why);
    ck_assert_str_eq(ld_conn_last_error(c), w.why);
    close(fd);
    core_free(b, c);
}
END_TEST

START_TEST(test_backoff)
{
    struct ld_backoff bo;
    ld_backoff_reset(&bo);
    int first = ld_backoff_next_ms(&bo);
    ck_assert_int_ge(first, 25);
    ck_assert_int_le(first, 51);
    int ms = 0;
    for (int i = 0; i < 20; i++) {
        ms = ld_backoff_next_ms(&bo);
        ck_assert_int_le(ms, 2001);
    }
    /* At the cap the jitter keeps at least half of it. */
    ck_assert_int_ge(ms, 1000);

    /* A refused address is retried, but not in a tight loop. */
    struct event_base *b = core_setup(1000, "");
    int port;
    struct evconnlistener *gone = fake_listen(base, NULL, &port);
    evconnlistener_free(gone);
    struct watch w;
    struct ld_conn *c = conn_to(port, LD_CONN_ROLE_CMD, &w);
    ck_assert(run_until(&w.down, 2));
    run_for(1000);
    /* 50, 100, 200, 400, 800 ms at most, halved at least by jitter. */
    ck_assert_int_le(w.down, 10);
    ck_assert_int_eq(w.ready, 0);
    core_free(b, c);
}
END_TEST

START_TEST(test_liveness_ping)
{
    struct event_base *b = core_setup(2000, "");
    struct watch w;
    struct ld_conn *c = conn_to(fake.port, LD_CONN_ROLE_CMD, &w);
    ck_assert(run_until(&w.ready, 1));
    ld_conn_set_ping_idle_ms(c, 100);
    ck_assert(run_until(&fake.n_ping, 3));
    /* The PONGs are the core's own: the owner hears nothing. */
    ck_assert_int_eq(w.replies, 0);
    ck_assert_int_eq(w.down, 0);
    ck_assert_int_eq(ld_conn_state(c), LD_CONN_READY);
    core_free(b, c);
}
END_TEST

START_TEST(test_liveness_ping_unanswered)
{
    struct event_base *b = core_setup(300, "");
    struct watch w;
    struct ld_conn *c = conn_to(fake.port, LD_CONN_ROLE_SUB, &w);
    ck_assert(run_until(&w.ready, 1));
    fake.hold = true;
    ld_conn_set_ping_idle_ms(c, 100);
    ck_assert(run_until(&w.down, 1));
    ck_assert(w.was_ready);
    ck_assert_msg(strstr(w.why, "timed out") != NULL, "%s", w.why);
    /* And it comes back by itself once Redis answers again. */
    fake.hold = false;
    ck_assert(run_until(&w.ready, 2));
    ck_assert_int_eq(fake.n_peers, 2);
    core_free(b, c);
}
END_TEST

START_TEST(test_address_change)
{
    struct event_base *b = core_setup(2000, "");
    struct watch w;
    struct ld_conn *c = conn_to(fake.port, LD_CONN_ROLE_CMD, &w);
    ck_assert(run_until(&w.ready, 1));
    ck_assert_int_eq(fake.peers[0].lis, 1);
    uint64_t id = ld_conn_id(c);

    struct ld_conn_addr a = loopback(fake.port2);
    ld_conn_set_addr(c, &a);
    ck_assert_int_eq(w.down, 1);
    ck_assert(run_until(&w.ready, 2));
    ck_assert_int_eq(fake.n_peers, 2);
    ck_assert_int_eq(fake.peers[1].lis, 2);
    ck_assert_uint_ne(ld_conn_id(c), id);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", fake.port2);
    ck_assert_str_eq(ld_conn_address(c), want);
    core_free(b, c);
}
END_TEST

/* ---- the subscriber --------------------------------------------------- */

struct ps_events {
    int subscribed, lost, messages;
};

static void
ps_cb(enum ld_pubsub_event ev, const char *msg, size_t len, void *arg)
{
    struct ps_events *e = arg;
    LD_UNUSED(msg);
    LD_UNUSED(len);
    if (ev == LD_PUBSUB_SUBSCRIBED) {
        e->subscribed++;
    } else if (ev == LD_PUBSUB_LOST) {
        e->lost++;
    } else {
        e->messages++;
    }
}

static bool
peer_saw(const struct peer *p, const char *line)
{
    for (size_t i = 0; i < LD_ARRAY_LEN(p->seen); i++) {
        if (strcmp(p->seen[i], line) == 0) {
            return true;
        }
    }
    return false;
}

START_TEST(test_resubscribe_after_reconnect)
{
    base = event_base_new();
    fake_start(base);
    setup_config(fake.port, 2000, "");
    ck_assert_int_eq(ld_pubsub_init(&ctx), LD_OK);
    ld_pubsub_start();
    struct ps_events e;
    memset(&e, 0, sizeof(e));
    struct ld_pubsub_sub *sub = ld_pubsub_subscribe("chan1", 5, ps_cb, &e);
    ck_assert(run_until(&e.subscribed, 1));
    ck_assert(peer_saw(&fake.peers[0], "SUBSCRIBE chan1"));

    fake_drop(0);
    ck_assert(run_until(&e.lost, 1));
    ck_assert(run_until(&e.subscribed, 2));
    ck_assert_int_eq(fake.n_peers, 2);
    char setname[96];
    snprintf(setname, sizeof(setname), "CLIENT SETNAME leased:%s:sub",
             ctx.instance);
    ck_assert_str_eq(fake.peers[1].seen[0], setname);
    ck_assert(peer_saw(&fake.peers[1], "SUBSCRIBE chan1"));

    ld_pubsub_unsubscribe(sub);
    ld_pubsub_free();
    event_free(tick);
    ld_conf_free(&cfg);
    fake_stop();
    event_base_free(base);
}
END_TEST

/* ---- instances beside the backend (lock.redlock) -------------------- */

struct inst_seen {
    int up[4], down[4];
};

static void
inst_state_cb(int k, bool up, void *arg)
{
    struct inst_seen *s = arg;
    ck_assert_int_ge(k, 0);
    ck_assert_int_lt(k, 4);
    (up ? s->up : s->down)[k]++;
}

/* Which listener answered the latest ECHO: 1 (main) or 2. */
static int
echo_listener(void)
{
    const char *at = strchr(fake.last_peer_cmd, '@');
    ck_assert_ptr_nonnull(at);
    return fake.peers[atoi(at + 1)].lis;
}

START_TEST(test_instances)
{
    char addr[64];
    struct inst_seen seen;
    memset(&seen, 0, sizeof(seen));
    struct event_base *b = both(2000);
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", fake.port2);
    ck_assert_int_eq(ld_redis_add_instance("no port"), LD_ERR);
    ck_assert_int_eq(ld_redis_add_instance(addr), 1);
    ld_redis_on_instance_state(inst_state_cb, &seen);
    both_ready();
    ck_assert(run_until(&seen.up[1], 1));
    ck_assert(ld_redis_instance_ready(1));
    ck_assert(!ld_redis_instance_ready(2));
    ck_assert_int_eq(seen.up[0], 1);
    /* Too late once started. */
    ck_assert_int_eq(ld_redis_add_instance(addr), LD_ERR);

    struct result r0, r1, r2;
    memset(&r0, 0, sizeof(r0));
    memset(&r1, 0, sizeof(r1));
    memset(&r2, 0, sizeof(r2));
    struct ld_redis_opts o = {.instance = 1};
    echo(&o, "to-one", &r1);
    ck_assert(run_until(&r1.calls, 1));
    ck_assert_int_eq(r1.outcome[0], LD_REDIS_ANSWERED);
    ck_assert_int_eq(echo_listener(), 2);
    echo(NULL, "to-main", &r0);
    ck_assert(run_until(&r0.calls, 1));
    ck_assert_int_eq(echo_listener(), 1);
    o.instance = 2;
    echo(&o, "nowhere", &r2);
    ck_assert(run_until(&r2.calls, 1));
    ck_assert_int_eq(r2.outcome[0], LD_REDIS_NOT_SENT);

    /* Instance 1 goes down alone: the backend stays up. */
    for (int i = 0; i < fake.n_peers; i++) {
        if (fake.peers[i].lis == 2 && fake.peers[i].bev != NULL) {
            fake_drop(i);
        }
    }
    ck_assert(run_until(&seen.down[1], 1));
    ck_assert_int_eq(seen.down[0], 0);
    ck_assert(ld_redis_ready());
    /* ...and comes back on its own. */
    ck_assert(run_until(&seen.up[1], 2));
    both_free(b);
}
END_TEST

START_TEST(test_command_timeout)
{
    /* redis.timeout_ms is long; the command's own is short. */
    struct event_base *b = both(5000);
    both_ready();
    struct result r, after;
    memset(&r, 0, sizeof(r));
    memset(&after, 0, sizeof(after));
    struct ld_redis_opts o = {.flags = LD_REDIS_F_LATE, .timeout_ms = 150};
    fake.hold = true;
    uint64_t t0 = ld_now_ms();
    echo(&o, "slow", &r);
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_UNKNOWN);
    ck_assert_uint_ge(ld_now_ms() - t0, 140);
    ck_assert_uint_lt(ld_now_ms() - t0, 2000);
    uint64_t conn = r.conn_id;
    fake_release();
    ck_assert(run_until(&r.calls, 2));
    ck_assert_int_eq(r.outcome[1], LD_REDIS_LATE);
    ck_assert_str_eq(r.text[1], "slow");
    /* The connection was not set aside for it. */
    echo(NULL, "next", &after);
    ck_assert(run_until(&after.calls, 1));
    ck_assert_uint_eq(after.conn_id, conn);
    both_free(b);
}
END_TEST

START_TEST(test_command_timeout_waiting)
{
    /* Held handshake: the command waits for the connection, as long as
     * its own timeout and no longer. */
    struct event_base *b = both(5000);
    fake.hold = true;
    ld_redis_start();
    ck_assert(run_until(&fake.n_peers, 1));
    struct result r, plain;
    memset(&r, 0, sizeof(r));
    memset(&plain, 0, sizeof(plain));
    struct ld_redis_opts o = {.timeout_ms = 200};
    echo(NULL, "plain", &plain);
    uint64_t t0 = ld_now_ms();
    echo(&o, "short", &r);
    ck_assert(run_until(&r.calls, 1));
    ck_assert_int_eq(r.outcome[0], LD_REDIS_NOT_SENT);
    ck_assert_uint_ge(ld_now_ms() - t0, 180);
    ck_assert_uint_lt(ld_now_ms() - t0, 2000);
    /* The one queued ahead of it with the long timeout still waits. */
    ck_assert_int_eq(plain.calls, 0);
    fake_release();
    ck_assert(run_until(&plain.calls, 1));
    ck_assert_int_eq(plain.outcome[0], LD_REDIS_ANSWERED);
    both_free(b);
}
END_TEST

static Suite *
conn_suite(void)
{
    Suite *s = suite_create("conn");
#define ADD(name)                                                             \
    do {                                                                      \
        TCase *tc = tcase_create(#name);                                      \
        tcase_set_timeout(tc, 60);                                            \
        tcase_add_test(tc, test_##name);                                      \
        suite_add_tcase(s, tc);                                               \
    } while (0)
    ADD(reply_order);
    ADD(wait_for_connecting);
    ADD(wait_bounded_by_timeout);
    ADD(fail_fast_when_down);
    ADD(timeout_unknown_then_late);
    ADD(timeout_unknown_then_lost);
    ADD(noscript_resend);
    ADD(pinned);
    ADD(handshake_order);
    ADD(handshake_subscriber);
    ADD(connect_timeout);
    ADD(backoff);
    ADD(liveness_ping);
    ADD(liveness_ping_unanswered);
    ADD(address_change);
    ADD(resubscribe_after_reconnect);
    ADD(instances);
    ADD(command_timeout);
    ADD(command_timeout_waiting);
#undef ADD
    return s;
}

int
main(void)
{
    return ld_unit_run(conn_suite());
}
