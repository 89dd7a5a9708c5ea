/*
 * Fuzz target: a hostile Redis. The daemon's modules run as at start-up,
 * connected over a Unix socket to a fake Redis in this process, and a
 * client session sends requests; the fake answers the handshake as Redis
 * would and every other command (the ops' scripts and commands, the
 * releases of a closing session, the subscriber's traffic) with the next
 * reply of the input. Whatever the replies, the daemon must not crash,
 * must answer every request and must close the session on its client's
 * EOF.
 *
 * Input layout: byte 0's low seven bits choose how the requests are cut
 * into writes (as in fuzz_session), its high bit runs the input under
 * cache.layout 2 (entries read with GET, a cache.mget's with one MGET);
 * bytes 1-2 (little endian) the length of the requests
 * (newline-delimited JSON), which follow; the rest is the stream of
 * replies. A reply is the longest prefix of the stream that parses as one
 * RESP value; a stream that does not parse is written as it is and the
 * connection closed after it, so the daemon also meets malformed and cut
 * replies. Once the stream is used up every command is answered with an
 * error reply. Every line the client receives must be a reply or an event
 * of the protocol, an error one with a code of the contract.
 */
#include "feed.h"
#include "ld_cache.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_errcode.h"
#include "ld_log.h"
#include "ld_pubsub.h"
#include "ld_redis.h"
#include "ld_server.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <jansson.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SETTLE_TURNS 20000
/* Reconnecting after a reply the daemon refused waits for its back-off;
 * this bounds the wall-clock wait for a connection at the start of an
 * input and for the last answers at its end. */
#define WAIT_MS 5000

static struct ld_config cfg;
static struct ld_ctx ctx;
static char tmpdir[64];
static char journal_path[128];
static char redis_path[96];

/* ---- the fake Redis -------------------------------------------------- */

struct fconn {
    int fd;
    struct event *ev;
    redisReader *rd; /* parses the daemon's commands */
    LIST_ENTRY(fconn) link;
};

static struct {
    int lfd;
    struct event *accept_ev;
    LIST_HEAD(, fconn) conns;
    const uint8_t *stream; /* replies not yet sent */
    size_t left;
} fake;

static void
fconn_free(struct fconn *f)
{
    LIST_REMOVE(f, link);
    event_free(f->ev);
    redisReaderFree(f->rd);
    close(f->fd);
    free(f);
}

static void
put(struct fconn *f, const void *p, size_t len)
{
    const char *c = p;
    while (len > 0) {
        ssize_t n = write(f->fd, c, len);
        if (n > 0) {
            c += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            /* The daemon stopped reading (it closed this connection,
             * or it is full of replies it has not parsed): what is
             * left is dropped, as a stalled Redis would lose it. */
            return;
        }
    }
}

static void
put_str(struct fconn *f, const char *s)
{
    put(f, s, strlen(s));
}

/* A reader that only finds where a value ends: nothing is built, so a
 * huge length in the input costs nothing here. */
static void *
scan_obj(void)
{
    static char token;
    return &token;
}
static void *
scan_string(const redisReadTask *t, char *s, size_t len)
{
    (void)t;
    (void)s;
    (void)len;
    return scan_obj();
}
static void *
scan_array(const redisReadTask *t, int n)
{
    (void)t;
    (void)n;
    return scan_obj();
}
static void *
scan_integer(const redisReadTask *t, long long v)
{
    (void)t;
    (void)v;
    return scan_obj();
}
static void *
scan_nil(const redisReadTask *t)
{
    (void)t;
    return scan_obj();
}
static void
scan_free(void *obj)
{
    (void)obj;
}
static redisReplyObjectFunctions scan_fns = {
    scan_string, scan_array, scan_integer, scan_nil, scan_free,
};

/* Length of the first complete RESP value of the stream, 0 if there is
 * none (malformed or cut). */
static size_t
next_reply_len(void)
{
    redisReader *r = redisReaderCreateWithFunctions(&scan_fns);
    void *obj = NULL;
    size_t len = 0;

    if (r == NULL) {
        abort();
    }
    redisReaderFeed(r, (const char *)fake.stream, fake.left);
    if (redisReaderGetReply(r, &obj) == REDIS_OK && obj != NULL) {
        len = r->pos; /* a fresh reader never compacts its first call */
    }
    redisReaderFree(r);
    return len;
}

/* Answer one command from the input. Returns false when the connection
 * was closed (the rest of the stream did not parse). */
static bool
answer_from_stream(struct fconn *f)
{
    if (fake.left == 0) {
        put_str(f, "-ERR no more replies\r\n");
        return true;
    }
    size_t len = next_reply_len();
    if (len == 0) {
        put(f, fake.stream, fake.left);
        fake.stream += fake.left;
        fake.left = 0;
        fconn_free(f);
        return false;
    }
    put(f, fake.stream, len);
    fake.stream += len;
    fake.left -= len;
    return true;
}

static bool
arg_is(const redisReply *cmd, size_t i, const char *s)
{
    return cmd->elements > i && cmd->element[i]->type == REDIS_REPLY_STRING &&
           strcasecmp(cmd->element[i]->str, s) == 0;
}

/* The handshake is answered as Redis would, so that the inputs reach the
 * ops; everything else comes from the input. */
static bool
answer(struct fconn *f, const redisReply *cmd)
{
    if (arg_is(cmd, 0, "CLIENT") || arg_is(cmd, 0, "SELECT") ||
        arg_is(cmd, 0, "AUTH")) {
        put_str(f, "+OK\r\n");
        return true;
    }
    if (arg_is(cmd, 0, "SCRIPT") && arg_is(cmd, 1, "LOAD")) {
        put_str(f, "$40\r\n0123456789abcdef0123456789abcdef01234567\r\n");
        return true;
    }
    if ((arg_is(cmd, 0, "SUBSCRIBE") || arg_is(cmd, 0, "UNSUBSCRIBE")) &&
        cmd->elements >= 2) {
        /* The confirmations, then what the input pushes (as a message
         * or anything else). */
        for (size_t i = 1; i < cmd->elements; i++) {
            char head[96];
            const redisReply *ch = cmd->element[i];
            snprintf(head, sizeof(head), "*3\r\n$%zu\r\n%s\r\n$%zu\r\n",
                     strlen(cmd->element[0]->str), cmd->element[0]->str,
                     ch->len);
            for (char *p = head; *p; p++) {
                if (*p >= 'A' && *p <= 'Z') {
                    *p = (char)(*p - 'A' + 'a');
                }
            }
            put_str(f, head);
            put(f, ch->str, ch->len);
            put_str(f, "\r\n:1\r\n");
        }
        return answer_from_stream(f);
    }
    return answer_from_stream(f);
}

static void
fconn_cb(evutil_socket_t fd, short what, void *arg)
{
    struct fconn *f = arg;
    char buf[65536];
    (void)what;

    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return;
    }
    if (n <= 0) {
        fconn_free(f);
        return;
    }
    redisReaderFeed(f->rd, buf, (size_t)n);
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(f->rd, &r) != REDIS_OK) {
            abort(); /* the daemon sent something that is not RESP */
        }
        if (r == NULL) {
            return;
        }
        redisReply *cmd = r;
        if (cmd->type != REDIS_REPLY_ARRAY || cmd->elements == 0) {
            abort(); /* nor a command */
        }
        bool open = answer(f, cmd);
        freeReplyObject(r);
        if (!open) {
            return;
        }
    }
}

static void
accept_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)what;
    (void)arg;
    int c = accept(fd, NULL, NULL);
    if (c < 0) {
        return;
    }
    fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
    /* The replies of one input are small: a socket buffer as large as
     * the biggest input keeps put() from ever meeting a full socket. */
    int sz = 1 << 20;
    setsockopt(c, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
    struct fconn *f = calloc(1, sizeof(*f));
    if (f == NULL) {
        abort();
    }
    f->fd = c;
    f->rd = redisReaderCreate();
    f->ev = event_new(ctx.base, c, EV_READ | EV_PERSIST, fconn_cb, f);
    if (f->rd == NULL || f->ev == NULL) {
        abort();
    }
    event_add(f->ev, NULL);
    LIST_INSERT_HEAD(&fake.conns, f, link);
}

static void
fake_listen(void)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", redis_path);
    fake.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fake.lfd < 0 ||
        bind(fake.lfd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        listen(fake.lfd, 16) != 0) {
        perror("fake redis");
        abort();
    }
    LIST_INIT(&fake.conns);
    fake.accept_ev = event_new(ctx.base, fake.lfd, EV_READ | EV_PERSIST,
                               accept_cb, NULL);
    event_add(fake.accept_ev, NULL);
}

/* ---- the daemon ------------------------------------------------------ */

static void
cleanup_files(void)
{
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", journal_path);
    unlink(tmp);
    unlink(journal_path);
    unlink(redis_path);
    rmdir(tmpdir);
}

static void
setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    ld_conf_defaults(&cfg);
    free(cfg.listen.unix_path);
    cfg.listen.unix_path = strdup("");
    free(cfg.listen.tcp);
    cfg.listen.tcp = strdup("");
    free(cfg.metrics.listen);
    cfg.metrics.listen = strdup("");
    snprintf(tmpdir, sizeof(tmpdir), "%s/ld-fuzz-reply.XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        abort();
    }
    snprintf(journal_path, sizeof(journal_path), "%s/journal", tmpdir);
    snprintf(redis_path, sizeof(redis_path), "%s/redis.sock", tmpdir);
    free(cfg.journal.path);
    cfg.journal.path = strdup(journal_path);
    cfg.journal.fsync = LD_FSYNC_EVERYSEC;
    free(cfg.redis.address);
    cfg.redis.address = strdup(redis_path);
    /* One connection: which command meets which reply follows from the
     * input alone. */
    cfg.redis.connections = 1;
    atexit(cleanup_files);

    /* FUZZ_REPLY_LOG=1 shows the daemon's log, to see what an input
     * does. */
    ld_log_level = getenv("FUZZ_REPLY_LOG") != NULL ? LD_LOG_DEBUG
                                                    : LD_LOG_ERROR + 1;
    ctx.cfg = &cfg;
    ctx.instance = "fuzzfuzzfuzzfuzz";
    ctx.base = event_base_new();
    if (ctx.base == NULL) {
        abort();
    }
    fake_listen();
    ld_stats_init(&ctx);
    if (ld_server_wire(&ctx) != LD_OK) {
        abort();
    }
    ld_redis_start();
    ld_pubsub_start();
}

/* As in fuzz_session: invalidations the input left queued would make
 * the state, and the cost of an input, grow with the run. */
static void
reset(void)
{
    ld_cache_free();
    unlink(journal_path);
    ld_stats_init(&ctx);
    if (ld_cache_init(&ctx) != LD_OK) {
        abort();
    }
}

/* What the client received and has not checked yet: whatever Redis
 * answered, every line must be a reply or an event of the protocol, and
 * an error must carry one of its codes. */
static struct {
    char *buf;
    size_t len, cap;
} client_in;

static void
check_line(const char *line, size_t len)
{
    json_error_t err;
    json_t *o = json_loadb(line, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES,
                           &err);
    if (!json_is_object(o)) {
        fprintf(stderr, "not a JSON object: %.*s\n", (int)len, line);
        abort();
    }
    json_t *ok = json_object_get(o, "ok");
    if (json_is_false(ok)) {
        const char *code = json_string_value(
            json_object_get(json_object_get(o, "error"), "code"));
        bool known = false;
        for (int c = 0; code != NULL && c < LD_E__COUNT; c++) {
            known = known || strcmp(code, ld_errcode_name(c)) == 0;
        }
        if (!known) {
            fprintf(stderr, "error without a known code: %.*s\n", (int)len,
                    line);
            abort();
        }
    } else if (!json_is_true(ok) && json_object_get(o, "event") == NULL) {
        fprintf(stderr, "neither a reply nor an event: %.*s\n", (int)len,
                line);
        abort();
    }
    json_decref(o);
}

static void
drain(int fd)
{
    char buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            return;
        }
        if (client_in.len + (size_t)n > client_in.cap) {
            client_in.cap = (client_in.len + (size_t)n) * 2;
            client_in.buf = realloc(client_in.buf, client_in.cap);
            if (client_in.buf == NULL) {
                abort();
            }
        }
        memcpy(client_in.buf + client_in.len, buf, (size_t)n);
        client_in.len += (size_t)n;
        char *start = client_in.buf, *nl;
        while ((nl = memchr(start, '\n',
                            client_in.len -
                                (size_t)(start - client_in.buf))) != NULL) {
            check_line(start, (size_t)(nl - start));
            start = nl + 1;
        }
        client_in.len -= (size_t)(start - client_in.buf);
        memmove(client_in.buf, start, client_in.len);
    }
}

static void
turn(int fd)
{
    event_base_loop(ctx.base, EVLOOP_NONBLOCK);
    if (fd >= 0) {
        drain(fd);
    }
}

static long long
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Turn the loop, blocking for timers when nothing is ready, until DONE
 * or WAIT_MS. */
static bool
wait_for(bool (*done)(void), int fd)
{
    long long deadline = now_ms() + WAIT_MS;
    for (unsigned i = 0; !done(); i++) {
        if (now_ms() > deadline) {
            return false;
        }
        if (i < SETTLE_TURNS) {
            turn(fd);
        } else {
            event_base_loop(ctx.base, EVLOOP_ONCE);
            if (fd >= 0) {
                drain(fd);
            }
        }
    }
    return true;
}

static bool
redis_ready(void)
{
    return ld_redis_ready();
}

static bool
settled(void)
{
    return ld_session_count() == 0 && ld_session_lingering() == 0 &&
           ld_redis_outstanding() == 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        setup();
        ready = true;
    }
    if (size < 3) {
        return 0;
    }
    unsigned piece = data[0] & 0x7f;
    cfg.cache.layout = data[0] & 0x80 ? 2 : 1;
    size_t reqlen = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (reqlen > size) {
        reqlen = size;
    }
    fake.stream = data + reqlen;
    fake.left = size - reqlen;

    /* The previous input may have left the connection closed. */
    if (!wait_for(redis_ready, -1)) {
        fprintf(stderr, "no Redis connection within %d ms\n", WAIT_MS);
        abort();
    }

    int client;
    if (!fuzz_session_open(&client)) {
        return 0;
    }
    fuzz_feed(client, data, reqlen, piece, turn, SETTLE_TURNS);
    /* Let the replies meet the requests before the client goes. */
    for (unsigned i = 0; i < 64; i++) {
        turn(client);
    }
    shutdown(client, SHUT_WR);
    if (!wait_for(settled, client)) {
        fprintf(stderr,
                "not settled within %d ms: sessions=%lld lingering=%lld "
                "redis outstanding=%lld\n",
                WAIT_MS, ld_session_count(), ld_session_lingering(),
                ld_redis_outstanding());
        abort();
    }
    close(client);
    if (client_in.len != 0) {
        fprintf(stderr, "a reply without its newline\n");
        abort();
    }
    free(client_in.buf);
    client_in.buf = NULL;
    client_in.cap = 0;
    fake.stream = NULL;
    fake.left = 0;
    reset();
    return 0;
}
