/*
 * test_ckpt_crash.c - the checkpoint commit protocol under a crash at every
 * boundary (io/ckpt/ckpt_commit.h). A save (the trainer's: mkdir of the
 * temporary step directory, each file created, written and fsynced, then
 * fsdp_ckpt_commit_step) and a retention removal run in a child that
 * crash_shim kills before its k-th file-system call, for every k until the
 * action completes; then a restart: fsdp_ckpt_commit_recover, itself killed
 * before each of its calls and run again to completion. After every trial
 * the root must hold every step committed before the action in its old or
 * new version, complete (never a partial step under a step_<N> name),
 * latest must name the old or the new latest checkpoint, and nothing named
 * .tmp_ may remain. Each trial starts from a copy of the same root and the
 * nonces are fixed, so trial (k, j) is the same every time it runs.
 *
 * The same checker, given the startup cleanup the trainer had before
 * recovery existed (every .tmp_* deleted), must find lost checkpoints: a
 * checker that cannot fail proves nothing.
 */
#include "config.h"
#include "core/error.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "tests/ckpt/crash_shim.h"
#include "tests/tap.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_STEP 4
#define NFILES 3
#define SAVE_NONCE 0x5a5a0001u
#define PROBLEM_LEN 512

static const char *const files[NFILES] = {"shard_0.h5", "shard_1.h5", "index.h5"};

/* What a root holds: the version of each step ("" absent), and latest. */
struct root_state {
    const char *ver[MAX_STEP + 1]; /* (MAX_STEP + 1) indexed by step */
    long latest;                   /* -1: no latest */
};

enum action { SAVE, REMOVE };

struct scenario {
    const char *name;
    const char *setup;  /* committed in order, "<step><version> ...": latest is the last */
    enum action action;
    long step;
    const char *ver;    /* SAVE: the new version of step */
    int no_exchange;    /* renameat2(RENAME_EXCHANGE) refused, as on NFS */
};

static const struct scenario scenarios[] = {
    {"first save of step 3", "1a 2a", SAVE, 3, "b", 0},
    {"step 2 saved again, latest names it", "1a 2a", SAVE, 2, "b", 0},
    {"step 2 saved again, latest names it, no exchange", "1a 2a", SAVE, 2, "b", 1},
    {"step 2 saved again below latest step_3 (a resumed run)", "1a 2a 3a", SAVE, 2, "b", 0},
    {"step 2 saved again below latest step_3, no exchange", "1a 2a 3a", SAVE, 2, "b", 1},
    {"step 1 removed (retention)", "1a 2a", REMOVE, 1, NULL, 0},
};
#define N_SCENARIOS (sizeof(scenarios) / sizeof(scenarios[0]))

static char base[PATH_MAX]; /* the test's directory, without links */

// ----------------------------------------------------------------------------
// writing and copying roots

static int put_file(const char *dir, const char *name, const char *text, int sync)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        return -1;
    }
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && (!sync || fsync(fd) == 0);
    return close(fd) == 0 && ok ? 0 : -1;
}

static void file_text(char *buf, size_t len, long step, const char *ver, const char *file)
{
    snprintf(buf, len, "step %ld version %s file %s\n", step, ver, file);
}

/* What the trainer does for a save of step: the temporary directory, each
 * file written and fsynced by its writer, then the commit. */
static int save_step(const char *root, long step, const char *ver, unsigned nonce)
{
    char tmp[PATH_MAX], text[128];
    if (fsdp_ckpt_commit_tmp_path(tmp, sizeof(tmp), root, step, nonce) < 0 || mkdir(tmp, 0755)) {
        return -1;
    }
    for (int i = 0; i < NFILES; i++) {
        file_text(text, sizeof(text), step, ver, files[i]);
        if (put_file(tmp, files[i], text, 1) < 0) {
            return -1;
        }
    }
    return fsdp_ckpt_commit_step(root, tmp, step, nonce);
}

static int copy_tree(const char *src, const char *dst)
{
    DIR *d = opendir(src);
    struct dirent *e;
    int rc = d && mkdir(dst, 0755) == 0 ? 0 : -1;
    while (rc == 0 && (e = readdir(d))) {
        char from[PATH_MAX], to[PATH_MAX], buf[PATH_MAX];
        struct stat st;
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) {
            continue;
        }
        snprintf(from, sizeof(from), "%s/%s", src, e->d_name);
        snprintf(to, sizeof(to), "%s/%s", dst, e->d_name);
        if (lstat(from, &st) != 0) {
            rc = -1;
        } else if (S_ISDIR(st.st_mode)) {
            rc = copy_tree(from, to);
        } else if (S_ISLNK(st.st_mode)) {
            ssize_t n = readlink(from, buf, sizeof(buf) - 1);
            buf[n > 0 ? n : 0] = '\0';
            rc = n > 0 && symlink(buf, to) == 0 ? 0 : -1;
        } else {
            FILE *fp = fopen(from, "r");
            size_t n = fp ? fread(buf, 1, sizeof(buf) - 1, fp) : 0;
            buf[n] = '\0';
            if (fp) {
                fclose(fp);
            }
            rc = fp ? put_file(dst, e->d_name, buf, 0) : -1;
        }
    }
    if (d) {
        closedir(d);
    }
    return rc;
}

/* The root a scenario starts from, and the states before and after its action. */
static int make_template(const struct scenario *s, const char *dir, struct root_state *before,
                         struct root_state *after)
{
    static const char *const vers[] = {"a", "b"};
    memset(before, 0, sizeof(*before));
    before->latest = -1;
    if (mkdir(dir, 0755) != 0) {
        return -1;
    }
    unsigned nonce = 0x100;
    for (const char *p = s->setup; *p; p++) {
        if (*p < '1' || *p > '0' + MAX_STEP) {
            continue;
        }
        long step = *p - '0';
        const char *ver = p[1] == 'b' ? vers[1] : vers[0];
        if (save_step(dir, step, ver, nonce++) < 0) {
            return -1;
        }
        before->ver[step] = ver;
        before->latest = step;
    }
    *after = *before;
    if (s->action == SAVE) {
        after->ver[s->step] = s->ver;
        after->latest = s->step;
    } else {
        after->ver[s->step] = NULL;
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the checker

/* The version every file of root/step_<step> holds: "a"/"b", NULL when the
 * directory is missing, "?" when a file is missing, extra or mixed. */
static const char *step_version(const char *root, long step)
{
    char dir[PATH_MAX + 32], path[PATH_MAX + 64], want[128], got[256];
    const char *found = NULL;
    int n_entries = 0;
    snprintf(dir, sizeof(dir), "%s/step_%ld", root, step);
    DIR *d = opendir(dir);
    if (!d) {
        return NULL;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        n_entries += e->d_name[0] != '.';
    }
    closedir(d);
    if (n_entries != NFILES) {
        return "?";
    }
    static const char *const vers[] = {"a", "b"};
    for (int i = 0; i < NFILES; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        FILE *fp = fopen(path, "r");
        size_t n = fp ? fread(got, 1, sizeof(got) - 1, fp) : 0;
        got[n] = '\0';
        if (fp) {
            fclose(fp);
        }
        const char *v = NULL;
        for (int k = 0; k < 2; k++) {
            file_text(want, sizeof(want), step, vers[k], files[i]);
            if (strcmp(got, want) == 0) {
                v = vers[k];
            }
        }
        if (!v || (found && strcmp(v, found) != 0)) {
            return "?";
        }
        found = v;
    }
    return found;
}

static int same_ver(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/*
 * Checks root against the states before and after the action; returns the
 * checkpoints lost (a step committed before and after missing or damaged,
 * latest naming nothing or a checkpoint of neither state) and puts the
 * first problem, lost or not (a leftover, a partial new step), in why.
 */
static int check_root(const char *root, const struct root_state *before,
                      const struct root_state *after, char *why, size_t len)
{
    int lost = 0;
    why[0] = '\0';
#define PROBLEM(...) (why[0] ? 0 : snprintf(why, len, __VA_ARGS__))
    for (long s = 1; s <= MAX_STEP; s++) {
        const char *v = step_version(root, s);
        if (v && (same_ver(v, before->ver[s]) || same_ver(v, after->ver[s]))) {
            continue;
        }
        if (!v && (!before->ver[s] || !after->ver[s])) {
            continue; /* not committed yet, or being removed */
        }
        if (before->ver[s]) {
            lost++;
        }
        PROBLEM("step_%ld is %s (before: %s, after: %s)", s, v ? (strcmp(v, "?") ? v : "partial")
                : "missing", before->ver[s] ? before->ver[s] : "none",
                after->ver[s] ? after->ver[s] : "none");
    }
    char link[PATH_MAX + 16], target[64];
    snprintf(link, sizeof(link), "%s/latest", root);
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    target[n > 0 ? n : 0] = '\0';
    long t = strncmp(target, "step_", 5) == 0 ? atol(target + 5) : -1;
    const char *tv = t >= 1 && t <= MAX_STEP ? step_version(root, t) : NULL;
    int old_ok = t == before->latest && same_ver(tv, before->ver[t > 0 ? t : 0]);
    int new_ok = t == after->latest && same_ver(tv, after->ver[t > 0 ? t : 0]);
    if (before->latest >= 0 && !old_ok && !new_ok) {
        lost++;
        PROBLEM("latest -> '%s' (%s), expected step_%ld or step_%ld", target,
                tv ? tv : "missing", before->latest, after->latest);
    }
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, FSDP_CKPT_TMP_PREFIX, strlen(FSDP_CKPT_TMP_PREFIX)) == 0) {
            PROBLEM("leftover %s", e->d_name);
        }
    }
    if (d) {
        closedir(d);
    }
#undef PROBLEM
    return lost;
}

// ----------------------------------------------------------------------------
// crashing children

enum { RAN_OK, RAN_CRASHED, RAN_FAILED };

/* Runs the scenario's action (what 0) or recovery (what 1) in a child that
 * dies before call k (0: never); calls, when not NULL, gets the child's
 * notes. */
static int run_child(const struct scenario *s, const char *root, int what, long k, char *calls,
                     size_t len)
{
    int fds[2];
    if (pipe(fds) != 0) {
        return RAN_FAILED;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        crash_shim_arm(k, root, calls ? fds[1] : -1, s->no_exchange);
        int rc;
        if (what == 0) {
            rc = s->action == SAVE ? save_step(root, s->step, s->ver, SAVE_NONCE)
                                   : fsdp_ckpt_commit_remove(root, s->step, SAVE_NONCE);
        } else {
            struct fsdp_ckpt_recovery rep;
            rc = fsdp_ckpt_commit_recover(root, &rep);
        }
        _exit(rc == 0 ? 0 : 1);
    }
    close(fds[1]);
    size_t used = 0;
    ssize_t n;
    char sink[4096];
    while ((n = read(fds[0], calls && used + 1 < len ? calls + used : sink,
                     calls && used + 1 < len ? len - used - 1 : sizeof(sink))) > 0) {
        used += calls && used + 1 < len ? (size_t)n : 0;
    }
    if (calls) {
        calls[used] = '\0';
    }
    close(fds[0]);
    int st;
    if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
        return RAN_FAILED;
    }
    return WEXITSTATUS(st) == CRASH_SHIM_STATUS ? RAN_CRASHED
           : WEXITSTATUS(st) == 0               ? RAN_OK
                                                : RAN_FAILED;
}

/* The startup cleanup before recovery existed: every .tmp_* deleted. */
static void legacy_cleanup(const char *root)
{
    DIR *d = opendir(root);
    struct dirent *e;
    char path[PATH_MAX + 300];
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, FSDP_CKPT_TMP_PREFIX, strlen(FSDP_CKPT_TMP_PREFIX)) == 0) {
            snprintf(path, sizeof(path), "%s/%s", root, e->d_name);
            fsdp_file_rmtree(path);
        }
    }
    if (d) {
        closedir(d);
    }
}

/* "mkdir open write fsync ..." from the notes "<k> <call> <paths>\n"... */
static void call_names(const char *notes, char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (const char *p = notes; *p && used + 1 < len;) {
        const char *call = strchr(p, ' ');
        const char *end = call ? strchr(call + 1, ' ') : NULL;
        const char *eol = strchr(p, '\n');
        if (!call || !end || !eol) {
            break;
        }
        int w = snprintf(out + used, len - used, "%s%.*s", used ? " " : "", (int)(end - call - 1),
                         call + 1);
        used += w > 0 ? (size_t)w : 0;
        p = eol + 1;
    }
}

// ----------------------------------------------------------------------------
// the scenarios

struct tally {
    long save_points;    /* crash points of actions */
    long restart_points; /* crash points of recoveries */
    long trials;
    long lost;
};

/* One trial: a fresh copy of the template, the action killed before call
 * k, recovery killed before call j (0: not killed), recovery to the end,
 * the check. Returns -1 on a harness failure, else whether the action and
 * the killed recovery crashed (bit 0, bit 1); *lost and why from the check. */
static int trial(const struct scenario *s, const char *tpl, long k, long j, int legacy,
                 const struct root_state *before, const struct root_state *after, int *lost,
                 char *why)
{
    char root[PATH_MAX + 16];
    snprintf(root, sizeof(root), "%s/trial", base);
    fsdp_file_rmtree(root);
    if (copy_tree(tpl, root) != 0) {
        snprintf(why, PROBLEM_LEN, "cannot copy the starting root");
        return -1;
    }
    int a = run_child(s, root, 0, k, NULL, 0);
    int r = RAN_OK;
    if (!legacy && j > 0) {
        r = run_child(s, root, 1, j, NULL, 0);
    }
    if (a == RAN_FAILED || r == RAN_FAILED) {
        snprintf(why, PROBLEM_LEN, "the %s returned an error (k %ld, j %ld)",
                 a == RAN_FAILED ? "action" : "recovery", k, j);
        return -1;
    }
    struct fsdp_ckpt_recovery rep;
    if (legacy) {
        legacy_cleanup(root);
    } else if (fsdp_ckpt_commit_recover(root, &rep) < 0) {
        snprintf(why, PROBLEM_LEN, "recovery failed: %s", fsdp_err_msg());
        fsdp_err_clear();
        return -1;
    }
    *lost = check_root(root, before, after, why, PROBLEM_LEN);
    return (a == RAN_CRASHED) | (r == RAN_CRASHED) << 1;
}

/* Every crash point of the action, each followed by every crash point of
 * the recovery; legacy: the old cleanup instead, which must lose some. */
static void run_scenario(const struct scenario *s, int legacy, struct tally *tl)
{
    char tpl[PATH_MAX + 16], why[PROBLEM_LEN], first[PROBLEM_LEN + 128] = "", notes[16384];
    char names[2048];
    struct root_state before, after;
    snprintf(tpl, sizeof(tpl), "%s/template", base);
    fsdp_file_rmtree(tpl);
    if (make_template(s, tpl, &before, &after) < 0) {
        tap_ok(0, "%s: cannot make the starting root", s->name);
        return;
    }
    long K = 0, restart_points = 0, trials = 0, lost = 0, bad = 0;
    for (long k = 1;; k++) {
        int done_save = 0;
        for (long j = legacy ? 0 : 1;; j++) {
            int lost_here = 0;
            int c = trial(s, tpl, k, j, legacy, &before, &after, &lost_here, why);
            trials++;
            if (c < 0) {
                tap_ok(0, "%s: %s", s->name, why);
                return;
            }
            lost += lost_here;
            if (why[0]) {
                bad++;
                if (!first[0]) {
                    snprintf(first, sizeof(first), "crash before call %ld, recovery crash %ld: %s",
                             k, j, why);
                }
            }
            done_save = !(c & 1);
            if (legacy || !(c & 2)) {
                break; /* recovery ran to its end: no further crash point in it */
            }
            restart_points++;
        }
        if (done_save) {
            K = k - 1;
            break;
        }
    }
    if (legacy) {
        tap_diag("%s, with the old cleanup: %ld crash points, %ld checkpoints lost (%s)", s->name,
                 K, lost, first);
        tap_ok(lost > 0, "the checker finds the checkpoints the old startup cleanup lost "
               "(%s: %ld lost at %ld crash points)", s->name, lost, K);
        return;
    }
    /* the calls of the whole action, for the record */
    char root[PATH_MAX + 16];
    snprintf(root, sizeof(root), "%s/trial", base);
    fsdp_file_rmtree(root);
    copy_tree(tpl, root);
    run_child(s, root, 0, 0, notes, sizeof(notes));
    call_names(notes, names, sizeof(names));
    tap_diag("%s: K %ld: %s", s->name, K, names);
    if (first[0]) {
        tap_diag("first failure: %s", first);
    }
    tl->save_points += K;
    tl->restart_points += restart_points;
    tl->trials += trials;
    tl->lost += lost;
    tap_ok(bad == 0 && K > 0, "%s: killed before each of its %ld calls, each restart's "
           "recovery killed before each of its own (%ld points): %ld trials, %ld checkpoints "
           "lost, %ld trials with any problem", s->name, K, restart_points, trials, lost, bad);
}

int main(void)
{
    const char *tmpdir = getenv("TMPDIR");
    char made[PATH_MAX];
    snprintf(made, sizeof(made), "%s/fsdpc-crash.XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
    if (!mkdtemp(made) || !realpath(made, base)) {
        tap_skip("cannot create a temporary directory");
        return tap_done();
    }
    struct tally tl = {0, 0, 0, 0};
    for (size_t i = 0; i < N_SCENARIOS; i++) {
        run_scenario(&scenarios[i], 0, &tl);
    }
    tap_diag("in all: %zu actions, crashed before each of their %ld calls; %ld restart crash "
             "points; %ld trials; checkpoints lost: %ld", N_SCENARIOS, tl.save_points,
             tl.restart_points, tl.trials, tl.lost);
    tap_ok(tl.lost == 0, "no checkpoint lost at any of %ld crash points", tl.save_points +
           tl.restart_points);
    run_scenario(&scenarios[2], 1, &tl);
    run_scenario(&scenarios[4], 1, &tl);
    fsdp_file_rmtree(base);
    return tap_done();
}
