/*
 * shard.c - the sharding engine's layout and buffers: its groups; the shard
 * of every unit (of each parameter, the dim-0 rows fsdp_shard_rows assigns
 * to this rank, packed parameter after parameter); the f32 master /
 * gradient / optimizer-state shards; the gathered-parameter and
 * full-gradient slots; packing a unit into shards and back; the state as
 * pieces (row ranges; with tensor parallelism blocks of the whole tensors,
 * which shard_save.c re-lays out as a checkpoint shard's rows) for the
 * training layer to fill and save; and whole units gathered for the final
 * model file. Every buffer is allocated here, once (but the re-layout's, at
 * the first checkpoint, in shard_save.c); with offload the moments and the
 * staged shards are pinned host memory (offload.c moves them).
 */
#include "config.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "compute/kernels.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// mesh and groups

/* The shard group and the replica groups: with sharding none the dp
 * dimension replicates as well (DDP). */
void fsdp_shard_groups_set(struct fsdp_shard_engine *se, const struct fsdp_shard_groups *g)
{
    se->Rs = 1;
    se->rs = 0;
    se->world = 1;
    se->world_rank = g->world_rank;
    if (g->dp && g->dp->size > 1) {
        if (se->ec.sharding == FSDP_SHARD_NONE) {
            se->rep_g[se->n_rep++] = g->dp;
        } else {
            se->shard_g = g->dp;
            se->Rs = g->dp->size;
            se->rs = g->dp->rank;
        }
        se->world *= g->dp->size;
    }
    if (g->rdp && g->rdp->size > 1) {
        se->rep_g[se->n_rep++] = g->rdp;
        se->world *= g->rdp->size;
    }
    snprintf(se->mesh, sizeof(se->mesh), "%s", g->mesh ? g->mesh : "single rank");
    snprintf(se->backends, sizeof(se->backends), "%s", g->backends ? g->backends : "no backend");
}

// ----------------------------------------------------------------------------
// buffers

/* The segment table: every rank's rows of every parameter, and where they
 * sit in the unit layout and in that rank's block. */
static int shard_segs_create(struct fsdp_shard_engine *se)
{
    const struct fsdp_model_spec *spec = se->spec;
    se->segs = calloc((size_t)se->Rs * spec->n_params, sizeof(*se->segs));
    if (!se->segs) {
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp: shard table");
    }
    for (int r = 0; r < se->Rs; r++) {
        size_t off = 0;
        for (size_t i = 0; i < spec->n_params; i++) {
            const struct fsdp_param_spec *p = &spec->params[i];
            struct fsdp_shard_seg *g = &se->segs[(size_t)r * spec->n_params + i];
            if (i == spec->unit_first[p->unit]) {
                off = 0; /* a unit's block starts over */
            }
            fsdp_shard_rows(p, se->Rs, r, &g->row0, &g->rows);
            if (!fsdp_shard_owns(se, p->unit)) {
                g->row0 = g->rows = 0; /* another pipeline stage's unit */
            }
            g->unit_at = p->offset + g->row0 * p->shape[1];
            g->len = g->rows * p->shape[1];
            g->block_off = off;
            off += g->len;
        }
    }
    return 0;
}

/* With tensor parallelism, this rank's shard of every tp-local parameter
 * as blocks of the whole tensors (a shard of GPT-2's [q | k | v] rows
 * touches up to three; padding rows none). */
static int shard_tp_pieces(struct fsdp_shard_engine *se)
{
    const struct fsdp_model_spec *spec = se->spec;
    struct fsdp_tp_block b[FSDP_TP_MAX_CHUNKS];
    if (!se->plan) {
        return 0;
    }
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        for (size_t i = 0; i < spec->n_params; i++) {
            const struct fsdp_shard_seg *g = fsdp_shard_seg(se, se->rs, i);
            size_t k = fsdp_tp_plan_blocks(se->plan, i, se->plan->rank, g->row0, g->rows, b);
            for (size_t j = 0; j < k; j++, n++) {
                if (pass == 1) {
                    se->tp_pieces[n] = (struct fsdp_shard_tp_piece){.param = i, .b = b[j]};
                }
            }
        }
        if (pass == 0) {
            se->n_tp_pieces = n;
            se->tp_pieces = calloc(n ? n : 1, sizeof(*se->tp_pieces));
            if (!se->tp_pieces) {
                return fsdp_err(FSDP_ERR_NOMEM, "fsdp: tensor-parallel piece table");
            }
        }
    }
    return 0;
}

/*
 * The state shards of every unit (total elements each): one device
 * allocation for the four (master, gradient, moments), or with offload one
 * for the parameter and gradient shards and one of pinned host memory for
 * the moments and the staged gradient and master (offload.c). Under
 * params,optim with a 16-bit param dtype the device's parameter shard is
 * what the all-gathers send, in that dtype, after the gradient shards: the
 * f32 master is on the host only.
 */
static int shard_state_alloc(struct fsdp_shard_engine *se, size_t total)
{
    const int off = se->offload != FSDP_OFFLOAD_NONE;
    se->send16 = se->offload == FSDP_OFFLOAD_PARAMS_OPTIM && se->ec.param_dtype != FSDP_F32;
    size_t bytes = se->send16 ? total * (sizeof(float) + sizeof(uint16_t))
                              : (off ? 2 : 4) * total * sizeof(float);
    se->state_bytes = bytes;
    se->host_bytes = off ? 4 * total * sizeof(float) : 0;
    if (se->sizing) {
        return 0;
    }
    void *mem;
    FSDP_CHECK(fsdp_device_alloc(se->dev, bytes,
                                 se->send16 ? "fsdp gradient shards and parameter send shards"
                                 : off      ? "fsdp parameter and gradient shards"
                                            : "fsdp parameter, gradient and AdamW shards",
                                 &mem));
    se->state_mem = mem;
    float *p = mem, *h = NULL;
    uint16_t *p16 = se->send16 ? (uint16_t *)(p + total) : NULL;
    if (off) {
        h = se->host_state = se->dev->ops->host_alloc(se->dev, se->host_bytes);
        if (!h) {
            return fsdp_err(FSDP_ERR_NOMEM,
                            "fsdp offload: %zu bytes of pinned host memory for "
                            "the optimizer state (drop --offload, or use more ranks)",
                            se->host_bytes);
        }
    }
    for (int u = 0; u < se->n_units; u++) {
        struct fsdp_unit *un = &se->units[u];
        if (se->send16) {
            un->grad = p;
            un->send = p16;
            p16 += un->S;
        } else {
            un->master = p;
            un->grad = p + total;
        }
        if (off) {
            un->m = h;
            un->v = h + total;
            un->hgrad = h + 2 * total;
            un->hmaster = h + 3 * total;
            h += un->S;
        } else {
            un->m = p + 2 * total;
            un->v = p + 3 * total;
        }
        p += un->S;
    }
    return 0;
}

/* Elements of rank r's shard of unit un. */
static size_t shard_len(const struct fsdp_shard_engine *se, const struct fsdp_unit *un, int r)
{
    const struct fsdp_shard_seg *last = fsdp_shard_seg(se, r, un->first + un->nparam - 1);
    return un->nparam ? last->block_off + last->len : 0;
}

int fsdp_shard_layout_create(struct fsdp_shard_engine *se)
{
    const struct fsdp_model_spec *spec = se->spec;
    size_t total = 0;
    if (se->u_hi <= 0) { /* no stage set: every unit (a stage always holds a block) */
        se->u_lo = 0;
        se->u_hi = spec->n_units - 1;
    }
    FSDP_CHECK(shard_segs_create(se));
    se->n_units = spec->n_units;
    se->units = calloc((size_t)se->n_units, sizeof(*se->units));
    if (!se->units) {
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp: unit table");
    }
    for (int u = 0; u < se->n_units; u++) {
        struct fsdp_unit *un = &se->units[u];
        un->numel = spec->unit_numel[u];
        un->first = spec->unit_first[u];
        while (un->first + un->nparam < spec->n_params && spec->params[un->first + un->nparam].unit == u) {
            un->nparam++;
        }
        un->S = 0;
        for (int r = 0; r < se->Rs; r++) {
            size_t len = shard_len(se, un, r);
            un->S = len > un->S ? len : un->S;
        }
        if (se->Rs > 1) {
            un->S = (un->S + 15) & ~(size_t)15; /* 64-byte aligned blocks */
        }
        un->cnt = shard_len(se, un, se->rs);
        se->Smax = un->S > se->Smax ? un->S : se->Smax;
        total += un->S;
        un->big = un->first;
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            un->big = spec->params[i].numel > spec->params[un->big].numel ? i : un->big;
        }
        if (!fsdp_shard_owns(se, u)) {
            un->numel = 0; /* no slot, no scratch, nothing computed here */
            continue;
        }
        size_t rest = un->numel - spec->params[un->big].numel;
        se->scratch_floats = rest > se->scratch_floats ? rest : se->scratch_floats;
    }
    if (se->Rs == 1) {
        se->scratch_floats = 0; /* nothing is ever packed */
    }
    FSDP_CHECK(shard_tp_pieces(se));
    se->comm_bytes += se->scratch_floats * sizeof(float);
    FSDP_CHECK(shard_state_alloc(se, total));
    if (se->sizing) {
        return 0;
    }
    void *mem;
    /* unit 0 by rows is packed only when gather_unit saves it, through the same scratch */
    if (se->scratch_floats > 0) {
        FSDP_CHECK(fsdp_device_alloc(se->dev, se->scratch_floats * sizeof(float),
                                     "fsdp packing scratch", &mem));
        se->scratch = mem;
    }
    return 0;
}

/* A slot's buffer: the largest unit counts where it belongs (gathered
 * parameters or unsharded gradients), the rest of the capacity, the
 * collectives' padding, as communication. */
static void *shard_slot_buf(struct fsdp_shard_engine *se, size_t numel, size_t cap, size_t es,
                            size_t *counter, int *failed, const char *name)
{
    if (cap == 0) {
        return NULL;
    }
    *counter += numel * es;
    se->comm_bytes += (cap - numel) * es;
    if (se->sizing) {
        return NULL;
    }
    void *p = se->dev->ops->alloc(se->dev, cap * es, name);
    *failed |= p == NULL;
    return p;
}

int fsdp_shard_alloc_slots(struct fsdp_shard_engine *se)
{
    const struct fsdp_shard_config *ec = &se->ec;
    int n = se->n_units;
    int ring_p = ec->prefetch + 1 < n - 1 ? ec->prefetch + 1 : n - 1;
    int ring_g = 2 < n - 1 ? 2 : n - 1;
    se->keep_gathered = ec->sharding != FSDP_SHARD_FULL || !ec->reshard_after_forward;
    se->direct = !se->shard_g && se->n_rep == 0 && ec->param_dtype == FSDP_F32 &&
                 ec->reduce_dtype == FSDP_F32;
    se->n_pslots = se->keep_gathered ? n : 1 + ring_p;
    se->n_gslots = ec->no_sync_accum ? n : 1 + ring_g;
    se->pslots = calloc((size_t)se->n_pslots, sizeof(*se->pslots));
    se->gslots = calloc((size_t)se->n_gslots, sizeof(*se->gslots));
    se->rqueue = calloc((size_t)se->n_gslots, sizeof(*se->rqueue));
    /* one double per rank of the largest group summed over: dp x rdp, or tp */
    se->sum_buf =
        calloc((size_t)(se->world > se->tp->size ? se->world : se->tp->size), sizeof(*se->sum_buf));
    if (!se->pslots || !se->gslots || !se->rqueue || !se->sum_buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp: slot tables");
    }
    if (!se->sizing) {
        void *mem; /* the norm, and room to gather a group's sums where needed (engine.c) */
        size_t nd = fsdp_shard_sums_on_device(se)
                        ? 2 + (size_t)(se->world > se->tp->size ? se->world : se->tp->size)
                        : 1;
        FSDP_CHECK(fsdp_device_alloc(se->dev, nd * sizeof(double), "fsdp gradient norm", &mem));
        se->dnorm = mem;
    }
    /* a slot holds the largest unit that maps to it, and its packed shards
     * (Rs * S: the unit plus the collectives' padding), parameters in the
     * param dtype and gradients in f32. Unit 0 by rows is
     * never gathered: its slot holds this rank's rows cast to the param
     * dtype (none in f32: the model reads the master shard), and
     * its gradient slot this rank's rows of the gradient, for the reduce
     * dtype's rounding and the replicas' all-reduce (none in f32 without
     * replicas: the model adds into the gradient shard) */
    for (int u = 0; u < n; u++) {
        size_t numel = se->units[u].numel, packed = (size_t)se->Rs * se->units[u].S;
        size_t floats = numel > packed ? numel : packed, gnumel = numel, gfloats = floats;
        if (fsdp_shard_by_rows(se, u)) {
            numel = floats = ec->param_dtype != FSDP_F32 ? se->units[u].S : 0;
            gnumel = gfloats = ec->reduce_dtype != FSDP_F32 || se->n_rep > 0 ? se->units[u].S : 0;
        }
        struct fsdp_pslot *ps = &se->pslots[fsdp_unit_pslot(se, u)];
        struct fsdp_gslot *gs = &se->gslots[fsdp_unit_gslot(se, u)];
        ps->numel = numel > ps->numel ? numel : ps->numel;
        ps->cap = floats > ps->cap ? floats : ps->cap;
        gs->numel = gnumel > gs->numel ? gnumel : gs->numel;
        gs->floats = gfloats > gs->floats ? gfloats : gs->floats;
    }
    /* a direct engine's slots keep only the schedule's bookkeeping */
    int failed = 0;
    for (int i = 0; i < se->n_pslots; i++) {
        struct fsdp_pslot *s = &se->pslots[i];
        s->unit = -1;
        s->buf = se->direct ? NULL
                            : shard_slot_buf(se, s->numel, s->cap, fsdp_dtype_size(ec->param_dtype),
                                             &se->gathered_bytes, &failed,
                                             "fsdp parameter slot (gathered unit)");
    }
    for (int i = 0; i < se->n_gslots; i++) {
        struct fsdp_gslot *s = &se->gslots[i];
        s->unit = -1;
        s->buf = se->direct
                     ? NULL
                     : shard_slot_buf(se, s->numel, s->floats, sizeof(float), &se->grad_bytes,
                                      &failed, "fsdp gradient slot (unsharded unit)");
    }
    if (failed) {
        return fsdp_err(FSDP_ERR_NOMEM, "fsdp: %zu bytes of gathered, gradient and communication buffers",
                        se->gathered_bytes + se->grad_bytes + se->comm_bytes);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// packing in place: unit layout <-> Rs blocks of S, block r holding rank r's
// rows of each parameter in turn
//
// Every parameter but the unit's largest goes through the scratch, which
// holds them in the unit layout less the largest one's span. The largest
// one's Rs row blocks are moved within the buffer: their sources and
// destinations both run in rank order, so moving the blocks that go down
// in ascending rank order and then those that go up in descending order
// never overwrites a block not yet moved.

/* Offset in the scratch of unit position u (not inside the largest parameter). */
static size_t shard_scratch_at(const struct fsdp_param_spec *big, size_t u)
{
    return u < big->offset ? u : u - big->numel;
}

/* to_unit 1: the largest parameter's blocks from packed to unit positions;
 * 0: back (elements of es bytes). */
static void shard_move_big(const struct fsdp_shard_engine *se, const struct fsdp_unit *un,
                           char *buf, size_t es, int to_unit)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < se->Rs; k++) {
            int r = pass == 0 ? k : se->Rs - 1 - k;
            const struct fsdp_shard_seg *g = fsdp_shard_seg(se, r, un->big);
            size_t u = g->unit_at, len = g->len, p = (size_t)r * un->S + g->block_off;
            size_t src = to_unit ? p : u, dst = to_unit ? u : p;
            if (len > 0 && dst != src && (pass == 0) == (dst < src)) {
                (void)fsdp_device_copy(se->dev, buf + dst * es, buf + src * es, len * es);
            }
        }
    }
}

void fsdp_shard_unpack_inplace(const struct fsdp_shard_engine *se, int u, void *buf,
                               enum fsdp_dtype t)
{
    const struct fsdp_unit *un = &se->units[u];
    const struct fsdp_param_spec *big = &se->spec->params[un->big];
    size_t es = fsdp_dtype_size(t);
    char *b = buf, *x = (char *)se->scratch;
    for (int r = 0; r < se->Rs; r++) {
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            const struct fsdp_shard_seg *g = fsdp_shard_seg(se, r, i);
            if (i != un->big && g->len > 0) {
                (void)fsdp_device_copy(se->dev, x + shard_scratch_at(big, g->unit_at) * es,
                                       b + ((size_t)r * un->S + g->block_off) * es, g->len * es);
            }
        }
    }
    shard_move_big(se, un, b, es, 1);
    size_t tail = un->numel - big->offset - big->numel;
    (void)fsdp_device_copy(se->dev, b, x, big->offset * es);
    (void)fsdp_device_copy(se->dev, b + (big->offset + big->numel) * es, x + big->offset * es,
                           tail * es);
}

void fsdp_shard_pack_inplace(const struct fsdp_shard_engine *se, int u, float *buf,
                             enum fsdp_dtype t)
{
    const struct fsdp_unit *un = &se->units[u];
    const struct fsdp_param_spec *big = &se->spec->params[un->big];
    float *x = se->scratch;
    size_t tail = un->numel - big->offset - big->numel;
    (void)fsdp_device_copy(se->dev, x, buf, big->offset * sizeof(float));
    (void)fsdp_device_copy(se->dev, x + big->offset, buf + big->offset + big->numel,
                           tail * sizeof(float));
    shard_move_big(se, un, (char *)buf, sizeof(float), 0);
    for (int r = 0; r < se->Rs; r++) {
        float *block = buf + (size_t)r * un->S;
        for (size_t i = un->first; i < un->first + un->nparam; i++) {
            const struct fsdp_shard_seg *g = fsdp_shard_seg(se, r, i);
            if (i != un->big && g->len > 0) {
                (void)fsdp_device_copy(se->dev, block + g->block_off,
                                       x + shard_scratch_at(big, g->unit_at),
                                       g->len * sizeof(float));
            }
        }
        size_t used = shard_len(se, un, r);
        (void)fsdp_device_zero(se->dev, block + used, (un->S - used) * sizeof(float)); /* padding */
    }
    if (t != FSDP_F32) {
        se->dev->k->narrow_inplace(se->dev, buf, (size_t)se->Rs * un->S, t == FSDP_BF16);
    }
}

/* A collective still in flight after a failed step must finish before its
 * buffers go; one that does not finish soon is left (and its buffers with it). */
static int shard_drain(struct fsdp_work **w)
{
    if (!*w) {
        return 1;
    }
    if (fsdp_work_wait(*w, 1.0) < 0) {
        fsdp_err_clear();
        return 0;
    }
    fsdp_work_free(*w);
    *w = NULL;
    return 1;
}

void fsdp_shard_teardown(struct fsdp_shard_engine *se)
{
    for (int i = 0; se->pslots && i < se->n_pslots; i++) {
        if (!shard_drain(&se->pslots[i].work)) {
            continue;
        }
        se->dev->ops->free(se->dev, se->pslots[i].buf);
    }
    for (int i = 0; se->gslots && i < se->n_gslots; i++) {
        if (!shard_drain(&se->gslots[i].work)) {
            continue;
        }
        se->dev->ops->free(se->dev, se->gslots[i].buf);
    }
    fsdp_shard_drop_saved(se);
    free(se->pslots);
    free(se->gslots);
    free(se->rqueue);
    free(se->sum_buf);
    if (se->dnorm) {
        se->dev->ops->free(se->dev, se->dnorm);
    }
    if (se->scratch) {
        se->dev->ops->free(se->dev, se->scratch);
    }
    if (se->state_mem) {
        se->dev->ops->free(se->dev, se->state_mem);
    }
    if (se->host_state) {
        se->dev->ops->host_free(se->dev, se->host_state);
    }
    free(se->units);
    free(se->segs);
    free(se->tp_pieces);
    fsdp_shard_save_fini(se);
    if (se->relayout) {
        se->dev->ops->free(se->dev, se->relayout);
    }
}

// ----------------------------------------------------------------------------
// the state as pieces: per kind (parameters, then each optimizer state), this
// rank's rows of every parameter, in spec order; the rows of a unit's
// parameters sit one after the other in its shard

size_t fsdp_shard_n_pieces(const struct fsdp_shard_engine *se)
{
    size_t per = se->plan ? se->n_tp_pieces : se->spec->n_params;
    return (size_t)(1 + se->opt->n_state) * per;
}

/* Tensor parallelism: piece k is block k % n of the table, a block of the
 * whole tensor; its rows sit in the shard at the block's local rows. */
static void shard_tp_piece(struct fsdp_shard_engine *se, size_t k, struct fsdp_state_piece *out)
{
    const struct fsdp_shard_tp_piece *tp = &se->tp_pieces[k % se->n_tp_pieces];
    const struct fsdp_param_spec *lp = &se->spec->params[tp->param];
    const struct fsdp_unit *un = &se->units[lp->unit];
    const struct fsdp_shard_seg *g = fsdp_shard_seg(se, se->rs, tp->param);
    /* offloaded: the moments, and with params the master, are host memory */
    const int params = se->offload == FSDP_OFFLOAD_PARAMS_OPTIM;
    float *const base[3] = {params ? un->hmaster : un->master, un->m, un->v};
    out->kind = (int)(k / se->n_tp_pieces);
    out->param = tp->param;
    out->row0 = tp->b.row0;
    out->rows = tp->b.rows;
    out->col0 = tp->b.col0;
    out->cols = tp->b.cols;
    out->data = base[out->kind] + g->block_off + (tp->b.local_row - g->row0) * lp->shape[1];
    out->copy = fsdp_tp_plan_replicated(se->plan, tp->param) && se->plan->rank != 0;
    out->host = se->offload != FSDP_OFFLOAD_NONE && (out->kind > 0 || params);
}

void fsdp_shard_piece(struct fsdp_shard_engine *se, size_t k, struct fsdp_state_piece *out)
{
    const struct fsdp_model_spec *s = se->spec;
    if (se->plan) {
        shard_tp_piece(se, k, out);
        return;
    }
    size_t i = k % s->n_params;
    const struct fsdp_unit *un = &se->units[s->params[i].unit];
    const struct fsdp_shard_seg *g = fsdp_shard_seg(se, se->rs, i);
    /* offloaded: the moments, and with params the master, are host memory */
    const int params = se->offload == FSDP_OFFLOAD_PARAMS_OPTIM;
    float *const base[3] = {params ? un->hmaster : un->master, un->m, un->v};
    out->kind = (int)(k / s->n_params);
    out->param = i;
    out->row0 = g->row0;
    out->rows = g->rows;
    out->data = base[out->kind] + g->block_off;
    out->col0 = 0;
    out->cols = s->params[i].shape[1];
    out->copy = 0;
    out->host = se->offload != FSDP_OFFLOAD_NONE && (out->kind > 0 || params);
}

void fsdp_shard_drop_saved(struct fsdp_shard_engine *se)
{
    if (se->save_buf) {
        se->dev->ops->free(se->dev, se->save_buf);
        se->save_buf = NULL;
    }
}

/* Tensor parallelism: every tp rank's local unit u and the whole one. */
static size_t shard_tp_gather_floats(const struct fsdp_shard_engine *se, int u)
{
    return (size_t)se->tp->size * se->spec->unit_numel[u] + se->full->unit_numel[u];
}

/* Tensor parallelism: every tp rank's local unit u (local, the
 * dp-gathered one) gathered over tp and assembled into the whole unit. */
static int shard_gather_tp(struct fsdp_shard_engine *se, int u, const float *local,
                           const float **full)
{
    size_t ln = se->spec->unit_numel[u], T = (size_t)se->tp->size;
    size_t floats = shard_tp_gather_floats(se, u);
    void *mem;
    FSDP_CHECK(
        fsdp_device_alloc(se->dev, floats * sizeof(float), "fsdp unit gathered over tp", &mem));
    float *buf = mem;
    struct fsdp_work *w;
    int rc = fsdp_unit_comm_begin(se);
    rc = rc < 0 ? rc : fsdp_allgather(se->tp->g, local, buf, ln, FSDP_F32, &se->attr, &w);
    if (rc == 0) {
        rc = fsdp_work_wait(w, -1.0);
        rc = rc < 0 ? rc : fsdp_unit_comm_end(se);
        fsdp_work_free(w);
    }
    if (rc < 0) {
        se->dev->ops->free(se->dev, buf);
        return rc;
    }
    fsdp_shard_drop_saved(se);
    se->save_buf = buf;
    FSDP_CHECK(fsdp_tp_plan_assemble(se->plan, se->dev, u, buf, buf + T * ln));
    *full = buf + T * ln;
    return 0;
}

/* Whether gather_unit needs a buffer of its own for u: unit 0 by rows has
 * no slot of that size, and with a 16-bit param dtype the slots hold the
 * unit in that dtype only. */
static int shard_gather_own(const struct fsdp_shard_engine *se, int u)
{
    return fsdp_shard_by_rows(se, u) || se->ec.param_dtype != FSDP_F32;
}

/* The f32 elements of u gathered whole, with the collectives' padding. */
static size_t shard_whole_floats(const struct fsdp_shard_engine *se, int u)
{
    const struct fsdp_unit *un = &se->units[u];
    size_t packed = (size_t)se->Rs * un->S;
    return un->numel > packed ? un->numel : packed;
}

size_t fsdp_shard_gather_floats(const struct fsdp_shard_engine *se, int u)
{
    int own = fsdp_shard_by_rows(se, u) || (se->shard_g && shard_gather_own(se, u)) || se->send16;
    return (own ? shard_whole_floats(se, u) : 0) + (se->plan ? shard_tp_gather_floats(se, u) : 0);
}

/* Gathers unit u in f32 into its parameter slot and unpacks it there. Unit
 * 0 by rows, and any unit with a 16-bit param dtype, has no f32 slot of
 * that size: it is gathered into a buffer of its own, allocated here and
 * freed at the next op (only the final model file asks for whole units). */
int fsdp_shard_gather_unit(struct fsdp_shard_engine *se, int u, const float **full)
{
    const struct fsdp_unit *un = &se->units[u];
    fsdp_unit_release_all(se);
    fsdp_shard_drop_saved(se);
    if (!se->shard_g && !se->send16) {
        *full = un->master;
        return se->plan ? shard_gather_tp(se, u, un->master, full) : 0;
    }
    float *buf = se->pslots[fsdp_unit_pslot(se, u)].buf;
    if (se->send16 || shard_gather_own(se, u)) {
        size_t floats = shard_whole_floats(se, u);
        void *mem;
        FSDP_CHECK(
            fsdp_device_alloc(se->dev, floats * sizeof(float), "fsdp unit gathered whole", &mem));
        se->save_buf = mem;
        buf = se->save_buf;
    }
    /* send16: the f32 master is on the host only; its shard goes into this
     * rank's block, and the all-gather sends from there (in place) */
    float *mine = se->send16 ? buf + (size_t)se->rs * un->S : un->master;
    if (se->send16) {
        FSDP_CHECK(se->dev->ops->copy(se->dev, mine, un->hmaster, un->S * sizeof(float),
                                      FSDP_COPY_H2D, se->dev->stream));
    }
    if (!se->shard_g) { /* send16 on one rank: the shard is the unit */
        *full = buf;
        return se->plan ? shard_gather_tp(se, u, buf, full) : 0;
    }
    struct fsdp_work *w;
    FSDP_CHECK(fsdp_unit_comm_begin(se));
    FSDP_CHECK(fsdp_allgather(se->shard_g, mine, buf, un->S, FSDP_F32, &se->attr, &w));
    int rc = fsdp_work_wait(w, -1.0);
    rc = rc < 0 ? rc : fsdp_unit_comm_end(se);
    fsdp_work_free(w);
    FSDP_CHECK(rc);
    fsdp_shard_unpack_inplace(se, u, buf, FSDP_F32);
    *full = buf;
    return se->plan ? shard_gather_tp(se, u, buf, full) : 0;
}
