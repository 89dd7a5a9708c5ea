#ifndef BENCH_ZIPF_H
#define BENCH_ZIPF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event_base;

/* leased-bench --mode zipf: cache-aside reads of KEYS keys drawn from
 * Zipf(S), a write every WRITE_EVERY reads, against leased (near cache
 * on) and against direct Redis GET/SET. */
struct zipf_opts {
    struct event_base *base;
    const char *sock;
    const char *redis_host;
    int redis_port;
    bool want_leased, want_direct, direct_first;
    int conns, repeat;
    size_t size;
    double duration_s, warmup_s;
    int keys;
    double s;
    long long write_every;
    bool writer_leased; /* cache.invalidate through leased, not DEL */
    const char *prefix; /* leased's cache.prefix */
    uint64_t seed;
    pid_t leased_pid;
};

void bench_zipf_run(const struct zipf_opts *zo);

#endif
