#ifndef LD_HARNESS_H
#define LD_HARNESS_H

/* Integration test harness: real redis-server processes on free loopback
 * ports, the real leased binary, and protocol connections. Everything
 * started is tracked by pid and killed at exit (also when a test fails or
 * aborts), and its temporary directory removed. Binaries come from the
 * environment set by make check: LEASED_BIN, REDIS_SERVER, LEASECTL_BIN. */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <check.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

struct h_redis {
    pid_t pid;
    int port;
    char dir[256];   /* its own temp dir (config, dump, log) */
    char extra[512]; /* extra redis-server arguments, for restart */
};

struct h_daemon {
    pid_t pid;
    char dir[256];  /* temp dir: socket, config, journal, log */
    char sock[300]; /* Unix socket path */
    char conf[300]; /* config file path */
    char log[300];  /* stderr of the daemon */
    char journal[300];
    int tcp_port;          /* read from stats after start */
    int metrics_port;      /* 0 unless metrics were enabled */
    char yaml_extra[4096]; /* kept for restarts */
    int redis_port;
};

/* Protocol connection (blocking socket, line buffered). Events received
 * while waiting for a reply are queued for h_event. */
struct h_conn;

/* --- redis-server --------------------------------------------------- */
/* Start on a free port; EXTRA_ARGS (may be NULL) are appended, e.g.
 * "--replicaof 127.0.0.1 1234". Waits until PING answers. Returns 0. */
int h_redis_start(struct h_redis *r, const char *extra_args);
/* Same port again (after h_redis_kill), waits for PING. */
int h_redis_restart(struct h_redis *r);
void h_redis_kill(struct h_redis *r);            /* SIGKILL, reaped */
void h_redis_signal(struct h_redis *r, int sig); /* SIGSTOP/SIGCONT */
void h_redis_stop(struct h_redis *r);            /* kill + remove dir */
/* A Sentinel (redis-server --sentinel) on a free port, kept in an h_redis
 * so that h_redis_cmd, h_redis_kill and h_redis_stop serve it too. With
 * NAME it monitors the master on MASTER_PORT under that name (quorum 2,
 * down-after 1000 ms, failover-timeout 3000 ms); with NAME NULL it
 * monitors nothing. Waits until it answers. Returns 0, or -1. */
int h_sentinel_start(struct h_redis *s, int master_port, const char *name);
/* The same with EXTRA_CONF (lines of sentinel.conf, e.g. its TLS
 * settings) appended; a "requirepass" there is also sent by h_redis_cmd
 * and the like. */
int h_sentinel_start_ex(struct h_redis *s, int master_port, const char *name,
                        const char *extra_conf);

/* Wait up to TIMEOUT_MS until each of the N Sentinels S sees the N - 1
 * others and REPLICAS replicas of "mymaster" (a failover can then be
 * agreed on); returns whether they did. */
bool h_sentinels_ready(struct h_redis *s, int n, int replicas, int timeout_ms);

/* Wait up to TIMEOUT_MS until the daemon's stats name 127.0.0.1:PORT as
 * its Redis master (redis_master); returns whether they did. */
bool h_wait_master(struct h_conn *c, int port, int timeout_ms);

/* A direct synchronous connection for checks from the test (it sends AUTH
 * when the server was started with --requirepass in its extra args). */
redisContext *h_redis_connect(const struct h_redis *r);
/* Run a command directly (printf-style like redisCommand); returns reply
 * (caller frees with freeReplyObject) or NULL. Opens and closes a
 * connection each time. */
redisReply *h_redis_cmd(const struct h_redis *r, const char *fmt, ...);
/* A direct connection to the server that holds KEY: R's own, or on a
 * cluster (see h_on_cluster) the master of KEY's slot. For a test that
 * keeps one connection for many commands on keys of one slot. */
redisContext *h_redis_connect_for(const struct h_redis *r, const char *key);
/* The same with a va_list. */
redisReply *h_redis_vcmd(const struct h_redis *r, const char *fmt, va_list ap);

/* --- leased ---------------------------------------------------------- */
/* Write a config (listen.unix in its temp dir, listen.tcp 127.0.0.1:0,
 * metrics.listen "", journal in its dir, redis.address of R, log level
 * debug) followed by YAML_EXTRA (whole top-level sections such as
 * "lock:\n  watchdog_ms: 600\n"; a section named there replaces the
 * harness's own section of the same name), start leased -f -c, wait until
 * it answers ping on the socket, and read tcp_port from stats.
 * Every "@DIR@" in YAML_EXTRA becomes the daemon's temp dir, so a test
 * that replaces the listen section keeps the socket there:
 * "listen:\n  unix: @DIR@/leased.sock\n  tcp: 127.0.0.1:0\n  ...".
 * R may be NULL: redis.address then points at a closed port. Start-up
 * failures print the daemon's log. Returns 0, or -1. */
int h_daemon_start(struct h_daemon *d, const struct h_redis *r,
                   const char *yaml_extra);
/* Like h_daemon_start, but pass LISTEN_FD to leased as fd 3 the way
 * systemd socket activation does (LISTEN_FDS=1, LISTEN_PID), and use
 * SOCK_PATH (the path LISTEN_FD is bound to) as d->sock for readiness and
 * h_connect. The configured listen.unix stays in the daemon's dir. */
int h_daemon_start_fd(struct h_daemon *d, const struct h_redis *r,
                      const char *yaml_extra, int listen_fd,
                      const char *sock_path);
/* Start again with the same dir, socket, journal and config. */
int h_daemon_restart(struct h_daemon *d);
/* SIGTERM and wait (bounded); returns the exit status (as from waitpid's
 * WEXITSTATUS) or -1 when it had to be killed. */
int h_daemon_stop(struct h_daemon *d);
/* (A daemon that died of a signal by itself gives 128 + the signal.) */
/* Wait (no signal sent) up to TIMEOUT_MS for the daemon to exit on its
 * own; the exit status as h_daemon_stop, or -1 if still running. */
int h_daemon_wait(struct h_daemon *d, int timeout_ms);
void h_daemon_kill(struct h_daemon *d);    /* SIGKILL, reaped */
void h_daemon_cleanup(struct h_daemon *d); /* stop if running, rm dir */
void h_daemon_signal(struct h_daemon *d, int sig);
/* Print the daemon's log to stderr (called on test failure). */
void h_daemon_dump_log(const struct h_daemon *d);
/* Whether a line of the daemon's log holds NEEDLE; h_wait_log waits up
 * to TIMEOUT_MS for one to. */
bool h_log_has(const struct h_daemon *d, const char *needle);
bool h_wait_log(const struct h_daemon *d, const char *needle, int timeout_ms);

/* --- protocol -------------------------------------------------------- */
struct h_conn *h_connect(const struct h_daemon *d); /* Unix */
struct h_conn *h_connect_tcp(const struct h_daemon *d);
void h_close(struct h_conn *c);
int h_send_raw(struct h_conn *c, const char *bytes, size_t len);
/* Send the N requests of REQS (stolen) in one write, with ids FIRST_ID,
 * FIRST_ID + 1, ...: a pipeline the daemon reads in one turn. */
int h_send_all(struct h_conn *c, json_t **reqs, int n, json_int_t first_id);
/* Half-close: no more requests, but replies are still read. */
int h_shutdown_write(struct h_conn *c);
/* Send one JSON line built from FMT (jansson json_pack format). */
int h_send(struct h_conn *c, const char *fmt, ...);
/* Next reply line (not an event), waiting up to TIMEOUT_MS; NULL on
 * timeout or EOF. */
json_t *h_recv(struct h_conn *c, int timeout_ms);
/* Send REQ (stolen) with a fresh numeric id and wait up to TIMEOUT_MS for
 * the reply with that id (replies with other ids are kept for later
 * h_recv_id). */
json_t *h_call(struct h_conn *c, json_t *req, int timeout_ms);
/* h_call with a json_pack format: h_callf(c, 2000, "{s:s,s:s}", "op",
 * "lock", "key", "k"). */
json_t *h_callf(struct h_conn *c, int timeout_ms, const char *fmt, ...);
json_t *h_recv_id(struct h_conn *c, json_int_t id, int timeout_ms);
/* Next unsolicited event, waiting up to TIMEOUT_MS; NULL on timeout. */
json_t *h_event(struct h_conn *c, int timeout_ms);
/* True once the peer closed (read returns EOF within TIMEOUT_MS). */
bool h_wait_closed(struct h_conn *c, int timeout_ms);

/* --- one fixture, one main ------------------------------------------- */
/* A test program declares its servers and daemons once (its own
 * variables, listed here) and a table of cases; the harness zeroes them
 * before every case and stops them after it, so no program keeps its own
 * setup, teardown or Check runner. */
#define H_MAX_REDIS 2
#define H_MAX_DAEMONS 2

struct h_fixture {
    const char *suite;                  /* the Check suite's name */
    struct h_redis *redis[H_MAX_REDIS]; /* NULL-terminated if fewer */
    struct h_daemon *daemons[H_MAX_DAEMONS];
    /* When set, every case starts with redis[0] running and daemons[0]
     * started on it with this YAML (see h_daemon_start). */
    const char *start_yaml;
    /* Run after the harness's setup and before its teardown, in the test
     * process; either may be NULL. */
    void (*setup)(void);
    void (*teardown)(void);
};

struct h_case {
    const char *name;
    const TTest *test;
    int timeout_s; /* generous enough for a loaded machine */
};

/* A case whose name is its test's without "test_". */
#define H_CASE(name, timeout_s)                                               \
    {                                                                         \
#name, test_##name, (timeout_s)                                       \
    }

/* Run CASES (N of them) with FX's fixture around each, one TCase per case
 * (see h_add_test), as make check wants it; returns the exit status. */
int h_main(const struct h_fixture *fx, const struct h_case *cases, size_t n);
#define H_MAIN(fx, cases)                                                     \
    h_main(&(fx), (cases), sizeof(cases) / sizeof((cases)[0]))

/* Start the fixture's redis[0] and daemons[0] on it with YAML_EXTRA (see
 * h_daemon_start); for a case that picks its daemon's configuration. */
void h_start(const char *yaml_extra);

/* The building blocks of h_main. One test case per test, with the
 * harness's per-case log collection (see h_case_setup) around the checked
 * fixtures SETUP and TEARDOWN (either may be NULL). */
void h_add_test(Suite *s, const char *name, const TTest *t, int timeout_s,
                SFun setup, SFun teardown);
/* Run the suite as make check wants it (CK_ENV, so CK_VERBOSITY and
 * CK_RUN_CASE apply) and return the process exit status. */
int h_run_suite(Suite *s);

/* --- helpers --------------------------------------------------------- */
/* Poll COND every few ms until true or TIMEOUT_MS; returns its last
 * value. */
bool h_wait_until(bool (*cond)(void *), void *arg, int timeout_ms);
long long h_now_ms(void);
/* Integer field of a stats reply ("locks_held", ...); -1 if absent. */
long long h_stat(struct h_conn *c, const char *name);
/* Shorthand checks on reply objects. */
bool h_ok(const json_t *reply);
const char *h_errcode(const json_t *reply); /* NULL when ok */
/* A free loopback TCP port. */
int h_free_port(void);
/* Register a pid to be SIGKILLed at exit (for extra child processes). */
void h_track_pid(pid_t pid);
void h_untrack_pid(pid_t pid);
/* $LEASED_BIN (or "src/leased"). */
const char *h_leased_bin(void);
/* The source tree ($LD_SRCDIR, else "."): where the clients' files are. */
const char *h_srcdir(void);
/* Run ARGV (NULL-terminated; argv[0] a path or a name in $PATH) under a
 * deadline, capturing stdout into OUT and stderr into ERR (each may be
 * NULL; NUL-terminated, truncated to fit). Returns the exit status, 128 +
 * signal if it died of one, or -1 when it was killed at TIMEOUT_MS. */
int h_run(const char *const argv[], char *out, size_t outlen, char *err,
          size_t errlen, int timeout_ms);
/* A fresh temp dir (tracked: removed at exit) and its recursive removal. */
int h_tmpdir(char *buf, size_t len);
void h_rmdir(const char *path);

/* --- shared checks ---------------------------------------------------- */
/* Fields of a reply: integer (0 if absent), true, string (NULL). */
long long jint(const json_t *o, const char *k);
bool jtrue(const json_t *o, const char *k);
const char *jstr(const json_t *o, const char *k);
/* error.reason, error.message, error.outcome of a reply (NULL if absent). */
const char *jreason(const json_t *r);
const char *jmsg(const json_t *r);
const char *joutcome(const json_t *r);
/* h_connect that must succeed. */
struct h_conn *h_connect_ok(const struct h_daemon *d);
/* A ping that must answer ok within 5 s. */
void h_assert_ping(struct h_conn *c);
/* Assert R (freed here) is error CODE; WHAT names the request. */
void h_expect_code(json_t *r, const char *code, const char *what);
/* Wait up to TIMEOUT_MS for stats figure NAME to equal WANT; returns
 * whether it did. h_assert_stat asserts it. */
bool h_wait_stat(struct h_conn *c, const char *name, long long want,
                 int timeout_ms);
void h_assert_stat(struct h_conn *c, const char *name, long long want,
                   int timeout_ms);
/* The same for "at least WANT". */
bool h_wait_stat_min(struct h_conn *c, const char *name, long long want,
                     int timeout_ms);
/* The next lock_lost event for KEY (other events are dropped), or NULL
 * after TIMEOUT_MS. */
json_t *h_lock_lost(struct h_conn *c, const char *key, int timeout_ms);
/* A Redis command from the test: its integer (or integer-looking string)
 * reply, -999 otherwise; h_r_do asserts it did not fail. */
long long h_r_int(const struct h_redis *r, const char *fmt, ...);
void h_r_do(const struct h_redis *r, const char *fmt, ...);
/* Field FIELD (v, n, l, s, d, g or r) of the cache entry at Redis key
 * KEY, in either layout (a hash; or under cache.layout 2 a value or null
 * alone as a string), copied into BUF; false when the entry has none. */
bool h_entry_field(const struct h_redis *r, const char *key, char field,
                   char *buf, size_t len);
/* Assert that Redis key KEY is of TYPE ("hash", "string", "none"...). */
void h_assert_type(const struct h_redis *r, const char *key, const char *type);
/* Write VALUE (LEN bytes) into the cache entry at Redis key KEY behind
 * the daemons' backs, as a hash field v under layout 1, as the string of
 * a value of version 1 under cache.layout 2 (H_CACHE_LAYOUT), keeping
 * the key's TTL. */
void h_entry_write(const struct h_redis *r, const char *key, const char *value,
                   size_t len);
/* The command a cache.get hit costs Redis, as INFO commandstats names it:
 * a GET of the entry's string under cache.layout 2, an HMGET else. */
#if defined(H_CACHE_LAYOUT) && H_CACHE_LAYOUT == 2
#define H_CACHE_PROBE "get"
#else
#define H_CACHE_PROBE "hmget"
#endif
/* The Redis type of an entry holding a value or a null alone. */
#if defined(H_CACHE_LAYOUT) && H_CACHE_LAYOUT == 2
#define H_CACHE_ENTRY_TYPE "string"
#else
#define H_CACHE_ENTRY_TYPE "hash"
#endif
/* Wait up to TIMEOUT_MS until Redis counts a subscriber on CHANNEL (a
 * message published earlier is lost to the subscriber), and assert it. */
void h_wait_subscribed(const struct h_redis *r, const char *channel,
                       int timeout_ms);
/* A lock token as leased makes them: 32 or more lowercase hex digits. */
bool h_is_token(const char *t);
/* Delete KEY's lock record (either layout) behind the daemon's back, and
 * assert there was one. */
void h_delete_lock_key(const struct h_redis *r, const char *key);
/* True once R has one replica, online (for h_wait_until, ARG is R). */
bool h_replica_linked(void *r);

/* --- logs of failed tests -------------------------------------------- */
/* Check (fork mode) ends a failed test with _exit(), so no teardown in the
 * test process runs and children die by PDEATHSIG. To still see their
 * logs, wire each TCase (one test per TCase) like this:
 *   tcase_add_unchecked_fixture(tc, h_case_setup, h_case_teardown);
 *   tcase_add_checked_fixture(tc, NULL, h_case_passed);
 * h_case_setup points $TMPDIR at a fresh case dir, so every temp dir the
 * harness makes during the test lands inside it; h_case_passed (reached
 * only when the test body returned) marks it; h_case_teardown, back in
 * the runner process, prints every *.log in it unless marked, and
 * removes it. */
void h_case_setup(void);
void h_case_passed(void);
void h_case_teardown(void);

/* --- Redis Cluster ------------------------------------------------------ */
#define H_CLUSTER_MAX 6

/* MASTERS masters, each with one replica, on free loopback ports
 * (cluster-enabled, node timeout 1000 ms, a replica may always take over),
 * made with redis-cli --cluster create. node[i] are the servers as
 * started (masters first); which is master now is asked of the cluster. */
struct h_cluster {
    struct h_redis node[H_CLUSTER_MAX];
    int n;
    int tls_port[H_CLUSTER_MAX]; /* h_cluster_start_tls */
};
/* Start it and wait until every node reports cluster_state:ok. 0, or -1
 * (logs printed). */
int h_cluster_start(struct h_cluster *cl, int masters);
/* The same with EXTRA_ARGS (may be NULL) for every redis-server, e.g.
 * "--cluster-require-full-coverage no". */
int h_cluster_start_ex(struct h_cluster *cl, int masters,
                       const char *extra_args);
void h_cluster_stop(struct h_cluster *cl);
/* Wait up to TIMEOUT_MS until every live node reports cluster_state:ok
 * and agrees on the slots' masters. */
bool h_cluster_ok(struct h_cluster *cl, int timeout_ms);
/* The index in node[] of the master serving SLOT now, as a live node
 * says (-1 when none answers). */
int h_cluster_master_of_slot(struct h_cluster *cl, int slot);
/* The hash slot of KEY (CLUSTER KEYSLOT). */
int h_cluster_keyslot(struct h_cluster *cl, const char *key);
/* The index of a replica of master I (-1 if none). */
int h_cluster_replica_of(struct h_cluster *cl, int i);
/* Node I's cluster id (CLUSTER MYID) in BUF. */
void h_cluster_id(struct h_cluster *cl, int i, char *buf, size_t len);
/* "redis:\n  mode: cluster\n  addresses: [...]\n" with the first two
 * nodes as seeds, then EXTRA (more keys of the redis section). */
void h_cluster_yaml(const struct h_cluster *cl, const char *extra, char *buf,
                    size_t len);
/* A cluster whose nodes also serve TLS (tls-cluster yes, so CLUSTER SLOTS
 * names their TLS ports to TLS clients) with the certificates of
 * h_test_certs in DIR; node[i].port stays plain for the harness's own
 * checks, tls_port[i] is the TLS one. */
int h_cluster_start_tls(struct h_cluster *cl, int masters, const char *dir);
/* In DIR: ca.crt (a fresh CA) and server.crt/server.key signed by it for
 * localhost and 127.0.0.1. 0, or -1. */
int h_test_certs(const char *dir);

/* J as compact JSON for a failure message ("(null)" for NULL); the text
 * stays valid until the next call. */
const char *h_dump(const json_t *j);
/* R, which must be an ok reply (else the test fails, showing it). */
json_t *h_must(json_t *r);

/* Wait until daemon D is connected to N of its lock.redlock instances
 * (they connect on their own, after the harness saw redis.*). */
void h_wait_redlock(const struct h_daemon *d, int n);

/* The body of GET /metrics on the daemon's metrics PORT (malloc'd, at
 * most H_METRICS_MAX bytes with the headers); the reply must be a 200. */
#define H_METRICS_MAX (1 << 20)
char *h_get_metrics(int port);

/* A connected Unix socket to PATH as a bare descriptor: nothing reads
 * from it behind the test's back, unlike an h_conn. */
int h_raw_unix(const char *path);

/* DEBUG SLEEP SECS on R (started with --enable-debug-command yes), sent
 * from a connection of its own; returns once R has stopped answering a
 * PING. Give the result to h_redis_sleep_end, which waits until the
 * sleep is over and R answers again. */
redisContext *h_redis_sleep_start(const struct h_redis *r, double secs);
void h_redis_sleep_end(redisContext *c);

/* --- the shared scenarios on a cluster ------------------------------- */
/* tests/integration/run_on_cluster starts one cluster of 3 masters and 3
 * replicas for a whole test program and names its nodes in
 * $LD_TEST_CLUSTER ("127.0.0.1:PORT,..."). The program then runs its
 * cases unchanged against it: h_start, and h_redis_start of the fixture's
 * redis[0] without extra arguments, start no redis-server but point that
 * h_redis at the cluster after flushing every master (FLUSHALL, SCRIPT
 * FLUSH, CONFIG RESETSTAT); leased gets redis.mode: cluster with every
 * node as a seed (also where a test's own redis section names that
 * h_redis's address); h_redis_cmd, h_r_int and h_r_do on it follow MOVED
 * and ASK to the master of the key's slot, split MSET, DEL, UNLINK,
 * EXISTS and TOUCH across slots into one command per key, send
 * FLUSHALL, FLUSHDB, SCRIPT FLUSH, DBSIZE, CONFIG RESETSTAT and CLIENT
 * PAUSE/UNPAUSE to every master (integer replies summed), and answer
 * INFO with the masters' integers summed;
 * h_wait_subscribed counts classic and sharded subscribers on every
 * node. Cases that cannot mean the same there (they kill "the" Redis,
 * start one of their own, read one server's INFO ...) are named, with
 * the reason, in one list in harness.c and skipped, saying so, on the
 * cluster only. There h_redis_kill and h_redis_restart of that h_redis
 * fail the case, and its pid is 0: a case that signals it itself
 * (SIGSTOP) must be in the list. */
/* Whether this program runs on such a cluster. */
bool h_on_cluster(void);

#endif
