/*
 * crash_shim.h - a process crash at the k-th file-system call that changes
 * something under a directory (tests/ckpt/crash_shim.c). Linked into a test
 * program, which arms it with crash_shim_arm; built as crash_shim.so for
 * LD_PRELOAD into fsdpc-train, which is armed from the environment:
 *   FSDPC_CRASH_AT=k          _exit(CRASH_SHIM_STATUS) before call k (0: never)
 *   FSDPC_CRASH_UNDER=DIR     count only calls on paths under DIR (absolute,
 *                             without symbolic links)
 *   FSDPC_CRASH_NOTE=FILE     one line per counted call, "<k> <call> <paths>"
 *   FSDPC_CRASH_NO_EXCHANGE=1 renameat2(RENAME_EXCHANGE) fails with EINVAL,
 *                             as on a file system that cannot exchange
 *   FSDPC_CRASH_SLOW_MS=ms    sleep ms before each counted call, as on a slow
 *                             file system (a save that outlasts some steps)
 *   FSDPC_CRASH_EIO_DIRECT=k  the k-th pwrite through an O_DIRECT descriptor
 *                             under DIR fails with EIO after 0.2 s (the
 *                             process goes on)
 * Counted calls: mkdir, open/open64 for writing or creating, write, pwrite,
 * posix_fallocate, fsync, fdatasync, rename, renameat, renameat2, symlink,
 * unlink, rmdir, remove; every call through which a save or a recovery
 * changes the file system. Reads are not counted: a crash before one is a
 * crash after the call before it.
 */
#ifndef FSDP_TESTS_CRASH_SHIM_H
#define FSDP_TESTS_CRASH_SHIM_H

#define CRASH_SHIM_STATUS 113

/* Counting restarts at 0; k, under, note_fd (-1: no notes), no_exchange as
 * the variables above. */
void crash_shim_arm(long k, const char *under, int note_fd, int no_exchange);
/* From now on the k-th pwrite through an O_DIRECT descriptor under the
 * directory fails with EIO (0: none); their count restarts at 0. */
void crash_shim_fail_direct(long k);
/* Such pwrites since crash_shim_fail_direct, from any thread. */
long crash_shim_direct_writes(void);

#endif
