/* leased-bench --mode zipf: what the near cache gives a read-mostly
 * workload with writes, and how stale it lets a reader be.
 *
 * CONNS readers each loop: draw a key from Zipf(S) over KEYS keys, read
 * it cache-aside (leased: cache.get, and on a miss with a lease "load" it
 * and cache.fill; direct: GET, and on a miss SET), next. The "database"
 * is an array of versions here; a value is "v<version>:" padded to SIZE.
 * Every WRITE_EVERY reads a writer bumps the version of a key (drawn from
 * the same distribution, so hot keys are written most) and invalidates it:
 * by default with a DEL of the entry straight in Redis, which is what
 * another daemon or a writer beside leased does and what only client
 * tracking can tell this daemon about; with --writer leased by
 * cache.invalidate through the daemon itself (evicted locally before the
 * reply: staleness 0 by construction).
 *
 * Staleness: a hit whose request left after the reply of an invalidation
 * of its key and whose version is older than that invalidation's is
 * stale; for a near hit the sample is the time from that reply to the
 * hit's reply. The worst is bounded by the tracking delay (the
 * invalidation message's way from Redis to the daemon). A stale hit that
 * did not come from the near cache is counted apart (stale_redis, with
 * its worst age): a read that joined the daemon's fetch of the key sent
 * before the DEL gets that fetch's answer; a stale value that stayed in
 * Redis (a fill the leases should have refused) would show there too,
 * for longer than a round trip. The direct side counts the same way: its
 * plain cache-aside (GET, load, SET) has no lease, and a SET that lands
 * after the writer's DEL leaves the old version in Redis until the next
 * write of the key (direct_stale). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "bench_util.h"
#include "bench_zipf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>

#define ZIPF_TTL_MS 3600000
#define ZIPF_MAX_ERRORS_SHOWN 5
/* Writes in flight at most: one at a time would fall behind the readers
 * (an invalidation waits its turn behind their requests). */
#define ZIPF_WRITES_IN_FLIGHT 64

enum ztarget { Z_LEASED, Z_DIRECT };
static const char *const ztarget_names[] = {"leased", "direct"};

struct zrun;

struct zclient {
    struct zrun *run;
    uint64_t rng;
    int key;
    bool filling;
    uint64_t t_start_ns;
    int fd; /* leased */
    struct event *rev;
    struct evbuffer *in;
    redisAsyncContext *ac; /* direct */
};

struct zrun {
    const struct zipf_opts *zo;
    enum ztarget target;
    int id;
    bool recording, closing;
    uint64_t t0_ns, t1_ns;
    struct zclient *cl;
    /* The writer: each write in flight holds a free slot until its
     * reply (a leased reply, which may overtake others, names the slot by
     * "id"). */
    int wfd; /* --writer leased */
    struct event *wev;
    struct evbuffer *win;
    redisAsyncContext *wac;
    struct zwrite {
        struct zrun *r;
        int key;
        uint64_t ver;
        bool busy;
    } wslot[ZIPF_WRITES_IN_FLIGHT];
    int winflight;
    uint64_t wrng;
    long long reads_all, writes_issued;
    /* Per key: the database's version, and the version and time (ns) of
     * the last acknowledged invalidation. */
    uint64_t *db_ver, *ack_ver, *ack_ns;
    /* Measured (recording only). */
    long long reads, hits, near_hits, fills, misses_no_lease, writes,
        stale_near, stale_redis, errors;
    uint64_t stale_redis_max_ns;
    uint64_t *lat, *stale;
    size_t nlat, caplat, nstale, capstale;
    struct event *warm_ev, *end_ev;
    int shown_errors;
};

struct zresult {
    double secs, ops_s, p50, p99, hit_ratio, near_ratio, stale_p99, stale_max,
        stale_redis_max;
    long long reads, hits, near_hits, fills, writes, stale_near, stale_redis,
        misses_no_lease, errors, daemon_near_hits, daemon_tracking_evictions;
};

static double *zipf_cdf; /* zipf_cdf[i]: P(rank <= i) */
/* The staleness samples of every leased run, for the summary: stale hits
 * are rare (about one per 60 writes), so one run's p99 is its max. */
static uint64_t *all_stale;
static size_t n_all_stale, cap_all_stale;
static char *zvalue_pad; /* SIZE bytes of 'x' */

static void zdie(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void
zdie(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("leased-bench zipf: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void *
zalloc(size_t n)
{
    void *p = calloc(1, n == 0 ? 1 : n);
    if (p == NULL) {
        zdie("out of memory");
    }
    return p;
}

static void
zipf_init(int n, double s)
{
    zipf_cdf = zalloc(sizeof(*zipf_cdf) * (size_t)n);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        sum += 1.0 / pow((double)(i + 1), s);
        zipf_cdf[i] = sum;
    }
    for (int i = 0; i < n; i++) {
        zipf_cdf[i] /= sum;
    }
}

/* A key index, 0 the most popular. */
static int
zipf_draw(uint64_t *rng, int n)
{
    double u = (double)(rng_next(rng) >> 11) / 9007199254740992.0;
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (zipf_cdf[mid] < u) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

static void
push(uint64_t **v, size_t *n, size_t *cap, uint64_t x)
{
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 65536;
        *v = realloc(*v, *cap * sizeof(**v));
        if (*v == NULL) {
            zdie("out of memory");
        }
    }
    (*v)[(*n)++] = x;
}

static int
zcmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double
zpct_us(uint64_t *v, size_t n, double q)
{
    if (n == 0) {
        return 0;
    }
    size_t i = (size_t)ceil(q * (double)n);
    i = i == 0 ? 0 : i - 1;
    return (double)v[i < n ? i : n - 1] / 1000.0;
}

static void
zshow_error(struct zrun *r, const char *what, const char *s, size_t len)
{
    r->errors += r->recording;
    if (r->shown_errors++ < ZIPF_MAX_ERRORS_SHOWN) {
        fprintf(stderr, "leased-bench zipf: %s: %.*s\n", what,
                (int)(len > 300 ? 300 : len), s);
    }
}

/* ------------------------------------------------------ blocking bits */

static int
zunix_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (fd < 0 || strlen(path) >= sizeof(sa.sun_path)) {
        zdie("cannot open a socket for %s", path);
    }
    strcpy(sa.sun_path, path);
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (errno != EINTR) {
            zdie("connect %s: %s", path, strerror(errno));
        }
    }
    return fd;
}

static void
zwrite_all(int fd, const char *s, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, s, len);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            continue;
        }
        if (n < 0) {
            zdie("write to leased: %s", strerror(errno));
        }
        s += n;
        len -= (size_t)n;
    }
}

/* A figure of leased's stats, read on a blocking session; -1 if absent. */
static long long
zstat(const char *sock, const char *name)
{
    static const char req[] = "{\"op\":\"stats\"}\n";
    int fd = zunix_connect(sock);
    zwrite_all(fd, req, sizeof(req) - 1);
    char buf[65536];
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, sizeof(buf) - 1 - n);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            zdie("leased closed the stats session");
        }
        n += (size_t)k;
        buf[n] = '\0';
        if (memchr(buf, '\n', n) != NULL || n == sizeof(buf) - 1) {
            break;
        }
    }
    close(fd);
    char pat[128];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = strstr(buf, pat);
    return p != NULL ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

/* ------------------------------------------------------------ keys */

static int
key_name(const struct zrun *r, int k, char *buf, size_t cap)
{
    return snprintf(buf, cap, "bz%d.%d.%d", (int)getpid(), r->id, k);
}

/* The Redis key of the entry leased keeps for key K. */
static int
entry_name(const struct zrun *r, int k, char *buf, size_t cap)
{
    return snprintf(buf, cap, "%s{bz%d.%d.%d}", r->zo->prefix, (int)getpid(),
                    r->id, k);
}

/* "v<version>:" padded with 'x' to SIZE bytes (longer if SIZE is too
 * small for the version). */
static int
value_text(const struct zrun *r, uint64_t ver, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "v%" PRIu64 ":", ver);
    size_t size = r->zo->size;
    if ((size_t)n < size && size < cap) {
        memcpy(buf + n, zvalue_pad, size - (size_t)n);
        n = (int)size;
        buf[n] = '\0';
    }
    return n;
}

/* ---------------------------------------------------------- the writer */

static void writer_maybe(struct zrun *r);

static void
write_acked(struct zwrite *w)
{
    struct zrun *r = w->r;
    if (!w->busy) {
        zdie("a write answered twice");
    }
    w->busy = false;
    r->winflight--;
    /* Reads that leave from now on must not see an older version. */
    if (w->ver > r->ack_ver[w->key]) {
        r->ack_ver[w->key] = w->ver;
        r->ack_ns[w->key] = now_ns();
    }
    r->writes += r->recording;
    writer_maybe(r);
}

static void
writer_redis_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct zwrite *w = priv;
    const redisReply *rep = reply;
    if (w->r->closing) {
        return;
    }
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        zdie("writer DEL failed: %s", rep != NULL ? rep->str : "no reply");
    }
    write_acked(w);
}

static void
writer_leased_read(evutil_socket_t fd, short what, void *arg)
{
    struct zrun *r = arg;
    int n = evbuffer_read(r->win, fd, -1);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;
        }
        zdie("leased closed the writer's session");
    }
    size_t len;
    char *line;
    while ((line = evbuffer_readln(r->win, &len, EVBUFFER_EOL_LF)) != NULL) {
        if (strncmp(line, "{\"event\"", 8) != 0) {
            const char *id = strstr(line, "\"id\":");
            if (strstr(line, "\"ok\":true") == NULL || id == NULL) {
                zdie("cache.invalidate failed: %.300s", line);
            }
            long slot = strtol(id + 5, NULL, 10);
            if (slot < 0 || slot >= ZIPF_WRITES_IN_FLIGHT) {
                zdie("cache.invalidate answered for no write: %.300s", line);
            }
            write_acked(&r->wslot[slot]);
        }
        free(line);
    }
}

static void
writer_maybe(struct zrun *r)
{
    const struct zipf_opts *zo = r->zo;
    while (!r->closing && r->winflight < ZIPF_WRITES_IN_FLIGHT &&
           r->writes_issued < r->reads_all / zo->write_every) {
        int slot = 0;
        while (r->wslot[slot].busy) {
            slot++;
        }
        struct zwrite *w = &r->wslot[slot];
        w->busy = true;
        r->writes_issued++;
        r->winflight++;
        w->r = r;
        w->key = zipf_draw(&r->wrng, zo->keys);
        w->ver = ++r->db_ver[w->key];
        char name[256];
        if (r->target == Z_LEASED && zo->writer_leased) {
            char key[128], req[320];
            key_name(r, w->key, key, sizeof(key));
            int n = snprintf(req, sizeof(req),
                             "{\"id\":%d,\"op\":\"cache.invalidate\","
                             "\"key\":\"%s\"}\n",
                             slot, key);
            zwrite_all(r->wfd, req, (size_t)n);
        } else {
            int n = r->target == Z_LEASED
                        ? entry_name(r, w->key, name, sizeof(name))
                        : key_name(r, w->key, name, sizeof(name));
            redisAsyncCommand(r->wac, writer_redis_cb, w, "DEL %b", name,
                              (size_t)n);
        }
    }
}

/* ------------------------------------------------------------ readers */

static void next_read(struct zclient *c);

/* A read of key K answered: HIT with VER (near: from the near cache). */
static void
read_done(struct zclient *c, bool hit, uint64_t ver, bool near)
{
    struct zrun *r = c->run;
    uint64_t now = now_ns();
    r->reads_all++;
    if (r->recording) {
        r->reads++;
        push(&r->lat, &r->nlat, &r->caplat, now - c->t_start_ns);
        if (hit) {
            r->hits++;
            r->near_hits += near;
        }
        if (hit && ver < r->ack_ver[c->key] &&
            c->t_start_ns > r->ack_ns[c->key]) {
            if (near) {
                r->stale_near++;
                push(&r->stale, &r->nstale, &r->capstale,
                     now - r->ack_ns[c->key]);
            } else {
                r->stale_redis++;
                uint64_t age = now - r->ack_ns[c->key];
                if (age > r->stale_redis_max_ns) {
                    r->stale_redis_max_ns = age;
                }
            }
        }
    }
    writer_maybe(r);
    next_read(c);
}

static uint64_t
version_of(const char *s)
{
    return s != NULL && s[0] == 'v' ? strtoull(s + 1, NULL, 10) : 0;
}

static void
leased_line(struct zclient *c, const char *line, size_t len)
{
    struct zrun *r = c->run;
    if (strncmp(line, "{\"event\"", 8) == 0) {
        return;
    }
    if (strstr(line, "\"ok\":true") == NULL) {
        zshow_error(r, "leased error", line, len);
        c->filling = false;
        next_read(c);
        return;
    }
    if (c->filling) {
        /* Refused (the lease went with an invalidation) or stored: the
         * read is over either way. */
        c->filling = false;
        read_done(c, false, 0, false);
        return;
    }
    if (strstr(line, "\"hit\":true") != NULL) {
        const char *v = strstr(line, "\"value\":\"");
        read_done(c, true, version_of(v != NULL ? v + 9 : NULL),
                  strstr(line, "\"near\":true") != NULL);
        return;
    }
    const char *l = strstr(line, "\"lease\":\"");
    if (l == NULL) {
        /* Another reader's load outlived wait_ms. */
        r->misses_no_lease += r->recording;
        read_done(c, false, 0, false);
        return;
    }
    l += 9;
    const char *e = strchr(l, '"');
    if (e == NULL) {
        zshow_error(r, "bad lease", line, len);
        next_read(c);
        return;
    }
    /* The load: the database's version as of now. */
    char key[128], val[70000], req[71000];
    key_name(r, c->key, key, sizeof(key));
    value_text(r, r->db_ver[c->key], val, sizeof(val));
    int n = snprintf(req, sizeof(req),
                     "{\"op\":\"cache.fill\",\"key\":\"%s\",\"lease\":"
                     "\"%.*s\",\"value\":\"%s\",\"ttl_ms\":%d}\n",
                     key, (int)(e - l), l, val, ZIPF_TTL_MS);
    c->filling = true;
    r->fills += r->recording;
    zwrite_all(c->fd, req, (size_t)n);
}

static void
leased_readable(evutil_socket_t fd, short what, void *arg)
{
    struct zclient *c = arg;
    int n = evbuffer_read(c->in, fd, -1);
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;
        }
        zdie("leased closed a reader's session");
    }
    size_t len;
    char *line;
    while (!c->run->closing &&
           (line = evbuffer_readln(c->in, &len, EVBUFFER_EOL_LF)) != NULL) {
        leased_line(c, line, len);
        free(line);
    }
}

static void
direct_set_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct zclient *c = priv;
    if (c->run->closing) {
        return;
    }
    read_done(c, false, 0, false);
}

static void
direct_get_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct zclient *c = priv;
    struct zrun *r = c->run;
    const redisReply *rep = reply;
    if (r->closing) {
        return;
    }
    if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
        zdie("GET failed: %s", rep != NULL ? rep->str : "no reply");
    }
    if (rep->type == REDIS_REPLY_STRING) {
        read_done(c, true, version_of(rep->str), false);
        return;
    }
    char key[128], val[70000];
    int kn = key_name(r, c->key, key, sizeof(key));
    int vn = value_text(r, r->db_ver[c->key], val, sizeof(val));
    r->fills += r->recording;
    redisAsyncCommand(c->ac, direct_set_cb, c, "SET %b %b PX %d", key,
                      (size_t)kn, val, (size_t)vn, ZIPF_TTL_MS);
}

static void
next_read(struct zclient *c)
{
    struct zrun *r = c->run;
    if (r->closing) {
        return;
    }
    c->key = zipf_draw(&c->rng, r->zo->keys);
    c->t_start_ns = now_ns();
    char key[128];
    int kn = key_name(r, c->key, key, sizeof(key));
    if (r->target == Z_DIRECT) {
        redisAsyncCommand(c->ac, direct_get_cb, c, "GET %b", key, (size_t)kn);
        return;
    }
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "{\"op\":\"cache.get\",\"key\":\"%s\"}\n", key);
    zwrite_all(c->fd, req, (size_t)n);
}

/* ------------------------------------------------------------- a run */

static void
on_end(evutil_socket_t fd, short what, void *arg)
{
    struct zrun *r = arg;
    r->t1_ns = now_ns();
    r->recording = false;
    r->closing = true;
    event_base_loopbreak(r->zo->base);
}

static void
on_warm(evutil_socket_t fd, short what, void *arg)
{
    struct zrun *r = arg;
    r->recording = true;
    r->t0_ns = now_ns();
    struct timeval tv = tv_of(r->zo->duration_s);
    r->end_ev = evtimer_new(r->zo->base, on_end, r);
    evtimer_add(r->end_ev, &tv);
}

static redisAsyncContext *
zredis(const struct zipf_opts *zo)
{
    redisAsyncContext *ac = redisAsyncConnect(zo->redis_host, zo->redis_port);
    if (ac == NULL || ac->err) {
        zdie("redis %s:%d: %s", zo->redis_host, zo->redis_port,
             ac != NULL ? ac->errstr : "cannot connect");
    }
    redisLibeventAttach(ac, zo->base);
    return ac;
}

static void
run_open(struct zrun *r)
{
    const struct zipf_opts *zo = r->zo;
    size_t nk = (size_t)zo->keys;
    r->db_ver = zalloc(nk * sizeof(*r->db_ver));
    r->ack_ver = zalloc(nk * sizeof(*r->ack_ver));
    r->ack_ns = zalloc(nk * sizeof(*r->ack_ns));
    r->cl = zalloc((size_t)zo->conns * sizeof(*r->cl));
    r->wrng = zo->seed * 7 + 3;
    r->wfd = -1;
    for (int i = 0; i < zo->conns; i++) {
        struct zclient *c = &r->cl[i];
        c->run = r;
        c->fd = -1;
        c->rng = zo->seed + (uint64_t)i * 0x9E3779B97F4A7C15ULL + 1;
        if (r->target == Z_LEASED) {
            c->fd = zunix_connect(zo->sock);
            evutil_make_socket_nonblocking(c->fd);
            c->in = evbuffer_new();
            c->rev = event_new(zo->base, c->fd, EV_READ | EV_PERSIST,
                               leased_readable, c);
            if (c->in == NULL || c->rev == NULL) {
                zdie("out of memory");
            }
            event_add(c->rev, NULL);
        } else {
            c->ac = zredis(zo);
        }
    }
    if (r->target == Z_LEASED && zo->writer_leased) {
        r->wfd = zunix_connect(zo->sock);
        evutil_make_socket_nonblocking(r->wfd);
        r->win = evbuffer_new();
        r->wev = event_new(zo->base, r->wfd, EV_READ | EV_PERSIST,
                           writer_leased_read, r);
        if (r->win == NULL || r->wev == NULL) {
            zdie("out of memory");
        }
        event_add(r->wev, NULL);
    } else {
        r->wac = zredis(zo);
    }
}

static void
run_close(struct zrun *r)
{
    r->closing = true;
    for (int i = 0; i < r->zo->conns; i++) {
        struct zclient *c = &r->cl[i];
        if (c->rev != NULL) {
            event_free(c->rev);
            evbuffer_free(c->in);
            close(c->fd);
        }
        if (c->ac != NULL) {
            redisAsyncFree(c->ac);
        }
    }
    if (r->wev != NULL) {
        event_free(r->wev);
        evbuffer_free(r->win);
        close(r->wfd);
    }
    if (r->wac != NULL) {
        redisAsyncFree(r->wac);
    }
    if (r->warm_ev != NULL) {
        event_free(r->warm_ev);
    }
    if (r->end_ev != NULL) {
        event_free(r->end_ev);
    }
    free(r->cl);
    free(r->db_ver);
    free(r->ack_ver);
    free(r->ack_ns);
    free(r->lat);
    free(r->stale);
}

static void
print_run(const struct zrun *r, const struct zresult *x)
{
    const struct zipf_opts *zo = r->zo;
    printf("mode=zipf target=%s conns=%d size=%zu keys=%d s=%.2f "
           "write_every=%lld writer=%s reads=%lld secs=%.3f ops_s=%.0f "
           "p50_us=%.1f p99_us=%.1f hits=%lld hit_ratio=%.4f "
           "near_hits=%lld near_ratio=%.4f fills=%lld writes=%lld "
           "stale_near=%lld stale_p99_us=%.1f stale_max_us=%.1f "
           "stale_redis=%lld stale_redis_max_us=%.1f waited_out=%lld "
           "errors=%lld "
           "daemon_near_hits=%lld daemon_tracking_evictions=%lld\n",
           ztarget_names[r->target], zo->conns, zo->size, zo->keys, zo->s,
           zo->write_every, zo->writer_leased ? "leased" : "redis", x->reads,
           x->secs, x->ops_s, x->p50, x->p99, x->hits, x->hit_ratio,
           x->near_hits, x->near_ratio, x->fills, x->writes, x->stale_near,
           x->stale_p99, x->stale_max, x->stale_redis, x->stale_redis_max,
           x->misses_no_lease, x->errors, x->daemon_near_hits,
           x->daemon_tracking_evictions);
    fflush(stdout);
}

static struct zresult
run_one(const struct zipf_opts *zo, enum ztarget t, int id)
{
    static struct zrun r;
    memset(&r, 0, sizeof(r));
    r.zo = zo;
    r.target = t;
    r.id = id;
    long long nh0 = 0, te0 = 0;
    if (t == Z_LEASED) {
        nh0 = zstat(zo->sock, "near_hits");
        te0 = zstat(zo->sock, "near_evictions_tracking");
    }
    run_open(&r);
    struct timeval tv = tv_of(zo->warmup_s);
    r.warm_ev = evtimer_new(zo->base, on_warm, &r);
    evtimer_add(r.warm_ev, &tv);
    for (int i = 0; i < zo->conns; i++) {
        next_read(&r.cl[i]);
    }
    event_base_dispatch(zo->base);
    if (!r.closing) {
        zdie("the event loop ran dry");
    }
    struct zresult x;
    memset(&x, 0, sizeof(x));
    x.secs = (double)(r.t1_ns - r.t0_ns) / 1e9;
    x.reads = r.reads;
    x.hits = r.hits;
    x.near_hits = r.near_hits;
    x.fills = r.fills;
    x.writes = r.writes;
    x.stale_near = r.stale_near;
    x.stale_redis = r.stale_redis;
    x.misses_no_lease = r.misses_no_lease;
    x.errors = r.errors;
    x.ops_s = x.secs > 0 ? (double)r.reads / x.secs : 0;
    x.hit_ratio = r.reads ? (double)r.hits / (double)r.reads : 0;
    x.near_ratio = r.reads ? (double)r.near_hits / (double)r.reads : 0;
    qsort(r.lat, r.nlat, sizeof(*r.lat), zcmp_u64);
    x.p50 = zpct_us(r.lat, r.nlat, 0.50);
    x.p99 = zpct_us(r.lat, r.nlat, 0.99);
    qsort(r.stale, r.nstale, sizeof(*r.stale), zcmp_u64);
    x.stale_p99 = zpct_us(r.stale, r.nstale, 0.99);
    x.stale_max = r.nstale ? (double)r.stale[r.nstale - 1] / 1000.0 : 0;
    for (size_t i = 0; i < r.nstale; i++) {
        push(&all_stale, &n_all_stale, &cap_all_stale, r.stale[i]);
    }
    x.stale_redis_max = (double)r.stale_redis_max_ns / 1000.0;
    run_close(&r);
    if (t == Z_LEASED) {
        /* Over warm-up and the run: the figures of the daemon's own. */
        x.daemon_near_hits = zstat(zo->sock, "near_hits") - nh0;
        x.daemon_tracking_evictions = zstat(zo->sock,
                                            "near_evictions_tracking") -
                                      te0;
    }
    print_run(&r, &x);
    return x;
}

static int
zcmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
zmedian(double *v, int n)
{
    if (n == 0) {
        return 0;
    }
    qsort(v, (size_t)n, sizeof(*v), zcmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void
bench_zipf_run(const struct zipf_opts *zo)
{
    if (zo->keys < 1 || zo->s < 0 || zo->write_every < 1 || zo->size > 65000) {
        zdie("bad --keys, --zipf-s, --write-every or --size");
    }
    zipf_init(zo->keys, zo->s);
    zvalue_pad = zalloc(zo->size + 1);
    memset(zvalue_pad, 'x', zo->size);
    int n = zo->repeat, cnt[2] = {0, 0}, id = 0;
    double ops[2][n], hit[2][n], near[2][n], p50[2][n];
    double stale_redis_max = 0, direct_stale_max = 0;
    long long stale_near = 0, stale_redis = 0, writes = 0, direct_stale = 0;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            int t = ((i % 2) ^ k ^ (int)zo->direct_first) ? Z_DIRECT
                                                          : Z_LEASED;
            if (!(t == Z_DIRECT ? zo->want_direct : zo->want_leased)) {
                continue;
            }
            struct zresult x = run_one(zo, (enum ztarget)t, ++id);
            ops[t][cnt[t]] = x.ops_s;
            hit[t][cnt[t]] = x.hit_ratio;
            near[t][cnt[t]] = x.near_ratio;
            p50[t][cnt[t]] = x.p50;
            cnt[t]++;
            if (t == Z_LEASED) {
                stale_near += x.stale_near;
                stale_redis += x.stale_redis;
                if (x.stale_redis_max > stale_redis_max) {
                    stale_redis_max = x.stale_redis_max;
                }
                writes += x.writes;
            } else {
                /* GET, load, SET with no lease: a SET that lands after
                 * the writer's DEL leaves the old version in Redis. */
                direct_stale += x.stale_redis;
                if (x.stale_redis_max > direct_stale_max) {
                    direct_stale_max = x.stale_redis_max;
                }
            }
        }
    }
    qsort(all_stale, n_all_stale, sizeof(*all_stale), zcmp_u64);
    double stale_p99 = zpct_us(all_stale, n_all_stale, 0.99);
    double stale_max = zpct_us(all_stale, n_all_stale, 1.0);
    if (cnt[Z_LEASED] > 0 && cnt[Z_DIRECT] > 0) {
        double lo = zmedian(ops[Z_LEASED], cnt[Z_LEASED]);
        double dop = zmedian(ops[Z_DIRECT], cnt[Z_DIRECT]);
        printf("mode=zipf target=both conns=%d size=%zu keys=%d s=%.2f "
               "write_every=%lld writer=%s repeat=%d leased_ops_s=%.0f "
               "direct_ops_s=%.0f ratio=%.3f leased_p50_us=%.1f "
               "direct_p50_us=%.1f leased_hit_ratio=%.4f "
               "near_ratio=%.4f direct_hit_ratio=%.4f writes=%lld "
               "stale_near=%lld stale_p99_us=%.1f stale_max_us=%.1f "
               "stale_redis=%lld stale_redis_max_us=%.1f "
               "direct_stale=%lld direct_stale_max_us=%.1f\n",
               zo->conns, zo->size, zo->keys, zo->s, zo->write_every,
               zo->writer_leased ? "leased" : "redis", n, lo, dop,
               dop > 0 ? lo / dop : 0, zmedian(p50[Z_LEASED], cnt[Z_LEASED]),
               zmedian(p50[Z_DIRECT], cnt[Z_DIRECT]),
               zmedian(hit[Z_LEASED], cnt[Z_LEASED]),
               zmedian(near[Z_LEASED], cnt[Z_LEASED]),
               zmedian(hit[Z_DIRECT], cnt[Z_DIRECT]), writes, stale_near,
               stale_p99, stale_max, stale_redis, stale_redis_max,
               direct_stale, direct_stale_max);
        fflush(stdout);
    }
    free(all_stale);
    free(zvalue_pad);
    free(zipf_cdf);
}
