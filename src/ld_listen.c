/*
 * Listeners: the Unix socket local apps use, loopback TCP, or the sockets
 * systemd passed us. Accepted connections become sessions.
 */
#include "ld_listen.h"

#include "ld_conf.h"
#include "ld_log.h"
#include "ld_server.h"
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
#include <netinet/in.h>

#include <event2/listener.h>
#include <event2/util.h>

#define MAX_LISTENERS 8
#define BACKLOG 511

static struct ld_listener listeners[MAX_LISTENERS];
static size_t n_listeners;
static char unix_path_created[sizeof(((struct sockaddr_un *)0)->sun_path)];

static void
accept_cb(struct evconnlistener *evl, evutil_socket_t fd,
          struct sockaddr *addr, int socklen, void *arg)
{
    LD_UNUSED(evl);
    LD_UNUSED(addr);
    LD_UNUSED(socklen);
    ld_session_new(fd, arg);
}

static void
accept_error_cb(struct evconnlistener *evl, void *arg)
{
    struct ld_listener *l = arg;
    int err = EVUTIL_SOCKET_ERROR();
    LD_UNUSED(evl);
    /* EMFILE and friends: log and carry on; libevent keeps listening. */
    log_warn("accept failed listener=%s error=\"%s\"", l->name,
             evutil_socket_error_to_string(err));
}

static struct ld_listener *
add_listener(int fd, bool is_unix, const char *name)
{
    if (n_listeners == MAX_LISTENERS) {
        log_error("too many listeners");
        return NULL;
    }
    struct ld_listener *l = &listeners[n_listeners];
    memset(l, 0, sizeof(*l));
    l->is_unix = is_unix;
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->evl = evconnlistener_new(ld_srv.base, accept_cb, l,
                                LEV_OPT_CLOSE_ON_FREE | LEV_OPT_CLOSE_ON_EXEC,
                                -1, fd);
    if (l->evl == NULL) {
        log_error("listener setup failed listener=%s", name);
        close(fd);
        return NULL;
    }
    evconnlistener_set_error_cb(l->evl, accept_error_cb);
    n_listeners++;
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
        log_error("listen.unix path exists and is not a socket path=%s",
                  path);
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

static int
open_unix(const struct ld_config *cfg)
{
    const char *path = cfg->listen.unix_path;
    struct sockaddr_un sa;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        log_error("listen.unix path too long path=%s", path);
        return LD_ERR;
    }
    if (ld_mkdir_parent(path, 0755) != LD_OK) {
        log_error("cannot create socket directory path=%s error=\"%s\"",
                  path, strerror(errno));
        return LD_ERR;
    }
    if (clear_stale_socket(path) != LD_OK) {
        return LD_ERR;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        log_error("socket failed error=\"%s\"", strerror(errno));
        return LD_ERR;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    /* Bind under a tight umask, then widen to the configured mode: the
     * socket is never reachable with looser permissions than asked. */
    mode_t old = umask(0177);
    int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc != 0) {
        log_error("bind failed path=%s error=\"%s\"", path, strerror(errno));
        close(fd);
        return LD_ERR;
    }
    snprintf(unix_path_created, sizeof(unix_path_created), "%s", path);
    if (chmod(path, cfg->listen.unix_mode) != 0) {
        log_warn("chmod failed path=%s error=\"%s\"", path, strerror(errno));
    }
    if (listen(fd, BACKLOG) != 0) {
        log_error("listen failed path=%s error=\"%s\"", path,
                  strerror(errno));
        close(fd);
        return LD_ERR;
    }
    if (add_listener(fd, true, path) == NULL) {
        return LD_ERR;
    }
    log_info("listening unix=%s mode=%04o", path,
             (unsigned)cfg->listen.unix_mode);
    return LD_OK;
}

static int
bound_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
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
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    char portstr[16];
    snprintf(portstr, sizeof(portstr), "%d", port);
    int gai = getaddrinfo(host, portstr, &hints, &res);
    if (gai != 0) {
        log_error("cannot resolve listen.tcp host=%s error=\"%s\"", host,
                  gai_strerror(gai));
        return LD_ERR;
    }
    int fd = socket(res->ai_family,
                    res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        freeaddrinfo(res);
        return LD_ERR;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(fd, BACKLOG) != 0) {
        log_error("cannot listen on tcp=%s error=\"%s\"", cfg->listen.tcp,
                  strerror(errno));
        close(fd);
        freeaddrinfo(res);
        return LD_ERR;
    }
    freeaddrinfo(res);
    int p = bound_port(fd);
    char name[300];
    snprintf(name, sizeof(name), "%s:%d", host, p);
    struct ld_listener *l = add_listener(fd, false, name);
    if (l == NULL) {
        return LD_ERR;
    }
    l->port = p;
    l->auth_required = cfg->listen.auth_token[0] != '\0';
    ld_srv.tcp_port = p;
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
        if (is_unix) {
            snprintf(name, sizeof(name), "%s",
                     ((struct sockaddr_un *)&ss)->sun_path);
        } else {
            snprintf(name, sizeof(name), "tcp:%d", bound_port(fds[i]));
        }
        struct ld_listener *l = add_listener(fds[i], is_unix, name);
        if (l == NULL) {
            return LD_ERR;
        }
        if (!is_unix) {
            l->port = bound_port(fds[i]);
            l->auth_required = cfg->listen.auth_token[0] != '\0';
            ld_srv.tcp_port = l->port;
        }
        log_info("adopted socket from systemd listener=%s", name);
    }
    return LD_OK;
}

int
ld_listen_start(struct event_base *base, const struct ld_config *cfg)
{
    LD_UNUSED(base);
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
    if (n_listeners == 0) {
        log_error("no listener configured (listen.unix and listen.tcp "
                  "are both empty)");
        return LD_ERR;
    }
    return LD_OK;
}

void
ld_listen_stop(void)
{
    for (size_t i = 0; i < n_listeners; i++) {
        if (listeners[i].evl != NULL) {
            evconnlistener_free(listeners[i].evl);
            listeners[i].evl = NULL;
        }
    }
    n_listeners = 0;
    if (unix_path_created[0] != '\0') {
        unlink(unix_path_created);
        unix_path_created[0] = '\0';
    }
}
