/*
 * nccl_sim.h - knobs and counters of the simulated CUDA runtime and NCCL
 * that test_nccl_sim links the nccl backend against.
 *
 * The model, close enough to the real libraries for the backend's control
 * logic:
 *   devices    sim_ndev of them; a current device per thread (0 until the
 *              thread sets one); a context is made on a device by
 *              cudaSetDevice and by any call that needs one on the thread's
 *              current device (sim_ctx records which devices got one).
 *              A sticky error (sim_sticky) is returned by every such call,
 *              cudaGetLastError included, and never clears.
 *   streams    FIFO queues of work items, one legacy default stream per
 *              device, one per-thread default stream per thread
 *              (cudaStreamPerThread names the calling thread's). An item
 *              runs when it reaches the head of a stream that is not held;
 *              cudaStreamWaitEvent queues a wait for the event's position.
 *              cudaFree synchronises the device: it waits until every
 *              stream of the device is empty.
 *   NCCL       communicators made with the same unique id form a clique;
 *              a collective (or a group of send/recv) completes when every
 *              member has it at the head of its streams; send/recv pairs
 *              match per peer in issue order. A communicator of more than
 *              one rank launches from a thread of the simulation: the call
 *              returns ncclInProgress and ncclCommGetAsyncError says
 *              ncclInProgress until that thread has queued the work (that
 *              thread names cudaStreamPerThread as its own stream).
 *              ncclGroupStart/End batch the calls of one thread.
 *              ncclCommAbort kills the communicator's work as it reaches
 *              the head of its streams and waits until it has: work queued
 *              behind a stuck item of another communicator makes it wait.
 *              NCCL_COMM_BLOCKING=1 in the environment makes communicators
 *              blocking. Misuse (a call on a communicator whose previous
 *              launch is still in progress, a call on a destroyed one) is
 *              counted in sim_misuse.
 *   hangs      a call that would block for ever (abort behind a stuck
 *              stream, cudaFree of a device with stuck work) gives up after
 *              sim_block_limit seconds and counts one in sim_hangs.
 * One-rank collectives are copies; multi-rank ones reduce f32, f64, i32,
 * i64 and u8 (f16/bf16 keep the rank's own values).
 */
#ifndef FSDP_TESTS_NCCL_SIM_H
#define FSDP_TESTS_NCCL_SIM_H

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stddef.h>

#define SIM_MAXDEV 8

enum sim_func {
    SIM_NONE,
    SIM_ALLREDUCE,
    SIM_ALLGATHER,
    SIM_REDUCE_SCATTER,
    SIM_BROADCAST,
    SIM_SEND,
    SIM_RECV,
};

/* The last op as NCCL saw it when it was called. */
struct sim_call {
    enum sim_func func;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t t;
    ncclRedOp_t op;
    int root;              /* broadcast root, send/recv peer */
    cudaStream_t s;        /* the stream handle as passed */
};

/* knobs (sim_reset restores the defaults) */
extern int sim_ndev;                  /* visible devices; 0: cudaGetDeviceCount fails */
extern _Thread_local int sim_dev;     /* this thread's current device */
extern int sim_init_polls;            /* in-progress polls after init, -1: never done */
extern int sim_coll_polls;            /* ... after each launch */
extern int sim_final_polls;           /* ... after ncclCommFinalize */
extern ncclResult_t sim_async;        /* what a settled communicator reports */
extern cudaError_t sim_event_error;   /* what cudaEventQuery answers when set */
extern cudaError_t sim_sticky;        /* a sticky CUDA error, cudaSuccess: none */
extern int sim_pools;                 /* devices support cudaMallocAsync */
extern int sim_ghost_peers;           /* multi-rank communicators set up without their
                                         peers, which never join a collective */
extern double sim_block_limit;        /* seconds before a blocking call counts a hang */

/* what happened */
extern struct sim_call sim_last;
extern int sim_calls;                 /* ops handed to NCCL */
extern int sim_group_launches;        /* ncclGroupEnd calls that launched something */
extern int sim_aborts;                /* ncclCommAbort calls (counted on entry) */
extern int sim_aborts_done;           /* ... that returned */
extern int sim_destroys;              /* ncclCommDestroy calls */
extern int sim_blocking;              /* whether the last communicator made is blocking */
extern int sim_events_made;           /* cudaEventCreate calls */
extern int sim_legacy_waits;          /* stream waits on an event of a legacy stream */
extern int sim_record_early;          /* events recorded on a stream whose launch was in progress */
extern int sim_hangs;                 /* blocking calls that gave up (see above) */
extern int sim_misuse;                /* NCCL API misuse */
extern int sim_ctx[SIM_MAXDEV];       /* 1: a context was made on the device */
extern int sim_set_devices;           /* cudaSetDevice calls */
extern const char *sim_comm_name;     /* config->commName of the last communicator made */
extern ncclUniqueId sim_uid_seen[4];  /* the id each rank initialised with */

/* The legacy default stream of device dev (for comparisons). */
cudaStream_t sim_legacy_stream(int dev);
/* Closes (1) or opens (0) the gate of multi-rank launches: while closed
 * they stay in progress (connection setup stuck). */
void sim_set_gate(int closed);
/* Holds (1) or releases (0) a stream: nothing on it runs while held. */
void sim_hold(cudaStream_t s, int held);
/* Items queued on s and not yet run. */
int sim_pending(cudaStream_t s);
/* Waits up to limit_s for sim_aborts_done to reach n; 1 when it did. */
int sim_wait_aborts_done(int n, double limit_s);
/* Forgets stuck work and restores the knobs; waits for the simulation's
 * launch threads to finish. */
void sim_reset(void);
/* Live simulated objects (streams, events, allocations, communicators): a
 * difference across create/destroy is a leak. */
int sim_live(void);

#endif
