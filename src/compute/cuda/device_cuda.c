/*
 * device_cuda.c - the cuda device's host side (device.h's ops): one GPU
 * per rank, its memory carved from an arena, copies and fills on CUDA
 * streams, events, pinned host memory, memory info and the named live
 * buffers. Plain C over the CUDA runtime API; compiled in CUDA builds, and
 * by test_cuda_device against a simulated runtime (tests/kernels/cuda_sim.c)
 * in every build.
 *
 * The ordinal is the index fsdp_device_create is given (the local rank)
 * modulo the visible devices; FSDPC_CUDA_DEVICE names one instead. The
 * device's compute stream (d->stream) and every stream it makes are
 * non-blocking: nothing here ever runs on the legacy default stream, which
 * would order itself against every other stream.
 *
 * The arena: device memory is taken from the runtime in a few large
 * chunks, once with reserve (the trainer's memory plan, in one piece) and
 * otherwise grown by CUDA_CHUNK (or the request, when larger) as allocs
 * need it; cudaMalloc synchronises the device, so it happens at setup and
 * never in a step. alloc hands out 256-byte aligned pieces by first fit,
 * split off a free block; free returns a piece and merges it with its free
 * neighbours. Chunks go back to the runtime only with the device.
 *
 * What free promises is cudaFree's: the caller's work on the buffer may
 * still be queued. A piece freed since the device last drained is
 * therefore handed out again only after a device synchronisation (the
 * device's own; it is not a host wait of the stats, as the guarded device
 * does not count one either). A new piece is zeroed on a private stream
 * and waited for, so that it is zero before any stream of the caller's
 * touches it, as on the guarded device.
 *
 * Every CUDA error is one fsdp_err line naming the call and the runtime's
 * string for the code. Out of memory is the NULL that fsdp_device_alloc
 * turns into its message (the buffer, the bytes, mem_info's free memory:
 * the runtime's free memory plus the arena's unused bytes).
 */
#include "config.h"
#include "compute/cuda/device_cuda.h"
#include "compute/device_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_ALIGN 256
#define CUDA_CHUNK ((size_t)1 << 30) /* arena growth when reserve was not called */
#define CUDA_MAX_CHUNKS 64

/* A piece of a chunk, live or free; blocks are kept in (chunk, off) order
 * and cover every chunk. */
struct cuda_block {
    int chunk;
    size_t off, bytes; /* bytes: a multiple of CUDA_ALIGN */
    size_t req;        /* the live allocation's requested bytes */
    int live;
    unsigned long freed_gen; /* drains + 1 when freed (see cuda_take); 0: clean */
    char name[56];
};

struct cuda_dev {
    pthread_mutex_t mu;
    int ordinal;
    struct {
        unsigned char *base;
        size_t bytes;
    } chunks[CUDA_MAX_CHUNKS];
    int n_chunks;
    size_t reserved; /* bytes in chunks */
    size_t handed;   /* bytes in live blocks */
    struct cuda_block *blocks;
    size_t n_blocks, blocks_cap;
    unsigned long drains; /* device synchronisations so far */
    cudaStream_t compute; /* d->stream */
    cudaStream_t zeroing; /* private: new pieces are zeroed here */
};

static struct cuda_dev *cuda_of(struct fsdp_device *d)
{
    return d->impl;
}

/* One line naming the call (up to its parenthesis) and the runtime's
 * string for ce. */
static int cuda_fail(const struct fsdp_device *d, const char *call, cudaError_t ce)
{
    return fsdp_err(FSDP_ERR_BACKEND, "cuda device %d: %.*s failed: %s (error %d)", d->index,
                    (int)strcspn(call, "("), call, cudaGetErrorString(ce), (int)ce);
}

#define CUDA_TRY(d, call)                                                                          \
    do {                                                                                           \
        cudaError_t cuda_try_ce_ = (call);                                                         \
        if (cuda_try_ce_ != cudaSuccess) {                                                         \
            return cuda_fail((d), #call, cuda_try_ce_);                                            \
        }                                                                                          \
    } while (0)

/* The same for ops that return nothing: the message is logged. */
static void cuda_warn(const struct fsdp_device *d, const char *call, cudaError_t ce)
{
    if (ce != cudaSuccess) {
        (void)cuda_fail(d, call, ce);
        FSDP_ERROR(FSDP_SUB_CORE, "%s", fsdp_err_msg());
    }
}

/* The calling thread's current device is d's (calls that create or wait
 * on the whole device name no stream, so they act on the current one). */
static int cuda_use(struct fsdp_device *d)
{
    CUDA_TRY(d, cudaSetDevice(cuda_of(d)->ordinal));
    return 0;
}

static cudaStream_t cuda_stream(struct fsdp_device *d, void *stream)
{
    return stream ? (cudaStream_t)stream : (cudaStream_t)d->stream;
}

// ----------------------------------------------------------------------------
// the arena (under c->mu)

static int cuda_blocks_room(struct cuda_dev *c, size_t more)
{
    if (c->n_blocks + more <= c->blocks_cap) {
        return 0;
    }
    size_t nc = c->blocks_cap ? 2 * c->blocks_cap : 64;
    struct cuda_block *nb = realloc(c->blocks, nc * sizeof(*nb));
    if (!nb) {
        return fsdp_err(FSDP_ERR_NOMEM, "cuda device: block table");
    }
    c->blocks = nb;
    c->blocks_cap = nc;
    return 0;
}

/* Takes a chunk of bytes from the runtime: one free block at the end. */
static int cuda_add_chunk(struct fsdp_device *d, struct cuda_dev *c, size_t bytes)
{
    if (c->n_chunks == CUDA_MAX_CHUNKS) {
        return fsdp_err(FSDP_ERR_NOMEM, "cuda device %d: arena of %d chunks is full", d->index,
                        CUDA_MAX_CHUNKS);
    }
    FSDP_CHECK(cuda_blocks_room(c, 1));
    void *p = NULL;
    cudaError_t ce = cudaMalloc(&p, bytes);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it */
        return ce == cudaErrorMemoryAllocation ? FSDP_ERR_NOMEM : cuda_fail(d, "cudaMalloc", ce);
    }
    int k = c->n_chunks++;
    c->chunks[k].base = p;
    c->chunks[k].bytes = bytes;
    c->reserved += bytes;
    c->blocks[c->n_blocks++] = (struct cuda_block){.chunk = k, .bytes = bytes};
    FSDP_DEBUG(FSDP_SUB_CORE, "cuda device %d: arena chunk %d of %zu bytes (%zu in all)", d->index,
               k, bytes, c->reserved);
    return 0;
}

/* The first free block of at least need bytes, or -1. */
static long cuda_fit(const struct cuda_dev *c, size_t need)
{
    for (size_t i = 0; i < c->n_blocks; i++) {
        if (!c->blocks[i].live && c->blocks[i].bytes >= need) {
            return (long)i;
        }
    }
    return -1;
}

/* Grows the arena by a chunk that holds need: CUDA_CHUNK or need, the
 * larger; need alone when the runtime has not that much. */
static int cuda_grow(struct fsdp_device *d, struct cuda_dev *c, size_t need)
{
    FSDP_CHECK(cuda_use(d));
    int rc = need < CUDA_CHUNK ? cuda_add_chunk(d, c, CUDA_CHUNK) : FSDP_ERR_NOMEM;
    if (rc == FSDP_ERR_NOMEM) {
        rc = cuda_add_chunk(d, c, need);
    }
    return rc;
}

/* Makes block i a live piece of need bytes, splitting off the rest. A
 * piece freed since the last drain may still be in use by queued work:
 * the device drains first (cudaFree's guarantee). */
static int cuda_take(struct fsdp_device *d, struct cuda_dev *c, size_t i, size_t need)
{
    if (c->blocks[i].freed_gen == c->drains + 1) {
        FSDP_CHECK(cuda_use(d));
        CUDA_TRY(d, cudaDeviceSynchronize());
        c->drains++;
    }
    if (c->blocks[i].bytes > need) {
        FSDP_CHECK(cuda_blocks_room(c, 1));
        memmove(&c->blocks[i + 2], &c->blocks[i + 1], (c->n_blocks - i - 1) * sizeof(c->blocks[0]));
        c->n_blocks++;
        struct cuda_block *b = &c->blocks[i];
        c->blocks[i + 1] = (struct cuda_block){.chunk = b->chunk,
                                               .off = b->off + need,
                                               .bytes = b->bytes - need,
                                               .freed_gen = b->freed_gen};
        b->bytes = need;
    }
    c->blocks[i].live = 1;
    c->handed += need;
    return 0;
}

/* Block i (free) absorbs block i + 1 when that is free in the same chunk. */
static void cuda_merge_next(struct cuda_dev *c, size_t i)
{
    if (i + 1 >= c->n_blocks) {
        return;
    }
    struct cuda_block *a = &c->blocks[i], *b = &c->blocks[i + 1];
    if (a->live || b->live || a->chunk != b->chunk) {
        return;
    }
    a->bytes += b->bytes;
    a->freed_gen = a->freed_gen > b->freed_gen ? a->freed_gen : b->freed_gen;
    memmove(b, b + 1, (c->n_blocks - i - 2) * sizeof(*b));
    c->n_blocks--;
}

static long cuda_find(const struct cuda_dev *c, const void *p)
{
    for (size_t i = 0; i < c->n_blocks; i++) {
        const struct cuda_block *b = &c->blocks[i];
        if (b->live && c->chunks[b->chunk].base + b->off == (const unsigned char *)p) {
            return (long)i;
        }
    }
    return -1;
}

// ----------------------------------------------------------------------------
// ops: memory

/* Zeroes a new piece before any of the caller's streams can reach it. */
static int cuda_zero_new(struct fsdp_device *d, void *p, size_t bytes)
{
    struct cuda_dev *c = cuda_of(d);
    CUDA_TRY(d, cudaMemsetAsync(p, 0, bytes, c->zeroing));
    CUDA_TRY(d, cudaStreamSynchronize(c->zeroing));
    return 0;
}

static void *cuda_alloc(struct fsdp_device *d, size_t bytes, const char *name)
{
    struct cuda_dev *c = cuda_of(d);
    size_t need = (bytes + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
    need = need ? need : CUDA_ALIGN;
    pthread_mutex_lock(&c->mu);
    long i = cuda_fit(c, need);
    if (i < 0 && cuda_grow(d, c, need) == 0) {
        i = cuda_fit(c, need);
    }
    if (i < 0 || cuda_take(d, c, (size_t)i, need) < 0) {
        pthread_mutex_unlock(&c->mu);
        return NULL;
    }
    struct cuda_block *b = &c->blocks[i];
    b->req = bytes;
    snprintf(b->name, sizeof(b->name), "%s", name ? name : "(unnamed)");
    void *p = c->chunks[b->chunk].base + b->off;
    pthread_mutex_unlock(&c->mu);
    fsdp_device_count_alloc(d, (long long)bytes);
    if (cuda_zero_new(d, p, need) < 0) {
        d->ops->free(d, p);
        return NULL;
    }
    return p;
}

static void cuda_free(struct fsdp_device *d, void *p)
{
    struct cuda_dev *c = cuda_of(d);
    if (!p) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    long i = cuda_find(c, p);
    if (i < 0) {
        pthread_mutex_unlock(&c->mu);
        FSDP_ERROR(FSDP_SUB_CORE, "cuda device %d: free of %p, which it did not allocate", d->index,
                   p);
        abort();
    }
    struct cuda_block *b = &c->blocks[i];
    size_t req = b->req;
    c->handed -= b->bytes;
    b->live = 0;
    b->freed_gen = c->drains + 1;
    cuda_merge_next(c, (size_t)i);
    if (i > 0) {
        cuda_merge_next(c, (size_t)i - 1);
    }
    pthread_mutex_unlock(&c->mu);
    fsdp_device_count_alloc(d, -(long long)req);
}

static int cuda_reserve(struct fsdp_device *d, size_t bytes)
{
    struct cuda_dev *c = cuda_of(d);
    int rc = 0;
    pthread_mutex_lock(&c->mu);
    if (bytes > c->reserved) {
        size_t more = (bytes - c->reserved + CUDA_ALIGN - 1) / CUDA_ALIGN * CUDA_ALIGN;
        rc = cuda_use(d);
        rc = rc < 0 ? rc : cuda_add_chunk(d, c, more);
        if (rc == FSDP_ERR_NOMEM) {
            size_t free_b = 0, total_b = 0;
            (void)cudaMemGetInfo(&free_b, &total_b);
            rc = fsdp_err(FSDP_ERR_NOMEM,
                          "out of memory on device cuda:%d: the memory plan reserves %zu "
                          "bytes, %zu of %zu free",
                          d->index, bytes, free_b, total_b);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int cuda_mem_info(struct fsdp_device *d, size_t *free_bytes, size_t *total_bytes)
{
    struct cuda_dev *c = cuda_of(d);
    size_t f = 0, t = 0;
    FSDP_CHECK(cuda_use(d));
    CUDA_TRY(d, cudaMemGetInfo(&f, &t));
    pthread_mutex_lock(&c->mu);
    *free_bytes = f + (c->reserved - c->handed);
    pthread_mutex_unlock(&c->mu);
    *total_bytes = t;
    return 0;
}

static size_t cuda_buffers(struct fsdp_device *d, struct fsdp_device_buffer *out, size_t max)
{
    struct cuda_dev *c = cuda_of(d);
    size_t n = 0;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_blocks; i++) {
        if (c->blocks[i].live) {
            if (n < max) {
                out[n] = (struct fsdp_device_buffer){c->blocks[i].name, c->blocks[i].req};
            }
            n++;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return n;
}

static void *cuda_host_alloc(struct fsdp_device *d, size_t bytes)
{
    void *p = NULL;
    cudaError_t ce = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cuda_fail(d, "cudaHostAlloc", ce);
        return NULL;
    }
    memset(p, 0, bytes);
    return p;
}

static void cuda_host_free(struct fsdp_device *d, void *p)
{
    if (p) {
        cuda_warn(d, "cudaFreeHost", cudaFreeHost(p));
    }
}

// ----------------------------------------------------------------------------
// ops: copies and fills

static int cuda_copy(struct fsdp_device *d, void *dst, const void *src, size_t bytes,
                     enum fsdp_copy_dir dir, void *stream)
{
    static const enum cudaMemcpyKind kind[] = {
        [FSDP_COPY_H2D] = cudaMemcpyHostToDevice,
        [FSDP_COPY_D2H] = cudaMemcpyDeviceToHost,
        [FSDP_COPY_D2D] = cudaMemcpyDeviceToDevice,
    };
    if (dir == FSDP_COPY_D2H) {
        d->stats.d2h_copies++;
    }
    if (bytes == 0) {
        return 0;
    }
    CUDA_TRY(d, cudaMemcpyAsync(dst, src, bytes, kind[dir], cuda_stream(d, stream)));
    return 0;
}

static int cuda_memset(struct fsdp_device *d, void *p, int value, size_t bytes, void *stream)
{
    if (bytes == 0) {
        return 0;
    }
    CUDA_TRY(d, cudaMemsetAsync(p, value, bytes, cuda_stream(d, stream)));
    return 0;
}

// ----------------------------------------------------------------------------
// ops: streams and events

static int cuda_stream_create(struct fsdp_device *d, void **stream)
{
    cudaStream_t s = NULL;
    FSDP_CHECK(cuda_use(d));
    CUDA_TRY(d, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *stream = s;
    return 0;
}

static void cuda_stream_destroy(struct fsdp_device *d, void *stream)
{
    if (stream) {
        cuda_warn(d, "cudaStreamDestroy", cudaStreamDestroy(stream));
    }
}

/* NULL: the whole device, as device.h says (not d->stream). */
static int cuda_synchronize(struct fsdp_device *d, void *stream)
{
    struct cuda_dev *c = cuda_of(d);
    d->stats.host_waits++;
    if (stream) {
        CUDA_TRY(d, cudaStreamSynchronize(stream));
        return 0;
    }
    FSDP_CHECK(cuda_use(d));
    CUDA_TRY(d, cudaDeviceSynchronize());
    pthread_mutex_lock(&c->mu);
    c->drains++;
    pthread_mutex_unlock(&c->mu);
    return 0;
}

static int cuda_event_create(struct fsdp_device *d, void **ev)
{
    cudaEvent_t e = NULL;
    FSDP_CHECK(cuda_use(d));
    CUDA_TRY(d, cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *ev = e;
    return 0;
}

static void cuda_event_destroy(struct fsdp_device *d, void *ev)
{
    if (ev) {
        cuda_warn(d, "cudaEventDestroy", cudaEventDestroy(ev));
    }
}

static int cuda_event_record(struct fsdp_device *d, void *ev, void *stream)
{
    CUDA_TRY(d, cudaEventRecord(ev, cuda_stream(d, stream)));
    return 0;
}

static int cuda_stream_wait(struct fsdp_device *d, void *stream, void *ev)
{
    CUDA_TRY(d, cudaStreamWaitEvent(cuda_stream(d, stream), ev, 0));
    return 0;
}

static int cuda_event_query(struct fsdp_device *d, void *ev)
{
    cudaError_t ce = cudaEventQuery(ev);
    if (ce == cudaSuccess || ce == cudaErrorNotReady) {
        return ce == cudaSuccess;
    }
    return cuda_fail(d, "cudaEventQuery", ce);
}

static int cuda_event_synchronize(struct fsdp_device *d, void *ev)
{
    d->stats.host_waits++;
    CUDA_TRY(d, cudaEventSynchronize(ev));
    return 0;
}

// ----------------------------------------------------------------------------
// peak FLOP/s

/* Dense peaks from the vendor's data sheets (no sparsity), by the name the
 * runtime gives; the first match wins, so "H100 PCIe" stands before "H100". */
static const struct cuda_peak {
    const char *name;
    double tensor16, tf32, f32; /* bf16/f16 tensor cores, TF32, plain f32 */
} cuda_peaks[] = {
    {"H100 PCIe", 756.5e12, 378e12, 51.2e12},
    {"H100", 989.4e12, 494.7e12, 66.9e12}, /* SXM; H100 NVL differs little */
    {"H200", 989.4e12, 494.7e12, 66.9e12},
    {"H800", 989.4e12, 494.7e12, 66.9e12},
    {"A100", 312e12, 156e12, 19.5e12},
    {"A800", 312e12, 156e12, 19.5e12},
    {"L40S", 362.05e12, 183.2e12, 91.6e12},
    {"L4", 121e12, 60e12, 30.3e12},
};

static int cuda_peak_flops(struct fsdp_device *d, enum fsdp_dtype dt, double *flops, char *what,
                           size_t n)
{
    struct cudaDeviceProp p;
    *flops = 0;
    CUDA_TRY(d, cudaGetDeviceProperties(&p, cuda_of(d)->ordinal));
    p.name[sizeof(p.name) - 1] = '\0';
    int tf32 = fsdp_env_int("FSDPC_CUDA_TF32", 0) == 1;
    const char *kind = dt != FSDP_F32 ? "dense bf16/f16" : tf32 ? "dense TF32" : "f32";
    for (size_t i = 0; i < sizeof(cuda_peaks) / sizeof(cuda_peaks[0]); i++) {
        const struct cuda_peak *k = &cuda_peaks[i];
        if (strstr(p.name, k->name)) {
            *flops = dt != FSDP_F32 ? k->tensor16 : tf32 ? k->tf32 : k->f32;
            snprintf(what, n, "%s's %s peak, from its data sheet", p.name, kind);
            return 0;
        }
    }
    snprintf(what, n,
             "%s (sm_%d%d) is not in fsdpc's table of peaks: give --peak-flops for "
             "MFU",
             p.name, p.major, p.minor);
    return 0;
}

static const struct fsdp_device_ops cuda_ops = {
    .size = sizeof(struct fsdp_device_ops),
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .synchronize = cuda_synchronize,
    .memset = cuda_memset,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait = cuda_stream_wait,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .mem_info = cuda_mem_info,
    .buffers = cuda_buffers,
    .reserve = cuda_reserve,
    .peak_flops = cuda_peak_flops,
};

// ----------------------------------------------------------------------------
// lifetime

/* The ordinal: FSDPC_CUDA_DEVICE when set, else index modulo the count
 * (the nccl backend's choice, so that a rank's buffers and its
 * communicators are on one device). */
static int cuda_pick(int index, int *ordinal)
{
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count < 1) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        (void)cudaGetLastError();
        return fsdp_err(
            FSDP_ERR_BACKEND, "cuda device: no CUDA device visible (CUDA_VISIBLE_DEVICES=%s): %s%s",
            vis ? vis : "<unset>", ce != cudaSuccess ? "cudaGetDeviceCount failed: " : "",
            ce != cudaSuccess ? cudaGetErrorString(ce) : "the device count is 0");
    }
    const char *pin = getenv("FSDPC_CUDA_DEVICE");
    if (pin && *pin) {
        long long v;
        if (fsdp_parse_long(pin, &v) < 0 || v < 0 || v >= count) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID,
                            "cuda device: FSDPC_CUDA_DEVICE='%s' is not a device of this host (%d "
                            "visible: 0..%d)",
                            pin, count, count - 1);
        }
        *ordinal = (int)v;
        return 0;
    }
    *ordinal = (index < 0 ? 0 : index) % count;
    return 0;
}

int fsdp_cuda_visible(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return count;
}

static void cuda_release(struct fsdp_device *d, struct cuda_dev *c)
{
    (void)cudaSetDevice(c->ordinal);
    if (c->n_chunks > 0 || c->compute || c->zeroing) {
        cuda_warn(d, "cudaDeviceSynchronize", cudaDeviceSynchronize());
    }
    for (int k = 0; k < c->n_chunks; k++) {
        cuda_warn(d, "cudaFree", cudaFree(c->chunks[k].base));
    }
    cuda_stream_destroy(d, c->zeroing);
    cuda_stream_destroy(d, c->compute);
    pthread_mutex_destroy(&c->mu);
    free(c->blocks);
    free(c);
}

/* Fills d with the ops, the ordinal and the two streams; d->k stays NULL. */
static int cuda_setup(struct fsdp_device *d, int index)
{
    int ordinal = 0;
    FSDP_CHECK(cuda_pick(index, &ordinal));
    struct cuda_dev *c = calloc(1, sizeof(*c));
    if (!c) {
        return fsdp_err(FSDP_ERR_NOMEM, "cuda device");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->ordinal = ordinal;
    *d = (struct fsdp_device){.ops = &cuda_ops, .mem = FSDP_MEM_CUDA, .index = ordinal, .impl = c};
    void *compute = NULL, *zeroing = NULL;
    int rc = cuda_stream_create(d, &compute);
    rc = rc < 0 ? rc : cuda_stream_create(d, &zeroing);
    c->compute = compute;
    c->zeroing = zeroing;
    if (rc < 0) {
        cuda_release(d, c);
        d->impl = NULL;
        return rc;
    }
    d->stream = compute;
    FSDP_DEBUG(FSDP_SUB_CORE, "cuda device %d (index %d)", ordinal, index);
    return 0;
}

#if HAVE_CUDA_KERNELS && !defined(FSDP_CUDA_SIM) /* the simulated runtime's test has no kernels */
const struct fsdp_kernels *fsdp_cuda_kernels(void); /* table.cu */

int fsdp_cuda_device_init(struct fsdp_device *d, int index)
{
    FSDP_CHECK(cuda_setup(d, index));
    d->k = fsdp_cuda_kernels();
    return 0;
}
#else
/* A build with the toolkit but without the kernels (the default when
 * configure only found the toolkit): no user gets a device without a
 * kernel table, and nothing touches the GPU. */
int fsdp_cuda_device_init(struct fsdp_device *d, int index)
{
    (void)d;
    (void)index;
    return fsdp_err(FSDP_ERR_UNSUPPORTED,
                    "device 'cuda': this build has the CUDA toolkit but not the kernels "
                    "(configure --with-cuda, or --enable-cuda-kernels, builds them; devices: %s)",
                    fsdp_device_names());
}
#endif

void fsdp_cuda_device_fini(struct fsdp_device *d)
{
    struct cuda_dev *c = cuda_of(d);
    if (c) {
        cuda_release(d, c);
        d->impl = NULL;
    }
}

int fsdp_cuda_device_create_ops_only(int index, struct fsdp_device **out)
{
    struct fsdp_device *d = calloc(1, sizeof(*d));
    if (!d) {
        return fsdp_err(FSDP_ERR_NOMEM, "cuda device");
    }
    int rc = cuda_setup(d, index);
    if (rc < 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void fsdp_cuda_device_destroy(struct fsdp_device *d)
{
    if (d) {
        fsdp_cuda_device_fini(d);
        free(d);
    }
}
