/*
 * join_ref.c - the single-rank reference for join over uneven inputs
 * (test_join.sh).
 *
 *   join_ref gen PATH NTOKENS SEED BT
 *       writes a token file of NTOKENS tokens in [2, 256), with token 1 at
 *       every index that is a multiple of BT (see below)
 *   join_ref check WORLD METRICS MODEL -- <fsdpc-train options>
 *       replays the run those options describe on WORLD ranks with the
 *       single-rank engine and compares its per-step losses with METRICS
 *       (the run's JSONL) and its final weights with MODEL (the run's --out)
 *   join_ref same-model A.h5 B.h5
 *       compares two model files' weights the same way
 *
 * The reference is independent of the code under test where it matters:
 * which ranks have a batch at a step is worked out here from the file sizes,
 * and the global batch of step s is rebuilt as one token stream holding,
 * for every contributing rank in rank order, its K micro-batches. The
 * single-rank engine then runs that step with K x (contributing ranks)
 * micro-batches of the same B x T, which is the mean over exactly the
 * batches that existed: the contributing-rank average join promises. A
 * loader reads B*T + 1 tokens per micro-batch and moves on by B*T, so
 * consecutive micro-batches share one token; the fixtures hold token 1 at
 * every multiple of B*T, which makes any sequence of blocks a valid stream.
 *
 * Tolerance 1e-5, relative: the reduce-scatter adds the ranks' gradients in
 * another order than the single-rank backward accumulates them, which
 * changes the last bit of single-precision sums (~1e-7 relative per step);
 * over a few dozen AdamW steps that stays below 1e-6 for losses and the
 * whole-model weights. Weights are compared as whole-model norms (relative
 * L2 and max |difference| / max |w|), as tests/fsdp/compare_models.py does:
 * AdamW turns rounding noise in analytically zero gradients (the key bias)
 * into full-size steps, so per-element ratios would be meaningless there.
 */
#include "config.h"
#include "train/train_config.h"
#include "tests/train/oracle_engine.h"
#include "train/schedule.h"
#include "train/uneven.h"
#include "core/error.h"
#include "io/h5/model_file.h"
#include "io/text/tokens.h"
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL 1e-5     /* losses and the whole model's relative L2 difference */
#define TOL_MAX 1e-4 /* the largest element difference over max |w| */
#define MAX_WORLD 8
#define MAX_STEPS 4096

static int gen(const char *path, size_t n, unsigned seed, size_t bt)
{
    uint32_t *v = malloc(n * sizeof(*v));
    uint32_t x = seed * 2654435761u + 12345u;
    if (!v) {
        return fsdp_err(FSDP_ERR_NOMEM, "tokens");
    }
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        /* a little structure (runs of a few symbols) so that the loss can fall */
        v[i] = i % bt == 0 ? 1 : (uint32_t)(2 + ((x >> 16) % 23) * (1 + (i / 7) % 3));
    }
    int rc = fsdp_tokens_write(path, 65536, v, n); /* a version 1 file */
    free(v);
    return rc;
}

/* The "loss" of every step record of a JSONL metrics file, by step (1-based). */
static int read_losses(const char *path, double *loss, long *n)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    *n = 0;
    if (!f) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open", path);
    }
    while (fgets(line, sizeof(line), f)) {
        long step;
        const char *l = strstr(line, "\"loss\":");
        if (sscanf(line, "{\"step\":%ld", &step) != 1 || !l || step < 1 || step > MAX_STEPS) {
            continue; /* validation records carry val_loss */
        }
        loss[step - 1] = strtod(l + 7, NULL);
        *n = step > *n ? step : *n;
    }
    fclose(f);
    return 0;
}

struct ref {
    struct fsdp_train_config c;
    int world, per_rank, K;
    size_t B, T, BT;
    struct fsdp_tokens *files[MAX_WORLD]; /* per rank, or [0] shared */
};

/* Does rank r have step j of a pass (all K micro-batches inside its data)? */
static int has_step(const struct ref *R, int r, uint64_t j)
{
    uint64_t K = (uint64_t)R->K, bt = R->BT;
    if (R->per_rank) {
        return (j + 1) * K * bt + 1 <= fsdp_tokens_count(R->files[r]);
    }
    uint64_t st = bt * (uint64_t)R->world; /* a global micro-batch */
    return (j * K + K - 1) * st + (uint64_t)(r + 1) * bt + 1 <= fsdp_tokens_count(R->files[0]);
}

/* Appends rank r's micro-batch k of pass-step j (B*T tokens) to out. */
static int take_block(const struct ref *R, int r, uint64_t j, int k, uint32_t *out)
{
    uint64_t m = j * (uint64_t)R->K + (uint64_t)k;
    if (R->per_rank) {
        return fsdp_tokens_read(R->files[r], m * R->BT, R->BT, out);
    }
    return fsdp_tokens_read(R->files[0], (m * (uint64_t)R->world + (uint64_t)r) * R->BT, R->BT,
                            out);
}

/* Reads a model file into one buffer of spec->total_numel floats, unit after unit. */
static int read_model(const char *path, const struct fsdp_model_spec *spec, float **out)
{
    float *units[64];
    float *w = malloc(spec->total_numel * sizeof(float));
    if (!w || spec->n_units > 64) {
        free(w);
        return fsdp_err(FSDP_ERR_NOMEM, "weights of %s", path);
    }
    size_t off = 0;
    for (int u = 0; u < spec->n_units; u++) {
        units[u] = w + off;
        off += spec->unit_numel[u];
    }
    int rc = fsdp_model_file_read(path, fsdp_arch_registered(), spec, units);
    if (rc < 0) {
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* Prints the whole-model differences of w (unit after unit) from ref; 1 when above tolerance. */
static int compare_weights(const struct fsdp_model_spec *spec, const float *w,
                           const float *const *ref_units)
{
    double dsq = 0, bsq = 0, dmax = 0, bmax = 0;
    const char *at_param = "";
    for (int u = 0; u < spec->n_units; u++) {
        const float *ref = ref_units[u];
        for (size_t i = 0; i < spec->unit_numel[u]; i++, w++) {
            double d = fabs((double)*w - (double)ref[i]);
            dsq += d * d;
            bsq += (double)ref[i] * ref[i];
            if (d > dmax || d != d) {
                dmax = d;
                for (size_t p = spec->unit_first[u];
                     p < spec->n_params && spec->params[p].unit == u; p++) {
                    if (i >= spec->params[p].offset) {
                        at_param = spec->params[p].name;
                    }
                }
            }
            bmax = fmax(bmax, fabs((double)ref[i]));
        }
    }
    double l2 = sqrt(dsq / bsq), mx = dmax / bmax;
    printf("weights: relative L2 difference %.3g (tolerance %g), largest difference %.3g of "
           "max |w| in %s (tolerance %g)\n", l2, TOL, mx, at_param, TOL_MAX);
    return !(l2 <= TOL) || !(mx <= TOL_MAX);
}

/* Two model files of the same architecture, compared as above. */
static int same_model(const char *a, const char *b)
{
    struct fsdp_model_spec *spec = NULL;
    float *wa = NULL, *wb = NULL;
    const float *ref_units[64];
    int rc;
    FSDP_CHECK(fsdp_model_file_read_spec(a, fsdp_arch_registered(), &spec));
    FSDP_CHECK_GOTO(read_model(a, spec, &wa), rc, out);
    FSDP_CHECK_GOTO(read_model(b, spec, &wb), rc, out);
    size_t off = 0;
    for (int u = 0; u < spec->n_units; u++) {
        ref_units[u] = wb + off;
        off += spec->unit_numel[u];
    }
    rc = compare_weights(spec, wa, ref_units);
out:
    free(wa);
    free(wb);
    fsdp_model_spec_destroy(spec);
    return rc;
}

/* The model file's parameters into the engine's pieces of kind 0. */
static int load_params(struct fsdp_engine *e, const char *path)
{
    struct fsdp_model_file *mf;
    int rc = 0;
    FSDP_CHECK(fsdp_model_file_open(path, fsdp_arch_registered(), &mf));
    for (size_t k = 0; k < e->ops->n_pieces(e) && rc == 0; k++) {
        struct fsdp_state_piece pc;
        e->ops->piece(e, k, &pc);
        if (pc.kind == 0) {
            rc = fsdp_model_file_read_rows(mf, e->spec->params[pc.param].name, pc.row0, pc.rows,
                                           pc.data);
        }
    }
    fsdp_model_file_close(mf);
    return rc;
}

static int check(int world, const char *metrics, const char *model, int argc, char **argv)
{
    static struct ref R;
    static double want[MAX_STEPS], got[MAX_STEPS];
    static int contrib[MAX_STEPS];
    struct fsdp_optset set;
    struct fsdp_engine *e = NULL;
    struct fsdp_model_spec *spec = NULL;
    int32_t *in = NULL, *tgt = NULL;
    uint32_t *stream = NULL;
    int rc;
    fsdp_train_config_init(&R.c, &set);
    FSDP_CHECK(fsdp_train_config_parse(&R.c, &set, argc, argv));
    R.world = world;
    R.K = (int)R.c.grad_accum;
    R.B = (size_t)R.c.batch_size;
    R.T = (size_t)R.c.seq_len;
    R.BT = R.B * R.T;
    for (int r = 0; r < world; r++) {
        char path[FSDP_TRAIN_PATH_MAX];
        FSDP_CHECK(fsdp_uneven_path(R.c.data, r, path, sizeof(path), &R.per_rank));
        FSDP_CHECK(fsdp_tokens_open(path, &R.files[r]));
    }
    /* the plan: steps per pass, then who contributes at each step */
    uint64_t pass = 0, lo = UINT64_MAX;
    for (int r = 0; r < world; r++) {
        uint64_t n = 0;
        while (has_step(&R, r, n)) {
            n++;
        }
        pass = n > pass ? n : pass;
        lo = n < lo ? n : lo;
    }
    if (R.c.uneven == FSDP_UNEVEN_STOP) {
        pass = lo;
    }
    long steps = (long)pass * R.c.epochs;
    if (R.c.steps > 0 && R.c.steps < steps) {
        steps = R.c.steps;
    }
    if (steps > MAX_STEPS) {
        return fsdp_err(FSDP_ERR_INVALID, "%ld steps", steps);
    }
    size_t blocks = 0;
    for (long s = 0; s < steps; s++) {
        for (int r = 0; r < world; r++) {
            contrib[s] += has_step(&R, r, (uint64_t)s % pass);
        }
        blocks += (size_t)contrib[s] * (size_t)R.K;
    }
    /* the reference stream: every step's contributing blocks, then one boundary token */
    stream = malloc((blocks * R.BT + 1) * sizeof(*stream));
    if (!stream) {
        return fsdp_err(FSDP_ERR_NOMEM, "stream");
    }
    size_t at = 0;
    for (long s = 0; s < steps; s++) {
        for (int r = 0; r < world; r++) {
            for (int k = 0; k < R.K && has_step(&R, r, (uint64_t)s % pass); k++) {
                FSDP_CHECK_GOTO(take_block(&R, r, (uint64_t)s % pass, k, stream + at), rc, out);
                at += R.BT;
            }
        }
    }
    stream[at] = 1;
    char ref_path[FSDP_TRAIN_PATH_MAX + 16];
    snprintf(ref_path, sizeof(ref_path), "%s.ref.bin", model);
    FSDP_CHECK_GOTO(fsdp_tokens_write(ref_path, 65536, stream, at + 1), rc, out);

    struct fsdp_optim_config oc = {(float)R.c.beta1, (float)R.c.beta2, (float)R.c.eps,
                                   (float)R.c.weight_decay, (float)R.c.clip};
    struct fsdp_dataloader *dl = NULL;
    struct fsdp_lr_schedule sched;
    fsdp_lr_schedule_init(&sched, &R.c);
    sched.steps = steps;
    FSDP_CHECK_GOTO(fsdp_model_file_read_spec(R.c.model, fsdp_arch_registered(), &spec), rc, out);
    FSDP_CHECK_GOTO(fsdp_oracle_engine_create(spec, (int)R.B, (int)R.T, 0, &oc, &e), rc, out);
    FSDP_CHECK_GOTO(load_params(e, R.c.model), rc, out);
    FSDP_CHECK_GOTO(fsdp_dataloader_create(ref_path, R.B, R.T, 0, 1, 0, &dl), rc, out);
    in = malloc((size_t)R.K * (size_t)world * R.BT * sizeof(int32_t));
    tgt = malloc((size_t)R.K * (size_t)world * R.BT * sizeof(int32_t));
    if (!in || !tgt) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "batch");
    }
    for (long s = 0; s < steps && rc == 0; s++) {
        struct fsdp_step_result res;
        struct fsdp_batch b = {.K = R.K * contrib[s], .B = (int)R.B, .T = (int)R.T,
                               .inputs = in, .targets = tgt};
        for (int k = 0; k < b.K && rc == 0; k++) {
            rc = fsdp_dataloader_next(dl);
            memcpy(in + k * R.BT, dl->inputs, R.BT * sizeof(int32_t));
            memcpy(tgt + k * R.BT, dl->targets, R.BT * sizeof(int32_t));
        }
        if (rc == 0) {
            rc = e->ops->step(e, &b, fsdp_lr_at(&sched, s), 1, &res);
        }
        want[s] = res.loss;
    }
    fsdp_dataloader_destroy(dl);
    FSDP_CHECK_GOTO(rc, rc, out);

    /* losses */
    long n;
    FSDP_CHECK_GOTO(read_losses(metrics, got, &n), rc, out);
    double worst = 0.0;
    long where = 0;
    for (long s = 0; s < steps; s++) {
        double rel = fabs(got[s] - want[s]) / fmax(fabs(want[s]), 1e-30);
        if (!(rel <= worst)) {
            worst = rel;
            where = s + 1;
        }
    }
    printf("steps: run %ld, reference %ld (contributing ranks per step:", n, steps);
    for (long s = 0; s < steps; s++) {
        printf(" %d", contrib[s]);
    }
    printf(")\nlosses: worst relative difference %.3g at step %ld (run %.9g, reference %.9g)\n",
           worst, where, where ? got[where - 1] : 0.0, where ? want[where - 1] : 0.0);
    int bad = n != steps || !(worst <= TOL);

    /* final weights, whole-model norms */
    float *w = NULL;
    FSDP_CHECK_GOTO(read_model(model, e->spec, &w), rc, out);
    const float *ref_units[64];
    for (int u = 0; u < e->spec->n_units; u++) {
        ref_units[u] = fsdp_oracle_engine_params(e, u);
    }
    bad |= compare_weights(e->spec, w, ref_units);
    free(w);
    rc = bad ? 1 : 0;
out:
    free(stream);
    free(in);
    free(tgt);
    if (e) {
        e->ops->destroy(e);
    }
    fsdp_model_spec_destroy(spec);
    for (int r = 0; r < world; r++) {
        fsdp_tokens_close(R.files[r]);
    }
    return rc;
}

int main(int argc, char **argv)
{
    fsdp_model_registry_init();
    int rc;
    if (argc == 6 && strcmp(argv[1], "gen") == 0) {
        rc = gen(argv[2], (size_t)atol(argv[3]), (unsigned)atoi(argv[4]), (size_t)atol(argv[5]));
    } else if (argc == 4 && strcmp(argv[1], "same-model") == 0) {
        rc = same_model(argv[2], argv[3]);
    } else if (argc > 5 && strcmp(argv[1], "check") == 0 && strcmp(argv[5], "--") == 0 &&
               atoi(argv[2]) >= 1 && atoi(argv[2]) <= MAX_WORLD) {
        argv[4 + 1] = argv[0]; /* the option parser starts at argv[1] */
        rc = check(atoi(argv[2]), argv[3], argv[4], argc - 5, argv + 5);
    } else {
        fprintf(stderr, "usage: join_ref gen PATH NTOKENS SEED BT\n"
                        "       join_ref check WORLD METRICS MODEL -- <fsdpc-train options>\n"
                        "       join_ref same-model A.h5 B.h5\n");
        return 2;
    }
    if (rc < 0) {
        char msg[1024];
        fsdp_err_take(msg, sizeof(msg));
        fprintf(stderr, "join_ref: %s\n", msg);
        return 1;
    }
    return rc;
}
