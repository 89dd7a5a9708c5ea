/* leased-bench: closed-loop load against leased and, for comparison, the
 * same work done straight against Redis the way an application with an
 * in-process library does it, so that the daemon's cost comes out as a
 * ratio taken on the same machine at the same time.
 *
 * One libevent loop drives every connection of both sides. Each
 * connection has exactly one operation in flight (closed loop): the next
 * one leaves when the previous one is answered. Latency is taken per
 * operation with CLOCK_MONOTONIC and every sample is kept, so p99.9 is
 * exact rather than a bucket edge.
 *
 * Replies of leased are classified by looking for the field that decides
 * the outcome ("acquired":true, "hit":true, ...) in the reply line rather
 * than by building a JSON tree: the daemon writes compact JSON, the bench
 * shares the CPUs with the daemon and Redis, and hiredis does not build
 * anything heavier on the direct side either.
 *
 * Keys carry the pid and a run number, so a run never meets a lock that an
 * earlier run abandoned when it stopped with operations in flight. */

/* vasprintf */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>
#include <jansson.h>

#include "bench_util.h"
#include "bench_zipf.h"
#include "ld_cluster_slot.h"
#include "ld_lua.h"

#define LOCK_LEASE_MS 30000  /* leased's default lock.watchdog_ms */
#define CACHE_TTL_MS 3600000 /* pre-filled entries outlive any run */
#define MAX_ERRORS_SHOWN 5
#define WAITERS_TIMEOUT_S 60

enum mode {
    M_LOCK,
    M_CONTENDED,
    M_GET,
    M_MIX,
    M_PING,
    M_HOLD,
    M_ISOLATION,
    M_RENEWAL,
    M_STORM,
    M_STAMPEDE,
    M_SEM,     /* sem.acquire + sem.release, one semaphore of CONNS permits */
    M_RWREAD,  /* lock + unlock of the read side of a read-write lock */
    M_RWWRITE, /* the same, write side */
    M_MISS,    /* cache.get of a new key (a miss and its lease) + cache.fill */
    M_ZIPF,    /* bench_zipf.c */
    M_RATE,    /* a granted rate.acquire (direct: its script by EVALSHA) */
    M_MSET,    /* one cache.mset of --entries entries (direct: that many
                * SET PX, pipelined) */
    M_SETPIPE, /* --entries cache.set, pipelined (direct: as for mset) */
    M_BLOOMGET,   /* cache.get of a new key with "bloom": ruled out (a maybe:
                 * its miss, then cache.release of the lease) */
    M_MISSREL,    /* cache.get of a new key (a miss and its lease), then
                 * cache.release: the same absent key without a filter */
    M_NULLGET,    /* cache.get of a cached null */
    M_BLOOMCHECK, /* bloom.check of --entries keys */
    M_WAITERS,    /* internal: the queued waiters of --mode isolation */
    M_INVAL       /* internal: the invalidating sessions of --mode storm */
};
static const char *const mode_names[] = {
    "lock",     "lock-contended", "get",           "mix",       "ping",
    "hold",     "isolation",      "renewal",       "storm",     "stampede",
    "sem",      "rwlock-read",    "rwlock-write",  "miss",      "zipf",
    "rate",     "mset",           "set-pipelined", "bloom-get", "miss-release",
    "null-get", "bloom-check",    "waiters",       "inval"};

/* T_REDISSON: lock only, Redisson's RLock scripts (bench/redisson) sent
 * straight to Redis on the direct side's connections. */
enum target { T_LEASED, T_DIRECT, T_REDISSON, N_TARGETS };
static const char *const target_names[] = {"leased", "direct", "redisson"};

enum step {
    S_IDLE,
    S_ACQ, /* lock request or acquire script in flight */
    S_REL, /* unlock request or release script in flight */
    S_GET,
    S_PING,
    S_SUBSCRIBING, /* direct: lock taken, SUBSCRIBE sent, retry on reply */
    S_PAUSE,       /* direct: waiting for an unlock message or the pttl */
    S_HELD,        /* hold/waiters: holding, nothing in flight */
    S_INVAL,       /* storm: an invalidation in flight */
    S_MISS,        /* miss: the cache.get of a new key in flight */
    S_FILL,        /* miss: its cache.fill in flight */
    S_RATE,        /* rate: the decision in flight */
    S_BULK,        /* mset, set-pipelined: replies outstanding in left */
    S_BGET,        /* bloom-get, miss-release: the cache.get in flight */
    S_BREL,        /* bloom-get, miss-release: its cache.release */
    S_BCHECK       /* bloom-check: the bloom.check in flight */
};

struct run;

struct client {
    struct run *run;
    int idx;
    enum step step;
    uint64_t t_start_ns;
    uint64_t deadline_ns; /* contended: give up the wait */
    uint64_t rng;
    int held;                  /* hold mode: locks taken so far */
    bool wake;                 /* direct: unlock message during a try */
    int sub_state;             /* direct: 0 none, 1 sent, 2 subscribed */
    int fd;                    /* leased */
    struct event *rev;         /* leased: readable */
    struct event *wev;         /* leased: writable, only after a short
                                 * write */
    struct evbuffer *in, *out; /* leased */
    int node;                  /* direct --cluster: its master */
    redisAsyncContext *ac;     /* direct commands */
    redisAsyncContext *sub;    /* direct: its subscriber connection */
    struct event *timer;       /* direct: retry after the pttl */
    /* Requests, built once per run: a JSON line for leased, RESP for
     * Redis. */
    char *lock_req, *unlock_req, *get_req, *sub_req;
    size_t lock_len, unlock_len, get_len, sub_len;
    char *base_key;      /* miss: the prefix of its new keys */
    unsigned long n_key; /* miss: keys used so far */
    /* direct mset and set-pipelined: the SET PX commands sent at once */
    char **bulk_cmd;
    size_t *bulk_len;
    int left;     /* replies still to come for the op in flight */
    bool bulk_ok; /* no reply of the op in flight was wrong */
};

struct cpu {
    double bench_s, leased_s, redis_s;
};

struct run {
    enum mode mode;
    enum target target;
    int conns;
    size_t size;
    int id;
    struct client *cl;
    int nconnected, nneeded;
    bool recording, closing, started, churn;
    uint64_t t0_ns, t1_ns;
    uint64_t *lat;
    size_t nlat, caplat;
    long long ops, errors, timeouts, events, ops_limit;
    int done_clients; /* hold: clients holding all their locks */
    int acquired;     /* waiters: acquisitions seen */
    long long invals; /* storm: invalidations answered */
    int shown_errors;
    struct event *warm_ev, *end_ev;
    struct cpu cpu0, cpu1;
};

struct result {
    enum mode mode;
    enum target target;
    int conns;
    size_t size;
    long long ops, errors, timeouts;
    double secs, ops_s, p50, p99, p999, max, mean; /* microseconds */
    double bench_cpu, leased_cpu, redis_cpu;       /* % of one core */
};

static struct {
    enum mode mode;
    bool want[N_TARGETS];
    bool direct_first;
    const char *redisson_dir;
    const char *sock;
    char redis_host[256];
    int redis_port;
    int conns;
    size_t size;
    double duration_s, warmup_s;
    int repeat;
    long long ops_limit;
    long long wait_ms;
    int entries;        /* mset, set-pipelined: entries per op */
    const char *filter; /* bloom-get, bloom-check: the filter's name */
    bool json;
    pid_t leased_pid;
    pid_t redis_pids[16]; /* their CPU is summed (a cluster's masters) */
    int n_redis_pids;
    int locks;
    double hold_s;
    int waiters;
    int holders;
    bool churn;
    int mix_lock_pct;
    uint64_t seed;
    bool cluster;
    /* --via: the direct side's measured connections go through this
     * proxy (a Unix socket path, or host:port); setup stays on --redis. */
    const char *via;
    char via_host[256];
    int via_port;
    struct zipf_opts zipf;
} o;

/* The direct side through --via reports as "proxy". */
static const char *
target_name(enum target t)
{
    return t == T_DIRECT && o.via != NULL ? "proxy" : target_names[t];
}

/* --cluster: the masters of a Redis Cluster, from CLUSTER SLOTS on
 * --redis. Each direct connection talks to one master, with key names
 * whose slots that master owns: what a cluster-aware client does once it
 * has the slot map, without a redirection ever. */
#define CL_MAX_NODES 16
static struct {
    int n;
    char host[CL_MAX_NODES][64];
    int port[CL_MAX_NODES];
    signed char owner[LD_CLUSTER_SLOTS]; /* -1: no master */
} cl;

static struct event_base *base;
static char acq_sha[41], rel_sha[41], sem_acq_sha[41], sem_rel_sha[41];
static char rw_acq_sha[41], rw_rel_sha[41], rate_sha[41];
static char rl_acq_sha[41], rl_rel_sha[41]; /* Redisson's RLock */
static int run_counter;
static char *value_buf; /* SIZE bytes of 'x', NUL-terminated */

/* ---------------------------------------------------------------- util */

static void die(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));
static void
die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("leased-bench: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static void *
xmalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        die("out of memory");
    }
    return p;
}

static char *xasprintf(size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *
xasprintf(size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0) {
        die("out of memory");
    }
    if (len != NULL) {
        *len = (size_t)n;
    }
    return s;
}

static void
random_hex(char *out, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[64];
    size_t need = (n + 1) / 2;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || need > sizeof(b) || read(fd, b, need) != (ssize_t)need) {
        die("cannot read /dev/urandom");
    }
    close(fd);
    for (size_t i = 0; i < n; i++) {
        out[i] = hex[(b[i / 2] >> ((i % 2) * 4)) & 15];
    }
    out[n] = '\0';
}

/* CPU seconds of a process from /proc/PID/stat (utime + stime). */
static double
proc_cpu_s(pid_t pid)
{
    if (pid <= 0) {
        return 0;
    }
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces; the fields start after its ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL) {
        return 0;
    }
    unsigned long long ut = 0, st = 0;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
               &ut, &st) != 2) {
        return 0;
    }
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A line "NAME: <n> kB" of /proc/PID/status, in kB; -1 if absent. */
static long
proc_status_kb(pid_t pid, const char *name)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return -1;
    }
    long v = -1;
    size_t nl = strlen(name);
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strncmp(line, name, nl) == 0 && line[nl] == ':') {
            v = strtol(line + nl + 1, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static double
self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

static void
cpu_snap(struct cpu *c)
{
    c->bench_s = self_cpu_s();
    c->leased_s = proc_cpu_s(o.leased_pid);
    c->redis_s = 0;
    for (int i = 0; i < o.n_redis_pids; i++) {
        c->redis_s += proc_cpu_s(o.redis_pids[i]);
    }
}

/* ------------------------------------------------- blocking helpers */

static int
unix_connect(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        die("socket: %s", strerror(errno));
    }
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa.sun_path)) {
        die("socket path too long: %s", path);
    }
    strcpy(sa.sun_path, path);
    /* A blocking connect waits while the listen backlog is full, which is
     * what opening 10,000 sessions in a row needs. */
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (errno != EINTR) {
            die("connect %s: %s", path, strerror(errno));
        }
    }
    return fd;
}

static void
write_all(int fd, const char *s, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, s, len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            die("write to leased: %s (did it close the session?)",
                strerror(errno));
        }
        s += n;
        len -= (size_t)n;
    }
}

/* Send LINE on a blocking socket and return the next reply line that is
 * not an event (caller frees). */
static char *
blocking_call(int fd, const char *line, size_t len)
{
    write_all(fd, line, len);
    size_t cap = 4096, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        char ch;
        ssize_t k = read(fd, &ch, 1);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            die("leased closed the connection");
        }
        if (ch == '\n') {
            buf[n] = '\0';
            if (strncmp(buf, "{\"event\"", 8) == 0) {
                n = 0;
                continue;
            }
            return buf;
        }
        if (n + 2 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            if (buf == NULL) {
                die("out of memory");
            }
        }
        buf[n++] = ch;
    }
}

static long long
stats_field(int fd, const char *name)
{
    static const char req[] = "{\"op\":\"stats\"}\n";
    char *line = blocking_call(fd, req, sizeof(req) - 1);
    json_error_t err;
    json_t *j = json_loads(line, 0, &err);
    free(line);
    if (j == NULL) {
        die("stats reply is not JSON: %s", err.text);
    }
    json_t *v = json_object_get(json_object_get(j, "stats"), name);
    long long r = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
    json_decref(j);
    return r;
}

static redisContext *
redis_sync_to(const char *host, int port)
{
    redisContext *rc = redisConnect(host, port);
    if (rc == NULL || rc->err) {
        die("redis %s:%d: %s", host, port, rc ? rc->errstr : "cannot connect");
    }
    return rc;
}

static redisContext *
redis_sync(void)
{
    return redis_sync_to(o.redis_host, o.redis_port);
}

/* The host and port of master NODE for the direct side (the --redis
 * address itself without --cluster). */
static const char *
node_host(int node)
{
    return o.cluster ? cl.host[node] : o.redis_host;
}

static int
node_port(int node)
{
    return o.cluster ? cl.port[node] : o.redis_port;
}

static int
node_index(const char *host, int port)
{
    for (int i = 0; i < cl.n; i++) {
        if (cl.port[i] == port && strcmp(cl.host[i], host) == 0) {
            return i;
        }
    }
    if (cl.n == CL_MAX_NODES) {
        die("more than %d masters in the cluster", CL_MAX_NODES);
    }
    snprintf(cl.host[cl.n], sizeof(cl.host[0]), "%s", host);
    cl.port[cl.n] = port;
    return cl.n++;
}

static void
cluster_map(void)
{
    memset(cl.owner, -1, sizeof(cl.owner));
    redisContext *rc = redis_sync();
    redisReply *r = redisCommand(rc, "CLUSTER SLOTS");
    if (r == NULL || r->type != REDIS_REPLY_ARRAY) {
        die("CLUSTER SLOTS on %s:%d failed: %s", o.redis_host, o.redis_port,
            r && r->type == REDIS_REPLY_ERROR ? r->str : "?");
    }
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[2]->type != REDIS_REPLY_ARRAY ||
            e->element[2]->elements < 2) {
            die("CLUSTER SLOTS: unexpected reply");
        }
        redisReply *m = e->element[2];
        /* An empty host is the address the question went to. */
        const char *host = m->element[0]->type == REDIS_REPLY_STRING &&
                                   m->element[0]->len > 0
                               ? m->element[0]->str
                               : o.redis_host;
        int node = node_index(host, (int)m->element[1]->integer);
        for (long long s = e->element[0]->integer;
             s <= e->element[1]->integer && s < LD_CLUSTER_SLOTS; s++) {
            cl.owner[s] = (signed char)node;
        }
    }
    freeReplyObject(r);
    redisFree(rc);
    if (cl.n == 0) {
        die("CLUSTER SLOTS: no master serves a slot");
    }
}

/* BODY with its PUBLISH calls made SPUBLISH, as leased runs it on a
 * cluster (a plain PUBLISH is broadcast to every node over the bus). */
static char *
sharded_body(const char *body)
{
    static const char from[] = "redis.call('publish'";
    static const char to[] = "redis.call('SPUBLISH'";
    size_t n = 0;
    for (const char *p = body; (p = strstr(p, from)) != NULL; p++) {
        n++;
    }
    char *out = xmalloc(strlen(body) + n + 1);
    char *w = out;
    for (const char *p = body; *p != '\0';) {
        if (strncmp(p, from, sizeof(from) - 1) == 0) {
            memcpy(w, to, sizeof(to) - 1);
            w += sizeof(to) - 1;
            p += sizeof(from) - 1;
        } else {
            *w++ = *p++;
        }
    }
    *w = '\0';
    return out;
}

/* The direct side runs the daemon's own scripts, the very text compiled
 * into it (ld_lua.c), so both sides do exactly the same work inside
 * Redis. */
static void
load_scripts(void)
{
    const char *const texts[] = {ld_lua_lock_acquire, ld_lua_lock_release,
                                 ld_lua_sem_acquire,  ld_lua_sem_release,
                                 ld_lua_rw_acquire,   ld_lua_rw_release,
                                 ld_lua_rate_acquire};
    char *shas[] = {acq_sha,    rel_sha,    sem_acq_sha, sem_rel_sha,
                    rw_acq_sha, rw_rel_sha, rate_sha};
    if (o.cluster) {
        cluster_map();
    }
    for (int node = 0; node < (o.cluster ? cl.n : 1); node++) {
        redisContext *rc = redis_sync_to(node_host(node), node_port(node));
        for (size_t i = 0; i < sizeof(shas) / sizeof(shas[0]); i++) {
            char *text = o.cluster ? sharded_body(texts[i]) : NULL;
            redisReply *r = redisCommand(rc, "SCRIPT LOAD %s",
                                         text ? text : texts[i]);
            free(text);
            if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != 40) {
                die("SCRIPT LOAD of a lock script failed: %s",
                    r && r->type == REDIS_REPLY_ERROR ? r->str : "?");
            }
            memcpy(shas[i], r->str, 41);
            freeReplyObject(r);
        }
        redisFree(rc);
    }
}

/* Redisson's RLock scripts, as its client does: the text loaded once
 * with SCRIPT LOAD, then run by EVALSHA. */
static void
load_redisson(void)
{
    const char *const names[] = {"lock_acquire", "lock_release"};
    char *shas[] = {rl_acq_sha, rl_rel_sha};
    redisContext *rc = redis_sync();
    for (size_t i = 0; i < 2; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s.lua", o.redisson_dir, names[i]);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            die("%s: %s (see --redisson-dir)", path, strerror(errno));
        }
        char text[8192];
        size_t n = fread(text, 1, sizeof(text), f);
        bool whole = feof(f) && !ferror(f);
        fclose(f);
        if (!whole || n == 0) {
            die("%s: cannot read it whole", path);
        }
        redisReply *r = redisCommand(rc, "SCRIPT LOAD %b", text, n);
        if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != 40) {
            die("SCRIPT LOAD of %s failed: %s", path,
                r && r->type == REDIS_REPLY_ERROR ? r->str : "?");
        }
        memcpy(shas[i], r->str, 41);
        freeReplyObject(r);
    }
    redisFree(rc);
}

/* The name under FMT (one %s) for connection I's key base whose slot
 * belongs to NODE: the base with a counter appended until it does. The
 * lock and the get key search apart: CRC16 is linear, so one counter for
 * both may never put the two in the same master's slots. */
static void
cluster_name(const struct run *r, int i, int node, const char *fmt, char *buf,
             size_t size)
{
    for (unsigned t = 0; t < 100000; t++) {
        char key[192];
        snprintf(buf, size, "b%d.%d.%d.%u", (int)getpid(), r->id, i, t);
        snprintf(key, sizeof(key), fmt, buf);
        if (cl.owner[ld_cluster_slot(key, strlen(key))] == node) {
            return;
        }
    }
    die("no key name for master %s:%d (are its slots served?)", cl.host[node],
        cl.port[node]);
}

/* Direct connection I's key bases, for its lock (LOCK_BASE) and its get
 * key (GET_BASE), and the master it talks to: its own (pid, run, index)
 * on one Redis; on a cluster, master I modulo the masters, with names
 * whose slots that master owns. */
static int
direct_keys(const struct run *r, int i, char *lock_base, char *get_base,
            size_t size)
{
    if (!o.cluster) {
        snprintf(lock_base, size, "b%d.%d.%d", (int)getpid(), r->id, i);
        snprintf(get_base, size, "%s", lock_base);
        return 0;
    }
    int node = i % cl.n;
    /* The hash tag of the daemon's lock layout, and the get key. */
    cluster_name(r, i, node, "%s.l", lock_base, size);
    cluster_name(r, i, node, "benchd:get:%s.g", get_base, size);
    return node;
}

/* ----------------------------------------------------------- run state */

static void
lat_push(struct run *r, uint64_t ns)
{
    if (r->nlat == r->caplat) {
        r->caplat = r->caplat ? r->caplat * 2 : 65536;
        r->lat = realloc(r->lat, r->caplat * sizeof(*r->lat));
        if (r->lat == NULL) {
            die("out of memory");
        }
    }
    r->lat[r->nlat++] = ns;
}

static void
finish(struct run *r)
{
    if (r->recording) {
        r->t1_ns = now_ns();
        cpu_snap(&r->cpu1);
        r->recording = false;
    }
    event_base_loopbreak(base);
}

static void
show_error(struct run *r, const char *what, const char *s, size_t len)
{
    r->errors++;
    if (r->shown_errors++ < MAX_ERRORS_SHOWN) {
        fprintf(stderr, "leased-bench: %s %s: %.*s\n", target_name(r->target),
                what, (int)(len > 300 ? 300 : len), s);
    }
}

static void next_op(struct client *c);

static void
op_done(struct client *c)
{
    struct run *r = c->run;
    uint64_t t = now_ns();
    c->step = S_IDLE;
    if (r->recording) {
        r->ops++;
        lat_push(r, t - c->t_start_ns);
        if (r->ops_limit > 0 && r->ops >= r->ops_limit) {
            finish(r);
            return;
        }
    }
    next_op(c);
}

/* ------------------------------------------------------------ leased */

/* Requests go out with one write() at once rather than on the next loop
 * iteration: that is one syscall per request and no epoll change, the
 * least a client can do, and the same on the direct side. */
static void
leased_send(struct client *c, const char *s, size_t len, enum step st)
{
    c->step = st;
    if (evbuffer_get_length(c->out) == 0) {
        ssize_t n = write(c->fd, s, len);
        if (n < 0 && errno != EAGAIN && errno != EINTR) {
            die("write to leased: %s", strerror(errno));
        }
        if (n > 0) {
            s += n;
            len -= (size_t)n;
        }
        if (len == 0) {
            return;
        }
    }
    evbuffer_add(c->out, s, len);
    event_add(c->wev, NULL);
}

static void
leased_writable(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    if (evbuffer_write(c->out, fd) < 0 && errno != EAGAIN && errno != EINTR) {
        die("write to leased: %s", strerror(errno));
    }
    if (evbuffer_get_length(c->out) > 0) {
        event_add(c->wev, NULL);
    }
}

static void
hold_next(struct client *c)
{
    size_t len;
    char *line = xasprintf(&len,
                           "{\"op\":\"lock\",\"key\":\"b%d.%d.h%d.%d\"}\n",
                           (int)getpid(), c->run->id, c->idx, c->held);
    leased_send(c, line, len, S_ACQ);
    free(line);
}

static bool
line_has(struct evbuffer *in, size_t len, const char *needle)
{
    struct evbuffer_ptr end;
    if (evbuffer_ptr_set(in, &end, len, EVBUFFER_PTR_SET) < 0) {
        return false;
    }
    struct evbuffer_ptr p = evbuffer_search_range(in, needle, strlen(needle),
                                                  NULL, &end);
    return p.pos >= 0;
}

static void
leased_error(struct client *c, struct evbuffer *in, size_t len)
{
    const char *s = (const char *)
        evbuffer_pullup(in, (ev_ssize_t)(len > 300 ? 300 : len));
    show_error(c->run, "reply", s, len);
}

/* miss: a cache.get of a key never used (a miss: the lease is granted). */
static void
miss_next(struct client *c)
{
    char req[300];
    int n = snprintf(req, sizeof(req),
                     "{\"op\":\"cache.get\",\"key\":\"%s.m%lu\"}\n",
                     c->base_key, ++c->n_key);
    leased_send(c, req, (size_t)n, S_MISS);
}

/* miss: fill the key just missed under the lease of the reply. */
static void
miss_fill(struct client *c, struct evbuffer *in, size_t len)
{
    static const char field[] = "\"lease\":\"";
    const char *line = (const char *)evbuffer_pullup(in, (ev_ssize_t)len);
    const char *t = memmem(line, len, field, sizeof(field) - 1);
    const char *e = NULL;
    if (t != NULL) {
        t += sizeof(field) - 1;
        e = memchr(t, '"', len - (size_t)(t - line));
    }
    if (e == NULL || !line_has(in, len, "\"hit\":false")) {
        leased_error(c, in, len);
        next_op(c);
        return;
    }
    size_t cap = 256 + (size_t)(e - t) + c->run->size;
    char *req = xmalloc(cap);
    int n = snprintf(req, cap,
                     "{\"op\":\"cache.fill\",\"key\":\"%s.m%lu\","
                     "\"lease\":\"%.*s\",\"value\":\"%s\"}\n",
                     c->base_key, c->n_key, (int)(e - t), t, value_buf);
    leased_send(c, req, (size_t)n, S_FILL);
    free(req);
}

/* bloom-get, miss-release: a cache.get of a key never used, the same
 * keys in both modes (absent: never filled). */
static void
absent_next(struct client *c)
{
    char req[400];
    int n;
    if (c->run->mode == M_BLOOMGET) {
        n = snprintf(req, sizeof(req),
                     "{\"op\":\"cache.get\",\"key\":\"%s.m%lu\","
                     "\"bloom\":\"%s\"}\n",
                     c->base_key, ++c->n_key, o.filter);
    } else {
        n = snprintf(req, sizeof(req),
                     "{\"op\":\"cache.get\",\"key\":\"%s.m%lu\"}\n",
                     c->base_key, ++c->n_key);
    }
    leased_send(c, req, (size_t)n, S_BGET);
}

/* The answer to absent_next: ruled out by the filter (done), or a miss
 * whose fill lease is given back, as an app does that finds nothing to
 * fill (its loader found no row). */
static void
absent_reply(struct client *c, struct evbuffer *in, size_t len)
{
    static const char field[] = "\"lease\":\"";
    if (c->run->mode == M_BLOOMGET && line_has(in, len, "\"bloom\":true")) {
        op_done(c);
        return;
    }
    const char *line = (const char *)evbuffer_pullup(in, (ev_ssize_t)len);
    const char *t = memmem(line, len, field, sizeof(field) - 1);
    const char *e = NULL;
    if (t != NULL) {
        t += sizeof(field) - 1;
        e = memchr(t, '"', len - (size_t)(t - line));
    }
    if (e == NULL || !line_has(in, len, "\"hit\":false")) {
        leased_error(c, in, len);
        next_op(c);
        return;
    }
    char req[400];
    int n = snprintf(req, sizeof(req),
                     "{\"op\":\"cache.release\",\"key\":\"%s.m%lu\","
                     "\"lease\":\"%.*s\"}\n",
                     c->base_key, c->n_key, (int)(e - t), t);
    leased_send(c, req, (size_t)n, S_BREL);
}

/* sem.release names the grant's token, read from the acquire reply. */
static void
sem_release(struct client *c, struct evbuffer *in, size_t len)
{
    static const char field[] = "\"token\":\"";
    const char *line = (const char *)evbuffer_pullup(in, (ev_ssize_t)len);
    const char *t = memmem(line, len, field, sizeof(field) - 1);
    if (t == NULL || (size_t)(t - line) + sizeof(field) - 1 + 32 > len) {
        leased_error(c, in, len);
        next_op(c);
        return;
    }
    t += sizeof(field) - 1;
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "{\"op\":\"sem.release\",\"key\":\"b%d.%d.sem\","
                     "\"token\":\"%.32s\"}\n",
                     (int)getpid(), c->run->id, t);
    leased_send(c, req, (size_t)n, S_REL);
}

/* One reply of a bulk op has come: the op is done with the last one
 * (measured only when every reply was right). */
static void
bulk_reply_done(struct client *c)
{
    if (--c->left > 0) {
        return;
    }
    if (c->bulk_ok) {
        op_done(c);
    } else {
        next_op(c);
    }
}

static void
leased_reply(struct client *c, struct evbuffer *in, size_t len)
{
    struct run *r = c->run;
    if (line_has(in, len, "{\"event\":") && !line_has(in, len, "\"ok\":")) {
        r->events++;
        return;
    }
    switch (c->step) {
    case S_ACQ:
        if (line_has(in, len, "\"acquired\":true")) {
            if (r->mode == M_HOLD) {
                if (++c->held < o.locks) {
                    hold_next(c);
                } else {
                    c->step = S_HELD;
                    if (++r->done_clients == r->conns) {
                        event_base_loopbreak(base);
                    }
                }
            } else if (r->mode == M_WAITERS) {
                r->acquired++;
                if (r->churn) {
                    leased_send(c, c->unlock_req, c->unlock_len, S_REL);
                } else {
                    c->step = S_HELD;
                }
            } else if (r->mode == M_SEM) {
                sem_release(c, in, len);
            } else {
                leased_send(c, c->unlock_req, c->unlock_len, S_REL);
            }
        } else if (line_has(in, len, "\"acquired\":false")) {
            r->timeouts++;
            next_op(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_INVAL:
        if (line_has(in, len, "\"ok\":true")) {
            r->invals++;
        } else {
            leased_error(c, in, len);
        }
        next_op(c);
        break;
    case S_REL:
        if (r->mode == M_WAITERS) {
            leased_send(c, c->lock_req, c->lock_len, S_ACQ);
        } else if (line_has(in, len, "\"released\":true") ||
                   (r->mode == M_SEM && line_has(in, len, "\"released\":1"))) {
            op_done(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_GET:
        if (line_has(in, len, "\"hit\":true") &&
            (r->mode == M_NULLGET ? line_has(in, len, "\"value\":null")
                                  : len >= r->size)) {
            op_done(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_MISS:
        miss_fill(c, in, len);
        break;
    case S_FILL:
        if (line_has(in, len, "\"stored\":true")) {
            op_done(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_PING:
        if (line_has(in, len, "\"ok\":true")) {
            op_done(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_RATE:
        if (line_has(in, len, "\"acquired\":true")) {
            op_done(c);
        } else if (line_has(in, len, "\"acquired\":false")) {
            /* Not what is measured (the limit is far above the load):
             * counted apart, as a lock-contended wait that ran out. */
            r->timeouts++;
            next_op(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_BGET:
        absent_reply(c, in, len);
        break;
    case S_BREL:
        if (line_has(in, len, "\"released\":true")) {
            op_done(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_BCHECK:
        if (line_has(in, len, "\"maybe\":[")) {
            op_done(c);
        } else {
            leased_error(c, in, len);
            next_op(c);
        }
        break;
    case S_BULK:
        /* mset: one reply that stored every entry; set-pipelined: one
         * ok per request. */
        if (r->mode == M_MSET ? !line_has(in, len, c->unlock_req)
                              : !line_has(in, len, "\"ok\":true")) {
            leased_error(c, in, len);
            c->bulk_ok = false;
        }
        bulk_reply_done(c);
        break;
    default:
        leased_error(c, in, len);
        break;
    }
}

static void
leased_read(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    struct evbuffer *in = c->in;
    /* read() into the stack rather than evbuffer_read(), which asks the
     * kernel for the readable size first (one more syscall per reply than
     * hiredis makes on the direct side). */
    char buf[65536];
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n > 0) {
        evbuffer_add(in, buf, (size_t)n);
    } else {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
            return;
        }
        if (c->run->closing) {
            return;
        }
        die("leased closed connection %d of the %s run (%s)", c->idx,
            mode_names[c->run->mode], n == 0 ? "eof" : strerror(errno));
    }
    for (;;) {
        size_t eol_len = 0;
        struct evbuffer_ptr p = evbuffer_search_eol(in, NULL, &eol_len,
                                                    EVBUFFER_EOL_LF);
        if (p.pos < 0) {
            return;
        }
        leased_reply(c, in, (size_t)p.pos);
        evbuffer_drain(in, (size_t)p.pos + eol_len);
    }
}

/* ------------------------------------------------------------ direct */

static void
direct_send(struct client *c, redisCallbackFn *cb, const char *cmd, size_t len,
            enum step st)
{
    c->step = st;
    if (redisAsyncFormattedCommand(c->ac, cb, c, cmd, len) != REDIS_OK) {
        die("redis command failed: %s", c->ac->errstr);
    }
    /* Write now, as leased_send does, instead of from a write event on
     * the next loop iteration. */
    redisAsyncHandleWrite(c->ac);
}

static void
direct_reply_error(struct client *c, const redisReply *rep)
{
    if (rep->type == REDIS_REPLY_ERROR || rep->type == REDIS_REPLY_STATUS ||
        rep->type == REDIS_REPLY_STRING) {
        show_error(c->run, "reply", rep->str, rep->len);
    } else {
        char buf[64];
        int n = snprintf(buf, sizeof(buf), "type %d", rep->type);
        show_error(c->run, "reply", buf, (size_t)n);
    }
}

static long long
elem_int(const redisReply *rep, size_t i)
{
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements <= i ||
        rep->element[i]->type != REDIS_REPLY_INTEGER) {
        return LLONG_MIN;
    }
    return rep->element[i]->integer;
}

/* The daemon's lock scripts answer a free lock taken with its fence alone
 * and a release with a bare 1, its semaphore scripts a grant and a
 * release with a bare count; the other answers stay tables. */
static long long
reply_code(const redisReply *rep)
{
    if (rep->type == REDIS_REPLY_INTEGER) {
        return rep->integer >= 0 ? 1 : LLONG_MIN;
    }
    return elem_int(rep, 0);
}

static void direct_acq_cb(redisAsyncContext *ac, void *reply, void *priv);
static void redisson_acq_cb(redisAsyncContext *ac, void *reply, void *priv);
static void direct_sub_cb(redisAsyncContext *ac, void *reply, void *priv);

static void
direct_try(struct client *c)
{
    c->wake = false;
    direct_send(c,
                c->run->target == T_REDISSON ? redisson_acq_cb : direct_acq_cb,
                c->lock_req, c->lock_len, S_ACQ);
}

static void
direct_rel_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    /* Redisson's RLock answers 1 when the last hold is let go. */
    bool ok = c->run->target == T_REDISSON
                  ? rep->type == REDIS_REPLY_INTEGER && rep->integer == 1
                  : reply_code(rep) == 1;
    if (ok) {
        op_done(c);
    } else {
        direct_reply_error(c, rep);
        next_op(c);
    }
}

/* Redisson's wait: the try failed, so listen on the unlock channel and try
 * again on a message or when the holder's lease (the returned pttl) runs
 * out. A message that came in while a try was on its way counts as well
 * (Redisson's semaphore keeps that permit), so no wake-up is lost. */
static void
direct_wait(struct client *c, long long pttl)
{
    uint64_t t = now_ns();
    if (t >= c->deadline_ns) {
        c->run->timeouts++;
        next_op(c);
        return;
    }
    if (c->sub_state == 0) {
        c->sub_state = 1;
        c->step = S_SUBSCRIBING;
        if (redisAsyncFormattedCommand(c->sub, direct_sub_cb, c, c->sub_req,
                                       c->sub_len) != REDIS_OK) {
            die("SUBSCRIBE failed: %s", c->sub->errstr);
        }
        redisAsyncHandleWrite(c->sub);
        return;
    }
    if (c->wake) {
        direct_try(c);
        return;
    }
    uint64_t left_ns = c->deadline_ns - t;
    uint64_t wait_ns = pttl > 0 ? (uint64_t)pttl * 1000000u : 100000000u;
    if (wait_ns > left_ns) {
        wait_ns = left_ns;
    }
    c->step = S_PAUSE;
    struct timeval tv = tv_of((double)wait_ns / 1e9);
    evtimer_add(c->timer, &tv);
}

static void
direct_acq_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    long long v = reply_code(rep);
    if (v == 1) {
        direct_send(c, direct_rel_cb, c->unlock_req, c->unlock_len, S_REL);
    } else if (v == 0 && c->run->mode == M_CONTENDED) {
        direct_wait(c, elem_int(rep, 1));
    } else {
        direct_reply_error(c, rep);
        next_op(c);
    }
}

/* Its acquire answers nil when granted and the holder's pttl when taken;
 * taken is an error here, each connection having a key of its own. */
static void
redisson_acq_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    if (rep->type == REDIS_REPLY_NIL) {
        direct_send(c, direct_rel_cb, c->unlock_req, c->unlock_len, S_REL);
        return;
    }
    if (rep->type == REDIS_REPLY_INTEGER) {
        char buf[64];
        int n = snprintf(buf, sizeof(buf), "lock taken (pttl %lld)",
                         rep->integer);
        show_error(c->run, "reply", buf, (size_t)n);
    } else {
        direct_reply_error(c, rep);
    }
    next_op(c);
}

static void
direct_timer(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    if (c->step == S_PAUSE && !c->run->closing) {
        direct_try(c);
    }
}

/* Subscription replies: hiredis calls the callback given with SUBSCRIBE
 * for the confirmation and for every later message on the channel. */
static void
direct_sub_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing || rep->type != REDIS_REPLY_ARRAY ||
        rep->elements < 3 || rep->element[0]->type != REDIS_REPLY_STRING) {
        return;
    }
    const char *kind = rep->element[0]->str;
    if (strcmp(kind, "subscribe") == 0) {
        c->sub_state = 2;
        if (c->step == S_SUBSCRIBING) {
            direct_try(c);
        }
    } else if (strcmp(kind, "message") == 0) {
        if (c->step == S_PAUSE) {
            evtimer_del(c->timer);
            direct_try(c);
        } else if (c->step == S_ACQ) {
            c->wake = true;
        }
    }
}

static void
direct_get_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    if (rep->type == REDIS_REPLY_STRING && (size_t)rep->len == c->run->size) {
        op_done(c);
    } else {
        direct_reply_error(c, rep);
        next_op(c);
    }
}

static void
direct_ping_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    if (rep->type == REDIS_REPLY_STATUS && strcmp(rep->str, "PONG") == 0) {
        op_done(c);
    } else {
        direct_reply_error(c, rep);
        next_op(c);
    }
}

static void
direct_rate_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    long long v = elem_int(rep, 0);
    if (v == 1) {
        op_done(c);
    } else if (v == 0) {
        c->run->timeouts++;
        next_op(c);
    } else {
        direct_reply_error(c, rep);
        next_op(c);
    }
}

static void
direct_bulk_cb(redisAsyncContext *ac, void *reply, void *priv)
{
    struct client *c = priv;
    redisReply *rep = reply;
    if (rep == NULL || c->run->closing) {
        return;
    }
    if (rep->type != REDIS_REPLY_STATUS || strcmp(rep->str, "OK") != 0) {
        direct_reply_error(c, rep);
        c->bulk_ok = false;
    }
    bulk_reply_done(c);
}

/* The op's SET PX commands go out together, in one write: what a client
 * that pipelines a batch does. */
static void
direct_bulk(struct client *c)
{
    c->step = S_BULK;
    c->left = o.entries;
    c->bulk_ok = true;
    for (int i = 0; i < o.entries; i++) {
        if (redisAsyncFormattedCommand(c->ac, direct_bulk_cb, c,
                                       c->bulk_cmd[i],
                                       c->bulk_len[i]) != REDIS_OK) {
            die("redis command failed: %s", c->ac->errstr);
        }
    }
    redisAsyncHandleWrite(c->ac);
}

/* --------------------------------------------------------- operations */

static bool
op_is_lock(struct client *c)
{
    switch (c->run->mode) {
    case M_LOCK:
    case M_CONTENDED:
    case M_SEM:
    case M_RWREAD:
    case M_RWWRITE:
        return true;
    case M_MIX:
        return (int)(rng_next(&c->rng) % 100) < o.mix_lock_pct;
    default:
        return false;
    }
}

static void
next_op(struct client *c)
{
    struct run *r = c->run;
    if (r->closing) {
        return;
    }
    c->t_start_ns = now_ns();
    if (r->mode == M_HOLD) {
        hold_next(c);
        return;
    }
    if (r->mode == M_WAITERS) {
        leased_send(c, c->lock_req, c->lock_len, S_ACQ);
        return;
    }
    if (r->mode == M_INVAL) {
        leased_send(c, c->get_req, c->get_len, S_INVAL);
        return;
    }
    if (r->mode == M_MISS) {
        miss_next(c);
        return;
    }
    if (r->mode == M_BLOOMGET || r->mode == M_MISSREL) {
        absent_next(c);
        return;
    }
    if (r->mode == M_BLOOMCHECK) {
        leased_send(c, c->get_req, c->get_len, S_BCHECK);
        return;
    }
    if (r->mode == M_RATE) {
        if (r->target == T_LEASED) {
            leased_send(c, c->get_req, c->get_len, S_RATE);
        } else {
            direct_send(c, direct_rate_cb, c->get_req, c->get_len, S_RATE);
        }
        return;
    }
    if (r->mode == M_MSET || r->mode == M_SETPIPE) {
        if (r->target == T_LEASED) {
            /* mset: one reply; set-pipelined: one per request, all the
             * requests in one write. */
            c->left = r->mode == M_MSET ? 1 : o.entries;
            c->bulk_ok = true;
            leased_send(c, c->get_req, c->get_len, S_BULK);
        } else {
            direct_bulk(c);
        }
        return;
    }
    bool lock = op_is_lock(c);
    if (r->target == T_LEASED) {
        if (lock) {
            leased_send(c, c->lock_req, c->lock_len, S_ACQ);
        } else if (r->mode == M_PING) {
            leased_send(c, c->get_req, c->get_len, S_PING);
        } else {
            leased_send(c, c->get_req, c->get_len, S_GET);
        }
        return;
    }
    if (lock) {
        c->deadline_ns = c->t_start_ns + (uint64_t)o.wait_ms * 1000000u;
        direct_try(c);
    } else if (r->mode == M_PING) {
        direct_send(c, direct_ping_cb, c->get_req, c->get_len, S_PING);
    } else {
        direct_send(c, direct_get_cb, c->get_req, c->get_len, S_GET);
    }
}

/* ------------------------------------------------------------ clients */

static char *
resp(size_t *len, int argc, const char **argv)
{
    char *cmd = NULL;
    int n = redisFormatCommandArgv(&cmd, argc, argv, NULL);
    if (n < 0) {
        die("out of memory");
    }
    *len = (size_t)n;
    return cmd;
}

/* mset: one cache.mset line of --entries entries (get_req) and the
 * reply's count that says all were stored (unlock_req);
 * set-pipelined: as many cache.set lines, one after the other. */
static void
build_leased_bulk(struct run *r, struct client *c, const char *base_key)
{
    struct evbuffer *b = evbuffer_new();
    if (b == NULL) {
        die("out of memory");
    }
    if (r->mode == M_MSET) {
        evbuffer_add_printf(b, "{\"op\":\"cache.mset\",\"entries\":[");
    }
    for (int i = 0; i < o.entries; i++) {
        if (r->mode == M_MSET) {
            evbuffer_add_printf(b,
                                "%s{\"key\":\"%s.e%d\",\"value\":\"%s\","
                                "\"ttl_ms\":%d}",
                                i > 0 ? "," : "", base_key, i, value_buf,
                                CACHE_TTL_MS);
        } else {
            evbuffer_add_printf(b,
                                "{\"op\":\"cache.set\",\"key\":\"%s.e%d\","
                                "\"value\":\"%s\",\"ttl_ms\":%d}\n",
                                base_key, i, value_buf, CACHE_TTL_MS);
        }
    }
    if (r->mode == M_MSET) {
        evbuffer_add_printf(b, "]}\n");
    }
    c->get_len = evbuffer_get_length(b);
    c->get_req = xmalloc(c->get_len + 1);
    evbuffer_remove(b, c->get_req, c->get_len);
    c->get_req[c->get_len] = '\0';
    evbuffer_free(b);
    c->unlock_req = xasprintf(&c->unlock_len, "\"stored\":%d,", o.entries);
}

static void
build_leased(struct run *r, struct client *c, const char *base_key)
{
    free(c->base_key);
    c->base_key = xasprintf(NULL, "%s", base_key);
    if (r->mode == M_SEM) {
        c->lock_req =
            xasprintf(&c->lock_len,
                      "{\"op\":\"sem.acquire\",\"key\":\"b%d.%d.sem\","
                      "\"limit\":%d}\n",
                      (int)getpid(), r->id, r->conns);
        c->unlock_req = xasprintf(&c->unlock_len, "-");
    } else if (r->mode == M_CONTENDED || r->mode == M_WAITERS) {
        c->lock_req = xasprintf(&c->lock_len,
                                "{\"op\":\"lock\",\"key\":\"b%d.%d.c\","
                                "\"wait_ms\":%lld}\n",
                                (int)getpid(), r->id, o.wait_ms);
        c->unlock_req = xasprintf(&c->unlock_len,
                                  "{\"op\":\"unlock\",\"key\":\"b%d.%d.c\"}\n",
                                  (int)getpid(), r->id);
    } else if (r->mode == M_RWREAD || r->mode == M_RWWRITE) {
        const char *m = r->mode == M_RWREAD ? "read" : "write";
        c->lock_req = xasprintf(&c->lock_len,
                                "{\"op\":\"lock\",\"key\":\"%s.l\","
                                "\"mode\":\"%s\"}\n",
                                base_key, m);
        c->unlock_req = xasprintf(&c->unlock_len,
                                  "{\"op\":\"unlock\",\"key\":\"%s.l\","
                                  "\"mode\":\"%s\"}\n",
                                  base_key, m);
    } else {
        c->lock_req = xasprintf(&c->lock_len,
                                "{\"op\":\"lock\",\"key\":\"%s.l\"}\n",
                                base_key);
        c->unlock_req = xasprintf(&c->unlock_len,
                                  "{\"op\":\"unlock\",\"key\":\"%s.l\"}\n",
                                  base_key);
    }
    if (r->mode == M_RATE) {
        /* A limit far above any load: every decision grants, and the
         * script does the same work whatever the numbers. */
        c->get_req = xasprintf(&c->get_len,
                               "{\"op\":\"rate.acquire\",\"key\":"
                               "\"%s.r\",\"rate\":1000000,\"per_ms\":1}\n",
                               base_key);
        return;
    }
    if (r->mode == M_MSET || r->mode == M_SETPIPE) {
        build_leased_bulk(r, c, base_key);
        return;
    }
    if (r->mode == M_BLOOMCHECK) {
        /* Keys never added: what a reader asks before its reads. */
        struct evbuffer *b = evbuffer_new();
        if (b == NULL) {
            die("out of memory");
        }
        evbuffer_add_printf(b,
                            "{\"op\":\"bloom.check\",\"filter\":\"%s\","
                            "\"keys\":[",
                            o.filter);
        for (int i = 0; i < o.entries; i++) {
            evbuffer_add_printf(b, "%s\"%s.c%d\"", i > 0 ? "," : "", base_key,
                                i);
        }
        evbuffer_add_printf(b, "]}\n");
        c->get_len = evbuffer_get_length(b);
        c->get_req = xmalloc(c->get_len + 1);
        evbuffer_remove(b, c->get_req, c->get_len);
        c->get_req[c->get_len] = '\0';
        evbuffer_free(b);
        return;
    }
    if (r->mode == M_PING) {
        c->get_req = xasprintf(&c->get_len, "{\"op\":\"ping\"}\n");
    } else if (r->mode == M_INVAL) {
        /* Keys nobody reads: the cost measured is the journal's. */
        c->get_req = xasprintf(&c->get_len,
                               "{\"op\":\"cache.invalidate\",\"key\":"
                               "\"%s.i\",\"delay_ms\":0}\n",
                               base_key);
    } else {
        c->get_req = xasprintf(&c->get_len,
                               "{\"op\":\"cache.get\",\"key\":\"%s.g\"}\n",
                               base_key);
    }
}

/* Redisson's RLock on the direct side's per-connection key under a
 * prefix of its own, with Redisson's channel name for a hash-tagged lock
 * and its holder field (the client's uuid, ':', the thread id). */
static void
build_redisson(struct client *c, const char *base_key)
{
    char hash[160], chan[200], hex[33], field[48], lease[24];
    snprintf(hash, sizeof(hash), "benchr:lock:{%s.l}", base_key);
    snprintf(chan, sizeof(chan), "redisson_lock__channel:%s", hash);
    random_hex(hex, 32);
    snprintf(field, sizeof(field), "%.8s-%.4s-%.4s-%.4s-%.12s:1", hex, hex + 8,
             hex + 12, hex + 16, hex + 20);
    snprintf(lease, sizeof(lease), "%d", LOCK_LEASE_MS);
    const char *acq[] = {"EVALSHA", rl_acq_sha, "1", hash, lease, field};
    const char *rel[] = {"EVALSHA", rl_rel_sha, "2",   hash,
                         chan,      "0",        lease, field};
    c->lock_req = resp(&c->lock_len, 6, acq);
    c->unlock_req = resp(&c->unlock_len, 8, rel);
}

static void
build_direct(struct run *r, struct client *c, const char *base_key,
             const char *get_base)
{
    char key[128], hash[160], fence[170], chan[170], field[33];
    if (r->mode == M_CONTENDED) {
        snprintf(key, sizeof(key), "b%d.%d.c", (int)getpid(), r->id);
    } else {
        snprintf(key, sizeof(key), "%s.l", base_key);
    }
    /* The daemon's key layout under another prefix, and a 32-hex-digit
     * holder field per connection like the daemon's tokens. */
    snprintf(hash, sizeof(hash), "benchd:lock:{%s}", key);
    snprintf(fence, sizeof(fence), "%s:fence", hash);
    snprintf(chan, sizeof(chan), "%s:unlock", hash);
    random_hex(field, 32);
    char lease[24];
    snprintf(lease, sizeof(lease), "%d", LOCK_LEASE_MS);
    const char *acq[] = {"EVALSHA", acq_sha, "2",   hash,
                         fence,     lease,   field, "0"};
    /* The daemon leaves out the release's defaults (one hold, its own
     * channel, Redisson's message), and the floor once it handed out a
     * fence for the lock (it holds the fence against it itself); this
     * sends the floor "0", a lock's first fence: one argument and one GET
     * (the counter read first) more than the daemon's. */
    const char *rel[] = {"EVALSHA", rel_sha, "1", hash, field};
    c->lock_req = resp(&c->lock_len, 8, acq);
    c->unlock_req = resp(&c->unlock_len, 5, rel);
    if (r->mode == M_RWREAD || r->mode == M_RWWRITE) {
        /* The daemon's read-write scripts (src/lua/rw_*.lua): the plain
         * arguments, then the side, the readers' key prefix (the hash in
         * the daemon's layout) and no downgrade field. */
        const char *m = r->mode == M_RWREAD ? "read" : "write";
        const char *racq[] = {"EVALSHA", rw_acq_sha, "2", hash, fence, lease,
                              field,     "0",        m,   hash, ""};
        const char *rrel[] = {"EVALSHA", rw_rel_sha, "1", hash, field, m};
        free(c->lock_req);
        free(c->unlock_req);
        c->lock_req = resp(&c->lock_len, 11, racq);
        c->unlock_req = resp(&c->unlock_len, 6, rrel);
    }
    if (r->mode == M_SEM) {
        /* One semaphore of CONNS permits, the daemon's layout; each
         * connection reuses one token (it holds one grant at a time). */
        char zset[200], permits[220], limit[16];
        snprintf(zset, sizeof(zset), "benchd:lock:{b%d.%d.sem}:sem",
                 (int)getpid(), r->id);
        snprintf(permits, sizeof(permits), "%s:permits", zset);
        snprintf(limit, sizeof(limit), "%d", r->conns);
        free(c->lock_req);
        free(c->unlock_req);
        const char *sacq[] = {"EVALSHA", sem_acq_sha, "2",   zset, permits,
                              limit,     "1",         lease, field};
        const char *srel[] = {"EVALSHA", sem_rel_sha, "2",
                              zset,      permits,     field};
        c->lock_req = resp(&c->lock_len, 9, sacq);
        c->unlock_req = resp(&c->unlock_len, 6, srel);
    }
    const char *sub[] = {"SUBSCRIBE", chan};
    c->sub_req = resp(&c->sub_len, 2, sub);
    if (r->mode == M_MSET || r->mode == M_SETPIPE) {
        /* What an app sends without leased: SET key value PX ttl. */
        char ttl[24];
        snprintf(ttl, sizeof(ttl), "%d", CACHE_TTL_MS);
        c->bulk_cmd = xmalloc(sizeof(char *) * (size_t)o.entries);
        c->bulk_len = xmalloc(sizeof(size_t) * (size_t)o.entries);
        for (int i = 0; i < o.entries; i++) {
            char bkey[180];
            snprintf(bkey, sizeof(bkey), "benchd:get:%s.e%d", get_base, i);
            const char *set[] = {"SET", bkey, value_buf, "PX", ttl};
            c->bulk_cmd[i] = resp(&c->bulk_len[i], 5, set);
        }
    }
    if (r->mode == M_RATE) {
        char rkey[180];
        snprintf(rkey, sizeof(rkey), "benchd:lock:{%s.r}:rate", get_base);
        const char *rate[] = {"EVALSHA", rate_sha, "1",       rkey,
                              "1000000", "1",      "1000000", "1"};
        c->get_req = resp(&c->get_len, 8, rate);
    } else if (r->mode == M_PING) {
        const char *ping[] = {"PING"};
        c->get_req = resp(&c->get_len, 1, ping);
    } else {
        char gkey[160];
        snprintf(gkey, sizeof(gkey), "benchd:get:%s.g", get_base);
        const char *get[] = {"GET", gkey};
        c->get_req = resp(&c->get_len, 2, get);
    }
}

static void start(struct run *r);

static void
direct_connected(const redisAsyncContext *ac, int status)
{
    struct client *c = ac->data;
    if (status != REDIS_OK) {
        die("connect to redis: %s", ac->errstr);
    }
    if (++c->run->nconnected == c->run->nneeded) {
        start(c->run);
    }
}

static void
direct_disconnected(const redisAsyncContext *ac, int status)
{
    struct client *c = ac->data;
    if (!c->run->closing && status != REDIS_OK) {
        die("redis closed a connection: %s", ac->errstr);
    }
}

static redisAsyncContext *
direct_connect(struct client *c)
{
    const char *host = o.via != NULL ? o.via_host : node_host(c->node);
    int port = o.via != NULL ? o.via_port : node_port(c->node);
    /* --via PATH leaves via_port 0: a Unix socket. */
    redisAsyncContext *ac = o.via != NULL && port == 0
                                ? redisAsyncConnectUnix(o.via)
                                : redisAsyncConnect(host, port);
    if (ac == NULL || ac->err) {
        const char *why = ac ? ac->errstr : "cannot connect";
        if (port == 0) {
            die("proxy %s: %s", o.via, why);
        }
        die("%s %s:%d: %s", o.via != NULL ? "proxy" : "redis", host, port,
            why);
    }
    ac->data = c;
    redisLibeventAttach(ac, base);
    redisAsyncSetConnectCallback(ac, direct_connected);
    redisAsyncSetDisconnectCallback(ac, direct_disconnected);
    return ac;
}

/* Pre-fill the values the get and mix runs read. */
static void
prefill(struct run *r)
{
    if (r->mode != M_GET && r->mode != M_MIX && r->mode != M_NULLGET) {
        return;
    }
    if (r->target == T_DIRECT) {
        redisContext *rc[CL_MAX_NODES] = {NULL};
        for (int i = 0; i < r->conns; i++) {
            char lock_base[96], base_key[96];
            int node = direct_keys(r, i, lock_base, base_key,
                                   sizeof(base_key));
            if (rc[node] == NULL) {
                rc[node] = redis_sync_to(node_host(node), node_port(node));
            }
            redisReply *rep = redisCommand(rc[node], "SET benchd:get:%s.g %b",
                                           base_key, value_buf, r->size);
            if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
                die("SET failed: %s", rep ? rep->str : "?");
            }
            freeReplyObject(rep);
        }
        for (int n = 0; n < CL_MAX_NODES; n++) {
            if (rc[n] != NULL) {
                redisFree(rc[n]);
            }
        }
        return;
    }
    int fd = unix_connect(o.sock);
    for (int i = 0; i < r->conns; i++) {
        size_t len;
        /* null-get: "not found" cached, as a loader that found no row
         * stores it. */
        char *req =
            r->mode == M_NULLGET
                ? xasprintf(&len,
                            "{\"op\":\"cache.set\",\"key\":\"b%d.%d.%d.g\","
                            "\"value\":null,\"ttl_ms\":%d}\n",
                            (int)getpid(), r->id, i, CACHE_TTL_MS)
                : xasprintf(&len,
                            "{\"op\":\"cache.set\",\"key\":\"b%d.%d.%d.g\","
                            "\"value\":\"%s\",\"ttl_ms\":%d}\n",
                            (int)getpid(), r->id, i, value_buf, CACHE_TTL_MS);
        char *line = blocking_call(fd, req, len);
        if (strstr(line, "\"ok\":true") == NULL) {
            die("cache.set failed: %.300s", line);
        }
        free(line);
        free(req);
    }
    close(fd);
}

static void
clients_open(struct run *r)
{
    r->cl = calloc((size_t)r->conns, sizeof(*r->cl));
    if (r->cl == NULL) {
        die("out of memory");
    }
    r->nneeded = r->target == T_DIRECT
                     ? r->conns * (r->mode == M_CONTENDED ? 2 : 1)
                     : r->conns;
    for (int i = 0; i < r->conns; i++) {
        struct client *c = &r->cl[i];
        char base_key[96];
        snprintf(base_key, sizeof(base_key), "b%d.%d.%d", (int)getpid(), r->id,
                 i);
        c->run = r;
        c->idx = i;
        c->rng = o.seed + (uint64_t)i * 0x9E3779B97F4A7C15ULL + 1;
        if (r->target == T_LEASED) {
            build_leased(r, c, base_key);
            c->fd = unix_connect(o.sock);
            evutil_make_socket_nonblocking(c->fd);
            c->in = evbuffer_new();
            c->out = evbuffer_new();
            c->rev = event_new(base, c->fd, EV_READ | EV_PERSIST, leased_read,
                               c);
            c->wev = event_new(base, c->fd, EV_WRITE, leased_writable, c);
            if (c->in == NULL || c->out == NULL || c->rev == NULL ||
                c->wev == NULL) {
                die("out of memory");
            }
            event_add(c->rev, NULL);
            r->nconnected++;
        } else {
            char get_base[96];
            c->node = direct_keys(r, i, base_key, get_base, sizeof(get_base));
            if (r->target == T_REDISSON) {
                build_redisson(c, base_key);
            } else {
                build_direct(r, c, base_key, get_base);
            }
            c->ac = direct_connect(c);
            if (r->mode == M_CONTENDED) {
                c->sub = direct_connect(c);
                c->timer = evtimer_new(base, direct_timer, c);
            }
        }
    }
}

static void
clients_close(struct run *r)
{
    r->closing = true;
    for (int i = 0; i < r->conns; i++) {
        struct client *c = &r->cl[i];
        if (c->rev != NULL) {
            event_free(c->rev);
            event_free(c->wev);
            evbuffer_free(c->in);
            evbuffer_free(c->out);
            close(c->fd);
        }
        if (c->ac != NULL) {
            redisAsyncFree(c->ac);
        }
        if (c->sub != NULL) {
            redisAsyncFree(c->sub);
        }
        if (c->timer != NULL) {
            event_free(c->timer);
        }
        if (r->target != T_LEASED) {
            redisFreeCommand(c->lock_req);
            redisFreeCommand(c->unlock_req);
            redisFreeCommand(c->get_req);
            redisFreeCommand(c->sub_req);
            for (int k = 0; c->bulk_cmd != NULL && k < o.entries; k++) {
                redisFreeCommand(c->bulk_cmd[k]);
            }
            free(c->bulk_cmd);
            free(c->bulk_len);
        } else {
            free(c->lock_req);
            free(c->unlock_req);
            free(c->get_req);
        }
        free(c->base_key);
    }
    free(r->cl);
    r->cl = NULL;
    if (r->warm_ev != NULL) {
        event_free(r->warm_ev);
    }
    if (r->end_ev != NULL) {
        event_free(r->end_ev);
    }
    free(r->lat);
    r->lat = NULL;
}

static void
on_end(evutil_socket_t fd, short what, void *arg)
{
    finish(arg);
}

static void
begin_recording(struct run *r)
{
    r->recording = true;
    r->t0_ns = now_ns();
    cpu_snap(&r->cpu0);
    if (r->ops_limit <= 0) {
        struct timeval tv = tv_of(o.duration_s);
        r->end_ev = evtimer_new(base, on_end, r);
        evtimer_add(r->end_ev, &tv);
    }
}

static void
on_warm(evutil_socket_t fd, short what, void *arg)
{
    begin_recording(arg);
}

static void
start(struct run *r)
{
    if (r->started) {
        return;
    }
    r->started = true;
    if (r->mode != M_HOLD && r->mode != M_WAITERS && r->mode != M_INVAL) {
        if (o.warmup_s > 0) {
            struct timeval tv = tv_of(o.warmup_s);
            r->warm_ev = evtimer_new(base, on_warm, r);
            evtimer_add(r->warm_ev, &tv);
        } else {
            begin_recording(r);
        }
    }
    for (int i = 0; i < r->conns; i++) {
        next_op(&r->cl[i]);
    }
}

/* ------------------------------------------------------------ results */

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double
pct_us(const uint64_t *v, size_t n, double q)
{
    if (n == 0) {
        return 0;
    }
    size_t i = (size_t)ceil(q * (double)n);
    i = i == 0 ? 0 : i - 1;
    if (i >= n) {
        i = n - 1;
    }
    return (double)v[i] / 1000.0;
}

static void
compute(struct run *r, struct result *res)
{
    memset(res, 0, sizeof(*res));
    res->mode = r->mode;
    res->target = r->target;
    res->conns = r->conns;
    res->size = r->size;
    res->ops = r->ops;
    res->errors = r->errors;
    res->timeouts = r->timeouts;
    res->secs = (double)(r->t1_ns - r->t0_ns) / 1e9;
    res->ops_s = res->secs > 0 ? (double)r->ops / res->secs : 0;
    qsort(r->lat, r->nlat, sizeof(*r->lat), cmp_u64);
    res->p50 = pct_us(r->lat, r->nlat, 0.50);
    res->p99 = pct_us(r->lat, r->nlat, 0.99);
    res->p999 = pct_us(r->lat, r->nlat, 0.999);
    res->max = r->nlat ? (double)r->lat[r->nlat - 1] / 1000.0 : 0;
    double sum = 0;
    for (size_t i = 0; i < r->nlat; i++) {
        sum += (double)r->lat[i];
    }
    res->mean = r->nlat ? sum / (double)r->nlat / 1000.0 : 0;
    if (res->secs > 0) {
        res->bench_cpu = (r->cpu1.bench_s - r->cpu0.bench_s) / res->secs * 100;
        res->leased_cpu = (r->cpu1.leased_s - r->cpu0.leased_s) / res->secs *
                          100;
        res->redis_cpu = (r->cpu1.redis_s - r->cpu0.redis_s) / res->secs * 100;
    }
}

static void
print_result(const struct result *s)
{
    if (o.json) {
        json_t *j = json_pack(
            "{s:s,s:s,s:i,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:I,"
            "s:f,s:f,s:f}",
            "mode", mode_names[s->mode], "target", target_name(s->target),
            "conns", s->conns, "size", (json_int_t)s->size, "ops",
            (json_int_t)s->ops, "secs", s->secs, "ops_s", s->ops_s, "p50_us",
            s->p50, "p99_us", s->p99, "p999_us", s->p999, "max_us", s->max,
            "mean_us", s->mean, "errors", (json_int_t)s->errors, "timeouts",
            (json_int_t)s->timeouts, "bench_cpu_pct", s->bench_cpu,
            "leased_cpu_pct", s->leased_cpu, "redis_cpu_pct", s->redis_cpu);
        char *txt = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        puts(txt);
        free(txt);
        json_decref(j);
    } else {
        printf("mode=%s target=%s conns=%d size=%zu ops=%lld secs=%.3f "
               "ops_s=%.0f p50_us=%.1f p99_us=%.1f p999_us=%.1f "
               "max_us=%.1f mean_us=%.1f errors=%lld timeouts=%lld "
               "bench_cpu_pct=%.0f leased_cpu_pct=%.0f redis_cpu_pct=%.0f\n",
               mode_names[s->mode], target_name(s->target), s->conns, s->size,
               s->ops, s->secs, s->ops_s, s->p50, s->p99, s->p999, s->max,
               s->mean, s->errors, s->timeouts, s->bench_cpu, s->leased_cpu,
               s->redis_cpu);
    }
    fflush(stdout);
}

static struct result
run_one(enum mode m, enum target t, int conns, size_t size)
{
    struct run r;
    memset(&r, 0, sizeof(r));
    r.mode = m;
    r.target = t;
    r.conns = conns;
    r.size = size;
    r.id = ++run_counter;
    r.ops_limit = o.ops_limit;
    prefill(&r);
    clients_open(&r);
    if (t == T_LEASED) {
        start(&r);
    }
    event_base_dispatch(base);
    if (r.recording) {
        die("the event loop ran dry during the %s run", mode_names[m]);
    }
    struct result res;
    compute(&r, &res);
    clients_close(&r);
    return res;
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Both sides, R times, in the order L D D L L D ... so that a drift of the
 * machine's load over the pairs falls on both alike; the summary takes
 * the median of each figure. The other side is direct, or Redisson's
 * scripts for -t leased,redisson. */
static void
run_pairs(void)
{
    int n = o.repeat;
    double ops[2][n], p50[2][n], p99[2][n], p999[2][n];
    int cnt[2] = {0, 0};
    enum target other = o.want[T_REDISSON] ? T_REDISSON : T_DIRECT;
    enum target sides[2] = {T_LEASED, other};
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            int t = (i % 2) ^ k ^ (int)o.direct_first;
            if (!o.want[sides[t]]) {
                continue;
            }
            struct result res = run_one(o.mode, sides[t], o.conns, o.size);
            print_result(&res);
            ops[t][cnt[t]] = res.ops_s;
            p50[t][cnt[t]] = res.p50;
            p99[t][cnt[t]] = res.p99;
            p999[t][cnt[t]] = res.p999;
            cnt[t]++;
        }
    }
    if (cnt[0] == 0 || cnt[1] == 0) {
        return;
    }
    double lo = median(ops[0], cnt[0]), dop = median(ops[1], cnt[1]);
    double l50 = median(p50[0], cnt[0]), d50 = median(p50[1], cnt[1]);
    double l99 = median(p99[0], cnt[0]), d99 = median(p99[1], cnt[1]);
    double l999 = median(p999[0], cnt[0]), d999 = median(p999[1], cnt[1]);
    double ratio = dop > 0 ? lo / dop : 0;
    /* Against direct, the line reports as it always has (target=both,
     * direct_*); against Redisson, its figures are named after it. */
    const char *pair = other == T_REDISSON ? "leased,redisson" : "both";
    const char *on = target_names[other];
    if (o.json) {
        char k_ops[32], k_p50[32], k_p99[32], k_p999[32];
        snprintf(k_ops, sizeof(k_ops), "%s_ops_s", on);
        snprintf(k_p50, sizeof(k_p50), "%s_p50_us", on);
        snprintf(k_p99, sizeof(k_p99), "%s_p99_us", on);
        snprintf(k_p999, sizeof(k_p999), "%s_p999_us", on);
        json_t *j = json_pack(
            "{s:s,s:s,s:i,s:I,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
            "mode", mode_names[o.mode], "target", pair, "conns", o.conns,
            "size", (json_int_t)o.size, "repeat", n, "leased_ops_s", lo, k_ops,
            dop, "ratio", ratio, "leased_p50_us", l50, k_p50, d50,
            "leased_p99_us", l99, k_p99, d99, "leased_p999_us", l999, k_p999,
            d999);
        char *txt = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        puts(txt);
        free(txt);
        json_decref(j);
    } else {
        printf("mode=%s target=%s conns=%d size=%zu repeat=%d "
               "leased_ops_s=%.0f %s_ops_s=%.0f ratio=%.3f "
               "leased_p50_us=%.1f %s_p50_us=%.1f leased_p99_us=%.1f "
               "%s_p99_us=%.1f leased_p999_us=%.1f %s_p999_us=%.1f\n",
               mode_names[o.mode], pair, o.conns, o.size, n, lo, on, dop,
               ratio, l50, on, d50, l99, on, d99, l999, on, d999);
    }
    fflush(stdout);
}

/* ------------------------------------------------------ hold (resources) */

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    event_base_loopbreak(base);
}

/* Run the loop for S seconds (the held sessions' events are read). */
static void
loop_for(double s)
{
    struct timeval tv = tv_of(s);
    struct event *ev = evtimer_new(base, on_tick, NULL);
    evtimer_add(ev, &tv);
    event_base_dispatch(base);
    event_free(ev);
}

static void
emit_kv(json_t *j, const char *k, double v, bool integer)
{
    if (o.json) {
        json_object_set_new(j, k,
                            integer ? json_integer((json_int_t)v)
                                    : json_real(v));
    } else if (integer) {
        printf(" %s=%lld", k, (long long)v);
    } else {
        printf(" %s=%.2f", k, v);
    }
}

/* CONNS sessions, each taking LOCKS watchdog locks with distinct keys one
 * after the other; then the daemon's memory and its CPU over HOLD seconds
 * of doing nothing but keeping them (the watchdog renews every third of
 * lock.watchdog_ms). */
static void
run_hold(void)
{
    if (o.leased_pid <= 0) {
        die("--mode hold needs --pid of leased");
    }
    int ctl = unix_connect(o.sock);
    long rss_idle = proc_status_kb(o.leased_pid, "VmRSS");
    struct run r;
    memset(&r, 0, sizeof(r));
    r.mode = M_HOLD;
    r.target = T_LEASED;
    r.conns = o.conns;
    r.id = ++run_counter;
    uint64_t t_setup = now_ns();
    clients_open(&r);
    start(&r);
    event_base_dispatch(base);
    double setup_s = (double)(now_ns() - t_setup) / 1e9;
    if (r.done_clients != r.conns) {
        die("only %d of %d sessions took their locks", r.done_clients,
            r.conns);
    }
    long long held = stats_field(ctl, "locks_held");
    long long ren0 = stats_field(ctl, "lock_renewals_ok");
    long long fail0 = stats_field(ctl, "lock_renewals_failed");
    long rss_held = proc_status_kb(o.leased_pid, "VmRSS");
    struct cpu c0, c1;
    cpu_snap(&c0);
    uint64_t t0 = now_ns();
    loop_for(o.hold_s);
    cpu_snap(&c1);
    double secs = (double)(now_ns() - t0) / 1e9;
    long long ren1 = stats_field(ctl, "lock_renewals_ok");
    long long fail1 = stats_field(ctl, "lock_renewals_failed");
    long rss_end = proc_status_kb(o.leased_pid, "VmRSS");
    long hwm = proc_status_kb(o.leased_pid, "VmHWM");
    long long locks = (long long)o.conns * o.locks;
    json_t *j = o.json ? json_object() : NULL;
    if (o.json) {
        json_object_set_new(j, "mode", json_string("hold"));
    } else {
        printf("mode=hold");
    }
    emit_kv(j, "conns", o.conns, true);
    emit_kv(j, "locks", (double)locks, true);
    emit_kv(j, "locks_held", (double)held, true);
    emit_kv(j, "setup_s", setup_s, false);
    emit_kv(j, "secs", secs, false);
    emit_kv(j, "rss_idle_kb", (double)rss_idle, true);
    emit_kv(j, "rss_held_kb", (double)rss_held, true);
    emit_kv(j, "rss_end_kb", (double)rss_end, true);
    emit_kv(j, "rss_hwm_kb", (double)hwm, true);
    emit_kv(j, "bytes_per_lock",
            (double)(rss_end - rss_idle) * 1024.0 / (double)locks, false);
    emit_kv(j, "leased_cpu_pct", (c1.leased_s - c0.leased_s) / secs * 100,
            false);
    emit_kv(j, "redis_cpu_pct", (c1.redis_s - c0.redis_s) / secs * 100, false);
    emit_kv(j, "bench_cpu_pct", (c1.bench_s - c0.bench_s) / secs * 100, false);
    emit_kv(j, "renewals", (double)(ren1 - ren0), true);
    emit_kv(j, "renewals_failed", (double)(fail1 - fail0), true);
    emit_kv(j, "events", (double)r.events, true);
    if (o.json) {
        char *txt = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        puts(txt);
        free(txt);
        json_decref(j);
    } else {
        putchar('\n');
    }
    fflush(stdout);
    clients_close(&r);
    close(ctl);
}

/* ---------------------------------------------------------- isolation */

static void
on_poll_waiters(evutil_socket_t fd, short what, void *arg)
{
    int *ctl = arg;
    if (stats_field(*ctl, "lock_waiters") >= o.waiters) {
        event_base_loopbreak(base);
    }
}

static void
wait_for_waiters(int ctl)
{
    struct timeval tv = {0, 50000};
    struct event *ev = event_new(base, -1, EV_PERSIST, on_poll_waiters, &ctl);
    struct event *guard = evtimer_new(base, on_tick, NULL);
    struct timeval gtv = {WAITERS_TIMEOUT_S, 0};
    evtimer_add(ev, &tv);
    evtimer_add(guard, &gtv);
    event_base_dispatch(base);
    event_free(ev);
    event_free(guard);
    long long n = stats_field(ctl, "lock_waiters");
    if (n < o.waiters) {
        die("only %lld of %d waiters queued", n, o.waiters);
    }
}

static void
iso_print(const char *mode, const char *phase, const struct result *s,
          long long waiting, int acquired)
{
    if (o.json) {
        json_t *j = json_pack("{s:s,s:s,s:i,s:I,s:I,s:I,s:f,s:f,s:f,s:f,"
                              "s:f,s:I,s:i,s:f,s:f}",
                              "mode", mode, "phase", phase, "conns", s->conns,
                              "size", (json_int_t)s->size, "waiters",
                              (json_int_t)waiting, "ops", (json_int_t)s->ops,
                              "ops_s", s->ops_s, "p50_us", s->p50, "p99_us",
                              s->p99, "p999_us", s->p999, "max_us", s->max,
                              "errors", (json_int_t)s->errors, "acquired",
                              acquired, "leased_cpu_pct", s->leased_cpu,
                              "redis_cpu_pct", s->redis_cpu);
        char *txt = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
        puts(txt);
        free(txt);
        json_decref(j);
    } else {
        printf("mode=%s phase=%s conns=%d size=%zu waiters=%lld "
               "ops=%lld ops_s=%.0f p50_us=%.1f p99_us=%.1f p999_us=%.1f "
               "max_us=%.1f errors=%lld acquired=%d leased_cpu_pct=%.0f "
               "redis_cpu_pct=%.0f\n",
               mode, phase, s->conns, s->size, waiting, s->ops, s->ops_s,
               s->p50, s->p99, s->p999, s->max, s->errors, acquired,
               s->leased_cpu, s->redis_cpu);
    }
    fflush(stdout);
}

/* cache.get p99 at CONNS connections alone, then while WAITERS sessions
 * wait on one lock that another session holds, then alone again (the
 * second "alone" shows how much the machine itself drifted). With
 * --churn, also while the waiters take and release that lock in turn. */
static void
run_isolation(void)
{
    struct result alone1 = run_one(M_GET, T_LEASED, o.conns, o.size);
    iso_print("isolation", "alone", &alone1, 0, 0);

    int ctl = unix_connect(o.sock);
    struct run w;
    memset(&w, 0, sizeof(w));
    w.mode = M_WAITERS;
    w.target = T_LEASED;
    w.conns = o.waiters;
    w.id = ++run_counter;
    int holder = unix_connect(o.sock);
    size_t len;
    char *req = xasprintf(&len, "{\"op\":\"lock\",\"key\":\"b%d.%d.c\"}\n",
                          (int)getpid(), w.id);
    char *line = blocking_call(holder, req, len);
    if (strstr(line, "\"acquired\":true") == NULL) {
        die("holder could not lock: %s", line);
    }
    free(line);
    free(req);
    long long saved_wait = o.wait_ms;
    o.wait_ms = -1;
    clients_open(&w);
    o.wait_ms = saved_wait;
    start(&w);
    wait_for_waiters(ctl);

    struct result queued = run_one(M_GET, T_LEASED, o.conns, o.size);
    long long still = stats_field(ctl, "lock_waiters");
    iso_print("isolation", "waiters", &queued, still, w.acquired);

    if (o.churn) {
        w.churn = true;
        req = xasprintf(&len, "{\"op\":\"unlock\",\"key\":\"b%d.%d.c\"}\n",
                        (int)getpid(), w.id);
        line = blocking_call(holder, req, len);
        free(line);
        free(req);
        struct result churn = run_one(M_GET, T_LEASED, o.conns, o.size);
        iso_print("isolation", "churn", &churn,
                  stats_field(ctl, "lock_waiters"), w.acquired);
        w.churn = false;
    }
    close(holder);
    clients_close(&w);
    close(ctl);

    struct result alone2 = run_one(M_GET, T_LEASED, o.conns, o.size);
    iso_print("isolation", "alone-after", &alone2, 0, 0);
    double ratio = alone1.p99 > 0 ? queued.p99 / alone1.p99 : 0;
    if (o.json) {
        printf("{\"mode\":\"isolation\",\"phase\":\"summary\","
               "\"p99_alone_us\":%.1f,\"p99_waiters_us\":%.1f,"
               "\"p99_alone_after_us\":%.1f,\"p99_ratio\":%.3f}\n",
               alone1.p99, queued.p99, alone2.p99, ratio);
    } else {
        printf("mode=isolation phase=summary p99_alone_us=%.1f "
               "p99_waiters_us=%.1f p99_alone_after_us=%.1f p99_ratio=%.3f\n",
               alone1.p99, queued.p99, alone2.p99, ratio);
    }
    fflush(stdout);
}

/* -------------------------------------------------------------- storm */

/* cache.get at CONNS connections alone, then while --waiters sessions
 * send cache.invalidate back to back (each waits for its answer, which
 * under journal.fsync always comes after the journal's fdatasync), then
 * alone again; also the invalidations per second of the storm. */
static void
run_storm(void)
{
    struct result alone1 = run_one(M_GET, T_LEASED, o.conns, o.size);
    iso_print("storm", "alone", &alone1, 0, 0);

    struct run w;
    memset(&w, 0, sizeof(w));
    w.mode = M_INVAL;
    w.target = T_LEASED;
    w.conns = o.waiters;
    w.id = ++run_counter;
    clients_open(&w);
    start(&w);
    uint64_t t0 = now_ns();
    long long n0 = w.invals;
    struct result during = run_one(M_GET, T_LEASED, o.conns, o.size);
    double secs = (double)(now_ns() - t0) / 1e9;
    double inval_s = secs > 0 ? (double)(w.invals - n0) / secs : 0;
    iso_print("storm", "invalidating", &during, o.waiters, 0);
    clients_close(&w);

    struct result alone2 = run_one(M_GET, T_LEASED, o.conns, o.size);
    iso_print("storm", "alone-after", &alone2, 0, 0);
    double ratio = alone1.p99 > 0 ? during.p99 / alone1.p99 : 0;
    if (o.json) {
        printf("{\"mode\":\"storm\",\"phase\":\"summary\","
               "\"p99_alone_us\":%.1f,\"p99_storm_us\":%.1f,"
               "\"p99_alone_after_us\":%.1f,\"p99_ratio\":%.3f,"
               "\"invalidations_s\":%.0f}\n",
               alone1.p99, during.p99, alone2.p99, ratio, inval_s);
    } else {
        printf("mode=storm phase=summary p99_alone_us=%.1f "
               "p99_storm_us=%.1f p99_alone_after_us=%.1f p99_ratio=%.3f "
               "invalidations_s=%.0f\n",
               alone1.p99, during.p99, alone2.p99, ratio, inval_s);
    }
    fflush(stdout);
}

/* ------------------------------------------------------------ renewal */

/* cache.get latency alone, then while the daemon keeps HOLDERS x LOCKS
 * watchdog locks renewed; both windows last --hold seconds, more than the
 * renewal period (a third of lock.watchdog_ms), so the second one spans a
 * renewal pass. */
static void
run_renewal(void)
{
    double saved = o.duration_s;
    o.duration_s = o.hold_s;
    int ctl = unix_connect(o.sock);
    struct result alone = run_one(M_GET, T_LEASED, o.conns, o.size);
    iso_print("renewal", "alone", &alone, 0, 0);

    struct run h;
    memset(&h, 0, sizeof(h));
    h.mode = M_HOLD;
    h.target = T_LEASED;
    h.conns = o.holders;
    h.id = ++run_counter;
    clients_open(&h);
    start(&h);
    event_base_dispatch(base);
    if (h.done_clients != h.conns) {
        die("only %d of %d sessions took their locks", h.done_clients,
            h.conns);
    }
    long long held = stats_field(ctl, "locks_held");
    long long ren0 = stats_field(ctl, "lock_renewals_ok");
    struct result busy = run_one(M_GET, T_LEASED, o.conns, o.size);
    long long ren1 = stats_field(ctl, "lock_renewals_ok");
    iso_print("renewal", "renewing", &busy, 0, 0);
    clients_close(&h);
    close(ctl);
    o.duration_s = saved;
    if (o.json) {
        printf("{\"mode\":\"renewal\",\"phase\":\"summary\","
               "\"locks\":%lld,\"renewals\":%lld,\"secs\":%.1f,"
               "\"p99_alone_us\":%.1f,\"p99_renewing_us\":%.1f,"
               "\"max_alone_us\":%.1f,\"max_renewing_us\":%.1f}\n",
               held, ren1 - ren0, busy.secs, alone.p99, busy.p99, alone.max,
               busy.max);
    } else {
        printf("mode=renewal phase=summary locks=%lld renewals=%lld "
               "secs=%.1f p99_alone_us=%.1f p99_renewing_us=%.1f "
               "max_alone_us=%.1f max_renewing_us=%.1f\n",
               held, ren1 - ren0, busy.secs, alone.p99, busy.p99, alone.max,
               busy.max);
    }
    fflush(stdout);
}

/* ------------------------------------------------------------ stampede */

#define STAMPEDE_LOAD_MS 100

/* One hot key, CONNS readers, an invalidation: how many readers were
 * blocked (waited for a fill) and how many loads ran (leases granted),
 * with a plain delete and with stale mode. The one reader that gets the
 * lease "loads" for STAMPEDE_LOAD_MS, then fills. */
static void
stampede_one(int ctl, bool stale)
{
    int n = o.conns;
    char key[96];
    snprintf(key, sizeof(key), "bench:stampede:%d:%d", (int)getpid(),
             ++run_counter);
    size_t len;
    char *req = xasprintf(&len,
                          "{\"op\":\"cache.set\",\"key\":\"%s\","
                          "\"value\":\"old\",\"ttl_ms\":%d}\n",
                          key, CACHE_TTL_MS);
    free(blocking_call(ctl, req, len));
    free(req);
    int *fds = xmalloc(sizeof(*fds) * (size_t)n);
    uint64_t *wait_us = xmalloc(sizeof(*wait_us) * (size_t)n);
    for (int i = 0; i < n; i++) {
        fds[i] = unix_connect(o.sock);
    }
    long long waits0 = stats_field(ctl, "cache_waits");
    long long leases0 = stats_field(ctl, "cache_leases_granted");
    req = xasprintf(&len,
                    "{\"op\":\"cache.invalidate\",\"key\":\"%s\","
                    "\"delay_ms\":0,\"stale\":%s}\n",
                    key, stale ? "true" : "false");
    free(blocking_call(ctl, req, len));
    free(req);
    req = xasprintf(&len,
                    "{\"op\":\"cache.get\",\"key\":\"%s\","
                    "\"wait_ms\":10000}\n",
                    key);
    uint64_t t0 = (now_ns() / 1000);
    for (int i = 0; i < n; i++) {
        write_all(fds[i], req, len);
    }
    free(req);
    /* Each reader's answer as it comes; the lease holder's load runs
     * meanwhile (its fill goes over CTL when the load time is up), so
     * that blocked readers are answered by that fill. */
    char lease[64] = "";
    uint64_t fill_at = 0;
    struct pollfd *p = xmalloc(sizeof(*p) * (size_t)n);
    for (int got = 0; got < n;) {
        int np = 0;
        for (int i = 0; i < n; i++) {
            if (fds[i] >= 0) {
                p[np].fd = fds[i];
                p[np].events = POLLIN;
                np++;
            }
        }
        int timeout = 15000;
        if (fill_at != 0) {
            uint64_t now = now_ns() / 1000;
            timeout = now >= fill_at ? 0 : (int)((fill_at - now) / 1000) + 1;
        }
        int k = poll(p, (nfds_t)np, timeout);
        if (k < 0 && errno == EINTR) {
            continue;
        }
        if (k <= 0) {
            if (fill_at == 0) {
                die("stampede: readers not answered");
            }
            char *fill = xasprintf(&len,
                                   "{\"op\":\"cache.fill\",\"key\":\"%s\","
                                   "\"lease\":\"%s\",\"value\":\"new\"}\n",
                                   key, lease);
            free(blocking_call(ctl, fill, len));
            free(fill);
            fill_at = 0;
            continue;
        }
        for (int q = 0; q < np; q++) {
            if (p[q].revents == 0) {
                continue;
            }
            int i = 0;
            while (fds[i] != p[q].fd) {
                i++;
            }
            char *line = blocking_call(fds[i], "", 0);
            wait_us[i] = now_ns() / 1000 - t0;
            char *l = strstr(line, "\"lease\":\"");
            if (l != NULL) {
                l += 9;
                *strchr(l, '"') = '\0';
                snprintf(lease, sizeof(lease), "%s", l);
                fill_at = now_ns() / 1000 + STAMPEDE_LOAD_MS * 1000;
            } else if (strstr(line, "\"hit\":true") == NULL) {
                die("stampede: a reader missed: %s", line);
            }
            free(line);
            close(fds[i]);
            fds[i] = -1;
            got++;
        }
    }
    free(p);
    if (fill_at != 0) {
        /* Everybody had the old value: the load still lands. */
        uint64_t now = now_ns() / 1000;
        if (fill_at > now) {
            struct timespec ts = {0, (long)(fill_at - now) * 1000};
            nanosleep(&ts, NULL);
        }
        char *fill = xasprintf(&len,
                               "{\"op\":\"cache.fill\",\"key\":\"%s\","
                               "\"lease\":\"%s\",\"value\":\"new\"}\n",
                               key, lease);
        free(blocking_call(ctl, fill, len));
        free(fill);
    }
    long long blocked = stats_field(ctl, "cache_waits") - waits0;
    long long loads = stats_field(ctl, "cache_leases_granted") - leases0;
    qsort(wait_us, (size_t)n, sizeof(*wait_us), cmp_u64);
    printf("mode=stampede invalidate=%s readers=%d blocked=%lld loads=%lld "
           "p50_answer_us=%llu max_answer_us=%llu load_ms=%d\n",
           stale ? "stale" : "delete", n, blocked, loads,
           (unsigned long long)wait_us[n / 2],
           (unsigned long long)wait_us[n - 1], STAMPEDE_LOAD_MS);
    fflush(stdout);
    free(fds);
    free(wait_us);
}

static void
run_stampede(void)
{
    int ctl = unix_connect(o.sock);
    stampede_one(ctl, false);
    stampede_one(ctl, true);
    close(ctl);
}

/* ---------------------------------------------------------------- zipf */

static void
run_zipf(void)
{
    if (o.json) {
        die("--json: --mode zipf writes key=value lines only");
    }
    struct zipf_opts *z = &o.zipf;
    z->base = base;
    z->sock = o.sock;
    z->redis_host = o.redis_host;
    z->redis_port = o.redis_port;
    z->want_leased = o.want[T_LEASED];
    z->want_direct = o.want[T_DIRECT];
    z->direct_first = o.direct_first;
    z->conns = o.conns;
    z->repeat = o.repeat;
    z->size = o.size;
    z->duration_s = o.duration_s;
    z->warmup_s = o.warmup_s;
    z->seed = o.seed;
    bench_zipf_run(z);
}

/* --------------------------------------------------------------- main */

static void
usage(FILE *f)
{
    fputs(
        "usage: leased-bench [options]\n"
        "  -m, --mode MODE      lock | lock-contended | get | mix | ping | "
        "hold |\n"
        "                       isolation | renewal | storm | stampede | "
        "sem |\n"
        "                       rwlock-read | rwlock-write | zipf | rate "
        "|\n"
        "                       mset | set-pipelined | bloom-get |\n"
        "                       miss-release | null-get | bloom-check |\n"
        "                       miss (leased only: cache.get of a new key, "
        "then\n"
        "                       cache.fill of its lease)\n"
        "                       (default lock)\n"
        "  -t, --target T       both | leased | direct | redisson |\n"
        "                       leased,redisson (default both: leased "
        "and\n"
        "                       direct); redisson (lock only): Redisson's "
        "RLock\n"
        "                       scripts by EVALSHA straight to Redis\n"
        "      --direct-first   run direct (or redisson) before leased in "
        "each pair\n"
        "      --redisson-dir D redisson: where lock_acquire.lua and\n"
        "                       lock_release.lua are (default the source\n"
        "                       tree's bench/redisson)\n"
        "      --cluster        --redis is a Redis Cluster node: each "
        "direct\n"
        "                       connection uses one master and keys of "
        "its slots\n"
        "  -s, --socket PATH    leased's Unix socket\n"
        "  -r, --redis H:P      Redis for the direct side (default "
        "127.0.0.1:6379)\n"
        "      --via PATH|H:P   the direct side's measured connections go "
        "through\n"
        "                       this proxy (a Unix socket path or "
        "host:port); loading\n"
        "                       scripts and filling values stay on "
        "--redis\n"
        "  -c, --conns N        concurrent connections (default 10)\n"
        "  -z, --size BYTES     value size for get and mix (default 100)\n"
        "  -d, --duration S     measured seconds (default 2)\n"
        "  -w, --warmup S       unmeasured seconds before (default 0.5)\n"
        "  -n, --repeat N       run each side N times, alternating (default "
        "1)\n"
        "      --ops N          stop after N measured ops instead of a "
        "duration\n"
        "      --wait-ms MS     lock-contended: wait_ms (default 10000)\n"
        "      --entries N      mset, set-pipelined: entries per op (one\n"
        "                       cache.mset, N cache.set or N SET PX "
        "pipelined;\n"
        "                       default 10); bloom-check: keys per "
        "request\n"
        "      --filter NAME    bloom-get, bloom-check: the filter, made "
        "and\n"
        "                       filled before (default bench.bf)\n"
        "      --mix-lock-pct P mix: percent of lock+unlock ops (default 10)\n"
        "      --pid PID        leased's pid (CPU and memory figures)\n"
        "      --redis-pid PID[,PID...]\n"
        "                       redis-server's pid (CPU figures; of "
        "several, the sum)\n"
        "      --locks N        hold, renewal: locks per connection (default "
        "1)\n"
        "      --hold S         hold: seconds to watch the held locks; "
        "renewal:\n"
        "                       length of each get window (default 30)\n"
        "      --holders N      renewal: sessions holding locks (default "
        "100)\n"
        "      --waiters N      isolation: waiters on the held key; storm:\n"
        "                       sessions invalidating (default 1000)\n"
        "      --churn          isolation: also measure while the waiters "
        "take turns\n"
        "      --seed N         mix, zipf: random seed\n"
        "      --keys N         zipf: keys (default 10000)\n"
        "      --zipf-s S       zipf: exponent (default 0.99)\n"
        "      --write-every N  zipf: one write per N reads (default 100)\n"
        "      --writer W       zipf: redis (DEL of the entry, default) |\n"
        "                       leased (cache.invalidate)\n"
        "      --prefix P       zipf: leased's cache.prefix (default\n"
        "                       leased:cache:)\n"
        "      --json           one JSON object per line instead of "
        "key=value\n"
        "  -h, --help\n",
        f);
}

static void
parse_hostport(const char *opt, const char *s, char *host, size_t cap,
               int *port)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || (size_t)(colon - s) >= cap) {
        die("bad --%s %s (want host:port)", opt, s);
    }
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port = atoi(colon + 1);
    if (*port <= 0 || *port > 65535) {
        die("bad --%s port in %s", opt, s);
    }
}

/* -t: one side, or a pair run alternately (leased is always one of a
 * pair). */
static void
parse_target(const char *s)
{
    static const struct {
        const char *name;
        bool leased, direct, redisson;
    } ts[] = {{"both", true, true, false},
              {"leased", true, false, false},
              {"direct", false, true, false},
              {"redisson", false, false, true},
              {"leased,redisson", true, false, true}};
    for (size_t i = 0; i < sizeof(ts) / sizeof(ts[0]); i++) {
        if (strcmp(s, ts[i].name) == 0) {
            o.want[T_LEASED] = ts[i].leased;
            o.want[T_DIRECT] = ts[i].direct;
            o.want[T_REDISSON] = ts[i].redisson;
            return;
        }
    }
    die("unknown target %s (both, leased, direct, redisson or "
        "leased,redisson)",
        s);
}

static void
parse_args(int argc, char **argv)
{
    enum {
        O_WAIT = 256,
        O_PID,
        O_RPID,
        O_LOCKS,
        O_HOLD,
        O_WAITERS,
        O_JSON,
        O_OPS,
        O_SEED,
        O_MIX,
        O_DFIRST,
        O_CHURN,
        O_HOLDERS,
        O_CLUSTER,
        O_KEYS,
        O_ZIPF_S,
        O_WRITE_EVERY,
        O_WRITER,
        O_PREFIX,
        O_VIA,
        O_ENTRIES,
        O_FILTER,
        O_RDIR
    };
    static const struct option lo[] = {
        {"mode", required_argument, NULL, 'm'},
        {"target", required_argument, NULL, 't'},
        {"socket", required_argument, NULL, 's'},
        {"redis", required_argument, NULL, 'r'},
        {"conns", required_argument, NULL, 'c'},
        {"size", required_argument, NULL, 'z'},
        {"duration", required_argument, NULL, 'd'},
        {"warmup", required_argument, NULL, 'w'},
        {"repeat", required_argument, NULL, 'n'},
        {"ops", required_argument, NULL, O_OPS},
        {"wait-ms", required_argument, NULL, O_WAIT},
        {"entries", required_argument, NULL, O_ENTRIES},
        {"filter", required_argument, NULL, O_FILTER},
        {"pid", required_argument, NULL, O_PID},
        {"redis-pid", required_argument, NULL, O_RPID},
        {"locks", required_argument, NULL, O_LOCKS},
        {"hold", required_argument, NULL, O_HOLD},
        {"waiters", required_argument, NULL, O_WAITERS},
        {"churn", no_argument, NULL, O_CHURN},
        {"holders", required_argument, NULL, O_HOLDERS},
        {"seed", required_argument, NULL, O_SEED},
        {"mix-lock-pct", required_argument, NULL, O_MIX},
        {"direct-first", no_argument, NULL, O_DFIRST},
        {"redisson-dir", required_argument, NULL, O_RDIR},
        {"cluster", no_argument, NULL, O_CLUSTER},
        {"via", required_argument, NULL, O_VIA},
        {"keys", required_argument, NULL, O_KEYS},
        {"zipf-s", required_argument, NULL, O_ZIPF_S},
        {"write-every", required_argument, NULL, O_WRITE_EVERY},
        {"writer", required_argument, NULL, O_WRITER},
        {"prefix", required_argument, NULL, O_PREFIX},
        {"json", no_argument, NULL, O_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    o.mode = M_LOCK;
    o.want[T_LEASED] = o.want[T_DIRECT] = true;
    o.redisson_dir = BENCH_REDISSON_DIR;
    o.sock = "/run/leased/leased.sock";
    strcpy(o.redis_host, "127.0.0.1");
    o.redis_port = 6379;
    o.conns = 10;
    o.size = 100;
    o.duration_s = 2;
    o.warmup_s = 0.5;
    o.repeat = 1;
    o.wait_ms = 10000;
    o.entries = 10;
    o.filter = "bench.bf";
    o.locks = 1;
    o.hold_s = 30;
    o.waiters = 1000;
    o.holders = 100;
    o.mix_lock_pct = 10;
    o.seed = 42;
    o.zipf.keys = 10000;
    o.zipf.s = 0.99;
    o.zipf.write_every = 100;
    o.zipf.prefix = "leased:cache:";
    int ch;
    while ((ch = getopt_long(argc, argv, "m:t:s:r:c:z:d:w:n:h", lo, NULL)) !=
           -1) {
        switch (ch) {
        case 'm': {
            size_t i;
            for (i = 0; i < M_WAITERS; i++) {
                if (strcmp(optarg, mode_names[i]) == 0) {
                    break;
                }
            }
            if (i == M_WAITERS) {
                die("unknown mode %s", optarg);
            }
            o.mode = (enum mode)i;
            break;
        }
        case 't':
            parse_target(optarg);
            break;
        case 's':
            o.sock = optarg;
            break;
        case 'r':
            parse_hostport("redis", optarg, o.redis_host, sizeof(o.redis_host),
                           &o.redis_port);
            break;
        case O_VIA:
            o.via = optarg;
            if (optarg[0] != '/') {
                parse_hostport("via", optarg, o.via_host, sizeof(o.via_host),
                               &o.via_port);
            }
            break;
        case 'c':
            o.conns = atoi(optarg);
            break;
        case 'z':
            o.size = (size_t)strtoull(optarg, NULL, 10);
            break;
        case 'd':
            o.duration_s = atof(optarg);
            break;
        case 'w':
            o.warmup_s = atof(optarg);
            break;
        case 'n':
            o.repeat = atoi(optarg);
            break;
        case O_OPS:
            o.ops_limit = atoll(optarg);
            break;
        case O_WAIT:
            o.wait_ms = atoll(optarg);
            break;
        case O_PID:
            o.leased_pid = (pid_t)atoi(optarg);
            break;
        case O_RPID:
            for (char *p = optarg; *p != '\0';) {
                if (o.n_redis_pids == 16) {
                    die("more than 16 pids in --redis-pid");
                }
                char *end;
                o.redis_pids[o.n_redis_pids++] = (pid_t)strtol(p, &end, 10);
                if (end == p || (*end != ',' && *end != '\0')) {
                    die("bad --redis-pid %s", optarg);
                }
                p = end + (*end == ',');
            }
            break;
        case O_LOCKS:
            o.locks = atoi(optarg);
            break;
        case O_HOLD:
            o.hold_s = atof(optarg);
            break;
        case O_WAITERS:
            o.waiters = atoi(optarg);
            break;
        case O_CHURN:
            o.churn = true;
            break;
        case O_HOLDERS:
            o.holders = atoi(optarg);
            break;
        case O_SEED:
            o.seed = strtoull(optarg, NULL, 10);
            break;
        case O_MIX:
            o.mix_lock_pct = atoi(optarg);
            break;
        case O_DFIRST:
            o.direct_first = true;
            break;
        case O_CLUSTER:
            o.cluster = true;
            break;
        case O_JSON:
            o.json = true;
            break;
        case O_KEYS:
            o.zipf.keys = atoi(optarg);
            break;
        case O_ZIPF_S:
            o.zipf.s = atof(optarg);
            break;
        case O_WRITE_EVERY:
            o.zipf.write_every = atoll(optarg);
            break;
        case O_WRITER:
            o.zipf.writer_leased = strcmp(optarg, "leased") == 0;
            if (!o.zipf.writer_leased && strcmp(optarg, "redis") != 0) {
                die("unknown writer %s", optarg);
            }
            break;
        case O_PREFIX:
            o.zipf.prefix = optarg;
            break;
        case O_ENTRIES:
            o.entries = atoi(optarg);
            break;
        case O_FILTER:
            o.filter = optarg;
            break;
        case O_RDIR:
            o.redisson_dir = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            exit(2);
        }
    }
    if (optind != argc) {
        usage(stderr);
        exit(2);
    }
    if (o.conns < 1 || o.repeat < 1 || o.repeat > 100 || o.locks < 1 ||
        o.waiters < 1 || o.holders < 1 || o.duration_s <= 0 || o.entries < 1 ||
        o.entries > 1000 || o.size > (64u << 20)) {
        die("bad numeric option (see --help)");
    }
    /* The modes whose direct keys are per connection (a shared key would
     * live on one master only). */
    if ((o.mode == M_MISS || o.mode == M_BLOOMGET || o.mode == M_MISSREL ||
         o.mode == M_NULLGET || o.mode == M_BLOOMCHECK) &&
        o.want[T_DIRECT]) {
        die("--mode %s: leased only (-t leased)", mode_names[o.mode]);
    }
    if (o.cluster && o.want[T_DIRECT] && o.mode != M_LOCK && o.mode != M_GET &&
        o.mode != M_MIX && o.mode != M_PING && o.mode != M_RWREAD &&
        o.mode != M_RWWRITE) {
        die("--cluster: direct side for lock, get, mix and ping only");
    }
    if (o.want[T_REDISSON] && o.mode != M_LOCK) {
        die("-t redisson: --mode lock only (Redisson's RLock scripts)");
    }
    if (o.want[T_REDISSON] && (o.cluster || o.via != NULL)) {
        die("-t redisson: not with --cluster or --via (one Redis, "
            "straight)");
    }
    if (o.via != NULL &&
        (o.cluster || o.want[T_LEASED] ||
         (o.mode != M_LOCK && o.mode != M_GET && o.mode != M_PING))) {
        die("--via: -t direct with lock, get or ping, without --cluster");
    }
}

/* Each leased session and each Redis connection is a descriptor, and the
 * resource runs open 10,000 of them. */
static void
raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

int
main(int argc, char **argv)
{
    parse_args(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    value_buf = xmalloc(o.size + 1);
    memset(value_buf, 'x', o.size);
    value_buf[o.size] = '\0';
    /* hiredis's libevent adapter re-adds its one-shot read event after
     * every reply; with the change list, that delete and add within one
     * loop iteration cost no epoll_ctl. */
    struct event_config *ecfg = event_config_new();
    event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    base = event_base_new_with_config(ecfg);
    event_config_free(ecfg);
    if (base == NULL) {
        die("event_base_new failed");
    }
    if (o.want[T_DIRECT] && o.mode != M_HOLD && o.mode != M_ISOLATION &&
        o.mode != M_RENEWAL && o.mode != M_STORM && o.mode != M_STAMPEDE &&
        o.mode != M_ZIPF) {
        load_scripts();
    }
    if (o.want[T_REDISSON]) {
        load_redisson();
    }
    switch (o.mode) {
    case M_HOLD:
        run_hold();
        break;
    case M_ISOLATION:
        run_isolation();
        break;
    case M_RENEWAL:
        run_renewal();
        break;
    case M_STORM:
        run_storm();
        break;
    case M_STAMPEDE:
        run_stampede();
        break;
    case M_ZIPF:
        run_zipf();
        break;
    default:
        run_pairs();
        break;
    }
    event_base_free(base);
    free(value_buf);
    return 0;
}
