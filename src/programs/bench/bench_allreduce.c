/*
 * bench_allreduce.c - allreduce for fsdpc-bench.
 *
 * size = count * elem bytes; busbw = algbw * 2(n-1)/n: a ring allreduce
 * sends and receives 2(n-1)/n of the buffer per rank, so busbw compares with
 * the link bandwidth whatever the rank count (nccl-tests' PERFORMANCE.md).
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "comm/group.h"

static double allreduce_busbw_factor(int nranks)
{
    return nranks > 0 ? 2.0 * (nranks - 1) / nranks : 0.0;
}

static int allreduce_run(const struct fsdp_bench_ctx *c, int in_place, struct fsdp_work **work)
{
    void *recv = in_place ? c->send : c->recv;
    return fsdp_allreduce(c->group, c->send, recv, c->count, c->dtype, c->redop, &c->attr, work);
}

static void allreduce_fill(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    fsdp_bench_fill_rank(c->hsend, c->dtype, c->count, 0, c->rank, seed);
    if (!in_place) {
        fsdp_bench_poison(c->hrecv, c->dtype, c->count);
    }
}

static size_t allreduce_verify(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    const void *out = in_place ? c->hsend : c->hrecv;
    return fsdp_bench_check_reduced(out, c->dtype, c->count, 0, c->nranks, c->redop, seed);
}

const struct fsdp_bench_coll fsdp_bench_allreduce = {
    .name = "allreduce",
    .flags = FSDP_BENCH_REDOP,
    .count = fsdp_bench_count_whole,
    .bytes = fsdp_bench_bytes_whole,
    .busbw_factor = allreduce_busbw_factor,
    .run = allreduce_run,
    .fill = allreduce_fill,
    .verify = allreduce_verify,
};
