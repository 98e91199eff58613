/*
 * fsdpc_data.c - the fsdpc-data program: makes, inspects and decodes llm.c
 * token files.
 *
 *   fsdpc-data tokenize [--tokenizer tokenizer.json] TEXT -o FILE.bin
 *                       [--val-fraction X --val-out VAL.bin]
 *   fsdpc-data decode --tokenizer tokenizer.json FILE.bin [-o TEXT] [--skip-special]
 *   fsdpc-data inspect FILE.bin [--vocab N] [--head N] [--tokenizer tokenizer.json]
 *
 * Without --tokenizer, tokenization is byte level (vocabulary 256, token =
 * byte value), streamed in chunks so any text size works. With a Hugging
 * Face tokenizer.json it is that tokenizer's byte-level BPE (io/text/tokenizer.h);
 * the text is read whole and the tokens stream to the file, uint16 or
 * uint32 as the vocabulary needs. The validation split is the last
 * floor(X * tokens) tokens (bytes, at byte level). Errors end the program
 * with one line and a non-zero exit status.
 */
#include "config.h"
#include "programs/cli.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/util/fileutil.h"
#include "io/text/tokenizer.h"
#include "io/text/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#define DATA_CHUNK ((size_t)1 << 20)
#define DECODE_CHUNK ((size_t)1 << 16) /* tokens decoded at a time */

static void die_rc(int rc, const char *what)
{
    fsdp_die(rc, what, NULL);
}

/* pread until n bytes; 0 or an error naming path. */
static int read_at(int fd, const char *path, void *buf, size_t n, size_t pos)
{
    for (size_t done = 0; done < n;) {
        ssize_t got = pread(fd, (char *)buf + done, n - done, (off_t)(pos + done));
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        }
        if (got == 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: file shrank while reading (at byte %zu)", path,
                            pos + done);
        }
        done += (size_t)got;
    }
    return 0;
}

static struct fsdp_tokenizer *load_tokenizer(const char *cmd, const char *path)
{
    struct fsdp_tokenizer *tok;
    int rc = fsdp_tokenizer_load(path, &tok);
    if (rc < 0) {
        char what[64];
        snprintf(what, sizeof(what), "fsdpc-data %s", cmd);
        die_rc(rc, what);
    }
    return tok;
}

// ----------------------------------------------------------------------------
// tokenize

#define DATA_PATH 4096

/* A subcommand's flags: its own table over the fields it uses. */
struct data_args {
    char out[DATA_PATH];
    char tokenizer[DATA_PATH];
    char val_out[DATA_PATH];
    double val_fraction;
    int skip_special;
    long vocab; /* 0: no check */
    long head;
};

#define F(field) offsetof(struct data_args, field)
#define S(field) sizeof(((struct data_args *)0)->field)
static const struct fsdp_opt tokenize_opts[] = {
    {"tokenizer", FSDP_OPT_STR, F(tokenizer), S(tokenizer), 0, 0, NULL, "FILE", 0,
     "a Hugging Face tokenizer.json (byte-level BPE, GPT-2 or Llama 3 family): tokens as the "
     "`tokenizers` package makes them; the file's width follows its vocabulary (without it: "
     "byte level, vocabulary 256, version 1)",
     't'},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "FILE", 0,
     "training tokens (written to FILE.tmp.XXXXXX, then renamed)", 'o'},
    {"val-fraction", FSDP_OPT_FLOAT, F(val_fraction), 0, 0, 1, NULL, "X",
     FSDP_OPT_MIN_OPEN | FSDP_OPT_MAX_OPEN,
     "the last floor(X * tokens) tokens become the validation split (at byte level: the last "
     "bytes)",
     0},
    {"val-out", FSDP_OPT_STR, F(val_out), S(val_out), 0, 0, NULL, "FILE", 0,
     "where the validation tokens go (needs --val-fraction)", 0},
};
static const struct fsdp_opt decode_opts[] = {
    {"tokenizer", FSDP_OPT_STR, F(tokenizer), S(tokenizer), 0, 0, NULL, "FILE", 0,
     "the Hugging Face tokenizer.json the tokens came from", 't'},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "FILE", 0,
     "where the text goes (default: standard output)", 'o'},
    {"skip-special", FSDP_OPT_FLAG, F(skip_special), 0, 0, 0, NULL, "", 0,
     "leave out special tokens (decode's skip_special_tokens)", 0},
};
static const struct fsdp_opt inspect_opts[] = {
    {"vocab", FSDP_OPT_INT, F(vocab), 0, 1, 4294967296.0, NULL, "N", 0,
     "also check that every token is < N (exit 1 if not)", 0},
    {"head", FSDP_OPT_INT, F(head), 0, 0, 1 << 20, NULL, "N", 0, "how many leading tokens to print",
     0},
    {"tokenizer", FSDP_OPT_STR, F(tokenizer), S(tokenizer), 0, 0, NULL, "FILE", 0,
     "also print the first tokens decoded with this tokenizer.json", 't'},
};
#undef F
#undef S

#define N_OPTS(t) (sizeof(t) / sizeof(t[0]))
static const struct fsdp_cli_cmd tokenize_cmd = {
    "[--tokenizer tokenizer.json] TEXT -o FILE.bin\n"
    "                           [--val-fraction X --val-out VAL.bin]",
    "Tokenizes TEXT into an llm.c token file (256 x int32 header, magic 20240520,\n"
    "then the tokens: version 1 holds uint16, version 2 uint32).",
    tokenize_opts, N_OPTS(tokenize_opts)};
static const struct fsdp_cli_cmd decode_cmd = {
    "--tokenizer tokenizer.json FILE.bin [-o TEXT] [--skip-special]",
    "Turns the tokens of an llm.c token file back into text with the tokenizer's\n"
    "ByteLevel decoder, as the `tokenizers` package's decode does (byte sequences\n"
    "that are not UTF-8 become U+FFFD).",
    decode_opts, N_OPTS(decode_opts)};
static const struct fsdp_cli_cmd inspect_cmd = {
    "FILE.bin [--vocab N] [--head N] [--tokenizer FILE]",
    "Checks an llm.c token file (header, size) and prints its version and token\n"
    "width, token count, the range of token values and the first tokens.",
    inspect_opts, N_OPTS(inspect_opts)};
#undef N_OPTS

/* The subcommand's flags and its one operand (what it is: "TEXT file");
 * NULL after --help. */
static const char *data_parse(struct data_args *a, const struct fsdp_cli_cmd *cmd, int argc,
                              char **argv, const char *what)
{
    struct fsdp_optset set;
    if (fsdp_cli_command("fsdpc-data", cmd, a, argc, argv, &set) == 1) {
        return NULL;
    }
    return fsdp_cli_operand(&set, what);
}

/* Streams bytes [from, to) of fd into w as tokens. */
static int tokenize_range(int fd, const char *text, size_t from, size_t to,
                          struct fsdp_tokens_writer *w, unsigned char *bytes, uint32_t *toks)
{
    for (size_t pos = from; pos < to;) {
        size_t want = to - pos < DATA_CHUNK ? to - pos : DATA_CHUNK;
        FSDP_CHECK(read_at(fd, text, bytes, want, pos));
        for (size_t i = 0; i < want; i++) {
            toks[i] = bytes[i];
        }
        FSDP_CHECK(fsdp_tokens_writer_append(w, toks, want));
        pos += want;
    }
    return 0;
}

struct tokenize_job {
    const char *text, *out, *val_out;
    double frac;
    int fd;
    size_t size;
};

/* Byte level: train and validation ranges known from the size up front. */
static void tokenize_bytes(const struct tokenize_job *j)
{
    size_t n_val = j->val_out ? (size_t)floor(j->frac * (double)j->size) : 0;
    size_t n_train = j->size - n_val;
    if (j->val_out && n_val == 0) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction %g of %zu bytes leaves no validation "
                   "tokens", j->frac, j->size);
    }
    if (n_train == 0) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction %g of %zu bytes leaves no training "
                   "tokens", j->frac, j->size);
    }
    if (n_train > FSDP_TOKENS_MAX_COUNT || n_val > FSDP_TOKENS_MAX_COUNT) {
        fsdp_fatal("fsdpc-data tokenize: %zu bytes exceed the %u tokens one llm.c token file "
                   "holds; split the text", j->size, FSDP_TOKENS_MAX_COUNT);
    }
    unsigned char *bytes = malloc(DATA_CHUNK);
    uint32_t *toks = malloc(DATA_CHUNK * sizeof(uint32_t));
    struct fsdp_tokens_writer *w = NULL, *wv = NULL;
    int rc;
    if (!bytes || !toks) {
        fsdp_fatal("fsdpc-data tokenize: out of memory");
    }
    double t0 = fsdp_now();
    FSDP_CHECK_GOTO(fsdp_tokens_writer_create(j->out, 256, &w), rc, fail);
    FSDP_CHECK_GOTO(tokenize_range(j->fd, j->text, 0, n_train, w, bytes, toks), rc, fail);
    if (j->val_out) {
        FSDP_CHECK_GOTO(fsdp_tokens_writer_create(j->val_out, 256, &wv), rc, fail);
        FSDP_CHECK_GOTO(tokenize_range(j->fd, j->text, n_train, j->size, wv, bytes, toks), rc,
                        fail);
        FSDP_CHECK_GOTO(fsdp_tokens_writer_commit(wv), rc, fail);
    }
    FSDP_CHECK_GOTO(fsdp_tokens_writer_commit(w), rc, fail);
    fsdp_tokens_writer_destroy(w);
    fsdp_tokens_writer_destroy(wv);
    free(bytes);
    free(toks);
    printf("%s: %zu bytes -> %zu training tokens in %s", j->text, j->size, n_train, j->out);
    if (j->val_out) {
        printf(", %zu validation tokens in %s", n_val, j->val_out);
    }
    printf(" (byte-level, vocab 256, %.2f s)\n", fsdp_now() - t0);
    return;
fail:
    fsdp_tokens_writer_destroy(wv);
    fsdp_tokens_writer_destroy(w);
    die_rc(rc, "fsdpc-data tokenize");
}

static int tokenize_sink(const uint32_t *ids, size_t n, void *arg)
{
    return fsdp_tokens_writer_append(arg, ids, n);
}

/*
 * The text through tok into w, a piece at a time: up to
 * FSDPC_TOKENIZE_CHUNK_BYTES (64 MiB) read, encoded up to the last place
 * where it can be cut (fsdp_tokenizer_cut), the rest carried into the next
 * piece; a piece with no such place grows the buffer (a tokenizer that
 * cannot be cut reads the text whole). *secs: time spent encoding.
 */
static int tokenize_stream(const struct tokenize_job *j, struct fsdp_tokenizer *tok,
                           struct fsdp_tokens_writer *w, double *secs)
{
    long long want = fsdp_env_int("FSDPC_TOKENIZE_CHUNK_BYTES", (long long)64 << 20);
    size_t cap = want < 16 ? 16 : (size_t)want, filled = 0, pos = 0;
    cap = cap < j->size ? cap : j->size;
    char *buf = malloc(cap);
    int rc = 0;
    *secs = 0;
    if (!buf) {
        return fsdp_err(FSDP_ERR_NOMEM, "%zu bytes to read '%s'", cap, j->text);
    }
    while (rc == 0) { /* ends at the end of the text, everything encoded */
        size_t more = j->size - pos - filled < cap - filled ? j->size - pos - filled
                                                            : cap - filled;
        if ((rc = read_at(j->fd, j->text, buf + filled, more, pos + filled)) < 0) {
            break;
        }
        filled += more;
        int eof = pos + filled == j->size, bad;
        size_t ok = fsdp_utf8_prefix(buf, filled, &bad);
        if (bad || (eof && ok < filled)) {
            rc = fsdp_err(FSDP_ERR_INVALID, "not valid UTF-8 at byte %zu (0x%02x)", pos + ok,
                          (unsigned char)buf[ok]);
            break;
        }
        size_t cut = eof ? filled : fsdp_tokenizer_cut(tok, buf, ok);
        if (cut == 0) { /* nowhere to cut yet: read on into a larger buffer */
            size_t grown = cap * 2 < j->size - pos ? cap * 2 : j->size - pos;
            char *p = realloc(buf, grown);
            if (!p) {
                rc = fsdp_err(FSDP_ERR_NOMEM, "%zu bytes to read '%s'", grown, j->text);
                break;
            }
            buf = p;
            cap = grown;
            continue;
        }
        double t0 = fsdp_now();
        rc = fsdp_tokenizer_encode_to(tok, buf, cut, tokenize_sink, w);
        *secs += fsdp_now() - t0;
        memmove(buf, buf + cut, filled - cut);
        pos += cut;
        filled -= cut;
        if (eof && filled == 0) {
            break;
        }
    }
    free(buf);
    return rc;
}

/* BPE: the text encoded into the training file as it is read, then the
 * last floor(X * tokens) moved to the validation file. */
static void tokenize_bpe(const struct tokenize_job *j, const char *tok_path)
{
    struct fsdp_tokenizer *tok = load_tokenizer("tokenize", tok_path);
    size_t V = fsdp_tokenizer_vocab_size(tok);
    struct fsdp_tokens_writer *w = NULL, *wv = NULL;
    size_t n_val = 0;
    char what[300];
    double secs;
    int rc;
    snprintf(what, sizeof(what), "fsdpc-data tokenize");
    FSDP_CHECK_GOTO(fsdp_tokens_writer_create(j->out, V, &w), rc, fail);
    snprintf(what, sizeof(what), "fsdpc-data tokenize: %s", j->text); /* names the text */
    FSDP_CHECK_GOTO(tokenize_stream(j, tok, w, &secs), rc, fail);
    size_t n = fsdp_tokens_writer_count(w);
    snprintf(what, sizeof(what), "fsdpc-data tokenize");
    if (j->val_out) {
        n_val = (size_t)floor(j->frac * (double)n);
        if (n_val == 0 || n_val == n) {
            fsdp_tokens_writer_destroy(w); /* removes its temporary */
            fsdp_fatal("fsdpc-data tokenize: --val-fraction %g of %zu tokens leaves no %s "
                       "tokens", j->frac, n, n_val == 0 ? "validation" : "training");
        }
        FSDP_CHECK_GOTO(fsdp_tokens_writer_create(j->val_out, V, &wv), rc, fail);
        FSDP_CHECK_GOTO(fsdp_tokens_writer_move_tail(w, n_val, wv), rc, fail);
        FSDP_CHECK_GOTO(fsdp_tokens_writer_commit(wv), rc, fail);
    }
    FSDP_CHECK_GOTO(fsdp_tokens_writer_commit(w), rc, fail);
    fsdp_tokens_writer_destroy(w);
    fsdp_tokens_writer_destroy(wv);
    fsdp_tokenizer_free(tok);
    printf("%s: %zu bytes -> %zu training tokens in %s", j->text, j->size, n - n_val, j->out);
    if (j->val_out) {
        printf(", %zu validation tokens in %s", n_val, j->val_out);
    }
    printf(" (%s, vocab %zu, %s tokens, %.2f s, %.2f M tokens/s)\n", tok_path, V,
           fsdp_tokens_version_for(V) == FSDP_TOKENS_VERSION_U16 ? "uint16" : "uint32", secs,
           secs > 0 ? (double)n / secs / 1e6 : 0.0);
    return;
fail:
    fsdp_tokens_writer_destroy(wv);
    fsdp_tokens_writer_destroy(w);
    die_rc(rc, what);
}

static int cmd_tokenize(int argc, char **argv)
{
    struct data_args a = {0};
    struct tokenize_job j = {NULL, NULL, NULL, 0.0, -1, 0};
    j.text = data_parse(&a, &tokenize_cmd, argc, argv, "TEXT file");
    if (!j.text) {
        return 0;
    }
    if (!a.out[0]) {
        fsdp_fatal("fsdpc-data tokenize: missing -o FILE.bin (see --help)");
    }
    j.out = a.out;
    j.val_out = a.val_out[0] ? a.val_out : NULL;
    j.frac = a.val_fraction;
    if ((a.val_fraction > 0.0) != !!j.val_out) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction and --val-out go together");
    }
    if (j.val_out && strcmp(j.val_out, j.out) == 0) {
        fsdp_fatal("fsdpc-data tokenize: --val-out and -o name the same file '%s'", j.out);
    }
    const char *tok_path = a.tokenizer[0] ? a.tokenizer : NULL;

    struct stat st;
    j.fd = open(j.text, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (j.fd < 0) {
        fsdp_fatal("fsdpc-data tokenize: cannot open text '%s': %s", j.text, strerror(errno));
    }
    if (fstat(j.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fsdp_fatal("fsdpc-data tokenize: '%s' is not a regular file", j.text);
    }
    j.size = (size_t)st.st_size;
    if (j.size == 0) {
        fsdp_fatal("fsdpc-data tokenize: text '%s' is empty", j.text);
    }
    if (tok_path) {
        tokenize_bpe(&j, tok_path);
    } else {
        tokenize_bytes(&j);
    }
    close(j.fd);
    return 0;
}

// ----------------------------------------------------------------------------
// decode

/* Writes n bytes to fd; 0 or an error naming where. */
static int write_all(int fd, const char *where, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: write failed: %s", where, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

struct decode_job {
    const struct fsdp_tokenizer *tok;
    struct fsdp_tokens *t;
    unsigned flags;
    int fd;
    const char *where;
};

/* Decodes the file chunk by chunk; an incomplete UTF-8 sequence at the end
 * of a chunk waits for the next, so the text equals one decode of all ids. */
static int decode_stream(const struct decode_job *j)
{
    size_t count = fsdp_tokens_count(j->t), carry = 0;
    uint32_t *ids = malloc(DECODE_CHUNK * sizeof(uint32_t));
    char *pend = malloc(8), *fixed = NULL;
    int rc = 0;
    if (!ids || !pend) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "decode buffers");
        goto out;
    }
    for (size_t pos = 0; pos < count || carry; pos += DECODE_CHUNK) {
        size_t n = count - pos < DECODE_CHUNK ? count - pos : DECODE_CHUNK, len = 0, out_len;
        char *raw = NULL;
        if (n > 0) {
            FSDP_CHECK_GOTO(fsdp_tokens_read(j->t, pos, n, ids), rc, out);
            FSDP_CHECK_GOTO(fsdp_tokenizer_decode(j->tok, ids, n, j->flags | FSDP_TOKENIZER_RAW,
                                                  &raw, &len),
                            rc, out);
        }
        int final = pos + n >= count;
        char *all = malloc(carry + len + 1);
        free(fixed);
        fixed = malloc(3 * (carry + len) + 1);
        if (!all || !fixed) {
            free(raw);
            free(all);
            rc = fsdp_err(FSDP_ERR_NOMEM, "decode buffers");
            goto out;
        }
        memcpy(all, pend, carry);
        if (len) {
            memcpy(all + carry, raw, len);
        }
        free(raw);
        size_t used = fsdp_utf8_lossy(all, carry + len, final, fixed, &out_len);
        carry = carry + len - used; /* at most 3 bytes of an unfinished sequence */
        memcpy(pend, all + used, carry);
        free(all);
        FSDP_CHECK_GOTO(write_all(j->fd, j->where, fixed, out_len), rc, out);
        if (final) {
            break;
        }
    }
out:
    free(ids);
    free(pend);
    free(fixed);
    return rc;
}

static int cmd_decode(int argc, char **argv)
{
    struct data_args a = {0};
    int rc;
    const char *in = data_parse(&a, &decode_cmd, argc, argv, "token file");
    if (!in) {
        return 0;
    }
    if (!a.tokenizer[0]) {
        fsdp_fatal("fsdpc-data decode: missing --tokenizer tokenizer.json (see --help)");
    }
    const char *tok_path = a.tokenizer, *out = a.out[0] ? a.out : NULL;
    unsigned flags = a.skip_special ? FSDP_TOKENIZER_SKIP_SPECIAL : 0;
    struct fsdp_tokenizer *tok = load_tokenizer("decode", tok_path);
    struct decode_job j = {tok, NULL, flags, STDOUT_FILENO, "standard output"};
    char *tmp = NULL;
    FSDP_CHECK_GOTO(fsdp_tokens_open(in, &j.t), rc, fail);
    /* names the first token the vocabulary lacks by its place in the file */
    FSDP_CHECK_GOTO(fsdp_tokens_check_vocab(j.t, (int)fsdp_tokenizer_vocab_size(tok)), rc, fail);
    if (out) {
        FSDP_CHECK_GOTO(fsdp_file_tmp_create(out, &tmp, &j.fd), rc, fail);
        j.where = tmp;
    }
    FSDP_CHECK_GOTO(decode_stream(&j), rc, fail);
    if (out) {
        int e = close(j.fd);
        j.fd = -1;
        if (e != 0) {
            rc = fsdp_err(FSDP_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
            goto fail;
        }
        FSDP_CHECK_GOTO(fsdp_file_commit(tmp, out), rc, fail);
        free(tmp);
    }
    fsdp_tokens_close(j.t);
    fsdp_tokenizer_free(tok);
    return 0;
fail:
    if (tmp) {
        if (j.fd >= 0) {
            close(j.fd);
        }
        unlink(tmp);
    }
    die_rc(rc, "fsdpc-data decode");
    return 1;
}

// ----------------------------------------------------------------------------
// inspect

/* Prints v[0, n) as a C string literal (escapes for what is not printable ASCII). */
static void print_escaped(const unsigned char *v, size_t n)
{
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        if (v[i] == '\n') {
            printf("\\n");
        } else if (v[i] == '"' || v[i] == '\\') {
            printf("\\%c", v[i]);
        } else if (v[i] >= 32 && v[i] < 127) {
            putchar(v[i]);
        } else {
            printf("\\x%02x", v[i]);
        }
    }
    printf("\"\n");
}

/* The first n tokens of t: as numbers, as bytes when they are all bytes,
 * as text when there is a tokenizer. */
static int inspect_head(struct fsdp_tokens *t, struct fsdp_tokenizer *tok, size_t n, uint32_t hi)
{
    uint32_t *v = malloc(n * sizeof(uint32_t));
    int rc;
    if (!v) {
        fsdp_fatal("fsdpc-data inspect: out of memory");
    }
    FSDP_CHECK_GOTO(fsdp_tokens_read(t, 0, n, v), rc, out);
    printf("first %-6zu", n);
    for (size_t i = 0; i < n; i++) {
        printf(" %u", v[i]);
    }
    printf("\n");
    if (hi < 256 && !tok) {
        /* byte-level data: show it as text too */
        unsigned char *b = malloc(n);
        for (size_t i = 0; b && i < n; i++) {
            b[i] = (unsigned char)v[i];
        }
        printf("as bytes     ");
        print_escaped(b, b ? n : 0);
        free(b);
    }
    if (tok) {
        char *text;
        size_t len;
        FSDP_CHECK_GOTO(fsdp_tokenizer_decode(tok, v, n, 0, &text, &len), rc, out);
        printf("as text      ");
        print_escaped((const unsigned char *)text, len);
        free(text);
    }
    rc = 0;
out:
    free(v);
    return rc;
}

static int cmd_inspect(int argc, char **argv)
{
    struct data_args a = {.head = 16};
    const char *in = data_parse(&a, &inspect_cmd, argc, argv, "token file");
    if (!in) {
        return 0;
    }
    struct fsdp_tokens *t;
    struct fsdp_tokenizer *tok = a.tokenizer[0] ? load_tokenizer("inspect", a.tokenizer) : NULL;
    uint32_t lo, hi;
    int rc;
    FSDP_CHECK_GOTO(fsdp_tokens_open(in, &t), rc, fail);
    size_t count = fsdp_tokens_count(t);
    int version = fsdp_tokens_version(t);
    size_t width = version == FSDP_TOKENS_VERSION_U16 ? 2 : 4;
    FSDP_CHECK_GOTO(fsdp_tokens_range(t, &lo, &hi), rc, fail);
    printf("file         %s\n", in);
    printf("format       llm.c tokens, version %d, %s\n", version,
           width == 2 ? "uint16" : "uint32");
    printf("tokens       %zu\n", count);
    printf("bytes        %zu\n", (size_t)FSDP_TOKENS_HEADER_BYTES + width * count);
    if (count) {
        printf("token range  %u .. %u (needs vocab_size >= %llu)\n", lo, hi,
               (unsigned long long)hi + 1);
    }
    size_t n = (size_t)a.head < count ? (size_t)a.head : count;
    if (n) {
        FSDP_CHECK_GOTO(inspect_head(t, tok, n, hi), rc, fail);
    }
    if (a.vocab > 0) {
        FSDP_CHECK_GOTO(fsdp_tokens_check_vocab(t, (int)a.vocab), rc, fail);
        printf("vocab check  all tokens < %ld\n", a.vocab);
    }
    fsdp_tokens_close(t);
    fsdp_tokenizer_free(tok);
    return 0;
fail:
    die_rc(rc, "fsdpc-data inspect");
    return 1;
}

// ----------------------------------------------------------------------------
// main

static const struct fsdp_cli_sub data_cmds[] = {
    {"tokenize", "make a token file from text (byte level or a tokenizer.json)", cmd_tokenize},
    {"decode", "turn a token file back into text with a tokenizer.json", cmd_decode},
    {"inspect", "check a token file and print its summary", cmd_inspect},
};

int main(int argc, char **argv)
{
    static const struct fsdp_cli_program data = {"fsdpc-data", data_cmds,
                                                 sizeof(data_cmds) / sizeof(data_cmds[0]), 10};
    fsdp_log_set_rank(0);
    return fsdp_cli_main(&data, argc, argv);
}
