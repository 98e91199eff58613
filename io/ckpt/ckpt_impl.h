/*
 * ckpt_impl.h - what the checkpoint's files share (ckpt_writer.c: the
 * kinds, shard files and the layout; ckpt_direct.c: their large datasets'
 * bytes; ckpt_ahead.c: read-ahead of a shard; ckpt_summary.c: each shard's
 * summary; ckpt_index.c: index.h5; ckpt_path.c: which step a path names;
 * ckpt_reader.c: opening and reading; ckpt_consolidate.c: one model file):
 * the groups of the tensor kinds, shard file names, file creation, direct
 * writes, read-ahead, summaries, and the split of checksum blocks over
 * shards. Private to io/ckpt/ckpt_*.c.
 */
#ifndef FSDP_IO_CKPT_IMPL_H
#define FSDP_IO_CKPT_IMPL_H

#include <hdf5.h>
#include <pthread.h>

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/ckpt/ckpt.h"
#include "io/h5/checksum.h"
#include "core/spec.h"
#include "core/util.h"

#define CK_PATH_MAX 4096

#define CK_H5_V18 1   /* objects in the HDF5 1.8 format at least */
#define CK_H5_ALIGN 2 /* datasets of CK_DIRECT_MIN bytes or more start at a multiple of CK_ALIGN   \
                       */
/*
 * Creates a new HDF5 file at path, reserves `reserve` bytes for it and
 * reopens it for writing (ckpt_writer.c says why), with the CK_H5_* flags.
 * 0 with *out set, or a negative FSDP_ERR_* naming path.
 */
FSDP_PRIVATE int ck_h5_create(const char *path, size_t reserve, unsigned flags, hid_t *out);
/* path -> the step directory it names (index.h5's directory, or
 * root/latest) into dir (ckpt_path.c); 0 or an error naming path. */
FSDP_PRIVATE int ck_resolve(const char *path, char *dir, size_t len);
/* Creates the groups of k's kinds (/model, /optim, /optim/<state>); 0 or -1
 * (HDF5's error stack). */
FSDP_PRIVATE int ck_make_groups(hid_t f, const struct fsdp_ckpt_kinds *k);

static inline size_t ck_file_bound(size_t n, size_t data)
{
    return data + ((size_t)64 << 10) + n * ((size_t)2 << 10);
}

/* dir/shard_<shard>.h5; 0, or -1 when it does not fit in len. */
static inline int ck_shard_path(char *buf, size_t len, const char *dir, int shard)
{
    int n = snprintf(buf, len, "%s/shard_%d.h5", dir, shard);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Rows per checksum block of parameter p's tensors (f32, every shard alike). */
static inline size_t ck_block_rows(const struct fsdp_param_spec *p)
{
    return fsdp_sum_block_rows(p->shape[0], p->shape[1] * sizeof(float));
}

/* Offset in a tensor's hashes (shards in order) of shard r's blocks: the
 * first n mod R shards hold one row more, the others the same number. */
static inline size_t ck_sum_first(const struct fsdp_param_spec *p, int n_shards, int r,
                                  size_t block_rows)
{
    size_t base = p->shape[0] / (size_t)n_shards, extra = p->shape[0] % (size_t)n_shards;
    size_t big = (size_t)r < extra ? (size_t)r : extra;
    return big * fsdp_sum_nblocks(base + 1, block_rows) +
           ((size_t)r - big) * fsdp_sum_nblocks(base, block_rows);
}

// ----------------------------------------------------------------------------
// Direct writes (ckpt_direct.c)

#define CK_ALIGN 4096                    /* O_DIRECT's unit: offsets, sizes, buffers */
#define CK_DIRECT_MIN ((size_t)64 << 10) /* datasets this large are aligned, written direct */
#define CK_DIRECT_BUF (8 << 20)          /* one write, one read, at most */
#define CK_IO_CHUNK ((size_t)4 << 20)    /* one write, one read, by default */
#define CK_IO_THREADS 4                  /* requests in flight per file, by default */
#define CK_DIRECT_ROW_MAX (1 << 20)      /* rows up to this are written direct */
#define CK_IO_MAX_THREADS 8              /* threads of a writer or reader, at most */
#define CK_IO_MAX_BUF (CK_IO_MAX_THREADS + 2)

/* The chunk size (bytes, a multiple of CK_ALIGN, at least twice
 * CK_DIRECT_ROW_MAX, at most CK_DIRECT_BUF) and the threads (requests in
 * flight) of direct writes and of read-ahead: CK_IO_CHUNK and CK_IO_THREADS
 * (doc/performance.md measures them), or FSDPC_CKPT_WRITE_IO and
 * FSDPC_CKPT_READ_IO ("MiB,requests"; anything else is one warning). */
struct ck_io_shape {
    size_t chunk;
    int threads;
};
FSDP_PRIVATE void ck_io_shape(struct ck_io_shape *w, struct ck_io_shape *r);

/* One buffer's write: len bytes of it at file offset off, the aligned part
 * with O_DIRECT and, when last, the rest through the ordinary descriptor. */
struct ck_wjob {
    uint64_t off;
    size_t len;
    int last;
    int state;                    /* CK_W_FREE, CK_W_QUEUED, CK_W_WRITING */
    char what[CK_PATH_MAX + 300]; /* the dataset, for a message */
};

struct ck_direct {
    int dfd;   /* O_DIRECT descriptor (-1: the file system refused it) */
    int bfd;   /* an ordinary one, for what is not a whole CK_ALIGN block */
    void *buf; /* (nbuf, shape.chunk) aligned to CK_ALIGN */
    struct ck_io_shape shape;
    int nbuf; /* shape.threads + 2: one filled while the others are written */
    /* the writer threads (threaded 0: none, each write made by the caller) */
    pthread_t thread[CK_IO_MAX_THREADS];
    int threaded, stop, refused; /* refused: O_DIRECT refused, bfd for the rest */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ck_wjob job[CK_IO_MAX_BUF];
    unsigned long queued, taken; /* jobs handed over, and taken by a thread */
    int cur;                     /* the buffer being filled (-1: none) */
    size_t fill;                 /* its bytes so far */
    int err;                     /* errno of the first failed write (0: none) */
    char err_what[CK_PATH_MAX + 300];
};

/* 0 when FSDPC_CKPT_DIRECT=0 asks for the page cache, else 1. */
FSDP_PRIVATE int ck_direct_wanted(void);
/* Descriptors of path (an existing file), the buffers and the writer
 * thread; 0 or an error. */
FSDP_PRIVATE int ck_direct_open(const char *path, struct ck_direct *d);
/* Every write handed over made: 0, or the error of the first that failed. */
FSDP_PRIVATE int ck_direct_finish(struct ck_direct *d);
/* Waits for the writes in flight (their errors dropped: finish reports
 * them), stops the thread, closes the descriptors. */
FSDP_PRIVATE void ck_direct_close(struct ck_direct *d);
/* rows of row_bytes from data to file offset off (a multiple of CK_ALIGN),
 * each block of block_rows hashed into *sum (new; the caller frees it) as
 * it is copied into a buffer; the writes may still be in flight when it
 * returns (data is no longer needed then), ck_direct_finish waits for them.
 * what names the dataset in messages. 0 or an error (also an earlier
 * dataset's failed write). */
FSDP_PRIVATE int ck_direct_write(struct ck_direct *d, const char *what, uint64_t off,
                                 const void *data, size_t rows, size_t row_bytes, size_t block_rows,
                                 struct fsdp_sum *sum);

// ----------------------------------------------------------------------------
// Read-ahead (ckpt_ahead.c)

struct ck_ahead;

/* The buffers and the reader thread; 0 or an error. */
FSDP_PRIVATE int ck_ahead_create(struct ck_ahead **out);
FSDP_PRIVATE void ck_ahead_destroy(struct ck_ahead *a);
/* The file read from now: fd an ordinary descriptor, dfd the same file with
 * O_DIRECT (-1: none). Another fd (-1: none) empties the window first,
 * once the reads in flight are done: call it before closing a descriptor. */
FSDP_PRIVATE void ck_ahead_use(struct ck_ahead *a, int fd, int dfd);
/* Bytes [off, off + n) of a piece are wanted next (whole checksum blocks). */
FSDP_PRIVATE void ck_ahead_want(struct ck_ahead *a, uint64_t off, uint64_t n);
/* fsdp_sum_raw.read: n bytes at off into dst from the window (ctx: the
 * stream); 0, or -1 with errno (0: the file ends before them). */
FSDP_PRIVATE int ck_ahead_read(void *ctx, uint64_t off, uint64_t n, void *dst);

// ----------------------------------------------------------------------------
// Shard summary (ckpt_summary.c; doc/formats.md, "Shard summary")

#define CK_SUM_ATTR "ckpt_summary"

/* Summaries are written and used where f32 in memory is the file's
 * little-endian f32 (their rows are then read with pread, as they are). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define CK_SUM_HOST 1
#else
#define CK_SUM_HOST 0
#endif

/* One tensor of a shard as its summary records it. */
struct ck_entry {
    uint64_t row0, rows, cols; /* rows [row0, row0 + rows) of a tensor of cols columns */
    uint64_t offset, bytes;    /* its contiguous f32 data in the file (bytes 0: none) */
    uint64_t addr;             /* its dataset's object address: where its link must point */
    struct fsdp_sum sum;       /* its checksums */
};

/* Which shard of which checkpoint a summary must describe. */
struct ck_shard_id {
    long step;
    int shard, n_shards;
};

/* Stores the summary of e (n_kinds * n_params entries, kind-major) on f's
 * root; 0, or -1 (HDF5's error stack) / a negative FSDP_ERR_*. */
FSDP_PRIVATE int ck_summary_put(hid_t f, const struct ck_shard_id *id, int n_kinds, size_t n_params,
                                const struct ck_entry *e);
/* Loads f's summary into e (n_kinds * n_params, zeroed; free with
 * ck_entries_free) when it is the summary of shard id of spec's tensors with
 * every tensor inside the file's file_size bytes: 0; 1 when f has none; or
 * one error naming path. */
FSDP_PRIVATE int ck_summary_load(const char *path, hid_t f, const struct ck_shard_id *id,
                                 const struct fsdp_model_spec *spec, int n_kinds,
                                 uint64_t file_size, struct ck_entry *e);
/* Every tensor's link is a hard link to the object e records: 0; 1 with
 * *odd the first that is not (the caller's full check says why); or an error. */
FSDP_PRIVATE int ck_summary_links(const char *path, hid_t f, const struct fsdp_model_spec *spec,
                                  const struct fsdp_ckpt_kinds *k, const struct ck_entry *e,
                                  size_t *odd);
FSDP_PRIVATE void ck_entries_free(struct ck_entry *e, size_t n);
/* File access for reading shards one after another: a small metadata
 * cache, no sieve buffer. -1 on failure. */
FSDP_PRIVATE hid_t ck_h5_fapl_small(void);

/* Dataset dims of `rows` rows of parameter p. */
static inline int ck_dims(const struct fsdp_param_spec *p, size_t rows, hsize_t *dims)
{
    dims[0] = rows;
    dims[1] = p->shape[1];
    return p->ndim;
}

#endif
