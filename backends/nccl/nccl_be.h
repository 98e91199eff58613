/*
 * nccl_be.h - private to backends/nccl: the backend instance, its work
 * handles, and the calls shared by nccl_comm.c (device choice, communicator
 * life cycle, failure state, work pool) and nccl_ops.c (collectives, work
 * wait/test, the exported ops table).
 *
 * Locking: every use of the communicator, the owned stream and the work pool
 * happens under `mu`, held only for non-blocking CUDA/NCCL calls; the polling
 * loops (init, enqueue, finalize, wait) drop it between polls or check
 * `abort_pending` on every round. abort() may come from another thread or a
 * signal handler: it records the failure without allocating, then aborts the
 * communicator itself if it gets the lock within a bounded time, otherwise
 * the next lock holder does it.
 *
 * Nothing here is visible outside backends/nccl except fsdp_nccl_ops:
 * symbols local to a file carry the prefix nccl_, the calls shared between
 * the two files carry fsdp_nccl_ and are FSDP_PRIVATE.
 */
#ifndef FSDP_BACKENDS_NCCL_BE_H
#define FSDP_BACKENDS_NCCL_BE_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/dtype.h"
#include "core/util.h"

/* ncclCommInitRankConfig, ncclConfig_t and ncclCommFinalize arrived in 2.14. */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl backend needs NCCL 2.14 or newer (non-blocking communicators)"
#endif

enum nccl_work_state {
    NCCL_WORK_FREE = 0, /* in the pool */
    NCCL_WORK_PENDING,  /* issued, completion not yet observed */
    NCCL_WORK_DONE,     /* completed successfully */
    NCCL_WORK_FAILED,   /* failed; rc holds the error */
};

struct nccl_work {
    struct fsdp_work base; /* first: the group layer sees only this */
    struct fsdp_backend *be;
    cudaEvent_t done_ev;   /* recorded on the op's stream right after the op */
    struct nccl_work *next_free;
    enum nccl_work_state state;
    int rc;                /* the error once FAILED */
    uint64_t seq;          /* issue number on this instance, from 1 */
    double t_issue;        /* fsdp_now() when issued: the backend deadline counts from here */
    const char *op;        /* "allreduce", ... (static string) */
    size_t count;
    enum fsdp_dtype dtype;
};

struct fsdp_backend {
    char name[64];         /* group name, e.g. "dp[1]" */
    int rank;              /* rank in the group */
    int size;
    int world_rank;
    int world_rank0;       /* world rank of group rank 0, which publishes the unique id */
    int device;            /* CUDA ordinal the communicator lives on */
    double timeout_s;      /* deadline for init, enqueue, finalize and every op */
    char host[64];

    pthread_mutex_t mu;
    ncclComm_t comm;       /* NULL once aborted or destroyed */
    cudaStream_t stream;   /* owned, non-blocking: ops without attr->stream, barrier */
    cudaEvent_t dep_ev;    /* orders `stream` after the legacy default stream */
    float *scratch;        /* (1,) device: the barrier's operand */
    uint64_t seq;          /* ops issued so far */

    struct nccl_work **works; /* (n_works,) every handle ever made; freed by destroy */
    size_t n_works;
    size_t cap_works;
    struct nccl_work *free_list;

    /* Sticky failure: fail_state 0 = healthy, 1 = message being written,
     * 2 = failed with fail_code and fail_msg set. */
    atomic_int fail_state;
    atomic_int fail_code;
    atomic_int abort_pending; /* the communicator must be aborted by the next lock holder */
    char fail_msg[384];
};

/* ---- nccl_comm.c ---- */
FSDP_PRIVATE int fsdp_nccl_create(const struct fsdp_group_info *info, struct fsdp_backend **out);
FSDP_PRIVATE void fsdp_nccl_destroy(struct fsdp_backend *be);
FSDP_PRIVATE void fsdp_nccl_abort(struct fsdp_backend *be, const char *why);
FSDP_PRIVATE void fsdp_nccl_capabilities(struct fsdp_backend *be, struct fsdp_backend_caps *caps);

/* Records the first failure (later ones are ignored) and asks for the
 * communicator to be aborted; returns code. No allocation. */
FSDP_PRIVATE int fsdp_nccl_fail(struct fsdp_backend *be, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 0, or records the sticky error in this thread's message and returns it. */
FSDP_PRIVATE int fsdp_nccl_check_failed(struct fsdp_backend *be);
/* With mu held: aborts the communicator when a failure asked for it. */
FSDP_PRIVATE void fsdp_nccl_reap_locked(struct fsdp_backend *be);
/* fsdp error code for an NCCL result. */
FSDP_PRIVATE int fsdp_nccl_code(ncclResult_t r);
/* Records "what failed on cuda:N" for a CUDA error and returns FSDP_ERR_BACKEND. */
FSDP_PRIVATE int fsdp_nccl_cuda_err(struct fsdp_backend *be, const char *what, cudaError_t ce);

/* Work pool, with mu held. get reuses a free handle or makes one and hands
 * it over PENDING; put takes a handle back (a second put is ignored). */
FSDP_PRIVATE int fsdp_nccl_work_get_locked(struct fsdp_backend *be, struct nccl_work **out);
FSDP_PRIVATE void fsdp_nccl_work_put_locked(struct fsdp_backend *be, struct nccl_work *w);

/* Makes be->device current for this thread; *saved receives the previous
 * device to give to fsdp_nccl_device_leave. */
FSDP_PRIVATE int fsdp_nccl_device_enter(struct fsdp_backend *be, int *saved);
FSDP_PRIVATE void fsdp_nccl_device_leave(struct fsdp_backend *be, int saved);

/* Sleeps a little longer on each round (spins first): polling back-off. */
FSDP_PRIVATE void fsdp_nccl_pause(unsigned *round);

#endif
