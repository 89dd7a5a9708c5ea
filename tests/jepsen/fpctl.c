/* The fault-injecting proxy (tests/integration/faultproxy.c) as a process
 * for tests/jepsen/jepsen.py: fpctl UPSTREAM_PORT starts a proxy to
 * 127.0.0.1:UPSTREAM_PORT, prints its port on one line, then applies one
 * mode per line read from stdin (pass, stall, blackhole, drop_up,
 * drop_down) until stdin closes. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../integration/faultproxy.h"

static int
mode_of(const char *s, enum fp_mode *m)
{
    static const struct {
        const char *name;
        enum fp_mode mode;
    } modes[] = {{"pass", FP_PASS},
                 {"stall", FP_STALL},
                 {"blackhole", FP_BLACKHOLE},
                 {"drop_up", FP_DROP_UP},
                 {"drop_down", FP_DROP_DOWN}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        if (strcmp(s, modes[i].name) == 0) {
            *m = modes[i].mode;
            return 0;
        }
    }
    return -1;
}

int
main(int argc, char **argv)
{
    char line[64];
    struct fp *p;
    if (argc != 2) {
        fprintf(stderr, "usage: fpctl UPSTREAM_PORT\n");
        return 2;
    }
    p = fp_start(atoi(argv[1]));
    if (p == NULL) {
        return 1;
    }
    printf("%d\n", fp_port(p));
    fflush(stdout);
    while (fgets(line, sizeof line, stdin) != NULL) {
        enum fp_mode m;
        line[strcspn(line, "\r\n")] = '\0';
        if (mode_of(line, &m) == 0) {
            fp_set_mode(p, m);
        } else {
            fprintf(stderr, "fpctl: unknown mode '%s'\n", line);
        }
    }
    fp_stop(p);
    return 0;
}
