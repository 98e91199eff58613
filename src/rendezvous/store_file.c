/*
 * store_file.c - the rendezvous store as a directory on a shared file system
 * (file:///PATH), for clusters where ranks cannot open TCP ports to each
 * other but share Lustre, GPFS or NFS.
 *
 * Layout (doc/rendezvous.md):
 *   PATH/fsdpc-store.stamp     names the current job: nonce, job secret,
 *                              launcher job id, creation time, world size,
 *                              writer (mode 0600)
 *   PATH/job-<nonce>/k<key>    one file per key (key percent-encoded)
 *   PATH/job-<nonce>/l<key>    lock file of an add() counter
 * Rank 0 makes a fresh namespace for every job and publishes the stamp by
 * atomic rename (tmp, fsync, rename, fsync the directory). The other ranks
 * accept a stamp only when it carries their launcher's job id or, without
 * one, when it was written after their own start minus a slack, so a store
 * left by an earlier (killed) job is never read as current: if nothing else
 * shows up before the deadline, they fail with FSDP_ERR_STALE.
 *
 * Every value is written to a temporary file and renamed into place, so a
 * reader sees the whole old value, the whole new one, or nothing. add()
 * takes an fcntl lock on the key's lock file (open-file-description locks,
 * so threads of one process exclude each other too).
 *
 * Shared file system caveats: rename is atomic on Lustre, GPFS and NFS. On
 * NFS, locks need NFSv4 or lockd (NFSv3), and attribute/lookup caching can
 * delay the appearance of a new file on other clients by up to the mount's
 * actimeo (mount with lookupcache=positive or actimeo=1 for fast
 * rendezvous); rendezvous is then slower, never wrong. Clocks of the nodes
 * must agree to within FSDPC_FILE_STORE_SLACK when no job id is available.
 *
 * Permissions: directories 0700, files 0600. The directory, the stamp and
 * every namespace must be this user's, not links, not writable by others:
 * the stamp holds the job secret (auth.h), and whoever owns the directory
 * could swap it or point a namespace elsewhere. Each is checked on its
 * descriptor (lstat, open O_NOFOLLOW, fstat, compare); all below the
 * directory goes through descriptors (openat, renameat, unlinkat).
 *
 * Owns: the namespace directory of its job (rank 0 removes it at a normal end).
 */
#include "config.h"
#include "rendezvous/store.h"
#include "rendezvous/store_impl.h"
#include "rendezvous/auth.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SFILE_STAMP "fsdpc-store.stamp"
#define SFILE_MAGIC "fsdpc-file-store 1"
#define SFILE_NAME_MAX 200 /* encoded key names stay below NAME_MAX */
#define SFILE_POLL_MAX_S 0.05 /* longest sleep between looks for a key */
#define SFILE_LOCK_POLL_MAX_S 0.002 /* locks are held for one read-add-rename */

struct sfile {
    struct fsdp_store base;
    char dir[PATH_MAX - 256]; /* the store directory */
    char ns[PATH_MAX];  /* dir/job-<nonce> (for messages) */
    int dfd;            /* the store directory, checked (sfile_open_dir) */
    int nsfd;           /* the namespace, checked */
    int rank;
    int created_dir;    /* this process made dir: rank 0 removes it at the end */
    uint64_t nonce;
    unsigned char secret[FSDP_AUTH_KEY_BYTES]; /* from the stamp: keys the job */
    double timeout_s;
    uint64_t host_tag;  /* makes temporary names unique across hosts */
    atomic_uint seq;
    pthread_mutex_t mu; /* add(): one thread of this process at a time */
};

enum { SFILE_SEEN_NONE, SFILE_SEEN_STALE, SFILE_SEEN_MALFORMED, SFILE_SEEN_WRONG_SIZE };

struct sfile_stamp {
    uint64_t nonce;
    unsigned char secret[FSDP_AUTH_KEY_BYTES];
    char job[256]; /* "" when the writer had no launcher job id */
    double created; /* CLOCK_REALTIME seconds */
    int world;
};

static void sfile_time_str(double t, char *buf, size_t len)
{
    time_t s = (time_t)t;
    struct tm tm;
    localtime_r(&s, &tm);
    strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

static double sfile_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This process's start (wall clock) from /proc; now when unknown. */
static double sfile_process_start(void)
{
    char buf[2048];
    unsigned long long start_ticks = 0, btime = 0;
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f) {
        fclose(f);
    }
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    for (int field = 2; p && field < 22; field++) {
        p = strchr(p + 1, ' ');
    }
    if (!p || sscanf(p + 1, "%llu", &start_ticks) != 1) {
        return sfile_wall_now();
    }
    f = fopen("/proc/stat", "r");
    while (f && fgets(buf, sizeof(buf), f)) {
        if (sscanf(buf, "btime %llu", &btime) == 1) {
            break;
        }
    }
    if (f) {
        fclose(f);
    }
    long hz = sysconf(_SC_CLK_TCK);
    if (!btime || hz <= 0) {
        return sfile_wall_now();
    }
    return (double)btime + (double)start_ticks / (double)hz;
}

/* Sleeps for *backoff (not past deadline) and doubles it up to cap. */
static void sfile_sleep(double *backoff, double cap, double deadline)
{
    double left = deadline - fsdp_now();
    double t = *backoff < left ? *backoff : left;
    if (t > 0) {
        usleep((useconds_t)(t * 1e6));
    }
    *backoff = *backoff * 2 > cap ? cap : *backoff * 2;
}

// ----------------------------------------------------------------------------
// files

/* kind 'k' (value) or 'l' (lock) + the key, percent-encoded; long keys are
 * cut and end in a hash of the whole key. */
static void sfile_name(char kind, const char *key, char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    out[o++] = kind;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        if (o + 4 > SFILE_NAME_MAX - 18) {
            o += (size_t)snprintf(out + o, 19, "~%016" PRIx64, fsdp_hash64(key, strlen(key), 0));
            return;
        }
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '_' || *p == '-' || *p == '.') {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
}

/* The name of a key's file in the namespace, and its path for messages. */
static int sfile_path(const struct sfile *f, char kind, const char *key, char *name, char *path)
{
    sfile_name(kind, key, name);
    if ((size_t)snprintf(path, PATH_MAX, "%s/%s", f->ns, name) >= PATH_MAX) {
        return fsdp_err(FSDP_ERR_INVALID, "store file: path for key '%s' too long", key);
    }
    return 0;
}

/* Checks an open directory (or the stamp, want_dir 0) against what the
 * store needs: the object lstat saw, owned by this user, not writable by
 * group or others. shown is its path and fix what to do, for the message. */
static int sfile_check_owned(int fd, const struct stat *seen, const char *shown, int want_dir,
                             const char *fix)
{
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        return fsdp_err(FSDP_ERR_IO, "file store: cannot stat %s: %s", shown, strerror(errno));
    }
    if (sb.st_dev != seen->st_dev || sb.st_ino != seen->st_ino) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: %s was replaced while it was opened: "
                        "someone else writes in this directory; name a directory only you can "
                        "write", shown);
    }
    if (want_dir ? !S_ISDIR(sb.st_mode) : !S_ISREG(sb.st_mode)) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: %s is not a %s; remove it or choose "
                        "another path", shown, want_dir ? "directory" : "regular file");
    }
    if (sb.st_uid != geteuid()) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: %s belongs to uid %u, not to this user "
                        "(uid %u): another user could have made it to plant a store or read "
                        "the secret; %s", shown, (unsigned)sb.st_uid, (unsigned)geteuid(), fix);
    }
    if (sb.st_mode & 022) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: %s is writable by group or others "
                        "(mode %04o): other users could replace the store's files; chmod %s "
                        "it or name a new directory", shown, (unsigned)(sb.st_mode & 07777),
                        want_dir ? "700" : "600");
    }
    return 0;
}

/* Opens name under atfd (AT_FDCWD for a path) without following a link
 * and checks it (sfile_check_owned): 0 with *fd, 1 when it does not exist,
 * or an error. */
static int sfile_open_owned(int atfd, const char *name, const char *shown, int want_dir,
                            int *fd)
{
    struct stat seen;
    *fd = -1;
    if (fstatat(atfd, name, &seen, AT_SYMLINK_NOFOLLOW) < 0) {
        return errno == ENOENT ? 1 : fsdp_err(FSDP_ERR_IO, "file store: cannot stat %s: %s",
                                              shown, strerror(errno));
    }
    int top = atfd == AT_FDCWD; /* the store directory itself */
    if (S_ISLNK(seen.st_mode)) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: %s is a symbolic link, which the store "
                        "never follows: %s", shown, top ? "name the directory itself (realpath)"
                        : "someone else made it; remove it and check who can write here");
    }
    int flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (want_dir ? O_DIRECTORY : 0);
    int d = openat(atfd, name, flags);
    if (d < 0) {
        return errno == ENOENT ? 1 : fsdp_err(FSDP_ERR_IO, "file store: cannot open %s: %s",
                                              shown, strerror(errno));
    }
    int rc = sfile_check_owned(d, &seen, shown, want_dir, top ? "name a directory you own "
                               "(mkdir -m 700)" : "check who wrote it, remove it and start again");
    if (rc < 0) {
        close(d);
        return rc;
    }
    *fd = d;
    return 0;
}

/* 0 with the whole file of fd in *val (malloc'd, NUL-terminated), or an
 * error; shown is its path for messages. */
static int sfile_read_fd(int fd, const char *shown, void **val, size_t *len)
{
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size + 1 : 64;
    size_t n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 == cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r > 0) {
            n += (size_t)r;
        } else if (r == 0) {
            break;
        } else if (errno != EINTR) {
            int e = errno;
            free(buf);
            return fsdp_err(FSDP_ERR_IO, "store file: cannot read %s: %s", shown, strerror(e));
        }
    }
    if (!buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "store file: out of memory reading %s", shown);
    }
    buf[n] = '\0';
    *val = buf;
    *len = n;
    return 0;
}

/* sfile_read_fd of name under dirfd; 1 when it does not exist. */
static int sfile_read(int dirfd, const char *name, const char *shown, void **val, size_t *len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT) {
            return 1;
        }
        return fsdp_err(FSDP_ERR_IO, "store file: cannot open %s: %s", shown, strerror(errno));
    }
    int rc = sfile_read_fd(fd, shown, val, len);
    close(fd);
    return rc;
}

/* Writes a temporary file under dirfd and renames it onto name: readers
 * see all or nothing. shown is the final path for messages. */
static int sfile_write_atomic(struct sfile *f, int dirfd, const char *name, const char *shown,
                              const void *val, size_t len, int durable)
{
    char tmp[64];
    unsigned seq = atomic_fetch_add(&f->seq, 1);
    snprintf(tmp, sizeof(tmp), ".tmp-%016" PRIx64 "-%d-%u", f->host_tag, (int)getpid(), seq);
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_IO, "store file: cannot create a temporary file for %s: %s",
                        shown, strerror(errno));
    }
    const char *p = val;
    size_t done = 0;
    int e = 0;
    while (done < len && !e) {
        ssize_t w = write(fd, p + done, len - done);
        if (w > 0) {
            done += (size_t)w;
        } else if (w < 0 && errno != EINTR) {
            e = errno;
        }
    }
    if (!e && durable && fsync(fd) < 0) {
        e = errno;
    }
    if (close(fd) < 0 && !e) { /* NFS reports write errors here */
        e = errno;
    }
    if (!e && renameat(dirfd, tmp, dirfd, name) < 0) {
        e = errno;
    }
    if (e) {
        unlinkat(dirfd, tmp, 0);
        return fsdp_err(FSDP_ERR_IO, "store file: cannot write %s: %s", shown, strerror(e));
    }
    if (durable) {
        fsync(dirfd);
    }
    return 0;
}

/* Removes the entries of the namespace open as nsfd (unlinkat: a link is
 * removed, never followed), then the namespace, name under the store
 * directory. Closes nsfd. */
static int sfile_remove_ns_fd(struct sfile *f, int nsfd, const char *name)
{
    int dup_fd = dup(nsfd);
    DIR *dp = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!dp) {
        int e = errno;
        if (dup_fd >= 0) {
            close(dup_fd);
        }
        close(nsfd);
        return fsdp_err(FSDP_ERR_IO, "store file: cannot list %s/%s: %s", f->dir, name,
                        strerror(e));
    }
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
            unlinkat(nsfd, de->d_name, 0);
        }
    }
    closedir(dp);
    close(nsfd);
    if (unlinkat(f->dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT) {
        return fsdp_err(FSDP_ERR_IO, "store file: cannot remove %s/%s: %s", f->dir, name,
                        strerror(errno));
    }
    return 0;
}

/* Removes the namespace of nonce when it is a directory of this user's;
 * one that is a link or another user's is refused, untouched. */
static int sfile_remove_ns(struct sfile *f, uint64_t nonce)
{
    char name[32], shown[PATH_MAX];
    int nsfd;
    snprintf(name, sizeof(name), "job-%016" PRIx64, nonce);
    snprintf(shown, sizeof(shown), "%s/%s", f->dir, name);
    int r = sfile_open_owned(f->dfd, name, shown, 1, &nsfd);
    FSDP_CHECK(r);
    return r == 1 ? 0 : sfile_remove_ns_fd(f, nsfd, name);
}

// ----------------------------------------------------------------------------
// ops

static double sfile_timeout(const struct sfile *f, double timeout_s)
{
    return timeout_s < 0 ? f->timeout_s : timeout_s;
}

static int sfile_set(struct fsdp_store *s, const char *key, const void *val, size_t len)
{
    struct sfile *f = (struct sfile *)s;
    char name[SFILE_NAME_MAX + 1], path[PATH_MAX];
    FSDP_CHECK(sfile_path(f, 'k', key, name, path));
    FSDP_CHECK(sfile_write_atomic(f, f->nsfd, name, path, val, len, 0));
    return 0;
}

static int sfile_get(struct fsdp_store *s, const char *key, void **val, size_t *len,
                     double timeout_s)
{
    struct sfile *f = (struct sfile *)s;
    char name[SFILE_NAME_MAX + 1], path[PATH_MAX];
    double t = sfile_timeout(f, timeout_s), t0 = fsdp_now(), backoff = 0.001;
    FSDP_CHECK(sfile_path(f, 'k', key, name, path));
    for (;;) {
        int r = sfile_read(f->nsfd, name, path, val, len);
        FSDP_CHECK(r);
        if (r == 0) {
            return 0;
        }
        if (fsdp_now() - t0 >= t) {
            return fsdp_err(FSDP_ERR_TIMEOUT, "store file %s: key '%s' not set within %.1f s",
                            f->dir, key, fsdp_now() - t0);
        }
        sfile_sleep(&backoff, SFILE_POLL_MAX_S, t0 + t);
    }
}

static int sfile_check(struct fsdp_store *s, const char *key, int *exists)
{
    struct sfile *f = (struct sfile *)s;
    char name[SFILE_NAME_MAX + 1], path[PATH_MAX];
    struct stat st;
    FSDP_CHECK(sfile_path(f, 'k', key, name, path));
    if (fstatat(f->nsfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        *exists = 1;
    } else if (errno == ENOENT) {
        *exists = 0;
    } else {
        return fsdp_err(FSDP_ERR_IO, "store file: cannot stat %s: %s", path, strerror(errno));
    }
    return 0;
}

static int sfile_wait(struct fsdp_store *s, const char *const *keys, size_t n, double timeout_s)
{
    struct sfile *f = (struct sfile *)s;
    double t = sfile_timeout(f, timeout_s), t0 = fsdp_now();
    for (size_t i = 0; i < n; i++) {
        double backoff = 0.001;
        int exists = 0;
        for (;;) {
            FSDP_CHECK(sfile_check(s, keys[i], &exists));
            if (exists) {
                break;
            }
            if (fsdp_now() - t0 >= t) {
                return fsdp_err(FSDP_ERR_TIMEOUT, "store file %s: key '%s' not set within "
                                "%.1f s", f->dir, keys[i], fsdp_now() - t0);
            }
            sfile_sleep(&backoff, SFILE_POLL_MAX_S, t0 + t);
        }
    }
    return 0;
}

/* Takes the write lock of fd before deadline (OFD lock; POSIX lock where
 * the kernel or file system lacks OFD locks, the mutex covering threads). */
static int sfile_lock(int fd, short type, double deadline, const char *path)
{
    double backoff = 0.0001;
    struct flock fl;
    int cmd = F_OFD_SETLK;
    for (;;) {
        memset(&fl, 0, sizeof(fl));
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        if (fcntl(fd, cmd, &fl) == 0) {
            return 0;
        }
        if (errno == EINVAL && cmd == F_OFD_SETLK) {
            cmd = F_SETLK;
            continue;
        }
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
            return fsdp_err(FSDP_ERR_IO, "store file: cannot lock %s: %s", path, strerror(errno));
        }
        if (fsdp_now() >= deadline) {
            return fsdp_err(FSDP_ERR_TIMEOUT, "store file: lock %s still held by another "
                            "process at the deadline", path);
        }
        sfile_sleep(&backoff, SFILE_LOCK_POLL_MAX_S, deadline);
    }
}

static int sfile_add_locked(struct sfile *f, const char *key, int64_t delta, int64_t *result)
{
    char vname[SFILE_NAME_MAX + 1], vpath[PATH_MAX];
    void *v;
    size_t len;
    int64_t cur = 0, sum;
    FSDP_CHECK(sfile_path(f, 'k', key, vname, vpath));
    int r = sfile_read(f->nsfd, vname, vpath, &v, &len);
    FSDP_CHECK(r);
    if (r == 0) {
        int bad = fsdp_store_parse_int(v, len, &cur) < 0;
        free(v);
        if (bad) {
            return fsdp_err(FSDP_ERR_FORMAT, "store file: add '%s': the key holds a value that "
                            "is not an integer", key);
        }
    }
    if (__builtin_add_overflow(cur, delta, &sum)) {
        return fsdp_err(FSDP_ERR_INVALID, "store file: add '%s' %+" PRId64 ": int64 overflow",
                        key, delta);
    }
    if (delta != 0 || r == 1) {
        char txt[FSDP_STORE_INT_CHARS];
        int n = snprintf(txt, sizeof(txt), "%" PRId64, sum);
        FSDP_CHECK(sfile_write_atomic(f, f->nsfd, vname, vpath, txt, (size_t)n, 0));
    }
    *result = sum;
    return 0;
}

static int sfile_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    struct sfile *f = (struct sfile *)s;
    char lname[SFILE_NAME_MAX + 1], lpath[PATH_MAX];
    int rc;
    FSDP_CHECK(sfile_path(f, 'l', key, lname, lpath));
    pthread_mutex_lock(&f->mu);
    int fd = openat(f->nsfd, lname, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "store file: cannot open %s: %s", lpath, strerror(errno));
        goto out;
    }
    FSDP_CHECK_GOTO(sfile_lock(fd, F_WRLCK, fsdp_now() + f->timeout_s, lpath), rc, out_close);
    rc = sfile_add_locked(f, key, delta, result);
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_OFD_SETLK, &fl) < 0) {
        fcntl(fd, F_SETLK, &fl);
    }
out_close:
    close(fd); /* also drops the lock */
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void sfile_destroy(struct fsdp_store *s)
{
    struct sfile *f = (struct sfile *)s;
    if (f->nsfd >= 0) {
        close(f->nsfd);
    }
    if (f->dfd >= 0) {
        close(f->dfd);
    }
    pthread_mutex_destroy(&f->mu);
    free(f);
}

static const struct fsdp_store_ops sfile_ops = {
    .size = sizeof(struct fsdp_store_ops),
    .name = "file",
    .set = sfile_set,
    .get = sfile_get,
    .add = sfile_add,
    .wait = sfile_wait,
    .check = sfile_check,
    .destroy = sfile_destroy,
};

// ----------------------------------------------------------------------------
// the stamp

/* Parses the stamp's text (NUL-terminated); 0 or FSDP_ERR_FORMAT (recorded). */
static int sfile_stamp_parse(char *txt, const char *shown, struct sfile_stamp *st)
{
    char *save = NULL, *line;
    int have = 0;
    memset(st, 0, sizeof(*st));
    line = strtok_r(txt, "\n", &save);
    if (line && strcmp(line, SFILE_MAGIC) == 0) {
        while ((line = strtok_r(NULL, "\n", &save))) {
            unsigned long long x;
            char hex[2 * FSDP_AUTH_KEY_BYTES + 2];
            if (sscanf(line, "nonce %llx", &x) == 1) {
                st->nonce = x;
                have |= 1;
            } else if (sscanf(line, "secret %65s", hex) == 1 &&
                       strlen(hex) == 2 * FSDP_AUTH_KEY_BYTES) {
                int ok = 1;
                for (int i = 0; i < FSDP_AUTH_KEY_BYTES && ok; i++) {
                    unsigned b;
                    ok = sscanf(hex + 2 * i, "%2x", &b) == 1;
                    st->secret[i] = (unsigned char)b;
                }
                have |= ok ? 16 : 0;
            } else if (strncmp(line, "job ", 4) == 0) {
                snprintf(st->job, sizeof(st->job), "%s", strcmp(line + 4, "-") ? line + 4 : "");
                have |= 2;
            } else if (sscanf(line, "created %lf", &st->created) == 1) {
                have |= 4;
            } else if (sscanf(line, "world %d", &st->world) == 1) {
                have |= 8;
            }
        }
    }
    if (have != 31) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s is not an fsdpc store stamp; remove it or choose "
                        "another path", shown);
    }
    return 0;
}

/* 0 with the stamp, 1 when there is none, FSDP_ERR_FORMAT when it does not
 * parse (recorded), or an error: a stamp that is a link, or that another
 * user wrote, is refused before it is read. */
static int sfile_stamp_read(struct sfile *f, struct sfile_stamp *st)
{
    char shown[PATH_MAX];
    void *v;
    size_t len;
    int fd;
    snprintf(shown, sizeof(shown), "%s/" SFILE_STAMP, f->dir);
    int r = sfile_open_owned(f->dfd, SFILE_STAMP, shown, 0, &fd);
    if (r != 0) {
        return r;
    }
    r = sfile_read_fd(fd, shown, &v, &len);
    close(fd);
    FSDP_CHECK(r);
    r = sfile_stamp_parse(v, shown, st);
    memset(v, 0, len);
    free(v);
    return r;
}

static int sfile_stamp_write(struct sfile *f, int world, const char *job)
{
    char txt[1024], host[128] = "?", final[PATH_MAX], hex[2 * FSDP_AUTH_KEY_BYTES + 1];
    gethostname(host, sizeof(host) - 1);
    for (int i = 0; i < FSDP_AUTH_KEY_BYTES; i++) {
        snprintf(hex + 2 * i, 3, "%02x", f->secret[i]);
    }
    int n = snprintf(txt, sizeof(txt), SFILE_MAGIC "\nnonce %016" PRIx64 "\nsecret %s\n"
                     "job %s\ncreated %.6f\nworld %d\nwriter %s %d\n", f->nonce, hex,
                     job[0] ? job : "-", sfile_wall_now(), world, host, (int)getpid());
    snprintf(final, sizeof(final), "%s/" SFILE_STAMP, f->dir);
    int rc = sfile_write_atomic(f, f->dfd, SFILE_STAMP, final, txt, (size_t)n, 1);
    memset(txt, 0, sizeof(txt));
    memset(hex, 0, sizeof(hex));
    return rc;
}

/* mkdir -p; *created says whether the last component was made here. The
 * caller checks what is there (sfile_open_owned). */
static int sfile_mkdirs(const char *dir, int *created)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s", dir);
    *created = 0;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, c == '\0' ? 0700 : 0755) == 0) {
                *created = c == '\0';
            } else if (errno != EEXIST) {
                return fsdp_err(FSDP_ERR_IO, "file://%s: cannot create %s: %s", dir, p,
                                strerror(errno));
            }
            *s = c;
            if (c == '\0') {
                break;
            }
        }
    }
    return 0;
}

/* The namespace's name (job-<nonce>) and path (for messages). */
static void sfile_ns_name(struct sfile *f, uint64_t nonce, char *name, size_t len)
{
    snprintf(name, len, "job-%016" PRIx64, nonce);
    snprintf(f->ns, sizeof(f->ns), "%s/%s", f->dir, name);
}

static int sfile_open_rank0(struct sfile *f, int world, const char *job)
{
    struct sfile_stamp old;
    char when[64], name[32];
    FSDP_CHECK(sfile_mkdirs(f->dir, &f->created_dir));
    int r = sfile_open_owned(AT_FDCWD, f->dir, f->dir, 1, &f->dfd);
    FSDP_CHECK(r);
    if (r == 1) {
        return fsdp_err(FSDP_ERR_IO, "file://%s: the directory vanished as it was made; "
                        "someone else writes in its parent: name a directory only you can "
                        "write", f->dir);
    }
    r = sfile_stamp_read(f, &old);
    if (r == 0) {
        FSDP_CHECK(sfile_remove_ns(f, old.nonce));
        sfile_time_str(old.created, when, sizeof(when));
        FSDP_WARN(FSDP_SUB_DIST, "file://%s: replacing the store of an earlier job (written %s)",
                  f->dir, when);
    } else if (r == FSDP_ERR_FORMAT) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        FSDP_WARN(FSDP_SUB_DIST, "file://%s: replacing a malformed stamp (%s)", f->dir, msg);
    } else {
        FSDP_CHECK(r);
    }
    f->nonce = fsdp_store_random64();
    FSDP_CHECK(fsdp_auth_random(f->secret, sizeof(f->secret)));
    sfile_ns_name(f, f->nonce, name, sizeof(name));
    if (mkdirat(f->dfd, name, 0700) < 0) {
        return fsdp_err(FSDP_ERR_IO, "file://%s: cannot create %s: %s", f->dir, f->ns,
                        strerror(errno));
    }
    r = sfile_open_owned(f->dfd, name, f->ns, 1, &f->nsfd);
    FSDP_CHECK(r);
    if (r == 1) {
        return fsdp_err(FSDP_ERR_IO, "file://%s: %s vanished as it was made", f->dir, f->ns);
    }
    FSDP_CHECK(sfile_stamp_write(f, world, job));
    return 0;
}

/* One look for the job's stamp: 0 when it is current and its namespace
 * is open (f->nsfd), 1 to look again (*seen says why), or an error: a
 * directory, stamp or namespace that is a link or another user's. The
 * directory is opened afresh at every look: rank 0 may make it meanwhile. */
static int sfile_look(struct sfile *f, int world, const char *job, double not_before,
                      struct sfile_stamp *st, int *seen, char *msg, size_t msg_len)
{
    char name[32];
    if (f->dfd >= 0) {
        close(f->dfd);
        f->dfd = -1;
    }
    int r = sfile_open_owned(AT_FDCWD, f->dir, f->dir, 1, &f->dfd);
    if (r == 0) {
        r = sfile_stamp_read(f, st);
    }
    if (r == FSDP_ERR_FORMAT) {
        fsdp_err_take(msg, msg_len);
        *seen = SFILE_SEEN_MALFORMED;
        return 1;
    }
    if (r != 0) {
        return r;
    }
    if (!(job[0] ? strcmp(st->job, job) == 0 : st->created >= not_before)) {
        *seen = SFILE_SEEN_STALE;
        return 1;
    }
    if (st->world != world) {
        *seen = SFILE_SEEN_WRONG_SIZE;
        return 1;
    }
    sfile_ns_name(f, st->nonce, name, sizeof(name));
    r = sfile_open_owned(f->dfd, name, f->ns, 1, &f->nsfd);
    if (r == 0) {
        f->nonce = st->nonce;
        memcpy(f->secret, st->secret, sizeof(f->secret));
    }
    return r;
}

static int sfile_open_other(struct sfile *f, int world, const char *job, double timeout_s)
{
    double slack = fsdp_env_double("FSDPC_FILE_STORE_SLACK", 10.0);
    double not_before = sfile_process_start() - slack;
    double t0 = fsdp_now(), backoff = 0.01;
    int seen = SFILE_SEEN_NONE;
    struct sfile_stamp st;
    char msg[512] = "";
    for (;;) {
        int r = sfile_look(f, world, job, not_before, &st, &seen, msg, sizeof(msg));
        FSDP_CHECK(r);
        if (r == 0) {
            return 0;
        }
        if (fsdp_now() - t0 >= timeout_s) {
            break;
        }
        sfile_sleep(&backoff, 0.2, t0 + timeout_s);
    }
    char when[64];
    switch (seen) {
    case SFILE_SEEN_STALE:
        sfile_time_str(st.created, when, sizeof(when));
        return fsdp_err(FSDP_ERR_STALE, "file://%s holds a store from an earlier job (written "
                        "%s); remove it or choose another path", f->dir, when);
    case SFILE_SEEN_WRONG_SIZE:
        return fsdp_err(FSDP_ERR_MISMATCH, "file://%s: the store was made for %d ranks, this "
                        "rank was started for %d", f->dir, st.world, world);
    case SFILE_SEEN_MALFORMED:
        return fsdp_err(FSDP_ERR_FORMAT, "%s", msg);
    default:
        return fsdp_err(FSDP_ERR_TIMEOUT, "file://%s: no store appeared within %.1f s (rank 0 "
                        "creates it: did it start, and is the path on a shared file system?)",
                        f->dir, fsdp_now() - t0);
    }
}

int fsdp_store_file_open(const char *path, int rank, int world_size, double timeout_s,
                         uint64_t *nonce, unsigned char *secret, struct fsdp_store **out)
{
    char job[256];
    char host[128] = "?";
    int rc;
    if (!path || path[0] != '/' || strlen(path) >= PATH_MAX - 256) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: '%s' is not an absolute path",
                        path ? path : "(null)");
    }
    if (rank < 0 || world_size < 1 || rank >= world_size) {
        return fsdp_err(FSDP_ERR_INVALID, "file store: rank %d of %d", rank, world_size);
    }
    struct sfile *f = calloc(1, sizeof(*f));
    if (!f) {
        return fsdp_err(FSDP_ERR_NOMEM, "file store: out of memory");
    }
    f->base.ops = &sfile_ops;
    f->dfd = -1;
    f->nsfd = -1;
    f->rank = rank;
    f->timeout_s = timeout_s;
    snprintf(f->dir, sizeof(f->dir), "%s", path);
    for (size_t n = strlen(f->dir); n > 1 && f->dir[n - 1] == '/'; n--) {
        f->dir[n - 1] = '\0';
    }
    gethostname(host, sizeof(host) - 1);
    f->host_tag = fsdp_hash64(host, strlen(host), fsdp_store_random64());
    pthread_mutex_init(&f->mu, NULL);
    fsdp_store_job_id(job, sizeof(job));
    if (rank == 0) {
        FSDP_CHECK_GOTO(sfile_open_rank0(f, world_size, job), rc, err);
    } else {
        FSDP_CHECK_GOTO(sfile_open_other(f, world_size, job, timeout_s), rc, err);
    }
    FSDP_DEBUG(FSDP_SUB_DIST, "file store %s: namespace %s", f->dir, f->ns);
    if (nonce) {
        *nonce = f->nonce;
    }
    if (secret) {
        memcpy(secret, f->secret, sizeof(f->secret));
    }
    *out = &f->base;
    return 0;
err:
    sfile_destroy(&f->base);
    return rc;
}

int fsdp_store_file_cleanup(struct fsdp_store *s)
{
    if (!s || s->ops != &sfile_ops) {
        return fsdp_err(FSDP_ERR_INVALID, "file store cleanup: not a file store");
    }
    struct sfile *f = (struct sfile *)s;
    struct sfile_stamp st;
    char name[32];
    if (f->nsfd >= 0) {
        int nsfd = f->nsfd;
        f->nsfd = -1;
        snprintf(name, sizeof(name), "job-%016" PRIx64, f->nonce);
        FSDP_CHECK(sfile_remove_ns_fd(f, nsfd, name));
    }
    /* the stamp goes only while it still names this job (and is this user's) */
    int r = sfile_stamp_read(f, &st);
    if (r == 0 && st.nonce == f->nonce) {
        if (unlinkat(f->dfd, SFILE_STAMP, 0) < 0 && errno != ENOENT) {
            return fsdp_err(FSDP_ERR_IO, "file store: cannot remove %s/" SFILE_STAMP ": %s",
                            f->dir, strerror(errno));
        }
        if (f->created_dir) {
            rmdir(f->dir); /* only when empty; never follows a link */
        }
    } else if (r < 0) {
        fsdp_err_clear();
    }
    return 0;
}
