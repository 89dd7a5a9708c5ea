#ifndef LD_SYSTEMD_H
#define LD_SYSTEMD_H

#include "ld_common.h"

/* The two systemd protocols, by hand; both are no-ops outside systemd. */

/* sd_notify: send STATE (e.g. "READY=1", "STOPPING=1", "STATUS=...") to
 * $NOTIFY_SOCKET as one datagram. Abstract sockets ("@...") supported. */
int ld_systemd_notify(const char *state);

/* Sockets passed by socket activation ($LISTEN_PID == getpid(),
 * $LISTEN_FDS, fds from 3). Returns how many; *FDS is malloc'd. The
 * variables are unset so children do not inherit them. */
int ld_systemd_listen_fds(int **fds);

#endif
