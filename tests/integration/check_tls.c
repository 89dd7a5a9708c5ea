/* TLS to Redis (redis.tls.*) against a real redis-server listening with
 * --tls-port, certificates made by the openssl command for each case: ops
 * over TLS, a server certificate from another CA or for another name
 * refused with the reason in the log, mutual TLS, verify: false with its
 * warning, no fallback to plain text, a TLS Redis restarted (a lost
 * connection, not a TLS failure), Sentinel and Redlock instances over
 * TLS, and bad key files refused by leased -t. The servers keep a plain
 * port too, for the harness' readiness check and the test's own look into
 * Redis; the daemon is only ever pointed at the TLS port. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define T_MS 5000
#define RUN_MS 30000

static struct h_redis R, R2;
static struct h_redis S[3];
static struct h_redis I[3]; /* lock.redlock instances */
static struct h_daemon D;
static char certs[256]; /* this case's certificates */
static int tls_port;

static void
run_ok(const char *const argv[])
{
    char err[2048];
    int rc = h_run(argv, NULL, 0, err, sizeof err, RUN_MS);
    ck_assert_msg(rc == 0, "%s %s failed (%d): %s", argv[0], argv[1], rc, err);
}

static void
path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", certs, name);
}

/* A self-signed CA NAME.crt / NAME.key. */
static void
make_ca(const char *name)
{
    char key[300], crt[300], subj[64];
    snprintf(key, sizeof key, "%s/%s.key", certs, name);
    snprintf(crt, sizeof crt, "%s/%s.crt", certs, name);
    snprintf(subj, sizeof subj, "/CN=leased test %s", name);
    const char *argv[] = {"openssl",
                          "req",
                          "-x509",
                          "-newkey",
                          "ec",
                          "-pkeyopt",
                          "ec_paramgen_curve:prime256v1",
                          "-nodes",
                          "-keyout",
                          key,
                          "-out",
                          crt,
                          "-days",
                          "2",
                          "-subj",
                          subj,
                          NULL};
    run_ok(argv);
}

/* NAME.crt / NAME.key for CN, signed by CA, with the subjectAltName
 * SAN (may be NULL). */
static void
make_cert(const char *name, const char *cn, const char *ca, const char *san)
{
    char key[300], csr[300], crt[300], cacrt[300], cakey[300], ext[300];
    char subj[64];
    snprintf(key, sizeof key, "%s/%s.key", certs, name);
    snprintf(csr, sizeof csr, "%s/%s.csr", certs, name);
    snprintf(crt, sizeof crt, "%s/%s.crt", certs, name);
    snprintf(cacrt, sizeof cacrt, "%s/%s.crt", certs, ca);
    snprintf(cakey, sizeof cakey, "%s/%s.key", certs, ca);
    snprintf(ext, sizeof ext, "%s/%s.ext", certs, name);
    snprintf(subj, sizeof subj, "/CN=%s", cn);
    const char *req[] = {"openssl", "req",      "-newkey",
                         "ec",      "-pkeyopt", "ec_paramgen_curve:prime256v1",
                         "-nodes",  "-keyout",  key,
                         "-out",    csr,        "-subj",
                         subj,      NULL};
    run_ok(req);
    FILE *f = fopen(ext, "w");
    ck_assert_ptr_nonnull(f);
    if (san != NULL) {
        fprintf(f, "subjectAltName=%s\n", san);
    }
    fclose(f);
    const char *sign[] = {
        "openssl", "x509", "-req",   "-in", csr,
        "-CA",     cacrt,  "-CAkey", cakey, "-CAcreateserial",
        "-out",    crt,    "-days",  "2",   "-extfile",
        ext,       NULL};
    run_ok(sign);
}

/* Every case: a CA with a server and a client certificate, and a second
 * CA that signed nothing the server has. */
static void
setup(void)
{
    ck_assert_int_eq(h_tmpdir(certs, sizeof certs), 0);
    make_ca("ca");
    make_ca("other");
    make_cert("server", "localhost", "ca", "DNS:localhost,IP:127.0.0.1");
    make_cert("client", "leased", "ca", NULL);
    make_cert("stranger", "leased", "other", NULL);
}

static void
teardown(void)
{
    for (int i = 0; i < 3; i++) {
        h_redis_stop(&S[i]);
        h_redis_stop(&I[i]);
    }
}

static const struct h_fixture fx = {
    .suite = "tls",
    .redis = {&R, &R2},
    .daemons = {&D},
    .setup = setup,
    .teardown = teardown,
};

/* A redis-server with a plain port (the harness') and a TLS port;
 * AUTH_CLIENTS: whether it demands a client certificate. */
static void
start_tls_redis(bool auth_clients)
{
    char extra[2048], crt[300], key[300], ca[300];
    path(crt, sizeof crt, "server.crt");
    path(key, sizeof key, "server.key");
    path(ca, sizeof ca, "ca.crt");
    tls_port = h_free_port();
    snprintf(extra, sizeof extra,
             "--tls-port %d --tls-cert-file %s --tls-key-file %s "
             "--tls-ca-cert-file %s --tls-auth-clients %s",
             tls_port, crt, key, ca, auth_clients ? "yes" : "no");
    ck_assert_int_eq(h_redis_start(&R, extra), 0);
}

/* leased on the TLS port with the redis.tls keys of TLS_YAML (indented
 * four spaces) and PORT as its address. CONNECTS: whether it is expected
 * to reach Redis (then the case starts once it has). */
static void
start_daemon_at(int port, const char *tls_yaml, bool connects)
{
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: 127.0.0.1:%d\n  timeout_ms: 500\n"
             "  tls:\n    enabled: true\n%s",
             port, tls_yaml);
    ck_assert_int_eq(h_daemon_start(&D, connects ? &R : NULL, yaml), 0);
}

static void
start_daemon(const char *tls_yaml, bool connects)
{
    start_daemon_at(tls_port, tls_yaml, connects);
}

/* "    ca_file: <certs>/NAME.crt\n" and the like. */
static const char *
tls_keys(char *buf, size_t len, const char *ca, const char *client)
{
    int n = snprintf(buf, len, "    ca_file: %s/%s.crt\n", certs, ca);
    if (client != NULL) {
        snprintf(buf + n, len - (size_t)n,
                 "    cert_file: %s/%s.crt\n    key_file: %s/%s.key\n", certs,
                 client, certs, client);
    }
    return buf;
}

static void
assert_unavailable(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", key);
    ck_assert_msg(r != NULL, "no answer to lock");
    h_expect_code(r, "redis_unavailable", "lock without a TLS connection");
}

/* A lock that is taken, waited for (the wake-up comes through the
 * subscriber connection, TLS too) and handed over. The unlock waits until
 * SUB (a Redis the daemon subscribes on) counts the waiter's subscription:
 * after a restart the subscriber connection may still be reconnecting
 * when the command connections are ready, and an unlock published before
 * it subscribes wakes no one. */
static void
assert_locks_work(const struct h_redis *sub)
{
    struct h_conn *a = h_connect_ok(&D), *b = h_connect_ok(&D);
    json_t *r = h_callf(a, T_MS, "{s:s,s:s}", "op", "lock", "key", "k");
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    json_decref(r);
    json_t *req = json_pack("{s:s,s:s,s:i,s:i}", "op", "lock", "key", "k",
                            "wait_ms", 10000, "id", 77);
    char *line = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ck_assert_int_eq(h_send_raw(b, line, strlen(line)), 0);
    ck_assert_int_eq(h_send_raw(b, "\n", 1), 0);
    free(line);
    h_assert_stat(a, "lock_waiters", 1, T_MS);
    h_wait_subscribed(sub, "leased:lock:{k}:unlock", 10000);
    long long t0 = h_now_ms();
    r = h_callf(a, T_MS, "{s:s,s:s}", "op", "unlock", "key", "k");
    ck_assert(h_ok(r) && jtrue(r, "released"));
    json_decref(r);
    r = h_recv_id(b, 77, T_MS);
    ck_assert_msg(r != NULL && jtrue(r, "acquired"), "waiter not granted");
    json_decref(r);
    /* Woken by the unlock message, not by a lease running out. */
    ck_assert_int_lt(h_now_ms() - t0, 3000);
    h_close(a);
    h_close(b);
}

static void
assert_cache_works(void)
{
    struct h_conn *c = h_connect_ok(&D);
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "u");
    ck_assert(h_ok(r) && !jtrue(r, "hit") && jstr(r, "lease") != NULL);
    char lease[128];
    snprintf(lease, sizeof lease, "%s", jstr(r, "lease"));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", "u",
                "lease", lease, "value", "over tls");
    ck_assert(h_ok(r) && jtrue(r, "stored"));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "u");
    ck_assert(h_ok(r) && jtrue(r, "hit"));
    ck_assert_str_eq(jstr(r, "value"), "over tls");
    json_decref(r);
    h_close(c);
    /* It is in the Redis behind the TLS port. */
    ck_assert_int_eq(h_r_int(&R, "EXISTS %s", "leased:cache:{u}"), 1);
}

START_TEST(test_ops_over_tls)
{
    char keys[1024];
    start_tls_redis(false);
    start_daemon(tls_keys(keys, sizeof keys, "ca", NULL), true);
    assert_locks_work(&R);
    assert_cache_works();
    ck_assert(h_log_has(&D, "msg=\"tls on\" ca_file="));
}
END_TEST

START_TEST(test_other_ca_refused)
{
    char keys[1024];
    start_tls_redis(false);
    start_daemon(tls_keys(keys, sizeof keys, "other", NULL), false);
    struct h_conn *c = h_connect_ok(&D);
    assert_unavailable(c, "k");
    ck_assert(h_wait_log(&D, "certificate verify failed", T_MS));
    h_close(c);
}
END_TEST

START_TEST(test_name_mismatch_refused)
{
    char keys[1024];
    start_tls_redis(false);
    tls_keys(keys, sizeof keys, "ca", NULL);
    strcat(keys, "    server_name: redis.example.com\n");
    start_daemon(keys, false);
    struct h_conn *c = h_connect_ok(&D);
    assert_unavailable(c, "k");
    ck_assert(h_wait_log(&D, "hostname mismatch", T_MS));
    h_close(c);
}
END_TEST

/* The name checked is the one configured, not the address: a certificate
 * for "localhost" verifies with server_name localhost on 127.0.0.1. */
START_TEST(test_server_name_used)
{
    char keys[1024];
    start_tls_redis(false);
    tls_keys(keys, sizeof keys, "ca", NULL);
    strcat(keys, "    server_name: localhost\n");
    start_daemon(keys, true);
    assert_cache_works();
}
END_TEST

START_TEST(test_mutual_tls)
{
    char keys[1024];
    start_tls_redis(true);
    start_daemon(tls_keys(keys, sizeof keys, "ca", "client"), true);
    assert_locks_work(&R);
}
END_TEST

/* The client certificate's expiry in /metrics, for an alert before it
 * runs out: the test's certificates are valid for 2 days. */
START_TEST(test_cert_expiry_metric)
{
    char keys[1024], yaml[1200];
    int port = h_free_port();

    start_tls_redis(true);
    snprintf(yaml, sizeof yaml, "%smetrics:\n  listen: 127.0.0.1:%d\n",
             tls_keys(keys, sizeof keys, "ca", "client"), port);
    start_daemon(yaml, true);
    char *body = h_get_metrics(port);
    const char *name = "\nleased_redis_tls_cert_not_after_seconds ";
    const char *at = strstr(body, name);
    ck_assert_msg(at != NULL, "no certificate expiry in:\n%s", body);
    long long not_after = atoll(at + strlen(name));
    long long now = (long long)time(NULL);
    ck_assert_int_gt(not_after, now + 86400);
    ck_assert_int_le(not_after, now + 2 * 86400 + 60);
    free(body);
}
END_TEST

/* The server demands a client certificate and the daemon has none: the
 * server refuses, and the log says so. */
START_TEST(test_mutual_tls_missing_cert)
{
    char keys[1024];
    start_tls_redis(true);
    start_daemon(tls_keys(keys, sizeof keys, "ca", NULL), false);
    struct h_conn *c = h_connect_ok(&D);
    assert_unavailable(c, "k");
    ck_assert(h_wait_log(&D, "redis tls failed", T_MS));
    ck_assert(h_wait_log(&D, "certificate required", T_MS));
    h_close(c);
}
END_TEST

/* A client certificate from a CA the server does not trust. */
START_TEST(test_mutual_tls_wrong_cert)
{
    char keys[1024];
    start_tls_redis(true);
    start_daemon(tls_keys(keys, sizeof keys, "ca", "stranger"), false);
    struct h_conn *c = h_connect_ok(&D);
    assert_unavailable(c, "k");
    ck_assert(h_wait_log(&D, "redis tls failed", T_MS));
    h_close(c);
}
END_TEST

START_TEST(test_verify_false_warns)
{
    char keys[1024];
    start_tls_redis(false);
    tls_keys(keys, sizeof keys, "other", NULL);
    strcat(keys, "    verify: false\n");
    start_daemon(keys, true);
    assert_cache_works();
    ck_assert(h_log_has(&D, "redis.tls.verify is false"));
}
END_TEST

/* TLS on, pointed at a plain port: no connection, never plain text. */
START_TEST(test_no_plain_fallback)
{
    char keys[1024];
    start_tls_redis(false);
    start_daemon_at(R.port, tls_keys(keys, sizeof keys, "ca", NULL), false);
    struct h_conn *c = h_connect_ok(&D);
    assert_unavailable(c, "k");
    ck_assert(h_wait_log(&D, "redis tls failed", T_MS));
    h_close(c);
    ck_assert_int_eq(h_r_int(&R, "EXISTS %s", "leased:lock:{k}"), 0);
}
END_TEST

static bool
connected(void *arg)
{
    return h_stat(arg, "redis_connected") >= 1;
}

START_TEST(test_restart_reconnects)
{
    char keys[1024];
    start_tls_redis(false);
    start_daemon(tls_keys(keys, sizeof keys, "ca", NULL), true);
    struct h_conn *c = h_connect_ok(&D);
    h_redis_kill(&R);
    assert_unavailable(c, "k");
    /* Killed without a TLS close: a lost connection, not a TLS fault.
     * Looked at before the restart: a reconnect that reaches the new
     * server while it is still starting may see its handshake cut. */
    ck_assert(h_wait_log(&D, "redis connection lost", 10000));
    ck_assert(!h_log_has(&D, "redis tls failed"));
    ck_assert_int_eq(h_redis_restart(&R), 0);
    ck_assert(h_wait_until(connected, c, 10000));
    h_close(c);
    assert_locks_work(&R);
}
END_TEST

/* The TLS settings of a server: its certificate, the CA, and TLS for
 * its own outgoing links (replication, Sentinel to server and to
 * Sentinel). */
static void
server_tls_args(char *buf, size_t len, const char *sep)
{
    char crt[300], key[300], ca[300];
    path(crt, sizeof crt, "server.crt");
    path(key, sizeof key, "server.key");
    path(ca, sizeof ca, "ca.crt");
    snprintf(buf, len,
             "%stls-cert-file %s%stls-key-file %s%stls-ca-cert-file %s"
             "%stls-auth-clients no%stls-replication yes",
             sep[0] == '\n' ? "" : "--", crt, sep, key, sep, ca, sep, sep);
}

/* Sentinel mode over TLS: the Sentinels, the master and its replica all
 * speak TLS only on the ports the daemon is given; discovery and a forced
 * failover work through them. */
START_TEST(test_sentinel_over_tls)
{
    char args[2048], extra[2560], keys[1024], yaml[3072];
    int stls[3];

    /* The master, and a replica that follows it over TLS. */
    server_tls_args(args, sizeof args, " --");
    tls_port = h_free_port();
    snprintf(extra, sizeof extra, "--tls-port %d %s", tls_port, args);
    ck_assert_int_eq(h_redis_start(&R, extra), 0);
    int tls_port2 = h_free_port();
    snprintf(extra, sizeof extra, "--tls-port %d %s --replicaof 127.0.0.1 %d",
             tls_port2, args, tls_port);
    ck_assert_int_eq(h_redis_start(&R2, extra), 0);
    ck_assert(h_wait_until(h_replica_linked, &R, 20000));

    server_tls_args(args, sizeof args, "\n");
    for (int i = 0; i < 3; i++) {
        stls[i] = h_free_port();
        snprintf(extra, sizeof extra, "tls-port %d\n%s\n", stls[i], args);
        ck_assert_int_eq(h_sentinel_start_ex(&S[i], tls_port, "mymaster",
                                             extra),
                         0);
    }
    ck_assert(h_sentinels_ready(S, 3, 1, 30000));

    tls_keys(keys, sizeof keys, "ca", NULL);
    snprintf(yaml, sizeof yaml,
             "redis:\n  mode: sentinel\n  timeout_ms: 500\n"
             "  addresses: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n  tls:\n    enabled: true\n%s",
             stls[0], stls[1], stls[2], keys);
    ck_assert_int_eq(h_daemon_start(&D, NULL, yaml), 0);
    struct h_conn *c = h_connect_ok(&D);
    ck_assert_msg(h_wait_master(c, tls_port, 10000), "no master found");
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "k");
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    json_decref(r);

    redisReply *f = h_redis_cmd(&S[0], "SENTINEL FAILOVER mymaster");
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(f->type == REDIS_REPLY_STATUS, "SENTINEL FAILOVER: %s",
                  f->str);
    freeReplyObject(f);
    ck_assert_msg(h_wait_master(c, tls_port2, 30000), "failover not followed");
    long long end = h_now_ms() + 10000;
    bool granted = false;
    while (!granted && h_now_ms() < end) {
        r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "after");
        granted = r != NULL && jtrue(r, "acquired");
        json_decref(r);
    }
    ck_assert_msg(granted, "no lock on the new master");
    ck_assert(!h_log_has(&D, "redis tls failed"));
    h_close(c);
}
END_TEST

/* Instances of lock.redlock holding KEY's lock (looked up on their plain
 * ports). */
static int
instances_with(const char *key)
{
    int n = 0;
    for (int i = 0; i < 3; i++) {
        if (I[i].pid != 0 &&
            h_r_int(&I[i], "EXISTS leased:lock:{%s}", key) == 1) {
            n++;
        }
    }
    return n;
}

/* A lock request with TTL_MS until its outcome is GRANTED (the daemon may
 * not have seen an instance go yet); the last reply. */
static json_t *
redlock_until(struct h_conn *c, const char *key, bool granted)
{
    long long deadline = h_now_ms() + 10000;
    for (;;) {
        json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key", key,
                            "ttl_ms", 10000);
        ck_assert_msg(r != NULL, "no answer to lock %s", key);
        bool got = h_ok(r) && jtrue(r, "acquired");
        if (got == granted || h_now_ms() > deadline) {
            return r;
        }
        if (got) {
            json_decref(
                h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", key));
        }
        json_decref(r);
        usleep(20000);
    }
}

/* The harness's Redis (redis.*) and three lock.redlock instances, all
 * speaking TLS only on the ports the daemon is given, and the daemon on
 * them. The third instance presents BAD_CERT (a certificate NAME.crt)
 * when not NULL. */
static void
start_redlock_tls(const char *bad_cert)
{
    char args[2048], extra[2560], keys[1024], yaml[3072];
    int itls[3];

    start_tls_redis(false);
    server_tls_args(args, sizeof args, " --");
    for (int i = 0; i < 3; i++) {
        itls[i] = h_free_port();
        if (i == 2 && bad_cert != NULL) {
            snprintf(extra, sizeof extra,
                     "--tls-port %d --tls-cert-file %s/%s.crt "
                     "--tls-key-file %s/%s.key --tls-ca-cert-file %s/ca.crt "
                     "--tls-auth-clients no",
                     itls[i], certs, bad_cert, certs, bad_cert, certs);
        } else {
            snprintf(extra, sizeof extra, "--tls-port %d %s", itls[i], args);
        }
        ck_assert_int_eq(h_redis_start(&I[i], extra), 0);
    }
    tls_keys(keys, sizeof keys, "ca", NULL);
    snprintf(yaml, sizeof yaml,
             "redis:\n  address: 127.0.0.1:%d\n  timeout_ms: 500\n"
             "  tls:\n    enabled: true\n%s"
             "lock:\n  redlock: [\"127.0.0.1:%d\", \"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n",
             tls_port, keys, itls[0], itls[1], itls[2]);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
}

/* Redlock over TLS: locks, waiting and wake-ups, keys on all three
 * instances and gone after unlock, granted with one instance down,
 * redis_unavailable with two down; instances that are killed are lost
 * connections, not TLS failures. */
START_TEST(test_redlock_over_tls)
{
    start_redlock_tls(NULL);
    struct h_conn *c = h_connect_ok(&D);
    ck_assert_msg(h_wait_stat(c, "redlock_instances_up", 3, 10000),
                  "the TLS instances never all came up");

    assert_locks_work(&I[0]);
    json_t *r = redlock_until(c, "a", true);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"), "lock a: %s", h_errcode(r));
    ck_assert_int_le(jint(r, "lease_ms"), 10000 - (10000 / 100 + 2));
    json_decref(r);
    ck_assert_int_eq(instances_with("a"), 3);
    /* The lock lives on the instances, not on redis.*. */
    ck_assert_int_eq(h_r_int(&R, "EXISTS leased:lock:{a}"), 0);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", "a");
    ck_assert(h_ok(r) && jtrue(r, "released"));
    json_decref(r);
    ck_assert_int_eq(instances_with("a"), 0);
    /* Every handshake so far verified. Past this point an instance is
     * killed, and a reconnect that meets it dying fails in its handshake,
     * which is logged as a TLS failure too. */
    ck_assert(!h_log_has(&D, "redis tls failed"));

    h_redis_kill(&I[2]);
    r = redlock_until(c, "b", true);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"),
                  "not granted with one instance down: %s", h_errcode(r));
    json_decref(r);
    ck_assert_int_eq(instances_with("b"), 2);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", "b");
    ck_assert(h_ok(r) && jtrue(r, "released"));
    json_decref(r);
    ck_assert_int_eq(instances_with("b"), 0);

    h_redis_kill(&I[1]);
    r = redlock_until(c, "c", false);
    h_expect_code(r, "redis_unavailable", "lock with two instances down");
    h_close(c);
}
END_TEST

/* An instance whose certificate does not verify counts as down: the
 * other two still grant, and the log names the reason. */
START_TEST(test_redlock_tls_instance_refused)
{
    make_cert("stranger_server", "localhost", "other",
              "DNS:localhost,IP:127.0.0.1");
    start_redlock_tls("stranger_server");
    struct h_conn *c = h_connect_ok(&D);
    ck_assert(h_wait_log(&D, "certificate verify failed", T_MS));
    json_t *r = redlock_until(c, "a", true);
    ck_assert_msg(h_ok(r) && jtrue(r, "acquired"),
                  "not granted by the two verified instances: %s",
                  h_errcode(r));
    json_decref(r);
    ck_assert_int_eq(instances_with("a"), 2);
    ck_assert_int_eq(h_r_int(&I[2], "EXISTS leased:lock:{a}"), 0);
    ck_assert_int_eq(h_stat(c, "redlock_instances_up"), 2);
    h_close(c);
}
END_TEST

/* leased -t reads the key files: each problem is named. */
START_TEST(test_bad_files_refused)
{
    static const struct {
        const char *keys;
        const char *says;
    } cases[] = {
        {"    ca_file: @/missing.crt\n", "redis.tls.ca_file"},
        {"    ca_file: @/ca.crt\n    cert_file: @/client.crt\n",
         "go together"},
        {"    ca_file: @/ca.crt\n    cert_file: @/client.crt\n"
         "    key_file: @/server.key\n",
         "redis.tls.key_file"},
        {"    ca_file: @/ca.crt\n    cert_file: @/ca.key\n"
         "    key_file: @/client.key\n",
         "redis.tls.cert_file"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char conf[300], keys[1024], *o = keys, out[4096], err[4096];
        for (const char *p = cases[i].keys; *p; p++) {
            if (*p == '@') {
                o += sprintf(o, "%s", certs);
            } else {
                *o++ = *p;
            }
        }
        *o = '\0';
        path(conf, sizeof conf, "bad.yml");
        FILE *f = fopen(conf, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "redis:\n  tls:\n    enabled: true\n%s", keys);
        fclose(f);
        const char *argv[] = {h_leased_bin(), "-t", "-c", conf, NULL};
        int rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
        ck_assert_msg(rc == 1, "case %zu: leased -t exited %d", i, rc);
        ck_assert_msg(strstr(err, cases[i].says) != NULL,
                      "case %zu: '%s' not in: %s", i, cases[i].says, err);
    }
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(ops_over_tls, 60),
        H_CASE(other_ca_refused, 60),
        H_CASE(name_mismatch_refused, 60),
        H_CASE(server_name_used, 60),
        H_CASE(mutual_tls, 60),
        H_CASE(cert_expiry_metric, 60),
        H_CASE(mutual_tls_missing_cert, 60),
        H_CASE(mutual_tls_wrong_cert, 60),
        H_CASE(verify_false_warns, 60),
        H_CASE(no_plain_fallback, 60),
        H_CASE(restart_reconnects, 60),
        H_CASE(bad_files_refused, 60),
        H_CASE(sentinel_over_tls, 120),
        H_CASE(redlock_over_tls, 120),
        H_CASE(redlock_tls_instance_refused, 120),
    };
    return H_MAIN(fx, cases);
}
