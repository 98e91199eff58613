/*
 * test_share_ws.c - two instances of a model sharing one gradient
 * workspace (model.h, share_workspace), as a pipeline chunk's activation
 * sets do: GPT-2 (tied, untied) and Llama (GQA, tied; MQA, untied), each
 * cut as a pipeline stage of its blocks and head (units 1 .. n - 1) and of
 * its blocks alone (1 .. n - 2), so the forward starts from a residual
 * written through stage_buffers and the backward ends in the stage input's
 * gradient (dres), which each instance keeps (without the head it also
 * starts from a gradient written into dres, here right after each
 * forward, as a pipeline may receive it early). Two micro-batches run
 * interleaved on the sharing pair (forward a, forward b, backward b,
 * backward a; then forward a, forward b, backward a, backward b; each dres
 * read after both backwards) and one after the other on an instance with
 * its own workspace: losses, every parameter gradient and both dres equal,
 * bit for bit. The borrower's workspace_bytes counts only its dres (and Llama's
 * RoPE tables, which each instance keeps); the contract's refusals
 * (another cut, a donor that itself borrows, a borrower that lends, after
 * reserve, a donor not reserved first) are one error each.
 */
#include "config.h"
#include "model/model.h"
#include "model/gpt2_spec.h"
#include "model/llama_spec.h"
#include "core/error.h"
#include "tests/tap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define B 2
#define T 8

struct mb {
    int32_t tok[B * T], tgt[B * T];
    float *in;   /* the stage input (B T C) */
    float *dout; /* a stage without the head: the gradient of its output (B T C) */
    float **g;   /* per unit: the gradients this micro-batch's backward adds */
    float *dres; /* after the backward: the gradient of the stage input */
    float loss;
};

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static float rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 - 0.5);
}

static void mb_init(struct mb *b, const struct fsdp_model_spec *s, size_t C, int V)
{
    b->in = malloc((size_t)B * T * C * sizeof(float));
    b->dout = malloc((size_t)B * T * C * sizeof(float));
    b->dres = malloc((size_t)B * T * C * sizeof(float));
    b->g = calloc((size_t)s->n_units, sizeof(float *));
    for (size_t i = 0; i < (size_t)B * T * C; i++) {
        b->in[i] = rnd();
        b->dout[i] = 0.01f * rnd();
    }
    for (int i = 0; i < B * T; i++) {
        rnd();
        b->tok[i] = (int32_t)(rng % (uint64_t)V);
        rnd();
        b->tgt[i] = i % 7 == 2 ? -1 : (int32_t)(rng % (uint64_t)V);
    }
    for (int u = 0; u < s->n_units; u++) {
        b->g[u] = calloc(s->unit_numel[u], sizeof(float));
    }
}

static void mb_free(struct mb *b, const struct fsdp_model_spec *s)
{
    for (int u = 0; u < s->n_units; u++) {
        free(b->g[u]);
    }
    free(b->g), free(b->in), free(b->dout), free(b->dres);
}

/* An instance cut at units [1, hi]. */
static int hi_unit;
static int make(const struct fsdp_model_spec *s, struct fsdp_model **m)
{
    struct fsdp_model_opts mo = {.max_B = B, .max_T = T};
    FSDP_CHECK(fsdp_model_create(s, &mo, m));
    return (*m)->ops->set_stage(*m, 1, hi_unit);
}

/* b's forward on m: its units bound to params and b's gradients, its input written */
static int fwd(struct fsdp_model *m, float **params, struct mb *b)
{
    float *in, *out, *dres;
    size_t count;
    for (int u = 0; u < m->spec->n_units; u++) {
        FSDP_CHECK(m->ops->set_unit(m, u, params[u], FSDP_F32, b->g[u]));
    }
    FSDP_CHECK(m->ops->set_batch(m, b->tok, b->tgt, B, T));
    FSDP_CHECK(m->ops->stage_buffers(m, &in, &out, &dres, &count));
    memcpy(in, b->in, count * sizeof(float));
    for (int u = 1; u <= hi_unit; u++) {
        FSDP_CHECK(m->ops->forward_unit(m, u));
    }
    b->loss = hi_unit == m->spec->n_units - 1 ? m->ops->loss(m) : 0.0f;
    /* without the head: the output's gradient, as a pipeline receives it */
    if (hi_unit < m->spec->n_units - 1) {
        memcpy(dres, b->dout, count * sizeof(float));
    }
    return 0;
}

/* b's backward on m (whose forward ran b's) */
static int bwd(struct fsdp_model *m, float **params, struct mb *b)
{
    for (int u = 0; u < m->spec->n_units; u++) {
        FSDP_CHECK(m->ops->set_unit(m, u, params[u], FSDP_F32, b->g[u]));
    }
    for (int u = hi_unit; u >= 1; u--) {
        FSDP_CHECK(m->ops->backward_unit(m, u));
    }
    return 0;
}

/* the gradient of b's stage input, as m's backward left it */
static int take_dres(struct fsdp_model *m, struct mb *b)
{
    float *in, *out, *dres;
    size_t count;
    FSDP_CHECK(m->ops->stage_buffers(m, &in, &out, &dres, &count));
    memcpy(b->dres, dres, count * sizeof(float));
    return 0;
}

/* a's forward on x, b's on y, then their backwards, b's first unless
 * a_first; each stage input's gradient read after both */
static int pair(struct fsdp_model *x, struct fsdp_model *y, float **params, struct mb *a,
                struct mb *b, int a_first)
{
    FSDP_CHECK(fwd(x, params, a));
    FSDP_CHECK(fwd(y, params, b));
    FSDP_CHECK(a_first ? bwd(x, params, a) : bwd(y, params, b));
    FSDP_CHECK(a_first ? bwd(y, params, b) : bwd(x, params, a));
    FSDP_CHECK(take_dres(x, a));
    return take_dres(y, b);
}

static int same(const struct fsdp_model_spec *s, const struct mb *x, const struct mb *y, size_t C)
{
    int ok = memcmp(&x->loss, &y->loss, sizeof(float)) == 0 &&
             memcmp(x->dres, y->dres, (size_t)B * T * C * sizeof(float)) == 0;
    for (int u = 0; u < s->n_units; u++) {
        ok = ok && memcmp(x->g[u], y->g[u], s->unit_numel[u] * sizeof(float)) == 0;
    }
    return ok;
}

static void zero_grads(const struct fsdp_model_spec *s, struct mb *b)
{
    for (int u = 0; u < s->n_units; u++) {
        memset(b->g[u], 0, s->unit_numel[u] * sizeof(float));
    }
}

/* The refusals of the contract, on fresh instances. */
static void refusals(const char *name, const struct fsdp_model_spec *s, struct fsdp_model *x)
{
    struct fsdp_model *y = NULL, *z = NULL, *w = NULL;
    struct fsdp_model_opts mo = {.max_B = B, .max_T = T};
    int rc = fsdp_model_create(s, &mo, &w);
    rc = rc ? rc : w->ops->set_stage(w, 2, hi_unit);
    rc = rc ? rc : fsdp_model_share_workspace(w, x);
    tap_ok(rc == FSDP_ERR_INVALID, "%s: a donor of another cut refused: %s", name, fsdp_err_msg());
    fsdp_err_clear();
    rc = make(s, &y);
    rc = rc ? rc : fsdp_model_share_workspace(y, x) == 1 ? 0 : -1;
    rc = rc ? rc : make(s, &z);
    rc = rc ? rc : fsdp_model_share_workspace(z, y);
    tap_ok(rc == FSDP_ERR_INVALID, "%s: a donor that borrows refused: %s", name, fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_model_share_workspace(x, z);
    tap_ok(rc == FSDP_ERR_INVALID, "%s: a donor that lends already refused as a borrower: %s", name,
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_model_destroy(z);
    z = NULL;
    rc = make(s, &z);
    rc = rc ? rc : z->ops->reserve(z);
    rc = rc ? rc : fsdp_model_share_workspace(z, x);
    tap_ok(rc == FSDP_ERR_UNSUPPORTED, "%s: sharing after reserve refused: %s", name,
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_model_destroy(z);
    fsdp_model_destroy(w);
    fsdp_model_destroy(y);
}

/* extra: the workspace bytes an instance keeps besides dres (Llama's RoPE tables) */
static void run(const char *name, const struct fsdp_model_spec *s, size_t C, int V, size_t extra)
{
    struct fsdp_model *r = NULL, *x = NULL, *y = NULL;
    float **params = calloc((size_t)s->n_units, sizeof(float *));
    for (int u = 0; u < s->n_units; u++) {
        params[u] = malloc(s->unit_numel[u] * sizeof(float));
    }
    fsdp_model_init_params(s, 11, params);
    for (int u = 0; u < s->n_units; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            params[u][i] += 0.05f * rnd();
        }
    }
    struct mb ra, rb, a, b;
    mb_init(&ra, s, C, V);
    mb_init(&rb, s, C, V);
    mb_init(&a, s, C, V); /* then the same batches and inputs, gradients of their own */
    mb_init(&b, s, C, V);
    memcpy(a.in, ra.in, (size_t)B * T * C * sizeof(float));
    memcpy(b.in, rb.in, (size_t)B * T * C * sizeof(float));
    memcpy(a.dout, ra.dout, (size_t)B * T * C * sizeof(float));
    memcpy(b.dout, rb.dout, (size_t)B * T * C * sizeof(float));
    memcpy(a.tok, ra.tok, sizeof(a.tok)), memcpy(a.tgt, ra.tgt, sizeof(a.tgt));
    memcpy(b.tok, rb.tok, sizeof(b.tok)), memcpy(b.tgt, rb.tgt, sizeof(b.tgt));

    /* the reference: one instance, one micro-batch after the other */
    int rc = make(s, &r);
    rc = rc ? rc : r->ops->reserve(r);
    rc = rc ? rc : fwd(r, params, &ra);
    rc = rc ? rc : bwd(r, params, &ra);
    rc = rc ? rc : take_dres(r, &ra);
    rc = rc ? rc : fwd(r, params, &rb);
    rc = rc ? rc : bwd(r, params, &rb);
    rc = rc ? rc : take_dres(r, &rb);
    tap_ok(rc == 0, "%s: the reference runs (%s)", name, rc ? fsdp_err_msg() : "");

    rc = make(s, &x);
    rc = rc ? rc : make(s, &y);
    size_t whole = rc ? 0 : y->ops->workspace_bytes(y);
    int shared = rc ? rc : fsdp_model_share_workspace(y, x);
    size_t own = y ? y->ops->workspace_bytes(y) : 0;
    tap_ok(shared == 1 && own == (((size_t)B * T * C + 15) & ~(size_t)15) * sizeof(float) + extra &&
               own < whole && x->ops->workspace_bytes(x) == whole,
           "%s: the borrower keeps its dres only: %zu of %zu bytes", name, own, whole);
    rc = shared < 0 ? shared : y->ops->reserve(y);
    tap_ok(rc == FSDP_ERR_INTERNAL, "%s: a donor not yet reserved refused: %s", name,
           fsdp_err_msg());
    fsdp_err_clear();
    rc = x->ops->reserve(x);
    rc = rc ? rc : y->ops->reserve(y);
    rc = rc ? rc : pair(x, y, params, &a, &b, 0);
    tap_ok(rc == 0 && same(s, &ra, &a, C) && same(s, &rb, &b, C),
           "%s: F(a) F(b) B(b) B(a) on the sharing pair equals one after the other, bitwise "
           "(losses %.6f %.6f)",
           name, a.loss, b.loss);
    zero_grads(s, &a), zero_grads(s, &b);
    rc = rc ? rc : pair(x, y, params, &a, &b, 1);
    tap_ok(rc == 0 && same(s, &ra, &a, C) && same(s, &rb, &b, C), "%s: F(a) F(b) B(a) B(b) too",
           name);
    refusals(name, s, x);

    fsdp_model_destroy(y);
    fsdp_model_destroy(x);
    fsdp_model_destroy(r);
    mb_free(&ra, s), mb_free(&rb, s), mb_free(&a, s), mb_free(&b, s);
    for (int u = 0; u < s->n_units; u++) {
        free(params[u]);
    }
    free(params);
}

/* both cuts: the blocks and the head, the blocks alone */
static void run_cuts(const char *arch, const struct fsdp_model_spec *s, size_t C, int V,
                     size_t extra)
{
    for (int cut = 0; cut < 2; cut++) {
        char name[96];
        hi_unit = s->n_units - 1 - cut;
        snprintf(name, sizeof(name), "%s, units [1, %d]%s", arch, hi_unit, cut ? " (no head)" : "");
        run(name, s, C, V, extra);
    }
}

int main(void)
{
    for (int tied = 1; tied >= 0; tied--) {
        struct fsdp_gpt2_config c = {.vocab_size = 40,
                                     .context = T,
                                     .n_layer = 2,
                                     .n_head = 2,
                                     .n_embd = 16,
                                     .ln_eps = 1e-5f,
                                     .tied = tied};
        struct fsdp_model_spec *s = NULL;
        if (fsdp_gpt2_spec_create(&c, &s) < 0) {
            tap_ok(0, "gpt2 spec: %s", fsdp_err_msg());
            return tap_done();
        }
        run_cuts(tied ? "gpt2 tied" : "gpt2 untied", s, 16, 40, 0);
        fsdp_model_spec_destroy(s);
    }
    for (int v = 0; v < 2; v++) {
        struct fsdp_llama_config c = {.vocab_size = 37,
                                      .context = T,
                                      .n_layer = 2,
                                      .n_head = v ? 3 : 4,
                                      .n_kv_head = v ? 1 : 2,
                                      .n_embd = v ? 18 : 24,
                                      .ffn_hidden = 20,
                                      .norm_eps = 1e-5f,
                                      .rope_theta = 10000.0f,
                                      .rope_factor = 1.0f,
                                      .rope_low_freq = 1.0f,
                                      .rope_high_freq = 4.0f,
                                      .rope_original = T,
                                      .tied = !v,
                                      .attn_bias = v};
        struct fsdp_model_spec *s = NULL;
        if (fsdp_llama_spec_create(&c, &s) < 0) {
            tap_ok(0, "llama spec: %s", fsdp_err_msg());
            return tap_done();
        }
        size_t hs = (size_t)(c.n_embd / c.n_head), rope = 2 * (size_t)T * (hs / 2) * sizeof(float);
        run_cuts(v ? "llama MQA untied" : "llama GQA tied", s, (size_t)c.n_embd, 37, rope);
        fsdp_model_spec_destroy(s);
    }
    return tap_done();
}
