/* Integration test harness: see harness.h for the contract.
 *
 * Every child is started with PR_SET_PDEATHSIG(SIGKILL), so when Check
 * kills a test process on timeout (or a failed assertion ends it with
 * _exit), its redis-server and leased die with it. Normal exits also kill
 * whatever is still tracked from an atexit handler. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#define H_REDIS_READY_MS 10000
#define H_DAEMON_READY_MS 20000
#define H_REDIS_CONNECT_MS 5000
#define H_DAEMON_STOP_MS 15000
#define H_SEND_MS 10000
#define H_LOG_TAIL_BYTES (256 * 1024)
#define H_MAX_TRACKED 128
/* h_call ids start high so they never meet ids a test picks by hand. */
#define H_FIRST_CALL_ID 1000000

/* The shared scenarios on a cluster (see h_on_cluster), at the end. */
static bool is_cluster(const struct h_redis *r);
static redisReply *cluster_vcommand(const struct h_redis *r, const char *fmt,
                                    va_list ap);
static bool cluster_wants(const struct h_redis *r, const char *extra_args);
static int cluster_attach(struct h_redis *r);
static bool daemon_on_cluster(const struct h_daemon *d);
static void write_cluster_section(FILE *m);
static int cluster_subst_address(struct h_daemon *d);
static void wait_cluster_connected(struct h_conn *c, long long deadline);
static bool cluster_subscribed(const char *channel);
static const char *cluster_skip_reason(const char *suite, const char *name);

/* --- process and directory tracking ----------------------------------- */

/* Entries remember which process registered them: a Check test process is
 * a fork of the runner, and must not kill what its parent started. */
struct h_tracked_pid {
    pid_t pid;
    pid_t owner;
};

struct h_tracked_dir {
    char path[256];
    pid_t owner;
};

static struct h_tracked_pid tracked_pids[H_MAX_TRACKED];
static struct h_tracked_dir tracked_dirs[H_MAX_TRACKED];
static bool atexit_registered;

static void rm_rf(const char *path);

static void
h_atexit(void)
{
    pid_t self = getpid();

    for (int i = 0; i < H_MAX_TRACKED; i++) {
        if (tracked_pids[i].pid > 0 && tracked_pids[i].owner == self) {
            kill(tracked_pids[i].pid, SIGKILL);
            waitpid(tracked_pids[i].pid, NULL, 0);
            tracked_pids[i].pid = 0;
        }
    }
    for (int i = 0; i < H_MAX_TRACKED; i++) {
        if (tracked_dirs[i].path[0] && tracked_dirs[i].owner == self) {
            rm_rf(tracked_dirs[i].path);
            tracked_dirs[i].path[0] = '\0';
        }
    }
}

static void
ensure_atexit(void)
{
    if (!atexit_registered) {
        atexit(h_atexit);
        atexit_registered = true;
    }
}

void
h_track_pid(pid_t pid)
{
    ensure_atexit();
    for (int i = 0; i < H_MAX_TRACKED; i++) {
        if (tracked_pids[i].pid <= 0) {
            tracked_pids[i].pid = pid;
            tracked_pids[i].owner = getpid();
            return;
        }
    }
    fprintf(stderr, "harness: too many tracked pids\n");
}

void
h_untrack_pid(pid_t pid)
{
    for (int i = 0; i < H_MAX_TRACKED; i++) {
        if (tracked_pids[i].pid == pid) {
            tracked_pids[i].pid = 0;
        }
    }
}

static void
track_dir(const char *path)
{
    ensure_atexit();
    for (int i = 0; i < H_MAX_TRACKED; i++) {
        if (!tracked_dirs[i].path[0]) {
            snprintf(tracked_dirs[i].path, sizeof tracked_dirs[i].path, "%s",
                     path);
            tracked_dirs[i].owner = getpid();
            return;
        }
    }
    fprintf(stderr, "harness: too many tracked dirs\n");
}

static void
untrack_dir(const char *path)
{
    for (int i = 0; i < H_MAX_TRACKED; i++) {
        if (tracked_dirs[i].path[0] && !strcmp(tracked_dirs[i].path, path)) {
            tracked_dirs[i].path[0] = '\0';
        }
    }
}

static int
rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void
rm_rf(const char *path)
{
    /* A dying child may still create a file while we walk; try again. */
    for (int i = 0; i < 5; i++) {
        nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
        if (access(path, F_OK) != 0) {
            return;
        }
        usleep(20000);
    }
}

/* --- small utilities -------------------------------------------------- */

long long
h_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void
sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

bool
h_wait_until(bool (*cond)(void *), void *arg, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;

    for (;;) {
        if (cond(arg)) {
            return true;
        }
        if (h_now_ms() >= deadline) {
            return cond(arg);
        }
        sleep_ms(5);
    }
}

/* A loopback port nobody listens on now. Not one this process was given
 * before: a port closed a moment ago may well come back from bind(0), and
 * a test that takes two in a row (leased's TCP listener, then its Redis)
 * must not get the same one twice. The sockets of ports refused stay
 * bound meanwhile, so that bind(0) moves on. */
int
h_free_port(void)
{
    enum { GIVEN = 256, TRIES = 32 };
    static int given[GIVEN];
    static size_t ngiven;
    int fds[TRIES], nfds = 0, port = -1;

    while (port < 0 && nfds < TRIES) {
        struct sockaddr_in sa;
        socklen_t len = sizeof sa;
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            break;
        }
        fds[nfds++] = fd;
        memset(&sa, 0, sizeof sa);
        sa.sin_family = AF_INET;
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        sa.sin_port = 0;
        if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
            break;
        }
        int p = ntohs(sa.sin_port);
        bool seen = false;
        for (size_t i = 0; i < ngiven && i < GIVEN; i++) {
            seen = seen || given[i] == p;
        }
        if (!seen) {
            port = p;
        }
    }
    while (nfds > 0) {
        close(fds[--nfds]);
    }
    if (port > 0) {
        given[ngiven++ % GIVEN] = port;
    }
    return port;
}

const char *
h_srcdir(void)
{
    const char *p = getenv("LD_SRCDIR");

    return p && *p ? p : ".";
}

const char *
h_leased_bin(void)
{
    const char *p = getenv("LEASED_BIN");

    return p && *p ? p : "src/leased";
}

static const char *
redis_bin(void)
{
    const char *p = getenv("REDIS_SERVER");

    return p && *p ? p : "redis-server";
}

/* A fresh directory under $TMPDIR (or /tmp). Unix socket paths inside it
 * must stay well below sun_path's 108 bytes, so a long $TMPDIR is
 * ignored. */
static int
make_tmpdir(char *buf, size_t len, const char *tag)
{
    const char *base = getenv("TMPDIR");

    if (!base || !*base || strlen(base) > 60) {
        base = "/tmp";
    }
    if ((size_t)snprintf(buf, len, "%s/%s-XXXXXX", base, tag) >= len) {
        return -1;
    }
    if (!mkdtemp(buf)) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", buf, strerror(errno));
        buf[0] = '\0';
        return -1;
    }
    track_dir(buf);
    return 0;
}

int
h_tmpdir(char *buf, size_t len)
{
    return make_tmpdir(buf, len, "ldt");
}

void
h_rmdir(const char *path)
{
    if (path && path[0]) {
        rm_rf(path);
        untrack_dir(path);
    }
}

static int
write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "we");

    if (!f) {
        fprintf(stderr, "harness: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fputs(text, f);
    return fclose(f) == 0 ? 0 : -1;
}

/* Print the last H_LOG_TAIL_BYTES of a file to stderr. */
static void
dump_file(const char *title, const char *path)
{
    FILE *f = fopen(path, "re");
    char buf[8192];
    size_t n;
    long size;

    fprintf(stderr, "---- %s: %s ----\n", title, path);
    if (!f) {
        fprintf(stderr, "(cannot open: %s)\n", strerror(errno));
        return;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > H_LOG_TAIL_BYTES) {
        fprintf(stderr, "(first %ld bytes omitted)\n",
                size - H_LOG_TAIL_BYTES);
        fseek(f, size - H_LOG_TAIL_BYTES, SEEK_SET);
    } else {
        fseek(f, 0, SEEK_SET);
    }
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        fwrite(buf, 1, n, stderr);
    }
    fclose(f);
    fprintf(stderr, "---- end of %s ----\n", title);
    fflush(stderr);
}

/* --- child processes -------------------------------------------------- */

/* Fork and exec ARGV with stdout/stderr on OUT_FD/ERR_FD (-1: /dev/null)
 * and, when LISTEN_FD >= 0, that socket passed as fd 3 the way systemd's
 * socket activation does. The child dies with the test process. */
static pid_t
spawn(const char *const argv[], int out_fd, int err_fd, int listen_fd)
{
    pid_t parent = getpid();
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "harness: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid > 0) {
        h_track_pid(pid);
        return pid;
    }

    /* child */
    sigset_t none;
    int devnull;
    unsigned first_close = 3;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) {
        _exit(127); /* the test process died before prctl */
    }
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);

    devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
    }
    dup2(out_fd >= 0 ? out_fd : devnull, 1);
    dup2(err_fd >= 0 ? err_fd : devnull, 2);

    /* Never leak the test's systemd context into the daemon. */
    unsetenv("NOTIFY_SOCKET");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDNAMES");
    if (listen_fd >= 0) {
        char pidbuf[32];

        if (listen_fd != 3) {
            dup2(listen_fd, 3);
        }
        fcntl(3, F_SETFD, 0);
        snprintf(pidbuf, sizeof pidbuf, "%ld", (long)getpid());
        setenv("LISTEN_FDS", "1", 1);
        setenv("LISTEN_PID", pidbuf, 1);
        first_close = 4;
    }
    if (close_range(first_close, ~0U, 0) < 0) {
        for (int fd = (int)first_close; fd < 1024; fd++) {
            close(fd);
        }
    }
    execvp(argv[0], (char *const *)argv);
    dprintf(2, "harness: exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
}

/* Decode a wait status the way harness.h promises. */
static int
exit_code(int status)
{
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    if (WIFSIGNALED(status)) {
        return 128 + WTERMSIG(status);
    }
    return -1;
}

/* waitpid with a deadline: returns the pid when reaped, 0 on timeout. */
static pid_t
wait_deadline(pid_t pid, int *status, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;

    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);

        if (r == pid) {
            return pid;
        }
        if (r < 0 && errno != EINTR) {
            *status = 0;
            return pid; /* not our child any more: nothing to wait */
        }
        if (h_now_ms() >= deadline) {
            return 0;
        }
        sleep_ms(5);
    }
}

static void
kill_reap(pid_t pid)
{
    if (pid > 0) {
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        h_untrack_pid(pid);
    }
}

int
h_run(const char *const argv[], char *out, size_t outlen, char *err,
      size_t errlen, int timeout_ms)
{
    int po[2], pe[2], status = 0;
    size_t used[2] = {0, 0};
    char *bufs[2] = {out, err};
    size_t lens[2] = {outlen, errlen};
    struct pollfd pfd[2];
    long long deadline = h_now_ms() + timeout_ms;
    pid_t pid;
    int open_fds = 2;

    if (out && outlen) {
        out[0] = '\0';
    }
    if (err && errlen) {
        err[0] = '\0';
    }
    if (pipe2(po, O_CLOEXEC) < 0) {
        return -1;
    }
    if (pipe2(pe, O_CLOEXEC) < 0) {
        close(po[0]);
        close(po[1]);
        return -1;
    }
    pid = spawn(argv, po[1], pe[1], -1);
    close(po[1]);
    close(pe[1]);
    if (pid < 0) {
        close(po[0]);
        close(pe[0]);
        return -1;
    }
    pfd[0].fd = po[0];
    pfd[1].fd = pe[0];
    pfd[0].events = pfd[1].events = POLLIN;
    while (open_fds > 0) {
        long long left = deadline - h_now_ms();

        if (left <= 0 || poll(pfd, 2, (int)left) < 0) {
            if (left > 0 && errno == EINTR) {
                continue;
            }
            break;
        }
        for (int i = 0; i < 2; i++) {
            char tmp[4096];
            ssize_t n;

            if (pfd[i].fd < 0 || !pfd[i].revents) {
                continue;
            }
            n = read(pfd[i].fd, tmp, sizeof tmp);
            if (n <= 0) {
                close(pfd[i].fd);
                pfd[i].fd = -1;
                open_fds--;
                continue;
            }
            if (bufs[i] && lens[i] > used[i] + 1) {
                size_t room = lens[i] - used[i] - 1;
                size_t k = (size_t)n < room ? (size_t)n : room;

                memcpy(bufs[i] + used[i], tmp, k);
                used[i] += k;
                bufs[i][used[i]] = '\0';
            }
        }
    }
    for (int i = 0; i < 2; i++) {
        if (pfd[i].fd >= 0) {
            close(pfd[i].fd);
        }
    }
    {
        long long left = deadline - h_now_ms();

        if (wait_deadline(pid, &status, left > 0 ? (int)left : 0) == 0) {
            fprintf(stderr, "harness: %s did not finish in %d ms\n", argv[0],
                    timeout_ms);
            kill_reap(pid);
            return -1;
        }
    }
    h_untrack_pid(pid);
    return exit_code(status);
}

/* --- redis-server ----------------------------------------------------- */

/* Split redis arguments on blanks; "..." groups (and may be empty). */
static int
split_args(char *s, const char **argv, int max)
{
    int n = 0;

    while (*s) {
        char *tok;

        while (*s == ' ' || *s == '\t') {
            s++;
        }
        if (!*s) {
            break;
        }
        if (*s == '"') {
            tok = ++s;
            while (*s && *s != '"') {
                s++;
            }
        } else {
            tok = s;
            while (*s && *s != ' ' && *s != '\t') {
                s++;
            }
        }
        if (*s) {
            *s++ = '\0';
        }
        if (n >= max) {
            return -1;
        }
        argv[n++] = tok;
    }
    return n;
}

redisContext *
h_redis_connect(const struct h_redis *r)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);

    if (!c) {
        return NULL;
    }
    if (c->err) {
        redisFree(c);
        return NULL;
    }
    redisSetTimeout(c, tv);
    /* A server started with --requirepass gets the password on every
     * connection the test opens, so tests read as for an open server. */
    const char *pw = strstr(r->extra, "--requirepass ");
    if (pw) {
        char word[128];
        if (sscanf(pw + strlen("--requirepass "), "%127s", word) == 1) {
            redisReply *a = redisCommand(c, "AUTH %s", word);
            if (a) {
                freeReplyObject(a);
            }
        }
    }
    return c;
}

redisReply *
h_redis_vcmd(const struct h_redis *r, const char *fmt, va_list ap)
{
    redisContext *c;
    redisReply *reply;

    if (is_cluster(r)) {
        return cluster_vcommand(r, fmt, ap);
    }
    c = h_redis_connect(r);
    if (!c) {
        return NULL;
    }
    reply = redisvCommand(c, fmt, ap);
    redisFree(c);
    return reply;
}

redisReply *
h_redis_cmd(const struct h_redis *r, const char *fmt, ...)
{
    redisReply *reply;
    va_list ap;

    va_start(ap, fmt);
    reply = h_redis_vcmd(r, fmt, ap);
    va_end(ap);
    return reply;
}

/* True when the server on R's port is R's own process and answers. The pid
 * check matters: a busy port may be served by someone else's redis. */
static bool
redis_is_ours(const struct h_redis *r)
{
    redisContext *c = h_redis_connect(r);
    redisReply *reply;
    bool ours = false;

    if (!c) {
        return false;
    }
    reply = redisCommand(c, "INFO server");
    if (reply && reply->type == REDIS_REPLY_STRING) {
        const char *p = strstr(reply->str, "process_id:");

        ours = p && atol(p + strlen("process_id:")) == (long)r->pid;
    }
    if (reply) {
        freeReplyObject(reply);
    }
    if (ours) {
        reply = redisCommand(c, "PING");
        ours = reply && reply->type == REDIS_REPLY_STATUS &&
               !strcmp(reply->str, "PONG");
        if (reply) {
            freeReplyObject(reply);
        }
    }
    redisFree(c);
    return ours;
}

/* Start redis-server on r->port and wait until it answers. Returns 0, -2
 * when it exited early (typically: port taken), -1 otherwise. */
static int
redis_spawn_wait(struct h_redis *r)
{
    char port[16], logfile[300], extra[sizeof r->extra];
    const char *argv[64];
    int argc = 0, n, fd, status;
    long long deadline;

    snprintf(port, sizeof port, "%d", r->port);
    snprintf(logfile, sizeof logfile, "%s/redis.log", r->dir);
    argv[argc++] = redis_bin();
    argv[argc++] = "--port";
    argv[argc++] = port;
    argv[argc++] = "--bind";
    argv[argc++] = "127.0.0.1";
    argv[argc++] = "--save";
    argv[argc++] = "";
    argv[argc++] = "--appendonly";
    argv[argc++] = "no";
    argv[argc++] = "--dir";
    argv[argc++] = r->dir;
    argv[argc++] = "--daemonize";
    argv[argc++] = "no";
    argv[argc++] = "--logfile";
    argv[argc++] = logfile;
    snprintf(extra, sizeof extra, "%s", r->extra);
    n = split_args(extra, argv + argc, 63 - argc);
    if (n < 0) {
        fprintf(stderr, "harness: too many redis arguments\n");
        return -1;
    }
    argc += n;
    argv[argc] = NULL;

    fd = open(logfile, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    r->pid = spawn(argv, fd, fd, -1);
    if (fd >= 0) {
        close(fd);
    }
    if (r->pid < 0) {
        r->pid = 0;
        return -1;
    }
    deadline = h_now_ms() + H_REDIS_READY_MS;
    while (h_now_ms() < deadline) {
        if (waitpid(r->pid, &status, WNOHANG) == r->pid) {
            h_untrack_pid(r->pid);
            r->pid = 0;
            return -2;
        }
        if (redis_is_ours(r)) {
            return 0;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "harness: redis-server on port %d not ready in %d ms\n",
            r->port, H_REDIS_READY_MS);
    kill_reap(r->pid);
    r->pid = 0;
    return -1;
}

int
h_redis_start(struct h_redis *r, const char *extra_args)
{
    int rc = -1;

    if (cluster_wants(r, extra_args)) {
        return cluster_attach(r);
    }
    memset(r, 0, sizeof *r);
    if (extra_args) {
        if (strlen(extra_args) >= sizeof r->extra) {
            fprintf(stderr, "harness: redis extra arguments too long\n");
            return -1;
        }
        snprintf(r->extra, sizeof r->extra, "%s", extra_args);
    }
    if (make_tmpdir(r->dir, sizeof r->dir, "ldr") < 0) {
        return -1;
    }
    /* The port was free a moment ago; another test may take it first. */
    for (int attempt = 0; attempt < 10; attempt++) {
        r->port = h_free_port();
        if (r->port <= 0) {
            break;
        }
        rc = redis_spawn_wait(r);
        if (rc != -2) {
            break;
        }
    }
    if (rc != 0) {
        char log[300];

        snprintf(log, sizeof log, "%s/redis.log", r->dir);
        dump_file("redis log", log);
        h_rmdir(r->dir);
        r->dir[0] = '\0';
        r->port = 0;
        return -1;
    }
    return 0;
}

/* Start the Sentinel of S (its conf written) on s->port; 0, -2 when it
 * exited early (port taken), -1 otherwise. */
static int
sentinel_spawn_wait(struct h_redis *s, const char *conf)
{
    char logfile[300];
    int fd, status;
    long long deadline;

    snprintf(logfile, sizeof logfile, "%s/sentinel.log", s->dir);
    const char *argv[] = {redis_bin(), conf,        "--sentinel", "--port",
                          NULL,        "--logfile", logfile,      NULL};
    char port[16];
    snprintf(port, sizeof port, "%d", s->port);
    argv[4] = port;
    fd = open(logfile, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    s->pid = spawn(argv, fd, fd, -1);
    if (fd >= 0) {
        close(fd);
    }
    if (s->pid < 0) {
        s->pid = 0;
        return -1;
    }
    deadline = h_now_ms() + H_REDIS_READY_MS;
    while (h_now_ms() < deadline) {
        if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
            h_untrack_pid(s->pid);
            s->pid = 0;
            return -2;
        }
        if (redis_is_ours(s)) {
            return 0;
        }
        sleep_ms(10);
    }
    kill_reap(s->pid);
    s->pid = 0;
    return -1;
}

int
h_sentinel_start(struct h_redis *s, int master_port, const char *name)
{
    return h_sentinel_start_ex(s, master_port, name, "");
}

int
h_sentinel_start_ex(struct h_redis *s, int master_port, const char *name,
                    const char *extra_conf)
{
    char conf[300], text[4096];
    int rc = -1;

    memset(s, 0, sizeof *s);
    /* A password the Sentinel requires is one the harness' own
     * connections send (h_redis_connect). */
    const char *pw = strstr(extra_conf, "requirepass ");
    if (pw != NULL) {
        snprintf(s->extra, sizeof s->extra, "--requirepass %.*s",
                 (int)strcspn(pw + strlen("requirepass "), "\n"),
                 pw + strlen("requirepass "));
    }
    if (make_tmpdir(s->dir, sizeof s->dir, "lds") < 0) {
        return -1;
    }
    snprintf(conf, sizeof conf, "%s/sentinel.conf", s->dir);
    for (int attempt = 0; attempt < 10; attempt++) {
        s->port = h_free_port();
        int n = snprintf(text, sizeof text,
                         "bind 127.0.0.1\ndir %s\n"
                         "sentinel resolve-hostnames no\n",
                         s->dir);
        if (name != NULL) {
            n += snprintf(text + n, sizeof text - (size_t)n,
                          "sentinel monitor %s 127.0.0.1 %d 2\n"
                          "sentinel down-after-milliseconds %s 1000\n"
                          "sentinel failover-timeout %s 3000\n",
                          name, master_port, name, name);
        }
        if ((size_t)n < sizeof text) {
            snprintf(text + n, sizeof text - (size_t)n, "%s", extra_conf);
        }
        /* Sentinels rewrite their file: a fresh one per attempt. */
        if (write_file(conf, text) != 0) {
            break;
        }
        rc = sentinel_spawn_wait(s, conf);
        if (rc != -2) {
            break;
        }
    }
    if (rc != 0) {
        char log[300];

        snprintf(log, sizeof log, "%s/sentinel.log", s->dir);
        dump_file("sentinel log", log);
        h_rmdir(s->dir);
        s->dir[0] = '\0';
        s->port = 0;
        return -1;
    }
    return 0;
}

/* The field NAME of SENTINEL MASTER mymaster on S (-1 if absent). */
static long long
sentinel_master_field(const struct h_redis *s, const char *name)
{
    long long v = -1;
    redisReply *r = h_redis_cmd(s, "SENTINEL MASTER mymaster");
    if (r != NULL && r->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i + 1 < r->elements; i += 2) {
            if (strcmp(r->element[i]->str, name) == 0) {
                v = atoll(r->element[i + 1]->str);
            }
        }
    }
    if (r != NULL) {
        freeReplyObject(r);
    }
    return v;
}

struct sentinels_want {
    struct h_redis *s;
    int n;
    int replicas;
};

static bool
sentinels_ready(void *arg)
{
    const struct sentinels_want *w = arg;
    for (int i = 0; i < w->n; i++) {
        if (sentinel_master_field(&w->s[i], "num-other-sentinels") !=
                w->n - 1 ||
            sentinel_master_field(&w->s[i], "num-slaves") != w->replicas) {
            return false;
        }
    }
    return true;
}

bool
h_sentinels_ready(struct h_redis *s, int n, int replicas, int timeout_ms)
{
    struct sentinels_want w = {s, n, replicas};
    return h_wait_until(sentinels_ready, &w, timeout_ms);
}

struct master_want {
    struct h_conn *c;
    int port;
};

static bool
master_is(void *arg)
{
    const struct master_want *w = arg;
    char want[64];
    json_t *r = h_callf(w->c, 5000, "{s:s}", "op", "stats");
    const char *m = json_string_value(
        json_object_get(json_object_get(r, "stats"), "redis_master"));
    snprintf(want, sizeof want, "127.0.0.1:%d", w->port);
    bool is = m != NULL && strcmp(m, want) == 0;
    json_decref(r);
    return is;
}

bool
h_wait_master(struct h_conn *c, int port, int timeout_ms)
{
    struct master_want w = {c, port};
    return h_wait_until(master_is, &w, timeout_ms);
}

int
h_redis_restart(struct h_redis *r)
{
    long long deadline = h_now_ms() + H_REDIS_READY_MS;
    int rc;

    /* Only when it fails: a passing ck_assert reports progress, which a
     * process outside a test (run_on_cluster) must not. */
    if (is_cluster(r)) {
        ck_abort_msg("this case restarts the one Redis, which is a shared "
                     "cluster here: name it in cluster_skips (harness.c)");
    }
    if (r->pid > 0) {
        h_redis_kill(r);
    }
    /* The old socket may linger for a moment; retry the same port. */
    do {
        rc = redis_spawn_wait(r);
        if (rc != -2) {
            break;
        }
        sleep_ms(50);
    } while (h_now_ms() < deadline);
    if (rc != 0) {
        char log[300];

        snprintf(log, sizeof log, "%s/redis.log", r->dir);
        dump_file("redis log", log);
        return -1;
    }
    return 0;
}

void
h_redis_kill(struct h_redis *r)
{
    /* Only when it fails: a passing ck_assert reports progress, which a
     * process outside a test (run_on_cluster) must not. */
    if (is_cluster(r)) {
        ck_abort_msg("this case kills the one Redis, which is a shared "
                     "cluster here: name it in cluster_skips (harness.c)");
    }
    if (r->pid > 0) {
        kill_reap(r->pid);
        r->pid = 0;
    }
}

/* SIGSTOP or SIGCONT to the one Redis. On a shared cluster there is no
 * one Redis (pid 0), and kill(0, ...) would stop the test itself. */
void
h_redis_signal(struct h_redis *r, int sig)
{
    if (is_cluster(r) || r->pid <= 0) {
        ck_abort_msg("this case stops the one Redis, which is a shared "
                     "cluster here: name it in cluster_skips (harness.c)");
    }
    ck_assert_int_eq(kill(r->pid, sig), 0);
}

void
h_redis_stop(struct h_redis *r)
{
    if (!is_cluster(r)) {
        h_redis_kill(r);
    }
    if (r->dir[0]) {
        h_rmdir(r->dir);
        r->dir[0] = '\0';
    }
}

/* --- leased ----------------------------------------------------------- */

/* The line of EXTRA that opens the top-level section NAME (a line
 * "NAME:"), or NULL. */
static const char *
section_at(const char *extra, const char *name)
{
    size_t nlen = strlen(name);
    const char *line = extra;

    while (line && *line) {
        size_t k = 0;

        while ((line[k] >= 'a' && line[k] <= 'z') || line[k] == '_') {
            k++;
        }
        if (k > 0 && line[k] == ':' && k == nlen && !memcmp(line, name, k)) {
            return line;
        }
        line = strchr(line, '\n');
        if (line) {
            line++;
        }
    }
    return NULL;
}

/* Does EXTRA define the top-level section NAME? */
static bool
has_section(const char *extra, const char *name)
{
    return section_at(extra, name) != NULL;
}

/* Copy IN to OUT replacing every "@DIR@" by DIR. */
static int
subst_dir(const char *in, const char *dir, char *out, size_t len)
{
    size_t used = 0, dlen = strlen(dir);

    while (*in) {
        if (!strncmp(in, "@DIR@", 5)) {
            if (used + dlen >= len) {
                return -1;
            }
            memcpy(out + used, dir, dlen);
            used += dlen;
            in += 5;
        } else {
            if (used + 1 >= len) {
                return -1;
            }
            out[used++] = *in++;
        }
    }
    out[used] = '\0';
    return 0;
}

#if defined(H_SEM_LAYOUT) || defined(H_CACHE_LAYOUT)
/* Does the section of EXTRA opening at AT set KEY (a line "  KEY:")? */
static bool
section_sets(const char *at, const char *key)
{
    size_t klen = strlen(key);
    for (const char *line = strchr(at, '\n'); line && line[1] == ' ';
         line = strchr(line + 1, '\n')) {
        if (strncmp(line + 1, "  ", 2) == 0 &&
            strncmp(line + 3, key, klen) == 0 && line[3 + klen] == ':') {
            return true;
        }
    }
    return false;
}

/* Put X into M with KEY: VALUE in its SECTION, unless that sets KEY
 * already: after the section's line when X has it, else in a section of
 * its own before X. What of X is left to put goes back. */
static const char *
put_default(FILE *m, const char *x, const char *section, const char *key,
            int value)
{
    const char *at = section_at(x, section);
    if (at == NULL) {
        fprintf(m, "%s:\n  %s: %d\n", section, key, value);
        return x;
    }
    if (section_sets(at, key)) {
        return x;
    }
    /* After the section's line ("lock:", its last maybe). */
    const char *end = strchr(at, '\n');
    size_t n = end != NULL ? (size_t)(end - x) : strlen(x);
    fwrite(x, 1, n, m);
    fprintf(m, "\n  %s: %d\n", key, value);
    return end != NULL ? end + 1 : "";
}
#endif

/* The case's YAML X into M. A program built with H_SEM_LAYOUT (such as
 * check_sem_layout2) runs every daemon under that lock.sem_layout, one
 * built with H_CACHE_LAYOUT (check_cache_layout2...) under that
 * cache.layout, unless the case sets one itself. A program is built with
 * one of them at most. */
static void
put_extra(FILE *m, const char *x)
{
#ifdef H_SEM_LAYOUT
    x = put_default(m, x, "lock", "sem_layout", H_SEM_LAYOUT);
#endif
#ifdef H_CACHE_LAYOUT
    x = put_default(m, x, "cache", "layout", H_CACHE_LAYOUT);
#endif
    fputs(x, m);
    if (*x && x[strlen(x) - 1] != '\n') {
        fputc('\n', m);
    }
}

static int
write_daemon_conf(struct h_daemon *d)
{
    char *text = NULL;
    size_t size = 0;
    FILE *m = open_memstream(&text, &size);
    const char *x = d->yaml_extra;
    int rc;

    if (!m) {
        return -1;
    }
    fprintf(m, "# written by the integration test harness\n");
    if (!has_section(x, "listen")) {
        fprintf(m, "listen:\n  unix: \"%s\"\n  tcp: \"127.0.0.1:0\"\n",
                d->sock);
    }
    if (!has_section(x, "metrics")) {
        fprintf(m, "metrics:\n  listen: \"\"\n");
    }
    if (!has_section(x, "redis") && daemon_on_cluster(d)) {
        write_cluster_section(m);
    } else if (!has_section(x, "redis")) {
        fprintf(m, "redis:\n  address: \"127.0.0.1:%d\"\n", d->redis_port);
    }
    if (!has_section(x, "journal")) {
        fprintf(m, "journal:\n  path: \"%s\"\n", d->journal);
    }
    if (!has_section(x, "log")) {
        fprintf(m, "log:\n  level: debug\n");
    }
    put_extra(m, x);
    fclose(m);
    rc = write_file(d->conf, text);
    free(text);
    return rc;
}

/* Connect, ping and read the bound ports from stats. */
static bool
daemon_answers(struct h_daemon *d)
{
    struct h_conn *c = h_connect(d);
    json_t *reply;
    bool ok = false;

    if (!c) {
        return false;
    }
    reply = h_callf(c, 2000, "{s:s}", "op", "ping");
    if (h_ok(reply)) {
        json_t *st;

        json_decref(reply);
        reply = h_callf(c, 2000, "{s:s}", "op", "stats");
        st = json_object_get(reply, "stats");
        if (h_ok(reply) && st) {
            d->tcp_port = (int)json_integer_value(
                json_object_get(st, "tcp_port"));
            d->metrics_port = (int)json_integer_value(
                json_object_get(st, "metrics_port"));
            ok = true;
        }
    }
    json_decref(reply);
    h_close(c);
    return ok;
}

/* $LEASED_WRAPPER (e.g. "valgrind -q --error-exitcode=99
 * --leak-check=full") runs the daemon under a memory checker: the same
 * suite, one switch. Words are split on spaces. */
static int
daemon_argv(struct h_daemon *d, const char **argv, size_t max, char *buf,
            size_t buflen)
{
    const char *w = getenv("LEASED_WRAPPER");
    size_t n = 0;

    if (w && *w) {
        snprintf(buf, buflen, "%s", w);
        for (char *tok = strtok(buf, " "); tok && n + 5 < max;
             tok = strtok(NULL, " ")) {
            argv[n++] = tok;
        }
    }
    argv[n++] = h_leased_bin();
    argv[n++] = "-f";
    argv[n++] = "-c";
    argv[n++] = d->conf;
    argv[n] = NULL;
    return 0;
}

/* A sanitizer or valgrind report in the daemon's log fails the test even
 * when every protocol assertion passed. */
static void
check_memory_report(const struct h_daemon *d)
{
    static const char *marks[] = {
        "ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
        "runtime error:",          "Invalid read",
        "Invalid write",           "definitely lost in",
        "uninitialised value",
    };
    char line[1024];
    FILE *f = fopen(d->log, "r");

    if (!f) {
        return;
    }
    while (fgets(line, sizeof line, f)) {
        for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
            if (strstr(line, marks[i])) {
                fclose(f);
                fprintf(stderr,
                        "harness: memory error reported by leased "
                        "(%s)\n",
                        marks[i]);
                h_daemon_dump_log(d);
                exit(1);
            }
        }
    }
    fclose(f);
}

/* The daemon answers ping before its Redis connections are up, and until
 * then ops answer redis_unavailable. A test that gave the daemon a Redis
 * starts once it is connected; a Redis that is down on purpose (no
 * connection within the bound) leaves the test to its own checks. */
static void
wait_redis_connected(struct h_daemon *d)
{
    long long deadline = h_now_ms() + H_REDIS_CONNECT_MS;
    struct h_conn *c;

    if (d->redis_port == 1 || !(c = h_connect(d))) {
        return;
    }
    while (h_stat(c, "redis_connected") < 1 && h_now_ms() < deadline) {
        sleep_ms(10);
    }
    if (daemon_on_cluster(d)) {
        wait_cluster_connected(c, deadline);
    }
    h_close(c);
}

static int
daemon_spawn_wait(struct h_daemon *d, int listen_fd)
{
    const char *argv[32];
    char wbuf[512];
    long long deadline;
    int fd, status;

    daemon_argv(d, argv, sizeof argv / sizeof argv[0], wbuf, sizeof wbuf);

    fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "harness: %s: %s\n", d->log, strerror(errno));
        return -1;
    }
    d->pid = spawn(argv, fd, fd, listen_fd);
    close(fd);
    if (d->pid < 0) {
        d->pid = 0;
        return -1;
    }
    deadline = h_now_ms() + H_DAEMON_READY_MS;
    while (h_now_ms() < deadline) {
        if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
            fprintf(stderr,
                    "harness: leased exited during start-up "
                    "(status %d)\n",
                    exit_code(status));
            h_untrack_pid(d->pid);
            d->pid = 0;
            h_daemon_dump_log(d);
            return -1;
        }
        if (daemon_answers(d)) {
            wait_redis_connected(d);
            return 0;
        }
        sleep_ms(10);
    }
    fprintf(stderr, "harness: leased did not answer ping on %s in %d ms\n",
            d->sock, H_DAEMON_READY_MS);
    kill_reap(d->pid);
    d->pid = 0;
    h_daemon_dump_log(d);
    return -1;
}

static int
daemon_prepare(struct h_daemon *d, const struct h_redis *r,
               const char *yaml_extra)
{
    memset(d, 0, sizeof *d);
    d->redis_port = r ? r->port : 1;
    if (make_tmpdir(d->dir, sizeof d->dir, "ldd") < 0) {
        return -1;
    }
    snprintf(d->sock, sizeof d->sock, "%s/leased.sock", d->dir);
    snprintf(d->conf, sizeof d->conf, "%s/leased.yml", d->dir);
    snprintf(d->log, sizeof d->log, "%s/leased.log", d->dir);
    snprintf(d->journal, sizeof d->journal, "%s/journal", d->dir);
    if (subst_dir(yaml_extra ? yaml_extra : "", d->dir, d->yaml_extra,
                  sizeof d->yaml_extra) < 0) {
        fprintf(stderr, "harness: yaml_extra too long\n");
        return -1;
    }
    if (daemon_on_cluster(d) && cluster_subst_address(d) < 0) {
        return -1;
    }
    return write_daemon_conf(d);
}

int
h_daemon_start(struct h_daemon *d, const struct h_redis *r,
               const char *yaml_extra)
{
    if (daemon_prepare(d, r, yaml_extra) < 0) {
        return -1;
    }
    return daemon_spawn_wait(d, -1);
}

int
h_daemon_start_fd(struct h_daemon *d, const struct h_redis *r,
                  const char *yaml_extra, int listen_fd, const char *sock_path)
{
    if (daemon_prepare(d, r, yaml_extra) < 0) {
        return -1;
    }
    snprintf(d->sock, sizeof d->sock, "%s", sock_path);
    return daemon_spawn_wait(d, listen_fd);
}

int
h_daemon_restart(struct h_daemon *d)
{
    if (d->pid > 0) {
        h_daemon_stop(d);
    }
    d->tcp_port = 0;
    d->metrics_port = 0;
    return daemon_spawn_wait(d, -1);
}

int
h_daemon_wait(struct h_daemon *d, int timeout_ms)
{
    int status;

    if (d->pid <= 0) {
        return -1;
    }
    if (wait_deadline(d->pid, &status, timeout_ms) == 0) {
        return -1;
    }
    h_untrack_pid(d->pid);
    d->pid = 0;
    return exit_code(status);
}

int
h_daemon_stop(struct h_daemon *d)
{
    int status;

    if (d->pid <= 0) {
        return -1;
    }
    kill(d->pid, SIGTERM);
    if (wait_deadline(d->pid, &status, H_DAEMON_STOP_MS) == 0) {
        fprintf(stderr, "harness: leased pid %ld ignored SIGTERM for %d ms\n",
                (long)d->pid, H_DAEMON_STOP_MS);
        kill_reap(d->pid);
        d->pid = 0;
        return -1;
    }
    h_untrack_pid(d->pid);
    d->pid = 0;
    return exit_code(status);
}

void
h_daemon_kill(struct h_daemon *d)
{
    if (d->pid > 0) {
        kill_reap(d->pid);
        d->pid = 0;
    }
}

void
h_daemon_cleanup(struct h_daemon *d)
{
    if (d->pid > 0) {
        h_daemon_stop(d);
    }
    if (d->log[0] && d->dir[0]) {
        check_memory_report(d);
    }
    if (d->dir[0]) {
        h_rmdir(d->dir);
        d->dir[0] = '\0';
    }
}

void
h_daemon_signal(struct h_daemon *d, int sig)
{
    if (d->pid > 0) {
        kill(d->pid, sig);
    }
}

bool
h_log_has(const struct h_daemon *d, const char *needle)
{
    char buf[1024];
    bool found = false;
    FILE *f = fopen(d->log, "r");

    if (!f) {
        return false;
    }
    while (!found && fgets(buf, sizeof buf, f)) {
        found = strstr(buf, needle) != NULL;
    }
    fclose(f);
    return found;
}

struct log_wait {
    const struct h_daemon *d;
    const char *needle;
};

static bool
log_wait_cond(void *arg)
{
    const struct log_wait *w = arg;
    return h_log_has(w->d, w->needle);
}

bool
h_wait_log(const struct h_daemon *d, const char *needle, int timeout_ms)
{
    struct log_wait w = {d, needle};
    return h_wait_until(log_wait_cond, &w, timeout_ms);
}

void
h_daemon_dump_log(const struct h_daemon *d)
{
    if (d->log[0]) {
        dump_file("leased log", d->log);
    }
}

/* --- per-test-case failure logs --------------------------------------- */

static char case_root[128];
static char case_saved_tmpdir[512];
static bool case_had_tmpdir;

void
h_case_setup(void)
{
    const char *base = getenv("TMPDIR");

    case_had_tmpdir = base != NULL;
    snprintf(case_saved_tmpdir, sizeof case_saved_tmpdir, "%s",
             base ? base : "");
    if (!base || !*base || strlen(base) > 40) {
        base = "/tmp";
    }
    snprintf(case_root, sizeof case_root, "%s/ldcase-XXXXXX", base);
    if (!mkdtemp(case_root)) {
        fprintf(stderr, "harness: mkdtemp %s: %s\n", case_root,
                strerror(errno));
        case_root[0] = '\0';
        return;
    }
    setenv("TMPDIR", case_root, 1);
}

void
h_case_passed(void)
{
    char marker[200];

    if (case_root[0]) {
        snprintf(marker, sizeof marker, "%s/.passed", case_root);
        write_file(marker, "");
    }
}

static int
dump_logs_one(const char *path, const struct stat *st, int flag,
              struct FTW *ftw)
{
    size_t n = strlen(path);

    (void)st;
    (void)ftw;
    if (flag == FTW_F && n > 4 && !strcmp(path + n - 4, ".log")) {
        dump_file("log of the failed test", path);
    }
    return 0;
}

void
h_case_teardown(void)
{
    char marker[200];

    if (!case_root[0]) {
        return;
    }
    snprintf(marker, sizeof marker, "%s/.passed", case_root);
    if (access(marker, F_OK) != 0) {
        fprintf(stderr, "harness: the test did not finish cleanly; "
                        "its logs follow\n");
        nftw(case_root, dump_logs_one, 16, FTW_PHYS);
    }
    rm_rf(case_root);
    case_root[0] = '\0';
    if (case_had_tmpdir) {
        setenv("TMPDIR", case_saved_tmpdir, 1);
    } else {
        unsetenv("TMPDIR");
    }
}

/* --- protocol connections --------------------------------------------- */

struct h_item {
    json_t *msg;
    struct h_item *next;
};

struct h_queue {
    struct h_item *head, *tail;
};

struct h_conn {
    int fd;
    bool eof;
    char *buf;
    size_t len, cap;
    struct h_queue replies;
    struct h_queue events;
    json_int_t next_id;
};

static void
q_push(struct h_queue *q, json_t *msg)
{
    struct h_item *it = malloc(sizeof *it);

    if (!it) {
        json_decref(msg);
        return;
    }
    it->msg = msg;
    it->next = NULL;
    if (q->tail) {
        q->tail->next = it;
    } else {
        q->head = it;
    }
    q->tail = it;
}

/* Remove and return the first message MATCH accepts (all when NULL). */
static json_t *
q_take(struct h_queue *q, bool (*match)(json_t *, void *), void *arg)
{
    struct h_item *prev = NULL;

    for (struct h_item *it = q->head; it; prev = it, it = it->next) {
        json_t *msg;

        if (match && !match(it->msg, arg)) {
            continue;
        }
        if (prev) {
            prev->next = it->next;
        } else {
            q->head = it->next;
        }
        if (q->tail == it) {
            q->tail = prev;
        }
        msg = it->msg;
        free(it);
        return msg;
    }
    return NULL;
}

static void
q_clear(struct h_queue *q)
{
    json_t *msg;

    while ((msg = q_take(q, NULL, NULL))) {
        json_decref(msg);
    }
}

static void
conn_line(struct h_conn *c, const char *line, size_t len)
{
    json_error_t err;
    json_t *msg;

    if (len > 0 && line[len - 1] == '\r') {
        len--;
    }
    msg = json_loadb(line, len, 0, &err);
    if (!msg) {
        /* Surface it as a failed reply so the test that waits sees it. */
        fprintf(stderr,
                "harness: server sent a line that is not JSON "
                "(%s): %.*s\n",
                err.text, (int)(len > 200 ? 200 : len), line);
        msg = json_pack("{s:b,s:{s:s,s:s#}}", "ok", 0, "error", "code",
                        "harness_invalid_json", "message", line,
                        (int)(len > 200 ? 200 : len));
        if (!msg) {
            return;
        }
    }
    if (json_is_object(msg) && json_object_get(msg, "event") &&
        !json_object_get(msg, "id")) {
        q_push(&c->events, msg);
    } else {
        q_push(&c->replies, msg);
    }
}

static void
conn_parse(struct h_conn *c)
{
    size_t start = 0;
    char *nl;

    while ((nl = memchr(c->buf + start, '\n', c->len - start))) {
        size_t end = (size_t)(nl - c->buf);

        conn_line(c, c->buf + start, end - start);
        start = end + 1;
    }
    if (start > 0) {
        memmove(c->buf, c->buf + start, c->len - start);
        c->len -= start;
    }
}

/* Wait up to TIMEOUT_MS for input and queue every complete line. Returns
 * 1 when data came, 0 on timeout, -1 on EOF or error. */
static int
conn_read(struct h_conn *c, int timeout_ms)
{
    struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
    ssize_t n;
    int pr;

    if (c->eof) {
        return -1;
    }
    pr = poll(&pfd, 1, timeout_ms < 0 ? 0 : timeout_ms);
    if (pr < 0) {
        return errno == EINTR ? 0 : -1;
    }
    if (pr == 0) {
        return 0;
    }
    if (c->cap - c->len < 65536) {
        size_t ncap = c->cap ? c->cap * 2 : 131072;
        char *nb = realloc(c->buf, ncap);

        if (!nb) {
            return -1;
        }
        c->buf = nb;
        c->cap = ncap;
    }
    n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        return 0;
    }
    if (n <= 0) {
        c->eof = true;
        if (c->len > 0) {
            /* A last line without its newline still counts. */
            conn_line(c, c->buf, c->len);
            c->len = 0;
        }
        return -1;
    }
    c->len += (size_t)n;
    conn_parse(c);
    return 1;
}

static struct h_conn *
conn_new(int fd)
{
    struct h_conn *c = calloc(1, sizeof *c);

    if (!c) {
        close(fd);
        return NULL;
    }
    c->fd = fd;
    c->next_id = H_FIRST_CALL_ID;
    return c;
}

struct h_conn *
h_connect(const struct h_daemon *d)
{
    struct sockaddr_un sa;
    int fd;

    if (strlen(d->sock) >= sizeof sa.sun_path) {
        return NULL;
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return NULL;
    }
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, d->sock, strlen(d->sock) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;

        close(fd);
        errno = e;
        return NULL;
    }
    return conn_new(fd);
}

struct h_conn *
h_connect_tcp(const struct h_daemon *d)
{
    struct sockaddr_in sa;
    int fd, one = 1;

    if (d->tcp_port <= 0) {
        errno = ENOTCONN;
        return NULL;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return NULL;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons((uint16_t)d->tcp_port);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;

        close(fd);
        errno = e;
        return NULL;
    }
    return conn_new(fd);
}

void
h_close(struct h_conn *c)
{
    if (!c) {
        return;
    }
    close(c->fd);
    q_clear(&c->replies);
    q_clear(&c->events);
    free(c->buf);
    free(c);
}

int
h_shutdown_write(struct h_conn *c)
{
    return shutdown(c->fd, SHUT_WR);
}

int
h_send_raw(struct h_conn *c, const char *bytes, size_t len)
{
    long long deadline = h_now_ms() + H_SEND_MS;
    size_t off = 0;

    /* Keep reading while writing: a server that stops reading until its
     * replies drain would otherwise deadlock a large pipelined send. */
    while (off < len) {
        struct pollfd pfd = {.fd = c->fd, .events = POLLOUT};
        long long left = deadline - h_now_ms();
        ssize_t n;

        if (left <= 0) {
            fprintf(stderr, "harness: send stalled for %d ms\n", H_SEND_MS);
            return -1;
        }
        if (!c->eof) {
            pfd.events |= POLLIN;
        }
        if (poll(&pfd, 1, (int)left) < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (pfd.revents & POLLIN) {
            conn_read(c, 0);
        }
        if (!(pfd.revents & (POLLOUT | POLLERR | POLLHUP))) {
            continue;
        }
        n = send(c->fd, bytes + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                continue;
            }
            return -1;
        }
        off += (size_t)n;
    }
    return 0;
}

int
h_send_all(struct h_conn *c, json_t **reqs, int n, json_int_t first_id)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    int rc;

    for (int i = 0; i < n; i++) {
        json_object_set_new(reqs[i], "id", json_integer(first_id + i));
        char *line = json_dumps(reqs[i], JSON_COMPACT);
        size_t l = strlen(line);
        while (len + l + 2 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
        memcpy(buf + len, line, l);
        buf[len + l] = '\n';
        len += l + 1;
        free(line);
        json_decref(reqs[i]);
    }
    rc = h_send_raw(c, buf, len);
    free(buf);
    return rc;
}

static int
send_json(struct h_conn *c, json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    size_t n;
    int rc;

    if (!text) {
        return -1;
    }
    n = strlen(text);
    text = realloc(text, n + 2);
    if (!text) {
        return -1;
    }
    text[n] = '\n';
    text[n + 1] = '\0';
    rc = h_send_raw(c, text, n + 1);
    free(text);
    return rc;
}

static json_t *
vpack(const char *fmt, va_list ap)
{
    json_error_t err;
    json_t *msg = json_vpack_ex(&err, 0, fmt, ap);

    if (!msg) {
        fprintf(stderr, "harness: json_pack(\"%s\"): %s\n", fmt, err.text);
    }
    return msg;
}

int
h_send(struct h_conn *c, const char *fmt, ...)
{
    va_list ap;
    json_t *msg;
    int rc;

    va_start(ap, fmt);
    msg = vpack(fmt, ap);
    va_end(ap);
    if (!msg) {
        return -1;
    }
    rc = send_json(c, msg);
    json_decref(msg);
    return rc;
}

/* Take from Q what MATCH accepts, reading until TIMEOUT_MS. */
static json_t *
wait_for(struct h_conn *c, struct h_queue *q, bool (*match)(json_t *, void *),
         void *arg, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;

    for (;;) {
        json_t *msg = q_take(q, match, arg);
        long long left;

        if (msg) {
            return msg;
        }
        left = deadline - h_now_ms();
        if (c->eof || (left <= 0 && conn_read(c, 0) <= 0)) {
            return q_take(q, match, arg);
        }
        if (left > 0) {
            conn_read(c, (int)left);
        }
    }
}

json_t *
h_recv(struct h_conn *c, int timeout_ms)
{
    return wait_for(c, &c->replies, NULL, NULL, timeout_ms);
}

static bool
id_matches(json_t *msg, void *arg)
{
    json_t *id = json_object_get(msg, "id");

    return json_is_integer(id) && json_integer_value(id) == *(json_int_t *)arg;
}

json_t *
h_recv_id(struct h_conn *c, json_int_t id, int timeout_ms)
{
    return wait_for(c, &c->replies, id_matches, &id, timeout_ms);
}

json_t *
h_event(struct h_conn *c, int timeout_ms)
{
    return wait_for(c, &c->events, NULL, NULL, timeout_ms);
}

json_t *
h_call(struct h_conn *c, json_t *req, int timeout_ms)
{
    json_int_t id;
    int rc;

    if (!req) {
        return NULL;
    }
    id = c->next_id++;
    json_object_set_new(req, "id", json_integer(id));
    rc = send_json(c, req);
    json_decref(req);
    if (rc < 0) {
        return NULL;
    }
    return h_recv_id(c, id, timeout_ms);
}

json_t *
h_callf(struct h_conn *c, int timeout_ms, const char *fmt, ...)
{
    va_list ap;
    json_t *req;

    va_start(ap, fmt);
    req = vpack(fmt, ap);
    va_end(ap);
    return h_call(c, req, timeout_ms);
}

bool
h_wait_closed(struct h_conn *c, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;

    while (!c->eof) {
        long long left = deadline - h_now_ms();

        if (left <= 0) {
            conn_read(c, 0);
            break;
        }
        conn_read(c, (int)left);
    }
    return c->eof;
}

/* --- reply helpers ---------------------------------------------------- */

long long
h_stat(struct h_conn *c, const char *name)
{
    json_t *reply = h_callf(c, 5000, "{s:s}", "op", "stats");
    json_t *v = json_object_get(reply, "stats");
    char path[256], *save = NULL;
    long long out = -1;

    /* "requests_by_op.ping" walks into nested objects. */
    snprintf(path, sizeof path, "%s", name);
    for (char *part = strtok_r(path, ".", &save); part && v;
         part = strtok_r(NULL, ".", &save)) {
        v = json_object_get(v, part);
    }
    if (json_is_integer(v)) {
        out = json_integer_value(v);
    } else if (json_is_real(v)) {
        out = (long long)json_real_value(v);
    } else if (json_is_boolean(v)) {
        out = json_is_true(v) ? 1 : 0;
    }
    json_decref(reply);
    return out;
}

bool
h_ok(const json_t *reply)
{
    return reply && json_is_true(json_object_get(reply, "ok"));
}

const char *
h_errcode(const json_t *reply)
{
    json_t *code;

    if (!reply) {
        return "(no reply)";
    }
    if (h_ok(reply)) {
        return NULL;
    }
    code = json_object_get(json_object_get(reply, "error"), "code");
    return json_is_string(code) ? json_string_value(code) : "(no code)";
}

/* --- Check suites -------------------------------------------------------- */

void
h_add_test(Suite *s, const char *name, const TTest *t, int timeout_s,
           SFun setup, SFun teardown)
{
    TCase *tc = tcase_create(name);

    tcase_add_unchecked_fixture(tc, h_case_setup, h_case_teardown);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_checked_fixture(tc, NULL, h_case_passed);
    tcase_set_timeout(tc, timeout_s);
    tcase_add_test(tc, t);
    suite_add_tcase(s, tc);
}

int
h_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    int failed;

    srunner_run_all(sr, CK_ENV);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* --- one fixture, one main ---------------------------------------------- */

/* Set by h_main before the runner forks, so every test process sees it. */
static const struct h_fixture *fixture;

void
h_start(const char *yaml_extra)
{
    ck_assert_int_eq(h_redis_start(fixture->redis[0], NULL), 0);
    ck_assert_int_eq(h_daemon_start(fixture->daemons[0], fixture->redis[0],
                                    yaml_extra),
                     0);
}

static void
fixture_setup(void)
{
    for (int i = 0; i < H_MAX_REDIS && fixture->redis[i] != NULL; i++) {
        memset(fixture->redis[i], 0, sizeof *fixture->redis[i]);
    }
    for (int i = 0; i < H_MAX_DAEMONS && fixture->daemons[i] != NULL; i++) {
        memset(fixture->daemons[i], 0, sizeof *fixture->daemons[i]);
    }
    if (fixture->start_yaml != NULL) {
        h_start(fixture->start_yaml);
    }
    if (fixture->setup != NULL) {
        fixture->setup();
    }
}

static void
fixture_teardown(void)
{
    if (fixture->teardown != NULL) {
        fixture->teardown();
    }
    /* A case may leave a process stopped (SIGSTOP); it must run to honour
     * the SIGTERM of a clean stop. */
    for (int i = 0; i < H_MAX_DAEMONS && fixture->daemons[i] != NULL; i++) {
        h_daemon_signal(fixture->daemons[i], SIGCONT);
        h_daemon_cleanup(fixture->daemons[i]);
    }
    for (int i = H_MAX_REDIS - 1; i >= 0; i--) {
        struct h_redis *r = fixture->redis[i];

        if (r == NULL) {
            continue;
        }
        if (r->pid > 0) {
            kill(r->pid, SIGCONT);
        }
        h_redis_stop(r);
    }
}

int
h_main(const struct h_fixture *fx, const struct h_case *cases, size_t n)
{
    Suite *s = suite_create(fx->suite);

    fixture = fx;
    for (size_t i = 0; i < n; i++) {
        const char *why = h_on_cluster()
                              ? cluster_skip_reason(fx->suite, cases[i].name)
                              : NULL;
        if (why != NULL) {
            /* A TAP comment, so the skip shows in the test's log. */
            printf("# %s: skipped on a cluster: %s\n", cases[i].name, why);
            fflush(stdout);
            continue;
        }
        h_add_test(s, cases[i].name, cases[i].test, cases[i].timeout_s,
                   fixture_setup, fixture_teardown);
    }
    return h_run_suite(s);
}

/* --- shared checks -------------------------------------------------------- */

long long
jint(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

bool
jtrue(const json_t *o, const char *k)
{
    return json_is_true(json_object_get(o, k));
}

const char *
jstr(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

const char *
jreason(const json_t *r)
{
    return jstr(json_object_get(r, "error"), "reason");
}

const char *
jmsg(const json_t *r)
{
    return jstr(json_object_get(r, "error"), "message");
}

const char *
joutcome(const json_t *r)
{
    return jstr(json_object_get(r, "error"), "outcome");
}

struct h_conn *
h_connect_ok(const struct h_daemon *d)
{
    struct h_conn *c = h_connect(d);

    ck_assert_msg(c != NULL, "connect %s: %s", d->sock, strerror(errno));
    return c;
}

void
h_assert_ping(struct h_conn *c)
{
    json_t *r = h_callf(c, 5000, "{s:s}", "op", "ping");

    ck_assert_msg(h_ok(r), "ping failed: %s", h_errcode(r));
    json_decref(r);
}

void
h_expect_code(json_t *r, const char *code, const char *what)
{
    ck_assert_msg(r != NULL, "no reply to %s", what);
    ck_assert_msg(h_errcode(r) != NULL && strcmp(h_errcode(r), code) == 0,
                  "%s: expected %s, got %s", what, code,
                  h_errcode(r) != NULL ? h_errcode(r) : "ok");
    json_decref(r);
}

struct stat_want {
    struct h_conn *c;
    const char *name;
    long long want;
};

static bool
stat_is(void *arg)
{
    const struct stat_want *w = arg;

    return h_stat(w->c, w->name) == w->want;
}

static bool
stat_at_least(void *arg)
{
    const struct stat_want *w = arg;

    return h_stat(w->c, w->name) >= w->want;
}

bool
h_wait_stat(struct h_conn *c, const char *name, long long want, int timeout_ms)
{
    struct stat_want w = {c, name, want};

    return h_wait_until(stat_is, &w, timeout_ms);
}

void
h_assert_stat(struct h_conn *c, const char *name, long long want,
              int timeout_ms)
{
    ck_assert_msg(h_wait_stat(c, name, want, timeout_ms),
                  "stat %s is %lld, not %lld", name, h_stat(c, name), want);
}

bool
h_wait_stat_min(struct h_conn *c, const char *name, long long want,
                int timeout_ms)
{
    struct stat_want w = {c, name, want};

    return h_wait_until(stat_at_least, &w, timeout_ms);
}

json_t *
h_lock_lost(struct h_conn *c, const char *key, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;

    for (;;) {
        long long left = deadline - h_now_ms();
        json_t *ev = h_event(c, left > 0 ? (int)left : 0);

        if (ev == NULL) {
            return NULL;
        }
        if (jstr(ev, "event") != NULL &&
            strcmp(jstr(ev, "event"), "lock_lost") == 0 &&
            jstr(ev, "key") != NULL && strcmp(jstr(ev, "key"), key) == 0) {
            return ev;
        }
        json_decref(ev);
    }
}

static redisReply *
r_vcommand(const struct h_redis *r, const char *fmt, va_list ap)
{
    redisContext *c;
    redisReply *rep;

    if (is_cluster(r)) {
        return cluster_vcommand(r, fmt, ap);
    }
    c = h_redis_connect(r);
    ck_assert_msg(c != NULL, "cannot connect to redis");
    rep = redisvCommand(c, fmt, ap);
    redisFree(c);
    return rep;
}

long long
h_r_int(const struct h_redis *r, const char *fmt, ...)
{
    va_list ap;
    redisReply *rep;
    long long v = -999;

    va_start(ap, fmt);
    rep = r_vcommand(r, fmt, ap);
    va_end(ap);
    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER) {
        v = rep->integer;
    } else if (rep != NULL && rep->type == REDIS_REPLY_STRING) {
        v = atoll(rep->str);
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return v;
}

/* FIELD of the layout 2 string S of N bytes (src/lua/lib/cache_text.lua):
 * 0xF5 "L", v or n, the version r, ":", the load time d, ":", the value. */
static bool
text_field(const char *s, size_t n, char field, char *buf, size_t len)
{
    const char *end = s + n, *c1, *c2;
    if (n < 5 || (unsigned char)s[0] != 0xF5 || s[1] != 'L' ||
        (c1 = memchr(s + 3, ':', n - 3)) == NULL ||
        (c2 = memchr(c1 + 1, ':', (size_t)(end - c1 - 1))) == NULL) {
        return false;
    }
    bool value = s[2] == 'v';
    const char *at;
    switch (field) {
    case 'v':
        if (!value) {
            return false;
        }
        at = c2 + 1;
        break;
    case 'n':
        if (value) {
            return false;
        }
        at = "1", end = at + 1;
        break;
    case 'r':
        at = s + 3, end = c1;
        break;
    case 'd':
        if (c2 == c1 + 1) {
            return false;
        }
        at = c1 + 1, end = c2;
        break;
    default:
        return false;
    }
    snprintf(buf, len, "%.*s", (int)(end - at), at);
    return true;
}

bool
h_entry_field(const struct h_redis *r, const char *key, char field, char *buf,
              size_t len)
{
    bool found = false;
    redisReply *rep = h_redis_cmd(r, "TYPE %s", key);
    bool str = rep != NULL && rep->type == REDIS_REPLY_STATUS &&
               strcmp(rep->str, "string") == 0;
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    rep = str ? h_redis_cmd(r, "GET %s", key)
              : h_redis_cmd(r, "HGET %s %b", key, &field, (size_t)1);
    buf[0] = '\0';
    if (rep != NULL && rep->type == REDIS_REPLY_STRING) {
        found = str ? text_field(rep->str, rep->len, field, buf, len)
                    : (snprintf(buf, len, "%.*s", (int)rep->len, rep->str),
                       true);
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return found;
}

void
h_assert_type(const struct h_redis *r, const char *key, const char *type)
{
    redisReply *rep = h_redis_cmd(r, "TYPE %s", key);
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STATUS &&
                      strcmp(rep->str, type) == 0,
                  "%s: type %s, want %s", key,
                  rep != NULL && rep->str != NULL ? rep->str : "(none)", type);
    freeReplyObject(rep);
}

void
h_entry_write(const struct h_redis *r, const char *key, const char *value,
              size_t len)
{
#if defined(H_CACHE_LAYOUT) && H_CACHE_LAYOUT == 2
    char *text = malloc(len + 6);
    ck_assert_ptr_nonnull(text);
    memcpy(text, "\xf5Lv1::", 6);
    memcpy(text + 6, value, len);
    h_r_do(r, "SET %s %b KEEPTTL", key, text, len + 6);
    free(text);
#else
    h_r_do(r, "HSET %s v %b", key, value, len);
#endif
}

void
h_r_do(const struct h_redis *r, const char *fmt, ...)
{
    va_list ap;
    redisReply *rep;

    va_start(ap, fmt);
    rep = r_vcommand(r, fmt, ap);
    va_end(ap);
    ck_assert_msg(rep != NULL && rep->type != REDIS_REPLY_ERROR,
                  "redis command %s failed: %s", fmt,
                  rep != NULL ? rep->str : "no reply");
    freeReplyObject(rep);
}

struct numsub_want {
    const struct h_redis *r;
    const char *channel;
};

static bool
subscribed(void *arg)
{
    const struct numsub_want *w = arg;
    if (is_cluster(w->r)) {
        return cluster_subscribed(w->channel);
    }
    redisReply *rep = h_redis_cmd(w->r, "PUBSUB NUMSUB %s", w->channel);
    bool yes = rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
               rep->elements == 2 &&
               rep->element[1]->type == REDIS_REPLY_INTEGER &&
               rep->element[1]->integer >= 1;

    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return yes;
}

void
h_wait_subscribed(const struct h_redis *r, const char *channel, int timeout_ms)
{
    struct numsub_want w = {r, channel};

    ck_assert_msg(h_wait_until(subscribed, &w, timeout_ms),
                  "no subscriber on %s", channel);
}

bool
h_is_token(const char *t)
{
    if (t == NULL || strlen(t) < 32) {
        return false;
    }
    for (const char *p = t; *p; p++) {
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) {
            return false;
        }
    }
    return true;
}

void
h_delete_lock_key(const struct h_redis *r, const char *key)
{
    char a[256], b[256];
    long long n;

    /* One DEL each: on a cluster the two names hash to different slots. */
    snprintf(a, sizeof a, "leased:lock:%s", key);
    snprintf(b, sizeof b, "leased:lock:{%s}", key);
    n = h_r_int(r, "DEL %s", a) + h_r_int(r, "DEL %s", b);
    ck_assert_msg(n == 1, "the lock key of %s was not in Redis", key);
}

bool
h_replica_linked(void *arg)
{
    const struct h_redis *r = arg;
    redisReply *rep = h_redis_cmd(r, "INFO replication");
    bool ok = rep != NULL && rep->type == REDIS_REPLY_STRING &&
              strstr(rep->str, "connected_slaves:1") != NULL &&
              strstr(rep->str, "state=online") != NULL;

    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return ok;
}

/* --- Redis Cluster ------------------------------------------------------ */

#define H_CLUSTER_READY_MS 20000

static bool
cluster_node_ok(struct h_redis *r)
{
    redisReply *rep = h_redis_cmd(r, "CLUSTER INFO");
    bool ok = rep != NULL && rep->type == REDIS_REPLY_STRING &&
              strstr(rep->str, "cluster_state:ok") != NULL &&
              strstr(rep->str, "cluster_slots_ok:16384") != NULL;
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    return ok;
}

/* The port of the master of SLOT as node R sees it, -1 if unknown. */
static int
cluster_slot_port(struct h_redis *r, int slot)
{
    redisReply *rep = h_redis_cmd(r, "CLUSTER SLOTS");
    int port = -1;
    if (rep == NULL) {
        return -1;
    }
    for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements;
         i++) {
        redisReply *e = rep->element[i];
        if (e->type == REDIS_REPLY_ARRAY && e->elements >= 3 &&
            e->element[0]->integer <= slot && slot <= e->element[1]->integer) {
            port = (int)e->element[2]->element[1]->integer;
        }
    }
    freeReplyObject(rep);
    return port;
}

static int
cluster_index_of_port(const struct h_cluster *cl, int port)
{
    for (int i = 0; i < cl->n; i++) {
        if (cl->node[i].port == port) {
            return i;
        }
    }
    return -1;
}

bool
h_cluster_ok(struct h_cluster *cl, int timeout_ms)
{
    long long deadline = h_now_ms() + timeout_ms;
    do {
        bool all = true;
        int want[3] = {0, 5461, 10923};
        for (int i = 0; i < cl->n && all; i++) {
            if (cl->node[i].pid <= 0) {
                continue;
            }
            all = cluster_node_ok(&cl->node[i]);
            /* They agree on who serves the slots (a sample of them). */
            for (int k = 0; k < 3 && all; k++) {
                all = cluster_slot_port(&cl->node[i], want[k]) ==
                      cl->node[h_cluster_master_of_slot(cl, want[k])].port;
            }
        }
        if (all) {
            return true;
        }
        sleep_ms(100);
    } while (h_now_ms() < deadline);
    return false;
}

int
h_cluster_start(struct h_cluster *cl, int masters)
{
    return h_cluster_start_ex(cl, masters, NULL);
}

static int cluster_start(struct h_cluster *cl, int masters,
                         const char *extra_args, const char *tls_dir);

int
h_cluster_start_ex(struct h_cluster *cl, int masters, const char *extra_args)
{
    return cluster_start(cl, masters, extra_args, NULL);
}

int
h_cluster_start_tls(struct h_cluster *cl, int masters, const char *dir)
{
    return cluster_start(cl, masters, NULL, dir);
}

static int
cluster_start(struct h_cluster *cl, int masters, const char *extra_args,
              const char *tls_dir)
{
    char *args[2 * H_CLUSTER_MAX + 12];
    char node_args[1024], ca[300];
    char addr[H_CLUSTER_MAX][32];
    int argc = 0;

    memset(cl, 0, sizeof(*cl));
    if (masters < 3 || 2 * masters > H_CLUSTER_MAX) {
        return -1;
    }
    snprintf(ca, sizeof(ca), "%s/ca.crt", tls_dir != NULL ? tls_dir : "");
    for (int i = 0; i < 2 * masters; i++) {
        int used = snprintf(node_args, sizeof(node_args),
                            "--cluster-enabled yes --cluster-config-file "
                            "nodes.conf --cluster-node-timeout 1000 "
                            "--cluster-replica-validity-factor 0 %s",
                            extra_args != NULL ? extra_args : "");
        if (tls_dir != NULL) {
            /* Its cluster bus listens 10000 ports higher. */
            do {
                cl->tls_port[i] = h_free_port();
            } while (cl->tls_port[i] > 55000);
            snprintf(node_args + used, sizeof(node_args) - (size_t)used,
                     " --tls-port %d --tls-cert-file %s/server.crt "
                     "--tls-key-file %s/server.key --tls-ca-cert-file %s "
                     "--tls-auth-clients no --tls-cluster yes "
                     "--tls-replication yes",
                     cl->tls_port[i], tls_dir, tls_dir, ca);
        }
        if (h_redis_start(&cl->node[i], node_args) != 0) {
            h_cluster_stop(cl);
            return -1;
        }
        cl->n++;
    }
    args[argc++] = "redis-cli";
    if (tls_dir != NULL) {
        /* The cluster bus speaks TLS: the nodes meet on their TLS
         * ports. */
        args[argc++] = "--tls";
        args[argc++] = "--cacert";
        args[argc++] = ca;
    }
    args[argc++] = "--cluster";
    args[argc++] = "create";
    for (int i = 0; i < cl->n; i++) {
        snprintf(addr[i], sizeof(addr[i]), "127.0.0.1:%d",
                 tls_dir != NULL ? cl->tls_port[i] : cl->node[i].port);
        args[argc++] = addr[i];
    }
    args[argc++] = "--cluster-replicas";
    args[argc++] = "1";
    args[argc++] = "--cluster-yes";
    args[argc] = NULL;
    char out[8192], err[2048];
    int rc = h_run((const char *const *)args, out, sizeof(out), err,
                   sizeof(err), 30000);
    if (rc != 0 || !h_cluster_ok(cl, H_CLUSTER_READY_MS)) {
        fprintf(stderr, "harness: cluster create failed (%d)\n%s\n%s\n", rc,
                out, err);
        h_cluster_stop(cl);
        return -1;
    }
    return 0;
}

void
h_cluster_stop(struct h_cluster *cl)
{
    for (int i = 0; i < cl->n; i++) {
        if (cl->node[i].dir[0] != '\0') {
            h_redis_stop(&cl->node[i]);
        }
    }
    cl->n = 0;
}

int
h_cluster_master_of_slot(struct h_cluster *cl, int slot)
{
    for (int i = 0; i < cl->n; i++) {
        if (cl->node[i].pid <= 0) {
            continue;
        }
        int port = cluster_slot_port(&cl->node[i], slot);
        if (port > 0) {
            return cluster_index_of_port(cl, port);
        }
    }
    return -1;
}

int
h_cluster_keyslot(struct h_cluster *cl, const char *key)
{
    for (int i = 0; i < cl->n; i++) {
        if (cl->node[i].pid > 0) {
            long long v = h_r_int(&cl->node[i], "CLUSTER KEYSLOT %s", key);
            if (v >= 0) {
                return (int)v;
            }
        }
    }
    return -1;
}

void
h_cluster_id(struct h_cluster *cl, int i, char *buf, size_t len)
{
    redisReply *rep = h_redis_cmd(&cl->node[i], "CLUSTER MYID");
    ck_assert_msg(rep != NULL && rep->type == REDIS_REPLY_STRING,
                  "CLUSTER MYID of node %d", i);
    snprintf(buf, len, "%s", rep->str);
    freeReplyObject(rep);
}

int
h_cluster_replica_of(struct h_cluster *cl, int i)
{
    char id[64];
    h_cluster_id(cl, i, id, sizeof(id));
    for (int k = 0; k < cl->n; k++) {
        if (k == i || cl->node[k].pid <= 0) {
            continue;
        }
        redisReply *rep = h_redis_cmd(&cl->node[k], "INFO replication");
        char want[64];
        snprintf(want, sizeof(want), "master_port:%d", cl->node[i].port);
        bool is = rep != NULL && rep->type == REDIS_REPLY_STRING &&
                  strstr(rep->str, "role:slave") != NULL &&
                  strstr(rep->str, want) != NULL;
        if (rep != NULL) {
            freeReplyObject(rep);
        }
        if (is) {
            return k;
        }
    }
    return -1;
}

void
h_cluster_yaml(const struct h_cluster *cl, const char *extra, char *buf,
               size_t len)
{
    snprintf(buf, len,
             "redis:\n  mode: cluster\n  addresses: [\"127.0.0.1:%d\", "
             "\"127.0.0.1:%d\"]\n%s",
             cl->node[0].port, cl->node[1].port, extra != NULL ? extra : "");
}

static int
run_quiet(const char *const argv[])
{
    char err[2048];
    int rc = h_run(argv, NULL, 0, err, sizeof(err), 30000);
    if (rc != 0) {
        fprintf(stderr, "harness: %s %s failed (%d): %s\n", argv[0], argv[1],
                rc, err);
    }
    return rc;
}

int
h_test_certs(const char *dir)
{
    char cakey[300], cacrt[300], key[300], csr[300], crt[300], ext[300];
    snprintf(cakey, sizeof(cakey), "%s/ca.key", dir);
    snprintf(cacrt, sizeof(cacrt), "%s/ca.crt", dir);
    snprintf(key, sizeof(key), "%s/server.key", dir);
    snprintf(csr, sizeof(csr), "%s/server.csr", dir);
    snprintf(crt, sizeof(crt), "%s/server.crt", dir);
    snprintf(ext, sizeof(ext), "%s/server.ext", dir);
    const char *ca[] = {"openssl",
                        "req",
                        "-x509",
                        "-newkey",
                        "ec",
                        "-pkeyopt",
                        "ec_paramgen_curve:prime256v1",
                        "-nodes",
                        "-keyout",
                        cakey,
                        "-out",
                        cacrt,
                        "-days",
                        "2",
                        "-subj",
                        "/CN=leased test ca",
                        NULL};
    const char *req[] = {"openssl",
                         "req",
                         "-newkey",
                         "ec",
                         "-pkeyopt",
                         "ec_paramgen_curve:prime256v1",
                         "-nodes",
                         "-keyout",
                         key,
                         "-out",
                         csr,
                         "-subj",
                         "/CN=localhost",
                         NULL};
    const char *sign[] = {
        "openssl", "x509", "-req",   "-in", csr,
        "-CA",     cacrt,  "-CAkey", cakey, "-CAcreateserial",
        "-out",    crt,    "-days",  "2",   "-extfile",
        ext,       NULL};
    if (run_quiet(ca) != 0 || run_quiet(req) != 0) {
        return -1;
    }
    FILE *f = fopen(ext, "w");
    if (f == NULL) {
        return -1;
    }
    fprintf(f, "subjectAltName=DNS:localhost,IP:127.0.0.1\n");
    fclose(f);
    return run_quiet(sign) == 0 ? 0 : -1;
}

const char *
h_dump(const json_t *j)
{
    static char buf[4096];
    char *s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
    snprintf(buf, sizeof buf, "%s", s != NULL ? s : "(null)");
    free(s);
    return buf;
}

json_t *
h_must(json_t *r)
{
    ck_assert_msg(h_ok(r), "expected ok, got %s", h_dump(r));
    return r;
}

void
h_wait_redlock(const struct h_daemon *d, int n)
{
    struct h_conn *c = h_connect_ok(d);
    h_assert_stat(c, "redlock_instances_up", n, 10000);
    h_close(c);
}

char *
h_get_metrics(int port)
{
    static const char req[] = "GET /metrics HTTP/1.0\r\n"
                              "Host: 127.0.0.1\r\n\r\n";
    struct sockaddr_in sa;
    struct timeval tv = {5, 0};
    char *buf = malloc(H_METRICS_MAX);
    size_t len = 0;
    ssize_t n;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    ck_assert_ptr_nonnull(buf);
    ck_assert_int_ge(fd, 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0,
                  "connect metrics port %d: %s", port, strerror(errno));
    ck_assert_int_eq(write(fd, req, sizeof req - 1),
                     (ssize_t)(sizeof req - 1));
    while (len < H_METRICS_MAX - 1 &&
           (n = read(fd, buf + len, H_METRICS_MAX - 1 - len)) > 0) {
        len += (size_t)n;
    }
    close(fd);
    buf[len] = '\0';
    ck_assert_msg(strncmp(buf, "HTTP/1.", 7) == 0 &&
                      strstr(buf, " 200 ") != NULL,
                  "not a 200 reply: %.200s", buf);
    char *body = strstr(buf, "\r\n\r\n");
    ck_assert_ptr_nonnull(body);
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

int
h_raw_unix(const char *path)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0,
                  "connect %s: %s", path, strerror(errno));
    return fd;
}

static bool
redis_asleep(void *arg)
{
    const struct h_redis *r = arg;
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (c == NULL) {
        return false;
    }
    if (c->err) {
        redisFree(c);
        return false;
    }
    redisSetTimeout(c, tv);
    redisReply *rep = redisCommand(c, "PING");
    bool asleep = rep == NULL;
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    redisFree(c);
    return asleep;
}

redisContext *
h_redis_sleep_start(const struct h_redis *r, double secs)
{
    redisContext *c = h_redis_connect(r);
    int done = 0;
    ck_assert_msg(c != NULL, "cannot connect to redis");
    ck_assert_int_eq(redisAppendCommand(c, "DEBUG SLEEP %f", secs), REDIS_OK);
    while (!done) {
        ck_assert_int_eq(redisBufferWrite(c, &done), REDIS_OK);
    }
    ck_assert_msg(h_wait_until(redis_asleep, (void *)r, 5000),
                  "redis did not go to sleep");
    return c;
}

void
h_redis_sleep_end(redisContext *c)
{
    struct timeval tv = {60, 0};
    void *rep = NULL;
    redisSetTimeout(c, tv);
    ck_assert_int_eq(redisGetReply(c, &rep), REDIS_OK);
    freeReplyObject(rep);
    redisFree(c);
}

/* --- the shared scenarios on a cluster ---------------------------------- */

/* A case that cannot mean on a cluster what it means on one server, and
 * why; it still runs on standalone Redis. */
struct cluster_skip {
    const char *suite;
    const char *name;
    const char *why;
};

static const struct cluster_skip cluster_skips[] = {
    {"near", "redis_restart_flushes",
     "kills and restarts the one Redis (check_near_cluster's "
     "lost_connections_flush and failover_flushes cover a cluster)"},
    {"near", "invalidate_across_outage",
     "kills and restarts the one Redis with its data"},
    {"near", "race_invalidation_overtakes_read",
     "puts its delaying proxy in front of the one Redis"},
    {"near", "silent_tracking_connection_flushes",
     "puts its proxy in front of the one Redis"},
    {"near", "second_delete_evicts_first",
     "puts its proxy in front of the one Redis"},
    {"shared_near", "redis_down",
     "kills and restarts the one Redis (tracking_killed_flushes covers the "
     "flush on a cluster)"},
    {"rwlock", "redisson_layout",
     "the Java side publishes with classic PUBLISH, which leased on a "
     "cluster does not hear (it subscribes sharded, leased.yml(5)); "
     "check_rwlock_backends runs the layout on a cluster"},
    {"rwlock", "redis_down", "kills and restarts the one Redis"},
    {"locks", "redis_killed",
     "kills and restarts the one Redis (a cluster master lost is "
     "check_cluster's master_killed)"},
    {"locks", "redisson_layout",
     "the Java side publishes with classic PUBLISH, which leased on a "
     "cluster does not hear (it subscribes sharded, leased.yml(5)); "
     "check_cluster's redisson_layout covers the layout there"},
    {"locks", "wait_replicas",
     "starts its own master without a replica, then links one"},
    {"locks", "evict_warning",
     "starts its own Redis with a maxmemory-policy (check_cluster's "
     "eviction_per_master covers a cluster)"},
    {"locks", "evict_require", "starts its own Redis with a maxmemory-policy"},
    {"locks", "unlock_request_id_unknown",
     "puts the one Redis to sleep (DEBUG SLEEP)"},
    {"locks", "evict_config_refused", "starts its own Redis without CONFIG"},
    {"cache", "redis_down_queued",
     "kills and restarts the one Redis to queue deletes in the journal "
     "(check_cluster's master_lost_for_good replays them per key)"},
    {"mset", "redis_down", "kills and restarts the one Redis"},
    {"versioned", "redis_down", "kills the one Redis"},
    {"mset", "redis_stalled",
     "stops the one Redis process (SIGSTOP) to time a request out"},
    {"cache", "mget_redis_away", "kills the one Redis"},
    {"cache", "second_delete_after_outage",
     "kills and restarts the one Redis"},
    {"cache", "second_delete_after_replay",
     "kills and restarts the one Redis"},
    {"cache", "write_outcome_unknown",
     "stops the one Redis process (SIGSTOP) in the middle of a write"},
    {"lock_safety", "recheck_on_reconnect",
     "kills and restarts the one Redis"},
    {"lock_safety", "recheck_retried",
     "refuses scripts (ACL) and drops the clients of the one Redis"},
    {"lock_safety", "lost_before_lease_end",
     "stops the one Redis process (SIGSTOP) for longer than a lease"},
    {"lock_safety", "short_lease_lost_in_time",
     "stops the one Redis process (SIGSTOP) past a shortened lease"},
    {"libleased", "at_risk",
     "stops the one Redis process (SIGSTOP) under a held lock and grant"},
    {"sem", "redis_down_and_wrong_type", "kills and restarts the one Redis"},
    {"rate", "redis_down_and_wrong_type",
     "kills the one Redis and sets its min-replicas-to-write"},
    {"bloom", "redis_down",
     "kills the one Redis and sets its min-replicas-to-write"},
    {"rate", "redis_stalled_outcome_unknown",
     "starts a Redis of its own with DEBUG and puts it to sleep"},
    {"sem", "lost_when_redis_down", "kills the one Redis"},
    {"sem", "recheck_on_restart", "kills and restarts the one Redis"},
    {"sem", "recheck_prompt", "kills and restarts the one Redis"},
    {"sem", "recheck_retried",
     "refuses scripts (ACL) and drops the clients of the one Redis"},
    {"sem", "lost_before_lease_end",
     "stops the one Redis process (SIGSTOP) for longer than a lease"},
    {"sem", "pair_cost",
     "counts the commands of one node (INFO commandstats), which other "
     "keys' slots share on a cluster"},
    {"multilock", "redis_down", "kills and restarts the one Redis"},
    {"multilock", "redlock_group",
     "starts standalone servers of its own (lock.redlock and redis)"},
    {"stale", "redis_down_queued",
     "kills and restarts a standalone Redis of its own"},
    {"core", "redis_restart", "kills and restarts the one Redis"},
    {"core", "redis_timeout",
     "stops the one Redis process (SIGSTOP) to time a request out"},
    {"core", "cleanup",
     "checks that the harness stops the Redis it started (none here)"},
    {"admin", "force_redis_down", "kills the one Redis"},
    {"libleased", "redis_unavailable", "kills the one Redis"},
    {"refused", "misconf",
     "moves the one Redis' directory away under a save (a cluster node "
     "keeps its nodes.conf there)"},
    {"refused", "readonly",
     "turns the one Redis into a replica (a cluster node refuses "
     "REPLICAOF)"},
};

#define H_CLUSTER_ENV "LD_TEST_CLUSTER"

static int cl_ports[H_CLUSTER_MAX];
static int cl_nports = -1;
static int cl_masters[H_CLUSTER_MAX];
static int cl_nmasters;

bool
h_on_cluster(void)
{
    if (cl_nports < 0) {
        const char *env = getenv(H_CLUSTER_ENV);
        const char *p = env;

        cl_nports = 0;
        while (p != NULL && *p && cl_nports < H_CLUSTER_MAX) {
            const char *colon = strchr(p, ':');
            if (colon == NULL) {
                break;
            }
            cl_ports[cl_nports++] = atoi(colon + 1);
            p = strchr(colon, ',');
            p = p != NULL ? p + 1 : NULL;
        }
    }
    return cl_nports > 0;
}

/* Is R the h_redis that stands for the cluster (see h_on_cluster)? */
static bool
is_cluster(const struct h_redis *r)
{
    if (!h_on_cluster() || r->pid != 0) {
        return false;
    }
    for (int i = 0; i < cl_nports; i++) {
        if (cl_ports[i] == r->port) {
            return true;
        }
    }
    return false;
}

static redisContext *
port_connect(int port)
{
    struct h_redis n;

    memset(&n, 0, sizeof n);
    n.port = port;
    return h_redis_connect(&n);
}

/* One command on a connection; ARG says which (see route). */
typedef redisReply *route_send(redisContext *c, void *arg);

struct fmt_cmd {
    const char *fmt;
    va_list *ap;
};

static redisReply *
send_fmt(redisContext *c, void *arg)
{
    struct fmt_cmd *f = arg;
    redisReply *rep;
    va_list cp;

    va_copy(cp, *f->ap);
    rep = redisvCommand(c, f->fmt, cp);
    va_end(cp);
    return rep;
}

struct argv_cmd {
    int argc;
    const char **argv;
    const size_t *argvlen;
};

static redisReply *
send_argv(redisContext *c, void *arg)
{
    struct argv_cmd *a = arg;

    return redisCommandArgv(c, a->argc, a->argv, a->argvlen);
}

/* SEND on the node at PORT, following MOVED and ASK (a test's command
 * names at most the keys of one slot; split_per_key handles the rest). */
static redisReply *
route(int port, route_send *send, void *arg)
{
    bool asking = false;

    for (int hop = 0; hop < 5; hop++) {
        redisContext *c = port_connect(port);
        redisReply *rep;

        if (c == NULL) {
            return NULL;
        }
        if (asking) {
            rep = redisCommand(c, "ASKING");
            if (rep != NULL) {
                freeReplyObject(rep);
            }
        }
        rep = send(c, arg);
        redisFree(c);
        if (rep == NULL || rep->type != REDIS_REPLY_ERROR ||
            (strncmp(rep->str, "MOVED ", 6) != 0 &&
             strncmp(rep->str, "ASK ", 4) != 0)) {
            return rep;
        }
        asking = rep->str[1] == 'S';
        const char *colon = strrchr(rep->str, ':');
        port = colon != NULL ? atoi(colon + 1) : 0;
        freeReplyObject(rep);
        if (port <= 0) {
            return NULL;
        }
    }
    return NULL;
}

#define H_SPLIT_ARGS 64

/* The arguments of the RESP command CMD (as redisvFormatCommand makes
 * it) into ARGV and ARGVLEN, pointing into CMD; their count, or -1. */
static int
resp_args(char *cmd, const char **argv, size_t *argvlen)
{
    char *p = cmd;
    int n;

    if (*p != '*' || (n = atoi(p + 1)) <= 0 || n > H_SPLIT_ARGS) {
        return -1;
    }
    p = strstr(p, "\r\n");
    for (int i = 0; i < n; i++) {
        if (p == NULL || p[2] != '$') {
            return -1;
        }
        argvlen[i] = (size_t)atol(p + 3);
        p = strstr(p + 3, "\r\n");
        if (p == NULL) {
            return -1;
        }
        argv[i] = p + 2;
        p += 2 + argvlen[i];
    }
    return n;
}

/* One command sent to several servers answers as one: the first reply,
 * or the last error; integer replies add up (fold_done puts the sum in).
 * REP is owned, and may be NULL (a server that did not answer). */
static void
fold_reply(redisReply **acc, long long *sum, redisReply *rep)
{
    if (rep == NULL) {
        return;
    }
    if (rep->type == REDIS_REPLY_INTEGER) {
        *sum += rep->integer;
    }
    if (*acc == NULL || rep->type == REDIS_REPLY_ERROR) {
        if (*acc != NULL) {
            freeReplyObject(*acc);
        }
        *acc = rep;
    } else {
        freeReplyObject(rep);
    }
}

static redisReply *
fold_done(redisReply *acc, long long sum)
{
    if (acc != NULL && acc->type == REDIS_REPLY_INTEGER) {
        acc->integer = sum;
    }
    return acc;
}

/* A multi-key command whose keys live in different slots (CROSSSLOT) as
 * one command per key, as a cluster client library would do it: MSET
 * as SETs, DEL, UNLINK, EXISTS and TOUCH with their integer replies
 * summed. NULL when FMT is none of those. */
static redisReply *
split_per_key(int port, const char *fmt, va_list ap)
{
    const char *argv[H_SPLIT_ARGS], *one[3];
    size_t argvlen[H_SPLIT_ARGS], onelen[3];
    redisReply *acc = NULL;
    long long sum = 0;
    char *cmd = NULL;
    int argc, step = 0;
    va_list cp;

    va_copy(cp, ap);
    argc = redisvFormatCommand(&cmd, fmt, cp);
    va_end(cp);
    if (argc < 0 || (argc = resp_args(cmd, argv, argvlen)) < 2) {
        redisFreeCommand(cmd);
        return NULL;
    }
    static const char *const per_key[] = {"DEL", "UNLINK", "EXISTS", "TOUCH"};
    for (size_t i = 0; i < sizeof per_key / sizeof per_key[0]; i++) {
        if (argvlen[0] == strlen(per_key[i]) &&
            strncasecmp(argv[0], per_key[i], argvlen[0]) == 0) {
            step = 1;
        }
    }
    if (argvlen[0] == 4 && strncasecmp(argv[0], "MSET", 4) == 0) {
        step = 2;
    }
    one[0] = step == 2 ? "SET" : argv[0];
    onelen[0] = step == 2 ? 3 : argvlen[0];
    for (int i = 1; step > 0 && i + step - 1 < argc; i += step) {
        struct argv_cmd a = {1 + step, one, onelen};
        for (int k = 0; k < step; k++) {
            one[1 + k] = argv[i + k];
            onelen[1 + k] = argvlen[i + k];
        }
        redisReply *rep = route(port, send_argv, &a);
        fold_reply(&acc, &sum, rep);
    }
    redisFreeCommand(cmd);
    return fold_done(acc, sum);
}

static redisReply *
routed_vcommand(int port, const char *fmt, va_list ap)
{
    redisReply *rep;
    va_list cp;

    /* A local copy: a va_list parameter is not a va_list to point at. */
    va_copy(cp, ap);
    struct fmt_cmd f = {fmt, &cp};
    rep = route(port, send_fmt, &f);
    va_end(cp);

    if (rep != NULL && rep->type == REDIS_REPLY_ERROR &&
        strncmp(rep->str, "CROSSSLOT", 9) == 0) {
        redisReply *split = split_per_key(port, fmt, ap);
        if (split != NULL) {
            freeReplyObject(rep);
            rep = split;
        }
    }
    return rep;
}

redisContext *
h_redis_connect_for(const struct h_redis *r, const char *key)
{
    int port = r->port;

    if (!is_cluster(r)) {
        return h_redis_connect(r);
    }
    for (int hop = 0; hop < 5; hop++) {
        redisContext *c = port_connect(port);
        redisReply *rep = c != NULL ? redisCommand(c, "EXISTS %s", key) : NULL;
        const char *colon;

        if (rep == NULL || rep->type != REDIS_REPLY_ERROR ||
            strncmp(rep->str, "MOVED ", 6) != 0) {
            if (rep != NULL) {
                freeReplyObject(rep);
            }
            return c;
        }
        colon = strrchr(rep->str, ':');
        port = colon != NULL ? atoi(colon + 1) : 0;
        freeReplyObject(rep);
        redisFree(c);
    }
    return NULL;
}

/* The ports of the masters now (ROLE of every node). */
static void
find_masters(void)
{
    cl_nmasters = 0;
    for (int i = 0; i < cl_nports; i++) {
        redisContext *c = port_connect(cl_ports[i]);
        redisReply *rep = c != NULL ? redisCommand(c, "ROLE") : NULL;

        if (rep != NULL && rep->type == REDIS_REPLY_ARRAY &&
            rep->elements > 0 && rep->element[0]->type == REDIS_REPLY_STRING &&
            strcmp(rep->element[0]->str, "master") == 0) {
            cl_masters[cl_nmasters++] = cl_ports[i];
        }
        if (rep != NULL) {
            freeReplyObject(rep);
        }
        if (c != NULL) {
            redisFree(c);
        }
    }
}

/* Commands about a whole server rather than a key go to every master; an
 * integer reply is the sum of theirs. */
static bool
for_every_master(const char *fmt)
{
    static const char *const all[] = {"FLUSHALL",         "FLUSHDB",
                                      "SCRIPT FLUSH",     "DBSIZE",
                                      "CONFIG RESETSTAT", "CLIENT PAUSE",
                                      "CLIENT UNPAUSE",   "ACL SETUSER"};

    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strncasecmp(fmt, all[i], strlen(all[i])) == 0) {
            return true;
        }
    }
    return false;
}

/* INFO of a whole cluster: the masters' INFO with every integer summed,
 * "key:N" and each "name=N" of "key:name=N,..." (commandstats), so that a
 * test counting what Redis did counts it on every master. Other fields
 * are the first master's. */
#define H_INFO_LINES 512

struct info_line {
    char key[96];
    char val[256];
};

static bool
all_digits(const char *p, size_t n)
{
    if (n > 0 && *p == '-') {
        p++;
        n--;
    }
    if (n == 0) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return false;
        }
    }
    return true;
}

/* VAL (a field of the first master) plus ADD (the same field of another)
 * where both are integers, field by field for "a=N,b=M". */
static void
info_add(char *val, size_t len, const char *add)
{
    char out[256], *vp = val;
    const char *ap = add;
    size_t used = 0;

    out[0] = '\0';
    while (*vp && *ap && used < sizeof out - 1) {
        size_t vn = strcspn(vp, ",="), an = strcspn(ap, ",=");
        if (all_digits(vp, vn) && all_digits(ap, an)) {
            used += (size_t)snprintf(out + used, sizeof out - used, "%lld",
                                     atoll(vp) + atoll(ap));
        } else {
            used += (size_t)snprintf(out + used, sizeof out - used, "%.*s",
                                     (int)vn, vp);
        }
        vp += vn;
        ap += an;
        if (*vp == '\0' || *ap == '\0' || *vp != *ap) {
            break;
        }
        if (used < sizeof out - 1) {
            out[used++] = *vp;
            out[used] = '\0';
        }
        vp++;
        ap++;
    }
    snprintf(val, len, "%s", out);
}

static int
info_merge(struct info_line *lines, int n, const char *text)
{
    const char *p = text;

    while (*p) {
        size_t len = strcspn(p, "\r\n");
        const char *colon = memchr(p, ':', len);
        if (colon != NULL && *p != '#') {
            size_t klen = (size_t)(colon - p);
            char val[256];
            int i;

            snprintf(val, sizeof val, "%.*s", (int)(len - klen - 1),
                     colon + 1);
            for (i = 0; i < n; i++) {
                if (strlen(lines[i].key) == klen &&
                    memcmp(lines[i].key, p, klen) == 0) {
                    info_add(lines[i].val, sizeof lines[i].val, val);
                    break;
                }
            }
            if (i == n && n < H_INFO_LINES) {
                snprintf(lines[n].key, sizeof lines[n].key, "%.*s", (int)klen,
                         p);
                snprintf(lines[n].val, sizeof lines[n].val, "%s", val);
                n++;
            }
        }
        p += len;
        p += strspn(p, "\r\n");
    }
    return n;
}

static redisReply *
cluster_info(const char *fmt, va_list ap)
{
    struct info_line *lines = calloc(H_INFO_LINES, sizeof *lines);
    redisReply *first = NULL;
    int n = 0;

    if (lines == NULL) {
        return NULL;
    }
    for (int i = 0; i < cl_nmasters; i++) {
        redisContext *c = port_connect(cl_masters[i]);
        redisReply *rep;
        va_list cp;

        if (c == NULL) {
            continue;
        }
        va_copy(cp, ap);
        rep = redisvCommand(c, fmt, cp);
        va_end(cp);
        redisFree(c);
        if (rep == NULL || rep->type != REDIS_REPLY_STRING) {
            if (first == NULL) {
                first = rep;
            } else if (rep != NULL) {
                freeReplyObject(rep);
            }
            continue;
        }
        n = info_merge(lines, n, rep->str);
        if (first == NULL || first->type != REDIS_REPLY_STRING) {
            if (first != NULL) {
                freeReplyObject(first);
            }
            first = rep;
        } else {
            freeReplyObject(rep);
        }
    }
    if (first != NULL && first->type == REDIS_REPLY_STRING) {
        char *text = NULL;
        size_t size = 0;
        FILE *m = open_memstream(&text, &size);
        if (m != NULL) {
            for (int i = 0; i < n; i++) {
                fprintf(m, "%s:%s\r\n", lines[i].key, lines[i].val);
            }
            fclose(m);
            /* hiredis 0.14 frees a reply's string with free(). */
            free(first->str);
            first->str = text;
            first->len = strlen(text);
        }
    }
    free(lines);
    return first;
}

static redisReply *
cluster_vcommand(const struct h_redis *r, const char *fmt, va_list ap)
{
    redisReply *first = NULL;
    long long sum = 0;

    if (cl_nmasters == 0) {
        find_masters();
    }
    if (strncasecmp(fmt, "INFO", 4) == 0) {
        return cluster_info(fmt, ap);
    }
    if (!for_every_master(fmt)) {
        return routed_vcommand(r->port, fmt, ap);
    }
    for (int i = 0; i < cl_nmasters; i++) {
        redisContext *c = port_connect(cl_masters[i]);
        redisReply *rep;
        va_list cp;

        if (c == NULL) {
            continue;
        }
        va_copy(cp, ap);
        rep = redisvCommand(c, fmt, cp);
        va_end(cp);
        redisFree(c);
        fold_reply(&first, &sum, rep);
    }
    return fold_done(first, sum);
}

static redisReply *
cluster_command(const struct h_redis *r, const char *fmt, ...)
{
    redisReply *rep;
    va_list ap;

    va_start(ap, fmt);
    rep = cluster_vcommand(r, fmt, ap);
    va_end(ap);
    return rep;
}

/* In place of starting redis-server for the fixture: R stands for the
 * cluster, every master emptied as a fresh server would be. */
static int
cluster_attach(struct h_redis *r)
{
    redisReply *rep;

    memset(r, 0, sizeof *r);
    find_masters();
    if (cl_nmasters == 0) {
        fprintf(stderr, "harness: no master in $%s\n", H_CLUSTER_ENV);
        return -1;
    }
    r->port = cl_masters[0];
    static const char *const fresh[] = {"FLUSHALL", "SCRIPT FLUSH",
                                        "CONFIG RESETSTAT"};
    for (size_t i = 0; i < sizeof fresh / sizeof fresh[0]; i++) {
        rep = cluster_command(r, fresh[i]);
        if (rep == NULL || rep->type == REDIS_REPLY_ERROR) {
            fprintf(stderr, "harness: %s on the cluster failed: %s\n",
                    fresh[i], rep != NULL ? rep->str : "no reply");
            if (rep != NULL) {
                freeReplyObject(rep);
            }
            return -1;
        }
        freeReplyObject(rep);
    }
    return 0;
}

static bool
cluster_wants(const struct h_redis *r, const char *extra_args)
{
    return h_on_cluster() && extra_args == NULL && fixture != NULL &&
           r == fixture->redis[0];
}

/* The redis section's seed list for leased: every node. */
static void
cluster_seeds(FILE *m)
{
    fprintf(m, "mode: cluster\n  addresses: [");
    for (int i = 0; i < cl_nports; i++) {
        fprintf(m, "%s\"127.0.0.1:%d\"", i > 0 ? ", " : "", cl_ports[i]);
    }
    fprintf(m, "]");
}

static void
write_cluster_section(FILE *m)
{
    fprintf(m, "redis:\n  ");
    cluster_seeds(m);
    fprintf(m, "\n");
}

/* A test's own redis section naming the cluster's address gets the
 * cluster's mode and seeds in its place. */
static int
cluster_subst_address(struct h_daemon *d)
{
    char from[64], *at, *text = NULL;
    size_t size = 0;
    FILE *m;

    snprintf(from, sizeof from, "address: \"127.0.0.1:%d\"", d->redis_port);
    at = strstr(d->yaml_extra, from);
    if (at == NULL) {
        return 0;
    }
    m = open_memstream(&text, &size);
    if (m == NULL) {
        return -1;
    }
    fwrite(d->yaml_extra, 1, (size_t)(at - d->yaml_extra), m);
    cluster_seeds(m);
    fputs(at + strlen(from), m);
    fclose(m);
    if (strlen(text) >= sizeof d->yaml_extra) {
        free(text);
        fprintf(stderr, "harness: yaml_extra too long\n");
        return -1;
    }
    snprintf(d->yaml_extra, sizeof d->yaml_extra, "%s", text);
    free(text);
    return 0;
}

static bool
daemon_on_cluster(const struct h_daemon *d)
{
    struct h_redis r;

    memset(&r, 0, sizeof r);
    r.port = d->redis_port;
    return is_cluster(&r);
}

/* Every master in leased's slot map, each with a ready connection. */
static void
wait_cluster_connected(struct h_conn *c, long long deadline)
{
    if (cl_nmasters == 0) {
        find_masters();
    }
    while ((h_stat(c, "redis_cluster_nodes") < cl_nmasters ||
            h_stat(c, "redis_connected") < cl_nmasters) &&
           h_now_ms() < deadline) {
        sleep_ms(10);
    }
}

static long long
subscribers_on(int port, const char *sub, const char *channel)
{
    redisContext *c = port_connect(port);
    redisReply *rep = c != NULL ? redisCommand(c, "PUBSUB %s %s", sub, channel)
                                : NULL;
    long long n = 0;

    if (rep != NULL && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[1]->type == REDIS_REPLY_INTEGER) {
        n = rep->element[1]->integer;
    }
    if (rep != NULL) {
        freeReplyObject(rep);
    }
    if (c != NULL) {
        redisFree(c);
    }
    return n;
}

/* Subscribers of CHANNEL anywhere in the cluster: classic ones on any
 * node, sharded ones (leased's) on the master of its slot. */
static bool
cluster_subscribed(const char *channel)
{
    long long n = 0;

    for (int i = 0; i < cl_nports; i++) {
        n += subscribers_on(cl_ports[i], "NUMSUB", channel);
        n += subscribers_on(cl_ports[i], "SHARDNUMSUB", channel);
    }
    return n >= 1;
}

static const char *
cluster_skip_reason(const char *suite, const char *name)
{
    for (size_t i = 0; i < sizeof cluster_skips / sizeof cluster_skips[0];
         i++) {
        if (strcmp(cluster_skips[i].suite, suite) == 0 &&
            strcmp(cluster_skips[i].name, name) == 0) {
            return cluster_skips[i].why;
        }
    }
    return NULL;
}
