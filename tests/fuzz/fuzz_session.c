/*
 * Fuzz target: a whole client session fed arbitrary bytes. A real session
 * sits on one end of a socketpair, as the listener would make it, with
 * the daemon's modules initialised as at start-up but Redis never
 * connected (every op that needs it answers redis_unavailable), so
 * framing, request parsing, dispatch and every op's argument checks run
 * exactly as in the daemon.
 *
 * Input layout: the first byte chooses how the rest is cut into writes
 * (0: one write; N: pieces of 1..N bytes from a small generator seeded by
 * N), because framing bugs hide at read boundaries.
 */
#include "feed.h"
#include "ld_cache.h"
#include "ld_conf.h"
#include "ld_ctx.h"
#include "ld_dispatch.h"
#include "ld_lock.h"
#include "ld_log.h"
#include "ld_pubsub.h"
#include "ld_redis.h"
#include "ld_server.h"
#include "ld_session.h"
#include "ld_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <event2/event.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Loop turns allowed per input once the client is done: enough for every
 * queued answer and the close, few enough that a stuck session shows up
 * as a slow input rather than a hang. */
#define SETTLE_TURNS 10000

static struct ld_config cfg;
static struct ld_ctx ctx; /* what the modules get at init */
static char tmpdir[64];
static char journal_path[128];

static void
cleanup_files(void)
{
    /* The journal's directory is ours alone; the daemon may have left a
     * compaction temporary next to the journal. */
    char tmp[160];
    snprintf(tmp, sizeof(tmp), "%s.tmp", journal_path);
    unlink(tmp);
    unlink(journal_path);
    rmdir(tmpdir);
}

static void
setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    ld_conf_defaults(&cfg);
    /* No listener, no metrics endpoint: the session is made by hand. */
    free(cfg.listen.unix_path);
    cfg.listen.unix_path = strdup("");
    free(cfg.listen.tcp);
    cfg.listen.tcp = strdup("");
    free(cfg.metrics.listen);
    cfg.metrics.listen = strdup("");
    /* The journal must be private to this process; a tmpfs and
     * "everysec" keep its syncs out of the cost of an input. */
    snprintf(tmpdir, sizeof(tmpdir), "%s/ld-fuzz-session.XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (mkdtemp(tmpdir) == NULL) {
        perror("mkdtemp");
        abort();
    }
    snprintf(journal_path, sizeof(journal_path), "%s/journal", tmpdir);
    free(cfg.journal.path);
    cfg.journal.path = strdup(journal_path);
    cfg.journal.fsync = LD_FSYNC_EVERYSEC;
    atexit(cleanup_files);

    /* Malformed input is expected and its log lines are noise; a level
     * above every level silences them (ld_log_set_level keeps errors). */
    ld_log_level = LD_LOG_ERROR + 1;
    ctx.cfg = &cfg;
    ctx.instance = "fuzzfuzzfuzzfuzz";
    ctx.base = event_base_new();
    if (ctx.base == NULL) {
        abort();
    }
    ld_stats_init(&ctx);
    if (ld_server_wire(&ctx) != LD_OK) {
        abort();
    }
}

/* Between inputs: with Redis down, every cache.invalidate stays queued
 * and journaled for good, so without a reset the state (and the cost of
 * an input) would grow with the run, and an input would not replay the
 * same way on its own. The lock module holds nothing once its sessions
 * are gone, because no lock is ever granted without Redis. */
static void
reset(void)
{
    ld_cache_free();
    unlink(journal_path);
    ld_stats_init(&ctx);
    if (ld_cache_init(&ctx) != LD_OK) {
        abort();
    }
}

/* Read and drop whatever the daemon wrote so far. */
static void
drain(int fd)
{
    char buf[65536];
    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0 || (n < 0 && errno == EINTR)) {
            continue;
        }
        return;
    }
}

static void
turn(int fd)
{
    event_base_loop(ctx.base, EVLOOP_NONBLOCK);
    drain(fd);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        setup();
        ready = true;
    }
    if (size == 0) {
        return 0;
    }
    unsigned piece = data[0];
    data++;
    size--;

    int client;
    if (!fuzz_session_open(&client)) {
        return 0;
    }
    fuzz_feed(client, data, size, piece, turn, SETTLE_TURNS);

    /* Half-close as a client that is done sending, then let every answer
     * and the close run. The session must go away on its own. */
    shutdown(client, SHUT_WR);
    for (unsigned i = 0; i < SETTLE_TURNS; i++) {
        if (ld_session_count() == 0 && ld_session_lingering() == 0) {
            break;
        }
        turn(client);
    }
    if (ld_session_count() != 0 || ld_session_lingering() != 0) {
        fprintf(stderr, "session did not close after its client's EOF\n");
        abort();
    }
    close(client);
    /* Here rather than before the next input, so that libFuzzer sees as
     * many frees as allocations in each input and its leak check stays
     * quiet unless something really leaked. */
    reset();
    return 0;
}
