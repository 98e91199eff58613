/*
 * test_ckpt_commit.c - the checkpoint directory commit (io/ckpt/ckpt_commit.h)
 * and the file helpers under it (io/util/fileutil.h): the layout a commit leaves
 * (step_<N>, latest, no .tmp_ leftovers, a step written twice replaced,
 * with and without an atomic exchange), removal, recovery of a root left by
 * a crash, their refusals, and the order of their fsyncs and renames. The
 * order is read from fsync, rename, renameat2 and symlink wrappers that
 * this program puts in front of libc's (the library is linked statically,
 * so its calls land here), so a commit that renames before the directory is
 * on disk, or forgets the fsync of the root, fails here. Crashes at every
 * call are tests/ckpt/test_ckpt_crash's.
 */
#include "config.h"
#include "core/error.h"
#include "io/ckpt/ckpt_commit.h"
#include "io/util/fileutil.h"
#include "tests/tap.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// the call log

#define EV_MAX 256
#define EV_LEN (2 * PATH_MAX + 16)

static char events[EV_MAX][EV_LEN]; /* "fsync P", "rename A B", "exchange A B", "symlink T L" */
static int n_events;
static int refuse_exchange; /* renameat2(RENAME_EXCHANGE) fails with EINVAL, as on NFS */

static void ev_add(const char *fmt, ...)
{
    if (n_events < EV_MAX) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(events[n_events++], EV_LEN, fmt, ap);
        va_end(ap);
    }
}

int fsync(int fd)
{
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof(path) - 1);
    path[n > 0 ? n : 0] = '\0';
    ev_add("fsync %s", path);
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int rename(const char *from, const char *to)
{
    ev_add("rename %s %s", from, to);
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    return real(from, to);
}

int renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags)
{
    if (flags & RENAME_EXCHANGE) {
        if (refuse_exchange) {
            errno = EINVAL;
            return -1;
        }
        ev_add("exchange %s %s", from, to);
    } else {
        ev_add("renameat2 %s %s", from, to);
    }
    int (*real)(int, const char *, int, const char *, unsigned) =
        (int (*)(int, const char *, int, const char *, unsigned))dlsym(RTLD_NEXT, "renameat2");
    return real(fd1, from, fd2, to, flags);
}

int symlink(const char *target, const char *link)
{
    ev_add("symlink %s %s", target, link);
    int (*real)(const char *, const char *) =
        (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "symlink");
    return real(target, link);
}

/* Index of the first event from `from` on that equals the formatted text, or -1. */
__attribute__((format(printf, 2, 3))) static int ev_find(int from, const char *fmt, ...)
{
    char want[EV_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(want, sizeof(want), fmt, ap);
    va_end(ap);
    for (int i = from < 0 ? n_events : from; i < n_events; i++) {
        if (strcmp(events[i], want) == 0) {
            return i;
        }
    }
    return -1;
}

static void ev_dump(void)
{
    for (int i = 0; i < n_events; i++) {
        tap_diag("call %d: %s", i, events[i]);
    }
}

// ----------------------------------------------------------------------------
// helpers

static char root[PATH_MAX]; /* the checkpoint root, an absolute path without links */

static void put_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    if (fp) {
        fputs(text, fp);
        fclose(fp);
    }
}

static int file_is(const char *path, const char *text)
{
    char buf[256] = {0};
    FILE *fp = fopen(path, "r");
    if (!fp) {
        return 0;
    }
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    fclose(fp);
    buf[n] = '\0';
    return strcmp(buf, text) == 0;
}

static int latest_is(const char *target)
{
    char link[PATH_MAX + 16], got[PATH_MAX];
    snprintf(link, sizeof(link), "%s/latest", root);
    ssize_t n = readlink(link, got, sizeof(got) - 1);
    got[n > 0 ? n : 0] = '\0';
    if (strcmp(got, target) != 0) {
        tap_diag("latest -> '%s', expected '%s'", got, target);
        return 0;
    }
    return 1;
}

/* Entries of root that start with the temporary prefix. */
static int leftovers(void)
{
    DIR *d = opendir(root);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, FSDP_CKPT_TMP_PREFIX, strlen(FSDP_CKPT_TMP_PREFIX)) == 0) {
            tap_diag("leftover %s", e->d_name);
            n++;
        }
    }
    if (d) {
        closedir(d);
    }
    return n;
}

/* A finished temporary step directory holding one file "a" with text. */
static void make_step(char *tmp, size_t len, long step, unsigned nonce, const char *text)
{
    fsdp_ckpt_commit_tmp_path(tmp, len, root, step, nonce);
    mkdir(tmp, 0755);
    put_file(tmp, "a", text);
}

// ----------------------------------------------------------------------------
// tests

static void test_tmp_path(void)
{
    char buf[64], tiny[8];
    tap_ok(fsdp_ckpt_commit_tmp_path(buf, sizeof(buf), "D", 7, 0xabu) == 0 &&
               strcmp(buf, "D/.tmp_step_7_000000ab") == 0,
           "temporary step directory name: D/.tmp_step_<N>_<nonce> ('%s')", buf);
    fsdp_err_clear();
    tap_ok(fsdp_ckpt_commit_tmp_path(tiny, sizeof(tiny), "D", 7, 1) == FSDP_ERR_INVALID,
           "a name that does not fit is an error, not a truncated path");
    fsdp_err_clear();
}

static void test_step(void)
{
    char tmp[PATH_MAX], path[PATH_MAX + 32];
    make_step(tmp, sizeof(tmp), 3, 0x11u, "one");
    n_events = 0;
    int rc = fsdp_ckpt_commit_step(root, tmp, 3, 0x11u);
    snprintf(path, sizeof(path), "%s/step_3/a", root);
    tap_ok(rc == 0 && file_is(path, "one") && latest_is("step_3") && leftovers() == 0,
           "commit of step 3: step_3/ with its file, latest -> step_3, no leftovers (rc %d %s)",
           rc, fsdp_err_msg());

    /* fsync(tmp) < rename(tmp, step) < fsync(root) < symlink < rename over latest < fsync(root) */
    int a = ev_find(0, "fsync %s", tmp);
    int b = ev_find(a, "rename %s %s/step_3", tmp, root);
    int c = ev_find(b, "fsync %s", root);
    int d = ev_find(c, "symlink step_3 %s/.tmp_latest_00000011", root);
    int e = ev_find(d, "rename %s/.tmp_latest_00000011 %s/latest", root, root);
    int f = ev_find(e, "fsync %s", root);
    int ok = a >= 0 && b > a && c > b && d > c && e > d && f > e;
    if (!ok) {
        tap_diag("positions: fsync tmp %d, rename %d, fsync root %d, symlink %d, rename latest %d, "
                 "fsync root %d", a, b, c, d, e, f);
        ev_dump();
    }
    tap_ok(ok, "order: fsync of the step directory, rename to step_3, fsync of the root, "
           "symlink, rename over latest, fsync of the root");

    /* written again: tmp and step_3 trade places, and only then does latest move */
    make_step(tmp, sizeof(tmp), 3, 0x22u, "two");
    n_events = 0;
    rc = fsdp_ckpt_commit_step(root, tmp, 3, 0x22u);
    a = ev_find(0, "fsync %s", tmp);
    b = ev_find(a, "exchange %s %s/step_3", tmp, root);
    c = ev_find(b, "fsync %s", root);
    d = ev_find(c, "rename %s/.tmp_latest_00000022 %s/latest", root, root);
    ok = a >= 0 && b > a && c > b && d > c;
    tap_ok(rc == 0 && file_is(path, "two") && latest_is("step_3") && leftovers() == 0 && ok,
           "step 3 written again: fsync, exchange with step_3, fsync of the root, latest; the "
           "older copy removed (rc %d %s)", rc, fsdp_err_msg());
    if (!ok) {
        ev_dump();
    }

    /* no exchange: the older copy waits under the aside name, then goes */
    refuse_exchange = 1;
    make_step(tmp, sizeof(tmp), 3, 0x23u, "three");
    n_events = 0;
    rc = fsdp_ckpt_commit_step(root, tmp, 3, 0x23u);
    refuse_exchange = 0;
    a = ev_find(0, "fsync %s", tmp);
    b = ev_find(a, "rename %s/step_3 %s/.tmp_old_step_3_00000023", root, root);
    c = ev_find(b, "rename %s %s/step_3", tmp, root);
    d = ev_find(c, "fsync %s", root);
    e = ev_find(d, "rename %s/.tmp_latest_00000023 %s/latest", root, root);
    f = ev_find(e, "rename %s/.tmp_old_step_3_00000023 %s/.tmp_gone_step_3_00000023", root, root);
    ok = a >= 0 && b > a && c > b && d > c && e > d && f > e;
    tap_ok(rc == 0 && file_is(path, "three") && latest_is("step_3") && leftovers() == 0 && ok,
           "without an exchange: fsync, step_3 aside, tmp to step_3, fsync of the root, latest, "
           "the aside copy renamed away and removed (rc %d %s)", rc, fsdp_err_msg());
    if (!ok) {
        ev_dump();
    }

    make_step(tmp, sizeof(tmp), 5, 0x33u, "five");
    rc = fsdp_ckpt_commit_step(root, tmp, 5, 0x33u);
    tap_ok(rc == 0 && latest_is("step_5") && file_is(path, "three") && leftovers() == 0,
           "commit of step 5: latest -> step_5, step_3 kept (rc %d %s)", rc, fsdp_err_msg());
}

static void test_remove(void)
{
    char tmp[PATH_MAX], path[PATH_MAX + 32];
    make_step(tmp, sizeof(tmp), 6, 0x44u, "six");
    fsdp_ckpt_commit_step(root, tmp, 6, 0x44u);
    snprintf(path, sizeof(path), "%s/step_6", root);
    fsdp_err_clear();
    int rc = fsdp_ckpt_commit_remove(root, 6, 0x45u);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "latest names it") &&
               access(path, F_OK) == 0,
           "the step latest names is not removed ('%s')", fsdp_err_msg());
    fsdp_err_clear();

    snprintf(path, sizeof(path), "%s/step_5", root);
    n_events = 0;
    rc = fsdp_ckpt_commit_remove(root, 5, 0x46u);
    int a = ev_find(0, "rename %s %s/.tmp_gone_step_5_00000046", path, root);
    int b = ev_find(a, "fsync %s", root);
    tap_ok(rc == 0 && access(path, F_OK) != 0 && leftovers() == 0 && a >= 0 && b > a,
           "removal: renamed to .tmp_gone_, root fsynced, then deleted (rc %d %s)", rc,
           fsdp_err_msg());
    if (!(a >= 0 && b > a)) {
        ev_dump();
    }
    tap_ok(fsdp_ckpt_commit_remove(root, 5, 0x47u) == 0, "removal of a missing step is no error");
    fsdp_err_clear();
}

/* A root as crashes leave it, put back in order. */
static void test_recover(void)
{
    char dir[PATH_MAX + 64], path[PATH_MAX + 64], link[PATH_MAX + 16];
    struct fsdp_ckpt_recovery rep;
    /* step 7 moved aside by a save that died before its replacement arrived */
    snprintf(dir, sizeof(dir), "%s/.tmp_old_step_7_0000aaaa", root);
    mkdir(dir, 0755);
    put_file(dir, "a", "seven");
    /* step 3 aside, but its replacement is in place */
    snprintf(dir, sizeof(dir), "%s/.tmp_old_step_3_0000bbbb", root);
    mkdir(dir, 0755);
    put_file(dir, "a", "old three");
    snprintf(dir, sizeof(dir), "%s/.tmp_step_9_0000cccc", root);
    mkdir(dir, 0755);
    put_file(dir, "a", "unfinished");
    snprintf(dir, sizeof(dir), "%s/.tmp_latest_0000dddd", root);
    symlink("step_9", dir);
    snprintf(link, sizeof(link), "%s/latest", root);
    unlink(link);
    symlink("step_7", link);
    n_events = 0;
    int rc = fsdp_ckpt_commit_recover(root, &rep);
    snprintf(path, sizeof(path), "%s/step_7/a", root);
    char three[PATH_MAX + 32];
    snprintf(three, sizeof(three), "%s/step_3/a", root);
    int back = ev_find(0, "rename %s/.tmp_old_step_7_0000aaaa %s/step_7", root, root);
    tap_ok(rc == 0 && rep.n_restored == 1 && rep.restored[0] == 7 && rep.n_removed == 3 &&
               file_is(path, "seven") && file_is(three, "three") && leftovers() == 0 &&
               latest_is("step_7") && !rep.latest_missing && back >= 0 &&
               ev_find(back, "fsync %s", root) > back,
           "recovery: step_7 back from its aside copy (latest names it again), the aside copy "
           "of the present step_3 and the other leftovers removed (rc %d, %d restored, %d "
           "removed)", rc, rep.n_restored, rep.n_removed);

    unlink(link);
    symlink("step_8", link);
    rc = fsdp_ckpt_commit_recover(root, &rep);
    tap_ok(rc == 0 && rep.latest_missing && strcmp(rep.latest_target, "step_8") == 0 &&
               rep.n_removed == 0 && rep.n_restored == 0,
           "recovery reports a latest that names a missing step ('%s')", rep.latest_target);
    unlink(link);
    symlink("step_7", link);
    snprintf(dir, sizeof(dir), "%s/nowhere", root);
    tap_ok(fsdp_ckpt_commit_recover(dir, &rep) == 0 && !rep.latest_target[0],
           "recovery of a root that does not exist yet is no error");
    fsdp_err_clear();
}

static void test_dir(void)
{
    char tmp[PATH_MAX + 16], out[PATH_MAX + 16], path[PATH_MAX + 32];
    snprintf(tmp, sizeof(tmp), "%s/out.tmp_1", root);
    snprintf(out, sizeof(out), "%s/out", root);
    mkdir(tmp, 0755);
    put_file(tmp, "a", "x");
    n_events = 0;
    int rc = fsdp_ckpt_commit_dir(tmp, out);
    int a = ev_find(0, "fsync %s", tmp);
    int b = ev_find(a, "rename %s %s", tmp, out);
    int c = ev_find(b, "fsync %s", root);
    snprintf(path, sizeof(path), "%s/a", out);
    tap_ok(rc == 0 && file_is(path, "x") && a >= 0 && b > a && c > b,
           "a bare step directory: fsync, rename, fsync of its parent (rc %d %s)", rc,
           fsdp_err_msg());
    if (!(a >= 0 && b > a && c > b)) {
        ev_dump();
    }

    mkdir(tmp, 0755);
    put_file(tmp, "a", "y");
    fsdp_err_clear();
    rc = fsdp_ckpt_commit_dir(tmp, out);
    tap_ok(rc == FSDP_ERR_IO && strstr(fsdp_err_msg(), "rename to") && access(tmp, F_OK) == 0 &&
               file_is(path, "x"),
           "a target that holds files is refused and left alone ('%s')", fsdp_err_msg());
    fsdp_err_clear();

    /* a relative target: its parent is the working directory */
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) && chdir(root) == 0) {
        n_events = 0;
        rc = fsdp_ckpt_commit_dir("out.tmp_1", "rel");
        int r = ev_find(0, "rename out.tmp_1 rel");
        int s = ev_find(r, "fsync %s", root);
        tap_ok(rc == 0 && r >= 0 && s > r, "a relative target: fsync of '.' after the rename "
               "(rc %d %s)", rc, fsdp_err_msg());
        if (chdir(cwd) != 0) {
            tap_diag("cannot return to %s", cwd);
        }
    }
    fsdp_err_clear();
}

static void test_files(void)
{
    char src[PATH_MAX + 16], dst[PATH_MAX + 16], missing[PATH_MAX + 16];
    snprintf(src, sizeof(src), "%s/f.tmp", root);
    snprintf(dst, sizeof(dst), "%s/f", root);
    snprintf(missing, sizeof(missing), "%s/nope", root);
    put_file(root, "f.tmp", "data");
    n_events = 0;
    int rc = fsdp_file_commit(src, dst);
    int a = ev_find(0, "fsync %s", src);
    int b = ev_find(a, "rename %s %s", src, dst);
    int c = ev_find(b, "fsync %s", root);
    tap_ok(rc == 0 && file_is(dst, "data") && a >= 0 && b > a && c > b,
           "one file: fsync, rename, fsync of its directory (rc %d %s)", rc, fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_file_fsync_dir(missing);
    tap_ok(rc == FSDP_ERR_IO && strstr(fsdp_err_msg(), "cannot open for fsync"),
           "fsync of a missing directory names it ('%s')", fsdp_err_msg());
    fsdp_err_clear();
    tap_ok(fsdp_file_fsync(missing) == FSDP_ERR_IO, "fsync of a missing file is an error");
    fsdp_err_clear();
}

static void test_rmtree(void)
{
    char tree[PATH_MAX + 16], sub[PATH_MAX + 32], keep[PATH_MAX + 16], link[PATH_MAX + 48];
    char kept[PATH_MAX + 32];
    snprintf(tree, sizeof(tree), "%s/tree", root);
    snprintf(sub, sizeof(sub), "%s/tree/sub", root);
    snprintf(keep, sizeof(keep), "%s/keep", root);
    snprintf(link, sizeof(link), "%s/tree/sub/link", root);
    snprintf(kept, sizeof(kept), "%s/keep/k", root);
    mkdir(tree, 0755);
    mkdir(sub, 0755);
    mkdir(keep, 0755);
    put_file(sub, "x", "x");
    put_file(keep, "k", "k");
    symlink(keep, link);
    int rc = fsdp_file_rmtree(tree);
    tap_ok(rc == 0 && access(tree, F_OK) != 0 && file_is(kept, "k"),
           "rmtree removes the tree, not what a link in it points to (rc %d %s)", rc,
           fsdp_err_msg());
    tap_ok(fsdp_file_rmtree(tree) == 0, "rmtree of a missing path is no error");
    fsdp_file_rmtree(keep);
    fsdp_err_clear();
}

/* What test_scan's callback saw: the steps, and the leftovers' names. */
struct scan_seen {
    long sum; /* of the steps */
    int steps, tmps, stop_after;
};

static int scan_note(const char *name, long step, void *arg)
{
    struct scan_seen *w = arg;
    if (step >= 0) {
        w->steps++;
        w->sum += step;
    } else if (strncmp(name, FSDP_CKPT_TMP_PREFIX, strlen(FSDP_CKPT_TMP_PREFIX)) == 0) {
        w->tmps++;
    } else {
        w->tmps = -1000; /* neither: never passed */
    }
    return w->stop_after && w->steps + w->tmps == w->stop_after ? 7 : 0;
}

static void test_scan(void)
{
    static const struct {
        const char *name;
        long step;
    } names[] = {{"step_12", 12},
                 {"step_0", 0},
                 {"step_05", 5},
                 {"step_", -1},
                 {"step_+5", -1},
                 {"step_ 5", -1},
                 {"step_5x", -1},
                 {"step_-1", -1},
                 {"step", -1},
                 {"latest", -1},
                 {".tmp_step_3_0000000a", -1},
                 {"step_99999999999999999999999", -1}};
    int bad = -1;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && bad < 0; i++) {
        bad = fsdp_ckpt_step_of(names[i].name) == names[i].step ? -1 : (int)i;
    }
    tap_ok(bad < 0, "step directory names: step_<digits> only (%s)",
           bad < 0 ? "all" : names[bad].name);

    char dir[PATH_MAX + 16];
    snprintf(dir, sizeof(dir), "%s/scan", root);
    mkdir(dir, 0755);
    const char *entries[] = {"step_2", "step_10", ".tmp_step_4_00000001", "step_x", "latest"};
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        put_file(dir, entries[i], "x");
    }
    struct scan_seen all = {0}, steps = {0}, stop = {.stop_after = 1};
    int a = fsdp_ckpt_step_scan(dir, 1, scan_note, &all);
    int b = fsdp_ckpt_step_scan(dir, 0, scan_note, &steps);
    int c = fsdp_ckpt_step_scan(dir, 1, scan_note, &stop);
    tap_ok(a == 0 && all.steps == 2 && all.sum == 12 && all.tmps == 1 && b == 0 &&
               steps.steps == 2 && steps.sum == 12 && steps.tmps == 0,
           "scan: the step directories, and the leftovers when asked (%d steps, %d leftovers)",
           all.steps, all.tmps);
    tap_ok(c == 7 && stop.steps + stop.tmps == 1,
           "scan: a callback's nonzero stops it and is "
           "returned (%d)",
           c);
    fsdp_file_rmtree(dir);
    int rc = fsdp_ckpt_step_scan(dir, 1, scan_note, &all);
    tap_ok(rc == FSDP_ERR_IO && strstr(fsdp_err_msg(), "/scan: cannot list: "),
           "scan: a missing root is an error naming it (%s)", fsdp_err_msg());
    fsdp_err_clear();
}

int main(void)
{
    char made[] = "/tmp/fsdpc-commit.XXXXXX";
    if (!mkdtemp(made) || !realpath(made, root)) {
        tap_skip("cannot create a temporary directory");
        return tap_done();
    }
    if (access("/proc/self/fd", R_OK) != 0) {
        tap_skip("no /proc/self/fd to name the fsynced files");
        rmdir(made);
        return tap_done();
    }
    test_tmp_path();
    test_step();
    test_remove();
    test_recover();
    test_dir();
    test_files();
    test_rmtree();
    test_scan();
    fsdp_file_rmtree(root);
    return tap_done();
}
