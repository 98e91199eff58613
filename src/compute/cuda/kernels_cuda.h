/*
 * kernels_cuda.h - the CUDA kernels' host entry points, callable from C.
 * Each is kernels.h's fsdp_cpu_* kernel of the same name, with the same
 * shapes and the same accumulate-or-overwrite rule, on device memory, and
 * enqueues its work on stream (a cudaStream_t; NULL: the default stream)
 * and returns. Launch errors are the caller's to collect
 * (cudaGetLastError), once per step.
 *
 * The weight gradients of the norms are summed without atomics: each
 * block of rows writes its partial column sums to scratch, and a second
 * kernel adds the partials in order, so the result depends on (N, C)
 * only. scratch is fsdp_cuda_norm_scratch_floats(N, C) floats of device
 * memory.
 *
 * The sources (*.cu) compile with nvcc for the GPU and, under the host
 * emulation of emu.h, with a C++ compiler for the tests.
 */
#ifndef FSDP_COMPUTE_CUDA_KERNELS_CUDA_H
#define FSDP_COMPUTE_CUDA_KERNELS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "compute/kernels.h" /* struct fsdp_adamw_params */

// ----------------------------------------------------------------------------
// norms (norms.cu)

/* Floats of scratch the norm backwards need: (row blocks, 2 C). */
size_t fsdp_cuda_norm_scratch_floats(size_t N, size_t C);

/* keep (N, C) gets a copy of inp, or is NULL */
void fsdp_cuda_rmsnorm_forward(float *out, float *rstd, float *keep, const float *inp,
                               const float *weight, size_t N, size_t C, float eps, void *stream);
/* The same on bf16 storage (inp, weight, out, keep), f32 sums and rstd:
 * out is the f32 result rounded to bf16. */
void fsdp_cuda_rmsnorm_forward_bf16(uint16_t *out, float *rstd, uint16_t *keep,
                                    const uint16_t *inp, const uint16_t *weight, size_t N,
                                    size_t C, float eps, void *stream);
/* dinp += ..., dweight += ... */
void fsdp_cuda_rmsnorm_backward(float *dinp, float *dweight, float *scratch, const float *dout,
                                const float *inp, const float *weight, const float *rstd, size_t N,
                                size_t C, void *stream);
void fsdp_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *weight, const float *bias, size_t N, size_t C,
                                 float eps, void *stream);
/* The forwards with out and inp each stored as bf16 (its flag 1) or f32
 * (0), converted in registers; weight, bias, keep and statistics f32. */
void fsdp_cuda_layernorm_forward_at(void *out, int obf16, float *mean, float *rstd, const void *inp,
                                    int ibf16, const float *weight, const float *bias, size_t N,
                                    size_t C, float eps, void *stream);
void fsdp_cuda_rmsnorm_forward_at(void *out, int obf16, float *rstd, float *keep, const void *inp,
                                  int ibf16, const float *weight, size_t N, size_t C, float eps,
                                  void *stream);
/* dinp += ..., dweight += ..., dbias += ... */
void fsdp_cuda_layernorm_backward(float *dinp, float *dweight, float *dbias, float *scratch,
                                  const float *dout, const float *inp, const float *weight,
                                  const float *mean, const float *rstd, size_t N, size_t C,
                                  void *stream);
/* The backwards with inp stored as bf16 (abf16 1) or f32 (0), loaded in
 * registers; everything else f32. */
void fsdp_cuda_rmsnorm_backward_at(float *dinp, float *dweight, float *scratch, const float *dout,
                                   const void *inp, int abf16, const float *weight,
                                   const float *rstd, size_t N, size_t C, void *stream);
void fsdp_cuda_layernorm_backward_at(float *dinp, float *dweight, float *dbias, float *scratch,
                                     const float *dout, const void *inp, int abf16,
                                     const float *weight, const float *mean, const float *rstd,
                                     size_t N, size_t C, void *stream);

// ----------------------------------------------------------------------------
// element-wise (elementwise.cu)

void fsdp_cuda_gelu_forward(float *out, const float *inp, size_t n, void *stream);
/* dinp = dout * gelu'(inp); dinp may equal dout */
void fsdp_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                             void *stream);
void fsdp_cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n,
                              void *stream);
/* overwrites dgate and dup */
void fsdp_cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, size_t n, void *stream);
/* GELU and SwiGLU on bf16 storage: every buffer bf16, compute in f32, each
 * result the f32 kernel's rounded to bf16 */
void fsdp_cuda_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, size_t n, void *stream);
void fsdp_cuda_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
                                  size_t n, void *stream);
void fsdp_cuda_swiglu_forward_bf16(uint16_t *out, const uint16_t *gate, const uint16_t *up,
                                   size_t n, void *stream);
void fsdp_cuda_swiglu_backward_bf16(uint16_t *dgate, uint16_t *dup, const uint16_t *dout,
                                    const uint16_t *gate, const uint16_t *up, size_t n,
                                    void *stream);
/* The backwards from bf16 saved activations with f32 gradients (dinp may
 * equal dout; dgate, dup overwritten): the f32 kernels' results from the
 * widened inputs. */
void fsdp_cuda_gelu_backward_act16(float *dinp, const uint16_t *inp, const float *dout, size_t n,
                                   void *stream);
void fsdp_cuda_swiglu_backward_act16(float *dgate, float *dup, const float *dout,
                                     const uint16_t *gate, const uint16_t *up, size_t n,
                                     void *stream);
/* in place on the q and k heads of qkv (B, T, (NH + 2 NKV) hs); cos_t, sin_t (T, hs / 2) */
void fsdp_cuda_rope_forward(float *qkv, const float *cos_t, const float *sin_t, int B, int T,
                            int NH, int NKV, int hs, void *stream);
void fsdp_cuda_rope_backward(float *dqkv, const float *cos_t, const float *sin_t, int B, int T,
                             int NH, int NKV, int hs, void *stream);
void fsdp_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream);
void fsdp_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream);

// ----------------------------------------------------------------------------
// optimizer (optim.cu)

void fsdp_cuda_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                            const struct fsdp_adamw_params *hp, int decay, float grad_scale,
                            void *stream);

// ----------------------------------------------------------------------------
// loss (loss.cu): one block per row; the kept-row count is the host's

void fsdp_cuda_crossentropy_forward(float *losses, float *stats, const float *logits,
                                    const int32_t *targets, size_t N, size_t V,
                                    int32_t ignore_index, void *stream);
void fsdp_cuda_crossentropy_backward(float *dlogits, const float *logits, const float *stats,
                                     const int32_t *targets, size_t N, size_t V,
                                     int32_t ignore_index, float dscale, void *stream);
void fsdp_cuda_crossentropy_slice_forward(float *stats, float *target_logit, const float *logits,
                                          const int32_t *targets, size_t N, size_t n, size_t col0,
                                          int32_t ignore_index, int first, void *stream);
void fsdp_cuda_crossentropy_slice_backward(float *dlogits, const float *logits, const float *stats,
                                           const int32_t *targets, size_t N, size_t n,
                                           size_t col0, int32_t ignore_index, float dscale,
                                           void *stream);

// ----------------------------------------------------------------------------
// the small loops (small.cu); bit for bit the CPU's except sumsq

void fsdp_cuda_f32_to_f16(uint16_t *dst, const float *src, size_t n, void *stream);
void fsdp_cuda_f16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream);
void fsdp_cuda_accumulate(float *y, const float *x, size_t n, void *stream);
void fsdp_cuda_accumulate16(float *y, const uint16_t *x, size_t n, int bf16, int accumulate,
                            void *stream);
void fsdp_cuda_scale(float *x, size_t n, float s, void *stream);
void fsdp_cuda_fill(float *x, size_t n, size_t stride, float value, void *stream);
void fsdp_cuda_bias_residual_forward(float *out, const float *inp, const float *bias,
                                     const float *residual, size_t N, size_t C, void *stream);
/* The same with out and residual each stored as bf16 (its flag 1) or f32
 * (0), converted in registers. */
void fsdp_cuda_bias_residual_forward_at(void *out, int obf16, const float *inp, const float *bias,
                                        const void *residual, int rbf16, size_t N, size_t C,
                                        void *stream);
void fsdp_cuda_embed_gather(float *out, const int32_t *tokens, const float *table, size_t N,
                            size_t C, void *stream);
/* rows in order per column: the CPU's sums */
void fsdp_cuda_embed_scatter_add(float *dtable, const float *dout, const int32_t *tokens,
                                 size_t N, size_t C, void *stream);
void fsdp_cuda_xent_losses(float *losses, const float *stats, const float *target_logit,
                           const int32_t *targets, size_t N, int32_t ignore_index, void *stream);
/* *acc (device) += the kept rows' losses, in row order, in double */
void fsdp_cuda_loss_sum(double *acc, const float *losses, const int32_t *targets, size_t N,
                        int32_t ignore_index, void *stream);
/* Doubles of scratch that fsdp_cuda_sumsq needs (whatever n). */
size_t fsdp_cuda_sumsq_scratch_doubles(void);
/* *acc (device) += the sum of squares of x, summed in double in an order
 * fixed by n (not the CPU's order: equal to rounding) */
void fsdp_cuda_sumsq(double *acc, double *scratch, const float *x, size_t n, void *stream);

// ----------------------------------------------------------------------------
// embeddings and the parallel cross-entropy's combination (embed.cu)

/* Parameters in their storage dtype pt (enum fsdp_dtype: f32, f16, bf16),
 * widened exactly; the gradients in the CPU's order of additions. */
void fsdp_cuda_encoder_forward(float *out, const int32_t *tokens, const void *wte,
                               const void *wpe, int pt, int B, int T, int C, void *stream);
void fsdp_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                const int32_t *tokens, int B, int T, int C, void *stream);
void fsdp_cuda_embed_rows_forward(float *out, const int32_t *tokens, const void *wte, size_t v0,
                                  size_t vn, const void *wpe, size_t p0, size_t pn, int pt,
                                  size_t N, int T, int C, void *stream);
void fsdp_cuda_embed_rows_backward(float *dwte, float *dwpe, const float *dout,
                                   const int32_t *tokens, size_t v0, size_t vn, size_t p0,
                                   size_t pn, size_t N, int T, int C, void *stream);
/* out[r,:] = table[tokens[r],:] with the table in pt */
void fsdp_cuda_embed_gather16(float *out, const int32_t *tokens, const void *table, int pt,
                              size_t N, size_t C, void *stream);
void fsdp_cuda_xent_combine(int phase, float *stats, float *zt, float *mx, float *sz, size_t N,
                            int have, void *stream);

#ifdef __cplusplus
}
#endif

#endif
