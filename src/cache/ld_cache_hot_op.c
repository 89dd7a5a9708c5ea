/*
 * The hot keys seen from outside: the cache.hot operator op and the
 * top of the ranking in /metrics. The ranking itself is ld_cache_hot.c;
 * the cache module feeds it every answered read (ld_cache_reply.c).
 *
 * It reads the ranking and must not change it.
 */
#include "ld_cache_int.h"

#include "ld_cache_hot.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* /metrics shows this many keys at most, each label cut to this many
 * bytes: a scrape's label set stays bounded whatever the keys. */
#define HOT_METRICS_KEYS 10
#define HOT_METRICS_KEY_BYTES 128
#define HOT_LIMIT_MAX 10000

static void
op_hot(struct ld_req *req)
{
    long long limit = cache_mod.ctx->cfg->cache.hot_keys;
    if (ld_req_int(req, "limit", false, 1, HOT_LIMIT_MAX, &limit, NULL) !=
        LD_OK) {
        return;
    }
    json_t *keys = json_array();
    size_t max = (size_t)limit;
    if (ld_cache_hot_enabled() && max > 0) {
        struct ld_hot_key *top = ld_xcalloc(max, sizeof(*top));
        size_t n = ld_cache_hot_top(top, max, ld_now_ms());
        for (size_t i = 0; i < n; i++) {
            json_array_append_new(keys,
                                  json_pack("{s:s%,s:f,s:f}", "key",
                                            top[i].key, top[i].len,
                                            "reads_per_s", top[i].reads_per_s,
                                            "hit_ratio", top[i].hit_ratio));
        }
        free(top);
    }
    ld_reply_ok(req, json_pack("{s:o}", "keys", keys));
}

/* Append KEY as a label value: escaped, cut at a character boundary. */
static void
put_label(char **p, const char *key, size_t len)
{
    size_t n = len;
    if (n > HOT_METRICS_KEY_BYTES) {
        n = HOT_METRICS_KEY_BYTES;
        while (n > 0 && ((unsigned char)key[n] & 0xC0) == 0x80) {
            n--;
        }
    }
    char *o = *p;
    for (size_t i = 0; i < n; i++) {
        switch (key[i]) {
        case '\\':
            *o++ = '\\';
            *o++ = '\\';
            break;
        case '"':
            *o++ = '\\';
            *o++ = '"';
            break;
        case '\n':
            *o++ = '\\';
            *o++ = 'n';
            break;
        case '\0':
            break;
        default:
            *o++ = key[i];
        }
    }
    *p = o;
}

static char *
hot_prometheus(size_t *len)
{
    *len = 0;
    if (!ld_cache_hot_enabled()) {
        return NULL;
    }
    struct ld_hot_key top[HOT_METRICS_KEYS];
    size_t n = ld_cache_hot_top(top, HOT_METRICS_KEYS, ld_now_ms());
    static const char head[] =
        "# HELP leased_cache_hot_reads_per_second Reads per second of the "
        "most read cache keys (the top of cache.hot)\n"
        "# TYPE leased_cache_hot_reads_per_second gauge\n"
        "# HELP leased_cache_hot_hit_ratio Hit ratio of the most read cache "
        "keys (the top of cache.hot)\n"
        "# TYPE leased_cache_hot_hit_ratio gauge\n";
    /* Per key two lines of a name, the rank, an escaped label (at most
     * twice its bytes) and a number. */
    size_t cap = sizeof(head) + n * 2 * (96 + 2 * HOT_METRICS_KEY_BYTES);
    char *buf = ld_xmalloc(cap);
    char *p = buf;
    memcpy(p, head, sizeof(head) - 1);
    p += sizeof(head) - 1;
    /* The names are the apps' keys, which /metrics (no authentication)
     * must not give away unless the operator asks for them. */
    bool names = cache_mod.ctx->cfg->metrics.hot_key_names;
    for (int which = 0; which < 2; which++) {
        for (size_t i = 0; i < n; i++) {
            p += sprintf(p, "leased_cache_hot_%s{rank=\"%zu\"",
                         which == 0 ? "reads_per_second" : "hit_ratio", i + 1);
            if (names) {
                p += sprintf(p, ",key=\"");
                put_label(&p, top[i].key, top[i].len);
                *p++ = '"';
            }
            p += sprintf(p, "} %.3f\n",
                         which == 0 ? top[i].reads_per_s : top[i].hit_ratio);
        }
    }
    *len = (size_t)(p - buf);
    return buf;
}

int
cache_hot_init(void)
{
    ld_cache_hot_init((size_t)cache_mod.ctx->cfg->cache.hot_keys);
    ld_stats_add_prometheus(hot_prometheus);
    static const struct ld_op hot_op = {"cache.hot", op_hot, LD_OP_ADMIN};
    return ld_dispatch_register_ops(&hot_op, 1);
}
