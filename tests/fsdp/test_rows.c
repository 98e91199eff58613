/*
 * test_rows.c - GPT-2 with unit 0 by rows over a group (every rank holds
 * only its rows of wte and wpe; the embedding and the tied head exchange
 * activations) against the whole model on one process with the global
 * batch, which every rank computes for itself:
 *   - each rank's per-token losses equal the reference's rows;
 *   - each rank's rows of unit 0's gradient equal the reference's rows;
 *   - the other units' gradients, summed over the ranks, equal the
 *     reference's;
 * all to 1e-5 of the largest reference value, for a tied and an untied
 * model (V = 37, split unevenly), the head whole and in tiles of 37 logits
 * (a few rows by a vocabulary slice), with and without activation
 * checkpointing, and with one
 * rank that has no batch (it only serves the others' exchanges; the
 * reference then has the other ranks' rows). Rank 0 prints TAP.
 *
 *   mpiexec -n N test_rows --backend mpi|tcp
 */
#include "config.h"
#include "model/gpt2.h"
#include "comm/group.h"
#include "core/error.h"
#include "core/util.h"
#include "rendezvous/dist.h"
#include "tests/kernels/ref_kernels.h"
#include "tests/tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TB 2
#define TT 8
#define TV 37

struct ctx {
    struct fsdp_dist *d;
    struct fsdp_group *g;
    int rank, size;
};

static struct fsdp_model_spec *make_spec(int tied)
{
    struct fsdp_gpt2_config cfg = {.vocab_size = TV, .context = TT, .n_layer = 2, .n_head = 2,
                                   .n_embd = 16, .ln_eps = 1e-5f, .tied = tied};
    struct fsdp_model_spec *s = NULL;
    if (fsdp_gpt2_spec_create(&cfg, &s) < 0) {
        fsdp_fatal("spec: %s", fsdp_err_msg());
    }
    return s;
}

/* The largest |x| over n elements (at least a tiny positive value). */
static double max_abs(const float *x, size_t n)
{
    double m = 1e-30;
    for (size_t i = 0; i < n; i++) {
        m = fmax(m, fabs((double)x[i]));
    }
    return m;
}

/* Max over the group of a per-rank error (NaN counts as failure). */
static double group_max(struct ctx *c, double e)
{
    float v = isnan(e) ? INFINITY : (float)e;
    if (fsdp_allreduce_sync(c->g, &v, &v, 1, FSDP_F32, FSDP_MAX) < 0) {
        fsdp_die(FSDP_ERR_INTERNAL, "allreduce", NULL);
    }
    return v;
}

/*
 * One case: the reference on the contributing ranks' rows, the rows model on
 * this rank's; returns the worst error of each comparison over the ranks.
 */
static void run_case(struct ctx *c, int tied, int head_rows, int ckpt, int idle)
{
    struct fsdp_model_spec *s = make_spec(tied);
    const int W = c->size, nu = s->n_units;
    const size_t BT = TB * TT, C = 16;
    uint64_t rng = 0x5DEECE66DULL; /* the same stream on every rank */
    float **p = calloc((size_t)nu, sizeof(float *)), **gref = calloc((size_t)nu, sizeof(float *));
    float **g = calloc((size_t)nu, sizeof(float *));
    for (int u = 0; u < nu; u++) {
        p[u] = calloc(s->unit_numel[u], sizeof(float));
        gref[u] = calloc(s->unit_numel[u], sizeof(float));
        g[u] = calloc(s->unit_numel[u], sizeof(float));
    }
    fsdp_model_init_params(s, 99, p);
    for (int u = 0; u < nu; u++) {
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            p[u][i] += (float)(0.1 * ref_rand(&rng));
        }
    }
    /* every rank's batch; some targets ignored */
    int32_t *tok = malloc((size_t)W * BT * sizeof(int32_t));
    int32_t *tgt = malloc((size_t)W * BT * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)W * BT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 0.5 * TV) % TV;
        tgt[i] = i % 7 == 4 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 0.5 * TV) % TV;
    }
    /* the reference: rows of the ranks with a batch, rank after rank */
    int nc = 0, me_at = -1;
    int32_t *rtok = malloc((size_t)W * BT * sizeof(int32_t));
    int32_t *rtgt = malloc((size_t)W * BT * sizeof(int32_t));
    for (int r = 0; r < W; r++) {
        if (r == idle) {
            continue;
        }
        me_at = r == c->rank ? nc : me_at;
        memcpy(rtok + (size_t)nc * BT, tok + (size_t)r * BT, BT * sizeof(int32_t));
        memcpy(rtgt + (size_t)nc * BT, tgt + (size_t)r * BT, BT * sizeof(int32_t));
        nc++;
    }
    struct fsdp_gpt2 *ref = NULL, *m = NULL;
    int rc = fsdp_gpt2_create(s, nc * TB, TT, &ref);
    for (int u = 0; rc == 0 && u < nu; u++) {
        rc = fsdp_gpt2_set_unit(ref, u, p[u], FSDP_F32, gref[u]);
    }
    rc = rc ? rc : fsdp_gpt2_forward(ref, rtok, rtgt, nc * TB, TT, NULL);
    rc = rc ? rc : fsdp_gpt2_backward(ref);
    double kept = (double)ref->n_kept;

    /* the rows model: this rank's rows of wte and wpe, packed */
    rc = rc ? rc : fsdp_gpt2_create(s, TB, TT, &m);
    rc = rc ? rc : fsdp_gpt2_set_head_chunk(m, head_rows);
    rc = rc ? rc : fsdp_gpt2_set_checkpoint(m, -1, ckpt);
    int taken = rc ? rc : fsdp_gpt2_set_unit_rows(m, 0, c->g);
    rc = taken < 0 ? taken : rc;
    float *rows = NULL, *drows = NULL;
    size_t n_rows = 0;
    if (rc == 0) {
        n_rows = m->rows_numel;
        rows = malloc(n_rows * sizeof(float));
        drows = calloc(n_rows, sizeof(float));
        const float *wte = p[0] + m->emb_off[0], *wpe = p[0] + m->emb_off[1];
        memcpy(rows + m->wte_at, wte + m->wte_row0 * C, m->wte_rows * C * sizeof(float));
        memcpy(rows + m->wpe_at, wpe + m->wpe_row0 * C, m->wpe_rows * C * sizeof(float));
        rc = fsdp_gpt2_set_unit(m, 0, rows, FSDP_F32, drows);
    }
    for (int u = 1; rc == 0 && u < nu; u++) {
        rc = fsdp_gpt2_set_unit(m, u, p[u], FSDP_F32, g[u]);
    }
    fsdp_gpt2_set_loss_seed(m, kept, 1.0f);
    int mine = c->rank != idle;
    rc = rc ? rc : fsdp_gpt2_forward(m, mine ? tok + (size_t)c->rank * BT : NULL,
                                     mine ? tgt + (size_t)c->rank * BT : NULL, TB, TT, NULL);
    rc = rc ? rc : fsdp_gpt2_backward(m);
    if (rc < 0) {
        fsdp_die(rc, "rows model", NULL);
    }

    /* losses of this rank's rows */
    double e_loss = 0;
    for (size_t i = 0; mine && i < BT; i++) {
        double want = ref->acts.losses[(size_t)me_at * BT + i], got = m->acts.losses[i];
        e_loss = fmax(e_loss, fabs(got - want) / fmax(fabs(want), 1e-30));
    }
    /* unit 0: this rank's rows against the reference's */
    const float *dwte = gref[0] + m->emb_off[0], *dwpe = gref[0] + m->emb_off[1];
    double s0 = fmax(max_abs(dwte, (size_t)TV * C), max_abs(dwpe, (size_t)TT * C)), e0 = 0;
    for (size_t i = 0; i < m->wte_rows * C; i++) {
        e0 = fmax(e0, fabs((double)drows[m->wte_at + i] - dwte[m->wte_row0 * C + i]) / s0);
    }
    for (size_t i = 0; i < m->wpe_rows * C; i++) {
        e0 = fmax(e0, fabs((double)drows[m->wpe_at + i] - dwpe[m->wpe_row0 * C + i]) / s0);
    }
    /* the other units: summed over the ranks */
    double eu = 0;
    for (int u = 1; u < nu; u++) {
        if (fsdp_allreduce_sync(c->g, g[u], g[u], s->unit_numel[u], FSDP_F32, FSDP_SUM) < 0) {
            fsdp_die(FSDP_ERR_INTERNAL, "allreduce", NULL);
        }
        double su = max_abs(gref[u], s->unit_numel[u]);
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            eu = fmax(eu, fabs((double)g[u][i] - gref[u][i]) / su);
        }
    }
    e_loss = group_max(c, e_loss);
    e0 = group_max(c, e0);
    eu = group_max(c, eu);
    if (c->rank == 0) {
        char what[160];
        snprintf(what, sizeof(what), "%d ranks, %s, head %s%s%s", W, tied ? "tied" : "untied",
                 head_rows ? "in tiles of 37 logits" : "whole",
                 ckpt ? ", checkpointing" : "", idle >= 0 ? ", rank 1 without a batch" : "");
        tap_ok(taken == 1, "%s: unit 0 taken by rows", what);
        tap_ok(e_loss <= 1e-5, "%s: per-token losses equal one process's (max rel err %.3g)", what,
               e_loss);
        tap_ok(e0 <= 1e-5, "%s: each rank's rows of the wte/wpe gradient equal one process's "
               "(max err %.3g of max |grad|)", what, e0);
        tap_ok(eu <= 1e-5, "%s: the blocks' and ln_f's gradients summed over the ranks equal one "
               "process's (max err %.3g of each unit's max |grad|)", what, eu);
    }
    fsdp_gpt2_destroy(m);
    fsdp_gpt2_destroy(ref);
    for (int u = 0; u < nu; u++) {
        free(p[u]), free(gref[u]), free(g[u]);
    }
    free(p), free(gref), free(g), free(tok), free(tgt), free(rtok), free(rtgt);
    free(rows), free(drows);
    fsdp_model_spec_destroy(s);
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
        fprintf(stderr, "usage: test_rows --backend mpi|tcp\n");
        return 2;
    }
    struct ctx c = {0};
    int rc = fsdp_dist_init(&argc, &argv, "mpi", 60.0, &c.d);
    if (rc < 0) {
        fsdp_die(rc, "init", NULL);
    }
    c.rank = c.d->rank;
    c.size = c.d->world_size;
    const struct fsdp_backend_ops *ops = fsdp_backend_find(backend);
    if (!ops) {
        fsdp_fatal("unknown backend '%s'", backend);
    }
    int *ranks = malloc((size_t)c.size * sizeof(int));
    for (int r = 0; r < c.size; r++) {
        ranks[r] = r;
    }
    if ((rc = fsdp_group_create(c.d, "dp", ranks, c.size, ops, &c.g)) < 0) {
        fsdp_die(rc, "creating the group", NULL);
    }
    free(ranks);
    /* head budget 1 row of V = 37 floats: tiles of 2 rows by at most 16 columns */
    for (int tied = 1; tied >= 0; tied--) {
        run_case(&c, tied, 0, 0, -1);
        run_case(&c, tied, 1, 0, -1);
        run_case(&c, tied, 1, 1, c.size > 1 ? 1 : -1);
    }
    fsdp_group_destroy(c.g);
    fsdp_dist_finalize(c.d);
    return c.rank == 0 ? tap_done() : 0;
}
