/*
 * Fuzz target: the YAML configuration loader. Any input may be refused,
 * but the loader must not crash, leak or hang, and what it accepts must
 * go through what start-up and a reload do with it: paths made absolute,
 * a deep copy, the reloadable settings applied to a live config.
 */
#include "ld_conf.h"
#include "ld_log.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Errors come back in ERR; a level above every level keeps the log
     * quiet (ld_log_set_level would keep errors on). */
    ld_log_level = LD_LOG_ERROR + 1;

    struct ld_config cfg;
    char err[512];
    ld_conf_defaults(&cfg);
    if (ld_conf_load_string(&cfg, (const char *)data, size, "fuzz.yml", err,
                            sizeof(err)) == LD_OK) {
        struct ld_config live;
        ld_conf_absolute_paths(&cfg, "/var/lib/leased");
        ld_conf_defaults(&live);
        ld_conf_apply_reload(&live, &cfg);
        ld_log_level = LD_LOG_ERROR + 1; /* the reload applied log.level */
        ld_conf_free(&live);
    }
    ld_conf_free(&cfg);
    return 0;
}
