/*
 * Start-up, the loop, reload and the graceful stop.
 *
 * Stop is a small state machine with a bound. With shutdown.drain_ms,
 * a first TERM only drains: readiness fails, new connections are refused
 * and the sessions already open keep full service until they close, the
 * drain time passes or another signal comes. Then (or on a first INT, or
 * without drain_ms) we stop accepting, tell every session
 * {"event":"shutdown"} and close it (which releases its locks through the
 * close hooks), hand the deletes still due to Redis, flush the journal,
 * then keep the loop turning until Redis has answered what we sent or
 * the drain bound passes. A signal during that exits at once.
 *
 * It owns the process context (ctx) and the order of start, reload and stop;
 * the modules get the ctx at init and must not write it.
 */
#include "ld_server.h"

#include "ld_admin.h"
#include "ld_bloom.h"
#include "ld_cache.h"
#include "ld_cancel.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_listen.h"
#include "ld_lock.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_metrics.h"
#include "ld_near.h"
#include "ld_ns.h"
#include "ld_proto.h"
#include "ld_pubsub.h"
#include "ld_rate.h"
#include "ld_redis.h"
#include "ld_sem.h"
#include "ld_sentinel.h"
#include "ld_session.h"
#include "ld_stats.h"
#include "ld_systemd.h"
#include "ld_tls.h"
#include "ld_util.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <jansson.h>
#include <yaml.h>

#define DRAIN_CHECK_MS 10
/* How often a SIGTERM drain looks whether the last session has gone. */
#define DRAIN_SESSIONS_CHECK_MS 50
#define DRAIN_MAX_MS 3000
/* See init_state. */
#define LOOP_TIMER_CHECK_MS 2

/* The process state, ld_server.c's alone: modules get CTX at init and
 * read it; only this file writes it. */
static struct ld_ctx ctx;
static struct {
    char instance[17];     /* random id of this daemon run */
    struct ld_config *cfg; /* the live configuration, CTX's, writable */
    const char *conf_path;
    struct event *sig_term;
    struct event *sig_int;
    struct event *sig_hup;
    struct event *drain_ev;
    uint64_t drain_deadline_ms;
    struct event *sessions_ev; /* the SIGTERM drain's check */
    uint64_t sessions_deadline_ms;
    /* The directory the daemon was started in: relative paths of the
     * configuration are taken from it, at start and on every reload,
     * also after the daemon has detached to "/". */
    char start_dir[PATH_MAX];
} server_mod;

/* A secret in a file other users can read is no secret. */
static void
check_secret_mode(const char *path, const struct ld_config *cfg)
{
    struct stat st;
    const char *what = cfg->redis.password[0] != '\0' ? "redis.password"
                       : cfg->listen.auth_token[0] != '\0'
                           ? "listen.auth_token"
                       : cfg->listen.admin_token[0] != '\0'
                           ? "listen.admin_token"
                           : NULL;
    if (what == NULL) {
        return;
    }
    if (stat(path, &st) != 0 || (st.st_mode & (S_IRGRP | S_IROTH)) == 0) {
        return;
    }
    log_warn("config file holds %s and is readable by %s path=%s "
             "mode=%04o (chmod 600 it, or 640 for a trusted group)",
             what, (st.st_mode & S_IROTH) ? "others" : "its group", path,
             (unsigned)(st.st_mode & 07777));
}

int
ld_server_load_config(const struct ld_options *opt, struct ld_config *cfg)
{
    char err[1024];
    if (server_mod.start_dir[0] == '\0' &&
        getcwd(server_mod.start_dir, sizeof(server_mod.start_dir)) == NULL) {
        server_mod.start_dir[0] = '\0';
    }
    ld_conf_defaults(cfg);
    if (ld_conf_load(cfg, opt->conf_path, !opt->conf_explicit, err,
                     sizeof(err)) != LD_OK) {
        fprintf(stderr, "%s\n", err);
        return LD_ERR;
    }
    ld_conf_absolute_paths(cfg, server_mod.start_dir);
    check_secret_mode(opt->conf_path, cfg);
    return LD_OK;
}

static void
drain_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    bool drained = ld_redis_outstanding() == 0 && ld_session_lingering() == 0;
    if (drained || ld_now_ms() >= server_mod.drain_deadline_ms) {
        event_base_loopexit(ctx.base, NULL);
        return;
    }
    struct timeval tv = ld_tv_ms(DRAIN_CHECK_MS);
    event_add(server_mod.drain_ev, &tv);
}

static void
begin_shutdown(const char *why)
{
    log_info("shutting down reason=%s sessions=%lld", why, ld_session_count());
    ctx.shutting_down = true;
    ld_systemd_notify("STOPPING=1");
    ld_listen_stop();
    ld_metrics_stop();
    ld_session_shutdown_all();
    ld_lock_shutdown();
    ld_sem_shutdown();
    ld_rate_shutdown();
    ld_cache_hand_over();
    ld_cache_shutdown();
    server_mod.drain_deadline_ms = ld_now_ms() + DRAIN_MAX_MS;
    struct timeval tv = ld_tv_ms(0);
    event_add(server_mod.drain_ev, &tv);
}

static void
end_drain(const char *why)
{
    ctx.draining = false;
    evtimer_del(server_mod.sessions_ev);
    begin_shutdown(why);
}

static void
sessions_cb(evutil_socket_t fd, short what, void *arg)
{
    LD_UNUSED(fd);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    if (ld_session_count() == 0) {
        end_drain("drained");
        return;
    }
    if (ld_now_ms() >= server_mod.sessions_deadline_ms) {
        log_warn("drain time is over sessions=%lld drain_ms=%lld",
                 ld_session_count(), ctx.cfg->shutdown.drain_ms);
        end_drain("drain_ms");
        return;
    }
    struct timeval tv = ld_tv_ms(DRAIN_SESSIONS_CHECK_MS);
    evtimer_add(server_mod.sessions_ev, &tv);
}

/* Listeners and metrics stay up: a new connection gets its error line,
 * and /readyz says why it fails. */
static void
begin_drain(void)
{
    long long ms = ctx.cfg->shutdown.drain_ms;
    log_info("draining reason=SIGTERM sessions=%lld drain_ms=%lld",
             ld_session_count(), ms);
    ctx.draining = true;
    ld_systemd_notify("STOPPING=1");
    server_mod.sessions_deadline_ms = ld_now_ms() + (uint64_t)ms;
    struct timeval tv = ld_tv_ms(0);
    evtimer_add(server_mod.sessions_ev, &tv);
}

static void
stop_signal_cb(evutil_socket_t sig, short what, void *arg)
{
    LD_UNUSED(what);
    LD_UNUSED(arg);
    const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    if (ctx.draining) {
        log_info("drain ended by a second signal signal=%s sessions=%lld",
                 name, ld_session_count());
        end_drain(name);
        return;
    }
    if (ctx.shutting_down) {
        log_warn("second stop signal, exiting now signal=%d", (int)sig);
        ld_cache_shutdown();
        _exit(0);
    }
    if (sig == SIGTERM && ctx.cfg->shutdown.drain_ms > 0) {
        begin_drain();
        return;
    }
    begin_shutdown(name);
}

static void
reload(void)
{
    struct ld_config fresh;
    char err[1024];

    ld_systemd_notify("RELOADING=1");
    /* From the defaults, as at start: a key removed from the file goes
     * back to its default rather than keeping its old value. */
    ld_conf_defaults(&fresh);
    if (ld_conf_load(&fresh, server_mod.conf_path, true, err, sizeof(err)) !=
        LD_OK) {
        log_error("reload failed, keeping the running configuration "
                  "error=\"%s\"",
                  err);
    } else {
        ld_conf_absolute_paths(&fresh, server_mod.start_dir);
        check_secret_mode(server_mod.conf_path, &fresh);
        ld_conf_apply_reload(server_mod.cfg, &fresh);
        ld_log_set_level(server_mod.cfg->log.level);
        ld_near_reloaded();
        log_info("configuration reloaded path=%s", server_mod.conf_path);
    }
    ld_conf_free(&fresh);
    ld_systemd_notify("READY=1");
}

static void
hup_cb(evutil_socket_t sig, short what, void *arg)
{
    LD_UNUSED(sig);
    LD_UNUSED(what);
    LD_UNUSED(arg);
    reload();
}

static void
make_instance_id(void)
{
    unsigned char raw[8];
    static const char hex[] = "0123456789abcdef";
    if (ld_random_bytes(raw, sizeof(raw)) != LD_OK) {
        memset(raw, 0, sizeof(raw));
    }
    for (size_t i = 0; i < sizeof(raw); i++) {
        server_mod.instance[2 * i] = hex[raw[i] >> 4];
        server_mod.instance[2 * i + 1] = hex[raw[i] & 15];
    }
    server_mod.instance[16] = '\0';
}

static void
banner(void)
{
    log_info("leased %s starting config=%s pid=%d hiredis=%d.%d.%d "
             "libevent=%s jansson=%s libyaml=%s",
             PACKAGE_VERSION, server_mod.conf_path, (int)getpid(),
             HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH, event_get_version(),
             JANSSON_VERSION, yaml_get_version_string());
}

/* Descriptors the daemon needs besides its clients: stdio, the loop,
 * signals, listeners, metrics, the journal, Redis (counted apart) and
 * some slack for what libraries open. */
#define FD_RESERVE 32

static void
check_fd_limit(const struct ld_config *cfg)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
        return;
    }
    /* The command connections and the subscriber. */
    long long reserve = FD_RESERVE + cfg->redis.connections + 1;
    long long room = (long long)rl.rlim_cur - reserve;
    if (cfg->limits.max_clients > room) {
        log_warn("limits.max_clients=%lld is more than the open file limit "
                 "leaves for clients: RLIMIT_NOFILE=%llu, about %lld after "
                 "%lld for the daemon; past that, accepting pauses "
                 "(raise LimitNOFILE / ulimit -n, or lower max_clients)",
                 cfg->limits.max_clients, (unsigned long long)rl.rlim_cur,
                 room > 0 ? room : 0, reserve);
    }
}

/* Sentinel mode: every connection follows the master the Sentinels
 * name. After a failover the locks held are checked on the new master
 * (replication is asynchronous: a grant may not have reached it), and
 * so are the semaphore grants. */
static void
on_master(const struct ld_conn_addr *addr, const char *text, bool failover,
          void *arg)
{
    LD_UNUSED(arg);
    if (failover) {
        ld_lock_failover();
        ld_sem_failover();
    }
    ld_redis_set_address(addr, text);
    ld_pubsub_set_address(addr);
    ld_near_set_address(addr);
}

/* Cluster mode: a master's slots were taken over (see on_master). */
static void
on_cluster_failover(void *arg)
{
    LD_UNUSED(arg);
    ld_lock_failover();
    ld_sem_failover();
}

/* The one place that wires the modules: each gets the ctx, and the
 * layers above hand the layers below their callbacks, so no module
 * includes one above it. No socket is opened here. */
int
ld_server_wire(const struct ld_ctx *c)
{
    static const struct ld_session_handlers session_handlers = {
        .line = ld_proto_on_line,
        .error_line = ld_proto_bare_error_line,
    };

    ld_session_init(c, &session_handlers);
    ld_proto_init(c, ld_dispatch);
    ld_dispatch_init(c);
    if (ld_admin_init(c) != LD_OK) {
        return LD_ERR;
    }
    ld_ns_init(c);
    if (ld_tls_init(c) != LD_OK) {
        return LD_ERR;
    }
    if (ld_redis_init(c) != LD_OK || ld_pubsub_init(c) != LD_OK) {
        return LD_ERR;
    }
    if (ld_lock_init(c) != LD_OK || ld_cache_init(c) != LD_OK) {
        return LD_ERR;
    }
    if (ld_sem_init(c) != LD_OK || ld_cancel_init(c) != LD_OK) {
        return LD_ERR;
    }
    if (ld_rate_init(c) != LD_OK || ld_bloom_init(c) != LD_OK) {
        return LD_ERR;
    }
    if (c->cfg->redis.mode == LD_REDIS_SENTINEL) {
        if (ld_sentinel_init(c, on_master, NULL) != LD_OK) {
            return LD_ERR;
        }
        ld_redis_on_doubt(ld_sentinel_doubt, NULL);
        ld_redis_on_state(ld_sentinel_master_state, NULL);
    } else if (c->cfg->redis.mode == LD_REDIS_CLUSTER) {
        ld_redis_on_failover(on_cluster_failover, NULL);
        ld_stats_set_redis_master(ld_redis_address());
    } else {
        ld_stats_set_redis_master(c->cfg->redis.address);
    }
    return LD_OK;
}

/* The wired modules, then the sockets: listeners, metrics, Redis. */
static int
start(struct ld_config *cfg)
{
    if (ld_server_wire(&ctx) != LD_OK) {
        return LD_ERR;
    }
    if (ld_listen_init(&ctx) != LD_OK) {
        return LD_ERR;
    }
    ld_stats_set_tcp_port(ld_listen_tcp_port());
    check_fd_limit(cfg);
    if (cfg->metrics.listen[0] != '\0') {
        int port = 0;
        ld_metrics_set_ready(ld_dispatch_not_ready);
        if (ld_metrics_start(ctx.base, cfg->metrics.listen, &port) != LD_OK) {
            return LD_ERR;
        }
        log_info("metrics listening addr=%s port=%d", cfg->metrics.listen,
                 port);
    }
    ld_redis_start();
    ld_pubsub_start();
    ld_near_start();
    if (cfg->redis.mode == LD_REDIS_SENTINEL) {
        ld_sentinel_start();
    }
    return LD_OK;
}

/* The run state and the ctx, fresh; the start directory is the one
 * ld_server_load_config noted, and outlives them. */
static void
init_state(const struct ld_options *opt, struct ld_config *cfg)
{
    char start_dir[PATH_MAX];
    memcpy(start_dir, server_mod.start_dir, sizeof(start_dir));
    memset(&server_mod, 0, sizeof(server_mod));
    memcpy(server_mod.start_dir, start_dir, sizeof(start_dir));
    memset(&ctx, 0, sizeof(ctx));
    server_mod.cfg = cfg;
    server_mod.conf_path = opt->conf_path;
    make_instance_id();
    ctx.cfg = cfg;
    ctx.instance = server_mod.instance;
    ctx.start_ms = ld_now_ms();
    /* Timers are looked at again after LOOP_TIMER_CHECK_MS of callbacks
     * however many events are ready: the shared near cache's heartbeat
     * (and every other timer) is late only when one callback itself runs
     * that long, never because much work is queued. */
    struct event_config *ecfg = event_config_new();
    struct timeval check = ld_tv_ms(LOOP_TIMER_CHECK_MS);
    if (ecfg == NULL ||
        event_config_set_max_dispatch_interval(ecfg, &check, -1, 0) != 0) {
        ld_oom_in("event_config");
    }
    ctx.base = event_base_new_with_config(ecfg);
    event_config_free(ecfg);
    if (ctx.base == NULL) {
        ld_oom_in("event_base_new");
    }
}

/* Signals as loop events, and the timers of the stop. */
static void
add_events(void)
{
    server_mod.sig_term = evsignal_new(ctx.base, SIGTERM, stop_signal_cb,
                                       NULL);
    server_mod.sig_int = evsignal_new(ctx.base, SIGINT, stop_signal_cb, NULL);
    server_mod.sig_hup = evsignal_new(ctx.base, SIGHUP, hup_cb, NULL);
    server_mod.drain_ev = evtimer_new(ctx.base, drain_cb, NULL);
    server_mod.sessions_ev = evtimer_new(ctx.base, sessions_cb, NULL);
    event_add(server_mod.sig_term, NULL);
    event_add(server_mod.sig_int, NULL);
    event_add(server_mod.sig_hup, NULL);
}

/* Every module down, then the loop's own events and the loop. */
static void
free_all(void)
{
    ld_listen_stop();
    ld_metrics_stop();
    ld_session_cleanup();
    ld_rate_free();
    ld_sem_free();
    ld_lock_free();
    ld_cache_free();
    ld_sentinel_free();
    ld_pubsub_free();
    ld_redis_free();
    ld_bloom_free();
    ld_tls_free();
    ld_admin_free();
    ld_dispatch_free();
    ld_proto_free();
    event_free(server_mod.sig_term);
    event_free(server_mod.sig_int);
    event_free(server_mod.sig_hup);
    event_free(server_mod.drain_ev);
    event_free(server_mod.sessions_ev);
    event_base_free(ctx.base);
    ctx.base = NULL;
}

int
ld_server_run(const struct ld_options *opt, struct ld_config *cfg)
{
    init_state(opt, cfg);
    ld_stats_init(&ctx);
    banner();
    add_events();

    int status = 0;
    if (start(cfg) != LD_OK) {
        log_error("start-up failed");
        status = 1;
    } else {
        /* Tell systemd the truth: we are listening now. */
        ld_systemd_notify("READY=1");
        log_info("ready redis=%s tcp_port=%d", ld_redis_address(),
                 ld_listen_tcp_port());
        event_base_dispatch(ctx.base);
        log_info("stopped");
    }
    free_all();
    return status;
}
