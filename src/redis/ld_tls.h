#ifndef LD_TLS_H
#define LD_TLS_H

#include "ld_common.h"

struct ld_config;
struct ld_ctx;
struct ssl_st;
struct ssl_ctx_st;

/* TLS to Redis and the Sentinels (redis.tls.*). One client context,
 * built at start from the configured files, serves every connection;
 * ld_conn asks for one SSL object per connection attempt. The files are
 * read once, at start (and by -t), before anything else can change who
 * the daemon runs as; their paths may be logged, their contents never.
 *
 * A certificate that does not verify is a failed connection attempt
 * like any other: ld_conn backs off and retries, and ops answer
 * redis_unavailable meanwhile. There is no fallback to plain text. */

/* A client context for CFG, or NULL with the reason in ERR. Used by -t
 * to check the files, and by ld_tls_init. */
struct ssl_ctx_st *ld_tls_ctx_new(const struct ld_config *cfg, char *err,
                                  size_t errlen);
void ld_tls_ctx_free(struct ssl_ctx_st *sctx);

/* With redis.tls.enabled, build the daemon's context (logging a warning
 * when verification is off); without it, nothing. */
int ld_tls_init(const struct ld_ctx *ctx);
void ld_tls_free(void);

/* True once ld_tls_init built a context: TCP connections are TLS. */
bool ld_tls_enabled(void);

/* A new SSL object for a connection to HOST (an address's host part):
 * SNI and the name checked are redis.tls.server_name, else HOST (an IP
 * address is checked as such and sent no SNI). NULL with ERR filled when
 * OpenSSL refuses. */
struct ssl_st *ld_tls_new_ssl(const char *host, char *err, size_t errlen);

/* Why a TLS connection failed, for logs and callers: the certificate
 * check's verdict when it failed, else OpenSSL's error queue (drained),
 * else FALLBACK. */
void ld_tls_failure(struct ssl_st *ssl, unsigned long first_err,
                    const char *fallback, char *buf, size_t len);

/* Whether ERR (an OpenSSL error code) only says the peer closed the TCP
 * connection without a TLS close_notify: what a killed or restarted
 * Redis does, not a TLS problem. When it does, OpenSSL's error queue is
 * cleared, as ld_tls_failure would. */
bool ld_tls_peer_closed(unsigned long err);

#endif
