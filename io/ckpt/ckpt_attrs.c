/*
 * ckpt_attrs.c - the checksums of a checkpoint index's root attributes (see
 * ckpt_attrs.h; layout in doc/formats.md, "index.h5").
 *
 * Each covered attribute is hashed from a canonical form of its stored
 * value, its name first, so that a value moved to another attribute also
 * differs: "name\0i <decimal>" for integers of any width, "name\0f <%a>"
 * for floats (read as double: exact for f32 and f64), "name\0s <bytes>" for
 * strings as stored. The order is this file's table followed by the
 * architecture's attribute table (its config, as spec.h lists it). Knows
 * attributes only: which checkpoint they belong to is ckpt_index.c's and
 * ckpt_reader.c's.
 */
#include "config.h"
#include "io/ckpt/ckpt_attrs.h"
#include "io/ckpt/ckpt.h"
#include "io/h5/h5util.h"
#include "io/h5/model_file.h"
#include "core/error.h"
#include "core/spec.h"

#include <xxhash.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CA_MAX_HASHES 4096   /* longer xxh3_64_attrs arrays are refused */
#define CA_MAX_FIXED 65536   /* longest fixed-length string hashed */

/* The run state and format attributes, in the order of their hashes. */
static const char *const ca_fixed[] = {
    "format", "format_version", "architecture", "created_by", "checkpoint_format",
    "checkpoint_version", "step", "tokens_seen", "world_size", "n_shards", "mesh", "backends",
    "config", "data_position", "data_epoch", "data_n_tokens", "seed", "rng_state", "adam_step",
    "loss_scale", "loss_scale_good_steps", "skipped_steps",
};
#define CA_NFIXED (sizeof(ca_fixed) / sizeof(ca_fixed[0]))

/* The covered attributes of f: the fixed ones, then those of the
 * architecture f names (none when it names none of archs: its own hash
 * then tells). *names is allocated; free() it. */
static int ca_names(const char *path, hid_t f, const struct fsdp_arch_set *archs,
                    const char ***names, size_t *n)
{
    char s[64] = "";
    const struct fsdp_arch *arch = NULL;
    if (fsdp_h5_attr_exists(f, "architecture")) {
        if (fsdp_h5_attr_str(path, f, "architecture", s, sizeof(s)) == 0) {
            arch = fsdp_arch_set_find(archs, s);
        } else {
            fsdp_err_clear(); /* its own hash names it */
        }
    }
    size_t na = arch ? arch->n_attrs : 0;
    *names = malloc((CA_NFIXED + na) * sizeof(**names));
    if (!*names) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: attribute table", path);
    }
    for (size_t i = 0; i < CA_NFIXED; i++) {
        (*names)[i] = ca_fixed[i];
    }
    for (size_t i = 0; i < na; i++) {
        (*names)[CA_NFIXED + i] = arch->attrs[i].name;
    }
    *n = CA_NFIXED + na;
    return 0;
}

/* Feeds the canonical form of string attribute a (type t) to st. */
static int ca_hash_str(hid_t a, hid_t t, XXH3_state_t *st)
{
    if (H5Tis_variable_str(t) > 0) {
        char *v = NULL;
        hid_t m = H5Tcopy(H5T_C_S1);
        int ok = m >= 0 && H5Tset_size(m, H5T_VARIABLE) >= 0 &&
                 H5Tset_cset(m, H5Tget_cset(t)) >= 0 && H5Aread(a, m, &v) >= 0;
        if (ok) {
            XXH3_64bits_update(st, v ? v : "", v ? strlen(v) : 0);
        }
        H5free_memory(v);
        fsdp_h5_close(m);
        return ok ? 0 : -1;
    }
    size_t size = H5Tget_size(t);
    char *v = size > 0 && size <= CA_MAX_FIXED ? malloc(size) : NULL;
    int ok = v && H5Aread(a, t, v) >= 0;
    if (ok) {
        XXH3_64bits_update(st, v, strnlen(v, size));
    }
    free(v);
    return ok ? 0 : -1;
}

/* The hash of root attribute `name` of f, as stored. */
static int ca_hash(const char *path, hid_t f, const char *name, uint64_t *h)
{
    char why[256], num[64];
    if (!fsdp_h5_attr_exists(f, name)) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: root attribute '%s' is missing (%s records its "
                        "checksum)", path, name, FSDP_CKPT_ATTRS_SUM);
    }
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    H5T_class_t c = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    XXH3_state_t *st = XXH3_createState();
    int rc = a >= 0 && t >= 0 && sp >= 0 && st && H5Sget_simple_extent_npoints(sp) == 1 ? 0 : -1;
    if (rc == 0) {
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, name, strlen(name) + 1);
        long long i;
        double d;
        if (c == H5T_INTEGER && H5Aread(a, H5T_NATIVE_LLONG, &i) >= 0) {
            XXH3_64bits_update(st, num, (size_t)snprintf(num, sizeof(num), "i %lld", i));
        } else if (c == H5T_FLOAT && H5Aread(a, H5T_NATIVE_DOUBLE, &d) >= 0) {
            XXH3_64bits_update(st, num, (size_t)snprintf(num, sizeof(num), "f %a", d));
        } else if (c == H5T_STRING) {
            XXH3_64bits_update(st, "s ", 2);
            rc = ca_hash_str(a, t, st);
        } else {
            rc = -1;
        }
        *h = XXH3_64bits_digest(st);
    }
    if (st) {
        XXH3_freeState(st);
    }
    fsdp_h5_close(sp);
    fsdp_h5_close(t);
    fsdp_h5_close(a);
    if (rc < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read root attribute '%s' (one %s, %s "
                        "records its checksum): %s", path, name,
                        c == H5T_NO_CLASS ? "value" : fsdp_h5_class_name(c), FSDP_CKPT_ATTRS_SUM,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

int fsdp_ckpt_attrs_sum_put(const char *path, hid_t f, const struct fsdp_arch *arch)
{
    const char **names;
    size_t n;
    const struct fsdp_arch_set one = {&arch, 1};
    FSDP_CHECK(ca_names(path, f, &one, &names, &n));
    uint64_t *h = malloc(n * sizeof(*h));
    int rc = h ? 0 : fsdp_err(FSDP_ERR_NOMEM, "%s: attribute checksums", path);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        rc = ca_hash(path, f, names[i], &h[i]);
    }
    if (rc == 0 && fsdp_h5_put_attr_u64s(f, FSDP_CKPT_ATTRS_SUM, h, n) < 0) {
        char why[256];
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot write %s: %s", path, FSDP_CKPT_ATTRS_SUM,
                      fsdp_h5_reason(why, sizeof(why)));
    }
    free(h);
    free(names);
    return rc;
}

/* The hashes xxh3_64_attrs holds: (*n,), allocated. */
static int ca_read(const char *path, hid_t f, uint64_t **h, size_t *n)
{
    char why[256];
    hid_t a = H5Aopen(f, FSDP_CKPT_ATTRS_SUM, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    int form = t >= 0 && H5Tget_class(t) == H5T_INTEGER && H5Tget_size(t) == 8 &&
               H5Tget_sign(t) == H5T_SGN_NONE && sp >= 0 && H5Sget_simple_extent_ndims(sp) == 1 &&
               np >= 1 && np <= CA_MAX_HASHES;
    *h = form ? malloc((size_t)np * sizeof(**h)) : NULL;
    int ok = *h && H5Aread(a, H5T_NATIVE_UINT64, *h) >= 0;
    fsdp_h5_close(sp);
    fsdp_h5_close(t);
    fsdp_h5_close(a);
    if (!ok) {
        free(*h);
        *h = NULL;
        return fsdp_err(FSDP_ERR_FORMAT, "%s: root attribute '%s' must be 1 to %d unsigned 64-bit "
                        "integers%s%s", path, FSDP_CKPT_ATTRS_SUM, CA_MAX_HASHES,
                        form ? ": " : "", form ? fsdp_h5_reason(why, sizeof(why)) : "");
    }
    H5Eclear2(H5E_DEFAULT);
    *n = (size_t)np;
    return 0;
}

/* 1 when f's format versions are those whose attributes this table
 * lists; another version is refused by its reader, naming the version. */
static int ca_known_version(const char *path, hid_t f)
{
    long long mv = FSDP_MODEL_FORMAT_VERSION, cv = FSDP_CKPT_VERSION;
    if ((fsdp_h5_attr_exists(f, "format_version") &&
         fsdp_h5_attr_int(path, f, "format_version", &mv) < 0) ||
        (fsdp_h5_attr_exists(f, "checkpoint_version") &&
         fsdp_h5_attr_int(path, f, "checkpoint_version", &cv) < 0)) {
        fsdp_err_clear(); /* their own hashes name them */
        return 1;
    }
    return mv == FSDP_MODEL_FORMAT_VERSION && cv == FSDP_CKPT_VERSION;
}

int fsdp_ckpt_attrs_sum_check(const char *path, hid_t f, const struct fsdp_arch_set *archs)
{
    if (!fsdp_h5_attr_exists(f, FSDP_CKPT_ATTRS_SUM) || !ca_known_version(path, f)) {
        return 0;
    }
    const char **names = NULL;
    uint64_t *want = NULL, got;
    size_t n = 0, m = 0;
    int rc = ca_read(path, f, &want, &m);
    if (rc == 0) {
        rc = ca_names(path, f, archs, &names, &n);
    }
    for (size_t i = 0; rc == 0 && i < n && i < m; i++) {
        rc = ca_hash(path, f, names[i], &got);
        if (rc == 0 && got != want[i]) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: root attribute '%s' does not match its checksum "
                          "in %s (edited or damaged since the checkpoint was written); restore "
                          "index.h5 from a good copy", path, names[i], FSDP_CKPT_ATTRS_SUM);
        }
    }
    if (rc == 0 && n != m) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: root attribute '%s' holds %zu checksums but this "
                      "checkpoint has %zu attributes to check", path, FSDP_CKPT_ATTRS_SUM, m, n);
    }
    free(names);
    free(want);
    return rc < 0 ? rc : 1;
}
