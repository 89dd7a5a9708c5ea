#ifndef LD_REDIS_H
#define LD_REDIS_H

#include "ld_common.h"
#include "ld_lua.h"

#include <hiredis/hiredis.h>

struct event_base;
struct ld_config;

/* The Redis backend: redis.connections pipelined command connections shared
 * by every session. Commands from all sessions are appended to the chosen
 * connection's output buffer and leave in one write per loop iteration,
 * which is the auto-pipelining the daemon's throughput rests on. Commands
 * with the same route go to the same connection, so their effects keep the
 * order in which they were issued. */

/* Script ids, one per file in src/lua/ (LD_SCRIPT_lock_acquire, ...). */
enum ld_script_id {
#define LD_SCRIPT_ENUM(name) LD_SCRIPT_##name,
    LD_LUA_SCRIPTS(LD_SCRIPT_ENUM)
#undef LD_SCRIPT_ENUM
    LD_SCRIPT__COUNT
};

/* REPLY is NULL when the command got no answer: no connection was ready,
 * redis.timeout_ms passed, or the connection broke (the command may then
 * have run or not). Redis errors arrive as REDIS_REPLY_ERROR replies. The
 * reply is freed after the callback returns. The callback is never called
 * from inside ld_redis_command/ld_redis_script. */
typedef void ld_redis_cb(redisReply *reply, void *arg);

int ld_redis_init(struct event_base *base, const struct ld_config *cfg);
void ld_redis_free(void);

/* Start connecting (called once at start). */
void ld_redis_start(void);

bool ld_redis_ready(void);

/* Commands sent and not yet answered, over all connections (the graceful
 * stop waits for this to reach zero, within a bound). */
long long ld_redis_outstanding(void);

/* Send a command. ROUTE (usually the Redis key) picks the connection. */
void ld_redis_command(const char *route, size_t route_len, int argc,
                      const char **argv, const size_t *argvlen,
                      ld_redis_cb *cb, void *arg);

/* Run a script by EVALSHA (EVAL after NOSCRIPT). ARGV holds NKEYS keys
 * followed by the script's arguments (ARGC in all). */
void ld_redis_script(enum ld_script_id script, const char *route,
                     size_t route_len, int nkeys, int argc, const char **argv,
                     const size_t *argvlen, ld_redis_cb *cb, void *arg);

/* Notified when the backend becomes usable (first connection ready after
 * none was) and when it becomes unusable (no connection ready). */
typedef void ld_redis_state_fn(bool up, void *arg);
void ld_redis_on_state(ld_redis_state_fn *fn, void *arg);

/* Host/port/path of the configured standalone address, for the subscriber
 * connection and logs. */
const char *ld_redis_address(void);

/* "host:port" or an absolute Unix socket path. */
int ld_redis_parse_address(const char *addr, char *host, size_t hostlen,
                           int *port, bool *is_unix);

/* Helpers for reply checks. */
bool ld_reply_is_error(const redisReply *r, const char *prefix);

#endif
