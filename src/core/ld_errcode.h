#ifndef LD_ERRCODE_H
#define LD_ERRCODE_H

#include "ld_common.h"

/* The closed list of error codes of the wire contract. */
#define LD_ERRCODES(X)                                                        \
    X(BAD_REQUEST, "bad_request")                                             \
    X(UNKNOWN_OP, "unknown_op")                                               \
    X(TOO_LARGE, "too_large")                                                 \
    X(UNAUTHORIZED, "unauthorized")                                           \
    X(NOT_HELD, "not_held")                                                   \
    X(REDIS_UNAVAILABLE, "redis_unavailable")                                 \
    X(BUSY, "busy")                                                           \
    X(WRONG_TYPE, "wrong_type")                                               \
    X(SHUTTING_DOWN, "shutting_down")                                         \
    X(INTERNAL, "internal")

enum ld_errcode {
#define LD_ERR_ENUM(sym, name) LD_E_##sym,
    LD_ERRCODES(LD_ERR_ENUM)
#undef LD_ERR_ENUM
        LD_E__COUNT
};

/* The wire name of CODE ("bad_request"), "internal" for anything else. */
static inline const char *
ld_errcode_name(int code)
{
    static const char *const names[] = {
#define LD_ERR_NAME(sym, name) name,
        LD_ERRCODES(LD_ERR_NAME)
#undef LD_ERR_NAME
    };
    if (code < 0 || code >= LD_E__COUNT) {
        return "internal";
    }
    return names[code];
}

#endif
