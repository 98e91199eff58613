/*
 * tokenizer_impl.h - what tokenizer.c (loading, decoding),
 * tokenizer_added.c (added tokens), tokenizer_encode.c (encoding) and
 * tokenizer_post.c (the post-processor)
 * share: the handle, its hash tables, the byte-level alphabet and the
 * loader's field-naming errors. Private to io/tokenizer*.c.
 */
#ifndef FSDP_IO_TOKENIZER_IMPL_H
#define FSDP_IO_TOKENIZER_IMPL_H

#include "io/text/tokenizer.h"
#include "core/util.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

// ----------------------------------------------------------------------------
// Hash tables (open addressing, linear probing, power-of-two capacity)

static inline uint64_t tk_mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* String -> uint32; keys are copied into one arena. */
struct tk_strent {
    uint64_t hash;
    uint32_t off, len; /* key bytes in the arena */
    uint32_t val;
    uint32_t used;
};

struct tk_strmap {
    struct tk_strent *slot; /* (cap,) */
    size_t cap, n;
    char *arena;
    size_t arena_len, arena_cap;
};

FSDP_PRIVATE uint64_t tk_hash(const void *s, size_t len);
FSDP_PRIVATE int tk_strmap_init(struct tk_strmap *m, size_t expect);
FSDP_PRIVATE void tk_strmap_free(struct tk_strmap *m);
/* Inserts key -> val; returns 1 and leaves the value when key is there
 * already (*old set), 0 when inserted, FSDP_ERR_NOMEM. */
FSDP_PRIVATE int tk_strmap_put(struct tk_strmap *m, const char *key, size_t len, uint32_t val,
                               uint32_t *old);
/* 1 and *val when found, else 0. */
FSDP_PRIVATE int tk_strmap_get(const struct tk_strmap *m, const char *key, size_t len,
                               uint32_t *val);

/* Pair of ids -> (rank + 1, merged id); rank1 0 marks an empty slot. */
struct tk_pairent {
    uint64_t key;
    uint32_t rank1, id;
};

struct tk_pairmap {
    struct tk_pairent *slot; /* (cap,) */
    size_t cap;
};

static inline const struct tk_pairent *tk_pair_get(const struct tk_pairmap *m, uint32_t a,
                                                   uint32_t b)
{
    uint64_t key = (uint64_t)a << 32 | b;
    for (size_t i = tk_mix64(key) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const struct tk_pairent *e = &m->slot[i];
        if (e->rank1 == 0) {
            return NULL;
        }
        if (e->key == key) {
            return e;
        }
    }
}

// ----------------------------------------------------------------------------
// The handle

/* An added token: matched in the text before anything else. */
struct tk_added {
    char *content; /* (len,) UTF-8 */
    size_t len;
    uint32_t id;
    int special;    /* skipped by decode with FSDP_TOKENIZER_SKIP_SPECIAL */
    int normalized; /* matched in the second pass (see tokenizer_encode.c) */
};

/* The added tokens one pass matches: found by content, trying at a
 * position the lengths of the tokens that start with its byte, longest
 * first (a few lengths, however many tokens). */
struct tk_addset {
    struct tk_strmap by_content; /* content -> index into the handle's added[] */
    uint32_t *lens;              /* (n_lens,) */
    size_t n;                    /* tokens in the set */
    uint32_t from[257];          /* lens[from[b], from[b + 1]): lengths of those starting with b */
};

struct tk_regex {
    pcre2_code *re;
    pcre2_match_data *md;
};

/* Word cache: piece bytes -> ids, cleared whole when full. */
struct tk_cache_ent {
    uint64_t hash;
    uint32_t key_off, key_len;
    uint32_t ids_off, n_ids;
};

struct tk_cache {
    struct tk_cache_ent *slot; /* (cap,), key_len 0 empty */
    size_t cap, n;
    unsigned char *keys;
    size_t keys_len, keys_cap;
    uint32_t *ids;
    size_t ids_len, ids_cap;
};

/* One symbol of a word being merged (a doubly linked list in an array). */
struct tk_sym {
    uint32_t id;
    int32_t prev, next;
    uint32_t len; /* 0: merged into its left neighbour */
};

struct tk_merge {
    uint32_t rank, pos, id;
};

struct fsdp_tokenizer {
    char *path;
    size_t vocab_size; /* largest id + 1 */
    size_t n_model;    /* entries of model.vocab */

    /* model */
    struct tk_strmap vocab;  /* model.vocab: symbol string -> id */
    struct tk_pairmap merges;
    uint32_t byte_id[256];   /* the id of each byte's symbol */
    int ignore_merges;

    /* added tokens */
    struct tk_added *added;  /* (n_added,) */
    size_t n_added;
    struct tk_addset set_raw;  /* normalized false: matched first */
    struct tk_addset set_norm; /* normalized true: matched in what is left */

    /* pre-tokenizer: Split stages, then ByteLevel */
    struct tk_regex *splits; /* (n_splits,) */
    size_t n_splits;
    int prefix_space;        /* ByteLevel add_prefix_space */
    int no_cut;              /* a Split pattern fsdp_tokenizer_cut does not know */
    struct tk_regex bl;      /* ByteLevel's own regex; re NULL without use_regex */
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit;

    /* post-processor: the ids TemplateProcessing's "single" puts around one
     * text, n_before before it and n_after after it (tokenizer_post.c) */
    uint32_t *post_ids;
    size_t n_before, n_after;
    int post_template;       /* a TemplateProcessing was read */
    char post_type[48];      /* a post-processor type that is not applied; "": none */

    /* decoding: the bytes of every id */
    uint64_t *dec_off;       /* (vocab_size + 1,) */
    unsigned char *dec;
    uint8_t *dec_flags;      /* (vocab_size,) TK_DEC_* */

    /* encoding scratch */
    struct tk_cache cache;
    struct tk_sym *sym;
    size_t sym_cap;
    struct tk_merge *heap;
    size_t heap_cap;
    char *pre;               /* a piece with its prefix space */
    size_t pre_cap;
    char *buf;               /* a piece's symbol string (ignore_merges) */
    size_t buf_cap;
    uint32_t *out;           /* ids waiting for the sink */
    size_t out_n, out_cap;
    fsdp_tokenizer_sink sink;
    void *sink_arg;
    uint64_t re_len, re_used, re_budget; /* this text's bytes, regex work done and allowed */
};

#define TK_DEC_KNOWN 1u
#define TK_DEC_SPECIAL 2u

/* bytes_to_unicode: the code point that stands for byte b, and back (-1). */
FSDP_PRIVATE uint32_t tk_byte_char(unsigned b);
FSDP_PRIVATE int tk_char_byte(uint32_t cp);
/* UTF-8 of a code point below 0x800 into out (1 or 2 bytes); returns the count. */
static inline size_t tk_utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

/* Checks the UTF-8 sequence at in[0] (a byte >= 0x80, avail bytes there):
 * 1 valid, 0 invalid, -1 cut short by the end; *n is its length, or that of
 * its longest valid prefix (the maximal subpart U+FFFD replaces). */
FSDP_PRIVATE int tk_utf8_seq(const unsigned char *in, size_t avail, size_t *n);

/* Compiles a pre-tokenizer pattern (\s, \S rewritten to Unicode
 * White_Space); field names it in errors. */
FSDP_PRIVATE int tk_regex_compile(struct fsdp_tokenizer *tok, const char *pattern, size_t len,
                                  int literal, const char *field, struct tk_regex *out);
FSDP_PRIVATE void tk_regex_free(struct tk_regex *r);
/* Frees the encoder's scratch and cache. */
FSDP_PRIVATE void tk_encoder_free(struct fsdp_tokenizer *tok);

// ----------------------------------------------------------------------------
// Loading: errors that name the field (tokenizer.c)

#define TK_SHOW 64 /* bytes of a token quoted in a message */

/* "PATH: FIELD: message", class FSDP_ERR_UNSUPPORTED or FSDP_ERR_FORMAT. */
FSDP_PRIVATE int tk_bad(const struct fsdp_tokenizer *tok, int code, const char *field,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* A printable copy of text from the file for a message. */
FSDP_PRIVATE const char *tk_show(char *buf, size_t n, const char *s);
/* Refuses keys of obj outside the NULL-terminated list allowed. */
FSDP_PRIVATE int tk_keys(const struct fsdp_tokenizer *tok, const json_t *obj, const char *field,
                         const char *const *allowed);
/* obj must be an object whose "type" is a string; *type points into it. */
FSDP_PRIVATE int tk_type(const struct fsdp_tokenizer *tok, const json_t *obj, const char *field,
                         const char **type);
/* A non-negative integer id below FSDP_TOKENIZER_MAX_VOCAB. */
FSDP_PRIVATE int tk_id(const struct fsdp_tokenizer *tok, const json_t *v, const char *field,
                       uint32_t *id);
/* obj[key] as a boolean; dflt when absent. */
FSDP_PRIVATE int tk_bool(const struct fsdp_tokenizer *tok, const json_t *obj, const char *field,
                         const char *key, int dflt, int *out);
/* added_tokens (NULL or null: none), after model.vocab; *max_id raised to
 * the largest id (tokenizer_added.c). */
FSDP_PRIVATE int tk_load_added(struct fsdp_tokenizer *tok, const json_t *list, uint32_t *max_id);
/* The post_processor (NULL or null: none), after the vocabulary is known
 * (tokenizer_post.c). */
FSDP_PRIVATE int tk_load_post(struct fsdp_tokenizer *tok, const json_t *pp);

#endif
