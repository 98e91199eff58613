/*
 * ckpt_commit.c - the checkpoint directory commit, removal and crash
 * recovery (see ckpt_commit.h): the order of fsyncs and renames that makes
 * a step directory and root/latest durable, and never leaves a committed
 * step without a complete copy; the names of step directories and the scan
 * of a root for them. Owns no file contents (ckpt_writer.c and ckpt_index.c
 * write them) and no policy on which steps are kept (the trainer's cadence).
 */
#include "config.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/ckpt/ckpt.h"
#include "io/util/fileutil.h"
#include "core/error.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COMMIT_PATH_MAX 4096

/* snprintf that turns truncation into FSDP_ERR_INVALID naming root. */
__attribute__((format(printf, 4, 5))) static int commit_path(char *buf, size_t len,
                                                             const char *root, const char *fmt,
                                                             ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: checkpoint directory path too long", root);
    }
    return 0;
}

int fsdp_ckpt_commit_tmp_path(char *buf, size_t len, const char *root, long step, unsigned nonce)
{
    return commit_path(buf, len, root, "%s/" FSDP_CKPT_TMP_PREFIX "step_%ld_%08x", root, step,
                       nonce);
}

int fsdp_ckpt_commit_dir(const char *tmp, const char *final)
{
    FSDP_CHECK(fsdp_file_fsync_dir(tmp));
    if (rename(tmp, final) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: rename to %s failed: %s", tmp, final, strerror(errno));
    }
    return fsdp_file_fsync_parent(final);
}

// ----------------------------------------------------------------------------
// latest

/* root/latest -> target through a symlink renamed over it, then root fsynced. */
static int commit_latest(const char *root, const char *target, unsigned nonce)
{
    char ltmp[COMMIT_PATH_MAX], latest[COMMIT_PATH_MAX];
    FSDP_CHECK(commit_path(ltmp, sizeof(ltmp), root, "%s/" FSDP_CKPT_TMP_PREFIX "latest_%08x",
                           root, nonce));
    FSDP_CHECK(commit_path(latest, sizeof(latest), root, "%s/%s", root, FSDP_CKPT_LATEST));
    unlink(ltmp); /* a leftover of a crashed save with the same nonce */
    if (symlink(target, ltmp) != 0 || rename(ltmp, latest) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot point it at %s: %s", latest, target,
                        strerror(errno));
    }
    return fsdp_file_fsync_dir(root);
}

/* What root/latest names into buf ("" when there is no such link). */
static void commit_latest_target(const char *root, char *buf, size_t len)
{
    char latest[COMMIT_PATH_MAX];
    buf[0] = '\0';
    if (commit_path(latest, sizeof(latest), root, "%s/%s", root, FSDP_CKPT_LATEST) < 0) {
        fsdp_err_clear();
        return;
    }
    ssize_t n = readlink(latest, buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
}

// ----------------------------------------------------------------------------
// replacing and removing a committed step

/* Swaps the names a and b in one step: 1 when done, 0 when the kernel or
 * the file system cannot (the caller falls back), negative on an error. */
static int commit_exchange(const char *a, const char *b)
{
#ifdef RENAME_EXCHANGE
    if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) == 0) {
        return 1;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot exchange it with %s: %s", a, b, strerror(errno));
    }
#else
    (void)a;
    (void)b;
#endif
    return 0;
}

/*
 * The committed final becomes tmp's contents; *gone gets the path that now
 * holds the older copy. Without an exchange, final is missing between the
 * two renames, and the aside name is what recovery looks for then.
 */
static int commit_replace(const char *root, const char *tmp, const char *final, long step,
                          unsigned nonce, char *gone, size_t len)
{
    int x = commit_exchange(tmp, final);
    FSDP_CHECK(x);
    if (x == 1) {
        snprintf(gone, len, "%s", tmp);
        return fsdp_file_fsync_dir(root);
    }
    FSDP_CHECK(commit_path(gone, len, root, "%s/" FSDP_CKPT_ASIDE_PREFIX "step_%ld_%08x", root,
                           step, nonce));
    if (rename(final, gone) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot move the older checkpoint of this step aside: %s",
                        final, strerror(errno));
    }
    if (rename(tmp, final) != 0) {
        int e = errno;
        /* put the old copy back; if even that fails, recovery does it */
        if (rename(gone, final) == 0) {
            fsdp_file_fsync_dir(root);
        }
        return fsdp_err(FSDP_ERR_IO, "%s: rename to %s failed: %s", tmp, final, strerror(e));
    }
    return fsdp_file_fsync_dir(root);
}

/* Renames path to a .tmp_gone_ name, fsyncs root, deletes the tree: a crash
 * leaves path whole or a leftover that recovery deletes. */
static int commit_drop(const char *root, const char *path, const char *name, unsigned nonce)
{
    char gone[COMMIT_PATH_MAX];
    FSDP_CHECK(commit_path(gone, sizeof(gone), root, "%s/" FSDP_CKPT_TMP_PREFIX "gone_%s_%08x",
                           root, name, nonce));
    if (rename(path, gone) != 0) {
        if (errno == ENOENT) {
            return 0;
        }
        return fsdp_err(FSDP_ERR_IO, "%s: cannot remove (rename to %s): %s", path, gone,
                        strerror(errno));
    }
    FSDP_CHECK(fsdp_file_fsync_dir(root));
    return fsdp_file_rmtree(gone);
}

int fsdp_ckpt_commit_step(const char *root, const char *tmp, long step, unsigned nonce)
{
    char final[COMMIT_PATH_MAX], gone[COMMIT_PATH_MAX], target[64];
    struct stat st;
    FSDP_CHECK(commit_path(final, sizeof(final), root, "%s/step_%ld", root, step));
    snprintf(target, sizeof(target), "step_%ld", step);
    gone[0] = '\0';
    if (lstat(final, &st) != 0) {
        if (errno != ENOENT) {
            return fsdp_err(FSDP_ERR_IO, "%s: %s", final, strerror(errno));
        }
        FSDP_CHECK(fsdp_ckpt_commit_dir(tmp, final));
    } else {
        /* the replacement must be durable before it trades places with the old copy */
        FSDP_CHECK(fsdp_file_fsync_dir(tmp));
        FSDP_CHECK(commit_replace(root, tmp, final, step, nonce, gone, sizeof(gone)));
    }
    FSDP_CHECK(commit_latest(root, target, nonce));
    if (!gone[0]) {
        return 0;
    }
    if (strcmp(gone, tmp) == 0) {
        /* a .tmp_step_ name, which recovery never reads: delete in place */
        return fsdp_file_rmtree(gone);
    }
    return commit_drop(root, gone, target, nonce);
}

int fsdp_ckpt_commit_remove(const char *root, long step, unsigned nonce)
{
    char path[COMMIT_PATH_MAX], name[64], latest[256];
    FSDP_CHECK(commit_path(path, sizeof(path), root, "%s/step_%ld", root, step));
    snprintf(name, sizeof(name), "step_%ld", step);
    commit_latest_target(root, latest, sizeof(latest));
    if (strcmp(latest, name) == 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: not removed: %s/%s names it", path, root,
                        FSDP_CKPT_LATEST);
    }
    return commit_drop(root, path, name, nonce);
}

// ----------------------------------------------------------------------------
// step directories

/* The decimal number after prefix at the start of name (digits only, no
 * sign or space), *end just past it; -1 when name does not start so or the
 * number overflows. */
static long commit_step_at(const char *name, const char *prefix, const char **end)
{
    size_t k = strlen(prefix);
    if (strncmp(name, prefix, k) != 0 || name[k] < '0' || name[k] > '9') {
        return -1;
    }
    char *e;
    errno = 0;
    long n = strtol(name + k, &e, 10);
    *end = e;
    return errno ? -1 : n;
}

long fsdp_ckpt_step_of(const char *name)
{
    const char *end;
    long n = commit_step_at(name, "step_", &end);
    return n >= 0 && *end == '\0' ? n : -1;
}

int fsdp_ckpt_step_scan(const char *root, int leftovers, fsdp_ckpt_entry_fn fn, void *arg)
{
    DIR *d = opendir(root);
    if (!d) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot list: %s", root, strerror(errno));
    }
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        long step = fsdp_ckpt_step_of(e->d_name);
        int tmp = strncmp(e->d_name, FSDP_CKPT_TMP_PREFIX, strlen(FSDP_CKPT_TMP_PREFIX)) == 0;
        if (step >= 0 || (leftovers && tmp)) {
            rc = fn(e->d_name, step, arg);
        }
    }
    closedir(d);
    return rc;
}

// ----------------------------------------------------------------------------
// recovery

long fsdp_ckpt_commit_aside_step(const char *name)
{
    const char *end;
    long n = commit_step_at(name, FSDP_CKPT_ASIDE_PREFIX "step_", &end);
    return n >= 0 && *end == '_' ? n : -1;
}

/* The .tmp_* names directly under root (malloc'd, *n of them); listing
 * first, because renaming entries while readdir walks them may skip some. */
static int commit_list_tmp(const char *root, char ***out, size_t *n)
{
    DIR *d = opendir(root);
    struct dirent *e;
    size_t cap = 0;
    *out = NULL;
    *n = 0;
    if (!d) {
        return errno == ENOENT ? 0 : fsdp_err(FSDP_ERR_IO, "%s: cannot list: %s", root,
                                              strerror(errno));
    }
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, FSDP_CKPT_TMP_PREFIX, strlen(FSDP_CKPT_TMP_PREFIX)) != 0) {
            continue;
        }
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(*out, cap * sizeof(**out));
            if (!grown) {
                closedir(d);
                return fsdp_err(FSDP_ERR_NOMEM, "%s: listing leftovers", root);
            }
            *out = grown;
        }
        if (!((*out)[*n] = strdup(e->d_name))) {
            closedir(d);
            return fsdp_err(FSDP_ERR_NOMEM, "%s: listing leftovers", root);
        }
        (*n)++;
    }
    closedir(d);
    return 0;
}

/* Whether step is among those rep says were (or would be) restored. */
static int commit_restored(const struct fsdp_ckpt_recovery *rep, long step)
{
    int n = rep->n_restored < 8 ? rep->n_restored : 8;
    for (int i = 0; i < n; i++) {
        if (rep->restored[i] == step) {
            return 1;
        }
    }
    return 0;
}

/* An aside copy back under its step's name when that is missing, else
 * deleted; dry: only counted (a second copy of a step counted as restored
 * would then be deleted). */
static int commit_recover_aside(const char *root, const char *name, long step,
                                struct fsdp_ckpt_recovery *rep, int dry)
{
    char path[COMMIT_PATH_MAX], final[COMMIT_PATH_MAX];
    struct stat st;
    FSDP_CHECK(commit_path(path, sizeof(path), root, "%s/%s", root, name));
    FSDP_CHECK(commit_path(final, sizeof(final), root, "%s/step_%ld", root, step));
    if (lstat(final, &st) == 0 || (dry && commit_restored(rep, step))) {
        rep->n_removed++;
        return dry ? 0 : fsdp_file_rmtree(path);
    }
    if (errno != ENOENT) {
        return fsdp_err(FSDP_ERR_IO, "%s: %s", final, strerror(errno));
    }
    if (dry) {
        if ((size_t)rep->n_restored < sizeof(rep->restored) / sizeof(rep->restored[0])) {
            rep->restored[rep->n_restored] = step;
        }
        rep->n_restored++;
        return 0;
    }
    if (rename(path, final) != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot restore it as %s: %s", path, final,
                        strerror(errno));
    }
    if ((size_t)rep->n_restored < sizeof(rep->restored) / sizeof(rep->restored[0])) {
        rep->restored[rep->n_restored] = step;
    }
    rep->n_restored++;
    return fsdp_file_fsync_dir(root);
}

static int commit_recover_names(const char *root, char **names, size_t n,
                                struct fsdp_ckpt_recovery *rep, int dry)
{
    char path[COMMIT_PATH_MAX];
    /* aside copies first: they are the only leftovers that may hold data */
    for (size_t i = 0; i < n; i++) {
        long step = fsdp_ckpt_commit_aside_step(names[i]);
        if (step >= 0) {
            FSDP_CHECK(commit_recover_aside(root, names[i], step, rep, dry));
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (fsdp_ckpt_commit_aside_step(names[i]) >= 0) {
            continue;
        }
        rep->n_removed++;
        if (!dry) {
            FSDP_CHECK(commit_path(path, sizeof(path), root, "%s/%s", root, names[i]));
            FSDP_CHECK(fsdp_file_rmtree(path));
        }
    }
    return rep->n_removed > 0 && !dry ? fsdp_file_fsync_dir(root) : 0;
}

static int commit_recover(const char *root, struct fsdp_ckpt_recovery *rep, int dry)
{
    char **names;
    size_t n;
    char link[COMMIT_PATH_MAX];
    struct stat st;
    memset(rep, 0, sizeof(*rep));
    int rc = commit_list_tmp(root, &names, &n);
    if (rc == 0) {
        rc = commit_recover_names(root, names, n, rep, dry);
    }
    for (size_t i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
    FSDP_CHECK(rc);
    commit_latest_target(root, rep->latest_target, sizeof(rep->latest_target));
    if (rep->latest_target[0]) {
        FSDP_CHECK(commit_path(link, sizeof(link), root, "%s/%s", root, FSDP_CKPT_LATEST));
        rep->latest_missing = stat(link, &st) != 0;
    }
    return 0;
}

int fsdp_ckpt_commit_recover(const char *root, struct fsdp_ckpt_recovery *rep)
{
    return commit_recover(root, rep, 0);
}

int fsdp_ckpt_commit_scan(const char *root, struct fsdp_ckpt_recovery *rep)
{
    return commit_recover(root, rep, 1);
}
