/*
 * tp_ops.c - the tensor-parallel operators (tp_ops.h): the counted blocking
 * collectives over the tp group, Megatron's conjugate pairs with and
 * without sequence parallelism, the vocabulary-parallel embedding and the
 * parallel cross-entropy. Buffers are the caller's; nothing is allocated.
 */
#include "config.h"
#include "tp/tp_ops.h"
#include "compute/device.h"
#include "core/error.h"

#include <math.h>
#include <string.h>

void fsdp_tp_init(struct fsdp_tp *tp, struct fsdp_group *g, int sp, struct fsdp_device *dev)
{
    dev = dev ? dev : fsdp_cpu_device();
    memset(tp, 0, sizeof(*tp));
    tp->g = g && g->size > 1 ? g : NULL;
    tp->size = tp->g ? g->size : 1;
    tp->rank = tp->g ? g->rank : 0;
    tp->sp = sp && tp->size > 1;
    tp->attr.mem = dev->mem;
    /* the compute stream: a collective reads what its kernels wrote, in
     * their order (a backend's own stream would not wait for them) */
    tp->attr.stream = dev->stream;
    tp->dev = dev;
    tp->k = dev->k;
}

void fsdp_tp_vocab_split(size_t V, int size, int rank, size_t *v0, size_t *vn, size_t *Vl)
{
    size_t per = (V + (size_t)size - 1) / (size_t)size, first = (size_t)rank * per;
    *Vl = per;
    *v0 = first < V ? first : V;
    *vn = first >= V ? 0 : V - first < per ? V - first : per;
}

// ----------------------------------------------------------------------------
// collectives

/* Counts one call moving a full buffer of `bytes` (ring volumes). */
static void tp_count(struct fsdp_tp *tp, enum fsdp_coll_op c, double bytes)
{
    fsdp_comm_count(&tp->counts, c, tp->size, bytes);
}

static int tp_finish(struct fsdp_work *w)
{
    int rc = fsdp_work_wait(w, -1.0);
    fsdp_work_free(w);
    return rc;
}

int fsdp_tp_all_reduce(struct fsdp_tp *tp, float *buf, size_t n, enum fsdp_redop op)
{
    if (!fsdp_tp_on(tp) || n == 0) {
        return 0;
    }
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_allreduce(tp->g, buf, buf, n, FSDP_F32, op, &tp->attr, &w));
    tp_count(tp, FSDP_COLL_ALLREDUCE, (double)n * sizeof(float));
    return tp_finish(w);
}

int fsdp_tp_all_gather(struct fsdp_tp *tp, const void *send, void *recv, size_t n,
                       enum fsdp_dtype t)
{
    if (t != FSDP_F32 && t != FSDP_I32) {
        return fsdp_err(FSDP_ERR_INVALID, "tp all-gather of %s (f32 or i32 only)",
                        fsdp_dtype_name(t));
    }
    if (!fsdp_tp_on(tp)) {
        if (recv != send) {
            memmove(recv, send, n * 4);
        }
        return 0;
    }
    if (n == 0) {
        return 0;
    }
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_allgather(tp->g, send, recv, n, t, &tp->attr, &w));
    tp_count(tp, FSDP_COLL_ALLGATHER, (double)n * tp->size * 4.0);
    return tp_finish(w);
}

int fsdp_tp_reduce_scatter(struct fsdp_tp *tp, const float *send, float *recv, size_t n)
{
    if (!fsdp_tp_on(tp)) {
        if (recv != send) {
            memmove(recv, send, n * sizeof(float));
        }
        return 0;
    }
    if (n == 0) {
        return 0;
    }
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_reduce_scatter(tp->g, send, recv, n, FSDP_F32, FSDP_SUM, &tp->attr, &w));
    tp_count(tp, FSDP_COLL_REDUCE_SCATTER, (double)n * tp->size * sizeof(float));
    return tp_finish(w);
}

// ----------------------------------------------------------------------------
// the conjugate pairs

int fsdp_tp_copy_in_backward(struct fsdp_tp *tp, float *dx, size_t n)
{
    return fsdp_tp_all_reduce(tp, dx, n, FSDP_SUM);
}

int fsdp_tp_reduce_out_forward(struct fsdp_tp *tp, float *y, size_t n)
{
    return fsdp_tp_all_reduce(tp, y, n, FSDP_SUM);
}

int fsdp_tp_seq_gather_forward(struct fsdp_tp *tp, const float *x, float *x_full, size_t rows,
                               size_t C)
{
    return fsdp_tp_all_gather(tp, x, x_full, rows * C, FSDP_F32);
}

int fsdp_tp_seq_gather_backward(struct fsdp_tp *tp, const float *dx_full, float *dx, size_t rows,
                                size_t C)
{
    return fsdp_tp_reduce_scatter(tp, dx_full, dx, rows * C);
}

int fsdp_tp_seq_scatter_forward(struct fsdp_tp *tp, const float *y_full, float *y, size_t rows,
                                size_t C)
{
    return fsdp_tp_reduce_scatter(tp, y_full, y, rows * C);
}

int fsdp_tp_seq_scatter_backward(struct fsdp_tp *tp, const float *dy, float *dy_full, size_t rows,
                                 size_t C)
{
    return fsdp_tp_all_gather(tp, dy, dy_full, rows * C, FSDP_F32);
}

// ----------------------------------------------------------------------------
// vocabulary-parallel embedding

int fsdp_tp_embed_forward(struct fsdp_tp *tp, float *out, float *full, const int32_t *tokens,
                          const void *wte, size_t V, const void *pos, enum fsdp_dtype pt, size_t T,
                          size_t N, size_t C)
{
    size_t v0, vn, Vl;
    fsdp_tp_vocab_split(V, tp->size, tp->rank, &v0, &vn, &Vl);
    /* the rows held, zeros elsewhere, and the positions on rank 0 only:
     * summed over the ranks, each row is the two terms that are not exact
     * zeros, so the sum is the whole tables' lookup bit for bit */
    size_t pn = pos && tp->rank == 0 ? T : 0;
    tp->k->embed_rows_forward(tp->dev, full, tokens, wte, v0, vn, pos, 0, pn, pt, N,
                              (int)(T ? T : 1), (int)C);
    if (tp->sp) {
        if (N % (size_t)tp->size != 0) {
            return fsdp_err(FSDP_ERR_INVALID, "tp embedding: %zu rows do not split over %d ranks",
                            N, tp->size);
        }
        return fsdp_tp_seq_scatter_forward(tp, full, out, N / (size_t)tp->size, C);
    }
    FSDP_CHECK(fsdp_tp_reduce_out_forward(tp, full, N * C));
    if (out != full) {
        FSDP_CHECK(fsdp_device_copy(tp->dev, out, full, N * C * sizeof(float)));
    }
    return 0;
}

void fsdp_tp_embed_backward(const struct fsdp_tp *tp, float *dwte, float *dpos,
                            const float *dout_full, const int32_t *tokens, size_t V, size_t T,
                            size_t N, size_t C)
{
    size_t v0, vn, Vl;
    fsdp_tp_vocab_split(V, tp->size, tp->rank, &v0, &vn, &Vl);
    tp->k->embed_rows_backward(tp->dev, dwte, dpos, dout_full, tokens, v0, vn, 0, dpos ? T : 0, N,
                               (int)(T ? T : 1), (int)C);
}

// ----------------------------------------------------------------------------
// parallel cross-entropy

int fsdp_tp_xent_combine(struct fsdp_tp *tp, float *stats, float *zt, float *scratch, size_t N)
{
    if (!fsdp_tp_on(tp)) {
        return 0;
    }
    float *mx = scratch, *sz = scratch + N;
    tp->k->xent_combine(tp->dev, 0, stats, zt, mx, sz, N, 1);
    FSDP_CHECK(fsdp_tp_all_reduce(tp, mx, N, FSDP_MAX));
    tp->k->xent_combine(tp->dev, 1, stats, zt, mx, sz, N, 1);
    FSDP_CHECK(fsdp_tp_all_reduce(tp, sz, 2 * N, FSDP_SUM));
    tp->k->xent_combine(tp->dev, 2, stats, zt, mx, sz, N, 1);
    return 0;
}

int fsdp_tp_xent_forward(struct fsdp_tp *tp, float *losses, float *stats, float *zt, float *scratch,
                         const float *logits, const int32_t *targets, const int32_t *htargets,
                         size_t N, size_t V, int32_t ignore_index, size_t *n_kept)
{
    size_t v0, vn, Vl, kept = 0;
    fsdp_tp_vocab_split(V, tp->size, tp->rank, &v0, &vn, &Vl);
    if (vn > 0) {
        tp->k->crossentropy_slice_forward(tp->dev, stats, zt, logits, targets, N, vn, v0,
                                          ignore_index, 1);
    } else { /* an empty slice: nothing to add */
        tp->k->fill(tp->dev, stats, N, 2, -INFINITY);
        tp->k->fill(tp->dev, stats + 1, N, 2, 0.0f);
        tp->k->fill(tp->dev, zt, N, 1, 0.0f);
    }
    FSDP_CHECK(fsdp_tp_xent_combine(tp, stats, zt, scratch, N));
    tp->k->xent_losses(tp->dev, losses, stats, zt, targets, N, ignore_index);
    for (size_t i = 0; i < N; i++) {
        kept += htargets[i] != ignore_index;
    }
    *n_kept = kept;
    return 0;
}

void fsdp_tp_xent_backward(const struct fsdp_tp *tp, float *dlogits, const float *logits,
                           const float *stats, const int32_t *targets, size_t N, size_t V,
                           int32_t ignore_index, float dscale)
{
    size_t v0, vn, Vl;
    fsdp_tp_vocab_split(V, tp->size, tp->rank, &v0, &vn, &Vl);
    if (vn > 0) {
        tp->k->crossentropy_slice_backward(tp->dev, dlogits, logits, stats, targets, N, vn, v0,
                                           ignore_index, dscale);
    }
}
