/*
 * test_parts.c - the parts the trainer builds before sharding
 * (src/train/parts.h) and the sharding engine's contract over them
 * (parallel/fsdp.h, struct fsdp_shard_parts), on one process:
 *   - the engine steps the parts' own optimizer (its step count moves) and
 *     model, shards the whole table, and leaves the parts to their creator
 *     (destroyed after the engine; run under valgrind by hand for leaks);
 *   - activation checkpointing applied to the parts' model shows in the
 *     engine's saved-activation bytes, and a step with it gives the same
 *     loss and gradient norm bit for bit;
 *   - with tensor parallelism (a tp group that is only a shape) the model
 *     and the optimizer are on the plan's tp-local table, and the sizing
 *     plan refuses a shape of another tp rank than the parts';
 *   - parts that do not fit together (a model or optimizer of another
 *     table) and a seq-len sequence parallelism cannot split are refused
 *     with one line naming what.
 */
#include "config.h"
#include "train/parts.h"
#include "parallel/fsdp.h"
#include "comm/group.h"
#include "compute/device.h"
#include "model/gpt2_spec.h"
#include "model/model.h"
#include "core/error.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PB 2
#define PT 8

static struct fsdp_model_spec *spec_of(int tied)
{
    struct fsdp_gpt2_config cfg = {.vocab_size = 37,
                                   .context = 11,
                                   .n_layer = 2,
                                   .n_head = 2,
                                   .n_embd = 6,
                                   .ln_eps = 1e-5f,
                                   .tied = tied};
    struct fsdp_model_spec *s = NULL;
    if (fsdp_gpt2_spec_create(&cfg, &s) < 0) {
        tap_diag("gpt2 spec: %s", fsdp_err_msg());
        exit(1);
    }
    return s;
}

static void configs(struct fsdp_optim_config *oc, struct fsdp_shard_config *sc, int ckpt)
{
    *oc = (struct fsdp_optim_config){
        .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .clip = 1.0f};
    fsdp_shard_config_init(sc);
    sc->B = PB;
    sc->T = PT;
    sc->activation_checkpointing = ckpt;
}

static const struct fsdp_shard_groups one = {
    .world_rank = -1, .mesh = "single rank", .backends = "no backend"};

/* Parameters off zero, the same on every call. */
static void load(struct fsdp_engine *e)
{
    for (size_t k = 0; k < e->ops->n_pieces(e); k++) {
        struct fsdp_state_piece pc;
        e->ops->piece(e, k, &pc);
        size_t n = pc.rows * fsdp_state_piece_cols(&pc, e->spec->params[pc.param].shape[1]);
        for (size_t i = 0; pc.kind == 0 && i < n; i++) {
            pc.data[i] = 0.05f * sinf((float)(i + 7 * pc.param));
        }
    }
    e->ops->state_changed(e);
}

/* One step on a fixed batch: the result and the engine's stats. */
static int one_step(int ckpt, struct fsdp_step_result *res, struct fsdp_engine_stats *st,
                    long *opt_steps)
{
    struct fsdp_model_spec *s = spec_of(1);
    struct fsdp_device *dev = NULL;
    struct fsdp_optim_config oc;
    struct fsdp_shard_config sc;
    struct fsdp_train_parts *p = NULL;
    struct fsdp_engine *e = NULL;
    configs(&oc, &sc, ckpt);
    int32_t tok[PB * PT], tgt[PB * PT];
    for (int i = 0; i < PB * PT; i++) {
        tok[i] = (i * 5 + 3) % 37;
        tgt[i] = (i * 11 + 1) % 37;
    }
    struct fsdp_batch b = {.K = 1, .B = PB, .T = PT, .inputs = tok, .targets = tgt};
    int rc = fsdp_device_create("cpu", 0, &dev);
    rc = rc ? rc : fsdp_train_parts_create(s, NULL, dev, &oc, &sc, &p);
    rc = rc ? rc : fsdp_shard_engine_create(&p->shard, &one, dev, &sc, &e);
    if (rc == 0) {
        tap_ok(e->spec == s && p->model->spec == s && p->opt.spec == s && !p->plan &&
                   e->n_state == p->opt.n_state && e->state_names == p->opt.state_names,
               "%s: the engine shards the whole table with the parts' model and optimizer",
               ckpt ? "checkpointed" : "plain");
        load(e);
        rc = e->ops->step(e, &b, 1e-3, 1, res);
        fsdp_shard_engine_stats(e, st);
        *opt_steps = p->opt.step;
    }
    if (rc < 0) {
        tap_diag("step: %s", fsdp_err_msg());
    }
    if (e) {
        e->ops->destroy(e);
    }
    fsdp_train_parts_destroy(p); /* after the engine, which only borrowed them */
    fsdp_device_destroy(dev);
    fsdp_model_spec_destroy(s);
    return rc;
}

static void test_steps(void)
{
    struct fsdp_step_result r0, r1;
    struct fsdp_engine_stats s0, s1;
    long n0 = -1, n1 = -1;
    int rc0 = one_step(0, &r0, &s0, &n0), rc1 = one_step(1, &r1, &s1, &n1);
    tap_ok(rc0 == 0 && n0 == 1 && isfinite(r0.loss),
           "a step moves the parts' own optimizer (step count %ld, loss %g)", n0, r0.loss);
    tap_ok(rc1 == 0 && s1.act_saved_bytes < s0.act_saved_bytes,
           "activation checkpointing applied to the parts' model: saved activations %zu < %zu "
           "bytes",
           s1.act_saved_bytes, s0.act_saved_bytes);
    tap_ok(rc0 == 0 && rc1 == 0 && r0.loss == r1.loss && r0.grad_norm == r1.grad_norm,
           "with checkpointing the step's loss and gradient norm are the same bits (%.9g %.9g, "
           "%.9g %.9g)",
           r0.loss, r1.loss, r0.grad_norm, r1.grad_norm);
}

/* Engine creation from parts p with its model or optimizer swapped for q's. */
static int swapped(struct fsdp_train_parts *p, struct fsdp_train_parts *q, int which,
                   struct fsdp_device *dev, const struct fsdp_shard_config *sc)
{
    struct fsdp_shard_parts sp = p->shard;
    struct fsdp_engine *e = NULL;
    if (which == 0) {
        sp.model = q->model;
    } else {
        sp.opt = &q->opt;
    }
    fsdp_err_clear();
    int rc = fsdp_shard_engine_create(&sp, &one, dev, sc, &e);
    if (e) {
        e->ops->destroy(e);
    }
    return rc;
}

static void test_refusals(void)
{
    struct fsdp_model_spec *tied = spec_of(1), *untied = spec_of(0);
    struct fsdp_device *dev = NULL;
    struct fsdp_optim_config oc;
    struct fsdp_shard_config sc;
    struct fsdp_train_parts *p = NULL, *q = NULL;
    configs(&oc, &sc, 0);
    int rc = fsdp_device_create("cpu", 0, &dev);
    rc = rc ? rc : fsdp_train_parts_create(tied, NULL, dev, &oc, &sc, &p);
    rc = rc ? rc : fsdp_train_parts_create(untied, NULL, dev, &oc, &sc, &q);
    tap_ok(rc == 0, "parts for a tied and an untied model");
    rc = p && q ? swapped(p, q, 0, dev, &sc) : -1;
    tap_ok(rc == FSDP_ERR_INTERNAL && strstr(fsdp_err_msg(), "the model was made for another"),
           "a model of another table is refused: %s", fsdp_err_msg());
    rc = p && q ? swapped(p, q, 1, dev, &sc) : -1;
    tap_ok(rc == FSDP_ERR_INTERNAL && strstr(fsdp_err_msg(), "the optimizer was made for another"),
           "an optimizer of another table is refused: %s", fsdp_err_msg());
    fsdp_train_parts_destroy(q);
    fsdp_train_parts_destroy(p);
    /* sequence parallelism over a tp shape of 2 cannot split 5 positions */
    struct fsdp_group tp = {.name = "tp", .size = 2, .rank = 0};
    sc.sequence_parallel = 1;
    sc.T = 5;
    fsdp_err_clear();
    p = NULL;
    rc = fsdp_train_parts_create(tied, &tp, dev, &oc, &sc, &p);
    tap_ok(rc == FSDP_ERR_INVALID && !p &&
               strstr(fsdp_err_msg(), "seq-len 5 is not divisible by tp 2"),
           "a seq-len sequence parallelism cannot split is refused: %s", fsdp_err_msg());
    fsdp_device_destroy(dev);
    fsdp_model_spec_destroy(untied);
    fsdp_model_spec_destroy(tied);
}

static void test_tp_shape(void)
{
    struct fsdp_model_spec *s = spec_of(1);
    struct fsdp_device *dev = NULL;
    struct fsdp_optim_config oc;
    struct fsdp_shard_config sc;
    struct fsdp_train_parts *p = NULL;
    struct fsdp_group tp = {.name = "tp", .size = 2, .rank = 1};
    struct fsdp_engine_stats st;
    configs(&oc, &sc, 0);
    int rc = fsdp_device_create("cpu", 0, &dev);
    rc = rc ? rc : fsdp_train_parts_create(s, &tp, dev, &oc, &sc, &p);
    tap_ok(rc == 0 && p->plan && p->plan->rank == 1 && p->model->spec == p->plan->local &&
               p->opt.spec == p->plan->local && p->tp.size == 2 && p->tp.rank == 1 &&
               p->shard.tp == &p->tp && fsdp_shard_parts_table(&p->shard) == p->plan->local,
           "tp rank 1 of 2: the model and the optimizer are on the plan's tp-local table");
    struct fsdp_shard_shape sh = {.dp = 2, .rdp = 1, .tp = 2, .dp_rank = 1, .tp_rank = 1};
    rc = p ? fsdp_shard_engine_plan(&p->shard, &sh, dev, &sc, &st) : -1;
    tap_ok(rc == 0 && st.peak_bytes > 0, "the sizing plan of parts of tp rank 1 (%zu bytes)",
           rc == 0 ? st.peak_bytes : 0);
    sh.tp_rank = 0;
    fsdp_err_clear();
    rc = p ? fsdp_shard_engine_plan(&p->shard, &sh, dev, &sc, &st) : -1;
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "for parts of tp rank 1 of 2"),
           "a shape of another tp rank than the parts' is refused: %s", fsdp_err_msg());
    fsdp_train_parts_destroy(p);
    fsdp_device_destroy(dev);
    fsdp_model_spec_destroy(s);
}

int main(void)
{
    if (fsdp_model_registry_init() < 0) {
        tap_diag("registry: %s", fsdp_err_msg());
        return 1;
    }
    test_steps();
    test_refusals();
    test_tp_shape();
    return tap_done();
}
