#ifndef LD_MEM_H
#define LD_MEM_H

#include "ld_common.h"

/* One out-of-memory policy, Redis' zmalloc's: the daemon's own small
 * allocations never fail; when the system has no memory left they log
 * the size and abort. Code that calls these has no OOM branch to test.
 * Only buffers whose size a client or Redis chooses are allocated with
 * the plain functions and fail gracefully (the request gets an error, the
 * session may close). */
void *ld_xmalloc(size_t size);
void *ld_xcalloc(size_t n, size_t size);
void *ld_xrealloc(void *ptr, size_t size);
char *ld_xstrdup(const char *s);
/* LEN bytes of S and a NUL; S need not be NUL-terminated. */
char *ld_xstrndup(const char *s, size_t len);
void *ld_xmemdup(const void *p, size_t len);

/* The abort itself. SIZE is what the failed allocation asked for; 0 when
 * it is not known (a library's allocation). */
void ld_oom(size_t size) LD_NORETURN;
/* The abort for an allocation made by a library (jansson, libevent) that
 * reports failure by returning NULL: WHAT names the call that failed. */
void ld_oom_in(const char *what) LD_NORETURN;

#endif
