/*
 * tp.h - tensor parallelism as a transform of the parameter table. From
 * the whole table and the model's cut of each parameter (model.h,
 * tp_cut), a plan holds the tp-local table of one tp rank (same names,
 * units, order, init and decay; each parameter's local shape) and the map
 * between the local tensors' rows and blocks of the whole tensors:
 *
 *   replicated   local = whole
 *   rows         tp rank r holds rows [r n/tp, (r+1) n/tp) of each of the
 *                `chunks` equal row blocks (GPT-2's [q | k | v] by heads)
 *   rows, padded tp rank r holds rows [r Vl, (r+1) Vl) of the table padded
 *                to tp Vl rows; the padding is in no block
 *   columns      tp rank r holds columns [r m/tp, (r+1) m/tp)
 *
 * The sharding engine shards the tp-local table over dp as it would the
 * whole one (2-D sharding) and reports its state in blocks of the whole
 * tensors, so that files never see tp. Pure bookkeeping: no group, no
 * collective, nothing of io.
 */
#ifndef FSDP_PARALLEL_TP_H
#define FSDP_PARALLEL_TP_H

#include <stddef.h>

#include "core/spec.h"
#include "model/model.h"

/* The most row blocks a cut may have (tp_cut's chunks). */
#define FSDP_TP_MAX_CHUNKS 8

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
 * the plan), from the architecture's tp_cut: an architecture without one,
 * or a cut that does not divide, is one error naming the field. */
int fsdp_tp_plan_create(const struct fsdp_model_spec *full, int size, int rank,
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
