/*
 * matmul_cuda.h - the cuda device's linear layer through cuBLASLt
 * (matmul_cuda.c): kernels.h's fsdp_cpu_matmul_forward and _backward on
 * device memory, with the same outputs and the same accumulation rules,
 * for weights (and the forward's bias) stored as f32, bf16 or f16.
 *
 *   forward:  out = (residual ? residual : 0) + inp @ weight^T + bias
 *   backward: with G = alpha * dout,
 *             dinp = G @ weight (overwrites, or adds when accumulate_dinp)
 *             dweight += G^T @ inp;  dbias += column sums of G
 *
 * inp (forward and backward) is an activation in it and the forward's
 * out one in ot (FSDP_F32 or FSDP_BF16: a bf16 out is the f32 result
 * rounded to nearest even; a call with a residual has ot f32); gradients
 * and residuals are f32. bias, dinp, dweight, dbias and residual may be
 * NULL as on the CPU, and residual may equal out. With a 16-bit pt the
 * operand that meets the weight (inp in the forward, dout for dinp) is
 * rounded to pt first (a bf16 inp with bf16 weights already is) and the
 * product is 16-bit x 16-bit with f32 sums and an f32 result, as
 * PyTorch's autocast computes; the weight gradient meets no 16-bit
 * operand (a bf16 inp is widened exactly) and stays f32.
 *
 * Each call enqueues its work on stream (a cudaStream_t; NULL: the
 * legacy default stream, which the device never uses) and returns 0, or a
 * negative code with one fsdp_err line naming the cuBLASLt or CUDA call
 * and its status.
 */
#ifndef FSDP_COMPUTE_CUDA_MATMUL_CUDA_H
#define FSDP_COMPUTE_CUDA_MATMUL_CUDA_H

#include "compute/device.h"

#include <stddef.h>

/* A cuBLASLt handle, its workspace and staging buffers (device memory
 * from d, named; the staging bounded, 64 MiB), and the cached plans: one per (shape, types,
 * epilogue, pointer alignments), made on first use; a later call of the same shape allocates
 * nothing. One per device, not for concurrent use: calls on different streams must be ordered by
 * the caller, as they share the staging buffer. */
struct fsdp_cuda_blas;

int fsdp_cuda_blas_create(struct fsdp_device *d, struct fsdp_cuda_blas **out);
void fsdp_cuda_blas_destroy(struct fsdp_cuda_blas *b);
/* Plans made so far (heuristic queries), for tests and logs. */
unsigned long fsdp_cuda_blas_plans_made(const struct fsdp_cuda_blas *b);
/* The most bytes of staging the products take (0: the default, 64 MiB);
 * a product that would stage more runs in tiles of rows (matmul_cuda.c).
 * A staging buffer already larger is freed. For tests. */
void fsdp_cuda_blas_set_stage_limit(struct fsdp_cuda_blas *b, size_t bytes);

int fsdp_cuda_matmul_forward(struct fsdp_cuda_blas *b, /* the device's */
                             void *out,                /* (N, OC) of ot */
                             enum fsdp_dtype ot,       /* FSDP_F32 or FSDP_BF16 */
                             const void *inp,          /* (N, C) of it */
                             enum fsdp_dtype it,       /* FSDP_F32 or FSDP_BF16 */
                             const void *weight,       /* (OC, C) of pt */
                             const void *bias,         /* (OC) of pt, or NULL */
                             enum fsdp_dtype pt,       /* FSDP_F32, FSDP_BF16 or FSDP_F16 */
                             const float *residual,    /* (N, OC), or NULL; may be out */
                             size_t N, size_t C, size_t OC, void *stream);

int fsdp_cuda_matmul_backward(struct fsdp_cuda_blas *b, /* the device's */
                              float *dinp,              /* (N, C), or NULL */
                              float *dweight,           /* (OC, C), or NULL */
                              float *dbias,             /* (OC), or NULL */
                              const float *dout,        /* (N, OC) */
                              const void *inp,          /* (N, C) of it */
                              enum fsdp_dtype it,       /* FSDP_F32 or FSDP_BF16 */
                              const void *weight,       /* (OC, C) of pt */
                              enum fsdp_dtype pt, size_t N, size_t C, size_t OC, float alpha,
                              int accumulate_dinp, void *stream);

#endif
