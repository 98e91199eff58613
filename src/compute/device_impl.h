/*
 * device_impl.h - what the devices of the compute layer share inside it
 * (device.c, device_cpu.c, device_guarded.c, cuda/device_cuda.c); nothing
 * outside includes it.
 */
#ifndef FSDP_COMPUTE_DEVICE_IMPL_H
#define FSDP_COMPUTE_DEVICE_IMPL_H

#include "compute/device.h"

/* The CPU device's ops, which the guarded device wraps. */
extern const struct fsdp_device_ops fsdp_cpu_device_ops;

/* Fills d as a CPU device of ordinal index. */
int fsdp_cpu_device_init(struct fsdp_device *d, int index);
/* Fills d as a guarded device (device_guarded.c). */
int fsdp_guarded_device_init(struct fsdp_device *d, int index);
void fsdp_guarded_device_fini(struct fsdp_device *d);
/* Fills d as a cuda device (cuda/device_cuda.c, CUDA builds only); refused
 * until its kernel table is built. */
int fsdp_cuda_device_init(struct fsdp_device *d, int index);
/* GPUs visible to this process (0 when none or on an error). */
int fsdp_cuda_visible(void);
void fsdp_cuda_device_fini(struct fsdp_device *d);

/* Adds delta bytes to the device's allocation counts. */
static inline void fsdp_device_count_alloc(struct fsdp_device *d, long long delta)
{
    d->stats.bytes_now = (size_t)((long long)d->stats.bytes_now + delta);
    if (d->stats.bytes_now > d->stats.bytes_peak) {
        d->stats.bytes_peak = d->stats.bytes_now;
    }
}

#endif
