/*
 * h5util.h - HDF5 plumbing shared by the io layer's HDF5 files (model files,
 * checkpoints): quiet error handling that turns HDF5's error stack into one
 * reason string, checked scalar attributes, the f16/bf16 float types and the
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

#define FSDP_H5_STR_MAX 4096 /* longest string attribute accepted */

/* Switches off HDF5's stack dumps on stderr; call at every entry point. */
void fsdp_h5_quiet(void);

/* The innermost description on HDF5's error stack (which is then cleared). */
const char *fsdp_h5_reason(char *buf, size_t len);

/* Releases any HDF5 id; negative ids are ignored. */
void fsdp_h5_close(hid_t id);

/* "integer", "float", "string", ... */
const char *fsdp_h5_class_name(H5T_class_t c);

/* Replaces unprintable bytes of untrusted text and caps it for messages. */
void fsdp_h5_sanitize(char *s);

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

/*
 * The root attributes that make loc a model file of spec: format, version,
 * architecture, the architecture's config attributes (walked from its
 * attribute table) and created_by (NULL: none). Model files and checkpoint
 * indexes both write them here. Returns -1 on an HDF5 failure (no message).
 */
struct fsdp_model_spec;
int fsdp_h5_put_model_attrs(hid_t loc, const struct fsdp_model_spec *spec, const char *created_by);

#endif
