#ifndef LD_CLUSTER_SLOT_H
#define LD_CLUSTER_SLOT_H

#include "ld_common.h"

/* Redis Cluster's hash slot of a key: CRC16 (XMODEM) of the key, or of
 * its hash tag (what lies between the first '{' and the first '}' after
 * it, when that is not empty), modulo 16384. */
#define LD_CLUSTER_SLOTS 16384

unsigned ld_cluster_slot(const char *key, size_t len);
uint16_t ld_crc16(const char *buf, size_t len);

#endif
