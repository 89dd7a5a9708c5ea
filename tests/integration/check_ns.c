/* Namespaces per local user (listen.namespaces): Unix sessions of other
 * uids (children that setuid before they connect) and of a group, TCP
 * clients named by their hello token, the unrestricted identities, the
 * key checks of single- and multi-key ops (nothing changed when one key
 * is outside), reload applying to existing sessions, and the
 * configuration errors with their line and column. */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif

#include "harness.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static struct h_redis R;
static struct h_daemon D;
static const struct h_fixture fx = {
    .suite = "ns",
    .redis = {&R},
    .daemons = {&D},
};

#define T_MS 5000
#define OTHER_UID 23456 /* an entry of its own */
#define STRAY_UID 23457 /* no entry */
#define GROUP_UID 23458 /* no uid entry, but in GROUP_GID */
#define GROUP_GID 23459

static uid_t nobody_uid;
static gid_t nobody_gid;

/* The socket and every directory above it reachable by other users. */
static void
open_up(const char *dir)
{
    char p[300];
    struct stat st;
    snprintf(p, sizeof p, "%s", dir);
    for (;;) {
        if (stat(p, &st) == 0) {
            chmod(p, (st.st_mode & 07777) | 0011);
        }
        char *slash = strrchr(p, '/');
        if (slash == NULL || slash == p) {
            break;
        }
        *slash = '\0';
    }
}

static void
start_ns(const char *namespaces, const char *more_listen)
{
    char yaml[2048];
    struct passwd *pw = getpwnam("nobody");
    ck_assert_msg(getuid() == 0, "these tests need root (setuid children)");
    ck_assert_msg(pw != NULL, "no user nobody");
    nobody_uid = pw->pw_uid;
    nobody_gid = pw->pw_gid;
    snprintf(yaml, sizeof yaml,
             "listen:\n  unix: @DIR@/leased.sock\n  tcp: 127.0.0.1:0\n"
             "  unix_mode: \"0666\"\n%s  namespaces:\n%s",
             more_listen != NULL ? more_listen : "", namespaces);
    ck_assert_int_eq(h_redis_start(&R, NULL), 0);
    ck_assert_int_eq(h_daemon_start(&D, &R, yaml), 0);
    open_up(D.dir);
}

/* --- checks that run in a child of another uid -------------------------- */

#define EXPECT(cond, ...)                                                     \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "as uid %d: ", (int)getuid());                    \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            return 1;                                                         \
        }                                                                     \
    } while (0)

/* The reply R (freed) is unauthorized naming KEY. */
static int
refused(json_t *r, const char *key)
{
    const json_t *err = json_object_get(r, "error");
    const char *k = json_string_value(json_object_get(err, "key"));
    int bad = r == NULL || h_errcode(r) == NULL ||
              strcmp(h_errcode(r), "unauthorized") != 0 || k == NULL ||
              strcmp(k, key) != 0;
    if (bad) {
        char *s = r != NULL ? json_dumps(r, JSON_COMPACT) : NULL;
        fprintf(stderr, "as uid %d: expected unauthorized for %s, got %s\n",
                (int)getuid(), key, s != NULL ? s : "no reply");
        free(s);
    }
    json_decref(r);
    return bad;
}

static bool
acquired(json_t *r)
{
    bool ok = r != NULL && h_ok(r) && jtrue(r, "acquired");
    json_decref(r);
    return ok;
}

static json_t *
lock(struct h_conn *c, const char *key)
{
    return h_callf(c, T_MS, "{s:s,s:s}", "op", "lock", "key", key);
}

/* nobody: "nb:" only. */
static int
as_nobody(void)
{
    struct h_conn *c = h_connect(&D);
    json_t *r;
    EXPECT(c != NULL, "cannot connect to %s: %s", D.sock, strerror(errno));
    r = h_callf(c, T_MS, "{s:s}", "op", "ping");
    EXPECT(r != NULL && h_ok(r), "ping refused");
    json_decref(r);
    EXPECT(acquired(lock(c, "nb:1")), "lock nb:1 not acquired");
    /* An entry without admin: true runs no operator op. */
    r = h_callf(c, T_MS, "{s:s}", "op", "lock.list");
    EXPECT(r != NULL && h_errcode(r) != NULL &&
               strcmp(h_errcode(r), "unauthorized") == 0,
           "lock.list allowed to an entry without admin");
    json_decref(r);
    if (refused(lock(c, "other:1"), "other:1") ||
        refused(lock(c, "nb"), "nb") ||
        refused(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key",
                        "other:v", "value", "mine now"),
                "other:v") ||
        refused(h_callf(c, T_MS, "{s:s,s:[s,s,s]}", "op", "cache.mget", "keys",
                        "nb:a", "other:v", "x"),
                "other:v") ||
        /* One key outside: the whole request, nothing deleted. */
        refused(h_callf(c, T_MS, "{s:s,s:[s,s]}", "op", "cache.invalidate",
                        "keys", "nb:v", "other:v"),
                "other:v") ||
        refused(h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.info", "key",
                        "other:1"),
                "other:1") ||
        refused(h_callf(c, T_MS, "{s:s,s:s,s:i,s:i}", "op", "rate.acquire",
                        "key", "other:r", "rate", 5, "per_ms", 1000),
                "other:r") ||
        /* A Bloom filter's name is a key, and so is each of its keys. */
        refused(h_callf(c, T_MS, "{s:s,s:s,s:i,s:f}", "op", "bloom.create",
                        "filter", "other:f", "capacity", 10, "error_rate",
                        0.01),
                "other:f") ||
        refused(h_callf(c, T_MS, "{s:s,s:s,s:[s,s]}", "op", "bloom.add",
                        "filter", "nb:f", "keys", "nb:k", "other:k"),
                "other:k") ||
        refused(h_callf(c, T_MS, "{s:s,s:s,s:[s]}", "op", "bloom.check",
                        "filter", "other:f", "keys", "nb:k"),
                "other:f") ||
        refused(h_callf(c, T_MS, "{s:s,s:s,s:s}", "op", "cache.get", "key",
                        "nb:k", "bloom", "other:f"),
                "other:f")) {
        return 1;
    }
    r = h_callf(c, T_MS, "{s:s,s:s,s:i,s:f}", "op", "bloom.create", "filter",
                "nb:f", "capacity", 10, "error_rate", 0.01);
    EXPECT(r != NULL && h_ok(r), "bloom.create nb:f refused");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s,s:[s]}", "op", "bloom.add", "filter",
                "nb:f", "keys", "nb:k");
    EXPECT(r != NULL && h_ok(r), "bloom.add nb:f refused");
    json_decref(r);
    EXPECT(acquired(h_callf(c, T_MS, "{s:s,s:s,s:i,s:i}", "op", "rate.acquire",
                            "key", "nb:r", "rate", 5, "per_ms", 1000)),
           "rate.acquire nb:r not acquired");
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "nb:v");
    EXPECT(r != NULL && h_ok(r) && jtrue(r, "hit"),
           "nb:v was changed by a refused invalidate");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "unlock", "key", "nb:1");
    EXPECT(r != NULL && h_ok(r), "unlock nb:1 refused");
    json_decref(r);
    h_close(c);
    return 0;
}

static int
as_other(void)
{
    struct h_conn *c = h_connect(&D);
    EXPECT(c != NULL, "cannot connect");
    EXPECT(acquired(lock(c, "other:1")), "lock other:1 not acquired");
    if (refused(lock(c, "nb:2"), "nb:2")) {
        return 1;
    }
    h_close(c);
    return 0;
}

/* No entry: hello, ping and stats, nothing with a key. */
static int
as_stray(void)
{
    struct h_conn *c = h_connect(&D);
    json_t *r;
    EXPECT(c != NULL, "cannot connect");
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "client", "stray");
    EXPECT(r != NULL && h_ok(r), "hello refused");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s}", "op", "stats");
    EXPECT(r != NULL && h_ok(r), "stats refused");
    json_decref(r);
    if (refused(lock(c, "nb:3"), "nb:3") ||
        refused(h_callf(c, T_MS, "{s:s,s:s}", "op", "cache.get", "key", "x"),
                "x")) {
        return 1;
    }
    h_close(c);
    return 0;
}

/* In GROUP_GID, matched by its group entry, which has admin: true: its
 * own keys only, but the operator ops on any key. */
static int
as_group(void)
{
    struct h_conn *c = h_connect(&D);
    json_t *r;
    EXPECT(c != NULL, "cannot connect");
    EXPECT(acquired(lock(c, "grp:1")), "lock grp:1 not acquired");
    if (refused(lock(c, "nb:4"), "nb:4")) {
        return 1;
    }
    r = h_callf(c, T_MS, "{s:s}", "op", "lock.list");
    EXPECT(r != NULL && h_ok(r), "lock.list refused to an admin entry");
    json_decref(r);
    r = h_callf(c, T_MS, "{s:s,s:s}", "op", "lock.force_unlock", "key",
                "anything");
    EXPECT(r != NULL && h_ok(r) && jtrue(r, "released"),
           "force_unlock of root's lock refused to an admin entry");
    json_decref(r);
    h_close(c);
    return 0;
}

/* Run FN in a child as UID/GID; its exit status (0: every check held). */
static int
as_user(uid_t uid, gid_t gid, int (*fn)(void))
{
    pid_t pid = fork();
    int st = 0;
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) {
            fprintf(stderr, "setuid %d: %s\n", (int)uid, strerror(errno));
            _exit(2);
        }
        _exit(fn());
    }
    h_track_pid(pid);
    long long end = h_now_ms() + 30000;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (h_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            h_untrack_pid(pid);
            return -1;
        }
        usleep(10000);
    }
    h_untrack_pid(pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(test_unix_uids)
{
    char ns[512];
    struct h_conn *root;
    json_t *r;

    snprintf(ns, sizeof ns,
             "    - {user: nobody, prefixes: [\"nb:\"]}\n"
             "    - {uid: %d, prefixes: [\"other:\", \"shared:\"]}\n"
             "    - {gid: %d, prefixes: [\"grp:\"], admin: true}\n",
             OTHER_UID, GROUP_GID);
    start_ns(ns, NULL);

    /* Root is unrestricted, and leaves a value under nb: for nobody. */
    root = h_connect_ok(&D);
    r = h_callf(root, T_MS, "{s:s,s:s,s:s}", "op", "cache.set", "key", "nb:v",
                "value", "x");
    ck_assert_msg(h_ok(r), "root's cache.set refused");
    json_decref(r);
    ck_assert(acquired(lock(root, "anything")));

    ck_assert_int_eq(as_user(nobody_uid, nobody_gid, as_nobody), 0);
    ck_assert_int_eq(as_user(OTHER_UID, OTHER_UID, as_other), 0);
    ck_assert_int_eq(as_user(STRAY_UID, STRAY_UID, as_stray), 0);
    ck_assert_int_eq(as_user(GROUP_UID, GROUP_GID, as_group), 0);
    /* The admin entry forced root's lock open. */
    json_t *lost = h_lock_lost(root, "anything", T_MS);
    ck_assert_msg(lost != NULL, "root heard no lock_lost for anything");
    json_decref(lost);
    /* other:1 was held by a session that is gone: released. */
    ck_assert(acquired(lock(root, "other:1")));
    h_close(root);
    /* A clean exit (and, under LEASED_WRAPPER, no memory error). */
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* --- TCP: the token names the namespace ---------------------------------- */

static json_t *
hello(struct h_conn *c, const char *auth)
{
    return auth != NULL
               ? h_callf(c, T_MS, "{s:s,s:s}", "op", "hello", "auth", auth)
               : h_callf(c, T_MS, "{s:s}", "op", "hello");
}

START_TEST(test_tcp_tokens)
{
    struct h_conn *a, *full, *bad, *none;
    json_t *r;

    start_ns("    - {token: \"tok-a\", prefixes: [\"a:\"]}\n"
             "    - {token: \"tok-b\", prefixes: [\"b:\"]}\n",
             "  auth_token: \"full-secret\"\n");
    a = h_connect_tcp(&D);
    ck_assert_ptr_nonnull(a);
    r = hello(a, "tok-a");
    ck_assert_msg(h_ok(r), "hello with an entry token refused");
    json_decref(r);
    ck_assert(acquired(lock(a, "a:1")));
    ck_assert_int_eq(refused(lock(a, "b:1"), "b:1"), 0);

    full = h_connect_tcp(&D);
    json_decref(hello(full, "full-secret"));
    ck_assert(acquired(lock(full, "b:1")));

    bad = h_connect_tcp(&D);
    h_expect_code(hello(bad, "tok-c"), "unauthorized",
                  "hello with a bad token");
    h_expect_code(lock(bad, "a:2"), "unauthorized", "lock after a bad hello");

    /* The listener requires a token: none, no work. */
    none = h_connect_tcp(&D);
    h_expect_code(lock(none, "a:3"), "unauthorized", "lock without hello");
    h_close(a);
    h_close(full);
    h_close(bad);
    h_close(none);
    /* A clean exit (and, under LEASED_WRAPPER, no memory error). */
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* Without listen.auth_token: a TCP client with no token has no entry, and
 * a token that matches no entry is refused all the same. */
START_TEST(test_tcp_no_auth_token)
{
    struct h_conn *c, *d;
    json_t *r;

    start_ns("    - {token: \"tok-a\", prefixes: [\"a:\"]}\n", NULL);
    c = h_connect_tcp(&D);
    ck_assert_ptr_nonnull(c);
    r = hello(c, NULL);
    ck_assert_msg(h_ok(r), "hello without a token refused");
    json_decref(r);
    ck_assert_int_eq(refused(lock(c, "a:1"), "a:1"), 0);
    h_assert_ping(c);
    d = h_connect_tcp(&D);
    h_expect_code(hello(d, "nope"), "unauthorized", "hello with a bad token");
    json_decref(hello(d, "tok-a"));
    ck_assert(acquired(lock(d, "a:1")));
    h_close(c);
    h_close(d);
}
END_TEST

/* An empty auth on TCP without listen.auth_token refused under namespaces:
 * "" must not match the unset token and pass as unrestricted. */
START_TEST(test_tcp_empty_auth_refused)
{
    struct h_conn *c, *root;
    json_t *r;

    start_ns("    - {token: \"tok-a\", prefixes: [\"a:\"]}\n", NULL);
    c = h_connect_tcp(&D);
    ck_assert_ptr_nonnull(c);
    h_expect_code(hello(c, ""), "unauthorized", "hello with an empty auth");
    ck_assert_int_eq(refused(lock(c, "z:1"), "z:1"), 0);
    ck_assert_int_eq(refused(lock(c, "a:1"), "a:1"), 0);
    root = h_connect_ok(&D);
    r = h_must(
        h_callf(root, T_MS, "{s:s,s:s}", "op", "lock.info", "key", "z:1"));
    ck_assert_msg(!jtrue(r, "locked"), "z:1 was locked: %s", h_dump(r));
    json_decref(r);
    h_close(root);
    h_close(c);
}
END_TEST

/* The operator's TCP identity (listen.admin_token, given either way) is
 * unrestricted under namespaces, for key ops and operator ops alike. */
START_TEST(test_tcp_admin_unrestricted)
{
    struct h_conn *a, *b, *app;
    json_t *r;

    start_ns("    - {token: \"tok-a\", prefixes: [\"a:\"]}\n",
             "  admin_token: \"op-secret\"\n");
    a = h_connect_tcp(&D);
    ck_assert_ptr_nonnull(a);
    r = h_must(h_callf(a, T_MS, "{s:s,s:s}", "op", "hello", "admin_token",
                       "op-secret"));
    json_decref(r);
    ck_assert(acquired(lock(a, "z:1")));
    ck_assert(acquired(lock(a, "a:9")));
    json_decref(h_must(h_callf(a, T_MS, "{s:s}", "op", "lock.list")));

    app = h_connect_tcp(&D);
    json_decref(h_must(hello(app, "tok-a")));
    ck_assert(acquired(lock(app, "a:1")));

    b = h_connect_tcp(&D);
    json_decref(h_must(hello(b, "op-secret")));
    r = h_must(h_callf(b, T_MS, "{s:s,s:s}", "op", "lock.force_unlock", "key",
                       "a:1"));
    ck_assert_msg(jtrue(r, "released"), "force_unlock: %s", h_dump(r));
    json_decref(r);
    ck_assert(acquired(lock(b, "y:1")));
    h_close(a);
    h_close(b);
    h_close(app);
}
END_TEST

/* --- reload ----------------------------------------------------------------- */

static void
rewrite(const char *path, const char *old, const char *new)
{
    char buf[16384];
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *at = strstr(buf, old);
    ck_assert_msg(at != NULL, "'%s' not in %s", old, path);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fwrite(buf, 1, (size_t)(at - buf), f);
    fputs(new, f);
    fputs(at + strlen(old), f);
    fclose(f);
}

START_TEST(test_reload_applies)
{
    struct h_conn *a;
    json_t *r;

    start_ns("    - {token: \"tok-a\", prefixes: [\"a:\"]}\n", NULL);
    a = h_connect_tcp(&D);
    r = hello(a, "tok-a");
    ck_assert(h_ok(r));
    json_decref(r);
    ck_assert(acquired(lock(a, "a:1")));

    /* A bad list is refused and the running one stays. */
    rewrite(D.conf, "prefixes: [\"a:\"]",
            "prefixes: [\"a:\"]}\n    - {user: no-such-user-here, "
            "prefixes: [\"z:\"]");
    h_daemon_signal(&D, SIGHUP);
    ck_assert(h_wait_log(&D, "no such user 'no-such-user-here'", 15000));
    ck_assert(acquired(lock(a, "a:2")));

    rewrite(D.conf,
            "prefixes: [\"a:\"]}\n    - {user: no-such-user-here, "
            "prefixes: [\"z:\"]",
            "prefixes: [\"c:\"]");
    h_daemon_signal(&D, SIGHUP);
    ck_assert(h_wait_log(&D, "listen.namespaces reloaded", 15000));
    /* The same session, the new prefixes. */
    ck_assert_int_eq(refused(lock(a, "a:3"), "a:3"), 0);
    ck_assert(acquired(lock(a, "c:1")));
    h_close(a);
    /* A clean exit (and, under LEASED_WRAPPER, no memory error). */
    ck_assert_int_eq(h_daemon_stop(&D), 0);
}
END_TEST

/* Sessions that said hello while there were no namespaces keep their
 * rights when a reload adds some: listen.auth_token and the admin
 * identity stay unrestricted, an entry's token names its entry. */
START_TEST(test_reload_adds_namespaces)
{
    struct h_conn *full, *adm, *a, *none;

    start_ns("    []\n", "  auth_token: \"full-secret\"\n"
                         "  admin_token: \"op-secret\"\n");
    full = h_connect_tcp(&D);
    json_decref(h_must(hello(full, "full-secret")));
    adm = h_connect_tcp(&D);
    json_decref(h_must(h_callf(adm, T_MS, "{s:s,s:s}", "op", "hello",
                               "admin_token", "op-secret")));
    ck_assert(acquired(lock(full, "z:0")));

    rewrite(D.conf, "namespaces:\n    []",
            "namespaces:\n    - {token: \"tok-a\", prefixes: [\"a:\"]}");
    h_daemon_signal(&D, SIGHUP);
    ck_assert(h_wait_log(&D, "listen.namespaces reloaded", 15000));
    ck_assert(acquired(lock(full, "z:1")));
    ck_assert(acquired(lock(adm, "z:2")));
    json_decref(h_must(h_callf(adm, T_MS, "{s:s}", "op", "lock.list")));
    /* Newcomers are held to the list. */
    a = h_connect_tcp(&D);
    json_decref(h_must(hello(a, "tok-a")));
    ck_assert(acquired(lock(a, "a:1")));
    ck_assert_int_eq(refused(lock(a, "z:3"), "z:3"), 0);
    none = h_connect_tcp(&D);
    h_expect_code(hello(none, "nope"), "unauthorized", "a bad token");
    h_close(full);
    h_close(adm);
    h_close(a);
    h_close(none);
}
END_TEST

/* --- configuration errors ------------------------------------------------ */

static void
conf_refused(const char *entries, const char *says, int line)
{
    char out[4096], err[4096], where[400];
    int status;

    if (R.pid == 0) {
        ck_assert_int_eq(h_redis_start(&R, NULL), 0);
        ck_assert_int_eq(h_daemon_start(&D, &R, NULL), 0);
    }
    char path[320];
    snprintf(path, sizeof path, "%s/ns.yml", D.dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "listen:\n  unix: %s/x.sock\n  namespaces:\n%s", D.dir,
            entries);
    fclose(f);
    const char *argv[] = {h_leased_bin(), "-t", "-c", path, NULL};
    status = h_run(argv, out, sizeof out, err, sizeof err, 10000);
    ck_assert_msg(status == 1, "leased -t exited %d for:\n%s", status,
                  entries);
    snprintf(where, sizeof where, "%s:%d:", path, line);
    ck_assert_msg(strstr(err, where) != NULL, "no %s in: %s", where, err);
    ck_assert_msg(strstr(err, says) != NULL, "\"%s\" not in: %s", says, err);
}

START_TEST(test_conf_errors)
{
    conf_refused("    - {user: no-such-user-here, prefixes: [\"a:\"]}\n",
                 "listen.namespaces: user: no such user", 4);
    conf_refused("    - {uid: 5, prefixes: [\"a:\"]}\n"
                 "    - {group: no-such-group-here, prefixes: [\"a:\"]}\n",
                 "no such group", 5);
    conf_refused("    - {uid: 5}\n", "the entry has no prefixes", 4);
    conf_refused("    - {uid: 5, prefixes: []}\n",
                 "prefixes: must name at least one prefix", 4);
    conf_refused("    - {uid: 5, gid: 6, prefixes: [\"a:\"]}\n",
                 "an entry names one identity", 4);
    conf_refused("    - {prefixes: [\"a:\"]}\n", "names no identity", 4);
    conf_refused("    - {uid: -1, prefixes: [\"a:\"]}\n", "uid: must be", 4);
    conf_refused("    - {uid: 5, prefixes: [\"a:\"], admin: maybe}\n",
                 "admin: expected true or false", 4);
    conf_refused("    - {uid: 5, prefix: [\"a:\"]}\n", "prefix: unknown key",
                 4);
    conf_refused("    - {token: \"\", prefixes: [\"a:\"]}\n",
                 "token: must not be empty", 4);
    conf_refused("    - {uid: 5, uid: 6, prefixes: [\"a:\"]}\n",
                 "uid: duplicate key", 4);
    conf_refused("    - uid\n", "each entry must be a mapping", 4);
    conf_refused("    yes\n", "expected a list of entries", 4);
}
END_TEST

int
main(void)
{
    const struct h_case cases[] = {
        H_CASE(unix_uids, 120),
        H_CASE(tcp_tokens, 60),
        H_CASE(tcp_no_auth_token, 60),
        H_CASE(reload_applies, 90),
        H_CASE(conf_errors, 120),
        H_CASE(tcp_empty_auth_refused, 60),
        H_CASE(tcp_admin_unrestricted, 60),
        H_CASE(reload_adds_namespaces, 90),
    };

    return H_MAIN(fx, cases);
}
