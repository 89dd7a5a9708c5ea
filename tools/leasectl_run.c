/* leasectl lock and sem: run a command while holding a lock or a
 * permit. This file owns the child process, the signals while it runs
 * (blocked and read through a signalfd, passed on to the child) and the
 * give-back at the end. Nothing here renews the lease: the daemon does,
 * for as long as the connection lives. Once the lease is lost the
 * command is stopped, never left running without it. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "config.h"

#include "leasectl.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sysexits.h>
#include <unistd.h>

#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>

/* The child: the signal mask leasectl had, and death with leasectl, so
 * that CMD never runs on without the lock when leasectl is killed. */
static void
run_child(char **cmd, const sigset_t *oldmask, pid_t parent)
{
    int e;

    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) {
        _exit(EX_SOFTWARE);
    }
    sigprocmask(SIG_SETMASK, oldmask, NULL);
    execvp(cmd[0], cmd);
    e = errno;
    fprintf(stderr, CTL_NAME ": lock: %s: %s\n", cmd[0], strerror(e));
    _exit(e == ENOENT ? 127 : 126);
}

static int
status_of(int wstatus)
{
    if (WIFEXITED(wstatus)) {
        return WEXITSTATUS(wstatus);
    }
    if (WIFSIGNALED(wstatus)) {
        return 128 + WTERMSIG(wstatus);
    }
    return EX_SOFTWARE;
}

/* Start CMD with SIGCHLD, SIGINT, SIGTERM and SIGHUP blocked here and
 * readable from *SFD; *OLDMASK gets the mask to restore, *PID the child. */
static int
hold_start(char **cmd, sigset_t *oldmask, int *sfd, pid_t *pid)
{
    sigset_t set;
    pid_t parent = getpid();

    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    /* An inherited SIG_IGN for SIGCHLD would reap CMD behind our back. */
    signal(SIGCHLD, SIG_DFL);
    sigprocmask(SIG_BLOCK, &set, oldmask);
    *sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (*sfd < 0) {
        fprintf(stderr, CTL_NAME ": lock: signalfd: %s\n", strerror(errno));
        return EX_OSERR;
    }
    fflush(NULL);
    *pid = fork();
    if (*pid < 0) {
        fprintf(stderr, CTL_NAME ": lock: fork: %s\n", strerror(errno));
        close(*sfd);
        return EX_OSERR;
    }
    if (*pid == 0) {
        close(*sfd);
        run_child(cmd, oldmask, parent);
    }
    return 0;
}

/* Is the lock on KEY (TOKEN) gone: lock_lost for it, the daemon's
 * shutdown, or the connection's end? The reason (written into BUF, or a
 * fixed text), or NULL while it is held. */
static const char *
hold_lost(struct ctl *ctl, const char *key, const char *token, char *buf,
          size_t size)
{
    struct leased_event ev;
    struct leased_error err;
    const char *why = NULL;
    int rc = LEASED_OK;

    /* Events may already sit in the library's buffer. */
    while (why == NULL) {
        rc = leased_next_event(ctl->conn, 0, &ev, &err);
        if (rc != LEASED_OK) {
            break;
        }
        if (ev.type == LEASED_EV_LOCK_LOST && ev.key != NULL &&
            strcmp(ev.key, key) == 0 &&
            (ev.token == NULL || strcmp(ev.token, token) == 0)) {
            snprintf(buf, size, "lock lost (%s)",
                     ev.reason != NULL ? ev.reason : "no reason given");
            why = buf;
        } else if (ev.type == LEASED_EV_SHUTDOWN) {
            why = "leased is shutting down";
        }
        leased_event_clear(&ev);
    }
    if (why == NULL && rc != LEASED_OK && rc != LEASED_E_TIMEOUT) {
        /* The session is gone, and its locks with it. */
        snprintf(buf, size, "connection to leased lost (%s)", err.message);
        why = buf;
    }
    return why;
}

/* Read the signals that came: SIGCHLD reaps CMD (PID), the others are
 * passed on to it. True once CMD is reaped, its status in *WSTATUS. */
static bool
hold_signals(int sfd, pid_t pid, int *wstatus)
{
    struct signalfd_siginfo si;
    bool reaped = false;

    while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        int sig = (int)si.ssi_signo;

        if (sig == SIGCHLD) {
            pid_t r = waitpid(pid, wstatus, WNOHANG);

            if (r == pid) {
                reaped = true;
            }
        } else if (!(sig == SIGINT && si.ssi_code == SI_KERNEL)) {
            /* A keyboard ^C reached CMD already: it is in our process
             * group. Everything else is passed on. */
            kill(pid, sig);
        }
    }
    return reaped;
}

/* Wait for a signal and, while the lock is held (not LOST), for the
 * daemon. True once CMD (PID) has ended, its status in *WSTATUS. */
static bool
hold_wait(struct ctl *ctl, int sfd, pid_t pid, bool lost, int *wstatus)
{
    struct pollfd pfd[2];
    int nfd = 1;

    pfd[0].fd = sfd;
    pfd[0].events = POLLIN;
    pfd[0].revents = 0;
    if (!lost && leased_fd(ctl->conn) >= 0) {
        pfd[1].fd = leased_fd(ctl->conn);
        pfd[1].events = POLLIN;
        pfd[1].revents = 0;
        nfd = 2;
    }
    if (poll(pfd, (nfds_t)nfd, -1) < 0 && errno != EINTR) {
        fprintf(stderr, CTL_NAME ": lock: poll: %s\n", strerror(errno));
        kill(pid, SIGTERM);
    }
    if ((pfd[0].revents & POLLIN) == 0) {
        return false;
    }
    return hold_signals(sfd, pid, wstatus);
}

/* Give the lock back now rather than when the connection closes, so
 * that a failure to do so is reported: RELEASE (stolen), or else an
 * unlock of KEY by OWNER. */
static void
hold_release(struct ctl *ctl, const char *key, const char *owner,
             json_t *release)
{
    struct leased_error err;

    if (release != NULL) {
        json_t *rep = NULL;

        if (ctl_call(ctl, release, 0, &rep, &err) != LEASED_OK &&
            err.code != LEASED_E_NOT_HELD) {
            fprintf(stderr, CTL_NAME ": %s: %s: release: %s: %s\n", ctl->cmd,
                    key, leased_strerror(err.code), err.message);
        }
        json_decref(rep);
    } else if (leased_unlock(ctl->conn, key, owner, NULL, NULL, &err) !=
                   LEASED_OK &&
               err.code != LEASED_E_NOT_HELD) {
        fprintf(stderr, CTL_NAME ": lock: %s: unlock: %s: %s\n", key,
                leased_strerror(err.code), err.message);
    }
}

/* Hold the lock while CMD runs: wait on the child (SIGCHLD through a
 * signalfd) and on the daemon's socket at once. The daemon renews a
 * watchdog lock for as long as this connection lives, so there is
 * nothing to send; what matters is noticing lock_lost, shutdown or the
 * connection's end, and stopping CMD then. RELEASE (stolen) is the
 * request that gives the lock or permit back; NULL: unlock KEY by OWNER. */
static int
hold_while(struct ctl *ctl, const char *key, const char *owner,
           const char *token, char **cmd, int lost_exit, json_t *release)
{
    sigset_t oldmask;
    bool lost = false;
    int sfd, rc, wstatus = 0;
    pid_t pid;

    rc = hold_start(cmd, &oldmask, &sfd, &pid);
    if (rc != 0) {
        return rc;
    }
    do {
        char whybuf[300];
        const char *why = lost ? NULL
                               : hold_lost(ctl, key, token, whybuf,
                                           sizeof whybuf);

        if (why != NULL) {
            fprintf(stderr, CTL_NAME ": %s: %s: %s; stopping the command\n",
                    ctl->cmd, key, why);
            kill(pid, SIGTERM);
            lost = true;
        }
    } while (!hold_wait(ctl, sfd, pid, lost, &wstatus));
    close(sfd);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    if (lost) {
        json_decref(release);
        return lost_exit;
    }
    hold_release(ctl, key, owner, release);
    return status_of(wstatus);
}

/* lock and sem through the daemon's JSON: the acquisition REQ (stolen),
 * then CMD under it, then RELEASE (stolen) with the token added. WHAT
 * names the thing for messages. */
static int
run_under(struct ctl *ctl, const char *key, const char *owner, json_t *req,
          long long wait_ms, char **cmd, int lost_exit, json_t *release,
          const char *what)
{
    struct leased_error err;
    json_t *rep = NULL;
    const char *tok;
    char token[LEASED_TOKEN_MAX];

    if (ctl_call(ctl, req, wait_ms, &rep, &err) != LEASED_OK) {
        json_decref(rep);
        json_decref(release);
        return ctl_fail(ctl, &err);
    }
    fflush(stdout);
    if (!json_is_true(json_object_get(rep, "acquired"))) {
        if (!ctl->quiet) {
            json_t *ttl = json_object_get(rep, "ttl_ms");

            if (json_is_integer(ttl)) {
                fprintf(stderr,
                        CTL_NAME ": %s: %s: %s (lease left %lld ms); not "
                                 "running %s\n",
                        ctl->cmd, key, what,
                        (long long)json_integer_value(ttl), cmd[0]);
            } else {
                fprintf(stderr, CTL_NAME ": %s: %s: %s; not running %s\n",
                        ctl->cmd, key, what, cmd[0]);
            }
        }
        json_decref(rep);
        json_decref(release);
        return ctl->conflict_exit;
    }
    tok = json_string_value(json_object_get(rep, "token"));
    snprintf(token, sizeof token, "%s", tok != NULL ? tok : "");
    json_decref(rep);
    json_object_set_new(release, "token", json_string(token));
    return hold_while(ctl, key, owner, token, cmd, lost_exit, release);
}

/* What lock and sem share on their command line: KEY -- CMD [ARGS...]
 * and the options below (each NULL when absent), and their values. */
struct run_opts {
    const char *ttl;
    const char *wait;
    const char *lost;
    const char *conflict;
    long long ttl_ms;
    long long wait_ms;
    long long lost_exit;
    char *pos[1];
    int npos;
    char **cmd;
    int ncmd;
};

/* Parse ARGV with DEFS (which point into O), then --ttl, --wait,
 * --lost-exit and --conflict-exit. */
static int
run_parse(struct ctl *ctl, int argc, char **argv, const struct optdef *defs,
          struct run_opts *o)
{
    int rc = ctl_parse_args(ctl, argc, argv, defs, o->pos, &o->npos, 1, true,
                            &o->cmd, &o->ncmd);

    if (rc == 0) {
        rc = ctl_opt_ms(ctl, "ttl", o->ttl, 1, &o->ttl_ms);
    }
    if (rc == 0) {
        rc = ctl_opt_ms(ctl, "wait", o->wait, -1, &o->wait_ms);
    }
    if (rc == 0) {
        rc = ctl_opt_exits(ctl, o->lost, o->conflict, &o->lost_exit);
    }
    return rc;
}

/* --ttl and --wait into an acquisition request (absent: the daemon's
 * defaults). */
static void
run_req_times(json_t *req, const struct run_opts *o)
{
    if (o->ttl_ms > 0) {
        json_object_set_new(req, "ttl_ms", json_integer(o->ttl_ms));
    }
    if (o->wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(o->wait_ms));
    }
}

/* lock through the daemon's JSON: for --json, and for the side MODE
 * ("read", "write") of a read-write lock. */
static int
lock_json(struct ctl *ctl, const struct run_opts *o, const char *owner,
          const char *mode)
{
    const char *key = o->pos[0];
    json_t *req, *rel;

    /* An older daemon ignores an unknown field: it would hand out a plain
     * lock instead of the side asked for. */
    if (mode != NULL && !ctl_want_feature(ctl, "rwlock")) {
        return ctl_no_feature(ctl, "read-write locks (feature rwlock)");
    }
    req = json_pack("{s:s,s:s}", "op", "lock", "key", key);
    rel = json_pack("{s:s,s:s}", "op", "unlock", "key", key);
    if (mode != NULL) {
        json_object_set_new(req, "mode", json_string(mode));
        json_object_set_new(rel, "mode", json_string(mode));
    }
    if (owner != NULL) {
        json_object_set_new(req, "owner", json_string(owner));
    }
    run_req_times(req, o);
    return run_under(ctl, key, owner, req, o->wait_ms, o->cmd,
                     (int)o->lost_exit, rel, "held by another holder");
}

/* lock through libleased: a plain lock, unlocked by OWNER at the end. */
static int
lock_plain(struct ctl *ctl, const struct run_opts *o, const char *owner)
{
    struct leased_lock_args args = {0};
    struct leased_lock_result res;
    struct leased_error err;

    args.ttl_ms = o->ttl_ms;
    args.wait_ms = o->wait_ms;
    args.owner = owner;
    if (leased_lock(ctl->conn, o->pos[0], &args, &res, &err) != LEASED_OK) {
        return ctl_fail(ctl, &err);
    }
    if (!res.acquired) {
        if (!ctl->quiet) {
            fprintf(stderr,
                    CTL_NAME ": lock: %s: held by another holder "
                             "(lease left %lld ms); not running %s\n",
                    o->pos[0], res.ttl_ms, o->cmd[0]);
        }
        return ctl->conflict_exit;
    }
    return hold_while(ctl, o->pos[0], owner, res.token, o->cmd,
                      (int)o->lost_exit, NULL);
}

int
cmd_lock(struct ctl *ctl, int argc, char **argv)
{
    struct run_opts o = {.lost_exit = EX_SOFTWARE};
    const char *owner = NULL, *rd = NULL, *wr = NULL;
    const struct optdef defs[] = {
        {"ttl", 0, true, &o.ttl},
        {"wait", 'w', true, &o.wait},
        {"owner", 0, true, &owner},
        {"lost-exit", 0, true, &o.lost},
        {"conflict-exit", 'E', true, &o.conflict},
        {"read", 0, false, &rd},
        {"write", 0, false, &wr},
        {NULL, 0, false, NULL},
    };
    int rc;

    rc = run_parse(ctl, argc, argv, defs, &o);
    if (rc != 0) {
        return rc;
    }
    if (o.npos != 1) {
        return ctl_usage_error(ctl->cmd, "wants KEY -- CMD [ARGS...]%s", "");
    }
    if (o.ncmd < 1) {
        return ctl_usage_error(ctl->cmd, "no command to run after KEY%s", "");
    }
    if (rd != NULL && wr != NULL) {
        return ctl_usage_error(ctl->cmd,
                               "--read and --write exclude each other%s", "");
    }
    rc = ctl_open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    if (rd != NULL || wr != NULL || ctl->json) {
        return lock_json(ctl, &o, owner,
                         rd != NULL   ? "read"
                         : wr != NULL ? "write"
                                      : NULL);
    }
    return lock_plain(ctl, &o, owner);
}

int
cmd_sem(struct ctl *ctl, int argc, char **argv)
{
    struct run_opts o = {.lost_exit = EX_SOFTWARE};
    const char *limit = NULL;
    const struct optdef defs[] = {
        {"ttl", 0, true, &o.ttl},
        {"wait", 'w', true, &o.wait},
        {"limit", 'n', true, &limit},
        {"lost-exit", 0, true, &o.lost},
        {"conflict-exit", 'E', true, &o.conflict},
        {NULL, 0, false, NULL},
    };
    long long lim = 0;
    json_t *req;
    int rc;

    rc = run_parse(ctl, argc, argv, defs, &o);
    if (rc != 0) {
        return rc;
    }
    if (limit == NULL || !ctl_parse_num(limit, 1, 1000000, &lim)) {
        return ctl_usage_error(ctl->cmd, "wants --limit N (1..1000000)%s", "");
    }
    if (o.npos != 1) {
        return ctl_usage_error(ctl->cmd,
                               "wants KEY --limit N -- CMD [ARGS...]%s", "");
    }
    if (o.ncmd < 1) {
        return ctl_usage_error(ctl->cmd, "no command to run after KEY%s", "");
    }
    rc = ctl_open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    if (!ctl_want_feature(ctl, "semaphore")) {
        return ctl_no_feature(ctl, "semaphores (feature semaphore)");
    }
    req = json_pack("{s:s,s:s,s:I}", "op", "sem.acquire", "key", o.pos[0],
                    "limit", (json_int_t)lim);
    run_req_times(req, &o);
    return run_under(ctl, o.pos[0], NULL, req, o.wait_ms, o.cmd,
                     (int)o.lost_exit,
                     json_pack("{s:s,s:s}", "op", "sem.release", "key",
                               o.pos[0]),
                     "no permit free");
}
