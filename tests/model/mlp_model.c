/*
 * mlp_model.c - the "mlp" test architecture (mlp_model.h): config checks,
 * parameter table, registration and the model ops over units.
 *
 * Every product sums in double and rounds once, and every parameter
 * gradient element gets one += per backward (wte: one per distinct token,
 * plus the tied head's), so results do not depend on how a driver splits
 * or places the unit buffers. Activations are this model's; parameters and
 * gradients are the caller's (set_unit).
 */
#include "config.h"
#include "tests/model/mlp_model.h"
#include "model/model.h"
#include "compute/device.h"
#include "core/error.h"
#include "core/util.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fsdp_test_mlp_config mlp_cfg;

static int mlp_check(const char *field, int v, int lo, int hi)
{
    if (v < lo || v > hi) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: %s %d out of range [%d, %d]", field, v, lo, hi);
    }
    return 0;
}

static int mlp_validate(const void *cfg)
{
    const mlp_cfg *c = cfg;
    FSDP_CHECK(mlp_check("vocab_size", c->vocab_size, 1, 1 << 20));
    FSDP_CHECK(mlp_check("context", c->context, 1, 1 << 16));
    FSDP_CHECK(mlp_check("n_embd", c->n_embd, 1, 1 << 16));
    FSDP_CHECK(mlp_check("n_hidden", c->n_hidden, 1, 1 << 18));
    FSDP_CHECK(mlp_check("n_layer", c->n_layer, 1, 1024));
    return mlp_check("tied", c->tied, 0, 1);
}

static int mlp_spec_create(const void *cfg, struct fsdp_model_spec **out)
{
    FSDP_CHECK(mlp_validate(cfg));
    const mlp_cfg *c = cfg;
    size_t V = (size_t)c->vocab_size, C = (size_t)c->n_embd, H = (size_t)c->n_hidden;
    int L = c->n_layer;
    struct fsdp_model_spec *s;
    FSDP_CHECK(fsdp_model_spec_alloc(&fsdp_test_mlp_arch, L + 2, 4 * (size_t)L + 4, &s));
    memcpy(s->cfg, c, sizeof(*c));
    s->vocab_size = c->vocab_size;
    s->context = c->context;
    const float STD = 0.02f;
    const enum fsdp_tp_place R = FSDP_TP_REPLICATE;
    char name[FSDP_PARAM_NAME_MAX];
    int rc = 0;
    /* matmul weights decay; embeddings and biases do not */
    rc |= fsdp_model_spec_add(s, 0, "wte.weight", V, C, 2, FSDP_INIT_NORMAL, STD, 0, R);
    rc |= fsdp_model_spec_add(s, 0, "wpe.weight", (size_t)c->context, C, 2, FSDP_INIT_NORMAL, STD,
                              0, R);
    /* a block's buffer: fc1.weight (H, C) | fc1.bias (H) | fc2.weight (C, H) | fc2.bias (C) */
    const struct { const char *sfx; size_t rows, cols; int w; } blk[] = {
        {"fc1.weight", H, C, 1}, {"fc1.bias", H, 1, 0},
        {"fc2.weight", C, H, 1}, {"fc2.bias", C, 1, 0}};
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < 4; k++) {
            int w = blk[k].w; /* not cols > 1: C or H may be 1 */
            snprintf(name, sizeof(name), "h.%d.%s", l, blk[k].sfx);
            rc |= fsdp_model_spec_add(s, 1 + l, name, blk[k].rows, blk[k].cols, 1 + w,
                                      w ? FSDP_INIT_NORMAL : FSDP_INIT_ZEROS, w ? STD : 0.0f, w, R);
        }
    }
    if (c->tied) {
        rc |= fsdp_model_spec_tie(s, L + 1, "wte.weight");
    } else {
        rc |= fsdp_model_spec_add(s, L + 1, "lm_head.weight", V, C, 2, FSDP_INIT_NORMAL, STD, 1, R);
    }
    rc |= fsdp_model_spec_add(s, L + 1, "lm_head.bias", V, 1, 1, FSDP_INIT_ZEROS, 0.0f, 0, R);
    if (rc != 0) {
        fsdp_model_spec_destroy(s);
        return FSDP_ERR_INTERNAL;
    }
    *out = s;
    return 0;
}

// ----------------------------------------------------------------------------
// products: (N, I) rows in, (N, O) rows out, W (O, I) like torch.nn.Linear;
// relu_in reads the input through max(0, .) (a block's hidden layer)

static double mlp_in(float x, int relu_in)
{
    return relu_in && x < 0.0f ? 0.0 : (double)x;
}

/* out = in W^T + b (+ res) */
static void mlp_linear(float *out, const float *in, const float *W, const float *b,
                       const float *res, size_t N, size_t I, size_t O, int relu_in)
{
    for (size_t r = 0; r < N; r++) {
        for (size_t o = 0; o < O; o++) {
            double s = (double)b[o] + (res ? (double)res[r * O + o] : 0.0);
            for (size_t i = 0; i < I; i++) s += W[o * I + i] * mlp_in(in[r * I + i], relu_in);
            out[r * O + o] = (float)s;
        }
    }
}

/* dW += dout^T in, db += column sums of dout */
static void mlp_linear_dw(float *dW, float *db, const float *dout, const float *in, size_t N,
                          size_t I, size_t O, int relu_in)
{
    for (size_t o = 0; o < O; o++) {
        double sb = 0.0;
        for (size_t r = 0; r < N; r++) sb += dout[r * O + o];
        db[o] += (float)sb;
        for (size_t i = 0; i < I; i++) {
            double s = 0.0;
            for (size_t r = 0; r < N; r++) s += dout[r * O + o] * mlp_in(in[r * I + i], relu_in);
            dW[o * I + i] += (float)s;
        }
    }
}

/* din += dout W */
static void mlp_linear_dx(float *din, const float *dout, const float *W, size_t N, size_t I,
                          size_t O)
{
    for (size_t r = 0; r < N; r++) {
        for (size_t i = 0; i < I; i++) {
            double s = din[r * I + i];
            for (size_t o = 0; o < O; o++) s += (double)dout[r * O + o] * W[o * I + i];
            din[r * I + i] = (float)s;
        }
    }
}

// ----------------------------------------------------------------------------
// the instance

struct mlp {
    struct fsdp_model base;
    const mlp_cfg *c;
    size_t BTmax;                    /* max_B * max_T: rows every buffer is sized for */
    int max_B, max_T, B, T;
    const int32_t *tokens, *targets; /* (B, T), borrowed; tokens NULL: no batch */
    struct fsdp_device *dev;         /* NULL: the unit buffers are host memory */
    float **dparams, **dgrads;       /* (n_units,) the caller's unit buffers */
    float **params, **grads;         /* (n_units,) what the host computes on: the caller's
                                      * buffers, or with dev their copies in host */
    float *host;                     /* with dev: (2, total_numel) the copies */
    unsigned char *ckpt;             /* (L,) recompute the block's hidden layer in its backward */
    int fwd_next, bwd_next;          /* the unit each direction runs next; -1: none */
    double divisor;
    float scale, loss;
    size_t n_kept;
    float *act, *work;               /* all of the below; act laid out for the ckpt flags */
    float *x;                        /* (L+1, BT, C) each block's input; x_L feeds the head */
    float **hid;                     /* (L,) -> (BT, H) pre-activations; checkpointed: one shared */
    float *logits;                   /* (BT, V) */
    float *dx, *dh, *dlogits;        /* (BT, C), (BT, H), (BT, V): dx carries d(x_l) down */
    double *lse;                     /* (BT,) log-sum-exp of each kept row */
};

/* Floats of saved activations: every x_l, a hidden slot per block kept
 * plus one shared by the checkpointed ones, the logits. */
static size_t mlp_act_floats(const struct mlp *m, size_t *slots)
{
    const mlp_cfg *c = m->c;
    size_t kept = 0, any = 0;
    for (int l = 0; l < c->n_layer; l++) kept += !m->ckpt[l], any |= m->ckpt[l];
    *slots = kept + any;
    return m->BTmax * ((size_t)(c->n_layer + 1) * (size_t)c->n_embd +
                       *slots * (size_t)c->n_hidden + (size_t)c->vocab_size);
}

static int mlp_reserve(struct fsdp_model *base)
{
    struct mlp *m = (struct mlp *)base;
    size_t BT = m->BTmax, C = (size_t)m->c->n_embd, H = (size_t)m->c->n_hidden, slots;
    size_t n = mlp_act_floats(m, &slots);
    if (!m->act) m->act = fsdp_calloc(n * sizeof(float));
    if (!m->work) m->work = fsdp_calloc(BT * (C + H + (size_t)m->c->vocab_size) * sizeof(float));
    if (!m->act || !m->work) {
        return fsdp_err(FSDP_ERR_NOMEM, "mlp: %zu activation floats", n);
    }
    m->x = m->act;
    float *h = m->act + (size_t)(m->c->n_layer + 1) * BT * C, *shared = h + (slots - 1) * BT * H;
    for (int l = 0; l < m->c->n_layer; l++) {
        m->hid[l] = m->ckpt[l] ? shared : h;
        h += m->ckpt[l] ? 0 : BT * H;
    }
    m->logits = m->act + n - BT * (size_t)m->c->vocab_size;
    m->dx = m->work, m->dh = m->dx + BT * C, m->dlogits = m->dh + BT * H;
    return 0;
}

static void mlp_destroy(struct fsdp_model *base)
{
    struct mlp *m = (struct mlp *)base;
    if (m) {
        fsdp_free(m->act), fsdp_free(m->work), fsdp_free(m->host);
        free(m->lse), free(m->hid), free(m->ckpt), free(m->grads), free(m->params);
        free(m->dgrads), free(m->dparams), free(m);
    }
}

static int mlp_create(const struct fsdp_model_spec *spec, const struct fsdp_model_opts *o,
                      struct fsdp_model **out)
{
    const mlp_cfg *c = spec->cfg;
    if (spec->arch != &fsdp_test_mlp_arch || o->max_B < 1 || o->max_T < 1 ||
        o->max_T > c->context) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: a %s spec, batch %d x %d (need mlp, B >= 1, "
                        "1 <= T <= context)", spec->arch ? spec->arch->name : "(none)", o->max_B,
                        o->max_T);
    }
    struct mlp *m = calloc(1, sizeof(*m));
    if (!m) {
        return fsdp_err(FSDP_ERR_NOMEM, "mlp model");
    }
    *m = (struct mlp){.base = {fsdp_model_ops_of(spec), spec}, .c = c, .max_B = o->max_B,
                      .max_T = o->max_T, .BTmax = (size_t)o->max_B * (size_t)o->max_T,
                      .fwd_next = -1, .bwd_next = -1, .scale = 1.0f, .loss = NAN,
                      .dev = o->dev};
    m->params = calloc((size_t)spec->n_units, sizeof(float *));
    m->grads = calloc((size_t)spec->n_units, sizeof(float *));
    m->dparams = calloc((size_t)spec->n_units, sizeof(float *));
    m->dgrads = calloc((size_t)spec->n_units, sizeof(float *));
    if (m->dev) {
        m->host = fsdp_calloc(2 * spec->total_numel * sizeof(float));
    }
    m->ckpt = calloc((size_t)c->n_layer, 1);
    m->hid = calloc((size_t)c->n_layer, sizeof(float *));
    m->lse = calloc(m->BTmax, sizeof(double));
    if (!m->params || !m->grads || !m->dparams || !m->dgrads || !m->ckpt || !m->hid || !m->lse ||
        (m->dev && !m->host)) {
        mlp_destroy(&m->base);
        return fsdp_err(FSDP_ERR_NOMEM, "mlp model tables");
    }
    *out = &m->base;
    return 0;
}

/* Blocks are units 1..L; the embedding and the head have nothing to drop.
 * The layout changes, so the batch must be set again. */
static int mlp_set_checkpoint(struct fsdp_model *base, int u, int on)
{
    struct mlp *m = (struct mlp *)base;
    if (m->bwd_next >= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: checkpointing changed between forward and "
                        "backward");
    }
    for (int l = 0; l < m->c->n_layer; l++) {
        if (u < 0 || u == l + 1) m->ckpt[l] = on ? 1 : 0;
    }
    fsdp_free(m->act);
    m->act = NULL, m->tokens = NULL;
    return 0;
}

static int mlp_set_unit(struct fsdp_model *base, int u, void *params, enum fsdp_dtype pt,
                        float *grads)
{
    struct mlp *m = (struct mlp *)base;
    if (u < 0 || u >= base->spec->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: unit %d out of range [0, %d)", u,
                        base->spec->n_units);
    }
    if (pt != FSDP_F32) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "mlp: parameters in %s (this model computes in f32 "
                        "only: use --param-dtype f32)",
                        fsdp_dtype_name(pt));
    }
    m->dparams[u] = params, m->dgrads[u] = grads;
    if (!m->dev) {
        m->params[u] = params, m->grads[u] = grads;
        return 0;
    }
    size_t off = 0, n = base->spec->total_numel;
    for (int k = 0; k < u; k++) off += base->spec->unit_numel[k];
    m->params[u] = params ? m->host + off : NULL;
    m->grads[u] = grads ? m->host + n + off : NULL;
    return 0;
}

/* With a device: unit u's parameters (and gradients) into their host copies. */
static int mlp_pull(struct mlp *m, int u, int grads)
{
    size_t bytes = m->base.spec->unit_numel[u] * sizeof(float);
    if (m->dev) {
        FSDP_CHECK(fsdp_device_read(m->dev, m->params[u], m->dparams[u], bytes));
        if (grads) {
            FSDP_CHECK(fsdp_device_read(m->dev, m->grads[u], m->dgrads[u], bytes));
        }
    }
    return 0;
}

/* With a device: unit u's gradients back from their host copy. */
static int mlp_push(struct mlp *m, int u)
{
    size_t bytes = m->base.spec->unit_numel[u] * sizeof(float);
    return m->dev ? fsdp_device_write(m->dev, m->dgrads[u], m->grads[u], bytes) : 0;
}

static void mlp_set_loss_seed(struct fsdp_model *base, double divisor, float scale)
{
    ((struct mlp *)base)->divisor = divisor, ((struct mlp *)base)->scale = scale;
}

/* Targets equal to -1 are ignored (GPT-2's default ignore index). */
static int mlp_set_batch(struct fsdp_model *base, const int32_t *tokens, const int32_t *targets,
                         int B, int T)
{
    struct mlp *m = (struct mlp *)base;
    int V = m->c->vocab_size;
    if (B < 1 || B > m->max_B || T < 1 || T > m->max_T || !tokens) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: batch %d x %d (tokens %p) exceeds the model's "
                        "%d x %d", B, T, (const void *)tokens, m->max_B, m->max_T);
    }
    for (size_t i = 0; i < (size_t)B * (size_t)T; i++) {
        int32_t g = targets ? targets[i] : 0;
        if (tokens[i] < 0 || tokens[i] >= V || g < -1 || g >= V) {
            return fsdp_err(FSDP_ERR_INVALID, "mlp: token %d / target %d at row %zu out of range "
                            "[0, %d)", (int)tokens[i], (int)g, i, V);
        }
    }
    FSDP_CHECK(mlp_reserve(base));
    m->B = B, m->T = T, m->tokens = tokens, m->targets = targets;
    m->fwd_next = 0, m->bwd_next = -1, m->loss = NAN, m->n_kept = 0;
    return 0;
}

// ----------------------------------------------------------------------------
// forward

/* The head's weight and bias in bufs: its own, or unit 0's wte when tied. */
static void mlp_head(const struct mlp *m, float **bufs, float **w, float **b)
{
    size_t VC = (size_t)m->c->vocab_size * (size_t)m->c->n_embd;
    *w = m->c->tied ? bufs[0] : bufs[m->c->n_layer + 1];
    *b = bufs[m->c->n_layer + 1] + (m->c->tied ? 0 : VC);
}

/* fc1 into the block's hidden slot; full = 0 stops there (the recompute) */
static void mlp_block_forward(struct mlp *m, int l, int full)
{
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->c->n_embd, H = (size_t)m->c->n_hidden;
    const float *w = m->params[1 + l], *x = m->x + (size_t)l * m->BTmax * C;
    mlp_linear(m->hid[l], x, w, w + H * C, NULL, BT, C, H, 0);
    if (full) {
        mlp_linear(m->x + (size_t)(l + 1) * m->BTmax * C, m->hid[l], w + H * C + H,
                   w + 2 * H * C + H, x, BT, H, C, 1);
    }
}

static void mlp_embed_forward(struct mlp *m)
{
    size_t C = (size_t)m->c->n_embd, V = (size_t)m->c->vocab_size;
    const float *wte = m->params[0], *wpe = m->params[0] + V * C;
    for (size_t r = 0; r < (size_t)m->B * m->T; r++) {
        for (size_t i = 0; i < C; i++) {
            m->x[r * C + i] = wte[(size_t)m->tokens[r] * C + i] + wpe[(r % (size_t)m->T) * C + i];
        }
    }
}

/* the logits, then with targets each kept row's log-sum-exp and loss, summed in row order */
static void mlp_head_forward(struct mlp *m)
{
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->c->n_embd, V = (size_t)m->c->vocab_size;
    float *w, *b, *lg = m->logits;
    mlp_head(m, m->params, &w, &b);
    mlp_linear(lg, m->x + (size_t)m->c->n_layer * m->BTmax * C, w, b, NULL, BT, C, V, 0);
    double sum = 0.0;
    for (size_t r = 0; m->targets && r < BT; r++) {
        if (m->targets[r] == -1) continue;
        double mx = -INFINITY, s = 0.0;
        for (size_t v = 0; v < V; v++) mx = fmax(mx, lg[r * V + v]);
        for (size_t v = 0; v < V; v++) s += exp((double)lg[r * V + v] - mx);
        m->lse[r] = mx + log(s);
        sum += m->lse[r] - lg[r * V + (size_t)m->targets[r]];
        m->n_kept++;
    }
    m->loss = m->n_kept ? (float)(sum / (double)m->n_kept) : NAN;
    m->bwd_next = m->targets ? m->c->n_layer + 1 : -1;
}

static int mlp_forward_unit(struct fsdp_model *base, int u)
{
    struct mlp *m = (struct mlp *)base;
    int L = m->c->n_layer, tied_head = u == L + 1 && m->c->tied;
    if (!m->tokens || u != m->fwd_next) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: forward of unit %d out of order (next: %d%s)", u,
                        m->fwd_next, m->tokens ? "" : ", no batch set");
    }
    if (!m->params[u] || (tied_head && !m->params[0])) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: forward: unit %d's parameters are not set%s", u,
                        tied_head ? " (the tied head also reads unit 0)" : "");
    }
    FSDP_CHECK(mlp_pull(m, u, 0));
    if (tied_head) {
        FSDP_CHECK(mlp_pull(m, 0, 0));
    }
    if (u == 0) {
        mlp_embed_forward(m);
    } else if (u <= L) {
        mlp_block_forward(m, u - 1, 1);
    } else {
        mlp_head_forward(m);
    }
    m->fwd_next = u + 1;
    return 0;
}

// ----------------------------------------------------------------------------
// backward: dx holds d(objective)/d(x_l) between units

/* d(objective)/d(loss_r) = scale / divisor for each kept row, GPT-2's seed */
static void mlp_head_backward(struct mlp *m)
{
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->c->n_embd, V = (size_t)m->c->vocab_size;
    double div = m->divisor > 0 ? m->divisor : (double)m->n_kept;
    float alpha = div > 0 ? (float)((double)m->scale / div) : 0.0f, *w, *b, *dw, *db;
    for (size_t r = 0; r < BT; r++) {
        for (size_t v = 0; v < V; v++) {
            double p = m->targets[r] == -1 ? 0.0 : exp((double)m->logits[r * V + v] - m->lse[r]);
            m->dlogits[r * V + v] = (float)(alpha * (p - (v == (size_t)m->targets[r])));
        }
    }
    mlp_head(m, m->params, &w, &b);
    mlp_head(m, m->grads, &dw, &db);
    mlp_linear_dw(dw, db, m->dlogits, m->x + (size_t)m->c->n_layer * m->BTmax * C, BT, C, V, 0);
    memset(m->dx, 0, BT * C * sizeof(float));
    mlp_linear_dx(m->dx, m->dlogits, w, BT, C, V);
}

static void mlp_block_backward(struct mlp *m, int l)
{
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->c->n_embd, H = (size_t)m->c->n_hidden;
    const float *w = m->params[1 + l];
    float *g = m->grads[1 + l], *h = m->hid[l];
    if (m->ckpt[l]) {
        mlp_block_forward(m, l, 0);
    }
    memset(m->dh, 0, BT * H * sizeof(float));
    mlp_linear_dx(m->dh, m->dx, w + H * C + H, BT, H, C);
    for (size_t i = 0; i < BT * H; i++) m->dh[i] = h[i] > 0.0f ? m->dh[i] : 0.0f;
    mlp_linear_dw(g + H * C + H, g + 2 * H * C + H, m->dx, h, BT, H, C, 1);
    mlp_linear_dw(g, g + H * C, m->dh, m->x + (size_t)l * m->BTmax * C, BT, C, H, 0);
    mlp_linear_dx(m->dx, m->dh, w, BT, C, H); /* the residual path: dx stays and adds */
}

/* one += per wte row used (the sum over its token's rows) and per wpe row */
static void mlp_embed_backward(struct mlp *m)
{
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->c->n_embd, V = (size_t)m->c->vocab_size;
    float *dwte = m->grads[0], *dwpe = m->grads[0] + V * C;
    for (size_t r = 0; r < BT; r++) {
        size_t first = 0;
        while (m->tokens[first] != m->tokens[r]) first++;
        for (size_t i = 0; i < C && first == r; i++) {
            double s = 0.0;
            for (size_t q = r; q < BT; q++) {
                s += m->tokens[q] == m->tokens[r] ? m->dx[q * C + i] : 0.0;
            }
            dwte[(size_t)m->tokens[r] * C + i] += (float)s;
        }
    }
    for (size_t t = 0; t < (size_t)m->T; t++) {
        for (size_t i = 0; i < C; i++) {
            double s = 0.0;
            for (size_t b = 0; b < (size_t)m->B; b++) s += m->dx[(b * (size_t)m->T + t) * C + i];
            dwpe[t * C + i] += (float)s;
        }
    }
}

static int mlp_backward_unit(struct fsdp_model *base, int u)
{
    struct mlp *m = (struct mlp *)base;
    int L = m->c->n_layer, tied_head = u == L + 1 && m->c->tied;
    if (m->bwd_next < 0 || u != m->bwd_next) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: backward of unit %d out of order (next: %d; -1: "
                        "no forward with targets)", u, m->bwd_next);
    }
    if (!m->params[u] || !m->grads[u] || (tied_head && (!m->params[0] || !m->grads[0]))) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: backward: unit %d's parameters or gradients are "
                        "not set%s", u, tied_head ? " (the tied head also uses unit 0's)" : "");
    }
    FSDP_CHECK(mlp_pull(m, u, 1));
    if (tied_head) {
        FSDP_CHECK(mlp_pull(m, 0, 1));
    }
    if (u == 0) {
        mlp_embed_backward(m);
    } else if (u <= L) {
        mlp_block_backward(m, u - 1);
    } else {
        mlp_head_backward(m);
    }
    FSDP_CHECK(mlp_push(m, u));
    if (tied_head) {
        FSDP_CHECK(mlp_push(m, 0));
    }
    m->bwd_next = u - 1;
    return 0;
}

// ----------------------------------------------------------------------------
// results, accounting, registration

static float mlp_loss(const struct fsdp_model *base)
{
    return ((const struct mlp *)base)->loss;
}

/* The whole head is computed at once: opts->head_chunk does not apply. */
static int mlp_logits(struct fsdp_model *base, size_t row0, size_t rows, float *out)
{
    struct mlp *m = (struct mlp *)base;
    size_t BT = (size_t)m->B * m->T, V = (size_t)m->c->vocab_size;
    if (!m->tokens || m->fwd_next != base->spec->n_units || row0 > BT || rows > BT - row0) {
        return fsdp_err(FSDP_ERR_INVALID, "mlp: logits of rows [%zu, +%zu): no full forward of "
                        "this batch, or outside its %zu rows", row0, rows, BT);
    }
    memcpy(out, m->logits + row0 * V, rows * V * sizeof(float));
    return 0;
}

static size_t mlp_activation_bytes(const struct fsdp_model *base)
{
    const struct mlp *m = (const struct mlp *)base;
    size_t slots;
    return mlp_act_floats(m, &slots) * sizeof(float) + m->BTmax * sizeof(double);
}

static size_t mlp_workspace_bytes(const struct fsdp_model *base)
{
    const struct mlp *m = (const struct mlp *)base;
    return m->BTmax * (size_t)(m->c->n_embd + m->c->n_hidden + m->c->vocab_size) * sizeof(float);
}

/* 6 per multiply-add of a matmul weight (the head's is wte when tied) */
static double mlp_flops_per_token(const struct fsdp_model_spec *spec, int T)
{
    const mlp_cfg *c = spec->cfg;
    (void)T;
    return 6.0 * ((double)c->n_layer * 2.0 * c->n_hidden * c->n_embd +
                  (double)c->vocab_size * c->n_embd);
}

static const struct fsdp_model_ops mlp_ops = {
    .size = sizeof(struct fsdp_model_ops),
    .name = FSDP_TEST_MLP_ARCH,
    .create = mlp_create,
    .destroy = mlp_destroy,
    .set_checkpoint = mlp_set_checkpoint,
    .reserve = mlp_reserve,
    .set_unit = mlp_set_unit,
    .set_loss_seed = mlp_set_loss_seed,
    .set_batch = mlp_set_batch,
    .forward_unit = mlp_forward_unit,
    .backward_unit = mlp_backward_unit,
    .loss = mlp_loss,
    .logits = mlp_logits,
    .activation_bytes = mlp_activation_bytes,
    .workspace_bytes = mlp_workspace_bytes,
    .flops_per_token = mlp_flops_per_token,
};

#define MLP_ATTR(field, type) {#field, type, offsetof(mlp_cfg, field)}
static const struct fsdp_attr_desc mlp_attrs[] = {
    MLP_ATTR(vocab_size, FSDP_ATTR_INT), MLP_ATTR(context, FSDP_ATTR_INT),
    MLP_ATTR(n_embd, FSDP_ATTR_INT),     MLP_ATTR(n_hidden, FSDP_ATTR_INT),
    MLP_ATTR(n_layer, FSDP_ATTR_INT),    MLP_ATTR(tied, FSDP_ATTR_BOOL),
};
#undef MLP_ATTR

const struct fsdp_arch fsdp_test_mlp_arch = {
    .size = sizeof(struct fsdp_arch),
    .name = FSDP_TEST_MLP_ARCH,
    .cfg_size = sizeof(mlp_cfg),
    .attrs = mlp_attrs,
    .n_attrs = sizeof(mlp_attrs) / sizeof(mlp_attrs[0]),
    .validate = mlp_validate,
    .spec_create = mlp_spec_create,
    .ops = &mlp_ops,
    .hf = &fsdp_test_mlp_hf,
};

int fsdp_test_mlp_register(void)
{
    return fsdp_model_register(&fsdp_test_mlp_arch);
}
