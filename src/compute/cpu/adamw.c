/*
 * adamw.c - the AdamW update on a flat f32 range (kernels.h): one pass over
 * memory, vectors of simd.h's width, optionally split over host threads.
 *
 * What it guarantees:
 *   - torch.optim.AdamW's order of operations, every product, quotient and
 *     sum rounded to f32 on its own except three multiply-adds that are
 *     fused where the target has FMA (adamw_vec says which, and why): no
 *     other contraction (the pragma below). So an element's result depends
 *     on its four inputs, the step constants and whether the build has FMA
 *     only: not on the vector width, not on where a range starts, not on
 *     how it is split over threads or ranks;
 *   - the last n % CPU_VW elements go through the same vector code (loaded
 *     into a padded vector), never through a second, scalar copy of the
 *     formula that could round differently;
 *   - 28 bytes of memory traffic per element (read p, g, m, v; write p, m,
 *     v), so on large ranges it runs at the memory's speed, and threads help
 *     as far as one core cannot saturate the memory.
 *
 * It must not allocate, and it takes no lock: threads are created for a call
 * and joined before it returns, each over its own contiguous piece.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
/* before any include: every function in this file, the inlined vector
 * helpers too, is compiled without contraction */
#pragma GCC optimize("fp-contract=off")
#endif

#include "config.h"
#include "compute/kernels.h"
#include "compute/cpu/simd.h"
#include "core/util.h"

#include <math.h>
#include <pthread.h>

/* a thread is worth starting for this many elements or more: 7 MiB of
 * traffic, about 0.35 ms at 20 GB/s, against 18 us at best, 56 to 80 us on
 * average on a busy 2-core VM, to start and join a thread */
#define ADAMW_MIN_PER_THREAD ((size_t)1 << 18)
/* pieces are whole multiples of 16 elements from the range's start, so
 * that (for a range that starts on a 64-byte line, as shards do) no two
 * threads write into one cache line */
#define ADAMW_PIECE_ALIGN 16

/* The per-call constants, computed once as torch computes its Python-float
 * scalars (in double, rounded once to f32 where the tensor op rounds them). */
struct adamw_consts {
    float grad_scale, wd_mul, w1, b2, w2, bc2_sqrt, eps, neg_step_size;
};

struct adamw_piece {
    float *param;
    const float *grad;
    float *m, *v;
    size_t n;
    const struct adamw_consts *c;
};

static void adamw_consts_init(struct adamw_consts *c, const struct fsdp_adamw_params *hp, int decay,
                              float grad_scale)
{
    double bc1 = 1.0 - pow((double)hp->beta1, (double)hp->step);
    double bc2 = 1.0 - pow((double)hp->beta2, (double)hp->step);
    c->grad_scale = grad_scale;
    c->wd_mul = decay ? (float)(1.0 - (double)hp->lr * (double)hp->weight_decay) : 1.0f;
    c->w1 = 1.0f - hp->beta1;
    c->b2 = hp->beta2;
    c->w2 = 1.0f - hp->beta2;
    c->bc2_sqrt = (float)sqrt(bc2);
    c->eps = hp->eps;
    c->neg_step_size = -(float)((double)hp->lr / bc1);
}

/*
 * a * b + c: rounded once where the target has fused multiply-add, else
 * twice. The update uses it exactly where the compiler fused operations in
 * this kernel's earlier vector loop, so full vectors give the same bits as
 * before in every build; it is explicit because every other operation here
 * must stay unfused.
 */
static inline cpu_vf adamw_fma(cpu_vf a, cpu_vf b, cpu_vf c)
{
#if defined(__AVX512F__)
    __m512 x, y, z;
    memcpy(&x, &a, sizeof(x)), memcpy(&y, &b, sizeof(y)), memcpy(&z, &c, sizeof(z));
    x = _mm512_fmadd_ps(x, y, z);
    memcpy(&a, &x, sizeof(x));
    return a;
#elif defined(__AVX__) && defined(__FMA__)
    __m256 x, y, z;
    memcpy(&x, &a, sizeof(x)), memcpy(&y, &b, sizeof(y)), memcpy(&z, &c, sizeof(z));
    x = _mm256_fmadd_ps(x, y, z);
    memcpy(&a, &x, sizeof(x));
    return a;
#else
    return a * b + c;
#endif
}

/*
 * One vector of elements, torch's single-tensor AdamW op by op:
 *   g = grad * grad_scale
 *   p = param * (1 - lr wd)                  param.mul_
 *   m = m + (1 - beta1) (g - m)              exp_avg.lerp_(g, 1 - beta1)
 *   v = v beta2 + (1 - beta2) (g g)          exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
 *   d = sqrt(v) / sqrt(bc2) + eps            (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)
 *   p = p + (-step_size m) / d               param.addcdiv_(exp_avg, d, -step_size)
 * with fused multiply-adds (adamw_fma) in three places: the lerp, v beta2
 * plus the rest, and the decayed parameter plus the update (the last is
 * rounded twice by torch, whose decay is an op of its own). (1 - beta2) (g g)
 * is what this kernel has always done and the CUDA kernel does; torch's
 * addcmul rounds (1 - beta2) g first. Both divisions stay divisions: a
 * multiply by the reciprocal would round differently, and the update is
 * bound by memory, not by them.
 */
static inline void adamw_vec(cpu_vf *p, cpu_vf g, cpu_vf *m, cpu_vf *v,
                             const struct adamw_consts *c)
{
    g = g * c->grad_scale;
    cpu_vf mm = adamw_fma(cpu_vset1(c->w1), g - *m, *m);
    cpu_vf vv = adamw_fma(*v, cpu_vset1(c->b2), c->w2 * (g * g));
    cpu_vf d = cpu_vsqrt(vv) / c->bc2_sqrt + c->eps;
    *p = adamw_fma(*p, cpu_vset1(c->wd_mul), (c->neg_step_size * mm) / d);
    *m = mm;
    *v = vv;
}

static void adamw_range(const struct adamw_piece *w)
{
    /* a copy no store can alias: the constants stay in registers */
    const struct adamw_consts c = *w->c;
    float *param = w->param, *m = w->m, *v = w->v;
    const float *grad = w->grad;
    size_t n = w->n, i = 0;
    for (; i + CPU_VW <= n; i += CPU_VW) {
        cpu_vf p = cpu_vload(param + i), mm = cpu_vload(m + i), vv = cpu_vload(v + i);
        adamw_vec(&p, cpu_vload(grad + i), &mm, &vv, &c);
        cpu_vstore(param + i, p);
        cpu_vstore(m + i, mm);
        cpu_vstore(v + i, vv);
    }
    if (i < n) {
        size_t r = n - i;
        cpu_vf p = cpu_vload_tail(param + i, r, 0.0f), mm = cpu_vload_tail(m + i, r, 0.0f);
        cpu_vf vv = cpu_vload_tail(v + i, r, 0.0f);
        adamw_vec(&p, cpu_vload_tail(grad + i, r, 0.0f), &mm, &vv, &c);
        cpu_vstore_tail(param + i, r, p);
        cpu_vstore_tail(m + i, r, mm);
        cpu_vstore_tail(v + i, r, vv);
    }
}

static void *adamw_thread_main(void *arg)
{
    adamw_range(arg);
    return NULL;
}

/* How many threads for n elements when up to `asked` may run. */
static int adamw_threads(size_t n, int asked)
{
    if (asked > FSDP_ADAMW_MAX_THREADS) {
        asked = FSDP_ADAMW_MAX_THREADS;
    }
    size_t fit = n / ADAMW_MIN_PER_THREAD;
    return asked <= 1 || fit <= 1 ? 1 : (size_t)asked < fit ? asked : (int)fit;
}

void fsdp_cpu_adamw_update(float *param, const float *grad, float *m, float *v, size_t n,
                           const struct fsdp_adamw_params *hp, int decay, float grad_scale)
{
    struct adamw_consts c;
    adamw_consts_init(&c, hp, decay, grad_scale);
    int nt = adamw_threads(n, hp->threads);
    struct adamw_piece w[FSDP_ADAMW_MAX_THREADS];
    pthread_t tid[FSDP_ADAMW_MAX_THREADS];
    int started[FSDP_ADAMW_MAX_THREADS] = {0};
    /* pieces of whole 64-byte lines, the last one takes what is left */
    size_t lines = n / ADAMW_PIECE_ALIGN, at = 0;
    for (int t = 0; t < nt; t++) {
        size_t first, count;
        fsdp_split_even(lines, (size_t)nt, (size_t)t, &first, &count);
        size_t len = t == nt - 1 ? n - at : count * ADAMW_PIECE_ALIGN;
        w[t] = (struct adamw_piece){param + at, grad + at, m + at, v + at, len, &c};
        at += len;
    }
    for (int t = 1; t < nt; t++) {
        started[t] = fsdp_thread_start(&tid[t], adamw_thread_main, &w[t]) == 0;
    }
    adamw_range(&w[0]);
    for (int t = 1; t < nt; t++) {
        if (started[t]) {
            pthread_join(tid[t], NULL);
        } else {
            adamw_range(&w[t]); /* no thread to be had: this one does the piece */
        }
    }
}
