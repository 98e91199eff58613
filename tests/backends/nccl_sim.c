/*
 * nccl_sim.c - a small simulation of the CUDA runtime and NCCL calls the
 * nccl backend makes, for test_nccl_sim (see nccl_sim.h for the model and
 * the knobs). Nothing here touches a GPU.
 */
#include "config.h"
#include "core/error.h"
#include "tests/backends/nccl_sim.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// CUDA runtime

struct CUstream_st {
    int held;
    uint64_t issued; /* work items queued */
    uint64_t done;   /* work items run */
};

struct CUevent_st {
    struct CUstream_st *s; /* NULL until recorded */
    uint64_t target;
};

static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
struct CUstream_st sim_legacy;
_Thread_local int sim_dev;
int sim_ndev = 1;
static int sim_streams, sim_events, sim_mallocs; /* live objects */
int sim_events_made;
int sim_legacy_waits;
cudaError_t sim_event_error;

#define SIM_ALLOCS 64
static struct {
    char *p;
    size_t n;
    int dev;
} sim_alloc[SIM_ALLOCS];

static struct CUstream_st *sim_stream(cudaStream_t s)
{
    return (s == NULL || s == cudaStreamLegacy) ? &sim_legacy : s;
}

static void sim_issue_locked(struct CUstream_st *s)
{
    s->issued++;
    if (!s->held) {
        s->done = s->issued;
    }
}

void sim_hold(cudaStream_t s, int held)
{
    struct CUstream_st *st = sim_stream(s);
    pthread_mutex_lock(&sim_mu);
    st->held = held;
    if (!held) {
        st->done = st->issued;
    }
    pthread_mutex_unlock(&sim_mu);
}

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = sim_ndev;
    return sim_ndev > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = sim_dev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= sim_ndev) {
        return cudaErrorInvalidDevice;
    }
    sim_dev = device;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotReady: return "device not ready";
    default: return "simulated CUDA error";
    }
}

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < SIM_ALLOCS; i++) {
        if (sim_alloc[i].p == NULL) {
            sim_alloc[i].p = calloc(1, size ? size : 1);
            sim_alloc[i].n = size;
            sim_alloc[i].dev = sim_dev;
            sim_mallocs++;
            *devPtr = sim_alloc[i].p;
            pthread_mutex_unlock(&sim_mu);
            return cudaSuccess;
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void *devPtr)
{
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < SIM_ALLOCS; i++) {
        if (devPtr != NULL && sim_alloc[i].p == devPtr) {
            free(sim_alloc[i].p);
            sim_alloc[i].p = NULL;
            sim_mallocs--;
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    const char *p = ptr;
    memset(attributes, 0, sizeof(*attributes));
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < SIM_ALLOCS; i++) {
        if (sim_alloc[i].p != NULL && p >= sim_alloc[i].p && p < sim_alloc[i].p + sim_alloc[i].n) {
            attributes->type = cudaMemoryTypeDevice;
            attributes->device = sim_alloc[i].dev;
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    memset(devPtr, value, count);
    pthread_mutex_lock(&sim_mu);
    sim_issue_locked(sim_stream(stream));
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    (void)flags;
    *pStream = calloc(1, sizeof(struct CUstream_st));
    pthread_mutex_lock(&sim_mu);
    sim_streams++;
    pthread_mutex_unlock(&sim_mu);
    return *pStream ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    pthread_mutex_lock(&sim_mu);
    sim_streams--;
    pthread_mutex_unlock(&sim_mu);
    free(stream);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    *event = calloc(1, sizeof(struct CUevent_st));
    pthread_mutex_lock(&sim_mu);
    sim_events++;
    sim_events_made++;
    pthread_mutex_unlock(&sim_mu);
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    pthread_mutex_lock(&sim_mu);
    sim_events--;
    pthread_mutex_unlock(&sim_mu);
    free(event);
    return cudaSuccess;
}

static int sim_coll_pending; /* a collective is still ncclInProgress */
int sim_record_early;

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    pthread_mutex_lock(&sim_mu);
    event->s = sim_stream(stream);
    event->target = event->s->issued;
    if (sim_coll_pending) {
        sim_record_early++;
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)stream;
    (void)flags;
    pthread_mutex_lock(&sim_mu);
    if (event->s == &sim_legacy) {
        sim_legacy_waits++;
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    cudaError_t ce = cudaSuccess;
    pthread_mutex_lock(&sim_mu);
    if (sim_event_error != cudaSuccess) {
        ce = sim_event_error;
    } else if (event->s != NULL && event->s->done < event->target) {
        ce = cudaErrorNotReady;
    }
    pthread_mutex_unlock(&sim_mu);
    return ce;
}

// ----------------------------------------------------------------------------
// NCCL

struct ncclComm {
    int nranks;
    int rank;
    int polls; /* GetAsyncError answers ncclInProgress this many more times; -1: forever */
    int coll;  /* the pending state belongs to a collective */
};

int sim_init_polls, sim_coll_polls, sim_final_polls;
ncclResult_t sim_async;
static int sim_comms;
int sim_aborts, sim_destroys, sim_blocking = -7, sim_calls;
ncclUniqueId sim_uid_seen[4];
struct sim_call sim_last;

static size_t sim_tsize(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 4;
    }
}

const char *ncclGetErrorString(ncclResult_t result)
{
    return result == ncclRemoteError ? "remote process exited or there was a network error"
                                     : "simulated NCCL error";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "simulated last error";
}

ncclResult_t ncclGetVersion(int *version)
{
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    static int next = 1;
    pthread_mutex_lock(&sim_mu);
    memset(uniqueId, 0, sizeof(*uniqueId));
    snprintf(uniqueId->internal, sizeof(uniqueId->internal), "sim-uid-%d", next++);
    pthread_mutex_unlock(&sim_mu);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return ncclSystemError;
    }
    c->nranks = nranks;
    c->rank = rank;
    pthread_mutex_lock(&sim_mu);
    c->polls = sim_init_polls;
    sim_blocking = config->blocking;
    if (rank >= 0 && rank < 4) {
        sim_uid_seen[rank] = commId;
    }
    sim_comms++;
    pthread_mutex_unlock(&sim_mu);
    *comm = c;
    return c->polls ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    pthread_mutex_lock(&sim_mu);
    if (comm->polls != 0) {
        if (comm->polls > 0) {
            comm->polls--;
        }
        *asyncError = ncclInProgress;
    } else {
        if (comm->coll) {
            comm->coll = 0;
            sim_coll_pending = 0;
        }
        *asyncError = sim_async;
    }
    pthread_mutex_unlock(&sim_mu);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    pthread_mutex_lock(&sim_mu);
    if (comm != NULL) {
        sim_aborts++;
        sim_comms--;
        sim_coll_pending = 0;
    }
    pthread_mutex_unlock(&sim_mu);
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    pthread_mutex_lock(&sim_mu);
    comm->polls = sim_final_polls;
    pthread_mutex_unlock(&sim_mu);
    return comm->polls ? ncclInProgress : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    pthread_mutex_lock(&sim_mu);
    sim_destroys++;
    sim_comms--;
    pthread_mutex_unlock(&sim_mu);
    free(comm);
    return ncclSuccess;
}

static ncclResult_t sim_coll(enum sim_func f, const void *send, void *recv, size_t count,
                             ncclDataType_t t, ncclRedOp_t op, int root, ncclComm_t comm,
                             cudaStream_t stream)
{
    ncclResult_t r = ncclSuccess;
    size_t bytes = count * sim_tsize(t);
    if (f == SIM_REDUCE_SCATTER) {
        send = (const char *)send + (size_t)comm->rank * bytes;
    }
    if (send != recv && recv != NULL && send != NULL) {
        memmove(recv, send, bytes); /* one rank: every collective is a copy */
    }
    pthread_mutex_lock(&sim_mu);
    sim_last.func = f;
    sim_last.send = send;
    sim_last.recv = recv;
    sim_last.count = count;
    sim_last.t = t;
    sim_last.op = op;
    sim_last.root = root;
    sim_last.s = sim_stream(stream);
    sim_calls++;
    sim_issue_locked(sim_stream(stream));
    if (sim_coll_polls != 0) {
        comm->polls = sim_coll_polls;
        comm->coll = 1;
        sim_coll_pending = 1;
        r = ncclInProgress;
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return sim_coll(SIM_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return sim_coll(SIM_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm,
                    stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return sim_coll(SIM_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm,
                    stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return sim_coll(SIM_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm,
                    stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff; (void)count; (void)datatype; (void)peer; (void)comm; (void)stream;
    return ncclInvalidUsage; /* a one-rank simulation has no peer */
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    (void)recvbuff; (void)count; (void)datatype; (void)peer; (void)comm; (void)stream;
    return ncclInvalidUsage;
}

void sim_reset(void)
{
    pthread_mutex_lock(&sim_mu);
    sim_ndev = 1;
    sim_init_polls = sim_coll_polls = sim_final_polls = 0;
    sim_async = ncclSuccess;
    sim_event_error = cudaSuccess;
    sim_coll_pending = sim_record_early = 0;
    sim_legacy.held = 0;
    sim_legacy.done = sim_legacy.issued;
    pthread_mutex_unlock(&sim_mu);
    sim_dev = 0;
    fsdp_err_clear();
}

int sim_live(void)
{
    return sim_streams + sim_events + sim_mallocs + sim_comms;
}

