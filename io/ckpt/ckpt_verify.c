/*
 * ckpt_verify.c - a checkpoint's data read whole against its checksums, and
 * the newest step of a checkpoint root that passes: what a resume that
 * failed on a damaged step, and `fsdpc-ckpt list --verify`, point the user
 * to. Opening a checkpoint (ckpt.h) checks its structure and that the
 * checksums are recorded; only reading the rows checks the data.
 */
#include "config.h"
#include "io/ckpt/ckpt.h"
#include "core/error.h"
#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fsdp_ckpt_verify_data(const char *path)
{
    struct fsdp_ckpt *ck;
    FSDP_CHECK(fsdp_ckpt_open(path, &ck));
    const struct fsdp_model_spec *s = fsdp_ckpt_spec(ck);
    float *buf = fsdp_alloc(fsdp_model_spec_largest(s) * sizeof(float));
    int rc = buf ? 0 : fsdp_err(FSDP_ERR_NOMEM, "%s: one tensor's buffer", path);
    for (int k = 0; rc == 0 && k < FSDP_CKPT_NKINDS; k++) {
        for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
            rc = fsdp_ckpt_read_rows(ck, (enum fsdp_ckpt_kind)k, i, 0, s->params[i].shape[0],
                                     buf);
        }
    }
    fsdp_free(buf);
    fsdp_ckpt_close(ck);
    return rc;
}

/* Step of "step_<N>", or -1. */
static long cv_step_of(const char *name)
{
    if (strncmp(name, "step_", 5) != 0 || name[5] < '0' || name[5] > '9') {
        return -1;
    }
    char *end;
    errno = 0;
    long n = strtol(name + 5, &end, 10);
    return *end || errno || n < 0 ? -1 : n;
}

long fsdp_ckpt_newest_verified(const char *root, long below, char *dir, size_t len)
{
    for (;;) {
        DIR *d = opendir(root);
        long best = -1;
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            long s = cv_step_of(de->d_name);
            best = s >= 0 && s < below && s > best ? s : best;
        }
        if (d) {
            closedir(d);
        }
        if (best < 0) {
            return -1;
        }
        snprintf(dir, len, "%s/step_%ld", root, best);
        if (fsdp_ckpt_verify_data(dir) == 0) {
            return best;
        }
        fsdp_err_clear();
        below = best;
    }
}
