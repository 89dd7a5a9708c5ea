/*
 * The names hello announces in "features". A fixed table is enough: the
 * contract closes the list of names (near, rwlock, semaphore, multilock,
 * cancel, stale, early_refresh, admin), so more than a handful means a
 * module adds names it should not.
 *
 * It owns the list only: each module adds its own names at init, and nothing
 * here knows which module has which feature.
 */
#include "ld_features.h"

#include "ld_log.h"

#include <string.h>

#define MAX_FEATURES 16

static struct {
    struct {
        const char *name;
        ld_feature_on *on; /* NULL: always */
    } f[MAX_FEATURES];
    size_t n;
} features_mod;

static bool
offered(size_t i)
{
    return features_mod.f[i].on == NULL || features_mod.f[i].on();
}

void
ld_features_add_if(const char *name, ld_feature_on *on)
{
    for (size_t i = 0; i < features_mod.n; i++) {
        if (strcmp(features_mod.f[i].name, name) == 0) {
            return;
        }
    }
    if (features_mod.n == MAX_FEATURES) {
        log_error("feature table full feature=%s", name);
        return;
    }
    features_mod.f[features_mod.n].name = name;
    features_mod.f[features_mod.n].on = on;
    features_mod.n++;
}

void
ld_features_add(const char *name)
{
    ld_features_add_if(name, NULL);
}

bool
ld_features_has(const char *name)
{
    for (size_t i = 0; i < features_mod.n; i++) {
        if (strcmp(features_mod.f[i].name, name) == 0) {
            return offered(i);
        }
    }
    return false;
}

json_t *
ld_features_json(void)
{
    json_t *a = json_array();
    for (size_t i = 0; i < features_mod.n; i++) {
        if (offered(i)) {
            json_array_append_new(a, json_string(features_mod.f[i].name));
        }
    }
    return a;
}

void
ld_features_clear(void)
{
    features_mod.n = 0;
}
