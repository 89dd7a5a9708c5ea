/* The hot keys against a real leased and a real redis-server: the
 * cache.hot ranking on a skewed workload, its limit and refusals,
 * leasectl hot, and the bounded hot-key series in /metrics. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define T_MS 5000
#define NKEYS 40
#define ROUNDS 200

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "hot",
    .redis = {&R},
    .daemons = {&D},
};

static void
key_name(char *buf, size_t len, int i)
{
    snprintf(buf, len, "k%02d", i);
}

/* Key i is read ROUNDS / i times (a Zipf workload with s = 1), in rounds
 * of one cache.mget of the keys due; k01 and k02 hold values (hits), the
 * others nothing (misses). */
static void
skewed_workload(struct h_conn *c)
{
    char name[16];
    for (int i = 1; i <= 2; i++) {
        key_name(name, sizeof name, i);
        json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set",
                                   "key", name, "value", "v")));
    }
    for (int r = 1; r <= ROUNDS; r++) {
        json_t *keys = json_array();
        for (int i = NKEYS; i >= 1; i--) {
            if (r % i == 0) {
                key_name(name, sizeof name, i);
                json_array_append_new(keys, json_string(name));
            }
        }
        json_t *req = json_pack("{s:s,s:o,s:b}", "op", "cache.mget", "keys",
                                keys, "lease", 0);
        json_decref(h_must(h_call(c, req, T_MS)));
    }
}

static json_t *
hot(struct h_conn *c, long long limit)
{
    if (limit > 0) {
        return h_callf(c, T_MS, "{s:s,s:I}", "op", "cache.hot", "limit",
                       (json_int_t)limit);
    }
    return h_callf(c, T_MS, "{s:s}", "op", "cache.hot");
}

static const char *
nth_key(const json_t *keys, size_t i)
{
    return json_string_value(json_object_get(json_array_get(keys, i), "key"));
}

static double
nth_num(const json_t *keys, size_t i, const char *field)
{
    return json_number_value(json_object_get(json_array_get(keys, i), field));
}

START_TEST(test_ranking)
{
    h_start("cache:\n  hot_keys: 16\n");
    struct h_conn *c = h_connect_ok(&D);
    skewed_workload(c);

    json_t *r = h_must(hot(c, 0));
    json_t *keys = json_object_get(r, "keys");
    /* Every slot in use: 40 keys were read, 16 are kept. */
    ck_assert_msg(json_array_size(keys) == 16, "%s", h_dump(r));
    /* The heaviest keys, in order, with reads in proportion. */
    const char *want[] = {"k01", "k02", "k03", "k04"};
    for (size_t i = 0; i < 4; i++) {
        ck_assert_msg(nth_key(keys, i) != NULL &&
                          strcmp(nth_key(keys, i), want[i]) == 0,
                      "rank %zu: %s", i + 1, h_dump(keys));
    }
    double r1 = nth_num(keys, 0, "reads_per_s");
    double r2 = nth_num(keys, 1, "reads_per_s");
    double r4 = nth_num(keys, 3, "reads_per_s");
    ck_assert_msg(r1 > 0 && r2 > 0 && r4 > 0, "%s", h_dump(keys));
    ck_assert_double_eq_tol(r1 / r2, 2.0, 0.1);
    ck_assert_double_eq_tol(r1 / r4, 4.0, 0.2);
    /* Most read first all the way down. */
    for (size_t i = 1; i < json_array_size(keys); i++) {
        ck_assert(nth_num(keys, i - 1, "reads_per_s") >=
                  nth_num(keys, i, "reads_per_s"));
    }
    /* k01 and k02 were hits, k03 and k04 misses. */
    ck_assert_double_eq_tol(nth_num(keys, 0, "hit_ratio"), 1.0, 1e-9);
    ck_assert_double_eq_tol(nth_num(keys, 1, "hit_ratio"), 1.0, 1e-9);
    ck_assert_double_eq_tol(nth_num(keys, 2, "hit_ratio"), 0.0, 1e-9);
    json_decref(r);

    /* The limit. */
    r = h_must(hot(c, 3));
    keys = json_object_get(r, "keys");
    ck_assert_int_eq(json_array_size(keys), 3);
    ck_assert_str_eq(nth_key(keys, 0), "k01");
    json_decref(r);
    h_expect_code(h_callf(c, T_MS, "{s:s,s:I}", "op", "cache.hot", "limit",
                          (json_int_t)-1),
                  "bad_request", "negative limit");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:I}", "op", "cache.hot", "limit",
                          (json_int_t)0),
                  "bad_request", "limit 0");
    h_expect_code(h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.hot", "limit",
                          "5"),
                  "bad_request", "limit as a string");
    h_close(c);
}
END_TEST

/* cache.get, stale hits and cached nulls count too. */
START_TEST(test_gets_count)
{
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    for (int i = 0; i < 5; i++) {
        json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                                   "key", "g", "lease", 0)));
    }
    json_t *r = h_must(hot(c, 0));
    json_t *keys = json_object_get(r, "keys");
    ck_assert_int_eq(json_array_size(keys), 1);
    ck_assert_str_eq(nth_key(keys, 0), "g");
    ck_assert_double_eq_tol(nth_num(keys, 0, "hit_ratio"), 0.0, 1e-9);
    json_decref(r);
    h_close(c);
}
END_TEST

START_TEST(test_off_and_tcp)
{
    h_start("cache:\n  hot_keys: 0\n");
    struct h_conn *c = h_connect_ok(&D);
    skewed_workload(c);
    json_t *r = h_must(hot(c, 0));
    ck_assert_int_eq(json_array_size(json_object_get(r, "keys")), 0);
    json_decref(r);
    /* An operator op: not over TCP. */
    struct h_conn *t = h_connect_tcp(&D);
    ck_assert_ptr_nonnull(t);
    h_expect_code(hot(t, 0), "unauthorized", "cache.hot over TCP");
    h_close(t);
    h_close(c);
}
END_TEST

static const char *
ctl_bin(void)
{
    const char *p = getenv("LEASECTL_BIN");
    return p && *p ? p : "tools/leasectl";
}

START_TEST(test_leasectl_hot)
{
    char out[8192], err[4096];
    h_start(NULL);
    struct h_conn *c = h_connect_ok(&D);
    skewed_workload(c);
    h_close(c);

    const char *argv[] = {ctl_bin(), "-s", D.sock, "hot",
                          "--limit", "2",  NULL};
    int rc = h_run(argv, out, sizeof out, err, sizeof err, T_MS);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    double rate, ratio;
    char key[64];
    char *second = strchr(out, '\n');
    ck_assert_ptr_nonnull(second);
    ck_assert_msg(sscanf(out, "%lf\t%lf\t%63s", &rate, &ratio, key) == 3,
                  "output: %s", out);
    ck_assert_str_eq(key, "k01");
    ck_assert(rate > 0);
    ck_assert_double_eq_tol(ratio, 1.0, 1e-9);
    ck_assert_msg(sscanf(second + 1, "%lf\t%lf\t%63s", &rate, &ratio, key) ==
                      3,
                  "output: %s", out);
    ck_assert_str_eq(key, "k02");
    ck_assert_ptr_null(strchr(second + 1, '\n') != NULL
                           ? strchr(strchr(second + 1, '\n') + 1, '\n')
                           : NULL);

    const char *jargv[] = {ctl_bin(), "-s", D.sock, "hot", "--json", NULL};
    rc = h_run(jargv, out, sizeof out, err, sizeof err, T_MS);
    ck_assert_msg(rc == 0, "exit %d: %s", rc, err);
    json_t *j = json_loads(out, 0, NULL);
    ck_assert_msg(json_is_array(j) && json_array_size(j) == 40 &&
                      strcmp(nth_key(j, 0), "k01") == 0,
                  "json output: %.300s", out);
    json_decref(j);

    const char *bad[] = {ctl_bin(), "-s", D.sock, "hot", "--limit", "x", NULL};
    rc = h_run(bad, out, sizeof out, err, sizeof err, T_MS);
    ck_assert_int_eq(rc, 64); /* EX_USAGE */
}
END_TEST

static int
count_lines(const char *body, const char *prefix)
{
    int n = 0;
    size_t plen = strlen(prefix);
    for (const char *p = body; p != NULL && *p != '\0';) {
        if (strncmp(p, prefix, plen) == 0) {
            n++;
        }
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    return n;
}

START_TEST(test_metrics_bounded)
{
    char yaml[256];
    int port = h_free_port();
    snprintf(yaml, sizeof yaml,
             "metrics:\n  listen: 127.0.0.1:%d\n  hot_key_names: true\n"
             "cache:\n  hot_keys: 32\n",
             port);
    h_start(yaml);
    struct h_conn *c = h_connect_ok(&D);
    skewed_workload(c);
    /* A key that needs escaping, read often enough to rank first. */
    for (int i = 0; i < 400; i++) {
        json_decref(h_must(h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get",
                                   "key", "we\"ird\\key", "lease", 0)));
    }
    char *body = h_get_metrics(port);
    ck_assert_msg(strstr(body, "leased_cache_hot_reads_per_second{rank=\"1\","
                               "key=\"we\\\"ird\\\\key\"} ") != NULL,
                  "no escaped top key in:\n%.2000s", body);
    ck_assert_msg(strstr(body, "leased_cache_hot_hit_ratio{rank=\"2\","
                               "key=\"k01\"} 1.000") != NULL,
                  "no k01 hit ratio in:\n%.2000s", body);
    /* 41 keys read, 32 kept, 10 shown. */
    ck_assert_int_eq(count_lines(body, "leased_cache_hot_reads_per_second{"),
                     10);
    ck_assert_int_eq(count_lines(body, "leased_cache_hot_hit_ratio{"), 10);
    ck_assert_int_eq(count_lines(body, "# TYPE leased_cache_hot_"), 2);
    free(body);
    h_close(c);
}
END_TEST

/* By default /metrics ranks the hot keys without naming them: the names
 * are the apps' keys, and the endpoint has no authentication. */
START_TEST(test_metrics_no_key_names)
{
    char yaml[256];
    int port = h_free_port();
    snprintf(yaml, sizeof yaml,
             "metrics:\n  listen: 127.0.0.1:%d\ncache:\n  hot_keys: 32\n",
             port);
    h_start(yaml);
    struct h_conn *c = h_connect_ok(&D);
    skewed_workload(c);
    char *body = h_get_metrics(port);
    ck_assert_msg(strstr(body,
                         "leased_cache_hot_reads_per_second{rank=\"1\"} ") !=
                      NULL,
                  "no ranked series in:\n%.2000s", body);
    ck_assert_int_eq(count_lines(body, "leased_cache_hot_reads_per_second{"),
                     10);
    ck_assert_msg(strstr(body, "key=") == NULL && strstr(body, "k01") == NULL,
                  "a key name in:\n%.2000s", body);
    free(body);
    h_close(c);
}
END_TEST

/* GET /metrics with HOST as its Host header (none when NULL): the HTTP
 * status, 0 when there was no status line. */
static int
metrics_status(int port, const char *host)
{
    char req[512], buf[4096];
    struct sockaddr_in sa;
    struct timeval tv = {5, 0};
    size_t len = 0;
    ssize_t n;
    int status = 0;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_int_ge(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    if (host != NULL) {
        snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n",
                 host);
    } else {
        snprintf(req, sizeof req, "GET /metrics HTTP/1.0\r\n\r\n");
    }
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    while (len < sizeof buf - 1 &&
           (n = read(fd, buf + len, sizeof buf - 1 - len)) > 0) {
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
        return 0;
    }
    ck_assert_msg(status == 200 || strstr(buf, "leased_") == NULL,
                  "figures served with status %d", status);
    return status;
}

/* DNS rebinding: a page's own name, resolved to 127.0.0.1, comes as the
 * Host header and is refused; the listener's names are served. */
START_TEST(test_metrics_host_checked)
{
    static const char *const refused[] = {
        "evil.example",
        "evil.example:9379",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "[::1",
        "a:b:c",
    };
    char yaml[256], host[64];
    int port = h_free_port();
    snprintf(yaml, sizeof yaml, "metrics:\n  listen: 127.0.0.1:%d\n", port);
    h_start(yaml);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ck_assert_msg(metrics_status(port, refused[i]) == 403,
                      "Host %s not refused", refused[i]);
    }
    snprintf(host, sizeof host, "127.0.0.1:%d", port);
    ck_assert_int_eq(metrics_status(port, host), 200);
    snprintf(host, sizeof host, "localhost:%d", port);
    ck_assert_int_eq(metrics_status(port, host), 200);
    ck_assert_int_eq(metrics_status(port, "LOCALHOST"), 200);
    ck_assert_int_eq(metrics_status(port, "[::1]"), 200);
    ck_assert_int_eq(metrics_status(port, NULL), 200);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(ranking, 60),
        H_CASE(gets_count, 60),
        H_CASE(off_and_tcp, 60),
        H_CASE(leasectl_hot, 60),
        H_CASE(metrics_bounded, 60),
        H_CASE(metrics_no_key_names, 60),
        H_CASE(metrics_host_checked, 60),
    };

    return H_MAIN(fx, cases);
}
