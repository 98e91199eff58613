/*
 * tp_plan.h - tensor parallelism as a transform of the parameter table. From
 * the whole table and the architecture's cut of each parameter (a
 * fsdp_tp_cut_fn: the model's tp_cut, model.h), a plan holds the tp-local table of one tp rank
 * (same names, units, order, init and decay; each parameter's local shape) and the map between the
 * local tensors' rows and blocks of the whole tensors:
 *
 *   replicated   local = whole
 *   rows         tp rank r holds rows [r n/tp, (r+1) n/tp) of each of the
 *                `chunks` equal row blocks (GPT-2's [q | k | v] by heads)
 *   rows, padded tp rank r holds rows [r Vl, (r+1) Vl) of the table padded
 *                to tp Vl rows; the padding is in no block
 *   columns      tp rank r holds columns [r m/tp, (r+1) m/tp)
 *
 * The trainer makes the plan and creates the model on its tp-local table;
 * the sharding engine shards that table over dp as it would the whole one
 * (2-D sharding) and reports its state in blocks of the whole tensors, so
 * that files never see tp. Pure bookkeeping: no group, no collective,
 * nothing of io. Below the models: the cut comes in as a function, never
 * through model.h.
 */
#ifndef FSDP_TP_TP_PLAN_H
#define FSDP_TP_TP_PLAN_H

#include <stddef.h>

#include "core/spec.h"

struct fsdp_device;

/* The most row blocks a cut may have (a cut's chunks). */
#define FSDP_TP_MAX_CHUNKS 8

/* How tensor parallelism over tp ranks cuts one parameter (Megatron-LM's
 * layout); tp rank r holds piece r. */
struct fsdp_tp_cut {
    int dim;    /* -1: whole on every rank (replicated); 0: rows split; 1: columns split */
    int chunks; /* dim 0: the rows are `chunks` equal blocks, each split over the ranks
                   (GPT-2's packed [q | k | v]); 1 otherwise */
    int pad;    /* dim 0: the rows padded with zero rows to a multiple of tp (a vocabulary,
                   tp/tp_ops.h fsdp_tp_vocab_split); 0 otherwise */
};

/* How parameter i of spec (the whole table) is cut over tp ranks; an error
 * naming the config field when the architecture cannot be split tp ways. */
typedef int (*fsdp_tp_cut_fn)(const struct fsdp_model_spec *spec, int tp, size_t i,
                              struct fsdp_tp_cut *out);

/* The cut of a parameter placed by p (core/spec.h): column-wise rows split
 * in `chunks` blocks, row-wise columns split, a vocabulary's rows padded,
 * anything else whole. */
void fsdp_tp_cut_of_place(enum fsdp_tp_place p, int chunks, struct fsdp_tp_cut *out);

/* A block of a whole tensor that a run of local rows holds. */
struct fsdp_tp_block {
    size_t local_row;  /* the block's first row in the local tensor */
    size_t row0, rows; /* rows [row0, row0 + rows) of the whole tensor */
    size_t col0, cols; /* columns [col0, col0 + cols): all of them but for a column cut */
};

struct fsdp_tp_plan {
    int size, rank;                     /* tp ranks, this one */
    const struct fsdp_model_spec *full; /* borrowed */
    struct fsdp_model_spec *local;      /* owned: rank's tp-local table */
    struct fsdp_tp_cut *cuts;           /* (n_params,) */
};

/* The plan of tp rank `rank` of `size` for full (borrowed: it must outlive
 * the plan), from the architecture's cut (NULL: the architecture has none,
 * which is one error naming it, as is a cut that does not divide). */
int fsdp_tp_plan_create(const struct fsdp_model_spec *full, int size, int rank, fsdp_tp_cut_fn cut,
                        struct fsdp_tp_plan **out);
void fsdp_tp_plan_destroy(struct fsdp_tp_plan *p);

/* Is parameter i whole on every tp rank? */
static inline int fsdp_tp_plan_replicated(const struct fsdp_tp_plan *p, size_t i)
{
    return p->cuts[i].dim < 0;
}

/*
 * The blocks of the whole tensor that local rows [r0, r0 + n) of parameter
 * i hold on tp rank `rank`, in local row order, into out (room for
 * FSDP_TP_MAX_CHUNKS); padding rows are in none. Returns the count.
 */
size_t fsdp_tp_plan_blocks(const struct fsdp_tp_plan *p, size_t i, int rank, size_t r0, size_t n,
                           struct fsdp_tp_block *out);

/* Unit u of the whole table into full (full->unit_numel[u]) from every tp
 * rank's local unit u, rank after rank in locals (size x local numel), both
 * in dev's memory (copies through dev). */
int fsdp_tp_plan_assemble(const struct fsdp_tp_plan *p, struct fsdp_device *dev, int u,
                          const float *locals, float *full);

#endif
