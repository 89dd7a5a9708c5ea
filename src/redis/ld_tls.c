/* TLS toward Redis: the SSL_CTX made from redis.tls.* (also for leased -t), a
 * new SSL per connection with its server name and verification, the
 * certificate's expiry in /metrics, and OpenSSL's errors in words. It owns
 * the SSL_CTX; the connections and their handshakes are ld_conn.c's. */
#include "ld_tls.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_stats.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

static struct {
    const struct ld_ctx *ctx;
    SSL_CTX *sctx;
} tls_mod;

/* OpenSSL's reason for the latest failure, or WHAT alone. */
static void
ssl_err(char *err, size_t errlen, const char *what, const char *path)
{
    unsigned long e = ERR_get_error();
    char reason[256] = "";
    if (e != 0) {
        ERR_error_string_n(e, reason, sizeof(reason));
    }
    ERR_clear_error();
    snprintf(err, errlen, "%s%s%s%s%s", what, path != NULL ? " " : "",
             path != NULL ? path : "", reason[0] != '\0' ? ": " : "", reason);
}

/* The CAs that vouch for Redis: redis.tls.ca_file, or the system's. */
static int
load_ca(SSL_CTX *sctx, const struct ld_config *cfg, char *err, size_t errlen)
{
    if (cfg->redis.tls.ca_file[0] != '\0') {
        if (SSL_CTX_load_verify_locations(sctx, cfg->redis.tls.ca_file,
                                          NULL) != 1) {
            ssl_err(err, errlen, "redis.tls.ca_file: cannot load",
                    cfg->redis.tls.ca_file);
            return LD_ERR;
        }
    } else if (SSL_CTX_set_default_verify_paths(sctx) != 1) {
        ssl_err(err, errlen, "the system's CA store cannot be loaded", NULL);
        return LD_ERR;
    }
    return LD_OK;
}

/* The daemon's own certificate and key, for mutual TLS. */
static int
load_client_cert(SSL_CTX *sctx, const char *cert, const char *key, char *err,
                 size_t errlen)
{
    if (SSL_CTX_use_certificate_chain_file(sctx, cert) != 1) {
        ssl_err(err, errlen, "redis.tls.cert_file: cannot load", cert);
        return LD_ERR;
    }
    if (SSL_CTX_use_PrivateKey_file(sctx, key, SSL_FILETYPE_PEM) != 1) {
        ssl_err(err, errlen, "redis.tls.key_file: cannot load", key);
        return LD_ERR;
    }
    if (SSL_CTX_check_private_key(sctx) != 1) {
        ssl_err(err, errlen,
                "redis.tls.key_file does not match redis.tls.cert_file", NULL);
        return LD_ERR;
    }
    return LD_OK;
}

SSL_CTX *
ld_tls_ctx_new(const struct ld_config *cfg, char *err, size_t errlen)
{
    const char *cert = cfg->redis.tls.cert_file;
    const char *key = cfg->redis.tls.key_file;
    if ((cert[0] == '\0') != (key[0] == '\0')) {
        snprintf(err, errlen,
                 "redis.tls.cert_file and redis.tls.key_file go together: "
                 "set both for mutual TLS, or neither");
        return NULL;
    }
    SSL_CTX *sctx = SSL_CTX_new(TLS_client_method());
    if (sctx == NULL) {
        ssl_err(err, errlen, "TLS context could not be made", NULL);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(sctx, TLS1_2_VERSION);
    if (load_ca(sctx, cfg, err, errlen) != LD_OK ||
        (cert[0] != '\0' &&
         load_client_cert(sctx, cert, key, err, errlen) != LD_OK)) {
        goto fail;
    }
    SSL_CTX_set_verify(sctx,
                       cfg->redis.tls.verify ? SSL_VERIFY_PEER
                                             : SSL_VERIFY_NONE,
                       NULL);
    return sctx;
fail:
    SSL_CTX_free(sctx);
    return NULL;
}

void
ld_tls_ctx_free(SSL_CTX *sctx)
{
    SSL_CTX_free(sctx);
}

/* The client certificate's notAfter, as seconds since the epoch, for an
 * alert well before mutual TLS starts failing. */
static char *
cert_prometheus(size_t *len)
{
    X509 *x = tls_mod.sctx != NULL ? SSL_CTX_get0_certificate(tls_mod.sctx)
                                   : NULL;
    int days, secs;
    char *out;

    if (x == NULL ||
        ASN1_TIME_diff(&days, &secs, NULL, X509_get0_notAfter(x)) != 1) {
        return NULL;
    }
    long long not_after = (long long)time(NULL) + (long long)days * 86400 +
                          secs;
    if (asprintf(&out,
                 "# HELP leased_redis_tls_cert_not_after_seconds When "
                 "redis.tls.cert_file expires, in seconds since the epoch\n"
                 "# TYPE leased_redis_tls_cert_not_after_seconds gauge\n"
                 "leased_redis_tls_cert_not_after_seconds %lld\n",
                 not_after) < 0) {
        return NULL;
    }
    *len = strlen(out);
    return out;
}

int
ld_tls_init(const struct ld_ctx *ctx)
{
    const struct ld_config *cfg = ctx->cfg;
    tls_mod.ctx = ctx;
    tls_mod.sctx = NULL;
    if (!cfg->redis.tls.enabled) {
        return LD_OK;
    }
    char err[512];
    tls_mod.sctx = ld_tls_ctx_new(cfg, err, sizeof(err));
    if (tls_mod.sctx == NULL) {
        log_error("tls: %s", err);
        return LD_ERR;
    }
    ld_stats_add_prometheus(cert_prometheus);
    log_info("tls on ca_file=%s cert_file=%s server_name=%s",
             cfg->redis.tls.ca_file[0] != '\0' ? cfg->redis.tls.ca_file
                                               : "(system store)",
             cfg->redis.tls.cert_file[0] != '\0' ? cfg->redis.tls.cert_file
                                                 : "(none)",
             cfg->redis.tls.server_name[0] != '\0' ? cfg->redis.tls.server_name
                                                   : "(host of the address)");
    if (!cfg->redis.tls.verify) {
        /* Said at every start, as loudly as the log can: anyone on the
         * path can read and change the traffic, passwords included. */
        log_warn("tls: redis.tls.verify is false: the certificate of Redis "
                 "is NOT checked; anyone between the daemon and Redis can "
                 "read and change its traffic, the password included. Use "
                 "it only for a test");
    }
    return LD_OK;
}

void
ld_tls_free(void)
{
    SSL_CTX_free(tls_mod.sctx);
    tls_mod.sctx = NULL;
}

bool
ld_tls_enabled(void)
{
    return tls_mod.sctx != NULL;
}

static bool
is_ip_address(const char *s)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

SSL *
ld_tls_new_ssl(const char *host, char *err, size_t errlen)
{
    const struct ld_config *cfg = tls_mod.ctx->cfg;
    SSL *ssl = SSL_new(tls_mod.sctx);
    if (ssl == NULL) {
        ssl_err(err, errlen, "TLS session could not be made", NULL);
        return NULL;
    }
    const char *name = cfg->redis.tls.server_name[0] != '\0'
                           ? cfg->redis.tls.server_name
                           : host;
    bool ok = true;
    /* SNI carries host names only, never address literals (RFC 6066). */
    if (is_ip_address(name)) {
        if (cfg->redis.tls.verify) {
            ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name) == 1;
        }
    } else {
        ok = SSL_set_tlsext_host_name(ssl, name) == 1;
        if (ok && cfg->redis.tls.verify) {
            ok = SSL_set1_host(ssl, name) == 1;
        }
    }
    if (!ok) {
        ssl_err(err, errlen, "TLS name could not be set:", name);
        SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

void
ld_tls_failure(SSL *ssl, unsigned long first_err, const char *fallback,
               char *buf, size_t len)
{
    long vr = ssl != NULL ? SSL_get_verify_result(ssl) : X509_V_OK;
    unsigned long e = first_err != 0 ? first_err : ERR_peek_error();
    if (vr != X509_V_OK) {
        snprintf(buf, len, "TLS: certificate verify failed: %s",
                 X509_verify_cert_error_string(vr));
    } else if (e != 0) {
        char reason[256];
        ERR_error_string_n(e, reason, sizeof(reason));
        snprintf(buf, len, "TLS: %s", reason);
    } else {
        snprintf(buf, len, "%s", fallback);
    }
    /* What is left belongs to this failure: the next one starts clean. */
    ERR_clear_error();
}

bool
ld_tls_peer_closed(unsigned long err)
{
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
    if (ERR_GET_LIB(err) == ERR_LIB_SSL &&
        ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        return true;
    }
    return false;
#else
    /* OpenSSL 1.1 reports such an end as a plain EOF already. */
    LD_UNUSED(err);
    return false;
#endif
}
