/*
 * oracle_engine.c - a single-rank engine for tests (oracle_engine.h): whole
 * parameters, gradients and AdamW moments in this process (four buffers of
 * N floats, each laid out unit after unit as the parameter table says), one
 * optimizer step as K x (forward, backward), global-norm clip, AdamW. No
 * shards, no collectives, no precision policy: the plainest implementation
 * of the engine table (src/parallel/engine.h), which the sharding engine must
 * equal.
 *
 * Gradient accumulation needs no extra pass: the backward's seed divides
 * each token's loss by K*B*T rather than B*T, so the accumulated gradient is
 * already the mean over the whole step, as torch's (loss / K).backward()
 * gives. Clipping is folded into AdamW's grad_scale, so the gradient buffer
 * keeps the pre-clip values.
 */
#include "config.h"
#include "tests/train/oracle_engine.h"
#include "core/error.h"
#include "core/util.h"
#include "compute/kernels.h"
#include "model/model.h"
#include "optim/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct oracle_engine {
    struct fsdp_engine base;
    const struct fsdp_model_spec *spec;
    struct fsdp_model *model;
    struct fsdp_optimizer opt;
    int B, T;
    float *params;    /* (N,) all units, unit after unit */
    float *grads;     /* (N,) */
    float *m;         /* (N,) first moment */
    float *v;         /* (N,) second moment */
    size_t *unit_off; /* (n_units,) element offset of unit u */
};

static struct oracle_engine *oracle_impl(const struct fsdp_engine *e)
{
    return e->impl;
}

static int oracle_step(struct fsdp_engine *e, const struct fsdp_batch *b, double lr,
                       int n_contrib, struct fsdp_step_result *out)
{
    struct oracle_engine *oe = oracle_impl(e);
    const struct fsdp_model_spec *s = oe->spec;
    const size_t bt = (size_t)oe->B * (size_t)oe->T;
    double loss_sum = 0.0;
    if (!b->inputs || n_contrib != 1 || b->B != oe->B || b->T != oe->T) {
        return fsdp_err(FSDP_ERR_INTERNAL, "oracle engine: one rank with a %d x %d batch", oe->B,
                        oe->T);
    }
    memset(oe->grads, 0, s->total_numel * sizeof(float));
    oe->model->ops->set_loss_seed(oe->model, (double)b->K * (double)bt, 1.0f);
    for (int k = 0; k < b->K; k++) {
        float loss;
        FSDP_CHECK(fsdp_model_forward(oe->model, b->inputs + k * bt, b->targets + k * bt, oe->B,
                                      oe->T, &loss));
        FSDP_CHECK(fsdp_model_backward(oe->model));
        loss_sum += loss;
    }
    out->loss = loss_sum / b->K;
    out->loss_scale = 0.0;
    double sumsq = fsdp_cpu_sumsq(oe->grads, s->total_numel);
    out->grad_norm = sqrt(sumsq);
    if (!isfinite(out->grad_norm)) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "gradient norm is %g (loss %g): parameters left unchanged; lower the learning rate or check the data",
                        out->grad_norm, out->loss);
    }
    out->clip_coef = oe->opt.oc.clip > 0.0f ? fsdp_cpu_clip_coef(sumsq, oe->opt.oc.clip) : 1.0f;
    fsdp_optimizer_begin(&oe->opt, lr);
    for (int u = 0; u < s->n_units; u++) {
        size_t off = oe->unit_off[u];
        float *state[2] = {oe->m + off, oe->v + off};
        FSDP_CHECK(fsdp_optimizer_update(&oe->opt, u, 0, s->unit_numel[u], oe->params + off,
                                         oe->grads + off, state, (float)out->clip_coef));
    }
    return 0;
}

static int oracle_eval(struct fsdp_engine *e, const int32_t *inputs, const int32_t *targets,
                       double *loss)
{
    struct oracle_engine *oe = oracle_impl(e);
    float l;
    FSDP_CHECK(fsdp_model_forward(oe->model, inputs, targets, oe->B, oe->T, &l));
    *loss = l;
    return 0;
}

static size_t oracle_n_pieces(const struct fsdp_engine *e)
{
    return 3 * oracle_impl(e)->spec->n_params;
}

/* One rank holds every row: a piece is a whole tensor. */
static void oracle_piece(struct fsdp_engine *e, size_t k, struct fsdp_state_piece *out)
{
    struct oracle_engine *oe = oracle_impl(e);
    const struct fsdp_model_spec *s = oe->spec;
    size_t i = k % s->n_params;
    float *const base[3] = {oe->params, oe->m, oe->v};
    out->kind = (int)(k / s->n_params);
    out->param = i;
    out->row0 = 0;
    out->rows = s->params[i].shape[0];
    out->data = base[out->kind] + oe->unit_off[s->params[i].unit] + s->params[i].offset;
}

static int oracle_state_changed(struct fsdp_engine *e)
{
    (void)e;
    return 0; /* nothing is derived from the state */
}

static int oracle_gather_unit(struct fsdp_engine *e, int u, const float **full)
{
    struct oracle_engine *oe = oracle_impl(e);
    *full = oe->params + oe->unit_off[u];
    return 0;
}

static void oracle_get_counters(const struct fsdp_engine *e, struct fsdp_engine_counters *c)
{
    *c = (struct fsdp_engine_counters){.opt_step = oracle_impl(e)->opt.step, .loss_scale = 1.0};
}

static void oracle_set_counters(struct fsdp_engine *e, const struct fsdp_engine_counters *c)
{
    oracle_impl(e)->opt.step = c->opt_step;
}

static void oracle_describe(const struct fsdp_engine *e, char *buf, size_t len)
{
    (void)e;
    snprintf(buf, len, "oracle: whole tensors in one process, no collectives");
}

static void oracle_destroy(struct fsdp_engine *e)
{
    struct oracle_engine *oe = oracle_impl(e);
    fsdp_model_destroy(oe->model);
    fsdp_free(oe->params);
    fsdp_free(oe->grads);
    fsdp_free(oe->m);
    fsdp_free(oe->v);
    free(oe->unit_off);
    free(oe);
}

static const struct fsdp_engine_ops oracle_ops = {
    .size = sizeof(struct fsdp_engine_ops),
    .name = "local (1 rank, unsharded)",
    .step = oracle_step,
    .eval = oracle_eval,
    .n_pieces = oracle_n_pieces,
    .piece = oracle_piece,
    .state_changed = oracle_state_changed,
    .gather_unit = oracle_gather_unit,
    .get_counters = oracle_get_counters,
    .set_counters = oracle_set_counters,
    .describe = oracle_describe,
    .destroy = oracle_destroy,
};

static int oracle_alloc(struct oracle_engine *oe)
{
    const struct fsdp_model_spec *s = oe->spec;
    size_t bytes = s->total_numel * sizeof(float);
    oe->unit_off = calloc((size_t)s->n_units, sizeof(*oe->unit_off));
    oe->params = fsdp_calloc(bytes);
    oe->grads = fsdp_calloc(bytes);
    oe->m = fsdp_calloc(bytes);
    oe->v = fsdp_calloc(bytes);
    if (!oe->unit_off || !oe->params || !oe->grads || !oe->m || !oe->v) {
        return fsdp_err(FSDP_ERR_NOMEM, "oracle engine: 4 x %zu bytes", bytes);
    }
    size_t off = 0;
    for (int u = 0; u < s->n_units; u++) {
        oe->unit_off[u] = off;
        off += s->unit_numel[u];
    }
    return 0;
}

int fsdp_oracle_engine_create(const struct fsdp_model_spec *spec, int B, int T, int head_chunk,
                              const struct fsdp_optim_config *oc, struct fsdp_engine **out)
{
    struct oracle_engine *oe = calloc(1, sizeof(*oe));
    int rc;
    if (!oe) {
        return fsdp_err(FSDP_ERR_NOMEM, "oracle engine");
    }
    struct fsdp_engine *e = &oe->base;
    e->ops = &oracle_ops;
    e->impl = oe;
    e->spec = spec;
    e->n_shards = 1;
    e->writes_state = 1;
    oe->spec = spec;
    oe->B = B;
    oe->T = T;
    fsdp_adamw_init(&oe->opt, oc, spec, NULL);
    e->n_state = oe->opt.n_state;
    e->state_names = oe->opt.state_names;
    FSDP_CHECK_GOTO(oracle_alloc(oe), rc, err);
    struct fsdp_model_opts mo = {.max_B = B, .max_T = T, .head_chunk = head_chunk};
    FSDP_CHECK_GOTO(fsdp_model_create(spec, &mo, &oe->model), rc, err);
    FSDP_CHECK_GOTO(oe->model->ops->reserve(oe->model), rc, err);
    for (int u = 0; u < spec->n_units; u++) {
        FSDP_CHECK_GOTO(oe->model->ops->set_unit(oe->model, u, oe->params + oe->unit_off[u],
                                                 FSDP_F32, oe->grads + oe->unit_off[u]),
                        rc, err);
    }
    e->flops_per_token = oe->model->ops->flops_per_token(spec, T);
    *out = e;
    return 0;
err:
    oracle_destroy(e);
    return rc;
}

const float *fsdp_oracle_engine_grads(const struct fsdp_engine *e, int unit)
{
    const struct oracle_engine *oe = oracle_impl(e);
    return oe->grads + oe->unit_off[unit];
}

const float *fsdp_oracle_engine_params(const struct fsdp_engine *e, int unit)
{
    const struct oracle_engine *oe = oracle_impl(e);
    return oe->params + oe->unit_off[unit];
}

void fsdp_oracle_engine_moments(const struct fsdp_engine *e, int unit, const float **m,
                                const float **v)
{
    const struct oracle_engine *oe = oracle_impl(e);
    *m = oe->m + oe->unit_off[unit];
    *v = oe->v + oe->unit_off[unit];
}

struct fsdp_model *fsdp_oracle_engine_model(const struct fsdp_engine *e)
{
    return oracle_impl(e)->model;
}
