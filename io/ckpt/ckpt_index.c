/*
 * ckpt_index.c - a checkpoint's index.h5 (see ckpt.h; layout in
 * doc/formats.md, "index.h5"): the model-file and run-state attributes with
 * their checksums (ckpt_attrs.h), and one virtual dataset per tensor over
 * the shard files' rows. Written after every shard is committed, it records
 * every shard's checksums per tensor, read back from the shard files, so
 * that opening compares each shard's with the index's.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "io/ckpt/ckpt_attrs.h"
#include "io/util/fileutil.h"
#include "io/h5/h5util.h"
#include "io/h5/model_file.h"
#include "core/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// index

/* what rng_state records: the loop draws no random numbers */
#define CK_RNG_STATE "none (the loop draws no random numbers)"

static int ck_write_meta(hid_t f, const struct fsdp_ckpt_meta *m)
{
    return fsdp_h5_put_attr_str(f, "checkpoint_format", FSDP_CKPT_FORMAT) < 0 ||
                   fsdp_h5_put_attr_int(f, "checkpoint_version", FSDP_CKPT_VERSION) < 0 ||
                   fsdp_h5_put_attr_i64(f, "step", m->step) < 0 ||
                   fsdp_h5_put_attr_double(f, "tokens_seen", m->tokens_seen) < 0 ||
                   fsdp_h5_put_attr_int(f, "world_size", m->world_size) < 0 ||
                   fsdp_h5_put_attr_int(f, "n_shards", m->n_shards) < 0 ||
                   fsdp_h5_put_attr_str(f, "mesh", m->mesh) < 0 ||
                   fsdp_h5_put_attr_str(f, "backends", m->backends) < 0 ||
                   fsdp_h5_put_attr_str(f, "config", m->config) < 0 ||
                   fsdp_h5_put_attr_i64(f, "data_position", (long long)m->data_position) < 0 ||
                   fsdp_h5_put_attr_i64(f, "data_epoch", (long long)m->data_epoch) < 0 ||
                   fsdp_h5_put_attr_i64(f, "data_n_tokens", (long long)m->data_n_tokens) < 0 ||
                   fsdp_h5_put_attr_i64(f, "seed", m->seed) < 0 ||
                   fsdp_h5_put_attr_str(f, "rng_state", CK_RNG_STATE) < 0 ||
                   fsdp_h5_put_attr_i64(f, "adam_step", m->adam_step) < 0 ||
                   fsdp_h5_put_attr_double(f, "loss_scale", m->loss_scale) < 0 ||
                   fsdp_h5_put_attr_i64(f, "loss_scale_good_steps", m->scale_good_steps) < 0 ||
                   fsdp_h5_put_attr_i64(f, "skipped_steps", m->skipped_steps) < 0
               ? -1
               : 0;
}

/* Shard r's checksums of every tensor from its summary, appended to sums;
 * 1 when it has none. */
static int ck_gather_summary(const char *path, hid_t f, const struct fsdp_model_spec *spec,
                             const struct fsdp_ckpt_kinds *kinds, int n_shards, int r,
                             struct fsdp_sum *sums)
{
    const size_t n = (size_t)kinds->n * spec->n_params;
    struct stat st;
    if (stat(path, &st) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    struct ck_entry *e = calloc(n, sizeof(*e));
    if (!e) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: shard summary", path);
    }
    long long step = 0;
    int rc = fsdp_h5_attr_int(path, f, "step", &step);
    const struct ck_shard_id id = {(long)step, r, n_shards};
    rc = rc < 0 ? rc : ck_summary_load(path, f, &id, spec, kinds->n, (uint64_t)st.st_size, e);
    for (size_t j = 0; rc == 0 && j < n; j++) {
        if (e[j].sum.block_rows != sums[j].block_rows) {
            rc = fsdp_err(FSDP_ERR_FORMAT,
                          "%s: /%s/%s has checksums over blocks of %zu rows, not "
                          "the %zu of its tensor",
                          path, kinds->group[j / spec->n_params],
                          spec->params[j % spec->n_params].name, e[j].sum.block_rows,
                          sums[j].block_rows);
            break;
        }
        memcpy(sums[j].h + sums[j].n, e[j].sum.h, e[j].sum.n * sizeof(uint64_t));
        sums[j].n += e[j].sum.n;
    }
    ck_entries_free(e, n);
    return rc;
}

/* Shard r's checksums of every tensor appended to sums (kinds->n * n_params,),
 * each preallocated for all shards. */
static int ck_gather_shard(const char *dir, const struct fsdp_model_spec *spec,
                           const struct fsdp_ckpt_kinds *kinds, int n_shards, int r,
                           struct fsdp_sum *sums)
{
    char path[CK_PATH_MAX], name[256], why[256];
    if (ck_shard_path(path, sizeof(path), dir, r) < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: checkpoint directory path too long", dir);
    }
    FSDP_CHECK(fsdp_h5_check_regular(path));
    hid_t fapl = ck_h5_fapl_small();
    hid_t f = fapl < 0 ? -1 : H5Fopen(path, H5F_ACC_RDONLY, fapl);
    fsdp_h5_close(fapl);
    if (f < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open to record its checksums: %s", path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    int rc = ck_gather_summary(path, f, spec, kinds, n_shards, r, sums);
    if (rc != 1) {
        H5Fclose(f);
        return rc;
    }
    rc = 0; /* no summary: each dataset's checksum attributes */
    for (size_t j = 0; rc == 0 && j < (size_t)kinds->n * spec->n_params; j++) {
        const struct fsdp_param_spec *p = &spec->params[j % spec->n_params];
        struct fsdp_sum *all = &sums[j], one;
        size_t row0, rows;
        hid_t d;
        fsdp_ckpt_rows(p->shape[0], n_shards, r, &row0, &rows);
        snprintf(name, sizeof(name), "%s/%s", kinds->group[j / spec->n_params], p->name);
        if ((rc = fsdp_h5_open_dataset(path, f, name, H5P_DEFAULT, &d)) < 0) {
            break;
        }
        rc = fsdp_sum_get(path, name, d, &rows, 1, &one);
        H5Dclose(d);
        if (rc == 0 && one.block_rows == 0) {
            rc = fsdp_err(FSDP_ERR_FORMAT,
                          "%s: /%s has no checksums, which index.h5 records for "
                          "every shard (it is written once every shard is complete)",
                          path, name);
        } else if (rc == 0 && one.block_rows != all->block_rows) {
            rc = fsdp_err(FSDP_ERR_FORMAT,
                          "%s: /%s has checksums over blocks of %zu rows, not "
                          "the %zu of its tensor",
                          path, name, one.block_rows, all->block_rows);
        }
        if (rc == 0) {
            memcpy(all->h + all->n, one.h, one.n * sizeof(uint64_t));
            all->n += one.n;
        }
        fsdp_sum_clear(&one);
    }
    H5Fclose(f);
    return rc;
}

/* Every shard's checksums of every tensor, shards in order: what the index
 * records (sums: (kinds->n * n_params,), freed by the caller). */
static int ck_gather_sums(const char *dir, const struct fsdp_model_spec *spec,
                          const struct fsdp_ckpt_kinds *kinds, int n_shards, struct fsdp_sum *sums)
{
    for (size_t j = 0; j < (size_t)kinds->n * spec->n_params; j++) {
        const struct fsdp_param_spec *p = &spec->params[j % spec->n_params];
        sums[j].block_rows = ck_block_rows(p);
        size_t n = ck_sum_first(p, n_shards, n_shards, sums[j].block_rows);
        if (!(sums[j].h = malloc(n * sizeof(uint64_t)))) {
            return fsdp_err(FSDP_ERR_NOMEM, "%s: %zu checksums of %s", dir, n, p->name);
        }
    }
    for (int r = 0; r < n_shards; r++) {
        FSDP_CHECK(ck_gather_shard(dir, spec, kinds, n_shards, r, sums));
    }
    return 0;
}

/* One virtual dataset, <group>/<name>: the full tensor, row block r from
 * ./shard_<r>.h5, with every shard's checksums. */
static int ck_write_vds(hid_t f, const struct fsdp_param_spec *p, const char *group, int n_shards,
                        const struct fsdp_sum *sum)
{
    char name[256], src[64];
    hsize_t dims[2], start[2] = {0, 0}, count[2];
    int ndim = ck_dims(p, p->shape[0], dims);
    int rc = 0;
    snprintf(name, sizeof(name), "%s/%s", group, p->name);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t vspace = H5Screate_simple(ndim, dims, NULL);
    float fill = 0.0f;
    if (dcpl < 0 || vspace < 0 || H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &fill) < 0) {
        rc = -1;
    }
    for (int r = 0; rc == 0 && r < n_shards; r++) {
        size_t row0, rows;
        fsdp_ckpt_rows(p->shape[0], n_shards, r, &row0, &rows);
        if (rows == 0) {
            continue;
        }
        start[0] = row0;
        ck_dims(p, rows, count);
        snprintf(src, sizeof(src), "./shard_%d.h5", r);
        hid_t sspace = H5Screate_simple(ndim, count, NULL);
        if (sspace < 0 ||
            H5Sselect_hyperslab(vspace, H5S_SELECT_SET, start, NULL, count, NULL) < 0 ||
            H5Pset_virtual(dcpl, vspace, src, name, sspace) < 0) {
            rc = -1;
        }
        fsdp_h5_close(sspace);
    }
    hid_t d = -1;
    if (rc == 0 && H5Sselect_all(vspace) >= 0) {
        d = H5Dcreate2(f, name, H5T_IEEE_F32LE, vspace, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    }
    rc = d < 0 || fsdp_sum_put(d, sum) < 0 ? -1 : 0;
    fsdp_h5_close(d);
    fsdp_h5_close(vspace);
    fsdp_h5_close(dcpl);
    return rc;
}

int fsdp_ckpt_index_write(const char *dir, const struct fsdp_model_spec *spec,
                          const struct fsdp_ckpt_kinds *kinds, const struct fsdp_ckpt_meta *meta)
{
    char path[CK_PATH_MAX], why[256];
    snprintf(path, sizeof(path), "%s/%s", dir, FSDP_CKPT_INDEX);
    fsdp_h5_quiet();
    size_t n = (size_t)kinds->n * spec->n_params;
    hid_t f = -1;
    struct fsdp_sum *sums = calloc(n, sizeof(*sums));
    int rc = sums ? ck_gather_sums(dir, spec, kinds, meta->n_shards, sums)
                  : fsdp_err(FSDP_ERR_NOMEM, "%s: checksum table", path);
    /* per dataset and shard: a mapping and a hash; one hash more per 1 MiB of tensor */
    size_t maps = n * (size_t)meta->n_shards * (256 + sizeof(uint64_t));
    size_t hashes = spec->total_numel * (size_t)kinds->n * sizeof(float) / 65536;
    if (rc == 0) {
        rc = ck_h5_create(path, ck_file_bound(n, maps + hashes), CK_H5_V18, &f);
    }
    int bad = rc < 0 || fsdp_h5_put_model_attrs(f, spec, meta->created_by) < 0 ||
              ck_write_meta(f, meta) < 0 || ck_make_groups(f, kinds) < 0;
    if (!bad && (rc = fsdp_ckpt_attrs_sum_put(path, f, spec->arch)) < 0) {
        bad = 1;
    }
    for (int k = 0; !bad && k < kinds->n; k++) {
        for (size_t i = 0; !bad && i < spec->n_params; i++) {
            bad = ck_write_vds(f, &spec->params[i], kinds->group[k], meta->n_shards,
                               &sums[k * spec->n_params + i]) < 0;
        }
    }
    for (size_t j = 0; sums && j < n; j++) {
        fsdp_sum_clear(&sums[j]);
    }
    free(sums);
    if (rc < 0) {
        if (f >= 0) {
            H5Fclose(f);
            unlink(path);
        }
        return rc;
    }
    if (f >= 0 && H5Fclose(f) < 0) {
        bad = 1;
    }
    if (bad) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: writing the checkpoint index failed: %s", path,
                      fsdp_h5_reason(why, sizeof(why)));
        unlink(path);
        return rc;
    }
    return fsdp_file_fsync(path);
}
