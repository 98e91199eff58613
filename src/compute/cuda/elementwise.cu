/*
 * elementwise.cu - GELU, SwiGLU, rotary position embedding and the
 * f32 <-> bf16 and f16 casts on the GPU: one item per thread in grid-stride loops,
 * so any n runs on a bounded grid. No item reads another's output, so
 * every kernel may run in place where kernels.h allows it.
 *
 * Formulas follow compute/cpu (layers.c, llama_layers.c, cast.c); the
 * casts are bit-identical to the CPU's.
 */
#include "compute/cuda/common.cuh"

#define FSDP_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define FSDP_GELU_C 0.044715f

// ----------------------------------------------------------------------------
// GELU, tanh form: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)), one exp and no
// cancellation; with e = exp(-2u), s = 1 / (1 + e):
//   gelu'(x) = s + 2 x (e s) s du/dx,   du/dx = k (1 + 3 c x^2)

static __device__ __forceinline__ float fsdp_gelu_exp(float x)
{
    float a = x * (-2.0f * FSDP_GELU_K + (-2.0f * FSDP_GELU_K * FSDP_GELU_C) * (x * x));
    return expf(fminf(fmaxf(a, -87.0f), 88.0f)); /* the CPU's clamp: no inf * 0 */
}

/* Every element-wise kernel reads and writes through fsdp_ld / fsdp_st
 * with storage flags (bf16 0: f32, 1: bf16, a value the same for every
 * thread): one for the forwards' buffers; the backwards' activation
 * inputs (abf16) and their gradients (gbf16) apart, since a model's saved
 * activations may be bf16 while its gradients are f32. Compute is f32
 * either way: values are converted in registers. */

static __global__ void fsdp_gelu_forward_kernel(void *out, const void *inp, size_t n, int bf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        float x = fsdp_ld(inp, i, bf16);
        fsdp_st(out, i, x / (1.0f + fsdp_gelu_exp(x)), bf16);
    }
}

static __global__ void fsdp_gelu_backward_kernel(void *dinp, const void *inp, const void *dout,
                                                 size_t n, int abf16, int gbf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        float x = fsdp_ld(inp, i, abf16);
        float e = fsdp_gelu_exp(x);
        float s = 1.0f / (1.0f + e);
        float du = FSDP_GELU_K * (1.0f + 3.0f * FSDP_GELU_C * x * x);
        fsdp_st(dinp, i, fsdp_ld(dout, i, gbf16) * (s + (2.0f * x * du) * (e * s) * s), gbf16);
    }
}

static void fsdp_gelu(void *out, const void *inp, size_t n, int bf16, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_gelu_forward_kernel, n, stream, out, inp, n, bf16);
    }
}

static void fsdp_gelu_back(void *dinp, const void *inp, const void *dout, size_t n, int abf16,
                           int gbf16, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_gelu_backward_kernel, n, stream, dinp, inp, dout, n, abf16, gbf16);
    }
}

void fsdp_cuda_gelu_forward(float *out, const float *inp, size_t n, void *stream)
{
    fsdp_gelu(out, inp, n, 0, stream);
}

void fsdp_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                             void *stream)
{
    fsdp_gelu_back(dinp, inp, dout, n, 0, 0, stream);
}

void fsdp_cuda_gelu_forward_bf16(uint16_t *out, const uint16_t *inp, size_t n, void *stream)
{
    fsdp_gelu(out, inp, n, 1, stream);
}

void fsdp_cuda_gelu_backward_bf16(uint16_t *dinp, const uint16_t *inp, const uint16_t *dout,
                                  size_t n, void *stream)
{
    fsdp_gelu_back(dinp, inp, dout, n, 1, 1, stream);
}

void fsdp_cuda_gelu_backward_act16(float *dinp, const uint16_t *inp, const float *dout, size_t n,
                                   void *stream)
{
    fsdp_gelu_back(dinp, inp, dout, n, 1, 0, stream);
}

// ----------------------------------------------------------------------------
// SwiGLU: out = silu(gate) * up

static __device__ __forceinline__ float fsdp_sigmoid(float g)
{
    return 1.0f / (1.0f + expf(fminf(fmaxf(-g, -87.0f), 88.0f)));
}

static __global__ void fsdp_swiglu_forward_kernel(void *out, const void *gate, const void *up,
                                                  size_t n, int bf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        float g = fsdp_ld(gate, i, bf16);
        fsdp_st(out, i, g * fsdp_sigmoid(g) * fsdp_ld(up, i, bf16), bf16);
    }
}

static __global__ void fsdp_swiglu_backward_kernel(void *dgate, void *dup, const void *dout,
                                                   const void *gate, const void *up, size_t n,
                                                   int abf16, int gbf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        float g = fsdp_ld(gate, i, abf16), u = fsdp_ld(up, i, abf16);
        float dy = fsdp_ld(dout, i, gbf16);
        float sg = fsdp_sigmoid(g);
        fsdp_st(dup, i, dy * g * sg, gbf16);
        fsdp_st(dgate, i, dy * u * sg * (1.0f + g * (1.0f - sg)), gbf16);
    }
}

static void fsdp_swiglu(void *out, const void *gate, const void *up, size_t n, int bf16,
                        void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_swiglu_forward_kernel, n, stream, out, gate, up, n, bf16);
    }
}

static void fsdp_swiglu_back(void *dgate, void *dup, const void *dout, const void *gate,
                             const void *up, size_t n, int abf16, int gbf16, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_swiglu_backward_kernel, n, stream, dgate, dup, dout, gate, up, n,
                            abf16, gbf16);
    }
}

void fsdp_cuda_swiglu_forward(float *out, const float *gate, const float *up, size_t n,
                              void *stream)
{
    fsdp_swiglu(out, gate, up, n, 0, stream);
}

void fsdp_cuda_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                               const float *up, size_t n, void *stream)
{
    fsdp_swiglu_back(dgate, dup, dout, gate, up, n, 0, 0, stream);
}

void fsdp_cuda_swiglu_forward_bf16(uint16_t *out, const uint16_t *gate, const uint16_t *up,
                                   size_t n, void *stream)
{
    fsdp_swiglu(out, gate, up, n, 1, stream);
}

void fsdp_cuda_swiglu_backward_bf16(uint16_t *dgate, uint16_t *dup, const uint16_t *dout,
                                    const uint16_t *gate, const uint16_t *up, size_t n,
                                    void *stream)
{
    fsdp_swiglu_back(dgate, dup, dout, gate, up, n, 1, 1, stream);
}

void fsdp_cuda_swiglu_backward_act16(float *dgate, float *dup, const float *dout,
                                     const uint16_t *gate, const uint16_t *up, size_t n,
                                     void *stream)
{
    fsdp_swiglu_back(dgate, dup, dout, gate, up, n, 1, 0, stream);
}

// ----------------------------------------------------------------------------
// RoPE: one thread per pair (x[i], x[i + hs/2]) of a q or k head, rotated
// by cos, dir * sin of its position's angle (dir -1: the backward)

static __global__ void fsdp_rope_kernel(float *qkv, const float *cos_t, const float *sin_t,
                                        size_t rows, int T, int heads, int ld_heads, int hs,
                                        float dir)
{
    size_t h2 = (size_t)hs / 2, per_row = (size_t)heads * h2;
    FSDP_CUDA_GRID_FOR(k, rows * per_row)
    {
        size_t row = k / per_row, rem = k % per_row;
        size_t h = rem / h2, i = rem % h2, t = row % (size_t)T;
        float *x = qkv + row * (size_t)ld_heads * (size_t)hs + h * (size_t)hs;
        float c = cos_t[t * h2 + i], s = dir * sin_t[t * h2 + i];
        float x1 = x[i], x2 = x[i + h2];
        x[i] = x1 * c - x2 * s;
        x[i + h2] = x2 * c + x1 * s;
    }
}

static void fsdp_rope(float *qkv, const float *cos_t, const float *sin_t, int B, int T, int NH,
                      int NKV, int hs, float dir, void *stream)
{
    size_t rows = (size_t)B * (size_t)T, pairs = rows * (size_t)(NH + NKV) * (size_t)(hs / 2);
    if (pairs == 0) {
        return;
    }
    FSDP_CUDA_EW_LAUNCH(fsdp_rope_kernel, pairs, stream, qkv, cos_t, sin_t, rows, T, NH + NKV,
                        NH + 2 * NKV, hs, dir);
}

void fsdp_cuda_rope_forward(float *qkv, const float *cos_t, const float *sin_t, int B, int T,
                            int NH, int NKV, int hs, void *stream)
{
    fsdp_rope(qkv, cos_t, sin_t, B, T, NH, NKV, hs, 1.0f, stream);
}

void fsdp_cuda_rope_backward(float *dqkv, const float *cos_t, const float *sin_t, int B, int T,
                             int NH, int NKV, int hs, void *stream)
{
    /* the rotation's transpose is the rotation by -angle */
    fsdp_rope(dqkv, cos_t, sin_t, B, T, NH, NKV, hs, -1.0f, stream);
}

// ----------------------------------------------------------------------------
// casts: one kernel each way, the format a flag that is the same for
// every thread (no divergence)

static __global__ void fsdp_narrow_kernel(uint16_t *dst, const float *src, size_t n, int bf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        dst[i] = bf16 ? fsdp_f32_to_bf16_bits(src[i]) : fsdp_f32_to_f16_bits(src[i]);
    }
}

static __global__ void fsdp_widen_kernel(float *dst, const uint16_t *src, size_t n, int bf16)
{
    FSDP_CUDA_GRID_FOR(i, n)
    {
        dst[i] = bf16 ? fsdp_bf16_bits_to_f32(src[i]) : fsdp_f16_bits_to_f32(src[i]);
    }
}

static void fsdp_narrow(uint16_t *dst, const float *src, size_t n, int bf16, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_narrow_kernel, n, stream, dst, src, n, bf16);
    }
}

static void fsdp_widen(float *dst, const uint16_t *src, size_t n, int bf16, void *stream)
{
    if (n) {
        FSDP_CUDA_EW_LAUNCH(fsdp_widen_kernel, n, stream, dst, src, n, bf16);
    }
}

void fsdp_cuda_f32_to_bf16(uint16_t *dst, const float *src, size_t n, void *stream)
{
    fsdp_narrow(dst, src, n, 1, stream);
}

void fsdp_cuda_bf16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream)
{
    fsdp_widen(dst, src, n, 1, stream);
}

void fsdp_cuda_f32_to_f16(uint16_t *dst, const float *src, size_t n, void *stream)
{
    fsdp_narrow(dst, src, n, 0, stream);
}

void fsdp_cuda_f16_to_f32(float *dst, const uint16_t *src, size_t n, void *stream)
{
    fsdp_widen(dst, src, n, 0, stream);
}
