#ifndef LD_LOG_H
#define LD_LOG_H

#include "ld_common.h"

enum ld_log_level { LD_LOG_DEBUG, LD_LOG_INFO, LD_LOG_WARN, LD_LOG_ERROR };

/* The level is checked before anything is formatted. */
extern int ld_log_level;

void ld_log_open(const char *ident, bool syslog_target);
void ld_log_set_level(int level);
const char *ld_log_level_name(int level);
void ld_log_close(void);

/* One line per event: 2026-01-02T03:04:05.678Z level=info msg="text" k=v
 * ("<6>level=info ..." when stderr is systemd's journal). Never log values
 * or secrets. */
void ld_log_write(int level, const char *fmt, ...) LD_PRINTF(2, 3);

#define ld_log(lvl, ...)                                                      \
    do {                                                                      \
        if ((lvl) >= ld_log_level) {                                          \
            ld_log_write((lvl), __VA_ARGS__);                                 \
        }                                                                     \
    } while (0)
#define log_debug(...) ld_log(LD_LOG_DEBUG, __VA_ARGS__)
#define log_info(...) ld_log(LD_LOG_INFO, __VA_ARGS__)
#define log_warn(...) ld_log(LD_LOG_WARN, __VA_ARGS__)
#define log_error(...) ld_log(LD_LOG_ERROR, __VA_ARGS__)

#endif
