/*
 * tokens.c - llm.c token files (reading with pread, writing by tmp + rename)
 * and the data loader with its resumable cursor.
 *
 * Owns the on-disk byte order (little endian) and the batch slicing rule the
 * sharding engine's equivalence tests rely on; it must not read a whole file
 * into memory or keep a mapping that a truncation could turn into SIGBUS.
 */
#include "config.h"
#include "io/text/tokens.h"
#include "io/util/fileutil.h"
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
    int version; /* FSDP_TOKENS_VERSION_U16 or _U32 */
    size_t width; /* bytes per token: 2 or 4 */
    size_t count;
};

struct fsdp_tokens_writer {
    char *path;
    char *tmp_path;
    int fd;
    int version;
    size_t width;
    uint64_t vocab; /* tokens must be < vocab */
    size_t count;
    unsigned char *stage; /* (TOK_CHUNK * width,) little-endian copy of appended tokens */
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

/*
 * n little-endian tokens of width bytes at the start of v, as host uint32
 * in place: widening runs from the end, so each 2-byte token is read
 * before the 4-byte slot that covers it is written.
 */
static void tok_to_host(uint32_t *v, size_t n, size_t width)
{
    if (width == 2) {
        const unsigned char *b = (const unsigned char *)v;
        for (size_t i = n; i-- > 0;) {
            v[i] = (uint32_t)b[2 * i] | (uint32_t)b[2 * i + 1] << 8;
        }
        return;
    }
#if __BYTE_ORDER == __BIG_ENDIAN
    for (size_t i = 0; i < n; i++) {
        v[i] = le32toh(v[i]);
    }
#else
    (void)v;
    (void)n;
#endif
}

static const char *tok_width_name(int version)
{
    return version == FSDP_TOKENS_VERSION_U16 ? "uint16" : "uint32";
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
        /* not quoted: the bytes of whatever file this is */
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: not an llm.c token file: header[0] is not the magic "
                      "%d", path, FSDP_TOKENS_MAGIC);
        goto err;
    }
    if (version != FSDP_TOKENS_VERSION_U16 && version != FSDP_TOKENS_VERSION_U32) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: token file version %d in header[1] is not supported "
                      "(1: uint16 tokens, 2: uint32 tokens)", path, version);
        goto err;
    }
    if (count < 0) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: negative token count %d in header[2]", path, count);
        goto err;
    }
    t->version = version;
    t->width = version == FSDP_TOKENS_VERSION_U16 ? 2 : 4;
    size_t want = FSDP_TOKENS_HEADER_BYTES + t->width * (size_t)count;
    if (size < want) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: truncated: header[2] says %d tokens (%zu bytes) but "
                      "the file has %zu bytes (version %d: %s tokens)", path, count, want, size,
                      version, tok_width_name(version));
        goto err;
    }
    if (size > want) {
        rc = fsdp_err(FSDP_ERR_FORMAT, "%s: %zu extra bytes after the %d tokens header[2] "
                      "announces (file %zu bytes, expected %zu; version %d: %s tokens)", path,
                      size - want, count, size, want, version, tok_width_name(version));
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

int fsdp_tokens_version(const struct fsdp_tokens *t)
{
    return t->version;
}

int fsdp_tokens_read(const struct fsdp_tokens *t, size_t pos, size_t n, uint32_t *dst)
{
    if (pos > t->count || n > t->count - pos) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: tokens [%zu, %zu) are beyond its %zu tokens",
                        t->path, pos, pos + n, t->count);
    }
    off_t off = (off_t)(FSDP_TOKENS_HEADER_BYTES + t->width * pos);
    ssize_t got = tok_pread_full(t->fd, dst, t->width * n, off);
    if (got < 0) {
        return fsdp_err(FSDP_ERR_IO, "%s: read failed: %s", t->path, strerror(errno));
    }
    if ((size_t)got != t->width * n) {
        return fsdp_err(FSDP_ERR_IO, "%s: file shrank while reading (token %zu)", t->path,
                        pos + (size_t)got / t->width);
    }
    tok_to_host(dst, n, t->width);
    return 0;
}

/* Visits the file in chunks; fn returns 1 to stop early. */
static int tok_scan(const struct fsdp_tokens *t,
                    int (*fn)(const uint32_t *v, size_t n, size_t base, void *arg), void *arg)
{
    uint32_t *buf = malloc(TOK_CHUNK * sizeof(uint32_t));
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
    uint32_t limit;
    int found;
    size_t pos;
    uint32_t value;
};

static int tok_vocab_fn(const uint32_t *v, size_t n, size_t base, void *arg)
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
    if (t->version == FSDP_TOKENS_VERSION_U16 && (unsigned)vocab_size >= FSDP_TOKENS_U16_VOCAB) {
        return 0; /* every uint16 fits */
    }
    struct tok_vocab_scan s = {(uint32_t)vocab_size, 0, 0, 0};
    FSDP_CHECK(tok_scan(t, tok_vocab_fn, &s));
    if (s.found) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: token %u at position %zu is outside the vocabulary "
                        "(vocab_size %d)", t->path, (unsigned)s.value, s.pos, vocab_size);
    }
    return 0;
}

struct tok_range_scan {
    uint32_t min, max;
};

static int tok_range_fn(const uint32_t *v, size_t n, size_t base, void *arg)
{
    struct tok_range_scan *s = arg;
    (void)base;
    for (size_t i = 0; i < n; i++) {
        s->min = v[i] < s->min ? v[i] : s->min;
        s->max = v[i] > s->max ? v[i] : s->max;
    }
    return 0;
}

int fsdp_tokens_range(const struct fsdp_tokens *t, uint32_t *min, uint32_t *max)
{
    struct tok_range_scan s = {UINT32_MAX, 0};
    FSDP_CHECK(tok_scan(t, tok_range_fn, &s));
    *min = t->count ? s.min : 0;
    *max = s.max;
    return 0;
}

// ----------------------------------------------------------------------------
// Writing

int fsdp_tokens_version_for(size_t vocab_size)
{
    return vocab_size <= FSDP_TOKENS_U16_VOCAB ? FSDP_TOKENS_VERSION_U16 : FSDP_TOKENS_VERSION_U32;
}

int fsdp_tokens_writer_create(const char *path, size_t vocab_size, struct fsdp_tokens_writer **out)
{
    int32_t hdr[FSDP_TOKENS_HEADER_INTS] = {0};
    int rc;
    if (vocab_size < 1 || (uint64_t)vocab_size > (uint64_t)UINT32_MAX + 1) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: vocabulary size %zu does not fit a token file "
                        "(1 to 2^32)", path, vocab_size);
    }
    struct fsdp_tokens_writer *w = calloc(1, sizeof(*w));
    if (!w) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: token writer", path);
    }
    w->fd = -1;
    w->vocab = vocab_size;
    w->version = fsdp_tokens_version_for(vocab_size);
    w->width = w->version == FSDP_TOKENS_VERSION_U16 ? 2 : 4;
    w->path = strdup(path);
    w->stage = malloc(TOK_CHUNK * w->width);
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

/* Packs k tokens little-endian into the stage; the first one >= vocab fails. */
static int tok_stage(struct fsdp_tokens_writer *w, const uint32_t *tokens, size_t k, size_t base)
{
    unsigned char *b = w->stage;
    for (size_t i = 0; i < k; i++) {
        uint32_t v = tokens[i];
        if (v >= w->vocab) {
            return fsdp_err(FSDP_ERR_INVALID, "%s: token %u at position %zu does not fit the "
                            "vocabulary of %llu tokens (a version %d, %s file)", w->path,
                            (unsigned)v, base + i, (unsigned long long)w->vocab, w->version,
                            tok_width_name(w->version));
        }
        for (size_t j = 0; j < w->width; j++) {
            b[w->width * i + j] = (unsigned char)(v >> (8 * j));
        }
    }
    return 0;
}

int fsdp_tokens_writer_append(struct fsdp_tokens_writer *w, const uint32_t *tokens, size_t n)
{
    if (n > FSDP_TOKENS_MAX_COUNT - w->count) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: more than %u tokens do not fit one token file "
                        "(the count is an int32); split the data into shards", w->path,
                        FSDP_TOKENS_MAX_COUNT);
    }
    for (size_t done = 0; done < n;) {
        size_t k = n - done < TOK_CHUNK ? n - done : TOK_CHUNK;
        FSDP_CHECK(tok_stage(w, tokens + done, k, w->count + done));
        off_t off = (off_t)(FSDP_TOKENS_HEADER_BYTES + w->width * (w->count + done));
        if (tok_pwrite_full(w->fd, w->stage, w->width * k, off) < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", w->tmp_path, strerror(errno));
        }
        done += k;
    }
    w->count += n;
    return 0;
}

size_t fsdp_tokens_writer_count(const struct fsdp_tokens_writer *w)
{
    return w->count;
}

int fsdp_tokens_writer_move_tail(struct fsdp_tokens_writer *w, size_t n,
                                 struct fsdp_tokens_writer *dst)
{
    int rc = 0;
    if (n > w->count || w->fd < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: cannot move %zu of its %zu tokens", w->path, n,
                        w->count);
    }
    /* the temporary is open write-only: read the tail back through a second descriptor */
    int fd = open(w->tmp_path, O_RDONLY | O_CLOEXEC);
    uint32_t *buf = malloc(TOK_CHUNK * sizeof(uint32_t));
    if (fd < 0 || !buf) {
        rc = fd < 0 ? fsdp_err(FSDP_ERR_IO, "%s: cannot reopen: %s", w->tmp_path, strerror(errno))
                    : fsdp_err(FSDP_ERR_NOMEM, "%s: tail buffer", w->path);
        goto out;
    }
    for (size_t pos = w->count - n; pos < w->count;) {
        size_t k = w->count - pos < TOK_CHUNK ? w->count - pos : TOK_CHUNK;
        off_t off = (off_t)(FSDP_TOKENS_HEADER_BYTES + w->width * pos);
        if (tok_pread_full(fd, buf, w->width * k, off) != (ssize_t)(w->width * k)) {
            rc = fsdp_err(FSDP_ERR_IO, "%s: reading back tokens failed", w->tmp_path);
            goto out;
        }
        tok_to_host(buf, k, w->width);
        FSDP_CHECK_GOTO(fsdp_tokens_writer_append(dst, buf, k), rc, out);
        pos += k;
    }
    w->count -= n; /* commit truncates the file to the count */
out:
    free(buf);
    if (fd >= 0) {
        close(fd);
    }
    return rc;
}

int fsdp_tokens_writer_commit(struct fsdp_tokens_writer *w)
{
    int32_t hdr[FSDP_TOKENS_HEADER_INTS] = {0};
    if (w->committed || w->fd < 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: token writer already committed", w->path);
    }
    hdr[0] = (int32_t)htole32(FSDP_TOKENS_MAGIC);
    hdr[1] = (int32_t)htole32((uint32_t)w->version);
    hdr[2] = (int32_t)htole32((uint32_t)w->count);
    if (tok_pwrite_full(w->fd, hdr, sizeof(hdr), 0) < 0 ||
        ftruncate(w->fd, (off_t)(FSDP_TOKENS_HEADER_BYTES + w->width * w->count)) != 0) {
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

int fsdp_tokens_write(const char *path, size_t vocab_size, const uint32_t *tokens, size_t n)
{
    struct fsdp_tokens_writer *w;
    int rc;
    FSDP_CHECK(fsdp_tokens_writer_create(path, vocab_size, &w));
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
    dl->stage = fsdp_alloc((B * T + 1) * sizeof(uint32_t));
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
    for (size_t i = 0; i <= n; i++) {
        if (dl->stage[i] > INT32_MAX) { /* only an unchecked vocabulary lets one through */
            return fsdp_err(FSDP_ERR_FORMAT, "%s: token %u at position %zu is not a valid token "
                            "id (above %d)", fsdp_tokens_path(dl->tokens), (unsigned)dl->stage[i],
                            start + i, INT32_MAX);
        }
    }
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
