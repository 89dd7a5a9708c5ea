/*
 * Reading: keys, fetches, waiting and the single flight of cache.get and
 * cache.mget (see the overview in ld_cache.c).
 *
 * The states of a getter (one key of a cache.get or a cache.mget,
 * enum gstate):
 *   G_IDLE   set up by getter_begin.
 *            -> G_DONE   answered at once: a first delete of the key is
 *                        owed (a miss), or a near hit (cache.mget; a
 *                        cache.get looks before it makes a getter);
 *            -> G_FETCH  attached to the key's fetch in flight when it
 *                        is recent enough (same generation, a lease asked
 *                        for if it wants one), else to a new fetch.
 *   G_FETCH  on fetch->getters, until fetch_cb.
 *            -> G_DONE   the answer settles it: a hit, a cached null, a
 *                        miss, a stale value, a lease (to the first getter
 *                        that wants one), an error; or it may not wait;
 *            -> G_WAIT   somebody else holds the lease and it may wait.
 *   G_WAIT   on ckey->waiters (counted in limits.max_waiters); the key
 *            is subscribed to its channel and its timer armed.
 *            -> G_FETCH  a message, the subscription's confirmation, the
 *                        end of the holder's lease, the getter's deadline
 *                        or a local write wakes every waiter into one new
 *                        fetch (ckey_refresh); past its deadline, that
 *                        fetch answers it a miss.
 *   G_FETCH and G_WAIT -> G_DONE on cancel (a miss) or at shutdown.
 *   G_DONE   answered (cache_getter_done); its op is freed with the last.
 *
 * It owns the keys (struct ckey), the fetches and the waiters; answering them
 * is ld_cache_reply.c's, and it writes nothing in Redis but the return of a
 * lease nobody can use.
 */
#include "ld_cache_int.h"

#include "ld_cache_hot.h"

#include "ld_bloom.h"
#include "ld_cancel.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dict.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_near.h"
#include "ld_proto.h"
#include "ld_pubsub.h"
#include "ld_redis.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

/* PTTL is rounded and Redis expires a key a little after its time; waking
 * a touch late saves a fetch that would only find the lease still there. */
#define LEASE_SLACK_US 3000

/* ---- keys, fetches and waiting --------------------------------------- */

static void fetch_cb(redisReply *reply, void *arg);
static void ckey_timer_cb(evutil_socket_t fd, short what, void *arg);

/* A key record is made and dropped for most reads, and its timer with
 * it: the timers of dropped records are kept for the next ones (up to
 * SPARE_TIMERS), which spares an event_new and an event_free a read. */
#define SPARE_TIMERS 64
static struct {
    struct event *spare_timers[SPARE_TIMERS];
    size_t n_spare_timers;
} get_mod;

void
cache_ckey_spares_free(void)
{
    while (get_mod.n_spare_timers > 0) {
        event_free(get_mod.spare_timers[--get_mod.n_spare_timers]);
    }
}

static struct ckey *
ckey_get(const char *key, size_t len)
{
    struct ckey *ck = ld_dict_get(cache_mod.keys, key, len);
    if (ck != NULL) {
        return ck;
    }
    size_t nsize = cache_names_size(len);
    ck = ld_xmalloc(sizeof(*ck) + len + 1 + nsize);
    memset(ck, 0, sizeof(*ck));
    ck->key = (char *)(ck + 1);
    memcpy(ck->key, key, len);
    ck->key[len] = '\0';
    ck->names = ck->key + len + 1;
    cache_put_names(ck->names, key, len, &ck->entry_len, &ck->chan_len);
    if (get_mod.n_spare_timers > 0) {
        ck->timer = get_mod.spare_timers[--get_mod.n_spare_timers];
        evtimer_assign(ck->timer, cache_mod.ctx->base, ckey_timer_cb, ck);
    } else {
        ck->timer = evtimer_new(cache_mod.ctx->base, ckey_timer_cb, ck);
    }
    if (ck->timer == NULL) {
        ld_oom_in("evtimer_new");
    }
    ck->key_len = len;
    glist_init(&ck->waiters);
    ld_dict_set(cache_mod.keys, key, len, ck);
    return ck;
}

/* Forget a key nobody reads or waits for any more. */
void
cache_ckey_maybe_free(struct ckey *ck)
{
    if (ck->waiters.n > 0 || ck->nfetch > 0) {
        return;
    }
    LD_ASSERT(ck->fetch == NULL);
    if (ck->sub != NULL) {
        ld_pubsub_unsubscribe(ck->sub);
    }
    if (get_mod.n_spare_timers < SPARE_TIMERS) {
        event_del(ck->timer);
        get_mod.spare_timers[get_mod.n_spare_timers++] = ck->timer;
    } else {
        event_free(ck->timer);
    }
    ld_dict_del(cache_mod.keys, ck->key, ck->key_len);
    free(ck);
}

static bool
attachable(const struct ckey *ck, bool want_lease)
{
    return ck->fetch != NULL && ck->fetch->gen == ck->gen &&
           (ck->fetch->grant || !want_lease);
}

/* Send F's probe. Most reads are hits: one plain command answers them,
 * with no script and no lease token. Only when it finds no value does
 * the script run, to decide about the lease atomically. Under
 * cache.layout 2 it is a GET of the entry's string. Under layout 1 an
 * HMGET, where each field costs Redis about 0.8k instructions: the load
 * time d matters only to a reader that may refresh early, so it is last,
 * asked for only then (parse_probe tells by the reply's length). */
static void
probe_send(struct fetch *f)
{
    struct ckey *ck = f->ck;
    static const char *fields[] = {"HMGET", NULL, "v", "n", "s", "r", "d"};
    const char *argv[7];
    size_t argvlen[7] = {5, ck->entry_len, 1, 1, 1, 1, 1};
    memcpy(argv, fields, sizeof(argv));
    argv[1] = ck->names;
    int argc = f->grant && cache_mod.ctx->cfg->cache.early_refresh ? 7 : 6;
    if (cache_mod.ctx->cfg->cache.layout == 2) {
        argv[0] = "GET";
        argvlen[0] = 3;
        argc = 2;
    }
    ld_redis_command(ck->names, ck->entry_len, argc, argv, argvlen, fetch_cb,
                     f);
    ld_near_read_sent(f->near);
}

/* The probes a cache.mget holds back while it starts its fetches, to send
 * them as one MGET (cache.layout 2; see cache_op_mget). */
struct probes {
    size_t n, cap;
    struct fetch **f;
};

static struct probes *held_probes;

static void
probes_cb(redisReply *reply, void *arg)
{
    struct probes *p = arg;
    bool each = reply != NULL && reply->type == REDIS_REPLY_ARRAY &&
                reply->elements == p->n;
    /* An element is what the fetch's own GET would have answered: a
     * string, or nil for no key and for a key of another type (a hash:
     * the script reads it). Anything else reaches every fetch. */
    for (size_t i = 0; i < p->n; i++) {
        fetch_cb(each ? reply->element[i] : reply, p->f[i]);
    }
    free(p->f);
    free(p);
}

static void
probes_send(struct probes *held)
{
    if (held->n <= 1) {
        if (held->n == 1) {
            probe_send(held->f[0]);
        }
        free(held->f);
        return;
    }
    struct probes *p = ld_xcalloc(1, sizeof(*p));
    *p = *held;
    const char **argv = ld_xcalloc(p->n + 1, sizeof(*argv));
    size_t *argvlen = ld_xcalloc(p->n + 1, sizeof(*argvlen));
    argv[0] = "MGET";
    argvlen[0] = 4;
    for (size_t i = 0; i < p->n; i++) {
        argv[i + 1] = p->f[i]->ck->names;
        argvlen[i + 1] = p->f[i]->ck->entry_len;
    }
    struct ckey *first = p->f[0]->ck;
    ld_redis_command(first->names, first->entry_len, (int)p->n + 1, argv,
                     argvlen, probes_cb, p);
    free(argv);
    free(argvlen);
}

static struct fetch *
fetch_start(struct ckey *ck, bool grant)
{
    struct fetch *f = ld_xcalloc(1, sizeof(*f));
    f->ck = ck;
    f->gen = ck->gen;
    /* A lease taken while a first delete is owed would be voided by it. */
    f->grant = grant && !cache_first_owed(ck->key, ck->key_len);
    f->withheld = grant && !f->grant;
    glist_init(&f->getters);
    LIST_INSERT_HEAD(&cache_mod.fetches, f, link);
    ck->fetch = f;
    ck->nfetch++;
    f->probing = true;
    f->near = ld_near_read_begin(ck->key, ck->key_len, ck->names,
                                 ck->entry_len);
    /* A read the near cache may keep goes alone: its GET must sit between
     * its CLIENT CACHING and its PTTL. */
    if (held_probes != NULL && f->near == NULL) {
        struct probes *p = held_probes;
        if (p->n == p->cap) {
            p->cap = p->cap ? 2 * p->cap : 16;
            p->f = ld_xrealloc(p->f, p->cap * sizeof(*p->f));
        }
        p->f[p->n++] = f;
        return f;
    }
    probe_send(f);
    return f;
}

static int
fetch_send_script(struct fetch *f)
{
    struct ckey *ck = f->ck;
    if (f->grant && ld_token_new(f->token) != LD_OK) {
        return LD_ERR;
    }
    const struct ld_config *cfg = cache_mod.ctx->cfg;
    char lease_ms[24], beta[32], unit[32];
    snprintf(lease_ms, sizeof(lease_ms), "%lld", cfg->cache.fill_lease_ms);
    snprintf(beta, sizeof(beta), "%.6g", cfg->cache.early_refresh_beta);
    /* In (0, 1]: ln(0) would be an endless refresh time. */
    snprintf(unit, sizeof(unit), "%.17g", 1.0 - ld_random_unit());
    const char *argv[] = {ck->names,
                          f->token,
                          lease_ms,
                          f->grant ? "1" : "0",
                          cfg->cache.early_refresh ? "1" : "0",
                          beta,
                          unit};
    size_t argvlen[] = {
        ck->entry_len, strlen(f->token), strlen(lease_ms), 1, 1,
        strlen(beta),  strlen(unit)};
    ld_redis_script(LD_SCRIPT_cache_get, ck->names, ck->entry_len, 1, 7, argv,
                    argvlen, fetch_cb, f);
    return LD_OK;
}

/* Put G on a fetch of its key: the one in flight when it is fresh enough,
 * else a new one. */
static void
getter_fetch(struct getter *g)
{
    struct ckey *ck = g->ck;
    struct fetch *f = attachable(ck, g->want_lease)
                          ? ck->fetch
                          : fetch_start(ck, g->want_lease);
    g->state = G_FETCH;
    g->fetch = f;
    struct getter *last = TAILQ_LAST(&f->getters.q, gq);
    if (last != NULL && last->seq > g->seq) {
        struct glist one;
        glist_init(&one);
        glist_push(&one, g);
        glist_merge(&f->getters, &one);
    } else {
        glist_push(&f->getters, g);
    }
}

/* The waiters need a fresh look at the entry: one fetch for all. */
static void
ckey_refresh(struct ckey *ck)
{
    if (ck->waiters.n == 0) {
        return;
    }
    struct fetch *f = attachable(ck, true) ? ck->fetch : fetch_start(ck, true);
    struct getter *g;
    TAILQ_FOREACH(g, &ck->waiters.q, link)
    {
        LD_ASSERT(g->state == G_WAIT);
        g->state = G_FETCH;
        g->fetch = f;
    }
    glist_merge(&f->getters, &ck->waiters);
    event_del(ck->timer);
}

static void
ckey_wake(struct ckey *ck)
{
    ck->gen++;
    ckey_refresh(ck);
}

static void
ckey_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    ckey_wake(arg);
}

void
cache_ckey_arm(struct ckey *ck)
{
    if (ck->waiters.n == 0) {
        event_del(ck->timer);
        return;
    }
    uint64_t at = ck->lease_end_us;
    struct getter *g;
    TAILQ_FOREACH(g, &ck->waiters.q, link)
    {
        if (at == 0 || g->deadline_us < at) {
            at = g->deadline_us;
        }
    }
    uint64_t now = ld_now_us();
    cache_set_timer(ck->timer, at > now ? at - now : 0);
}

static void
sub_cb(enum ld_pubsub_event ev, const char *msg, size_t len, void *arg)
{
    LD_UNUSED(msg);
    LD_UNUSED(len);
    struct ckey *ck = arg;
    /* SUBSCRIBED as well as MESSAGE: a fill may have landed between the
     * fetch that said "held" and the moment we started listening. LOST
     * needs nothing, SUBSCRIBED follows it. */
    if (ev == LD_PUBSUB_MESSAGE || ev == LD_PUBSUB_SUBSCRIBED) {
        ckey_wake(ck);
    }
}

/* A lease nobody can use any more (its getter went away meanwhile): give
 * it back so that others need not wait for it to run out. */
static void
ignore_cb(redisReply *reply, void *arg)
{
    LD_UNUSED(reply);
    LD_UNUSED(arg);
}

static void
release_unused(const struct ckey *ck, const char *token)
{
    const char *argv[] = {ck->names, token, ck->names};
    size_t argvlen[] = {ck->entry_len, strlen(token), ck->chan_len};
    ld_redis_script(LD_SCRIPT_cache_release, ck->names, ck->entry_len, 1, 3,
                    argv, argvlen, ignore_cb, NULL);
}

/* What a read found. R_HIT to R_WRONG are also the answers of the
 * cache_get script, by the names in get_replies (its header comment lists
 * them); R_DOWN and R_ERROR are Redis' silence and anything else. */
enum fres {
    R_HIT,
    R_NULL,
    R_HELD,
    R_GRANTED,
    R_MISS,
    R_WRONG,
    R_STALE,
    R_STALE_GRANTED,
    R_REFRESH,
    R_DOWN,
    R_ERROR
};

/* A value as a read found it: in a reply, maybe past the layout 2
 * string's header. */
struct cval {
    const char *str;
    size_t len;
};

static const struct {
    const char *name;
    enum fres res;
} get_replies[] = {
    {"hit", R_HIT},         /* {"hit", value} */
    {"null", R_NULL},       /* a cached "not found" */
    {"held", R_HELD},       /* {"held", pttl}: another caller's lease */
    {"granted", R_GRANTED}, /* the lease token sent is now the lease */
    {"miss", R_MISS},       /* nothing there, no lease asked for */
    {"wrong_type", R_WRONG},
    {"stale", R_STALE},                 /* {"stale", value}: leased */
    {"stale_granted", R_STALE_GRANTED}, /* {.., value}: and ours now */
    {"refresh", R_REFRESH}, /* {"refresh", value}: reload it early */
};

static enum fres
parse_fetch(const redisReply *r, struct cval *value, long long *pttl,
            uint64_t *version)
{
    /* A Redis refusing the script's writes (NOREPLICAS, OOM) cannot
     * serve the get either: the same answer as one that is away. */
    if (r == NULL || ld_reply_is_unavailable(r)) {
        return R_DOWN;
    }
    /* A lease granted on an absent key: a bare 1 (cache_get.lua). */
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) {
        return R_GRANTED;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
        r->element[0]->type != REDIS_REPLY_STRING) {
        return R_ERROR;
    }
    enum fres res = R_ERROR;
    for (size_t i = 0; i < LD_ARRAY_LEN(get_replies); i++) {
        if (strcmp(r->element[0]->str, get_replies[i].name) == 0) {
            res = get_replies[i].res;
            break;
        }
    }
    switch (res) {
    case R_HIT:
    case R_STALE:
    case R_STALE_GRANTED:
    case R_REFRESH:
        if (r->elements < 3 || r->element[1]->type != REDIS_REPLY_STRING ||
            r->element[2]->type != REDIS_REPLY_INTEGER ||
            r->element[2]->integer < 0) {
            return R_ERROR;
        }
        value->str = r->element[1]->str;
        value->len = r->element[1]->len;
        *version = (uint64_t)r->element[2]->integer;
        break;
    case R_NULL:
        if (r->elements < 2 || r->element[1]->type != REDIS_REPLY_INTEGER ||
            r->element[1]->integer < 0) {
            return R_ERROR;
        }
        *version = (uint64_t)r->element[1]->integer;
        break;
    case R_HELD:
        if (r->elements < 2 || r->element[1]->type != REDIS_REPLY_INTEGER) {
            return R_ERROR;
        }
        *pttl = r->element[1]->integer;
        break;
    default:
        break;
    }
    return res;
}

static void
fetch_unlink(struct fetch *f)
{
    LIST_REMOVE(f, link);
}

/* Version digits S of N bytes (1..16, up to CACHE_VERSION_MAX) into
 * *VERSION; false for anything else, which is not ours. */
static bool
version_digits(const char *s, size_t n, uint64_t *version)
{
    if (n == 0 || n > 16) {
        return false;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *version = v;
    return v <= (uint64_t)CACHE_VERSION_MAX;
}

/* The version field R as the HMGET probe read it: an entry written
 * before versions has none and reads as 1 (cache_shape.lua's
 * entry_version). */
static bool
probe_version(const redisReply *r, uint64_t *version)
{
    if (r->type != REDIS_REPLY_STRING) {
        *version = 1;
        return true;
    }
    return version_digits(r->str, r->len, version);
}

/* The GET probe's string S (cache.layout 2, as src/lua/lib/cache_text.lua
 * reads it): 0xF5 "L", "v" or "n", the version's digits, ":", the load
 * time's digits, ":", the value. WANT_D: a reader that may refresh early,
 * for whom a value with a load time goes to the script. */
static enum fres
parse_text(const redisReply *r, bool want_d, struct cval *value,
           uint64_t *version)
{
    const char *s = r->str, *end = s + r->len;
    if (r->len < 5 || (unsigned char)s[0] != 0xF5 || s[1] != 'L' ||
        (s[2] != 'v' && s[2] != 'n')) {
        return R_MISS; /* not ours: the script says so */
    }
    const char *ver = s + 3;
    const char *colon = memchr(ver, ':', (size_t)(end - ver));
    if (colon == NULL ||
        !version_digits(ver, (size_t)(colon - ver), version)) {
        return R_MISS;
    }
    const char *d = colon + 1;
    const char *vstart = memchr(d, ':', (size_t)(end - d));
    if (vstart == NULL) {
        return R_MISS;
    }
    for (const char *p = d; p < vstart; p++) {
        if (*p < '0' || *p > '9') {
            return R_MISS;
        }
    }
    vstart++;
    if (s[2] == 'n') {
        return d == vstart - 1 && vstart == end ? R_NULL : R_MISS;
    }
    if (want_d && d < vstart - 1) {
        return R_MISS;
    }
    value->str = vstart;
    value->len = (size_t)(end - vstart);
    return R_HIT;
}

/* The probe (a GET under cache.layout 2; else an HMGET of v, n, s, r and,
 * from a reader that may refresh early, d) decides hits, cached nulls and
 * an unreachable Redis; R_MISS means "ask the script", which a stale mark
 * always does, and so does a value whose load time d came back, and a key
 * of the other layout's type or of neither (the script reads both and
 * tells what is not ours). */
static enum fres
parse_probe(const redisReply *r, bool want_d, struct cval *value,
            uint64_t *version)
{
    if (r == NULL) {
        return R_DOWN;
    }
    if (ld_reply_is_error(r, "WRONGTYPE")) {
        return R_MISS;
    }
    if (r->type == REDIS_REPLY_STRING) {
        return parse_text(r, want_d, value, version);
    }
    if (r->type == REDIS_REPLY_NIL) {
        return R_MISS;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 || r->elements > 5) {
        return R_ERROR;
    }
    if (r->element[2]->type == REDIS_REPLY_STRING ||
        (r->elements == 5 && r->element[4]->type == REDIS_REPLY_STRING) ||
        !probe_version(r->element[3], version)) {
        return R_MISS;
    }
    if (r->element[0]->type == REDIS_REPLY_STRING &&
        r->element[1]->type != REDIS_REPLY_STRING) {
        value->str = r->element[0]->str;
        value->len = r->element[0]->len;
        return R_HIT;
    }
    if (r->element[1]->type == REDIS_REPLY_STRING &&
        r->element[0]->type != REDIS_REPLY_STRING) {
        /* Anything but our "1" (or a null beside a value) is not ours:
         * the script says so. */
        if (r->element[1]->len == 1 && r->element[1]->str[0] == '1') {
            return R_NULL;
        }
    }
    return R_MISS;
}

/* A read answered while a first delete of its key is owed (the
 * invalidation came while the read was on its way, or Redis was down):
 * what it found is what the invalidation voided, and a lease on it would
 * be voided by the delete. It reads as a lease held elsewhere: a getter
 * that may wait waits for the delete (cache_key_deleted wakes it), the
 * others get a miss without a lease, as getter_begin gives. A lease it
 * took goes back; fetch_start asks for none meanwhile. */
static enum fres
owed_held(struct fetch *f, enum fres res, long long *pttl)
{
    if (res == R_DOWN || res == R_ERROR || res == R_WRONG ||
        !cache_first_owed(f->ck->key, f->ck->key_len)) {
        return res;
    }
    if (res == R_GRANTED || res == R_STALE_GRANTED || res == R_REFRESH) {
        release_unused(f->ck, f->token);
    }
    *pttl = -1;
    return R_HELD;
}

/* Whether F, sent without the lease its getters wanted because a first
 * delete was owed, may ask for it now: the delete was carried out while
 * F was on its way (its published message can overtake its answer, and
 * wake the waiters first). F then asks the script again, with a lease,
 * instead of answering a miss or a stale value without one. */
static bool
lease_now_free(struct fetch *f)
{
    if (!f->withheld || cache_first_owed(f->ck->key, f->ck->key_len)) {
        return false;
    }
    f->withheld = false;
    f->grant = true;
    return true;
}

void
cache_key_deleted(const char *key, size_t len)
{
    struct ckey *ck = ld_dict_get(cache_mod.keys, key, len);
    if (ck != NULL) {
        ckey_refresh(ck);
    }
}

/* What a fetch found, as its getters are told. */
struct answer {
    enum fres res;
    struct cval value; /* R_HIT, R_STALE*, R_REFRESH */
    uint64_t version;  /* of the value, or of R_NULL's null */
    long long pttl;    /* R_HELD: the lease's, -1 if unknown */
    const char *token; /* the lease a grant brought */
    bool given;        /* that lease went to a getter */
    uint64_t now;
    char downmsg[256]; /* R_DOWN */
    char errmsg[160];  /* R_ERROR, R_WRONG */
};

/* Read F's reply into A. False when F went out again (the probe found no
 * answer and the script is on its way, or a lease just came free): its
 * getters stay on it. */
static bool
fetch_read(struct fetch *f, const redisReply *reply, struct answer *a)
{
    struct ckey *ck = f->ck;
    if (f->probing) {
        f->probing = false;
        bool want_d = f->grant && cache_mod.ctx->cfg->cache.early_refresh;
        a->res = parse_probe(reply, want_d, &a->value, &a->version);
        const struct cval *value = &a->value;
        bool keep = a->res == R_HIT && !cache_first_owed(ck->key, ck->key_len);
        ld_near_read_version(f->near, a->version);
        ld_near_read_done(f->near, ld_redis_conn_id(),
                          keep ? value->str : NULL, keep ? value->len : 0);
        f->near = NULL;
        if (a->res == R_MISS) {
            lease_now_free(f);
            if (fetch_send_script(f) == LD_OK) {
                return false; /* still in flight, getters still attached */
            }
            a->res = R_ERROR;
        }
    } else {
        a->res = parse_fetch(reply, &a->value, &a->pttl, &a->version);
        if ((a->res == R_MISS || a->res == R_STALE) && lease_now_free(f) &&
            fetch_send_script(f) == LD_OK) {
            return false; /* asked again, with a lease */
        }
    }
    a->res = owed_held(f, a->res, &a->pttl);
    return true;
}

/* The messages A's getters get, while ld_redis can still tell the cause
 * of a failure (only inside the reply callback). */
static void
answer_messages(struct answer *a, const struct ckey *ck,
                const redisReply *reply)
{
    if (a->res == R_DOWN) {
        snprintf(a->downmsg, sizeof(a->downmsg), "redis unavailable: %s",
                 reply != NULL ? reply->str
                 : ld_redis_failure_reason()[0] != '\0'
                     ? ld_redis_failure_reason()
                     : "no answer");
    }
    if (a->res == R_ERROR) {
        snprintf(a->errmsg, sizeof(a->errmsg),
                 "unexpected reply to cache.get: %s",
                 reply != NULL && reply->type == REDIS_REPLY_ERROR
                     ? reply->str
                     : "bad shape");
        log_error("cache script failed op=cache.get key=\"%.*s\" "
                  "error=\"%s\"",
                  (int)(ck->key_len > 200 ? 200 : ck->key_len), ck->key,
                  a->errmsg);
    }
    if (a->res == R_WRONG) {
        snprintf(a->errmsg, sizeof(a->errmsg),
                 "the Redis key of entry '%.*s' "
                 "holds data leased did not write; nothing was changed",
                 (int)(ck->key_len > 60 ? 60 : ck->key_len), ck->key);
    }
}

/* F is answered: its key no longer counts it in flight. */
static void
fetch_detach(struct fetch *f)
{
    struct ckey *ck = f->ck;
    fetch_unlink(f);
    LD_ASSERT(ck->nfetch > 0);
    ck->nfetch--;
    if (ck->fetch == f) {
        ck->fetch = NULL;
    }
}

/* When the lease the answer tells of ends: the waiters' timer. */
static void
note_lease_end(struct ckey *ck, const struct answer *a)
{
    if (a->res == R_HELD) {
        ck->lease_end_us = a->pttl >= 0 ? a->now + (uint64_t)a->pttl * 1000 +
                                              LEASE_SLACK_US
                                        : 0;
    } else if (a->res == R_GRANTED) {
        ck->lease_end_us = a->now +
                           (uint64_t)cache_mod.ctx->cfg->cache.fill_lease_ms *
                               1000 +
                           LEASE_SLACK_US;
    }
}

/* The answers that brought a lease: it goes to the first getter that
 * wants one; the others get the value without it, or wait (false) when
 * there is no value yet. */
static bool
settle_leased(struct getter *g, struct answer *a)
{
    const struct cval *value = &a->value;
    bool given = a->given;
    switch (a->res) {
    case R_STALE_GRANTED:
        if (g->want_lease && !given) {
            a->given = true;
            ld_stats.cache_leases_granted++;
            cache_settle_stale(g, value->str, value->len, a->token,
                               a->version);
            return true;
        }
        cache_settle_stale(g, value->str, value->len, NULL, a->version);
        return true;
    case R_REFRESH:
        if (g->want_lease && !given) {
            a->given = true;
            ld_stats.cache_refreshes_granted++;
            cache_settle_refresh(g, value->str, value->len, a->token,
                                 a->version);
            return true;
        }
        cache_settle_hit(g, value->str, value->len, a->version);
        return true;
    case R_GRANTED:
        if (g->want_lease && !given) {
            a->given = true;
            ld_stats.cache_leases_granted++;
            cache_settle_miss(g, a->token);
            return true;
        }
        return false;
    default:
        return false;
    }
}

/* Answer G from A when A answers it; false when somebody else loads the
 * value (the lease is held, or was granted to an earlier getter). */
static bool
settle_from_answer(struct getter *g, struct answer *a)
{
    const struct cval *value = &a->value;
    switch (a->res) {
    case R_HIT:
        cache_settle_hit(g, value->str, value->len, a->version);
        return true;
    case R_NULL:
        cache_settle_null(g, a->version);
        return true;
    case R_WRONG:
        cache_getter_settle(g, NULL, LD_E_WRONG_TYPE, a->errmsg);
        return true;
    case R_DOWN:
        cache_getter_settle(g, NULL, LD_E_REDIS_UNAVAILABLE, a->downmsg);
        return true;
    case R_ERROR:
        cache_getter_settle(g, NULL, LD_E_INTERNAL, a->errmsg);
        return true;
    case R_MISS:
        cache_settle_miss(g, NULL);
        return true;
    case R_STALE:
        cache_settle_stale(g, value->str, value->len, NULL, a->version);
        return true;
    case R_STALE_GRANTED:
    case R_REFRESH:
    case R_GRANTED:
        return settle_leased(g, a);
    case R_HELD:
        return false;
    }
    return false;
}

/* Somebody else loads the value: G waits for it onto KEEP, unless it may
 * not wait (no lease wanted, or its wait is over) or too many wait. */
static void
wait_or_miss(struct getter *g, uint64_t now, struct glist *keep)
{
    if (!g->want_lease || now >= g->deadline_us) {
        cache_settle_miss(g, NULL);
    } else if (!g->holds_place &&
               cache_mod.n_waiters >= cache_mod.ctx->cfg->limits.max_waiters) {
        /* Counted one by one as they are parked: one fetch may bring any
         * number of new waiters at once. */
        cache_getter_settle(g, NULL, LD_E_BUSY,
                            "too many waiters (limits.max_waiters)");
    } else {
        if (!g->waited) {
            g->waited = true;
            ld_stats.cache_waits++;
        }
        if (!g->holds_place) {
            g->holds_place = true;
            cache_mod.n_waiters++;
        }
        g->state = G_WAIT;
        glist_push(keep, g);
    }
}

/* The getters KEEP wait on CK for the value somebody else loads. */
static void
ckey_park(struct ckey *ck, struct glist *keep, uint64_t sent_gen)
{
    glist_merge(&ck->waiters, keep);
    if (ck->sub == NULL) {
        ck->sub = ld_pubsub_subscribe(ck->names, ck->chan_len, sub_cb, ck);
    }
    /* Something happened to the entry while this answer was on its way
     * (a message, a local write): the "held" it says may already be
     * stale, and the wake-up that said so went to others. */
    if (ck->gen != sent_gen) {
        ckey_refresh(ck);
    }
}

static void
fetch_cb(redisReply *reply, void *arg)
{
    struct fetch *f = arg;
    struct ckey *ck = f->ck;
    struct answer a = {.pttl = -1, .token = f->token};

    if (ck == NULL) {
        ld_near_read_done(f->near, 0, NULL, 0);
        free(f); /* orphaned by ld_cache_free; its getters were answered */
        return;
    }
    if (!fetch_read(f, reply, &a)) {
        return;
    }
    answer_messages(&a, ck, reply);
    fetch_detach(f);
    a.now = ld_now_us();
    note_lease_end(ck, &a);

    struct glist keep;
    glist_init(&keep);
    struct getter *g;
    while ((g = glist_pop(&f->getters)) != NULL) {
        g->fetch = NULL;
        g->state = G_IDLE;
        if (!settle_from_answer(g, &a)) {
            wait_or_miss(g, a.now, &keep);
        }
    }
    if ((a.res == R_GRANTED || a.res == R_STALE_GRANTED ||
         a.res == R_REFRESH) &&
        !a.given) {
        release_unused(ck, f->token);
    }
    uint64_t sent_gen = f->gen;
    free(f);

    if (keep.n > 0) {
        ckey_park(ck, &keep, sent_gen);
    }
    cache_ckey_arm(ck);
    cache_ckey_maybe_free(ck);
}

/* ---- cache.get / cache.mget ------------------------------------------ */

static struct cop *
cop_new(struct ld_req *req, size_t n, bool mget)
{
    /* N is at most CACHE_MAX_KEYS: small. */
    struct cop *op = ld_xcalloc(1, sizeof(*op));
    op->req = req;
    op->mget = mget;
    op->n = n;
    op->left = n;
    op->g = n == 1 ? &op->g1 : ld_xcalloc(n, sizeof(*op->g));
    if (mget) {
        op->texts = ld_xcalloc(n, sizeof(*op->texts));
        op->leased = ld_xcalloc(n, sizeof(*op->leased));
        op->dup_of = ld_xmalloc(n * sizeof(*op->dup_of));
    }
    return op;
}

/* The value the near cache keeps for KEY; a hit counts for the hot keys
 * here, for it never reaches a ckey. */
static bool
near_lookup(const char *key, size_t len, uint64_t now_us, const char **v,
            size_t *vlen, uint64_t *version)
{
    if (!ld_near_get_version(key, len, now_us, v, vlen, version)) {
        return false;
    }
    if (ld_cache_hot_enabled()) {
        ld_cache_hot_note(key, len, true, now_us / 1000);
    }
    return true;
}

/* Set up slot I of OP for KEY and send it on its way. */
static void
getter_begin(struct cop *op, size_t i, const char *key, size_t len,
             bool want_lease, long long wait_ms)
{
    struct getter *g = &op->g[i];
    g->op = op;
    g->slot = i;
    g->want_lease = want_lease;
    g->seq = ++cache_mod.next_seq;
    g->deadline_us = ld_now_us() + (uint64_t)wait_ms * 1000;
    if (cache_first_owed(key, len)) {
        /* An invalidation whose first delete has not reached Redis yet
         * (Redis is down, or the delete is on its way): the value Redis
         * still holds is the one it voided, and a lease would be voided
         * by the delete. */
        cache_settle_miss(g, NULL);
        return;
    }
    const char *v;
    size_t vlen;
    uint64_t version;
    /* cache.get has looked already (a second look would count a miss
     * twice towards cache.near.min_hits). */
    if (op->mget &&
        near_lookup(key, len, op->req->start_us, &v, &vlen, &version)) {
        cache_settle_near_hit(g, v, vlen, version);
        return;
    }
    g->ck = ckey_get(key, len);
    getter_fetch(g);
}

/* The optional fields of a cache.get (MGET false) or a cache.mget; BLOOM
 * (cache.get only) gets the filter named, NULL for none. */
static int
get_params(struct ld_req *req, bool mget, long long *wait_ms, bool *lease,
           const char **bloom, size_t *bloom_len)
{
    *wait_ms = cache_mod.ctx->cfg->cache.wait_ms;
    *lease = true;
    *bloom = NULL;
    /* The usual request is op and key (or keys), perhaps an id: nothing
     * else to look up (two lookups of absent fields were a tenth of a
     * near hit's own work). */
    if (ld_req_nfields(req) == 2 + (req->id != NULL)) {
        return LD_OK;
    }
    if (ld_req_int(req, "wait_ms", false, 0, LD_WAIT_MS_MAX, wait_ms, NULL) !=
            LD_OK ||
        ld_req_bool(req, "lease", lease) != LD_OK) {
        return LD_ERR;
    }
    if (!ld_req_has(req, "bloom")) {
        return LD_OK;
    }
    if (mget) {
        /* One filter check per key would be one more round trip per
         * slot: cache.mget's callers check with bloom.check first. */
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'bloom' is for cache.get; cache.mget does not "
                       "take it (ask bloom.check first)");
        return LD_ERR;
    }
    bool present;
    if (ld_req_str(req, "bloom", false, bloom, bloom_len, &present) != LD_OK) {
        return LD_ERR;
    }
    if (!present) {
        *bloom = NULL;
    } else if (!ld_key_valid(*bloom, *bloom_len)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "field 'bloom' must name a filter: not empty, at "
                       "most limits.max_key_bytes, no NUL");
        return LD_ERR;
    }
    return LD_OK;
}

static bool
drop_if_closed(struct ld_req *req)
{
    /* A request of a session that has closed: its close hook has run,
     * so nothing may be parked for it. */
    if (!ld_req_session_open(req)) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the session has ended");
        return true;
    }
    return false;
}

/* cancel: the wait ends as if wait_ms had run out, with a miss and no
 * lease; a lease the fetch still brings back goes unused, so fetch_cb
 * gives it back. */
static bool
get_cancel(void *arg)
{
    struct cop *op = arg;
    struct getter *g = &op->g[0];
    struct ckey *ck = g->ck;
    if (g->state == G_FETCH) {
        glist_remove(&g->fetch->getters, g);
        g->fetch = NULL;
    } else if (g->state == G_WAIT) {
        glist_remove(&ck->waiters, g);
    } else {
        return false;
    }
    g->state = G_IDLE;
    cache_settle_miss(g, NULL);
    cache_ckey_arm(ck);
    cache_ckey_maybe_free(ck);
    return true;
}

static void get_go(struct ld_req *req, const char *key, size_t len,
                   long long wait_ms, bool lease);

/* A cache.get whose filter is asked first. */
struct bloom_get {
    struct ld_req *req;
    const char *key; /* in REQ */
    size_t len;
    long long wait_ms;
    bool lease;
};

/* The filter ruled the key out: it was never added, so it does not
 * exist, and the answer is the one a cached null gives, marked as the
 * filter's, with no read of the entry and no lease. Maybe: the usual
 * cache.get. */
static void
bloom_cb(enum ld_bloom_says says, int code, const char *msg, void *arg)
{
    struct bloom_get *b = arg;
    struct ld_req *req = b->req;
    if (says == LD_BLOOM_ERROR) {
        ld_reply_error(req, code, "%s", msg);
    } else if (!cache_mod.inited) {
        ld_reply_error(req, LD_E_SHUTTING_DOWN, "the daemon is stopping");
    } else if (says == LD_BLOOM_NO) {
        ld_stats.cache_bloom_hits++;
        ld_reply_ok(req,
                    json_pack("{s:b,s:n,s:b}", "hit", 1, "value", "bloom", 1));
    } else if (!drop_if_closed(req)) {
        get_go(req, b->key, b->len, b->wait_ms, b->lease);
    }
    free(b);
}

void
cache_op_get(struct ld_req *req)
{
    const char *key;
    size_t len;
    long long wait_ms;
    bool lease;
    const char *bloom;
    size_t bloom_len;

    if (ld_req_key(req, "key", &key, &len) != LD_OK ||
        get_params(req, false, &wait_ms, &lease, &bloom, &bloom_len) !=
            LD_OK ||
        drop_if_closed(req)) {
        return;
    }
    if (bloom != NULL) {
        struct bloom_get *b = ld_xmalloc(sizeof(*b));
        *b = (struct bloom_get){req, key, len, wait_ms, lease};
        ld_bloom_check_key(bloom, bloom_len, key, len, bloom_cb, b);
        return;
    }
    get_go(req, key, len, wait_ms, lease);
}

/* cache.get past its checks (and its filter's). */
static void
get_go(struct ld_req *req, const char *key, size_t len, long long wait_ms,
       bool lease)
{
    /* A near hit needs no op, no getter and no cancel hook: it is answered
     * before this returns (a third of its instructions went to them). */
    const char *v;
    size_t vlen;
    uint64_t version;
    /* The request's arrival is the clock of its near hit: one reading
     * of the clock less per hit, microseconds apart. */
    if (!cache_first_owed(key, len) &&
        near_lookup(key, len, req->start_us, &v, &vlen, &version)) {
        cache_reply_near_hit(req, v, vlen, version);
        return;
    }
    struct cop *op = cop_new(req, 1, false);
    cache_cop_link(op);
    if (lease) {
        ld_cancel_on(req, get_cancel, op);
    }
    getter_begin(op, 0, key, len, lease, wait_ms);
}

void
cache_op_mget(struct ld_req *req)
{
    json_t *keys;
    long long wait_ms;
    bool lease;

    const char *bloom;
    size_t bloom_len;

    if (ld_req_keys(req, "keys", CACHE_MAX_KEYS, &keys) != LD_OK ||
        get_params(req, true, &wait_ms, &lease, &bloom, &bloom_len) != LD_OK ||
        drop_if_closed(req)) {
        return;
    }
    size_t n = json_array_size(keys);
    struct cop *op = cop_new(req, n, true);
    struct ld_dict *seen = ld_dict_new();
    /* Count the duplicates out first: the op may complete (and be freed)
     * inside the loop below once every real slot has an answer. */
    for (size_t i = 0; i < n; i++) {
        json_t *k = json_array_get(keys, i);
        const char *s = json_string_value(k);
        size_t len = json_string_length(k);
        void *prev = ld_dict_get(seen, s, len);
        if (prev != NULL) {
            op->dup_of[i] = (size_t)(uintptr_t)prev - 1;
            op->left--;
        } else {
            op->dup_of[i] = SIZE_MAX;
            ld_dict_set(seen, s, len, (void *)(uintptr_t)(i + 1));
        }
    }
    ld_dict_free(seen);
    cache_cop_link(op);
    /* The request body (and KEYS) stays alive as long as REQ does, and
     * REQ is freed with the op: stop touching either once the last slot
     * has settled. Callbacks are never synchronous, so that can only
     * happen here for slots that fail at once. */
    size_t real = op->left;
    /* Under cache.layout 2 the probes of the keys leave as one MGET: one
     * command instead of one per key, as an app would read them. Not on a
     * cluster, where the keys' slots differ. */
    struct probes held = {0};
    if (cache_mod.ctx->cfg->cache.layout == 2 && real > 1 &&
        !ld_redis_is_cluster()) {
        held_probes = &held;
    }
    for (size_t i = 0; i < n && real > 0; i++) {
        if (op->dup_of[i] != SIZE_MAX) {
            continue;
        }
        json_t *k = json_array_get(keys, i);
        real--;
        getter_begin(op, i, json_string_value(k), json_string_length(k), lease,
                     wait_ms);
    }
    held_probes = NULL;
    probes_send(&held);
}
