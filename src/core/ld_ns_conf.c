/* listen.namespaces: the YAML list of entries into struct ld_ns_list.
 * Every error points at the node it is about, so the loader can print
 * file:line:col like for any other setting.
 *
 * It owns the entries' parsing, copy, comparison and freeing; matching a
 * client against them is the front's, and it must not look at sockets or
 * sessions. */
#include "ld_ns_conf.h"

#include "ld_mem.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ns_parse {
    yaml_document_t *doc;
    char *msg;
    size_t msglen;
    yaml_mark_t *at;
};

static bool LD_PRINTF(3, 4)
    fail(struct ns_parse *p, const yaml_node_t *node, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->msglen, fmt, ap);
    va_end(ap);
    *p->at = node->start_mark;
    return false;
}

static void
entry_free(struct ld_ns_entry *e)
{
    for (size_t i = 0; i < e->nprefixes; i++) {
        free(e->prefixes[i]);
    }
    free(e->prefixes);
    free(e->token);
    memset(e, 0, sizeof(*e));
}

void
ld_ns_list_free(struct ld_ns_list *l)
{
    for (size_t i = 0; i < l->count; i++) {
        entry_free(&l->items[i]);
    }
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

void
ld_ns_list_copy(struct ld_ns_list *dst, const struct ld_ns_list *src)
{
    dst->count = src->count;
    dst->items = NULL;
    if (src->count == 0) {
        return;
    }
    dst->items = ld_xcalloc(src->count, sizeof(*dst->items));
    for (size_t i = 0; i < src->count; i++) {
        const struct ld_ns_entry *s = &src->items[i];
        struct ld_ns_entry *d = &dst->items[i];
        *d = *s;
        if (s->token != NULL) {
            d->token = ld_xmalloc(s->token_len + 1);
            memcpy(d->token, s->token, s->token_len + 1);
        }
        d->prefixes = ld_xcalloc(s->nprefixes, sizeof(*d->prefixes));
        for (size_t j = 0; j < s->nprefixes; j++) {
            d->prefixes[j] = ld_xstrdup(s->prefixes[j]);
        }
    }
}

static bool
entry_equal(const struct ld_ns_entry *a, const struct ld_ns_entry *b)
{
    if (a->kind != b->kind || a->id != b->id || a->admin != b->admin ||
        a->nprefixes != b->nprefixes || a->token_len != b->token_len ||
        (a->token != NULL && memcmp(a->token, b->token, a->token_len) != 0)) {
        return false;
    }
    for (size_t i = 0; i < a->nprefixes; i++) {
        if (strcmp(a->prefixes[i], b->prefixes[i]) != 0) {
            return false;
        }
    }
    return true;
}

bool
ld_ns_list_equal(const struct ld_ns_list *a, const struct ld_ns_list *b)
{
    if (a->count != b->count) {
        return false;
    }
    for (size_t i = 0; i < a->count; i++) {
        if (!entry_equal(&a->items[i], &b->items[i])) {
            return false;
        }
    }
    return true;
}

/* The scalar's text, or NULL (with the error set) when NODE is not a
 * scalar or holds a NUL byte. */
static const char *
scalar_text(struct ns_parse *p, const yaml_node_t *node, const char *key,
            size_t *len)
{
    if (node->type != YAML_SCALAR_NODE) {
        fail(p, node, "%s: expected a scalar", key);
        return NULL;
    }
    const char *t = (const char *)node->data.scalar.value;
    *len = node->data.scalar.length;
    if (strlen(t) != *len) {
        fail(p, node, "%s: must not contain NUL bytes", key);
        return NULL;
    }
    return t;
}

static bool
parse_id(struct ns_parse *p, const yaml_node_t *node, const char *key,
         unsigned *out)
{
    size_t len;
    const char *t = scalar_text(p, node, key, &len);
    char *end;
    if (t == NULL) {
        return false;
    }
    errno = 0;
    long long v = len > 0 && t[0] >= '0' && t[0] <= '9' ? strtoll(t, &end, 10)
                                                        : -1;
    /* (uid_t)-1 means "no change" to the kernel: never an identity. */
    if (v < 0 || errno != 0 || *end != '\0' || v >= (long long)UINT_MAX) {
        return fail(p, node, "%s: must be a number from 0 to %u", key,
                    UINT_MAX - 1);
    }
    *out = (unsigned)v;
    return true;
}

static bool
parse_prefixes(struct ns_parse *p, yaml_node_t *node, struct ld_ns_entry *e)
{
    if (node->type != YAML_SEQUENCE_NODE) {
        return fail(p, node, "prefixes: expected a list of key prefixes");
    }
    yaml_node_item_t *start = node->data.sequence.items.start;
    yaml_node_item_t *top = node->data.sequence.items.top;
    if (top == start) {
        return fail(p, node, "prefixes: must name at least one prefix");
    }
    e->prefixes = ld_xcalloc((size_t)(top - start), sizeof(*e->prefixes));
    for (yaml_node_item_t *it = start; it < top; it++) {
        yaml_node_t *item = yaml_document_get_node(p->doc, *it);
        size_t len;
        const char *t = scalar_text(p, item, "prefixes", &len);
        if (t == NULL) {
            return false;
        }
        e->prefixes[e->nprefixes++] = ld_xstrndup(t, len);
    }
    return true;
}

static bool
parse_user(struct ns_parse *p, const yaml_node_t *v, struct ld_ns_entry *e)
{
    size_t len;
    const char *t = scalar_text(p, v, "user", &len);
    struct passwd *pw = t != NULL ? getpwnam(t) : NULL;
    if (t == NULL) {
        return false;
    }
    if (pw == NULL) {
        return fail(p, v, "user: no such user '%s'", t);
    }
    e->kind = LD_NS_UID;
    e->id = (unsigned)pw->pw_uid;
    return true;
}

static bool
parse_group(struct ns_parse *p, const yaml_node_t *v, struct ld_ns_entry *e)
{
    size_t len;
    const char *t = scalar_text(p, v, "group", &len);
    struct group *gr = t != NULL ? getgrnam(t) : NULL;
    if (t == NULL) {
        return false;
    }
    if (gr == NULL) {
        return fail(p, v, "group: no such group '%s'", t);
    }
    e->kind = LD_NS_GID;
    e->id = (unsigned)gr->gr_gid;
    return true;
}

static bool
parse_token(struct ns_parse *p, const yaml_node_t *v, struct ld_ns_entry *e)
{
    size_t len;
    const char *t = scalar_text(p, v, "token", &len);
    if (t == NULL) {
        return false;
    }
    if (len == 0) {
        return fail(p, v, "token: must not be empty");
    }
    e->kind = LD_NS_TOKEN;
    e->token = ld_xstrndup(t, len);
    e->token_len = len;
    return true;
}

static bool
parse_admin(struct ns_parse *p, const yaml_node_t *v, struct ld_ns_entry *e)
{
    size_t len;
    const char *t = scalar_text(p, v, "admin", &len);
    if (t == NULL) {
        return false;
    }
    if (strcmp(t, "true") != 0 && strcmp(t, "false") != 0) {
        return fail(p, v, "admin: expected true or false");
    }
    e->admin = t[0] == 't';
    return true;
}

/* Does KEY name the entry's identity (of which it has exactly one)? */
static bool
is_identity_key(const char *key)
{
    return strcmp(key, "uid") == 0 || strcmp(key, "gid") == 0 ||
           strcmp(key, "user") == 0 || strcmp(key, "group") == 0 ||
           strcmp(key, "token") == 0;
}

/* Is KEY the key of a pair of the entry before PAIR? */
static bool
key_seen(struct ns_parse *p, const yaml_node_pair_t *start,
         const yaml_node_pair_t *pair, const char *key)
{
    for (const yaml_node_pair_t *prev = start; prev < pair; prev++) {
        yaml_node_t *pk = yaml_document_get_node(p->doc, prev->key);
        if (pk->type == YAML_SCALAR_NODE &&
            strcmp((const char *)pk->data.scalar.value, key) == 0) {
            return true;
        }
    }
    return false;
}

/* One KEY: V pair of an entry into E. */
static bool
parse_field(struct ns_parse *p, const yaml_node_t *k, yaml_node_t *v,
            const char *key, struct ld_ns_entry *e)
{
    if (strcmp(key, "uid") == 0 || strcmp(key, "gid") == 0) {
        e->kind = key[0] == 'u' ? LD_NS_UID : LD_NS_GID;
        return parse_id(p, v, key, &e->id);
    }
    if (strcmp(key, "user") == 0) {
        return parse_user(p, v, e);
    }
    if (strcmp(key, "group") == 0) {
        return parse_group(p, v, e);
    }
    if (strcmp(key, "token") == 0) {
        return parse_token(p, v, e);
    }
    if (strcmp(key, "prefixes") == 0) {
        return parse_prefixes(p, v, e);
    }
    if (strcmp(key, "admin") == 0) {
        return parse_admin(p, v, e);
    }
    return fail(p, k,
                "%s: unknown key (an entry has uid, gid, user, "
                "group or token, prefixes and admin)",
                key);
}

static bool
parse_entry(struct ns_parse *p, yaml_node_t *map, struct ld_ns_entry *e)
{
    const yaml_node_t *ident = NULL, *prefixes = NULL;

    if (map->type != YAML_MAPPING_NODE) {
        return fail(p, map,
                    "each entry must be a mapping such as "
                    "{uid: 1001, prefixes: [\"app:\"]}");
    }
    yaml_node_pair_t *start = map->data.mapping.pairs.start;
    yaml_node_pair_t *top = map->data.mapping.pairs.top;
    for (yaml_node_pair_t *pair = start; pair < top; pair++) {
        yaml_node_t *k = yaml_document_get_node(p->doc, pair->key);
        yaml_node_t *v = yaml_document_get_node(p->doc, pair->value);
        size_t klen;
        const char *key = scalar_text(p, k, "entry", &klen);
        if (key == NULL) {
            return false;
        }
        if (key_seen(p, start, pair, key)) {
            return fail(p, k, "%s: duplicate key", key);
        }
        bool is_ident = is_identity_key(key);
        if (is_ident && ident != NULL) {
            return fail(p, k,
                        "%s: an entry names one identity (uid, gid, user, "
                        "group or token)",
                        key);
        }
        if (!parse_field(p, k, v, key, e)) {
            return false;
        }
        if (is_ident) {
            ident = k;
        }
        if (strcmp(key, "prefixes") == 0) {
            prefixes = v;
        }
    }
    if (ident == NULL) {
        return fail(p, map,
                    "the entry names no identity (uid, gid, user, group or "
                    "token)");
    }
    if (prefixes == NULL) {
        return fail(p, map, "the entry has no prefixes");
    }
    return true;
}

bool
ld_ns_conf_parse(yaml_document_t *doc, yaml_node_t *node,
                 struct ld_ns_list *out, char *msg, size_t msglen,
                 yaml_mark_t *at)
{
    struct ns_parse p = {doc, msg, msglen, at};
    struct ld_ns_list list = {NULL, 0};

    if (node->type == YAML_SCALAR_NODE) {
        const char *t = (const char *)node->data.scalar.value;
        bool null = node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
                    (t[0] == '\0' || strcmp(t, "~") == 0 ||
                     strcmp(t, "null") == 0);
        if (!null) {
            return fail(&p, node, "expected a list of entries");
        }
    } else if (node->type != YAML_SEQUENCE_NODE) {
        return fail(&p, node, "expected a list of entries");
    } else {
        yaml_node_item_t *start = node->data.sequence.items.start;
        yaml_node_item_t *top = node->data.sequence.items.top;
        if (top > start) {
            list.items = ld_xcalloc((size_t)(top - start),
                                    sizeof(*list.items));
        }
        for (yaml_node_item_t *it = start; it < top; it++) {
            yaml_node_t *item = yaml_document_get_node(doc, *it);
            if (!parse_entry(&p, item, &list.items[list.count++])) {
                ld_ns_list_free(&list);
                return false;
            }
        }
    }
    ld_ns_list_free(out);
    *out = list;
    return true;
}
