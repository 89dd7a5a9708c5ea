/* ld_systemd: sd_notify datagrams to a socket this test binds itself, and
 * LISTEN_FDS adoption, without systemd. */

#include "ld_common.h"

#include "ld_systemd.h"

#include "unit.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* Reads one datagram that must already be queued: the notification is
 * sent synchronously, so by the time ld_systemd_notify returns it is
 * there or it is lost. */
static ssize_t
recv_queued(int fd, char *buf, size_t len)
{
    return recv(fd, buf, len, MSG_DONTWAIT);
}

START_TEST(test_notify_unset_is_noop)
{
    unsetenv("NOTIFY_SOCKET");
    ck_assert_int_eq(ld_systemd_notify("READY=1"), 0);
    setenv("NOTIFY_SOCKET", "", 1);
    ck_assert_int_eq(ld_systemd_notify("READY=1"), 0);
}
END_TEST

START_TEST(test_notify_path_socket)
{
    char dir[] = "/tmp/ld-notify-XXXXXX";
    char path[sizeof(dir) + 16];
    struct sockaddr_un sa;
    char buf[64];
    ssize_t n;
    int fd;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/notify", dir);
    fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);

    setenv("NOTIFY_SOCKET", path, 1);
    ck_assert_int_eq(ld_systemd_notify("READY=1"), 0);
    n = recv_queued(fd, buf, sizeof(buf));
    ck_assert_int_eq(n, 7);
    ck_assert(memcmp(buf, "READY=1", 7) == 0);

    ck_assert_int_eq(ld_systemd_notify("STOPPING=1"), 0);
    n = recv_queued(fd, buf, sizeof(buf));
    ck_assert_int_eq(n, 10);
    ck_assert(memcmp(buf, "STOPPING=1", 10) == 0);
    /* Exactly one datagram per call. */
    ck_assert_int_eq(recv_queued(fd, buf, sizeof(buf)), -1);

    close(fd);
    unlink(path);
    rmdir(dir);
    unsetenv("NOTIFY_SOCKET");
}
END_TEST

START_TEST(test_notify_abstract_socket)
{
    struct sockaddr_un sa;
    char name[64], buf[64];
    socklen_t alen;
    ssize_t n;
    int fd;

    /* The exact length matters: the abstract name is the bytes after the
     * NUL up to the address length, padding included if counted. */
    snprintf(name, sizeof(name), "@ld-notify-test-%ld", (long)getpid());
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name, strlen(name));
    sa.sun_path[0] = '\0';
    alen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name));
    fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, alen), 0);

    setenv("NOTIFY_SOCKET", name, 1);
    ck_assert_int_eq(ld_systemd_notify("READY=1"), 0);
    n = recv_queued(fd, buf, sizeof(buf));
    ck_assert_int_eq(n, 7);
    ck_assert(memcmp(buf, "READY=1", 7) == 0);
    close(fd);
    unsetenv("NOTIFY_SOCKET");
}
END_TEST

START_TEST(test_notify_errors)
{
    /* Relative paths are not a notify socket address. */
    setenv("NOTIFY_SOCKET", "relative/notify", 1);
    ck_assert_int_eq(ld_systemd_notify("READY=1"), -1);
    /* Nobody listening there. */
    setenv("NOTIFY_SOCKET", "/nonexistent/ld-notify-test", 1);
    ck_assert_int_eq(ld_systemd_notify("READY=1"), -1);
    unsetenv("NOTIFY_SOCKET");
}
END_TEST

/* The adoption tests put sockets on descriptors 3 and 4, which Check
 * itself may be using in the test process; they therefore run in a child
 * that reports through its exit status (0 = all good, else the number of
 * the check that failed). */
static int
run_in_child(int (*fn)(void))
{
    pid_t pid;
    int status;

    fflush(NULL);
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        _exit(fn());
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static bool
listen_env_gone(void)
{
    return getenv("LISTEN_PID") == NULL && getenv("LISTEN_FDS") == NULL &&
           getenv("LISTEN_FDNAMES") == NULL;
}

static int
child_adopt_two(void)
{
    int sv[2], *fds = NULL, n, i;
    char pid[32];

    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        return 10;
    }
    if (dup2(sv[0], 3) != 3 || dup2(sv[1], 4) != 4) {
        return 11;
    }
    /* As systemd passes them: without close-on-exec. */
    fcntl(3, F_SETFD, 0);
    fcntl(4, F_SETFD, 0);
    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", "2", 1);
    setenv("LISTEN_FDNAMES", "unix:tcp", 1);

    n = ld_systemd_listen_fds(&fds);
    if (n != 2) {
        return 1;
    }
    if (fds == NULL || fds[0] != 3 || fds[1] != 4) {
        return 2;
    }
    for (i = 0; i < 2; i++) {
        if (!(fcntl(fds[i], F_GETFD) & FD_CLOEXEC)) {
            return 3;
        }
    }
    if (!listen_env_gone()) {
        return 4;
    }
    /* The descriptors are the ones passed: they still work. */
    if (write(4, "x", 1) != 1) {
        return 5;
    }
    char c;
    if (read(3, &c, 1) != 1 || c != 'x') {
        return 6;
    }
    free(fds);
    return 0;
}

START_TEST(test_listen_fds_adopted)
{
    ck_assert_int_eq(run_in_child(child_adopt_two), 0);
}
END_TEST

static int
child_wrong_pid(void)
{
    int *fds = (int *)1;
    char pid[32];

    /* The variables were meant for our parent, not for us. */
    snprintf(pid, sizeof(pid), "%ld", (long)getppid());
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", "2", 1);
    if (ld_systemd_listen_fds(&fds) != 0) {
        return 1;
    }
    if (fds != NULL) {
        return 2;
    }
    if (!listen_env_gone()) {
        return 3;
    }
    return 0;
}

START_TEST(test_listen_fds_wrong_pid)
{
    ck_assert_int_eq(run_in_child(child_wrong_pid), 0);
}
END_TEST

static int
child_no_env(void)
{
    int *fds = (int *)1;

    unsetenv("LISTEN_PID");
    unsetenv("LISTEN_FDS");
    if (ld_systemd_listen_fds(&fds) != 0 || fds != NULL) {
        return 1;
    }
    return 0;
}

START_TEST(test_listen_fds_absent)
{
    ck_assert_int_eq(run_in_child(child_no_env), 0);
}
END_TEST

static int
child_bad_count(void)
{
    int *fds = (int *)1;
    char pid[32];

    snprintf(pid, sizeof(pid), "%ld", (long)getpid());
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", "2x", 1);
    if (ld_systemd_listen_fds(&fds) != -1 || fds != NULL) {
        return 1;
    }
    if (!listen_env_gone()) {
        return 2;
    }
    /* A count naming descriptors that are not open. */
    close(40);
    close(41);
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", "39", 1);
    if (ld_systemd_listen_fds(&fds) != -1 || fds != NULL) {
        return 3;
    }
    return 0;
}

START_TEST(test_listen_fds_bad_values)
{
    ck_assert_int_eq(run_in_child(child_bad_count), 0);
}
END_TEST

static Suite *
systemd_suite(void)
{
    Suite *s = suite_create("systemd");
    TCase *tc = tcase_create("systemd");

    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_notify_unset_is_noop);
    tcase_add_test(tc, test_notify_path_socket);
    tcase_add_test(tc, test_notify_abstract_socket);
    tcase_add_test(tc, test_notify_errors);
    tcase_add_test(tc, test_listen_fds_adopted);
    tcase_add_test(tc, test_listen_fds_wrong_pid);
    tcase_add_test(tc, test_listen_fds_absent);
    tcase_add_test(tc, test_listen_fds_bad_values);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(systemd_suite());
}
