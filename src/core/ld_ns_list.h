#ifndef LD_NS_LIST_H
#define LD_NS_LIST_H

/* The value of listen.namespaces, as the configuration holds it: types
 * only, so that ld_conf.h can hold one without depending on the modules
 * that parse it (ld_ns_conf.c) and use it (ld_ns.c). */

#include "ld_common.h"

enum ld_ns_kind { LD_NS_UID, LD_NS_GID, LD_NS_TOKEN };

struct ld_ns_entry {
    enum ld_ns_kind kind;
    unsigned id; /* the uid or gid, names resolved when loaded */
    char *token; /* LD_NS_TOKEN */
    size_t token_len;
    char **prefixes; /* at least one */
    size_t nprefixes;
    bool admin;
};

struct ld_ns_list {
    struct ld_ns_entry *items;
    size_t count;
};

#endif
