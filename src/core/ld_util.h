#ifndef LD_UTIL_H
#define LD_UTIL_H

#include "ld_common.h"

#include <sys/time.h>

/* Monotonic clock, for deadlines and latencies. */
uint64_t ld_now_us(void);
uint64_t ld_now_ms(void);

/* MS milliseconds as the timeval libevent's timers take. */
static inline struct timeval
ld_tv_ms(long long ms)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)(ms % 1000) * 1000;
    return tv;
}

/* US microseconds as a timeval, for deadlines kept in ld_now_us() time. */
static inline struct timeval
ld_tv_us(uint64_t us)
{
    struct timeval tv;
    tv.tv_sec = (time_t)(us / 1000000);
    tv.tv_usec = (suseconds_t)(us % 1000000);
    return tv;
}

/* Arms the timer EV for AT_US, a moment in ld_now_us() time; one already
 * past fires at once. */
struct event;
void ld_timer_at_us(struct event *ev, uint64_t at_us);

/* Fill BUF with LEN bytes from the kernel CSPRNG (getrandom). */
int ld_random_bytes(void *buf, size_t len);

/* An unguessable token: 128 random bits as 32 lowercase hex characters.
 * OUT must hold LD_TOKEN_LEN + 1 bytes. */
#define LD_TOKEN_LEN 32
int ld_token_new(char out[LD_TOKEN_LEN + 1]);

/* Uniform in [0, 1), from a fast PRNG seeded once from the CSPRNG; for TTL
 * jitter and backoff spreading, never for tokens. */
double ld_random_unit(void);

/* TTL spread uniformly by +-JITTER (0..0.5), never below 1 ms. */
long long ld_jitter_ttl(long long ttl_ms, double jitter);

/* V in decimal into OUT, NUL-terminated; returns the length. printf
 * costs ten times as much, and the hot paths format a few per request. */
#define LD_LL_STR_MAX 21
size_t ld_ll_to_str(char out[LD_LL_STR_MAX], long long v);

/* 64-bit FNV-1a, for routing and hash tables. */
uint64_t ld_hash(const void *data, size_t len);
/* FNV-1a's offset basis, ld_hash's start. */
#define LD_FNV_BASIS 0xcbf29ce484222325ull
/* FNV-1a of DATA from BASIS, then murmur3's 64-bit finalizer, so that
 * every input bit reaches the low bits. Bloom filters' bit positions in
 * Redis are made with it from LD_FNV_BASIS (leased-protocol(7) gives the
 * recipe): it must never change. */
uint64_t ld_hash_mixed(uint64_t basis, const void *data, size_t len);

/* Constant-time comparison of two strings (auth tokens). */
bool ld_secure_equal(const char *a, size_t alen, const char *b, size_t blen);

/* "host:port" into parts; HOST gets at most HOSTLEN-1 chars. */
int ld_parse_hostport(const char *s, char *host, size_t hostlen, int *port);

/* Is HOST a loopback address or "localhost"? */
bool ld_host_is_loopback(const char *host);

/* The local TCP port socket FD is bound to (port 0 asks the kernel for
 * one, and this says which), or -1 when it has none or is not IPv4/v6. */
int ld_bound_port(int fd);

/* Create the parent directory of PATH (one level) if missing. */
int ld_mkdir_parent(const char *path, unsigned mode);

#endif
