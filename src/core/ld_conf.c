/* Configuration: YAML into struct ld_config through a table of directives.
 *
 * Every setting is one row of `conf_directives` below: its dotted name,
 * type, bounds, default, whether SIGHUP may change it and whether this
 * version has the feature at all. The same table drives the defaults, the
 * parser (ld_conf_load.c), reload and the docs check in the test suite, so
 * a new setting is one new row (plus its struct field, its line in
 * conf/leased.yml and its entry in leased.yml(5)).
 *
 * It owns the table, the defaults and the rules of reload; it must not know
 * the modules that read a setting (each gets the struct at init) nor read a
 * file (ld_conf_load.c does). */
#include "ld_conf.h"
#include "ld_conf_int.h"

#include "ld_log.h"
#include "ld_mem.h"
#include "ld_ns_conf.h"
#include "ld_util.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>

/* The enum fields are written through an int pointer. */
_Static_assert(sizeof(enum ld_redis_mode) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ld_lock_layout) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ld_fsync_mode) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ld_log_target) == sizeof(int), "enum size");
_Static_assert(sizeof(enum ld_invalidate_mode) == sizeof(int), "enum size");

static const struct conf_enum redis_modes[] = {
    {"standalone", LD_REDIS_STANDALONE},
    {"sentinel", LD_REDIS_SENTINEL},
    {"cluster", LD_REDIS_CLUSTER},
    {NULL, 0},
};
static const struct conf_enum lock_layouts[] = {
    {"leased", LD_LAYOUT_LEASED},
    {"redisson", LD_LAYOUT_REDISSON},
    {NULL, 0},
};
static const struct conf_enum fsync_modes[] = {
    {"always", LD_FSYNC_ALWAYS},
    {"everysec", LD_FSYNC_EVERYSEC},
    {NULL, 0},
};
static const struct conf_enum invalidate_modes[] = {
    {"delete", LD_INVALIDATE_DELETE},
    {"stale", LD_INVALIDATE_STALE},
    {NULL, 0},
};
static const struct conf_enum log_levels[] = {
    {"debug", LD_LOG_DEBUG},
    {"info", LD_LOG_INFO},
    {"warn", LD_LOG_WARN},
    {"error", LD_LOG_ERROR},
    {NULL, 0},
};
static const struct conf_enum log_targets[] = {
    {"stderr", LD_LOG_TARGET_STDERR},
    {"syslog", LD_LOG_TARGET_SYSLOG},
    {NULL, 0},
};

#define OFF(field) offsetof(struct ld_config, field)
/* The optional last argument of a row adds initializers, such as
 * NOT_BUILT(...). */
#define STRING(n, f, fl, d, ...)                                              \
    {                                                                         \
        .name = n, .type = CT_STRING, .offset = OFF(f), .flags = fl,          \
        .def = d, __VA_ARGS__                                                 \
    }
#define INT(n, f, fl, d, lo, hi, ...)                                         \
    {                                                                         \
        .name = n, .type = CT_INT, .offset = OFF(f), .flags = fl, .def = d,   \
        .min = lo, .max = hi, __VA_ARGS__                                     \
    }
#define LLONG(n, f, fl, d, lo, hi, ...)                                       \
    {                                                                         \
        .name = n, .type = CT_LLONG, .offset = OFF(f), .flags = fl, .def = d, \
        .min = lo, .max = hi, __VA_ARGS__                                     \
    }
#define DOUBLE(n, f, fl, d, lo, hi, ...)                                      \
    {                                                                         \
        .name = n, .type = CT_DOUBLE, .offset = OFF(f), .flags = fl,          \
        .def = d, .dmin = lo, .dmax = hi, __VA_ARGS__                         \
    }
#define BOOL(n, f, fl, d, ...)                                                \
    {                                                                         \
        .name = n, .type = CT_BOOL, .offset = OFF(f), .flags = fl, .def = d,  \
        __VA_ARGS__                                                           \
    }
#define ENUM(n, f, fl, d, tab, ...)                                           \
    {                                                                         \
        .name = n, .type = CT_ENUM, .offset = OFF(f), .flags = fl, .def = d,  \
        .names = tab, __VA_ARGS__                                             \
    }
#define MODE(n, f, fl, d, ...)                                                \
    {                                                                         \
        .name = n, .type = CT_MODE, .offset = OFF(f), .flags = fl, .def = d,  \
        __VA_ARGS__                                                           \
    }
#define STRLIST(n, f, fl, ...)                                                \
    {                                                                         \
        .name = n, .type = CT_STRLIST, .offset = OFF(f), .flags = fl,         \
        .def = "", __VA_ARGS__                                                \
    }
#define HOSTPORT(n, f, fl, d, ...)                                            \
    {                                                                         \
        .name = n, .type = CT_HOSTPORT, .offset = OFF(f), .flags = fl,        \
        .def = d, __VA_ARGS__                                                 \
    }
#define NSLIST(n, f, fl)                                                      \
    {                                                                         \
        .name = n, .type = CT_NSLIST, .offset = OFF(f), .flags = fl,          \
        .def = ""                                                             \
    }
/* Not available in this version: only the default value is accepted. */
#define NOT_BUILT(feature) .unbuilt = feature

#define DAY_MS 86400000LL
#define YEAR_MS (365 * DAY_MS)
#define HOUR_MS 3600000LL

/* Keep in step with conf/leased.yml and man/leased.yml.5 (make check
 * fails when a key is missing from either). */
const struct conf_directive conf_directives[] = {
    STRING("listen.unix", listen.unix_path, F_SUNPATH, NULL),
    MODE("listen.unix_mode", listen.unix_mode, 0, "0660"),
    STRING("listen.unix_group", listen.unix_group, F_GROUP, ""),
    HOSTPORT("listen.tcp", listen.tcp, F_EMPTY_OK | F_LISTEN, ""),
    STRING("listen.auth_token", listen.auth_token, 0, ""),
    STRING("listen.admin_token", listen.admin_token, F_RELOAD, ""),
    NSLIST("listen.namespaces", listen.namespaces, F_RELOAD),

    ENUM("redis.mode", redis.mode, 0, "standalone", redis_modes),
    HOSTPORT("redis.address", redis.address, F_UNIX_OK, "127.0.0.1:6379"),
    STRLIST("redis.addresses", redis.addresses, F_UNIX_OK),
    STRING("redis.master_name", redis.master_name, F_NONEMPTY, "mymaster"),
    STRING("redis.sentinel_username", redis.sentinel_username, 0, ""),
    STRING("redis.sentinel_password", redis.sentinel_password, 0, ""),
    STRING("redis.username", redis.username, 0, ""),
    STRING("redis.password", redis.password, 0, ""),
    INT("redis.db", redis.db, 0, "0", 0, 1000000),
    INT("redis.connections", redis.connections, 0, "2", 1, 64),
    INT("redis.timeout_ms", redis.timeout_ms, 0, "1000", 1, 600000),
    INT("redis.batch_max", redis.batch_max, F_RELOAD, "0", 0, 1024),
    BOOL("redis.tls.enabled", redis.tls.enabled, 0, "false"),
    STRING("redis.tls.ca_file", redis.tls.ca_file, 0, ""),
    STRING("redis.tls.cert_file", redis.tls.cert_file, 0, ""),
    STRING("redis.tls.key_file", redis.tls.key_file, 0, ""),
    STRING("redis.tls.server_name", redis.tls.server_name, 0, ""),
    BOOL("redis.tls.verify", redis.tls.verify, 0, "true"),

    STRING("lock.prefix", lock.prefix, 0, "leased:lock:"),
    LLONG("lock.watchdog_ms", lock.watchdog_ms, F_RELOAD, "30000", 100,
          DAY_MS),
    LLONG("lock.max_hold_ms", lock.max_hold_ms, F_RELOAD, "0", 0, YEAR_MS),
    INT("lock.wait_replicas", lock.wait_replicas, F_RELOAD, "0", 0, 16),
    BOOL("lock.require_noeviction", lock.require_noeviction, F_RELOAD,
         "false"),
    ENUM("lock.layout", lock.layout, 0, "leased", lock_layouts),
    INT("lock.sem_layout", lock.sem_layout, 0, "1", 1, 2),
    STRLIST("lock.redlock", lock.redlock, F_UNIX_OK),

    STRING("cache.prefix", cache.prefix, 0, "leased:cache:"),
    LLONG("cache.ttl_ms", cache.ttl_ms, F_RELOAD, "600000", 1, YEAR_MS),
    LLONG("cache.null_ttl_ms", cache.null_ttl_ms, F_RELOAD, "60000", 1,
          YEAR_MS),
    DOUBLE("cache.ttl_jitter", cache.ttl_jitter, F_RELOAD, "0.1", 0.0, 0.5),
    LLONG("cache.fill_lease_ms", cache.fill_lease_ms, F_RELOAD, "5000", 10,
          HOUR_MS),
    LLONG("cache.wait_ms", cache.wait_ms, F_RELOAD, "3000", 0, HOUR_MS),
    LLONG("cache.double_delete_ms", cache.double_delete_ms, F_RELOAD, "1000",
          0, HOUR_MS),
    ENUM("cache.invalidate_mode", cache.invalidate_mode, F_RELOAD, "delete",
         invalidate_modes),
    LLONG("cache.stale_ms", cache.stale_ms, F_RELOAD, "5000", 1, HOUR_MS),
    BOOL("cache.early_refresh", cache.early_refresh, F_RELOAD, "false"),
    DOUBLE("cache.early_refresh_beta", cache.early_refresh_beta, F_RELOAD,
           "1.0", 0.0, 1000.0),
    LLONG("cache.hot_keys", cache.hot_keys, 0, "64", 0, 10000),
    INT("cache.layout", cache.layout, 0, "1", 1, 2),
    BOOL("cache.near.enabled", cache.near.enabled, 0, "false"),
    LLONG("cache.near.max_bytes", cache.near.max_bytes, 0, "67108864", 0,
          1LL << 40),
    LLONG("cache.near.max_value_bytes", cache.near.max_value_bytes, 0, "65536",
          1, 1LL << 30),
    LLONG("cache.near.min_hits", cache.near.min_hits, 0, "0", 0, 1000000),
    LLONG("cache.near.min_hits_window_ms", cache.near.min_hits_window_ms, 0,
          "10000", 1, DAY_MS),
    LLONG("cache.near.shared_bytes", cache.near.shared_bytes, F_RELOAD,
          "16777216", 0, 1LL << 34),
    LLONG("cache.near.shared_stale_ms", cache.near.shared_stale_ms, F_RELOAD,
          "50", 5, 10000),

    STRING("journal.path", journal.path, F_NONEMPTY, NULL),
    ENUM("journal.fsync", journal.fsync, 0, "always", fsync_modes),

    LLONG("limits.max_clients", limits.max_clients, F_RELOAD, "10000", 1,
          1000000),
    LLONG("limits.max_request_bytes", limits.max_request_bytes, F_RELOAD,
          "1048576", 64, 1LL << 30),
    LLONG("limits.max_key_bytes", limits.max_key_bytes, F_RELOAD, "1024", 1,
          65536),
    LLONG("limits.max_waiters", limits.max_waiters, F_RELOAD, "100000", 0,
          100000000),
    LLONG("limits.max_pending", limits.max_pending, F_RELOAD, "1024", 1,
          1000000),
    LLONG("limits.max_output_bytes", limits.max_output_bytes, F_RELOAD,
          "33554432", 65536, 1LL << 40),
    LLONG("limits.max_memory_bytes", limits.max_memory_bytes, F_RELOAD, "0", 0,
          1LL << 50),

    LLONG("shutdown.drain_ms", shutdown.drain_ms, F_RELOAD, "0", 0, HOUR_MS),

    HOSTPORT("metrics.listen", metrics.listen, F_EMPTY_OK | F_LISTEN,
             "127.0.0.1:9379"),
    BOOL("metrics.hot_key_names", metrics.hot_key_names, F_RELOAD, "false"),

    ENUM("log.level", log.level, F_RELOAD, "info", log_levels),
    ENUM("log.target", log.target, 0, "stderr", log_targets),
};

const size_t conf_ndirectives = LD_ARRAY_LEN(conf_directives);
_Static_assert(LD_ARRAY_LEN(conf_directives) <= CONF_MAX_DIRECTIVES,
               "raise CONF_MAX_DIRECTIVES");

const struct conf_directive *
conf_find_directive(const char *name)
{
    for (size_t i = 0; i < conf_ndirectives; i++) {
        if (strcmp(conf_directives[i].name, name) == 0) {
            return &conf_directives[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------
 * Field access and memory */

void
conf_strlist_free(struct ld_strlist *l)
{
    for (size_t i = 0; i < l->count; i++) {
        free(l->items[i]);
    }
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

static void
strlist_copy(struct ld_strlist *dst, const struct ld_strlist *src)
{
    dst->count = src->count;
    dst->items = NULL;
    if (src->count > 0) {
        dst->items = ld_xmalloc(src->count * sizeof(*dst->items));
        for (size_t i = 0; i < src->count; i++) {
            dst->items[i] = ld_xstrdup(src->items[i]);
        }
    }
}

static bool
strlist_equal(const struct ld_strlist *a, const struct ld_strlist *b)
{
    if (a->count != b->count) {
        return false;
    }
    for (size_t i = 0; i < a->count; i++) {
        if (strcmp(a->items[i], b->items[i]) != 0) {
            return false;
        }
    }
    return true;
}

static void
set_string(struct ld_config *cfg, const struct conf_directive *d, char *s)
{
    char **p = field(cfg, d);
    free(*p);
    *p = s;
}

/* Free whatever the directive owns and copy SRC's value into DST. */
static void
value_copy(struct ld_config *dst, const struct ld_config *src,
           const struct conf_directive *d)
{
    switch (d->type) {
    case CT_STRING:
    case CT_HOSTPORT:
        set_string(dst, d, ld_xstrdup(*(char *const *)cfield(src, d)));
        break;
    case CT_STRLIST:
        conf_strlist_free(field(dst, d));
        strlist_copy(field(dst, d), cfield(src, d));
        break;
    case CT_NSLIST:
        ld_ns_list_free(field(dst, d));
        ld_ns_list_copy(field(dst, d), cfield(src, d));
        break;
    case CT_INT:
    case CT_ENUM:
        *(int *)field(dst, d) = *(const int *)cfield(src, d);
        break;
    case CT_LLONG:
        *(long long *)field(dst, d) = *(const long long *)cfield(src, d);
        break;
    case CT_DOUBLE:
        *(double *)field(dst, d) = *(const double *)cfield(src, d);
        break;
    case CT_BOOL:
        *(bool *)field(dst, d) = *(const bool *)cfield(src, d);
        break;
    case CT_MODE:
        *(mode_t *)field(dst, d) = *(const mode_t *)cfield(src, d);
        break;
    }
}

bool
conf_value_equal(const struct ld_config *a, const struct ld_config *b,
                 const struct conf_directive *d)
{
    switch (d->type) {
    case CT_STRING:
    case CT_HOSTPORT:
        return strcmp(*(char *const *)cfield(a, d),
                      *(char *const *)cfield(b, d)) == 0;
    case CT_STRLIST:
        return strlist_equal(cfield(a, d), cfield(b, d));
    case CT_NSLIST:
        return ld_ns_list_equal(cfield(a, d), cfield(b, d));
    case CT_INT:
    case CT_ENUM:
        return *(const int *)cfield(a, d) == *(const int *)cfield(b, d);
    case CT_LLONG:
        return *(const long long *)cfield(a, d) ==
               *(const long long *)cfield(b, d);
    case CT_DOUBLE:
        return *(const double *)cfield(a, d) == *(const double *)cfield(b, d);
    case CT_BOOL:
        return *(const bool *)cfield(a, d) == *(const bool *)cfield(b, d);
    case CT_MODE:
        return *(const mode_t *)cfield(a, d) == *(const mode_t *)cfield(b, d);
    }
    return true;
}

/* ------------------------------------------------------------------------
 * Converting one scalar. Each converter either stores the value and
 * returns true, or leaves the config alone and writes a message. */

bool
conf_is_null(const struct scalar *s)
{
    return s->plain &&
           (s->len == 0 || strcmp(s->text, "~") == 0 ||
            strcmp(s->text, "null") == 0 || strcmp(s->text, "Null") == 0 ||
            strcmp(s->text, "NULL") == 0);
}

static bool
all_digits(const char *s, size_t min_len)
{
    size_t n = 0;
    for (; *s != '\0'; s++, n++) {
        if (*s < '0' || *s > '9') {
            return false;
        }
    }
    return n >= min_len;
}

static bool
conv_integer(const struct conf_directive *d, const struct scalar *s,
             long long *out, char *msg, size_t msglen)
{
    const char *t = s->text;
    /* Quoted numbers are strings in YAML; accepting them would hide a
     * template that put quotes around the wrong value. */
    if (!s->plain || strlen(t) != s->len ||
        !all_digits(t + (t[0] == '-' || t[0] == '+'), 1)) {
        snprintf(msg, msglen, "expected an integer");
        return false;
    }
    errno = 0;
    long long v = strtoll(t, NULL, 10);
    if (errno == ERANGE || v < d->min || v > d->max) {
        snprintf(msg, msglen, "must be %lld..%lld", d->min, d->max);
        return false;
    }
    *out = v;
    return true;
}

static bool
conv_double(const struct conf_directive *d, const struct scalar *s,
            double *out, char *msg, size_t msglen)
{
    const char *t = s->text;
    char *end;
    /* strtod also takes hex floats, "inf" and "nan"; only decimal
     * notation is a YAML float a person would write here. */
    bool ok = s->plain && s->len > 0 && strlen(t) == s->len &&
              strspn(t, "0123456789+-.eE") == s->len;
    double v = 0;
    if (ok) {
        errno = 0;
        v = strtod(t, &end);
        ok = *end == '\0' && errno == 0 && isfinite(v);
    }
    if (!ok) {
        snprintf(msg, msglen, "expected a number");
        return false;
    }
    if (v < d->dmin || v > d->dmax) {
        snprintf(msg, msglen, "must be %g..%g", d->dmin, d->dmax);
        return false;
    }
    *out = v;
    return true;
}

static bool
conv_bool(const struct scalar *s, bool *out, char *msg, size_t msglen)
{
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    if (s->plain) {
        for (size_t i = 0; i < LD_ARRAY_LEN(yes); i++) {
            if (strcasecmp(s->text, yes[i]) == 0) {
                *out = true;
                return true;
            }
            if (strcasecmp(s->text, no[i]) == 0) {
                *out = false;
                return true;
            }
        }
    }
    snprintf(msg, msglen, "expected true or false");
    return false;
}

static bool
conv_enum(const struct conf_directive *d, const struct scalar *s, int *out,
          char *msg, size_t msglen)
{
    for (const struct conf_enum *e = d->names; e->name != NULL; e++) {
        if (strcmp(s->text, e->name) == 0) {
            *out = e->value;
            return true;
        }
    }
    size_t n = (size_t)snprintf(msg, msglen, "must be one of");
    for (const struct conf_enum *e = d->names; e->name != NULL && n < msglen;
         e++) {
        n += (size_t)snprintf(msg + n, msglen - n, "%s %s",
                              e == d->names ? "" : ",", e->name);
    }
    return false;
}

static bool
conv_mode(const struct scalar *s, mode_t *out, char *msg, size_t msglen)
{
    if (s->len >= 1 && s->len <= 4 && strlen(s->text) == s->len &&
        strspn(s->text, "01234567") == s->len) {
        long v = strtol(s->text, NULL, 8);
        if (v <= 0777) {
            *out = (mode_t)v;
            return true;
        }
    }
    snprintf(msg, msglen,
             "expected an octal mode such as \"0660\" (at most "
             "0777)");
    return false;
}

bool
conf_check_address(const struct conf_directive *d, const char *t, char *msg,
                   size_t msglen)
{
    char host[256];
    int port;

    if (t[0] == '\0' && (d->flags & F_EMPTY_OK)) {
        return true;
    }
    if (t[0] == '/' && (d->flags & F_UNIX_OK)) {
        if (strlen(t) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
            snprintf(msg, msglen, "socket path longer than %zu bytes",
                     sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
            return false;
        }
        return true;
    }
    if (ld_parse_hostport(t, host, sizeof(host), &port) != LD_OK) {
        snprintf(msg, msglen, "expected host:port%s",
                 (d->flags & F_UNIX_OK) ? " or an absolute socket path" : "");
        return false;
    }
    if (port == 0 && !(d->flags & F_LISTEN)) {
        snprintf(msg, msglen, "port must be 1..65535");
        return false;
    }
    return true;
}

bool
ld_conf_parse_group(const char *name, gid_t *gid)
{
    if (name[0] >= '0' && name[0] <= '9') {
        char *end;
        errno = 0;
        unsigned long v = strtoul(name, &end, 10);
        if (errno != 0 || *end != '\0' || v > (unsigned long)INT_MAX) {
            return false;
        }
        *gid = (gid_t)v;
        return true;
    }
    struct group *g = getgrnam(name);
    if (g == NULL) {
        return false;
    }
    *gid = g->gr_gid;
    return true;
}

static bool
conv_string(const struct conf_directive *d, const struct scalar *s, char *msg,
            size_t msglen)
{
    if (strlen(s->text) != s->len) {
        snprintf(msg, msglen, "must not contain NUL bytes");
        return false;
    }
    if ((d->flags & F_NONEMPTY) && s->len == 0) {
        snprintf(msg, msglen, "must not be empty");
        return false;
    }
    if ((d->flags & F_SUNPATH) &&
        s->len >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        snprintf(msg, msglen, "socket path longer than %zu bytes",
                 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
        return false;
    }
    gid_t gid;
    if ((d->flags & F_GROUP) && s->len > 0 &&
        !ld_conf_parse_group(s->text, &gid)) {
        snprintf(msg, msglen, "unknown group '%s'", s->text);
        return false;
    }
    return true;
}

bool
conf_set_scalar(struct ld_config *cfg, const struct conf_directive *d,
                const struct scalar *in, char *msg, size_t msglen)
{
    struct scalar s = *in;
    long long ll;

    switch (d->type) {
    case CT_STRING:
    case CT_HOSTPORT:
        /* An empty value ("key:" with nothing after it) is YAML null; for
         * strings it reads naturally as "". */
        if (conf_is_null(&s)) {
            s.text = "";
            s.len = 0;
        }
        if (!conv_string(d, &s, msg, msglen)) {
            return false;
        }
        if (d->type == CT_HOSTPORT &&
            !conf_check_address(d, s.text, msg, msglen)) {
            return false;
        }
        set_string(cfg, d, ld_xstrndup(s.text, s.len));
        return true;
    case CT_INT:
        if (!conv_integer(d, &s, &ll, msg, msglen)) {
            return false;
        }
        *(int *)field(cfg, d) = (int)ll;
        return true;
    case CT_LLONG:
        return conv_integer(d, &s, field(cfg, d), msg, msglen);
    case CT_DOUBLE:
        return conv_double(d, &s, field(cfg, d), msg, msglen);
    case CT_BOOL:
        return conv_bool(&s, field(cfg, d), msg, msglen);
    case CT_ENUM:
        return conv_enum(d, &s, field(cfg, d), msg, msglen);
    case CT_MODE:
        return conv_mode(&s, field(cfg, d), msg, msglen);
    case CT_STRLIST:
    case CT_NSLIST:
        break;
    }
    snprintf(msg, msglen, "expected a list");
    return false;
}

const char *
conf_type_noun(const struct conf_directive *d)
{
    switch (d->type) {
    case CT_INT:
    case CT_LLONG:
        return "an integer";
    case CT_DOUBLE:
        return "a number";
    case CT_BOOL:
        return "true or false";
    case CT_MODE:
        return "an octal mode";
    case CT_STRLIST:
    case CT_NSLIST:
        return "a list";
    case CT_HOSTPORT:
        return "host:port";
    default:
        return "a string";
    }
}

/* ------------------------------------------------------------------------
 * Defaults */

/* systemd may pass several directories separated by ':' when a unit names
 * more than one; ours is the first. */
static char *
path_under_env(const char *env, const char *file, const char *fallback)
{
    const char *dir = getenv(env);
    if (dir == NULL || dir[0] == '\0') {
        return ld_xstrdup(fallback);
    }
    size_t dlen = strcspn(dir, ":");
    size_t flen = strlen(file);
    char *p = ld_xmalloc(dlen + 1 + flen + 1);
    memcpy(p, dir, dlen);
    p[dlen] = '/';
    memcpy(p + dlen + 1, file, flen + 1);
    return p;
}

void
ld_conf_defaults(struct ld_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < conf_ndirectives; i++) {
        const struct conf_directive *d = &conf_directives[i];
        char msg[128];
        if (d->def == NULL || d->type == CT_STRLIST || d->type == CT_NSLIST) {
            continue; /* computed below; lists start empty */
        }
        struct scalar s = {d->def, strlen(d->def), true};
        if (!conf_set_scalar(cfg, d, &s, msg, sizeof(msg))) {
            log_error("config: bad built-in default key=%s: %s", d->name, msg);
            abort();
        }
    }
    cfg->listen.unix_path = path_under_env("RUNTIME_DIRECTORY", "leased.sock",
                                           "/run/leased/leased.sock");
    cfg->journal.path =
        path_under_env("STATE_DIRECTORY", "invalidations.journal",
                       "/var/lib/leased/invalidations.journal");
}

void
ld_conf_free(struct ld_config *cfg)
{
    for (size_t i = 0; i < conf_ndirectives; i++) {
        const struct conf_directive *d = &conf_directives[i];
        if (d->type == CT_STRING || d->type == CT_HOSTPORT) {
            set_string(cfg, d, NULL);
        } else if (d->type == CT_STRLIST) {
            conf_strlist_free(field(cfg, d));
        } else if (d->type == CT_NSLIST) {
            ld_ns_list_free(field(cfg, d));
        }
    }
}

static void
absolute_path(char **path, const char *base)
{
    if ((*path)[0] == '\0' || (*path)[0] == '/' || base == NULL ||
        base[0] == '\0') {
        return;
    }
    size_t blen = strlen(base);
    size_t plen = strlen(*path);
    const char *p = *path;
    if (plen >= 2 && p[0] == '.' && p[1] == '/') {
        p += 2;
        plen -= 2;
    }
    char *abs = ld_xmalloc(blen + 1 + plen + 1);
    memcpy(abs, base, blen);
    size_t n = blen;
    if (n == 0 || abs[n - 1] != '/') {
        abs[n++] = '/';
    }
    memcpy(abs + n, p, plen + 1);
    free(*path);
    *path = abs;
}

void
ld_conf_absolute_paths(struct ld_config *cfg, const char *base)
{
    absolute_path(&cfg->listen.unix_path, base);
    absolute_path(&cfg->journal.path, base);
    absolute_path(&cfg->redis.tls.ca_file, base);
    absolute_path(&cfg->redis.tls.cert_file, base);
    absolute_path(&cfg->redis.tls.key_file, base);
}

/* ------------------------------------------------------------------------
 * Reload */

void
ld_conf_apply_reload(struct ld_config *live, const struct ld_config *newcfg)
{
    enum ld_log_level old_level = live->log.level;

    for (size_t i = 0; i < conf_ndirectives; i++) {
        const struct conf_directive *d = &conf_directives[i];
        if (conf_value_equal(live, newcfg, d)) {
            continue;
        }
        if (d->flags & F_RELOAD) {
            value_copy(live, newcfg, d);
            log_info("config: %s reloaded", d->name);
        } else {
            log_warn("config: %s changed, needs restart", d->name);
        }
    }
    /* The level is the one setting whose live copy is a global of its own
     * module rather than a field that other modules read. */
    if (live->log.level != old_level) {
        ld_log_set_level(live->log.level);
    }
}

void
ld_conf_each_key(ld_conf_key_fn *fn, void *arg)
{
    for (size_t i = 0; i < conf_ndirectives; i++) {
        const struct conf_directive *d = &conf_directives[i];
        fn(d->name, (d->flags & F_RELOAD) != 0, arg);
    }
}

bool
ld_conf_key_available(const char *dotted)
{
    const struct conf_directive *d = conf_find_directive(dotted);
    return d != NULL && (d->unbuilt == NULL || d->unbuilt_value != NULL);
}
