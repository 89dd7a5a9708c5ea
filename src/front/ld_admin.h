#ifndef LD_ADMIN_H
#define LD_ADMIN_H

#include "ld_common.h"

struct ld_ctx;
struct ld_req;
struct ld_session;

/* Operator ops: lock.list and lock.force_unlock, for people and tools.
 * They are allowed to a session with the admin identity: every session of
 * the Unix socket, and on TCP one whose hello carried listen.admin_token
 * (ld_session.admin). The lock modules (plain, read-write, semaphores)
 * show what they hold through listers and free a lock through the one
 * force handler, so this module needs none of them. */
int ld_admin_init(const struct ld_ctx *ctx);
void ld_admin_free(void);

/* False, with REQ answered unauthorized, when its session may not run an
 * operator op. Dispatch runs it (ld_dispatch_set_admin_check) before
 * every op flagged LD_OP_ADMIN. */
bool ld_admin_check(struct ld_req *req);

/* One lock held through this daemon, as lock.list shows it. */
struct ld_admin_lock {
    const char *key; /* the client's key */
    size_t key_len;
    const char *mode; /* "plain", "read", "write" or "sem" */
    const struct ld_session *sess;
    long long count;   /* hold count, or permits of a semaphore */
    long long ttl_ms;  /* lease left as last confirmed by Redis; -1 unknown */
    long long held_ms; /* since the acquisition */
    long long waiters; /* requests of this daemon waiting for it */
};

/* A listing in progress. A lister visits what its module holds and adds
 * the locks whose key ld_admin_list_wants; it stops when add returns
 * false (the limit is reached). */
struct ld_admin_list;
bool ld_admin_list_wants(const struct ld_admin_list *l, const char *key,
                         size_t len);
bool ld_admin_list_add(struct ld_admin_list *l, const struct ld_admin_lock *e);

typedef void ld_admin_lister(struct ld_admin_list *l);
void ld_admin_add_lister(ld_admin_lister *fn);

/* lock.force_unlock of KEY (validated): delete the lock whatever its
 * holder, publish the wake-up, tell the holders; answers REQ. */
typedef void ld_admin_forcer(struct ld_req *req, const char *key, size_t len);
void ld_admin_set_forcer(ld_admin_forcer *fn);

#endif
