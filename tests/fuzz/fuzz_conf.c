/*
 * Fuzz target: the YAML configuration loader. Any input may be refused,
 * but the loader must not crash, leak or hang, and what it accepts must
 * survive the deep copy a reload makes.
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
        struct ld_config copy;
        ld_conf_copy(&copy, &cfg);
        ld_conf_free(&copy);
    }
    ld_conf_free(&cfg);
    return 0;
}
