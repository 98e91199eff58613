/*
 * tmpfile.c - temporary names beside a path and their exclusive creation
 * (see tmpfile.h): drawing the random tail, creating a file, a name or a
 * directory there without ever opening what is already at it.
 */
#include "config.h"
#include "core/tmpfile.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

// ----------------------------------------------------------------------------
// temporary names

#define FILE_TMP_TAG ".tmp."
#define FILE_TMP_RAND 6
#define FILE_TMP_TRIES 100

/* Replaces the last FILE_TMP_RAND characters of name with random letters
 * and digits. A weak source makes a name guessable, which lets someone hold
 * it and cost us a retry, never a write elsewhere (the create is exclusive),
 * so without the kernel's generator a mix of clock and pid serves. */
static void file_tmp_draw(char *name)
{
    static const char set[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char r[FILE_TMP_RAND];
    if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^ (uint64_t)ts.tv_sec ^
                     (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)name;
        for (int i = 0; i < FILE_TMP_RAND; i++) {
            x ^= x >> 29;
            x *= 0xbf58476d1ce4e5b9ull;
            r[i] = (unsigned char)(x >> 56);
        }
    }
    char *tail = name + strlen(name) - FILE_TMP_RAND;
    for (int i = 0; i < FILE_TMP_RAND; i++) {
        tail[i] = set[r[i] % (sizeof(set) - 1)];
    }
}

/* Creates name as a new regular file: O_EXCL refuses an existing entry,
 * and O_NOFOLLOW says so for a link at the name. 0644 rather than mkstemp's
 * 0600, so that outputs keep the permissions the umask gives every file. */
static int file_make_file(const char *name, int *fd)
{
    *fd = open(name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    return *fd < 0 ? errno : 0;
}

/* The kinds of entry a temporary can be: a file kept open, a name only,
 * a directory. */
enum file_tmp_kind { FILE_TMP_OPEN, FILE_TMP_NAME, FILE_TMP_DIR };

/* 0 or errno: kind's entry at name, made afresh (never an existing one). */
static int file_make(const char *name, enum file_tmp_kind kind, int *fd)
{
    int e;
    switch (kind) {
    case FILE_TMP_OPEN:
        return file_make_file(name, fd);
    case FILE_TMP_NAME:
        e = file_make_file(name, fd);
        if (e == 0) {
            close(*fd);
            *fd = -1;
            unlink(name);
        }
        return e;
    case FILE_TMP_DIR:
        return mkdir(name, 0755) == 0 ? 0 : errno;
    }
    return EINVAL;
}

/* Draws "<path>.tmp.XXXXXX" until kind's entry can be made there. */
static int file_tmp_make(const char *path, enum file_tmp_kind kind, char **tmp, int *fd)
{
    size_t n = strlen(path) + sizeof(FILE_TMP_TAG) + FILE_TMP_RAND;
    char *name = malloc(n);
    int e = EEXIST, dummy = -1;
    *tmp = NULL;
    if (!name) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: temporary name", path);
    }
    snprintf(name, n, "%s" FILE_TMP_TAG "XXXXXX", path);
    for (int t = 0; t < FILE_TMP_TRIES && e == EEXIST; t++) {
        file_tmp_draw(name);
        e = file_make(name, kind, fd ? fd : &dummy);
    }
    if (e != 0) {
        snprintf(name, n, "%s" FILE_TMP_TAG "XXXXXX", path);
        int rc = fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", name, strerror(e));
        free(name);
        return rc;
    }
    *tmp = name;
    return 0;
}

int fsdp_file_tmp_create(const char *path, char **tmp, int *fd)
{
    return file_tmp_make(path, FILE_TMP_OPEN, tmp, fd);
}

int fsdp_file_tmp_name(const char *path, char **tmp)
{
    return file_tmp_make(path, FILE_TMP_NAME, tmp, NULL);
}

int fsdp_file_tmp_mkdir(const char *path, char **tmp)
{
    return file_tmp_make(path, FILE_TMP_DIR, tmp, NULL);
}

int fsdp_file_probe_create(const char *path)
{
    int fd;
    int e = file_make(path, FILE_TMP_NAME, &fd);
    return e == 0 ? 0 : fsdp_err(FSDP_ERR_IO, "%s: cannot create: %s", path, strerror(e));
}
