/*
 * engine.c - the sharding engine's table (engine.h): one optimizer
 * step as K x (forward with all-gathers, backward with re-gathers and
 * reduce-scatters), the global-norm clip over the gradient shards, AdamW on
 * the shards, and f16 loss scaling.
 *
 * Schedule of one micro-batch (P = prefetch):
 *   forward   for u = 0 .. L+1: issue the gathers of u .. u+P, wait for u,
 *             compute u, release u (reshard after forward; not unit 0, the
 *             root, nor L+1, whose backward comes next)
 *   backward  for u = L+1 .. 0: issue the gathers of u .. u-P, finish the
 *             reduction that last used u's gradient buffer, zero it, wait
 *             for u's parameters, compute u, release u, issue u's
 *             reduce-scatter (completed while the next units compute)
 * After every unit's compute fsdp_unit_progress has the group layer drive
 * what is in flight, notes finished collectives and moves finished
 * reduce-scatters on to their all-reduces over the replicas. Unit 0's gradient buffer is zeroed
 * before unit L+1's backward, which adds the tied head's gradient into it, and is reduced only
 * after unit 0's own backward.
 *
 * The loss seed divides every token's loss by the global token count
 * K * B * T * world, and the reductions SUM, so the gradient shards hold
 * exactly the single-rank mean gradient of the global batch.
 *
 * A model that takes unit 0 by rows (model.h, set_unit_rows) computes it,
 * and the units tied to it, from each rank's rows and exchanges
 * activations over the shard group itself: unit 0 is then never gathered
 * nor reduce-scattered, and its gradient exists only as this rank's rows.
 * Those exchanges are collectives of every rank, so a rank without a batch
 * runs the model's units too (the model does only the exchanges).
 *
 * With offload (offload.c) the gradient shards are copied to the host as
 * they become final and AdamW runs there, after the norm.
 *
 * With tensor parallelism (a tp group) everything above runs on the rank's
 * tp-local table; the model calls its tp collectives inside forward_unit and
 * backward_unit, blocking, on the tp group, while the dp collectives of the
 * next units are in flight. The squared gradient norm adds the replicated
 * parameters on tp rank 0 only and is summed over the tp group too.
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "compute/kernels.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct fsdp_shard_engine *shard_impl(const struct fsdp_engine *e)
{
    return e->impl;
}

// ----------------------------------------------------------------------------
// one micro-batch

/* The model computes unit u in its slots; on one rank without a precision
 * policy or replicas, on the shards themselves (nothing to gather or
 * reduce); unit 0 by rows on this rank's rows, in its slots where the
 * policy or the replicas need them, else in the shards themselves. */
static int shard_bind(struct fsdp_shard_engine *se, int u)
{
    void *p = se->direct ? se->units[u].master : se->pslots[fsdp_unit_pslot(se, u)].buf;
    float *g = se->direct ? se->units[u].grad : se->gslots[fsdp_unit_gslot(se, u)].buf;
    if (fsdp_shard_by_rows(se, u)) {
        p = p ? p : se->units[u].master;
        g = g ? g : se->units[u].grad;
    }
    /* the master shard (direct, or unit 0's rows) is f32; a slot holds the param dtype */
    enum fsdp_dtype pt = p == se->units[u].master ? FSDP_F32 : se->ec.param_dtype;
    return se->model->ops->set_unit(se->model, u, p, pt, g);
}

/* Whether the model runs this pass: always, unless this rank has no batch
 * and the model exchanges nothing. */
static int shard_runs_model(const struct fsdp_shard_engine *se)
{
    return !se->shadow || se->rows_root;
}

/* In a shadow pass (se->shadow) every collective is issued and waited for
 * exactly as in a computing one, and the compute is left out. */
static int shard_forward(struct fsdp_shard_engine *se, const int32_t *inputs,
                         const int32_t *targets)
{
    const int last = se->n_units - 1, hi = se->u_hi;
    if (shard_runs_model(se)) {
        FSDP_CHECK(se->model->ops->set_batch(se->model, inputs, targets, se->ec.B, se->ec.T));
    }
    for (int u = se->u_lo; u <= hi; u++) {
        for (int j = u; j <= hi && j <= u + se->ec.prefetch; j++) {
            FSDP_CHECK(fsdp_unit_gather_issue(se, j));
        }
        FSDP_CHECK(fsdp_unit_gather_wait(se, u));
        if (shard_runs_model(se)) {
            FSDP_CHECK(shard_bind(se, u));
            FSDP_CHECK(se->model->ops->forward_unit(se->model, u));
        }
        FSDP_CHECK(fsdp_unit_progress(se));
        if (!se->keep_gathered && u != 0 && u != last) {
            fsdp_unit_release(se, u);
        }
    }
    return 0;
}

static void shard_zero_gslot(struct fsdp_shard_engine *se, int u)
{
    struct fsdp_gslot *s = &se->gslots[fsdp_unit_gslot(se, u)];
    size_t n = fsdp_shard_by_rows(se, u) ? se->units[u].S : se->units[u].numel;
    (void)fsdp_device_zero(se->dev, s->buf, n * sizeof(float));
}

/* Unit 0's gradient before a micro-batch's backward: its slot starts at
 * zero; by rows without a slot the model adds into the gradient shard,
 * which only the step's first micro-batch zeroes. */
static int shard_zero_root(struct fsdp_shard_engine *se, int first, int accumulate)
{
    struct fsdp_gslot *s = &se->gslots[fsdp_unit_gslot(se, 0)];
    if (fsdp_shard_by_rows(se, 0) && !s->buf) {
        if (first && !accumulate) {
            FSDP_CHECK(
                fsdp_device_zero(se->dev, se->units[0].grad, se->units[0].S * sizeof(float)));
        }
        return 0;
    }
    if (first) {
        FSDP_CHECK(fsdp_unit_reduce_wait_slot(se, fsdp_unit_gslot(se, 0)));
        shard_zero_gslot(se, 0);
    }
    return 0;
}

/* Whether unit u's gradient shard is written by its backward itself (no
 * reduction retires into it): the direct engine's, unit 0 by rows without
 * a slot. */
static int shard_grad_unreduced(const struct fsdp_shard_engine *se, int u)
{
    return se->direct || (fsdp_shard_by_rows(se, u) && !se->gslots[fsdp_unit_gslot(se, u)].buf);
}

/* reduce: issue the reductions of this micro-batch; first: its grads start
 * at zero; accumulate: the reduced result adds to the gradient shard. A
 * direct engine's backward adds into the gradient shard itself, which only
 * the step's first micro-batch zeroes. */
static int shard_backward(struct fsdp_shard_engine *se, int first, int reduce, int accumulate)
{
    const int last = se->u_hi, lo = se->u_lo;
    if (se->direct) {
        for (int u = lo; first && !accumulate && u <= last; u++) {
            FSDP_CHECK(
                fsdp_device_zero(se->dev, se->units[u].grad, se->units[u].numel * sizeof(float)));
        }
        reduce = 0;
        first = 0;
    }
    if (lo == 0) {
        FSDP_CHECK(shard_zero_root(se, first, accumulate));
    }
    for (int u = last; u >= lo; u--) {
        for (int j = u; j >= lo && j >= u - se->ec.prefetch; j--) {
            FSDP_CHECK(fsdp_unit_gather_issue(se, j));
        }
        if (u != 0) {
            FSDP_CHECK(fsdp_unit_reduce_wait_slot(se, fsdp_unit_gslot(se, u)));
            if (first) {
                shard_zero_gslot(se, u);
            }
        }
        FSDP_CHECK(fsdp_unit_gather_wait(se, u));
        if (shard_runs_model(se)) { /* a shadow pass reduces the zeroed buffer */
            FSDP_CHECK(shard_bind(se, u));
            FSDP_CHECK(se->model->ops->backward_unit(se->model, u));
        }
        FSDP_CHECK(fsdp_unit_progress(se));
        if (u != 0) {
            fsdp_unit_release(se, u);
        }
        if (reduce) {
            FSDP_CHECK(fsdp_unit_reduce_issue(se, u, accumulate));
        }
        if (se->stage_grads && shard_grad_unreduced(se, u)) {
            FSDP_CHECK(fsdp_offload_stage_grad(se, u)); /* final: to the host now */
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// optimizer

/* Whether g's backend takes device memory only (nccl): the host's values
 * then go through the device. */
int fsdp_shard_group_device_only(const struct fsdp_group *g)
{
    const struct fsdp_backend_ops *o = g->ops;
    uint32_t caps = o->size >= offsetof(struct fsdp_backend_ops, mem_caps) + sizeof(o->mem_caps)
                        ? o->mem_caps
                        : FSDP_CAP_MEM_HOST;
    return !(caps & FSDP_CAP_MEM_HOST);
}

int fsdp_shard_sums_on_device(const struct fsdp_shard_engine *se)
{
    int on = se->shard_g && fsdp_shard_group_device_only(se->shard_g);
    for (int i = 0; i < se->n_rep; i++) {
        on |= fsdp_shard_group_device_only(se->rep_g[i]);
    }
    return on || (se->tp && se->tp->g && fsdp_shard_group_device_only(se->tp->g));
}

/* se->sum_buf = every rank's *x over g, through the device (se->dnorm's
 * room after the norm), on the compute stream. */
static int shard_gather_on_device(struct fsdp_shard_engine *se, struct fsdp_group *g,
                                  const double *x)
{
    struct fsdp_device *d = se->dev;
    const struct fsdp_coll_attr attr = {.mem = d->mem, .stream = d->stream};
    double *mine = se->dnorm + 1, *all = se->dnorm + 2; /* (1,) and (g->size,) */
    struct fsdp_work *w = NULL;
    FSDP_CHECK(fsdp_device_write(d, mine, x, sizeof(double)));
    FSDP_CHECK(fsdp_allgather(g, mine, all, sizeof(double), FSDP_U8, &attr, &w));
    int rc = fsdp_work_wait(w, -1.0);
    fsdp_work_free(w);
    FSDP_CHECK(rc);
    return fsdp_device_read(d, se->sum_buf, all, (size_t)g->size * sizeof(double));
}

/* Sum of x over group g: every rank's double is all-gathered as bytes and
 * added in rank order, so the sum is as exact as the single-rank engine's
 * and the same on every rank. */
static int shard_group_sum(struct fsdp_shard_engine *se, struct fsdp_group *g, double *x)
{
    if (fsdp_shard_group_device_only(g)) {
        FSDP_CHECK(shard_gather_on_device(se, g, x));
    } else {
        FSDP_CHECK(fsdp_allgather_sync(g, x, se->sum_buf, sizeof(double), FSDP_U8));
    }
    double sum = 0.0;
    for (int r = 0; r < g->size; r++) {
        sum += se->sum_buf[r];
    }
    *x = sum;
    return 0;
}

/* Sum of x over every data-parallel rank: the shard group, then the replicas. */
static int shard_world_sum(struct fsdp_shard_engine *se, double *x)
{
    if (se->shard_g) {
        FSDP_CHECK(shard_group_sum(se, se->shard_g, x));
    }
    for (int i = 0; i < se->n_rep; i++) {
        FSDP_CHECK(shard_group_sum(se, se->rep_g[i], x));
    }
    return 0;
}

/* This rank's part of the squared norm: with tensor parallelism its tp
 * shards of the cut parameters, and the replicated ones on tp rank 0 only
 * (every tp rank holds the same copy). Summed on the device, in the order
 * the host once summed it, and read once: the step's one wait for a value
 * besides the loss. */
static int shard_local_sumsq(struct fsdp_shard_engine *se, double *out)
{
    struct fsdp_device *d = se->dev;
    FSDP_CHECK(fsdp_device_zero(d, se->dnorm, sizeof(double)));
    for (int u = se->norm_skip_root ? 1 : 0; u < se->n_units; u++) {
        const struct fsdp_unit *un = &se->units[u];
        if (!se->plan) {
            d->k->sumsq(d, se->dnorm, un->grad, un->cnt);
            continue;
        }
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            const struct fsdp_shard_seg *g = fsdp_shard_seg(se, se->rs, i);
            if (g->len > 0 && (se->plan->rank == 0 || !fsdp_tp_plan_replicated(se->plan, i))) {
                d->k->sumsq(d, se->dnorm, un->grad + g->block_off, g->len);
            }
        }
    }
    return fsdp_device_read(d, out, se->dnorm, sizeof(double));
}

/* Sum of squares of the whole model's gradient: the shards summed over the
 * shard group (replicas hold the same shards), then over the tp group;
 * local: this rank's part alone. */
static int shard_sumsq(struct fsdp_shard_engine *se, double *local, double *out)
{
    FSDP_CHECK(shard_local_sumsq(se, local));
    *out = *local;
    if (se->shard_g) {
        FSDP_CHECK(shard_group_sum(se, se->shard_g, out));
    }
    if (se->plan) {
        FSDP_CHECK(shard_group_sum(se, se->tp->g, out));
    }
    return se->sumsq_hook ? se->sumsq_hook(se->sumsq_arg, out) : 0;
}

static int shard_optimize(struct fsdp_shard_engine *se, double lr, struct fsdp_step_result *out)
{
    double local, sumsq;
    FSDP_CHECK(shard_sumsq(se, &local, &sumsq));
    const double scale = se->scaler.scale;
    out->loss_scale = se->scaler.on ? scale : 0.0;
    /* The decision is the group's: an overflow in some shards only must
     * skip the step on every rank. Each rank says what it saw and decided
     * (tests read these lines from every rank). */
    const int finite = isfinite(sumsq);
    FSDP_DEBUG(FSDP_SUB_FSDP, "update %ld: local gradient shard %s, shard group %s: step %s",
               se->opt->step + se->scaler.skipped + 1, isfinite(local) ? "finite" : "overflowed",
               finite ? "finite" : "overflowed", finite ? "applied" : "skipped");
    if (!finite) {
        out->grad_norm = NAN;
        out->clip_coef = 0.0;
        if (!se->scaler.dynamic) {
            return fsdp_err(FSDP_ERR_INVALID,
                            "gradient norm is %g (loss %g): parameters left unchanged; lower the learning rate or check the data",
                            sqrt(sumsq), out->loss);
        }
        fsdp_loss_scaler_update(&se->scaler, 0);
        if (se->offload) {
            FSDP_CHECK(fsdp_offload_skip(se));
        }
        if (se->world_rank == 0) {
            FSDP_WARN(FSDP_SUB_FSDP,
                      "step skipped: gradients overflowed at loss scale %g; scale now %g", scale,
                      (double)se->scaler.scale);
        }
        return 0;
    }
    sumsq /= scale * scale;
    out->grad_norm = sqrt(sumsq);
    out->clip_coef = se->opt->oc.clip > 0.0f ? fsdp_cpu_clip_coef(sumsq, se->opt->oc.clip) : 1.0f;
    fsdp_loss_scaler_update(&se->scaler, 1);
    fsdp_optimizer_begin(se->opt, lr);
    float grad_scale = (float)(out->clip_coef / scale);
    if (se->offload) {
        return fsdp_offload_update(se, grad_scale); /* on the host, over staged shards */
    }
    for (int u = 0; u < se->n_units; u++) {
        FSDP_CHECK(fsdp_shard_update_unit(se, u, 0, grad_scale));
    }
    return 0;
}

int fsdp_shard_update_unit(struct fsdp_shard_engine *se, int u, int host, float grad_scale)
{
    const struct fsdp_unit *un = &se->units[u];
    for (size_t i = un->first; i < un->first + un->nparam; i++) {
        const struct fsdp_shard_seg *g = fsdp_shard_seg(se, se->rs, i);
        if (g->len == 0) {
            continue;
        }
        size_t off = g->block_off;
        float *state[2] = {un->m + off, un->v + off};
        if (host) {
            FSDP_CHECK(fsdp_optimizer_update_host(se->opt, u, g->unit_at, g->len, un->hmaster + off,
                                                  un->hgrad + off, state, grad_scale));
        } else {
            FSDP_CHECK(fsdp_optimizer_update(se->opt, u, g->unit_at, g->len, un->master + off,
                                             un->grad + off, state, grad_scale));
        }
    }
    return 0;
}

// ----------------------------------------------------------------------------
// ops

/*
 * n_contrib ranks have a batch; b->inputs NULL: not this one. The loss seed divides
 * by the contributing ranks' tokens and a rank without a batch reduces
 * zeros, so the summed gradient is the mean over the batches that exist; the
 * loss is summed over every rank (0 here) and divided the same way.
 */
static int shard_step(struct fsdp_engine *e, const struct fsdp_batch *b, double lr,
                      int n_contrib, struct fsdp_step_result *out)
{
    struct fsdp_shard_engine *se = shard_impl(e);
    const int nosync = se->ec.no_sync_accum;
    fsdp_shard_drop_saved(se);
    const int K = b->K, have = b->inputs != NULL;
    const size_t bt = (size_t)se->ec.B * (size_t)se->ec.T;
    double loss_sum = 0.0;
    int rc = 0;
    if (n_contrib < 1 || n_contrib > se->world || K < 1) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: %d contributing ranks of %d, %d micro-batches",
                        n_contrib, se->world, K);
    }
    if (b->B != se->ec.B || b->T != se->ec.T) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp: batch %d x %d, the engine was made for %d x %d",
                        b->B, b->T, se->ec.B, se->ec.T);
    }
    se->shadow = !have;
    fsdp_offload_step_begin(se);
    se->model->ops->set_loss_seed(se->model, (double)K * (double)bt * n_contrib,
                                  se->scaler.scale);
    for (int k = 0; k < K && rc == 0; k++) {
        FSDP_CHECK_GOTO(shard_forward(se, have ? b->inputs + k * bt : NULL,
                                      have ? b->targets + k * bt : NULL),
                        rc, out);
        loss_sum += have ? se->model->ops->loss(se->model) : 0.0;
        int first = nosync ? k == 0 : 1;
        int reduce = nosync ? k == K - 1 : 1;
        se->stage_grads = se->offload && k == K - 1; /* gradients final as they are reduced */
        FSDP_CHECK_GOTO(shard_backward(se, first, reduce, !nosync && k > 0), rc, out);
    }
    FSDP_CHECK_GOTO(fsdp_unit_reduce_wait_all(se), rc, out);
    double loss = loss_sum / K;
    FSDP_CHECK_GOTO(shard_world_sum(se, &loss), rc, out);
    out->loss = loss / n_contrib;
    rc = shard_optimize(se, lr, out);
out:
    se->shadow = 0;
    se->stage_grads = 0;
    fsdp_unit_release_all(se); /* the parameters changed (or the step failed) */
    return rc;
}

static int shard_eval(struct fsdp_engine *e, const int32_t *inputs, const int32_t *targets,
                      double *loss)
{
    struct fsdp_shard_engine *se = shard_impl(e);
    fsdp_shard_drop_saved(se);
    int rc = shard_forward(se, inputs, targets);
    fsdp_unit_release_all(se);
    FSDP_CHECK(rc);
    double l = se->model->ops->loss(se->model);
    FSDP_CHECK(shard_world_sum(se, &l));
    *loss = l / se->world;
    return 0;
}

static size_t shard_n_pieces(const struct fsdp_engine *e)
{
    return fsdp_shard_n_pieces(shard_impl(e));
}

static void shard_piece(struct fsdp_engine *e, size_t k, struct fsdp_state_piece *out)
{
    fsdp_shard_piece(shard_impl(e), k, out);
}

static int shard_state_changed(struct fsdp_engine *e)
{
    fsdp_shard_drop_saved(shard_impl(e));
    fsdp_unit_release_all(shard_impl(e));
    return fsdp_offload_state_changed(shard_impl(e));
}

static int shard_gather_unit(struct fsdp_engine *e, int u, const float **full)
{
    struct fsdp_shard_engine *se = shard_impl(e);
    if (u < 0 || u >= se->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "fsdp: unit %d out of range [0, %d)", u, se->n_units);
    }
    return fsdp_shard_gather_unit(se, u, full);
}

static void shard_get_counters(const struct fsdp_engine *e, struct fsdp_engine_counters *c)
{
    const struct fsdp_shard_engine *se = shard_impl(e);
    c->opt_step = se->opt->step;
    c->loss_scale = se->scaler.scale;
    c->scale_good_steps = se->scaler.good_steps;
    c->skipped_steps = se->scaler.skipped;
}

/* A static scale stays what this run was given; a dynamic one continues. */
static void shard_set_counters(struct fsdp_engine *e, const struct fsdp_engine_counters *c)
{
    struct fsdp_shard_engine *se = shard_impl(e);
    se->opt->step = c->opt_step;
    se->scaler.skipped = c->skipped_steps;
    if (se->scaler.dynamic) {
        se->scaler.scale = (float)c->loss_scale;
        se->scaler.good_steps = c->scale_good_steps;
    }
}

static const char *shard_offload_words(int offload)
{
    static const char *const words[] = {"", " | offload: optimizer state on the host",
                                        " | offload: master and optimizer state on the host"};
    return offload >= 0 && offload < 3 ? words[offload] : "";
}

static void shard_describe(const struct fsdp_engine *e, char *buf, size_t len)
{
    static const char *const modes[] = {"full", "grad-op", "none"};
    const struct fsdp_shard_engine *se = shard_impl(e);
    const struct fsdp_shard_config *ec = &se->ec;
    char scale[48] = "off";
    if (ec->loss_scale_dynamic) {
        snprintf(scale, sizeof(scale), "dynamic from %g", ec->loss_scale);
    } else if (ec->loss_scale > 0.0) {
        snprintf(scale, sizeof(scale), "%g", ec->loss_scale);
    }
    char tp[96] = "";
    if (se->plan) {
        snprintf(tp, sizeof(tp), " | tensor parallel over %d ranks%s", se->tp->size,
                 se->tp->sp ? ", sequence parallel" : "");
    }
    snprintf(buf, len,
             "fsdp: mesh %s (%s) | %d-way dim-0 shards x %d replicas | sharding %s, reshard after "
             "forward %s, prefetch %d | param %s, reduce %s, loss scale %s%s%s%s%s%s",
             se->mesh, se->backends, se->Rs, se->world / se->Rs, modes[ec->sharding],
             se->keep_gathered ? "off" : "on", ec->prefetch, fsdp_dtype_name(ec->param_dtype),
             fsdp_dtype_name(ec->reduce_dtype), scale,
             ec->no_sync_accum ? " | no-sync accumulation" : "",
             ec->activation_checkpointing ? " | activation checkpointing" : "",
             se->rows_root ? " | unit 0 by rows" : "", tp, shard_offload_words(se->offload));
}

static int shard_save_rows(struct fsdp_engine *e, int kind, size_t param, float *out)
{
    return fsdp_shard_save_rows(shard_impl(e), kind, param, out);
}

static void shard_destroy(struct fsdp_engine *e)
{
    if (!e) {
        return;
    }
    struct fsdp_shard_engine *se = shard_impl(e);
    fsdp_offload_fini(se);   /* its copies finish before the buffers go */
    fsdp_shard_teardown(se); /* the parts (model, plan, optimizer) are the caller's */
    fsdp_unit_streams_fini(se);
    free(se->own);
    free(se);
}

static const struct fsdp_engine_ops shard_ops = {
    .size = sizeof(struct fsdp_engine_ops),
    .name = "fsdp (sharded)",
    .step = shard_step,
    .eval = shard_eval,
    .n_pieces = shard_n_pieces,
    .piece = shard_piece,
    .state_changed = shard_state_changed,
    .gather_unit = shard_gather_unit,
    .get_counters = shard_get_counters,
    .set_counters = shard_set_counters,
    .describe = shard_describe,
    .destroy = shard_destroy,
    .save_rows = shard_save_rows,
};

// ----------------------------------------------------------------------------
// setup

void fsdp_shard_config_init(struct fsdp_shard_config *sc)
{
    memset(sc, 0, sizeof(*sc));
    sc->sharding = FSDP_SHARD_FULL;
    sc->reshard_after_forward = true;
    sc->prefetch = 1;
    sc->param_dtype = FSDP_F32;
    sc->reduce_dtype = FSDP_F32;
}

void fsdp_shard_memory_line(const struct fsdp_engine_stats *st, char *buf, size_t len)
{
    int n = snprintf(buf, len,
                     "fsdp: %d-way shards x %d replicas | model states %zu bytes "
                     "(shards %zu + gathered params %zu) | unsharded grads %zu | comm %zu | "
                     "activations %zu (saved %zu, workspace %zu) | total %zu bytes",
                     st->shards, st->replicas, st->model_bytes, st->state_bytes, st->gathered_bytes,
                     st->grad_bytes, st->comm_bytes, st->act_bytes, st->act_saved_bytes,
                     st->act_bytes - st->act_saved_bytes, st->peak_bytes);
    if (st->host_bytes && n > 0 && (size_t)n < len) {
        snprintf(buf + n, len - (size_t)n, " | host pinned %zu bytes (offload)", st->host_bytes);
    }
}

static void shard_log_memory(const struct fsdp_shard_engine *se)
{
    struct fsdp_engine_stats st;
    char line[512];
    fsdp_shard_engine_stats(&se->base, &st);
    fsdp_shard_memory_line(&st, line, sizeof(line));
    FSDP_INFO(FSDP_SUB_FSDP, "%s", line);
}

/*
 * Sharding applied to the parts' model: whether it takes unit 0 by rows
 * over the shard group (a model that can, with a shard group: the root's
 * tables then never exist whole on any rank), then its activations.
 */
static int shard_apply_model(struct fsdp_shard_engine *se)
{
    const struct fsdp_model_ops *ops = se->model->ops;
    int has_rows = ops->size >= offsetof(struct fsdp_model_ops, set_unit_rows) +
                                    sizeof(ops->set_unit_rows) &&
                   ops->set_unit_rows;
    if (se->shard_g && has_rows && !se->staged) {
        int rc = ops->set_unit_rows(se->model, 0, se->shard_g);
        FSDP_CHECK(rc);
        se->rows_root = rc == 1;
    }
    return se->sizing ? 0 : se->model->ops->reserve(se->model);
}

/* Each group's backend must take the device's memory in its collectives. */
/*
 * The engine for the parts p over g, sized and (unless sizing) allocated:
 * the layout, the model's rows and activations, the slots. *out is the
 * engine, also on failure (for shard_destroy) unless it could not be made.
 */
static int shard_build(const struct fsdp_shard_parts *p, const struct fsdp_shard_groups *g,
                       struct fsdp_device *dev, const struct fsdp_shard_config *sc, int sizing,
                       struct fsdp_shard_engine **out)
{
    *out = NULL;
    FSDP_CHECK(fsdp_shard_check_config(sc));
    FSDP_CHECK(fsdp_shard_check_parts(p));
    FSDP_CHECK(fsdp_shard_check_ties(p->spec));
    struct fsdp_shard_engine *se = calloc(1, sizeof(*se));
    if (!se) {
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp engine");
    }
    *out = se;
    se->sizing = sizing;
    long long bound = fsdp_env_int("FSDPC_CKPT_RELAYOUT_BYTES", (long long)64 << 20);
    se->relayout_bound = bound > 0 ? (size_t)bound / sizeof(float) : 0;
    struct fsdp_engine *e = &se->base;
    e->ops = &shard_ops;
    e->impl = se;
    e->spec = p->spec;
    se->full = p->spec;
    se->plan = p->plan; /* the engine shards and computes the tp-local table */
    se->spec = fsdp_shard_parts_table(p);
    se->model = p->model;
    se->opt = p->opt;
    se->ec = *sc;
    se->dev = dev;
    se->attr.mem = dev->mem;
    fsdp_loss_scaler_init(&se->scaler, sc->loss_scale_dynamic, sc->loss_scale);
    fsdp_tp_init(&se->solo, NULL, 0, dev);
    se->tp = p->tp ? p->tp : &se->solo;
    fsdp_shard_groups_set(se, g);
    FSDP_CHECK(fsdp_shard_check_offload(se, p));
    se->u_lo = sc->unit_hi > 0 ? sc->unit_lo : 0;
    se->u_hi = sc->unit_hi > 0 ? sc->unit_hi : se->spec->n_units - 1;
    if (se->u_lo < 0 || se->u_lo > se->u_hi || se->u_hi >= se->spec->n_units) {
        return fsdp_err(FSDP_ERR_INTERNAL, "fsdp: units [%d, %d] of %d", se->u_lo, se->u_hi,
                        se->spec->n_units);
    }
    se->staged = sc->unit_hi > 0 || sc->unit_mask;
    if (sc->unit_mask) {
        se->own = malloc((size_t)se->spec->n_units);
        if (!se->own) {
            return fsdp_err(FSDP_ERR_NOMEM, "fsdp: unit table");
        }
        memcpy(se->own, sc->unit_mask, (size_t)se->spec->n_units);
    }
    if (!sizing) {
        FSDP_CHECK(fsdp_shard_check_backends(se));
        FSDP_CHECK(fsdp_unit_streams_init(se));
        FSDP_CHECK(fsdp_offload_init(se));
    }
    FSDP_CHECK(fsdp_shard_layout_create(se));
    FSDP_CHECK(shard_apply_model(se));
    FSDP_CHECK(fsdp_shard_alloc_slots(se));
    e->flops_per_token = se->model->ops->flops_per_token(p->spec, sc->T);
    e->n_state = se->opt->n_state;
    e->state_names = se->opt->state_names;
    e->shard = se->rs;
    e->n_shards = se->Rs;
    if (se->plan) { /* checkpoint shard rs T + t of Rs T, re-laid out as rows (save_rows) */
        e->shard = se->rs * se->tp->size + se->tp->rank;
        e->n_shards = se->Rs * se->tp->size;
        e->blocks = 1;
    }
    e->writes_state = 1;
    for (int i = 0; i < se->n_rep; i++) {
        e->writes_state &= se->rep_g[i]->rank == 0; /* the first replica writes */
    }
    return 0;
}

int fsdp_shard_engine_create(const struct fsdp_shard_parts *p, const struct fsdp_shard_groups *g,
                             struct fsdp_device *dev, const struct fsdp_shard_config *sc,
                             struct fsdp_engine **out)
{
    struct fsdp_shard_engine *se;
    int rc = shard_build(p, g, dev, sc, 0, &se);
    if (rc == 0 && fsdp_shard_owns(se, 0)) { /* the root stays bound: a tied unit reads and
                                        accumulates into it */
        rc = shard_bind(se, 0);
    }
    if (rc < 0) {
        shard_destroy(se ? &se->base : NULL);
        return rc;
    }
    if (se->world_rank == 0) {
        shard_log_memory(se);
        if (se->offload && strcmp(dev->ops->name, "cpu") == 0) {
            FSDP_WARN(FSDP_SUB_FSDP,
                      "offload on device cpu changes nothing: its memory is host "
                      "memory already (the state is only copied between two host buffers)");
        }
    }
    *out = &se->base;
    return 0;
}

int fsdp_shard_engine_plan(const struct fsdp_shard_parts *p, const struct fsdp_shard_shape *sh,
                           struct fsdp_device *dev, const struct fsdp_shard_config *sc,
                           struct fsdp_engine_stats *out)
{
    /* groups that are only shapes: the sizing build reads their size and
     * rank and never calls a collective on them */
    struct fsdp_group dp = {.name = "dp", .size = sh->dp, .rank = sh->dp_rank};
    struct fsdp_group rdp = {.name = "rdp", .size = sh->rdp};
    const int tp = p->tp ? p->tp->size : 1, tp_rank = p->tp ? p->tp->rank : 0;
    if (sh->dp < 1 || sh->rdp < 1 || sh->dp_rank < 0 || sh->dp_rank >= sh->dp || sh->tp != tp ||
        sh->tp_rank != tp_rank) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "fsdp plan: rank (dp %d of %d, tp %d of %d), rdp %d, "
                        "for parts of tp rank %d of %d",
                        sh->dp_rank, sh->dp, sh->tp_rank, sh->tp, sh->rdp, tp_rank, tp);
    }
    struct fsdp_shard_groups g = {.dp = &dp, .rdp = &rdp, .world_rank = -1};
    struct fsdp_shard_engine *se;
    int rc = shard_build(p, &g, dev, sc, 1, &se);
    if (rc == 0) {
        fsdp_shard_engine_stats(&se->base, out);
    }
    shard_destroy(se ? &se->base : NULL);
    return rc;
}

int fsdp_shard_engine_is(const struct fsdp_engine *e)
{
    return e && e->ops == &shard_ops;
}

void fsdp_shard_engine_stats(const struct fsdp_engine *e, struct fsdp_engine_stats *st)
{
    const struct fsdp_shard_engine *se = shard_impl(e);
    memset(st, 0, sizeof(*st));
    st->comm_total_s = se->comm_total;
    st->comm_exposed_s = se->comm_exposed;
    st->state_bytes = se->state_bytes;
    st->gathered_bytes = se->gathered_bytes;
    st->model_bytes = se->state_bytes + se->gathered_bytes;
    st->grad_bytes = se->grad_bytes;
    st->comm_bytes = se->comm_bytes;
    if (se->model) {
        st->act_bytes = se->model->ops->activation_bytes(se->model) +
                        se->model->ops->workspace_bytes(se->model);
    }
    st->peak_bytes = st->model_bytes + st->grad_bytes + st->comm_bytes + st->act_bytes;
    st->act_saved_bytes = se->model ? se->model->ops->activation_bytes(se->model) : 0;
    st->shards = se->Rs;
    st->replicas = se->world / se->Rs;
    st->ckpt_bytes = fsdp_shard_relayout_floats(se) * sizeof(float);
    for (int u = 0; u < se->n_units; u++) {
        size_t b = fsdp_shard_gather_floats(se, u) * sizeof(float);
        st->gather_bytes = b > st->gather_bytes ? b : st->gather_bytes;
    }
    st->skipped_steps = se->scaler.skipped;
    st->loss_scale = se->scaler.scale;
    st->host_bytes = se->host_bytes;
    st->offload = se->offload;
    st->fsdp_comm = se->unit_comm;
    st->tp_comm = se->tp->counts;
    const struct fsdp_model_ops *mops = se->model ? se->model->ops : NULL;
    if (mops && mops->size >= offsetof(struct fsdp_model_ops, comm_counts) +
                                 sizeof(mops->comm_counts) && mops->comm_counts) {
        mops->comm_counts(se->model, &st->model_comm);
    }
}

// ----------------------------------------------------------------------------
// a pipeline stage's micro-batch passes (pp_engine.c drives them in its
// schedule's order; the engine's own step runs them K times in a row)

int fsdp_shard_mb_forward(struct fsdp_shard_engine *se, const int32_t *inputs,
                          const int32_t *targets)
{
    return shard_forward(se, inputs, targets);
}

int fsdp_shard_mb_backward(struct fsdp_shard_engine *se, int first, int reduce, int accumulate)
{
    return shard_backward(se, first, reduce, accumulate);
}

int fsdp_shard_loss_sum(struct fsdp_shard_engine *se, double *x)
{
    return shard_world_sum(se, x);
}

int fsdp_shard_bind_unit(struct fsdp_shard_engine *se, int u)
{
    return shard_bind(se, u);
}

int fsdp_shard_root_begin(struct fsdp_shard_engine *se, int first, int accumulate)
{
    if (se->direct) { /* the model adds into the gradient shard itself */
        return first && !accumulate ? fsdp_device_zero(se->dev, se->units[0].grad,
                                                       se->units[0].numel * sizeof(float))
                                    : 0;
    }
    return shard_zero_root(se, first, accumulate);
}

int fsdp_shard_mb_finish(struct fsdp_shard_engine *se, double lr, double *loss,
                         struct fsdp_step_result *out)
{
    int rc = fsdp_unit_reduce_wait_all(se);
    if (rc == 0 && se->pre_update) {
        rc = se->pre_update(se->sumsq_arg);
    }
    if (rc == 0) {
        rc = shard_world_sum(se, loss);
    }
    if (rc == 0) {
        out->loss = *loss;
        rc = shard_optimize(se, lr, out);
    }
    fsdp_unit_release_all(se);
    return rc;
}
