/* Preloaded into the daemon by check_cache (LD_PRELOAD, through the
 * harness' LEASED_WRAPPER): fdatasync and fsync behave as the file named
 * by $LDSHIM_CTL says, read at every call. No file: as they are.
 * "delay MS": the real call, then MS ms more before it returns (a slow
 * disk). "fail": no sync at all, -1 with EIO (a disk that lost the
 * pages). */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int fdatasync(int fd);
int fsync(int fd);

static int
steered(const char *name, int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, name);
    const char *ctl = getenv("LDSHIM_CTL");
    char mode[16] = "";
    long ms = 0;
    FILE *f = ctl != NULL ? fopen(ctl, "re") : NULL;
    if (f != NULL) {
        if (fscanf(f, "%15s %ld", mode, &ms) < 1) {
            mode[0] = '\0';
        }
        fclose(f);
    }
    if (strcmp(mode, "fail") == 0) {
        errno = EIO;
        return -1;
    }
    if (real == NULL) {
        errno = ENOSYS;
        return -1;
    }
    int rc = real(fd);
    int err = errno;
    if (strcmp(mode, "delay") == 0 && ms > 0) {
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    errno = err;
    return rc;
}

int
fdatasync(int fd)
{
    return steered("fdatasync", fd);
}

int
fsync(int fd)
{
    return steered("fsync", fd);
}
