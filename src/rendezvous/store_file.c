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
 * Permissions: the store directory is made 0700 (an existing one must not
 * be writable by group or others), the namespace 0700, every file 0600, and
 * a stamp not owned by this user is refused: the stamp holds the job
 * secret that keys the backends' handshakes (auth.h).
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
    char ns[PATH_MAX];  /* dir/job-<nonce> */
    int rank;
    int created_dir;    /* this process made dir: rank 0 removes it at the end */
    uint64_t nonce;
    unsigned char secret[FSDP_AUTH_KEY_BYTES]; /* from the stamp: keys the job */
    double timeout_s;
    uint64_t host_tag;  /* makes temporary names unique across hosts */
    atomic_uint seq;
    pthread_mutex_t mu; /* add(): one thread of this process at a time */
};

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

static int sfile_path(const struct sfile *f, char kind, const char *key, char *path)
{
    char name[SFILE_NAME_MAX + 1];
    sfile_name(kind, key, name);
    if ((size_t)snprintf(path, PATH_MAX, "%s/%s", f->ns, name) >= PATH_MAX) {
        return fsdp_err(FSDP_ERR_INVALID, "store file: path for key '%s' too long", key);
    }
    return 0;
}

/* 0 with the whole file in *val (malloc'd, NUL-terminated), 1 when it does
 * not exist, or an error. */
static int sfile_read(const char *path, void **val, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) {
            return 1;
        }
        return fsdp_err(FSDP_ERR_IO, "store file: cannot open %s: %s", path, strerror(errno));
    }
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
            close(fd);
            free(buf);
            return fsdp_err(FSDP_ERR_IO, "store file: cannot read %s: %s", path, strerror(e));
        }
    }
    close(fd);
    if (!buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "store file: out of memory reading %s", path);
    }
    buf[n] = '\0';
    *val = buf;
    *len = n;
    return 0;
}

/* Writes dir/tmp then renames it onto final: readers see all or nothing. */
static int sfile_write_atomic(struct sfile *f, const char *dir, const char *final,
                              const void *val, size_t len, int durable)
{
    char tmp[PATH_MAX];
    unsigned seq = atomic_fetch_add(&f->seq, 1);
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.tmp-%016" PRIx64 "-%d-%u", dir, f->host_tag,
                         (int)getpid(), seq) >= sizeof(tmp)) {
        return fsdp_err(FSDP_ERR_INVALID, "store file: path in %s too long", dir);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        return fsdp_err(FSDP_ERR_IO, "store file: cannot create %s: %s", tmp, strerror(errno));
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
    if (!e && rename(tmp, final) < 0) {
        e = errno;
    }
    if (e) {
        unlink(tmp);
        return fsdp_err(FSDP_ERR_IO, "store file: cannot write %s: %s", final, strerror(e));
    }
    if (durable) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    return 0;
}

/* Removes the files of a namespace directory and the directory itself. */
static int sfile_remove_ns(const char *ns)
{
    DIR *dp = opendir(ns);
    if (!dp) {
        return errno == ENOENT ? 0 : fsdp_err(FSDP_ERR_IO, "store file: cannot open %s: %s", ns,
                                              strerror(errno));
    }
    struct dirent *de;
    char path[PATH_MAX];
    while ((de = readdir(dp))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) {
            continue;
        }
        if ((size_t)snprintf(path, sizeof(path), "%s/%s", ns, de->d_name) < sizeof(path)) {
            unlink(path);
        }
    }
    closedir(dp);
    if (rmdir(ns) < 0 && errno != ENOENT) {
        return fsdp_err(FSDP_ERR_IO, "store file: cannot remove %s: %s", ns, strerror(errno));
    }
    return 0;
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
    char path[PATH_MAX];
    FSDP_CHECK(sfile_path(f, 'k', key, path));
    FSDP_CHECK(sfile_write_atomic(f, f->ns, path, val, len, 0));
    return 0;
}

static int sfile_get(struct fsdp_store *s, const char *key, void **val, size_t *len,
                     double timeout_s)
{
    struct sfile *f = (struct sfile *)s;
    char path[PATH_MAX];
    double t = sfile_timeout(f, timeout_s), t0 = fsdp_now(), backoff = 0.001;
    FSDP_CHECK(sfile_path(f, 'k', key, path));
    for (;;) {
        int r = sfile_read(path, val, len);
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
    char path[PATH_MAX];
    struct stat st;
    FSDP_CHECK(sfile_path(f, 'k', key, path));
    if (stat(path, &st) == 0) {
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

static int sfile_add_locked(struct sfile *f, const char *key, const char *vpath, int64_t delta,
                            int64_t *result)
{
    void *v;
    size_t len;
    int64_t cur = 0, sum;
    int r = sfile_read(vpath, &v, &len);
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
        FSDP_CHECK(sfile_write_atomic(f, f->ns, vpath, txt, (size_t)n, 0));
    }
    *result = sum;
    return 0;
}

static int sfile_add(struct fsdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    struct sfile *f = (struct sfile *)s;
    char vpath[PATH_MAX], lpath[PATH_MAX];
    int rc;
    FSDP_CHECK(sfile_path(f, 'k', key, vpath));
    FSDP_CHECK(sfile_path(f, 'l', key, lpath));
    pthread_mutex_lock(&f->mu);
    int fd = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "store file: cannot open %s: %s", lpath, strerror(errno));
        goto out;
    }
    FSDP_CHECK_GOTO(sfile_lock(fd, F_WRLCK, fsdp_now() + f->timeout_s, lpath), rc, out_close);
    rc = sfile_add_locked(f, key, vpath, delta, result);
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

/* 0 with the stamp, 1 when there is none, FSDP_ERR_FORMAT when it does not
 * parse (recorded), or an I/O error. */
static int sfile_stamp_read(const char *dir, struct sfile_stamp *st)
{
    char path[PATH_MAX];
    void *v;
    size_t len;
    snprintf(path, sizeof(path), "%s/" SFILE_STAMP, dir);
    int r = sfile_read(path, &v, &len);
    if (r != 0) {
        return r;
    }
    char *save = NULL, *line;
    int have = 0;
    memset(st, 0, sizeof(*st));
    line = strtok_r(v, "\n", &save);
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
    memset(v, 0, len);
    free(v);
    if (have != 31) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s is not an fsdpc store stamp; remove it or choose "
                        "another path", path);
    }
    return 0;
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
    int rc = sfile_write_atomic(f, f->dir, final, txt, (size_t)n, 1);
    memset(txt, 0, sizeof(txt));
    memset(hex, 0, sizeof(hex));
    return rc;
}

/* mkdir -p; *created says whether the last component was made here. */
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
    struct stat sb;
    if (stat(dir, &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        return fsdp_err(FSDP_ERR_IO, "file://%s: not a directory", dir);
    }
    if (sb.st_mode & 022) {
        return fsdp_err(FSDP_ERR_INVALID, "file://%s: the directory is writable by group or "
                        "others (mode %04o): other users could replace the store's files; "
                        "chmod 700 it or name a new directory", dir,
                        (unsigned)(sb.st_mode & 07777));
    }
    return 0;
}

static int sfile_open_rank0(struct sfile *f, int world, const char *job)
{
    struct sfile_stamp old;
    char when[64];
    FSDP_CHECK(sfile_mkdirs(f->dir, &f->created_dir));
    int r = sfile_stamp_read(f->dir, &old);
    if (r == 0) {
        char ns[PATH_MAX];
        sfile_time_str(old.created, when, sizeof(when));
        FSDP_WARN(FSDP_SUB_DIST, "file://%s: replacing the store of an earlier job (written %s)",
                  f->dir, when);
        if ((size_t)snprintf(ns, sizeof(ns), "%s/job-%016" PRIx64, f->dir, old.nonce) <
            sizeof(ns)) {
            FSDP_CHECK(sfile_remove_ns(ns));
        }
    } else if (r == FSDP_ERR_FORMAT) {
        char msg[512];
        fsdp_err_take(msg, sizeof(msg));
        FSDP_WARN(FSDP_SUB_DIST, "file://%s: replacing a malformed stamp (%s)", f->dir, msg);
    } else {
        FSDP_CHECK(r);
    }
    f->nonce = fsdp_store_random64();
    FSDP_CHECK(fsdp_auth_random(f->secret, sizeof(f->secret)));
    if ((size_t)snprintf(f->ns, sizeof(f->ns), "%s/job-%016" PRIx64, f->dir, f->nonce) >=
        sizeof(f->ns)) {
        return fsdp_err(FSDP_ERR_INVALID, "file://%s: path too long", f->dir);
    }
    if (mkdir(f->ns, 0700) < 0) {
        return fsdp_err(FSDP_ERR_IO, "file://%s: cannot create %s: %s", f->dir, f->ns,
                        strerror(errno));
    }
    FSDP_CHECK(sfile_stamp_write(f, world, job));
    return 0;
}

static int sfile_open_other(struct sfile *f, int world, const char *job, double timeout_s)
{
    double slack = fsdp_env_double("FSDPC_FILE_STORE_SLACK", 10.0);
    double not_before = sfile_process_start() - slack;
    double t0 = fsdp_now(), backoff = 0.01;
    enum { NONE, STALE, MALFORMED, WRONG_SIZE } seen = NONE;
    struct sfile_stamp st;
    char msg[512] = "";
    for (;;) {
        int r = sfile_stamp_read(f->dir, &st);
        if (r == 0) {
            int current = job[0] ? strcmp(st.job, job) == 0 : st.created >= not_before;
            if (!current) {
                seen = STALE;
            } else if (st.world != world) {
                seen = WRONG_SIZE;
            } else {
                snprintf(f->ns, sizeof(f->ns), "%s/job-%016" PRIx64, f->dir, st.nonce);
                struct stat sb;
                if (stat(f->ns, &sb) == 0 && S_ISDIR(sb.st_mode)) {
                    if (sb.st_uid != geteuid()) {
                        return fsdp_err(FSDP_ERR_INVALID, "file://%s: the store's namespace "
                                        "belongs to uid %u, not to this user: another user's "
                                        "job, or a planted store", f->dir, (unsigned)sb.st_uid);
                    }
                    f->nonce = st.nonce;
                    memcpy(f->secret, st.secret, sizeof(f->secret));
                    return 0;
                }
            }
        } else if (r == FSDP_ERR_FORMAT) {
            fsdp_err_take(msg, sizeof(msg));
            seen = MALFORMED;
        } else if (r < 0) {
            return r;
        }
        if (fsdp_now() - t0 >= timeout_s) {
            break;
        }
        sfile_sleep(&backoff, 0.2, t0 + timeout_s);
    }
    char when[64];
    switch (seen) {
    case STALE:
        sfile_time_str(st.created, when, sizeof(when));
        return fsdp_err(FSDP_ERR_STALE, "file://%s holds a store from an earlier job (written "
                        "%s); remove it or choose another path", f->dir, when);
    case WRONG_SIZE:
        return fsdp_err(FSDP_ERR_MISMATCH, "file://%s: the store was made for %d ranks, this "
                        "rank was started for %d", f->dir, st.world, world);
    case MALFORMED:
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
    char path[PATH_MAX];
    FSDP_CHECK(sfile_remove_ns(f->ns));
    /* the stamp goes only while it still names this job */
    int r = sfile_stamp_read(f->dir, &st);
    if (r == 0 && st.nonce == f->nonce) {
        snprintf(path, sizeof(path), "%s/" SFILE_STAMP, f->dir);
        if (unlink(path) < 0 && errno != ENOENT) {
            return fsdp_err(FSDP_ERR_IO, "file store: cannot remove %s: %s", path,
                            strerror(errno));
        }
        if (f->created_dir) {
            rmdir(f->dir); /* only when empty */
        }
    } else if (r < 0) {
        fsdp_err_clear();
    }
    return 0;
}
