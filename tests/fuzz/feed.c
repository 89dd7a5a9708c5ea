#include "feed.h"

#include "ld_session.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

bool
fuzz_session_open(int *client)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        abort();
    }
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    fcntl(sv[1], F_SETFL, fcntl(sv[1], F_GETFL) | O_NONBLOCK);
    if (ld_session_new(sv[0], false, "fuzz") == NULL) {
        close(sv[1]);
        return false;
    }
    *client = sv[1];
    return true;
}

static void
send_all(int fd, const uint8_t *p, size_t len, fuzz_turn_fn *turn,
         unsigned max_stalls)
{
    unsigned stalls = 0;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            stalls = 0;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
            ++stalls < max_stalls) {
            turn(fd);
            continue;
        }
        return;
    }
}

/* xorshift32: the same pieces for the same input on every run. */
static uint32_t
next_rand(uint32_t *state)
{
    uint32_t x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *state = x;
    return x;
}

void
fuzz_feed(int client, const uint8_t *data, size_t len, unsigned piece,
          fuzz_turn_fn *turn, unsigned stalls)
{
    uint32_t rng = 0x9e3779b9u ^ piece;
    while (len > 0) {
        size_t n = len;
        if (piece != 0) {
            n = 1 + next_rand(&rng) % piece;
            if (n > len) {
                n = len;
            }
        }
        send_all(client, data, n, turn, stalls);
        data += n;
        len -= n;
        turn(client);
    }
}
