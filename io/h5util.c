/*
 * h5util.c - HDF5 helpers for the io layer: quiet errors with one reason
 * string, float-type recognition, 16-bit float types, checked attributes.
 *
 * Owns no state. Every function leaves HDF5's error stack clear when it
 * reports through fsdp_err, so the next call starts from a clean stack.
 */
#include "config.h"
#include "io/h5util.h"
#include "io/model_file.h"
#include "core/spec.h"
#include "core/error.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    snprintf(buf, len, "%s", w.desc[0] ? w.desc : "unknown HDF5 error");
    return buf;
}

void fsdp_h5_close(hid_t id)
{
    if (id >= 0) {
        H5Idec_ref(id);
    }
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

void fsdp_h5_sanitize(char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++) {
        if (!isprint((unsigned char)s[i])) {
            s[i] = '?';
        }
    }
    if (n > 64) {
        strcpy(s + 61, "...");
    }
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
        fsdp_h5_sanitize(obj);
        snprintf(buf, len, "attribute '%s' of %s", name, obj);
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
        fsdp_h5_sanitize(buf);
    }
    return rc;
}

static int h5_put_attr(hid_t loc, const char *name, hid_t ftype, hid_t mtype, const void *v)
{
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = s >= 0 ? H5Acreate2(loc, name, ftype, s, H5P_DEFAULT, H5P_DEFAULT) : -1;
    herr_t e = a >= 0 ? H5Awrite(a, mtype, v) : -1;
    fsdp_h5_close(a);
    fsdp_h5_close(s);
    return e < 0 ? -1 : 0;
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
    return created_by && fsdp_h5_put_attr_str(loc, "created_by", created_by) < 0 ? -1 : 0;
}
