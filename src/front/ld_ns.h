#ifndef LD_NS_H
#define LD_NS_H

/* Namespaces per local user (listen.namespaces): which key prefixes a
 * Unix peer (by SO_PEERCRED) or a TCP client (by the token of its hello)
 * may use. The list itself is part of the configuration (ld_ns_list.h,
 * parsed by ld_ns_conf.c); this module matches sessions against the live list and checks
 * the keys of a request before its op runs. */

#include "ld_common.h"

struct ld_ctx;
struct ld_req;
struct ld_session;

int ld_ns_init(const struct ld_ctx *ctx);

/* Whether the auth of S's hello is the namespaces' business: they are
 * configured and S came over TCP. Then ld_ns_hello_auth decides: the
 * listen.auth_token (unrestricted) or an entry's token (that entry's
 * namespace), compared in constant time; false for any other. */
bool ld_ns_takes_auth(struct ld_session *s);
bool ld_ns_hello_auth(struct ld_session *s, const char *auth, size_t len);
/* After a hello with AUTH was accepted, with or without namespaces: the
 * identity S keeps, so that a reload that adds namespaces finds it
 * (listen.auth_token stays unrestricted, an entry's token names its
 * entry in the list of the day). */
void ld_ns_hello_token(struct ld_session *s, const char *auth, size_t len);

/* Before an op runs: every key REQ names ("key", each of "keys") must lie
 * under a prefix of the session's namespace, unless OPERATOR_OP (its op
 * is an operator op) and the session's entry has admin: true. Returns
 * LD_OK, or answers unauthorized with the first key outside it and
 * returns LD_ERR (REQ is then consumed). Without namespaces, always
 * LD_OK. */
int ld_ns_check(struct ld_req *req, bool operator_op);

/* Whether S may run the operator ops as far as namespaces go: none are
 * configured, S is unrestricted, or its entry has admin: true. (On TCP
 * the admin identity of hello is needed as well; see ld_admin.) */
bool ld_ns_may_operate(struct ld_session *s);

/* The entry of listen.namespaces (index into the live list) S belongs to,
 * for what S may map of the shared near cache: LD_OK with *INDEX -1 when
 * S is unrestricted (no namespaces, or a client the namespaces do not
 * restrict), LD_OK with the entry's index, or LD_ERR when S has no entry
 * and namespaces are configured. */
int ld_ns_entry_index(struct ld_session *s, long *index);

/* Whether KEY lies under one of E's prefixes, as ld_ns_check decides. */
struct ld_ns_entry;
bool ld_ns_entry_allows(const struct ld_ns_entry *e, const char *key,
                        size_t len);

#endif
