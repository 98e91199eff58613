/*
 * test_fileutil.c - the temporaries every io writer starts from
 * (io/util/fileutil.h): their names ("<path>.tmp.XXXXXX", different on every
 * call), what they are created as (a regular file open O_CLOEXEC with mode
 * 0644 less the umask, a directory 0755 less the umask), that an exclusive
 * create refuses a symbolic link at its name (dangling or not) instead of
 * following it, that HDF5's H5F_ACC_EXCL (which the HDF5 writers rely on)
 * does the same, that a commit's rename replaces a link at the final
 * name without writing through it, and that a failed write or commit
 * leaves no temporary behind.
 */
#include "config.h"
#include "core/error.h"
#include "io/util/fileutil.h"
#include "tests/tap.h"

#include <hdf5.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static const char *tpath(const char *name)
{
    static char buf[4][160];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* Is name "<base>.tmp." followed by six letters or digits? */
static int tmp_name_ok(const char *name, const char *base)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".tmp.", 5) != 0 ||
        strlen(name + n + 5) != 6) {
        return 0;
    }
    for (const char *c = name + n + 5; *c; c++) {
        if (!isalnum((unsigned char)*c)) {
            return 0;
        }
    }
    return 1;
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Does path hold exactly text? */
static int holds(const char *path, const char *text)
{
    char buf[256] = {0};
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f) {
        fclose(f);
    }
    return f && n == strlen(text) && memcmp(buf, text, n) == 0;
}

static void test_tmp_create(void)
{
    char *a = NULL, *b = NULL;
    int fa = -1, fb = -1;
    struct stat st;
    umask(022);
    int rc = fsdp_file_tmp_create(tpath("out.h5"), &a, &fa);
    tap_ok(rc == 0 && tmp_name_ok(a, tpath("out.h5")), "tmp_create: name '%s'", a ? a : "-");
    int ok = fa >= 0 && (fcntl(fa, F_GETFD) & FD_CLOEXEC) && fstat(fa, &st) == 0;
    tap_ok(ok && S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0644 && st.st_size == 0,
           "tmp_create: an empty regular file, mode 0644 under umask 022, close-on-exec "
           "(mode %o)", ok ? (unsigned)(st.st_mode & 07777) : 0u);
    umask(077);
    rc = fsdp_file_tmp_create(tpath("out.h5"), &b, &fb);
    umask(022);
    ok = rc == 0 && fstat(fb, &st) == 0;
    tap_ok(ok && (st.st_mode & 07777) == 0600, "tmp_create: the umask applies (077 gives %o)",
           ok ? (unsigned)(st.st_mode & 07777) : 0u);
    tap_ok(rc == 0 && strcmp(a, b) != 0, "tmp_create: a second call draws another name (%s)",
           b ? b : "-");
    close(fa);
    close(fb);
    unlink(a);
    unlink(b);
    free(a);
    free(b);

    char *c = NULL;
    int fc = 0;
    rc = fsdp_file_tmp_create(tpath("nodir/out.h5"), &c, &fc);
    tap_ok(rc == FSDP_ERR_IO && c == NULL &&
               strstr(fsdp_err_msg(), "nodir/out.h5.tmp.XXXXXX: cannot create: No such file"),
           "tmp_create: a missing directory names the template: %s", fsdp_err_msg());
    fsdp_err_clear();
}

static void test_tmp_name_and_dir(void)
{
    char *n = NULL, *d = NULL;
    struct stat st;
    int rc = fsdp_file_tmp_name(tpath("m.h5"), &n);
    tap_ok(rc == 0 && tmp_name_ok(n, tpath("m.h5")) && lstat(n, &st) != 0 && errno == ENOENT,
           "tmp_name: a fresh name with nothing left at it (%s)", n ? n : "-");
    free(n);
    rc = fsdp_file_tmp_mkdir(tpath("step"), &d);
    tap_ok(rc == 0 && tmp_name_ok(d, tpath("step")) && lstat(d, &st) == 0 &&
               S_ISDIR(st.st_mode) && (st.st_mode & 07777) == 0755,
           "tmp_mkdir: a directory, mode 0755 under umask 022 (%s)", d ? d : "-");
    if (d) {
        rmdir(d);
    }
    free(d);
}

/* An exclusive create at a link, dangling or not: refused, target untouched. */
static void test_links_refused(void)
{
    struct stat st;
    put(tpath("victim"), "victim");
    symlink("victim", tpath("link"));
    symlink("absent", tpath("dangling"));
    int rc = fsdp_file_probe_create(tpath("link"));
    tap_ok(rc == FSDP_ERR_IO && strstr(fsdp_err_msg(), "File exists") &&
               holds(tpath("victim"), "victim") && lstat(tpath("link"), &st) == 0 &&
               S_ISLNK(st.st_mode),
           "probe_create: a link at the name is refused, left alone: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_file_probe_create(tpath("dangling"));
    tap_ok(rc == FSDP_ERR_IO && access(tpath("absent"), F_OK) != 0,
           "probe_create: a dangling link is refused, its target not created: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_file_probe_create(tpath("fresh"));
    tap_ok(rc == 0 && access(tpath("fresh"), F_OK) != 0,
           "probe_create: a free name passes and is left free");

    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fcreate(tpath("link"), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    hid_t g = H5Fcreate(tpath("dangling"), H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    tap_ok(f < 0 && g < 0 && holds(tpath("victim"), "victim") && access(tpath("absent"), F_OK) != 0,
           "HDF5 H5F_ACC_EXCL refuses a link and a dangling link (the HDF5 writers rely on it)");
    if (f >= 0) {
        H5Fclose(f);
    }
    if (g >= 0) {
        H5Fclose(g);
    }
}

/* The commit's rename replaces a link at the final name itself. */
static void test_commit_over_link(void)
{
    char *t = NULL;
    int fd = -1;
    struct stat st;
    symlink("victim", tpath("final"));
    int rc = fsdp_file_tmp_create(tpath("final"), &t, &fd);
    if (rc == 0) {
        write(fd, "output", 6);
        close(fd);
        rc = fsdp_file_commit(t, tpath("final"));
    }
    tap_ok(rc == 0 && lstat(tpath("final"), &st) == 0 && S_ISREG(st.st_mode) &&
               holds(tpath("final"), "output") && holds(tpath("victim"), "victim") &&
               access(t, F_OK) != 0,
           "commit over a link at the final name: the link is replaced, its target untouched");
    free(t);
}

/* The end of a write: commit on success; the temporary removed when the
 * write or the commit failed (a directory at the final name: rename fails). */
static void test_commit_or_remove(void)
{
    put(tpath("w.tmp"), "written");
    int rc = fsdp_file_commit_or_remove(0, tpath("w.tmp"), tpath("w"));
    tap_ok(rc == 0 && holds(tpath("w"), "written") && access(tpath("w.tmp"), F_OK) != 0,
           "commit_or_remove after a good write: committed under the final name");
    put(tpath("f.tmp"), "half");
    rc = fsdp_file_commit_or_remove(FSDP_ERR_IO, tpath("f.tmp"), tpath("f"));
    tap_ok(rc == FSDP_ERR_IO && access(tpath("f.tmp"), F_OK) != 0 && access(tpath("f"), F_OK) != 0,
           "commit_or_remove after a failed write: its error, the temporary removed, no file");
    put(tpath("d.tmp"), "whole");
    mkdir(tpath("d"), 0755);
    put(tpath("d/x"), "x");
    rc = fsdp_file_commit_or_remove(0, tpath("d.tmp"), tpath("d"));
    tap_ok(rc == FSDP_ERR_IO && access(tpath("d.tmp"), F_OK) != 0 && holds(tpath("d/x"), "x"),
           "commit_or_remove whose rename fails: the commit's error, the temporary removed");
    unlink(tpath("d/x"));
    rmdir(tpath("d"));
    unlink(tpath("w"));
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdpc-fu-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_tmp_create();
    test_tmp_name_and_dir();
    test_links_refused();
    test_commit_over_link();
    test_commit_or_remove();
    const char *files[] = {"victim", "link", "dangling", "final"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        unlink(tpath(files[i]));
    }
    tap_ok(rmdir(dir) == 0, "nothing else was left in the test directory");
    return tap_done();
}
