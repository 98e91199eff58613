/*
 * fileutil.h - durability primitives for the io layer's writers: the one
 * fsync of a file and of a directory that every commit uses, durable
 * replacement (data is written under a temporary name beside <path> and
 * becomes visible under <path> only once it is complete and on disk: fsync,
 * rename, fsync of the directory), and removal of a directory tree.
 * Directory commits built on these live in ckpt_commit.h.
 *
 * Temporary names are "<path>.tmp.XXXXXX", six random letters and digits,
 * and are created exclusively: anything already at a name (a file, a
 * symbolic link planted there, dangling or not) is never opened, truncated
 * or followed, and another name is drawn. A fixed name would let whoever can
 * write the directory aim our writes at a file of their choosing. The
 * rename of a commit replaces whatever is at <path>, a link included,
 * without writing through it.
 */
#ifndef FSDP_IO_FILEUTIL_H
#define FSDP_IO_FILEUTIL_H

/*
 * Creates a new empty regular file "<path>.tmp.XXXXXX" in path's directory,
 * mode 0644 less the umask, and opens it for writing (O_CLOEXEC). 0 with
 * *tmp (malloc'd) and *fd set, or FSDP_ERR_IO naming the template.
 */
int fsdp_file_tmp_create(const char *path, char **tmp, int *fd);

/*
 * A fresh name "<path>.tmp.XXXXXX" for a file that another library must
 * create itself (HDF5 opens its files by name): the name is created as
 * fsdp_file_tmp_create does, which reports the OS's reason when the
 * directory refuses, and removed again. The caller must create it with an
 * exclusive create (O_CREAT | O_EXCL; H5F_ACC_EXCL for HDF5), so that
 * anything planted at the name in between makes the create fail instead of
 * receiving the data. 0 with *tmp (malloc'd) set, or FSDP_ERR_IO.
 */
int fsdp_file_tmp_name(const char *path, char **tmp);

/*
 * Creates a new directory "<path>.tmp.XXXXXX" beside path, mode 0755 less
 * the umask, for a directory commit (fsdp_ckpt_commit_dir). 0 with *tmp
 * (malloc'd) set, or FSDP_ERR_IO.
 */
int fsdp_file_tmp_mkdir(const char *path, char **tmp);

/*
 * Checks that path can be created as a new file (a fixed name inside a
 * directory of our own, such as a checkpoint shard) by creating it as
 * fsdp_file_tmp_create would and removing it again; the caller then creates
 * it exclusively. 0, or FSDP_ERR_IO with the OS's reason (an existing
 * entry, a link included, is "File exists").
 */
int fsdp_file_probe_create(const char *path);

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

/* rm -rf path without following symbolic links; a missing path is no error.
 * 0 or FSDP_ERR_IO. */
int fsdp_file_rmtree(const char *path);

#endif
