/*
 * ckpt_summary.c - a shard file's summary (layout in doc/formats.md, "Shard
 * summary"): one uint64 root attribute, ckpt_summary, that says what every
 * dataset of the shard holds (rows, columns), where its bytes lie in the
 * file, which object its link must point to, and its checksums, so that a
 * reader learns all of a shard from one object instead of opening each of
 * its datasets, and reads the rows with pread at disk speed.
 *
 * The writer (ckpt_writer.c) fills one entry per tensor as it writes it and
 * stores the summary at commit; the reader (ckpt_reader.c) and the index
 * writer (ckpt_index.c) load it. Loading checks everything it says against
 * what the caller expects (step, shard, split rule, shapes, file size) and
 * the links of the shard's groups against the recorded object addresses: a
 * dataset replaced after the shard was written is handed back to the
 * caller, whose full check of that dataset names what is wrong with it.
 * Nothing here makes HDF5 load a global heap (no variable-length data, no
 * dataset opened), so a shard with a summary needs no heap scan.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "io/h5/h5util.h"
#include "core/error.h"

#include <xxhash.h>

#include <stdlib.h>
#include <string.h>

/* words: head, then per tensor CK_SUM_ENTRY words and its hashes, then the
 * XXH3-64 of all the words before it */
#define CK_SUM_VERSION 1
#define CK_SUM_HEAD 6          /* version, step, shard, n_shards, n_kinds, n_params */
#define CK_SUM_ENTRY 8         /* row0, rows, cols, offset, bytes, addr, block_rows, n_hashes */
#define CK_SUM_NONE UINT64_MAX /* offset of a tensor of no bytes */

void ck_entries_free(struct ck_entry *e, size_t n)
{
    for (size_t j = 0; e && j < n; j++) {
        fsdp_sum_clear(&e[j].sum);
    }
    free(e);
}

hid_t ck_h5_fapl_small(void)
{
    /* a shard is opened, read in a few calls and closed: HDF5's default
     * metadata cache (2 MiB to start, per open file) is mostly page faults */
    H5AC_cache_config_t mdc;
    memset(&mdc, 0, sizeof(mdc));
    mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pget_mdc_config(fapl, &mdc) < 0) {
        fsdp_h5_close(fapl);
        return -1;
    }
    mdc.set_initial_size = 1;
    mdc.initial_size = (size_t)64 << 10;
    mdc.min_size = mdc.initial_size < mdc.min_size ? mdc.initial_size : mdc.min_size;
    if (H5Pset_mdc_config(fapl, &mdc) < 0 || H5Pset_sieve_buf_size(fapl, 0) < 0) {
        H5Pclose(fapl);
        return -1;
    }
    return fapl;
}

// ----------------------------------------------------------------------------
// writing

int ck_summary_put(hid_t f, const struct ck_shard_id *id, int n_kinds, size_t n_params,
                   const struct ck_entry *e)
{
    const size_t n = (size_t)n_kinds * n_params;
    size_t words = CK_SUM_HEAD + 1;
    for (size_t j = 0; j < n; j++) {
        words += CK_SUM_ENTRY + e[j].sum.n;
    }
    uint64_t *w = malloc(words * sizeof(uint64_t));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "shard summary of %zu words", words);
    }
    size_t o = 0;
    w[o++] = CK_SUM_VERSION;
    w[o++] = (uint64_t)id->step;
    w[o++] = (uint64_t)id->shard;
    w[o++] = (uint64_t)id->n_shards;
    w[o++] = (uint64_t)n_kinds;
    w[o++] = n_params;
    for (size_t j = 0; j < n; j++) {
        const uint64_t fields[CK_SUM_ENTRY] = {e[j].row0,           e[j].rows,  e[j].cols,
                                               e[j].offset,         e[j].bytes, e[j].addr,
                                               e[j].sum.block_rows, e[j].sum.n};
        memcpy(w + o, fields, sizeof(fields));
        o += CK_SUM_ENTRY;
        memcpy(w + o, e[j].sum.h, e[j].sum.n * sizeof(uint64_t));
        o += e[j].sum.n;
    }
    w[o] = XXH3_64bits(w, o * sizeof(uint64_t)); /* words as stored: little-endian hosts */
    int rc = fsdp_h5_put_attr_u64s(f, CK_SUM_ATTR, w, words);
    free(w);
    return rc;
}

// ----------------------------------------------------------------------------
// loading

/* The attribute's words (n) into a new array: unsigned 64-bit integers, at
 * least a head, no more than the file could hold. 1: the shard has none. */
static int ck_summary_words(const char *path, hid_t f, uint64_t file_size, uint64_t **out,
                            size_t *n)
{
    char why[256];
    htri_t has = H5Aexists(f, CK_SUM_ATTR);
    if (has == 0) {
        return 1;
    }
    hid_t a = has > 0 ? H5Aopen(f, CK_SUM_ATTR, H5P_DEFAULT) : -1;
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    hid_t sp = a < 0 ? -1 : H5Aget_space(a);
    hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
    int rc = 0;
    if (t < 0 || np < 0) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s': %s", path, CK_SUM_ATTR,
                      fsdp_h5_reason(why, sizeof(why)));
    } else if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != 8 ||
               H5Tget_sign(t) != H5T_SGN_NONE || np < CK_SUM_HEAD + 1 ||
               (uint64_t)np > file_size / 8) {
        rc = fsdp_err(FSDP_ERR_FORMAT,
                      "%s: attribute '%s' is not a shard summary (%lld %s "
                      "values of %zu bytes); the shard is damaged",
                      path, CK_SUM_ATTR, (long long)np, fsdp_h5_class_name(H5Tget_class(t)),
                      H5Tget_size(t));
    } else if (!(*out = malloc((size_t)np * sizeof(uint64_t)))) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: shard summary of %lld words", path, (long long)np);
    } else if (H5Aread(a, H5T_NATIVE_UINT64, *out) < 0) {
        free(*out);
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s': %s", path, CK_SUM_ATTR,
                      fsdp_h5_reason(why, sizeof(why)));
    }
    fsdp_h5_close(sp);
    fsdp_h5_close(t);
    fsdp_h5_close(a);
    H5Eclear2(H5E_DEFAULT);
    *n = (size_t)np;
    return rc;
}

/* The head: this summary's version, the step, shard and tensor counts the
 * caller expects (messages as the shard attributes' checks word them). */
static int ck_summary_head(const char *path, const uint64_t *w, const struct ck_shard_id *id,
                           int n_kinds, size_t n_params)
{
    if (w[0] != CK_SUM_VERSION) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "%s: shard summary version %llu; this fsdpc reads "
                        "version %d",
                        path, (unsigned long long)w[0], CK_SUM_VERSION);
    }
    if (w[1] != (uint64_t)id->step) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: shard is from step %lld but the index is step %ld "
                        "(shards from different checkpoints)",
                        path, (long long)w[1], id->step);
    }
    if (w[2] != (uint64_t)id->shard || w[3] != (uint64_t)id->n_shards) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: shard %lld of %lld, expected %d of %d", path,
                        (long long)w[2], (long long)w[3], id->shard, id->n_shards);
    }
    if (w[4] != (uint64_t)n_kinds || w[5] != n_params) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: the shard summary lists %llu kinds of %llu "
                        "tensors; the index has %d of %zu",
                        path, (unsigned long long)w[4], (unsigned long long)w[5], n_kinds,
                        n_params);
    }
    return 0;
}

/* Entry j at w (left words after it): rows by the split rule, the
 * parameter's columns, f32 bytes inside the file, hashes that fit. */
static int ck_summary_entry(const char *path, const uint64_t *w, size_t left,
                            const struct fsdp_param_spec *p, const struct ck_shard_id *id,
                            uint64_t file_size, struct ck_entry *e)
{
    size_t row0, rows;
    fsdp_ckpt_rows(p->shape[0], id->n_shards, id->shard, &row0, &rows);
    e->row0 = w[0];
    e->rows = w[1];
    e->cols = w[2];
    e->offset = w[3];
    e->bytes = w[4];
    e->addr = w[5];
    e->sum.block_rows = w[6];
    uint64_t nh = w[7];
    size_t want_h = e->sum.block_rows > 0 ? fsdp_sum_nblocks(rows, e->sum.block_rows) : 0;
    int ok = e->row0 == row0 && e->rows == rows && e->cols == p->shape[1] &&
             e->bytes == (uint64_t)rows * p->shape[1] * sizeof(float) && nh == want_h &&
             nh <= left && e->sum.block_rows > 0 &&
             (e->bytes == 0 || (e->offset <= file_size && e->bytes <= file_size - e->offset));
    if (!ok) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: the shard summary's entry for %s (rows [%llu, "
                        "+%llu), %llu bytes at %llu) is not the %zu rows [%zu, %zu) shard %d of "
                        "%d holds in the file; the shard is damaged",
                        path, p->name, (unsigned long long)e->row0, (unsigned long long)e->rows,
                        (unsigned long long)e->bytes, (unsigned long long)e->offset, rows, row0,
                        row0 + rows, id->shard, id->n_shards);
    }
    e->sum.n = (size_t)nh;
    if (!(e->sum.h = malloc((nh ? nh : 1) * sizeof(uint64_t)))) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: checksums of %s", path, p->name);
    }
    memcpy(e->sum.h, w + CK_SUM_ENTRY, nh * sizeof(uint64_t));
    return 0;
}

int ck_summary_load(const char *path, hid_t f, const struct ck_shard_id *id,
                    const struct fsdp_model_spec *spec, int n_kinds, uint64_t file_size,
                    struct ck_entry *e)
{
    uint64_t *w = NULL;
    size_t n;
    if (!CK_SUM_HOST) {
        return 1; /* read as a shard without one */
    }
    int rc = ck_summary_words(path, f, file_size, &w, &n);
    if (rc != 0) {
        return rc;
    }
    if (XXH3_64bits(w, (n - 1) * sizeof(uint64_t)) != w[n - 1]) {
        free(w);
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: attribute '%s' does not match its own checksum "
                        "(damaged or edited since the shard was written)",
                        path, CK_SUM_ATTR);
    }
    rc = ck_summary_head(path, w, id, n_kinds, spec->n_params);
    size_t o = CK_SUM_HEAD;
    for (size_t j = 0; rc == 0 && j < (size_t)n_kinds * spec->n_params; j++) {
        if (n - 1 - o < CK_SUM_ENTRY) {
            rc = fsdp_err(FSDP_ERR_FORMAT,
                          "%s: the shard summary ends before the entry of "
                          "tensor %zu; the shard is damaged",
                          path, j);
            break;
        }
        rc = ck_summary_entry(path, w + o, n - 1 - o - CK_SUM_ENTRY,
                              &spec->params[j % spec->n_params], id, file_size, &e[j]);
        o += CK_SUM_ENTRY + e[j].sum.n;
    }
    if (rc == 0 && o != n - 1) {
        rc = fsdp_err(FSDP_ERR_FORMAT,
                      "%s: the shard summary has %zu words past its last "
                      "entry; the shard is damaged",
                      path, n - 1 - o);
    }
    free(w);
    return rc;
}

// ----------------------------------------------------------------------------
// links

struct ck_link_walk {
    const struct fsdp_model_spec *spec;
    haddr_t *addr; /* (n_params,) what each name's hard link points to; HADDR_UNDEF: none */
};

static herr_t ck_note_link(hid_t g, const char *name, const H5L_info_t *info, void *arg)
{
    struct ck_link_walk *lw = arg;
    (void)g;
    long i = fsdp_model_spec_find(lw->spec, name);
    if (i >= 0 && info->type == H5L_TYPE_HARD) {
        lw->addr[i] = info->u.address;
    }
    return 0; /* other names are not the summary's to judge */
}

int ck_summary_links(const char *path, hid_t f, const struct fsdp_model_spec *spec,
                     const struct fsdp_ckpt_kinds *k, const struct ck_entry *e, size_t *odd)
{
    const size_t np = spec->n_params;
    struct ck_link_walk lw = {spec, malloc(np * sizeof(haddr_t))};
    if (!lw.addr) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: link table", path);
    }
    int rc = 0;
    for (int kind = 0; rc == 0 && kind < k->n; kind++) {
        hid_t g;
        for (size_t i = 0; i < np; i++) {
            lw.addr[i] = HADDR_UNDEF;
        }
        if ((rc = fsdp_h5_open_group(path, f, k->group[kind], &g)) < 0) {
            break;
        }
        herr_t it = H5Literate(g, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, ck_note_link, &lw);
        H5Gclose(g);
        if (it < 0) {
            char why[256];
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot list /%s: %s", path, k->group[kind],
                          fsdp_h5_reason(why, sizeof(why)));
        }
        for (size_t i = 0; rc == 0 && i < np; i++) {
            if (lw.addr[i] != e[kind * np + i].addr) {
                *odd = kind * np + i;
                rc = 1;
            }
        }
    }
    free(lw.addr);
    return rc;
}
