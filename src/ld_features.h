#ifndef LD_FEATURES_H
#define LD_FEATURES_H

#include "ld_common.h"

#include <jansson.h>

/* The optional parts of the protocol this daemon offers, as hello
 * announces them ("features"). A module adds its name at init when it is
 * built and, where the contract says so, enabled in the configuration:
 * ld_features_add("rwlock"). Adding a name twice keeps one. */
void ld_features_add(const char *name);
bool ld_features_has(const char *name);
/* A new array of the names, in the order they were added. */
json_t *ld_features_json(void);
/* Forget every name (at exit, and before modules are wired again). */
void ld_features_clear(void);

#endif
