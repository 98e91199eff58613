/*
 * tokenizer_api.c - io/text/tokenizer.h as a program other than fsdpc-data uses
 * it (the sampler): encode into an array, token ids by name, decode with
 * and without RAW, the streaming UTF-8 repair, an empty text, a sink that
 * stops the encode, the post-processor's tokens (none for ByteLevel; with
 * --special FILE TEXT, the ids of TEXT with them, for the comparison with
 * transformers). Run by test_tokenizer.sh with its hand-made tiny.json
 * (byte b is id b, "abc" 257, <|endoftext|> 262); prints what differs and
 * exits 1 on any difference.
 */
#include "config.h"
#include "core/error.h"
#include "io/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;

static void check(int ok, const char *what)
{
    if (!ok) {
        printf("FAILED: %s (%s)\n", what, fsdp_err_msg());
        failed = 1;
    }
    fsdp_err_clear();
}

static int stop_sink(const uint32_t *ids, size_t n, void *arg)
{
    (void)ids;
    (void)n;
    (void)arg;
    return fsdp_err(FSDP_ERR_IO, "sink full");
}

static void test_lossy(void)
{
    /* "é" cut after its first byte: held back unless final */
    char out[64];
    size_t len, used = fsdp_utf8_lossy("ab\xc3", 3, 0, out, &len);
    check(used == 2 && len == 2 && memcmp(out, "ab", 2) == 0, "incomplete tail held back");
    used = fsdp_utf8_lossy("ab\xc3", 3, 1, out, &len);
    check(used == 3 && len == 5 && memcmp(out, "ab\xef\xbf\xbd", 5) == 0,
          "incomplete tail at the end is one U+FFFD");
    /* maximal subparts: E2 82 then 'x' is one U+FFFD; C0 and 80 one each */
    used = fsdp_utf8_lossy("\xe2\x82x\xc0\x80", 5, 1, out, &len);
    check(len == 10 && memcmp(out, "\xef\xbf\xbdx\xef\xbf\xbd\xef\xbf\xbd", 10) == 0,
          "one U+FFFD per maximal invalid subpart");
}

/* --special FILE TEXT: the ids of TEXT with the post-processor's tokens
 * around them, as transformers' encode(text) gives them, on one line (or
 * the error). */
static int encode_special(const char *path, const char *text)
{
    struct fsdp_tokenizer *tok;
    const uint32_t *pre, *post;
    uint32_t *ids = NULL;
    size_t npre, npost, n = 0;
    if (fsdp_tokenizer_load(path, &tok) < 0) {
        printf("error: %s\n", fsdp_err_msg());
        return 1;
    }
    int rc = fsdp_tokenizer_specials(tok, &pre, &npre, &post, &npost);
    if (rc == 0) {
        rc = fsdp_tokenizer_encode(tok, text, strlen(text), &ids, &n);
    }
    if (rc < 0) {
        printf("error: %s\n", fsdp_err_msg());
        fsdp_tokenizer_free(tok);
        return 1;
    }
    for (size_t i = 0; i < npre + n + npost; i++) {
        uint32_t id = i < npre ? pre[i] : i < npre + n ? ids[i - npre] : post[i - npre - n];
        printf("%s%u", i ? " " : "", id);
    }
    printf("\n");
    free(ids);
    fsdp_tokenizer_free(tok);
    return 0;
}

int main(int argc, char **argv)
{
    struct fsdp_tokenizer *tok;
    if (argc == 4 && strcmp(argv[1], "--special") == 0) {
        return encode_special(argv[2], argv[3]);
    }
    if (argc != 2 || fsdp_tokenizer_load(argv[1], &tok) < 0) {
        printf("usage: tokenizer_api tiny.json (%s)\n", fsdp_err_msg());
        return 1;
    }
    check(fsdp_tokenizer_vocab_size(tok) == 264, "vocab size 264");
    check(fsdp_tokenizer_token_id(tok, "<|endoftext|>") == 262 &&
              fsdp_tokenizer_token_id(tok, "abc") == 257 &&
              fsdp_tokenizer_token_id(tok, "nope") == -1,
          "token ids by name");

    const char *text = "abcd<|endoftext|>\xc3\xa9";
    uint32_t *ids;
    size_t n;
    int rc = fsdp_tokenizer_encode(tok, text, strlen(text), &ids, &n);
    const uint32_t want[] = {257, 100, 262, 0xc3, 0xa9};
    check(rc == 0 && n == 5 && memcmp(ids, want, sizeof(want)) == 0, "encode into an array");

    char *out;
    size_t len;
    rc = fsdp_tokenizer_decode(tok, ids, n, 0, &out, &len);
    check(rc == 0 && len == strlen(text) && strcmp(out, text) == 0, "decode");
    free(out);
    rc = fsdp_tokenizer_decode(tok, ids, 4, FSDP_TOKENIZER_SKIP_SPECIAL, &out, &len);
    check(rc == 0 && strcmp(out, "abcd\xef\xbf\xbd") == 0, "half a character is U+FFFD");
    free(out);
    rc = fsdp_tokenizer_decode(tok, ids, 4, FSDP_TOKENIZER_RAW, &out, &len);
    check(rc == 0 && len == 18 && memcmp(out, "abcd<|endoftext|>\xc3", 18) == 0,
          "RAW keeps the bytes for a caller that streams");
    free(out);
    uint32_t bad = 264;
    rc = fsdp_tokenizer_decode(tok, &bad, 1, 0, &out, &len);
    check(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "token id 264 at position 0"),
          "decode refuses an id outside the vocabulary");
    free(ids);

    rc = fsdp_tokenizer_encode(tok, "", 0, &ids, &n);
    check(rc == 0 && n == 0 && ids == NULL, "an empty text has no tokens");
    rc = fsdp_tokenizer_encode_to(tok, "abc", 3, stop_sink, NULL);
    check(rc == FSDP_ERR_IO && strstr(fsdp_err_msg(), "sink full"), "a sink's error stops it");
    rc = fsdp_tokenizer_encode(tok, "a\xff", 2, &ids, &n);
    check(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "not valid UTF-8 at byte 1"),
          "invalid UTF-8 refused");
    const uint32_t *pre, *post;
    size_t npre = 1, npost = 1;
    rc = fsdp_tokenizer_specials(tok, &pre, &npre, &post, &npost);
    check(rc == 0 && npre == 0 && npost == 0, "a ByteLevel post-processor adds no token");
    test_lossy();
    fsdp_tokenizer_free(tok);
    printf("%s\n", failed ? "tokenizer API: differences above" : "tokenizer API: all as expected");
    return failed;
}
