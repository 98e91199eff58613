/*
 * counts.h - what collectives moved, by kind: calls, the bytes of each
 * call's full buffer (payload), and the bytes each rank sends on a ring
 * (wire). The sharding engine counts its all-gathers and reduce-scatters
 * here, the tensor-parallel operators theirs, a model its own exchanges;
 * the trainer adds them up for the run's summary.
 */
#ifndef FSDP_COMM_COUNTS_H
#define FSDP_COMM_COUNTS_H

#include <stdint.h>

#include "comm/flight.h" /* enum fsdp_coll_op: the kinds */

struct fsdp_comm_counts {
    uint64_t calls[FSDP_COLL_OP_COUNT];
    double payload[FSDP_COLL_OP_COUNT]; /* bytes of the full buffer of each call */
    double wire[FSDP_COLL_OP_COUNT];    /* bytes each rank sends, ring volumes */
};

/* Counts one collective of kind k over `size` ranks whose full buffer is
 * `bytes` (an all-reduce sends 2 (p - 1) / p of it on a ring, the others
 * (p - 1) / p). */
void fsdp_comm_count(struct fsdp_comm_counts *c, enum fsdp_coll_op k, int size, double bytes);
/* a += b */
void fsdp_comm_counts_add(struct fsdp_comm_counts *a, const struct fsdp_comm_counts *b);

#endif
