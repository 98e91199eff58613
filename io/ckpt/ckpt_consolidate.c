/*
 * ckpt_consolidate.c - a checkpoint written as one model file (see ckpt.h):
 * tensor by tensor through one buffer of the largest, read through their
 * checksums and written with fresh ones, under a temporary name committed
 * when complete (fileutil.h).
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "io/util/fileutil.h"
#include "io/h5/h5util.h"
#include "io/h5/model_file.h"
#include "core/error.h"

#include <stdlib.h>
#include <unistd.h>

/* Tensor p's whole data (buf) as dataset name of f (tmp, for messages),
 * written once, with its block checksums. */
static int ck_write_tensor(hid_t f, const char *tmp, const char *name,
                           const struct fsdp_param_spec *p, const float *buf)
{
    char why[256];
    hsize_t dims[2];
    hid_t sp = H5Screate_simple(ck_dims(p, p->shape[0], dims), dims, NULL);
    hid_t dcpl = fsdp_h5_dcpl_write_once();
    hid_t d = sp < 0 || dcpl < 0
                  ? -1
                  : H5Dcreate2(f, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    fsdp_h5_close(dcpl);
    int rc = d < 0 ? -1
                   : fsdp_sum_write(d, H5T_NATIVE_FLOAT, p->ndim, p->shape[0], p->shape[1],
                                    sizeof(float), buf, ck_block_rows(p));
    if (rc == -1) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: writing /%s failed: %s", tmp, name,
                      fsdp_h5_reason(why, sizeof(why)));
    }
    fsdp_h5_close(d);
    fsdp_h5_close(sp);
    return rc;
}

int fsdp_ckpt_consolidate(struct fsdp_ckpt *ck, const char *out, int with_optim,
                          fsdp_ckpt_progress_fn progress, void *arg)
{
    const struct fsdp_model_spec *spec = fsdp_ckpt_spec(ck);
    const long step = fsdp_ckpt_meta(ck)->step;
    char why[256], name[256], created_by[256];
    const size_t largest = fsdp_model_spec_largest(spec);
    int rc = 0;
    fsdp_h5_quiet();
    char *tmp = NULL;
    float *buf = fsdp_alloc(largest * sizeof(float));
    if (!buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: %zu bytes for one tensor", out,
                        largest * sizeof(float));
    }
    FSDP_CHECK_GOTO(fsdp_file_tmp_name(out, &tmp), rc, out);
    if (snprintf(created_by, sizeof(created_by), "fsdpc-ckpt consolidate of %s (step %ld)",
                 fsdp_ckpt_dir(ck), step) >= (int)sizeof(created_by)) {
        snprintf(created_by, sizeof(created_by), "fsdpc-ckpt consolidate (step %ld)", step);
    }
    const struct fsdp_ckpt_kinds *kinds = fsdp_ckpt_kinds(ck);
    const int n_kinds = with_optim ? kinds->n : 1; /* the model first */
    hid_t f = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) {
        /* whatever is at tmp now is not ours to remove */
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", tmp, fsdp_h5_reason(why, sizeof(why)));
        goto out;
    }
    if (fsdp_h5_put_model_attrs(f, spec, created_by) < 0 ||
        (with_optim
             ? ck_make_groups(f, kinds)
             : H5Gclose(H5Gcreate2(f, "model", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT))) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", tmp, fsdp_h5_reason(why, sizeof(why)));
        H5Fclose(f);
        goto out_tmp;
    }
    size_t total = (size_t)n_kinds * spec->n_params, done = 0;
    for (int k = 0; k < n_kinds && rc == 0; k++) {
        for (size_t i = 0; i < spec->n_params && rc == 0; i++) {
            const struct fsdp_param_spec *p = &spec->params[i];
            rc = fsdp_ckpt_read_rows(ck, k, i, 0, p->shape[0], buf);
            if (rc < 0) {
                break;
            }
            snprintf(name, sizeof(name), "%s/%s", kinds->group[k], p->name);
            rc = ck_write_tensor(f, tmp, name, p, buf);
            if (progress && rc == 0) {
                progress(++done, total, arg);
            }
        }
    }
    if (H5Fclose(f) < 0 && rc == 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: closing failed: %s", tmp, fsdp_h5_reason(why, sizeof(why)));
    }
out_tmp:
    rc = fsdp_file_commit_or_remove(rc, tmp, out);
out:
    free(tmp);
    fsdp_free(buf);
    return rc;
}
