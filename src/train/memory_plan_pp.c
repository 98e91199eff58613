/*
 * memory_plan_pp.c - one pipeline rank's memory plan (memory_plan_pp.h):
 * the parts a run builds on that rank (train/parts.h) with its stages'
 * units (pipeline.h), chunk 0's model cut at its stage and sized by the
 * sharding engine's own plan; the other activation sets (one instance per
 * micro-batch each chunk holds at once, made and cut as pipeline.c makes
 * them) counted; the boundary
 * buffers at the most the rank's message order holds (pp_comm.h), as the
 * pipeline engine allocates them. Communicates nothing.
 */
#include "config.h"
#include "train/memory_plan_pp.h"
#include "train/parts.h"
#include "train/pipeline.h"
#include "parallel/pp_comm.h"
#include "parallel/pp_engine.h"
#include "parallel/pp_schedule.h"
#include "model/model.h"
#include "core/error.h"
#include "core/spec.h"
#include "core/util.h"

#include <stdlib.h>
#include <string.h>

/* The workspace bytes of each of a chunk's activation sets after its first
 * (pp_engine.c): its own part where the model shares the first's
 * workspace (share_workspace), else the first's whole. */
static int plan_set_ws(const struct fsdp_model_spec *t, const struct fsdp_model_opts *mo,
                       struct fsdp_model *first, int lo, int hi, size_t *out)
{
    struct fsdp_model *m;
    FSDP_CHECK(fsdp_model_create(t, mo, &m));
    int rc = m->ops->set_stage(m, lo, hi);
    rc = rc < 0 ? rc : fsdp_model_share_workspace(m, first);
    *out = rc == 1 ? m->ops->workspace_bytes(m) : first->ops->workspace_bytes(first);
    fsdp_model_destroy(m);
    return rc < 0 ? rc : 0;
}

/* The activation sets of rank r beyond the parts' model's: one instance
 * per micro-batch a chunk holds at once (fsdp_pp_chunk_holds), as
 * pipeline.c makes them, those after a chunk's first sharing its
 * workspace. Chunk 0's others are like the parts' model as the sharding
 * engine's plan left it (unit 0 by rows where it takes it); the other
 * chunks' made on the parts' table, cut at their stages, sized,
 * destroyed. */
static int plan_chunks(struct fsdp_train_parts *p, struct fsdp_device *dev,
                       const struct fsdp_shard_config *sc, const int *first, const int *most,
                       struct fsdp_plan_pp *out)
{
    struct fsdp_model_opts mo = fsdp_train_parts_model_opts(p, sc, dev);
    const struct fsdp_model_spec *t = fsdp_shard_parts_table(&p->shard);
    struct fsdp_model *m0 = p->model;
    size_t ws = 0;
    int lo, hi;
    fsdp_pp_stage_units(first, out->P * out->V, out->rank, &lo, &hi);
    FSDP_CHECK(most[0] > 1 ? plan_set_ws(t, &mo, m0, lo, hi, &ws) : 0);
    out->saved = (size_t)(most[0] - 1) * m0->ops->activation_bytes(m0);
    out->act = (size_t)(most[0] - 1) * (m0->ops->activation_bytes(m0) + ws);
    for (int c = 1; c < out->V; c++) {
        struct fsdp_model *m;
        fsdp_pp_stage_units(first, out->P * out->V, c * out->P + out->rank, &lo, &hi);
        FSDP_CHECK(fsdp_model_create(t, &mo, &m));
        int rc = sc->activation_checkpointing ? m->ops->set_checkpoint(m, -1, 1) : 0;
        rc = rc < 0 ? rc : m->ops->set_stage(m, lo, hi);
        rc = rc < 0 || most[c] < 2 ? rc : plan_set_ws(t, &mo, m, lo, hi, &ws);
        if (rc == 0) {
            out->saved += (size_t)most[c] * m->ops->activation_bytes(m);
            out->act += (size_t)most[c] * m->ops->activation_bytes(m) + m->ops->workspace_bytes(m) +
                        (size_t)(most[c] - 1) * ws;
        }
        fsdp_model_destroy(m);
        FSDP_CHECK(rc);
    }
    return 0;
}

/* The longest shard of unit 0 over the shard group (the engine's slot
 * length: rows split evenly per tensor, rounded up to 16 when sharded). */
static size_t plan_unit0_shard(const struct fsdp_model_spec *t, int dp)
{
    size_t most = 0;
    for (int r = 0; r < dp; r++) {
        size_t len = 0;
        for (size_t i = 0; i < t->n_params; i++) {
            const struct fsdp_param_spec *q = &t->params[i];
            size_t row0, rows;
            if (q->unit != 0) {
                continue;
            }
            fsdp_split_even(q->shape[0], (size_t)dp, (size_t)r, &row0, &rows);
            len += rows * (q->numel / q->shape[0]);
        }
        most = len > most ? len : most;
    }
    return dp > 1 ? (most + 15) & ~(size_t)15 : most;
}

/* The boundary buffers the pipeline engine allocates on rank r. */
static int plan_bounds(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c,
                       const struct fsdp_shard_config *sc, struct fsdp_plan_pp *out)
{
    const enum fsdp_pp_kind kind = (enum fsdp_pp_kind)c->pp_schedule;
    struct fsdp_pp_schedule s;
    struct fsdp_pp_step *steps = NULL;
    size_t n = 0;
    FSDP_CHECK(fsdp_pp_check(kind, out->P, out->V, out->M));
    FSDP_CHECK(fsdp_pp_schedule_create(kind, out->P, out->V, out->M, out->rank, &s));
    int rc = fsdp_pp_steps_create(&s, 1, &steps, &n);
    if (rc == 0) {
        int dirs[2];
        fsdp_pp_pool_sizes(&s, steps, n, &out->n_held, &out->n_grads);
        fsdp_pp_send_dirs(&s, steps, n, dirs);
        out->n_sends = dirs[0] + dirs[1];
    }
    free(steps);
    fsdp_pp_schedule_free(&s);
    FSDP_CHECK(rc);
    out->bound = fsdp_pp_peak_bound(kind, out->P, out->V, out->M, out->rank);
    const size_t C = spec->params[spec->unit_first[0]].shape[1];
    const size_t tp = sc->sequence_parallel && out->sh.tp > 1 ? (size_t)out->sh.tp : 1;
    const size_t msg = (size_t)sc->B * (size_t)sc->T / tp * C * sizeof(float);
    out->inputs = out->n_held * msg;
    out->grads = out->n_grads * msg;
    out->sends = (size_t)out->n_sends * msg;
    return 0;
}

int fsdp_train_plan_pp(const struct fsdp_model_spec *spec, const struct fsdp_train_config *c,
                       const int *first, int P, int r, const struct fsdp_shard_shape *sh,
                       struct fsdp_device *dev, const struct fsdp_optim_config *oc,
                       const struct fsdp_shard_config *sc, struct fsdp_plan_pp *out)
{
    memset(out, 0, sizeof(*out));
    out->P = P;
    out->V = (int)c->pp_virtual > 0 ? (int)c->pp_virtual : 1;
    out->M = (int)c->grad_accum;
    out->rank = r;
    out->sh = *sh;
    const int tied = spec->n_ties > 0;
    unsigned char *mask = malloc((size_t)spec->n_units);
    if (!mask) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline plan units");
    }
    struct fsdp_shard_config s2 = *sc;
    fsdp_train_pp_units(first, P, out->V, r, tied, spec->n_units, mask, &s2);
    out->lo = s2.unit_lo;
    out->hi = s2.unit_hi;
    /* a tp group that is only a shape: the parts read its size and rank */
    struct fsdp_group tp = {.name = "tp", .size = sh->tp, .rank = sh->tp_rank};
    struct fsdp_train_parts *p = NULL;
    int rc = fsdp_train_parts_create(spec, &tp, dev, oc, &s2, &p);
    rc = rc < 0 ? rc : p->model->ops->set_stage(p->model, s2.unit_lo, s2.unit_hi);
    rc = rc < 0 ? rc : fsdp_shard_engine_plan(&p->shard, sh, dev, &s2, &out->st);
    int *most = calloc((size_t)out->V, sizeof(int));
    rc = rc < 0 || most ? rc : fsdp_err(FSDP_ERR_NOMEM, "pipeline plan instances");
    const int n = rc < 0 ? rc
                         : fsdp_pp_chunk_holds_of((enum fsdp_pp_kind)c->pp_schedule, P, out->V,
                                                  out->M, r, most);
    rc = n < 0 ? n : rc;
    out->sets = n;
    rc = rc < 0 ? rc : plan_chunks(p, dev, &s2, first, most, out);
    free(most);
    if (rc == 0 && tied && (r == 0 || r == P - 1)) {
        size_t S = plan_unit0_shard(fsdp_shard_parts_table(&p->shard), sh->dp);
        out->tie = (S ? S : 1) * sizeof(float);
    }
    fsdp_train_parts_destroy(p);
    free(mask);
    FSDP_CHECK(rc);
    if (r == 0 && sh->dp_rank == 0 && sh->tp_rank == 0) { /* world rank 0's line */
        for (int u = 0; u < spec->n_units; u++) {
            size_t b = spec->unit_numel[u] * sizeof(float);
            out->unit = b > out->unit ? b : out->unit;
        }
    }
    return plan_bounds(spec, c, &s2, out);
}

size_t fsdp_plan_pp_total(const struct fsdp_plan_pp *p)
{
    return p->st.peak_bytes + p->act + p->inputs + p->grads + p->sends + p->tie + p->unit;
}
