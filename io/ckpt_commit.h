/*
 * ckpt_commit.h - how a finished checkpoint directory becomes visible
 * (doc/formats.md, "Commit protocol"). A step is written into a temporary
 * directory beside its final name and appears under that name only when it
 * is complete and on disk; under a checkpoint root, `latest` then moves to
 * it. A crash at any point leaves the previous state or the new one, never
 * a partial step under a real name; every temporary entry these functions
 * make in a root starts with FSDP_CKPT_TMP_PREFIX and is never read.
 *
 * Files and names only: which process commits, and when, is the caller's
 * (the trainer agrees across ranks that every file is written before rank 0
 * commits; fsdpc-ckpt is one process).
 */
#ifndef FSDP_IO_CKPT_COMMIT_H
#define FSDP_IO_CKPT_COMMIT_H

#include <stddef.h>

/* Leftovers of interrupted saves under a root start with this. */
#define FSDP_CKPT_TMP_PREFIX ".tmp_"

/* "<root>/.tmp_step_<step>_<nonce>" into buf: where step is written before
 * its commit. 0, or FSDP_ERR_INVALID when it does not fit in len. */
int fsdp_ckpt_commit_tmp_path(char *buf, size_t len, const char *root, long step, unsigned nonce);

/*
 * Makes the finished directory tmp appear as final (which must not exist,
 * or be an empty directory; same file system): fsyncs tmp so that the
 * entries of its files are durable, renames it to final, fsyncs final's
 * parent. The files in tmp must already be on disk: their writers fsync
 * them (fsdp_ckpt_shard_commit, fsdp_ckpt_index_write), because on a shared
 * file system only the process that wrote a file can flush it.
 */
int fsdp_ckpt_commit_dir(const char *tmp, const char *final);

/*
 * Commits the finished step directory tmp (made under root, by
 * fsdp_ckpt_commit_tmp_path with the same nonce) as root/step_<step> and
 * points root/latest at it:
 *   1. an existing step_<step> (written again by a run resumed from an
 *      older step) is moved aside to .tmp_old_step_<step>_<nonce>
 *   2. fsdp_ckpt_commit_dir(tmp, root/step_<step>)
 *   3. a symlink .tmp_latest_<nonce> -> step_<step> is renamed over latest
 *      (rename is atomic, so latest always names a complete step), and
 *      root is fsynced
 *   4. the step moved aside in 1 is removed
 * On an error tmp may remain; the caller removes it.
 */
int fsdp_ckpt_commit_step(const char *root, const char *tmp, long step, unsigned nonce);

#endif
