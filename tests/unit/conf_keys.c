/* Prints every configuration key the daemon knows, one per line, for
 * check_docs.sh: the directive table is the source of truth, so a key added
 * to it without docs fails the test suite. A line is "KEY reload" or
 * "KEY restart", followed by " unbuilt" for a setting of a feature this
 * version does not have. */
#include "ld_common.h"

#include "ld_conf.h"

#include <stdio.h>

static void
print_key(const char *dotted, bool reloadable, void *arg)
{
    LD_UNUSED(arg);
    printf("%s %s%s\n", dotted, reloadable ? "reload" : "restart",
           ld_conf_key_available(dotted) ? "" : " unbuilt");
}

int
main(void)
{
    ld_conf_each_key(print_key, NULL);
    return fflush(stdout) == 0 ? 0 : 1;
}
