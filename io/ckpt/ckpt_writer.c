/*
 * ckpt_writer.c - a checkpoint's shard files (see ckpt.h; layout in
 * doc/formats.md): the group each tensor kind lives in, the creation of the
 * checkpoint's HDF5 files with their space reserved, and the shard writer.
 * Every shard dataset carries the block hashes of the rows its writer wrote
 * (checksum.h). Owns no directory commit (ckpt_commit.c): callers decide
 * where files go and when a directory becomes visible.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "io/util/fileutil.h"
#include "io/h5/h5util.h"
#include "core/error.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// kinds

/* A state name that is also a plain HDF5 link name and a word in messages. */
static int ck_state_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= FSDP_CKPT_STATE_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (!isalnum((unsigned char)s[i]) && s[i] != '_') {
            return 0;
        }
    }
    return 1;
}

int fsdp_ckpt_kinds_init(struct fsdp_ckpt_kinds *k, int n_state, const char *const *state)
{
    memset(k, 0, sizeof(*k));
    if (n_state < 0 || n_state > FSDP_CKPT_MAX_STATE) {
        return fsdp_err(FSDP_ERR_INVALID,
                        "checkpoint: %d optimizer state tensors per parameter (at most %d)",
                        n_state, FSDP_CKPT_MAX_STATE);
    }
    snprintf(k->group[0], sizeof(k->group[0]), "model");
    k->n = 1;
    for (int i = 0; i < n_state; i++) {
        char shown[FSDP_CKPT_STATE_MAX + 4];
        int ok = ck_state_name_ok(state[i]);
        if (!ok || fsdp_ckpt_kind_of(k, state[i]) >= 0) {
            return fsdp_err(FSDP_ERR_INVALID, "checkpoint: optimizer state '%s' is %s",
                            fsdp_str_printable(shown, sizeof(shown), state[i], 0),
                            ok ? "named twice"
                               : "not a name (letters, digits and '_', fewer than 32)");
        }
        snprintf(k->group[k->n++], sizeof(k->group[0]), "optim/%s", state[i]);
    }
    return 0;
}

const char *fsdp_ckpt_kind_group(const struct fsdp_ckpt_kinds *k, int kind)
{
    return kind >= 0 && kind < k->n ? k->group[kind] : "?";
}

int fsdp_ckpt_kind_of(const struct fsdp_ckpt_kinds *k, const char *state)
{
    for (int i = 1; i < k->n; i++) {
        if (strcmp(k->group[i] + sizeof("optim/") - 1, state) == 0) {
            return i;
        }
    }
    return -1;
}

// ----------------------------------------------------------------------------
// files

/*
 * Reserves bytes for path before HDF5 writes into it: a full disk or a
 * file-size limit then fails here, with the OS's reason, instead of in the
 * middle of HDF5's own writes (where it reports poorly and may leave its
 * state inconsistent). HDF5 truncates the file to what it used on close.
 */
static int ck_reserve(const char *path, size_t bytes)
{
    int fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    }
    int e = posix_fallocate(fd, 0, (off_t)bytes);
    close(fd);
    if (e != 0 && e != EOPNOTSUPP && e != EINVAL) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot reserve %zu bytes: %s", path, bytes, strerror(e));
    }
    return 0;
}

/*
 * Creates a new HDF5 file at path, reserves `reserve` bytes for it and
 * reopens it for writing: HDF5 then sees the reserved size as the file's end
 * and trims the file to what it used when it is closed. No sieve buffer, so
 * a failed write fails in H5Dwrite, where it is reported. The create is
 * exclusive (the probe gives the OS's reason, H5F_ACC_EXCL the guarantee):
 * an entry already at path, a planted link included, fails it rather than
 * being truncated or written through. CK_H5_V18: objects in the HDF5 1.8
 * format at least, whose attributes may exceed 64 KiB (an index's checksums
 * of thousands of shards, a shard's summary). CK_H5_ALIGN: large datasets
 * aligned for O_DIRECT (ckpt_direct.c).
 */
int ck_h5_create(const char *path, size_t reserve, unsigned flags, hid_t *out)
{
    char why[256];
    int rc = 0;
    FSDP_CHECK(fsdp_file_probe_create(path));
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_sieve_buf_size(fapl, 0) < 0 ||
        ((flags & CK_H5_V18) &&
         H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST) < 0) ||
        ((flags & CK_H5_ALIGN) && H5Pset_alignment(fapl, CK_DIRECT_MIN, CK_ALIGN) < 0)) {
        fsdp_h5_close(fapl);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: file access properties", path);
    }
    /* no times in the object headers (the newer format keeps them): the same
     * state makes the same bytes whenever it is written */
    hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
    hid_t f = fcpl >= 0 && H5Pset_obj_track_times(fcpl, 0) >= 0
                  ? H5Fcreate(path, H5F_ACC_EXCL, fcpl, fapl)
                  : H5I_INVALID_HID;
    fsdp_h5_close(fcpl);
    if (f < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", path, fsdp_h5_reason(why, sizeof(why)));
        H5Pclose(fapl);
        return rc; /* whatever is at path is not ours to remove */
    }
    if (H5Fclose(f) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", path, fsdp_h5_reason(why, sizeof(why)));
    }
    if (rc == 0) {
        rc = ck_reserve(path, reserve);
    }
    if (rc == 0 && (*out = H5Fopen(path, H5F_ACC_RDWR, fapl)) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot open for writing: %s", path,
                      fsdp_h5_reason(why, sizeof(why)));
    }
    H5Pclose(fapl);
    if (rc < 0) {
        unlink(path);
    }
    return rc;
}

int ck_make_groups(hid_t f, const struct fsdp_ckpt_kinds *k)
{
    hid_t gcpl = H5Pcreate(H5P_GROUP_CREATE); /* no times: see ck_h5_create */
    int rc = gcpl >= 0 && H5Pset_obj_track_times(gcpl, 0) >= 0 ? 0 : -1;
    for (int i = 0; i <= k->n && rc == 0; i++) {
        /* model, optim, then optim/<state> for each state */
        const char *g = i == 0 ? k->group[0] : i == 1 ? "optim" : k->group[i - 1];
        hid_t id = H5Gcreate2(f, g, H5P_DEFAULT, gcpl, H5P_DEFAULT);
        if (id < 0) {
            rc = -1;
            break;
        }
        H5Gclose(id);
    }
    fsdp_h5_close(gcpl);
    return rc;
}

// ----------------------------------------------------------------------------
// shard writer

struct fsdp_ckpt_shard_writer {
    char path[CK_PATH_MAX];
    const struct fsdp_model_spec *spec;
    struct fsdp_ckpt_kinds kinds;
    int shard, n_shards;
    long step;
    hid_t file;
    unsigned char *written; /* (kinds.n * n_params,) */
    struct ck_entry *entries; /* (kinds.n * n_params,) the summary, as tensors are written */
    struct ck_direct direct;  /* large datasets' bytes (buf NULL: none, HDF5 writes them) */
    int created;            /* path is ours: remove it unless committed */
    int committed;
};

int fsdp_ckpt_shard_create(const char *dir, int shard, int n_shards, long step,
                           const struct fsdp_model_spec *spec, const struct fsdp_ckpt_kinds *kinds,
                           struct fsdp_ckpt_shard_writer **out)
{
    char why[256];
    int rc;
    fsdp_h5_quiet();
    struct fsdp_ckpt_shard_writer *w = calloc(1, sizeof(*w));
    if (!w || !(w->written = calloc((size_t)kinds->n * spec->n_params, 1)) ||
        !(w->entries = calloc((size_t)kinds->n * spec->n_params, sizeof(*w->entries)))) {
        if (w) {
            free(w->written);
        }
        free(w);
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint shard writer");
    }
    if (ck_shard_path(w->path, sizeof(w->path), dir, shard) < 0) {
        free(w->entries);
        free(w->written);
        free(w);
        return fsdp_err(FSDP_ERR_INVALID, "%s: checkpoint directory path too long", dir);
    }
    w->spec = spec;
    w->kinds = *kinds;
    w->shard = shard;
    w->n_shards = n_shards;
    w->step = step;
    size_t data = 0;
    for (size_t i = 0; i < spec->n_params; i++) {
        size_t row0, rows;
        fsdp_ckpt_rows(spec->params[i].shape[0], n_shards, shard, &row0, &rows);
        data += (size_t)kinds->n * rows * spec->params[i].shape[1] * sizeof(float);
    }
    w->file = -1;
    w->direct.dfd = w->direct.bfd = -1;
    /* and a hash per 1 MiB of rows, twice (each dataset's and the summary's; the
     * bound gives each dataset one); HDF5 1.8 objects at least, for a summary
     * attribute over 64 KiB */
    const size_t n_dsets = (size_t)kinds->n * spec->n_params; /* each padded to CK_ALIGN, at most */
    FSDP_CHECK_GOTO(ck_h5_create(w->path,
                                 ck_file_bound(n_dsets, data + data / 65536) + n_dsets * CK_ALIGN,
                                 CK_H5_V18 | (CK_SUM_HOST ? CK_H5_ALIGN : 0), &w->file),
                    rc, err);
    w->created = 1;
    if (CK_SUM_HOST) {
        FSDP_CHECK_GOTO(ck_direct_open(w->path, &w->direct), rc, err);
    }
    if (fsdp_h5_put_attr_str(w->file, "format", FSDP_CKPT_SHARD_FORMAT) < 0 ||
        fsdp_h5_put_attr_int(w->file, "format_version", FSDP_CKPT_VERSION) < 0 ||
        fsdp_h5_put_attr_i64(w->file, "step", step) < 0 ||
        fsdp_h5_put_attr_int(w->file, "shard", shard) < 0 ||
        fsdp_h5_put_attr_int(w->file, "n_shards", n_shards) < 0 ||
        ck_make_groups(w->file, kinds) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", w->path,
                      fsdp_h5_reason(why, sizeof(why)));
        goto err;
    }
    *out = w;
    return 0;
err:
    fsdp_ckpt_shard_destroy(w);
    return rc;
}

/* Where dataset d's bytes and object lie (the summary's entry e). */
static int ck_locate(hid_t d, struct ck_entry *e)
{
    H5O_info_t oi;
    if (H5Oget_info2(d, &oi, H5O_INFO_BASIC) < 0) {
        return -1;
    }
    haddr_t off = e->bytes > 0 ? H5Dget_offset(d) : HADDR_UNDEF;
    if (e->bytes > 0 && off == HADDR_UNDEF) {
        return -1; /* written, so allocated: contiguous storage has an offset */
    }
    e->offset = off == HADDR_UNDEF ? UINT64_MAX : (uint64_t)off;
    e->addr = (uint64_t)oi.addr;
    return 0;
}

int fsdp_ckpt_shard_put(struct fsdp_ckpt_shard_writer *w, int kind, size_t idx, const float *data)
{
    const struct fsdp_param_spec *p = &w->spec->params[idx];
    char name[256], why[256];
    size_t row0, rows;
    hsize_t dims[2];
    if (kind < 0 || kind >= w->kinds.n) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: tensor kind %d of %s (the checkpoint keeps %d)",
                        w->path, kind, p->name, w->kinds.n);
    }
    struct ck_entry *e = &w->entries[kind * w->spec->n_params + idx];
    fsdp_ckpt_rows(p->shape[0], w->n_shards, w->shard, &row0, &rows);
    snprintf(name, sizeof(name), "%s/%s", w->kinds.group[kind], p->name);
    int nd = ck_dims(p, rows, dims);
    fsdp_sum_clear(&e->sum);
    *e = (struct ck_entry){.row0 = row0, .rows = rows, .cols = p->shape[1]};
    e->bytes = (uint64_t)rows * p->shape[1] * sizeof(float);
    const size_t row_bytes = p->shape[1] * sizeof(float);
    const int direct = w->direct.buf && e->bytes >= CK_DIRECT_MIN && row_bytes <= CK_DIRECT_ROW_MAX;
    hid_t space = H5Screate_simple(nd, dims, NULL);
    hid_t dcpl = fsdp_h5_dcpl_write_once();
    /* direct: allocated now, so that its offset is known before its bytes */
    if (direct && dcpl >= 0 && H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) < 0) {
        fsdp_h5_close(dcpl);
        dcpl = -1;
    }
    hid_t d = space < 0 || dcpl < 0 ? -1
                                    : H5Dcreate2(w->file, name, H5T_IEEE_F32LE, space, H5P_DEFAULT,
                                                 dcpl, H5P_DEFAULT);
    fsdp_h5_close(dcpl);
    fsdp_h5_close(space);
    haddr_t off = d >= 0 && direct ? H5Dget_offset(d) : HADDR_UNDEF;
    int rc;
    if (off != HADDR_UNDEF && off % CK_ALIGN == 0) {
        char what[CK_PATH_MAX + 300];
        snprintf(what, sizeof(what), "%s: /%s", w->path, name);
        rc = ck_direct_write(&w->direct, what, off, data, rows, row_bytes, ck_block_rows(p),
                             &e->sum);
        rc = rc < 0 ? rc : fsdp_sum_put(d, &e->sum);
    } else {
        rc = d < 0 ? -1
                   : fsdp_sum_write_keep(d, H5T_NATIVE_FLOAT, nd, rows, p->shape[1], sizeof(float),
                                         data, ck_block_rows(p), &e->sum);
    }
    int bad = rc == -1 || (rc == 0 && (fsdp_h5_put_attr_i64(d, "row0", (long long)row0) < 0 ||
                                       fsdp_h5_put_attr_i64(d, "rows", (long long)rows) < 0 ||
                                       ck_locate(d, e) < 0));
    fsdp_h5_close(d);
    if (rc < -1) {
        return rc;
    }
    if (bad) {
        return fsdp_err(FSDP_ERR_IO, "%s: writing /%s failed: %s", w->path, name,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    w->written[kind * w->spec->n_params + idx] = 1;
    return 0;
}

int fsdp_ckpt_shard_commit(struct fsdp_ckpt_shard_writer *w)
{
    char why[256];
    for (size_t i = 0; i < (size_t)w->kinds.n * w->spec->n_params; i++) {
        if (!w->written[i]) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: /%s/%s was never written", w->path,
                            w->kinds.group[i / w->spec->n_params],
                            w->spec->params[i % w->spec->n_params].name);
        }
    }
    /* every direct write made (the fsync below makes them stay), or its error */
    FSDP_CHECK(ck_direct_finish(&w->direct));
    ck_direct_close(&w->direct);
    const struct ck_shard_id id = {w->step, w->shard, w->n_shards};
    int sr =
        CK_SUM_HOST ? ck_summary_put(w->file, &id, w->kinds.n, w->spec->n_params, w->entries) : 0;
    if (sr < -1) {
        return sr;
    }
    if (sr < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: writing its summary failed: %s", w->path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    herr_t e = H5Fclose(w->file);
    w->file = -1;
    if (e < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: closing failed (disk full?): %s", w->path,
                        fsdp_h5_reason(why, sizeof(why)));
    }
    FSDP_CHECK(fsdp_file_fsync(w->path));
    w->committed = 1;
    return 0;
}

void fsdp_ckpt_shard_destroy(struct fsdp_ckpt_shard_writer *w)
{
    if (!w) {
        return;
    }
    if (w->file >= 0) {
        H5Fclose(w->file);
        H5Eclear2(H5E_DEFAULT);
    }
    if (w->created && !w->committed) {
        unlink(w->path);
    }
    ck_direct_close(&w->direct);
    ck_entries_free(w->entries, (size_t)w->kinds.n * w->spec->n_params);
    free(w->written);
    free(w);
}
