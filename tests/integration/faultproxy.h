#ifndef LD_FAULTPROXY_H
#define LD_FAULTPROXY_H

/* A fault-injecting TCP proxy for tests: it listens on a free loopback
 * port and forwards every connection to 127.0.0.1:UPSTREAM, so a daemon
 * configured with the proxy's port as its Redis address sees whatever
 * network the test orders. It runs in a thread of the test process (one
 * poll loop); every setter is safe to call from the test while traffic
 * flows, and takes effect before the proxy moves another byte.
 *
 * Bytes are never reordered or altered: a fault either delays them, holds
 * them, or loses them, and a connection that lost bytes is reset when the
 * lossy mode ends (TCP never delivers a stream with a hole in it, so
 * neither does the proxy). */

#include <stdbool.h>
#include <stddef.h>

enum fp_mode {
    FP_PASS,      /* forward both ways */
    FP_STALL,     /* nothing moves; held bytes flow again, in order, after */
    FP_BLACKHOLE, /* every byte either way is lost; new connections too */
    FP_DROP_UP,   /* requests (towards Redis) are lost, replies flow */
    FP_DROP_DOWN, /* replies (towards the client) are lost, requests flow */
    FP_REFUSE,    /* new connections are reset at once; live ones flow */
};

struct fp;

/* Start a proxy to 127.0.0.1:UPSTREAM_PORT in a thread; NULL on error. */
struct fp *fp_start(int upstream_port);
/* The same on LISTEN_IP:LISTEN_PORT (0: a free port) to
 * UPSTREAM_IP:UPSTREAM_PORT, for a proxy that stands in for a server
 * elsewhere at its own address (tests/jepsen). The upstream is connected
 * to in the proxy's thread: it must answer at once, as a local one or one
 * over a link that is up does. */
struct fp *fp_start_at(const char *listen_ip, int listen_port,
                       const char *upstream_ip, int upstream_port);
/* Stop the thread, close every connection, free. */
void fp_stop(struct fp *p);
int fp_port(const struct fp *p);

void fp_set_mode(struct fp *p, enum fp_mode mode);
/* Every chunk either way waits LATENCY_MS before it is passed on (0: off). */
void fp_set_latency(struct fp *p, int latency_ms);
/* Replies trickle: at most BYTES every 10 ms per connection (0: off). */
void fp_set_trickle(struct fp *p, int bytes);
/* One cut: the first connection to pass BYTES more reply bytes (counted
 * per connection from now) delivers exactly that many and is then reset
 * on both sides, e.g. in the middle of a pipelined reply. */
void fp_cut_replies_after(struct fp *p, long bytes);
/* With ONLY set, modes, latency and trickle apply only to connections
 * that sent a SUBSCRIBE (SUBSCRIBE, PSUBSCRIBE, SSUBSCRIBE); the others
 * pass. */
void fp_only_subscribers(struct fp *p, bool only);
/* The other way round: with ONLY set, they apply only to connections that
 * sent no SUBSCRIBE (a published message overtakes the answer to the
 * command that published it). */
void fp_only_commands(struct fp *p, bool only);
/* Reset every live connection now (both sides, RST). */
void fp_reset_all(struct fp *p);

/* Counters since the start. */
long fp_accepted(struct fp *p);
long fp_resets(struct fp *p);
long fp_live(struct fp *p);
/* Reply bytes delivered to clients. */
long fp_bytes_down(struct fp *p);
/* Request bytes read from clients (forwarded or not). */
long fp_bytes_up(struct fp *p);
/* Wait up to TIMEOUT_MS until fp_accepted reaches N. */
bool fp_wait_accepted(struct fp *p, long n, int timeout_ms);

#endif
