/*
 * mem.h - where a buffer lives: host memory, a CUDA device's, or a guarded
 * device's, and the capability flag a collective backend sets for each
 * kind it can take. The compute layer's devices say which kind their
 * memory is (compute/device.h); the backends say which kinds their
 * collectives take (backends/backend.h); the group layer stages what a
 * backend cannot take. Kept here, below both, so neither includes the other.
 */
#ifndef FSDP_CORE_MEM_H
#define FSDP_CORE_MEM_H

enum fsdp_mem {
    FSDP_MEM_HOST = 0,
    FSDP_MEM_CUDA = 1,
    FSDP_MEM_GUARDED = 2, /* a guarded device's (compute/device.h): no backend takes it */
};

/* A backend's capability flags for the memory kinds (FSDP_CAP_* in
 * backends/backend.h holds the others). */
#define FSDP_CAP_MEM_HOST (1u << 0)
#define FSDP_CAP_MEM_CUDA (1u << 1)
#define FSDP_CAP_MEM_GUARDED (1u << 4) /* never set: guarded memory is always staged */

#endif
