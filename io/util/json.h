/*
 * json.h - JSON documents in and out: small files such as a Hugging Face
 * config.json or model.safetensors.index.json.
 *
 * Reading parses with Jansson (duplicate keys refused) and hands out typed
 * members of objects; every failure is one error naming the file and the
 * member's path ("x/config.json: 'rope_scaling.factor' is "two"; expected a
 * number"), with text from the file made printable. A member that is
 * absent, or null, takes the caller's default; without one it is an error.
 *
 * Writing builds an indented document (two spaces, as Python's json.dumps
 * with indent=2 writes it) in memory. Members appear in the order they are
 * written. A float is written as the shortest decimal that reads back as
 * the same binary32 value, with ".0" added to a whole number, so that 1e-5f
 * is "1e-05" and 500000 is "500000.0" (what Python prints for them).
 */
#ifndef FSDP_IO_JSON_H
#define FSDP_IO_JSON_H

#include <stddef.h>
#include <stdio.h>

struct json_t; /* Jansson's value */

// ----------------------------------------------------------------------------
// reading

/* An object inside a document: the file and the object's path there
 * ("" for the top level, "rope_scaling." inside that member), for messages. */
struct fsdp_json_obj {
    const char *file;
    char where[64];
    struct json_t *obj; /* borrowed from the document */
};

/* Parses path, a regular file of at most max_bytes read in blocks, with
 * duplicate keys refused: *doc is its top-level value, whatever its type. */
int fsdp_json_parse_file(const char *path, size_t max_bytes, struct json_t **doc);

/* Parses path (a regular file of at most max_bytes) whose top level must be
 * an object; *doc owns it and *root views it (root->file is borrowed: path
 * must outlive it). */
int fsdp_json_load(const char *path, size_t max_bytes, struct json_t **doc,
                   struct fsdp_json_obj *root);
void fsdp_json_free(struct json_t *doc);

/* 1 when key is present (null included), else 0. */
int fsdp_json_has(const struct fsdp_json_obj *o, const char *key);
/* 1 when key is present and null, else 0. */
int fsdp_json_is_null(const struct fsdp_json_obj *o, const char *key);

/* An integer in [lo, hi] (a number with a fraction is refused). Absent or
 * null: *dflt, or an error when dflt is NULL. */
int fsdp_json_int(const struct fsdp_json_obj *o, const char *key, long long lo, long long hi,
                  const long long *dflt, long long *out);
/* An integer in [lo, hi], or an array of them (transformers' eos_token_id
 * may be either): the first max into out[], their count in *n (the whole
 * array's, which may exceed max); absent or null: *n = 0. */
int fsdp_json_int_list(const struct fsdp_json_obj *o, const char *key, long long lo, long long hi,
                       long long *out, size_t max, size_t *n);
/* A finite number (integer or real). */
int fsdp_json_num(const struct fsdp_json_obj *o, const char *key, const double *dflt,
                  double *out);
/* true or false. */
int fsdp_json_bool(const struct fsdp_json_obj *o, const char *key, const int *dflt, int *out);
/* A string, borrowed from the document (dflt NULL: required). */
int fsdp_json_str(const struct fsdp_json_obj *o, const char *key, const char *dflt,
                  const char **out);
/* An object member: 0 with *sub set, 1 when absent or null, < 0 when it is
 * something else. */
int fsdp_json_obj(const struct fsdp_json_obj *o, const char *key, struct fsdp_json_obj *sub);

/* Calls fn on every member of o, in document order; every value must be a
 * string. A negative return of fn stops and is returned. */
int fsdp_json_each_str(const struct fsdp_json_obj *o,
                       int (*fn)(const char *key, const char *value, void *arg), void *arg);

// ----------------------------------------------------------------------------
// writing

#define FSDP_JSON_DEPTH_MAX 16

struct fsdp_json_writer {
    FILE *m;        /* open_memstream over buf */
    char *buf;
    size_t len;
    int depth;
    size_t count[FSDP_JSON_DEPTH_MAX]; /* members written at each level */
    char close[FSDP_JSON_DEPTH_MAX];   /* '}' or ']' */
    int top;        /* the top-level value has begun */
    int bad;        /* a misuse or a non-finite float happened */
};

/* Every call below takes key NULL inside an array or for the top level,
 * a key inside an object. */
int fsdp_json_writer_init(struct fsdp_json_writer *w);
void fsdp_json_begin_obj(struct fsdp_json_writer *w, const char *key);
void fsdp_json_begin_arr(struct fsdp_json_writer *w, const char *key);
void fsdp_json_end(struct fsdp_json_writer *w);
void fsdp_json_put_str(struct fsdp_json_writer *w, const char *key, const char *s);
void fsdp_json_put_int(struct fsdp_json_writer *w, const char *key, long long v);
void fsdp_json_put_f32(struct fsdp_json_writer *w, const char *key, float v);
void fsdp_json_put_bool(struct fsdp_json_writer *w, const char *key, int v);
void fsdp_json_put_null(struct fsdp_json_writer *w, const char *key);
/* The finished text (malloc'd, ends with a newline) into *text and *len;
 * the writer is freed either way. FSDP_ERR_NOMEM, or FSDP_ERR_INTERNAL for
 * unbalanced nesting or a non-finite float. */
int fsdp_json_writer_finish(struct fsdp_json_writer *w, char **text, size_t *len);
/* Frees an unfinished writer. */
void fsdp_json_writer_free(struct fsdp_json_writer *w);

#endif
