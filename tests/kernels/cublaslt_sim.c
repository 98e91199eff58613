/*
 * cublaslt_sim.c - a simulation of the cuBLASLt calls the cuda device's
 * matmuls make, for test_cuda_matmul (cublaslt_sim.h says what it
 * computes and what it refuses). Nothing here touches a GPU or
 * libcublasLt. Checks run at the call, as the library's do; the product
 * runs as an item of the stream (cuda_sim.c), so it sees the copies and
 * kernels queued before it and none after.
 */
#include "config.h"
#include "compute/kernels.h"
#include "tests/kernels/cublaslt_sim.h"
#include "tests/kernels/cuda_sim.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

const char *sim_lt_fail_call;
cublasStatus_t sim_lt_fail_status;
size_t sim_lt_algo_workspace = (size_t)1 << 20;
int sim_lt_heuristics, sim_lt_matmuls, sim_lt_refused, sim_lt_tf32;

static int sim_lt_objects;

#define SIM_LT_MAGIC 0x6c74616c676f3031ull /* "ltalgo01" */

struct cublasLtContext {
    uint64_t magic;
};

struct cublasLtMatrixLayoutOpaque_sim {
    int32_t type, order;
    uint64_t rows, cols;
    int64_t ld;
};

struct cublasLtMatmulDescOpaque_sim {
    int32_t compute, scale, pointer_mode, ta, tb, bias_type;
    uint32_t epilogue;
    const void *bias;
};

struct cublasLtMatmulPreferenceOpaque_sim {
    uint64_t max_ws;
    uint32_t align[4];
};

void sim_lt_reset(void)
{
    sim_lt_fail_call = NULL;
    sim_lt_algo_workspace = (size_t)1 << 20;
    sim_lt_heuristics = sim_lt_matmuls = sim_lt_refused = sim_lt_tf32 = 0;
}

int sim_lt_live(void)
{
    return sim_lt_objects;
}

static cublasStatus_t sim_lt_refuse(cublasStatus_t st)
{
    sim_lt_refused++;
    return st;
}

static cublasStatus_t sim_lt_enter(const char *call)
{
    if (sim_lt_fail_call && strcmp(sim_lt_fail_call, call) == 0) {
        sim_lt_fail_call = NULL;
        return sim_lt_fail_status;
    }
    return CUBLAS_STATUS_SUCCESS;
}

#define SIM_LT_ENTER(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t sim_lt_st_ = sim_lt_enter(call);                                            \
        if (sim_lt_st_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            return sim_lt_st_;                                                                     \
        }                                                                                          \
    } while (0)

// ----------------------------------------------------------------------------
// handle, status names

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    SIM_LT_ENTER("cublasLtCreate");
    *lightHandle = calloc(1, sizeof(**lightHandle));
    (*lightHandle)->magic = SIM_LT_MAGIC;
    sim_lt_objects++;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!lightHandle || lightHandle->magic != SIM_LT_MAGIC) {
        return sim_lt_refuse(CUBLAS_STATUS_NOT_INITIALIZED);
    }
    lightHandle->magic = 0;
    free(lightHandle);
    sim_lt_objects--;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS:
        return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    return cublasLtGetStatusName(status);
}

// ----------------------------------------------------------------------------
// descriptors

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    SIM_LT_ENTER("cublasLtMatrixLayoutCreate");
    *matLayout = calloc(1, sizeof(**matLayout));
    **matLayout = (struct cublasLtMatrixLayoutOpaque_sim){
        .type = type, .order = CUBLASLT_ORDER_COL, .rows = rows, .cols = cols, .ld = ld};
    sim_lt_objects++;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    free(matLayout);
    sim_lt_objects--;
    return CUBLAS_STATUS_SUCCESS;
}

/* Copies an attribute of exactly size bytes, or refuses. */
static cublasStatus_t sim_lt_set(void *field, size_t size, const void *buf, size_t sizeInBytes)
{
    if (!buf || sizeInBytes != size) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    memcpy(field, buf, size);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t sizeInBytes)
{
    SIM_LT_ENTER("cublasLtMatrixLayoutSetAttribute");
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
        return sim_lt_set(&l->type, 4, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
        return sim_lt_set(&l->order, 4, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
        return sim_lt_set(&l->rows, 8, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
        return sim_lt_set(&l->cols, 8, buf, sizeInBytes);
    case CUBLASLT_MATRIX_LAYOUT_LD:
        return sim_lt_set(&l->ld, 8, buf, sizeInBytes);
    }
    return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    SIM_LT_ENTER("cublasLtMatmulDescCreate");
    *matmulDesc = calloc(1, sizeof(**matmulDesc));
    **matmulDesc = (struct cublasLtMatmulDescOpaque_sim){
        .compute = computeType,
        .scale = scaleType,
        .pointer_mode = CUBLASLT_POINTER_MODE_HOST,
        .ta = CUBLAS_OP_N,
        .tb = CUBLAS_OP_N,
        .bias_type = -1,
        .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
    };
    sim_lt_objects++;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    free(matmulDesc);
    sim_lt_objects--;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t m,
                                              cublasLtMatmulDescAttributes_t attr, const void *buf,
                                              size_t sizeInBytes)
{
    SIM_LT_ENTER("cublasLtMatmulDescSetAttribute");
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
        return sim_lt_set(&m->compute, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
        return sim_lt_set(&m->scale, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
        return sim_lt_set(&m->pointer_mode, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSA:
        return sim_lt_set(&m->ta, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_TRANSB:
        return sim_lt_set(&m->tb, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        return sim_lt_set(&m->epilogue, 4, buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        return sim_lt_set(&m->bias, sizeof(void *), buf, sizeInBytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        return sim_lt_set(&m->bias_type, 4, buf, sizeInBytes);
    }
    return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    SIM_LT_ENTER("cublasLtMatmulPreferenceCreate");
    *pref = calloc(1, sizeof(**pref));
    **pref = (struct cublasLtMatmulPreferenceOpaque_sim){.align = {256, 256, 256, 256}};
    sim_lt_objects++;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    free(pref);
    sim_lt_objects--;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    SIM_LT_ENTER("cublasLtMatmulPreferenceSetAttribute");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        return sim_lt_set(&p->max_ws, 8, buf, sizeInBytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
        return sim_lt_set(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], 4, buf,
                          sizeInBytes);
    }
    return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
}

// ----------------------------------------------------------------------------
// the rules

static size_t sim_lt_size(int32_t type)
{
    return type == CUDA_R_32F ? 4 : 2;
}

static int sim_lt_layout_ok(const struct cublasLtMatrixLayoutOpaque_sim *l)
{
    int known = l->type == CUDA_R_32F || l->type == CUDA_R_16F || l->type == CUDA_R_16BF;
    return known && l->rows >= 1 && l->cols >= 1 && l->ld >= (int64_t)l->rows;
}

/* The documented type table's rows for f32, bf16 and f16. */
static int sim_lt_types_ok(const struct cublasLtMatmulDescOpaque_sim *m, int32_t at, int32_t bt,
                           int32_t ct)
{
    if (m->scale != CUDA_R_32F || at != bt) {
        return 0;
    }
    if (m->compute == CUBLAS_COMPUTE_32F_FAST_TF32) {
        return at == CUDA_R_32F && ct == CUDA_R_32F;
    }
    if (m->compute != CUBLAS_COMPUTE_32F) {
        return 0;
    }
    return at == CUDA_R_32F ? ct == CUDA_R_32F : (ct == at || ct == CUDA_R_32F);
}

/* Everything the heuristic and the matmul both check. */
static cublasStatus_t sim_lt_check(cublasLtHandle_t h, cublasLtMatmulDesc_t m,
                                   cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                   cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d)
{
    if (!h || h->magic != SIM_LT_MAGIC) {
        return sim_lt_refuse(CUBLAS_STATUS_NOT_INITIALIZED);
    }
    if (!m || !a || !b || !c || !d) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    if (a->order != CUBLASLT_ORDER_COL || b->order != CUBLASLT_ORDER_COL ||
        c->order != CUBLASLT_ORDER_COL || d->order != CUBLASLT_ORDER_COL) {
        return sim_lt_refuse(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    if (!sim_lt_layout_ok(a) || !sim_lt_layout_ok(b) || !sim_lt_layout_ok(c) ||
        memcmp(c, d, sizeof(*c)) != 0) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    uint64_t am = m->ta == CUBLAS_OP_N ? a->rows : a->cols;
    uint64_t ak = m->ta == CUBLAS_OP_N ? a->cols : a->rows;
    uint64_t bk = m->tb == CUBLAS_OP_N ? b->rows : b->cols;
    uint64_t bn = m->tb == CUBLAS_OP_N ? b->cols : b->rows;
    int ops_ok = (m->ta == CUBLAS_OP_N || m->ta == CUBLAS_OP_T) &&
                 (m->tb == CUBLAS_OP_N || m->tb == CUBLAS_OP_T);
    if (!ops_ok || am != d->rows || bn != d->cols || ak != bk) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    if (!sim_lt_types_ok(m, a->type, b->type, d->type) ||
        m->pointer_mode != CUBLASLT_POINTER_MODE_HOST ||
        (m->epilogue != CUBLASLT_EPILOGUE_DEFAULT && m->epilogue != CUBLASLT_EPILOGUE_BIAS)) {
        return sim_lt_refuse(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    if (m->epilogue == CUBLASLT_EPILOGUE_BIAS && m->bias_type != -1 && m->bias_type != d->type) {
        return sim_lt_refuse(CUBLAS_STATUS_NOT_SUPPORTED);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* The largest power of two up to 256 dividing p (NULL: 256, as the value
 * 0 reads). */
static uint64_t sim_lt_align_of(const void *p)
{
    uint64_t a = 256;
    while (a > 1 && (uintptr_t)p % a) {
        a /= 2;
    }
    return a;
}

/* algo.data: magic, workspace bytes, the four alignments, the descriptor
 * and layouts it was chosen for (compared at the matmul), and the bias
 * pointer's alignment the heuristic read off the descriptor. */
static uint64_t sim_lt_fingerprint(cublasLtMatmulDesc_t m, cublasLtMatrixLayout_t a,
                                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d)
{
    const struct cublasLtMatrixLayoutOpaque_sim *ls[3] = {a, b, d};
    uint64_t h = 1469598103934665603ull;
    int32_t f[] = {m->compute, m->scale, m->ta, m->tb, (int32_t)m->epilogue};
    for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
        h = (h ^ (uint64_t)(uint32_t)f[i]) * 1099511628211ull;
    }
    for (int i = 0; i < 3; i++) {
        uint64_t g[] = {(uint64_t)ls[i]->type, ls[i]->rows, ls[i]->cols, (uint64_t)ls[i]->ld};
        for (int j = 0; j < 4; j++) {
            h = (h ^ g[j]) * 1099511628211ull;
        }
    }
    return h;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int *returnAlgoCount)
{
    SIM_LT_ENTER("cublasLtMatmulAlgoGetHeuristic");
    cublasStatus_t st = sim_lt_check(lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    if (!preference || requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    cublasLtMatmulHeuristicResult_t *r = &heuristicResultsArray[0];
    memset(r, 0, sizeof(*r));
    r->algo.data[0] = SIM_LT_MAGIC;
    r->workspaceSize =
        sim_lt_algo_workspace < preference->max_ws ? sim_lt_algo_workspace : preference->max_ws;
    r->algo.data[1] = r->workspaceSize;
    for (int i = 0; i < 4; i++) {
        r->algo.data[2 + i] = preference->align[i];
    }
    r->algo.data[6] = sim_lt_fingerprint(operationDesc, Adesc, Bdesc, Ddesc);
    r->algo.data[7] = operationDesc->epilogue == CUBLASLT_EPILOGUE_BIAS
                          ? sim_lt_align_of(operationDesc->bias)
                          : 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
    *returnAlgoCount = 1;
    sim_lt_heuristics++;
    return CUBLAS_STATUS_SUCCESS;
}

// ----------------------------------------------------------------------------
// the product

struct sim_lt_job {
    struct cublasLtMatmulDescOpaque_sim m;
    struct cublasLtMatrixLayoutOpaque_sim a, b, d;
    const void *A, *B, *C;
    void *D;
    float alpha, beta;
};

static float sim_lt_get(const void *p, int32_t type, size_t i)
{
    if (type == CUDA_R_32F) {
        return ((const float *)p)[i];
    }
    float f;
    if (type == CUDA_R_16BF) {
        fsdp_cpu_bf16_to_f32(&f, (const uint16_t *)p + i, 1);
    } else {
        fsdp_cpu_f16_to_f32(&f, (const uint16_t *)p + i, 1);
    }
    return f;
}

static void sim_lt_put(void *p, int32_t type, size_t i, float v)
{
    if (type == CUDA_R_32F) {
        ((float *)p)[i] = v;
    } else if (type == CUDA_R_16BF) {
        fsdp_cpu_f32_to_bf16((uint16_t *)p + i, &v, 1);
    } else {
        fsdp_cpu_f32_to_f16((uint16_t *)p + i, &v, 1);
    }
}

/* TF32 keeps 10 mantissa bits: round to nearest even on the f32 bits. */
static float sim_lt_tf32_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) {
        u += 0xfffu + ((u >> 13) & 1u);
        u &= ~0x1fffu;
    }
    memcpy(&x, &u, 4);
    return x;
}

/* op(X)[r, c] of a column-major stored X */
static float sim_lt_op(const void *X, const struct cublasLtMatrixLayoutOpaque_sim *l, int32_t op,
                       size_t r, size_t c, int tf32)
{
    size_t i = op == CUBLAS_OP_N ? r + c * (size_t)l->ld : c + r * (size_t)l->ld;
    float v = sim_lt_get(X, l->type, i);
    return tf32 ? sim_lt_tf32_round(v) : v;
}

static void sim_lt_run(void *arg)
{
    struct sim_lt_job *j = arg;
    size_t M = j->d.rows, Nn = j->d.cols;
    size_t K = j->m.ta == CUBLAS_OP_N ? j->a.cols : j->a.rows;
    int tf32 = j->m.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    const float *bias = j->m.epilogue == CUBLASLT_EPILOGUE_BIAS ? j->m.bias : NULL;
    for (size_t c = 0; c < Nn; c++) {
        for (size_t r = 0; r < M; r++) {
            float acc = 0.0f;
            for (size_t l = 0; l < K; l++) {
                acc += sim_lt_op(j->A, &j->a, j->m.ta, r, l, tf32) *
                       sim_lt_op(j->B, &j->b, j->m.tb, l, c, tf32);
            }
            size_t at = r + c * (size_t)j->d.ld;
            float v = j->alpha * acc;
            if (j->beta != 0.0f) {
                v += j->beta * sim_lt_get(j->C, j->d.type, at);
            }
            if (bias) {
                v += bias[r];
            }
            sim_lt_put(j->D, j->d.type, at, v);
        }
    }
    free(j);
}

/* Whether X (layout l) lies in device memory and is aligned as the
 * algorithm needs (and at least to its element). */
static int sim_lt_operand_ok(const void *X, const struct cublasLtMatrixLayoutOpaque_sim *l,
                             uint64_t align)
{
    size_t es = sim_lt_size(l->type);
    size_t extent = ((size_t)l->ld * (l->cols - 1) + l->rows) * es;
    uintptr_t p = (uintptr_t)X;
    return X && p % align == 0 && p % es == 0 && sim_is_device(X, extent);
}

static cublasStatus_t sim_lt_check_call(cublasLtMatmulDesc_t m, cublasLtMatrixLayout_t a,
                                        cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d,
                                        const cublasLtMatmulAlgo_t *algo, const void *const ops[4],
                                        const void *workspace, size_t ws)
{
    if (!algo || algo->data[0] != SIM_LT_MAGIC || algo->data[6] != sim_lt_fingerprint(m, a, b, d) ||
        ws < algo->data[1] || (algo->data[1] && !sim_is_device(workspace, algo->data[1]))) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    const struct cublasLtMatrixLayoutOpaque_sim *ls[4] = {a, b, d, d};
    for (int i = 0; i < 4; i++) {
        if (!sim_lt_operand_ok(ops[i], ls[i], algo->data[2 + i])) {
            return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
        }
    }
    if (m->epilogue == CUBLASLT_EPILOGUE_BIAS &&
        (!m->bias || (uintptr_t)m->bias % sim_lt_size(d->type) ||
         sim_lt_align_of(m->bias) < algo->data[7] ||
         !sim_is_device(m->bias, d->rows * sim_lt_size(d->type)))) {
        return sim_lt_refuse(CUBLAS_STATUS_INVALID_VALUE);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    SIM_LT_ENTER("cublasLtMatmul");
    cublasStatus_t st = sim_lt_check(lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    float al = *(const float *)alpha, be = *(const float *)beta;
    const void *ops[4] = {A, B, be != 0.0f ? C : D, D};
    st = sim_lt_check_call(computeDesc, Adesc, Bdesc, Ddesc, algo, ops, workspace,
                           workspaceSizeInBytes);
    if (st != CUBLAS_STATUS_SUCCESS) {
        return st;
    }
    struct sim_lt_job *j = calloc(1, sizeof(*j));
    *j = (struct sim_lt_job){.m = *computeDesc,
                             .a = *Adesc,
                             .b = *Bdesc,
                             .d = *Ddesc,
                             .A = A,
                             .B = B,
                             .C = C,
                             .D = D,
                             .alpha = al,
                             .beta = be};
    sim_lt_matmuls++;
    sim_lt_tf32 += computeDesc->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    if (sim_enqueue_fn(stream, sim_lt_run, j) != cudaSuccess) {
        free(j);
        return sim_lt_refuse(CUBLAS_STATUS_EXECUTION_FAILED);
    }
    return CUBLAS_STATUS_SUCCESS;
}
