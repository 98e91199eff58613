/*
 * fileutil.h - durability primitives for the io layer's writers: the one
 * fsync of a file and of a directory that every commit uses, durable
 * replacement (data is written under a temporary name beside <path> and
 * becomes visible under <path> only once it is complete and on disk: fsync,
 * rename, fsync of the directory), and removal of a directory tree.
 * Directory commits built on these live in ckpt_commit.h.
 *
 * The temporary names come from core (core/tmpfile.h, included here so
 * that io's writers see one header): "<path>.tmp.XXXXXX", created
 * exclusively. The rename of a commit replaces whatever is at <path>, a
 * link included, without writing through it.
 */
#ifndef FSDP_IO_FILEUTIL_H
#define FSDP_IO_FILEUTIL_H

#include <time.h>

#include "core/tmpfile.h"

/* fsync of a regular file by name (data and size). 0 or FSDP_ERR_IO naming path. */
int fsdp_file_fsync(const char *path);

/* fsync of a directory: makes the entries created, renamed or removed in it
 * durable. A file system that cannot fsync directories is not an error.
 * 0 or FSDP_ERR_IO naming dir. */
int fsdp_file_fsync_dir(const char *dir);

/* fsdp_file_fsync_dir of the directory that holds path ("." for a bare
 * name): the one a rename to path changed. */
int fsdp_file_fsync_parent(const char *path);

/* fsync tmp, rename it to path, fsync path's directory. 0 or FSDP_ERR_IO. */
int fsdp_file_commit(const char *tmp, const char *path);
/* The end of a write under tmp: when rc is 0, fsdp_file_commit(tmp, path);
 * when rc or the commit failed, tmp is removed. Returns rc, else the
 * commit's. */
int fsdp_file_commit_or_remove(int rc, const char *tmp, const char *path);

/* rm -rf path without following symbolic links; a missing path is no error.
 * 0 or FSDP_ERR_IO. */
int fsdp_file_rmtree(const char *path);

/* Bytes of the regular files directly under dir (a checkpoint step's
 * shards and index), 0 when unreadable; *newest (unless NULL) gets their
 * latest modification time, 0 when there are none. */
double fsdp_file_dir_bytes(const char *dir, time_t *newest);

#endif
