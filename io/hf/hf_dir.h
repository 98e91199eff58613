/*
 * hf_dir.h - Hugging Face model directories (what transformers'
 * save_pretrained writes and from_pretrained reads): config.json and the
 * weights, either one model.safetensors or shards listed by
 * model.safetensors.index.json ({"metadata": {...}, "weight_map": {tensor
 * name: shard file}}).
 *
 * Reading opens config.json (the caller interprets its members: the
 * architecture is not io's business) and every safetensors file, and joins
 * their tensors into one table sorted by name. The directory is untrusted:
 * a shard named in the index must be a plain file name inside it, present,
 * and a valid safetensors file; every tensor lies in exactly one file, and
 * the index and the files agree on which. Each violation is one error
 * naming the file and the tensor. Tensors are read one at a time, so
 * nothing is held whole but the headers.
 *
 * Writing fills a fresh directory "<dir>.tmp.XXXXXX" beside dir, tensors
 * in the caller's order cut into shards of at most max_shard bytes the way
 * transformers cuts them (a shard closes when the next tensor would take
 * it over the size; a tensor larger than the size is a shard alone),
 * named model-00001-of-0000N.safetensors with an index when there are
 * several, else model.safetensors; commit renames the directory into place.
 */
#ifndef FSDP_IO_HF_DIR_H
#define FSDP_IO_HF_DIR_H

#include <stddef.h>

#include "io/util/json.h"
#include "io/hf/safetensors.h"

#define FSDP_HF_CONFIG "config.json"
#define FSDP_HF_WEIGHTS "model.safetensors"
#define FSDP_HF_INDEX "model.safetensors.index.json"
#define FSDP_HF_JSON_MAX ((size_t)64 << 20) /* config.json and the index */

// ----------------------------------------------------------------------------
// reading

struct fsdp_hf_tensor {
    const struct fsdp_st_tensor *t; /* name, dtype, shape: in its file's handle */
    size_t file;                    /* which of files holds it */
};

struct fsdp_hf_dir {
    char *dir;
    char *config_path;              /* <dir>/config.json */
    struct json_t *config_doc;
    struct fsdp_json_obj config;    /* its top-level object */
    char *index_path;               /* <dir>/model.safetensors.index.json, or NULL */
    size_t n_files;
    struct fsdp_safetensors **files; /* (n_files,) in the order the index names them */
    size_t n;
    struct fsdp_hf_tensor *t;       /* (n,) sorted by name */
};

/*
 * Opens dir: config.json (a JSON object) and the weights, model.safetensors
 * when present (as transformers prefers it), else the index and the shards
 * it names.
 */
int fsdp_hf_dir_open(const char *dir, struct fsdp_hf_dir **out);
void fsdp_hf_dir_close(struct fsdp_hf_dir *d);
/* Index in d->t of the tensor called name, or -1. */
long fsdp_hf_dir_find(const struct fsdp_hf_dir *d, const char *name);
/* The path of the file that holds tensor i (for messages). */
const char *fsdp_hf_dir_file(const struct fsdp_hf_dir *d, size_t i);
/* Tensor i's bytes into dst (end - begin bytes), checked against the
 * checksum its file records, if any. */
int fsdp_hf_dir_read(struct fsdp_hf_dir *d, size_t i, void *dst);

/* What is at path: 0 nothing or an empty directory, 1 a directory with
 * entries; anything else (a file, a link) is an error naming path. */
int fsdp_hf_dir_occupied(const char *path);

// ----------------------------------------------------------------------------
// writing

struct fsdp_hf_writer;

/*
 * Starts dir's replacement as "<dir>.tmp.XXXXXX" for entries (borrowed,
 * names included, until destroy), cut into shards of at most max_shard
 * bytes (>= 1). dir must hold nothing (fsdp_hf_dir_occupied 0) unless
 * replace is set, in which case a directory there is replaced whole.
 */
int fsdp_hf_writer_create(const char *dir, const struct fsdp_st_entry *entries, size_t n,
                          size_t max_shard, int replace, struct fsdp_hf_writer **out);
/* Shards the tensors were cut into. */
size_t fsdp_hf_writer_shards(const struct fsdp_hf_writer *w);
/* Writes entry i's bytes (its dtype, row-major); entries go in order. */
int fsdp_hf_writer_put(struct fsdp_hf_writer *w, size_t i, const void *data);
/* Adds a small file called name (config.json) holding text[0, len). */
int fsdp_hf_writer_file(struct fsdp_hf_writer *w, const char *name, const char *text, size_t len);
/*
 * Checks that every entry was written, writes the index when there are
 * several shards, and renames the directory to dir (a directory already
 * there is first moved aside, then removed). Every file was fsynced when
 * written and the directories are fsynced around the rename.
 */
int fsdp_hf_writer_commit(struct fsdp_hf_writer *w);
/* Frees w; an uncommitted directory is removed. */
void fsdp_hf_writer_destroy(struct fsdp_hf_writer *w);

#endif
