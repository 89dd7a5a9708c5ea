/* A hostile Redis against the daemon's memory: a server that announces
 * huge replies (the daemon refuses them and stays small). Every test
 * starts its own servers and leased. */

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

/* ---- 1. a hostile Redis -------------------------------------------------
 * A server on a loopback port that answers the handshake as Redis does and
 * every other command with HOSTILE, then, for a bulk header, streams
 * filler bytes until the daemon hangs up. It runs in a child process. */

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

/* One hostile reply: the client's cache.get fails with redis_unavailable
 * (the connection is dropped), the refusal is logged, the daemon's RSS
 * does not follow what the server announces or sends, and it still
 * answers. */
static void
hostile_case(const char *hostile, size_t stream, const char *logged)
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
    ck_assert_str_eq(h_errcode(r), "redis_unavailable");
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
    hostile_case("*2147483647\r\n", 0, "array of 2147483647 elements");
}
END_TEST

/* A bulk string of a gigabyte, then 200 MB of it: the daemon stops
 * buffering at its bound (about max_output_bytes) and hangs up. */
START_TEST(test_hostile_bulk)
{
    hostile_case("*2\r\n$3\r\nhit\r\n$1000000000\r\n", 200u << 20,
                 "of one reply buffered");
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(hostile_array_header, 60),
        H_CASE(hostile_bulk, 120),
    };

    return H_MAIN(fx, cases);
}
