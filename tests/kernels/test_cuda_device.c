/*
 * test_cuda_device.c - the cuda device's host side (src/compute/cuda/
 * device_cuda.c) against the simulated runtime of cuda_sim.c, in every
 * build and without a GPU: the ordinal it picks, the arena (alignment,
 * reuse, merging, growth, reserve), named buffers and counts, the
 * out-of-memory line, copies and fills in stream order, event order
 * between two streams, host waits, and a CUDA error as one line naming the
 * call. What the simulation cannot see is in doc/testing.md.
 */
#include "config.h"
#include "compute/cuda/device_cuda.h"
#include "core/error.h"
#include "tests/kernels/cuda_sim.h"
#include "tests/tap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static int all_bytes(const void *p, int value, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        if (c[i] != (unsigned char)value) {
            tap_diag("byte %zu is %#x, want %#x", i, c[i], (unsigned)(unsigned char)value);
            return 0;
        }
    }
    return 1;
}

static int aligned(const void *p)
{
    return (uintptr_t)p % 256 == 0;
}

static int one_line(const char *msg, const char *a, const char *b)
{
    int ok = strchr(msg, '\n') == NULL && strstr(msg, a) && strstr(msg, b);
    if (!ok) {
        tap_diag("message: %s", msg);
    }
    return ok;
}

// ----------------------------------------------------------------------------

static void test_pick(void)
{
    struct fsdp_device *d = NULL;
    int live = sim_live();
    int rc = fsdp_cuda_device_create_ops_only(3, &d);
    if (!tap_ok(rc == 0, "index 3 on 2 devices: created")) {
        return;
    }
    tap_ok(d->index == 1 && sim_dev == 1 && sim_stream_device(d->stream) == 1,
           "index 3 on 2 devices: ordinal 1, current, and its compute stream there (%d)", d->index);
    tap_ok(d->mem == FSDP_MEM_CUDA && d->k == NULL && strcmp(d->ops->name, "cuda") == 0 &&
               fsdp_device_mem_cap(d) == FSDP_CAP_MEM_CUDA,
           "cuda memory for the backends; no kernel table");
    tap_ok(sim_blocking_streams == 0 && sim_mallocs == 0,
           "its streams are non-blocking; no device memory taken before an alloc");
    fsdp_cuda_device_destroy(d);
    setenv("FSDPC_CUDA_DEVICE", "0", 1);
    rc = fsdp_cuda_device_create_ops_only(3, &d);
    tap_ok(rc == 0 && d->index == 0 && sim_dev == 0, "FSDPC_CUDA_DEVICE=0 overrides index 3");
    if (rc == 0) {
        fsdp_cuda_device_destroy(d);
    }
    setenv("FSDPC_CUDA_DEVICE", "2", 1);
    rc = fsdp_cuda_device_create_ops_only(0, &d);
    tap_ok(rc == FSDP_ERR_INVALID &&
               one_line(fsdp_err_msg(), "FSDPC_CUDA_DEVICE='2'", "2 visible: 0..1"),
           "FSDPC_CUDA_DEVICE past the devices: one line naming it and the range");
    fsdp_err_clear();
    unsetenv("FSDPC_CUDA_DEVICE");
    sim_ndev = 0;
    rc = fsdp_cuda_device_create_ops_only(0, &d);
    tap_ok(rc < 0 && one_line(fsdp_err_msg(), "cudaGetDeviceCount", "no CUDA-capable device"),
           "no device: one line naming cudaGetDeviceCount and the runtime's reason");
    fsdp_err_clear();
    sim_reset();
    rc = fsdp_device_create("cuda", 0, &d);
#if HAVE_CUDA
    const char *want = "has the CUDA toolkit but not the kernels";
#else
    const char *want = "not a device of this build";
#endif
    tap_ok(rc == FSDP_ERR_UNSUPPORTED && one_line(fsdp_err_msg(), "'cuda'", want) &&
               sim_live() == live && sim_mallocs == 0,
           "fsdp_device_create(\"cuda\") is refused (%s), touching nothing", want);
    fsdp_err_clear();
    tap_ok(sim_live() == live, "every stream and allocation went back (%d live, %d before)",
           sim_live(), live);
}

/* pieces: aligned, named, counted, reused first fit, merged; one chunk */
static void test_arena(struct fsdp_device *d)
{
    void *a = d->ops->alloc(d, 3000, "a"), *b = d->ops->alloc(d, 1000, "b");
    tap_ok(a && b && aligned(a) && aligned(b) && (char *)b == (char *)a + 3072,
           "pieces are 256-byte aligned and packed (b at a + %td)", (char *)b - (char *)a);
    tap_ok(sim_mallocs == 1 && sim_used[0] == ((size_t)1 << 30),
           "the arena grew once, by a 1 GiB chunk (%d cudaMalloc, %zu bytes)", sim_mallocs,
           sim_used[0]);
    struct fsdp_device_buffer bufs[4];
    size_t n = d->ops->buffers(d, bufs, 4);
    tap_ok(n == 2 && strcmp(bufs[0].name, "a") == 0 && bufs[0].bytes == 3000 &&
               strcmp(bufs[1].name, "b") == 0 && bufs[1].bytes == 1000,
           "the live buffers by name and requested size (%zu)", n);
    tap_ok(d->stats.bytes_now == 4000 && d->stats.bytes_peak == 4000, "4000 bytes counted");
    tap_ok(d->ops->memset(d, a, 0xff, 1000, NULL) == 0 && d->ops->synchronize(d, NULL) == 0,
           "a filled with 0xff");
    /* a copy that reads a is still queued when a is freed and its piece
     * handed out again: the new owner's zeroing must come after it */
    unsigned char *h = d->ops->host_alloc(d, 1024), back[1024];
    sim_hold(d->stream, SIM_SLOW);
    d->ops->copy(d, h, a, 1000, FSDP_COPY_D2H, NULL);
    d->ops->free(d, a);
    int syncs = sim_device_syncs;
    void *c = d->ops->alloc(d, 512, "c");
    int read_old = all_bytes(h, 0xff, 1000);
    tap_ok(sim_device_syncs == syncs + 1 && read_old,
           "reusing a piece freed since the last drain drains the device first (the queued "
           "copy read the old contents)");
    d->ops->copy(d, back, c, 512, FSDP_COPY_D2H, NULL);
    tap_ok(c == a && all_bytes(back, 0, 512), "a freed piece is reused first fit, zeroed");
    d->ops->host_free(d, h);
    tap_ok(d->stats.bytes_now == 1512 && d->stats.bytes_peak == 4000 &&
               d->ops->buffers(d, bufs, 4) == 2,
           "a free is counted, the peak kept");
    d->ops->free(d, c);
    d->ops->free(d, b);
    syncs = sim_device_syncs;
    d->ops->synchronize(d, NULL);
    void *e = d->ops->alloc(d, 4096, "e");
    tap_ok(e == a && sim_device_syncs == syncs + 1,
           "freed neighbours merge; after a drain, reuse needs none");
    void *big = d->ops->alloc(d, (size_t)1 << 30, "bigger than the chunk's rest");
    tap_ok(big && aligned(big) && sim_mallocs == 2 && sim_used[0] == ((size_t)2 << 30),
           "a request past the chunk's rest grows the arena by its own size (%d cudaMalloc, "
           "%zu bytes)",
           sim_mallocs, sim_used[0]);
    d->ops->free(d, big);
    d->ops->free(d, e);
    tap_ok(d->stats.bytes_now == 0 && d->ops->buffers(d, bufs, 4) == 0, "nothing live");
}

/* Every stream slow: a new piece must be zero before alloc returns, not
 * when its zeroing gets round to it. */
static void test_zeroing(void)
{
    struct fsdp_device *d = NULL;
    sim_lazy_streams = 1;
    if (!tap_ok(fsdp_cuda_device_create_ops_only(0, &d) == 0, "a device on slow streams")) {
        return;
    }
    void *x = d->ops->alloc(d, 4096, "x");
    unsigned char back[4096];
    d->ops->copy(d, back, x, sizeof(back), FSDP_COPY_D2H, NULL);
    tap_ok(x && all_bytes(back, 0, sizeof(back)),
           "a new piece is zero when the compute stream first reads it");
    d->ops->free(d, x);
    fsdp_cuda_device_destroy(d);
    sim_lazy_streams = 0;
}

static void test_memory(void)
{
    struct fsdp_device *d = NULL;
    sim_capacity = (size_t)4 << 30; /* host memory only as touched */
    if (!tap_ok(fsdp_cuda_device_create_ops_only(0, &d) == 0, "device 0 created")) {
        return;
    }
    test_arena(d);
    fsdp_cuda_device_destroy(d);
    tap_ok(sim_used[0] == 0, "the arena went back with the device");
    test_zeroing();

    sim_capacity = 16 * MiB;
    fsdp_cuda_device_create_ops_only(0, &d);
    int mallocs = sim_mallocs;
    int rc = fsdp_device_reserve(d, 8 * MiB);
    size_t free_b = 0, total_b = 0;
    d->ops->mem_info(d, &free_b, &total_b);
    tap_ok(free_b == 16 * MiB && total_b == 16 * MiB,
           "memory info: the runtime's free plus the arena's unused (%zu of %zu)", free_b, total_b);
    void *p = NULL, *q = NULL;
    rc = rc < 0 ? rc : fsdp_device_alloc(d, 3 * MiB, "weights", &p);
    rc = rc < 0 ? rc : fsdp_device_alloc(d, 5 * MiB, "grads", &q);
    tap_ok(rc == 0 && sim_mallocs == mallocs + 1 && sim_used[0] == 8 * MiB,
           "reserve takes the plan's 8 MiB in one piece; two allocs fill it");
    void *r = NULL;
    rc = fsdp_device_alloc(d, 10 * MiB, "activations", &r);
    tap_ok(rc == FSDP_ERR_NOMEM && r == NULL &&
               one_line(fsdp_err_msg(), "activations needs 10485760 bytes",
                        "8388608 of 16777216 free") &&
               strstr(fsdp_err_msg(), "cuda:0"),
           "out of memory: one line with the buffer, the bytes and the free memory");
    tap_diag("%s", fsdp_err_msg());
    fsdp_err_clear();
    tap_ok(cudaGetLastError() == cudaSuccess && d->stats.bytes_now == 8 * MiB,
           "the runtime's out-of-memory error was taken (a later check does not see it)");
    rc = fsdp_device_reserve(d, 32 * MiB);
    tap_ok(rc == FSDP_ERR_NOMEM && one_line(fsdp_err_msg(), "reserves 33554432 bytes", "free"),
           "a plan past the memory: one line with its size and the free memory");
    fsdp_err_clear();
    unsigned char *h = d->ops->host_alloc(d, 4096);
    tap_ok(h && all_bytes(h, 0, 4096), "pinned host memory is zeroed");
    d->ops->host_free(d, h);
    d->ops->free(d, p);
    d->ops->free(d, q);
    fsdp_cuda_device_destroy(d);
    sim_capacity = (size_t)64 << 20;
}

// ----------------------------------------------------------------------------

/* On the compute stream, held: fill, copy, fill again, copy out. */
static void test_stream_order(struct fsdp_device *d, unsigned char *h, void *x, void *y)
{
    sim_hold(d->stream, 1);
    d->ops->memset(d, x, 1, 4096, NULL);
    d->ops->copy(d, y, x, 4096, FSDP_COPY_D2D, NULL);
    d->ops->memset(d, x, 2, 4096, NULL);
    d->ops->copy(d, h, y, 4096, FSDP_COPY_D2H, NULL);
    tap_ok(sim_pending(d->stream) == 4 && all_bytes(h, 0, 4096),
           "four items queued on the compute stream, none run while it is held");
    sim_hold(d->stream, 0);
    tap_ok(all_bytes(h, 1, 4096), "released: fill, copy, fill, copy out ran in order");
    unsigned char src[64], back[64];
    memset(src, 3, sizeof(src));
    sim_hold(d->stream, 1);
    fsdp_device_write(d, x, src, sizeof(src));
    memset(src, 4, sizeof(src)); /* the caller reuses its buffer at once */
    sim_hold(d->stream, 0);
    fsdp_device_read(d, back, x, sizeof(back));
    tap_ok(all_bytes(back, 3, sizeof(back)), "a write from pageable memory may reuse it at once");
}

/* s1 fills x; s2 copies x out after waiting for s1's event. */
static void test_events(struct fsdp_device *d, unsigned char *h, void *x)
{
    void *s1 = NULL, *s2 = NULL, *ev = NULL;
    int rc = d->ops->stream_create(d, &s1);
    rc = rc < 0 ? rc : d->ops->stream_create(d, &s2);
    rc = rc < 0 ? rc : d->ops->event_create(d, &ev);
    if (!tap_ok(rc == 0, "two streams and an event")) {
        return;
    }
    sim_hold(s1, 1);
    d->ops->memset(d, x, 7, 4096, s1);
    d->ops->event_record(d, ev, s1);
    d->ops->stream_wait(d, s2, ev);
    d->ops->copy(d, h, x, 4096, FSDP_COPY_D2H, s2);
    tap_ok(d->ops->event_query(d, ev) == 0 && sim_pending(s2) == 2 && all_bytes(h, 1, 4096),
           "s2's copy waits for s1's event (query: not yet)");
    sim_hold(s1, 0);
    tap_ok(d->ops->event_query(d, ev) == 1 && all_bytes(h, 7, 4096),
           "s1 released: the event is done, then s2's copy ran");
    sim_hold(s1, 1);
    d->ops->memset(d, x, 9, 4096, s1);
    d->ops->copy(d, h, x, 4096, FSDP_COPY_D2H, s2);
    tap_ok(all_bytes(h, 7, 4096), "without the wait s2 runs ahead (the simulation sees a race)");
    sim_hold(s1, 0);
    long waits = d->stats.host_waits, d2h = d->stats.d2h_copies;
    d->ops->event_record(d, ev, s1);
    d->ops->event_synchronize(d, ev);
    d->ops->synchronize(d, s2);
    sim_hold(s2, SIM_SLOW);
    d->ops->memset(d, x, 5, 4096, s2);
    d->ops->copy(d, h, x, 4096, FSDP_COPY_D2H, s2);
    d->ops->synchronize(d, NULL);
    tap_ok(all_bytes(h, 5, 4096), "a synchronize of no stream waits for every stream");
    sim_hold(s2, 0);
    fsdp_device_read(d, h, x, 16);
    tap_ok(d->stats.host_waits == waits + 4 && d->stats.d2h_copies == d2h + 2,
           "host waits: event, stream, device, a read (4); device-to-host copies: 2");
    d->ops->event_destroy(d, ev);
    d->ops->stream_destroy(d, s2);
    d->ops->stream_destroy(d, s1);
}

static void test_errors(struct fsdp_device *d, unsigned char *h, void *x)
{
    void *ev = NULL;
    d->ops->event_create(d, &ev);
    sim_fail_call = "cudaEventRecord";
    sim_fail_error = cudaErrorInvalidResourceHandle;
    int rc = d->ops->event_record(d, ev, NULL);
    tap_ok(rc == FSDP_ERR_BACKEND &&
               one_line(fsdp_err_msg(), "cudaEventRecord failed", "invalid resource handle"),
           "an error of one call: one line naming it and the runtime's string");
    tap_diag("%s", fsdp_err_msg());
    fsdp_err_clear();
    sim_sticky = cudaErrorIllegalAddress;
    rc = fsdp_device_read(d, h, x, 64);
    tap_ok(rc == FSDP_ERR_BACKEND &&
               one_line(fsdp_err_msg(), "cuda device 0: cudaMemcpyAsync failed",
                        "an illegal memory access was encountered"),
           "a sticky error surfaces at the next call, named");
    tap_diag("%s", fsdp_err_msg());
    fsdp_err_clear();
    tap_ok(d->ops->event_query(d, ev) < 0 && d->ops->alloc(d, 64, "after the fault") == NULL,
           "and every later call fails");
    fsdp_err_clear();
    sim_sticky = cudaSuccess;
    d->ops->event_destroy(d, ev);
}

static void test_work(void)
{
    struct fsdp_device *d = NULL;
    int live = sim_live();
    if (!tap_ok(fsdp_cuda_device_create_ops_only(0, &d) == 0, "device 0 created")) {
        return;
    }
    unsigned char *h = d->ops->host_alloc(d, 4096);
    void *x = NULL, *y = NULL;
    fsdp_device_alloc(d, 4096, "x", &x);
    fsdp_device_alloc(d, 4096, "y", &y);
    test_stream_order(d, h, x, y);
    test_events(d, h, x);
    tap_ok(sim_legacy_uses == 0 && sim_timed_events == 0 && sim_blocking_streams == 0,
           "nothing ran on the legacy default stream; events untimed, streams non-blocking");
    tap_ok(sim_bad_calls == 0 && sim_hangs == 0,
           "every copy's kind matched its pointers; no wait would have hung");
    test_errors(d, h, x);
    d->ops->free(d, x);
    d->ops->free(d, y);
    d->ops->host_free(d, h);
    fsdp_cuda_device_destroy(d);
    tap_ok(sim_live() == live, "streams, events and memory all went back");
}

/* The data sheet's dense peak by the runtime's name and the weights'
 * dtype; a GPU not in the table has none (and says so). */
static void test_peak(void)
{
    struct fsdp_device *d = NULL;
    if (!tap_ok(fsdp_cuda_device_create_ops_only(0, &d) == 0, "device 0 created")) {
        return;
    }
    static const struct {
        const char *name;
        enum fsdp_dtype dt;
        int tf32;
        double want;
    } cases[] = {
        {"NVIDIA H200", FSDP_BF16, 0, 989.4e12},
        {"NVIDIA H200", FSDP_F32, 0, 66.9e12},
        {"NVIDIA H200", FSDP_F32, 1, 494.7e12},
        {"NVIDIA H100 PCIe", FSDP_F16, 0, 756.5e12},
        {"NVIDIA H100 80GB HBM3", FSDP_BF16, 0, 989.4e12},
        {"NVIDIA A100-SXM4-80GB", FSDP_BF16, 0, 312e12},
        {"Imaginary GPU", FSDP_BF16, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        double f = -1;
        char what[256] = "";
        snprintf(sim_name, sizeof(sim_name), "%s", cases[i].name);
        setenv("FSDPC_CUDA_TF32", cases[i].tf32 ? "1" : "0", 1);
        int rc = d->ops->peak_flops(d, cases[i].dt, &f, what, sizeof(what));
        int ok = rc == 0 && f == cases[i].want &&
                 (f > 0 ? strstr(what, cases[i].name) != NULL
                        : strstr(what, "--peak-flops") && strstr(what, "sm_90"));
        tap_ok(ok, "peak of %s, %s weights%s: %.1f TFLOP/s (%s)", cases[i].name,
               fsdp_dtype_name(cases[i].dt), cases[i].tf32 ? ", TF32" : "", f / 1e12, what);
    }
    unsetenv("FSDPC_CUDA_TF32");
    fsdp_cuda_device_destroy(d);
}

int main(void)
{
    unsetenv("FSDPC_CUDA_DEVICE");
    test_pick();
    sim_reset();
    test_memory();
    sim_reset();
    test_work();
    sim_reset();
    test_peak();
    return tap_done();
}
