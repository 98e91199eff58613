/*
 * attention_cuda.h - causal attention on the GPU (attention.cu), callable
 * from C: the multi-head and grouped-query forward and backward of
 * kernels.h's fsdp_cpu_attention_* and fsdp_cpu_gqa_attention_*, and its
 * one-position decode fsdp_cpu_attention_decode, with the same arguments,
 * the same buffer layouts and the same overwrite rules, on device memory.
 * Each enqueues its work on stream (a cudaStream_t; NULL: the default
 * stream) and returns; launch errors are the caller's to collect.
 *
 * qkv rows hold [q (NH heads) | k (NKV) | v (NKV)], each head hs wide; out
 * (B, T, NH hs); lse (B, NH, T), the scores' row log-sum-exp that the
 * backward recomputes the probabilities from; the backward overwrites every
 * element of dqkv. Query head h reads key/value head h / (NH / NKV) in
 * place. No (T, T) matrix is ever stored and the backward has no atomics:
 * its sums run in an order fixed by the shapes, so it gives the same bits
 * on every run.
 *
 * The scratch these kernels need is 0 floats (the size functions say so;
 * scratch may be NULL), and decode's scores buffer is not used: the
 * softmax is online, in registers and shared memory. hs is at most
 * FSDP_CUDA_ATTENTION_MAX_HS; past it the outputs are filled with NaN
 * rather than left stale, and the device table must refuse the model.
 */
#ifndef FSDP_COMPUTE_CUDA_ATTENTION_CUDA_H
#define FSDP_COMPUTE_CUDA_ATTENTION_CUDA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* the widest head the kernels hold in registers (4 columns a lane) */
#define FSDP_CUDA_ATTENTION_MAX_HS 128

size_t fsdp_cuda_attention_scratch_floats(int T);
void fsdp_cuda_attention_forward(float *out,       /* (B, T, C) */
                                 float *lse,       /* (B, NH, T) */
                                 float *scratch,   /* unused, may be NULL */
                                 const float *qkv, /* (B, T, 3C) */
                                 int B, int T, int C, int NH, void *stream);
/* dqkv (B, T, 3C) is overwritten */
void fsdp_cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int C, int NH,
                                  void *stream);

size_t fsdp_cuda_gqa_attention_scratch_floats(int T, int NH, int NKV, int hs);
void fsdp_cuda_gqa_attention_forward(float *out, float *lse, float *scratch, const float *qkv,
                                     int B, int T, int NH, int NKV, int hs, void *stream);
void fsdp_cuda_gqa_attention_backward(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *out, const float *lse, int B,
                                      int T, int NH, int NKV, int hs, void *stream);
/* The same with qkv and out stored as bf16 (bf16 1) or f32 (0), converted
 * in registers as they are loaded and stored; lse, dout, dqkv f32. */
void fsdp_cuda_gqa_attention_forward_at(void *out, float *lse, float *scratch, const void *qkv,
                                        int bf16, int B, int T, int NH, int NKV, int hs,
                                        void *stream);
void fsdp_cuda_gqa_attention_backward_at(float *dqkv, float *scratch, const float *dout,
                                         const void *qkv, const void *out, const float *lse,
                                         int bf16, int B, int T, int NH, int NKV, int hs,
                                         void *stream);

/* q (NH hs) against n cached rows of kcache and vcache (NKV heads a row,
 * row stride ld floats); out (NH hs); scores: unused, may be NULL */
void fsdp_cuda_attention_decode(float *out, float *scores, const float *q, const float *kcache,
                                const float *vcache, int n, int NH, int NKV, int hs, int ld,
                                void *stream);

#ifdef __cplusplus
}
#endif

#endif
