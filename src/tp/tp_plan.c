/*
 * tp_plan.c - the tensor-parallel plan (tp_plan.h): the cut of each
 * placement, the tp-local parameter table of one tp rank from the
 * architecture's cuts, and the map between local rows and blocks of the
 * whole tensors, both ways.
 */
#include "config.h"
#include "tp/tp_plan.h"
#include "tp/tp_ops.h"
#include "compute/device.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

/* Local rows and columns of parameter p under cut c over size ranks. */
static int tp_local_shape(const struct fsdp_param_spec *p, const struct fsdp_tp_cut *c, int size,
                          size_t *rows, size_t *cols)
{
    size_t n = p->shape[0], m = p->shape[1], t = (size_t)size;
    *rows = n;
    *cols = m;
    if (c->dim == 0 && c->pad) {
        *rows = (n + t - 1) / t;
    } else if (c->dim == 0) {
        size_t k = c->chunks > 0 ? (size_t)c->chunks : 0;
        if (k == 0 || n % (k * t) != 0) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "tensor parallel: %s has %zu rows, which do not "
                            "split into %d blocks over tp=%d",
                            p->name, n, c->chunks, size);
        }
        *rows = n / t;
    } else if (c->dim == 1) {
        if (p->ndim != 2 || m % t != 0) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "tensor parallel: %s has %zu columns, which do not "
                            "split over tp=%d",
                            p->name, m, size);
        }
        *cols = m / t;
    } else if (c->dim != -1) {
        return fsdp_err(FSDP_ERR_INTERNAL, "tensor parallel: %s cut along dimension %d", p->name,
                        c->dim);
    }
    return 0;
}

void fsdp_tp_cut_of_place(enum fsdp_tp_place p, int chunks, struct fsdp_tp_cut *out)
{
    *out = (struct fsdp_tp_cut){.dim = -1, .chunks = 1, .pad = 0};
    if (p == FSDP_TP_COLWISE) {
        out->dim = 0;
        out->chunks = chunks;
    } else if (p == FSDP_TP_ROWWISE) {
        out->dim = 1;
    } else if (p == FSDP_TP_VOCAB) {
        out->dim = 0;
        out->pad = 1;
    }
}

static int tp_cuts(struct fsdp_tp_plan *p, fsdp_tp_cut_fn cut)
{
    const struct fsdp_model_spec *s = p->full;
    if (!cut) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "architecture %s has no tensor-parallel layout: "
                        "use a mesh without tp",
                        s->arch ? s->arch->name : "(none)");
    }
    for (size_t i = 0; i < s->n_params; i++) {
        struct fsdp_tp_cut *c = &p->cuts[i];
        *c = (struct fsdp_tp_cut){.dim = -1, .chunks = 1};
        FSDP_CHECK(cut(s, p->size, i, c));
        c->chunks = c->chunks > 0 ? c->chunks : 1;
        if (c->chunks > FSDP_TP_MAX_CHUNKS) {
            return fsdp_err(FSDP_ERR_INTERNAL,
                            "tensor parallel: %s cut in %d row blocks (at most "
                            "%d)",
                            s->params[i].name, c->chunks, FSDP_TP_MAX_CHUNKS);
        }
    }
    return 0;
}

int fsdp_tp_plan_create(const struct fsdp_model_spec *full, int size, int rank, fsdp_tp_cut_fn cut,
                        struct fsdp_tp_plan **out)
{
    int rc = 0;
    if (size < 1 || rank < 0 || rank >= size) {
        return fsdp_err(FSDP_ERR_INVALID, "tensor parallel: rank %d of %d", rank, size);
    }
    struct fsdp_tp_plan *p = calloc(1, sizeof(*p));
    if (!p || !(p->cuts = calloc(full->n_params ? full->n_params : 1, sizeof(*p->cuts)))) {
        free(p);
        return fsdp_err(FSDP_ERR_NOMEM, "tensor-parallel plan");
    }
    p->size = size;
    p->rank = rank;
    p->full = full;
    FSDP_CHECK_GOTO(tp_cuts(p, cut), rc, err);
    FSDP_CHECK_GOTO(fsdp_model_spec_alloc(full->arch, full->n_units, full->n_params, &p->local), rc,
                    err);
    struct fsdp_model_spec *l = p->local;
    memcpy(l->cfg, full->cfg, full->arch && full->arch->cfg_size ? full->arch->cfg_size : 1);
    l->vocab_size = full->vocab_size;
    l->context = full->context;
    for (size_t i = 0; i < full->n_params; i++) {
        const struct fsdp_param_spec *q = &full->params[i];
        size_t rows, cols;
        FSDP_CHECK_GOTO(tp_local_shape(q, &p->cuts[i], size, &rows, &cols), rc, err);
        FSDP_CHECK_GOTO(fsdp_model_spec_add(l, q->unit, q->name, rows, cols, q->ndim, q->init,
                                            q->std, q->decay, q->tp),
                        rc, err);
    }
    for (int t = 0; t < full->n_ties; t++) {
        const struct fsdp_tie *tie = &full->ties[t];
        FSDP_CHECK_GOTO(fsdp_model_spec_tie(l, tie->user, full->params[tie->param].name), rc, err);
    }
    *out = p;
    return 0;
err:
    fsdp_tp_plan_destroy(p);
    return rc;
}

void fsdp_tp_plan_destroy(struct fsdp_tp_plan *p)
{
    if (!p) {
        return;
    }
    fsdp_model_spec_destroy(p->local);
    free(p->cuts);
    free(p);
}

size_t fsdp_tp_plan_blocks(const struct fsdp_tp_plan *p, size_t i, int rank, size_t r0, size_t n,
                           struct fsdp_tp_block *out)
{
    const struct fsdp_param_spec *q = &p->full->params[i];
    const struct fsdp_tp_cut *c = &p->cuts[i];
    const size_t lrows = p->local->params[i].shape[0], lcols = p->local->params[i].shape[1];
    struct fsdp_tp_block b = {
        .local_row = r0, .row0 = r0, .rows = n, .col0 = 0, .cols = q->shape[1]};
    if (n == 0) {
        return 0;
    }
    if (c->dim < 0) {
        out[0] = b;
        return 1;
    }
    if (c->dim == 1) {
        b.col0 = (size_t)rank * lcols;
        b.cols = lcols;
        out[0] = b;
        return 1;
    }
    if (c->pad) {
        size_t v0, vn, Vl;
        fsdp_tp_vocab_split(q->shape[0], p->size, rank, &v0, &vn, &Vl);
        if (r0 >= vn) {
            return 0; /* padding only */
        }
        b.row0 = v0 + r0;
        b.rows = r0 + n > vn ? vn - r0 : n;
        out[0] = b;
        return 1;
    }
    /* chunks: local rows [j q, (j+1) q) are rows [j n/k + rank q, ...) of the whole */
    size_t k = (size_t)c->chunks, per = lrows / k, whole = q->shape[0] / k, cnt = 0;
    for (size_t j = 0; j < k; j++) {
        size_t lo = r0 > j * per ? r0 : j * per;
        size_t hi = r0 + n < (j + 1) * per ? r0 + n : (j + 1) * per;
        if (lo >= hi) {
            continue;
        }
        out[cnt++] = (struct fsdp_tp_block){.local_row = lo,
                                            .row0 = j * whole + (size_t)rank * per + (lo - j * per),
                                            .rows = hi - lo,
                                            .col0 = 0,
                                            .cols = q->shape[1]};
    }
    return cnt;
}

int fsdp_tp_plan_assemble(const struct fsdp_tp_plan *p, struct fsdp_device *dev, int u,
                          const float *locals, float *full)
{
    const struct fsdp_model_spec *fs = p->full, *ls = p->local;
    size_t lnumel = ls->unit_numel[u];
    struct fsdp_tp_block b[FSDP_TP_MAX_CHUNKS];
    for (size_t i = fs->unit_first[u]; i < fs->n_params && fs->params[i].unit == u; i++) {
        const struct fsdp_param_spec *q = &fs->params[i], *lq = &ls->params[i];
        for (int t = 0; t < p->size; t++) {
            const float *src = locals + (size_t)t * lnumel + lq->offset;
            size_t n = fsdp_tp_plan_blocks(p, i, t, 0, lq->shape[0], b);
            for (size_t k = 0; k < n; k++) {
                for (size_t r = 0; r < b[k].rows; r++) {
                    FSDP_CHECK(fsdp_device_copy(
                        dev, full + q->offset + (b[k].row0 + r) * q->shape[1] + b[k].col0,
                        src + (b[k].local_row + r) * lq->shape[1], b[k].cols * sizeof(float)));
                }
            }
            if (fsdp_tp_plan_replicated(p, i)) {
                break; /* rank 0's copy is everyone's */
            }
        }
    }
    return 0;
}
