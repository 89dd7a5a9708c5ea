#ifndef LD_COMMON_H
#define LD_COMMON_H

#include "config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One status convention everywhere: functions that can fail return LD_OK or
 * LD_ERR; the layer that knows the context logs, once. */
#define LD_OK 0
#define LD_ERR (-1)

#define LD_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define LD_UNUSED(x) ((void)(x))

/* The struct that holds MEMBER at PTR: how an embedded link or timer finds
 * its owner without a back pointer. */
#define ld_container_of(ptr, type, member)                                    \
    ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

#if defined(__GNUC__)
#define LD_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define LD_NORETURN __attribute__((noreturn))
#else
#define LD_PRINTF(f, a)
#define LD_NORETURN
#endif

#endif
