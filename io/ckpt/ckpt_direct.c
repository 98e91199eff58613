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
 * FSDPC_CKPT_DIRECT=0 keeps every byte in the page cache (a file system
 * whose O_DIRECT is slow or unsafe). Owns no file: the writer opens and closes the descriptors.
 */
#include "config.h"
#include "io/ckpt/ckpt_impl.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

int ck_direct_open(const char *path, struct ck_direct *d)
{
    memset(d, 0, sizeof(*d));
    d->dfd = d->bfd = -1;
    if ((d->bfd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW)) < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: cannot open for writing: %s", path, strerror(errno));
    }
    /* a file system without O_DIRECT (tmpfs) takes every byte through bfd */
    d->dfd = ck_direct_wanted() ? open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_DIRECT) : -1;
    if (posix_memalign(&d->buf, CK_ALIGN, CK_DIRECT_BUF) != 0) {
        d->buf = NULL;
        ck_direct_close(d);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: %d bytes of aligned buffer", path, CK_DIRECT_BUF);
    }
    return 0;
}

void ck_direct_close(struct ck_direct *d)
{
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

/* The first `fill` bytes of the buffer, which start at file offset off:
 * the aligned part with O_DIRECT (or through bfd when that is refused), the
 * rest moved to the front (last: written through bfd). */
static int ck_direct_flush(struct ck_direct *d, uint64_t *off, size_t *fill, int last)
{
    size_t whole = *fill / CK_ALIGN * CK_ALIGN;
    unsigned char *b = d->buf;
    if (whole > 0 && d->dfd >= 0 && ck_pwrite_all(d->dfd, b, whole, *off) < 0) {
        if (errno != EINVAL) {
            return -1;
        }
        close(d->dfd); /* refused here after all: the page cache for the rest */
        d->dfd = -1;
    }
    if (whole > 0 && d->dfd < 0 && ck_pwrite_all(d->bfd, b, whole, *off) < 0) {
        return -1;
    }
    *off += whole;
    *fill -= whole;
    memmove(b, b + whole, *fill);
    if (last && *fill > 0) {
        if (ck_pwrite_all(d->bfd, b, *fill, *off) < 0) {
            return -1;
        }
        *off += *fill;
        *fill = 0;
    }
    return 0;
}

int ck_direct_write(struct ck_direct *d, const char *what, uint64_t off, const void *data,
                    size_t rows, size_t row_bytes, size_t block_rows, struct fsdp_sum *sum)
{
    struct fsdp_sum_stream st;
    FSDP_CHECK(
        fsdp_sum_stream_begin(&st, rows, block_rows, row_bytes / sizeof(float), sizeof(float)));
    const unsigned char *p = data;
    size_t fill = 0;
    int e = 0;
    for (size_t r = 0; e == 0 && r < rows;) {
        /* whole rows of one block at most, as many as the buffer takes */
        size_t n = block_rows - (r % block_rows);
        size_t room = (CK_DIRECT_BUF - fill) / row_bytes;
        n = n < rows - r ? n : rows - r;
        n = n < room ? n : room;
        if (n == 0) {
            e = ck_direct_flush(d, &off, &fill, 0);
            continue;
        }
        fsdp_sum_stream_rows(&st, p + r * row_bytes, n);
        memcpy((unsigned char *)d->buf + fill, p + r * row_bytes, n * row_bytes);
        fill += n * row_bytes;
        r += n;
    }
    if (e == 0) {
        e = ck_direct_flush(d, &off, &fill, 1);
    }
    int rc = 0;
    if (e < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: writing failed: %s", what, strerror(errno));
    } else if (fsdp_sum_stream_end(&st) < 0) {
        rc = fsdp_err(FSDP_ERR_INTERNAL, "%s: not every row was hashed", what);
    } else {
        *sum = st.sum;
        memset(&st.sum, 0, sizeof(st.sum));
    }
    fsdp_sum_stream_free(&st);
    return rc;
}
