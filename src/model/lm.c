/*
 * lm.c - the bookkeeping every transformer LM here shares (lm.h): creation
 * checks and unit tables, activation memory, settings, the batch, the
 * order of the units' forward and backward, the generic ops that need no
 * architecture, and the incremental decoders' cache. It never reads a
 * parameter and never computes a layer.
 */
#include "config.h"
#include "model/lm.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

// ----------------------------------------------------------------------------
// lifetime

int fsdp_lm_check_arch(const struct fsdp_model_spec *spec, const struct fsdp_arch *arch)
{
    if (spec->arch != arch) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: the spec is of architecture %s", arch->name,
                        spec->arch ? spec->arch->name : "(none)");
    }
    return 0;
}

int fsdp_lm_init(struct fsdp_lm *lm, const struct fsdp_model_spec *spec,
                 const struct fsdp_arch *arch, const struct fsdp_model_ops *ops, int max_B,
                 int max_T, int context, double per_tok, size_t C, struct fsdp_tp *tp,
                 struct fsdp_device *dev)
{
    const char *name = arch->name;
    if (max_B < 1 || max_T < 1 || max_T > context) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: batch %d x %d invalid (need B >= 1, 1 <= T <= %d)",
                        name, max_B, max_T, context);
    }
    double floats = (double)max_B * max_T * per_tok;
    if (floats * sizeof(float) > 0x1p50) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: batch %d x %d needs %.3g bytes of activations",
                        name, max_B, max_T, floats * sizeof(float));
    }
    lm->base.ops = ops;
    lm->base.spec = spec;
    lm->spec = spec;
    lm->dev = dev ? dev : fsdp_cpu_device();
    lm->k = lm->dev->k;
    lm->name = name;
    lm->max_B = max_B;
    lm->max_T = max_T;
    lm->L = spec->n_units - 2;
    lm->C = C;
    lm->V = (size_t)spec->vocab_size;
    lm->ignore_index = -1;
    lm->loss_scale = 1.0f;
    lm->loss = NAN;
    lm->tp = fsdp_tp_on(tp) ? tp : NULL;
    lm->tpn = lm->tp ? tp->size : 1;
    lm->sp = lm->tp && tp->sp;
    fsdp_tp_vocab_split(lm->V, lm->tpn, lm->tp ? tp->rank : 0, &lm->tv0, &lm->tvn, &lm->tvl);
    if (lm->sp && ((size_t)max_B * (size_t)max_T) % (size_t)lm->tpn != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: sequence parallel over tp %d: batch %d x %d does "
                        "not split into %d equal row ranges", name, lm->tpn, max_B, max_T,
                        lm->tpn);
    }
    size_t nu = (size_t)spec->n_units, L = (size_t)lm->L;
    lm->stage_lo = 0;
    lm->stage_hi = spec->n_units - 1;
    lm->unit_params = calloc(nu, sizeof(void *));
    lm->unit_pt = calloc(nu, sizeof(*lm->unit_pt));
    lm->unit_grads = calloc(nu, sizeof(float *));
    lm->fwd_done = calloc(nu, 1);
    lm->checkpoint = calloc(L, 1);
    if (!lm->unit_params || !lm->unit_pt || !lm->unit_grads || !lm->fwd_done || !lm->checkpoint) {
        fsdp_lm_free(lm);
        return fsdp_err(FSDP_ERR_NOMEM, "%s model tables", name);
    }
    size_t batch = (size_t)max_B * (size_t)max_T * sizeof(int32_t);
    void *tok = NULL, *tgt = NULL, *loss = NULL;
    int rc = fsdp_device_alloc(lm->dev, batch, "batch tokens", &tok);
    rc = rc < 0 ? rc : fsdp_device_alloc(lm->dev, batch, "batch targets", &tgt);
    rc = rc < 0 ? rc : fsdp_device_alloc(lm->dev, sizeof(double), "loss sum", &loss);
    lm->dtokens = tok;
    lm->dtargets = tgt;
    lm->dloss = loss;
    if (rc < 0) {
        fsdp_lm_free(lm);
    }
    return rc;
}

void fsdp_lm_free(struct fsdp_lm *lm)
{
    fsdp_lm_release(lm, lm->act_memory);
    fsdp_lm_release(lm, lm->grad_act_memory);
    fsdp_lm_release(lm, lm->dtokens);
    fsdp_lm_release(lm, lm->dtargets);
    fsdp_lm_release(lm, lm->dloss);
    lm->dtokens = lm->dtargets = NULL;
    lm->dloss = NULL;
    free(lm->checkpoint);
    free(lm->fwd_done);
    free(lm->unit_grads);
    free(lm->unit_pt);
    free(lm->unit_params);
    lm->act_memory = lm->grad_act_memory = NULL;
    lm->checkpoint = lm->fwd_done = NULL;
    lm->unit_params = NULL;
    lm->unit_pt = NULL;
    lm->unit_grads = NULL;
}

int fsdp_lm_locate(const struct fsdp_model_spec *s, const char *name, int u, size_t rows,
                   size_t cols, size_t *off)
{
    long i = fsdp_model_spec_find(s, name);
    if (i < 0) {
        return fsdp_err(FSDP_ERR_INTERNAL, "parameter table has no '%s'", name);
    }
    const struct fsdp_param_spec *p = &s->params[i];
    int want_ndim = cols ? 2 : 1;
    if (p->unit != u || p->ndim != want_ndim || p->shape[0] != rows ||
        (cols && p->shape[1] != cols)) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "parameter table: '%s' is unit %d shape (%zu, %zu), model expects unit %d "
                        "shape (%zu, %zu)",
                        name, p->unit, p->shape[0], p->shape[1], u, rows, cols ? cols : 1);
    }
    *off = p->offset;
    return 0;
}

float *fsdp_lm_take(float *base, size_t *off, size_t n)
{
    float *p = base ? base + *off : NULL;
    *off += (n + 15) & ~(size_t)15;
    return p;
}

void fsdp_lm_take_act(float **f, uint16_t **h, int bf16, float *base, size_t *off, size_t n)
{
    if (bf16) {
        *h = (uint16_t *)(void *)fsdp_lm_take(base, off, (n + 1) / 2);
    } else {
        *f = fsdp_lm_take(base, off, n);
    }
}

int fsdp_lm_head_default_rows(const struct fsdp_lm *lm, size_t bytes)
{
    size_t rows = bytes / (lm->V * sizeof(float));
    return rows < 1 ? 1 : rows > INT_MAX ? INT_MAX : (int)rows;
}

// ----------------------------------------------------------------------------
// activation memory

int fsdp_lm_reserve_buf(struct fsdp_lm *lm, float **mem, size_t *floats, size_t n,
                        const char *what, int *fresh)
{
    if (*mem) {
        return 0;
    }
    *floats = n;
    size_t bytes = n * sizeof(float);
    char name[96];
    snprintf(name, sizeof(name), "%s %s", lm->name, what);
    void *p;
    FSDP_CHECK(fsdp_device_alloc(lm->dev, bytes, name, &p));
    *mem = p;
    *fresh = 1;
    return 0;
}

size_t fsdp_lm_ws_own(const struct fsdp_lm *lm, size_t total)
{
    size_t BT = (size_t)lm->max_B * (size_t)lm->max_T, off = 0;
    if (!lm->ws_donor) {
        return total;
    }
    fsdp_lm_take(NULL, &off, fsdp_lm_rows_here(lm, BT) * lm->C); /* dres, as the layouts take it */
    return off;
}

int fsdp_lm_reserve_ws(struct fsdp_lm *lm, size_t total, float **shared, int *fresh)
{
    const struct fsdp_lm *d = lm->ws_donor;
    *shared = NULL;
    if (d && !d->grad_act_memory) {
        return fsdp_err(FSDP_ERR_INTERNAL, "%s: the shared workspace is not reserved yet",
                        lm->name);
    }
    if (d && d->grad_act_floats != total) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "%s: the shared workspace holds %zu floats, this instance's layout %zu",
                        lm->name, d->grad_act_floats, total);
    }
    FSDP_CHECK(fsdp_lm_reserve_buf(lm, &lm->grad_act_memory, &lm->grad_act_floats,
                                   fsdp_lm_ws_own(lm, total), "activation gradients", fresh));
    *shared = d ? d->grad_act_memory : NULL;
    return 0;
}

void fsdp_lm_log_reserve(const struct fsdp_lm *lm)
{
    FSDP_DEBUG(FSDP_SUB_MODEL, "%s activations %.1f MiB, workspace %.1f MiB (B=%d T=%d)",
               lm->name, (double)(lm->act_floats * sizeof(float)) / 1048576.0,
               (double)(lm->grad_act_floats * sizeof(float)) / 1048576.0, lm->max_B, lm->max_T);
}

void fsdp_lm_release(const struct fsdp_lm *lm, void *p)
{
    lm->dev->ops->free(lm->dev, p);
}

void fsdp_lm_bind(struct fsdp_lm *lm, float *residual, float *dres, float *dbtc, float *xfull,
                  float *spg)
{
    lm->residual = residual;
    lm->dres = dres;
    lm->dbtc = dbtc;
    lm->xfull = xfull;
    lm->spg = spg;
}

void fsdp_lm_relayout(struct fsdp_lm *lm)
{
    fsdp_lm_release(lm, lm->act_memory);
    lm->act_memory = NULL;
    lm->tokens = NULL;
    lm->targets = NULL;
    lm->shadow = 0;
    memset(lm->fwd_done, 0, (size_t)lm->spec->n_units);
}

// ----------------------------------------------------------------------------
// settings

int fsdp_lm_set_checkpoint(struct fsdp_lm *lm, int l, int on, int busy)
{
    int L = lm->L;
    if (l >= L) {
        return fsdp_err(FSDP_ERR_INVALID, "checkpoint: block %d out of range [0, %d)", l, L);
    }
    if (busy) {
        return fsdp_err(FSDP_ERR_INVALID, "checkpoint flags changed between forward and backward");
    }
    for (int i = 0; i < L; i++) {
        if (l < 0 || i == l) {
            lm->checkpoint[i] = on ? 1 : 0;
        }
    }
    fsdp_lm_relayout(lm);
    return 0;
}

int fsdp_lm_check_head_chunk(int rows, int busy)
{
    if (rows < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "LM head chunk of %d rows (need at least 1, or 0 for "
                        "the default)", rows);
    }
    if (busy) {
        return fsdp_err(FSDP_ERR_INVALID, "LM head chunk changed between forward and backward");
    }
    return 0;
}

int fsdp_lm_set_unit(struct fsdp_lm *lm, int u, void *params, enum fsdp_dtype pt, float *grads)
{
    if (u < 0 || u >= lm->spec->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, lm->spec->n_units);
    }
    if (pt != FSDP_F32 && pt != FSDP_BF16 && pt != FSDP_F16) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d: parameters in %s (need f32, bf16 or f16)", u,
                        fsdp_dtype_name(pt));
    }
    lm->unit_params[u] = params;
    lm->unit_pt[u] = pt;
    lm->unit_grads[u] = grads;
    return 0;
}

void fsdp_lm_set_loss_seed(struct fsdp_lm *lm, double divisor, float scale)
{
    lm->loss_divisor = divisor;
    lm->loss_scale = scale;
}

int fsdp_lm_zero_grad(struct fsdp_lm *lm, int u, size_t numel0)
{
    int n = lm->spec->n_units;
    if (u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "unit %d out of range [0, %d)", u, n);
    }
    for (int i = u < 0 ? 0 : u; i < (u < 0 ? n : u + 1); i++) {
        if (!lm->unit_grads[i]) {
            return fsdp_err(FSDP_ERR_INVALID, "zero_grad: unit %d has no gradient buffer", i);
        }
        size_t numel = i == 0 ? numel0 : lm->spec->unit_numel[i];
        FSDP_CHECK(fsdp_device_zero(lm->dev, lm->unit_grads[i], numel * sizeof(float)));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the batch and the order of the units

int fsdp_lm_check_batch_size(const struct fsdp_lm *lm, int B, int T)
{
    if (B < 1 || B > lm->max_B || T < 1 || T > lm->max_T) {
        return fsdp_err(FSDP_ERR_INVALID, "batch %d x %d exceeds the model's %d x %d", B, T,
                        lm->max_B, lm->max_T);
    }
    if (lm->sp && ((size_t)B * (size_t)T) % (size_t)lm->tpn != 0) {
        return fsdp_err(FSDP_ERR_INVALID, "batch %d x %d does not split over the %d ranks of "
                        "sequence parallelism", B, T, lm->tpn);
    }
    return 0;
}

int fsdp_lm_check_tokens(const struct fsdp_lm *lm, const int32_t *tokens, const int32_t *targets,
                         int B, int T, int shadow_ok)
{
    int V = (int)lm->V;
    if (!tokens && (!shadow_ok || targets)) {
        return fsdp_err(FSDP_ERR_INVALID, "batch has %s",
                        targets ? "targets but no tokens" : "no tokens");
    }
    for (size_t i = 0; tokens && i < (size_t)B * (size_t)T; i++) {
        if (tokens[i] < 0 || tokens[i] >= V) {
            return fsdp_err(FSDP_ERR_INVALID, "token %d at (b=%zu, t=%zu) out of range [0, %d)",
                            (int)tokens[i], i / (size_t)T, i % (size_t)T, V);
        }
        if (targets && targets[i] != lm->ignore_index && (targets[i] < 0 || targets[i] >= V)) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "target %d at (b=%zu, t=%zu) out of range [0, %d) and not the ignore "
                            "index %d",
                            (int)targets[i], i / (size_t)T, i % (size_t)T, V,
                            (int)lm->ignore_index);
        }
    }
    return 0;
}

int fsdp_lm_start_batch(struct fsdp_lm *lm, const int32_t *tokens, const int32_t *targets, int B,
                        int T)
{
    size_t bytes = (size_t)B * (size_t)T * sizeof(int32_t);
    lm->B = B;
    lm->T = T;
    lm->tokens = tokens;
    lm->targets = targets;
    lm->shadow = tokens == NULL;
    memset(lm->fwd_done, 0, (size_t)lm->spec->n_units);
    if (tokens) {
        FSDP_CHECK(fsdp_device_write(lm->dev, lm->dtokens, tokens, bytes));
    }
    if (targets) {
        FSDP_CHECK(fsdp_device_write(lm->dev, lm->dtargets, targets, bytes));
    }
    return 0;
}

size_t fsdp_lm_count_kept(const struct fsdp_lm *lm, size_t r0, size_t n)
{
    size_t kept = 0;
    for (size_t r = r0; r < r0 + n; r++) {
        kept += lm->targets[r] != lm->ignore_index;
    }
    return kept;
}

void fsdp_lm_set_loss(struct fsdp_lm *lm, const float *losses, size_t N, size_t kept)
{
    (void)fsdp_device_zero(lm->dev, lm->dloss, sizeof(double));
    lm->k->loss_sum(lm->dev, lm->dloss, losses, lm->dtargets, N, lm->ignore_index);
    lm->loss_kept = kept;
    lm->loss_pending = 1;
    lm->loss = NAN;
}

int fsdp_lm_check_forward(const struct fsdp_lm *lm, int u, int tied)
{
    int n = lm->spec->n_units, L = lm->L;
    if (u < 0 || u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d out of range [0, %d)", u, n);
    }
    if (!lm->tokens && !lm->shadow) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: no batch (set_batch)");
    }
    if (u < lm->stage_lo || u > lm->stage_hi) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "forward: unit %d is outside this pipeline stage's "
                        "units [%d, %d]",
                        u, lm->stage_lo, lm->stage_hi);
    }
    if (u > lm->stage_lo && !lm->fwd_done[u - 1]) {
        return fsdp_err(FSDP_ERR_INVALID, "forward of unit %d before unit %d's", u, u - 1);
    }
    if (!lm->unit_params[u] || (u == L + 1 && tied && !lm->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "forward: unit %d's parameters are not set%s", u,
                        u == L + 1 && tied ? " (the tied head also reads unit 0)" : "");
    }
    return 0;
}

int fsdp_lm_check_backward(const struct fsdp_lm *lm, int u, int bwd_next, int tied)
{
    int n = lm->spec->n_units, L = lm->L;
    if (u < 0 || u >= n) {
        return fsdp_err(FSDP_ERR_INVALID, "backward: unit %d out of range [0, %d)", u, n);
    }
    if (bwd_next < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "backward of unit %d without a forward with targets", u);
    }
    if (u != bwd_next) {
        return fsdp_err(FSDP_ERR_INVALID, "backward of unit %d out of order (expected unit %d)", u,
                        bwd_next);
    }
    int tied_head = u == L + 1 && tied;
    if (!lm->unit_params[u] || !lm->unit_grads[u] ||
        (tied_head && (!lm->unit_params[0] || !lm->unit_grads[0]))) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "backward: unit %d's parameters or gradients are not set%s", u,
                        tied_head ? " (the tied head also uses unit 0's)" : "");
    }
    return 0;
}

int fsdp_lm_check_logits(const struct fsdp_lm *lm, size_t row0, size_t rows, int tied)
{
    int last = lm->spec->n_units - 1;
    size_t BT = (size_t)lm->B * (size_t)lm->T;
    if (!lm->tokens || !lm->fwd_done[last]) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "logits: no forward of the last unit since the batch was set");
    }
    if (row0 > BT || rows > BT - row0) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: rows [%zu, %zu + %zu) outside the batch's %zu",
                        row0, row0, rows, BT);
    }
    if (lm->tp) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: with tensor parallelism this rank holds only "
                        "the head's vocabulary [%zu, %zu)", lm->tv0, lm->tv0 + lm->tvn);
    }
    if (!lm->unit_params[last] || (tied && !lm->unit_params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "logits: the head's parameters are not set");
    }
    return 0;
}

int fsdp_lm_forward(struct fsdp_model *m, const int32_t *tokens, const int32_t *targets, int B,
                    int T, float *loss)
{
    FSDP_CHECK(fsdp_model_forward(m, tokens, targets, B, T, loss));
    if (loss && !targets) {
        *loss = NAN; /* not the last forward with targets' */
    }
    return 0;
}

float fsdp_lm_seed_alpha(const struct fsdp_lm *lm, size_t kept)
{
    double div = lm->loss_divisor > 0 ? lm->loss_divisor : (double)kept;
    /* no kept token: every dlogits row is zero, so is the gradient */
    return div > 0 ? (float)((double)lm->loss_scale / div) : 0.0f;
}

double fsdp_lm_flops(double N, double L, double C, int T)
{
    return 6.0 * N + 12.0 * L * C * (double)T;
}

// ----------------------------------------------------------------------------
// the generic interface

int fsdp_lm_op_set_unit(struct fsdp_model *m, int u, void *params, enum fsdp_dtype pt, float *grads)
{
    return fsdp_lm_set_unit((struct fsdp_lm *)m, u, params, pt, grads);
}

void fsdp_lm_op_set_loss_seed(struct fsdp_model *m, double divisor, float scale)
{
    fsdp_lm_set_loss_seed((struct fsdp_lm *)m, divisor, scale);
}

/* The one read of the loss a forward makes, when a driver asks for it (the
 * model is logically const: the read only caches). */
float fsdp_lm_op_loss(const struct fsdp_model *m)
{
    struct fsdp_lm *lm = (struct fsdp_lm *)m;
    if (lm->loss_pending) {
        double sum = 0.0;
        lm->loss_pending = 0;
        if (lm->loss_kept > 0 && fsdp_device_read(lm->dev, &sum, lm->dloss, sizeof(sum)) == 0) {
            lm->loss = (float)(sum / (double)lm->loss_kept);
        }
    }
    return lm->loss;
}

// ----------------------------------------------------------------------------
// incremental decoding

int fsdp_lm_decoder_alloc(const struct fsdp_lm *lm, int max_T, int context, size_t KV,
                          size_t scratch, size_t size, const struct fsdp_decoder_ops *ops,
                          struct fsdp_lm_decoder **out)
{
    size_t T = (size_t)max_T, cache = (size_t)lm->L * 2 * T * KV;
    if (max_T < 1 || max_T > context) {
        return fsdp_err(FSDP_ERR_INVALID, "%s decoder: %d positions (the context is %d)",
                        lm->name, max_T, context);
    }
    struct fsdp_lm_decoder *d = calloc(1, size);
    if (!d) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s decoder: out of memory", lm->name);
    }
    d->dev = lm->dev;
    void *kv = NULL, *x = NULL, *lg = NULL, *tok = NULL;
    int rc = fsdp_device_alloc(lm->dev, cache * sizeof(float), "decoder key/value cache", &kv);
    rc = rc < 0 ? rc : fsdp_device_alloc(lm->dev, scratch * sizeof(float), "decoder scratch", &x);
    rc = rc < 0 ? rc : fsdp_device_alloc(lm->dev, lm->V * sizeof(float), "decoder logits", &lg);
    rc = rc < 0 ? rc : fsdp_device_alloc(lm->dev, sizeof(int32_t), "decoder token", &tok);
    d->kv = kv;
    d->x = x;
    d->logits = lg;
    d->token = tok;
    if (rc < 0) {
        fsdp_lm_decoder_free(&d->base);
        return rc;
    }
    d->base.ops = ops;
    d->base.max_T = max_T;
    *out = d;
    return 0;
}

void fsdp_lm_decoder_free(struct fsdp_decoder *d)
{
    struct fsdp_lm_decoder *g = (struct fsdp_lm_decoder *)d;
    if (!g) {
        return;
    }
    if (g->dev) {
        g->dev->ops->free(g->dev, g->kv);
        g->dev->ops->free(g->dev, g->x);
        g->dev->ops->free(g->dev, g->logits);
        g->dev->ops->free(g->dev, g->token);
    }
    free(g);
}

int fsdp_lm_decode_begin(const struct fsdp_lm *lm, struct fsdp_lm_decoder *d, int32_t token)
{
    FSDP_CHECK(fsdp_lm_decode_check(lm, &d->base, token));
    return fsdp_device_write(lm->dev, d->token, &token, sizeof(token));
}

int fsdp_lm_decode_end(const struct fsdp_lm *lm, struct fsdp_lm_decoder *d, float *logits)
{
    FSDP_CHECK(fsdp_device_read(lm->dev, logits, d->logits, lm->V * sizeof(float)));
    d->base.pos++;
    return 0;
}

int fsdp_lm_decode_check(const struct fsdp_lm *lm, const struct fsdp_decoder *d, int32_t token)
{
    if (d->pos >= d->max_T) {
        return fsdp_err(FSDP_ERR_INVALID, "%s decoder: position %d is past its cache of %d",
                        lm->name, d->pos, d->max_T);
    }
    if (token < 0 || (size_t)token >= lm->V) {
        return fsdp_err(FSDP_ERR_INVALID, "%s decoder: token %d is not below vocab_size %zu",
                        lm->name, (int)token, lm->V);
    }
    for (int u = 0; u < lm->spec->n_units; u++) {
        if (!lm->unit_params[u]) {
            return fsdp_err(FSDP_ERR_INVALID, "%s decoder: unit %d has no parameters set",
                            lm->name, u);
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// pipeline stages

int fsdp_lm_op_set_stage(struct fsdp_model *m, int u0, int u1)
{
    struct fsdp_lm *lm = (struct fsdp_lm *)m;
    if (u0 < 0 || u1 < u0 || u1 >= lm->spec->n_units || (u0 == 0 && u1 == 0) || u0 == lm->L + 1) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "%s: a pipeline stage of units [%d, %d] of %d holds "
                        "no block",
                        lm->name, u0, u1, lm->spec->n_units);
    }
    if (lm->act_memory) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "%s: pipeline stages are set before the activations are reserved",
                        lm->name);
    }
    lm->stage_lo = u0;
    lm->stage_hi = u1;
    return 0;
}

int fsdp_lm_op_share_workspace(struct fsdp_model *m, struct fsdp_model *donor)
{
    struct fsdp_lm *lm = (struct fsdp_lm *)m, *d = (struct fsdp_lm *)donor;
    if (!donor || donor == m || donor->ops != m->ops || d->stage_lo != lm->stage_lo ||
        d->stage_hi != lm->stage_hi || d->ws_donor || lm->ws_shared) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "%s: a workspace is shared only by an instance that shares none yet, "
                        "with another of the same architecture and stage that keeps its own",
                        lm->name);
    }
    if (lm->grad_act_memory) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: a workspace is shared before it is reserved",
                        lm->name);
    }
    lm->ws_donor = d;
    lm->ws_shared = d->ws_shared = 1;
    return 0;
}

int fsdp_lm_op_stage_buffers(struct fsdp_model *m, float **in, float **out, float **dres,
                             size_t *count)
{
    struct fsdp_lm *lm = (struct fsdp_lm *)m;
    if (!lm->act_memory) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: stage buffers before reserve", lm->name);
    }
    size_t BT = (size_t)lm->B * (size_t)lm->T;
    *count = fsdp_lm_rows_here(lm, BT) * lm->C; /* sequence parallel: this rank's rows */
    /* block l reads residual[l] and writes residual[l + 1]; the head reads residual[L] */
    *in = lm->stage_lo > 0 ? fsdp_lm_residual(lm, lm->stage_lo - 1) : NULL;
    *out = lm->stage_hi <= lm->L ? fsdp_lm_residual(lm, lm->stage_hi) : NULL;
    *dres = lm->dres;
    return 0;
}
