/*
 * fileutil.h - durable file replacement for the io layer's writers: data is
 * written under "<path>.tmp" and becomes visible under <path> only once it
 * is complete and on disk (fsync, rename, fsync of the directory), so a crash
 * never leaves a half-written file under the real name.
 */
#ifndef FSDP_IO_FILEUTIL_H
#define FSDP_IO_FILEUTIL_H

/* A malloc'd "<path>.tmp" (NULL when out of memory). */
char *fsdp_file_tmp_path(const char *path);

/* fsync of a file, or of a directory (dir 1; a file system that cannot
 * fsync directories is not an error). 0 or FSDP_ERR_IO naming path. */
int fsdp_file_fsync(const char *path, int dir);

/* fsync tmp, rename it to path, fsync path's directory. 0 or FSDP_ERR_IO. */
int fsdp_file_commit(const char *tmp, const char *path);

#endif
