/*
 * device.h - the compute-device seam: where tensors live and what runs on
 * them. A device object (chosen once, by the training layer) carries its
 * memory kind, an allocator, copies between host and device, streams and
 * their synchronisation (no-ops on the CPU), and the kernel table the model
 * and the parallelisms call instead of naming an implementation. The CPU
 * device is the one built here; a CUDA device fills the same table with
 * cuBLASLt and its own kernels, and its memory kind tells the collectives
 * where their buffers are.
 *
 * Kernel semantics are kernels.h's, entry for entry (the CPU table points
 * at the fsdp_cpu_* functions). Tables are written out longhand and only
 * grow at the end.
 */
#ifndef FSDP_COMPUTE_DEVICE_H
#define FSDP_COMPUTE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "compute/kernels.h"

struct fsdp_kernels {
    size_t size; /* sizeof(struct fsdp_kernels) of the implementation */
    void (*encoder_forward)(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                            int B, int T, int C);
    void (*encoder_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens,
                             int B, int T, int C);
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp,
                              const float *weight, const float *bias, size_t N, size_t C,
                              float eps);
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                               const float *inp, const float *weight, const float *mean,
                               const float *rstd, size_t N, size_t C);
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias,
                           const float *residual, size_t N, size_t C, size_t OC);
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout,
                            const float *inp, const float *weight, size_t N, size_t C, size_t OC,
                            float alpha, int accumulate_dinp);
    size_t (*attention_scratch_floats)(int T);
    void (*attention_forward)(float *out, float *lse, float *scratch, const float *qkv, int B,
                              int T, int C, int NH);
    void (*attention_backward)(float *dqkv, float *scratch, const float *dout, const float *qkv,
                               const float *out, const float *lse, int B, int T, int C, int NH);
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *inp, const float *dout, size_t n);
    int (*crossentropy_forward)(float *losses, float *stats, const float *logits,
                                const int32_t *targets, size_t N, size_t V, int32_t ignore_index,
                                size_t *n_kept);
    void (*crossentropy_backward)(float *dlogits, const float *logits, const float *stats,
                                  const int32_t *targets, size_t N, size_t V,
                                  int32_t ignore_index, float dscale);
    void (*adamw_update)(float *param, const float *grad, float *m, float *v, size_t n,
                         const struct fsdp_adamw_params *hp, int decay, float grad_scale);
    double (*sumsq)(const float *x, size_t n);
    void (*scale)(float *x, size_t n, float s);
    void (*narrow_inplace)(void *buf, size_t n, int bf16);
    void (*widen_inplace)(void *buf, size_t n, int bf16);
    void (*f32_to_bf16)(uint16_t *dst, const float *src, size_t n);
    void (*bf16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*f32_to_f16)(uint16_t *dst, const float *src, size_t n);
    void (*f16_to_f32)(float *dst, const uint16_t *src, size_t n);
    void (*embed_rows_forward)(float *out, const int32_t *tokens, const float *wte, size_t v0,
                               size_t vn, const float *wpe, size_t p0, size_t pn, size_t N,
                               int T, int C);
    void (*embed_rows_backward)(float *dwte, float *dwpe, const float *dout,
                                const int32_t *tokens, size_t v0, size_t vn, size_t p0,
                                size_t pn, size_t N, int T, int C);
    void (*crossentropy_slice_forward)(float *stats, float *target_logit, const float *logits,
                                       const int32_t *targets, size_t N, size_t n, size_t col0,
                                       int32_t ignore_index, int first);
    void (*crossentropy_slice_backward)(float *dlogits, const float *logits, const float *stats,
                                        const int32_t *targets, size_t N, size_t n, size_t col0,
                                        int32_t ignore_index, float dscale);
    void (*bias_residual_forward)(float *out, const float *inp, const float *bias,
                                  const float *residual, size_t N, size_t C);
};

struct fsdp_device;

enum fsdp_copy_dir {
    FSDP_COPY_H2D = 0,
    FSDP_COPY_D2H,
    FSDP_COPY_D2D,
};

struct fsdp_device_ops {
    size_t size; /* sizeof(struct fsdp_device_ops) of the implementation */
    const char *name;
    /* Zeroed memory of bytes on the device (pre-faulted on the host); NULL
     * when out of memory. */
    void *(*alloc)(struct fsdp_device *d, size_t bytes);
    void (*free)(struct fsdp_device *d, void *p);
    /* Ordered on stream (NULL: the default one); returns when enqueued. */
    int (*copy)(struct fsdp_device *d, void *dst, const void *src, size_t bytes,
                enum fsdp_copy_dir dir, void *stream);
    int (*stream_create)(struct fsdp_device *d, void **stream);
    void (*stream_destroy)(struct fsdp_device *d, void *stream);
    /* Blocks until everything enqueued on stream (NULL: the device) is done. */
    int (*synchronize)(struct fsdp_device *d, void *stream);
};

struct fsdp_device {
    const struct fsdp_device_ops *ops;
    const struct fsdp_kernels *k;
    enum fsdp_mem mem; /* where its buffers live, for the collectives */
    int index;         /* device ordinal (0 on the CPU) */
    void *impl;
};

/* name "cpu" (the only device of a build without CUDA kernels). index:
 * the device ordinal, from the local rank. */
int fsdp_device_create(const char *name, int index, struct fsdp_device **out);
void fsdp_device_destroy(struct fsdp_device *d);

/* The CPU kernel table (models created without a device use it). */
const struct fsdp_kernels *fsdp_cpu_kernels(void);

/* The backend's memory capability flag (FSDP_CAP_MEM_*) for the device's
 * memory kind. */
uint32_t fsdp_device_mem_cap(const struct fsdp_device *d);

#endif
