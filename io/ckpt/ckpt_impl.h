/*
 * ckpt_impl.h - what the checkpoint's files share (ckpt_writer.c: the
 * kinds, shard files and the layout; ckpt_index.c: index.h5; ckpt_reader.c: opening and
 * reading; ckpt_consolidate.c: one model file): the groups of the tensor
 * kinds, shard file names, file creation, and the split of checksum blocks
 * over shards. Private to io/ckpt/ckpt_*.c.
 */
#ifndef FSDP_IO_CKPT_IMPL_H
#define FSDP_IO_CKPT_IMPL_H

#include <hdf5.h>

#include <stddef.h>
#include <stdio.h>

#include "io/ckpt/ckpt.h"
#include "io/h5/checksum.h"
#include "core/spec.h"
#include "core/util.h"

#define CK_PATH_MAX 4096

/*
 * Creates a new HDF5 file at path, reserves `reserve` bytes for it and
 * reopens it for writing (ckpt_writer.c says why); v18: objects in the HDF5
 * 1.8 format at least. 0 with *out set, or a negative FSDP_ERR_* naming path.
 */
FSDP_PRIVATE int ck_h5_create(const char *path, size_t reserve, int v18, hid_t *out);
/* Creates the groups of k's kinds (/model, /optim, /optim/<state>); 0 or -1
 * (HDF5's error stack). */
FSDP_PRIVATE int ck_make_groups(hid_t f, const struct fsdp_ckpt_kinds *k);

static inline size_t ck_file_bound(size_t n, size_t data)
{
    return data + ((size_t)64 << 10) + n * ((size_t)2 << 10);
}

/* dir/shard_<shard>.h5; 0, or -1 when it does not fit in len. */
static inline int ck_shard_path(char *buf, size_t len, const char *dir, int shard)
{
    int n = snprintf(buf, len, "%s/shard_%d.h5", dir, shard);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Rows per checksum block of parameter p's tensors (f32, every shard alike). */
static inline size_t ck_block_rows(const struct fsdp_param_spec *p)
{
    return fsdp_sum_block_rows(p->shape[0], p->shape[1] * sizeof(float));
}

/* Offset in a tensor's hashes (shards in order) of shard r's blocks: the
 * first n mod R shards hold one row more, the others the same number. */
static inline size_t ck_sum_first(const struct fsdp_param_spec *p, int n_shards, int r,
                                  size_t block_rows)
{
    size_t base = p->shape[0] / (size_t)n_shards, extra = p->shape[0] % (size_t)n_shards;
    size_t big = (size_t)r < extra ? (size_t)r : extra;
    return big * fsdp_sum_nblocks(base + 1, block_rows) +
           ((size_t)r - big) * fsdp_sum_nblocks(base, block_rows);
}

/* Dataset dims of `rows` rows of parameter p. */
static inline int ck_dims(const struct fsdp_param_spec *p, size_t rows, hsize_t *dims)
{
    dims[0] = rows;
    dims[1] = p->shape[1];
    return p->ndim;
}

#endif
