/* ld_journal: records written, replayed, retired and compacted; torn and
 * corrupt tails cut off at every byte; the fsync modes. Plain files in a
 * private temp dir, no daemon. */

#include "ld_common.h"

#include "ld_journal.h"
#include "ld_log.h"

#include "unit.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[256];
static char path[300];

static void
setup(void)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof(dir), "%s/check_journal.XXXXXX",
             t != NULL && t[0] != '\0' ? t : "/tmp");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    /* One level below the temp dir, so that open creates the parent. */
    snprintf(path, sizeof(path), "%s/state/inv.journal", dir);
}

static void
teardown(void)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

static off_t
file_size(const char *p)
{
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    return st.st_size;
}

static unsigned char *
slurp(const char *p, size_t *len)
{
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    size_t cap = (size_t)file_size(p) + 1;
    unsigned char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    *len = fread(buf, 1, cap, f);
    fclose(f);
    return buf;
}

static void
spit(const char *p, const unsigned char *buf, size_t len)
{
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static struct ld_journal *
jopen(enum ld_fsync_mode mode)
{
    struct ld_journal *j = NULL;
    ck_assert_int_eq(ld_journal_open(&j, path, mode), LD_OK);
    ck_assert_ptr_nonnull(j);
    return j;
}

static uint64_t
add(struct ld_journal *j, int64_t due, const char *key)
{
    uint64_t id = 0;
    ck_assert_int_eq(ld_journal_add(j, due, key, strlen(key), &id), LD_OK);
    ck_assert_uint_gt(id, 0);
    return id;
}

/* What ld_journal_each reported, flattened for comparisons. */
struct seen {
    size_t n;
    uint64_t ids[256];
    int64_t dues[256];
    uint64_t afters[256];
    unsigned flags[256];
    char keys[256][32];
};

static void
collect(const struct ld_journal_entry *e, void *arg)
{
    struct seen *s = arg;
    ck_assert_uint_lt(s->n, 256);
    s->ids[s->n] = e->id;
    s->dues[s->n] = e->due_ms;
    s->afters[s->n] = e->after_id;
    s->flags[s->n] = e->flags;
    ck_assert_uint_lt(e->key_len, sizeof(s->keys[0]));
    memcpy(s->keys[s->n], e->key, e->key_len);
    s->keys[s->n][e->key_len] = '\0';
    s->n++;
}

static void
seen_of(struct ld_journal *j, struct seen *s)
{
    memset(s, 0, sizeof(*s));
    ld_journal_each(j, collect, s);
    ck_assert_uint_eq(s->n, ld_journal_live(j));
}

START_TEST(test_crc32_vector)
{
    /* The check value of CRC-32/ISO-HDLC (zlib's crc32). */
    ck_assert_uint_eq(ld_crc32("123456789", 9), 0xcbf43926u);
    ck_assert_uint_eq(ld_crc32("", 0), 0);
}
END_TEST

START_TEST(test_append_replay)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    ck_assert_uint_eq(ld_journal_bytes(j), LD_JOURNAL_HEADER_BYTES);
    ck_assert_uint_eq(ld_journal_live(j), 0);

    uint64_t a = add(j, 1000, "user:1");
    uint64_t b = add(j, 2000, "user:2");
    uint64_t c = add(j, -5, "a key with spaces {and} braces");
    ck_assert(a < b && b < c);
    ck_assert_uint_eq(ld_journal_live(j), 3);
    ck_assert(ld_journal_dirty(j));
    ck_assert_int_eq(ld_journal_sync(j), LD_OK);
    ck_assert(!ld_journal_dirty(j));
    ck_assert_uint_eq(ld_journal_bytes(j), (uint64_t)file_size(path));
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(s.ids[0], a);
    ck_assert_uint_eq(s.ids[1], b);
    ck_assert_uint_eq(s.ids[2], c);
    ck_assert_int_eq(s.dues[0], 1000);
    ck_assert_int_eq(s.dues[1], 2000);
    ck_assert_int_eq(s.dues[2], -5);
    ck_assert_str_eq(s.keys[0], "user:1");
    ck_assert_str_eq(s.keys[1], "user:2");
    ck_assert_str_eq(s.keys[2], "a key with spaces {and} braces");
    ck_assert_uint_eq(ld_journal_dropped_bytes(j), 0);

    /* Ids keep growing across a reopen, so a done never hits the wrong
     * add. */
    uint64_t d = add(j, 3000, "user:3");
    ck_assert_uint_gt(d, c);
    ld_journal_close(j);
}
END_TEST

START_TEST(test_done_records)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    uint64_t a = add(j, 1, "k1");
    uint64_t b = add(j, 2, "k2");
    uint64_t c = add(j, 3, "k3");
    ck_assert_int_eq(ld_journal_done(j, b), LD_OK);
    ck_assert_uint_eq(ld_journal_live(j), 2);
    /* Twice, and an id never added: no record, no effect. */
    uint64_t before = ld_journal_bytes(j);
    ck_assert_int_eq(ld_journal_done(j, b), LD_OK);
    ck_assert_int_eq(ld_journal_done(j, 9999), LD_OK);
    ck_assert_uint_eq(ld_journal_bytes(j), before);
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(s.ids[0], a);
    ck_assert_uint_eq(s.ids[1], c);
    ck_assert_int_eq(ld_journal_done(j, a), LD_OK);
    ck_assert_int_eq(ld_journal_done(j, c), LD_OK);
    ck_assert_uint_eq(ld_journal_live(j), 0);
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    ck_assert_uint_eq(ld_journal_live(j), 0);
    ld_journal_close(j);
}
END_TEST

/* Three adds and a done; returns the file offsets where the last record
 * starts and ends. */
static void
write_four(off_t *last_start, off_t *last_end)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    add(j, 10, "first");
    uint64_t b = add(j, 20, "second");
    add(j, 30, "third");
    *last_start = (off_t)ld_journal_bytes(j);
    ck_assert_int_eq(ld_journal_done(j, b), LD_OK);
    *last_end = (off_t)ld_journal_bytes(j);
    ld_journal_close(j);
    /* ...and one more add after the done, so the last record is an add
     * with a key (the torn case with the most bytes to cut through). */
    j = jopen(LD_FSYNC_ALWAYS);
    add(j, 40, "fourth-key");
    *last_start = *last_end;
    *last_end = (off_t)ld_journal_bytes(j);
    ld_journal_close(j);
}

START_TEST(test_torn_tail_every_offset)
{
    off_t start, end;
    write_four(&start, &end);
    size_t len;
    unsigned char *whole = slurp(path, &len);
    ck_assert_uint_eq(len, (size_t)end);

    for (off_t cut = start; cut < end; cut++) {
        spit(path, whole, (size_t)cut);
        struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
        struct seen s;
        seen_of(j, &s);
        /* first and third live, second retired, fourth torn away. */
        ck_assert_msg(s.n == 2, "cut at %lld: %zu live", (long long)cut, s.n);
        ck_assert_str_eq(s.keys[0], "first");
        ck_assert_str_eq(s.keys[1], "third");
        ck_assert_uint_eq(ld_journal_bytes(j), (uint64_t)start);
        ck_assert_uint_eq(ld_journal_dropped_bytes(j),
                          (uint64_t)(cut - start));
        /* The torn bytes are gone from the file, and the next append
         * follows the last good record and replays cleanly. */
        ck_assert_int_eq(file_size(path), start);
        add(j, 50, "after");
        ld_journal_close(j);

        j = jopen(LD_FSYNC_ALWAYS);
        seen_of(j, &s);
        ck_assert_uint_eq(s.n, 3);
        ck_assert_str_eq(s.keys[2], "after");
        ck_assert_uint_eq(ld_journal_dropped_bytes(j), 0);
        ld_journal_close(j);
    }
    free(whole);
}
END_TEST

START_TEST(test_bad_crc_every_byte)
{
    off_t start, end;
    write_four(&start, &end);
    size_t len;
    unsigned char *whole = slurp(path, &len);

    /* Flip one bit anywhere in the last record: length, CRC, type, id,
     * due or key. Every one must be caught. */
    for (off_t at = start; at < end; at++) {
        unsigned char *bad = malloc(len);
        ck_assert_ptr_nonnull(bad);
        memcpy(bad, whole, len);
        bad[at] ^= 0x10;
        spit(path, bad, len);
        free(bad);

        struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
        struct seen s;
        seen_of(j, &s);
        ck_assert_msg(s.n == 2, "flip at %lld: %zu live", (long long)at, s.n);
        ck_assert_uint_eq(ld_journal_bytes(j), (uint64_t)start);
        ck_assert_uint_eq(ld_journal_dropped_bytes(j),
                          (uint64_t)(end - start));
        ck_assert_int_eq(file_size(path), start);
        ld_journal_close(j);
    }
    free(whole);
}
END_TEST

START_TEST(test_garbage_appended)
{
    off_t start, end;
    write_four(&start, &end);
    FILE *f = fopen(path, "ab");
    ck_assert_ptr_nonnull(f);
    fputs("this is not a record, just junk at the end\n", f);
    fclose(f);

    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_str_eq(s.keys[2], "fourth-key");
    ck_assert_uint_eq(ld_journal_bytes(j), (uint64_t)end);
    ck_assert_int_eq(file_size(path), end);
    ld_journal_close(j);
}
END_TEST

START_TEST(test_not_a_journal)
{
    struct ld_journal *j = NULL;
    char sub[300];

    snprintf(sub, sizeof(sub), "%s/state", dir);
    mkdir(sub, 0700);
    spit(path, (const unsigned char *)"hello, world\n", 13);
    ck_assert_int_eq(ld_journal_open(&j, path, LD_FSYNC_ALWAYS), LD_ERR);
    /* Nothing was overwritten. */
    ck_assert_int_eq(file_size(path), 13);

    /* Too short to be a header, and not the start of one. */
    spit(path, (const unsigned char *)"xy", 2);
    ck_assert_int_eq(ld_journal_open(&j, path, LD_FSYNC_ALWAYS), LD_ERR);

    /* A header torn while the file was being created is just a new
     * journal. */
    spit(path, (const unsigned char *)"LDJ", 3);
    j = jopen(LD_FSYNC_ALWAYS);
    ck_assert_uint_eq(ld_journal_live(j), 0);
    ck_assert_int_eq(file_size(path), LD_JOURNAL_HEADER_BYTES);
    ld_journal_close(j);
}
END_TEST

START_TEST(test_exclusive_lock)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    struct ld_journal *k = NULL;
    /* flock locks belong to the open file description, so a second open
     * in the same process conflicts just as another daemon would. */
    ck_assert_int_eq(ld_journal_open(&k, path, LD_FSYNC_ALWAYS), LD_ERR);
    ld_journal_close(j);
    k = jopen(LD_FSYNC_ALWAYS);
    ld_journal_close(k);
}
END_TEST

START_TEST(test_compaction)
{
    struct ld_journal *j = jopen(LD_FSYNC_EVERYSEC);
    uint64_t ids[100];
    char key[32];

    ld_journal_set_compact_min_bytes(j, 512);
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "key:%d", i);
        ids[i] = add(j, 1000 + i, key);
    }
    ck_assert(!ld_journal_should_compact(j));
    for (int i = 0; i < 100; i++) {
        if (i % 10 != 3) {
            ck_assert_int_eq(ld_journal_done(j, ids[i]), LD_OK);
        }
    }
    ck_assert_uint_eq(ld_journal_live(j), 10);
    ck_assert(ld_journal_should_compact(j));
    uint64_t before = ld_journal_bytes(j);
    uint64_t syncs = ld_journal_syncs(j);

    ck_assert_int_eq(ld_journal_compact(j), LD_OK);
    ck_assert_uint_lt(ld_journal_bytes(j), before / 10);
    ck_assert_uint_eq(ld_journal_bytes(j), (uint64_t)file_size(path));
    ck_assert_uint_gt(ld_journal_syncs(j), syncs);
    ck_assert(!ld_journal_should_compact(j));
    ck_assert(!ld_journal_dirty(j));
    char tmp[320];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    ck_assert_int_ne(access(tmp, F_OK), 0);

    /* Appends continue in the new file and the lock moved with it. */
    uint64_t extra = add(j, 5, "extra");
    ck_assert_uint_gt(extra, ids[99]);
    struct ld_journal *k = NULL;
    ck_assert_int_eq(ld_journal_open(&k, path, LD_FSYNC_ALWAYS), LD_ERR);
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 11);
    for (int i = 0; i < 10; i++) {
        snprintf(key, sizeof(key), "key:%d", i * 10 + 3);
        ck_assert_str_eq(s.keys[i], key);
        ck_assert_uint_eq(s.ids[i], ids[i * 10 + 3]);
        ck_assert_int_eq(s.dues[i], 1000 + i * 10 + 3);
    }
    ck_assert_str_eq(s.keys[10], "extra");
    ld_journal_close(j);
}
END_TEST

START_TEST(test_compaction_to_empty)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    ld_journal_set_compact_min_bytes(j, 64);
    for (int i = 0; i < 20; i++) {
        uint64_t id = add(j, i, "k");
        ck_assert_int_eq(ld_journal_done(j, id), LD_OK);
    }
    ck_assert(ld_journal_should_compact(j));
    ck_assert_int_eq(ld_journal_compact(j), LD_OK);
    ck_assert_uint_eq(ld_journal_bytes(j), LD_JOURNAL_HEADER_BYTES);
    ld_journal_close(j);
    j = jopen(LD_FSYNC_ALWAYS);
    ck_assert_uint_eq(ld_journal_live(j), 0);
    ld_journal_close(j);
}
END_TEST

START_TEST(test_stale_tmp_removed)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    add(j, 1, "kept");
    ld_journal_close(j);
    /* A compaction that died before its rename. */
    char tmp[320];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    spit(tmp, (const unsigned char *)"LDJRNL1\npartial", 15);
    j = jopen(LD_FSYNC_ALWAYS);
    ck_assert_uint_eq(ld_journal_live(j), 1);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    ld_journal_close(j);
}
END_TEST

START_TEST(test_fsync_modes)
{
    struct ld_journal *j = jopen(LD_FSYNC_EVERYSEC);
    ck_assert_int_eq(ld_journal_mode(j), LD_FSYNC_EVERYSEC);
    uint64_t s0 = ld_journal_syncs(j);

    /* Appends never sync by themselves: under everysec the periodic
     * timer does it, under always the caller before it answers. */
    uint64_t a = add(j, 1, "a");
    add(j, 2, "b");
    ld_journal_done(j, a);
    ck_assert_uint_eq(ld_journal_syncs(j), s0);
    ck_assert(ld_journal_dirty(j));

    /* One sync covers everything appended since the last one... */
    ck_assert_int_eq(ld_journal_sync(j), LD_OK);
    ck_assert_uint_eq(ld_journal_syncs(j), s0 + 1);
    ck_assert(!ld_journal_dirty(j));
    /* ...and a sync with nothing new costs nothing. */
    ck_assert_int_eq(ld_journal_sync(j), LD_OK);
    ck_assert_uint_eq(ld_journal_syncs(j), s0 + 1);

    /* The data is in the file before any sync (a killed process loses
     * nothing that write() took). */
    add(j, 3, "c");
    ck_assert(ld_journal_dirty(j));
    ck_assert_uint_eq((uint64_t)file_size(path), ld_journal_bytes(j));
    ck_assert_uint_eq(ld_journal_syncs(j), s0 + 1);
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    ck_assert_uint_eq(ld_journal_live(j), 2);
    ld_journal_close(j);
}
END_TEST

START_TEST(test_bad_keys_refused)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    uint64_t id = 0;
    uint64_t before = ld_journal_bytes(j);
    ck_assert_int_eq(ld_journal_add(j, 1, "", 0, &id), LD_ERR);
    ck_assert_uint_eq(ld_journal_bytes(j), before);
    ld_journal_close(j);
}
END_TEST

/* A second delete recorded as waiting for its first: read back with its
 * link and delay, kept by compaction, retired by done; plain adds beside
 * it read as before, and a torn "add after" is cut like any record. */
START_TEST(test_add_after)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    uint64_t first = add(j, 1000, "k1");
    uint64_t second = 0;
    ck_assert_int_eq(ld_journal_add_after(j, first, 1500, "k1", 2, &second),
                     LD_OK);
    ck_assert_uint_gt(second, first);
    /* Only an earlier add can be waited for. */
    uint64_t bad = 0;
    ck_assert_int_eq(ld_journal_add_after(j, 0, 10, "k", 1, &bad), LD_ERR);
    ck_assert_int_eq(ld_journal_add_after(j, 999, 10, "k", 1, &bad), LD_ERR);
    uint64_t plain = add(j, 2000, "k2");
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 3);
    ck_assert_uint_eq(s.ids[0], first);
    ck_assert_uint_eq(s.afters[0], 0);
    ck_assert_uint_eq(s.ids[1], second);
    ck_assert_uint_eq(s.afters[1], first);
    ck_assert_int_eq(s.dues[1], 1500);
    ck_assert_str_eq(s.keys[1], "k1");
    ck_assert_uint_eq(s.ids[2], plain);
    ck_assert_int_eq(s.dues[2], 2000);

    /* Compaction keeps the link; done retires it. */
    ck_assert_int_eq(ld_journal_done(j, first), LD_OK);
    ck_assert_int_eq(ld_journal_compact(j), LD_OK);
    ld_journal_close(j);
    j = jopen(LD_FSYNC_ALWAYS);
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(s.ids[0], second);
    ck_assert_uint_eq(s.afters[0], first);
    ck_assert_int_eq(s.dues[0], 1500);
    ck_assert_int_eq(ld_journal_done(j, second), LD_OK);
    uint64_t third = 0;
    ck_assert_int_eq(ld_journal_add_after(j, plain, 7, "k3", 2, &third),
                     LD_OK);
    ld_journal_close(j);

    /* Torn in the middle of the new record: cut off, the rest stays. */
    size_t len;
    unsigned char *buf = slurp(path, &len);
    spit(path, buf, len - 3);
    free(buf);
    j = jopen(LD_FSYNC_ALWAYS);
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_uint_eq(s.ids[0], plain);
    ck_assert_uint_gt(ld_journal_dropped_bytes(j), 0);
    ld_journal_close(j);
}
END_TEST

/* ---- fault injection ---------------------------------------------------- */

static int fail_datasync_left; /* fdatasync calls still to fail */
static bool fail_dir_fsync;    /* fsync of a directory fails */
static bool fail_file_fsync;   /* fsync of a regular file fails */
static ino_t synced_dirs[16];
static size_t n_synced_dirs;

static int
fake_fdatasync(int fd)
{
    if (fail_datasync_left > 0) {
        fail_datasync_left--;
        errno = EIO;
        return -1;
    }
    return fdatasync(fd);
}

static int
fake_fsync(int fd)
{
    struct stat st;
    ck_assert_int_eq(fstat(fd, &st), 0);
    if (S_ISDIR(st.st_mode)) {
        if (n_synced_dirs < LD_ARRAY_LEN(synced_dirs)) {
            synced_dirs[n_synced_dirs++] = st.st_ino;
        }
        if (fail_dir_fsync) {
            errno = EIO;
            return -1;
        }
    } else if (fail_file_fsync) {
        errno = EIO;
        return -1;
    }
    return fsync(fd);
}

static void
faults_setup(void)
{
    setup();
    fail_datasync_left = 0;
    fail_dir_fsync = fail_file_fsync = false;
    n_synced_dirs = 0;
    ld_journal_fdatasync_fn = fake_fdatasync;
    ld_journal_fsync_fn = fake_fsync;
}

static void
faults_teardown(void)
{
    ld_journal_fdatasync_fn = fdatasync;
    ld_journal_fsync_fn = fsync;
    teardown();
}

static ino_t
inode_of(const char *p)
{
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    return st.st_ino;
}

static bool
dir_synced(const char *p)
{
    ino_t ino = inode_of(p);
    for (size_t i = 0; i < n_synced_dirs; i++) {
        if (synced_dirs[i] == ino) {
            return true;
        }
    }
    return false;
}

/* Every directory the journal's open creates is made durable in its own
 * parent, and the new file in its directory. */
START_TEST(test_created_dirs_synced)
{
    char top[300], mid[320], leaf[340];
    snprintf(top, sizeof(top), "%s/a", dir);
    snprintf(mid, sizeof(mid), "%s/a/b", dir);
    snprintf(leaf, sizeof(leaf), "%s/a/b/inv.journal", dir);
    struct ld_journal *j = NULL;
    ck_assert_int_eq(ld_journal_open(&j, leaf, LD_FSYNC_ALWAYS), LD_OK);
    ck_assert_msg(dir_synced(dir), "the parent of a/ was not synced");
    ck_assert_msg(dir_synced(top), "the parent of a/b/ was not synced");
    ck_assert_msg(dir_synced(mid), "the journal's directory was not synced");
    ld_journal_close(j);

    /* A directory sync that fails fails the open: the journal's name
     * would not be known to survive. */
    snprintf(leaf, sizeof(leaf), "%s/c/inv.journal", dir);
    fail_dir_fsync = true;
    ck_assert_int_eq(ld_journal_open(&j, leaf, LD_FSYNC_ALWAYS), LD_ERR);
}
END_TEST

/* After a failed fdatasync nothing is trusted until the whole journal has
 * been rewritten to a new file: a later fdatasync that succeeds is not
 * enough (the kernel may have dropped the pages it could not write). */
START_TEST(test_fdatasync_failure_rewrites)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    uint64_t a = add(j, 1, "a");
    ino_t ino = inode_of(path);
    fail_datasync_left = 1;
    ck_assert_int_eq(ld_journal_sync(j), LD_ERR);
    ck_assert(ld_journal_failed(j));

    /* fdatasync works again, but the rewrite cannot be made durable:
     * still failed, whatever is appended. */
    add(j, 2, "b");
    fail_file_fsync = true;
    ck_assert_int_eq(ld_journal_sync(j), LD_ERR);
    ck_assert(ld_journal_failed(j));
    ck_assert_int_eq(ld_journal_sync(j), LD_ERR);
    ck_assert_uint_eq(inode_of(path), ino);

    /* The rewrite succeeds: a new file, whole, and trusted again. */
    fail_file_fsync = false;
    ck_assert_int_eq(ld_journal_sync(j), LD_OK);
    ck_assert(!ld_journal_failed(j));
    ck_assert_uint_ne(inode_of(path), ino);
    ck_assert(!ld_journal_dirty(j));
    ck_assert_int_eq(ld_journal_done(j, a), LD_OK);
    add(j, 3, "c");
    ck_assert_int_eq(ld_journal_sync(j), LD_OK);
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_str_eq(s.keys[0], "b");
    ck_assert_str_eq(s.keys[1], "c");
    ld_journal_close(j);
}
END_TEST

/* The sync in two halves (the worker thread's way): what is appended
 * while the fdatasync runs belongs to the next sync, compaction waits,
 * and a failed fdatasync fails the journal as a synchronous one does. */
START_TEST(test_split_sync)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    int fd = -1;
    ck_assert_int_eq(ld_journal_sync_begin(j, &fd), 0); /* nothing yet */
    uint64_t a = add(j, 1, "a");
    ck_assert_int_eq(ld_journal_sync_begin(j, &fd), 1);
    ck_assert_int_ge(fd, 0);
    ck_assert(!ld_journal_dirty(j));
    add(j, 2, "b"); /* during the sync */
    ck_assert(ld_journal_dirty(j));
    ld_journal_set_compact_min_bytes(j, 1);
    ck_assert_int_eq(ld_journal_done(j, a), LD_OK);
    ck_assert(!ld_journal_should_compact(j));
    ck_assert_int_eq(ld_journal_compact(j), LD_ERR);
    ck_assert_int_eq(fake_fdatasync(fd), 0);
    ck_assert_int_eq(ld_journal_sync_end(j, 0, 0), LD_OK);
    ck_assert(ld_journal_dirty(j)); /* "b" still to sync */

    ck_assert_int_eq(ld_journal_sync_begin(j, &fd), 1);
    ck_assert_int_eq(ld_journal_sync_end(j, -1, EIO), LD_ERR);
    ck_assert(ld_journal_failed(j));
    /* The next begin rewrites the journal from memory, as
     * ld_journal_sync does, and needs no worker. */
    ck_assert_int_eq(ld_journal_sync_begin(j, &fd), 0);
    ck_assert(!ld_journal_failed(j));
    ld_journal_close(j);

    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 1);
    ck_assert_str_eq(s.keys[0], "b");
    ld_journal_close(j);
}
END_TEST

/* A compaction whose directory sync fails fails, and the journal goes on
 * with the old file under its name. */
START_TEST(test_compaction_dirsync_failure)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    ld_journal_set_compact_min_bytes(j, 64);
    uint64_t keep = add(j, 7, "keep");
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(ld_journal_done(j, add(j, i, "gone")), LD_OK);
    }
    ck_assert(ld_journal_should_compact(j));
    ino_t ino = inode_of(path);
    uint64_t bytes = ld_journal_bytes(j);

    fail_dir_fsync = true;
    ck_assert_int_eq(ld_journal_compact(j), LD_ERR);
    fail_dir_fsync = false;
    ck_assert_uint_eq(inode_of(path), ino);
    ck_assert_uint_eq(ld_journal_bytes(j), bytes);
    char other[320];
    snprintf(other, sizeof(other), "%s.old", path);
    ck_assert_int_ne(access(other, F_OK), 0);
    snprintf(other, sizeof(other), "%s.tmp", path);
    ck_assert_int_ne(access(other, F_OK), 0);

    /* Appends land in the file the name points at. */
    add(j, 8, "after");
    ck_assert_int_eq(ld_journal_sync(j), LD_OK);
    ck_assert_uint_eq((uint64_t)file_size(path), ld_journal_bytes(j));
    ld_journal_close(j);
    j = jopen(LD_FSYNC_ALWAYS);
    struct seen s;
    seen_of(j, &s);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(s.ids[0], keep);
    ck_assert_str_eq(s.keys[1], "after");
    ld_journal_close(j);
}
END_TEST

/* A stale mark rides in the type byte: kept across replay and
 * compaction, and the records without it read as before. */
START_TEST(test_stale_flag)
{
    struct ld_journal *j = jopen(LD_FSYNC_ALWAYS);
    uint64_t plain = add(j, 1000, "plain");
    uint64_t s1 = 0, s2 = 0;
    ck_assert_int_eq(ld_journal_add_flags(j, 2000, LD_JOURNAL_F_STALE, "mark",
                                          4, &s1),
                     LD_OK);
    ck_assert_int_eq(ld_journal_add_after_flags(j, s1, 500, LD_JOURNAL_F_STALE,
                                                "mark", 4, &s2),
                     LD_OK);
    uint64_t after = 0;
    ck_assert_int_eq(ld_journal_add_after(j, plain, 700, "plain", 5, &after),
                     LD_OK);
    ld_journal_close(j);

    /* On disk: type bytes 0x01, 0x81, 0x83, 0x03. */
    size_t len = 0;
    unsigned char *buf = slurp(path, &len);
    size_t off = LD_JOURNAL_HEADER_BYTES;
    const unsigned char want[] = {0x01, 0x81, 0x83, 0x03};
    for (size_t i = 0; i < 4; i++) {
        ck_assert_uint_lt(off + 8, len);
        ck_assert_uint_eq(buf[off + 8], want[i]);
        off += 8 + (buf[off] | buf[off + 1] << 8 | buf[off + 2] << 16 |
                    (size_t)buf[off + 3] << 24);
    }
    free(buf);

    struct seen s;
    for (int round = 0; round < 2; round++) {
        j = jopen(LD_FSYNC_ALWAYS);
        seen_of(j, &s);
        ck_assert_uint_eq(s.n, 4);
        ck_assert_uint_eq(s.flags[0], 0);
        ck_assert_uint_eq(s.flags[1], LD_JOURNAL_F_STALE);
        ck_assert_uint_eq(s.flags[2], LD_JOURNAL_F_STALE);
        ck_assert_uint_eq(s.afters[2], s1);
        ck_assert_uint_eq(s.flags[3], 0);
        /* The second round reads the compacted file. */
        ck_assert_int_eq(ld_journal_compact(j), LD_OK);
        ld_journal_close(j);
    }
}
END_TEST

static Suite *
journal_suite(void)
{
    Suite *s = suite_create("journal");
    struct {
        const char *name;
        const TTest *fn;
    } tests[] = {
        {"crc32_vector", test_crc32_vector},
        {"append_replay", test_append_replay},
        {"done_records", test_done_records},
        {"torn_tail_every_offset", test_torn_tail_every_offset},
        {"bad_crc_every_byte", test_bad_crc_every_byte},
        {"garbage_appended", test_garbage_appended},
        {"not_a_journal", test_not_a_journal},
        {"exclusive_lock", test_exclusive_lock},
        {"compaction", test_compaction},
        {"compaction_to_empty", test_compaction_to_empty},
        {"stale_tmp_removed", test_stale_tmp_removed},
        {"fsync_modes", test_fsync_modes},
        {"bad_keys_refused", test_bad_keys_refused},
        {"add_after", test_add_after},
        {"stale_flag", test_stale_flag},
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(tests); i++) {
        TCase *tc = tcase_create(tests[i].name);
        tcase_add_checked_fixture(tc, setup, teardown);
        tcase_set_timeout(tc, 30);
        tcase_add_test(tc, tests[i].fn);
        suite_add_tcase(s, tc);
    }
    const struct {
        const char *name;
        const TTest *fn;
    } fault_tests[] = {
        {"created_dirs_synced", test_created_dirs_synced},
        {"fdatasync_failure_rewrites", test_fdatasync_failure_rewrites},
        {"compaction_dirsync_failure", test_compaction_dirsync_failure},
        {"split_sync", test_split_sync},
    };
    for (size_t i = 0; i < LD_ARRAY_LEN(fault_tests); i++) {
        TCase *tc = tcase_create(fault_tests[i].name);
        tcase_add_checked_fixture(tc, faults_setup, faults_teardown);
        tcase_set_timeout(tc, 30);
        tcase_add_test(tc, fault_tests[i].fn);
        suite_add_tcase(s, tc);
    }
    return s;
}

int
main(void)
{
    /* Torn tails are logged at warn by design; keep the test log to
     * what fails. */
    ld_log_set_level(LD_LOG_ERROR);
    return ld_unit_run(journal_suite());
}
