/*
 * test_tp_model.c - the models' tensor-parallel paths element by element:
 * GPT-2 and Llama cut over every rank of the job (the tp-local table of
 * src/tp/tp_plan.h, the model created with it and a struct fsdp_tp) against
 * the whole model on one process, which every rank computes for itself on
 * the same batch. For each case:
 *   - the loss equals the whole model's (rel 1e-5);
 *   - every element of every local parameter's gradient equals the whole
 *     model's gradient at the place the cut puts it, to 1e-5 of the unit's
 *     largest gradient (q/k/v rows by heads, c_proj/o_proj columns, the
 *     vocabulary slices of the embedding and the head, norms and
 *     row-parallel biases whole);
 *   - the vocabulary's padding rows (V = 37 does not split over 2, 3 or 4)
 *     get no gradient.
 * Cases: GPT-2 tied and untied, Llama grouped-query tied and untied with
 * q/k/v biases; with and without sequence parallelism; the GPT-2 head in
 * tiles of a vocabulary slice, and activation checkpointing. Rank 0 prints
 * TAP.
 *
 *   mpiexec -n N test_tp_model --backend mpi|tcp
 */
#include "config.h"
#include "tp/tp_plan.h"
#include "model/gpt2.h"
#include "model/llama.h"
#include "model/model.h"
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

#define TB 2
#define TT 12
#define TV 37

struct ctx {
    struct fsdp_group *g;
    int P, r;
};

static void must(int rc, const char *what)
{
    if (rc < 0) {
        fsdp_die(rc, what, NULL);
    }
}

static double max_ranks(struct ctx *c, double e)
{
    double all[64], m = 0;
    must(fsdp_allgather_sync(c->g, &e, all, sizeof(double), FSDP_U8), "allgather");
    for (int i = 0; i < c->P; i++) {
        m = isnan(all[i]) || all[i] > m ? all[i] : m;
    }
    return m;
}

static struct fsdp_model_spec *gpt2_spec(int tied)
{
    struct fsdp_gpt2_config cfg = {.vocab_size = TV, .context = TT, .n_layer = 2, .n_head = 12,
                                   .n_embd = 48, .ln_eps = 1e-5f, .tied = tied};
    struct fsdp_model_spec *s = NULL;
    must(fsdp_gpt2_spec_create(&cfg, &s), "gpt2 spec");
    return s;
}

static struct fsdp_model_spec *llama_spec(int tied)
{
    struct fsdp_llama_config cfg;
    struct fsdp_model_spec *s = NULL;
    must(fsdp_llama_preset("llama-tiny", &cfg), "llama preset");
    cfg.vocab_size = TV;
    cfg.context = TT;
    cfg.n_layer = 2;
    cfg.n_head = 24;
    cfg.n_kv_head = 12;
    cfg.n_embd = 48;
    cfg.ffn_hidden = 72;
    cfg.tied = tied;
    cfg.attn_bias = !tied;
    cfg.rope_original = TT;
    must(fsdp_llama_spec_create(&cfg, &s), "llama spec");
    return s;
}

/* Local unit u from the whole one: every block the cut gives this rank. */
static void to_local(const struct fsdp_tp_plan *p, int u, const float *full, float *local)
{
    const struct fsdp_model_spec *fs = p->full, *ls = p->local;
    struct fsdp_tp_block b[FSDP_TP_MAX_CHUNKS];
    memset(local, 0, ls->unit_numel[u] * sizeof(float));
    for (size_t i = fs->unit_first[u]; i < fs->n_params && fs->params[i].unit == u; i++) {
        const struct fsdp_param_spec *q = &fs->params[i], *lq = &ls->params[i];
        size_t n = fsdp_tp_plan_blocks(p, i, p->rank, 0, lq->shape[0], b);
        for (size_t k = 0; k < n; k++) {
            for (size_t r = 0; r < b[k].rows; r++) {
                memcpy(local + lq->offset + (b[k].local_row + r) * lq->shape[1],
                       full + q->offset + (b[k].row0 + r) * q->shape[1] + b[k].col0,
                       b[k].cols * sizeof(float));
            }
        }
    }
}

/* Elements of local unit u that no block covers (vocabulary padding): the
 * largest |value| among them. */
static double padding_max(const struct fsdp_tp_plan *p, int u, const float *local)
{
    const struct fsdp_model_spec *ls = p->local;
    struct fsdp_tp_block b[FSDP_TP_MAX_CHUNKS];
    double m = 0;
    for (size_t i = ls->unit_first[u]; i < ls->n_params && ls->params[i].unit == u; i++) {
        const struct fsdp_param_spec *lq = &ls->params[i];
        size_t n = fsdp_tp_plan_blocks(p, i, p->rank, 0, lq->shape[0], b), covered = 0;
        for (size_t k = 0; k < n; k++) {
            covered = b[k].local_row + b[k].rows > covered ? b[k].local_row + b[k].rows : covered;
        }
        for (size_t j = covered * lq->shape[1]; j < lq->numel; j++) {
            m = fmax(m, fabs(local[lq->offset + j]));
        }
    }
    return m;
}

struct opts {
    int sp, head_chunk, ckpt;
};

static void run_case(struct ctx *c, const char *what, struct fsdp_model_spec *s,
                     const struct opts *o)
{
    const int nu = s->n_units;
    struct fsdp_tp_plan *plan = NULL;
    must(fsdp_tp_plan_create(s, c->P, c->r, fsdp_model_tp_cut_of(s), &plan), "tp plan");
    const struct fsdp_model_spec *ls = plan->local;
    uint64_t rng = 0x9E3779B97F4A7C15ULL; /* the same stream on every rank */
    float **p = calloc((size_t)nu, sizeof(float *)), **g = calloc((size_t)nu, sizeof(float *));
    float **lp = calloc((size_t)nu, sizeof(float *)), **lg = calloc((size_t)nu, sizeof(float *));
    for (int u = 0; u < nu; u++) {
        p[u] = calloc(s->unit_numel[u], sizeof(float));
        g[u] = calloc(s->unit_numel[u], sizeof(float));
        lp[u] = calloc(ls->unit_numel[u], sizeof(float));
        lg[u] = calloc(ls->unit_numel[u], sizeof(float));
    }
    must(fsdp_model_init_params(s, 17, p), "init");
    for (int u = 0; u < nu; u++) { /* off the init, so that biases and norms matter */
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            p[u][i] += (float)(0.1 * ref_rand(&rng));
        }
        to_local(plan, u, p[u], lp[u]);
    }
    int32_t tok[TB * TT], tgt[TB * TT];
    for (size_t i = 0; i < TB * TT; i++) {
        tok[i] = (int32_t)((ref_rand(&rng) + 1.0) * 0.5 * TV) % TV;
        tgt[i] = i % 7 == 3 ? -1 : (int32_t)((ref_rand(&rng) + 1.0) * 0.5 * TV) % TV;
    }
    tok[5] = TV - 1; /* the last id, on the last rank that holds real rows */
    tgt[6] = TV - 1;
    /* the whole model */
    struct fsdp_model_opts mo = {.max_B = TB, .max_T = TT, .head_chunk = o->head_chunk};
    struct fsdp_model *ref = NULL, *m = NULL;
    float loss_ref = 0, loss = 0;
    must(fsdp_model_create(s, &mo, &ref), "whole model");
    for (int u = 0; u < nu; u++) {
        must(ref->ops->set_unit(ref, u, p[u], FSDP_F32, g[u]), "set_unit");
    }
    must(fsdp_model_forward(ref, tok, tgt, TB, TT, &loss_ref), "whole forward");
    must(fsdp_model_backward(ref), "whole backward");
    /* the cut model */
    struct fsdp_tp tp;
    fsdp_tp_init(&tp, c->g, o->sp, NULL);
    mo.tp = &tp;
    must(fsdp_model_create(ls, &mo, &m), "tp model");
    if (o->ckpt) {
        must(m->ops->set_checkpoint(m, -1, 1), "checkpointing");
    }
    for (int u = 0; u < nu; u++) {
        must(m->ops->set_unit(m, u, lp[u], FSDP_F32, lg[u]), "set_unit");
    }
    must(fsdp_model_forward(m, tok, tgt, TB, TT, &loss), "tp forward");
    must(fsdp_model_backward(m), "tp backward");
    /* compare */
    double el = fabs((double)loss - loss_ref) / fabs((double)loss_ref), eg = 0, pad = 0;
    for (int u = 0; u < nu; u++) {
        float *wl = calloc(ls->unit_numel[u], sizeof(float));
        double sc = 1e-30, e = 0;
        to_local(plan, u, g[u], wl);
        for (size_t i = 0; i < s->unit_numel[u]; i++) {
            sc = fmax(sc, fabs((double)g[u][i]));
        }
        for (size_t i = 0; i < ls->unit_numel[u]; i++) {
            e = fmax(e, fabs((double)lg[u][i] - wl[i]));
        }
        eg = fmax(eg, e / sc);
        pad = fmax(pad, padding_max(plan, u, lg[u]));
        free(wl);
    }
    el = max_ranks(c, el);
    eg = max_ranks(c, eg);
    pad = max_ranks(c, pad);
    if (c->r == 0) {
        char how[96];
        snprintf(how, sizeof(how), "%s%s%s", o->sp ? "sequence parallel" : "no sequence parallel",
                 o->head_chunk ? ", head in tiles" : "", o->ckpt ? ", checkpointing" : "");
        tap_ok(el <= 1e-5, "%s over tp=%d (%s): loss equals the whole model's (rel err %.3g)", what,
               c->P, how, el);
        tap_ok(eg <= 1e-5, "%s over tp=%d (%s): every local gradient element equals the whole "
               "model's at its place in the cut (max err %.3g of the unit's largest)", what, c->P,
               how, eg);
        tap_ok(pad == 0.0, "%s over tp=%d (%s): the vocabulary's padding rows get no gradient",
               what, c->P, how);
    }
    fsdp_model_destroy(m);
    fsdp_model_destroy(ref);
    for (int u = 0; u < nu; u++) {
        free(p[u]), free(g[u]), free(lp[u]), free(lg[u]);
    }
    free(p), free(g), free(lp), free(lg);
    fsdp_tp_plan_destroy(plan);
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
        fprintf(stderr, "usage: test_tp_model --backend mpi|tcp\n");
        return 2;
    }
    struct fsdp_dist *d = NULL;
    must(fsdp_dist_init(&argc, &argv, "mpi", 60.0, &d), "init");
    must(fsdp_model_registry_init(), "registry");
    struct ctx c = {.P = d->world_size, .r = d->rank};
    if (c.P > 64 || 12 % c.P != 0) {
        fsdp_fatal("test_tp_model runs on 1, 2, 3, 4 or 6 ranks, not %d", c.P);
    }
    const struct fsdp_backend_ops *ops = fsdp_backend_find(backend);
    if (!ops) {
        fsdp_fatal("unknown backend '%s'", backend);
    }
    int ranks[64];
    for (int r = 0; r < c.P; r++) {
        ranks[r] = r;
    }
    must(fsdp_group_create(d, "tp", ranks, c.P, ops, &c.g), "creating the group");
    for (int sp = 0; sp <= 1; sp++) {
        struct opts o = {.sp = sp};
        for (int tied = 1; tied >= 0; tied--) {
            struct fsdp_model_spec *s = gpt2_spec(tied);
            run_case(&c, tied ? "gpt2 tied" : "gpt2 untied", s, &o);
            fsdp_model_spec_destroy(s);
            s = llama_spec(tied);
            run_case(&c, tied ? "llama NH 24 NKV 12, tied" : "llama untied with q/k/v biases", s,
                     &o);
            fsdp_model_spec_destroy(s);
        }
    }
    struct opts tiles = {.sp = 1, .head_chunk = 1, .ckpt = 1};
    struct fsdp_model_spec *s = gpt2_spec(0);
    run_case(&c, "gpt2 untied", s, &tiles);
    fsdp_model_spec_destroy(s);
    fsdp_group_destroy(c.g);
    fsdp_dist_finalize(d);
    return c.r == 0 ? tap_done() : 0;
}
