/*
 * mpsim_cuda.c - the simulated CUDA runtime of mpsim.h (the calls
 * device_cuda.c and the nccl backend make), its order check of the
 * streams, and the device "cuda-sim": the CUDA device's host side over this
 * runtime with the CPU kernel table, each kernel checked on the device's
 * compute stream.
 */
#include "config.h"
#include "compute/cuda/device_cuda.h"
#include "compute/device.h"
#include "tests/backends/mpsim.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MPSIM_STREAMS 32 /* 0: the legacy default stream, 1: the per-thread one */
#define MPSIM_NDEV 8
#define MPSIM_TOTAL ((size_t)16 << 30)

enum mpsim_kind {
    MPSIM_RAW,    /* a cudaMalloc */
    MPSIM_BUFFER, /* an allocation of the device (inside a cudaMalloc of its arena) */
    MPSIM_PINNED, /* cudaHostAlloc */
};

struct mpsim_block {
    char *p;
    size_t n;
    enum mpsim_kind kind;
    int dev;
    int writer;      /* stream of the last write (when wclock > 0) */
    uint64_t wclock; /* its clock then; 0: none */
    char name[48];
};

struct CUstream_st {
    int id;
    int dev;
};

struct CUevent_st {
    uint64_t vc[MPSIM_STREAMS];
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st streams[MPSIM_STREAMS];
static int n_streams = 2;
static uint64_t vc[MPSIM_STREAMS][MPSIM_STREAMS]; /* [s][t]: how far s is ordered after t */
static uint64_t host[MPSIM_STREAMS];              /* how far the host has waited for each */
static struct mpsim_block *blocks;
static size_t n_blocks, cap_blocks;
static size_t allocated;
static int compute_id = -1; /* the cuda-sim device's compute stream, for messages */
static _Thread_local int cur_dev;

// ----------------------------------------------------------------------------
// the order check

static void vmax(uint64_t *dst, const uint64_t *src)
{
    for (int i = 0; i < MPSIM_STREAMS; i++) {
        dst[i] = src[i] > dst[i] ? src[i] : dst[i];
    }
}

int mpsim_stream_id(void *stream)
{
    cudaStream_t h = stream;
    if (h == NULL || h == cudaStreamLegacy) {
        return 0;
    }
    if (h == cudaStreamPerThread) {
        return 1;
    }
    for (int i = 2; i < MPSIM_STREAMS; i++) {
        if (h == &streams[i]) {
            return i < n_streams ? i : -1;
        }
    }
    return -1;
}

int mpsim_current_device(void)
{
    return cur_dev;
}

/* The innermost block holding p (a device buffer before the cudaMalloc
 * around it, pinned host memory last); NULL for other host memory. Under
 * mu. */
static struct mpsim_block *find_locked(const void *p)
{
    const char *c = p;
    struct mpsim_block *raw = NULL, *pinned = NULL;
    for (size_t i = 0; i < n_blocks; i++) {
        struct mpsim_block *b = &blocks[i];
        if (c >= b->p && c < b->p + (b->n ? b->n : 1)) {
            if (b->kind == MPSIM_BUFFER) {
                return b;
            }
            if (b->kind == MPSIM_RAW) {
                raw = b;
            } else {
                pinned = b;
            }
        }
    }
    return raw ? raw : pinned;
}

static const char *sname(int s, char *buf, size_t len)
{
    if (s == 0) {
        return "the legacy default stream";
    }
    snprintf(buf, len, "stream %d%s", s, s == compute_id ? " (the compute stream)" : "");
    return buf;
}

static void access_locked(int s, const char *what, const void *p, int write)
{
    struct mpsim_block *b = p ? find_locked(p) : NULL;
    if (!b) {
        return;
    }
    if (b->wclock > 0 && b->writer != s && vc[s][b->writer] < b->wclock) {
        char a[48], w[48];
        fprintf(stderr,
                "fsdpc: nccl simulation: %s on %s %s %s '%s' (%zu bytes), which %s "
                "wrote (its op %llu) and %s has not waited for\n"
                "fsdpc: hint: record an event on the writer's stream after the write and make "
                "the stream of %s wait on it (cudaStreamWaitEvent) first\n",
                what, sname(s, a, sizeof(a)), write ? "writes" : "reads",
                b->kind == MPSIM_PINNED ? "pinned host buffer" : "device buffer", b->name, b->n,
                sname(b->writer, w, sizeof(w)), (unsigned long long)b->wclock,
                sname(s, a, sizeof(a)), what);
        fflush(stderr);
        abort();
    }
    if (write) {
        b->writer = s;
        b->wclock = vc[s][s];
    }
}

void mpsim_order(int s, const char *what, const void *read, const void *write)
{
    pthread_mutex_lock(&mu);
    vmax(vc[s], host);
    vc[s][s]++;
    access_locked(s, what, read, 0);
    access_locked(s, what, write, 1);
    pthread_mutex_unlock(&mu);
}

// ----------------------------------------------------------------------------
// memory

static int add_block(void *p, size_t n, enum mpsim_kind kind, const char *name)
{
    pthread_mutex_lock(&mu);
    if (n_blocks == cap_blocks) {
        size_t nc = cap_blocks ? 2 * cap_blocks : 256;
        struct mpsim_block *nb = realloc(blocks, nc * sizeof(*nb));
        if (!nb) {
            pthread_mutex_unlock(&mu);
            return -1;
        }
        blocks = nb;
        cap_blocks = nc;
    }
    struct mpsim_block *outer = kind == MPSIM_BUFFER ? find_locked(p) : NULL;
    struct mpsim_block *b = &blocks[n_blocks++];
    *b = (struct mpsim_block){.p = p, .n = n, .kind = kind, .dev = cur_dev};
    if (outer) { /* the arena's zeroing of the piece is its last write */
        b->writer = outer->writer;
        b->wclock = outer->wclock;
    }
    snprintf(b->name, sizeof(b->name), "%s", name);
    if (kind == MPSIM_RAW) {
        allocated += n;
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

/* Forgets the block of kind starting at p; its size, or 0 when none. */
static size_t drop_block(const void *p, enum mpsim_kind kind)
{
    size_t n = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = n_blocks; i-- > 0;) {
        if (blocks[i].p == p && blocks[i].kind == kind) {
            n = blocks[i].n ? blocks[i].n : 1;
            if (kind == MPSIM_RAW) {
                allocated -= blocks[i].n;
            }
            blocks[i] = blocks[--n_blocks];
            break;
        }
    }
    pthread_mutex_unlock(&mu);
    return n;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    void *p = NULL;
    if (posix_memalign(&p, 256, size ? size : 1) != 0) {
        return cudaErrorMemoryAllocation;
    }
    if (add_block(p, size, MPSIM_RAW, "cudaMalloc") < 0) {
        free(p);
        return cudaErrorMemoryAllocation;
    }
    *devPtr = p;
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    (void)hStream;
    return cudaMalloc(devPtr, size);
}

cudaError_t cudaFree(void *devPtr)
{
    if (devPtr == NULL) {
        return cudaSuccess;
    }
    if (drop_block(devPtr, MPSIM_RAW) == 0) {
        return cudaErrorInvalidValue;
    }
    free(devPtr);
    return cudaSuccess;
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    (void)hStream;
    return cudaFree(devPtr);
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    void *p = NULL;
    (void)flags;
    if (posix_memalign(&p, 256, size ? size : 1) != 0) {
        return cudaErrorMemoryAllocation;
    }
    if (add_block(p, size, MPSIM_PINNED, "pinned") < 0) {
        free(p);
        return cudaErrorMemoryAllocation;
    }
    *pHost = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr)
{
    if (ptr != NULL && drop_block(ptr, MPSIM_PINNED) == 0) {
        return cudaErrorInvalidValue;
    }
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&mu);
    *total = MPSIM_TOTAL;
    *free_bytes = allocated < MPSIM_TOTAL ? MPSIM_TOTAL - allocated : 0;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr)
{
    memset(attributes, 0, sizeof(*attributes));
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
    pthread_mutex_lock(&mu);
    const char *c = ptr;
    for (size_t i = 0; i < n_blocks; i++) {
        const struct mpsim_block *b = &blocks[i];
        if (c >= b->p && c < b->p + (b->n ? b->n : 1)) {
            attributes->type = b->kind == MPSIM_PINNED ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
            attributes->device = b->dev;
        }
    }
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream)
{
    int s = mpsim_stream_id(stream);
    (void)kind;
    if (s < 0) {
        return cudaErrorInvalidResourceHandle;
    }
    if (count > 0) {
        mpsim_order(s, "a copy", src, dst);
        memmove(dst, src, count);
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    int s = mpsim_stream_id(stream);
    if (s < 0) {
        return cudaErrorInvalidResourceHandle;
    }
    if (count > 0) {
        mpsim_order(s, "a memset", NULL, devPtr);
        memset(devPtr, value, count);
    }
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// devices and errors

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = MPSIM_NDEV;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = cur_dev;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= MPSIM_NDEV) {
        return cudaErrorInvalidDevice;
    }
    cur_dev = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    (void)attr;
    if (device < 0 || device >= MPSIM_NDEV) {
        return cudaErrorInvalidDevice;
    }
    *value = 0; /* no memory pools: the backend takes cudaMalloc */
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    if (device < 0 || device >= MPSIM_NDEV) {
        return cudaErrorInvalidDevice;
    }
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "simulated GPU %d", device);
    prop->totalGlobalMem = MPSIM_TOTAL;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    pthread_mutex_lock(&mu);
    for (int s = 0; s < MPSIM_STREAMS; s++) {
        vmax(host, vc[s]);
    }
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess:
        return "no error";
    case cudaErrorInvalidResourceHandle:
        return "invalid resource handle";
    case cudaErrorInvalidValue:
        return "invalid argument";
    case cudaErrorMemoryAllocation:
        return "out of memory";
    default:
        return "simulated CUDA error";
    }
}

cudaError_t cudaGetLastError(void)
{
    return cudaSuccess;
}

// ----------------------------------------------------------------------------
// streams and events

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    int id = n_streams < MPSIM_STREAMS ? n_streams++ : -1;
    if (id >= 0) {
        streams[id] = (struct CUstream_st){.id = id, .dev = cur_dev};
    }
    pthread_mutex_unlock(&mu);
    if (id < 0) {
        fprintf(stderr, "fsdpc: nccl simulation: more than %d streams\n", MPSIM_STREAMS - 2);
        return cudaErrorMemoryAllocation;
    }
    *pStream = &streams[id];
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, 0);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    /* ids are not reused: a late op on it is still told apart */
    return mpsim_stream_id(stream) >= 2 ? cudaSuccess : cudaErrorInvalidResourceHandle;
}

cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device)
{
    int s = mpsim_stream_id(hStream);
    if (s < 0) {
        return cudaErrorInvalidResourceHandle;
    }
    *device = s >= 2 ? streams[s].dev : cur_dev;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    int s = mpsim_stream_id(stream);
    if (s < 0) {
        return cudaErrorInvalidResourceHandle;
    }
    pthread_mutex_lock(&mu);
    vmax(host, vc[s]);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    (void)flags;
    *event = calloc(1, sizeof(struct CUevent_st));
    return *event ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    free(event);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    int s = mpsim_stream_id(stream);
    if (s < 0 || event == NULL) {
        return cudaErrorInvalidResourceHandle;
    }
    pthread_mutex_lock(&mu);
    vmax(vc[s], host);
    memcpy(event->vc, vc[s], sizeof(event->vc));
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* FSDPC_MPSIM_DROP_WAITS=1 drops every stream wait (the test's proof that
 * the order check stops a run that lacks one). */
static int drop_waits(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("FSDPC_MPSIM_DROP_WAITS");
        v = e && strcmp(e, "1") == 0;
    }
    return v;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    int s = mpsim_stream_id(stream);
    (void)flags;
    if (s < 0 || event == NULL) {
        return cudaErrorInvalidResourceHandle;
    }
    if (drop_waits()) {
        return cudaSuccess;
    }
    pthread_mutex_lock(&mu);
    vmax(vc[s], event->vc);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* Everything has run at its call: the host knows what the event covers. */
cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    pthread_mutex_lock(&mu);
    vmax(host, event->vc);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event)
{
    return cudaEventSynchronize(event);
}

// ----------------------------------------------------------------------------
// the device "cuda-sim"

static struct fsdp_device_ops sim_ops;
static const struct fsdp_device_ops *cuda_ops;

/* The CUDA device's allocation, known to the order check by its name. */
static void *sim_alloc(struct fsdp_device *d, size_t bytes, const char *name)
{
    void *p = cuda_ops->alloc(d, bytes, name);
    if (p && add_block(p, bytes, MPSIM_BUFFER, name ? name : "(unnamed)") < 0) {
        cuda_ops->free(d, p);
        return NULL;
    }
    return p;
}

static void sim_free(struct fsdp_device *d, void *p)
{
    if (p) {
        (void)drop_block(p, MPSIM_BUFFER);
    }
    cuda_ops->free(d, p);
}

/* A kernel of the CPU table on the compute stream: its buffers checked,
 * its writes marked (the first nw pointers). */
static void sim_kernel_enter(struct fsdp_device *d, const void *const *p, int nw, int n)
{
    int s = mpsim_stream_id(d->stream);
    pthread_mutex_lock(&mu);
    vmax(vc[s], host);
    vc[s][s]++;
    for (int i = 0; i < n; i++) {
        access_locked(s, "a kernel", p[i], 0);
    }
    for (int i = 0; i < nw; i++) {
        access_locked(s, "a kernel", p[i], 1);
    }
    pthread_mutex_unlock(&mu);
}

static void sim_kernel_leave(struct fsdp_device *d)
{
    (void)d;
}

int mpsim_device_init(struct fsdp_device *d, int index)
{
    struct fsdp_device *c = NULL;
    int rc = fsdp_cuda_device_create_ops_only(index, &c);
    if (rc < 0) {
        return rc;
    }
    *d = *c; /* the CUDA device's state, now d's (fsdp_device_destroy releases it) */
    free(c);
    if (!cuda_ops) {
        cuda_ops = d->ops;
        sim_ops = *d->ops;
        sim_ops.name = "cuda-sim";
        sim_ops.alloc = sim_alloc;
        sim_ops.free = sim_free;
    }
    d->ops = &sim_ops;
    d->k = fsdp_cpu_kernels();
    d->kernel_enter = sim_kernel_enter;
    d->kernel_leave = sim_kernel_leave;
    compute_id = mpsim_stream_id(d->stream);
    return 0;
}
