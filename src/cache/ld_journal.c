/*
 * The invalidation journal (format and guarantees in ld_journal.h).
 *
 * Writes go straight to the file with pwrite, never through a user-space
 * buffer: a record that write() accepted is in the page cache and survives
 * the death of the process (SIGKILL included); only a machine crash needs
 * the fdatasync, and that is what the fsync mode decides on.
 *
 * The live adds are also kept in memory, keyed by id, so that compaction
 * and the stats never have to read the file back.
 *
 * It owns the file and its format; it must not know Redis or the cache's
 * structs (a record is an id, a due time, flags and a key).
 */
#include "ld_journal.h"

#include "ld_assert.h"
#include "ld_dict.h"
#include "ld_log.h"
#include "ld_mem.h"
#include "ld_util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define COMPACT_MIN_BYTES_DEFAULT (1u << 20)
/* Ids count up from 1 and stay far below this; a record above it is
 * damage, and the bound keeps next_id from ever wrapping to live ids. */
#define MAX_ID ((uint64_t)INT64_MAX)

int (*ld_journal_fdatasync_fn)(int fd) = fdatasync;
int (*ld_journal_fsync_fn)(int fd) = fsync;

struct jrec {
    uint64_t id;
    int64_t due_ms; /* the delay for an add after another */
    uint64_t after; /* 0, or the add this one waits for */
    unsigned flags; /* LD_JOURNAL_F_* */
    size_t key_len;
    char key[];
};

struct ld_journal {
    int fd;
    char *path;
    enum ld_fsync_mode mode;
    uint64_t size;        /* bytes in the file, all of them good */
    uint64_t live_bytes;  /* bytes of the live add records */
    struct ld_dict *live; /* id (8 bytes, host order) -> struct jrec */
    uint64_t next_id;
    bool dirty;   /* appended since the last sync */
    bool failed;  /* an fdatasync failed: rewrite before trust */
    bool syncing; /* between ld_journal_sync_begin and _end */
    uint64_t syncs;
    uint64_t dropped_bytes;
    uint64_t compact_min_bytes;
};

/* ---- CRC-32 ---------------------------------------------------------- */

static struct {
    uint32_t crc_table[256];
    bool crc_ready;
} journal_mod;

static void
crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
        }
        journal_mod.crc_table[i] = c;
    }
    journal_mod.crc_ready = true;
}

uint32_t
ld_crc32(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;

    if (!journal_mod.crc_ready) {
        crc_init();
    }
    for (size_t i = 0; i < len; i++) {
        c = journal_mod.crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    }
    return c ^ 0xffffffffu;
}

/* ---- encoding -------------------------------------------------------- */

static void
put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static void
put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint32_t
get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static uint64_t
get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Encode one record into BUF (rec_bytes of it); returns its length.
 * AFTER is written only for LD_JOURNAL_ADD_AFTER. */
static size_t
encode(unsigned char *buf, enum ld_journal_type type, unsigned flags,
       uint64_t id, int64_t due_ms, uint64_t after, const char *key,
       size_t key_len)
{
    unsigned char *body = buf + LD_JOURNAL_RECORD_OVERHEAD;
    size_t head = LD_JOURNAL_BODY_MIN;

    body[0] = (unsigned char)((unsigned)type | flags);
    put_u64(body + 1, id);
    put_u64(body + 9, (uint64_t)due_ms);
    if (type == LD_JOURNAL_ADD_AFTER) {
        put_u64(body + head, after);
        head += LD_JOURNAL_AFTER_BYTES;
    }
    size_t body_len = head + key_len;
    if (key_len > 0) {
        memcpy(body + head, key, key_len);
    }
    put_u32(buf, (uint32_t)body_len);
    put_u32(buf + 4, ld_crc32(body, body_len));
    return LD_JOURNAL_RECORD_OVERHEAD + body_len;
}

/* ---- file helpers ---------------------------------------------------- */

static int
write_all_at(int fd, const unsigned char *p, size_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return LD_ERR;
        }
        if (n == 0) {
            errno = EIO;
            return LD_ERR;
        }
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return LD_OK;
}

/* Make a rename or a new file in PATH's directory durable. */
static int
sync_parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;

    if (slash == NULL) {
        dir = ld_xstrdup(".");
    } else if (slash == path) {
        dir = ld_xstrdup("/");
    } else {
        dir = ld_xstrndup(path, (size_t)(slash - path));
    }
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    if (fd < 0) {
        return LD_ERR;
    }
    int rc = ld_journal_fsync_fn(fd) == 0 ? LD_OK : LD_ERR;
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

static int
read_file(int fd, unsigned char **out, size_t *len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        return LD_ERR;
    }
    size_t size = (size_t)st.st_size;
    unsigned char *buf = malloc(size > 0 ? size : 1);
    if (buf == NULL) {
        return LD_ERR;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t n = pread(fd, buf + got, size - got, (off_t)got);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break; /* shrank under us: parse what we have */
        }
        got += (size_t)n;
    }
    *out = buf;
    *len = got;
    return LD_OK;
}

/* ---- live set -------------------------------------------------------- */

static size_t
rec_bytes(size_t key_len, bool after)
{
    return LD_JOURNAL_RECORD_OVERHEAD + LD_JOURNAL_BODY_MIN +
           (after ? LD_JOURNAL_AFTER_BYTES : 0) + key_len;
}

static void
live_add(struct ld_journal *j, uint64_t id, int64_t due_ms, uint64_t after,
         unsigned flags, const char *key, size_t key_len)
{
    /* An id is promised once: a second add would hide the first. */
    LD_ASSERTF(ld_dict_get(j->live, &id, sizeof(id)) == NULL,
               "journal id %llu is live already", (unsigned long long)id);
    struct jrec *r = ld_xmalloc(sizeof(*r) + key_len);
    r->id = id;
    r->due_ms = due_ms;
    r->after = after;
    r->flags = flags;
    r->key_len = key_len;
    memcpy(r->key, key, key_len);
    ld_dict_set(j->live, &r->id, sizeof(r->id), r);
    j->live_bytes += rec_bytes(key_len, after != 0);
}

static bool
live_del(struct ld_journal *j, uint64_t id)
{
    struct jrec *r = ld_dict_del(j->live, &id, sizeof(id));
    if (r == NULL) {
        return false;
    }
    j->live_bytes -= rec_bytes(r->key_len, r->after != 0);
    free(r);
    return true;
}

/* ---- replay ---------------------------------------------------------- */

/* The body of the record at BUF+OFF, whole and with a good CRC, in
 * *BODY and *BODY_LEN; else why not. */
static const char *
record_body(const unsigned char *buf, size_t len, size_t off,
            const unsigned char **body, uint32_t *body_len)
{
    if (len - off < LD_JOURNAL_RECORD_OVERHEAD) {
        return "short header";
    }
    *body_len = get_u32(buf + off);
    uint32_t crc = get_u32(buf + off + 4);
    if (*body_len < LD_JOURNAL_BODY_MIN ||
        *body_len > LD_JOURNAL_BODY_MIN + LD_JOURNAL_AFTER_BYTES +
                        LD_JOURNAL_MAX_KEY) {
        return "bad length";
    }
    if (len - off - LD_JOURNAL_RECORD_OVERHEAD < *body_len) {
        return "short record";
    }
    *body = buf + off + LD_JOURNAL_RECORD_OVERHEAD;
    if (ld_crc32(*body, *body_len) != crc) {
        return "bad crc";
    }
    return NULL;
}

/* An add record (TYPE, of record ID) into the live set; else why not. */
static const char *
replay_add(struct ld_journal *j, const unsigned char *body, uint32_t body_len,
           unsigned type, uint64_t id)
{
    int64_t due = (int64_t)get_u64(body + 9);
    unsigned flags = body[0] & LD_JOURNAL_FLAGS;
    size_t key_len = body_len - LD_JOURNAL_BODY_MIN;
    size_t head = LD_JOURNAL_BODY_MIN;
    uint64_t after = 0;
    if (type == LD_JOURNAL_ADD_AFTER) {
        if (key_len <= LD_JOURNAL_AFTER_BYTES) {
            return "bad add record";
        }
        after = get_u64(body + head);
        head += LD_JOURNAL_AFTER_BYTES;
        key_len -= LD_JOURNAL_AFTER_BYTES;
    }
    if (key_len == 0 || key_len > LD_JOURNAL_MAX_KEY ||
        (type == LD_JOURNAL_ADD_AFTER && (after == 0 || after >= id)) ||
        ld_dict_get(j->live, &id, sizeof(id)) != NULL) {
        return "bad add record";
    }
    live_add(j, id, due, after, flags, (const char *)body + head, key_len);
    return NULL;
}

/* Parse records from BUF+OFF; returns the offset just past the last good
 * record, and the reason parsing stopped early in *WHY (NULL at a clean
 * end). */
static size_t
replay(struct ld_journal *j, const unsigned char *buf, size_t len, size_t off,
       const char **why)
{
    *why = NULL;
    while (off < len) {
        const unsigned char *body;
        uint32_t body_len;
        *why = record_body(buf, len, off, &body, &body_len);
        if (*why != NULL) {
            break;
        }
        uint64_t id = get_u64(body + 1);
        if (id > MAX_ID) {
            *why = "bad record id";
            break;
        }
        unsigned type = body[0] & ~LD_JOURNAL_FLAGS;
        if (type == LD_JOURNAL_ADD || type == LD_JOURNAL_ADD_AFTER) {
            *why = replay_add(j, body, body_len, type, id);
            if (*why != NULL) {
                break;
            }
        } else if (body[0] == LD_JOURNAL_DONE) {
            /* A done for an id we do not know retires nothing; it can
             * only come from a damaged file, and is harmless. */
            live_del(j, id);
        } else {
            *why = "bad record type";
            break;
        }
        if (id >= j->next_id) {
            j->next_id = id + 1;
        }
        off += LD_JOURNAL_RECORD_OVERHEAD + body_len;
    }
    return off;
}

static int
write_header(struct ld_journal *j)
{
    if (ftruncate(j->fd, 0) != 0 ||
        write_all_at(j->fd, (const unsigned char *)LD_JOURNAL_MAGIC,
                     LD_JOURNAL_HEADER_BYTES, 0) != LD_OK ||
        ld_journal_fdatasync_fn(j->fd) != 0) {
        return LD_ERR;
    }
    j->syncs++;
    j->size = LD_JOURNAL_HEADER_BYTES;
    /* The file itself may be new: make its directory entry durable. */
    return sync_parent_dir(j->path);
}

/* The records from GOOD on (BYTES of them) are torn or damaged: cut
 * them off, durably, so that appends follow the last good record. */
static int
drop_tail(struct ld_journal *j, size_t good, size_t bytes, const char *why)
{
    j->dropped_bytes = bytes;
    log_warn("journal tail dropped path=%s offset=%zu bytes=%zu "
             "reason=\"%s\"",
             j->path, good, bytes, why != NULL ? why : "unknown");
    if (ftruncate(j->fd, (off_t)good) != 0 ||
        ld_journal_fdatasync_fn(j->fd) != 0) {
        log_error("journal truncate failed path=%s error=\"%s\"", j->path,
                  strerror(errno));
        return LD_ERR;
    }
    j->syncs++;
    return LD_OK;
}

static int
load(struct ld_journal *j)
{
    unsigned char *buf = NULL;
    size_t len = 0;

    if (read_file(j->fd, &buf, &len) != LD_OK) {
        log_error("journal read failed path=%s error=\"%s\"", j->path,
                  strerror(errno));
        return LD_ERR;
    }
    /* Empty, or the header of a new file was torn: start afresh.
     * Anything else this short is not ours to overwrite. */
    size_t magic = len < LD_JOURNAL_HEADER_BYTES ? len
                                                 : LD_JOURNAL_HEADER_BYTES;
    if (memcmp(buf, LD_JOURNAL_MAGIC, magic) != 0) {
        free(buf);
        log_error("journal is not a leased journal path=%s", j->path);
        errno = EINVAL;
        return LD_ERR;
    }
    if (len < LD_JOURNAL_HEADER_BYTES) {
        free(buf);
        if (write_header(j) != LD_OK) {
            log_error("journal create failed path=%s error=\"%s\"", j->path,
                      strerror(errno));
            return LD_ERR;
        }
        return LD_OK;
    }
    const char *why = NULL;
    size_t good = replay(j, buf, len, LD_JOURNAL_HEADER_BYTES, &why);
    free(buf);
    j->size = good;
    return good < len ? drop_tail(j, good, len - good, why) : LD_OK;
}

/* PATH followed by SUFFIX (".tmp", ".old"; four bytes). */
static char *
suffixed_path(const char *path, const char *suffix)
{
    size_t n = strlen(path);
    char *p = ld_xmalloc(n + 5);
    memcpy(p, path, n);
    memcpy(p + n, suffix, 5);
    return p;
}

static char *
tmp_path(const char *path)
{
    return suffixed_path(path, ".tmp");
}

/* Create the missing directories above PATH, each made durable in its
 * own parent: a journal whose directory entry (or whose directory's)
 * vanishes in a crash is as lost as one never written. */
static int
mkdir_parents_durable(const char *path)
{
    char *dir = ld_xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash == NULL || slash == dir) {
        free(dir);
        return LD_OK;
    }
    *slash = '\0';
    /* Walk down from the top, so that each parent exists first. */
    for (char *p = dir + 1;; p++) {
        bool end = *p == '\0';
        if (*p != '/' && !end) {
            continue;
        }
        *p = '\0';
        if (mkdir(dir, 0700) == 0) {
            /* DIR is new: its entry lives in its parent, which DIR's
             * own path names once the last component is cut. */
            if (sync_parent_dir(dir) != LD_OK) {
                int saved = errno;
                free(dir);
                errno = saved;
                return LD_ERR;
            }
        } else if (errno != EEXIST) {
            int saved = errno;
            free(dir);
            errno = saved;
            return LD_ERR;
        }
        if (end) {
            break;
        }
        *p = '/';
    }
    free(dir);
    return LD_OK;
}

int
ld_journal_open(struct ld_journal **out, const char *path,
                enum ld_fsync_mode mode)
{
    struct ld_journal *j = ld_xcalloc(1, sizeof(*j));
    j->fd = -1;
    j->mode = mode;
    j->next_id = 1;
    j->compact_min_bytes = COMPACT_MIN_BYTES_DEFAULT;
    j->path = ld_xstrdup(path);
    j->live = ld_dict_new();
    if (mkdir_parents_durable(path) != LD_OK) {
        log_error("journal directory failed path=%s error=\"%s\"", path,
                  strerror(errno));
        goto fail;
    }
    j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (j->fd < 0) {
        log_error("journal open failed path=%s error=\"%s\"", path,
                  strerror(errno));
        goto fail;
    }
    if (flock(j->fd, LOCK_EX | LOCK_NB) != 0) {
        log_error("journal is locked by another process path=%s", path);
        goto fail;
    }
    /* A compaction that died before its rename leaves this behind; the
     * journal itself is still whole. */
    char *tmp = tmp_path(path);
    unlink(tmp);
    free(tmp);
    /* The second name the old file keeps while a compaction's rename is
     * made durable; whichever file the journal's name points at is
     * whole, and this one is not needed. */
    char *old = suffixed_path(path, ".old");
    unlink(old);
    free(old);
    if (load(j) != LD_OK) {
        goto fail;
    }
    *out = j;
    return LD_OK;

fail:;
    int saved = errno;
    ld_journal_close(j);
    errno = saved;
    return LD_ERR;
}

static void
free_live(struct ld_journal *j)
{
    struct ld_dict_iter it;
    void *v;

    ld_dict_iter_init(&it, j->live);
    while (ld_dict_iter_next(&it, NULL, NULL, &v)) {
        free(v);
    }
    ld_dict_free(j->live);
    j->live = NULL;
}

void
ld_journal_close(struct ld_journal *j)
{
    if (j == NULL) {
        return;
    }
    if (j->fd >= 0) {
        ld_journal_sync(j);
        close(j->fd);
    }
    if (j->live != NULL) {
        free_live(j);
    }
    free(j->path);
    free(j);
}

static int
append(struct ld_journal *j, enum ld_journal_type type, unsigned flags,
       uint64_t id, int64_t due_ms, uint64_t after, const char *key,
       size_t key_len)
{
    unsigned char stack[256];
    size_t need = rec_bytes(key_len, type == LD_JOURNAL_ADD_AFTER);
    unsigned char *buf = need <= sizeof(stack) ? stack : malloc(need);

    if (buf == NULL) {
        return LD_ERR;
    }
    size_t n = encode(buf, type, flags, id, due_ms, after, key, key_len);
    int rc = write_all_at(j->fd, buf, n, j->size);
    int saved = errno;
    if (buf != stack) {
        free(buf);
    }
    if (rc != LD_OK) {
        /* Leave no partial record: the next append would land behind it
         * and replay would stop at the torn one, losing both. */
        if (ftruncate(j->fd, (off_t)j->size) != 0) {
            log_error("journal truncate after failed write failed path=%s "
                      "error=\"%s\"",
                      j->path, strerror(errno));
        }
        log_error("journal write failed path=%s error=\"%s\"", j->path,
                  strerror(saved));
        errno = saved;
        return LD_ERR;
    }
    j->size += n;
    j->dirty = true;
    return LD_OK;
}

int
ld_journal_add(struct ld_journal *j, int64_t due_ms, const char *key,
               size_t key_len, uint64_t *id)
{
    return ld_journal_add_flags(j, due_ms, 0, key, key_len, id);
}

int
ld_journal_add_flags(struct ld_journal *j, int64_t due_ms, unsigned flags,
                     const char *key, size_t key_len, uint64_t *id)
{
    flags &= LD_JOURNAL_FLAGS;
    if (key_len == 0 || key_len > LD_JOURNAL_MAX_KEY) {
        errno = EINVAL;
        return LD_ERR;
    }
    uint64_t nid = j->next_id;
    if (nid > MAX_ID) {
        errno = EOVERFLOW;
        return LD_ERR;
    }
    if (append(j, LD_JOURNAL_ADD, flags, nid, due_ms, 0, key, key_len) !=
        LD_OK) {
        return LD_ERR;
    }
    live_add(j, nid, due_ms, 0, flags, key, key_len);
    j->next_id++;
    *id = nid;
    return LD_OK;
}

int
ld_journal_add_after(struct ld_journal *j, uint64_t after_id, int64_t delay_ms,
                     const char *key, size_t key_len, uint64_t *id)
{
    return ld_journal_add_after_flags(j, after_id, delay_ms, 0, key, key_len,
                                      id);
}

int
ld_journal_add_after_flags(struct ld_journal *j, uint64_t after_id,
                           int64_t delay_ms, unsigned flags, const char *key,
                           size_t key_len, uint64_t *id)
{
    flags &= LD_JOURNAL_FLAGS;
    if (key_len == 0 || key_len > LD_JOURNAL_MAX_KEY || after_id == 0 ||
        after_id >= j->next_id) {
        errno = EINVAL;
        return LD_ERR;
    }
    uint64_t nid = j->next_id;
    if (append(j, LD_JOURNAL_ADD_AFTER, flags, nid, delay_ms, after_id, key,
               key_len) != LD_OK) {
        return LD_ERR;
    }
    live_add(j, nid, delay_ms, after_id, flags, key, key_len);
    j->next_id++;
    *id = nid;
    return LD_OK;
}

int
ld_journal_done(struct ld_journal *j, uint64_t id)
{
    if (ld_dict_get(j->live, &id, sizeof(id)) == NULL) {
        return LD_OK;
    }
    if (append(j, LD_JOURNAL_DONE, 0, id, 0, 0, NULL, 0) != LD_OK) {
        /* The delete happened; without its done record a restart merely
         * repeats it, which is harmless. Forget it in memory anyway. */
        live_del(j, id);
        return LD_ERR;
    }
    live_del(j, id);
    return LD_OK;
}

static int
cmp_rec(const void *a, const void *b)
{
    const struct jrec *ra = *(const struct jrec *const *)a;
    const struct jrec *rb = *(const struct jrec *const *)b;
    return ra->id < rb->id ? -1 : ra->id > rb->id;
}

/* The live adds sorted by id; caller frees the array (not the records). */
static struct jrec **
sorted_live(const struct ld_journal *j, size_t *n)
{
    size_t count = ld_dict_size(j->live);
    struct jrec **v = malloc(sizeof(*v) * (count > 0 ? count : 1));
    struct ld_dict_iter it;
    void *val;
    size_t i = 0;

    if (v == NULL) {
        return NULL;
    }
    ld_dict_iter_init(&it, j->live);
    while (ld_dict_iter_next(&it, NULL, NULL, &val) && i < count) {
        v[i++] = val;
    }
    qsort(v, i, sizeof(*v), cmp_rec);
    *n = i;
    return v;
}

void
ld_journal_each(const struct ld_journal *j, ld_journal_each_fn *fn, void *arg)
{
    size_t n = 0;
    struct jrec **v = sorted_live(j, &n);

    if (v == NULL) {
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct ld_journal_entry e = {v[i]->id,    v[i]->due_ms, v[i]->after,
                                     v[i]->flags, v[i]->key,    v[i]->key_len};
        fn(&e, arg);
    }
    free(v);
}

static int
sync_failed(struct ld_journal *j, int err)
{
    log_error("journal fsync failed, the journal is rewritten before "
              "anything is acknowledged again path=%s error=\"%s\"",
              j->path, strerror(err));
    j->failed = true;
    return LD_ERR;
}

int
ld_journal_sync_begin(struct ld_journal *j, int *fd)
{
    LD_ASSERT(!j->syncing);
    if (j->failed || !j->dirty) {
        return ld_journal_sync(j) == LD_OK ? 0 : -1;
    }
    /* What is appended from here on is the next sync's. */
    j->dirty = false;
    j->syncing = true;
    *fd = j->fd;
    return 1;
}

int
ld_journal_sync_end(struct ld_journal *j, int rc, int err)
{
    LD_ASSERT(j->syncing);
    j->syncing = false;
    if (rc != 0) {
        j->dirty = true;
        return sync_failed(j, err);
    }
    j->syncs++;
    return LD_OK;
}

int
ld_journal_sync(struct ld_journal *j)
{
    if (j->failed) {
        /* Only a whole new file, written from memory, is known to hold
         * what was promised. */
        if (ld_journal_compact(j) != LD_OK) {
            return LD_ERR;
        }
        log_warn("journal rewritten after a failed sync path=%s", j->path);
        return LD_OK;
    }
    if (!j->dirty) {
        return LD_OK;
    }
    if (ld_journal_fdatasync_fn(j->fd) != 0) {
        return sync_failed(j, errno);
    }
    j->syncs++;
    j->dirty = false;
    return LD_OK;
}

bool
ld_journal_failed(const struct ld_journal *j)
{
    return j->failed;
}

bool
ld_journal_should_compact(const struct ld_journal *j)
{
    if (j->syncing) {
        return false; /* the worker still has the file's descriptor */
    }
    uint64_t records = j->size - LD_JOURNAL_HEADER_BYTES;
    uint64_t dead = records - j->live_bytes;
    return dead >= j->compact_min_bytes && dead * 4 >= records * 3;
}

void
ld_journal_set_compact_min_bytes(struct ld_journal *j, uint64_t bytes)
{
    j->compact_min_bytes = bytes;
}

static size_t
longest_key(struct jrec *const *v, size_t n)
{
    size_t max_key = 0;
    for (size_t i = 0; i < n; i++) {
        if (v[i]->key_len > max_key) {
            max_key = v[i]->key_len;
        }
    }
    return max_key;
}

/* The N records V after the header of FD, encoded in BUF (room for the
 * longest); *SIZE grows by what was written. */
static int
write_records(int fd, struct jrec *const *v, size_t n, unsigned char *buf,
              uint64_t *size)
{
    for (size_t i = 0; i < n; i++) {
        size_t len = encode(buf,
                            v[i]->after != 0 ? LD_JOURNAL_ADD_AFTER
                                             : LD_JOURNAL_ADD,
                            v[i]->flags, v[i]->id, v[i]->due_ms, v[i]->after,
                            v[i]->key, v[i]->key_len);
        if (write_all_at(fd, buf, len, *size) != LD_OK) {
            return LD_ERR;
        }
        *size += len;
    }
    return LD_OK;
}

/* The live records, by id, into a new file at TMP that is whole on disk
 * and locked: its descriptor, with its length in SIZE and the number of
 * records in N; or -1 with errno set, and no file left at TMP. */
static int
compact_write(struct ld_journal *j, const char *tmp, uint64_t *size, size_t *n)
{
    unsigned char *buf = NULL;
    int fd = -1;
    int rc = LD_ERR;

    *size = LD_JOURNAL_HEADER_BYTES;
    struct jrec **v = sorted_live(j, n);
    if (v == NULL) {
        goto done;
    }
    buf = malloc(rec_bytes(longest_key(v, *n), true));
    if (buf == NULL) {
        goto done;
    }
    fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        goto done;
    }
    if (write_all_at(fd, (const unsigned char *)LD_JOURNAL_MAGIC,
                     LD_JOURNAL_HEADER_BYTES, 0) != LD_OK) {
        goto done;
    }
    if (write_records(fd, v, *n, buf, size) != LD_OK) {
        goto done;
    }
    /* The new file must be whole on disk before its name replaces the
     * old one, or a crash could leave a name pointing at nothing. */
    if (ld_journal_fsync_fn(fd) != 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) {
        goto done;
    }
    j->syncs++;
    rc = LD_OK;

done:;
    int saved = errno;
    free(v);
    free(buf);
    if (rc != LD_OK && fd >= 0) {
        close(fd);
        unlink(tmp);
        fd = -1;
    }
    errno = saved;
    return fd;
}

/* The file at TMP takes the journal's name; the old file keeps a second
 * name, OLD, until the rename is durable, so that it can be put back if
 * that cannot be made sure. */
static int
compact_rename(const struct ld_journal *j, const char *tmp, const char *old)
{
    unlink(old);
    if (link(j->path, old) != 0) {
        return LD_ERR;
    }
    if (rename(tmp, j->path) != 0) {
        int saved = errno;
        unlink(old);
        errno = saved;
        return LD_ERR;
    }
    return LD_OK;
}

/* From now on the journal appends to FD, SIZE bytes long. */
static void
compact_adopt(struct ld_journal *j, int fd, uint64_t size, bool failed)
{
    close(j->fd);
    j->fd = fd;
    j->size = size;
    j->dirty = false;
    j->failed = failed;
}

/* The directory could not be synced after the rename: nobody knows which
 * name a crash would leave. Go on with the old file, under its name
 * again; or, when it cannot be put back, with the new one (which is
 * whole: appending to the old one would write where no restart looks),
 * trusting nothing until a later rewrite is durable. Keeps errno. */
static void
compact_undo(struct ld_journal *j, int fd, uint64_t size, const char *old)
{
    int saved = errno;
    if (rename(old, j->path) == 0) {
        sync_parent_dir(j->path);
        close(fd);
        log_error("journal compaction failed, directory sync: the old "
                  "file stays path=%s error=\"%s\"",
                  j->path, strerror(saved));
    } else {
        log_error("journal directory sync failed and the old file cannot "
                  "be put back path=%s error=\"%s\"",
                  j->path, strerror(saved));
        unlink(old);
        compact_adopt(j, fd, size, true);
    }
    errno = saved;
}

int
ld_journal_compact(struct ld_journal *j)
{
    if (j->syncing) {
        return LD_ERR;
    }
    char *tmp = tmp_path(j->path);
    char *old = suffixed_path(j->path, ".old");
    uint64_t before = j->size;
    uint64_t size;
    size_t n = 0;
    int rc = LD_ERR;

    int fd = compact_write(j, tmp, &size, &n);
    if (fd >= 0 && compact_rename(j, tmp, old) != LD_OK) {
        int saved = errno;
        close(fd);
        unlink(tmp);
        errno = saved;
        fd = -1;
    }
    if (fd < 0) {
        log_error("journal compaction failed path=%s error=\"%s\"", j->path,
                  strerror(errno));
        goto done;
    }
    if (sync_parent_dir(j->path) != LD_OK) {
        compact_undo(j, fd, size, old);
        goto done;
    }
    unlink(old);
    compact_adopt(j, fd, size, false);
    log_info("journal compacted path=%s bytes_before=%llu bytes_after=%llu "
             "live=%zu",
             j->path, (unsigned long long)before, (unsigned long long)size, n);
    rc = LD_OK;

done:;
    int saved = errno;
    free(tmp);
    free(old);
    errno = saved;
    return rc;
}

enum ld_fsync_mode
ld_journal_mode(const struct ld_journal *j)
{
    return j->mode;
}

uint64_t
ld_journal_bytes(const struct ld_journal *j)
{
    return j->size;
}

size_t
ld_journal_live(const struct ld_journal *j)
{
    return ld_dict_size(j->live);
}

bool
ld_journal_dirty(const struct ld_journal *j)
{
    return j->dirty;
}

uint64_t
ld_journal_syncs(const struct ld_journal *j)
{
    return j->syncs;
}

uint64_t
ld_journal_dropped_bytes(const struct ld_journal *j)
{
    return j->dropped_bytes;
}
