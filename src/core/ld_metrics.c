/* The Prometheus endpoint: GET /metrics on metrics.listen, served by
 * libevent's evhttp on the daemon's own loop, with the health checks
 * GET /livez and GET /readyz beside it. The figures are the ones of
 * the `stats` op (ld_stats.c renders both), so the two views never
 * disagree. Nothing here changes state; a scrape only reads counters.
 *
 * It owns the HTTP listener only: the figures are ld_stats.c's, and readiness
 * is asked of the function the server hands in. */

#include "ld_metrics.h"

#include "ld_log.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

/* A scraper that stalls must not keep a connection forever. */
#define LD_METRICS_TIMEOUT_S 10
/* Requests are a GET line and a few headers; nothing larger is expected. */
#define LD_METRICS_MAX_HEADERS_BYTES 8192
#define LD_METRICS_MAX_BODY_BYTES 1024

/* Refused Host header: the status a browser's page gets. */
#define LD_HTTP_FORBIDDEN 403

static struct {
    struct evhttp *http;
    /* metrics.listen's host, the name the endpoint answers to. */
    char host[256];
    ld_metrics_ready_fn *ready_fn;
} metrics_mod;

#define LD_HTTP_UNAVAILABLE 503

void
ld_metrics_set_ready(ld_metrics_ready_fn *fn)
{
    metrics_mod.ready_fn = fn;
}

static void
free_text(const void *data, size_t len, void *arg)
{
    LD_UNUSED(len);
    LD_UNUSED(arg);
    free((void *)data);
}

/* The host of a Host header value V (without its port; an IPv6 address
 * without its brackets) into OUT; false when V is malformed. */
static bool
host_part(const char *v, char *out, size_t outlen)
{
    const char *h = v;
    const char *end;

    if (v[0] == '[') {
        h = v + 1;
        end = strchr(h, ']');
        if (end == NULL || (end[1] != '\0' && end[1] != ':')) {
            return false;
        }
    } else {
        end = strchr(v, ':');
        if (end == NULL) {
            end = v + strlen(v);
        } else if (strchr(end + 1, ':') != NULL) {
            return false;
        }
    }
    size_t n = (size_t)(end - h);
    if (n == 0 || n >= outlen) {
        return false;
    }
    memcpy(out, h, n);
    out[n] = '\0';
    return true;
}

static bool
is_address(const char *h)
{
    struct in6_addr a6;
    struct in_addr a4;
    return inet_pton(AF_INET, h, &a4) == 1 || inet_pton(AF_INET6, h, &a6) == 1;
}

static bool
is_wildcard(const char *h)
{
    return strcmp(h, "0.0.0.0") == 0 || strcmp(h, "::") == 0;
}

/* DNS rebinding lets a web page read an endpoint on loopback through a
 * name it controls, made to resolve to 127.0.0.1; the browser still sends
 * that name as Host. So only the listener's own names are served: its
 * address, localhost, 127.0.0.1 and [::1], and on a wildcard address any
 * address literal (no DNS answer changes one). Without a Host header
 * (HTTP/1.0) the request comes from no browser. */
static bool
host_allowed(const char *v)
{
    char h[256];

    if (v == NULL) {
        return true;
    }
    if (!host_part(v, h, sizeof(h))) {
        return false;
    }
    if (strcasecmp(h, "localhost") == 0 || strcmp(h, "127.0.0.1") == 0 ||
        strcmp(h, "::1") == 0 || strcasecmp(h, metrics_mod.host) == 0) {
        return true;
    }
    return is_wildcard(metrics_mod.host) && is_address(h);
}

static void
metrics_cb(struct evhttp_request *req, void *arg)
{
    struct evbuffer *out;
    char *text;
    size_t len;

    LD_UNUSED(arg);
    if (!host_allowed(evhttp_find_header(evhttp_request_get_input_headers(req),
                                         "Host"))) {
        log_debug("metrics refused reason=host");
        evhttp_send_error(req, LD_HTTP_FORBIDDEN, "Forbidden");
        return;
    }
    text = ld_stats_prometheus(&len);
    if (text == NULL) {
        log_error("metrics render failed reason=out_of_memory");
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4; charset=utf-8");
    out = evhttp_request_get_output_buffer(req);
    /* Hand the rendered text over without a copy; the buffer frees it. */
    if (evbuffer_add_reference(out, text, len, free_text, NULL) != 0) {
        free(text);
        evhttp_send_error(req, HTTP_INTERNAL, NULL);
        return;
    }
    evhttp_send_reply(req, HTTP_OK, "OK", NULL);
}

static void
send_text(struct evhttp_request *req, int code, const char *reason,
          const char *body)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; charset=utf-8");
    evbuffer_add_printf(evhttp_request_get_output_buffer(req), "%s\n", body);
    evhttp_send_reply(req, code, reason, NULL);
}

/* Served by the loop itself, so an answer at all means it turns. */
static void
livez_cb(struct evhttp_request *req, void *arg)
{
    LD_UNUSED(arg);
    if (!host_allowed(evhttp_find_header(evhttp_request_get_input_headers(req),
                                         "Host"))) {
        evhttp_send_error(req, LD_HTTP_FORBIDDEN, "Forbidden");
        return;
    }
    send_text(req, HTTP_OK, "OK", "ok");
}

static void
readyz_cb(struct evhttp_request *req, void *arg)
{
    LD_UNUSED(arg);
    if (!host_allowed(evhttp_find_header(evhttp_request_get_input_headers(req),
                                         "Host"))) {
        evhttp_send_error(req, LD_HTTP_FORBIDDEN, "Forbidden");
        return;
    }
    const char *why = metrics_mod.ready_fn != NULL ? metrics_mod.ready_fn()
                                                   : NULL;
    if (why != NULL) {
        send_text(req, LD_HTTP_UNAVAILABLE, "Service Unavailable", why);
        return;
    }
    send_text(req, HTTP_OK, "OK", "ready");
}

static void
not_found_cb(struct evhttp_request *req, void *arg)
{
    LD_UNUSED(arg);
    evhttp_send_error(req, HTTP_NOTFOUND, NULL);
}

/* The HTTP server: GET and HEAD of three paths, small requests, and a
 * bound on slow clients. */
static struct evhttp *
http_new(struct event_base *base)
{
    struct evhttp *http = evhttp_new(base);
    if (http == NULL) {
        return NULL;
    }
    evhttp_set_allowed_methods(http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(http, LD_METRICS_TIMEOUT_S);
    evhttp_set_max_headers_size(http, LD_METRICS_MAX_HEADERS_BYTES);
    evhttp_set_max_body_size(http, LD_METRICS_MAX_BODY_BYTES);
    evhttp_set_cb(http, "/metrics", metrics_cb, NULL);
    evhttp_set_cb(http, "/livez", livez_cb, NULL);
    evhttp_set_cb(http, "/readyz", readyz_cb, NULL);
    evhttp_set_gencb(http, not_found_cb, NULL);
    return http;
}

/* The server on HOST:PORT (LISTEN as configured, for the log): the port
 * it got (PORT may be 0), or -1. */
static int
http_bind(const char *listen, const char *host, int port)
{
    struct evhttp_bound_socket *bs = evhttp_bind_socket_with_handle(
        metrics_mod.http, host, (ev_uint16_t)port);
    if (bs == NULL) {
        log_error("metrics bind failed listen=%s error=\"%s\"", listen,
                  strerror(errno));
        return -1;
    }
    int bound = ld_bound_port(evhttp_bound_socket_get_fd(bs));
    if (bound < 0) {
        log_error("metrics getsockname failed error=\"%s\"", strerror(errno));
    }
    return bound;
}

int
ld_metrics_start(struct event_base *base, const char *listen, int *bound_port)
{
    char host[256];
    int port;

    if (bound_port != NULL) {
        *bound_port = 0;
    }
    if (listen == NULL || listen[0] == '\0') {
        return LD_OK;
    }
    if (metrics_mod.http != NULL) {
        ld_metrics_stop();
    }
    if (ld_parse_hostport(listen, host, sizeof(host), &port) != LD_OK) {
        log_error("metrics bad address listen=%s", listen);
        return LD_ERR;
    }
    snprintf(metrics_mod.host, sizeof(metrics_mod.host), "%s", host);

    metrics_mod.http = http_new(base);
    if (metrics_mod.http == NULL) {
        log_error("metrics start failed reason=evhttp_new");
        return LD_ERR;
    }

    port = http_bind(listen, host, port);
    if (port < 0) {
        ld_metrics_stop();
        return LD_ERR;
    }
    /* The endpoint has no authentication; say so when it is exposed.
     * The caller logs the listening address itself. */
    if (!ld_host_is_loopback(host)) {
        log_warn("metrics listening beyond loopback host=%s", host);
    }
    if (bound_port != NULL) {
        *bound_port = port;
    }
    return LD_OK;
}

void
ld_metrics_stop(void)
{
    if (metrics_mod.http != NULL) {
        evhttp_free(metrics_mod.http);
        metrics_mod.http = NULL;
    }
}
