/*
 * llama_acts.c - where a Llama model's activations live: the layout of the
 * saved activations and of their gradients over the two buffers that
 * struct fsdp_lm holds (act_memory, grad_act_memory), their reservation on
 * the model's device, and the byte counts that the memory plan reads. It
 * computes nothing and never reads a parameter (the kernels: llama.c).
 */
#include "config.h"
#include "model/llama.h"
#include "core/error.h"

#include <stddef.h>
#include <stdint.h>

// ----------------------------------------------------------------------------
// activation layout

/* A bf16 tensor of n values carved from the float buffer. */
static uint16_t *llama_take16(float *base, size_t *off, size_t n)
{
    return (uint16_t *)(void *)fsdp_lm_take(base, off, (n + 1) / 2);
}

/* work NULL: the block's own f32 tensors; else (bf16 activations) its
 * tensors are stored in st and a points at work for the f32 ones
 * (llama_layout_work), with its own f32 rstd and log-sum-exps. */
static void llama_layout_block(const struct fsdp_llama *m, struct fsdp_llama_block_acts *a,
                               struct fsdp_llama_block_store *st,
                               const struct fsdp_llama_block_acts *work, float *base, size_t *off,
                               size_t BT)
{
    size_t C = (size_t)m->cfg->n_embd, F = m->lf, BR = fsdp_lm_rows_here(&m->lm, BT);
    size_t Q = (size_t)m->qkv_w;
    const int h = work != NULL;
    *st = (struct fsdp_llama_block_store){NULL};
    if (work) {
        *a = *work;
    }
    fsdp_lm_take_act(&a->rms1, &st->rms1, h, base, off, BR * C);
    a->rms1_rstd = fsdp_lm_take(base, off, BR);
    fsdp_lm_take_act(&a->qkv, &st->qkv, h, base, off, BT * Q);
    fsdp_lm_take_act(&a->atty, &st->atty, h, base, off, BT * m->lq);
    a->att_lse = fsdp_lm_take(base, off, BT * (size_t)m->lnh);
    fsdp_lm_take_act(&a->res2, &st->res2, h, base, off, BR * C);
    fsdp_lm_take_act(&a->rms2, &st->rms2, h, base, off, BR * C);
    a->rms2_rstd = fsdp_lm_take(base, off, BR);
    fsdp_lm_take_act(&a->gate, &st->gate, h, base, off, BT * F);
    fsdp_lm_take_act(&a->up, &st->up, h, base, off, BT * F);
    fsdp_lm_take_act(&a->h, &st->h, h, base, off, BT * F);
}

/*
 * bf16 activations: the f32 working set every block's acts point at. The
 * products, the attention and SwiGLU read and write the stores; f32 stay
 * qkv (RoPE rotates the product in place before it is stored; it shares
 * gate's buffer: stored before gate is used), gate and up (their
 * gradients, in the backward), res2 (the f32 residual of the MLP's
 * product without tensor parallelism, the attention's reduce-scatter target
 * with sequence parallelism) and, with sequence parallelism, rms1 and rms2 (their rows are
 * all-gathered in f32).
 */
static void llama_layout_work(const struct fsdp_llama *m, struct fsdp_llama_block_acts *w,
                              float *base, size_t *off, size_t BT)
{
    size_t C = (size_t)m->cfg->n_embd, F = m->lf, BR = fsdp_lm_rows_here(&m->lm, BT);
    size_t Q = (size_t)m->qkv_w;
    *w = (struct fsdp_llama_block_acts){NULL};
    w->gate = fsdp_lm_take(base, off, BT * (Q > F ? Q : F));
    w->qkv = w->gate;
    w->up = fsdp_lm_take(base, off, BT * F);
    if (!m->lm.tp || m->lm.sp) {
        w->res2 = fsdp_lm_take(base, off, BR * C);
    }
    if (m->lm.sp) {
        w->rms1 = fsdp_lm_take(base, off, BR * C);
        w->rms2 = fsdp_lm_take(base, off, BR * C);
    }
}

/* The saved tensors of this stage's blocks (and, with bf16 activations,
 * their working set), after the rest. */
static void llama_layout_blocks(const struct fsdp_llama *m, float *base, size_t *off,
                                struct fsdp_llama_acts *a, size_t BT)
{
    size_t L = (size_t)m->cfg->n_layer;
    const size_t lo = (size_t)m->lm.stage_lo, hi = (size_t)m->lm.stage_hi;
    struct fsdp_llama_block_acts blk, work, *w = NULL;
    struct fsdp_llama_block_store st;
    int any_ckpt = 0;
    if (m->lm.adt == FSDP_BF16) {
        llama_layout_work(m, &work, base, off, BT);
        w = &work;
    }
    for (size_t l = 0; l < L; l++) {
        if (l + 1 < lo || l + 1 > hi) {
            continue; /* another stage's block */
        }
        if (m->lm.checkpoint[l]) {
            any_ckpt = 1;
            continue;
        }
        llama_layout_block(m, &blk, &st, w, base, off, BT);
        if (a->blocks) {
            a->blocks[l] = blk;
            a->store[l] = st;
        }
    }
    if (any_ckpt) { /* one set shared by all of them */
        llama_layout_block(m, &blk, &st, w, base, off, BT);
        for (size_t l = 0; l < L && a->blocks; l++) {
            if (m->lm.checkpoint[l]) {
                a->blocks[l] = blk;
                a->store[l] = st;
            }
        }
    }
}

size_t fsdp_llama_head_rows(const struct fsdp_llama *m)
{
    size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T, k = (size_t)m->head_chunk;
    return k < BT ? k : BT;
}

/* Lays the activations out over base into a, or only counts them when base
 * is NULL (a->blocks may then be NULL too); returns the floats needed. */
static size_t llama_layout_acts(const struct fsdp_llama *m, float *base, struct fsdp_llama_acts *a)
{
    const struct fsdp_llama_config *c = m->cfg;
    size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T, C = (size_t)c->n_embd;
    size_t L = (size_t)c->n_layer, V = (size_t)c->vocab_size;
    size_t slots = fsdp_lm_residual_slots(&m->lm);
    size_t off = 0, BR = fsdp_lm_rows_here(&m->lm, BT);
    /* a pipeline stage (set_stage) lays out its own blocks, and the head's
     * buffers only where it holds the head */
    const size_t head = (size_t)m->lm.stage_hi == L + 1;
    if (m->lm.adt == FSDP_BF16) {
        a->residual16 = llama_take16(base, &off, slots * BR * C);
        a->residual = fsdp_lm_take(base, &off, 2 * BR * C);
    } else {
        a->residual16 = NULL;
        a->residual = fsdp_lm_take(base, &off, slots * BR * C);
    }
    a->lnf = fsdp_lm_take(base, &off, head * BT * C);
    a->lnf_rstd = fsdp_lm_take(base, &off, head * BR);
    a->head_logits = fsdp_lm_take(base, &off, head * fsdp_llama_head_rows(m) * V);
    a->ce_stats = fsdp_lm_take(base, &off, head * 2 * BT);
    a->losses = fsdp_lm_take(base, &off, head * BT);
    a->zt = fsdp_lm_take(base, &off, m->lm.tp ? head * BT : 0);
    a->xent = fsdp_lm_take(base, &off, m->lm.tp ? head * 3 * BT : 0);
    a->att_scratch = fsdp_lm_take(
        base, &off,
        m->lm.k->gqa_attention_scratch_floats(m->lm.dev, m->lm.max_T, m->lnh, m->lnkv, m->hs));
    llama_layout_blocks(m, base, &off, a, BT);
    return off;
}

/* dres from base, the rest from shared (a donor's, fsdp_lm_reserve_ws) or base */
static size_t llama_layout_grad_acts(const struct fsdp_llama *m, float *base, float *shared,
                                     struct fsdp_llama_grad_acts *g)
{
    size_t BT = (size_t)m->lm.max_B * (size_t)m->lm.max_T, C = (size_t)m->cfg->n_embd;
    size_t F = m->lf, off = 0;
    g->dres = fsdp_lm_take(base, &off, fsdp_lm_rows_here(&m->lm, BT) * C);
    base = shared ? shared : base;
    g->dbtc = fsdp_lm_take(base, &off, BT * C);
    g->xfull = fsdp_lm_take(base, &off, m->lm.sp ? BT * C : 0);
    g->spg = fsdp_lm_take(base, &off, m->lm.sp ? 2 * C : 0);
    g->dqkv = fsdp_lm_take(base, &off, BT * (size_t)m->qkv_w);
    /* none: the SwiGLU backward writes d(gate) and d(up) over the saved
     * gate and up, which nothing reads after it (two (BT, F) buffers less,
     * and no write-allocate traffic for them) */
    g->dgate = NULL;
    g->dup = NULL;
    g->dh = fsdp_lm_take(base, &off, BT * F);
    return off;
}

int fsdp_llama_reserve(struct fsdp_model *base)
{
    struct fsdp_llama *m = fsdp_llama_of(base);
    struct fsdp_lm *lm = &m->lm;
    int fresh = 0;
    if (!lm->act_memory) {
        FSDP_CHECK(fsdp_lm_reserve_buf(lm, &lm->act_memory, &lm->act_floats,
                                       fsdp_llama_activation_bytes(base) / sizeof(float),
                                       "activations", &fresh));
        llama_layout_acts(m, lm->act_memory, &m->acts);
    }
    if (!lm->grad_act_memory) {
        struct fsdp_llama_grad_acts count;
        float *shared;
        size_t total = llama_layout_grad_acts(m, NULL, NULL, &count);
        FSDP_CHECK(fsdp_lm_reserve_ws(lm, total, &shared, &fresh));
        llama_layout_grad_acts(m, lm->grad_act_memory, shared, &m->gacts);
    }
    if (fresh) {
        fsdp_lm_bind(lm, m->acts.residual, m->gacts.dres, m->gacts.dbtc, m->gacts.xfull,
                     m->gacts.spg);
        lm->residual16 = m->acts.residual16;
        fsdp_lm_log_reserve(lm);
    }
    return 0;
}

size_t fsdp_llama_activation_bytes(const struct fsdp_model *base)
{
    const struct fsdp_llama *m = (const struct fsdp_llama *)base;
    struct fsdp_llama_acts count = {.blocks = NULL, .store = NULL};
    return llama_layout_acts(m, NULL, &count) * sizeof(float);
}

size_t fsdp_llama_workspace_bytes(const struct fsdp_model *base)
{
    const struct fsdp_llama *m = (const struct fsdp_llama *)base;
    struct fsdp_llama_grad_acts count;
    size_t rope = 2 * (size_t)m->lm.max_T * (size_t)(m->hs / 2);
    return (fsdp_lm_ws_own(&m->lm, llama_layout_grad_acts(m, NULL, NULL, &count)) + rope) *
           sizeof(float);
}
