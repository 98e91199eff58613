/*
 * fuzz_tokenizer.c - libFuzzer harness: the input is a tokenizer.json; it
 * must load or be refused, and a loaded one must encode a multilingual text
 * (with an added token's content in it when the file has one) and the
 * input itself where it is UTF-8, and decode every id back to exactly the
 * bytes encoded: byte-level BPE loses nothing, so any difference is a bug
 * (the harness traps, and libFuzzer keeps the input as a crash); the ids a
 * post-processor template adds must be in the vocabulary, and a text cut
 * where fsdp_tokenizer_cut says must encode in two pieces as it does whole.
 */
#include "config.h"
#include "tests/fuzz/fuzz.h"
#include "io/text/tokenizer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Encodes text and decodes the ids raw: the same bytes, or a trap. An
 * encode that refuses the text (not UTF-8) is fine. */
static void fz_round_trip(struct fsdp_tokenizer *tok, const char *text, size_t len)
{
    uint32_t *ids = NULL;
    size_t n = 0, back_len = 0;
    char *back = NULL;
    if (fsdp_tokenizer_encode(tok, text, len, &ids, &n) < 0) {
        return;
    }
    if (fsdp_tokenizer_decode(tok, ids, n, FSDP_TOKENIZER_RAW, &back, &back_len) < 0 ||
        back_len != len || memcmp(back, text, len) != 0) {
        __builtin_trap();
    }
    free(back);
    free(ids);
}

/* Encoding text in two pieces cut where fsdp_tokenizer_cut says gives the
 * ids of encoding it whole, or a trap. */
static void fz_cut(struct fsdp_tokenizer *tok, const char *text, size_t len)
{
    size_t cut = fsdp_tokenizer_cut(tok, text, len), n = 0, na = 0, nb = 0;
    uint32_t *all = NULL, *a = NULL, *b = NULL;
    if (cut == 0 || fsdp_tokenizer_encode(tok, text, len, &all, &n) < 0) {
        return;
    }
    if (fsdp_tokenizer_encode(tok, text, cut, &a, &na) < 0 ||
        fsdp_tokenizer_encode(tok, text + cut, len - cut, &b, &nb) < 0 || na + nb != n ||
        (na && memcmp(all, a, na * sizeof(*a)) != 0) ||
        (nb && memcmp(all + na, b, nb * sizeof(*b)) != 0)) {
        __builtin_trap();
    }
    free(all);
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char text[] =
        "The gradient of a shard, café naïve Ελληνικά русский 中文 日本語 😀👍🏽 "
        "don't it's 2024-05-20 3.14159 \t\n\n  <|endoftext|>abcd[X]  \xc2\xa0" "end";
    struct fsdp_tokenizer *tok;
    fuzz_init();
    const char *path = fuzz_write("tokenizer.json", data, size);
    int rc = fsdp_tokenizer_load(path, &tok);
    if (rc == 0) {
        fz_round_trip(tok, text, sizeof(text) - 1);
        fz_round_trip(tok, (const char *)data, size < 4096 ? size : 4096);
        static const char lines[] = "first line.\nSecond  line,\t'tis\n  indented\r\n42 "
                                    "<|endoftext|>\nend!\n\nX \xe4\xb8\xad\n7";
        fz_cut(tok, lines, sizeof(lines) - 1);
        fz_cut(tok, (const char *)data, size < 4096 ? size : 4096);
        const uint32_t *pre, *post;
        size_t npre, npost;
        if (fsdp_tokenizer_specials(tok, &pre, &npre, &post, &npost) == 0) {
            for (size_t i = 0; i < npre + npost; i++) { /* every id the template adds is known */
                if ((i < npre ? pre[i] : post[i - npre]) >= fsdp_tokenizer_vocab_size(tok)) {
                    __builtin_trap();
                }
            }
        }
        (void)fsdp_tokenizer_vocab_size(tok);
        (void)fsdp_tokenizer_token_id(tok, "<|endoftext|>");
        fsdp_tokenizer_free(tok);
    }
    fuzz_done(rc);
    return 0;
}
