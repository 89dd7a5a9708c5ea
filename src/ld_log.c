/* Logging: one line per event, to stderr or syslog.
 *
 * The level test lives in the ld_log() macro so that a disabled debug line
 * costs one comparison and never formats its arguments. */
#include "ld_log.h"

#include "ld_assert.h"

#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>

int ld_log_level = LD_LOG_INFO;

static bool log_to_syslog;

/* Long enough for any line we write on purpose; a longer one is cut rather
 * than split, so that one event stays one line. */
#define LOG_LINE_MAX 4096

static const char *const level_names[] = {
    [LD_LOG_DEBUG] = "debug",
    [LD_LOG_INFO] = "info",
    [LD_LOG_WARN] = "warn",
    [LD_LOG_ERROR] = "error",
};

void
ld_log_open(const char *ident, bool syslog_target)
{
    if (log_to_syslog) {
        closelog();
    }
    log_to_syslog = syslog_target;
    if (syslog_target) {
        /* LOG_NDELAY: connect now, while /dev/log is still reachable,
         * before any chroot or sandboxing a later step may add. */
        openlog(ident != NULL ? ident : "leased", LOG_PID | LOG_NDELAY,
                LOG_DAEMON);
    }
}

void
ld_log_close(void)
{
    if (log_to_syslog) {
        closelog();
        log_to_syslog = false;
    }
}

void
ld_log_set_level(int level)
{
    if (level < LD_LOG_DEBUG) {
        level = LD_LOG_DEBUG;
    } else if (level > LD_LOG_ERROR) {
        level = LD_LOG_ERROR;
    }
    ld_log_level = level;
}

const char *
ld_log_level_name(int level)
{
    if (level < LD_LOG_DEBUG || level > LD_LOG_ERROR) {
        return "unknown";
    }
    return level_names[level];
}

static int
syslog_priority(int level)
{
    switch (level) {
    case LD_LOG_DEBUG:
        return LOG_DEBUG;
    case LD_LOG_INFO:
        return LOG_INFO;
    case LD_LOG_WARN:
        return LOG_WARNING;
    default:
        return LOG_ERR;
    }
}

/* A message is built from our own format strings, but a field may still
 * carry something a client sent (an op name, say). Control characters would
 * let it forge extra log lines, so they are masked. */
static void
sanitize(char *s)
{
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f) {
            *s = '?';
        }
    }
}

void
ld_log_write(int level, const char *fmt, ...)
{
    char msg[LOG_LINE_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sanitize(msg);

    if (log_to_syslog) {
        /* syslog stamps time and host itself. */
        syslog(syslog_priority(level), "level=%s %s", ld_log_level_name(level),
               msg);
        return;
    }

    struct timespec ts;
    struct tm tm;
    char stamp[32];
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);

    /* Format the whole line first and write it with one call, so that lines
     * from several processes sharing stderr do not interleave. */
    char line[LOG_LINE_MAX + 64];
    int n = snprintf(line, sizeof(line), "%s.%03ldZ level=%s %s\n", stamp,
                     ts.tv_nsec / 1000000L, ld_log_level_name(level), msg);
    if (n < 0) {
        return;
    }
    if ((size_t)n >= sizeof(line)) {
        n = (int)sizeof(line) - 1;
        line[n - 1] = '\n';
    }
    fwrite(line, 1, (size_t)n, stderr);
}

void
ld_assert_fail(const char *cond, const char *file, int line, const char *fmt,
               ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ld_log_write(LD_LOG_ERROR, "assertion failed: %s at %s:%d%s%s", cond, file,
                 line, msg[0] != '\0' ? ": " : "", msg);
    abort();
}
