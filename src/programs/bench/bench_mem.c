/*
 * bench_mem.c - the memory spaces fsdpc-bench runs collectives in.
 *
 * Host buffers come from fsdp_alloc (64-byte aligned, pre-faulted), so no
 * timed iteration pays a page fault. CUDA buffers are device memory on the
 * current device; the harness fills and checks them through host images,
 * outside the timed loops. Only this file talks to the CUDA runtime.
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "core/error.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

#if HAVE_CUDA
#include <cuda_runtime.h>

static int bench_mem_cuda_err(cudaError_t e, const char *what)
{
    return fsdp_err(FSDP_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(e));
}
#endif

const char *fsdp_bench_mem_name(enum fsdp_mem mem)
{
    return mem == FSDP_MEM_CUDA ? "cuda" : "host";
}

void *fsdp_bench_mem_alloc(enum fsdp_mem mem, size_t bytes)
{
    if (mem == FSDP_MEM_HOST) {
        void *p = fsdp_alloc(bytes);
        if (!p) {
            fsdp_err(FSDP_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
        }
        return p;
    }
#if HAVE_CUDA
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 64);
    if (e != cudaSuccess) {
        bench_mem_cuda_err(e, "cudaMalloc");
        return NULL;
    }
    return p;
#else
    fsdp_err(FSDP_ERR_UNSUPPORTED, "CUDA memory requested but fsdpc was built without CUDA");
    return NULL;
#endif
}

void fsdp_bench_mem_free(enum fsdp_mem mem, void *p)
{
    if (!p) {
        return;
    }
    if (mem == FSDP_MEM_HOST) {
        fsdp_free(p);
        return;
    }
#if HAVE_CUDA
    cudaFree(p);
#endif
}

/* A copy between a host image and a buffer of the space, up (to the space)
 * or down. For CUDA memory the device is waited for after an upload (from
 * pageable memory cudaMemcpy may return before the DMA lands, and the
 * collective runs on a non-blocking stream) and before a download
 * (cudaMemcpy orders after the legacy default stream only, not after the
 * non-blocking stream the collective ran on). */
static int bench_mem_copy(enum fsdp_mem mem, void *dst, const void *src, size_t bytes, int up)
{
    if (bytes == 0 || dst == src) {
        return 0;
    }
    if (mem == FSDP_MEM_HOST) {
        memcpy(dst, src, bytes);
        return 0;
    }
#if HAVE_CUDA
    cudaError_t e = up ? cudaSuccess : cudaDeviceSynchronize();
    if (e == cudaSuccess) {
        e = cudaMemcpy(dst, src, bytes, up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost);
    }
    if (e == cudaSuccess && up) {
        e = cudaDeviceSynchronize();
    }
    if (e != cudaSuccess) {
        return bench_mem_cuda_err(e, up ? "cudaMemcpy to device" : "cudaMemcpy to host");
    }
    return 0;
#else
    (void)up;
    return fsdp_err(FSDP_ERR_UNSUPPORTED, "CUDA memory requested but fsdpc was built without CUDA");
#endif
}

int fsdp_bench_mem_upload(enum fsdp_mem mem, void *dst, const void *host, size_t bytes)
{
    return bench_mem_copy(mem, dst, host, bytes, 1);
}

int fsdp_bench_mem_download(enum fsdp_mem mem, void *host, const void *src, size_t bytes)
{
    return bench_mem_copy(mem, host, src, bytes, 0);
}

int fsdp_bench_mem_stream_create(enum fsdp_mem mem, int local_rank, void **stream)
{
    *stream = NULL;
    if (mem == FSDP_MEM_HOST) {
        return 0;
    }
#if HAVE_CUDA
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) {
        return bench_mem_cuda_err(e, "cudaGetDeviceCount");
    }
    if (ndev <= 0) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "no CUDA device visible to this rank");
    }
    /* the same device the nccl backend picks: FSDPC_CUDA_DEVICE when set,
     * else the local rank modulo the visible devices */
    int dev = local_rank > 0 ? local_rank % ndev : 0;
    const char *pin = getenv("FSDPC_CUDA_DEVICE");
    if (pin != NULL && *pin != '\0') {
        long long d;
        if (fsdp_parse_long(pin, &d) < 0 || d < 0 || d >= ndev) {
            fsdp_err_clear();
            return fsdp_err(FSDP_ERR_INVALID, "FSDPC_CUDA_DEVICE='%s' is not a visible CUDA device "
                            "(%d visible: 0..%d)", pin, ndev, ndev - 1);
        }
        dev = (int)d;
    }
    e = cudaSetDevice(dev);
    if (e != cudaSuccess) {
        return bench_mem_cuda_err(e, "cudaSetDevice");
    }
    cudaStream_t s;
    e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        return bench_mem_cuda_err(e, "cudaStreamCreate");
    }
    *stream = s;
    return 0;
#else
    (void)local_rank;
    return fsdp_err(FSDP_ERR_UNSUPPORTED, "CUDA memory requested but fsdpc was built without CUDA");
#endif
}

void fsdp_bench_mem_stream_destroy(enum fsdp_mem mem, void *stream)
{
    if (mem == FSDP_MEM_HOST || !stream) {
        return;
    }
#if HAVE_CUDA
    cudaStreamDestroy((cudaStream_t)stream);
#endif
}
