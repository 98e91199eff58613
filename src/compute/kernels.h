/*
 * kernels.h - the compute layer's public API: the GPT-2 building blocks
 * (forward and backward), the loss, the optimizer update, gradient norms and
 * 16-bit casts, on host f32 buffers.
 *
 * Conventions (all kernels):
 *   - tensors are dense, row-major, f32; shapes are given in the comments as
 *     (rows, cols) with N = B * T rows of activations;
 *   - weights are (out_features, in_features) like torch.nn.Linear, so a
 *     linear layer is out = inp @ W^T + b;
 *   - backward kernels ACCUMULATE into parameter gradients (+=) so that
 *     gradient accumulation and tied weights need no extra pass; what they do
 *     to activation gradients is stated per kernel;
 *   - no kernel allocates: scratch space is passed in by the caller and
 *     sized by the matching *_scratch_floats function;
 *   - matrix products go through cblas_sgemm (OpenBLAS); its thread count is
 *     the only parallelism unless the library is built with -fopenmp, or a
 *     caller asks the AdamW update for threads (fsdp_adamw_params.threads).
 * A CUDA implementation of the same operations would sit beside these under
 * the fsdp_cuda_ prefix.
 */
#ifndef FSDP_COMPUTE_KERNELS_H
#define FSDP_COMPUTE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// embeddings

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. Tokens must be in [0, V). */
void fsdp_cpu_encoder_forward(float *out,            /* (B, T, C) */
                              const int32_t *tokens, /* (B, T) */
                              const float *wte,      /* (V, C) */
                              const float *wpe,      /* (>= T, C) */
                              int B, int T, int C);

/* dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. */
void fsdp_cpu_encoder_backward(float *dwte,           /* (V, C) */
                               float *dwpe,           /* (>= T, C) */
                               const float *dout,     /* (B, T, C) */
                               const int32_t *tokens, /* (B, T) */
                               int B, int T, int C);

/*
 * The same embedding when this rank holds only some rows of the tables (the
 * others hold the rest): rows [v0, v0 + vn) of wte and [p0, p0 + pn) of wpe.
 * Row r of the N rows is position r mod T and reads token tokens[r] (which
 * may be any id: rows not held contribute nothing):
 *   out[r,:] = (wte row if held, else 0) + (wpe row if held, else 0)
 * so that the rows summed over the ranks equal fsdp_cpu_encoder_forward's,
 * bit for bit (one addition of the two held rows, the rest adds of zero).
 * The backward adds dout[r,:] into the held rows, rows in order.
 */
void fsdp_cpu_embed_rows_forward(float *out,            /* (N, C) */
                                 const int32_t *tokens, /* (N) */
                                 const float *wte,      /* (vn, C) */
                                 size_t v0, size_t vn,
                                 const float *wpe,      /* (pn, C) */
                                 size_t p0, size_t pn, size_t N, int T, int C);
void fsdp_cpu_embed_rows_backward(float *dwte,           /* (vn, C) */
                                  float *dwpe,           /* (pn, C) */
                                  const float *dout,     /* (N, C) */
                                  const int32_t *tokens, /* (N) */
                                  size_t v0, size_t vn, size_t p0, size_t pn, size_t N, int T,
                                  int C);

// ----------------------------------------------------------------------------
// layer norm (torch.nn.LayerNorm: biased variance, eps inside the sqrt)

/* out = (inp - mean) * rstd * weight + bias per row; saves mean and rstd. */
void fsdp_cpu_layernorm_forward(float *out,          /* (N, C) */
                                float *mean,         /* (N) */
                                float *rstd,         /* (N) */
                                const float *inp,    /* (N, C) */
                                const float *weight, /* (C) */
                                const float *bias,   /* (C) */
                                size_t N, size_t C, float eps);

/* dinp += d(inp); dweight += ..; dbias += ... */
void fsdp_cpu_layernorm_backward(float *dinp,         /* (N, C) */
                                 float *dweight,      /* (C) */
                                 float *dbias,        /* (C) */
                                 const float *dout,   /* (N, C) */
                                 const float *inp,    /* (N, C) */
                                 const float *weight, /* (C) */
                                 const float *mean,   /* (N) */
                                 const float *rstd,   /* (N) */
                                 size_t N, size_t C);

// ----------------------------------------------------------------------------
// linear layer

/*
 * out = residual + inp @ weight^T + bias. bias and residual may be NULL;
 * residual may equal out (accumulate in place). The bias and residual are
 * written first and the product is accumulated onto them by sgemm (beta = 1),
 * so they cost no separate pass.
 */
void fsdp_cpu_matmul_forward(float *out,            /* (N, OC) */
                             const float *inp,      /* (N, C) */
                             const float *weight,   /* (OC, C) */
                             const float *bias,     /* (OC) or NULL */
                             const float *residual, /* (N, OC) or NULL */
                             size_t N, size_t C, size_t OC);

/*
 * With G = alpha * dout:
 *   dinp     = G @ weight        (overwrites, or adds when accumulate_dinp)
 *   dweight += G^T @ inp
 *   dbias   += column sums of G
 * Any of dinp, dweight, dbias may be NULL to skip it.
 */
void fsdp_cpu_matmul_backward(float *dinp,         /* (N, C) */
                              float *dweight,      /* (OC, C) */
                              float *dbias,        /* (OC) */
                              const float *dout,   /* (N, OC) */
                              const float *inp,    /* (N, C) */
                              const float *weight, /* (OC, C) */
                              size_t N, size_t C, size_t OC, float alpha, int accumulate_dinp);

// ----------------------------------------------------------------------------
// causal multi-head self-attention
//
// qkv rows hold [q | k | v], each C = NH * hs wide, head h at columns
// h*hs .. (h+1)*hs of its block (HF GPT-2's split + view). Scores are
// q.k / sqrt(hs), key j > query i is masked, softmax over j <= i, then @ v.
// Only the row log-sum-exp of the scores is saved; backward recomputes the
// probabilities block by block (as flash attention does), so the saved state
// is (B, NH, T) rather than (B, NH, T, T).

/* Floats of scratch the attention kernels need for sequence length T. */
size_t fsdp_cpu_attention_scratch_floats(int T);

void fsdp_cpu_attention_forward(float *out,       /* (B, T, C) */
                                float *lse,       /* (B, NH, T) */
                                float *scratch,   /* fsdp_cpu_attention_scratch_floats(T) */
                                const float *qkv, /* (B, T, 3C) */
                                int B, int T, int C, int NH);

/* dqkv is overwritten. */
void fsdp_cpu_attention_backward(float *dqkv,       /* (B, T, 3C) */
                                 float *scratch,    /* fsdp_cpu_attention_scratch_floats(T) */
                                 const float *dout, /* (B, T, C) */
                                 const float *qkv,  /* (B, T, 3C) */
                                 const float *out,  /* (B, T, C) forward output */
                                 const float *lse,  /* (B, NH, T) */
                                 int B, int T, int C, int NH);

// ----------------------------------------------------------------------------
// element-wise

/* GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void fsdp_cpu_gelu_forward(float *out, const float *inp, size_t n);
/* dinp = dout * gelu'(inp); dinp may equal dout. */
void fsdp_cpu_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* out = a + b; out may equal a or b. */
void fsdp_cpu_residual_forward(float *out, const float *a, const float *b, size_t n);

// ----------------------------------------------------------------------------
// loss

/*
 * Softmax cross-entropy over the rows of logits, fused with its gradient:
 *   losses[i]  = logsumexp(logits[i,:]) - logits[i, targets[i]]
 *   dlogits[i] = dscale * (softmax(logits[i,:]) - onehot(targets[i]))
 * Rows whose target equals ignore_index get loss 0 and a zero gradient row.
 * dlogits may be NULL (no gradient) or equal logits (overwrite in place).
 * *n_kept is the number of other rows and *mean the mean of their losses
 * (torch's reduction='mean'; NaN when no row is kept, as in torch).
 * A target outside [0, V) that is not ignore_index is an error naming it.
 */
int fsdp_cpu_crossentropy_fused(float *losses,          /* (N) */
                                float *dlogits,         /* (N, V) or NULL */
                                const float *logits,    /* (N, V) */
                                const int32_t *targets, /* (N) */
                                size_t N, size_t V, int32_t ignore_index, float dscale,
                                size_t *n_kept, float *mean);

/*
 * The same loss split in two, for a head that computes its logits a row
 * chunk at a time and recomputes them for the backward:
 *   forward   losses[i] as above; stats[i] = (max of row i, sum of
 *             exp(row i - max)), (0, 0) for ignored rows; *n_kept as above
 *             (no mean: the caller sums over its chunks)
 *   backward  dlogits from the same logits and their stats, bit-identical
 *             to the fused kernel's; dlogits may equal logits
 */
int fsdp_cpu_crossentropy_forward(float *losses,          /* (N) */
                                  float *stats,           /* (N, 2) */
                                  const float *logits,    /* (N, V) */
                                  const int32_t *targets, /* (N) */
                                  size_t N, size_t V, int32_t ignore_index, size_t *n_kept);
void fsdp_cpu_crossentropy_backward(float *dlogits,         /* (N, V) */
                                    const float *logits,    /* (N, V) */
                                    const float *stats,     /* (N, 2) */
                                    const int32_t *targets, /* (N) */
                                    size_t N, size_t V, int32_t ignore_index, float dscale);

/*
 * The loss over vocabulary slices, for a head that never holds a whole row
 * of logits: logits (N, n) are columns [col0, col0 + n) of the rows.
 *   slice_forward   first: stats[i] = (max, sum of exp(x - max)) of the
 *                   slice, target_logit[i] = the target's logit when the
 *                   slice holds it, else 0; later slices merge into stats
 *                   (max' = max(max, m), sum' = sum e^(max - max') +
 *                   s e^(m - max')) and set target_logit when they hold the
 *                   target. Ignored rows: (0, 0) and 0 on the first slice,
 *                   untouched after. The loss of row i is then
 *                   max + log(sum) - target_logit.
 *   slice_backward  dlogits of the slice from the final stats: dscale *
 *                   softmax, minus dscale at the target when the slice
 *                   holds it; ignored rows zero. dlogits may equal logits.
 * One slice of all V columns gives crossentropy_forward's statistics and
 * crossentropy_backward's gradient bit for bit.
 */
void fsdp_cpu_crossentropy_slice_forward(float *stats,          /* (N, 2) */
                                         float *target_logit,   /* (N) */
                                         const float *logits,   /* (N, n) */
                                         const int32_t *targets, /* (N) */
                                         size_t N, size_t n, size_t col0, int32_t ignore_index,
                                         int first);
void fsdp_cpu_crossentropy_slice_backward(float *dlogits,         /* (N, n) */
                                          const float *logits,    /* (N, n) */
                                          const float *stats,     /* (N, 2) */
                                          const int32_t *targets, /* (N) */
                                          size_t N, size_t n, size_t col0, int32_t ignore_index,
                                          float dscale);

// ----------------------------------------------------------------------------
// optimizer and gradient utilities

#define FSDP_ADAMW_MAX_THREADS 64

/* torch.optim.AdamW hyper-parameters; step counts from 1. */
struct fsdp_adamw_params {
    float lr;
    float beta1;
    float beta2;
    float eps;
    float weight_decay;
    long step;
    /* host threads the CPU kernel may split a range over (0 or 1: the
     * calling thread only; at most FSDP_ADAMW_MAX_THREADS); the result does
     * not depend on it. Other devices ignore it. */
    int threads;
};

/*
 * One AdamW step on a flat range, with torch's arithmetic:
 *   g = grad * grad_scale            (unscaling and clipping fused here)
 *   p *= 1 - lr * weight_decay        (only when decay != 0)
 *   m = lerp(m, g, 1 - beta1);  v = beta2 v + (1 - beta2) g^2
 *   p -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * each operation rounded to f32 on its own but for three multiply-adds
 * fused on targets with FMA, so an element's result is the same at every
 * offset and for every thread count (src/compute/cpu/adamw.c). One pass
 * over memory: 28 bytes per element.
 */
void fsdp_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                           const struct fsdp_adamw_params *hp, int decay, float grad_scale);

/* Sum of squares of x (partial sums in f32 lanes, blocks added in double). */
double fsdp_cpu_sumsq(const float *x, size_t n);

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (sqrt(sumsq) + 1e-6)). */
float fsdp_cpu_clip_coef(double sumsq, float max_norm);

/* x *= s */
void fsdp_cpu_scale(float *x, size_t n, float s);

// ----------------------------------------------------------------------------
// 16-bit storage <-> f32 compute. Bit-identical to core/dtype.h's scalar
// conversions (round to nearest even, NaN kept quiet, overflow to Inf,
// subnormals kept) but branch-free and vectorised. dst and src must not
// overlap.

void fsdp_cpu_f32_to_bf16(uint16_t *dst, const float *src, size_t n);
void fsdp_cpu_bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void fsdp_cpu_f32_to_f16(uint16_t *dst, const float *src, size_t n);
void fsdp_cpu_f16_to_f32(float *dst, const uint16_t *src, size_t n);

/*
 * The same casts within one buffer, for communication buffers that are
 * their own staging. narrow: the n f32 values at buf become n 16-bit values
 * at the start of buf (bf16 when bf16 is non-zero, else f16); widen: the
 * reverse. The bytes after the 16-bit values are left undefined by narrow.
 */
void fsdp_cpu_narrow_inplace(void *buf, size_t n, int bf16);
void fsdp_cpu_widen_inplace(void *buf, size_t n, int bf16);

// ----------------------------------------------------------------------------
// the Llama family (llama_layers.c; the grouped-query attention in attention.c)

/* RMSNorm (Hugging Face's LlamaRMSNorm): out = weight * (inp * rstd),
 * rstd = 1 / sqrt(mean(inp^2) + eps) per row, saved. */
void fsdp_cpu_rmsnorm_forward(float *out,          /* (N, C) */
                              float *rstd,         /* (N) */
                              const float *inp,    /* (N, C) */
                              const float *weight, /* (C) */
                              size_t N, size_t C, float eps);
/* The same, and keep (N, C) gets a copy of inp in the same pass: the
 * residual that a following product accumulates onto (beta = 1), without
 * a second pass over inp. keep may be NULL. */
void fsdp_cpu_rmsnorm_forward_keep(float *out,          /* (N, C) */
                                   float *rstd,         /* (N) */
                                   float *keep,         /* (N, C) or NULL */
                                   const float *inp,    /* (N, C) */
                                   const float *weight, /* (C) */
                                   size_t N, size_t C, float eps);
/* dinp += d(inp); dweight += ... */
void fsdp_cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                               const float *weight, const float *rstd, size_t N, size_t C);

/* Hugging Face's rope_scaling types: none, "linear" (positions / factor),
 * "llama3" (low frequencies / factor, high ones kept, a smooth ramp
 * between, by wavelength against the original context). */
enum fsdp_rope_type { FSDP_ROPE_NONE = 0, FSDP_ROPE_LINEAR, FSDP_ROPE_LLAMA3 };
struct fsdp_rope_scaling {
    enum fsdp_rope_type type;
    double factor;
    double low_freq_factor, high_freq_factor; /* llama3 */
    double original_context;                  /* llama3: original_max_position_embeddings */
};
/* inv_freq[i] = theta^(-2i/hs), scaled; (hs / 2) values. -1 on a bad hs or theta. */
int fsdp_cpu_rope_inv_freq(float *inv_freq, int hs, double theta,
                           const struct fsdp_rope_scaling *sc);
/* cos/sin of (pos0 + t) * inv_freq[i]: (T, hs / 2) each. */
void fsdp_cpu_rope_table(float *cos_t, float *sin_t, const float *inv_freq, int pos0, int T,
                         int hs);
/* Rotates, in place, the q and k heads of qkv rows [q (NH heads) | k (NKV) |
 * v (NKV)]: pairs (i, i + hs/2) of each head by angle t * f_i
 * (rotate_half). The backward rotates dq and dk back (by -angle). */
void fsdp_cpu_rope_forward(float *qkv, const float *cos_t, const float *sin_t, int B, int T,
                           int NH, int NKV, int hs);
void fsdp_cpu_rope_backward(float *dqkv, const float *cos_t, const float *sin_t, int B, int T,
                            int NH, int NKV, int hs);

/* out = silu(gate) * up; the backward overwrites dgate and dup. */
void fsdp_cpu_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
void fsdp_cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n);

/* Grouped-query causal attention: qkv rows [q (NH heads) | k (NKV) | v
 * (NKV)], each head hs wide, NKV dividing NH; query head h uses key/value
 * head h / (NH / NKV), read in place (never repeated) and once for all the
 * heads of its group. out (B, T, NH * hs), lse (B, NH, T); scratch as
 * fsdp_cpu_gqa_attention_scratch_floats. The backward overwrites dqkv. With
 * NKV = NH it is fsdp_cpu_attention_* (and the scratch is theirs). */
size_t fsdp_cpu_gqa_attention_scratch_floats(int T, int NH, int NKV, int hs);
void fsdp_cpu_gqa_attention_forward(float *out, float *lse, float *scratch, const float *qkv,
                                    int B, int T, int NH, int NKV, int hs);
void fsdp_cpu_gqa_attention_backward(float *dqkv, float *scratch, const float *dout,
                                     const float *qkv, const float *out, const float *lse, int B,
                                     int T, int NH, int NKV, int hs);

// ----------------------------------------------------------------------------
// incremental decoding (decode.c)

/* One query row q [NH heads of hs] against n cached positions: kcache and
 * vcache hold rows of NKV heads (row stride ld floats); query head h reads
 * head h / (NH / NKV); causal by construction (the cache holds only the
 * past and the current position). out (NH * hs); scores (n) scratch. */
void fsdp_cpu_attention_decode(float *out, float *scores, const float *q, const float *kcache,
                               const float *vcache, int n, int NH, int NKV, int hs, int ld);

// ----------------------------------------------------------------------------
// tensor parallelism (layers.c)

/* out = inp + residual + bias (broadcast over rows): the tail of a
 * row-parallel linear layer, whose bias and residual are added once the
 * partial products are summed over the ranks. out may equal inp or
 * residual; bias and residual may be NULL. */
void fsdp_cpu_bias_residual_forward(float *out,            /* (N, C) */
                                    const float *inp,      /* (N, C) */
                                    const float *bias,     /* (C) or NULL */
                                    const float *residual, /* (N, C) or NULL */
                                    size_t N, size_t C);

// ----------------------------------------------------------------------------
// the small loops of the models' embeddings and heads and of the engine
// (small.c): what was once host code over device buffers

/* out[r,:] = table[tokens[r],:], N rows of C. */
void fsdp_cpu_embed_gather(float *out, const int32_t *tokens, const float *table, size_t N,
                           size_t C);
/* dtable[tokens[r],:] += dout[r,:], rows in order. */
void fsdp_cpu_embed_scatter_add(float *dtable, const float *dout, const int32_t *tokens, size_t N,
                                size_t C);
/* y += x */
void fsdp_cpu_accumulate(float *y, const float *x, size_t n);
/* y = (accumulate ? y : 0) + x widened from bf16 (bf16 != 0) or f16 */
void fsdp_cpu_accumulate16(float *y, const uint16_t *x, size_t n, int bf16, int accumulate);
/* *acc += the losses of rows whose target is not ignore_index, in row order, in double. */
void fsdp_cpu_loss_sum(double *acc, const float *losses, const int32_t *targets, size_t N,
                       int32_t ignore_index);
/* losses[r] = stats[2r] + log(stats[2r+1]) - target_logit[r]; 0 when ignored. */
void fsdp_cpu_xent_losses(float *losses, const float *stats, const float *target_logit,
                          const int32_t *targets, size_t N, int32_t ignore_index);
/* The parallel cross-entropy's element-wise steps (device.h xent_combine). */
void fsdp_cpu_xent_combine(int phase, float *stats, float *zt, float *mx, float *sz, size_t N,
                           int have);
/* x[i * stride] = value for i < n */
void fsdp_cpu_fill(float *x, size_t n, size_t stride, float value);

#endif
