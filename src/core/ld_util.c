/* Small helpers shared by every module: clocks, randomness, hashing,
 * constant-time comparison, address parsing and bound ports. Nothing here
 * keeps state beyond the PRNG seed, and nothing knows of another module
 * (Redis Cluster's key slots are ld_cluster_slot.c's). */
#include "ld_util.h"

#include "ld_mem.h"

#include <arpa/inet.h>
#include <event2/event.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_SYS_RANDOM_H
#include <sys/random.h>
#endif

uint64_t
ld_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t
ld_now_ms(void)
{
    return ld_now_us() / 1000u;
}

void
ld_timer_at_us(struct event *ev, uint64_t at_us)
{
    uint64_t now = ld_now_us();
    struct timeval tv = ld_tv_us(at_us > now ? at_us - now : 0);
    event_add(ev, &tv);
}

#ifndef HAVE_GETRANDOM
static int
urandom_bytes(unsigned char *p, size_t len)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return LD_ERR;
    }
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            close(fd);
            return LD_ERR;
        }
        p += n;
        len -= (size_t)n;
    }
    close(fd);
    return LD_OK;
}
#endif

int
ld_random_bytes(void *buf, size_t len)
{
    unsigned char *p = buf;
#ifdef HAVE_GETRANDOM
    /* getrandom() may return fewer bytes than asked for requests over 256
     * bytes, or be interrupted by a signal; loop until the buffer is full. */
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return LD_ERR;
        }
        p += n;
        len -= (size_t)n;
    }
    return LD_OK;
#else
    return urandom_bytes(p, len);
#endif
}

int
ld_token_new(char out[LD_TOKEN_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    /* Tokens are drawn on hot paths (every new lock, every cache miss), so
     * kernel randomness is fetched a page at a time rather than with one
     * getrandom() per token; every byte is still the kernel CSPRNG's and
     * is used once. The daemon forks before it makes any token. */
    static unsigned char pool[4096];
    static size_t pool_left;
    unsigned char raw[LD_TOKEN_LEN / 2];

    if (pool_left < sizeof(raw)) {
        if (ld_random_bytes(pool, sizeof(pool)) != LD_OK) {
            out[0] = '\0';
            return LD_ERR;
        }
        pool_left = sizeof(pool);
    }
    memcpy(raw, pool + sizeof(pool) - pool_left, sizeof(raw));
    /* Consumed bytes do not linger in memory. */
    memset(pool + sizeof(pool) - pool_left, 0, sizeof(raw));
    pool_left -= sizeof(raw);
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 0x0f];
    }
    out[LD_TOKEN_LEN] = '\0';
    return LD_OK;
}

/* splitmix64: tiny, fast and good enough to spread TTLs and backoffs. Its
 * output is predictable from a few samples, hence never for tokens. */
static struct {
    uint64_t prng_state;
    bool prng_seeded;
} util_mod;

static uint64_t
splitmix64(void)
{
    uint64_t z = (util_mod.prng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double
ld_random_unit(void)
{
    if (!util_mod.prng_seeded) {
        if (ld_random_bytes(&util_mod.prng_state,
                            sizeof(util_mod.prng_state)) != LD_OK) {
            /* Only jitter suffers, so a weak seed is acceptable; it still
             * differs between processes started at the same moment. */
            util_mod.prng_state = ld_now_us() ^ ((uint64_t)getpid() << 32);
        }
        util_mod.prng_seeded = true;
    }
    /* The top 53 bits fill a double's mantissa exactly: [0, 1). */
    return (double)(splitmix64() >> 11) * 0x1.0p-53;
}

long long
ld_jitter_ttl(long long ttl_ms, double jitter)
{
    if (!(jitter > 0)) {
        jitter = 0; /* also catches NaN */
    } else if (jitter > 0.5) {
        jitter = 0.5;
    }
    if (ttl_ms < 1) {
        return 1;
    }
    double lo = (double)ttl_ms * (1.0 - jitter);
    double span = (double)ttl_ms * 2.0 * jitter;
    long long v = llround(lo + span * ld_random_unit());
    return v < 1 ? 1 : v;
}

uint64_t
ld_hash(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = LD_FNV_BASIS;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t
ld_hash_mixed(uint64_t basis, const void *data, size_t len)
{
    const unsigned char *p = data;
    uint64_t h = basis;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

bool
ld_secure_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    /* Walk the longer length so that the time taken tells nothing about
     * where the first difference is, nor about the secret's length beyond
     * what the attacker's own input length reveals. */
    size_t n = alen > blen ? alen : blen;
    volatile unsigned char diff = (unsigned char)(alen != blen);
    for (size_t i = 0; i < n; i++) {
        unsigned char ca = i < alen ? (unsigned char)a[i] : 0;
        unsigned char cb = i < blen ? (unsigned char)b[i] : 0;
        diff |= (unsigned char)(ca ^ cb);
    }
    return diff == 0;
}

int
ld_parse_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    const char *h;
    size_t hlen;
    const char *p;

    if (s == NULL || hostlen == 0) {
        return LD_ERR;
    }
    if (s[0] == '[') {
        /* "[v6addr]:port", the only unambiguous way to write IPv6. */
        const char *end = strchr(s, ']');
        if (end == NULL || end[1] != ':') {
            return LD_ERR;
        }
        h = s + 1;
        hlen = (size_t)(end - h);
        p = end + 2;
    } else {
        const char *colon = strrchr(s, ':');
        if (colon == NULL || memchr(s, ':', (size_t)(colon - s)) != NULL) {
            return LD_ERR; /* no port, or a bare IPv6 address */
        }
        h = s;
        hlen = (size_t)(colon - s);
        p = colon + 1;
    }
    if (hlen == 0 || hlen >= hostlen) {
        return LD_ERR;
    }
    if (*p == '\0' || strlen(p) > 5) {
        return LD_ERR;
    }
    long v = 0;
    for (const char *q = p; *q != '\0'; q++) {
        if (*q < '0' || *q > '9') {
            return LD_ERR;
        }
        v = v * 10 + (*q - '0');
    }
    if (v > 65535) {
        return LD_ERR;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    if (port != NULL) {
        *port = (int)v;
    }
    return LD_OK;
}

bool
ld_host_is_loopback(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;

    if (host == NULL) {
        return false;
    }
    if (strcasecmp(host, "localhost") == 0 ||
        strcasecmp(host, "localhost.") == 0) {
        return true;
    }
    if (inet_pton(AF_INET, host, &a4) == 1) {
        return (ntohl(a4.s_addr) >> 24) == 127;
    }
    if (inet_pton(AF_INET6, host, &a6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&a6)) {
            return true;
        }
        /* ::ffff:127.x.y.z is IPv4 loopback reached over a v6 socket. */
        return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
    }
    /* Any other name could resolve anywhere; treat it as remote. */
    return false;
}

int
ld_bound_port(int fd)
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

int
ld_mkdir_parent(const char *path, unsigned mode)
{
    if (path == NULL) {
        errno = EINVAL;
        return LD_ERR;
    }
    const char *slash = strrchr(path, '/');
    if (slash == NULL || slash == path) {
        return LD_OK; /* relative to the cwd, or directly under "/" */
    }
    size_t len = (size_t)(slash - path);
    char *dir = ld_xstrndup(path, len);

    int rc = LD_OK;
    if (mkdir(dir, (mode_t)mode) != 0) {
        struct stat st;
        if (errno != EEXIST) {
            rc = LD_ERR;
        } else if (stat(dir, &st) != 0) {
            rc = LD_ERR;
        } else if (!S_ISDIR(st.st_mode)) {
            errno = ENOTDIR;
            rc = LD_ERR;
        }
    }
    int saved = errno;
    free(dir);
    errno = saved;
    return rc;
}

size_t
ld_ll_to_str(char out[LD_LL_STR_MAX], long long v)
{
    char tmp[LD_LL_STR_MAX];
    size_t n = 0, len = 0;
    /* Negated as unsigned, so that the most negative value works too. */
    unsigned long long u = v < 0 ? 0ull - (unsigned long long)v
                                 : (unsigned long long)v;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u != 0);
    if (v < 0) {
        out[len++] = '-';
    }
    while (n > 0) {
        out[len++] = tmp[--n];
    }
    out[len] = '\0';
    return len;
}
