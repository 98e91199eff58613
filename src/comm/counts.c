/*
 * counts.c - collective counts by kind (counts.h).
 */
#include "config.h"
#include "comm/counts.h"

void fsdp_comm_count(struct fsdp_comm_counts *c, enum fsdp_coll_op k, int size, double bytes)
{
    /* ring volumes; a send puts its whole buffer on the wire, a receive none */
    double p = size, f = k == FSDP_COLL_ALLREDUCE ? 2.0 * (p - 1.0) / p : (p - 1.0) / p;
    f = k == FSDP_COLL_SEND ? 1.0 : k == FSDP_COLL_RECV ? 0.0 : f;
    c->calls[k]++;
    c->payload[k] += bytes;
    c->wire[k] += f * bytes;
}

void fsdp_comm_counts_add(struct fsdp_comm_counts *a, const struct fsdp_comm_counts *b)
{
    for (int k = 0; k < FSDP_COLL_OP_COUNT; k++) {
        a->calls[k] += b->calls[k];
        a->payload[k] += b->payload[k];
        a->wire[k] += b->wire[k];
    }
}
