/* The allocation wrappers of ld_mem.h and the out-of-memory abort. It owns no
 * state; it must not log through ld_log (which may need memory itself), and
 * must never hand a NULL back. */
#include "ld_mem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* No logging module here: it may need memory itself. One write(2) of a
 * message built on the stack always works. */
static void LD_NORETURN
oom_abort(const char *msg, int n)
{
    if (n > 0) {
        ssize_t w = write(STDERR_FILENO, msg, (size_t)n);
        (void)w;
    }
    abort();
}

void
ld_oom(size_t size)
{
    char msg[96];
    int n = size != 0
                ? snprintf(msg, sizeof(msg),
                           "leased: out of memory allocating %zu bytes\n",
                           size)
                : snprintf(msg, sizeof(msg),
                           "leased: out of memory in a library allocation\n");
    oom_abort(msg, n);
}

void
ld_oom_in(const char *what)
{
    char msg[128];
    int n = snprintf(msg, sizeof(msg), "leased: out of memory in %.64s\n",
                     what);
    oom_abort(msg, n);
}

void *
ld_xmalloc(size_t size)
{
    void *p = malloc(size != 0 ? size : 1);
    if (p == NULL) {
        ld_oom(size);
    }
    return p;
}

/* glibc's calloc bypasses the per-thread cache that malloc serves small
 * blocks from: a request record costs some 200 instructions that way,
 * against 40 for malloc and a memset. Large blocks still go to calloc,
 * which can skip clearing fresh pages. */
#define CALLOC_SMALL 1024

void *
ld_xcalloc(size_t n, size_t size)
{
    n = n != 0 ? n : 1;
    size = size != 0 ? size : 1;
    if (size <= CALLOC_SMALL / n) {
        void *p = ld_xmalloc(n * size);
        memset(p, 0, n * size);
        return p;
    }
    void *p = calloc(n, size);
    if (p == NULL) {
        ld_oom(n * size);
    }
    return p;
}

void *
ld_xrealloc(void *ptr, size_t size)
{
    void *p = realloc(ptr, size != 0 ? size : 1);
    if (p == NULL) {
        ld_oom(size);
    }
    return p;
}

char *
ld_xstrdup(const char *s)
{
    return ld_xstrndup(s, strlen(s));
}

char *
ld_xstrndup(const char *s, size_t len)
{
    char *p = ld_xmalloc(len + 1);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

void *
ld_xmemdup(const void *p, size_t len)
{
    void *q = ld_xmalloc(len);
    memcpy(q, p, len);
    return q;
}
