/* Logging: one line per event, to stderr or syslog.
 *
 * The level test lives in the ld_log() macro so that a disabled debug line
 * costs one comparison and never formats its arguments.
 *
 * A line is logfmt: level=L msg="free text" key=value..., the free text
 * being the message up to its first key=value field. On stderr it starts
 * with a UTC timestamp, except when stderr is systemd's journal
 * ($JOURNAL_STREAM names it): the journal stamps lines itself and takes
 * the priority from a "<N>" prefix (sd-daemon(3)), without which every
 * line would be filed at the default, info.
 *
 * It owns the output and the level; a line is built on the stack, so it must
 * not allocate (an out-of-memory path may still log). */
#include "ld_log.h"

#include "ld_assert.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <sys/stat.h>

int ld_log_level = LD_LOG_INFO;

static struct {
    bool to_syslog;
    bool to_journal;
} log_mod;

/* Long enough for any line we write on purpose; a longer one is cut rather
 * than split, so that one event stays one line. */
#define LOG_LINE_MAX 4096

static const char *const level_names[] = {
    [LD_LOG_DEBUG] = "debug",
    [LD_LOG_INFO] = "info",
    [LD_LOG_WARN] = "warn",
    [LD_LOG_ERROR] = "error",
};

/* systemd sets JOURNAL_STREAM to "DEV:INODE" of the stream it connected
 * stderr to; a child whose stderr was redirected elsewhere inherits the
 * variable, hence the comparison. */
static bool
stderr_is_journal(void)
{
    const char *env = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    char tail;

    if (env == NULL || sscanf(env, "%llu:%llu%c", &dev, &ino, &tail) != 2 ||
        fstat(STDERR_FILENO, &st) != 0) {
        return false;
    }
    return (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}

void
ld_log_open(const char *ident, bool syslog_target)
{
    if (log_mod.to_syslog) {
        closelog();
    }
    log_mod.to_syslog = syslog_target;
    log_mod.to_journal = !syslog_target && stderr_is_journal();
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
    if (log_mod.to_syslog) {
        closelog();
        log_mod.to_syslog = false;
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

/* Whether S, at the start of a word, is a key=value field: a key of
 * letters, digits, '_', '.' and '-' that starts with a letter or '_'. */
static bool
field_at(const char *s)
{
    if (!isalpha((unsigned char)*s) && *s != '_') {
        return false;
    }
    for (s++;
         isalnum((unsigned char)*s) || *s == '_' || *s == '.' || *s == '-';
         s++) {
    }
    return *s == '=';
}

/* Where the first key=value field of MSG starts (its end when none). */
static const char *
first_field(const char *msg)
{
    for (const char *p = msg;; p++) {
        if ((p == msg || p[-1] == ' ') && field_at(p)) {
            return p;
        }
        if (*p == '\0') {
            return p;
        }
    }
}

/* Append to OUT (SIZE bytes, *LEN used) what fits, escaping '"' and '\\'
 * when QUOTE: a line that is too long is cut, never split. */
static void
append(char *out, size_t size, size_t *len, const char *s, size_t n,
       bool quote)
{
    for (size_t i = 0; i < n && *len + 2 < size; i++) {
        if (quote && (s[i] == '"' || s[i] == '\\')) {
            out[(*len)++] = '\\';
        }
        out[(*len)++] = s[i];
    }
    out[*len] = '\0';
}

/* level=L msg="TEXT" FIELDS of MSG into OUT, after the PREFIX already
 * there (*LEN bytes). */
static void
format_fields(char *out, size_t size, size_t *len, int level, const char *msg)
{
    const char *fields = first_field(msg);
    const char *name = ld_log_level_name(level);
    size_t text = (size_t)(fields - msg);

    while (text > 0 && msg[text - 1] == ' ') {
        text--;
    }
    append(out, size, len, "level=", 6, false);
    append(out, size, len, name, strlen(name), false);
    if (text > 0) {
        append(out, size, len, " msg=\"", 6, false);
        append(out, size, len, msg, text, true);
        append(out, size, len, "\"", 1, false);
    }
    if (*fields != '\0') {
        append(out, size, len, " ", 1, false);
        append(out, size, len, fields, strlen(fields), false);
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

/* The stderr prefix: "<N>" for the journal, else a UTC timestamp. */
static size_t
line_prefix(char *out, size_t size, int level)
{
    struct timespec ts;
    struct tm tm;
    char stamp[32];
    int n;

    if (log_mod.to_journal) {
        /* sd-daemon(3)'s prefixes are the syslog priorities. */
        n = snprintf(out, size, "<%d>", syslog_priority(level));
    } else {
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
        n = snprintf(out, size, "%s.%03ldZ ", stamp, ts.tv_nsec / 1000000L);
    }
    return n > 0 && (size_t)n < size ? (size_t)n : 0;
}

void
ld_log_write(int level, const char *fmt, ...)
{
    char msg[LOG_LINE_MAX];
    /* Room for the prefix and for escaping quotes in the free text. */
    char line[LOG_LINE_MAX + 256];
    size_t len = 0;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sanitize(msg);

    if (log_mod.to_syslog) {
        /* syslog stamps time and host itself. */
        format_fields(line, sizeof(line), &len, level, msg);
        syslog(syslog_priority(level), "%s", line);
        return;
    }
    len = line_prefix(line, sizeof(line), level);
    format_fields(line, sizeof(line) - 1, &len, level, msg);
    line[len++] = '\n';
    /* One write per line, so that lines from several processes sharing
     * stderr do not interleave. */
    fwrite(line, 1, len, stderr);
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
