/*
 * ckpt_program.c - the fsdpc-ckpt program (its main is ckpt_main.c, so that
 * a test program can run it with an architecture of its own registered):
 * creates and inspects model files; the checkpoint subcommands live in
 * ckpt_tool.c.
 *
 *   fsdpc-ckpt init --preset NAME [overrides] [--seed S] -o FILE
 *   fsdpc-ckpt inspect FILE|CHECKPOINT
 *   fsdpc-ckpt list DIR                                     (ckpt_list.c)
 *   fsdpc-ckpt verify | consolidate | reshard | convert ...
 *   fsdpc-ckpt export-safetensors | import-safetensors ...  (st_tool.c)
 *   fsdpc-ckpt import-hf | export-hf ...                    (hf_tool.c)
 *
 * Subcommands sit in one table (name, summary, function); each parses its own
 * flags and has its own --help. init draws the model's deterministic initial
 * values (fsdp_model_init_range) and streams them unit by unit through one
 * reused buffer, so even gpt2-xl (6 GB in f32) never sits in memory whole,
 * and the file appears under its name only once complete (tmp + rename).
 * Errors end the program with one line and a non-zero exit status.
 */
#include "config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/util.h"
#include "io/ckpt/ckpt.h"
#include "programs/ckpt_tool.h"
#include "io/h5/model_file.h"
#include "model/model.h"
#include "model/llama_spec.h"

#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ----------------------------------------------------------------------------
// init

/* init's flags; every override is 0 (or "") unless given. */
struct init_args {
    char preset[64];
    char out[FSDP_CKPT_TOOL_PATH];
    long seed;
    enum fsdp_dtype dtype;
    long layers, heads, width, vocab, context, kv_heads, ffn, rope_original;
    int untied, attn_bias;
    double rope_theta, rope_factor;
    char rope_scaling[16];
};

#define F(field) offsetof(struct init_args, field)
#define S(field) sizeof(((struct init_args *)0)->field)
#define INIT_DIM(flag, field, what)                                                                \
    {                                                                                              \
        flag, FSDP_OPT_INT, F(field), 0, 1, 1 << 20, NULL, "N", 0, what, 0                         \
    }
static const struct fsdp_opt init_opts[] = {
    {"preset", FSDP_OPT_STR, F(preset), S(preset), 0, 0, NULL, "NAME", 0, "a preset above", 0},
    INIT_DIM("layers", layers, "override n_layer"),
    INIT_DIM("heads", heads, "override n_head"),
    INIT_DIM("width", width, "override n_embd (divisible by n_head)"),
    INIT_DIM("vocab", vocab, "override vocab_size"),
    INIT_DIM("context", context, "override the maximum sequence length"),
    {"untied", FSDP_OPT_FLAG, F(untied), 0, 0, 0, NULL, "", 0,
     "separate lm_head.weight instead of the embedding's", 0},
    INIT_DIM("kv-heads", kv_heads,
             "llama only: override n_kv_head (dividing n_head; 1: "
             "multi-query)"),
    INIT_DIM("ffn", ffn, "llama only: override ffn_hidden (the MLP's intermediate size)"),
    {"attn-bias", FSDP_OPT_FLAG, F(attn_bias), 0, 0, 0, NULL, "", 0,
     "llama only: biases on the q/k/v projections (Qwen2)", 0},
    {"rope-theta", FSDP_OPT_FLOAT, F(rope_theta), 0, 0, 1e300, NULL, "X", FSDP_OPT_MIN_OPEN,
     "llama only: override rope_theta", 0},
    {"rope-scaling", FSDP_OPT_STR, F(rope_scaling), S(rope_scaling), 0, 0, NULL, "TYPE", 0,
     "llama only: none, linear or llama3", 0},
    {"rope-factor", FSDP_OPT_FLOAT, F(rope_factor), 0, 0, 1e300, NULL, "X", FSDP_OPT_MIN_OPEN,
     "llama only: the scaling factor (linear, llama3)", 0},
    INIT_DIM("rope-original", rope_original, "llama only: llama3's original context"),
    {"seed", FSDP_OPT_INT, F(seed), 0, 0, 9.0e18, NULL, "S", 0, "RNG seed; same seed, same values",
     0},
    {"dtype", FSDP_OPT_DTYPE, F(dtype), 0, 0, 0, "f32|bf16|f16", "T", 0, "stored type", 0},
    {"output", FSDP_OPT_STR, F(out), S(out), 0, 0, NULL, "FILE", 0, "the model file to create",
     'o'},
};
#undef INIT_DIM
#undef F
#undef S

static const struct fsdp_cli_cmd init_cmd = {
    "[--preset NAME] [overrides] [--seed S] [--dtype T] -o FILE",
    "Creates a freshly initialised model file. The preset picks the architecture:\n"
    "  gpt2:  tiny (default), bench-small, gpt2, gpt2-medium, gpt2-large, gpt2-xl;\n"
    "         weights N(0, 0.02) (residual projections N(0, 0.02/sqrt(2*n_layer))),\n"
    "         layer-norm weights 1, biases 0\n"
    "  llama: llama-tiny, llama-small, llama-1b (Llama 3.2 1B), llama-8b (Llama 3.1\n"
    "         8B); weights N(0, 0.02), RMSNorm weights 1, biases 0 (Hugging Face's)\n"
    "The file is written under a fresh temporary name beside it (FILE.tmp.XXXXXX)\n"
    "and renamed to FILE when complete.",
    init_opts, sizeof(init_opts) / sizeof(init_opts[0])};

/* Flags that set one config attribute, by the attribute's name in the
 * architecture's table (an architecture without it refuses the flag). */
static const struct init_override {
    const char *flag;
    const char *attr;
} init_overrides[] = {
    {"layers", "n_layer"},
    {"heads", "n_head"},
    {"width", "n_embd"},
    {"vocab", "vocab_size"},
    {"context", "context"},
    {"untied", "tied_embeddings"},
    {"kv-heads", "n_kv_head"},
    {"ffn", "ffn_hidden"},
    {"attn-bias", "attn_bias"},
    {"rope-theta", "rope_theta"},
    {"rope-scaling", "rope_scaling"},
    {"rope-factor", "rope_factor"},
    {"rope-original", "rope_original_context"},
};
#define INIT_N_OVERRIDES (sizeof(init_overrides) / sizeof(init_overrides[0]))

/* The attribute value override flag gives, from its field in set's config
 * (range-checked by the parser). */
static double init_override_value(const struct fsdp_optset *set, const char *flag)
{
    const struct fsdp_opt *o = &set->opts[fsdp_opt_find(set, flag)];
    const char *field = (const char *)set->base + o->offset;
    long l;
    double d;
    int b;
    switch (o->type) {
    case FSDP_OPT_INT:
        memcpy(&l, field, sizeof(l));
        return (double)l;
    case FSDP_OPT_FLOAT:
        memcpy(&d, field, sizeof(d));
        return d;
    case FSDP_OPT_FLAG: /* --untied clears tied_embeddings, --attn-bias sets attn_bias */
        memcpy(&b, field, sizeof(b));
        return strcmp(flag, "untied") == 0 ? !b : b;
    default: {
        int t;
        if (fsdp_llama_rope_parse(field, &t) < 0) {
            fsdp_die(FSDP_ERR_INVALID, "fsdpc-ckpt init: --rope-scaling", NULL);
        }
        return t;
    }
    }
}

/* The preset's architecture and config with the given overrides applied. */
static void init_config(const struct fsdp_optset *set, const char *preset,
                        const struct fsdp_arch **arch, void **cfg)
{
    int rc;
    if ((rc = fsdp_arch_preset(preset, arch, cfg)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt init: --preset", NULL);
    }
    for (size_t i = 0; i < INIT_N_OVERRIDES; i++) {
        const struct init_override *ov = &init_overrides[i];
        if (!fsdp_opt_given(set, ov->flag)) {
            continue;
        }
        const struct fsdp_attr_desc *a = NULL;
        for (size_t k = 0; k < (*arch)->n_attrs && !a; k++) {
            a = strcmp((*arch)->attrs[k].name, ov->attr) == 0 ? &(*arch)->attrs[k] : NULL;
        }
        if (!a) {
            fsdp_fatal("fsdpc-ckpt init: --%s does not apply to %s models (preset %s)", ov->flag,
                       (*arch)->name, preset);
        }
        if (fsdp_attr_set(a, *cfg, init_override_value(set, ov->flag)) < 0) {
            fsdp_die(FSDP_ERR_INVALID, "fsdpc-ckpt init: model config", NULL);
        }
    }
}

/* Streams spec's initial values unit by unit into the model file out. */
static void init_write(const struct fsdp_model_spec *spec, const struct init_args *a)
{
    size_t widest = 0;
    int rc;
    for (int u = 0; u < spec->n_units; u++) {
        widest = spec->unit_numel[u] > widest ? spec->unit_numel[u] : widest;
    }
    float *buf = fsdp_alloc(widest * sizeof(float));
    if (!buf) {
        fsdp_fatal("fsdpc-ckpt init: cannot allocate the %zu-float unit buffer", widest);
    }
    char created_by[256];
    snprintf(created_by, sizeof(created_by), "fsdpc-ckpt init %s (preset %s, seed %ld)",
             PACKAGE_VERSION, a->preset, a->seed);
    struct fsdp_model_write_opts wopts = {.created_by = created_by, .dtype = a->dtype};
    struct fsdp_model_writer *w;
    if ((rc = fsdp_model_writer_create(a->out, spec, &wopts, &w)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt init", NULL);
    }
    for (int u = 0; u < spec->n_units; u++) {
        FSDP_CHECK_GOTO(
            fsdp_model_init_range(spec, (uint64_t)a->seed, u, 0, spec->unit_numel[u], buf), rc,
            fail);
        FSDP_CHECK_GOTO(fsdp_model_writer_put_unit(w, u, buf), rc, fail);
    }
    FSDP_CHECK_GOTO(fsdp_model_writer_commit(w), rc, fail);
    fsdp_model_writer_destroy(w);
    fsdp_free(buf);
    return;
fail:
    fsdp_model_writer_destroy(w);
    fsdp_die(rc, "fsdpc-ckpt init", NULL);
}

static int cmd_init(int argc, char **argv)
{
    struct init_args a = {.preset = "tiny", .dtype = FSDP_F32};
    struct fsdp_optset set;
    int rc;
    if (fsdp_cli_command("fsdpc-ckpt", &init_cmd, &a, argc, argv, &set) == 1) {
        return 0;
    }
    if (set.n_operands > 0) {
        fsdp_fatal("fsdpc-ckpt init: unexpected argument '%s' (see --help)", set.operand[0]);
    }
    if (!a.out[0]) {
        fsdp_fatal("fsdpc-ckpt init: missing -o FILE (see --help)");
    }
    void *cfg = NULL;
    const struct fsdp_arch *arch = NULL;
    init_config(&set, a.preset, &arch, &cfg);
    struct fsdp_model_spec *spec;
    if ((rc = arch->spec_create(cfg, &spec)) < 0) {
        fsdp_die(rc, "fsdpc-ckpt init: model config", NULL);
    }
    free(cfg);
    double t0 = fsdp_now();
    init_write(spec, &a);
    char hb[32], desc[256];
    fsdp_ckpt_tool_bytes(hb, sizeof(hb),
                         (double)spec->total_numel * (double)fsdp_dtype_size(a.dtype), 2);
    fsdp_arch_describe(spec->arch, spec->cfg, desc, sizeof(desc));
    printf("%s: %s %s, %zu parameters, %s %s, seed %ld (%.1f s)\n", a.out, spec->arch->name, desc,
           spec->total_numel, hb, fsdp_dtype_name(a.dtype), a.seed, fsdp_now() - t0);
    fsdp_model_spec_destroy(spec);
    return 0;
}

// ----------------------------------------------------------------------------
// inspect

static const struct fsdp_cli_cmd inspect_cmd = {
    "FILE|CHECKPOINT",
    "Validates a model file (attributes, every dataset's name, shape and type) and\n"
    "prints its architecture and a table of its tensors. Exit status 0 only when\n"
    "the file is valid. For a checkpoint (a step directory, its index.h5, or a\n"
    "checkpoint root whose 'latest' is followed) it also prints the step, tokens\n"
    "seen, mesh, data-loader and optimizer state and the stored configuration.",
    NULL, 0};

static int cmd_inspect(int argc, char **argv)
{
    struct fsdp_ckpt_args a = {0};
    const char *in;
    int rc;
    if (fsdp_ckpt_tool_parse(&inspect_cmd, &a, argc, argv, &in) == 1) {
        return 0;
    }
    if (!in) {
        fsdp_fatal("fsdpc-ckpt inspect: expected one model file, got %d (see --help)",
                   a.n_operands);
    }
    if (fsdp_ckpt_is_checkpoint(in)) {
        return fsdp_ckpt_tool_inspect(in);
    }
    struct fsdp_model_file *mf;
    if ((rc = fsdp_model_file_open(in, fsdp_arch_registered(), &mf)) < 0) {
        fsdp_ckpt_tool_recovery_hint(in); /* a step an interrupted save moved aside */
        fsdp_die(rc, "fsdpc-ckpt inspect", NULL);
    }
    const struct fsdp_model_spec *s = fsdp_model_file_spec(mf);
    const char *cb = fsdp_model_file_created_by(mf);
    char attrs[512];
    fsdp_attrs_format(s->arch, s->cfg, attrs, sizeof(attrs));
    printf("file          %s\n", in);
    printf("format        %s version %d\n", FSDP_MODEL_FORMAT, FSDP_MODEL_FORMAT_VERSION);
    if (cb[0]) {
        printf("created by    %s\n", cb);
    }
    printf("architecture  %s: %s\n", s->arch->name, attrs);
    fsdp_ckpt_tool_print_tokens(s);
    size_t summed = fsdp_model_file_checksummed(mf);
    if (summed == s->n_params) {
        printf("checksums     xxh3_64 per block, recorded for all %zu tensors (checked as they "
               "are read)\n", summed);
    } else {
        printf("checksums     recorded for %zu of %zu tensors (%s)\n", summed, s->n_params,
               summed ? "the others are read unchecked"
                      : "a file from an fsdpc without them, or another tool: read unchecked");
    }
    printf("units         %d\n\n", s->n_units);
    int wn = 28; /* the name column fits the longest name */
    for (size_t i = 0; i < s->n_params; i++) {
        int n = (int)strlen(s->params[i].name);
        wn = n > wn ? n : wn;
    }
    printf("%-*s %5s  %-14s %-5s %14s\n", wn, "tensor", "unit", "shape", "dtype", "bytes");
    size_t bytes = 0;
    for (size_t i = 0; i < s->n_params; i++) {
        const struct fsdp_param_spec *p = &s->params[i];
        char shape[48];
        if (p->ndim == 1) {
            snprintf(shape, sizeof(shape), "(%zu,)", p->shape[0]);
        } else {
            snprintf(shape, sizeof(shape), "(%zu, %zu)", p->shape[0], p->shape[1]);
        }
        size_t b = fsdp_model_file_tensor_bytes(mf, i);
        bytes += b;
        printf("%-*s %5d  %-14s %-5s %14zu\n", wn, p->name, p->unit, shape,
               fsdp_model_file_tensor_dtype(mf, i), b);
    }
    char hb[32];
    fsdp_ckpt_tool_bytes(hb, sizeof(hb), (double)bytes, 2);
    printf("\ntotal         %zu tensors, %zu parameters, %zu bytes (%s)\n", s->n_params,
           s->total_numel, bytes, hb);
    fsdp_model_file_close(mf);
    return 0;
}

// ----------------------------------------------------------------------------
// main

static const struct fsdp_cli_sub ckpt_cmds[] = {
    {"init", "create a freshly initialised model file", cmd_init},
    {"list", "list the checkpoints of a checkpoint root (a run's --ckpt-dir)", fsdp_ckpt_cmd_list},
    {"recover", "put a checkpoint root back in order after a crash, as the next run would",
     fsdp_ckpt_cmd_recover},
    {"inspect", "validate a model file or checkpoint and list its tensors", cmd_inspect},
    {"verify", "check that a checkpoint is complete and readable", fsdp_ckpt_cmd_verify},
    {"consolidate", "write a checkpoint as one model file", fsdp_ckpt_cmd_consolidate},
    {"reshard", "rewrite a checkpoint for another world size or mesh", fsdp_ckpt_cmd_reshard},
    {"convert", "write a model file or checkpoint as a model file of another dtype",
     fsdp_ckpt_cmd_convert},
    {"export-safetensors", "write a model file or checkpoint as Hugging Face GPT-2 safetensors",
     fsdp_ckpt_cmd_export_st},
    {"import-safetensors", "read Hugging Face GPT-2 safetensors into a model file",
     fsdp_ckpt_cmd_import_st},
    {"import-hf", "read a Hugging Face model directory into a model file", fsdp_ckpt_cmd_import_hf},
    {"export-hf", "write a model file or checkpoint as a Hugging Face model directory",
     fsdp_ckpt_cmd_export_hf},
};

int fsdp_ckpt_program(int argc, char **argv)
{
    static const struct fsdp_cli_program ckpt = {"fsdpc-ckpt", ckpt_cmds,
                                                 sizeof(ckpt_cmds) / sizeof(ckpt_cmds[0]), 19};
    fsdp_log_set_rank(0);
    if (fsdp_model_registry_init() < 0) {
        fsdp_die(FSDP_ERR_INTERNAL, "fsdpc-ckpt: model registry", NULL);
    }
    return fsdp_cli_main(&ckpt, argc, argv);
}
