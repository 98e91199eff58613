/*
 * h5util.h - HDF5 plumbing shared by the io layer's HDF5 files (model files,
 * checkpoints): quiet error handling that turns HDF5's error stack into one
 * reason string, the containment checks every reader applies before it
 * reads (what a file may reference, regular files only, sound global
 * heaps), checked scalar attributes, the f16/bf16 float types and the
 * classification of a dataset's float type by bit layout.
 *
 * io-internal: only io/ includes this header (it brings in hdf5.h).
 * Attribute readers treat the file as untrusted: a missing attribute, a wrong
 * type class or a non-scalar value is an fsdp_err naming file and attribute.
 */
#ifndef FSDP_IO_H5UTIL_H
#define FSDP_IO_H5UTIL_H

#include <hdf5.h>

#include <stddef.h>
#include <stdint.h>

#define FSDP_H5_STR_MAX 4096 /* longest string attribute accepted */

/* Switches off HDF5's stack dumps on stderr; call at every entry point. */
void fsdp_h5_quiet(void);

/* The innermost description on HDF5's error stack (which is then cleared). */
const char *fsdp_h5_reason(char *buf, size_t len);

/* Releases any HDF5 id; negative ids are ignored. */
void fsdp_h5_close(hid_t id);

/*
 * A block of a 1-D or 2-D dataset d (ndim dimensions) and memory laid out
 * as that block: rows [row0, row0 + rows), and of a 2-D one columns
 * [col0, col0 + cols), in memory type mtype. 0, or -1 with HDF5's stack set.
 */
int fsdp_h5_read_block(hid_t d, int ndim, size_t row0, size_t rows, size_t col0, size_t cols,
                       hid_t mtype, void *buf);
int fsdp_h5_write_block(hid_t d, int ndim, size_t row0, size_t rows, size_t col0, size_t cols,
                        hid_t mtype, const void *buf);

/* "integer", "float", "string", ... */
const char *fsdp_h5_class_name(H5T_class_t c);

/* Longest name from a file quoted in a message: longer ones end in "...". */
#define FSDP_H5_SHOW 65

// ----------------------------------------------------------------------------
// Containment: which bytes a file may make the library read
//
// HDF5 follows soft and external links, reads a dataset's raw data from the
// files its external storage list names (any file: /etc/shadow as well) and
// stitches virtual datasets from other HDF5 files. fsdpc files use none of
// that except a checkpoint's index.h5, whose virtual datasets take row
// blocks from that checkpoint's own shard files; everything else is refused
// before a byte is read, with one line naming the file and the dataset.

/*
 * 0 when path (links followed) is a regular file. HDF5 opens files with a
 * blocking open(): a FIFO would wait for a writer forever, a device or a
 * directory fails obscurely, so they are refused first.
 */
int fsdp_h5_check_regular(const char *path);

/*
 * Opens dataset `name` (from the root, "model/wte.weight") of file when
 * every link on the way is a hard link and the object is a dataset: a
 * missing, soft, external or user-defined link, or another kind of object,
 * is one error naming path and /name. dapl: H5P_DEFAULT or access
 * properties (a virtual dataset's source prefix). The storage is not
 * checked here (fsdp_h5_check_storage, fsdp_h5_check_shard_vds).
 */
int fsdp_h5_open_dataset(const char *path, hid_t file, const char *name, hid_t dapl, hid_t *out);

/* Like fsdp_h5_open_dataset for a group ("model", "optim/exp_avg"). */
int fsdp_h5_open_group(const char *path, hid_t file, const char *name, hid_t *out);

/* 1 when dset is a virtual dataset, 0 otherwise (also on error). */
int fsdp_h5_is_virtual(hid_t dset);

/*
 * The bytes of dset lie in its own file: refuses external raw storage, a
 * virtual dataset and a filter this HDF5 library lacks (chunks written with
 * it could not be read). name ("model/x") and path are for the message.
 */
int fsdp_h5_check_storage(const char *path, const char *name, hid_t dset);

/*
 * HDF5 1.10 trusts the global heap collections of a file (where
 * variable-length strings and virtual-dataset mappings live): a free-space
 * object smaller than its header makes it loop forever, an object larger
 * than its collection makes it copy past the collection's buffer. This walks
 * every collection in path (every "GCOL" signature) as HDF5 would, before
 * HDF5 opens the file (io/h5/h5heap.c). The work is linear in the file's size:
 * one read of the file (about 0.2 s per 500 MB cached) plus the walks, which
 * may together cover about twice the file; collections overlapping beyond
 * that (no HDF5 writes them) are refused as damaged.
 * Other damage HDF5 does not survive remains (doc/troubleshooting.md).
 */
int fsdp_h5_check_heaps(const char *path);

/* What one check cost: its counters, for tests and benchmarks. */
struct fsdp_h5_heap_stats {
    size_t signatures;  /* "GCOL" signatures found */
    size_t collections; /* of them, collections HDF5 would load, walked */
    size_t objects;     /* heap objects walked, over all collections */
    size_t bytes_read;  /* file bytes read, the signature scan's included */
};

/* fsdp_h5_check_heaps, reporting its counters to stats (NULL: none). */
int fsdp_h5_scan_heaps(const char *path, struct fsdp_h5_heap_stats *stats);

/* Source file of shard r in an index's virtual datasets: "./shard_<r>.h5". */
#define FSDP_H5_SHARD_SOURCE "./shard_%d.h5"

/*
 * Virtual dataset `name` of the checkpoint index at path, of shape (rows,
 * cols) or (rows,) as ndim says: it must be exactly the row blocks of the
 * even split of rows over n_shards (fsdp_split_even), block r taken whole
 * from dataset `name` of ./shard_<r>.h5 beside path; no other file, no
 * other dataset, no gap, no overlap. Each source must be a regular file
 * whose dataset is a plain one (hard links, bytes in that file) of shape
 * (rows_r, cols) and a float type. shards (n_shards,) caches the source
 * files' ids: -1 entries are opened here and left for the caller to close;
 * shards NULL checks the mapping alone and opens no source.
 */
int fsdp_h5_check_shard_vds(const char *path, const char *name, hid_t dset, int ndim, size_t rows,
                            size_t cols, int n_shards, hid_t *shards);

// ----------------------------------------------------------------------------
// Float types

/* Element types a parameter dataset may be stored in. */
enum fsdp_h5_float {
    FSDP_H5_F32 = 0,
    FSDP_H5_F16,
    FSDP_H5_BF16,
    FSDP_H5_F64,
};

const char *fsdp_h5_float_name(enum fsdp_h5_float k); /* "f32", "f16", "bf16", "f64" */
size_t fsdp_h5_float_size(enum fsdp_h5_float k);

/*
 * A new little-endian IEEE binary16 (bf16 = 0) or bfloat16 (bf16 = 1) HDF5
 * float type; close with fsdp_h5_close. -1 on failure.
 */
hid_t fsdp_h5_half_type(int bf16);

/*
 * Recognises f32, f16, bf16 and f64 (either byte order) by their bit layout.
 * On failure returns -1 and writes why ("has integer type; ...") to why.
 */
int fsdp_h5_classify_float(hid_t type, enum fsdp_h5_float *out, char *why, size_t len);

// ----------------------------------------------------------------------------
// Scalar attributes on loc; path only names the file in messages

int fsdp_h5_attr_exists(hid_t loc, const char *name); /* 1, 0, or 0 on error */
int fsdp_h5_attr_int(const char *path, hid_t loc, const char *name, long long *v);
int fsdp_h5_attr_double(const char *path, hid_t loc, const char *name, double *v);
/* Fixed- or variable-length string, sanitized, truncated to len - 1 bytes. */
int fsdp_h5_attr_str(const char *path, hid_t loc, const char *name, char *buf, size_t len);

/* Writers: int32 LE, f32 LE, variable-length UTF-8. 0 or -1 (HDF5 stack set). */
int fsdp_h5_put_attr_int(hid_t loc, const char *name, int v);
int fsdp_h5_put_attr_float(hid_t loc, const char *name, float v);
/* Creation properties of a dataset written once in full: contiguous, no fill
 * pass before the data, no modification times (the same tensors always give
 * the same bytes). Close with fsdp_h5_close; -1 on failure. */
hid_t fsdp_h5_dcpl_write_once(void);
int fsdp_h5_put_attr_i64(hid_t loc, const char *name, long long v);
int fsdp_h5_put_attr_double(hid_t loc, const char *name, double v);
int fsdp_h5_put_attr_str(hid_t loc, const char *name, const char *v);
/* n unsigned 64-bit little-endian integers, rank 1 (checksums, summaries). */
int fsdp_h5_put_attr_u64s(hid_t loc, const char *name, const uint64_t *v, size_t n);

/*
 * The root attributes that make loc a model file of spec: format, version,
 * architecture, the architecture's config attributes (walked from its
 * attribute table) and created_by (NULL: none). Model files and checkpoint
 * indexes both write them here. Returns -1 on an HDF5 failure (no message).
 */
struct fsdp_model_spec;
int fsdp_h5_put_model_attrs(hid_t loc, const struct fsdp_model_spec *spec, const char *created_by);

#endif
