/*
 * attention.cu - causal attention on the GPU, flash style: forward with an
 * online softmax over key tiles that saves only each row's log-sum-exp,
 * backward that recomputes the probabilities from it, and the one-position
 * decode. Same layouts and results as compute/cpu/attention.c and decode.c
 * (contract in attention_cuda.h); f32 storage and f32 math, no tensor cores.
 *
 * Every kernel runs 4 warps a block. A lane owns columns d = lane + 32 c
 * (c < 4) of a head's accumulators, so hs is at most 128, and for the
 * products one lane takes one key (forward, dQ) or one query row (dK/dV) of
 * a 32-wide tile, reading its row from shared memory padded to hs + 1
 * floats (no bank conflicts), while the row on the other side of the dot
 * product is read by the whole warp at once (a broadcast). Each warp passes
 * its 32 probabilities (or score gradients) to its lanes through a
 * per-warp slice of shared memory and __syncwarp, not through shuffles.
 *
 *   forward   grid (T / 16, NH, B): 16 query rows, 4 a warp; key tiles of
 *             32 up to the block's last row; shared q (16, hs), k and v
 *             (32, hs + 1), the warps' scores (4, 4, 32).
 *   dQ        grid (T / 16, NH, B): the forward's shape; q and dO (16, hs),
 *             D = dO . O per row computed at the start.
 *   dK, dV    grid (T / 16, NKV, B): 16 key rows, 4 a warp, for every query
 *             head of the kv group in turn and every 32-row query tile from
 *             the block's first key on; shared k and v (16, hs), q and dO
 *             (32, hs + 1), lse (32), P and dS (4, 4, 2, 32). A lane
 *             computes D for its query row itself.
 *   decode    grid (NH): each warp runs its own online softmax over every
 *             fourth 32-key chunk of the cache; the 4 partial results are
 *             merged in warp order.
 * dQ and dK/dV are separate kernels, so every gradient element is written
 * by one thread that sums its terms in an order fixed by the shapes: no
 * atomics, the same bits on every run. The dK/dV block reads each K/V row
 * once for all the heads of its group (grouped-query attention without
 * repeating K/V); forward and dQ take one query head a block and find the
 * shared K/V rows in L2. At hs = 128 the backward kernels need 50 and 52
 * KiB of shared memory, above the default 48 KiB, so the wrappers raise
 * the kernels' limit (sm_80 allows 163 KiB, sm_90 227 KiB).
 */
#include "compute/cuda/common.cuh"
#include "compute/cuda/attention_cuda.h"

#define FSDP_ATT_WARPS 4
#define FSDP_ATT_THREADS (32 * FSDP_ATT_WARPS)
#define FSDP_ATT_DPL (FSDP_CUDA_ATTENTION_MAX_HS / 32) /* columns a lane */
#define FSDP_ATT_RPW 4                                 /* query rows a warp (forward, dQ) */
#define FSDP_ATT_BR (FSDP_ATT_WARPS * FSDP_ATT_RPW)    /* query rows a block (forward, dQ) */
#define FSDP_ATT_BC 32                                 /* keys a tile: one a lane */
#define FSDP_ATT_KPW 4                                 /* key rows a warp (dK/dV) */
#define FSDP_ATT_BK (FSDP_ATT_WARPS * FSDP_ATT_KPW)    /* key rows a block (dK/dV) */
#define FSDP_ATT_BQ 32                                 /* query rows a tile (dK/dV): one a lane */

/* the loops over a lane's rows, keys and columns unrolled, so that their
 * accumulators stay in registers (indexed at run time they would live in
 * local memory) */
#if defined(__CUDACC__)
#define FSDP_ATT_UNROLL _Pragma("unroll")
#else
#define FSDP_ATT_UNROLL
#endif

struct fsdp_att_dims {
    int T, NH, NKV, hs, group;
    int abf16;    /* qkv and out stored as bf16 (1) or f32 (0): converted in registers */
    size_t ld, C; /* row strides: qkv (C + 2 NKV hs), out (C = NH hs) */
    float scale;  /* 1 / sqrt(hs) */
};

static struct fsdp_att_dims fsdp_att_dims_of(int T, int NH, int NKV, int hs, int abf16)
{
    struct fsdp_att_dims a;
    a.T = T, a.NH = NH, a.NKV = NKV, a.hs = hs, a.group = NH / NKV, a.abf16 = abf16;
    a.C = (size_t)NH * (size_t)hs;
    a.ld = a.C + 2 * (size_t)NKV * (size_t)hs;
    a.scale = 1.0f / sqrtf((float)hs);
    return a;
}

static __device__ __forceinline__ int fsdp_att_min(int a, int b)
{
    return a < b ? a : b;
}

static __device__ __forceinline__ float fsdp_att_dot(const float *a, const float *b, int n)
{
    float s = 0.0f;
    for (int d = 0; d < n; d++) {
        s += a[d] * b[d];
    }
    return s;
}

/* dst rows [0, nr) (stride ldd) <- rows [r0, r0 + nr) of the tensor at
 * element off of src (stride lds; bf16: stored as bf16), zeros for rows at
 * or past T; by the whole block, coalesced */
static __device__ __forceinline__ void fsdp_att_load(float *dst, int ldd, const void *src,
                                                     size_t off, size_t lds, int r0, int nr, int T,
                                                     int hs, int bf16)
{
    for (int t = (int)threadIdx.x; t < nr * hs; t += (int)blockDim.x) {
        int r = t / hs, d = t - r * hs;
        dst[r * ldd + d] = r0 + r < T ? fsdp_ld(src, off + (size_t)(r0 + r) * lds + d, bf16) : 0.0f;
    }
}

/* a . (n values at element off of p, bf16: stored as bf16) */
static __device__ __forceinline__ float fsdp_att_dot_at(const float *a, const void *p, size_t off,
                                                        int n, int bf16)
{
    float s = 0.0f;
    for (int d = 0; d < n; d++) {
        s += a[d] * fsdp_ld(p, off + (size_t)d, bf16);
    }
    return s;
}

// ----------------------------------------------------------------------------
// forward

/* One key tile [j0, j0 + 32) for the warp's rows i0 + r0 + kr: scores into
 * w, the new running max, then the probabilities into w for the sums. */
static __device__ __forceinline__ void fsdp_att_forward_tile(float (*o)[FSDP_ATT_DPL], float *m,
                                                             float *l, float *w, const float *qs,
                                                             const float *kt, const float *vt,
                                                             int i0, int r0, int j0,
                                                             const struct fsdp_att_dims *a)
{
    int hs = a->hs, ks = hs + 1, lane = (int)(threadIdx.x & 31u), j = j0 + lane;
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        int i = i0 + r0 + kr;
        w[kr * 32 + lane] = i < a->T && j <= i
                                ? a->scale * fsdp_att_dot(qs + (r0 + kr) * hs, kt + lane * ks, hs)
                                : -INFINITY;
    }
    __syncwarp();
    float p[FSDP_ATT_RPW], corr[FSDP_ATT_RPW];
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        float mt = m[kr], s = w[kr * 32 + lane];
        for (int jj = 0; jj < 32; jj++) {
            mt = fmaxf(mt, w[kr * 32 + jj]);
        }
        /* mt is -inf only while the row has seen no key */
        p[kr] = s == -INFINITY ? 0.0f : expf(s - mt);
        corr[kr] = mt == -INFINITY ? 1.0f : expf(m[kr] - mt);
        m[kr] = mt;
    }
    __syncwarp(); /* every lane has read the scores */
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        w[kr * 32 + lane] = p[kr];
    }
    __syncwarp();
    int jn = fsdp_att_min(FSDP_ATT_BC, a->T - j0);
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        const float *pr = w + kr * 32;
        float sum = 0.0f;
        for (int jj = 0; jj < jn; jj++) {
            sum += pr[jj];
        }
        l[kr] = l[kr] * corr[kr] + sum;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            int d = lane + 32 * c;
            if (d < hs) {
                float acc = 0.0f; /* the tile's sum apart: blocked, not one long chain */
                for (int jj = 0; jj < jn; jj++) {
                    acc += pr[jj] * vt[jj * ks + d];
                }
                o[kr][c] = o[kr][c] * corr[kr] + acc;
            }
        }
    }
}

static __global__ void __launch_bounds__(FSDP_ATT_THREADS)
    fsdp_att_forward_kernel(void *out, float *lse, const void *qkv, struct fsdp_att_dims a)
{
    FSDP_CUDA_DYNAMIC_SHARED(float, sh);
    int hs = a.hs, ks = hs + 1, lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    int i0 = (int)blockIdx.x * FSDP_ATT_BR, h = (int)blockIdx.y, b = (int)blockIdx.z;
    int r0 = warp * FSDP_ATT_RPW;
    float *qs = sh;                                              /* (BR, hs) */
    float *kt = qs + FSDP_ATT_BR * hs;                           /* (BC, hs + 1) */
    float *vt = kt + FSDP_ATT_BC * ks;                           /* (BC, hs + 1) */
    float *w = vt + FSDP_ATT_BC * ks + warp * FSDP_ATT_RPW * 32; /* (RPW, 32) this warp's */
    size_t row0 = (size_t)b * (size_t)a.T * a.ld;                /* element offsets into qkv */
    size_t k = row0 + a.C + (size_t)(h / a.group) * (size_t)hs;
    size_t v = k + (size_t)a.NKV * (size_t)hs;
    float m[FSDP_ATT_RPW], l[FSDP_ATT_RPW], o[FSDP_ATT_RPW][FSDP_ATT_DPL];
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        m[kr] = -INFINITY, l[kr] = 0.0f;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            o[kr][c] = 0.0f;
        }
    }
    fsdp_att_load(qs, hs, qkv, row0 + (size_t)h * (size_t)hs, a.ld, i0, FSDP_ATT_BR, a.T, hs,
                  a.abf16);
    int kend = fsdp_att_min(a.T, i0 + FSDP_ATT_BR); /* keys [0, kend): the causal bound */
    for (int j0 = 0; j0 < kend; j0 += FSDP_ATT_BC) {
        __syncthreads(); /* the previous tile is read (and q is loaded) */
        fsdp_att_load(kt, ks, qkv, k, a.ld, j0, FSDP_ATT_BC, a.T, hs, a.abf16);
        fsdp_att_load(vt, ks, qkv, v, a.ld, j0, FSDP_ATT_BC, a.T, hs, a.abf16);
        __syncthreads();
        fsdp_att_forward_tile(o, m, l, w, qs, kt, vt, i0, r0, j0, &a);
    }
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        int i = i0 + r0 + kr;
        if (i >= a.T) {
            break;
        }
        float inv = 1.0f / l[kr];
        size_t orow = ((size_t)b * (size_t)a.T + (size_t)i) * a.C + (size_t)h * (size_t)hs;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            if (lane + 32 * c < hs) {
                fsdp_st(out, orow + (size_t)(lane + 32 * c), o[kr][c] * inv, a.abf16);
            }
        }
        if (lane == 0) {
            lse[((size_t)b * (size_t)a.NH + (size_t)h) * (size_t)a.T + (size_t)i] =
                m[kr] + logf(l[kr]);
        }
    }
}

// ----------------------------------------------------------------------------
// backward: dQ, a block per 16 query rows of one head

/* P = exp(S - lse), dS = P (dP - D) for the warp's rows against key tile
 * [j0, j0 + 32), into w; then dq += dS K (scaled at the end) */
static __device__ __forceinline__ void fsdp_att_dq_tile(float (*dq)[FSDP_ATT_DPL], const float *L,
                                                        const float *D, float *w, const float *qs,
                                                        const float *dos, const float *kt,
                                                        const float *vt, int i0, int r0, int j0,
                                                        const struct fsdp_att_dims *a)
{
    int hs = a->hs, ks = hs + 1, lane = (int)(threadIdx.x & 31u), j = j0 + lane;
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        int i = i0 + r0 + kr;
        float ds = 0.0f;
        if (i < a->T && j <= i) {
            float s = a->scale * fsdp_att_dot(qs + (r0 + kr) * hs, kt + lane * ks, hs);
            float dp = fsdp_att_dot(dos + (r0 + kr) * hs, vt + lane * ks, hs);
            ds = expf(s - L[kr]) * (dp - D[kr]);
        }
        w[kr * 32 + lane] = ds;
    }
    __syncwarp();
    int jn = fsdp_att_min(FSDP_ATT_BC, a->T - j0);
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            int d = lane + 32 * c;
            if (d < hs) {
                float acc = 0.0f;
                for (int jj = 0; jj < jn; jj++) {
                    acc += w[kr * 32 + jj] * kt[jj * ks + d];
                }
                dq[kr][c] += acc;
            }
        }
    }
}

/* D = dO . O and lse of the warp's rows, to every lane; w is free after */
static __device__ __forceinline__ void fsdp_att_row_stats(float *L, float *D, float *w,
                                                          const float *dos, const void *out,
                                                          const float *lse, int i0, int r0, int b,
                                                          int h, const struct fsdp_att_dims *a)
{
    int hs = a->hs, lane = (int)(threadIdx.x & 31u);
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        int i = i0 + r0 + kr;
        float part = 0.0f;
        L[kr] = 0.0f;
        if (i < a->T) {
            size_t orow = ((size_t)b * (size_t)a->T + (size_t)i) * a->C + (size_t)h * (size_t)hs;
            for (int d = lane; d < hs; d += 32) {
                part += dos[(r0 + kr) * hs + d] * fsdp_ld(out, orow + (size_t)d, a->abf16);
            }
            L[kr] = lse[((size_t)b * (size_t)a->NH + (size_t)h) * (size_t)a->T + (size_t)i];
        }
        w[kr * 32 + lane] = part;
    }
    __syncwarp();
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        float s = 0.0f;
        for (int jj = 0; jj < 32; jj++) {
            s += w[kr * 32 + jj];
        }
        D[kr] = s;
    }
}

static __global__ void __launch_bounds__(FSDP_ATT_THREADS)
    fsdp_att_dq_kernel(float *dqkv, const float *dout, const void *qkv, const void *out,
                       const float *lse, struct fsdp_att_dims a)
{
    FSDP_CUDA_DYNAMIC_SHARED(float, sh);
    int hs = a.hs, ks = hs + 1, lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    int i0 = (int)blockIdx.x * FSDP_ATT_BR, h = (int)blockIdx.y, b = (int)blockIdx.z;
    int r0 = warp * FSDP_ATT_RPW;
    float *qs = sh;                                              /* (BR, hs) */
    float *dos = qs + FSDP_ATT_BR * hs;                          /* (BR, hs) */
    float *kt = dos + FSDP_ATT_BR * hs;                          /* (BC, hs + 1) */
    float *vt = kt + FSDP_ATT_BC * ks;                           /* (BC, hs + 1) */
    float *w = vt + FSDP_ATT_BC * ks + warp * FSDP_ATT_RPW * 32; /* (RPW, 32) this warp's */
    size_t qoff = (size_t)b * (size_t)a.T * a.ld;
    size_t k = qoff + a.C + (size_t)(h / a.group) * (size_t)hs; /* element offsets into qkv */
    size_t v = k + (size_t)a.NKV * (size_t)hs;
    fsdp_att_load(qs, hs, qkv, qoff + (size_t)h * (size_t)hs, a.ld, i0, FSDP_ATT_BR, a.T, hs,
                  a.abf16);
    fsdp_att_load(dos, hs, dout, (size_t)b * (size_t)a.T * a.C + (size_t)h * (size_t)hs, a.C, i0,
                  FSDP_ATT_BR, a.T, hs, 0);
    __syncthreads();
    float L[FSDP_ATT_RPW], D[FSDP_ATT_RPW], dq[FSDP_ATT_RPW][FSDP_ATT_DPL];
    fsdp_att_row_stats(L, D, w, dos, out, lse, i0, r0, b, h, &a);
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            dq[kr][c] = 0.0f;
        }
    }
    int kend = fsdp_att_min(a.T, i0 + FSDP_ATT_BR);
    for (int j0 = 0; j0 < kend; j0 += FSDP_ATT_BC) {
        __syncthreads(); /* the previous tile and w are read */
        fsdp_att_load(kt, ks, qkv, k, a.ld, j0, FSDP_ATT_BC, a.T, hs, a.abf16);
        fsdp_att_load(vt, ks, qkv, v, a.ld, j0, FSDP_ATT_BC, a.T, hs, a.abf16);
        __syncthreads();
        fsdp_att_dq_tile(dq, L, D, w, qs, dos, kt, vt, i0, r0, j0, &a);
    }
    FSDP_ATT_UNROLL
    for (int kr = 0; kr < FSDP_ATT_RPW; kr++) {
        int i = i0 + r0 + kr;
        if (i >= a.T) {
            break;
        }
        float *dqrow = dqkv + qoff + (size_t)i * a.ld + (size_t)h * (size_t)hs;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            if (lane + 32 * c < hs) {
                dqrow[lane + 32 * c] = a.scale * dq[kr][c];
            }
        }
    }
}

// ----------------------------------------------------------------------------
// backward: dK and dV, a block per 16 key rows of one kv head

/* The lane's query row i0 + lane of head h against the warp's key rows:
 * P and dS into w, then dv += P^T dO, dk += dS^T Q (scaled at the end). */
static __device__ __forceinline__ void
fsdp_att_dkv_tile(float (*dk)[FSDP_ATT_DPL], float (*dv)[FSDP_ATT_DPL], float *w, const float *qt,
                  const float *dot, const float *ls, const float *kt, const float *vt,
                  const void *out, int i0, int j0, int b, int h, const struct fsdp_att_dims *a)
{
    int hs = a->hs, ks = hs + 1, lane = (int)(threadIdx.x & 31u), i = i0 + lane;
    int k0 = (int)(threadIdx.x >> 5) * FSDP_ATT_KPW; /* the warp's first key row in kt */
    float D = 0.0f;
    if (i < a->T) {
        D = fsdp_att_dot_at(dot + lane * ks, out,
                            ((size_t)b * (size_t)a->T + (size_t)i) * a->C + (size_t)h * hs, hs,
                            a->abf16);
    }
    FSDP_ATT_UNROLL
    for (int kk = 0; kk < FSDP_ATT_KPW; kk++) {
        int j = j0 + k0 + kk;
        float p = 0.0f, ds = 0.0f;
        if (i < a->T && j <= i) {
            float s = a->scale * fsdp_att_dot(qt + lane * ks, kt + (k0 + kk) * hs, hs);
            float dp = fsdp_att_dot(dot + lane * ks, vt + (k0 + kk) * hs, hs);
            p = expf(s - ls[lane]);
            ds = p * (dp - D);
        }
        w[(2 * kk) * 32 + lane] = p;
        w[(2 * kk + 1) * 32 + lane] = ds;
    }
    __syncwarp();
    int in = fsdp_att_min(FSDP_ATT_BQ, a->T - i0);
    FSDP_ATT_UNROLL
    for (int kk = 0; kk < FSDP_ATT_KPW; kk++) {
        const float *p = w + (2 * kk) * 32, *ds = p + 32;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            int d = lane + 32 * c;
            if (d < hs) {
                float av = 0.0f, ak = 0.0f;
                for (int ii = 0; ii < in; ii++) {
                    av += p[ii] * dot[ii * ks + d];
                    ak += ds[ii] * qt[ii * ks + d];
                }
                dv[kk][c] += av, dk[kk][c] += ak;
            }
        }
    }
}

/* writes the warp's key rows of dK (scaled) and dV */
static __device__ __forceinline__ void fsdp_att_dkv_store(float *dqkv, float (*dk)[FSDP_ATT_DPL],
                                                          float (*dv)[FSDP_ATT_DPL], int j0, int b,
                                                          int g, const struct fsdp_att_dims *a)
{
    int hs = a->hs, lane = (int)(threadIdx.x & 31u);
    int k0 = (int)(threadIdx.x >> 5) * FSDP_ATT_KPW;
    FSDP_ATT_UNROLL
    for (int kk = 0; kk < FSDP_ATT_KPW; kk++) {
        int j = j0 + k0 + kk;
        if (j >= a->T) {
            break;
        }
        float *dkrow =
            dqkv + ((size_t)b * (size_t)a->T + (size_t)j) * a->ld + a->C + (size_t)g * (size_t)hs;
        float *dvrow = dkrow + (size_t)a->NKV * (size_t)hs;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            if (lane + 32 * c < hs) {
                dkrow[lane + 32 * c] = a->scale * dk[kk][c];
                dvrow[lane + 32 * c] = dv[kk][c];
            }
        }
    }
}

static __global__ void __launch_bounds__(FSDP_ATT_THREADS)
    fsdp_att_dkv_kernel(float *dqkv, const float *dout, const void *qkv, const void *out,
                        const float *lse, struct fsdp_att_dims a)
{
    FSDP_CUDA_DYNAMIC_SHARED(float, sh);
    int hs = a.hs, ks = hs + 1, warp = (int)(threadIdx.x >> 5);
    int j0 = (int)blockIdx.x * FSDP_ATT_BK, g = (int)blockIdx.y, b = (int)blockIdx.z;
    float *kt = sh;                                         /* (BK, hs) */
    float *vt = kt + FSDP_ATT_BK * hs;                      /* (BK, hs) */
    float *qt = vt + FSDP_ATT_BK * hs;                      /* (BQ, hs + 1) */
    float *dot = qt + FSDP_ATT_BQ * ks;                     /* (BQ, hs + 1) */
    float *ls = dot + FSDP_ATT_BQ * ks;                     /* (BQ) */
    float *w = ls + FSDP_ATT_BQ + warp * FSDP_ATT_KPW * 64; /* (KPW, 2, 32) this warp's */
    size_t row0 = (size_t)b * (size_t)a.T * a.ld;           /* element offsets into qkv */
    size_t k = row0 + a.C + (size_t)g * (size_t)hs;
    fsdp_att_load(kt, hs, qkv, k, a.ld, j0, FSDP_ATT_BK, a.T, hs, a.abf16);
    fsdp_att_load(vt, hs, qkv, k + (size_t)a.NKV * (size_t)hs, a.ld, j0, FSDP_ATT_BK, a.T, hs,
                  a.abf16);
    float dk[FSDP_ATT_KPW][FSDP_ATT_DPL], dv[FSDP_ATT_KPW][FSDP_ATT_DPL];
    FSDP_ATT_UNROLL
    for (int kk = 0; kk < FSDP_ATT_KPW; kk++) {
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            dk[kk][c] = dv[kk][c] = 0.0f;
        }
    }
    /* the group's query heads in order, then query tiles from row j0 on
     * (rows above j0 see none of these keys): a fixed order of the sums */
    for (int h = g * a.group; h < (g + 1) * a.group; h++) {
        size_t dorows = (size_t)b * (size_t)a.T * a.C + (size_t)h * (size_t)hs;
        const float *lrow = lse + ((size_t)b * (size_t)a.NH + (size_t)h) * (size_t)a.T;
        for (int i0 = j0; i0 < a.T; i0 += FSDP_ATT_BQ) {
            __syncthreads(); /* the previous tile is read (and k, v are loaded) */
            fsdp_att_load(qt, ks, qkv, row0 + (size_t)h * (size_t)hs, a.ld, i0, FSDP_ATT_BQ, a.T,
                          hs, a.abf16);
            fsdp_att_load(dot, ks, dout, dorows, a.C, i0, FSDP_ATT_BQ, a.T, hs, 0);
            if (threadIdx.x < FSDP_ATT_BQ) {
                int i = i0 + (int)threadIdx.x;
                ls[threadIdx.x] = i < a.T ? lrow[i] : 0.0f;
            }
            __syncthreads();
            fsdp_att_dkv_tile(dk, dv, w, qt, dot, ls, kt, vt, out, i0, j0, b, h, &a);
        }
    }
    fsdp_att_dkv_store(dqkv, dk, dv, j0, b, g, &a);
}

// ----------------------------------------------------------------------------
// decode: one query row against n cached positions, a block per query head

/* out (hs) <- the softmax-weighted sum that the warps' partials (running
 * max wm, sum wl, unnormalised output wo) make together, in warp order */
static __device__ __forceinline__ void
fsdp_att_decode_merge(float *out, const float *wm, const float *wl,
                      const float (*wo)[FSDP_CUDA_ATTENTION_MAX_HS], int hs)
{
    float M = wm[0];
    FSDP_ATT_UNROLL
    for (int u = 1; u < FSDP_ATT_WARPS; u++) {
        M = fmaxf(M, wm[u]);
    }
    float e[FSDP_ATT_WARPS], L = 0.0f;
    FSDP_ATT_UNROLL
    for (int u = 0; u < FSDP_ATT_WARPS; u++) {
        e[u] = wm[u] == -INFINITY ? 0.0f : expf(wm[u] - M); /* a warp without keys: 0 */
        L += wl[u] * e[u];
    }
    for (int d = (int)threadIdx.x; d < hs; d += (int)blockDim.x) {
        float acc = 0.0f;
        FSDP_ATT_UNROLL
        for (int u = 0; u < FSDP_ATT_WARPS; u++) {
            acc += wo[u][d] * e[u];
        }
        out[d] = acc / L;
    }
}

static __global__ void __launch_bounds__(FSDP_ATT_THREADS)
    fsdp_att_decode_kernel(float *out, const float *q, const float *kcache, const float *vcache,
                           int n, int group, int hs, size_t ld, float scale)
{
    __shared__ float qs[FSDP_CUDA_ATTENTION_MAX_HS];
    __shared__ float pw[FSDP_ATT_WARPS][32];
    __shared__ float wm[FSDP_ATT_WARPS], wl[FSDP_ATT_WARPS];
    __shared__ float wo[FSDP_ATT_WARPS][FSDP_CUDA_ATTENTION_MAX_HS];
    int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5), h = (int)blockIdx.x;
    const float *k = kcache + (size_t)(h / group) * (size_t)hs;
    const float *v = vcache + (size_t)(h / group) * (size_t)hs;
    for (int d = (int)threadIdx.x; d < hs; d += (int)blockDim.x) {
        qs[d] = q[(size_t)h * (size_t)hs + (size_t)d];
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f, o[FSDP_ATT_DPL];
    FSDP_ATT_UNROLL
    for (int c = 0; c < FSDP_ATT_DPL; c++) {
        o[c] = 0.0f;
    }
    for (int j0 = warp * 32; j0 < n; j0 += FSDP_ATT_THREADS) {
        int j = j0 + lane, jn = fsdp_att_min(32, n - j0);
        float s = j < n ? scale * fsdp_att_dot(qs, k + (size_t)j * ld, hs) : -INFINITY;
        pw[warp][lane] = s;
        __syncwarp();
        float mt = m; /* finite: key j0 exists */
        for (int jj = 0; jj < jn; jj++) {
            mt = fmaxf(mt, pw[warp][jj]);
        }
        float p = j < n ? expf(s - mt) : 0.0f, corr = expf(m - mt);
        __syncwarp(); /* every lane has read the scores */
        pw[warp][lane] = p;
        __syncwarp();
        float sum = 0.0f;
        for (int jj = 0; jj < jn; jj++) {
            sum += pw[warp][jj];
        }
        l = l * corr + sum, m = mt;
        FSDP_ATT_UNROLL
        for (int c = 0; c < FSDP_ATT_DPL; c++) {
            int d = lane + 32 * c;
            if (d < hs) {
                float acc = o[c] * corr;
                for (int jj = 0; jj < jn; jj++) {
                    acc += pw[warp][jj] * v[(size_t)(j0 + jj) * ld + (size_t)d];
                }
                o[c] = acc;
            }
        }
        __syncwarp(); /* the probabilities are read before the next chunk's scores */
    }
    /* merge the warps' partial softmaxes in warp order */
    if (lane == 0) {
        wm[warp] = m, wl[warp] = l;
    }
    FSDP_ATT_UNROLL
    for (int c = 0; c < FSDP_ATT_DPL; c++) {
        if (lane + 32 * c < hs) {
            wo[warp][lane + 32 * c] = o[c];
        }
    }
    __syncthreads();
    fsdp_att_decode_merge(out + (size_t)h * (size_t)hs, wm, wl, wo, hs);
}

// ----------------------------------------------------------------------------
// host wrappers

static __global__ void fsdp_att_nan_kernel(void *x, size_t n, int bf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        fsdp_st(x, i, NAN, bf16);
    }
}

/* Dynamic shared memory past the default 48 KiB needs the kernel's opt-in
 * on the GPU; the emulation has no limit. */
#if defined(__CUDACC__)
#define FSDP_ATT_ALLOW_SHARED(k, bytes)                                                            \
    ((bytes) > 48 * 1024 ? (void)cudaFuncSetAttribute(                                             \
                               k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes))       \
                         : (void)0)
#else
#define FSDP_ATT_ALLOW_SHARED(k, bytes) ((void)(bytes))
#endif

/* 1 when there is work: every size positive (NKV dividing NH is the caller's) */
static int fsdp_att_has_work(int B, int T, int NH, int NKV, int hs)
{
    return B > 0 && T > 0 && NH > 0 && NKV > 0 && hs > 0;
}

/* the outputs of a head too wide for the kernels: NaN, never stale values */
static void fsdp_att_fill_nan(void *x, size_t n, int bf16, void *stream)
{
    FSDP_CUDA_EW_LAUNCH(fsdp_att_nan_kernel, n, stream, x, n, bf16);
}

size_t fsdp_cuda_gqa_attention_scratch_floats(int T, int NH, int NKV, int hs)
{
    (void)T, (void)NH, (void)NKV, (void)hs;
    return 0;
}

size_t fsdp_cuda_attention_scratch_floats(int T)
{
    return fsdp_cuda_gqa_attention_scratch_floats(T, 1, 1, 1);
}

void fsdp_cuda_gqa_attention_forward_at(void *out, float *lse, float *scratch, const void *qkv,
                                        int bf16, int B, int T, int NH, int NKV, int hs,
                                        void *stream)
{
    (void)scratch;
    if (!fsdp_att_has_work(B, T, NH, NKV, hs)) {
        return;
    }
    struct fsdp_att_dims a = fsdp_att_dims_of(T, NH, NKV, hs, bf16);
    if (hs > FSDP_CUDA_ATTENTION_MAX_HS) {
        fsdp_att_fill_nan(out, (size_t)B * (size_t)T * a.C, bf16, stream);
        fsdp_att_fill_nan(lse, (size_t)B * (size_t)NH * (size_t)T, 0, stream);
        return;
    }
    size_t bytes =
        sizeof(float) * ((size_t)FSDP_ATT_BR * (size_t)hs +
                         2 * (size_t)FSDP_ATT_BC * (size_t)(hs + 1) + (size_t)FSDP_ATT_BR * 32);
    FSDP_ATT_ALLOW_SHARED(fsdp_att_forward_kernel, bytes);
    dim3 grid((unsigned)((T + FSDP_ATT_BR - 1) / FSDP_ATT_BR), (unsigned)NH, (unsigned)B);
    FSDP_CUDA_LAUNCH(fsdp_att_forward_kernel, grid, dim3(FSDP_ATT_THREADS), bytes, stream, out, lse,
                     qkv, a);
}

void fsdp_cuda_gqa_attention_backward_at(float *dqkv, float *scratch, const float *dout,
                                         const void *qkv, const void *out, const float *lse,
                                         int bf16, int B, int T, int NH, int NKV, int hs,
                                         void *stream)
{
    (void)scratch;
    if (!fsdp_att_has_work(B, T, NH, NKV, hs)) {
        return;
    }
    struct fsdp_att_dims a = fsdp_att_dims_of(T, NH, NKV, hs, bf16);
    if (hs > FSDP_CUDA_ATTENTION_MAX_HS) {
        fsdp_att_fill_nan(dqkv, (size_t)B * (size_t)T * a.ld, 0, stream);
        return;
    }
    size_t dq_bytes =
        sizeof(float) * (2 * (size_t)FSDP_ATT_BR * (size_t)hs +
                         2 * (size_t)FSDP_ATT_BC * (size_t)(hs + 1) + (size_t)FSDP_ATT_BR * 32);
    FSDP_ATT_ALLOW_SHARED(fsdp_att_dq_kernel, dq_bytes);
    dim3 qgrid((unsigned)((T + FSDP_ATT_BR - 1) / FSDP_ATT_BR), (unsigned)NH, (unsigned)B);
    FSDP_CUDA_LAUNCH(fsdp_att_dq_kernel, qgrid, dim3(FSDP_ATT_THREADS), dq_bytes, stream, dqkv,
                     dout, qkv, out, lse, a);
    size_t kv_bytes = sizeof(float) * (2 * (size_t)FSDP_ATT_BK * (size_t)hs +
                                       2 * (size_t)FSDP_ATT_BQ * (size_t)(hs + 1) +
                                       (size_t)FSDP_ATT_BQ + (size_t)FSDP_ATT_BK * 64);
    FSDP_ATT_ALLOW_SHARED(fsdp_att_dkv_kernel, kv_bytes);
    dim3 kgrid((unsigned)((T + FSDP_ATT_BK - 1) / FSDP_ATT_BK), (unsigned)NKV, (unsigned)B);
    FSDP_CUDA_LAUNCH(fsdp_att_dkv_kernel, kgrid, dim3(FSDP_ATT_THREADS), kv_bytes, stream, dqkv,
                     dout, qkv, out, lse, a);
}

void fsdp_cuda_gqa_attention_forward(float *out, float *lse, float *scratch, const float *qkv,
                                     int B, int T, int NH, int NKV, int hs, void *stream)
{
    fsdp_cuda_gqa_attention_forward_at(out, lse, scratch, qkv, 0, B, T, NH, NKV, hs, stream);
}

void fsdp_cuda_gqa_attention_backward(float *dqkv, float *scratch, const float *dout,
                                      const float *qkv, const float *out, const float *lse, int B,
                                      int T, int NH, int NKV, int hs, void *stream)
{
    fsdp_cuda_gqa_attention_backward_at(dqkv, scratch, dout, qkv, out, lse, 0, B, T, NH, NKV, hs,
                                        stream);
}

void fsdp_cuda_attention_forward(float *out, float *lse, float *scratch, const float *qkv, int B,
                                 int T, int C, int NH, void *stream)
{
    fsdp_cuda_gqa_attention_forward(out, lse, scratch, qkv, B, T, NH, NH, NH > 0 ? C / NH : 0,
                                    stream);
}

void fsdp_cuda_attention_backward(float *dqkv, float *scratch, const float *dout, const float *qkv,
                                  const float *out, const float *lse, int B, int T, int C, int NH,
                                  void *stream)
{
    fsdp_cuda_gqa_attention_backward(dqkv, scratch, dout, qkv, out, lse, B, T, NH, NH,
                                     NH > 0 ? C / NH : 0, stream);
}

void fsdp_cuda_attention_decode(float *out, float *scores, const float *q, const float *kcache,
                                const float *vcache, int n, int NH, int NKV, int hs, int ld,
                                void *stream)
{
    (void)scores;
    if (!fsdp_att_has_work(1, n, NH, NKV, hs)) {
        return;
    }
    if (hs > FSDP_CUDA_ATTENTION_MAX_HS) {
        fsdp_att_fill_nan(out, (size_t)NH * (size_t)hs, 0, stream);
        return;
    }
    FSDP_CUDA_LAUNCH(fsdp_att_decode_kernel, dim3((unsigned)NH), dim3(FSDP_ATT_THREADS), 0, stream,
                     out, q, kcache, vcache, n, NH / NKV, hs, (size_t)ld, 1.0f / sqrtf((float)hs));
}
