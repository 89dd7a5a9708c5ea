/* Runs one integration test program against a Redis Cluster: starts 3
 * masters and 3 replicas (redis-cli --cluster create, free loopback
 * ports), names every node in $LD_TEST_CLUSTER, runs the program and
 * stops the cluster, by pid, however the program ended. The harness
 * then puts the program's cases on the cluster (see h_on_cluster in
 * harness.h), so the lock and cache scenarios are shared, not copied.
 *
 * Usage: run_on_cluster FILE, where FILE (a .cluster test of make check)
 * holds the program's path relative to the build directory on its first
 * line that is neither empty nor a comment; or run_on_cluster -- PROGRAM
 * [ARGS...]. Exits with the program's status. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_cluster cl;
static volatile sig_atomic_t child;

/* A runner stopped by make's timeout or ^C stops its program first; the
 * atexit handler of the harness then stops the cluster's nodes. */
static void
on_signal(int sig)
{
    if (child > 0) {
        kill(child, sig);
    }
    _exit(128 + sig);
}

/* The program named in FILE, resolved against $LD_BUILDDIR. */
static int
program_of(const char *file, char *out, size_t len)
{
    char line[512];
    FILE *f = fopen(file, "r");
    const char *top = getenv("LD_BUILDDIR");

    if (f == NULL) {
        fprintf(stderr, "run_on_cluster: %s: %s\n", file, strerror(errno));
        return -1;
    }
    while (fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] != '\0' && line[0] != '#') {
            fclose(f);
            snprintf(out, len, "%s%s%s", top != NULL ? top : ".", "/", line);
            return 0;
        }
    }
    fclose(f);
    fprintf(stderr, "run_on_cluster: %s names no program\n", file);
    return -1;
}

int
main(int argc, char **argv)
{
    char prog[1024], env[H_CLUSTER_MAX * 24] = "";
    char *const *args;
    char *one[2] = {prog, NULL};
    int status;
    long long t0 = h_now_ms();

    if (argc >= 3 && strcmp(argv[1], "--") == 0) {
        args = argv + 2;
    } else if (argc == 2 && program_of(argv[1], prog, sizeof prog) == 0) {
        args = one;
    } else {
        fprintf(stderr, "usage: run_on_cluster FILE | -- PROGRAM [ARGS]\n");
        return 2;
    }
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    signal(SIGHUP, on_signal);
    if (h_cluster_start(&cl, 3) != 0) {
        fprintf(stderr, "run_on_cluster: the cluster did not start\n");
        return 99;
    }
    for (int i = 0; i < cl.n; i++) {
        size_t used = strlen(env);
        snprintf(env + used, sizeof env - used, "%s127.0.0.1:%d",
                 i > 0 ? "," : "", cl.node[i].port);
    }
    setenv("LD_TEST_CLUSTER", env, 1);
    fprintf(stderr, "run_on_cluster: cluster %s up in %lld ms\n", env,
            h_now_ms() - t0);
    fflush(NULL);

    pid_t pid = fork();
    if (pid < 0) {
        perror("run_on_cluster: fork");
        h_cluster_stop(&cl);
        return 99;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execv(args[0], args);
        fprintf(stderr, "run_on_cluster: exec %s: %s\n", args[0],
                strerror(errno));
        _exit(127);
    }
    child = pid;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    child = 0;
    h_cluster_stop(&cl);
    fprintf(stderr, "run_on_cluster: %s done in %lld ms\n", args[0],
            h_now_ms() - t0);
    if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
    }
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 99;
}
