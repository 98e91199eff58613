/*
 * engine_local.c - the single-rank engine: whole parameters, gradients and
 * AdamW moments in this process (four buffers of N floats, each laid out
 * unit after unit as the parameter table says), one optimizer step as
 * K x (forward, backward), global-norm clip, AdamW.
 *
 * Gradient accumulation needs no extra pass: the backward's seed divides
 * each token's loss by K*B*T rather than B*T, so the accumulated gradient is
 * already the mean over the whole step, as torch's (loss / K).backward()
 * gives. Clipping is folded into AdamW's grad_scale, so the gradient buffer
 * keeps the pre-clip values.
 */
#include "config.h"
#include "train/engine.h"
#include "core/error.h"
#include "core/util.h"
#include "io/ckpt.h"
#include "io/model_file.h"
#include "io/tokens.h"
#include "compute/kernels.h"
#include "model/gpt2.h"
#include "optim/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct local_engine {
    struct fsdp_model_spec *spec;
    struct fsdp_gpt2 *model;
    struct fsdp_optimizer opt; /* AdamW over whole units */
    int B, T;
    float *params;  /* (N,) all units, unit after unit */
    float *grads;   /* (N,) */
    float *m;       /* (N,) first moment */
    float *v;       /* (N,) second moment */
    float **units;  /* (n_units,) unit u's parameters inside params */
    size_t *unit_off; /* (n_units,) element offset of unit u */
};

static struct local_engine *local_impl(const struct fsdp_train_engine *e)
{
    return e->impl;
}

// ----------------------------------------------------------------------------
// ops

static int local_step(struct fsdp_train_engine *e, struct fsdp_dataloader *dl, int K, double lr,
                      struct fsdp_step_result *out)
{
    struct local_engine *le = local_impl(e);
    const struct fsdp_model_spec *s = le->spec;
    double loss_sum = 0.0;

    FSDP_CHECK(fsdp_gpt2_zero_grad(le->model, -1));
    fsdp_gpt2_set_loss_seed(le->model, (double)K * le->B * le->T, 1.0f);
    for (int k = 0; k < K; k++) {
        float loss;
        FSDP_CHECK(fsdp_dataloader_next(dl));
        FSDP_CHECK(fsdp_gpt2_forward(le->model, dl->inputs, dl->targets, le->B, le->T, &loss));
        FSDP_CHECK(fsdp_gpt2_backward(le->model));
        loss_sum += loss;
    }
    out->loss = loss_sum / K;

    double sumsq = fsdp_cpu_sumsq(le->grads, s->total_numel);
    out->grad_norm = sqrt(sumsq);
    if (!isfinite(out->grad_norm)) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "gradient norm is %g (loss %g): parameters left unchanged; lower the learning rate or check the data",
                        out->grad_norm, out->loss);
    }
    out->clip_coef = le->opt.oc.clip > 0.0f ? fsdp_cpu_clip_coef(sumsq, le->opt.oc.clip) : 1.0f;
    fsdp_optimizer_begin(&le->opt, lr);
    for (int u = 0; u < s->n_units; u++) {
        size_t off = le->unit_off[u];
        float *state[2] = {le->m + off, le->v + off};
        FSDP_CHECK(fsdp_optimizer_update(&le->opt, u, 0, s->unit_numel[u], le->params + off,
                                         le->grads + off, state, (float)out->clip_coef));
    }
    return 0;
}

static int local_eval(struct fsdp_train_engine *e, struct fsdp_dataloader *dl, double *loss)
{
    struct local_engine *le = local_impl(e);
    float l;
    FSDP_CHECK(fsdp_dataloader_next(dl));
    FSDP_CHECK(fsdp_gpt2_forward(le->model, dl->inputs, dl->targets, le->B, le->T, &l));
    *loss = l;
    return 0;
}

static int local_save(struct fsdp_train_engine *e, const char *path, const char *created_by)
{
    struct local_engine *le = local_impl(e);
    struct fsdp_model_write_opts opts = {.created_by = created_by, .dtype = FSDP_F32};
    return fsdp_model_file_write(path, le->spec, (const float *const *)le->units, &opts);
}

/* One rank holds every row: one shard file with the whole tensors. */
static int local_ckpt_save(struct fsdp_train_engine *e, const char *dir,
                           const struct fsdp_ckpt_meta *meta)
{
    struct local_engine *le = local_impl(e);
    const struct fsdp_model_spec *s = le->spec;
    struct fsdp_ckpt_shard_writer *w = NULL;
    int rc;
    FSDP_CHECK(fsdp_ckpt_shard_create(dir, 0, 1, meta->step, s, &w));
    for (size_t i = 0; i < s->n_params; i++) {
        size_t off = le->unit_off[s->params[i].unit] + s->params[i].offset;
        FSDP_CHECK_GOTO(fsdp_ckpt_shard_put(w, FSDP_CKPT_MODEL, i, le->params + off), rc, out);
        FSDP_CHECK_GOTO(fsdp_ckpt_shard_put(w, FSDP_CKPT_EXP_AVG, i, le->m + off), rc, out);
        FSDP_CHECK_GOTO(fsdp_ckpt_shard_put(w, FSDP_CKPT_EXP_AVG_SQ, i, le->v + off), rc, out);
    }
    FSDP_CHECK_GOTO(fsdp_ckpt_shard_commit(w), rc, out);
    struct fsdp_ckpt_meta m = *meta;
    m.n_shards = 1;
    m.world_size = 1;
    snprintf(m.mesh, sizeof(m.mesh), "single rank");
    snprintf(m.backends, sizeof(m.backends), "none");
    m.adam_step = le->opt.step;
    m.loss_scale = 1.0;
    m.scale_good_steps = 0;
    m.skipped_steps = 0;
    rc = fsdp_ckpt_index_write(dir, s, &m);
out:
    fsdp_ckpt_shard_destroy(w);
    return rc;
}

static int local_ckpt_load(struct fsdp_train_engine *e, struct fsdp_ckpt *ck)
{
    struct local_engine *le = local_impl(e);
    const struct fsdp_model_spec *s = le->spec;
    float *dst[FSDP_CKPT_NKINDS] = {le->params, le->m, le->v};
    for (size_t i = 0; i < s->n_params; i++) {
        size_t off = le->unit_off[s->params[i].unit] + s->params[i].offset;
        for (int k = 0; k < FSDP_CKPT_NKINDS; k++) {
            FSDP_CHECK(fsdp_ckpt_read_rows(ck, (enum fsdp_ckpt_kind)k, i, 0,
                                           s->params[i].shape[0], dst[k] + off));
        }
    }
    le->opt.step = fsdp_ckpt_meta(ck)->adam_step;
    return 0;
}

static int local_agree_max(struct fsdp_train_engine *e, int32_t *v, int n)
{
    (void)e;
    (void)v;
    (void)n;
    return 0; /* one rank agrees with itself */
}

/* One rank: it has the batch whenever a step runs (the loop ends without one). */
static int local_step_join(struct fsdp_train_engine *e, struct fsdp_dataloader *dl, int K,
                           double lr, int n_contrib, struct fsdp_step_result *out)
{
    if (!dl || n_contrib != 1) {
        return fsdp_err(FSDP_ERR_INTERNAL, "local engine: a joined step with %d contributing "
                        "rank%s and %s batch on its only rank", n_contrib,
                        n_contrib == 1 ? "" : "s", dl ? "a" : "no");
    }
    return local_step(e, dl, K, lr, out);
}

static void local_destroy(struct fsdp_train_engine *e)
{
    if (!e) {
        return;
    }
    struct local_engine *le = local_impl(e);
    if (le) {
        fsdp_gpt2_destroy(le->model);
        fsdp_free(le->params);
        fsdp_free(le->grads);
        fsdp_free(le->m);
        fsdp_free(le->v);
        free(le->units);
        free(le->unit_off);
        fsdp_model_spec_destroy(le->spec);
        free(le);
    }
    free(e);
}

static const struct fsdp_train_engine_ops local_ops = {
    .size = sizeof(struct fsdp_train_engine_ops),
    .name = "local (1 rank, unsharded)",
    .step = local_step,
    .eval = local_eval,
    .save = local_save,
    .destroy = local_destroy,
    .ckpt_save = local_ckpt_save,
    .ckpt_load = local_ckpt_load,
    .agree_max = local_agree_max,
    .step_join = local_step_join,
};

// ----------------------------------------------------------------------------
// setup

static int local_alloc(struct local_engine *le)
{
    const struct fsdp_model_spec *s = le->spec;
    size_t bytes = s->total_numel * sizeof(float);
    le->units = calloc((size_t)s->n_units, sizeof(*le->units));
    le->unit_off = calloc((size_t)s->n_units, sizeof(*le->unit_off));
    le->params = fsdp_alloc(bytes);
    le->grads = fsdp_calloc(bytes);
    le->m = fsdp_calloc(bytes);
    le->v = fsdp_calloc(bytes);
    if (!le->units || !le->unit_off || !le->params || !le->grads || !le->m || !le->v) {
        return fsdp_err(FSDP_ERR_NOMEM, "local engine: 4 x %zu bytes for parameters, gradients and AdamW moments",
                        bytes);
    }
    size_t off = 0;
    for (int u = 0; u < s->n_units; u++) {
        le->unit_off[u] = off;
        le->units[u] = le->params + off;
        off += s->unit_numel[u];
    }
    return 0;
}

int fsdp_local_engine_create(const char *model_path, int B, int T, int head_chunk,
                             const struct fsdp_optim_config *oc, struct fsdp_train_engine **out)
{
    struct fsdp_train_engine *e = calloc(1, sizeof(*e));
    struct local_engine *le = calloc(1, sizeof(*le));
    int rc;
    if (!e || !le) {
        free(e);
        free(le);
        return fsdp_err(FSDP_ERR_NOMEM, "local engine");
    }
    e->ops = &local_ops;
    e->impl = le;
    le->B = B;
    le->T = T;
    FSDP_CHECK_GOTO(fsdp_model_file_read_spec(model_path, &le->spec), rc, err);
    fsdp_adamw_init(&le->opt, oc, le->spec);
    FSDP_CHECK_GOTO(local_alloc(le), rc, err);
    FSDP_CHECK_GOTO(fsdp_model_file_read(model_path, le->spec, le->units), rc, err);
    FSDP_CHECK_GOTO(fsdp_gpt2_create(le->spec, B, T, &le->model), rc, err);
    FSDP_CHECK_GOTO(fsdp_gpt2_set_head_chunk(le->model, head_chunk), rc, err);
    for (int u = 0; u < le->spec->n_units; u++) {
        FSDP_CHECK_GOTO(fsdp_gpt2_set_unit(le->model, u, le->units[u], le->grads + le->unit_off[u]),
                        rc, err);
    }
    FSDP_CHECK_GOTO(fsdp_gpt2_reserve(le->model), rc, err);
    e->spec = le->spec;
    e->flops_per_token = fsdp_gpt2_flops_per_token(le->spec, T);
    *out = e;
    return 0;

err:
    local_destroy(e); /* frees whatever was set up, in reverse */
    return rc;
}

const float *fsdp_local_engine_grads(const struct fsdp_train_engine *e, int unit)
{
    const struct local_engine *le = local_impl(e);
    return le->grads + le->unit_off[unit];
}

const float *fsdp_local_engine_params(const struct fsdp_train_engine *e, int unit)
{
    const struct local_engine *le = local_impl(e);
    return le->units[unit];
}

void fsdp_local_engine_moments(const struct fsdp_train_engine *e, int unit, const float **m,
                               const float **v)
{
    const struct local_engine *le = local_impl(e);
    *m = le->m + le->unit_off[unit];
    *v = le->v + le->unit_off[unit];
}

struct fsdp_gpt2 *fsdp_local_engine_model(const struct fsdp_train_engine *e)
{
    return local_impl(e)->model;
}
