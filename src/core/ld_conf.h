#ifndef LD_CONF_H
#define LD_CONF_H

#include "ld_common.h"
#include "ld_log.h"
#include "ld_ns_list.h"

#include <sys/types.h>

/* The smallest shared near cache segment (cache.near.shared_bytes). */
#define LD_NEAR_SHARED_MIN_BYTES 65536

/* The typed configuration. Every YAML key of conf/leased.yml has a field
 * here named after it; numbers carry their unit in the name. Strings are
 * heap-allocated and owned by the struct (never NULL after defaults). */

enum ld_redis_mode {
    LD_REDIS_STANDALONE,
    LD_REDIS_SENTINEL,
    LD_REDIS_CLUSTER
};
enum ld_lock_layout { LD_LAYOUT_LEASED, LD_LAYOUT_REDISSON };
enum ld_fsync_mode { LD_FSYNC_ALWAYS, LD_FSYNC_EVERYSEC };
enum ld_log_target { LD_LOG_TARGET_STDERR, LD_LOG_TARGET_SYSLOG };
enum ld_invalidate_mode { LD_INVALIDATE_DELETE, LD_INVALIDATE_STALE };

struct ld_strlist {
    char **items;
    size_t count;
};

struct ld_config {
    struct {
        char *unix_path;  /* listen.unix; "" disables */
        mode_t unix_mode; /* listen.unix_mode, octal string in YAML */
        char *unix_group; /* listen.unix_group; "" = the daemon's */
        char *tcp;        /* listen.tcp "host:port"; "" disables */
        char *auth_token; /* listen.auth_token */
        /* listen.admin_token: operator ops on TCP */
        char *admin_token;
        struct ld_ns_list namespaces; /* listen.namespaces */
    } listen;
    struct {
        enum ld_redis_mode mode;
        char *address; /* host:port or an absolute unix socket path */
        struct ld_strlist addresses;
        char *master_name;
        char *sentinel_username; /* AUTH to the Sentinels */
        char *sentinel_password;
        char *username;
        char *password;
        int db;          /* 0..1000000; 0 in cluster mode */
        int connections; /* 1..64 */
        int timeout_ms;  /* 1..600000 */
        int batch_max;   /* 0..1024; 0 and 1: scripts go one by one */
        struct {
            bool enabled;
            char *ca_file;     /* "" = the system's CA store */
            char *cert_file;   /* client certificate (mutual TLS) */
            char *key_file;    /* its private key */
            char *server_name; /* SNI and the name checked; "" = the host */
            bool verify;
        } tls;
    } redis;
    struct {
        char *prefix;
        long long watchdog_ms;   /* 100..86400000 */
        long long max_hold_ms;   /* 0 = unlimited */
        int wait_replicas;       /* 0..16 */
        bool require_noeviction; /* refuse locks on an evicting Redis */
        enum ld_lock_layout layout;
        int sem_layout; /* 1: every grant's permits in the hash; 2: but one */
        struct ld_strlist redlock;
    } lock;
    struct {
        char *prefix;
        long long ttl_ms;
        long long null_ttl_ms;
        double ttl_jitter; /* 0..0.5 */
        long long fill_lease_ms;
        long long wait_ms;
        long long double_delete_ms;
        enum ld_invalidate_mode invalidate_mode;
        long long stale_ms;
        bool early_refresh;
        double early_refresh_beta;
        long long hot_keys; /* top-K size; 0 = off */
        int layout; /* 1: every entry a hash; 2: a value or null alone a string */
        struct {
            bool enabled;
            long long max_bytes;
            long long max_value_bytes;
            long long min_hits;
            long long min_hits_window_ms;
            long long shared_bytes;    /* each segment; 0 = none */
            long long shared_stale_ms; /* readers' heartbeat bound */
        } near;
    } cache;
    struct {
        char *path;
        enum ld_fsync_mode fsync;
    } journal;
    struct {
        long long max_clients;
        long long max_request_bytes;
        long long max_key_bytes;
        long long max_waiters;
        long long max_pending;      /* per session, requests awaiting reply */
        long long max_output_bytes; /* per session, unsent replies */
        long long max_memory_bytes; /* daemon-wide accounting, 0: none */
    } limits;
    struct {
        long long drain_ms; /* SIGTERM: serve open sessions this long */
    } shutdown;
    struct {
        char *listen;       /* "host:port"; "" disables */
        bool hot_key_names; /* hot cache keys named in /metrics */
    } metrics;
    struct {
        enum ld_log_level level;
        enum ld_log_target target;
    } log;
};

/* Fill in the built-in defaults of product.md. Socket and journal paths
 * follow $RUNTIME_DIRECTORY / $STATE_DIRECTORY when systemd sets them. */
void ld_conf_defaults(struct ld_config *cfg);

/* Parse PATH over the values already in CFG. A missing file is not an
 * error when MISSING_OK. On error returns LD_ERR and writes
 * "file:line:col: key: message" into ERR. CFG may be partially updated on
 * error: load into a scratch copy when that matters (reload does). */
int ld_conf_load(struct ld_config *cfg, const char *path, bool missing_ok,
                 char *err, size_t errlen);

/* Same, from a string; NAME is used as the file name in messages. */
int ld_conf_load_string(struct ld_config *cfg, const char *yaml, size_t len,
                        const char *name, char *err, size_t errlen);

void ld_conf_free(struct ld_config *cfg);

/* A group name or a numeric gid (listen.unix_group) to its gid. */
bool ld_conf_parse_group(const char *name, gid_t *gid);

/* Make the relative file paths of CFG (listen.unix, journal.path, the
 * redis.tls files) absolute under BASE, the directory the daemon started in, so they keep
 * naming the same files after it detaches to "/". */
void ld_conf_absolute_paths(struct ld_config *cfg, const char *base);

/* Copy the reloadable settings of NEWCFG into LIVE and log, one line each,
 * the settings that differ but need a restart. A changed log.level is also
 * applied to ld_log_level. */
void ld_conf_apply_reload(struct ld_config *live,
                          const struct ld_config *newcfg);

/* Visit every known key (dotted name, "reloadable" flag), for the docs
 * check in the test suite. */
typedef void ld_conf_key_fn(const char *dotted, bool reloadable, void *arg);
void ld_conf_each_key(ld_conf_key_fn *fn, void *arg);

/* False for an unknown key and for a setting of a feature this version
 * does not have (only its default is accepted), for the docs check. */
bool ld_conf_key_available(const char *dotted);

#endif
