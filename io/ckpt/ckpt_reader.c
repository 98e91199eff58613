/*
 * ckpt_reader.c - opening and reading a checkpoint (see ckpt.h; layout in
 * doc/formats.md): the step directory a path names (ckpt_path.c), the
 * index's attributes, checksums and mappings, every shard file validated
 * (present, same step, expected shapes and row ranges, the checksums the
 * index records for it) through its summary (ckpt_summary.c), one file
 * open at a time, or, without one, dataset by dataset; at open or, lazily,
 * at its first read; rows read from only the shard files that hold them
 * (a summarized shard's with pread at its offsets, read ahead by
 * ckpt_ahead.c, past the page cache for large pieces), every block hashed
 * as it arrives (a damaged shard is refused by name).
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "io/ckpt/ckpt_attrs.h"
#include "io/h5/h5util.h"
#include "io/h5/model_file.h"
#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// reader

/* How a shard was checked, and so how it is read. */
enum { CK_UNCHECKED = 0, CK_BY_SUMMARY, CK_BY_H5 };

struct fsdp_ckpt {
    char dir[CK_PATH_MAX];
    struct fsdp_ckpt_meta meta;
    struct fsdp_model_spec *spec;
    struct fsdp_ckpt_kinds kinds; /* the index's: /model and each group under /optim */
    hid_t *shards;                /* (n_shards,) shard files open in HDF5 (-1: none) */
    unsigned char *how;           /* (n_shards,) CK_UNCHECKED, CK_BY_SUMMARY or CK_BY_H5 */
    uint64_t **offsets; /* (n_shards,) a summarized shard's data offsets (kinds.n * n_params,) */
    int fd, fd_shard;   /* the summarized shard open for reading (-1: none) */
    int dfd, dfd_tried; /* the same with O_DIRECT (-1: none yet, or refused) */
    int direct;         /* large pieces past the page cache (FSDPC_CKPT_DIRECT) */
    struct ck_ahead *ahead;  /* read-ahead of the summarized shard open (NULL: none yet) */
    int lazy;                /* a shard is checked and opened when first read */
    int all_summed;          /* the index records checksums of every tensor */
    struct fsdp_sum *sums;   /* (kinds.n * n_params,) the index's checksums of every tensor */
    struct fsdp_sum_buf buf; /* blocks read only in part */
};

const struct fsdp_ckpt_meta *fsdp_ckpt_meta(const struct fsdp_ckpt *ck)
{
    return &ck->meta;
}

const struct fsdp_model_spec *fsdp_ckpt_spec(const struct fsdp_ckpt *ck)
{
    return ck->spec;
}

const char *fsdp_ckpt_dir(const struct fsdp_ckpt *ck)
{
    return ck->dir;
}

const struct fsdp_ckpt_kinds *fsdp_ckpt_kinds(const struct fsdp_ckpt *ck)
{
    return &ck->kinds;
}

static int ck_read_u64(const char *path, hid_t f, const char *name, uint64_t *v)
{
    long long x;
    FSDP_CHECK(fsdp_h5_attr_int(path, f, name, &x));
    if (x < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' is negative (%lld)", path, name, x);
    }
    *v = (uint64_t)x;
    return 0;
}

/* A multi-line string attribute, printable (newlines kept, other control
 * and non-ASCII bytes replaced), cut to len - 1 bytes. */
static int ck_read_text(const char *path, hid_t f, const char *name, char *buf, size_t len)
{
    char why[256];
    char *s = NULL;
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    hid_t m = H5Tcopy(H5T_C_S1);
    int ok = t >= 0 && H5Tget_class(t) == H5T_STRING && H5Tis_variable_str(t) > 0 && m >= 0 &&
             H5Tset_size(m, H5T_VARIABLE) >= 0 && H5Aread(a, m, &s) >= 0 && s;
    if (ok) {
        fsdp_str_printable(buf, len, s, 1);
        H5free_memory(s);
    }
    fsdp_h5_close(m);
    fsdp_h5_close(t);
    fsdp_h5_close(a);
    if (!ok) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' is missing or not a string: %s", path,
                        name, fsdp_h5_reason(why, sizeof(why)));
    }
    return 0;
}

/* f's string attribute name (an index's checkpoint_format, a shard's
 * format) is want; otherwise an error naming both. */
static int ck_expect_format(const char *path, hid_t f, const char *name, const char *want)
{
    char fmt[64];
    FSDP_CHECK(fsdp_h5_attr_str(path, f, name, fmt, sizeof(fmt)));
    if (strcmp(fmt, want) != 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %s is '%s', expected '%s'", path, name, fmt, want);
    }
    return 0;
}

static int ck_read_meta(const char *path, hid_t f, const struct fsdp_arch_set *archs,
                        struct fsdp_ckpt_meta *m)
{
    long long x;
    if (!fsdp_h5_attr_exists(f, "checkpoint_format")) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: not a checkpoint index (no 'checkpoint_format' "
                        "attribute; a plain model file?)",
                        path);
    }
    int summed = fsdp_ckpt_attrs_sum_check(path, f, archs);
    if (summed < 0) {
        return summed;
    }
    m->attrs_summed = summed;
    FSDP_CHECK(ck_expect_format(path, f, "checkpoint_format", FSDP_CKPT_FORMAT));
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "checkpoint_version", &x));
    if (x != FSDP_CKPT_VERSION) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED,
                        "%s: checkpoint_version %lld; this fsdpc reads "
                        "version %d",
                        path, x, FSDP_CKPT_VERSION);
    }
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "step", &x));
    m->step = (long)x;
    FSDP_CHECK(fsdp_h5_attr_double(path, f, "tokens_seen", &m->tokens_seen));
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "world_size", &x));
    m->world_size = (int)x;
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "n_shards", &x));
    if (x < 1 || x > 1 << 20) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: n_shards %lld is out of range", path, x);
    }
    m->n_shards = (int)x;
    if (m->step < 0 || m->world_size < 1) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: step %ld / world_size %d out of range", path, m->step,
                        m->world_size);
    }
    FSDP_CHECK(fsdp_h5_attr_str(path, f, "mesh", m->mesh, sizeof(m->mesh)));
    FSDP_CHECK(fsdp_h5_attr_str(path, f, "backends", m->backends, sizeof(m->backends)));
    FSDP_CHECK(ck_read_text(path, f, "config", m->config, sizeof(m->config)));
    if (fsdp_h5_attr_exists(f, "created_by")) {
        FSDP_CHECK(fsdp_h5_attr_str(path, f, "created_by", m->created_by, sizeof(m->created_by)));
    }
    FSDP_CHECK(ck_read_u64(path, f, "data_position", &m->data_position));
    FSDP_CHECK(ck_read_u64(path, f, "data_epoch", &m->data_epoch));
    FSDP_CHECK(ck_read_u64(path, f, "data_n_tokens", &m->data_n_tokens));
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "seed", &x));
    m->seed = (long)x;
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "adam_step", &x));
    m->adam_step = (long)x;
    FSDP_CHECK(fsdp_h5_attr_double(path, f, "loss_scale", &m->loss_scale));
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "loss_scale_good_steps", &x));
    m->scale_good_steps = (long)x;
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "skipped_steps", &x));
    m->skipped_steps = (long)x;
    return 0;
}

/* The names under /optim, collected in the order H5Literate gives them. */
struct ck_states {
    int n, over;
    char name[FSDP_CKPT_MAX_STATE][2 * FSDP_CKPT_STATE_MAX];
};

static herr_t ck_note_state(hid_t g, const char *name, const H5L_info_t *info, void *arg)
{
    struct ck_states *st = arg;
    (void)g;
    (void)info;
    if (st->n == FSDP_CKPT_MAX_STATE) {
        st->over = 1;
        return 1;
    }
    snprintf(st->name[st->n++], sizeof(st->name[0]), "%s", name);
    return 0;
}

/* The kinds index.h5 keeps: /model, then one per member of /optim in name
 * order (AdamW's exp_avg, exp_avg_sq), each the optimizer's name of a state
 * tensor. Its datasets are opened, and so checked, by the callers. */
static int ck_read_kinds(const char *index, hid_t f, struct fsdp_ckpt_kinds *k)
{
    struct ck_states st = {0};
    const char *names[FSDP_CKPT_MAX_STATE];
    hid_t g;
    FSDP_CHECK(fsdp_h5_open_group(index, f, "optim", &g));
    herr_t e = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, NULL, ck_note_state, &st);
    H5Gclose(g);
    if (e < 0) {
        char why[256];
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot list /optim: %s", index,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    if (st.over) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: /optim holds more than %d state tensors", index,
                        FSDP_CKPT_MAX_STATE);
    }
    for (int i = 0; i < st.n; i++) {
        names[i] = st.name[i];
    }
    int rc = fsdp_ckpt_kinds_init(k, st.n, names);
    if (rc < 0) { /* name the file */
        char why[1024];
        fsdp_err_take(why, sizeof(why));
        return fsdp_err(FSDP_ERR_FORMAT, "%s: /optim: %s", index, why);
    }
    return 0;
}

/* The checksums index.h5 records, every tensor's (none: block_rows 0), and
 * each virtual dataset's mapping (ck_check_index). */
static int ck_read_sums(struct fsdp_ckpt *ck, const char *index, hid_t f)
{
    const size_t np = ck->spec->n_params, R = (size_t)ck->meta.n_shards;
    size_t *rows = malloc(R * sizeof(size_t));
    ck->sums = calloc((size_t)ck->kinds.n * np, sizeof(*ck->sums));
    if (!rows || !ck->sums) {
        free(rows);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: checksum table", index);
    }
    int rc = 0;
    for (size_t j = 0; rc == 0 && j < (size_t)ck->kinds.n * np; j++) {
        const struct fsdp_param_spec *p = &ck->spec->params[j % np];
        char name[256];
        hid_t d;
        for (size_t r = 0; r < R; r++) {
            size_t row0;
            fsdp_ckpt_rows(p->shape[0], (int)R, (int)r, &row0, &rows[r]);
        }
        snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[j / np], p->name);
        if ((rc = fsdp_h5_open_dataset(index, f, name, H5P_DEFAULT, &d)) == 0) {
            rc = fsdp_sum_get(index, name, d, rows, R, &ck->sums[j]);
            /* the mapping too while the dataset is open (opening one of many
             * shards is most of the cost); its sources with the shards */
            rc = rc < 0 ? rc
                        : fsdp_h5_check_shard_vds(index, name, d, p->ndim, p->shape[0], p->shape[1],
                                                  (int)R, NULL);
            H5Dclose(d);
        }
    }
    free(rows);
    return rc;
}

/* got, shard r's checksums of tensor (k, i) (`name`), are those index.h5
 * records for it: a shard written for another checkpoint or run, with the
 * same step and shapes, is refused here, before anything is read. */
static int ck_compare_sums(const struct fsdp_ckpt *ck, const char *path, const char *name, int r,
                           int k, size_t i, const struct fsdp_sum *got)
{
    const struct fsdp_param_spec *p = &ck->spec->params[i];
    const struct fsdp_sum *want = &ck->sums[k * ck->spec->n_params + i];
    const uint64_t *w = want->h + ck_sum_first(p, ck->meta.n_shards, r, want->block_rows);
    size_t bad = 0;
    while (got->block_rows == want->block_rows && bad < got->n && got->h[bad] == w[bad]) {
        bad++;
    }
    if (got->block_rows == 0) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: tensor '%s' has no checksums but index.h5 records "
                        "them for shard %d: not the shard this index was written with",
                        path, name, r);
    } else if (got->block_rows != want->block_rows) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: tensor '%s' has checksums over blocks of %zu rows, "
                        "index.h5 over %zu: not the shard this index was written with",
                        path, name, got->block_rows, want->block_rows);
    } else if (bad < got->n) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: tensor '%s': the shard's checksum 0x%016llx (block "
                        "%zu) differs from 0x%016llx, which index.h5 records for shard %d: a "
                        "shard file from another checkpoint or run",
                        path, name, (unsigned long long)got->h[bad], bad,
                        (unsigned long long)w[bad], r);
    }
    return 0;
}

/* Dataset d (`name`, shard r's rows of parameter i) carries the checksums
 * index.h5 records for it. */
static int ck_check_shard_sum(struct fsdp_ckpt *ck, const char *path, const char *name, hid_t d,
                              int r, int k, size_t i, size_t rows)
{
    struct fsdp_sum got;
    if (ck->sums[k * ck->spec->n_params + i].block_rows == 0) {
        return 0; /* nothing recorded (an index from before checksums) */
    }
    FSDP_CHECK(fsdp_sum_get(path, name, d, &rows, 1, &got));
    int rc = ck_compare_sums(ck, path, name, r, k, i, &got);
    fsdp_sum_clear(&got);
    return rc;
}

/* Shard r's file is there and readable; its path into path. */
static int ck_shard_present(const struct fsdp_ckpt *ck, int r, char *path, size_t len)
{
    if (ck_shard_path(path, len, ck->dir, r) < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: checkpoint directory path too long", ck->dir);
    }
    if (access(path, R_OK) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: shard %d of %d is missing: %s", path, r,
                        ck->meta.n_shards, strerror(errno));
    }
    return 0;
}

/* Tensor i of kind k in shard r (f, at path): a float dataset of the rows
 * the split rule gives, stored plainly, with the checksums the index records. */
static int ck_check_shard_tensor(struct fsdp_ckpt *ck, const char *path, hid_t f, int r, int k,
                                 size_t i)
{
    char name[256], why[256];
    const struct fsdp_param_spec *p = &ck->spec->params[i];
    size_t row0, rows;
    hsize_t dims[H5S_MAX_RANK], want[2];
    enum fsdp_h5_float kind;
    fsdp_ckpt_rows(p->shape[0], ck->meta.n_shards, r, &row0, &rows);
    snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[k], p->name);
    hid_t d;
    FSDP_CHECK(fsdp_h5_open_dataset(path, f, name, H5P_DEFAULT, &d));
    int rc = fsdp_h5_check_storage(path, name, d);
    hid_t t = rc < 0 ? -1 : H5Dget_type(d);
    if (rc == 0 && (t < 0 || fsdp_h5_classify_float(t, &kind, why, sizeof(why)) < 0)) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: dataset /%s %s", path, name,
                      t < 0 ? "has an unreadable type" : why);
    }
    fsdp_h5_close(t);
    if (rc < 0) {
        H5Dclose(d);
        H5Eclear2(H5E_DEFAULT);
        return rc;
    }
    hid_t s = H5Dget_space(d);
    int nd = s < 0 ? -1 : H5Sget_simple_extent_dims(s, dims, NULL);
    long long a0 = -1, an = -1;
    int ok = nd == ck_dims(p, rows, want) && dims[0] == want[0] && (nd == 1 || dims[1] == want[1]);
    if (ok && (fsdp_h5_attr_int(path, d, "row0", &a0) < 0 ||
               fsdp_h5_attr_int(path, d, "rows", &an) < 0)) {
        fsdp_h5_close(s);
        fsdp_h5_close(d);
        return FSDP_ERR_FORMAT;
    }
    fsdp_h5_close(s);
    H5Eclear2(H5E_DEFAULT);
    if (!ok || a0 != (long long)row0 || an != (long long)rows) {
        fsdp_h5_close(d);
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: dataset /%s does not hold rows [%zu, %zu) "
                        "of %s as shard %d of %d must",
                        path, name, row0, row0 + rows, p->name, r, ck->meta.n_shards);
    }
    rc = ck_check_shard_sum(ck, path, name, d, r, k, i, rows);
    fsdp_h5_close(d);
    return rc;
}

/* Shard r (f, at path) as its summary e describes it: every tensor's
 * checksums those the index records, every link to the dataset the summary
 * recorded (one that is not gets the full check, which says why). */
static int ck_check_by_summary(struct fsdp_ckpt *ck, const char *path, hid_t f, int r,
                               const struct ck_entry *e)
{
    char name[256];
    const size_t np = ck->spec->n_params, n = (size_t)ck->kinds.n * np;
    for (size_t j = 0; j < n; j++) {
        snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[j / np],
                 ck->spec->params[j % np].name);
        FSDP_CHECK(ck_compare_sums(ck, path, name, r, (int)(j / np), j % np, &e[j].sum));
    }
    size_t odd = 0;
    int rc = ck_summary_links(path, f, ck->spec, &ck->kinds, e, &odd);
    if (rc == 1) { /* replaced since it was written: the full check of that dataset says how */
        snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[odd / np],
                 ck->spec->params[odd % np].name);
        FSDP_CHECK(fsdp_h5_check_heaps(path));
        FSDP_CHECK(ck_check_shard_tensor(ck, path, f, r, (int)(odd / np), odd % np));
        rc = fsdp_err(FSDP_ERR_FORMAT,
                      "%s: /%s is not the dataset the shard's summary records "
                      "(the file was changed after it was written)",
                      path, name);
    }
    if (rc == 0 && !(ck->offsets[r] = malloc(n * sizeof(uint64_t)))) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: data offsets", path);
    }
    for (size_t j = 0; rc == 0 && j < n; j++) {
        ck->offsets[r][j] = e[j].offset;
    }
    return rc;
}

/*
 * Shard r through its summary (ckpt_summary.c): one attribute read, the
 * links listed, the file closed again; its rows are then read with pread.
 * 1: the shard has no summary (or the index records no checksums to compare
 * it with), for the full check.
 */
static int ck_try_summary(struct fsdp_ckpt *ck, const char *path, int r)
{
    char why[256];
    struct stat st;
    const size_t n = (size_t)ck->kinds.n * ck->spec->n_params;
    if (!ck->all_summed || stat(path, &st) != 0) {
        return 1;
    }
    hid_t fapl = ck_h5_fapl_small();
    hid_t f = fapl < 0 || H5Fis_hdf5(path) <= 0 ? -1 : H5Fopen(path, H5F_ACC_RDONLY, fapl);
    fsdp_h5_close(fapl);
    if (f < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open shard (truncated or damaged?): %s", path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    const struct ck_shard_id id = {ck->meta.step, r, ck->meta.n_shards};
    struct ck_entry *e = calloc(n, sizeof(*e));
    int rc = e ? ck_summary_load(path, f, &id, ck->spec, ck->kinds.n, (uint64_t)st.st_size, e)
               : fsdp_err(FSDP_ERR_NOMEM, "%s: shard summary", path);
    if (rc == 0) {
        rc = ck_check_by_summary(ck, path, f, r, e);
    }
    ck_entries_free(e, n);
    H5Fclose(f);
    H5Eclear2(H5E_DEFAULT);
    if (rc == 0) {
        ck->how[r] = CK_BY_SUMMARY;
    }
    return rc;
}

/* Shard r: present, readable, of this checkpoint and step, every tensor
 * with the rows the split rule gives and the checksums the index records. */
static int ck_check_shard(struct fsdp_ckpt *ck, int r)
{
    char path[CK_PATH_MAX], why[256];
    long long x;
    FSDP_CHECK(ck_shard_present(ck, r, path, sizeof(path)));
    FSDP_CHECK(fsdp_h5_check_regular(path));
    int rc = ck_try_summary(ck, path, r);
    if (rc != 1) {
        return rc;
    }
    FSDP_CHECK(fsdp_h5_check_heaps(path));
    if (H5Fis_hdf5(path) <= 0 || (ck->shards[r] = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT)) < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open shard (truncated or damaged?): %s", path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    hid_t f = ck->shards[r];
    FSDP_CHECK(ck_expect_format(path, f, "format", FSDP_CKPT_SHARD_FORMAT));
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "format_version", &x));
    if (x != FSDP_CKPT_VERSION) {
        return fsdp_err(FSDP_ERR_UNSUPPORTED, "%s: format_version %lld; expected %d", path, x,
                        FSDP_CKPT_VERSION);
    }
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "step", &x));
    if (x != ck->meta.step) {
        return fsdp_err(FSDP_ERR_FORMAT,
                        "%s: shard is from step %lld but the index is step %ld "
                        "(shards from different checkpoints)",
                        path, x, ck->meta.step);
    }
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "shard", &x));
    long long ns;
    FSDP_CHECK(fsdp_h5_attr_int(path, f, "n_shards", &ns));
    if (x != r || ns != ck->meta.n_shards) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: shard %lld of %lld, expected %d of %d", path, x, ns,
                        r, ck->meta.n_shards);
    }
    for (int k = 0; k < ck->kinds.n; k++) {
        for (size_t i = 0; i < ck->spec->n_params; i++) {
            FSDP_CHECK(ck_check_shard_tensor(ck, path, f, r, k, i));
        }
    }
    ck->how[r] = CK_BY_H5;
    return 0;
}

/*
 * Every dataset of index.h5 is a virtual dataset over exactly the rows of
 * the shards just checked: this reader takes rows from the shards, but
 * HDF5 tools and --model index.h5 read through the index, and both must see
 * the same tensors, never another file's bytes nor fill values.
 */
static int ck_check_index(struct fsdp_ckpt *ck, const char *index, hid_t f)
{
    char name[256];
    /* the mappings were checked with the checksums; the sources of shards
     * checked through their summaries are known (the links point to the
     * datasets their writer wrote), and lazy shards are checked when read */
    int by_h5 = 0;
    for (int r = 0; !ck->lazy && r < ck->meta.n_shards; r++) {
        by_h5 |= ck->how[r] == CK_BY_H5;
    }
    if (!by_h5) {
        return 0;
    }
    for (int k = 0; k < ck->kinds.n; k++) {
        for (size_t i = 0; i < ck->spec->n_params; i++) {
            const struct fsdp_param_spec *p = &ck->spec->params[i];
            hid_t d;
            snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[k], p->name);
            FSDP_CHECK(fsdp_h5_open_dataset(index, f, name, H5P_DEFAULT, &d));
            int rc = fsdp_h5_check_shard_vds(index, name, d, p->ndim, p->shape[0], p->shape[1],
                                             ck->meta.n_shards, ck->shards);
            H5Dclose(d);
            FSDP_CHECK(rc);
        }
    }
    return 0;
}

/* Shard r checked and open (a lazy handle checks it at its first read). */
static int ck_shard_ready(struct fsdp_ckpt *ck, int r)
{
    if (ck->how[r] != CK_UNCHECKED) {
        return 0;
    }
    FSDP_DEBUG(FSDP_SUB_IO, "%s: shard %d of %d checked at its first read", ck->dir, r,
               ck->meta.n_shards);
    int rc = ck_check_shard(ck, r);
    if (rc < 0) { /* a shard that failed is never taken as checked */
        fsdp_h5_close(ck->shards[r]);
        ck->shards[r] = -1;
        free(ck->offsets[r]);
        ck->offsets[r] = NULL;
        ck->how[r] = CK_UNCHECKED;
    }
    return rc;
}

static int ck_open(const char *path, const struct fsdp_arch_set *archs, int lazy,
                   struct fsdp_ckpt **out)
{
    char index[CK_PATH_MAX + 16];
    int rc;
    fsdp_h5_quiet();
    struct fsdp_ckpt *ck = calloc(1, sizeof(*ck));
    if (!ck) {
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint handle");
    }
    ck->fd = ck->fd_shard = ck->dfd = -1;
    ck->direct = CK_SUM_HOST && ck_direct_wanted();
    FSDP_CHECK_GOTO(ck_resolve(path, ck->dir, sizeof(ck->dir)), rc, err);
    snprintf(index, sizeof(index), "%s/%s", ck->dir, FSDP_CKPT_INDEX);
    if (access(index, R_OK) != 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", index, strerror(errno));
        goto err;
    }
    FSDP_CHECK_GOTO(fsdp_model_file_read_spec(index, archs, &ck->spec), rc, err);
    hid_t f = H5Fopen(index, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        char why[256];
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open HDF5 file: %s", index,
                      fsdp_h5_reason(why, sizeof(why)));
        goto err;
    }
    rc = ck_read_meta(index, f, archs, &ck->meta);
    if (rc == 0) {
        rc = ck_read_kinds(index, f, &ck->kinds);
    }
    if (rc == 0) {
        rc = ck_read_sums(ck, index, f);
    }
    const size_t R = (size_t)ck->meta.n_shards;
    if (rc == 0 && (!(ck->shards = malloc(R * sizeof(*ck->shards))) || !(ck->how = calloc(R, 1)) ||
                    !(ck->offsets = calloc(R, sizeof(uint64_t *))))) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "checkpoint shard table");
    }
    ck->all_summed = 1;
    for (size_t j = 0; rc == 0 && j < (size_t)ck->kinds.n * ck->spec->n_params; j++) {
        ck->all_summed &= ck->sums[j].block_rows > 0;
    }
    for (int r = 0; rc == 0 && r < ck->meta.n_shards; r++) {
        ck->shards[r] = -1;
    }
    ck->lazy = lazy;
    for (int r = 0; rc == 0 && lazy && r < ck->meta.n_shards; r++) {
        char shard[CK_PATH_MAX]; /* lazy: only there; the rest at its first read */
        rc = ck_shard_present(ck, r, shard, sizeof(shard));
    }
    for (int r = 0; rc == 0 && !lazy && r < ck->meta.n_shards; r++) {
        rc = ck_check_shard(ck, r);
    }
    if (rc == 0) { /* lazy: the mapping alone; each source at its shard's first read */
        rc = ck_check_index(ck, index, f);
    }
    H5Fclose(f);
    if (rc < 0) {
        goto err;
    }
    *out = ck;
    return 0;
err:
    fsdp_ckpt_close(ck);
    return rc;
}

int fsdp_ckpt_open(const char *path, const struct fsdp_arch_set *archs, struct fsdp_ckpt **out)
{
    return ck_open(path, archs, 0, out);
}

int fsdp_ckpt_open_lazy(const char *path, const struct fsdp_arch_set *archs, struct fsdp_ckpt **out)
{
    return ck_open(path, archs, 1, out);
}

int fsdp_ckpt_read_meta(const char *path, const struct fsdp_arch_set *archs,
                        struct fsdp_ckpt_meta *meta)
{
    char dir[CK_PATH_MAX], index[CK_PATH_MAX + 16], why[256];
    fsdp_h5_quiet();
    FSDP_CHECK(ck_resolve(path, dir, sizeof(dir)));
    snprintf(index, sizeof(index), "%s/%s", dir, FSDP_CKPT_INDEX);
    if (access(index, R_OK) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", index, strerror(errno));
    }
    FSDP_CHECK(fsdp_h5_check_regular(index));
    FSDP_CHECK(fsdp_h5_check_heaps(index));
    hid_t f = H5Fis_hdf5(index) > 0 ? H5Fopen(index, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    if (f < 0) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: cannot open HDF5 file: %s", index,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    int rc = ck_read_meta(index, f, archs, meta);
    H5Fclose(f);
    return rc;
}

void fsdp_ckpt_close(struct fsdp_ckpt *ck)
{
    if (!ck) {
        return;
    }
    for (int r = 0; ck->shards && r < ck->meta.n_shards; r++) {
        fsdp_h5_close(ck->shards[r]);
    }
    for (int r = 0; ck->offsets && r < ck->meta.n_shards; r++) {
        free(ck->offsets[r]);
    }
    ck_ahead_destroy(ck->ahead); /* its reads in flight done before the descriptors go */
    if (ck->fd >= 0) {
        close(ck->fd);
    }
    if (ck->dfd >= 0) {
        close(ck->dfd);
    }
    free(ck->offsets);
    free(ck->how);
    free(ck->shards);
    for (size_t j = 0; ck->sums && j < (size_t)ck->kinds.n * ck->spec->n_params; j++) {
        fsdp_sum_clear(&ck->sums[j]);
    }
    free(ck->sums);
    fsdp_sum_buf_free(&ck->buf);
    fsdp_model_spec_destroy(ck->spec);
    free(ck);
}

/* The descriptor of summarized shard r (path) for pread: one shard file is
 * open at a time, read front to back. */
static int ck_shard_fd(struct fsdp_ckpt *ck, int r, const char *path, int *fd)
{
    if (ck->fd_shard != r) {
        ck_ahead_use(ck->ahead, -1, -1);
        if (ck->fd >= 0) {
            close(ck->fd);
        }
        ck->fd_shard = -1;
        struct stat st;
        /* checked regular at open; O_NONBLOCK: a FIFO put there since does not block */
        if ((ck->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)) < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        }
        if (fstat(ck->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(ck->fd);
            ck->fd = -1;
            return fsdp_err(FSDP_ERR_IO, "%s: no longer a regular file", path);
        }
        ck->fd_shard = r;
        (void)posix_fadvise(ck->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
        if (ck->dfd >= 0) {
            close(ck->dfd);
        }
        ck->dfd = -1;
        ck->dfd_tried = 0;
    }
    *fd = ck->fd;
    return 0;
}

/* The O_DIRECT descriptor of the open shard (path) for a piece of `bytes`:
 * past the page cache (ckpt_direct.c says why) for pieces as large as the
 * writer writes that way, opened at the first; -1 for small pieces, whose
 * every read would wait for the disk, and where the file system refuses. */
static int ck_shard_dfd(struct fsdp_ckpt *ck, const char *path, uint64_t bytes)
{
    if (bytes < CK_DIRECT_MIN || !ck->direct) {
        return -1;
    }
    if (!ck->dfd_tried) {
        ck->dfd_tried = 1;
        ck->dfd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_DIRECT);
    }
    return ck->dfd;
}

/* Tensor rows [lo, lo + n) from shard r (which holds them) through the
 * checksums, into dst. */
static int ck_read_checked(struct fsdp_ckpt *ck, int kind, size_t idx, int r, size_t lo, size_t n,
                           float *dst)
{
    const struct fsdp_param_spec *p = &ck->spec->params[idx];
    const struct fsdp_sum *sum = &ck->sums[kind * ck->spec->n_params + idx];
    char path[CK_PATH_MAX + 32], name[256], why[256];
    size_t s0, sn;
    enum fsdp_h5_float fk;
    fsdp_ckpt_rows(p->shape[0], ck->meta.n_shards, r, &s0, &sn);
    ck_shard_path(path, sizeof(path), ck->dir, r);
    snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[kind], p->name);
    FSDP_CHECK(ck_shard_ready(ck, r));
    struct fsdp_sum_src src = {
        .file = path,
        .tensor = name,
        .hint = "the shard file is damaged",
        .dset = -1,
        .ftype = H5T_NATIVE_FLOAT,
        .kind = FSDP_H5_F32,
        .ndim = p->ndim,
        .cols = p->shape[1],
        .row_off = 0,
        .show_row0 = s0,
        .rows = sn,
        .block_rows = sum->block_rows,
        .h = sum->h + ck_sum_first(p, ck->meta.n_shards, r, sum->block_rows),
    };
    if (ck->how[r] == CK_BY_SUMMARY) { /* its bytes where the summary says, as they are */
        struct fsdp_sum_raw raw = {.offset = ck->offsets[r][kind * ck->spec->n_params + idx],
                                   .bytes = (uint64_t)sn * p->shape[1] * sizeof(float),
                                   .align = CK_ALIGN,
                                   .scratch_len = 0};
        FSDP_CHECK(ck_shard_fd(ck, r, path, &raw.fd));
        if (!ck->ahead) {
            FSDP_CHECK(ck_ahead_create(&ck->ahead));
        }
        raw.dfd = ck_shard_dfd(ck, path, raw.bytes);
        ck_ahead_use(ck->ahead, raw.fd, ck->dfd);
        if (raw.bytes >= CK_DIRECT_MIN) { /* the whole blocks it reads: read ahead */
            const size_t B = sum->block_rows, rb = p->shape[1] * sizeof(float);
            size_t b0 = (lo - s0) / B * B, b1 = (lo - s0 + n + B - 1) / B * B;
            b1 = b1 < sn ? b1 : sn;
            ck_ahead_want(ck->ahead, raw.offset + (uint64_t)b0 * rb, (uint64_t)(b1 - b0) * rb);
        }
        raw.read = ck_ahead_read;
        raw.ctx = ck->ahead;
        src.raw = &raw;
        return fsdp_sum_read(&src, lo - s0, n, 0, p->shape[1], dst, &ck->buf);
    }
    hid_t d = H5Dopen2(ck->shards[r], name, H5P_DEFAULT);
    hid_t t = d < 0 ? -1 : H5Dget_type(d);
    int rc = 0;
    if (t < 0 || fsdp_h5_classify_float(t, &fk, why, sizeof(why)) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: reading /%s failed: %s", path, name,
                      t < 0 ? fsdp_h5_reason(why, sizeof(why)) : why);
    } else {
        src.dset = d;
        src.ftype = t;
        src.kind = fk;
        rc = fsdp_sum_read(&src, lo - s0, n, 0, p->shape[1], dst, &ck->buf);
    }
    fsdp_h5_close(t);
    fsdp_h5_close(d);
    return rc;
}

int fsdp_ckpt_read_rows(struct fsdp_ckpt *ck, int kind, size_t idx, size_t row0, size_t nrows,
                        float *dst)
{
    if (kind < 0 || kind >= ck->kinds.n) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: tensor kind %d (the checkpoint keeps %d)", ck->dir,
                        kind, ck->kinds.n);
    }
    const struct fsdp_param_spec *p = &ck->spec->params[idx];
    const struct fsdp_sum *sum = &ck->sums[kind * ck->spec->n_params + idx];
    const size_t cols = p->shape[1];
    char name[256], why[256];
    if (row0 + nrows > p->shape[0]) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: rows [%zu, %zu) of %s are out of range", ck->dir,
                        row0, row0 + nrows, p->name);
    }
    snprintf(name, sizeof(name), "%s/%s", ck->kinds.group[kind], p->name);
    for (int r = 0; r < ck->meta.n_shards && nrows > 0; r++) {
        size_t s0, sn;
        fsdp_ckpt_rows(p->shape[0], ck->meta.n_shards, r, &s0, &sn);
        size_t lo = row0 > s0 ? row0 : s0, hi = row0 + nrows < s0 + sn ? row0 + nrows : s0 + sn;
        if (lo >= hi) {
            continue;
        }
        if (sum->block_rows > 0) {
            FSDP_CHECK(ck_read_checked(ck, kind, idx, r, lo, hi - lo, dst + (lo - row0) * cols));
            continue;
        }
        hsize_t start[2] = {lo - s0, 0}, count[2] = {hi - lo, cols};
        int nd = p->ndim;
        FSDP_CHECK(ck_shard_ready(ck, r));
        hid_t d = H5Dopen2(ck->shards[r], name, H5P_DEFAULT);
        hid_t fs = d < 0 ? -1 : H5Dget_space(d);
        hid_t ms = H5Screate_simple(nd, count, NULL);
        int bad = fs < 0 || ms < 0 ||
                  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
                  H5Dread(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, dst + (lo - row0) * cols) < 0;
        fsdp_h5_close(ms);
        fsdp_h5_close(fs);
        fsdp_h5_close(d);
        if (bad) {
            return fsdp_err(FSDP_ERR_IO, "%s/shard_%d.h5: reading /%s failed: %s", ck->dir, r, name,
                            fsdp_h5_reason(why, sizeof(why)));
        }
    }
    return 0;
}

size_t fsdp_ckpt_checksum_blocks(const struct fsdp_ckpt *ck, int kind, size_t idx)
{
    if (kind < 0 || kind >= ck->kinds.n || idx >= ck->spec->n_params) {
        return 0;
    }
    const struct fsdp_sum *s = &ck->sums[kind * ck->spec->n_params + idx];
    return s->block_rows > 0 ? s->n : 0;
}
