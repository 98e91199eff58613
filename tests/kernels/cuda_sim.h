/*
 * cuda_sim.h - knobs and counters of the simulated CUDA runtime that
 * test_cuda_device links the cuda device's host side against
 * (tests/kernels/cuda_sim.c; its API is cuda_sim_api/cuda_runtime_api.h).
 * A sibling of tests/backends/nccl_sim: the same names for the same ideas
 * (sim_ndev, sim_dev, sim_sticky, sim_hold, sim_pending, sim_reset,
 * sim_live), with the runtime's memory and copies modelled as well, which
 * the nccl simulation does not need.
 *
 * The model:
 *   devices  sim_ndev of them; a current device per thread (sim_dev, 0
 *            until the thread sets one). Each has sim_capacity bytes:
 *            cudaMalloc past it fails with cudaErrorMemoryAllocation (not
 *            sticky: cudaGetLastError returns it once). Device memory is
 *            host memory, handed out dirty (0xcd), as cudaMalloc does not
 *            zero; pinned host memory (cudaHostAlloc) is dirty too (0xa5).
 *   streams  FIFO queues of work items: copies, fills, event marks and
 *            waits on another stream's position. A copy or fill takes
 *            effect when it reaches the head of a stream that is not held
 *            (sim_hold), so a missing order between streams shows up as a
 *            wrong value; a slow stream (SIM_SLOW) runs only when the
 *            host waits for it. The legacy default stream (handle NULL) works
 *            too, and every item queued on it is counted (sim_legacy_uses).
 *            A copy from pageable host memory is taken at the call, as the
 *            runtime stages it; a copy into pageable memory returns when
 *            it has run.
 *   checks   a copy or fill whose pointers are not where its kind says (or
 *            run past an allocation) fails with cudaErrorInvalidValue and
 *            counts in sim_bad_calls; a wait that would block for ever (a
 *            held stream) returns at once and counts in sim_hangs.
 *   errors   sim_sticky: every call returns it, cudaGetLastError included,
 *            and it never clears; sim_fail_call/sim_fail_error: the next
 *            call of that name fails once with that error.
 */
#ifndef FSDP_TESTS_CUDA_SIM_H
#define FSDP_TESTS_CUDA_SIM_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#define SIM_MAXDEV 8

/* knobs (sim_reset restores the defaults) */
extern int sim_ndev;               /* visible devices (2); 0: cudaGetDeviceCount fails */
extern _Thread_local int sim_dev;  /* this thread's current device */
extern size_t sim_capacity;        /* bytes of memory per device (64 MiB) */
extern char sim_name[256];         /* what cudaGetDeviceProperties names ("NVIDIA H200") */
extern int sim_cc;                 /* its compute capability, major * 10 + minor (90) */
extern cudaError_t sim_sticky;     /* a sticky error; cudaSuccess: none */
extern const char *sim_fail_call;  /* the name of a call to fail once (NULL: none) */
extern cudaError_t sim_fail_error; /* ... with this error */
extern int sim_lazy_streams;       /* streams made from now on are SIM_SLOW */

/* what happened (sim_reset zeroes them) */
extern size_t sim_used[SIM_MAXDEV]; /* device bytes allocated */
extern int sim_mallocs;             /* successful cudaMalloc calls */
extern int sim_device_syncs;        /* cudaDeviceSynchronize calls */
extern int sim_legacy_uses;         /* work items queued on a legacy default stream */
extern int sim_blocking_streams;    /* streams made without cudaStreamNonBlocking */
extern int sim_timed_events;        /* events made without cudaEventDisableTiming */
extern int sim_bad_calls;           /* copies and fills refused (see above) */
extern int sim_hangs;               /* waits that would never have returned */

/* Holds (1) or releases (0) a stream: nothing on it runs while held.
 * SIM_SLOW: its work runs only when the host waits for it (a
 * synchronisation of it, of an event on it, or of its device), as work
 * that takes its time would. */
#define SIM_SLOW 2
void sim_hold(cudaStream_t s, int held);
/* Items queued on s and not yet run. */
int sim_pending(cudaStream_t s);
/* The device a stream was made on (-1: not a stream of the simulation). */
int sim_stream_device(cudaStream_t s);
/* Releases every hold, runs what can run, restores the knobs and zeroes
 * the counters (sim_used stays: it is what is allocated). */
void sim_reset(void);
/* Live simulated objects (streams, events, device and host allocations):
 * a difference across create/destroy is a leak. */
int sim_live(void);

/* For simulations of libraries that run work on streams (the simulated
 * cuBLASLt, test kernels): fn(arg) runs as an item of s (NULL: the legacy
 * default stream), in its order, with the simulation's lock held, so fn
 * calls nothing of the simulation; fn owns arg. */
cudaError_t sim_enqueue_fn(cudaStream_t s, void (*fn)(void *), void *arg);
/* Whether [p, p + n) lies in one device allocation. */
int sim_is_device(const void *p, size_t n);

#endif
