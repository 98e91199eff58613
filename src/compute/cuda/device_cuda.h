/*
 * device_cuda.h - the cuda device's host side (device_cuda.c), for the
 * compute layer and its tests; nothing above the compute layer includes
 * it (they name the device "cuda" to fsdp_device_create).
 *
 * Until the device's kernel table is built, fsdp_device_create("cuda")
 * refuses, so that no user gets a device without kernels; the test of the
 * host side (tests/kernels/test_cuda_device.c, against a simulated
 * runtime) makes one here, with d->k NULL.
 */
#ifndef FSDP_COMPUTE_CUDA_DEVICE_CUDA_H
#define FSDP_COMPUTE_CUDA_DEVICE_CUDA_H

#include "compute/device.h"

/* A cuda device without kernels (d->k NULL): its ops only. index as
 * fsdp_device_create's (the ordinal is index modulo the device count, or
 * FSDPC_CUDA_DEVICE). */
int fsdp_cuda_device_create_ops_only(int index, struct fsdp_device **out);
/* Destroys a device made by fsdp_cuda_device_create_ops_only. */
void fsdp_cuda_device_destroy(struct fsdp_device *d);

#endif
