/*
 * cuda_sim.c - a simulation of the CUDA runtime calls the cuda device's
 * host side makes, for test_cuda_device (cuda_sim.h says what it models
 * and which knobs it has). Nothing here touches a GPU or libcudart.
 *
 * One mutex guards the simulation. Every call that can move work forward
 * runs sim_progress_locked, which retires the items at the heads of the
 * streams until nothing moves; a copy or fill does its memmove or memset
 * then, not when it is enqueued. Nothing runs on a thread of its own: a
 * wait that the progress cannot satisfy would block for ever, and is
 * counted instead.
 */
#include "config.h"
#include "tests/kernels/cuda_sim.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t sim_mu = PTHREAD_MUTEX_INITIALIZER;

// ----------------------------------------------------------------------------
// knobs and counters

int sim_ndev = 2;
_Thread_local int sim_dev;
size_t sim_capacity = (size_t)64 << 20;
char sim_name[256] = "NVIDIA H200";
int sim_cc = 90;
cudaError_t sim_sticky;
const char *sim_fail_call;
cudaError_t sim_fail_error;

size_t sim_used[SIM_MAXDEV];
int sim_mallocs, sim_device_syncs, sim_legacy_uses, sim_blocking_streams, sim_timed_events;
int sim_bad_calls, sim_hangs;
int sim_lazy_streams;

static cudaError_t sim_last; /* the last non-sticky error, for cudaGetLastError */
static int sim_streams, sim_events;

// ----------------------------------------------------------------------------
// objects

enum sim_kind { SIM_COPY, SIM_SET, SIM_MARK, SIM_WAIT, SIM_FN };

struct sim_item {
    struct sim_item *next;
    enum sim_kind kind;
    void *dst;
    const void *src;
    unsigned char *staged; /* SIM_COPY from pageable memory: the bytes as they were */
    size_t n;
    int value;
    struct CUstream_st *wait_s; /* SIM_WAIT: until wait_s has run wait_n items */
    uint64_t wait_n;
    void (*fn)(void *); /* SIM_FN: fn(dst) */
};

struct CUstream_st {
    int dev;
    int held;     /* sim_hold(s, 1): nothing runs */
    int slow;     /* SIM_SLOW: runs only while the host waits for it */
    int draining; /* the host waits for it now */
    uint64_t issued, done;
    struct sim_item *head, *tail;
    struct CUstream_st *all_next;
};

struct CUevent_st {
    int dev;
    struct CUstream_st *s; /* NULL until recorded */
    uint64_t target;
};

/* An allocation: device memory (dev >= 0) or pinned host memory (dev -1). */
struct sim_mem {
    unsigned char *raw; /* as calloc gave it */
    unsigned char *p;   /* 256-byte aligned, as the runtime's */
    size_t n;
    int dev;
    struct sim_mem *next;
};

static struct CUstream_st sim_legacy[SIM_MAXDEV];
static struct CUstream_st *sim_all_streams;
static struct sim_mem *sim_mems;
static int sim_registered;

static void sim_init_locked(void)
{
    if (!sim_registered) {
        for (int d = SIM_MAXDEV - 1; d >= 0; d--) {
            sim_legacy[d].dev = d;
            sim_legacy[d].all_next = sim_all_streams;
            sim_all_streams = &sim_legacy[d];
        }
        sim_registered = 1;
    }
}

static struct CUstream_st *sim_resolve_locked(cudaStream_t h)
{
    sim_init_locked();
    return h ? h : &sim_legacy[sim_dev];
}

/* The allocation that holds [p, p + n): device memory when device, else
 * pinned host memory; NULL when there is none. */
static struct sim_mem *sim_find_locked(const void *p, size_t n, int device)
{
    const unsigned char *c = p;
    for (struct sim_mem *m = sim_mems; m; m = m->next) {
        if ((device ? m->dev >= 0 : m->dev < 0) && c >= m->p && c < m->p + m->n) {
            return c + n <= m->p + m->n ? m : NULL;
        }
    }
    return NULL;
}

static void sim_enqueue_locked(struct CUstream_st *s, struct sim_item *it)
{
    if (s == &sim_legacy[s->dev]) {
        sim_legacy_uses++;
    }
    it->next = NULL;
    if (s->tail) {
        s->tail->next = it;
    } else {
        s->head = it;
    }
    s->tail = it;
    s->issued++;
}

static void sim_run(struct sim_item *it)
{
    if (it->kind == SIM_COPY) {
        memmove(it->dst, it->staged ? it->staged : it->src, it->n);
    } else if (it->kind == SIM_SET) {
        memset(it->dst, it->value, it->n);
    } else if (it->kind == SIM_FN) {
        it->fn(it->dst);
    }
    free(it->staged);
    free(it);
}

static void sim_progress_locked(void)
{
    int changed;
    sim_init_locked();
    do {
        changed = 0;
        for (struct CUstream_st *s = sim_all_streams; s; s = s->all_next) {
            while (s->head && !s->held && (!s->slow || s->draining)) {
                struct sim_item *it = s->head;
                if (it->kind == SIM_WAIT && it->wait_s->done < it->wait_n) {
                    break;
                }
                s->head = it->next;
                if (!s->head) {
                    s->tail = NULL;
                }
                s->done++;
                sim_run(it);
                changed = 1;
            }
        }
    } while (changed);
}

/* The host waits for s: what can run runs, a slow stream's (SIM_SLOW)
 * included, which stays slow for its later work; whether s has run its
 * first n items (counted as a hang when not: a real wait would never
 * return). */
static int sim_drain_locked(struct CUstream_st *s, uint64_t n)
{
    s->draining = 1;
    sim_progress_locked();
    s->draining = 0;
    if (s->done < n) {
        sim_hangs++;
        return 0;
    }
    return 1;
}

/* What every call answers first: the sticky error, or the one injected
 * for it by name. */
static cudaError_t sim_enter(const char *call)
{
    if (sim_sticky != cudaSuccess) {
        return sim_sticky;
    }
    if (sim_fail_call && strcmp(sim_fail_call, call) == 0) {
        sim_fail_call = NULL;
        sim_last = sim_fail_error;
        return sim_fail_error;
    }
    return cudaSuccess;
}

#define SIM_ENTER(call)                                                                            \
    do {                                                                                           \
        cudaError_t sim_ce_ = sim_enter(call);                                                     \
        if (sim_ce_ != cudaSuccess) {                                                              \
            return sim_ce_;                                                                        \
        }                                                                                          \
    } while (0)

// ----------------------------------------------------------------------------
// devices and errors

cudaError_t cudaGetDeviceCount(int *count)
{
    SIM_ENTER("cudaGetDeviceCount");
    *count = sim_ndev;
    return sim_ndev > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    SIM_ENTER("cudaGetDeviceProperties");
    if (device < 0 || device >= sim_ndev) {
        return cudaErrorInvalidDevice;
    }
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "%s", sim_name);
    prop->major = sim_cc / 10;
    prop->minor = sim_cc % 10;
    prop->multiProcessorCount = 132;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    SIM_ENTER("cudaGetDevice");
    *device = sim_dev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    SIM_ENTER("cudaSetDevice");
    if (device < 0 || device >= sim_ndev || device >= SIM_MAXDEV) {
        return cudaErrorInvalidDevice;
    }
    sim_dev = device;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    case cudaErrorNoDevice:
        return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
        return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorNotReady:
        return "device not ready";
    case cudaErrorIllegalAddress:
        return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
        return "unspecified launch failure";
    default:
        return "unrecognized error code";
    }
}

cudaError_t cudaGetLastError(void)
{
    if (sim_sticky != cudaSuccess) {
        return sim_sticky;
    }
    cudaError_t ce = sim_last;
    sim_last = cudaSuccess;
    return ce;
}

cudaError_t cudaDeviceSynchronize(void)
{
    SIM_ENTER("cudaDeviceSynchronize");
    pthread_mutex_lock(&sim_mu);
    sim_device_syncs++;
    for (struct CUstream_st *s = sim_all_streams; s; s = s->all_next) {
        s->draining = s->dev == sim_dev;
    }
    sim_progress_locked();
    for (struct CUstream_st *s = sim_all_streams; s; s = s->all_next) {
        s->draining = 0;
    }
    for (struct CUstream_st *s = sim_all_streams; s; s = s->all_next) {
        if (s->dev == sim_dev && !sim_drain_locked(s, s->issued)) {
            break;
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// memory

static struct sim_mem *sim_mem_new_locked(size_t n, int dev, int dirt)
{
    struct sim_mem *m = calloc(1, sizeof(*m));
    unsigned char *raw = m ? calloc(1, n + 256) : NULL;
    if (!raw) {
        free(m);
        return NULL;
    }
    unsigned char *p = raw + (256 - (uintptr_t)raw % 256) % 256;
    /* dirty, as the runtime hands memory out; the first MiB is enough to
     * show a missing zeroing, and the rest stays untouched */
    memset(p, dirt, n < ((size_t)1 << 20) ? n : ((size_t)1 << 20));
    *m = (struct sim_mem){.raw = raw, .p = p, .n = n, .dev = dev, .next = sim_mems};
    sim_mems = m;
    return m;
}

/* Unlinks the allocation at p: device memory when device, else pinned. */
static struct sim_mem *sim_mem_take_locked(const void *p, int device)
{
    for (struct sim_mem **pp = &sim_mems; *pp; pp = &(*pp)->next) {
        struct sim_mem *m = *pp;
        if (m->p == p && (device ? m->dev >= 0 : m->dev < 0)) {
            *pp = m->next;
            return m;
        }
    }
    return NULL;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    SIM_ENTER("cudaMalloc");
    pthread_mutex_lock(&sim_mu);
    struct sim_mem *m = NULL;
    if (size <= sim_capacity - sim_used[sim_dev]) {
        m = sim_mem_new_locked(size, sim_dev, 0xcd);
    }
    if (m) {
        sim_used[sim_dev] += size;
        sim_mallocs++;
        *devPtr = m->p;
    } else {
        sim_last = cudaErrorMemoryAllocation;
    }
    pthread_mutex_unlock(&sim_mu);
    return m ? cudaSuccess : cudaErrorMemoryAllocation;
}

/* Synchronises the device first, as the runtime does. */
cudaError_t cudaFree(void *devPtr)
{
    SIM_ENTER("cudaFree");
    if (!devPtr) {
        return cudaSuccess;
    }
    (void)cudaDeviceSynchronize();
    pthread_mutex_lock(&sim_mu);
    struct sim_mem *m = sim_mem_take_locked(devPtr, 1);
    if (m) {
        sim_used[m->dev] -= m->n;
        free(m->raw);
        free(m);
    }
    pthread_mutex_unlock(&sim_mu);
    return m ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    SIM_ENTER("cudaHostAlloc");
    pthread_mutex_lock(&sim_mu);
    struct sim_mem *m = sim_mem_new_locked(size, -1, 0xa5);
    pthread_mutex_unlock(&sim_mu);
    if (!m) {
        sim_last = cudaErrorMemoryAllocation;
        return cudaErrorMemoryAllocation;
    }
    *pHost = m->p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    SIM_ENTER("cudaFreeHost");
    pthread_mutex_lock(&sim_mu);
    struct sim_mem *m = sim_mem_take_locked(ptr, 0);
    pthread_mutex_unlock(&sim_mu);
    if (m) {
        free(m->raw);
        free(m);
    }
    return m ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    SIM_ENTER("cudaMemGetInfo");
    pthread_mutex_lock(&sim_mu);
    *free = sim_capacity - sim_used[sim_dev];
    *total = sim_capacity;
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

/* Whether [p, p + n) is where kind's side says: device memory (in one
 * allocation), or host memory (anything that is not device memory). */
static int sim_side_ok_locked(const void *p, size_t n, int device)
{
    if (device) {
        return sim_find_locked(p, n, 1) != NULL;
    }
    return sim_find_locked(p, 1, 1) == NULL;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    SIM_ENTER("cudaMemcpyAsync");
    int src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    int dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    pthread_mutex_lock(&sim_mu);
    if (kind == cudaMemcpyHostToHost || kind == cudaMemcpyDefault ||
        !sim_side_ok_locked(src, count, src_dev) || !sim_side_ok_locked(dst, count, dst_dev)) {
        sim_bad_calls++;
        sim_last = cudaErrorInvalidValue;
        pthread_mutex_unlock(&sim_mu);
        return cudaErrorInvalidValue;
    }
    struct CUstream_st *s = sim_resolve_locked(stream);
    struct sim_item *it = calloc(1, sizeof(*it));
    *it = (struct sim_item){.kind = SIM_COPY, .dst = dst, .src = src, .n = count};
    int pageable_src = !src_dev && !sim_find_locked(src, count, 0);
    int pageable_dst = !dst_dev && !sim_find_locked(dst, count, 0);
    if (pageable_src) {
        it->staged = malloc(count ? count : 1);
        memcpy(it->staged, src, count);
    }
    sim_enqueue_locked(s, it);
    if (pageable_dst) {
        (void)sim_drain_locked(s, s->issued);
    } else {
        sim_progress_locked();
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    SIM_ENTER("cudaMemsetAsync");
    pthread_mutex_lock(&sim_mu);
    if (!sim_side_ok_locked(devPtr, count, 1)) {
        sim_bad_calls++;
        sim_last = cudaErrorInvalidValue;
        pthread_mutex_unlock(&sim_mu);
        return cudaErrorInvalidValue;
    }
    struct sim_item *it = calloc(1, sizeof(*it));
    *it = (struct sim_item){.kind = SIM_SET, .dst = devPtr, .n = count, .value = value};
    sim_enqueue_locked(sim_resolve_locked(stream), it);
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// streams and events

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    SIM_ENTER("cudaStreamCreateWithFlags");
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s) {
        return cudaErrorMemoryAllocation;
    }
    s->dev = sim_dev;
    s->slow = sim_lazy_streams;
    pthread_mutex_lock(&sim_mu);
    sim_init_locked();
    s->all_next = sim_all_streams;
    sim_all_streams = s;
    sim_streams++;
    sim_blocking_streams += !(flags & cudaStreamNonBlocking);
    pthread_mutex_unlock(&sim_mu);
    *pStream = s;
    return cudaSuccess;
}

/* The stream stays in the list (never freed): waits queued elsewhere may
 * still read its position. */
cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    SIM_ENTER("cudaStreamDestroy");
    pthread_mutex_lock(&sim_mu);
    sim_streams--;
    pthread_mutex_unlock(&sim_mu);
    (void)stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    SIM_ENTER("cudaStreamSynchronize");
    pthread_mutex_lock(&sim_mu);
    struct CUstream_st *s = sim_resolve_locked(stream);
    (void)sim_drain_locked(s, s->issued);
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    SIM_ENTER("cudaEventCreateWithFlags");
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (!e) {
        return cudaErrorMemoryAllocation;
    }
    e->dev = sim_dev;
    pthread_mutex_lock(&sim_mu);
    sim_events++;
    sim_timed_events += !(flags & cudaEventDisableTiming);
    pthread_mutex_unlock(&sim_mu);
    *event = e;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    SIM_ENTER("cudaEventDestroy");
    pthread_mutex_lock(&sim_mu);
    sim_events--;
    pthread_mutex_unlock(&sim_mu);
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    SIM_ENTER("cudaEventRecord");
    pthread_mutex_lock(&sim_mu);
    struct CUstream_st *s = sim_resolve_locked(stream);
    if (s->dev != event->dev) {
        pthread_mutex_unlock(&sim_mu);
        return cudaErrorInvalidResourceHandle;
    }
    struct sim_item *it = calloc(1, sizeof(*it));
    it->kind = SIM_MARK;
    sim_enqueue_locked(s, it);
    event->s = s;
    event->target = s->issued;
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    (void)flags;
    SIM_ENTER("cudaStreamWaitEvent");
    pthread_mutex_lock(&sim_mu);
    if (event->s) { /* an event never recorded is complete */
        struct sim_item *it = calloc(1, sizeof(*it));
        *it = (struct sim_item){.kind = SIM_WAIT, .wait_s = event->s, .wait_n = event->target};
        sim_enqueue_locked(sim_resolve_locked(stream), it);
        sim_progress_locked();
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    SIM_ENTER("cudaEventQuery");
    pthread_mutex_lock(&sim_mu);
    sim_progress_locked();
    int done = !event->s || event->s->done >= event->target;
    pthread_mutex_unlock(&sim_mu);
    return done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    SIM_ENTER("cudaEventSynchronize");
    pthread_mutex_lock(&sim_mu);
    if (event->s) {
        (void)sim_drain_locked(event->s, event->target);
    }
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// test helpers

void sim_hold(cudaStream_t s, int held)
{
    pthread_mutex_lock(&sim_mu);
    struct CUstream_st *st = sim_resolve_locked(s);
    st->held = held == 1;
    st->slow = held == SIM_SLOW;
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
}

int sim_pending(cudaStream_t s)
{
    pthread_mutex_lock(&sim_mu);
    struct CUstream_st *st = sim_resolve_locked(s);
    sim_progress_locked();
    int n = (int)(st->issued - st->done);
    pthread_mutex_unlock(&sim_mu);
    return n;
}

int sim_stream_device(cudaStream_t s)
{
    int dev = -1;
    pthread_mutex_lock(&sim_mu);
    sim_init_locked();
    for (struct CUstream_st *st = sim_all_streams; st; st = st->all_next) {
        if (st == s) {
            dev = st->dev;
        }
    }
    pthread_mutex_unlock(&sim_mu);
    return dev;
}

void sim_reset(void)
{
    pthread_mutex_lock(&sim_mu);
    sim_init_locked();
    for (struct CUstream_st *s = sim_all_streams; s; s = s->all_next) {
        s->held = s->slow = 0;
    }
    sim_progress_locked();
    sim_ndev = 2;
    sim_capacity = (size_t)64 << 20;
    snprintf(sim_name, sizeof(sim_name), "NVIDIA H200");
    sim_cc = 90;
    sim_sticky = cudaSuccess;
    sim_fail_call = NULL;
    sim_fail_error = cudaSuccess;
    sim_lazy_streams = 0;
    sim_last = cudaSuccess;
    sim_mallocs = sim_device_syncs = sim_legacy_uses = sim_blocking_streams = 0;
    sim_timed_events = sim_bad_calls = sim_hangs = 0;
    pthread_mutex_unlock(&sim_mu);
    sim_dev = 0;
}

int sim_live(void)
{
    pthread_mutex_lock(&sim_mu);
    int n = sim_streams + sim_events;
    for (const struct sim_mem *m = sim_mems; m; m = m->next) {
        n++;
    }
    pthread_mutex_unlock(&sim_mu);
    return n;
}

cudaError_t sim_enqueue_fn(cudaStream_t s, void (*fn)(void *), void *arg)
{
    pthread_mutex_lock(&sim_mu);
    struct sim_item *it = calloc(1, sizeof(*it));
    *it = (struct sim_item){.kind = SIM_FN, .fn = fn, .dst = arg};
    sim_enqueue_locked(sim_resolve_locked(s), it);
    sim_progress_locked();
    pthread_mutex_unlock(&sim_mu);
    return cudaSuccess;
}

int sim_is_device(const void *p, size_t n)
{
    pthread_mutex_lock(&sim_mu);
    int ok = sim_find_locked(p, n, 1) != NULL;
    pthread_mutex_unlock(&sim_mu);
    return ok;
}
