/*
 * ckpt_damage.c - the way out of a resume that failed on a damaged
 * checkpoint (a flipped byte, a truncated shard): the newest older step of
 * the same root whose data reads back against its checksums, and the
 * --resume that continues from it, as the error's hint. Reads older steps
 * in full, newest first, and only after a failure.
 */
#include "config.h"
#include "train/ckpt_cadence.h"
#include "train/model_source.h"
#include "io/ckpt/ckpt.h"
#include "io/ckpt/ckpt_commit.h"
#include "core/error.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The step directory and root of what --resume named (a root, a step
 * directory or its index.h5), and its step; -1 when it names none. */
static long dmg_locate(const char *path, char *root, size_t len)
{
    char index[4096], step_dir[4096];
    if (fsdp_model_source_resolve(path, index, sizeof(index), NULL) < 0) {
        fsdp_err_clear();
        return -1;
    }
    snprintf(step_dir, sizeof(step_dir), "%s", index);
    char *slash = strrchr(step_dir, '/');
    if (!slash) {
        return -1;
    }
    *slash = '\0'; /* .../step_N */
    const char *base = strrchr(step_dir, '/');
    base = base ? base + 1 : step_dir;
    long step = fsdp_ckpt_step_of(base);
    if (step < 0) {
        return -1;
    }
    snprintf(root, len, "%.*s", base == step_dir ? 1 : (int)(base - step_dir - 1),
             base == step_dir ? "." : step_dir);
    return step;
}

int fsdp_ckpt_damage_hint(const char *path, int rc)
{
    if (rc >= 0 || fsdp_err_hint_msg()[0]) {
        return rc; /* no error, or one with its own way out */
    }
    char msg[1024], root[4096], good[4200];
    fsdp_err_take(msg, sizeof(msg));
    long step = dmg_locate(path, root, sizeof(root));
    long ok =
        step > 0 ? fsdp_ckpt_newest_verified(root, fsdp_arch_registered(), step, good, sizeof(good))
                 : -1;
    fsdp_err_clear();
    fsdp_err(rc, "%s", msg);
    if (ok >= 0) {
        fsdp_err_hint("step_%ld is damaged; step_%ld, the newest older checkpoint in %s, reads "
                      "back against its checksums: --resume %s continues from it (fsdpc-ckpt "
                      "list --verify %s checks every step)", step, ok, root, good, root);
    } else if (step > 0) {
        fsdp_err_hint("step_%ld is damaged and no older checkpoint in %s reads back against its "
                      "checksums (fsdpc-ckpt list --verify %s); without --resume the run starts "
                      "again from --model", step, root, root);
    }
    return rc;
}
