#ifndef LD_UNIT_H
#define LD_UNIT_H

/* What every unit test program's main does: run its suite the way make
 * check wants it (CK_ENV, so CK_VERBOSITY and CK_RUN_CASE apply) and turn
 * the outcome into the exit status. */

#include <check.h>
#include <stdlib.h>

static inline int
ld_unit_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
