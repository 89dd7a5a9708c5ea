/*
 * Listeners: the Unix socket local apps use, loopback TCP, or the sockets
 * systemd passed us. Accepted connections become sessions.
 *
 * This module owns the listening sockets, their pauses when accept fails
 * for want of descriptors, and the socket file it created (removed at
 * stop). An accepted connection is the session module's from the start:
 * whether it is refused (limits.max_clients, stopping) is decided there,
 * not here.
 */
#include "ld_listen.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_session.h"
#include "ld_systemd.h"
#include "ld_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <event2/listener.h>
#include <event2/util.h>

#define MAX_LISTENERS 8
#define BACKLOG 511

/* Out of descriptors (or kernel memory), accept fails while the
 * connection stays queued, so a level-triggered listener would spin on
 * it: accepting pauses this long, then tries again; the failure is
 * logged at most once per ACCEPT_LOG_MS with what was left unlogged. */
#define ACCEPT_PAUSE_MS 200
#define ACCEPT_LOG_MS 5000

struct accept_pause {
    struct event *resume_ev;
    uint64_t last_log_ms;
    unsigned long suppressed;
};

#define UNIX_PATH_BYTES sizeof(((struct sockaddr_un *)0)->sun_path)

static struct {
    const struct ld_ctx *ctx;
    struct ld_listener listeners[MAX_LISTENERS];
    struct accept_pause pauses[MAX_LISTENERS]; /* pauses[i]: listeners[i] */
    size_t n_listeners;
    int tcp_port; /* bound TCP port (useful with port 0) */
    char unix_path_created[UNIX_PATH_BYTES]; /* removed at stop */
} listen_mod;

static void
accept_cb(struct evconnlistener *evl, evutil_socket_t fd,
          struct sockaddr *addr, int socklen, void *arg)
{
    LD_UNUSED(evl);
    LD_UNUSED(addr);
    LD_UNUSED(socklen);
    struct ld_listener *l = arg;
    ld_session_new(fd, l->auth_required, l->name);
}

static void
resume_accept_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    struct ld_listener *l = arg;
    if (l->evl != NULL) {
        evconnlistener_enable(l->evl);
    }
}

static void
accept_error_cb(struct evconnlistener *evl, void *arg)
{
    struct ld_listener *l = arg;
    struct accept_pause *p = &listen_mod.pauses[l - listen_mod.listeners];
    int err = EVUTIL_SOCKET_ERROR();
    bool exhausted = err == EMFILE || err == ENFILE || err == ENOBUFS ||
                     err == ENOMEM;
    uint64_t now = ld_now_ms();

    if (p->last_log_ms != 0 && now - p->last_log_ms < ACCEPT_LOG_MS) {
        p->suppressed++;
    } else {
        log_warn("accept failed listener=%s error=\"%s\"%s "
                 "suppressed=%lu",
                 l->name, evutil_socket_error_to_string(err),
                 exhausted ? " (pausing accept; see limits.max_clients)" : "",
                 p->suppressed);
        p->last_log_ms = now;
        p->suppressed = 0;
    }
    if (exhausted && p->resume_ev != NULL) {
        struct timeval tv = ld_tv_ms(ACCEPT_PAUSE_MS);
        evconnlistener_disable(evl);
        event_add(p->resume_ev, &tv);
    }
}

static struct ld_listener *
add_listener(int fd, bool is_unix, const char *name)
{
    if (listen_mod.n_listeners == MAX_LISTENERS) {
        log_error("too many listeners");
        return NULL;
    }
    struct accept_pause *p = &listen_mod.pauses[listen_mod.n_listeners];
    struct ld_listener *l = &listen_mod.listeners[listen_mod.n_listeners];
    memset(l, 0, sizeof(*l));
    l->is_unix = is_unix;
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->evl = evconnlistener_new(listen_mod.ctx->base, accept_cb, l,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                                -1, fd);
    if (l->evl == NULL) {
        log_error("listener setup failed listener=%s", name);
        close(fd);
        return NULL;
    }
    evconnlistener_set_error_cb(l->evl, accept_error_cb);
    memset(p, 0, sizeof(*p));
    p->resume_ev = evtimer_new(listen_mod.ctx->base, resume_accept_cb, l);
    listen_mod.n_listeners++;
    return l;
}

/* A socket file left by a daemon that died is replaced; one that a live
 * daemon answers on is not, so two daemons never fight over a path. */
static int
clear_stale_socket(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        return errno == ENOENT ? LD_OK : LD_ERR;
    }
    if (!S_ISSOCK(st.st_mode)) {
        log_error("listen.unix path exists and is not a socket path=%s", path);
        return LD_ERR;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return LD_ERR;
    }
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    close(fd);
    if (rc == 0) {
        log_error("another daemon is listening path=%s", path);
        return LD_ERR;
    }
    if (unlink(path) != 0 && errno != ENOENT) {
        log_error("cannot remove stale socket path=%s error=\"%s\"", path,
                  strerror(errno));
        return LD_ERR;
    }
    log_info("removed stale socket path=%s", path);
    return LD_OK;
}

/* A socket bound to PATH, or -1. It is bound under a tight umask, then
 * widened to the configured mode (set_socket_access): the socket is never
 * reachable with looser permissions than asked. */
static int
bind_unix(const char *path)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        log_error("socket failed error=\"%s\"", strerror(errno));
        return -1;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc != 0) {
        log_error("bind failed path=%s error=\"%s\"", path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* The socket file gets the group and mode of listen.unix_group and
 * listen.unix_mode. */
static int
set_socket_access(const struct ld_config *cfg, const char *path)
{
    gid_t gid;
    if (cfg->listen.unix_group[0] != '\0' &&
        ld_conf_parse_group(cfg->listen.unix_group, &gid) &&
        chown(path, (uid_t)-1, gid) != 0) {
        /* A socket its clients cannot reach is no use: fail loudly. */
        log_error("cannot set the socket's group path=%s group=%s "
                  "error=\"%s\"",
                  path, cfg->listen.unix_group, strerror(errno));
        return LD_ERR;
    }
    if (chmod(path, cfg->listen.unix_mode) != 0) {
        log_warn("chmod failed path=%s error=\"%s\"", path, strerror(errno));
    }
    return LD_OK;
}

static int
open_unix(const struct ld_config *cfg)
{
    const char *path = cfg->listen.unix_path;

    if (strlen(path) >= UNIX_PATH_BYTES) {
        log_error("listen.unix path too long path=%s", path);
        return LD_ERR;
    }
    if (ld_mkdir_parent(path, 0755) != LD_OK) {
        log_error("cannot create socket directory path=%s error=\"%s\"", path,
                  strerror(errno));
        return LD_ERR;
    }
    if (clear_stale_socket(path) != LD_OK) {
        return LD_ERR;
    }
    int fd = bind_unix(path);
    if (fd < 0) {
        return LD_ERR;
    }
    snprintf(listen_mod.unix_path_created,
             sizeof(listen_mod.unix_path_created), "%s", path);
    if (set_socket_access(cfg, path) != LD_OK) {
        close(fd);
        return LD_ERR;
    }
    if (listen(fd, BACKLOG) != 0) {
        log_error("listen failed path=%s error=\"%s\"", path, strerror(errno));
        close(fd);
        return LD_ERR;
    }
    if (add_listener(fd, true, path) == NULL) {
        return LD_ERR;
    }
    log_info("listening unix=%s mode=%04o group=%s", path,
             (unsigned)cfg->listen.unix_mode,
             cfg->listen.unix_group[0] != '\0' ? cfg->listen.unix_group : "-");
    return LD_OK;
}

/* A socket listening on HOST:PORT (listen.tcp), or -1. */
static int
listen_tcp(const struct ld_config *cfg, const char *host, int port)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16];
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(portstr, sizeof(portstr), "%d", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0) {
        log_error("cannot resolve listen.tcp host=%s error=\"%s\"", host,
                  gai_strerror(gai));
        return -1;
    }
    int fd = socket(res->ai_family,
                    res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return -1;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(fd, BACKLOG) != 0) {
        log_error("cannot listen on tcp=%s error=\"%s\"", cfg->listen.tcp,
                  strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static int
open_tcp(const struct ld_config *cfg)
{
    char host[256];
    int port = 0;
    if (ld_parse_hostport(cfg->listen.tcp, host, sizeof(host), &port) !=
        LD_OK) {
        log_error("bad listen.tcp value=%s", cfg->listen.tcp);
        return LD_ERR;
    }
    int fd = listen_tcp(cfg, host, port);
    if (fd < 0) {
        return LD_ERR;
    }
    int p = ld_bound_port(fd);
    char name[300];
    snprintf(name, sizeof(name), "%s:%d", host, p);
    struct ld_listener *l = add_listener(fd, false, name);
    if (l == NULL) {
        return LD_ERR;
    }
    l->port = p;
    l->auth_required = cfg->listen.auth_token[0] != '\0';
    listen_mod.tcp_port = p;
    log_info("listening tcp=%s auth=%s", name,
             l->auth_required ? "required" : "off");
    return LD_OK;
}

static int
adopt(const struct ld_config *cfg, int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        if (getsockname(fds[i], (struct sockaddr *)&ss, &len) != 0) {
            log_error("passed fd %d is not a socket", fds[i]);
            return LD_ERR;
        }
        evutil_make_socket_nonblocking(fds[i]);
        bool is_unix = ss.ss_family == AF_UNIX;
        char name[160];
        char host[INET6_ADDRSTRLEN] = "";
        if (is_unix) {
            snprintf(name, sizeof(name), "%s",
                     ((struct sockaddr_un *)&ss)->sun_path);
        } else {
            if (getnameinfo((struct sockaddr *)&ss, len, host, sizeof(host),
                            NULL, 0, NI_NUMERICHOST) != 0) {
                host[0] = '\0';
            }
            snprintf(name, sizeof(name), "%s:%d", host, ld_bound_port(fds[i]));
        }
        /* The rule of listen.tcp holds for sockets systemd made too: a
         * TCP port reachable from other hosts needs the token. */
        if (!is_unix && cfg->listen.auth_token[0] == '\0' &&
            !ld_host_is_loopback(host)) {
            log_error("socket passed by systemd listens beyond loopback "
                      "and listen.auth_token is empty; refusing to start "
                      "listener=%s (set listen.auth_token or bind the "
                      "socket unit to 127.0.0.1)",
                      name);
            return LD_ERR;
        }
        struct ld_listener *l = add_listener(fds[i], is_unix, name);
        if (l == NULL) {
            return LD_ERR;
        }
        if (!is_unix) {
            l->port = ld_bound_port(fds[i]);
            l->auth_required = cfg->listen.auth_token[0] != '\0';
            listen_mod.tcp_port = l->port;
        }
        log_info("adopted socket from systemd listener=%s", name);
    }
    return LD_OK;
}

int
ld_listen_tcp_port(void)
{
    return listen_mod.tcp_port;
}

int
ld_listen_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    listen_mod.ctx = ctx;
    listen_mod.tcp_port = 0;
    int *fds = NULL;
    int n = ld_systemd_listen_fds(&fds);
    if (n < 0) {
        log_error("LISTEN_FDS is set but the sockets passed are unusable");
        return LD_ERR;
    }
    if (n > 0) {
        int rc = adopt(cfg, fds, n);
        free(fds);
        return rc;
    }
    free(fds);
    if (cfg->listen.unix_path[0] != '\0' && open_unix(cfg) != LD_OK) {
        return LD_ERR;
    }
    if (cfg->listen.tcp[0] != '\0' && open_tcp(cfg) != LD_OK) {
        return LD_ERR;
    }
    if (listen_mod.n_listeners == 0) {
        log_error("no listener configured (listen.unix and listen.tcp "
                  "are both empty)");
        return LD_ERR;
    }
    return LD_OK;
}

void
ld_listen_stop(void)
{
    for (size_t i = 0; i < listen_mod.n_listeners; i++) {
        struct ld_listener *l = &listen_mod.listeners[i];
        struct accept_pause *p = &listen_mod.pauses[i];
        if (l->evl != NULL) {
            evconnlistener_free(l->evl);
            l->evl = NULL;
        }
        if (p->resume_ev != NULL) {
            event_free(p->resume_ev);
            p->resume_ev = NULL;
        }
    }
    listen_mod.n_listeners = 0;
    if (listen_mod.unix_path_created[0] != '\0') {
        unlink(listen_mod.unix_path_created);
        listen_mod.unix_path_created[0] = '\0';
    }
}
