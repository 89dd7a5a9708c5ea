/* The fault-injecting proxy (tests/integration/faultproxy.c) as a process
 * for tests/jepsen/jepsen.py:
 *   fpctl UPSTREAM_PORT
 * starts a proxy to 127.0.0.1:UPSTREAM_PORT and prints its port on one
 * line;
 *   fpctl -a LISTEN_IP UPSTREAM_IP PORT...
 * starts one proxy per PORT, listening on LISTEN_IP:PORT and forwarding to
 * UPSTREAM_IP:PORT (each node of a Redis Cluster at the address the
 * cluster announces, for a daemon that must reach them all through
 * faults), and prints each port on a line. Then it applies one mode per
 * line read from stdin (pass, stall, blackhole, drop_up, drop_down) to
 * every proxy at once, until stdin closes. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../integration/faultproxy.h"

#define FPCTL_MAX 16

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
    struct fp *p[FPCTL_MAX];
    int n = 0;
    if (argc == 2) {
        p[n] = fp_start(atoi(argv[1]));
        if (p[n] == NULL) {
            return 1;
        }
        n++;
    } else if (argc >= 5 && argc - 4 < FPCTL_MAX &&
               strcmp(argv[1], "-a") == 0) {
        for (int i = 4; i < argc; i++) {
            int port = atoi(argv[i]);
            p[n] = fp_start_at(argv[2], port, argv[3], port);
            if (p[n] == NULL) {
                fprintf(stderr, "fpctl: cannot listen on %s:%d\n", argv[2],
                        port);
                return 1;
            }
            n++;
        }
    } else {
        fprintf(stderr, "usage: fpctl UPSTREAM_PORT\n"
                        "       fpctl -a LISTEN_IP UPSTREAM_IP PORT...\n");
        return 2;
    }
    for (int i = 0; i < n; i++) {
        printf("%d\n", fp_port(p[i]));
    }
    fflush(stdout);
    while (fgets(line, sizeof line, stdin) != NULL) {
        enum fp_mode m;
        line[strcspn(line, "\r\n")] = '\0';
        if (mode_of(line, &m) == 0) {
            for (int i = 0; i < n; i++) {
                fp_set_mode(p[i], m);
            }
        } else {
            fprintf(stderr, "fpctl: unknown mode '%s'\n", line);
        }
    }
    for (int i = 0; i < n; i++) {
        fp_stop(p[i]);
    }
    return 0;
}
