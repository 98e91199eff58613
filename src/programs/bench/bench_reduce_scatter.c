/*
 * bench_reduce_scatter.c - reduce_scatter for fsdpc-bench.
 *
 * size = the full input, n * count * elem bytes (count per rank, as in
 * nccl-tests); busbw = algbw * (n-1)/n: each rank sends the n-1 blocks it
 * does not keep. In place, the result is this rank's block of the input.
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "comm/group.h"

/* This rank's block of the input: where the result goes, in place. */
static void *reduce_scatter_block(void *buf, const struct fsdp_bench_ctx *c)
{
    return (char *)buf + (size_t)c->rank * c->count * fsdp_dtype_size(c->dtype);
}

static int reduce_scatter_run(const struct fsdp_bench_ctx *c, int in_place,
                              struct fsdp_work **work)
{
    void *recv = in_place ? reduce_scatter_block(c->send, c) : c->recv;
    return fsdp_reduce_scatter(c->group, c->send, recv, c->count, c->dtype, c->redop, &c->attr,
                               work);
}

static void reduce_scatter_fill(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    fsdp_bench_fill_rank(c->hsend, c->dtype, c->count * (size_t)c->nranks, 0, c->rank, seed);
    if (!in_place) {
        fsdp_bench_poison(c->hrecv, c->dtype, c->count);
    }
}

static size_t reduce_scatter_verify(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    const void *out = in_place ? reduce_scatter_block(c->hsend, c) : c->hrecv;
    return fsdp_bench_check_reduced(out, c->dtype, c->count, (size_t)c->rank * c->count,
                                    c->nranks, c->redop, seed);
}

const struct fsdp_bench_coll fsdp_bench_reduce_scatter = {
    .name = "reduce_scatter",
    .flags = FSDP_BENCH_REDOP,
    .count = fsdp_bench_count_blocks,
    .bytes = fsdp_bench_bytes_blocks,
    .busbw_factor = fsdp_bench_busbw_blocks,
    .run = reduce_scatter_run,
    .fill = reduce_scatter_fill,
    .verify = reduce_scatter_verify,
};
