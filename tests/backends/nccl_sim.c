/*
 * nccl_sim.c - a simulation of the CUDA runtime and NCCL calls the nccl
 * backend makes, for test_nccl_sim (nccl_sim.h says what it models and
 * which knobs it has). Nothing here touches a GPU.
 *
 * One mutex guards the whole simulation; every call that can move work
 * forward runs sim_progress_locked, which retires the items at the heads
 * of the streams until nothing moves. Calls that block (ncclCommAbort,
 * cudaFree) wait on one condition variable that every progress signals.
 */
#include "config.h"
#include "core/error.h"
#include "tests/backends/nccl_sim.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SIM_ALLOCS 128
#define SIM_GROUP_OPS 32
#define SIM_RANKS 8

static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sim_cv = PTHREAD_COND_INITIALIZER;

// ----------------------------------------------------------------------------
// knobs and counters

int sim_ndev = 1;
_Thread_local int sim_dev;
int sim_init_polls, sim_coll_polls, sim_final_polls;
ncclResult_t sim_async;
cudaError_t sim_event_error;
cudaError_t sim_sticky;
int sim_pools = 1;
int sim_ghost_peers;
static int sim_launch_gate;
double sim_block_limit = 3.0;

struct sim_call sim_last;
int sim_calls, sim_group_launches, sim_aborts, sim_aborts_done, sim_destroys;
int sim_blocking = -7;
int sim_events_made, sim_legacy_waits, sim_record_early, sim_hangs, sim_misuse;
int sim_ctx[SIM_MAXDEV];
int sim_set_devices;
const char *sim_comm_name;
ncclUniqueId sim_uid_seen[4];

static int sim_streams, sim_events, sim_mallocs, sim_comms; /* live objects */
static int sim_threads;                                      /* launch threads running */

// ----------------------------------------------------------------------------
// objects

enum sim_item_kind { SIM_ITEM_PLAIN, SIM_ITEM_WAIT, SIM_ITEM_GROUP };

struct sim_group;

struct sim_item {
    struct sim_item *next;
    enum sim_item_kind kind;
    struct CUstream_st *wait_s; /* SIM_ITEM_WAIT: run once wait_s has done wait_n items */
    uint64_t wait_n;
    struct sim_group *g;        /* SIM_ITEM_GROUP */
};

struct CUstream_st {
    int dev;
    int held;
    int live;                   /* not destroyed by the user */
    uint64_t issued, done;      /* items queued, items run */
    struct sim_item *head, *tail;
    struct CUstream_st *all_next;
};

struct CUevent_st {
    int dev;
    struct CUstream_st *s; /* NULL until recorded */
    uint64_t target;
};

struct sim_op {
    enum sim_func f;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t t;
    ncclRedOp_t op;
    int peer;                  /* root or peer */
    cudaStream_t handle;       /* as passed */
    struct CUstream_st *s;     /* resolved when queued */
    uint64_t seq;              /* collective number, or send/recv number per peer */
    int matched;
};

struct sim_group {
    struct ncclComm *comm;
    int nops;
    struct sim_op ops[SIM_GROUP_OPS];
    int queued;                /* items are on the streams */
    int nitems;
    int done;
    struct sim_group *all_next;
};

struct ncclComm {
    int nranks;
    int rank;
    int dev;
    ncclUniqueId uid;
    int blocking;
    int set_up;                /* every member has joined (init is over) */
    int polls;                 /* GetAsyncError answers ncclInProgress this many more times */
    int launching;             /* launches handed to a launch thread, not yet queued */
    int finalizing;
    int aborting;
    int dead;                  /* aborted or destroyed */
    ncclResult_t err;          /* a launch that failed inside NCCL */
    struct CUstream_st *pending_s; /* the stream of the launch in progress */
    uint64_t coll_seq;
    uint64_t send_seq[SIM_RANKS], recv_seq[SIM_RANKS];
    struct ncclComm *all_next;
};

static struct CUstream_st sim_legacy[SIM_MAXDEV];
static struct CUstream_st *sim_all_streams;
static struct sim_group *sim_all_groups;
static struct ncclComm *sim_all_comms;
static _Thread_local struct CUstream_st *sim_ptds; /* this thread's per-thread stream */
static _Thread_local int sim_group_depth;
static _Thread_local struct sim_group *sim_group_open;

static struct {
    char *p;
    size_t n;
    int dev;
} sim_alloc[SIM_ALLOCS];

static int sim_registered; /* the legacy streams are in sim_all_streams */

static void sim_register_locked(struct CUstream_st *s)
{
    s->all_next = sim_all_streams;
    sim_all_streams = s;
}

static void sim_init_locked(void)
{
    if (!sim_registered) {
        for (int d = 0; d < SIM_MAXDEV; d++) {
            sim_legacy[d].dev = d;
            sim_legacy[d].live = 1;
            sim_register_locked(&sim_legacy[d]);
        }
        sim_registered = 1;
    }
}

/* The stream a handle names in the calling thread, on device dev. */
static struct CUstream_st *sim_resolve_locked(cudaStream_t h, int dev)
{
    sim_init_locked();
    if (h == NULL || h == cudaStreamLegacy) {
        return &sim_legacy[dev];
    }
    if (h == cudaStreamPerThread) {
        if (sim_ptds == NULL) {
            sim_ptds = calloc(1, sizeof(*sim_ptds));
            sim_ptds->dev = sim_dev;
            sim_ptds->live = 1;
            sim_register_locked(sim_ptds);
        }
        return sim_ptds;
    }
    return h;
}

static void sim_enqueue_locked(struct CUstream_st *s, struct sim_item *it)
{
    it->next = NULL;
    if (s->tail) {
        s->tail->next = it;
    } else {
        s->head = it;
    }
    s->tail = it;
    s->issued++;
}

static void sim_plain_locked(struct CUstream_st *s)
{
    struct sim_item *it = calloc(1, sizeof(*it));
    it->kind = SIM_ITEM_PLAIN;
    sim_enqueue_locked(s, it);
}

/* A call that needs a context on the thread's current device. */
static void sim_touch(void)
{
    if (sim_dev >= 0 && sim_dev < SIM_MAXDEV) {
        sim_ctx[sim_dev] = 1;
    }
}

static void sim_deadline(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += (time_t)s;
    ts->tv_nsec += (long)((s - (double)(time_t)s) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

// ----------------------------------------------------------------------------
// progress: retire items, match collectives and send/recv

static size_t sim_tsize(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 4;
    }
}

static int sim_arith(ncclDataType_t t)
{
    return t == ncclFloat32 || t == ncclFloat64 || t == ncclInt32 || t == ncclInt64 ||
           t == ncclUint8;
}

static double sim_get(const void *p, ncclDataType_t t, size_t i)
{
    switch (t) {
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static void sim_set(void *p, ncclDataType_t t, size_t i, double v)
{
    switch (t) {
    case ncclFloat32: ((float *)p)[i] = (float)v; break;
    case ncclFloat64: ((double *)p)[i] = v; break;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; break;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

static double sim_combine(ncclRedOp_t op, double a, double b)
{
    switch (op) {
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
    case ncclProd: return a * b;
    default: return a + b;
    }
}

/* Whether every item of g is at the head of a stream that runs. */
static int sim_at_head(const struct sim_group *g)
{
    int found = 0;
    if (!g->queued || g->done) {
        return 0;
    }
    for (struct CUstream_st *s = sim_all_streams; s != NULL; s = s->all_next) {
        if (s->head != NULL && s->head->kind == SIM_ITEM_GROUP && s->head->g == g) {
            if (s->held) {
                return 0;
            }
            found++;
        }
    }
    return found == g->nitems;
}

static struct ncclComm *sim_member(const struct ncclComm *c, int rank)
{
    for (struct ncclComm *m = sim_all_comms; m != NULL; m = m->all_next) {
        if (!m->dead && m->nranks == c->nranks && m->rank == rank &&
            memcmp(&m->uid, &c->uid, sizeof(c->uid)) == 0) {
            return m;
        }
    }
    return NULL;
}

/* The unmatched op of comm m with function f and number seq (and, for
 * send/recv, peer), in a group at the head of its streams. */
static struct sim_op *sim_find(struct ncclComm *m, enum sim_func f, uint64_t seq, int peer)
{
    for (struct sim_group *g = sim_all_groups; g != NULL; g = g->all_next) {
        if (g->comm != m || g->done || !sim_at_head(g)) {
            continue;
        }
        for (int i = 0; i < g->nops; i++) {
            struct sim_op *o = &g->ops[i];
            if (!o->matched && o->f == f && o->seq == seq && (peer < 0 || o->peer == peer)) {
                return o;
            }
        }
    }
    return NULL;
}

/* A collective of n ranks whose ops are all at the head: its data moves.
 * Every rank's inputs are read before any output is written (in place). */
static void sim_collective_effect(struct sim_op **ops, int n)
{
    struct sim_op *o0 = ops[0];
    size_t cnt = o0->count, es = sim_tsize(o0->t);
    double *acc = NULL;

    if ((o0->f == SIM_ALLREDUCE || o0->f == SIM_REDUCE_SCATTER) && sim_arith(o0->t)) {
        acc = calloc((size_t)n * cnt + 1, sizeof(double));
        for (int r = 0; r < n; r++) {
            size_t off = o0->f == SIM_REDUCE_SCATTER ? (size_t)r * cnt : 0;
            for (size_t i = 0; i < cnt; i++) {
                double a = sim_get(ops[0]->send, o0->t, off + i);
                for (int q = 1; q < n; q++) {
                    a = sim_combine(o0->op, a, sim_get(ops[q]->send, o0->t, off + i));
                }
                acc[(size_t)r * cnt + i] = o0->op == ncclAvg ? a / n : a;
            }
        }
    }
    for (int r = 0; r < n; r++) {
        struct sim_op *o = ops[r];
        size_t off = o->f == SIM_REDUCE_SCATTER ? (size_t)r * cnt : 0;
        if (acc != NULL) {
            for (size_t i = 0; i < cnt; i++) {
                sim_set(o->recv, o->t, i, acc[(size_t)r * cnt + i]);
            }
        } else if (o->f == SIM_ALLREDUCE || o->f == SIM_REDUCE_SCATTER) {
            if ((const char *)o->send + off * es != o->recv) {
                memmove(o->recv, (const char *)o->send + off * es, cnt * es);
            }
        } else if (o->f == SIM_ALLGATHER) {
            for (int q = 0; q < n; q++) {
                char *dst = (char *)o->recv + (size_t)q * cnt * es;
                if (dst != ops[q]->send) {
                    memmove(dst, ops[q]->send, cnt * es);
                }
            }
        } else if (o->f == SIM_BROADCAST && o->peer >= 0 && o->peer < n) {
            const struct sim_op *root = ops[o->peer];
            if (o->recv != root->send) {
                memmove(o->recv, root->send, cnt * es);
            }
        }
        o->matched = 1;
    }
    free(acc);
}

static int sim_match_collective(struct sim_group *g, struct sim_op *o)
{
    struct sim_op *ops[SIM_RANKS];
    struct ncclComm *c = g->comm;
    if (c->nranks == 1) {
        ops[0] = o;
        sim_collective_effect(ops, 1);
        return 1;
    }
    if (c->nranks > SIM_RANKS) {
        return 0;
    }
    for (int r = 0; r < c->nranks; r++) {
        struct ncclComm *m = r == c->rank ? c : sim_member(c, r);
        ops[r] = m ? (m == c ? o : sim_find(m, o->f, o->seq, -1)) : NULL;
        if (ops[r] == NULL) {
            return 0;
        }
    }
    sim_collective_effect(ops, c->nranks);
    return 1;
}

static int sim_match_p2p(struct sim_group *g, struct sim_op *o)
{
    struct ncclComm *c = g->comm, *m = sim_member(c, o->peer);
    struct sim_op *other;
    if (m == NULL) {
        return 0;
    }
    other = sim_find(m, o->f == SIM_SEND ? SIM_RECV : SIM_SEND, o->seq, c->rank);
    if (other == NULL) {
        return 0;
    }
    if (o->f == SIM_SEND) {
        memmove(other->recv, o->send, o->count * sim_tsize(o->t));
    } else {
        memmove(o->recv, other->send, o->count * sim_tsize(o->t));
    }
    o->matched = other->matched = 1;
    return 1;
}

/* Matches what can be matched in g; 1 when g is complete. */
static int sim_try_group(struct sim_group *g)
{
    int all = 1;
    if (g->comm->aborting) {
        return 1; /* killed: its kernels see the abort flag and exit */
    }
    for (int i = 0; i < g->nops; i++) {
        struct sim_op *o = &g->ops[i];
        if (o->matched) {
            continue;
        }
        if (o->f == SIM_SEND || o->f == SIM_RECV ? sim_match_p2p(g, o)
                                                 : sim_match_collective(g, o)) {
            continue;
        }
        all = 0;
    }
    return all;
}

static void sim_progress_locked(void)
{
    int changed;
    sim_init_locked();
    do {
        changed = 0;
        for (struct CUstream_st *s = sim_all_streams; s != NULL; s = s->all_next) {
            while (s->head != NULL && !s->held) {
                struct sim_item *it = s->head;
                int run = it->kind == SIM_ITEM_PLAIN ||
                          (it->kind == SIM_ITEM_WAIT && it->wait_s->done >= it->wait_n) ||
                          (it->kind == SIM_ITEM_GROUP && it->g->done);
                if (!run) {
                    break;
                }
                s->head = it->next;
                if (s->head == NULL) {
                    s->tail = NULL;
                }
                s->done++;
                free(it);
                changed = 1;
            }
        }
        for (struct sim_group *g = sim_all_groups; g != NULL; g = g->all_next) {
            if (!g->done && sim_at_head(g) && sim_try_group(g)) {
                g->done = 1;
                changed = 1;
            }
        }
    } while (changed);
    pthread_cond_broadcast(&sim_cv);
}

static int sim_comm_busy(const struct ncclComm *c)
{
    if (c->launching > 0) {
        return 1;
    }
    for (struct sim_group *g = sim_all_groups; g != NULL; g = g->all_next) {
        if (g->comm == c && !g->done && g->queued) {
            return 1;
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// CUDA runtime: devices, errors, memory

void sim_hold(cudaStream_t s, int held)
{
    pthread_mutex_lock(&sim_mu);
    struct CUstream_st *st = sim_resolve_locked(s, sim_dev);
    st->held = held;
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
}

int sim_pending(cudaStream_t s)
{
    int n;
    pthread_mutex_lock(&sim_mu);
    struct CUstream_st *st = sim_resolve_locked(s, sim_dev);
    sim_progress_locked();
    n = (int)(st->issued - st->done);
    pthread_mutex_unlock(&sim_mu);
    return n;
}

cudaStream_t sim_legacy_stream(int dev)
{
    pthread_mutex_lock(&sim_mu);
    sim_init_locked();
    pthread_mutex_unlock(&sim_mu);
    return &sim_legacy[dev];
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
    pthread_mutex_lock(&sim_mu);
    sim_set_devices++;
    pthread_mutex_unlock(&sim_mu);
    sim_touch(); /* since CUDA 12, cudaSetDevice makes the primary context */
    return sim_sticky;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    if (device < 0 || device >= sim_ndev) {
        return cudaErrorInvalidDevice;
    }
    *value = attr == cudaDevAttrMemoryPoolsSupported ? sim_pools : 0;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorInvalidValue: return "invalid argument";
    default: return "simulated CUDA error";
    }
}

cudaError_t cudaGetLastError(void)
{
    return sim_sticky; /* a sticky error never clears */
}

static cudaError_t sim_alloc_locked(void **devPtr, size_t size)
{
    for (int i = 0; i < SIM_ALLOCS; i++) {
        if (sim_alloc[i].p == NULL) {
            sim_alloc[i].p = calloc(1, size ? size : 1);
            sim_alloc[i].n = size;
            sim_alloc[i].dev = sim_dev;
            sim_mallocs++;
            *devPtr = sim_alloc[i].p;
            return cudaSuccess;
        }
    }
    return cudaErrorMemoryAllocation;
}

static int sim_release_locked(void *devPtr)
{
    for (int i = 0; i < SIM_ALLOCS; i++) {
        if (devPtr != NULL && sim_alloc[i].p == devPtr) {
            int dev = sim_alloc[i].dev;
            free(sim_alloc[i].p);
            sim_alloc[i].p = NULL;
            sim_mallocs--;
            return dev;
        }
    }
    return -1;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    cudaError_t ce;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    pthread_mutex_lock(&sim_mu);
    ce = sim_alloc_locked(devPtr, size);
    pthread_mutex_unlock(&sim_mu);
    return ce;
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    cudaError_t ce;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    if (!sim_pools) {
        return cudaErrorNotSupported;
    }
    pthread_mutex_lock(&sim_mu);
    ce = sim_alloc_locked(devPtr, size);
    if (ce == cudaSuccess) {
        sim_plain_locked(sim_resolve_locked(hStream, sim_dev));
        sim_progress_locked();
    }
    pthread_mutex_unlock(&sim_mu);
    return ce;
}

/* Synchronises the device: waits until every stream of it is empty. */
cudaError_t cudaFree(void *devPtr)
{
    struct timespec until;
    int dev = sim_dev, busy = 1;

    sim_touch();
    if (devPtr == NULL) {
        return cudaSuccess;
    }
    sim_deadline(&until, sim_block_limit);
    pthread_mutex_lock(&sim_mu);
    for (int i = 0; i < SIM_ALLOCS; i++) {
        if (sim_alloc[i].p == devPtr) {
            dev = sim_alloc[i].dev;
        }
    }
    while (busy) {
        sim_progress_locked();
        busy = 0;
        for (struct CUstream_st *s = sim_all_streams; s != NULL; s = s->all_next) {
            busy |= s->dev == dev && s->head != NULL;
        }
        if (busy && pthread_cond_timedwait(&sim_cv, &sim_mu, &until) == ETIMEDOUT) {
            sim_hangs++;
            break;
        }
    }
    sim_release_locked(devPtr);
    pthread_mutex_unlock(&sim_mu);
    return sim_sticky;
}

/* Synchronous copies: ordered after the legacy stream only, which the
 * callers here keep empty. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    (void)kind;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    struct timespec until;
    int busy = 1;
    sim_touch();
    sim_deadline(&until, sim_block_limit);
    pthread_mutex_lock(&sim_mu);
    while (busy) {
        sim_progress_locked();
        busy = 0;
        for (struct CUstream_st *s = sim_all_streams; s != NULL; s = s->all_next) {
            busy |= s->dev == sim_dev && s->head != NULL;
        }
        if (busy && pthread_cond_timedwait(&sim_cv, &sim_mu, &until) == ETIMEDOUT) {
            sim_hangs++;
            break;
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return sim_sticky;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    sim_touch();
    pthread_mutex_lock(&sim_mu);
    sim_plain_locked(sim_resolve_locked(hStream, sim_dev));
    sim_release_locked(devPtr); /* gone for the leak count; reused only after the stream */
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return sim_sticky;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    const char *p = ptr;
    sim_touch();
    memset(attributes, 0, sizeof(*attributes));
    if (sim_sticky) {
        return sim_sticky;
    }
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
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    memset(devPtr, value, count);
    pthread_mutex_lock(&sim_mu);
    sim_plain_locked(sim_resolve_locked(stream, sim_dev));
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// CUDA runtime: streams and events

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    struct CUstream_st *s;
    (void)flags;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return cudaErrorMemoryAllocation;
    }
    s->dev = sim_dev;
    s->live = 1;
    pthread_mutex_lock(&sim_mu);
    sim_init_locked();
    sim_register_locked(s);
    sim_streams++;
    pthread_mutex_unlock(&sim_mu);
    *pStream = s;
    return cudaSuccess;
}

/* Does not wait: the stream goes once its work is done (here: never freed,
 * so that waits queued elsewhere can still read its position). */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    sim_touch();
    pthread_mutex_lock(&sim_mu);
    if (stream->live) {
        stream->live = 0;
        sim_streams--;
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    pthread_mutex_lock(&sim_mu);
    *device = sim_resolve_locked(hStream, sim_dev)->dev;
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    *event = calloc(1, sizeof(struct CUevent_st));
    if (*event == NULL) {
        return cudaErrorMemoryAllocation;
    }
    (*event)->dev = sim_dev;
    pthread_mutex_lock(&sim_mu);
    sim_events++;
    sim_events_made++;
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    sim_touch();
    pthread_mutex_lock(&sim_mu);
    sim_events--;
    pthread_mutex_unlock(&sim_mu);
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    struct CUstream_st *s;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    pthread_mutex_lock(&sim_mu);
    s = sim_resolve_locked(stream, sim_dev);
    if (s->dev != event->dev) {
        pthread_mutex_unlock(&sim_mu);
        return cudaErrorInvalidResourceHandle;
    }
    for (struct ncclComm *c = sim_all_comms; c != NULL; c = c->all_next) {
        if (!c->dead && c->pending_s == s && (c->launching > 0 || c->polls != 0)) {
            sim_record_early++;
        }
    }
    sim_plain_locked(s);
    event->s = s;
    event->target = s->issued;
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    struct sim_item *it;
    (void)flags;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    pthread_mutex_lock(&sim_mu);
    if (event->s != NULL) {
        if (event->s == &sim_legacy[event->s->dev]) {
            sim_legacy_waits++;
        }
        it = calloc(1, sizeof(*it));
        it->kind = SIM_ITEM_WAIT;
        it->wait_s = event->s;
        it->wait_n = event->target;
        sim_enqueue_locked(sim_resolve_locked(stream, sim_dev), it);
        sim_progress_locked();
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    cudaError_t ce = cudaSuccess;
    sim_touch();
    if (sim_sticky) {
        return sim_sticky;
    }
    pthread_mutex_lock(&sim_mu);
    sim_progress_locked();
    if (sim_event_error != cudaSuccess) {
        ce = sim_event_error;
    } else if (event->s != NULL && event->s->done < event->target) {
        ce = cudaErrorNotReady;
    }
    pthread_mutex_unlock(&sim_mu);
    return ce;
}

// ----------------------------------------------------------------------------
// NCCL: communicators

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "simulated NCCL error";
    }
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

static int sim_env_blocking(void)
{
    const char *s = getenv("NCCL_COMM_BLOCKING");
    char *end = NULL;
    long long v;
    if (s == NULL || *s == '\0') {
        return -1;
    }
    v = strtoll(s, &end, 0);
    return (*end == '\0' && (v == 0 || v == 1)) ? (int)v : -1;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    int env = sim_env_blocking();
    if (c == NULL) {
        return ncclSystemError;
    }
    c->nranks = nranks;
    c->rank = rank;
    c->dev = sim_dev;
    c->uid = commId;
    c->blocking = env >= 0 ? env : config->blocking != 0;
    sim_touch();
    pthread_mutex_lock(&sim_mu);
    c->polls = sim_init_polls;
    sim_blocking = c->blocking;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
    sim_comm_name = config->commName;
#endif
    if (rank >= 0 && rank < 4) {
        sim_uid_seen[rank] = commId;
    }
    c->all_next = sim_all_comms;
    sim_all_comms = c;
    sim_comms++;
    pthread_mutex_unlock(&sim_mu);
    *comm = c;
    return (c->polls || nranks > 1) ? ncclInProgress : ncclSuccess;
}

/* A clique is set up once every member has called init (or its peers are
 * ghosts). */
static int sim_clique_ready(struct ncclComm *c)
{
    if (c->set_up || c->nranks == 1 || sim_ghost_peers) {
        c->set_up = 1;
        return 1;
    }
    for (int r = 0; r < c->nranks; r++) {
        if (r != c->rank && sim_member(c, r) == NULL) {
            return 0;
        }
    }
    c->set_up = 1;
    return 1;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    pthread_mutex_lock(&sim_mu);
    sim_progress_locked();
    if (comm->dead) {
        sim_misuse++;
        *asyncError = ncclInvalidUsage;
    } else if (comm->polls != 0) {
        if (comm->polls > 0) {
            comm->polls--;
        }
        *asyncError = ncclInProgress;
    } else if (comm->launching > 0 || !sim_clique_ready(comm) ||
               (comm->finalizing && sim_comm_busy(comm))) {
        *asyncError = ncclInProgress;
    } else {
        comm->pending_s = NULL;
        *asyncError = comm->err != ncclSuccess ? comm->err : sim_async;
    }
    pthread_mutex_unlock(&sim_mu);
    return ncclSuccess;
}

/* Kills the communicator's work as it reaches the head of its streams and
 * waits until all of it has: work queued behind another communicator's
 * stuck item holds it up. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    struct timespec until;
    if (comm == NULL) {
        return ncclSuccess;
    }
    sim_deadline(&until, sim_block_limit);
    pthread_mutex_lock(&sim_mu);
    sim_aborts++;
    if (comm->dead) {
        sim_misuse++;
        pthread_mutex_unlock(&sim_mu);
        return ncclInvalidUsage;
    }
    comm->aborting = 1;
    sim_progress_locked();
    while (sim_comm_busy(comm)) {
        if (pthread_cond_timedwait(&sim_cv, &sim_mu, &until) == ETIMEDOUT) {
            sim_hangs++;
            for (struct sim_group *g = sim_all_groups; g != NULL; g = g->all_next) {
                if (g->comm == comm) {
                    g->done = 1; /* give up: let the streams flow for the next checks */
                }
            }
            break;
        }
        sim_progress_locked();
    }
    comm->dead = 1;
    sim_comms--;
    sim_aborts_done++;
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r;
    pthread_mutex_lock(&sim_mu);
    if (comm->dead || comm->launching > 0) {
        sim_misuse++;
    }
    comm->finalizing = 1;
    comm->polls = sim_final_polls;
    r = (comm->polls || sim_comm_busy(comm)) ? ncclInProgress : ncclSuccess;
    pthread_mutex_unlock(&sim_mu);
    return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    pthread_mutex_lock(&sim_mu);
    if (comm->dead || sim_comm_busy(comm)) {
        sim_misuse++;
    }
    if (!comm->dead) {
        comm->dead = 1;
        sim_comms--;
    }
    sim_destroys++;
    pthread_mutex_unlock(&sim_mu);
    return ncclSuccess;
}

// ----------------------------------------------------------------------------
// NCCL: launches

/* Puts g's items on the streams, naming stream handles in the calling
 * thread. A stream of another device fails the launch inside NCCL. */
static ncclResult_t sim_queue_locked(struct sim_group *g)
{
    struct CUstream_st *seen[SIM_GROUP_OPS];
    int n = 0;
    for (int i = 0; i < g->nops; i++) {
        g->ops[i].s = sim_resolve_locked(g->ops[i].handle, g->comm->dev);
        if (g->ops[i].s->dev != g->comm->dev) {
            g->done = 1;
            return ncclInvalidArgument;
        }
    }
    for (int i = 0; i < g->nops; i++) {
        int dup = 0;
        for (int k = 0; k < n; k++) {
            dup |= seen[k] == g->ops[i].s;
        }
        if (!dup) {
            struct sim_item *it = calloc(1, sizeof(*it));
            it->kind = SIM_ITEM_GROUP;
            it->g = g;
            sim_enqueue_locked(g->ops[i].s, it);
            seen[n++] = g->ops[i].s;
        }
    }
    g->nitems = n;
    g->queued = 1;
    g->all_next = sim_all_groups;
    sim_all_groups = g;
    sim_progress_locked();
    return ncclSuccess;
}

/* NCCL's launch thread of a non-blocking multi-rank communicator. */
static void *sim_launcher(void *arg)
{
    struct sim_group *g = arg;
    struct ncclComm *c = g->comm;
    ncclResult_t r = ncclSuccess;

    sim_dev = c->dev;
    pthread_mutex_lock(&sim_mu);
    while (sim_launch_gate && !c->aborting) {
        pthread_cond_wait(&sim_cv, &sim_mu);
    }
    if (!c->aborting) {
        r = sim_queue_locked(g);
        if (r != ncclSuccess) {
            c->err = r;
            free(g);
        }
    } else {
        free(g);
    }
    c->launching--;
    sim_threads--;
    pthread_cond_broadcast(&sim_cv);
    pthread_mutex_unlock(&sim_mu);
    return NULL;
}

static ncclResult_t sim_launch_locked(struct sim_group *g)
{
    struct ncclComm *c = g->comm;
    ncclResult_t r;
    pthread_t tid;

    if (c->dead || c->launching > 0 || c->polls != 0) {
        sim_misuse++; /* NCCL allows no call until the last one left ncclInProgress */
    }
    for (int i = 0; i < g->nops; i++) {
        struct sim_op *o = &g->ops[i];
        if (o->f == SIM_SEND) {
            o->seq = o->peer < SIM_RANKS ? c->send_seq[o->peer]++ : 0;
        } else if (o->f == SIM_RECV) {
            o->seq = o->peer < SIM_RANKS ? c->recv_seq[o->peer]++ : 0;
        } else {
            o->seq = c->coll_seq++;
        }
        sim_calls++;
        sim_last = (struct sim_call){o->f, o->send, o->recv, o->count, o->t, o->op, o->peer,
                                     o->handle};
    }
    c->pending_s = g->nops > 0 ? sim_resolve_locked(g->ops[0].handle, c->dev) : NULL;
    if (c->nranks > 1 && !c->blocking) {
        c->launching++;
        sim_threads++;
        if (pthread_create(&tid, NULL, sim_launcher, g) != 0) {
            c->launching--;
            sim_threads--;
            free(g);
            return ncclSystemError;
        }
        pthread_detach(tid);
        return ncclInProgress;
    }
    r = sim_queue_locked(g);
    if (r != ncclSuccess) {
        c->err = r;
        free(g);
        return c->blocking ? r : ncclInProgress;
    }
    if (sim_coll_polls != 0) {
        c->polls = sim_coll_polls;
        return ncclInProgress;
    }
    return ncclSuccess;
}

static ncclResult_t sim_call(ncclComm_t comm, struct sim_op op)
{
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&sim_mu);
    if (sim_group_depth > 0) {
        if (sim_group_open == NULL) {
            sim_group_open = calloc(1, sizeof(*sim_group_open));
            sim_group_open->comm = comm;
        }
        if (sim_group_open->comm != comm || sim_group_open->nops == SIM_GROUP_OPS) {
            r = ncclInvalidUsage; /* the simulation groups the calls of one communicator */
        } else {
            sim_group_open->ops[sim_group_open->nops++] = op;
        }
    } else {
        struct sim_group *g = calloc(1, sizeof(*g));
        g->comm = comm;
        g->nops = 1;
        g->ops[0] = op;
        r = sim_launch_locked(g);
    }
    pthread_mutex_unlock(&sim_mu);
    return r;
}

/* nccl.h declares these without a prototype */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

ncclResult_t ncclGroupStart(void)
{
    sim_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    ncclResult_t r = ncclSuccess;
    if (sim_group_depth == 0) {
        return ncclInvalidUsage;
    }
    if (--sim_group_depth == 0 && sim_group_open != NULL) {
        struct sim_group *g = sim_group_open;
        sim_group_open = NULL;
        pthread_mutex_lock(&sim_mu);
        sim_group_launches++;
        r = sim_launch_locked(g);
        pthread_mutex_unlock(&sim_mu);
    }
    return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return sim_call(comm, (struct sim_op){SIM_ALLREDUCE, sendbuff, recvbuff, count, datatype, op,
                                          0, stream, NULL, 0, 0});
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return sim_call(comm, (struct sim_op){SIM_ALLGATHER, sendbuff, recvbuff, sendcount, datatype,
                                          ncclSum, 0, stream, NULL, 0, 0});
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    return sim_call(comm, (struct sim_op){SIM_REDUCE_SCATTER, sendbuff, recvbuff, recvcount,
                                          datatype, op, 0, stream, NULL, 0, 0});
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return sim_call(comm, (struct sim_op){SIM_BROADCAST, sendbuff, recvbuff, count, datatype,
                                          ncclSum, root, stream, NULL, 0, 0});
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank) {
        return ncclInvalidArgument;
    }
    return sim_call(comm, (struct sim_op){SIM_SEND, sendbuff, NULL, count, datatype, ncclSum, peer,
                                          stream, NULL, 0, 0});
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    if (peer < 0 || peer >= comm->nranks || peer == comm->rank) {
        return ncclInvalidArgument;
    }
    return sim_call(comm, (struct sim_op){SIM_RECV, NULL, recvbuff, count, datatype, ncclSum, peer,
                                          stream, NULL, 0, 0});
}

// ----------------------------------------------------------------------------
// test helpers

void sim_set_gate(int closed)
{
    pthread_mutex_lock(&sim_mu);
    sim_launch_gate = closed;
    pthread_cond_broadcast(&sim_cv);
    pthread_mutex_unlock(&sim_mu);
}

int sim_wait_aborts_done(int n, double limit_s)
{
    struct timespec until;
    int ok;
    sim_deadline(&until, limit_s);
    pthread_mutex_lock(&sim_mu);
    while (sim_aborts_done < n) {
        if (pthread_cond_timedwait(&sim_cv, &sim_mu, &until) == ETIMEDOUT) {
            break;
        }
    }
    ok = sim_aborts_done >= n;
    pthread_mutex_unlock(&sim_mu);
    return ok;
}

void sim_reset(void)
{
    struct timespec until;
    sim_deadline(&until, 10.0);
    pthread_mutex_lock(&sim_mu);
    sim_launch_gate = 0;
    pthread_cond_broadcast(&sim_cv);
    while (sim_threads > 0 &&
           pthread_cond_timedwait(&sim_cv, &sim_mu, &until) != ETIMEDOUT) {
    }
    sim_init_locked();
    /* forget stuck work: each check starts with empty streams */
    for (struct sim_group *g = sim_all_groups; g != NULL; g = g->all_next) {
        g->done = 1;
    }
    for (struct CUstream_st *s = sim_all_streams; s != NULL; s = s->all_next) {
        s->held = 0;
    }
    sim_progress_locked();
    for (struct ncclComm *c = sim_all_comms; c != NULL; c = c->all_next) {
        c->pending_s = NULL;
    }
    sim_ndev = 1;
    sim_init_polls = sim_coll_polls = sim_final_polls = 0;
    sim_async = ncclSuccess;
    sim_event_error = cudaSuccess;
    sim_sticky = cudaSuccess;
    sim_pools = 1;
    sim_ghost_peers = 0;
    sim_block_limit = 3.0;
    sim_record_early = sim_hangs = sim_misuse = sim_set_devices = 0;
    sim_comm_name = NULL;
    memset(sim_ctx, 0, sizeof(sim_ctx));
    pthread_mutex_unlock(&sim_mu);
    sim_dev = 0;
    fsdp_err_clear();
}

int sim_live(void)
{
    int n;
    pthread_mutex_lock(&sim_mu);
    n = sim_streams + sim_events + sim_mallocs + sim_comms;
    pthread_mutex_unlock(&sim_mu);
    return n;
}
