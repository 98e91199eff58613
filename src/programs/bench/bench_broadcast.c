/*
 * bench_broadcast.c - broadcast for fsdpc-bench.
 *
 * size = count * elem bytes; busbw = algbw: a pipelined broadcast moves the
 * whole buffer over every link once. The API's broadcast is in place only,
 * so the out-of-place columns stay empty.
 */
#include "config.h"
#include "programs/bench/bench.h"
#include "comm/group.h"

static double broadcast_busbw_factor(int nranks)
{
    (void)nranks;
    return 1.0;
}

static int broadcast_run(const struct fsdp_bench_ctx *c, int in_place, struct fsdp_work **work)
{
    (void)in_place;
    return fsdp_broadcast(c->group, c->send, c->count, c->dtype, c->root, &c->attr, work);
}

static void broadcast_fill(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    (void)in_place;
    if (c->rank == c->root) {
        fsdp_bench_fill_rank(c->hsend, c->dtype, c->count, 0, c->root, seed);
    } else {
        fsdp_bench_poison(c->hsend, c->dtype, c->count);
    }
}

static size_t broadcast_verify(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed)
{
    (void)in_place;
    return fsdp_bench_check_rank(c->hsend, c->dtype, c->count, 0, c->root, seed);
}

const struct fsdp_bench_coll fsdp_bench_broadcast = {
    .name = "broadcast",
    .flags = FSDP_BENCH_ROOT | FSDP_BENCH_IN_PLACE_ONLY,
    .count = fsdp_bench_count_whole,
    .bytes = fsdp_bench_bytes_whole,
    .busbw_factor = broadcast_busbw_factor,
    .run = broadcast_run,
    .fill = broadcast_fill,
    .verify = broadcast_verify,
};
