/*
 * ckpt_commit.c - the checkpoint directory commit (see ckpt_commit.h): the
 * order of fsyncs and renames that makes a step directory and root/latest
 * durable. Owns no file contents (ckpt.c writes them) and no policy on
 * which steps are kept (the trainer's cadence).
 */
#include "config.h"
#include "io/ckpt_commit.h"
#include "io/ckpt.h"
#include "io/fileutil.h"
#include "core/error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define COMMIT_PATH_MAX 4096

int fsdp_ckpt_commit_tmp_path(char *buf, size_t len, const char *root, long step, unsigned nonce)
{
    int n = snprintf(buf, len, "%s/" FSDP_CKPT_TMP_PREFIX "step_%ld_%08x", root, step, nonce);
    if (n < 0 || (size_t)n >= len) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: checkpoint directory path too long", root);
    }
    return 0;
}

int fsdp_ckpt_commit_dir(const char *tmp, const char *final)
{
    FSDP_CHECK(fsdp_file_fsync_dir(tmp));
    if (rename(tmp, final) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: rename to %s failed: %s", tmp, final, strerror(errno));
    }
    return fsdp_file_fsync_parent(final);
}

/* root/latest -> target through a symlink renamed over it, then root fsynced. */
static int commit_latest(const char *root, const char *target, unsigned nonce)
{
    char ltmp[COMMIT_PATH_MAX], latest[COMMIT_PATH_MAX];
    snprintf(ltmp, sizeof(ltmp), "%s/" FSDP_CKPT_TMP_PREFIX "latest_%08x", root, nonce);
    snprintf(latest, sizeof(latest), "%s/%s", root, FSDP_CKPT_LATEST);
    unlink(ltmp); /* a leftover of a crashed save with the same nonce */
    if (symlink(target, ltmp) != 0 || rename(ltmp, latest) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot point it at %s: %s", latest, target,
                        strerror(errno));
    }
    return fsdp_file_fsync_dir(root);
}

int fsdp_ckpt_commit_step(const char *root, const char *tmp, long step, unsigned nonce)
{
    char final[COMMIT_PATH_MAX], old[COMMIT_PATH_MAX], target[64];
    int n = snprintf(final, sizeof(final), "%s/step_%ld", root, step);
    int m = snprintf(old, sizeof(old), "%s/" FSDP_CKPT_TMP_PREFIX "old_step_%ld_%08x", root, step,
                     nonce);
    if (n < 0 || (size_t)n >= sizeof(final) || m < 0 || (size_t)m >= sizeof(old)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: checkpoint directory path too long", root);
    }
    snprintf(target, sizeof(target), "step_%ld", step);
    int had_old = access(final, F_OK) == 0;
    if (had_old && rename(final, old) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot move the older checkpoint of this step aside: %s",
                        final, strerror(errno));
    }
    FSDP_CHECK(fsdp_ckpt_commit_dir(tmp, final));
    FSDP_CHECK(commit_latest(root, target, nonce));
    return had_old ? fsdp_file_rmtree(old) : 0;
}
