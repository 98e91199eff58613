/*
 * pp_engine.c - the pipeline runtime (pp_engine.h): one step as the rank's
 * schedule table with its messages (pp_comm.h), each pass through the
 * stage's sharding engine (engine.c's micro-batch passes over the stage's
 * units), the held stage inputs, the boundary messages counted, eval, the
 * sums over the stages, setup and teardown. The state as the trainer sees
 * it (pieces, units and checkpoint rows brought to stage 0) is pp_state.c's.
 * The sharding engine keeps the state; this file keeps only the boundary
 * buffers.
 */
#include "config.h"
#include "parallel/pp_engine_impl.h"
#include "core/error.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void fsdp_pp_stage_units(const int *first, int P, int s, int *lo, int *hi)
{
    const int L = first[P];
    *lo = s == 0 ? 0 : first[s] + 1;
    *hi = s == P - 1 ? L + 1 : first[s + 1];
}

/* x summed over the pipeline's ranks in rank order: the same on every rank. */
static int pp_sum(void *arg, double *x)
{
    struct pp_engine *pe = arg;
    if (pe->dsums) { /* through the device, on the compute stream */
        struct fsdp_device *d = pe->se->dev;
        const struct fsdp_coll_attr attr = {.mem = d->mem, .stream = d->stream};
        struct fsdp_work *w = NULL;
        FSDP_CHECK(fsdp_device_write(d, pe->dsums, x, sizeof(double)));
        FSDP_CHECK(
            fsdp_allgather(pe->pp, pe->dsums, pe->dsums + 1, sizeof(double), FSDP_U8, &attr, &w));
        int rc = fsdp_work_wait(w, -1.0);
        fsdp_work_free(w);
        FSDP_CHECK(rc);
        FSDP_CHECK(fsdp_device_read(d, pe->sums, pe->dsums + 1, (size_t)pe->P * sizeof(double)));
    } else {
        FSDP_CHECK(fsdp_allgather_sync(pe->pp, x, pe->sums, sizeof(double), FSDP_U8));
    }
    double sum = 0.0;
    for (int r = 0; r < pe->P; r++) {
        sum += pe->sums[r];
    }
    *x = sum;
    return 0;
}

static void pp_note(struct pp_engine *pe, const struct fsdp_pp_action *a)
{
    char chunk[16] = "";
    if (pe->V > 1) {
        snprintf(chunk, sizeof(chunk), ".%d", a->chunk);
    }
    int n = snprintf(pe->order + pe->order_len, pe->order_cap - pe->order_len, "%s%c%d%s",
                     pe->order_len ? " " : "", a->op == FSDP_PP_FWD ? 'F' : 'B', a->mb, chunk);
    if (n > 0 && pe->order_len + (size_t)n < pe->order_cap) {
        pe->order_len += (size_t)n;
    }
}

// ----------------------------------------------------------------------------
// passes

/* The synthetic pass time (FSDPC_PP_PASS_MS), k times: a pipeline's
 * schedule measured apart from its compute (doc/performance.md), where
 * more ranks run than there are cores. A sleep, so the ranks' passes
 * overlap as they would on their own devices. */
static void pp_synthetic(const struct pp_engine *pe, int k)
{
    const double s = pe->pass_s * k;
    if (s > 0.0) {
        struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

/* The stage chunk c of this rank runs. */
static int pp_stage_of(const struct pp_engine *pe, int c)
{
    return c * pe->P + pe->stage;
}

/* Instance i of chunk c, bound to the sharding engine, its passes over
 * the chunk's units. */
static struct fsdp_model *pp_use(struct pp_engine *pe, int c, int i)
{
    pe->se->model = pe->models[i];
    pe->se->u_lo = pe->clo[c];
    pe->se->u_hi = pe->chi[c];
    return pe->models[i];
}

/* Instance i's boundary buffers for its current batch. */
static int pp_buffers(struct pp_engine *pe, int i, float **in, float **out, float **dres)
{
    size_t count;
    FSDP_CHECK(pe->models[i]->ops->stage_buffers(pe->models[i], in, out, dres, &count));
    if (count != pe->count) {
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: boundary of %zu floats, %zu expected", count,
                        pe->count);
    }
    return 0;
}

/* Unit 0 gathered for the tied head of the last stage (chunk c), where
 * unit 0's own passes never run. */
static int pp_tie_gather(struct pp_engine *pe, int c)
{
    if (!pe->tied_last || pp_stage_of(pe, c) != pe->S - 1) {
        return 0;
    }
    FSDP_CHECK(fsdp_unit_gather_issue(pe->se, 0));
    return fsdp_unit_gather_wait(pe->se, 0);
}

/* Before the update: the embedding's gradient shard of rank 0 (stage 0)
 * and of the last stage's rank (its copy, from the tied head) summed on
 * both, a + b on each, so that the two copies take the same step. */
static int pp_tie_sum(void *arg)
{
    struct pp_engine *pe = arg;
    const struct fsdp_unit *un = &pe->se->units[0];
    const struct fsdp_pp_action a = {.op = FSDP_PP_BWD, .mb = 0, .chunk = 0};
    if (un->cnt == 0) {
        return 0;
    }
    if (pe->stage == 0) {
        FSDP_CHECK(fsdp_pp_xfer(pe, 1, un->grad, un->cnt, pe->P - 1, fsdp_pp_tag(&a, 0)));
        FSDP_CHECK(
            fsdp_pp_xfer(pe, 0, pe->tie_buf, un->cnt, pe->P - 1, fsdp_pp_tag(&a, pe->S - 1)));
    } else {
        FSDP_CHECK(fsdp_pp_xfer(pe, 0, pe->tie_buf, un->cnt, 0, fsdp_pp_tag(&a, 0)));
        FSDP_CHECK(fsdp_pp_xfer(pe, 1, un->grad, un->cnt, 0, fsdp_pp_tag(&a, pe->S - 1)));
    }
    pe->se->dev->k->accumulate(pe->se->dev, un->grad, pe->tie_buf, un->cnt);
    return 0;
}

/* A free instance of chunk c for micro-batch key's activations, into
 * inst_of[key]: taken until its backward. */
static int pp_take_inst(struct pp_engine *pe, int c, int key)
{
    for (int i = pe->inst0[c]; i < pe->inst0[c + 1]; i++) {
        if (!pe->inst_busy[i]) {
            pe->inst_busy[i] = 1;
            pe->inst_of[key] = i;
            return i;
        }
    }
    return fsdp_err(FSDP_ERR_INTERNAL,
                    "pipeline stage %d: more than %d micro-batches between forward and "
                    "backward",
                    pp_stage_of(pe, c), pe->inst0[c + 1] - pe->inst0[c]);
}

/* Chunk c's forward of micro-batch mb of b on a free instance, which keeps
 * its activations until the backward: from its held input (not stage 0),
 * copied in, its slot then freed, through its units (the last stage: the
 * loss). */
static int pp_forward(struct pp_engine *pe, const struct fsdp_batch *b, int mb, int c)
{
    const size_t bt = (size_t)b->B * (size_t)b->T;
    const int have = b->inputs != NULL; /* else a shadow pass (join): no compute, no input */
    const int32_t *in = have ? b->inputs + (size_t)mb * bt : NULL;
    const int32_t *tg = have ? b->targets + (size_t)mb * bt : NULL;
    const int key = c * pe->pc.M + mb;
    const int i = pp_take_inst(pe, c, key);
    FSDP_CHECK(i);
    struct fsdp_model *m = pp_use(pe, c, i);
    if (have) {
        FSDP_CHECK(m->ops->set_batch(m, in, tg, b->B, b->T));
    }
    if (have && pp_stage_of(pe, c) > 0) {
        float *x, *y, *d;
        FSDP_CHECK(pp_buffers(pe, i, &x, &y, &d));
        if (pe->slot_of[key] < 0) {
            return fsdp_err(FSDP_ERR_INTERNAL,
                            "pipeline stage %d: forward of micro-batch %d "
                            "without its input",
                            pp_stage_of(pe, c), mb);
        }
        FSDP_CHECK(fsdp_device_copy(pp_dev(pe), x, pe->held + (size_t)pe->slot_of[key] * pe->count,
                                    pe->count * sizeof(float)));
    }
    if (pe->slot_of[key] >= 0) { /* the set holds its copy: the next receive may take the slot */
        pe->slot_busy[pe->slot_of[key]] = 0;
        pe->slot_of[key] = -1;
    }
    FSDP_CHECK(pp_tie_gather(pe, c));
    FSDP_CHECK(fsdp_shard_mb_forward(pe->se, in, tg));
    /* the sharding engine keeps the last unit gathered for the backward
     * that follows at once in its own step; here another forward may come
     * first, and its units may need that buffer */
    fsdp_unit_release_all(pe->se);
    pe->n_fwd++;
    pp_synthetic(pe, 1);
    return 0;
}

/* Chunk c's backward of micro-batch mb on the instance its forward kept:
 * the received output gradient into it (not the last stage), then the
 * units' backward with the step's reduction policy (k: the chunk's
 * backwards so far); the instance and the gradient's slot are freed. */
static int pp_backward(struct pp_engine *pe, const struct fsdp_batch *b, int mb, int c)
{
    const int key = c * pe->pc.M + mb, k = pe->n_bwd[c], i = pe->inst_of[key];
    if (i < 0 || !pe->inst_busy[i]) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "pipeline stage %d: backward of micro-batch %d without its forward's "
                        "activations",
                        pp_stage_of(pe, c), mb);
    }
    pp_use(pe, c, i);
    if (b->inputs && pp_stage_of(pe, c) < pe->S - 1) {
        float *x, *y, *d;
        FSDP_CHECK(pp_buffers(pe, i, &x, &y, &d));
        if (pe->gbuf_of[key] < 0) {
            return fsdp_err(FSDP_ERR_INTERNAL,
                            "pipeline stage %d: backward of micro-batch %d "
                            "without its gradient",
                            pp_stage_of(pe, c), mb);
        }
        FSDP_CHECK(fsdp_device_copy(pp_dev(pe), d, pe->gbuf + (size_t)pe->gbuf_of[key] * pe->count,
                                    pe->count * sizeof(float)));
        pe->gbuf_busy[pe->gbuf_of[key]] = 0;
        pe->gbuf_of[key] = -1;
    }
    const int nosync = pe->se->ec.no_sync_accum, K = b->K;
    int first = nosync ? k == 0 : 1, reduce = nosync ? k == K - 1 : 1;
    const int tie = pe->tied_last && pp_stage_of(pe, c) == pe->S - 1;
    if (tie) { /* the head adds into unit 0's gradient, which no unit 0 backward reduces here */
        FSDP_CHECK(pp_tie_gather(pe, c));
        FSDP_CHECK(fsdp_shard_root_begin(pe->se, first, !nosync && k > 0));
    }
    FSDP_CHECK(fsdp_shard_mb_backward(pe->se, first, reduce, !nosync && k > 0));
    if (tie && reduce && !pe->se->direct) {
        FSDP_CHECK(fsdp_unit_reduce_issue(pe->se, 0, !nosync && k > 0));
    }
    pp_synthetic(pe, 2);
    pe->n_bwd[c]++;
    pe->inst_busy[i] = 0; /* inst_of[key] stays: the send reads its input's gradient */
    pe->held_now--;
    return 0;
}

/* A free slot of busy (n of them) for key, into of[key]. */
static int pp_take(int *busy, size_t n, int *of, int key, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (!busy[i]) {
            busy[i] = 1;
            of[key] = (int)i;
            return 0;
        }
    }
    return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: more than %zu %s held", n, what);
}

static int pp_recv(struct pp_engine *pe, const struct fsdp_pp_step *st)
{
    const struct fsdp_pp_action *a = &pe->sched.at[st->act];
    if (pe->se->shadow) { /* the whole pipeline shadows: none of its stages sends */
        return 0;
    }
    const int key = a->chunk * pe->pc.M + a->mb;
    float *dst;
    if (a->op == FSDP_PP_FWD) {
        FSDP_CHECK(pp_take(pe->slot_busy, pe->n_held, pe->slot_of, key, "stage inputs"));
        dst = pe->held + (size_t)pe->slot_of[key] * pe->count;
    } else {
        FSDP_CHECK(pp_take(pe->gbuf_busy, pe->n_gbuf, pe->gbuf_of, key, "output gradients"));
        dst = pe->gbuf + (size_t)pe->gbuf_of[key] * pe->count;
    }
    int from = pp_stage_of(pe, a->chunk) + (a->op == FSDP_PP_FWD ? -1 : 1);
    fsdp_comm_count(&pe->bounds, FSDP_COLL_RECV, 2, (double)(pe->count * sizeof(float)));
    return fsdp_pp_recv_dir(pe, a->op == FSDP_PP_BWD, dst, st->peer, fsdp_pp_tag(a, from));
}

static int pp_send(struct pp_engine *pe, const struct fsdp_pp_step *st)
{
    const struct fsdp_pp_action *a = &pe->sched.at[st->act];
    if (pe->se->shadow) {
        return 0;
    }
    const int i = pe->inst_of[a->chunk * pe->pc.M + a->mb];
    if (i < 0) {
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: send of micro-batch %d before its pass",
                        a->mb);
    }
    float *x, *y, *d;
    FSDP_CHECK(pp_buffers(pe, i, &x, &y, &d));
    fsdp_comm_count(&pe->bounds, FSDP_COLL_SEND, 2, (double)(pe->count * sizeof(float)));
    const int dir = a->op == FSDP_PP_BWD;
    return fsdp_pp_send_async(pe, dir, dir ? d : y, st->peer,
                              fsdp_pp_tag(a, pp_stage_of(pe, a->chunk)));
}

/* One step of the table; *loss_sum gains the last stage's forward losses. */
static int pp_run_step(struct pp_engine *pe, const struct fsdp_pp_step *st,
                       const struct fsdp_batch *b, double *loss_sum)
{
    const struct fsdp_pp_action *a = &pe->sched.at[st->act];
    if (st->kind == FSDP_PP_RECV) {
        return pp_recv(pe, st);
    }
    if (st->kind == FSDP_PP_SEND) {
        return pp_send(pe, st);
    }
    pp_note(pe, a);
    if (a->op == FSDP_PP_BWD) {
        return pp_backward(pe, b, a->mb, a->chunk);
    }
    FSDP_CHECK(pp_forward(pe, b, a->mb, a->chunk));
    pe->held_now++;
    pe->peak = pe->held_now > pe->peak ? pe->held_now : pe->peak;
    if (pp_stage_of(pe, a->chunk) == pe->S - 1 && b->inputs) {
        const struct fsdp_model *m = pe->models[pe->inst_of[a->chunk * pe->pc.M + a->mb]];
        *loss_sum += m->ops->loss(m);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// ops

static void pp_reset(struct pp_engine *pe)
{
    for (int i = 0; i < pe->V * pe->pc.M; i++) {
        pe->slot_of[i] = pe->gbuf_of[i] = pe->inst_of[i] = -1;
    }
    memset(pe->inst_busy, 0, (size_t)pe->n_models * sizeof(*pe->inst_busy));
    pe->n_fwd = 0;
    memset(pe->slot_busy, 0, pe->n_held * sizeof(*pe->slot_busy));
    memset(pe->gbuf_busy, 0, pe->n_gbuf * sizeof(*pe->gbuf_busy));
    for (int c = 0; c < pe->V; c++) {
        pe->n_bwd[c] = 0;
    }
    pe->held_now = pe->peak = 0;
    memset(&pe->bounds, 0, sizeof(pe->bounds));
    pe->order_len = 0;
    pe->order[0] = '\0';
}

/*
 * Join (a data-parallel replica out of batches shadows the others): the
 * stages of a pipeline read the same batches, so they run out together and
 * the whole pipeline shadows: each stage runs its schedule with the
 * sharding engine's shadow passes (every dp collective issued, no compute,
 * zero gradients reduced) and no boundary messages, which no stage of it
 * sends. A pipeline whose stages disagree would hang in those messages;
 * the count of stages with a batch, summed over the pipeline, says so
 * first.
 */
static int pp_join_agree(struct pp_engine *pe, int have)
{
    double n = have;
    FSDP_CHECK(pp_sum(pe, &n));
    if (n != 0.0 && n != (double)pe->P) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "pipeline: %.0f of %d stages have a batch this step; the stages of a "
                        "pipeline read the same data (per-rank data files go by dp rank)",
                        n, pe->P);
    }
    return 0;
}

static int pp_step(struct fsdp_engine *e, const struct fsdp_batch *b, double lr, int n_contrib,
                   struct fsdp_step_result *out)
{
    struct pp_engine *pe = pp_impl(e);
    struct fsdp_shard_engine *se = pe->se;
    FSDP_CHECK(pp_join_agree(pe, b->inputs != NULL));
    if (b->K != pe->pc.M || b->B != se->ec.B || b->T != se->ec.T) {
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: batch %d x %d x %d, made for %d x %d x %d",
                        b->K, b->B, b->T, pe->pc.M, se->ec.B, se->ec.T);
    }
    fsdp_shard_drop_saved(se);
    pp_reset(pe);
    pe->step_no++;
    pe->idle_s = 0.0;
    const double t0 = fsdp_now();
    se->shadow = b->inputs == NULL;
    for (int i = 0; i < pe->n_models; i++) {
        pe->models[i]->ops->set_loss_seed(pe->models[i],
                                          (double)b->K * (double)b->B * (double)b->T * n_contrib,
                                          se->scaler.scale);
    }
    double loss_sum = 0.0;
    int rc = 0;
    for (size_t i = 0; i < pe->n_steps && rc == 0; i++) {
        rc = pp_run_step(pe, &pe->steps[i], b, &loss_sum);
    }
    for (int dir = 0; dir < 2; dir++) { /* the sends in flight, also after an error */
        int w = fsdp_pp_slot_wait(pe, dir);
        rc = rc < 0 ? rc : w;
    }
    pp_use(pe, 0, 0);
    if (rc < 0) {
        se->shadow = 0;
        fsdp_unit_release_all(se);
        return rc;
    }
    FSDP_DEBUG(FSDP_SUB_FSDP, "pipeline rank %d step %ld: %s | peak %zu", pe->stage, pe->step_no,
               pe->order, pe->peak);
    FSDP_DEBUG(FSDP_SUB_FSDP, "pipeline rank %d step %ld: %ld stage forwards run", pe->stage,
               pe->step_no, pe->n_fwd);
    FSDP_DEBUG(FSDP_SUB_FSDP, "pipeline rank %d step %ld: waited %.3f ms of %.3f ms in messages",
               pe->stage, pe->step_no, 1e3 * pe->idle_s, 1e3 * (fsdp_now() - t0));
    FSDP_DEBUG(FSDP_SUB_FSDP,
               "pipeline rank %d step %ld: boundary messages sent %llu (%.0f bytes), "
               "received %llu (%.0f bytes)",
               pe->stage, pe->step_no, (unsigned long long)pe->bounds.calls[FSDP_COLL_SEND],
               pe->bounds.payload[FSDP_COLL_SEND],
               (unsigned long long)pe->bounds.calls[FSDP_COLL_RECV],
               pe->bounds.payload[FSDP_COLL_RECV]);
    double loss = loss_sum / b->K;
    rc = fsdp_shard_mb_finish(se, lr, &loss, out);
    se->shadow = 0;
    FSDP_CHECK(rc);
    FSDP_CHECK(pp_sum(pe, &out->loss));
    out->loss /= n_contrib;
    return 0;
}

/* Chunk c's forward of one batch in eval: its input from the previous
 * stage, its output to the next. */
static int pp_eval_chunk(struct pp_engine *pe, int c, const int32_t *inputs, const int32_t *targets)
{
    struct fsdp_shard_engine *se = pe->se;
    const struct fsdp_pp_action a = {.op = FSDP_PP_FWD, .mb = 0, .chunk = c};
    const int st = pp_stage_of(pe, c);
    const int i = pe->inst0[c];
    struct fsdp_model *m = pp_use(pe, c, i);
    float *x, *y, *d;
    FSDP_CHECK(m->ops->set_batch(m, inputs, targets, se->ec.B, se->ec.T));
    FSDP_CHECK(pp_buffers(pe, i, &x, &y, &d));
    if (st > 0) {
        FSDP_CHECK(fsdp_pp_xfer(pe, 0, x, pe->count, (st - 1) % pe->P, fsdp_pp_tag(&a, st - 1)));
    }
    FSDP_CHECK(pp_tie_gather(pe, c));
    FSDP_CHECK(fsdp_shard_mb_forward(se, inputs, targets));
    fsdp_unit_release_all(se);
    if (st < pe->S - 1) {
        FSDP_CHECK(fsdp_pp_xfer(pe, 1, y, pe->count, (st + 1) % pe->P, fsdp_pp_tag(&a, st)));
    }
    return 0;
}

/* The loss of one batch through the stages in turn, summed like a step's. */
static int pp_eval(struct fsdp_engine *e, const int32_t *inputs, const int32_t *targets,
                   double *loss)
{
    struct pp_engine *pe = pp_impl(e);
    struct fsdp_shard_engine *se = pe->se;
    fsdp_shard_drop_saved(se);
    int rc = 0;
    for (int c = 0; c < pe->V && rc == 0; c++) {
        rc = pp_eval_chunk(pe, c, inputs, targets);
    }
    pp_use(pe, 0, 0);
    fsdp_unit_release_all(se);
    FSDP_CHECK(rc);
    struct fsdp_model *last = pe->models[pe->inst0[pe->V - 1]];
    double l = pp_stage_of(pe, pe->V - 1) == pe->S - 1 ? last->ops->loss(last) : 0.0;
    FSDP_CHECK(fsdp_shard_loss_sum(se, &l));
    FSDP_CHECK(pp_sum(pe, &l));
    *loss = l / se->world;
    return 0;
}

static void pp_describe(const struct fsdp_engine *e, char *buf, size_t len)
{
    const struct pp_engine *pe = pp_impl(e);
    char inner[640], units[128] = "";
    size_t at = 0;
    pe->inner->ops->describe(pe->inner, inner, sizeof(inner));
    for (int c = 0; c < pe->V && at < sizeof(units); c++) {
        at += (size_t)snprintf(units + at, sizeof(units) - at, "%s%d-%d", c ? ", " : "", pe->clo[c],
                               pe->chi[c]);
    }
    snprintf(buf, len,
             "pipeline: %d stages on %d ranks, schedule %s, %d micro-batches, rank %d "
             "holds units %s (%d activation sets kept, no forward recomputed) | %s",
             pe->S, pe->P, fsdp_pp_kind_name(pe->pc.kind), pe->pc.M, pe->stage, units, pe->n_models,
             inner);
}

static void pp_destroy(struct fsdp_engine *e)
{
    if (!e) {
        return;
    }
    struct pp_engine *pe = pp_impl(e);
    struct fsdp_device *dev = pe->se ? pe->se->dev : NULL;
    if (dev) {
        if (pe->held) {
            dev->ops->free(dev, pe->held);
        }
        if (pe->gbuf) {
            dev->ops->free(dev, pe->gbuf);
        }
        for (int dir = 0; dir < 2; dir++) {
            if (pe->slot_w[dir]) {
                (void)fsdp_work_wait(pe->slot_w[dir], -1.0);
                fsdp_work_free(pe->slot_w[dir]);
            }
            if (pe->slot[dir]) {
                dev->ops->free(dev, pe->slot[dir]);
            }
        }
        fsdp_pp_lanes_fini(pe);
        if (pe->unit_buf) {
            dev->ops->free(dev, pe->unit_buf);
        }
        if (pe->save_buf) {
            dev->ops->free(dev, pe->save_buf);
        }
        if (pe->tie_buf) {
            dev->ops->free(dev, pe->tie_buf);
        }
        if (pe->dsums) {
            dev->ops->free(dev, pe->dsums);
        }
    }
    if (pe->inner) {
        pe->inner->ops->destroy(pe->inner);
    }
    fsdp_group_destroy(pe->pp_grad);
    for (int i = 1; pe->models && i < pe->n_models; i++) {
        fsdp_model_destroy(pe->models[i]); /* the first is the parts' */
    }
    free(pe->models);
    free(pe->clo);
    free(pe->chi);
    free(pe->inst0);
    free(pe->inst_of);
    free(pe->inst_busy);
    free(pe->n_bwd);
    free(pe->gbuf_of);
    free(pe->gbuf_busy);
    fsdp_pp_schedule_free(&pe->sched);
    free(pe->steps);
    free(pe->first);
    free(pe->slot_of);
    free(pe->slot_busy);
    free(pe->sums);
    free(pe->order);
    free(pe->save_host);
    free(pe);
}

static const struct fsdp_engine_ops pp_ops = {
    .size = sizeof(struct fsdp_engine_ops),
    .name = "pipeline (sharded stages)",
    .step = pp_step,
    .eval = pp_eval,
    .n_pieces = fsdp_pp_n_pieces,
    .piece = fsdp_pp_piece,
    .state_changed = fsdp_pp_state_changed,
    .gather_unit = fsdp_pp_gather_unit,
    .get_counters = fsdp_pp_get_counters,
    .set_counters = fsdp_pp_set_counters,
    .describe = pp_describe,
    .destroy = pp_destroy,
    .save_rows = fsdp_pp_save_rows,
};

// ----------------------------------------------------------------------------
// setup

/* The boundary buffers: the received inputs and gradients (as many as the
 * steps hold at once), and on world rank 0 room for the largest unit. */
static int pp_alloc(struct pp_engine *pe)
{
    struct fsdp_device *dev = pp_dev(pe);
    const struct fsdp_model_spec *full = pe->se->full;
    const size_t VM = (size_t)pe->V * (size_t)pe->pc.M;
    void *mem;
    fsdp_pp_pool_sizes(&pe->sched, pe->steps, pe->n_steps, &pe->n_held, &pe->n_gbuf);
    pe->slot_of = calloc(VM, sizeof(*pe->slot_of));
    pe->gbuf_of = calloc(VM, sizeof(*pe->gbuf_of));
    pe->slot_busy = calloc(pe->n_held, sizeof(*pe->slot_busy));
    pe->gbuf_busy = calloc(pe->n_gbuf, sizeof(*pe->gbuf_busy));
    pe->inst_of = calloc(VM, sizeof(*pe->inst_of));
    pe->inst_busy = calloc((size_t)pe->n_models, sizeof(*pe->inst_busy));
    pe->n_bwd = calloc((size_t)pe->V, sizeof(*pe->n_bwd));
    pe->sums = calloc((size_t)pe->P, sizeof(*pe->sums));
    pe->order_cap = 16 * pe->sched.n + 16;
    pe->order = calloc(pe->order_cap, 1);
    if (!pe->slot_of || !pe->gbuf_of || !pe->slot_busy || !pe->gbuf_busy || !pe->inst_of ||
        !pe->inst_busy || !pe->n_bwd || !pe->sums || !pe->order) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline tables");
    }
    FSDP_CHECK(fsdp_device_alloc(dev, pe->n_held * pe->count * sizeof(float),
                                 "pipeline stage inputs", &mem));
    pe->held = mem;
    FSDP_CHECK(fsdp_device_alloc(dev, pe->n_gbuf * pe->count * sizeof(float),
                                 "pipeline output gradients", &mem));
    pe->gbuf = mem;
    int dirs[2];
    FSDP_CHECK(fsdp_pp_lanes_init(pe));
    fsdp_pp_send_dirs(&pe->sched, pe->steps, pe->n_steps, dirs);
    for (int dir = 0; dir < 2; dir++) {
        if (dirs[dir]) {
            FSDP_CHECK(fsdp_device_alloc(
                dev, pe->count * sizeof(float),
                dir ? "pipeline gradient send" : "pipeline activation send", &mem));
            pe->slot[dir] = mem;
        }
    }
    if (fsdp_shard_group_device_only(pe->pp)) {
        FSDP_CHECK(
            fsdp_device_alloc(dev, (1 + (size_t)pe->P) * sizeof(double), "pipeline sums", &mem));
        pe->dsums = mem;
    }
    if (pe->stage == 0 && pe->pc.root_line) {
        size_t most = 0;
        for (int u = 0; u < full->n_units; u++) {
            most = full->unit_numel[u] > most ? full->unit_numel[u] : most;
        }
        FSDP_CHECK(fsdp_device_alloc(dev, most * sizeof(float), "pipeline unit for saving", &mem));
        pe->unit_buf = mem;
    }
    return 0;
}

/* Each chunk's units, which the sharding engine must hold, and a model
 * that can be cut for each. */
static int pp_chunks(struct pp_engine *pe)
{
    pe->clo = calloc((size_t)pe->V, sizeof(int));
    pe->chi = calloc((size_t)pe->V, sizeof(int));
    if (!pe->clo || !pe->chi) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline chunks");
    }
    /* every instance is of the parts' model's architecture */
    const struct fsdp_model_ops *ops = pe->models[0] ? pe->models[0]->ops : NULL;
    if (!ops ||
        ops->size < offsetof(struct fsdp_model_ops, stage_buffers) + sizeof(ops->stage_buffers) ||
        !ops->stage_buffers) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "pipeline: the %s model cannot be cut into stages",
                        ops ? ops->name : "(no)");
    }
    for (int c = 0; c < pe->V; c++) {
        fsdp_pp_stage_units(pe->first, pe->S, pp_stage_of(pe, c), &pe->clo[c], &pe->chi[c]);
        for (int u = pe->clo[c]; u <= pe->chi[c]; u++) {
            if (!fsdp_shard_owns(pe->se, u)) {
                return fsdp_err(FSDP_ERR_INTERNAL,
                                "pipeline stage %d: unit %d not held by "
                                "its sharding engine",
                                pp_stage_of(pe, c), u);
            }
        }
    }
    pe->lo = pe->clo[0];
    pe->hi = pe->chi[pe->V - 1];
    return 0;
}

/* A tied head on this rank (the last stage's): its copy of unit 0 bound to
 * the last chunk's model, left out of the norm, and a buffer for the other
 * copy's gradient; rank 0 needs the buffer too. */
static int pp_tie_setup(struct pp_engine *pe)
{
    struct fsdp_shard_engine *se = pe->se;
    pe->tied_last = pe->pc.tied && pe->stage == pe->P - 1;
    if (!pe->pc.tied || (pe->stage != 0 && !pe->tied_last)) {
        return 0;
    }
    if (!fsdp_shard_owns(se, 0)) {
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline rank %d: the tied embedding is not held",
                        pe->stage);
    }
    if (pe->tied_last) {
        se->norm_skip_root = 1;
        for (int i = pe->inst0[pe->V - 1]; i < pe->inst0[pe->V]; i++) {
            se->model = pe->models[i];
            FSDP_CHECK(fsdp_shard_bind_unit(se, 0));
        }
        se->model = pe->models[0];
    }
    void *mem;
    FSDP_CHECK(fsdp_device_alloc(se->dev, (se->units[0].S ? se->units[0].S : 1) * sizeof(float),
                                 "pipeline tied embedding gradient", &mem));
    pe->tie_buf = mem;
    return 0;
}

/* Each chunk's instances, as many as it holds micro-batches at once (the
 * schedule's): made like the parts' model, so chunk 0's take unit 0 by rows
 * where it does; each after a chunk's first shares that one's workspace
 * (the chunk runs one forward or backward at a time, and a backward's
 * scratch is dead when it returns; each keeps its own dres); reserved (the
 * first, the parts', is already). */
static int pp_instances(struct pp_engine *pe)
{
    struct fsdp_shard_engine *se = pe->se;
    pe->inst0 = calloc((size_t)pe->V + 1, sizeof(*pe->inst0));
    if (!pe->inst0) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline instances");
    }
    const int n = fsdp_pp_chunk_holds(&pe->sched, pe->inst0 + 1);
    if (n != pe->n_models) {
        return fsdp_err(FSDP_ERR_INTERNAL,
                        "pipeline rank %d: %d model instances, its schedule holds %d", pe->stage,
                        pe->n_models, n);
    }
    for (int c = 0; c < pe->V; c++) {
        pe->inst0[c + 1] += pe->inst0[c];
    }
    for (int i = 1, c = 0; i < pe->n_models; i++) {
        struct fsdp_model *m = pe->models[i];
        while (i >= pe->inst0[c + 1]) {
            c++;
        }
        if (i < pe->inst0[1] && se->rows_root) {
            int rc = m->ops->set_unit_rows(m, 0, se->shard_g);
            FSDP_CHECK(rc);
            if (rc != 1) {
                return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: an instance declined unit 0 by rows");
            }
        }
        if (i > pe->inst0[c]) {
            FSDP_CHECK(fsdp_model_share_workspace(m, pe->models[pe->inst0[c]]));
        }
        FSDP_CHECK(m->ops->reserve(m));
    }
    return 0;
}

/* The schedule, its steps and the chunks' units and instances; each
 * instance must already be cut at its chunk's units. */
static int pp_setup(struct pp_engine *pe)
{
    const struct fsdp_pp_config *pc = &pe->pc;
    FSDP_CHECK(pp_chunks(pe));
    FSDP_CHECK(fsdp_pp_check(pc->kind, pe->P, pc->V, pc->M));
    FSDP_CHECK(fsdp_pp_schedule_create(pc->kind, pe->P, pc->V, pc->M, pe->stage, &pe->sched));
    FSDP_CHECK(fsdp_pp_steps_create(&pe->sched, 1, &pe->steps, &pe->n_steps));
    FSDP_CHECK(pp_instances(pe));
    FSDP_CHECK(pp_tie_setup(pe));
    /* with sequence parallelism the residual stream holds this tp rank's rows */
    const size_t tp = pe->se->tp->sp ? (size_t)pe->se->tp->size : 1;
    pe->count = (size_t)pe->se->ec.B * (size_t)pe->se->ec.T / tp * pc->C;
    return pp_alloc(pe);
}

/* What the engine takes, released where it cannot be made. */
static void pp_drop_taken(struct fsdp_engine *inner, struct fsdp_model *const *models, int n,
                          struct fsdp_group *grad)
{
    fsdp_group_destroy(grad);
    if (inner) {
        inner->ops->destroy(inner);
    }
    for (int i = 1; i < n; i++) {
        fsdp_model_destroy(models[i]);
    }
}

int fsdp_pp_engine_create(struct fsdp_engine *inner, struct fsdp_model *const *models,
                          struct fsdp_group *pp, const struct fsdp_pp_config *pc,
                          struct fsdp_engine **out)
{
    *out = NULL;
    const int V = pc->V > 0 ? pc->V : 1, n = pc->n_models;
    if (!fsdp_shard_engine_is(inner) || !pp || !pc->grad || !pc->first || n < V) {
        pp_drop_taken(inner, models, n, pc->grad);
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: needs a sharding engine, two groups, "
                                           "a stage split and an instance per chunk");
    }
    struct pp_engine *pe = calloc(1, sizeof(*pe));
    struct fsdp_model **ms = calloc((size_t)n, sizeof(*ms));
    if (!pe || !ms) {
        free(pe);
        free(ms);
        pp_drop_taken(inner, models, n, pc->grad);
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline engine");
    }
    memcpy(ms, models, (size_t)n * sizeof(*ms));
    pe->base.impl = pe;
    pe->inner = inner;
    pe->se = inner->impl;
    pe->models = ms;
    pe->n_models = n;
    pe->model = ms[0];
    pe->pp = pp;
    pe->pp_grad = pc->grad;
    pe->pc = *pc;
    pe->P = pp->size;
    pe->V = V;
    pe->S = pe->P * V;
    pe->stage = pp->rank;
    pe->first = calloc((size_t)pe->S + 1, sizeof(int));
    int rc = pe->first ? 0 : fsdp_err(FSDP_ERR_NOMEM, "pipeline split");
    if (rc == 0) {
        memcpy(pe->first, pc->first, ((size_t)pe->S + 1) * sizeof(int));
        pe->pc.first = pe->first;
        pe->L = pe->first[pe->S];
        pe->pass_s = fsdp_env_double("FSDPC_PP_PASS_MS", 0.0) / 1e3;
        rc = pp_setup(pe);
    }
    if (rc < 0) {
        pp_destroy(&pe->base);
        return rc;
    }
    pe->se->sumsq_hook = pp_sum;
    pe->se->sumsq_arg = pe;
    if (pc->tied && (pe->stage == 0 || pe->tied_last)) {
        pe->se->pre_update = pp_tie_sum;
    }
    struct fsdp_engine *e = &pe->base;
    *e = *inner;
    /* the table's fields: spec, state names, shard of the checkpoint */
    e->ops = &pp_ops;
    e->impl = pe;
    e->flops_per_token = inner->flops_per_token / pe->P; /* a stage's share, about */
    /* checkpoint shard = dp rank, as without pp; stage 0 writes every stage's rows */
    e->blocks = 1;
    e->writes_state = inner->writes_state && pe->stage == 0;
    *out = e;
    return 0;
}
