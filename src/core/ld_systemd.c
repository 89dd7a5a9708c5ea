/* The two systemd protocols leased speaks, written out by hand so that the
 * daemon needs no libsystemd: readiness notification ($NOTIFY_SOCKET, see
 * sd_notify(3)) and socket activation ($LISTEN_PID/$LISTEN_FDS, see
 * sd_listen_fds(3)). Outside systemd the variables are absent and both
 * functions do nothing.
 *
 * It owns the two protocols only; what to announce, and when, is the
 * server's. */

#include "ld_systemd.h"

#include "ld_mem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* The first passed descriptor (SD_LISTEN_FDS_START). */
#define LD_LISTEN_FDS_START 3

int
ld_systemd_notify(const char *state)
{
    struct sockaddr_un sa;
    const char *path;
    size_t plen, slen;
    socklen_t alen;
    ssize_t n;
    int fd, saved;

    path = getenv("NOTIFY_SOCKET");
    if (path == NULL || path[0] == '\0') {
        return LD_OK;
    }
    plen = strlen(path);
    if ((path[0] != '/' && path[0] != '@') || plen >= sizeof(sa.sun_path)) {
        errno = EINVAL;
        return LD_ERR;
    }

    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, plen);
    /* "@name" is a socket in the abstract namespace: a NUL first byte, and
     * the name is exactly the bytes that follow, so the address length
     * must not count any padding (a trailing NUL would be part of the
     * name and address a different socket). */
    if (path[0] == '@') {
        sa.sun_path[0] = '\0';
    }
    alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen);

    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return LD_ERR;
    }
    /* A blocking send, as libsystemd does: the manager drains its socket
     * promptly, and a READY=1 lost to a full queue would make systemd
     * kill the service at its start timeout. */
    slen = strlen(state);
    n = sendto(fd, state, slen, MSG_NOSIGNAL, (struct sockaddr *)&sa, alen);
    saved = errno;
    close(fd);
    if (n < 0 || (size_t)n != slen) {
        errno = n < 0 ? saved : EMSGSIZE;
        return LD_ERR;
    }
    return LD_OK;
}

/* A non-negative decimal that fills the whole string. */
static int
parse_uint(const char *s, long *out)
{
    char *end;
    long v;

    if (s == NULL || *s < '0' || *s > '9') {
        return LD_ERR;
    }
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0) {
        return LD_ERR;
    }
    *out = v;
    return LD_OK;
}

static void
unset_listen_env(void)
{
    /* Children (there are none today) and a re-exec must not take these
     * sockets for their own. */
    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    unsetenv("LISTEN_FDNAMES");
}

int
ld_systemd_listen_fds(int **fds)
{
    long pid, count;
    int *arr;
    int i, flags;

    *fds = NULL;
    /* The variables are inherited by every child of the process systemd
     * started; LISTEN_PID says which process they are meant for. */
    if (parse_uint(getenv("LISTEN_PID"), &pid) != LD_OK ||
        (pid_t)pid != getpid()) {
        unset_listen_env();
        return 0;
    }
    if (parse_uint(getenv("LISTEN_FDS"), &count) != LD_OK ||
        count > INT_MAX - LD_LISTEN_FDS_START) {
        unset_listen_env();
        errno = EINVAL;
        return LD_ERR;
    }
    if (count == 0) {
        unset_listen_env();
        return 0;
    }

    arr = ld_xmalloc((size_t)count * sizeof(*arr));
    for (i = 0; i < (int)count; i++) {
        int fd = LD_LISTEN_FDS_START + i;

        /* systemd passes them without FD_CLOEXEC, since they survived its
         * exec; set it so they do not leak any further. */
        flags = fcntl(fd, F_GETFD);
        if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) {
            free(arr);
            unset_listen_env();
            errno = EBADF;
            return LD_ERR;
        }
        arr[i] = fd;
    }
    unset_listen_env();
    *fds = arr;
    return (int)count;
}
