/* leasectl cache load: a warm-up before traffic. Reads JSON lines
 * {"key":...,"value":...,"ttl_ms":...} from a file (or "-": stdin) and
 * stores them with cache.mset, in batches bounded by entries and bytes
 * so that no request passes the daemon's limits (1000 entries, and
 * limits.max_request_bytes: 1 MiB by default). A line that is not such an
 * object, or an entry the daemon refuses, is reported with its line
 * number and counted as failed; the load goes on. The last line says how
 * many were stored and how many failed; any failure exits 1. */

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

/* The daemon's limit on the entries of one cache.mset. */
#define MSET_MAX_ENTRIES 1000
struct load {
    struct ctl *ctl;
    struct ctl_batch batch; /* --batch, --batch-bytes */
    json_t *entries;        /* the batch being filled */
    long long *lines;       /* the line number of each of its entries */
    size_t bytes;           /* of its entries, as JSON */
    long long stored, failed;
};

static void
entry_failed(struct load *l, long long line, const char *key, const char *code,
             const char *msg)
{
    l->failed++;
    if (!l->ctl->quiet) {
        fprintf(stderr, CTL_NAME ": cache load: line %lld%s%s%s: %s: %s\n",
                line, key != NULL ? " (key " : "", key != NULL ? key : "",
                key != NULL ? ")" : "", code, msg);
    }
}

/* The key of the batch's entry I, for the report of its failure. */
static const char *
entry_key(const struct load *l, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(l->entries, i), "key"));
}

/* Each entry of a batch the daemon took, as its result says. */
static void
batch_results(struct load *l, json_t *res, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        json_t *r = json_array_get(res, i);
        json_t *e = json_object_get(r, "error");

        if (json_is_true(json_object_get(r, "ok"))) {
            l->stored++;
        } else {
            entry_failed(l, l->lines[i], entry_key(l, i),
                         json_string_value(json_object_get(e, "code")),
                         json_string_value(json_object_get(e, "message")));
        }
    }
}

/* Whether the daemon refused the batch whole for what is in it: its
 * entries failed, and the next batch may still go. */
static bool
batch_refused(int rc)
{
    return rc == LEASED_E_BAD_REQUEST || rc == LEASED_E_TOO_LARGE ||
           rc == LEASED_E_WRONG_TYPE || rc == LEASED_E_UNAUTHORIZED ||
           rc == LEASED_E_BUSY;
}

/* Send the batch; 0, or the exit status of a failure that ends the load
 * (the connection is gone, or the daemon cannot take cache.mset). */
static int
flush(struct load *l)
{
    size_t n = json_array_size(l->entries);
    struct leased_error err;
    json_t *rep = NULL;

    if (n == 0) {
        return 0;
    }
    json_t *req = json_pack("{s:s,s:O}", "op", "cache.mset", "entries",
                            l->entries);
    int rc = ctl_call(l->ctl, req, 0, &rep, &err);
    json_t *res = json_object_get(rep, "results");

    if (rc == LEASED_OK && json_is_array(res) && json_array_size(res) == n) {
        batch_results(l, res, n);
    } else if (batch_refused(rc)) {
        for (size_t i = 0; i < n; i++) {
            entry_failed(l, l->lines[i], entry_key(l, i),
                         leased_strerror(err.code), err.message);
        }
    } else {
        json_decref(rep);
        if (rc == LEASED_OK) {
            fprintf(stderr,
                    CTL_NAME ": cache load: a reply without results\n");
            return EX_PROTOCOL;
        }
        return ctl_fail(l->ctl, &err);
    }
    json_decref(rep);
    json_array_clear(l->entries);
    l->bytes = 0;
    return 0;
}

/* LINE (number NO) as an entry of the batch, the batch sent first when
 * the entry would not fit in it. */
static int
take_line(struct load *l, const char *line, long long no)
{
    json_error_t jerr;
    json_t *obj = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);

    if (!json_is_object(obj)) {
        entry_failed(l, no, NULL, "bad_line",
                     obj == NULL ? jerr.text
                                 : "not a JSON object with key, value and "
                                   "ttl_ms");
        json_decref(obj);
        return 0;
    }
    /* Only the fields of an entry travel; the daemon checks them. */
    json_t *e = json_object();
    static const char *const fields[] = {"key", "value", "ttl_ms"};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        json_t *v = json_object_get(obj, fields[i]);
        if (v != NULL) {
            json_object_set(e, fields[i], v);
        }
    }
    json_decref(obj);
    size_t len = strlen(line) + 1;
    size_t n = json_array_size(l->entries);
    if (n > 0 && ((long long)n >= l->batch.items ||
                  (long long)(l->bytes + len) > l->batch.bytes)) {
        int rc = flush(l);
        if (rc != 0) {
            json_decref(e);
            return rc;
        }
        n = 0;
    }
    l->lines[n] = no;
    json_array_append_new(l->entries, e);
    l->bytes += len;
    return 0;
}

static int
load_stream(struct load *l, FILE *f)
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
        if (strspn(line, " \t") == (size_t)got) {
            continue; /* a blank line */
        }
        rc = take_line(l, line, no);
    }
    free(line);
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, CTL_NAME ": cache load: read error: %s\n",
                strerror(errno));
        return EX_IOERR;
    }
    return rc != 0 ? rc : flush(l);
}

/* Loads F over a connection that can take cache.mset, in batches. */
static int
load_file(struct load *l, FILE *f)
{
    int rc = ctl_open_conn(l->ctl);
    if (rc == 0 && !ctl_want_feature(l->ctl, "mset")) {
        rc = ctl_no_feature(l->ctl, "cache.mset");
    }
    if (rc != 0) {
        return rc;
    }
    l->entries = json_array();
    l->lines = calloc((size_t)l->batch.items, sizeof *l->lines);
    if (l->entries == NULL || l->lines == NULL) {
        fprintf(stderr, CTL_NAME ": cache load: out of memory\n");
        rc = EX_OSERR;
    } else {
        rc = load_stream(l, f);
    }
    json_decref(l->entries);
    free(l->lines);
    return rc;
}

static int
cache_load(struct ctl *ctl, int argc, char **argv)
{
    const char *batch = NULL, *batch_bytes = NULL;
    const struct optdef defs[] = {
        {"batch", 0, true, &batch},
        {"batch-bytes", 0, true, &batch_bytes},
        {NULL, 0, false, NULL},
    };
    struct load l = {.ctl = ctl};
    char *pos[1];
    int npos, rc;

    rc = ctl_parse_args(ctl, argc, argv, defs, pos, &npos, 1, false, NULL,
                        NULL);
    if (rc != 0) {
        return rc;
    }
    if (npos != 1) {
        return ctl_usage_error(ctl->cmd, "wants FILE (or - for stdin)%s", "");
    }
    rc = ctl_batch_opts(ctl, batch, batch_bytes, MSET_MAX_ENTRIES, &l.batch);
    if (rc != 0) {
        return rc;
    }
    FILE *f = strcmp(pos[0], "-") == 0 ? stdin : fopen(pos[0], "r");
    if (f == NULL) {
        fprintf(stderr, CTL_NAME ": cache load: %s: %s\n", pos[0],
                strerror(errno));
        return EX_NOINPUT;
    }
    rc = load_file(&l, f);
    if (f != stdin) {
        fclose(f);
    }
    if (rc != 0) {
        return rc;
    }
    if (!ctl->json) {
        printf("stored %lld failed %lld\n", l.stored, l.failed);
    }
    return l.failed > 0 ? 1 : 0;
}

int
cmd_cache(struct ctl *ctl, int argc, char **argv)
{
    if (argc < 1) {
        return ctl_usage_error(ctl->cmd, "wants a subcommand: load FILE%s",
                               "");
    }
    if (strcmp(argv[0], "load") == 0) {
        ctl->cmd = "cache load";
        return cache_load(ctl, argc - 1, argv + 1);
    }
    return ctl_usage_error(ctl->cmd, "unknown subcommand '%s'", argv[0]);
}
