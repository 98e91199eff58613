/*
 * group.h - process groups and the collective calls the upper layers use.
 *
 * A group is a set of world ranks served by one backend instance. The calls
 * below validate arguments (dtype, op, count, capabilities), number each
 * collective (seq) and forward to the backend; they are where the debug
 * layer (fingerprints, flight recorder, timeouts) hooks in. Everything is
 * asynchronous; the *_sync helpers issue and wait with the group deadline.
 */
#ifndef FSDP_COMM_GROUP_H
#define FSDP_COMM_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"

struct fsdp_dist;
struct fsdp_stage_pool;

/*
 * How a group moves a collective's buffers through host memory when its
 * backend cannot take the memory they are in (mpi and tcp with a GPU's or
 * a guarded device's buffers). A layer above fills it from its device
 * (compute/device.h): the comm layer never includes the device.
 */
struct fsdp_stager {
    enum fsdp_mem mem; /* the memory it stages */
    void *ctx;
    /* host memory for staging (pinned on a GPU), zeroed; NULL when out of memory */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* copies ordered on the collective's stream (its attr), complete when
     * they return */
    int (*to_host)(void *ctx, void *stream, void *dst, const void *src, size_t bytes);
    int (*to_device)(void *ctx, void *stream, void *dst, const void *src, size_t bytes);
    /* --- appended: a copy stream for chunked staging (stage.c) ---
     * Optional as a set (stream_create NULL: a chunk is copied with to_host
     * and to_device, on the collective's stream, waited for). The device's
     * ops of the same names; copy is enqueued on stream and returns (dir 1:
     * host to device, 0: device to host), event_synchronize blocks the host. */
    int (*stream_create)(void *ctx, void **stream);
    void (*stream_destroy)(void *ctx, void *stream);
    int (*copy)(void *ctx, void *stream, void *dst, const void *src, size_t bytes, int to_device);
    int (*event_create)(void *ctx, void **ev);
    void (*event_destroy)(void *ctx, void *ev);
    int (*event_record)(void *ctx, void *ev, void *stream);
    int (*stream_wait)(void *ctx, void *stream, void *ev);
    int (*event_synchronize)(void *ctx, void *ev);
};

struct fsdp_group {
    char name[64];                   /* "dp[1]" */
    int rank;                        /* rank in the group */
    int size;
    int *world_ranks;                /* (size,) */
    const struct fsdp_backend_ops *ops;
    struct fsdp_backend *be;
    struct fsdp_store *store;        /* prefixed view for this group */
    struct fsdp_dist *dist;
    uint64_t seq;                    /* collectives issued so far */
    double timeout_s;
    uint64_t monitored_barriers;     /* fsdp_monitored_barrier calls so far */
    const struct fsdp_stager *stager; /* NULL: no staging (borrowed) */
    struct fsdp_stage_pool *stage;    /* host buffers of staged collectives */
};

/* Collective over the members (world_ranks ascending, caller included). */
int fsdp_group_create(struct fsdp_dist *d, const char *name, const int *world_ranks, int size,
                      const struct fsdp_backend_ops *ops, struct fsdp_group **out);
void fsdp_group_destroy(struct fsdp_group *g);
/* From now on, collectives on st->mem memory that g's backend cannot take
 * run staged through host memory (st borrowed: it outlives g; NULL: none).
 * Returns 1 when g stages st->mem, 0 when its backend takes it. When it
 * starts staging it is collective over g's members, which compare their
 * chunk sizes (below): FSDP_ERR_MISMATCH on every member when they differ. */
int fsdp_group_set_stager(struct fsdp_group *g, const struct fsdp_stager *st);
/*
 * A staged collective is cut in chunks of this many bytes (each rank's
 * block of an all-gather or reduce-scatter is), chunk i+1 copied to the
 * host while chunk i's host collective runs and each chunk copied back as
 * it completes. set_stager reads $FSDPC_STAGE_CHUNK_BYTES (a size: 4M,
 * 64K; default 4 MiB; 0: whole buffers, copied at issue and at the wait);
 * a malformed value is its error. Every member of g must use the same.
 */
size_t fsdp_group_stage_chunk(const struct fsdp_group *g);
/* Overrides it for g (every member alike); a group that stages nothing
 * keeps it for when it does. */
void fsdp_group_set_stage_chunk(struct fsdp_group *g, size_t bytes);
/* "chunks of 4 MiB", or "whole buffers" with chunking off, for messages. */
void fsdp_group_stage_describe(const struct fsdp_group *g, char *buf, size_t len);

int fsdp_allreduce(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                   enum fsdp_dtype dtype, enum fsdp_redop op, const struct fsdp_coll_attr *attr,
                   struct fsdp_work **work);
int fsdp_allgather(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                   enum fsdp_dtype dtype, const struct fsdp_coll_attr *attr,
                   struct fsdp_work **work);
int fsdp_reduce_scatter(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum fsdp_dtype dtype, enum fsdp_redop op,
                        const struct fsdp_coll_attr *attr, struct fsdp_work **work);
int fsdp_broadcast(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype, int root,
                   const struct fsdp_coll_attr *attr, struct fsdp_work **work);
int fsdp_barrier(struct fsdp_group *g, struct fsdp_work **work);

/*
 * Point-to-point (p2p.c): count elements to or from group rank peer, for
 * the messages a pipeline passes between its stages. Messages between two
 * ranks arrive in the order they were sent; tag is what the caller says the
 * message is (a pipeline's stage and micro-batch): it is recorded and, under
 * FSDPC_DEBUG=DETAIL, checked against the sender's, with dtype and count,
 * before the receive completes (FSDP_ERR_MISMATCH naming both calls). The
 * flight recorder keeps each direction of a pair as a channel of its own,
 * "<group>:<src>><dst>", numbered apart from the group's collectives, so a
 * message that never came is named like a stuck collective. A backend
 * without FSDP_CAP_SEND_RECV answers FSDP_ERR_UNSUPPORTED. A group's
 * operations start in issue order on tcp (one at a time): two ranks that
 * each post a receive from the other before their send wait for ever, so
 * order a pair's calls as a schedule does (one side sends first).
 */
int fsdp_send(struct fsdp_group *g, const void *buf, size_t count, enum fsdp_dtype dtype, int peer,
              uint32_t tag, const struct fsdp_coll_attr *attr, struct fsdp_work **work);
int fsdp_recv(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype, int peer,
              uint32_t tag, const struct fsdp_coll_attr *attr, struct fsdp_work **work);

/*
 * Progress is the group layer's job. fsdp_group_progress drives the group's
 * collectives in flight on a backend that moves data only inside its calls
 * (mpi): a caller that computes between collectives calls it once per group
 * now and then. With a backend that has a progress thread (tcp; nccl's
 * streams) it does nothing. It never blocks and never reports an error:
 * errors surface at the work's wait. fsdp_work_done then says, without any
 * I/O, whether a collective is complete, for bookkeeping (when it ended,
 * what to issue next); it is current after a progress call on its group, or
 * at any time with a progressing backend.
 */
void fsdp_group_progress(struct fsdp_group *g);
int fsdp_work_done(struct fsdp_work *w);

/* timeout_s < 0 means the group's deadline. */
int fsdp_work_wait(struct fsdp_work *w, double timeout_s);
int fsdp_work_test(struct fsdp_work *w, int *done);
void fsdp_work_free(struct fsdp_work *w);

/* Issue, wait with the group deadline, free. */
int fsdp_allreduce_sync(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum fsdp_dtype dtype, enum fsdp_redop op);
int fsdp_allgather_sync(struct fsdp_group *g, const void *sendbuf, void *recvbuf, size_t count,
                        enum fsdp_dtype dtype);
int fsdp_reduce_scatter_sync(struct fsdp_group *g, const void *sendbuf, void *recvbuf,
                             size_t count, enum fsdp_dtype dtype, enum fsdp_redop op);
int fsdp_broadcast_sync(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype,
                        int root);
int fsdp_barrier_sync(struct fsdp_group *g);
int fsdp_send_sync(struct fsdp_group *g, const void *buf, size_t count, enum fsdp_dtype dtype,
                   int peer, uint32_t tag);
int fsdp_recv_sync(struct fsdp_group *g, void *buf, size_t count, enum fsdp_dtype dtype, int peer,
                   uint32_t tag);

/*
 * A barrier through the group's store that names who is missing (torch's
 * monitored_barrier): every member checks in, group rank 0 waits up to
 * timeout_s (< 0: the group's deadline) and then names every rank that did
 * not arrive (only the first when wait_all is 0); every member gets the same
 * error. Slower than fsdp_barrier: for debugging and for the moments where a
 * named straggler matters (startup, checkpoints). Keys accumulate in the
 * store (a few per call), so call it occasionally, not per step.
 */
int fsdp_monitored_barrier(struct fsdp_group *g, double timeout_s, int wait_all);

#endif
