/* The log line format: logfmt (level=, msg="free text", then the
 * message's own key=value fields), a UTC timestamp on a terminal or file,
 * and under systemd's journal ($JOURNAL_STREAM naming stderr) the "<N>"
 * priority prefix of sd-daemon(3) instead of the timestamp. */
#include "ld_log.h"

#include "unit.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/stat.h>

static char path[] = "/tmp/check_log.XXXXXX";
static int saved_stderr = -1;

/* Send stderr to a fresh temporary file; JOURNAL is "self" (the file's
 * own dev:ino), "other" (some other stream) or NULL (unset). */
static void
capture(const char *journal)
{
    struct stat st;
    char env[64];
    int fd;

    strcpy(path, "/tmp/check_log.XXXXXX");
    fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    fflush(stderr);
    saved_stderr = dup(STDERR_FILENO);
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    close(fd);
    ck_assert_int_eq(fstat(STDERR_FILENO, &st), 0);
    if (journal == NULL) {
        unsetenv("JOURNAL_STREAM");
    } else {
        snprintf(env, sizeof env, "%llu:%llu", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino +
                     (strcmp(journal, "self") == 0 ? 0 : 1));
        setenv("JOURNAL_STREAM", env, 1);
    }
    ld_log_open("check_log", false);
    ld_log_set_level(LD_LOG_DEBUG);
}

/* Restore stderr and read what was written into BUF. */
static void
collect(char *buf, size_t len)
{
    FILE *f;
    size_t n;

    fflush(stderr);
    ck_assert_int_ge(dup2(saved_stderr, STDERR_FILENO), 0);
    close(saved_stderr);
    f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    n = fread(buf, 1, len - 1, f);
    buf[n] = '\0';
    fclose(f);
    unlink(path);
    unsetenv("JOURNAL_STREAM");
    ld_log_open("check_log", false);
}

START_TEST(test_plain_lines)
{
    char buf[4096];
    int y, mo, d, h, mi, s, ms, n = 0;

    capture(NULL);
    log_info("journal opened path=/x bytes=8");
    collect(buf, sizeof buf);
    ck_assert_msg(sscanf(buf, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %n", &y, &mo, &d,
                         &h, &mi, &s, &ms, &n) == 7 &&
                      n > 0,
                  "no timestamp: %s", buf);
    ck_assert_str_eq(buf + n,
                     "level=info msg=\"journal opened\" path=/x bytes=8\n");
}
END_TEST

START_TEST(test_journal_lines)
{
    char buf[4096];

    capture("self");
    log_debug("a \"quoted\" back\\slash k=v");
    log_info("start-up done");
    log_warn("limits.max_clients=5 is more than the limit");
    log_error("metrics bind failed listen=127.0.0.1:1 error=\"in use\"");
    collect(buf, sizeof buf);
    ck_assert_str_eq(buf,
                     "<7>level=debug msg=\"a \\\"quoted\\\" back\\\\slash\" "
                     "k=v\n"
                     "<6>level=info msg=\"start-up done\"\n"
                     "<4>level=warn limits.max_clients=5 is more than the "
                     "limit\n"
                     "<3>level=error msg=\"metrics bind failed\" "
                     "listen=127.0.0.1:1 error=\"in use\"\n");
}
END_TEST

/* A child whose stderr went elsewhere inherits the variable: it is the
 * journal only when the stream is the one the variable names. */
START_TEST(test_journal_elsewhere)
{
    char buf[4096];

    capture("other");
    log_info("ready");
    collect(buf, sizeof buf);
    ck_assert_msg(buf[0] != '<' && strstr(buf, "Z level=info msg=\"ready\"\n"),
                  "line: %s", buf);
}
END_TEST

int
main(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("format");

    tcase_add_test(tc, test_plain_lines);
    tcase_add_test(tc, test_journal_lines);
    tcase_add_test(tc, test_journal_elsewhere);
    suite_add_tcase(s, tc);
    return ld_unit_run(s);
}
