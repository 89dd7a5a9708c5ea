/* leasectl: what its files share. leasectl.c has main, the connection and
 * the one-request commands, leasectl_args.c the command line,
 * leasectl_run.c lock and sem (a command run under a lease),
 * leasectl_top.c the live view, leasectl_load.c cache load and
 * leasectl_bloom.c the Bloom filters. */

#ifndef LEASECTL_H
#define LEASECTL_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

#include "leased/client.h"

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
    json_t *features;  /* hello's "features", once asked (ctl_want_feature) */
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

/* --- leasectl_args.c: the command line ----------------------------------- */

void ctl_usage(FILE *f);
/* Print "leasectl: CMD: " FMT (with ARG) and a hint; returns EX_USAGE. */
int ctl_usage_error(const char *cmd, const char *fmt, const char *arg);
/* The batches of a bulk command (cache load, bloom add): at most ITEMS
 * items and about BYTES bytes of them a request. The default bytes are
 * half of the daemon's default limits.max_request_bytes: room for the
 * request around them. */
#define CTL_BATCH_BYTES_DEFAULT (512 * 1024)
struct ctl_batch {
    long long items;
    long long bytes;
};
/* --batch BATCH (1..MAX) and --batch-bytes BYTES, either NULL when not
 * given (then MAX and CTL_BATCH_BYTES_DEFAULT), into *OUT: 0, or the
 * usage error's exit status. */
int ctl_batch_opts(const struct ctl *ctl, const char *batch, const char *bytes,
                   long long max, struct ctl_batch *out);
bool ctl_parse_num(const char *s, long long min, long long max,
                   long long *out);
int ctl_parse_args(struct ctl *ctl, int argc, char **argv,
                   const struct optdef *defs, char **pos, int *npos,
                   int maxpos, bool stop_at_second, char ***rest, int *nrest);
int ctl_opt_ms(const struct ctl *ctl, const char *name, const char *s,
               long long min, long long *out);
int ctl_opt_exits(struct ctl *ctl, const char *lost, const char *conflict,
                  long long *lost_exit);

/* --- leasectl.c: the connection and its calls ---------------------------- */

/* Report ERR for the command; returns the exit status it calls for. */
int ctl_fail(const struct ctl *ctl, const struct leased_error *err);
int ctl_open_conn(struct ctl *ctl);
int ctl_no_arg_cmd(struct ctl *ctl, int argc, char **argv,
                   const struct optdef *defs);
void ctl_print_json(json_t *rep);
int ctl_call(struct ctl *ctl, json_t *req, long long wait_ms, json_t **rep,
             struct leased_error *err);
bool ctl_want_feature(struct ctl *ctl, const char *name);
int ctl_no_feature(const struct ctl *ctl, const char *what);
/* The monotonic clock, in milliseconds. */
long long ctl_now_ms(void);

/* --- the commands with a file of their own ------------------------------- */

int cmd_lock(struct ctl *ctl, int argc, char **argv);
int cmd_sem(struct ctl *ctl, int argc, char **argv);
int cmd_top(struct ctl *ctl, int argc, char **argv);
int cmd_cache(struct ctl *ctl, int argc, char **argv);
int cmd_bloom(struct ctl *ctl, int argc, char **argv);

#endif /* LEASECTL_H */
