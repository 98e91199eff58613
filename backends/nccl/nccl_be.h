/*
 * nccl_be.h - private to backends/nccl: the backend instance, its work
 * handles, and the calls shared by nccl_comm.c (device choice, communicator
 * life cycle, failure state, the abort thread, work pool, polling) and
 * nccl_ops.c (collectives, send/recv batches, work wait/test, the exported
 * ops table).
 *
 * Locking. Two mutexes, always taken in this order:
 *   issue_mu  serialises the calls that enqueue on the communicator or
 *             change it (collectives, the send/recv group, finalize) and
 *             the abort thread's taking of `comm`. It is held across the
 *             wait for a non-blocking enqueue to leave ncclInProgress (that
 *             wait ends at the deadline or when an abort is pending), never
 *             by work_wait/work_test of a launched op.
 *   mu        the pool, the send/recv batch, work states and the `comm`
 *             pointer; held only across non-blocking calls (cudaEventQuery,
 *             ncclCommGetAsyncError).
 * `comm` is set to NULL by the abort thread with both held, so a reader
 * holding either one sees a live communicator or NULL.
 *
 * ncclCommAbort is never called with a lock held nor by a caller of the
 * vtable: it can wait for kernels that NCCL ordered after work of another
 * group (a caller stream shared by two groups), so it runs on a thread of
 * its own per instance, and abort() only records the reason and starts
 * that thread. abort() is called from ordinary threads (the group layer's
 * abort callbacks, a watchdog); it is not async-signal-safe.
 *
 * Devices. Every entry point first makes the instance's device current for
 * the calling thread (fsdp_nccl_device_use) and leaves it so: switching a
 * thread back to a device it never chose would create a CUDA context there.
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

/* ncclConfig_t.commName arrived in 2.27 (ncclConfig_v22700). */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define NCCL_HAVE_COMM_NAME 1
#else
#define NCCL_HAVE_COMM_NAME 0
#endif

enum nccl_kind {
    NCCL_ALLREDUCE,
    NCCL_ALLGATHER,
    NCCL_REDUCE_SCATTER,
    NCCL_BROADCAST,
    NCCL_SEND,
    NCCL_RECV,
};

/* One op as the issue path sees it. */
struct nccl_call {
    enum nccl_kind kind;
    const char *op;        /* name for messages (static string) */
    const void *sendbuf;
    void *recvbuf;
    size_t count;          /* elements, per rank for allgather/reduce_scatter */
    enum fsdp_dtype dtype;
    enum fsdp_redop redop;
    int peer;              /* broadcast root, or send/recv peer (group ranks) */
};

enum nccl_work_state {
    NCCL_WORK_FREE = 0, /* in the pool */
    NCCL_WORK_DEFERRED, /* a send/recv in the batch, not yet handed to NCCL */
    NCCL_WORK_PENDING,  /* launched, completion not yet observed */
    NCCL_WORK_DONE,     /* completed successfully */
    NCCL_WORK_FAILED,   /* failed; rc holds the error */
};

struct nccl_work {
    struct fsdp_work base; /* first: the group layer sees only this */
    struct fsdp_backend *be;
    cudaEvent_t done_ev;   /* recorded on `stream` right after the op is queued */
    cudaStream_t stream;   /* where the op runs */
    struct nccl_work *next; /* the free list, or the send/recv batch */
    enum nccl_work_state state;
    int orphan;            /* freed while its batch was being launched: back to the
                              pool once the launch is over */
    int rc;                /* the error once FAILED */
    uint64_t seq;          /* issue number on this instance, from 1 */
    double t_issue;        /* fsdp_now() at launch: the backend deadline counts from here */
    struct nccl_call call;
};

struct nccl_reaper; /* the abort thread's state (nccl_comm.c) */

struct fsdp_backend {
    char name[64];         /* group name, e.g. "dp[1]" */
    int rank;              /* rank in the group */
    int size;
    int world_rank;
    int world_rank0;       /* world rank of group rank 0, which publishes the unique id */
    int device;            /* CUDA ordinal the communicator lives on */
    double timeout_s;      /* the group's deadline: bounds finalize */
    double deadline_s;     /* the backend's own: init, enqueue, every op (the longer of
                              timeout_s and FSDPC_INIT_TIMEOUT) */
    char host[64];

    pthread_mutex_t issue_mu;
    pthread_mutex_t mu;
    ncclComm_t comm;       /* NULL once taken by the abort thread or destroyed */
    cudaStream_t stream;   /* owned, non-blocking: ops without attr->stream, barrier */
    float *scratch;        /* (1,) device: the barrier's operand */
    int scratch_pooled;    /* scratch came from cudaMallocAsync (freed without a sync) */
    uint64_t seq;          /* ops issued so far */

    struct nccl_work **works; /* (n_works,) every handle ever made; freed by destroy */
    size_t n_works;
    size_t cap_works;
    struct nccl_work *free_list;
    struct nccl_work *batch_head; /* deferred send/recv, in issue order */
    struct nccl_work *batch_tail;

    /* Sticky failure: fail_state 0 = healthy, 1 = message being written,
     * 2 = failed with fail_code and fail_msg set. */
    atomic_int fail_state;
    atomic_int fail_code;
    atomic_int abort_pending; /* the communicator must be aborted */
    char fail_msg[384];
    atomic_int reaper_started;
    struct nccl_reaper *reaper; /* set under mu when the abort thread starts */
};

/* ---- nccl_comm.c ---- */
FSDP_PRIVATE int fsdp_nccl_create(const struct fsdp_group_info *info, struct fsdp_backend **out);
FSDP_PRIVATE void fsdp_nccl_destroy(struct fsdp_backend *be);
FSDP_PRIVATE void fsdp_nccl_abort(struct fsdp_backend *be, const char *why);
FSDP_PRIVATE void fsdp_nccl_capabilities(struct fsdp_backend *be, struct fsdp_backend_caps *caps);

/* Records the first failure (later ones are ignored) and asks for the
 * communicator to be aborted; returns the first failure's code. */
FSDP_PRIVATE int fsdp_nccl_fail(struct fsdp_backend *be, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* 0, or records the sticky error in this thread's message and returns it. */
FSDP_PRIVATE int fsdp_nccl_check_failed(struct fsdp_backend *be);
/* When a failure asked for it, starts the abort thread (once); returns at
 * once. Must be called with neither lock held. */
FSDP_PRIVATE void fsdp_nccl_reap(struct fsdp_backend *be);
/* fsdp error code for an NCCL result. */
FSDP_PRIVATE int fsdp_nccl_code(ncclResult_t r);
/* Records "what failed on cuda:N" for a CUDA error and returns FSDP_ERR_BACKEND. */
FSDP_PRIVATE int fsdp_nccl_cuda_err(struct fsdp_backend *be, const char *what, cudaError_t ce);
/* Whether a CUDA error only refuses the call (a bad argument) rather than
 * saying the device or its context is broken (sticky errors and the rest). */
FSDP_PRIVATE int fsdp_nccl_cuda_usage_error(cudaError_t ce);

/* Work pool, with mu held. get reuses a free handle or makes one and hands
 * it over with a new issue number; put takes a handle back (a second put
 * is ignored). */
FSDP_PRIVATE int fsdp_nccl_work_get_locked(struct fsdp_backend *be, struct nccl_work **out);
FSDP_PRIVATE void fsdp_nccl_work_put_locked(struct fsdp_backend *be, struct nccl_work *w);

/* Makes be->device current for this thread unless it already is; never
 * switches back (see the header comment). */
FSDP_PRIVATE int fsdp_nccl_device_use(struct fsdp_backend *be);

/* Polling: spin for the first tens of microseconds (short ops end there),
 * then yield, then sleep with a growing interval. fsdp_nccl_pause_plan is
 * the policy alone: what the pause after `elapsed` seconds of polling does
 * (*sleep_ns set for a sleep); it advances the growing sleep. */
struct nccl_poll {
    double t0;     /* fsdp_now() when polling began */
    long sleep_ns; /* the next sleep */
};
enum nccl_pause {
    NCCL_PAUSE_SPIN,
    NCCL_PAUSE_YIELD,
    NCCL_PAUSE_SLEEP,
};
FSDP_PRIVATE void fsdp_nccl_poll_start(struct nccl_poll *p);
FSDP_PRIVATE enum nccl_pause fsdp_nccl_pause_plan(struct nccl_poll *p, double elapsed,
                                                  long *sleep_ns);
FSDP_PRIVATE void fsdp_nccl_pause(struct nccl_poll *p);

#endif
