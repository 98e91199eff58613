/*
 * ckpt_direct.c - a shard dataset's bytes written past the page cache
 * (O_DIRECT), hashed on the way (see ckpt_impl.h, "Direct writes").
 *
 * On a busy machine the page cache is the slow part of a save: every byte
 * is copied into it by the writing process and charged, page by page, to
 * its memory group, and written back later (doc/performance.md measures
 * dd at a quarter of its O_DIRECT speed there). The shard writer therefore
 * lets HDF5 allocate each large dataset (contiguous, aligned to CK_ALIGN,
 * storage allocated at creation) and writes its bytes itself: each
 * checksum block is hashed from the caller's memory, copied into an
 * aligned buffer while it is in the CPU cache, and the buffer's aligned
 * part written with O_DIRECT; the last bytes that do not fill a block of
 * CK_ALIGN go through an ordinary descriptor. HDF5 never writes these
 * datasets' bytes (no fill), so the two paths never overlap.
 *
 * One write at a time leaves the disk idle while the next buffer is hashed
 * and copied, and a single request per process is less than the disk
 * takes (doc/performance.md): writer threads (ck_io_shape: four by
 * default, each with one write in flight) make the writes, from a ring of
 * buffers (one per thread, one being filled, one spare), while the caller
 * fills the next one, and a dataset's last writes are still in flight when
 * the next dataset's begin. A buffer is neither refilled nor freed while
 * its write is in flight, so the hashes are of exactly the bytes written.
 * The threads' calls are the same pwrite calls, through the same symbols,
 * as the caller's were. Their errors are kept (the first, with its
 * dataset) and returned by the next write or by ck_direct_finish, which
 * the commit calls before its fsync. Without a thread (none could be
 * started) the caller writes.
 *
 * FSDPC_CKPT_DIRECT=0 keeps every byte in the page cache (a file system
 * whose O_DIRECT is slow or unsafe). Owns no file: the writer opens and
 * closes the descriptors.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { CK_W_FREE = 0, CK_W_QUEUED, CK_W_WRITING };

/* n bytes to fd at off, all of them; 0 or -1 with errno */
static int ck_pwrite_all(int fd, const unsigned char *p, size_t n, uint64_t off)
{
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            errno = w == 0 ? EIO : errno;
            return -1;
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

int ck_direct_wanted(void)
{
    const char *v = getenv("FSDPC_CKPT_DIRECT");
    return !v || strcmp(v, "0") != 0;
}

static unsigned char *ck_buf(const struct ck_direct *d, int i)
{
    return (unsigned char *)d->buf + (size_t)i * d->shape.chunk;
}

/* name="MiB,requests" into *shape when it is one; a warning otherwise. */
static void ck_io_env(const char *name, struct ck_io_shape *shape)
{
    static int warned;
    const char *v = getenv(name);
    int mb, t, end = 0;
    if (!v || !*v) {
        return;
    }
    if (sscanf(v, "%d,%d%n", &mb, &t, &end) == 2 && v[end] == '\0' && mb >= 2 &&
        mb <= CK_DIRECT_BUF >> 20 && t >= 1 && t <= CK_IO_MAX_THREADS) {
        *shape = (struct ck_io_shape){(size_t)mb << 20, t};
    } else if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
        FSDP_WARN(FSDP_SUB_IO,
                  "%s='%s' is not MiB,requests (MiB 2 to %d, requests 1 to %d, e.g. 4,4): "
                  "the default %zu,%d is used",
                  name, v, CK_DIRECT_BUF >> 20, CK_IO_MAX_THREADS, shape->chunk >> 20,
                  shape->threads);
    }
}

void ck_io_shape(struct ck_io_shape *w, struct ck_io_shape *r)
{
    *w = (struct ck_io_shape){CK_IO_CHUNK, CK_IO_THREADS};
    *r = (struct ck_io_shape){CK_IO_CHUNK, CK_IO_THREADS};
    ck_io_env("FSDPC_CKPT_WRITE_IO", w);
    ck_io_env("FSDPC_CKPT_READ_IO", r);
}

/* Job i's bytes to the file: the aligned part with O_DIRECT (through bfd
 * once the file system refused it), the rest through bfd. 0 or -1 with
 * errno. Runs on the thread, or on the caller when there is none. */
static int ck_job_write(struct ck_direct *d, int i)
{
    const struct ck_wjob *j = &d->job[i];
    const unsigned char *b = ck_buf(d, i);
    size_t whole = j->last ? j->len / CK_ALIGN * CK_ALIGN : j->len;
    int refused = __atomic_load_n(&d->refused, __ATOMIC_ACQUIRE);
    if (whole > 0 && !refused && ck_pwrite_all(d->dfd, b, whole, j->off) < 0) {
        if (errno != EINVAL) {
            return -1;
        }
        /* refused here after all: the page cache for the rest */
        __atomic_store_n(&d->refused, 1, __ATOMIC_RELEASE);
        refused = 1;
    }
    if (whole > 0 && refused && ck_pwrite_all(d->bfd, b, whole, j->off) < 0) {
        return -1;
    }
    if (j->len > whole && ck_pwrite_all(d->bfd, b + whole, j->len - whole, j->off + whole) < 0) {
        return -1;
    }
    return 0;
}

/* Job i written: its result kept, its buffer free again. Holds d->mu. */
static void ck_job_done(struct ck_direct *d, int i, int rc, int err)
{
    if (rc < 0 && d->err == 0) {
        d->err = err ? err : EIO;
        snprintf(d->err_what, sizeof(d->err_what), "%s", d->job[i].what);
    }
    d->job[i].state = CK_W_FREE;
    pthread_cond_broadcast(&d->cv);
}

static void *ck_direct_main(void *arg)
{
    struct ck_direct *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && d->taken == d->queued) {
            pthread_cond_wait(&d->cv, &d->mu);
        }
        if (d->taken == d->queued) {
            break; /* stopped, nothing left */
        }
        int i = (int)(d->taken++ % (unsigned long)d->nbuf);
        d->job[i].state = CK_W_WRITING;
        pthread_mutex_unlock(&d->mu);
        int rc = ck_job_write(d, i), err = errno;
        pthread_mutex_lock(&d->mu);
        ck_job_done(d, i, rc, err);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int ck_direct_open(const char *path, struct ck_direct *d)
{
    memset(d, 0, sizeof(*d));
    d->dfd = d->bfd = -1;
    d->cur = -1;
    if ((d->bfd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW)) < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    }
    /* a file system without O_DIRECT (tmpfs) takes every byte through bfd */
    d->dfd = ck_direct_wanted() ? open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT) : -1;
    d->refused = d->dfd < 0;
    struct ck_io_shape rs;
    ck_io_shape(&d->shape, &rs);
    d->nbuf = d->shape.threads + 2;
    if (posix_memalign(&d->buf, CK_ALIGN, (size_t)d->nbuf * d->shape.chunk) != 0) {
        d->buf = NULL;
        ck_direct_close(d);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: %zu bytes of aligned buffers", path,
                        (size_t)d->nbuf * d->shape.chunk);
    }
    if (pthread_mutex_init(&d->mu, NULL) != 0) {
        ck_direct_close(d);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: a mutex for the writer", path);
    }
    if (pthread_cond_init(&d->cv, NULL) != 0) {
        pthread_mutex_destroy(&d->mu);
        ck_direct_close(d);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: a condition for the writer", path);
    }
    /* none started (threaded -1): the caller writes, the same bytes, later */
    d->threaded = -1;
    for (int t = 0; t < d->shape.threads; t++) {
        if (fsdp_thread_start(&d->thread[t], ck_direct_main, d) != 0) {
            break;
        }
        d->threaded = t + 1;
    }
    return 0;
}

/* Hands the buffer being filled to the thread (or writes it): its first
 * d->fill bytes at *off; *off advances by what it holds. */
static void ck_direct_submit(struct ck_direct *d, uint64_t *off, int last)
{
    int i = d->cur;
    struct ck_wjob *j = &d->job[i];
    j->off = *off;
    j->len = d->fill;
    j->last = last;
    *off += d->fill;
    d->cur = -1;
    d->fill = 0;
    pthread_mutex_lock(&d->mu);
    if (d->threaded > 0) {
        j->state = CK_W_QUEUED;
        d->queued++;
        pthread_cond_broadcast(&d->cv);
    } else {
        int rc = ck_job_write(d, i);
        ck_job_done(d, i, rc, errno);
    }
    pthread_mutex_unlock(&d->mu);
}

/* The next buffer in ring order, once its write is done, as d->cur; 0, or
 * -1 when a write has failed (d->err). */
static int ck_direct_take(struct ck_direct *d)
{
    int i = (int)(d->queued % (unsigned long)d->nbuf);
    pthread_mutex_lock(&d->mu);
    while (d->err == 0 && d->job[i].state != CK_W_FREE) {
        pthread_cond_wait(&d->cv, &d->mu);
    }
    int rc = d->err ? -1 : 0;
    pthread_mutex_unlock(&d->mu);
    d->cur = rc == 0 ? i : -1;
    d->fill = 0;
    return rc;
}

/* The first failed write as one error. */
static int ck_direct_error(struct ck_direct *d)
{
    pthread_mutex_lock(&d->mu);
    int e = d->err;
    pthread_mutex_unlock(&d->mu);
    return e == 0 ? 0 : fsdp_err(FSDP_ERR_IO, "%s: writing failed: %s", d->err_what, strerror(e));
}

/* The filled buffer's whole CK_ALIGN blocks handed over, the rest (under
 * CK_ALIGN bytes) carried to the front of the next buffer. */
static int ck_direct_rotate(struct ck_direct *d, uint64_t *off, const char *what)
{
    size_t whole = d->fill / CK_ALIGN * CK_ALIGN, rest = d->fill - whole;
    unsigned char carry[CK_ALIGN];
    memcpy(carry, ck_buf(d, d->cur) + whole, rest);
    d->fill = whole;
    snprintf(d->job[d->cur].what, sizeof(d->job[0].what), "%s", what);
    ck_direct_submit(d, off, 0);
    if (ck_direct_take(d) < 0) {
        return -1;
    }
    memcpy(ck_buf(d, d->cur), carry, rest);
    d->fill = rest;
    return 0;
}

int ck_direct_write(struct ck_direct *d, const char *what, uint64_t off, const void *data,
                    size_t rows, size_t row_bytes, size_t block_rows, struct fsdp_sum *sum)
{
    struct fsdp_sum_stream st;
    FSDP_CHECK(
        fsdp_sum_stream_begin(&st, rows, block_rows, row_bytes / sizeof(float), sizeof(float)));
    const unsigned char *p = data;
    int e = ck_direct_take(d);
    for (size_t r = 0; e == 0 && r < rows;) {
        /* whole rows of one block at most, as many as the buffer takes */
        size_t n = block_rows - (r % block_rows);
        size_t room = (d->shape.chunk - d->fill) / row_bytes;
        n = n < rows - r ? n : rows - r;
        n = n < room ? n : room;
        if (n == 0) {
            e = ck_direct_rotate(d, &off, what);
            continue;
        }
        fsdp_sum_stream_rows(&st, p + r * row_bytes, n);
        memcpy(ck_buf(d, d->cur) + d->fill, p + r * row_bytes, n * row_bytes);
        d->fill += n * row_bytes;
        r += n;
    }
    if (e == 0) {
        snprintf(d->job[d->cur].what, sizeof(d->job[0].what), "%s", what);
        ck_direct_submit(d, &off, 1);
    }
    int rc = ck_direct_error(d);
    if (rc == 0 && fsdp_sum_stream_end(&st) < 0) {
        rc = fsdp_err(FSDP_ERR_INTERNAL, "%s: not every row was hashed", what);
    } else if (rc == 0) {
        *sum = st.sum;
        memset(&st.sum, 0, sizeof(st.sum));
    }
    fsdp_sum_stream_free(&st);
    return rc;
}

/* Waits until no write is queued or in flight; holds nothing. */
static void ck_direct_drain(struct ck_direct *d)
{
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < d->nbuf; i++) {
        while (d->job[i].state != CK_W_FREE) {
            pthread_cond_wait(&d->cv, &d->mu);
        }
    }
    pthread_mutex_unlock(&d->mu);
}

int ck_direct_finish(struct ck_direct *d)
{
    if (!d->buf) {
        return 0;
    }
    ck_direct_drain(d);
    return ck_direct_error(d);
}

void ck_direct_close(struct ck_direct *d)
{
    if (d->threaded != 0) { /* the mutex and condition exist */
        ck_direct_drain(d);
        if (d->threaded > 0) {
            pthread_mutex_lock(&d->mu);
            d->stop = 1;
            pthread_cond_broadcast(&d->cv);
            pthread_mutex_unlock(&d->mu);
            for (int t = 0; t < d->threaded; t++) {
                pthread_join(d->thread[t], NULL);
            }
        }
        pthread_cond_destroy(&d->cv);
        pthread_mutex_destroy(&d->mu);
        d->threaded = 0;
    }
    if (d->dfd >= 0) {
        close(d->dfd);
    }
    if (d->bfd >= 0) {
        close(d->bfd);
    }
    free(d->buf);
    d->buf = NULL;
    d->dfd = d->bfd = -1;
}
