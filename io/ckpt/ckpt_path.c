/*
 * ckpt_path.c - which step directory a path names (see ckpt.h): a step
 * directory, its index.h5, or a checkpoint root whose `latest` is
 * followed; and whether a path is to be read as a checkpoint at all.
 * Opens no shard; the reader (ckpt_reader.c) checks what it finds there.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "io/h5/h5util.h"
#include "core/error.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int ck_is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* path -> the step directory it names (index.h5's directory, or root/latest). */
int ck_resolve(const char *path, char *dir, size_t len)
{
    char buf[CK_PATH_MAX];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') {
        n--;
    }
    if (n >= sizeof(buf)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: path too long", path);
    }
    snprintf(buf, sizeof(buf), "%.*s", (int)n, path);
    const char *base = strrchr(buf, '/');
    base = base ? base + 1 : buf;
    if (strcmp(base, FSDP_CKPT_INDEX) == 0) {
        if (base == buf) {
            snprintf(dir, len, ".");
        } else {
            snprintf(dir, len, "%.*s", (int)(base - buf - 1), buf);
        }
        return 0;
    }
    if (!ck_is_dir(buf)) {
        return fsdp_err(FSDP_ERR_IO, "%s: not a checkpoint: %s", path,
                        access(buf, F_OK) == 0 ? "neither a directory nor an index.h5"
                                               : strerror(errno));
    }
    char probe[CK_PATH_MAX + 16];
    snprintf(probe, sizeof(probe), "%s/%s", buf, FSDP_CKPT_INDEX);
    if (access(probe, F_OK) == 0) {
        snprintf(dir, len, "%s", buf);
        return 0;
    }
    snprintf(probe, sizeof(probe), "%s/%s", buf, FSDP_CKPT_LATEST);
    if (ck_is_dir(probe)) {
        int w = snprintf(dir, len, "%s", probe);
        return w >= 0 && (size_t)w < len ? 0
                                         : fsdp_err(FSDP_ERR_INVALID, "%s: path too long", path);
    }
    return fsdp_err(FSDP_ERR_FORMAT,
                    "%s: not a checkpoint: no %s in it and no '%s' pointing to a step directory",
                    path, FSDP_CKPT_INDEX, FSDP_CKPT_LATEST);
}

int fsdp_ckpt_is_checkpoint(const char *path)
{
    if (ck_is_dir(path)) {
        return 1; /* opening it says what is missing, if anything */
    }
    const char *base = strrchr(path, '/');
    if (strcmp(base ? base + 1 : path, FSDP_CKPT_INDEX) != 0) {
        return 0;
    }
    if (fsdp_h5_check_regular(path) < 0) {
        fsdp_err_clear(); /* opening it says why (HDF5 would block on a FIFO) */
        return 1;
    }
    /* an index.h5 carries checkpoint_format; a model file of that name does not */
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int yes = f < 0 || fsdp_h5_attr_exists(f, "checkpoint_format");
    fsdp_h5_close(f);
    return yes;
}
