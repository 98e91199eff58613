/*
 * crash_shim.c - wrappers for the file-system calls of a checkpoint save
 * that count each call on a path under a directory and _exit() before the
 * k-th (see crash_shim.h). _exit, not a signal: a process killed between
 * two calls leaves exactly what the calls before made, and no atexit
 * handler or stdio flush runs to tidy up. The real calls are reached
 * through dlsym(RTLD_NEXT), both when linked into a test (the library is
 * static, so its calls land here) and when preloaded.
 */
#undef _FORTIFY_SOURCE
#include "config.h"
#include "tests/ckpt/crash_shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static long shim_at;        /* crash before this call; 0: never */
static long shim_count;
static char shim_under[4096];
static int shim_note = -1;
static int shim_no_exchange;
static long shim_slow_us; /* sleep before each counted call (a slow file system) */
static long shim_eio_at;  /* this pwrite through an O_DIRECT descriptor fails; 0: none */
static long shim_direct;  /* pwrites through O_DIRECT descriptors under the directory */

void crash_shim_fail_direct(long k)
{
    __atomic_store_n(&shim_direct, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&shim_eio_at, k, __ATOMIC_SEQ_CST);
}

long crash_shim_direct_writes(void)
{
    return __atomic_load_n(&shim_direct, __ATOMIC_SEQ_CST);
}

void crash_shim_arm(long k, const char *under, int note_fd, int no_exchange)
{
    shim_at = k;
    shim_count = 0;
    snprintf(shim_under, sizeof(shim_under), "%s", under ? under : "");
    shim_note = note_fd;
    shim_no_exchange = no_exchange;
}

__attribute__((constructor)) static void shim_from_env(void)
{
    const char *at = getenv("FSDPC_CRASH_AT"), *under = getenv("FSDPC_CRASH_UNDER");
    const char *note = getenv("FSDPC_CRASH_NOTE"), *nox = getenv("FSDPC_CRASH_NO_EXCHANGE");
    const char *slow = getenv("FSDPC_CRASH_SLOW_MS"), *eio = getenv("FSDPC_CRASH_EIO_DIRECT");
    shim_slow_us = slow ? atol(slow) * 1000 : 0;
    shim_eio_at = eio ? atol(eio) : 0;
    if (!at && !under && !note && !nox && !eio) {
        return; /* linked into a test: armed by crash_shim_arm */
    }
    int fd = note ? open(note, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
    crash_shim_arm(at ? atol(at) : 0, under, fd, nox && atoi(nox) != 0);
}

static void *shim_real(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        static const char msg[] = "crash_shim: a wrapped call has no next definition\n";
        ssize_t w = write(2, msg, sizeof(msg) - 1);
        (void)w;
        _exit(127);
    }
    return f;
}

static int shim_under_dir(const char *path)
{
    size_t n = strlen(shim_under);
    return path && (n == 0 || (strncmp(path, shim_under, n) == 0 &&
                               (path[n] == '/' || path[n] == '\0')));
}

/* Counts the call when one of its paths is under the directory; notes it;
 * dies when it is the k-th. */
static void shim_boundary(const char *call, const char *a, const char *b)
{
    if (!shim_under_dir(a) && !shim_under_dir(b)) {
        return;
    }
    long k = __atomic_add_fetch(&shim_count, 1, __ATOMIC_SEQ_CST);
    char line[8400];
    int n = snprintf(line, sizeof(line), "%ld %s %s%s%s\n", k, call, a ? a : "-", b ? " " : "",
                     b ? b : "");
    if (shim_note >= 0 && n > 0) {
        ssize_t (*real_write)(int, const void *, size_t) =
            (ssize_t(*)(int, const void *, size_t))shim_real("write");
        ssize_t w = real_write(shim_note, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line));
        (void)w;
    }
    if (shim_at > 0 && k == shim_at) {
        _exit(CRASH_SHIM_STATUS);
    }
    if (shim_slow_us > 0) {
        usleep((useconds_t)shim_slow_us);
    }
}

/* The path an open descriptor names, for the calls that take one: 1 when
 * it is under the directory. */
static int shim_fd_boundary(const char *call, int fd)
{
    char link[64], path[4096];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof(path) - 1);
    if (n > 0) {
        path[n] = '\0';
        shim_boundary(call, path, NULL);
        return shim_under_dir(path);
    }
    return 0;
}

/* A pwrite under the directory: counted when its descriptor is O_DIRECT,
 * and 1 when it is the one to fail, which it does late, as a failing disk
 * does after its retries (so a write still in flight fails after the call
 * that handed it over has returned). */
static int shim_direct_fails(int fd, int under)
{
    int fl = fcntl(fd, F_GETFL);
    if (!under || fl < 0 || !(fl & O_DIRECT)) {
        return 0;
    }
    long k = __atomic_add_fetch(&shim_direct, 1, __ATOMIC_SEQ_CST);
    if (k != __atomic_load_n(&shim_eio_at, __ATOMIC_SEQ_CST)) {
        return 0;
    }
    usleep(200000);
    return 1;
}

// ----------------------------------------------------------------------------
// the wrappers

int mkdir(const char *path, mode_t mode)
{
    shim_boundary("mkdir", path, NULL);
    return ((int (*)(const char *, mode_t))shim_real("mkdir"))(path, mode);
}

static int shim_open(const char *name, const char *path, int flags, mode_t mode)
{
    if (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC)) {
        shim_boundary(name, path, NULL);
    }
    return ((int (*)(const char *, int, ...))shim_real(name))(path, flags, mode);
}

int open(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    return shim_open("open", path, flags, mode);
}

int open64(const char *path, int flags, ...)
{
    mode_t mode = 0;
    if (flags & (O_CREAT | O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    return shim_open("open64", path, flags, mode);
}

ssize_t write(int fd, const void *buf, size_t n)
{
    if (fd > 2) {
        shim_fd_boundary("write", fd);
    }
    return ((ssize_t(*)(int, const void *, size_t))shim_real("write"))(fd, buf, n);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (shim_direct_fails(fd, shim_fd_boundary("pwrite", fd))) {
        errno = EIO;
        return -1;
    }
    return ((ssize_t(*)(int, const void *, size_t, off_t))shim_real("pwrite"))(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
    if (shim_direct_fails(fd, shim_fd_boundary("pwrite64", fd))) {
        errno = EIO;
        return -1;
    }
    return ((ssize_t(*)(int, const void *, size_t, off64_t))shim_real("pwrite64"))(fd, buf, n,
                                                                                  off);
}

int posix_fallocate(int fd, off_t off, off_t len)
{
    shim_fd_boundary("posix_fallocate", fd);
    return ((int (*)(int, off_t, off_t))shim_real("posix_fallocate"))(fd, off, len);
}

int fsync(int fd)
{
    shim_fd_boundary("fsync", fd);
    return ((int (*)(int))shim_real("fsync"))(fd);
}

int fdatasync(int fd)
{
    shim_fd_boundary("fdatasync", fd);
    return ((int (*)(int))shim_real("fdatasync"))(fd);
}

int rename(const char *from, const char *to)
{
    shim_boundary("rename", from, to);
    return ((int (*)(const char *, const char *))shim_real("rename"))(from, to);
}

int renameat(int fd1, const char *from, int fd2, const char *to)
{
    shim_boundary("renameat", from, to);
    return ((int (*)(int, const char *, int, const char *))shim_real("renameat"))(fd1, from, fd2,
                                                                                  to);
}

int renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags)
{
    shim_boundary("renameat2", from, to);
    if (shim_no_exchange && (flags & RENAME_EXCHANGE)) {
        errno = EINVAL;
        return -1;
    }
    return ((int (*)(int, const char *, int, const char *, unsigned))shim_real("renameat2"))(
        fd1, from, fd2, to, flags);
}

int symlink(const char *target, const char *link)
{
    shim_boundary("symlink", link, NULL);
    return ((int (*)(const char *, const char *))shim_real("symlink"))(target, link);
}

int unlink(const char *path)
{
    shim_boundary("unlink", path, NULL);
    return ((int (*)(const char *))shim_real("unlink"))(path);
}

int rmdir(const char *path)
{
    shim_boundary("rmdir", path, NULL);
    return ((int (*)(const char *))shim_real("rmdir"))(path);
}

int remove(const char *path)
{
    shim_boundary("remove", path, NULL);
    return ((int (*)(const char *))shim_real("remove"))(path);
}
