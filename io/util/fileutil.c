/*
 * fileutil.c - the io layer's only fsync calls (files and directories), the
 * fsync + rename + directory fsync commit of one file, and removal of
 * directory trees. Temporary names are core's (core/tmpfile.c).
 */
#include "config.h"
#include "io/util/fileutil.h"
#include "core/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// fsync and commit

/* One open + fsync + close; dir selects O_DIRECTORY and its tolerance. */
static int file_fsync(const char *path, int dir)
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

int fsdp_file_fsync(const char *path)
{
    return file_fsync(path, 0);
}

int fsdp_file_fsync_dir(const char *dir)
{
    return file_fsync(dir, 1);
}

int fsdp_file_fsync_parent(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash) {
        return fsdp_file_fsync_dir(".");
    }
    if (slash == path) {
        return fsdp_file_fsync_dir("/");
    }
    char *dir = strndup(path, (size_t)(slash - path));
    if (!dir) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: directory name", path);
    }
    int rc = fsdp_file_fsync_dir(dir);
    free(dir);
    return rc;
}

int fsdp_file_commit(const char *tmp, const char *path)
{
    FSDP_CHECK(fsdp_file_fsync(tmp));
    if (rename(tmp, path) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
    }
    return fsdp_file_fsync_parent(path);
}

int fsdp_file_commit_or_remove(int rc, const char *tmp, const char *path)
{
    if (rc == 0) {
        rc = fsdp_file_commit(tmp, path);
    }
    if (rc < 0) {
        unlink(tmp);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// removal

static int file_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int fsdp_file_rmtree(const char *path)
{
    if (nftw(path, file_rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    }
    return 0;
}

double fsdp_file_dir_bytes(const char *dir, time_t *newest)
{
    DIR *d = opendir(dir);
    double total = 0;
    if (newest) {
        *newest = 0;
    }
    if (!d) {
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[8192];
        struct stat st;
        int n = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (n > 0 && (size_t)n < sizeof(path) && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            total += (double)st.st_size;
            if (newest && st.st_mtime > *newest) {
                *newest = st.st_mtime;
            }
        }
    }
    closedir(d);
    return total;
}
