/* A hostile Redis and hostile clients against the daemon's memory: a
 * server that announces huge replies (the daemon refuses them and stays
 * small), replies owed before they arrive (dispatch pauses), and
 * limits.max_memory_bytes (busy for new work, the rest still served)
 * and clients that flood the daemon with requests for large values
 * without reading (RSS stays bounded, others are served within
 * milliseconds). Every test starts its own servers and leased. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 5000

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "hostile",
    .redis = {&R},
    .daemons = {&D},
};

/* ---- helpers ---------------------------------------------------------- */

static void
raw_write(int fd, const char *buf, size_t len)
{
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        ck_assert_msg(n > 0, "send: %s", strerror(errno));
        off += (size_t)n;
    }
}

static long long
rss_kb(pid_t pid)
{
    char path[64], line[256];
    long long kb = -1;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kb = atoll(line + 6);
            break;
        }
    }
    fclose(f);
    return kb;
}

/* Commands Redis has run so far (INFO stats). */
static long long
redis_commands(void)
{
    redisReply *r = h_redis_cmd(&R, "INFO stats");
    long long n = -1;

    if (r != NULL && r->type == REDIS_REPLY_STRING) {
        const char *p = strstr(r->str, "total_commands_processed:");
        if (p != NULL) {
            n = atoll(p + strlen("total_commands_processed:"));
        }
    }
    if (r != NULL) {
        freeReplyObject(r);
    }
    return n;
}

/* A sanitizer build keeps freed memory in quarantine (256 MB by default),
 * which would hide what the daemon itself holds: keep it small. */
static void
small_asan_quarantine(void)
{
    const char *old = getenv("ASAN_OPTIONS");
    char buf[1024];

    snprintf(buf, sizeof buf, "%s%squarantine_size_mb=8", old ? old : "",
             old && *old ? ":" : "");
    setenv("ASAN_OPTIONS", buf, 1);
}

static void
set_value(struct h_conn *c, const char *key, size_t len, char fill)
{
    char *value = malloc(len + 1);
    json_t *r;

    memset(value, fill, len);
    value[len] = '\0';
    r = h_callf(c, 30000, "{s:s,s:s,s:s}", "op", "cache.set", "key", key,
                "value", value);
    ck_assert_msg(h_ok(r), "cache.set %s: %s", key, h_errcode(r));
    json_decref(r);
    free(value);
}

/* ---- 1. a hostile Redis -------------------------------------------------
 * A server on a loopback port that answers the handshake as Redis does and
 * every command about the test's key ("{k}") with HOSTILE, then, for a
 * bulk header, streams filler bytes until the daemon hangs up. The
 * daemon's own commands (its look at the due set after each connect) get
 * an empty answer: were they hostile too, each reconnect would draw the
 * next drop, and whether the test's request met a connection or none
 * would depend on timing. It runs in a child process. */

static bool
names_test_key(const redisReply *cmd)
{
    for (size_t i = 1; i < cmd->elements; i++) {
        if (cmd->element[i]->type == REDIS_REPLY_STRING &&
            strstr(cmd->element[i]->str, "{k}") != NULL) {
            return true;
        }
    }
    return false;
}

static void
fake_answer(int fd, redisReply *cmd, const char *hostile, size_t stream)
{
    const char *name = cmd->element[0]->str;
    char buf[65536];

    if (strcasecmp(name, "CLIENT") == 0 || strcasecmp(name, "SELECT") == 0 ||
        strcasecmp(name, "AUTH") == 0) {
        (void)!write(fd, "+OK\r\n", 5);
        return;
    }
    if (strcasecmp(name, "PING") == 0) {
        (void)!write(fd, "+PONG\r\n", 7);
        return;
    }
    if (strcasecmp(name, "SCRIPT") == 0) {
        static const char sha[] =
            "$40\r\n0123456789abcdef0123456789abcdef01234567\r\n";
        (void)!write(fd, sha, sizeof sha - 1);
        return;
    }
    if (strcasecmp(name, "SUBSCRIBE") == 0) {
        for (size_t i = 1; i < cmd->elements; i++) {
            int n = snprintf(buf, sizeof buf,
                             "*3\r\n$9\r\nsubscribe\r\n$%zu\r\n%s\r\n:%zu\r\n",
                             cmd->element[i]->len, cmd->element[i]->str, i);
            (void)!write(fd, buf, (size_t)n);
        }
        return;
    }
    if (!names_test_key(cmd)) {
        (void)!write(fd, "*0\r\n", 4);
        return;
    }
    (void)!write(fd, hostile, strlen(hostile));
    memset(buf, 'x', sizeof buf);
    for (size_t sent = 0; sent < stream;) {
        ssize_t n = write(fd, buf, sizeof buf);
        if (n <= 0) {
            return; /* the daemon hung up */
        }
        sent += (size_t)n;
    }
}

static void
fake_redis_run(int lfd, const char *hostile, size_t stream)
{
    struct pollfd p[16];
    redisReader *rd[16];
    int n = 1;

    p[0].fd = lfd;
    p[0].events = POLLIN;
    for (;;) {
        if (poll(p, (nfds_t)n, -1) < 0) {
            continue;
        }
        if ((p[0].revents & POLLIN) && n < 16) {
            int c = accept(lfd, NULL, NULL);
            if (c >= 0) {
                p[n].fd = c;
                p[n].events = POLLIN;
                p[n].revents = 0;
                rd[n] = redisReaderCreate();
                n++;
            }
        }
        for (int i = 1; i < n; i++) {
            char buf[65536];
            ssize_t got;
            void *r = NULL;

            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                continue;
            }
            got = read(p[i].fd, buf, sizeof buf);
            if (got <= 0) {
                close(p[i].fd);
                redisReaderFree(rd[i]);
                p[i] = p[n - 1];
                rd[i] = rd[n - 1];
                n--;
                i--;
                continue;
            }
            redisReaderFeed(rd[i], buf, (size_t)got);
            while (redisReaderGetReply(rd[i], &r) == REDIS_OK && r != NULL) {
                redisReply *cmd = r;
                if (cmd->type == REDIS_REPLY_ARRAY && cmd->elements > 0 &&
                    cmd->element[0]->type == REDIS_REPLY_STRING) {
                    fake_answer(p[i].fd, cmd, hostile, stream);
                }
                freeReplyObject(r);
            }
        }
    }
}

/* Start the fake Redis in a child; R.port is where it listens (R.pid
 * stays 0: the harness does not own it, the test kills it). */
static pid_t
fake_redis_start(const char *hostile, size_t stream)
{
    struct sockaddr_in sa;
    int one = 1;
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(lfd, 0);
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(lfd, 16), 0);
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    memset(&R, 0, sizeof R);
    R.port = ntohs(sa.sin_port);

    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        signal(SIGPIPE, SIG_IGN);
        fake_redis_run(lfd, hostile, stream);
        _exit(0);
    }
    close(lfd);
    h_track_pid(pid);
    return pid;
}

static void
fake_redis_stop(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    h_untrack_pid(pid);
}

/* One hostile reply: the client's cache.get fails with CODE (the
 * connection is dropped), the refusal is logged, the daemon's RSS does
 * not follow what the server announces or sends, and it still answers. */
static void
hostile_case(const char *hostile, size_t stream, const char *code,
             const char *logged)
{
    struct h_conn *c;
    json_t *r;
    long long rss0, rss1;

    small_asan_quarantine();
    pid_t pid = fake_redis_start(hostile, stream);
    char yaml[256];
    /* A redis section replaces the harness's: the address goes too. */
    snprintf(yaml, sizeof yaml,
             "limits:\n  max_output_bytes: 1048576\n"
             "redis:\n  address: \"127.0.0.1:%d\"\n  connections: 1\n",
             R.port);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    c = h_connect_ok(&D);
    rss0 = rss_kb(D.pid);
    r = h_callf(c, 30000, "{s:s,s:s,s:b}", "op", "cache.get", "key", "k",
                "lease", 0);
    ck_assert_ptr_nonnull(r);
    if (h_ok(r)) {
        char *dump = json_dumps(r, JSON_COMPACT);
        h_daemon_dump_log(&D);
        ck_abort_msg("a hostile reply was taken as an answer: %s", dump);
    }
    ck_assert_str_eq(h_errcode(r), code);
    json_decref(r);
    ck_assert_msg(h_wait_log(&D, "redis reply refused", T_MS),
                  "the refusal was not logged");
    ck_assert_msg(h_log_has(&D, logged), "log lacks \"%s\"", logged);
    rss1 = rss_kb(D.pid);
    fprintf(stderr, "hostile reply: rss %lld kB before, %lld kB after\n", rss0,
            rss1);
    ck_assert_msg(rss1 - rss0 < 32 * 1024, "RSS grew by %lld kB", rss1 - rss0);
    h_assert_ping(c);
    h_close(c);
    fake_redis_stop(pid);
}

/* An array header of two billion elements: hiredis alone would allocate
 * 16 GB for it before the first element. */
START_TEST(test_hostile_array_header)
{
    hostile_case("*2147483647\r\n", 0, "redis_unavailable",
                 "array of 2147483647 elements");
}
END_TEST

/* A bulk string of a gigabyte, then 200 MB of it: the daemon stops
 * buffering at its bound (about max_output_bytes) and hangs up. */
START_TEST(test_hostile_bulk)
{
    hostile_case("*2\r\n$3\r\nhit\r\n$1000000000\r\n", 200u << 20,
                 "redis_unavailable", "of one reply buffered");
}
END_TEST

/* Two replies to one command: the first, of the wrong shape, is an
 * internal error for the client; the second answers nothing, and the
 * connection it came on is dropped before it could be taken for the
 * answer to a later command. */
START_TEST(test_hostile_extra_reply)
{
    hostile_case(":1\r\n:1\r\n", 0, "internal", "a reply to no command");
}
END_TEST

/* ---- 2. replies owed ---------------------------------------------------- */

static bool
paused_full(void *arg)
{
    struct h_conn *c = arg;
    return h_stat(c, "requests_pending") == 1 &&
           h_stat(c, "session_buffer_bytes") > 1000 * 1000;
}

/* Replies owed count before they arrive: a client that pipelines reads
 * of many distinct large values without reading gets no more of them
 * sent to Redis than the output limit leaves room for (each its own
 * fetch), not its whole
 * pipeline; a client that reads gets every answer. */
START_TEST(test_owed_output)
{
    const int nkeys = 150;
    size_t cap = (size_t)nkeys * 80, len = 0;
    char *pipeline = malloc(cap), key[32];
    struct h_conn *c;
    int fd;

    h_start("limits:\n  max_output_bytes: 4194304\n");
    c = h_connect_ok(&D);
    for (int i = 0; i < nkeys; i++) {
        snprintf(key, sizeof key, "ow%03d", i);
        set_value(c, key, 100 * 1000, 'o');
        len += (size_t)snprintf(pipeline + len, cap - len,
                                "{\"op\":\"cache.get\",\"key\":\"%s\","
                                "\"lease\":false,\"id\":%d}\n",
                                key, i + 1);
    }

    long long cmds0 = redis_commands();
    fd = h_raw_unix(D.sock);
    raw_write(fd, pipeline, len);
    /* It stops at half of the limit with nothing in flight (the stats
     * request itself is the one pending). */
    ck_assert_msg(h_wait_until(paused_full, c, T_MS * 2),
                  "the session that does not read did not pause: %lld "
                  "bytes buffered, %lld requests pending",
                  h_stat(c, "session_buffer_bytes"),
                  h_stat(c, "requests_pending"));
    h_assert_ping(c);
    long long cmds = redis_commands() - cmds0;
    fprintf(stderr, "owed_output: %lld Redis commands for %d reads\n", cmds,
            nkeys);
    /* 16 dispatched blind, those the first replies leave room for, and
     * the INFO of redis_commands itself. */
    ck_assert_msg(cmds <= 16 + 24, "Redis ran %lld commands", cmds);
    close(fd);

    /* A client that reads is paused and resumed as often as needed. */
    struct h_conn *reader = h_connect_ok(&D);
    ck_assert_int_eq(h_send_raw(reader, pipeline, len), 0);
    for (int i = 1; i <= nkeys; i++) {
        json_t *r = h_recv_id(reader, i, T_MS * 2);
        ck_assert_msg(r != NULL, "no answer to %d", i);
        ck_assert_msg(h_ok(r) && jtrue(r, "hit"), "answer %d: %s", i,
                      h_errcode(r));
        json_decref(r);
    }
    h_close(reader);
    h_close(c);
    free(pipeline);
}
END_TEST

/* ---- 3. limits.max_memory_bytes ----------------------------------------- */

/* A client that does not read its replies fills its output past
 * limits.max_memory_bytes: from then on ops that add work get busy and
 * the others are served; once that client is gone, work is taken again. */
START_TEST(test_memory_limit_busy)
{
    const int nreq = 60; /* 6 MB of replies: under the output limit */
    char line[160];
    struct h_conn *c, *held;
    json_t *r;
    int fd;

    h_start("limits:\n"
            "  max_output_bytes: 8388608\n"
            "  max_memory_bytes: 2097152\n");
    c = h_connect_ok(&D);
    held = h_connect_ok(&D);
    set_value(c, "v100k", 100 * 1000, 'm');

    /* Taken before the limit is passed, to be released after. */
    r = h_callf(held, T_MS, "{s:s,s:s}", "op", "lock", "key", "mine");
    ck_assert(h_ok(r) && jtrue(r, "acquired"));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "lz");
    ck_assert_msg(h_ok(r), "cache.get lz: %s", h_errcode(r));
    ck_assert_ptr_nonnull(jstr(r, "lease"));
    char lease_copy[128];
    snprintf(lease_copy, sizeof lease_copy, "%s", jstr(r, "lease"));
    json_decref(r);

    fd = h_raw_unix(D.sock);
    for (int i = 1; i <= nreq; i++) {
        int n = snprintf(line, sizeof line,
                         "{\"op\":\"cache.get\",\"key\":\"v100k\","
                         "\"id\":%d}\n",
                         i);
        raw_write(fd, line, (size_t)n);
    }
    ck_assert_msg(h_wait_stat_min(c, "session_buffer_bytes", 2097152 + 1,
                                  T_MS * 2),
                  "the flooding session's output stayed under the limit: "
                  "%lld bytes, %lld requests pending",
                  h_stat(c, "session_buffer_bytes"),
                  h_stat(c, "requests_pending"));

    /* New work: busy. */
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "other");
    h_expect_code(r, "busy", "cache.get over the memory limit");
    r = h_callf(c, T_MS, "{s:s,s:[s]}", "op", "cache.mget", "keys", "a");
    h_expect_code(r, "busy", "cache.mget over the memory limit");
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key", "s",
                "value", "x");
    h_expect_code(r, "busy", "cache.set over the memory limit");
    r = h_callf(c, T_MS, "{s:s,s:s,s:s,s:s}", "op", "cache.fill", "key", "lz",
                "lease", lease_copy, "value", "x");
    h_expect_code(r, "busy", "cache.fill over the memory limit");
    r = h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key", "w", "wait_ms",
                100);
    h_expect_code(r, "busy", "a waiting lock over the memory limit");
    ck_assert_int_eq(h_log_has(&D, "memory over the limit"), true);

    /* What frees or keeps what is held, and a lock that does not wait,
     * still work. */
    h_assert_ping(c);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "try");
    ck_assert_msg(h_ok(r), "lock without wait: %s", h_errcode(r));
    json_decref(r);
    r = h_callf(held, T_MS, "{s:s,s:s,s:i}", "op", "extend", "key", "mine",
                "ttl_ms", 10000);
    ck_assert_msg(h_ok(r), "extend: %s", h_errcode(r));
    json_decref(r);
    r = h_callf(held, T_MS, "{s:s,s:s}", "op", "unlock", "key", "mine");
    ck_assert_msg(h_ok(r), "unlock: %s", h_errcode(r));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.invalidate", "key",
                "v100k");
    ck_assert_msg(h_ok(r), "cache.invalidate: %s", h_errcode(r));
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.release", "key", "lz",
                "lease", lease_copy);
    ck_assert_msg(h_ok(r), "cache.release: %s", h_errcode(r));
    json_decref(r);

    /* The flooding client goes: its buffers are freed, work resumes. */
    close(fd);
    ck_assert(h_wait_stat(c, "session_buffer_bytes", 0, T_MS * 2) ||
              h_stat(c, "session_buffer_bytes") < 2097152);
    r = h_callf(c, T_MS, "{s:s,s:s,s:b}", "op", "cache.get", "key", "other",
                "lease", 0);
    ck_assert_msg(h_ok(r), "cache.get after: %s", h_errcode(r));
    json_decref(r);
    h_close(held);
    h_close(c);
}
END_TEST

/* The monitor's requests_bytes under 64 KiB (for h_wait_until). */
static bool
requests_freed(void *arg)
{
    long long b = h_stat(arg, "requests_bytes");
    return b >= 0 && b < 64 * 1024;
}

/* N locks, each on a key (TAG and a number) a holder has, sent in one go with wait_ms and
 * the ignored member "pad": PAD (JSON text). They park holding what they
 * were sent with; once that passes limits.max_memory_bytes (16 MiB) the
 * next one is answered busy, and requests_bytes shows what they hold. */
static void
waiters_pass_limit(const char *tag, const char *pad, int n)
{
    size_t padlen = strlen(pad);
    size_t cap = (size_t)n * (padlen + 128);
    char *all = malloc(cap);
    size_t len = 0;
    struct h_conn *holder, *w, *mon;
    json_t *r;

    ck_assert_ptr_nonnull(all);
    holder = h_connect_ok(&D);
    w = h_connect_ok(&D);
    mon = h_connect_ok(&D);
    for (int i = 0; i < n; i++) {
        char key[16];
        snprintf(key, sizeof key, "%s%d", tag, i);
        r = h_must(
            h_callf(holder, T_MS, "{s:s,s:s}", "op", "lock", "key", key));
        ck_assert(jtrue(r, "acquired"));
        json_decref(r);
        len += (size_t)snprintf(all + len, cap - len,
                                "{\"op\":\"lock\",\"key\":\"%s\","
                                "\"wait_ms\":60000,\"id\":%d,\"pad\":",
                                key, i + 1);
        memcpy(all + len, pad, padlen);
        len += padlen;
        memcpy(all + len, "}\n", 2);
        len += 2;
    }
    ck_assert_int_eq(h_send_raw(w, all, len), 0);
    free(all);
    /* The parked ones answer nothing: the first answer is the refusal. */
    r = h_recv(w, T_MS * 2);
    ck_assert_msg(r != NULL,
                  "no lock refused: %lld requests pending holding "
                  "%lld bytes",
                  h_stat(mon, "requests_pending"),
                  h_stat(mon, "requests_bytes"));
    ck_assert_str_eq(h_errcode(r), "busy");
    json_decref(r);
    ck_assert_int_gt(h_stat(mon, "requests_bytes"), 8 * 1024 * 1024);
    h_close(w);
    ck_assert_msg(h_wait_until(requests_freed, mon, T_MS),
                  "requests_bytes stayed at %lld after the waiter left",
                  h_stat(mon, "requests_bytes"));
    h_close(mon);
    h_close(holder);
}

/* Waiting requests are accounted by what they hold, not a fixed 1 KiB:
 * locks waiting with an ignored string of 512 KiB, then with an array of
 * 50,000 one-byte strings (200 KB sent, some 18 times that parsed). */
START_TEST(test_memory_limit_counts_requests)
{
    const size_t big = 512 * 1024;
    const int items = 50000;
    char *pad = malloc(
        big + 3 > (size_t)items * 4 + 3 ? big + 3 : (size_t)items * 4 + 3);
    size_t len = 0;

    ck_assert_ptr_nonnull(pad);
    h_start("limits:\n  max_memory_bytes: 16777216\n");
    pad[0] = '"';
    memset(pad + 1, 'p', big);
    memcpy(pad + 1 + big, "\"", 2);
    waiters_pass_limit("s", pad, 40);

    pad[len++] = '[';
    for (int i = 0; i < items; i++) {
        memcpy(pad + len, i > 0 ? ",\"a\"" : "\"a\"", i > 0 ? 4 : 3);
        len += i > 0 ? 4 : 3;
    }
    memcpy(pad + len, "]", 2);
    waiters_pass_limit("a", pad, 8);
    free(pad);
}
END_TEST

/* limits.max_memory_bytes is checked like the other limits. */
START_TEST(test_memory_limit_conf)
{
    char out[4096], err[4096], conf[512];
    const char *const argv[] = {h_leased_bin(), "-t", "-c", conf, NULL};
    FILE *f;

    ck_assert_int_eq(h_tmpdir(conf, sizeof conf - 16), 0);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", conf);
    strcat(conf, "/l.yml");
    f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs("limits:\n  max_memory_bytes: -1\n", f);
    fclose(f);
    ck_assert_int_ne(h_run(argv, out, sizeof out, err, sizeof err, T_MS), 0);
    ck_assert_msg(strstr(err, "l.yml:2:") && strstr(err, "max_memory_bytes"),
                  "stderr: %s", err);
    f = fopen(conf, "w");
    fputs("limits:\n  max_memory_bytes: 67108864\n", f);
    fclose(f);
    ck_assert_msg(h_run(argv, out, sizeof out, err, sizeof err, T_MS) == 0,
                  "stderr: %s", err);
    unlink(conf);
    h_rmdir(dir);
}
END_TEST

/* ---- 4. clients that flood without reading ------------------------------ */

#define FLOODERS 5

static bool
flooders_closed(void *arg)
{
    struct h_conn *c = arg;
    return h_stat(c, "sessions") <= 2; /* the test's own two */
}

/* Five clients each write 1000 cache.get of a 500 KB value at once and
 * never read. The daemon's RSS stays within its bounds (the flooders'
 * output limits plus the memory bound), the flooders are closed at their
 * output limit, and another client's pings are answered within
 * milliseconds all along. */
START_TEST(test_flood_rss)
{
    const int nreq = 1000;
    size_t cap = (size_t)nreq * 64, len = 0;
    char *flood = malloc(cap);
    struct h_conn *c, *other;
    long long rss0, rss_max = 0, worst_ms = 0, pings = 0;
    int fds[FLOODERS];

    small_asan_quarantine();
    h_start("limits:\n"
            "  max_output_bytes: 8388608\n"
            "  max_memory_bytes: 33554432\n");
    c = h_connect_ok(&D);
    other = h_connect_ok(&D);
    set_value(c, "half", 500 * 1000, 'h');
    rss0 = rss_kb(D.pid);
    for (int i = 1; i <= nreq; i++) {
        len += (size_t)snprintf(flood + len, cap - len,
                                "{\"op\":\"cache.get\",\"key\":\"half\","
                                "\"id\":%d}\n",
                                i);
    }
    for (int k = 0; k < FLOODERS; k++) {
        fds[k] = h_raw_unix(D.sock);
    }
    /* Each whole pipeline in one write, from children so that a full
     * socket blocks them, not the test. */
    pid_t pids[FLOODERS];
    for (int k = 0; k < FLOODERS; k++) {
        pids[k] = fork();
        ck_assert_int_ge(pids[k], 0);
        if (pids[k] == 0) {
            size_t off = 0;
            while (off < len) {
                ssize_t n = send(fds[k], flood + off, len - off, MSG_NOSIGNAL);
                if (n <= 0) {
                    _exit(0);
                }
                off += (size_t)n;
            }
            pause();
            _exit(0);
        }
        h_track_pid(pids[k]);
    }

    /* Until the flooders are closed, and half a second more while the
     * replies to what they sent still come from Redis. */
    long long deadline = h_now_ms() + 60000, closed_at = 0;
    while (h_now_ms() < deadline &&
           (closed_at == 0 || h_now_ms() - closed_at < 500)) {
        long long t0 = h_now_ms(), rss;
        h_assert_ping(other);
        pings++;
        if (getenv("FLOOD_TRACE")) {
            fprintf(stderr, "ping %lld ms at %lld\n", h_now_ms() - t0, t0);
        }
        if (h_now_ms() - t0 > worst_ms) {
            worst_ms = h_now_ms() - t0;
        }
        rss = rss_kb(D.pid);
        if (rss > rss_max) {
            rss_max = rss;
        }
        if (closed_at == 0 && flooders_closed(other)) {
            closed_at = h_now_ms();
        }
    }
    ck_assert_msg(flooders_closed(other), "the flooders are still open");
    for (int k = 0; k < FLOODERS; k++) {
        kill(pids[k], SIGKILL);
        waitpid(pids[k], NULL, 0);
        h_untrack_pid(pids[k]);
        close(fds[k]);
    }
    fprintf(stderr,
            "flood_rss: rss %lld kB before, %lld kB max; %lld pings, "
            "slowest %lld ms\n",
            rss0, rss_max, pings, worst_ms);
    /* Five output limits and the memory bound, with room for the
     * allocator: far from the gigabytes of an unbounded daemon. */
    ck_assert_msg(rss_max - rss0 < (5 * 8 + 32 + 32) * 1024,
                  "daemon RSS grew by %lld kB", rss_max - rss0);
    ck_assert_msg(worst_ms < 250, "a ping took %lld ms", worst_ms);
    h_assert_ping(c);
    h_close(other);
    h_close(c);
    free(flood);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(hostile_array_header, 60),
        H_CASE(hostile_bulk, 120),
        H_CASE(hostile_extra_reply, 60),
        H_CASE(owed_output, 120),
        H_CASE(memory_limit_busy, 120),
        H_CASE(memory_limit_conf, 30),
        H_CASE(flood_rss, 240),
        H_CASE(memory_limit_counts_requests, 120),
    };

    return H_MAIN(fx, cases);
}
