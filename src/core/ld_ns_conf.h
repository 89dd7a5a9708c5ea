#ifndef LD_NS_CONF_H
#define LD_NS_CONF_H

/* listen.namespaces from YAML: a list of mappings, each naming one
 * identity (uid, gid, user, group or token), its prefixes and admin.
 * User and group names are resolved here, so at start and on every
 * reload. */

#include "ld_ns_list.h"

#include <yaml.h>

void ld_ns_list_free(struct ld_ns_list *l);
void ld_ns_list_copy(struct ld_ns_list *dst, const struct ld_ns_list *src);
bool ld_ns_list_equal(const struct ld_ns_list *a, const struct ld_ns_list *b);

/* Parse NODE of DOC (a sequence, or null for none) into OUT (freed and
 * replaced on success, untouched on error). On error returns false with
 * MSG and *AT pointing at the node it is about. */
bool ld_ns_conf_parse(yaml_document_t *doc, yaml_node_t *node,
                      struct ld_ns_list *out, char *msg, size_t msglen,
                      yaml_mark_t *at);

#endif
