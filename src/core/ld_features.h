#ifndef LD_FEATURES_H
#define LD_FEATURES_H

#include "ld_common.h"

#include <jansson.h>

/* The optional parts of the protocol this daemon offers, as hello
 * announces them ("features"). A module adds its name at init when it is
 * built: ld_features_add("rwlock"). A part that is offered only while the
 * configuration enables it (near, early_refresh) adds a test instead,
 * asked at every hello, so a reload applies to the next one. Adding a
 * name twice keeps the first. */
typedef bool ld_feature_on(void);
void ld_features_add(const char *name);
void ld_features_add_if(const char *name, ld_feature_on *on);
/* Is NAME offered now? */
bool ld_features_has(const char *name);
/* A new array of the names offered now, in the order they were added. */
json_t *ld_features_json(void);
/* Forget every name (at exit, and before modules are wired again). */
void ld_features_clear(void);

#endif
