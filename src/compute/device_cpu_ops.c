/*
 * device_cpu_ops.c - the CPU device's ops (device.h): host memory from the
 * pre-faulting allocator, memmove for copies, one in-order stream (the
 * calling thread), events that are always complete; its kernel table is
 * device_cpu.c's. device_guarded.c wraps these ops behind its guard.
 */
#include "config.h"
#include "compute/device.h"
#include "compute/device_impl.h"
#include "core/error.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// ops

/* Each block starts with a 64-byte header holding its size, for the counts. */
#define CPU_HDR 64

static void *cpu_alloc(struct fsdp_device *d, size_t bytes, const char *name)
{
    (void)name;
    unsigned char *p = fsdp_calloc(bytes + CPU_HDR);
    if (!p) {
        return NULL;
    }
    memcpy(p, &bytes, sizeof(bytes));
    fsdp_device_count_alloc(d, (long long)bytes);
    return p + CPU_HDR;
}

static void cpu_free(struct fsdp_device *d, void *p)
{
    if (!p) {
        return;
    }
    unsigned char *b = (unsigned char *)p - CPU_HDR;
    size_t bytes;
    memcpy(&bytes, b, sizeof(bytes));
    fsdp_device_count_alloc(d, -(long long)bytes);
    fsdp_free(b);
}

static int cpu_copy(struct fsdp_device *d, void *dst, const void *src, size_t bytes,
                    enum fsdp_copy_dir dir, void *stream)
{
    (void)stream;
    if (dir == FSDP_COPY_D2H) {
        d->stats.d2h_copies++;
    }
    if (bytes > 0) {
        memmove(dst, src, bytes);
    }
    return 0;
}

static int cpu_memset(struct fsdp_device *d, void *p, int value, size_t bytes, void *stream)
{
    (void)d;
    (void)stream;
    if (bytes > 0) {
        memset(p, value, bytes);
    }
    return 0;
}

static int cpu_stream_create(struct fsdp_device *d, void **stream)
{
    (void)d;
    *stream = NULL; /* one in-order stream: the calling thread */
    return 0;
}

static void cpu_stream_destroy(struct fsdp_device *d, void *stream)
{
    (void)d;
    (void)stream;
}

static int cpu_synchronize(struct fsdp_device *d, void *stream)
{
    (void)stream;
    d->stats.host_waits++;
    return 0; /* kernels return when done */
}

/* An event is a token: everything recorded before it is already done. */
static int cpu_event_create(struct fsdp_device *d, void **ev)
{
    (void)d;
    *ev = malloc(1);
    return *ev ? 0 : fsdp_err(FSDP_ERR_NOMEM, "device event");
}

static void cpu_event_destroy(struct fsdp_device *d, void *ev)
{
    (void)d;
    free(ev);
}

static int cpu_event_record(struct fsdp_device *d, void *ev, void *stream)
{
    (void)d;
    (void)ev;
    (void)stream;
    return 0;
}

static int cpu_stream_wait(struct fsdp_device *d, void *stream, void *ev)
{
    (void)d;
    (void)stream;
    (void)ev;
    return 0;
}

static int cpu_event_query(struct fsdp_device *d, void *ev)
{
    (void)d;
    (void)ev;
    return 1;
}

static int cpu_event_synchronize(struct fsdp_device *d, void *ev)
{
    (void)ev;
    d->stats.host_waits++;
    return 0;
}

static void *cpu_host_alloc(struct fsdp_device *d, size_t bytes)
{
    (void)d;
    return fsdp_calloc(bytes);
}

static void cpu_host_free(struct fsdp_device *d, void *p)
{
    (void)d;
    fsdp_free(p);
}

static int cpu_mem_info(struct fsdp_device *d, size_t *free_bytes, size_t *total_bytes)
{
    (void)d;
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    *total_bytes = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
    *free_bytes = avail > 0 && page > 0 ? (size_t)avail * (size_t)page : 0;
    return 0;
}

const struct fsdp_device_ops fsdp_cpu_device_ops = {
    .size = sizeof(struct fsdp_device_ops),
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .synchronize = cpu_synchronize,
    .memset = cpu_memset,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait = cpu_stream_wait,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_synchronize,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .mem_info = cpu_mem_info,
    .buffers = NULL,
};

int fsdp_cpu_device_init(struct fsdp_device *d, int index)
{
    *d = (struct fsdp_device){
        .ops = &fsdp_cpu_device_ops,
        .k = fsdp_cpu_kernels(),
        .mem = FSDP_MEM_HOST,
        .index = index,
    };
    return 0;
}
