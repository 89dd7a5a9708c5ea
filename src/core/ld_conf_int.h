#ifndef LD_CONF_INT_H
#define LD_CONF_INT_H

/* Between the two halves of the configuration module, no one else: the
 * directive table and its field access and scalar converters
 * (ld_conf.c), and the YAML loader that walks a document through them
 * (ld_conf_load.c). */

#include "ld_common.h"

/* The including file has ld_conf.h; this header needs only the names, so
 * it points at nothing of the module it serves. */
struct ld_config;
struct ld_strlist;

enum conf_type {
    CT_STRING,
    CT_INT,   /* int field */
    CT_LLONG, /* long long field */
    CT_DOUBLE,
    CT_BOOL,
    CT_ENUM,     /* int-sized enum field, names in the row */
    CT_MODE,     /* mode_t, written as an octal string */
    CT_STRLIST,  /* a YAML sequence of addresses */
    CT_HOSTPORT, /* "host:port" (or more, see the flags) */
    CT_NSLIST,   /* listen.namespaces: a list of mappings (ld_ns_conf.c) */
};

#define F_RELOAD 0x01u   /* SIGHUP may change it */
#define F_EMPTY_OK 0x02u /* hostport: "" disables the listener */
#define F_UNIX_OK 0x04u  /* address: an absolute path is a Unix socket */
#define F_LISTEN 0x08u   /* hostport: port 0 (any free port) is fine */
#define F_NONEMPTY 0x10u /* string: "" is not allowed */
#define F_SUNPATH 0x20u  /* string: must fit a sockaddr_un */
#define F_GROUP 0x40u    /* string: "" or a known group name or gid */

struct conf_enum {
    const char *name;
    int value;
};

struct conf_directive {
    const char *name;
    enum conf_type type;
    size_t offset;
    unsigned flags;
    const char *def; /* default as YAML text; NULL: computed at run time */
    long long min, max;
    double dmin, dmax;
    const struct conf_enum *names; /* NULL-terminated */
    /* Set on the settings of the file format whose feature this version
     * does not have: it names the feature for the error, and any value
     * but the default is refused, by -t, at start and on reload alike,
     * rather than accepted and then ignored. */
    const char *unbuilt;
    /* An enum of which only this value is not available (with
     * UNBUILT); the others are. */
    const char *unbuilt_value;
};

#define CONF_MAX_DIRECTIVES 128

extern const struct conf_directive conf_directives[];
extern const size_t conf_ndirectives;

struct scalar {
    const char *text; /* NUL-terminated by libyaml */
    size_t len;
    bool plain; /* unquoted: may be a number, a bool or null */
};

const struct conf_directive *conf_find_directive(const char *name);

static inline void *
field(struct ld_config *cfg, const struct conf_directive *d)
{
    return (char *)cfg + d->offset;
}

static inline const void *
cfield(const struct ld_config *cfg, const struct conf_directive *d)
{
    return (const char *)cfg + d->offset;
}

void conf_strlist_free(struct ld_strlist *l);
bool conf_value_equal(const struct ld_config *a, const struct ld_config *b,
                      const struct conf_directive *d);
bool conf_is_null(const struct scalar *s);
/* An address to listen on or connect to. */
bool conf_check_address(const struct conf_directive *d, const char *t,
                        char *msg, size_t msglen);
/* Store scalar IN into the field of D, or explain why not. */
bool conf_set_scalar(struct ld_config *cfg, const struct conf_directive *d,
                     const struct scalar *in, char *msg, size_t msglen);
const char *conf_type_noun(const struct conf_directive *d);
#endif
