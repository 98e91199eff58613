/*
 * gpt2_head.h - what gpt2.c and gpt2_head.c share inside the GPT-2 model
 * (not for other modules): which rows and vocabulary columns the LM head
 * computes, the exchanges over the ranks holding unit 0's rows, and the
 * head's forward and backward (gpt2_head.c).
 */
#ifndef FSDP_MODEL_GPT2_HEAD_H
#define FSDP_MODEL_GPT2_HEAD_H

#include "model/gpt2.h"

#include <stddef.h>

/* The tied head split by vocabulary over the ranks of unit 0's rows. */
static inline int gpt2_vp_head(const struct fsdp_gpt2 *m)
{
    return m->rows_on && m->cfg->tied;
}

/* Rows of every rank's batch, as exchanged with unit 0 by rows. */
static inline size_t gpt2_rows_all(const struct fsdp_gpt2 *m, size_t BT)
{
    return m->rows_on ? (size_t)m->rows_W * BT : BT;
}

/* Rows the head computes (every rank's when split by vocabulary) and the
 * vocabulary columns it holds. */
static inline size_t gpt2_head_R(const struct fsdp_gpt2 *m, size_t BT)
{
    return gpt2_vp_head(m) ? gpt2_rows_all(m, BT) : BT;
}

static inline size_t gpt2_head_V(const struct fsdp_gpt2 *m)
{
    return gpt2_vp_head(m) ? m->wte_rows : m->lm.tp ? m->lm.tvn : (size_t)m->cfg->vocab_size;
}

// ----------------------------------------------------------------------------
// exchanges between the ranks holding unit 0's rows (blocking: the units
// that need them cannot compute before they complete)

/* count elements of every rank into recv, rank after rank (send may be
 * this rank's block of recv); counted in rows_x like every exchange here */
static inline int gpt2_allgather(struct fsdp_gpt2 *m, const void *send, void *recv, size_t count,
                          enum fsdp_dtype t)
{
    return fsdp_tp_all_gather(&m->rows_x, send, recv, count, t);
}

/* recv (count) = the sum over ranks of their block rank of send */
static inline int gpt2_reduce_scatter(struct fsdp_gpt2 *m, const float *send, float *recv,
                                      size_t count)
{
    return fsdp_tp_reduce_scatter(&m->rows_x, send, recv, count);
}

static inline int gpt2_allreduce(struct fsdp_gpt2 *m, float *buf, size_t count, enum fsdp_redop op)
{
    return fsdp_tp_all_reduce(&m->rows_x, buf, count, op);
}

// ----------------------------------------------------------------------------
// the head (gpt2_head.c)

/* Floats of the head's tile buffer: no tile of any batch up to the largest exceeds it. */
size_t fsdp_gpt2_head_tile_floats(const struct fsdp_gpt2 *m);
/* ln_f, then with targets the loss (unit L+1's forward). */
int fsdp_gpt2_head_forward(struct fsdp_gpt2 *m);
/* The head's and ln_f's gradients, and d(residual) into dres (unit L+1's backward). */
int fsdp_gpt2_head_backward(struct fsdp_gpt2 *m);

#endif
