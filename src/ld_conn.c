/*
 * The parts every Redis connection shares: address, transport, backoff,
 * authentication. hiredis' libevent adapter is all static functions; it
 * is included here only, so the transport has one home.
 */
#include "ld_conn.h"

#include "ld_conf.h"
#include "ld_util.h"

#include <stdio.h>
#include <string.h>

#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/adapters/libevent.h>

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

int
ld_conn_parse_address(const char *addr, struct ld_conn_addr *out)
{
    if (addr[0] == '/') {
        snprintf(out->host, sizeof(out->host), "%s", addr);
        out->port = 0;
        out->is_unix = true;
        return LD_OK;
    }
    out->is_unix = false;
    return ld_parse_hostport(addr, out->host, sizeof(out->host),
                             &out->port);
}

struct redisAsyncContext *
ld_conn_open(const struct ld_conn_addr *addr, struct event_base *base,
             char *err, size_t errlen)
{
    redisAsyncContext *ac = addr->is_unix
                                ? redisAsyncConnectUnix(addr->host)
                                : redisAsyncConnect(addr->host, addr->port);
    if (ac == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    if (ac->err) {
        snprintf(err, errlen, "%s", ac->errstr);
        redisAsyncFree(ac);
        return NULL;
    }
    redisLibeventAttach(ac, base);
    return ac;
}

void
ld_backoff_reset(struct ld_backoff *b)
{
    b->ms = BACKOFF_MIN_MS;
}

int
ld_backoff_next_ms(struct ld_backoff *b)
{
    if (b->ms < BACKOFF_MIN_MS) {
        b->ms = BACKOFF_MIN_MS;
    }
    int ms = b->ms / 2 + (int)(ld_random_unit() * (b->ms / 2 + 1));
    b->ms *= 2;
    if (b->ms > BACKOFF_MAX_MS) {
        b->ms = BACKOFF_MAX_MS;
    }
    return ms;
}

int
ld_conn_auth_argv(const struct ld_config *cfg, const char **argv,
                  size_t *argvlen)
{
    if (cfg->redis.password[0] == '\0') {
        return 0;
    }
    int n = 0;
    argv[n] = "AUTH";
    argvlen[n++] = 4;
    if (cfg->redis.username[0] != '\0') {
        argv[n] = cfg->redis.username;
        argvlen[n] = strlen(argv[n]);
        n++;
    }
    argv[n] = cfg->redis.password;
    argvlen[n] = strlen(argv[n]);
    n++;
    return n;
}
