/*
 * model_source.c - a checkpoint directory given where a model file is
 * expected, turned into the path of its index.h5 (model_source.h). Looks at
 * names only; opening the file validates it.
 */
#include "config.h"
#include "train/model_source.h"
#include "core/error.h"
#include "io/ckpt/ckpt.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int ms_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ms_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int ms_join(char *out, size_t len, const char *a, const char *b)
{
    int n = snprintf(out, len, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= len) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: path too long", a);
    }
    return 0;
}

int fsdp_model_source_resolve(const char *path, char *out, size_t len, int *ckpt)
{
    char link[4096], target[1024];
    if (ckpt) {
        *ckpt = 0;
    }
    if (!ms_is_dir(path)) {
        if (snprintf(out, len, "%s", path) >= (int)len) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: path too long", path);
        }
        return 0;
    }
    if (ckpt) {
        *ckpt = 1;
    }
    FSDP_CHECK(ms_join(out, len, path, FSDP_CKPT_INDEX));
    if (ms_exists(out)) {
        return 0; /* a step directory */
    }
    FSDP_CHECK(ms_join(link, sizeof(link), path, FSDP_CKPT_LATEST));
    if (!ms_exists(link)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: a directory, but not a checkpoint (no %s, no %s): "
                        "name a model file, a step directory or a checkpoint root", path,
                        FSDP_CKPT_INDEX, FSDP_CKPT_LATEST);
    }
    ssize_t k = readlink(link, target, sizeof(target) - 1);
    target[k > 0 ? k : 0] = '\0';
    if (k <= 0 || strchr(target, '/')) {
        /* not the trainer's own relative link: go through it as it is */
        snprintf(target, sizeof(target), "%s", FSDP_CKPT_LATEST);
    }
    char step[4096];
    FSDP_CHECK(ms_join(step, sizeof(step), path, target));
    if (!ms_is_dir(step)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s names %s, which is missing", link, target);
    }
    return ms_join(out, len, step, FSDP_CKPT_INDEX);
}
