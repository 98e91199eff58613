/*
 * fileutil.c - tmp names and the fsync + rename + directory fsync commit.
 */
#include "config.h"
#include "io/fileutil.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *fsdp_file_tmp_path(const char *path)
{
    size_t n = strlen(path) + sizeof(".tmp");
    char *tmp = malloc(n);
    if (tmp) {
        snprintf(tmp, n, "%s.tmp", path);
    }
    return tmp;
}

int fsdp_file_fsync(const char *path, int dir)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open for fsync: %s", path, strerror(errno));
    }
    int e = fsync(fd);
    int saved = errno;
    close(fd);
    /* some file systems cannot fsync a directory; the rename still happened */
    if (e != 0 && !(dir && (saved == EINVAL || saved == EBADF))) {
        return fsdp_err(FSDP_ERR_IO, "%s: fsync failed: %s", path, strerror(saved));
    }
    return 0;
}

int fsdp_file_commit(const char *tmp, const char *path)
{
    FSDP_CHECK(fsdp_file_fsync(tmp, 0));
    if (rename(tmp, path) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    }
    char *dir = strdup(path);
    if (!dir) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: directory name", path);
    }
    char *slash = strrchr(dir, '/');
    if (slash == dir) {
        slash[1] = '\0';
    } else if (slash) {
        *slash = '\0';
    }
    int rc = fsdp_file_fsync(slash ? dir : ".", 1);
    free(dir);
    return rc;
}
