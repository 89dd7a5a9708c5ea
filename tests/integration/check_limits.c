/* Limits that protect the daemon, and what the listeners let in: HTTP
 * on a leased socket, the output limit of a client that does not read,
 * fairness between sessions, running out of descriptors, framing edge
 * cases and the paths and modes of the configuration. Every test starts
 * its own redis-server and leased. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define T_MS 5000 /* how long a reply may take */

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "limits",
    .redis = {&R},
    .daemons = {&D},
};

/* How many lines of the daemon's log hold NEEDLE. */
static int
log_count(const struct h_daemon *d, const char *needle)
{
    char line[4096];
    int n = 0;
    FILE *f = fopen(d->log, "r");

    if (!f) {
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, needle)) {
            n++;
        }
    }
    fclose(f);
    return n;
}

static int
raw_tcp(int port)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0,
                  "connect tcp %d: %s", port, strerror(errno));
    return fd;
}

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

/* Read until EOF or TIMEOUT_MS; returns the bytes read (the first
 * CAP - 1 of them kept in BUF, NUL-terminated) or -1 on timeout. */
static long
raw_read_to_eof(int fd, char *buf, size_t cap, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    long total = 0;
    char chunk[65536];

    if (cap > 0) {
        buf[0] = '\0';
    }
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = deadline - h_now_ms();
        ssize_t n;

        if (left <= 0) {
            return -1;
        }
        if (poll(&p, 1, (int)left) <= 0) {
            continue;
        }
        n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return total;
        }
        if ((size_t)total + 1 < cap) {
            size_t room = cap - 1 - (size_t)total;
            size_t k = (size_t)n < room ? (size_t)n : room;
            memcpy(buf + total, chunk, k);
            buf[total + (long)k] = '\0';
        }
        total += n;
    }
}

/* Read until COUNT newlines have arrived (or TIMEOUT_MS). */
static bool
raw_read_lines(int fd, int count, char *buf, size_t cap, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    size_t used = 0;
    int lines = 0;

    while (lines < count) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = deadline - h_now_ms();
        char chunk[65536];
        ssize_t n;

        if (left <= 0) {
            return false;
        }
        if (poll(&p, 1, (int)left) <= 0) {
            continue;
        }
        n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return false;
        }
        for (ssize_t i = 0; i < n; i++) {
            lines += chunk[i] == '\n';
        }
        if (buf != NULL && used + 1 < cap) {
            size_t k = (size_t)n < cap - 1 - used ? (size_t)n : cap - 1 - used;
            memcpy(buf + used, chunk, k);
            used += k;
            buf[used] = '\0';
        }
    }
    return true;
}

static long long
proc_status_kb(pid_t pid, const char *field)
{
    char path[64], line[256];
    long long kb = -1;
    size_t flen = strlen(field);
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
            kb = atoll(line + flen + 1);
            break;
        }
    }
    fclose(f);
    return kb;
}

/* utime + stime of PID, in clock ticks. */
static long long
proc_cpu_ticks(pid_t pid)
{
    char path[64], buf[2048];
    unsigned long long ut = 0, st = 0;
    FILE *f;
    char *p;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    if (!fgets(buf, sizeof buf, f)) {
        fclose(f);
        return -1;
    }
    fclose(f);
    /* The command name may hold spaces: fields count from its ')'. */
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 2,
                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
                     "%llu %llu",
                     &ut, &st) != 2) {
        return -1;
    }
    return (long long)(ut + st);
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

/* --- 1. HTTP on a leased socket ----------------------------------------- */

static bool
cache_hit(struct h_conn *c, const char *key)
{
    json_t *r = h_callf(c, T_MS, "{s:s,s:s,s:b,s:i}", "op", "cache.get", "key",
                        key, "lease", 0, "wait_ms", 0);
    bool hit;

    ck_assert_msg(h_ok(r), "cache.get %s: %s", key, h_errcode(r));
    hit = json_is_true(json_object_get(r, "hit"));
    json_decref(r);
    return hit;
}

/* What `curl --http0.9 -X POST --data-binary @body http://127.0.0.1:P/`
 * sends, then the first line of some other HTTP-ish openings: each
 * connection is closed with no answer and nothing of it runs. */
START_TEST(test_http_refused)
{
    static const char body[] =
        "{\"op\":\"cache.set\",\"key\":\"xp\",\"value\":\"pwned\"}\n";
    static const char *const openings[] = {
        "GET / HTTP/1.1\r\n", "PUT /x HTTP/1.1\r\n",    "host: 127.0.0.1\r\n",
        "Host:x\n",           "OPTIONS * HTTP/1.1\r\n",
    };
    char req[1024], got[4096];
    struct h_conn *c;
    long n;
    int fd;

    h_start(NULL);
    ck_assert_int_gt(D.tcp_port, 0);
    snprintf(req, sizeof req,
             "POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
             "User-Agent: curl/7.88.1\r\nAccept: */*\r\n"
             "Content-Length: %zu\r\n"
             "Content-Type: application/x-www-form-urlencoded\r\n\r\n%s",
             D.tcp_port, strlen(body), body);
    fd = raw_tcp(D.tcp_port);
    raw_write(fd, req, strlen(req));
    n = raw_read_to_eof(fd, got, sizeof got, T_MS);
    close(fd);
    ck_assert_msg(n == 0,
                  "expected a close without an answer, got %ld "
                  "bytes: %s",
                  n, got);
    ck_assert_int_eq(log_count(&D, "HTTP request on a leased socket"), 1);
    ck_assert_int_eq(log_count(&D, "peer=127.0.0.1:"), 1);

    /* The same on the Unix socket, with the body in the same write. */
    for (size_t i = 0; i < sizeof openings / sizeof openings[0]; i++) {
        snprintf(req, sizeof req, "%s%s", openings[i], body);
        fd = h_raw_unix(D.sock);
        raw_write(fd, req, strlen(req));
        n = raw_read_to_eof(fd, got, sizeof got, T_MS);
        close(fd);
        ck_assert_msg(n == 0, "opening %zu: answered %ld bytes: %s", i, n,
                      got);
    }

    c = h_connect_ok(&D);
    ck_assert_msg(!cache_hit(c, "xp"), "an HTTP body ran");
    /* A JSON first line still works, and a later line that happens to
     * read like a header is only a bad request. */
    h_assert_ping(c);
    ck_assert_int_eq(h_send_raw(c, "Host: x\n", 8), 0);
    {
        json_t *r = h_recv(c, T_MS);
        ck_assert_str_eq(h_errcode(r), "bad_request");
        json_decref(r);
    }
    h_assert_ping(c);
    h_close(c);
}
END_TEST

/* Write LEN bytes until done or the peer closed; returns bytes written. */
static size_t
write_until_closed(int fd, const char *buf, size_t len)
{
    size_t off = 0;

    while (off < len) {
        ssize_t n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        off += (size_t)n;
    }
    return off;
}

/* A browser sends a URL of megabytes: the request line is over
 * limits.max_request_bytes, the headers follow, then the body's lines.
 * The connection is closed on the request line's first bytes; nothing of
 * the body runs (no cache value, no detached lock for an hour). */
START_TEST(test_http_long_first_line)
{
    static const char body[] =
        "{\"op\":\"cache.set\",\"key\":\"xl\",\"value\":\"pwned\"}\n"
        "{\"op\":\"lock\",\"key\":\"hl\",\"ttl_ms\":3600000,"
        "\"detach\":true}\n";
    size_t url = 1100 * 1024;
    size_t cap = url + 4096;
    char *req = malloc(cap);
    char got[4096];
    struct h_conn *c;
    json_t *r;
    size_t len;
    long n;
    int fd;

    h_start(NULL);
    ck_assert_ptr_nonnull(req);
    memcpy(req, "POST /", 6);
    memset(req + 6, 'a', url);
    len = 6 + url;
    len += (size_t)snprintf(req + len, cap - len,
                            " HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                            "Content-Type: text/plain\r\n"
                            "Content-Length: %zu\r\n\r\n%s",
                            D.tcp_port, strlen(body), body);
    fd = raw_tcp(D.tcp_port);
    write_until_closed(fd, req, len);
    n = raw_read_to_eof(fd, got, sizeof got, T_MS);
    close(fd);
    free(req);
    ck_assert_msg(n == 0, "expected a close without an answer, got %ld: %s", n,
                  got);
    ck_assert_int_eq(log_count(&D, "HTTP request on a leased socket"), 1);

    c = h_connect_ok(&D);
    ck_assert_msg(!cache_hit(c, "xl"), "an HTTP body ran (cache.set)");
    r = h_must(h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "hl"));
    ck_assert_msg(!jtrue(r, "locked"), "an HTTP body ran (lock): %s",
                  h_dump(r));
    json_decref(r);
    /* A JSON request over the limit as the first line is still only
     * refused, and the session goes on. */
    h_close(c);
    c = h_connect_ok(&D);
    {
        size_t big = 1100 * 1024;
        char *line = malloc(big + 64);
        int k = snprintf(line, 64,
                         "{\"op\":\"cache.set\",\"key\":\"b\",\"v\":\"");
        memset(line + k, 'v', big);
        memcpy(line + k + big, "\"}\n", 3);
        ck_assert_int_eq(h_send_raw(c, line, (size_t)k + big + 3), 0);
        free(line);
        r = h_recv(c, T_MS);
        ck_assert_str_eq(h_errcode(r), "too_large");
        json_decref(r);
    }
    h_assert_ping(c);
    h_close(c);
}
END_TEST

START_TEST(test_tcp_off_by_default)
{
    h_start("listen:\n  unix: \"@DIR@/leased.sock\"\n");
    ck_assert_int_eq(D.tcp_port, 0);
    ck_assert_int_eq(log_count(&D, "msg=\"listening\" tcp="), 0);
}
END_TEST

/* A TCP socket passed by systemd bound beyond loopback, without
 * auth_token: the daemon refuses to start, and says why. */
START_TEST(test_adopted_tcp_needs_token)
{
    struct sockaddr_in sa;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;

    ck_assert_int_ge(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    fprintf(stderr, "(a start-up failure is expected below)\n");
    ck_assert_int_eq(h_daemon_start_fd(&D, &R, NULL, fd, "/nonexistent"), -1);
    close(fd);
    ck_assert_int_eq(log_count(&D, "listens beyond loopback and "
                                   "listen.auth_token is empty"),
                     1);
}
END_TEST

/* --- 2. Output limit ------------------------------------------------------ */

static bool
over_limit_logged(void *arg)
{
    (void)arg;
    return log_count(&D, "session over the output limit") > 0;
}

static bool
lock_free_for(void *arg)
{
    struct h_conn *c = arg;
    json_t *r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", "held");
    bool ok = h_ok(r) && json_is_true(json_object_get(r, "acquired"));

    json_decref(r);
    return ok;
}

/* A client pipelines 1000 cache.get of a 1 MB value in one write and
 * never reads. The daemon's memory stays bounded, another session is
 * served promptly meanwhile, the flooding session is closed and the lock
 * it held is released. */
START_TEST(test_output_limit)
{
    const size_t vlen = 1000 * 1000; /* the line fits 1 MiB */
    const int nreq = 1000;
    char *value = malloc(vlen + 1);
    char *flood;
    size_t flen = 0, fcap = (size_t)nreq * 80;
    struct h_conn *c, *other;
    char got[4096];
    json_t *r;
    long long rss0, rss_max = 0, worst_ms = 0;
    int fd;

    small_asan_quarantine();
    h_start("limits:\n  max_output_bytes: 4194304\n");
    c = h_connect_ok(&D);
    other = h_connect_ok(&D);
    memset(value, 'v', vlen);
    value[vlen] = '\0';
    r = h_callf(c, 30000, "{s:s,s:s,s:s}", "op", "cache.set", "key", "big",
                "value", value);
    ck_assert_msg(h_ok(r), "cache.set: %s", h_errcode(r));
    json_decref(r);
    free(value);
    ck_assert(cache_hit(c, "big"));
    rss0 = proc_status_kb(D.pid, "VmRSS");
    ck_assert_int_gt(rss0, 0);

    fd = h_raw_unix(D.sock);
    raw_write(fd, "{\"op\":\"lock\",\"key\":\"held\",\"id\":0}\n", 34);
    ck_assert(raw_read_lines(fd, 1, got, sizeof got, T_MS));
    ck_assert_msg(strstr(got, "\"acquired\":true"), "lock: %s", got);

    flood = malloc(fcap);
    for (int i = 1; i <= nreq; i++) {
        flen += (size_t)snprintf(flood + flen, fcap - flen,
                                 "{\"op\":\"cache.get\",\"key\":\"big\","
                                 "\"id\":%d}\n",
                                 i);
    }
    raw_write(fd, flood, flen);
    free(flood);

    /* Until the flooder is closed, ping from the other session and
     * sample the daemon's memory. */
    long long deadline = h_now_ms() + 60000;
    while (!over_limit_logged(NULL) && h_now_ms() < deadline) {
        long long t0 = h_now_ms(), rss;
        h_assert_ping(other);
        if (h_now_ms() - t0 > worst_ms) {
            worst_ms = h_now_ms() - t0;
        }
        rss = proc_status_kb(D.pid, "VmRSS");
        if (rss > rss_max) {
            rss_max = rss;
        }
    }
    ck_assert_msg(over_limit_logged(NULL),
                  "the session was not closed at the output limit");
    /* Its socket closes: what the client reads ends in EOF, having got
     * no more than the limit's worth (plus the socket's own buffers). */
    long n = raw_read_to_eof(fd, got, sizeof got, 30000);
    close(fd);
    ck_assert_msg(n >= 0, "the flooding session was not closed");
    ck_assert_msg(n < 8L * 1024 * 1024, "read %ld bytes", n);

    /* Its session-bound lock is free again. */
    ck_assert(h_wait_until(lock_free_for, other, 10000));
    {
        long long rss = proc_status_kb(D.pid, "VmRSS");
        if (rss > rss_max) {
            rss_max = rss;
        }
    }
    fprintf(stderr,
            "output_limit: rss %lld kB before, %lld kB max; "
            "slowest ping %lld ms\n",
            rss0, rss_max, worst_ms);
    ck_assert_msg(rss_max < 150 * 1024, "daemon RSS reached %lld kB", rss_max);
    ck_assert_msg(worst_ms < 1000, "a ping took %lld ms", worst_ms);
    h_assert_ping(c);
    h_close(c);
    h_close(other);
}
END_TEST

/* Dispatch pauses above half of the limit; reading and dispatch resume
 * however the output drained, also when one write took it all (from over
 * the high mark to nothing, with no write event in between). */
START_TEST(test_resume_after_big_drain)
{
    const size_t vlen = 50 * 1024;
    char *value = malloc(vlen + 1);
    char req[512];
    char *got = malloc(1024 * 1024);
    struct h_conn *c;
    json_t *r;
    int fd;

    h_start("limits:\n  max_output_bytes: 262144\n");
    c = h_connect_ok(&D);
    memset(value, 'w', vlen);
    value[vlen] = '\0';
    r = h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key", "mid",
                "value", value);
    ck_assert(h_ok(r));
    json_decref(r);
    free(value);

    fd = h_raw_unix(D.sock);
    for (int round = 0; round < 5; round++) {
        /* 150 KB of replies: over the 128 KB high mark, within what the
         * socket takes in one write. */
        snprintf(req, sizeof req,
                 "{\"op\":\"cache.get\",\"key\":\"mid\",\"id\":1}\n"
                 "{\"op\":\"cache.get\",\"key\":\"mid\",\"id\":2}\n"
                 "{\"op\":\"cache.get\",\"key\":\"mid\",\"id\":3}\n");
        raw_write(fd, req, strlen(req));
        ck_assert_msg(raw_read_lines(fd, 3, NULL, 0, T_MS),
                      "round %d: replies missing", round);
        raw_write(fd, "{\"op\":\"ping\",\"id\":4}\n", 22);
        ck_assert_msg(raw_read_lines(fd, 1, got, 1024 * 1024, T_MS),
                      "round %d: reading did not resume", round);
        ck_assert_msg(strstr(got, "\"id\":4") != NULL, "round %d: %s", round,
                      got);
    }
    close(fd);
    free(got);
    h_close(c);
}
END_TEST

/* limits.max_pending holds request by request, also for requests that
 * arrive in one read: of six waiting locks sent in one write with the
 * limit at 3, the last three get busy at once. */
START_TEST(test_max_pending_per_request)
{
    char buf[2048];
    size_t off = 0;
    struct h_conn *a, *b;
    json_t *r;

    h_start("limits:\n  max_pending: 3\n");
    a = h_connect_ok(&D);
    b = h_connect_ok(&D);
    r = h_callf(a, T_MS, "{s:s,s:s}", "op", "lock", "key", "mp");
    ck_assert(h_ok(r) && json_is_true(json_object_get(r, "acquired")));
    json_decref(r);
    for (int i = 1; i <= 6; i++) {
        off += (size_t)snprintf(buf + off, sizeof buf - off,
                                "{\"op\":\"lock\",\"key\":\"mp\","
                                "\"owner\":\"o%d\",\"wait_ms\":-1,"
                                "\"id\":%d}\n",
                                i, i);
    }
    ck_assert_int_eq(h_send_raw(b, buf, off), 0);
    for (int i = 4; i <= 6; i++) {
        r = h_recv_id(b, i, T_MS);
        ck_assert_msg(r != NULL, "no answer to %d", i);
        ck_assert_str_eq(h_errcode(r), "busy");
        json_decref(r);
    }
    r = h_callf(b, T_MS, "{s:s}", "op", "ping");
    ck_assert_str_eq(h_errcode(r), "busy");
    json_decref(r);
    h_close(a);
    r = h_recv_id(b, 1, T_MS);
    ck_assert(r != NULL && json_is_true(json_object_get(r, "acquired")));
    json_decref(r);
    h_close(b);
}
END_TEST

/* --- 3. One session does not hold the loop ------------------------------ */

/* A client pipelines a few MB of cache.mget lines of many keys each;
 * another session's pings are answered quickly all along. */
START_TEST(test_fair_turns)
{
    const int nkeys = 400, nlines = 150;
    size_t cap = (size_t)nkeys * 24 + 128;
    char *line = malloc(cap);
    size_t len, off;
    struct h_conn *other;
    long long worst_ms = 0, pings = 0;
    int fd;

    h_start(NULL);
    other = h_connect_ok(&D);
    off = (size_t)snprintf(line, cap, "{\"op\":\"cache.mget\",\"keys\":[");
    for (int k = 0; k < nkeys; k++) {
        off += (size_t)snprintf(line + off, cap - off, "%s\"mk%05d\"",
                                k ? "," : "", k);
    }
    off += (size_t)snprintf(line + off, cap - off, "],\"lease\":false}\n");
    len = off;

    fd = h_raw_unix(D.sock);
    char *all = malloc(len * (size_t)nlines);
    for (int i = 0; i < nlines; i++) {
        memcpy(all + (size_t)i * len, line, len);
    }
    /* Write from a child so the test can ping meanwhile; it reads the
     * answers too, so the flood is bounded by the daemon, not by us. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        pid_t reader = fork();
        if (reader == 0) {
            char buf[65536];
            while (read(fd, buf, sizeof buf) > 0) {
            }
            _exit(0);
        }
        size_t done = 0;
        while (done < len * (size_t)nlines) {
            ssize_t n = send(fd, all + done, len * (size_t)nlines - done,
                             MSG_NOSIGNAL);
            if (n <= 0) {
                _exit(1);
            }
            done += (size_t)n;
        }
        shutdown(fd, SHUT_WR);
        waitpid(reader, NULL, 0);
        _exit(0);
    }
    h_track_pid(pid);
    close(fd);
    free(all);
    free(line);

    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        long long t0 = h_now_ms();
        h_assert_ping(other);
        pings++;
        if (h_now_ms() - t0 > worst_ms) {
            worst_ms = h_now_ms() - t0;
        }
    }
    h_untrack_pid(pid);
    fprintf(stderr, "fair_turns: %lld pings, slowest %lld ms\n", pings,
            worst_ms);
    ck_assert_msg(worst_ms < 1000, "a ping took %lld ms", worst_ms);
    h_assert_ping(other);
    h_close(other);
}
END_TEST

/* --- 4. Out of descriptors ------------------------------------------------ */

#define EMFILE_CONNS 40

static bool
accept_paused(void *arg)
{
    (void)arg;
    return log_count(&D, "accept failed") > 0;
}

START_TEST(test_emfile_pauses)
{
    struct rlimit old, low;
    int fds[EMFILE_CONNS];
    long long t0, cpu0, cpu1, wall;
    int lines0, lines1;
    long ticks = sysconf(_SC_CLK_TCK);

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    /* The daemon inherits the soft limit; ours goes back up after. */
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    low = old;
    low.rlim_cur = 32;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &low), 0);
    int rc = h_daemon_start(&D, &R, NULL);
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &old), 0);
    ck_assert_int_eq(rc, 0);

    for (int i = 0; i < EMFILE_CONNS; i++) {
        fds[i] = h_raw_unix(D.sock);
    }
    ck_assert_msg(h_wait_until(accept_paused, NULL, 10000),
                  "no accept failure logged");
    lines0 = log_count(&D, "accept failed");
    cpu0 = proc_cpu_ticks(D.pid);
    t0 = h_now_ms();
    /* Measure over a second of being out of descriptors. */
    while (h_now_ms() - t0 < 1000) {
        usleep(100 * 1000);
    }
    cpu1 = proc_cpu_ticks(D.pid);
    wall = h_now_ms() - t0;
    lines1 = log_count(&D, "accept failed");
    fprintf(stderr, "emfile: %lld ticks of CPU in %lld ms, %d log lines\n",
            cpu1 - cpu0, wall, lines1 - lines0);
    ck_assert_msg((cpu1 - cpu0) * 1000 / ticks < 300,
                  "daemon used %lld ticks in %lld ms", cpu1 - cpu0, wall);
    ck_assert_msg(lines1 - lines0 <= 3, "%d accept lines in %lld ms",
                  lines1 - lines0, wall);

    /* Once descriptors are free again, new connections are served. */
    for (int i = 0; i < EMFILE_CONNS; i++) {
        close(fds[i]);
    }
    struct h_conn *c = h_connect_ok(&D);
    h_assert_ping(c);
    h_close(c);
    ck_assert_int_ge(log_count(&D, "pausing accept"), 1);
    /* limits.max_clients (10000) is more than 32 descriptors allow. */
    ck_assert_int_eq(log_count(&D, "is more than the open file limit"), 1);
}
END_TEST

/* --- 5. Config and paths -------------------------------------------------- */

static pid_t
pid_from_log(const char *log)
{
    char line[4096];
    pid_t pid = 0;
    FILE *f = fopen(log, "r");

    if (!f) {
        return 0;
    }
    while (fgets(line, sizeof line, f)) {
        char *p = strstr(line, " starting");
        if (p && (p = strstr(p, " pid=")) != NULL) {
            pid = (pid_t)atoi(p + 5);
        }
    }
    fclose(f);
    return pid;
}

static bool
sock_answers(void *arg)
{
    struct h_daemon probe;
    struct h_conn *c;
    json_t *r;
    bool ok;

    memset(&probe, 0, sizeof probe);
    snprintf(probe.sock, sizeof probe.sock, "%s", (const char *)arg);
    c = h_connect(&probe);
    if (!c) {
        return false;
    }
    r = h_callf(c, 2000, "{s:s}", "op", "ping");
    ok = h_ok(r);
    json_decref(r);
    h_close(c);
    return ok;
}

static bool
reloaded(void *arg)
{
    (void)arg;
    return log_count(&D, "msg=\"configuration reloaded\" path=/") > 0;
}

/* Started from its directory with a relative -c, socket and journal, the
 * daemon detaches to "/" and still serves on that socket, writes that
 * journal and reloads that file. */
START_TEST(test_relative_paths_detached)
{
    char yaml[1024], path[600], sock[600];
    struct stat st;
    pid_t child, pid;
    int status;

    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_tmpdir(D.dir, sizeof D.dir), 0);
    snprintf(D.log, sizeof D.log, "%s/leased.log", D.dir);
    snprintf(D.conf, sizeof D.conf, "%s/rel.yml", D.dir);
    snprintf(yaml, sizeof yaml,
             "listen:\n  unix: run/rel.sock\n"
             "redis:\n  address: \"127.0.0.1:%d\"\n"
             "journal:\n  path: ./rel.journal\n"
             "metrics:\n  listen: \"\"\n"
             "log:\n  level: info\n",
             R.port);
    FILE *f = fopen(D.conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs(yaml, f);
    fclose(f);

    child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        int lfd = open(D.log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (lfd < 0 || chdir(D.dir) != 0) {
            _exit(126);
        }
        dup2(lfd, 2);
        unsetenv("NOTIFY_SOCKET");
        unsetenv("LISTEN_FDS");
        execl(h_leased_bin(), h_leased_bin(), "-c", "rel.yml", (char *)NULL);
        _exit(127);
    }
    /* The first process exits once it has forked the daemon. */
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "leased exited with status %d", status);
    snprintf(sock, sizeof sock, "%s/run/rel.sock", D.dir);
    if (!h_wait_until(sock_answers, sock, 10000)) {
        h_daemon_dump_log(&D);
        ck_abort_msg("no answer on %s", sock);
    }
    pid = pid_from_log(D.log);
    ck_assert_int_gt(pid, 0);
    D.pid = pid;
    h_track_pid(pid);

    snprintf(path, sizeof path, "%s/rel.journal", D.dir);
    ck_assert_msg(stat(path, &st) == 0, "no journal at %s", path);

    f = fopen(D.conf, "a");
    ck_assert_ptr_nonnull(f);
    fputs("limits:\n  max_pending: 77\n", f);
    fclose(f);
    kill(pid, SIGHUP);
    ck_assert_msg(h_wait_until(reloaded, NULL, 10000), "no reload");
    ck_assert_int_eq(log_count(&D, "reload failed"), 0);
    ck_assert_int_eq(log_count(&D, "limits.max_pending reloaded"), 1);
    ck_assert(sock_answers(sock));
    /* Not a child of ours: stop it by pid and wait for it to go. */
    kill(pid, SIGTERM);
    for (int i = 0; i < 500 && kill(pid, 0) == 0; i++) {
        usleep(10000);
    }
    h_untrack_pid(pid);
    D.pid = 0;
}
END_TEST

START_TEST(test_secret_file_mode)
{
    const char *warn = "is readable by";
    int n;

    h_start("listen:\n  unix: \"@DIR@/leased.sock\"\n  auth_token: t0k\n");
    ck_assert_int_eq(chmod(D.conf, 0644), 0);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
    ck_assert_int_eq(h_daemon_restart(&D), 0);
    ck_assert_int_ge(log_count(&D, "holds listen.auth_token and is "
                                   "readable by others"),
                     1);
    n = log_count(&D, warn);
    ck_assert_int_eq(chmod(D.conf, 0640), 0);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
    ck_assert_int_eq(h_daemon_restart(&D), 0);
    ck_assert_int_eq(log_count(&D, "readable by its group"), 1);
    ck_assert_int_eq(log_count(&D, warn), n + 1);
    ck_assert_int_eq(chmod(D.conf, 0600), 0);
    ck_assert_int_eq(h_daemon_stop(&D), 0);
    ck_assert_int_eq(h_daemon_restart(&D), 0);
    ck_assert_int_eq(log_count(&D, warn), n + 1);
}
END_TEST

START_TEST(test_unix_group)
{
    char yaml[256], out[512], err[1024];
    struct stat st;
    gid_t want = (gid_t)-1;

    if (getuid() == 0) {
        want = 1; /* any group will do for root */
    } else {
        gid_t groups[64];
        int n = getgroups(64, groups);
        for (int i = 0; i < n; i++) {
            if (groups[i] != getegid()) {
                want = groups[i];
            }
        }
    }
    if (want == (gid_t)-1) {
        fprintf(stderr, "unix_group: no second group to test with\n");
        return;
    }
    snprintf(yaml, sizeof yaml,
             "listen:\n  unix: \"@DIR@/leased.sock\"\n"
             "  unix_group: \"%u\"\n",
             (unsigned)want);
    h_start(yaml);
    ck_assert_int_eq(stat(D.sock, &st), 0);
    ck_assert_uint_eq(st.st_gid, want);
    struct h_conn *c = h_connect_ok(&D);
    h_assert_ping(c);
    h_close(c);

    /* An unknown group is a configuration error with its position. */
    FILE *f = fopen(D.conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs("listen:\n  unix_group: no-such-group-x\n", f);
    fclose(f);
    const char *argv[] = {h_leased_bin(), "-t", "-c", D.conf, NULL};
    ck_assert_int_eq(h_run(argv, out, sizeof out, err, sizeof err, 10000), 1);
    ck_assert_msg(strstr(err, "leased.yml:2:15: listen.unix_group: "
                              "unknown group 'no-such-group-x'"),
                  "stderr: %s", err);
}
END_TEST

/* --- 6. Framing ------------------------------------------------------- */

START_TEST(test_crlf_at_limit)
{
    char line[128];
    struct h_conn *c;
    json_t *r;
    int n;

    h_start("limits:\n  max_request_bytes: 64\n");
    c = h_connect_ok(&D);
    /* Exactly 64 bytes before the terminator, then one more. */
    for (int extra = 0; extra < 2; extra++) {
        static const char head[] = "{\"op\":\"ping\",\"id\":5,\"pad\":\"";
        int width = 64 - (int)strlen(head) - 2 + extra;
        n = snprintf(line, sizeof line, "%s%0*d\"}", head, width, 0);
        ck_assert_int_eq(n, 64 + extra);
        for (int crlf = 0; crlf < 2; crlf++) {
            char buf[160];
            snprintf(buf, sizeof buf, "%s%s", line, crlf ? "\r\n" : "\n");
            ck_assert_int_eq(h_send_raw(c, buf, strlen(buf)), 0);
            r = h_recv(c, T_MS);
            ck_assert_ptr_nonnull(r);
            if (extra == 0) {
                ck_assert_msg(h_ok(r), "%s: %s", crlf ? "crlf" : "lf",
                              h_errcode(r));
            } else {
                ck_assert_str_eq(h_errcode(r), "too_large");
            }
            json_decref(r);
        }
    }
    h_assert_ping(c);
    h_close(c);
}
END_TEST

START_TEST(test_nul_rules)
{
    static const char raw_nul[] = "{\"op\":\"ping\",\"id\":1\0}\n";
    struct h_conn *c;
    redisReply *rr;
    json_t *r, *v;

    h_start(NULL);
    c = h_connect_ok(&D);
    ck_assert_int_eq(h_send_raw(c, raw_nul, sizeof raw_nul - 1), 0);
    r = h_recv(c, T_MS);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    json_decref(r);

    /* A value with NUL goes in and out whole. */
    v = json_stringn("a\0b", 3);
    r = h_call(c,
               json_pack("{s:s,s:s,s:O}", "op", "cache.set", "key", "nk",
                         "value", v),
               T_MS);
    ck_assert_msg(h_ok(r), "cache.set: %s", h_errcode(r));
    json_decref(r);
    /* Read raw: the harness's reader refuses \u0000. */
    {
        static const char get[] = "{\"op\":\"cache.get\",\"key\":\"nk\"}\n";
        char got[1024];
        int fd = h_raw_unix(D.sock);
        raw_write(fd, get, sizeof get - 1);
        ck_assert(raw_read_lines(fd, 1, got, sizeof got, T_MS));
        close(fd);
        r = json_loads(got, JSON_ALLOW_NUL, NULL);
        ck_assert_msg(h_ok(r), "cache.get: %s", got);
        ck_assert(json_is_true(json_object_get(r, "hit")));
        ck_assert(json_equal(json_object_get(r, "value"), v));
        json_decref(r);
    }
    rr = h_redis_cmd(&R, "HGET leased:cache:{nk} v");
    ck_assert_ptr_nonnull(rr);
    ck_assert_int_eq(rr->type, REDIS_REPLY_STRING);
    ck_assert_int_eq(rr->len, 3);
    ck_assert_int_eq(memcmp(rr->str, "a\0b", 3), 0);
    freeReplyObject(rr);

    /* Keys and names keep refusing it. */
    r = h_call(c,
               json_pack("{s:s,s:O,s:s}", "op", "cache.set", "key", v, "value",
                         "x"),
               T_MS);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    json_decref(r);
    r = h_call(c, json_pack("{s:s,s:O}", "op", "lock", "key", v), T_MS);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    json_decref(r);
    json_decref(v);
    h_assert_ping(c);
    h_close(c);
}
END_TEST

/* FIELD's error message in R is "field 'FIELD' WHAT". */
static void
assert_field_error(json_t *r, const char *field, const char *what)
{
    char want[128];
    snprintf(want, sizeof want, "field '%s' %s", field, what);
    ck_assert_str_eq(h_errcode(r), "bad_request");
    ck_assert_str_eq(json_string_value(
                         json_object_get(json_object_get(r, "error"),
                                         "message")),
                     want);
    json_decref(r);
}

/* Every typed field answers alike: absent or null is "is required" where
 * the op needs it and the default where it does not; a value of the
 * wrong kind is named. */
START_TEST(test_required_fields)
{
    struct h_conn *c;
    json_t *r;

    h_start(NULL);
    c = h_connect_ok(&D);
    assert_field_error(h_callf(c, T_MS, "{s:s}", "op", "lock"), "key",
                       "is required");
    assert_field_error(h_callf(c, T_MS, "{s:s,s:n}", "op", "lock", "key"),
                       "key", "is required");
    assert_field_error(h_callf(c, T_MS, "{s:s,s:s}", "op", "extend", "key",
                               "rk"),
                       "ttl_ms", "is required");
    assert_field_error(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "lock", "key",
                               "rk", "ttl_ms", "x"),
                       "ttl_ms", "must be an integer");
    assert_field_error(h_callf(c, T_MS, "{s:s,s:s,s:i}", "op", "lock", "key",
                               "rk", "owner", 1),
                       "owner", "must be a string");
    /* Null where a field may be left out: the default. */
    r = h_callf(c, T_MS, "{s:s,s:s,s:n,s:n}", "op", "lock", "key", "rk",
                "owner", "ttl_ms");
    ck_assert_msg(h_ok(r), "lock: %s", h_errcode(r));
    ck_assert(json_is_true(json_object_get(r, "acquired")));
    json_decref(r);
    h_assert_ping(c);
    h_close(c);
}
END_TEST

/* An error that quotes a long multi-byte name is cut at a character. */
START_TEST(test_error_message_utf8)
{
    char op[1024] = "";
    struct h_conn *c;
    json_t *r;
    const char *msg;

    h_start(NULL);
    c = h_connect_ok(&D);
    for (int i = 0; i < 300; i++) {
        strcat(op, "\xc3\xa9");
    }
    r = h_callf(c, T_MS, "{s:s}", "op", op);
    ck_assert_str_eq(h_errcode(r), "unknown_op");
    msg = json_string_value(
        json_object_get(json_object_get(r, "error"), "message"));
    ck_assert_ptr_nonnull(msg);
    ck_assert_msg(strncmp(msg, "unknown op '\xc3\xa9\xc3\xa9", 16) == 0,
                  "message: %s", msg);
    ck_assert_int_gt(strlen(msg), 400);
    json_decref(r);
    h_close(c);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(http_refused, 60),
        H_CASE(http_long_first_line, 60),
        H_CASE(tcp_off_by_default, 60),
        H_CASE(adopted_tcp_needs_token, 60),
        H_CASE(output_limit, 240),
        H_CASE(resume_after_big_drain, 60),
        H_CASE(max_pending_per_request, 60),
        H_CASE(fair_turns, 240),
        H_CASE(emfile_pauses, 60),
        H_CASE(relative_paths_detached, 60),
        H_CASE(secret_file_mode, 60),
        H_CASE(unix_group, 60),
        H_CASE(crlf_at_limit, 60),
        H_CASE(nul_rules, 60),
        H_CASE(required_fields, 60),
        H_CASE(error_message_utf8, 60),
    };

    return H_MAIN(fx, cases);
}
