#ifndef LD_OP_H
#define LD_OP_H

/* A row of the op table (ld_dispatch.h): the modules that own ops write
 * the rows, dispatch keeps them, and the modules that check what a flag
 * says (ld_memlimit) read the flags. */

#include "ld_common.h"

struct ld_req;

typedef void ld_handler(struct ld_req *req);

/* What dispatch checks before an op's handler runs follows from the op's
 * flags; an op with none is an app's op that adds no work: it needs an
 * authenticated session, its keys are checked against the session's
 * namespace, and it runs whatever the daemon's memory. */
enum ld_op_flag {
    /* Runs on a session that is not authenticated yet: hello, which
     * authenticates it. */
    LD_OP_NO_AUTH = 1u << 0,
    /* Its fields are never keys: what it is sent is not checked against
     * listen.namespaces (hello's token names the namespace itself). */
    LD_OP_NO_NS = 1u << 1,
    /* An operator op (ld_admin.h): refused to a session without the
     * admin identity; it acts on any key (an operator frees another
     * app's lock), so a namespace entry with admin: true does not have
     * its keys checked. */
    LD_OP_ADMIN = 1u << 2,
    /* Adds work with every request (a cache read or write): refused busy
     * while the daemon is over limits.max_memory_bytes. */
    LD_OP_ADDS_WORK = 1u << 3,
    /* Waits up to its wait_ms, 0 by default (try once): adds work, as
     * above, when wait_ms is given and is not 0. */
    LD_OP_WAITS = 1u << 4,
};

/* One row of the op table: NAME (a string that outlives the daemon) is
 * answered by FN after the checks FLAGS (enum ld_op_flag) call for. */
struct ld_op {
    const char *name;
    ld_handler *fn;
    unsigned flags;
};

#endif
