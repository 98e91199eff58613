/*
 * bench.h - the collective benchmark's private interface (fsdpc-bench).
 *
 * As in nccl-tests, one small file per collective fills a struct
 * fsdp_bench_coll: its name, how a benchmark size maps to an element count,
 * the algbw -> busbw factor, how to issue it, how to fill its inputs for a
 * checked iteration and how to count wrong elements afterwards. The harness
 * (bench_main.c) owns everything else: flags, buffers, warm-up, timing,
 * in-place / out-of-place, the cross-rank statistics and the table.
 *
 * Sizes are total bytes as in nccl-tests: the allreduce/broadcast buffer, the
 * full allgather output, the full reduce_scatter input. Buffers are allocated
 * once, at the largest size, and reused for every size and every collective.
 *
 * Checked data are small integers derived from (seed, rank, index) so that
 * sums over ranks are exact in every dtype and the expected result of a
 * reduction is computed per element in O(1), whatever the number of ranks.
 */
#ifndef FSDP_PROGRAMS_BENCH_H
#define FSDP_PROGRAMS_BENCH_H

#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "core/dtype.h"

struct fsdp_group;

// ----------------------------------------------------------------------------
// one collective invocation

/*
 * Everything a collective's run/fill/verify needs. send/recv live in the
 * benchmark's memory space (host or CUDA); hsend/hrecv are host images of
 * them (the same pointers for host memory; staging copies for CUDA, which the
 * harness uploads after fill and downloads before verify).
 */
struct fsdp_bench_ctx {
    struct fsdp_group *group;
    int rank;   /* rank in the group */
    int nranks; /* group size */
    enum fsdp_dtype dtype;
    enum fsdp_redop redop;
    int root;
    size_t count; /* the count argument: per rank for allgather/reduce_scatter */
    struct fsdp_coll_attr attr;
    void *send;  /* (max_bytes,) */
    void *recv;  /* (max_bytes,) */
    void *hsend; /* (max_bytes,) host image of send */
    void *hrecv; /* (max_bytes,) host image of recv */
};

#define FSDP_BENCH_REDOP (1u << 0)        /* the collective takes a reduce op */
#define FSDP_BENCH_ROOT (1u << 1)         /* the collective takes a root */
#define FSDP_BENCH_IN_PLACE_ONLY (1u << 2) /* no out-of-place form in the API */

struct fsdp_bench_coll {
    const char *name;
    unsigned flags; /* FSDP_BENCH_* */
    /* The count argument for a benchmark size of `bytes` total bytes. */
    size_t (*count)(size_t bytes, size_t elem_size, int nranks);
    /* Total bytes the count moves, as reported in the size column. */
    size_t (*bytes)(size_t count, size_t elem_size, int nranks);
    /* busbw = algbw * factor (nccl-tests' PERFORMANCE.md). */
    double (*busbw_factor)(int nranks);
    /* Issues the collective; the harness waits for and frees the work. */
    int (*run)(const struct fsdp_bench_ctx *c, int in_place, struct fsdp_work **work);
    /* Writes the inputs of a checked iteration into hsend/hrecv and poisons
     * the output region so that an op that writes nothing is caught. */
    void (*fill)(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed);
    /* Number of wrong output elements on this rank after a checked run. */
    size_t (*verify)(const struct fsdp_bench_ctx *c, int in_place, uint32_t seed);
};

/* The size mappings the collectives share (bench_main.c): a buffer that is
 * the count whole (allreduce, broadcast), or one of nranks blocks of count
 * elements (allgather's output, reduce_scatter's input), whose busbw factor
 * is (n-1)/n: each rank moves the n-1 blocks it does not hold. */
size_t fsdp_bench_count_whole(size_t bytes, size_t elem_size, int nranks);
size_t fsdp_bench_bytes_whole(size_t count, size_t elem_size, int nranks);
size_t fsdp_bench_count_blocks(size_t bytes, size_t elem_size, int nranks);
size_t fsdp_bench_bytes_blocks(size_t count, size_t elem_size, int nranks);
double fsdp_bench_busbw_blocks(int nranks);

extern const struct fsdp_bench_coll fsdp_bench_allreduce;
extern const struct fsdp_bench_coll fsdp_bench_allgather;
extern const struct fsdp_bench_coll fsdp_bench_reduce_scatter;
extern const struct fsdp_bench_coll fsdp_bench_broadcast;

// ----------------------------------------------------------------------------
// checked data (bench_data.c)

/* Writes element k of buf (k in [0, n)) as the value rank `rank` holds at
 * global index index0 + k. */
void fsdp_bench_fill_rank(void *buf, enum fsdp_dtype t, size_t n, size_t index0, int rank,
                          uint32_t seed);
/* Writes a value no checked collective can produce. */
void fsdp_bench_poison(void *buf, enum fsdp_dtype t, size_t n);
/* Wrong elements of buf against the values of rank `rank` at index0 + k. */
size_t fsdp_bench_check_rank(const void *buf, enum fsdp_dtype t, size_t n, size_t index0,
                             int rank, uint32_t seed);
/* Wrong elements of buf against op over the values of ranks 0..nranks-1 at
 * index0 + k (AVG divided by nranks, integer types truncating). */
size_t fsdp_bench_check_reduced(const void *buf, enum fsdp_dtype t, size_t n, size_t index0,
                                int nranks, enum fsdp_redop op, uint32_t seed);

// ----------------------------------------------------------------------------
// memory spaces (bench_mem.c)

/* Host memory is pre-faulted (fsdp_alloc); CUDA memory is device memory on
 * the current device. NULL on failure, with the reason recorded (fsdp_err). */
void *fsdp_bench_mem_alloc(enum fsdp_mem mem, size_t bytes);
void fsdp_bench_mem_free(enum fsdp_mem mem, void *p);
/* Copies between a host image and a buffer of the space; no-ops for host
 * memory when the pointers are the same. 0 or a negative error code. */
int fsdp_bench_mem_upload(enum fsdp_mem mem, void *dst, const void *host, size_t bytes);
int fsdp_bench_mem_download(enum fsdp_mem mem, void *host, const void *src, size_t bytes);
/* Creates the stream collectives are ordered on (NULL for host memory). */
int fsdp_bench_mem_stream_create(enum fsdp_mem mem, int local_rank, void **stream);
void fsdp_bench_mem_stream_destroy(enum fsdp_mem mem, void *stream);
const char *fsdp_bench_mem_name(enum fsdp_mem mem);

#endif
