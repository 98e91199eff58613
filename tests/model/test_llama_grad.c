/*
 * test_llama_grad.c - the whole Llama model on tiny configs of odd sizes
 * (grouped-query, multi-query and multi-head attention; tied and untied;
 * q/k/v biases on and off; each rope scaling: none, linear, llama3):
 *   - loss against an independent double-precision reference model built
 *     from the parameter names (Hugging Face semantics), full and smaller
 *     batch;
 *   - the loss gradient against central differences of that reference for
 *     a sample of elements of every parameter tensor;
 *   - activation checkpointing bit-identical; the LM head in row chunks
 *     against one chunk; accumulation; the loss seed; the generic ops;
 *   - the parameter table (names, units, packed q/k/v and gate/up, ties,
 *     init, decay, tensor-parallel placement), the presets' parameter
 *     counts (Llama 3.2 1B and 3.1 8B), the FLOP count, config validation
 *     (one line naming each bad value) and the API's errors.
 */
#include "config.h"
#include "model/llama.h"
#include "core/error.h"
#include "tests/kernels/ref_kernels.h"
#include "compute/device.h"
#include "tests/tap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TB 2
#define TT 7

static uint64_t rng = 0x13198A2E03707344ULL;

struct bufs {
    int n;
    float **p, **g; /* (n,) unit params and grads */
    double **pd;    /* (n,) double copies of params for the reference */
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

/* LlamaRMSNorm: w * x / sqrt(mean(x^2) + eps) */
static void ref_rms(double *out, const double *x, const double *w, size_t N, size_t C, double eps)
{
    for (size_t r = 0; r < N; r++) {
        double ss = 0;
        for (size_t i = 0; i < C; i++) ss += x[r * C + i] * x[r * C + i];
        double k = 1.0 / sqrt(ss / (double)C + eps);
        for (size_t i = 0; i < C; i++) out[r * C + i] = w[i] * x[r * C + i] * k;
    }
}

/* transformers' inverse frequencies with its rope_scaling types */
static void ref_freqs(double *f, const struct fsdp_llama_config *c, int hs)
{
    const double pi = 3.14159265358979323846;
    for (int i = 0; i < hs / 2; i++) {
        f[i] = 1.0 / pow((double)c->rope_theta, 2.0 * i / hs);
        if (c->rope_scaling == FSDP_LLAMA_ROPE_LINEAR) {
            f[i] /= c->rope_factor;
        } else if (c->rope_scaling == FSDP_LLAMA_ROPE_LLAMA3) {
            double wl = 2 * pi / f[i], lo = c->rope_original / (double)c->rope_low_freq;
            double hi = c->rope_original / (double)c->rope_high_freq;
            if (wl > lo) {
                f[i] /= c->rope_factor;
            } else if (wl >= hi) {
                double sm = (c->rope_original / wl - c->rope_low_freq) /
                            ((double)c->rope_high_freq - c->rope_low_freq);
                f[i] = (1 - sm) * f[i] / c->rope_factor + sm * f[i];
            }
        }
    }
}

/* x * cos + rotate_half(x) * sin on each of nh heads of rows (B, T, nh * hs) */
static void ref_rotate(double *x, const double *f, int B, int T, int nh, int hs)
{
    int h2 = hs / 2;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < nh; h++) {
                double *v = x + (((size_t)b * T + t) * nh + h) * hs;
                for (int i = 0; i < h2; i++) {
                    double cs = cos(t * f[i]), sn = sin(t * f[i]), a = v[i], d = v[i + h2];
                    v[i] = a * cs - d * sn;
                    v[i + h2] = d * cs + a * sn;
                }
            }
        }
    }
}

/* causal attention of q (B, T, NH*hs) over k, v (B, T, NKV*hs), head h using kv head h/(NH/NKV) */
static void ref_gqa(double *out, const double *q, const double *k, const double *v, int B, int T,
                    int NH, int NKV, int hs)
{
    double *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int kh = h / (NH / NKV);
            for (int i = 0; i < T; i++) {
                const double *qi = q + (((size_t)b * T + i) * NH + h) * hs;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const double *kj = k + (((size_t)b * T + j) * NKV + kh) * hs;
                    double s = 0;
                    for (int d = 0; d < hs; d++) s += qi[d] * kj[d];
                    p[j] = s / sqrt((double)hs);
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= i; j++) sum += (p[j] = exp(p[j] - mx));
                for (int d = 0; d < hs; d++) {
                    double s = 0;
                    for (int j = 0; j <= i; j++) {
                        s += p[j] / sum * v[(((size_t)b * T + j) * NKV + kh) * hs + d];
                    }
                    out[(((size_t)b * T + i) * NH + h) * hs + d] = s;
                }
            }
        }
    }
    free(p);
}

static double ref_llama_loss(const struct fsdp_model_spec *s, double *const *u, const int32_t *tok,
                             const int32_t *tgt, int B, int T)
{
    const struct fsdp_llama_config *c = fsdp_llama_cfg(s);
    size_t BT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size;
    size_t F = (size_t)c->ffn_hidden;
    int hs = c->n_embd / c->n_head;
    size_t KV = (size_t)c->n_kv_head * hs;
    double *x = malloc(BT * C * sizeof(double)), *h = malloc(BT * C * sizeof(double));
    double *q = malloc(BT * C * sizeof(double)), *k = malloc(BT * KV * sizeof(double));
    double *v = malloc(BT * KV * sizeof(double)), *y = malloc(BT * C * sizeof(double));
    double *gt = malloc(BT * F * sizeof(double)), *up = malloc(BT * F * sizeof(double));
    double *pr = malloc(BT * C * sizeof(double)), *logits = malloc(BT * V * sizeof(double));
    double f[64];
    char n1[96], n2[96];
    ref_freqs(f, c, hs);
    const double *emb = P(s, u, "embed_tokens.weight");
    for (size_t r = 0; r < BT; r++) memcpy(x + r * C, emb + (size_t)tok[r] * C, C * sizeof(double));
    for (int l = 0; l < c->n_layer; l++) {
#define W(suffix) (snprintf(n1, sizeof(n1), "layers.%d.%s.weight", l, suffix), P(s, u, n1))
#define Bi(suffix) \
    (c->attn_bias ? (snprintf(n2, sizeof(n2), "layers.%d.%s.bias", l, suffix), P(s, u, n2)) : NULL)
        ref_rms(h, x, W("input_layernorm"), BT, C, c->norm_eps);
        ref_matmul(q, h, W("self_attn.q_proj"), Bi("self_attn.q_proj"), BT, C, C);
        ref_matmul(k, h, W("self_attn.k_proj"), Bi("self_attn.k_proj"), BT, C, KV);
        ref_matmul(v, h, W("self_attn.v_proj"), Bi("self_attn.v_proj"), BT, C, KV);
        ref_rotate(q, f, B, T, c->n_head, hs);
        ref_rotate(k, f, B, T, c->n_kv_head, hs);
        ref_gqa(y, q, k, v, B, T, c->n_head, c->n_kv_head, hs);
        ref_matmul(pr, y, W("self_attn.o_proj"), NULL, BT, C, C);
        for (size_t i = 0; i < BT * C; i++) x[i] += pr[i];
        ref_rms(h, x, W("post_attention_layernorm"), BT, C, c->norm_eps);
        ref_matmul(gt, h, W("mlp.gate_proj"), NULL, BT, C, F);
        ref_matmul(up, h, W("mlp.up_proj"), NULL, BT, C, F);
        for (size_t i = 0; i < BT * F; i++) gt[i] = gt[i] / (1.0 + exp(-gt[i])) * up[i];
        ref_matmul(pr, gt, W("mlp.down_proj"), NULL, BT, F, C);
        for (size_t i = 0; i < BT * C; i++) x[i] += pr[i];
#undef W
#undef Bi
    }
    ref_rms(h, x, P(s, u, "norm.weight"), BT, C, c->norm_eps);
    ref_matmul(logits, h, P(s, u, c->tied ? "embed_tokens.weight" : "lm_head.weight"), NULL, BT, C,
               V);
    double loss = ref_crossentropy(logits, tgt, BT, V, -1);
    free(x), free(h), free(q), free(k), free(v), free(y), free(gt), free(up), free(pr);
    free(logits);
    return loss;
}

// ----------------------------------------------------------------------------

struct variant {
    const char *name;
    struct fsdp_llama_config cfg;
};

/* V, context, L, NH, NKV, C, F, eps, theta, rope type, factor, low, high, original, tied, bias */
static const struct variant variants[] = {
    {"GQA 4/2, tied, no bias, rope none",
     {37, 9, 2, 4, 2, 24, 20, 1e-5f, 10000.0f, FSDP_LLAMA_ROPE_NONE, 1.0f, 1.0f, 4.0f, 9, 1, 0}},
    {"MQA 3/1, untied, q/k/v bias, rope linear x2.5",
     {29, 9, 2, 3, 1, 18, 17, 1e-6f, 500.0f, FSDP_LLAMA_ROPE_LINEAR, 2.5f, 1.0f, 4.0f, 9, 0, 1}},
    {"GQA 4/2, untied, q/k/v bias, rope llama3 x4 (original 64)",
     {31, 9, 2, 4, 2, 32, 23, 1e-5f, 10000.0f, FSDP_LLAMA_ROPE_LLAMA3, 4.0f, 1.0f, 4.0f, 64, 0, 1}},
    {"MHA 2/2, tied, q/k/v bias, rope llama3 x8 (original 16)",
     {33, 9, 3, 2, 2, 12, 13, 1e-5f, 30.0f, FSDP_LLAMA_ROPE_LLAMA3, 8.0f, 1.0f, 2.0f, 16, 1, 1}},
};

static struct fsdp_model_spec *make_spec(const struct fsdp_llama_config *c)
{
    struct fsdp_model_spec *s = NULL;
    if (fsdp_llama_spec_create(c, &s) < 0) {
        fprintf(stderr, "spec: %s\n", fsdp_err_msg());
        abort();
    }
    return s;
}

/* init, then perturb every element so norms and biases are not trivial */
static void fill_params(const struct fsdp_model_spec *s, struct bufs *b, double amp)
{
    fsdp_model_init_params(s, 1234, b->p);
    for (int u = 0; u < b->n; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            b->p[u][i] += (float)(amp * ref_rand(&rng));
            b->pd[u][i] = b->p[u][i];
        }
    }
}

static void make_batch(int32_t *tok, int32_t *tgt, int V, int every)
{
    for (int i = 0; i < TB * TT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 0.5 * V) % V;
        tgt[i] = i % every == 3 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 0.5 * V) % V;
    }
}

static int run_step(struct fsdp_llama *m, struct bufs *b, const int32_t *tok, const int32_t *tgt,
                    int B, int T, float *loss)
{
    for (int u = 0; u < b->n; u++)
        fsdp_llama_set_unit(m, u, b->p[u], FSDP_F32, b->g[u]);
    FSDP_CHECK(fsdp_llama_zero_grad(m, -1));
    FSDP_CHECK(fsdp_llama_forward(m, tok, tgt, B, T, loss));
    return fsdp_llama_backward(m);
}

static float **snap(const struct fsdp_model_spec *s, struct bufs *b)
{
    float **c = calloc((size_t)b->n, sizeof(float *));
    for (int u = 0; u < b->n; u++) {
        c[u] = malloc(s->unit_numel[u] * sizeof(float));
        memcpy(c[u], b->g[u], s->unit_numel[u] * sizeof(float));
    }
    return c;
}

static void free_snap(const struct fsdp_model_spec *s, float **c)
{
    for (int u = 0; u < s->n_units; u++) free(c[u]);
    free(c);
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

/* largest |a - mul * b| over each unit's largest |mul * b| */
static double diff_rel(const struct fsdp_model_spec *s, float **a, float **b, double mul)
{
    double err = 0;
    for (int u = 0; u < s->n_units; u++) {
        double gmax = 0;
        for (size_t i = 0; i < s->unit_numel[u]; i++) gmax = fmax(gmax, fabs(mul * b[u][i]));
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            double e = fabs((double)a[u][i] - mul * b[u][i]) / gmax;
            err = e > err || isnan(e) ? e : err;
        }
    }
    return err;
}

/* central differences of the reference on 8 elements of every tensor */
static void check_grads(const struct variant *vr, const struct fsdp_model_spec *s, struct bufs *b,
                        const int32_t *tok, const int32_t *tgt)
{
    double worst_norm = 0;
    for (size_t pi = 0; pi < s->n_params; pi++) {
        const struct fsdp_param_spec *p = &s->params[pi];
        size_t idx[8] = {0, p->numel - 1};
        for (int k = 2; k < 8; k++) {
            idx[k] = (size_t)((ref_rand(&rng) + 1.0) * 0.5 * (double)p->numel) % p->numel;
        }
        double fd[8], scale = 0, max_abs = 0;
        size_t worst = 0;
        for (int k = 0; k < 8; k++) {
            double *x = b->pd[p->unit] + p->offset + idx[k];
            double save = *x, h = 1e-5;
            *x = save + h;
            double lp = ref_llama_loss(s, b->pd, tok, tgt, TB, TT);
            *x = save - h;
            double lm = ref_llama_loss(s, b->pd, tok, tgt, TB, TT);
            *x = save;
            fd[k] = (lp - lm) / (2 * h);
            scale = fmax(scale, fabs(fd[k]));
        }
        for (int k = 0; k < 8; k++) {
            double e = fabs((double)b->g[p->unit][p->offset + idx[k]] - fd[k]);
            if (e > max_abs || isnan(e)) max_abs = isnan(e) ? INFINITY : e, worst = idx[k];
        }
        worst_norm = fmax(worst_norm, max_abs / (scale + 1e-7));
        tap_ok(max_abs <= 1e-3 * scale + 1e-7,
               "%s: d loss/d %s: max abs err %.3g (max |grad| %.3g), worst element %zu", vr->name,
               p->name, max_abs, scale, worst);
    }
    tap_diag("%s: worst gradient error relative to its tensor's max |grad|: %.3g", vr->name,
             worst_norm);
}

static void test_variant(const struct variant *vr)
{
    struct fsdp_model_spec *s = make_spec(&vr->cfg);
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b, 0.1);
    int32_t tok[TB * TT], tgt[TB * TT];
    make_batch(tok, tgt, vr->cfg.vocab_size, 5);
    struct fsdp_llama *m = NULL;
    int rc = fsdp_llama_create(s, TB, TT, &m);
    tap_ok(rc == 0, "%s: create (B=%d T=%d, context %d)", vr->name, TB, TT, vr->cfg.context);
    float loss = 0;
    rc = run_step(m, &b, tok, tgt, TB, TT, &loss);
    double want = ref_llama_loss(s, b.pd, tok, tgt, TB, TT);
    tap_ok(rc == 0 && fabs(loss - want) <= 2e-6 * fabs(want),
           "%s: loss %.8f vs double reference %.8f (rc %d, %zu kept tokens)", vr->name,
           (double)loss, want, rc, m->n_kept);
    check_grads(vr, s, &b, tok, tgt);

    /* checkpointing: every block, then only block 1: the same bits */
    float **g0 = snap(s, &b);
    size_t full_bytes = fsdp_llama_activation_bytes(&m->lm.base);
    for (int mode = 0; mode < 2; mode++) {
        fsdp_llama_set_checkpoint(m, -1, 0);
        fsdp_llama_set_checkpoint(m, mode == 0 ? -1 : 1, 1);
        size_t bytes = fsdp_llama_activation_bytes(&m->lm.base);
        float l2 = 0;
        rc = run_step(m, &b, tok, tgt, TB, TT, &l2);
        size_t bad = diff_bits(s, g0, b.g, 1.0f);
        tap_ok(rc == 0 && bad == 0 && memcmp(&l2, &loss, sizeof(float)) == 0 &&
                   (mode == 1 || bytes < full_bytes),
               "%s: checkpointing %s: gradients and loss bit-identical (%zu differ), activations "
               "%zu -> %zu bytes", vr->name, mode == 0 ? "every block" : "block 1", bad,
               full_bytes, bytes);
    }
    fsdp_llama_set_checkpoint(m, -1, 0);

    /* the head in chunks of 3 and 5 rows against one chunk */
    for (int chunk = 3; chunk <= 5; chunk += 2) {
        float l2 = 0;
        rc = fsdp_llama_set_head_chunk(m, chunk);
        rc = rc ? rc : run_step(m, &b, tok, tgt, TB, TT, &l2);
        double err = diff_rel(s, b.g, g0, 1.0);
        tap_ok(rc == 0 && fabs(l2 - loss) <= 1e-6 * fabs(loss) && err < 1e-6,
               "%s: LM head in chunks of %d rows: loss %.8f vs %.8f, max grad err %.3g relative "
               "to the unit's max", vr->name, chunk, (double)l2, (double)loss, err);
    }
    fsdp_llama_set_head_chunk(m, 0);

    /* accumulation: a second backward without zeroing doubles the gradients */
    run_step(m, &b, tok, tgt, TB, TT, &loss);
    rc = fsdp_llama_forward(m, tok, tgt, TB, TT, NULL);
    rc = rc ? rc : fsdp_llama_backward(m);
    double acc = diff_rel(s, b.g, g0, 2.0);
    tap_ok(rc == 0 && acc < 1e-6, "%s: a second backward accumulates (err vs 2x %.3g)", vr->name,
           acc);

    /* the loss seed: divisor 2 n_kept halves every gradient exactly */
    fsdp_llama_set_loss_seed(m, 2.0 * (double)m->n_kept, 1.0f);
    rc = run_step(m, &b, tok, tgt, TB, TT, &loss);
    tap_ok(rc == 0 && diff_bits(s, g0, b.g, 0.5f) == 0,
           "%s: loss seed divisor 2*n_kept halves the gradients exactly", vr->name);
    fsdp_llama_set_loss_seed(m, 0.0, 1.0f);

    /* a smaller batch inside the same model */
    rc = fsdp_llama_forward(m, tok + 3, tgt + 3, 1, 5, &loss);
    want = ref_llama_loss(s, b.pd, tok + 3, tgt + 3, 1, 5);
    tap_ok(rc == 0 && fabs(loss - want) <= 2e-6 * fabs(want),
           "%s: smaller batch (1 x 5): loss %.8f vs reference %.8f", vr->name, (double)loss, want);
    free_snap(s, g0);
    fsdp_llama_destroy(m);
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

/* The generic interface (model.h) gives the functions' results, logits too. */
static void test_ops(void)
{
    const struct variant *vr = &variants[2];
    struct fsdp_model_spec *s = make_spec(&vr->cfg);
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b, 0.1);
    int32_t tok[TB * TT], tgt[TB * TT];
    make_batch(tok, tgt, vr->cfg.vocab_size, 6);
    struct fsdp_llama *m = NULL;
    float l0 = 0, l1 = 0;
    int rc = fsdp_llama_create(s, TB, TT, &m);
    rc = rc ? rc : run_step(m, &b, tok, tgt, TB, TT, &l0);
    float **g0 = snap(s, &b);
    struct fsdp_model *gm = NULL;
    struct fsdp_model_opts o = {.max_B = TB, .max_T = TT, .head_chunk = 4};
    rc = rc ? rc : fsdp_model_registry_init();
    rc = rc ? rc : fsdp_model_create(s, &o, &gm);
    rc = rc ? rc : gm->ops->set_checkpoint(gm, -1, 1);
    for (int u = 0; rc == 0 && u < b.n; u++)
        rc = gm->ops->set_unit(gm, u, b.p[u], FSDP_F32, b.g[u]);
    for (int u = 0; u < b.n; u++) memset(b.g[u], 0, s->unit_numel[u] * sizeof(float));
    rc = rc ? rc : fsdp_model_forward(gm, tok, tgt, TB, TT, &l1);
    rc = rc ? rc : fsdp_model_backward(gm);
    double err = diff_rel(s, b.g, g0, 1.0);
    tap_ok(rc == 0 && fabs(l1 - l0) <= 1e-6 * fabs(l0) && err < 1e-6 &&
               gm->ops->activation_bytes(gm) > 0 && gm->ops->workspace_bytes(gm) > 0,
           "ops (checkpointing, head chunks of 4): loss %.8f vs %.8f, grad err %.3g", (double)l1,
           (double)l0, err);
    size_t V = (size_t)s->vocab_size, n = 3;
    float *a = malloc(TB * TT * V * sizeof(float)), *p = malloc(n * V * sizeof(float));
    rc = fsdp_model_forward(gm, tok, NULL, TB, TT, NULL);
    rc = rc ? rc : gm->ops->logits(gm, 0, TB * TT, a);
    rc = rc ? rc : gm->ops->logits(gm, 4, n, p);
    double lerr = 0;
    for (size_t i = 0; i < n * V; i++) lerr = fmax(lerr, fabs(p[i] - a[4 * V + i]));
    tap_ok(rc == 0 && lerr <= 1e-6, "logits of rows [4, 7) equal the whole batch's (%.3g)", lerr);
    rc = gm->ops->logits(gm, TB * TT - 1, 2, p);
    tap_ok(rc == FSDP_ERR_INVALID, "logits past the batch rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    struct fsdp_device *dev = NULL;
    struct fsdp_model *dm = NULL;
    rc = fsdp_device_create("guarded", 0, &dev);
    o.dev = dev;
    rc = rc ? rc : fsdp_model_create(s, &o, &dm);
    tap_ok(
        rc == 0 && dm && dev->stats.bytes_now > 0,
        "created on a device of its own memory (guarded): its tables and batch there (%zu bytes)",
        dev ? dev->stats.bytes_now : 0);
    fsdp_model_destroy(dm);
    fsdp_device_destroy(dev);
    free(a), free(p);
    fsdp_model_destroy(gm);
    free_snap(s, g0);
    fsdp_llama_destroy(m);
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

static void test_errors(void)
{
    const struct variant *vr = &variants[0];
    struct fsdp_model_spec *s = make_spec(&vr->cfg);
    struct bufs b;
    bufs_alloc(&b, s);
    fill_params(s, &b, 0.0);
    struct fsdp_llama *m = NULL;
    int32_t tok[TB * TT] = {0}, tgt[TB * TT] = {0};
    int rc = fsdp_llama_create(s, 1, vr->cfg.context + 1, &m);
    tap_ok(rc == FSDP_ERR_INVALID, "create with T > context fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_create(s, TB, TT, &m);
    rc = fsdp_llama_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID, "forward without unit buffers fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    for (int u = 0; u < b.n; u++)
        fsdp_llama_set_unit(m, u, b.p[u], FSDP_F32, b.g[u]);
    tok[5] = 37;
    rc = fsdp_llama_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID, "token 37 (V=37) rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    tok[5] = 1;
    tgt[7] = -5;
    rc = fsdp_llama_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID, "target -5 rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_set_ignore_index(m, -5);
    rc = fsdp_llama_forward(m, tok, tgt, TB, TT, NULL);
    tap_ok(rc == 0, "target -5 accepted with ignore index -5");
    fsdp_llama_set_ignore_index(m, -1);
    tgt[7] = 0;
    rc = fsdp_llama_forward(m, tok, tgt, TB + 1, TT, NULL);
    tap_ok(rc == FSDP_ERR_INVALID, "batch larger than the model's rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_forward(m, tok, NULL, TB, TT, NULL);
    rc = fsdp_llama_backward_unit(&m->lm.base, b.n - 1);
    tap_ok(rc == FSDP_ERR_INVALID, "backward after a forward without targets fails: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_set_batch(&m->lm.base, tok, tgt, TB, TT);
    rc = fsdp_llama_forward_unit(&m->lm.base, 2);
    tap_ok(rc == FSDP_ERR_INVALID, "forward of unit 2 before unit 1 fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_forward(m, tok, tgt, TB, TT, NULL);
    rc = fsdp_llama_backward_unit(&m->lm.base, 0);
    tap_ok(rc == FSDP_ERR_INVALID, "backward out of order fails: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_llama_set_checkpoint(m, 0, 1);
    tap_ok(rc == FSDP_ERR_INVALID, "changing checkpointing between forward and backward fails: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_set_unit(m, 0, b.p[0], FSDP_F32, NULL);
    rc = fsdp_llama_backward_unit(&m->lm.base, b.n - 1);
    tap_ok(rc == FSDP_ERR_INVALID && m->bwd_next == b.n - 1,
           "tied head backward refuses to run without unit 0's gradient: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_llama_destroy(m);
    bufs_free(&b);
    fsdp_model_spec_destroy(s);
}

/* Each bad value is refused with one line naming it. */
static void test_validate(void)
{
    struct fsdp_llama_config good;
    fsdp_llama_preset("llama-tiny", &good);
    tap_ok(fsdp_llama_config_validate(&good) == 0, "llama-tiny validates");
    /* what each message must say; the edits are the cases of the switch below */
    static const char *const bad[] = {
        "vocab_size 0", "context 2097152", "n_layer 0", "n_kv_head 3",
        "n_head 3 is not divisible by n_kv_head 2", "is odd",
        "n_embd 100 is not divisible by n_head 8", "ffn_hidden 0", "norm_eps 0", "rope_theta 1",
        "rope_scaling 3", "rope_factor 0.5", "rope_low_freq_factor 0",
        "rope_high_freq_factor 1 must exceed", "rope_original_context 0",
        "tied_embeddings must be 0 or 1, not 2", "attn_bias must be 0 or 1, not 3",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct fsdp_llama_config c = good;
        switch (i) {
        case 0: c.vocab_size = 0; break;
        case 1: c.context = 1 << 21; break;
        case 2: c.n_layer = 0; break;
        case 3: c.n_kv_head = 3; break;
        case 4: c.n_head = 3, c.n_embd = 96, c.n_kv_head = 2; break;
        case 5: c.n_head = 4, c.n_embd = 36; break;
        case 6: c.n_head = 8, c.n_embd = 100; break;
        case 7: c.ffn_hidden = 0; break;
        case 8: c.norm_eps = 0.0f; break;
        case 9: c.rope_theta = 1.0f; break;
        case 10: c.rope_scaling = 3; break;
        case 11: c.rope_scaling = FSDP_LLAMA_ROPE_LINEAR, c.rope_factor = 0.5f; break;
        case 12: c.rope_scaling = FSDP_LLAMA_ROPE_LLAMA3, c.rope_low_freq = 0.0f; break;
        case 13: c.rope_scaling = FSDP_LLAMA_ROPE_LLAMA3, c.rope_high_freq = 1.0f; break;
        case 14: c.rope_scaling = FSDP_LLAMA_ROPE_LLAMA3, c.rope_original = 0; break;
        case 15: c.tied = 2; break;
        default: c.attn_bias = 3; break;
        }
        int rc = fsdp_llama_config_validate(&c);
        const char *msg = fsdp_err_msg();
        tap_ok(rc == FSDP_ERR_INVALID && strstr(msg, bad[i]) && !strchr(msg, '\n'),
               "refused: %s", msg);
        fsdp_err_clear();
    }
    struct fsdp_llama_config c = good;
    c.rope_scaling = FSDP_LLAMA_ROPE_NONE, c.rope_factor = 0.25f, c.rope_original = 0;
    tap_ok(fsdp_llama_config_validate(&c) == 0, "rope_scaling none ignores the scaling fields");
    c = good;
    c.n_kv_head = 1;
    tap_ok(fsdp_llama_config_validate(&c) == 0, "one key/value head (multi-query) validates");
    int t = -1;
    tap_ok(fsdp_llama_rope_parse("llama3", &t) == 0 && t == FSDP_LLAMA_ROPE_LLAMA3 &&
               fsdp_llama_rope_parse("yarn", &t) == FSDP_ERR_INVALID,
           "rope scaling names: %s", fsdp_err_msg());
    fsdp_err_clear();
    tap_ok(fsdp_llama_preset("tiny", &c) == FSDP_ERR_INVALID, "unknown preset: %s", fsdp_err_msg());
    fsdp_err_clear();
}

/* Hugging Face's policies, stated here by name independently of the table. */
static int expect_decay(const char *name)
{
    return strstr(name, "_proj.weight") || strcmp(name, "lm_head.weight") == 0;
}

static enum fsdp_tp_place expect_tp(const char *name)
{
    if (strstr(name, "embed_tokens") || strstr(name, "lm_head")) return FSDP_TP_VOCAB;
    if (strstr(name, "o_proj") || strstr(name, "down_proj")) return FSDP_TP_ROWWISE;
    if (strstr(name, "_proj.")) return FSDP_TP_COLWISE;
    return FSDP_TP_REPLICATE;
}

static void test_table(void)
{
    const struct variant *vr = &variants[1]; /* untied, biases: every kind of tensor */
    struct fsdp_model_spec *s = make_spec(&vr->cfg);
    const struct fsdp_llama_config *c = &vr->cfg;
    size_t bad = 0;
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        int norm = strstr(p->name, "norm") != NULL, bias = strstr(p->name, ".bias") != NULL;
        enum fsdp_init_kind want = norm   ? FSDP_INIT_ONES
                                   : bias ? FSDP_INIT_ZEROS
                                          : FSDP_INIT_NORMAL;
        bad += p->init != want || (want == FSDP_INIT_NORMAL && p->std != 0.02f);
        bad += p->decay != expect_decay(p->name) || p->tp != expect_tp(p->name);
    }
    tap_ok(bad == 0, "init (N(0, 0.02), norms 1, biases 0), decay and tp placement of %zu tensors "
           "(%zu wrong)", s->n_params, bad);
    long q = fsdp_model_spec_find(s, "layers.1.self_attn.q_proj.weight");
    long k = fsdp_model_spec_find(s, "layers.1.self_attn.k_proj.weight");
    long v = fsdp_model_spec_find(s, "layers.1.self_attn.v_proj.weight");
    long qb = fsdp_model_spec_find(s, "layers.1.self_attn.q_proj.bias");
    long g = fsdp_model_spec_find(s, "layers.1.mlp.gate_proj.weight");
    long up = fsdp_model_spec_find(s, "layers.1.mlp.up_proj.weight");
    const struct fsdp_param_spec *P0 = s->params;
    int hs = c->n_embd / c->n_head;
    tap_ok(q > 0 && P0[q].unit == 2 && P0[k].offset == P0[q].offset + P0[q].numel &&
               P0[v].offset == P0[k].offset + P0[k].numel && P0[k].shape[0] == (size_t)hs &&
               P0[qb].shape[0] == (size_t)c->n_embd && g > v && up > g &&
               fsdp_model_spec_find(s, "layers.0.self_attn.o_proj.bias") < 0,
           "q, k, v consecutive (k (%zu, %zu) for one kv head), then gate and up, no o_proj bias",
           P0[k].shape[0], P0[k].shape[1]);
    tap_ok(s->n_units == c->n_layer + 2 && s->n_ties == 0 &&
               fsdp_model_spec_find(s, "lm_head.weight") >= 0 &&
               strcmp(P0[0].name, "embed_tokens.weight") == 0,
           "units: embedding, %d blocks, head; untied has lm_head.weight", c->n_layer);
    fsdp_model_spec_destroy(s);
    s = make_spec(&variants[0].cfg);
    tap_ok(s->n_ties == 1 && s->ties[0].user == s->n_units - 1 && s->ties[0].owner == 0 &&
               fsdp_model_spec_find(s, "lm_head.weight") < 0 &&
               fsdp_model_spec_find(s, "layers.0.self_attn.q_proj.bias") < 0,
           "tied: the head uses embed_tokens.weight (a tie), no lm_head, no biases");
    /* 6N + 12 L C T: every parameter but nothing else when tied */
    double f = fsdp_llama_flops_per_token(s, 5), N = (double)s->total_numel;
    const struct fsdp_llama_config *c0 = &variants[0].cfg;
    double Nh = (double)c0->vocab_size * c0->n_embd + c0->n_embd +
                c0->n_layer * (2.0 * c0->n_embd + 2.0 * c0->n_embd * c0->n_embd +
                               2.0 * c0->n_kv_head * (c0->n_embd / c0->n_head) * c0->n_embd +
                               3.0 * c0->n_embd * c0->ffn_hidden);
    tap_ok(N == Nh && fabs(f - (6 * N + 12.0 * c0->n_layer * c0->n_embd * 5)) < 0.5,
           "flops per token %.0f (6N + 12LCT, N=%.0f counted by hand %.0f)", f, N, Nh);
    fsdp_model_spec_destroy(s);
    s = make_spec(&vr->cfg);
    f = fsdp_llama_flops_per_token(s, 5);
    N = (double)s->total_numel - (double)c->vocab_size * c->n_embd;
    tap_ok(fabs(f - (6 * N + 12.0 * c->n_layer * c->n_embd * 5)) < 0.5,
           "untied: the embedding lookup is not counted (%.0f)", f);
    fsdp_model_spec_destroy(s);

    /* the presets of real sizes: parameter counts as published */
    const struct { const char *name; size_t n; } real[] = {
        {"llama-1b", 1235814400}, {"llama-8b", 8030261248}};
    for (size_t i = 0; i < 2; i++) {
        struct fsdp_llama_config pc;
        int rc = fsdp_llama_preset(real[i].name, &pc);
        rc = rc ? rc : fsdp_llama_spec_create(&pc, &s);
        tap_ok(rc == 0 && s->total_numel == real[i].n && pc.context == 131072,
               "%s: %zu parameters (want %zu), context 131072", real[i].name,
               rc == 0 ? s->total_numel : 0, real[i].n);
        if (rc == 0) fsdp_model_spec_destroy(s);
    }
}

int main(void)
{
    for (size_t i = 0; i < sizeof(variants) / sizeof(variants[0]); i++) {
        test_variant(&variants[i]);
    }
    test_ops();
    test_errors();
    test_validate();
    test_table();
    return tap_done();
}
