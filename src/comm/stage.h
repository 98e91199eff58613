/*
 * stage.h - host staging of collectives (group.h, fsdp_group_set_stager):
 * a collective on memory its group's backend cannot take (a GPU's, a
 * guarded device's) runs on host copies of its buffers, through host
 * buffers of the stager's (pinned memory on a GPU), kept per group and
 * reused.
 *
 * A collective is cut in chunks (fsdp_group_stage_chunk): the send side of
 * chunk i+1 is copied to the host on the group's copy stream while chunk
 * i's host collective runs, and each chunk's receive side goes back to the
 * device as its host collective completes, so that copies and transfers
 * overlap. With chunking off (0) the whole send side is copied when the
 * collective is issued and the whole receive side when it is waited for
 * (or tested done), on the collective's stream, as point-to-point messages
 * always are.
 *
 * This file is the group layer's own; callers use group.h.
 */
#ifndef FSDP_COMM_STAGE_H
#define FSDP_COMM_STAGE_H

#include <stddef.h>

#include "comm/flight.h"
#include "comm/group.h"

struct fsdp_staged; /* one staged collective in flight */

/* Whether a collective with attr on g runs staged. */
int fsdp_stage_needed(const struct fsdp_group *g, const struct fsdp_coll_attr *attr);

/* A collective as the group call got it, device memory. */
struct fsdp_stage_coll {
    enum fsdp_coll_op op; /* allreduce, allgather, reduce_scatter or broadcast */
    const void *send;     /* broadcast: the buffer, as recv */
    void *recv;
    size_t count; /* the group call's (per rank for allgather and reduce_scatter) */
    enum fsdp_dtype dtype;
    int redop; /* enum fsdp_redop, -1: none */
    int root;
};
/* Runs c staged on g, its copies ordered after stream's earlier work (the
 * collective's attr): *work completes when every chunk is back on the
 * device. Each chunk is a host collective of its own (fsdp_allreduce and
 * friends with host memory): the debug layer numbers, records and checks
 * every chunk, and *work is chunk 0's handle. */
int fsdp_stage_collective(struct fsdp_group *g, const struct fsdp_stage_coll *c, void *stream,
                          struct fsdp_work **work);

/* One host buffer for a whole operation (point-to-point, or a collective
 * with chunking off): host copies of send (send_bytes) and recv
 * (recv_bytes), which may overlap as an in-place collective's do (the host
 * pair overlaps the same way); send is copied now, both copies are ordered
 * on stream (the collective's). */
int fsdp_stage_begin(struct fsdp_group *g, void *stream, const void *send, size_t send_bytes,
                     void *recv, size_t recv_bytes, const void **hsend, void **hrecv,
                     struct fsdp_staged **out);
/* The host collective's issue returned rc with *work: ties st to it (or
 * drops st when the issue failed). */
int fsdp_stage_bind(struct fsdp_group *g, struct fsdp_staged *st, int rc, struct fsdp_work *work);

/* w's own operation (chunk 0) completed: the rest of it waited for, up to
 * timeout_s (deadline: the group's deadline, as group_wait takes it), and
 * its receive side back on the device; FSDP_ERR_TIMEOUT leaves it to a
 * later call. Idempotent once complete. */
int fsdp_stage_end(struct fsdp_work *w, double timeout_s, int deadline);
/* The same without blocking on the network: *done = 0 while a chunk is
 * still in flight. */
int fsdp_stage_test(struct fsdp_work *w, int *done);
/* Whether w's other chunks are complete, as fsdp_work_done says it (no
 * I/O). */
int fsdp_stage_done(struct fsdp_work *w);
/* fsdp_group_progress's share: w's other chunks moved on (tested), in
 * order, up to the first still in flight; errors are left to the wait. */
void fsdp_stage_progress(struct fsdp_work *w);
/* w is freed: its chunks' handles with it, its buffers back to the pool. */
void fsdp_stage_release(struct fsdp_work *w);
/* The group's pool freed (group destroy). */
void fsdp_stage_pool_free(struct fsdp_group *g);

#endif
