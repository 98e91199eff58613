/*
 * checksum.h - the per-tensor checksums of the HDF5 files fsdpc writes
 * (model files, checkpoint shards, checkpoint index; layout in
 * doc/formats.md, "Checksums"): XXH3-64 over blocks of whole rows of a
 * tensor's bytes as stored, kept in two dataset attributes, xxh3_64 (the
 * hash of every block, in order) and xxh3_64_rows (rows per block).
 *
 * A tensor is read as one or more pieces (a model file's dataset is one
 * piece; a checkpoint index's virtual dataset is one piece per shard, by the
 * split rule), and each piece is cut into blocks of xxh3_64_rows rows from
 * its own first row, the last block shorter; a piece of 0 rows is one empty
 * block. Blocks let a reader that wants some rows (a rank loading its shard)
 * check them by reading at most one block more on each side, instead of the
 * whole tensor.
 *
 * Writers hash each block just before it is written (fsdp_sum_write), or
 * feed whole rows in order to a stream (fsdp_sum_stream_*) and store the
 * result (fsdp_sum_put). Readers load the
 * attributes (fsdp_sum_get; both absent: no checksum, which is allowed) and
 * read through fsdp_sum_read, which hashes every block it touches as it
 * lands in memory and refuses a mismatch with one line naming the file, the
 * tensor and the rows.
 *
 * io-internal: only io/ includes this header (it brings in hdf5.h).
 */
#ifndef FSDP_IO_CHECKSUM_H
#define FSDP_IO_CHECKSUM_H

#include <hdf5.h>

#include <stddef.h>
#include <stdint.h>

#include "io/h5/h5util.h"

#define FSDP_SUM_ATTR "xxh3_64"
#define FSDP_SUM_ROWS_ATTR "xxh3_64_rows"
#define FSDP_SUM_BLOCK_BYTES ((size_t)1 << 20) /* fsdpc's blocks: whole rows up to this size */
#define FSDP_SUM_MAX_BLOCKS ((size_t)4096)     /* blocks per tensor fsdpc writes, at most */

/*
 * Rows per block fsdpc writes for a tensor of `rows` rows of row_bytes
 * bytes each (as stored): as many whole rows as fit in 1 MiB (at least
 * one), more when the tensor would otherwise have over 4096 blocks, and no
 * more than the tensor has. It depends on the whole tensor only, so every
 * shard of a tensor uses the same.
 */
size_t fsdp_sum_block_rows(size_t rows, size_t row_bytes);

/* Blocks of a piece of `rows` rows: ceil(rows / block_rows), and 1 for 0 rows. */
size_t fsdp_sum_nblocks(size_t rows, size_t block_rows);

/* The checksums of a tensor: block_rows 0 means none are recorded. */
struct fsdp_sum {
    size_t block_rows;
    size_t n;    /* hashes */
    uint64_t *h; /* (n,) pieces in order, each piece's blocks in order */
};

void fsdp_sum_clear(struct fsdp_sum *s); /* frees h; s then says "none" */

// ----------------------------------------------------------------------------
// Writing

struct fsdp_sum_stream {
    void *state;       /* XXH3_state_t */
    size_t row_bytes;  /* bytes per row as stored */
    size_t esize;      /* bytes per element: hashed as little-endian */
    size_t left;       /* rows still to come in the current block */
    size_t rows_left;  /* rows still to come in the piece */
    struct fsdp_sum sum;
};

/*
 * Starts the hashes of a piece of `rows` rows of cols elements of esize
 * bytes, in blocks of block_rows. Elements are hashed as little-endian,
 * which is how fsdpc stores them: on a little-endian host the bytes as they
 * are in memory.
 */
int fsdp_sum_stream_begin(struct fsdp_sum_stream *s, size_t rows, size_t block_rows,
                          size_t cols, size_t esize);
/* Feeds the next nrows whole rows (host order, as written). */
void fsdp_sum_stream_rows(struct fsdp_sum_stream *s, const void *rows, size_t nrows);
/* Every row fed: s->sum is complete (0), or not every row came (-1). */
int fsdp_sum_stream_end(struct fsdp_sum_stream *s);
void fsdp_sum_stream_free(struct fsdp_sum_stream *s); /* frees the state and s->sum */

/*
 * Writes `rows` rows of cols elements from data (memory type mtype, esize
 * bytes each as stored) into dataset dset of rank ndim, one block at a
 * time, hashing each block just before it is written (while it is in the
 * cache), and stores the checksums on dset. 0, -1 with HDF5's error stack
 * set, or a negative FSDP_ERR_* (out of memory) with a message.
 */
int fsdp_sum_write(hid_t dset, hid_t mtype, int ndim, size_t rows, size_t cols, size_t esize,
                   const void *data, size_t block_rows);
/* The same, also handing the checksums to keep (freed by the caller with
 * fsdp_sum_clear; left empty on failure). */
int fsdp_sum_write_keep(hid_t dset, hid_t mtype, int ndim, size_t rows, size_t cols, size_t esize,
                        const void *data, size_t block_rows, struct fsdp_sum *keep);

/* Stores s as the attributes of dset (uint64 array, int64 scalar). 0, or -1
 * with HDF5's error stack set. */
int fsdp_sum_put(hid_t dset, const struct fsdp_sum *s);

// ----------------------------------------------------------------------------
// Reading

/*
 * The checksum attributes of dataset `name` ("model/wte.weight") of path,
 * whose rows are the pieces piece_rows (n_pieces,). Both absent: out says
 * none (0). Otherwise xxh3_64 must be unsigned 64-bit integers, one per
 * block of every piece, and xxh3_64_rows an integer >= 1 (absent: each
 * piece is one block); anything else is one error naming path, the dataset
 * and the attribute.
 */
int fsdp_sum_get(const char *path, const char *name, hid_t dset, const size_t *piece_rows,
                 size_t n_pieces, struct fsdp_sum *out);

/* A scratch buffer for blocks that are only partly wanted, grown on demand. */
struct fsdp_sum_buf {
    void *p;
    size_t cap;
};
void fsdp_sum_buf_free(struct fsdp_sum_buf *b);

/* A piece whose bytes are read with pread from an open file instead of
 * through HDF5: little-endian f32, row-major, starting at offset (a
 * checkpoint shard's contiguous dataset, located by its summary). */
struct fsdp_sum_raw {
    int fd;
    uint64_t offset; /* of the piece's first row (row_off is added in rows) */
    uint64_t bytes;  /* of the piece: reads past it are refused */
    /* optional: the same file opened with O_DIRECT (-1: none), read in
     * aligned runs through scratch (scratch_len bytes, a multiple of align,
     * itself aligned) past the page cache; a refusal falls back to fd */
    int dfd;
    size_t align;
    void *scratch;
    size_t scratch_len;
    /* optional: reads the caller makes itself (read-ahead), in place of
     * both: n bytes at file offset off into dst, 0 or -1 with errno set (0:
     * the file ends before them) */
    int (*read)(void *ctx, uint64_t off, uint64_t n, void *dst);
    void *ctx;
};

/* One piece of a dataset to read through its checksums. */
struct fsdp_sum_src {
    const char *file;    /* the file whose bytes these are (for messages) */
    const char *tensor;  /* the tensor's name (for messages) */
    const char *hint;    /* what a mismatch means, ending the message */
    hid_t dset;
    hid_t ftype;         /* the dataset's own type: its bytes as stored */
    enum fsdp_h5_float kind;
    int ndim;            /* 1 or 2 */
    size_t cols;         /* elements per row (1 for 1-D) */
    size_t row_off;      /* dataset row of the piece's first row */
    size_t show_row0;    /* tensor row of the piece's first row (for messages) */
    size_t rows;         /* rows of the piece */
    size_t block_rows;
    const uint64_t *h;   /* (fsdp_sum_nblocks(rows, block_rows),) */
    const struct fsdp_sum_raw *raw; /* NULL: read dset through HDF5 */
};

/*
 * Reads piece rows [r0, r0 + nr) x columns [c0, c0 + nc) as f32 into dst
 * (nr * nc floats, row-major). Every block the rows touch is read whole and
 * hashed as it arrives; a block inside the request with all its columns in
 * f32 goes straight into dst, the others through buf. A mismatch is one
 * FSDP_ERR_FORMAT line: "FILE: tensor 'T' rows [a, b): checksum mismatch
 * (stored 0x.., computed 0x..): HINT"; dst is then undefined.
 */
int fsdp_sum_read(const struct fsdp_sum_src *s, size_t r0, size_t nr, size_t c0, size_t nc,
                  float *dst, struct fsdp_sum_buf *buf);

#endif
