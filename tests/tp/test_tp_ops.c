/*
 * test_tp_ops.c - the tensor-parallel operators (src/tp/tp_ops.h) over a
 * group of every rank, each against the unsharded computation that every
 * rank does for itself in double, and each backward against central
 * differences of a scalar objective evaluated through the sharded forward
 * (every rank evaluates it together: the forward is collective):
 *   - the copy-in / reduce-out pair around a column-parallel then a
 *     row-parallel product (tanh between): forward, and the gradients of
 *     the replicated input and of both weights' shards;
 *   - the sequence gather / scatter pair around the same products, each
 *     rank holding 1/tp of the rows outside;
 *   - the vocabulary-parallel embedding, with and without sequence
 *     parallelism, over a vocabulary that tp does not divide (padded):
 *     forward, the gradient of each rank's table slice, and the padding rows
 *     untouched;
 *   - the parallel cross-entropy over vocabulary slices (V = 11, and V = 5,
 *     whose last slice is all padding at tp = 4), some targets ignored:
 *     per-row losses and the gradient of each rank's logits.
 * Rank 0 prints TAP. Run with 2, 3 and 4 ranks:
 *
 *   mpiexec -n N test_tp_ops --backend mpi|tcp
 */
#include "config.h"
#include "tp/tp_ops.h"
#include "comm/group.h"
#include "core/error.h"
#include "rendezvous/dist.h"
#include "tests/kernels/ref_kernels.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_H 1e-2
#define FD_TOL 2e-3 /* of the largest analytic value: float forward, O(h^2) curvature */
#define FWD_TOL 1e-5

struct ctx {
    struct fsdp_dist *d;
    struct fsdp_group *g;
    int P, r;
};

static void must(int rc, const char *what)
{
    if (rc < 0) {
        fsdp_die(rc, what, NULL);
    }
}

/* Sum of x over the ranks, added in rank order (the same bits everywhere). */
static double sum_ranks(struct ctx *c, double x)
{
    double all[64];
    must(fsdp_allgather_sync(c->g, &x, all, sizeof(double), FSDP_U8), "allgather");
    double s = 0;
    for (int i = 0; i < c->P; i++) {
        s += all[i];
    }
    return s;
}

/* Largest value of a per-rank error over the ranks. */
static double max_ranks(struct ctx *c, double e)
{
    double all[64];
    must(fsdp_allgather_sync(c->g, &e, all, sizeof(double), FSDP_U8), "allgather");
    double m = 0;
    for (int i = 0; i < c->P; i++) {
        m = isnan(all[i]) || all[i] > m ? all[i] : m;
    }
    return m;
}

static void fill(float *x, size_t n, uint64_t *rng, double scale)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(scale * ref_rand(rng));
    }
}

/* max |got - want| / max |want| */
static double rel_err(const float *got, const double *want, size_t n)
{
    double e = 0, s = 1e-30;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)got[i] - want[i]));
        s = fmax(s, fabs(want[i]));
    }
    return e / s;
}

// ----------------------------------------------------------------------------
// the conjugate pairs around a column-parallel then row-parallel product:
//   h = tanh(x A^T)  (A (H, C) split by rows),  y = h B^T  (B (C, H) split by columns)
// without sequence parallelism x and y are whole on every rank; with it
// each rank holds N/P rows of x and y

#define PN 12
#define PC 5
#define PH 12

struct pair {
    struct ctx *c;
    struct fsdp_tp *tp;
    float *x;           /* (N, C) whole, or this rank's rows with sp */
    float *A, *B;       /* (H/P, C), (C, H/P): this rank's shards */
    float *R;           /* (N, C) the objective's weights, whole */
    float *xf, *h, *yp; /* (N, C), (N, H/P), (N, C) scratch */
    float *y;           /* (N, C) or (N/P, C) */
};

static size_t pair_rows(const struct pair *p)
{
    return p->tp->sp ? PN / (size_t)p->tp->size : PN;
}

static void pair_forward(struct pair *p)
{
    size_t Hl = PH / (size_t)p->tp->size, rows = pair_rows(p);
    const float *in = p->x;
    if (p->tp->sp) {
        must(fsdp_tp_seq_gather_forward(p->tp, p->x, p->xf, rows, PC), "seq gather");
        in = p->xf;
    }
    for (size_t n = 0; n < PN; n++) {
        for (size_t j = 0; j < Hl; j++) {
            double s = 0;
            for (size_t k = 0; k < PC; k++) {
                s += (double)in[n * PC + k] * p->A[j * PC + k];
            }
            p->h[n * Hl + j] = (float)tanh(s);
        }
        for (size_t o = 0; o < PC; o++) {
            double s = 0;
            for (size_t j = 0; j < Hl; j++) {
                s += (double)p->h[n * Hl + j] * p->B[o * Hl + j];
            }
            p->yp[n * PC + o] = (float)s;
        }
    }
    if (p->tp->sp) {
        must(fsdp_tp_seq_scatter_forward(p->tp, p->yp, p->y, rows, PC), "seq scatter");
    } else {
        must(fsdp_tp_reduce_out_forward(p->tp, p->yp, PN * PC), "reduce out");
        memcpy(p->y, p->yp, PN * PC * sizeof(float));
    }
}

/* L = sum R . y over every row (each rank's rows with sp, summed) */
static double pair_objective(struct pair *p)
{
    pair_forward(p);
    size_t rows = pair_rows(p), r0 = p->tp->sp ? (size_t)p->tp->rank * rows : 0;
    double L = 0;
    for (size_t i = 0; i < rows * PC; i++) {
        L += (double)p->R[r0 * PC + i] * p->y[i];
    }
    return p->tp->sp ? sum_ranks(p->c, L) : L;
}

/* dx (rows, C), dA, dB from dL/dy = R */
static void pair_backward(struct pair *p, float *dx, float *dA, float *dB)
{
    size_t Hl = PH / (size_t)p->tp->size, rows = pair_rows(p);
    const float *in = p->tp->sp ? p->xf : p->x;
    float *dy = malloc(PN * PC * sizeof(float)), *dxf = calloc(PN * PC, sizeof(float));
    if (p->tp->sp) { /* the exit's backward gathers every rank's dy rows */
        must(fsdp_tp_seq_scatter_backward(p->tp, p->R + (size_t)p->tp->rank * rows * PC, dy, rows,
                                          PC), "seq scatter backward");
    } else {
        memcpy(dy, p->R, PN * PC * sizeof(float));
    }
    memset(dA, 0, Hl * PC * sizeof(float));
    memset(dB, 0, PC * Hl * sizeof(float));
    for (size_t n = 0; n < PN; n++) {
        for (size_t j = 0; j < Hl; j++) {
            double dh = 0, hv = p->h[n * Hl + j];
            for (size_t o = 0; o < PC; o++) {
                dh += (double)dy[n * PC + o] * p->B[o * Hl + j];
                dB[o * Hl + j] += (float)((double)dy[n * PC + o] * hv);
            }
            double da = dh * (1.0 - hv * hv);
            for (size_t k = 0; k < PC; k++) {
                dA[j * PC + k] += (float)(da * in[n * PC + k]);
                dxf[n * PC + k] += (float)(da * p->A[j * PC + k]);
            }
        }
    }
    if (p->tp->sp) {
        must(fsdp_tp_seq_gather_backward(p->tp, dxf, dx, rows, PC), "seq gather backward");
    } else {
        must(fsdp_tp_copy_in_backward(p->tp, dxf, PN * PC), "copy in backward");
        memcpy(dx, dxf, PN * PC * sizeof(float));
    }
    free(dy);
    free(dxf);
}

/*
 * Central differences of L with respect to n elements of x, perturbed on
 * rank `owner` only (-1: every rank, a replicated tensor), against got
 * (meaningful on the owner). Returns max |got - fd| / max |fd| over the ranks.
 */
static double fd_check(struct pair *p, float *x, size_t n, int owner, const float *got,
                       double (*obj)(void *), void *arg)
{
    double e = 0, s = 1e-30;
    for (int r = 0; r < p->c->P; r++) {
        if (owner >= 0 && r != owner) {
            continue;
        }
        /* every rank loops over the owner's elements together */
        double all[64], mine_n = (double)n;
        must(fsdp_allgather_sync(p->c->g, &mine_n, all, sizeof(double), FSDP_U8), "allgather");
        size_t cnt = (size_t)all[owner < 0 ? 0 : r];
        for (size_t i = 0; i < cnt; i++) {
            int mine = owner < 0 || p->c->r == r;
            float save = mine ? x[i] : 0.0f;
            if (mine) {
                x[i] = save + (float)FD_H;
            }
            double fp = obj(arg);
            if (mine) {
                x[i] = save - (float)FD_H;
            }
            double fm = obj(arg);
            if (mine) {
                x[i] = save;
                double fd = (fp - fm) / (2 * FD_H);
                e = fmax(e, fabs(fd - got[i]));
                s = fmax(s, fabs(fd));
            }
        }
        if (owner < 0) {
            break;
        }
    }
    return max_ranks(p->c, e / s);
}

static double pair_obj(void *arg)
{
    return pair_objective(arg);
}

static void test_pair(struct ctx *c, int sp)
{
    struct fsdp_tp tp;
    fsdp_tp_init(&tp, c->g, sp, NULL);
    const size_t P = (size_t)c->P, Hl = PH / P, rows = sp ? PN / P : PN;
    uint64_t rng = 0x1234567ULL; /* the same stream on every rank */
    float *x = malloc(PN * PC * sizeof(float)), *A = malloc(PH * PC * sizeof(float));
    float *B = malloc(PC * PH * sizeof(float)), *R = malloc(PN * PC * sizeof(float));
    fill(x, PN * PC, &rng, 1.0);
    fill(A, PH * PC, &rng, 0.5);
    fill(B, PC * PH, &rng, 0.5);
    fill(R, PN * PC, &rng, 1.0);
    /* the unsharded reference in double */
    double *yref = malloc(PN * PC * sizeof(double));
    for (size_t n = 0; n < PN; n++) {
        double h[PH];
        for (size_t j = 0; j < PH; j++) {
            double s = 0;
            for (size_t k = 0; k < PC; k++) {
                s += (double)x[n * PC + k] * A[j * PC + k];
            }
            h[j] = tanh(s);
        }
        for (size_t o = 0; o < PC; o++) {
            double s = 0;
            for (size_t j = 0; j < PH; j++) {
                s += h[j] * B[o * PH + j];
            }
            yref[n * PC + o] = s;
        }
    }
    /* this rank's pieces: rows of A, columns of B, rows of x with sp */
    struct pair p = {.c = c, .tp = &tp};
    p.x = malloc(rows * PC * sizeof(float));
    p.A = malloc(Hl * PC * sizeof(float));
    p.B = malloc(PC * Hl * sizeof(float));
    p.R = R;
    p.xf = malloc(PN * PC * sizeof(float));
    p.h = malloc(PN * Hl * sizeof(float));
    p.yp = malloc(PN * PC * sizeof(float));
    p.y = malloc(PN * PC * sizeof(float));
    size_t r0 = sp ? (size_t)c->r * rows : 0;
    memcpy(p.x, x + r0 * PC, rows * PC * sizeof(float));
    memcpy(p.A, A + (size_t)c->r * Hl * PC, Hl * PC * sizeof(float));
    for (size_t o = 0; o < PC; o++) {
        memcpy(p.B + o * Hl, B + o * PH + (size_t)c->r * Hl, Hl * sizeof(float));
    }
    pair_forward(&p);
    double ef = max_ranks(c, rel_err(p.y, yref + r0 * PC, rows * PC));
    float *dx = malloc(rows * PC * sizeof(float)), *dA = malloc(Hl * PC * sizeof(float));
    float *dB = malloc(PC * Hl * sizeof(float));
    pair_backward(&p, dx, dA, dB);
    double ex = fd_check(&p, p.x, rows * PC, sp ? 0 : -1, dx, pair_obj, &p);
    if (sp) { /* every rank's rows of x are its own: check each rank's */
        for (int r = 1; r < c->P; r++) {
            ex = fmax(ex, fd_check(&p, p.x, rows * PC, r, dx, pair_obj, &p));
        }
    }
    double ea = 0, eb = 0;
    for (int r = 0; r < c->P; r++) {
        ea = fmax(ea, fd_check(&p, p.A, Hl * PC, r, dA, pair_obj, &p));
        eb = fmax(eb, fd_check(&p, p.B, PC * Hl, r, dB, pair_obj, &p));
    }
    if (c->r == 0) {
        const char *pair = sp ? "sequence gather/scatter" : "copy-in/reduce-out";
        tap_ok(ef <= FWD_TOL, "%s pair, tp=%d: forward equals the unsharded tanh(x A^T) B^T "
               "(max rel err %.3g)", pair, c->P, ef);
        tap_ok(ex <= FD_TOL, "%s pair, tp=%d: d(input) against central differences (max rel err "
               "%.3g)", pair, c->P, ex);
        tap_ok(ea <= FD_TOL && eb <= FD_TOL, "%s pair, tp=%d: d(column-parallel weight) and "
               "d(row-parallel weight) shards against central differences (max rel err %.3g, %.3g)",
               pair, c->P, ea, eb);
    }
    free(x), free(A), free(B), free(R), free(yref);
    free(p.x), free(p.A), free(p.B), free(p.xf), free(p.h), free(p.yp), free(p.y);
    free(dx), free(dA), free(dB);
}

// ----------------------------------------------------------------------------
// vocabulary-parallel embedding: out = wte[tokens] + pos[row mod T], L = sum R . out

#define EV 11
#define EN 12
#define EC 4
#define ET 4

struct emb {
    struct ctx *c;
    struct fsdp_tp *tp;
    float *wte;   /* (Vl, C) this rank's slice of the padded table */
    float *pos;   /* (T, C) whole on every rank */
    int32_t *tok; /* (N) */
    float *R;     /* (N, C) */
    float *full, *out;
};

static size_t emb_rows(const struct emb *e)
{
    return e->tp->sp ? EN / (size_t)e->tp->size : EN;
}

static double emb_obj(void *arg)
{
    struct emb *e = arg;
    must(fsdp_tp_embed_forward(e->tp, e->out, e->full, e->tok, e->wte, EV, e->pos, FSDP_F32, ET, EN,
                               EC),
         "embed");
    size_t rows = emb_rows(e), r0 = e->tp->sp ? (size_t)e->tp->rank * rows : 0;
    double L = 0;
    for (size_t i = 0; i < rows * EC; i++) {
        L += (double)e->R[r0 * EC + i] * e->out[i];
    }
    return e->tp->sp ? sum_ranks(e->c, L) : L;
}

static void test_embed(struct ctx *c, int sp)
{
    struct fsdp_tp tp;
    fsdp_tp_init(&tp, c->g, sp, NULL);
    size_t v0, vn, Vl;
    fsdp_tp_vocab_split(EV, tp.size, tp.rank, &v0, &vn, &Vl);
    uint64_t rng = 0xABCDEFULL;
    float *wte = malloc(EV * EC * sizeof(float)), *R = malloc(EN * EC * sizeof(float));
    float *pos = malloc(ET * EC * sizeof(float));
    int32_t tok[EN];
    fill(wte, EV * EC, &rng, 1.0);
    fill(R, EN * EC, &rng, 1.0);
    fill(pos, ET * EC, &rng, 1.0);
    for (size_t i = 0; i < EN; i++) {
        tok[i] = (int32_t)(i * 7 % EV); /* every id but few, ids repeated */
    }
    tok[3] = EV - 1; /* the last id: on the last rank that holds real rows */
    struct emb e = {.c = c, .tp = &tp, .tok = tok, .R = R, .pos = pos};
    e.wte = calloc(Vl * EC, sizeof(float)); /* padding rows zero */
    memcpy(e.wte, wte + v0 * EC, vn * EC * sizeof(float));
    e.full = malloc(EN * EC * sizeof(float));
    e.out = malloc(EN * EC * sizeof(float));
    emb_obj(&e);
    size_t rows = emb_rows(&e), r0 = sp ? (size_t)c->r * rows : 0;
    double *want = calloc(rows * EC, sizeof(double));
    for (size_t i = 0; i < rows; i++) {
        for (size_t k = 0; k < EC; k++) {
            want[i * EC + k] = wte[(size_t)tok[r0 + i] * EC + k] + pos[(r0 + i) % ET * EC + k];
        }
    }
    double ef = max_ranks(c, rel_err(e.out, want, rows * EC));
    /* backward: every rank's dout rows (gathered with sp) into its slice */
    float *dfull = malloc(EN * EC * sizeof(float)), *dwte = calloc(Vl * EC, sizeof(float));
    float *dpos = calloc(ET * EC, sizeof(float));
    if (sp) {
        must(fsdp_tp_seq_scatter_backward(&tp, R + r0 * EC, dfull, rows, EC), "gather dout");
    } else {
        memcpy(dfull, R, EN * EC * sizeof(float));
    }
    fsdp_tp_embed_backward(&tp, dwte, dpos, dfull, tok, EV, ET, EN, EC);
    double eg = 0, pad = 0;
    struct pair shim = {.c = c, .tp = &tp};
    for (int r = 0; r < c->P; r++) {
        eg = fmax(eg, fd_check(&shim, e.wte, Vl * EC, r, dwte, emb_obj, &e));
    }
    double ep = fd_check(&shim, pos, ET * EC, -1, dpos, emb_obj, &e);
    for (size_t i = vn * EC; i < Vl * EC; i++) {
        pad = fmax(pad, fabs(dwte[i]) + fabs(e.wte[i]));
    }
    pad = max_ranks(c, pad);
    if (c->r == 0) {
        const char *how = sp ? "reduce-scattered (sequence parallel)" : "all-reduced";
        tap_ok(ef == 0.0, "vocabulary-parallel embedding V=%d over tp=%d (%zu rows each, %s): "
               "forward equals the lookup plus positions bit for bit (max rel err %.3g)", EV, c->P,
               Vl, how, ef);
        tap_ok(eg <= FD_TOL && ep <= FD_TOL, "vocabulary-parallel embedding V=%d tp=%d %s: "
               "d(table slice) and d(position table, whole on every rank) against central "
               "differences (max rel err %.3g, %.3g)", EV, c->P, how, eg, ep);
        tap_ok(pad == 0.0, "vocabulary-parallel embedding V=%d tp=%d %s: padding rows stay zero "
               "and get no gradient", EV, c->P, how);
    }
    free(wte), free(R), free(pos), free(e.wte), free(e.full), free(e.out), free(want), free(dfull),
        free(dwte), free(dpos);
}

// ----------------------------------------------------------------------------
// parallel cross-entropy: L = dscale * sum of the kept rows' losses

#define XN 9
#define XSCALE 0.7

struct xent {
    struct ctx *c;
    struct fsdp_tp *tp;
    size_t V;
    float *logits; /* (N, vn) this rank's columns */
    int32_t *tgt;
    float *losses, *stats, *zt, *scratch;
    size_t kept;
};

static double xent_obj(void *arg)
{
    struct xent *x = arg;
    must(fsdp_tp_xent_forward(x->tp, x->losses, x->stats, x->zt, x->scratch, x->logits, x->tgt,
                              x->tgt, XN, x->V, -1, &x->kept),
         "xent");
    double L = 0;
    for (size_t i = 0; i < XN; i++) {
        L += x->losses[i];
    }
    return XSCALE * L; /* every rank has every row's loss */
}

static void test_xent(struct ctx *c, size_t V)
{
    struct fsdp_tp tp;
    fsdp_tp_init(&tp, c->g, 0, NULL);
    size_t v0, vn, Vl;
    fsdp_tp_vocab_split(V, tp.size, tp.rank, &v0, &vn, &Vl);
    uint64_t rng = 0x77ULL + V;
    float *full = malloc(XN * V * sizeof(float));
    int32_t tgt[XN];
    fill(full, XN * V, &rng, 3.0);
    for (size_t i = 0; i < XN; i++) {
        tgt[i] = i % 4 == 2 ? -1 : (int32_t)((i * 5 + 3) % V);
    }
    double want[XN];
    for (size_t i = 0; i < XN; i++) {
        double m = -INFINITY, s = 0;
        for (size_t j = 0; j < V; j++) {
            m = fmax(m, full[i * V + j]);
        }
        for (size_t j = 0; j < V; j++) {
            s += exp(full[i * V + j] - m);
        }
        want[i] = tgt[i] < 0 ? 0.0 : m + log(s) - full[i * V + (size_t)tgt[i]];
    }
    struct xent x = {.c = c, .tp = &tp, .V = V, .tgt = tgt};
    x.logits = malloc((XN * vn + 1) * sizeof(float));
    for (size_t i = 0; i < XN; i++) {
        memcpy(x.logits + i * vn, full + i * V + v0, vn * sizeof(float));
    }
    x.losses = malloc(XN * sizeof(float));
    x.stats = malloc(2 * XN * sizeof(float));
    x.zt = malloc(XN * sizeof(float));
    x.scratch = malloc(3 * XN * sizeof(float));
    xent_obj(&x);
    double ef = max_ranks(c, rel_err(x.losses, want, XN));
    size_t kept = x.kept;
    float *d = malloc((XN * vn + 1) * sizeof(float));
    fsdp_tp_xent_backward(&tp, d, x.logits, x.stats, tgt, XN, V, -1, (float)XSCALE);
    struct pair shim = {.c = c, .tp = &tp};
    double eg = 0;
    for (int r = 0; r < c->P; r++) {
        eg = fmax(eg, fd_check(&shim, x.logits, XN * vn, r, d, xent_obj, &x));
    }
    if (c->r == 0) {
        tap_ok(ef <= FWD_TOL && kept == 7, "parallel cross-entropy V=%zu over tp=%d (at most %zu "
               "logits per row on a rank%s): losses equal the unsharded loss, %zu rows kept (max "
               "rel err %.3g)", V, c->P, Vl, V < (size_t)c->P * Vl ? ", padded" : "", kept, ef);
        tap_ok(eg <= FD_TOL, "parallel cross-entropy V=%zu tp=%d: d(logit slice) against central "
               "differences (max rel err %.3g)", V, c->P, eg);
    }
    free(full), free(x.logits), free(x.losses), free(x.stats), free(x.zt), free(x.scratch), free(d);
}

int main(int argc, char **argv)
{
    const char *backend = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
            backend = argv[++i];
        }
    }
    if (!backend) {
        fprintf(stderr, "usage: test_tp_ops --backend mpi|tcp\n");
        return 2;
    }
    struct ctx c = {0};
    must(fsdp_dist_init(&argc, &argv, "mpi", 60.0, &c.d), "init");
    c.r = c.d->rank;
    c.P = c.d->world_size;
    if (c.P > 64 || PH % c.P != 0 || PN % c.P != 0) {
        fsdp_fatal("test_tp_ops runs on 1, 2, 3, 4 or 6 ranks, not %d", c.P);
    }
    const struct fsdp_backend_ops *ops = fsdp_backend_find(backend);
    if (!ops) {
        fsdp_fatal("unknown backend '%s'", backend);
    }
    int ranks[64];
    for (int r = 0; r < c.P; r++) {
        ranks[r] = r;
    }
    must(fsdp_group_create(c.d, "tp", ranks, c.P, ops, &c.g), "creating the group");
    test_pair(&c, 0);
    test_pair(&c, 1);
    test_embed(&c, 0);
    test_embed(&c, 1);
    test_xent(&c, EV);
    test_xent(&c, 5);
    fsdp_group_destroy(c.g);
    fsdp_dist_finalize(c.d);
    return c.r == 0 ? tap_done() : 0;
}
