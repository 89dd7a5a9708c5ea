/* leasectl bloom: an operator's hands on the Bloom filters in front of
 * the cache (leased-protocol(7), BLOOM FILTERS).
 *
 *   bloom create FILTER --capacity N --error-rate E
 *   bloom add FILTER FILE|-      keys one per line, in bloom.add batches
 *   bloom check FILTER KEY...    "maybe" or "no" per key
 *
 * add is the rebuild tool of the protocol's recipe: a new filter is
 * filled from a dump of the keys that exist. Adding a key twice changes
 * nothing, so a run that stopped part way is simply run again. A batch
 * the daemon refuses ends the run (the line range is named): bloom.add
 * has no per-key outcome, and a rebuild that skipped keys would answer
 * existing keys as absent. */

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

/* The daemon's limit on the keys of one bloom.add or bloom.check. */
#define BLOOM_MAX_KEYS 1000
/* The bounds bloom.create takes (leased-protocol(7)). */
#define CAPACITY_MAX 1000000000LL
#define ERROR_RATE_MIN 1e-9
#define ERROR_RATE_MAX 0.5 /* excluded */

static int
want_bloom(struct ctl *ctl)
{
    int rc = ctl_open_conn(ctl);

    if (rc == 0 && !ctl_want_feature(ctl, "bloom")) {
        rc = ctl_no_feature(ctl, "Bloom filters (feature bloom)");
    }
    return rc;
}

/* --- create ------------------------------------------------------------- */

/* --error-rate E: a number from ERROR_RATE_MIN up to, not including,
 * ERROR_RATE_MAX. */
static bool
parse_error_rate(const char *s, double *rate)
{
    char *end;

    if (s == NULL || *s == '\0') {
        return false;
    }
    errno = 0;
    *rate = strtod(s, &end);
    return *end == '\0' && errno == 0 && *rate >= ERROR_RATE_MIN &&
           *rate < ERROR_RATE_MAX;
}

/* Made now, or there already with these very parameters: both leave the
 * filter the caller asked for, so both exit 0. */
static void
print_created(const char *filter, json_t *rep)
{
    printf("%s %s bits=%lld hashes=%lld bytes=%lld\n",
           json_is_true(json_object_get(rep, "created")) ? "created"
                                                         : "exists",
           filter, (long long)json_integer_value(json_object_get(rep, "bits")),
           (long long)json_integer_value(json_object_get(rep, "hashes")),
           (long long)json_integer_value(json_object_get(rep, "bytes")));
}

/* bloom.create on a connection that has Bloom filters. */
static int
create_filter(struct ctl *ctl, const char *filter, long long cap, double rate)
{
    struct leased_error err;
    json_t *rep = NULL;
    int rc = want_bloom(ctl);
    if (rc != 0) {
        return rc;
    }
    rc = ctl_call(ctl,
                  json_pack("{s:s,s:s,s:I,s:f}", "op", "bloom.create",
                            "filter", filter, "capacity", (json_int_t)cap,
                            "error_rate", rate),
                  0, &rep, &err);
    if (rc != LEASED_OK) {
        json_decref(rep);
        return ctl_fail(ctl, &err);
    }
    if (!ctl->json && !ctl->quiet) {
        print_created(filter, rep);
    }
    json_decref(rep);
    return fflush(stdout) == 0 ? 0 : EX_IOERR;
}

static int
bloom_create(struct ctl *ctl, int argc, char **argv)
{
    const char *capacity = NULL, *error_rate = NULL;
    const struct optdef defs[] = {
        {"capacity", 'n', true, &capacity},
        {"error-rate", 'e', true, &error_rate},
        {NULL, 0, false, NULL},
    };
    long long cap = 0;
    double rate = 0;
    char *pos[1];
    int npos, rc;

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (npos != 1) {
        return ctl_usage_error(ctl->cmd,
                               "wants FILTER --capacity N --error-rate E%s",
                               "");
    }
    if (capacity == NULL || !ctl_parse_num(capacity, 1, CAPACITY_MAX, &cap)) {
        return ctl_usage_error(ctl->cmd,
                               "wants --capacity N (1..1000000000)%s", "");
    }
    if (!parse_error_rate(error_rate, &rate)) {
        return ctl_usage_error(ctl->cmd,
                               "wants --error-rate E (0.000000001 up to, not "
                               "including, 0.5)%s",
                               "");
    }
    return create_filter(ctl, pos[0], cap, rate);
}

/* --- add ---------------------------------------------------------------- */

struct add {
    struct ctl *ctl;
    const char *filter;
    struct ctl_batch batch; /* --batch, --batch-bytes */
    json_t *keys;           /* the batch being filled */
    long long first_line;   /* the line of its first key */
    long long last_line;
    size_t bytes; /* of its keys */
    long long added, fresh;
};

/* Send the batch; 0, or the exit status that ends the run. */
static int
add_flush(struct add *a)
{
    size_t n = json_array_size(a->keys);
    struct leased_error err;
    json_t *rep = NULL, *res;
    int rc;

    if (n == 0) {
        return 0;
    }
    rc = ctl_call(a->ctl,
                  json_pack("{s:s,s:s,s:O}", "op", "bloom.add", "filter",
                            a->filter, "keys", a->keys),
                  0, &rep, &err);
    res = json_object_get(rep, "added");
    if (rc == LEASED_OK && json_is_array(res) && json_array_size(res) == n) {
        size_t i;
        json_t *v;

        json_array_foreach(res, i, v)
        {
            a->fresh += json_is_true(v);
        }
        a->added += (long long)n;
        json_decref(rep);
        json_array_clear(a->keys);
        a->bytes = 0;
        return 0;
    }
    json_decref(rep);
    if (rc == LEASED_OK) {
        fprintf(stderr, CTL_NAME ": %s: a reply without added\n", a->ctl->cmd);
        return EX_PROTOCOL;
    }
    fprintf(stderr,
            CTL_NAME ": %s: lines %lld-%lld not added (%lld keys added "
                     "before them; adding again is harmless)\n",
            a->ctl->cmd, a->first_line, a->last_line, a->added);
    return ctl_fail(a->ctl, &err);
}

/* The key KEY (LEN bytes) of line NO into the batch, the batch sent first
 * when the key would not fit in it. */
static int
add_key(struct add *a, const char *key, size_t len, long long no)
{
    json_t *k = json_stringn(key, len);
    size_t n = json_array_size(a->keys);

    if (k == NULL) {
        fprintf(stderr, CTL_NAME ": %s: line %lld: not UTF-8\n", a->ctl->cmd,
                no);
        return EX_DATAERR;
    }
    /* Counted as JSON will quote it, about: the bytes, quotes, a comma. */
    len += 3;
    if (n > 0 && ((long long)n >= a->batch.items ||
                  (long long)(a->bytes + len) > a->batch.bytes)) {
        int rc = add_flush(a);

        if (rc != 0) {
            json_decref(k);
            return rc;
        }
        n = 0;
    }
    if (n == 0) {
        a->first_line = no;
    }
    a->last_line = no;
    json_array_append_new(a->keys, k);
    a->bytes += len;
    return 0;
}

static int
add_stream(struct add *a, FILE *f, const char *name)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long long no = 0;
    int rc = 0;

    while (rc == 0 && (got = getline(&line, &cap, f)) >= 0) {
        no++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) {
            line[--got] = '\0';
        }
        if (got == 0) {
            continue; /* an empty line: no key is empty */
        }
        rc = add_key(a, line, (size_t)got, no);
    }
    free(line);
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, CTL_NAME ": %s: %s: %s\n", a->ctl->cmd, name,
                strerror(errno));
        return EX_IOERR;
    }
    return rc != 0 ? rc : add_flush(a);
}

/* Adds the keys of the file at PATH ("-": stdin) over a connection that
 * has Bloom filters, in batches. */
static int
add_file(struct add *a, const char *path)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, CTL_NAME ": %s: %s: %s\n", a->ctl->cmd, path,
                strerror(errno));
        return EX_NOINPUT;
    }
    int rc = want_bloom(a->ctl);
    if (rc == 0) {
        a->keys = json_array();
        if (a->keys == NULL) {
            fprintf(stderr, CTL_NAME ": %s: out of memory\n", a->ctl->cmd);
            rc = EX_OSERR;
        } else {
            rc = add_stream(a, f, path);
        }
        json_decref(a->keys);
    }
    if (f != stdin) {
        fclose(f);
    }
    return rc;
}

static int
bloom_add(struct ctl *ctl, int argc, char **argv)
{
    const char *batch = NULL, *batch_bytes = NULL;
    const struct optdef defs[] = {
        {"batch", 0, true, &batch},
        {"batch-bytes", 0, true, &batch_bytes},
        {NULL, 0, false, NULL},
    };
    struct add a = {.ctl = ctl};
    char *pos[2];
    int npos, rc;

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 2, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (npos != 2) {
        return ctl_usage_error(ctl->cmd,
                               "wants FILTER FILE (- for stdin), a key a "
                               "line%s",
                               "");
    }
    rc = ctl_batch_opts(ctl, batch, batch_bytes, BLOOM_MAX_KEYS, &a.batch);
    if (rc != 0) {
        return rc;
    }
    a.filter = pos[0];
    rc = add_file(&a, pos[1]);
    if (rc == 0 && !ctl->json && !ctl->quiet) {
        printf("added %lld new %lld\n", a.added, a.fresh);
    }
    if (rc != 0) {
        return rc;
    }
    return fflush(stdout) == 0 ? 0 : EX_IOERR;
}

/* --- check -------------------------------------------------------------- */

/* One bloom.check of the N keys KEYS; each one's line printed. *ANY_NO
 * is set when the filter ruled one out. */
static int
check_batch(struct ctl *ctl, const char *filter, char **keys, size_t n,
            bool *any_no)
{
    struct leased_error err;
    json_t *arr = json_array(), *rep = NULL, *res;
    int rc;

    for (size_t i = 0; i < n; i++) {
        json_t *k = json_string(keys[i]);

        if (k == NULL) {
            json_decref(arr);
            return ctl_usage_error(ctl->cmd, "KEY '%s' is not UTF-8", keys[i]);
        }
        json_array_append_new(arr, k);
    }
    rc = ctl_call(ctl,
                  json_pack("{s:s,s:s,s:o}", "op", "bloom.check", "filter",
                            filter, "keys", arr),
                  0, &rep, &err);
    res = json_object_get(rep, "maybe");
    if (rc != LEASED_OK) {
        json_decref(rep);
        return ctl_fail(ctl, &err);
    }
    if (!json_is_array(res) || json_array_size(res) != n) {
        json_decref(rep);
        fprintf(stderr, CTL_NAME ": %s: a reply without maybe\n", ctl->cmd);
        return EX_PROTOCOL;
    }
    for (size_t i = 0; i < n; i++) {
        bool maybe = json_is_true(json_array_get(res, i));

        *any_no |= !maybe;
        if (!ctl->json) {
            /* The key last, as it may hold blanks (as hot prints it). */
            printf("%s\t%s\n", maybe ? "maybe" : "no", keys[i]);
        }
    }
    json_decref(rep);
    return 0;
}

static int
bloom_check(struct ctl *ctl, int argc, char **argv)
{
    bool any_no = false;
    char **pos;
    int npos, rc;

    pos = calloc((size_t)argc + 1, sizeof *pos);
    if (pos == NULL) {
        fprintf(stderr, CTL_NAME ": out of memory\n");
        return EX_OSERR;
    }
    rc = ctl_parse_args(ctl, argc, argv, NULL, pos, &npos, argc, false, NULL,
                        NULL);
    if (rc == 0 && npos < 2) {
        rc = ctl_usage_error(ctl->cmd, "wants FILTER KEY...%s", "");
    }
    if (rc == 0) {
        rc = want_bloom(ctl);
    }
    for (int i = 1; rc == 0 && i < npos; i += BLOOM_MAX_KEYS) {
        int n = npos - i < BLOOM_MAX_KEYS ? npos - i : BLOOM_MAX_KEYS;

        rc = check_batch(ctl, pos[0], pos + i, (size_t)n, &any_no);
    }
    free(pos);
    if (rc != 0) {
        return rc;
    }
    if (fflush(stdout) != 0) {
        return EX_IOERR;
    }
    /* As get's miss and info's free lock: 1 says "certainly not there". */
    return any_no ? 1 : 0;
}

int
cmd_bloom(struct ctl *ctl, int argc, char **argv)
{
    static const struct {
        const char *name, *full;
        int (*fn)(struct ctl *ctl, int argc, char **argv);
    } subs[] = {
        {"create", "bloom create", bloom_create},
        {"add", "bloom add", bloom_add},
        {"check", "bloom check", bloom_check},
    };

    if (argc < 1) {
        return ctl_usage_error(ctl->cmd,
                               "wants a subcommand: create, add or check%s",
                               "");
    }
    for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
        if (strcmp(argv[0], subs[i].name) == 0) {
            ctl->cmd = subs[i].full;
            return subs[i].fn(ctl, argc - 1, argv + 1);
        }
    }
    return ctl_usage_error(ctl->cmd, "unknown subcommand '%s'", argv[0]);
}
