/*
 * lm.h - what the transformer language models (gpt2.c, llama.c) share:
 * the unit bookkeeping, the batch, the loss seed, activation memory, and
 * the tensor-parallel plumbing of the residual stream around their blocks.
 *
 * Both models embed a struct fsdp_lm as their first member (its own first
 * member is the generic struct fsdp_model), so a struct fsdp_model * of
 * either is also a struct fsdp_lm *. The model fills it at create
 * (fsdp_lm_init) and points its views at the activation memory after each
 * layout (fsdp_lm_bind); the functions here then run the steps that are the
 * same in every such model. What the architecture computes - the blocks,
 * norms, attention, the head's loss - stays in the model's own file; this
 * module never reads a parameter.
 *
 * Tensor-parallel regions (tp/tp_ops.h; doc/model.md, "Tensor
 * parallelism"): a block enters a column-parallel product from a norm's
 * output and leaves through a row-parallel one into the residual stream.
 * With sequence parallelism the residual stream and the norms hold this
 * rank's 1/tp of the rows (rank r: rows [r N/tp, ...)).
 */
#ifndef FSDP_MODEL_LM_H
#define FSDP_MODEL_LM_H

#include "model/model.h"
#include "tp/tp_ops.h"
#include "compute/device.h"

#include <stddef.h>
#include <stdint.h>

struct fsdp_lm {
    struct fsdp_model base;             /* ops and spec for the generic interface */
    const struct fsdp_model_spec *spec; /* not owned; outlives the model */
    struct fsdp_device *dev;            /* where activations live and kernels run (never NULL:
                                           the CPU device when created without one) */
    const struct fsdp_kernels *k;       /* the device's kernels (the CPU's without one) */
    const char *name;                   /* the architecture, for messages */
    int max_B, max_T;
    int L;                              /* blocks: units 1 .. L; unit L+1 is the head */
    size_t C, V;                        /* width of the residual stream, vocabulary */

    void **unit_params;        /* (n_units,) caller-owned unit buffers, in unit_pt[u] */
    enum fsdp_dtype *unit_pt;  /* (n_units,) each unit's parameter storage dtype */
    float **unit_grads;        /* (n_units,) caller-owned, may be NULL for forward only */
    unsigned char *checkpoint; /* (L,) 1: recompute block l in backward */
    unsigned char *fwd_done;   /* (n_units,) */

    float *act_memory; /* NULL until reserved */
    size_t act_floats;
    float *grad_act_memory;
    size_t grad_act_floats;
    /* share_workspace (model.h): the instance whose workspace holds this
     * one's past its dres (NULL: its own); ws_shared: this instance's
     * workspace is shared either way, so nothing stays in it for a backward */
    const struct fsdp_lm *ws_donor;
    int ws_shared;

    /* current batch (borrowed until the backward ends): the host's arrays,
     * which host code reads (counts, checks), and the device's copies, which
     * kernels read */
    int B, T;
    const int32_t *tokens;  /* (B, T) */
    const int32_t *targets; /* (B, T) or NULL */
    int32_t *dtokens;       /* (max_B, max_T) device copy of tokens */
    int32_t *dtargets;      /* (max_B, max_T) device copy of targets */
    double *dloss;          /* (1) device: the kept losses' sum of the last forward */
    int shadow;             /* no rows on this rank (unit 0 by rows, set_batch without tokens) */
    int32_t ignore_index;   /* targets equal to it are padding; default -1 */

    /* loss of the last forward with targets, and the backward's seed */
    float loss;       /* mean over kept tokens (NaN when none); read from dloss when
                         loss_pending (fsdp_lm_op_loss), so a step reads it once */
    size_t loss_kept; /* the rows dloss sums */
    int loss_pending;
    double loss_divisor; /* 0: the kept count; else the divisor of the loss sum (global) */
    float loss_scale;    /* multiplies the seed gradient (f16 loss scaling); 1 */

    /* tensor parallelism (model.h opts.tp): the blocks' buffers hold this
     * rank's heads and features, the vocabulary tables its slice */
    struct fsdp_tp *tp; /* NULL: one rank */
    int tpn;            /* tp ranks (1 without tensor parallelism) */
    int sp;             /* sequence parallel: the residual stream and the norms hold this
                           rank's 1/tpn of the batch's rows */
    size_t tv0, tvn;    /* the vocabulary ids [tv0, tv0 + tvn) of this rank's slice of the
                           embedding (and lm_head) (tp/tp_ops.h fsdp_tp_vocab_split) */
    size_t tvl;         /* rows of that slice: ceil(V / tpn), padding after the tvn ids */

    /* a pipeline stage (model.h set_stage): units [stage_lo, stage_hi]
     * are computed; 0 and n_units - 1 otherwise */
    int stage_lo, stage_hi;

    /* views of the model's activation memory (fsdp_lm_bind) */
    float *residual; /* (slots, B, T, C): residual[l] (block l's input; l = L the final
                        norm's) at l - fsdp_lm_residual_first (sequence parallel: this
                        rank's rows) */
    float *dres;     /* (B, T, C) gradient of the residual stream (rows held here) */
    float *dbtc;     /* (B, T, C) every row: partial sums of the row-parallel products, the
                        gathered gradient of the residual, a column-parallel input gradient */
    float *xfull;    /* (B, T, C) sequence parallel: a norm's output gathered from every
                        rank, or this rank's rows of a reduce-scattered gradient */
    float *spg;      /* (n, C) sequence parallel: norm-parameter gradients of this rank's rows */
    /* activation storage (model.h opts.act_dtype): with bf16 the residual
     * stream is stored here, (slots, B, T, C) bf16 as residual is without
     * it, and residual is two f32 slots of (B, T, C), block l's input
     * widened into slot l & 1 */
    enum fsdp_dtype adt; /* FSDP_F32 or FSDP_BF16 */
    uint16_t *residual16;
};

// ----------------------------------------------------------------------------
// lifetime and settings

/* spec is of arch (the architecture the model implements). */
int fsdp_lm_check_arch(const struct fsdp_model_spec *spec, const struct fsdp_arch *arch);
/*
 * Checks a batch size (context: the longest sequence) and an activation
 * estimate of per_tok floats a token; then fills lm for a model of arch
 * with ops, residual width C and spec's units and vocabulary, with its unit
 * tables and the split over tp (NULL or one rank: none), computing on dev
 * (NULL: the CPU). On error nothing
 * is left allocated.
 */
int fsdp_lm_init(struct fsdp_lm *lm, const struct fsdp_model_spec *spec,
                 const struct fsdp_arch *arch, const struct fsdp_model_ops *ops, int max_B,
                 int max_T, int context, double per_tok, size_t C, struct fsdp_tp *tp,
                 struct fsdp_device *dev);
/* Frees what fsdp_lm_init and the reserves allocated (not lm itself). */
void fsdp_lm_free(struct fsdp_lm *lm);

/* Finds name in unit u with the given shape (cols 0: 1-D); returns its offset. */
int fsdp_lm_locate(const struct fsdp_model_spec *s, const char *name, int u, size_t rows,
                   size_t cols, size_t *off);
/* Carves n floats (64-byte aligned) from base at *off; base NULL only counts. */
float *fsdp_lm_take(float *base, size_t *off, size_t n);
/* A saved activation of n values: f32 in *f, or (bf16) in the bf16 store
 * *h, carved as fsdp_lm_take carves (n + 1) / 2 floats. */
void fsdp_lm_take_act(float **f, uint16_t **h, int bf16, float *base, size_t *off, size_t n);
/* Rows of a batch of BT rows that the residual stream holds here. */
static inline size_t fsdp_lm_rows_here(const struct fsdp_lm *lm, size_t BT)
{
    return lm->sp ? BT / (size_t)lm->tpn : BT;
}
/* Rows of `bytes` of logits over the vocabulary, at least one. */
int fsdp_lm_head_default_rows(const struct fsdp_lm *lm, size_t bytes);

/*
 * *mem of n floats (pre-faulted, from the model's device) unless already
 * there; *floats = n and *fresh = 1 when allocated. what names it in the
 * error.
 */
int fsdp_lm_reserve_buf(struct fsdp_lm *lm, float **mem, size_t *floats, size_t n,
                        const char *what, int *fresh);
/*
 * The workspace (activation gradients) of a layout of total floats whose
 * first part is the residual's gradient, dres (this rank's rows of
 * max_B x max_T, C each): unless already there, the whole of it, or with a
 * donor (share_workspace) only dres; *shared is then where the layout's
 * other parts lie, the donor's, at the donor's offsets (else NULL: in
 * lm->grad_act_memory). fsdp_lm_ws_own: the floats this instance keeps.
 */
int fsdp_lm_reserve_ws(struct fsdp_lm *lm, size_t total, float **shared, int *fresh);
size_t fsdp_lm_ws_own(const struct fsdp_lm *lm, size_t total);
/* Logs the activation and workspace sizes after a reserve that allocated. */
void fsdp_lm_log_reserve(const struct fsdp_lm *lm);
/* Activation memory from the model's device (host memory without one). */
void fsdp_lm_release(const struct fsdp_lm *lm, void *p);
/* The views into the activation memory (see the struct). */
void fsdp_lm_bind(struct fsdp_lm *lm, float *residual, float *dres, float *dbtc, float *xfull,
                  float *spg);
/* The saved-activation layout changed: dropped, rebuilt on demand (the
 * next reserve or set_batch), and the batch forgotten. */
void fsdp_lm_relayout(struct fsdp_lm *lm);

/* Block l (every block when l < 0) recomputed in its backward; busy: a
 * forward waits for its backward (refused). Relays out. */
int fsdp_lm_set_checkpoint(struct fsdp_lm *lm, int l, int on, int busy);
/* A head chunk of rows (>= 0; 0: the default) may be set now. */
int fsdp_lm_check_head_chunk(int rows, int busy);
int fsdp_lm_set_unit(struct fsdp_lm *lm, int u, void *params, enum fsdp_dtype pt, float *grads);

/* Where a unit's tensors are: its parameters (in their storage dtype) or
 * its gradient (f32); a model's views are offsets into one. */
struct fsdp_lm_mem {
    void *base;
    enum fsdp_dtype pt;
};
static inline struct fsdp_lm_mem fsdp_lm_params(const struct fsdp_lm *lm, int u)
{
    return (struct fsdp_lm_mem){lm->unit_params[u], lm->unit_pt[u]};
}
static inline struct fsdp_lm_mem fsdp_lm_grads(const struct fsdp_lm *lm, int u)
{
    return (struct fsdp_lm_mem){lm->unit_grads[u], FSDP_F32};
}
/* The tensor at element offset off of mem (NULL when mem has no buffer). */
static inline void *fsdp_lm_at(struct fsdp_lm_mem mem, size_t off)
{
    return mem.base ? (char *)mem.base + off * fsdp_dtype_size(mem.pt) : NULL;
}
void fsdp_lm_set_loss_seed(struct fsdp_lm *lm, double divisor, float scale);
/* Zeroes unit u's gradient (every unit when u < 0); unit 0 has numel0 floats. */
int fsdp_lm_zero_grad(struct fsdp_lm *lm, int u, size_t numel0);

// ----------------------------------------------------------------------------
// the batch and the order of the units

/* B x T fits the model (and splits over the ranks of sequence parallelism). */
int fsdp_lm_check_batch_size(const struct fsdp_lm *lm, int B, int T);
/* Every token in [0, V), every target there or the ignore index; tokens
 * NULL only where shadow_ok (unit 0 by rows: no batch on this rank) and
 * then without targets. */
int fsdp_lm_check_tokens(const struct fsdp_lm *lm, const int32_t *tokens, const int32_t *targets,
                         int B, int T, int shadow_ok);
/* Rows of [r0, r0 + n) whose target (host) is not the ignore index. */
size_t fsdp_lm_count_kept(const struct fsdp_lm *lm, size_t r0, size_t n);
/* Takes the checked batch (tokens NULL: none here, shadow) and copies it to
 * the device; after the reserve. */
int fsdp_lm_start_batch(struct fsdp_lm *lm, const int32_t *tokens, const int32_t *targets, int B,
                        int T);
/* The loss of rows' losses (N, device) whose targets (host) are kept: the
 * sum goes into dloss on the device; the mean is read when asked for. */
void fsdp_lm_set_loss(struct fsdp_lm *lm, const float *losses, size_t N, size_t kept);
/* Unit u may run its forward now (a batch, unit u-1 done, parameters set). */
int fsdp_lm_check_forward(const struct fsdp_lm *lm, int u, int tied);
/* Unit u may run its backward now: next in order, parameters and gradients set. */
int fsdp_lm_check_backward(const struct fsdp_lm *lm, int u, int bwd_next, int tied);
/* Rows [row0, row0 + rows) of the last forward's head may be recomputed here. */
int fsdp_lm_check_logits(const struct fsdp_lm *lm, size_t row0, size_t rows, int tied);
/* fsdp_model_forward, but *loss (may be NULL) is NaN without targets. */
int fsdp_lm_forward(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets, int B,
                    int T, float *loss);
/* The seed gradient's alpha: loss_scale / divisor (kept: the default divisor). */
float fsdp_lm_seed_alpha(const struct fsdp_lm *lm, size_t kept);

// ----------------------------------------------------------------------------
// tensor-parallel regions (lm_tp.c), over the rows of BT

/* The input of a column-parallel product (*in, in *it) from a norm's
 * output x, or its bf16 store st (not NULL with bf16 activations), the
 * rows held here: the store or x itself, or with sequence parallelism
 * every rank's rows gathered into xfull in f32 (the store widened into x
 * first: the all-gather moves f32 rows). */
int fsdp_lm_tp_enter(struct fsdp_lm *lm, float *x, const uint16_t *st, size_t BT, const void **in,
                     enum fsdp_dtype *it);
/* The gradient of the residual stream (dres, rows held here) as a
 * row-parallel product's output gradient: dres itself, or with sequence
 * parallelism every rank's rows gathered into dbtc. */
int fsdp_lm_tp_dout(struct fsdp_lm *lm, size_t BT, const float **dout);
/* A column-parallel product's input gradient part (dbtc, every row) into
 * the rows held here, summed over the ranks: all-reduced in place, or with
 * sequence parallelism reduce-scattered into xfull. */
int fsdp_lm_tp_din(struct fsdp_lm *lm, size_t BT, const float **din);
/* Sequence parallel: n norm-parameter gradients over this rank's rows
 * (spg, n x C) summed over the ranks and added into dst[0..n). */
int fsdp_lm_sp_norm_grads(struct fsdp_lm *lm, float *const *dst, int n);
/*
 * out = residual + inp (BT, K, in it) @ w^T (+ bias), a row-parallel layer: w (C,
 * K) holds this rank's K input features, so with tensor parallelism the
 * partial products are summed over the ranks (reduce-out; with sequence
 * parallelism reduce-scattered to the rows held here) before the bias and
 * the residual, which every rank holds, are added. The partial sums go
 * through dbtc, which no forward uses otherwise. out and residual have the
 * rows held here. With bf16 activations st (not NULL) is out's store,
 * written rounded: without tensor parallelism after the product into out,
 * which holds the f32 values; with it by the residual add, and out is only
 * the reduce-scatter's target (sequence parallelism; else unused, may be
 * NULL). rst (not NULL) is residual's store, which the residual add then
 * reads (residual holds its widened values).
 */
int fsdp_lm_row_parallel(struct fsdp_lm *lm, float *out, uint16_t *st, const void *inp,
                         enum fsdp_dtype it, const void *w, const void *bias, enum fsdp_dtype pt,
                         const float *residual, const uint16_t *rst, size_t BT, size_t K);
/* The residual-stream slots a model holds: a pipeline stage only those its
 * units read or write, [first, first + slots) of 0 .. L (block l reads l and
 * writes l + 1; the head reads L); all L + 1 without a stage. */
int fsdp_lm_residual_first(const struct fsdp_lm *lm);
size_t fsdp_lm_residual_slots(const struct fsdp_lm *lm);
/* Block l's input, residual[l] (l = L: the final norm's; l one of the
 * slots held); with bf16 activations its f32 slot, which holds residual[l]
 * after fsdp_lm_residual_load and is stored by fsdp_lm_residual_save. */
float *fsdp_lm_residual(const struct fsdp_lm *lm, int l);
/* bf16 activations: the stored residual[l] widened into its slot; nothing at f32. */
void fsdp_lm_residual_load(const struct fsdp_lm *lm, int l);
/* bf16 activations: residual[l]'s slot narrowed into the store; nothing at f32. */
void fsdp_lm_residual_save(const struct fsdp_lm *lm, int l);
/* A block's saved tensor x (n f32 values) and its bf16 store st (NULL at
 * f32, where each does nothing): keep rounds x into st and widens it back
 * (the kernels after it read x); store only rounds (an f32 product worked
 * on in place first: RoPE's); widen fills x from st for what reads f32 (a
 * residual, an all-gather's rows). */
void fsdp_lm_act_keep(const struct fsdp_lm *lm, uint16_t *st, float *x, size_t n);
void fsdp_lm_act_store(const struct fsdp_lm *lm, uint16_t *st, const float *x, size_t n);
void fsdp_lm_act_widen(const struct fsdp_lm *lm, float *x, const uint16_t *st, size_t n);
/* The tensor an entry that takes activations in lm->adt reads or writes:
 * the store st at bf16, x at f32. */
static inline void *fsdp_lm_act(float *x, uint16_t *st)
{
    return st ? (void *)st : (void *)x;
}
/* The final norm's output rows held here within lnf (every row): with
 * sequence parallelism this rank's block, else all of it. */
float *fsdp_lm_lnf_mine(const struct fsdp_lm *lm, float *lnf, size_t BT);
/* Gathers the final norm's rows (mine, from fsdp_lm_lnf_mine) into lnf
 * for the head: sequence parallel only, else nothing to do. */
int fsdp_lm_lnf_gather(struct fsdp_lm *lm, const float *mine, float *lnf, size_t BT);

/* Before a tensor-parallel cut (the placement's, tp/tp_plan.h
 * fsdp_tp_cut_of_place): every rank needs a whole number of the n_head heads. */
int fsdp_lm_tp_check_heads(int n_head, int tp);

/* Training FLOPs per token: 6 N + 12 L C T (doc/model.md). */
double fsdp_lm_flops(double N, double L, double C, int T);

// ----------------------------------------------------------------------------
// the generic interface (model.h): the ops that are the same in every LM

int fsdp_lm_op_set_unit(struct fsdp_model *m, int u, void *params, enum fsdp_dtype pt,
                        float *grads);
void fsdp_lm_op_set_loss_seed(struct fsdp_model *m, double divisor, float scale);
float fsdp_lm_op_loss(const struct fsdp_model *m);
/* model.h's set_stage and stage_buffers for a model built on struct fsdp_lm. */
int fsdp_lm_op_set_stage(struct fsdp_model *m, int u0, int u1);
int fsdp_lm_op_stage_buffers(struct fsdp_model *m, float **in, float **out, float **dres,
                             size_t *count);
/* model.h's share_workspace, for a model whose workspace layout starts with
 * dres and is reserved through fsdp_lm_reserve_ws. */
int fsdp_lm_op_share_workspace(struct fsdp_model *m, struct fsdp_model *donor);

// ----------------------------------------------------------------------------
// incremental decoding (gpt2_decode.c, llama_decode.c)

/* What every decoder holds, in the model's device memory: the cache, one
 * buffer of per-step scratch, the step's token and its logits (read back
 * into the caller's host array: the one wait of a step). */
struct fsdp_lm_decoder {
    struct fsdp_decoder base;
    struct fsdp_device *dev;
    float *kv;      /* (L, 2, max_T, KV): each layer's keys, then its values */
    float *x;       /* the scratch, starting with the residual stream (C) */
    float *logits;  /* (V) */
    int32_t *token; /* (1) */
};

/* A decoder of max_T positions (<= context) with KV floats of keys (and of
 * values) per position and layer and `scratch` floats of x; size: the
 * caller's struct, which starts with a struct fsdp_lm_decoder. */
int fsdp_lm_decoder_alloc(const struct fsdp_lm *lm, int max_T, int context, size_t KV,
                          size_t scratch, size_t size, const struct fsdp_decoder_ops *ops,
                          struct fsdp_lm_decoder **out);
void fsdp_lm_decoder_free(struct fsdp_decoder *d);
/* The step may run: a position left in the cache, a token below V and every
 * unit's parameters set. */
int fsdp_lm_decode_check(const struct fsdp_lm *lm, const struct fsdp_decoder *d, int32_t token);
/* A step's start (the check, the token to the device) and end (the logits
 * to the host, the position advanced). */
int fsdp_lm_decode_begin(const struct fsdp_lm *lm, struct fsdp_lm_decoder *d, int32_t token);
int fsdp_lm_decode_end(const struct fsdp_lm *lm, struct fsdp_lm_decoder *d, float *logits);

#endif
