/* leasectl top: a live view of one daemon, from its stats, lock.list and
 * cache.hot, every second. This file owns the terminal while it runs
 * (keys read one by one without echo, the mode given back as it was) and
 * the SIGINT and SIGTERM handlers that end it. It only reads: no request
 * of it changes the daemon's state. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "config.h"

#include "leasectl.h"

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <termios.h>
#include <unistd.h>

/* How many locks and hot keys a frame shows. */
#define TOP_ROWS 5
/* lock.list is asked for this many, sorted here by how long each is held. */
#define TOP_LOCKS_ASKED 1000
#define TOP_INTERVAL_MS 1000

/* One reading of the daemon: its stats, the locks it holds, its hot keys
 * (NULL when the daemon refused the op), and when it was taken. */
struct top_sample {
    json_t *stats;
    json_t *locks;
    json_t *hot;
    long long at_ms;
};

static volatile sig_atomic_t top_stop;

static void
top_on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

/* Send REQ (stolen) and return FIELD of the reply (a new reference), or
 * NULL when the daemon refused the op; *RC is set on a connection error. */
static json_t *
top_ask(struct ctl *ctl, json_t *req, const char *field, int *rc)
{
    struct leased_error err;
    json_t *rep = NULL, *v = NULL;
    int r = leased_call_json(ctl->conn, req, 0, &rep, &err);

    json_decref(req);
    if (r == LEASED_OK) {
        v = json_incref(json_object_get(rep, field));
    } else if (rep == NULL) {
        *rc = ctl_fail(ctl, &err);
    }
    json_decref(rep);
    return v;
}

static void
top_sample_free(struct top_sample *s)
{
    json_decref(s->stats);
    json_decref(s->locks);
    json_decref(s->hot);
    memset(s, 0, sizeof *s);
}

static int
top_sample(struct ctl *ctl, struct top_sample *s)
{
    int rc = 0;

    top_sample_free(s);
    s->at_ms = ctl_now_ms();
    s->stats = top_ask(ctl, json_pack("{s:s}", "op", "stats"), "stats", &rc);
    if (rc == 0) {
        s->locks = top_ask(ctl,
                           json_pack("{s:s,s:i}", "op", "lock.list", "limit",
                                     TOP_LOCKS_ASKED),
                           "locks", &rc);
    }
    if (rc == 0) {
        s->hot = top_ask(ctl,
                         json_pack("{s:s,s:i}", "op", "cache.hot", "limit",
                                   TOP_ROWS),
                         "keys", &rc);
    }
    if (rc == 0 && s->stats == NULL) {
        fprintf(stderr, CTL_NAME ": top: the daemon refused stats\n");
        rc = EX_PROTOCOL;
    }
    return rc;
}

static long long
top_int(const json_t *o, const char *k)
{
    return (long long)json_integer_value(json_object_get(o, k));
}

/* The rate of counter K between two stats objects, per second. */
static double
top_rate(const json_t *prev, const json_t *cur, const char *k, double dt_s)
{
    long long d = top_int(cur, k) - top_int(prev, k);

    return d > 0 && dt_s > 0 ? (double)d / dt_s : 0.0;
}

static int
top_by_held(const void *a, const void *b)
{
    long long x = top_int(*(json_t *const *)a, "held_ms");
    long long y = top_int(*(json_t *const *)b, "held_ms");

    return x < y ? 1 : x > y ? -1 : 0;
}

/* Most waiters first, then the longest held. */
static int
top_by_waiters(const void *a, const void *b)
{
    long long x = top_int(*(json_t *const *)a, "waiters");
    long long y = top_int(*(json_t *const *)b, "waiters");

    return x < y ? 1 : x > y ? -1 : top_by_held(a, b);
}

/* The first TOP_ROWS locks of lock.list's answer in the order of CMP;
 * with WAITED only those that requests of the daemon wait for. */
static json_t *
top_rows(const json_t *locks, int (*cmp)(const void *, const void *),
         bool waited)
{
    size_t n = json_array_size(locks), i, k = 0;
    json_t **v = calloc(n != 0 ? n : 1, sizeof *v);
    json_t *out = json_array();

    if (v == NULL) {
        return out;
    }
    for (i = 0; i < n; i++) {
        json_t *e = json_array_get(locks, i);

        if (!waited || top_int(e, "waiters") > 0) {
            v[k++] = e;
        }
    }
    qsort(v, k, sizeof *v, cmp);
    for (i = 0; i < k && i < TOP_ROWS; i++) {
        json_array_append_new(
            out, json_pack("{s:O?,s:O?,s:I,s:I,s:I,s:I}", "key",
                           json_object_get(v[i], "key"), "mode",
                           json_object_get(v[i], "mode"), "count",
                           (json_int_t)top_int(v[i], "count"), "held_ms",
                           (json_int_t)top_int(v[i], "held_ms"), "ttl_ms",
                           (json_int_t)top_int(v[i], "ttl_ms"), "waiters",
                           (json_int_t)top_int(v[i], "waiters")));
    }
    free(v);
    return out;
}

static json_t *
top_ops(const json_t *prev, const json_t *cur, double dt_s)
{
    const json_t *p = json_object_get(prev, "requests_by_op");
    const char *op;
    json_t *c, *out = json_object();

    json_object_foreach(json_object_get(cur, "requests_by_op"), op, c)
    {
        double r = top_rate(p, json_object_get(cur, "requests_by_op"), op,
                            dt_s);

        if (r > 0) {
            json_object_set_new(out, op, json_real(r));
        }
    }
    return out;
}

/* What one frame shows, as --json prints it. */
static json_t *
top_frame(const struct top_sample *prev, const struct top_sample *cur)
{
    const json_t *p = prev->stats, *c = cur->stats;
    double dt = (double)(cur->at_ms - prev->at_ms) / 1000.0;

    return json_pack(
        "{s:I,s:f,s:o,s:I,s:I,s:I,s:I,s:f,s:f,s:o,s:o,s:{s:I,s:I,s:I},"
        "s:{s:I,s:I,s:O?},s:o}",
        "interval_ms", (json_int_t)(cur->at_ms - prev->at_ms),
        "requests_per_s", top_rate(p, c, "requests", dt), "ops_per_s",
        top_ops(p, c, dt), "sessions", (json_int_t)top_int(c, "sessions"),
        "locks_held", (json_int_t)top_int(c, "locks_held"), "lock_waiters",
        (json_int_t)top_int(c, "lock_waiters"), "lock_wait_oldest_ms",
        (json_int_t)top_int(c, "lock_wait_oldest_ms"), "lock_contended_per_s",
        top_rate(p, c, "lock_contended", dt), "lock_lost_per_s",
        top_rate(p, c, "lock_lost", dt), "locks",
        top_rows(cur->locks, top_by_held, false), "hot",
        cur->hot != NULL ? json_incref(cur->hot) : json_array(), "journal",
        "pending", (json_int_t)top_int(c, "cache_invalidations_pending"),
        "bytes", (json_int_t)top_int(c, "journal_bytes"), "overdue_ms",
        (json_int_t)top_int(c, "cache_invalidations_overdue_ms"), "redis",
        "connected", (json_int_t)top_int(c, "redis_connected"), "rtt_us",
        (json_int_t)top_int(c, "redis_rtt_us"), "master",
        json_object_get(c, "redis_master"), "contended",
        top_rows(cur->locks, top_by_waiters, true));
}

static void
top_print_lists(const json_t *f)
{
    const json_t *e;
    size_t i;

    printf("\n%-40s %10s %-5s %5s\n", "LOCKS HELD LONGEST", "HELD_MS", "MODE",
           "COUNT");
    json_array_foreach(json_object_get(f, "locks"), i, e)
    {
        printf("%-40s %10lld %-5s %5lld\n",
               json_string_value(json_object_get(e, "key")),
               top_int(e, "held_ms"),
               json_string_value(json_object_get(e, "mode")),
               top_int(e, "count"));
    }
    printf("\n%-40s %10s %10s\n", "MOST CONTENDED", "WAITERS", "HELD_MS");
    json_array_foreach(json_object_get(f, "contended"), i, e)
    {
        printf("%-40s %10lld %10lld\n",
               json_string_value(json_object_get(e, "key")),
               top_int(e, "waiters"), top_int(e, "held_ms"));
    }
    printf("\n%-40s %10s %6s\n", "HOT KEYS", "READS/S", "HIT");
    json_array_foreach(json_object_get(f, "hot"), i, e)
    {
        printf("%-40s %10.1f %6.3f\n",
               json_string_value(json_object_get(e, "key")),
               json_number_value(json_object_get(e, "reads_per_s")),
               json_number_value(json_object_get(e, "hit_ratio")));
    }
}

static void
top_print_text(const json_t *f, bool tty)
{
    const json_t *redis = json_object_get(f, "redis");
    const json_t *journal = json_object_get(f, "journal");
    const char *op,
        *master = json_string_value(json_object_get(redis, "master"));
    json_t *v;

    printf("leased top  sessions %lld  requests %.1f/s%s\n",
           top_int(f, "sessions"),
           json_number_value(json_object_get(f, "requests_per_s")),
           tty ? "  (q quits)" : "");
    printf("redis    %s  connections %lld  rtt %lld us  %s\n",
           top_int(redis, "connected") > 0 ? "up" : "DOWN",
           top_int(redis, "connected"), top_int(redis, "rtt_us"),
           master != NULL ? master : "");
    printf("ops/s   ");
    json_object_foreach(json_object_get(f, "ops_per_s"), op, v)
    {
        printf(" %s %.1f", op, json_number_value(v));
    }
    printf("\nlocks    held %lld  waiters %lld  oldest wait %lld ms  "
           "contended %.1f/s  lost %.1f/s\n",
           top_int(f, "locks_held"), top_int(f, "lock_waiters"),
           top_int(f, "lock_wait_oldest_ms"),
           json_number_value(json_object_get(f, "lock_contended_per_s")),
           json_number_value(json_object_get(f, "lock_lost_per_s")));
    printf(
        "journal  pending %lld  bytes %lld  oldest delete overdue %lld ms\n",
        top_int(journal, "pending"), top_int(journal, "bytes"),
        top_int(journal, "overdue_ms"));
    top_print_lists(f);
}

/* Wait up to MS for the interval to pass; true when the user asked to
 * quit (q on the terminal) or a signal came. */
static bool
top_wait(bool tty, int ms)
{
    struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
    long long end = ctl_now_ms() + ms;

    while (!top_stop) {
        long long left = end - ctl_now_ms();
        char c;

        if (left <= 0) {
            return false;
        }
        if (poll(&pfd, tty ? 1 : 0, (int)left) > 0 &&
            read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) {
            return true;
        }
    }
    return true;
}

static int
top_run(struct ctl *ctl, bool once, bool tty)
{
    struct top_sample prev = {0}, cur = {0};
    int rc = top_sample(ctl, &prev);

    while (rc == 0 && !top_wait(tty, TOP_INTERVAL_MS)) {
        rc = top_sample(ctl, &cur);
        if (rc != 0) {
            break;
        }
        json_t *f = top_frame(&prev, &cur);

        if (f == NULL) {
            fprintf(stderr, CTL_NAME ": top: unexpected stats reply\n");
            rc = EX_PROTOCOL;
            break;
        }
        if (ctl->json) {
            ctl_print_json(f);
        } else {
            if (tty) {
                fputs("\033[H\033[2J", stdout);
            }
            top_print_text(f, tty);
            if (!tty && !once) {
                putchar('\n');
            }
        }
        json_decref(f);
        if (fflush(stdout) != 0) {
            rc = EX_IOERR;
        }
        top_sample_free(&prev);
        prev = cur;
        memset(&cur, 0, sizeof cur);
        if (once) {
            break;
        }
    }
    top_sample_free(&prev);
    top_sample_free(&cur);
    return rc;
}

int
cmd_top(struct ctl *ctl, int argc, char **argv)
{
    const char *once = NULL;
    const struct optdef defs[] = {
        {"once", '1', false, &once},
        {NULL, 0, false, NULL},
    };
    struct sigaction sa;
    struct termios saved, raw;
    int rc;

    rc = ctl_no_arg_cmd(ctl, argc, argv, defs);
    if (rc != 0) {
        return rc;
    }
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = top_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* Interactive only on a terminal, and then keys are read one by one
     * without echo; the terminal is given back as it was. */
    bool tty = once == NULL && !ctl->json && isatty(STDIN_FILENO) &&
               isatty(STDOUT_FILENO) && tcgetattr(STDIN_FILENO, &saved) == 0;
    if (tty) {
        raw = saved;
        raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
        raw.c_cc[VMIN] = 1;
        raw.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &raw);
    }
    rc = top_run(ctl, once != NULL, tty);
    if (tty) {
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    }
    return rc;
}
