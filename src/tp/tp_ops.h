/*
 * tp_ops.h - the tensor-parallel operators a model calls inside its
 * forward and backward (Megatron-LM's layout), over the tp group it is
 * handed (struct fsdp_tp, filled by whoever applies tensor parallelism: the
 * trainer, over its mesh's tp group):
 *
 *   copy in / reduce out   Megatron's f and g: entering a column-parallel
 *                          region the input is used as it is and its
 *                          gradient is all-reduced; leaving a row-parallel
 *                          one the partial outputs are all-reduced and the
 *                          gradient passes as it is
 *   sequence gather /      the same pair with sequence parallelism: the
 *   sequence scatter       region outside holds 1/tp of the rows, so the
 *                          entry all-gathers rows (backward: reduce-scatter)
 *                          and the exit reduce-scatters them (backward:
 *                          all-gather): the all-reduce's volume, split
 *   vocabulary-parallel    rank r holds rows [r Vl, r Vl + Vl) of the
 *   embedding              (padded) table: each rank looks up the tokens it
 *                          holds, zero rows elsewhere, and the rows are
 *                          summed over the ranks as a reduce-out
 *   parallel cross-entropy each rank holds its vocabulary slice of every
 *                          row's logits; the row maximum, the target's
 *                          logit and the sum of exponentials are reduced
 *                          over the ranks, so no rank ever holds a whole
 *                          row of logits
 *
 * A vocabulary not divisible by tp is padded to tp x Vl rows
 * (fsdp_tp_vocab_split); the padding rows never take part in a lookup or a
 * softmax, and no file ever sees them (the parallelism leaves them out of
 * its state pieces).
 *
 * Every collective is blocking (the operators' outputs are needed by the
 * next kernel) and counted: calls, payload bytes and bytes on the wire per
 * rank (ring volumes: 2 (p-1)/p n for an all-reduce of n bytes, (p-1)/p n
 * for an all-gather or reduce-scatter whose full buffer is n bytes), for
 * doc/performance.md's comparison with the analytical volumes. With one
 * rank (g NULL or size 1) nothing is communicated and nothing counted.
 */
#ifndef FSDP_TP_TP_OPS_H
#define FSDP_TP_TP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/counts.h"
#include "comm/group.h"

struct fsdp_device;

struct fsdp_kernels;

struct fsdp_tp {
    struct fsdp_group *g;       /* the tp group; NULL: one rank */
    int size, rank;             /* g's (1 and 0 without one) */
    int sp;                     /* sequence parallel: norms and residuals hold 1/size of the rows */
    struct fsdp_coll_attr attr; /* where the operators' buffers live */
    struct fsdp_device *dev;    /* where the operators compute (never NULL) */
    const struct fsdp_kernels *k; /* dev's kernels */
    struct fsdp_comm_counts counts;
};

/* tp over g (NULL: one rank), buffers in mem, kernels k (NULL: the CPU's). */
void fsdp_tp_init(struct fsdp_tp *tp, struct fsdp_group *g, int sp, struct fsdp_device *dev);
/* Does tp split anything (more than one rank)? */
static inline int fsdp_tp_on(const struct fsdp_tp *tp)
{
    return tp && tp->size > 1;
}

/*
 * The vocabulary split: every rank holds Vl = ceil(V / size) rows of the
 * padded table, rank r the vocabulary [r Vl, r Vl + Vl), of which
 * [*v0, *v0 + *vn) are real ids (*vn < Vl on the last ranks when size does
 * not divide V, 0 when the padding covers the whole slice).
 */
void fsdp_tp_vocab_split(size_t V, int size, int rank, size_t *v0, size_t *vn, size_t *Vl);

// ----------------------------------------------------------------------------
// collectives over the tp group, blocking and counted

/* buf (n) reduced (FSDP_SUM or FSDP_MAX) over the ranks in place; every
 * rank gets the same bits. */
int fsdp_tp_all_reduce(struct fsdp_tp *tp, float *buf, size_t n, enum fsdp_redop op);
/* recv (size x n) = every rank's send (n), rank after rank; t is f32 or i32. */
int fsdp_tp_all_gather(struct fsdp_tp *tp, const void *send, void *recv, size_t n,
                       enum fsdp_dtype t);
/* recv (n) = the sum over the ranks of block `rank` of their send (size x n). */
int fsdp_tp_reduce_scatter(struct fsdp_tp *tp, const float *send, float *recv, size_t n);

// ----------------------------------------------------------------------------
// the conjugate pairs

/* f backward: dx (n), this rank's part of the gradient of a copied input,
 * summed over the ranks in place. (f forward is the identity.) */
int fsdp_tp_copy_in_backward(struct fsdp_tp *tp, float *dx, size_t n);
/* g forward: y (n), this rank's partial sums, summed over the ranks in
 * place. (g backward is the identity.) */
int fsdp_tp_reduce_out_forward(struct fsdp_tp *tp, float *y, size_t n);

/* Sequence entry: x_full (size x rows, C) = every rank's x (rows, C), rank
 * after rank. Its backward: dx (rows, C) = the sum over the ranks of their
 * rows of dx_full (size x rows, C). */
int fsdp_tp_seq_gather_forward(struct fsdp_tp *tp, const float *x, float *x_full, size_t rows,
                               size_t C);
int fsdp_tp_seq_gather_backward(struct fsdp_tp *tp, const float *dx_full, float *dx, size_t rows,
                                size_t C);
/* Sequence exit: y (rows, C) = this rank's rows of the sum over the ranks
 * of y_full (size x rows, C). Its backward: dy_full (size x rows, C) = every
 * rank's dy (rows, C). */
int fsdp_tp_seq_scatter_forward(struct fsdp_tp *tp, const float *y_full, float *y, size_t rows,
                                size_t C);
int fsdp_tp_seq_scatter_backward(struct fsdp_tp *tp, const float *dy, float *dy_full, size_t rows,
                                 size_t C);

// ----------------------------------------------------------------------------
// vocabulary-parallel embedding

/*
 * out = wte[tokens] (+ pos[row mod T]) over the N rows, wte held as this
 * rank's slice (Vl, C) of the padded table (fsdp_tp_vocab_split of V), pos
 * (T, C) a position table every rank holds whole, or NULL: each rank writes
 * the rows of the tokens it holds and zeros elsewhere into full (N, C), rank
 * 0 adds the positions, then the rows are summed over the ranks: with
 * tp->sp reduce-scattered into out (N / size, C: this rank's rows; N a
 * multiple of size), else all-reduced (out = full is allowed, (N, C)). Every
 * row is one table row plus one position row and zeros, so the sum is the
 * whole tables' lookup bit for bit. Token ids are checked by the caller.
 */
int fsdp_tp_embed_forward(struct fsdp_tp *tp, float *out, float *full, const int32_t *tokens,
                          const void *wte, size_t V, const void *pos, enum fsdp_dtype pt, size_t T,
                          size_t N, size_t C);
/* dwte (Vl, C) += the rows of dout_full (N, C) whose token this rank holds,
 * and dpos (T, C; NULL: none) += every row at its position, rows in order:
 * dpos is whole on every rank. dout_full is the whole gradient (with sp,
 * all-gathered by the caller: fsdp_tp_seq_scatter_backward). No
 * communication. */
void fsdp_tp_embed_backward(const struct fsdp_tp *tp, float *dwte, float *dpos,
                            const float *dout_full, const int32_t *tokens, size_t V, size_t T,
                            size_t N, size_t C);

// ----------------------------------------------------------------------------
// parallel cross-entropy

/*
 * Each rank has folded its vocabulary slice of every row's logits into
 * stats (N, 2: max and sum of exp(x - max) over the slice, the kernels'
 * crossentropy_slice_forward; an empty slice is (-inf, 0)) and zt (N: the
 * target's logit where the slice holds it, else 0). Combines them over the
 * ranks into every row's statistics over the whole vocabulary: the maxima
 * all-reduced (max), each rank's sum rescaled to the common maximum, then
 * the sums and target logits all-reduced (sum) in one call. scratch: 3 N
 * floats. Every rank ends with the same bits.
 */
int fsdp_tp_xent_combine(struct fsdp_tp *tp, float *stats, float *zt, float *scratch, size_t N);

/*
 * The loss of each row of logits (N, vn), this rank's real vocabulary
 * columns [v0, v0 + vn) (fsdp_tp_vocab_split of V): losses (N) =
 * logsumexp(row) - row[target] over the whole vocabulary, 0 for ignored
 * rows; stats (N, 2) and zt (N) are kept for the backward; *n_kept counts
 * the rows not ignored (from htargets, the host's copy of the device's
 * targets); scratch 3 N floats. Targets are checked by the caller.
 */
int fsdp_tp_xent_forward(struct fsdp_tp *tp, float *losses, float *stats, float *zt, float *scratch,
                         const float *logits, const int32_t *targets, const int32_t *htargets,
                         size_t N, size_t V, int32_t ignore_index, size_t *n_kept);
/* dlogits (N, vn) = dscale (softmax - onehot(target)) over this rank's
 * columns, from the combined stats; ignored rows zero. dlogits may equal
 * logits. No communication. */
void fsdp_tp_xent_backward(const struct fsdp_tp *tp, float *dlogits, const float *logits,
                           const float *stats, const int32_t *targets, size_t N, size_t V,
                           int32_t ignore_index, float dscale);

#endif
