/*
 * tokenizer.h - Hugging Face byte-level BPE tokenizers: a tokenizer.json of
 * the GPT-2 or Llama 3 family loaded, text encoded to token ids and ids
 * decoded to text, token for token as the `tokenizers` package does
 * (Tokenizer.encode(text, add_special_tokens=False).ids and
 * Tokenizer.decode(ids, skip_special_tokens)).
 *
 * What a file may hold (anything else is refused at load with one error that
 * names the file and the JSON field):
 *   - model: BPE with vocab and merges ("a b" strings or [a, b] pairs),
 *     no dropout, no byte fallback, no subword prefix or suffix;
 *     ignore_merges honoured; every byte's symbol in the vocabulary.
 *   - pre_tokenizer: ByteLevel (with its GPT-2 regex or none, prefix space
 *     or not), or a Sequence of Split(Regex or String, behavior Isolated,
 *     not inverted) ending in ByteLevel, as Llama 3's.
 *   - added_tokens: matched in the text before pre-tokenization, leftmost
 *     and longest first; single_word, lstrip and rstrip must be false.
 *   - decoder: ByteLevel. normalizer, truncation, padding: null.
 *   - post_processor: ByteLevel, TemplateProcessing or a Sequence of them;
 *     encode never adds tokens the text does not hold, and
 *     fsdp_tokenizer_specials gives what the template adds around a text
 *     (Llama 3's <|begin_of_text|>). Another type loads, and only
 *     fsdp_tokenizer_specials refuses it.
 * Regexes run on PCRE2 with Unicode properties; \s and \S mean Unicode
 * White_Space, as in the Oniguruma engine of `tokenizers`. Their work per
 * encoded text is bounded (doc/formats.md): a pattern that looks far ahead
 * or backtracks fails the encode with one error naming the limit.
 *
 * A handle is not thread safe: encode keeps a word cache and scratch
 * buffers in it. Decoding is read-only.
 */
#ifndef FSDP_IO_TOKENIZER_H
#define FSDP_IO_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define FSDP_TOKENIZER_MAX_VOCAB ((size_t)1 << 22) /* ids are below this (real ones: 256K) */

struct fsdp_tokenizer;

/* Reads and checks a tokenizer.json. */
int fsdp_tokenizer_load(const char *path, struct fsdp_tokenizer **out);
void fsdp_tokenizer_free(struct fsdp_tokenizer *tok);

/* The largest id + 1 over the model's vocabulary and the added tokens:
 * what a model's embedding and a token file must hold. */
size_t fsdp_tokenizer_vocab_size(const struct fsdp_tokenizer *tok);
/* The id of a token given as it is written in the file (an added token's
 * content such as "<|endoftext|>", or a vocabulary entry), or -1. */
long fsdp_tokenizer_token_id(const struct fsdp_tokenizer *tok, const char *content);

// ----------------------------------------------------------------------------
// Encoding

/* Receives ids in order, in batches; a negative return stops the encode. */
typedef int (*fsdp_tokenizer_sink)(const uint32_t *ids, size_t n, void *arg);

/* Encodes text[0, len), which must be valid UTF-8 (the error names the
 * first bad byte), handing the ids to sink as they are made. */
int fsdp_tokenizer_encode_to(struct fsdp_tokenizer *tok, const char *text, size_t len,
                             fsdp_tokenizer_sink sink, void *arg);
/* The same into a malloc'd array (*ids NULL for no tokens). */
int fsdp_tokenizer_encode(struct fsdp_tokenizer *tok, const char *text, size_t len,
                          uint32_t **ids, size_t *n);

/*
 * Where a long text can be encoded in pieces (a reader streaming it): the
 * largest p < len at which encoding text[0, p) and then what follows gives
 * the ids of encoding the whole, or 0 when there is none in text[0, len) or
 * this tokenizer cannot be cut (a prefix space, an added token holding a
 * newline, a Split pattern other than Llama 3's or a literal without a
 * newline). p is just after a newline that a visible ASCII character
 * precedes and a letter or digit follows: no piece of GPT-2's or Llama 3's
 * pattern crosses it, and the newline is one piece whether the text ends
 * there or goes on.
 */
size_t fsdp_tokenizer_cut(const struct fsdp_tokenizer *tok, const char *text, size_t len);
/* The length of the longest prefix of text[0, n) that is UTF-8, cut before a
 * sequence that the end of the buffer leaves incomplete (*bad: 1 when what
 * stops it is invalid, 0 when it is the buffer's end). */
size_t fsdp_utf8_prefix(const char *text, size_t n, int *bad);

/*
 * The ids the file's post_processor puts around one encoded text, as
 * Tokenizer.encode(text) (add_special_tokens=True) adds them: the "single"
 * template of a TemplateProcessing, alone or in a Sequence (Llama 3:
 * <|begin_of_text|> before the text, nothing after); none for ByteLevel or
 * no post_processor. The arrays belong to the handle. A post-processor of
 * another type (BertProcessing, ...) is an error naming it.
 */
int fsdp_tokenizer_specials(const struct fsdp_tokenizer *tok, const uint32_t **before,
                            size_t *n_before, const uint32_t **after, size_t *n_after);

// ----------------------------------------------------------------------------
// Decoding

#define FSDP_TOKENIZER_SKIP_SPECIAL 1u /* leave out special added tokens */
#define FSDP_TOKENIZER_RAW 2u /* the bytes as they are: no U+FFFD for invalid UTF-8 */

/*
 * ids -> text into a malloc'd, NUL-terminated buffer of *len bytes. An id
 * the vocabulary does not hold is an error naming it (`tokenizers` drops
 * it). Without FSDP_TOKENIZER_RAW, byte sequences that are not UTF-8 become
 * U+FFFD as `tokenizers` does; with it a caller that decodes a stream piece
 * by piece (a sampler) gets bytes to concatenate.
 */
int fsdp_tokenizer_decode(const struct fsdp_tokenizer *tok, const uint32_t *ids, size_t n,
                          unsigned flags, char **text, size_t *len);

/*
 * Replaces what is not UTF-8 in in[0, n) by U+FFFD, one per maximal invalid
 * subpart (Rust's String::from_utf8_lossy, which `tokenizers` uses), writing
 * at most 3 * n bytes to out (*out_len of them). With final 0 an incomplete
 * sequence at the end is left for the next call: the return value is how
 * many input bytes were consumed.
 */
size_t fsdp_utf8_lossy(const char *in, size_t n, int final, char *out, size_t *out_len);

#endif
