/*
 * matmul_cuda.c - the cuda device's linear layer through cuBLASLt (the
 * contract is matmul_cuda.h's). Plain C over cublasLt.h and the CUDA
 * runtime; compiled in CUDA builds, and by test_cuda_matmul against a
 * simulated cuBLASLt (tests/kernels/cublaslt_sim.c) in every build.
 *
 * cuBLASLt is column-major; our buffers are row-major, and a row-major
 * (R, K) matrix is the column-major (K, R) one with leading dimension K.
 * So each product is written for the transposes:
 *
 *   forward  out^T (OC, N)  = W^T-as-stored (op T: (OC, C)) . inp^T (C, N)
 *   dinp     dinp^T (C, N)  = W-as-stored (C, OC)           . dout^T (OC, N)
 *   dweight  dW^T (C, OC)   = inp^T (C, N)                  . dout (op T: (N, OC))
 *   dbias    db (OC, 1)     = dout^T (OC, N)                . ones (N, 1)
 *
 * The bias goes through the BIAS epilogue (a vector of D's rows, f32 as D
 * is: a 16-bit bias is widened first); a residual is C with beta = 1 (C
 * may be D); accumulation is beta = 1. The bias gradient is a product
 * with a vector of ones rather than the BGRADB epilogue, which overwrites
 * and ignores alpha where the CPU adds alpha times the sums.
 *
 * f32 products compute in CUBLAS_COMPUTE_32F, exact f32 as the CPU's
 * sgemm (up to the order of sums); FSDPC_CUDA_TF32=1 lets them round the
 * inputs to TF32 (the bias gradient excepted). 16-bit weights meet a
 * 16-bit copy of the activation, cast into a staging buffer.
 *
 * Activations in bf16 storage (it, ot): a bf16 input meets bf16 weights
 * as it is (the cast of its widened values would give the same bits);
 * with f32 weights (and in the weight gradient, which stays f32) it is
 * widened exactly into staging by a kernel, and with f16 weights widened,
 * then rounded to f16. A bf16 output is D in f32 staging, rounded to
 * nearest even into out by a cast kernel: never a bf16 D, so the result
 * is the f32 product's rounded as on the CPU, whatever the epilogue.
 *
 * Staging is bounded: at most BLAS_STAGE_LIMIT bytes (64 MiB; a test
 * lowers it with fsdp_cuda_blas_set_stage_limit), whatever the product.
 * A product that would stage more runs in tiles of rows of N, each
 * staged in turn into the same buffer: in the forward and dinp a tile of
 * rows is a contiguous block of inp (dout) and of out (dinp), a product
 * of its own (bias and residual per tile, the entry's beta on each, as
 * the tiles are disjoint); in the weight gradient N is the reduction
 * dimension, so the tiles' products add into dweight in row order (beta
 * 1 on each, as dweight accumulates). Tiles of 256 rows or more are a
 * multiple of 256 rows; a smaller tile's plan is told the alignment
 * every tile keeps (its first pointer's and the step's, the lesser), so
 * a tiled product makes at most two plans (full tile and remainder). The
 * bound holds while one row fits (6 C + 4 OC bytes and a widened bias):
 * a tile is never under one row.
 *
 * A plan (descriptor, layouts, algorithm) is made once per key: shape,
 * transposes, leading dimensions, types, epilogue, compute type, and the
 * pointers' alignments, the bias's included (the heuristic is told them:
 * the operands' as preferences, the bias's by its pointer, set on the
 * descriptor before the heuristic is asked, as cublasLt.h says it reads
 * it; an algorithm may need 16-byte aligned operands and a weight inside
 * a gathered unit need not be). The cache holds BLAS_PLANS, least
 * recently used out first. Staging, the ones vector and the workspace
 * come from the device's allocator, grown on first use of a larger shape
 * and never in a step that repeats a shape.
 */
#include "config.h"
#include "compute/cuda/matmul_cuda.h"
#include "compute/cuda/kernels_cuda.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLAS_PLANS 32
#define BLAS_WORKSPACE ((size_t)32 << 20)
#define BLAS_ALIGN 256
#define BLAS_STAGE_LIMIT ((size_t)64 << 20)

struct blas_key {
    uint64_t m, n, k;
    int64_t lda, ldb, ldc;
    int32_t ta, tb, at, bt, epilogue, compute;
    uint32_t align[5]; /* A, B, C, D, bias */
};

struct blas_plan {
    struct blas_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c; /* c serves C and D */
    cublasLtMatmulAlgo_t algo;
    unsigned long last_use; /* 0: slot empty */
};

struct fsdp_cuda_blas {
    struct fsdp_device *d;
    cublasLtHandle_t lt;
    void *workspace; /* BLAS_WORKSPACE bytes */
    void *stage;     /* 16-bit operand copies and a widened bias */
    size_t stage_bytes;
    size_t stage_limit; /* the most stage_bytes grows to (while one row fits) */
    float *ones; /* (ones_n) of 1.0f */
    size_t ones_n;
    int tf32;
    unsigned long clock, made;
    struct blas_plan plans[BLAS_PLANS];
};

/* One product D = alpha op(A) op(B) + beta C (+ bias per row of D); C and
 * D are f32 and share a layout. */
struct blas_gemm {
    cublasOperation_t ta, tb;
    size_t m, n, k;
    const void *A, *B;
    cudaDataType at, bt;
    int64_t lda, ldb, ldc;
    const float *C;
    float *D;
    float alpha, beta;
    const float *bias; /* (m) or NULL */
    int exact;         /* never TF32 */
    size_t step[4];    /* bytes from a tile's A, B, C, D to the next tile's (0: the same) */
};

// ----------------------------------------------------------------------------
// errors

static int blas_fail(const struct fsdp_cuda_blas *b, const char *call, cublasStatus_t st)
{
    return fsdp_err(FSDP_ERR_BACKEND, "cuda device %d: %.*s failed: %s (status %d)", b->d->index,
                    (int)strcspn(call, "("), call, cublasLtGetStatusName(st), (int)st);
}

#define LT_TRY(b, call)                                                                            \
    do {                                                                                           \
        cublasStatus_t lt_try_st_ = (call);                                                        \
        if (lt_try_st_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            return blas_fail((b), #call, lt_try_st_);                                              \
        }                                                                                          \
    } while (0)

// ----------------------------------------------------------------------------
// device buffers

static size_t blas_round(size_t bytes)
{
    return (bytes + BLAS_ALIGN - 1) / BLAS_ALIGN * BLAS_ALIGN;
}

/* *p holds at least need bytes: kept when it does, else replaced. */
static int blas_grow(struct fsdp_cuda_blas *b, void **p, size_t *have, size_t need,
                     const char *name)
{
    if (*have >= need) {
        return 0;
    }
    if (*p) {
        b->d->ops->free(b->d, *p);
        *p = NULL;
        *have = 0;
    }
    FSDP_CHECK(fsdp_device_alloc(b->d, need, name, p));
    *have = need;
    return 0;
}

/* A ones vector of at least n floats. */
static int blas_ones(struct fsdp_cuda_blas *b, size_t n, void *stream)
{
    if (b->ones_n >= n) {
        return 0;
    }
    size_t have = b->ones_n * sizeof(float);
    void *p = b->ones;
    FSDP_CHECK(blas_grow(b, &p, &have, blas_round(n * sizeof(float)), "cuda matmul ones"));
    b->ones = p;
    b->ones_n = have / sizeof(float);
    fsdp_cuda_fill(b->ones, b->ones_n, 1, 1.0f, stream);
    return 0;
}

static void blas_narrow(void *dst, const float *src, size_t n, enum fsdp_dtype pt, void *stream)
{
    if (pt == FSDP_BF16) {
        fsdp_cuda_f32_to_bf16(dst, src, n, stream);
    } else {
        fsdp_cuda_f32_to_f16(dst, src, n, stream);
    }
}

static void blas_widen(float *dst, const void *src, size_t n, enum fsdp_dtype pt, void *stream)
{
    if (pt == FSDP_BF16) {
        fsdp_cuda_bf16_to_f32(dst, src, n, stream);
    } else {
        fsdp_cuda_f16_to_f32(dst, src, n, stream);
    }
}

// ----------------------------------------------------------------------------
// handle

int fsdp_cuda_blas_create(struct fsdp_device *d, struct fsdp_cuda_blas **out)
{
    *out = NULL;
    struct fsdp_cuda_blas *b = calloc(1, sizeof(*b));
    if (!b) {
        return fsdp_err(FSDP_ERR_NOMEM, "cuda matmul: handle");
    }
    b->d = d;
    b->stage_limit = BLAS_STAGE_LIMIT;
    cublasStatus_t st = cublasLtCreate(&b->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        int rc = blas_fail(b, "cublasLtCreate", st);
        free(b);
        return rc;
    }
    int rc = fsdp_device_alloc(d, BLAS_WORKSPACE, "cuda matmul workspace", &b->workspace);
    if (rc < 0) {
        fsdp_cuda_blas_destroy(b);
        return rc;
    }
    b->tf32 = fsdp_env_int("FSDPC_CUDA_TF32", 0) == 1;
    if (b->tf32) {
        FSDP_INFO(FSDP_SUB_CORE,
                  "cuda device %d: f32 matmuls round their inputs to TF32 (FSDPC_CUDA_TF32=1)",
                  d->index);
    }
    *out = b;
    return 0;
}

static void blas_plan_clear(struct blas_plan *p)
{
    if (p->a) {
        cublasLtMatrixLayoutDestroy(p->a);
    }
    if (p->b) {
        cublasLtMatrixLayoutDestroy(p->b);
    }
    if (p->c) {
        cublasLtMatrixLayoutDestroy(p->c);
    }
    if (p->desc) {
        cublasLtMatmulDescDestroy(p->desc);
    }
    memset(p, 0, sizeof(*p));
}

void fsdp_cuda_blas_destroy(struct fsdp_cuda_blas *b)
{
    if (!b) {
        return;
    }
    for (int i = 0; i < BLAS_PLANS; i++) {
        blas_plan_clear(&b->plans[i]);
    }
    void *bufs[] = {b->workspace, b->stage, b->ones};
    for (int i = 0; i < 3; i++) {
        if (bufs[i]) {
            b->d->ops->free(b->d, bufs[i]);
        }
    }
    if (b->lt) {
        cublasLtDestroy(b->lt);
    }
    free(b);
}

unsigned long fsdp_cuda_blas_plans_made(const struct fsdp_cuda_blas *b)
{
    return b->made;
}

void fsdp_cuda_blas_set_stage_limit(struct fsdp_cuda_blas *b, size_t bytes)
{
    b->stage_limit = bytes ? bytes : BLAS_STAGE_LIMIT;
    if (b->stage && b->stage_bytes > b->stage_limit) {
        b->d->ops->free(b->d, b->stage);
        b->stage = NULL;
        b->stage_bytes = 0;
    }
}

// ----------------------------------------------------------------------------
// plans

/* The largest power of two up to BLAS_ALIGN that divides p's address. */
static uint32_t blas_alignment(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = BLAS_ALIGN;
    while (al > 1 && a % al) {
        al /= 2;
    }
    return al;
}

static struct blas_key blas_key_of(const struct fsdp_cuda_blas *b, const struct blas_gemm *g)
{
    struct blas_key k;
    memset(&k, 0, sizeof(k)); /* padding too: keys compare with memcmp */
    k.m = g->m;
    k.n = g->n;
    k.k = g->k;
    k.lda = g->lda;
    k.ldb = g->ldb;
    k.ldc = g->ldc;
    k.ta = g->ta;
    k.tb = g->tb;
    k.at = g->at;
    k.bt = g->bt;
    k.epilogue = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    int tf32 = b->tf32 && !g->exact && g->at == CUDA_R_32F && g->bt == CUDA_R_32F;
    k.compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const void *ops[4] = {g->A, g->B, g->C ? (const void *)g->C : (const void *)g->D, g->D};
    for (int i = 0; i < 4; i++) { /* what every tile keeps */
        uint32_t a = blas_alignment(ops[i]), s = blas_alignment((const void *)g->step[i]);
        k.align[i] = g->step[i] && s < a ? s : a;
    }
    k.align[4] = g->bias ? blas_alignment(g->bias) : 0;
    return k;
}

/* The descriptor and layouts of key (column-major, as stored); with the
 * BIAS epilogue the bias pointer too, as the heuristic reads its
 * alignment. */
static int blas_plan_describe(struct fsdp_cuda_blas *b, struct blas_plan *p, const void *bias)
{
    const struct blas_key *k = &p->key;
    int32_t ta = k->ta, tb = k->tb;
    uint32_t epi = (uint32_t)k->epilogue;
    LT_TRY(b, cublasLtMatmulDescCreate(&p->desc, (cublasComputeType_t)k->compute, CUDA_R_32F));
    LT_TRY(b,
           cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    LT_TRY(b,
           cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    LT_TRY(b, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                             sizeof(epi)));
    if (bias) {
        LT_TRY(b, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                 sizeof(bias)));
    }
    uint64_t ar = ta == CUBLAS_OP_N ? k->m : k->k, ac = ta == CUBLAS_OP_N ? k->k : k->m;
    uint64_t br = tb == CUBLAS_OP_N ? k->k : k->n, bc = tb == CUBLAS_OP_N ? k->n : k->k;
    LT_TRY(b, cublasLtMatrixLayoutCreate(&p->a, (cudaDataType)k->at, ar, ac, k->lda));
    LT_TRY(b, cublasLtMatrixLayoutCreate(&p->b, (cudaDataType)k->bt, br, bc, k->ldb));
    LT_TRY(b, cublasLtMatrixLayoutCreate(&p->c, CUDA_R_32F, k->m, k->n, k->ldc));
    return 0;
}

/* The heuristic's first algorithm for p, told the workspace and the
 * pointers' alignments. */
static int blas_plan_choose(struct fsdp_cuda_blas *b, struct blas_plan *p)
{
    static const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    cublasLtMatmulPreference_t pref = NULL;
    LT_TRY(b, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = BLAS_WORKSPACE;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const char *call = "cublasLtMatmulPreferenceSetAttribute";
    for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++) {
        st = cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &p->key.align[i],
                                                  sizeof(p->key.align[i]));
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatmulAlgoGetHeuristic";
        st = cublasLtMatmulAlgoGetHeuristic(b->lt, p->desc, p->a, p->b, p->c, p->c, pref, 1, &res,
                                            &found);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return blas_fail(b, call, st);
    }
    if (found < 1) {
        return blas_fail(b, "cublasLtMatmulAlgoGetHeuristic (no algorithm)",
                         CUBLAS_STATUS_NOT_SUPPORTED);
    }
    p->algo = res.algo;
    return 0;
}

/* The cached plan of key, made (in the least recently used slot) when
 * there is none. */
static int blas_plan_get(struct fsdp_cuda_blas *b, const struct blas_key *key, const void *bias,
                         struct blas_plan **out)
{
    struct blas_plan *victim = &b->plans[0];
    for (int i = 0; i < BLAS_PLANS; i++) {
        struct blas_plan *p = &b->plans[i];
        if (p->last_use && memcmp(&p->key, key, sizeof(*key)) == 0) {
            p->last_use = ++b->clock;
            *out = p;
            return 0;
        }
        if (p->last_use < victim->last_use) {
            victim = p;
        }
    }
    blas_plan_clear(victim);
    victim->key = *key;
    int rc = blas_plan_describe(b, victim, bias);
    if (rc == 0) {
        rc = blas_plan_choose(b, victim);
    }
    if (rc < 0) {
        blas_plan_clear(victim);
        return rc;
    }
    b->made++;
    victim->last_use = ++b->clock;
    *out = victim;
    return 0;
}

// ----------------------------------------------------------------------------
// one product

static int blas_run(struct fsdp_cuda_blas *b, const struct blas_gemm *g, void *stream)
{
    struct blas_key key = blas_key_of(b, g);
    struct blas_plan *p;
    FSDP_CHECK(blas_plan_get(b, &key, g->bias, &p));
    if (g->bias) {
        const void *bias = g->bias;
        LT_TRY(b, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                 sizeof(bias)));
    }
    const void *C = g->C ? (const void *)g->C : (const void *)g->D;
    LT_TRY(b, cublasLtMatmul(b->lt, p->desc, &g->alpha, g->A, p->a, g->B, p->b, &g->beta, C, p->c,
                             g->D, p->c, &p->algo, b->workspace, BLAS_WORKSPACE,
                             (cudaStream_t)stream));
    return 0;
}

static int blas_check_pt(const struct fsdp_cuda_blas *b, enum fsdp_dtype pt)
{
    if (pt != FSDP_F32 && pt != FSDP_BF16 && pt != FSDP_F16) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "cuda device %d: matmul weights of dtype %s",
                        b->d->index, fsdp_dtype_name(pt));
    }
    return 0;
}

/* cuBLASLt has no empty matrices; a layer always has C, OC >= 1 */
static int blas_check_dims(const struct fsdp_cuda_blas *b, size_t C, size_t OC)
{
    if (C == 0 || OC == 0) {
        return fsdp_err(FSDP_ERR_INVALID, "cuda device %d: matmul with C = %zu, OC = %zu",
                        b->d->index, C, OC);
    }
    return 0;
}

static cudaDataType blas_type(enum fsdp_dtype pt)
{
    return pt == FSDP_BF16 ? CUDA_R_16BF : pt == FSDP_F16 ? CUDA_R_16F : CUDA_R_32F;
}

// ----------------------------------------------------------------------------
// the linear layer

static int blas_check_act(const struct fsdp_cuda_blas *b, enum fsdp_dtype at)
{
    if (at != FSDP_F32 && at != FSDP_BF16) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "cuda device %d: matmul activations of dtype %s",
                        b->d->index, fsdp_dtype_name(at));
    }
    return 0;
}

/* Rows per tile: all N when they stage within the limit, else as many as
 * fit beside fixed bytes at row_bytes a row (each of up to three parts
 * rounded to BLAS_ALIGN), a multiple of 256 when 256 or more fit; at
 * least one. */
static size_t blas_tile_rows(const struct fsdp_cuda_blas *b, size_t N, size_t fixed,
                             size_t row_bytes)
{
    size_t slack = fixed + 3 * BLAS_ALIGN;
    if (row_bytes == 0 || fixed + N * row_bytes <= b->stage_limit) {
        return N;
    }
    size_t rows = b->stage_limit > slack ? (b->stage_limit - slack) / row_bytes : 0;
    if (rows >= N) {
        return N;
    }
    if (rows >= BLAS_ALIGN) {
        rows -= rows % BLAS_ALIGN;
    }
    return rows ? rows : 1;
}

/*
 * What the forward stages and where, for tiles of rows rows: [f32 bias |
 * 16-bit input | f32 input | f32 output], each part present only when
 * needed: the bias widened (16-bit weights), the input cast to pt (16-bit
 * weights, an input of another dtype), widened (a bf16 input, weights not
 * bf16), and y the f32 D a bf16 output is rounded from.
 */
struct blas_fwd_stage {
    int cast, widen, y;
    size_t rows, ob, o16, ox, oy, need;
};

static void blas_fwd_layout(const struct fsdp_cuda_blas *b, struct blas_fwd_stage *s,
                            enum fsdp_dtype ot, enum fsdp_dtype it, int bias, enum fsdp_dtype pt,
                            size_t N, size_t C, size_t OC)
{
    s->cast = pt != FSDP_F32 && pt != it;
    s->widen = it != FSDP_F32 && pt != it;
    s->y = ot != FSDP_F32;
    size_t fixed = pt != FSDP_F32 && bias ? blas_round(OC * 4) : 0;
    size_t row = (s->cast ? C * 2 : 0) + (s->widen ? C * 4 : 0) + (s->y ? OC * 4 : 0);
    s->rows = blas_tile_rows(b, N, fixed, row);
    s->ob = 0;
    s->o16 = fixed;
    s->ox = s->o16 + (s->cast ? blas_round(s->rows * C * 2) : 0);
    s->oy = s->ox + (s->widen ? blas_round(s->rows * C * 4) : 0);
    s->need = s->oy + (s->y ? s->rows * OC * 4 : 0);
}

/* A tile's input (n values of it) as the product reads it: itself, or
 * widened and/or cast in staging. */
static const void *blas_fwd_input(const struct blas_fwd_stage *s, char *st, const void *x,
                                  enum fsdp_dtype it, enum fsdp_dtype pt, size_t n, void *stream)
{
    if (s->widen) { /* bf16 activations, f32 or f16 weights */
        blas_widen((float *)(st + s->ox), x, n, it, stream);
        x = st + s->ox;
    }
    if (s->cast) { /* 16-bit weights, an f32 (or widened) input */
        blas_narrow(st + s->o16, (const float *)x, n, pt, stream);
        x = st + s->o16;
    }
    return x;
}

/* The forward's operands that stay put across tiles (weight, the bias as
 * D's type), and the layout. */
struct blas_fwd {
    struct blas_fwd_stage s;
    char *st;
    const void *weight;
    const float *bias32;
    enum fsdp_dtype ot, it, pt;
    size_t C, OC;
};

/* Rows [r, r + n) of out: one product (bias and residual per tile). */
static int blas_fwd_tile(struct fsdp_cuda_blas *b, const struct blas_fwd *f, void *out,
                         const void *inp, const float *residual, size_t r, size_t n, int tiled,
                         void *stream)
{
    size_t C = f->C, OC = f->OC, ies = f->it == FSDP_F32 ? 4 : 2, oes = f->ot == FSDP_F32 ? 4 : 2;
    const char *xin = (const char *)inp + r * C * ies;
    char *o = (char *)out + r * OC * oes;
    const void *x = blas_fwd_input(&f->s, f->st, xin, f->it, f->pt, n * C, stream);
    float *y = f->s.y ? (float *)(f->st + f->s.oy) : (float *)o;
    size_t sx = tiled && x == xin ? f->s.rows * C * ies : 0,
           sy = tiled && !f->s.y ? f->s.rows * OC * 4 : 0;
    size_t sr = tiled && residual ? f->s.rows * OC * 4 : sy;
    struct blas_gemm g = {
        .ta = CUBLAS_OP_T,
        .tb = CUBLAS_OP_N,
        .m = OC,
        .n = n,
        .k = C,
        .A = f->weight,
        .at = blas_type(f->pt),
        .lda = (int64_t)C,
        .B = x,
        .bt = blas_type(f->pt),
        .ldb = (int64_t)C,
        .C = residual ? residual + r * OC : NULL,
        .D = y,
        .ldc = (int64_t)OC,
        .alpha = 1.0f,
        .beta = residual ? 1.0f : 0.0f,
        .bias = f->bias32,
        .step = {0, sx, sr, sy},
    };
    FSDP_CHECK(blas_run(b, &g, stream));
    if (f->s.y) { /* the f32 result rounded to nearest even */
        fsdp_cuda_f32_to_bf16((uint16_t *)o, y, n * OC, stream);
    }
    return 0;
}

int fsdp_cuda_matmul_forward(struct fsdp_cuda_blas *b, void *out, enum fsdp_dtype ot,
                             const void *inp, enum fsdp_dtype it, const void *weight,
                             const void *bias, enum fsdp_dtype pt, const float *residual, size_t N,
                             size_t C, size_t OC, void *stream)
{
    FSDP_CHECK(blas_check_pt(b, pt));
    FSDP_CHECK(blas_check_act(b, it));
    FSDP_CHECK(blas_check_act(b, ot));
    FSDP_CHECK(blas_check_dims(b, C, OC));
    if (residual && ot != FSDP_F32) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "cuda device %d: matmul with a residual writes f32, not %s; "
                        "round the sum after the product",
                        b->d->index, fsdp_dtype_name(ot));
    }
    if (N == 0) {
        return 0;
    }
    struct blas_fwd f = {
        .weight = weight, .bias32 = bias, .ot = ot, .it = it, .pt = pt, .C = C, .OC = OC};
    blas_fwd_layout(b, &f.s, ot, it, bias != NULL, pt, N, C, OC);
    if (f.s.need) {
        FSDP_CHECK(blas_grow(b, &b->stage, &b->stage_bytes, f.s.need, "cuda matmul staging"));
        f.st = b->stage;
    }
    if (pt != FSDP_F32 && bias) { /* D's type, widened once for every tile */
        f.bias32 = (const float *)(f.st + f.s.ob);
        blas_widen((float *)f.bias32, bias, OC, pt, stream);
    }
    for (size_t r = 0; r < N; r += f.s.rows) {
        size_t n = N - r < f.s.rows ? N - r : f.s.rows;
        FSDP_CHECK(blas_fwd_tile(b, &f, out, inp, residual, r, n, f.s.rows < N, stream));
    }
    return 0;
}

/* dinp = alpha dout @ W (+ dinp), with dout rounded to pt when pt is
 * 16-bit: in tiles of rows when that staging would pass the limit. */
static int blas_dinp(struct fsdp_cuda_blas *b, float *dinp, const float *dout, const void *weight,
                     enum fsdp_dtype pt, size_t N, size_t C, size_t OC, float alpha, int accumulate,
                     void *stream)
{
    size_t rows = pt == FSDP_F32 ? N : blas_tile_rows(b, N, 0, OC * 2);
    if (pt != FSDP_F32) {
        FSDP_CHECK(blas_grow(b, &b->stage, &b->stage_bytes, blas_round(rows * OC * 2),
                             "cuda matmul staging"));
    }
    size_t sd = rows < N ? rows * C * 4 : 0;
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        const void *g16 = dout + r * OC;
        if (pt != FSDP_F32) {
            blas_narrow(b->stage, dout + r * OC, n * OC, pt, stream);
            g16 = b->stage;
        }
        struct blas_gemm g = {
            .ta = CUBLAS_OP_N,
            .tb = CUBLAS_OP_N,
            .m = C,
            .n = n,
            .k = OC,
            .A = weight,
            .at = blas_type(pt),
            .lda = (int64_t)C,
            .B = g16,
            .bt = blas_type(pt),
            .ldb = (int64_t)OC,
            .D = dinp + r * C,
            .ldc = (int64_t)C,
            .alpha = alpha,
            .beta = accumulate ? 1.0f : 0.0f, /* the tiles are disjoint rows */
            .step = {0, 0, sd, sd},
        };
        FSDP_CHECK(blas_run(b, &g, stream));
    }
    return 0;
}

/* dweight += alpha inp^T dout, a bf16 inp widened exactly (the weight
 * gradient stays f32) in tiles of rows when that would pass the limit:
 * N is the reduction, so each tile's product adds into dweight in order. */
static int blas_dweight(struct fsdp_cuda_blas *b, float *dweight, const float *dout,
                        const void *inp, enum fsdp_dtype it, size_t N, size_t C, size_t OC,
                        float alpha, void *stream)
{
    size_t rows = it == FSDP_F32 ? N : blas_tile_rows(b, N, 0, C * 4);
    if (it != FSDP_F32) {
        FSDP_CHECK(blas_grow(b, &b->stage, &b->stage_bytes, rows * C * 4, "cuda matmul staging"));
    }
    size_t sb = rows < N ? rows * OC * 4 : 0;
    for (size_t r = 0; r < N; r += rows) {
        size_t n = N - r < rows ? N - r : rows;
        const void *x = (const float *)inp + r * C;
        if (it != FSDP_F32) {
            blas_widen(b->stage, (const uint16_t *)inp + r * C, n * C, it, stream);
            x = b->stage;
        }
        struct blas_gemm g = {
            .ta = CUBLAS_OP_N,
            .tb = CUBLAS_OP_T,
            .m = C,
            .n = OC,
            .k = n,
            .A = x,
            .at = CUDA_R_32F,
            .lda = (int64_t)C,
            .B = dout + r * OC,
            .bt = CUDA_R_32F,
            .ldb = (int64_t)OC,
            .D = dweight,
            .ldc = (int64_t)C,
            .alpha = alpha,
            .beta = 1.0f, /* dweight accumulates, and each later tile adds to it */
            .step = {0, sb, 0, 0},
        };
        FSDP_CHECK(blas_run(b, &g, stream));
    }
    return 0;
}

int fsdp_cuda_matmul_backward(struct fsdp_cuda_blas *b, float *dinp, float *dweight, float *dbias,
                              const float *dout, const void *inp, enum fsdp_dtype it,
                              const void *weight, enum fsdp_dtype pt, size_t N, size_t C, size_t OC,
                              float alpha, int accumulate_dinp, void *stream)
{
    FSDP_CHECK(blas_check_pt(b, pt));
    FSDP_CHECK(blas_check_act(b, it));
    FSDP_CHECK(blas_check_dims(b, C, OC));
    if (N == 0) {
        return 0;
    }
    if (dinp) {
        FSDP_CHECK(blas_dinp(b, dinp, dout, weight, pt, N, C, OC, alpha, accumulate_dinp, stream));
    }
    if (dweight) {
        FSDP_CHECK(blas_dweight(b, dweight, dout, inp, it, N, C, OC, alpha, stream));
    }
    if (dbias) {
        FSDP_CHECK(blas_ones(b, N, stream));
        struct blas_gemm g = {
            .ta = CUBLAS_OP_N,
            .tb = CUBLAS_OP_N,
            .m = OC,
            .n = 1,
            .k = N,
            .A = dout,
            .at = CUDA_R_32F,
            .lda = (int64_t)OC,
            .B = b->ones,
            .bt = CUDA_R_32F,
            .ldb = (int64_t)N,
            .D = dbias,
            .ldc = (int64_t)OC,
            .alpha = alpha,
            .beta = 1.0f,
            .exact = 1,
        };
        FSDP_CHECK(blas_run(b, &g, stream));
    }
    return 0;
}
