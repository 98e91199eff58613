/*
 * h5util.c - HDF5 helpers for the io layer: quiet errors with one reason
 * string, containment (hard links only, data in the file itself, virtual
 * datasets only over a checkpoint's own shards), float-type recognition,
 * 16-bit float types, checked attributes.
 *
 * Owns no state. Every function leaves HDF5's error stack clear when it
 * reports through fsdp_err, so the next call starts from a clean stack.
 */
#include "config.h"
#include "io/h5/h5util.h"
#include "io/h5/model_file.h"
#include "core/spec.h"
#include "core/error.h"
#include "core/util.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// Errors and ids

void fsdp_h5_quiet(void)
{
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

struct h5_walk {
    char desc[256];
};

static herr_t h5_walk_cb(unsigned n, const H5E_error2_t *e, void *arg)
{
    struct h5_walk *w = arg;
    (void)n;
    if (!w->desc[0] && e->desc && e->desc[0]) {
        snprintf(w->desc, sizeof(w->desc), "%s", e->desc);
    }
    return 0;
}

const char *fsdp_h5_reason(char *buf, size_t len)
{
    struct h5_walk w;
    w.desc[0] = '\0';
    /* upward: the innermost (most specific) entry comes first */
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_walk_cb, &w);
    H5Eclear2(H5E_DEFAULT);
    /* HDF5 quotes names from the file (link targets, dataset names) */
    return fsdp_str_printable(buf, len, w.desc[0] ? w.desc : "unknown HDF5 error", 0);
}

void fsdp_h5_close(hid_t id)
{
    if (id >= 0) {
        H5Idec_ref(id);
    }
}

/* The block's selection in the file and a memory space of its shape, then
 * the read or the write. */
static int h5_block_io(hid_t d, int ndim, size_t row0, size_t rows, size_t col0, size_t cols,
                       hid_t mtype, void *rbuf, const void *wbuf)
{
    hsize_t start[2] = {row0, col0}, count[2] = {rows, cols};
    hid_t fs = H5Dget_space(d);
    hid_t ms = H5Screate_simple(ndim, count, NULL);
    herr_t e = -1;
    if (fs >= 0 && ms >= 0 &&
        H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) >= 0) {
        e = rbuf ? H5Dread(d, mtype, ms, fs, H5P_DEFAULT, rbuf)
                 : H5Dwrite(d, mtype, ms, fs, H5P_DEFAULT, wbuf);
    }
    fsdp_h5_close(ms);
    fsdp_h5_close(fs);
    return e < 0 ? -1 : 0;
}

int fsdp_h5_read_block(hid_t d, int ndim, size_t row0, size_t rows, size_t col0, size_t cols,
                       hid_t mtype, void *buf)
{
    return h5_block_io(d, ndim, row0, rows, col0, cols, mtype, buf, NULL);
}

int fsdp_h5_write_block(hid_t d, int ndim, size_t row0, size_t rows, size_t col0, size_t cols,
                        hid_t mtype, const void *buf)
{
    return h5_block_io(d, ndim, row0, rows, col0, cols, mtype, NULL, buf);
}

const char *fsdp_h5_class_name(H5T_class_t c)
{
    switch (c) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_BITFIELD: return "bitfield";
    case H5T_OPAQUE: return "opaque";
    case H5T_COMPOUND: return "compound";
    case H5T_REFERENCE: return "reference";
    case H5T_ENUM: return "enum";
    case H5T_VLEN: return "variable-length";
    case H5T_ARRAY: return "array";
    default: return "unknown";
    }
}


// ----------------------------------------------------------------------------
// Containment

int fsdp_h5_check_regular(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        return fsdp_err(FSDP_ERR_IO, "%s: not a regular file (%s)", path,
                        S_ISDIR(st.st_mode)    ? "a directory"
                        : S_ISFIFO(st.st_mode) ? "a FIFO"
                        : S_ISSOCK(st.st_mode) ? "a socket"
                                               : "a device");
    }
    return 0;
}

static const char *h5_link_kind(H5L_type_t t)
{
    return t == H5L_TYPE_SOFT       ? "a soft link"
           : t == H5L_TYPE_EXTERNAL ? "an external link (to another file)"
                                    : "a user-defined link";
}

/* Every link from the root to name is a hard link; what ("dataset",
 * "group") words the message for a missing one. Checked prefix by prefix, so
 * that no soft or external link is ever followed, not even on the way. */
static int h5_walk_hard(const char *path, hid_t file, const char *name, const char *what)
{
    char prefix[1024], show[FSDP_H5_SHOW];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof(prefix)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: bad HDF5 path '%s'", path,
                        fsdp_str_printable(show, sizeof(show), name, 0));
    }
    for (size_t i = 1; i <= n; i++) {
        if (name[i] != '/' && name[i] != '\0') {
            continue;
        }
        H5L_info_t li;
        memcpy(prefix, name, i);
        prefix[i] = '\0';
        if (H5Lexists(file, prefix, H5P_DEFAULT) <= 0) {
            H5Eclear2(H5E_DEFAULT);
            return fsdp_err(FSDP_ERR_FORMAT, "%s: %s /%s is missing", path, what, name);
        }
        if (H5Lget_info(file, prefix, &li, H5P_DEFAULT) < 0) {
            char why[256];
            return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot look up /%s: %s", path, prefix,
                            fsdp_h5_reason(why, sizeof(why)));
        }
        if (li.type != H5L_TYPE_HARD) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: /%s is %s; fsdpc reads only what is stored in "
                            "the file itself", path, prefix, h5_link_kind(li.type));
        }
    }
    return 0;
}

/* name's object, opened through hard links only, must be of type want. */
static int h5_open_hard(const char *path, hid_t file, const char *name, H5I_type_t want,
                        hid_t *out)
{
    const char *what = want == H5I_DATASET ? "dataset" : "group";
    char why[256];
    FSDP_CHECK(h5_walk_hard(path, file, name, what));
    hid_t obj = H5Oopen(file, name, H5P_DEFAULT);
    if (obj < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open /%s: %s", path, name,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    if (H5Iget_type(obj) != want) {
        H5Oclose(obj);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: /%s is not a %s", path, name, what);
    }
    *out = obj;
    return 0;
}

int fsdp_h5_open_dataset(const char *path, hid_t file, const char *name, hid_t dapl, hid_t *out)
{
    char why[256];
    FSDP_CHECK(h5_open_hard(path, file, name, H5I_DATASET, out));
    if (dapl == H5P_DEFAULT) {
        return 0;
    }
    /* access properties (a virtual source prefix) take effect only on open */
    H5Oclose(*out);
    *out = H5Dopen2(file, name, dapl);
    if (*out < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open /%s: %s", path, name,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

int fsdp_h5_open_group(const char *path, hid_t file, const char *name, hid_t *out)
{
    return h5_open_hard(path, file, name, H5I_GROUP, out);
}

int fsdp_h5_is_virtual(hid_t dset)
{
    hid_t dcpl = H5Dget_create_plist(dset);
    int v = dcpl >= 0 && H5Pget_layout(dcpl) == H5D_VIRTUAL;
    fsdp_h5_close(dcpl);
    H5Eclear2(H5E_DEFAULT);
    return v;
}

/* Filters of dcpl that this library lacks: chunks written with one (optional
 * or not) cannot be read. */
static int h5_check_filters(const char *path, const char *name, hid_t dcpl)
{
    int nf = H5Pget_nfilters(dcpl);
    for (int i = 0; i < nf; i++) {
        unsigned flags = 0, cd[8];
        size_t ncd = 8;
        char fname[256] = "";
        H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof(fname),
                                         fname, NULL);
        if (id < 0 || H5Zfilter_avail(id) <= 0) {
            H5Eclear2(H5E_DEFAULT);
            return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: dataset /%s needs HDF5 filter '%s' (id "
                            "%d), which this HDF5 library lacks", path, name,
                            fsdp_str_printable(fname, FSDP_H5_SHOW, fname, 0), (int)id);
        }
    }
    return 0;
}

int fsdp_h5_check_storage(const char *path, const char *name, hid_t dset)
{
    char why[256], ext[256] = "";
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read the storage of /%s: %s", path, name,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    int rc = 0;
    int next = H5Pget_external_count(dcpl);
    H5D_layout_t layout = H5Pget_layout(dcpl);
    if (next != 0) {
        off_t off;
        hsize_t size;
        if (next < 0 || H5Pget_external(dcpl, 0, sizeof(ext), ext, &off, &size) < 0) {
            snprintf(ext, sizeof(ext), "?");
        }
        ext[sizeof(ext) - 1] = '\0';
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s keeps its data in external file '%s'; "
                      "fsdpc reads only data stored in the file itself", path, name,
                      fsdp_str_printable(ext, FSDP_H5_SHOW, ext, 0));
    } else if (layout == H5D_VIRTUAL) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s is a virtual dataset (its data would come "
                      "from other files); only a checkpoint's index.h5 holds those, over its own "
                      "shard files", path, name);
    } else if (layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED && layout != H5D_COMPACT) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s has an unknown storage layout", path,
                      name);
    } else {
        rc = h5_check_filters(path, name, dcpl);
    }
    H5Eclear2(H5E_DEFAULT);
    H5Pclose(dcpl);
    return rc;
}

/* Does the selection of space cover exactly the block [row0, row0 + rows) x
 * [0, cols) of an ndim-dimensional extent? A source selection of "all" does:
 * HDF5 does not store the source extent (it is a scalar placeholder here),
 * and h5_check_source checks that the source dataset is that block. */
static int h5_is_block(hid_t space, int src, int ndim, size_t row0, size_t rows, size_t cols)
{
    hsize_t lo[H5S_MAX_RANK], hi[H5S_MAX_RANK];
    if (src && space >= 0 && rows > 0 && H5Sget_select_type(space) == H5S_SEL_ALL) {
        return 1;
    }
    if (space < 0 || H5Sget_simple_extent_ndims(space) != ndim || rows == 0 ||
        H5Sget_select_npoints(space) != (hssize_t)(rows * cols) ||
        H5Sget_select_bounds(space, lo, hi) < 0) {
        H5Eclear2(H5E_DEFAULT);
        return 0;
    }
    /* as many points as the bounding box holds: the box itself */
    return lo[0] == row0 && hi[0] == row0 + rows - 1 &&
           (ndim == 1 || (lo[1] == 0 && hi[1] == cols - 1));
}

/* The shard number r of a source file name that is exactly ./shard_<r>.h5, else -1. */
static int h5_shard_of(const char *fname, int n_shards)
{
    char want[64];
    const char *digits = fname + strlen("./shard_");
    if (strncmp(fname, "./shard_", strlen("./shard_")) != 0 || *digits < '0' || *digits > '9') {
        return -1;
    }
    long r = strtol(digits, NULL, 10);
    if (r < 0 || r >= n_shards) {
        return -1;
    }
    snprintf(want, sizeof(want), FSDP_H5_SHARD_SOURCE, (int)r);
    return strcmp(fname, want) == 0 ? (int)r : -1;
}

struct h5_vds_want {
    const char *path, *name;
    int ndim, n_shards;
    size_t rows, cols;
};

/* Mapping i of dcpl: shard *r's own row block, from the same-named dataset. */
static int h5_check_mapping(const struct h5_vds_want *w, hid_t dcpl, size_t i, int *r)
{
    char fname[64], dname[1100], show[FSDP_H5_SHOW];
    ssize_t fn = H5Pget_virtual_filename(dcpl, i, fname, sizeof(fname));
    ssize_t dn = H5Pget_virtual_dsetname(dcpl, i, dname, sizeof(dname));
    H5Eclear2(H5E_DEFAULT);
    fname[fn < 0 ? 0 : sizeof(fname) - 1] = '\0';
    dname[dn < 0 ? 0 : sizeof(dname) - 1] = '\0';
    *r = fn > 0 && (size_t)fn < sizeof(fname) ? h5_shard_of(fname, w->n_shards) : -1;
    if (*r < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: virtual dataset /%s maps file '%s'; an index maps "
                        "only its own shard files ./shard_0.h5 .. ./shard_%d.h5", w->path, w->name,
                        fsdp_str_printable(show, sizeof(show), fname, 0), w->n_shards - 1);
    }
    const char *d = dname[0] == '/' ? dname + 1 : dname;
    if (dn <= 0 || (size_t)dn >= sizeof(dname) || strcmp(d, w->name) != 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: virtual dataset /%s maps dataset '%s' of %s; "
                        "expected /%s", w->path, w->name,
                        fsdp_str_printable(show, sizeof(show), dname, 0), fname, w->name);
    }
    size_t row0, rows;
    fsdp_split_even(w->rows, (size_t)w->n_shards, (size_t)*r, &row0, &rows);
    hid_t vs = H5Pget_virtual_vspace(dcpl, i), ss = H5Pget_virtual_srcspace(dcpl, i);
    int ok = h5_is_block(vs, 0, w->ndim, row0, rows, w->cols) &&
             h5_is_block(ss, 1, w->ndim, 0, rows, w->cols);
    fsdp_h5_close(vs);
    fsdp_h5_close(ss);
    if (!ok) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: virtual dataset /%s does not take exactly rows "
                        "[%zu, %zu) from %s, the rows shard %d holds", w->path, w->name, row0,
                        row0 + rows, fname, *r);
    }
    return 0;
}

/* Source dataset of shard r: a regular HDF5 file beside the index, a plain
 * dataset of the shard's rows and a float type. */
static int h5_check_source(const struct h5_vds_want *w, int r, hid_t *sf)
{
    char sp[4200], src[64], why[256];
    const char *slash = strrchr(w->path, '/');
    size_t row0, rows;
    enum fsdp_h5_float kind;
    snprintf(src, sizeof(src), FSDP_H5_SHARD_SOURCE, r);
    snprintf(sp, sizeof(sp), "%.*s%s", slash ? (int)(slash - w->path + 1) : 0, w->path, src + 2);
    if (*sf < 0) {
        struct stat st;
        if (stat(sp, &st) != 0 || !S_ISREG(st.st_mode)) {
            return fsdp_err(FSDP_ERR_IO, "%s: virtual dataset /%s maps source file '%s', which is "
                            "%s", w->path, w->name, src,
                            access(sp, F_OK) == 0 ? "not a regular file" : "missing");
        }
        FSDP_CHECK(fsdp_h5_check_heaps(sp));
        if (H5Fis_hdf5(sp) <= 0 || (*sf = H5Fopen(sp, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open shard (truncated or damaged?): %s",
                            sp, fsdp_h5_reason(why, sizeof(why)));
        }
    }
    hid_t d;
    FSDP_CHECK(fsdp_h5_open_dataset(sp, *sf, w->name, H5P_DEFAULT, &d));
    int rc = fsdp_h5_check_storage(sp, w->name, d);
    hid_t s = H5Dget_space(d), t = H5Dget_type(d);
    hsize_t dims[H5S_MAX_RANK];
    int nd = s < 0 ? -1 : H5Sget_simple_extent_dims(s, dims, NULL);
    fsdp_split_even(w->rows, (size_t)w->n_shards, (size_t)r, &row0, &rows);
    if (rc == 0 && (nd != w->ndim || dims[0] != rows || (nd == 2 && dims[1] != w->cols))) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s does not hold the %zu rows shard %d of "
                      "%d must", sp, w->name, rows, r, w->n_shards);
    }
    if (rc == 0 && (t < 0 || fsdp_h5_classify_float(t, &kind, why, sizeof(why)) < 0)) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s %s", sp, w->name,
                      t < 0 ? "has an unreadable type" : why);
    }
    fsdp_h5_close(t);
    fsdp_h5_close(s);
    fsdp_h5_close(d);
    H5Eclear2(H5E_DEFAULT);
    return rc;
}

int fsdp_h5_check_shard_vds(const char *path, const char *name, hid_t dset, int ndim, size_t rows,
                            size_t cols, int n_shards, hid_t *shards)
{
    const struct h5_vds_want w = {path, name, ndim, n_shards, rows, ndim == 2 ? cols : 1};
    size_t count = 0;
    hid_t dcpl = H5Dget_create_plist(dset);
    int rc = 0;
    if (dcpl < 0 || H5Pget_layout(dcpl) != H5D_VIRTUAL || H5Pget_virtual_count(dcpl, &count) < 0) {
        fsdp_h5_close(dcpl);
        H5Eclear2(H5E_DEFAULT);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s is not a virtual dataset over the "
                        "checkpoint's shard files", path, name);
    }
    unsigned char *seen = calloc((size_t)n_shards, 1);
    if (!seen) {
        H5Pclose(dcpl);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shard table", path);
    }
    for (size_t i = 0; rc == 0 && i < count; i++) {
        int r;
        rc = h5_check_mapping(&w, dcpl, i, &r);
        if (rc == 0 && seen[r]++) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: virtual dataset /%s maps shard %d twice", path,
                          name, r);
        }
    }
    for (int r = 0; rc == 0 && r < n_shards; r++) {
        size_t row0, nr;
        fsdp_split_even(w.rows, (size_t)n_shards, (size_t)r, &row0, &nr);
        if (nr > 0 && !seen[r]) {
            /* HDF5 would return fill values (zeros) for the unmapped rows */
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: virtual dataset /%s does not map rows [%zu, %zu) "
                          "(shard %d)", path, name, row0, row0 + nr, r);
        }
    }
    for (int r = 0; rc == 0 && shards && r < n_shards; r++) {
        if (seen[r]) {
            rc = h5_check_source(&w, r, &shards[r]);
        }
    }
    free(seen);
    H5Pclose(dcpl);
    return rc;
}

// ----------------------------------------------------------------------------
// Float types

const char *fsdp_h5_float_name(enum fsdp_h5_float k)
{
    static const char *const names[] = {"f32", "f16", "bf16", "f64"};
    return (unsigned)k < 4 ? names[k] : "?";
}

size_t fsdp_h5_float_size(enum fsdp_h5_float k)
{
    static const size_t sizes[] = {4, 2, 2, 8};
    return (unsigned)k < 4 ? sizes[k] : 0;
}

hid_t fsdp_h5_half_type(int bf16)
{
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    if (t < 0) {
        return -1;
    }
    size_t mant = bf16 ? 7 : 10, exp = bf16 ? 8 : 5, bias = bf16 ? 127 : 15;
    /* fields first (they must fit the current 32 bits), then shrink */
    if (H5Tset_fields(t, 15, mant, exp, 0, mant) < 0 || H5Tset_ebias(t, bias) < 0 ||
        H5Tset_precision(t, 16) < 0 || H5Tset_size(t, 2) < 0) {
        H5Tclose(t);
        return -1;
    }
    return t;
}

int fsdp_h5_classify_float(hid_t t, enum fsdp_h5_float *out, char *why, size_t len)
{
    H5T_class_t c = H5Tget_class(t);
    if (c != H5T_FLOAT) {
        snprintf(why, len, "has %s type; parameters must be floating point (f32, f16, bf16 or f64)",
                 fsdp_h5_class_name(c));
        return -1;
    }
    size_t size = H5Tget_size(t), prec = H5Tget_precision(t), bias = H5Tget_ebias(t);
    size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
    int off = H5Tget_offset(t);
    H5T_norm_t norm = H5Tget_norm(t);
    H5T_order_t order = H5Tget_order(t);
    if (H5Tget_fields(t, &spos, &epos, &esize, &mpos, &msize) < 0) {
        H5Eclear2(H5E_DEFAULT);
        snprintf(why, len, "has an unreadable float type");
        return -1;
    }
    /* by layout, not by name: a 2-byte float with an 8-bit exponent is bf16 */
    static const struct {
        size_t size, esize, msize, bias;
        enum fsdp_h5_float kind;
    } known[] = {
        {4, 8, 23, 127, FSDP_H5_F32},
        {8, 11, 52, 1023, FSDP_H5_F64},
        {2, 5, 10, 15, FSDP_H5_F16},
        {2, 8, 7, 127, FSDP_H5_BF16},
    };
    if (off == 0 && prec == size * 8 && norm == H5T_NORM_IMPLIED &&
        (order == H5T_ORDER_LE || order == H5T_ORDER_BE) && mpos == 0 && spos == prec - 1) {
        for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
            if (size == known[i].size && esize == known[i].esize && msize == known[i].msize &&
                epos == msize && bias == known[i].bias) {
                *out = known[i].kind;
                return 0;
            }
        }
    }
    snprintf(why, len,
             "has an unsupported %zu-byte float layout (exponent %zu bits, mantissa %zu bits, "
             "bias %zu); supported: f32, f16, bf16, f64",
             size, esize, msize, bias);
    return -1;
}

// ----------------------------------------------------------------------------
// Attributes

/* "root attribute 'x'" or "attribute 'x' of /group" for messages. */
static void h5_attr_label(hid_t loc, const char *name, char *buf, size_t len)
{
    char obj[256];
    ssize_t n = H5Iget_name(loc, obj, sizeof(obj));
    if (n <= 0 || (size_t)n >= sizeof(obj) || strcmp(obj, "/") == 0) {
        H5Eclear2(H5E_DEFAULT);
        snprintf(buf, len, "root attribute '%s'", name);
    } else {
        snprintf(buf, len, "attribute '%s' of %s", name,
                 fsdp_str_printable(obj, FSDP_H5_SHOW, obj, 0));
    }
}

int fsdp_h5_attr_exists(hid_t loc, const char *name)
{
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0) {
        H5Eclear2(H5E_DEFAULT);
    }
    return ex > 0;
}

/* Opens attribute `name` of loc, which must hold one value of class want. */
static int h5_attr_open(const char *path, hid_t loc, const char *name, H5T_class_t want,
                        hid_t *attr, hid_t *type)
{
    char why[256], label[320];
    h5_attr_label(loc, name, label, sizeof(label));
    htri_t ex = H5Aexists(loc, name);
    if (ex < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot look up %s: %s", path, label,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    if (ex == 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %s is missing", path, label);
    }
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t s = a >= 0 ? H5Aget_space(a) : -1;
    if (a < 0 || t < 0 || s < 0) {
        fsdp_h5_close(s);
        fsdp_h5_close(t);
        fsdp_h5_close(a);
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open %s: %s", path, label,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    hssize_t npoints = H5Sget_simple_extent_npoints(s);
    H5T_class_t c = H5Tget_class(t);
    H5Sclose(s);
    if (npoints != 1 || c != want) {
        H5Tclose(t);
        H5Aclose(a);
        if (npoints != 1) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: %s must hold one value, not %lld", path, label,
                            (long long)npoints);
        }
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %s has %s type, expected %s", path, label,
                        fsdp_h5_class_name(c), fsdp_h5_class_name(want));
    }
    *attr = a;
    *type = t;
    return 0;
}

/* Reads one value of an opened attribute as mtype, closing it. */
static int h5_attr_read(const char *path, const char *name, hid_t a, hid_t t, hid_t mtype,
                        void *v)
{
    char why[256];
    herr_t e = H5Aread(a, mtype, v);
    H5Tclose(t);
    H5Aclose(a);
    if (e < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s': %s", path, name,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

int fsdp_h5_attr_int(const char *path, hid_t loc, const char *name, long long *v)
{
    hid_t a, t;
    FSDP_CHECK(h5_attr_open(path, loc, name, H5T_INTEGER, &a, &t));
    return h5_attr_read(path, name, a, t, H5T_NATIVE_LLONG, v);
}

int fsdp_h5_attr_double(const char *path, hid_t loc, const char *name, double *v)
{
    hid_t a, t;
    FSDP_CHECK(h5_attr_open(path, loc, name, H5T_FLOAT, &a, &t));
    return h5_attr_read(path, name, a, t, H5T_NATIVE_DOUBLE, v);
}

int fsdp_h5_attr_str(const char *path, hid_t loc, const char *name, char *buf, size_t len)
{
    hid_t a, t;
    char why[256];
    int rc = 0;
    FSDP_CHECK(h5_attr_open(path, loc, name, H5T_STRING, &a, &t));
    if (H5Tis_variable_str(t) > 0) {
        char *s = NULL;
        hid_t m = H5Tcopy(H5T_C_S1);
        if (m < 0 || H5Tset_size(m, H5T_VARIABLE) < 0 || H5Tset_cset(m, H5Tget_cset(t)) < 0 ||
            H5Aread(a, m, &s) < 0) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s': %s", path, name,
                          fsdp_h5_reason(why, sizeof(why)));
        } else {
            snprintf(buf, len, "%s", s ? s : "");
            H5free_memory(s);
        }
        fsdp_h5_close(m);
    } else {
        size_t size = H5Tget_size(t);
        char *tmp = size <= FSDP_H5_STR_MAX ? calloc(1, size + 1) : NULL;
        if (size > FSDP_H5_STR_MAX) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' is a %zu-byte string (limit %d)",
                          path, name, size, FSDP_H5_STR_MAX);
        } else if (!tmp) {
            rc = fsdp_err(FSDP_ERR_NOMEM, "%s: attribute '%s'", path, name);
        } else if (H5Aread(a, t, tmp) < 0) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s': %s", path, name,
                          fsdp_h5_reason(why, sizeof(why)));
        } else {
            /* NULLPAD / SPACEPAD strings carry trailing padding */
            size_t n = strnlen(tmp, size);
            while (n > 0 && tmp[n - 1] == ' ') {
                n--;
            }
            tmp[n] = '\0';
            snprintf(buf, len, "%s", tmp);
        }
        free(tmp);
    }
    H5Tclose(t);
    H5Aclose(a);
    if (rc == 0) {
        fsdp_str_printable(buf, len, buf, 0);
    }
    return rc;
}

/* An attribute of type ftype over the dataspace s (closed here; -1: its
 * creation failed), written from v in mtype. */
static int h5_put_attr_in(hid_t loc, const char *name, hid_t s, hid_t ftype, hid_t mtype,
                          const void *v)
{
    hid_t a = s >= 0 ? H5Acreate2(loc, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT) : -1;
    herr_t e = a >= 0 ? H5Awrite(a, mtype, v) : -1;
    fsdp_h5_close(a);
    fsdp_h5_close(s);
    return e < 0 ? -1 : 0;
}

static int h5_put_attr(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    return h5_put_attr_in(loc, name, H5Screate(H5S_SCALAR), ftype, mtype, v);
}

int fsdp_h5_put_attr_u64s(hid_t loc, const char *name, const uint64_t *v, size_t n)
{
    hsize_t dim = n;
    return h5_put_attr_in(loc, name, H5Screate_simple(1, &dim, NULL), H5T_STD_U64LE,
                          H5T_NATIVE_UINT64, v);
}

int fsdp_h5_put_attr_int(hid_t loc, const char *name, int v)
{
    return h5_put_attr(loc, name, H5T_STD_I32LE, H5T_NATIVE_INT, &v);
}

int fsdp_h5_put_attr_float(hid_t loc, const char *name, float v)
{
    return h5_put_attr(loc, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &v);
}

hid_t fsdp_h5_dcpl_write_once(void)
{
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl >= 0 && (H5Pset_layout(dcpl, H5D_CONTIGUOUS) < 0 ||
                      H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) < 0 ||
                      H5Pset_obj_track_times(dcpl, 0) < 0)) {
        H5Pclose(dcpl);
        return -1;
    }
    return dcpl;
}

int fsdp_h5_put_attr_i64(hid_t loc, const char *name, long long v)
{
    return h5_put_attr(loc, name, H5T_STD_I64LE, H5T_NATIVE_LLONG, &v);
}

int fsdp_h5_put_attr_double(hid_t loc, const char *name, double v)
{
    return h5_put_attr(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &v);
}

int fsdp_h5_put_attr_str(hid_t loc, const char *name, const char *v)
{
    /* variable-length UTF-8: what h5py writes and reads back as str */
    hid_t t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, H5T_VARIABLE) < 0 || H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        fsdp_h5_close(t);
        return -1;
    }
    int rc = h5_put_attr(loc, name, t, t, &v);
    H5Tclose(t);
    return rc;
}

int fsdp_h5_put_model_attrs(hid_t loc, const struct fsdp_model_spec *spec, const char *created_by)
{
    const struct fsdp_arch *arch = spec->arch;
    if (fsdp_h5_put_attr_str(loc, "format", FSDP_MODEL_FORMAT) < 0 ||
        fsdp_h5_put_attr_int(loc, "format_version", FSDP_MODEL_FORMAT_VERSION) < 0 ||
        fsdp_h5_put_attr_str(loc, "architecture", arch->name) < 0) {
        return -1;
    }
    for (size_t i = 0; i < arch->n_attrs; i++) {
        const struct fsdp_attr_desc *a = &arch->attrs[i];
        double v = fsdp_attr_get(a, spec->cfg);
        int rc = a->type == FSDP_ATTR_FLOAT ? fsdp_h5_put_attr_float(loc, a->name, (float)v)
                                            : fsdp_h5_put_attr_int(loc, a->name, (int)v);
        if (rc < 0) {
            return -1;
        }
    }
    /* optional: written only when known */
    if ((spec->bos_token_id >= 0 &&
         fsdp_h5_put_attr_int(loc, "bos_token_id", (int)spec->bos_token_id) < 0) ||
        (spec->eos_token_id >= 0 &&
         fsdp_h5_put_attr_int(loc, "eos_token_id", (int)spec->eos_token_id) < 0)) {
        return -1;
    }
    return created_by && fsdp_h5_put_attr_str(loc, "created_by", created_by) < 0 ? -1 : 0;
}
