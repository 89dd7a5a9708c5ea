/* leasectl: the command-line client of leased, on libleased.
 *
 *   leasectl [-s SOCKET | -H HOST:PORT] [--auth TOKEN] [--admin-token T]
 *            [--json] COMMAND ...
 *
 * Exit statuses follow sysexits.h so scripts can tell "the lock is taken"
 * (75, EX_TEMPFAIL) from "leased is not running" (69, EX_UNAVAILABLE) and
 * from the status of the command run under a lock; leasectl(1) lists
 * them.
 *
 * This file owns main and the command table, the connection (one per
 * run, closed by main) and the calls through it, and the commands that
 * are one request and one answer: ping, wait, stats, get, set,
 * invalidate, hot, info, locks, unlock and rate. It reads no option itself
 * (leasectl_args.c does), starts no process (leasectl_run.c) and never
 * touches the terminal's mode (leasectl_top.c). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "config.h"

#include "leasectl.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sysexits.h>
#include <time.h>

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

int
ctl_fail(const struct ctl *ctl, const struct leased_error *err)
{
    fprintf(stderr, CTL_NAME ": %s: %s: %s\n", ctl->cmd,
            leased_strerror(err->code), err->message);
    return exit_for(err->code);
}

int
ctl_open_conn(struct ctl *ctl)
{
    struct leased_options opt;
    struct leased_error err;

    leased_options_init(&opt);
    opt.client = CTL_NAME;
    opt.auth = ctl->auth;
    opt.timeout_ms = ctl->timeout_ms;
    ctl->conn = leased_connect(ctl->target, &opt, &err);
    if (ctl->conn == NULL) {
        return ctl_fail(ctl, &err);
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
            return ctl_fail(ctl, &err);
        }
    }
    return 0;
}

/* Print a reply as one JSON line (--json). */
void
ctl_print_json(json_t *rep)
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
int
ctl_call(struct ctl *ctl, json_t *req, long long wait_ms, json_t **rep,
         struct leased_error *err)
{
    int rc = leased_call_json(ctl->conn, req, wait_ms, rep, err);

    json_decref(req);
    if (ctl->json && *rep != NULL) {
        ctl_print_json(*rep);
    }
    return rc;
}

/* Does the daemon offer the optional part NAME (hello's features)? Asks
 * with a second hello the first time. */
bool
ctl_want_feature(struct ctl *ctl, const char *name)
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

int
ctl_no_feature(const struct ctl *ctl, const char *what)
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

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (npos != 1) {
        return ctl_usage_error(ctl->cmd, "wants one KEY%s", "");
    }
    return ctl_open_conn(ctl);
}

/* The options of a subcommand that takes no positional argument, then
 * the connection. */
int
ctl_no_arg_cmd(struct ctl *ctl, int argc, char **argv,
               const struct optdef *defs)
{
    char *pos[1];
    int npos, rc;

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 0, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    return ctl_open_conn(ctl);
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
        return ctl_fail(ctl, &err);
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

    rc = ctl_no_arg_cmd(ctl, argc, argv, NULL);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        json_t *rep = NULL;

        rc = ctl_call(ctl, json_pack("{s:s}", "op", "ping"), 0, &rep, &err);
        json_decref(rep);
        return rc == LEASED_OK ? ping_ready(ctl) : ctl_fail(ctl, &err);
    }
    if (leased_ping(ctl->conn, &err) != LEASED_OK) {
        return ctl_fail(ctl, &err);
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

long long
ctl_now_ms(void)
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

    rc = ctl_parse_args(ctl, argc, argv, NULL, pos, &npos, 0, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    long long total = ctl->timeout_ms > 0 ? ctl->timeout_ms : WAIT_DEFAULT_MS;
    long long deadline = ctl_now_ms() + total;
    for (;;) {
        long long left = deadline - ctl_now_ms();
        int one = left < WAIT_TRY_MS ? (int)(left > 0 ? left : 1)
                                     : WAIT_TRY_MS;

        rc = wait_once(ctl, one, why, sizeof why);
        if (rc == 0) {
            if (!ctl->quiet) {
                printf("ready\n");
            }
            return 0;
        }
        left = deadline - ctl_now_ms();
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

    rc = ctl_no_arg_cmd(ctl, argc, argv, defs);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        json_t *rep = NULL;

        rc = ctl_call(ctl, json_pack("{s:s}", "op", "stats"), 0, &rep, &err);
        json_decref(rep);
        return rc == LEASED_OK ? 0 : ctl_fail(ctl, &err);
    }
    if (as_json != NULL) {
        char *text;

        if (leased_stats_text(ctl->conn, &text, &err) != LEASED_OK) {
            return ctl_fail(ctl, &err);
        }
        printf("%s\n", text);
        leased_free(text);
    } else {
        json_t *st, *v;
        const char *k;

        if (leased_stats(ctl->conn, &st, &err) != LEASED_OK) {
            return ctl_fail(ctl, &err);
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

    rc = ctl_call(ctl,
                  json_pack("{s:s,s:s,s:b}", "op", "cache.get", "key", key,
                            "lease", 0),
                  0, &rep, &err);
    hit = json_is_true(json_object_get(rep, "hit"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return ctl_fail(ctl, &err);
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
        return ctl_fail(ctl, &err);
    }
    if (!res.hit) {
        leased_cache_result_free(&res);
        return 1;
    }
    print_value(&res, as_json != NULL);
    leased_cache_result_free(&res);
    return fflush(stdout) == 0 ? 0 : EX_IOERR;
}

/* cache.set with --json; VALUE NULL stores "not found". */
static int
set_json(struct ctl *ctl, const char *key, const char *value, long long ttl_ms)
{
    json_t *req = json_pack("{s:s,s:s,s:o}", "op", "cache.set", "key", key,
                            "value",
                            value == NULL ? json_null() : json_string(value));
    json_t *rep = NULL;
    struct leased_error err;
    int rc;

    if (req == NULL) {
        return ctl_usage_error(ctl->cmd, "VALUE must be UTF-8%s", "");
    }
    if (ttl_ms > 0) {
        json_object_set_new(req, "ttl_ms", json_integer(ttl_ms));
    }
    rc = ctl_call(ctl, req, 0, &rep, &err);
    json_decref(rep);
    return rc == LEASED_OK ? 0 : ctl_fail(ctl, &err);
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

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 2, false, NULL,
                        NULL);
    if (rc == 0) {
        rc = ctl_opt_ms(ctl, "ttl", ttl, 1, &ttl_ms);
    }
    if (rc != 0) {
        return rc;
    }
    if (npos != (null != NULL ? 1 : 2)) {
        return ctl_usage_error(ctl->cmd, "wants KEY VALUE, or KEY --null%s",
                               "");
    }
    rc = ctl_open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    if (ctl->json) {
        return set_json(ctl, pos[0], null != NULL ? NULL : pos[1], ttl_ms);
    }
    if (leased_cache_set(ctl->conn, pos[0], null != NULL ? NULL : pos[1],
                         (size_t)-1, ttl_ms, &err) != LEASED_OK) {
        return ctl_fail(ctl, &err);
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
    rc = ctl_call(ctl, req, 0, &rep, &err);
    json_decref(rep);
    return rc == LEASED_OK ? 0 : ctl_fail(ctl, &err);
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
        return ctl_fail(ctl, &err);
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
    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, argc, false, NULL,
                        NULL);
    if (rc == 0) {
        rc = ctl_opt_ms(ctl, "delay", delay, 0, &delay_ms);
    }
    if (rc == 0 && npos < 1) {
        rc = ctl_usage_error(ctl->cmd, "wants at least one KEY%s", "");
    }
    if (rc == 0) {
        rc = ctl_open_conn(ctl);
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

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 0, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (limit != NULL && !ctl_parse_num(limit, 1, 10000, &n)) {
        return ctl_usage_error(ctl->cmd, "bad --limit '%s'", limit);
    }
    rc = ctl_open_conn(ctl);
    if (rc != 0) {
        return rc;
    }
    req = n > 0 ? json_pack("{s:s,s:I}", "op", "cache.hot", "limit",
                            (json_int_t)n)
                : json_pack("{s:s}", "op", "cache.hot");
    rc = ctl_call(ctl, req, 0, &reply, &err);
    if (rc != LEASED_OK) {
        json_decref(reply);
        return ctl_fail(ctl, &err);
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
    rc = ctl_call(ctl, req, 0, &rep, &err);
    locked = json_is_true(json_object_get(rep, "locked"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return ctl_fail(ctl, &err);
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
        return ctl_fail(ctl, &err);
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

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (limit != NULL && !ctl_parse_num(limit, 1, 100000, &lim)) {
        return ctl_usage_error(ctl->cmd, "bad --limit '%s' (1..100000)",
                               limit);
    }
    rc = ctl_open_conn(ctl);
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
    rc = ctl_call(ctl, req, 0, &rep, &err);
    if (rc != LEASED_OK) {
        json_decref(rep);
        return ctl_fail(ctl, &err);
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
        return ctl_usage_error(ctl->cmd,
                               "frees a lock whoever holds it: say --force%s",
                               "");
    }
    rc = ctl_call(ctl,
                  json_pack("{s:s,s:s}", "op", "lock.force_unlock", "key",
                            pos[0]),
                  0, &rep, &err);
    released = json_is_true(json_object_get(rep, "released"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return ctl_fail(ctl, &err);
    }
    if (!ctl->json) {
        printf("%s %s\n", pos[0], released ? "released" : "was not locked");
    }
    return released ? 0 : 1;
}

/* --- rate --------------------------------------------------------------- */

/* One rate.acquire decision. Refused is leasectl's "not acquired" (75 or
 * --conflict-exit), as for lock and sem: a script that runs a job only
 * within the rate treats both alike. */
/* rate's options, and what they say once checked. */
struct rate_opts {
    const char *rate, *per, *burst, *permits, *wait, *conflict;
    long long rate_n, per_ms;
    struct leased_rate_args args;
};

/* The bounds are the daemon's (leased-protocol(7)): a value past them is a
 * usage error here, before any connection. */
static int
rate_check(struct ctl *ctl, struct rate_opts *o)
{
    long long unused;
    int rc;

    if (o->rate == NULL || !ctl_parse_num(o->rate, 1, 1000000, &o->rate_n)) {
        return ctl_usage_error(ctl->cmd, "wants --rate N (1..1000000)%s", "");
    }
    if (o->per == NULL) {
        return ctl_usage_error(ctl->cmd, "wants --per T (up to 1 day)%s", "");
    }
    rc = ctl_opt_ms(ctl, "per", o->per, 1, &o->per_ms);
    if (rc == 0 && o->per_ms > 86400000) {
        rc = ctl_usage_error(ctl->cmd, "bad --per '%s' (up to 1 day)", o->per);
    }
    if (rc == 0 && o->burst != NULL &&
        !ctl_parse_num(o->burst, 1, 1000000, &o->args.burst)) {
        rc = ctl_usage_error(ctl->cmd, "bad --burst '%s' (1..1000000)",
                             o->burst);
    }
    if (rc == 0 && o->permits != NULL &&
        !ctl_parse_num(o->permits, 1, 1000000, &o->args.permits)) {
        rc = ctl_usage_error(ctl->cmd, "bad --permits '%s' (1..1000000)",
                             o->permits);
    }
    if (rc == 0) {
        rc = ctl_opt_ms(ctl, "wait", o->wait, 0, &o->args.wait_ms);
    }
    if (rc == 0) {
        rc = ctl_opt_exits(ctl, NULL, o->conflict, &unused);
    }
    return rc;
}

/* With --json: rate.acquire as sent, the daemon's answer printed as it
 * came. */
static int
rate_json(struct ctl *ctl, const char *key, const struct rate_opts *o)
{
    json_t *req = json_pack("{s:s,s:s,s:I,s:I}", "op", "rate.acquire", "key",
                            key, "rate", (json_int_t)o->rate_n, "per_ms",
                            (json_int_t)o->per_ms);
    json_t *rep = NULL;
    struct leased_error err;
    bool acquired;
    int rc;

    if (o->args.burst != 0) {
        json_object_set_new(req, "burst", json_integer(o->args.burst));
    }
    if (o->args.permits != 0) {
        json_object_set_new(req, "permits", json_integer(o->args.permits));
    }
    if (o->args.wait_ms != 0) {
        json_object_set_new(req, "wait_ms", json_integer(o->args.wait_ms));
    }
    rc = ctl_call(ctl, req, o->args.wait_ms, &rep, &err);
    acquired = json_is_true(json_object_get(rep, "acquired"));
    json_decref(rep);
    if (rc != LEASED_OK) {
        return ctl_fail(ctl, &err);
    }
    return acquired ? 0 : ctl->conflict_exit;
}

/* Without --json: "acquired" or "refused", and the wait the daemon
 * advises before the next try. */
static int
rate_plain(struct ctl *ctl, const char *key, const struct rate_opts *o)
{
    struct leased_rate_result res;
    struct leased_error err;

    if (leased_rate_acquire(ctl->conn, key, o->rate_n, o->per_ms, &o->args,
                            &res, &err) != LEASED_OK) {
        return ctl_fail(ctl, &err);
    }
    if (!ctl->quiet) {
        printf("%s retry_after_ms=%lld\n",
               res.acquired ? "acquired" : "refused", res.retry_after_ms);
    }
    if (fflush(stdout) != 0) {
        return EX_IOERR;
    }
    return res.acquired ? 0 : ctl->conflict_exit;
}

static int
cmd_rate(struct ctl *ctl, int argc, char **argv)
{
    struct rate_opts o = {0};
    const struct optdef defs[] = {
        {"rate", 0, true, &o.rate},
        {"per", 0, true, &o.per},
        {"burst", 0, true, &o.burst},
        {"permits", 'n', true, &o.permits},
        {"wait", 'w', true, &o.wait},
        {"conflict-exit", 'E', true, &o.conflict},
        {NULL, 0, false, NULL},
    };
    char *pos[1];
    int npos, rc;

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (npos != 1) {
        return ctl_usage_error(ctl->cmd,
                               "wants KEY --rate N --per T [--burst B] "
                               "[--permits P] [--wait T]%s",
                               "");
    }
    rc = rate_check(ctl, &o);
    if (rc == 0) {
        rc = ctl_open_conn(ctl);
    }
    if (rc != 0) {
        return rc;
    }
    if (!ctl_want_feature(ctl, "rate")) {
        return ctl_no_feature(ctl, "the rate limiter (feature rate)");
    }
    return ctl->json ? rate_json(ctl, pos[0], &o)
                     : rate_plain(ctl, pos[0], &o);
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
    {"wait", cmd_wait},   {"cache", cmd_cache},
    {"rate", cmd_rate},   {"bloom", cmd_bloom},
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
            rc = ctl_parse_args(ctl, i - 1, argv + 1, none, pos, &npos, 0,
                                false, NULL, NULL);
            if (rc != 0) {
                return rc;
            }
            rc = commands[k].fn(ctl, argc - i - 1, argv + i + 1);
            leased_close(ctl->conn);
            json_decref(ctl->features);
            return rc;
        }
    }
    return ctl_usage_error(NULL, "unknown command '%s'", argv[i]);
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
            ctl_usage(stdout);
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
        return ctl_usage_error(NULL, "no command%s", "");
    }
    return run_command(&ctl, argc, argv, i);
}
