/*
 * st_tool.c - fsdpc-ckpt export-safetensors / import-safetensors: fsdpc
 * GPT-2 tensors <-> Hugging Face GPT-2 safetensors (names and layout:
 * doc/formats.md, "Mapping to Hugging Face GPT-2"): "transformer." prefix,
 * Conv1D weights (c_attn, c_proj, c_fc) transposed, the tied lm_head left
 * out (the mapping is hf_map.h's, shared with import-hf and export-hf).
 * Streamed tensor by tensor through two buffers of the largest tensor.
 * Names and metadata from a file are printed only through fsdp_str_printable.
 */
#include "config.h"
#include "programs/ckpt_tool.h"
#include "programs/hf_map.h"
#include "io/ckpt.h"
#include "io/model_file.h"
#include "io/safetensors.h"
#include "model/gpt2_spec.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/util.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static enum fsdp_dtype st_parse_dtype(const char *cmd, const char *s)
{
    if (strcmp(s, "f32") == 0) {
        return FSDP_F32;
    }
    if (strcmp(s, "bf16") == 0) {
        return FSDP_BF16;
    }
    if (strcmp(s, "f16") == 0) {
        return FSDP_F16;
    }
    fsdp_fatal("fsdpc-ckpt %s: --dtype '%s' must be f32, bf16 or f16", cmd, s);
}

/* Hugging Face Conv1D weights are stored (in, out): ours transposed (hf_map.h). */
static int st_is_conv1d(const struct fsdp_param_spec *p)
{
    return fsdp_hf_param_transposed(&fsdp_gpt2_arch, p);
}

static void st_hf_name(char *buf, size_t len, const struct fsdp_param_spec *p)
{
    fsdp_hf_param_name(&fsdp_gpt2_arch, p, buf, len);
}

/* dst (rows, cols) = transpose of src (cols, rows) */
static void st_transpose(float *dst, const float *src, size_t rows, size_t cols)
{
    for (size_t r = 0; r < rows; r++) {
        for (size_t c = 0; c < cols; c++) {
            dst[r * cols + c] = src[c * rows + r];
        }
    }
}

// ----------------------------------------------------------------------------
// export

static void export_usage(FILE *out)
{
    fprintf(out,
            "usage: fsdpc-ckpt export-safetensors PATH -o FILE.safetensors [--dtype T]\n"
            "\n"
            "Writes the weights of a model file or checkpoint as a Hugging Face GPT-2\n"
            "safetensors file: names transformer.h.0.attn.c_attn.weight etc., Conv1D\n"
            "weights transposed to (in, out), the tied lm_head left out. n_head, ln_eps\n"
            "and context go to __metadata__ for import-safetensors, with the XXH3-64\n"
            "checksum of every tensor (fsdpc.xxh3_64.<name>).\n"
            "\n"
            "      --dtype T     f32 (default), bf16 or f16\n"
            "  -o, --output F    the file to write (via F.tmp and rename)\n"
            "  -h, --help        this text\n");
}

int fsdp_ckpt_cmd_export_st(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dtype", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    enum fsdp_dtype dtype = FSDP_F32;
    int c, rc;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dtype = st_parse_dtype("export-safetensors", optarg); break;
        case 'o': out = optarg; break;
        case 'h': export_usage(stdout); return 0;
        default: fsdp_ckpt_tool_bad_option("export-safetensors", c, argv);
        }
    }
    if (optind != argc - 1 || !out) {
        fsdp_fatal("fsdpc-ckpt export-safetensors: expected one input and -o FILE (see --help)");
    }
    const char *in = argv[optind];
    struct fsdp_ckpt *ck = NULL;
    struct fsdp_model_file *mf = NULL;
    const struct fsdp_model_spec *s;
    if (fsdp_ckpt_is_checkpoint(in)) {
        if ((rc = fsdp_ckpt_open(in, &ck)) < 0) {
            fsdp_die(rc, "fsdpc-ckpt export-safetensors", NULL);
        }
        s = fsdp_ckpt_spec(ck);
    } else {
        if ((rc = fsdp_model_file_open(in, &mf)) < 0) {
            fsdp_die(rc, "fsdpc-ckpt export-safetensors", NULL);
        }
        s = fsdp_model_file_spec(mf);
    }
    if (s->arch != &fsdp_gpt2_arch) {
        fsdp_fatal("fsdpc-ckpt export-safetensors: %s is a %s model; the Hugging Face names are "
                   "known for gpt2 only", in, s->arch->name);
    }
    struct fsdp_st_entry *e = calloc(s->n_params, sizeof(*e));
    char (*names)[FSDP_ST_NAME_MAX] = calloc(s->n_params, sizeof(*names));
    size_t big = fsdp_model_spec_largest(s);
    float *a = fsdp_alloc(big * sizeof(float)), *b = fsdp_alloc(big * sizeof(float));
    uint16_t *h = fsdp_alloc(big * sizeof(uint16_t));
    if (!e || !names || !a || !b || !h) {
        fsdp_fatal("fsdpc-ckpt export-safetensors: out of memory for one tensor");
    }
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        st_hf_name(names[i], sizeof(names[i]), p);
        e[i].name = names[i];
        e[i].dtype = dtype;
        e[i].ndim = p->ndim;
        e[i].shape[0] = st_is_conv1d(p) ? p->shape[1] : p->shape[0];
        e[i].shape[1] = st_is_conv1d(p) ? p->shape[0] : p->shape[1];
    }
    char nh[32], eps[32], ctx[32];
    snprintf(nh, sizeof(nh), "%d", fsdp_gpt2_cfg(s)->n_head);
    snprintf(eps, sizeof(eps), "%.9g", (double)fsdp_gpt2_cfg(s)->ln_eps);
    snprintf(ctx, sizeof(ctx), "%d", fsdp_gpt2_cfg(s)->context);
    const char *meta[] = {"format", "pt", "fsdpc_n_head", nh, "fsdpc_ln_eps", eps,
                          "fsdpc_context", ctx};
    struct fsdp_st_writer *w = NULL;
    rc = fsdp_st_writer_create(out, e, s->n_params, meta, 4, &w);
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        size_t n = p->shape[0] * p->shape[1];
        rc = ck ? fsdp_ckpt_read_rows(ck, FSDP_CKPT_MODEL, i, 0, p->shape[0], a)
                : fsdp_model_file_read_block(mf, i, 0, p->shape[0], 0, p->shape[1], a);
        if (rc < 0) {
            break;
        }
        const float *src = a;
        if (st_is_conv1d(p)) {
            st_transpose(b, a, p->shape[1], p->shape[0]);
            src = b;
        }
        if (dtype == FSDP_F32) {
            rc = fsdp_st_writer_put(w, i, src);
        } else if ((rc = fsdp_convert(h, dtype, src, FSDP_F32, n)) == 0) {
            rc = fsdp_st_writer_put(w, i, h);
        }
    }
    if (rc == 0) {
        rc = fsdp_st_writer_commit(w);
    }
    fsdp_st_writer_destroy(w);
    if (rc < 0) {
        fsdp_die(rc, "fsdpc-ckpt export-safetensors", NULL);
    }
    printf("%s: %zu tensors written to %s as %s\n", in, s->n_params, out, fsdp_dtype_name(dtype));
    fsdp_free(a);
    fsdp_free(b);
    fsdp_free(h);
    free(e);
    free(names);
    fsdp_ckpt_close(ck);
    fsdp_model_file_close(mf);
    return 0;
}

// ----------------------------------------------------------------------------
// import

static void import_usage(FILE *out)
{
    fprintf(out,
            "usage: fsdpc-ckpt import-safetensors FILE.safetensors -o MODEL.h5 [--heads N]\n"
            "                 [--ln-eps X] [--dtype T]\n"
            "\n"
            "Reads a Hugging Face GPT-2 safetensors file (names with or without the\n"
            "'transformer.' prefix; Conv1D weights transposed back; the attention mask\n"
            "buffers ignored) into a model file. The architecture comes from the shapes;\n"
            "n_head, which shapes do not give, from --heads or from the file's metadata.\n"
            "An lm_head.weight equal to wte.weight (or absent) makes a tied model.\n"
            "Tensors with a checksum in the metadata (fsdpc.xxh3_64.<name>, written by\n"
            "export-safetensors) are checked as they are read; a mismatch is an error.\n"
            "\n"
            "      --heads N     n_head (GPT-2 small: 12)\n"
            "      --ln-eps X    layer-norm epsilon (default: metadata, else 1e-5)\n"
            "      --dtype T     stored dtype of the model file: f32 (default), bf16, f16\n"
            "  -o, --output F    the model file to write\n"
            "  -h, --help        this text\n");
}

/* Tensor index of fsdpc parameter name: "transformer.<name>" or "<name>". */
static long st_lookup(const struct fsdp_safetensors *st, const char *name)
{
    char buf[FSDP_ST_NAME_MAX + 16];
    snprintf(buf, sizeof(buf), "transformer.%s", name);
    long i = fsdp_safetensors_find(st, buf);
    return i >= 0 ? i : fsdp_safetensors_find(st, name);
}

/* A tensor name from the file, fit to print. */
#define ST_SHOW 80

/*
 * Each tensor once: a file holding both "transformer.X" and "X" names one
 * tensor twice, and the lookups below would take one spelling for some
 * purposes (lm_head: import) and the other for others (validation).
 */
static int st_check_aliases(const struct fsdp_safetensors *st)
{
    char a[ST_SHOW], b[ST_SHOW];
    for (size_t i = 0; i < st->n; i++) {
        const char *n = st->t[i].name;
        if (strncmp(n, "transformer.", 12) == 0 && fsdp_safetensors_find(st, n + 12) >= 0) {
            return fsdp_err(FSDP_ERR_FORMAT, "%s: both '%s' and '%s' are present: one tensor "
                            "under two names (keep one spelling)", st->path,
                            fsdp_str_printable(a, sizeof(a), n, 0),
                            fsdp_str_printable(b, sizeof(b), n + 12, 0));
        }
    }
    return 0;
}

static int st_to_f32(const struct fsdp_safetensors *st, const struct fsdp_st_tensor *t,
                     const void *raw, float *dst, size_t n)
{
    char show[ST_SHOW];
    if (!fsdp_dtype_is_float(t->dtype)) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' has integer dtype; parameters must be "
                        "F32, F16 or BF16", st->path, fsdp_str_printable(show, sizeof(show),
                                                                         t->name, 0));
    }
    return fsdp_convert(dst, FSDP_F32, raw, t->dtype, n);
}

/* The architecture from the tensor shapes (and n_head from heads or metadata). */
static int st_infer(const struct fsdp_safetensors *st, int heads, double eps,
                    struct fsdp_gpt2_config *cfg)
{
    long wte = st_lookup(st, "wte.weight"), wpe = st_lookup(st, "wpe.weight");
    if (wte < 0 || wpe < 0 || st->t[wte].ndim != 2 || st->t[wpe].ndim != 2) {
        return fsdp_err(FSDP_ERR_FORMAT, "%s: no 2-D wte.weight / wpe.weight: not a GPT-2 "
                        "safetensors file", st->path);
    }
    char name[64];
    int L = 0;
    for (;; L++) {
        snprintf(name, sizeof(name), "h.%d.ln_1.weight", L);
        if (st_lookup(st, name) < 0) {
            break;
        }
    }
    const char *mh = fsdp_safetensors_meta(st, "fsdpc_n_head");
    const char *me = fsdp_safetensors_meta(st, "fsdpc_ln_eps");
    long long v;
    if (heads <= 0 && mh && fsdp_parse_long(mh, &v) == 0 && v > 0 && v < 65536) {
        heads = (int)v;
    }
    if (heads <= 0) {
        return fsdp_err(FSDP_ERR_INVALID, "%s: n_head is not in the file: pass --heads N "
                        "(GPT-2 small: 12)", st->path);
    }
    if (eps <= 0.0 && me) {
        char *end;
        eps = strtod(me, &end);
        if (end == me || *end || !(eps > 0.0 && eps < 1.0)) {
            char show[ST_SHOW];
            return fsdp_err(FSDP_ERR_FORMAT, "%s: metadata fsdpc_ln_eps '%s' is not a number "
                            "in (0, 1); pass --ln-eps X", st->path,
                            fsdp_str_printable(show, sizeof(show), me, 0));
        }
    } else if (eps <= 0.0) {
        eps = 1e-5;
    }
    memset(cfg, 0, sizeof(*cfg));
    cfg->vocab_size = (int)st->t[wte].shape[0];
    cfg->n_embd = (int)st->t[wte].shape[1];
    cfg->context = (int)st->t[wpe].shape[0];
    cfg->n_layer = L;
    cfg->n_head = heads;
    cfg->ln_eps = (float)eps;
    cfg->tied = 1;
    return 0;
}

/* Tied when lm_head.weight is absent or equal, byte for byte, to wte.weight. */
static int st_tied(struct fsdp_safetensors *st, void *x, void *y, int *tied)
{
    long lh = fsdp_safetensors_find(st, "lm_head.weight"), wte = st_lookup(st, "wte.weight");
    *tied = 1;
    if (lh < 0) {
        return 0;
    }
    const struct fsdp_st_tensor *a = &st->t[lh], *b = &st->t[wte];
    if (a->dtype != b->dtype || a->ndim != 2 || a->shape[0] != b->shape[0] ||
        a->shape[1] != b->shape[1]) {
        *tied = 0;
        return 0;
    }
    FSDP_CHECK(fsdp_safetensors_read(st, (size_t)lh, x));
    FSDP_CHECK(fsdp_safetensors_read(st, (size_t)wte, y));
    *tied = memcmp(x, y, a->end - a->begin) == 0;
    return 0;
}

/* The attention-mask buffers of older Hugging Face files: not parameters. */
static int st_is_buffer(const char *bare)
{
    return fsdp_hf_is_buffer(&fsdp_gpt2_arch, bare);
}

/* Every parameter of s present with its shape, and nothing else but the
 * buffers and lm_head.weight; linear in the file's tensors (a mark per
 * tensor found), whatever their number. */
static int st_check_tensors(const struct fsdp_safetensors *st, const struct fsdp_model_spec *s)
{
    char show[ST_SHOW];
    unsigned char *used = calloc(st->n ? st->n : 1, 1);
    int rc = 0;
    if (!used) {
        return fsdp_err(FSDP_ERR_NOMEM, "%s: tensor marks", st->path);
    }
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        long k = st_lookup(st, p->name);
        if (k < 0) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensor transformer.%s is missing", st->path,
                          p->name);
            break;
        }
        const struct fsdp_st_tensor *t = &st->t[k];
        size_t r = st_is_conv1d(p) ? p->shape[1] : p->shape[0];
        size_t c = st_is_conv1d(p) ? p->shape[0] : p->shape[1];
        used[k] = 1;
        if (t->ndim != p->ndim || t->shape[0] != r || (p->ndim == 2 && t->shape[1] != c)) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: tensor '%s' has %d dims (%zu, %zu) but the "
                          "model needs (%zu, %zu)%s", st->path,
                          fsdp_str_printable(show, sizeof(show), t->name, 0), t->ndim,
                          t->shape[0], t->ndim > 1 ? t->shape[1] : 1, r, p->ndim > 1 ? c : 1,
                          st_is_conv1d(p) ? " (Conv1D layout: in, out)" : "");
        }
    }
    for (size_t i = 0; rc == 0 && i < st->n; i++) {
        const char *n = st->t[i].name;
        const char *bare = strncmp(n, "transformer.", 12) == 0 ? n + 12 : n;
        if (!used[i] && !st_is_buffer(bare) && strcmp(n, "lm_head.weight") != 0) {
            rc = fsdp_err(FSDP_ERR_FORMAT, "%s: unexpected tensor '%s' (not a GPT-2 parameter)",
                          st->path, fsdp_str_printable(show, sizeof(show), n, 0));
        }
    }
    free(used);
    return rc;
}

int fsdp_ckpt_cmd_import_st(int argc, char **argv)
{
    static const struct option opts[] = {
        {"heads", required_argument, NULL, 'H'},
        {"ln-eps", required_argument, NULL, 'e'},
        {"dtype", required_argument, NULL, 'd'},
        {"output", required_argument, NULL, 'o'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    enum fsdp_dtype dtype = FSDP_F32;
    int c, rc, heads = 0;
    double eps = 0.0;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'H': {
            long long v;
            if (fsdp_parse_long(optarg, &v) < 0 || v < 1 || v > 65536) {
                fsdp_fatal("fsdpc-ckpt import-safetensors: --heads '%s' must be an integer in "
                           "[1, 65536]", optarg);
            }
            heads = (int)v;
            break;
        }
        case 'e': {
            char *end;
            eps = strtod(optarg, &end);
            if (*end || !(eps > 0.0 && eps < 1.0)) {
                fsdp_fatal("fsdpc-ckpt import-safetensors: --ln-eps '%s' must be in (0, 1)", optarg);
            }
            break;
        }
        case 'd': dtype = st_parse_dtype("import-safetensors", optarg); break;
        case 'o': out = optarg; break;
        case 'h': import_usage(stdout); return 0;
        default: fsdp_ckpt_tool_bad_option("import-safetensors", c, argv);
        }
    }
    if (optind != argc - 1 || !out) {
        fsdp_fatal("fsdpc-ckpt import-safetensors: expected one file and -o MODEL.h5 (see --help)");
    }
    struct fsdp_safetensors *st;
    struct fsdp_gpt2_config cfg;
    struct fsdp_model_spec *s = NULL;
    const char *what = "fsdpc-ckpt import-safetensors";
    if ((rc = fsdp_safetensors_open(argv[optind], &st)) < 0 ||
        (rc = st_check_aliases(st)) < 0 || (rc = st_infer(st, heads, eps, &cfg)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    size_t big = (size_t)cfg.vocab_size * (size_t)cfg.n_embd;
    for (size_t i = 0; i < st->n; i++) {
        size_t n = (st->t[i].end - st->t[i].begin) / fsdp_dtype_size(st->t[i].dtype);
        big = n > big ? n : big;
    }
    /* each buffer holds the largest tensor in the widest dtype */
    void *raw = fsdp_alloc(big * sizeof(double));
    float *a = fsdp_alloc(big * sizeof(double)), *b = fsdp_alloc(big * sizeof(double));
    if (!raw || !a || !b) {
        fsdp_fatal("%s: out of memory for one tensor", what);
    }
    if ((rc = st_tied(st, a, b, &cfg.tied)) < 0 || (rc = fsdp_gpt2_spec_create(&cfg, &s)) < 0 ||
        (rc = st_check_tensors(st, s)) < 0) {
        fsdp_die(rc, what, NULL);
    }
    char created_by[256];
    snprintf(created_by, sizeof(created_by), "fsdpc-ckpt import-safetensors %s", argv[optind]);
    struct fsdp_model_write_opts wo = {.created_by = created_by, .dtype = dtype};
    struct fsdp_model_writer *w = NULL;
    rc = fsdp_model_writer_create(out, s, &wo, &w);
    for (size_t i = 0; rc == 0 && i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        size_t k = (size_t)st_lookup(st, p->name), n = p->shape[0] * p->shape[1];
        if (strcmp(p->name, "lm_head.weight") == 0) {
            k = (size_t)fsdp_safetensors_find(st, "lm_head.weight");
        }
        rc = fsdp_safetensors_read(st, k, raw);
        if (rc == 0) {
            rc = st_to_f32(st, &st->t[k], raw, a, n);
        }
        if (rc == 0 && st_is_conv1d(p)) {
            st_transpose(b, a, p->shape[0], p->shape[1]);
        }
        if (rc == 0) {
            rc = fsdp_model_writer_put(w, i, st_is_conv1d(p) ? b : a);
        }
    }
    if (rc == 0) {
        rc = fsdp_model_writer_commit(w);
    }
    fsdp_model_writer_destroy(w);
    if (rc < 0) {
        fsdp_die(rc, what, NULL);
    }
    printf("%s: gpt2 n_layer=%d n_head=%d n_embd=%d vocab_size=%d context=%d %s written to %s\n",
           argv[optind], cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.context,
           cfg.tied ? "tied" : "untied", out);
    fsdp_free(raw);
    fsdp_free(a);
    fsdp_free(b);
    fsdp_model_spec_destroy(s);
    fsdp_safetensors_close(st);
    return 0;
}
