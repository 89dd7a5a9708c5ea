#ifndef LD_JOURNAL_H
#define LD_JOURNAL_H

#include "ld_common.h"
#include "ld_conf.h"

/*
 * The invalidation journal: an append-only file of deletes that the daemon
 * has promised and not yet carried out. An "add" record names a key and
 * the wall-clock time its delete is due; a "done" record retires an add.
 * Replaying the file gives the live adds (adds without a done), which is
 * exactly the work a restarted daemon still owes Redis.
 *
 * File layout (integers little-endian):
 *   header  8 bytes  "LDJRNL1\n"
 *   record  u32 body_len | u32 crc32(body) | body
 *   body    u8 type (1 add, 2 done) | u64 id | i64 due_ms | key bytes
 *           u8 type 3 (add after) | u64 id | i64 delay_ms | u64 after_id
 *           | key bytes
 * body_len is 17 + the key's length (25 + it for type 3); done records
 * carry no key and due 0. crc32 is the IEEE/zlib CRC-32 of the body.
 *
 * An "add after" is a delete that is due DELAY_MS after the add AFTER_ID
 * has been carried out (the second delete of an invalidation: it must not
 * run together with the first when both are late). Files without type 3
 * records read as before. When AFTER_ID is no longer live at replay, its
 * delete happened at an unknown time before the restart, so the second
 * one is due DELAY_MS after the replay.
 *
 * The high bit of an add's type byte (LD_JOURNAL_F_STALE: 0x81, 0x83)
 * says the delete is a stale mark (cache.invalidate "stale"): the entry
 * is marked stale instead of deleted. Files without it read as before.
 *
 * Replay stops at the first record whose length is impossible, that runs
 * past the end of the file, or whose CRC does not match: that is a write
 * torn by a crash (or a damaged disk), so everything from there on is cut
 * off, with one warning, and appends continue after the last good record.
 *
 * The module does plain blocking file I/O and knows nothing of the event
 * loop, so it is unit-tested on its own; the cache module decides when to
 * sync and compact.
 */

#define LD_JOURNAL_MAGIC "LDJRNL1\n"
#define LD_JOURNAL_HEADER_BYTES 8
#define LD_JOURNAL_RECORD_OVERHEAD 8 /* length and CRC */
#define LD_JOURNAL_BODY_MIN 17       /* type, id, due */
#define LD_JOURNAL_MAX_KEY (1u << 20)

enum ld_journal_type {
    LD_JOURNAL_ADD = 1,
    LD_JOURNAL_DONE = 2,
    LD_JOURNAL_ADD_AFTER = 3
};
#define LD_JOURNAL_AFTER_BYTES 8 /* after_id, type 3 only */
/* Flags of an add, kept in the high bits of its type byte. */
#define LD_JOURNAL_F_STALE 0x80u
#define LD_JOURNAL_FLAGS LD_JOURNAL_F_STALE

struct ld_journal;

/* One live add, as handed to ld_journal_each. KEY is not NUL-terminated
 * and is valid only during the callback. */
struct ld_journal_entry {
    uint64_t id;
    int64_t due_ms;    /* wall clock, ms since the epoch; for an add
                          * after another, the delay after its delete */
    uint64_t after_id; /* 0, or the add this one waits for */
    unsigned flags;    /* LD_JOURNAL_F_* */
    const char *key;
    size_t key_len;
};

/* Open PATH (creating it, and its parent directories, when missing: each
 * directory created is synced in its own parent, so that the journal's
 * name survives a crash), take an
 * exclusive lock on it so that two daemons never share one journal, and
 * replay it. A torn or corrupt tail is cut off (one warning). Returns
 * LD_ERR (logged, errno kept) when the file cannot be opened, is locked by
 * another process, or is not a journal. */
int ld_journal_open(struct ld_journal **out, const char *path,
                    enum ld_fsync_mode mode);

/* Sync what is unsynced, close and free. NULL is a no-op. */
void ld_journal_close(struct ld_journal *j);

/* Append an add record; *ID gets its id. The record is written to the
 * file (not yet synced). Returns LD_ERR when the write failed; the file is
 * then cut back so that no partial record is left behind. */
int ld_journal_add(struct ld_journal *j, int64_t due_ms, const char *key,
                   size_t key_len, uint64_t *id);

/* Append an add record due DELAY_MS after the delete of the add AFTER_ID
 * has been carried out (see the file layout above). */
int ld_journal_add_after(struct ld_journal *j, uint64_t after_id,
                         int64_t delay_ms, const char *key, size_t key_len,
                         uint64_t *id);

/* The same two with FLAGS (LD_JOURNAL_F_*) kept beside the add. */
int ld_journal_add_flags(struct ld_journal *j, int64_t due_ms, unsigned flags,
                         const char *key, size_t key_len, uint64_t *id);
int ld_journal_add_after_flags(struct ld_journal *j, uint64_t after_id,
                               int64_t delay_ms, unsigned flags,
                               const char *key, size_t key_len, uint64_t *id);

/* Append a done record for a live add. Unknown ids are ignored. */
int ld_journal_done(struct ld_journal *j, uint64_t id);

/* Visit every live add in id order (the order they were promised). The
 * callback must not modify the journal. */
typedef void ld_journal_each_fn(const struct ld_journal_entry *e, void *arg);
void ld_journal_each(const struct ld_journal *j, ld_journal_each_fn *fn,
                     void *arg);

/* fdatasync when anything was appended since the last sync; a no-op
 * otherwise. Under fsync "always" the caller runs it before it answers
 * (one sync for every add of a loop iteration); under "everysec" a
 * once-a-second timer runs it, which is the whole of that mode.
 *
 * After a failed fdatasync the state of the file's pages is unknown (the
 * kernel may have dropped the dirty pages and cleared the error, so a
 * later fdatasync can succeed without the lost records ever reaching the
 * disk). The journal is then "failed": every later sync rewrites the
 * whole journal from memory to a new file (as compaction does) and
 * succeeds only when that rewrite is durable; until then every sync
 * returns LD_ERR, so nothing is acknowledged on the old file's word. */
int ld_journal_sync(struct ld_journal *j);

/* The same sync in two halves, so that the fdatasync can run on another
 * thread (ld_fsync): _begin returns 0 when nothing needed syncing (or the
 * failed journal was rewritten: done, LD_OK), -1 when that failed, and 1
 * with *FD to be synced; then, in the loop again, _end with the sync's
 * result and errno returns LD_OK or LD_ERR (the journal is then failed,
 * as above). Appends in between belong to the next sync; compaction
 * waits until _end. */
int ld_journal_sync_begin(struct ld_journal *j, int *fd);
int ld_journal_sync_end(struct ld_journal *j, int rc, int err);

/* True while the journal is failed (see ld_journal_sync). */
bool ld_journal_failed(const struct ld_journal *j);

/* The calls that make data durable, replaceable by unit tests to inject
 * failures (fsync is used for directories and the compacted file). */
extern int (*ld_journal_fdatasync_fn)(int fd);
extern int (*ld_journal_fsync_fn)(int fd);

/* True when most of the file is dead records and rewriting it pays. */
bool ld_journal_should_compact(const struct ld_journal *j);

/* Rewrite the file with only the live adds: write a temporary file, sync
 * it, rename it over the journal and sync the directory, so that a crash
 * at any point leaves either the old or the new file whole. When the
 * directory sync fails, the rename's durability is unknown: the old file
 * is put back under the journal's name (it was kept under a second name
 * meanwhile) and the compaction fails, the journal going on with the old
 * file. */
int ld_journal_compact(struct ld_journal *j);

/* Compaction starts once the dead records take at least this many bytes
 * (default 1 MiB) and three quarters of the file. For tests. */
void ld_journal_set_compact_min_bytes(struct ld_journal *j, uint64_t bytes);

enum ld_fsync_mode ld_journal_mode(const struct ld_journal *j);
uint64_t ld_journal_bytes(const struct ld_journal *j);
size_t ld_journal_live(const struct ld_journal *j);
bool ld_journal_dirty(const struct ld_journal *j);
/* Number of fdatasync calls made so far (for tests of the fsync modes). */
uint64_t ld_journal_syncs(const struct ld_journal *j);
/* Bytes cut off a torn tail when the journal was opened. */
uint64_t ld_journal_dropped_bytes(const struct ld_journal *j);

/* CRC-32 (IEEE 802.3, as zlib), exposed for tests and tools. */
uint32_t ld_crc32(const void *data, size_t len);

#endif
