/*
 * test_tokens.c - token files and the data loader: write/read round trip,
 * every kind of bad file, the vocabulary check, batches and targets, cursor
 * save/restore, wrap-around, and the rule that R ranks with batch B see
 * exactly what one rank with batch B*R sees; uint32 (version 2) files: the
 * width picked from the vocabulary, tokens that do not fit it, the loader
 * and the vocabulary check on them, and moving a tail to a second file.
 */
#include "config.h"
#include "core/error.h"
#include "io/text/tokens.h"
#include "tests/tap.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static const char *tpath(const char *name)
{
    static char buf[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", dir, name);
    return buf[k];
}

/* Entries of dir named "<name>.tmp..." (the writer's temporaries). */
static int tmp_entries(const char *name)
{
    char prefix[128];
    int n = 0;
    snprintf(prefix, sizeof(prefix), "%s.tmp", name);
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    }
    if (d) {
        closedir(d);
    }
    return n;
}

/* Writes a raw file: header ints h0..h2, then n tokens, then extra bytes. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count,
                      const uint16_t *tok, size_t n, size_t extra)
{
    int32_t hdr[256] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    FILE *f = fopen(path, "wb");
    fwrite(hdr, 4, 256, f);
    fwrite(tok, 2, n, f);
    for (size_t i = 0; i < extra; i++) {
        fputc(0, f);
    }
    fclose(f);
}

static void expect_open_error(const char *name, const char *want)
{
    struct fsdp_tokens *t = NULL;
    int rc = fsdp_tokens_open(tpath(name), &t);
    tap_ok(rc < 0 && strstr(fsdp_err_msg(), name) && strstr(fsdp_err_msg(), want),
           "%s: %s", name, rc < 0 ? fsdp_err_msg() : "opened a bad file");
    if (rc < 0 && !strstr(fsdp_err_msg(), want)) {
        tap_diag("expected '%s'", want);
    }
    fsdp_err_clear();
    fsdp_tokens_close(t);
}

static void test_files(void)
{
    uint16_t tok[1000];
    uint32_t tok32[1000];
    for (size_t i = 0; i < 1000; i++) {
        tok[i] = (uint16_t)((i * 7919) % 50257);
        tok32[i] = tok[i];
    }
    int rc = fsdp_tokens_write(tpath("good.bin"), 50257, tok32, 1000);
    tap_ok(rc == 0 && tmp_entries("good.bin") == 0, "write 1000 tokens, no temporary left");

    /* the on-disk bytes are llm.c's */
    int32_t hdr[256];
    FILE *f = fopen(tpath("good.bin"), "rb");
    size_t got = fread(hdr, 4, 256, f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fclose(f);
    tap_ok(got == 256 && hdr[0] == 20240520 && hdr[1] == 1 && hdr[2] == 1000 &&
               size == 1024 + 2000,
           "header magic/version/count and file size are llm.c's");

    struct fsdp_tokens *t;
    uint32_t back[1000], lo, hi;
    rc = fsdp_tokens_open(tpath("good.bin"), &t);
    tap_ok(rc == 0 && fsdp_tokens_count(t) == 1000 && fsdp_tokens_version(t) == 1,
           "open: 1000 tokens, version 1");
    rc = fsdp_tokens_read(t, 0, 1000, back);
    tap_ok(rc == 0 && memcmp(back, tok32, sizeof(tok32)) == 0, "read back identical");
    rc = fsdp_tokens_read(t, 990, 11, back);
    tap_ok(rc == FSDP_ERR_INVALID, "read past the end rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_tokens_range(t, &lo, &hi);
    uint32_t rlo = 65535, rhi = 0;
    for (size_t i = 0; i < 1000; i++) {
        rlo = tok[i] < rlo ? tok[i] : rlo;
        rhi = tok[i] > rhi ? tok[i] : rhi;
    }
    tap_ok(rc == 0 && lo == rlo && hi == rhi, "range %u..%u", lo, hi);
    tap_ok(fsdp_tokens_check_vocab(t, 50257) == 0, "all tokens < 50257");
    /* first token >= 40000: position of the first i with (i*7919)%50257 >= 40000 */
    size_t first = 0;
    while (tok[first] < 40000) {
        first++;
    }
    char want[96];
    snprintf(want, sizeof(want), "token %u at position %zu is outside the vocabulary",
             tok[first], first);
    rc = fsdp_tokens_check_vocab(t, 40000);
    tap_ok(rc == FSDP_ERR_FORMAT && strstr(fsdp_err_msg(), want), "vocab check: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_tokens_close(t);

    write_raw(tpath("magic.bin"), 20240521, 1, 1000, tok, 1000, 0);
    expect_open_error("magic.bin", "not an llm.c token file: header[0] is not the magic 20240520");
    struct fsdp_tokens *tm = NULL;
    int rcm = fsdp_tokens_open(tpath("magic.bin"), &tm);
    tap_ok(rcm < 0 && !strstr(fsdp_err_msg(), "20240521"),
           "... and the file's own header[0] (20240521) is not quoted");
    fsdp_err_clear();
    fsdp_tokens_close(tm);
    write_raw(tpath("version.bin"), 20240520, 3, 1000, tok, 1000, 0);
    expect_open_error("version.bin", "token file version 3 in header[1] is not supported");
    /* 1000 uint16 tokens are 500 uint32 ones short of a version 2 file */
    write_raw(tpath("v2short.bin"), 20240520, 2, 1000, tok, 1000, 0);
    expect_open_error("v2short.bin", "header[2] says 1000 tokens (5024 bytes) but the file has "
                                     "3024 bytes (version 2: uint32 tokens)");
    write_raw(tpath("trunc.bin"), 20240520, 1, 1000, tok, 999, 0);
    expect_open_error("trunc.bin", "truncated: header[2] says 1000 tokens (3024 bytes) but the "
                                   "file has 3022 bytes");
    write_raw(tpath("extra.bin"), 20240520, 1, 1000, tok, 1000, 3);
    expect_open_error("extra.bin", "3 extra bytes after the 1000 tokens");
    write_raw(tpath("negative.bin"), 20240520, 1, -5, tok, 0, 0);
    expect_open_error("negative.bin", "negative token count -5");
    f = fopen(tpath("short.bin"), "wb");
    fputs("hello", f);
    fclose(f);
    expect_open_error("short.bin", "truncated: 5 bytes, shorter than the 1024-byte");
    expect_open_error("absent.bin", "cannot open: No such file");

    write_raw(tpath("empty.bin"), 20240520, 1, 0, tok, 0, 0);
    rc = fsdp_tokens_open(tpath("empty.bin"), &t);
    tap_ok(rc == 0 && fsdp_tokens_count(t) == 0 && fsdp_tokens_range(t, &lo, &hi) == 0 &&
               lo == 0 && hi == 0,
           "an empty token file is valid");
    fsdp_tokens_close(t);
}

/* Token i of the loader test file. */
static uint16_t tok_at(size_t i)
{
    return (uint16_t)((i * 40503u + 17u) % 65521u);
}

static int check_batch(const struct fsdp_dataloader *dl, size_t start, const char *what)
{
    size_t n = dl->B * dl->T;
    for (size_t i = 0; i < n; i++) {
        if (dl->inputs[i] != tok_at(start + i) || dl->targets[i] != tok_at(start + i + 1)) {
            tap_diag("%s: first mismatch at %zu: input %d target %d, expected %u %u", what, i,
                     dl->inputs[i], dl->targets[i], tok_at(start + i), tok_at(start + i + 1));
            return 0;
        }
    }
    return 1;
}

static void test_loader(void)
{
    enum { N = 1001 };
    uint32_t tok[N];
    for (size_t i = 0; i < N; i++) {
        tok[i] = tok_at(i);
    }
    fsdp_tokens_write(tpath("stream.bin"), 65536, tok, N);
    const char *path = tpath("stream.bin");

    /* one rank: batches are consecutive B*T windows, targets shifted by one */
    struct fsdp_dataloader *dl;
    int rc = fsdp_dataloader_create(path, 3, 16, 0, 1, 0, &dl);
    tap_ok(rc == 0, "create B=3 T=16 (%s)", fsdp_err_msg());
    int ok = 1;
    /* 1001 tokens hold floor((1001 - 1) / 48) = 20 steps per epoch */
    for (size_t s = 0; s < 20 && ok; s++) {
        ok = fsdp_dataloader_next(dl) == 0 && check_batch(dl, s * 48, "epoch 0") &&
             dl->epoch == 0;
    }
    tap_ok(ok, "20 steps: inputs = tokens[48 s, 48 s + 48), targets shifted by one");
    ok = fsdp_dataloader_next(dl) == 0 && dl->epoch == 1 && check_batch(dl, 0, "wrap");
    tap_ok(ok, "step 21 wraps to token 0 and counts epoch 1");

    /* save, run on, restore: the same batches again */
    struct fsdp_dataloader_state st;
    fsdp_dataloader_next(dl);
    fsdp_dataloader_get_state(dl, &st);
    int after[4][48];
    for (int s = 0; s < 4; s++) {
        fsdp_dataloader_next(dl);
        memcpy(after[s], dl->inputs, sizeof(after[s]));
    }
    struct fsdp_dataloader *dl2;
    rc = fsdp_dataloader_create(path, 3, 16, 0, 1, 0, &dl2);
    rc = rc == 0 ? fsdp_dataloader_set_state(dl2, &st) : rc;
    ok = rc == 0 && st.position == 96 && st.epoch == 1 && st.n_tokens == N;
    for (int s = 0; s < 4 && ok; s++) {
        ok = fsdp_dataloader_next(dl2) == 0 && memcmp(after[s], dl2->inputs, sizeof(after[s])) == 0;
    }
    tap_ok(ok, "restored cursor (position %llu, epoch %llu) resumes exactly",
           (unsigned long long)st.position, (unsigned long long)st.epoch);
    struct fsdp_dataloader_state bad = st;
    bad.n_tokens = N + 1;
    rc = fsdp_dataloader_set_state(dl2, &bad);
    tap_ok(rc == FSDP_ERR_MISMATCH && strstr(fsdp_err_msg(), "saved on a file of 1002 tokens"),
           "state from another file rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    bad = st;
    bad.position = N + 1;
    rc = fsdp_dataloader_set_state(dl2, &bad);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "position 1002 is beyond"),
           "position past the end rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_dataloader_destroy(dl2);
    fsdp_dataloader_destroy(dl);

    /* R ranks with batch B concatenate to one rank with batch B*R, step by step */
    for (int R = 2; R <= 4; R++) {
        size_t B = 2, T = 8;
        struct fsdp_dataloader *one, *ranks[4];
        rc = fsdp_dataloader_create(path, B * (size_t)R, T, 0, 1, 0, &one);
        for (int r = 0; r < R && rc == 0; r++) {
            rc = fsdp_dataloader_create(path, B, T, r, R, 0, &ranks[r]);
        }
        ok = rc == 0;
        /* enough steps to wrap: 1000 / (B*R*T) steps per epoch */
        for (int s = 0; s < 70 && ok; s++) {
            ok = fsdp_dataloader_next(one) == 0;
            for (int r = 0; r < R && ok; r++) {
                ok = fsdp_dataloader_next(ranks[r]) == 0 &&
                     memcmp(ranks[r]->inputs, one->inputs + (size_t)r * B * T,
                            B * T * sizeof(int)) == 0 &&
                     memcmp(ranks[r]->targets, one->targets + (size_t)r * B * T,
                            B * T * sizeof(int)) == 0 &&
                     ranks[r]->epoch == one->epoch && ranks[r]->position == one->position;
                if (!ok) {
                    tap_diag("R=%d: step %d rank %d differs from slice %d of the global batch",
                             R, s, r, r);
                }
            }
        }
        tap_ok(ok && one->epoch >= 1, "R=%d: rank slices concatenate to the 1-rank batch of "
               "B*R for 70 steps (through %llu wraps)", R, (unsigned long long)one->epoch);
        fsdp_dataloader_destroy(one);
        for (int r = 0; r < R; r++) {
            fsdp_dataloader_destroy(ranks[r]);
        }
    }

    rc = fsdp_dataloader_create(path, 25, 41, 0, 1, 0, &dl);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "1001 tokens, but one global batch"),
           "a file smaller than one global batch: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_dataloader_create(path, 2, 8, 2, 2, 0, &dl);
    tap_ok(rc == FSDP_ERR_INVALID, "rank >= world rejected: %s", fsdp_err_msg());
    fsdp_err_clear();
    rc = fsdp_dataloader_create(path, 2, 8, 0, 1, 50000, &dl);
    tap_ok(rc == FSDP_ERR_FORMAT && strstr(fsdp_err_msg(), "outside the vocabulary (vocab_size "
                                                           "50000)"),
           "vocab check at create: %s", fsdp_err_msg());
    fsdp_err_clear();
}

/* Header int32 number k of the file at path. */
static int32_t header_int(const char *path, int k)
{
    int32_t hdr[256] = {0};
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(hdr, 4, 256, f) : 0;
    if (f) {
        fclose(f);
    }
    return got == 256 ? hdr[k] : -1;
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    long n = -1;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        n = ftell(f);
    }
    if (f) {
        fclose(f);
    }
    return n;
}

/* Version 2 (uint32) files: Llama 3's vocabulary of 128256. */
static void test_wide(void)
{
    enum { N = 2001, V = 128256 };
    static uint32_t tok[N], back[N];
    for (size_t i = 0; i < N; i++) {
        tok[i] = (uint32_t)((i * 104729u + 7u) % V);
    }
    tap_ok(fsdp_tokens_version_for(256) == 1 && fsdp_tokens_version_for(65536) == 1 &&
               fsdp_tokens_version_for(65537) == 2 && fsdp_tokens_version_for(V) == 2,
           "the width follows the vocabulary: up to 65536 uint16, above uint32");
    int rc = fsdp_tokens_write(tpath("wide.bin"), V, tok, N);
    tap_ok(rc == 0 && header_int(tpath("wide.bin"), 0) == 20240520 &&
               header_int(tpath("wide.bin"), 1) == 2 && header_int(tpath("wide.bin"), 2) == N &&
               file_size(tpath("wide.bin")) == 1024 + 4 * N,
           "vocab %d: version 2 header, 4 bytes a token (%s)", V, fsdp_err_msg());
    struct fsdp_tokens *t = NULL;
    uint32_t lo = 0, hi = 0, rlo = UINT32_MAX, rhi = 0;
    rc = fsdp_tokens_open(tpath("wide.bin"), &t);
    rc = rc == 0 ? fsdp_tokens_read(t, 0, N, back) : rc;
    tap_ok(rc == 0 && fsdp_tokens_version(t) == 2 && memcmp(back, tok, sizeof(tok)) == 0,
           "version 2 reads back identical");
    for (size_t i = 0; i < N; i++) {
        rlo = tok[i] < rlo ? tok[i] : rlo;
        rhi = tok[i] > rhi ? tok[i] : rhi;
    }
    rc = fsdp_tokens_range(t, &lo, &hi);
    tap_ok(rc == 0 && lo == rlo && hi == rhi && hi > 65535, "range %u..%u", lo, hi);
    tap_ok(fsdp_tokens_check_vocab(t, V) == 0, "all tokens < %d", V);
    /* a version 2 file is scanned even for a vocabulary above 65535 */
    size_t first = 0;
    while (tok[first] < 100000) {
        first++;
    }
    char want[96];
    snprintf(want, sizeof(want), "token %u at position %zu is outside the vocabulary "
             "(vocab_size 100000)", tok[first], first);
    rc = fsdp_tokens_check_vocab(t, 100000);
    tap_ok(rc == FSDP_ERR_FORMAT && strstr(fsdp_err_msg(), want), "vocab 100000 on a v2 file: %s",
           fsdp_err_msg());
    fsdp_err_clear();
    fsdp_tokens_close(t);

    /* the largest values of each width survive */
    uint32_t edge[4] = {0, 65535, 65536, UINT32_MAX};
    rc = fsdp_tokens_write(tpath("edge.bin"), (size_t)UINT32_MAX + 1, edge, 4);
    rc = rc == 0 ? fsdp_tokens_open(tpath("edge.bin"), &t) : rc;
    rc = rc == 0 ? fsdp_tokens_read(t, 0, 4, back) : rc;
    tap_ok(rc == 0 && memcmp(back, edge, sizeof(edge)) == 0, "0, 65535, 65536, 2^32-1 round trip");
    fsdp_tokens_close(t);
    uint16_t one = 65535;
    write_raw(tpath("v1big.bin"), 20240520, 1, 1, &one, 1, 0);
    rc = fsdp_tokens_open(tpath("v1big.bin"), &t);
    rc = rc == 0 ? fsdp_tokens_read(t, 0, 1, back) : rc;
    tap_ok(rc == 0 && back[0] == 65535, "version 1 token 65535 reads as 65535");
    fsdp_tokens_close(t);

    /* a token that does not fit the writer's vocabulary is refused, naming it */
    struct fsdp_tokens_writer *w = NULL, *wv = NULL;
    uint32_t big[3] = {5, 65535, 65536};
    rc = fsdp_tokens_writer_create(tpath("nofit.bin"), 65536, &w);
    rc = rc == 0 ? fsdp_tokens_writer_append(w, big, 3) : rc;
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "token 65536 at position 2 does not "
                                                            "fit the vocabulary of 65536 tokens "
                                                            "(a version 1, uint16 file)"),
           "65536 in a uint16 file: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_tokens_writer_destroy(w);
    tap_ok(tmp_entries("nofit.bin") == 0 && access(tpath("nofit.bin"), F_OK) != 0,
           "the refused file leaves nothing behind");
    rc = fsdp_tokens_writer_create(tpath("huge.bin"), (size_t)UINT32_MAX + 2, &w);
    tap_ok(rc == FSDP_ERR_INVALID && strstr(fsdp_err_msg(), "does not fit a token file"),
           "a vocabulary above 2^32 is refused: %s", fsdp_err_msg());
    fsdp_err_clear();

    /* the loader reads version 2 files; its vocabulary check scans them */
    struct fsdp_dataloader *dl = NULL;
    rc = fsdp_dataloader_create(tpath("wide.bin"), 4, 50, 1, 2, V, &dl);
    int ok = rc == 0 && fsdp_dataloader_next(dl) == 0;
    for (size_t i = 0; ok && i < 200; i++) {
        ok = dl->inputs[i] == (int)tok[200 + i] && dl->targets[i] == (int)tok[201 + i];
    }
    tap_ok(ok, "loader on a version 2 file: rank 1's inputs and targets (%s)", fsdp_err_msg());
    fsdp_dataloader_destroy(dl);
    rc = fsdp_dataloader_create(tpath("wide.bin"), 4, 50, 0, 1, 100000, &dl);
    tap_ok(rc == FSDP_ERR_FORMAT && strstr(fsdp_err_msg(), want),
           "loader with vocab 100000 on a v2 file: %s", fsdp_err_msg());
    fsdp_err_clear();
    /* a version 1 file trains a vocabulary above 65535 without a scan */
    rc = fsdp_dataloader_create(tpath("stream.bin"), 2, 8, 0, 1, V, &dl);
    tap_ok(rc == 0, "loader: a version 1 file with vocab %d", V);
    fsdp_dataloader_destroy(dl);
    /* without a vocabulary, a token above INT32_MAX is refused when read */
    rc = fsdp_dataloader_create(tpath("edge.bin"), 1, 3, 0, 1, 0, &dl);
    rc = rc == 0 ? fsdp_dataloader_next(dl) : rc;
    tap_ok(rc == FSDP_ERR_FORMAT && strstr(fsdp_err_msg(), "token 4294967295 at position 3"),
           "unchecked loader refuses a token above INT32_MAX: %s", fsdp_err_msg());
    fsdp_err_clear();
    fsdp_dataloader_destroy(dl);

    /* a tail moved to a second file: the two files concatenate to the stream */
    rc = fsdp_tokens_writer_create(tpath("head.bin"), V, &w);
    rc = rc == 0 ? fsdp_tokens_writer_create(tpath("tail.bin"), V, &wv) : rc;
    rc = rc == 0 ? fsdp_tokens_writer_append(w, tok, N) : rc;
    rc = rc == 0 ? fsdp_tokens_writer_move_tail(w, 300, wv) : rc;
    ok = rc == 0 && fsdp_tokens_writer_count(w) == N - 300 && fsdp_tokens_writer_count(wv) == 300;
    rc = rc == 0 ? fsdp_tokens_writer_commit(wv) : rc;
    rc = rc == 0 ? fsdp_tokens_writer_commit(w) : rc;
    fsdp_tokens_writer_destroy(w);
    fsdp_tokens_writer_destroy(wv);
    struct fsdp_tokens *th = NULL, *tt = NULL;
    rc = rc == 0 ? fsdp_tokens_open(tpath("head.bin"), &th) : rc;
    rc = rc == 0 ? fsdp_tokens_open(tpath("tail.bin"), &tt) : rc;
    rc = rc == 0 ? fsdp_tokens_read(th, 0, N - 300, back) : rc;
    rc = rc == 0 ? fsdp_tokens_read(tt, 0, 300, back + N - 300) : rc;
    tap_ok(ok && rc == 0 && memcmp(back, tok, sizeof(tok)) == 0 &&
               file_size(tpath("head.bin")) == 1024 + 4 * (N - 300),
           "move_tail: %d + 300 tokens, head truncated (%s)", N - 300, fsdp_err_msg());
    fsdp_tokens_close(th);
    fsdp_tokens_close(tt);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/fsdpc-tok-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_files();
    test_loader();
    test_wide();
    const char *files[] = {"good.bin", "magic.bin", "version.bin", "trunc.bin", "extra.bin",
                           "negative.bin", "short.bin", "empty.bin", "stream.bin", "v2short.bin",
                           "wide.bin", "edge.bin", "nofit.bin", "head.bin", "tail.bin",
                           "v1big.bin", "huge.bin"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        unlink(tpath(files[i]));
    }
    rmdir(dir);
    return tap_done();
}
