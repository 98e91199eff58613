/*
 * sample_program.c - fsdpc-sample (sample_main.c): generates text from a
 * model file.
 *
 *   fsdpc-sample --model m.h5 --prompt "int main(" --tokens 200 \
 *                --temperature 0.8 --top-k 40 --seed 1
 *
 * --model may also name a checkpoint (a run's --ckpt-dir, a step directory
 * or its index.h5): its weights are read through the step's index.h5.
 *
 * With --tokenizer tokenizer.json (a Hugging Face byte-level BPE, io/text/tokenizer.h)
 * the prompt is text encoded with it, with the tokens its post_processor
 * puts around a text (Llama 3's <|begin_of_text|>) unless
 * --add-special-tokens off, and the tokens are printed as text.
 * Without it, a byte-level model (vocab 256) reads the prompt as bytes and
 * prints bytes; any other vocabulary reads the prompt as token ids ("464
 * 3290 318") and prints ids, one line of them. An empty prompt starts from '\n' (vocab 256)
 * or from token V-1 (GPT-2's <|endoftext|>).
 *
 * Each new token runs one position through the model against a key/value
 * cache of the earlier ones (the model's decoder, model.h), so N tokens cost
 * N single-row passes. When the sequence reaches the context, the cache
 * restarts from the last half-context of tokens. --no-cache runs the whole
 * window of the last `context` tokens for every token instead (the same
 * logits up to rounding while the sequence fits the context; for timing).
 * Sampling: temperature, then the top-k most likely, then the smallest set
 * whose probability reaches top-p. The same seed gives the same text.
 */
#include "config.h"
#include "programs/sample_program.h"
#include "train/model_source.h"
#include "core/options.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/h5/model_file.h"
#include "io/text/tokenizer.h"
#include "model/model.h"
#include "compute/device.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sample_config {
    char model[1024];
    char tokenizer[1024];
    char prompt[8192];
    long tokens;
    double temperature; /* 0: greedy */
    long top_k;         /* 0: whole vocabulary */
    double top_p;       /* 1: no nucleus cut */
    int no_cache;       /* recompute the window for every token */
    int specials;       /* add the tokenizer's post-processor tokens around the prompt */
    long seed;
    long threads;
    char device[32];
};

#define F(field) offsetof(struct sample_config, field)
#define S(field) sizeof(((struct sample_config *)0)->field)
static const struct fsdp_opt sample_opts[] = {
    {"model", FSDP_OPT_STR, F(model), S(model), 0, 0, NULL, "FILE|DIR", FSDP_OPT_REQUIRED,
     "HDF5 model file, or a checkpoint (a --ckpt-dir, a step directory or its index.h5)", 0},
    {"tokenizer", FSDP_OPT_STR, F(tokenizer), S(tokenizer), 0, 0, NULL, "FILE", 0,
     "a Hugging Face tokenizer.json: the prompt is text for it, the output text", 0},
    {"prompt", FSDP_OPT_STR, F(prompt), S(prompt), 0, 0, NULL, "TEXT", 0,
     "text to continue (without --tokenizer: token ids when the vocabulary is not 256 bytes)", 0},
    {"tokens", FSDP_OPT_INT, F(tokens), 0, 0, 1 << 24, NULL, "N", 0, "tokens to generate", 0},
    {"temperature", FSDP_OPT_FLOAT, F(temperature), 0, 0, 100, NULL, "X", 0,
     "softmax temperature (0: always the most likely token)", 0},
    {"top-k", FSDP_OPT_INT, F(top_k), 0, 0, 1 << 24, NULL, "K", 0,
     "sample among the K most likely tokens (0: all)", 0},
    {"top-p", FSDP_OPT_FLOAT, F(top_p), 0, 1e-6, 1, NULL, "P", 0,
     "sample among the most likely tokens whose probability adds up to P (1: all)", 0},
    {"add-special-tokens", FSDP_OPT_BOOL, F(specials), 0, 0, 0, NULL, "X", 0,
     "on|off: with --tokenizer, the tokens its post_processor puts around a text (Llama 3's "
     "<|begin_of_text|> first) go around the prompt, as transformers' encode does",
     0},
    {"no-cache", FSDP_OPT_FLAG, F(no_cache), 0, 0, 0, NULL, "", 0,
     "no key/value cache: run the whole window for every token (slower; for comparison)", 0},
    {"seed", FSDP_OPT_INT, F(seed), 0, 0, 9.0e18, NULL, "S", 0, "random seed", 0},
    {"threads", FSDP_OPT_INT, F(threads), 0, 1, 4096, NULL, "N", 0, "BLAS threads", 0},
    {"device", FSDP_OPT_STR, F(device), S(device), 0, 0, NULL, "NAME", 0,
     "compute device: cuda, cpu or guarded (as fsdpc-train's; the same default)", 0},
};
#undef F
#undef S

// ----------------------------------------------------------------------------
// sampling

/* SplitMix64: small, fast, and the same sequence everywhere. */
static uint64_t rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_uniform(uint64_t *state)
{
    return (double)(rng_next(state) >> 11) * 0x1.0p-53;
}

struct scored {
    float logit;
    int id;
};

static int cmp_desc(const void *a, const void *b)
{
    const struct scored *x = a, *y = b;
    if (x->logit != y->logit) {
        return x->logit > y->logit ? -1 : 1;
    }
    return x->id - y->id; /* ties: lower id first, deterministic */
}

/*
 * Picks the next token from logits (V). cand and probs are (V) scratch.
 * Temperature 0 is the argmax; otherwise softmax(logits / temperature) over
 * the top_k largest (all when 0), cut to the smallest prefix (by
 * probability) whose mass reaches top_p, sampled by inverse CDF.
 */
static int sample_token(const float *logits, int V, double temperature, long top_k, double top_p,
                        struct scored *cand, double *probs, uint64_t *rng)
{
    int n = V;
    if (temperature == 0.0) {
        int best = 0;
        for (int i = 1; i < V; i++) {
            if (logits[i] > logits[best]) {
                best = i;
            }
        }
        return best;
    }
    for (int i = 0; i < V; i++) {
        cand[i].logit = logits[i];
        cand[i].id = i;
    }
    if ((top_k > 0 && top_k < V) || top_p < 1.0) {
        qsort(cand, (size_t)V, sizeof(*cand), cmp_desc);
        n = top_k > 0 && top_k < V ? (int)top_k : V;
    }
    double max = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++) {
        max = fmax(max, (double)cand[i].logit);
    }
    for (int i = 0; i < n; i++) {
        probs[i] = exp(((double)cand[i].logit - max) / temperature);
        sum += probs[i];
    }
    if (top_p < 1.0) {
        double acc = 0.0;
        int keep = 0;
        while (keep < n && acc < top_p * sum) {
            acc += probs[keep++];
        }
        n = keep > 0 ? keep : 1;
        sum = acc > 0 ? acc : probs[0];
    }
    double r = rng_uniform(rng) * sum, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += probs[i];
        if (r < acc) {
            return cand[i].id;
        }
    }
    return cand[n - 1].id;
}

// ----------------------------------------------------------------------------
// prompt and output

/* Prompt text to tokens; returns the count or an error. */
static int parse_prompt(const char *prompt, int V, int32_t *out, size_t cap, size_t *n)
{
    *n = 0;
    if (V == 256) {
        for (const unsigned char *p = (const unsigned char *)prompt; *p && *n < cap; p++) {
            out[(*n)++] = *p;
        }
    } else {
        const char *p = prompt;
        while (*p) {
            char *end;
            while (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
                p++;
            }
            if (!*p) {
                break;
            }
            long v = strtol(p, &end, 10);
            if (end == p || v < 0 || v >= V) {
                return fsdp_err(FSDP_ERR_INVALID,
                                "--prompt: '%.20s' is not a token id in [0, %d) (this model's vocabulary is not byte-level)",
                                p, V);
            }
            if (*n < cap) {
                out[(*n)++] = (int32_t)v;
            }
            p = end;
        }
    }
    if (*n == 0) {
        out[(*n)++] = V == 256 ? '\n' : V - 1;
    }
    return 0;
}

/* Where generated tokens go: bytes, ids, or text through a tokenizer (its
 * bytes cut at UTF-8 boundaries, invalid sequences as U+FFFD). */
struct sink {
    int V;
    struct fsdp_tokenizer *tok;
    char pend[8]; /* an incomplete UTF-8 sequence carried to the next token */
    size_t npend;
    int last;     /* the last byte written to stdout, 0 before any */
};

static int emit(struct sink *k, int token, int final)
{
    if (!k->tok && token < 0) {
        return 0; /* the end: nothing held back without a tokenizer */
    }
    if (!k->tok) {
        if (k->V == 256) {
            putchar(token);
        } else {
            printf("%d ", token);
        }
        k->last = k->V == 256 ? token : ' ';
        fflush(stdout);
        return 0;
    }
    uint32_t id = (uint32_t)token;
    char *bytes = NULL;
    size_t n = 0;
    if (token >= 0) {
        FSDP_CHECK(fsdp_tokenizer_decode(k->tok, &id, 1, FSDP_TOKENIZER_RAW, &bytes, &n));
    }
    char *in = malloc(k->npend + n + 1), *out = malloc(3 * (k->npend + n) + 1);
    if (!in || !out) {
        free(in), free(out), free(bytes);
        return fsdp_err(FSDP_ERR_NOMEM, "sampler: decoding a token");
    }
    memcpy(in, k->pend, k->npend);
    if (n) {
        memcpy(in + k->npend, bytes, n);
    }
    size_t total = k->npend + n, olen = 0;
    size_t used = fsdp_utf8_lossy(in, total, final, out, &olen);
    k->npend = total - used < sizeof(k->pend) ? total - used : 0;
    memcpy(k->pend, in + used, k->npend);
    fwrite(out, 1, olen, stdout);
    k->last = olen ? (unsigned char)out[olen - 1] : k->last;
    fflush(stdout);
    free(in), free(out), free(bytes);
    return 0;
}

// ----------------------------------------------------------------------------

/* The device c names, the parameters (host) copied into its memory, and
 * room there for one row of logits. */
static int sample_to_device(const struct sample_config *c, const struct fsdp_model_spec *spec,
                            const float *params, struct fsdp_device **dev, float **dparams,
                            float **dlogits)
{
    void *p = NULL, *l = NULL;
    FSDP_CHECK(fsdp_device_create(c->device, 0, dev));
    size_t bytes = spec->total_numel * sizeof(float);
    FSDP_CHECK(fsdp_device_alloc(*dev, bytes, "sampler parameters", &p));
    *dparams = p;
    FSDP_CHECK(
        fsdp_device_alloc(*dev, (size_t)spec->vocab_size * sizeof(float), "sampler logits", &l));
    *dlogits = l;
    FSDP_CHECK(fsdp_device_write(*dev, *dparams, params, bytes));
    return (*dev)->ops->synchronize(*dev, (*dev)->stream);
}

/* The prompt's tokens into *seq (grown for the tokenizer's special tokens;
 * *cap its room), the text's own tokens echoed through sk; *n their count. */
static int sample_prompt(const struct sample_config *c, struct sink *sk, int V, int32_t **seq,
                         size_t *cap, size_t *n)
{
    if (!c->tokenizer[0]) {
        FSDP_CHECK(parse_prompt(c->prompt, V, *seq, *cap, n));
        for (size_t i = 0; c->prompt[0] && i < *n; i++) {
            FSDP_CHECK(emit(sk, (*seq)[i], 0));
        }
        return 0;
    }
    FSDP_CHECK(fsdp_tokenizer_load(c->tokenizer, &sk->tok));
    size_t tv = fsdp_tokenizer_vocab_size(sk->tok);
    if (tv > (size_t)V) {
        return fsdp_err(FSDP_ERR_INVALID, "--tokenizer %s has ids up to %zu, but the model's "
                        "vocabulary is %d: it was trained with another tokenizer", c->tokenizer,
                        tv - 1, V);
    }
    const uint32_t *pre = NULL, *post = NULL;
    size_t npre = 0, npost = 0, nids = 0;
    if (c->specials) {
        FSDP_CHECK(fsdp_tokenizer_specials(sk->tok, &pre, &npre, &post, &npost));
    }
    uint32_t *ids = NULL;
    FSDP_CHECK(fsdp_tokenizer_encode(sk->tok, c->prompt, strlen(c->prompt), &ids, &nids));
    int32_t *grown = realloc(*seq, (*cap + npre + npost) * sizeof(**seq));
    int rc = grown ? 0 : fsdp_err(FSDP_ERR_NOMEM, "sampler buffers");
    if (grown) {
        *seq = grown;
        *cap += npre + npost;
    }
    for (size_t i = 0; rc == 0 && i < npre; i++) {
        (*seq)[(*n)++] = (int32_t)pre[i];
    }
    for (size_t i = 0; rc == 0 && i < nids; i++) { /* only the text's own tokens are printed */
        (*seq)[(*n)++] = (int32_t)ids[i];
        rc = emit(sk, (int32_t)ids[i], 0);
    }
    for (size_t i = 0; rc == 0 && i < npost; i++) {
        (*seq)[(*n)++] = (int32_t)post[i];
    }
    free(ids);
    FSDP_CHECK(rc);
    FSDP_INFO(FSDP_SUB_SAMPLE, "prompt: %zu tokens, %zu of them from the tokenizer's "
              "post_processor", *n, npre + npost);
    if (*n == 0) {
        (*seq)[(*n)++] = V - 1;
    }
    return 0;
}

/* Everything a run holds: the model on its device, the decoder, the
 * sequence so far and the sampling scratch. */
struct sampler {
    struct fsdp_model_spec *spec;
    struct fsdp_model *model;
    float *params, **units; /* (total_numel,) on the host; units point into it */
    struct fsdp_device *dev;
    float *dparams, *dlogits; /* device: (total_numel,), (V,) */
    struct fsdp_decoder *dec; /* NULL: the whole window per token */
    int32_t *seq;             /* (cap,) prompt and generated tokens */
    size_t cap, n;
    struct scored *cand; /* (V,) */
    double *probs;       /* (V,) */
    float *logits;       /* (V,) host */
    struct sink sk;
};

/* The model file (or checkpoint) c names, read and placed on c's device. */
static int sample_setup(const struct sample_config *c, struct sampler *sm)
{
    char path[sizeof(c->model) + 64];
    FSDP_CHECK(fsdp_model_registry_init());
    FSDP_CHECK(fsdp_model_source_resolve(c->model, path, sizeof(path), NULL));
    FSDP_CHECK(fsdp_model_file_read_spec(path, fsdp_arch_registered(), &sm->spec));
    const struct fsdp_model_spec *spec = sm->spec;
    const int V = spec->vocab_size;
    sm->cap = strlen(c->prompt) + 1 + (size_t)c->tokens;
    sm->params = fsdp_alloc(spec->total_numel * sizeof(float));
    sm->units = calloc((size_t)spec->n_units, sizeof(*sm->units));
    sm->seq = malloc(sm->cap * sizeof(*sm->seq));
    sm->cand = malloc((size_t)V * sizeof(*sm->cand));
    sm->probs = malloc((size_t)V * sizeof(*sm->probs));
    sm->logits = malloc((size_t)V * sizeof(*sm->logits));
    if (!sm->params || !sm->units || !sm->seq || !sm->cand || !sm->probs || !sm->logits) {
        return fsdp_err(FSDP_ERR_NOMEM, "sampler buffers");
    }
    size_t off = 0;
    for (int u = 0; u < spec->n_units; u++) {
        sm->units[u] = sm->params + off;
        off += spec->unit_numel[u];
    }
    FSDP_CHECK(fsdp_model_file_read(path, fsdp_arch_registered(), spec, sm->units));
    FSDP_CHECK(sample_to_device(c, spec, sm->params, &sm->dev, &sm->dparams, &sm->dlogits));
    struct fsdp_model_opts mo = {.max_B = 1, .max_T = spec->context, .dev = sm->dev};
    FSDP_CHECK(fsdp_model_create(spec, &mo, &sm->model));
    for (int u = 0, at = 0; u < spec->n_units; at += (int)spec->unit_numel[u], u++) {
        FSDP_CHECK(sm->model->ops->set_unit(sm->model, u, sm->dparams + at, FSDP_F32, NULL));
    }
    return 0;
}

/* The logits after seq[0, n) into sm->logits: with the decoder, feeds
 * token tok (restarting from the last half-context when the cache is
 * full); without it, runs the whole window. */
static int sample_next_logits(struct sampler *sm, int tok, size_t keep)
{
    struct fsdp_decoder *dec = sm->dec;
    if (dec) {
        if (dec->pos == dec->max_T) { /* full: restart from the last half-context */
            dec->pos = 0;
            for (size_t j = sm->n - keep; j + 1 < sm->n; j++) {
                FSDP_CHECK(dec->ops->step(dec, sm->seq[j], sm->logits));
            }
        }
        return dec->ops->step(dec, tok, sm->logits);
    }
    const int V = sm->spec->vocab_size;
    const size_t ctx = (size_t)sm->spec->context;
    size_t window = sm->n < ctx ? sm->n : ctx;
    FSDP_CHECK(fsdp_model_forward(sm->model, sm->seq + sm->n - window, NULL, 1, (int)window, NULL));
    FSDP_CHECK(sm->model->ops->logits(sm->model, window - 1, 1, sm->dlogits));
    return fsdp_device_read(sm->dev, sm->logits, sm->dlogits, (size_t)V * sizeof(float));
}

/* The prompt, then c->tokens sampled tokens, each printed as it comes. */
static int sample_generate(const struct sample_config *c, struct sampler *sm)
{
    const int V = sm->spec->vocab_size, ctx = sm->spec->context;
    struct fsdp_model *model = sm->model;
    sm->sk.V = V;
    FSDP_CHECK(sample_prompt(c, &sm->sk, V, &sm->seq, &sm->cap, &sm->n));
    uint64_t rng = (uint64_t)c->seed;
    double t0 = fsdp_now();
    if (!c->no_cache && !model->ops->decoder_create) {
        FSDP_WARN(FSDP_SUB_SAMPLE,
                  "architecture %s has no key/value cache: every token runs "
                  "the whole window",
                  sm->spec->arch->name);
    }
    if (!c->no_cache && model->ops->decoder_create) {
        FSDP_CHECK(model->ops->decoder_create(model, ctx, &sm->dec));
    }
    /* the logits after seq[0, n): prefill the cache with the prompt */
    size_t keep = (size_t)ctx - (size_t)ctx / 2; /* tokens kept when the cache is full */
    for (size_t i = sm->n > (size_t)ctx ? sm->n - keep : 0; sm->dec && i < sm->n; i++) {
        FSDP_CHECK(sm->dec->ops->step(sm->dec, sm->seq[i], sm->logits));
    }
    for (long i = 0; i < c->tokens; i++) {
        if (!sm->dec) {
            FSDP_CHECK(sample_next_logits(sm, -1, keep));
        }
        int tok = sample_token(sm->logits, V, c->temperature, c->top_k, c->top_p, sm->cand,
                               sm->probs, &rng);
        sm->seq[sm->n++] = tok;
        FSDP_CHECK(emit(&sm->sk, tok, 0));
        if (sm->dec && i + 1 < c->tokens) {
            FSDP_CHECK(sample_next_logits(sm, tok, keep));
        }
    }
    FSDP_CHECK(emit(&sm->sk, -1, 1)); /* what an incomplete sequence left */
    /* the text ends with a line of its own before any log line on stderr */
    if (sm->sk.last != '\n') {
        putchar('\n');
    }
    fflush(stdout);
    double dt = fsdp_now() - t0;
    FSDP_INFO(FSDP_SUB_SAMPLE, "%ld tokens in %.2f s (%.1f tok/s, %s)", c->tokens, dt,
              dt > 0 ? (double)c->tokens / dt : 0.0,
              sm->dec ? "key/value cache" : "whole window per token");
    return 0;
}

static void sample_free(struct sampler *sm)
{
    if (sm->dec) {
        sm->dec->ops->destroy(sm->dec);
    }
    fsdp_tokenizer_free(sm->sk.tok);
    fsdp_model_destroy(sm->model);
    if (sm->dev) {
        sm->dev->ops->free(sm->dev, sm->dparams);
        sm->dev->ops->free(sm->dev, sm->dlogits);
        fsdp_device_destroy(sm->dev);
    }
    free(sm->probs);
    free(sm->logits);
    free(sm->cand);
    free(sm->seq);
    free(sm->units);
    fsdp_free(sm->params);
    fsdp_model_spec_destroy(sm->spec);
}

static int sample_run(const struct sample_config *c)
{
    struct sampler sm = {0};
    int rc = sample_setup(c, &sm);
    if (rc == 0) {
        rc = sample_generate(c, &sm);
    }
    sample_free(&sm);
    return rc;
}

int fsdp_sample_program(int argc, char **argv)
{
    struct sample_config c = {.tokens = 256,
                              .temperature = 1.0,
                              .top_p = 1.0,
                              .specials = 1,
                              .seed = 1337,
                              .threads = 1,
                              .device = "cpu"};
    snprintf(c.device, sizeof(c.device), "%s", fsdp_device_default_name());
    struct fsdp_optset set = {.prog = "fsdpc-sample", .opts = sample_opts,
                              .n = sizeof(sample_opts) / sizeof(sample_opts[0]), .base = &c};
    fsdp_log_set_rank(0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("fsdpc-sample fsdpc %s\n", PACKAGE_VERSION);
            return 0;
        }
    }
    int rc = fsdp_opt_parse(&set, argc, argv, NULL);
    if (rc == 1) {
        fsdp_opt_usage(&set, stdout, "--model FILE [--prompt TEXT] [--tokens N] [options]");
        return 0;
    }
    if (rc == 0) {
        rc = fsdp_opt_check_required(&set);
    }
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-sample: options", "fsdpc-sample --help lists every option");
    }
    openblas_set_num_threads((int)c.threads);
    rc = sample_run(&c);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-sample", NULL);
    }
    return 0;
}
