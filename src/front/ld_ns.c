/* Namespaces: who a session is (peer credentials of a Unix client, the
 * token of a TCP client's hello) and whether the keys of its request lie
 * under the prefixes of its entry in listen.namespaces.
 *
 * The session keeps only its identity; the entry is looked up in the live
 * list on every request that names a key, so a reload that changes the
 * list applies to the next request of every session. The lists are short
 * (one entry per app on the host), and the lookup is a scan.
 *
 * This module owns the identity (the session's ns_state) and the key
 * check. The list belongs to the configuration and is only read here;
 * hello's other tokens, and whether an op is checked at all (its flags),
 * are dispatch's. */
#include "ld_ns.h"

#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_proto.h"
#include "ld_session.h"
#include "ld_util.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum ns_token { NS_TOKEN_NONE, NS_TOKEN_FULL, NS_TOKEN_ENTRY };

struct ns_sess {
    bool is_unix;
    bool have_cred;
    uid_t uid;
    gid_t gid;
    enum ns_token tok;
    char *token; /* NS_TOKEN_ENTRY: the token it authenticated with */
    size_t token_len;
};

static struct {
    const struct ld_ctx *ctx;
} ns_mod;

static void
ns_close(struct ld_session *s)
{
    struct ns_sess *st = s->ns_state;
    if (st != NULL) {
        free(st->token);
        free(st);
        s->ns_state = NULL;
    }
}

int
ld_ns_init(const struct ld_ctx *ctx)
{
    ns_mod.ctx = ctx;
    ld_session_on_close(ns_close);
    return LD_OK;
}

/* The session's identity, made on first use. SO_PEERCRED reports the
 * credentials the peer had when it connected, whenever it is asked, so
 * asking at the first request is asking at accept. */
static struct ns_sess *
sess_state(struct ld_session *s)
{
    struct ns_sess *st = s->ns_state;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);

    if (st != NULL) {
        return st;
    }
    st = ld_xcalloc(1, sizeof(*st));
    if (getsockname(s->fd, (struct sockaddr *)&ss, &sl) == 0 &&
        ss.ss_family == AF_UNIX) {
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        st->is_unix = true;
        if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
            st->have_cred = true;
            st->uid = cred.uid;
            st->gid = cred.gid;
        }
    }
    s->ns_state = st;
    return st;
}

static const struct ld_ns_list *
live_list(void)
{
    return &ns_mod.ctx->cfg->listen.namespaces;
}

bool
ld_ns_takes_auth(struct ld_session *s)
{
    return live_list()->count > 0 && !sess_state(s)->is_unix;
}

/* The entry of token T, comparing every token entry in constant time. */
static const struct ld_ns_entry *
token_entry(const struct ld_ns_list *l, const char *t, size_t len)
{
    const struct ld_ns_entry *found = NULL;
    for (size_t i = 0; i < l->count; i++) {
        const struct ld_ns_entry *e = &l->items[i];
        if (e->kind == LD_NS_TOKEN &&
            ld_secure_equal(t, len, e->token, e->token_len) && found == NULL) {
            found = e;
        }
    }
    return found;
}

/* Whether AUTH is listen.auth_token; never when that is unset, whatever
 * AUTH is (an empty one included). */
static bool
full_token(const char *auth, size_t len)
{
    const char *full = ns_mod.ctx->cfg->listen.auth_token;
    return full[0] != '\0' && ld_secure_equal(auth, len, full, strlen(full));
}

bool
ld_ns_hello_auth(struct ld_session *s, const char *auth, size_t len)
{
    bool is_full = full_token(auth, len);
    bool is_entry = token_entry(live_list(), auth, len) != NULL;

    if (!is_full && !is_entry) {
        return false;
    }
    s->authed = true;
    return true;
}

void
ld_ns_hello_token(struct ld_session *s, const char *auth, size_t len)
{
    struct ns_sess *st = sess_state(s);
    bool is_full = full_token(auth, len);

    free(st->token);
    st->token = NULL;
    st->token_len = 0;
    st->tok = is_full ? NS_TOKEN_FULL : NS_TOKEN_ENTRY;
    if (!is_full) {
        st->token = ld_xmalloc(len + 1);
        memcpy(st->token, auth, len);
        st->token[len] = '\0';
        st->token_len = len;
    }
}

/* The session's entry, or NULL; *FULL when it is unrestricted: root and
 * the daemon's own user on Unix, listen.auth_token and the admin identity
 * (listen.admin_token) on TCP. */
static const struct ld_ns_entry *
identify(struct ld_session *s, const struct ld_ns_list *l, bool *full)
{
    struct ns_sess *st = sess_state(s);
    *full = false;
    if (st->is_unix) {
        if (!st->have_cred) {
            return NULL;
        }
        if (st->uid == 0 || st->uid == geteuid()) {
            *full = true;
            return NULL;
        }
        for (size_t i = 0; i < l->count; i++) {
            if (l->items[i].kind == LD_NS_UID &&
                l->items[i].id == (unsigned)st->uid) {
                return &l->items[i];
            }
        }
        for (size_t i = 0; i < l->count; i++) {
            if (l->items[i].kind == LD_NS_GID &&
                l->items[i].id == (unsigned)st->gid) {
                return &l->items[i];
            }
        }
        return NULL;
    }
    if (st->tok == NS_TOKEN_FULL || s->admin) {
        *full = true;
        return NULL;
    }
    if (st->tok == NS_TOKEN_ENTRY) {
        return token_entry(l, st->token, st->token_len);
    }
    return NULL;
}

bool
ld_ns_entry_allows(const struct ld_ns_entry *e, const char *key, size_t len)
{
    if (e == NULL) {
        return false;
    }
    for (size_t i = 0; i < e->nprefixes; i++) {
        size_t plen = strlen(e->prefixes[i]);
        if (plen <= len && memcmp(key, e->prefixes[i], plen) == 0) {
            return true;
        }
    }
    return false;
}

static int
refuse(struct ld_req *req, const struct ld_ns_entry *e, const char *k,
       size_t len)
{
    log_debug("namespace refused session=%s op=%s entry=%s", req->sess->name,
              req->op, e != NULL ? "outside" : "none");
    ld_reply_error_extra(req, LD_E_UNAUTHORIZED,
                         json_pack("{s:s%}", "key", k, len),
                         e != NULL ? "key is outside this client's namespace"
                                   : "this client has no namespace "
                                     "(listen.namespaces)");
    return LD_ERR;
}

bool
ld_ns_may_operate(struct ld_session *s)
{
    const struct ld_ns_list *l = live_list();
    if (l->count == 0) {
        return true;
    }
    bool full;
    const struct ld_ns_entry *e = identify(s, l, &full);
    return full || (e != NULL && e->admin);
}

/* The fields in which a request names keys. */
struct ns_names {
    struct ld_rval key, keys, entries, filter, bloom;
};

/* Reads them; false when the request names no key. */
static bool
names_read(struct ld_req *req, struct ns_names *n)
{
    ld_req_get(req, "key", &n->key);
    ld_req_get(req, "keys", &n->keys);
    /* cache.mset names its keys in the objects of "entries". */
    ld_req_get(req, "entries", &n->entries);
    /* A Bloom filter's name is a key (bloom.*'s "filter", cache.get's
     * "bloom"): its Redis keys are named after it. */
    ld_req_get(req, "filter", &n->filter);
    ld_req_get(req, "bloom", &n->bloom);
    return n->key.kind == LD_RV_STR || json_is_array(n->keys.j) ||
           json_is_array(n->entries.j) || n->filter.kind == LD_RV_STR ||
           n->bloom.kind == LD_RV_STR;
}

/* Whether E refuses the key K names; anything but a string is left to
 * the op to refuse as malformed. */
static bool
refuses_json(const struct ld_ns_entry *e, json_t *k)
{
    return json_is_string(k) &&
           !ld_ns_entry_allows(e, json_string_value(k), json_string_length(k));
}

/* Every key named, in the order of the fields, against E: the first one
 * refused is the one the error names. */
static int
names_check(struct ld_req *req, const struct ld_ns_entry *e,
            const struct ns_names *n)
{
    const struct ld_rval *strs[] = {&n->key, &n->filter, &n->bloom};
    size_t i;
    json_t *k;

    for (i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        const struct ld_rval *v = strs[i];
        if (v->kind == LD_RV_STR && !ld_ns_entry_allows(e, v->s, v->len)) {
            return refuse(req, e, v->s, v->len);
        }
    }
    if (json_is_array(n->keys.j)) {
        json_array_foreach(n->keys.j, i, k)
        {
            if (refuses_json(e, k)) {
                return refuse(req, e, json_string_value(k),
                              json_string_length(k));
            }
        }
    }
    if (json_is_array(n->entries.j)) {
        json_array_foreach(n->entries.j, i, k)
        {
            json_t *ek = json_object_get(k, "key");
            if (refuses_json(e, ek)) {
                return refuse(req, e, json_string_value(ek),
                              json_string_length(ek));
            }
        }
    }
    return LD_OK;
}

int
ld_ns_check(struct ld_req *req, bool operator_op)
{
    const struct ld_ns_list *l = live_list();
    struct ns_names n;
    const struct ld_ns_entry *e;
    bool full;

    if (l->count == 0) {
        return LD_OK;
    }
    if (!names_read(req, &n)) {
        return LD_OK; /* names no key; a malformed one is the op's */
    }
    e = identify(req->sess, l, &full);
    /* The operator ops act on any key (an operator frees another app's
     * lock): for an admin entry their keys are not checked. */
    if (full || (e != NULL && e->admin && operator_op)) {
        return LD_OK;
    }
    return names_check(req, e, &n);
}

int
ld_ns_entry_index(struct ld_session *s, long *index)
{
    const struct ld_ns_list *l = live_list();
    bool full;
    *index = -1;
    if (l->count == 0) {
        return LD_OK;
    }
    const struct ld_ns_entry *e = identify(s, l, &full);
    if (full) {
        return LD_OK;
    }
    if (e == NULL) {
        return LD_ERR;
    }
    *index = (long)(e - l->items);
    return LD_OK;
}
