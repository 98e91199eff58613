/*
 * model_file.c - reading HDF5 model files (layout: doc/formats.md).
 *
 * Owns the validation of a model file on open (attributes, the exact set of
 * datasets under /model, their shapes, float types and storage) and the
 * hyperslab reads that convert f16/bf16/f64 storage to f32. A file is
 * untrusted input: every problem becomes one fsdp_err line naming the file
 * and the field; HDF5's own error printing is off. Nothing is read from
 * another file: links must be hard links, data must be stored in the file,
 * and only a checkpoint's index.h5 may hold virtual datasets, over exactly
 * its own shard files (h5util.h, "Containment"). A tensor with checksums
 * (checksum.h) is read through them: every block a read touches is hashed
 * as it arrives and a mismatch is an error naming the file and the tensor;
 * a tensor without them (older files, other tools) is read as it is.
 * Writing lives in model_writer.c.
 */
#include "config.h"
#include "io/h5/model_file.h"
#include "io/h5/checksum.h"
#include "io/ckpt/ckpt_attrs.h"
#include "io/h5/h5util.h"
#include "core/error.h"
#include "core/log.h"
#include "core/spec.h"
#include "core/util.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MF_CREATED_BY_MAX 512 /* kept for display */

struct mf_tensor {
    hid_t dset;
    hid_t ftype;             /* the stored type, for checked reads */
    enum fsdp_h5_float kind; /* storage type */
    int by_shard;            /* an index's virtual dataset: one piece per shard */
    struct fsdp_sum sum;     /* block_rows 0: no checksums */
};

struct fsdp_model_file {
    char *path;
    hid_t file;
    hid_t f16_type;            /* little-endian binary16, the memory type for f16 reads */
    hid_t bf16_type;           /* little-endian bfloat16, the memory type for bf16 reads */
    struct fsdp_model_spec *spec;
    struct mf_tensor *tensors; /* (spec->n_params,) */
    char created_by[MF_CREATED_BY_MAX];
    int n_shards;              /* a checkpoint index: its shard count; else 0 */
    hid_t *shards;             /* (n_shards,) shard files, open while validating */
    hid_t dapl;                /* an index's datasets: their sources beside the file */
    size_t n_summed;           /* tensors with checksums */
    struct fsdp_sum_buf buf;   /* blocks read only in part */
};

// ----------------------------------------------------------------------------
// Helpers

/* Re-records the message of a failed helper with the file name in front. */
static int mf_prefix(const char *path, int rc)
{
    char msg[1024];
    fsdp_err_take(msg, sizeof(msg));
    return fsdp_err(rc, "%s: %s", path, msg);
}

// ----------------------------------------------------------------------------
// Root attributes

/* The optional bos_token_id and eos_token_id: ids of the vocabulary. */
static int mf_read_token_ids(const char *path, hid_t file, struct fsdp_model_spec *spec)
{
    static const char *const names[2] = {"bos_token_id", "eos_token_id"};
    long *ids[2] = {&spec->bos_token_id, &spec->eos_token_id};
    for (int k = 0; k < 2; k++) {
        long long v;
        if (!fsdp_h5_attr_exists(file, names[k])) {
            continue;
        }
        FSDP_CHECK(fsdp_h5_attr_int(path, file, names[k], &v));
        if (v < 0 || v >= spec->vocab_size) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' is %lld, outside the "
                            "vocabulary (vocab_size %d)", path, names[k], v, spec->vocab_size);
        }
        *ids[k] = (long)v;
    }
    return 0;
}

/*
 * The root attributes: format, version, the architecture (one of archs,
 * which the caller hands down) and its config attributes, walked from the architecture's
 * attribute table; then the parameter table of that config.
 */
static int mf_read_spec(const char *path, hid_t file, const struct fsdp_arch_set *archs,
                        struct fsdp_model_spec **spec, char *created_by, size_t cb_len)
{
    char s[FSDP_H5_STR_MAX + 1];
    long long version;
    /* a checkpoint's index.h5 read as a model: its attributes' own checksums first */
    int summed = fsdp_ckpt_attrs_sum_check(path, file, archs);
    if (summed < 0) {
        return summed;
    }
    if (!fsdp_h5_attr_exists(file, "format")) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: root attribute 'format' is missing: not an fsdpc model file", path);
    }
    FSDP_CHECK(fsdp_h5_attr_str(path, file, "format", s, sizeof(s)));
    if (strcmp(s, FSDP_MODEL_FORMAT) != 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: attribute 'format' is '%s', expected '%s'", path,
                        fsdp_str_printable(s, FSDP_H5_SHOW, s, 0), FSDP_MODEL_FORMAT);
    }
    FSDP_CHECK(fsdp_h5_attr_int(path, file, "format_version", &version));
    if (version != FSDP_MODEL_FORMAT_VERSION) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: attribute 'format_version' is %lld; this build reads version %d", path,
                        version, FSDP_MODEL_FORMAT_VERSION);
    }
    FSDP_CHECK(fsdp_h5_attr_str(path, file, "architecture", s, sizeof(s)));
    const struct fsdp_arch *arch = fsdp_arch_set_find(archs, s);
    if (!arch) {
        char known[256];
        fsdp_arch_set_names(archs, known, sizeof(known));
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: attribute 'architecture' is '%s'; supported architectures: %s", path,
                        fsdp_str_printable(s, FSDP_H5_SHOW, s, 0), known);
    }
    void *cfg = calloc(1, arch->cfg_size);
    if (!cfg) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: config", path);
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < arch->n_attrs; i++) {
        const struct fsdp_attr_desc *a = &arch->attrs[i];
        double v;
        if (a->type == FSDP_ATTR_FLOAT) {
            rc = fsdp_h5_attr_double(path, file, a->name, &v);
        } else {
            long long iv;
            rc = fsdp_h5_attr_int(path, file, a->name, &iv);
            v = (double)iv;
        }
        if (rc == 0 && fsdp_attr_set(a, cfg, v) < 0) {
            rc = mf_prefix(path, FSDP_ERR_FORMAT);
        }
    }
    if (rc == 0 && arch->validate(cfg) < 0) {
        rc = mf_prefix(path, FSDP_ERR_FORMAT);
    }
    if (rc == 0 && created_by) {
        created_by[0] = '\0';
        if (fsdp_h5_attr_exists(file, "created_by")) {
            rc = fsdp_h5_attr_str(path, file, "created_by", created_by, cb_len);
        }
    }
    if (rc == 0) {
        rc = arch->spec_create(cfg, spec);
    }
    if (rc == 0 && (rc = mf_read_token_ids(path, file, *spec)) < 0) {
        fsdp_model_spec_destroy(*spec);
        *spec = NULL;
    }
    free(cfg);
    return rc;
}

// ----------------------------------------------------------------------------
// Opening and validating

/* "(V, C)" style shape text. */
static void mf_shape_str(char *buf, size_t len, int ndim, const hsize_t *dims)
{
    if (ndim == 1) {
        snprintf(buf, len, "(%llu,)", (unsigned long long)dims[0]);
    } else if (ndim == 2) {
        snprintf(buf, len, "(%llu, %llu)", (unsigned long long)dims[0],
                 (unsigned long long)dims[1]);
    } else {
        size_t o = (size_t)snprintf(buf, len, "(");
        for (int i = 0; i < ndim && o < len; i++) {
            o += (size_t)snprintf(buf + o, len - o, "%s%llu", i ? ", " : "",
                                  (unsigned long long)dims[i]);
        }
        if (o < len) {
            snprintf(buf + o, len - o, ")");
        }
    }
}

/* Which config fields a parameter's shape follows: the architecture says
 * ("vocab_size=256, n_embd=128"), or else the whole config. */
static void mf_shape_reason(char *buf, size_t len, const struct fsdp_model_spec *s,
                            const char *name)
{
    if (s->arch->shape_reason) {
        s->arch->shape_reason(s->cfg, name, buf, len);
    } else {
        fsdp_attrs_format(s->arch, s->cfg, buf, len);
    }
}

/*
 * A checkpoint's index.h5 is a model file whose datasets are virtual, over
 * its shard files; any other model file keeps its data in itself. The index
 * names its shard count, which bounds the sources its mappings may name.
 */
static int mf_index_shards(struct fsdp_model_file *mf)
{
    long long n;
    if (!fsdp_h5_attr_exists(mf->file, "checkpoint_format")) {
        return 0;
    }
    FSDP_CHECK(fsdp_h5_attr_int(mf->path, mf->file, "n_shards", &n));
    if (n < 1 || n > 1 << 20) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: n_shards %lld is out of range", mf->path, n);
    }
    mf->shards = malloc((size_t)n * sizeof(*mf->shards));
    mf->dapl = H5Pcreate(H5P_DATASET_ACCESS);
    if (!mf->shards || mf->dapl < 0) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shard table", mf->path);
    }
    mf->n_shards = (int)n;
    for (int r = 0; r < mf->n_shards; r++) {
        mf->shards[r] = -1;
    }
    /* HDF5 looks for a relative source in this prefix before the current
     * directory, where a stranger's shard_0.h5 must not stand in */
    char dir[4096];
    const char *slash = strrchr(mf->path, '/');
    snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - mf->path) : 1,
             slash ? mf->path : ".");
    if (H5Pset_virtual_prefix(mf->dapl, dir[0] ? dir : "/") < 0) {
        char why[256];
        return fsdp_err(FSDP_ERR_INVALID, "%s: virtual source prefix: %s", mf->path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

/* The shard files opened to check an index's sources; HDF5 reopens them by
 * name when it reads. */
static void mf_close_shards(struct fsdp_model_file *mf)
{
    for (int r = 0; mf->shards && r < mf->n_shards; r++) {
        fsdp_h5_close(mf->shards[r]);
        mf->shards[r] = -1;
    }
}

/* Where the bytes of parameter p come from, checked before anything (its
 * extent included: HDF5 may open a virtual dataset's sources to compute it)
 * is read. */
static int mf_check_storage(struct fsdp_model_file *mf, const struct fsdp_param_spec *p,
                            const char *name, hid_t dset)
{
    if (mf->n_shards > 0 && fsdp_h5_is_virtual(dset)) {
        return fsdp_h5_check_shard_vds(mf->path, name, dset, p->ndim, p->shape[0], p->shape[1],
                                       mf->n_shards, mf->shards);
    }
    return fsdp_h5_check_storage(mf->path, name, dset);
}

/* Rows of each piece of parameter p: shard r's rows of an index's virtual
 * dataset, else the whole tensor. (n,) into a new array. */
static size_t *mf_pieces(const struct fsdp_model_file *mf, const struct mf_tensor *t,
                         const struct fsdp_param_spec *p, size_t *n)
{
    *n = t->by_shard ? (size_t)mf->n_shards : 1;
    size_t *rows = malloc(*n * sizeof(size_t));
    for (size_t r = 0; rows && r < *n; r++) {
        size_t first;
        fsdp_split_even(p->shape[0], *n, r, &first, &rows[r]);
    }
    return rows;
}

/* The checksums of parameter idx, when the file has them. */
static int mf_open_sum(struct fsdp_model_file *mf, size_t idx, const char *name)
{
    struct mf_tensor *t = &mf->tensors[idx];
    size_t n;
    t->by_shard = mf->n_shards > 0 && fsdp_h5_is_virtual(t->dset);
    size_t *rows = mf_pieces(mf, t, &mf->spec->params[idx], &n);
    if (!rows) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: checksum pieces", mf->path);
    }
    int rc = fsdp_sum_get(mf->path, name, t->dset, rows, n, &t->sum);
    free(rows);
    mf->n_summed += rc == 0 && t->sum.block_rows > 0;
    return rc;
}

static int mf_open_tensor(struct fsdp_model_file *mf, size_t idx)
{
    const struct fsdp_param_spec *p = &mf->spec->params[idx];
    const char *path = mf->path;
    char why[256], got[96], want[96], reason[96], name[320];
    snprintf(name, sizeof(name), "model/%s", p->name);
    struct mf_tensor *t = &mf->tensors[idx];
    FSDP_CHECK(fsdp_h5_open_dataset(path, mf->file, name, mf->n_shards ? mf->dapl : H5P_DEFAULT,
                                    &t->dset));
    FSDP_CHECK(mf_check_storage(mf, p, name, t->dset));
    hid_t space = H5Dget_space(t->dset);
    hid_t type = H5Dget_type(t->dset);
    if (space < 0 || type < 0) {
        fsdp_h5_close(space);
        fsdp_h5_close(type);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read the header of /model/%s: %s", path,
                        p->name, fsdp_h5_reason(why, sizeof(why)));
    }
    hsize_t dims[H5S_MAX_RANK];
    int ndim = H5Sget_simple_extent_type(space) == H5S_SIMPLE
                   ? H5Sget_simple_extent_dims(space, dims, NULL)
                   : -1;
    H5Sclose(space);
    int bad_shape = ndim != p->ndim || dims[0] != p->shape[0] ||
                    (ndim == 2 && dims[1] != p->shape[1]);
    if (bad_shape) {
        H5Tclose(type);
        if (ndim < 0) {
            snprintf(got, sizeof(got), "no simple shape");
        } else {
            char s[80];
            mf_shape_str(s, sizeof(s), ndim, dims);
            snprintf(got, sizeof(got), "shape %s", s);
        }
        hsize_t wd[2] = {p->shape[0], p->shape[1]};
        mf_shape_str(want, sizeof(want), p->ndim, wd);
        mf_shape_reason(reason, sizeof(reason), mf->spec, p->name);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /model/%s has %s but %s needs %s", path,
                        p->name, got, reason, want);
    }
    int rc = fsdp_h5_classify_float(type, &t->kind, why, sizeof(why));
    t->ftype = type;
    if (rc < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /model/%s %s", path, p->name, why);
    }
    return mf_open_sum(mf, idx, name);
}

/* /model must hold exactly the spec's datasets: report the first stranger. */
static int mf_check_no_extras(struct fsdp_model_file *mf, hid_t group)
{
    H5G_info_t gi;
    char why[256], name[128];
    if (H5Gget_info(group, &gi) < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot list group /model: %s", mf->path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    for (hsize_t k = 0; k < gi.nlinks; k++) {
        ssize_t n = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, k, name,
                                       sizeof(name), H5P_DEFAULT);
        if (n < 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot list group /model: %s", mf->path,
                            fsdp_h5_reason(why, sizeof(why)));
        }
        if ((size_t)n >= sizeof(name) || fsdp_model_spec_find(mf->spec, name) < 0) {
            char cfg[256];
            fsdp_str_printable(name, FSDP_H5_SHOW, name, 0);
            fsdp_arch_describe(mf->spec->arch, mf->spec->cfg, cfg, sizeof(cfg));
            return fsdp_err(FSDP_ERR_FORMAT,
                            "%s: unexpected entry /model/%s (not a parameter of this %s model: %s)",
                            mf->path, name, mf->spec->arch->name, cfg);
        }
    }
    return 0;
}

/* Opens the HDF5 file, telling "not HDF5" apart from "HDF5 but damaged". */
static int mf_h5_open(const char *path, hid_t *file)
{
    char why[256];
    if (access(path, R_OK) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    FSDP_CHECK(fsdp_h5_check_regular(path));
    FSDP_CHECK(fsdp_h5_check_heaps(path));
    htri_t is = H5Fis_hdf5(path);
    if (is == 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: not an HDF5 file (no HDF5 signature)", path);
    }
    *file = is > 0 ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    if (*file < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open HDF5 file (truncated or damaged?): %s",
                        path, fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

int fsdp_model_file_open(const char *path, const struct fsdp_arch_set *archs,
                         struct fsdp_model_file **out)
{
    int rc;
    hid_t group = -1;
    fsdp_h5_quiet();
    struct fsdp_model_file *mf = calloc(1, sizeof(*mf));
    if (!mf || !(mf->path = strdup(path))) {
        free(mf);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: model file handle", path);
    }
    mf->file = mf->f16_type = mf->bf16_type = mf->dapl = -1;
    FSDP_CHECK_GOTO(mf_h5_open(path, &mf->file), rc, err);
    FSDP_CHECK_GOTO(
        mf_read_spec(path, mf->file, archs, &mf->spec, mf->created_by, sizeof(mf->created_by)), rc,
        err);
    mf->tensors = calloc(mf->spec->n_params, sizeof(*mf->tensors));
    mf->f16_type = fsdp_h5_half_type(0);
    mf->bf16_type = fsdp_h5_half_type(1);
    if (!mf->tensors || mf->f16_type < 0 || mf->bf16_type < 0) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: model file tables", path);
        goto err;
    }
    for (size_t i = 0; i < mf->spec->n_params; i++) {
        mf->tensors[i].dset = mf->tensors[i].ftype = -1;
    }
    FSDP_CHECK_GOTO(mf_index_shards(mf), rc, err);
    FSDP_CHECK_GOTO(fsdp_h5_open_group(path, mf->file, "model", &group), rc, err);
    for (size_t i = 0; i < mf->spec->n_params; i++) {
        FSDP_CHECK_GOTO(mf_open_tensor(mf, i), rc, err);
    }
    FSDP_CHECK_GOTO(mf_check_no_extras(mf, group), rc, err);
    H5Oclose(group);
    mf_close_shards(mf);
    FSDP_DEBUG(FSDP_SUB_IO, "%s: %s model, %zu tensors, %zu parameters", path,
               mf->spec->arch->name, mf->spec->n_params, mf->spec->total_numel);
    if (mf->n_summed < mf->spec->n_params) {
        FSDP_DEBUG(FSDP_SUB_IO, "%s: %zu of %zu tensors have no checksum (a file from an older "
                   "fsdpc or another tool): they are read unchecked", path,
                   mf->spec->n_params - mf->n_summed, mf->spec->n_params);
    }
    *out = mf;
    return 0;
err:
    fsdp_h5_close(group);
    fsdp_model_file_close(mf);
    return rc;
}

void fsdp_model_file_close(struct fsdp_model_file *mf)
{
    if (!mf) {
        return;
    }
    if (mf->tensors) {
        for (size_t i = 0; i < mf->spec->n_params; i++) {
            fsdp_h5_close(mf->tensors[i].dset);
            fsdp_h5_close(mf->tensors[i].ftype);
            fsdp_sum_clear(&mf->tensors[i].sum);
        }
    }
    free(mf->tensors);
    fsdp_sum_buf_free(&mf->buf);
    mf_close_shards(mf);
    free(mf->shards);
    fsdp_h5_close(mf->dapl);
    fsdp_h5_close(mf->f16_type);
    fsdp_h5_close(mf->bf16_type);
    if (mf->file >= 0) {
        H5Fclose(mf->file);
    }
    fsdp_model_spec_destroy(mf->spec);
    free(mf->path);
    free(mf);
}

const struct fsdp_model_spec *fsdp_model_file_spec(const struct fsdp_model_file *mf)
{
    return mf->spec;
}

const char *fsdp_model_file_path(const struct fsdp_model_file *mf)
{
    return mf->path;
}

size_t fsdp_model_file_checksummed(const struct fsdp_model_file *mf)
{
    return mf->n_summed;
}

const char *fsdp_model_file_created_by(const struct fsdp_model_file *mf)
{
    return mf->created_by;
}

const char *fsdp_model_file_tensor_dtype(const struct fsdp_model_file *mf, size_t idx)
{
    return idx < mf->spec->n_params ? fsdp_h5_float_name(mf->tensors[idx].kind) : "?";
}

size_t fsdp_model_file_tensor_bytes(const struct fsdp_model_file *mf, size_t idx)
{
    if (idx >= mf->spec->n_params) {
        return 0;
    }
    return mf->spec->params[idx].numel * fsdp_h5_float_size(mf->tensors[idx].kind);
}

int fsdp_model_file_read_spec(const char *path, const struct fsdp_arch_set *archs,
                              struct fsdp_model_spec **out)
{
    hid_t file;
    fsdp_h5_quiet();
    FSDP_CHECK(mf_h5_open(path, &file));
    int rc = mf_read_spec(path, file, archs, out, NULL, 0);
    H5Fclose(file);
    return rc;
}

// ----------------------------------------------------------------------------
// Reading tensors

/* A block of parameter idx through its checksums, piece by piece. */
static int mf_read_checked(struct fsdp_model_file *mf, size_t idx, size_t row0, size_t nrows,
                           size_t col0, size_t ncols, float *dst)
{
    const struct fsdp_param_spec *p = &mf->spec->params[idx];
    const struct mf_tensor *t = &mf->tensors[idx];
    char hint[96];
    size_t n, first = 0, off = 0;
    size_t *rows = mf_pieces(mf, t, p, &n);
    if (!rows) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: checksum pieces", mf->path);
    }
    struct fsdp_sum_src src = {
        .file = mf->path, .tensor = p->name, .hint = "the file is damaged", .dset = t->dset,
        .ftype = t->ftype, .kind = t->kind, .ndim = p->ndim, .cols = p->shape[1],
        .block_rows = t->sum.block_rows,
    };
    int rc = 0;
    for (size_t r = 0; rc == 0 && r < n; r++) {
        size_t lo = row0 > off ? row0 : off;
        size_t hi = row0 + nrows < off + rows[r] ? row0 + nrows : off + rows[r];
        if (lo < hi) {
            if (t->by_shard) {
                snprintf(hint, sizeof(hint), "shard_%zu.h5 is damaged or not the shard this "
                         "index was written with", r);
                src.hint = hint;
            }
            src.row_off = src.show_row0 = off;
            src.rows = rows[r];
            src.h = t->sum.h + first;
            rc = fsdp_sum_read(&src, lo - off, hi - lo, col0, ncols,
                               dst + (lo - row0) * ncols, &mf->buf);
        }
        first += fsdp_sum_nblocks(rows[r], t->sum.block_rows);
        off += rows[r];
    }
    free(rows);
    return rc;
}

int fsdp_model_file_read_block(struct fsdp_model_file *mf, size_t idx, size_t row0, size_t nrows,
                               size_t col0, size_t ncols, float *dst)
{
    char why[256];
    fsdp_h5_quiet();
    if (idx >= mf->spec->n_params) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: parameter index %zu out of range (%zu)", mf->path,
                        idx, mf->spec->n_params);
    }
    const struct fsdp_param_spec *p = &mf->spec->params[idx];
    const struct mf_tensor *t = &mf->tensors[idx];
    if (row0 > p->shape[0] || nrows > p->shape[0] - row0 || col0 > p->shape[1] ||
        ncols > p->shape[1] - col0) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "%s: block rows [%zu, +%zu) x cols [%zu, +%zu) outside %s (%zu, %zu)",
                        mf->path, row0, nrows, col0, ncols, p->name, p->shape[0], p->shape[1]);
    }
    if (nrows == 0 || ncols == 0) {
        return 0;
    }
    if (t->sum.block_rows > 0) {
        return mf_read_checked(mf, idx, row0, nrows, col0, ncols, dst);
    }
    hid_t mtype = t->kind == FSDP_H5_F16    ? mf->f16_type
                  : t->kind == FSDP_H5_BF16 ? mf->bf16_type
                                       : H5T_NATIVE_FLOAT;
    if (fsdp_h5_read_block(t->dset, p->ndim, row0, nrows, col0, ncols, mtype, dst) < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: reading dataset /model/%s failed: %s", mf->path,
                        p->name, fsdp_h5_reason(why, sizeof(why)));
    }
    if (t->kind == FSDP_H5_F16 || t->kind == FSDP_H5_BF16) {
        /* the 16-bit values fill the front half of dst; widen in place */
        FSDP_CHECK(fsdp_convert(dst, FSDP_F32, dst, t->kind == FSDP_H5_F16 ? FSDP_F16 : FSDP_BF16,
                                nrows * ncols));
    }
    return 0;
}

int fsdp_model_file_read_rows(struct fsdp_model_file *mf, const char *name, size_t row0,
                              size_t nrows, float *dst)
{
    long idx = fsdp_model_spec_find(mf->spec, name);
    if (idx < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: no parameter named '%s'", mf->path, name);
    }
    const struct fsdp_param_spec *p = &mf->spec->params[idx];
    return fsdp_model_file_read_block(mf, (size_t)idx, row0, nrows, 0, p->shape[1], dst);
}

int fsdp_model_file_read_unit(struct fsdp_model_file *mf, int unit, float *buf)
{
    const struct fsdp_model_spec *s = mf->spec;
    if (unit < 0 || unit >= s->n_units) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: unit %d out of range (%d units)", mf->path, unit,
                        s->n_units);
    }
    for (size_t i = s->unit_first[unit]; i < s->n_params && s->params[i].unit == unit; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        FSDP_CHECK(fsdp_model_file_read_block(mf, i, 0, p->shape[0], 0, p->shape[1],
                                              buf + p->offset));
    }
    return 0;
}

int fsdp_model_file_read(const char *path, const struct fsdp_arch_set *archs,
                         const struct fsdp_model_spec *spec, float *const *units)
{
    struct fsdp_model_file *mf;
    int rc = 0;
    FSDP_CHECK(fsdp_model_file_open(path, archs, &mf));
    const struct fsdp_model_spec *fs = mf->spec;
    int k = fs->arch == spec->arch ? fsdp_attrs_diff(spec->arch, fs->cfg, spec->cfg) : -2;
    if (k == -2) {
        rc = fsdp_err(FSDP_ERR_MISMATCH, "%s: a %s model in the file but the model is %s", path,
                      fs->arch->name, spec->arch->name);
    } else if (k >= 0) {
        const struct fsdp_attr_desc *a = &spec->arch->attrs[k];
        rc = fsdp_err(FSDP_ERR_MISMATCH, "%s: %s is %g in the file but the model has %g", path,
                      a->name, fsdp_attr_get(a, fs->cfg), fsdp_attr_get(a, spec->cfg));
    }
    for (int u = 0; rc == 0 && u < spec->n_units; u++) {
        FSDP_CHECK_GOTO(fsdp_model_file_read_unit(mf, u, units[u]), rc, out);
    }
out:
    fsdp_model_file_close(mf);
    return rc;
}
