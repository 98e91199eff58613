/*
 * model_file.h - HDF5 model files: one file holds a model's architecture (root
 * attributes) and every parameter (one dataset per tensor under /model).
 * doc/formats.md is the reference for the layout; this header is its API.
 *
 * Reading treats the file as untrusted input: fsdp_model_file_open checks the
 * attributes, builds the parameter table from them, and checks that /model
 * holds exactly the datasets that table lists, each with the exact shape and a
 * floating-point type (f32; f16, bf16 and f64 are converted to f32 on read).
 * Every problem is one error line that names the file and the field.
 *
 * Writing goes to a fresh "<path>.tmp.XXXXXX" (io/util/fileutil.h) and becomes
 * visible under <path> only on commit (fsync, then rename), so a crash never
 * leaves a half-written model under the real name. Tensors are written one at a time, so a caller can
 * stream a model much larger than its memory unit by unit.
 *
 * HDF5 is used serially here (default property lists, sec2 driver); no HDF5
 * type appears in this header.
 */
#ifndef FSDP_IO_MODEL_FILE_H
#define FSDP_IO_MODEL_FILE_H

#include <stddef.h>

#include "core/dtype.h"
#include "core/spec.h"

#define FSDP_MODEL_FORMAT "fsdpc-model"
#define FSDP_MODEL_FORMAT_VERSION 1

/* ---------------------------------------------------------------------------
 * Reading
 */

struct fsdp_model_file; /* an open, validated model file */

/*
 * Opens path read-only and validates everything except the tensor values.
 * The file's architecture must be one of archs (the caller's: io knows
 * none). On success *out owns the parameter table built from the file's
 * attributes.
 */
int fsdp_model_file_open(const char *path, const struct fsdp_arch_set *archs,
                         struct fsdp_model_file **out);
void fsdp_model_file_close(struct fsdp_model_file *mf);

/* The parameter table of the file's architecture (owned by mf). */
const struct fsdp_model_spec *fsdp_model_file_spec(const struct fsdp_model_file *mf);
const char *fsdp_model_file_path(const struct fsdp_model_file *mf);
/* The optional free-form "created_by" attribute ("" when absent). */
const char *fsdp_model_file_created_by(const struct fsdp_model_file *mf);
/* How many of the tensors carry checksums (every one read is checked). */
size_t fsdp_model_file_checksummed(const struct fsdp_model_file *mf);
/* Storage type of parameter idx: "f32", "f16", "bf16" or "f64". */
const char *fsdp_model_file_tensor_dtype(const struct fsdp_model_file *mf, size_t idx);
/* Bytes parameter idx occupies in its stored type. */
size_t fsdp_model_file_tensor_bytes(const struct fsdp_model_file *mf, size_t idx);

/*
 * Reads rows [row0, row0 + nrows) of parameter `name` as f32 into dst
 * (nrows * cols floats, row-major). A 1-D tensor has one element per row.
 * This is what the sharding engine calls to load only its shard.
 */
int fsdp_model_file_read_rows(struct fsdp_model_file *mf, const char *name, size_t row0,
                              size_t nrows, float *dst);
/*
 * Reads the block rows [row0, row0 + nrows) x columns [col0, col0 + ncols) of
 * parameter idx as f32 into dst (nrows * ncols floats, row-major); column
 * blocks serve tensor-parallel splits along the input dimension.
 */
int fsdp_model_file_read_block(struct fsdp_model_file *mf, size_t idx, size_t row0, size_t nrows,
                               size_t col0, size_t ncols, float *dst);
/* Reads every parameter of unit `unit` into buf at the spec offsets. */
int fsdp_model_file_read_unit(struct fsdp_model_file *mf, int unit, float *buf);

/* Reads and validates only the root attributes and builds the parameter
 * table of the file's architecture (one of archs). */
int fsdp_model_file_read_spec(const char *path, const struct fsdp_arch_set *archs,
                              struct fsdp_model_spec **out);

/*
 * Opens path (of one of archs), checks that its architecture and config equal spec's (the
 * error names the first attribute that differs) and reads every parameter into
 * units[unit] + offset, units being (spec->n_units,) buffers of
 * spec->unit_numel[u] floats each.
 */
int fsdp_model_file_read(const char *path, const struct fsdp_arch_set *archs,
                         const struct fsdp_model_spec *spec, float *const *units);

/* ---------------------------------------------------------------------------
 * Writing
 */

struct fsdp_model_write_opts {
    const char *created_by; /* stored as the "created_by" attribute; NULL: none */
    enum fsdp_dtype dtype;  /* stored type: FSDP_F32 (default), FSDP_F16 or FSDP_BF16 */
};

struct fsdp_model_writer;

/*
 * Starts a fresh "<path>.tmp.XXXXXX" with the root attributes of spec
 * (architecture and config, from the architecture's attribute table); opts
 * may be NULL. spec is borrowed and must outlive the writer.
 */
int fsdp_model_writer_create(const char *path, const struct fsdp_model_spec *spec,
                             const struct fsdp_model_write_opts *opts,
                             struct fsdp_model_writer **out);
/* Writes parameter idx from data (numel f32 values, row-major). Once each. */
int fsdp_model_writer_put(struct fsdp_model_writer *w, size_t idx, const float *data);
/* Writes every parameter of unit `unit` from its unit buffer. */
int fsdp_model_writer_put_unit(struct fsdp_model_writer *w, int unit, const float *buf);
/*
 * Checks that every parameter was written, closes and fsyncs the file and
 * renames it to its final name. Call fsdp_model_writer_destroy afterwards in
 * every case.
 */
int fsdp_model_writer_commit(struct fsdp_model_writer *w);
/* Frees w; an uncommitted file is removed. */
void fsdp_model_writer_destroy(struct fsdp_model_writer *w);

/* Convenience: writes a whole model held in unit buffers (see fsdp_model_file_read). */
int fsdp_model_file_write(const char *path, const struct fsdp_model_spec *spec,
                          const float *const *units, const struct fsdp_model_write_opts *opts);

#endif
