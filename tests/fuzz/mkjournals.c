/*
 * Writes the seed corpus of fuzz_journal with the real journal code, so
 * that the seeds follow the file format wherever it goes: whole journals
 * of several shapes, and copies of one cut or damaged the ways a crash or
 * a disk can leave it. Usage: mkjournals DIR (DIR must exist).
 */
#include "ld_journal.h"
#include "ld_log.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir;

static void
die(const char *what)
{
    perror(what);
    exit(1);
}

static struct ld_journal *
start(const char *name, char *path, size_t len)
{
    struct ld_journal *j = NULL;
    snprintf(path, len, "%s/%s", dir, name);
    unlink(path);
    if (ld_journal_open(&j, path, LD_FSYNC_EVERYSEC) != LD_OK) {
        die(path);
    }
    return j;
}

static uint64_t
add(struct ld_journal *j, int64_t due, const char *key, size_t len)
{
    uint64_t id = 0;
    if (ld_journal_add(j, due, key, len, &id) != LD_OK) {
        die("ld_journal_add");
    }
    return id;
}

static void
slurp(const char *path, char **data, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        die(path);
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        die(path);
    }
    *len = (size_t)st.st_size;
    *data = malloc(*len + 1);
    if (*data == NULL || fread(*data, 1, *len, f) != *len) {
        die(path);
    }
    fclose(f);
}

static void
spit(const char *name, const char *data, size_t len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        die(path);
    }
}

int
main(int argc, char **argv)
{
    char path[4096];
    struct ld_journal *j;
    const int64_t due = 1790000000000LL;

    if (argc != 2) {
        fprintf(stderr, "usage: mkjournals DIR\n");
        return 2;
    }
    dir = argv[1];
    ld_log_set_level(LD_LOG_ERROR);

    j = start("empty", path, sizeof(path));
    ld_journal_close(j);

    j = start("one-add", path, sizeof(path));
    add(j, due, "user:1", 6);
    ld_journal_close(j);

    j = start("add-done", path, sizeof(path));
    ld_journal_done(j, add(j, due, "user:1", 6));
    ld_journal_close(j);

    j = start("mixed", path, sizeof(path));
    {
        uint64_t a = add(j, due, "user:1", 6);
        add(j, due + 1000, "user:2", 6);
        uint64_t c = add(j, due + 2000, "order:77", 8);
        add(j, 0, "k", 1);
        ld_journal_done(j, c);
        add(j, -1, "negative-due", 12);
        ld_journal_done(j, a);
        add(j, due, "user:1", 6); /* the same key again, a new promise */
    }
    ld_journal_close(j);

    j = start("binary-key", path, sizeof(path));
    add(j, due, "a\0b\n\xff\xfe{\"", 8);
    add(j, due, "\xe2\x82\xac-utf8", 8);
    ld_journal_close(j);

    j = start("long-key", path, sizeof(path));
    {
        size_t n = 3000;
        char *key = malloc(n);
        if (key == NULL) {
            die("malloc");
        }
        memset(key, 'x', n);
        add(j, due, key, n);
        free(key);
    }
    ld_journal_close(j);

    /* Mostly dead records, then compaction: the rewritten file. */
    j = start("compacted", path, sizeof(path));
    ld_journal_set_compact_min_bytes(j, 1);
    for (int i = 0; i < 20; i++) {
        char key[32];
        int n = snprintf(key, sizeof(key), "session:%d", i);
        uint64_t id = add(j, due + i, key, (size_t)n);
        if (i % 5 != 0) {
            ld_journal_done(j, id);
        }
    }
    if (ld_journal_should_compact(j) && ld_journal_compact(j) != LD_OK) {
        die("ld_journal_compact");
    }
    add(j, due, "after-compaction", 16);
    ld_journal_close(j);

    /* Damaged copies of "mixed": what replay must cut off. */
    char *m;
    size_t mlen;
    snprintf(path, sizeof(path), "%s/mixed", dir);
    slurp(path, &m, &mlen);
    spit("torn-header", m, 5);
    spit("torn-length", m, LD_JOURNAL_HEADER_BYTES + 3);
    spit("torn-body", m, LD_JOURNAL_HEADER_BYTES + 8 + 10);
    spit("torn-last", m, mlen - 3);
    {
        char *bad = malloc(mlen);
        if (bad == NULL) {
            die("malloc");
        }
        /* A CRC byte of the second record. */
        memcpy(bad, m, mlen);
        bad[LD_JOURNAL_HEADER_BYTES + 8 + 17 + 6 + 4] ^= 0x40;
        spit("bad-crc", bad, mlen);
        /* The first record claims a huge body. */
        memcpy(bad, m, mlen);
        bad[LD_JOURNAL_HEADER_BYTES + 3] = 0x7f;
        spit("huge-length", bad, mlen);
        /* A body too short to hold type, id and due. */
        memcpy(bad, m, mlen);
        memset(bad + LD_JOURNAL_HEADER_BYTES, 0, 4);
        bad[LD_JOURNAL_HEADER_BYTES] = 3;
        spit("short-body", bad, mlen);
        /* An unknown record type (the CRC then fails too). */
        memcpy(bad, m, mlen);
        bad[LD_JOURNAL_HEADER_BYTES + 8] = 9;
        spit("bad-type", bad, mlen);
        /* Garbage appended after good records. */
        char *tail = malloc(mlen + 16);
        if (tail == NULL) {
            die("malloc");
        }
        memcpy(tail, m, mlen);
        memcpy(tail + mlen, "\x11\x00\x00\x00garbage-tail", 16);
        spit("garbage-tail", tail, mlen + 16);
        free(tail);
        free(bad);
    }
    spit("wrong-magic", "LDJRNL2\n", 8);
    spit("not-a-journal", "redis.address: 127.0.0.1:6379\n", 30);
    spit("zero-bytes", "", 0);
    free(m);
    return 0;
}
