/*
 * test_bench_data.c - fsdpc-bench's checked values: the #wrong column must
 * count exactly the elements a collective got wrong.
 *
 * For every dtype, op and rank count 1..5, the ranks' inputs are reduced here
 * with the core reduction (as a backend would) and the check must find 0
 * wrong elements; then one corrupted element, a block taken from the wrong
 * offset, a rank counted twice, and an untouched (poisoned) output must each
 * be caught. Also checks the allgather side (values of one rank).
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "core/dtype.h"
#include "tests/tap.h"

#include <stdlib.h>
#include <string.h>

#define N_ELEMS 1000
#define MAX_RANKS 5

static unsigned char in[MAX_RANKS][N_ELEMS * 8]; /* (ranks, N_ELEMS) of any dtype */
static unsigned char out[N_ELEMS * 8];           /* (N_ELEMS,) */

/* out = op over ranks 0..n-1 of in[r], the way a backend computes it. */
static void reduce_ranks(enum fsdp_dtype t, enum fsdp_redop op, int n, size_t count)
{
    size_t es = fsdp_dtype_size(t);
    memcpy(out, in[0], count * es);
    for (int r = 1; r < n; r++) {
        fsdp_reduce(out, in[r], count, t, op);
    }
    if (op == FSDP_AVG) {
        fsdp_scale_div(out, count, t, n);
    }
}

static void check_reduced(enum fsdp_dtype t, enum fsdp_redop op, int n)
{
    const uint32_t seed = 77;
    const size_t index0 = 123; /* a reduce_scatter block that does not start at 0 */
    size_t es = fsdp_dtype_size(t);
    for (int r = 0; r < n; r++) {
        fsdp_bench_fill_rank(in[r], t, N_ELEMS, index0, r, seed);
    }
    reduce_ranks(t, op, n, N_ELEMS);
    size_t w = fsdp_bench_check_reduced(out, t, N_ELEMS, index0, n, op, seed);
    if (!tap_ok(w == 0, "%s %s %d ranks: a correct result has 0 wrong", fsdp_dtype_name(t),
                fsdp_redop_name(op), n)) {
        tap_diag("%zu wrong", w);
    }

    /* one element replaced by its neighbour's value (unless equal) */
    unsigned char saved[8];
    size_t k = 500;
    memcpy(saved, out + k * es, es);
    fsdp_bench_poison(out + k * es, t, 1);
    w = fsdp_bench_check_reduced(out, t, N_ELEMS, index0, n, op, seed);
    tap_ok(w == 1, "%s %s %d ranks: one bad element is counted once (%zu)", fsdp_dtype_name(t),
           fsdp_redop_name(op), n, w);
    memcpy(out + k * es, saved, es);

    /* the right values checked at the wrong offset: most elements differ */
    w = fsdp_bench_check_reduced(out, t, N_ELEMS, index0 + 7, n, op, seed);
    tap_ok(w > N_ELEMS / 4, "%s %s %d ranks: a shifted block is caught (%zu wrong)",
           fsdp_dtype_name(t), fsdp_redop_name(op), n, w);

    /* rank 0 counted twice, rank n-1 missing (sum only: max/min may agree) */
    if (op == FSDP_SUM && n >= 2) {
        memcpy(in[n - 1], in[0], N_ELEMS * es);
        reduce_ranks(t, op, n, N_ELEMS);
        w = fsdp_bench_check_reduced(out, t, N_ELEMS, index0, n, op, seed);
        tap_ok(w == N_ELEMS, "%s sum %d ranks: a rank's data counted twice is caught (%zu)",
               fsdp_dtype_name(t), n, w);
    }

    /* an op that wrote nothing leaves the poison */
    fsdp_bench_poison(out, t, N_ELEMS);
    w = fsdp_bench_check_reduced(out, t, N_ELEMS, index0, n, op, seed);
    tap_ok(w == N_ELEMS, "%s %s %d ranks: an untouched output is all wrong (%zu)",
           fsdp_dtype_name(t), fsdp_redop_name(op), n, w);
}

static void check_gathered(enum fsdp_dtype t)
{
    const uint32_t seed = 5;
    size_t es = fsdp_dtype_size(t);
    for (int r = 0; r < MAX_RANKS; r++) {
        fsdp_bench_fill_rank(out, t, N_ELEMS, 0, r, seed);
        size_t w = fsdp_bench_check_rank(out, t, N_ELEMS, 0, r, seed);
        size_t other = fsdp_bench_check_rank(out, t, N_ELEMS, 0, (r + 1) % MAX_RANKS, seed);
        size_t late = fsdp_bench_check_rank(out, t, N_ELEMS, 0, r, seed + 1);
        tap_ok(w == 0 && other == N_ELEMS && late > N_ELEMS / 4,
               "%s rank %d: own values pass, another rank's (%zu wrong) and another "
               "seed's (%zu wrong) fail",
               fsdp_dtype_name(t), r, other, late);
    }
    (void)es;
}

int main(void)
{
    static const enum fsdp_dtype types[] = {FSDP_F32, FSDP_F16, FSDP_BF16,
                                            FSDP_I32, FSDP_I64, FSDP_U8};
    static const enum fsdp_redop ops[] = {FSDP_SUM, FSDP_AVG, FSDP_MAX, FSDP_MIN};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        for (size_t oi = 0; oi < sizeof(ops) / sizeof(ops[0]); oi++) {
            for (int n = 1; n <= MAX_RANKS; n++) {
                check_reduced(types[ti], ops[oi], n);
            }
        }
        check_gathered(types[ti]);
    }
    return tap_done();
}
