/* leasectl's command line: the usage text, the options of every command
 * (a table of struct optdef each, plus the global ones) into struct ctl,
 * and whole numbers and durations. Parsing only: nothing here opens a
 * connection or sends a request, and a bad word is EX_USAGE with a
 * message that names it. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "config.h"

#include "leasectl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>

/* The commands, as leasectl(1) lists them. */
static void
usage_commands(FILE *f)
{
    fputs(
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
        "  cache load FILE [--batch N] [--batch-bytes B]\n"
        "                                store the JSON lines of FILE (- for\n"
        "                                stdin) with cache.mset (exit 1: "
        "some\n"
        "                                failed)\n"
        "  bloom create FILTER --capacity N --error-rate E\n"
        "                                make a Bloom filter\n"
        "  bloom add FILTER FILE         add the keys of FILE (- for stdin),\n"
        "                                one a line, in batches\n"
        "  bloom check FILTER KEY...     print maybe or no per key (exit 1:\n"
        "                                some key is certainly not there)\n"
        "  info KEY [--owner S] [--token T]  is KEY locked (exit 1: no)\n"
        "  lock KEY --read | --write ... -- CMD  the sides of a read-write "
        "lock\n"
        "  sem KEY --limit N [--ttl T] [--wait T] -- CMD [ARGS...]\n"
        "                                run CMD holding one of N permits\n"
        "  rate KEY --rate N --per T [--burst B] [--permits P] [--wait T]\n"
        "                                take permits of a rate limiter\n"
        "                                (exit 75 or --conflict-exit N: "
        "refused)\n"
        "  locks [PREFIX] [--limit N]    locks held through this daemon\n"
        "  unlock --force KEY            free KEY whoever holds it (exit 1:\n"
        "                                it was not locked)\n"
        "  hot [--limit N] [--json]      the most read cache keys\n"
        "  top [-1] [--json]             a live view, every second (q quits)\n"
        "\n"
        "T is a duration: 500ms, 60s, 2m, 1h; a bare number is milliseconds\n"
        "(flock -w counts seconds). lock and sem try once without --wait\n"
        "and exit 75 (or --conflict-exit N) when they do not acquire.\n"
        "\n",
        f);
}

/* The options, with their defaults. */
static void
usage_options(FILE *f)
{
    fprintf(
        f,
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
        "  -q, --quiet         no message when a lock is not acquired (nor\n"
        "                      rate's answer, bloom create's and\n"
        "                      add's counts)\n"
        "  -h, --help          this text\n"
        "  -V, --version       the version\n"
        "\nSee leasectl(1).\n",
        LEASED_DEFAULT_TIMEOUT_MS);
}

void
ctl_usage(FILE *f)
{
    usage_commands(f);
    usage_options(f);
}

int
ctl_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, CTL_NAME ": ");
    if (cmd != NULL) {
        fprintf(stderr, "%s: ", cmd);
    }
    fprintf(stderr, fmt, arg != NULL ? arg : "");
    fprintf(stderr, "\nTry '" CTL_NAME " --help'.\n");
    return EX_USAGE;
}

/* The decimal number S starts with into *V, *END just after it; false
 * when S is empty or the number does not fit. */
static bool
leading_num(const char *s, long long *v, char **end)
{
    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    *v = strtoll(s, end, 10);
    return errno == 0;
}

/* A whole decimal number in [MIN, MAX]. */
bool
ctl_parse_num(const char *s, long long min, long long max, long long *out)
{
    char *end;
    long long v;

    if (!leading_num(s, &v, &end) || *end != '\0' || v < min || v > max) {
        return false;
    }
    *out = v;
    return true;
}

int
ctl_batch_opts(const struct ctl *ctl, const char *batch, const char *bytes,
               long long max, struct ctl_batch *out)
{
    char range[48];

    out->items = max;
    out->bytes = CTL_BATCH_BYTES_DEFAULT;
    if (batch != NULL && !ctl_parse_num(batch, 1, max, &out->items)) {
        snprintf(range, sizeof range, "bad --batch '%%s' (1..%lld)", max);
        return ctl_usage_error(ctl->cmd, range, batch);
    }
    if (bytes != NULL && !ctl_parse_num(bytes, 1, 1LL << 30, &out->bytes)) {
        return ctl_usage_error(ctl->cmd, "bad --batch-bytes '%s'", bytes);
    }
    return 0;
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

    if (!leading_num(s, &v, &end) || end == s || (*end != '\0' && v < 0)) {
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
        return ctl_usage_error(ctl->cmd, "unknown option '%s'", argv[*i]);
    }
    if (!d->has_arg) {
        *d->val = "1";
    } else if (eq != NULL) {
        *d->val = eq;
    } else if (*i + 1 < argc) {
        *i += 1;
        *d->val = argv[*i];
    } else {
        return ctl_usage_error(ctl->cmd, "option '%s' needs a value",
                               argv[*i]);
    }
    return 0;
}

/* A positional argument A into POS (*NPOS of MAXPOS taken). */
static int
take_pos(const struct ctl *ctl, char *a, char **pos, int *npos, int maxpos)
{
    if (*npos >= maxpos) {
        return ctl_usage_error(ctl->cmd, "unexpected argument '%s'", a);
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
        ctl_usage(stdout);
        exit(0);
    }
    if (g->sock != NULL && g->host != NULL) {
        return ctl_usage_error(ctl->cmd, "-s and -H exclude each other%s", "");
    }
    if (g->sock != NULL) {
        ctl->target = g->sock;
    } else if (g->host != NULL) {
        if (strchr(g->host, ':') == NULL) {
            return ctl_usage_error(ctl->cmd, "-H wants HOST:PORT, not '%s'",
                                   g->host);
        }
        ctl->target = g->host;
    }
    if (g->timeout != NULL) {
        long long v;

        if (!parse_duration_ms(g->timeout, 1, 86400000, &v)) {
            return ctl_usage_error(ctl->cmd, "bad --timeout '%s'", g->timeout);
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
int
ctl_parse_args(struct ctl *ctl, int argc, char **argv,
               const struct optdef *defs, char **pos, int *npos, int maxpos,
               bool stop_at_second, char ***rest, int *nrest)
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
int
ctl_opt_ms(const struct ctl *ctl, const char *name, const char *s,
           long long min, long long *out)
{
    if (s != NULL && !parse_duration_ms(s, min, 86400000LL * 365, out)) {
        char msg[128];

        snprintf(msg, sizeof msg,
                 "bad --%s '%%s' (milliseconds, or a number with ms, s, m "
                 "or h)",
                 name);
        return ctl_usage_error(ctl->cmd, msg, s);
    }
    return 0;
}

/* --lost-exit into *LOST_EXIT and --conflict-exit into the ctl, each
 * 0..255 (absent: keep the defaults). */
int
ctl_opt_exits(struct ctl *ctl, const char *lost, const char *conflict,
              long long *lost_exit)
{
    long long v;

    if (lost != NULL && !ctl_parse_num(lost, 0, 255, lost_exit)) {
        return ctl_usage_error(ctl->cmd, "bad --lost-exit '%s' (0..255)",
                               lost);
    }
    if (conflict != NULL) {
        if (!ctl_parse_num(conflict, 0, 255, &v)) {
            return ctl_usage_error(ctl->cmd,
                                   "bad --conflict-exit '%s' (0..255)",
                                   conflict);
        }
        ctl->conflict_exit = (int)v;
    }
    return 0;
}
