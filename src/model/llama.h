/*
 * llama.h - the Llama family's forward and backward over units, on host f32
 * buffers (Hugging Face's LlamaForCausalLM; Qwen2's q/k/v biases with
 * attn_bias; Mistral without a sliding window is the same model).
 *
 * The model owns activations (and the RoPE tables) only. Parameters and
 * their gradients live in per-unit contiguous buffers laid out by the
 * parameter table (llama_spec.h) and owned by the CALLER, who points the
 * model at them with fsdp_llama_set_unit:
 *   unit 0        embed_tokens (V, C)
 *   unit 1 + l    block l
 *   unit 1 + L    norm (+ lm_head (V, C) when untied)
 * A driver runs fsdp_llama_forward_unit for u = 0 .. L+1 and
 * fsdp_llama_backward_unit for u = L+1 .. 0, gathering/reducing between the
 * calls. Tied embeddings work as GPT-2's (gpt2.h): unit L+1 reads unit 0's
 * table and ADDS its gradient into unit 0's gradient, whose own backward
 * adds the lookup's part last. Parameter gradients always accumulate (+=).
 *
 * Block l, with hs = C / NH and rows [q (NH heads) | k (NKV) | v (NKV)]:
 *   qkv = rmsnorm(x) @ [Wq; Wk; Wv]^T (+ [bq; bk; bv]); RoPE on q and k
 *   x  += gqa_attention(qkv) @ Wo^T
 *   h   = rmsnorm(x);  x += (silu(h @ Wg^T) * (h @ Wu^T)) @ Wd^T
 * The packed q/k/v product is one sgemm over the consecutive weights.
 *
 * It runs on the host: a device whose memory is not host memory is refused.
 */
#ifndef FSDP_MODEL_LLAMA_H
#define FSDP_MODEL_LLAMA_H

#include "model/llama_spec.h"
#include "model/lm.h"
#include "model/model.h"
#include "compute/device.h"

#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// parameter views: pointers into one unit buffer (params or grads alike)

/* A block's tensors (shapes: FSDP_LLAMA_BLOCK_TENSORS); the biases are
 * NULL without attn_bias. qw, kw, vw are consecutive, as are qb, kb, vb. */
struct fsdp_llama_block_view {
#define FSDP_LLAMA_X(id, field, suffix, rows, cols, init, decay, tp, bias) void *field;
    FSDP_LLAMA_BLOCK_TENSORS(FSDP_LLAMA_X)
#undef FSDP_LLAMA_X
    enum fsdp_dtype pt; /* parameters: their storage dtype; gradients: f32 */
};

struct fsdp_llama_head_view {
    void *norm;    /* (C) */
    void *lm_head; /* (V, C): unit 0's embed_tokens when tied */
    enum fsdp_dtype pt;
};

// ----------------------------------------------------------------------------
// activations, sized for (max_B, max_T); a smaller batch uses the leading
// part of every tensor with its own (B, T). QKV = (NH + 2 NKV) hs.

/* What one block saves for its backward. */
struct fsdp_llama_block_acts {
    float *rms1;      /* (B, T, C) input_layernorm output */
    float *rms1_rstd; /* (B, T) */
    float *qkv;       /* (B, T, QKV) after RoPE */
    float *atty;      /* (B, T, C) attention output, before o_proj */
    float *att_lse;   /* (B, NH, T) log-sum-exp of each score row */
    float *res2;      /* (B, T, C) residual after attention */
    float *rms2;      /* (B, T, C) post_attention_layernorm output */
    float *rms2_rstd; /* (B, T) */
    float *gate;      /* (B, T, F) gate_proj output */
    float *up;        /* (B, T, F) up_proj output */
    float *h;         /* (B, T, F) silu(gate) * up, down_proj's input */
};

/* With bf16 activations (lm.adt) a block's saved tensors are stored here,
 * the shapes of struct fsdp_llama_block_acts, which the kernels read and
 * write as they are; that struct's pointers to them are NULL but for one
 * f32 working set shared by every block (llama_acts.c: qkv for RoPE, gate
 * and up for their gradients, res2, and with sequence parallelism rms1 and
 * rms2). The norms' rstd and the log-sum-exps stay f32, per block. */
struct fsdp_llama_block_store {
    uint16_t *rms1, *qkv, *atty, *res2, *rms2, *gate, *up, *h;
};

/* One contiguous buffer (act_memory). Checkpointed blocks share one
 * block_acts set that their backward refills from residual[l]. */
struct fsdp_llama_acts {
    uint16_t *residual16; /* (L+1, B, T, C) bf16 activations: the stored residual stream
                             (residual is then its two f32 slots: model/lm.h) */
    float *residual;    /* (L+1, B, T, C): [l] is block l's input, [L] feeds the norm */
    float *lnf;         /* (B, T, C) final norm output */
    float *lnf_rstd;    /* (B, T) */
    float *head_logits; /* (head_rows, V) one chunk of logits, then their gradient */
    float *ce_stats;    /* (B, T, 2) per row: max logit and sum of exp(logit - max) */
    float *losses;      /* (B, T) per-token loss, 0 where the target is ignored */
    float *zt;          /* (B, T) tensor parallel: each row's target logit (parallel
                           cross-entropy); NULL otherwise */
    float *xent;        /* (3, B, T) tensor parallel: the parallel cross-entropy's scratch */
    float *att_scratch; /* fsdp_cpu_gqa_attention_scratch_floats(T, lnh, lnkv, hs) */
    struct fsdp_llama_block_acts *blocks; /* (L,) */
    struct fsdp_llama_block_store *store; /* (L,) bf16 activations; all NULL at f32 */
};

/* Gradients of activations, shared by all blocks (grad_act_memory). */
struct fsdp_llama_grad_acts {
    float *dres;  /* (B, T, C) gradient of the residual stream, updated in place */
    float *dbtc;  /* (B, T, C) d(norm output) / d(attention output) */
    float *dqkv;  /* (B, T, QKV) */
    float *dgate; /* (B, T, F) */
    float *dup;   /* (B, T, F) */
    float *dh;    /* (B, T, F) */
    float *xfull; /* (B, T, C) sequence parallel: a norm's output gathered from every rank,
                     or this rank's rows of a reduce-scattered gradient; NULL otherwise */
    float *spg;   /* (2, C) sequence parallel: a block's norm-weight gradients over this
                     rank's rows, summed over the tp ranks before they are added */
};

struct fsdp_llama {
    struct fsdp_lm lm;                   /* first: what every LM here shares (model/lm.h): the
                                            generic base, unit buffers, batch, loss seed,
                                            activation memory, tensor parallelism */
    const struct fsdp_llama_config *cfg; /* spec's */
    int hs, qkv_w;                       /* head size; QKV row width (this rank's heads') */

    /* tensor parallelism (lm.tp; doc/model.md, "Tensor parallelism"): the
     * blocks' buffers hold this rank's query and key/value heads and its
     * features of the MLP */
    int lnh, lnkv;                       /* query and key/value heads here: NH / tpn, NKV / tpn */
    size_t lq, lf;                       /* their q width lnh hs, and the MLP's F / tpn */

    float *rope_cos, *rope_sin; /* (max_T, hs / 2) each, made once at create */

    int head_chunk;            /* rows of the LM head's logits computed at a time */
    struct fsdp_llama_acts acts;
    struct fsdp_llama_grad_acts gacts;

    /* loss of the last forward with targets (the mean: lm.loss) */
    size_t n_kept;       /* tokens whose target is not ignored */

    /* ordering state: forward of u, then backward from L+1 down to 0 */
    int bwd_next;            /* unit the next backward_unit must be; -1 when none */

    size_t blk_off[FSDP_LLAMA_BLK_COUNT]; /* offsets inside a block's unit; SIZE_MAX: absent */
    size_t emb_off;                       /* embed_tokens inside unit 0 */
    size_t head_off[2];                   /* norm.weight, lm_head.weight inside unit L+1 */
};

/* The Llama model behind a generic one (its lm.base is the first member);
 * the functions below that take the generic model are also its ops. */
static inline struct fsdp_llama *fsdp_llama_of(struct fsdp_model *m)
{
    return (struct fsdp_llama *)m;
}

// ----------------------------------------------------------------------------
// lifetime and settings (as gpt2.h's namesakes)

/* A model for batches of up to (max_B, max_T) tokens (max_T <= context);
 * activation memory is reserved lazily. */
int fsdp_llama_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                      struct fsdp_llama **out);
void fsdp_llama_destroy(struct fsdp_llama *m);
/* Block l (every block when l < 0) recomputed in its backward; not between
 * a forward and its backward. */
int fsdp_llama_set_checkpoint(struct fsdp_llama *m, int l, int on);
/* The LM head computes `rows` rows of logits at a time (0: the default,
 * FSDP_LLAMA_HEAD_BYTES of logits); more than one chunk recomputes the
 * logits in the backward. */
#define FSDP_LLAMA_HEAD_BYTES ((size_t)16 << 20)
int fsdp_llama_set_head_chunk(struct fsdp_llama *m, int rows);
int fsdp_llama_reserve(struct fsdp_model *m);
/* Rows of one LM-head chunk: the chunk size, at most the largest batch. */
size_t fsdp_llama_head_rows(const struct fsdp_llama *m);
int fsdp_llama_set_unit(struct fsdp_llama *m, int u, void *params, enum fsdp_dtype pt,
                        float *grads);
void fsdp_llama_set_ignore_index(struct fsdp_llama *m, int32_t ignore_index);
void fsdp_llama_set_loss_seed(struct fsdp_llama *m, double divisor, float scale);

// ----------------------------------------------------------------------------
// views

void fsdp_llama_block_view(const struct fsdp_llama *m, struct fsdp_lm_mem unit,
                           struct fsdp_llama_block_view *v);
/* unit0 supplies lm_head when tied */
void fsdp_llama_head_view(const struct fsdp_llama *m, struct fsdp_lm_mem unit_last,
                          struct fsdp_lm_mem unit0, struct fsdp_llama_head_view *v);

// ----------------------------------------------------------------------------
// forward / backward (as gpt2.h's namesakes)

int fsdp_llama_set_batch(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets,
                         int B, int T);
int fsdp_llama_forward_unit(struct fsdp_model *m, int u);
int fsdp_llama_backward_unit(struct fsdp_model *m, int u);
/* Logits (rows, V) of positions [row0, row0 + rows) of the last forward. */
int fsdp_llama_logits(struct fsdp_model *m, size_t row0, size_t rows, float *out);
int fsdp_llama_forward(struct fsdp_llama *m, const int32_t *tokens, const int32_t *targets, int B,
                       int T, float *loss);
int fsdp_llama_backward(struct fsdp_llama *m);
/* Zeroes unit u's gradient buffer (all units when u < 0). */
int fsdp_llama_zero_grad(struct fsdp_llama *m, int u);

// ----------------------------------------------------------------------------
// accounting

/* Bytes of saved activations for the current checkpoint flags. */
size_t fsdp_llama_activation_bytes(const struct fsdp_model *m);
/* Bytes of activation gradients and scratch, and the RoPE tables. */
size_t fsdp_llama_workspace_bytes(const struct fsdp_model *m);
/*
 * Training FLOPs per token at sequence length T (doc/model.md):
 *   6 N + 12 L C T
 * N = every parameter but embed_tokens when untied (a lookup): the k/v
 * projections are NKV/NH of a square one (GQA), the MLP three C x F
 * matrices (SwiGLU); the attention term counts QK^T and PV of every query
 * head at full T, the same whatever NKV.
 */
double fsdp_llama_flops_per_token(const struct fsdp_model_spec *s, int T);

/* The ops of the generic interface (model.h) over the functions above. */
extern const struct fsdp_model_ops fsdp_llama_ops;

/* The kernels' RoPE scaling (compute/kernels.h) of c's rope_scaling fields,
 * for the forward's tables and the decoder's per-position angles alike. */
struct fsdp_rope_scaling;
void fsdp_llama_rope_scaling(const struct fsdp_llama_config *c, struct fsdp_rope_scaling *out);

/* Incremental decoding with a key/value cache (model.h, struct fsdp_decoder;
 * llama_decode.c). */
int fsdp_llama_decoder_create(struct fsdp_model *model, int max_T, struct fsdp_decoder **out);

#endif
