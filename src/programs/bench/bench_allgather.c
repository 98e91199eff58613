/*
 * bench_allgather.c - allgather for fsdpc-bench.
 *
 * size = the full output, n * count * elem bytes (count per rank, as in
 * nccl-tests); busbw = algbw * (n-1)/n: each rank receives the n-1 blocks it
 * does not hold. In place, this rank's input is its own block of the output.
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "comm/group.h"

/* This rank's block of the output: where its input goes, in place. */
static void *allgather_block(void *buf, const struct fsdp_bench_ctx *c, int r)
{
    return (char *)buf + (size_t)r * c->count * fsdp_dtype_size(c->dtype);
}

static int allgather_run(const struct fsdp_bench_ctx *c, int in_place, struct fsdp_work **work)
{
    const void *send = in_place ? allgather_block(c->recv, c, c->rank) : c->send;
    return fsdp_allgather(c->group, send, c->recv, c->count, c->dtype, &c->attr, work);
}

static void allgather_fill(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    size_t index0 = (size_t)c->rank * c->count; /* values named by output index */
    fsdp_bench_poison(c->hrecv, c->dtype, c->count * (size_t)c->nranks);
    void *in = in_place ? allgather_block(c->hrecv, c, c->rank) : c->hsend;
    fsdp_bench_fill_rank(in, c->dtype, c->count, index0, c->rank, seed);
}

static size_t allgather_verify(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    (void)in_place;
    size_t wrong = 0;
    for (int r = 0; r < c->nranks; r++) {
        wrong += fsdp_bench_check_rank(allgather_block(c->hrecv, c, r), c->dtype, c->count,
                                       (size_t)r * c->count, r, seed);
    }
    return wrong;
}

const struct fsdp_bench_coll fsdp_bench_allgather = {
    .name = "allgather",
    .flags = 0,
    .count = fsdp_bench_count_blocks,
    .bytes = fsdp_bench_bytes_blocks,
    .busbw_factor = fsdp_bench_busbw_blocks,
    .run = allgather_run,
    .fill = allgather_fill,
    .verify = allgather_verify,
};
