/* The conformance runner of libleased (clients/conformance/README.md):
 * carries out the scenario files of argv with the library's calls and
 * prints one line per scenario. Run by check_conformance, which serves
 * $LEASED_CONTROL. libleased has one call per op of the protocol and no
 * cached()/update(): the runner composes them from cache.get, fill,
 * release and invalidate, as an application on libleased would. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <leased/client.h>

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_NAMED 32
#define NAME_LEN 64

struct client {
    char name[NAME_LEN];
    struct leased_conn *c;
};

/* A held lock, read or write side, group or semaphore grant; or a lock
 * sent in the background (pending), which becomes held when granted. */
struct held {
    char name[NAME_LEN];
    struct client *cl;
    json_t *req; /* the lock or sem step */
    char token[LEASED_TOKEN_MAX];
    char lost[32]; /* reason once lost, else "" */
    int risky;     /* keys at risk: lock_at_risk less lock_safe */
    bool pending;
    uint64_t id;
    long long t0_ms;
};

static struct {
    struct client clients[MAX_NAMED];
    int nclients;
    struct held helds[MAX_NAMED];
    int nhelds;
    json_t *saved; /* name -> result */
    char why[1024];
} S;

static long long
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool
fail(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(S.why, sizeof S.why, fmt, ap);
    va_end(ap);
    return false;
}

static const char *
str(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static long long
num(const json_t *o, const char *k, long long dflt)
{
    json_t *v = json_object_get(o, k);

    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

static json_t *
err_result(int code)
{
    return json_pack("{s:s}", "error", leased_strerror(code));
}

static struct client *
client_of(const json_t *step)
{
    const char *n = str(step, "client");

    for (int i = 0; n && i < S.nclients; i++) {
        if (strcmp(S.clients[i].name, n) == 0) {
            return &S.clients[i];
        }
    }
    return NULL;
}

static struct held *
held_of(const char *n)
{
    for (int i = 0; n && i < S.nhelds; i++) {
        if (strcmp(S.helds[i].name, n) == 0) {
            return &S.helds[i];
        }
    }
    return NULL;
}

static struct held *
held_new(const char *name, struct client *cl, const json_t *step)
{
    struct held *h;

    if (!name || S.nhelds == MAX_NAMED) {
        return NULL;
    }
    h = &S.helds[S.nhelds++];
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "%s", name);
    h->cl = cl;
    h->req = json_deep_copy(step);
    return h;
}

static void
reset(void)
{
    for (int i = 0; i < S.nclients; i++) {
        leased_close(S.clients[i].c);
    }
    for (int i = 0; i < S.nhelds; i++) {
        json_decref(S.helds[i].req);
    }
    S.nclients = S.nhelds = 0;
    json_object_clear(S.saved);
}

/* --- the control channel ------------------------------------------------ */

static json_t *
control(const json_t *step)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const char *path = getenv("LEASED_CONTROL");
    char *line = json_dumps(step, JSON_COMPACT), buf[4096];
    size_t used = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    json_t *reply = NULL;

    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path ? path : "");
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        write(fd, line, strlen(line)) >= 0 && write(fd, "\n", 1) == 1) {
        ssize_t n;

        while (used < sizeof buf - 1 &&
               (n = read(fd, buf + used, sizeof buf - 1 - used)) > 0) {
            used += (size_t)n;
        }
        buf[used] = '\0';
        reply = json_loads(buf, JSON_DISABLE_EOF_CHECK, NULL);
    }
    if (fd >= 0) {
        close(fd);
    }
    free(line);
    return reply;
}

static json_t *
do_env(const json_t *step)
{
    json_t *r = control(step);

    if (!r) {
        return json_pack("{s:s}", "error", "control channel");
    }
    if (!json_is_true(json_object_get(r, "ok"))) {
        json_t *e = json_pack("{s:s}", "error",
                              str(r, "error") ? str(r, "error") : "?");

        json_decref(r);
        return e;
    }
    return r;
}

/* --- locks ------------------------------------------------------------------ */

static json_t *
lock_result(const struct leased_lock_result *lr)
{
    if (!lr->acquired) {
        return json_pack("{s:b}", "acquired", 0);
    }
    return json_pack("{s:b,s:s,s:I,s:I}", "acquired", 1, "token", lr->token,
                     "count", (json_int_t)lr->count, "fence",
                     (json_int_t)lr->fence);
}

static void
lock_args(const json_t *step, struct leased_lock_args *a)
{
    memset(a, 0, sizeof *a);
    a->owner = str(step, "owner");
    a->mode = str(step, "mode");
    a->wait_ms = num(step, "wait_ms", 0);
    a->ttl_ms = num(step, "ttl_ms", 0);
}

static size_t
keys_of(const json_t *arr, const char **keys, size_t max)
{
    size_t n = 0;

    for (; n < json_array_size(arr) && n < max; n++) {
        keys[n] = json_string_value(json_array_get(arr, n));
    }
    return n;
}

/* A waiting lock in the background: sent now, its reply read by await. */
static json_t *
lock_background(struct client *cl, const json_t *step)
{
    json_t *req = json_pack("{s:s,s:s,s:I}", "op", "lock", "key",
                            str(step, "key"), "wait_ms",
                            (json_int_t)num(step, "wait_ms", 0));
    struct held *h = held_new(str(step, "as"), cl, step);
    struct leased_error e;
    int rc;

    if (!h) {
        json_decref(req);
        return json_pack("{s:s}", "error", "background lock needs as");
    }
    h->pending = true;
    h->t0_ms = now_ms();
    rc = leased_send(cl->c, req, &h->id, &e);
    json_decref(req);
    return rc == LEASED_OK ? json_object() : err_result(rc);
}

static json_t *
do_lock(struct client *cl, const json_t *step)
{
    struct leased_lock_args a;
    struct leased_lock_result lr;
    struct leased_error e;
    json_t *keys = json_object_get(step, "keys");
    int rc;

    if (json_is_true(json_object_get(step, "background"))) {
        return lock_background(cl, step);
    }
    lock_args(step, &a);
    if (json_is_array(keys)) {
        const char *k[64];

        rc = leased_lock_keys(cl->c, k, keys_of(keys, k, 64), &a, &lr, NULL,
                              &e);
    } else {
        rc = leased_lock(cl->c, str(step, "key"), &a, &lr, &e);
    }
    if (rc != LEASED_OK) {
        return err_result(rc);
    }
    if (lr.acquired) {
        struct held *h = held_new(str(step, "as"), cl, step);

        if (h) {
            snprintf(h->token, sizeof h->token, "%s", lr.token);
        }
    }
    return lock_result(&lr);
}

static json_t *
do_sem(struct client *cl, const json_t *step)
{
    struct leased_sem_args a = {0};
    struct leased_sem_result sr;
    struct leased_error e;
    int rc;

    a.permits = num(step, "permits", 1);
    a.wait_ms = num(step, "wait_ms", 0);
    rc = leased_sem_acquire(cl->c, str(step, "key"), num(step, "limit", 1), &a,
                            &sr, &e);
    if (rc != LEASED_OK) {
        return err_result(rc);
    }
    if (!sr.acquired) {
        return json_pack("{s:b}", "acquired", 0);
    }
    struct held *h = held_new(str(step, "as"), cl, step);

    if (h) {
        snprintf(h->token, sizeof h->token, "%s", sr.token);
    }
    return json_pack("{s:b,s:s}", "acquired", 1, "token", sr.token);
}

static json_t *
do_unlock(struct held *h)
{
    const json_t *q = h->req;
    json_t *keys = json_object_get(q, "keys");
    const char *owner = str(q, "owner");
    const char *token = owner ? NULL : h->token;
    struct leased_error e;
    int rc;

    if (strcmp(str(q, "do"), "sem") == 0) {
        rc = leased_sem_release(h->cl->c, str(q, "key"), h->token, NULL, &e);
    } else if (json_is_array(keys)) {
        const char *k[64];

        rc = leased_unlock_keys(h->cl->c, k, keys_of(keys, k, 64), owner,
                                token, NULL, &e);
    } else {
        rc = leased_unlock_mode(h->cl->c, str(q, "key"), str(q, "mode"), owner,
                                token, NULL, &e);
    }
    return rc == LEASED_OK ? json_object() : err_result(rc);
}

static json_t *
do_await(struct held *h)
{
    struct leased_lock_result lr = {0};
    json_t *reply = NULL, *r;
    struct leased_error e;
    int rc = leased_wait_reply(h->cl->c, h->id, 60000, &reply, &e);

    if (rc != LEASED_OK) {
        json_decref(reply);
        return err_result(rc);
    }
    lr.acquired = json_is_true(json_object_get(reply, "acquired"));
    if (lr.acquired) {
        snprintf(lr.token, sizeof lr.token, "%s", str(reply, "token"));
        snprintf(h->token, sizeof h->token, "%s", lr.token);
        lr.count = num(reply, "count", 0);
        lr.fence = num(reply, "fence", 0);
    }
    json_decref(reply);
    h->pending = false;
    r = lock_result(&lr);
    json_object_set_new(r, "elapsed_ms", json_integer(now_ms() - h->t0_ms));
    return r;
}

static json_t *
do_cancel(struct held *h)
{
    struct leased_error e;
    int rc = leased_cancel(h->cl->c, h->id, NULL, &e);

    return rc == LEASED_OK ? json_object() : err_result(rc);
}

/* Mark every held lock of CL that EV names lost, at risk or safe. */
static void
note_event(struct client *cl, const struct leased_event *ev)
{
    bool lost = ev->type == LEASED_EV_LOCK_LOST ||
                ev->type == LEASED_EV_SEM_LOST;
    int risk = ev->type == LEASED_EV_LOCK_AT_RISK ||
                       ev->type == LEASED_EV_SEM_AT_RISK
                   ? 1
               : ev->type == LEASED_EV_LOCK_SAFE ||
                       ev->type == LEASED_EV_SEM_SAFE
                   ? -1
                   : 0;

    for (int i = 0; i < S.nhelds; i++) {
        struct held *h = &S.helds[i];

        if (h->cl != cl || !ev->token || strcmp(h->token, ev->token) != 0 ||
            h->lost[0]) {
            continue;
        }
        if (lost) {
            snprintf(h->lost, sizeof h->lost, "%s",
                     ev->reason ? ev->reason : "?");
        }
        h->risky += risk;
    }
}

enum until { UNTIL_LOST, UNTIL_AT_RISK, UNTIL_SAFE };

static bool
reached(const struct held *h, enum until u)
{
    switch (u) {
    case UNTIL_LOST:
        return h->lost[0] != '\0';
    case UNTIL_AT_RISK:
        return h->risky > 0;
    default:
        return h->risky == 0;
    }
}

/* Read H's client's events until U holds, for up to WITHIN_MS. */
static bool
wait_events(struct held *h, enum until u, long long within_ms)
{
    long long deadline = now_ms() + within_ms;

    while (!reached(h, u)) {
        struct leased_event ev = {0};
        struct leased_error e;
        long long left = deadline - now_ms();
        int rc;

        if (left <= 0 || (u != UNTIL_LOST && h->lost[0])) {
            return false;
        }
        rc = leased_next_event(h->cl->c, (int)left, &ev, &e);
        if (rc == LEASED_E_IO) {
            /* The session ended: its session-bound locks with it. */
            snprintf(h->lost, sizeof h->lost, "connection_closed");
        } else if (rc == LEASED_OK) {
            note_event(h->cl, &ev);
            leased_event_clear(&ev);
        }
    }
    return true;
}

static json_t *
do_wait_lost(struct held *h, long long within_ms)
{
    if (!wait_events(h, UNTIL_LOST, within_ms)) {
        return json_pack("{s:s}", "error", "not lost in time");
    }
    return json_pack("{s:s}", "reason", h->lost);
}

/* lock_at_risk (sem_at_risk) of the handle, or lock_safe after it. */
static json_t *
do_wait_risk(struct held *h, bool at_risk, long long within_ms)
{
    if (!wait_events(h, at_risk ? UNTIL_AT_RISK : UNTIL_SAFE, within_ms)) {
        return json_pack("{s:s}", "error",
                         at_risk ? "not at risk in time" : "not safe in time");
    }
    return json_object();
}

/* --- cache-aside ---------------------------------------------------------- */

static void
append_line(const char *file)
{
    char path[1024];
    FILE *f;

    if (!file) {
        return;
    }
    snprintf(path, sizeof path, "%s/%s", getenv("LEASED_CONF_TMP"), file);
    if ((f = fopen(path, "a")) != NULL) {
        fputs("x\n", f);
        fclose(f);
    }
}

/* The scenario's loader: count, mark, wait, return its value. */
static const char *
load(const json_t *loader)
{
    const char *mark = str(loader, "mark");
    long long delay = num(loader, "delay_ms", 0);

    append_line(str(loader, "count_file"));
    if (mark) {
        json_t *m = json_pack("{s:s,s:s,s:s}", "do", "env", "action", "mark",
                              "name", mark);

        json_decref(do_env(m));
        json_decref(m);
    }
    if (delay > 0) {
        struct timespec ts = {delay / 1000, (delay % 1000) * 1000000};

        nanosleep(&ts, NULL); /* the loader is slow on purpose */
    }
    return str(loader, "value");
}

static json_t *
do_cached(struct client *cl, const json_t *step)
{
    const char *key = str(step, "key"), *v;
    struct leased_cache_result got = {0};
    struct leased_error e;
    json_t *r;
    int rc = leased_cache_get(cl->c, key, LEASED_UNSET, true, &got, &e);

    if (rc != LEASED_OK) {
        return err_result(rc);
    }
    if (got.hit) {
        r = json_pack("{s:s?}", "value", got.value);
        leased_cache_result_free(&got);
        return r;
    }
    v = load(json_object_get(step, "loader"));
    rc = LEASED_OK;
    if (got.lease) {
        rc = leased_cache_fill(cl->c, key, got.lease, v, (size_t)-1, 0, NULL,
                               &e);
    }
    leased_cache_result_free(&got);
    return rc == LEASED_OK ? json_pack("{s:s}", "value", v) : err_result(rc);
}

static json_t *
do_invalidate(struct client *cl, const json_t *step)
{
    const char *k[64];
    size_t n = keys_of(json_object_get(step, "keys"), k, 64);
    struct leased_error e;
    int rc;

    if (strcmp(str(step, "do"), "update") == 0) {
        append_line(str(json_object_get(step, "writer"), "count_file"));
    }
    rc = leased_cache_invalidate(cl->c, k, n, LEASED_UNSET, NULL, &e);
    return rc == LEASED_OK ? json_object() : err_result(rc);
}

static json_t *
do_rate(struct client *cl, const json_t *step)
{
    struct leased_rate_args a = {0};
    struct leased_rate_result rr;
    struct leased_error e;
    int rc;

    a.burst = num(step, "burst", 0);
    a.permits = num(step, "permits", 0);
    a.wait_ms = num(step, "wait_ms", 0);
    rc = leased_rate_acquire(cl->c, str(step, "key"), num(step, "rate", 0),
                             num(step, "per_ms", 0), &a, &rr, &e);
    if (rc != LEASED_OK) {
        return err_result(rc);
    }
    return json_pack("{s:b,s:I}", "acquired", rr.acquired, "retry_after_ms",
                     (json_int_t)rr.retry_after_ms);
}

/* stored, failed (entries with their own error) and the first one's code. */
static json_t *
do_warm(struct client *cl, const json_t *step)
{
    json_t *list = json_object_get(step, "entries"), *x, *r;
    struct leased_mset_entry es[64];
    struct leased_mset_result rs[64];
    struct leased_error e;
    size_t n = 0, i, stored = 0;
    long long failed = 0;
    int rc, first = LEASED_OK;

    json_array_foreach(list, i, x)
    {
        if (n == 64) {
            break;
        }
        es[n].key = str(x, "key");
        es[n].value = str(x, "value");
        es[n].value_len = (size_t)-1;
        es[n].ttl_ms = num(x, "ttl_ms", 0);
        n++;
    }
    rc = leased_cache_mset(cl->c, es, n, &stored, rs, &e);
    if (rc != LEASED_OK) {
        return err_result(rc);
    }
    for (i = 0; i < n; i++) {
        if (rs[i].error != LEASED_OK) {
            failed++;
            if (first == LEASED_OK) {
                first = rs[i].error;
            }
        }
        leased_mset_result_free(&rs[i]);
    }
    r = json_pack("{s:I,s:I}", "stored", (json_int_t)stored, "failed",
                  (json_int_t)failed);
    if (first != LEASED_OK) {
        json_object_set_new(r, "first_error",
                            json_string(leased_strerror(first)));
    }
    return r;
}

static json_t *
do_unlock_id(struct client *cl, const json_t *step)
{
    struct leased_unlock_result ur;
    struct leased_error e;
    int rc = leased_unlock_rid(cl->c, str(step, "key"), NULL,
                               str(step, "owner"), NULL,
                               str(step, "request_id"), &ur, &e);

    if (rc != LEASED_OK) {
        return err_result(rc);
    }
    return json_pack("{s:b,s:I}", "released", ur.released, "count",
                     (json_int_t)ur.count);
}

static json_t *
do_count(const json_t *step)
{
    char path[1024], line[256];
    long long n = 0;
    FILE *f;

    snprintf(path, sizeof path, "%s/%s", getenv("LEASED_CONF_TMP"),
             str(step, "file"));
    if ((f = fopen(path, "r")) != NULL) {
        while (fgets(line, sizeof line, f)) {
            n++;
        }
        fclose(f);
    }
    return json_pack("{s:I}", "lines", (json_int_t)n);
}

/* --- clients ---------------------------------------------------------------- */

static json_t *
do_open(const json_t *step)
{
    const char *t = str(step, "target") ? str(step, "target") : "socket";
    const char *target = getenv("LEASED_SOCKET");
    struct leased_options o;
    struct leased_error e;
    struct leased_conn *c;

    leased_options_init(&o);
    o.client = "conformance-c";
    if (strcmp(t, "tcp") == 0) {
        target = getenv("LEASED_TCP");
        if (json_is_true(json_object_get(step, "auth"))) {
            o.auth = getenv("LEASED_AUTH_TOKEN");
        }
    } else if (strcmp(t, "dead") == 0) {
        target = getenv("LEASED_DEAD_SOCKET");
    }
    c = leased_connect(target, &o, &e);
    if (!c) {
        return err_result(e.code);
    }
    if (S.nclients == MAX_NAMED || !str(step, "as")) {
        leased_close(c);
        return json_pack("{s:s}", "error", "open needs as");
    }
    snprintf(S.clients[S.nclients].name, NAME_LEN, "%s", str(step, "as"));
    S.clients[S.nclients++].c = c;
    return json_object();
}

static json_t *
do_reconnect(struct client *cl)
{
    struct leased_error e;
    int rc = leased_reconnect(cl->c, &e);

    return rc == LEASED_OK ? json_object() : err_result(rc);
}

/* The steps that name a client. */
static json_t *
client_step(const char *d, const json_t *step)
{
    struct client *cl = client_of(step);
    static const char *const ops[] = {"lock",       "sem",    "cached",
                                      "invalidate", "update", "reconnect",
                                      "close",      "rate",   "unlock_id",
                                      "warm",       NULL};
    int i = 0;

    while (ops[i] && strcmp(ops[i], d) != 0) {
        i++;
    }
    if (!ops[i]) {
        return NULL;
    }
    if (!cl) {
        return json_pack("{s:s}", "error", "no such client");
    }
    if (strcmp(d, "lock") == 0) {
        return do_lock(cl, step);
    } else if (strcmp(d, "sem") == 0) {
        return do_sem(cl, step);
    } else if (strcmp(d, "cached") == 0) {
        return do_cached(cl, step);
    } else if (strcmp(d, "invalidate") == 0 || strcmp(d, "update") == 0) {
        return do_invalidate(cl, step);
    } else if (strcmp(d, "reconnect") == 0) {
        return do_reconnect(cl);
    } else if (strcmp(d, "rate") == 0) {
        return do_rate(cl, step);
    } else if (strcmp(d, "warm") == 0) {
        return do_warm(cl, step);
    } else if (strcmp(d, "unlock_id") == 0) {
        return do_unlock_id(cl, step);
    }
    leased_close(cl->c);
    cl->c = NULL;
    return json_object();
}

/* The steps that name a held handle or a background call. */
static json_t *
held_step(const char *d, const json_t *step)
{
    struct held *h = held_of(str(step, "held") ? str(step, "held")
                                               : str(step, "op"));

    if (!h) {
        return json_pack("{s:s}", "error", "no such handle");
    }
    if (strcmp(d, "unlock") == 0) {
        return do_unlock(h);
    } else if (strcmp(d, "wait_lost") == 0) {
        return do_wait_lost(h, num(step, "within_ms", 0));
    } else if (strcmp(d, "wait_at_risk") == 0 || strcmp(d, "wait_safe") == 0) {
        return do_wait_risk(h, strcmp(d, "wait_at_risk") == 0,
                            num(step, "within_ms", 0));
    } else if (strcmp(d, "await") == 0) {
        return do_await(h);
    } else if (strcmp(d, "cancel") == 0) {
        return do_cancel(h);
    }
    return NULL;
}

static json_t *
run_step(const json_t *step)
{
    const char *d = str(step, "do") ? str(step, "do") : "";
    json_t *r;

    if (strcmp(d, "open") == 0) {
        return do_open(step);
    } else if (strcmp(d, "env") == 0) {
        return do_env(step);
    } else if (strcmp(d, "count") == 0) {
        return do_count(step);
    } else if (strcmp(d, "pause") == 0) {
        sleep(60); /* a holder that waits to be killed */
        return json_object();
    }
    if ((r = client_step(d, step)) != NULL ||
        (r = held_step(d, step)) != NULL) {
        return r;
    }
    return json_pack("{s:s}", "error", "unknown step");
}

/* --- expectations ----------------------------------------------------------- */

/* "$NAME.FIELD" as the saved value, anything else as it is. */
static json_t *
resolve(json_t *v)
{
    const char *s = json_string_value(v);
    char name[NAME_LEN];
    const char *dot;

    if (!s || s[0] != '$' || !(dot = strchr(s, '.')) ||
        (size_t)(dot - s) >= sizeof name) {
        return v;
    }
    snprintf(name, sizeof name, "%.*s", (int)(dot - s - 1), s + 1);
    return json_object_get(json_object_get(S.saved, name), dot + 1);
}

static bool
matches(json_t *got, json_t *want)
{
    const char *op;
    json_t *x;

    if (!json_is_object(want)) {
        want = resolve(want);
        return got && want && json_equal(got, want);
    }
    json_object_foreach(want, op, x)
    {
        json_t *v = resolve(x);
        int c;

        if (!got || !v) {
            return false;
        }
        if (strcmp(op, "ne") == 0) {
            c = !json_equal(got, v);
        } else if (!json_is_number(got) || !json_is_number(v)) {
            return false;
        } else {
            double a = json_number_value(got), b = json_number_value(v);

            c = (strcmp(op, "gt") == 0 && a > b) ||
                (strcmp(op, "ge") == 0 && a >= b) ||
                (strcmp(op, "lt") == 0 && a < b) ||
                (strcmp(op, "le") == 0 && a <= b);
        }
        if (!c) {
            return false;
        }
    }
    return true;
}

static bool
check(int i, const json_t *step, json_t *res)
{
    json_t *want = json_object_get(step, "expect"), *w;
    const char *d = str(step, "do"), *k;

    if (json_object_get(res, "error") && !json_object_get(want, "error")) {
        return fail("step %d (%s): error %s", i, d, str(res, "error"));
    }
    json_object_foreach(want, k, w)
    {
        json_t *got = json_object_get(res, k);

        if (!matches(got, w)) {
            char *ws = json_dumps(w, JSON_ENCODE_ANY | JSON_COMPACT);
            char *gs = json_dumps(res, JSON_COMPACT);
            bool r = fail("step %d (%s): expected %s %s, got %s", i, d, k, ws,
                          gs);

            free(ws);
            free(gs);
            return r;
        }
    }
    return true;
}

static bool
run_steps(const json_t *steps)
{
    size_t i;
    json_t *step;

    json_array_foreach(steps, i, step)
    {
        long long t0 = now_ms();
        json_t *res = run_step(step);
        bool ok;

        if (!json_object_get(res, "elapsed_ms")) {
            json_object_set_new(res, "elapsed_ms",
                                json_integer(now_ms() - t0));
        }
        ok = check((int)i + 1, step, res);
        if (ok && str(step, "as")) {
            json_object_set(S.saved, str(step, "as"), res);
        }
        json_decref(res);
        if (!ok) {
            return false;
        }
    }
    return true;
}

static bool
run_file(const char *path, char *name, size_t len)
{
    json_error_t je;
    json_t *sc = json_load_file(path, 0, &je), *begin;
    bool ok;

    snprintf(name, len, "%s", path);
    if (!sc) {
        return fail("%s: %s", path, je.text);
    }
    snprintf(name, len, "%s", str(sc, "name") ? str(sc, "name") : path);
    begin = json_pack("{s:s,s:s,s:s}", "do", "env", "action", "begin",
                      "scenario", name);
    json_t *r = do_env(begin);

    ok = !json_object_get(r, "error") || fail("begin: %s", str(r, "error"));
    json_decref(r);
    json_decref(begin);
    ok = ok && run_steps(json_object_get(sc, "steps"));
    reset();
    json_decref(sc);
    return ok;
}

int
main(int argc, char **argv)
{
    int passed = 0, failed = 0;

    S.saved = json_object();
    if (argc == 3 && strcmp(argv[1], "--steps") == 0) {
        json_t *steps = json_loads(argv[2], 0, NULL);
        bool ok = run_steps(steps);

        if (!ok) {
            fprintf(stderr, "helper: %s\n", S.why);
        }
        reset();
        json_decref(steps);
        return ok ? 0 : 1;
    }
    for (int i = 1; i < argc; i++) {
        char name[256];

        if (run_file(argv[i], name, sizeof name)) {
            printf("ok %s\n", name);
            passed++;
        } else {
            printf("not ok %s: %s\n", name, S.why);
            failed++;
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    json_decref(S.saved);
    return failed ? 1 : 0;
}
