/*
 * tokens.c - llm.c token files (reading with pread, writing by tmp + rename)
 * and the data loader with its resumable cursor.
 *
 * Owns the on-disk byte order (little endian) and the batch slicing rule the
 * sharding engine's equivalence tests rely on; it must not read a whole file
 * into memory or keep a mapping that a truncation could turn into SIGBUS.
 */
#include "config.h"
#include "io/tokens.h"
#include "io/fileutil.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TOK_CHUNK ((size_t)1 << 20) /* tokens per scan / write chunk */

struct fsdp_tokens {
    char *path;
    int fd;
    size_t count;
};

struct fsdp_tokens_writer {
    char *path;
    char *tmp_path;
    int fd;
    size_t count;
    uint16_t *stage; /* (TOK_CHUNK,) little-endian copy of appended tokens */
    int committed;
};

// ----------------------------------------------------------------------------
// Plain I/O

/* pread until n bytes or EOF; returns bytes read or -1. */
static ssize_t tok_pread_full(int fd, void *buf, size_t n, off_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return -1;
        }
        if (r == 0) {
            break;
        }
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static int tok_pwrite_full(int fd, const void *buf, size_t n, off_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pwrite(fd, (const char *)buf + done, n - done, off + (off_t)done);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            return -1;
        }
        done += (size_t)r;
    }
    return 0;
}

static void tok_le16_to_host(uint16_t *v, size_t n)
{
#if __BYTE_ORDER == __BIG_ENDIAN
    for (size_t i = 0; i < n; i++) {
        v[i] = le16toh(v[i]);
    }
#else
    (void)v;
    (void)n;
#endif
}

// ----------------------------------------------------------------------------
// Reading

int fsdp_tokens_open(const char *path, struct fsdp_tokens **out)
{
    int32_t hdr[FSDP_TOKENS_HEADER_INTS];
    struct stat st;
    int rc;
    struct fsdp_tokens *t = calloc(1, sizeof(*t));
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return fsdp_err(FSDP_ERR_NOMEM, "%s: token file handle", path);
    }
    /* O_NONBLOCK: a FIFO would otherwise block open() until a writer came;
     * reads of the regular file that fstat then requires ignore the flag */
    t->fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (t->fd < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto err;
    }
    if (fstat(t->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: not a regular file", path);
        goto err;
    }
    size_t size = (size_t)st.st_size;
    ssize_t got = tok_pread_full(t->fd, hdr, sizeof(hdr), 0);
    if (got < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: reading the header failed: %s", path, strerror(errno));
        goto err;
    }
    if ((size_t)got < sizeof(hdr)) {
        rc = fsdp_err(FSDP_ERR_FORMAT,
                      "%s: truncated: %zu bytes, shorter than the %d-byte token file header", path,
                      size, FSDP_TOKENS_HEADER_BYTES);
        goto err;
    }
    int32_t magic = (int32_t)le32toh((uint32_t)hdr[0]);
    int32_t version = (int32_t)le32toh((uint32_t)hdr[1]);
    int32_t count = (int32_t)le32toh((uint32_t)hdr[2]);
    if (magic != FSDP_TOKENS_MAGIC) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: bad magic %d in header[0] (expected %d): not an llm.c "
                      "token file", path, magic, FSDP_TOKENS_MAGIC);
        goto err;
    }
    if (version != FSDP_TOKENS_VERSION) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: token file version %d in header[1] is not supported "
                      "(only version 1, uint16 tokens)%s", path, version,
                      version == 2 ? "; version 2 holds uint32 tokens" : "");
        goto err;
    }
    if (count < 0) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: negative token count %d in header[2]", path, count);
        goto err;
    }
    size_t want = FSDP_TOKENS_HEADER_BYTES + 2 * (size_t)count;
    if (size < want) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: truncated: header[2] says %d tokens (%zu bytes) but "
                      "the file has %zu bytes", path, count, want, size);
        goto err;
    }
    if (size > want) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: %zu extra bytes after the %d tokens header[2] "
                      "announces (file %zu bytes, expected %zu)", path, size - want, count, size,
                      want);
        goto err;
    }
    t->count = (size_t)count;
    *out = t;
    return 0;
err:
    fsdp_tokens_close(t);
    return rc;
}

void fsdp_tokens_close(struct fsdp_tokens *t)
{
    if (!t) {
        return;
    }
    if (t->fd >= 0) {
        close(t->fd);
    }
    free(t->path);
    free(t);
}

size_t fsdp_tokens_count(const struct fsdp_tokens *t)
{
    return t->count;
}

const char *fsdp_tokens_path(const struct fsdp_tokens *t)
{
    return t->path;
}

int fsdp_tokens_read(const struct fsdp_tokens *t, size_t pos, size_t n, uint16_t *dst)
{
    if (pos > t->count || n > t->count - pos) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: tokens [%zu, %zu) are beyond its %zu tokens",
                        t->path, pos, pos + n, t->count);
    }
    off_t off = (off_t)(FSDP_TOKENS_HEADER_BYTES + 2 * pos);
    ssize_t got = tok_pread_full(t->fd, dst, 2 * n, off);
    if (got < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: read failed: %s", t->path, strerror(errno));
    }
    if ((size_t)got != 2 * n) {
        return fsdp_err(FSDP_ERR_IO, "%s: file shrank while reading (token %zu)", t->path,
                        pos + (size_t)got / 2);
    }
    tok_le16_to_host(dst, n);
    return 0;
}

/* Visits the file in chunks; fn returns 1 to stop early. */
static int tok_scan(const struct fsdp_tokens *t,
                    int (*fn)(const uint16_t *v, size_t n, size_t base, void *arg), void *arg)
{
    uint16_t *buf = malloc(TOK_CHUNK * sizeof(uint16_t));
    int rc = 0;
    if (!buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: scan buffer", t->path);
    }
    for (size_t pos = 0; pos < t->count; pos += TOK_CHUNK) {
        size_t n = t->count - pos < TOK_CHUNK ? t->count - pos : TOK_CHUNK;
        FSDP_CHECK_GOTO(fsdp_tokens_read(t, pos, n, buf), rc, out);
        if (fn(buf, n, pos, arg)) {
            break;
        }
    }
out:
    free(buf);
    return rc;
}

struct tok_vocab_scan {
    uint16_t limit;
    int found;
    size_t pos;
    uint16_t value;
};

static int tok_vocab_fn(const uint16_t *v, size_t n, size_t base, void *arg)
{
    struct tok_vocab_scan *s = arg;
    for (size_t i = 0; i < n; i++) {
        if (v[i] >= s->limit) {
            s->found = 1;
            s->pos = base + i;
            s->value = v[i];
            return 1;
        }
    }
    return 0;
}

int fsdp_tokens_check_vocab(const struct fsdp_tokens *t, int vocab_size)
{
    if (vocab_size <= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "vocab_size %d must be positive", vocab_size);
    }
    if (vocab_size > 65535) {
        return 0; /* every uint16 fits */
    }
    struct tok_vocab_scan s = {(uint16_t)vocab_size, 0, 0, 0};
    FSDP_CHECK(tok_scan(t, tok_vocab_fn, &s));
    if (s.found) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: token %u at position %zu is outside the vocabulary "
                        "(vocab_size %d)", t->path, (unsigned)s.value, s.pos, vocab_size);
    }
    return 0;
}

struct tok_range_scan {
    uint16_t min, max;
};

static int tok_range_fn(const uint16_t *v, size_t n, size_t base, void *arg)
{
    struct tok_range_scan *s = arg;
    (void)base;
    for (size_t i = 0; i < n; i++) {
        s->min = v[i] < s->min ? v[i] : s->min;
        s->max = v[i] > s->max ? v[i] : s->max;
    }
    return 0;
}

int fsdp_tokens_range(const struct fsdp_tokens *t, uint16_t *min, uint16_t *max)
{
    struct tok_range_scan s = {UINT16_MAX, 0};
    FSDP_CHECK(tok_scan(t, tok_range_fn, &s));
    *min = t->count ? s.min : 0;
    *max = s.max;
    return 0;
}

// ----------------------------------------------------------------------------
// Writing

int fsdp_tokens_writer_create(const char *path, struct fsdp_tokens_writer **out)
{
    int32_t hdr[FSDP_TOKENS_HEADER_INTS] = {0};
    int rc;
    struct fsdp_tokens_writer *w = calloc(1, sizeof(*w));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: token writer", path);
    }
    w->fd = -1;
    w->path = strdup(path);
    w->stage = malloc(TOK_CHUNK * sizeof(uint16_t));
    if (!w->path || !w->stage) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: token writer", path);
        goto err;
    }
    FSDP_CHECK_GOTO(fsdp_file_tmp_create(path, &w->tmp_path, &w->fd), rc, err);
    /* a placeholder header (magic 0) until commit knows the count */
    if (tok_pwrite_full(w->fd, hdr, sizeof(hdr), 0) < 0) {
        rc = fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
        goto err;
    }
    *out = w;
    return 0;
err:
    fsdp_tokens_writer_destroy(w);
    return rc;
}

int fsdp_tokens_writer_append(struct fsdp_tokens_writer *w, const uint16_t *tokens, size_t n)
{
    if (n > FSDP_TOKENS_MAX_COUNT - w->count) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: more than %u tokens do not fit one token file "
                        "(the count is an int32); split the data into shards", w->path,
                        FSDP_TOKENS_MAX_COUNT);
    }
    for (size_t done = 0; done < n;) {
        size_t k = n - done < TOK_CHUNK ? n - done : TOK_CHUNK;
        for (size_t i = 0; i < k; i++) {
            w->stage[i] = htole16(tokens[done + i]);
        }
        off_t off = (off_t)(FSDP_TOKENS_HEADER_BYTES + 2 * (w->count + done));
        if (tok_pwrite_full(w->fd, w->stage, 2 * k, off) < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
        }
        done += k;
    }
    w->count += n;
    return 0;
}

int fsdp_tokens_writer_commit(struct fsdp_tokens_writer *w)
{
    int32_t hdr[FSDP_TOKENS_HEADER_INTS] = {0};
    if (w->committed || w->fd < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: token writer already committed", w->path);
    }
    hdr[0] = (int32_t)htole32(FSDP_TOKENS_MAGIC);
    hdr[1] = (int32_t)htole32(FSDP_TOKENS_VERSION);
    hdr[2] = (int32_t)htole32((uint32_t)w->count);
    if (tok_pwrite_full(w->fd, hdr, sizeof(hdr), 0) < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
    }
    int e = close(w->fd);
    w->fd = -1;
    if (e != 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: close failed: %s", w->tmp_path, strerror(errno));
    }
    FSDP_CHECK(fsdp_file_commit(w->tmp_path, w->path));
    w->committed = 1;
    return 0;
}

void fsdp_tokens_writer_destroy(struct fsdp_tokens_writer *w)
{
    if (!w) {
        return;
    }
    if (w->fd >= 0) {
        close(w->fd);
    }
    if (!w->committed && w->tmp_path) {
        unlink(w->tmp_path);
    }
    free(w->stage);
    free(w->tmp_path);
    free(w->path);
    free(w);
}

int fsdp_tokens_write(const char *path, const uint16_t *tokens, size_t n)
{
    struct fsdp_tokens_writer *w;
    int rc;
    FSDP_CHECK(fsdp_tokens_writer_create(path, &w));
    FSDP_CHECK_GOTO(fsdp_tokens_writer_append(w, tokens, n), rc, out);
    rc = fsdp_tokens_writer_commit(w);
out:
    fsdp_tokens_writer_destroy(w);
    return rc;
}

// ----------------------------------------------------------------------------
// Data loader

int fsdp_dataloader_create(const char *path, size_t B, size_t T, int rank, int world,
                           int vocab_size, struct fsdp_dataloader **out)
{
    int rc;
    if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world) {
        return fsdp_err(FSDP_ERR_INVALID, "data loader: need B >= 1, T >= 1, 0 <= rank < world "
                        "(got B=%zu T=%zu rank=%d world=%d)", B, T, rank, world);
    }
    if (B > SIZE_MAX / T / (size_t)world / 4) {
        return fsdp_err(FSDP_ERR_INVALID, "data loader: batch %zu x %zu x %d ranks is too large",
                        B, T, world);
    }
    struct fsdp_dataloader *dl = calloc(1, sizeof(*dl));
    if (!dl) {
        return fsdp_err(FSDP_ERR_NOMEM, "data loader");
    }
    dl->B = B;
    dl->T = T;
    dl->rank = rank;
    dl->world = world;
    dl->step_tokens = (uint64_t)B * T * (uint64_t)world;
    dl->wrap = 1;
    FSDP_CHECK_GOTO(fsdp_tokens_open(path, &dl->tokens), rc, err);
    size_t count = fsdp_tokens_count(dl->tokens);
    if (count < dl->step_tokens + 1) {
        rc = fsdp_err(FSDP_ERR_INVALID, "%s: %zu tokens, but one global batch (%zu sequences of "
                      "%zu over %d ranks) needs %llu", path, count, B * (size_t)world, T, world,
                      (unsigned long long)dl->step_tokens + 1);
        goto err;
    }
    if (vocab_size > 0) {
        FSDP_CHECK_GOTO(fsdp_tokens_check_vocab(dl->tokens, vocab_size), rc, err);
    }
    dl->stage = fsdp_alloc((B * T + 1) * sizeof(uint16_t));
    dl->inputs = fsdp_alloc(B * T * sizeof(int));
    dl->targets = fsdp_alloc(B * T * sizeof(int));
    if (!dl->stage || !dl->inputs || !dl->targets) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "data loader buffers (B=%zu, T=%zu)", B, T);
        goto err;
    }
    FSDP_DEBUG(FSDP_SUB_IO, "%s: %zu tokens, rank %d/%d takes B=%zu x T=%zu per step", path,
               count, rank, world, B, T);
    *out = dl;
    return 0;
err:
    fsdp_dataloader_destroy(dl);
    return rc;
}

void fsdp_dataloader_destroy(struct fsdp_dataloader *dl)
{
    if (!dl) {
        return;
    }
    fsdp_tokens_close(dl->tokens);
    fsdp_free(dl->stage);
    fsdp_free(dl->inputs);
    fsdp_free(dl->targets);
    free(dl);
}

int fsdp_dataloader_next(struct fsdp_dataloader *dl)
{
    size_t count = fsdp_tokens_count(dl->tokens);
    size_t n = dl->B * dl->T;
    if (!dl->wrap && !fsdp_dataloader_fits(dl, 1)) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: rank %d's batch at token %llu is past the end of "
                        "the data (%zu tokens)", fsdp_tokens_path(dl->tokens), dl->rank,
                        (unsigned long long)dl->position, count);
    }
    if (dl->wrap && dl->position + dl->step_tokens + 1 > count) {
        dl->position = 0;
        dl->epoch++;
    }
    size_t start = (size_t)dl->position + (size_t)dl->rank * n;
    FSDP_CHECK(fsdp_tokens_read(dl->tokens, start, n + 1, dl->stage));
    for (size_t i = 0; i < n; i++) {
        dl->inputs[i] = dl->stage[i];
        dl->targets[i] = dl->stage[i + 1];
    }
    dl->position += dl->step_tokens;
    return 0;
}

/* Tokens from a pass's start that micro-batch i of this rank reads up to (exclusive). */
static uint64_t tok_micro_end(const struct fsdp_dataloader *dl, uint64_t i)
{
    return i * dl->step_tokens + (uint64_t)(dl->rank + 1) * dl->B * dl->T + 1;
}

int fsdp_dataloader_fits(const struct fsdp_dataloader *dl, int K)
{
    uint64_t last = dl->position + (uint64_t)(K - 1) * dl->step_tokens;
    return K >= 1 && last + (uint64_t)(dl->rank + 1) * dl->B * dl->T + 1 <=
                         (uint64_t)fsdp_tokens_count(dl->tokens);
}

uint64_t fsdp_dataloader_steps_per_pass(const struct fsdp_dataloader *dl, int K)
{
    uint64_t count = fsdp_tokens_count(dl->tokens), k = (uint64_t)K;
    uint64_t first = tok_micro_end(dl, k - 1); /* step 0 needs its last micro-batch */
    if (K < 1 || first > count) {
        return 0;
    }
    return (count - first) / (k * dl->step_tokens) + 1;
}

void fsdp_dataloader_new_pass(struct fsdp_dataloader *dl)
{
    dl->position = 0;
    dl->epoch++;
}

void fsdp_dataloader_state_after(const struct fsdp_dataloader *dl, uint64_t n,
                                 struct fsdp_dataloader_state *st)
{
    uint64_t count = fsdp_tokens_count(dl->tokens);
    /* micro-batches per pass: next() wraps when the whole global batch i does
     * not fit, (i + 1) * step_tokens + 1 > count (create checked that i = 0 fits) */
    uint64_t per_pass = (count - 1 - dl->step_tokens) / dl->step_tokens + 1;
    st->n_tokens = count;
    if (n == 0) {
        st->position = 0;
        st->epoch = 0;
        return;
    }
    /* the wrap happens lazily, at the start of the micro-batch that does not fit */
    st->epoch = (n - 1) / per_pass;
    st->position = (n - st->epoch * per_pass) * dl->step_tokens;
}

void fsdp_dataloader_get_state(const struct fsdp_dataloader *dl, struct fsdp_dataloader_state *st)
{
    st->position = dl->position;
    st->epoch = dl->epoch;
    st->n_tokens = fsdp_tokens_count(dl->tokens);
}

int fsdp_dataloader_set_state(struct fsdp_dataloader *dl, const struct fsdp_dataloader_state *st)
{
    size_t count = fsdp_tokens_count(dl->tokens);
    const char *path = fsdp_tokens_path(dl->tokens);
    if (st->n_tokens != 0 && st->n_tokens != count) {
        return fsdp_err(FSDP_ERR_MISMATCH, "%s: the loader state was saved on a file of %llu "
                        "tokens but this one has %zu", path, (unsigned long long)st->n_tokens,
                        count);
    }
    if (st->position > count) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: loader position %llu is beyond the file's %zu "
                        "tokens", path, (unsigned long long)st->position, count);
    }
    dl->position = st->position;
    dl->epoch = st->epoch;
    return 0;
}
