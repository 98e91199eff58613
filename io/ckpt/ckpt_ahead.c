/*
 * ckpt_ahead.c - read-ahead of a summarized shard file (see ckpt_impl.h,
 * "Read-ahead"): reader threads (ck_io_shape: 4 by default, each with one
 * request in flight) read the file in chunks (4 MiB by default) into a ring
 * of aligned buffers, with O_DIRECT where the reader has such a descriptor,
 * while the caller hashes and copies the chunk before; the caller takes its
 * bytes from the buffers (fsdp_sum_raw.read), so the reads of piece i + 1
 * are in flight while piece i is checked.
 *
 * How far it reads is the caller's pattern: a piece that starts where the
 * last one ended (within a chunk; the small datasets and HDF5's headers
 * between them) is a sequential read, and the threads then read on to the
 * end of the file, as far as the buffers allow; any other piece moves the
 * window there and reads only that piece (a resharding load that takes a
 * little of many files reads no more than it asks for). A small read (under
 * CK_DIRECT_MIN) that is not in the window is an ordinary pread, the window
 * left where it is. Owns no descriptor: the reader opens and closes them,
 * and detaches the stream (ck_ahead_use with -1) before it closes one.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "core/error.h"
#include "core/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CK_A_FREE = 0, CK_A_READING, CK_A_READY };

struct ck_aslot {
    uint64_t off; /* of its first byte (a multiple of CK_ALIGN) */
    size_t len;   /* asked for */
    size_t got;   /* read (less than len: the file ends there) */
    int state;    /* CK_A_* */
    int err;      /* errno of a failed read */
};

struct ck_ahead {
    int fd, dfd;        /* the shard's descriptors (-1: none), not owned */
    uint64_t size;      /* the file's size when it was attached */
    unsigned char *buf; /* (nbuf, shape.chunk) aligned to CK_ALIGN */
    struct ck_io_shape shape;
    int nbuf; /* shape.threads + 2: one taken, one read by each thread, one ready */
    pthread_t thread[CK_IO_MAX_THREADS];
    int threaded, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ck_aslot slot[CK_IO_MAX_BUF];
    unsigned long head, issued; /* the window: slots [head, issued), in file order */
    uint64_t next;              /* where the next chunk starts */
    uint64_t limit;             /* no chunk is read at or past this */
};

static uint64_t ck_up(uint64_t v)
{
    return (v + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
}

/* len bytes at off into p: through dfd, or fd once dfd refused; the bytes
 * read (fewer at the end of the file), or -1 with errno. */
static ssize_t ck_pread_chunk(int fd, int *dfd, unsigned char *p, uint64_t off, size_t len)
{
    size_t done = 0;
    while (done < len) {
        int use = *dfd >= 0 ? *dfd : fd;
        ssize_t got = pread(use, p + done, len - done, (off_t)(off + done));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && errno == EINVAL && use == *dfd) {
            *dfd = -1; /* refused after all: the page cache */
            continue;
        }
        if (got < 0) {
            return -1;
        }
        if (got == 0 || (use != fd && (size_t)got % CK_ALIGN != 0)) {
            return (ssize_t)(done + (size_t)got); /* the end of the file */
        }
        done += (size_t)got;
    }
    return (ssize_t)done;
}

/* Issues and makes the next chunk's read when a buffer is free and the
 * window is to grow: 1, else 0. Holds a->mu (released while reading). */
static int ck_ahead_step(struct ck_ahead *a)
{
    if (a->fd < 0 || a->issued - a->head >= (unsigned long)a->nbuf || a->next >= a->limit ||
        a->next >= a->size) {
        return 0;
    }
    int i = (int)(a->issued++ % (unsigned long)a->nbuf);
    struct ck_aslot *s = &a->slot[i];
    uint64_t end = a->limit < a->size ? a->limit : a->size;
    s->off = a->next;
    s->len = end - s->off < a->shape.chunk ? (size_t)ck_up(end - s->off) : a->shape.chunk;
    s->state = CK_A_READING;
    a->next += s->len;
    int fd = a->fd, dfd = a->dfd;
    pthread_mutex_unlock(&a->mu);
    ssize_t got = ck_pread_chunk(fd, &dfd, a->buf + (size_t)i * a->shape.chunk, s->off, s->len);
    int err = errno;
    pthread_mutex_lock(&a->mu);
    if (dfd < 0 && a->fd == fd) {
        a->dfd = -1;
    }
    s->got = got < 0 ? 0 : (size_t)got;
    s->err = got < 0 ? (err ? err : EIO) : 0;
    s->state = CK_A_READY;
    pthread_cond_broadcast(&a->cv);
    return 1;
}

static void *ck_ahead_main(void *arg)
{
    struct ck_ahead *a = arg;
    pthread_mutex_lock(&a->mu);
    while (!a->stop) {
        if (!ck_ahead_step(a)) {
            pthread_cond_wait(&a->cv, &a->mu);
        }
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

/* Waits for the thread (or, without one, reads the next chunk here). */
static void ck_ahead_wait(struct ck_ahead *a)
{
    if (a->threaded) {
        pthread_cond_wait(&a->cv, &a->mu);
    } else {
        ck_ahead_step(a);
    }
}

/* Empties the window once no read is in flight; the next chunk starts at
 * off, none at or past limit. Holds a->mu. */
static void ck_ahead_move(struct ck_ahead *a, uint64_t off, uint64_t limit)
{
    for (unsigned long k = a->head; k < a->issued; k++) {
        while (a->slot[k % (unsigned long)a->nbuf].state == CK_A_READING) {
            pthread_cond_wait(&a->cv, &a->mu);
        }
        a->slot[k % (unsigned long)a->nbuf].state = CK_A_FREE;
    }
    a->head = a->issued;
    a->next = off / CK_ALIGN * CK_ALIGN;
    a->limit = limit;
    pthread_cond_broadcast(&a->cv);
}

int ck_ahead_create(struct ck_ahead **out)
{
    struct ck_ahead *a = calloc(1, sizeof(*a));
    struct ck_io_shape ws;
    void *buf = NULL;
    if (a) {
        ck_io_shape(&ws, &a->shape);
        a->nbuf = a->shape.threads + 2;
    }
    if (!a || posix_memalign(&buf, CK_ALIGN, (size_t)a->nbuf * a->shape.chunk) != 0) {
        free(a);
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint reader: read-ahead buffers");
    }
    a->buf = buf;
    a->fd = a->dfd = -1;
    if (pthread_mutex_init(&a->mu, NULL) != 0 || pthread_cond_init(&a->cv, NULL) != 0) {
        free(a->buf);
        free(a);
        return fsdp_err(FSDP_ERR_NOMEM, "checkpoint reader: read-ahead lock");
    }
    /* no thread: every chunk is read when it is first wanted */
    for (int t = 0; t < a->shape.threads; t++) {
        if (fsdp_thread_start(&a->thread[t], ck_ahead_main, a) != 0) {
            break;
        }
        a->threaded = t + 1;
    }
    *out = a;
    return 0;
}

void ck_ahead_destroy(struct ck_ahead *a)
{
    if (!a) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    ck_ahead_move(a, 0, 0);
    a->stop = 1;
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
    for (int t = 0; t < a->threaded; t++) {
        pthread_join(a->thread[t], NULL);
    }
    pthread_cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a->buf);
    free(a);
}

void ck_ahead_use(struct ck_ahead *a, int fd, int dfd)
{
    if (!a) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    if (fd != a->fd) {
        struct stat st;
        ck_ahead_move(a, 0, 0);
        a->fd = fd;
        a->size = fd >= 0 && fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
        a->next = UINT64_MAX; /* the first piece is not sequential */
    }
    a->dfd = fd >= 0 ? dfd : -1;
    pthread_mutex_unlock(&a->mu);
}

void ck_ahead_want(struct ck_ahead *a, uint64_t off, uint64_t n)
{
    if (!a) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    uint64_t lo = a->head < a->issued ? a->slot[a->head % (unsigned long)a->nbuf].off : a->next;
    if (a->next != UINT64_MAX && off >= lo && off <= a->next + a->shape.chunk) {
        a->limit = a->size; /* sequential: on to the end */
        pthread_cond_broadcast(&a->cv);
    } else {
        ck_ahead_move(a, off, ck_up(off + n));
    }
    pthread_mutex_unlock(&a->mu);
}

/* Frees the window's chunks that end at or before off; the first slot
 * left, when it holds off, or NULL. Holds a->mu. */
static struct ck_aslot *ck_ahead_find(struct ck_ahead *a, uint64_t off)
{
    while (a->head < a->issued) {
        struct ck_aslot *s = &a->slot[a->head % (unsigned long)a->nbuf];
        if (s->off > off) {
            return NULL;
        }
        if (off < s->off + s->len) {
            return s;
        }
        while (s->state == CK_A_READING) {
            pthread_cond_wait(&a->cv, &a->mu);
        }
        s->state = CK_A_FREE;
        a->head++;
        pthread_cond_broadcast(&a->cv);
    }
    return NULL;
}

int ck_ahead_read(void *ctx, uint64_t off, uint64_t n, void *dst)
{
    struct ck_ahead *a = ctx;
    unsigned char *p = dst;
    const int small = n < CK_DIRECT_MIN;
    pthread_mutex_lock(&a->mu);
    while (n > 0) {
        struct ck_aslot *s = ck_ahead_find(a, off);
        if (!s && small) { /* not in the window: the page cache, the window kept */
            int fd = a->fd;
            pthread_mutex_unlock(&a->mu);
            ssize_t got = 0;
            while (n > 0 && (got = pread(fd, p, n, (off_t)off)) != 0) {
                if (got < 0 && errno != EINTR) {
                    return -1;
                }
                got = got < 0 ? 0 : got;
                p += got;
                off += (uint64_t)got;
                n -= (uint64_t)got;
            }
            errno = 0; /* got 0: the file ends before them */
            return n > 0 ? -1 : 0;
        }
        if (!s && (a->fd < 0 || off >= a->size)) {
            errno = a->fd < 0 ? EBADF : 0; /* 0: the file ends before them */
            pthread_mutex_unlock(&a->mu);
            return -1;
        }
        if (!s) {
            if (a->head < a->issued || off < a->next || off >= a->next + a->shape.chunk) {
                ck_ahead_move(a, off, ck_up(off + n));
            }
            a->limit = a->limit > ck_up(off + n) ? a->limit : ck_up(off + n);
            pthread_cond_broadcast(&a->cv);
            ck_ahead_wait(a);
            continue;
        }
        if (s->state == CK_A_READING) {
            ck_ahead_wait(a);
            continue;
        }
        uint64_t skip = off - s->off;
        if (s->err != 0 || skip >= s->got) {
            errno = s->err; /* 0: the file ends before them */
            pthread_mutex_unlock(&a->mu);
            return -1;
        }
        size_t take = s->got - skip < n ? (size_t)(s->got - skip) : (size_t)n;
        const unsigned char *from = a->buf + (size_t)(s - a->slot) * a->shape.chunk + skip;
        pthread_mutex_unlock(&a->mu); /* the slot stays ours until the window passes it */
        memcpy(p, from, take);
        pthread_mutex_lock(&a->mu);
        p += take;
        off += take;
        n -= take;
    }
    pthread_mutex_unlock(&a->mu);
    return 0;
}
