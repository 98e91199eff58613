/*
 * fsdpc_data.c - the fsdpc-data program: makes and inspects llm.c token files.
 *
 *   fsdpc-data tokenize TEXT -o FILE.bin [--val-fraction X --val-out VAL.bin]
 *   fsdpc-data inspect FILE.bin [--vocab N] [--head N]
 *
 * Tokenization is byte level (vocabulary 256, token = byte value), streamed
 * in chunks so any text size works; the validation split is the last
 * floor(X * bytes) bytes of the text. Errors end the program with one line
 * and a non-zero exit status.
 */
#include "config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/tokens.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DATA_CHUNK ((size_t)1 << 20)

struct data_cmd {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
};

static void die_rc(int rc, const char *what)
{
    fsdp_die(rc, what, NULL);
}

/* getopt_long's failures, in our words. */
static _Noreturn void bad_option(const char *cmd, int c, char **argv)
{
    if (c == ':') {
        fsdp_fatal("fsdpc-data %s: option '%s' needs a value (see fsdpc-data %s --help)", cmd,
                   argv[optind - 1], cmd);
    }
    fsdp_fatal("fsdpc-data %s: unknown option '%s' (see fsdpc-data %s --help)", cmd,
               argv[optind - 1], cmd);
}

// ----------------------------------------------------------------------------
// tokenize

static void tokenize_usage(FILE *out)
{
    fprintf(out,
            "usage: fsdpc-data tokenize TEXT -o FILE.bin [--val-fraction X --val-out VAL.bin]\n"
            "\n"
            "Byte-level tokenization (vocabulary 256: every byte is one token) into an llm.c\n"
            "token file (256 x int32 header, magic 20240520, version 1, then uint16 tokens).\n"
            "\n"
            "  -o, --output FILE       training tokens (written to FILE.tmp.XXXXXX, then renamed)\n"
            "      --val-fraction X    0 < X < 1: the last floor(X * bytes) bytes of TEXT\n"
            "                          become the validation split\n"
            "      --val-out FILE      where the validation tokens go (needs --val-fraction)\n"
            "  -h, --help              this text\n");
}

/* Streams bytes [from, to) of fd into w as tokens. */
static int tokenize_range(int fd, const char *text, size_t from, size_t to,
                          struct fsdp_tokens_writer *w, unsigned char *bytes, uint16_t *toks)
{
    for (size_t pos = from; pos < to;) {
        size_t want = to - pos < DATA_CHUNK ? to - pos : DATA_CHUNK;
        ssize_t got = pread(fd, bytes, want, (off_t)pos);
        if (got < 0 && errno == EINTR) {
            continue;
        }
        if (got < 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: read failed: %s", text, strerror(errno));
        }
        if (got == 0) {
            return fsdp_err(FSDP_ERR_IO, "%s: file shrank while reading (at byte %zu)", text, pos);
        }
        for (ssize_t i = 0; i < got; i++) {
            toks[i] = bytes[i];
        }
        FSDP_CHECK(fsdp_tokens_writer_append(w, toks, (size_t)got));
        pos += (size_t)got;
    }
    return 0;
}

static int cmd_tokenize(int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"val-fraction", required_argument, NULL, 'f'},
        {"val-out", required_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL, *val_out = NULL, *frac_s = NULL;
    double frac = 0.0;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'o': out = optarg; break;
        case 'f': frac_s = optarg; break;
        case 'v': val_out = optarg; break;
        case 'h': tokenize_usage(stdout); return 0;
        default: bad_option("tokenize", c, argv);
        }
    }
    if (optind != argc - 1) {
        fsdp_fatal("fsdpc-data tokenize: expected one TEXT file, got %d (see --help)",
                   argc - optind);
    }
    const char *text = argv[optind];
    if (!out) {
        fsdp_fatal("fsdpc-data tokenize: missing -o FILE.bin (see --help)");
    }
    if (frac_s && (fsdp_parse_double(frac_s, &frac) < 0 || !(frac > 0.0 && frac < 1.0))) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction '%s' must be a number in (0, 1)", frac_s);
    }
    if (!!frac_s != !!val_out) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction and --val-out go together");
    }
    if (val_out && strcmp(val_out, out) == 0) {
        fsdp_fatal("fsdpc-data tokenize: --val-out and -o name the same file '%s'", out);
    }

    int fd = open(text, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0) {
        fsdp_fatal("fsdpc-data tokenize: cannot open text '%s': %s", text, strerror(errno));
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        fsdp_fatal("fsdpc-data tokenize: '%s' is not a regular file", text);
    }
    size_t size = (size_t)st.st_size;
    if (size == 0) {
        fsdp_fatal("fsdpc-data tokenize: text '%s' is empty", text);
    }
    size_t n_val = val_out ? (size_t)floor(frac * (double)size) : 0;
    size_t n_train = size - n_val;
    if (val_out && n_val == 0) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction %g of %zu bytes leaves no validation "
                   "tokens", frac, size);
    }
    if (n_train == 0) {
        fsdp_fatal("fsdpc-data tokenize: --val-fraction %g of %zu bytes leaves no training "
                   "tokens", frac, size);
    }
    if (n_train > FSDP_TOKENS_MAX_COUNT || n_val > FSDP_TOKENS_MAX_COUNT) {
        fsdp_fatal("fsdpc-data tokenize: %zu bytes exceed the %u tokens one llm.c token file "
                   "holds; split the text", size, FSDP_TOKENS_MAX_COUNT);
    }

    unsigned char *bytes = malloc(DATA_CHUNK);
    uint16_t *toks = malloc(DATA_CHUNK * sizeof(uint16_t));
    struct fsdp_tokens_writer *w = NULL, *wv = NULL;
    int rc;
    if (!bytes || !toks) {
        fsdp_fatal("fsdpc-data tokenize: out of memory");
    }
    double t0 = fsdp_now();
    FSDP_CHECK_GOTO(fsdp_tokens_writer_create(out, &w), rc, fail);
    FSDP_CHECK_GOTO(tokenize_range(fd, text, 0, n_train, w, bytes, toks), rc, fail);
    if (val_out) {
        FSDP_CHECK_GOTO(fsdp_tokens_writer_create(val_out, &wv), rc, fail);
        FSDP_CHECK_GOTO(tokenize_range(fd, text, n_train, size, wv, bytes, toks), rc, fail);
        FSDP_CHECK_GOTO(fsdp_tokens_writer_commit(wv), rc, fail);
    }
    FSDP_CHECK_GOTO(fsdp_tokens_writer_commit(w), rc, fail);
    fsdp_tokens_writer_destroy(w);
    fsdp_tokens_writer_destroy(wv);
    free(bytes);
    free(toks);
    close(fd);
    printf("%s: %zu bytes -> %zu training tokens in %s", text, size, n_train, out);
    if (val_out) {
        printf(", %zu validation tokens in %s", n_val, val_out);
    }
    printf(" (byte-level, vocab 256, %.2f s)\n", fsdp_now() - t0);
    return 0;
fail:
    fsdp_tokens_writer_destroy(wv);
    fsdp_tokens_writer_destroy(w);
    die_rc(rc, "fsdpc-data tokenize");
    return 1;
}

// ----------------------------------------------------------------------------
// inspect

static void inspect_usage(FILE *out)
{
    fprintf(out,
            "usage: fsdpc-data inspect FILE.bin [--vocab N] [--head N]\n"
            "\n"
            "Checks an llm.c token file (header, size) and prints its token count, the\n"
            "range of token values and the first tokens.\n"
            "\n"
            "      --vocab N   also check that every token is < N (exit 1 if not)\n"
            "      --head N    how many leading tokens to print (default 16)\n"
            "  -h, --help      this text\n");
}

static long long parse_count(const char *cmd, const char *flag, const char *s, long long lo,
                             long long hi)
{
    long long v;
    if (fsdp_parse_long(s, &v) < 0 || v < lo || v > hi) {
        fsdp_fatal("fsdpc-data %s: %s '%s' must be an integer in [%lld, %lld]", cmd, flag, s, lo,
                   hi);
    }
    return v;
}

static int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"vocab", required_argument, NULL, 'V'},
        {"head", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    long long vocab = 0, head = 16;
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'V': vocab = parse_count("inspect", "--vocab", optarg, 1, 1 << 20); break;
        case 'n': head = parse_count("inspect", "--head", optarg, 0, 1 << 20); break;
        case 'h': inspect_usage(stdout); return 0;
        default: bad_option("inspect", c, argv);
        }
    }
    if (optind != argc - 1) {
        fsdp_fatal("fsdpc-data inspect: expected one token file, got %d (see --help)",
                   argc - optind);
    }
    struct fsdp_tokens *t;
    uint16_t lo, hi;
    FSDP_CHECK_GOTO(fsdp_tokens_open(argv[optind], &t), rc, fail);
    size_t count = fsdp_tokens_count(t);
    FSDP_CHECK_GOTO(fsdp_tokens_range(t, &lo, &hi), rc, fail);
    printf("file         %s\n", argv[optind]);
    printf("format       llm.c tokens, version %d, uint16\n", FSDP_TOKENS_VERSION);
    printf("tokens       %zu\n", count);
    printf("bytes        %zu\n", (size_t)FSDP_TOKENS_HEADER_BYTES + 2 * count);
    if (count) {
        printf("token range  %u .. %u (needs vocab_size >= %u)\n", lo, hi, hi + 1u);
    }
    size_t n = (size_t)head < count ? (size_t)head : count;
    if (n) {
        uint16_t *v = malloc(n * sizeof(uint16_t));
        if (!v) {
            fsdp_fatal("fsdpc-data inspect: out of memory");
        }
        FSDP_CHECK_GOTO(fsdp_tokens_read(t, 0, n, v), rc, fail);
        printf("first %-6zu", n);
        for (size_t i = 0; i < n; i++) {
            printf(" %u", v[i]);
        }
        printf("\n");
        if (hi < 256) {
            /* byte-level data: show it as text too */
            printf("as bytes     \"");
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
        free(v);
    }
    if (vocab > 0) {
        FSDP_CHECK_GOTO(fsdp_tokens_check_vocab(t, (int)vocab), rc, fail);
        printf("vocab check  all tokens < %lld\n", vocab);
    }
    fsdp_tokens_close(t);
    return 0;
fail:
    die_rc(rc, "fsdpc-data inspect");
    return 1;
}

// ----------------------------------------------------------------------------
// main

static const struct data_cmd data_cmds[] = {
    {"tokenize", "make a token file from text (byte level)", cmd_tokenize},
    {"inspect", "check a token file and print its summary", cmd_inspect},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: fsdpc-data COMMAND [options]   (fsdpc %s)\n\ncommands:\n",
            PACKAGE_VERSION);
    for (size_t i = 0; i < sizeof(data_cmds) / sizeof(data_cmds[0]); i++) {
        fprintf(out, "  %-10s %s\n", data_cmds[i].name, data_cmds[i].summary);
    }
    fprintf(out, "\n'fsdpc-data COMMAND --help' describes a command.\n");
}

int main(int argc, char **argv)
{
    fsdp_log_set_rank(0);
    if (argc < 2) {
        usage(stderr);
        fsdp_fatal("fsdpc-data: missing command");
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("fsdpc-data fsdpc %s\n", PACKAGE_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(data_cmds) / sizeof(data_cmds[0]); i++) {
        if (strcmp(argv[1], data_cmds[i].name) == 0) {
            return data_cmds[i].run(argc - 1, argv + 1);
        }
    }
    fsdp_fatal("fsdpc-data: unknown command '%s' (see fsdpc-data --help)", argv[1]);
}
