#ifndef LD_ASSERT_H
#define LD_ASSERT_H

#include "ld_common.h"

/* Invariants that would otherwise corrupt state silently (list
 * membership, reference counts, reply order, state transitions). On in
 * debug and sanitizer builds (configure --enable-debug or
 * --enable-sanitizers define LD_DEBUG), compiled out otherwise; the
 * condition must have no side effects. A failure logs file, line, the
 * condition and the message, then aborts. */
void ld_assert_fail(const char *cond, const char *file, int line,
                    const char *fmt, ...) LD_PRINTF(4, 5) LD_NORETURN;

#ifdef LD_DEBUG
#define LD_ASSERT(cond)                                                       \
    ((cond) ? (void)0 : ld_assert_fail(#cond, __FILE__, __LINE__, "%s", ""))
#define LD_ASSERTF(cond, ...)                                                 \
    ((cond) ? (void)0 : ld_assert_fail(#cond, __FILE__, __LINE__, __VA_ARGS__))
#else
#define LD_ASSERT(cond) ((void)0)
#define LD_ASSERTF(cond, ...) ((void)0)
#endif

#endif
