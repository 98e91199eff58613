/*
 * test_mlp_model.c - the test-only "mlp" architecture (mlp_model.h) through
 * the generic model interface, tied and untied (V=11, T=6, C=8, H=12, L=2):
 *   - registration and the parameter table's init and decay flags;
 *   - the loss against a double-precision reference written here, and every
 *     element of every parameter gradient against its central differences;
 *   - accumulation over two backwards, the loss seed, checkpointing;
 *   - a driver that hands each unit fresh buffers just before it runs (as
 *     the sharding engine does) against fsdp_model_forward/backward, bitwise;
 *   - a model file written and read back, and a bad n_hidden refused by name.
 */
#include "config.h"
#include "tests/model/mlp_model.h"
#include "model/model.h"
#include "io/h5/model_file.h"
#include "core/error.h"
#include "tests/kernels/ref_kernels.h"
#include "tests/tap.h"

#include <hdf5.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TB 2
#define TT 6

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static int32_t tok[TB * TT], tgt[TB * TT];

struct bufs {
    int n;
    float **p, **g; /* (n,) unit params and grads */
    double **pd;    /* (n,) the params in double, for the reference */
};

static void bufs_alloc(struct bufs *b, const struct fsdp_model_spec *s)
{
    b->n = s->n_units;
    b->p = calloc((size_t)b->n, sizeof(float *)), b->g = calloc((size_t)b->n, sizeof(float *));
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

static struct fsdp_model_spec *make_spec(int tied)
{
    struct fsdp_test_mlp_config c = {.vocab_size = 11, .context = TT, .n_embd = 8,
                                     .n_hidden = 12, .n_layer = 2, .tied = tied};
    struct fsdp_model_spec *s = NULL;
    if (fsdp_test_mlp_arch.spec_create(&c, &s) < 0) {
        fprintf(stderr, "spec: %s\n", fsdp_err_msg());
        abort();
    }
    return s;
}

/* the init, then a perturbation so that biases are not zero */
static void fill_params(const struct fsdp_model_spec *s, struct bufs *b)
{
    fsdp_model_init_params(s, 7, b->p);
    for (int u = 0; u < b->n; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            b->p[u][i] += (float)(0.2 * ref_rand(&rng));
            b->pd[u][i] = b->p[u][i];
        }
    }
}

// ----------------------------------------------------------------------------
// the reference, straight from the definition in mlp_model.h

static double *P(const struct fsdp_model_spec *s, double *const *u, const char *fmt, int l)
{
    char name[FSDP_PARAM_NAME_MAX];
    snprintf(name, sizeof(name), fmt, l);
    long i = fsdp_model_spec_find(s, name);
    if (i < 0) {
        fprintf(stderr, "reference: no parameter %s\n", name);
        abort();
    }
    return u[s->params[i].unit] + s->params[i].offset;
}

static double ref_loss(const struct fsdp_model_spec *s, double *const *u)
{
    const struct fsdp_test_mlp_config *c = s->cfg;
    size_t BT = TB * TT, C = (size_t)c->n_embd, H = (size_t)c->n_hidden, V = (size_t)c->vocab_size;
    double *x = malloc(BT * C * sizeof(double)), *h = malloc(BT * H * sizeof(double));
    double *y = malloc(BT * C * sizeof(double)), *lg = malloc(BT * V * sizeof(double));
    ref_encoder(x, tok, P(s, u, "wte.weight", 0), P(s, u, "wpe.weight", 0), TB, TT, (int)C);
    for (int l = 0; l < c->n_layer; l++) {
        ref_matmul(h, x, P(s, u, "h.%d.fc1.weight", l), P(s, u, "h.%d.fc1.bias", l), BT, C, H);
        for (size_t i = 0; i < BT * H; i++) h[i] = h[i] > 0 ? h[i] : 0;
        ref_matmul(y, h, P(s, u, "h.%d.fc2.weight", l), P(s, u, "h.%d.fc2.bias", l), BT, H, C);
        for (size_t i = 0; i < BT * C; i++) x[i] += y[i];
    }
    ref_matmul(lg, x, P(s, u, c->tied ? "wte.weight" : "lm_head.weight", 0),
               P(s, u, "lm_head.bias", 0), BT, C, V);
    double loss = ref_crossentropy(lg, tgt, BT, V, -1);
    free(x), free(h), free(y), free(lg);
    return loss;
}

// ----------------------------------------------------------------------------
// drivers

static int step(struct fsdp_model *m, struct bufs *b, int zero, float *loss)
{
    for (int u = 0; u < b->n; u++) {
        m->ops->set_unit(m, u, b->p[u], FSDP_F32, b->g[u]);
        if (zero) memset(b->g[u], 0, m->spec->unit_numel[u] * sizeof(float));
    }
    FSDP_CHECK(fsdp_model_forward(m, tok, tgt, TB, TT, loss));
    return fsdp_model_backward(m);
}

/* Unit u set to fresh copies of its parameters and a zeroed gradient. */
static void unit_get(struct fsdp_model *m, struct bufs *b, float **pc, float **gc, int u)
{
    size_t n = m->spec->unit_numel[u];
    if (!pc[u]) {
        pc[u] = malloc(n * sizeof(float)), gc[u] = calloc(n, sizeof(float));
        memcpy(pc[u], b->p[u], n * sizeof(float));
        m->ops->set_unit(m, u, pc[u], FSDP_F32, gc[u]);
    }
}

/* Unit u's gradient added into gout[u], its buffers dropped and unset. */
static void unit_put(struct fsdp_model *m, float **pc, float **gc, float **gout, int u)
{
    for (size_t i = 0; gout && i < m->spec->unit_numel[u]; i++) gout[u][i] += gc[u][i];
    free(pc[u]), free(gc[u]);
    pc[u] = gc[u] = NULL;
    m->ops->set_unit(m, u, NULL, FSDP_F32, NULL);
}

/* What a sharding engine does: every unit's buffers live only while it (or
 * a unit tied to it) runs; a tie's owner stays until its own backward. */
static int drive(struct fsdp_model *m, struct bufs *b, float **gout, float *loss, float *logits)
{
    const struct fsdp_model_spec *s = m->spec;
    int n = s->n_units, rc = m->ops->set_batch(m, tok, tgt, TB, TT);
    float *pc[8] = {0}, *gc[8] = {0};
    for (int u = 0; u < n && rc == 0; u++) {
        unit_get(m, b, pc, gc, u);
        rc = m->ops->forward_unit(m, u);
        if (u != 0) unit_put(m, pc, gc, NULL, u); /* 0 owns the tie */
    }
    unit_put(m, pc, gc, NULL, 0);
    *loss = m->ops->loss(m);
    rc = rc ? rc : m->ops->logits(m, 0, TB * TT, logits);
    for (int u = n - 1; u >= 0 && rc == 0; u--) {
        const struct fsdp_tie *t = fsdp_model_spec_tie_of(s, u);
        unit_get(m, b, pc, gc, u);
        if (t) unit_get(m, b, pc, gc, t->owner);
        rc = m->ops->backward_unit(m, u);
        unit_put(m, pc, gc, gout, u);
    }
    return rc;
}

static size_t diff_bits(const struct fsdp_model_spec *s, float **a, float **b, float mul)
{
    size_t bad = 0;
    for (int u = 0; u < s->n_units; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) bad += a[u][i] * mul != b[u][i];
    }
    return bad;
}

// ----------------------------------------------------------------------------

static double test_model(int tied)
{
    const char *tn = tied ? "tied" : "untied";
    struct fsdp_model_spec *s = make_spec(tied);
    struct bufs b, g0, dr;
    bufs_alloc(&b, s), bufs_alloc(&g0, s), bufs_alloc(&dr, s);
    fill_params(s, &b);
    size_t bad = 0, kept = 0;
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        int w = strstr(p->name, ".weight") != NULL, emb = strncmp(p->name, "wte", 3) == 0 ||
                                                         strncmp(p->name, "wpe", 3) == 0;
        bad += p->decay != (w && !emb) || p->init != (w ? FSDP_INIT_NORMAL : FSDP_INIT_ZEROS) ||
               (w && p->std != 0.02f) || p->tp != FSDP_TP_REPLICATE;
    }
    tap_ok(bad == 0 && s->n_units == 4 && s->n_params == (tied ? 11u : 12u) && s->n_ties == tied,
           "%s: table of %zu params in %d units, %d ties; init and decay flags (%zu wrong)", tn,
           s->n_params, s->n_units, s->n_ties, bad);

    struct fsdp_model_opts o = {.max_B = TB, .max_T = TT};
    struct fsdp_model *m = NULL;
    float loss = 0, l2 = 0, *lg0 = malloc(TB * TT * 11 * 4), *lg1 = malloc(TB * TT * 11 * 4);
    int rc = fsdp_model_create(s, &o, &m);
    rc = rc ? rc : step(m, &b, 1, &loss);
    double want = ref_loss(s, b.pd);
    for (int i = 0; i < TB * TT; i++) kept += tgt[i] != -1;
    tap_ok(rc == 0 && fabs(loss - want) <= 1e-6 * want, "%s: loss %.8f vs double reference %.8f",
           tn, (double)loss, want);

    /* central differences of the reference for every element */
    double worst = 0;
    for (size_t pi = 0; pi < s->n_params; pi++) {
        const struct fsdp_param_spec *p = &s->params[pi];
        double max_abs = 0, scale = 0;
        size_t at = 0;
        for (size_t i = 0; i < p->numel; i++) {
            double *x = b.pd[p->unit] + p->offset + i, save = *x, h = 1e-5;
            *x = save + h;
            double lp = ref_loss(s, b.pd);
            *x = save - h;
            double fd = (lp - ref_loss(s, b.pd)) / (2 * h);
            *x = save;
            double e = fabs(b.g[p->unit][p->offset + i] - fd);
            if (!(e <= max_abs)) max_abs = e, at = i;
            scale = fmax(scale, fabs(fd));
        }
        worst = fmax(worst, max_abs / scale);
        tap_ok(max_abs <= 1e-4 * scale, "%s: d loss/d %s, %zu elements: max abs err %.3g at %zu, "
               "relative to max |grad| %.3g: %.3g", tn, p->name, p->numel, max_abs, at, scale,
               max_abs / scale);
    }
    for (int u = 0; u < s->n_units; u++) memcpy(g0.g[u], b.g[u], s->unit_numel[u] * sizeof(float));

    rc = step(m, &b, 0, &l2);
    double acc = 0, gmax = 0; /* tied: wte's two += per pass round in another order */
    for (int u = 0; u < s->n_units; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            acc = fmax(acc, fabs(b.g[u][i] - 2.0 * g0.g[u][i]));
            gmax = fmax(gmax, fabs(2.0 * g0.g[u][i]));
        }
    }
    tap_ok(rc == 0 && acc <= 1e-6 * gmax, "%s: a second backward adds (max err vs 2x %.3g, max "
           "|grad| %.3g)", tn, acc, gmax);

    m->ops->set_loss_seed(m, 2.0 * (double)kept, 4.0f);
    rc = step(m, &b, 1, &l2);
    m->ops->set_loss_seed(m, 0.0, 1.0f);
    tap_ok(rc == 0 && diff_bits(s, g0.g, b.g, 2.0f) == 0,
           "%s: loss seed scale 4 / divisor 2 x %zu kept doubles every gradient exactly", tn, kept);

    size_t bytes = m->ops->activation_bytes(m);
    for (int u = -1; u <= 2; u += 3) {
        rc = m->ops->set_checkpoint(m, u, 1);
        size_t cb = m->ops->activation_bytes(m);
        rc = rc ? rc : step(m, &b, 1, &l2);
        /* one block of two: its own slot becomes the shared one, no saving */
        tap_ok(rc == 0 && l2 == loss && diff_bits(s, g0.g, b.g, 1.0f) == 0 &&
                   (u < 0 ? cb < bytes : cb == bytes),
               "%s: checkpointing %s: loss and gradients bit-identical, activations %zu -> %zu "
               "bytes",
               tn, u < 0 ? "every block" : "unit 2", bytes, cb);
        m->ops->set_checkpoint(m, -1, 0);
    }

    rc = step(m, &b, 1, &l2);
    rc = rc ? rc : m->ops->logits(m, 0, TB * TT, lg0);
    rc = rc ? rc : drive(m, &b, dr.g, &l2, lg1);
    tap_ok(rc == 0 && l2 == loss && diff_bits(s, g0.g, dr.g, 1.0f) == 0 &&
               memcmp(lg0, lg1, TB * TT * 11 * sizeof(float)) == 0,
           "%s: unit by unit on fresh buffers equals fsdp_model_forward/backward bitwise", tn);

    rc = m->ops->forward_unit(m, 1);
    tap_ok(rc == FSDP_ERR_INVALID, "%s: forward of unit 1 out of order: %s", tn, fsdp_err_msg());
    fsdp_err_clear();
    free(lg0), free(lg1);
    fsdp_model_destroy(m);
    bufs_free(&b), bufs_free(&g0), bufs_free(&dr);
    fsdp_model_spec_destroy(s);
    tap_diag("%s: worst gradient error relative to its tensor's max |grad|: %.3g", tn, worst);
    return worst;
}

static void test_file(void)
{
    char dir[] = "/tmp/fsdpc-mlp-XXXXXX", path[64];
    if (!mkdtemp(dir)) {
        tap_ok(0, "mkdtemp");
        return;
    }
    snprintf(path, sizeof(path), "%s/mlp.h5", dir);
    struct fsdp_model_spec *s = make_spec(1), *su = make_spec(0), *r = NULL;
    struct bufs b, c;
    bufs_alloc(&b, s), bufs_alloc(&c, s);
    fill_params(s, &b);
    int rc = fsdp_model_file_write(path, s, (const float *const *)b.p, NULL);
    rc = rc ? rc : fsdp_model_file_read_spec(path, fsdp_arch_registered(), &r);
    tap_ok(rc == 0 && r->arch == &fsdp_test_mlp_arch && r->n_ties == 1 &&
               fsdp_attrs_diff(r->arch, r->cfg, s->cfg) < 0 && r->total_numel == s->total_numel,
           "file: written, read back as arch %s with the same config", r ? r->arch->name : "-");
    rc = rc ? rc : fsdp_model_file_read(path, fsdp_arch_registered(), r, c.p);
    size_t bad = 0;
    for (int u = 0; u < s->n_units; u++) bad += memcmp(b.p[u], c.p[u], s->unit_numel[u] * 4) != 0;
    tap_ok(rc == 0 && bad == 0, "file: every tensor reads back bitwise (%zu units differ)", bad);
    rc = fsdp_model_file_read(path, fsdp_arch_registered(), su, c.p);
    tap_ok(rc < 0 && strstr(fsdp_err_msg(), "tied"), "file: read as untied refused: %s",
           fsdp_err_msg());
    fsdp_err_clear();

    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT), a = H5Aopen(f, "n_hidden", H5P_DEFAULT);
    long long zero = 0;
    herr_t e = H5Awrite(a, H5T_NATIVE_LLONG, &zero);
    H5Aclose(a), H5Fclose(f);
    fsdp_model_spec_destroy(r), r = NULL;
    rc = fsdp_model_file_read_spec(path, fsdp_arch_registered(), &r);
    tap_ok(e >= 0 && rc < 0 && strstr(fsdp_err_msg(), "n_hidden"), "file: n_hidden 0 refused: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    struct fsdp_test_mlp_config cfg = *(struct fsdp_test_mlp_config *)s->cfg;
    cfg.n_hidden = 0;
    rc = fsdp_test_mlp_arch.spec_create(&cfg, &r);
    tap_ok(rc < 0 && strstr(fsdp_err_msg(), "n_hidden"), "spec: n_hidden 0 refused: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    unlink(path), rmdir(dir);
    bufs_free(&b), bufs_free(&c);
    fsdp_model_spec_destroy(s), fsdp_model_spec_destroy(su);
}

int main(void)
{
    const struct fsdp_arch *a = NULL;
    int rc = fsdp_model_registry_init();
    rc = rc ? rc : fsdp_test_mlp_register();
    rc = rc ? rc : fsdp_test_mlp_register();
    rc = rc ? rc : fsdp_model_arch("mlp", &a);
    tap_ok(rc == 0 && a == &fsdp_test_mlp_arch, "mlp registered (twice is a no-op) and found");
    for (int i = 0; i < TB * TT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 5.5) % 11;
        tgt[i] = i % 5 == 3 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 5.5) % 11;
    }
    double w = fmax(test_model(1), test_model(0));
    tap_diag("worst gradient error over both: %.3g", w);
    test_file();
    return tap_done();
}
