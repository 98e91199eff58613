/*
 * ckpt_verify.c - a checkpoint's data read whole against its checksums, and
 * the newest step of a checkpoint root that passes: what a resume that
 * failed on a damaged step, and `fsdpc-ckpt list --verify`, point the user
 * to. Opening a checkpoint (ckpt.h) checks its structure and that the
 * checksums are recorded; only reading the rows checks the data.
 */
#include "config.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "core/error.h"
#include "core/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fsdp_ckpt_verify_data(const char *path, const struct fsdp_arch_set *archs)
{
    struct fsdp_ckpt *ck;
    FSDP_CHECK(fsdp_ckpt_open(path, archs, &ck));
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    float *buf = fsdp_alloc(fsdp_model_spec_largest(s) * sizeof(float));
    int rc = buf ? 0 : fsdp_err(FSDP_ERR_NOMEM, "%s: one tensor's buffer", path);
    /* shard by shard: each file read front to back, then left */
    for (int r = 0; rc == 0 && r < fsdp_ckpt_meta(ck)->n_shards; r++) {
        for (int k = 0; rc == 0 && k < fsdp_ckpt_kinds(ck)->n; k++) {
            for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
                size_t row0, rows;
                fsdp_ckpt_rows(s->params[i].shape[0], fsdp_ckpt_meta(ck)->n_shards, r, &row0,
                               &rows);
                rc = rows ? fsdp_ckpt_read_rows(ck, k, i, row0, rows, buf) : 0;
            }
        }
    }
    fsdp_free(buf);
    fsdp_ckpt_close(ck);
    return rc;
}

/* The newest step below *bound: the state of fsdp_ckpt_newest_verified's scan. */
struct cv_newest {
    long below, best;
};

static int cv_newest_of(const char *name, long step, void *arg)
{
    struct cv_newest *nw = arg;
    (void)name;
    nw->best = step < nw->below && step > nw->best ? step : nw->best;
    return 0;
}

long fsdp_ckpt_newest_verified(const char *root, const struct fsdp_arch_set *archs, long below,
                               char *dir, size_t len)
{
    for (;;) {
        struct cv_newest nw = {.below = below, .best = -1};
        if (fsdp_ckpt_step_scan(root, 0, cv_newest_of, &nw) < 0) {
            fsdp_err_clear(); /* an unreadable root holds no verified step */
        }
        if (nw.best < 0) {
            return -1;
        }
        snprintf(dir, len, "%s/step_%ld", root, nw.best);
        if (fsdp_ckpt_verify_data(dir, archs) == 0) {
            return nw.best;
        }
        fsdp_err_clear();
        below = nw.best;
    }
}
