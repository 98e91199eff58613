/*
 * gpt2.h - GPT-2 forward and backward over units, on host f32 buffers.
 *
 * The model owns activations only. Parameters and their gradients live in
 * per-unit contiguous buffers laid out by the parameter table (gpt2_spec.h)
 * and owned by the CALLER, who points the model at them with
 * fsdp_gpt2_set_unit, so that the sharding engine can hand it freshly
 * gathered buffers for each unit:
 *   unit 0        wte (V, C), wpe (T, C)
 *   unit 1 + l    block l
 *   unit 1 + L    ln_f (+ lm_head (V, C) when untied)
 * A driver runs fsdp_gpt2_forward_unit for u = 0 .. L+1 and
 * fsdp_gpt2_backward_unit for u = L+1 .. 0, gathering/reducing between the
 * calls; fsdp_gpt2_forward / fsdp_gpt2_backward run all units.
 *
 * Tied embeddings: unit L+1's forward reads unit 0's wte, and its backward
 * ADDS the head's gradient into unit 0's wte gradient. Unit 0's gradient
 * buffer must therefore be zeroed (or hold the running accumulation) before
 * the backward starts, and may be reduced only after unit 0's own backward,
 * which adds the embedding-lookup gradient last. Unit 0's parameters must be
 * available during unit L+1's forward and backward.
 *
 * Unit 0 by rows (fsdp_gpt2_set_unit_rows): each rank of a group holds only
 * its rows of wte (a vocabulary slice) and of wpe, and the embedding and the
 * tied head are computed vocabulary-parallel: token ids and activations
 * move between the ranks, never the tables or their gradients.
 *
 * Parameter gradients always accumulate (+=): zero them per step, or not,
 * for gradient accumulation.
 */
#ifndef FSDP_MODEL_GPT2_H
#define FSDP_MODEL_GPT2_H

#include "model/gpt2_spec.h"
#include "model/lm.h"
#include "model/model.h"
#include "tp/tp_ops.h"
#include "compute/device.h"

#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// parameter views: pointers into one unit buffer (params or grads alike),
// in its dtype pt (parameters: their storage dtype; gradients: f32)

struct fsdp_gpt2_embed_view {
    void *wte; /* (V, C) */
    void *wpe; /* (T, C) */
    enum fsdp_dtype pt;
};

/* A block's tensors (shapes: FSDP_GPT2_BLOCK_TENSORS, e.g. qkvw (3C, C)) */
struct fsdp_gpt2_block_view {
#define FSDP_GPT2_X(id, field, suffix, rows, cols, init, std, decay, tp) void *field;
    FSDP_GPT2_BLOCK_TENSORS(FSDP_GPT2_X)
#undef FSDP_GPT2_X
    enum fsdp_dtype pt;
};

struct fsdp_gpt2_head_view {
    void *lnfw;    /* (C) */
    void *lnfb;    /* (C) */
    void *lm_head; /* (V, C): unit 0's wte when tied */
    enum fsdp_dtype pt;
};

// ----------------------------------------------------------------------------
// activations, sized for (max_B, max_T); a smaller batch uses the leading
// part of every tensor with its own (B, T)

/* What one block saves for its backward. With sequence parallelism the
 * tensors of the residual stream (ln_1, ln_2, res2 and the norms' rows) hold
 * this rank's 1/tp of the B x T rows. */
struct fsdp_gpt2_block_acts {
    float *ln1;      /* (B, T, C) */
    float *ln1_mean; /* (B, T) */
    float *ln1_rstd; /* (B, T) */
    float *qkv;      /* (B, T, 3C) (3 lc with tensor parallelism, as every C of a head) */
    float *atty;     /* (B, T, C) attention output, before c_proj */
    float *att_lse;  /* (B, NH, T) log-sum-exp of each score row */
    float *res2;     /* (B, T, C) residual after attention */
    float *ln2;      /* (B, T, C) */
    float *ln2_mean; /* (B, T) */
    float *ln2_rstd; /* (B, T) */
    float *fch;      /* (B, T, 4C) c_fc output, GELU input */
    float *fch_gelu; /* (B, T, 4C) */
};

/* With bf16 activations (lm.adt) a block's saved tensors are stored here,
 * the shapes of struct fsdp_gpt2_block_acts, which the kernels read and
 * write as they are; that struct's pointers to them are NULL but for one
 * small f32 working set shared by every block: res2 (widened back after
 * the attention's exit, the MLP's f32 residual) and, with sequence
 * parallelism, ln1 and ln2 (widened for the all-gather). The norms'
 * statistics and the log-sum-exps stay f32, per block. */
struct fsdp_gpt2_block_store {
    uint16_t *ln1, *qkv, *atty, *res2, *ln2, *fch, *fch_gelu;
};

/*
 * One contiguous buffer (act_memory). Checkpointed blocks all share one
 * block_acts set that their backward refills by recomputing the block from
 * its input, residual[l]; the others own a set each.
 */
struct fsdp_gpt2_acts {
    uint16_t *residual16; /* (L+1, B, T, C) bf16 activations: the stored residual stream
                             (residual is then its two f32 slots: model/lm.h) */
    float *residual;    /* (L+1, B, T, C): [l] is block l's input, [L] feeds ln_f (sequence
                           parallel: this rank's rows) */
    float *lnf;         /* (B, T, C) every row, the head's input (sequence parallel: each
                           rank's rows gathered) */
    float *lnf_mean;    /* (B, T) (sequence parallel: this rank's rows) */
    float *lnf_rstd;    /* (B, T) */
    float *head_logits; /* one tile of the head's logits (rows x vocabulary slice), then
                           their gradient; the whole (rows, V) when it fits the budget */
    float *ce_stats;    /* (R, 2) per head row: max logit and sum of exp(logit - max) */
    float *losses;      /* (B, T) per-token loss, 0 where the target is ignored */
    int32_t *tok_all;   /* (R) unit 0 by rows: every rank's tokens, rank after rank */
    int32_t *tgt_all;   /* (R) ... and targets (the tied head's rows) */
    float *att_scratch; /* fsdp_cpu_attention_scratch_floats(T) */
    struct fsdp_gpt2_block_acts *blocks; /* (L,) */
    struct fsdp_gpt2_block_store *store; /* (L,) bf16 activations; all NULL at f32 */
};

/*
 * Gradients of activations, shared by all blocks (grad_act_memory), and,
 * over the space of dqkv and dfch (free outside a block's backward), the
 * head's and the embedding's scratch. R is the head's rows: every rank's
 * B x T with unit 0 by rows and a tied head, else this rank's.
 */
struct fsdp_gpt2_grad_acts {
    float *dres;  /* (B, T, C) gradient of the residual stream, updated in place (sequence
                     parallel: this rank's rows) */
    float *dbtc;  /* (B, T, C) dln / datty; with tensor parallelism also the partial sums of
                     the row-parallel products and the gathered gradient of the residual */
    float *xfull; /* (B, T, C) sequence parallel: every rank's rows of a norm's output
                     (gathered for a column-parallel product), or this rank's rows of a
                     reduce-scattered gradient; NULL otherwise */
    float *spg;   /* (4, C) sequence parallel: a block's norm-parameter gradients over this
                     rank's rows, summed over the tp ranks before they are added */
    float *dqkv;  /* (B, T, 3C) */
    float *dfch;  /* (B, T, 4C) */
    float *xall;  /* (W B T, C) unit 0 by rows: every rank's rows (embedding, ln_f, dres) */
    float *dxall; /* (W B T, C) the tied head's partial d(ln_f) of every rank's rows */
    float *zt;    /* (R) each head row's target logit */
    float *mx;    /* (R) every rank's row maxima, reduced */
    float *sz;    /* (2 R) sums of exp and target logits, reduced */
};

struct fsdp_gpt2 {
    struct fsdp_lm lm;                  /* first: what every LM here shares (model/lm.h): the
                                           generic base, unit buffers, batch, loss seed,
                                           activation memory, tensor parallelism */
    const struct fsdp_gpt2_config *cfg; /* spec's */

    int head_chunk;            /* the head's logits buffer: head_chunk x V floats */
    struct fsdp_gpt2_acts acts;
    struct fsdp_gpt2_grad_acts gacts;

    /* tensor parallelism (lm.tp; doc/model.md, "Tensor parallelism"): the
     * blocks' buffers hold this rank's heads of the attention and its
     * features of the MLP */
    int lnh;            /* heads computed here: NH / tpn */
    size_t lc;          /* their width, C / tpn: q, k and v each; c_fc's 4 lc */

    /* unit 0 by rows (fsdp_gpt2_set_unit_rows) */
    struct fsdp_group *rows_g; /* the ranks that hold the other rows; NULL: one rank */
    struct fsdp_tp rows_x;     /* the exchanges over rows_g, counted (tp/tp_ops.h) */
    int rows_on;               /* unit 0's buffers hold this rank's rows only */
    int rows_W, rows_r;        /* ranks (1 without a group) and this rank */
    size_t wte_row0, wte_rows; /* wte rows held: vocabulary [wte_row0, wte_row0 + wte_rows) */
    size_t wpe_row0, wpe_rows; /* wpe rows held: positions */
    size_t wte_at, wpe_at;     /* where they start in unit 0's buffers */
    size_t rows_numel;         /* floats of unit 0's buffers */
    int head_x_ready;          /* grad acts' xall still holds every rank's ln_f rows */

    /* loss of the last forward with targets (the mean: lm.loss) */
    size_t n_kept;   /* tokens whose target is not ignored */
    size_t kept_all; /* ... over every row of the head (every rank's, by rows) */
    int32_t *tgt_host; /* (R) by rows: the host's copy of acts.tgt_all, for the counts */

    /* ordering state: forward of u, then backward from L+1 down to 0 */
    int bwd_next;            /* unit the next backward_unit must be; -1 when none */

    size_t blk_off[FSDP_GPT2_BLK_COUNT]; /* offsets of a block's tensors inside its unit */
    size_t emb_off[2];   /* wte, wpe inside unit 0 */
    size_t head_off[3];  /* ln_f.weight, ln_f.bias, lm_head.weight inside unit L+1 */
};

/* The GPT-2 model behind a generic one (its lm.base is the first member);
 * the functions below that take the generic model are also its ops. */
static inline struct fsdp_gpt2 *fsdp_gpt2_of(struct fsdp_model *m)
{
    return (struct fsdp_gpt2 *)m;
}

// ----------------------------------------------------------------------------
// lifetime

/*
 * Creates a model for batches of up to (max_B, max_T) tokens (max_T <=
 * context). Activation memory is reserved lazily (fsdp_gpt2_reserve or the
 * first fsdp_gpt2_set_batch) so that checkpointing can be chosen first.
 */
int fsdp_gpt2_create(const struct fsdp_model_spec *spec, int max_B, int max_T,
                     struct fsdp_gpt2 **out);
void fsdp_gpt2_destroy(struct fsdp_gpt2 *m);

/* Marks block l (or every block when l < 0) for activation checkpointing.
 * Re-lays out the activations (freed now, reserved again on demand);
 * not allowed between a forward and its backward. */
int fsdp_gpt2_set_checkpoint(struct fsdp_gpt2 *m, int l, int on);

/*
 * The LM head and its loss hold at most `rows` x V floats of logits: they
 * run over tiles of all the head's rows (rows x V as a budget) and a slice
 * of the vocabulary, as wide as fits (at least 16 columns; rows are split
 * too when even that does not fit), keeping per row a running maximum and
 * sum of exponentials (online log-sum-exp) and the target's logit. When
 * every logit fits in one tile the backward turns the forward's logits into
 * their gradient in place; otherwise it recomputes each tile (one more head
 * product per step). rows 0: the default, FSDP_GPT2_HEAD_BYTES of logits (83
 * rows' worth of gpt2's 50257 classes: a 1 x 1024 batch streams 13 slices
 * of 4064 columns; bench-small's 4 x 256 x 256 fits whole). Re-lays out the
 * activations like fsdp_gpt2_set_checkpoint.
 */
#define FSDP_GPT2_HEAD_BYTES ((size_t)16 << 20)
int fsdp_gpt2_set_head_chunk(struct fsdp_gpt2 *m, int rows);

/*
 * Unit 0 by rows over g (model.h, set_unit_rows): unit 0's buffers then
 * hold this rank's rows of wte and of wpe (fsdp_split_even over g's ranks),
 * packed wte then wpe. The embedding forward all-gathers the token ids,
 * adds the rows it holds into every rank's positions and reduce-scatters
 * them; its backward all-gathers d(residual) and adds into the rows held.
 * With a tied head the head is split by vocabulary: it all-gathers ln_f's
 * rows and targets, computes every rank's rows against its wte slice,
 * combines the row statistics with two all-reduces (max; sums) and
 * reduce-scatters d(ln_f). Nothing of size V x C ever moves or exists
 * whole. u other than 0: declined (0). g NULL: one rank holding every row.
 * Returns 1 (taken), 0 (declined) or < 0. The model interface's
 * set_unit_rows (fsdp_gpt2_ops) takes unit 0 only when that moves less data
 * than gathering it, V + context > 2 W max_B max_T (four exchanges of
 * W B T C floats against two of the (V + context) x C unit); this function
 * always takes it.
 */
int fsdp_gpt2_set_unit_rows(struct fsdp_gpt2 *m, int u, struct fsdp_group *g);

/* Allocates (pre-faulted) activation memory now if not yet done. */
int fsdp_gpt2_reserve(struct fsdp_model *m);

/* Points unit u at caller-owned buffers of spec->unit_numel[u] floats each. */
int fsdp_gpt2_set_unit(struct fsdp_gpt2 *m, int u, void *params, enum fsdp_dtype pt, float *grads);

/* Targets equal to this value are padding (default -1). */
void fsdp_gpt2_set_ignore_index(struct fsdp_gpt2 *m, int32_t ignore_index);

/*
 * The backward seeds d(objective)/d(loss_i) = scale / divisor for every kept
 * token i. divisor 0 (the default) means this batch's n_kept, i.e. the mean
 * loss; a data-parallel driver passes the global kept count so that N ranks
 * equal one rank on the global batch. scale is the f16 loss scale (1).
 */
void fsdp_gpt2_set_loss_seed(struct fsdp_gpt2 *m, double divisor, float scale);

// ----------------------------------------------------------------------------
// views

void fsdp_gpt2_embed_view(const struct fsdp_gpt2 *m, struct fsdp_lm_mem unit0,
                          struct fsdp_gpt2_embed_view *v);
void fsdp_gpt2_block_view(const struct fsdp_gpt2 *m, struct fsdp_lm_mem unit,
                          struct fsdp_gpt2_block_view *v);
/* unit0 supplies lm_head when tied */
void fsdp_gpt2_head_view(const struct fsdp_gpt2 *m, struct fsdp_lm_mem unit_last,
                         struct fsdp_lm_mem unit0, struct fsdp_gpt2_head_view *v);

// ----------------------------------------------------------------------------
// forward / backward

/*
 * Sets the batch: tokens (B, T) in [0, V), targets (B, T) in [0, V) or the
 * ignore index, or NULL for forward only. Checked here; the arrays are
 * borrowed until the backward ends. With unit 0 by rows, tokens NULL (and
 * targets NULL) means no batch on this rank: the units then only take part
 * in the other ranks' exchanges (its rows count as ignored).
 */
int fsdp_gpt2_set_batch(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets,
                        int B, int T);

/* Unit u's forward. With targets, the last unit also computes the loss
 * (m->loss, m->n_kept, acts.losses), tile by tile (set_head_chunk). */
int fsdp_gpt2_forward_unit(struct fsdp_model *m, int u);
/* Unit u's backward; units must run from L+1 down to 0 after a forward with
 * targets. Needs unit_grads[u] (and unit_grads[0] for a tied head). */
int fsdp_gpt2_backward_unit(struct fsdp_model *m, int u);

/*
 * Logits of positions [row0, row0 + rows) (row = b * T + t) of the last
 * forward, into out (rows, V): the head's product of the final layer norm,
 * recomputed here (a forward does not keep logits). Needs the last unit's
 * forward and its parameters (unit 0's when tied) still set; not with a
 * tied head whose unit 0 is given by rows.
 */
int fsdp_gpt2_logits(struct fsdp_model *m, size_t row0, size_t rows, float *out);

/* set_batch + every unit's forward; *loss (may be NULL) as m->loss. */
int fsdp_gpt2_forward(struct fsdp_gpt2 *m, const int32_t *tokens, const int32_t *targets, int B,
                      int T, float *loss);
/* every unit's backward, L+1 down to 0 */
int fsdp_gpt2_backward(struct fsdp_gpt2 *m);

/* Zeroes unit u's gradient buffer (all units when u < 0). */
int fsdp_gpt2_zero_grad(struct fsdp_gpt2 *m, int u);

// ----------------------------------------------------------------------------
// accounting

/* Bytes of saved activations for the current checkpoint flags. */
size_t fsdp_gpt2_activation_bytes(const struct fsdp_model *m);
/* Bytes of activation gradients and scratch. */
size_t fsdp_gpt2_workspace_bytes(const struct fsdp_model *m);

/*
 * Training FLOPs per token at sequence length T (doc/model.md):
 *   6 N + 12 L C T
 * N = parameters that take part in matrix products: every parameter except
 * wpe (and wte when untied, whose lookup is not a product); the attention
 * term counts QK^T and PV at full T (fwd 4 L C T, bwd twice that), as
 * PaLM, nanoGPT and llm.c do.
 */
double fsdp_gpt2_flops_per_token(const struct fsdp_model_spec *s, int T);

/* The ops of the generic interface (model.h) over the functions above. */
extern const struct fsdp_model_ops fsdp_gpt2_ops;

/* Incremental decoding with a key/value cache (model.h, struct fsdp_decoder;
 * gpt2_decode.c). */
int fsdp_gpt2_decoder_create(struct fsdp_model *model, int max_T, struct fsdp_decoder **out);

#endif
