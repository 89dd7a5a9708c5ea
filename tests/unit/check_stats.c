/* ld_stats: the `stats` JSON and the Prometheus exposition, and the
 * /metrics endpoint of ld_metrics on a loopback port of this process. */

#include "ld_common.h"

#include "ld_ctx.h"
#include "ld_metrics.h"
#include "ld_proto.h"
#include "ld_stats.h"
#include "ld_util.h"

#include "unit.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

struct field {
    const char *kind;
    const char *name;
};

/* What the daemon's ctx would hold; the tests set its start time. */
static struct ld_ctx ctx = {.instance = "0123456789abcdef"};

static const struct field fields[] = {
#define FIELD(kind, name, help) {#kind, #name},
    LD_STATS_FIELDS(FIELD)
#undef FIELD
};

static const char *histo_names[] = {
    "leased_lock_wait_seconds",
    "leased_lock_hold_seconds",
    "leased_redis_rtt_seconds",
};

/* Give every field a distinct value so that a swapped field shows. */
static void
fill_fields(void)
{
    long long v = 1000;

#define FILL(kind, name, help) ld_stats.name = v++;
    LD_STATS_FIELDS(FILL)
#undef FILL
}

static long long
field_value(const char *name)
{
#define GET(kind, fname, help)                                                \
    if (strcmp(name, #fname) == 0) {                                          \
        return ld_stats.fname;                                                \
    }
    LD_STATS_FIELDS(GET)
#undef GET
    return -1;
}

static char *
prom(void)
{
    size_t len = 0;
    char *text = ld_stats_prometheus(&len);

    ck_assert_ptr_nonnull(text);
    ck_assert_uint_eq(strlen(text), len);
    return text;
}

START_TEST(test_json_has_every_field)
{
    json_t *o, *v;
    size_t i;

    ld_stats_init(&ctx);
    fill_fields();
    ld_stats_set_tcp_port(7379);
    o = ld_stats_json();
    ck_assert_ptr_nonnull(o);
    for (i = 0; i < LD_ARRAY_LEN(fields); i++) {
        v = json_object_get(o, fields[i].name);
        ck_assert_msg(json_is_integer(v), "field %s missing", fields[i].name);
        ck_assert_int_eq(json_integer_value(v), field_value(fields[i].name));
    }
    ck_assert(json_is_integer(json_object_get(o, "uptime_s")));
    ck_assert_str_eq(json_string_value(json_object_get(o, "version")),
                     PACKAGE_VERSION);
    ck_assert_int_eq(json_integer_value(json_object_get(o, "tcp_port")), 7379);
    ck_assert(json_is_integer(json_object_get(o, "redis_rtt_us")));
    ck_assert(json_is_object(json_object_get(o, "requests_by_op")));
    ck_assert(json_is_object(json_object_get(o, "errors_by_code")));
    json_decref(o);
}
END_TEST

/* Uptime counts whole seconds from ctx.start_ms, in both views, and
 * is 0 before the start (start_ms 0) rather than the age of the clock. */
START_TEST(test_uptime_from_start)
{
    json_t *o;
    char *text;
    long long up;

    ld_stats_init(&ctx);
    ctx.start_ms = 0;
    o = ld_stats_json();
    ck_assert_int_eq(json_integer_value(json_object_get(o, "uptime_s")), 0);
    json_decref(o);

    /* Half a second of slack either way keeps a slow machine from
     * crossing into the next second between here and the render. */
    ctx.start_ms = ld_now_ms() - 7500;
    o = ld_stats_json();
    up = json_integer_value(json_object_get(o, "uptime_s"));
    json_decref(o);
    ck_assert_msg(up == 7 || up == 8, "uptime_s %lld, want 7", up);
    text = prom();
    ck_assert_msg(strstr(text, "\nleased_uptime_seconds 7\n") != NULL ||
                      strstr(text, "\nleased_uptime_seconds 8\n") != NULL,
                  "no leased_uptime_seconds 7 in:\n%s", text);
    free(text);
    ctx.start_ms = 0;
}
END_TEST

START_TEST(test_json_ops_and_errors)
{
    json_t *o, *ops, *errs;
    int c;

    ld_stats_init(&ctx);
    ld_stats_count_op("lock");
    ld_stats_count_op("lock");
    ld_stats_count_op("lock");
    ld_stats_count_op("cache.get");
    ld_stats_count_error(LD_E_BUSY);
    ld_stats_count_error(LD_E_BUSY);
    ld_stats_count_error(LD_E_NOT_HELD);
    ld_stats_count_error(-1);          /* ignored, not a crash */
    ld_stats_count_error(LD_E__COUNT); /* ignored, not a crash */

    o = ld_stats_json();
    ops = json_object_get(o, "requests_by_op");
    ck_assert_int_eq(json_object_size(ops), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(ops, "lock")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(ops, "cache.get")), 1);

    /* Every code is present, zeros included. */
    errs = json_object_get(o, "errors_by_code");
    ck_assert_int_eq(json_object_size(errs), LD_E__COUNT);
    for (c = 0; c < LD_E__COUNT; c++) {
        ck_assert_msg(json_is_integer(
                          json_object_get(errs, ld_errcode_name(c))),
                      "code %s missing", ld_errcode_name(c));
    }
    ck_assert_int_eq(json_integer_value(json_object_get(errs, "busy")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(errs, "not_held")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(errs, "internal")), 0);
    json_decref(o);
}
END_TEST

START_TEST(test_ops_overflow_counted_as_other)
{
    json_t *o, *ops, *v;
    const char *k;
    long long total = 0;
    char name[32];
    int i;

    ld_stats_init(&ctx);
    for (i = 0; i < 40; i++) {
        snprintf(name, sizeof(name), "op%d", i);
        ld_stats_count_op(name);
    }
    /* Too long for a slot: counted, under "other". */
    ld_stats_count_op("an.op.name.longer.than.any.slot.can.hold");
    o = ld_stats_json();
    ops = json_object_get(o, "requests_by_op");
    json_object_foreach(ops, k, v)
    {
        total += json_integer_value(v);
    }
    ck_assert_int_eq(total, 41);
    ck_assert_int_eq(json_integer_value(json_object_get(ops, "op0")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(ops, "other")),
                     41 - 32);
    json_decref(o);
}
END_TEST

START_TEST(test_prometheus_help_type_for_every_field)
{
    char want[256], metric[128];
    char *text;
    size_t i;

    ld_stats_init(&ctx);
    fill_fields();
    text = prom();
    for (i = 0; i < LD_ARRAY_LEN(fields); i++) {
        bool counter = strcmp(fields[i].kind, "counter") == 0;

        if (strcmp(fields[i].kind, "smoothed_us") == 0 ||
            strcmp(fields[i].kind, "counter_us") == 0 ||
            strcmp(fields[i].kind, "age_ms") == 0) {
            continue; /* test_prometheus_times_in_seconds */
        }
        snprintf(metric, sizeof(metric), "leased_%s%s", fields[i].name,
                 counter ? "_total" : "");
        snprintf(want, sizeof(want), "# HELP %s ", metric);
        ck_assert_msg(strstr(text, want) != NULL, "no HELP for %s", metric);
        snprintf(want, sizeof(want), "\n# TYPE %s %s\n", metric,
                 counter ? "counter" : "gauge");
        ck_assert_msg(strstr(text, want) != NULL, "no TYPE for %s", metric);
        snprintf(want, sizeof(want), "\n%s %lld\n", metric,
                 field_value(fields[i].name));
        ck_assert_msg(strstr(text, want) != NULL, "no sample for %s", metric);
    }
    ck_assert(strstr(text, "\n# TYPE leased_uptime_seconds gauge\n"));
    ck_assert(strstr(text, "\nleased_uptime_seconds "));
    free(text);
}
END_TEST

/* Prometheus wants base units: the smoothed round trip, kept in
 * microseconds for `stats`, is exposed in seconds under a name without
 * "_us", and no metric name carries an abbreviated unit. */
START_TEST(test_prometheus_times_in_seconds)
{
    char *text, *at, *line, *save = NULL;
    json_t *o;

    ld_stats_init(&ctx);
    ld_stats.redis_rtt_us = 1250;
    ld_stats.redis_no_master_us = 2500000;
    ld_stats.lock_wait_oldest_ms = 1500;
    text = prom();
    ck_assert(
        strstr(text, "\n# TYPE leased_lock_wait_oldest_seconds gauge\n"));
    ck_assert(strstr(text, "\nleased_lock_wait_oldest_seconds 1.5\n"));
    ck_assert(
        strstr(text,
               "\n# TYPE leased_redis_no_master_seconds_total counter\n"));
    ck_assert(strstr(text, "\nleased_redis_no_master_seconds_total 2.5\n"));
    ck_assert(
        strstr(text, "\n# TYPE leased_redis_rtt_smoothed_seconds gauge\n"));
    at = strstr(text, "\nleased_redis_rtt_smoothed_seconds ");
    ck_assert_ptr_nonnull(at);
    ck_assert_double_eq_tol(strtod(strchr(at + 1, ' ') + 1, NULL), 0.00125,
                            1e-12);
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        ck_assert_msg(strstr(line, "_us ") == NULL &&
                          strstr(line, "_us_") == NULL &&
                          strstr(line, "_ms ") == NULL &&
                          strstr(line, "_ms_") == NULL &&
                          strstr(line, "_us{") == NULL,
                      "abbreviated unit: %s", line);
    }
    free(text);

    o = ld_stats_json();
    ck_assert_int_eq(json_integer_value(json_object_get(o, "redis_rtt_us")),
                     1250);
    json_decref(o);
}
END_TEST

START_TEST(test_prometheus_ops_and_errors)
{
    char *text;

    ld_stats_init(&ctx);
    ld_stats_count_op("lock");
    ld_stats_count_op("lock");
    ld_stats_count_error(LD_E_BUSY);
    ld_stats_count_op("we\"ird\\op\nname");
    text = prom();
    ck_assert(strstr(text, "\n# TYPE leased_requests_by_op_total counter\n"));
    ck_assert(strstr(text, "\nleased_requests_by_op_total{op=\"lock\"} 2\n"));
    ck_assert(strstr(text, "\n# TYPE leased_errors_total counter\n"));
    ck_assert(strstr(text, "\nleased_errors_total{code=\"busy\"} 1\n"));
    ck_assert(strstr(text, "\nleased_errors_total{code=\"internal\"} 0\n"));
    /* Label values are escaped, so one sample stays one line. */
    ck_assert(strstr(text, "{op=\"we\\\"ird\\\\op\\nname\"} 1\n"));
    free(text);
}
END_TEST

/* Every line is a comment or "name[{labels}] value"; every family has one
 * HELP and one TYPE, before its samples. */
START_TEST(test_prometheus_well_formed)
{
    char *text, *line, *save = NULL;
    char types[128][128];
    size_t ntypes = 0, i;

    ld_stats_init(&ctx);
    fill_fields();
    ld_stats_observe(LD_HISTO_REDIS_RTT, 120);
    text = prom();
    ck_assert_uint_gt(strlen(text), 0);
    ck_assert_int_eq(text[strlen(text) - 1], '\n');
    ck_assert(strstr(text, "\n\n") == NULL);
    for (line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128], type[32];

            ck_assert_int_eq(sscanf(line + 7, "%127s %31s", name, type), 2);
            ck_assert_msg(strcmp(type, "counter") == 0 ||
                              strcmp(type, "gauge") == 0 ||
                              strcmp(type, "histogram") == 0,
                          "bad type: %s", line);
            for (i = 0; i < ntypes; i++) {
                ck_assert_msg(strcmp(types[i], name) != 0, "twice: %s", name);
            }
            ck_assert_uint_lt(ntypes, LD_ARRAY_LEN(types));
            snprintf(types[ntypes++], sizeof(types[0]), "%s", name);
        } else if (strncmp(line, "# HELP ", 7) == 0) {
            ck_assert(strncmp(line + 7, "leased_", 7) == 0);
        } else {
            char *sp = strrchr(line, ' ');
            char *end;
            bool known = false;

            ck_assert_msg(line[0] != '#', "stray comment: %s", line);
            ck_assert_msg(sp != NULL, "no value: %s", line);
            strtod(sp + 1, &end);
            ck_assert_msg(*end == '\0' && end != sp + 1, "bad value: %s",
                          line);
            /* The sample belongs to a family already typed. */
            for (i = 0; i < ntypes; i++) {
                size_t n = strlen(types[i]);

                if (strncmp(line, types[i], n) == 0 &&
                    (line[n] == ' ' || line[n] == '{' || line[n] == '_')) {
                    known = true;
                }
            }
            ck_assert_msg(known, "sample before its TYPE: %s", line);
        }
    }
    free(text);
}
END_TEST

/* Reads one histogram from the exposition and checks its shape: buckets
 * in increasing order of le, counts non-decreasing, +Inf last and equal to
 * _count. Returns the count; *SUM gets _sum. */
static unsigned long long
check_histogram(const char *text, const char *name, double *sum,
                unsigned long long *count_at_100us)
{
    char prefix[128], want[160];
    const char *p;
    double prev_le = -1, le;
    unsigned long long prev = 0, n, count = 0;
    bool inf_seen = false;
    int buckets = 0;

    snprintf(want, sizeof(want), "\n# TYPE %s histogram\n", name);
    ck_assert_msg(strstr(text, want) != NULL, "no TYPE for %s", name);
    snprintf(want, sizeof(want), "\n# HELP %s ", name);
    ck_assert_msg(strstr(text, want) != NULL, "no HELP for %s", name);

    snprintf(prefix, sizeof(prefix), "\n%s_bucket{le=\"", name);
    for (p = strstr(text, prefix); p != NULL; p = strstr(p + 1, prefix)) {
        char lebuf[32];
        const char *q = p + strlen(prefix);
        char *end;

        ck_assert_msg(!inf_seen, "%s: bucket after +Inf", name);
        ck_assert_int_eq(sscanf(q, "%31[^\"]\"} %llu", lebuf, &n), 2);
        le = strtod(lebuf, &end);
        ck_assert(*end == '\0');
        ck_assert_msg(le > prev_le, "%s: le %s not increasing", name, lebuf);
        ck_assert_msg(n >= prev, "%s: count falls at le %s", name, lebuf);
        if (strcmp(lebuf, "+Inf") == 0) {
            ck_assert(isinf(le));
            inf_seen = true;
        }
        if (count_at_100us != NULL && strcmp(lebuf, "0.0001") == 0) {
            *count_at_100us = n;
        }
        prev_le = le;
        prev = n;
        buckets++;
    }
    ck_assert_msg(inf_seen, "%s: no +Inf bucket", name);
    ck_assert_int_ge(buckets, 10);

    snprintf(want, sizeof(want), "\n%s_count ", name);
    p = strstr(text, want);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p + strlen(want), "%llu", &count), 1);
    ck_assert_uint_eq(count, prev);

    snprintf(want, sizeof(want), "\n%s_sum ", name);
    p = strstr(text, want);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(sscanf(p + strlen(want), "%lf", sum), 1);
    return count;
}

START_TEST(test_prometheus_histograms)
{
    unsigned long long count, at100 = 0;
    double sum;
    char *text;
    size_t i;

    ld_stats_init(&ctx);
    ld_stats_observe(LD_HISTO_LOCK_WAIT, 10);
    ld_stats_observe(LD_HISTO_LOCK_WAIT, 100); /* on the bound: le counts */
    ld_stats_observe(LD_HISTO_LOCK_WAIT, 3000);
    ld_stats_observe(LD_HISTO_LOCK_WAIT, 20000000); /* above every bound */
    ld_stats_observe(LD_HISTO_LOCK_HOLD, 1500000);
    text = prom();

    count = check_histogram(text, "leased_lock_wait_seconds", &sum, &at100);
    ck_assert_uint_eq(count, 4);
    ck_assert_uint_eq(at100, 2);
    ck_assert_double_eq_tol(sum, 20.00311, 1e-9);

    count = check_histogram(text, "leased_lock_hold_seconds", &sum, NULL);
    ck_assert_uint_eq(count, 1);
    ck_assert_double_eq_tol(sum, 1.5, 1e-9);

    for (i = 0; i < LD_ARRAY_LEN(histo_names); i++) {
        check_histogram(text, histo_names[i], &sum, NULL);
    }
    /* The +Inf bucket holds the observation above every bound. */
    ck_assert(
        strstr(text, "\nleased_lock_wait_seconds_bucket{le=\"10\"} 3\n"));
    ck_assert(
        strstr(text, "\nleased_lock_wait_seconds_bucket{le=\"+Inf\"} 4\n"));
    free(text);
}
END_TEST

/* The endpoint, fetched with libevent's HTTP client on the same loop. */
struct fetch {
    int status;
    char content_type[128];
    char *body;
    bool done;
};

static void
fetch_done(struct evhttp_request *req, void *arg)
{
    struct fetch *f = arg;
    const char *ct;
    struct evbuffer *in;
    size_t len;

    f->done = true;
    if (req == NULL) {
        f->status = -1;
    } else {
        f->status = evhttp_request_get_response_code(req);
        ct = evhttp_find_header(evhttp_request_get_input_headers(req),
                                "Content-Type");
        snprintf(f->content_type, sizeof(f->content_type), "%s",
                 ct != NULL ? ct : "");
        in = evhttp_request_get_input_buffer(req);
        len = evbuffer_get_length(in);
        f->body = malloc(len + 1);
        ck_assert_ptr_nonnull(f->body);
        evbuffer_remove(in, f->body, len);
        f->body[len] = '\0';
    }
}

static void
fetch(struct event_base *base, int port, const char *path, struct fetch *f)
{
    struct evhttp_connection *conn;
    struct evhttp_request *req;

    memset(f, 0, sizeof(*f));
    conn = evhttp_connection_base_new(base, NULL, "127.0.0.1",
                                      (ev_uint16_t)port);
    ck_assert_ptr_nonnull(conn);
    evhttp_connection_set_timeout(conn, 10);
    req = evhttp_request_new(fetch_done, f);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Host",
                      "127.0.0.1");
    ck_assert_int_eq(evhttp_make_request(conn, req, EVHTTP_REQ_GET, path), 0);
    while (!f->done) {
        ck_assert_int_ge(event_base_loop(base, EVLOOP_ONCE), 0);
    }
    evhttp_connection_free(conn);
}

START_TEST(test_metrics_endpoint)
{
    struct event_base *base;
    struct fetch f;
    int port = -1;

    ld_stats_init(&ctx);
    ld_stats_count_op("ping");
    ld_stats.sessions = 3;
    base = event_base_new();
    ck_assert_ptr_nonnull(base);
    ck_assert_int_eq(ld_metrics_start(base, "127.0.0.1:0", &port), LD_OK);
    ck_assert_int_gt(port, 0);

    fetch(base, port, "/metrics", &f);
    ck_assert_int_eq(f.status, 200);
    ck_assert_str_eq(f.content_type,
                     "text/plain; version=0.0.4; charset=utf-8");
    ck_assert(strstr(f.body, "\nleased_sessions 3\n"));
    ck_assert(strstr(f.body, "leased_requests_by_op_total{op=\"ping\"} 1\n"));
    ck_assert(strstr(f.body, "leased_redis_rtt_seconds_count 0\n"));
    free(f.body);

    fetch(base, port, "/other", &f);
    ck_assert_int_eq(f.status, 404);
    free(f.body);

    ld_metrics_stop();
    event_base_free(base);
}
END_TEST

START_TEST(test_metrics_disabled)
{
    struct event_base *base = event_base_new();
    int port = -1;

    ck_assert_int_eq(ld_metrics_start(base, "", &port), LD_OK);
    ck_assert_int_eq(port, 0);
    ld_metrics_stop();
    ck_assert_int_eq(ld_metrics_start(base, "not-an-address", &port), LD_ERR);
    ld_metrics_stop();
    event_base_free(base);
}
END_TEST

static Suite *
stats_suite(void)
{
    Suite *s = suite_create("stats");
    TCase *tc = tcase_create("stats");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_json_has_every_field);
    tcase_add_test(tc, test_uptime_from_start);
    tcase_add_test(tc, test_json_ops_and_errors);
    tcase_add_test(tc, test_ops_overflow_counted_as_other);
    tcase_add_test(tc, test_prometheus_help_type_for_every_field);
    tcase_add_test(tc, test_prometheus_times_in_seconds);
    tcase_add_test(tc, test_prometheus_ops_and_errors);
    tcase_add_test(tc, test_prometheus_well_formed);
    tcase_add_test(tc, test_prometheus_histograms);
    tcase_add_test(tc, test_metrics_endpoint);
    tcase_add_test(tc, test_metrics_disabled);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(stats_suite());
}
