/*
 * nccl_sim.h - knobs and counters of the simulated CUDA runtime and NCCL
 * that test_nccl_sim links the nccl backend against.
 *
 * Model: devices are numbers (sim_ndev of them, the current one per
 * thread); device memory is host memory registered with its device; a
 * stream runs each work item at once unless it is held (sim_hold), and an
 * event completes once its stream has run everything queued before it. A
 * communicator answers ncclInProgress from ncclCommGetAsyncError for a set
 * number of polls after init, a collective or finalize (-1: for ever),
 * then sim_async. Collectives are one-rank copies and record their
 * arguments in sim_last.
 */
#ifndef FSDP_TESTS_NCCL_SIM_H
#define FSDP_TESTS_NCCL_SIM_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

enum sim_func { SIM_NONE, SIM_ALLREDUCE, SIM_ALLGATHER, SIM_REDUCE_SCATTER, SIM_BROADCAST };

/* The last collective as NCCL saw it. */
struct sim_call {
    enum sim_func func;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t t;
    ncclRedOp_t op;
    int root;
    struct CUstream_st *s;
};

/* knobs (sim_reset restores the defaults) */
extern int sim_ndev;                  /* visible devices; 0: cudaGetDeviceCount fails */
extern _Thread_local int sim_dev;     /* this thread's current device */
extern int sim_init_polls;            /* in-progress polls after init, -1: never done */
extern int sim_coll_polls;            /* ... after each collective */
extern int sim_final_polls;           /* ... after ncclCommFinalize */
extern ncclResult_t sim_async;        /* what a settled communicator reports */
extern cudaError_t sim_event_error;   /* what cudaEventQuery answers when set */

/* what happened */
extern struct CUstream_st sim_legacy; /* the legacy default stream */
extern struct sim_call sim_last;
extern int sim_calls;                 /* collectives queued */
extern int sim_aborts, sim_destroys;  /* ncclCommAbort / ncclCommDestroy calls */
extern int sim_blocking;              /* config.blocking of the last init */
extern int sim_events_made;           /* cudaEventCreate calls */
extern int sim_legacy_waits;          /* stream waits on an event of the legacy stream */
extern int sim_record_early;          /* events recorded while a collective was in progress */
extern ncclUniqueId sim_uid_seen[4];  /* the id each rank initialised with */

void sim_hold(cudaStream_t s, int held);
void sim_reset(void);
/* Live simulated objects (streams, events, allocations, communicators): a
 * difference across create/destroy is a leak. */
int sim_live(void);

#endif
