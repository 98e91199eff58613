/*
 * ckpt.h - sharded HDF5 checkpoints (layout: doc/formats.md, "Checkpoints").
 *
 * A checkpoint is a directory step_<N>/ holding one shard file per shard
 * rank (shard_<r>.h5: that rank's dim-0 rows of every parameter and of each
 * of the optimizer's state tensors, AdamW's two moments) and index.h5,
 * whose root attributes make it a valid model file plus the run state
 * (step, tokens, mesh, config, data cursor, optimizer and loss-scaler
 * counters), and whose virtual datasets stitch the shards' rows into full
 * tensors for any HDF5 reader.
 *
 * This layer knows files only: no ranks, no collectives. A finished step
 * directory becomes visible through ckpt_commit.h (the trainer and
 * fsdpc-ckpt decide when); engines write and read their rows through the
 * functions below. Opening a checkpoint validates it completely (every
 * shard present, readable, of the same step, with the expected rows) before
 * any tensor is read; readers take rows from the shard files directly, so a
 * rank reads only what it needs whatever the old world size was.
 */
#ifndef FSDP_IO_CKPT_H
#define FSDP_IO_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "core/spec.h"
#include "core/util.h"

#define FSDP_CKPT_FORMAT "fsdpc-checkpoint"
#define FSDP_CKPT_SHARD_FORMAT "fsdpc-checkpoint-shard"
#define FSDP_CKPT_VERSION 1
#define FSDP_CKPT_INDEX "index.h5"
#define FSDP_CKPT_LATEST "latest"

// ----------------------------------------------------------------------------
// Tensor kinds: what a checkpoint keeps per parameter
//
// Kind 0 is the parameter itself (/model/<name>: f32 master weights); kinds
// 1 .. n - 1 are the optimizer's state tensors, under the names the
// optimizer gives them and in its order (/optim/<state>/<name>; AdamW's
// "exp_avg" and "exp_avg_sq", its two moments). A reader learns them from
// the file (the groups under /optim), so io fixes no optimizer.

#define FSDP_CKPT_MODEL 0
#define FSDP_CKPT_MAX_STATE 4  /* optimizer state tensors per parameter, at most */
#define FSDP_CKPT_STATE_MAX 32 /* longest state name, NUL included */
#define FSDP_CKPT_GROUP_MAX (sizeof("optim/") - 1 + FSDP_CKPT_STATE_MAX)

struct fsdp_ckpt_kinds {
    int n;                                                    /* kinds: 1 + state tensors */
    char group[1 + FSDP_CKPT_MAX_STATE][FSDP_CKPT_GROUP_MAX]; /* "model", "optim/exp_avg", ... */
};

/*
 * The kinds of a checkpoint that keeps the optimizer state tensors named
 * state[0 .. n_state - 1] (the optimizer's names: letters, digits and '_',
 * each distinct). 0, or FSDP_ERR_INVALID naming the state that does not fit.
 */
int fsdp_ckpt_kinds_init(struct fsdp_ckpt_kinds *k, int n_state, const char *const *state);
/* The group of kind ("model", "optim/exp_avg"), "?" past the last. */
const char *fsdp_ckpt_kind_group(const struct fsdp_ckpt_kinds *k, int kind);
/* The kind of the optimizer state called state, or -1 when k keeps none. */
int fsdp_ckpt_kind_of(const struct fsdp_ckpt_kinds *k, const char *state);

/* The run state stored in index.h5 besides the tensors. */
struct fsdp_ckpt_meta {
    long step;               /* optimizer steps done */
    double tokens_seen;      /* training tokens consumed */
    int world_size;          /* ranks of the run that wrote it */
    int n_shards;            /* shard files (the shard group size) */
    char mesh[128];          /* "dp=4", "rdp=2,dp=2" or "single rank" */
    char backends[128];      /* per dimension, as the mesh reports them */
    char config[4096];       /* the resolved training config, 'key = value' lines */
    char created_by[128];
    uint64_t data_position;  /* data loader cursor (global token index) */
    uint64_t data_epoch;
    uint64_t data_n_tokens;  /* token count of the training file */
    long seed;               /* the run's recorded seed (the loop draws no random numbers) */
    long adam_step;          /* AdamW bias-correction counter */
    double loss_scale;       /* current loss scale (1: off) */
    long scale_good_steps;   /* finite steps since the scale last changed */
    long skipped_steps;      /* steps skipped by loss scaling */
    int attrs_summed;        /* read: 1 when index.h5 records checksums of these attributes
                              * and of the architecture's (all matched), 0 when it records none */
};

/* Rows [*row0, *row0 + *rows) of an n-row tensor that shard r of R holds:
 * the format's row split is fsdp_split_even (the first n mod R shards one
 * row more), named here because doc/formats.md and the sharding engine
 * refer to it by this name. */
static inline void fsdp_ckpt_rows(size_t n, int R, int r, size_t *row0, size_t *rows)
{
    fsdp_split_even(n, (size_t)R, (size_t)r, row0, rows);
}

// ----------------------------------------------------------------------------
// Writing (into an existing directory; the caller commits the directory)

struct fsdp_ckpt_shard_writer;

/* Creates dir/shard_<shard>.h5 for a checkpoint of step `step` cut into
 * n_shards that keeps the kinds `kinds`. */
int fsdp_ckpt_shard_create(const char *dir, int shard, int n_shards, long step,
                           const struct fsdp_model_spec *spec, const struct fsdp_ckpt_kinds *kinds,
                           struct fsdp_ckpt_shard_writer **out);
/* Writes this shard's rows of parameter idx (rows * cols floats); once per (kind, idx). */
int fsdp_ckpt_shard_put(struct fsdp_ckpt_shard_writer *w, int kind, size_t idx, const float *rows);
/* Checks that every tensor was written, closes and fsyncs the file. */
int fsdp_ckpt_shard_commit(struct fsdp_ckpt_shard_writer *w);
/* Frees w; an uncommitted file is removed. */
void fsdp_ckpt_shard_destroy(struct fsdp_ckpt_shard_writer *w);

/* Writes and fsyncs dir/index.h5: model-file and checkpoint attributes and
 * the virtual datasets over shard_0 .. shard_<n_shards - 1>, each with the
 * checksums of every shard's rows, read from the shard files: call it once
 * every shard is committed; kinds as the shards were written with. */
int fsdp_ckpt_index_write(const char *dir, const struct fsdp_model_spec *spec,
                          const struct fsdp_ckpt_kinds *kinds, const struct fsdp_ckpt_meta *meta);

// ----------------------------------------------------------------------------
// Reading

struct fsdp_ckpt;

/*
 * Opens a checkpoint: a step directory, its index.h5, or a checkpoint root
 * directory (whose `latest` is followed). Validates the index attributes and
 * every shard file (present, readable, same step, expected shapes and row
 * ranges, the checksums the index records for it) and fails with one line
 * naming the file otherwise. Its architecture must be one of archs (the
 * caller's: io knows none).
 */
int fsdp_ckpt_open(const char *path, const struct fsdp_arch_set *archs, struct fsdp_ckpt **out);
/*
 * The same, but each shard file only found present here, and checked (all
 * of the above) and opened at its first read: a rank that reads a few
 * shards' rows (a resume on many ranks) opens those, not all of them. The
 * index's virtual datasets are checked for their mapping (which file,
 * which dataset, which rows) without opening the files they map.
 */
int fsdp_ckpt_open_lazy(const char *path, const struct fsdp_arch_set *archs,
                        struct fsdp_ckpt **out);
void fsdp_ckpt_close(struct fsdp_ckpt *ck);
/* The index's attributes alone (path and archs as for fsdp_ckpt_open): one
 * file opened, no shard checked, for listing many checkpoints quickly. */
int fsdp_ckpt_read_meta(const char *path, const struct fsdp_arch_set *archs,
                        struct fsdp_ckpt_meta *meta);

const struct fsdp_ckpt_meta *fsdp_ckpt_meta(const struct fsdp_ckpt *ck);
const struct fsdp_model_spec *fsdp_ckpt_spec(const struct fsdp_ckpt *ck);
/* The step directory (no trailing slash). */
const char *fsdp_ckpt_dir(const struct fsdp_ckpt *ck);
/* The kinds the checkpoint keeps (the index's groups under /optim, in name
 * order: AdamW's exp_avg then exp_avg_sq). */
const struct fsdp_ckpt_kinds *fsdp_ckpt_kinds(const struct fsdp_ckpt *ck);

/* Reads rows [row0, row0 + nrows) of tensor (kind, idx) as f32 into dst,
 * from only the shard files that hold them, checking every checksum block
 * the rows touch (a block only partly wanted is read whole): a mismatch is
 * one error naming the shard file, the tensor and the rows. */
int fsdp_ckpt_read_rows(struct fsdp_ckpt *ck, int kind, size_t idx, size_t row0, size_t nrows,
                        float *dst);

/* Opens path as fsdp_ckpt_open does and reads every tensor of every kind
 * whole through its checksums (ckpt_verify.c): 0 when the data is intact,
 * else the first failure. */
int fsdp_ckpt_verify_data(const char *path, const struct fsdp_arch_set *archs);
/* The newest step below `below` of checkpoint root `root` whose data
 * verifies (its directory into dir), or -1 when none does. Reads every
 * step it tries in full, newest first. */
long fsdp_ckpt_newest_verified(const char *root, const struct fsdp_arch_set *archs, long below,
                               char *dir, size_t len);

/* Checksum blocks the index records for tensor (kind, idx), every one
 * checked as read_rows reads it; 0: none recorded (a checkpoint from before
 * checksums), its rows are read unchecked. */
size_t fsdp_ckpt_checksum_blocks(const struct fsdp_ckpt *ck, int kind, size_t idx);

/* Called after each tensor of a long operation: done of total. */
typedef void (*fsdp_ckpt_progress_fn)(size_t done, size_t total, void *arg);

/*
 * Writes ck as one model file at out (via a fresh out.tmp.XXXXXX, fsync,
 * rename), tensor by tensor through one buffer of the largest tensor;
 * with_optim adds the optimizer's state tensors (/optim/exp_avg and
 * /optim/exp_avg_sq for AdamW; model readers ignore them).
 */
int fsdp_ckpt_consolidate(struct fsdp_ckpt *ck, const char *out, int with_optim,
                          fsdp_ckpt_progress_fn progress, void *arg);

/* Should path be read as a checkpoint rather than a model file: a directory
 * (step or root), or an index.h5 with checkpoint_format (an unreadable one
 * too, so that opening it reports why)? 1 or 0; no error recorded. */
int fsdp_ckpt_is_checkpoint(const char *path);

#endif
