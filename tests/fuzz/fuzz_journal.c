/*
 * Fuzz target: replay of the invalidation journal. The input is the whole
 * file as a crash or a damaged disk may have left it; opening must cut a
 * bad tail off (or refuse a file that is not a journal) and never crash,
 * leak or read past what the file holds; what is appended afterwards must
 * replay. Each input is replayed as it is and, when that differs, with
 * every record's CRC made right.
 */
#include "ld_journal.h"
#include "ld_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char tmpdir[64];
static char path[128];
static volatile unsigned sink;

static void
cleanup_files(void)
{
    unlink(path);
    rmdir(tmpdir);
}

static void
setup(void)
{
    /* Malformed input is expected and its log lines are noise; a level
     * above every level silences them (ld_log_set_level keeps errors). */
    ld_log_level = LD_LOG_ERROR + 1;
    /* A tmpfs keeps the journal's syncs out of the cost of an input. */
    snprintf(tmpdir, sizeof(tmpdir), "%s/ld-fuzz-journal.XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        abort();
    }
    snprintf(path, sizeof(path), "%s/journal", tmpdir);
    atexit(cleanup_files);
}

/* Touch every byte of every key, so that a key pointing outside what
 * replay read is caught by the sanitizers. */
static void
visit(const struct ld_journal_entry *e, void *arg)
{
    unsigned *sum = arg;
    for (size_t i = 0; i < e->key_len; i++) {
        *sum += (unsigned char)e->key[i];
    }
    *sum += (unsigned)e->id + (unsigned)e->due_ms;
}

/* A copy of the input with every record's CRC made right, so that the
 * fuzzer's changes to record bodies reach the replay of adds and dones
 * instead of all ending at the CRC check. */
static uint8_t *
fix_crcs(const uint8_t *data, size_t size)
{
    uint8_t *copy = malloc(size > 0 ? size : 1);
    if (copy == NULL) {
        abort();
    }
    memcpy(copy, data, size);
    size_t off = LD_JOURNAL_HEADER_BYTES;
    while (size >= off && size - off >= LD_JOURNAL_RECORD_OVERHEAD) {
        uint8_t *rec = copy + off;
        uint32_t len = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 |
                       (uint32_t)rec[2] << 16 | (uint32_t)rec[3] << 24;
        if (len > size - off - LD_JOURNAL_RECORD_OVERHEAD) {
            break;
        }
        uint32_t crc = ld_crc32(rec + LD_JOURNAL_RECORD_OVERHEAD, len);
        for (int i = 0; i < 4; i++) {
            rec[4 + i] = (uint8_t)(crc >> (8 * i));
        }
        off += LD_JOURNAL_RECORD_OVERHEAD + (size_t)len;
    }
    return copy;
}

static void
replay(const uint8_t *data, size_t size)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror("open");
        abort();
    }
    size_t off = 0;
    while (off < size) {
        ssize_t n = write(fd, data + off, size - off);
        if (n <= 0) {
            perror("write");
            abort();
        }
        off += (size_t)n;
    }
    close(fd);

    struct ld_journal *j = NULL;
    if (ld_journal_open(&j, path, LD_FSYNC_EVERYSEC) != LD_OK) {
        return;
    }
    unsigned sum = 0;
    ld_journal_each(j, visit, &sum);
    sink = sum;

    /* Appends continue after the last good record: one more promise must
     * replay next to what was there, whatever tail was cut off. */
    size_t live = ld_journal_live(j);
    uint64_t id = 0;
    if (ld_journal_add(j, 1, "fuzz", 4, &id) != LD_OK) {
        /* Refusing is allowed only when the ids ran out (a file holding
         * the largest id); the caller then knows nothing was promised. */
        if (errno != EOVERFLOW) {
            abort();
        }
        ld_journal_close(j);
        return;
    }
    ld_journal_close(j);
    j = NULL;
    if (ld_journal_open(&j, path, LD_FSYNC_EVERYSEC) != LD_OK ||
        ld_journal_live(j) != live + 1 || ld_journal_dropped_bytes(j) != 0) {
        fprintf(stderr, "journal: append after replay did not replay\n");
        abort();
    }
    ld_journal_close(j);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        setup();
        ready = true;
    }
    replay(data, size);
    uint8_t *fixed = fix_crcs(data, size);
    if (memcmp(fixed, data, size) != 0) {
        replay(fixed, size);
    }
    free(fixed);
    return 0;
}
