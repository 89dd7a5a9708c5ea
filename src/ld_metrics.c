/* The Prometheus endpoint: GET /metrics on metrics.listen, served by
 * libevent's evhttp on the daemon's own loop. The figures are the ones of
 * the `stats` op (ld_stats.c renders both), so the two views never
 * disagree. Nothing here changes state; a scrape only reads counters. */

#include "ld_metrics.h"

#include "ld_log.h"
#include "ld_stats.h"
#include "ld_util.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>

/* A scraper that stalls must not keep a connection forever. */
#define LD_METRICS_TIMEOUT_S 10
/* Requests are a GET line and a few headers; nothing larger is expected. */
#define LD_METRICS_MAX_HEADERS_BYTES 8192
#define LD_METRICS_MAX_BODY_BYTES 1024

static struct evhttp *metrics_http;

static void
free_text(const void *data, size_t len, void *arg)
{
    LD_UNUSED(len);
    LD_UNUSED(arg);
    free((void *)data);
}

static void
metrics_cb(struct evhttp_request *req, void *arg)
{
    struct evbuffer *out;
    char *text;
    size_t len;

    LD_UNUSED(arg);
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
not_found_cb(struct evhttp_request *req, void *arg)
{
    LD_UNUSED(arg);
    evhttp_send_error(req, HTTP_NOTFOUND, NULL);
}

static int
bound_port_of(struct evhttp_bound_socket *bs)
{
    struct sockaddr_storage ss;
    socklen_t sslen = sizeof(ss);
    evutil_socket_t fd = evhttp_bound_socket_get_fd(bs);

    if (getsockname(fd, (struct sockaddr *)&ss, &sslen) != 0) {
        return -1;
    }
    if (ss.ss_family == AF_INET) {
        return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    if (ss.ss_family == AF_INET6) {
        return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    return -1;
}

int
ld_metrics_start(struct event_base *base, const char *listen, int *bound_port)
{
    struct evhttp_bound_socket *bs;
    char host[256];
    int port;

    if (bound_port != NULL) {
        *bound_port = 0;
    }
    if (listen == NULL || listen[0] == '\0') {
        return LD_OK;
    }
    if (metrics_http != NULL) {
        ld_metrics_stop();
    }
    if (ld_parse_hostport(listen, host, sizeof(host), &port) != LD_OK) {
        log_error("metrics bad address listen=%s", listen);
        return LD_ERR;
    }

    metrics_http = evhttp_new(base);
    if (metrics_http == NULL) {
        log_error("metrics start failed reason=evhttp_new");
        return LD_ERR;
    }
    evhttp_set_allowed_methods(metrics_http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD);
    evhttp_set_timeout(metrics_http, LD_METRICS_TIMEOUT_S);
    evhttp_set_max_headers_size(metrics_http, LD_METRICS_MAX_HEADERS_BYTES);
    evhttp_set_max_body_size(metrics_http, LD_METRICS_MAX_BODY_BYTES);
    evhttp_set_cb(metrics_http, "/metrics", metrics_cb, NULL);
    evhttp_set_gencb(metrics_http, not_found_cb, NULL);

    bs = evhttp_bind_socket_with_handle(metrics_http, host, (ev_uint16_t)port);
    if (bs == NULL) {
        log_error("metrics bind failed listen=%s error=\"%s\"", listen,
                  strerror(errno));
        ld_metrics_stop();
        return LD_ERR;
    }
    port = bound_port_of(bs);
    if (port < 0) {
        log_error("metrics getsockname failed error=\"%s\"", strerror(errno));
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
    if (metrics_http != NULL) {
        evhttp_free(metrics_http);
        metrics_http = NULL;
    }
}
