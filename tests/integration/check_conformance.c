/* The conformance suite of the clients (clients/conformance/README.md):
 * every client's runner carries out every scenario of
 * clients/conformance/scenarios against a real redis-server and leased.
 * This program starts them, serves the control channel the runners (and
 * their helper processes) reach through $LEASED_CONTROL, and fails a
 * client's case naming each scenario its runner reported as failed.
 *
 * python3, node, go, java and cargo are required: a missing toolchain fails its case
 * (exit 127 from exec), it is not skipped. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* A whole run of one client; a runner is meant to take about 60 s. */
#define RUN_MS 150000
#define AUTH_TOKEN "conformance-T0ken"
#define MAX_SCENARIOS 64
#define MAX_HELPERS 8
#define MAX_MARKS 32
#define MAX_PEERS 16
#define LINE_MAX_BYTES 65536
#define FILE_LEN 700

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "conformance",
    .redis = {&R},
    .daemons = {&D},
};

static char out[1 << 17], err[1 << 17];

/* --- the environment a runner sees ------------------------------------ */

struct helper {
    char name[64];
    pid_t pid;
    bool exited;
    int status; /* as README's wait_exit: exit status, 128 + signal */
};

/* A control request that waits (wait_mark, wait_exit) until its
 * condition holds or its deadline passes. */
struct peer {
    int fd;
    char buf[LINE_MAX_BYTES];
    size_t len;
    json_t *waiting;
    long long deadline_ms;
};

static struct {
    const char *const *runner; /* argv prefix of the runner */
    char ctl_path[400];
    char tmp[300]; /* LEASED_CONF_TMP */
    struct helper helpers[MAX_HELPERS];
    int nhelpers;
    char marks[MAX_MARKS][64];
    int nmarks;
    bool redis_stalled; /* stall_redis without resume_redis yet */
    int listen_fd;
    int stop_pipe[2];
    struct peer peers[MAX_PEERS];
} ctl;

static const char *
builddir(void)
{
    const char *p = getenv("LD_BUILDDIR");

    return p && *p ? p : ".";
}

static json_t *
ctl_fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return json_pack("{s:b,s:s}", "ok", 0, "error", msg);
}

static json_t *
ctl_ok(void)
{
    return json_pack("{s:b}", "ok", 1);
}

static struct helper *
helper_find(const char *name)
{
    for (int i = 0; i < ctl.nhelpers; i++) {
        if (strcmp(ctl.helpers[i].name, name) == 0) {
            return &ctl.helpers[i];
        }
    }
    return NULL;
}

static void
helper_reap(struct helper *h)
{
    int st;

    if (h->exited || h->pid <= 0) {
        return;
    }
    if (waitpid(h->pid, &st, WNOHANG) == h->pid) {
        h->exited = true;
        h->status = WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
        h_untrack_pid(h->pid);
    }
}

static void
helpers_kill_all(void)
{
    for (int i = 0; i < ctl.nhelpers; i++) {
        struct helper *h = &ctl.helpers[i];

        if (!h->exited && h->pid > 0) {
            kill(h->pid, SIGKILL);
            waitpid(h->pid, NULL, 0);
            h_untrack_pid(h->pid);
        }
    }
    ctl.nhelpers = 0;
}

/* The runner again in helper mode (RUNNER --steps JSON), its output in
 * a .log of the case's dir, so that a failed case prints it. */
static json_t *
act_spawn(const json_t *req)
{
    const char *name = jstr(req, "name");
    json_t *steps = json_object_get(req, "steps");
    char *text, logpath[400];
    const char *argv[16];
    int n = 0, fd;
    pid_t pid;

    if (!name || !json_is_array(steps) || ctl.nhelpers == MAX_HELPERS ||
        helper_find(name)) {
        return ctl_fail("spawn needs a new name and steps");
    }
    text = json_dumps(steps, JSON_COMPACT);
    for (; ctl.runner[n] && n < 12; n++) {
        argv[n] = ctl.runner[n];
    }
    argv[n++] = "--steps";
    argv[n++] = text;
    argv[n] = NULL;
    snprintf(logpath, sizeof logpath, "%s/helper-%s.log",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name);
    fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    fflush(NULL);
    pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    free(text);
    if (fd >= 0) {
        close(fd);
    }
    if (pid < 0) {
        return ctl_fail("fork: %s", strerror(errno));
    }
    h_track_pid(pid);
    snprintf(ctl.helpers[ctl.nhelpers].name, sizeof ctl.helpers[0].name, "%s",
             name);
    ctl.helpers[ctl.nhelpers].pid = pid;
    ctl.helpers[ctl.nhelpers].exited = false;
    ctl.nhelpers++;
    return ctl_ok();
}

static json_t *
act_kill(const json_t *req)
{
    struct helper *h = helper_find(jstr(req, "name") ? jstr(req, "name") : "");

    if (!h) {
        return ctl_fail("no helper named so");
    }
    if (!h->exited) {
        kill(h->pid, SIGKILL);
    }
    return ctl_ok();
}

static bool
daemon_uses_redis(void)
{
    struct h_conn *c = h_connect(&D);
    bool up;

    if (!c) {
        return false;
    }
    up = h_wait_stat_min(c, "redis_connected", 1, 10000);
    h_close(c);
    return up;
}

static bool
redis_flushed(void)
{
    redisReply *r = h_redis_cmd(&R, "FLUSHALL");
    bool ok = r && r->type == REDIS_REPLY_STATUS;

    if (r) {
        freeReplyObject(r);
    }
    return ok;
}

static void
tmp_clear(void)
{
    DIR *d = opendir(ctl.tmp);
    struct dirent *e;

    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') {
            unlinkat(dirfd(d), e->d_name, 0);
        }
    }
    if (d) {
        closedir(d);
    }
}

/* SIGSTOP / SIGCONT of redis-server: it keeps its connections but
 * answers nothing, so the daemon's renewals stall. */
static json_t *
stall_redis(bool stall)
{
    if (R.pid <= 0) {
        return ctl_fail("redis-server is not running");
    }
    h_redis_signal(&R, stall ? SIGSTOP : SIGCONT);
    ctl.redis_stalled = stall;
    return ctl_ok();
}

/* A scenario starts on a flushed Redis and a running daemon, whatever the
 * one before it left behind. */
static json_t *
act_begin(void)
{
    helpers_kill_all();
    ctl.nmarks = 0;
    tmp_clear();
    /* A scenario that failed between stall_redis and resume_redis. */
    if (ctl.redis_stalled && R.pid > 0) {
        json_decref(stall_redis(false));
    }
    if (R.pid <= 0 && h_redis_restart(&R) != 0) {
        return ctl_fail("redis-server did not start again");
    }
    if ((D.pid <= 0 || kill(D.pid, 0) != 0) && h_daemon_restart(&D) != 0) {
        return ctl_fail("leased did not start again");
    }
    if (!redis_flushed() || !daemon_uses_redis()) {
        return ctl_fail("Redis not flushed or not in use by leased");
    }
    return ctl_ok();
}

static json_t *
act_force_unlock(const json_t *req)
{
    struct h_conn *c = h_connect(&D);
    json_t *r;
    bool ok;

    if (!c || !jstr(req, "key")) {
        h_close(c);
        return ctl_fail("no key, or no connection to leased");
    }
    r = h_callf(c, 5000, "{s:s,s:s}", "op", "lock.force_unlock", "key",
                jstr(req, "key"));
    ok = h_ok(r);
    h_close(c);
    if (!ok) {
        json_t *f = ctl_fail("lock.force_unlock: %s", h_dump(r));

        json_decref(r);
        return f;
    }
    json_decref(r);
    return ctl_ok();
}

static json_t *
act_mark(const json_t *req)
{
    const char *name = jstr(req, "name");

    if (!name || ctl.nmarks == MAX_MARKS) {
        return ctl_fail("mark needs a name");
    }
    snprintf(ctl.marks[ctl.nmarks++], sizeof ctl.marks[0], "%s", name);
    return ctl_ok();
}

static bool
marked(const char *name)
{
    for (int i = 0; i < ctl.nmarks; i++) {
        if (strcmp(ctl.marks[i], name) == 0) {
            return true;
        }
    }
    return false;
}

static json_t *
act_redis(const char *a)
{
    if (strcmp(a, "stop_redis") == 0) {
        h_redis_kill(&R);
        return ctl_ok();
    } else if (strcmp(a, "start_redis") == 0) {
        return h_redis_restart(&R) == 0 && daemon_uses_redis()
                   ? ctl_ok()
                   : ctl_fail("Redis not back in use by leased");
    } else if (strcmp(a, "flush_redis") == 0) {
        return redis_flushed() ? ctl_ok() : ctl_fail("FLUSHALL failed");
    } else if (strcmp(a, "stall_redis") == 0 ||
               strcmp(a, "resume_redis") == 0) {
        return stall_redis(strcmp(a, "stall_redis") == 0);
    }
    return ctl_fail("unknown action '%s'", a);
}

/* Actions that answer at once; NULL for those that wait. */
static json_t *
act_now(const json_t *req)
{
    const char *a = jstr(req, "action") ? jstr(req, "action") : "";

    if (strcmp(a, "begin") == 0) {
        return act_begin();
    } else if (strcmp(a, "restart_daemon") == 0) {
        h_daemon_stop(&D);
        return h_daemon_restart(&D) == 0 ? ctl_ok()
                                         : ctl_fail("leased did not start");
    } else if (strstr(a, "_redis") != NULL) {
        return act_redis(a);
    } else if (strcmp(a, "force_unlock") == 0) {
        return act_force_unlock(req);
    } else if (strcmp(a, "spawn") == 0) {
        return act_spawn(req);
    } else if (strcmp(a, "kill") == 0) {
        return act_kill(req);
    } else if (strcmp(a, "mark") == 0) {
        return act_mark(req);
    } else if (strcmp(a, "wait_mark") == 0 || strcmp(a, "wait_exit") == 0) {
        return NULL;
    }
    return ctl_fail("unknown action '%s'", a);
}

/* The answer of a waiting request once its condition holds, else NULL
 * (or a failure once its deadline passed). */
static json_t *
act_waited(struct peer *p)
{
    const char *a = jstr(p->waiting, "action");
    const char *name = jstr(p->waiting, "name") ? jstr(p->waiting, "name")
                                                : "";
    bool late = h_now_ms() >= p->deadline_ms;

    if (strcmp(a, "wait_mark") == 0) {
        if (marked(name)) {
            return ctl_ok();
        }
        return late ? ctl_fail("no mark '%s' in time", name) : NULL;
    }
    struct helper *h = helper_find(name);

    if (!h) {
        return ctl_fail("no helper named '%s'", name);
    }
    helper_reap(h);
    if (h->exited) {
        return json_pack("{s:b,s:i}", "ok", 1, "status", h->status);
    }
    return late ? ctl_fail("helper '%s' still running", name) : NULL;
}

static void
peer_answer(struct peer *p, json_t *reply)
{
    char *text = json_dumps(reply, JSON_COMPACT);
    size_t len = strlen(text);

    text = realloc(text, len + 2);
    text[len] = '\n';
    /* A runner that went away meanwhile gets nothing: ignored. */
    (void)!write(p->fd, text, len + 1);
    free(text);
    json_decref(reply);
    json_decref(p->waiting);
    close(p->fd);
    memset(p, 0, sizeof *p);
    p->fd = -1;
}

static void
peer_read(struct peer *p)
{
    ssize_t n = read(p->fd, p->buf + p->len, sizeof p->buf - p->len - 1);
    char *nl;
    json_t *req, *reply;

    if (n <= 0) {
        close(p->fd);
        p->fd = -1;
        return;
    }
    p->len += (size_t)n;
    p->buf[p->len] = '\0';
    if ((nl = strchr(p->buf, '\n')) == NULL) {
        return;
    }
    *nl = '\0';
    req = json_loads(p->buf, 0, NULL);
    p->waiting = req;
    if (!json_is_object(req)) {
        peer_answer(p, ctl_fail("not a JSON object"));
        return;
    }
    reply = act_now(req);
    if (reply) {
        peer_answer(p, reply);
        return;
    }
    p->deadline_ms = h_now_ms() + jint(req, "within_ms");
}

static void
peer_accept(void)
{
    int fd = accept4(ctl.listen_fd, NULL, NULL, SOCK_CLOEXEC);

    if (fd < 0) {
        return;
    }
    for (int i = 0; i < MAX_PEERS; i++) {
        if (ctl.peers[i].fd < 0) {
            ctl.peers[i].fd = fd;
            return;
        }
    }
    close(fd);
}

/* One thread serves every request in turn; actions that start processes
 * (leased, redis-server, helpers) run on it, so their parent-death signal
 * belongs to a thread that lives as long as the run. Waiting requests
 * are looked at again on every turn of the loop. */
static void *
ctl_serve(void *arg)
{
    (void)arg;
    for (;;) {
        struct pollfd pfd[MAX_PEERS + 2];
        int n = 0, idx[MAX_PEERS];
        bool waiting = false;

        pfd[n++] = (struct pollfd){.fd = ctl.stop_pipe[0], .events = POLLIN};
        pfd[n++] = (struct pollfd){.fd = ctl.listen_fd, .events = POLLIN};
        for (int i = 0; i < MAX_PEERS; i++) {
            struct peer *p = &ctl.peers[i];
            json_t *reply;

            if (p->fd < 0) {
                continue;
            }
            if (p->waiting && (reply = act_waited(p)) != NULL) {
                peer_answer(p, reply);
                continue;
            }
            waiting |= p->waiting != NULL;
            idx[n - 2] = i;
            pfd[n++] = (struct pollfd){.fd = p->fd, .events = POLLIN};
        }
        if (poll(pfd, (nfds_t)n, waiting ? 20 : 1000) < 0 && errno != EINTR) {
            break;
        }
        if (pfd[0].revents) {
            break;
        }
        if (pfd[1].revents) {
            peer_accept();
        }
        for (int k = 2; k < n; k++) {
            if (pfd[k].revents && !ctl.peers[idx[k - 2]].waiting) {
                peer_read(&ctl.peers[idx[k - 2]]);
            }
        }
    }
    helpers_kill_all();
    return NULL;
}

static void
ctl_listen(void)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};

    ck_assert_int_eq(h_tmpdir(ctl.tmp, sizeof ctl.tmp), 0);
    ck_assert_int_lt(snprintf(ctl.ctl_path, sizeof ctl.ctl_path, "%s/.control",
                              ctl.tmp),
                     (int)sizeof sa.sun_path);
    memcpy(sa.sun_path, ctl.ctl_path, strlen(ctl.ctl_path) + 1);
    ctl.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(ctl.listen_fd, 0);
    ck_assert_int_eq(bind(ctl.listen_fd, (struct sockaddr *)&sa, sizeof sa),
                     0);
    ck_assert_int_eq(listen(ctl.listen_fd, 16), 0);
    ck_assert_int_eq(pipe2(ctl.stop_pipe, O_CLOEXEC), 0);
    for (int i = 0; i < MAX_PEERS; i++) {
        ctl.peers[i].fd = -1;
    }
}

/* --- one client's run ---------------------------------------------------- */

static int
scenario_files(char files[][FILE_LEN], int max)
{
    char dir[300];
    struct dirent **list;
    int n, k = 0;

    snprintf(dir, sizeof dir, "%s/clients/conformance/scenarios", h_srcdir());
    n = scandir(dir, &list, NULL, alphasort);
    ck_assert_msg(n > 0, "no scenarios in %s", dir);
    for (int i = 0; i < n; i++) {
        const char *nm = list[i]->d_name;
        size_t len = strlen(nm);

        if (len > 5 && strcmp(nm + len - 5, ".json") == 0 && k < max &&
            snprintf(files[k], FILE_LEN, "%s/%s", dir, nm) < FILE_LEN) {
            k++;
        }
        free(list[i]);
    }
    free(list);
    return k;
}

/* The daemon: a TCP listener on a port kept across restarts, behind
 * listen.auth_token (error_unauthorized); a watchdog that finds a
 * flushed lock within a few seconds (lock_lost_flush) while the lease of
 * a killed holder is still far longer than its release takes
 * (killed_holder). */
static void
start_servers(void)
{
    char yaml[1024], addr[64], dead[400];
    int port = h_free_port();

    snprintf(yaml, sizeof yaml,
             "log:\n  level: info\n"
             "lock:\n  watchdog_ms: 10000\n"
             "listen:\n  unix: \"@DIR@/leased.sock\"\n"
             "  tcp: \"127.0.0.1:%d\"\n  auth_token: \"" AUTH_TOKEN "\"\n",
             port);
    h_start(yaml);
    ctl_listen();
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    snprintf(dead, sizeof dead, "%s/nobody.sock", ctl.tmp);
    setenv("LEASED_SOCKET", D.sock, 1);
    setenv("LEASED_TCP", addr, 1);
    setenv("LEASED_AUTH_TOKEN", AUTH_TOKEN, 1);
    setenv("LEASED_DEAD_SOCKET", dead, 1);
    setenv("LEASED_CONTROL", ctl.ctl_path, 1);
    setenv("LEASED_CONF_TMP", ctl.tmp, 1);
}

/* Every "not ok" line of OUT, joined, for the assertion's message. */
static void
failed_lines(const char *text, char *buf, size_t len)
{
    const char *p = text;
    size_t used = 0;

    buf[0] = '\0';
    while ((p = strstr(p, "not ok ")) != NULL) {
        size_t n = strcspn(p, "\n");

        used += (size_t)snprintf(buf + used, len - used, " [%.*s]", (int)n, p);
        if (used >= len) {
            break;
        }
        p += n;
    }
}

static void
run_conformance(const char *const *runner, const char *what)
{
    static char files[MAX_SCENARIOS][FILE_LEN];
    const char *argv[MAX_SCENARIOS + 8];
    char failed[4096];
    int nfiles, n = 0, rc, passed = -1, nfailed = -1;
    pthread_t th;
    const char *tot;

    start_servers();
    nfiles = scenario_files(files, MAX_SCENARIOS);
    ctl.runner = runner;
    for (; runner[n]; n++) {
        argv[n] = runner[n];
    }
    for (int i = 0; i < nfiles; i++) {
        argv[n++] = files[i];
    }
    argv[n] = NULL;
    ck_assert_int_eq(pthread_create(&th, NULL, ctl_serve, NULL), 0);
    rc = h_run(argv, out, sizeof out, err, sizeof err, RUN_MS);
    (void)!write(ctl.stop_pipe[1], "x", 1);
    pthread_join(th, NULL);
    if (rc != 0 || getenv("LD_VERBOSE")) {
        fprintf(stderr,
                "---- %s conformance: exit %d ----\n%s\n---- stderr ----\n"
                "%s\n---- end ----\n",
                what, rc, out, err);
    }
    tot = strstr(out, " passed, ");
    while (tot && tot > out && tot[-1] != '\n') {
        tot--;
    }
    if (tot) {
        sscanf(tot, "%d passed, %d failed", &passed, &nfailed);
    }
    failed_lines(out, failed, sizeof failed);
    ck_assert_msg(rc != 127, "%s runner %s: not installed?", what, runner[0]);
    ck_assert_msg(tot != NULL,
                  "%s runner exited %d without its totals line (crashed or "
                  "killed at %d ms?); failed so far:%s",
                  what, rc, RUN_MS, failed[0] ? failed : " (none)");
    ck_assert_msg(nfailed == 0 && passed == nfiles && rc == 0,
                  "%s: %d of %d scenarios passed, runner exit %d; failed:%s",
                  what, passed, nfiles, rc, failed[0] ? failed : " (none)");
}

START_TEST(test_c)
{
    char bin[400];
    const char *runner[] = {bin, NULL};

    snprintf(bin, sizeof bin, "%s/tests/integration/conformance_c",
             builddir());
    run_conformance(runner, "C (libleased)");
}
END_TEST

START_TEST(test_python)
{
    char path[400];
    const char *runner[] = {"python3", path, NULL};

    snprintf(path, sizeof path, "%s/clients/python/conformance.py",
             h_srcdir());
    run_conformance(runner, "Python");
}
END_TEST

START_TEST(test_node)
{
    char path[400];
    const char *runner[] = {"node", path, NULL};

    snprintf(path, sizeof path, "%s/clients/node/conformance.js", h_srcdir());
    run_conformance(runner, "Node.js");
}
END_TEST

/* The script builds the runner offline into a cache outside the tree. */
START_TEST(test_go)
{
    char path[400];
    const char *runner[] = {"sh", path, NULL};

    snprintf(path, sizeof path, "%s/clients/go/conformance.sh", h_srcdir());
    run_conformance(runner, "Go");
}
END_TEST

/* The script builds the client with javac once, outside the tree. */
START_TEST(test_java)
{
    char path[400];
    const char *runner[] = {"sh", path, NULL};

    snprintf(path, sizeof path, "%s/clients/java/conformance.sh", h_srcdir());
    run_conformance(runner, "Java");
}
END_TEST

/* The script builds the runner with cargo offline, outside the tree. */
START_TEST(test_rust)
{
    char path[400];
    const char *runner[] = {"sh", path, NULL};

    snprintf(path, sizeof path, "%s/clients/rust/conformance.sh", h_srcdir());
    run_conformance(runner, "Rust");
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(c, 200),  H_CASE(python, 200), H_CASE(node, 200),
        H_CASE(go, 300), H_CASE(java, 300),   H_CASE(rust, 300),
    };

    /* Keep the source tree clean (and usable read-only, for distcheck). */
    setenv("PYTHONDONTWRITEBYTECODE", "1", 1);
    return H_MAIN(fx, cases);
}
