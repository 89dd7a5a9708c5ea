/*
 * The shared near cache segments (cache.near.shared_bytes): what the near
 * cache keeps, published in shared memory for local clients to read
 * without a round trip (lib/leased/near_layout.h; the writer of one
 * segment is ld_near_shm.c).
 *
 * One segment holds every key, for sessions without a namespace; each
 * Unix entry of listen.namespaces gets one more, holding only the keys
 * under its prefixes, so a client maps only what it may read (token
 * entries get none: a descriptor cannot pass over TCP). ld_near.c calls
 * in on every value it keeps, every entry it drops and every flush, so a
 * segment never holds what the near cache does not: an invalidation is in
 * every segment before the write or the tracking message that caused it
 * is answered or counted.
 *
 * A timer beats every segment every min(shared_stale_ms / 5, 10) ms;
 * readers give up on a segment whose beat is older than shared_stale_ms.
 * The loop checks its timers at least every LOOP_TIMER_CHECK_MS however
 * much work is queued (see ld_server.c), so only a stalled loop, never a
 * busy one, lets a beat lapse.
 *
 * A reload that changes the size, the stale bound or the namespaces
 * closes every segment (readers see it CLOSED and map again) and makes
 * new, empty ones; the near cache is flushed with them, so the two fill
 * again together. This file owns the segments, the beat and the ops
 * near.map and near.hits.
 */
#include "ld_near_int.h"
#include "ld_near_shm.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_features.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_ns.h"
#include "ld_ns_conf.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_util.h"

#include "leased/near_layout.h"

#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The beat's longest period, whatever shared_stale_ms allows. */
#define BEAT_MAX_US 10000
/* near.map replies a session may have waiting for its socket: each holds
 * a descriptor. */
#define MAP_PENDING_MAX 4
/* near.hits figures: far more than a client serves between two reports. */
#define HITS_MAX (1LL << 50)

struct seg {
    struct ld_near_shm *shm;
    /* The entry of SEGS_NS whose keys it holds; NULL: every key. */
    const struct ld_ns_entry *entry;
};

static struct {
    const struct ld_ctx *ctx;
    bool on; /* segments exist */
    /* The settings the segments were made for. */
    long long bytes, stale_ms;
    struct ld_ns_list ns;
    /* SEGS[0] every key; SEGS[1 + i] entry i of NS (shm NULL: none). */
    struct seg *segs;
    size_t nsegs;
    unsigned generation; /* in the segments' names */
    struct event *beat_ev;
} seg_mod;

bool
near_seg_on(void)
{
    return seg_mod.on;
}

static bool
shared_offered(void)
{
    return seg_mod.on;
}

static uint64_t
now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void
beat_all(void)
{
    uint64_t now = now_ns();
    for (size_t i = 0; i < seg_mod.nsegs; i++) {
        if (seg_mod.segs[i].shm != NULL) {
            ld_near_shm_beat(seg_mod.segs[i].shm, now);
        }
    }
}

static void
beat_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    beat_all();
}

static void
segs_destroy(void)
{
    for (size_t i = 0; i < seg_mod.nsegs; i++) {
        if (seg_mod.segs[i].shm != NULL) {
            ld_near_shm_destroy(seg_mod.segs[i].shm);
        }
    }
    free(seg_mod.segs);
    seg_mod.segs = NULL;
    seg_mod.nsegs = 0;
    ld_ns_list_free(&seg_mod.ns);
    seg_mod.on = false;
    if (seg_mod.beat_ev != NULL) {
        event_del(seg_mod.beat_ev);
    }
}

static struct ld_near_shm *
seg_create(const char *what, uint64_t stale_ns)
{
    char name[64];
    snprintf(name, sizeof(name), "leased-near-%u-%s", seg_mod.generation,
             what);
    struct ld_near_shm *shm = ld_near_shm_create(name, (uint64_t)seg_mod.bytes,
                                                 stale_ns);
    if (shm == NULL) {
        log_error("shared near cache segment not made name=%s bytes=%lld "
                  "error=\"%s\"",
                  name, seg_mod.bytes, strerror(errno));
    }
    return shm;
}

/* Segments for the live settings: none when off. A segment that cannot
 * be made is logged and left out (its clients fall back to the socket). */
static void
segs_make(void)
{
    const struct ld_config *c = seg_mod.ctx->cfg;
    seg_mod.bytes = c->cache.near.shared_bytes;
    seg_mod.stale_ms = c->cache.near.shared_stale_ms;
    ld_ns_list_copy(&seg_mod.ns, &c->listen.namespaces);
    if (!c->cache.near.enabled || seg_mod.bytes == 0) {
        return;
    }
    seg_mod.generation++;
    uint64_t stale_ns = (uint64_t)seg_mod.stale_ms * 1000000u;
    seg_mod.nsegs = 1 + seg_mod.ns.count;
    seg_mod.segs = ld_xcalloc(seg_mod.nsegs, sizeof(*seg_mod.segs));
    seg_mod.segs[0].shm = seg_create("all", stale_ns);
    for (size_t i = 0; i < seg_mod.ns.count; i++) {
        const struct ld_ns_entry *e = &seg_mod.ns.items[i];
        seg_mod.segs[1 + i].entry = e;
        if (e->kind != LD_NS_TOKEN) {
            char what[32];
            snprintf(what, sizeof(what), "ns%zu", i);
            seg_mod.segs[1 + i].shm = seg_create(what, stale_ns);
        }
    }
    seg_mod.on = true;
    beat_all();
    uint64_t every = (uint64_t)seg_mod.stale_ms * 1000u / 5u;
    if (every > BEAT_MAX_US) {
        every = BEAT_MAX_US;
    }
    struct timeval tv = ld_tv_us(every);
    event_add(seg_mod.beat_ev, &tv);
    log_info("shared near cache segments=%zu bytes=%lld stale_ms=%lld "
             "beat_us=%llu",
             seg_mod.nsegs, seg_mod.bytes, seg_mod.stale_ms,
             (unsigned long long)every);
}

static bool
settings_changed(void)
{
    const struct ld_config *c = seg_mod.ctx->cfg;
    return c->cache.near.shared_bytes != seg_mod.bytes ||
           c->cache.near.shared_stale_ms != seg_mod.stale_ms ||
           !ld_ns_list_equal(&c->listen.namespaces, &seg_mod.ns);
}

bool
near_seg_reload(void)
{
    if (seg_mod.ctx == NULL || !settings_changed()) {
        return false;
    }
    bool was_on = seg_mod.on;
    segs_destroy();
    segs_make();
    log_info("shared near cache segments replaced (reload) before=%d "
             "after=%d",
             was_on, seg_mod.on);
    return true;
}

/* ---- what ld_near.c keeps -------------------------------------------- */

static bool
seg_holds(const struct seg *g, const char *key, size_t len)
{
    return g->shm != NULL &&
           (g->entry == NULL || ld_ns_entry_allows(g->entry, key, len));
}

void
near_seg_put(const char *key, size_t klen, const char *v, size_t vlen,
             uint64_t expire_us, uint64_t version)
{
    /* The near cache's deadlines are ld_now_us, CLOCK_MONOTONIC too. */
    uint64_t deadline = expire_us == 0 ? UINT64_MAX : expire_us * 1000u;
    for (size_t i = 0; i < seg_mod.nsegs; i++) {
        struct seg *g = &seg_mod.segs[i];
        if (seg_holds(g, key, klen)) {
            ld_near_shm_put(g->shm, key, klen, v, vlen, deadline, version);
        }
    }
}

void
near_seg_del(const char *key, size_t klen)
{
    for (size_t i = 0; i < seg_mod.nsegs; i++) {
        struct seg *g = &seg_mod.segs[i];
        if (seg_holds(g, key, klen)) {
            ld_near_shm_del(g->shm, key, klen);
        }
    }
}

void
near_seg_flush(void)
{
    for (size_t i = 0; i < seg_mod.nsegs; i++) {
        if (seg_mod.segs[i].shm != NULL) {
            ld_near_shm_flush(seg_mod.segs[i].shm);
        }
    }
}

static void
refresh_gauges(void)
{
    long long bytes = 0, used = 0, entries = 0;
    for (size_t i = 0; i < seg_mod.nsegs; i++) {
        if (seg_mod.segs[i].shm != NULL) {
            struct ld_near_shm_usage u;
            ld_near_shm_usage(seg_mod.segs[i].shm, &u);
            bytes += (long long)u.bytes;
            used += (long long)u.used_bytes;
            entries += (long long)u.entries;
        }
    }
    ld_stats.near_shared_bytes = bytes;
    ld_stats.near_shared_used_bytes = used;
    ld_stats.near_shared_entries = entries;
}

/* ---- near.map and near.hits ------------------------------------------ */

static void
map_not_enabled(struct ld_req *req)
{
    ld_reply_error(req, LD_E_BAD_REQUEST,
                   "the shared near cache is not enabled "
                   "(cache.near.enabled, cache.near.shared_bytes)");
}

/* The segment of S's namespace, or NULL once the refusal is answered: a
 * client without a namespace, a namespace whose segment could not be made,
 * or too many descriptors already waiting for this client to read. */
static struct ld_near_shm *
map_segment(struct ld_req *req, struct ld_session *s)
{
    long idx;
    if (ld_ns_entry_index(s, &idx) != LD_OK) {
        ld_reply_error(req, LD_E_UNAUTHORIZED,
                       "this client has no namespace (listen.namespaces)");
        return NULL;
    }
    size_t which = idx < 0 ? 0 : 1 + (size_t)idx;
    if (which >= seg_mod.nsegs || seg_mod.segs[which].shm == NULL) {
        ld_reply_error(req, LD_E_INTERNAL,
                       "no shared segment for this client's namespace "
                       "(see the daemon's log)");
        return NULL;
    }
    if (ld_session_fd_lines(s) >= MAP_PENDING_MAX) {
        ld_reply_error(req, LD_E_BUSY,
                       "near.map replies still waiting for this client to "
                       "read them");
        return NULL;
    }
    return seg_mod.segs[which].shm;
}

static void
op_map(struct ld_req *req)
{
    if (!seg_mod.on) {
        map_not_enabled(req);
        return;
    }
    struct ld_session *s = req->sess;
    if (s == NULL || !ld_session_is_unix(s)) {
        ld_reply_error(req, LD_E_BAD_REQUEST,
                       "near.map needs the Unix socket: a descriptor cannot "
                       "pass over TCP");
        return;
    }
    /* Also between a reload and its signal's turn of the loop. */
    if (near_seg_reload()) {
        near_flush("shared segments replaced");
        if (!seg_mod.on) {
            map_not_enabled(req);
            return;
        }
    }
    struct ld_near_shm *shm = map_segment(req, s);
    if (shm == NULL) {
        return;
    }
    int fd = ld_near_shm_ro_fd(shm);
    if (fd < 0) {
        ld_reply_error(req, LD_E_INTERNAL, "no descriptor of the segment: %s",
                       strerror(errno));
        return;
    }
    struct ld_near_shm_usage u;
    ld_near_shm_usage(shm, &u);
    ld_stats.near_shared_maps++;
    ld_reply_ok_fd(req,
                   json_pack("{s:I,s:i,s:I}", "bytes", (json_int_t)u.bytes,
                             "layout", LEASED_NEAR_LAYOUT, "stale_ms",
                             (json_int_t)seg_mod.stale_ms),
                   fd);
}

static void
op_hits(struct ld_req *req)
{
    long long hits = 0, fallbacks = 0;
    if (ld_req_int(req, "hits", false, 0, HITS_MAX, &hits, NULL) != LD_OK ||
        ld_req_int(req, "fallbacks", false, 0, HITS_MAX, &fallbacks, NULL) !=
            LD_OK) {
        return;
    }
    ld_stats.near_shared_hits += hits;
    ld_stats.near_shared_fallbacks += fallbacks;
    ld_reply_ok(req, NULL);
}

/* ---- init and teardown ------------------------------------------------ */

int
near_seg_init(const struct ld_ctx *ctx)
{
    static const struct ld_op ops[] = {
        {"near.map", op_map, LD_OP_NO_NS},
        {"near.hits", op_hits, LD_OP_NO_NS},
    };
    memset(&seg_mod, 0, sizeof(seg_mod));
    seg_mod.ctx = ctx;
    seg_mod.beat_ev = event_new(ctx->base, -1, EV_PERSIST, beat_cb, NULL);
    if (seg_mod.beat_ev == NULL) {
        ld_oom_in("event_new");
    }
    ld_features_add_if("shared_near", shared_offered);
    ld_stats_add_refresh(refresh_gauges);
    segs_make();
    return ld_dispatch_register_ops(ops, sizeof(ops) / sizeof(ops[0]));
}

void
near_seg_free(void)
{
    if (seg_mod.ctx == NULL) {
        return;
    }
    segs_destroy();
    event_free(seg_mod.beat_ev);
    memset(&seg_mod, 0, sizeof(seg_mod));
    ld_stats.near_shared_bytes = 0;
    ld_stats.near_shared_used_bytes = 0;
    ld_stats.near_shared_entries = 0;
}
