/*
 * backend.h - the collective backend vtable (mpi, tcp, nccl).
 *
 * A backend instance serves one process group (one slice of one mesh
 * dimension). Every collective is asynchronous: it validates its arguments,
 * queues or starts the operation and returns a work handle; the caller later
 * waits (with a deadline) or tests it, then frees it. Operations issued on
 * one instance complete in issue order; instances are independent, so
 * operations on different groups progress at the same time.
 *
 * Semantics follow torch.distributed / NCCL:
 *   allreduce       count elements; in place when recvbuf == sendbuf.
 *   allgather       count elements per rank; recvbuf holds size*count;
 *                   in place when sendbuf == recvbuf + rank*count.
 *   reduce_scatter  sendbuf holds size*count, recvbuf count (block `rank`);
 *                   in place when recvbuf == sendbuf + rank*count.
 *   broadcast       count elements from root, in place.
 * f16/bf16 SUM/AVG add in f32 and round once per step; AVG divides by the
 * group size once at the end (integer types truncate).
 *
 * Versioning follows libfabric: the struct starts with its own size and new
 * members are only ever appended. An optional member left NULL means "not
 * supported" (the group layer answers FSDP_ERR_UNSUPPORTED).
 */
#ifndef FSDP_BACKEND_H
#define FSDP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/mem.h"

struct fsdp_store;
struct fsdp_group;

/* Where a collective's buffers live and what it is ordered after. */
struct fsdp_coll_attr {
    enum fsdp_mem mem; /* both buffers in the same space */
    void *stream;      /* cudaStream_t for FSDP_MEM_CUDA, else NULL */
};

/* FSDP_CAP_MEM_HOST, _CUDA, _GUARDED: core/mem.h */
#define FSDP_CAP_SEND_RECV (1u << 2)
#define FSDP_CAP_ASYNC_PROGRESS (1u << 3) /* progresses while the caller computes */

struct fsdp_backend_caps {
    uint32_t flags;  /* FSDP_CAP_* */
    uint32_t dtypes; /* bit (1u << dtype) for every supported enum fsdp_dtype */
    uint32_t redops; /* bit (1u << op) for every supported enum fsdp_redop */
};

struct fsdp_auth_key;

/* What a backend instance is created for. Lives as long as the instance. */
struct fsdp_group_info {
    const char *name;       /* "dp[1]": dimension name and slice index, or "world" */
    int rank;               /* this process's rank in the group */
    int size;               /* group size */
    const int *world_ranks; /* (size,) world rank of each group member, ascending */
    int world_rank;
    int world_size;
    uint64_t nonce;           /* job nonce: names the job */
    const struct fsdp_auth_key *auth_key; /* keys the connection handshake (auth.h): a
                                 peer that cannot prove it holds it is refused */
    double timeout_s;         /* deadline for every blocking step inside the backend */
    struct fsdp_store *store; /* rendezvous store, prefixed for this group */
    int local_rank;           /* rank among the processes on this host (picks the
                                 CUDA device); -1 when unknown */
    const char *local_addr;   /* the address other hosts reach this rank at
                                 (rendezvous/netaddr.h); NULL: the backend chooses */
};

/* Common head of every backend's work handle. */
struct fsdp_work {
    const struct fsdp_backend_ops *ops;
    struct fsdp_group *group; /* set by the group layer when it issues the op */
    uint64_t flight_id;       /* the group layer's flight record (0: none) */
    int done;                 /* the group layer saw it complete (fsdp_group_progress) */
    struct fsdp_staged *staged; /* the group layer's host staging of it (NULL: none) */
    struct fsdp_p2p_desc *p2p;  /* the group layer's check of a point-to-point op (NULL: none) */
};

struct fsdp_backend; /* opaque, defined by each backend */

struct fsdp_backend_ops {
    size_t size; /* sizeof(struct fsdp_backend_ops) the backend was built with */
    const char *name;

    /* Collective over the group's members (blocks until connected). */
    int (*create)(const struct fsdp_group_info *info, struct fsdp_backend **out);
    /* Releases threads, sockets, communicators; must not block on peers. */
    void (*destroy)(struct fsdp_backend *be);
    /* Fails every pending and future op with FSDP_ERR_ABORTED and returns
     * without waiting for peers or the device. Called from ordinary threads
     * (the job abort's callbacks, a watchdog), never from a signal handler. */
    void (*abort)(struct fsdp_backend *be, const char *why);
    void (*capabilities)(struct fsdp_backend *be, struct fsdp_backend_caps *caps);

    /* Non-blocking; see the header comment for buffer sizes and in-place. */
    int (*allreduce)(struct fsdp_backend *be, const void *sendbuf, void *recvbuf, size_t count,
                     enum fsdp_dtype dtype, enum fsdp_redop op, const struct fsdp_coll_attr *attr,
                     struct fsdp_work **work);
    int (*allgather)(struct fsdp_backend *be, const void *sendbuf, void *recvbuf, size_t count,
                     enum fsdp_dtype dtype, const struct fsdp_coll_attr *attr,
                     struct fsdp_work **work);
    int (*reduce_scatter)(struct fsdp_backend *be, const void *sendbuf, void *recvbuf, size_t count,
                          enum fsdp_dtype dtype, enum fsdp_redop op,
                          const struct fsdp_coll_attr *attr, struct fsdp_work **work);
    int (*broadcast)(struct fsdp_backend *be, void *buf, size_t count, enum fsdp_dtype dtype,
                     int root, const struct fsdp_coll_attr *attr, struct fsdp_work **work);
    int (*barrier)(struct fsdp_backend *be, struct fsdp_work **work);
    /* Optional point-to-point (NULL when unsupported); peer is a group rank. */
    int (*send)(struct fsdp_backend *be, const void *buf, size_t count, enum fsdp_dtype dtype,
                int peer, const struct fsdp_coll_attr *attr, struct fsdp_work **work);
    int (*recv)(struct fsdp_backend *be, void *buf, size_t count, enum fsdp_dtype dtype, int peer,
                const struct fsdp_coll_attr *attr, struct fsdp_work **work);

    /* Blocks until done or timeout_s passes: 0, the op's error, or
     * FSDP_ERR_TIMEOUT (the op stays pending; the handle stays valid). */
    int (*work_wait)(struct fsdp_work *work, double timeout_s);
    /* Non-blocking: *done = 1 when complete; returns the op's error if any. */
    int (*work_test)(struct fsdp_work *work, int *done);
    /* Frees a completed (or aborted) handle. */
    void (*work_free)(struct fsdp_work *work);
    /* FSDP_CAP_MEM_* of the memory its collectives take, known before any
     * instance exists, so that a wrong choice is refused before a
     * communicator is made. */
    uint32_t mem_caps;
};

/* Registry: the backends compiled into this build, by name. */
const struct fsdp_backend_ops *fsdp_backend_find(const char *name);
/* Comma-separated list of compiled backends, e.g. "mpi,tcp,nccl". */
const char *fsdp_backend_names(void);

extern const struct fsdp_backend_ops fsdp_mpi_ops;
extern const struct fsdp_backend_ops fsdp_tcp_ops;
#if HAVE_NCCL
extern const struct fsdp_backend_ops fsdp_nccl_ops;
#endif

#endif
