/* leasectl: the command-line client of leased, on libleased.
 *
 *   leasectl [-s SOCKET | -H HOST:PORT] [--auth TOKEN] [--admin-token T]
 *            [--json] COMMAND ...
 *
 * Exit statuses follow sysexits.h so scripts can tell "the lock is taken"
 * (75, EX_TEMPFAIL) from "leased is not running" (69, EX_UNAVAILABLE) and
 * from the status of the command run under a lock; leasectl(1) lists
 * them. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "config.h"

#include "leased/client.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>

#include <jansson.h>

#define CTL_NAME "leasectl"

/* The options every command accepts, and the connection they describe. */
struct ctl {
    const char *target; /* -s / -H / $LEASED_SOCKET / default */
    const char *auth;   /* --auth / $LEASED_AUTH */
    const char *admin;  /* --admin-token / $LEASED_ADMIN_TOKEN */
    int timeout_ms;     /* --timeout */
    bool quiet;
    int conflict_exit; /* lock, sem: not acquired (--conflict-exit) */
    bool json;         /* --json: print the daemon's answers as they are */
    json_t *features;  /* hello's "features", once asked (want_feature) */
    const char *cmd;   /* the command's name, for messages */
    struct leased_conn *conn;
};

/* One option of a command. VAL receives the argument (or "1" for a
 * flag). */
struct optdef {
    const char *name; /* long name, without "--" */
    char short_name;  /* 0: none */
    bool has_arg;
    const char **val;
};

static void
usage(FILE *f)
{
    fprintf(
        f,
        "usage: " CTL_NAME " [options] COMMAND [ARGS]\n"
        "\n"
        "commands:\n"
        "  ping                          check that leased is ready (exit 0)\n"
        "  wait [--timeout T]            wait until leased is ready (default\n"
        "                                30s in all)\n"
        "  stats [--json]                the daemon's figures\n"
        "  lock KEY [--ttl T] [--wait T] [--owner S] [--lost-exit N]\n"
        "       [--conflict-exit N] [-q] -- CMD [ARGS...]\n"
        "                                run CMD while holding KEY\n"
        "  get KEY [--json]              print a cached value (exit 1: miss)\n"
        "  set KEY VALUE [--ttl T]       store a value (--null: not found)\n"
        "  invalidate KEY... [--delay T]  delete cached keys\n"
        "  info KEY [--owner S] [--token T]  is KEY locked (exit 1: no)\n"
        "  lock KEY --read | --write ... -- CMD  the sides of a read-write "
        "lock\n"
        "  sem KEY --limit N [--ttl T] [--wait T] -- CMD [ARGS...]\n"
        "                                run CMD holding one of N permits\n"
        "  locks [PREFIX] [--limit N]    locks held through this daemon\n"
        "  unlock --force KEY            free KEY whoever holds it (exit 1:\n"
        "                                it was not locked)\n"
        "  hot [--limit N] [--json]      the most read cache keys\n"
        "  top [-1] [--json]             a live view, every second (q quits)\n"
        "\n"
        "T is a duration: 500ms, 60s, 2m, 1h; a bare number is milliseconds\n"
        "(flock -w counts seconds). lock and sem try once without --wait\n"
        "and exit 75 (or --conflict-exit N) when they do not acquire.\n"
        "\n"
        "options:\n"
        "  -s, --socket PATH   the daemon's Unix socket (default: "
        "$LEASED_SOCKET,\n"
        "                      else " LEASED_DEFAULT_SOCKET ")\n"
        "  -H, --host H:P      the daemon's TCP address instead\n"
        "      --auth TOKEN    the listener's auth token (or $LEASED_AUTH)\n"
        "      --admin-token T listen.admin_token, for locks and unlock over\n"
        "                      TCP (or $LEASED_ADMIN_TOKEN)\n"
        "      --json          print the daemon's answers as JSON lines\n"
        "  -t, --timeout T     how long to wait for a reply (default %d ms)\n"
        "  -q, --quiet         no message when a lock is not acquired\n"
        "  -h, --help          this text\n"
        "  -V, --version       the version\n"
        "\nSee leasectl(1).\n",
        LEASED_DEFAULT_TIMEOUT_MS);
}

static int
usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, CTL_NAME ": ");
    if (cmd != NULL) {
        fprintf(stderr, "%s: ", cmd);
    }
    fprintf(stderr, fmt, arg != NULL ? arg : "");
    fprintf(stderr, "\nTry '" CTL_NAME " --help'.\n");
    return EX_USAGE;
}

/* The exit status for a libleased error. */
static int
exit_for(int code)
{
    switch (code) {
    case LEASED_E_CONNECT:
    case LEASED_E_IO:
    /* Not 75: that says the lock is held elsewhere, and a script that
     * retries on it would retry against a Redis that is down. */
    case LEASED_E_REDIS_UNAVAILABLE:
        return EX_UNAVAILABLE;
    case LEASED_E_TIMEOUT:
    case LEASED_E_BUSY:
    case LEASED_E_SHUTTING_DOWN:
        return EX_TEMPFAIL;
    case LEASED_E_UNAUTHORIZED:
        return EX_NOPERM;
    case LEASED_E_BAD_REQUEST:
    case LEASED_E_TOO_LARGE:
    case LEASED_E_WRONG_TYPE:
    case LEASED_E_INVALID:
        return EX_DATAERR;
    case LEASED_E_UNKNOWN_OP:
    case LEASED_E_PROTOCOL:
        return EX_PROTOCOL;
    case LEASED_E_NOMEM:
        return EX_OSERR;
    default:
        return EX_SOFTWARE;
    }
}

static int
fail(const struct ctl *ctl, const struct leased_error *err)
{
    fprintf(stderr, CTL_NAME ": %s: %s: %s\n", ctl->cmd,
            leased_strerror(err->code), err->message);
    return exit_for(err->code);
}

/* A whole decimal number in [MIN, MAX]. */
static bool
parse_num(const char *s, long long min, long long max, long long *out)
{
    char *end;
    long long v;

    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) {
        return false;
    }
    *out = v;
    return true;
}

/* A duration in [MIN, MAX] milliseconds: a whole number with a unit (ms,
 * s, m, h), or a bare number of milliseconds, the daemon's unit. flock(1)'s
 * -w counts seconds; leasectl(1) says so. A negative value (-1: no limit)
 * takes no unit. */
static bool
parse_duration_ms(const char *s, long long min, long long max, long long *out)
{
    static const struct {
        const char *unit;
        long long ms;
    } units[] = {
        {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    char *end;
    long long v;

    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || (*end != '\0' && v < 0)) {
        return false;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0) {
            if (v > max / units[i].ms) {
                return false;
            }
            v *= units[i].ms;
            if (v < min || v > max) {
                return false;
            }
            *out = v;
            return true;
        }
    }
    return false;
}

/* The options every command accepts, as parse_args reads them (each
 * NULL when absent). */
struct global_opts {
    const char *help;
    const char *sock;
    const char *host;
    const char *timeout;
    const char *quiet;
    const char *json;
};

/* The option of DEFS, else of GLOBALS, that A ("--name", "--name=value"
 * or "-x") names, or NULL; *EQ gets the value after '=', if any. */
static const struct optdef *
find_opt(const struct optdef *defs, const struct optdef *globals,
         const char *a, const char **eq)
{
    *eq = NULL;
    for (int set = 0; set < 2; set++) {
        const struct optdef *d = set != 0 ? globals : defs;

        for (; d != NULL && d->name != NULL; d++) {
            if (a[1] == '-') {
                size_t n = strlen(d->name);

                if (strncmp(a + 2, d->name, n) == 0 &&
                    (a[2 + n] == '\0' || (a[2 + n] == '=' && d->has_arg))) {
                    *eq = a[2 + n] == '=' ? a + 3 + n : NULL;
                    return d;
                }
            } else if (d->short_name != '\0' && a[1] == d->short_name &&
                       a[2] == '\0') {
                return d;
            }
        }
    }
    return NULL;
}

/* Store the value of the option ARGV[*I] names in DEFS or GLOBALS: "1"
 * for a flag, the text after '=', or the next word (then *I moves on to
 * it). */
static int
take_opt(const struct ctl *ctl, const struct optdef *defs,
         const struct optdef *globals, int argc, char **argv, int *i)
{
    const char *eq;
    const struct optdef *d = find_opt(defs, globals, argv[*i], &eq);

    if (d == NULL) {
        return usage_error(ctl->cmd, "unknown option '%s'", argv[*i]);
    }
    if (!d->has_arg) {
        *d->val = "1";
    } else if (eq != NULL) {
        *d->val = eq;
    } else if (*i + 1 < argc) {
        *i += 1;
        *d->val = argv[*i];
    } else {
        return usage_error(ctl->cmd, "option '%s' needs a value", argv[*i]);
    }
    return 0;
}

/* A positional argument A into POS (*NPOS of MAXPOS taken). */
static int
take_pos(const struct ctl *ctl, char *a, char **pos, int *npos, int maxpos)
{
    if (*npos >= maxpos) {
        return usage_error(ctl->cmd, "unexpected argument '%s'", a);
    }
    pos[(*npos)++] = a;
    return 0;
}

/* The words from ARGV[I] on: the command to run into *REST when REST is
 * asked for, else more positional arguments (those after "--"). */
static int
take_rest(const struct ctl *ctl, int argc, char **argv, int i, char **pos,
          int *npos, int maxpos, char ***rest, int *nrest)
{
    if (rest != NULL) {
        *rest = argv + i;
        *nrest = argc - i;
        return 0;
    }
    for (; i < argc; i++) {
        int rc = take_pos(ctl, argv[i], pos, npos, maxpos);

        if (rc != 0) {
            return rc;
        }
    }
    return 0;
}

/* The global options G into the ctl (--help prints the usage and exits). */
static int
apply_globals(struct ctl *ctl, const struct global_opts *g)
{
    if (g->help != NULL) {
        usage(stdout);
        exit(0);
    }
    if (g->sock != NULL && g->host != NULL) {
        return usage_error(ctl->cmd, "-s and -H exclude each other%s", "");
    }
    if (g->sock != NULL) {
        ctl->target = g->sock;
    } else if (g->host != NULL) {
        if (strchr(g->host, ':') == NULL) {
            return usage_error(ctl->cmd, "-H wants HOST:PORT, not '%s'",
                               g->host);
        }
        ctl->target = g->host;
    }
    if (g->timeout != NULL) {
        long long v;

        if (!parse_duration_ms(g->timeout, 1, 86400000, &v)) {
            return usage_error(ctl->cmd, "bad --timeout '%s'", g->timeout);
        }
        ctl->timeout_ms = (int)v;
    }
    if (g->quiet != NULL) {
        ctl->quiet = true;
    }
    if (g->json != NULL) {
        ctl->json = true;
    }
    return 0;
}

/* Parse ARGV (after the command name) for the options of DEFS plus the
 * global ones. Positional arguments are collected in POS (*NPOS); with
 * STOP_AT_SECOND (lock) everything from "--" or from the second
 * positional argument on is left as *REST. Returns 0 or EX_USAGE. */
static int
parse_args(struct ctl *ctl, int argc, char **argv, const struct optdef *defs,
           char **pos, int *npos, int maxpos, bool stop_at_second,
           char ***rest, int *nrest)
{
    struct global_opts g = {0};
    const struct optdef globals[] = {
        {"help", 'h', false, &g.help},
        {"socket", 's', true, &g.sock},
        {"host", 'H', true, &g.host},
        {"auth", 0, true, &ctl->auth},
        {"admin-token", 0, true, &ctl->admin},
        {"timeout", 't', true, &g.timeout},
        {"quiet", 'q', false, &g.quiet},
        {"json", 0, false, &g.json},
        {NULL, 0, false, NULL},
    };
    int i, rc;

    *npos = 0;
    if (rest != NULL) {
        *rest = NULL;
        *nrest = 0;
    }
    for (i = 0; i < argc; i++) {
        const char *a = argv[i];

        if (strcmp(a, "--") == 0) {
            i++;
            break;
        }
        if (a[0] != '-' || a[1] == '\0') {
            if (stop_at_second && *npos == 1) {
                break;
            }
            rc = take_pos(ctl, argv[i], pos, npos, maxpos);
        } else {
            rc = take_opt(ctl, defs, globals, argc, argv, &i);
        }
        if (rc != 0) {
            return rc;
        }
    }
    rc = take_rest(ctl, argc, argv, i, pos, npos, maxpos, rest, nrest);
    if (rc != 0) {
        return rc;
    }
    return apply_globals(ctl, &g);
}

/* A duration option (see parse_duration_ms): absent leaves *OUT alone. */
static int
opt_ms(const struct ctl *ctl, const char *name, const char *s, long long min,
       long long *out)
{
    if (s != NULL && !parse_duration_ms(s, min, 86400000LL * 365, out)) {
        char msg[128];

        snprintf(msg, sizeof msg,
                 "bad --%s '%%s' (milliseconds, or a number with ms, s, m "
                 "or h)",
                 name);
        return usage_error(ctl->cmd, msg, s);
    }
    return 0;
}

/* --lost-exit into *LOST_EXIT and --conflict-exit into the ctl, each
 * 0..255 (absent: keep the defaults). */
static int
opt_exits(struct ctl *ctl, const char *lost, const char *conflict,
          long long *lost_exit)
{
    long long v;

    if (lost != NULL && !parse_num(lost, 0, 255, lost_exit)) {
        return usage_error(ctl->cmd, "bad --lost-exit '%s' (0..255)", lost);
    }
    if (conflict != NULL) {
        if (!parse_num(conflict, 0, 255, &v)) {
            return usage_error(ctl->cmd, "bad --conflict-exit '%s' (0..255)",
                               conflict);
        }
        ctl->conflict_exit = (int)v;
    }
    return 0;
}

static int
open_conn(struct ctl *ctl)
{
    struct leased_options opt;
    struct leased_error err;

    leased_options_init(&opt);
    opt.client = CTL_NAME;
    opt.auth = ctl->auth;
    opt.timeout_ms = ctl->timeout_ms;
    ctl->conn = leased_connect(ctl->target, &opt, &err);
    if (ctl->conn == NULL) {
        return fail(ctl, &err);
    }
    if (ctl->admin != NULL) {
        /* A second hello: the first one (the library's) authenticated,
         * this one asks for the operator identity. */
        json_t *req = json_pack("{s:s,s:s,s:s}", "op", "hello", "client",
                                CTL_NAME, "admin_token", ctl->admin);
        json_t *rep = NULL;
        int rc = leased_call_json(ctl->conn, req, 0, &rep, &err);

        json_decref(req);
        if (rc == LEASED_OK) {
            ctl->features = json_incref(json_object_get(rep, "features"));
        }
        json_decref(rep);
        if (rc != LEASED_OK) {
            return fail(ctl, &err);
        }
    }
    return 0;
}

/* Print a reply as one JSON line (--json). */
static void
print_json(json_t *rep)
{
    char *s = json_dumps(rep, JSON_COMPACT | JSON_PRESERVE_ORDER);

    if (s != NULL) {
        printf("%s\n", s);
        free(s);
    }
}

/* Send REQ (stolen) and return the daemon's reply in *REP (a new
 * reference, also for an error reply; NULL when none came). With --json
 * every reply that came is printed as it is. WAIT_MS as for
 * leased_call_json. */
static int
call(struct ctl *ctl, json_t *req, long long wait_ms, json_t **rep,
     struct leased_error *err)
{
    int rc = leased_call_json(ctl->conn, req, wait_ms, rep, err);

    json_decref(req);
    if (ctl->json && *rep != NULL) {
        print_json(*rep);
    }
    return rc;
}

/* Does the daemon offer the optional part NAME (hello's features)? Asks
 * with a second hello the first time. */
static bool
want_feature(struct ctl *ctl, const char *name)
{
    size_t i;
    json_t *v;

    if (ctl->features == NULL) {
        struct leased_error err;
        json_t *rep = NULL;
        json_t *req = json_pack("{s:s,s:s}", "op", "hello", "client",
                                CTL_NAME);

        if (leased_call_json(ctl->conn, req, 0, &rep, &err) == LEASED_OK) {
            ctl->features = json_incref(json_object_get(rep, "features"));
        }
        json_decref(req);
        json_decref(rep);
    }
    json_array_foreach(ctl->features, i, v)
    {
        if (json_is_string(v) && strcmp(json_string_value(v), name) == 0) {
            return true;
        }
    }
    return false;
}

static int
no_feature(const struct ctl *ctl, const char *what)
{
    fprintf(stderr, CTL_NAME ": %s: this leased does not offer %s\n", ctl->cmd,
            what);
    return EX_UNAVAILABLE;
}

/* The options of a subcommand that takes exactly one KEY (into POS[0]),
 * then the connection. */
static int
one_key_cmd(struct ctl *ctl, int argc, char **argv, const struct optdef *defs,
            char **pos)
{
    int npos, rc;

    rc = parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL, NULL);
    if (rc != 0) {
        return rc;
    }
    if (npos != 1) {
        return usage_error(ctl->cmd, "wants one KEY%s", "");
    }
    return open_conn(ctl);
}

/* The options of a subcommand that takes no positional argument, then
 * the connection. */
static int
no_arg_cmd(struct ctl *ctl, int argc, char **argv, const struct optdef *defs)
{
    char *pos[1];
    int npos, rc;

    rc = parse_args(ctl, argc, argv, defs, pos, &npos, 0, false, NULL, NULL);
    if (rc != 0) {
        return rc;
    }
    return open_conn(ctl);
}

/* --- ping, stats -------------------------------------------------------- */

/* Ready as the contract's /readyz means it: Redis reachable, the journal
 * writable, no shutdown under way. The stats op tells it (ping's reply is
 * fixed by the contract); a daemon whose stats lack "ready" predates the
 * check and counts as ready. */
static int
ping_ready(struct ctl *ctl)
{
    struct leased_error err;
    const char *why;
    json_t *st;
    int rc;

    if (leased_stats(ctl->conn, &st, &err) != LEASED_OK) {
        return fail(ctl, &err);
    }
    why = json_string_value(json_object_get(st, "not_ready"));
    if (json_is_false(json_object_get(st, "ready"))) {
        rc = why != NULL && strcmp(why, "redis_unavailable") == 0
                 ? EX_UNAVAILABLE
                 : EX_TEMPFAIL;
        fprintf(stderr, CTL_NAME ": ping: not ready: %s\n",
                why != NULL ? why : "unknown");
        json_decref(st);
        return rc;
    }
    json_decref(st);
    return 0;
}

static int
cmd_ping(struct ctl *ctl, int argc, char **argv)
{
    struct leased_error err;
    int rc;

    rc = no_arg_cmd(ctl, argc, argv, NULL);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        json_t *rep = NULL;

        rc = call(ctl, json_pack("{s:s}", "op", "ping"), 0, &rep, &err);
        json_decref(rep);
        return rc == LEASED_OK ? ping_ready(ctl) : fail(ctl, &err);
    }
    if (leased_ping(ctl->conn, &err) != LEASED_OK) {
        return fail(ctl, &err);
    }
    rc = ping_ready(ctl);
    if (rc != 0) {
        return rc;
    }
    printf("pong\n");
    return 0;
}

/* --- wait --------------------------------------------------------------- */

#define WAIT_DEFAULT_MS 30000
#define WAIT_POLL_MS 100
/* One look's bound: a daemon whose loop hangs is asked again. */
#define WAIT_TRY_MS 2000

static long long
mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One look: 0 when the daemon answers and is ready; otherwise the exit
 * status ping would give, with the reason in WHY. */
static int
wait_once(struct ctl *ctl, int timeout_ms, char *why, size_t whylen)
{
    struct leased_options opt;
    struct leased_error err;
    struct leased_conn *conn;
    json_t *st = NULL;
    int rc = 0;

    leased_options_init(&opt);
    opt.client = CTL_NAME;
    opt.auth = ctl->auth;
    opt.timeout_ms = timeout_ms;
    conn = leased_connect(ctl->target, &opt, &err);
    if (conn == NULL || leased_stats(conn, &st, &err) != LEASED_OK) {
        snprintf(why, whylen, "%s: %s", leased_strerror(err.code),
                 err.message);
        leased_close(conn);
        return exit_for(err.code);
    }
    if (json_is_false(json_object_get(st, "ready"))) {
        const char *r = json_string_value(json_object_get(st, "not_ready"));

        snprintf(why, whylen, "not ready: %s", r != NULL ? r : "unknown");
        rc = r != NULL && strcmp(r, "redis_unavailable") == 0 ? EX_UNAVAILABLE
                                                              : EX_TEMPFAIL;
    }
    json_decref(st);
    leased_close(conn);
    return rc;
}

/* Start-up ordering: poll until the daemon is ready, as ping judges it,
 * or --timeout (here the whole wait) passes. */
static int
cmd_wait(struct ctl *ctl, int argc, char **argv)
{
    char *pos[1], why[320] = "";
    int npos, rc;

    rc = parse_args(ctl, argc, argv, NULL, pos, &npos, 0, false, NULL, NULL);
    if (rc != 0) {
        return rc;
    }
    long long total = ctl->timeout_ms > 0 ? ctl->timeout_ms : WAIT_DEFAULT_MS;
    long long deadline = mono_ms() + total;
    for (;;) {
        long long left = deadline - mono_ms();
        int one = left < WAIT_TRY_MS ? (int)(left > 0 ? left : 1)
                                     : WAIT_TRY_MS;

        rc = wait_once(ctl, one, why, sizeof why);
        if (rc == 0) {
            if (!ctl->quiet) {
                printf("ready\n");
            }
            return 0;
        }
        left = deadline - mono_ms();
        if (left <= 0) {
            break;
        }
        poll(NULL, 0, left < WAIT_POLL_MS ? (int)left : WAIT_POLL_MS);
    }
    fprintf(stderr, CTL_NAME ": wait: not ready after %lld ms: %s\n", total,
            why);
    return rc;
}

static void
print_stat(const char *prefix, const char *name, json_t *v)
{
    char full[256];

    snprintf(full, sizeof full, "%s%s%s", prefix, *prefix != '\0' ? "." : "",
             name);
    if (json_is_object(v)) {
        const char *k;
        json_t *sub;

        json_object_foreach(v, k, sub)
        {
            print_stat(full, k, sub);
        }
        return;
    }
    printf("%-36s ", full);
    if (json_is_integer(v)) {
        printf("%lld\n", (long long)json_integer_value(v));
    } else if (json_is_real(v)) {
        printf("%.3f\n", json_real_value(v));
    } else if (json_is_string(v)) {
        printf("%s\n", json_string_value(v));
    } else if (json_is_boolean(v)) {
        printf("%s\n", json_is_true(v) ? "true" : "false");
    } else {
        char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

        printf("%s\n", s != NULL ? s : "-");
        free(s);
    }
}

static int
cmd_stats(struct ctl *ctl, int argc, char **argv)
{
    const char *as_json = NULL;
    const struct optdef defs[] = {
        {"json", 'j', false, &as_json},
        {NULL, 0, false, NULL},
    };
    struct leased_error err;
    int rc;

    rc = no_arg_cmd(ctl, argc, argv, defs);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        json_t *rep = NULL;

        rc = call(ctl, json_pack("{s:s}", "op", "stats"), 0, &rep, &err);
        json_decref(rep);
        return rc == LEASED_OK ? 0 : fail(ctl, &err);
    }
    if (as_json != NULL) {
        char *text;

        if (leased_stats_text(ctl->conn, &text, &err) != LEASED_OK) {
            return fail(ctl, &err);
        }
        printf("%s\n", text);
        leased_free(text);
    } else {
        json_t *st, *v;
        const char *k;

        if (leased_stats(ctl->conn, &st, &err) != LEASED_OK) {
            return fail(ctl, &err);
        }
        json_object_foreach(st, k, v)
        {
            print_stat("", k, v);
        }
        json_decref(st);
    }
    return 0;
}

/* --- cache -------------------------------------------------------------- */

/* cache.get with --json: the daemon's answer is printed as it is. */
static int
get_json(struct ctl *ctl, const char *key)
{
    struct leased_error err;
    json_t *rep = NULL;
    bool hit;
    int rc;

    rc = call(ctl,
              json_pack("{s:s,s:s,s:b}", "op", "cache.get", "key", key,
                        "lease", 0),
              0, &rep, &err);
    hit = json_is_true(json_object_get(rep, "hit"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return fail(ctl, &err);
    }
    return hit ? 0 : 1;
}

/* A hit's value: as it is, or as a JSON value (AS_JSON). */
static void
print_value(const struct leased_cache_result *res, bool as_json)
{
    if (as_json) {
        json_t *v = res->is_null ? json_null()
                                 : json_stringn(res->value, res->value_len);
        char *s = v != NULL ? json_dumps(v, JSON_ENCODE_ANY) : NULL;

        printf("%s\n", s != NULL ? s : "null");
        free(s);
        json_decref(v);
    } else if (!res->is_null) {
        fwrite(res->value, 1, res->value_len, stdout);
        putchar('\n');
    }
}

static int
cmd_get(struct ctl *ctl, int argc, char **argv)
{
    const char *as_json = NULL;
    const struct optdef defs[] = {
        {"json", 'j', false, &as_json},
        {NULL, 0, false, NULL},
    };
    struct leased_cache_result res;
    struct leased_error err;
    char *pos[1];
    int rc;

    rc = one_key_cmd(ctl, argc, argv, defs, pos);
    if (rc != 0) {
        return rc;
    }
    /* A plain read: a command-line user will not fill the key, so taking
     * a fill lease would only make other readers wait for nothing. */
    if (ctl->json) {
        return get_json(ctl, pos[0]);
    }
    if (leased_cache_get(ctl->conn, pos[0], LEASED_UNSET, false, &res, &err) !=
        LEASED_OK) {
        return fail(ctl, &err);
    }
    if (!res.hit) {
        leased_cache_result_free(&res);
        return 1;
    }
    print_value(&res, as_json != NULL);
    leased_cache_result_free(&res);
    return fflush(stdout) == 0 ? 0 : EX_IOERR;
}

static int
cmd_set(struct ctl *ctl, int argc, char **argv)
{
    const char *ttl = NULL, *null = NULL;
    const struct optdef defs[] = {
        {"ttl", 0, true, &ttl},
        {"null", 0, false, &null},
        {NULL, 0, false, NULL},
    };
    struct leased_error err;
    long long ttl_ms = 0;
    char *pos[2];
    int npos, rc;

    rc = parse_args(ctl, argc, argv, defs, pos, &npos, 2, false, NULL, NULL);
    if (rc == 0) {
        rc = opt_ms(ctl, "ttl", ttl, 1, &ttl_ms);
    }
    if (rc != 0) {
        return rc;
    }
    if (npos != (null != NULL ? 1 : 2)) {
        return usage_error(ctl->cmd, "wants KEY VALUE, or KEY --null%s", "");
    }
    rc = open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        json_t *req = json_pack("{s:s,s:s,s:o}", "op", "cache.set", "key",
                                pos[0], "value",
                                null != NULL ? json_null()
                                             : json_string(pos[1]));
        json_t *rep = NULL;

        if (req == NULL) {
            return usage_error(ctl->cmd, "VALUE must be UTF-8%s", "");
        }
        if (ttl_ms > 0) {
            json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
        }
        rc = call(ctl, req, 0, &rep, &err);
        json_decref(rep);
        return rc == LEASED_OK ? 0 : fail(ctl, &err);
    }
    if (leased_cache_set(ctl->conn, pos[0], null != NULL ? NULL : pos[1],
                         (size_t)-1, ttl_ms, &err) != LEASED_OK) {
        return fail(ctl, &err);
    }
    return 0;
}

/* cache.invalidate of the NPOS keys POS with --json. */
static int
invalidate_json(struct ctl *ctl, char **pos, int npos, long long delay_ms)
{
    struct leased_error err;
    json_t *keys = json_array(), *rep = NULL, *req;
    int rc;

    for (int k = 0; k < npos; k++) {
        json_array_append_new(keys, json_string(pos[k]));
    }
    req = json_pack("{s:s,s:o}", "op", "cache.invalidate", "keys", keys);
    if (delay_ms != LEASED_UNSET) {
        json_object_set_new(req, "delay_ms", json_integer(delay_ms));
    }
    rc = call(ctl, req, 0, &rep, &err);
    json_decref(rep);
    return rc == LEASED_OK ? 0 : fail(ctl, &err);
}

/* cache.invalidate of the NPOS keys POS, and what it did as one line. */
static int
invalidate_plain(struct ctl *ctl, char **pos, int npos, long long delay_ms)
{
    struct leased_invalidate_result res;
    struct leased_error err;

    if (leased_cache_invalidate(ctl->conn, (const char *const *)pos,
                                (size_t)npos, delay_ms, &res,
                                &err) != LEASED_OK) {
        return fail(ctl, &err);
    }
    printf("deleted=%lld pending=%lld%s\n", res.deleted, res.pending,
           res.queued ? " queued=true" : "");
    if (res.queued && !ctl->quiet) {
        fprintf(stderr,
                CTL_NAME ": %s: Redis is unavailable; the "
                         "invalidation is journaled and will be retried\n",
                ctl->cmd);
    }
    return 0;
}

static int
cmd_invalidate(struct ctl *ctl, int argc, char **argv)
{
    const char *delay = NULL;
    const struct optdef defs[] = {
        {"delay", 0, true, &delay},
        {NULL, 0, false, NULL},
    };
    long long delay_ms = LEASED_UNSET;
    char **pos;
    int npos, rc;

    pos = calloc((size_t)argc + 1, sizeof *pos);
    if (pos == NULL) {
        fprintf(stderr, CTL_NAME ": out of memory\n");
        return EX_OSERR;
    }
    rc = parse_args(ctl, argc, argv, defs, pos, &npos, argc, false, NULL,
                    NULL);
    if (rc == 0) {
        rc = opt_ms(ctl, "delay", delay, 0, &delay_ms);
    }
    if (rc == 0 && npos < 1) {
        rc = usage_error(ctl->cmd, "wants at least one KEY%s", "");
    }
    if (rc == 0) {
        rc = open_conn(ctl);
    }
    if (rc == 0) {
        rc = ctl->json ? invalidate_json(ctl, pos, npos, delay_ms)
                       : invalidate_plain(ctl, pos, npos, delay_ms);
    }
    free(pos);
    return rc;
}

/* cache.hot's KEYS: as one JSON array (AS_JSON), or a line each. */
static void
print_hot(const json_t *keys, bool as_json)
{
    size_t i;
    json_t *k;

    if (as_json) {
        char *text = json_dumps(keys, JSON_COMPACT | JSON_ENCODE_ANY);

        printf("%s\n", text != NULL ? text : "[]");
        free(text);
        return;
    }
    json_array_foreach(keys, i, k)
    {
        json_t *key = json_object_get(k, "key");

        printf("%.1f\t%.3f\t",
               json_number_value(json_object_get(k, "reads_per_s")),
               json_number_value(json_object_get(k, "hit_ratio")));
        fwrite(json_string_value(key), 1, json_string_length(key), stdout);
        putchar('\n');
    }
}

/* The most read keys of the daemon (cache.hot): reads per second, hit
 * ratio and key, tab-separated, most read first (the key last, as it may
 * hold spaces). */
static int
cmd_hot(struct ctl *ctl, int argc, char **argv)
{
    const char *as_json = NULL, *limit = NULL;
    const struct optdef defs[] = {
        {"json", 'j', false, &as_json},
        {"limit", 'n', true, &limit},
        {NULL, 0, false, NULL},
    };
    struct leased_error err;
    long long n = 0;
    char *pos[1];
    int npos, rc;
    json_t *req, *reply = NULL;

    rc = parse_args(ctl, argc, argv, defs, pos, &npos, 0, false, NULL, NULL);
    if (rc != 0) {
        return rc;
    }
    if (limit != NULL && !parse_num(limit, 1, 10000, &n)) {
        return usage_error(ctl->cmd, "bad --limit '%s'", limit);
    }
    rc = open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    req = n > 0 ? json_pack("{s:s,s:I}", "op", "cache.hot", "limit",
                            (json_int_t)n)
                : json_pack("{s:s}", "op", "cache.hot");
    rc = call(ctl, req, 0, &reply, &err);
    if (rc != LEASED_OK) {
        json_decref(reply);
        return fail(ctl, &err);
    }
    /* With --json the answer was printed as it is. */
    if (!ctl->json) {
        print_hot(json_object_get(reply, "keys"), as_json != NULL);
    }
    json_decref(reply);
    return fflush(stdout) == 0 ? 0 : EX_IOERR;
}

/* --- locks -------------------------------------------------------------- */

/* lock.info with --json: exit 0 when KEY is locked. */
static int
info_json(struct ctl *ctl, const char *key, const char *owner,
          const char *token)
{
    json_t *req = json_pack("{s:s,s:s}", "op", "lock.info", "key", key);
    json_t *rep = NULL;
    struct leased_error err;
    bool locked;
    int rc;

    if (owner != NULL) {
        json_object_set_new(req, "owner", json_string(owner));
    }
    if (token != NULL) {
        json_object_set_new(req, "token", json_string(token));
    }
    rc = call(ctl, req, 0, &rep, &err);
    locked = json_is_true(json_object_get(rep, "locked"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return fail(ctl, &err);
    }
    return locked ? 0 : 1;
}

static int
cmd_info(struct ctl *ctl, int argc, char **argv)
{
    const char *owner = NULL, *token = NULL;
    const struct optdef defs[] = {
        {"owner", 0, true, &owner},
        {"token", 0, true, &token},
        {NULL, 0, false, NULL},
    };
    struct leased_lock_info info;
    struct leased_error err;
    char *pos[1];
    int rc;

    rc = one_key_cmd(ctl, argc, argv, defs, pos);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        return info_json(ctl, pos[0], owner, token);
    }
    if (leased_lock_info(ctl->conn, pos[0], owner, token, &info, &err) !=
        LEASED_OK) {
        return fail(ctl, &err);
    }
    printf("locked %s\n", info.locked ? "yes" : "no");
    if (info.locked) {
        printf("ttl_ms %lld\n", info.ttl_ms);
        if (owner != NULL || token != NULL) {
            printf("mine %s\n", info.mine ? "yes" : "no");
            if (info.mine && info.count >= 0) {
                printf("count %lld\n", info.count);
            }
        }
    }
    return info.locked ? 0 : 1;
}

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

        if (call(ctl, release, 0, &rep, &err) != LEASED_OK &&
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

    if (call(ctl, req, wait_ms, &rep, &err) != LEASED_OK) {
        json_decref(rep);
        json_decref(release);
        return fail(ctl, &err);
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
    int rc = parse_args(ctl, argc, argv, defs, o->pos, &o->npos, 1, true,
                        &o->cmd, &o->ncmd);

    if (rc == 0) {
        rc = opt_ms(ctl, "ttl", o->ttl, 1, &o->ttl_ms);
    }
    if (rc == 0) {
        rc = opt_ms(ctl, "wait", o->wait, -1, &o->wait_ms);
    }
    if (rc == 0) {
        rc = opt_exits(ctl, o->lost, o->conflict, &o->lost_exit);
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
    if (mode != NULL && !want_feature(ctl, "rwlock")) {
        return no_feature(ctl, "read-write locks (feature rwlock)");
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
        return fail(ctl, &err);
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

static int
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
        return usage_error(ctl->cmd, "wants KEY -- CMD [ARGS...]%s", "");
    }
    if (o.ncmd < 1) {
        return usage_error(ctl->cmd, "no command to run after KEY%s", "");
    }
    if (rd != NULL && wr != NULL) {
        return usage_error(ctl->cmd, "--read and --write exclude each other%s",
                           "");
    }
    rc = open_conn(ctl);
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

static int
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
    if (limit == NULL || !parse_num(limit, 1, 1000000, &lim)) {
        return usage_error(ctl->cmd, "wants --limit N (1..1000000)%s", "");
    }
    if (o.npos != 1) {
        return usage_error(ctl->cmd, "wants KEY --limit N -- CMD [ARGS...]%s",
                           "");
    }
    if (o.ncmd < 1) {
        return usage_error(ctl->cmd, "no command to run after KEY%s", "");
    }
    rc = open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    if (!want_feature(ctl, "semaphore")) {
        return no_feature(ctl, "semaphores (feature semaphore)");
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

/* --- operators ------------------------------------------------------------ */

/* lock.list's answer as a table. */
static void
print_locks(const struct ctl *ctl, const json_t *rep)
{
    const json_t *e;
    size_t i;

    printf("%-32s %-5s %5s %10s %10s %-28s %s\n", "KEY", "MODE", "COUNT",
           "TTL_MS", "HELD_MS", "SESSION", "CLIENT");
    json_array_foreach(json_object_get(rep, "locks"), i, e)
    {
        const char *sess = json_string_value(json_object_get(e, "session"));
        const char *client = json_string_value(json_object_get(e, "client"));

        printf("%-32s %-5s %5lld %10lld %10lld %-28s %s\n",
               json_string_value(json_object_get(e, "key")),
               json_string_value(json_object_get(e, "mode")),
               (long long)json_integer_value(json_object_get(e, "count")),
               (long long)json_integer_value(json_object_get(e, "ttl_ms")),
               (long long)json_integer_value(json_object_get(e, "held_ms")),
               sess != NULL ? sess : "-",
               client != NULL && *client != '\0' ? client : "-");
    }
    if (json_is_true(json_object_get(rep, "truncated")) && !ctl->quiet) {
        fprintf(stderr, CTL_NAME ": locks: more locks than shown "
                                 "(--limit)\n");
    }
}

static int
cmd_locks(struct ctl *ctl, int argc, char **argv)
{
    const char *limit = NULL;
    const struct optdef defs[] = {
        {"limit", 'n', true, &limit},
        {NULL, 0, false, NULL},
    };
    struct leased_error err;
    long long lim = 0;
    json_t *req, *rep = NULL;
    char *pos[1];
    int npos, rc;

    rc = parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL, NULL);
    if (rc != 0) {
        return rc;
    }
    if (limit != NULL && !parse_num(limit, 1, 100000, &lim)) {
        return usage_error(ctl->cmd, "bad --limit '%s' (1..100000)", limit);
    }
    rc = open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    req = json_pack("{s:s}", "op", "lock.list");
    if (npos == 1) {
        json_object_set_new(req, "prefix", json_string(pos[0]));
    }
    if (lim > 0) {
        json_object_set_new(req, "limit", json_integer(lim));
    }
    rc = call(ctl, req, 0, &rep, &err);
    if (rc != LEASED_OK) {
        json_decref(rep);
        return fail(ctl, &err);
    }
    if (!ctl->json) {
        print_locks(ctl, rep);
    }
    json_decref(rep);
    return fflush(stdout) == 0 ? 0 : EX_IOERR;
}

static int
cmd_unlock(struct ctl *ctl, int argc, char **argv)
{
    const char *force = NULL;
    const struct optdef defs[] = {
        {"force", 'f', false, &force},
        {NULL, 0, false, NULL},
    };
    struct leased_error err;
    json_t *rep = NULL;
    char *pos[1];
    bool released;
    int rc;

    rc = one_key_cmd(ctl, argc, argv, defs, pos);
    if (rc != 0) {
        return rc;
    }
    /* An unlock of someone else's lock is only ever the operator's
     * decision, so it is spelled out. */
    if (force == NULL) {
        return usage_error(ctl->cmd,
                           "frees a lock whoever holds it: say --force%s", "");
    }
    rc = call(ctl,
              json_pack("{s:s,s:s}", "op", "lock.force_unlock", "key", pos[0]),
              0, &rep, &err);
    released = json_is_true(json_object_get(rep, "released"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return fail(ctl, &err);
    }
    if (!ctl->json) {
        printf("%s %s\n", pos[0], released ? "released" : "was not locked");
    }
    return released ? 0 : 1;
}

/* ------------------------------------------------------------------------ */

/* --- top ---------------------------------------------------------------- */

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

static long long
top_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
        *rc = fail(ctl, &err);
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
    s->at_ms = top_now_ms();
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

/* The TOP_ROWS locks held longest, from lock.list's answer. */
static json_t *
top_longest(const json_t *locks)
{
    size_t n = json_array_size(locks), i;
    json_t **v = calloc(n != 0 ? n : 1, sizeof *v);
    json_t *out = json_array();

    if (v == NULL) {
        return out;
    }
    for (i = 0; i < n; i++) {
        v[i] = json_array_get(locks, i);
    }
    qsort(v, n, sizeof *v, top_by_held);
    for (i = 0; i < n && i < TOP_ROWS; i++) {
        json_array_append_new(
            out, json_pack("{s:O?,s:O?,s:I,s:I,s:I}", "key",
                           json_object_get(v[i], "key"), "mode",
                           json_object_get(v[i], "mode"), "count",
                           (json_int_t)top_int(v[i], "count"), "held_ms",
                           (json_int_t)top_int(v[i], "held_ms"), "ttl_ms",
                           (json_int_t)top_int(v[i], "ttl_ms")));
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
        "s:{s:I,s:I,s:O?}}",
        "interval_ms", (json_int_t)(cur->at_ms - prev->at_ms),
        "requests_per_s", top_rate(p, c, "requests", dt), "ops_per_s",
        top_ops(p, c, dt), "sessions", (json_int_t)top_int(c, "sessions"),
        "locks_held", (json_int_t)top_int(c, "locks_held"), "lock_waiters",
        (json_int_t)top_int(c, "lock_waiters"), "lock_wait_oldest_ms",
        (json_int_t)top_int(c, "lock_wait_oldest_ms"), "lock_contended_per_s",
        top_rate(p, c, "lock_contended", dt), "lock_lost_per_s",
        top_rate(p, c, "lock_lost", dt), "locks", top_longest(cur->locks),
        "hot", cur->hot != NULL ? json_incref(cur->hot) : json_array(),
        "journal", "pending",
        (json_int_t)top_int(c, "cache_invalidations_pending"), "bytes",
        (json_int_t)top_int(c, "journal_bytes"), "overdue_ms",
        (json_int_t)top_int(c, "cache_invalidations_overdue_ms"), "redis",
        "connected", (json_int_t)top_int(c, "redis_connected"), "rtt_us",
        (json_int_t)top_int(c, "redis_rtt_us"), "master",
        json_object_get(c, "redis_master"));
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
    long long end = top_now_ms() + ms;

    while (!top_stop) {
        long long left = end - top_now_ms();
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
            print_json(f);
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

static int
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

    rc = no_arg_cmd(ctl, argc, argv, defs);
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

/* Is A a global option that takes the next word as its value? */
static bool
takes_value(const char *a)
{
    static const char *const with_value[] = {
        "-s",     "--socket",      "-H", "--host",
        "--auth", "--admin-token", "-t", "--timeout",
    };

    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++) {
        if (strcmp(a, with_value[k]) == 0) {
            return true;
        }
    }
    return false;
}

static const struct {
    const char *name;
    int (*fn)(struct ctl *ctl, int argc, char **argv);
} commands[] = {
    {"ping", cmd_ping},   {"stats", cmd_stats},
    {"lock", cmd_lock},   {"get", cmd_get},
    {"set", cmd_set},     {"invalidate", cmd_invalidate},
    {"info", cmd_info},   {"sem", cmd_sem},
    {"locks", cmd_locks}, {"unlock", cmd_unlock},
    {"hot", cmd_hot},     {"top", cmd_top},
    {"wait", cmd_wait},
};

/* The environment variable NAME, or NULL when it is unset or empty. */
static const char *
env_value(const char *name)
{
    const char *v = getenv(name);

    return v != NULL && *v != '\0' ? v : NULL;
}

/* Run the command ARGV[I] with the global options before it (ARGV[1] up
 * to it) and its own arguments after it. */
static int
run_command(struct ctl *ctl, int argc, char **argv, int i)
{
    for (size_t k = 0; k < sizeof commands / sizeof commands[0]; k++) {
        if (strcmp(argv[i], commands[k].name) == 0) {
            const struct optdef none[] = {{NULL, 0, false, NULL}};
            char *pos[1];
            int npos, rc;

            ctl->cmd = commands[k].name;
            rc = parse_args(ctl, i - 1, argv + 1, none, pos, &npos, 0, false,
                            NULL, NULL);
            if (rc != 0) {
                return rc;
            }
            rc = commands[k].fn(ctl, argc - i - 1, argv + i + 1);
            leased_close(ctl->conn);
            json_decref(ctl->features);
            return rc;
        }
    }
    return usage_error(NULL, "unknown command '%s'", argv[i]);
}

int
main(int argc, char **argv)
{
    struct ctl ctl;
    int i;

    memset(&ctl, 0, sizeof ctl);
    ctl.conflict_exit = EX_TEMPFAIL;
    ctl.auth = env_value("LEASED_AUTH");
    ctl.admin = env_value("LEASED_ADMIN_TOKEN");
    /* Find the command: the first word that is neither an option nor the
     * value of one. The options before it are parsed like those after. */
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];

        if (a[0] != '-' || a[1] == '\0') {
            break;
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            printf(CTL_NAME " " PACKAGE_VERSION " (protocol %d)\n",
                   LEASED_PROTOCOL_VERSION);
            return 0;
        }
        if (takes_value(a) && i + 1 < argc) {
            i++;
        }
    }
    if (i >= argc) {
        return usage_error(NULL, "no command%s", "");
    }
    return run_command(&ctl, argc, argv, i);
}
