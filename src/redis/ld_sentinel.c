/*
 * Following a Sentinel-managed master. Two connections, both to
 * Sentinels: one asks (SENTINEL get-master-addr-by-name), one listens
 * (+switch-master). The answer goes to the owner (ld_server wires it to
 * every Redis connection and to the lock re-check); this module talks to
 * no Redis data server itself. Whether the named server really is a
 * master is checked by the connections that go there (ROLE in their
 * handshake), whose failure comes back here as a doubt.
 *
 * It owns the two Sentinel connections and the address they name; the
 * connections to that address are ld_redis's and ld_pubsub's.
 */
#include "ld_sentinel.h"

#include "ld_conf.h"
#include "ld_conn.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define MAX_SENTINELS 16
/* Doubts come in bursts (every connection that breaks reports one): the
 * Sentinels are asked at most this often. */
#define ASK_MIN_GAP_US (250 * 1000)

static struct {
    const struct ld_ctx *ctx;
    ld_sentinel_master_fn *fn;
    void *fn_arg;
    struct ld_conn_addr sentinels[MAX_SENTINELS];
    int n;
    /* Asking: the Sentinel asked now, and how many of this round have
     * failed. */
    struct ld_conn *query;
    int cur;
    int tried;
    bool asking;
    bool moving; /* the query connection is being pointed elsewhere */
    bool query_started;
    uint64_t last_ask_us;
    struct event *ask_ev;
    struct ld_backoff round_backoff;
    /* Listening. */
    struct ld_conn *sub;
    int sub_cur;
    struct event *sub_ev; /* moves the subscriber on, after a backoff */
    bool sub_moving;      /* it is being pointed elsewhere on purpose */
    struct ld_backoff sub_backoff;
    /* The master as last named. */
    bool have_master;
    struct ld_conn_addr master;
    char master_text[300];
    /* Since when no master could be used (0: one can). */
    uint64_t no_master_since_us;
    bool started;
} sentinel_mod;

static void ask_now(void);
static void sub_move(int i);

static const char *
sentinel_name(int i)
{
    static char buf[300];
    const struct ld_conn_addr *a = &sentinel_mod.sentinels[i];
    if (a->is_unix) {
        snprintf(buf, sizeof(buf), "%s", a->host);
    } else {
        snprintf(buf, sizeof(buf), "%s:%d", a->host, a->port);
    }
    return buf;
}

/* A master named by a Sentinel (or its +switch-master message). */
static void
master_named(const char *host, int port, const char *by)
{
    struct ld_conn_addr a;
    memset(&a, 0, sizeof(a));
    snprintf(a.host, sizeof(a.host), "%s", host);
    a.port = port;
    char text[300];
    snprintf(text, sizeof(text), "%s:%d", host, port);
    if (sentinel_mod.have_master &&
        strcmp(text, sentinel_mod.master_text) == 0) {
        return;
    }
    bool failover = sentinel_mod.have_master;
    if (failover) {
        ld_stats.redis_failovers++;
        log_warn("sentinel: master of %s moved from %s to %s (told by %s)",
                 sentinel_mod.ctx->cfg->redis.master_name,
                 sentinel_mod.master_text, text, by);
    } else {
        log_info("sentinel: master of %s is %s (told by %s)",
                 sentinel_mod.ctx->cfg->redis.master_name, text, by);
    }
    sentinel_mod.have_master = true;
    sentinel_mod.master = a;
    snprintf(sentinel_mod.master_text, sizeof(sentinel_mod.master_text), "%s",
             text);
    ld_stats_set_redis_master(text);
    sentinel_mod.fn(&a, text, failover, sentinel_mod.fn_arg);
}

/* ---- asking --------------------------------------------------------- */

static void
ask_send(void)
{
    const char *name = sentinel_mod.ctx->cfg->redis.master_name;
    const char *av[] = {"SENTINEL", "get-master-addr-by-name", name};
    size_t al[] = {8, 23, strlen(name)};
    if (ld_conn_send(sentinel_mod.query, 3, av, al) != LD_OK) {
        ld_conn_close(sentinel_mod.query, "could not send");
    }
}

/* The Sentinel asked now could not tell: the next one, or, after a whole
 * round without an answer, a new round after a backoff. */
static void
ask_next(const char *why)
{
    log_warn("sentinel skipped address=%s reason=\"%s\"",
             sentinel_name(sentinel_mod.cur), why);
    sentinel_mod.cur = (sentinel_mod.cur + 1) % sentinel_mod.n;
    if (++sentinel_mod.tried >= sentinel_mod.n) {
        sentinel_mod.asking = false;
        int ms = ld_backoff_next_ms(&sentinel_mod.round_backoff);
        log_warn("sentinel: no Sentinel named a master for %s; asking again "
                 "in %d ms",
                 sentinel_mod.ctx->cfg->redis.master_name, ms);
        struct timeval tv = ld_tv_ms(ms);
        event_add(sentinel_mod.ask_ev, &tv);
        return;
    }
    /* Its own on_down is not news: this is the move. */
    sentinel_mod.moving = true;
    ld_conn_set_addr(sentinel_mod.query,
                     &sentinel_mod.sentinels[sentinel_mod.cur]);
    sentinel_mod.moving = false;
}

static void
query_ready(struct ld_conn *c, void *owner)
{
    LD_UNUSED(c);
    LD_UNUSED(owner);
    if (sentinel_mod.asking) {
        ask_send();
    }
}

static void
query_down(struct ld_conn *c, bool was_ready, const char *why, void *owner)
{
    LD_UNUSED(c);
    LD_UNUSED(was_ready);
    LD_UNUSED(owner);
    if (sentinel_mod.asking && !sentinel_mod.moving) {
        ask_next(why);
    }
}

static void
query_reply(struct ld_conn *c, redisReply *r, void *owner)
{
    LD_UNUSED(c);
    LD_UNUSED(owner);
    if (!sentinel_mod.asking) {
        return;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type == REDIS_REPLY_STRING) {
        char *end;
        long port = strtol(r->element[1]->str, &end, 10);
        if (*end == '\0' && port > 0 && port < 65536 &&
            r->element[0]->len < sizeof(sentinel_mod.master.host)) {
            sentinel_mod.asking = false;
            ld_backoff_reset(&sentinel_mod.round_backoff);
            master_named(r->element[0]->str, (int)port,
                         sentinel_name(sentinel_mod.cur));
            /* Listen to a Sentinel known to monitor the name: one that
             * does not, or is down, would tell nothing. */
            if (sentinel_mod.sub_cur != sentinel_mod.cur) {
                sub_move(sentinel_mod.cur);
            }
            return;
        }
        ask_next("the answer is not a host and port");
    } else if (r->type == REDIS_REPLY_NIL) {
        ask_next("it does not know redis.master_name");
    } else if (r->type == REDIS_REPLY_ERROR) {
        ask_next(r->str);
    } else {
        ask_next("the answer is not a host and port");
    }
}

static const struct ld_conn_ops query_ops = {
    .on_ready = query_ready,
    .on_down = query_down,
    .on_reply = query_reply,
    .on_push = NULL,
    .on_stall = NULL,
};

/* A round: from the Sentinel that answered last, through all of them. */
static void
ask_now(void)
{
    if (sentinel_mod.asking) {
        return;
    }
    event_del(sentinel_mod.ask_ev);
    sentinel_mod.asking = true;
    sentinel_mod.tried = 0;
    sentinel_mod.last_ask_us = ld_now_us();
    if (!sentinel_mod.query_started) {
        sentinel_mod.query_started = true;
        ld_conn_start(sentinel_mod.query);
    } else if (ld_conn_state(sentinel_mod.query) == LD_CONN_READY) {
        ask_send();
    }
    /* Otherwise it is connecting: query_ready asks. */
}

static void
ask_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    ask_now();
}

void
ld_sentinel_doubt(const char *why, void *arg)
{
    LD_UNUSED(arg);
    if (!sentinel_mod.started || sentinel_mod.asking ||
        event_pending(sentinel_mod.ask_ev, EV_TIMEOUT, NULL)) {
        return;
    }
    log_debug("sentinel: asking again reason=\"%s\"", why);
    /* Another Sentinel than the one that named the master in doubt: one
     * that lags behind a failover, or disagrees with the others, is not
     * asked again and again. */
    sentinel_mod.cur = (sentinel_mod.cur + 1) % sentinel_mod.n;
    if (sentinel_mod.n > 1) {
        sentinel_mod.moving = true;
        ld_conn_set_addr(sentinel_mod.query,
                         &sentinel_mod.sentinels[sentinel_mod.cur]);
        sentinel_mod.moving = false;
    }
    uint64_t now = ld_now_us();
    uint64_t next = sentinel_mod.last_ask_us + ASK_MIN_GAP_US;
    if (now >= next) {
        ask_now();
        return;
    }
    ld_timer_at_us(sentinel_mod.ask_ev, next);
}

/* ---- listening ------------------------------------------------------ */

static void
sub_ready(struct ld_conn *c, void *owner)
{
    LD_UNUSED(owner);
    ld_backoff_reset(&sentinel_mod.sub_backoff);
    const char *av[] = {"SUBSCRIBE", "+switch-master"};
    size_t al[] = {9, 14};
    if (ld_conn_send(c, 2, av, al) != LD_OK) {
        ld_conn_close(c, "could not subscribe");
    }
}

static void
sub_down(struct ld_conn *c, bool was_ready, const char *why, void *owner)
{
    LD_UNUSED(owner);
    if (sentinel_mod.sub_moving) {
        return;
    }
    if (was_ready) {
        log_warn("sentinel subscriber lost address=%s reason=\"%s\"",
                 sentinel_name(sentinel_mod.sub_cur), why);
    }
    LD_UNUSED(c);
    /* The next Sentinel, after a backoff, so that a list of Sentinels
     * that are all down is not cycled through in a tight loop; what was
     * missed meanwhile is asked for once the subscription is back. */
    if (!event_pending(sentinel_mod.sub_ev, EV_TIMEOUT, NULL)) {
        int ms = ld_backoff_next_ms(&sentinel_mod.sub_backoff);
        struct timeval tv = ld_tv_ms(ms);
        event_add(sentinel_mod.sub_ev, &tv);
    }
}

/* Point the subscriber at Sentinel I. */
static void
sub_move(int i)
{
    sentinel_mod.sub_cur = i;
    sentinel_mod.sub_moving = true;
    ld_conn_set_addr(sentinel_mod.sub, &sentinel_mod.sentinels[i]);
    sentinel_mod.sub_moving = false;
}

static void
sub_move_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    /* Its own retry may have brought it back meanwhile. */
    if (ld_conn_state(sentinel_mod.sub) == LD_CONN_READY) {
        return;
    }
    sub_move((sentinel_mod.sub_cur + 1) % sentinel_mod.n);
}

/* "<name> <old-ip> <old-port> <new-ip> <new-port>" */
static void
switch_message(const char *msg, size_t len)
{
    char buf[600], name[256], oldip[256], newip[256];
    int oldport, newport;
    if (len >= sizeof(buf)) {
        return;
    }
    memcpy(buf, msg, len);
    buf[len] = '\0';
    if (sscanf(buf, "%255s %255s %d %255s %d", name, oldip, &oldport, newip,
               &newport) != 5) {
        log_warn("sentinel: +switch-master message not understood: %s", buf);
        return;
    }
    if (strcmp(name, sentinel_mod.ctx->cfg->redis.master_name) != 0 ||
        newport <= 0 || newport > 65535) {
        return;
    }
    master_named(newip, newport, sentinel_name(sentinel_mod.sub_cur));
}

static void
sub_push(struct ld_conn *c, redisReply *r, void *owner)
{
    LD_UNUSED(c);
    LD_UNUSED(owner);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        return;
    }
    const char *kind = r->element[0]->str;
    if (strcmp(kind, "subscribe") == 0) {
        /* Events may have been missed while it was away. */
        ld_sentinel_doubt("sentinel subscription (re)established", NULL);
    } else if (strcmp(kind, "message") == 0 &&
               r->element[2]->type == REDIS_REPLY_STRING) {
        switch_message(r->element[2]->str, r->element[2]->len);
    }
}

static const struct ld_conn_ops sub_ops = {
    .on_ready = sub_ready,
    .on_down = sub_down,
    .on_reply = NULL,
    .on_push = sub_push,
    .on_stall = NULL,
};

/* ---- the rest -------------------------------------------------------- */

void
ld_sentinel_master_state(bool up, void *arg)
{
    LD_UNUSED(arg);
    uint64_t now = ld_now_us();
    if (up && sentinel_mod.no_master_since_us != 0) {
        ld_stats.redis_no_master_us +=
            (long long)(now - sentinel_mod.no_master_since_us);
        sentinel_mod.no_master_since_us = 0;
    } else if (!up && sentinel_mod.no_master_since_us == 0) {
        sentinel_mod.no_master_since_us = now;
    }
}

int
ld_sentinel_init(const struct ld_ctx *ctx, ld_sentinel_master_fn *fn,
                 void *arg)
{
    const struct ld_config *cfg = ctx->cfg;
    memset(&sentinel_mod, 0, sizeof(sentinel_mod));
    sentinel_mod.ctx = ctx;
    sentinel_mod.fn = fn;
    sentinel_mod.fn_arg = arg;
    if (cfg->redis.addresses.count > MAX_SENTINELS) {
        log_error("redis.addresses: at most %d Sentinels", MAX_SENTINELS);
        return LD_ERR;
    }
    for (size_t i = 0; i < cfg->redis.addresses.count; i++) {
        if (ld_conn_parse_address(cfg->redis.addresses.items[i],
                                  &sentinel_mod.sentinels[i]) != LD_OK) {
            log_error("bad Sentinel address value=%s",
                      cfg->redis.addresses.items[i]);
            return LD_ERR;
        }
    }
    sentinel_mod.n = (int)cfg->redis.addresses.count;
    if (sentinel_mod.n == 0) {
        log_error("sentinel mode needs the Sentinels in redis.addresses");
        return LD_ERR;
    }
    sentinel_mod.query = ld_conn_new(ctx, &sentinel_mod.sentinels[0],
                                     LD_CONN_ROLE_SENTINEL, &query_ops, NULL);
    sentinel_mod.sub = ld_conn_new(ctx, &sentinel_mod.sentinels[0],
                                   LD_CONN_ROLE_SENTINEL_SUB, &sub_ops, NULL);
    sentinel_mod.ask_ev = evtimer_new(ctx->base, ask_cb, NULL);
    sentinel_mod.sub_ev = evtimer_new(ctx->base, sub_move_cb, NULL);
    if (sentinel_mod.ask_ev == NULL || sentinel_mod.sub_ev == NULL) {
        ld_oom_in("evtimer_new");
    }
    ld_backoff_reset(&sentinel_mod.round_backoff);
    ld_backoff_reset(&sentinel_mod.sub_backoff);
    sentinel_mod.no_master_since_us = ld_now_us();
    ld_stats_set_redis_master("");
    return LD_OK;
}

void
ld_sentinel_start(void)
{
    sentinel_mod.started = true;
    ld_conn_start(sentinel_mod.sub);
    ask_now();
}

void
ld_sentinel_free(void)
{
    if (sentinel_mod.query != NULL) {
        ld_conn_free(sentinel_mod.query);
        ld_conn_free(sentinel_mod.sub);
        event_free(sentinel_mod.ask_ev);
        event_free(sentinel_mod.sub_ev);
    }
    memset(&sentinel_mod, 0, sizeof(sentinel_mod));
}
