/*
 * safetensors.h - reading and writing Hugging Face safetensors files
 * (https://huggingface.co/docs/safetensors): an 8-byte little-endian header
 * length N, N bytes of JSON mapping each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end)} (plus an optional "__metadata__" map of
 * strings), then the tensor bytes, little-endian, row-major, offsets
 * relative to the end of the header.
 *
 * The reader treats the file as untrusted: header size capped, strict JSON,
 * known dtypes, shape x dtype size equal to the byte range, ranges inside
 * the data, non-overlapping, contiguous and covering it all, no duplicate
 * names. Every violation is one error naming the file and the tensor or
 * byte (names from the file made printable). Tensors are read one at a time
 * (pread), so nothing is held whole but the header.
 *
 * Checksums: the writer records the XXH3-64 of every tensor's bytes in
 * __metadata__ under "fsdpc.xxh3_64.<name>" (16 lowercase hex digits); the
 * reader checks each tensor that has one as it reads it (a mismatch is one
 * error naming the file and the tensor). Files from elsewhere have none and
 * are read as they are.
 */
#ifndef FSDP_IO_SAFETENSORS_H
#define FSDP_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

#define FSDP_ST_HEADER_MAX ((size_t)100 << 20) /* as the reference implementation */
#define FSDP_ST_NAME_MAX 256 /* longest tensor name, NUL included */
#define FSDP_ST_SUM_PREFIX "fsdpc.xxh3_64." /* metadata key of a tensor's checksum: + name */
/* longest metadata key, NUL included: a checksum key of the longest name */
#define FSDP_ST_KEY_MAX (FSDP_ST_NAME_MAX + sizeof(FSDP_ST_SUM_PREFIX) - 1)
#define FSDP_ST_RANK_MAX 8

/* Strings below point into the handle's copy of the header and may hold any
 * byte but NUL: print them through fsdp_str_printable (core/util.h). */
struct fsdp_st_tensor {
    const char *name;
    enum fsdp_dtype dtype; /* f32, f16, bf16, i32, i64, u8 */
    int ndim;
    size_t shape[FSDP_ST_RANK_MAX];
    size_t begin, end;     /* byte range relative to the data start */
    int has_xxh3;          /* __metadata__ holds its checksum */
    uint64_t xxh3;         /* XXH3-64 of its bytes */
};

struct fsdp_st_meta {
    const char *key, *value;
};

struct fsdp_safetensors {
    char *path;
    int fd;
    size_t data_off;       /* 8 + N */
    size_t n;              /* tensors */
    struct fsdp_st_tensor *t;          /* (n,) in header order */
    struct fsdp_st_tensor **by_name;   /* (n,) sorted by name, for lookups */
    size_t n_meta;
    struct fsdp_st_meta *meta;         /* (n_meta,) in header order */
    char *hdr;             /* the header JSON, strings unescaped in place */
};

/* Opens and validates path, which must be a regular file (a FIFO is refused,
 * not waited on). */
int fsdp_safetensors_open(const char *path, struct fsdp_safetensors **out);
void fsdp_safetensors_close(struct fsdp_safetensors *st);
/* Index of name, or -1. */
long fsdp_safetensors_find(const struct fsdp_safetensors *st, const char *name);
/* A __metadata__ value, or NULL. */
const char *fsdp_safetensors_meta(const struct fsdp_safetensors *st, const char *key);
/* Reads tensor i's bytes into dst (end - begin bytes), checked against its
 * checksum when the file has one. */
int fsdp_safetensors_read(struct fsdp_safetensors *st, size_t i, void *dst);

/* A tensor to write: name, dtype (f32, f16 or bf16) and 1-D or 2-D shape. */
struct fsdp_st_entry {
    const char *name;
    enum fsdp_dtype dtype;
    int ndim;
    size_t shape[2];
};

struct fsdp_st_writer;

/*
 * Starts a fresh "<path>.tmp.XXXXXX" with the header for entries (in that
 * order, contiguous) and the metadata pairs meta[0..2*n_meta) (key, value,
 * ...), followed by a checksum key per entry whose value commit fills in.
 * The header is padded with spaces so that the data starts 8-byte aligned.
 */
int fsdp_st_writer_create(const char *path, const struct fsdp_st_entry *entries, size_t n,
                          const char *const *meta, size_t n_meta, struct fsdp_st_writer **out);
/* Writes entry i's bytes; entries must be written in order. */
int fsdp_st_writer_put(struct fsdp_st_writer *w, size_t i, const void *data);
/* Checks that all were written, fsyncs and renames into place. */
int fsdp_st_writer_commit(struct fsdp_st_writer *w);
/* Frees w; an uncommitted file is removed. */
void fsdp_st_writer_destroy(struct fsdp_st_writer *w);

#endif
