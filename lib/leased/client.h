#ifndef LEASED_CLIENT_H
#define LEASED_CLIENT_H

/* libleased: a blocking C client for the leased lock and cache sidecar,
 * speaking protocol version 1 (leased-protocol(7)).
 *
 * Link with `pkg-config --libs --static leased` (the library is static
 * and uses jansson). Every public symbol starts with leased_ / LEASED_.
 *
 * Calls.  Every operation of the wire contract has a blocking call that
 * sends one request and waits for its reply. A call returns LEASED_OK (0)
 * or one of the LEASED_E_* codes below; when ERR is not NULL it is filled
 * in with the code, a message and, for not_held, the reason. A call that
 * "did not succeed" in the ordinary sense (a lock that was not acquired, a
 * cache miss, a fill that was not stored) is not an error: it returns
 * LEASED_OK with the outcome in its result struct, as on the wire.
 *
 * Timeouts.  Each call waits at most the connection's timeout
 * (leased_options.timeout_ms, default LEASED_DEFAULT_TIMEOUT_MS). A call
 * that asks the daemon to wait (lock with wait_ms, cache.get/mget with
 * wait_ms) gets that much more; wait_ms -1 on lock waits without limit.
 * On LEASED_E_TIMEOUT the connection stays usable and the late reply is
 * discarded when it comes, but the request may still take effect: a lock
 * that timed out may be granted later to this session. Close the
 * connection (which releases its session-bound locks) when that matters.
 *
 * Replies and events.  Requests carry ids chosen by the library; replies
 * that arrive for another request in flight are kept until it is waited
 * for, and replies to abandoned (timed-out) requests are dropped. Events
 * (lock_lost, shutdown) that arrive during any call are handed to the
 * callback set with leased_set_event_callback, or, without a callback,
 * queued for leased_next_event. Use leased_fd with poll(2) to learn when
 * the daemon sent something, then leased_next_event or leased_dispatch.
 *
 * Connections and restarts.  A connection is one session of the daemon:
 * its session-bound locks live as long as it. The library never
 * reconnects by itself, because a new session does not hold the old
 * one's locks. After LEASED_E_IO (the daemon closed the connection, e.g.
 * on restart), every further call fails with LEASED_E_IO until
 * leased_reconnect opens a new session to the same target with the same
 * options; locks must then be taken again.
 *
 * Threads.  The library has no global state. A connection is not
 * thread-safe: use one connection per thread, or serialise every call on
 * a shared connection (including leased_next_event, leased_dispatch and
 * leased_close) with your own mutex. Threads that share a connection
 * share its session: give each its own owner in leased_lock_opts (and
 * unlock by it or by token), or one thread's lock of a key another holds
 * is a reentry, not a wait. Event callbacks run on the thread
 * that made the call during which the event arrived, and must not call
 * into the same connection. The library never changes signal dispositions;
 * writes use MSG_NOSIGNAL, so a closed peer gives LEASED_E_IO, not
 * SIGPIPE.
 *
 * Memory.  Results that own memory have a *_free function; strings
 * returned through char ** are freed with leased_free. leased_close frees
 * everything the connection holds. */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LEASED_PROTOCOL_VERSION 1
#define LEASED_DEFAULT_TIMEOUT_MS 30000
/* Default target when none is given and $LEASED_SOCKET is unset. */
#define LEASED_DEFAULT_SOCKET "/run/leased/leased.sock"
/* "Leave this field out of the request" for optional integer fields whose
 * zero has a meaning of its own (delay_ms 0, wait_ms 0). */
#define LEASED_UNSET (-9223372036854775807LL - 1)
/* Longest lock token the library accepts from the daemon, plus NUL. */
#define LEASED_TOKEN_MAX 256

/* Error codes: the closed list of the wire contract, then the client's
 * own. */
enum leased_errcode {
    LEASED_OK = 0,
    LEASED_E_BAD_REQUEST,       /* malformed or mistyped field, bad key */
    LEASED_E_UNKNOWN_OP,        /* the daemon does not know the op */
    LEASED_E_TOO_LARGE,         /* request line over the daemon's limit */
    LEASED_E_UNAUTHORIZED,      /* hello with auth needed, or bad token */
    LEASED_E_NOT_HELD,          /* unlock/extend of a lock not held */
    LEASED_E_REDIS_UNAVAILABLE, /* the backend could not be reached */
    LEASED_E_BUSY,              /* a server limit was hit */
    LEASED_E_WRONG_TYPE,        /* the Redis key holds foreign data */
    LEASED_E_SHUTTING_DOWN,     /* the daemon is stopping */
    LEASED_E_INTERNAL,          /* a bug in the daemon */
    /* client side */
    LEASED_E_CONNECT = 100, /* the daemon could not be reached */
    LEASED_E_IO,            /* the connection failed or was closed */
    LEASED_E_TIMEOUT,       /* no reply within the call's timeout */
    LEASED_E_PROTOCOL,      /* a reply the library does not understand,
                                   or an error code not in the list */
    LEASED_E_INVALID,       /* a bad argument to a library call */
    LEASED_E_NOMEM          /* out of memory */
};

struct leased_error {
    int code;          /* enum leased_errcode */
    int sys_errno;     /* errno for CONNECT and IO, else 0 */
    char reason[32];   /* not_held: "absent" or "other" */
    char message[256]; /* for people */
};

/* "bad_request", ..., "internal", "connect", "io", "timeout", "protocol",
 * "invalid", "nomem"; "unknown" for anything else. */
const char *leased_strerror(int code);

/* --- connecting ------------------------------------------------------ */

struct leased_conn;

struct leased_options {
    /* Send hello on connect when any of these is set. A failed hello
     * fails leased_connect (e.g. LEASED_E_UNAUTHORIZED, LEASED_E_BUSY). */
    const char *client;     /* hello "client": a name for the logs */
    const char *auth;       /* hello "auth": the listener's token */
    bool hello;             /* hello even without client and auth */
    int timeout_ms;         /* per call; 0: default, -1: no limit */
    int connect_timeout_ms; /* 0: same as timeout_ms */
};

/* Zero OPT: every field at its default. */
void leased_options_init(struct leased_options *opt);

/* TARGET is a Unix socket path, or "host:port" ("[v6addr]:port") for TCP.
 * A target that contains '/' is always a path; one that ends in ":digits"
 * otherwise is TCP. NULL means $LEASED_SOCKET, else LEASED_DEFAULT_SOCKET.
 * OPT may be NULL. Returns NULL on failure (ERR says why: LEASED_E_CONNECT
 * with sys_errno and a message that names the target and what to check,
 * or the error of hello). */
struct leased_conn *leased_connect(const char *target,
                                   const struct leased_options *opt,
                                   struct leased_error *err);

/* Close the socket (the daemon then releases the session's locks), free
 * everything. NULL is fine. */
void leased_close(struct leased_conn *c);

/* Drop the current connection (if still open) and everything buffered on
 * it, and connect again to the same target with the same options. Queued
 * events are kept. The new connection is a new session. */
int leased_reconnect(struct leased_conn *c, struct leased_error *err);

/* The socket, for poll(2) (POLLIN: the daemon sent something). Data may
 * already be buffered in the library: call leased_next_event(c, 0, ...)
 * before sleeping in poll. -1 once the connection has failed. */
int leased_fd(const struct leased_conn *c);

/* The session id of the last successful hello, or NULL. */
const char *leased_session(const struct leased_conn *c);

/* Change the per-call timeout (same meaning as in leased_options). */
void leased_set_timeout(struct leased_conn *c, int timeout_ms);

/* Free memory the library handed out (strings from leased_stats_text,
 * leased_call_raw). */
void leased_free(void *p);

/* --- events ------------------------------------------------------------ */

enum leased_event_type {
    LEASED_EV_OTHER = 0, /* an event this version does not know */
    LEASED_EV_LOCK_LOST,
    LEASED_EV_SHUTDOWN,
    LEASED_EV_SEM_LOST,     /* key, token and reason as for lock_lost */
    LEASED_EV_LOCK_AT_RISK, /* key, token and lease_left_ms */
    LEASED_EV_LOCK_SAFE,    /* key, token and lease_ms */
    LEASED_EV_SEM_AT_RISK,  /* as lock_at_risk, for a semaphore grant */
    LEASED_EV_SEM_SAFE      /* as lock_safe, for a semaphore grant */
};

struct leased_event {
    enum leased_event_type type;
    char *name;              /* the "event" field */
    char *key;               /* lock_lost: the lock's key */
    char *token;             /* lock_lost: the lost lock's token */
    char *reason;            /* lock_lost: expired|taken|
                                   redis_unavailable|max_hold */
    long long lease_left_ms; /* *_at_risk: time left until lock_lost is
                                due unless a renewal confirms; else -1 */
    long long lease_ms;      /* *_safe: the lease the renewal set; else -1 */
};

/* Free the strings of EV (not EV itself); EV is zeroed. */
void leased_event_clear(struct leased_event *ev);

/* EV and its strings are valid only during the call. */
typedef void leased_event_fn(struct leased_conn *c,
                             const struct leased_event *ev, void *arg);

/* With a callback set, events are passed to it as they are read and not
 * queued; events already queued are passed to it at once. NULL removes
 * it (later events are queued again). */
void leased_set_event_callback(struct leased_conn *c, leased_event_fn *fn,
                               void *arg);

/* Take the next queued event into EV (clear it with leased_event_clear),
 * reading from the daemon for up to TIMEOUT_MS (0: only what is already
 * there, -1: no limit). LEASED_E_TIMEOUT when none came, LEASED_E_IO when
 * the connection closed with no event left. */
int leased_next_event(struct leased_conn *c, int timeout_ms,
                      struct leased_event *ev, struct leased_error *err);

/* Read what the daemon sends for up to TIMEOUT_MS, returning as soon as
 * something was read (events go to the callback or the queue).
 * LEASED_OK when something was read, LEASED_E_TIMEOUT when nothing was,
 * LEASED_E_IO when the connection closed. */
int leased_dispatch(struct leased_conn *c, int timeout_ms,
                    struct leased_error *err);

/* --- session ops -------------------------------------------------------- */

struct leased_hello_info {
    char server[32]; /* "leased" */
    char version[32];
    int protocol;
    char session[128];
};

int leased_ping(struct leased_conn *c, struct leased_error *err);

/* CLIENT and AUTH may be NULL (left out). INFO may be NULL. */
int leased_hello(struct leased_conn *c, const char *client, const char *auth,
                 struct leased_hello_info *info, struct leased_error *err);

/* The "stats" object, as compact JSON text (free with leased_free) ... */
int leased_stats_text(struct leased_conn *c, char **json_text,
                      struct leased_error *err);

/* ... or as a jansson object (a new reference: json_decref it). The type
 * is jansson's json_t; include <jansson.h> to use it. */
struct json_t;
int leased_stats(struct leased_conn *c, struct json_t **stats,
                 struct leased_error *err);

/* --- locks -------------------------------------------------------------- */

/* Optional fields of lock; a zeroed struct (or NULL) is a session-bound
 * watchdog lock for owner "", tried once. */
struct leased_lock_args {
    const char *owner; /* NULL: "" */
    long long ttl_ms;  /* > 0: fixed lease; 0: watchdog lease */
    long long wait_ms; /* 0: try once; > 0: wait; -1: no limit */
    bool detach;       /* outlive the session (needs ttl_ms) */
    const char *token; /* reenter the lock held under TOKEN */
    /* NULL: a plain lock; "read" or "write": that side of a read-write
     * lock (feature "rwlock"; not with leased_lock_keys) */
    const char *mode;
};

struct leased_lock_result {
    bool acquired;
    char token[LEASED_TOKEN_MAX]; /* acquired: the holder's token */
    long long count;              /* acquired: hold count after this call */
    long long fence;              /* acquired: fencing token */
    long long lease_ms;           /* acquired: lease guaranteed from now */
    long long ttl_ms;             /* not acquired: holder's lease left, -1 */
};

int leased_lock(struct leased_conn *c, const char *key,
                const struct leased_lock_args *args,
                struct leased_lock_result *out, struct leased_error *err);

struct leased_unlock_result {
    bool released;   /* true when the lock is now free */
    long long count; /* holds left */
};

/* OWNER (this session's holder) or TOKEN (any session); both may be NULL
 * (owner ""). Not the holder: LEASED_E_NOT_HELD, err->reason "absent" or
 * "other". OUT may be NULL. */
int leased_unlock(struct leased_conn *c, const char *key, const char *owner,
                  const char *token, struct leased_unlock_result *out,
                  struct leased_error *err);
/* The same for one side of a read-write lock: MODE "read" or "write" (NULL:
 * a plain lock, as leased_unlock). OUT's released is true when this
 * holder holds nothing more there (other readers may still hold it). */
int leased_unlock_mode(struct leased_conn *c, const char *key,
                       const char *mode, const char *owner, const char *token,
                       struct leased_unlock_result *out,
                       struct leased_error *err);

/* The same with REQUEST_ID (1 to 64 printable ASCII characters; NULL:
 * none, as leased_unlock_mode): the daemon remembers the answer, and a
 * call again with the same token (or owner) and REQUEST_ID within the
 * lease gets the same answer without releasing a second hold. Retry with
 * the same id when a call failed with LEASED_E_IO or
 * LEASED_E_REDIS_UNAVAILABLE (on a new connection, by TOKEN, when the
 * lock is detached); use a new id for each hold to release. */
int leased_unlock_rid(struct leased_conn *c, const char *key, const char *mode,
                      const char *owner, const char *token,
                      const char *request_id, struct leased_unlock_result *out,
                      struct leased_error *err);

/* Set the remaining lease to TTL_MS; *LEASE_MS (may be NULL) gets the
 * lease the daemon reports. */
int leased_extend(struct leased_conn *c, const char *key, const char *owner,
                  const char *token, long long ttl_ms, long long *lease_ms,
                  struct leased_error *err);
int leased_extend_mode(struct leased_conn *c, const char *key,
                       const char *mode, const char *owner, const char *token,
                       long long ttl_ms, long long *lease_ms,
                       struct leased_error *err);

/* Several keys at once (leased-protocol(7), "Several keys at once"): all
 * N of KEYS (1 to 64, no key twice) or none, under one token. ARGS as for
 * leased_lock, except that a token cannot reenter a group. When acquired,
 * OUT's count is 1, its fence -1, and FENCES (N entries; may be NULL) gets
 * each key's fence in the order of KEYS. */
int leased_lock_keys(struct leased_conn *c, const char *const *keys, size_t n,
                     const struct leased_lock_args *args,
                     struct leased_lock_result *out, long long *fences,
                     struct leased_error *err);
/* Release or extend every key of a group, by OWNER or TOKEN. Some keys not
 * held by it: LEASED_E_NOT_HELD (the others were still released or
 * extended). */
int leased_unlock_keys(struct leased_conn *c, const char *const *keys,
                       size_t n, const char *owner, const char *token,
                       struct leased_unlock_result *out,
                       struct leased_error *err);
/* leased_unlock_keys with REQUEST_ID, as leased_unlock_rid. */
int leased_unlock_keys_rid(struct leased_conn *c, const char *const *keys,
                           size_t n, const char *owner, const char *token,
                           const char *request_id,
                           struct leased_unlock_result *out,
                           struct leased_error *err);
int leased_extend_keys(struct leased_conn *c, const char *const *keys,
                       size_t n, const char *owner, const char *token,
                       long long ttl_ms, long long *lease_ms,
                       struct leased_error *err);

struct leased_lock_info {
    bool locked;
    long long ttl_ms; /* -1 when unknown or not locked */
    bool mine;        /* held by OWNER/TOKEN of this call */
    long long count;  /* when mine; else -1 */
    char mode[8];     /* read-write lock held: "read" or "write"; else "" */
};

int leased_lock_info(struct leased_conn *c, const char *key, const char *owner,
                     const char *token, struct leased_lock_info *out,
                     struct leased_error *err);
/* lock.info of a read-write lock, OWNER/TOKEN naming the side MODE. */
int leased_lock_info_mode(struct leased_conn *c, const char *key,
                          const char *mode, const char *owner,
                          const char *token, struct leased_lock_info *out,
                          struct leased_error *err);

/* --- semaphores --------------------------------------------------------- */

/* Optional fields of sem.acquire; a zeroed struct (or NULL) takes one
 * permit, session-bound with a watchdog lease, tried once. */
struct leased_sem_args {
    long long permits; /* 0: 1 */
    long long wait_ms; /* 0: try once; > 0: wait; -1: no limit */
    long long ttl_ms;  /* > 0: fixed lease; 0: watchdog lease */
    bool detach;       /* outlive the session (needs ttl_ms) */
};

struct leased_sem_result {
    bool acquired;
    char token[LEASED_TOKEN_MAX]; /* acquired: the grant's token */
    long long permits;            /* acquired: permits of the grant */
    long long available;          /* permits left (as LIMIT counts them) */
    long long lease_ms;           /* acquired: lease guaranteed from now */
};

/* Take ARGS->permits of the LIMIT permits of KEY. Not acquired is not an
 * error (OUT->acquired false). */
int leased_sem_acquire(struct leased_conn *c, const char *key, long long limit,
                       const struct leased_sem_args *args,
                       struct leased_sem_result *out,
                       struct leased_error *err);

/* Release every permit of TOKEN (any session); *RELEASED (may be NULL)
 * gets how many. A token that holds nothing: LEASED_E_NOT_HELD, reason
 * "absent". */
int leased_sem_release(struct leased_conn *c, const char *key,
                       const char *token, long long *released,
                       struct leased_error *err);

struct leased_sem_info {
    long long available;
    long long held;
};

int leased_sem_info(struct leased_conn *c, const char *key, long long limit,
                    struct leased_sem_info *out, struct leased_error *err);

/* --- rate limiter -------------------------------------------------------- */

/* Optional fields of rate.acquire; a zeroed struct (or NULL) takes one
 * permit with burst = rate, decided once. */
struct leased_rate_args {
    long long burst;   /* 0: the rate */
    long long permits; /* 0: 1 */
    long long wait_ms; /* 0: decide once; > 0: the daemon waits up to it */
};

struct leased_rate_result {
    bool acquired;
    /* Refused: ms until the permits could be granted; granted: ms until
     * one more could be (0: now). */
    long long retry_after_ms;
};

/* Take ARGS->permits of KEY's limiter of RATE permits per PER_MS ms.
 * Refused is not an error (OUT->acquired false). */
int leased_rate_acquire(struct leased_conn *c, const char *key, long long rate,
                        long long per_ms, const struct leased_rate_args *args,
                        struct leased_rate_result *out,
                        struct leased_error *err);

/* --- cancelling a wait ---------------------------------------------------- */

/* End the wait of a request sent with leased_send (a lock or sem.acquire
 * with wait_ms, a cache.get): it answers at once as if its wait ran out,
 * and its reply is still collected with leased_wait_reply. *CANCELLED
 * (may be NULL) is false when it was no longer waiting; a grant that won
 * the race then arrives as an ordinary grant in that reply. */
int leased_cancel(struct leased_conn *c, uint64_t id, bool *cancelled,
                  struct leased_error *err);

/* --- cache -------------------------------------------------------------- */

struct leased_cache_result {
    int error;           /* cache.mget: LEASED_OK, or this key's own
                                   error (e.g. LEASED_E_WRONG_TYPE); the
                                   other fields are then empty */
    char *error_message; /* with error: the daemon's message */
    bool hit;
    bool is_null; /* hit on a cached null ("not found") */
    char *value;  /* hit: the value, NUL-terminated (it may
                                   contain NULs: see value_len); else NULL */
    size_t value_len;
    char *lease; /* miss: the fill lease, NULL when none */
    /* hit: the version of the value or null (hello's feature
     * "versioned"; 0 from a daemon without it, and on a miss) */
    long long version;
};

void leased_cache_result_free(struct leased_cache_result *r);

/* WAIT_MS: LEASED_UNSET for the daemon's cache.wait_ms. LEASE false: a
 * plain read that never takes a fill lease and never waits. */
int leased_cache_get(struct leased_conn *c, const char *key, long long wait_ms,
                     bool lease, struct leased_cache_result *out,
                     struct leased_error *err);

/* --- the shared near cache (feature "shared_near") ----------------------
 *
 * Over a Unix socket, a daemon whose hello lists "shared_near" hands out
 * a read-only mapping of its near cache (leased-protocol(7), "Shared near
 * cache"), and leased_cache_get answers a hit from it without a round
 * trip: the same value the daemon would answer, never one older than an
 * invalidation it acknowledged. The segment is mapped on the first
 * leased_cache_get (or leased_near_get) of a connection that said hello;
 * when mapping fails it is not tried again on that connection, and
 * everything goes over the socket as before. When the daemon is stopped or
 * stalled (the segment's heartbeat is older than its bound), or a flush is
 * under way, lookups fall back to the socket. A segment the daemon closed
 * (a reload, a restart) is mapped again, at most once a second. Hits and
 * fallbacks are reported to the daemon (near.hits) ahead of a later
 * request, at most about once a second or every 1000 hits, and when the
 * connection is closed. A connection, and so its mapping, is used by one
 * thread at a time, as for every call. */

/* Maps this connection's segment now (near.map), replacing one mapped
 * before. LEASED_E_INVALID over TCP; the daemon's error when it has no
 * segment (feature not enabled). */
int leased_near_map(struct leased_conn *c, struct leased_error *err);

/* KEY from the segment alone: true and *OUT (may be NULL) filled as
 * leased_cache_get fills it on a hit (free with leased_cache_result_free);
 * false when the segment does not have it, cannot be trusted now, or is
 * not mapped: ask with leased_cache_get. Maps on first use as above;
 * counts a hit or a fallback when a segment was looked at. */
bool leased_near_get(struct leased_conn *c, const char *key,
                     struct leased_cache_result *out);

struct leased_near_info {
    bool mapped;
    size_t bytes;       /* the mapping's size */
    uint64_t hits;      /* served from the segment, since connect */
    uint64_t fallbacks; /* looked up there and asked the daemon instead */
};

void leased_near_info(const struct leased_conn *c,
                      struct leased_near_info *out);

/* VALUE NULL stores "not found" (null). VALUE_LEN (size_t)-1: strlen.
 * TTL_MS 0: the daemon's default. *STORED (may be NULL) is false when the
 * lease was no longer valid. */
int leased_cache_fill(struct leased_conn *c, const char *key,
                      const char *lease, const char *value, size_t value_len,
                      long long ttl_ms, bool *stored,
                      struct leased_error *err);

/* Give up a fill lease after a failed load. */
int leased_cache_release(struct leased_conn *c, const char *key,
                         const char *lease, bool *released,
                         struct leased_error *err);

/* Unconditional write (invalidates outstanding fill leases). */
int leased_cache_set(struct leased_conn *c, const char *key, const char *value,
                     size_t value_len, long long ttl_ms,
                     struct leased_error *err);

/* Versioned writes (hello's feature "versioned"): leased_cache_set and
 * leased_cache_fill, stored only when the entry's version is IF_VERSION
 * (0: only when there is no value and no null; LEASED_UNSET: always, as
 * those two do). *STORED (may be NULL) is false when the version had
 * moved on (or, for a fill, the lease was no longer valid); *VERSION (may
 * be NULL) is then the entry's current version, else the one the value
 * got. */
int leased_cache_set_if(struct leased_conn *c, const char *key,
                        const char *value, size_t value_len, long long ttl_ms,
                        long long if_version, bool *stored, long long *version,
                        struct leased_error *err);
int leased_cache_fill_if(struct leased_conn *c, const char *key,
                         const char *lease, const char *value,
                         size_t value_len, long long ttl_ms,
                         long long if_version, bool *stored,
                         long long *version, struct leased_error *err);

struct leased_invalidate_result {
    long long deleted;
    long long pending;
    bool queued; /* Redis was down: journaled, retried */
};

/* DELAY_MS: LEASED_UNSET for the daemon's cache.double_delete_ms; 0 for a
 * single delete. OUT may be NULL. */
int leased_cache_invalidate(struct leased_conn *c, const char *const *keys,
                            size_t nkeys, long long delay_ms,
                            struct leased_invalidate_result *out,
                            struct leased_error *err);

/* RESULTS has NKEYS entries, filled in order (free each with
 * leased_cache_result_free; they are zeroed on error). A key that failed
 * on its own (the call still returns LEASED_OK) has its code in .error. */
int leased_cache_mget(struct leased_conn *c, const char *const *keys,
                      size_t nkeys, long long wait_ms, bool lease,
                      struct leased_cache_result *results,
                      struct leased_error *err);

/* One entry of leased_cache_mset, stored as leased_cache_set stores one:
 * VALUE NULL stores "not found" (null), VALUE_LEN (size_t)-1: strlen,
 * TTL_MS 0: the daemon's default. */
struct leased_mset_entry {
    const char *key;
    const char *value;
    size_t value_len;
    long long ttl_ms;
};

/* The outcome of one entry: LEASED_OK, or its own error (e.g.
 * LEASED_E_BAD_REQUEST, LEASED_E_WRONG_TYPE, LEASED_E_REDIS_UNAVAILABLE)
 * with the daemon's message (free with leased_mset_result_free). */
struct leased_mset_result {
    int error;
    char *error_message;
};

void leased_mset_result_free(struct leased_mset_result *r);

/* cache.mset (hello's feature "mset"): the N ENTRIES (at most 1000) in one
 * request. *STORED (may be NULL) counts the entries stored; RESULTS (may
 * be NULL) has N elements, filled in order (zeroed on error). An entry
 * that failed on its own leaves the call LEASED_OK. */
int leased_cache_mset(struct leased_conn *c,
                      const struct leased_mset_entry *entries, size_t n,
                      size_t *stored, struct leased_mset_result *results,
                      struct leased_error *err);

/* --- Bloom filters (hello's feature "bloom") ----------------------------- */

/* Make FILTER for CAPACITY keys at ERROR_RATE false positives. *CREATED
 * (may be NULL) is false when it existed with these very parameters; with
 * others the call fails (LEASED_E_BAD_REQUEST, naming them). */
int leased_bloom_create(struct leased_conn *c, const char *filter,
                        long long capacity, double error_rate, bool *created,
                        struct leased_error *err);

/* Add the NKEYS KEYS (at most 1000) to FILTER. ADDED (may be NULL) has
 * NKEYS elements: true where the key was certainly not in it before. */
int leased_bloom_add(struct leased_conn *c, const char *filter,
                     const char *const *keys, size_t nkeys, bool *added,
                     struct leased_error *err);

/* MAYBE (may be NULL) has NKEYS elements: false where the key was
 * certainly never added to FILTER. */
int leased_bloom_check(struct leased_conn *c, const char *filter,
                       const char *const *keys, size_t nkeys, bool *maybe,
                       struct leased_error *err);

/* leased_cache_get with FILTER consulted first: a key it rules out is
 * answered as a cached null (OUT->hit and OUT->is_null) with *RULED_OUT
 * (may be NULL) true, without a read of the entry or a fill lease. */
int leased_cache_get_bloom(struct leased_conn *c, const char *key,
                           const char *filter, long long wait_ms, bool lease,
                           struct leased_cache_result *out, bool *ruled_out,
                           struct leased_error *err);

/* --- raw requests ------------------------------------------------------- */

/* Send REQUEST (a JSON object as text; its "id", if any, is replaced by
 * the library's) and wait for the reply, returned as text in *REPLY (may
 * be NULL; free with leased_free) with the library's id removed. Returns
 * LEASED_OK when the reply says ok, else its error code. WAIT_MS extends
 * the timeout as for lock (0 when the request does not wait). */
int leased_call_raw(struct leased_conn *c, const char *request,
                    long long wait_ms, char **reply, struct leased_error *err);

/* The same with jansson values: REQ is borrowed (not changed), *REPLY is a
 * new reference (also on an error reply; NULL on client-side errors). */
int leased_call_json(struct leased_conn *c, struct json_t *req,
                     long long wait_ms, struct json_t **reply,
                     struct leased_error *err);

/* Pipelining: send REQ (borrowed) now with a fresh id (*ID), and collect
 * its reply later with leased_wait_reply (a new reference, library id
 * removed; the return value as for leased_call_json); other calls may
 * happen in between. The reply is kept until it is collected or the
 * connection closes. TIMEOUT_MS as in leased_next_event; after
 * LEASED_E_TIMEOUT the request is still in flight and may be waited for
 * again. */
int leased_send(struct leased_conn *c, struct json_t *req, uint64_t *id,
                struct leased_error *err);
int leased_wait_reply(struct leased_conn *c, uint64_t id, int timeout_ms,
                      struct json_t **reply, struct leased_error *err);

#ifdef __cplusplus
}
#endif

#endif
