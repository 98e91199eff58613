/*
 * oracle_ours.c - fsdpc's trainer on the single-rank oracle engine
 * (oracle_engine.h), for the tests that compare against it.
 *
 *   oracle_ours --run <fsdpc-train options>
 *       the whole run, as fsdpc-train on one rank (metrics, --out, ...),
 *       with the oracle engine; with options only the sharding engine
 *       implements (a mesh, 16-bit dtypes, loss scaling, sharding modes,
 *       no-sync accumulation, activation checkpointing) the sharding
 *       engine on one rank instead, as the single-rank references of the
 *       equivalence tests need
 *   oracle_ours --dump FILE.h5 <fsdpc-train options>
 *       fsdpc's side of the PyTorch comparison (test_torch_oracle.sh)
 *
 * --dump runs the trainer itself (same option parser, same loop) for
 * --steps steps and writes what torch_oracle.py's "reference" writes:
 *   logits (B, T, V)      the first micro-batch, before any update
 *   loss ()               its mean cross-entropy
 *   grads/<name>          the first step's averaged gradient, before clipping
 *   losses (steps,)       per-step loss
 *   grad_norms (steps,)   per-step global norm before clipping
 *   params/<name>         every parameter after the last step
 *   exp_avg/<name>        AdamW's first moment after the last step
 *   exp_avg_sq/<name>     and its second moment
 */
#include "config.h"
#include "train/trainer.h"
#include "tests/train/oracle_engine.h"
#include "parallel/fsdp.h"
#include "core/error.h"
#include "core/log.h"
#include "io/text/tokens.h"
#include "model/model.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int put(hid_t loc, const char *name, hid_t type, int ndim, const hsize_t *dims,
               const void *data)
{
    hid_t space = ndim ? H5Screate_simple(ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t ds = H5Dcreate2(loc, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    herr_t st = ds < 0 ? -1 : H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
    if (ds >= 0) {
        H5Dclose(ds);
    }
    H5Sclose(space);
    return st < 0 ? fsdp_err(FSDP_ERR_IO, "writing %s failed", name) : 0;
}

/* Logits and loss of the first micro-batch, before the first step. */
static int dump_first_batch(struct fsdp_trainer *t, hid_t f)
{
    const struct fsdp_train_config *c = t->cfg;
    struct fsdp_dataloader *dl;
    struct fsdp_model *m = fsdp_oracle_engine_model(t->engine);
    int B = (int)c->batch_size, T = (int)c->seq_len, V = t->engine->spec->vocab_size;
    hsize_t dims[3] = {(hsize_t)B, (hsize_t)T, (hsize_t)V};
    float loss;
    FSDP_CHECK(fsdp_dataloader_create(c->data, (size_t)B, (size_t)T, 0, 1, V, &dl));
    int rc = fsdp_dataloader_next(dl);
    if (rc == 0) {
        rc = fsdp_model_forward(m, dl->inputs, NULL, B, T, NULL);
    }
    float *logits = rc == 0 ? malloc((size_t)B * T * V * sizeof(float)) : NULL;
    if (rc == 0) {
        rc = logits ? m->ops->logits(m, 0, (size_t)B * T, logits)
                    : fsdp_err(FSDP_ERR_NOMEM, "logits (%d, %d, %d)", B, T, V);
    }
    if (rc == 0) {
        rc = put(f, "logits", H5T_NATIVE_FLOAT, 3, dims, logits);
    }
    free(logits);
    if (rc == 0) {
        rc = fsdp_model_forward(m, dl->inputs, dl->targets, B, T, &loss);
    }
    if (rc == 0) {
        double l = loss;
        rc = put(f, "loss", H5T_NATIVE_DOUBLE, 0, NULL, &l);
    }
    fsdp_dataloader_destroy(dl);
    return rc;
}

enum dump_what { DUMP_GRADS, DUMP_PARAMS, DUMP_EXP_AVG, DUMP_EXP_AVG_SQ };

/* One group of full tensors, by parameter name, from the local engine. */
static int dump_tensors(struct fsdp_trainer *t, hid_t f, const char *group, enum dump_what what)
{
    const struct fsdp_model_spec *s = t->engine->spec;
    hid_t g = H5Gcreate2(f, group, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int rc = g < 0 ? fsdp_err(FSDP_ERR_IO, "cannot create group %s", group) : 0;
    for (size_t i = 0; i < s->n_params && rc == 0; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        hsize_t dims[2] = {p->shape[0], p->shape[1]};
        const float *m, *v, *src;
        fsdp_oracle_engine_moments(t->engine, p->unit, &m, &v);
        switch (what) {
        case DUMP_GRADS: src = fsdp_oracle_engine_grads(t->engine, p->unit); break;
        case DUMP_PARAMS: src = fsdp_oracle_engine_params(t->engine, p->unit); break;
        case DUMP_EXP_AVG: src = m; break;
        default: src = v; break;
        }
        rc = put(g, p->name, H5T_NATIVE_FLOAT, p->ndim, dims, src + p->offset);
    }
    if (g >= 0) {
        H5Gclose(g);
    }
    return rc;
}

static int run(struct fsdp_trainer *t, const char *path)
{
    long n = t->cfg->steps;
    double *losses = calloc((size_t)n, sizeof(double)), *norms = calloc((size_t)n, sizeof(double));
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    int rc = 0;
    if (f < 0 || !losses || !norms) {
        rc = fsdp_err(FSDP_ERR_IO, "cannot create %s", path);
        goto out;
    }
    FSDP_CHECK_GOTO(dump_first_batch(t, f), rc, out);
    for (long s = 0; s < n; s++) {
        struct fsdp_step_stats st;
        FSDP_CHECK_GOTO(fsdp_trainer_step(t, &st), rc, out);
        losses[s] = st.loss;
        norms[s] = st.grad_norm;
        if (s == 0) {
            FSDP_CHECK_GOTO(dump_tensors(t, f, "grads", DUMP_GRADS), rc, out);
        }
    }
    hsize_t dims[1] = {(hsize_t)n};
    FSDP_CHECK_GOTO(put(f, "losses", H5T_NATIVE_DOUBLE, 1, dims, losses), rc, out);
    FSDP_CHECK_GOTO(put(f, "grad_norms", H5T_NATIVE_DOUBLE, 1, dims, norms), rc, out);
    FSDP_CHECK_GOTO(dump_tensors(t, f, "params", DUMP_PARAMS), rc, out);
    FSDP_CHECK_GOTO(dump_tensors(t, f, "exp_avg", DUMP_EXP_AVG), rc, out);
    FSDP_CHECK_GOTO(dump_tensors(t, f, "exp_avg_sq", DUMP_EXP_AVG_SQ), rc, out);
out:
    if (f >= 0) {
        H5Fclose(f);
    }
    free(losses);
    free(norms);
    return rc;
}

static int oracle_factory(struct fsdp_trainer *t, struct fsdp_engine **out)
{
    const struct fsdp_train_config *c = t->cfg;
    if (fsdp_train_config_wants_fsdp(c)) {
        return fsdp_trainer_shard_engine(t, out);
    }
    struct fsdp_optim_config oc;
    fsdp_train_config_optim(c, &oc);
    return fsdp_oracle_engine_create(t->spec, (int)c->batch_size, (int)c->seq_len,
                                     (int)c->lm_head_chunk, &oc, out);
}

int main(int argc, char **argv)
{
    struct fsdp_train_config cfg;
    struct fsdp_optset set;
    struct fsdp_trainer *t;
    int dump = argc >= 3 && strcmp(argv[1], "--dump") == 0;
    if (argc < 2 || (!dump && strcmp(argv[1], "--run") != 0)) {
        fprintf(stderr, "usage: oracle_ours --run|--dump FILE.h5 <fsdpc-train options>\n");
        return 2;
    }
    const char *path = dump ? argv[2] : NULL;
    fsdp_log_set_rank(0);
    int skip = dump ? 2 : 1;
    argv[skip] = argv[0];
    fsdp_train_config_init(&cfg, &set);
    int rc = fsdp_train_config_parse(&cfg, &set, argc - skip, argv + skip);
    if (rc != 0) {
        fsdp_die(rc < 0 ? rc : FSDP_ERR_INVALID, "oracle_ours: options", NULL);
    }
    if ((rc = fsdp_trainer_create(&cfg, NULL, oracle_factory, &t)) < 0) {
        fsdp_die(rc, "oracle_ours", NULL);
    }
    if (dump && fsdp_shard_engine_is(t->engine)) {
        fsdp_die(FSDP_ERR_INVALID, "oracle_ours --dump", "options that need the sharding engine");
    }
    if (!dump) {
        fsdp_trainer_print_header(t, stdout);
    }
    rc = dump ? run(t, path) : fsdp_trainer_run(t);
    if (rc < 0) {
        fsdp_die(rc, "oracle_ours", NULL);
    }
    fsdp_trainer_destroy(t);
    return 0;
}
