/*
 * tokens.h - llm.c token files and the data loader that walks them.
 *
 * A token file is a 256 x int32 little-endian header (magic 20240520,
 * version at [1], token count at [2]) followed by count little-endian
 * tokens: uint16 in version 1, uint32 in version 2 (llm.c's marks; files
 * prepared for llm.c's GPT-2 and Llama 3 train here unchanged). A writer
 * picks the narrowest version its vocabulary fits. Readers hand out uint32
 * tokens whatever the file's width. Files are read with pread, never mapped
 * (a file truncated under a mapping would kill the process with SIGBUS) and
 * never read whole.
 *
 * The data loader hands out llm.c style batches: B sequences of T inputs and
 * the same tokens shifted by one as targets, B*T + 1 consecutive tokens per
 * rank. A step's global batch is the B*R sequences that start at the cursor,
 * contiguous in the stream; data-parallel rank r takes the r-th slice of B
 * sequences, so R ranks with batch B see exactly the tokens of one rank with
 * batch B*R (doc/formats.md has the exact rules).
 */
#ifndef FSDP_IO_TOKENS_H
#define FSDP_IO_TOKENS_H

#include <stddef.h>
#include <stdint.h>

#define FSDP_TOKENS_MAGIC 20240520
#define FSDP_TOKENS_VERSION_U16 1 /* uint16 tokens */
#define FSDP_TOKENS_VERSION_U32 2 /* uint32 tokens */
#define FSDP_TOKENS_U16_VOCAB 65536u /* the largest vocabulary a version 1 file holds */
#define FSDP_TOKENS_HEADER_INTS 256
#define FSDP_TOKENS_HEADER_BYTES (FSDP_TOKENS_HEADER_INTS * 4)
#define FSDP_TOKENS_MAX_COUNT 2147483647u /* the count is an int32 in the header */

// ----------------------------------------------------------------------------
// Reading

struct fsdp_tokens; /* an open, validated token file */

/* Opens path and checks magic, version and that the size matches the count. */
int fsdp_tokens_open(const char *path, struct fsdp_tokens **out);
void fsdp_tokens_close(struct fsdp_tokens *t);

size_t fsdp_tokens_count(const struct fsdp_tokens *t);
const char *fsdp_tokens_path(const struct fsdp_tokens *t);
/* FSDP_TOKENS_VERSION_U16 or FSDP_TOKENS_VERSION_U32. */
int fsdp_tokens_version(const struct fsdp_tokens *t);

/* Reads tokens [pos, pos + n) into dst, widened to uint32 from a version 1 file. */
int fsdp_tokens_read(const struct fsdp_tokens *t, size_t pos, size_t n, uint32_t *dst);

/* The error names the first token >= vocab_size. Scans the whole file
 * unless its width cannot hold such a token (version 1, vocab >= 65536). */
int fsdp_tokens_check_vocab(const struct fsdp_tokens *t, int vocab_size);

/* Smallest and largest token in the file (0 and 0 for an empty file). */
int fsdp_tokens_range(const struct fsdp_tokens *t, uint32_t *min, uint32_t *max);

// ----------------------------------------------------------------------------
// Writing: to a fresh "<path>.tmp.XXXXXX" beside path, renamed to path on commit

struct fsdp_tokens_writer;

/* The version a vocabulary of vocab_size tokens needs: 1 up to 65536, else 2. */
int fsdp_tokens_version_for(size_t vocab_size);

/* A file for tokens < vocab_size (at most 2^32), of the version it needs. */
int fsdp_tokens_writer_create(const char *path, size_t vocab_size,
                              struct fsdp_tokens_writer **out);
/* Appends n tokens; a token >= the writer's vocab_size is refused, naming it. */
int fsdp_tokens_writer_append(struct fsdp_tokens_writer *w, const uint32_t *tokens, size_t n);
/* Tokens appended so far (less any moved away). */
size_t fsdp_tokens_writer_count(const struct fsdp_tokens_writer *w);
/* Moves the last n tokens appended to w to the end of dst (a validation
 * split taken from the end of a stream whose length was not known ahead). */
int fsdp_tokens_writer_move_tail(struct fsdp_tokens_writer *w, size_t n,
                                 struct fsdp_tokens_writer *dst);
/* Writes the header, fsyncs and renames. Call destroy afterwards in every case. */
int fsdp_tokens_writer_commit(struct fsdp_tokens_writer *w);
/* Frees w; an uncommitted file is removed. */
void fsdp_tokens_writer_destroy(struct fsdp_tokens_writer *w);

/* Convenience: writes n tokens < vocab_size as one file. */
int fsdp_tokens_write(const char *path, size_t vocab_size, const uint32_t *tokens, size_t n);

// ----------------------------------------------------------------------------
// Data loader

/* What a checkpoint stores to resume the loader exactly. */
struct fsdp_dataloader_state {
    uint64_t position; /* token index where the next global batch starts */
    uint64_t epoch;    /* completed passes over the file */
    uint64_t n_tokens; /* token count of the file it was saved on; 0: unchecked */
};

struct fsdp_dataloader {
    struct fsdp_tokens *tokens; /* owned */
    size_t B;                   /* sequences per rank per step */
    size_t T;                   /* sequence length */
    int rank;                   /* data-parallel rank */
    int world;                  /* data-parallel size R */
    uint64_t position;          /* token index where the next global batch starts */
    uint64_t epoch;             /* completed passes */
    uint64_t step_tokens;       /* B * R * T: the cursor advance per step */
    int wrap;                   /* 1 (default): next() wraps at the end; 0: passes (below) */
    uint32_t *stage;            /* (B*T + 1,) this rank's raw slice */
    int *inputs;                /* (B, T) */
    int *targets;               /* (B, T) inputs shifted by one token */
};

/*
 * Opens the token file at path (either version) for data-parallel rank
 * `rank` of `world`. vocab_size > 0 checks every token against it first (one
 * pass over the file, skipped where the width makes it moot); without it a
 * token above INT32_MAX is refused when read. Fails when one global batch
 * (B*R*T + 1 tokens) does not fit the file.
 */
int fsdp_dataloader_create(const char *path, size_t B, size_t T, int rank, int world,
                           int vocab_size, struct fsdp_dataloader **out);
void fsdp_dataloader_destroy(struct fsdp_dataloader *dl);

/*
 * Fills inputs and targets with this rank's slice of the next global batch
 * and advances the cursor by B*R*T tokens. When fewer than B*R*T + 1 tokens
 * remain, the cursor first wraps to 0 and the epoch counter increments.
 * With wrap 0 the slice is read as long as it fits (the last global batch
 * of a pass may cover only the first ranks) and reading past the end is an
 * error: the caller starts the next pass.
 */
int fsdp_dataloader_next(struct fsdp_dataloader *dl);

/*
 * Passes without wrapping (training for whole epochs, join for uneven
 * inputs). A step is K micro-batches; this rank "has a step" when all K of
 * its slices lie inside the file from the cursor on, so a pass never
 * straddles the end of the file and a shorter tail is left out (llm.c and
 * torch's drop_last do the same with a partial batch).
 */
/* 1 when the next K micro-batches of this rank fit before the end of the file. */
int fsdp_dataloader_fits(const struct fsdp_dataloader *dl, int K);
/* Steps of K micro-batches this rank gets in one pass from the start of the file. */
uint64_t fsdp_dataloader_steps_per_pass(const struct fsdp_dataloader *dl, int K);
/* Starts the next pass: the cursor goes to 0 and the epoch counter increments. */
void fsdp_dataloader_new_pass(struct fsdp_dataloader *dl);
/*
 * The state fsdp_dataloader_next would leave after n micro-batches from the
 * start of the file in wrapping mode (each one wraps to 0 when its slice
 * does not fit): resumes a loader whose position was not stored.
 */
void fsdp_dataloader_state_after(const struct fsdp_dataloader *dl, uint64_t n,
                                 struct fsdp_dataloader_state *st);

void fsdp_dataloader_get_state(const struct fsdp_dataloader *dl, struct fsdp_dataloader_state *st);
/* Restores a saved cursor; the error says why a state does not fit this file. */
int fsdp_dataloader_set_state(struct fsdp_dataloader *dl, const struct fsdp_dataloader_state *st);

#endif
