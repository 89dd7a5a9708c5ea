/*
 * The names hello announces in "features". A fixed table is enough: the
 * contract closes the list of names (near, rwlock, semaphore, multilock,
 * cancel, stale, early_refresh, admin), so more than a handful means a
 * module adds names it should not.
 */
#include "ld_features.h"

#include "ld_log.h"

#include <string.h>

#define MAX_FEATURES 16

static struct {
    const char *names[MAX_FEATURES];
    size_t n;
} features_mod;

void
ld_features_add(const char *name)
{
    if (ld_features_has(name)) {
        return;
    }
    if (features_mod.n == MAX_FEATURES) {
        log_error("feature table full feature=%s", name);
        return;
    }
    features_mod.names[features_mod.n++] = name;
}

bool
ld_features_has(const char *name)
{
    for (size_t i = 0; i < features_mod.n; i++) {
        if (strcmp(features_mod.names[i], name) == 0) {
            return true;
        }
    }
    return false;
}

json_t *
ld_features_json(void)
{
    json_t *a = json_array();
    for (size_t i = 0; i < features_mod.n; i++) {
        json_array_append_new(a, json_string(features_mod.names[i]));
    }
    return a;
}

void
ld_features_clear(void)
{
    features_mod.n = 0;
}
