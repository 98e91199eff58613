/*
 * pp_engine.c - the pipeline runtime (pp_engine.h): one step as the rank's
 * schedule table with its messages (pp_comm.h), each pass through the
 * stage's sharding engine (engine.c's micro-batch passes over the stage's
 * units), the held stage inputs, the sums over the stages, and whole units
 * brought to world rank 0 for the final model file. The sharding engine
 * keeps the state; this file keeps only the boundary buffers.
 */
#include "config.h"
#include "parallel/pp_engine.h"
#include "parallel/pp_comm.h"
#include "parallel/fsdp_impl.h"
#include "core/error.h"
#include "core/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct pp_engine {
    struct fsdp_engine base;
    struct fsdp_engine *inner;    /* the stage's sharding engine (owned) */
    struct fsdp_shard_engine *se; /* its state */
    struct fsdp_model *model;     /* borrowed: the inner engine's parts (chunk 0's) */
    struct fsdp_model **models;   /* (V,) each chunk's instance; [1 ..] owned */
    struct fsdp_group *pp;
    struct fsdp_pp_config pc;
    int *first;                    /* (S + 1,) a copy of pc.first */
    int P, V, S, stage, lo, hi, L; /* stage: this rank in the pipeline group */
    int *clo, *chi;                /* (V,) each chunk's units */
    int *model_mb;                 /* (V,) the micro-batch each chunk's model holds; -1 */
    int *n_bwd;                    /* (V,) backwards of each chunk so far this step */
    struct fsdp_pp_schedule sched;
    struct fsdp_pp_step *steps; /* (n_steps,) */
    size_t n_steps;
    size_t count;    /* B T C: one boundary message */
    size_t n_held;   /* slots of received stage inputs: the most the steps hold at once */
    float *held;     /* (n_held, count) device: stage inputs (stage > 0) */
    int *slot_of;    /* (V M,) held slot of each (chunk, micro-batch); -1: none */
    int *slot_busy;  /* (n_held,) */
    size_t n_gbuf;   /* slots of received output gradients: the most held at once */
    float *gbuf;     /* (n_gbuf, count) device: received output gradients */
    int *gbuf_of;    /* (V M,) */
    int *gbuf_busy;  /* (n_gbuf,) */
    float *unit_buf; /* world rank 0: a unit received from its stage */
    float *save_buf; /* stage 0 of a writing pipeline: a tensor's rows received for a
                        checkpoint (at the first save) */
    float *save_host; /* the owning stage's rows re-laid out from tp blocks (host) */
    int tied_last;    /* this rank runs the last stage and holds a copy of unit 0 */
    float *tie_buf;   /* (units[0].S) device: the other copy's gradient shard */
    double *sums;     /* (P,) the pipeline sum's all-gather */
    double *dsums;    /* (1 + P) device: its send and receive where the pp group's
                         backend takes no host memory (nccl); else NULL */
    size_t held_now, peak;
    long step_no;
    double idle_s; /* this step: seconds blocked in the boundary messages */
    char *order; /* the executed passes of the step, for the log */
    size_t order_len, order_cap;
};

static struct pp_engine *pp_impl(const struct fsdp_engine *e)
{
    return e->impl;
}

void fsdp_pp_stage_units(const int *first, int P, int s, int *lo, int *hi)
{
    const int L = first[P];
    *lo = s == 0 ? 0 : first[s] + 1;
    *hi = s == P - 1 ? L + 1 : first[s + 1];
}

/* The pipeline rank that holds unit u (stage s is on rank s mod P). */
static int pp_owner(const struct pp_engine *pe, int u)
{
    for (int s = 0; s < pe->S; s++) {
        int lo, hi;
        fsdp_pp_stage_units(pe->first, pe->S, s, &lo, &hi);
        if (u >= lo && u <= hi) {
            return s % pe->P;
        }
    }
    return -1;
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

/* A message of n floats in device memory to or from pipeline rank peer,
 * ordered after what the compute stream has issued and before what it
 * issues next, waited for. */
static int pp_xfer(struct pp_engine *pe, int send, void *buf, size_t n, int peer, unsigned tag)
{
    struct fsdp_shard_engine *se = pe->se;
    struct fsdp_work *w = NULL;
    const double t0 = fsdp_now();
    FSDP_CHECK(fsdp_unit_comm_begin(se));
    if (send) {
        FSDP_CHECK(fsdp_send(pe->pp, buf, n, FSDP_F32, peer, tag, &se->attr, &w));
    } else {
        FSDP_CHECK(fsdp_recv(pe->pp, buf, n, FSDP_F32, peer, tag, &se->attr, &w));
    }
    int rc = fsdp_work_wait(w, -1.0);
    fsdp_work_free(w);
    FSDP_CHECK(rc);
    rc = fsdp_unit_comm_end(se);
    pe->idle_s += fsdp_now() - t0;
    return rc;
}

// ----------------------------------------------------------------------------
// passes

static struct fsdp_device *pp_dev(const struct pp_engine *pe)
{
    return pe->se->dev;
}

/* The stage chunk c of this rank runs. */
static int pp_stage_of(const struct pp_engine *pe, int c)
{
    return c * pe->P + pe->stage;
}

/* Chunk c's model, bound to the sharding engine, its passes over its units. */
static struct fsdp_model *pp_use(struct pp_engine *pe, int c)
{
    pe->se->model = pe->models[c];
    pe->se->u_lo = pe->clo[c];
    pe->se->u_hi = pe->chi[c];
    return pe->models[c];
}

/* Chunk c's model's boundary buffers for the current batch. */
static int pp_buffers(struct pp_engine *pe, int c, float **in, float **out, float **dres)
{
    size_t count;
    FSDP_CHECK(pe->models[c]->ops->stage_buffers(pe->models[c], in, out, dres, &count));
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
        FSDP_CHECK(pp_xfer(pe, 1, un->grad, un->cnt, pe->P - 1, fsdp_pp_tag(&a, 0)));
        FSDP_CHECK(pp_xfer(pe, 0, pe->tie_buf, un->cnt, pe->P - 1, fsdp_pp_tag(&a, pe->S - 1)));
    } else {
        FSDP_CHECK(pp_xfer(pe, 0, pe->tie_buf, un->cnt, 0, fsdp_pp_tag(&a, 0)));
        FSDP_CHECK(pp_xfer(pe, 1, un->grad, un->cnt, 0, fsdp_pp_tag(&a, pe->S - 1)));
    }
    pe->se->dev->k->accumulate(pe->se->dev, un->grad, pe->tie_buf, un->cnt);
    return 0;
}

/* Chunk c's forward of micro-batch mb of b: from its held input (not
 * stage 0), through its units (the last stage: the loss). */
static int pp_forward(struct pp_engine *pe, const struct fsdp_batch *b, int mb, int c)
{
    const size_t bt = (size_t)b->B * (size_t)b->T;
    const int32_t *in = b->inputs + (size_t)mb * bt, *tg = b->targets + (size_t)mb * bt;
    struct fsdp_model *m = pp_use(pe, c);
    const int key = c * pe->pc.M + mb;
    FSDP_CHECK(m->ops->set_batch(m, in, tg, b->B, b->T));
    if (pp_stage_of(pe, c) > 0) {
        float *x, *y, *d;
        FSDP_CHECK(pp_buffers(pe, c, &x, &y, &d));
        if (pe->slot_of[key] < 0) {
            return fsdp_err(FSDP_ERR_INTERNAL,
                            "pipeline stage %d: forward of micro-batch %d "
                            "without its input",
                            pp_stage_of(pe, c), mb);
        }
        FSDP_CHECK(fsdp_device_copy(pp_dev(pe), x, pe->held + (size_t)pe->slot_of[key] * pe->count,
                                    pe->count * sizeof(float)));
    }
    FSDP_CHECK(pp_tie_gather(pe, c));
    FSDP_CHECK(fsdp_shard_mb_forward(pe->se, in, tg));
    /* the sharding engine keeps the last unit gathered for the backward
     * that follows at once in its own step; here another forward may come
     * first, and its units may need that buffer */
    fsdp_unit_release_all(pe->se);
    pe->model_mb[c] = mb;
    return 0;
}

/* Chunk c's backward of micro-batch mb: its forward again unless the model
 * still holds it, the received output gradient into the model (not the
 * last stage), then the units' backward with the step's reduction policy
 * (k: the chunk's backwards so far); the held buffers are freed. */
static int pp_backward(struct pp_engine *pe, const struct fsdp_batch *b, int mb, int c)
{
    const int key = c * pe->pc.M + mb, k = pe->n_bwd[c];
    if (pe->model_mb[c] != mb) {
        FSDP_CHECK(pp_forward(pe, b, mb, c));
    }
    pp_use(pe, c);
    if (pp_stage_of(pe, c) < pe->S - 1) {
        float *x, *y, *d;
        FSDP_CHECK(pp_buffers(pe, c, &x, &y, &d));
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
    pe->n_bwd[c]++;
    pe->model_mb[c] = -1;
    if (pe->slot_of[key] >= 0) {
        pe->slot_busy[pe->slot_of[key]] = 0;
        pe->slot_of[key] = -1;
    }
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
    return pp_xfer(pe, 0, dst, pe->count, st->peer, fsdp_pp_tag(a, from));
}

static int pp_send(struct pp_engine *pe, const struct fsdp_pp_step *st)
{
    const struct fsdp_pp_action *a = &pe->sched.at[st->act];
    float *x, *y, *d;
    FSDP_CHECK(pp_buffers(pe, a->chunk, &x, &y, &d));
    return pp_xfer(pe, 1, a->op == FSDP_PP_FWD ? y : d, pe->count, st->peer,
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
    if (pp_stage_of(pe, a->chunk) == pe->S - 1) {
        *loss_sum += pe->models[a->chunk]->ops->loss(pe->models[a->chunk]);
    }
    return 0;
}

// ----------------------------------------------------------------------------
// ops

static void pp_reset(struct pp_engine *pe)
{
    for (int i = 0; i < pe->V * pe->pc.M; i++) {
        pe->slot_of[i] = pe->gbuf_of[i] = -1;
    }
    memset(pe->slot_busy, 0, pe->n_held * sizeof(*pe->slot_busy));
    memset(pe->gbuf_busy, 0, pe->n_gbuf * sizeof(*pe->gbuf_busy));
    for (int c = 0; c < pe->V; c++) {
        pe->model_mb[c] = -1;
        pe->n_bwd[c] = 0;
    }
    pe->held_now = pe->peak = 0;
    pe->order_len = 0;
    pe->order[0] = '\0';
}

static int pp_step(struct fsdp_engine *e, const struct fsdp_batch *b, double lr, int n_contrib,
                   struct fsdp_step_result *out)
{
    struct pp_engine *pe = pp_impl(e);
    struct fsdp_shard_engine *se = pe->se;
    if (!b->inputs) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "pipeline: a rank without a batch (uneven data, "
                                              "join) is not supported with pp; use --uneven stop");
    }
    if (b->K != pe->pc.M || b->B != se->ec.B || b->T != se->ec.T) {
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: batch %d x %d x %d, made for %d x %d x %d",
                        b->K, b->B, b->T, pe->pc.M, se->ec.B, se->ec.T);
    }
    fsdp_shard_drop_saved(se);
    pp_reset(pe);
    pe->step_no++;
    pe->idle_s = 0.0;
    const double t0 = fsdp_now();
    se->shadow = 0;
    for (int c = 0; c < pe->V; c++) {
        pe->models[c]->ops->set_loss_seed(pe->models[c],
                                          (double)b->K * (double)b->B * (double)b->T * n_contrib,
                                          se->scaler.scale);
    }
    double loss_sum = 0.0;
    int rc = 0;
    for (size_t i = 0; i < pe->n_steps && rc == 0; i++) {
        rc = pp_run_step(pe, &pe->steps[i], b, &loss_sum);
    }
    pp_use(pe, 0);
    if (rc < 0) {
        fsdp_unit_release_all(se);
        return rc;
    }
    FSDP_DEBUG(FSDP_SUB_FSDP, "pipeline rank %d step %ld: %s | peak %zu", pe->stage, pe->step_no,
               pe->order, pe->peak);
    FSDP_DEBUG(FSDP_SUB_FSDP, "pipeline rank %d step %ld: waited %.3f ms of %.3f ms in messages",
               pe->stage, pe->step_no, 1e3 * pe->idle_s, 1e3 * (fsdp_now() - t0));
    double loss = loss_sum / b->K;
    FSDP_CHECK(fsdp_shard_mb_finish(se, lr, &loss, out));
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
    struct fsdp_model *m = pp_use(pe, c);
    float *x, *y, *d;
    FSDP_CHECK(m->ops->set_batch(m, inputs, targets, se->ec.B, se->ec.T));
    FSDP_CHECK(pp_buffers(pe, c, &x, &y, &d));
    if (st > 0) {
        FSDP_CHECK(pp_xfer(pe, 0, x, pe->count, (st - 1) % pe->P, fsdp_pp_tag(&a, st - 1)));
    }
    FSDP_CHECK(pp_tie_gather(pe, c));
    FSDP_CHECK(fsdp_shard_mb_forward(se, inputs, targets));
    fsdp_unit_release_all(se);
    pe->model_mb[c] = -1;
    if (st < pe->S - 1) {
        FSDP_CHECK(pp_xfer(pe, 1, y, pe->count, (st + 1) % pe->P, fsdp_pp_tag(&a, st)));
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
    pp_use(pe, 0);
    fsdp_unit_release_all(se);
    FSDP_CHECK(rc);
    struct fsdp_model *last = pe->models[pe->V - 1];
    double l = pp_stage_of(pe, pe->V - 1) == pe->S - 1 ? last->ops->loss(last) : 0.0;
    FSDP_CHECK(fsdp_shard_loss_sum(se, &l));
    FSDP_CHECK(pp_sum(pe, &l));
    *loss = l / se->world;
    return 0;
}

static size_t pp_n_pieces(const struct fsdp_engine *e)
{
    const struct pp_engine *pe = pp_impl(e);
    return pe->inner->ops->n_pieces(pe->inner);
}

static void pp_piece(struct fsdp_engine *e, size_t k, struct fsdp_state_piece *out)
{
    struct pp_engine *pe = pp_impl(e);
    pe->inner->ops->piece(pe->inner, k, out);
}

static int pp_state_changed(struct fsdp_engine *e)
{
    struct pp_engine *pe = pp_impl(e);
    return pe->inner->ops->state_changed(pe->inner);
}

/*
 * Unit u whole: its stage gathers it over its data-parallel group; on the
 * pipeline line of world rank 0 a unit of another stage then comes to
 * stage 0 over the pipeline group. *full is the unit on stage 0 of that
 * line (world rank 0, the writer) and on the owning stage, NULL elsewhere.
 */
static int pp_gather_unit(struct fsdp_engine *e, int u, const float **full)
{
    struct pp_engine *pe = pp_impl(e);
    const int owner = pp_owner(pe, u);
    const float *f = NULL;
    *full = NULL;
    if (owner == pe->stage) {
        FSDP_CHECK(pe->inner->ops->gather_unit(pe->inner, u, &f));
        *full = f;
    }
    if (owner == 0 || !pe->pc.root_line) {
        return 0;
    }
    const struct fsdp_pp_action a = {.op = FSDP_PP_FWD, .mb = u, .chunk = 0};
    size_t n = pe->se->full->unit_numel[u];
    if (pe->stage == owner) {
        return pp_xfer(pe, 1, (void *)f, n, 0, fsdp_pp_tag(&a, owner));
    }
    if (pe->stage == 0) {
        FSDP_CHECK(pp_xfer(pe, 0, pe->unit_buf, n, owner, fsdp_pp_tag(&a, owner)));
        *full = pe->unit_buf;
    }
    return 0;
}

/* A buffer on the device for one shard's rows of any tensor. */
static int pp_save_buf(struct pp_engine *pe)
{
    if (!pe->save_buf) {
        void *mem;
        FSDP_CHECK(fsdp_device_alloc(pp_dev(pe),
                                     fsdp_model_spec_largest(pe->se->full) * sizeof(float),
                                     "pipeline checkpoint rows", &mem));
        pe->save_buf = mem;
    }
    return 0;
}

/* save_rows with tensor parallelism: the owning stage's ranks re-lay the
 * tensor out as their shard's rows (the sharding engine's save_rows,
 * collective over the stage's dp and tp groups), which go to stage 0 of
 * the same dp and tp coordinates (n floats). */
static int pp_save_blocks(struct pp_engine *pe, int kind, size_t param, int owner, size_t n,
                          float *out)
{
    const struct fsdp_pp_action a = {.op = FSDP_PP_BWD, .mb = kind, .chunk = 0};
    if (owner == 0 && pe->stage == 0) {
        return pe->inner->ops->save_rows(pe->inner, kind, param, out);
    }
    FSDP_CHECK(pp_save_buf(pe));
    if (pe->stage == owner) {
        if (!pe->save_host) {
            pe->save_host = malloc(fsdp_model_spec_largest(pe->se->full) * sizeof(float));
            if (!pe->save_host) {
                return fsdp_err(FSDP_ERR_NOMEM, "pipeline checkpoint rows");
            }
        }
        FSDP_CHECK(pe->inner->ops->save_rows(pe->inner, kind, param, pe->save_host));
        FSDP_CHECK(fsdp_device_write(pp_dev(pe), pe->save_buf, pe->save_host, n * sizeof(float)));
        return pp_xfer(pe, 1, pe->save_buf, n, 0, fsdp_pp_tag(&a, owner));
    }
    FSDP_CHECK(pp_xfer(pe, 0, pe->save_buf, n, owner, fsdp_pp_tag(&a, owner)));
    return out ? fsdp_device_read(pp_dev(pe), out, pe->save_buf, n * sizeof(float)) : 0;
}

/*
 * engine.h's save_rows: checkpoint shard base.shard (this rank's dp rank)
 * holds rows of every tensor; a tensor of another stage comes from that
 * stage's rank of the same dp coordinate to stage 0, which writes the
 * shard. Every rank calls it for every tensor in the same order; only the
 * writing replica's pipelines exchange.
 */
static int pp_save_rows(struct fsdp_engine *e, int kind, size_t param, float *out)
{
    struct pp_engine *pe = pp_impl(e);
    const struct fsdp_model_spec *spec = pe->se->full;
    const struct fsdp_param_spec *p = &spec->params[param];
    const int owner = pp_owner(pe, p->unit);
    if (!pe->inner->writes_state || (pe->stage != owner && pe->stage != 0)) {
        return 0;
    }
    struct fsdp_state_piece pc = {0};
    size_t row0, rows;
    fsdp_split_even(p->shape[0], (size_t)e->n_shards, (size_t)e->shard, &row0, &rows);
    const size_t n = rows * p->shape[1];
    if (pe->inner->blocks) { /* tensor parallelism: the stage re-lays its blocks out as rows */
        return pp_save_blocks(pe, kind, param, owner, n, out);
    }
    if (pe->stage == owner) {
        pe->inner->ops->piece(pe->inner, (size_t)kind * spec->n_params + param, &pc);
        if (pc.row0 != row0 || pc.rows != rows) {
            return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: %s rows %zu+%zu, shard holds %zu+%zu",
                            p->name, pc.row0, pc.rows, row0, rows);
        }
    }
    const struct fsdp_pp_action a = {.op = FSDP_PP_BWD, .mb = kind, .chunk = 0};
    if (owner != 0 && pe->stage == owner) {
        return pp_xfer(pe, 1, pc.data, n, 0, fsdp_pp_tag(&a, owner));
    }
    const float *src = pc.data;
    if (owner != 0) {
        FSDP_CHECK(pp_save_buf(pe));
        FSDP_CHECK(pp_xfer(pe, 0, pe->save_buf, n, owner, fsdp_pp_tag(&a, owner)));
        src = pe->save_buf;
    }
    return out ? fsdp_device_read(pp_dev(pe), out, src, n * sizeof(float)) : 0;
}

static void pp_get_counters(const struct fsdp_engine *e, struct fsdp_engine_counters *c)
{
    const struct pp_engine *pe = pp_impl(e);
    pe->inner->ops->get_counters(pe->inner, c);
}

static void pp_set_counters(struct fsdp_engine *e, const struct fsdp_engine_counters *c)
{
    struct pp_engine *pe = pp_impl(e);
    pe->inner->ops->set_counters(pe->inner, c);
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
             "holds units %s (stage inputs kept, forward recomputed in the backward) | %s",
             pe->S, pe->P, fsdp_pp_kind_name(pe->pc.kind), pe->pc.M, pe->stage, units, inner);
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
    for (int c = 1; pe->models && c < pe->V; c++) {
        fsdp_model_destroy(pe->models[c]); /* chunk 0's is the parts' */
    }
    free(pe->models);
    free(pe->clo);
    free(pe->chi);
    free(pe->model_mb);
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
    .n_pieces = pp_n_pieces,
    .piece = pp_piece,
    .state_changed = pp_state_changed,
    .gather_unit = pp_gather_unit,
    .get_counters = pp_get_counters,
    .set_counters = pp_set_counters,
    .describe = pp_describe,
    .destroy = pp_destroy,
    .save_rows = pp_save_rows,
};

// ----------------------------------------------------------------------------
// setup

/* The most received inputs and received gradients the steps hold at once
 * (a receive may come some passes before its pass). */
static void pp_pool_sizes(struct pp_engine *pe)
{
    size_t f = 0, g = 0;
    pe->n_held = pe->n_gbuf = 1;
    for (size_t i = 0; i < pe->n_steps; i++) {
        const struct fsdp_pp_step *st = &pe->steps[i];
        const struct fsdp_pp_action *a = &pe->sched.at[st->act];
        const int stage = pp_stage_of(pe, a->chunk);
        if (st->kind == FSDP_PP_RECV) {
            f += a->op == FSDP_PP_FWD;
            g += a->op == FSDP_PP_BWD;
        } else if (st->kind == FSDP_PP_RUN && a->op == FSDP_PP_BWD) {
            f -= stage > 0;
            g -= stage < pe->S - 1;
        }
        pe->n_held = f > pe->n_held ? f : pe->n_held;
        pe->n_gbuf = g > pe->n_gbuf ? g : pe->n_gbuf;
    }
}

/* The boundary buffers: the received inputs and gradients (as many as the
 * steps hold at once), and on world rank 0 room for the largest unit. */
static int pp_alloc(struct pp_engine *pe)
{
    struct fsdp_device *dev = pp_dev(pe);
    const struct fsdp_model_spec *full = pe->se->full;
    const size_t VM = (size_t)pe->V * (size_t)pe->pc.M;
    void *mem;
    pp_pool_sizes(pe);
    pe->slot_of = calloc(VM, sizeof(*pe->slot_of));
    pe->gbuf_of = calloc(VM, sizeof(*pe->gbuf_of));
    pe->slot_busy = calloc(pe->n_held, sizeof(*pe->slot_busy));
    pe->gbuf_busy = calloc(pe->n_gbuf, sizeof(*pe->gbuf_busy));
    pe->model_mb = calloc((size_t)pe->V, sizeof(*pe->model_mb));
    pe->n_bwd = calloc((size_t)pe->V, sizeof(*pe->n_bwd));
    pe->sums = calloc((size_t)pe->P, sizeof(*pe->sums));
    pe->order_cap = 16 * pe->sched.n + 16;
    pe->order = calloc(pe->order_cap, 1);
    if (!pe->slot_of || !pe->gbuf_of || !pe->slot_busy || !pe->gbuf_busy || !pe->model_mb ||
        !pe->n_bwd || !pe->sums || !pe->order) {
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline tables");
    }
    FSDP_CHECK(fsdp_device_alloc(dev, pe->n_held * pe->count * sizeof(float),
                                 "pipeline stage inputs", &mem));
    pe->held = mem;
    FSDP_CHECK(fsdp_device_alloc(dev, pe->n_gbuf * pe->count * sizeof(float),
                                 "pipeline output gradients", &mem));
    pe->gbuf = mem;
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
    for (int c = 0; c < pe->V; c++) {
        const struct fsdp_model_ops *ops = pe->models[c] ? pe->models[c]->ops : NULL;
        if (!ops ||
            ops->size <
                offsetof(struct fsdp_model_ops, stage_buffers) + sizeof(ops->stage_buffers) ||
            !ops->stage_buffers) {
            return fsdp_err(FSDP_ERR_UNSUPPORTED,
                            "pipeline: the %s model cannot be cut into "
                            "stages",
                            ops ? ops->name : "(no)");
        }
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
        se->model = pe->models[pe->V - 1];
        FSDP_CHECK(fsdp_shard_bind_unit(se, 0));
        se->model = pe->models[0];
    }
    void *mem;
    FSDP_CHECK(fsdp_device_alloc(se->dev, (se->units[0].S ? se->units[0].S : 1) * sizeof(float),
                                 "pipeline tied embedding gradient", &mem));
    pe->tie_buf = mem;
    return 0;
}

/* The schedule, its steps and the chunks' units; each chunk's model must
 * already be cut at its units. */
static int pp_setup(struct pp_engine *pe)
{
    const struct fsdp_pp_config *pc = &pe->pc;
    FSDP_CHECK(pp_chunks(pe));
    FSDP_CHECK(fsdp_pp_check(pc->kind, pe->P, pc->V, pc->M));
    FSDP_CHECK(fsdp_pp_schedule_create(pc->kind, pe->P, pc->V, pc->M, pe->stage, &pe->sched));
    FSDP_CHECK(fsdp_pp_steps_create(&pe->sched, 1, &pe->steps, &pe->n_steps));
    FSDP_CHECK(pp_tie_setup(pe));
    /* with sequence parallelism the residual stream holds this tp rank's rows */
    const size_t tp = pe->se->tp->sp ? (size_t)pe->se->tp->size : 1;
    pe->count = (size_t)pe->se->ec.B * (size_t)pe->se->ec.T / tp * pc->C;
    return pp_alloc(pe);
}

int fsdp_pp_engine_create(struct fsdp_engine *inner, struct fsdp_model *const *models,
                          struct fsdp_group *pp, const struct fsdp_pp_config *pc,
                          struct fsdp_engine **out)
{
    *out = NULL;
    const int V = pc->V > 0 ? pc->V : 1;
    if (!fsdp_shard_engine_is(inner) || !pp || !pc->first) {
        if (inner) {
            inner->ops->destroy(inner);
        }
        for (int c = 1; c < V; c++) {
            fsdp_model_destroy(models[c]);
        }
        return fsdp_err(FSDP_ERR_INTERNAL, "pipeline: needs a sharding engine, a group and a "
                                           "stage split");
    }
    struct pp_engine *pe = calloc(1, sizeof(*pe));
    struct fsdp_model **ms = calloc((size_t)V, sizeof(*ms));
    if (!pe || !ms) {
        free(pe);
        free(ms);
        inner->ops->destroy(inner);
        for (int c = 1; c < V; c++) {
            fsdp_model_destroy(models[c]);
        }
        return fsdp_err(FSDP_ERR_NOMEM, "pipeline engine");
    }
    memcpy(ms, models, (size_t)V * sizeof(*ms));
    pe->base.impl = pe;
    pe->inner = inner;
    pe->se = inner->impl;
    pe->models = ms;
    pe->model = ms[0];
    pe->pp = pp;
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
