/* Configuration: loading a YAML file into struct ld_config, through the
 * directive table of ld_conf.c.
 *
 * Parsing goes through libyaml's document API: the whole file becomes a
 * node tree, so duplicate keys can be found within a mapping and every
 * error can point at the node it is about.
 *
 * It owns the walk of the YAML tree and its errors; it must not hold a
 * setting of its own: every key is a row of ld_conf.c's table, and
 * listen.namespaces is parsed by ld_ns_conf.c. */
#include "ld_conf.h"
#include "ld_conf_int.h"

#include "ld_log.h"
#include "ld_mem.h"
#include "ld_ns_conf.h"
#include "ld_util.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* ------------------------------------------------------------------------
 * Loading */

struct conf_load {
    struct ld_config *cfg;
    const char *name; /* file name for messages */
    const char *input;
    size_t input_len;
    yaml_document_t *doc;
    char *err;
    size_t errlen;
    bool seen[CONF_MAX_DIRECTIVES];         /* set by this document */
    yaml_mark_t marks[CONF_MAX_DIRECTIVES]; /* where its value starts */
};

static int LD_PRINTF(4, 5) conf_error(struct conf_load *st, yaml_mark_t mark,
                                      const char *key, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* libyaml counts lines and columns from 0, editors from 1. */
    if (key != NULL) {
        snprintf(st->err, st->errlen, "%s:%zu:%zu: %s: %s", st->name,
                 mark.line + 1, mark.column + 1, key, msg);
    } else {
        snprintf(st->err, st->errlen, "%s:%zu:%zu: %s", st->name,
                 mark.line + 1, mark.column + 1, msg);
    }
    return LD_ERR;
}

/* Is NAME a section, i.e. the prefix of some dotted key? */
static bool
is_section(const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; i < conf_ndirectives; i++) {
        if (strncmp(conf_directives[i].name, name, n) == 0 &&
            conf_directives[i].name[n] == '.') {
            return true;
        }
    }
    return false;
}

static const char *
node_kind(const yaml_node_t *node)
{
    switch (node->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return "a scalar";
    }
}

static struct scalar
node_scalar(const yaml_node_t *node)
{
    struct scalar s = {
        (const char *)node->data.scalar.value,
        node->data.scalar.length,
        node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE,
    };
    return s;
}

static bool
node_is_null(const yaml_node_t *node)
{
    if (node->type != YAML_SCALAR_NODE) {
        return false;
    }
    struct scalar s = node_scalar(node);
    return conf_is_null(&s);
}

static int
set_list(struct conf_load *st, const struct conf_directive *d,
         yaml_node_t *node)
{
    struct ld_strlist list = {NULL, 0};

    if (node->type == YAML_SCALAR_NODE) {
        if (!node_is_null(node)) {
            return conf_error(st, node->start_mark, d->name,
                              "expected a list, got a scalar");
        }
    } else if (node->type != YAML_SEQUENCE_NODE) {
        return conf_error(st, node->start_mark, d->name,
                          "expected a list, got %s", node_kind(node));
    } else {
        yaml_node_item_t *start = node->data.sequence.items.start;
        yaml_node_item_t *top = node->data.sequence.items.top;
        list.items = ld_xmalloc((size_t)(top - start) * sizeof(*list.items));
        for (yaml_node_item_t *it = start; it < top; it++) {
            yaml_node_t *item = yaml_document_get_node(st->doc, *it);
            char msg[200];
            if (item->type != YAML_SCALAR_NODE) {
                conf_strlist_free(&list);
                return conf_error(st, item->start_mark, d->name,
                                  "list items must be scalars, got %s",
                                  node_kind(item));
            }
            struct scalar s = node_scalar(item);
            if (strlen(s.text) != s.len ||
                !conf_check_address(d, s.text, msg, sizeof(msg))) {
                conf_strlist_free(&list);
                return conf_error(st, item->start_mark, d->name, "%s",
                                  strlen(s.text) != s.len
                                      ? "must not contain NUL bytes"
                                      : msg);
            }
            list.items[list.count++] = ld_xstrndup(s.text, s.len);
        }
    }
    struct ld_strlist *dst = field(st->cfg, d);
    conf_strlist_free(dst);
    *dst = list;
    return LD_OK;
}

static int
set_value(struct conf_load *st, const struct conf_directive *d,
          yaml_node_t *node)
{
    size_t idx = (size_t)(d - conf_directives);
    st->seen[idx] = true;
    st->marks[idx] = node->start_mark;

    if (d->type == CT_STRLIST) {
        return set_list(st, d, node);
    }
    if (d->type == CT_NSLIST) {
        char msg[200];
        yaml_mark_t at = node->start_mark;
        if (!ld_ns_conf_parse(st->doc, node, field(st->cfg, d), msg,
                              sizeof(msg), &at)) {
            return conf_error(st, at, d->name, "%s", msg);
        }
        return LD_OK;
    }
    if (node->type != YAML_SCALAR_NODE) {
        return conf_error(st, node->start_mark, d->name, "expected %s, got %s",
                          conf_type_noun(d), node_kind(node));
    }
    char msg[200];
    struct scalar s = node_scalar(node);
    if (!conf_set_scalar(st->cfg, d, &s, msg, sizeof(msg))) {
        return conf_error(st, node->start_mark, d->name, "%s", msg);
    }
    return LD_OK;
}

static bool
same_key(const yaml_node_t *a, const yaml_node_t *b)
{
    return a->type == YAML_SCALAR_NODE && b->type == YAML_SCALAR_NODE &&
           a->data.scalar.length == b->data.scalar.length &&
           memcmp(a->data.scalar.value, b->data.scalar.value,
                  a->data.scalar.length) == 0;
}

static int walk_mapping(struct conf_load *st, yaml_node_t *map,
                        const char *prefix);

/* The VALUE of key NAME (dotted, KEY's node): a setting, or a section. */
static int
walk_value(struct conf_load *st, const yaml_node_t *key, yaml_node_t *value,
           const char *name)
{
    const struct conf_directive *d = conf_find_directive(name);
    if (d != NULL) {
        return set_value(st, d, value);
    }
    if (!is_section(name)) {
        return conf_error(st, key->start_mark, name, "unknown key");
    }
    if (value->type == YAML_MAPPING_NODE) {
        return walk_mapping(st, value, name);
    }
    /* "section:" with every line below commented out. */
    if (!node_is_null(value)) {
        return conf_error(st, value->start_mark, name,
                          "expected a mapping, got %s", node_kind(value));
    }
    return LD_OK;
}

/* Walk the mapping of section PREFIX ("" at the top level). */
static int
walk_mapping(struct conf_load *st, yaml_node_t *map, const char *prefix)
{
    yaml_node_pair_t *start = map->data.mapping.pairs.start;
    yaml_node_pair_t *top = map->data.mapping.pairs.top;

    for (yaml_node_pair_t *pair = start; pair < top; pair++) {
        yaml_node_t *key = yaml_document_get_node(st->doc, pair->key);
        yaml_node_t *value = yaml_document_get_node(st->doc, pair->value);
        char name[160];

        if (key->type != YAML_SCALAR_NODE) {
            return conf_error(st, key->start_mark,
                              prefix[0] != '\0' ? prefix : NULL,
                              "keys must be plain names, got %s",
                              node_kind(key));
        }
        /* A dot inside a key would let "redis.db" at the top level alias
         * "db" under "redis" and slip past the duplicate check. */
        size_t klen = key->data.scalar.length;
        const char *ktext = (const char *)key->data.scalar.value;
        bool plain_name = klen > 0 && klen <= 64 && strlen(ktext) == klen &&
                          strchr(ktext, '.') == NULL;
        snprintf(name, sizeof(name), "%s%s%.*s", prefix,
                 prefix[0] != '\0' ? "." : "", (int)(klen > 64 ? 64 : klen),
                 ktext);

        for (yaml_node_pair_t *prev = start; prev < pair; prev++) {
            if (same_key(yaml_document_get_node(st->doc, prev->key), key)) {
                return conf_error(st, key->start_mark, name, "duplicate key");
            }
        }
        if (!plain_name) {
            return conf_error(st, key->start_mark, name, "unknown key");
        }

        if (walk_value(st, key, value, name) != LD_OK) {
            return LD_ERR;
        }
    }
    return LD_OK;
}

static size_t
directive_index(const char *name)
{
    const struct conf_directive *d = conf_find_directive(name);
    return (size_t)(d - conf_directives);
}

/* Where to point an error about the relation of two settings: at the first
 * of them that this file sets, else at the top of the file. */
static yaml_mark_t
mark_of(const struct conf_load *st, const char *a, const char *b)
{
    yaml_mark_t none = {0, 0, 0};
    size_t ia = directive_index(a);
    if (st->seen[ia]) {
        return st->marks[ia];
    }
    if (b != NULL) {
        size_t ib = directive_index(b);
        if (st->seen[ib]) {
            return st->marks[ib];
        }
    }
    return none;
}

/* Whether D's value in CFG is one this version has, for an enum of which
 * only one value is not available. */
static bool
value_built(const struct ld_config *cfg, const struct conf_directive *d)
{
    if (d->type != CT_ENUM || d->unbuilt_value == NULL) {
        return false;
    }
    int v = *(const int *)cfield(cfg, d);
    for (const struct conf_enum *e = d->names; e->name != NULL; e++) {
        if (e->value == v) {
            return strcmp(e->name, d->unbuilt_value) != 0;
        }
    }
    return false;
}

/* A setting of a feature this version lacks may be written down, but only
 * at its default: a file that asks for the feature is refused here, so
 * -t, start-up and reload give the same file:line:col answer. Relations
 * between such settings (three Redlock addresses, Sentinels for sentinel
 * mode...) are left for when the feature exists. */
static int
check_unbuilt(struct conf_load *st)
{
    struct ld_config def;
    const struct conf_directive *first = NULL;
    size_t first_i = 0;

    ld_conf_defaults(&def);
    /* Of several, the one nearest the top of the file, as an editor
     * would meet them. */
    for (size_t i = 0; i < conf_ndirectives; i++) {
        const struct conf_directive *d = &conf_directives[i];
        if (d->unbuilt != NULL && st->seen[i] &&
            !conf_value_equal(st->cfg, &def, d) && !value_built(st->cfg, d) &&
            (first == NULL || st->marks[i].index < st->marks[first_i].index)) {
            first = d;
            first_i = i;
        }
    }
    ld_conf_free(&def);
    if (first == NULL) {
        return LD_OK;
    }

    const char *feature = first->unbuilt;
    if (first->type == CT_ENUM) {
        /* "sentinel is not available" says more than the row's feature. */
        int v = *(const int *)cfield(st->cfg, first);
        for (const struct conf_enum *e = first->names; e->name != NULL; e++) {
            if (e->value == v) {
                feature = e->name;
            }
        }
    }
    bool quote = first->type == CT_STRING;
    return conf_error(st, st->marks[first_i], first->name,
                      "%s is not available in this version (only the "
                      "default %s%s%s is accepted)",
                      feature, quote ? "\"" : "",
                      first->type == CT_STRLIST ? "[]" : first->def,
                      quote ? "\"" : "");
}

/* Under lock.layout redisson a lock is the client's own key (as Redisson
 * names it) and lock.prefix names only the semaphores' keys, which go on
 * with "{" after it. An empty prefix, the natural setting beside Java
 * clients, then meets no cache key unless cache.prefix begins with "{"
 * too. */
static bool
redisson_bare(const struct ld_config *c)
{
    return c->lock.layout == LD_LAYOUT_REDISSON && c->lock.prefix[0] == '\0' &&
           c->cache.prefix[0] != '{' && c->cache.prefix[0] != '\0';
}

/* The listeners: who may connect, and with which token. */
static int
check_listen_relations(struct conf_load *st)
{
    const struct ld_config *c = st->cfg;

    if (c->listen.tcp[0] != '\0' && c->listen.auth_token[0] == '\0') {
        char host[256];
        int port;
        if (ld_parse_hostport(c->listen.tcp, host, sizeof(host), &port) ==
                LD_OK &&
            !ld_host_is_loopback(host)) {
            return conf_error(st,
                              mark_of(st, "listen.tcp", "listen.auth_token"),
                              "listen.tcp",
                              "non-loopback tcp requires listen.auth_token");
        }
    }
    /* The same token would make every app that may connect an operator. */
    if (c->listen.admin_token[0] != '\0' &&
        strcmp(c->listen.admin_token, c->listen.auth_token) == 0) {
        return conf_error(
            st, mark_of(st, "listen.admin_token", "listen.auth_token"),
            "listen.admin_token", "must differ from listen.auth_token");
    }
    return LD_OK;
}

/* The Redis backend and what the locks ask of it. */
static int
check_backend_relations(struct conf_load *st)
{
    const struct ld_config *c = st->cfg;

    if (c->redis.mode == LD_REDIS_SENTINEL && c->redis.addresses.count == 0) {
        return conf_error(st, mark_of(st, "redis.mode", "redis.addresses"),
                          "redis.mode",
                          "sentinel mode needs the Sentinels in "
                          "redis.addresses");
    }
    size_t rl = c->lock.redlock.count;
    if (rl > 0 && rl < 3) {
        return conf_error(st, mark_of(st, "lock.redlock", "lock.redlock"),
                          "lock.redlock",
                          "Redlock needs at least 3 instances (a majority "
                          "of 2 survives no loss), got %zu",
                          rl);
    }
    if (rl > 0 && c->lock.wait_replicas > 0) {
        return conf_error(st,
                          mark_of(st, "lock.wait_replicas", "lock.redlock"),
                          "lock.wait_replicas",
                          "cannot be used with lock.redlock (Redlock's "
                          "instances are independent, without replicas)");
    }
    if (c->redis.mode == LD_REDIS_CLUSTER && c->redis.db != 0) {
        return conf_error(st, mark_of(st, "redis.db", "redis.mode"),
                          "redis.db", "must be 0 in cluster mode");
    }
    return LD_OK;
}

/* The near cache's bounds, and the cache's names beside the locks'. */
static int
check_cache_relations(struct conf_load *st)
{
    const struct ld_config *c = st->cfg;

    /* max_bytes 0 keeps nothing, whatever the value bound. */
    if (c->cache.near.enabled && c->cache.near.max_bytes > 0 &&
        c->cache.near.max_value_bytes > c->cache.near.max_bytes) {
        return conf_error(st,
                          mark_of(st, "cache.near.max_value_bytes",
                                  "cache.near.max_bytes"),
                          "cache.near.max_value_bytes",
                          "may not exceed cache.near.max_bytes");
    }
    /* A segment smaller than this has too few buckets and too short a
     * ring to be worth mapping. */
    if (c->cache.near.shared_bytes > 0 &&
        c->cache.near.shared_bytes < LD_NEAR_SHARED_MIN_BYTES) {
        return conf_error(st, mark_of(st, "cache.near.shared_bytes", NULL),
                          "cache.near.shared_bytes",
                          "must be 0 (no shared segment) or at least 65536");
    }
    /* One prefix inside the other would let a cache key name a lock's
     * Redis key (or the reverse), e.g. "leased:" and "leased:lock:". */
    size_t lp = strlen(c->lock.prefix);
    size_t cp = strlen(c->cache.prefix);
    if (strncmp(c->lock.prefix, c->cache.prefix, lp < cp ? lp : cp) == 0 &&
        !redisson_bare(c)) {
        return conf_error(st, mark_of(st, "cache.prefix", "lock.prefix"),
                          "cache.prefix",
                          lp == cp ? "must differ from lock.prefix"
                                   : "must not be a prefix of lock.prefix, "
                                     "nor lock.prefix of it");
    }
    return LD_OK;
}

/* Rules that tie settings together, checked on the final values so that
 * their order in the file does not matter. */
static int
check_relations(struct conf_load *st)
{
    if (check_listen_relations(st) != LD_OK ||
        check_backend_relations(st) != LD_OK ||
        check_cache_relations(st) != LD_OK) {
        return LD_ERR;
    }
    return LD_OK;
}

/* Line and column of byte OFFSET, for reader errors, which libyaml reports
 * by offset only. */
static yaml_mark_t
mark_at_offset(const char *input, size_t len, size_t offset)
{
    yaml_mark_t m = {offset, 0, 0};
    for (size_t i = 0; i < offset && i < len; i++) {
        if (input[i] == '\n') {
            m.line++;
            m.column = 0;
        } else {
            m.column++;
        }
    }
    return m;
}

static int
syntax_error(struct conf_load *st, const yaml_parser_t *p)
{
    const char *problem = p->problem != NULL ? p->problem : "unknown error";

    switch (p->error) {
    case YAML_MEMORY_ERROR:
        snprintf(st->err, st->errlen, "%s: out of memory", st->name);
        return LD_ERR;
    case YAML_READER_ERROR:
        return conf_error(st,
                          mark_at_offset(st->input, st->input_len,
                                         p->problem_offset),
                          NULL, "syntax error: %s", problem);
    default:
        break;
    }
    if (p->context != NULL) {
        return conf_error(st, p->problem_mark, NULL,
                          "syntax error: %s (%s at %zu:%zu)", problem,
                          p->context, p->context_mark.line + 1,
                          p->context_mark.column + 1);
    }
    return conf_error(st, p->problem_mark, NULL, "syntax error: %s", problem);
}

/* A second document would be silently ignored otherwise. */
static bool
only_one_document(struct conf_load *st, yaml_parser_t *parser)
{
    yaml_document_t extra;
    if (!yaml_parser_load(parser, &extra)) {
        syntax_error(st, parser);
        return false;
    }
    yaml_node_t *extra_root = yaml_document_get_root_node(&extra);
    if (extra_root != NULL) {
        conf_error(st, extra.start_mark, NULL,
                   "only one YAML document is allowed");
        yaml_document_delete(&extra);
        return false;
    }
    yaml_document_delete(&extra);
    return true;
}

/* The document's ROOT into the configuration, then the checks of the
 * whole. */
static int
load_root(struct conf_load *st, yaml_node_t *root)
{
    if (root == NULL) {
        return LD_OK; /* empty, or only comments: all defaults */
    }
    if (root->type != YAML_MAPPING_NODE) {
        if (node_is_null(root)) {
            return LD_OK;
        }
        return conf_error(st, root->start_mark, NULL,
                          "expected a mapping of sections at the top, "
                          "got %s",
                          node_kind(root));
    }
    int rc = walk_mapping(st, root, "");
    if (rc == LD_OK) {
        rc = check_unbuilt(st);
    }
    if (rc == LD_OK) {
        rc = check_relations(st);
    }
    return rc;
}

int
ld_conf_load_string(struct ld_config *cfg, const char *yaml, size_t len,
                    const char *name, char *err, size_t errlen)
{
    struct conf_load st;
    yaml_parser_t parser;
    yaml_document_t doc;
    int rc = LD_ERR;

    memset(&st, 0, sizeof(st));
    st.cfg = cfg;
    st.name = name;
    st.input = yaml;
    st.input_len = len;
    st.doc = &doc;
    st.err = err;
    st.errlen = errlen;
    if (errlen > 0) {
        err[0] = '\0';
    }

    if (!yaml_parser_initialize(&parser)) {
        snprintf(err, errlen, "%s: out of memory", name);
        return LD_ERR;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)yaml, len);
    if (!yaml_parser_load(&parser, &doc)) {
        syntax_error(&st, &parser);
        yaml_parser_delete(&parser);
        return LD_ERR;
    }

    if (only_one_document(&st, &parser)) {
        rc = load_root(&st, yaml_document_get_root_node(&doc));
    }

    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}

int
ld_conf_load(struct ld_config *cfg, const char *path, bool missing_ok,
             char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        if (errno == ENOENT && missing_ok) {
            return LD_OK;
        }
        snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return LD_ERR;
    }

    /* Read it whole: reader errors are reported by byte offset, which is
     * turned into a line and column with the text at hand. */
    size_t cap = 8192, len = 0;
    char *buf = ld_xmalloc(cap);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = ld_xrealloc(buf, cap);
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            break;
        }
    }
    if (ferror(f)) {
        snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        free(buf);
        fclose(f);
        return LD_ERR;
    }
    fclose(f);

    int rc = ld_conf_load_string(cfg, buf, len, path, err, errlen);
    free(buf);
    return rc;
}
