/*
 * hf_tool.c - fsdpc-ckpt import-hf / export-hf: a Hugging Face model
 * directory (config.json + model.safetensors or indexed shards, as
 * transformers' save_pretrained writes them) into a model file, and a
 * model file or checkpoint out as one (doc/formats.md, "Hugging Face
 * directories"). Names and layouts come from the architecture's own
 * Hugging Face map (core/hf_map.h), config.json through hf_map.h, which
 * finds the architecture by model_type; the directory itself from
 * io/hf/hf_dir.h. Nothing here names an architecture.
 *
 * Streamed tensor by tensor: import holds the largest tensor as f32, plus
 * its source bytes when they are 16-bit, plus a transposed copy for the
 * weights the map stores transposed (GPT-2's Conv1D); export the same the
 * other way round. A directory's names,
 * shapes and dtypes are all checked before the output file is created.
 */
#include "config.h"
#include "programs/ckpt_tool.h"
#include "programs/hf_map.h"
#include "io/ckpt/ckpt.h"
#include "io/hf/hf_dir.h"
#include "io/h5/model_file.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"
#include "core/log.h"

#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <xxhash.h>

#define HF_SHOW 96
#define HF_NAME_MAX (FSDP_PARAM_NAME_MAX + 16)

#define F(field) offsetof(struct fsdp_ckpt_args, field)
#define S(field) sizeof(((struct fsdp_ckpt_args *)0)->field)
#define N_OPTS(t) (sizeof(t) / sizeof(t[0]))

// ----------------------------------------------------------------------------
// import: which tensor is which parameter

struct hf_import {
    struct fsdp_hf_dir *d;
    const struct fsdp_model_spec *s;
    const struct fsdp_hf_map *m; /* s's architecture's */
    const char *prefix;          /* m's, "" when none */
    long *src;     /* (n_params,) each parameter's tensor in d */
    long lm_head;  /* a tied model's lm_head.weight in d, or -1 */
};

/* The tensor of fsdpc parameter name: prefix + name, or the bare name (a
 * base model's file); the head is never prefixed. */
static long hf_lookup(const struct hf_import *im, const char *name)
{
    char buf[HF_NAME_MAX];
    if (!im->prefix[0] || (im->m->head && strcmp(name, im->m->head) == 0)) {
        return fsdp_hf_dir_find(im->d, name);
    }
    snprintf(buf, sizeof(buf), "%s%s", im->prefix, name);
    long i = fsdp_hf_dir_find(im->d, buf);
    return i >= 0 ? i : fsdp_hf_dir_find(im->d, name);
}

/* One tensor under both spellings (X and prefix + X): which is meant? */
static int hf_check_aliases(const struct hf_import *im)
{
    size_t pl = strlen(im->prefix);
    for (size_t i = 0; pl && i < im->d->n; i++) {
        const char *n = im->d->t[i].t->name;
        if (strncmp(n, im->prefix, pl) == 0 && fsdp_hf_dir_find(im->d, n + pl) >= 0) {
            char a[HF_SHOW], b[HF_SHOW];
            return fsdp_err(FSDP_ERR_FORMAT, "%s: both '%s' and '%s' are present: one tensor "
                            "under two names", im->d->dir, fsdp_str_printable(a, sizeof(a), n, 0),
                            fsdp_str_printable(b, sizeof(b), n + pl, 0));
        }
    }
    return 0;
}

static void hf_show_shape(char *buf, size_t len, int ndim, const size_t *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "(");
    for (int k = 0; k < ndim && used < len; k++) {
        used += (size_t)snprintf(buf + used, len - used, k ? ", %zu" : "%zu", shape[k]);
    }
    if (used < len) {
        snprintf(buf + used, len - used, ndim == 1 ? ",)" : ")");
    }
}

/* Tensor k stands for parameter p: a float dtype and p's shape as the
 * state dict holds it. */
static int hf_check_one(const struct hf_import *im, size_t k, const struct fsdp_param_spec *p)
{
    const struct fsdp_st_tensor *t = im->d->t[k].t;
    const struct fsdp_arch *a = im->s->arch;
    int tr = fsdp_hf_param_transposed(im->m, p);
    char show[HF_SHOW], got[96], want[64], why[160] = "";
    if (!fsdp_dtype_is_float(t->dtype)) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' has dtype %s; parameters are F32, F16 "
                        "or BF16", fsdp_hf_dir_file(im->d, k),
                        fsdp_str_printable(show, sizeof(show), t->name, 0),
                        fsdp_dtype_name(t->dtype));
    }
    size_t sh[2];
    fsdp_hf_param_shape(im->m, p, sh);
    if (t->ndim == p->ndim && t->shape[0] == sh[0] && (p->ndim == 1 || t->shape[1] == sh[1])) {
        return 0;
    }
    hf_show_shape(got, sizeof(got), t->ndim, t->shape);
    hf_show_shape(want, sizeof(want), p->ndim, sh);
    if (a->shape_reason) {
        char r[128];
        a->shape_reason(im->s->cfg, p->name, r, sizeof(r));
        snprintf(why, sizeof(why), " (fsdpc's %s)", r);
    }
    return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' has shape %s but config.json makes it %s%s%s",
                    fsdp_hf_dir_file(im->d, k), fsdp_str_printable(show, sizeof(show), t->name, 0),
                    got, want, why, tr ? " (Conv1D layout: in, out)" : "");
}

/* Every parameter present with its shape; nothing else but buffers and a
 * tied model's lm_head.weight. */
static int hf_match(struct hf_import *im)
{
    const struct fsdp_model_spec *s = im->s;
    unsigned char *used = calloc(im->d->n, 1);
    int rc = 0;
    if (!used) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: tensor marks", im->d->dir);
    }
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        char name[HF_NAME_MAX];
        im->src[i] = hf_lookup(im, s->params[i].name);
        if (im->src[i] < 0) {
            fsdp_hf_param_name(im->m, &s->params[i], name, sizeof(name));
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' is missing", im->d->dir, name);
            break;
        }
        used[im->src[i]] = 1;
        rc = hf_check_one(im, (size_t)im->src[i], &s->params[i]);
    }
    const char *head = im->m->head;
    im->lm_head = head && fsdp_model_spec_find(s, head) < 0 ? fsdp_hf_dir_find(im->d, head) : -1;
    if (im->lm_head >= 0) {
        used[im->lm_head] = 1;
    }
    for (size_t k = 0; rc == 0 && k < im->d->n; k++) {
        const char *n = im->d->t[k].t->name;
        if (!used[k] && !fsdp_hf_is_buffer(im->m, n)) {
            char show[HF_SHOW];
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: unexpected tensor '%s' (not a parameter of the "
                          "%s model config.json describes)", fsdp_hf_dir_file(im->d, k),
                          fsdp_str_printable(show, sizeof(show), n, 0), s->arch->name);
        }
    }
    free(used);
    return rc;
}

/* XXH3 of tensor k's bytes, read through buf. */
static int hf_hash(struct hf_import *im, size_t k, void *buf, uint64_t *h)
{
    FSDP_CHECK(fsdp_hf_dir_read(im->d, k, buf));
    const struct fsdp_st_tensor *t = im->d->t[k].t;
    *h = XXH3_64bits(buf, t->end - t->begin);
    return 0;
}

/* A tied model's lm_head.weight, when the file has one, must be the
 * embedding: transformers would silently use the embedding instead. */
static int hf_check_tied_head(struct hf_import *im, void *buf)
{
    if (im->lm_head < 0 || im->s->n_ties == 0) {
        return 0;
    }
    size_t e = (size_t)im->src[im->s->ties[0].param], k = (size_t)im->lm_head;
    const struct fsdp_st_tensor *a = im->d->t[e].t, *b = im->d->t[k].t;
    uint64_t ha = 0, hb = 1;
    int same = a->dtype == b->dtype && a->ndim == b->ndim && a->end - a->begin == b->end - b->begin &&
               memcmp(a->shape, b->shape, sizeof(a->shape)) == 0;
    if (same) {
        FSDP_CHECK(hf_hash(im, e, buf, &ha));
        FSDP_CHECK(hf_hash(im, k, buf, &hb));
    }
    if (!same || ha != hb) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: %s differs from %s, but config.json ties them "
                        "(tie_word_embeddings)", fsdp_hf_dir_file(im->d, k), b->name, a->name);
    }
    return 0;
}

/* The special-token ids s carries, or a warning that generate() will not
 * know where a text ends. */
static void hf_print_tokens(const struct fsdp_model_spec *s, const char *where)
{
    if (s->eos_token_id >= 0) {
        printf("special tokens: bos_token_id %ld, eos_token_id %ld\n", s->bos_token_id,
               s->eos_token_id);
        return;
    }
    FSDP_WARN(FSDP_SUB_IO, "no eos_token_id in %s: transformers' generate() falls back to the model "
              "class's default (Llama: 2, GPT-2: 50256), which with another tokenizer is an "
              "ordinary token and ends a generation early; export-hf --tokenizer FILE or "
              "--eos-token-id N sets it", where);
}

// ----------------------------------------------------------------------------
// import

static const struct fsdp_opt import_opts[] = {
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|bf16|f16", "T", 0,
     "stored dtype of the model file", 0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "F", 0,
     "the model file to write (via F.tmp.XXXXXX and rename)", 'o'},
};
static const struct fsdp_cli_cmd import_cmd = {
    "DIR -o MODEL.h5 [--dtype T]",
    "Reads a Hugging Face model directory, as transformers' save_pretrained\n"
    "writes it (config.json, and model.safetensors or the shards that\n"
    "model.safetensors.index.json lists), into a model file. model_type gpt2\n"
    "makes a gpt2 model; llama, mistral (without a sliding window) and qwen2 a\n"
    "llama one. Tensors may be f32, bf16 or f16; they are read one at a time.",
    import_opts, N_OPTS(import_opts)};

/* Largest f32 elements, largest 16-bit source bytes and largest transposed
 * elements over the parameters: what the three buffers must hold. */
static void hf_import_sizes(const struct hf_import *im, size_t *f32, size_t *raw, size_t *tr)
{
    *f32 = fsdp_model_spec_largest(im->s);
    *raw = *tr = 0;
    for (size_t i = 0; i < im->s->n_params; i++) {
        const struct fsdp_param_spec *p = &im->s->params[i];
        const struct fsdp_st_tensor *t = im->d->t[im->src[i]].t;
        size_t b = t->end - t->begin;
        *raw = t->dtype != FSDP_F32 && b > *raw ? b : *raw;
        *tr = fsdp_hf_param_transposed(im->m, p) && p->numel > *tr ? p->numel : *tr;
    }
}

/* Every parameter from the directory into the writer. */
static int hf_import_tensors(struct hf_import *im, struct fsdp_model_writer *w, float *a,
                             void *raw, float *tbuf)
{
    for (size_t i = 0; i < im->s->n_params; i++) {
        const struct fsdp_param_spec *p = &im->s->params[i];
        size_t k = (size_t)im->src[i];
        const struct fsdp_st_tensor *t = im->d->t[k].t;
        if (t->dtype == FSDP_F32) {
            FSDP_CHECK(fsdp_hf_dir_read(im->d, k, a));
        } else {
            FSDP_CHECK(fsdp_hf_dir_read(im->d, k, raw));
            FSDP_CHECK(fsdp_convert(a, FSDP_F32, raw, t->dtype, p->numel));
        }
        const float *src = a;
        if (fsdp_hf_param_transposed(im->m, p)) {
            fsdp_hf_transpose(tbuf, a, p->shape[0], p->shape[1]);
            src = tbuf;
        }
        FSDP_CHECK(fsdp_model_writer_put(w, i, src));
    }
    return 0;
}

/* The model file out of an opened and matched directory. */
static int hf_import_write(struct hf_import *im, const char *out, enum fsdp_dtype dtype)
{
    size_t nf, nraw, ntr;
    hf_import_sizes(im, &nf, &nraw, &ntr);
    float *a = fsdp_alloc(nf * sizeof(float));
    void *raw = nraw ? fsdp_alloc(nraw) : NULL;
    float *tbuf = ntr ? fsdp_alloc(ntr * sizeof(float)) : NULL;
    struct fsdp_model_writer *w = NULL;
    int rc;
    if (!a || (nraw && !raw) || (ntr && !tbuf)) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "buffers for the largest tensor (%zu elements)", nf);
        goto out;
    }
    FSDP_CHECK_GOTO(hf_check_tied_head(im, a), rc, out);
    char created_by[512];
    snprintf(created_by, sizeof(created_by), "fsdpc-ckpt import-hf %s", im->d->dir);
    struct fsdp_model_write_opts wo = {.created_by = created_by, .dtype = dtype};
    FSDP_CHECK_GOTO(fsdp_model_writer_create(out, im->s, &wo, &w), rc, out);
    FSDP_CHECK_GOTO(hf_import_tensors(im, w, a, raw, tbuf), rc, out);
    rc = fsdp_model_writer_commit(w);
out:
    fsdp_model_writer_destroy(w);
    fsdp_free(a);
    fsdp_free(raw);
    fsdp_free(tbuf);
    return rc;
}

int fsdp_ckpt_cmd_import_hf(int argc, char **argv)
{
    struct fsdp_ckpt_args args = {.dtype = FSDP_F32};
    const char *in, *out = args.out, *what = "fsdpc-ckpt import-hf";
    int rc;
    if (fsdp_ckpt_tool_parse_io(&import_cmd, &args, argc, argv, &in, "directory", "MODEL.h5")) {
        return 0;
    }
    enum fsdp_dtype dtype = args.dtype;
    struct hf_import im = {.lm_head = -1};
    struct fsdp_hf_model hm = {0};
    struct fsdp_model_spec *s = NULL;
    if ((rc = fsdp_hf_dir_open(in, &im.d)) < 0 ||
        (rc = fsdp_hf_config_read(&im.d->config, &hm)) < 0 ||
        (rc = hm.arch->spec_create(hm.cfg, &s)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    if ((rc = fsdp_hf_tokens_read(im.d->dir, &im.d->config, s->vocab_size, &s->bos_token_id,
                                  &s->eos_token_id)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    im.s = s;
    im.m = fsdp_arch_hf(s->arch);
    im.prefix = im.m->prefix ? im.m->prefix : "";
    im.src = calloc(s->n_params, sizeof(*im.src));
    if (!im.src) {
        fsdp_fatal("%s: out of memory for the tensor map", what);
    }
    if ((rc = hf_check_aliases(&im)) < 0 || (rc = hf_match(&im)) < 0 ||
        (rc = hf_import_write(&im, out, dtype)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    char desc[256];
    fsdp_arch_describe(s->arch, s->cfg, desc, sizeof(desc));
    printf("%s: %s (%s) %s, %zu tensors from %zu file%s, written to %s as %s\n", im.d->dir,
           s->arch->name, hm.model_type, desc, s->n_params, im.d->n_files,
           im.d->n_files == 1 ? "" : "s", out, fsdp_dtype_name(dtype));
    hf_print_tokens(s, "the directory's config.json and generation_config.json");
    free(im.src);
    free(hm.cfg);
    fsdp_model_spec_destroy(s);
    fsdp_hf_dir_close(im.d);
    return 0;
}

// ----------------------------------------------------------------------------
// export

static const struct fsdp_opt export_opts[] = {
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|bf16|f16", "T", 0, "stored dtype", 0},
    {"tokenizer", FSDP_OPT_STR, F(tokenizer), S(tokenizer), 0, 0, NULL, "FILE", 0,
     "take the special-token ids from a tokenizer.json", 0},
    {"bos-token-id", FSDP_OPT_STR, F(bos_token_id), S(bos_token_id), 0, 0, NULL, "N", 0,
     "set bos_token_id (over the above)", 0},
    {"eos-token-id", FSDP_OPT_STR, F(eos_token_id), S(eos_token_id), 0, 0, NULL, "N", 0,
     "set eos_token_id (over the above)", 0},
    {"max-shard-size", FSDP_OPT_STR, F(max_shard_size), S(max_shard_size), 0, 0, NULL, "S", 0,
     "largest shard: bytes, or with KB MB GB (powers of 1000) or KiB MiB GiB (of 1024)", 0},
    {"force", FSDP_OPT_FLAG, F(force), 0, 0, 0, NULL, "", 0,
     "replace DIR when it exists and is not empty", 0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "DIR", 0, "the directory to write", 'o'},
};
static const struct fsdp_cli_cmd export_cmd = {
    "PATH -o DIR [--dtype T] [--max-shard-size S]\n"
    "                 [--force] [--tokenizer FILE] [--bos-token-id N] [--eos-token-id N]",
    "Writes a model file or checkpoint (a root, a step directory or its index.h5)\n"
    "as a Hugging Face model directory that AutoModelForCausalLM.from_pretrained\n"
    "loads: config.json, and model.safetensors or, above the shard size, shards\n"
    "model-00001-of-0000N.safetensors with model.safetensors.index.json. A gpt2\n"
    "model becomes GPT2LMHeadModel, a llama one LlamaForCausalLM (Qwen2ForCausalLM\n"
    "with q/k/v biases). DIR is filled as DIR.tmp.XXXXXX and renamed into place.\n"
    "\n"
    "The model's bos_token_id and eos_token_id (from import-hf, or kept by the\n"
    "trainer) go into config.json and generation_config.json; without an\n"
    "eos_token_id, generate() would stop at transformers' default (Llama: 2).",
    export_opts, N_OPTS(export_opts)};
#undef F
#undef S
#undef N_OPTS

/* transformers' spelling of sizes: "5GB" is 5 * 10^9 bytes, "500MiB" 500 * 2^20. */
static size_t hf_parse_shard_size(const char *s)
{
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
                 {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
                 {"TiB", 1099511627776.0}};
    char *end;
    double v = strtod(s, &end);
    for (size_t u = 0; end != s && isfinite(v) && u < sizeof(units) / sizeof(units[0]); u++) {
        if (strcasecmp(end, units[u].unit) == 0) {
            double b = floor(v * units[u].mult);
            if (b >= 1 && b < 1.8e19) {
                return (size_t)b;
            }
        }
    }
    fsdp_fatal("fsdpc-ckpt export-hf: --max-shard-size '%s' must be a positive size such as "
               "5GB, 500MB, 2GiB or 1000000 (bytes)", s);
}

/* Every parameter: read as f32, transposed where the state dict wants it,
 * converted to dtype, written. */
static int hf_export_tensors(struct fsdp_ckpt_source *src, const struct fsdp_model_spec *s,
                             enum fsdp_dtype dtype, struct fsdp_hf_writer *w)
{
    const struct fsdp_hf_map *m = fsdp_arch_hf(s->arch);
    size_t big = fsdp_model_spec_largest(s), ntr = 0;
    for (size_t i = 0; i < s->n_params; i++) {
        size_t n = s->params[i].numel;
        ntr = fsdp_hf_param_transposed(m, &s->params[i]) && n > ntr ? n : ntr;
    }
    float *a = fsdp_alloc(big * sizeof(float));
    float *tbuf = ntr ? fsdp_alloc(ntr * sizeof(float)) : NULL;
    uint16_t *h = dtype != FSDP_F32 ? fsdp_alloc(big * sizeof(uint16_t)) : NULL;
    int rc = 0;
    if (!a || (ntr && !tbuf) || (dtype != FSDP_F32 && !h)) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "buffers for the largest tensor (%zu elements)", big);
    }
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        const void *v;
        FSDP_CHECK_GOTO(fsdp_ckpt_source_read(src, i, p, a), rc, out);
        FSDP_CHECK_GOTO(fsdp_hf_param_export(m, p, a, dtype, tbuf, h, &v), rc, out);
        rc = fsdp_hf_writer_put(w, i, v);
    }
out:
    fsdp_free(a);
    fsdp_free(tbuf);
    fsdp_free(h);
    return rc;
}

/* The directory for spec from src. */
static int hf_export_write(struct fsdp_ckpt_source *src, const struct fsdp_model_spec *s,
                           enum fsdp_dtype dtype, const char *out, size_t max_shard, int force,
                           size_t *n_shards)
{
    struct fsdp_st_entry *e = calloc(s->n_params, sizeof(*e));
    char (*names)[FSDP_ST_NAME_MAX] = calloc(s->n_params, sizeof(*names));
    struct fsdp_hf_writer *w = NULL;
    char *cfg = NULL;
    size_t cfg_len;
    int rc;
    if (!e || !names) {
        rc = fsdp_err(FSDP_ERR_NOMEM, "%s: tensor list", out);
        goto done;
    }
    fsdp_hf_st_entries(s, dtype, e, names);
    FSDP_CHECK_GOTO(fsdp_hf_config_write(s, dtype, &cfg, &cfg_len), rc, done);
    FSDP_CHECK_GOTO(fsdp_hf_writer_create(out, e, s->n_params, max_shard, force, &w), rc, done);
    *n_shards = fsdp_hf_writer_shards(w);
    FSDP_CHECK_GOTO(hf_export_tensors(src, s, dtype, w), rc, done);
    FSDP_CHECK_GOTO(fsdp_hf_writer_file(w, FSDP_HF_CONFIG, cfg, cfg_len), rc, done);
    if (s->bos_token_id >= 0 || s->eos_token_id >= 0) {
        free(cfg);
        cfg = NULL;
        FSDP_CHECK_GOTO(fsdp_hf_generation_config_write(s, &cfg, &cfg_len), rc, done);
        FSDP_CHECK_GOTO(fsdp_hf_writer_file(w, "generation_config.json", cfg, cfg_len), rc, done);
    }
    rc = fsdp_hf_writer_commit(w);
done:
    fsdp_hf_writer_destroy(w);
    free(cfg);
    free(names);
    free(e);
    return rc;
}

/* One --bos-token-id / --eos-token-id value: an id of s's vocabulary. */
static long hf_parse_token_id(const struct fsdp_model_spec *s, const char *flag, const char *v)
{
    char *end;
    long id = strtol(v, &end, 10);
    if (end == v || *end || id < 0 || id >= s->vocab_size) {
        fsdp_fatal("fsdpc-ckpt export-hf: --%s '%s' must be a token id in [0, %d), the model's "
                   "vocabulary", flag, v, s->vocab_size);
    }
    return id;
}

/* The ids an export writes: the model's, then a tokenizer's, then the flags'. */
static void hf_export_tokens(struct fsdp_model_spec *s, const char *in, const char *tokenizer,
                             const char *const ids[2])
{
    if (tokenizer) {
        long bos, eos;
        char desc[1024];
        int rc = fsdp_hf_tokens_from_tokenizer(tokenizer, &bos, &eos, desc, sizeof(desc));
        if (rc < 0) {
            fsdp_die(rc, "fsdpc-ckpt export-hf", NULL);
        }
        if (bos >= s->vocab_size || eos >= s->vocab_size) {
            fsdp_fatal("fsdpc-ckpt export-hf: %s: ids beyond the vocabulary (%d) of %s", desc,
                       s->vocab_size, in);
        }
        s->bos_token_id = bos >= 0 ? bos : s->bos_token_id;
        s->eos_token_id = eos >= 0 ? eos : s->eos_token_id;
        fprintf(stderr, "fsdpc-ckpt export-hf: special tokens from %s\n", desc);
    }
    if (ids[0]) {
        s->bos_token_id = hf_parse_token_id(s, "bos-token-id", ids[0]);
    }
    if (ids[1]) {
        s->eos_token_id = hf_parse_token_id(s, "eos-token-id", ids[1]);
    }
}

/* The model file or checkpoint in, opened into src, as one with a Hugging
 * Face map; its spec. */
static const struct fsdp_model_spec *hf_export_open(const char *in, struct fsdp_ckpt_source *src)
{
    const char *what = "fsdpc-ckpt export-hf";
    const struct fsdp_model_spec *s = fsdp_ckpt_source_open(what, in, src);
    if (!fsdp_arch_hf(s->arch)) {
        char names[128];
        fsdp_hf_arch_names(names, sizeof(names));
        fsdp_fatal("%s: %s is a %s model; Hugging Face directories are written for %s models",
                   what, in, s->arch->name, names);
    }
    return s;
}

int fsdp_ckpt_cmd_export_hf(int argc, char **argv)
{
    struct fsdp_ckpt_args args = {.dtype = FSDP_F32, .max_shard_size = "5GB"};
    const char *in, *out = args.out, *what = "fsdpc-ckpt export-hf";
    int rc;
    if (fsdp_ckpt_tool_parse_io(&export_cmd, &args, argc, argv, &in, "input", "DIR")) {
        return 0;
    }
    size_t max_shard = hf_parse_shard_size(args.max_shard_size);
    const char *tokenizer = args.tokenizer[0] ? args.tokenizer : NULL;
    const char *ids[2] = {args.bos_token_id[0] ? args.bos_token_id : NULL,
                          args.eos_token_id[0] ? args.eos_token_id : NULL};
    enum fsdp_dtype dtype = args.dtype;
    struct fsdp_ckpt_source src;
    const struct fsdp_model_spec *s = hf_export_open(in, &src);
    if ((rc = fsdp_hf_dir_occupied(out)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    if (rc > 0 && !args.force) {
        fsdp_fatal("%s: %s exists and is not empty (--force replaces it)", what, out);
    }
    /* a copy that only the ids differ in: the writers read it, nothing frees it */
    struct fsdp_model_spec sx = *s;
    hf_export_tokens(&sx, in, tokenizer, ids);
    s = &sx;
    size_t shards = 0;
    if ((rc = hf_export_write(&src, s, dtype, out, max_shard, args.force, &shards)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    char desc[256];
    fsdp_arch_describe(s->arch, s->cfg, desc, sizeof(desc));
    printf("%s: %s %s, %zu tensors written to %s as %s in %zu file%s\n", in, s->arch->name, desc,
           s->n_params, out, fsdp_dtype_name(dtype), shards, shards == 1 ? "" : "s");
    char where[512];
    snprintf(where, sizeof(where), "%s (nor a --tokenizer or --eos-token-id)", in);
    hf_print_tokens(s, where);
    fsdp_ckpt_source_close(&src);
    return 0;
}
