/*
 * The due set: deletes that outlive the daemon that promised them.
 *
 * A journal on a volume that goes away with the pod (an emptyDir) would
 * take the second deletes still due with it. So the graceful stop hands
 * them to Redis: one sorted set per cache.prefix, cache.prefix + "due"
 * (no entry is named so: entries have "{" after the prefix), scored by
 * the wall-clock time each is due. A member is the mode ("d" delete, "s"
 * mark stale), the daemon's instance id and a sequence number (so that
 * two deletes of one key stay two), then the key. Once Redis holds one,
 * the journal retires it.
 *
 * Every daemon sharing the prefix listens on a channel of the same name,
 * on which a hand-over is announced. Once subscribed (at start, again
 * after a reconnect) and after an announcement, it looks once a second
 * (cache_tick_cb) for as long as the set holds members: one script
 * claims the members due, by moving their score a claim time ahead, and
 * the daemon runs each delete, then removes the member. While the set is
 * empty nothing is sent, so an idle daemon costs Redis nothing. A
 * daemon that dies in between leaves the member to be claimed again when
 * its claim runs out; deletes are idempotent, so at worst one runs twice.
 *
 * It owns the due set's key in Redis, the hand-over at stop and the take-over
 * at start; the deletes themselves stay ld_cache_inval.c's.
 */
#include "ld_cache.h"

#include "ld_cache_int.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_journal.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_pubsub.h"
#include "ld_redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#define DUE_SUFFIX "due"
/* Mode byte, instance id, sequence number in hex. */
#define MEMBER_HEAD (1 + 16 + 16)
#define POLL_LIMIT "100"
#define CLAIM_MS "30000"

static struct {
    struct ld_pubsub_sub *sub;
    bool active;       /* the set may hold members: look each second */
    bool polling;      /* a claim is in flight */
    bool again;        /* announced while it was: its answer is old */
    long long handing; /* hand-overs not yet answered */
    long long handed;
    uint64_t seq;
} due_mod;

static char *
due_set_name(size_t *len)
{
    const char *prefix = cache_mod.ctx->cfg->cache.prefix;
    size_t plen = strlen(prefix);
    char *name = ld_xmalloc(plen + sizeof(DUE_SUFFIX));
    memcpy(name, prefix, plen);
    memcpy(name + plen, DUE_SUFFIX, sizeof(DUE_SUFFIX));
    *len = plen + sizeof(DUE_SUFFIX) - 1;
    return name;
}

static void
make_member(struct del *d)
{
    char head[MEMBER_HEAD + 1];
    snprintf(head, sizeof(head), "%c%.16s%016" PRIx64, d->stale ? 's' : 'd',
             cache_mod.ctx->instance, ++due_mod.seq);
    d->member_len = MEMBER_HEAD + d->key_len;
    d->member = ld_xmalloc(d->member_len);
    memcpy(d->member, head, MEMBER_HEAD);
    memcpy(d->member + MEMBER_HEAD, d->key, d->key_len);
}

static void
noop_cb(redisReply *reply, void *arg)
{
    LD_UNUSED(reply);
    LD_UNUSED(arg);
}

/* Wake the daemons that listen: the set holds members now. */
static void
announce(void)
{
    size_t set_len;
    char *set = due_set_name(&set_len);
    const char *argv[] = {"PUBLISH", set, "due"};
    size_t argvlen[] = {7, set_len, 3};
    ld_redis_command(set, set_len, 3, argv, argvlen, noop_cb, NULL);
    free(set);
}

static void
hand_cb(redisReply *reply, void *arg)
{
    struct del *d = arg;
    d->running = false;
    if (d->orphan) {
        free(d->member);
        free(d);
        return;
    }
    if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
        due_mod.handed++;
        cache_del_handed(d);
    } else {
        /* Still in the journal: the next start carries it out. */
        free(d->member);
        d->member = NULL;
    }
    if (--due_mod.handing == 0) {
        ld_journal_sync(cache_mod.journal);
        cache_update_journal_stats();
        log_info("deletes handed over to Redis count=%lld", due_mod.handed);
        if (due_mod.handed > 0) {
            announce();
        }
    }
}

static void
hand_one(struct del *d, const char *set, size_t set_len, int64_t now)
{
    char score[24];
    int64_t due = d->after != NULL ? now + d->delay_ms : d->due_ms;
    snprintf(score, sizeof(score), "%" PRId64, due);
    make_member(d);
    event_del(d->ev);
    d->running = true;
    due_mod.handing++;
    const char *argv[] = {"ZADD", set, score, d->member};
    size_t argvlen[] = {4, set_len, strlen(score), d->member_len};
    ld_redis_command(set, set_len, 4, argv, argvlen, hand_cb, d);
}

void
ld_cache_hand_over(void)
{
    if (!cache_mod.inited || !ld_redis_ready()) {
        return;
    }
    size_t set_len;
    char *set = due_set_name(&set_len);
    int64_t now = cache_wall_ms();
    struct del *d;
    LIST_FOREACH(d, &cache_mod.dels, link)
    {
        /* One in flight finishes here; one a request waits for is a
         * first delete that has not run yet: the journal keeps both. */
        if (!d->running && d->inv == NULL && d->member == NULL) {
            hand_one(d, set, set_len, now);
        }
    }
    free(set);
}

void
cache_due_done(const char *member, size_t len)
{
    size_t set_len;
    char *set = due_set_name(&set_len);
    const char *argv[] = {"ZREM", set, member};
    size_t argvlen[] = {4, set_len, len};
    ld_redis_command(set, set_len, 3, argv, argvlen, noop_cb, NULL);
    free(set);
}

static void
take_over(const redisReply *m)
{
    if (m->type != REDIS_REPLY_STRING || m->len <= MEMBER_HEAD) {
        return; /* not one of ours: left for its claim to run out */
    }
    char *member = ld_xmalloc(m->len);
    memcpy(member, m->str, m->len);
    log_debug("due delete taken over mode=%c", member[0]);
    cache_del_take_over(member + MEMBER_HEAD, m->len - MEMBER_HEAD,
                        member[0] == 's', member, m->len);
}

static void
poll_cb(redisReply *reply, void *arg)
{
    LD_UNUSED(arg);
    due_mod.polling = false;
    if (!cache_mod.inited || reply == NULL ||
        reply->type != REDIS_REPLY_ARRAY || reply->elements == 0 ||
        reply->element[0]->type != REDIS_REPLY_INTEGER) {
        return; /* still active: the next tick asks again */
    }
    due_mod.active = reply->element[0]->integer > 0 || due_mod.again;
    due_mod.again = false;
    for (size_t i = 1; i < reply->elements; i++) {
        take_over(reply->element[i]);
    }
}

void
cache_due_poll(void)
{
    /* Each tick calls: an empty set (the usual case) is not asked about
     * again until a hand-over is announced or the channel is joined anew,
     * so that an idle daemon sends Redis nothing. */
    if (!due_mod.active || due_mod.polling || cache_mod.ctx->shutting_down ||
        !ld_redis_ready()) {
        return;
    }
    char now[24];
    size_t set_len;
    char *set = due_set_name(&set_len);
    snprintf(now, sizeof(now), "%" PRId64, cache_wall_ms());
    const char *argv[] = {set, now, POLL_LIMIT, CLAIM_MS};
    size_t argvlen[] = {set_len, strlen(now), strlen(POLL_LIMIT),
                        strlen(CLAIM_MS)};
    due_mod.polling = true;
    ld_redis_script(LD_SCRIPT_cache_due, set, set_len, 1, 4, argv, argvlen,
                    poll_cb, NULL);
    free(set);
}

static void
sub_cb(enum ld_pubsub_event ev, const char *msg, size_t len, void *arg)
{
    LD_UNUSED(msg);
    LD_UNUSED(len);
    LD_UNUSED(arg);
    if (ev != LD_PUBSUB_LOST) {
        due_mod.active = true;
        due_mod.again = due_mod.polling;
        cache_due_poll();
    }
}

void
cache_due_init(void)
{
    size_t set_len;
    char *set = due_set_name(&set_len);
    memset(&due_mod, 0, sizeof(due_mod));
    due_mod.sub = ld_pubsub_subscribe(set, set_len, sub_cb, NULL);
    free(set);
}

void
cache_due_free(void)
{
    if (due_mod.sub != NULL) {
        ld_pubsub_unsubscribe(due_mod.sub);
        due_mod.sub = NULL;
    }
}
