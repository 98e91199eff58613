/*
 * model_writer.c - writing HDF5 model files (layout: doc/formats.md).
 *
 * Owns the write side: root attributes, one contiguous dataset per
 * parameter (f32, or f16/bf16 converted here with round-to-nearest-even),
 * and the commit that makes the file appear under its name only when it is
 * complete (write a fresh "<path>.tmp.XXXXXX", fsync, rename: fileutil.h).
 * Tensors go one at a time, so a caller can stream a model larger than its
 * memory. Every dataset gets its checksums (checksum.h), hashed from the
 * bytes as they are written.
 */
#include "config.h"
#include "io/h5/model_file.h"
#include "io/h5/checksum.h"
#include "io/util/fileutil.h"
#include "io/h5/h5util.h"
#include "core/error.h"
#include "core/util.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MW_STAGE_ELEMS ((size_t)1 << 20) /* f32 -> 16-bit conversion chunk */

struct fsdp_model_writer {
    char *path;
    char *tmp_path;                    /* set once HDF5 has created it: then ours to remove */
    const struct fsdp_model_spec *spec; /* borrowed until destroy */
    enum fsdp_dtype dtype;             /* stored type */
    hid_t file;
    hid_t group;                       /* /model */
    hid_t store_type;                  /* file (and, for 16-bit, memory) type of every dataset */
    unsigned char *written;            /* (spec->n_params,) */
    uint16_t *stage;                   /* (stage_elems,) 16-bit staging for conversion */
    size_t stage_elems;
    int committed;
};

static int mw_write_attrs(struct fsdp_model_writer *w, const char *created_by)
{
    if (fsdp_h5_put_model_attrs(w->file, w->spec, created_by) < 0) {
        char why[256];
        return fsdp_err(FSDP_ERR_IO, "%s: writing root attributes failed: %s", w->tmp_path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

int fsdp_model_writer_create(const char *path, const struct fsdp_model_spec *spec,
                             const struct fsdp_model_write_opts *opts,
                             struct fsdp_model_writer **out)
{
    char why[256];
    int rc;
    enum fsdp_dtype dtype = opts ? opts->dtype : FSDP_F32;
    fsdp_h5_quiet();
    if (dtype != FSDP_F32 && dtype != FSDP_F16 && dtype != FSDP_BF16) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: model files store f32, f16 or bf16, not %s", path,
                        fsdp_dtype_name(dtype));
    }
    struct fsdp_model_writer *w = calloc(1, sizeof(*w));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: model writer", path);
    }
    w->file = w->group = w->store_type = -1;
    w->spec = spec;
    w->dtype = dtype;
    w->path = strdup(path);
    w->written = calloc(spec->n_params ? spec->n_params : 1, 1);
    if (!w->path || !w->written) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: model writer", path);
        goto err;
    }
    if (dtype == FSDP_F32) {
        w->store_type = H5Tcopy(H5T_IEEE_F32LE);
    } else {
        size_t widest = 1;
        for (size_t i = 0; i < spec->n_params; i++) {
            widest = spec->params[i].shape[1] > widest ? spec->params[i].shape[1] : widest;
        }
        w->store_type = fsdp_h5_half_type(dtype == FSDP_BF16);
        w->stage_elems = widest > MW_STAGE_ELEMS ? widest : MW_STAGE_ELEMS;
        w->stage = fsdp_alloc(w->stage_elems * sizeof(uint16_t));
        if (!w->stage) {
            rc = fsdp_err(FSDP_ERR_NOMEM, "%s: conversion buffer", path);
            goto err;
        }
    }
    if (w->store_type < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", path, fsdp_h5_reason(why, sizeof(why)));
        goto err;
    }
    char *tmp;
    FSDP_CHECK_GOTO(fsdp_file_tmp_name(path, &tmp), rc, err);
    w->file = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (w->file < 0) {
        /* whatever is at tmp now is not ours to remove */
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", tmp, fsdp_h5_reason(why, sizeof(why)));
        free(tmp);
        goto err;
    }
    w->tmp_path = tmp;
    FSDP_CHECK_GOTO(mw_write_attrs(w, opts ? opts->created_by : NULL), rc, err);
    w->group = H5Gcreate2(w->file, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (w->group < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create group /model: %s", w->tmp_path,
                      fsdp_h5_reason(why, sizeof(why)));
        goto err;
    }
    *out = w;
    return 0;
err:
    fsdp_model_writer_destroy(w);
    return rc;
}

/* Writes rows [r0, r0 + nr) of dataset d from the f32 rows at src via the
 * stage, whose bytes (as stored) go on to the checksum stream. */
static herr_t mw_write_rows16(struct fsdp_model_writer *w, hid_t d,
                              const struct fsdp_param_spec *p, size_t r0, size_t nr,
                              const float *src, struct fsdp_sum_stream *sum)
{
    size_t cols = p->shape[1];
    if (fsdp_convert(w->stage, w->dtype, src, FSDP_F32, nr * cols) < 0) {
        return -1;
    }
    fsdp_sum_stream_rows(sum, w->stage, nr);
    return fsdp_h5_write_block(d, p->ndim, r0, nr, 0, cols, w->store_type, w->stage);
}

/* Parameter p into dataset d as 16-bit values, converted through the stage
 * in chunks of rows, and its checksums. 0, or -1 (HDF5's stack) or a
 * negative FSDP_ERR_* with its message. */
static int mw_write16(struct fsdp_model_writer *w, hid_t d, const struct fsdp_param_spec *p,
                      const float *data)
{
    const size_t cols = p->shape[1], rows = p->shape[0];
    struct fsdp_sum_stream sum;
    FSDP_CHECK(fsdp_sum_stream_begin(&sum, rows,
                                     fsdp_sum_block_rows(rows, cols * sizeof(uint16_t)), cols,
                                     sizeof(uint16_t)));
    size_t step = w->stage_elems / cols;
    herr_t e = 0;
    for (size_t r = 0; r < rows && e >= 0; r += step) {
        size_t nr = rows - r < step ? rows - r : step;
        e = mw_write_rows16(w, d, p, r, nr, data + r * cols, &sum);
    }
    if (e >= 0 && (fsdp_sum_stream_end(&sum) < 0 || fsdp_sum_put(d, &sum.sum) < 0)) {
        e = -1;
    }
    fsdp_sum_stream_free(&sum);
    return e < 0 ? -1 : 0;
}

int fsdp_model_writer_put(struct fsdp_model_writer *w, size_t idx, const float *data)
{
    char why[256];
    fsdp_h5_quiet();
    if (idx >= w->spec->n_params) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: parameter index %zu out of range", w->path, idx);
    }
    const struct fsdp_param_spec *p = &w->spec->params[idx];
    if (w->written[idx]) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: parameter %s written twice", w->path, p->name);
    }
    hsize_t dims[2] = {p->shape[0], p->shape[1]};
    hid_t space = H5Screate_simple(p->ndim, dims, NULL);
    hid_t dcpl = fsdp_h5_dcpl_write_once();
    hid_t d = space >= 0 && dcpl >= 0
                  ? H5Dcreate2(w->group, p->name, w->store_type, space, H5P_DEFAULT, dcpl,
                               H5P_DEFAULT)
                  : -1;
    fsdp_h5_close(dcpl);
    fsdp_h5_close(space);
    int rc = -1;
    if (d >= 0 && w->dtype == FSDP_F32) {
        rc = fsdp_sum_write(d, H5T_NATIVE_FLOAT, p->ndim, p->shape[0], p->shape[1],
                            sizeof(float), data,
                            fsdp_sum_block_rows(p->shape[0], p->shape[1] * sizeof(float)));
    } else if (d >= 0) {
        rc = mw_write16(w, d, p, data);
    }
    fsdp_h5_close(d);
    if (rc == -1) {
        return fsdp_err(FSDP_ERR_IO, "%s: writing dataset /model/%s failed: %s", w->tmp_path,
                        p->name, fsdp_h5_reason(why, sizeof(why)));
    }
    FSDP_CHECK(rc);
    w->written[idx] = 1;
    return 0;
}

int fsdp_model_writer_put_unit(struct fsdp_model_writer *w, int unit, const float *buf)
{
    const struct fsdp_model_spec *s = w->spec;
    if (unit < 0 || unit >= s->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: unit %d out of range (%d units)", w->path, unit,
                        s->n_units);
    }
    for (size_t i = s->unit_first[unit]; i < s->n_params && s->params[i].unit == unit; i++) {
        FSDP_CHECK(fsdp_model_writer_put(w, i, buf + s->params[i].offset));
    }
    return 0;
}

int fsdp_model_writer_commit(struct fsdp_model_writer *w)
{
    char why[256];
    fsdp_h5_quiet();
    if (w->committed || w->file < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: model writer already committed", w->path);
    }
    for (size_t i = 0; i < w->spec->n_params; i++) {
        if (!w->written[i]) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: parameter %s was never written", w->path,
                            w->spec->params[i].name);
        }
    }
    H5Gclose(w->group);
    w->group = -1;
    herr_t e = H5Fclose(w->file);
    w->file = -1;
    if (e < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: closing failed: %s", w->tmp_path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    FSDP_CHECK(fsdp_file_commit(w->tmp_path, w->path));
    w->committed = 1;
    return 0;
}

void fsdp_model_writer_destroy(struct fsdp_model_writer *w)
{
    if (!w) {
        return;
    }
    fsdp_h5_close(w->group);
    if (w->file >= 0) {
        H5Fclose(w->file);
    }
    if (!w->committed && w->tmp_path) {
        unlink(w->tmp_path);
    }
    fsdp_h5_close(w->store_type);
    fsdp_free(w->stage);
    free(w->written);
    free(w->tmp_path);
    free(w->path);
    free(w);
}

int fsdp_model_file_write(const char *path, const struct fsdp_model_spec *spec,
                          const float *const *units, const struct fsdp_model_write_opts *opts)
{
    struct fsdp_model_writer *w;
    int rc;
    FSDP_CHECK(fsdp_model_writer_create(path, spec, opts, &w));
    for (int u = 0; u < spec->n_units; u++) {
        FSDP_CHECK_GOTO(fsdp_model_writer_put_unit(w, u, units[u]), rc, out);
    }
    rc = fsdp_model_writer_commit(w);
out:
    fsdp_model_writer_destroy(w);
    return rc;
}
