/* contrib/monitoring against the real thing: Debian's prometheus scrapes
 * a real leased (under a little lock and cache traffic, against a real
 * redis-server) with leased-rules.yml loaded, and every query of
 * leased-dashboard.json must come back from its HTTP API with data. A
 * missing prometheus binary fails the test (Debian package prometheus; or
 * set PROMETHEUS). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 5000
#define DATA_MS 45000 /* scrapes every second, rates over a minute */
#define HTTP_MAX (1 << 20)

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "dashboard",
    .redis = {&R},
    .daemons = {&D},
};

/* The body of GET PATH on 127.0.0.1:PORT (malloc'd), NULL when no 200
 * reply came. */
static char *
http_get(int port, const char *path)
{
    struct sockaddr_in sa;
    struct timeval tv = {5, 0};
    char *req = NULL, *buf = malloc(HTTP_MAX);
    size_t len = 0;
    ssize_t n;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_ptr_nonnull(buf);
    ck_assert_int_ge(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_gt(
        asprintf(&req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path), 0);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
        goto fail;
    }
    while (len < HTTP_MAX - 1 &&
           (n = read(fd, buf + len, HTTP_MAX - 1 - len)) > 0) {
        len += (size_t)n;
    }
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.", 7) != 0 || strstr(buf, " 200 ") == NULL ||
        body == NULL) {
        goto fail;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    close(fd);
    free(req);
    return buf;
fail:
    close(fd);
    free(req);
    free(buf);
    return NULL;
}

static void
url_encode(const char *s, char *out, size_t outlen)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;

    for (; *s && o + 4 < outlen; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
            (c >= '0' && c <= '9') || strchr("-_.~", c)) {
            out[o++] = (char)c;
        } else {
            out[o++] = '%';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    out[o] = '\0';
}

/* How many series EXPR gives now; -1 when the query failed. */
static int
series_of(int port, const char *expr)
{
    char enc[4096], path[4200];
    json_error_t e;

    url_encode(expr, enc, sizeof enc);
    snprintf(path, sizeof path, "/api/v1/query?query=%s", enc);
    char *body = http_get(port, path);
    if (body == NULL) {
        return -1;
    }
    json_t *j = json_loads(body, 0, &e);
    free(body);
    int n = -1;
    if (j != NULL &&
        strcmp(jstr(j, "status") ? jstr(j, "status") : "", "success") == 0) {
        n = (int)json_array_size(
            json_object_get(json_object_get(j, "data"), "result"));
    }
    json_decref(j);
    return n;
}

struct board {
    json_t *exprs; /* the dashboard's queries */
    bool *seen;
    int prom_port;
    struct h_conn *c;
    int round;
};

/* A little traffic of every kind the dashboard shows. */
static void
load(struct h_conn *c, int round)
{
    char key[32];
    json_t *r;

    snprintf(key, sizeof key, "d:%d", round % 4);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", key);
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", key);
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key", key,
                "value", "v");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", key);
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "d:none");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "no.such.op");
    json_decref(r);
}

static bool
every_query_has_data(void *arg)
{
    struct board *b = arg;
    bool all = true;

    load(b->c, b->round++);
    for (size_t i = 0; i < json_array_size(b->exprs); i++) {
        if (!b->seen[i]) {
            b->seen[i] = series_of(b->prom_port,
                                   json_string_value(
                                       json_array_get(b->exprs, i))) > 0;
            all &= b->seen[i];
        }
    }
    return all;
}

static json_t *
dashboard_exprs(void)
{
    const char *src = getenv("LD_SRCDIR");
    char path[1024];
    json_error_t e;
    json_t *panel, *target, *exprs = json_array();
    size_t i, k;

    snprintf(path, sizeof path, "%s/contrib/monitoring/leased-dashboard.json",
             src ? src : ".");
    json_t *d = json_load_file(path, 0, &e);
    ck_assert_msg(d != NULL, "%s: %s", path, e.text);
    json_array_foreach(json_object_get(d, "panels"), i, panel)
    {
        json_array_foreach(json_object_get(panel, "targets"), k, target)
        {
            json_array_append(exprs, json_object_get(target, "expr"));
        }
    }
    json_decref(d);
    ck_assert_int_gt(json_array_size(exprs), 0);
    return exprs;
}

static pid_t
start_prometheus(const char *bin, int port, int metrics_port)
{
    const char *src = getenv("LD_SRCDIR");
    char conf[512], data[512], log[512], listen[64], cflag[600], dflag[600];
    FILE *f;

    snprintf(conf, sizeof conf, "%s/prometheus.yml", D.dir);
    snprintf(data, sizeof data, "%s/prometheus-data", D.dir);
    snprintf(log, sizeof log, "%s/prometheus.log", D.dir);
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f,
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "rule_files:\n  - %s/contrib/monitoring/leased-rules.yml\n"
            "scrape_configs:\n  - job_name: leased\n    static_configs:\n"
            "      - targets: ['127.0.0.1:%d']\n",
            src ? src : ".", metrics_port);
    ck_assert_int_eq(fclose(f), 0);
    snprintf(listen, sizeof listen, "--web.listen-address=127.0.0.1:%d", port);
    snprintf(cflag, sizeof cflag, "--config.file=%s", conf);
    snprintf(dflag, sizeof dflag, "--storage.tsdb.path=%s", data);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, cflag, dflag, listen, (char *)NULL);
        _exit(127);
    }
    h_track_pid(pid);
    return pid;
}

static bool
prometheus_ready(void *arg)
{
    char *body = http_get(*(int *)arg, "/-/ready");
    free(body);
    return body != NULL;
}

START_TEST(test_every_dashboard_query_has_data)
{
    const char *bin = getenv("PROMETHEUS");
    char yaml[128];
    int mport = h_free_port(), pport = h_free_port();

    if (bin == NULL || bin[0] == '\0') {
        bin = "/usr/bin/prometheus";
    }
    ck_assert_msg(access(bin, X_OK) == 0,
                  "%s not found (Debian package prometheus; or set "
                  "PROMETHEUS)",
                  bin);
    snprintf(yaml, sizeof yaml, "metrics:\n  listen: 127.0.0.1:%d\n", mport);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);

    pid_t pid = start_prometheus(bin, pport, mport);
    ck_assert_msg(h_wait_until(prometheus_ready, &pport, 20000),
                  "prometheus did not become ready (see %s/prometheus.log)",
                  D.dir);

    struct board b = {.exprs = dashboard_exprs(), .prom_port = pport};
    b.seen = calloc(json_array_size(b.exprs), sizeof *b.seen);
    b.c = h_connect_ok(&D);
    bool all = h_wait_until(every_query_has_data, &b, DATA_MS);
    for (size_t i = 0; !all && i < json_array_size(b.exprs); i++) {
        if (!b.seen[i]) {
            fprintf(stderr, "no data: %s\n",
                    json_string_value(json_array_get(b.exprs, i)));
        }
    }
    ck_assert_msg(all, "dashboard queries without data (listed above)");
    h_close(b.c);
    free(b.seen);
    json_decref(b.exprs);

    kill(pid, SIGTERM);
    ck_assert_int_eq(waitpid(pid, NULL, 0), pid);
    h_untrack_pid(pid);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(every_dashboard_query_has_data, 90),
    };

    return H_MAIN(fx, cases);
}
