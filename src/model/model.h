/*
 * model.h - the interface every architecture implements, and the registry.
 *
 * An architecture registers a struct fsdp_arch (core/spec.h: name, config
 * attributes, its parameter table) whose ops point at a struct
 * fsdp_model_ops: what a driver (the sharding engine, the single-rank
 * oracle, the sampler) calls to run the model unit by unit. The model owns
 * activations only. Parameters and gradients live in per-unit buffers laid
 * out by the spec and owned by the caller, who points the model at them
 * with set_unit, so a sharding engine can hand it freshly gathered buffers
 * for each unit.
 *
 * The driver runs forward_unit for u = 0 .. n_units-1 and backward_unit for
 * u = n_units-1 .. 0, gathering and reducing between the calls. A tie
 * (spec->ties) says that a unit also reads another unit's parameter and
 * adds into its gradient: the driver keeps the owner's buffers set while
 * the user computes. Parameter gradients always accumulate (+=).
 *
 * Ops are written out longhand; members are only ever added at the end.
 */
#ifndef FSDP_MODEL_MODEL_H
#define FSDP_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/spec.h"
#include "tp/tp_plan.h"

struct fsdp_model;

struct fsdp_device;
struct fsdp_group;
struct fsdp_decoder;
struct fsdp_tp;
struct fsdp_comm_counts;

/* What an instance is sized for, and where it computes. */
struct fsdp_model_opts {
    int max_B, max_T;  /* the largest batch (max_T <= spec->context) */
    int head_chunk;    /* rows of the output head computed at a time; 0: the model's default */
    struct fsdp_device *dev; /* activations and kernels (compute/device.h); NULL: the CPU */
    /* Tensor parallelism (tp/tp_ops.h; NULL or one rank: none). The spec
     * is then the tp-local table, every parameter cut as the model's tp_cut
     * says (tp/tp_plan.h makes it), and the model computes its slice of the
     * heads and features, calling the tp operators on tp's group; every
     * rank of the group runs the same calls with the same batch. Borrowed. */
    struct fsdp_tp *tp;
    /* Storage dtype of the activations saved for the backward: FSDP_F32
     * (0, the default) or FSDP_BF16 (GPT-2 and Llama, on any number of
     * tp ranks). Kernels compute in f32 from the stored values. */
    enum fsdp_dtype act_dtype;
};

struct fsdp_model_ops {
    size_t size; /* sizeof(struct fsdp_model_ops) of the implementation */
    const char *name;
    /* An instance for spec (borrowed: it must outlive the model). */
    int (*create)(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *opts,
                  struct fsdp_model **out);
    void (*destroy)(struct fsdp_model *m);
    /* Recompute unit u's activations in its backward (u < 0: every unit
     * that can); not between a forward and its backward. */
    int (*set_checkpoint)(struct fsdp_model *m, int u, int on);
    /* Allocates (pre-faulted) activation memory now if not yet done. */
    int (*reserve)(struct fsdp_model *m);
    /* Points unit u at buffers of spec->unit_numel[u] values: params in
     * dtype pt (f32, bf16 or f16: the dtype the kernels read them in), grads
     * in f32 (NULL for a forward only). */
    int (*set_unit)(struct fsdp_model *m, int u, void *params, enum fsdp_dtype pt, float *grads);
    /* The backward seeds d(objective)/d(loss_i) = scale / divisor for every
     * kept token (divisor 0: this batch's kept count). */
    void (*set_loss_seed)(struct fsdp_model *m, double divisor, float scale);
    /* tokens (B, T) in [0, V); targets (B, T) or NULL for a forward only;
     * borrowed until the backward ends. Checked here. */
    int (*set_batch)(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets, int B,
                     int T);
    int (*forward_unit)(struct fsdp_model *m, int u);
    int (*backward_unit)(struct fsdp_model *m, int u);
    /* Mean loss of the last forward with targets (NaN when no token counted). */
    float (*loss)(const struct fsdp_model *m);
    /* Logits of positions [row0, row0 + rows) of the last forward, (rows, V). */
    int (*logits)(struct fsdp_model *m, size_t row0, size_t rows, float *out);
    /* Bytes of saved activations (current checkpoint flags), and of
     * activation gradients and scratch. */
    size_t (*activation_bytes)(const struct fsdp_model *m);
    size_t (*workspace_bytes)(const struct fsdp_model *m);
    /* Training FLOPs per token at sequence length T (for MFU). */
    double (*flops_per_token)(const struct fsdp_model_spec *spec, int T);
    /*
     * Optional (NULL: never). Unit u by rows over group g (NULL: one rank):
     * from now on set_unit passes, for u, only this rank's rows of each of
     * its parameters, rows fsdp_split_even(shape[0], size, rank) (g's size
     * and rank), packed parameter after parameter, and the model computes u
     * and every user of its tied parameters from them, exchanging
     * activations over g inside forward_unit and backward_unit. Every rank
     * of g then calls set_batch, forward_unit and backward_unit in the same
     * order, each with its own batch of the same (B, T) and all with
     * targets or all without; a rank without a batch passes tokens NULL and
     * only takes part in the exchanges. Returns 1 when the model takes u by
     * rows, 0 when it does not (nothing changes: the model may decline a
     * unit whose exchanges would cost more than gathering it), < 0 on error.
     * Before the first reserve or set_batch.
     */
    int (*set_unit_rows)(struct fsdp_model *m, int u, struct fsdp_group *g);
    /* Optional (NULL: no incremental decoding): a decoder with a key/value
     * cache of max_T (<= spec->context) positions; see struct fsdp_decoder. */
    int (*decoder_create)(struct fsdp_model *m, int max_T, struct fsdp_decoder **out);
    /*
     * Optional (NULL: no tensor parallelism). How parameter i of spec (the
     * whole table) is cut over tp ranks; an error naming the config field
     * when the model cannot be split tp ways (heads not divisible by tp,
     * fewer heads than ranks). The trainer builds the tp-local table from
     * it (tp/tp_plan.h) and creates the model with opts.tp.
     */
    fsdp_tp_cut_fn tp_cut;
    /*
     * Optional (NULL: none). Adds into out (tp/tp_ops.h) what the model's
     * own exchanges moved since it was created: those over the groups of
     * set_unit_rows. (The tp operators count into the struct fsdp_tp the
     * model was created with, which its creator reads.)
     */
    void (*comm_counts)(const struct fsdp_model *m, struct fsdp_comm_counts *out);
    /*
     * Optional (NULL: the model cannot be cut into pipeline stages). From
     * now on the model computes units [u0, u1] only (u0 <= u1, at least
     * one block): the forward of u0 > 0 starts from the residual stream at
     * its input, which the caller writes through stage_buffers after
     * set_batch; a forward with targets that ends at u1 < n_units - 1
     * makes the backward start at u1 from the residual's gradient the
     * caller writes there (the gradient of u1's output). Before reserve.
     */
    int (*set_stage)(struct fsdp_model *m, int u0, int u1);
    /*
     * Optional, with set_stage. The stage's boundary, each (B, T, C) floats
     * of the current batch (with sequence parallelism this tp rank's rows
     * of them; *count floats) on the model's device: *in the
     * residual stream entering unit u0 (written before its forward), *out
     * the one leaving unit u1 (read after its forward), *dres the residual's
     * gradient (written before u1's backward, read after u0's: then the
     * gradient of u0's input).
     */
    int (*stage_buffers)(struct fsdp_model *m, float **in, float **out, float **dres,
                         size_t *count);
    /*
     * Optional (NULL: every instance keeps its whole workspace). Before
     * reserve: m's workspace, but for the stage's *dres (stage_buffers),
     * is donor's, an instance made with the same options and cut, not
     * itself sharing another's, reserved before m is; m shares none yet. Nothing m or donor
     * computes then carries in the workspace from a forward to its
     * backward, and the two must never run a forward or backward at once
     * (a pipeline chunk's activation sets run one at a time).
     * workspace_bytes counts m's own part from then on.
     */
    int (*share_workspace)(struct fsdp_model *m, struct fsdp_model *donor);
};

/*
 * Incremental decoding of one sequence (sampling): a key/value cache of up to
 * max_T positions. step runs position d->pos for token, writes the logits
 * (V) and advances d->pos; setting d->pos to 0 starts a new sequence. The
 * model's every unit must hold its parameters (set_unit) while a decoder is
 * used; the decoder reads them at each step.
 */
struct fsdp_decoder_ops {
    int (*step)(struct fsdp_decoder *d, int32_t token, float *logits);
    void (*destroy)(struct fsdp_decoder *d);
};
struct fsdp_decoder {
    const struct fsdp_decoder_ops *ops;
    int pos;   /* the next position */
    int max_T; /* positions the cache holds */
};

/* Every instance starts with this. */
struct fsdp_model {
    const struct fsdp_model_ops *ops;
    const struct fsdp_model_spec *spec;
};

static inline const struct fsdp_model_ops *fsdp_model_ops_of(const struct fsdp_model_spec *spec)
{
    return (const struct fsdp_model_ops *)spec->arch->ops;
}

/* spec's architecture's tensor-parallel cut (fsdp_tp_plan_create's), NULL
 * when it has none. */
fsdp_tp_cut_fn fsdp_model_tp_cut_of(const struct fsdp_model_spec *spec);

// ----------------------------------------------------------------------------
// the registry

/* Registers the built-in architectures (gpt2) in core's table; idempotent.
 * Every program calls it before it opens a model. */
int fsdp_model_registry_init(void);
/* Registers another architecture (tests define one at run time). */
int fsdp_model_register(const struct fsdp_arch *arch);
/* The architecture called name; an unknown one is an error listing those known. */
int fsdp_model_arch(const char *name, const struct fsdp_arch **out);

// ----------------------------------------------------------------------------
// conveniences over the ops

int fsdp_model_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *opts,
                      struct fsdp_model **out);
void fsdp_model_destroy(struct fsdp_model *m);
/* m's share_workspace(m, donor): 1 when shared, 0 when m's architecture
 * does not share one (m keeps its whole workspace), <0 on error. */
int fsdp_model_share_workspace(struct fsdp_model *m, struct fsdp_model *donor);
/* set_batch + every unit's forward; *loss (may be NULL) as ops->loss. */
int fsdp_model_forward(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets, int B,
                       int T, float *loss);
/* every unit's backward, last to first */
int fsdp_model_backward(struct fsdp_model *m);

/*
 * Deterministic init of any spec. Element i of parameter p gets
 *   N(0, std_p) = std_p * sqrt(-2 ln u1) * cos(2 pi u2)   (FSDP_INIT_NORMAL)
 *   1 or 0                                                 (ONES, ZEROS)
 * where u1 = (1 + (x_{2i} >> 11)) 2^-53, u2 = (x_{2i+1} >> 11) 2^-53 and
 * x_j is output j of SplitMix64 seeded with FNV-1a(name of p, seed). The
 * value depends only on (seed, name, i): any sharding of the init equals
 * the single-rank init. init_range fills elements [start, start + count)
 * of unit u's flat buffer.
 */
int fsdp_model_init_range(const struct fsdp_model_spec *s, uint64_t seed, int u, size_t start,
                          size_t count, float *dst);
/* every unit: bufs[u] has spec->unit_numel[u] floats */
int fsdp_model_init_params(const struct fsdp_model_spec *s, uint64_t seed, float *const *bufs);

#endif
