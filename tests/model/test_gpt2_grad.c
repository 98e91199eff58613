/*
 * test_gpt2_grad.c - the whole GPT-2 model on a tiny config (V=32, T=8, L=2,
 * NH=2, C=16), tied and untied:
 *   - loss against an independent double-precision reference model built
 *     from the parameter names (HF GPT-2 semantics), full and smaller batch;
 *   - the loss gradient against central differences of that reference for
 *     a sample of elements of every parameter tensor;
 *   - activation checkpointing (all, some, none) bit-identical;
 *   - the LM head in tiles (budgets of 1 .. BT rows of logits: vocabulary
 *     slices, then row chunks too, chunks with every target ignored)
 *     against one tile, and its logits;
 *   - unit 0 by rows on one rank (no group): bit-identical to the whole
 *     tables, and the errors of that mode;
 *   - gradient accumulation, the loss seed (divisor) and the ordering and
 *     input errors of the unit API;
 *   - deterministic init independent of how it is split (shards of any
 *     world size), and the per-parameter weight decay of adamw_range.
 */
#include "config.h"
#include "model/gpt2.h"
#include "optim/optim.h"
#include "core/error.h"
#include "tests/kernels/ref_kernels.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TB 2
#define TT 8

static uint64_t rng = 0x243F6A8885A308D3ULL;

struct bufs {
    int n;
    float **p, **g;  /* (n,) unit params and grads */
    double **pd;     /* (n,) double copies of params for the reference */
};

static void bufs_alloc(struct bufs *b, const struct fsdp_model_spec *s)
{
    b->n = s->n_units;
    b->p = calloc((size_t)b->n, sizeof(float *));
    b->g = calloc((size_t)b->n, sizeof(float *));
    b->pd = calloc((size_t)b->n, sizeof(double *));
    for (int u = 0; u < b->n; u++) {
        b->p[u] = calloc(s->unit_numel[u], sizeof(float));
        b->g[u] = calloc(s->unit_numel[u], sizeof(float));
        b->pd[u] = calloc(s->unit_numel[u], sizeof(double));
    }
}

static void bufs_free(struct bufs *b)
{
    for (int u = 0; u < b->n; u++) free(b->p[u]), free(b->g[u]), free(b->pd[u]);
    free(b->p), free(b->g), free(b->pd);
}

// ----------------------------------------------------------------------------
// double-precision reference model, addressed by parameter name

static double *P(const struct fsdp_model_spec *s, double *const *units, const char *name)
{
    long i = fsdp_model_spec_find(s, name);
    if (i < 0) {
        fprintf(stderr, "reference: no parameter %s\n", name);
        abort();
    }
    return units[s->params[i].unit] + s->params[i].offset;
}

static double ref_gpt2_loss(const struct fsdp_model_spec *s, double *const *u, const int32_t *tok,
                            const int32_t *tgt, int B, int T, int32_t ignore)
{
    const struct fsdp_gpt2_config *c = fsdp_gpt2_cfg(s);
    size_t BT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    double *x = malloc(BT * C * sizeof(double)), *ln = malloc(BT * C * sizeof(double));
    double *qkv = malloc(BT * 3 * C * sizeof(double)), *y = malloc(BT * C * sizeof(double));
    double *fc = malloc(BT * 4 * C * sizeof(double)), *gl = malloc(BT * 4 * C * sizeof(double));
    double *proj = malloc(BT * C * sizeof(double)), *logits = malloc(BT * V * sizeof(double));
    char n1[64], n2[64];
    ref_encoder(x, tok, P(s, u, "wte.weight"), P(s, u, "wpe.weight"), B, T, (int)C);
    for (int l = 0; l < c->n_layer; l++) {
#define W(suffix) (snprintf(n1, sizeof(n1), "h.%d.%s.weight", l, suffix), P(s, u, n1))
#define Bi(suffix) (snprintf(n2, sizeof(n2), "h.%d.%s.bias", l, suffix), P(s, u, n2))
        ref_layernorm(ln, x, W("ln_1"), Bi("ln_1"), BT, C, c->ln_eps);
        ref_matmul(qkv, ln, W("attn.c_attn"), Bi("attn.c_attn"), BT, C, 3 * C);
        ref_attention(y, qkv, B, T, (int)C, c->n_head);
        ref_matmul(proj, y, W("attn.c_proj"), Bi("attn.c_proj"), BT, C, C);
        for (size_t i = 0; i < BT * C; i++) x[i] += proj[i];
        ref_layernorm(ln, x, W("ln_2"), Bi("ln_2"), BT, C, c->ln_eps);
        ref_matmul(fc, ln, W("mlp.c_fc"), Bi("mlp.c_fc"), BT, C, 4 * C);
        ref_gelu(gl, fc, BT * 4 * C);
        ref_matmul(proj, gl, W("mlp.c_proj"), Bi("mlp.c_proj"), BT, 4 * C, C);
        for (size_t i = 0; i < BT * C; i++) x[i] += proj[i];
#undef W
#undef Bi
    }
    ref_layernorm(ln, x, P(s, u, "ln_f.weight"), P(s, u, "ln_f.bias"), BT, C, c->ln_eps);
    ref_matmul(logits, ln, P(s, u, c->tied ? "wte.weight" : "lm_head.weight"), NULL, BT, C, V);
    double loss = ref_crossentropy(logits, tgt, BT, V, ignore);
    free(x), free(ln), free(qkv), free(y), free(fc), free(gl), free(proj), free(logits);
    return loss;
}

// ----------------------------------------------------------------------------

static struct fsdp_model_spec *make_spec(int tied)
{
    struct fsdp_gpt2_config cfg = {.vocab_size = 32, .context = TT, .n_layer = 2, .n_head = 2,
                                   .n_embd = 16, .ln_eps = 1e-5f, .tied = tied};
    struct fsdp_model_spec *s = NULL;
    if (fsdp_gpt2_spec_create(&cfg, &s) < 0) {
        fprintf(stderr, "spec: %s\n", fsdp_err_msg());
        abort();
    }
    return s;
}

/* init, then perturb every element so biases and norms are not trivial */
static void fill_params(const struct fsdp_model_spec *s, struct bufs *b)
{
    fsdp_model_init_params(s, 1234, b->p);
    for (int u = 0; u < b->n; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            b->p[u][i] += (float)(0.1 * ref_rand(&rng));
            b->pd[u][i] = b->p[u][i];
        }
    }
}

static int run_step(struct fsdp_gpt2 *m, struct bufs *b, const int32_t *tok, const int32_t *tgt,
                    int B, int T, float *loss)
{
    for (int u = 0; u < b->n; u++)
        fsdp_gpt2_set_unit(m, u, b->p[u], FSDP_F32, b->g[u]);
    FSDP_CHECK(fsdp_gpt2_zero_grad(m, -1));
    FSDP_CHECK(fsdp_gpt2_forward(m, tok, tgt, B, T, loss));
    return fsdp_gpt2_backward(m);
}

/* copies of all grads, for bit comparisons */
static float **snap(const struct fsdp_model_spec *s, struct bufs *b)
{
    float **c = calloc((size_t)b->n, sizeof(float *));
    for (int u = 0; u < b->n; u++) {
        c[u] = malloc(s->unit_numel[u] * sizeof(float));
        memcpy(c[u], b->g[u], s->unit_numel[u] * sizeof(float));
    }
    return c;
}

static size_t diff_bits(const struct fsdp_model_spec *s, float **a, float **b, float mul)
{
    size_t bad = 0;
    for (int u = 0; u < s->n_units; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            float want = a[u][i] * mul;
            bad += memcmp(&want, &b[u][i], sizeof(float)) != 0;
        }
    }
    return bad;
}

static void free_snap(const struct fsdp_model_spec *s, float **c)
{
    for (int u = 0; u < s->n_units; u++) free(c[u]);
    free(c);
}

static void test_model(int tied)
{
    struct fsdp_model_spec *s = make_spec(tied);
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b);
    int32_t tok[TB * TT], tgt[TB * TT];
    for (int i = 0; i < TB * TT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 16.0) % 32;
        tgt[i] = i % 5 == 3 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 16.0) % 32;
    }
    struct fsdp_gpt2 *m = NULL;
    int rc = fsdp_gpt2_create(s, TB, TT, &m);
    /* the head in tiles of 5 rows of logits: 10 rows x 16 columns */
    rc = rc ? rc : fsdp_gpt2_set_head_chunk(m, 5);
    tap_ok(rc == 0, "%s: create (B=%d T=%d), head tiles of 5 rows of logits",
           tied ? "tied" : "untied", TB, TT);
    float loss = 0;
    rc = run_step(m, &b, tok, tgt, TB, TT, &loss);
    double want = ref_gpt2_loss(s, b.pd, tok, tgt, TB, TT, -1);
    tap_ok(rc == 0 && fabs(loss - want) <= 2e-6 * fabs(want),
           "%s: loss %.8f vs double reference %.8f (rc %d, %zu kept tokens)", tied ? "tied" : "untied",
           (double)loss, want, rc, m->n_kept);

    /* finite differences of the reference, a sample of every tensor */
    double worst_norm = 0;
    for (size_t pi = 0; pi < s->n_params; pi++) {
        const struct fsdp_param_spec *p = &s->params[pi];
        size_t idx[8] = {0, p->numel - 1};
        for (int k = 2; k < 8; k++) idx[k] = (size_t)((ref_rand(&rng) + 1.0) * 0.5 * (double)p->numel) % p->numel;
        double fd[8], scale = 0, max_abs = 0, max_rel = 0;
        float got[8];
        size_t worst = 0;
        for (int k = 0; k < 8; k++) {
            double *x = b.pd[p->unit] + p->offset + idx[k];
            double save = *x, h = 1e-5;
            *x = save + h;
            double lp = ref_gpt2_loss(s, b.pd, tok, tgt, TB, TT, -1);
            *x = save - h;
            double lm = ref_gpt2_loss(s, b.pd, tok, tgt, TB, TT, -1);
            *x = save;
            fd[k] = (lp - lm) / (2 * h);
            got[k] = b.g[p->unit][p->offset + idx[k]];
            scale = fabs(fd[k]) > scale ? fabs(fd[k]) : scale;
        }
        for (int k = 0; k < 8; k++) {
            double e = fabs((double)got[k] - fd[k]);
            if (e > max_abs || isnan(e)) max_abs = isnan(e) ? INFINITY : e, worst = idx[k];
            if (fabs(fd[k]) > 1e-3 * scale && e / fabs(fd[k]) > max_rel) max_rel = e / fabs(fd[k]);
        }
        double norm = max_abs / (scale + 1e-7);
        worst_norm = norm > worst_norm ? norm : worst_norm;
        tap_ok(max_abs <= 1e-3 * scale + 1e-7,
               "%s: d loss/d %s: max abs err %.3g (max |grad| %.3g), max rel err %.3g, worst element %zu",
               tied ? "tied" : "untied", p->name, max_abs, scale, max_rel, worst);
    }
    tap_diag("%s: worst gradient error relative to its tensor's max |grad|: %.3g",
             tied ? "tied" : "untied", worst_norm);

    /* checkpointing: all blocks, then only block 1, must give the same bits */
    float **g0 = snap(s, &b);
    size_t full_bytes = fsdp_gpt2_activation_bytes(&m->lm.base);
    for (int mode = 0; mode < 2; mode++) {
        fsdp_gpt2_set_checkpoint(m, -1, 0);
        fsdp_gpt2_set_checkpoint(m, mode == 0 ? -1 : 1, 1);
        size_t bytes = fsdp_gpt2_activation_bytes(&m->lm.base);
        float l2 = 0;
        rc = run_step(m, &b, tok, tgt, TB, TT, &l2);
        size_t bad = diff_bits(s, g0, b.g, 1.0f);
        /* with L = 2 one checkpointed block costs the shared set: no saving there */
        int smaller = mode == 0 ? bytes < full_bytes : bytes <= full_bytes;
        tap_ok(rc == 0 && bad == 0 && memcmp(&l2, &loss, sizeof(float)) == 0 && smaller,
               "%s: checkpointing %s: gradients and loss bit-identical (%zu differ), activations "
               "%zu -> %zu bytes",
               tied ? "tied" : "untied", mode == 0 ? "every block" : "block 1", bad, full_bytes, bytes);
    }
    fsdp_gpt2_set_checkpoint(m, -1, 0);

    /* accumulation: a second backward without zeroing doubles the gradients
     * (to rounding: per-row accumulations add in another order) */
    run_step(m, &b, tok, tgt, TB, TT, &loss);
    rc = fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
    rc = rc ? rc : fsdp_gpt2_backward(m);
    double acc_err = 0;
    for (int u = 0; u < s->n_units; u++) {
        double gmax = 0;
        for (size_t i = 0; i < s->unit_numel[u]; i++) gmax = fmax(gmax, fabs(2.0 * g0[u][i]));
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            double e = fabs((double)b.g[u][i] - 2.0 * g0[u][i]) / gmax;
            acc_err = e > acc_err || isnan(e) ? e : acc_err;
        }
    }
    tap_ok(rc == 0 && acc_err < 1e-6,
           "%s: a second backward accumulates (max err vs 2x, relative to the unit's max, %.3g)",
           tied ? "tied" : "untied", acc_err);

    /* the loss seed: divisor 2 * n_kept halves every gradient exactly */
    fsdp_gpt2_set_loss_seed(m, 2.0 * (double)m->n_kept, 1.0f);
    rc = run_step(m, &b, tok, tgt, TB, TT, &loss);
    tap_ok(rc == 0 && diff_bits(s, g0, b.g, 0.5f) == 0,
           "%s: loss seed divisor 2*n_kept halves the gradients exactly", tied ? "tied" : "untied");
    fsdp_gpt2_set_loss_seed(m, 0.0, 1.0f);

    /* a smaller batch inside the same model */
    rc = fsdp_gpt2_forward(m, tok + 3, tgt + 3, 1, 5, &loss);
    want = ref_gpt2_loss(s, b.pd, tok + 3, tgt + 3, 1, 5, -1);
    tap_ok(rc == 0 && fabs(loss - want) <= 2e-6 * fabs(want),
           "%s: smaller batch (1 x 5): loss %.8f vs reference %.8f", tied ? "tied" : "untied",
           (double)loss, want);
    free_snap(s, g0);
    fsdp_gpt2_destroy(m);
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

/*
 * The head with a budget of k rows of logits against one tile of all BT
 * rows: k x V = 32 k floats over 16 rows gives vocabulary slices of 16
 * columns (k = 1 .. 15; row chunks too below k = 16) or the whole (k = 64).
 */
static void test_head_chunks(int tied)
{
    const char *name = tied ? "tied" : "untied";
    struct fsdp_model_spec *s = make_spec(tied);
    const size_t BT = TB * TT, V = (size_t)s->vocab_size;
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b);
    int32_t tok[TB * TT], tgt[TB * TT];
    for (int i = 0; i < TB * TT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 16.0) % 32;
        /* rows 5..9 ignored: with chunks of 2 rows, some chunks have no kept row */
        tgt[i] = i >= 5 && i < 10 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 16.0) % 32;
    }
    struct fsdp_gpt2 *m = NULL;
    int rc = fsdp_gpt2_create(s, TB, TT, &m);
    rc = rc ? rc : fsdp_gpt2_set_head_chunk(m, (int)BT);
    float l0 = 0;
    rc = rc ? rc : run_step(m, &b, tok, tgt, TB, TT, &l0);
    float **g0 = snap(s, &b);
    size_t bytes0 = fsdp_gpt2_activation_bytes(&m->lm.base);
    float *all = malloc(BT * V * sizeof(float)), *part = malloc(BT * V * sizeof(float));
    rc = rc ? rc : fsdp_gpt2_logits(&m->lm.base, 0, BT, all);
    tap_ok(rc == 0, "%s: the head in one tile of %zu rows ran", name, BT);
    const int chunks[] = {1, 3, 5, 15, 64};
    for (size_t k = 0; k < sizeof(chunks) / sizeof(chunks[0]); k++) {
        float l = 0;
        rc = fsdp_gpt2_set_head_chunk(m, chunks[k]);
        rc = rc ? rc : run_step(m, &b, tok, tgt, TB, TT, &l);
        double err = 0;
        for (int u = 0; u < s->n_units; u++) {
            double gmax = 0;
            for (size_t i = 0; i < s->unit_numel[u]; i++) gmax = fmax(gmax, fabs(g0[u][i]));
            for (size_t i = 0; i < s->unit_numel[u]; i++) {
                double e = fabs((double)b.g[u][i] - g0[u][i]) / gmax;
                err = e > err || isnan(e) ? e : err;
            }
        }
        /* smaller than one tile: the head buffer shrinks to k rows' worth */
        size_t rows = (size_t)chunks[k] < BT ? (size_t)chunks[k] : BT;
        size_t want = bytes0 - (((BT * V + 15) & ~(size_t)15) - ((rows * V + 15) & ~(size_t)15)) * 4;
        size_t bytes = fsdp_gpt2_activation_bytes(&m->lm.base);
        tap_ok(rc == 0 && fabs(l - l0) <= 1e-6 * fabs(l0) && err < 1e-6 && bytes == want,
               "%s: head tiles of at most %d rows of logits: loss %.8f vs %.8f, max grad err %.3g "
               "relative to the unit's max, activations %zu bytes (want %zu)",
               name, chunks[k], (double)l, (double)l0, err, bytes, want);
    }
    /* logits of any row range, after a forward with or without targets */
    rc = fsdp_gpt2_forward(m, tok, NULL, TB, TT, NULL);
    rc = rc ? rc : fsdp_gpt2_logits(&m->lm.base, 3, 7, part);
    double lerr = 0;
    for (size_t i = 0; i < 7 * V; i++) lerr = fmax(lerr, fabs(part[i] - all[3 * V + i]));
    tap_ok(rc == 0 && lerr <= 1e-6, "%s: logits of rows [3, 10) equal the full product's (%.3g)",
           name, lerr);
    rc = fsdp_gpt2_logits(&m->lm.base, 10, 7, part);
    tap_ok(rc == FSDP_ERR_INVALID, "%s: logits past the batch rejected: %s", name, fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_gpt2_set_head_chunk(m, -1);
    tap_ok(rc == FSDP_ERR_INVALID, "%s: a head budget of -1 rows rejected: %s", name, fsdp_err_msg());
    fsdp_err_clear();
    /* 0: the default budget, which holds this whole batch (one chunk) */
    rc = fsdp_gpt2_set_head_chunk(m, 0);
    rc = rc ? rc : fsdp_gpt2_reserve(&m->lm.base);
    tap_ok(rc == 0 && m->head_chunk == (int)(FSDP_GPT2_HEAD_BYTES / (V * sizeof(float))) &&
               fsdp_gpt2_activation_bytes(&m->lm.base) == bytes0,
           "%s: head budget 0 is the default of %d rows (one tile here: %zu activation bytes, "
           "want %zu)", name, m->head_chunk, fsdp_gpt2_activation_bytes(&m->lm.base), bytes0);
    free(all), free(part);
    free_snap(s, g0);
    fsdp_gpt2_destroy(m);
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

/*
 * Unit 0 by rows with no group: one rank holds every row, packed wte then
 * wpe as in its unit buffer, so losses and gradients must be the whole
 * model's bit for bit, with the head whole and in tiles.
 */
static void test_rows_one(int tied)
{
    const char *name = tied ? "tied" : "untied";
    struct fsdp_model_spec *s = make_spec(tied);
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b);
    int32_t tok[TB * TT], tgt[TB * TT];
    for (int i = 0; i < TB * TT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 16.0) % 32;
        tgt[i] = i % 6 == 2 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 16.0) % 32;
    }
    for (int chunk = 0; chunk <= 3; chunk += 3) {
        struct fsdp_gpt2 *m = NULL, *r = NULL;
        float l0 = 0, l1 = 0;
        int rc = fsdp_gpt2_create(s, TB, TT, &m);
        rc = rc ? rc : fsdp_gpt2_set_head_chunk(m, chunk);
        rc = rc ? rc : run_step(m, &b, tok, tgt, TB, TT, &l0);
        float **g0 = snap(s, &b);
        rc = rc ? rc : fsdp_gpt2_create(s, TB, TT, &r);
        rc = rc ? rc : fsdp_gpt2_set_head_chunk(r, chunk);
        int taken = rc ? rc : fsdp_gpt2_set_unit_rows(r, 0, NULL);
        rc = rc ? rc : run_step(r, &b, tok, tgt, TB, TT, &l1);
        int same_layout = r->rows_numel == s->unit_numel[0] && r->wte_at == r->emb_off[0] &&
                          r->wpe_at == r->emb_off[1];
        size_t bad = diff_bits(s, g0, b.g, 1.0f);
        tap_ok(rc == 0 && taken == 1 && same_layout && bad == 0 &&
                   memcmp(&l0, &l1, sizeof(float)) == 0,
               "%s: unit 0 by rows on one rank, head %s: loss and gradients bit-identical to the "
               "whole tables (%zu differ)", name, chunk ? "in tiles of 3 rows of logits" : "whole",
               bad);
        if (chunk == 0) {
            float out[32];
            rc = fsdp_gpt2_logits(&r->lm.base, 0, 1, out);
            tap_ok(tied ? rc == FSDP_ERR_INVALID : rc == 0,
                   "%s: logits of a model whose unit 0 is by rows: %s", name,
                   tied ? fsdp_err_msg() : "computed (the untied head is whole)");
            fsdp_err_clear();
            rc = fsdp_gpt2_set_batch(&r->lm.base, NULL, tgt, TB, TT);
            tap_ok(rc == FSDP_ERR_INVALID, "%s: targets without tokens rejected: %s", name,
                   fsdp_err_msg());
            fsdp_err_clear();
            rc = fsdp_gpt2_set_batch(&m->lm.base, NULL, NULL, TB, TT);
            tap_ok(rc == FSDP_ERR_INVALID, "%s: no tokens rejected unless unit 0 is by rows: %s",
                   name, fsdp_err_msg());
            fsdp_err_clear();
            rc = fsdp_gpt2_set_unit_rows(m, 1, NULL);
            tap_ok(rc == 0 && !m->rows_on, "%s: a block by rows is declined", name);
            rc = fsdp_gpt2_set_unit_rows(m, s->n_units, NULL);
            tap_ok(rc == FSDP_ERR_INVALID, "%s: unit %d by rows rejected: %s", name, s->n_units,
                   fsdp_err_msg());
            fsdp_err_clear();
            fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
            rc = fsdp_gpt2_set_unit_rows(m, 0, NULL);
            tap_ok(rc == FSDP_ERR_INVALID, "%s: unit 0 by rows between forward and backward "
                   "rejected: %s", name, fsdp_err_msg());
            fsdp_err_clear();
        }
        free_snap(s, g0);
        fsdp_gpt2_destroy(m);
        fsdp_gpt2_destroy(r);
    }
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

static void test_errors(void)
{
    struct fsdp_model_spec *s = make_spec(1);
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b);
    struct fsdp_gpt2 *m = NULL;
    int rc;
    int32_t tok[TB * TT] = {0}, tgt[TB * TT] = {0};
    rc = fsdp_gpt2_create(s, 1, TT + 1, &m);
    tap_ok(rc == FSDP_ERR_INVALID, "create with T > context fails: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_create(s, TB, TT, &m);
    rc = fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID,
           "forward without unit buffers fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    for (int u = 0; u < b.n; u++)
        fsdp_gpt2_set_unit(m, u, b.p[u], FSDP_F32, b.g[u]);
    tok[5] = 32;
    rc = fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID, "token 32 (V=32) rejected: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    tok[5] = 1;
    tgt[7] = -5;
    rc = fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID, "target -5 rejected: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_set_ignore_index(m, -5);
    rc = fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == 0, "target -5 accepted with ignore index -5");
    fsdp_gpt2_set_ignore_index(m, -1);
    tgt[7] = 0;
    rc = fsdp_gpt2_forward(m, tok, tgt, TB + 1, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID,
           "batch larger than the model's rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_forward(m, tok, NULL, TB, TT, NULL);
    rc = fsdp_gpt2_backward_unit(&m->lm.base, b.n - 1);
    tap_ok(rc == FSDP_ERR_INVALID,
           "backward after a forward without targets fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_set_batch(&m->lm.base, tok, tgt, TB, TT);
    rc = fsdp_gpt2_forward_unit(&m->lm.base, 2);
    tap_ok(rc == FSDP_ERR_INVALID, "forward of unit 2 before unit 1 fails: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_forward(m, tok, tgt, TB, TT, NULL);
    rc = fsdp_gpt2_backward_unit(&m->lm.base, 0);
    tap_ok(rc == FSDP_ERR_INVALID, "backward out of order fails: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_gpt2_set_checkpoint(m, 0, 1);
    tap_ok(rc == FSDP_ERR_INVALID,
           "changing checkpointing between forward and backward fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_set_unit(m, 0, b.p[0], FSDP_F32, NULL);
    rc = fsdp_gpt2_backward_unit(&m->lm.base, b.n - 1);
    tap_ok(rc == FSDP_ERR_INVALID && m->bwd_next == b.n - 1, "tied head backward refuses to run without unit 0's gradient: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_gpt2_destroy(m);
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

/*
 * The decay policy of GPT-2 / nanoGPT's optimizer groups, stated here
 * independently of the parameter table under test: the weights of matmuls
 * decay; biases, layer norms and the embeddings do not (the head decays
 * only when it is not tied to wte, as it then is a matmul weight of its own).
 */
static int expect_decay(const char *name)
{
    size_t n = strlen(name);
    if (n < 7 || strcmp(name + n - 7, ".weight") != 0) {
        return 0; /* biases */
    }
    if (strncmp(name, "wte.", 4) == 0 || strncmp(name, "wpe.", 4) == 0) {
        return 0;
    }
    return strstr(name, "ln_") == NULL;
}

/* One AdamW step on unit u of p0 (copied into p) with zero gradient and
 * moments, applied in two pieces that split a parameter as two shards would:
 * only decay can move a value. Counts wrong elements; returns how many
 * tensors moved. */
static size_t adamw_decay_check(const struct fsdp_model_spec *s, int u, const float *p0, float *p,
                                size_t *wrong)
{
    size_t n = s->unit_numel[u], moved = 0;
    float *g = calloc(n, sizeof(float)), *mm = calloc(n, sizeof(float));
    float *vv = calloc(n, sizeof(float));
    struct fsdp_optim_config oc = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                   .weight_decay = 0.5f};
    struct fsdp_optimizer opt;
    fsdp_adamw_init(&opt, &oc, s, NULL);
    fsdp_optimizer_begin(&opt, 0.1);
    memcpy(p, p0, n * sizeof(float));
    size_t cut = n / 2 + 1 < n ? n / 2 + 1 : n;
    float *st0[2] = {mm, vv}, *st1[2] = {mm + cut, vv + cut};
    fsdp_optimizer_update(&opt, u, 0, cut, p, g, st0, 1.0f);
    fsdp_optimizer_update(&opt, u, cut, n - cut, p + cut, g + cut, st1, 1.0f);
    for (size_t pi = s->unit_first[u]; pi < s->n_params && s->params[pi].unit == u; pi++) {
        const struct fsdp_param_spec *q = &s->params[pi];
        float f = expect_decay(q->name) ? (float)(1.0 - 0.1 * 0.5) : 1.0f;
        int any = 0;
        for (size_t i = q->offset; i < q->offset + q->numel; i++) {
            *wrong += p[i] != p0[i] * f;
            any |= p[i] != p0[i];
        }
        moved += any;
    }
    free(g), free(mm), free(vv);
    return moved;
}

static void test_init(void)
{
    struct fsdp_model_spec *s = make_spec(1), *su = make_spec(0);
    struct bufs a, b, c;
    bufs_alloc(&a, s), bufs_alloc(&b, s), bufs_alloc(&c, su);
    fsdp_model_init_params(s, 42, a.p);
    /* FSDP-style shards: ceil(numel / ws) per rank, the last one short */
    size_t bad = 0;
    for (int ws = 1; ws <= 5; ws++) {
        for (int u = 0; u < s->n_units; u++) {
            size_t n = s->unit_numel[u], per = (n + (size_t)ws - 1) / (size_t)ws;
            memset(b.p[u], 0xff, n * sizeof(float));
            for (int r = 0; r < ws; r++) {
                size_t lo = (size_t)r * per < n ? (size_t)r * per : n;
                size_t hi = lo + per < n ? lo + per : n;
                if (fsdp_model_init_range(s, 42, u, lo, hi - lo, b.p[u] + lo) < 0) bad++;
            }
            bad += memcmp(a.p[u], b.p[u], n * sizeof(float)) != 0;
        }
    }
    tap_ok(bad == 0, "init of shards for world sizes 1..5 equals the single-rank init (%zu differ)", bad);
    fsdp_model_init_params(su, 42, c.p);
    tap_ok(memcmp(a.p[0], c.p[0], s->unit_numel[0] * sizeof(float)) == 0 &&
               memcmp(a.p[1], c.p[1], s->unit_numel[1] * sizeof(float)) == 0,
           "init of a parameter does not depend on the rest of the table (tied vs untied)");
    fsdp_model_init_params(s, 43, b.p);
    tap_ok(memcmp(a.p[0], b.p[0], 64) != 0, "another seed gives other values");
    /* statistics: wte ~ N(0, 0.02), c_proj ~ N(0, 0.02 / sqrt(2L)), norms 1, biases 0 */
    const struct { const char *name; double std; } chk[] = {
        {"wte.weight", 0.02}, {"h.0.attn.c_proj.weight", 0.01}, {"h.1.mlp.c_fc.weight", 0.02}};
    for (size_t k = 0; k < sizeof(chk) / sizeof(chk[0]); k++) {
        const struct fsdp_param_spec *p = &s->params[fsdp_model_spec_find(s, chk[k].name)];
        const float *x = a.p[p->unit] + p->offset;
        double m = 0, v = 0;
        for (size_t i = 0; i < p->numel; i++) m += x[i];
        m /= (double)p->numel;
        for (size_t i = 0; i < p->numel; i++) v += (x[i] - m) * (x[i] - m);
        double sd = sqrt(v / (double)p->numel);
        tap_ok(fabs(sd / chk[k].std - 1.0) < 0.15 && fabs(m) < 4 * chk[k].std / sqrt((double)p->numel),
               "init %s: mean %.2g std %.4g (want 0, %.4g)", chk[k].name, m, sd, chk[k].std);
    }
    const struct fsdp_param_spec *lw = &s->params[fsdp_model_spec_find(s, "h.1.ln_2.weight")];
    const struct fsdp_param_spec *lb = &s->params[fsdp_model_spec_find(s, "h.1.ln_2.bias")];
    tap_ok(a.p[lw->unit][lw->offset] == 1.0f && a.p[lw->unit][lw->offset + 15] == 1.0f &&
               a.p[lb->unit][lb->offset + 3] == 0.0f,
           "init: layer-norm weights 1, biases 0");
    int rc = fsdp_model_init_range(s, 42, 0, 10, s->unit_numel[0], a.p[0]);
    tap_ok(rc == FSDP_ERR_INVALID,
           "init range past the unit's end rejected: %s", fsdp_err_msg());
    fsdp_err_clear();

    /* adamw_range: with zero moments and zero gradients only decay moves
     * parameters; every unit of the tied and the untied table */
    size_t wrong = 0, decayed = 0;
    const struct fsdp_model_spec *tabs[2] = {s, su};
    struct bufs *orig[2] = {&a, &c};
    for (int t = 0; t < 2; t++) {
        const struct fsdp_model_spec *sp = tabs[t];
        struct bufs d;
        bufs_alloc(&d, sp);
        for (int u = 0; u < sp->n_units; u++) {
            decayed += adamw_decay_check(sp, u, orig[t]->p[u], d.p[u], &wrong);
        }
        bufs_free(&d);
    }
    /* per block 4 matmul weights; untied: the head too */
    size_t want = 2 * (size_t)(4 * fsdp_gpt2_cfg(s)->n_layer) + 1;
    tap_ok(wrong == 0 && decayed == want,
           "adamw_range decays the matmul weights and nothing else, across a split "
           "(%zu elements wrong, %zu tensors decayed, %zu expected)", wrong, decayed, want);

    double f = fsdp_gpt2_flops_per_token(s, TT);
    double N = 2 * 12.0 * 16 * 16 + 32 * 16 + 2 * (4 * 16 + 3 * 16 + 16 + 4 * 16 + 16) + 2 * 16;
    tap_ok(fabs(f - (6 * N + 12.0 * 2 * 16 * TT)) < 0.5, "flops per token %.0f (6N + 12LCT, N=%.0f)", f, N);
    bufs_free(&a), bufs_free(&b), bufs_free(&c);
    fsdp_model_spec_destroy(s);
    fsdp_model_spec_destroy(su);
}

int main(void)
{
    test_model(1);
    test_model(0);
    test_head_chunks(1);
    test_head_chunks(0);
    test_rows_one(1);
    test_rows_one(0);
    test_errors();
    test_init();
    return tap_done();
}
