/* ld_util: tokens, jitter, hashing, address parsing, bound ports and the
 * constant-time comparison. */
#include "ld_common.h"

#include "ld_util.h"

#include "unit.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

START_TEST(tokens_are_hex_and_differ)
{
    char seen[64][LD_TOKEN_LEN + 1];

    for (size_t i = 0; i < LD_ARRAY_LEN(seen); i++) {
        ck_assert_int_eq(ld_token_new(seen[i]), LD_OK);
        ck_assert_uint_eq(strlen(seen[i]), LD_TOKEN_LEN);
        ck_assert_uint_eq(strspn(seen[i], "0123456789abcdef"), LD_TOKEN_LEN);
        for (size_t j = 0; j < i; j++) {
            ck_assert_str_ne(seen[i], seen[j]);
        }
    }
}
END_TEST

START_TEST(random_bytes_fill_large_buffers)
{
    /* Over 256 bytes getrandom() may return short; all of it must be
     * filled anyway. Two 4 KiB draws agreeing in a whole 64-byte block is
     * as good as impossible unless part stayed unwritten. */
    static unsigned char a[4096], b[4096];

    ck_assert_int_eq(ld_random_bytes(a, sizeof(a)), LD_OK);
    ck_assert_int_eq(ld_random_bytes(b, sizeof(b)), LD_OK);
    for (size_t off = 0; off < sizeof(a); off += 64) {
        ck_assert_msg(memcmp(a + off, b + off, 64) != 0, "block at %zu", off);
    }
}
END_TEST

START_TEST(random_unit_in_range)
{
    double min = 1, max = 0;
    for (int i = 0; i < 10000; i++) {
        double u = ld_random_unit();
        ck_assert(u >= 0.0 && u < 1.0);
        min = u < min ? u : min;
        max = u > max ? u : max;
    }
    ck_assert(min < 0.01);
    ck_assert(max > 0.99);
}
END_TEST

START_TEST(jitter_stays_within_bounds)
{
    const long long ttl = 100000;
    const double j = 0.1;
    int below = 0, above = 0;

    for (int i = 0; i < 10000; i++) {
        long long v = ld_jitter_ttl(ttl, j);
        ck_assert_int_ge(v, 90000);
        ck_assert_int_le(v, 110000);
        below += v < ttl;
        above += v > ttl;
    }
    /* Uniform over the whole band, not one side of it: each half should
     * get about 5000 of the draws. */
    ck_assert_int_gt(below, 4000);
    ck_assert_int_gt(above, 4000);
}
END_TEST

START_TEST(jitter_edge_cases)
{
    ck_assert_int_eq(ld_jitter_ttl(5000, 0), 5000);
    ck_assert_int_eq(ld_jitter_ttl(0, 0.1), 1);
    ck_assert_int_eq(ld_jitter_ttl(-5, 0.1), 1);
    for (int i = 0; i < 1000; i++) {
        ck_assert_int_ge(ld_jitter_ttl(1, 0.5), 1);
        /* Jitter over 0.5 is clamped, so a TTL never drops below half. */
        long long v = ld_jitter_ttl(1000, 5.0);
        ck_assert_int_ge(v, 500);
        ck_assert_int_le(v, 1500);
    }
}
END_TEST

START_TEST(fnv1a_known_values)
{
    /* Reference values of 64-bit FNV-1a. */
    ck_assert_uint_eq(ld_hash("", 0), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(ld_hash("a", 1), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(ld_hash("foobar", 6), 0x85944171f73967e8ull);
}
END_TEST

START_TEST(hostport_parsing)
{
    char host[64];
    int port = -1;

    ck_assert_int_eq(ld_parse_hostport("127.0.0.1:6379", host, sizeof(host),
                                       &port),
                     LD_OK);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_int_eq(port, 6379);
    ck_assert_int_eq(ld_parse_hostport("[::1]:7379", host, sizeof(host),
                                       &port),
                     LD_OK);
    ck_assert_str_eq(host, "::1");
    ck_assert_int_eq(port, 7379);
    ck_assert_int_eq(ld_parse_hostport("redis.example:0", host, sizeof(host),
                                       &port),
                     LD_OK);
    ck_assert_str_eq(host, "redis.example");
    ck_assert_int_eq(port, 0);
    ck_assert_int_eq(ld_parse_hostport("h:65535", host, sizeof(host), &port),
                     LD_OK);
    ck_assert_int_eq(port, 65535);

    static const char *const bad[] = {
        "",        "localhost", ":6379",    "h:",    "h:65536",
        "h:-1",    "h:12a",     "::1:6379", "[::1]", "[::1]6379",
        "[]:6379", "h:+80",     "h:100000", "h: 80",
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(bad); i++) {
        ck_assert_msg(ld_parse_hostport(bad[i], host, sizeof(host), &port) ==
                          LD_ERR,
                      "accepted \"%s\"", bad[i]);
    }
    /* A host that does not fit is refused, not cut. */
    ck_assert_int_eq(ld_parse_hostport("abcdefgh:1", host, 8, &port), LD_ERR);
    ck_assert_int_eq(ld_parse_hostport("abcdefg:1", host, 8, &port), LD_OK);
    ck_assert_str_eq(host, "abcdefg");
}
END_TEST

START_TEST(secure_equal)
{
    ck_assert(ld_secure_equal("secret", 6, "secret", 6));
    ck_assert(ld_secure_equal("", 0, "", 0));
    ck_assert(!ld_secure_equal("secret", 6, "secreT", 6));
    ck_assert(!ld_secure_equal("secret", 6, "secret2", 7));
    ck_assert(!ld_secure_equal("secret2", 7, "secret", 6));
    ck_assert(!ld_secure_equal("", 0, "x", 1));
    /* A trailing NUL is not padding. */
    ck_assert(!ld_secure_equal("ab\0", 3, "ab", 2));
    ck_assert(ld_secure_equal("a\0b", 3, "a\0b", 3));
}
END_TEST

START_TEST(loopback_hosts)
{
    static const char *const yes[] = {
        "127.0.0.1", "127.1.2.3", "127.255.255.255",  "::1",
        "localhost", "LOCALHOST", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1",
    };
    static const char *const no[] = {
        "0.0.0.0",
        "10.0.0.1",
        "128.0.0.1",
        "::",
        "::2",
        "example.com",
        "localhost.example.com",
        "",
        "126.255.255.255",
        "::ffff:10.0.0.1",
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(yes); i++) {
        ck_assert_msg(ld_host_is_loopback(yes[i]), "%s", yes[i]);
    }
    for (size_t i = 0; i < LD_ARRAY_LEN(no); i++) {
        ck_assert_msg(!ld_host_is_loopback(no[i]), "%s", no[i]);
    }
}
END_TEST

START_TEST(mkdir_parent)
{
    char base[] = "/tmp/check_util.XXXXXX";
    char path[320], dir[256];
    struct stat st;

    ck_assert_ptr_nonnull(mkdtemp(base));
    snprintf(dir, sizeof(dir), "%s/sub", base);
    snprintf(path, sizeof(path), "%s/file.journal", dir);
    ck_assert_int_eq(ld_mkdir_parent(path, 0750), LD_OK);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    /* Already there is fine. */
    ck_assert_int_eq(ld_mkdir_parent(path, 0750), LD_OK);
    /* A file in the way is not. */
    ck_assert_int_eq(rmdir(dir), 0);
    FILE *f = fopen(dir, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(ld_mkdir_parent(path, 0750), LD_ERR);
    ck_assert_int_eq(errno, ENOTDIR);
    unlink(dir);
    rmdir(base);
    ck_assert_int_eq(ld_mkdir_parent("relative", 0750), LD_OK);
}
END_TEST

START_TEST(monotonic_clock)
{
    uint64_t a = ld_now_us();
    uint64_t b = ld_now_us();
    ck_assert_uint_ge(b, a);
    ck_assert_uint_le(ld_now_ms(), ld_now_us() / 1000 + 1);
}
END_TEST

START_TEST(bound_port)
{
    /* Port 0 asks the kernel for one; the bound port is the one it gave. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t alen = sizeof(a);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &alen), 0);
    ck_assert_int_gt(ntohs(a.sin_port), 0);
    ck_assert_int_eq(ld_bound_port(fd), ntohs(a.sin_port));
    close(fd);

    /* A Unix socket has no port; a closed descriptor has no address. */
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    ck_assert_int_ge(u, 0);
    ck_assert_int_eq(ld_bound_port(u), -1);
    close(u);
    ck_assert_int_eq(ld_bound_port(fd), -1);
}
END_TEST

static Suite *
util_suite(void)
{
    Suite *s = suite_create("util");
    struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"tokens_are_hex_and_differ", tokens_are_hex_and_differ},
        {"random_bytes_fill_large_buffers", random_bytes_fill_large_buffers},
        {"random_unit_in_range", random_unit_in_range},
        {"jitter_stays_within_bounds", jitter_stays_within_bounds},
        {"jitter_edge_cases", jitter_edge_cases},
        {"fnv1a_known_values", fnv1a_known_values},
        {"hostport_parsing", hostport_parsing},
        {"secure_equal", secure_equal},
        {"loopback_hosts", loopback_hosts},
        {"mkdir_parent", mkdir_parent},
        {"monotonic_clock", monotonic_clock},
        {"bound_port", bound_port},
    };

    for (size_t i = 0; i < LD_ARRAY_LEN(cases); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

int
main(void)
{
    return ld_unit_run(util_suite());
}
