/*
 * ckpt_commit.h - how a finished checkpoint directory becomes visible, how
 * one is removed, and how a root is put back in order after a crash
 * (doc/formats.md, "Commit protocol"). A step is written into a temporary
 * directory beside its final name and appears under that name only when it
 * is complete and on disk; under a checkpoint root, `latest` then moves to
 * it. The invariant every function here keeps, at every instant and so
 * across a crash at any point: each step_<N> of a root is complete, at
 * least one complete copy of every committed step exists, and `latest`
 * names one of them once fsdp_ckpt_commit_recover has run. Every temporary
 * entry these functions make in a root starts with FSDP_CKPT_TMP_PREFIX;
 * the only one ever read is an aside copy (FSDP_CKPT_ASIDE_PREFIX), which
 * recovery puts back when its step is missing.
 *
 * Files and names only: which process commits, and when, is the caller's
 * (the trainer agrees across ranks that every file is written before rank 0
 * commits; fsdpc-ckpt is one process). No logging: recovery reports what it
 * did and the caller says so.
 */
#ifndef FSDP_IO_CKPT_COMMIT_H
#define FSDP_IO_CKPT_COMMIT_H

#include <stddef.h>

/* Leftovers of interrupted saves under a root start with this. */
#define FSDP_CKPT_TMP_PREFIX ".tmp_"
/* A committed step moved aside while its replacement is renamed in (only
 * where an atomic exchange is not available): always a complete copy. */
#define FSDP_CKPT_ASIDE_PREFIX FSDP_CKPT_TMP_PREFIX "old_"

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
 *   1. tmp is fsynced (its files are already)
 *   2. no step_<step> yet: tmp is renamed to it. A step_<step> exists (a
 *      run resumed from an older step writes it again): tmp and step_<step>
 *      trade names in one renameat2(RENAME_EXCHANGE); where the kernel or
 *      file system cannot, step_<step> is renamed to
 *      .tmp_old_step_<step>_<nonce> and tmp to step_<step> (a crash in
 *      between leaves the old copy where recovery puts it back)
 *   3. root is fsynced
 *   4. a symlink .tmp_latest_<nonce> -> step_<step> is renamed over latest
 *      (rename is atomic, so latest always names a complete step), and
 *      root is fsynced
 *   5. the replaced copy, if any, is removed
 * On an error step_<step> and latest name complete checkpoints (the old
 * or the new one) and tmp may remain; the caller removes it.
 */
int fsdp_ckpt_commit_step(const char *root, const char *tmp, long step, unsigned nonce);

/*
 * Removes root/step_<step> so that no partial step is ever visible under
 * that name: renames it to .tmp_gone_step_<step>_<nonce>, fsyncs root, then
 * deletes the tree. Refuses (FSDP_ERR_INVALID) the step latest names. A
 * missing step is no error.
 */
int fsdp_ckpt_commit_remove(const char *root, long step, unsigned nonce);

/* The step N of a step directory's name "step_<N>" (N: decimal digits only),
 * or -1 for any other name. */
long fsdp_ckpt_step_of(const char *name);

/* Called by fsdp_ckpt_step_scan for an entry of a root: its name and its
 * step (-1: a leftover). Nonzero stops the scan. */
typedef int (*fsdp_ckpt_entry_fn)(const char *name, long step, void *arg);

/*
 * Calls fn for each entry of root that is a step directory's name and, with
 * leftovers set, each leftover of an interrupted save or removal (a name
 * that starts with FSDP_CKPT_TMP_PREFIX), in the order the directory lists
 * them, until fn returns nonzero. 0, fn's nonzero value, or FSDP_ERR_IO
 * ("<root>: cannot list: <reason>") when root cannot be listed.
 */
int fsdp_ckpt_step_scan(const char *root, int leftovers, fsdp_ckpt_entry_fn fn, void *arg);

/* The step of an aside copy's name ".tmp_old_step_<N>_<nonce>", or -1. */
long fsdp_ckpt_commit_aside_step(const char *name);

/* What fsdp_ckpt_commit_recover found and did. */
struct fsdp_ckpt_recovery {
    int n_removed;       /* leftovers of interrupted saves and removals deleted */
    int n_restored;      /* steps put back from their aside copies */
    long restored[8];    /* (min(n_restored, 8)) those steps */
    int latest_missing;  /* latest exists and names nothing: see latest_target */
    char latest_target[256]; /* what latest names ("" when there is no latest) */
};

/*
 * Run before anything reads or writes under root after a possible crash
 * (the trainer's start): an aside copy whose step_<N> is missing is renamed
 * back to step_<N> (the save that moved it died before its replacement
 * arrived); every other .tmp_* entry, an aside copy whose step exists
 * included, is deleted; root is fsynced. Safe to run again after a crash of
 * its own. A root that does not exist is no error.
 */
int fsdp_ckpt_commit_recover(const char *root, struct fsdp_ckpt_recovery *rep);
/* What fsdp_ckpt_commit_recover would do to root, changing nothing: the
 * steps it would put back, the leftovers it would delete, latest (for the
 * read-only tools, which say what is wrong and leave the fixing to
 * `fsdpc-ckpt recover` or the next run). */
int fsdp_ckpt_commit_scan(const char *root, struct fsdp_ckpt_recovery *rep);

#endif
