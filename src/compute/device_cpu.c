/*
 * device_cpu.c - the CPU device (device.h): host memory from the
 * pre-faulting allocator, memcpy for copies, no streams, the fsdp_cpu_*
 * kernel table.
 */
#include "config.h"
#include "compute/device.h"
#include "core/error.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

static const struct fsdp_kernels cpu_kernels = {
    .size = sizeof(struct fsdp_kernels),
    .encoder_forward = fsdp_cpu_encoder_forward,
    .encoder_backward = fsdp_cpu_encoder_backward,
    .layernorm_forward = fsdp_cpu_layernorm_forward,
    .layernorm_backward = fsdp_cpu_layernorm_backward,
    .matmul_forward = fsdp_cpu_matmul_forward,
    .matmul_backward = fsdp_cpu_matmul_backward,
    .attention_scratch_floats = fsdp_cpu_attention_scratch_floats,
    .attention_forward = fsdp_cpu_attention_forward,
    .attention_backward = fsdp_cpu_attention_backward,
    .gelu_forward = fsdp_cpu_gelu_forward,
    .gelu_backward = fsdp_cpu_gelu_backward,
    .crossentropy_forward = fsdp_cpu_crossentropy_forward,
    .crossentropy_backward = fsdp_cpu_crossentropy_backward,
    .adamw_update = fsdp_cpu_adamw_update,
    .sumsq = fsdp_cpu_sumsq,
    .scale = fsdp_cpu_scale,
    .narrow_inplace = fsdp_cpu_narrow_inplace,
    .widen_inplace = fsdp_cpu_widen_inplace,
    .f32_to_bf16 = fsdp_cpu_f32_to_bf16,
    .bf16_to_f32 = fsdp_cpu_bf16_to_f32,
    .f32_to_f16 = fsdp_cpu_f32_to_f16,
    .f16_to_f32 = fsdp_cpu_f16_to_f32,
    .embed_rows_forward = fsdp_cpu_embed_rows_forward,
    .embed_rows_backward = fsdp_cpu_embed_rows_backward,
    .crossentropy_slice_forward = fsdp_cpu_crossentropy_slice_forward,
    .crossentropy_slice_backward = fsdp_cpu_crossentropy_slice_backward,
    .bias_residual_forward = fsdp_cpu_bias_residual_forward,
};

const struct fsdp_kernels *fsdp_cpu_kernels(void)
{
    return &cpu_kernels;
}

static void *cpu_alloc(struct fsdp_device *d, size_t bytes)
{
    (void)d;
    return fsdp_calloc(bytes);
}

static void cpu_free(struct fsdp_device *d, void *p)
{
    (void)d;
    fsdp_free(p);
}

static int cpu_copy(struct fsdp_device *d, void *dst, const void *src, size_t bytes,
                    enum fsdp_copy_dir dir, void *stream)
{
    (void)d;
    (void)dir;
    (void)stream;
    memmove(dst, src, bytes);
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
    (void)d;
    (void)stream;
    return 0; /* kernels return when done */
}

static const struct fsdp_device_ops cpu_ops = {
    .size = sizeof(struct fsdp_device_ops),
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .synchronize = cpu_synchronize,
};

int fsdp_device_create(const char *name, int index, struct fsdp_device **out)
{
    if (strcmp(name, "cpu") != 0) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "device '%s': this build computes on the CPU only (device cpu)", name);
    }
    struct fsdp_device *d = calloc(1, sizeof(*d));
    if (!d) {
        return fsdp_err(FSDP_ERR_NOMEM, "device");
    }
    d->ops = &cpu_ops;
    d->k = &cpu_kernels;
    d->mem = FSDP_MEM_HOST;
    d->index = index;
    *out = d;
    return 0;
}

void fsdp_device_destroy(struct fsdp_device *d)
{
    free(d);
}

uint32_t fsdp_device_mem_cap(const struct fsdp_device *d)
{
    return d->mem == FSDP_MEM_CUDA ? FSDP_CAP_MEM_CUDA : FSDP_CAP_MEM_HOST;
}
