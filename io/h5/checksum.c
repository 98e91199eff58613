/*
 * checksum.c - block checksums of HDF5 tensors (see checksum.h; layout in
 * doc/formats.md, "Checksums"): the XXH3-64 stream writers feed, the
 * attributes that keep the hashes, and the checked reads. Knows datasets
 * and bytes only: which file a tensor lives in and what a mismatch means
 * are the caller's.
 */
#include "config.h"
#include "io/h5/checksum.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"

#include <xxhash.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

size_t fsdp_sum_block_rows(size_t rows, size_t row_bytes)
{
    size_t b = row_bytes > 0 ? FSDP_SUM_BLOCK_BYTES / row_bytes : rows;
    if (b == 0) {
        b = 1;
    }
    if (rows / b >= FSDP_SUM_MAX_BLOCKS) {
        b = (rows + FSDP_SUM_MAX_BLOCKS - 1) / FSDP_SUM_MAX_BLOCKS;
    }
    return b < rows ? b : rows > 0 ? rows : 1; /* a small tensor: one block of all its rows */
}

size_t fsdp_sum_nblocks(size_t rows, size_t block_rows)
{
    return rows == 0 ? 1 : (rows + block_rows - 1) / block_rows;
}

void fsdp_sum_clear(struct fsdp_sum *s)
{
    free(s->h);
    memset(s, 0, sizeof(*s));
}

// ----------------------------------------------------------------------------
// Writing

int fsdp_sum_stream_begin(struct fsdp_sum_stream *s, size_t rows, size_t block_rows,
                          size_t cols, size_t esize)
{
    memset(s, 0, sizeof(*s));
    s->sum.block_rows = block_rows;
    s->sum.h = calloc(fsdp_sum_nblocks(rows, block_rows), sizeof(uint64_t));
    s->state = XXH3_createState();
    if (!s->sum.h || !s->state || XXH3_64bits_reset(s->state) == XXH_ERROR) {
        fsdp_sum_stream_free(s);
        return fsdp_err(FSDP_ERR_NOMEM, "checksum state");
    }
    s->row_bytes = cols * esize;
    s->esize = esize;
    s->left = block_rows;
    s->rows_left = rows;
    return 0;
}

/* The bytes of n elements of esize as little-endian, whatever the host. */
static void sum_update(XXH3_state_t *st, const unsigned char *p, size_t bytes, size_t esize)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    unsigned char tmp[1 << 14];
    size_t step = sizeof(tmp) / esize * esize;
    for (size_t o = 0; o < bytes; o += step) {
        size_t n = bytes - o < step ? bytes - o : step;
        for (size_t e = 0; e < n; e += esize) {
            for (size_t k = 0; k < esize; k++) {
                tmp[e + k] = p[o + e + esize - 1 - k];
            }
        }
        XXH3_64bits_update(st, tmp, n);
    }
#else
    (void)esize;
    XXH3_64bits_update(st, p, bytes);
#endif
}

void fsdp_sum_stream_rows(struct fsdp_sum_stream *s, const void *rows, size_t nrows)
{
    const unsigned char *p = rows;
    nrows = nrows < s->rows_left ? nrows : s->rows_left;
    s->rows_left -= nrows;
    while (nrows > 0) {
        size_t n = nrows < s->left ? nrows : s->left;
        sum_update(s->state, p, n * s->row_bytes, s->esize);
        p += n * s->row_bytes;
        nrows -= n;
        s->left -= n;
        if (s->left == 0) {
            s->sum.h[s->sum.n++] = XXH3_64bits_digest(s->state);
            XXH3_64bits_reset(s->state);
            s->left = s->sum.block_rows;
        }
    }
}

int fsdp_sum_stream_end(struct fsdp_sum_stream *s)
{
    if (s->rows_left > 0) {
        return -1;
    }
    if (s->left < s->sum.block_rows || s->sum.n == 0) {
        s->sum.h[s->sum.n++] = XXH3_64bits_digest(s->state); /* the last, shorter block */
    }
    return 0;
}

void fsdp_sum_stream_free(struct fsdp_sum_stream *s)
{
    if (s->state) {
        XXH3_freeState(s->state);
    }
    fsdp_sum_clear(&s->sum);
    s->state = NULL;
}

int fsdp_sum_put(hid_t dset, const struct fsdp_sum *s)
{
    hsize_t n = s->n;
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t a = sp < 0 ? -1 : H5Acreate2(dset, FSDP_SUM_ATTR, H5T_STD_U64LE, sp, H5P_DEFAULT,
                                       H5P_DEFAULT);
    herr_t e = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_UINT64, s->h);
    fsdp_h5_close(a);
    fsdp_h5_close(sp);
    if (e < 0 || fsdp_h5_put_attr_i64(dset, FSDP_SUM_ROWS_ATTR, (long long)s->block_rows) < 0) {
        return -1;
    }
    return 0;
}

int fsdp_sum_write(hid_t dset, hid_t mtype, int ndim, size_t rows, size_t cols, size_t esize,
                   const void *data, size_t block_rows)
{
    return fsdp_sum_write_keep(dset, mtype, ndim, rows, cols, esize, data, block_rows, NULL);
}

int fsdp_sum_write_keep(hid_t dset, hid_t mtype, int ndim, size_t rows, size_t cols, size_t esize,
                        const void *data, size_t block_rows, struct fsdp_sum *keep)
{
    struct fsdp_sum_stream st;
    FSDP_CHECK(fsdp_sum_stream_begin(&st, rows, block_rows, cols, esize));
    const unsigned char *p = data;
    int e = 0;
    for (size_t r = 0; e >= 0 && r < rows; r += block_rows) {
        size_t n = rows - r < block_rows ? rows - r : block_rows;
        const void *rowp = p + r * cols * esize;
        fsdp_sum_stream_rows(&st, rowp, n);
        e = fsdp_h5_write_block(dset, ndim, r, n, 0, cols, mtype, rowp);
    }
    if (e >= 0 && (fsdp_sum_stream_end(&st) < 0 || fsdp_sum_put(dset, &st.sum) < 0)) {
        e = -1;
    }
    if (e >= 0 && keep) { /* hand over the hashes instead of freeing them */
        *keep = st.sum;
        memset(&st.sum, 0, sizeof(st.sum));
    }
    fsdp_sum_stream_free(&st);
    return e < 0 ? -1 : 0;
}

// ----------------------------------------------------------------------------
// Reading the attributes

/* xxh3_64 of dset: n unsigned 64-bit integers into out->h. */
static int sum_get_hashes(const char *path, const char *name, hid_t dset, size_t n,
                          struct fsdp_sum *out)
{
    char why[256];
    hid_t a = H5Aopen(dset, FSDP_SUM_ATTR, H5P_DEFAULT);
    hid_t t = a < 0 ? -1 : H5Aget_type(a);
    hid_t sp = a < 0 ? -1 : H5Aget_space(a);
    hssize_t np = sp < 0 ? -1 : H5Sget_simple_extent_npoints(sp);
    int rc = 0;
    if (t < 0 || np < 0) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s' of /%s: %s", path,
                      FSDP_SUM_ATTR, name, fsdp_h5_reason(why, sizeof(why)));
    } else if (H5Tget_class(t) != H5T_INTEGER || H5Tget_size(t) != 8 ||
               H5Tget_sign(t) != H5T_SGN_NONE) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' of /%s must hold unsigned 64-bit "
                      "integers (it has %s type of %zu bytes)", path, FSDP_SUM_ATTR, name,
                      fsdp_h5_class_name(H5Tget_class(t)), H5Tget_size(t));
    } else if ((size_t)np != n) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' of /%s holds %lld hashes but blocks "
                      "of %zu rows need %zu", path, FSDP_SUM_ATTR, name, (long long)np,
                      out->block_rows, n);
    } else if (!(out->h = malloc(n * sizeof(uint64_t)))) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: %zu checksums of /%s", path, n, name);
    } else if (H5Aread(a, H5T_NATIVE_UINT64, out->h) < 0) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: cannot read attribute '%s' of /%s: %s", path,
                      FSDP_SUM_ATTR, name, fsdp_h5_reason(why, sizeof(why)));
    }
    fsdp_h5_close(sp);
    fsdp_h5_close(t);
    fsdp_h5_close(a);
    if (rc == 0) {
        out->n = n;
    }
    return rc;
}

int fsdp_sum_get(const char *path, const char *name, hid_t dset, const size_t *piece_rows,
                 size_t n_pieces, struct fsdp_sum *out)
{
    memset(out, 0, sizeof(*out));
    int has = fsdp_h5_attr_exists(dset, FSDP_SUM_ATTR);
    int has_rows = fsdp_h5_attr_exists(dset, FSDP_SUM_ROWS_ATTR);
    if (!has && !has_rows) {
        return 0;
    }
    if (!has) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: /%s has attribute '%s' but not '%s'", path, name,
                        FSDP_SUM_ROWS_ATTR, FSDP_SUM_ATTR);
    }
    size_t widest = 1, n = 0;
    for (size_t q = 0; q < n_pieces; q++) {
        widest = piece_rows[q] > widest ? piece_rows[q] : widest;
    }
    long long b = (long long)widest; /* absent: each piece is one block */
    if (has_rows) {
        FSDP_CHECK(fsdp_h5_attr_int(path, dset, FSDP_SUM_ROWS_ATTR, &b));
        if (b < 1) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: attribute '%s' of /%s is %lld; a block holds "
                            "at least one row", path, FSDP_SUM_ROWS_ATTR, name, b);
        }
    }
    out->block_rows = (size_t)b;
    for (size_t q = 0; q < n_pieces; q++) {
        n += fsdp_sum_nblocks(piece_rows[q], out->block_rows);
    }
    int rc = sum_get_hashes(path, name, dset, n, out);
    if (rc < 0) {
        fsdp_sum_clear(out);
    }
    return rc;
}

// ----------------------------------------------------------------------------
// Checked reads

void fsdp_sum_buf_free(struct fsdp_sum_buf *b)
{
    fsdp_free(b->p);
    b->p = NULL;
    b->cap = 0;
}

static int sum_buf_reserve(struct fsdp_sum_buf *b, size_t bytes)
{
    if (b->cap >= bytes) {
        return 0;
    }
    void *p = fsdp_alloc(bytes);
    if (!p) {
        return fsdp_err(FSDP_ERR_NOMEM, "%zu bytes for one checksum block", bytes);
    }
    fsdp_free(b->p);
    b->p = p;
    b->cap = bytes;
    return 0;
}

/* [off, off + left) of raw's file into p through its O_DIRECT descriptor,
 * in aligned runs through its scratch buffer: 0, 1 when the descriptor
 * refuses (the caller reads it the ordinary way), -1 with errno set. */
static int sum_pread_direct(const struct fsdp_sum_raw *raw, uint64_t off, uint64_t left,
                            unsigned char *p)
{
    while (left > 0) {
        uint64_t a0 = off / raw->align * raw->align, skip = off - a0;
        uint64_t want = skip + left < raw->scratch_len ? skip + left : raw->scratch_len;
        uint64_t len = (want + raw->align - 1) / raw->align * raw->align;
        ssize_t got = pread(raw->dfd, raw->scratch, len, (off_t)a0);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0 && errno == EINVAL) {
            return 1;
        }
        if (got <= 0 || (uint64_t)got <= skip) {
            errno = got < 0 ? errno : 0; /* 0: the file ends before the piece */
            return -1;
        }
        uint64_t take = (uint64_t)got - skip < left ? (uint64_t)got - skip : left;
        take = take < want - skip ? take : want - skip;
        memcpy(p, (unsigned char *)raw->scratch + skip, take);
        p += take;
        off += take;
        left -= take;
    }
    return 0;
}

/* Rows [row, row + n) of a raw piece (s->raw) into dst with pread; -1 with
 * errno set (0 for a read past the end of the file). */
static int sum_pread_rows(const struct fsdp_sum_src *s, size_t row, size_t n, void *dst)
{
    const size_t row_bytes = s->cols * sizeof(float);
    uint64_t off = (uint64_t)row * row_bytes, left = (uint64_t)n * row_bytes;
    unsigned char *p = dst;
    if (off + left > s->raw->bytes) {
        errno = EINVAL;
        return -1;
    }
    off += s->raw->offset;
    if (s->raw->read) {
        return s->raw->read(s->raw->ctx, off, left, p);
    }
    if (s->raw->dfd >= 0 && s->raw->scratch) {
        int d = sum_pread_direct(s->raw, off, left, p);
        if (d <= 0) {
            return d;
        }
    }
    while (left > 0) {
        ssize_t got = pread(s->raw->fd, p, left, (off_t)off);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            errno = got == 0 ? 0 : errno; /* 0: the file ends before the piece */
            return -1;
        }
        p += got;
        off += (uint64_t)got;
        left -= (uint64_t)got;
    }
    return 0;
}

/* Dataset rows [row, row + n) of all cols, in memory type mtype, into dst. */
static herr_t sum_read_rows(const struct fsdp_sum_src *s, size_t row, size_t n, hid_t mtype,
                            void *dst)
{
    return fsdp_h5_read_block(s->dset, s->ndim, row, n, 0, s->cols, mtype, dst);
}

/* How stored bytes become f32: as they are, by widening, or by HDF5. */
enum sum_conv { SUM_AS_IS, SUM_WIDEN, SUM_HDF5 };

static enum sum_conv sum_conv_of(const struct fsdp_sum_src *s)
{
    if (H5Tequal(s->ftype, H5T_NATIVE_FLOAT) > 0) {
        return SUM_AS_IS;
    }
    int native_le = H5Tget_order(H5T_NATIVE_FLOAT) == H5T_ORDER_LE;
    if ((s->kind == FSDP_H5_F16 || s->kind == FSDP_H5_BF16) && native_le &&
        H5Tget_order(s->ftype) == H5T_ORDER_LE) {
        return SUM_WIDEN;
    }
    return SUM_HDF5;
}

/* Rows [lo, hi) of a block read raw into buf (first row b0), columns
 * [c0, c0 + nc), as f32 into out. */
static int sum_convert(const struct fsdp_sum_src *s, enum sum_conv conv, unsigned char *buf,
                       size_t b0, size_t nb, size_t lo, size_t hi, size_t c0, size_t nc,
                       float *out)
{
    size_t esize = fsdp_h5_float_size(s->kind);
    if (conv == SUM_HDF5) {
        char why[256];
        if (H5Tconvert(s->ftype, H5T_NATIVE_FLOAT, nb * s->cols, buf, NULL, H5P_DEFAULT) < 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: converting tensor '%s' to f32 failed: %s",
                            s->file, s->tensor, fsdp_h5_reason(why, sizeof(why)));
        }
        esize = sizeof(float);
    }
    for (size_t r = lo; r < hi; r++) {
        const unsigned char *row = buf + ((r - b0) * s->cols + c0) * esize;
        float *o = out + (r - lo) * nc;
        if (conv == SUM_WIDEN) {
            FSDP_CHECK(fsdp_convert(o, FSDP_F32, row, s->kind == FSDP_H5_F16 ? FSDP_F16 : FSDP_BF16,
                                    nc));
        } else {
            memcpy(o, row, nc * sizeof(float));
        }
    }
    return 0;
}

int fsdp_sum_read(const struct fsdp_sum_src *s, size_t r0, size_t nr, size_t c0, size_t nc,
                  float *dst, struct fsdp_sum_buf *buf)
{
    char why[256];
    const size_t B = s->block_rows, esize = fsdp_h5_float_size(s->kind);
    const size_t row_bytes = s->cols * esize;
    const enum sum_conv conv = sum_conv_of(s);
    for (size_t k = r0 / B; nr > 0 && k * B < r0 + nr; k++) {
        size_t b0 = k * B, b1 = b0 + B < s->rows ? b0 + B : s->rows;
        size_t lo = b0 > r0 ? b0 : r0, hi = b1 < r0 + nr ? b1 : r0 + nr;
        float *out = dst + (lo - r0) * nc;
        int direct = conv == SUM_AS_IS && nc == s->cols && lo == b0 && hi == b1;
        void *land = out;
        if (!direct) {
            size_t wide = esize > sizeof(float) ? esize : sizeof(float);
            FSDP_CHECK(sum_buf_reserve(buf, (b1 - b0) * s->cols * wide));
            land = buf->p;
        }
        if (s->raw && sum_pread_rows(s, s->row_off + b0, b1 - b0, land) < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: reading tensor '%s' rows [%zu, %zu) failed: %s",
                            s->file, s->tensor, s->show_row0 + b0, s->show_row0 + b1,
                            errno ? strerror(errno) : "the file ends before them (truncated?)");
        }
        if (!s->raw && sum_read_rows(s, s->row_off + b0, b1 - b0,
                                     direct ? H5T_NATIVE_FLOAT : s->ftype, land) < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: reading tensor '%s' rows [%zu, %zu) failed: %s",
                            s->file, s->tensor, s->show_row0 + b0, s->show_row0 + b1,
                            fsdp_h5_reason(why, sizeof(why)));
        }
        uint64_t got = XXH3_64bits(land, (b1 - b0) * row_bytes);
        if (got != s->h[k]) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' rows [%zu, %zu): checksum mismatch "
                            "(stored 0x%016llx, computed 0x%016llx): %s", s->file, s->tensor,
                            s->show_row0 + b0, s->show_row0 + b1, (unsigned long long)s->h[k],
                            (unsigned long long)got, s->hint);
        }
        if (!direct) {
            FSDP_CHECK(sum_convert(s, conv, land, b0, b1 - b0, lo, hi, c0, nc, out));
        }
    }
    return 0;
}
