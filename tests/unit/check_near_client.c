/* libleased's side of the shared near cache, against a fake daemon on a
 * Unix socket that answers hello (features: shared_near), near.map (the
 * descriptor of a segment written with the daemon's own writer, on the
 * reply's first byte), cache.get (always "from-socket"), near.hits and
 * ping, and counts what it was asked. */
#include "ld_common.h"

#include "ld_near_shm.h"

#include "leased/client.h"
#include "leased/near_layout.h"

#include "unit.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define SEC 1000000000ull

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct ld_near_shm *seg; /* what near.map hands out */
static int map_fails;           /* near.map answers an error */
static int n_maps, n_gets;
static unsigned long long hits_reported, fallbacks_reported;

static char dir[64], path[96];
static int lfd = -1;
static pthread_t th;

static uint64_t
mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

static long long
field_int(const char *line, const char *name)
{
    char pat[32];
    snprintf(pat, sizeof(pat), "\"%s\":", name);
    const char *p = strstr(line, pat);
    return p != NULL ? atoll(p + strlen(pat)) : -1;
}

static void
send_line(int fd, const char *s, int pass_fd)
{
    struct iovec iov = {.iov_base = (void *)s, .iov_len = strlen(s)};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh;
    memset(&mh, 0, sizeof(mh));
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    if (pass_fd >= 0) {
        mh.msg_control = ctl.b;
        mh.msg_controllen = sizeof(ctl.b);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    /* The client may be gone (a report sent as it closes). */
    (void)sendmsg(fd, &mh, MSG_NOSIGNAL);
}

static void
answer(int fd, const char *line)
{
    char out[512];
    long long id = field_int(line, "id");
    pthread_mutex_lock(&mu);
    if (strstr(line, "\"op\":\"hello\"") != NULL) {
        snprintf(out, sizeof(out),
                 "{\"ok\":true,\"session\":\"s1\",\"features\":[\"near\","
                 "\"shared_near\"],\"id\":%lld}\n",
                 id);
        send_line(fd, out, -1);
    } else if (strstr(line, "\"op\":\"near.map\"") != NULL) {
        n_maps++;
        if (map_fails) {
            snprintf(out, sizeof(out),
                     "{\"ok\":false,\"error\":{\"code\":\"bad_request\","
                     "\"message\":\"shared_near is not enabled\"},"
                     "\"id\":%lld}\n",
                     id);
            send_line(fd, out, -1);
        } else {
            struct ld_near_shm_usage u;
            ld_near_shm_usage(seg, &u);
            int ro = ld_near_shm_ro_fd(seg);
            ck_assert_int_ge(ro, 0);
            snprintf(out, sizeof(out),
                     "{\"ok\":true,\"bytes\":%llu,\"layout\":1,"
                     "\"stale_ms\":50,\"id\":%lld}\n",
                     (unsigned long long)u.bytes, id);
            send_line(fd, out, ro);
            close(ro);
        }
    } else if (strstr(line, "\"op\":\"cache.get\"") != NULL) {
        n_gets++;
        snprintf(out, sizeof(out),
                 "{\"ok\":true,\"hit\":true,\"value\":\"from-socket\","
                 "\"id\":%lld}\n",
                 id);
        send_line(fd, out, -1);
    } else if (strstr(line, "\"op\":\"near.hits\"") != NULL) {
        hits_reported += (unsigned long long)field_int(line, "hits");
        fallbacks_reported += (unsigned long long)field_int(line, "fallbacks");
        snprintf(out, sizeof(out), "{\"ok\":true,\"id\":%lld}\n", id);
        send_line(fd, out, -1);
    } else {
        snprintf(out, sizeof(out), "{\"ok\":true,\"id\":%lld}\n", id);
        send_line(fd, out, -1);
    }
    pthread_mutex_unlock(&mu);
}

static void *
serve(void *arg)
{
    (void)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) {
            return NULL;
        }
        char buf[65536];
        size_t len = 0;
        for (;;) {
            ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
            if (n <= 0) {
                break;
            }
            len += (size_t)n;
            char *nl;
            while ((nl = memchr(buf, '\n', len)) != NULL) {
                *nl = '\0';
                answer(fd, buf);
                len -= (size_t)(nl + 1 - buf);
                memmove(buf, nl + 1, len);
            }
        }
        close(fd);
    }
}

static void
setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/ld-near-client.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/s.sock", dir);
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_eq(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(lfd, 4), 0);
    seg = ld_near_shm_create("near-client", 1 << 20, 50 * 1000000ull);
    ck_assert_ptr_nonnull(seg);
    ld_near_shm_beat(seg, mono_ns());
    map_fails = 0;
    n_maps = n_gets = 0;
    hits_reported = fallbacks_reported = 0;
    ck_assert_int_eq(pthread_create(&th, NULL, serve, NULL), 0);
}

static void
teardown(void)
{
    shutdown(lfd, SHUT_RDWR);
    close(lfd);
    pthread_join(th, NULL);
    ld_near_shm_destroy(seg);
    unlink(path);
    rmdir(dir);
}

static struct leased_conn *
conn(void)
{
    struct leased_options opt;
    leased_options_init(&opt);
    opt.hello = true;
    struct leased_error err;
    struct leased_conn *c = leased_connect(path, &opt, &err);
    ck_assert_msg(c != NULL, "connect: %s", err.message);
    return c;
}

static void
put(const char *k, const char *v)
{
    pthread_mutex_lock(&mu);
    ck_assert(ld_near_shm_put(seg, k, strlen(k), v, v ? strlen(v) : 0,
                              mono_ns() + 3600 * SEC, 0));
    ld_near_shm_beat(seg, mono_ns());
    pthread_mutex_unlock(&mu);
}

static int
gets(void)
{
    pthread_mutex_lock(&mu);
    int n = n_gets;
    pthread_mutex_unlock(&mu);
    return n;
}

static int
maps(void)
{
    pthread_mutex_lock(&mu);
    int n = n_maps;
    pthread_mutex_unlock(&mu);
    return n;
}

/* leased_cache_get of K gives V. */
static void
assert_get(struct leased_conn *c, const char *k, const char *v)
{
    struct leased_cache_result r;
    struct leased_error err;
    ck_assert_int_eq(leased_cache_get(c, k, 0, false, &r, &err), LEASED_OK);
    ck_assert(r.hit);
    ck_assert_str_eq(r.value, v);
    leased_cache_result_free(&r);
}

START_TEST(hit_from_segment_miss_to_socket)
{
    struct leased_conn *c = conn();
    put("k", "v1");
    assert_get(c, "k", "v1");
    ck_assert_int_eq(gets(), 0);
    struct leased_near_info ni;
    leased_near_info(c, &ni);
    ck_assert(ni.mapped);
    ck_assert_uint_eq(ni.bytes, 1 << 20);
    ck_assert_uint_eq(ni.hits, 1);
    /* Not in the segment: the socket answers, and it is a fallback. */
    assert_get(c, "other", "from-socket");
    ck_assert_int_eq(gets(), 1);
    leased_near_info(c, &ni);
    ck_assert_uint_eq(ni.fallbacks, 1);
    /* Deleted in the segment: never its old value again. */
    pthread_mutex_lock(&mu);
    ld_near_shm_del(seg, "k", 1);
    pthread_mutex_unlock(&mu);
    assert_get(c, "k", "from-socket");
    ck_assert_int_eq(gets(), 2);
    /* A cached null, and a value larger than the first buffer. */
    put("null", NULL);
    struct leased_cache_result r;
    ck_assert_int_eq(leased_cache_get(c, "null", 0, false, &r, NULL),
                     LEASED_OK);
    ck_assert(r.hit && r.is_null && r.value == NULL);
    char big[5000];
    memset(big, 'b', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    put("big", big);
    assert_get(c, "big", big);
    ck_assert(leased_near_get(c, "big", NULL));
    ck_assert(!leased_near_get(c, "nope", NULL));
    ck_assert_int_eq(gets(), 2);
    ck_assert_int_eq(maps(), 1);
    leased_close(c);
}
END_TEST

START_TEST(stale_heartbeat_falls_back)
{
    struct leased_conn *c = conn();
    put("k", "v1");
    assert_get(c, "k", "v1");
    /* The daemon stopped beating 60 ms ago (bound: 50 ms). */
    pthread_mutex_lock(&mu);
    ld_near_shm_beat(seg, mono_ns() - 60 * 1000000ull);
    pthread_mutex_unlock(&mu);
    assert_get(c, "k", "from-socket");
    ck_assert_int_eq(gets(), 1);
    pthread_mutex_lock(&mu);
    ld_near_shm_beat(seg, mono_ns());
    pthread_mutex_unlock(&mu);
    assert_get(c, "k", "v1");
    ck_assert_int_eq(gets(), 1);
    leased_close(c);
}
END_TEST

START_TEST(closed_segment_mapped_again)
{
    struct leased_conn *c = conn();
    put("k", "v1");
    assert_get(c, "k", "v1");
    /* A reload: the old segment closed, a new one with another value. */
    pthread_mutex_lock(&mu);
    ld_near_shm_destroy(seg);
    seg = ld_near_shm_create("near-client", 1 << 20, 50 * 1000000ull);
    ck_assert_ptr_nonnull(seg);
    pthread_mutex_unlock(&mu);
    put("k", "v2");
    /* Within a second of the last near.map: the socket, no re-map. */
    uint64_t t0 = mono_ns();
    assert_get(c, "k", "from-socket");
    ck_assert_int_eq(maps(), 1);
    /* Then the new segment, mapped once. */
    int served = 0;
    while (mono_ns() - t0 < 5 * SEC) {
        struct leased_cache_result r;
        ck_assert_int_eq(leased_cache_get(c, "k", 0, false, &r, NULL),
                         LEASED_OK);
        served = strcmp(r.value, "v2") == 0;
        leased_cache_result_free(&r);
        if (served) {
            break;
        }
        pthread_mutex_lock(&mu);
        ld_near_shm_beat(seg, mono_ns());
        pthread_mutex_unlock(&mu);
        usleep(20000);
    }
    ck_assert(served);
    ck_assert_uint_ge(mono_ns() - t0, 900000000ull);
    ck_assert_int_eq(maps(), 2);
    leased_close(c);
}
END_TEST

START_TEST(map_failure_not_tried_again)
{
    map_fails = 1;
    struct leased_conn *c = conn();
    put("k", "v1");
    for (int i = 0; i < 5; i++) {
        assert_get(c, "k", "from-socket");
    }
    ck_assert_int_eq(maps(), 1);
    struct leased_near_info ni;
    leased_near_info(c, &ni);
    ck_assert(!ni.mapped);
    ck_assert_uint_eq(ni.hits + ni.fallbacks, 0);
    struct leased_error err;
    ck_assert_int_eq(leased_near_map(c, &err), LEASED_E_BAD_REQUEST);
    leased_close(c);
}
END_TEST

START_TEST(hits_are_reported)
{
    struct leased_conn *c = conn();
    put("k", "v1");
    for (int i = 0; i < 1000; i++) {
        ck_assert(leased_near_get(c, "k", NULL));
    }
    ck_assert(!leased_near_get(c, "nope", NULL));
    /* 1000 hits wait: the next request carries them before it. */
    ck_assert_int_eq(leased_ping(c, NULL), LEASED_OK);
    pthread_mutex_lock(&mu);
    ck_assert_uint_eq(hits_reported, 1000);
    ck_assert_uint_eq(fallbacks_reported, 1);
    pthread_mutex_unlock(&mu);
    /* A few more are not sent at once, but when the connection closes. */
    ck_assert(leased_near_get(c, "k", NULL));
    ck_assert_int_eq(leased_ping(c, NULL), LEASED_OK);
    pthread_mutex_lock(&mu);
    ck_assert_uint_eq(hits_reported, 1000);
    pthread_mutex_unlock(&mu);
    leased_close(c);
    uint64_t t0 = mono_ns();
    unsigned long long h = 0;
    while (mono_ns() - t0 < 5 * SEC) {
        pthread_mutex_lock(&mu);
        h = hits_reported;
        pthread_mutex_unlock(&mu);
        if (h == 1001) {
            break;
        }
        usleep(1000);
    }
    ck_assert_uint_eq(h, 1001);
}
END_TEST

static Suite *
near_client_suite(void)
{
    Suite *s = suite_create("near_client");
    TCase *tc = tcase_create("libleased");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, hit_from_segment_miss_to_socket);
    tcase_add_test(tc, stale_heartbeat_falls_back);
    tcase_add_test(tc, closed_segment_mapped_again);
    tcase_add_test(tc, map_failure_not_tried_again);
    tcase_add_test(tc, hits_are_reported);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return ld_unit_run(near_client_suite());
}
