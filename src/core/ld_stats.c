/* Counters, gauges and histograms of the daemon, and their two views: the
 * `stats` op (JSON) and the Prometheus text exposition format 0.0.4.
 *
 * Everything here runs on the one event-loop thread, so the figures are
 * plain integers; no atomics, no locks.
 *
 * It owns the figures and their rendering. Modules bump the counters; what
 * only a module can work out it hands in as a refresh or Prometheus function,
 * so this file includes nothing above core. */

#include "ld_stats.h"

#include "ld_assert.h"
#include "ld_ctx.h"
#include "ld_errcode.h"
#include "ld_mem.h"
#include "ld_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ld_stats ld_stats;

/* Per-op counts. Op names arrive as strings from the dispatcher; the set
 * of ops is small and closed, so a short array searched linearly beats a
 * hash table. Should more distinct names ever arrive than there are slots,
 * the rest are counted under "other" rather than dropped, so the per-op
 * figures still add up to `requests`. */
#define LD_STATS_MAX_OPS 32
#define LD_STATS_OP_NAME_MAX 32

struct op_count {
    char name[LD_STATS_OP_NAME_MAX];
    long long count;
};

/* Histogram bucket upper bounds in microseconds, from 50 us (a Redis round
 * trip on loopback) to 10 s (a long lock wait). The +Inf bucket is
 * implicit: it is the total count. Counts are kept per bucket and made
 * cumulative only when exposed. */
static const uint64_t histo_bounds_us[] = {
    50,    100,    250,    500,    1000,    2500,    5000,    10000,    25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
};
#define LD_HISTO_BUCKETS LD_ARRAY_LEN(histo_bounds_us)

struct histo {
    uint64_t buckets[LD_HISTO_BUCKETS + 1]; /* last one: above every bound */
    uint64_t sum_us;
    uint64_t count;
};

static struct {
    /* What the figures report about the daemon itself: the start time
     * and the instance come from the ctx, the TCP port once it is
     * bound. */
    const struct ld_ctx *ctx;
    int tcp_port;
    char redis_master[300];
    struct op_count op_counts[LD_STATS_MAX_OPS];
    size_t op_used;
    long long op_other; /* ops past LD_STATS_MAX_OPS distinct names */
    long long err_counts[LD_E__COUNT];
    struct histo histos[LD_HISTO__COUNT];
    /* What other modules hand in: figures to update before a report,
     * and text to add to the Prometheus one. */
    ld_stats_refresh_fn *refresh_fns[4];
    size_t n_refresh_fns;
    ld_stats_prom_fn *prom_fns[4];
    size_t n_prom_fns;
} stats_mod;

static const struct {
    const char *name;
    const char *help;
} histo_info[LD_HISTO__COUNT] = {
    [LD_HISTO_LOCK_WAIT] = {"lock_wait_seconds",
                            "Time from a lock request to its grant"},
    [LD_HISTO_LOCK_HOLD] = {"lock_hold_seconds",
                            "Time locks were held, from grant to release"},
    [LD_HISTO_REDIS_RTT] = {"redis_rtt_seconds",
                            "Round-trip time of Redis commands"},
};

int
ld_stats_init(const struct ld_ctx *ctx)
{
    LD_ASSERT(ctx != NULL);
    stats_mod.ctx = ctx;
    stats_mod.tcp_port = 0;
    stats_mod.redis_master[0] = '\0';
    memset(&ld_stats, 0, sizeof(ld_stats));
    memset(stats_mod.op_counts, 0, sizeof(stats_mod.op_counts));
    stats_mod.op_used = 0;
    stats_mod.op_other = 0;
    memset(stats_mod.err_counts, 0, sizeof(stats_mod.err_counts));
    memset(stats_mod.histos, 0, sizeof(stats_mod.histos));
    return LD_OK;
}

void
ld_stats_set_tcp_port(int port)
{
    stats_mod.tcp_port = port;
}

void
ld_stats_set_redis_master(const char *address)
{
    snprintf(stats_mod.redis_master, sizeof(stats_mod.redis_master), "%s",
             address);
}

void
ld_stats_count_op(const char *op)
{
    size_t i, len;

    if (op == NULL) {
        stats_mod.op_other++;
        return;
    }
    for (i = 0; i < stats_mod.op_used; i++) {
        if (strcmp(stats_mod.op_counts[i].name, op) == 0) {
            stats_mod.op_counts[i].count++;
            return;
        }
    }
    len = strlen(op);
    if (stats_mod.op_used == LD_STATS_MAX_OPS || len == 0 ||
        len >= LD_STATS_OP_NAME_MAX) {
        stats_mod.op_other++;
        return;
    }
    memcpy(stats_mod.op_counts[stats_mod.op_used].name, op, len + 1);
    stats_mod.op_counts[stats_mod.op_used].count = 1;
    stats_mod.op_used++;
}

void
ld_stats_count_error(int code)
{
    if (code >= 0 && code < LD_E__COUNT) {
        stats_mod.err_counts[code]++;
    }
}

void
ld_stats_observe(enum ld_histo h, uint64_t us)
{
    struct histo *hs;
    size_t i;

    if ((int)h < 0 || h >= LD_HISTO__COUNT) {
        return;
    }
    hs = &stats_mod.histos[h];
    for (i = 0; i < LD_HISTO_BUCKETS; i++) {
        if (us <= histo_bounds_us[i]) {
            break;
        }
    }
    hs->buckets[i]++;
    hs->sum_us += us;
    hs->count++;
}

static long long
uptime_s(void)
{
    uint64_t now = ld_now_ms();

    if (stats_mod.ctx->start_ms == 0 || now < stats_mod.ctx->start_ms) {
        return 0;
    }
    return (long long)((now - stats_mod.ctx->start_ms) / 1000);
}

static void run_refresh(void);

json_t *
ld_stats_json(void)
{
    json_t *o, *ops, *errs;
    size_t i;
    int c;

    run_refresh();
    o = json_object();
    ops = json_object();
    errs = json_object();
    if (o == NULL || ops == NULL || errs == NULL) {
        ld_oom_in("json_object");
    }

    json_object_set_new(o, "uptime_s", json_integer(uptime_s()));
    json_object_set_new(o, "version", json_string(PACKAGE_VERSION));
    json_object_set_new(o, "instance", json_string(stats_mod.ctx->instance));
    json_object_set_new(o, "tcp_port", json_integer(stats_mod.tcp_port));
    json_object_set_new(o, "redis_master",
                        json_string(stats_mod.redis_master));

#define LD_STATS_JSON(kind, name, help)                                       \
    json_object_set_new(o, #name, json_integer(ld_stats.name));
    LD_STATS_FIELDS(LD_STATS_JSON)
#undef LD_STATS_JSON

    for (i = 0; i < stats_mod.op_used; i++) {
        json_object_set_new(ops, stats_mod.op_counts[i].name,
                            json_integer(stats_mod.op_counts[i].count));
    }
    if (stats_mod.op_other > 0) {
        json_object_set_new(ops, "other", json_integer(stats_mod.op_other));
    }
    json_object_set_new(o, "requests_by_op", ops);

    for (c = 0; c < LD_E__COUNT; c++) {
        json_object_set_new(errs, ld_errcode_name(c),
                            json_integer(stats_mod.err_counts[c]));
    }
    json_object_set_new(o, "errors_by_code", errs);
    return o;
}

/* A growing text buffer for the exposition. Allocation failure is sticky
 * and reported once at the end, which keeps the writers below linear. */
struct text {
    char *buf;
    size_t len;
    size_t cap;
    bool failed;
};

static void text_printf(struct text *t, const char *fmt, ...) LD_PRINTF(2, 3);

static void
text_printf(struct text *t, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (t->failed) {
        return;
    }
    for (;;) {
        size_t room = t->cap - t->len;

        va_start(ap, fmt);
        n = vsnprintf(t->buf + t->len, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if ((size_t)n < room) {
            t->len += (size_t)n;
            return;
        }
        size_t ncap = t->cap * 2;
        while (ncap - t->len <= (size_t)n) {
            ncap *= 2;
        }
        t->buf = ld_xrealloc(t->buf, ncap);
        t->cap = ncap;
    }
}

/* Label values must escape backslash, double quote and newline. Op names
 * come from clients' requests, so they are escaped even though the
 * dispatcher only counts known ops today. */
static void
text_label_value(struct text *t, const char *s)
{
    for (; *s != '\0'; s++) {
        switch (*s) {
        case '\\':
            text_printf(t, "\\\\");
            break;
        case '"':
            text_printf(t, "\\\"");
            break;
        case '\n':
            text_printf(t, "\\n");
            break;
        default:
            text_printf(t, "%c", *s);
            break;
        }
    }
}

static void
text_family(struct text *t, const char *name, const char *type,
            const char *help)
{
    text_printf(t, "# HELP leased_%s %s\n# TYPE leased_%s %s\n", name, help,
                name, type);
}

/* Seconds as a short decimal ("0.00025", "2.5", "10"): "le" values must
 * be identical from one scrape to the next, and plain decimals read
 * better than exponents. */
static void
format_seconds(char *out, size_t outlen, uint64_t us)
{
    size_t n;

    snprintf(out, outlen, "%llu.%06llu", (unsigned long long)(us / 1000000),
             (unsigned long long)(us % 1000000));
    n = strlen(out);
    while (n > 0 && out[n - 1] == '0') {
        out[--n] = '\0';
    }
    if (n > 0 && out[n - 1] == '.') {
        out[--n] = '\0';
    }
}

/* A time NAME kept in microseconds ("redis_rtt_us") in seconds, as the
 * family leased_<NAME without _us><SUFFIX> of TYPE:
 * leased_redis_rtt_smoothed_seconds (a gauge),
 * leased_redis_no_master_seconds_total (a counter). */
static void
text_time_us(struct text *t, const char *name, const char *suffix,
             const char *type, const char *help, long long us)
{
    char family[128], value[32];
    size_t stem = strlen(name);

    if (stem > 3 && strcmp(name + stem - 3, "_us") == 0) {
        stem -= 3;
    }
    snprintf(family, sizeof(family), "%.*s%s", (int)stem, name, suffix);
    format_seconds(value, sizeof(value), us > 0 ? (uint64_t)us : 0);
    text_family(t, family, type, help);
    text_printf(t, "leased_%s %s\n", family, value);
}

/* An age NAME kept in milliseconds ("lock_wait_oldest_ms") as the gauge
 * leased_<NAME without _ms>_seconds. */
static void
text_time_ms(struct text *t, const char *name, const char *help, long long ms)
{
    char stem[128];
    size_t n = strlen(name);

    if (n > 3 && strcmp(name + n - 3, "_ms") == 0) {
        n -= 3;
    }
    snprintf(stem, sizeof(stem), "%.*s_us", (int)n, name);
    text_time_us(t, stem, "_seconds", "gauge", help, ms > 0 ? ms * 1000 : 0);
}

static void
text_histogram(struct text *t, const struct histo *hs, const char *name,
               const char *help)
{
    char le[32], sum[32];
    uint64_t cum = 0;
    size_t i;

    text_family(t, name, "histogram", help);
    for (i = 0; i < LD_HISTO_BUCKETS; i++) {
        cum += hs->buckets[i];
        format_seconds(le, sizeof(le), histo_bounds_us[i]);
        text_printf(t, "leased_%s_bucket{le=\"%s\"} %llu\n", name, le,
                    (unsigned long long)cum);
    }
    text_printf(t, "leased_%s_bucket{le=\"+Inf\"} %llu\n", name,
                (unsigned long long)hs->count);
    format_seconds(sum, sizeof(sum), hs->sum_us);
    text_printf(t, "leased_%s_sum %s\n", name, sum);
    text_printf(t, "leased_%s_count %llu\n", name,
                (unsigned long long)hs->count);
}

void
ld_stats_add_refresh(ld_stats_refresh_fn *fn)
{
    for (size_t i = 0; i < stats_mod.n_refresh_fns; i++) {
        if (stats_mod.refresh_fns[i] == fn) {
            return;
        }
    }
    LD_ASSERT(stats_mod.n_refresh_fns < LD_ARRAY_LEN(stats_mod.refresh_fns));
    stats_mod.refresh_fns[stats_mod.n_refresh_fns++] = fn;
}

static void
run_refresh(void)
{
    for (size_t i = 0; i < stats_mod.n_refresh_fns; i++) {
        stats_mod.refresh_fns[i]();
    }
}

void
ld_stats_add_prometheus(ld_stats_prom_fn *fn)
{
    for (size_t i = 0; i < stats_mod.n_prom_fns; i++) {
        if (stats_mod.prom_fns[i] == fn) {
            return;
        }
    }
    LD_ASSERT(stats_mod.n_prom_fns < LD_ARRAY_LEN(stats_mod.prom_fns));
    stats_mod.prom_fns[stats_mod.n_prom_fns++] = fn;
}

/* The daemon's identity: version, the Redis in use, uptime. */
static void
prom_info(struct text *t)
{
    text_family(t, "build_info", "gauge",
                "Always 1; the version is in the label");
    text_printf(t, "leased_build_info{version=\"%s\"} 1\n", PACKAGE_VERSION);
    if (stats_mod.redis_master[0] != '\0' &&
        strpbrk(stats_mod.redis_master, "\"\\\n") == NULL) {
        text_family(t, "redis_master_info", "gauge",
                    "Always 1; the Redis (master) in use is in the label");
        text_printf(t, "leased_redis_master_info{address=\"%s\"} 1\n",
                    stats_mod.redis_master);
    }
    text_family(t, "uptime_seconds", "gauge",
                "Seconds since the daemon started");
    text_printf(t, "leased_uptime_seconds %lld\n", uptime_s());
}

static void
prom_fields(struct text *t)
{
    /* Names and units follow the Prometheus conventions (promtool check
     * metrics): counters end in _total, times are in seconds. */
#define LD_STATS_PROM(kind, name, help)                                       \
    if (strcmp(#kind, "counter") == 0) {                                      \
        text_family(t, #name "_total", "counter", help);                      \
        text_printf(t, "leased_" #name "_total %lld\n", ld_stats.name);       \
    } else if (strcmp(#kind, "smoothed_us") == 0) {                           \
        text_time_us(t, #name, "_smoothed_seconds", "gauge", help,            \
                     ld_stats.name);                                          \
    } else if (strcmp(#kind, "counter_us") == 0) {                            \
        text_time_us(t, #name, "_seconds_total", "counter", help,             \
                     ld_stats.name);                                          \
    } else if (strcmp(#kind, "age_ms") == 0) {                                \
        text_time_ms(t, #name, help, ld_stats.name);                          \
    } else {                                                                  \
        text_family(t, #name, "gauge", help);                                 \
        text_printf(t, "leased_" #name " %lld\n", ld_stats.name);             \
    }
    LD_STATS_FIELDS(LD_STATS_PROM)
#undef LD_STATS_PROM
}

static void
prom_ops(struct text *t)
{
    size_t i;

    text_family(t, "requests_by_op_total", "counter",
                "Requests received, by op");
    for (i = 0; i < stats_mod.op_used; i++) {
        text_printf(t, "leased_requests_by_op_total{op=\"");
        text_label_value(t, stats_mod.op_counts[i].name);
        text_printf(t, "\"} %lld\n", stats_mod.op_counts[i].count);
    }
    if (stats_mod.op_other > 0) {
        text_printf(t, "leased_requests_by_op_total{op=\"other\"} %lld\n",
                    stats_mod.op_other);
    }
}

static void
prom_errors(struct text *t)
{
    int c;

    /* Every code is listed, zeros included, so that rate() over a code
     * that appears for the first time does not miss its first errors. */
    text_family(t, "errors_total", "counter", "Error replies, by code");
    for (c = 0; c < LD_E__COUNT; c++) {
        text_printf(t, "leased_errors_total{code=\"");
        text_label_value(t, ld_errcode_name(c));
        text_printf(t, "\"} %lld\n", stats_mod.err_counts[c]);
    }
}

/* The histograms, then what other modules add (ld_stats_add_prometheus). */
static void
prom_histograms_and_more(struct text *t)
{
    size_t i;

    for (i = 0; i < LD_HISTO__COUNT; i++) {
        text_histogram(t, &stats_mod.histos[i], histo_info[i].name,
                       histo_info[i].help);
    }
    for (i = 0; i < stats_mod.n_prom_fns; i++) {
        size_t n = 0;
        char *more = stats_mod.prom_fns[i](&n);
        if (more != NULL) {
            text_printf(t, "%.*s", (int)n, more);
            free(more);
        }
    }
}

char *
ld_stats_prometheus(size_t *len)
{
    struct text t = {0};

    if (len != NULL) {
        *len = 0;
    }
    run_refresh();
    t.cap = 8192;
    t.buf = ld_xmalloc(t.cap);
    t.buf[0] = '\0';

    prom_info(&t);
    prom_fields(&t);
    prom_ops(&t);
    prom_errors(&t);
    prom_histograms_and_more(&t);

    if (t.failed) {
        free(t.buf);
        return NULL;
    }
    if (len != NULL) {
        *len = t.len;
    }
    return t.buf;
}
