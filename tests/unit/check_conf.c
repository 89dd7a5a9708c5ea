/* ld_conf: defaults, the shipped file, every error with its position,
 * reload and the settings this version refuses. Pure parsing from
 * strings, plus a few real files. */
#include "ld_common.h"

#include "ld_conf.h"
#include "ld_log.h"

#include "unit.h"

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char err[512];

/* Parse YAML over the defaults; the caller frees CFG. */
static int
load(struct ld_config *cfg, const char *yaml)
{
    ld_conf_defaults(cfg);
    return ld_conf_load_string(cfg, yaml, strlen(yaml), "t.yml", err,
                               sizeof(err));
}

/* Expect YAML to be rejected with exactly MESSAGE. */
static void
expect_error(const char *yaml, const char *message)
{
    struct ld_config cfg;
    int rc = load(&cfg, yaml);
    ld_conf_free(&cfg);
    ck_assert_msg(rc == LD_ERR, "accepted: %s", yaml);
    ck_assert_str_eq(err, message);
}

static void
expect_ok(const char *yaml)
{
    struct ld_config cfg;
    int rc = load(&cfg, yaml);
    ld_conf_free(&cfg);
    ck_assert_msg(rc == LD_OK, "rejected: %s", err);
}

/* Every field except the two paths that follow the environment. */
static void
assert_same_settings(const struct ld_config *a, const struct ld_config *b)
{
    ck_assert_uint_eq(a->listen.unix_mode, b->listen.unix_mode);
    ck_assert_str_eq(a->listen.unix_group, b->listen.unix_group);
    ck_assert_str_eq(a->listen.tcp, b->listen.tcp);
    ck_assert_str_eq(a->listen.auth_token, b->listen.auth_token);
    ck_assert_int_eq(a->redis.mode, b->redis.mode);
    ck_assert_str_eq(a->redis.address, b->redis.address);
    ck_assert_uint_eq(a->redis.addresses.count, b->redis.addresses.count);
    for (size_t i = 0; i < a->redis.addresses.count; i++) {
        ck_assert_str_eq(a->redis.addresses.items[i],
                         b->redis.addresses.items[i]);
    }
    ck_assert_str_eq(a->redis.master_name, b->redis.master_name);
    ck_assert_str_eq(a->redis.username, b->redis.username);
    ck_assert_str_eq(a->redis.password, b->redis.password);
    ck_assert_int_eq(a->redis.db, b->redis.db);
    ck_assert_int_eq(a->redis.connections, b->redis.connections);
    ck_assert_int_eq(a->redis.timeout_ms, b->redis.timeout_ms);
    ck_assert_str_eq(a->lock.prefix, b->lock.prefix);
    ck_assert_int_eq(a->lock.watchdog_ms, b->lock.watchdog_ms);
    ck_assert_int_eq(a->lock.max_hold_ms, b->lock.max_hold_ms);
    ck_assert_int_eq(a->lock.wait_replicas, b->lock.wait_replicas);
    ck_assert_int_eq(a->lock.require_noeviction, b->lock.require_noeviction);
    ck_assert_int_eq(a->lock.layout, b->lock.layout);
    ck_assert_uint_eq(a->lock.redlock.count, b->lock.redlock.count);
    for (size_t i = 0; i < a->lock.redlock.count; i++) {
        ck_assert_str_eq(a->lock.redlock.items[i], b->lock.redlock.items[i]);
    }
    ck_assert_str_eq(a->cache.prefix, b->cache.prefix);
    ck_assert_int_eq(a->cache.ttl_ms, b->cache.ttl_ms);
    ck_assert_int_eq(a->cache.null_ttl_ms, b->cache.null_ttl_ms);
    ck_assert_double_eq(a->cache.ttl_jitter, b->cache.ttl_jitter);
    ck_assert_int_eq(a->cache.fill_lease_ms, b->cache.fill_lease_ms);
    ck_assert_int_eq(a->cache.wait_ms, b->cache.wait_ms);
    ck_assert_int_eq(a->cache.double_delete_ms, b->cache.double_delete_ms);
    ck_assert_int_eq(a->cache.near.enabled, b->cache.near.enabled);
    ck_assert_int_eq(a->cache.near.max_bytes, b->cache.near.max_bytes);
    ck_assert_int_eq(a->cache.near.max_value_bytes,
                     b->cache.near.max_value_bytes);
    ck_assert_int_eq(a->cache.near.min_hits, b->cache.near.min_hits);
    ck_assert_int_eq(a->cache.near.min_hits_window_ms,
                     b->cache.near.min_hits_window_ms);
    ck_assert_int_eq(a->cache.near.shared_bytes, b->cache.near.shared_bytes);
    ck_assert_int_eq(a->cache.near.shared_stale_ms,
                     b->cache.near.shared_stale_ms);
    ck_assert_int_eq(a->journal.fsync, b->journal.fsync);
    ck_assert_int_eq(a->limits.max_clients, b->limits.max_clients);
    ck_assert_int_eq(a->limits.max_request_bytes, b->limits.max_request_bytes);
    ck_assert_int_eq(a->limits.max_key_bytes, b->limits.max_key_bytes);
    ck_assert_int_eq(a->limits.max_waiters, b->limits.max_waiters);
    ck_assert_int_eq(a->limits.max_pending, b->limits.max_pending);
    ck_assert_int_eq(a->limits.max_output_bytes, b->limits.max_output_bytes);
    ck_assert_int_eq(a->shutdown.drain_ms, b->shutdown.drain_ms);
    ck_assert_str_eq(a->metrics.listen, b->metrics.listen);
    ck_assert_int_eq(a->log.level, b->log.level);
    ck_assert_int_eq(a->log.target, b->log.target);
}

/* A value of every kind, different from its default, for the tests that
 * must see a file actually overwrite something. */
static const char full_yaml[] = "listen:\n"
                                "  unix: /tmp/l.sock\n"
                                "  unix_mode: \"0600\"\n"
                                "  unix_group: \"0\"\n"
                                "  tcp: 10.0.0.1:7000\n"
                                "  auth_token: s3cret\n"
                                "redis:\n"
                                "  address: /run/redis/redis.sock\n"
                                "  username: app\n"
                                "  password: pw\n"
                                "  db: 3\n"
                                "  connections: 8\n"
                                "  timeout_ms: 250\n"
                                "lock:\n"
                                "  prefix: \"l:\"\n"
                                "  watchdog_ms: 9000\n"
                                "  max_hold_ms: 60000\n"
                                "  wait_replicas: 1\n"
                                "  require_noeviction: true\n"
                                "  layout: redisson\n"
                                "cache:\n"
                                "  prefix: \"c:\"\n"
                                "  ttl_ms: 1000\n"
                                "  null_ttl_ms: 500\n"
                                "  ttl_jitter: 0.25\n"
                                "  fill_lease_ms: 700\n"
                                "  wait_ms: 0\n"
                                "  double_delete_ms: 0\n"
                                "journal:\n"
                                "  path: /tmp/j.journal\n"
                                "  fsync: everysec\n"
                                "limits:\n"
                                "  max_clients: 5\n"
                                "  max_request_bytes: 4096\n"
                                "  max_key_bytes: 64\n"
                                "  max_waiters: 10\n"
                                "  max_pending: 7\n"
                                "  max_output_bytes: 1000000\n"
                                "shutdown:\n"
                                "  drain_ms: 15000\n"
                                "metrics:\n"
                                "  listen: \"\"\n"
                                "log:\n"
                                "  level: debug\n"
                                "  target: syslog\n";

START_TEST(defaults_match_product)
{
    struct ld_config c;

    unsetenv("RUNTIME_DIRECTORY");
    unsetenv("STATE_DIRECTORY");
    ld_conf_defaults(&c);
    ck_assert_str_eq(c.listen.unix_path, "/run/leased/leased.sock");
    ck_assert_uint_eq(c.listen.unix_mode, 0660);
    ck_assert_str_eq(c.listen.unix_group, "");
    ck_assert_str_eq(c.listen.tcp, "");
    ck_assert_str_eq(c.listen.auth_token, "");
    ck_assert_int_eq(c.redis.mode, LD_REDIS_STANDALONE);
    ck_assert_str_eq(c.redis.address, "127.0.0.1:6379");
    ck_assert_uint_eq(c.redis.addresses.count, 0);
    ck_assert_str_eq(c.redis.master_name, "mymaster");
    ck_assert_str_eq(c.redis.username, "");
    ck_assert_str_eq(c.redis.password, "");
    ck_assert_int_eq(c.redis.db, 0);
    ck_assert_int_eq(c.redis.connections, 2);
    ck_assert_int_eq(c.redis.timeout_ms, 1000);
    ck_assert_str_eq(c.lock.prefix, "leased:lock:");
    ck_assert_int_eq(c.lock.watchdog_ms, 30000);
    ck_assert_int_eq(c.lock.max_hold_ms, 0);
    ck_assert_int_eq(c.lock.wait_replicas, 0);
    ck_assert(!c.lock.require_noeviction);
    ck_assert_int_eq(c.lock.layout, LD_LAYOUT_LEASED);
    ck_assert_uint_eq(c.lock.redlock.count, 0);
    ck_assert_str_eq(c.cache.prefix, "leased:cache:");
    ck_assert_int_eq(c.cache.ttl_ms, 600000);
    ck_assert_int_eq(c.cache.null_ttl_ms, 60000);
    ck_assert_double_eq(c.cache.ttl_jitter, 0.1);
    ck_assert_int_eq(c.cache.fill_lease_ms, 5000);
    ck_assert_int_eq(c.cache.wait_ms, 3000);
    ck_assert_int_eq(c.cache.double_delete_ms, 1000);
    ck_assert(!c.cache.near.enabled);
    ck_assert_int_eq(c.cache.near.max_bytes, 67108864);
    ck_assert_int_eq(c.cache.near.max_value_bytes, 65536);
    ck_assert_int_eq(c.cache.near.min_hits, 0);
    ck_assert_int_eq(c.cache.near.min_hits_window_ms, 10000);
    ck_assert_int_eq(c.cache.near.shared_bytes, 16777216);
    ck_assert_int_eq(c.cache.near.shared_stale_ms, 50);
    ck_assert_str_eq(c.journal.path, "/var/lib/leased/invalidations.journal");
    ck_assert_int_eq(c.journal.fsync, LD_FSYNC_ALWAYS);
    ck_assert_int_eq(c.limits.max_clients, 10000);
    ck_assert_int_eq(c.limits.max_request_bytes, 1048576);
    ck_assert_int_eq(c.limits.max_key_bytes, 1024);
    ck_assert_int_eq(c.limits.max_waiters, 100000);
    ck_assert_int_eq(c.limits.max_pending, 1024);
    ck_assert_int_eq(c.limits.max_output_bytes, 33554432);
    ck_assert_int_eq(c.shutdown.drain_ms, 0);
    ck_assert_str_eq(c.metrics.listen, "127.0.0.1:9379");
    ck_assert_int_eq(c.log.level, LD_LOG_INFO);
    ck_assert_int_eq(c.log.target, LD_LOG_TARGET_STDERR);
    ld_conf_free(&c);
}
END_TEST

START_TEST(defaults_follow_systemd_dirs)
{
    struct ld_config c;

    setenv("RUNTIME_DIRECTORY", "/run/leased-a:/run/leased-b", 1);
    setenv("STATE_DIRECTORY", "/var/lib/leased-x", 1);
    ld_conf_defaults(&c);
    ck_assert_str_eq(c.listen.unix_path, "/run/leased-a/leased.sock");
    ck_assert_str_eq(c.journal.path,
                     "/var/lib/leased-x/invalidations.journal");
    ld_conf_free(&c);
    unsetenv("RUNTIME_DIRECTORY");
    unsetenv("STATE_DIRECTORY");
}
END_TEST

START_TEST(empty_input_keeps_defaults)
{
    static const char *const inputs[] = {
        "", "# only a comment\n", "---\n", "listen:\n", "cache:\n  near:\n",
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(inputs); i++) {
        struct ld_config a, b;
        ld_conf_defaults(&a);
        ck_assert_msg(load(&b, inputs[i]) == LD_OK, "%s", err);
        assert_same_settings(&a, &b);
        ld_conf_free(&a);
        ld_conf_free(&b);
    }
}
END_TEST

START_TEST(full_file_sets_every_key)
{
    struct ld_config c;

    ck_assert_msg(load(&c, full_yaml) == LD_OK, "%s", err);
    ck_assert_str_eq(c.listen.unix_path, "/tmp/l.sock");
    ck_assert_uint_eq(c.listen.unix_mode, 0600);
    ck_assert_str_eq(c.listen.unix_group, "0");
    ck_assert_str_eq(c.listen.tcp, "10.0.0.1:7000");
    ck_assert_str_eq(c.listen.auth_token, "s3cret");
    ck_assert_str_eq(c.redis.address, "/run/redis/redis.sock");
    ck_assert_str_eq(c.redis.username, "app");
    ck_assert_str_eq(c.redis.password, "pw");
    ck_assert_int_eq(c.redis.db, 3);
    ck_assert_int_eq(c.redis.connections, 8);
    ck_assert_int_eq(c.redis.timeout_ms, 250);
    ck_assert_str_eq(c.lock.prefix, "l:");
    ck_assert_int_eq(c.lock.watchdog_ms, 9000);
    ck_assert_int_eq(c.lock.max_hold_ms, 60000);
    ck_assert_int_eq(c.lock.wait_replicas, 1);
    ck_assert(c.lock.require_noeviction);
    ck_assert_int_eq(c.lock.layout, LD_LAYOUT_REDISSON);
    ck_assert_str_eq(c.cache.prefix, "c:");
    ck_assert_int_eq(c.cache.ttl_ms, 1000);
    ck_assert_int_eq(c.cache.null_ttl_ms, 500);
    ck_assert_double_eq(c.cache.ttl_jitter, 0.25);
    ck_assert_int_eq(c.cache.fill_lease_ms, 700);
    ck_assert_int_eq(c.cache.wait_ms, 0);
    ck_assert_int_eq(c.cache.double_delete_ms, 0);
    ck_assert_str_eq(c.journal.path, "/tmp/j.journal");
    ck_assert_int_eq(c.journal.fsync, LD_FSYNC_EVERYSEC);
    ck_assert_int_eq(c.limits.max_clients, 5);
    ck_assert_int_eq(c.limits.max_request_bytes, 4096);
    ck_assert_int_eq(c.limits.max_key_bytes, 64);
    ck_assert_int_eq(c.limits.max_waiters, 10);
    ck_assert_int_eq(c.limits.max_pending, 7);
    ck_assert_int_eq(c.limits.max_output_bytes, 1000000);
    ck_assert_int_eq(c.shutdown.drain_ms, 15000);
    ck_assert_str_eq(c.metrics.listen, "");
    ck_assert_int_eq(c.log.level, LD_LOG_DEBUG);
    ck_assert_int_eq(c.log.target, LD_LOG_TARGET_SYSLOG);
    ld_conf_free(&c);
}
END_TEST

/* conf/leased.yml lists every key at its default: loaded over a config
 * where every setting differs, it must give back the defaults. */
START_TEST(shipped_file_is_the_defaults)
{
    const char *srcdir = getenv("LD_SRCDIR");
    char path[4096];
    struct ld_config defaults, c;

    snprintf(path, sizeof(path), "%s/conf/leased.yml",
             srcdir != NULL ? srcdir : ".");
    ld_conf_defaults(&defaults);
    ck_assert_msg(load(&c, full_yaml) == LD_OK, "%s", err);
    ck_assert_msg(ld_conf_load(&c, path, false, err, sizeof(err)) == LD_OK,
                  "%s", err);
    assert_same_settings(&defaults, &c);
    ck_assert_str_eq(c.listen.unix_path, "/run/leased/leased.sock");
    ck_assert_str_eq(c.journal.path, "/var/lib/leased/invalidations.journal");
    ld_conf_free(&defaults);
    ld_conf_free(&c);
}
END_TEST

/* The near cache's nested mapping loads in any YAML style, and the
 * relation between its bounds is checked at the right position. */
START_TEST(near_in_flow_and_block_style)
{
    static const char *const defaults[] = {
        "cache:\n  near: { enabled: false, max_bytes: 67108864, "
        "max_value_bytes: 65536 }\n",
        "cache:\n  near:\n    enabled: false\n    max_bytes: 67108864\n"
        "    max_value_bytes: 65536\n",
        "cache: {near: {enabled: no, max_bytes: 67108864}}",
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(defaults); i++) {
        struct ld_config c;
        ck_assert_msg(load(&c, defaults[i]) == LD_OK, "%s", err);
        ck_assert(!c.cache.near.enabled);
        ck_assert_int_eq(c.cache.near.max_bytes, 67108864);
        ck_assert_int_eq(c.cache.ttl_ms, 600000);
        ld_conf_free(&c);
    }
    /* A value over the byte bound is refused where it is written, in
     * either style, once the near cache is on. */
    expect_error("cache:\n  near: { enabled: true, max_bytes: 100, "
                 "max_value_bytes: 512 }\n",
                 "t.yml:2:59: cache.near.max_value_bytes: may not exceed "
                 "cache.near.max_bytes");
    expect_error("cache:\n  near:\n    max_bytes: 100\n"
                 "    enabled: true\n",
                 "t.yml:3:16: cache.near.max_value_bytes: may not exceed "
                 "cache.near.max_bytes");
    struct ld_config c;
    ck_assert_msg(load(&c, "cache:\n  near: { enabled: true, min_hits: 3, "
                           "min_hits_window_ms: 500 }\n") == LD_OK,
                  "%s", err);
    ck_assert(c.cache.near.enabled);
    ck_assert_int_eq(c.cache.near.min_hits, 3);
    ck_assert_int_eq(c.cache.near.min_hits_window_ms, 500);
    ld_conf_free(&c);
    ck_assert_msg(load(&c, "cache:\n  near: { enabled: true, max_bytes: 0 "
                           "}\n") == LD_OK,
                  "%s", err);
    ck_assert_int_eq(c.cache.near.max_bytes, 0);
    ld_conf_free(&c);
    /* The shared segments: none, or a size worth mapping; and a stale
     * bound a heartbeat can keep. */
    ck_assert_msg(load(&c, "cache:\n  near: { enabled: true, shared_bytes: "
                           "0, shared_stale_ms: 5 }\n") == LD_OK,
                  "%s", err);
    ck_assert_int_eq(c.cache.near.shared_bytes, 0);
    ck_assert_int_eq(c.cache.near.shared_stale_ms, 5);
    ld_conf_free(&c);
    expect_error("cache:\n  near: { shared_bytes: 4096 }\n",
                 "t.yml:2:25: cache.near.shared_bytes: must be 0 (no shared "
                 "segment) or at least 65536");
    expect_error("cache:\n  near: { shared_stale_ms: 4 }\n",
                 "t.yml:2:28: cache.near.shared_stale_ms: must be 5..10000");
    expect_error("cache:\n  near: { shared_stale_ms: 10001 }\n",
                 "t.yml:2:28: cache.near.shared_stale_ms: must be 5..10000");
}
END_TEST

START_TEST(load_keeps_unmentioned_values)
{
    struct ld_config c;
    const char *second = "redis:\n  db: 5\n";

    ck_assert_int_eq(load(&c, "redis:\n  timeout_ms: 77\n"), LD_OK);
    ck_assert_int_eq(ld_conf_load_string(&c, second, strlen(second), "u.yml",
                                         err, sizeof(err)),
                     LD_OK);
    ck_assert_int_eq(c.redis.timeout_ms, 77);
    ck_assert_int_eq(c.redis.db, 5);
    ld_conf_free(&c);
}
END_TEST

START_TEST(null_string_is_empty)
{
    struct ld_config c;

    ck_assert_int_eq(load(&c, "redis:\n  password:\n  username: ~\n"), LD_OK);
    ck_assert_str_eq(c.redis.password, "");
    ck_assert_str_eq(c.redis.username, "");
    ld_conf_free(&c);
}
END_TEST

START_TEST(error_unknown_key)
{
    expect_error("bogus: 1\n", "t.yml:1:1: bogus: unknown key");
    expect_error("redis:\n  db: 0\n  timeout: 5\n",
                 "t.yml:3:3: redis.timeout: unknown key");
    expect_error("cache:\n  near: { enabled: true, size: 5 }\n",
                 "t.yml:2:26: cache.near.size: unknown key");
    /* A dotted key does not alias its nested form. */
    expect_error("redis.db: 1\n", "t.yml:1:1: redis.db: unknown key");
}
END_TEST

START_TEST(error_string_where_int_belongs)
{
    expect_error("redis:\n  db: 0\n  timeout_ms: abc\n",
                 "t.yml:3:15: redis.timeout_ms: expected an integer");
    expect_error("redis:\n  timeout_ms: \"1000\"\n",
                 "t.yml:2:15: redis.timeout_ms: expected an integer");
    expect_error("redis:\n  timeout_ms: 10.5\n",
                 "t.yml:2:15: redis.timeout_ms: expected an integer");
    expect_error("redis:\n  timeout_ms:\n",
                 "t.yml:2:14: redis.timeout_ms: expected an integer");
    expect_error("cache:\n  ttl_jitter: lots\n",
                 "t.yml:2:15: cache.ttl_jitter: expected a number");
    expect_error("cache:\n  ttl_jitter: nan\n",
                 "t.yml:2:15: cache.ttl_jitter: expected a number");
    expect_error("cache:\n  near: {enabled: maybe}\n",
                 "t.yml:2:19: cache.near.enabled: expected true or false");
}
END_TEST

START_TEST(error_container_where_scalar_belongs)
{
    expect_error("redis:\n  timeout_ms: {a: 1}\n",
                 "t.yml:2:15: redis.timeout_ms: expected an integer, got a "
                 "mapping");
    expect_error("redis:\n  address:\n    - 127.0.0.1:6379\n",
                 "t.yml:3:5: redis.address: expected host:port, got a list");
    expect_error("redis: 5\n", "t.yml:1:8: redis: expected a mapping, got a "
                               "scalar");
    expect_error("redis:\n  addresses: 127.0.0.1:26379\n",
                 "t.yml:2:14: redis.addresses: expected a list, got a scalar");
    expect_error("lock:\n  redlock: [[a]]\n",
                 "t.yml:2:13: lock.redlock: list items must be scalars, got a "
                 "list");
    expect_error("- a\n- b\n", "t.yml:1:1: expected a mapping of sections at "
                               "the top, got a list");
}
END_TEST

START_TEST(error_out_of_range)
{
    expect_error("redis:\n  timeout_ms: 0\n",
                 "t.yml:2:15: redis.timeout_ms: must be 1..600000");
    expect_error("redis:\n  connections: 65\n",
                 "t.yml:2:16: redis.connections: must be 1..64");
    expect_error("redis:\n  db: -1\n",
                 "t.yml:2:7: redis.db: must be 0..1000000");
    expect_error("lock:\n  watchdog_ms: 99999999999999999999999\n",
                 "t.yml:2:16: lock.watchdog_ms: must be 100..86400000");
    expect_error("shutdown:\n  drain_ms: 3600001\n",
                 "t.yml:2:13: shutdown.drain_ms: must be 0..3600000");
    expect_error("cache:\n  ttl_jitter: 0.6\n",
                 "t.yml:2:15: cache.ttl_jitter: must be 0..0.5");
    expect_error("limits:\n  max_request_bytes: 63\n",
                 "t.yml:2:22: limits.max_request_bytes: must be "
                 "64..1073741824");
    expect_error("limits:\n  max_key_bytes: 65537\n",
                 "t.yml:2:18: limits.max_key_bytes: must be 1..65536");
    expect_error("limits:\n  max_pending: 0\n",
                 "t.yml:2:16: limits.max_pending: must be 1..1000000");
    expect_error("redis:\n  db: 0\n  batch_max: 1025\n",
                 "t.yml:3:14: redis.batch_max: must be 0..1024");
    expect_error("redis:\n  batch_max: -1\n",
                 "t.yml:2:14: redis.batch_max: must be 0..1024");
    expect_ok("redis:\n  timeout_ms: 600000\n");
    expect_ok("redis:\n  batch_max: 0\n");
    expect_ok("cache:\n  ttl_jitter: 0\n");
}
END_TEST

START_TEST(error_bad_enum)
{
    expect_error("redis:\n  mode: replica\n",
                 "t.yml:2:9: redis.mode: must be one of standalone, "
                 "sentinel, cluster");
    expect_error("journal:\n  fsync: never\n",
                 "t.yml:2:10: journal.fsync: must be one of always, everysec");
    expect_error("log:\n  level: verbose\n",
                 "t.yml:2:10: log.level: must be one of debug, info, warn, "
                 "error");
}
END_TEST

START_TEST(error_bad_hostport)
{
    expect_error("redis:\n  address: localhost\n",
                 "t.yml:2:12: redis.address: expected host:port or an "
                 "absolute socket path");
    expect_error("listen:\n  tcp: 127.0.0.1:70000\n",
                 "t.yml:2:8: listen.tcp: expected host:port");
    expect_error("listen:\n  tcp: ::1:7379\n",
                 "t.yml:2:8: listen.tcp: expected host:port");
    expect_error("metrics:\n  listen: \":9379\"\n",
                 "t.yml:2:11: metrics.listen: expected host:port");
    expect_error("redis:\n  address: 127.0.0.1:0\n",
                 "t.yml:2:12: redis.address: port must be 1..65535");
    expect_error("redis:\n  addresses:\n    - 10.0.0.1:1\n    - nope\n",
                 "t.yml:4:7: redis.addresses: expected host:port or an "
                 "absolute socket path");
    expect_ok("listen:\n  tcp: \"[::1]:7379\"\n");
    expect_ok("listen:\n  tcp: localhost:0\n");
}
END_TEST

START_TEST(error_bad_mode)
{
    expect_error("listen:\n  unix_mode: \"0980\"\n",
                 "t.yml:2:14: listen.unix_mode: expected an octal mode such "
                 "as \"0660\" (at most 0777)");
    expect_error("listen:\n  unix_mode: \"01777\"\n",
                 "t.yml:2:14: listen.unix_mode: expected an octal mode such "
                 "as \"0660\" (at most 0777)");
    expect_error("listen:\n  unix_mode: [6]\n",
                 "t.yml:2:14: listen.unix_mode: expected an octal mode, got "
                 "a list");
    struct ld_config c;
    ck_assert_int_eq(load(&c, "listen:\n  unix_mode: 0600\n"), LD_OK);
    ck_assert_uint_eq(c.listen.unix_mode, 0600);
    ld_conf_free(&c);
}
END_TEST

START_TEST(error_duplicate_key)
{
    expect_error("redis:\n  db: 1\n  db: 2\n",
                 "t.yml:3:3: redis.db: duplicate key");
    expect_error("log:\n  level: info\nredis: {}\nlog: {}\n",
                 "t.yml:4:1: log: duplicate key");
    expect_error("cache:\n  near: {enabled: true, enabled: false}\n",
                 "t.yml:2:25: cache.near.enabled: duplicate key");
}
END_TEST

START_TEST(error_yaml_syntax)
{
    expect_error("redis:\n  db: 1\n   timeout_ms: 5\n",
                 "t.yml:3:14: syntax error: mapping values are not allowed "
                 "in this context");
    expect_error("redis:\n  addresses: [a:1, b:2\n",
                 "t.yml:3:1: syntax error: did not find expected ',' or ']' "
                 "(while parsing a flow sequence at 2:14)");
    expect_error("redis:\n\tdb: 1\n",
                 "t.yml:2:1: syntax error: found character that cannot "
                 "start any token (while scanning for the next token at "
                 "2:1)");
    expect_error("redis: *nothing\n",
                 "t.yml:1:8: syntax error: found undefined alias");
    expect_error("log:\n  level: info\n---\nlog:\n  level: debug\n",
                 "t.yml:3:1: only one YAML document is allowed");
}
END_TEST

START_TEST(error_sentinel_needs_addresses)
{
    expect_error("redis:\n  mode: sentinel\n",
                 "t.yml:2:9: redis.mode: sentinel mode needs the Sentinels in "
                 "redis.addresses");
    expect_ok("redis:\n  mode: sentinel\n  addresses: [127.0.0.1:26379]\n"
              "  master_name: main\n  sentinel_password: s\n");
    expect_error("redis:\n  mode: sentinel\n  addresses: [127.0.0.1:1]\n"
                 "  master_name: \"\"\n",
                 "t.yml:4:16: redis.master_name: must not be empty");
}
END_TEST

START_TEST(error_cluster_db)
{
    /* Redis Cluster has database 0 only. */
    expect_error("redis:\n  mode: cluster\n  db: 2\n",
                 "t.yml:3:7: redis.db: must be 0 in cluster mode");
    expect_ok("redis:\n  mode: cluster\n  addresses: [127.0.0.1:7000]\n");
    expect_ok("redis:\n  mode: cluster\n");
}
END_TEST

START_TEST(error_invalid_utf8)
{
    expect_error("log:\n  level: \xff\xfe\n",
                 "t.yml:2:10: syntax error: invalid leading UTF-8 octet");
}
END_TEST

START_TEST(error_tcp_needs_token)
{
    expect_error("listen:\n  auth_token: \"\"\n  tcp: 0.0.0.0:7379\n",
                 "t.yml:3:8: listen.tcp: non-loopback tcp requires "
                 "listen.auth_token");
    /* The order of the two keys does not matter. */
    expect_ok("listen:\n  tcp: 0.0.0.0:7379\n  auth_token: x\n");
    expect_ok("listen:\n  tcp: 127.0.0.2:7379\n");
    expect_ok("listen:\n  tcp: localhost:7379\n");
    expect_ok("listen:\n  tcp: \"[::1]:7379\"\n");
    expect_ok("listen:\n  tcp: \"\"\n");
}
END_TEST

START_TEST(unix_group_must_exist)
{
    expect_ok("listen:\n  unix_group: \"\"\n");
    expect_ok("listen:\n  unix_group: \"4242\"\n");
    expect_ok("listen:\n  unix_group: root\n");
    expect_error("listen:\n  unix_group: no-such-group-here\n",
                 "t.yml:2:15: listen.unix_group: unknown group "
                 "'no-such-group-here'");
    expect_error("listen:\n  unix_group: \"12x\"\n",
                 "t.yml:2:15: listen.unix_group: unknown group '12x'");
}
END_TEST

START_TEST(relative_paths_become_absolute)
{
    struct ld_config c;

    ck_assert_msg(load(&c, "listen:\n  unix: run/l.sock\njournal:\n"
                           "  path: ./j.journal\n") == LD_OK,
                  "%s", err);
    ld_conf_absolute_paths(&c, "/srv/app");
    ck_assert_str_eq(c.listen.unix_path, "/srv/app/run/l.sock");
    ck_assert_str_eq(c.journal.path, "/srv/app/j.journal");
    ld_conf_absolute_paths(&c, "/elsewhere");
    ck_assert_str_eq(c.listen.unix_path, "/srv/app/run/l.sock");
    ld_conf_free(&c);
    ck_assert_msg(load(&c, "listen:\n  unix: \"\"\n") == LD_OK, "%s", err);
    ld_conf_absolute_paths(&c, "/");
    ck_assert_str_eq(c.listen.unix_path, "");
    ld_conf_free(&c);
}
END_TEST

START_TEST(error_related_settings)
{
    expect_error("cache:\n  prefix: \"leased:lock:\"\n",
                 "t.yml:2:11: cache.prefix: must differ from lock.prefix");
    /* One inside the other lets a cache key name a lock's Redis key. */
    expect_error("cache:\n  prefix: \"leased:\"\n",
                 "t.yml:2:11: cache.prefix: must not be a prefix of "
                 "lock.prefix, nor lock.prefix of it");
    expect_error("lock:\n  prefix: \"leased:cache:l:\"\n",
                 "t.yml:2:11: cache.prefix: must not be a prefix of "
                 "lock.prefix, nor lock.prefix of it");
    expect_error("lock:\n  prefix: \"\"\n",
                 "t.yml:2:11: cache.prefix: must not be a prefix of "
                 "lock.prefix, nor lock.prefix of it");
    expect_ok("lock:\n  prefix: \"l:\"\ncache:\n  prefix: \"c:\"\n");
    /* Redisson's locks are bare names: an empty prefix is what a Java
     * user writes, and it leaves only semaphores ("{k}:sem") under it. */
    expect_ok("lock:\n  layout: redisson\n  prefix: \"\"\n");
    expect_error("lock:\n  layout: redisson\n  prefix: \"\"\n"
                 "cache:\n  prefix: \"{c}:\"\n",
                 "t.yml:5:11: cache.prefix: must not be a prefix of "
                 "lock.prefix, nor lock.prefix of it");
    expect_error("journal:\n  path: \"\"\n",
                 "t.yml:2:9: journal.path: must not be empty");
}
END_TEST

static char *
write_temp(const char *content)
{
    char *path = strdup("/tmp/check_conf.XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, content, strlen(content)),
                     (ssize_t)strlen(content));
    close(fd);
    return path;
}

START_TEST(file_errors_name_the_file)
{
    struct ld_config c;
    char expect[600];
    char *path = write_temp("redis:\n  db: x\n");

    ld_conf_defaults(&c);
    ck_assert_int_eq(ld_conf_load(&c, path, false, err, sizeof(err)), LD_ERR);
    snprintf(expect, sizeof(expect), "%s:2:7: redis.db: expected an integer",
             path);
    ck_assert_str_eq(err, expect);
    unlink(path);
    free(path);
    ld_conf_free(&c);
}
END_TEST

START_TEST(missing_file)
{
    struct ld_config a, c;

    ld_conf_defaults(&a);
    ld_conf_defaults(&c);
    ck_assert_int_eq(ld_conf_load(&c, "/nonexistent/leased.yml", true, err,
                                  sizeof(err)),
                     LD_OK);
    assert_same_settings(&a, &c);
    ck_assert_int_eq(ld_conf_load(&c, "/nonexistent/leased.yml", false, err,
                                  sizeof(err)),
                     LD_ERR);
    ck_assert_str_eq(err, "/nonexistent/leased.yml: cannot open: No such "
                          "file or directory");
    ld_conf_free(&a);
    ld_conf_free(&c);
}
END_TEST

/* Run ld_conf_apply_reload with stderr captured into LOG. */
static void
reload_capturing(struct ld_config *live, const struct ld_config *next,
                 char *log, size_t loglen)
{
    char *path = write_temp("");
    int fd = open(path, O_RDWR | O_TRUNC);
    int saved = dup(STDERR_FILENO);

    fflush(stderr);
    dup2(fd, STDERR_FILENO);
    ld_conf_apply_reload(live, next);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);

    ssize_t n = pread(fd, log, loglen - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    free(path);
}

START_TEST(reload_applies_reloadable_keys_only)
{
    struct ld_config live, next;
    char log[8192];
    const char *changes =
        "log: {level: debug, target: syslog}\n"
        "limits: {max_clients: 3, max_request_bytes: 128, max_key_bytes: 9,\n"
        "         max_waiters: 4, max_pending: 5}\n"
        "cache: {ttl_ms: 11, null_ttl_ms: 12, ttl_jitter: 0.3,\n"
        "        fill_lease_ms: 14, wait_ms: 15, double_delete_ms: 16,\n"
        "        prefix: \"other:\"}\n"
        "lock: {watchdog_ms: 1700, max_hold_ms: 18, wait_replicas: 2,\n"
        "       layout: redisson}\n"
        "redis: {address: \"10.9.9.9:6379\", timeout_ms: 5}\n"
        "listen: {unix: /tmp/other.sock}\n";

    ld_log_set_level(LD_LOG_INFO);
    ld_conf_defaults(&live);
    ck_assert_msg(load(&next, changes) == LD_OK, "%s", err);
    reload_capturing(&live, &next, log, sizeof(log));

    ck_assert_int_eq(live.log.level, LD_LOG_DEBUG);
    ck_assert_int_eq(ld_log_level, LD_LOG_DEBUG);
    ck_assert_int_eq(live.limits.max_clients, 3);
    ck_assert_int_eq(live.limits.max_request_bytes, 128);
    ck_assert_int_eq(live.limits.max_key_bytes, 9);
    ck_assert_int_eq(live.limits.max_waiters, 4);
    ck_assert_int_eq(live.limits.max_pending, 5);
    ck_assert_int_eq(live.cache.ttl_ms, 11);
    ck_assert_int_eq(live.cache.null_ttl_ms, 12);
    ck_assert_double_eq(live.cache.ttl_jitter, 0.3);
    ck_assert_int_eq(live.cache.fill_lease_ms, 14);
    ck_assert_int_eq(live.cache.wait_ms, 15);
    ck_assert_int_eq(live.cache.double_delete_ms, 16);
    ck_assert_int_eq(live.lock.watchdog_ms, 1700);
    ck_assert_int_eq(live.lock.max_hold_ms, 18);
    ck_assert_int_eq(live.lock.wait_replicas, 2);

    /* Kept, each with one warning. */
    ck_assert_int_eq(live.log.target, LD_LOG_TARGET_STDERR);
    ck_assert_str_eq(live.cache.prefix, "leased:cache:");
    ck_assert_int_eq(live.lock.layout, LD_LAYOUT_LEASED);
    ck_assert_str_eq(live.redis.address, "127.0.0.1:6379");
    ck_assert_int_eq(live.redis.timeout_ms, 1000);
    ck_assert_str_ne(live.listen.unix_path, "/tmp/other.sock");
    static const char *const kept[] = {
        "log.target",    "cache.prefix",     "lock.layout",
        "redis.address", "redis.timeout_ms", "listen.unix",
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(kept); i++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "level=warn msg=\"config: %s changed, needs restart\"\n",
                 kept[i]);
        ck_assert_msg(strstr(log, line) != NULL, "no \"%s\" in:\n%s", line,
                      log);
    }
    ck_assert_ptr_null(strstr(log, "config: limits.max_pending changed"));

    /* Nothing changed: nothing logged. AGAIN is loaded on its own, so
     * equal values in separate memory must compare equal. */
    struct ld_config again;
    ck_assert_msg(
        load(&again, "log: {level: debug}\n"
                     "limits: {max_clients: 3, max_request_bytes: 128,\n"
                     "         max_key_bytes: 9, max_waiters: 4,\n"
                     "         max_pending: 5}\n"
                     "cache: {ttl_ms: 11, null_ttl_ms: 12, ttl_jitter: 0.3,\n"
                     "        fill_lease_ms: 14, wait_ms: 15,\n"
                     "        double_delete_ms: 16}\n"
                     "lock: {watchdog_ms: 1700, max_hold_ms: 18,\n"
                     "       wait_replicas: 2}\n") == LD_OK,
        "%s", err);
    reload_capturing(&live, &again, log, sizeof(log));
    ck_assert_str_eq(log, "");

    ld_log_set_level(LD_LOG_INFO);
    ld_conf_free(&again);
    ld_conf_free(&live);
    ld_conf_free(&next);
}
END_TEST

struct key_seen {
    size_t count;
    bool pending_reloadable;
    bool address_reloadable;
    bool near_seen;
};

static void
count_key(const char *dotted, bool reloadable, void *arg)
{
    struct key_seen *s = arg;
    s->count++;
    if (strcmp(dotted, "limits.max_pending") == 0) {
        s->pending_reloadable = reloadable;
    } else if (strcmp(dotted, "redis.address") == 0) {
        s->address_reloadable = reloadable;
    } else if (strcmp(dotted, "cache.near.max_value_bytes") == 0) {
        s->near_seen = true;
    }
}

START_TEST(each_key_lists_the_table)
{
    struct key_seen s = {0, false, true, false};

    ld_conf_each_key(count_key, &s);
    ck_assert_uint_eq(s.count, 67);
    ck_assert(s.pending_reloadable);
    ck_assert(!s.address_reloadable);
    ck_assert(s.near_seen);
}
END_TEST

/* lock.redlock: three instances at least, and no WAIT for replicas
 * beside it; the error points at the setting. */
START_TEST(redlock_checked)
{
    expect_error("lock:\n  redlock: [a:1, b:1]\n",
                 "t.yml:2:12: lock.redlock: Redlock needs at least 3 "
                 "instances (a majority of 2 survives no loss), got 2");
    expect_error("lock:\n  wait_replicas: 1\n  redlock: [a:1, b:1, c:1]\n",
                 "t.yml:2:18: lock.wait_replicas: cannot be used with "
                 "lock.redlock (Redlock's instances are independent, without "
                 "replicas)");
    expect_ok("lock:\n  redlock: [a:1, b:1, /run/redis.sock]\n");
}
END_TEST

START_TEST(key_available_follows_the_table)
{
    ck_assert(ld_conf_key_available("redis.address"));
    ck_assert(ld_conf_key_available("lock.layout"));
    ck_assert(ld_conf_key_available("journal.fsync"));
    ck_assert(ld_conf_key_available("redis.mode"));
    ck_assert(ld_conf_key_available("redis.addresses"));
    ck_assert(ld_conf_key_available("redis.master_name"));
    ck_assert(ld_conf_key_available("lock.redlock"));
    ck_assert(ld_conf_key_available("cache.near.enabled"));
    ck_assert(ld_conf_key_available("cache.near.max_bytes"));
    ck_assert(ld_conf_key_available("cache.near.min_hits"));
    ck_assert(!ld_conf_key_available("no.such_key"));
}
END_TEST

static Suite *
conf_suite(void)
{
    Suite *s = suite_create("conf");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"defaults_match_product", defaults_match_product},
        {"defaults_follow_systemd_dirs", defaults_follow_systemd_dirs},
        {"empty_input_keeps_defaults", empty_input_keeps_defaults},
        {"full_file_sets_every_key", full_file_sets_every_key},
        {"shipped_file_is_the_defaults", shipped_file_is_the_defaults},
        {"near_in_flow_and_block_style", near_in_flow_and_block_style},
        {"load_keeps_unmentioned_values", load_keeps_unmentioned_values},
        {"null_string_is_empty", null_string_is_empty},
        {"error_unknown_key", error_unknown_key},
        {"error_string_where_int_belongs", error_string_where_int_belongs},
        {"error_container_where_scalar_belongs",
         error_container_where_scalar_belongs},
        {"error_out_of_range", error_out_of_range},
        {"error_bad_enum", error_bad_enum},
        {"error_bad_hostport", error_bad_hostport},
        {"error_bad_mode", error_bad_mode},
        {"error_duplicate_key", error_duplicate_key},
        {"error_yaml_syntax", error_yaml_syntax},
        {"error_invalid_utf8", error_invalid_utf8},
        {"error_tcp_needs_token", error_tcp_needs_token},
        {"error_sentinel_needs_addresses", error_sentinel_needs_addresses},
        {"error_cluster_db", error_cluster_db},
        {"unix_group_must_exist", unix_group_must_exist},
        {"relative_paths_become_absolute", relative_paths_become_absolute},
        {"error_related_settings", error_related_settings},
        {"file_errors_name_the_file", file_errors_name_the_file},
        {"missing_file", missing_file},
        {"reload_applies_reloadable_keys_only",
         reload_applies_reloadable_keys_only},
        {"each_key_lists_the_table", each_key_lists_the_table},
        {"redlock_checked", redlock_checked},
        {"key_available_follows_the_table", key_available_follows_the_table},
    };

    for (size_t i = 0; i < LD_ARRAY_LEN(cases); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int
main(void)
{
    return ld_unit_run(conf_suite());
}
