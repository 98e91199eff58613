/*
 * tmpfile.h - temporary names beside a path, created exclusively: the io
 * layer's writers (io/util/fileutil.h commits what is written there) and
 * the flight recorder's dumps write a file under such a name and rename it
 * over the real one only once it is complete.
 *
 * Temporary names are "<path>.tmp.XXXXXX", six random letters and digits,
 * and are created exclusively: anything already at a name (a file, a
 * symbolic link planted there, dangling or not) is never opened, truncated
 * or followed, and another name is drawn. A fixed name would let whoever can
 * write the directory aim our writes at a file of their choosing.
 */
#ifndef FSDP_CORE_TMPFILE_H
#define FSDP_CORE_TMPFILE_H

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
 * the umask, for a directory commit (io/ckpt/ckpt_commit.h). 0 with *tmp
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

#endif
